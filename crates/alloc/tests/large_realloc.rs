//! `realloc` of blocks above 512 KiB resizes their mapping (`mremap`) instead of copying:
//! contents survive growth in place and moves, the moved block is found by `free` and
//! `usable_size`, and the node's large-block counters follow. A binary of its own, so that
//! the counters it checks are not moved by other tests.

use std::alloc::{GlobalAlloc, Layout};

use loci_alloc::LociAlloc;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

/// Writes a pattern that depends on the offset and `seed` into every 4 KiB page's first word.
fn fill(p: *mut u8, len: usize, seed: u64) {
    for off in (0..len).step_by(4096) {
        // SAFETY: off + 8 <= len for every block here (whole pages).
        unsafe { (p.add(off) as *mut u64).write_unaligned(seed ^ off as u64) };
    }
}

fn check(p: *mut u8, len: usize, seed: u64, what: &str) {
    for off in (0..len).step_by(4096) {
        // SAFETY: as in `fill`.
        let v = unsafe { (p.add(off) as *const u64).read_unaligned() };
        assert_eq!(v, seed ^ off as u64, "{what}: byte {off} lost");
    }
}

fn large(stats: &loci_alloc::AllocStats) -> (u64, u64, u64) {
    stats.nodes.iter().fold((0, 0, 0), |(b, n, r), s| {
        (b + s.large_bytes, n + s.large_blocks, r + s.large_requested)
    })
}

/// One test: the counters it checks would see the other's blocks if they ran in parallel.
#[test]
fn large_reallocations() {
    large_blocks_grow_and_shrink_without_losing_bytes();
    an_aligned_large_block_keeps_its_alignment_when_it_moves();
}

fn large_blocks_grow_and_shrink_without_losing_bytes() {
    let base = large(&loci_alloc::stats());
    let layout = Layout::from_size_align(1 << 20, 16).unwrap();
    // SAFETY: non-zero size.
    let mut p = unsafe { ALLOC.alloc(layout) };
    assert!(!p.is_null());
    let mut len = 1 << 20;
    fill(p, len, 1);
    // Doubling to 64 MiB, as buffers grow: every step keeps what was written. A block beyond
    // the free address space after its mapping moves; a block of 16 MiB and more fills its
    // region slot, so at least the last steps move.
    let mut moved = 0;
    for step in 0..6 {
        let new = len * 2;
        // SAFETY: `p` is live with `layout`'s alignment and `len` bytes.
        let q = unsafe { ALLOC.realloc(p, Layout::from_size_align(len, 16).unwrap(), new) };
        assert!(!q.is_null(), "realloc to {new} failed");
        moved += usize::from(q != p);
        check(q, len, 1, &format!("growth step {step} to {new} bytes"));
        // SAFETY: `q` is a live block of this allocator.
        assert!(unsafe { loci_alloc::engine::usable_size(q) }.unwrap() >= new);
        fill(q, new, 1);
        let (b, n, r) = large(&loci_alloc::stats());
        assert_eq!(n - base.1, 1, "one large block");
        assert_eq!(r - base.2, new as u64, "requested bytes follow the block");
        assert!(b - base.0 >= new as u64 && b - base.0 < new as u64 + (64 << 10));
        p = q;
        len = new;
    }
    println!("64 MiB reached with {moved} of 6 steps moving the mapping");
    // Shrinking to a quarter: in place.
    let small = len / 4;
    // SAFETY: as above.
    let q = unsafe { ALLOC.realloc(p, Layout::from_size_align(len, 16).unwrap(), small) };
    assert_eq!(q, p, "shrinking a large block keeps it where it is");
    check(q, small, 1, "after shrinking");
    assert!(large(&loci_alloc::stats()).0 - base.0 < small as u64 + (64 << 10));
    // And the block, wherever it ended up, is freed as a large block.
    // SAFETY: live, with this layout's alignment.
    unsafe { ALLOC.dealloc(q, Layout::from_size_align(small, 16).unwrap()) };
    let end = large(&loci_alloc::stats());
    assert_eq!((end.1, end.2), (base.1, base.2), "the block is gone");
    assert_eq!(end.0, base.0);
}

fn an_aligned_large_block_keeps_its_alignment_when_it_moves() {
    let layout = Layout::from_size_align(3 << 20, 1 << 16).unwrap();
    // SAFETY: non-zero size.
    let p = unsafe { ALLOC.alloc(layout) };
    assert_eq!(p as usize % (1 << 16), 0);
    fill(p, 3 << 20, 7);
    // 40 MiB: more than a region slot, so the mapping cannot stay where the first was placed
    // unless the address space after it is free; either way the alignment holds.
    // SAFETY: live with `layout`.
    let q = unsafe { ALLOC.realloc(p, layout, 40 << 20) };
    assert!(!q.is_null());
    assert_eq!(q as usize % (1 << 16), 0, "alignment kept");
    check(q, 3 << 20, 7, "aligned block");
    fill(q, 40 << 20, 8);
    // SAFETY: live, 40 MiB, alignment 64 KiB.
    unsafe { ALLOC.dealloc(q, Layout::from_size_align(40 << 20, 1 << 16).unwrap()) };
}
