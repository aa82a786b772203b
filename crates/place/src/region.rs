//! The node-bound memory region: an anonymous mapping whose pages get a memory plan before any
//! of them is touched, the one mapping type under loci-engine's tables, loci-array's chunks and
//! loci-stream's chunk buffers (each keeps its own domain type on top).
//!
//! Hand-written on `mmap`/`mbind` (through [`crate::sys`] and [`crate::apply::apply_range`])
//! because the policy has to be set on the exact range of each part before its first touch,
//! which no allocator API does.

use std::io;

use crate::apply::{apply_range, RangeError};
use crate::policy::MemPlan;
use crate::sys::{self, AnonMap};

/// A transparent huge page: mappings of at least this size asked to use huge pages are aligned
/// and sized to it, so huge pages can back all of them.
pub const HUGE_PAGE: usize = 2 << 20;

/// Why a region could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// `mmap` failed.
    #[error("mmap of {len} bytes failed: {source}")]
    Map { len: usize, source: io::Error },
    /// The kernel would not apply the memory plan (names the range, the policy and the cause).
    #[error(transparent)]
    Place(#[from] RangeError),
}

/// An anonymous private read-write mapping with its memory plan applied, unmapped on drop. It
/// hands out raw pointers; whoever writes through them keeps the writes disjoint.
pub struct NodeRegion {
    map: AnonMap,
}

impl NodeRegion {
    /// Maps `len` bytes (whole pages, at least one), untouched, and applies `plan` to all of
    /// them (first touch leaves them alone). `huge` asks for transparent huge pages
    /// (`madvise(MADV_HUGEPAGE)`, a hint); a mapping of [`HUGE_PAGE`] or more is then aligned
    /// and rounded up to it. `MAP_NORESERVE`: only touched pages count.
    /// A `per-node`/`round-robin` plan is applied part by part with [`NodeRegion::place`].
    pub fn map(len: usize, plan: &MemPlan, huge: bool) -> Result<Self, RegionError> {
        let ps = sys::page_size();
        let (mapped, align) = if huge && len >= HUGE_PAGE && HUGE_PAGE.is_multiple_of(ps) {
            (len.next_multiple_of(HUGE_PAGE), HUGE_PAGE)
        } else {
            (len.max(1).next_multiple_of(ps), ps)
        };
        let map = AnonMap::new(mapped, align, libc::MAP_NORESERVE).map_err(|source| {
            RegionError::Map {
                len: mapped,
                source,
            }
        })?;
        if huge {
            // SAFETY: the range is the mapping just made. Advice only: a failure (THP disabled)
            // is harmless, so the result is ignored on purpose.
            unsafe { libc::madvise(map.as_ptr().cast(), map.len(), libc::MADV_HUGEPAGE) };
        }
        let r = NodeRegion { map };
        r.place(0, r.len(), plan)?;
        Ok(r)
    }

    /// Applies `plan` to the bytes `offset..offset+len` (widened to whole pages, clipped to the
    /// mapping; `offset` page aligned) with `mbind`, for the pages touched from now on: call it
    /// before the first touch. First touch and an empty range are no-ops.
    pub fn place(&self, offset: usize, len: usize, plan: &MemPlan) -> Result<(), RangeError> {
        if plan.is_default() || len == 0 {
            return Ok(());
        }
        let len = len
            .next_multiple_of(sys::page_size())
            .min(self.len().saturating_sub(offset));
        // SAFETY: `offset..offset+len` lies inside this region's own mapping (clipped above;
        // `apply_range` rejects an unaligned start), which only its owner uses.
        unsafe { apply_range(plan, self.as_ptr().wrapping_add(offset), len, false) }
    }

    /// Faults every page in now, under the region's policy: one `MADV_POPULATE_WRITE` (Linux
    /// 5.14+), or on older kernels a write of 0 to each page. The contents stay zero.
    pub fn populate(&mut self) {
        let (p, len) = (self.as_ptr(), self.len());
        // SAFETY: populating our own mapping; `&mut self` means no one reads it meanwhile.
        if unsafe { libc::madvise(p.cast(), len, libc::MADV_POPULATE_WRITE) } != 0 {
            for off in (0..len).step_by(sys::page_size()) {
                // SAFETY: off < len, inside the mapping, exclusively ours.
                unsafe { p.add(off).write_volatile(0) };
            }
        }
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Bytes mapped (whole pages, or whole huge pages).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never true: a region has at least one page.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Node of the pages holding the given byte offsets (`move_pages` query; `-errno` per page,
    /// `-ENOENT` for a page not touched yet). Offsets past the end are left out.
    pub fn nodes_at(&self, offsets: impl IntoIterator<Item = usize>) -> io::Result<Vec<i32>> {
        self.map.nodes_at(offsets)
    }

    /// Share of the sampled pages of `[off, off+len)` on each node: `samples` pages evenly
    /// spread. Pages not touched yet are left out; an all-untouched range gives an empty list.
    pub fn sample_nodes(
        &self,
        off: usize,
        len: usize,
        samples: usize,
    ) -> io::Result<Vec<(u32, f64)>> {
        let ps = sys::page_size();
        let first = off / ps;
        let last = (off + len.max(1)).div_ceil(ps).min(self.len() / ps);
        let n = last.saturating_sub(first);
        if n == 0 {
            return Ok(vec![]);
        }
        let k = samples.clamp(1, n);
        let st = self.nodes_at((0..k).map(|i| (first + i * n / k) * ps))?;
        let mut count: Vec<(u32, usize)> = Vec::new();
        let mut total = 0usize;
        for s in st.into_iter().filter(|&s| s >= 0) {
            total += 1;
            match count.iter_mut().find(|(n, _)| *n == s as u32) {
                Some(c) => c.1 += 1,
                None => count.push((s as u32, 1)),
            }
        }
        Ok(count
            .into_iter()
            .map(|(n, c)| (n, c as f64 / total as f64))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::mode;
    use loci_topo::NodeSet;

    /// The policy of the page holding byte `off` of `r`.
    fn policy_at(r: &NodeRegion, off: usize) -> (i32, NodeSet) {
        sys::get_range_policy(r.as_ptr().wrapping_add(off)).unwrap()
    }

    #[test]
    fn plan_is_applied_before_first_touch_and_pages_land_there() {
        let ps = sys::page_size();
        let r = NodeRegion::map(3 * ps + 5, &MemPlan::bind(0), false).unwrap();
        assert_eq!(r.len(), 4 * ps);
        assert_eq!(r.nodes_at([0, 3 * ps]).unwrap(), vec![-libc::ENOENT; 2]);
        assert_eq!(policy_at(&r, 3 * ps), (mode::MPOL_BIND, NodeSet::single(0)));
        // SAFETY: writes inside our own fresh mapping.
        unsafe { r.as_ptr().write_bytes(7, r.len()) };
        assert_eq!(r.sample_nodes(0, r.len(), 8).unwrap(), vec![(0, 1.0)]);
        // First touch sets nothing.
        let f = NodeRegion::map(ps, &MemPlan::first_touch(), false).unwrap();
        assert_eq!(policy_at(&f, 0).0, mode::MPOL_DEFAULT);
        assert!(f.sample_nodes(0, ps, 4).unwrap().is_empty(), "untouched");
    }

    #[test]
    fn parts_get_their_own_plans_and_huge_mappings_are_aligned() {
        let ps = sys::page_size();
        let r = NodeRegion::map(HUGE_PAGE + 1, &MemPlan::first_touch(), true).unwrap();
        assert_eq!(
            (r.len(), r.as_ptr() as usize % HUGE_PAGE),
            (2 * HUGE_PAGE, 0)
        );
        let per_node = MemPlan {
            policy: "per-node",
            nodes: NodeSet::single(0),
        };
        // A per-part plan on the whole range is refused: its parts are placed one by one.
        let e = NodeRegion::map(ps, &per_node, false)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("per-node") && e.contains("part"), "{e}");
        r.place(ps, ps, &per_node.part(1, 2)).unwrap();
        r.place(2 * ps, 1, &MemPlan::preferred(0)).unwrap();
        assert_eq!(policy_at(&r, 0).0, mode::MPOL_DEFAULT);
        assert_eq!(policy_at(&r, ps).0, mode::MPOL_BIND);
        assert_eq!(policy_at(&r, 2 * ps).0, mode::MPOL_PREFERRED);
        assert_eq!(policy_at(&r, 3 * ps).0, mode::MPOL_DEFAULT);
        let e = r.place(1, ps, &MemPlan::bind(0)).unwrap_err().to_string();
        assert!(e.contains("not page aligned"), "{e}");
    }

    #[test]
    fn populate_faults_every_page_in_on_the_planned_node() {
        let ps = sys::page_size();
        let mut r = NodeRegion::map(5 * ps, &MemPlan::preferred(0), false).unwrap();
        r.populate();
        assert_eq!(r.nodes_at((0..5).map(|i| i * ps)).unwrap(), vec![0; 5]);
        // SAFETY: reads inside our own mapping.
        assert!((0..r.len()).all(|i| unsafe { *r.as_ptr().add(i) } == 0));
    }
}
