//! The free paths: [`free`] with its call-free fast path (a class block of the calling
//! thread's own run, freed at its start) and everything else ([`free_full`]: foreign, large,
//! span and aligned blocks, and frees of another thread's blocks, which go to the owner's
//! recollection bin or, when the owner has exited, straight into its run).

use core::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, SeqCst},
};

use super::blocks::{free_block, free_large};
use super::class_run::{block_start, class_state, local_free, regroup};
use super::heap::{collect, tls_heap};
use super::spans::{run_at, run_of};
use super::structs::{Free, Heap, Run, Segment, R_BLOCK, R_CLASS};
use super::{__libc_free, bump, KIND_LARGE, NBINS};
use crate::os;

/// Frees of another thread's blocks by threads that have no heap (counted in
/// [`Stats::cross_thread_frees`](super::Stats::cross_thread_frees) with the heaps' own).
pub(super) static ORPHAN_REMOTE: AtomicU64 = AtomicU64::new(0);

/// Frees a block of this allocator or of the system allocator (small blocks when delegated).
///
/// # Safety
/// `p` is null or a live block from [`alloc`](super::alloc) / the system allocator, freed once.
#[inline(always)]
pub unsafe fn free(p: *mut u8) {
    // Fast path, calls only in tail position (no saved registers): a block of a class run
    // owned by this thread, freed at its start (state R_CLASS: the run never handed out an
    // aligned pointer inside a block, so `p` is the block and no division finds its start).
    // Null and foreign pointers fail the region check.
    if let Some((base, hdr)) = os::region_and_header(p as usize) {
        if *(hdr as *const u32) != KIND_LARGE {
            let r = run_at(hdr as *mut Segment, base, p as usize);
            if (*r).state.load(Relaxed) == R_CLASS {
                let h = tls_heap();
                if !h.is_null() && (*r).owner.load(Relaxed) == h {
                    let f = p as *mut Free;
                    (*f).next = (*r).free;
                    (*r).free = f;
                    (*r).used -= 1;
                    bump(&class_state(h, (*r).class as usize).frees, 1);
                    if (*r).used < (*r).lo {
                        regroup(h, r);
                    }
                    return;
                }
            }
        }
    }
    free_full(p)
}

/// Every free the fast path of [`free`] does not take (`extern "C"` for the reason given at
/// [`alloc_full`](super::alloc_full)).
///
/// # Safety
/// As for [`free`].
#[inline(never)]
pub unsafe extern "C" fn free_full(p: *mut u8) {
    if p.is_null() {
        return;
    }
    let Some((base, hdr)) = os::region_and_header(p as usize) else {
        __libc_free(p);
        return;
    };
    if *(hdr as *const u32) == KIND_LARGE {
        free_large(base);
        return;
    }
    let seg = hdr as *mut Segment;
    let r = run_of(seg, p as usize);
    if (*r).state.load(Relaxed) == R_BLOCK {
        free_block(r);
        return;
    }
    let blk = block_start(r, p as usize);
    let h = tls_heap();
    let owner = (*r).owner.load(Relaxed);
    if owner == h && !h.is_null() {
        local_free(h, r, blk);
    } else {
        remote_free(h, owner, r, blk);
    }
}

#[cold]
unsafe fn remote_free(h: *mut Heap, owner: *mut Heap, r: *mut Run, blk: usize) {
    if h.is_null() {
        ORPHAN_REMOTE.fetch_add(1, Relaxed);
    } else {
        bump(&(*h).st.remote_sent, 1);
    }
    // The owner thread is gone (or `owner` is a node's shared heap): whoever holds the claim
    // may work on its runs, so the freeing thread takes the claim and frees the block into its
    // run directly, instead of putting it in a bin that it would then drain itself. Frees of
    // blocks left by exited threads (a consumer freeing what finished producers allocated;
    // `general`'s main thread freeing the workers' last blocks) cost a claim instead of two
    // bin locks, two atomic read-modify-writes and a drain each. If the claim is taken (an
    // adopter, another collector), the block goes to a bin as below.
    if (*owner).shared.abandoned.load(Acquire)
        && (*owner)
            .shared
            .claim
            .compare_exchange(0, 1, Acquire, Relaxed)
            .is_ok()
    {
        // SAFETY (of the calls): the claim is held; the block is live, so its run (used >= 1)
        // cannot have left `owner`.
        local_free(owner, r, blk);
        (*owner).shared.claim.store(0, SeqCst);
        collect(owner);
        return;
    }
    let i = if h.is_null() {
        NBINS - 1
    } else {
        (*h).id % NBINS
    };
    let bin = &(*owner).bins[i];
    let f = blk as *mut Free;
    bin.lock.lock();
    (*f).next = *bin.head.get();
    *bin.head.get() = f;
    bin.lock.unlock();
    (*owner).shared.pending.fetch_or(1 << i, SeqCst);
    if (*owner).shared.abandoned.load(SeqCst) {
        collect(owner);
    }
}
