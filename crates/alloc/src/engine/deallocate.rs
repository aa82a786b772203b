//! The free paths: [`free`] with its call-free fast path (a class block of the calling
//! thread's own run, freed at its start) and everything else ([`free_full`]: foreign, large,
//! span and aligned blocks, and frees of another thread's blocks, which gather in the freeing
//! thread's outbox and go to the owner's recollection bin an outbox at a time or, when the
//! owner has exited, straight into its run).
//!
//! An outbox reaches the owner as a [`Batch`]: an array of the blocks' addresses, not a chain
//! linked through the blocks. Walking a chain costs the owner one dependent cache miss per
//! block (each link was just written on the freeing core, and the next address is known only
//! once it arrives); with an array the addresses arrive a cache line of eight at a time, the
//! runs follow from them by address arithmetic over owner-local maps, and the owner's stores
//! into the blocks (its own free-list links) do not wait on one another.
//!
//! Where batches live: each heap has a fixed pool of [`NBATCH`] batches inside its own mapping.
//! The freeing thread fills one of its own; the owner, after draining it, pushes it back onto
//! its home heap's `returned` stack (lock-free push, take-all swap by the home's claim
//! holder). So handing over never calls the allocator (no recursion, no lock), and the memory
//! for addresses is bounded per heap. A home heap that has exited keeps its batches with its
//! heap, which the next adopter uses. When the pool is empty (its batches wait in bins of
//! owners that have not allocated since), the outbox falls back to the chain through the
//! blocks, as do frees by threads without a heap (one block straight into a bin): correct, only
//! slower to drain. Storing the array inside one of the freed blocks instead would fail for
//! the small blocks that dominate cross-thread frees (a 16-byte block holds one address).

use core::ptr::null_mut;
use core::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, SeqCst},
};

use super::blocks::{free_block, free_large};
use super::class_run::{block_start, cache_push, local_free, run_class_state, run_free};
use super::heap::{collect, tls_heap, tls_heap_or_none};
use super::spans::run_at;
use super::structs::{push_list, run_owner, Batch, Free, Heap, Outbox, Run, NBATCH, R_BLOCK};
use super::{__libc_free, bump, NBINS};
use crate::os;

/// Frees of another thread's blocks by threads that have no heap (counted in
/// [`AllocStats::cross_thread_frees`](super::AllocStats::cross_thread_frees) with the heaps' own).
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
    // Null and foreign pointers fail the region check. From the pointer to its run: the
    // region map's byte (a superblock's block?) and the unit map's entry, which names the
    // run's descriptor by its offset from the superblock's base; no header is read.
    if let Some((base, kind)) = os::region(p as usize) {
        if kind == os::REGION_SUPERBLOCK {
            // SAFETY: the region is a live superblock at `base`, and the live block `p` lies
            // in one of its runs in use.
            let r = unsafe { run_at(base, p as usize) };
            let h = tls_heap_or_none();
            // SAFETY: `r` is the run of the live block `p`. Its owner equals this thread's
            // heap only for an R_CLASS run of that heap: block runs have none, and an
            // R_CLASS_ALIGNED run's carries the tag (`Run::owner`). A thread without a heap
            // (`h` is NO_HEAP) fails this test too.
            if unsafe { (*r).owner.load(Relaxed) } == h {
                // A cache with room takes the block instead of its run (see
                // `ClassState::cache`), which keeps counting it.
                // SAFETY: `r` is a class run of this thread's heap `h`, whose claim it
                // holds (so it is the one writer of the class's cache and counters, found
                // through `r`'s `cs_off`); `p` is the block's start, freed once (its first
                // word: the link); a run whose `used` drops below its `lo` is neither active
                // nor the spare.
                unsafe {
                    let cs = run_class_state(h, r);
                    bump(&cs.frees, 1);
                    if !cache_push(cs, p as *mut Free) {
                        run_free(h, r, p as usize);
                    }
                }
                return;
            }
        }
    }
    // SAFETY: forwarded contract.
    unsafe { free_full(p) }
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
    let Some((base, kind)) = os::region(p as usize) else {
        // SAFETY: not in a region of ours: a live block of the system allocator, freed once.
        unsafe { __libc_free(p) };
        return;
    };
    if kind == os::REGION_LARGE {
        // SAFETY: a live large block (`p` in its region), freed once.
        unsafe { free_large(base) };
        return;
    }
    // SAFETY: not large, the region is a superblock at `base`, and the live block `p` lies in
    // one of its runs in use.
    let r = unsafe { run_at(base, p as usize) };
    // SAFETY: `r` is the run of the live block `p`.
    if unsafe { (*r).state.load(Relaxed) } == R_BLOCK {
        // SAFETY: the run of a live block of its own, freed once.
        unsafe { free_block(r) };
        return;
    }
    // SAFETY: `r` is the class run of the live block `p`.
    let blk = unsafe { block_start(r, p as usize) };
    let h = tls_heap();
    // SAFETY: as above.
    let owner = unsafe { run_owner(r) };
    if owner == h && !h.is_null() {
        // SAFETY: `r` is a run of this thread's heap `h`, whose claim it holds; `blk` is the
        // start of the live block, freed once.
        unsafe { local_free(h, r, blk) };
    } else {
        // SAFETY: `h` is null or this thread's heap; `owner` is the heap of the class run `r`
        // (not null while it has a live block); `blk` is that block's start, freed once.
        unsafe { remote_free(h, owner, r, blk) };
    }
}

/// Blocks an outbox holds before it is handed over (see [`Outbox`]).
pub(super) const OUTBOX_BLOCKS: u32 = 64;
/// Bytes an outbox holds before it is handed over: with class blocks below 8 KiB, at most
/// this plus one block stays out of the owner's reach while the freeing thread is idle.
pub(super) const OUTBOX_BYTES: u32 = 64 << 10;

/// Frees a block of another thread's heap (or of an abandoned or shared heap): into its run
/// when the claim of `owner` is free to take and `owner` is abandoned, else into this
/// thread's outbox (a thread without a heap: straight into a bin).
///
/// # Safety
/// `h` is null or the calling thread's heap; `owner` is the heap of class run `r` (not the
/// caller's); `blk` is the start of a live block of `r`, freed once.
#[cold]
unsafe fn remote_free(h: *mut Heap, owner: *mut Heap, r: *mut Run, blk: usize) {
    if h.is_null() {
        ORPHAN_REMOTE.fetch_add(1, Relaxed);
    } else {
        // SAFETY: this thread's heap: the claim holder is the counter's one writer.
        unsafe { bump(&(*h).st.remote_sent, 1) };
    }
    // The owner thread is gone (or `owner` is a node's shared heap): whoever holds the claim
    // may work on its runs, so the freeing thread takes the claim and frees the block into its
    // run directly, instead of putting it in a bin that it would then drain itself. Frees of
    // blocks left by exited threads (a consumer freeing what finished producers allocated;
    // `general`'s main thread freeing the workers' last blocks) cost a claim instead of a bin
    // push and take, an atomic read-modify-write of the pending mask and a drain each. If the
    // claim is taken (an adopter, another collector), the block goes to a bin as below.
    // SAFETY: `owner` is a heap (heaps are never unmapped).
    if unsafe { (*owner).shared.abandoned.load(Acquire) && (*owner).shared.try_claim() } {
        // SAFETY: the claim is held; the block is live, so its run (used >= 1) cannot have
        // left `owner`.
        unsafe {
            local_free(owner, r, blk);
            (*owner).shared.release();
            collect(owner);
        }
        return;
    }
    let f = blk as *mut Free;
    if h.is_null() {
        // SAFETY: `owner` is a heap; `f` is a freed block, linked to nothing else.
        unsafe { hand_over(owner, NBINS - 1, f, f) };
        return;
    }
    // SAFETY: `h` is this thread's heap, whose claim it holds: the outbox's one writer and
    // its pool's. The block is freed once: its address may go into the batch, or its first
    // word hold the chain's link; `r` is its run.
    unsafe {
        let ob = &mut (*h).outbox;
        if ob.owner != owner {
            flush_outbox(h);
            ob.owner = owner;
            ob.batch = take_batch(h);
        }
        let b = ob.batch;
        if !b.is_null() {
            debug_assert!((ob.count as usize) < (*b).addrs.len());
            *(*b).addrs.get_unchecked_mut(ob.count as usize) = blk;
        } else {
            (*f).next = ob.head;
            if ob.head.is_null() {
                ob.tail = f;
            }
            ob.head = f;
        }
        ob.count += 1;
        ob.bytes += (*r).bsize;
        if ob.count >= OUTBOX_BLOCKS || ob.bytes >= OUTBOX_BYTES {
            flush_outbox(h);
        }
    }
}

/// A batch of `h`'s pool to fill (its `n` unset), or null when every batch is out.
///
/// # Safety
/// `h` is a heap whose claim the caller holds.
unsafe fn take_batch(h: *mut Heap) -> *mut Batch {
    // SAFETY: the claim holder is the one user of the pool's free list and fresh count, and
    // the one taker of `returned`; batches in the free list belong to `h`.
    unsafe {
        let mut b = (*h).batch_free;
        if b.is_null() {
            // Acquire: pairs with the drainers' release pushes, so their reads of the batches'
            // addresses are done before this thread writes new ones.
            b = (*h).returned.head.swap(null_mut(), Acquire);
            if b.is_null() {
                let i = (*h).batch_fresh as usize;
                if i == NBATCH {
                    return null_mut();
                }
                (*h).batch_fresh += 1;
                let b = &raw mut (*h).batches[i];
                (*b).home = h;
                return b;
            }
        }
        (*h).batch_free = (*b).next;
        b
    }
}

/// Gives a drained batch back to its home heap's pool.
///
/// # Safety
/// `b` is a batch taken out of a bin, no longer read or written by the caller.
pub(super) unsafe fn return_batch(b: *mut Batch) {
    // SAFETY: `b` is a batch of the pool of `home` (a heap: never unmapped); once pushed it is
    // the home's again.
    // Release (in the push): the caller's reads of the batch happen before its home refills it.
    unsafe {
        // SAFETY: `b` is a live batch; the link is its `next`.
        push_list(&(*(*b).home).returned.head, b, b, |x| &raw mut (*x).next)
    }
}

/// Hands this thread's outbox (if any) to its owner's bin.
///
/// # Safety
/// `h` is the calling thread's heap, whose claim it holds.
pub(super) unsafe fn flush_outbox(h: *mut Heap) {
    // SAFETY: the claim holder is the outbox's one writer (contract above).
    let ob = unsafe { &mut (*h).outbox };
    if ob.count == 0 {
        return;
    }
    let (owner, batch, head, tail, count) = (ob.owner, ob.batch, ob.head, ob.tail, ob.count);
    *ob = Outbox {
        owner: null_mut(),
        batch: null_mut(),
        head: null_mut(),
        tail: null_mut(),
        count: 0,
        bytes: 0,
    };
    // SAFETY: `h` is a heap.
    let i = unsafe { (*h).id } % NBINS;
    if batch.is_null() {
        // SAFETY: `owner` is the heap of every block in the chain `head..tail` (freed once
        // each, linked only here).
        unsafe { hand_over(owner, i, head, tail) };
    } else {
        // SAFETY: the batch holds `count` addresses of freed blocks of `owner`, in no other
        // list; the outbox no longer refers to it.
        unsafe {
            (*batch).n = count;
            hand_over_batch(owner, i, batch);
        }
    }
}

/// Pushes the chain of freed blocks `head..tail` (linked through their first words) onto bin
/// `i` of `owner`, marks the bin pending, and collects `owner` if its thread is gone.
///
/// # Safety
/// `owner` is a heap, `i < NBINS`; the chain's blocks are blocks of `owner`'s class runs,
/// freed once, in no other list; `tail` is the chain's last block.
unsafe fn hand_over(owner: *mut Heap, i: usize, head: *mut Free, tail: *mut Free) {
    // SAFETY: `owner` is a heap.
    let bin = unsafe { &(*owner).bins[i] };
    // SAFETY: the chain is in no list until the push publishes it, so its tail's link (a freed
    // block's first word) is ours to write; the links and the blocks' last writes are visible
    // to the owner's take.
    unsafe { push_list(&bin.head, head, tail, |f| &raw mut (*f).next) };
    // SAFETY: `owner` is a heap, `i < NBINS`.
    unsafe { mark_pending(owner, i) };
}

/// Pushes batch `b` (its `n` set) onto bin `i` of `owner`, marks the bin pending, and collects
/// `owner` if its thread is gone.
///
/// # Safety
/// `owner` is a heap, `i < NBINS`; `b`'s `n` addresses are starts of blocks of `owner`'s
/// class runs, freed once, in no other list; `b` is in no list.
unsafe fn hand_over_batch(owner: *mut Heap, i: usize, b: *mut Batch) {
    // SAFETY: `owner` is a heap.
    let bin = unsafe { &(*owner).bins[i] };
    // SAFETY: the batch is in no list until the push publishes it; its addresses (and the
    // blocks' last writes) are visible to the owner's take.
    unsafe { push_list(&bin.batches, b, b, |x| &raw mut (*x).next) };
    // SAFETY: `owner` is a heap, `i < NBINS`.
    unsafe { mark_pending(owner, i) };
}

/// After a push onto bin `i` of `owner`: marks the bin pending, and collects `owner` if its
/// thread is gone (the bit is set before `abandoned` is read, and `abandon` sets `abandoned`
/// before its last `collect` reads the mask: one of the two sees the other).
///
/// # Safety
/// `owner` is a heap, `i < NBINS`.
unsafe fn mark_pending(owner: *mut Heap, i: usize) {
    // SAFETY: `owner` is a heap.
    unsafe {
        (*owner).shared.pending.fetch_or(1 << i, SeqCst);
        if (*owner).shared.abandoned.load(SeqCst) {
            collect(owner);
        }
    }
}
