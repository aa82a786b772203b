//! The engine's data structures: free-list links, span pools, the superblock header
//! ([`Segment`]), run descriptors ([`Run`]), large-block headers, spin locks, recollection bins,
//! heaps and per-node state, and the per-node state array [`NODES`].

use core::cell::UnsafeCell;
use core::ptr::null_mut;
use core::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};

use super::{NBINS, NGROUPS, UNIT};
use crate::classes::{GRANULES, MEDIUM_MAX, NCLASSES};
use crate::os::{self, MAX_NODES};

#[repr(C)]
pub(super) struct Free {
    pub(super) next: *mut Free,
}

/// Blocks of at least this many bytes (seed 003's medium range, 8 KiB..512 KiB) are spans of
/// their own, sized to the request in whole [`UNIT`]s (a 1 KiB step, finer than the seed's
/// 1.07 classes everywhere in that range), handed out by the node (see `alloc_block`).
///
/// Why (deviation from seed 003, which has 62 classes of 1.07 spacing there, each with
/// superblocks of its own): a thread holds few blocks of each of those classes, each class
/// keeps the pages of its own recent peak, and those peaks add up to far more than the peak
/// of the total. Measured with `loci bench alloc --quick` (`buffer-passing`, RSS over bytes
/// requested): 2.7x with a 10 MiB superblock per class, 2.4x with per-class runs of per-thread
/// superblocks, 1.6-1.8x with spans from 64 KiB up and 1.17-1.38x with spans from 8 KiB up
/// (4 KiB units; the benchmark then still drew half its blocks from 4..8 KiB). As spans that
/// coalesce when freed, memory freed at one size serves the next request of any size. The
/// 1.07 class table is still used for the few sizes between 7 KiB and 8 KiB.
pub const SPAN_MIN: usize = 8 * 1024;
/// Target bytes of a class run (rounded up to whole blocks and pages).
pub(super) const RUN_BYTES: usize = 64 * 1024;

/// Run states.
pub(super) const R_FREE: u32 = 0;
/// A class run whose blocks are all freed at their start (what `free`'s fast path takes).
pub(super) const R_CLASS: u32 = 1;
pub(super) const R_BLOCK: u32 = 2;
/// A class run that has handed out an aligned pointer inside a block (`memalign` and the
/// like pad a block and align into it): its frees find the block start by division, on
/// `free`'s slow path.
pub(super) const R_CLASS_ALIGNED: u32 = 3;
/// The tag bit of [`Run::owner`] for R_CLASS_ALIGNED runs (heaps are page aligned).
pub(super) const OWNER_ALIGNED: usize = 1;

/// The heap of class run `r` (its `owner` without the tag).
///
/// # Safety
/// `r` is a valid run descriptor.
#[inline]
pub(super) unsafe fn run_owner(r: *mut Run) -> *mut Heap {
    // SAFETY: `r` is valid (contract above).
    let o = unsafe { (*r).owner.load(Relaxed) };
    (o as usize & !OWNER_ALIGNED) as *mut Heap
}
pub(super) const NO_DESC: u32 = u32::MAX;
/// Span pools per node. A superblock's free spans belong to the pool of the heap that took
/// the superblock (heap id mod `NPOOLS`), and a heap takes spans from its own pool first,
/// then from a cached superblock, then from the other pools; fresh memory only after all of
/// those (see [`node_units`](super::spans::node_units)).
///
/// Why: with one pool, threads allocating at the same time got alternate spans of the same
/// superblocks, and when one thread's blocks were freed the holes lay between the other
/// thread's live blocks: `buffer-passing` (2 threads) touched one superblock more than the
/// live blocks needed in about 1 run in 5 (RSS 1.18x the bytes requested instead of 1.05x),
/// never with both threads on one cpu. Taking from the other pools before touching fresh
/// memory keeps the node's free memory shared (a span freed anywhere still serves any
/// request of the node), so RSS still follows the node's total, not the sum of per-thread
/// peaks.
pub(super) const NPOOLS: usize = 4;
/// Span bins: exact page counts 1..SPAN_BINS-1, the last bin for everything bigger.
pub(super) const SPAN_BINS: usize = MEDIUM_MAX / UNIT + 1;

/// Free spans by length (bin n: n units; the last bin: longer).
#[repr(C)]
pub(super) struct SpanBins {
    pub(super) spans: [*mut Run; SPAN_BINS],
    pub(super) bits: [u64; SPAN_BINS.div_ceil(64)],
}

/// Free spans of a node's superblocks, in two sets: `used` spans, whose pages may have been
/// written since the superblock was mapped (resident), and `fresh` ones, never handed out
/// since the mapping (no page faulted in). A request is served from `used` when any span
/// there fits, and touches fresh pages only otherwise.
///
/// Why: with one set, the untouched tail of the newest superblock and the freed spans of
/// the others shared the bins, and a request took whichever was listed last (often the
/// tail, whose remainder is listed again right after the cut), so RSS grew with fresh
/// pages while resident free memory sat idle. Memory held by a program is the pages it has
/// ever touched; serving from resident spans first keeps that set as small as the live
/// blocks allow.
#[repr(C)]
pub(super) struct SpanPool {
    pub(super) used: SpanBins,
    pub(super) fresh: SpanBins,
}

impl SpanBins {
    const EMPTY: SpanBins = SpanBins {
        spans: [null_mut(); SPAN_BINS],
        bits: [0; SPAN_BINS.div_ceil(64)],
    };
}

impl SpanPool {
    const EMPTY: SpanPool = SpanPool {
        used: SpanBins::EMPTY,
        fresh: SpanBins::EMPTY,
    };
}

/// Header of a superblock, at `os::header_of(base)` in its first page. The unit map (one u16
/// per [`UNIT`]: the descriptor of the run covering it, as its offset from the base in
/// 128-byte steps) starts at the second page, the run descriptors after it (at a multiple of
/// 128 bytes from the base), the data after them.
///
/// Deviation from seed 003 (where a superblock serves one class of one thread): superblocks
/// stay with their node and are carved into runs; a class's sub-allocator works on runs of
/// about 64 KiB instead of whole superblocks (occupancy order, LIFO lists and bump tails as the
/// seed has them), and an empty run goes back to the node for any class or thread. Why: with a
/// superblock per class and thread, each of ~90 classes kept the pages of its own peak
/// (`general`'s RSS 2.1x the bytes requested; 1.6x with runs), and a thread's hot blocks were
/// spread over ~90 regions 16 MiB apart. `general` spends most of its time in the benchmark's
/// own loads of random blocks, 1.2-1.5x longer than on mimalloc; the denser layout did not
/// measurably change that (no hardware counters on this VM to tell TLB from cache misses).
#[repr(C, align(64))]
pub(super) struct Segment {
    /// The node, first as in [`Large`] (see `node_of`).
    pub(super) node: u32,
    /// Units ([`UNIT`]) in the superblock; the first `data_unit` hold the header, the map
    /// and the descriptors.
    pub(super) nunits: u32,
    pub(super) data_unit: u32,
    /// Descriptors the superblock has room for.
    pub(super) max_desc: u32,
    /// Descriptors ever handed out (the next fresh index) and the free descriptor list.
    pub(super) desc_bump: u32,
    pub(super) desc_free: u32,
    pub(super) base: usize,
    /// The run descriptors (the unit map sits at `MAP_OFF` from the base; see
    /// `spans::map_get`).
    pub(super) descs: *mut Run,
    /// Node cache link.
    pub(super) next: *mut Segment,
    /// 1 once the superblock has been in the node's cache: its pages have been used (are
    /// resident), so its span is not a fresh one when it is formatted again.
    pub(super) resident: u32,
    /// The node's span pool its free spans belong to (set when it is formatted).
    pub(super) pool: u32,
}

/// A page run of a superblock: a class run (blocks of one class), one block, or free.
#[repr(C, align(64))]
pub(super) struct Run {
    // First cache line: everything a local free and an allocation touch.
    /// R_FREE, R_CLASS, R_CLASS_ALIGNED or R_BLOCK. Written by the owner of a class run (to
    /// R_CLASS_ALIGNED) and under the node lock; read by neighbours under the node lock.
    pub(super) state: AtomicU32,
    /// Frees the run takes before it changes occupancy group: `used - lo` (wrapping), where
    /// `used` is the blocks handed out and not yet freed back (remote frees count once
    /// drained; see `class_run::used`). A free that finds it 0 regroups the run, so a local
    /// free's whole bookkeeping is one decrement and its borrow.
    pub(super) avail: u32,
    /// Class run: 0..NGROUPS (listed in that group), or G_ACTIVE / G_FULL / G_SPARE.
    /// Free span: its span bin.
    pub(super) group: u32,
    /// Lowest `used` that still belongs to the current group; below it the run moves down
    /// (a free regroups it when `used` drops below `lo`, i.e. finds `avail` 0). 0 for the
    /// active run and the spare; for a full run, `capacity + 1` less its slack (see
    /// `set_state_group`).
    pub(super) lo: u32,
    /// The heap whose sub-allocator serves this class run (null for block and free spans),
    /// with [`OWNER_ALIGNED`] set once the run is R_CLASS_ALIGNED: then no heap's address
    /// equals it, so `free`'s fast path tells "a plain class block of my own" by this one
    /// comparison, without reading `state`. Read the heap with [`run_owner`].
    pub(super) owner: AtomicPtr<Heap>,
    /// LIFO list of freed blocks, linked through the blocks.
    pub(super) free: *mut Free,
    /// Next never-used block (bump <= end).
    pub(super) bump: usize,
    /// `end` = data + capacity * bsize.
    pub(super) end: usize,
    /// Block size (a class's, or a block run's whole units: at most `MEDIUM_MAX` rounded up).
    pub(super) bsize: u32,
    pub(super) class: u32,
    pub(super) capacity: u32,
    /// Class run: the byte offset in its heap of its class's [`ClassState`], so that a free
    /// finds the class's state without a multiplication.
    pub(super) cs_off: u32,
    // Second line: the rest.
    /// First block.
    pub(super) data: usize,
    pub(super) magic: u64,
    /// First unit (index in the superblock) and length in units.
    pub(super) first: u32,
    pub(super) nunits: u32,
    pub(super) seg: *mut Segment,
    /// Occupancy group list or span bin list.
    pub(super) prev: *mut Run,
    pub(super) next: *mut Run,
    /// Free descriptor list (descriptor index).
    pub(super) next_desc: u32,
    /// Free span: 1 when its pages were never handed out since the superblock was mapped
    /// (listed in `SpanPool::fresh`).
    pub(super) fresh: u32,
}

const _: () = assert!(core::mem::offset_of!(Run, cs_off) < 64);
const _: () = assert!(core::mem::offset_of!(Heap, shared) == 0);
const _: () = assert!(core::mem::offset_of!(ClassState, requested) + 8 <= 64);
const _: () = assert!(core::mem::size_of::<Segment>() <= os::HEADER_STEP);
const _: () = assert!(core::mem::size_of::<Run>() == 128);

/// Puts `r` at the head of the doubly linked list of runs whose head is `*head`.
///
/// # Safety
/// `head` and `r` are valid, `r` is in no list, and the caller is the one writer of that list
/// and its runs (it holds the heap's claim or the node's lock).
pub(super) unsafe fn list_push(head: *mut *mut Run, r: *mut Run) {
    // SAFETY: as for this function; the listed runs are valid.
    unsafe {
        (*r).prev = null_mut();
        (*r).next = *head;
        if !(*r).next.is_null() {
            (*(*r).next).prev = r;
        }
        *head = r;
    }
}

/// Takes `r` out of the doubly linked list of runs whose head is `*head`; its links are cleared.
///
/// # Safety
/// `head` and `r` are valid, `r` is in that list, and the caller is the one writer of the list
/// and its runs.
pub(super) unsafe fn list_unlink(head: *mut *mut Run, r: *mut Run) {
    // SAFETY: as for this function: `r`'s neighbours are runs of the same list.
    unsafe {
        if (*r).prev.is_null() {
            *head = (*r).next;
        } else {
            (*(*r).prev).next = (*r).next;
        }
        if !(*r).next.is_null() {
            (*(*r).next).prev = (*r).prev;
        }
        (*r).prev = null_mut();
        (*r).next = null_mut();
    }
}

#[repr(C)]
pub(super) struct Large {
    /// The node, first as in [`Segment`] (see `node_of`).
    pub(super) node: u32,
    pub(super) map_len: usize,
    pub(super) requested: usize,
}

/// Spin lock with a yield after a short spin (the machine may be oversubscribed).
pub(super) struct SpinLock(AtomicBool);

impl SpinLock {
    const fn new() -> Self {
        SpinLock(AtomicBool::new(false))
    }
    #[inline]
    pub(super) fn lock(&self) {
        let mut spins = 0u32;
        while self.0.swap(true, Acquire) {
            while self.0.load(Relaxed) {
                spins += 1;
                if spins < 64 {
                    core::hint::spin_loop();
                } else {
                    // SAFETY: no preconditions.
                    unsafe { libc::sched_yield() };
                }
            }
        }
    }
    #[inline]
    pub(super) fn unlock(&self) {
        self.0.store(false, Release);
    }
}

/// Pushes the list `first..=last` (linked through the field `next` returns) onto the take-all
/// stack `top`: `last` is linked to the old top and `first` published by a compare-and-swap.
/// Release: every write before the push (the links, the nodes' contents) is visible to whoever
/// takes the stack with an Acquire swap. A take-all stack has no ABA problem.
///
/// # Safety
/// `first..=last` is a list of live nodes in no stack; `next(last)` points at `last`'s link,
/// which is the caller's to write until the push publishes it.
#[inline(always)]
pub(super) unsafe fn push_list<T>(
    top: &AtomicPtr<T>,
    first: *mut T,
    last: *mut T,
    next: impl Fn(*mut T) -> *mut *mut T,
) {
    let mut cur = top.load(Relaxed);
    loop {
        // SAFETY: the caller's contract: `last`'s link is ours until the exchange below.
        unsafe { *next(last) = cur };
        match top.compare_exchange_weak(cur, first, Release, Relaxed) {
            Ok(_) => return,
            Err(now) => cur = now,
        }
    }
}

/// A recollection bin: a lock-free stack of blocks freed by other threads. Freers push with a
/// compare-and-swap; the owner takes the whole list with one swap (a take-all stack has no
/// ABA problem: nothing is ever popped singly).
/// Its `batches` stack holds [`Batch`]es the same way (the owner takes both at a drain).
#[repr(C, align(64))]
pub(super) struct Bin {
    /// Chains of blocks linked through their first words (frees by threads without a heap,
    /// and outboxes that found their heap's batch pool empty).
    pub(super) head: AtomicPtr<Free>,
    pub(super) batches: AtomicPtr<Batch>,
}

/// Addresses one [`Batch`] holds: one outbox's worth.
pub(super) const BATCH_CAP: usize = super::deallocate::OUTBOX_BLOCKS as usize;
/// Batches in a heap's pool (see the `deallocate` module comment): 144 KiB of address space,
/// whose pages are touched only as that many batches are out at once. A consumer that runs
/// while its producer is descheduled hands over an outbox per 64 blocks until the producer
/// allocates again: `bench/alloc/prodcons.cpp`'s bounded queue (32 batches of 64 messages of
/// a few blocks each) needs on the order of a hundred; 32 ran out there.
pub(super) const NBATCH: usize = 256;

/// An outbox handed over as the addresses of its blocks (see the `deallocate` module comment):
/// the owner reads them with independent loads instead of walking a chain of links that the
/// freeing core has just written. A batch lives in its `home` heap's pool and goes back there
/// once an owner has drained it. All zero is an unused batch.
#[repr(C, align(64))]
pub(super) struct Batch {
    /// The link while the batch is in a bin, in its home's `returned` stack or in its home's
    /// `batch_free` list (one at a time).
    pub(super) next: *mut Batch,
    /// The heap whose pool this batch is part of.
    pub(super) home: *mut Heap,
    /// Addresses in `addrs`.
    pub(super) n: u32,
    /// Starts of freed blocks of the owner's class runs, `n` of them.
    pub(super) addrs: [usize; BATCH_CAP],
}

/// The stack of a heap's batches that owners have drained and pushed back, on a cache line of
/// its own (draining threads push onto it; the home heap takes all with one swap).
#[repr(C, align(64))]
pub(super) struct Returned {
    pub(super) head: AtomicPtr<Batch>,
}

/// A heap's sub-allocator of one class. Two cache lines, aligned (120 bytes of fields): an
/// allocation or a free reads and writes only the first.
#[repr(C, align(64))]
pub(super) struct ClassState {
    pub(super) active: *mut Run,
    /// Blocks of this class handed out, and freed back to their runs or into the cache
    /// (local frees and drained remote ones), by this heap. Per class, next to `active`, so
    /// that an allocation bumps a counter on the line it reads anyway and the bytes of live
    /// blocks follow from the two counts (see [`stats`](fn@super::stats)) without a byte
    /// counter on either path.
    pub(super) allocs: AtomicU64,
    pub(super) frees: AtomicU64,
    /// The blocks of this class the owner thread freed last, newest first, linked through
    /// their first words: at most `cache_max` of them, handed out before anything else; their
    /// runs still count them in `used`. Written by the claim holder only (relaxed atomics:
    /// plain loads and stores). Emptied into the runs when the heap is abandoned
    /// ([`flush_cache`](super::class_run::flush_cache)).
    ///
    /// Why: `general` reads a block just before freeing it, so the block is in the cache; put
    /// back into its run's list it is handed out again only once that run is active, by then
    /// out of the cache (callgrind: 12% more last-level read misses). A cache of one block
    /// (before 2026-11-28) made both paths branch on whether it was empty, which under
    /// random alloc/free is a coin toss: half a mispredicted branch per operation, and 14% of
    /// `general`'s time on this machine (docs/alloc.md, "Class caches"). With room for several
    /// blocks the list is rarely empty when an allocation comes and rarely full when a free
    /// comes.
    pub(super) cache: AtomicPtr<Free>,
    /// Blocks `cache` can still take: [`cache_max`](super::class_run::cache_max) of the
    /// class's size minus those it holds, set when the heap is created (0 for the classes of
    /// spans, which never use it). Counted down, so that a free tests for room and takes it in
    /// one decrement whose borrow says "full". A `Cell` (only the claim holder reads or writes
    /// it, and no statistic does), so that the decrement is one instruction on memory.
    pub(super) room: core::cell::Cell<u32>,
    /// Bytes requested by this heap's allocations of this class (on the line an allocation
    /// touches anyway; blocks of other sizes count in [`HeapStats::requested`]).
    pub(super) requested: AtomicU64,
    /// One empty run kept back so that a class that drains and refills does not split and
    /// coalesce spans every time.
    pub(super) spare: *mut Run,
    pub(super) groups: [*mut Run; NGROUPS],
}

impl ClassState {
    /// Takes the active run out (null when there is none): the class has no active run after.
    pub(super) fn take_active(&mut self) -> *mut Run {
        core::mem::replace(&mut self.active, null_mut())
    }
}

#[repr(C)]
pub(super) struct HeapStats {
    /// Blocks of `SPAN_MIN` bytes or more handed out (class blocks: [`ClassState::allocs`]),
    /// and the bytes requested by them (class blocks: [`ClassState::requested`]).
    pub(super) allocs: AtomicU64,
    pub(super) requested: AtomicU64,
    pub(super) remote_sent: AtomicU64,
    pub(super) remote_received: AtomicU64,
}

#[repr(C, align(64))]
pub(super) struct Shared {
    /// Bit i < [`NBINS`]: bin i may hold blocks. Bit 63 ([`SLOW`](super::SLOW)): small
    /// blocks may not take the fast path of [`alloc`](super::alloc) (not
    /// [`FAST_SMALL`](super::config::FAST_SMALL)); set when the heap is created and kept for
    /// its life, so the fast path tests this one word instead of a flag too.
    pub(super) pending: AtomicU64,
    /// 1 while a thread holds the heap (its owner, an adopter, or a collector of an abandoned heap).
    pub(super) claim: AtomicU32,
    /// The owner thread is gone (or this is a node's shared heap): frees collect it themselves.
    pub(super) abandoned: AtomicBool,
}

impl Shared {
    /// Takes the heap's claim if no thread holds it.
    #[inline]
    pub(super) fn try_claim(&self) -> bool {
        self.claim.compare_exchange(0, 1, Acquire, Relaxed).is_ok()
    }

    /// Takes the heap's claim, spinning while another thread (a collector) holds it a moment.
    #[inline]
    pub(super) fn claim_spinning(&self) {
        while self
            .claim
            .compare_exchange_weak(0, 1, Acquire, Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
    }

    /// Gives the claim back.
    #[inline]
    pub(super) fn release(&self) {
        self.claim.store(0, SeqCst);
    }
}

/// A thread heap. `shared` comes first: a thread without a heap finds
/// [`NO_HEAP`](super::heap::NO_HEAP), a `Shared` alone, in its slot, and the fast path of
/// `malloc` reads only that.
#[repr(C)]
pub(super) struct Heap {
    pub(super) shared: Shared,
    pub(super) id: usize,
    pub(super) node: usize,
    /// The node whose memory this heap hands out: `node`, or the nearest node with memory
    /// when `node` has none.
    pub(super) mem_node: usize,
    pub(super) mismatch: u32,
    /// The byte offset in this heap of the small class state of each size, by `ceil(size /
    /// 16)` (the same in every heap; kept in the heap so that `malloc`'s fast path finds it
    /// from the heap pointer it holds, with no address of a table to form first).
    pub(super) class_off: [u16; GRANULES],
    pub(super) classes: [ClassState; NCLASSES],
    pub(super) st: HeapStats,
    pub(super) pool_next: *mut Heap,
    pub(super) all_next: *mut Heap,
    pub(super) bins: [Bin; NBINS],
    /// Blocks of another heap this thread has freed and not yet handed over.
    pub(super) outbox: Outbox,
    /// Batches of this heap's pool that are free to fill (claim holder only).
    pub(super) batch_free: *mut Batch,
    /// Batches of `batches` handed out at least once (taken in order before any is reused).
    pub(super) batch_fresh: u32,
    /// Batches drained by their owners and given back.
    pub(super) returned: Returned,
    /// The pool: every batch this heap fills is one of these.
    pub(super) batches: [Batch; NBATCH],
}

/// Frees of another heap's blocks, gathered by the freeing thread and handed to the owner's
/// bin as one batch or chain (one compare-and-swap and one pending-mask update per chain, not per
/// block: a producer/consumer pair otherwise trades two contended cache lines on every free).
/// Written only by the heap's claim holder; all zero is empty. Handed over when it holds
/// [`OUTBOX_BLOCKS`](super::deallocate::OUTBOX_BLOCKS) blocks or
/// [`OUTBOX_BYTES`](super::deallocate::OUTBOX_BYTES) bytes, when a block of another owner
/// comes, when the thread refills a run of its own, and when its heap is abandoned.
pub(super) struct Outbox {
    /// The heap every block here belongs to (null when empty).
    pub(super) owner: *mut Heap,
    /// The batch the blocks' addresses go into (taken from the pool with the first block);
    /// null: the pool was empty, and the blocks form the chain `head..tail` instead.
    pub(super) batch: *mut Batch,
    pub(super) head: *mut Free,
    pub(super) tail: *mut Free,
    pub(super) count: u32,
    pub(super) bytes: u32,
}

pub(super) struct NodeInner {
    pub(super) cache: *mut Segment,
    pub(super) cached: usize,
    pub(super) pool: *mut Heap,
    pub(super) shared_heap: *mut Heap,
    /// Free spans of the node's superblocks, one pool per group of heaps (see [`NPOOLS`]).
    pub(super) spans: [SpanPool; NPOOLS],
}

#[repr(C, align(64))]
pub(super) struct NodeState {
    pub(super) lock: SpinLock,
    /// Held by the one thread that maps a new superblock for the node (see
    /// [`node_units`](super::spans::node_units)).
    pub(super) grow: SpinLock,
    pub(super) inner: UnsafeCell<NodeInner>,
    pub(super) os_bytes: AtomicU64,
    pub(super) sb_total: AtomicU64,
    pub(super) sb_cached: AtomicU64,
    pub(super) large_bytes: AtomicU64,
    pub(super) large_count: AtomicU64,
    pub(super) large_requested: AtomicU64,
    pub(super) mbind_failures: AtomicU64,
    /// Blocks of `SPAN_MIN` bytes or more: frees, and bytes of the live ones (pages).
    pub(super) block_frees: AtomicU64,
    pub(super) block_live: AtomicI64,
    /// Bytes of free spans' pages given back to the OS (see `purge_resident`).
    pub(super) purged: AtomicU64,
    /// Thread heaps started on this node while it has no memory.
    pub(super) fallback_heaps: AtomicU64,
}

// SAFETY: `inner` is only touched with `lock` held; everything else is atomic.
unsafe impl Sync for NodeState {}

pub(super) static NODES: [NodeState; MAX_NODES] = [const {
    NodeState {
        lock: SpinLock::new(),
        grow: SpinLock::new(),
        inner: UnsafeCell::new(NodeInner {
            cache: null_mut(),
            cached: 0,
            pool: null_mut(),
            shared_heap: null_mut(),
            spans: [const { SpanPool::EMPTY }; NPOOLS],
        }),
        os_bytes: AtomicU64::new(0),
        sb_total: AtomicU64::new(0),
        sb_cached: AtomicU64::new(0),
        large_bytes: AtomicU64::new(0),
        large_count: AtomicU64::new(0),
        large_requested: AtomicU64::new(0),
        mbind_failures: AtomicU64::new(0),
        block_frees: AtomicU64::new(0),
        block_live: AtomicI64::new(0),
        purged: AtomicU64::new(0),
        fallback_heaps: AtomicU64::new(0),
    }
}; MAX_NODES];
