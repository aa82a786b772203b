//! The allocator engine (seed 003, section 5).
//!
//! Glossary and invariants:
//! * **region**: an allocator mapping whose start is aligned to the region alignment and marked
//!   in the region map ([`os::region_of`]); its first page holds a header
//!   (at `os::header_of(base)`) whose first word is its kind.
//! * **superblock**: a region of `superblock size` bytes (10 MiB by default), mapped and bound
//!   to one node with `mbind`; its node never changes. It is carved into **runs** (spans of
//!   whole 1 KiB units): a unit map in its header names the run of every unit.
//! * **run**: a class run (blocks of one class below 8 KiB, about 64 KiB of them, served by one
//!   heap's sub-allocator), a block run (one block of 8 KiB or more, see `SPAN_MIN`), or a
//!   free span. Free spans coalesce with free neighbours; a superblock whose runs are all free
//!   goes to its node's cache.
//! * **heap**: the local allocator of one thread (seed 003's "local memory allocator"): one
//!   sub-allocator ([`ClassState`]) per class, 64 recollection bins, counters. A heap serves one
//!   node. Exactly one thread holds a heap's `claim` at a time, and only it touches the heap's
//!   owner-side fields and the fields of its class runs that change; everything else goes
//!   through the bins.
//! * **recollection bin**: the list of blocks other threads freed into a heap, behind a spin
//!   lock; bin `i` takes the frees of threads whose heap id is `i mod 64` (a private bin per
//!   (owner, freer) pair up to 64 threads; beyond that pairs share bins, still correct).
//! * **node pool**: per node, the free spans of its superblocks, the superblock cache (LIFO,
//!   bounded), the heaps of exited threads (adopted by the next thread that starts on the
//!   node), and one shared heap for [`alloc_on`] requests from threads of other nodes. One spin
//!   lock per node.
//!
//! Sub-allocator (per class, per heap): the *active* run serves allocations until it is full;
//! then the most occupied run that has room becomes active, else a new run comes from the
//! node. Occupancy order is kept in 8 groups of 1/8 occupancy each (Hoard's fullness groups):
//! O(1) per free instead of a priority queue, and within a group the most recently freed-into
//! run comes first. Free blocks of a run form a LIFO list through the blocks themselves;
//! never-used blocks are handed out by a bump pointer. An empty run is kept as the class's
//! spare (one) or given back to the node.

use core::cell::UnsafeCell;
use core::ptr::null_mut;
use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    Ordering::*,
};

use crate::classes::{
    class_of, magic, small_class_of, LINE, MEDIUM_MAX, NCLASSES, SIZES, SMALL_MAX,
};
use crate::os::{self, NodeMap, MAX_CPUS, MAX_NODES};

const KIND_SB: u32 = 0x10c1_5b01;
const KIND_LARGE: u32 = 0x10c1_5b02;
const NGROUPS: usize = 8;
const NBINS: usize = 64;
const G_ACTIVE: u32 = 100;
const G_FULL: u32 = 101;
const G_SPARE: u32 = 102;
const PAGE: usize = 4096;
/// Granule of runs and spans: 1 KiB, not a page. Rounding blocks of 8..32 KiB up to whole
/// pages wasted 5% of `buffer-passing`'s bytes (up to 17% of a 9 KiB block); with 1 KiB units
/// neighbours share their boundary pages instead.
const UNIT: usize = 1024;
/// Default superblock size (seed 003 used 10 MB).
pub const DEFAULT_SUPERBLOCK: usize = 10 << 20;
/// Default number of released superblocks each node keeps mapped for reuse.
pub const DEFAULT_CACHE: usize = 8;

extern "C" {
    // glibc's own allocator under its internal names: the delegate for small blocks. Calling
    // these (not `malloc`) keeps the delegate correct when this code is the process's `malloc`.
    fn __libc_malloc(size: usize) -> *mut u8;
    fn __libc_free(p: *mut u8);
    fn __libc_calloc(n: usize, size: usize) -> *mut u8;
    fn __libc_realloc(p: *mut u8, size: usize) -> *mut u8;
    fn __libc_memalign(align: usize, size: usize) -> *mut u8;
}

// ---------------------------------------------------------------------------------------------
// Data structures

#[repr(C)]
struct Free {
    next: *mut Free,
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
const RUN_BYTES: usize = 64 * 1024;

/// Run states.
const R_FREE: u32 = 0;
/// A class run whose blocks are all freed at their start (what `free`'s fast path takes).
const R_CLASS: u32 = 1;
const R_BLOCK: u32 = 2;
/// A class run that has handed out an aligned pointer inside a block (`memalign` and the
/// like pad a block and align into it): its frees find the block start by division, on
/// `free`'s slow path.
const R_CLASS_ALIGNED: u32 = 3;
const NO_DESC: u32 = u32::MAX;
/// Span pools per node. A superblock's free spans belong to the pool of the heap that took
/// the superblock (heap id mod `NPOOLS`), and a heap takes spans from its own pool first,
/// then from a cached superblock, then from the other pools; fresh memory only after all of
/// those (see [`node_units`]).
///
/// Why: with one pool, threads allocating at the same time got alternate spans of the same
/// superblocks, and when one thread's blocks were freed the holes lay between the other
/// thread's live blocks: `buffer-passing` (2 threads) touched one superblock more than the
/// live blocks needed in about 1 run in 5 (RSS 1.18x the bytes requested instead of 1.05x),
/// never with both threads on one cpu. Taking from the other pools before touching fresh
/// memory keeps the node's free memory shared (a span freed anywhere still serves any
/// request of the node), so RSS still follows the node's total, not the sum of per-thread
/// peaks.
const NPOOLS: usize = 4;
/// Span bins: exact page counts 1..SPAN_BINS-1, the last bin for everything bigger.
const SPAN_BINS: usize = MEDIUM_MAX / UNIT + 1;

/// Free spans by length (bin n: n units; the last bin: longer).
#[repr(C)]
struct SpanBins {
    spans: [*mut Run; SPAN_BINS],
    bits: [u64; SPAN_BINS.div_ceil(64)],
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
struct SpanPool {
    used: SpanBins,
    fresh: SpanBins,
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
/// per [`UNIT`]: the descriptor of the run covering it) starts at the second page, the run
/// descriptors after it, the data after them.
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
struct Segment {
    kind: u32,
    node: u32,
    /// Units ([`UNIT`]) in the superblock; the first `data_unit` hold the header, the map
    /// and the descriptors.
    nunits: u32,
    data_unit: u32,
    /// Descriptors the superblock has room for.
    max_desc: u32,
    /// Descriptors ever handed out (the next fresh index) and the free descriptor list.
    desc_bump: u32,
    desc_free: u32,
    base: usize,
    map: *mut u16,
    descs: *mut Run,
    /// Node cache link.
    next: *mut Segment,
    /// 1 once the superblock has been in the node's cache: its pages have been used (are
    /// resident), so its span is not a fresh one when it is formatted again.
    resident: u32,
    /// The node's span pool its free spans belong to (set when it is formatted).
    pool: u32,
}

/// A page run of a superblock: a class run (blocks of one class), one block, or free.
#[repr(C, align(64))]
struct Run {
    // First cache line: everything a local free and an allocation touch.
    /// R_FREE, R_CLASS, R_CLASS_ALIGNED or R_BLOCK. Written by the owner of a class run (to
    /// R_CLASS_ALIGNED) and under the node lock; read by neighbours under the node lock.
    state: AtomicU32,
    /// Blocks handed out and not yet freed back (remote frees count once drained).
    used: u32,
    /// Class run: 0..NGROUPS (listed in that group), or G_ACTIVE / G_FULL / G_SPARE.
    /// Free span: its span bin.
    group: u32,
    /// Lowest `used` that still belongs to the current group; below it the run moves down
    /// (a free calls `regroup` when `used < lo`). 0 for the active run and the spare,
    /// `u32::MAX` for a full run (see `set_state_group`).
    lo: u32,
    /// The heap whose sub-allocator serves this class run (null for block and free spans).
    owner: AtomicPtr<Heap>,
    /// LIFO list of freed blocks, linked through the blocks.
    free: *mut Free,
    /// Next never-used block (bump <= end).
    bump: usize,
    /// `end` = data + capacity * bsize.
    end: usize,
    bsize: usize,
    class: u32,
    capacity: u32,
    // Second line: the rest.
    /// First block.
    data: usize,
    magic: u64,
    /// First unit (index in the superblock) and length in units.
    first: u32,
    nunits: u32,
    seg: *mut Segment,
    /// Occupancy group list or span bin list.
    prev: *mut Run,
    next: *mut Run,
    /// Free descriptor list (descriptor index).
    next_desc: u32,
    /// Free span: 1 when its pages were never handed out since the superblock was mapped
    /// (listed in `SpanPool::fresh`).
    fresh: u32,
}

const _: () = assert!(core::mem::offset_of!(Run, capacity) < 64);
const _: () = assert!(core::mem::size_of::<Segment>() <= os::HEADER_STEP);
const _: () = assert!(core::mem::size_of::<Run>() == 128);

#[repr(C)]
struct Large {
    kind: u32,
    node: u32,
    map_len: usize,
    requested: usize,
}

/// Spin lock with a yield after a short spin (the machine may be oversubscribed).
struct SpinLock(AtomicBool);

impl SpinLock {
    const fn new() -> Self {
        SpinLock(AtomicBool::new(false))
    }
    #[inline]
    fn lock(&self) {
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
    fn unlock(&self) {
        self.0.store(false, Release);
    }
}

#[repr(C, align(64))]
struct Bin {
    lock: SpinLock,
    head: UnsafeCell<*mut Free>,
}

#[repr(C)]
struct ClassState {
    active: *mut Run,
    /// Blocks of this class handed out, and freed back to their runs (local frees and
    /// drained remote ones), by this heap. Per class, next to `active`, so that an
    /// allocation bumps a counter on the line it reads anyway and the bytes of live blocks
    /// follow from the two counts (see [`stats`]) without a byte counter on either path.
    allocs: AtomicU64,
    frees: AtomicU64,
    /// One empty run kept back so that a class that drains and refills does not split and
    /// coalesce spans every time.
    spare: *mut Run,
    groups: [*mut Run; NGROUPS],
}

#[repr(C)]
#[derive(Default)]
struct HeapStats {
    /// Blocks of `SPAN_MIN` bytes or more handed out (class blocks: [`ClassState::allocs`]).
    allocs: AtomicU64,
    requested: AtomicU64,
    remote_sent: AtomicU64,
    remote_received: AtomicU64,
}

#[repr(C, align(64))]
struct Shared {
    /// Bit i: bin i may hold blocks.
    pending: AtomicU64,
    /// 1 while a thread holds the heap (its owner, an adopter, or a collector of an abandoned heap).
    claim: AtomicU32,
    /// The owner thread is gone (or this is a node's shared heap): frees collect it themselves.
    abandoned: AtomicBool,
}

#[repr(C)]
struct Heap {
    id: usize,
    node: usize,
    /// The node whose memory this heap hands out: `node`, or the nearest node with memory
    /// when `node` has none.
    mem_node: usize,
    mismatch: u32,
    /// Small blocks may take the fast path of [`alloc`] ([`FAST_SMALL`], copied here so
    /// that the fast path reads a line of the heap instead of a global through the GOT).
    fast: bool,
    classes: [ClassState; NCLASSES],
    st: HeapStats,
    pool_next: *mut Heap,
    all_next: *mut Heap,
    shared: Shared,
    bins: [Bin; NBINS],
}

struct NodeInner {
    cache: *mut Segment,
    cached: usize,
    pool: *mut Heap,
    shared_heap: *mut Heap,
    /// Free spans of the node's superblocks, one pool per group of heaps (see [`NPOOLS`]).
    spans: [SpanPool; NPOOLS],
}

#[repr(C, align(64))]
struct NodeState {
    lock: SpinLock,
    /// Held by the one thread that maps a new superblock for the node (see [`node_units`]).
    grow: SpinLock,
    inner: UnsafeCell<NodeInner>,
    os_bytes: AtomicU64,
    sb_total: AtomicU64,
    sb_cached: AtomicU64,
    large_bytes: AtomicU64,
    large_count: AtomicU64,
    large_requested: AtomicU64,
    mbind_failures: AtomicU64,
    /// Blocks of `SPAN_MIN` bytes or more: frees, and bytes of the live ones (pages).
    block_frees: AtomicU64,
    block_live: AtomicI64,
    /// Thread heaps started on this node while it has no memory.
    fallback_heaps: AtomicU64,
}

// SAFETY: `inner` is only touched with `lock` held; everything else is atomic.
unsafe impl Sync for NodeState {}

struct Global<T>(UnsafeCell<T>);
// SAFETY: written once by the initializing thread before INIT becomes READY (Release), read
// only after observing READY (Acquire).
unsafe impl<T> Sync for Global<T> {}

const UNINIT: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;
static INIT: AtomicU8 = AtomicU8::new(UNINIT);
static NODEMAP: Global<NodeMap> = Global(UnsafeCell::new(NodeMap::single()));
static MULTI_NODE: AtomicBool = AtomicBool::new(false);
/// Per node: the node whose memory its threads get (itself, or the nearest node with memory).
static HOME: Global<[u8; MAX_NODES]> = Global(UnsafeCell::new([0; MAX_NODES]));
static SB_SIZE: AtomicUsize = AtomicUsize::new(DEFAULT_SUPERBLOCK);
static CACHE_MAX: AtomicUsize = AtomicUsize::new(DEFAULT_CACHE);
static MPOL: AtomicI32 = AtomicI32::new(os::MPOL_PREFERRED);
/// Small blocks (<= 7168 B) from loci's own classes (true) or from glibc (false).
///
/// Own by measurement: in `loci bench alloc --quick --reps 3` (2 threads, shared 2-core
/// machine, 2026-11-21) `general` took 2.24 s median with own small classes and 2.84 s with
/// glibc as the delegate (`loci-small-system`), the blocks below 8 KiB being most of its
/// operations; own classes also put small blocks on the thread's node, which glibc's arenas do
/// not. `LOCI_ALLOC_SMALL=system` keeps the delegate for comparison.
static SMALL_OWN: AtomicBool = AtomicBool::new(true);
/// Set once at init, before `INIT` turns `READY`: small blocks are loci's own and the machine
/// has one node, so `alloc` of a small block needs only the thread's heap (one flag load in
/// place of the init, delegation and node checks).
static FAST_SMALL: AtomicBool = AtomicBool::new(false);
/// Superblocks are advised as transparent huge pages (`madvise(MADV_HUGEPAGE)`) only on request
/// (`LOCI_ALLOC_HUGEPAGES=on`; the kernel honours it where
/// `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` or `always`, and with `always`
/// the kernel backs superblocks with huge pages without the advice).
///
/// Why off by default: a 2 MiB page is taken from the kernel's free 2 MiB blocks, which are the
/// ones a hypervisor with free page reporting (virtio-balloon) has taken back, so the first
/// touch of each pays a host fault for all of it, while 4 KiB faults are served from fragments
/// the host still backs. Measured on the 2-vCPU KVM guest of this project (2026-11-23, 100 MB
/// touched by a fresh process 3 s after the last one): 1.15-1.29 s with the advice (1.0 s of it
/// system time) against 0.05-0.09 s without. In `loci bench alloc --quick` that made loci
/// 0.47-0.49x the best peer in `general` and 0.45-0.68x in `buffer-passing` with the advice,
/// 0.90-0.91x and 1.04-1.15x without, in alternating runs. jemalloc, tcmalloc and mimalloc do
/// not advise huge pages by default either. What the advice buys where 2 MiB pages are cheap:
/// TLB reach for workloads that touch blocks at random over more memory than the TLB covers
/// (a superblock, 10 MiB aligned to 16 MiB, is five whole 2 MiB pages with its header, unit
/// map and run descriptors in the first); its cost: memory faulted in 2 MiB at a time (RSS
/// may round up by up to 2 MiB per partly used piece), and compaction at such a fault. Large
/// blocks (> 512 KiB, their own mappings) follow the system's setting either way.
static HUGEPAGES: AtomicBool = AtomicBool::new(false);
static KEY: AtomicU32 = AtomicU32::new(0);
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);
static ALL_HEAPS: AtomicPtr<Heap> = AtomicPtr::new(null_mut());
static ORPHAN_REMOTE: AtomicU64 = AtomicU64::new(0);
static NODES: [NodeState; MAX_NODES] = [const {
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
        fallback_heaps: AtomicU64::new(0),
    }
}; MAX_NODES];

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
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tls_slot {
    use super::Heap;

    core::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 3",
        ".globl loci_alloc_tls_heap",
        ".hidden loci_alloc_tls_heap",
        ".type loci_alloc_tls_heap,@object",
        ".size loci_alloc_tls_heap,8",
        "loci_alloc_tls_heap:",
        ".zero 8",
        ".popsection",
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

    #[inline]
    pub(super) fn get() -> *mut Heap {
        HEAP.with(|c| c.get())
    }

    #[inline]
    pub(super) fn set(h: *mut Heap) {
        HEAP.with(|c| c.set(h))
    }
}

/// Counter written by one thread at a time (the claim holder): a plain load + store.
#[inline]
fn bump(a: &AtomicU64, v: u64) {
    a.store(a.load(Relaxed).wrapping_add(v), Relaxed);
}

// ---------------------------------------------------------------------------------------------
// Configuration and init

/// The allocator's settings, fixed at first use from the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Superblock size in bytes (`LOCI_ALLOC_SUPERBLOCK`, e.g. `10M`; 2 MiB..64 MiB).
    pub superblock: usize,
    /// Released superblocks each node keeps for reuse (`LOCI_ALLOC_CACHE`).
    pub cache: usize,
    /// `mbind` mode: `MPOL_PREFERRED` (default) or `MPOL_BIND` (`LOCI_ALLOC_MPOL=bind|preferred`).
    pub mpol: i32,
    /// Blocks up to 7168 B come from loci's own small classes (`LOCI_ALLOC_SMALL=own`, default)
    /// or from glibc (`LOCI_ALLOC_SMALL=system`).
    pub small_own: bool,
    /// Superblocks are advised to the kernel as transparent huge pages
    /// (`madvise(MADV_HUGEPAGE)`; `LOCI_ALLOC_HUGEPAGES=on|off`, default off). See
    /// [`HUGEPAGES`] for why.
    pub hugepages: bool,
    /// Nodes the allocator knows (bit n = node n).
    pub nodes: u64,
    /// Nodes with memory (a thread on a memoryless node gets memory by the kernel's default
    /// policy, counted in `mbind_failures`; `alloc_on` of such a node is an error).
    pub mem_nodes: u64,
    /// The largest alignment served from node-bound memory (half the region slot, which is the
    /// superblock size rounded up to a power of two). `alloc_on` refuses more; the C and
    /// `GlobalAlloc` paths hand larger alignments to glibc (not node-bound).
    pub max_align: usize,
}

fn warn(parts: &[&[u8]]) {
    for p in parts {
        // SAFETY: writing a valid byte slice to stderr.
        unsafe { libc::write(2, p.as_ptr() as *const libc::c_void, p.len()) };
    }
}

#[inline]
fn ensure_init() {
    if INIT.load(Acquire) != READY {
        init_slow();
    }
}

#[cold]
fn init_slow() {
    match INIT.compare_exchange(UNINIT, BUSY, Acquire, Acquire) {
        Ok(_) => {
            if let Some(v) = os::getenv(c"LOCI_ALLOC_SUPERBLOCK") {
                match os::parse_size(v) {
                    Some(s) if (2 << 20..=64 << 20).contains(&s) => {
                        SB_SIZE.store(s.div_ceil(PAGE) * PAGE, Relaxed)
                    }
                    _ => warn(&[
                        b"loci-alloc: LOCI_ALLOC_SUPERBLOCK=",
                        v,
                        b" is not a size between 2M and 64M (e.g. 10M); using 10M\n",
                    ]),
                }
            }
            if let Some(v) = os::getenv(c"LOCI_ALLOC_CACHE") {
                match os::parse_size(v) {
                    Some(n) if n <= 1 << 20 => CACHE_MAX.store(n, Relaxed),
                    _ => warn(&[
                        b"loci-alloc: LOCI_ALLOC_CACHE=",
                        v,
                        b" is not a count of superblocks; using 8\n",
                    ]),
                }
            }
            if let Some(v) = os::getenv(c"LOCI_ALLOC_MPOL") {
                match v {
                    b"bind" => MPOL.store(os::MPOL_BIND, Relaxed),
                    b"preferred" => MPOL.store(os::MPOL_PREFERRED, Relaxed),
                    _ => warn(&[
                        b"loci-alloc: LOCI_ALLOC_MPOL=",
                        v,
                        b" is not one of bind, preferred; using preferred\n",
                    ]),
                }
            }
            if let Some(v) = os::getenv(c"LOCI_ALLOC_SMALL") {
                match v {
                    b"own" => SMALL_OWN.store(true, Relaxed),
                    b"system" => SMALL_OWN.store(false, Relaxed),
                    _ => warn(&[
                        b"loci-alloc: LOCI_ALLOC_SMALL=",
                        v,
                        b" is not one of own, system; using own\n",
                    ]),
                }
            }
            if let Some(v) = os::getenv(c"LOCI_ALLOC_HUGEPAGES") {
                match v {
                    b"on" | b"1" => HUGEPAGES.store(true, Relaxed),
                    b"off" | b"0" => HUGEPAGES.store(false, Relaxed),
                    _ => warn(&[
                        b"loci-alloc: LOCI_ALLOC_HUGEPAGES=",
                        v,
                        b" is not one of on, off; using off\n",
                    ]),
                }
            }
            let region = SB_SIZE.load(Relaxed).next_power_of_two();
            os::REGION_SHIFT.store(
                (region.trailing_zeros() as usize).max(os::MIN_REGION_SHIFT),
                Relaxed,
            );
            // SAFETY: only this thread writes NODEMAP, before READY is published.
            let map = unsafe { &mut *NODEMAP.0.get() };
            map.read_sysfs();
            MULTI_NODE.store(map.nodes.count_ones() > 1, Relaxed);
            // SAFETY: as for NODEMAP.
            let home = unsafe { &mut *HOME.0.get() };
            for (n, h) in home.iter_mut().enumerate() {
                *h = map.memory_node(n).unwrap_or(0) as u8;
            }
            let mut key: libc::pthread_key_t = 0;
            // SAFETY: `key` is writable; the destructor has the C signature pthread expects.
            let r = unsafe { libc::pthread_key_create(&mut key, Some(thread_exit)) };
            if r != 0 {
                warn(&[b"loci-alloc: pthread_key_create failed; exiting threads keep their heaps until the process ends\n"]);
            }
            KEY.store(if r == 0 { key } else { u32::MAX }, Relaxed);
            FAST_SMALL.store(
                SMALL_OWN.load(Relaxed) && !MULTI_NODE.load(Relaxed),
                Relaxed,
            );
            INIT.store(READY, Release);
        }
        Err(_) => {
            while INIT.load(Acquire) != READY {
                // SAFETY: no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }
}

/// The settings in force (initializes the allocator if nothing has yet).
pub fn config() -> Config {
    ensure_init();
    Config {
        superblock: SB_SIZE.load(Relaxed),
        cache: CACHE_MAX.load(Relaxed),
        mpol: MPOL.load(Relaxed),
        small_own: SMALL_OWN.load(Relaxed),
        hugepages: HUGEPAGES.load(Relaxed),
        nodes: nodemap().nodes,
        mem_nodes: nodemap().mem_nodes,
        max_align: region_size() / 2,
    }
}

#[inline]
fn nodemap() -> &'static NodeMap {
    // SAFETY: called after ensure_init (READY observed with Acquire): NODEMAP is no longer written.
    unsafe { &*NODEMAP.0.get() }
}

/// The node whose memory threads of `node` get (see [`NodeMap::memory_node`]).
#[inline]
fn home(node: usize) -> usize {
    // SAFETY: written before READY, read-only afterwards (callers run after ensure_init).
    unsafe { (*HOME.0.get())[node] as usize }
}

/// A thread starts on a node without memory: counted, and said once per node on stderr
/// (`LOCI_ALLOC_QUIET=1` silences it), since its blocks cannot be where it runs.
#[cold]
fn memoryless_fallback(node: usize) {
    let ns = &NODES[node];
    if ns.fallback_heaps.fetch_add(1, Relaxed) == 0 && os::getenv(c"LOCI_ALLOC_QUIET").is_none() {
        let mut a = [0u8; 20];
        let mut b = [0u8; 20];
        warn(&[
            b"loci-alloc: node ",
            os::fmt_usize(node, &mut a),
            b" has no memory; threads running there get memory of node ",
            os::fmt_usize(home(node), &mut b),
            b" (the nearest with memory)\n",
        ]);
    }
}

#[inline]
fn current_node() -> usize {
    let cpu = os::current_cpu();
    if cpu < MAX_CPUS {
        nodemap().cpu_node[cpu] as usize
    } else {
        0
    }
}

// ---------------------------------------------------------------------------------------------
// Superblocks (node side)

/// Takes a superblock out of `node`'s cache (null when it is empty). The caller holds the
/// node lock and formats it.
unsafe fn pop_cached_sb(ns: &NodeState, inner: *mut NodeInner) -> *mut Segment {
    let seg = (*inner).cache;
    if !seg.is_null() {
        // Cached superblocks are valid mapped headers owned by the node.
        (*inner).cache = (*seg).next;
        (*inner).cached -= 1;
        ns.sb_cached.fetch_sub(1, Relaxed);
    }
    seg
}

/// Maps and binds a new superblock of `node`. The caller formats it.
fn map_sb(node: usize) -> *mut Segment {
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
    if !os::mark(p as usize, true) {
        // SAFETY: ours, unused.
        unsafe { os::unmap(p, size) };
        return null_mut();
    }
    ns.os_bytes.fetch_add(size as u64, Relaxed);
    ns.sb_total.fetch_add(1, Relaxed);
    let seg = os::header_of(p as usize) as *mut Segment;
    // SAFETY: fresh zeroed mapping; the header slot lies in its first page.
    unsafe {
        (*seg).kind = KIND_SB;
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
unsafe fn release_sb(seg: *mut Segment) {
    let node = (*seg).node as usize;
    let ns = &NODES[node];
    ns.lock.lock();
    let inner = &mut *ns.inner.get();
    if inner.cached < CACHE_MAX.load(Relaxed) {
        (*seg).resident = 1;
        (*seg).next = inner.cache;
        inner.cache = seg;
        inner.cached += 1;
        ns.sb_cached.fetch_add(1, Relaxed);
        ns.lock.unlock();
        return;
    }
    ns.lock.unlock();
    let size = SB_SIZE.load(Relaxed);
    let base = (*seg).base;
    os::mark(base, false);
    os::unmap(base as *mut u8, size);
    ns.os_bytes.fetch_sub(size as u64, Relaxed);
    ns.sb_total.fetch_sub(1, Relaxed);
}

/// Lays out a superblock just acquired; returns the free span of all its data pages (not yet
/// listed).
///
/// # Safety
/// `seg` comes from [`pop_cached_sb`] or [`map_sb`] and nobody else references it yet.
unsafe fn format_sb(seg: *mut Segment) -> *mut Run {
    let size = SB_SIZE.load(Relaxed);
    let nunits = size / UNIT;
    // One descriptor per page (4 units). Enough: every run in use is at least 8 units (blocks
    // of 8 KiB and more, class runs of about 64 KiB) and free spans never touch each other,
    // so at most about a quarter of the units start a run. Should they run out anyway, a span
    // is handed out whole instead of being split (see `cut`).
    let max_desc = size / PAGE;
    let base = (*seg).base;
    let desc_off = PAGE + (nunits * 2).div_ceil(LINE) * LINE;
    let data_unit =
        (desc_off + max_desc * core::mem::size_of::<Run>()).div_ceil(PAGE) * (PAGE / UNIT);
    (*seg).nunits = nunits as u32;
    (*seg).data_unit = data_unit as u32;
    (*seg).max_desc = max_desc as u32;
    (*seg).desc_bump = 0;
    (*seg).desc_free = NO_DESC;
    (*seg).map = (base + PAGE) as *mut u16;
    (*seg).descs = (base + desc_off) as *mut Run;
    (*seg).next = null_mut();
    let r = new_desc(seg);
    (*r).first = data_unit as u32;
    (*r).nunits = (nunits - data_unit) as u32;
    (*r).fresh = ((*seg).resident == 0) as u32;
    (*r).state.store(R_FREE, Relaxed);
    map_ends(r);
    r
}

// ---------------------------------------------------------------------------------------------
// Runs and spans (a node's spans: with the node lock held)

/// A fresh descriptor of `seg`, or null when all are in use.
unsafe fn new_desc(seg: *mut Segment) -> *mut Run {
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
unsafe fn map_ends(r: *mut Run) {
    let seg = (*r).seg;
    let i = desc_index(r) as u16;
    *(*seg).map.add((*r).first as usize) = i;
    *(*seg).map.add(((*r).first + (*r).nunits - 1) as usize) = i;
}

/// Points every page of a run at its descriptor (a pointer anywhere in it finds it).
unsafe fn map_all(r: *mut Run) {
    let seg = (*r).seg;
    let i = desc_index(r) as u16;
    for u in (*r).first..(*r).first + (*r).nunits {
        *(*seg).map.add(u as usize) = i;
    }
}

/// [`run_of`] with the superblock's base already known (from the region lookup): one load
/// fewer on `free`'s dependency chain.
#[inline(always)]
unsafe fn run_at(seg: *mut Segment, base: usize, p: usize) -> *mut Run {
    debug_assert_eq!(base, (*seg).base);
    (*seg)
        .descs
        .add(*(*seg).map.add((p - base) / UNIT) as usize)
}

/// The run covering `p` (a pointer into a live run of `seg`).
#[inline]
unsafe fn run_of(seg: *mut Segment, p: usize) -> *mut Run {
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
unsafe fn cut(sp: *mut SpanPool, r: *mut Run, n: usize) {
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
unsafe fn node_units(node: usize, pool: usize, n: usize, state: u32) -> *mut Run {
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
unsafe fn node_free(r: *mut Run) {
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
unsafe fn pop(r: *mut Run) -> *mut u8 {
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
unsafe fn block_start(r: *mut Run, p: usize) -> usize {
    if (*r).state.load(Relaxed) == R_BLOCK {
        return (*r).data;
    }
    let off = p.wrapping_sub((*r).data);
    let idx = ((off as u128 * (*r).magic as u128) >> 64) as usize;
    (*r).data + idx * (*r).bsize
}

// ---------------------------------------------------------------------------------------------
// Occupancy groups (claim holder only)

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
unsafe fn set_state_group(r: *mut Run, g: u32) {
    (*r).group = g;
    (*r).lo = if g == G_FULL { u32::MAX } else { 0 };
}

/// Files a non-active run under its occupancy group (or as spare / back to the free spans).
unsafe fn file(h: *mut Heap, r: *mut Run) {
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
unsafe fn local_free(h: *mut Heap, r: *mut Run, blk: usize) {
    let f = blk as *mut Free;
    (*f).next = (*r).free;
    (*r).free = f;
    (*r).used -= 1;
    bump(&class_state(h, (*r).class as usize).frees, 1);
    if (*r).used < (*r).lo {
        regroup(h, r);
    }
}

// ---------------------------------------------------------------------------------------------
// Blocks of SPAN_MIN bytes or more: spans of the node's own superblocks
//
// Deviation from seed 003, where such blocks are blocks of per-thread class sub-allocators
// and a remote free goes to the owner's recollection bin. Here the node's superblock
// allocator hands them out as spans, behind the node lock, and any thread frees them
// straight back into the node's spans. Why: with per-thread pools, memory freed by another
// thread comes back to its owner only when the owner next drains, and each thread keeps the
// pages of its own peak; in `buffer-passing` (blocks allocated on one thread and freed on the
// next) that made RSS the sum of the threads' peaks (2.4x the bytes requested, against
// 1.2-1.4x with one pool per node, which follows the total). Placement is unchanged: the
// spans are the node's. The lock is taken once per block of 8 KiB or more, whose first write
// alone costs more than the lock.

/// A block of [`SPAN_MIN`] bytes or more on `node`: a span of its own, in whole units.
unsafe fn alloc_block(node: usize, pool: usize, size: usize) -> *mut u8 {
    let r = node_units(node, pool, size.div_ceil(UNIT), R_BLOCK);
    if r.is_null() {
        return null_mut();
    }
    let data = (*(*r).seg).base + (*r).first as usize * UNIT;
    (*r).data = data;
    (*r).bsize = (*r).nunits as usize * UNIT;
    map_all(r);
    NODES[node].block_live.fetch_add((*r).bsize as i64, Relaxed);
    data as *mut u8
}

/// Frees a block of [`SPAN_MIN`] bytes or more, from any thread.
#[cold]
unsafe fn free_block(r: *mut Run) {
    let ns = &NODES[(*(*r).seg).node as usize];
    ns.block_frees.fetch_add(1, Relaxed);
    ns.block_live.fetch_sub((*r).bsize as i64, Relaxed);
    node_free(r);
}

/// A block of `size` bytes (`SMALL_MAX < size <= MEDIUM_MAX`, or any size up to
/// `MEDIUM_MAX` when `small` own classes are in use) from heap `h`.
#[inline]
unsafe fn alloc_sized(h: *mut Heap, size: usize, requested: usize) -> *mut u8 {
    if size >= SPAN_MIN {
        let p = alloc_block((*h).mem_node, (*h).id, size);
        if !p.is_null() {
            bump(&(*h).st.allocs, 1);
            bump(&(*h).st.requested, requested as u64);
        }
        p
    } else {
        alloc_class(h, class_of(size), requested)
    }
}

// ---------------------------------------------------------------------------------------------
// Heaps

fn create_heap(node: usize, claimed: bool) -> *mut Heap {
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
        (*p).fast = FAST_SMALL.load(Relaxed);
        (*p).shared.claim.store(claimed as u32, Relaxed);
        (*p).shared.abandoned.store(!claimed, Relaxed);
        let mut head = ALL_HEAPS.load(Relaxed);
        loop {
            (*p).all_next = head;
            match ALL_HEAPS.compare_exchange_weak(head, p, Release, Relaxed) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
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
        while (*h)
            .shared
            .claim
            .compare_exchange_weak(0, 1, Acquire, Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        (*h).shared.abandoned.store(false, SeqCst);
        (*h).mismatch = 0;
    }
    h
}

/// Drains the recollection bins into the heap's superblocks.
///
/// # Safety
/// The caller holds `h`'s claim.
unsafe fn drain(h: *mut Heap) {
    let mut mask = (*h).shared.pending.swap(0, AcqRel);
    let mut n = 0u64;
    while mask != 0 {
        let i = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        let bin = &(*h).bins[i];
        bin.lock.lock();
        let mut f = *bin.head.get();
        *bin.head.get() = null_mut();
        bin.lock.unlock();
        while !f.is_null() {
            let next = (*f).next;
            if let Some(base) = os::region_of(f as usize) {
                let seg = os::header_of(base) as *mut Segment;
                local_free(h, run_of(seg, f as usize), f as usize);
                n += 1;
            }
            f = next;
        }
    }
    bump(&(*h).st.remote_received, n);
}

/// Drains an abandoned heap from whatever thread gets its claim; the last holder re-checks
/// after letting go so that no block stays in a bin.
unsafe fn collect(h: *mut Heap) {
    loop {
        if (*h).shared.pending.load(SeqCst) == 0 {
            return;
        }
        if (*h)
            .shared
            .claim
            .compare_exchange(0, 1, Acquire, Relaxed)
            .is_err()
        {
            return;
        }
        drain(h);
        (*h).shared.claim.store(0, SeqCst);
    }
}

/// Hands a heap to its node's pool: called at thread exit and when a thread moves to another
/// node.
///
/// # Safety
/// The caller holds `h`'s claim and gives it up.
unsafe fn abandon(h: *mut Heap) {
    drain(h);
    for c in 0..NCLASSES {
        let cs = &mut (*h).classes[c];
        let a = cs.active;
        if !a.is_null() {
            cs.active = null_mut();
            file(h, a);
        }
        let cs = &mut (*h).classes[c];
        let s = cs.spare;
        if !s.is_null() {
            cs.spare = null_mut();
            (*s).owner.store(null_mut(), Relaxed);
            node_free(s);
        }
    }
    (*h).shared.abandoned.store(true, SeqCst);
    let ns = &NODES[(*h).node];
    ns.lock.lock();
    let inner = &mut *ns.inner.get();
    (*h).pool_next = inner.pool;
    inner.pool = h;
    ns.lock.unlock();
    (*h).shared.claim.store(0, SeqCst);
    collect(h);
}

unsafe extern "C" fn thread_exit(arg: *mut libc::c_void) {
    let h = arg as *mut Heap;
    if h.is_null() {
        return;
    }
    if tls_slot::get() == h {
        tls_slot::set(null_mut());
    }
    // SAFETY: the pthread value is this thread's heap, whose claim it holds.
    abandon(h);
}

#[inline]
fn tls_heap() -> *mut Heap {
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
#[cold]
unsafe fn check_node(h: *mut Heap) -> *mut Heap {
    let n = current_node();
    (*h).mismatch += 1;
    let confined = (*h).mismatch == 1 && os::affinity_node(&nodemap().cpu_node) == Some(n);
    if !confined && (*h).mismatch < 64 {
        return h;
    }
    let new = adopt_or_create(n);
    if new.is_null() {
        return h;
    }
    abandon(h);
    set_thread_heap(new);
    new
}

#[inline]
fn heap() -> *mut Heap {
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

// ---------------------------------------------------------------------------------------------
// Allocation

#[inline]
unsafe fn alloc_class(h: *mut Heap, c: usize, size: usize) -> *mut u8 {
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

unsafe fn alloc_large(size: usize, align: usize, node: usize) -> *mut u8 {
    // The block starts after the first page, which holds the header at its colored slot.
    const _: () = assert!(os::HEADER_COLORS * os::HEADER_STEP <= PAGE);
    let off = align.max(PAGE);
    let Some(len) = off.checked_add(size).and_then(|l| l.checked_add(PAGE - 1)) else {
        return null_mut();
    };
    let len = len / PAGE * PAGE;
    debug_assert!(
        align < region_size(),
        "alignment {align} reaches a region slot"
    );
    let p = os::map_aligned(len, region_size());
    if p.is_null() {
        return p;
    }
    let ns = &NODES[node];
    if !os::bind(p, len, node, MPOL.load(Relaxed)) {
        ns.mbind_failures.fetch_add(1, Relaxed);
    }
    if !os::mark(p as usize, true) {
        os::unmap(p, len);
        return null_mut();
    }
    let l = os::header_of(p as usize) as *mut Large;
    (*l).kind = KIND_LARGE;
    (*l).node = node as u32;
    (*l).map_len = len;
    (*l).requested = size;
    ns.os_bytes.fetch_add(len as u64, Relaxed);
    ns.large_bytes.fetch_add(len as u64, Relaxed);
    ns.large_count.fetch_add(1, Relaxed);
    ns.large_requested.fetch_add(size as u64, Relaxed);
    p.add(off)
}

unsafe fn free_large(base: usize) {
    let l = os::header_of(base) as *mut Large;
    let len = (*l).map_len;
    let ns = &NODES[(*l).node as usize];
    ns.os_bytes.fetch_sub(len as u64, Relaxed);
    ns.large_bytes.fetch_sub(len as u64, Relaxed);
    ns.large_count.fetch_sub(1, Relaxed);
    ns.large_requested.fetch_sub((*l).requested as u64, Relaxed);
    os::mark(base, false);
    os::unmap(base as *mut u8, len);
}

#[inline]
fn small_delegated() -> bool {
    !SMALL_OWN.load(Relaxed)
}

/// Allocates `size` bytes aligned to `align` (a power of two). Null when out of memory.
///
/// # Safety
/// `align` must be a power of two.
#[inline(always)]
pub unsafe fn alloc(size: usize, align: usize) -> *mut u8 {
    if align <= 16 {
        let p = alloc_small_fast(size);
        if !p.is_null() {
            return p;
        }
    }
    alloc_full(size, align)
}

/// The call-free fast path of an allocation of `size` bytes aligned to 16: a small block from
/// the active run of the thread's heap, nothing pending in its bins. Null when it does not
/// apply (the caller then takes [`alloc_full`]).
///
/// Kept free of calls and panics so that it needs no saved registers and inlines into the C
/// `malloc` (callgrind showed the pushes and pops of the full path at ~13 of its
/// instructions per malloc), and loads only the heap's own lines: its flag word, its bins'
/// pending mask, the class's state and the run's first line.
///
/// # Safety
/// None beyond calling it from a thread that may allocate (any thread); the block is the
/// caller's to free with [`free`].
#[inline(always)]
pub unsafe fn alloc_small_fast(size: usize) -> *mut u8 {
    if size <= SMALL_MAX {
        let h = tls_heap();
        // A thread with a heap has passed init (it created or adopted the heap after it).
        if !h.is_null() && (*h).fast && (*h).shared.pending.load(Relaxed) == 0 {
            // SAFETY: a class of a size <= SMALL_MAX is a small class < NCLASSES.
            let cs = class_state(h, small_class_of(size));
            let sb = cs.active;
            if !sb.is_null() {
                let p = pop(sb);
                if !p.is_null() {
                    bump(&cs.allocs, 1);
                    bump(&(*h).st.requested, size as u64);
                    return p;
                }
            }
        }
    }
    null_mut()
}

/// Class `c`'s state in heap `h`, without a bounds check.
///
/// # Safety
/// `c < NCLASSES`; `h` is a valid heap.
#[inline(always)]
unsafe fn class_state<'a>(h: *mut Heap, c: usize) -> &'a ClassState {
    debug_assert!(c < NCLASSES);
    (*h).classes.get_unchecked(c)
}

/// Every allocation the fast path of [`alloc`] does not serve.
///
/// `extern "C"` (it aborts instead of unwinding) so that calls to it are known not to unwind
/// and the C `malloc` can end in a tail call without a landing pad or a stack frame.
///
/// # Safety
/// `align` must be a power of two.
#[inline(never)]
pub unsafe extern "C" fn alloc_full(size: usize, align: usize) -> *mut u8 {
    ensure_init();
    let size = size.max(1);
    if align <= 16 {
        if size <= SMALL_MAX {
            if small_delegated() {
                return __libc_malloc(size);
            }
            let h = heap();
            if h.is_null() {
                return h as *mut u8;
            }
            return alloc_class(h, class_of(size), size);
        }
        if size <= MEDIUM_MAX {
            let h = heap();
            if h.is_null() {
                return h as *mut u8;
            }
            return alloc_sized(h, size, size);
        }
    }
    alloc_aligned_slow(size, align)
}

#[cold]
unsafe fn alloc_aligned_slow(size: usize, align: usize) -> *mut u8 {
    if align <= LINE && size > SMALL_MAX && size <= MEDIUM_MAX {
        // medium blocks are cache-line aligned already (runs start on pages, sizes are lines)
        let h = heap();
        if h.is_null() {
            return h as *mut u8;
        }
        return alloc_sized(h, size, size);
    }
    if align <= PAGE && size <= MEDIUM_MAX - align {
        let padded = size + align - 16;
        if padded <= SMALL_MAX && small_delegated() {
            return __libc_memalign(align, size);
        }
        let h = heap();
        if h.is_null() {
            return h as *mut u8;
        }
        let p = alloc_sized(h, padded, size);
        if p.is_null() {
            return p;
        }
        return align_into(p, align);
    }
    if align >= region_size() {
        // A block aligned to a region boundary starts on the first page of a region slot, where
        // `free` looks for that slot's header: the block would cover its own header. Such
        // alignments (the region size, 4 MiB or more) are left to glibc, whose pointers `free`
        // recognises as foreign; they are not node-bound.
        return __libc_memalign(align, size);
    }
    let h = heap();
    let node = if h.is_null() {
        home(current_node())
    } else {
        (*h).mem_node
    };
    alloc_large(size, align, node)
}

/// Bytes of one region slot of the region map: large blocks and superblocks start on one, and
/// an alignment must stay below it (see `alloc_aligned_slow`).
#[inline]
fn region_size() -> usize {
    1usize << os::REGION_SHIFT.load(Relaxed)
}

/// The first address aligned to `align` in the block `p` (allocated with room for it). When
/// that is inside a block of a class run, the run becomes R_CLASS_ALIGNED: its frees then take
/// the slow path, which finds the block start by division.
///
/// # Safety
/// `p` is a live block of this allocator, padded by `align - 16` bytes or more; the caller
/// holds the claim of the heap that owns its run.
unsafe fn align_into(p: *mut u8, align: usize) -> *mut u8 {
    let q = (p as usize + align - 1) & !(align - 1);
    if q != p as usize {
        if let Some((_, hdr)) = os::region_and_header(p as usize) {
            if *(hdr as *const u32) != KIND_LARGE {
                let r = run_of(hdr as *mut Segment, p as usize);
                if (*r).state.load(Relaxed) == R_CLASS {
                    (*r).state.store(R_CLASS_ALIGNED, Relaxed);
                }
            }
        }
    }
    q as *mut u8
}

/// Zeroed allocation.
///
/// # Safety
/// `align` must be a power of two.
pub unsafe fn alloc_zeroed(size: usize, align: usize) -> *mut u8 {
    ensure_init();
    if align <= 16 && size <= SMALL_MAX && small_delegated() {
        return __libc_calloc(1, size.max(1));
    }
    let p = alloc(size, align);
    if p.is_null() {
        return p;
    }
    if let Some(base) = os::region_of(p as usize) {
        if *(os::header_of(base) as *const u32) == KIND_LARGE {
            return p; // fresh anonymous mapping: already zero
        }
    }
    core::ptr::write_bytes(p, 0, size);
    p
}

/// Frees a block of this allocator or of the system allocator (small blocks when delegated).
///
/// # Safety
/// `p` is null or a live block from [`alloc`] / the system allocator, freed once.
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

/// After a local free into a run that is not active: files a run that was full, or moves the
/// run to its new occupancy group (what [`local_free`] does after the push).
#[inline(never)]
unsafe extern "C" fn regroup(h: *mut Heap, r: *mut Run) {
    if (*r).group == G_FULL {
        file(h, r);
    } else {
        unlink(h, r);
        file(h, r);
    }
}

/// Every free the fast path of [`free`] does not take (`extern "C"` for the reason given at
/// [`alloc_full`]).
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

/// Bytes usable at `p` (at least what was asked for), or None if `p` is not this allocator's.
///
/// # Safety
/// `p` is a live block.
pub unsafe fn usable_size(p: *const u8) -> Option<usize> {
    let base = os::region_of(p as usize)?;
    let hdr = os::header_of(base);
    if *(hdr as *const u32) == KIND_LARGE {
        return Some(base + (*(hdr as *const Large)).map_len - p as usize);
    }
    let r = run_of(hdr as *mut Segment, p as usize);
    Some(block_start(r, p as usize) + (*r).bsize - p as usize)
}

type UsableFn = unsafe extern "C" fn(*mut libc::c_void) -> usize;
static SYS_USABLE: AtomicUsize = AtomicUsize::new(0);

/// `malloc_usable_size` of the system allocator for a delegated block.
///
/// # Safety
/// `p` is a live block of the system allocator.
pub unsafe fn sys_usable_size(p: *mut u8) -> usize {
    let mut f = SYS_USABLE.load(Acquire);
    if f == 0 {
        // Resolved lazily, never during init: dlsym may allocate (through us, which is fine
        // once initialized). RTLD_NEXT skips our own export when this code is the preload.
        f = libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) as usize;
        if f == 0 {
            return 0;
        }
        SYS_USABLE.store(f, Release);
    }
    let func: UsableFn = core::mem::transmute(f);
    func(p as *mut libc::c_void)
}

/// Resizes with C `realloc` semantics (null `p` allocates; the caller handles size 0).
///
/// # Safety
/// `p` is null or a live block; `align` a power of two.
pub unsafe fn realloc(p: *mut u8, new: usize, align: usize) -> *mut u8 {
    if p.is_null() {
        return alloc(new, align);
    }
    ensure_init();
    let old = match usable_size(p) {
        Some(us) => {
            // Keep the block when it fits and at most half of it would be wasted.
            if new <= us && (new >= us / 2 || us <= 64) {
                return p;
            }
            us
        }
        None => {
            if align <= 16 && new <= SMALL_MAX && small_delegated() {
                return __libc_realloc(p, new.max(1));
            }
            sys_usable_size(p)
        }
    };
    let q = alloc(new, align);
    if q.is_null() {
        return q;
    }
    core::ptr::copy_nonoverlapping(p, q, old.min(new));
    free(p);
    q
}

// ---------------------------------------------------------------------------------------------
// Node-targeted API

/// Why [`alloc_on`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// The node is not one the allocator knows; `valid` has bit n set for each valid node.
    NoSuchNode { node: usize, valid: u64 },
    /// The node has no memory of its own; `with_memory` has bit n set for each node that has.
    NoMemory { node: usize, with_memory: u64 },
    /// The OS refused the memory.
    OutOfMemory { size: usize },
    /// The alignment is not a power of two, or above `max` (half a region slot: a block
    /// aligned to a whole slot would cover the slot's header).
    BadAlign { align: usize, max: usize },
}

impl core::fmt::Display for AllocError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let list = |f: &mut core::fmt::Formatter<'_>, mask: u64| -> core::fmt::Result {
            let mut first = true;
            for n in 0..64 {
                if mask >> n & 1 == 1 {
                    write!(f, "{}{n}", if first { "" } else { "," })?;
                    first = false;
                }
            }
            Ok(())
        };
        match self {
            AllocError::NoSuchNode { node, valid } => {
                write!(f, "node {node} does not exist; valid nodes: ")?;
                list(f, *valid)
            }
            AllocError::NoMemory { node, with_memory } => {
                write!(f, "node {node} has no memory; nodes with memory: ")?;
                list(f, *with_memory)
            }
            AllocError::OutOfMemory { size } => write!(f, "out of memory allocating {size} bytes"),
            AllocError::BadAlign { align, max } => write!(
                f,
                "alignment {align} is not valid: a power of two from 1 to {max} is"
            ),
        }
    }
}

impl std::error::Error for AllocError {}

/// Allocates on `node` whatever thread calls: from the calling thread's heap when it serves
/// that node, else from the node's shared heap (behind its claim), or a node-bound mapping.
///
/// # Safety
/// The block must be released with [`free`] (or the C `free` of the preload library).
pub unsafe fn alloc_on(node: usize, size: usize, align: usize) -> Result<*mut u8, AllocError> {
    ensure_init();
    let valid = nodemap().nodes;
    if node >= MAX_NODES || valid >> node & 1 == 0 {
        return Err(AllocError::NoSuchNode { node, valid });
    }
    let with_memory = nodemap().mem_nodes;
    if with_memory >> node & 1 == 0 {
        return Err(AllocError::NoMemory { node, with_memory });
    }
    if !align.is_power_of_two() || align >= region_size() {
        return Err(AllocError::BadAlign {
            align,
            max: region_size() / 2,
        });
    }
    let size = size.max(1);
    let oom = Err(AllocError::OutOfMemory { size });
    let padded = if align <= 16 {
        Some(size)
    } else if align <= PAGE {
        size.checked_add(align - 16)
    } else {
        None
    };
    let Some(padded) = padded.filter(|&p| p <= MEDIUM_MAX) else {
        let p = alloc_large(size, align, node);
        return if p.is_null() { oom } else { Ok(p) };
    };
    let mine = tls_heap();
    let p = if !mine.is_null() && (*mine).node == node {
        alloc_sized(mine, padded, size)
    } else {
        let h = shared_heap(node);
        if h.is_null() {
            return oom;
        }
        while (*h)
            .shared
            .claim
            .compare_exchange_weak(0, 1, Acquire, Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        let mut p = alloc_sized(h, padded, size);
        if !p.is_null() {
            p = align_into(p, align);
        }
        (*h).shared.claim.store(0, SeqCst);
        collect(h);
        return if p.is_null() { oom } else { Ok(p) };
    };
    if p.is_null() {
        return oom;
    }
    Ok(align_into(p, align))
}

fn shared_heap(node: usize) -> *mut Heap {
    let ns = &NODES[node];
    ns.lock.lock();
    // SAFETY: node lock held.
    let inner = unsafe { &mut *ns.inner.get() };
    if inner.shared_heap.is_null() {
        inner.shared_heap = create_heap(node, false);
    }
    let h = inner.shared_heap;
    ns.lock.unlock();
    h
}

/// The node a block of this allocator was bound to; None for blocks of the system allocator.
pub fn node_of(p: *const u8) -> Option<usize> {
    let base = os::region_of(p as usize)?;
    // SAFETY: every region has a header at header_of(base) whose second word is the node.
    Some(unsafe { (*(os::header_of(base) as *const Large)).node } as usize)
}

/// Drains the calling thread's recollection bins now (the scheduler calls this when a task
/// ends, seed 003).
pub fn task_finished() {
    let h = tls_heap();
    if !h.is_null() {
        // SAFETY: this thread holds its heap's claim.
        unsafe {
            if (*h).shared.pending.load(Relaxed) != 0 {
                drain(h);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics

/// Per-node counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Bytes mapped from the OS for this node (superblocks, cached or not, and large blocks).
    pub os_bytes: u64,
    /// Superblocks held by heaps.
    pub superblocks_in_use: u64,
    /// Released superblocks kept mapped for reuse.
    pub superblocks_cached: u64,
    /// Bytes of large (> 512 KiB) mappings and how many there are.
    pub large_bytes: u64,
    pub large_blocks: u64,
    /// Bytes requested by the live large blocks.
    pub large_requested: u64,
    /// Mappings the kernel refused to bind (no NUMA support, node offline).
    pub mbind_failures: u64,
    /// Whether the node has memory of its own.
    pub has_memory: bool,
    /// The node whose memory threads running on this node get: the node itself, or for a
    /// memoryless node the nearest node with memory (by the firmware's distances).
    pub memory_from: usize,
    /// Thread heaps that started on this node while it had no memory (each one a thread whose
    /// blocks are on `memory_from`, not where it runs).
    pub fallback_heaps: u64,
}

/// A snapshot of the allocator's counters (summed without stopping threads: each counter is
/// exact, their sum may mix moments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Allocations served from superblocks (small delegated blocks and large ones not included).
    pub allocs: u64,
    /// Frees of superblock blocks processed by their owners.
    pub frees: u64,
    /// Bytes requested by the superblock allocations, cumulative.
    pub bytes_requested: u64,
    /// Bytes of live superblock blocks (class sizes).
    pub live_block_bytes: i64,
    /// Frees by a thread that did not own the block (sent to a recollection bin).
    pub cross_thread_frees: u64,
    /// Blocks taken out of recollection bins by their owners.
    pub recollected: u64,
    /// Heaps ever created (heaps are recycled, never unmapped).
    pub heaps: u64,
    /// Thread heaps started on a node without memory, summed over nodes (see
    /// [`NodeStats::fallback_heaps`]); 0 when every thread ran where its memory is.
    pub memoryless_fallbacks: u64,
    /// Bit n: node n is known.
    pub nodes_online: u64,
    /// Per-node counters, indexed by node id.
    pub nodes: [NodeStats; MAX_NODES],
}

impl Stats {
    /// Sum of `os_bytes` over nodes.
    pub fn os_bytes(&self) -> u64 {
        self.nodes.iter().map(|n| n.os_bytes).sum()
    }
}

/// Current counters.
pub fn stats() -> Stats {
    ensure_init();
    let mut s = Stats {
        allocs: 0,
        frees: 0,
        bytes_requested: 0,
        live_block_bytes: 0,
        cross_thread_frees: ORPHAN_REMOTE.load(Relaxed),
        recollected: 0,
        heaps: 0,
        memoryless_fallbacks: 0,
        nodes_online: nodemap().nodes,
        nodes: [NodeStats::default(); MAX_NODES],
    };
    let mut h = ALL_HEAPS.load(Acquire);
    while !h.is_null() {
        // SAFETY: heaps are never unmapped; counters are atomics.
        unsafe {
            let st = &(*h).st;
            s.allocs += st.allocs.load(Relaxed);
            s.bytes_requested += st.requested.load(Relaxed);
            for (c, cs) in (*h).classes.iter().enumerate() {
                let (a, f) = (cs.allocs.load(Relaxed), cs.frees.load(Relaxed));
                s.allocs += a;
                s.frees += f;
                s.live_block_bytes += (a as i64 - f as i64) * SIZES[c] as i64;
            }
            s.cross_thread_frees += st.remote_sent.load(Relaxed);
            s.recollected += st.remote_received.load(Relaxed);
            s.heaps += 1;
            h = (*h).all_next;
        }
    }
    for (i, ns) in NODES.iter().enumerate() {
        s.frees += ns.block_frees.load(Relaxed);
        s.live_block_bytes += ns.block_live.load(Relaxed);
        let total = ns.sb_total.load(Relaxed);
        let cached = ns.sb_cached.load(Relaxed);
        s.nodes[i] = NodeStats {
            os_bytes: ns.os_bytes.load(Relaxed),
            superblocks_in_use: total.saturating_sub(cached),
            superblocks_cached: cached,
            large_bytes: ns.large_bytes.load(Relaxed),
            large_blocks: ns.large_count.load(Relaxed),
            large_requested: ns.large_requested.load(Relaxed),
            mbind_failures: ns.mbind_failures.load(Relaxed),
            has_memory: nodemap().mem_nodes >> i & 1 == 1,
            memory_from: home(i),
            fallback_heaps: ns.fallback_heaps.load(Relaxed),
        };
        s.memoryless_fallbacks += s.nodes[i].fallback_heaps;
    }
    s
}
