//! Chunk memory: anonymous mappings whose chunks are placed on their home nodes with `mbind`.
//!
//! Hand-written on `mmap`/`mbind` (through loci-place's checked syscalls) because the policy has
//! to be set on the exact range of each chunk before its first touch, which no allocator API does.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use loci_place::policy::MemPlan;
use loci_place::sys::AnonMap;
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

/// How the chunks of a new array get their home nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChunkMem {
    /// No policy: pages land where the generating thread runs (its node is recorded as home).
    FirstTouch,
    /// Chunk `i` is bound (`MPOL_BIND`) to the `i mod k`-th of these nodes.
    Bind(NodeSet),
    /// Every chunk's pages interleaved over these nodes (`MPOL_INTERLEAVE`).
    Interleave(NodeSet),
}

impl ChunkMem {
    /// Valid spellings, for error messages and `--help`.
    pub const CHOICES: &'static str =
        "first-touch, bind[:NODES], interleave[:NODES] (NODES defaults to every node with memory)";

    /// Parses `first-touch`, `bind[:NODES]`, `interleave[:NODES]`; node lists are checked
    /// against the nodes of `topo` that have memory and may be used.
    pub fn parse(s: &str, topo: &Topology) -> Result<Self, ArrayError> {
        let s = s.trim();
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let mems = topo.allowed_mems();
        let nodes = |arg: Option<&str>| -> Result<NodeSet, ArrayError> {
            let set = match arg {
                None => mems.clone(),
                Some(a) => NodeSet::parse_in(a, &mems)
                    .map_err(|e| ArrayError::Parse(format!("chunk memory `{s}`: {e}")))?,
            };
            if set.is_empty() {
                return Err(ArrayError::Parse(format!(
                    "chunk memory `{s}`: empty node list; nodes with memory: {mems}"
                )));
            }
            let bad = set.difference(&mems);
            if !bad.is_empty() {
                return Err(ArrayError::Parse(format!(
                    "chunk memory `{s}`: nodes {bad} have no usable memory here; valid nodes: {mems}"
                )));
            }
            Ok(set)
        };
        match name {
            "first-touch" | "firsttouch" if arg.is_none() => Ok(ChunkMem::FirstTouch),
            "bind" => Ok(ChunkMem::Bind(nodes(arg)?)),
            "interleave" => Ok(ChunkMem::Interleave(nodes(arg)?)),
            _ => Err(ArrayError::Parse(format!(
                "unknown chunk memory policy `{s}`; valid: {}",
                Self::CHOICES
            ))),
        }
    }

    /// The planned home of chunk `i` (first touch: not known until touched).
    pub fn home_of(&self, i: usize) -> Home {
        match self {
            ChunkMem::FirstTouch => Home::Unknown,
            ChunkMem::Bind(s) => {
                let v: Vec<u32> = s.iter().collect();
                Home::Node(v[i % v.len()])
            }
            ChunkMem::Interleave(s) => Home::Interleave(s.clone()),
        }
    }
}

impl fmt::Display for ChunkMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkMem::FirstTouch => f.write_str("first-touch"),
            ChunkMem::Bind(s) => write!(f, "bind:{s}"),
            ChunkMem::Interleave(s) => write!(f, "interleave:{s}"),
        }
    }
}

/// One anonymous private mapping: unmapped on drop, or given back to the result-buffer pool it
/// came from (see [`crate::pool`]). Zero-length regions map nothing.
pub struct Region {
    map: Option<AnonMap>,
    len: usize,
    /// Where the region goes when dropped, and the binding of its pages it goes there with.
    pool: Option<(Arc<BufferPool>, Binding)>,
}

/// Mappings at least this big are aligned (and sized) to 2 MiB when huge pages are asked for, so
/// transparent huge pages can back all of them.
const HUGE: usize = 2 << 20;

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
        let ps = loci_place::sys::page_size();
        let (mapped, align) = if huge && len >= HUGE && HUGE.is_multiple_of(ps) {
            (len.next_multiple_of(HUGE), HUGE)
        } else {
            (len.next_multiple_of(ps), ps)
        };
        let m = AnonMap::new(mapped, align, 0)
            .map_err(|e| ArrayError::Memory(format!("mmap of {mapped} bytes failed: {e}")))?;
        if huge {
            // SAFETY: the range is the mapping just created. Advice only: failure is harmless
            // (THP disabled), so the result is ignored on purpose.
            unsafe { libc::madvise(m.as_ptr().cast(), mapped, libc::MADV_HUGEPAGE) };
        }
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
        let len = len.next_multiple_of(ps).min(mapped - offset);
        let plan = match home {
            Home::Node(n) => MemPlan {
                policy: "bind",
                nodes: NodeSet::single(*n),
            },
            Home::Interleave(s) => MemPlan {
                policy: "interleave",
                nodes: s.clone(),
            },
            Home::Unknown => return Ok(()),
        };
        // SAFETY: offset..offset+len is inside this Region's own mapping (checked above), and
        // no page of it is touched yet.
        unsafe { loci_place::apply::apply_range(&plan, self.base().add(offset), len, false) }
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
    fn binding_to_a_missing_node_fails_clearly() {
        let r = Region::map(4096, false).unwrap();
        let e = r.place(0, 4096, &Home::Node(1000)).unwrap_err().to_string();
        assert!(e.contains("node 1000"), "{e}");
    }
}
