//! The allocator engine (seed 003, section 5).
//!
//! Glossary and invariants:
//! * **region**: an allocator mapping whose start is aligned to the region alignment and marked
//!   in the region map ([`os::region`]) with its kind (superblock or large block); its first
//!   page holds a header (at `os::header_of(base)`) whose first word is its node.
//! * **superblock**: a region of `superblock size` bytes (10 MiB by default), mapped and bound
//!   to one node with `mbind`; its node never changes. It is carved into **runs** (spans of
//!   whole 1 KiB units): a unit map in its header names the run of every unit.
//! * **run**: a class run (blocks of one class below 8 KiB, about 64 KiB of them, served by one
//!   heap's sub-allocator), a block run (one block of 8 KiB or more, see `SPAN_MIN`), or a
//!   free span. Free spans coalesce with free neighbours; a superblock whose runs are all free
//!   goes to its node's cache.
//! * **heap**: the local allocator of one thread (seed 003's "local memory allocator"): one
//!   sub-allocator ([`ClassState`]) per class, 63 recollection bins, counters. A heap serves one
//!   node. Exactly one thread holds a heap's `claim` at a time, and only it touches the heap's
//!   owner-side fields and the fields of its class runs that change; everything else goes
//!   through the bins.
//! * **recollection bin**: the blocks other threads freed into a heap, as batches of block
//!   addresses (or, as a fallback, chains through the blocks) on two lock-free stacks (freers
//!   push with a compare-and-swap, the owner takes all with one swap); bin `i`
//!   takes the frees of threads whose heap id mod 63 is `i` (a private bin per (owner,
//!   freer) pair up to 63 threads; beyond that pairs share bins, still correct).
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
//!
//! The files:
//! * `structs`: the data structures (superblock header, run descriptor, heap, node state,
//!   span pools) and the per-node state array.
//! * `config`: settings from the environment, one-time init, the node map.
//! * `superblock`: mapping, formatting and releasing a node's superblocks.
//! * `spans`: run descriptors, the unit map and a node's free spans (node lock held).
//! * `class_run`: a heap's per-class sub-allocator: class runs and their occupancy groups
//!   (claim holder only).
//! * `blocks`: blocks of [`SPAN_MIN`] bytes or more (node spans) and large blocks (mappings).
//! * `heap`: thread heaps: creation, adoption, recollection bins, thread exit, the TLS slot.
//! * `allocate` and `deallocate`: the public allocation and free paths.
//! * `node_api`: allocation on a given node ([`alloc_on`]), [`node_of`], [`task_finished`].
//! * `stats`: the counters ([`stats()`]).
//!
//! [`os::region`]: crate::os::region
//! [`ClassState`]: structs::ClassState

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

mod allocate;
mod blocks;
mod class_run;
mod config;
mod deallocate;
mod heap;
mod node_api;
mod spans;
mod stats;
mod structs;
mod superblock;

pub use allocate::{
    alloc, alloc_full, alloc_small_fast, alloc_zeroed, realloc, sys_usable_size, usable_size,
};
pub use config::{config, AllocConfig};
pub use deallocate::{free, free_full};
pub use node_api::{alloc_on, node_of, task_finished, AllocError};
pub use stats::{stats, AllocStats, NodeStats, COUNTERS, MEMORYLESS_FALLBACKS};
pub use structs::SPAN_MIN;

/// Occupancy groups of a class's runs: group g lists the runs with about g/NGROUPS of their
/// blocks in use.
const NGROUPS: usize = 8;
/// Recollection bins of a heap: blocks other threads freed, binned by the freeing heap's id.
/// One bit of the heap's pending mask each; the mask's last bit is [`SLOW`].
const NBINS: usize = 63;
/// The bit of a heap's pending mask that keeps its small allocations off the fast path (set
/// for the heap's life when small blocks are delegated or the machine has several nodes, see
/// [`FAST_SMALL`](config::FAST_SMALL)): the fast path tests one word, the mask, for both.
const SLOW: u64 = 1 << 63;
const _: () = assert!(NBINS < 64);
/// The `group` of a class run that is in no list: the active run, a full run, the spare.
const G_ACTIVE: u32 = 100;
const G_FULL: u32 = 101;
const G_SPARE: u32 = 102;
/// The page size the allocator assumes.
const PAGE: usize = 4096;
/// Granule of runs and spans: 1 KiB, not a page. Rounding blocks of 8..32 KiB up to whole
/// pages wasted 5% of `buffer-passing`'s bytes (up to 17% of a 9 KiB block); with 1 KiB units
/// neighbours share their boundary pages instead.
const UNIT: usize = 1024;
/// Where a superblock's unit map starts, from its base (its header sits in the first page).
const MAP_OFF: usize = PAGE;
/// Run descriptors sit at a multiple of this from their superblock's base (their size): a
/// unit map entry is a descriptor's offset in these steps, so `free` finds a block's run
/// from the entry by address arithmetic alone.
const DESC_ALIGN: usize = 128;
/// Largest superblock (`LOCI_ALLOC_SUPERBLOCK`): its map entries must fit 16 bits (see
/// `superblock::format_sb`).
const MAX_SUPERBLOCK: usize = 64 << 20;
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

/// Counter written by one thread at a time (the claim holder): a plain load + store.
#[inline]
fn bump(a: &AtomicU64, v: u64) {
    a.store(a.load(Relaxed).wrapping_add(v), Relaxed);
}
