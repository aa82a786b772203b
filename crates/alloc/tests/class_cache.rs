//! The class caches (`ClassState::cache`): a thread's freed small blocks are handed out again
//! newest first, at most `cache_max` of them per class, and a heap abandoned with full caches
//! gives their blocks back to their runs without counting their frees twice. A binary of its
//! own, so that the counters it checks are not moved by other tests.

use std::alloc::Layout;

use loci_alloc::LociAlloc;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

/// A size of its own class (768 B: 4 classes per doubling above 128 B) that the test harness
/// and std's thread start do not allocate, so this test alone fills its cache.
const SIZE: usize = 700;
/// `cache_max(768)`: 8 KiB of blocks.
const ROOM: usize = 8192 / 768;

fn alloc() -> usize {
    let l = Layout::from_size_align(SIZE, 16).unwrap();
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::alloc(l) };
    assert!(!p.is_null());
    // SAFETY: `p` has SIZE bytes.
    unsafe { std::ptr::write_bytes(p, 7, SIZE) };
    p as usize
}

fn free(p: usize) {
    // SAFETY: a live block of this allocator, freed once.
    unsafe { loci_alloc::free(p as *mut u8) };
}

#[test]
fn freed_blocks_come_back_newest_first_and_abandoned_caches_count_once() {
    // One thread: the cache takes the first ROOM frees, the rest go to their runs; the next
    // ROOM allocations are the cached blocks, newest first.
    std::thread::spawn(|| {
        let blocks: Vec<usize> = (0..3 * ROOM).map(|_| alloc()).collect();
        for &b in &blocks {
            free(b);
        }
        let again: Vec<usize> = (0..ROOM).map(|_| alloc()).collect();
        let want: Vec<usize> = blocks[..ROOM].iter().rev().copied().collect();
        assert_eq!(again, want, "the cached blocks, newest first");
        for b in again {
            free(b);
        }
    })
    .join()
    .unwrap();

    // Threads that exit with a full cache: their heaps are abandoned, the cached blocks go back
    // to their runs, and their frees, counted when they were cached, are not counted again
    // (that would make the live bytes drift down by ROOM blocks per thread).
    let base = loci_alloc::stats();
    for _ in 0..20 {
        std::thread::spawn(|| {
            let blocks: Vec<usize> = (0..2 * ROOM).map(|_| alloc()).collect();
            for b in blocks {
                free(b);
            }
        })
        .join()
        .unwrap();
    }
    let end = loci_alloc::stats();
    let drift = end.live_block_bytes - base.live_block_bytes;
    assert!(
        drift.abs() < 4 * 768,
        "live bytes moved by {drift} over 20 threads that freed what they allocated"
    );
    // and the blocks were reusable afterwards: a new thread gets class blocks without trouble
    std::thread::spawn(|| {
        let b: Vec<usize> = (0..4 * ROOM).map(|_| alloc()).collect();
        let mut sorted = b.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), b.len(), "a block handed out twice");
        for p in b {
            free(p);
        }
    })
    .join()
    .unwrap();
}
