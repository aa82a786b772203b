//! A heap's sub-allocator for one size class (claim holder only): class runs (carving one
//! from the node, popping a block, finding a block's start), their occupancy groups (filing a
//! run after frees, the spare), allocation from the active run with refill from the most
//! occupied run that has room, and local frees.

use core::ptr::null_mut;
use core::sync::atomic::Ordering::Relaxed;

use super::heap::drain;
use super::spans::{map_all, node_free, node_units};
use super::structs::{ClassState, Free, Heap, Run, RUN_BYTES, R_BLOCK, R_CLASS};
use super::{bump, G_ACTIVE, G_FULL, G_SPARE, NGROUPS, UNIT};
use crate::classes::{magic, NCLASSES, SIZES};

/// Units of a run of class `c`: about [`RUN_BYTES`], whole blocks, whole units.
fn run_units(c: usize) -> usize {
    let bsize = SIZES[c];
    let blocks = RUN_BYTES.div_ceil(bsize).max(1);
    (blocks * bsize).div_ceil(UNIT)
}

/// A new run of class `c` for heap `h` (null when out of memory).
unsafe fn new_class_run(h: *mut Heap, c: usize) -> *mut Run {
    let r = node_units((*h).mem_node, (*h).id, run_units(c), R_CLASS);
    if r.is_null() {
        return r;
    }
    (*r).owner.store(h, Relaxed);
    let bsize = SIZES[c];
    let data = (*(*r).seg).base + (*r).first as usize * UNIT;
    let cap = (*r).nunits as usize * UNIT / bsize;
    (*r).class = c as u32;
    set_state_group(r, G_ACTIVE);
    (*r).bsize = bsize;
    (*r).magic = magic(bsize);
    (*r).data = data;
    (*r).end = data + cap * bsize;
    (*r).bump = data;
    (*r).free = null_mut();
    (*r).used = 0;
    (*r).capacity = cap as u32;
    map_all(r);
    r
}

#[inline]
pub(super) unsafe fn pop(r: *mut Run) -> *mut u8 {
    let f = (*r).free;
    if !f.is_null() {
        (*r).free = (*f).next;
        (*r).used += 1;
        return f as *mut u8;
    }
    let b = (*r).bump;
    if b < (*r).end {
        (*r).bump = b + (*r).bsize;
        (*r).used += 1;
        return b as *mut u8;
    }
    null_mut()
}

#[inline]
pub(super) unsafe fn block_start(r: *mut Run, p: usize) -> usize {
    if (*r).state.load(Relaxed) == R_BLOCK {
        return (*r).data;
    }
    let off = p.wrapping_sub((*r).data);
    let idx = ((off as u128 * (*r).magic as u128) >> 64) as usize;
    (*r).data + idx * (*r).bsize
}

// Occupancy groups.

unsafe fn unlink(h: *mut Heap, r: *mut Run) {
    let g = (*r).group as usize;
    let cs = &mut (*h).classes[(*r).class as usize];
    if (*r).prev.is_null() {
        cs.groups[g] = (*r).next;
    } else {
        (*(*r).prev).next = (*r).next;
    }
    if !(*r).next.is_null() {
        (*(*r).next).prev = (*r).prev;
    }
    (*r).prev = null_mut();
    (*r).next = null_mut();
}

/// Puts a class run in one of the groups that are not lists (active, full, spare), with the
/// `lo` that makes a free's single test `used < lo` right: never true for the active run and
/// the spare (frees into them change nothing), always true for a full one (it gets filed).
#[inline]
pub(super) unsafe fn set_state_group(r: *mut Run, g: u32) {
    (*r).group = g;
    (*r).lo = if g == G_FULL { u32::MAX } else { 0 };
}

/// Files a non-active run under its occupancy group (or as spare / back to the free spans).
pub(super) unsafe fn file(h: *mut Heap, r: *mut Run) {
    let c = (*r).class as usize;
    let used = (*r).used as usize;
    let cap = (*r).capacity as usize;
    if used == 0 {
        let cs = &mut (*h).classes[c];
        if cs.spare.is_null() {
            cs.spare = r;
            set_state_group(r, G_SPARE);
        } else {
            (*r).owner.store(null_mut(), Relaxed);
            node_free(r);
        }
        return;
    }
    if used == cap {
        set_state_group(r, G_FULL);
        return;
    }
    let g = used * NGROUPS / cap;
    (*r).lo = ((g * cap).div_ceil(NGROUPS)).max(1) as u32;
    (*r).group = g as u32;
    let cs = &mut (*h).classes[c];
    (*r).prev = null_mut();
    (*r).next = cs.groups[g];
    if !cs.groups[g].is_null() {
        (*cs.groups[g]).prev = r;
    }
    cs.groups[g] = r;
}

#[inline]
pub(super) unsafe fn local_free(h: *mut Heap, r: *mut Run, blk: usize) {
    let f = blk as *mut Free;
    (*f).next = (*r).free;
    (*r).free = f;
    (*r).used -= 1;
    bump(&class_state(h, (*r).class as usize).frees, 1);
    if (*r).used < (*r).lo {
        regroup(h, r);
    }
}

/// After a local free into a run that is not active: files a run that was full, or moves the
/// run to its new occupancy group (what [`local_free`] does after the push).
#[inline(never)]
pub(super) unsafe extern "C" fn regroup(h: *mut Heap, r: *mut Run) {
    if (*r).group == G_FULL {
        file(h, r);
    } else {
        unlink(h, r);
        file(h, r);
    }
}

// Allocation from the class's runs.

/// Class `c`'s state in heap `h`, without a bounds check.
///
/// # Safety
/// `c < NCLASSES`; `h` is a valid heap.
#[inline(always)]
pub(super) unsafe fn class_state<'a>(h: *mut Heap, c: usize) -> &'a ClassState {
    debug_assert!(c < NCLASSES);
    (*h).classes.get_unchecked(c)
}

#[inline]
pub(super) unsafe fn alloc_class(h: *mut Heap, c: usize, size: usize) -> *mut u8 {
    if (*h).shared.pending.load(Relaxed) != 0 {
        drain(h);
    }
    let sb = (*h).classes[c].active;
    if !sb.is_null() {
        let p = pop(sb);
        if !p.is_null() {
            bump(&(*h).classes[c].allocs, 1);
            bump(&(*h).st.requested, size as u64);
            return p;
        }
    }
    refill(h, c, size)
}

#[cold]
unsafe fn refill(h: *mut Heap, c: usize, size: usize) -> *mut u8 {
    let cs = &mut (*h).classes[c];
    let old = cs.active;
    if !old.is_null() {
        cs.active = null_mut();
        set_state_group(old, G_FULL);
    }
    let mut sb = null_mut();
    for g in (0..NGROUPS).rev() {
        let cand = (*h).classes[c].groups[g];
        if !cand.is_null() {
            unlink(h, cand);
            sb = cand;
            break;
        }
    }
    let cs = &mut (*h).classes[c];
    if sb.is_null() && !cs.spare.is_null() {
        sb = cs.spare;
        cs.spare = null_mut();
    }
    if sb.is_null() {
        sb = new_class_run(h, c);
        if sb.is_null() {
            return null_mut();
        }
    }
    set_state_group(sb, G_ACTIVE);
    (*h).classes[c].active = sb;
    let p = pop(sb);
    bump(&(*h).classes[c].allocs, 1);
    bump(&(*h).st.requested, size as u64);
    p
}
