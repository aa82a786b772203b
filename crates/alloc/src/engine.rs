//! The allocator engine (seed 003, section 5).
//!
//! Glossary and invariants:
//! * **region**: an allocator mapping whose start is aligned to the region alignment and marked
//!   in the region map ([`os::region_of`]); it starts with a header whose first word is its kind.
//! * **superblock**: a region of `superblock size` bytes (10 MiB by default) that serves blocks of
//!   one class. Mapped and bound to one node with `mbind`; its node never changes.
//! * **heap**: the local allocator of one thread (seed 003's "local memory allocator"): one
//!   sub-allocator ([`ClassState`]) per class, 64 recollection bins, counters. A heap serves one
//!   node. Exactly one thread holds a heap's `claim` at a time, and only it touches the heap's
//!   owner-side fields and the headers of the heap's superblocks; everything else goes through
//!   the bins.
//! * **recollection bin**: the list of blocks other threads freed into a heap, behind a spin
//!   lock; bin `i` takes the frees of threads whose heap id is `i mod 64` (a private bin per
//!   (owner, freer) pair up to 64 threads; beyond that pairs share bins, still correct).
//! * **node pool**: per node, the superblock cache (LIFO, bounded), the heaps of exited threads
//!   (adopted by the next thread that starts on the node), and one shared heap for
//!   [`alloc_on`] requests from threads of other nodes. One spin lock per node.
//!
//! Sub-allocator: the *active* superblock serves allocations until it is full; then the most
//! occupied superblock that has room becomes active. Occupancy order is kept in 8 groups of
//! 1/8 occupancy each (Hoard's fullness groups): O(1) per free instead of a priority queue, and
//! within a group the most recently freed-into superblock comes first. Free blocks of a
//! superblock form a LIFO list through the blocks themselves; never-used blocks are handed out by
//! a bump pointer, so a fresh superblock costs no page faults beyond the blocks used.

use core::cell::{Cell, UnsafeCell};
use core::ptr::null_mut;
use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    Ordering::*,
};

use crate::classes::{class_of, magic, LINE, MEDIUM_MAX, NCLASSES, NSMALL, SIZES, SMALL_MAX};
use crate::os::{self, NodeMap, MAX_CPUS, MAX_NODES};

const KIND_SB: u32 = 0x10c1_5b01;
const KIND_LARGE: u32 = 0x10c1_5b02;
const NGROUPS: usize = 8;
const NBINS: usize = 64;
const G_ACTIVE: u32 = 100;
const G_FULL: u32 = 101;
const G_SPARE: u32 = 102;
const G_CACHED: u32 = 103;
const PAGE: usize = 4096;
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
    /// Only in blocks of purging classes (the free list is doubly linked there).
    prev: *mut Free,
}

/// Classes whose blocks are at least this big give surplus pages back to the OS (see
/// [`trim`]); smaller classes hold enough blocks that their reserve is small.
const PURGE_MIN: usize = 8 * 1024;

#[repr(C, align(64))]
struct Superblock {
    kind: u32,
    node: u32,
    class: u32,
    /// 0..NGROUPS (listed in that group), or G_ACTIVE / G_FULL / G_SPARE / G_CACHED.
    group: u32,
    bsize: usize,
    magic: u64,
    /// First block; `end` = data + capacity * bsize.
    data: usize,
    end: usize,
    /// Next never-used block (bump <= end).
    bump: usize,
    /// LIFO list of freed blocks, linked through the blocks.
    free: *mut Free,
    /// Blocks handed out and not yet freed back (remote frees count once drained).
    used: u32,
    capacity: u32,
    /// Lowest `used` that still belongs to the current group; below it the superblock moves down.
    lo: u32,
    /// Purging class: `free` is a doubly linked LIFO (`tail` its oldest block), `hot` its
    /// length, `min_hot` its shortest length since the last trim, `pops` allocations since
    /// then, `cold` a list of blocks whose pages were given back.
    purging: u32,
    hot: u32,
    min_hot: u32,
    pops: u32,
    tail: *mut Free,
    cold: *mut Free,
    /// The heap that allocates from this superblock; null while cached.
    owner: AtomicPtr<Heap>,
    prev: *mut Superblock,
    next: *mut Superblock,
}

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
    active: *mut Superblock,
    /// One empty superblock kept back from the node so that a class that drains and refills
    /// does not go to the node lock every time.
    spare: *mut Superblock,
    groups: [*mut Superblock; NGROUPS],
}

#[repr(C)]
#[derive(Default)]
struct HeapStats {
    allocs: AtomicU64,
    frees: AtomicU64,
    requested: AtomicU64,
    live: AtomicI64,
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
    mismatch: u32,
    classes: [ClassState; NCLASSES],
    st: HeapStats,
    pool_next: *mut Heap,
    all_next: *mut Heap,
    shared: Shared,
    bins: [Bin; NBINS],
}

struct NodeInner {
    cache: *mut Superblock,
    cached: usize,
    pool: *mut Heap,
    shared_heap: *mut Heap,
}

#[repr(C, align(64))]
struct NodeState {
    lock: SpinLock,
    inner: UnsafeCell<NodeInner>,
    os_bytes: AtomicU64,
    sb_total: AtomicU64,
    sb_cached: AtomicU64,
    large_bytes: AtomicU64,
    large_count: AtomicU64,
    large_requested: AtomicU64,
    mbind_failures: AtomicU64,
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
static KEY: AtomicU32 = AtomicU32::new(0);
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);
static ALL_HEAPS: AtomicPtr<Heap> = AtomicPtr::new(null_mut());
static ORPHAN_REMOTE: AtomicU64 = AtomicU64::new(0);
static NODES: [NodeState; MAX_NODES] = [const {
    NodeState {
        lock: SpinLock::new(),
        inner: UnsafeCell::new(NodeInner {
            cache: null_mut(),
            cached: 0,
            pool: null_mut(),
            shared_heap: null_mut(),
        }),
        os_bytes: AtomicU64::new(0),
        sb_total: AtomicU64::new(0),
        sb_cached: AtomicU64::new(0),
        large_bytes: AtomicU64::new(0),
        large_count: AtomicU64::new(0),
        large_requested: AtomicU64::new(0),
        mbind_failures: AtomicU64::new(0),
    }
}; MAX_NODES];

thread_local! {
    // No destructor: a plain `#[thread_local]` that never allocates and is valid until the
    // thread's TLS is gone. Thread exit is seen through the pthread key below.
    static HEAP: Cell<*mut Heap> = const { Cell::new(null_mut()) };
}

/// Counter written by one thread at a time (the claim holder): a plain load + store.
#[inline]
fn bump(a: &AtomicU64, v: u64) {
    a.store(a.load(Relaxed).wrapping_add(v), Relaxed);
}
#[inline]
fn bump_i(a: &AtomicI64, v: i64) {
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
    /// Nodes the allocator knows (bit n = node n).
    pub nodes: u64,
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
            let region = SB_SIZE.load(Relaxed).next_power_of_two();
            os::REGION_SHIFT.store(
                (region.trailing_zeros() as usize).max(os::MIN_REGION_SHIFT),
                Relaxed,
            );
            // SAFETY: only this thread writes NODEMAP, before READY is published.
            let map = unsafe { &mut *NODEMAP.0.get() };
            map.read_sysfs();
            MULTI_NODE.store(map.nodes.count_ones() > 1, Relaxed);
            let mut key: libc::pthread_key_t = 0;
            // SAFETY: `key` is writable; the destructor has the C signature pthread expects.
            let r = unsafe { libc::pthread_key_create(&mut key, Some(thread_exit)) };
            if r != 0 {
                warn(&[b"loci-alloc: pthread_key_create failed; exiting threads keep their heaps until the process ends\n"]);
            }
            KEY.store(if r == 0 { key } else { u32::MAX }, Relaxed);
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
        nodes: nodemap().nodes,
    }
}

#[inline]
fn nodemap() -> &'static NodeMap {
    // SAFETY: called after ensure_init (READY observed with Acquire): NODEMAP is no longer written.
    unsafe { &*NODEMAP.0.get() }
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

fn acquire_sb(node: usize) -> *mut Superblock {
    let ns = &NODES[node];
    ns.lock.lock();
    // SAFETY: node lock held.
    let inner = unsafe { &mut *ns.inner.get() };
    let sb = inner.cache;
    if !sb.is_null() {
        // SAFETY: cached superblocks are valid mapped headers owned by the node.
        inner.cache = unsafe { (*sb).next };
        inner.cached -= 1;
        ns.sb_cached.fetch_sub(1, Relaxed);
    }
    ns.lock.unlock();
    if !sb.is_null() {
        return sb;
    }
    let size = SB_SIZE.load(Relaxed);
    let region = 1usize << os::REGION_SHIFT.load(Relaxed);
    let p = os::map_aligned(size, region);
    if p.is_null() {
        return null_mut();
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
    p as *mut Superblock
}

/// # Safety
/// `sb` must be empty and no longer referenced by any heap.
unsafe fn release_sb(sb: *mut Superblock) {
    let node = (*sb).node as usize;
    (*sb).owner.store(null_mut(), Relaxed);
    (*sb).group = G_CACHED;
    let ns = &NODES[node];
    ns.lock.lock();
    let inner = &mut *ns.inner.get();
    if inner.cached < CACHE_MAX.load(Relaxed) {
        (*sb).next = inner.cache;
        inner.cache = sb;
        inner.cached += 1;
        ns.sb_cached.fetch_add(1, Relaxed);
        ns.lock.unlock();
        return;
    }
    ns.lock.unlock();
    let size = SB_SIZE.load(Relaxed);
    os::mark(sb as usize, false);
    os::unmap(sb as *mut u8, size);
    ns.os_bytes.fetch_sub(size as u64, Relaxed);
    ns.sb_total.fetch_sub(1, Relaxed);
}

/// # Safety
/// `sb` is a superblock just acquired by the claim holder of `h`.
unsafe fn format_sb(sb: *mut Superblock, h: *mut Heap, c: usize) {
    let bsize = SIZES[c];
    let hdr = if c < NSMALL { 256 } else { PAGE };
    let base = sb as usize;
    let cap = (SB_SIZE.load(Relaxed) - hdr) / bsize;
    (*sb).kind = KIND_SB;
    (*sb).node = (*h).node as u32;
    (*sb).class = c as u32;
    (*sb).group = G_ACTIVE;
    (*sb).bsize = bsize;
    (*sb).magic = magic(bsize);
    (*sb).data = base + hdr;
    (*sb).end = base + hdr + cap * bsize;
    (*sb).bump = base + hdr;
    (*sb).free = null_mut();
    (*sb).used = 0;
    (*sb).capacity = cap as u32;
    (*sb).lo = 1;
    (*sb).purging = (bsize >= PURGE_MIN) as u32;
    (*sb).hot = 0;
    (*sb).min_hot = 0;
    (*sb).pops = 0;
    (*sb).tail = null_mut();
    (*sb).cold = null_mut();
    (*sb).owner.store(h, Relaxed);
    (*sb).prev = null_mut();
    (*sb).next = null_mut();
}

#[inline]
unsafe fn pop(sb: *mut Superblock) -> *mut u8 {
    if (*sb).purging != 0 {
        return pop_purging(sb);
    }
    let f = (*sb).free;
    if !f.is_null() {
        (*sb).free = (*f).next;
        (*sb).used += 1;
        return f as *mut u8;
    }
    bump_block(sb)
}

#[inline]
unsafe fn bump_block(sb: *mut Superblock) -> *mut u8 {
    let b = (*sb).bump;
    if b < (*sb).end {
        (*sb).bump = b + (*sb).bsize;
        (*sb).used += 1;
        return b as *mut u8;
    }
    null_mut()
}

unsafe fn pop_purging(sb: *mut Superblock) -> *mut u8 {
    (*sb).pops += 1;
    if (*sb).pops >= ((*sb).capacity / 4).max(8) {
        trim(sb);
    }
    let f = (*sb).free;
    if !f.is_null() {
        let n = (*f).next;
        (*sb).free = n;
        if n.is_null() {
            (*sb).tail = null_mut();
        } else {
            (*n).prev = null_mut();
        }
        (*sb).hot -= 1;
        if (*sb).hot < (*sb).min_hot {
            (*sb).min_hot = (*sb).hot;
        }
        (*sb).used += 1;
        return f as *mut u8;
    }
    let c = (*sb).cold;
    if !c.is_null() {
        (*sb).cold = (*c).next;
        (*sb).used += 1;
        return c as *mut u8;
    }
    bump_block(sb)
}

/// Gives back the pages of the blocks that stayed free through a whole epoch (`capacity`
/// allocations from this superblock): the `min_hot` oldest blocks of the LIFO were not needed
/// in that time. Without this a class that holds few big blocks keeps the pages of its
/// all-time peak, and with 62 classes per thread those peaks add up to far more than the
/// bytes in use (the `buffer-passing` bench measured RSS 1.7x requested without it).
#[cold]
unsafe fn trim(sb: *mut Superblock) {
    let mut k = (*sb).min_hot;
    while k > 0 {
        let t = (*sb).tail;
        if t.is_null() {
            break;
        }
        let p = (*t).prev;
        (*sb).tail = p;
        if p.is_null() {
            (*sb).free = null_mut();
        } else {
            (*p).next = null_mut();
        }
        (*sb).hot -= 1;
        // keep the first page (it holds the link), give back the rest
        let from = (t as usize + 16 + PAGE - 1) & !(PAGE - 1);
        let to = (t as usize + (*sb).bsize) & !(PAGE - 1);
        if to > from {
            libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_DONTNEED);
        }
        (*t).next = (*sb).cold;
        (*sb).cold = t;
        k -= 1;
    }
    (*sb).pops = 0;
    (*sb).min_hot = (*sb).hot;
}

#[inline]
unsafe fn block_start(sb: *mut Superblock, p: usize) -> usize {
    let off = p.wrapping_sub((*sb).data);
    let idx = ((off as u128 * (*sb).magic as u128) >> 64) as usize;
    (*sb).data + idx * (*sb).bsize
}

// ---------------------------------------------------------------------------------------------
// Occupancy groups (claim holder only)

unsafe fn unlink(h: *mut Heap, sb: *mut Superblock) {
    let g = (*sb).group as usize;
    let cs = &mut (*h).classes[(*sb).class as usize];
    if (*sb).prev.is_null() {
        cs.groups[g] = (*sb).next;
    } else {
        (*(*sb).prev).next = (*sb).next;
    }
    if !(*sb).next.is_null() {
        (*(*sb).next).prev = (*sb).prev;
    }
    (*sb).prev = null_mut();
    (*sb).next = null_mut();
}

/// Files a non-active superblock under its occupancy group (or as spare / back to the node).
unsafe fn file(h: *mut Heap, sb: *mut Superblock) {
    let c = (*sb).class as usize;
    let used = (*sb).used as usize;
    let cap = (*sb).capacity as usize;
    if used == 0 {
        let cs = &mut (*h).classes[c];
        if cs.spare.is_null() {
            cs.spare = sb;
            (*sb).group = G_SPARE;
        } else {
            release_sb(sb);
        }
        return;
    }
    if used == cap {
        (*sb).group = G_FULL;
        return;
    }
    let g = used * NGROUPS / cap;
    (*sb).lo = ((g * cap).div_ceil(NGROUPS)).max(1) as u32;
    (*sb).group = g as u32;
    let cs = &mut (*h).classes[c];
    (*sb).prev = null_mut();
    (*sb).next = cs.groups[g];
    if !cs.groups[g].is_null() {
        (*cs.groups[g]).prev = sb;
    }
    cs.groups[g] = sb;
}

#[inline]
unsafe fn local_free(h: *mut Heap, sb: *mut Superblock, blk: usize) {
    let f = blk as *mut Free;
    if (*sb).purging != 0 {
        let h0 = (*sb).free;
        (*f).prev = null_mut();
        (*f).next = h0;
        if h0.is_null() {
            (*sb).tail = f;
        } else {
            (*h0).prev = f;
        }
        (*sb).hot += 1;
    } else {
        (*f).next = (*sb).free;
    }
    (*sb).free = f;
    (*sb).used -= 1;
    bump(&(*h).st.frees, 1);
    bump_i(&(*h).st.live, -((*sb).bsize as i64));
    let g = (*sb).group;
    if g == G_ACTIVE {
        return;
    }
    if g == G_FULL {
        file(h, sb);
    } else if (*sb).used < (*sb).lo {
        unlink(h, sb);
        file(h, sb);
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
                local_free(h, base as *mut Superblock, f as usize);
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
            release_sb(s);
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
    HEAP.with(|c| {
        if c.get() == h {
            c.set(null_mut())
        }
    });
    // SAFETY: the pthread value is this thread's heap, whose claim it holds.
    abandon(h);
}

#[inline]
fn tls_heap() -> *mut Heap {
    HEAP.with(|c| c.get())
}

fn set_thread_heap(h: *mut Heap) {
    HEAP.with(|c| c.set(h));
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
    if n == (*h).node {
        (*h).mismatch = 0;
        return h;
    }
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
    // SAFETY: `h` is this thread's heap.
    if MULTI_NODE.load(Relaxed) && unsafe { current_node() != (*h).node } {
        // SAFETY: as above.
        h = unsafe { check_node(h) };
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
            bump(&(*h).st.allocs, 1);
            bump(&(*h).st.requested, size as u64);
            bump_i(&(*h).st.live, SIZES[c] as i64);
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
        (*old).group = G_FULL;
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
        sb = acquire_sb((*h).node);
        if sb.is_null() {
            return null_mut();
        }
        format_sb(sb, h, c);
    }
    (*sb).group = G_ACTIVE;
    (*h).classes[c].active = sb;
    let p = pop(sb);
    bump(&(*h).st.allocs, 1);
    bump(&(*h).st.requested, size as u64);
    bump_i(&(*h).st.live, SIZES[c] as i64);
    p
}

unsafe fn alloc_large(size: usize, align: usize, node: usize) -> *mut u8 {
    let off = align.max(LINE);
    let Some(len) = off.checked_add(size).and_then(|l| l.checked_add(PAGE - 1)) else {
        return null_mut();
    };
    let len = len / PAGE * PAGE;
    let region = (1usize << os::REGION_SHIFT.load(Relaxed)).max(align);
    let p = os::map_aligned(len, region);
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
    let l = p as *mut Large;
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
    let l = base as *mut Large;
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
#[inline]
pub unsafe fn alloc(size: usize, align: usize) -> *mut u8 {
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
            return alloc_class(h, class_of(size), size);
        }
    }
    alloc_aligned_slow(size, align)
}

#[cold]
unsafe fn alloc_aligned_slow(size: usize, align: usize) -> *mut u8 {
    if align <= LINE && size > SMALL_MAX && size <= MEDIUM_MAX {
        // medium blocks are cache-line aligned already
        let h = heap();
        if h.is_null() {
            return h as *mut u8;
        }
        return alloc_class(h, class_of(size), size);
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
        let p = alloc_class(h, class_of(padded), size);
        if p.is_null() {
            return p;
        }
        return ((p as usize + align - 1) & !(align - 1)) as *mut u8;
    }
    let h = heap();
    let node = if h.is_null() {
        current_node()
    } else {
        (*h).node
    };
    alloc_large(size, align, node)
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
        if *(base as *const u32) == KIND_LARGE {
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
#[inline]
pub unsafe fn free(p: *mut u8) {
    if p.is_null() {
        return;
    }
    let Some(base) = os::region_of(p as usize) else {
        __libc_free(p);
        return;
    };
    if *(base as *const u32) == KIND_LARGE {
        free_large(base);
        return;
    }
    let sb = base as *mut Superblock;
    let blk = block_start(sb, p as usize);
    let h = tls_heap();
    let owner = (*sb).owner.load(Relaxed);
    if owner == h && !h.is_null() {
        local_free(h, sb, blk);
    } else {
        remote_free(h, owner, blk);
    }
}

#[cold]
unsafe fn remote_free(h: *mut Heap, owner: *mut Heap, blk: usize) {
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
    if h.is_null() {
        ORPHAN_REMOTE.fetch_add(1, Relaxed);
    } else {
        bump(&(*h).st.remote_sent, 1);
    }
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
    if *(base as *const u32) == KIND_LARGE {
        return Some(base + (*(base as *const Large)).map_len - p as usize);
    }
    let sb = base as *mut Superblock;
    Some(block_start(sb, p as usize) + (*sb).bsize - p as usize)
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
    /// The OS refused the memory.
    OutOfMemory { size: usize },
    /// The alignment is not a power of two.
    BadAlign { align: usize },
}

impl core::fmt::Display for AllocError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AllocError::NoSuchNode { node, valid } => {
                write!(f, "node {node} does not exist; valid nodes: ")?;
                let mut first = true;
                for n in 0..64 {
                    if valid >> n & 1 == 1 {
                        write!(f, "{}{n}", if first { "" } else { "," })?;
                        first = false;
                    }
                }
                Ok(())
            }
            AllocError::OutOfMemory { size } => write!(f, "out of memory allocating {size} bytes"),
            AllocError::BadAlign { align } => {
                write!(f, "alignment {align} is not a power of two")
            }
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
    if !align.is_power_of_two() {
        return Err(AllocError::BadAlign { align });
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
    let c = class_of(padded);
    let mine = tls_heap();
    let p = if !mine.is_null() && (*mine).node == node {
        alloc_class(mine, c, size)
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
        let p = alloc_class(h, c, size);
        (*h).shared.claim.store(0, SeqCst);
        collect(h);
        p
    };
    if p.is_null() {
        return oom;
    }
    Ok(((p as usize + align - 1) & !(align - 1)) as *mut u8)
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
    // SAFETY: region starts hold a header whose second word is the node (both layouts).
    Some(unsafe { (*(base as *const Large)).node } as usize)
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
        nodes_online: nodemap().nodes,
        nodes: [NodeStats::default(); MAX_NODES],
    };
    let mut h = ALL_HEAPS.load(Acquire);
    while !h.is_null() {
        // SAFETY: heaps are never unmapped; counters are atomics.
        unsafe {
            let st = &(*h).st;
            s.allocs += st.allocs.load(Relaxed);
            s.frees += st.frees.load(Relaxed);
            s.bytes_requested += st.requested.load(Relaxed);
            s.live_block_bytes += st.live.load(Relaxed);
            s.cross_thread_frees += st.remote_sent.load(Relaxed);
            s.recollected += st.remote_received.load(Relaxed);
            s.heaps += 1;
            h = (*h).all_next;
        }
    }
    for (i, ns) in NODES.iter().enumerate() {
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
        };
    }
    s
}
