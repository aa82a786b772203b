//! The allocator's counters: [`stats`] sums the heaps' and the nodes' counters into a
//! [`AllocStats`] snapshot with per-node [`NodeStats`].

use core::sync::atomic::Ordering::{Acquire, Relaxed};

use super::config::{ensure_init, home, nodemap};
use super::deallocate::ORPHAN_REMOTE;
use super::heap::ALL_HEAPS;
use super::structs::NODES;
use crate::classes::SIZES;
use crate::os::MAX_NODES;

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
    /// Bytes of free spans' pages given back to the OS so far (when a large block is mapped
    /// while free pages sit resident in the superblocks).
    pub purged_bytes: u64,
}

/// A snapshot of the allocator's counters (summed without stopping threads: each counter is
/// exact, their sum may mix moments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocStats {
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

/// The counters `loci_alloc_stats(u64 *out, size_t n)` of libloci_malloc.so writes, by name, in
/// the order it writes them ([`AllocStats::counters`]): the one definition of that C ABI, used by the
/// library and by the programs that read it (`loci bench alloc`). The node counters
/// (`os_bytes` .. `mbind_failures`) are summed over nodes.
pub const COUNTERS: [&str; 13] = [
    "allocs",
    "frees",
    "bytes_requested",
    "live_block_bytes",
    "cross_thread_frees",
    "recollected",
    "heaps",
    "os_bytes",
    "superblocks_in_use",
    "superblocks_cached",
    "large_bytes",
    "mbind_failures",
    "memoryless_fallbacks",
];

/// The counter of thread heaps started on a node without memory (served by the nearest node
/// with memory).
pub const MEMORYLESS_FALLBACKS: &str = COUNTERS[12];

impl AllocStats {
    /// Sum of `os_bytes` over nodes.
    pub fn os_bytes(&self) -> u64 {
        self.nodes.iter().map(|n| n.os_bytes).sum()
    }

    /// The values of [`COUNTERS`], in that order.
    pub fn counters(&self) -> [u64; COUNTERS.len()] {
        let sum = |f: fn(&NodeStats) -> u64| self.nodes.iter().map(f).sum::<u64>();
        [
            self.allocs,
            self.frees,
            self.bytes_requested,
            self.live_block_bytes.max(0) as u64,
            self.cross_thread_frees,
            self.recollected,
            self.heaps,
            self.os_bytes(),
            sum(|n| n.superblocks_in_use),
            sum(|n| n.superblocks_cached),
            sum(|n| n.large_bytes),
            sum(|n| n.mbind_failures),
            self.memoryless_fallbacks,
        ]
    }
}

/// Current counters.
pub fn stats() -> AllocStats {
    ensure_init();
    let mut s = AllocStats {
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
                s.bytes_requested += cs.requested.load(Relaxed);
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
            purged_bytes: ns.purged.load(Relaxed),
        };
        s.memoryless_fallbacks += s.nodes[i].fallback_heaps;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each value of `counters()` is the field its name in `COUNTERS` says.
    #[test]
    fn counters_are_in_the_order_of_their_names() {
        let mut s = stats();
        s.allocs = 1;
        s.frees = 2;
        s.bytes_requested = 3;
        s.live_block_bytes = 4;
        s.cross_thread_frees = 5;
        s.recollected = 6;
        s.heaps = 7;
        s.memoryless_fallbacks = 13;
        s.nodes = [NodeStats::default(); MAX_NODES];
        s.nodes[1] = NodeStats {
            os_bytes: 8,
            superblocks_in_use: 9,
            superblocks_cached: 10,
            large_bytes: 11,
            mbind_failures: 12,
            ..NodeStats::default()
        };
        let want: Vec<u64> = (1..=13).collect();
        assert_eq!(s.counters().to_vec(), want, "{COUNTERS:?}");
        assert_eq!(MEMORYLESS_FALLBACKS, "memoryless_fallbacks");
        let mut names = COUNTERS.to_vec();
        names.dedup();
        assert_eq!(names.len(), COUNTERS.len());
    }
}
