//! Configuration and init: the settings read once from the environment ([`AllocConfig`]), the
//! one-time initialization (node map, memory nodes, the thread-exit key), and the lookups that
//! depend on it (the node map, a node's memory node, the current cpu's node).

use core::cell::UnsafeCell;
use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU32, AtomicU8, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

use super::allocate::region_size;
use super::heap::thread_exit;
use super::structs::NODES;
use super::{DEFAULT_CACHE, DEFAULT_SUPERBLOCK, MAX_SUPERBLOCK, PAGE};
use crate::os::{self, NodeMap, MAX_CPUS, MAX_NODES};

struct Global<T>(UnsafeCell<T>);
// SAFETY: written once by the initializing thread before INIT becomes READY (Release), read
// only after observing READY (Acquire). That thread gets `&mut T` (T: Send, as for OnceLock),
// and then every thread shares `&T` (T: Sync).
unsafe impl<T: Send + Sync> Sync for Global<T> {}

const UNINIT: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;
static INIT: AtomicU8 = AtomicU8::new(UNINIT);
static NODEMAP: Global<NodeMap> = Global(UnsafeCell::new(NodeMap::single()));
pub(super) static MULTI_NODE: AtomicBool = AtomicBool::new(false);
/// Per node: the node whose memory its threads get (itself, or the nearest node with memory).
static HOME: Global<[u8; MAX_NODES]> = Global(UnsafeCell::new([0; MAX_NODES]));
pub(super) static SB_SIZE: AtomicUsize = AtomicUsize::new(DEFAULT_SUPERBLOCK);
pub(super) static CACHE_MAX: AtomicUsize = AtomicUsize::new(DEFAULT_CACHE);
pub(super) static MPOL: AtomicI32 = AtomicI32::new(os::MPOL_PREFERRED);
/// Small blocks (<= 7168 B) from loci's own classes (true) or from glibc (false).
///
/// Own by measurement: `general` of `loci bench alloc`, whose operations are mostly blocks
/// below 8 KiB, runs faster with own small classes than with glibc as the delegate (the numbers
/// are in docs/alloc.md, "Small blocks: own classes or glibc"); own classes also put small
/// blocks on the thread's node, which glibc's arenas do not. `LOCI_ALLOC_SMALL=system` keeps
/// the delegate for comparison.
pub(super) static SMALL_OWN: AtomicBool = AtomicBool::new(true);
/// Set once at init, before `INIT` turns `READY`: small blocks are loci's own and the machine
/// has one node, so `alloc` of a small block needs only the thread's heap (one flag load in
/// place of the init, delegation and node checks).
pub(super) static FAST_SMALL: AtomicBool = AtomicBool::new(false);
/// Superblocks are advised as transparent huge pages (`madvise(MADV_HUGEPAGE)`) only on request
/// (`LOCI_ALLOC_HUGEPAGES=on`; the kernel honours it where
/// `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` or `always`, and with `always`
/// the kernel backs superblocks with huge pages without the advice).
///
/// Why off by default: a 2 MiB page is taken from the kernel's free 2 MiB blocks, which are the
/// ones a hypervisor with free page reporting (virtio-balloon) has taken back, so the first
/// touch of each pays a host fault for all of it, while 4 KiB faults are served from fragments
/// the host still backs. On this project's KVM guest the advice made the first touch of fresh
/// memory over ten times slower and loci about half as fast in `loci bench alloc` (the numbers
/// are in docs/alloc.md, "This host and huge pages"). jemalloc, tcmalloc and mimalloc do not
/// advise huge pages by default either. What the advice buys where 2 MiB pages are cheap:
/// TLB reach for workloads that touch blocks at random over more memory than the TLB covers
/// (a superblock, 10 MiB aligned to 16 MiB, is five whole 2 MiB pages with its header, unit
/// map and run descriptors in the first); its cost: memory faulted in 2 MiB at a time (RSS
/// may round up by up to 2 MiB per partly used piece), and compaction at such a fault. Large
/// blocks (> 512 KiB, their own mappings) follow the system's setting either way.
pub(super) static HUGEPAGES: AtomicBool = AtomicBool::new(false);
pub(super) static KEY: AtomicU32 = AtomicU32::new(0);

/// The allocator's settings, fixed at first use from the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocConfig {
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
pub(super) fn ensure_init() {
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
                    Some(s) if (2 << 20..=MAX_SUPERBLOCK).contains(&s) => {
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
                // A count: plain digits (a K/M suffix would be read as a size).
                match os::parse_size(v).filter(|_| v.iter().all(u8::is_ascii_digit)) {
                    Some(n) if n <= 1 << 20 => CACHE_MAX.store(n, Relaxed),
                    _ => warn(&[
                        b"loci-alloc: LOCI_ALLOC_CACHE=",
                        v,
                        b" is not a count of superblocks from 0 to 1048576; using 8\n",
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
            os::set_region_shift(region.trailing_zeros() as usize);
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
pub fn config() -> AllocConfig {
    ensure_init();
    AllocConfig {
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
pub(super) fn nodemap() -> &'static NodeMap {
    // SAFETY: called after ensure_init (READY observed with Acquire): NODEMAP is no longer written.
    unsafe { &*NODEMAP.0.get() }
}

/// The node whose memory threads of `node` get (see [`NodeMap::memory_node`]).
#[inline]
pub(super) fn home(node: usize) -> usize {
    // SAFETY: written before READY, read-only afterwards (callers run after ensure_init).
    unsafe { (*HOME.0.get())[node] as usize }
}

/// A thread starts on a node without memory: counted, and said once per node on stderr
/// (`LOCI_ALLOC_QUIET=1` silences it), since its blocks cannot be where it runs.
#[cold]
pub(super) fn memoryless_fallback(node: usize) {
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
pub(super) fn current_node() -> usize {
    let cpu = os::current_cpu();
    if cpu < MAX_CPUS {
        nodemap().cpu_node[cpu] as usize
    } else {
        0
    }
}
