//! Thread exit and heap recycling, in a binary of its own so that the counters it checks are
//! not moved by other tests.

use std::alloc::Layout;

use loci_alloc::LociAlloc;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

#[test]
fn exited_threads_hand_heaps_and_blocks_back() {
    let base = loci_alloc::stats();
    // Blocks allocated by short-lived threads and freed by the main thread after they exit:
    // the frees of class blocks (even i, below 8 KiB) land in bins of abandoned heaps and must
    // be collected, not leaked; page-span blocks (odd i) go straight back to the node.
    let mut keep = Vec::new();
    for round in 0..50 {
        let blocks: Vec<usize> = std::thread::spawn(move || {
            (0..40)
                .map(|i| {
                    let size = if i % 2 == 0 {
                        64 + (i * 977 + round * 31) % 7000
                    } else {
                        8192 + (i * 977 + round * 31) % 100_000
                    };
                    let l = Layout::from_size_align(size, 16).unwrap();
                    // SAFETY: non-zero size; the block is handed out as an address.
                    let p = unsafe { std::alloc::alloc(l) };
                    unsafe { std::ptr::write_bytes(p, 1, size) };
                    p as usize
                })
                .collect()
        })
        .join()
        .unwrap();
        keep.extend(blocks);
    }
    let mid = loci_alloc::stats();
    // 50 threads ran one after another: their heaps were recycled, not 50 new ones.
    assert!(
        mid.heaps - base.heaps <= 3,
        "heaps grew by {}",
        mid.heaps - base.heaps
    );
    for p in keep {
        // SAFETY: live blocks of this allocator (size is not needed by free).
        unsafe { loci_alloc::free(p as *mut u8) };
    }
    let end = loci_alloc::stats();
    assert!(end.cross_thread_frees - mid.cross_thread_frees >= 1000);
    // Everything the threads allocated came back: live bytes are where they started, give or
    // take what the main thread itself holds (the Vec above is freed by now).
    let grown = end.live_block_bytes - base.live_block_bytes;
    assert!(grown < 64 * 1024, "live bytes grew by {grown}");
    // and the node got empty superblocks back (cached for reuse, not lost)
    assert!(
        end.nodes[0].superblocks_cached > 0
            || end.nodes[0].superblocks_in_use <= base.nodes[0].superblocks_in_use + 40
    );
}
