//! Threads of one node that run out of memory at the same moment map one superblock between
//! them, not one each. In a binary of its own so that the superblock counters are not moved by
//! other tests.

use std::alloc::{alloc, dealloc, Layout};
use std::sync::Barrier;

use loci_alloc::LociAlloc;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

const BLOCK: usize = 256 << 10;
const THREADS: usize = 4;
const PER_THREAD: usize = 400;

#[test]
fn threads_that_run_out_together_map_one_superblock() {
    let layout = Layout::from_size_align(BLOCK, 16).unwrap();
    let sb = loci_alloc::config().superblock;
    let before = loci_alloc::stats();
    let start = Barrier::new(THREADS);
    // Every thread takes its blocks as fast as it can (nothing written), so the threads keep
    // running out of the node's free spans at about the same time.
    let blocks: Vec<Vec<usize>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    (0..PER_THREAD)
                        .map(|_| {
                            // SAFETY: non-zero size.
                            let p = unsafe { alloc(layout) };
                            assert!(!p.is_null());
                            p as usize
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let after = loci_alloc::stats();
    let live = (THREADS * PER_THREAD * BLOCK) as u64;
    // A superblock gives at least 95% of its bytes to blocks (its header, unit map and run
    // descriptors take the rest); one more for the superblock the main thread had started.
    let needed = live.div_ceil(sb as u64 * 95 / 100) + 1;
    let mapped = (after.os_bytes() - before.os_bytes()) / sb as u64;
    assert!(
        mapped <= needed,
        "{THREADS} threads holding {} MiB mapped {mapped} superblocks of {} MiB; {needed} suffice",
        live >> 20,
        sb >> 20
    );
    for p in blocks.into_iter().flatten() {
        // SAFETY: live blocks of this layout.
        unsafe { dealloc(p as *mut u8, layout) };
    }
}
