//! Node-homed storage: tables of `(key, val)` rows split into morsels, each morsel in
//! its own anonymous mapping whose pages are placed by a [`MemPolicy`] before they are touched.
//!
//! Why one mapping per morsel: `mbind(2)` works on page ranges, so giving every morsel its own
//! mapping lets any morsel size carry its own policy (bind-per-node homes morsel `i` on its
//! node's share) without rounding morsel sizes to pages. Columns of one morsel share the mapping:
//! keys first, values at the next page boundary.
//!
//! Two row layouts share the type: `(key: u32, val: u32)` (width 4: W4's index tables, the
//! VM checks) and `(key: u64, val: i64)` (width 8: the 64-bit tables of [`crate::wide`], what the
//! benchmarks W1-W3 run on). A morsel knows its width; the accessors of the other width panic.

use std::fmt;
use std::io;
use std::str::FromStr;

use loci_place::policy::{MemPlan, MemPolicy as PlacePolicy};
use loci_place::sys;
use loci_topo::{NodeSet, Topology};

use crate::EngineError;

/// Resolves a loci-place policy against the machine: nodes must be present, allowed and have
/// memory (loci-place's checks and messages); interleaving over one node becomes `preferred`.
fn resolve(topo: &Topology, p: PlacePolicy) -> Result<MemPlan, EngineError> {
    let (plan, _notes) = p
        .resolve(topo)
        .map_err(|e| EngineError::Invalid(format!("memory policy: {e}")))?;
    Ok(plan)
}

/// `bind:NODE` on the machine.
pub fn bind_plan(topo: &Topology, node: u32) -> Result<MemPlan, EngineError> {
    resolve(topo, PlacePolicy::Bind(node.to_string()))
}

/// `interleave:NODES` on the machine.
pub fn interleave_plan(topo: &Topology, nodes: &[u32]) -> Result<MemPlan, EngineError> {
    let set: NodeSet = nodes.iter().copied().collect();
    resolve(topo, PlacePolicy::Interleave(Some(set.to_string())))
}

/// Where the pages of a table go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemPolicy {
    /// No policy: pages land on the node of the worker that writes them first (the generator).
    FirstTouch,
    /// First touch, but a single thread generates the whole table (the classic accident: every
    /// page on that thread's node).
    FirstTouchSingle,
    /// `MPOL_INTERLEAVE` over all allowed nodes, page by page.
    Interleave,
    /// `MPOL_BIND` to one node.
    Node(u32),
    /// Morsel `i` of `m` is bound (`MPOL_BIND`) to node `nodes[i * k / m]`: each of the `k` nodes
    /// holds a contiguous share (seed 004's WIN layout inside one process).
    BindPerNode,
}

impl MemPolicy {
    /// Names accepted by [`FromStr`].
    pub const CHOICES: &'static str =
        "first-touch, first-touch-1, interleave, node:N, bind-per-node";
}

impl fmt::Display for MemPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemPolicy::FirstTouch => write!(f, "first-touch"),
            MemPolicy::FirstTouchSingle => write!(f, "first-touch-1"),
            MemPolicy::Interleave => write!(f, "interleave"),
            MemPolicy::Node(n) => write!(f, "node:{n}"),
            MemPolicy::BindPerNode => write!(f, "bind-per-node"),
        }
    }
}

impl FromStr for MemPolicy {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || EngineError::BadChoice {
            what: "memory policy",
            given: s.to_string(),
            valid: Self::CHOICES,
        };
        Ok(match s {
            "first-touch" | "ft" => MemPolicy::FirstTouch,
            "first-touch-1" | "ft1" => MemPolicy::FirstTouchSingle,
            "interleave" | "il" => MemPolicy::Interleave,
            "bind-per-node" | "bpn" | "win" => MemPolicy::BindPerNode,
            _ => match s.strip_prefix("node:") {
                Some(n) => MemPolicy::Node(n.parse().map_err(|_| bad())?),
                None => return Err(bad()),
            },
        })
    }
}

/// An anonymous private mapping, unmapped on drop. Concurrent writers go through the
/// `Morsel`/`Partitioned` APIs, which give each writer a disjoint range.
pub struct Region(sys::AnonMap);

impl Region {
    /// Maps `len` bytes (rounded up to pages; at least one page), asks for transparent huge pages
    /// (a hint), and applies the loci-place memory plan to it before any page is touched
    /// (`loci_place::apply::apply_range`, i.e. `mbind`).
    /// `plan` = None (or first-touch) leaves the pages to first touch.
    pub fn map(len: usize, plan: Option<&MemPlan>) -> Result<Region, EngineError> {
        let m =
            sys::AnonMap::new(len, sys::page_size(), libc::MAP_NORESERVE).map_err(|source| {
                EngineError::Io {
                    what: format!("mmap of {len} bytes"),
                    source,
                }
            })?;
        let len = m.len();
        if len >= 2 << 20 {
            // SAFETY: the range is our own fresh mapping. A failed hint is harmless (THP off).
            unsafe { libc::madvise(m.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        }
        if let Some(p) = plan.filter(|p| !p.is_default()) {
            // SAFETY: the range is our own mapping, page aligned, nothing touched yet.
            unsafe { loci_place::apply::apply_range(p, m.as_ptr(), len, false) }?;
        }
        Ok(Region(m))
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }

    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: a region has at least one page.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Share of the sampled pages of `[off, off+len)` on each node: `samples` pages evenly spread.
    /// Pages not yet touched are left out; an all-untouched range gives an empty list.
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
        let st = self.0.nodes_at((0..k).map(|i| (first + i * n / k) * ps))?;
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

/// A slice of a table: `rows` keys and values in one mapping, with a home node.
pub struct Morsel {
    region: Region,
    rows: usize,
    /// Bytes per key and per value: 4 (`u32`, `u32`) or 8 (`u64`, `i64`).
    width: usize,
    vals_off: usize,
    /// The node the policy meant this morsel to live on (None: interleaved, or first touch by an
    /// unpinned thread). Where it really is comes from [`Morsel::actual_nodes`].
    pub home: Option<u32>,
}

impl Morsel {
    fn new(
        rows: usize,
        width: usize,
        home: Option<u32>,
        plan: Option<&MemPlan>,
    ) -> Result<Self, EngineError> {
        let ps = sys::page_size();
        let vals_off = (rows * width).div_ceil(ps) * ps;
        let region = Region::map(vals_off + rows * width, plan)?;
        Ok(Morsel {
            region,
            rows,
            width,
            vals_off,
            home,
        })
    }

    /// Bytes per key (and per value): 4 or 8.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The key column of a morsel whose columns are `K` wide (u32 or u64).
    fn key_col<K>(&self, what: &str) -> &[K] {
        self.check_width::<K>(what);
        // SAFETY: the region holds `rows` keys of `width` bytes at offset 0 (page aligned,
        // zero-filled or written), and `width` is `K`'s size (checked).
        unsafe { std::slice::from_raw_parts(self.region.as_ptr() as *const K, self.rows) }
    }

    /// The value column of a morsel whose columns are `V` wide (u32 or i64).
    fn val_col<V>(&self, what: &str) -> &[V] {
        self.check_width::<V>(what);
        // SAFETY: the region holds `rows` values of `width` bytes at `vals_off` (page
        // aligned), and `width` is `V`'s size (checked).
        unsafe {
            std::slice::from_raw_parts(
                self.region.as_ptr().add(self.vals_off) as *const V,
                self.rows,
            )
        }
    }

    /// Both columns, writable.
    fn cols_mut_of<K, V>(&mut self, what: &str) -> (&mut [K], &mut [V]) {
        self.check_width::<K>(what);
        self.check_width::<V>(what);
        // SAFETY: the two ranges are disjoint (vals_off >= rows * width) and inside the region;
        // `&mut self` guarantees exclusive access; `width` is `K`'s and `V`'s size (checked).
        unsafe {
            (
                std::slice::from_raw_parts_mut(self.region.as_ptr() as *mut K, self.rows),
                std::slice::from_raw_parts_mut(
                    self.region.as_ptr().add(self.vals_off) as *mut V,
                    self.rows,
                ),
            )
        }
    }

    fn check_width<T>(&self, what: &str) {
        assert_eq!(
            self.width,
            std::mem::size_of::<T>(),
            "{what} of a {}-bit morsel",
            self.width * 8
        );
    }

    /// The 64-bit key column (width 8).
    pub fn keys64(&self) -> &[u64] {
        self.key_col("keys64")
    }

    /// The i64 value column (width 8).
    pub fn vals64(&self) -> &[i64] {
        self.val_col("vals64")
    }

    /// Both 64-bit columns, writable (width 8).
    pub fn cols64_mut(&mut self) -> (&mut [u64], &mut [i64]) {
        self.cols_mut_of("cols64_mut")
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The key column (width 4).
    pub fn keys(&self) -> &[u32] {
        self.key_col("keys")
    }

    /// The value (payload) column (width 4).
    pub fn vals(&self) -> &[u32] {
        self.val_col("vals")
    }

    /// Both columns, writable (width 4).
    pub fn cols_mut(&mut self) -> (&mut [u32], &mut [u32]) {
        self.cols_mut_of("cols_mut")
    }

    /// Bytes of both columns.
    pub fn bytes(&self) -> usize {
        self.rows * 2 * self.width
    }

    /// Where the morsel's pages really are: share of sampled pages per node.
    pub fn actual_nodes(&self, samples: usize) -> io::Result<Vec<(u32, f64)>> {
        let mut a = self
            .region
            .sample_nodes(0, self.rows * self.width, samples.div_ceil(2))?;
        let b =
            self.region
                .sample_nodes(self.vals_off, self.rows * self.width, samples.div_ceil(2))?;
        // Both columns have the same size: average the two shares.
        for (n, f) in b {
            match a.iter_mut().find(|(m, _)| *m == n) {
                Some(x) => x.1 += f,
                None => a.push((n, f)),
            }
        }
        let total: f64 = a.iter().map(|x| x.1).sum();
        if total > 0.0 {
            for x in &mut a {
                x.1 /= total;
            }
        }
        Ok(a)
    }
}

/// A table of `(key, val)` rows in morsels. Row order is morsel order, then row order inside.
pub struct Table {
    /// The morsels, in row order.
    pub morsels: Vec<Morsel>,
    /// Smallest and largest key (zone map of the whole table, 32-bit tables only, set by the
    /// generator); None when empty or 64-bit. The 64-bit operators use no statistic.
    pub key_range: Option<(u32, u32)>,
}

impl Table {
    /// Allocates (does not fill) a table of `rows` rows in morsels of `morsel_rows`, placing each
    /// morsel by `policy` over the allowed memory nodes `nodes` (ascending) of `topo`, through
    /// loci-place's policies (so a bad node is named with the valid ones). For first touch the
    /// homes are left for the generator to set.
    pub fn alloc(
        topo: &Topology,
        rows: usize,
        morsel_rows: usize,
        policy: &MemPolicy,
        nodes: &[u32],
    ) -> Result<Table, EngineError> {
        Self::alloc_width(topo, rows, morsel_rows, policy, nodes, 4)
    }

    /// [`Table::alloc`] with `width`-byte keys and values (4: u32/u32, 8: u64/i64).
    pub fn alloc_width(
        topo: &Topology,
        rows: usize,
        morsel_rows: usize,
        policy: &MemPolicy,
        nodes: &[u32],
        width: usize,
    ) -> Result<Table, EngineError> {
        assert!(width == 4 || width == 8, "width 4 or 8");
        if morsel_rows == 0 {
            return Err(EngineError::Invalid(
                "morsel size must be at least one row".into(),
            ));
        }
        if nodes.is_empty() {
            return Err(EngineError::Invalid("no memory node is allowed".into()));
        }
        if let MemPolicy::Node(n) = policy {
            if !nodes.contains(n) {
                return Err(EngineError::BadNode {
                    node: *n,
                    valid: NodeSet::from_iter(nodes.iter().copied()).to_string(),
                });
            }
        }
        // The plans, resolved once: for bind-per-node one per node.
        let plans: Vec<Option<MemPlan>> = match policy {
            MemPolicy::FirstTouch | MemPolicy::FirstTouchSingle => vec![None],
            MemPolicy::Interleave => vec![Some(interleave_plan(topo, nodes)?)],
            MemPolicy::Node(n) => vec![Some(bind_plan(topo, *n)?)],
            MemPolicy::BindPerNode => nodes
                .iter()
                .map(|&n| bind_plan(topo, n).map(Some))
                .collect::<Result<_, _>>()?,
        };
        let m = rows.div_ceil(morsel_rows);
        let mut morsels = Vec::with_capacity(m);
        for i in 0..m {
            let r = morsel_rows.min(rows - i * morsel_rows);
            let (home, plan) = match policy {
                MemPolicy::FirstTouch | MemPolicy::FirstTouchSingle | MemPolicy::Interleave => {
                    (None, &plans[0])
                }
                MemPolicy::Node(n) => (Some(*n), &plans[0]),
                MemPolicy::BindPerNode => {
                    let k = i * nodes.len() / m;
                    (Some(nodes[k]), &plans[k])
                }
            };
            morsels.push(Morsel::new(r, width, home, plan.as_ref())?);
        }
        Ok(Table {
            morsels,
            key_range: None,
        })
    }

    /// Builds a table from plain vectors (tests, small inputs): first touch by the caller.
    pub fn from_rows(keys: &[u32], vals: &[u32], morsel_rows: usize) -> Result<Table, EngineError> {
        let mut t = Table::from_plain(keys, vals, morsel_rows)?;
        t.update_key_range();
        Ok(t)
    }

    /// A 64-bit table from plain vectors (tests, small inputs): first touch by the caller.
    pub fn from_rows64(
        keys: &[u64],
        vals: &[i64],
        morsel_rows: usize,
    ) -> Result<Table, EngineError> {
        Table::from_plain(keys, vals, morsel_rows)
    }

    /// Either width from plain vectors: `K` and `V` (u32/u32 or u64/i64) set the width.
    fn from_plain<K: Copy, V: Copy>(
        keys: &[K],
        vals: &[V],
        morsel_rows: usize,
    ) -> Result<Table, EngineError> {
        if keys.len() != vals.len() {
            return Err(EngineError::Invalid(format!(
                "{} keys but {} values",
                keys.len(),
                vals.len()
            )));
        }
        let mut t = Table::alloc_width(
            &Topology::flat(loci_topo::CpuSet::single(0), "from_rows"),
            keys.len(),
            morsel_rows,
            &MemPolicy::FirstTouch,
            &[0],
            std::mem::size_of::<K>(),
        )?;
        let mut at = 0;
        for m in &mut t.morsels {
            let n = m.rows;
            let (k, v) = m.cols_mut_of::<K, V>("from_rows");
            k.copy_from_slice(&keys[at..at + n]);
            v.copy_from_slice(&vals[at..at + n]);
            at += n;
        }
        Ok(t)
    }

    /// All keys and values of a 64-bit table, in row order (tests, export).
    pub fn to_vecs64(&self) -> (Vec<u64>, Vec<i64>) {
        let mut k = Vec::with_capacity(self.rows());
        let mut v = Vec::with_capacity(self.rows());
        for m in &self.morsels {
            k.extend_from_slice(m.keys64());
            v.extend_from_slice(m.vals64());
        }
        (k, v)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.morsels.iter().map(|m| m.rows).sum()
    }

    /// Recomputes [`Table::key_range`] from the data.
    pub fn update_key_range(&mut self) {
        let mut r: Option<(u32, u32)> = None;
        for m in &self.morsels {
            for &k in m.keys() {
                r = Some(match r {
                    None => (k, k),
                    Some((a, b)) => (a.min(k), b.max(k)),
                });
            }
        }
        self.key_range = r;
    }

    /// All keys and values, in row order (tests, export).
    pub fn to_vecs(&self) -> (Vec<u32>, Vec<u32>) {
        let mut k = Vec::with_capacity(self.rows());
        let mut v = Vec::with_capacity(self.rows());
        for m in &self.morsels {
            k.extend_from_slice(m.keys());
            v.extend_from_slice(m.vals());
        }
        (k, v)
    }

    /// Sampled page placement of every morsel.
    pub fn placement(&self, samples_per_morsel: usize) -> io::Result<Vec<Vec<(u32, f64)>>> {
        self.morsels
            .iter()
            .map(|m| m.actual_nodes(samples_per_morsel))
            .collect()
    }
}

/// Local-access ratio of one pass over a table: bytes of the morsels each worker read that sit
/// on that worker's node, over all bytes read. `placement` comes from [`Table::placement`],
/// `touched[i]` = (morsel, node of the worker that read it; None = unknown).
pub fn local_access_ratio(
    table: &Table,
    placement: &[Vec<(u32, f64)>],
    touched: &[(usize, Option<u32>)],
) -> Option<f64> {
    let mut local = 0.0;
    let mut total = 0.0;
    for &(m, node) in touched {
        let bytes = table.morsels[m].bytes() as f64;
        total += bytes;
        if let Some(node) = node {
            let share = placement[m]
                .iter()
                .find(|(n, _)| *n == node)
                .map(|x| x.1)
                .unwrap_or(0.0);
            local += bytes * share;
        }
    }
    (total > 0.0).then(|| local / total)
}
