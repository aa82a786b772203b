//! Runs and spans, a node's side (with the node lock held): run descriptors and the unit map
//! of a superblock, the free-span bins of a node's span pools, taking, cutting and coalescing
//! spans, and [`node_units`], which finds memory for a run: the heap's own pool's resident
//! spans, a cached superblock, the other pools' resident spans, spans never handed out, and
//! only then a new superblock.

use core::ptr::null_mut;
use core::sync::atomic::{AtomicU16, Ordering::Relaxed};

use super::structs::{
    list_push, list_unlink, NodeInner, NodeState, Run, Segment, SpanBins, SpanPool, NODES, NO_DESC,
    NPOOLS, R_FREE, SPAN_BINS,
};
use super::superblock::{format_sb, map_sb, pop_cached_sb, release_sb, sb_data_units};
use super::{DESC_ALIGN, MAP_OFF, PAGE, UNIT};
use crate::os;

/// A fresh descriptor of `seg`, or null when all are in use.
///
/// # Safety
/// `seg` is a superblock header whose descriptor fields are laid out (see [`format_sb`]), and
/// the caller holds its node's lock or is the only one that references the superblock.
pub(super) unsafe fn new_desc(seg: *mut Segment) -> *mut Run {
    // SAFETY: `seg` is a laid-out header the caller may change; a listed free descriptor's
    // index is below `max_desc`, inside the descriptor array.
    let i = unsafe {
        if (*seg).desc_free != NO_DESC {
            let i = (*seg).desc_free;
            (*seg).desc_free = (*(*seg).descs.add(i as usize)).next_desc;
            i
        } else if (*seg).desc_bump < (*seg).max_desc {
            let i = (*seg).desc_bump;
            (*seg).desc_bump += 1;
            i
        } else {
            return null_mut();
        }
    };
    // SAFETY: `i < max_desc`, so `r` is a slot of the descriptor array, which the caller may
    // change (contract above).
    unsafe {
        let r = (*seg).descs.add(i as usize);
        (*r).seg = seg;
        (*r).prev = null_mut();
        (*r).next = null_mut();
        r
    }
}

/// The index of `r` in its superblock's descriptor array.
///
/// # Safety
/// `r` is a descriptor handed out by [`new_desc`] (in its superblock's array, `seg` set).
#[inline]
unsafe fn desc_index(r: *mut Run) -> u32 {
    // SAFETY: `r` and `descs` point into the same descriptor array (contract above).
    unsafe { r.offset_from((*(*r).seg).descs) as u32 }
}

/// Puts a descriptor that no run uses any more on its superblock's free list.
///
/// # Safety
/// `r` is a descriptor of a superblock of a node whose lock the caller holds; it is listed
/// nowhere and covers no units (they were merged into another span or the superblock is empty).
unsafe fn free_desc(r: *mut Run) {
    // SAFETY: `r` and its superblock's descriptor list are changed only under the node lock,
    // which the caller holds.
    unsafe {
        let seg = (*r).seg;
        (*r).state.store(R_FREE, Relaxed);
        (*r).nunits = 0;
        (*r).next_desc = (*seg).desc_free;
        (*seg).desc_free = desc_index(r);
    }
}

/// Unit `u`'s map entry: the offset of the descriptor covering it from the superblock's base,
/// in [`DESC_ALIGN`] steps (see [`desc_at`]).
///
/// The map is read and written with relaxed atomics. [`map_all`] writes a run's entries after
/// the run left the node lock; [`free_units`], under the lock, reads the entry just before or
/// after the span it frees, which may be an end entry of a run being mapped at that moment.
/// Whichever value it sees, the descriptor it names is checked (free, adjacent) under the
/// lock, and a run being mapped is not free; the atomics make that read defined. On x86-64 a
/// relaxed u16 load or store is the same `mov` as a plain one.
///
/// # Safety
/// `base` is the base of a live superblock and `u` one of its units.
#[inline(always)]
unsafe fn map_get(base: usize, u: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        let v: usize;
        // SAFETY: the map (at MAP_OFF from the base) has an entry per unit of the superblock
        // (contract above), 2-byte aligned. An aligned 16-bit load is atomic on x86-64, the
        // same `movzx` the relaxed atomic load is; written out because LLVM zero-extends that
        // load's result a second time, one instruction more on `free`'s fast path.
        unsafe {
            core::arch::asm!(
                "movzx {v:e}, word ptr [{b} + 2*{u} + {off}]",
                b = in(reg) base,
                u = in(reg) u,
                off = const MAP_OFF,
                v = out(reg) v,
                options(nostack, readonly, preserves_flags, pure),
            );
        }
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as above.
    usize::from(unsafe { (*((base + MAP_OFF) as *const AtomicU16).add(u)).load(Relaxed) })
}

/// Sets unit `u`'s map entry to `e` (see [`map_get`]).
///
/// # Safety
/// As for [`map_get`].
#[inline(always)]
unsafe fn map_set(base: usize, u: u32, e: u16) {
    // SAFETY: as for `map_get`.
    unsafe { (*((base + MAP_OFF) as *const AtomicU16).add(u as usize)).store(e, Relaxed) }
}

/// The map entry that names descriptor `r`: its offset from its superblock's base in
/// [`DESC_ALIGN`] steps (below 2^16: see `format_sb`).
///
/// # Safety
/// `r` is a descriptor handed out by [`new_desc`].
#[inline]
unsafe fn entry_of(r: *mut Run) -> u16 {
    // SAFETY: `r` is a descriptor of its superblock (contract above).
    let base = unsafe { (*(*r).seg).base };
    ((r as usize - base) / DESC_ALIGN) as u16
}

/// The descriptor a map entry `e` of the superblock at `base` names: address arithmetic, no
/// load of the descriptor array's address (the descriptors sit at a multiple of
/// [`DESC_ALIGN`] from the base, see `format_sb`).
#[inline(always)]
fn desc_at(base: usize, e: usize) -> *mut Run {
    (base + e * DESC_ALIGN) as *mut Run
}

/// Points the first and last unit of a span at its descriptor (all a free span needs: the
/// neighbours look only at its ends).
///
/// # Safety
/// `r` is a descriptor from [`new_desc`] with `first` and `nunits >= 1` naming units of its
/// superblock, and the caller holds the node lock (or is the only one that references the
/// superblock).
#[inline]
pub(super) unsafe fn map_ends(r: *mut Run) {
    // SAFETY: both units lie in the superblock, so in its unit map; the map's entries of free
    // spans are written under the node lock, which the caller holds (contract above).
    unsafe {
        let base = (*(*r).seg).base;
        let e = entry_of(r);
        map_set(base, (*r).first, e);
        map_set(base, (*r).first + (*r).nunits - 1, e);
    }
}

/// Points every unit of a run at its descriptor (a pointer anywhere in it finds it).
///
/// # Safety
/// `r` is a run the caller has just taken from [`node_units`] (its state set, so no other
/// thread merges it or writes its units' map entries) and not yet published.
pub(super) unsafe fn map_all(r: *mut Run) {
    // SAFETY: the run's units lie in its superblock's unit map, and the run is the caller's
    // alone (contract above).
    unsafe {
        let base = (*(*r).seg).base;
        let e = entry_of(r);
        for u in (*r).first..(*r).first + (*r).nunits {
            map_set(base, u, e);
        }
    }
}

/// The run covering `p`, a pointer into a live run of the superblock at `base`: the unit
/// map's entry for `p`'s unit names the descriptor by its offset from `base` (two loads in
/// all on `free`'s path from the pointer to the run: the region map byte and this entry).
///
/// # Safety
/// `base` is the base of a live superblock and `p` points into one of its runs in use (a class
/// or block run, whose units all name its descriptor: see [`map_all`]).
#[inline(always)]
pub(super) unsafe fn run_at(base: usize, p: usize) -> *mut Run {
    // SAFETY: `p` lies in a run in use of the superblock, so its unit's map entry names that
    // run's descriptor (set by `map_all`).
    desc_at(base, unsafe { map_get(base, (p - base) / UNIT) })
}

#[inline]
fn span_bin(nunits: u32) -> usize {
    (nunits as usize).min(SPAN_BINS - 1)
}

/// The set of `sp` a free span belongs in (see [`SpanPool`]).
///
/// # Safety
/// `sp` is a span pool and `r` a free span of the same node, whose lock the caller holds.
#[inline]
unsafe fn bins_of(sp: *mut SpanPool, r: *mut Run) -> *mut SpanBins {
    // SAFETY: `r` and `sp` are valid and changed only under the node lock the caller holds.
    unsafe {
        if (*r).fresh != 0 {
            &raw mut (*sp).fresh
        } else {
            &raw mut (*sp).used
        }
    }
}

/// Lists a free span in its bin of `sp`.
///
/// # Safety
/// `sp` is a span pool of `r`'s node, whose lock the caller holds; `r` is a free span of that
/// node with `nunits` set, listed nowhere.
unsafe fn push_span(sp: *mut SpanPool, r: *mut Run) {
    // SAFETY: as for this function: the pool, `r` and the listed spans are valid and changed
    // only under the node lock, which the caller holds.
    unsafe {
        let sp = bins_of(sp, r);
        let b = span_bin((*r).nunits);
        (*r).group = b as u32;
        list_push(&mut (*sp).spans[b], r);
        (*sp).bits[b / 64] |= 1 << (b % 64);
    }
}

/// Takes a free span out of its bin of `sp`.
///
/// # Safety
/// `r` is listed in `sp` (by [`push_span`]), a span pool of a node whose lock the caller holds.
unsafe fn unlink_span(sp: *mut SpanPool, r: *mut Run) {
    // SAFETY: as for this function: the pool, `r` and its list neighbours are valid and
    // changed only under the node lock, which the caller holds.
    unsafe {
        let sp = bins_of(sp, r);
        let b = (*r).group as usize;
        list_unlink(&mut (*sp).spans[b], r);
        if (*sp).spans[b].is_null() {
            (*sp).bits[b / 64] &= !(1 << (b % 64));
        }
    }
}

/// Takes the smallest free span of at least `n` units out of one set of the pool (`fresh`
/// or not; best fit: bins are exact lengths) and cuts it to `n` units, the rest going back
/// to the pool.
///
/// # Safety
/// `sp` is a span pool of a node whose lock the caller holds; `n >= 1`.
unsafe fn take_span(sp: *mut SpanPool, fresh: bool, n: usize) -> *mut Run {
    // SAFETY: `sp` points to a span pool (contract above).
    let bins = unsafe {
        if fresh {
            &raw mut (*sp).fresh
        } else {
            &raw mut (*sp).used
        }
    };
    let mut b = span_bin(n as u32);
    while b < SPAN_BINS {
        let w = b / 64;
        // SAFETY: the pool's bins are read under the node lock the caller holds.
        let bits = unsafe { (*bins).bits[w] } & (!0u64 << (b % 64));
        if n >= SPAN_BINS && bits != 0 {
            // Longer than any exact bin: only the last bin can hold it, and its spans have
            // any length from SPAN_BINS - 1 up, so the best fit is found by walking it.
            // SAFETY: the bins are read and changed under the node lock the caller holds.
            return unsafe { take_longest_bin(sp, bins, n) };
        }
        if bits != 0 {
            // SAFETY: a set bit marks a non-empty bin: `r` is a free span listed in `sp`, and
            // the caller holds the node lock.
            unsafe {
                let r = (*bins).spans[w * 64 + bits.trailing_zeros() as usize];
                unlink_span(sp, r);
                cut(sp, r, n);
                return r;
            }
        }
        b = (w + 1) * 64;
    }
    null_mut()
}

/// The smallest span of at least `n` units (`n >= SPAN_BINS`) in the last bin of `bins`, a
/// set of `sp`, cut to `n` units; null when none is that long. The last bin holds the few
/// spans longer than any exact bin (each superblock has at most a handful), so the walk is
/// short.
///
/// # Safety
/// `bins` is `sp`'s `used` or `fresh` set, `sp` a span pool of a node whose lock the caller
/// holds.
unsafe fn take_longest_bin(sp: *mut SpanPool, bins: *mut SpanBins, n: usize) -> *mut Run {
    let mut best: *mut Run = null_mut();
    // SAFETY: the listed spans are valid and change only under the node lock, which the
    // caller holds.
    unsafe {
        let mut r = (*bins).spans[SPAN_BINS - 1];
        while !r.is_null() {
            if (*r).nunits as usize >= n && (best.is_null() || (*r).nunits < (*best).nunits) {
                best = r;
            }
            r = (*r).next;
        }
        if !best.is_null() {
            unlink_span(sp, best);
            cut(sp, best, n);
        }
    }
    best
}

/// Cuts an unlisted span to `n` units; the rest goes to the pool.
///
/// # Safety
/// `r` is a free span of `sp`'s node listed nowhere, the caller holds that node's lock, and
/// `n >= 1`.
pub(super) unsafe fn cut(sp: *mut SpanPool, r: *mut Run, n: usize) {
    let n = n as u32;
    // SAFETY: `r` is a span of the node whose lock the caller holds (contract above).
    if unsafe { (*r).nunits } > n {
        // SAFETY: `r`'s superblock is laid out, and its descriptors change under the node
        // lock, which the caller holds.
        let rest = unsafe { new_desc((*r).seg) };
        if rest.is_null() {
            return; // no descriptor left: the caller gets the whole span
        }
        // SAFETY: `rest` is a fresh descriptor for `r`'s last units (`n >= 1` of them stay
        // with `r`): a free span of the same node listed nowhere, node lock held.
        unsafe {
            (*rest).first = (*r).first + n;
            (*rest).nunits = (*r).nunits - n;
            (*rest).fresh = (*r).fresh;
            (*rest).state.store(R_FREE, Relaxed);
            map_ends(rest);
            push_span(sp, rest);
            (*r).nunits = n;
        }
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
///
/// # Safety
/// The allocator is initialized ([`ensure_init`](super::config::ensure_init) has returned),
/// and `1 <= n` units fit in a superblock's data pages (callers ask for at most
/// `MEDIUM_MAX` bytes).
pub(super) unsafe fn node_units(node: usize, pool: usize, n: usize, state: u32) -> *mut Run {
    let ns = &NODES[node];
    // SAFETY: initialized, `n >= 1` (contract above).
    let r = unsafe { find_units(ns, pool, n, state, false) };
    if !r.is_null() {
        return r;
    }
    ns.grow.lock();
    // Another thread may have mapped a superblock while this one waited.
    // SAFETY: as above.
    let mut r = unsafe { find_units(ns, pool, n, state, false) };
    if r.is_null() {
        let seg = map_sb(node);
        if !seg.is_null() {
            ns.lock.lock();
            // SAFETY: `seg` is a fresh superblock of this node that nobody else references,
            // and the node lock is held; a fresh superblock always yields a span (`r` not null).
            unsafe {
                r = carve_sb(ns.inner.get(), seg, pool, n);
                (*r).state.store(state, Relaxed);
            }
            ns.lock.unlock();
        }
    }
    ns.grow.unlock();
    r
}

/// A run of `n` units in state `state` of `node` from memory the node has already touched
/// (its pools' resident free spans, then a cached superblock), or null: never a span of
/// untouched pages and never a new superblock. Takes the node lock.
///
/// For blocks above `MEDIUM_MAX`, which otherwise get a mapping of their own: the memory a
/// program freed at one size then serves its next large block, as in glibc's heap, instead of
/// adding a fresh mapping to the resident pages (see docs/alloc.md, "Real programs").
///
/// # Safety
/// The allocator is initialized and `1 <= n` (a request longer than any superblock's data
/// just finds nothing).
pub(super) unsafe fn node_units_resident(
    node: usize,
    pool: usize,
    n: usize,
    state: u32,
) -> *mut Run {
    // SAFETY: initialized, `n >= 1` (contract above).
    unsafe { find_units(&NODES[node], pool, n, state, true) }
}

/// Gives the pages of `node`'s resident free spans back to the OS (`madvise(MADV_DONTNEED)`,
/// longest spans first in each pool) until `want` bytes or all of them; the spans move to the
/// set of untouched ones (served last). Returns the bytes given back. Takes the node lock
/// (the `madvise` calls run under it: rare, one per large mapping).
///
/// Called when a large block is about to be mapped because no free span fits it: the mapping
/// then replaces free memory the program had touched (scattered between live runs) instead of
/// adding to it. Only then: a span's pages that are given back fault in again when reused.
pub(super) fn purge_resident(node: usize, want: usize) -> usize {
    let ns = &NODES[node];
    let inner = ns.inner.get();
    let mut done = 0;
    ns.lock.lock();
    'pools: for i in 0..NPOOLS {
        // SAFETY: the node's state, changed only under its lock, which is held.
        let sp = unsafe { &raw mut (*inner).spans[i] };
        // Bins from the longest down to spans of one whole page at least.
        for b in (PAGE / UNIT..SPAN_BINS).rev() {
            // SAFETY: as above; listed spans are free spans of this node's superblocks, and
            // their data pages hold nothing (free spans keep their links in descriptors).
            unsafe {
                if (*sp).used.bits[b / 64] & 1 << (b % 64) == 0 {
                    continue;
                }
                let mut r = (*sp).used.spans[b];
                while !r.is_null() {
                    let next = (*r).next;
                    let start = (*(*r).seg).base + (*r).first as usize * UNIT;
                    let end = start + (*r).nunits as usize * UNIT;
                    let (ps, pe) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
                    if pe > ps {
                        os::purge(ps, pe - ps);
                        done += pe - ps;
                        unlink_span(sp, r);
                        (*r).fresh = 1;
                        push_span(sp, r);
                    }
                    if done >= want {
                        break 'pools;
                    }
                    r = next;
                }
            }
        }
    }
    ns.lock.unlock();
    ns.purged.fetch_add(done as u64, Relaxed);
    done
}

/// Formats a superblock just taken (from the cache or the OS) into `pool` and cuts a run of `n`
/// units from its start; the rest is listed in the pool. The caller holds the node lock.
///
/// # Safety
/// The caller holds the lock of the node whose state `inner` is; `seg` comes from that node's
/// [`pop_cached_sb`] or [`map_sb`] and nobody else references it; `n >= 1`.
unsafe fn carve_sb(inner: *mut NodeInner, seg: *mut Segment, pool: usize, n: usize) -> *mut Run {
    let pool = pool % NPOOLS;
    // SAFETY: `seg` is a superblock taken from the cache or the OS, ours alone (contract
    // above); its span `r` is a free span listed nowhere, and the node lock is held.
    unsafe {
        let r = format_sb(seg);
        (*seg).pool = pool as u32;
        cut(&raw mut (*inner).spans[pool], r, n);
        r
    }
}

/// [`node_units`] from memory the node already has, in one hold of the node lock: the heap's
/// own pool's resident spans, a cached superblock (when `n` fits one), the other pools'
/// resident spans, then, unless `resident_only`, spans never handed out (own pool first).
/// Null when none fits.
///
/// The state is set under the lock: a neighbour freed by another thread looks at this run's
/// descriptor to decide whether to merge with it, and must not see it free once handed out.
///
/// # Safety
/// As for [`node_units`]: the allocator is initialized and `1 <= n` units fit in a superblock.
unsafe fn find_units(
    ns: &NodeState,
    pool: usize,
    n: usize,
    state: u32,
    resident_only: bool,
) -> *mut Run {
    // Only raw pointers outside the lock; dereferenced with the lock held.
    let inner = ns.inner.get();
    let pool = pool % NPOOLS;
    // SAFETY: `inner` points to the node's state, a static: the place is in bounds (no read).
    let sp = |i: usize| unsafe { &raw mut (*inner).spans[(pool + i) % NPOOLS] };
    ns.lock.lock();
    // SAFETY: a pool of this node, whose lock is held; `n >= 1`.
    let mut r = unsafe { take_span(sp(0), false, n) };
    if r.is_null() && n <= sb_data_units() {
        // SAFETY: `inner` is `ns`'s state and its lock is held.
        let seg = unsafe { pop_cached_sb(ns, inner) };
        if !seg.is_null() {
            // SAFETY: `seg` just left this node's cache (ours alone); node lock held.
            r = unsafe { carve_sb(inner, seg, pool, n) };
        }
    }
    for i in 1..NPOOLS {
        if !r.is_null() {
            break;
        }
        // SAFETY: as for the first `take_span`.
        r = unsafe { take_span(sp(i), false, n) };
    }
    for i in 0..NPOOLS {
        if !r.is_null() || resident_only {
            break;
        }
        // SAFETY: as for the first `take_span`.
        r = unsafe { take_span(sp(i), true, n) };
    }
    if !r.is_null() {
        // SAFETY: `r` is the descriptor of the span just taken, node lock held.
        unsafe { (*r).state.store(state, Relaxed) };
    }
    ns.lock.unlock();
    r
}

/// Gives a run back to its node's free spans; a superblock left with no run in use goes to
/// the node's cache. Takes the node lock.
///
/// # Safety
/// `r` is a class or block run taken from [`node_units`] that nothing uses any more: no live
/// block, listed in no heap; the caller gives it up.
pub(super) unsafe fn node_free(r: *mut Run) {
    // SAFETY: `r` is a run in use until this call, so its superblock is live; `node` and
    // `pool` do not change while a run of it is in use (set when it is formatted).
    let (seg, ns, sp) = unsafe {
        let seg = (*r).seg;
        let ns = &NODES[(*seg).node as usize];
        let sp = &raw mut (*ns.inner.get()).spans[(*seg).pool as usize];
        (seg, ns, sp)
    };
    ns.lock.lock();
    // SAFETY: `sp` is the pool of `r`'s superblock, the node lock is held, and the run is
    // unused and unlisted (contract above).
    let empty = unsafe { free_units(sp, r) };
    ns.lock.unlock();
    if empty {
        // SAFETY: `free_units` found every run of `seg` free and listed none of its units.
        unsafe { release_sb(seg) };
    }
}

/// Gives a run's units back to a pool, merged with free neighbours. Returns true when that
/// left the superblock with no run in use: the merged span is then not listed, and the
/// caller releases the superblock.
///
/// # Safety
/// The caller holds the lock of `r`'s node and `sp` is the pool of `r`'s superblock; `r` is a
/// run in use that nothing uses any more, listed nowhere.
unsafe fn free_units(sp: *mut SpanPool, mut r: *mut Run) -> bool {
    // SAFETY: `r` is a run of a live superblock, the node lock is held (contract above).
    let seg = unsafe {
        let seg = (*r).seg;
        (*r).state.store(R_FREE, Relaxed);
        // Its pages have been handed out: resident (the merged span counts as used too).
        (*r).fresh = 0;
        seg
    };
    // SAFETY: the unit before `r` is in the superblock; map entries name only descriptors of
    // the superblock's array (each one written by `map_ends` or `map_all`; a superblock is
    // always formatted with the same layout, so an entry left from an earlier use of a cached
    // one still names a slot of the array), and the checks confirm a free span of `sp` (node
    // lock held).
    unsafe {
        if (*r).first > (*seg).data_unit {
            let p = desc_at((*seg).base, map_get((*seg).base, ((*r).first - 1) as usize));
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
    }
    // SAFETY: as above, for the unit after `r` (checked to be inside the superblock).
    unsafe {
        let nx = (*r).first + (*r).nunits;
        if nx < (*seg).nunits {
            let q = desc_at((*seg).base, map_get((*seg).base, nx as usize));
            if (*q).state.load(Relaxed) == R_FREE && (*q).nunits != 0 && (*q).first == nx {
                unlink_span(sp, q);
                (*r).nunits += (*q).nunits;
                free_desc(q);
            }
        }
    }
    // SAFETY: `r` is now the merged free span, listed nowhere, node lock held.
    unsafe {
        if (*r).first == (*seg).data_unit && (*r).first + (*r).nunits == (*seg).nunits {
            free_desc(r);
            return true;
        }
        map_ends(r);
        push_span(sp, r);
    }
    false
}
