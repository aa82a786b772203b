//! Thread heaps: creating one or adopting an exited thread's from the node's pool, draining
//! the recollection bins, collecting abandoned heaps, handing a heap back at thread exit or
//! when its thread moves to another node, and the thread's heap slot (initial-exec TLS).

use core::ptr::null_mut;
use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, SeqCst},
};

use super::class_run::{cache_max, file, flush_cache, granule_cs_offsets, local_free};
use super::config::{
    current_node, ensure_init, home, memoryless_fallback, nodemap, FAST_SMALL, KEY, MULTI_NODE,
};
use super::deallocate::{flush_outbox, return_batch};
use super::spans::{node_free, run_at};
use super::structs::{push_list, Heap, Shared, NODES};
use super::{bump, PAGE, SLOW};
use crate::classes::{NCLASSES, NSMALL, SIZES};
use crate::os;

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);
pub(super) static ALL_HEAPS: AtomicPtr<Heap> = AtomicPtr::new(null_mut());

/// The calling thread's heap pointer, in the initial-exec TLS model on x86-64 Linux.
///
/// Rust's `thread_local!` in a shared object (libloci_malloc.so) uses the general-dynamic
/// model: every access calls `__tls_get_addr`. Callgrind on `loci bench alloc`'s `general`
/// worker counted that call at ~11 instructions and 7 loads per malloc/free, the largest
/// single item of the allocator's fast path; mimalloc avoids it with `initial-exec`. Stable
/// Rust has no way to pick the model (`-Z tls-model` is nightly), so the slot is an 8-byte
/// `.tbss` object defined here and read with one `fs`-relative load through its GOT offset,
/// which is exactly what a C compiler emits for `__attribute__((tls_model("initial-exec")))`.
/// The symbol is hidden, so every linked copy (preload library, test binaries) has its own.
/// Initial-exec needs the module in the static TLS block: true for executables and
/// `LD_PRELOAD` libraries; a late `dlopen` uses glibc's surplus static TLS (8 bytes here).
///
/// A thread without a heap finds [`NO_HEAP`] there, not null: the slot's initial value (a
/// relocated pointer in `.tdata`, which the dynamic linker fixes before it copies the image)
/// and what [`thread_exit`] leaves. So `malloc`'s fast path reads its heap's pending mask
/// without testing the pointer first.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tls_slot {
    use super::{Heap, NO_HEAP};

    core::arch::global_asm!(
        ".pushsection .tdata,\"awT\",@progbits",
        ".p2align 3",
        ".globl loci_alloc_tls_heap",
        ".hidden loci_alloc_tls_heap",
        ".type loci_alloc_tls_heap,@object",
        ".size loci_alloc_tls_heap,8",
        "loci_alloc_tls_heap:",
        ".quad {no_heap}",
        ".popsection",
        no_heap = sym NO_HEAP,
    );

    #[inline(always)]
    pub(super) fn get() -> *mut Heap {
        let v: *mut Heap;
        // SAFETY: reads this thread's 8-byte TLS slot defined above (fs = thread pointer,
        // GOTTPOFF = the slot's offset from it); no other memory is touched.
        unsafe {
            core::arch::asm!(
                "mov {v}, qword ptr [rip + loci_alloc_tls_heap@GOTTPOFF]",
                "mov {v}, qword ptr fs:[{v}]",
                v = out(reg) v,
                options(nostack, readonly, preserves_flags),
            );
        }
        v
    }

    #[inline]
    pub(super) fn set(h: *mut Heap) {
        // SAFETY: writes this thread's 8-byte TLS slot defined above.
        unsafe {
            core::arch::asm!(
                "mov {t}, qword ptr [rip + loci_alloc_tls_heap@GOTTPOFF]",
                "mov qword ptr fs:[{t}], {h}",
                t = out(reg) _,
                h = in(reg) h,
                options(nostack, preserves_flags),
            );
        }
    }
}

/// Portable fallback: `thread_local!` without destructor (a plain `#[thread_local]` that never
/// allocates and is valid until the thread's TLS is gone; thread exit is seen through the
/// pthread key below).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod tls_slot {
    use super::Heap;
    use core::cell::Cell;
    use core::ptr::null_mut;

    thread_local! {
        static HEAP: Cell<*mut Heap> = const { Cell::new(null_mut()) };
    }

    /// The heap, or [`NO_HEAP`](super::NO_HEAP) (never null, as on x86-64 Linux).
    #[inline]
    pub(super) fn get() -> *mut Heap {
        let h = HEAP.with(|c| c.get());
        if h.is_null() {
            super::no_heap()
        } else {
            h
        }
    }

    #[inline]
    pub(super) fn set(h: *mut Heap) {
        HEAP.with(|c| c.set(h))
    }
}

pub(super) fn create_heap(node: usize, claimed: bool) -> *mut Heap {
    let len = core::mem::size_of::<Heap>().div_ceil(PAGE) * PAGE;
    let p = os::map_aligned(len, PAGE) as *mut Heap;
    if p.is_null() {
        return p;
    }
    // SAFETY: fresh zeroed mapping large enough for a Heap; all-zero is a valid empty Heap
    // (null pointers, zero counters, unlocked bins).
    unsafe {
        (*p).id = NEXT_ID.fetch_add(1, Relaxed);
        (*p).node = node;
        (*p).mem_node = home(node);
        (*p).shared
            .pending
            .store(if FAST_SMALL.load(Relaxed) { 0 } else { SLOW }, Relaxed);
        (*p).class_off = granule_cs_offsets();
        for (cs, &size) in (*p).classes.iter_mut().zip(&SIZES[..NSMALL]) {
            cs.room.set(cache_max(size));
        }
        (*p).shared.claim.store(claimed as u32, Relaxed);
        (*p).shared.abandoned.store(!claimed, Relaxed);
        // SAFETY: `p` is a fresh heap in no list; its link is `all_next`.
        push_list(&ALL_HEAPS, p, p, |h| &raw mut (*h).all_next);
    }
    p
}

fn adopt_or_create(node: usize) -> *mut Heap {
    let ns = &NODES[node];
    if home(node) != node {
        memoryless_fallback(node);
    }
    ns.lock.lock();
    // SAFETY: node lock held.
    let inner = unsafe { &mut *ns.inner.get() };
    let h = inner.pool;
    if !h.is_null() {
        // SAFETY: pooled heaps are valid forever (heaps are never unmapped).
        inner.pool = unsafe { (*h).pool_next };
    }
    ns.lock.unlock();
    if h.is_null() {
        return create_heap(node, true);
    }
    // SAFETY: valid heap; a collector may hold its claim for a moment.
    unsafe {
        (*h).shared.claim_spinning();
        (*h).shared.abandoned.store(false, SeqCst);
        (*h).mismatch = 0;
    }
    h
}

/// Drains the recollection bins into the heap's superblocks.
///
/// # Safety
/// The caller holds `h`'s claim.
pub(super) unsafe fn drain(h: *mut Heap) {
    // SAFETY: `h` is a heap (heaps are never unmapped).
    let pending = unsafe { &(*h).shared.pending };
    // The SLOW bit never changes after the heap's creation: keep it, take the bins' bits.
    let mut mask = pending.swap(pending.load(Relaxed) & SLOW, AcqRel) & !SLOW;
    let mut n = 0u64;
    while mask != 0 {
        let i = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        // SAFETY: as above.
        let bin = unsafe { &(*h).bins[i] };
        // Acquire (both takes): pairs with the freers' release pushes, so the batches'
        // addresses and the chains' links are visible.
        let mut b = bin.batches.swap(null_mut(), Acquire);
        while !b.is_null() {
            // SAFETY: `b` is a batch taken out of `h`'s bin: its first `n` addresses are
            // starts of live blocks of `h`'s class runs, freed once; nothing else reads or
            // writes it until it is returned.
            unsafe {
                let next = (*b).next;
                let cnt = (*b).n as usize;
                // Last freed first, so that the first freed ends on top of its run's list and
                // is handed out first, as from a drained chain (last freed at its head): a
                // producer then gets its blocks back in the order it last used them, which
                // `bench/alloc/prodcons.cpp`'s consumer reads faster than the reverse order.
                for k in (0..cnt).rev() {
                    n += free_remote_block(h, *(*b).addrs.get_unchecked(k));
                }
                return_batch(b);
                b = next;
            }
        }
        let mut f = bin.head.swap(null_mut(), Acquire);
        while !f.is_null() {
            // SAFETY: `f` is a block freed into the bin (freed once): its first word is the link.
            let next = unsafe { (*f).next };
            // SAFETY: as above.
            n += unsafe { free_remote_block(h, f as usize) };
            f = next;
        }
    }
    // SAFETY: `h` is a heap whose claim the caller holds: the one writer of this counter.
    unsafe { bump(&(*h).st.remote_received, n) };
}

/// Frees a block taken out of a bin into its run; 1 if it was a block of a superblock (all
/// are), else 0.
///
/// # Safety
/// The caller holds `h`'s claim; `blk` is the start of a block of a class run of `h`, freed
/// once, in no list.
#[inline(always)]
unsafe fn free_remote_block(h: *mut Heap, blk: usize) -> u64 {
    if let Some((base, os::REGION_SUPERBLOCK)) = os::region(blk) {
        // SAFETY: a block in `h`'s bins is a live class block of a run of `h` (a run with
        // blocks in use stays `h`'s) in the superblock at `base`, freed once; the caller holds
        // `h`'s claim.
        unsafe { local_free(h, run_at(base, blk), blk) };
        1
    } else {
        0
    }
}

/// Drains an abandoned heap from whatever thread gets its claim; the last holder re-checks
/// after letting go so that no block stays in a bin.
///
/// # Safety
/// `h` is a heap from [`create_heap`] (heaps are never unmapped).
pub(super) unsafe fn collect(h: *mut Heap) {
    loop {
        // SAFETY: `h` is a heap (contract above).
        unsafe {
            if (*h).shared.pending.load(SeqCst) & !SLOW == 0 {
                return;
            }
            if !(*h).shared.try_claim() {
                return;
            }
        }
        // SAFETY: this thread has just taken `h`'s claim.
        unsafe { drain(h) };
        // SAFETY: `h` is a heap (contract above).
        unsafe { (*h).shared.release() };
    }
}

/// Hands a heap to its node's pool: called at thread exit and when a thread moves to another
/// node.
///
/// # Safety
/// The caller holds `h`'s claim and gives it up.
unsafe fn abandon(h: *mut Heap) {
    // SAFETY: the caller holds `h`'s claim.
    unsafe {
        flush_outbox(h);
        drain(h);
    }
    for c in 0..NCLASSES {
        // SAFETY: `h`'s class state and runs are changed only by its claim holder, the
        // caller; the cached blocks go back to their runs first, then the active run, no
        // longer active, is filed (it is in no list).
        unsafe {
            flush_cache(h, c);
            let a = (*h).classes[c].take_active();
            if !a.is_null() {
                file(h, a);
            }
        }
        // SAFETY: as above; the spare is an empty run of `h` in no list: it goes back to the
        // node, and nothing uses it any more.
        unsafe {
            let cs = &mut (*h).classes[c];
            let s = cs.spare;
            if !s.is_null() {
                cs.spare = null_mut();
                (*s).owner.store(null_mut(), Relaxed);
                node_free(s);
            }
        }
    }
    // SAFETY: `h` is a heap (never unmapped).
    let ns = unsafe {
        (*h).shared.abandoned.store(true, SeqCst);
        &NODES[(*h).node]
    };
    ns.lock.lock();
    // SAFETY: the node lock is held: the node's pool and the pool links of its heaps are
    // changed only under it.
    unsafe {
        let inner = &mut *ns.inner.get();
        (*h).pool_next = inner.pool;
        inner.pool = h;
    }
    ns.lock.unlock();
    // SAFETY: `h` is a heap; the caller gives up its claim here, then collects like any thread.
    unsafe {
        (*h).shared.release();
        collect(h);
    }
}

/// The pthread key's destructor: hands the exiting thread's heap to its node's pool.
///
/// # Safety
/// `arg` is null or the value this thread set for the key: its heap, whose claim it holds
/// (pthread calls it so at thread exit).
pub(super) unsafe extern "C" fn thread_exit(arg: *mut libc::c_void) {
    let h = arg as *mut Heap;
    if h.is_null() {
        return;
    }
    if tls_slot::get() == h {
        tls_slot::set(no_heap());
    }
    // SAFETY: the pthread value is this thread's heap, whose claim it holds.
    unsafe { abandon(h) };
}

/// What the heap slot of a thread without a heap points to: a [`Shared`] alone (the first
/// field of a [`Heap`]), whose pending mask keeps `malloc` off its fast path. Nothing else of
/// it is ever read, and it is never written.
#[repr(C, align(4096))]
pub(super) struct NoHeap(Shared);

pub(super) static NO_HEAP: NoHeap = NoHeap(Shared {
    pending: AtomicU64::new(SLOW),
    // Held for good: should a path ever try to claim it, it finds it taken.
    claim: AtomicU32::new(1),
    abandoned: AtomicBool::new(false),
});

/// [`NO_HEAP`] as a heap pointer (its `shared`, at offset 0, is all a reader may touch).
#[inline(always)]
pub(super) fn no_heap() -> *mut Heap {
    &raw const NO_HEAP as *mut Heap
}

/// The calling thread's heap, null when it has none.
#[inline]
pub(super) fn tls_heap() -> *mut Heap {
    let h = tls_slot::get();
    if h == no_heap() {
        null_mut()
    } else {
        h
    }
}

/// The calling thread's heap, or [`NO_HEAP`] when it has none: for the fast paths, which read
/// only its pending mask or compare its address.
#[inline(always)]
pub(super) fn tls_heap_or_none() -> *mut Heap {
    tls_slot::get()
}

fn set_thread_heap(h: *mut Heap) {
    tls_slot::set(h);
    let key = KEY.load(Relaxed);
    if key != u32::MAX {
        // SAFETY: key was created by pthread_key_create; the value is an opaque pointer.
        unsafe { libc::pthread_setspecific(key, h as *const libc::c_void) };
    }
}

#[cold]
fn thread_heap_slow() -> *mut Heap {
    ensure_init();
    let h = adopt_or_create(current_node());
    if !h.is_null() {
        set_thread_heap(h);
    }
    h
}

/// The calling thread's heap, following the thread when it is moved to another node: a thread
/// whose affinity is confined to one node switches at once; an unpinned thread switches after
/// 64 consecutive checks found it elsewhere (no ping-pong on short migrations).
///
/// # Safety
/// `h` is the calling thread's heap (whose claim it holds).
#[cold]
unsafe fn check_node(h: *mut Heap) -> *mut Heap {
    let n = current_node();
    // SAFETY: `mismatch` is written only by the claim holder, this thread.
    let confined = unsafe {
        (*h).mismatch += 1;
        (*h).mismatch == 1 && os::affinity_node(&nodemap().cpu_node) == Some(n)
    };
    // SAFETY: as above.
    if !confined && unsafe { (*h).mismatch } < 64 {
        return h;
    }
    let new = adopt_or_create(n);
    if new.is_null() {
        return h;
    }
    // SAFETY: this thread's heap, whose claim it gives up: from here it uses `new`.
    unsafe { abandon(h) };
    set_thread_heap(new);
    new
}

#[inline]
pub(super) fn heap() -> *mut Heap {
    let mut h = tls_heap();
    if h.is_null() {
        h = thread_heap_slow();
        if h.is_null() {
            return h;
        }
    }
    // On a multi-node machine every allocation compares the cpu's node with the heap's (the
    // cpu comes from rseq, a few ns), so a thread that was just pinned elsewhere gets memory
    // of its new node from its very next allocation.
    if MULTI_NODE.load(Relaxed) {
        // SAFETY: `h` is this thread's heap.
        unsafe {
            if current_node() != (*h).node {
                h = check_node(h);
            } else if (*h).mismatch != 0 {
                (*h).mismatch = 0; // back home: only consecutive checks elsewhere count
            }
        }
    }
    h
}
