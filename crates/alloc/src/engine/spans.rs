//! Runs and spans, a node's side (with the node lock held): run descriptors and the unit map
//! of a superblock, the free-span bins of a node's span pools, taking, cutting and coalescing
//! spans, and [`node_units`], which finds memory for a run: the heap's own pool's resident
//! spans, a cached superblock, the other pools' resident spans, spans never handed out, and
//! only then a new superblock.

use core::ptr::null_mut;
use core::sync::atomic::Ordering::Relaxed;

use super::structs::{
    NodeInner, NodeState, Run, Segment, SpanBins, SpanPool, NODES, NO_DESC, NPOOLS, R_FREE,
    SPAN_BINS,
};
use super::superblock::{format_sb, map_sb, pop_cached_sb, release_sb};
use super::UNIT;

/// A fresh descriptor of `seg`, or null when all are in use.
pub(super) unsafe fn new_desc(seg: *mut Segment) -> *mut Run {
    let i = if (*seg).desc_free != NO_DESC {
        let i = (*seg).desc_free;
        (*seg).desc_free = (*(*seg).descs.add(i as usize)).next_desc;
        i
    } else if (*seg).desc_bump < (*seg).max_desc {
        let i = (*seg).desc_bump;
        (*seg).desc_bump += 1;
        i
    } else {
        return null_mut();
    };
    let r = (*seg).descs.add(i as usize);
    (*r).seg = seg;
    (*r).prev = null_mut();
    (*r).next = null_mut();
    r
}

#[inline]
unsafe fn desc_index(r: *mut Run) -> u32 {
    r.offset_from((*(*r).seg).descs) as u32
}

unsafe fn free_desc(r: *mut Run) {
    let seg = (*r).seg;
    (*r).state.store(R_FREE, Relaxed);
    (*r).nunits = 0;
    (*r).next_desc = (*seg).desc_free;
    (*seg).desc_free = desc_index(r);
}

/// Points the first and last page of a span at its descriptor (all a free span needs: the
/// neighbours look only at its ends).
#[inline]
pub(super) unsafe fn map_ends(r: *mut Run) {
    let seg = (*r).seg;
    let i = desc_index(r) as u16;
    *(*seg).map.add((*r).first as usize) = i;
    *(*seg).map.add(((*r).first + (*r).nunits - 1) as usize) = i;
}

/// Points every page of a run at its descriptor (a pointer anywhere in it finds it).
pub(super) unsafe fn map_all(r: *mut Run) {
    let seg = (*r).seg;
    let i = desc_index(r) as u16;
    for u in (*r).first..(*r).first + (*r).nunits {
        *(*seg).map.add(u as usize) = i;
    }
}

/// [`run_of`] with the superblock's base already known (from the region lookup): one load
/// fewer on `free`'s dependency chain.
#[inline(always)]
pub(super) unsafe fn run_at(seg: *mut Segment, base: usize, p: usize) -> *mut Run {
    debug_assert_eq!(base, (*seg).base);
    (*seg)
        .descs
        .add(*(*seg).map.add((p - base) / UNIT) as usize)
}

/// The run covering `p` (a pointer into a live run of `seg`).
#[inline]
pub(super) unsafe fn run_of(seg: *mut Segment, p: usize) -> *mut Run {
    let u = (p - (*seg).base) / UNIT;
    (*seg).descs.add(*(*seg).map.add(u) as usize)
}

#[inline]
fn span_bin(nunits: u32) -> usize {
    (nunits as usize).min(SPAN_BINS - 1)
}

/// The set of `sp` a free span belongs in (see [`SpanPool`]).
#[inline]
unsafe fn bins_of(sp: *mut SpanPool, r: *mut Run) -> *mut SpanBins {
    if (*r).fresh != 0 {
        &raw mut (*sp).fresh
    } else {
        &raw mut (*sp).used
    }
}

unsafe fn push_span(sp: *mut SpanPool, r: *mut Run) {
    let sp = bins_of(sp, r);
    let b = span_bin((*r).nunits);
    (*r).group = b as u32;
    (*r).prev = null_mut();
    (*r).next = (*sp).spans[b];
    if !(*r).next.is_null() {
        (*(*r).next).prev = r;
    }
    (*sp).spans[b] = r;
    (*sp).bits[b / 64] |= 1 << (b % 64);
}

unsafe fn unlink_span(sp: *mut SpanPool, r: *mut Run) {
    let sp = bins_of(sp, r);
    let b = (*r).group as usize;
    if (*r).prev.is_null() {
        (*sp).spans[b] = (*r).next;
        if (*r).next.is_null() {
            (*sp).bits[b / 64] &= !(1 << (b % 64));
        }
    } else {
        (*(*r).prev).next = (*r).next;
    }
    if !(*r).next.is_null() {
        (*(*r).next).prev = (*r).prev;
    }
    (*r).prev = null_mut();
    (*r).next = null_mut();
}

/// Takes the smallest free span of at least `n` units out of one set of the pool (`fresh`
/// or not; best fit: bins are exact lengths) and cuts it to `n` units, the rest going back
/// to the pool.
unsafe fn take_span(sp: *mut SpanPool, fresh: bool, n: usize) -> *mut Run {
    let bins = if fresh {
        &raw mut (*sp).fresh
    } else {
        &raw mut (*sp).used
    };
    let mut b = span_bin(n as u32);
    while b < SPAN_BINS {
        let w = b / 64;
        let bits = (*bins).bits[w] & (!0u64 << (b % 64));
        if bits != 0 {
            let r = (*bins).spans[w * 64 + bits.trailing_zeros() as usize];
            unlink_span(sp, r);
            cut(sp, r, n);
            return r;
        }
        b = (w + 1) * 64;
    }
    null_mut()
}

/// Cuts an unlisted span to `n` units; the rest goes to the pool.
pub(super) unsafe fn cut(sp: *mut SpanPool, r: *mut Run, n: usize) {
    let n = n as u32;
    if (*r).nunits > n {
        let rest = new_desc((*r).seg);
        if rest.is_null() {
            return; // no descriptor left: the caller gets the whole span
        }
        (*rest).first = (*r).first + n;
        (*rest).nunits = (*r).nunits - n;
        (*rest).fresh = (*r).fresh;
        (*rest).state.store(R_FREE, Relaxed);
        map_ends(rest);
        push_span(sp, rest);
        (*r).nunits = n;
    }
}

/// A run of exactly `n` units in state `state` of `node`, from memory that is resident
/// before memory that is not: a free span whose pages have been used, else a cached
/// superblock, else a span never handed out, else a new superblock (see [`SpanPool`]).
/// Takes the node lock.
///
/// Only one thread of a node maps a superblock at a time (`grow`), and it looks for a span
/// again once it holds `grow`: two threads that both found nothing used to map one each, and
/// the second superblock was not needed (`buffer-passing`: RSS 1.17x the bytes requested
/// instead of 1.05x in about 1 run in 7). For the same reason the cache is popped in the hold
/// of the node lock that found no span (looked at under one hold and popped under another,
/// the other thread could empty it in between).
pub(super) unsafe fn node_units(node: usize, pool: usize, n: usize, state: u32) -> *mut Run {
    let ns = &NODES[node];
    let r = find_units(ns, pool, n, state);
    if !r.is_null() {
        return r;
    }
    ns.grow.lock();
    // Another thread may have mapped a superblock while this one waited.
    let mut r = find_units(ns, pool, n, state);
    if r.is_null() {
        let seg = map_sb(node);
        if !seg.is_null() {
            ns.lock.lock();
            r = carve_sb(ns.inner.get(), seg, pool, n);
            (*r).state.store(state, Relaxed);
            ns.lock.unlock();
        }
    }
    ns.grow.unlock();
    r
}

/// Formats a superblock just taken (from the cache or the OS) into `pool` and cuts a run of `n`
/// units from its start; the rest is listed in the pool. The caller holds the node lock.
unsafe fn carve_sb(inner: *mut NodeInner, seg: *mut Segment, pool: usize, n: usize) -> *mut Run {
    let pool = pool % NPOOLS;
    let r = format_sb(seg);
    (*seg).pool = pool as u32;
    cut(&raw mut (*inner).spans[pool], r, n);
    r
}

/// [`node_units`] from memory the node already has, in one hold of the node lock: the heap's
/// own pool's resident spans, a cached superblock, the other pools' resident spans, then spans
/// never handed out (own pool first). Null when none fits.
///
/// The state is set under the lock: a neighbour freed by another thread looks at this run's
/// descriptor to decide whether to merge with it, and must not see it free once handed out.
unsafe fn find_units(ns: &NodeState, pool: usize, n: usize, state: u32) -> *mut Run {
    // Only raw pointers outside the lock; dereferenced with the lock held.
    let inner = ns.inner.get();
    let pool = pool % NPOOLS;
    let sp = |i: usize| &raw mut (*inner).spans[(pool + i) % NPOOLS];
    ns.lock.lock();
    let mut r = take_span(sp(0), false, n);
    if r.is_null() {
        let seg = pop_cached_sb(ns, inner);
        if !seg.is_null() {
            r = carve_sb(inner, seg, pool, n);
        }
    }
    for i in 1..NPOOLS {
        if !r.is_null() {
            break;
        }
        r = take_span(sp(i), false, n);
    }
    for i in 0..NPOOLS {
        if !r.is_null() {
            break;
        }
        r = take_span(sp(i), true, n);
    }
    if !r.is_null() {
        (*r).state.store(state, Relaxed);
    }
    ns.lock.unlock();
    r
}

/// Gives a run back to its node's free spans; a superblock left with no run in use goes to
/// the node's cache. Takes the node lock.
pub(super) unsafe fn node_free(r: *mut Run) {
    let seg = (*r).seg;
    let ns = &NODES[(*seg).node as usize];
    let sp = &raw mut (*ns.inner.get()).spans[(*seg).pool as usize];
    ns.lock.lock();
    let empty = free_units(sp, r);
    ns.lock.unlock();
    if empty {
        release_sb(seg);
    }
}

/// Gives a run's units back to a pool, merged with free neighbours. Returns true when that
/// left the superblock with no run in use: the merged span is then not listed, and the
/// caller releases the superblock.
unsafe fn free_units(sp: *mut SpanPool, mut r: *mut Run) -> bool {
    let seg = (*r).seg;
    (*r).state.store(R_FREE, Relaxed);
    // Its pages have been handed out: resident (the merged span counts as used too).
    (*r).fresh = 0;
    if (*r).first > (*seg).data_unit {
        let p = (*seg)
            .descs
            .add(*(*seg).map.add((*r).first as usize - 1) as usize);
        if (*p).state.load(Relaxed) == R_FREE
            && (*p).nunits != 0
            && (*p).first + (*p).nunits == (*r).first
        {
            unlink_span(sp, p);
            (*p).fresh = 0;
            (*p).nunits += (*r).nunits;
            free_desc(r);
            r = p;
        }
    }
    let nx = (*r).first + (*r).nunits;
    if nx < (*seg).nunits {
        let q = (*seg).descs.add(*(*seg).map.add(nx as usize) as usize);
        if (*q).state.load(Relaxed) == R_FREE && (*q).nunits != 0 && (*q).first == nx {
            unlink_span(sp, q);
            (*r).nunits += (*q).nunits;
            free_desc(q);
        }
    }
    if (*r).first == (*seg).data_unit && (*r).first + (*r).nunits == (*seg).nunits {
        free_desc(r);
        return true;
    }
    map_ends(r);
    push_span(sp, r);
    false
}
