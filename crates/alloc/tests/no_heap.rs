//! A thread that has no heap yet: its heap slot points at `NO_HEAP`, not at null, so that the
//! fast paths need no null test. Its first frees (of another thread's blocks) must take the
//! remote path, and its first allocations must create its heap. A raw pthread, so that nothing
//! allocates on it before the test does. A binary of its own, so that the counters it checks
//! are not moved by other tests.

use std::alloc::Layout;

use loci_alloc::LociAlloc;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

/// Blocks the main thread hands to the new thread, of sizes across the small classes.
const BLOCKS: usize = 300;

fn size_of_block(i: usize) -> usize {
    16 + (i * 37) % 4000
}

fn fill(p: *mut u8, n: usize, v: u8) {
    // SAFETY: `p` has `n` bytes.
    unsafe { std::ptr::write_bytes(p, v, n) };
}

fn check(p: *const u8, n: usize, v: u8) {
    // SAFETY: `p` has `n` bytes, written with `fill`.
    let s = unsafe { std::slice::from_raw_parts(p, n) };
    assert!(s.iter().all(|&b| b == v), "block at {p:p} corrupted");
}

extern "C" fn first_free_then_alloc(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `arg` is the vector the main thread passed, alive until it joins this thread.
    let blocks = unsafe { &*(arg as *const Vec<(usize, usize)>) };
    // Nothing has allocated on this thread: its first frees find no heap of their own.
    for &(p, n) in blocks {
        check(p as *const u8, n, 0xab);
        // SAFETY: a live block of this allocator, freed once.
        unsafe { loci_alloc::free(p as *mut u8) };
    }
    // Then its first allocations: the fast path finds no heap and the full path makes one.
    let mut mine = Vec::with_capacity(BLOCKS);
    for i in 0..BLOCKS {
        let n = size_of_block(i);
        // SAFETY: non-zero size, power-of-two alignment.
        let p = unsafe { std::alloc::alloc(Layout::from_size_align(n, 16).unwrap()) };
        assert!(!p.is_null());
        fill(p, n, 0xcd);
        mine.push((p as usize, n));
    }
    let mut starts: Vec<usize> = mine.iter().map(|b| b.0).collect();
    starts.sort_unstable();
    starts.dedup();
    assert_eq!(starts.len(), BLOCKS, "a block handed out twice");
    for (p, n) in mine {
        check(p as *const u8, n, 0xcd);
        // SAFETY: a live block of this allocator, freed once (this thread's own).
        unsafe { loci_alloc::free(p as *mut u8) };
    }
    std::ptr::null_mut()
}

#[test]
fn a_thread_without_a_heap_frees_remotely_then_gets_a_heap_of_its_own() {
    let blocks: Vec<(usize, usize)> = (0..BLOCKS)
        .map(|i| {
            let n = size_of_block(i);
            // SAFETY: non-zero size, power-of-two alignment.
            let p = unsafe { std::alloc::alloc(Layout::from_size_align(n, 16).unwrap()) };
            assert!(!p.is_null());
            fill(p, n, 0xab);
            (p as usize, n)
        })
        .collect();
    let before = loci_alloc::stats();
    let mut t: libc::pthread_t = 0;
    // SAFETY: `first_free_then_alloc` has the start routine's signature; `blocks` outlives the
    // thread, which is joined below.
    let rc = unsafe {
        libc::pthread_create(
            &mut t,
            std::ptr::null(),
            first_free_then_alloc,
            &blocks as *const _ as *mut libc::c_void,
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: `t` is the thread just created, joined once.
    assert_eq!(unsafe { libc::pthread_join(t, std::ptr::null_mut()) }, 0);
    let after = loci_alloc::stats();
    assert!(
        after.cross_thread_frees - before.cross_thread_frees >= BLOCKS as u64,
        "the heapless thread's frees of another thread's blocks went the remote way: {} of {BLOCKS}",
        after.cross_thread_frees - before.cross_thread_frees
    );
    // The main thread's heap takes its blocks back and hands out sound blocks again.
    let again: Vec<*mut u8> = (0..BLOCKS)
        .map(|i| {
            let n = size_of_block(i);
            // SAFETY: non-zero size, power-of-two alignment.
            let p = unsafe { std::alloc::alloc(Layout::from_size_align(n, 16).unwrap()) };
            fill(p, n, 0xef);
            p
        })
        .collect();
    for (i, &p) in again.iter().enumerate() {
        check(p, size_of_block(i), 0xef);
        // SAFETY: a live block of this allocator, freed once.
        unsafe { loci_alloc::free(p) };
    }
}
