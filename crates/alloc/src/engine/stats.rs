//! The allocator's counters: [`stats`] sums the heaps' and the nodes' counters into a
//! [`Stats`] snapshot with per-node [`NodeStats`].

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
