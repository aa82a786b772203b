//! The 64-bit tables: `u64` keys anywhere in the domain and `i64` or `f64` values, as users have
//! them, and the operators the benchmarks time on them (W2, W1, W3). No statistic of the data is
//! used: no key range, no distinct count; a plan is chosen from the row count alone. W2 and W1 are
//! generic over the value type ([`Value64`], implemented for `i64` and `f64`); the joins carry
//! `i64` payloads.
//!
//! - **Hashing**: [`hash64`], one xor-shift and one 64-bit multiply (Fibonacci hashing with the
//!   high half folded in): the top bits pick the radix partition, the next bits the slot.
//! - **W2** ([`w2`]): count, sum, min, max and avg of `val` by `key`. The table is
//!   radix-partitioned on the hash (two passes, exact histograms, write-combining scatter into
//!   node-homed partitions: [`crate::partition::partition_rows`]) into partitions of about 64K
//!   rows, then every partition is aggregated by the worker of its home node in an
//!   open-addressing table (linear probing over `u32` group ids into an array of accumulators)
//!   that grows by doubling and stays cache resident for any realistic partition. Every group is
//!   materialised with its `avg` (`sum / count` in f64). Output order: partition order, then
//!   first appearance (not sorted; the digests are order-independent).
//! - **W1** ([`w1`]): exact median by key. Same partitioning; per partition the same table
//!   assigns group ids, a counting sort lays each group's values out contiguously, and
//!   `select_nth_unstable` finds the middle values (partition-then-select).
//! - **W3** ([`w3`]): R and S radix-partitioned on the hash of the key (R partitions of about
//!   16K rows); per partition the worker builds an open-addressing table of `u32` indexes into
//!   R's partition (its rows are the payload store; any key value is allowed, duplicates too) and
//!   probes it with S's partition. Output: the number of matching pairs, `sum(r.val + s.val)`
//!   and a digest of every matched `(key, r.val, s.val)`.
//! - **Digests** ([`AggDigest`], [`MedianDigest`], [`JoinDigest`]): the wrapping sum of
//!   [`tuple_hash`] over every output tuple, so a row in the wrong group, a lost group or a
//!   wrong value changes them, in any output order; `bench/peers/peers.py` computes the very
//!   same from the peers' results. What floating point makes order-dependent (avg; for `f64`
//!   values also sum and median) is compared separately within [`RTOL`], through two sums that
//!   bind each value to its key ([`key_weight`]).

mod digest;
mod value;

pub use digest::{
    close, key_weight, tuple_hash, AggDigest, FloatSums, JoinDigest, MedianDigest, RTOL,
    TUPLE_SEED, WEIGHT_SALT,
};
pub use value::Value64;

use crate::exec::Exec;
use crate::partition::{partition_rows, Partitioned};
use crate::storage::Table;
use crate::{EngineError, Trace};

/// One 64-bit row, as partitions hold it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Row64<V = i64> {
    pub k: u64,
    pub v: V,
}

/// The hash of a key: its top bits are well mixed (partition), and so are the bits below them
/// (slot).
#[inline(always)]
pub fn hash64(k: u64) -> u64 {
    (k ^ (k >> 32) ^ 0x5bd1_e995).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Radix bits for aggregation over `rows` rows: partitions of about 64K rows, at most 2^10.
pub fn agg_bits(rows: usize) -> u32 {
    let mut b = 0;
    while b < 10 && (rows >> b) > (1 << 16) {
        b += 1;
    }
    b
}

/// Radix bits for the join: R partitions of about 16K rows, at most 2^12.
pub fn join_bits(r_rows: usize) -> u32 {
    let mut b = 0;
    while b < 12 && (r_rows >> b) > (1 << 14) {
        b += 1;
    }
    b
}

#[inline(always)]
fn part_of(h: u64, bits: u32) -> usize {
    if bits == 0 {
        0
    } else {
        (h >> (64 - bits)) as usize
    }
}

/// Hash-partitions a 64-bit table (values read as `V`) into `2^bits` partitions of [`Row64`].
pub fn partition64<V: Value64>(
    exec: &Exec,
    table: &Table,
    bits: u32,
) -> Result<Partitioned<Row64<V>>, EngineError> {
    partition_rows(
        exec,
        table,
        1 << bits,
        |mo, h| {
            for &k in mo.keys64() {
                h[part_of(hash64(k), bits)] += 1;
            }
        },
        |mo, sink| {
            for (&k, &v) in mo.keys64().iter().zip(V::col(mo)) {
                sink.push(part_of(hash64(k), bits), Row64 { k, v });
            }
        },
    )
}

/// count, sum, min, max and avg of one group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Group64<V = i64> {
    pub key: u64,
    pub count: u64,
    pub sum: V,
    pub min: V,
    pub max: V,
    /// `sum / count`, in f64.
    pub avg: f64,
}

/// Exact median of one group, kept as `lo + hi` of the two middle values (twice the median; for
/// `f64` the median `(lo + hi) / 2` is this halved, exactly, as DuckDB computes it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Median64<V = i64> {
    pub key: u64,
    pub count: u64,
    pub twice_median: V,
}

impl<V: Value64> Median64<V> {
    /// The median, as a double.
    pub fn median(&self) -> f64 {
        self.twice_median.to_f64() / 2.0
    }
}

#[derive(Clone, Copy)]
struct Acc<V> {
    key: u64,
    count: u64,
    sum: V,
    min: V,
    max: V,
}

/// Key -> dense group id, by linear probing over `u32` ids (`id + 1`; 0 = empty). The keys live
/// with the caller's per-group data (`key_of(id)`); the table doubles at half load.
struct GroupIds {
    slots: Vec<u32>,
    /// Bits of the partition number (the top hash bits, equal within a partition).
    pbits: u32,
    tbits: u32,
}

impl GroupIds {
    fn new() -> GroupIds {
        GroupIds {
            slots: vec![0; 1 << 10],
            pbits: 0,
            tbits: 10,
        }
    }

    /// Empties the table for a partition that had `prev` groups before.
    fn reset(&mut self, pbits: u32, prev: usize) {
        let cap = (prev * 2).next_power_of_two().max(1 << 10);
        self.slots.clear();
        self.slots.resize(cap, 0);
        self.tbits = cap.trailing_zeros();
        self.pbits = pbits;
    }

    #[inline(always)]
    fn slot(&self, h: u64) -> usize {
        ((h << self.pbits) >> (64 - self.tbits)) as usize
    }

    /// The id of `k` (hash `h`); `new_group(k)` appends a group and returns its id when `k` is
    /// new. `key_of(id)` is the key of an existing group.
    #[inline(always)]
    fn find_or_insert(
        &mut self,
        k: u64,
        h: u64,
        ngroups: usize,
        key_of: impl Fn(usize) -> u64,
    ) -> (usize, bool) {
        let mask = self.slots.len() - 1;
        let mut i = self.slot(h);
        loop {
            let s = self.slots[i];
            if s == 0 {
                self.slots[i] = ngroups as u32 + 1;
                return (ngroups, true);
            }
            let g = (s - 1) as usize;
            if key_of(g) == k {
                return (g, false);
            }
            i = (i + 1) & mask;
        }
    }

    /// Doubles the table when `groups` ids fill half of it; `key_of` gives each id's key.
    #[inline(always)]
    fn maybe_grow(&mut self, groups: usize, key_of: impl Fn(usize) -> u64) {
        if groups * 2 <= self.slots.len() {
            return;
        }
        let cap = self.slots.len() * 2;
        self.slots.clear();
        self.slots.resize(cap, 0);
        self.tbits += 1;
        let mask = cap - 1;
        for g in 0..groups {
            let mut i = self.slot(hash64(key_of(g)));
            while self.slots[i] != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = g as u32 + 1;
        }
    }
}

/// How a 64-bit operator ran, for the report.
#[derive(Debug, Clone, Default)]
pub struct Run64 {
    /// The plan (`hash-partitioned`).
    pub plan: &'static str,
    /// Radix bits (2^bits partitions).
    pub bits: u32,
    /// Which node read each input morsel (of S, for the join).
    pub trace: Trace,
}

impl Run64 {
    fn new(plan: &'static str, bits: u32, trace: &Trace) -> Run64 {
        Run64 {
            plan,
            bits,
            trace: trace.clone(),
        }
    }
}

/// W2 on a 64-bit table of `V` values: every group's count, sum, min, max and avg (unsorted).
pub fn w2<V: Value64>(exec: &Exec, table: &Table) -> Result<(Vec<Group64<V>>, Run64), EngineError> {
    let bits = agg_bits(table.rows());
    let parts = partition64::<V>(exec, table, bits)?;
    let (outs, _) = exec.map(
        &parts.homes,
        || (GroupIds::new(), Vec::<Acc<V>>::new(), 0usize),
        |(ids, accs, prev): &mut (GroupIds, Vec<Acc<V>>, usize), p| {
            ids.reset(bits, *prev);
            accs.clear();
            for r in parts.part(p) {
                let h = hash64(r.k);
                let (g, new) = ids.find_or_insert(r.k, h, accs.len(), |g| accs[g].key);
                if new {
                    accs.push(Acc {
                        key: r.k,
                        count: 1,
                        sum: r.v,
                        min: r.v,
                        max: r.v,
                    });
                    ids.maybe_grow(accs.len(), |g| accs[g].key);
                } else {
                    let a = &mut accs[g];
                    a.count += 1;
                    a.sum = a.sum.plus(r.v);
                    a.min = a.min.lesser(r.v);
                    a.max = a.max.greater(r.v);
                }
            }
            *prev = accs.len();
            accs.iter()
                .map(|a| Group64 {
                    key: a.key,
                    count: a.count,
                    sum: a.sum,
                    min: a.min,
                    max: a.max,
                    avg: a.sum.to_f64() / a.count as f64,
                })
                .collect::<Vec<_>>()
        },
    );
    Ok((
        outs.concat(),
        Run64::new("hash-partitioned", bits, &parts.trace),
    ))
}

/// Median of a group's values (reorders them): `lo + hi` of the two middle values.
#[inline]
fn twice_median<V: Value64>(vals: &mut [V]) -> V {
    let n = vals.len();
    V::select_nth(vals, n / 2);
    let (left, rest) = vals.split_at(n / 2);
    let hi = rest[0];
    if n % 2 == 1 {
        hi.plus(hi)
    } else {
        let (&first, left) = left.split_first().expect("n >= 2 for even counts");
        left.iter().fold(first, |m, &x| m.greater(x)).plus(hi)
    }
}

/// Per-worker scratch of W1.
struct MedianScratch<V> {
    keys: Vec<u64>,
    /// Per group: row count, then (prefix sums) first slot.
    start: Vec<u32>,
    gid: Vec<u32>,
    vals: Vec<V>,
    prev: usize,
}

impl<V> Default for MedianScratch<V> {
    fn default() -> Self {
        MedianScratch {
            keys: Vec::new(),
            start: Vec::new(),
            gid: Vec::new(),
            vals: Vec::new(),
            prev: 0,
        }
    }
}

/// W1 on a 64-bit table of `V` values: every group's exact median (unsorted).
pub fn w1<V: Value64>(
    exec: &Exec,
    table: &Table,
) -> Result<(Vec<Median64<V>>, Run64), EngineError> {
    let bits = agg_bits(table.rows());
    let parts = partition64::<V>(exec, table, bits)?;
    let (outs, _) = exec.map(
        &parts.homes,
        || (GroupIds::new(), MedianScratch::<V>::default()),
        |(ids, s): &mut (GroupIds, MedianScratch<V>), p| {
            let rows = parts.part(p);
            ids.reset(bits, s.prev);
            s.keys.clear();
            s.start.clear();
            s.gid.clear();
            for r in rows {
                let (g, new) = ids.find_or_insert(r.k, hash64(r.k), s.keys.len(), |g| s.keys[g]);
                if new {
                    s.keys.push(r.k);
                    s.start.push(0);
                    ids.maybe_grow(s.keys.len(), |g| s.keys[g]);
                }
                s.start[g] += 1;
                s.gid.push(g as u32);
            }
            let ng = s.keys.len();
            s.prev = ng;
            // Exclusive prefix sums: start[g] = first slot of group g; start[ng] = rows.
            let mut acc = 0u32;
            for x in s.start.iter_mut() {
                let c = *x;
                *x = acc;
                acc += c;
            }
            s.start.push(acc);
            s.vals.clear();
            s.vals.resize(rows.len(), V::default());
            {
                let mut at: Vec<u32> = s.start[..ng].to_vec();
                for (r, &g) in rows.iter().zip(&s.gid) {
                    let g = g as usize;
                    s.vals[at[g] as usize] = r.v;
                    at[g] += 1;
                }
            }
            let mut out = Vec::with_capacity(ng);
            for g in 0..ng {
                let (a, b) = (s.start[g] as usize, s.start[g + 1] as usize);
                out.push(Median64 {
                    key: s.keys[g],
                    count: (b - a) as u64,
                    twice_median: twice_median(&mut s.vals[a..b]),
                });
            }
            out
        },
    );
    Ok((
        outs.concat(),
        Run64::new("hash-partitioned", bits, &parts.trace),
    ))
}

/// W3 on 64-bit tables: partitioned hash join of R (build) and S (probe) on key.
pub fn w3(exec: &Exec, r: &Table, s: &Table) -> Result<(JoinDigest, Run64), EngineError> {
    let bits = join_bits(r.rows());
    let pr = partition64::<i64>(exec, r, bits)?;
    let ps = partition64::<i64>(exec, s, bits)?;
    let cap = (pr.max_len().max(1) * 2).next_power_of_two();
    let joined = exec.for_each(
        &pr.homes,
        || (vec![0u32; cap], JoinDigest::default()),
        |(slots, res): &mut (Vec<u32>, JoinDigest), p| {
            let rp = pr.part(p);
            let n = (rp.len().max(1) * 2).next_power_of_two();
            let tbits = n.trailing_zeros();
            let t = &mut slots[..n];
            t.fill(0);
            let mask = n - 1;
            let idx = |h: u64| ((h << bits) >> (64 - tbits)) as usize & mask;
            for (j, x) in rp.iter().enumerate() {
                let mut i = idx(hash64(x.k));
                while t[i] != 0 {
                    i = (i + 1) & mask;
                }
                t[i] = j as u32 + 1;
            }
            for y in ps.part(p) {
                let mut i = idx(hash64(y.k));
                loop {
                    let e = t[i];
                    if e == 0 {
                        break;
                    }
                    let x = &rp[(e - 1) as usize];
                    if x.k == y.k {
                        res.add_pair(y.k, x.v, y.v);
                    }
                    i = (i + 1) & mask;
                }
            }
        },
    );
    let res = joined
        .states
        .into_iter()
        .map(|x| x.1)
        .fold(JoinDigest::default(), JoinDigest::merge);
    Ok((res, Run64::new("partitioned", bits, &ps.trace)))
}

/// Single-thread references (BTreeMap), for the tests.
pub mod reference {
    use crate::reference::{groups, join_pairs, medians};

    use super::{Group64, JoinDigest, Median64, Value64};

    /// W2 by a BTreeMap, in key order (sums in row order).
    pub fn w2<V: Value64>(keys: &[u64], vals: &[V]) -> Vec<Group64<V>> {
        groups(keys, vals)
            .into_iter()
            .map(|(key, v)| {
                let sum = v[1..].iter().fold(v[0], |a, &x| a.plus(x));
                Group64 {
                    key,
                    count: v.len() as u64,
                    sum,
                    min: v[1..].iter().fold(v[0], |a, &x| a.lesser(x)),
                    max: v[1..].iter().fold(v[0], |a, &x| a.greater(x)),
                    avg: sum.to_f64() / v.len() as f64,
                }
            })
            .collect()
    }

    /// W1 by sorting each group, in key order.
    pub fn w1<V: Value64>(keys: &[u64], vals: &[V]) -> Vec<Median64<V>> {
        medians(keys, vals, |key, count, lo, hi| Median64 {
            key,
            count,
            twice_median: lo.plus(hi),
        })
    }

    /// The join digest by a BTreeMap of R's keys to their payloads.
    pub fn join(rk: &[u64], rv: &[i64], sk: &[u64], sv: &[i64]) -> JoinDigest {
        let mut d = JoinDigest::default();
        join_pairs(rk, rv, sk, sv, |k, p, q| d.add_pair(k, p, q));
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::flat_topology;
    use crate::gen::{AggSpec, Dist, JoinSpec, Keys, Values};
    use crate::{generate_agg, generate_agg64, generate_join, MemPolicy, Sched, Strategy};

    fn sorted2<V>(mut g: Vec<Group64<V>>) -> Vec<Group64<V>> {
        g.sort_by_key(|x| x.key);
        g
    }

    fn execs() -> Vec<Exec> {
        let t = flat_topology();
        vec![
            Exec::new(&t, Sched::Las, Strategy::sparse(), None).unwrap(),
            Exec::new(&t, Sched::Nls, Strategy::os(), Some(1)).unwrap(),
        ]
    }

    /// f64 groups against the reference: key, count, min and max exactly (bits, -0.0 as +0.0),
    /// sum and avg within RTOL of the larger magnitude (the order of addition may differ).
    fn assert_f64_groups(got: Vec<Group64<f64>>, want: &[Group64<f64>], what: &str) {
        let got = sorted2(got);
        assert_eq!(got.len(), want.len(), "{what}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(
                (g.key, g.count, g.min.bits(), g.max.bits()),
                (w.key, w.count, w.min.bits(), w.max.bits()),
                "{what}"
            );
            assert!(close(g.sum, w.sum), "{what}: sum {} vs {}", g.sum, w.sum);
            assert!(close(g.avg, w.avg), "{what}: avg {} vs {}", g.avg, w.avg);
        }
    }

    /// f64 medians against the reference: exact (the two middle values are data values, and
    /// `lo + hi` rounds once either way).
    fn assert_f64_medians(mut got: Vec<Median64<f64>>, want: &[Median64<f64>], what: &str) {
        got.sort_by_key(|x| x.key);
        let bits = |m: &[Median64<f64>]| -> Vec<(u64, u64, u64)> {
            m.iter()
                .map(|x| (x.key, x.count, x.twice_median.bits()))
                .collect()
        };
        assert_eq!(bits(&got), bits(want), "{what}");
    }

    /// Runs `check(exec, keys, spec)` on every executor of [`execs`], both key layouts and each
    /// `(rows, groups, dist)` case, the data seeded by `seed`.
    fn each_agg_case(
        cases: &[(usize, u32, Dist)],
        seed: u64,
        mut check: impl FnMut(&Exec, Keys, AggSpec),
    ) {
        for ex in execs() {
            for keys in [Keys::Sparse, Keys::Dense] {
                for &(rows, groups, dist) in cases {
                    let spec = AggSpec {
                        rows,
                        groups,
                        dist,
                        seed,
                    };
                    check(&ex, keys, spec);
                }
            }
        }
    }

    #[test]
    fn w2_and_w1_match_the_reference_on_sparse_and_dense_keys() {
        let cases = [
            (200_000, 5_000, Dist::Zipf),
            (300_000, 100_000, Dist::Uniform),
            (50_000, 1, Dist::HeavyHitter),
            (70_000, 7, Dist::Sequential),
        ];
        each_agg_case(&cases, 3, |ex, keys, spec| {
            let dist = spec.dist;
            let t =
                generate_agg(ex, spec, Some(keys), 10_000, &MemPolicy::FirstTouch.into()).unwrap();
            let (k, v) = t.to_vecs64();
            let want = reference::w2(&k, &v);
            let (got, _) = w2::<i64>(ex, &t).unwrap();
            let d = AggDigest::of(&got);
            assert!(d.agrees(&AggDigest::of(&want)), "{keys} {dist}");
            assert_eq!(sorted2(got), want, "{keys} {dist}");
            let want1 = reference::w1(&k, &v);
            let (mut got1, _) = w1::<i64>(ex, &t).unwrap();
            assert!(MedianDigest::of(&got1).agrees(&MedianDigest::of(&want1)));
            got1.sort_by_key(|x| x.key);
            assert_eq!(got1, want1, "{keys} {dist}");
        });
    }

    #[test]
    fn f64_w2_and_w1_match_the_reference() {
        let cases = [
            (200_000, 5_000, Dist::Zipf),
            (120_000, 100_000, Dist::Uniform),
            (50_000, 1, Dist::HeavyHitter),
        ];
        each_agg_case(&cases, 5, |ex, keys, spec| {
            let mem = MemPolicy::FirstTouch.into();
            let t = generate_agg64(ex, spec, keys, Values::F64, 10_000, &mem).unwrap();
            let (k, v) = t.to_vecs64f();
            // The doubles are the i64 draws / 100, with fractions, of both signs.
            let ti = generate_agg64(ex, spec, keys, Values::I64, 10_000, &mem).unwrap();
            let (ki, vi) = ti.to_vecs64();
            assert_eq!(k, ki);
            assert!(v.iter().zip(&vi).all(|(&f, &i)| f == i as f64 / 100.0));
            assert!(v.iter().any(|&x| x < 0.0) && v.iter().any(|&x| x.fract() != 0.0));
            let what = format!("{keys} {}", spec.dist);
            let want = reference::w2(&k, &v);
            let (got, _) = w2::<f64>(ex, &t).unwrap();
            assert!(AggDigest::of(&got).agrees(&AggDigest::of(&want)), "{what}");
            assert_f64_groups(got, &want, &what);
            let want1 = reference::w1(&k, &v);
            let (got1, _) = w1::<f64>(ex, &t).unwrap();
            assert!(MedianDigest::of(&got1).agrees(&MedianDigest::of(&want1)));
            assert_f64_medians(got1, &want1, &what);
        });
    }

    #[test]
    fn edge_cases_and_extreme_values() {
        let ex = &execs()[0];
        let keys = [0u64, u64::MAX, 0, 5, u64::MAX, 1 << 63];
        let vals = [i64::MIN, i64::MAX, 3, -4, -1, 0];
        let t = Table::from_rows64(&keys, &vals, 4).unwrap();
        assert_eq!(
            sorted2(w2::<i64>(ex, &t).unwrap().0),
            reference::w2(&keys, &vals)
        );
        let mut m = w1::<i64>(ex, &t).unwrap().0;
        m.sort_by_key(|x| x.key);
        // i64::MIN + 3 and i64::MAX + (-1): no overflow in the median of two values here.
        assert_eq!(m, reference::w1(&keys, &vals));
        let e = Table::from_rows64::<i64>(&[], &[], 4).unwrap();
        assert!(w2::<i64>(ex, &e).unwrap().0.is_empty());
        assert!(w1::<i64>(ex, &e).unwrap().0.is_empty());
        assert!(w2::<f64>(ex, &e).unwrap().0.is_empty());
        assert!(w1::<f64>(ex, &e).unwrap().0.is_empty());
        assert_eq!(w3(ex, &e, &e).unwrap().0, JoinDigest::default());
        // Duplicate R keys, misses, key 0 and u64::MAX.
        let rk = [0u64, 0, u64::MAX, 9];
        let rv = [1i64, 2, 3, 4];
        let sk = [0u64, u64::MAX, 8, 9, 9, 0];
        let sv = [10i64, 20, 30, 40, 50, 60];
        let r = Table::from_rows64(&rk, &rv, 3).unwrap();
        let s = Table::from_rows64(&sk, &sv, 2).unwrap();
        let got = w3(ex, &r, &s).unwrap().0;
        assert_eq!(got, reference::join(&rk, &rv, &sk, &sv));
        assert_eq!(got.count, 7);
    }

    #[test]
    fn f64_edge_values_negatives_and_groups_of_one() {
        let ex = &execs()[0];
        let tiny = f64::from_bits(1); // the smallest subnormal
                                      // Key 1: 1e300 and -1e300 (sum 0, median 0); key 2: one value (a group of one); key 3:
                                      // negatives only, an even count; key 4: signed zeros and subnormals; key u64::MAX: the
                                      // extremes with a finite sum; key 0: two decimals that do not add exactly.
        let rows: [(u64, f64); 16] = [
            (1, 1e300),
            (2, -7.25),
            (3, -0.5),
            (1, -1e300),
            (4, -0.0),
            (3, -1e-300),
            (4, tiny),
            (3, -3.0),
            (u64::MAX, f64::MAX),
            (3, -2.75),
            (4, 0.0),
            (u64::MAX, -f64::MAX),
            (0, 0.1),
            (4, -tiny),
            (0, 0.2),
            (u64::MAX, f64::MIN_POSITIVE),
        ];
        let (k, v): (Vec<u64>, Vec<f64>) = rows.iter().copied().unzip();
        for morsel in [1, 3, 16] {
            let t = Table::from_rows64(&k, &v, morsel).unwrap();
            let want = reference::w2(&k, &v);
            let got = w2::<f64>(ex, &t).unwrap().0;
            assert_f64_groups(got.clone(), &want, "edges");
            assert!(AggDigest::of(&got).agrees(&AggDigest::of(&want)));
            let g = |key| *want.iter().find(|g| g.key == key).unwrap();
            assert_eq!(
                (g(2).count, g(2).sum, g(2).min, g(2).max),
                (1, -7.25, -7.25, -7.25)
            );
            assert_eq!((g(3).min, g(3).max, g(3).count), (-3.0, -1e-300, 4));
            assert_eq!((g(4).min, g(4).max), (-tiny, tiny));
            assert_eq!(g(u64::MAX).min, -f64::MAX);
            assert_eq!(g(0).sum, 0.1 + 0.2);
            let m = w1::<f64>(ex, &t).unwrap().0;
            let want1 = reference::w1(&k, &v);
            assert_f64_medians(m.clone(), &want1, "edges");
            let med = |key| {
                m.iter()
                    .find(|x: &&Median64<f64>| x.key == key)
                    .unwrap()
                    .median()
            };
            // (lo + hi) / 2 of the two middle values, DuckDB's formula.
            assert_eq!(med(1), 0.0);
            assert_eq!(med(2), -7.25);
            assert_eq!(med(3), (-2.75 + -0.5) / 2.0);
            assert_eq!(med(4), 0.0);
            assert_eq!(med(0), (0.1 + 0.2) / 2.0);
            assert_eq!(med(u64::MAX), f64::MIN_POSITIVE);
        }
    }

    #[test]
    fn wrong_groups_change_the_digest() {
        let g = |key, sum| Group64 {
            key,
            count: 2,
            sum,
            min: 0,
            max: sum,
            avg: sum as f64 / 2.0,
        };
        let a = AggDigest::of(&[g(1, 10), g(2, 20)]);
        let b = AggDigest::of(&[g(2, 20), g(1, 10)]);
        assert!(a.agrees(&b), "order must not matter");
        // Same totals, rows moved between groups.
        let c = AggDigest::of(&[g(1, 20), g(2, 10)]);
        assert!(!a.agrees(&c));
        assert_eq!(tuple_hash(&[]), TUPLE_SEED);
    }

    #[test]
    fn f64_digests_tolerate_rounding_and_catch_wrong_groups() {
        let g = |key, sum: f64, min: f64| Group64 {
            key,
            count: 3,
            sum,
            min,
            max: 9.5,
            avg: sum / 3.0,
        };
        let a = AggDigest::of(&[g(1, 10.1, -0.0), g(2, 20.2, 1.0)]);
        // The other order of addition: the last bit of a sum differs; a min of +0.0 for -0.0.
        let near = 10.1f64.next_up();
        assert!(a.agrees(&AggDigest::of(&[g(2, 20.2, 1.0), g(1, near, 0.0)])));
        // Sums swapped between the groups, a min changed, a sum off by 1e-6: all caught.
        assert!(!a.agrees(&AggDigest::of(&[g(1, 20.2, -0.0), g(2, 10.1, 1.0)])));
        assert!(!a.agrees(&AggDigest::of(&[g(1, 10.1, -0.0), g(2, 20.2, 1.5)])));
        assert!(!a.agrees(&AggDigest::of(&[g(1, 10.1 + 1e-6, -0.0), g(2, 20.2, 1.0)])));
        let m = |key, twice_median: f64| Median64 {
            key,
            count: 2,
            twice_median,
        };
        let d = MedianDigest::of(&[m(1, 3.0), m(2, 5.0)]);
        assert!(d.agrees(&MedianDigest::of(&[m(2, 5.0), m(1, 3.0f64.next_up())])));
        assert!(!d.agrees(&MedianDigest::of(&[m(1, 5.0), m(2, 3.0)])));
    }

    #[test]
    fn join_matches_the_reference() {
        for ex in execs() {
            for keys in [Keys::Sparse, Keys::Dense] {
                let spec = JoinSpec::ratio16(20_000, 5);
                let (r, s) =
                    generate_join(&ex, spec, keys, 7_000, &MemPolicy::FirstTouch.into()).unwrap();
                let (rk, rv) = r.to_vecs64();
                let (sk, sv) = s.to_vecs64();
                let got = w3(&ex, &r, &s).unwrap().0;
                assert_eq!(got, reference::join(&rk, &rv, &sk, &sv), "{keys}");
                assert_eq!(got.count, 320_000);
            }
        }
    }
}
