//! W2 (count, sum, min, max, avg by key) and W1 (exact median by key).
//!
//! Plan, chosen from the table's key zone map:
//! - few distinct key values (range <= [`DIRECT_MAX`]): every worker aggregates its morsels into
//!   its own dense arrays that stay in cache, then the arrays are merged (W2 only);
//! - a dense key range (<= [`DENSE_MAX`]): radix-partition by key range into partitions of
//!   `2^12` keys (node-homed, see [`crate::partition`]), then each partition is aggregated in
//!   cache-resident dense arrays indexed by `key - partition start` (DuckDB's "perfect hash"
//!   idea applied per partition);
//! - otherwise: hash-partition, then a hashbrown table per partition (W2) or a sort of the
//!   partition's packed rows (W1).
//!
//! W1 on dense partitions is a counting sort by key followed by a selection per group
//! (`select_nth_unstable`): partition-then-select. The other textbook plan, per-group value lists,
//! is [`w1_lists`]; `loci bench w1 --w1-plan lists` measures it.

use hashbrown::HashMap;

use crate::exec::Exec;
use crate::partition::{key_of, partition, val_of, HashPart, PartFn, Partitioned, RangePart};
use crate::storage::Table;
use crate::{EngineError, Trace};

/// Key ranges up to this size are aggregated directly into per-worker arrays (W2).
pub const DIRECT_MAX: u64 = 1 << 15;
/// Key ranges up to this size use range partitioning and dense per-partition arrays.
pub const DENSE_MAX: u64 = 1 << 26;
/// Keys per range partition at least `2^12` (count+sum+min+max arrays of 4096 groups fit L2);
/// wider for wide key ranges so there are at most 4096 partitions.
pub const PART_SHIFT: u32 = 12;

/// Partition shift for a key range of `width` keys.
fn range_shift(width: u64) -> u32 {
    let bits = 64 - (width.max(1) - 1).leading_zeros();
    PART_SHIFT.max(bits.saturating_sub(12))
}

/// count, sum, min, max of one group (avg = sum / count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupAgg {
    pub key: u32,
    pub count: u64,
    pub sum: u64,
    pub min: u32,
    pub max: u32,
}

impl GroupAgg {
    /// A group with no rows yet.
    pub fn empty(key: u32) -> Self {
        GroupAgg {
            key,
            count: 0,
            sum: 0,
            min: u32::MAX,
            max: 0,
        }
    }

    /// Adds one value to the group.
    #[inline]
    pub fn add(&mut self, v: u32) {
        self.count += 1;
        self.sum += v as u64;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// Average of the values.
    pub fn avg(&self) -> f64 {
        self.sum as f64 / self.count as f64
    }
}

/// Exact median of one group, kept as `lo + hi` of the two middle values (twice the median;
/// for odd counts `lo == hi`), so it stays an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupMedian {
    pub key: u32,
    pub count: u64,
    pub twice_median: u64,
}

impl GroupMedian {
    /// The median (mean of the two middle values for even counts, as DuckDB and Polars do).
    pub fn median(&self) -> f64 {
        self.twice_median as f64 / 2.0
    }
}

/// How an aggregation ran, for the report.
#[derive(Debug, Clone, Default)]
pub struct AggRun {
    /// `direct`, `range-partitioned` or `hash-partitioned`.
    pub plan: &'static str,
    /// Which node read each input morsel.
    pub trace: Trace,
}

/// Dense accumulator arrays for a key range of `n` keys.
struct Dense {
    count: Vec<u64>,
    sum: Vec<u64>,
    min: Vec<u32>,
    max: Vec<u32>,
}

impl Dense {
    fn new(n: usize) -> Dense {
        Dense {
            count: vec![0; n],
            sum: vec![0; n],
            min: vec![u32::MAX; n],
            max: vec![0; n],
        }
    }
    fn reset(&mut self) {
        self.count.fill(0);
        self.sum.fill(0);
        self.min.fill(u32::MAX);
        self.max.fill(0);
    }
    #[inline(always)]
    fn add(&mut self, i: usize, v: u32) {
        self.count[i] += 1;
        self.sum[i] += v as u64;
        self.min[i] = self.min[i].min(v);
        self.max[i] = self.max[i].max(v);
    }
    fn emit(&self, base: u32, out: &mut Vec<GroupAgg>) {
        for i in 0..self.count.len() {
            if self.count[i] > 0 {
                out.push(GroupAgg {
                    key: base + i as u32,
                    count: self.count[i],
                    sum: self.sum[i],
                    min: self.min[i],
                    max: self.max[i],
                });
            }
        }
    }
}

/// Runs `f(p, scratch)` for every partition on the workers (each partition a task on its home
/// node) and returns the per-partition outputs in partition order.
fn per_partition<S, R: Send>(
    exec: &Exec,
    parts: &Partitioned,
    scratch: impl Fn() -> S + Sync,
    f: impl Fn(usize, &mut S) -> R + Sync,
) -> Vec<R>
where
    S: Send,
{
    exec.map(&parts.homes, scratch, |s, p| f(p, s)).0
}

/// Home nodes of a table's morsels.
fn homes(table: &Table) -> Vec<Option<u32>> {
    table.morsels.iter().map(|m| m.home).collect()
}

/// The plan for a table's key range.
fn plan(table: &Table) -> Option<(u32, u32, u64)> {
    table.key_range.map(|(a, b)| (a, b, (b - a) as u64 + 1))
}

/// Hash partition bits for `rows` rows: partitions of about 16K rows, at most 1024 partitions.
fn hash_bits(rows: usize) -> u32 {
    let mut b = 0;
    while b < 10 && (rows >> b) > (1 << 14) {
        b += 1;
    }
    b
}

/// W2: count, sum, min, max (and avg) of `val` by `key`, in key order.
pub fn w2(exec: &Exec, table: &Table) -> Result<(Vec<GroupAgg>, AggRun), EngineError> {
    let Some((min, max, width)) = plan(table) else {
        return Ok((vec![], AggRun::default()));
    };
    if width <= DIRECT_MAX {
        let pass = exec.for_each(
            &homes(table),
            || Dense::new(width as usize),
            |d, m| {
                let mo = &table.morsels[m];
                for (&k, &v) in mo.keys().iter().zip(mo.vals()) {
                    d.add((k - min) as usize, v);
                }
            },
        );
        let mut d = Dense::new(width as usize);
        for p in pass.states {
            for i in 0..width as usize {
                d.count[i] += p.count[i];
                d.sum[i] += p.sum[i];
                d.min[i] = d.min[i].min(p.min[i]);
                d.max[i] = d.max[i].max(p.max[i]);
            }
        }
        let mut out = Vec::new();
        d.emit(min, &mut out);
        return Ok((
            out,
            AggRun {
                plan: "direct",
                trace: pass.trace,
            },
        ));
    }
    if width <= DENSE_MAX {
        let shift = range_shift(width);
        let f = RangePart::new(min, max, shift)?;
        let parts = partition(exec, table, &f)?;
        let outs = per_partition(
            exec,
            &parts,
            || Dense::new(1 << shift),
            |p, d: &mut Dense| {
                d.reset();
                for &x in parts.part(p) {
                    d.add(((key_of(x) - min) & ((1 << shift) - 1)) as usize, val_of(x));
                }
                let mut out = Vec::new();
                d.emit(min + ((p as u32) << shift), &mut out);
                out
            },
        );
        let trace = parts.trace.clone();
        return Ok((
            outs.into_iter().flatten().collect(),
            AggRun {
                plan: "range-partitioned",
                trace,
            },
        ));
    }
    let f = HashPart::new(hash_bits(table.rows()))?;
    let parts = partition(exec, table, &f)?;
    let outs = per_partition(
        exec,
        &parts,
        || (),
        |p, _: &mut ()| {
            let rows = parts.part(p);
            let mut m: HashMap<u32, GroupAgg> = HashMap::with_capacity(rows.len().min(1 << 16));
            for &x in rows {
                let (k, v) = (key_of(x), val_of(x));
                m.entry(k).or_insert(GroupAgg::empty(k)).add(v);
            }
            m.into_values().collect::<Vec<_>>()
        },
    );
    let mut out: Vec<GroupAgg> = outs.into_iter().flatten().collect();
    out.sort_unstable_by_key(|g| g.key);
    let _ = f.parts();
    Ok((
        out,
        AggRun {
            plan: "hash-partitioned",
            trace: parts.trace.clone(),
        },
    ))
}

/// Median of a group's values (reorders them): `lo + hi` of the two middle values.
#[inline]
fn twice_median(vals: &mut [u32]) -> u64 {
    let n = vals.len();
    let (left, mid, _) = vals.select_nth_unstable(n / 2);
    let hi = *mid as u64;
    if n % 2 == 1 {
        2 * hi
    } else {
        let lo = *left.iter().max().expect("n >= 2 for even counts") as u64;
        lo + hi
    }
}

/// W1: exact median of `val` by `key`, in key order, by partition-then-select.
pub fn w1(exec: &Exec, table: &Table) -> Result<(Vec<GroupMedian>, AggRun), EngineError> {
    let Some((min, max, width)) = plan(table) else {
        return Ok((vec![], AggRun::default()));
    };
    if width <= DENSE_MAX {
        let shift = range_shift(width);
        let f = RangePart::new(min, max, shift)?;
        let parts = partition(exec, table, &f)?;
        let n = 1usize << shift;
        let outs = per_partition(
            exec,
            &parts,
            || (vec![0u32; n + 1], Vec::<u32>::new()),
            |p, (cnt, vals): &mut (Vec<u32>, Vec<u32>)| {
                let rows = parts.part(p);
                cnt.fill(0);
                for &x in rows {
                    cnt[((key_of(x) - min) as usize & (n - 1)) + 1] += 1;
                }
                // Exclusive prefix sums: cnt[i] = first slot of local key i.
                for i in 0..n {
                    cnt[i + 1] += cnt[i];
                }
                vals.clear();
                vals.resize(rows.len(), 0);
                let mut at = cnt.clone();
                for &x in rows {
                    let i = (key_of(x) - min) as usize & (n - 1);
                    vals[at[i] as usize] = val_of(x);
                    at[i] += 1;
                }
                let base = min + ((p as u32) << shift);
                let mut out = Vec::new();
                for i in 0..n {
                    let (a, b) = (cnt[i] as usize, cnt[i + 1] as usize);
                    if b > a {
                        out.push(GroupMedian {
                            key: base + i as u32,
                            count: (b - a) as u64,
                            twice_median: twice_median(&mut vals[a..b]),
                        });
                    }
                }
                out
            },
        );
        return Ok((
            outs.into_iter().flatten().collect(),
            AggRun {
                plan: "range-partitioned",
                trace: parts.trace.clone(),
            },
        ));
    }
    let f = HashPart::new(hash_bits(table.rows()))?;
    let parts = partition(exec, table, &f)?;
    let outs = per_partition(exec, &parts, Vec::<u64>::new, |p, buf: &mut Vec<u64>| {
        buf.clear();
        buf.extend_from_slice(parts.part(p));
        buf.sort_unstable();
        let mut out = Vec::new();
        let mut vals: Vec<u32> = Vec::new();
        let mut i = 0;
        while i < buf.len() {
            let k = key_of(buf[i]);
            let mut j = i;
            vals.clear();
            while j < buf.len() && key_of(buf[j]) == k {
                vals.push(val_of(buf[j]));
                j += 1;
            }
            out.push(GroupMedian {
                key: k,
                count: vals.len() as u64,
                twice_median: twice_median(&mut vals),
            });
            i = j;
        }
        out
    });
    let mut out: Vec<GroupMedian> = outs.into_iter().flatten().collect();
    out.sort_unstable_by_key(|g| g.key);
    Ok((
        out,
        AggRun {
            plan: "hash-partitioned",
            trace: parts.trace.clone(),
        },
    ))
}

/// W1 by per-group value lists: every worker appends each row's value to its own list for the
/// key (a hashbrown map of Vecs), lists of one key are concatenated, and each is selected. The
/// alternative plan to [`w1`]; kept for measurement (`loci bench w1 --w1-plan lists`).
pub fn w1_lists(exec: &Exec, table: &Table) -> Result<(Vec<GroupMedian>, AggRun), EngineError> {
    let pass = exec.for_each(&homes(table), HashMap::<u32, Vec<u32>>::new, |m, i| {
        let mo = &table.morsels[i];
        for (&k, &v) in mo.keys().iter().zip(mo.vals()) {
            m.entry(k).or_default().push(v);
        }
    });
    let mut it = pass.states.into_iter();
    let mut all = it.next().unwrap_or_default();
    for m in it {
        for (k, mut v) in m {
            all.entry(k).or_default().append(&mut v);
        }
    }
    let mut groups: Vec<(u32, Vec<u32>)> = all.into_iter().collect();
    groups.sort_unstable_by_key(|g| g.0);
    let out = groups
        .into_iter()
        .map(|(key, mut v)| GroupMedian {
            key,
            count: v.len() as u64,
            twice_median: twice_median(&mut v),
        })
        .collect();
    Ok((
        out,
        AggRun {
            plan: "lists",
            trace: pass.trace,
        },
    ))
}
