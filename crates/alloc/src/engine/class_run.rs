//! A heap's sub-allocator for one size class (claim holder only): class runs (carving one
//! from the node, popping a block, finding a block's start), their occupancy groups (filing a
//! run after frees, the spare), allocation from the active run with refill from the most
//! occupied run that has room, and local frees.

use core::ptr::null_mut;
use core::sync::atomic::Ordering::Relaxed;

use super::deallocate::flush_outbox;
use super::heap::drain;
use super::spans::{map_all, node_free, node_units, run_at};
use super::structs::{
    list_push, list_unlink, ClassState, Free, Heap, Run, RUN_BYTES, R_BLOCK, R_CLASS,
};
use super::{bump, G_ACTIVE, G_FULL, G_SPARE, NGROUPS, SLOW, UNIT};
use crate::classes::{build_granule_lut, magic, GRANULES, NCLASSES, SIZES, SMALL_MAX};
use crate::os;

/// Units of a run of class `c`: about [`RUN_BYTES`], whole blocks, whole units.
fn run_units(c: usize) -> usize {
    let bsize = SIZES[c];
    let blocks = RUN_BYTES.div_ceil(bsize).max(1);
    (blocks * bsize).div_ceil(UNIT)
}

/// A new run of class `c` for heap `h` (null when out of memory).
///
/// # Safety
/// The allocator is initialized, the caller holds `h`'s claim, and `c < NCLASSES`.
unsafe fn new_class_run(h: *mut Heap, c: usize) -> *mut Run {
    // SAFETY: `h` is a heap (never unmapped); initialized, and a run of a class is at least
    // one unit and about `RUN_BYTES`, which fits a superblock.
    let r = unsafe { node_units((*h).mem_node, (*h).id, run_units(c), R_CLASS) };
    if r.is_null() {
        return r;
    }
    // SAFETY: `r` was just taken for `h` (state R_CLASS set under the node lock) and is not
    // in any of `h`'s lists yet: only this thread, holding `h`'s claim, writes it.
    unsafe {
        (*r).owner.store(h, Relaxed);
        let bsize = SIZES[c];
        let data = (*(*r).seg).base + (*r).first as usize * UNIT;
        let cap = (*r).nunits as usize * UNIT / bsize;
        (*r).class = c as u32;
        (*r).avail = 0;
        (*r).lo = 0;
        set_state_group(r, G_ACTIVE);
        (*r).bsize = bsize as u32;
        (*r).cs_off = cs_offset(c);
        (*r).magic = magic(bsize);
        (*r).data = data;
        (*r).end = data + cap * bsize;
        (*r).bump = data;
        (*r).free = null_mut();
        (*r).capacity = cap as u32;
        map_all(r);
    }
    r
}

/// Blocks of class run `r` handed out and not yet freed back (see [`Run::avail`]).
///
/// # Safety
/// `r` is a class run of a heap whose claim the caller holds.
#[inline]
pub(super) unsafe fn used(r: *mut Run) -> u32 {
    // SAFETY: the run's counters are written only by its heap's claim holder, the caller.
    unsafe { (*r).avail.wrapping_add((*r).lo) }
}

/// Sets the `lo` of class run `r`, keeping its `used` (its `avail` follows).
///
/// # Safety
/// As for [`used`].
#[inline]
unsafe fn set_lo(r: *mut Run, lo: u32) {
    // SAFETY: as for `used`.
    unsafe {
        let u = used(r);
        (*r).lo = lo;
        (*r).avail = u.wrapping_sub(lo);
    }
}

/// Counts a block freed back into class run `r` (already pushed on its list); true when the
/// run must change occupancy group (its `used` dropped below `lo`: the caller then calls
/// [`regroup`]). One decrement; its borrow is the answer.
///
/// # Safety
/// As for [`used`]; the block was live.
#[inline(always)]
pub(super) unsafe fn count_free(r: *mut Run) -> bool {
    // SAFETY: as for `used`.
    unsafe {
        let (a, borrow) = (*r).avail.overflowing_sub(1);
        (*r).avail = a;
        borrow
    }
}

/// A block from class run `r` (its free list first, then its bump pointer), or null when the
/// run is full.
///
/// # Safety
/// `r` is a class run of a heap whose claim the caller holds.
#[inline]
pub(super) unsafe fn pop(r: *mut Run) -> *mut u8 {
    // SAFETY: only the claim holder, the caller, changes the run's list, bump and count; a
    // block on the list is freed, and its first word is the link.
    unsafe {
        let f = (*r).free;
        if !f.is_null() {
            (*r).free = (*f).next;
            (*r).avail += 1;
            return f as *mut u8;
        }
        let b = (*r).bump;
        if b < (*r).end {
            (*r).bump = b + (*r).bsize as usize;
            (*r).avail += 1;
            return b as *mut u8;
        }
    }
    null_mut()
}

/// The start of the block of run `r` that `p` points into.
///
/// # Safety
/// `r` is the run (class or block) of a live block that `p` points into.
#[inline]
pub(super) unsafe fn block_start(r: *mut Run, p: usize) -> usize {
    // SAFETY: a run with a live block is in use: its state, data, magic and bsize are fixed
    // (only the owner turns R_CLASS into R_CLASS_ALIGNED, atomically).
    unsafe {
        if (*r).state.load(Relaxed) == R_BLOCK {
            return (*r).data;
        }
        let off = p.wrapping_sub((*r).data);
        let idx = ((off as u128 * (*r).magic as u128) >> 64) as usize;
        (*r).data + idx * (*r).bsize as usize
    }
}

// Occupancy groups.

/// Takes a class run out of its occupancy group's list.
///
/// # Safety
/// The caller holds `h`'s claim; `r` is a class run of `h` listed in group `(*r).group`.
unsafe fn unlink(h: *mut Heap, r: *mut Run) {
    // SAFETY: `h`'s lists and the runs in them are changed only by its claim holder, the
    // caller; `r` is listed, so its neighbours are runs of the same list.
    unsafe {
        let g = (*r).group as usize;
        list_unlink(&mut (*h).classes[(*r).class as usize].groups[g], r);
    }
}

/// Frees a full run takes before it is filed in an occupancy group: 1/[`FULL_SLACK`] of its
/// blocks (at least one).
///
/// Why: filed at its first free, a full run went to the top group with one free block, became
/// active at the next refill, served one allocation and was full again. In `general`'s steady
/// state (random frees over nearly full runs) about every third small allocation took a refill
/// and nearly every free a regroup: callgrind counted 60.8 allocator instructions per
/// operation, over a quarter of them on those slow paths (`alloc_full`, `refill`, `file`,
/// `regroup`). Held back until `capacity / 16` blocks are free, a run that becomes active
/// serves that many allocations: 39.9 instructions per operation before the class cache
/// (1/64: 40.7, 1/32: 40.2, 1/8: 39.8), with the RSS of `general` within its run-to-run
/// spread. At most 1/16 of a full run's blocks wait unused.
pub(super) const FULL_SLACK: u32 = 16;

/// Puts a class run in one of the groups that are not lists (active, full, spare), with the
/// `lo` that makes a free's single test `used < lo` right: never true for the active run and
/// the spare (frees into them change nothing); for a full one true once `capacity /
/// FULL_SLACK` blocks (at least one) have been freed into it, when it gets filed. A run is
/// full (`used == capacity`) when it is put in `G_FULL`.
///
/// # Safety
/// `r` is a class run of a heap whose claim the caller holds (or one it is setting up), not
/// listed in an occupancy group.
#[inline]
pub(super) unsafe fn set_state_group(r: *mut Run, g: u32) {
    // SAFETY: the run's group fields are written only by its heap's claim holder, the caller.
    unsafe {
        (*r).group = g;
        let lo = if g == G_FULL {
            let cap = (*r).capacity;
            cap + 1 - (cap / FULL_SLACK).max(1)
        } else {
            0
        };
        set_lo(r, lo);
    }
}

/// Files a non-active run under its occupancy group (or as spare / back to the free spans).
///
/// # Safety
/// The caller holds `h`'s claim; `r` is a class run of `h` that is not active, not the spare
/// and not listed.
pub(super) unsafe fn file(h: *mut Heap, r: *mut Run) {
    // SAFETY: `r` is a run of `h`, whose claim the caller holds: its fields are stable.
    let (c, used, cap) = unsafe {
        (
            (*r).class as usize,
            used(r) as usize,
            (*r).capacity as usize,
        )
    };
    if used == 0 {
        // SAFETY: `h`'s class state is changed only by its claim holder, the caller.
        let cs = unsafe { &mut (*h).classes[c] };
        if cs.spare.is_null() {
            cs.spare = r;
            // SAFETY: `r` is `h`'s, unlisted (contract above).
            unsafe { set_state_group(r, G_SPARE) };
        } else {
            // SAFETY: an empty run of `h`, in none of its lists: it leaves `h` for the node,
            // and nothing uses it any more.
            unsafe {
                (*r).owner.store(null_mut(), Relaxed);
                node_free(r);
            }
        }
        return;
    }
    if used == cap {
        // SAFETY: `r` is `h`'s, unlisted (contract above).
        unsafe { set_state_group(r, G_FULL) };
        return;
    }
    let g = used * NGROUPS / cap;
    // SAFETY: `h`'s lists and `r` are changed only by its claim holder, the caller; `r` is
    // unlisted, and the group's head (if any) is a run of that list.
    unsafe {
        set_lo(r, ((g * cap).div_ceil(NGROUPS)).max(1) as u32);
        (*r).group = g as u32;
        list_push(&mut (*h).classes[c].groups[g], r);
    }
}

/// Frees a block into its run, by the holder of the run's heap.
///
/// # Safety
/// The caller holds `h`'s claim; `r` is a class run of `h` and `blk` the start of a live
/// block of `r`, freed once.
#[inline]
pub(super) unsafe fn local_free(h: *mut Heap, r: *mut Run, blk: usize) {
    // SAFETY: `r` is a class run of `h` (contract above), whose class is below NCLASSES.
    unsafe { bump(&run_class_state(h, r).frees, 1) };
    // SAFETY: forwarded contract.
    unsafe { run_free(h, r, blk) }
}

/// [`local_free`] of a block already counted in its class's `frees` (a cached one, or one
/// `free` counted before its cache turned it away).
///
/// # Safety
/// As for [`local_free`].
#[inline(always)]
pub(super) unsafe fn run_free(h: *mut Heap, r: *mut Run, blk: usize) {
    let f = blk as *mut Free;
    // SAFETY: the block is freed once: its first word becomes the list link; `r` is
    // changed only by `h`'s claim holder, the caller.
    unsafe {
        (*f).next = (*r).free;
        (*r).free = f;
    }
    // SAFETY: as above; a run whose `used` drops below its `lo` is neither active nor the
    // spare (their `lo` is 0).
    unsafe {
        if count_free(r) {
            regroup(h, r);
        }
    }
}

/// After a local free into a run that is not active: files a run that was full, or moves the
/// run to its new occupancy group (what [`local_free`] does after the push).
///
/// # Safety
/// The caller holds `h`'s claim; `r` is a class run of `h` that is neither active nor the
/// spare (a free found `used < lo`).
#[inline(never)]
pub(super) unsafe extern "C" fn regroup(h: *mut Heap, r: *mut Run) {
    // SAFETY: `r` is `h`'s, claim held; a full run is in no list, any other (not active, not
    // the spare) is listed in its group, so `unlink` applies and `file` gets it unlisted.
    unsafe {
        if (*r).group == G_FULL {
            file(h, r);
        } else {
            unlink(h, r);
            file(h, r);
        }
    }
}

// Allocation from the class's runs.

/// Byte offset in a [`Heap`] of class `c`'s [`ClassState`] (a class run's `cs_off`).
fn cs_offset(c: usize) -> u32 {
    (core::mem::offset_of!(Heap, classes) + c * core::mem::size_of::<ClassState>()) as u32
}

/// The state of class run `r`'s class in heap `h`, found through the run's `cs_off` (a load
/// and an add).
///
/// # Safety
/// `h` is a valid heap and `r` a class run set up by `new_class_run`.
#[inline(always)]
pub(super) unsafe fn run_class_state<'a>(h: *mut Heap, r: *mut Run) -> &'a ClassState {
    // SAFETY: `cs_off` is the offset of the `ClassState` of a class below NCLASSES inside a
    // `Heap` (`cs_offset`), and `h` is a valid heap.
    unsafe { &*((h as *const u8).add((*r).cs_off as usize) as *const ClassState) }
}

/// Blocks a class's cache may hold: 8 KiB of them, at least 2 and at most 16 (16-byte blocks:
/// 16; 1 KiB: 8; 4 KiB and more: 2). A heap holds at most about 0.4 MiB in its caches; with 8
/// and 32 blocks of 16 bytes `general` ran as fast (docs/alloc.md, "Class caches").
pub(super) const fn cache_max(size: usize) -> u32 {
    let n = (8 << 10) / size;
    if n < 2 {
        2
    } else if n > 16 {
        16
    } else {
        n as u32
    }
}

/// Frees class `c`'s cached blocks into their runs.
///
/// # Safety
/// The caller holds `h`'s claim and `c < NCLASSES`.
pub(super) unsafe fn flush_cache(h: *mut Heap, c: usize) {
    // SAFETY: `h` is a heap whose claim the caller holds, the one writer of the cache.
    let cs = unsafe { class_state(h, c) };
    let mut s = cs.cache.swap(null_mut(), Relaxed);
    let mut n = 0;
    while !s.is_null() {
        // SAFETY: a cached block is a freed block of a class run of `h`, linked through its
        // first word, which `run_free` overwrites: read the link first.
        let next = unsafe { (*s).next };
        if let Some((base, os::REGION_SUPERBLOCK)) = os::region(s as usize) {
            // SAFETY: a cached block lies at the start of a block of a class run of `h` (its
            // run counts it in `used`) in the superblock at `base`, and its free was counted.
            unsafe { run_free(h, run_at(base, s as usize), s as usize) };
        }
        n += 1;
        s = next;
    }
    cs.room.set(cs.room.get() + n);
}

/// The newest block of class state `cs`'s cache, taken out of it (null when it is empty).
///
/// # Safety
/// The caller holds the claim of the heap of `cs`.
#[inline(always)]
pub(super) unsafe fn cache_pop(cs: &ClassState) -> *mut Free {
    let s = cs.cache.load(Relaxed);
    if !s.is_null() {
        // SAFETY: a cached block is linked through its first word; only the claim holder
        // touches the list.
        cs.cache.store(unsafe { (*s).next }, Relaxed);
        cs.room.set(cs.room.get() + 1);
    }
    s
}

/// Puts the freed block `f` on class state `cs`'s cache if it has room (true), else leaves it
/// to the caller (false).
///
/// # Safety
/// The caller holds the claim of the heap of `cs`; `f` is a block of its class freed once (its
/// first word becomes the list link).
#[inline(always)]
pub(super) unsafe fn cache_push(cs: &ClassState, f: *mut Free) -> bool {
    // One decrement: its borrow (no room was left) sends the block to its run, and the
    // room goes back to 0.
    let (room, full) = cs.room.get().overflowing_sub(1);
    cs.room.set(room);
    if full {
        cs.room.set(0);
        return false;
    }
    // SAFETY: as above: the block's first word is free to hold the link.
    unsafe { (*f).next = cs.cache.load(Relaxed) };
    cs.cache.store(f, Relaxed);
    true
}

/// Byte offsets in a [`Heap`] of the [`ClassState`] of the small class of each size, indexed
/// by `ceil(size / 16)` as [`small_class_of`](crate::classes::small_class_of)'s table: the
/// fast path's class lookup and its state's address in one load (no multiplication by the
/// class state's size).
pub(super) const fn granule_cs_offsets() -> [u16; GRANULES] {
    let lut = build_granule_lut();
    let mut t = [0u16; GRANULES];
    let mut i = 0;
    while i < GRANULES {
        let off = core::mem::offset_of!(Heap, classes)
            + lut[i] as usize * core::mem::size_of::<ClassState>();
        assert!(off < 1 << 16);
        t[i] = off as u16;
        i += 1;
    }
    t
}

/// The state of the small class of `size` bytes in heap `h`, through the heap's copy of
/// [`granule_cs_offsets`] (`Heap::class_off`).
///
/// # Safety
/// `size <= SMALL_MAX`; `h` is a valid heap (made by `create_heap`, which fills `class_off`).
#[inline(always)]
pub(super) unsafe fn small_class_state<'a>(h: *mut Heap, size: usize) -> &'a ClassState {
    debug_assert!(size <= SMALL_MAX);
    // SAFETY: size <= SMALL_MAX, so (size + 15) / 16 < GRANULES; the entry is the offset of a
    // class's `ClassState` inside a `Heap`, and `h` is a valid heap (contract above).
    unsafe {
        let off = *(*h).class_off.get_unchecked((size + 15) >> 4) as usize;
        &*((h as *const u8).add(off) as *const ClassState)
    }
}

/// Class `c`'s state in heap `h`, without a bounds check.
///
/// # Safety
/// `c < NCLASSES`; `h` is a valid heap.
#[inline(always)]
pub(super) unsafe fn class_state<'a>(h: *mut Heap, c: usize) -> &'a ClassState {
    debug_assert!(c < NCLASSES);
    // SAFETY: `h` is a valid heap and `c < NCLASSES` (contract above).
    unsafe { (*h).classes.get_unchecked(c) }
}

/// A block of class `c` from heap `h` (`size` bytes requested, for the counters).
///
/// # Safety
/// The allocator is initialized, the caller holds `h`'s claim, and `c < NCLASSES`.
#[inline]
pub(super) unsafe fn alloc_class(h: *mut Heap, c: usize, size: usize) -> *mut u8 {
    // SAFETY: `h` is a heap (never unmapped) whose claim the caller holds.
    unsafe {
        if (*h).shared.pending.load(Relaxed) & !SLOW != 0 {
            drain(h);
        }
    }
    // SAFETY: as above: the cache and the active run are `h`'s, and the claim holder is the
    // one writer of them and of the counters.
    unsafe {
        let s = cache_pop(&(*h).classes[c]);
        if !s.is_null() {
            bump(&(*h).classes[c].allocs, 1);
            bump(&(*h).classes[c].requested, size as u64);
            return s as *mut u8;
        }
        let sb = (*h).classes[c].active;
        if !sb.is_null() {
            let p = pop(sb);
            if !p.is_null() {
                bump(&(*h).classes[c].allocs, 1);
                bump(&(*h).classes[c].requested, size as u64);
                return p;
            }
        }
    }
    // SAFETY: as for this function.
    unsafe { refill(h, c, size) }
}

/// [`alloc_class`] when the active run is full or missing: the most occupied run of the class
/// that has room, the spare, or a new run becomes active.
///
/// # Safety
/// As for [`alloc_class`].
#[cold]
unsafe fn refill(h: *mut Heap, c: usize, size: usize) -> *mut u8 {
    // A thread that allocates hands its gathered frees of other heaps over here at the latest.
    // SAFETY: `h` is this thread's heap, claim held (contract above).
    unsafe { flush_outbox(h) };
    // SAFETY: `h`'s class state and runs are changed only by its claim holder, the caller;
    // the active run, once no longer active, is full and in no list.
    unsafe {
        let old = (*h).classes[c].take_active();
        if !old.is_null() {
            set_state_group(old, G_FULL);
        }
    }
    let mut sb = null_mut();
    for g in (0..NGROUPS).rev() {
        // SAFETY: as above; the head of group `g`'s list is listed there.
        unsafe {
            let cand = (*h).classes[c].groups[g];
            if !cand.is_null() {
                unlink(h, cand);
                sb = cand;
                break;
            }
        }
    }
    // SAFETY: as above.
    let cs = unsafe { &mut (*h).classes[c] };
    if sb.is_null() && !cs.spare.is_null() {
        sb = cs.spare;
        cs.spare = null_mut();
    }
    if sb.is_null() {
        // SAFETY: initialized, claim held, `c < NCLASSES` (contract above).
        sb = unsafe { new_class_run(h, c) };
        if sb.is_null() {
            return null_mut();
        }
    }
    // SAFETY: `sb` is a run of `h` in no list (unlinked, the spare or new), claim held.
    unsafe {
        set_state_group(sb, G_ACTIVE);
        (*h).classes[c].active = sb;
        let p = pop(sb);
        bump(&(*h).classes[c].allocs, 1);
        bump(&(*h).classes[c].requested, size as u64);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classes::small_class_of;

    #[test]
    fn granule_offsets_name_the_class_state_of_the_size() {
        let off = granule_cs_offsets();
        for size in 0..=SMALL_MAX {
            assert_eq!(
                off[(size + 15) >> 4] as u32,
                cs_offset(small_class_of(size)),
                "size {size}"
            );
        }
    }
}
