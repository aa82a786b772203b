//! Superblocks, the node side: taking one from the node's cache or mapping and binding a new
//! one, laying out its header, unit map and run descriptors, and releasing an empty one to the
//! cache or the OS.

use core::ptr::null_mut;
use core::sync::atomic::Ordering::Relaxed;

use super::config::{CACHE_MAX, HUGEPAGES, MPOL, SB_SIZE};
use super::spans::{map_ends, new_desc};
use super::structs::{NodeInner, NodeState, Run, Segment, NODES, NO_DESC, R_FREE};
use super::{DESC_ALIGN, MAP_OFF, MAX_SUPERBLOCK, PAGE, UNIT};
use crate::os;

/// Takes a superblock out of `node`'s cache (null when it is empty). The caller holds the
/// node lock and formats it.
///
/// # Safety
/// `inner` is `ns.inner` and the caller holds `ns.lock`.
pub(super) unsafe fn pop_cached_sb(ns: &NodeState, inner: *mut NodeInner) -> *mut Segment {
    // SAFETY: the node's state, read under its lock (contract above).
    let seg = unsafe { (*inner).cache };
    if !seg.is_null() {
        // Cached superblocks are valid mapped headers owned by the node.
        // SAFETY: as said, and the cache is changed only under the node lock, which is held.
        unsafe {
            (*inner).cache = (*seg).next;
            (*inner).cached -= 1;
        }
        ns.sb_cached.fetch_sub(1, Relaxed);
    }
    seg
}

/// Maps and binds a new superblock of `node`. The caller formats it.
pub(super) fn map_sb(node: usize) -> *mut Segment {
    let ns = &NODES[node];
    let size = SB_SIZE.load(Relaxed);
    let region = 1usize << os::REGION_SHIFT.load(Relaxed);
    let p = os::map_aligned(size, region);
    if p.is_null() {
        return null_mut();
    }
    if HUGEPAGES.load(Relaxed) {
        // SAFETY: `p` is our fresh mapping of `size` bytes.
        unsafe { os::advise_hugepages(p, size) };
    }
    // SAFETY: `p` is our fresh mapping of `size` bytes.
    if !unsafe { os::bind(p, size, node, MPOL.load(Relaxed)) } {
        ns.mbind_failures.fetch_add(1, Relaxed);
    }
    if !os::mark(p as usize, os::REGION_SUPERBLOCK) {
        // SAFETY: ours, unused.
        unsafe { os::unmap(p, size) };
        return null_mut();
    }
    ns.os_bytes.fetch_add(size as u64, Relaxed);
    ns.sb_total.fetch_add(1, Relaxed);
    let seg = os::header_of(p as usize) as *mut Segment;
    // SAFETY: fresh zeroed mapping; the header slot lies in its first page.
    unsafe {
        (*seg).node = node as u32;
        (*seg).base = p as usize;
    }
    seg
}

/// Returns an empty superblock to its node: to the cache (its pages stay resident for the
/// next heap of the node), or to the OS when the cache is full.
///
/// # Safety
/// All runs of `seg` are free and no heap references it any more.
pub(super) unsafe fn release_sb(seg: *mut Segment) {
    // SAFETY: `seg` is a live superblock header that no heap uses (contract above).
    let node = unsafe { (*seg).node } as usize;
    let ns = &NODES[node];
    ns.lock.lock();
    // SAFETY: the node lock is held: nobody else touches the node's state.
    let inner = unsafe { &mut *ns.inner.get() };
    if inner.cached < CACHE_MAX.load(Relaxed) {
        // SAFETY: the superblock is empty and unused (contract above); it enters the cache
        // under the node lock.
        unsafe {
            (*seg).resident = 1;
            (*seg).next = inner.cache;
        }
        inner.cache = seg;
        inner.cached += 1;
        ns.sb_cached.fetch_add(1, Relaxed);
        ns.lock.unlock();
        return;
    }
    ns.lock.unlock();
    let size = SB_SIZE.load(Relaxed);
    // SAFETY: as above; the header is read before the mapping goes.
    let base = unsafe { (*seg).base };
    os::mark(base, 0);
    // SAFETY: the superblock's mapping of `size` bytes is empty, unused (contract above), in no
    // cache and unmarked: nothing uses it afterwards.
    unsafe { os::unmap(base as *mut u8, size) };
    ns.os_bytes.fetch_sub(size as u64, Relaxed);
    ns.sb_total.fetch_sub(1, Relaxed);
}

// Every map entry of the largest superblock fits 16 bits: the end of its descriptor array
// (map, then one 128-byte descriptor per page) is below 2^16 steps of DESC_ALIGN from its base.
const _: () = assert!(core::mem::size_of::<Run>() == DESC_ALIGN);
const _: () = assert!(
    (MAP_OFF + MAX_SUPERBLOCK / UNIT * 2 + MAX_SUPERBLOCK / PAGE * DESC_ALIGN) / DESC_ALIGN
        <= 1 << 16
);

/// The layout of a superblock of `size` bytes: its units, run descriptors, the descriptors'
/// offset from the base and the first data unit.
fn layout(size: usize) -> (usize, usize, usize, usize) {
    let nunits = size / UNIT;
    // One descriptor per page (4 units). Enough: every run in use is at least 8 units (blocks
    // of 8 KiB and more, class runs of about 64 KiB) and free spans never touch each other,
    // so at most about a quarter of the units start a run. Should they run out anyway, a span
    // is handed out whole instead of being split (see `cut`).
    let max_desc = size / PAGE;
    // The map at MAP_OFF, one u16 per unit; the descriptors after it at a multiple of
    // DESC_ALIGN from the base, so that a map entry (the descriptor's offset / DESC_ALIGN)
    // names a descriptor by address arithmetic.
    let desc_off = MAP_OFF + (nunits * 2).div_ceil(DESC_ALIGN) * DESC_ALIGN;
    let desc_end = desc_off + max_desc * core::mem::size_of::<Run>();
    debug_assert!(desc_end / DESC_ALIGN <= 1 << 16);
    let data_unit = desc_end.div_ceil(PAGE) * (PAGE / UNIT);
    (nunits, max_desc, desc_off, data_unit)
}

/// Data units of a superblock (the one free span [`format_sb`] leaves): the longest run one
/// can hold.
pub(super) fn sb_data_units() -> usize {
    let (nunits, _, _, data_unit) = layout(SB_SIZE.load(Relaxed));
    nunits - data_unit
}

/// Lays out a superblock just acquired; returns the free span of all its data pages (not yet
/// listed).
///
/// # Safety
/// `seg` comes from [`pop_cached_sb`] or [`map_sb`] and nobody else references it yet.
pub(super) unsafe fn format_sb(seg: *mut Segment) -> *mut Run {
    let size = SB_SIZE.load(Relaxed);
    let (nunits, max_desc, desc_off, data_unit) = layout(size);
    // SAFETY: `seg` is a mapped superblock header nobody else references (contract above).
    let base = unsafe { (*seg).base };
    // SAFETY: as above; the unit map and the descriptors lie in the superblock's first
    // `data_unit` units.
    unsafe {
        (*seg).nunits = nunits as u32;
        (*seg).data_unit = data_unit as u32;
        (*seg).max_desc = max_desc as u32;
        (*seg).desc_bump = 0;
        (*seg).desc_free = NO_DESC;
        (*seg).descs = (base + desc_off) as *mut Run;
        (*seg).next = null_mut();
    }
    // SAFETY: the descriptor fields are laid out and the superblock is ours alone; with all
    // descriptors free, `new_desc` returns one (not null), whose span covers the data units.
    unsafe {
        let r = new_desc(seg);
        (*r).first = data_unit as u32;
        (*r).nunits = (nunits - data_unit) as u32;
        (*r).fresh = ((*seg).resident == 0) as u32;
        (*r).state.store(R_FREE, Relaxed);
        map_ends(r);
        r
    }
}
