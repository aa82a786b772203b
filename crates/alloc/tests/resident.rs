//! Blocks above 512 KiB and the memory a program has already touched: such a block is served
//! from a resident free span when one is long enough, and otherwise the mapping made for it is
//! offset by giving the pages of resident free spans back to the OS. In a binary of its own so
//! that the node counters are not moved by other tests.

use std::alloc::{alloc, dealloc, Layout};

use loci_alloc::LociAlloc;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

const BIG: usize = 256 << 10;
const N: usize = 40;
const PAGE: usize = 4096;

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 16).unwrap()
}

/// Pages of `[p, p + len)` that are resident (`mincore`).
fn resident_pages(p: usize, len: usize) -> usize {
    let start = p / PAGE * PAGE;
    let n = (p + len - start).div_ceil(PAGE);
    let mut v = vec![0u8; n];
    // SAFETY: the range lies in the allocator's mappings (live or freed spans of a superblock
    // still mapped); `v` has one byte per page.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, n * PAGE, v.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore failed");
    v.iter().filter(|&&b| b & 1 == 1).count()
}

fn fill(p: usize, i: usize) {
    // SAFETY: `p` is a live block of BIG bytes.
    unsafe { std::ptr::write_bytes(p as *mut u8, i as u8 | 1, BIG) };
}

fn check(p: usize, i: usize) {
    // SAFETY: `p` is a live block of BIG bytes.
    let s = unsafe { std::slice::from_raw_parts(p as *const u8, BIG) };
    if let Some(off) = s.iter().position(|&b| b != i as u8 | 1) {
        panic!("block {i} changed at offset {off}: {:#x}", s[off]);
    }
}

#[test]
fn large_blocks_reuse_or_give_back_resident_memory() {
    // 40 blocks of 256 KiB, written (resident), then an 8 KiB pin so that their superblock
    // never becomes empty (it would go to the cache).
    let blocks: Vec<usize> = (0..N)
        .map(|i| {
            // SAFETY: non-zero size.
            let p = unsafe { alloc(layout(BIG)) } as usize;
            assert_ne!(p, 0);
            fill(p, i);
            p
        })
        .collect();
    // SAFETY: non-zero size.
    let pin = unsafe { alloc(layout(8192)) };
    assert!(!pin.is_null());

    // Every other block freed: 5 MiB resident and free, but no free span of 2 MiB.
    for &p in blocks.iter().step_by(2) {
        // SAFETY: live blocks of this layout, freed once.
        unsafe { dealloc(p as *mut u8, layout(BIG)) };
    }
    let freed_resident = |bs: &[usize]| -> usize {
        bs.iter()
            .step_by(2)
            .map(|&p| resident_pages(p, BIG))
            .sum::<usize>()
    };
    let before = loci_alloc::stats().nodes[0];
    assert!(
        freed_resident(&blocks) * PAGE >= 4 << 20,
        "the freed blocks were not resident to begin with"
    );

    // A 12 MiB block fits no span and no superblock: it gets a mapping, and the pages of
    // the node's resident free spans (these 5 MiB among them) go back to the OS first.
    const LARGE: usize = 12 << 20;
    // SAFETY: non-zero size.
    // (black_box: an allocation that does not escape may be elided by the compiler.)
    let large = std::hint::black_box(unsafe { alloc(layout(LARGE)) });
    assert!(!large.is_null());
    // SAFETY: `large` has LARGE bytes.
    unsafe { std::ptr::write_bytes(large, 0x77, LARGE) };
    let after = loci_alloc::stats().nodes[0];
    assert_eq!(
        after.large_blocks,
        before.large_blocks + 1,
        "the 12 MiB block should have needed a mapping of its own"
    );
    let freed = (N / 2) * BIG;
    assert!(
        after.purged_bytes >= before.purged_bytes + (freed - freed / 10) as u64,
        "purged {} bytes with {freed} bytes of blocks freed",
        after.purged_bytes - before.purged_bytes
    );
    let left = freed_resident(&blocks) * PAGE;
    assert!(
        left <= freed / 10,
        "{left} bytes of the freed blocks are still resident"
    );
    // The live neighbours, which share pages with nothing freed, are intact.
    for (i, &p) in blocks.iter().enumerate().skip(1).step_by(2) {
        check(p, i);
    }
    // SAFETY: live block of this layout, freed once.
    unsafe { dealloc(large, layout(LARGE)) };

    // All 40 freed: one resident span of 10 MiB (merged spans count as touched). A 4 MiB
    // block now comes from it, inside the old blocks' range, with no new mapping.
    for &p in blocks.iter().skip(1).step_by(2) {
        // SAFETY: live blocks of this layout, freed once.
        unsafe { dealloc(p as *mut u8, layout(BIG)) };
    }
    // The blocks lie in one or two superblocks; the longest contiguous stretch is now one
    // resident free span.
    let mut sorted = blocks.clone();
    sorted.sort_unstable();
    let longest = sorted
        .windows(2)
        .fold((BIG, BIG), |(cur, best), w| {
            let cur = if w[1] == w[0] + BIG { cur + BIG } else { BIG };
            (cur, best.max(cur))
        })
        .1;
    const SPAN_LARGE: usize = 4 << 20;
    assert!(
        longest >= SPAN_LARGE,
        "no 4 MiB of contiguous blocks: {longest} bytes"
    );
    let before = loci_alloc::stats().nodes[0];
    // SAFETY: non-zero size.
    let p = std::hint::black_box(unsafe { alloc(layout(SPAN_LARGE)) }) as usize;
    assert_ne!(p, 0);
    let after = loci_alloc::stats().nodes[0];
    assert_eq!(
        (after.large_blocks, after.os_bytes),
        (before.large_blocks, before.os_bytes),
        "a 4 MiB block was given new memory although a resident free span fits it"
    );
    // SAFETY: `p` is a live block of this allocator.
    assert!(unsafe { loci_alloc::engine::usable_size(p as *const u8) }.unwrap() >= SPAN_LARGE);
    // Written whole and grown by realloc (contents kept), then freed like any block.
    // SAFETY: `p` has SPAN_LARGE bytes.
    unsafe { std::ptr::write_bytes(p as *mut u8, 0x33, SPAN_LARGE) };
    // SAFETY: live block of this layout; the new size is non-zero.
    let q = unsafe { std::alloc::realloc(p as *mut u8, layout(SPAN_LARGE), 5 << 20) };
    assert!(!q.is_null());
    // SAFETY: `q` has at least 5 MiB, the first SPAN_LARGE copied.
    let s = unsafe { std::slice::from_raw_parts(q, SPAN_LARGE) };
    assert!(s.iter().all(|&b| b == 0x33), "realloc lost the contents");
    // SAFETY: live blocks, freed once.
    unsafe {
        dealloc(q, layout(5 << 20));
        dealloc(pin, layout(8192));
    }
}
