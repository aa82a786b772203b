//! Blocks that are not class blocks: blocks of [`SPAN_MIN`] bytes or more up to 512 KiB,
//! spans of the node's own superblocks, and large blocks (above 512 KiB, or aligned beyond
//! what a span offers), one node-bound mapping each.
//!
//! Deviation from seed 003, where such blocks are blocks of per-thread class sub-allocators
//! and a remote free goes to the owner's recollection bin. Here the node's superblock
//! allocator hands them out as spans, behind the node lock, and any thread frees them
//! straight back into the node's spans. Why: with per-thread pools, memory freed by another
//! thread comes back to its owner only when the owner next drains, and each thread keeps the
//! pages of its own peak; in `buffer-passing` (blocks allocated on one thread and freed on the
//! next) that made RSS the sum of the threads' peaks (2.4x the bytes requested, against
//! 1.2-1.4x with one pool per node, which follows the total). Placement is unchanged: the
//! spans are the node's. The lock is taken once per block of 8 KiB or more, whose first write
//! alone costs more than the lock.

use core::ptr::null_mut;
use core::sync::atomic::Ordering::Relaxed;

use super::allocate::region_size;
use super::class_run::alloc_class;
use super::config::MPOL;
use super::spans::{map_all, node_free, node_units, node_units_resident, purge_resident};
use super::structs::{Heap, Large, Run, NODES, R_BLOCK, SPAN_MIN};
use super::superblock::sb_data_units;
use super::{bump, PAGE, UNIT};
use crate::classes::class_of;
use crate::os;

/// A block of [`SPAN_MIN`] bytes or more on `node`: a span of its own, in whole units.
///
/// # Safety
/// The allocator is initialized and `1 <= size <= MEDIUM_MAX`.
pub(super) unsafe fn alloc_block(node: usize, pool: usize, size: usize) -> *mut u8 {
    // SAFETY: initialized; `size` in whole units is at least 1 and fits a superblock.
    let r = unsafe { node_units(node, pool, size.div_ceil(UNIT), R_BLOCK) };
    if r.is_null() {
        return null_mut();
    }
    // SAFETY: `r` was just taken on `node` for this block (state R_BLOCK set under the node
    // lock) and is not published yet.
    unsafe { hand_out(node, r) }
}

/// Makes the block run `r`, just taken on `node`, one block of all its units, and returns the
/// block.
///
/// # Safety
/// `r` was just taken for this block (state R_BLOCK set under the node lock) and is not
/// published yet: only this thread writes it; its units fit a superblock.
unsafe fn hand_out(node: usize, r: *mut Run) -> *mut u8 {
    // SAFETY: contract above.
    unsafe {
        let data = (*(*r).seg).base + (*r).first as usize * UNIT;
        (*r).data = data;
        (*r).bsize = (*r).nunits * UNIT as u32;
        map_all(r);
        NODES[node].block_live.fetch_add((*r).bsize as i64, Relaxed);
        data as *mut u8
    }
}

/// A block above `MEDIUM_MAX` from memory heap `h`'s node has already touched (a resident
/// free span or a cached superblock, see [`node_units_resident`]), or null when none is long
/// enough: the caller then maps a large block. Freed as any block run ([`free_block`]).
///
/// Why: with a fresh mapping for every large block, memory a program had freed in the
/// superblocks sat resident beside the new block, where glibc serves it from its freed heap
/// (sqlite3's buffers grown by `realloc` to 4 MiB, docs/alloc.md "Peak RSS of sqlite3"). A
/// span that fits is reused without a system call; otherwise [`alloc_large`] gives the
/// resident free spans' pages back before it maps.
///
/// # Safety
/// The allocator is initialized, the caller holds `h`'s claim, and `size >= 1`.
pub(super) unsafe fn alloc_large_span(h: *mut Heap, size: usize) -> *mut u8 {
    let units = size.div_ceil(UNIT);
    if units > sb_data_units() {
        return null_mut();
    }
    // SAFETY: `h` is a heap (never unmapped); initialized, `units >= 1`.
    let (node, r) = unsafe {
        let node = (*h).mem_node;
        (node, node_units_resident(node, (*h).id, units, R_BLOCK))
    };
    if r.is_null() {
        return null_mut();
    }
    // SAFETY: `r` was just taken on `node` for this block; `units` fits a superblock. The
    // caller holds `h`'s claim, so it is the one writer of the heap's counters.
    unsafe {
        let p = hand_out(node, r);
        bump(&(*h).st.allocs, 1);
        bump(&(*h).st.requested, size as u64);
        p
    }
}

/// Frees a block of [`SPAN_MIN`] bytes or more, from any thread.
///
/// # Safety
/// `r` is the run (state R_BLOCK) of a live block from [`alloc_block`], freed once.
#[cold]
pub(super) unsafe fn free_block(r: *mut Run) {
    // SAFETY: a live block's run: its superblock is live and `bsize` is fixed while in use.
    unsafe {
        let ns = &NODES[(*(*r).seg).node as usize];
        ns.block_frees.fetch_add(1, Relaxed);
        ns.block_live.fetch_sub((*r).bsize as i64, Relaxed);
    }
    // SAFETY: the block is freed once and its run holds nothing else: nothing uses it now.
    unsafe { node_free(r) };
}

/// A block of `size` bytes (`SMALL_MAX < size <= MEDIUM_MAX`, or any size up to
/// `MEDIUM_MAX` when `small` own classes are in use) from heap `h`.
///
/// # Safety
/// The allocator is initialized, the caller holds `h`'s claim, and `1 <= size <= MEDIUM_MAX`.
#[inline]
pub(super) unsafe fn alloc_sized(h: *mut Heap, size: usize, requested: usize) -> *mut u8 {
    if size >= SPAN_MIN {
        // SAFETY: `h` is a heap (never unmapped); initialized, `size <= MEDIUM_MAX`.
        let p = unsafe { alloc_block((*h).mem_node, (*h).id, size) };
        if !p.is_null() {
            // SAFETY: the caller holds `h`'s claim, so it is the one writer of these counters.
            unsafe {
                bump(&(*h).st.allocs, 1);
                bump(&(*h).st.requested, requested as u64);
            }
        }
        p
    } else {
        // SAFETY: `h`'s claim is held; `1 <= size < SPAN_MIN` has a class below NCLASSES.
        unsafe { alloc_class(h, class_of(size), requested) }
    }
}

/// Bytes of the mapping of a large block of `size` bytes at offset `off` in it: whole pages.
/// None on overflow.
fn large_map_len(off: usize, size: usize) -> Option<usize> {
    Some(off.checked_add(size)?.checked_add(PAGE - 1)? / PAGE * PAGE)
}

/// A large block: a node-bound mapping of its own, its header in the first page.
///
/// # Safety
/// The allocator is initialized and `align` is a power of two below [`region_size`]: the
/// block then lies in the region slot of its header, where `free` finds it.
pub(super) unsafe fn alloc_large(size: usize, align: usize, node: usize) -> *mut u8 {
    // The block starts after the first page, which holds the header at its colored slot.
    const _: () = assert!(os::HEADER_COLORS * os::HEADER_STEP <= PAGE);
    let off = align.max(PAGE);
    let Some(len) = large_map_len(off, size) else {
        return null_mut();
    };
    debug_assert!(
        align < region_size(),
        "alignment {align} reaches a region slot"
    );
    // The new mapping replaces resident free memory where the node has some.
    purge_resident(node, len);
    let p = os::map_aligned(len, region_size());
    if p.is_null() {
        return p;
    }
    let ns = &NODES[node];
    // SAFETY: `p` is our fresh mapping of `len` bytes.
    if !unsafe { os::bind(p, len, node, MPOL.load(Relaxed)) } {
        ns.mbind_failures.fetch_add(1, Relaxed);
    }
    if !os::mark(p as usize, os::REGION_LARGE) {
        // SAFETY: ours, unused.
        unsafe { os::unmap(p, len) };
        return null_mut();
    }
    let l = os::header_of(p as usize) as *mut Large;
    // SAFETY: fresh mapping; the header slot lies in its first page, before the block.
    unsafe {
        (*l).node = node as u32;
        (*l).map_len = len;
        (*l).requested = size;
    }
    ns.os_bytes.fetch_add(len as u64, Relaxed);
    ns.large_bytes.fetch_add(len as u64, Relaxed);
    ns.large_count.fetch_add(1, Relaxed);
    ns.large_requested.fetch_add(size as u64, Relaxed);
    // SAFETY: `off + size <= len`: the block lies in the mapping.
    unsafe { p.add(off) }
}

/// Resizes the large block `p` (in the mapping at `base`) to `new` bytes without copying it:
/// the mapping shrinks or grows where it lies, or, where the address space after it is taken,
/// moves onto a fresh mapping aligned like every region (`mremap`: the pages keep their contents,
/// node and memory policy). The block keeps its offset in the mapping, so its alignment too.
/// Null when neither works (the caller then copies).
///
/// Why: programs grow buffers by `realloc` doubling (sqlite3's sorter and statement buffers, 0.5
/// MiB to 64 MiB in `loci bench alloc --programs`); a copy into a new mapping faults every page
/// in again and copies the old ones (docs/alloc.md, "Large reallocations").
///
/// # Safety
/// `p` is a live large block, the start of a block handed out by [`alloc_large`] (in the
/// mapping at `base`), given up by the caller if a new block is returned; `new > MEDIUM_MAX`.
pub(super) unsafe fn realloc_large(base: usize, p: *mut u8, new: usize) -> *mut u8 {
    let off = p as usize - base;
    let Some(want) = large_map_len(off, new) else {
        return null_mut();
    };
    let l = os::header_of(base) as *mut Large;
    // SAFETY: the header of a live large mapping (contract above).
    let (len, requested, node) = unsafe { ((*l).map_len, (*l).requested, (*l).node) };
    let mut to = base;
    // SAFETY: the mapping is the caller's block's own, used by nothing else.
    if want != len && !unsafe { os::remap(base as *mut u8, len, want, None) } {
        // Move onto a fresh mapping at the region alignment (the region map and `free` find a
        // region by its aligned start).
        let r = os::map_aligned(want, region_size());
        if r.is_null() {
            return null_mut();
        }
        // `mark(r, 0)` changes nothing (a fresh region's slot is 0) and is false where the map
        // could not record `r`, which is then not used.
        // SAFETY: `r` is our fresh mapping of `want` bytes and the block's mapping is the
        // caller's; nothing else uses either.
        if !os::mark(r as usize, 0) || !unsafe { os::remap(base as *mut u8, len, want, Some(r)) } {
            // SAFETY: ours, unused (the move did not happen).
            unsafe { os::unmap(r, want) };
            return null_mut();
        }
        to = r as usize;
        // The header moved with the first page, but its slot depends on the region's address.
        let (from, at) = (to + (l as usize - base), os::header_of(to));
        if from != at {
            // SAFETY: both slots lie in the moved mapping's first page, before the block, and
            // do not overlap (distinct multiples of HEADER_STEP, which a header fits in).
            unsafe { core::ptr::copy_nonoverlapping(from as *const Large, at as *mut Large, 1) };
        }
        os::mark(to, os::REGION_LARGE);
        os::mark(base, 0);
    }
    let l = os::header_of(to) as *mut Large;
    // SAFETY: the header of the (possibly moved) live mapping, the caller's.
    unsafe {
        (*l).map_len = want;
        (*l).requested = new;
    }
    let ns = &NODES[node as usize];
    let grown = want as u64 as i64 - len as u64 as i64;
    ns.os_bytes.fetch_add(grown as u64, Relaxed);
    ns.large_bytes.fetch_add(grown as u64, Relaxed);
    ns.large_requested
        .fetch_add((new as u64).wrapping_sub(requested as u64), Relaxed);
    (to + off) as *mut u8
}

/// Frees a large block: unmaps its mapping.
///
/// # Safety
/// `base` is the region of a live large block (`os::REGION_LARGE` in the region map), freed
/// once.
pub(super) unsafe fn free_large(base: usize) {
    let l = os::header_of(base) as *mut Large;
    // SAFETY: the header of a live large mapping (contract above), read before it goes.
    let len = unsafe {
        let len = (*l).map_len;
        let ns = &NODES[(*l).node as usize];
        ns.os_bytes.fetch_sub(len as u64, Relaxed);
        ns.large_bytes.fetch_sub(len as u64, Relaxed);
        ns.large_count.fetch_sub(1, Relaxed);
        ns.large_requested.fetch_sub((*l).requested as u64, Relaxed);
        len
    };
    os::mark(base, 0);
    // SAFETY: the block is freed once and its region unmarked: nothing uses the mapping.
    unsafe { os::unmap(base as *mut u8, len) };
}
