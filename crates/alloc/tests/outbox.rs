//! Frees of another thread's blocks gather in the freeing thread's outbox and reach the owner a
//! chain at a time: an idle freer withholds at most one outbox, and its exit hands the rest
//! over. In a binary of its own so that the counters it checks are not moved by other tests.

use std::alloc::Layout;
use std::sync::{mpsc, Arc, Barrier};

use loci_alloc::LociAlloc;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

/// Blocks the owner allocates and the freer frees.
const N: u64 = 1000;
/// loci-alloc's outbox size in blocks (`deallocate::OUTBOX_BLOCKS`).
const OUTBOX_BLOCKS: u64 = 64;

fn alloc_one(size: usize) -> usize {
    let l = Layout::from_size_align(size, 16).unwrap();
    // SAFETY: non-zero size; the block is written and handed out as an address.
    unsafe {
        let p = std::alloc::alloc(l);
        std::ptr::write_bytes(p, 7, size);
        p as usize
    }
}

#[test]
fn remote_frees_reach_the_owner_by_the_outbox_and_at_thread_exit() {
    // The freer allocates nothing between its frees and its exit (a barrier, not a channel:
    // an allocation that refills a run would hand its outbox over early).
    let (to_freer, blocks) = mpsc::channel::<Vec<usize>>();
    let freed = Arc::new(Barrier::new(2));
    let exit = Arc::new(Barrier::new(2));
    let (freed2, exit2) = (freed.clone(), exit.clone());
    let freer = std::thread::spawn(move || {
        // A heap of its own first (a thread without one frees straight into the owner's bins).
        let own = alloc_one(256);
        let list = blocks.recv().unwrap();
        for &p in &list {
            // SAFETY: live blocks of this allocator, freed once, by a thread that does not own them.
            unsafe { loci_alloc::free(p as *mut u8) };
        }
        freed2.wait();
        // Idle, alive, holding whatever its outbox has, until told to exit.
        exit2.wait();
        drop(list);
        // SAFETY: this thread's own live block.
        unsafe { loci_alloc::free(own as *mut u8) };
    });
    let owner = std::thread::spawn(move || {
        let list: Vec<usize> = (0..N).map(|_| alloc_one(256)).collect();
        let base = loci_alloc::stats();
        to_freer.send(list).unwrap();
        freed.wait();
        // The owner's next allocations drain its bins: everything but one outbox has arrived.
        let probe = alloc_one(256);
        let mid = loci_alloc::stats();
        exit.wait();
        freer.join().unwrap();
        // The freer's exit handed its outbox over; the next allocation drains it.
        let probe2 = alloc_one(256);
        let end = loci_alloc::stats();
        for p in [probe, probe2] {
            // SAFETY: the owner's own live blocks.
            unsafe { loci_alloc::free(p as *mut u8) };
        }
        (base, mid, end)
    });
    let (base, mid, end) = owner.join().unwrap();
    assert!(end.cross_thread_frees - base.cross_thread_frees >= N);
    let arrived = mid.recollected - base.recollected;
    // An outbox exists: some frees wait in the idle freer's (1000 is not a multiple of 64).
    assert!(
        arrived < N,
        "every free reached the owner while the freer idled"
    );
    assert!(
        arrived >= N - OUTBOX_BLOCKS,
        "while the freer idles, {arrived} of {N} frees reached the owner (at most one outbox of {OUTBOX_BLOCKS} may wait)"
    );
    let all = end.recollected - base.recollected;
    assert!(
        all >= N,
        "after the freer exited, {all} of {N} frees reached the owner"
    );
}
