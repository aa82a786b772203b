//! Node-homed storage: tables of `(key, val)` rows split into morsels, each morsel in
//! its own [`NodeRegion`] whose pages are placed by a loci-place memory plan before they are
//! touched.
//!
//! Why one mapping per morsel: `mbind(2)` works on page ranges, so giving every morsel its own
//! mapping lets any morsel size carry its own policy (`per-node` homes morsel `i` on its node's
//! share, [`MemPlan::part`]) without rounding morsel sizes to pages. Columns of one morsel share
//! the mapping: keys first, values at the next page boundary.
//!
//! Two row layouts share the type: `(key: u32, val: u32)` (width 4: the 32-bit operators of
//! [`crate::agg`] and [`crate::join`], the VM checks) and `(key: u64, val: i64 or f64)` (width 8:
//! the 64-bit tables of [`crate::wide`] and [`crate::index`], what the benchmarks W1-W4 run on). A
//! morsel knows its width; the accessors of the other width panic. Whether 8-byte values are
//! `i64` or `f64` is the caller's to know.

use std::io;

use loci_place::region::{NodeRegion, RegionError};
use loci_place::sys;
use loci_place::{MemPlan, MemPolicy};
use loci_topo::Topology;

use crate::wide::Value64;
use crate::EngineError;

/// Resolves a loci-place policy against the machine: nodes must be present, allowed and have
/// memory (loci-place's checks and messages); interleaving over one node becomes `preferred`.
pub fn resolve(topo: &Topology, p: &MemPolicy) -> Result<MemPlan, EngineError> {
    let (plan, _notes) = p
        .resolve(topo)
        .map_err(|e| EngineError::Invalid(format!("memory policy: {e}")))?;
    Ok(plan)
}

/// Maps `len` bytes placed by `plan` before their first touch, asking for huge pages.
pub(crate) fn map_region(len: usize, plan: &MemPlan) -> Result<NodeRegion, EngineError> {
    NodeRegion::map(len, plan, true).map_err(|e| match e {
        RegionError::Map { len, source } => EngineError::Io {
            what: format!("mmap of {len} bytes"),
            source,
        },
        RegionError::Place(e) => EngineError::Placement(e),
    })
}

/// Largest column of one morsel, in bytes (2^40: far beyond any memory this runs on, small
/// enough that no size arithmetic on it can wrap).
pub const MAX_MORSEL_BYTES: usize = 1 << 40;

/// A slice of a table: `rows` keys and values in one mapping, with a home node.
pub struct Morsel {
    region: NodeRegion,
    rows: usize,
    /// Bytes per key and per value: 4 (`u32`, `u32`) or 8 (`u64`, `i64`).
    width: usize,
    vals_off: usize,
    /// The node the policy meant this morsel to live on (None: interleaved, or first touch by an
    /// unpinned thread). Where it really is comes from [`Morsel::actual_nodes`].
    pub home: Option<u32>,
}

impl Morsel {
    fn new(rows: usize, width: usize, plan: &MemPlan) -> Result<Self, EngineError> {
        let ps = sys::page_size();
        // Checked: a wrapped size would map less than the column slices later claim.
        let bytes = rows
            .checked_mul(width)
            .filter(|&b| b <= MAX_MORSEL_BYTES)
            .ok_or_else(|| {
                EngineError::Invalid(format!(
                    "a morsel of {rows} rows of {width}-byte keys and values is larger than {MAX_MORSEL_BYTES} bytes per column"
                ))
            })?;
        let vals_off = bytes.div_ceil(ps) * ps;
        let region = map_region(vals_off + bytes, plan)?;
        let home = plan.part_node(0, 1);
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

    /// The f64 value column (width 8; the caller knows the table holds doubles).
    pub fn vals_f64(&self) -> &[f64] {
        self.val_col("vals_f64")
    }

    /// The u64 keys and f64 values, writable (width 8).
    pub fn cols64f_mut(&mut self) -> (&mut [u64], &mut [f64]) {
        self.cols_mut_of("cols64f_mut")
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
    /// Allocates (does not fill) a table of `rows` rows in morsels of `morsel_rows`, morsel `i`
    /// of `m` placed by `plan.part(i, m)` (`per-node`: on its node's share; a policy without
    /// parts: the same for every morsel). A morsel's home is the node its part is bound to; for
    /// first touch the generator sets it.
    pub fn alloc(rows: usize, morsel_rows: usize, plan: &MemPlan) -> Result<Table, EngineError> {
        Self::alloc_width(rows, morsel_rows, plan, 4)
    }

    /// [`Table::alloc`] with `width`-byte keys and values (4: u32/u32, 8: u64/i64).
    pub fn alloc_width(
        rows: usize,
        morsel_rows: usize,
        plan: &MemPlan,
        width: usize,
    ) -> Result<Table, EngineError> {
        assert!(width == 4 || width == 8, "width 4 or 8");
        if morsel_rows == 0 {
            return Err(EngineError::Invalid(
                "morsel size must be at least one row".into(),
            ));
        }
        let m = rows.div_ceil(morsel_rows);
        let morsels = (0..m)
            .map(|i| {
                let r = morsel_rows.min(rows - i * morsel_rows);
                Morsel::new(r, width, &plan.part(i, m))
            })
            .collect::<Result<_, _>>()?;
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

    /// A 64-bit table of `i64` or `f64` values from plain vectors (tests, small inputs): first
    /// touch by the caller.
    pub fn from_rows64<V: Value64>(
        keys: &[u64],
        vals: &[V],
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
            keys.len(),
            morsel_rows,
            &MemPlan::first_touch(),
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
        self.columns()
    }

    /// All keys and f64 values of a 64-bit table of doubles, in row order (tests).
    pub fn to_vecs64f(&self) -> (Vec<u64>, Vec<f64>) {
        self.columns()
    }

    /// Both columns of either width (`K`, `V` sized as the table's keys and values).
    fn columns<K: Copy, V: Copy>(&self) -> (Vec<K>, Vec<V>) {
        let mut k = Vec::with_capacity(self.rows());
        let mut v = Vec::with_capacity(self.rows());
        for m in &self.morsels {
            k.extend_from_slice(m.key_col("columns"));
            v.extend_from_slice(m.val_col("columns"));
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
        self.columns()
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
