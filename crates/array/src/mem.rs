//! Chunk memory: loci-place's memory policies give every chunk of an array its home, and one
//! [`NodeRegion`] (the arena) holds the chunks, each placed with `mbind` before its first touch.
//!
//! Chunk `i` of `n` gets part `i` of the policy's plan ([`MemPlan::part`]): `round-robin[:NODES]`
//! binds it to the `i mod k`-th node, `per-node[:NODES]` gives each node a contiguous share.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use loci_place::region::NodeRegion;
use loci_place::{MemPlan, MemPolicy};
use loci_topo::{NodeSet, Topology};
use serde::{Deserialize, Serialize};

use crate::error::ArrayError;
use crate::pool::{Binding, BufferPool, Pooled};

/// Where a chunk's pages live (planned or observed when it was first touched).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Home {
    /// All pages on this node (bound there, or first-touched by a thread running there).
    Node(u32),
    /// Pages spread round-robin over these nodes.
    Interleave(NodeSet),
    /// Not known (first touch by an unpinned thread whose cpu was not read).
    Unknown,
}

impl fmt::Display for Home {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Home::Node(n) => write!(f, "node {n}"),
            Home::Interleave(s) => write!(f, "interleaved over {s}"),
            Home::Unknown => f.write_str("unknown"),
        }
    }
}

/// The memory policies that give every chunk of an array a home, for error messages and `--help`.
pub const CHUNK_POLICIES: &str = "first-touch, localalloc, interleave[:NODES], bind:N, preferred:N, per-node[:NODES], round-robin[:NODES]";

/// Parses a chunk memory policy (loci-place's spelling) and checks it against `topo`: nodes
/// must be present, allowed and have memory, and the policy must give each chunk one home
/// ([`CHUNK_POLICIES`]).
pub fn chunk_policy(text: &str, topo: &Topology) -> Result<MemPolicy, ArrayError> {
    let p: MemPolicy = text
        .parse()
        .map_err(|e| ArrayError::Parse(format!("chunk memory: {e}")))?;
    chunk_homes(&p, topo, 1)?;
    Ok(p)
}

/// The planned home of each of `chunks` chunks placed by `policy` on `topo` (first touch and
/// `localalloc`: not known until touched). A policy that leaves a chunk's node to the kernel
/// among several nodes (`bind` or `preferred-many` over a set, `weighted-interleave`) is an
/// error naming the valid ones.
pub fn chunk_homes(
    policy: &MemPolicy,
    topo: &Topology,
    chunks: usize,
) -> Result<Vec<Home>, ArrayError> {
    let (plan, _notes) = policy
        .resolve(topo)
        .map_err(|e| ArrayError::Parse(format!("chunk memory: {e}")))?;
    (0..chunks)
        .map(|i| match (plan.part_node(i, chunks), plan.policy) {
            (Some(n), _) => Ok(Home::Node(n)),
            (None, "interleave") => Ok(Home::Interleave(plan.nodes.clone())),
            (None, "first-touch" | "localalloc") => Ok(Home::Unknown),
            _ => Err(ArrayError::Parse(format!(
                "chunk memory `{policy}` gives a chunk no single home; valid: {CHUNK_POLICIES} (round-robin:NODES deals chunks over the nodes)"
            ))),
        })
        .collect()
}

/// One anonymous private mapping: unmapped on drop, or given back to the result-buffer pool it
/// came from (see [`crate::pool`]). Zero-length regions map nothing.
pub struct Region {
    map: Option<NodeRegion>,
    len: usize,
    /// Where the region goes when dropped, and the binding of its pages it goes there with.
    pool: Option<(Arc<BufferPool>, Binding)>,
}

impl Region {
    /// Maps `len` bytes (rounded up to pages), untouched: the pages are placed at first touch
    /// unless [`Region::place`] sets a policy first. `huge` asks for transparent huge pages
    /// (`madvise(MADV_HUGEPAGE)`; a mapping of 2 MiB or more is then 2 MiB aligned and rounded up
    /// to 2 MiB, so every part of it can be a huge page).
    pub fn map(len: usize, huge: bool) -> Result<Self, ArrayError> {
        if len == 0 {
            return Ok(Self {
                map: None,
                len: 0,
                pool: None,
            });
        }
        let m = NodeRegion::map(len, &MemPlan::first_touch(), huge)
            .map_err(|e| ArrayError::Memory(e.to_string()))?;
        Ok(Self {
            map: Some(m),
            len,
            pool: None,
        })
    }

    /// A region of `len` bytes on a buffer taken from `pool`; it goes back there when dropped.
    pub(crate) fn from_pooled(p: Pooled, len: usize, pool: Arc<BufferPool>) -> Self {
        debug_assert!(len <= p.map.len() && len <= p.binding.len());
        Self {
            map: Some(p.map),
            len,
            pool: Some((pool, p.binding)),
        }
    }

    /// Binds every page of the (untouched) region as `binding` says (`MPOL_BIND`, one `mbind` per
    /// segment; the binding must cover the region's mapped bytes), and makes the region go back to
    /// `pool` with that binding when dropped.
    pub(crate) fn bind_for_pool(
        &mut self,
        binding: Binding,
        pool: Arc<BufferPool>,
    ) -> Result<(), ArrayError> {
        let Some(m) = &self.map else {
            return Ok(());
        };
        assert_eq!(binding.len(), m.len(), "a binding covers the whole mapping");
        for (r, n) in binding.segments() {
            self.place(r.start, r.end - r.start, &Home::Node(*n))?;
        }
        self.pool = Some((pool, binding));
        Ok(())
    }

    /// Bytes mapped (the length rounded up to pages or huge pages; for a pooled buffer, its size).
    pub fn mapped(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    /// The binding of a region that came from or goes to a result-buffer pool (every page bound
    /// to the node it names before its first touch); `None` for other regions.
    pub fn binding(&self) -> Option<&Binding> {
        self.pool.as_ref().map(|(_, b)| b)
    }

    fn base(&self) -> *mut u8 {
        self.map
            .as_ref()
            .map_or(NonNull::dangling().as_ptr(), |m| m.as_ptr())
    }

    /// Sets the policy of the bytes `offset..offset+len` (widened to whole pages; `offset` must
    /// be page aligned) to `home`, before any of them is touched.
    pub fn place(&self, offset: usize, len: usize, home: &Home) -> Result<(), ArrayError> {
        let ps = loci_place::sys::page_size();
        let mapped = self.mapped();
        if len == 0 || mapped == 0 {
            return Ok(());
        }
        assert!(
            offset.is_multiple_of(ps) && offset < mapped,
            "page-aligned offset inside the mapping"
        );
        let plan = match home {
            Home::Node(n) => MemPlan::bind(*n),
            Home::Interleave(s) => MemPlan::interleave(s.clone()),
            Home::Unknown => return Ok(()),
        };
        self.map
            .as_ref()
            .map_or(Ok(()), |m| m.place(offset, len, &plan))
            .map_err(|e| ArrayError::Memory(format!("placing a chunk on {home}: {e}")))
    }

    /// Bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.base()
    }

    /// Raw pointer for writes through `&self`; callers must keep writes disjoint and not overlap
    /// any live shared slice of the same bytes.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.base()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `mapped >= len` bytes, readable, and lives as long as `self`
        // (a dangling pointer with len 0 is a valid empty slice).
        unsafe { std::slice::from_raw_parts(self.base(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.base(), self.len) }
    }

    /// Node of the pages holding the given byte offsets (`move_pages` query; negative values are
    /// `-errno`, `-ENOENT` for a page not touched yet).
    pub fn nodes_at(&self, offsets: &[usize]) -> Result<Vec<i32>, ArrayError> {
        let Some(m) = &self.map else {
            return Ok(Vec::new());
        };
        m.nodes_at(offsets.iter().copied().filter(|&o| o < self.len))
            .map_err(|e| ArrayError::Memory(format!("move_pages query failed: {e}")))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // A pooled region goes back with its binding; any other mapping is unmapped (Mapping's
        // own drop).
        if let (Some(map), Some((pool, binding))) = (self.map.take(), self.pool.take()) {
            pool.give(Pooled { map, binding });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_maps_places_and_reads_back() {
        let mut r = Region::map(3 * 4096 + 5, false).unwrap();
        r.place(0, r.len(), &Home::Node(0)).unwrap();
        r.as_mut_slice().fill(7);
        assert!(r.as_slice().iter().all(|&b| b == 7));
        let nodes = r.nodes_at(&[0, 4096, 3 * 4096]).unwrap();
        assert_eq!(nodes, vec![0, 0, 0]);
        assert!(Region::map(0, false).unwrap().as_slice().is_empty());
    }

    #[test]
    fn chunk_homes_follow_the_part_order_and_refuse_sets() {
        let topo = loci_place::testing::regular(3, 2, 1, 1);
        let homes = |p: &str| {
            chunk_homes(&p.parse().unwrap(), &topo, 6).map(|v| {
                v.iter()
                    .map(|h| h.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
        };
        let nodes = |v: &[u32]| {
            v.iter()
                .map(|n| format!("node {n}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert_eq!(homes("round-robin").unwrap(), nodes(&[0, 1, 2, 0, 1, 2]));
        assert_eq!(homes("per-node:1-2").unwrap(), nodes(&[1, 1, 1, 2, 2, 2]));
        assert_eq!(homes("bind:2").unwrap(), nodes(&[2; 6]));
        assert!(homes("interleave")
            .unwrap()
            .starts_with("interleaved over 0-2,"));
        assert_eq!(homes("first-touch").unwrap(), ["unknown"; 6].join(","));
        let e = homes("bind:0-1").unwrap_err().to_string();
        assert!(e.contains("bind:0-1") && e.contains(CHUNK_POLICIES), "{e}");
        let e = chunk_policy("bind", &topo).unwrap_err().to_string();
        assert!(e.contains("needs a node list"), "{e}");
    }

    #[test]
    fn binding_to_a_missing_node_fails_clearly() {
        let r = Region::map(4096, false).unwrap();
        let e = r.place(0, 4096, &Home::Node(1000)).unwrap_err().to_string();
        assert!(e.contains("node 1000"), "{e}");
    }
}
