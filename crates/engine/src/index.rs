//! W4: index nested-loop join on the 64-bit tables (`u64` keys anywhere in the domain, `i64`
//! payloads). An index on R's key (R's keys must be unique: a primary key) is built once, then
//! every S row looks its key up. Build and probe are timed apart by the caller. The answer is
//! W3's [`JoinDigest`]: the pair count, `sum(r.val + s.val)` and the wrapping sum of
//! `tuple_hash([key, r.val, s.val])` over every matched pair.
//!
//! Index structures (well-kept crates where one exists):
//! - `sorted`: R's rows in key order (built by range-partitioning on the key's high bits over
//!   `[min, max]`, both found inside the build, and sorting the partitions in parallel), with a
//!   directory of where each high-bit bucket starts ([`Sorted`]), probed in batches;
//! - `btree`: `std::collections::BTreeMap`, bulk-built from the sorted rows;
//! - `skiplist`: `crossbeam_skiplist::SkipMap`, built concurrently by all workers;
//! - `art`: `blart::TreeMap` (an adaptive radix tree) on the key's 8 big-endian bytes, built by
//!   one task on one worker (the crate's map is not concurrent).
//!
//! No statistic of the data is kept beside the tables: the sorted build's key range is computed
//! inside the build, so inside the timed region. Probes run on all workers against the shared,
//! read-only index.

use std::collections::BTreeMap;

use crossbeam_skiplist::SkipMap;

use crate::exec::Exec;
use crate::join::JoinRun;
use crate::partition::partition_rows;
use crate::storage::Table;
use crate::wide::{JoinDigest, Row64};
use crate::EngineError;

/// Which index structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    Sorted,
    BTree,
    SkipList,
    Art,
}

named_choices!(IndexKind, "index", "sorted, btree, skiplist, art",
    Sorted => "sorted" | "array",
    BTree => "btree" | "b-tree",
    SkipList => "skiplist" | "skip-list",
    Art => "art",
);

impl IndexKind {
    /// Every kind.
    pub const ALL: [IndexKind; 4] = [
        IndexKind::Sorted,
        IndexKind::BTree,
        IndexKind::SkipList,
        IndexKind::Art,
    ];
}

/// A built index on R: key to payload.
pub enum Index {
    Sorted(Sorted),
    BTree(BTreeMap<u64, i64>),
    /// Boxed: the map itself is large (its head tower), the other variants are a few words.
    SkipList(Box<SkipMap<u64, i64>>),
    /// Keys as big-endian bytes, so the tree's byte order is the keys' order.
    Art(blart::TreeMap<[u8; 8], i64>),
}

impl Index {
    /// Payload of key `k`.
    #[inline]
    pub fn get(&self, k: u64) -> Option<i64> {
        match self {
            Index::Sorted(x) => x.get(k),
            Index::BTree(m) => m.get(&k).copied(),
            Index::SkipList(m) => m.get(&k).map(|e| *e.value()),
            Index::Art(m) => m.get(&k.to_be_bytes()).copied(),
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        match self {
            Index::Sorted(x) => x.rows.len(),
            Index::BTree(m) => m.len(),
            Index::SkipList(m) => m.len(),
            Index::Art(m) => m.len(),
        }
    }

    /// True when the index has no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn not_unique(rows: usize, distinct: usize) -> EngineError {
    EngineError::Invalid(format!(
        "R has {rows} rows but {distinct} distinct keys; an index nested-loop join needs unique R keys"
    ))
}

/// The index join runs on the 64-bit tables only.
fn check64(t: &Table, which: &str) -> Result<(), EngineError> {
    match t.morsels.iter().find(|m| m.width() != 8) {
        Some(m) => Err(EngineError::Invalid(format!(
            "{which} has {}-bit rows; the index join takes 64-bit tables (u64 keys, i64 payloads)",
            m.width() * 8
        ))),
        None => Ok(()),
    }
}

/// Home nodes of a table's morsels.
fn homes(t: &Table) -> Vec<Option<u32>> {
    t.morsels.iter().map(|m| m.home).collect()
}

/// Target rows per partition of the sorted build: a partition's rows (16 bytes each) sort in L2.
const SORT_PART_ROWS: usize = 1 << 13;
/// At most `2^MAX_SORT_BITS` partitions.
const MAX_SORT_BITS: u32 = 12;

/// Range partitioning of `[min, max]` into at most `2^bits` partitions of equal key width:
/// `(k - min) >> shift`.
#[derive(Clone, Copy)]
struct KeyRange {
    min: u64,
    shift: u32,
}

impl KeyRange {
    fn new(min: u64, max: u64, bits: u32) -> KeyRange {
        let width_bits = 64 - (max - min).leading_zeros();
        KeyRange {
            min,
            shift: width_bits.saturating_sub(bits),
        }
    }

    #[inline(always)]
    fn part(self, k: u64) -> usize {
        // shift is 64 only when max - min needs all 64 bits and bits is 0: one partition.
        k.wrapping_sub(self.min)
            .checked_shr(self.shift)
            .unwrap_or(0) as usize
    }

    /// Number of partitions for keys up to `max`.
    fn parts(self, max: u64) -> usize {
        self.part(max) + 1
    }
}

/// R's keys and payloads sorted by key, in parallel: the key range (one pass, part of the
/// build), a range partition on the high bits of `key - min`, a sort of each partition. Errors
/// on a duplicate key.
fn sorted_rows(exec: &Exec, r: &Table) -> Result<Vec<Row64>, EngineError> {
    let n = r.rows();
    let mm = exec.for_each(
        &homes(r),
        || (u64::MAX, 0u64),
        |(lo, hi): &mut (u64, u64), i| {
            for &k in r.morsels[i].keys64() {
                *lo = (*lo).min(k);
                *hi = (*hi).max(k);
            }
        },
    );
    let (min, max) = mm
        .states
        .into_iter()
        .fold((u64::MAX, 0u64), |a, b| (a.0.min(b.0), a.1.max(b.1)));
    if n == 0 || min > max {
        return Ok(vec![]);
    }
    let mut bits = 0;
    while bits < MAX_SORT_BITS && (n >> bits) > SORT_PART_ROWS {
        bits += 1;
    }
    let f = KeyRange::new(min, max, bits);
    let np = f.parts(max);
    let parts = partition_rows::<Row64, _, _>(
        exec,
        r,
        np,
        |mo, h| {
            for &k in mo.keys64() {
                h[f.part(k)] += 1;
            }
        },
        |mo, sink| {
            for (&k, &v) in mo.keys64().iter().zip(mo.vals64()) {
                sink.push(f.part(k), Row64 { k, v });
            }
        },
    )?;
    let mut offsets = Vec::with_capacity(np);
    let mut total = 0usize;
    for p in 0..np {
        offsets.push(total);
        total += parts.part(p).len();
    }
    debug_assert_eq!(total, n);
    let mut out = vec![Row64::default(); n];
    let op = crate::SendPtr(out.as_mut_ptr());
    let sorted = exec.for_each(
        &parts.homes,
        || (Vec::<Row64>::new(), 0usize),
        |(rows, dups): &mut (Vec<Row64>, usize), p| {
            rows.clear();
            rows.extend_from_slice(parts.part(p));
            rows.sort_unstable_by_key(|x| x.k);
            let len = rows.len();
            // SAFETY: partition p owns out[offsets[p]..offsets[p] + len] (its rows' count, laid
            // out back to back in partition order); ranges of different partitions are
            // disjoint, and `out` is not touched otherwise until this pass returns.
            let o = unsafe { std::slice::from_raw_parts_mut(op.ptr().add(offsets[p]), len) };
            o.copy_from_slice(rows);
            // Partitions are disjoint key ranges: equal keys can only be neighbours inside one.
            *dups += rows.windows(2).filter(|w| w[0].k == w[1].k).count();
        },
    );
    let dups: usize = sorted.states.iter().map(|s| s.1).sum();
    if dups > 0 {
        return Err(not_unique(n, n - dups));
    }
    Ok(out)
}

/// Builds the index of `kind` on R (a 64-bit table with unique keys).
pub fn build(exec: &Exec, r: &Table, kind: IndexKind) -> Result<Index, EngineError> {
    check64(r, "R")?;
    Ok(match kind {
        IndexKind::Sorted => Index::Sorted(Sorted::new(sorted_rows(exec, r)?)?),
        IndexKind::BTree => {
            // Sorted input: `from_iter` builds the tree in bulk.
            Index::BTree(
                sorted_rows(exec, r)?
                    .into_iter()
                    .map(|x| (x.k, x.v))
                    .collect(),
            )
        }
        IndexKind::SkipList => {
            let m = SkipMap::new();
            exec.for_each(
                &homes(r),
                || (),
                |_, i| {
                    let mo = &r.morsels[i];
                    for (&k, &v) in mo.keys64().iter().zip(mo.vals64()) {
                        m.insert(k, v);
                    }
                },
            );
            if m.len() != r.rows() {
                return Err(not_unique(r.rows(), m.len()));
            }
            Index::SkipList(Box::new(m))
        }
        IndexKind::Art => {
            // One task on one worker: the crate's map takes no concurrent inserts.
            let (m, _) = exec.one(|| {
                let mut m = blart::TreeMap::new();
                for mo in &r.morsels {
                    for (&k, &v) in mo.keys64().iter().zip(mo.vals64()) {
                        m.insert(k.to_be_bytes(), v);
                    }
                }
                m
            });
            if m.len() != r.rows() {
                return Err(not_unique(r.rows(), m.len()));
            }
            Index::Art(m)
        }
    })
}

/// Probe keys looked up side by side in [`Sorted::lookup`]: enough independent loads in flight to
/// cover a miss to memory, few enough that the lanes' state stays in registers and L1.
pub const PROBE_LANES: usize = 16;

/// Keys per directory bucket when keys spread evenly over their range: a bucket's keys then
/// share one or two cache lines.
const KEYS_PER_BUCKET: usize = 8;

#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The `sorted` index: R's rows in key order and a directory over the keys' high bits. Bucket
/// `b` holds the rows whose `(k - min) >> shift` is `b`, at `rows[starts[b]..starts[b + 1]]`;
/// there are about `len / KEYS_PER_BUCKET` buckets.
///
/// A plain binary search of an array larger than the caches waits on ~log2(n) dependent loads,
/// most of them misses. Through the directory a lookup is two dependent loads (the bucket's
/// bounds, then its rows' two cache lines, key and payload side by side) and a search inside
/// the bucket; keys bunched in a few buckets only lengthen those buckets' searches (log2 of the
/// bucket's size). This is the radix layer of RadixSpline and of range-partitioned sorted runs;
/// it needs no statistic of the data beyond the key range, which the build computes.
pub struct Sorted {
    rows: Vec<Row64>,
    range: KeyRange,
    max: u64,
    starts: Vec<u32>,
}

impl Sorted {
    /// The index of `rows`, sorted by key, without duplicate keys.
    pub fn new(rows: Vec<Row64>) -> Result<Sorted, EngineError> {
        let n = rows.len();
        debug_assert!(rows.windows(2).all(|w| w[0].k < w[1].k));
        if n > u32::MAX as usize {
            return Err(EngineError::Invalid(format!(
                "R has {n} rows; the sorted index holds at most {} keys",
                u32::MAX
            )));
        }
        let (min, max) = match (rows.first(), rows.last()) {
            (Some(a), Some(b)) => (a.k, b.k),
            _ => (0, 0),
        };
        let mut bits = 0;
        while bits < 32 && (n >> (bits + 1)) >= KEYS_PER_BUCKET {
            bits += 1;
        }
        let range = KeyRange::new(min, max, bits);
        let np = range.parts(max);
        // starts[b] = the first j whose key's bucket is >= b; one pass over the sorted rows.
        let mut starts = Vec::with_capacity(np + 1);
        for (j, x) in rows.iter().enumerate() {
            let b = range.part(x.k);
            while starts.len() <= b {
                starts.push(j as u32);
            }
        }
        starts.resize(np + 1, n as u32);
        Ok(Sorted {
            rows,
            range,
            max,
            starts,
        })
    }

    /// The row at position `j` (a position `lookup` reported).
    #[inline(always)]
    pub fn row(&self, j: usize) -> Row64 {
        self.rows[j]
    }

    /// The bucket of `k`, or `None` outside the keys' range.
    #[inline(always)]
    fn bucket(&self, k: u64) -> Option<usize> {
        (!self.rows.is_empty() && k >= self.range.min && k <= self.max).then(|| self.range.part(k))
    }

    /// Position of `k` in the bucket window `lo..hi`.
    #[inline(always)]
    fn find(&self, k: u64, lo: u32, hi: u32) -> Option<usize> {
        let w = &self.rows[lo as usize..hi as usize];
        w.binary_search_by_key(&k, |x| x.k)
            .ok()
            .map(|i| lo as usize + i)
    }

    /// Payload of key `k`.
    #[inline]
    pub fn get(&self, k: u64) -> Option<i64> {
        let b = self.bucket(k)?;
        self.find(k, self.starts[b], self.starts[b + 1])
            .map(|j| self.rows[j].v)
    }

    /// Looks every key of `probes` up and calls `hit(i, j)` when `probes[i] == rows[j].k`, in
    /// increasing `i`. [`PROBE_LANES`] lookups go in three steps side by side (group
    /// prefetching, as in Chen et al., "Improving hash join performance through prefetching"):
    /// every lane prefetches its bucket's bounds, then every lane reads them and prefetches the
    /// bucket's rows, then every lane searches its bucket; the lanes' misses overlap
    /// instead of queueing. Measured by `cargo run --release -p loci-engine --example probe`.
    pub fn lookup(&self, probes: &[u64], mut hit: impl FnMut(usize, usize)) {
        const NONE: usize = usize::MAX;
        for (c, group) in probes.chunks(PROBE_LANES).enumerate() {
            let mut bucket = [NONE; PROBE_LANES];
            for (j, &k) in group.iter().enumerate() {
                if let Some(b) = self.bucket(k) {
                    bucket[j] = b;
                    prefetch(self.starts.as_ptr().wrapping_add(b));
                }
            }
            let mut win = [(0u32, 0u32); PROBE_LANES];
            for j in 0..group.len() {
                if bucket[j] != NONE {
                    let (lo, hi) = (self.starts[bucket[j]], self.starts[bucket[j] + 1]);
                    win[j] = (lo, hi);
                    // the bucket's first two lines: about KEYS_PER_BUCKET rows of 16 bytes
                    let p = self.rows.as_ptr().wrapping_add(lo as usize);
                    prefetch(p);
                    prefetch(p.wrapping_add(4));
                }
            }
            for (j, &k) in group.iter().enumerate() {
                let (lo, hi) = win[j];
                if let Some(p) = self.find(k, lo, hi) {
                    hit(c * PROBE_LANES + j, p);
                }
            }
        }
    }
}

/// Probes the index with every S row (a 64-bit table): the join's [`JoinDigest`], as W3's.
pub fn probe(exec: &Exec, index: &Index, s: &Table) -> Result<(JoinDigest, JoinRun), EngineError> {
    check64(s, "S")?;
    let probed = exec.for_each(&homes(s), JoinDigest::default, |res, i| {
        let mo = &s.morsels[i];
        let (sk, sv) = (mo.keys64(), mo.vals64());
        if let Index::Sorted(x) = index {
            x.lookup(sk, |p, j| res.add_pair(sk[p], x.row(j).v, sv[p]));
            return;
        }
        for (&k, &q) in sk.iter().zip(sv) {
            if let Some(p) = index.get(k) {
                res.add_pair(k, p, q);
            }
        }
    });
    let res = probed
        .states
        .into_iter()
        .fold(JoinDigest::default(), JoinDigest::merge);
    Ok((
        res,
        JoinRun {
            probe_trace: probed.trace,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive(keys: &[u64], probes: &[u64]) -> Vec<(usize, usize)> {
        probes
            .iter()
            .enumerate()
            .filter_map(|(i, k)| keys.binary_search(k).ok().map(|j| (i, j)))
            .collect()
    }

    /// The batched lookup's hits, checked against `get` for every probe.
    fn batched(keys: &[u64], probes: &[u64]) -> Vec<(usize, usize)> {
        let rows = keys.iter().map(|&k| Row64 { k, v: !k as i64 }).collect();
        let x = Sorted::new(rows).unwrap();
        let mut out = vec![];
        x.lookup(probes, |i, j| out.push((i, j)));
        for (i, &k) in probes.iter().enumerate() {
            let want = out.iter().find(|h| h.0 == i).map(|&(_, j)| !keys[j] as i64);
            assert_eq!(x.get(k), want, "get({k})");
        }
        out
    }

    #[test]
    fn directory_lookup_edges() {
        // empty index, one key, keys at both ends of the domain, probes below/above every key,
        // a probe group that is not a multiple of the lane count
        assert!(batched(&[], &[1, 2, 3]).is_empty());
        assert_eq!(batched(&[7], &[6, 7, 8, 7]), vec![(1, 0), (3, 0)]);
        assert_eq!(
            batched(&[0, u64::MAX], &[u64::MAX, 0, 1, u64::MAX - 1]),
            vec![(0, 1), (1, 0)]
        );
        let keys: Vec<u64> = (0..1000u64).map(|i| i * (3 << 40) + 1).collect();
        let mut probes: Vec<u64> = vec![0, 1, 2, u64::MAX, 1 << 63, 4];
        probes.extend(keys.iter().step_by(7).flat_map(|&k| [k - 1, k, k + 1]));
        assert_eq!(batched(&keys, &probes), naive(&keys, &probes));
        assert_eq!(batched(&keys, &keys).len(), 1000);
        // bunched keys: a dense run plus outliers at the top of the domain put nearly every key
        // in the first bucket, whose search is then a plain binary search
        let mut keys: Vec<u64> = (0..5000u64).collect();
        keys.extend([1 << 40, 1 << 63, u64::MAX - 1, u64::MAX]);
        let mut probes: Vec<u64> = (0..6000u64).step_by(3).collect();
        probes.extend([1 << 40, (1 << 40) + 1, 1 << 63, u64::MAX, u64::MAX - 2]);
        assert_eq!(batched(&keys, &probes), naive(&keys, &probes));
    }

    #[test]
    fn directory_buckets_hold_exactly_their_keys() {
        for keys in [
            (0..100_000u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect::<Vec<_>>(),
            (0..100_000u64).map(|i| i * 3).collect(),
            vec![5],
        ] {
            let mut keys = keys;
            keys.sort_unstable();
            let n = keys.len();
            let x = Sorted::new(keys.iter().map(|&k| Row64 { k, v: 0 }).collect()).unwrap();
            assert_eq!(x.starts.len(), x.range.parts(x.max) + 1);
            assert_eq!((x.starts[0], *x.starts.last().unwrap()), (0, n as u32));
            for b in 0..x.starts.len() - 1 {
                let (lo, hi) = (x.starts[b] as usize, x.starts[b + 1] as usize);
                assert!(lo <= hi);
                assert!(keys[lo..hi].iter().all(|&k| x.range.part(k) == b));
            }
            // at most n / KEYS_PER_BUCKET buckets, and not far fewer
            if n >= 16 {
                let buckets = x.starts.len() - 1;
                assert!(buckets * KEYS_PER_BUCKET <= n && buckets * KEYS_PER_BUCKET * 2 > n / 2);
            }
        }
    }

    #[test]
    fn key_range_partitions_cover_the_whole_domain() {
        // max - min needs all 64 bits: with 0 bits, one partition (no shift by 64)
        let f = KeyRange::new(0, u64::MAX, 0);
        assert_eq!((f.parts(u64::MAX), f.part(0), f.part(u64::MAX)), (1, 0, 0));
        let f = KeyRange::new(0, u64::MAX, 4);
        assert_eq!((f.parts(u64::MAX), f.part(1 << 60), f.part(0)), (16, 1, 0));
        // one key: one partition
        let f = KeyRange::new(5, 5, 12);
        assert_eq!(f.parts(5), 1);
        // dense keys 0..1000 over 2^3 partitions keep key order
        let f = KeyRange::new(0, 999, 3);
        assert!(f.parts(999) <= 8);
        assert!((0..999).all(|k| f.part(k) <= f.part(k + 1)));
    }

    proptest! {
        #[test]
        fn directory_lookup_equals_binary_search(
            mut keys in proptest::collection::vec(
                prop_oneof![Just(0u64), Just(u64::MAX), Just(1u64 << 63), any::<u64>()], 0..300),
            probes in proptest::collection::vec(any::<u64>(), 0..100),
            extra in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
        ) {
            keys.sort_unstable();
            keys.dedup();
            // some probes hit: draw them from the keys themselves (duplicates among them too)
            let mut probes = probes;
            if !keys.is_empty() {
                probes.extend(extra.iter().map(|ix| keys[ix.index(keys.len())]));
            }
            probes.extend([0, u64::MAX]);
            prop_assert_eq!(batched(&keys, &probes), naive(&keys, &probes));
        }
    }
}
