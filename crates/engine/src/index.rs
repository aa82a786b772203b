//! W4: index nested-loop join. An index on R's key (R's keys must be unique: a primary key) is
//! built once, then every S row looks its key up. Build and probe are timed apart by the caller.
//!
//! Index structures (well-kept crates where one exists):
//! - `sorted`: sorted key and payload arrays (built by range-partitioning on the key's top bits
//!   and sorting the partitions in parallel), probed by branch-free binary search;
//! - `btree`: `std::collections::BTreeMap`, bulk-built from the sorted rows;
//! - `skiplist`: `crossbeam_skiplist::SkipMap`, built concurrently by all workers;
//! - `art`: `blart::TreeMap` (an adaptive radix tree) on big-endian key bytes, built by one
//!   task on one worker (the crate's map is not concurrent).
//!
//! Probes run on all workers against the shared, read-only index.

use std::collections::BTreeMap;

use crossbeam_skiplist::SkipMap;

use crate::exec::Exec;
use crate::join::{JoinResult, JoinRun};
use crate::partition::{key_of, partition, val_of, RangePart};
use crate::storage::Table;
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

/// A built index on R.
pub enum Index {
    Sorted {
        keys: Vec<u32>,
        vals: Vec<u32>,
    },
    BTree(BTreeMap<u32, u32>),
    /// Boxed: the map itself is large (its head tower), the other variants are a few words.
    SkipList(Box<SkipMap<u32, u32>>),
    Art(blart::TreeMap<[u8; 4], u32>),
}

impl Index {
    /// Payload of key `k`.
    #[inline]
    pub fn get(&self, k: u32) -> Option<u32> {
        match self {
            Index::Sorted { keys, vals } => {
                let mut len = keys.len();
                if len == 0 {
                    return None;
                }
                // Binary search for the last key <= k. Left to the compiler's choice of a
                // branch: a mispredicted branch costs a flush, but the speculated path also
                // starts the next loads early, and one search alone measured faster that way
                // than with a forced select (`examples/probe.rs`).
                let mut base = 0usize;
                while len > 1 {
                    let half = len / 2;
                    // SAFETY: base + half < base + len <= keys.len().
                    let probe = unsafe { *keys.get_unchecked(base + half) };
                    base = if probe <= k { base + half } else { base };
                    len -= half;
                }
                (keys[base] == k).then(|| vals[base])
            }
            Index::BTree(m) => m.get(&k).copied(),
            Index::SkipList(m) => m.get(&k).map(|e| *e.value()),
            Index::Art(m) => m.get(&k.to_be_bytes()).copied(),
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        match self {
            Index::Sorted { keys, .. } => keys.len(),
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

/// R's rows sorted by key, in parallel: range-partition on the top key bits, sort each
/// partition. Errors on a duplicate key.
fn sorted_rows(exec: &Exec, r: &Table) -> Result<Vec<u64>, EngineError> {
    let Some((min, max)) = r.key_range else {
        return Ok(vec![]);
    };
    let width = (max - min) as u64 + 1;
    let bits = 64 - (width - 1).leading_zeros();
    let f = RangePart::new(min, max, bits.saturating_sub(10));
    let parts = partition(exec, r, &f)?;
    let mut offsets = Vec::with_capacity(parts.len() + 1);
    let mut total = 0usize;
    for p in 0..parts.len() {
        offsets.push(total);
        total += parts.part(p).len();
    }
    let mut out = vec![0u64; total];
    let base = crate::SendPtr(out.as_mut_ptr());
    exec.for_each(
        &parts.homes,
        || (),
        |_, p| {
            let src = parts.part(p);
            // SAFETY: partition p owns out[offsets[p]..offsets[p]+len]; ranges are disjoint.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(base.ptr().add(offsets[p]), src.len()) };
            dst.copy_from_slice(src);
            dst.sort_unstable();
        },
    );
    let dups = out
        .windows(2)
        .filter(|w| key_of(w[0]) == key_of(w[1]))
        .count();
    if dups > 0 {
        return Err(not_unique(out.len(), out.len() - dups));
    }
    Ok(out)
}

/// Home nodes of a table's morsels.
fn homes(t: &Table) -> Vec<Option<u32>> {
    t.morsels.iter().map(|m| m.home).collect()
}

/// Builds the index of `kind` on R.
pub fn build(exec: &Exec, r: &Table, kind: IndexKind) -> Result<Index, EngineError> {
    Ok(match kind {
        IndexKind::Sorted => {
            let rows = sorted_rows(exec, r)?;
            Index::Sorted {
                keys: rows.iter().map(|&x| key_of(x)).collect(),
                vals: rows.iter().map(|&x| val_of(x)).collect(),
            }
        }
        IndexKind::BTree => {
            let rows = sorted_rows(exec, r)?;
            Index::BTree(rows.iter().map(|&x| (key_of(x), val_of(x))).collect())
        }
        IndexKind::SkipList => {
            let m = SkipMap::new();
            exec.for_each(
                &homes(r),
                || (),
                |_, i| {
                    let mo = &r.morsels[i];
                    for (&k, &v) in mo.keys().iter().zip(mo.vals()) {
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
                    for (&k, &v) in mo.keys().iter().zip(mo.vals()) {
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

/// Probe keys searched side by side in [`sorted_lookup`]: enough independent loads in flight to
/// cover a miss to memory, few enough that the lanes' state stays in registers and L1.
pub const PROBE_LANES: usize = 16;

#[inline(always)]
fn prefetch(p: *const u32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Looks every key of `probes` up in the sorted, duplicate-free `keys` and calls `hit(i, j)`
/// when `probes[i] == keys[j]`, in increasing `i`.
///
/// One binary search at a time waits on each of its ~log2(n) dependent loads; on an array
/// larger than the caches most are misses, so a lookup costs log2(n) memory latencies. Here
/// [`PROBE_LANES`] searches advance in lock step (group prefetching, as in Chen et al.,
/// "Improving hash join performance through prefetching"): every search of a sorted array of n
/// keys takes the same sequence of halvings, so one step moves every lane and prefetches the
/// key each lane reads next, and the lanes' misses overlap instead of queueing. Measured
/// against the one-at-a-time search by `cargo run --release -p loci-engine --example probe`.
pub fn sorted_lookup(keys: &[u32], probes: &[u32], mut hit: impl FnMut(usize, usize)) {
    let n = keys.len();
    if n == 0 {
        return;
    }
    for (c, group) in probes.chunks(PROBE_LANES).enumerate() {
        let g = group.len();
        let mut base = [0usize; PROBE_LANES];
        let mut len = n;
        while len > 1 {
            let half = len / 2;
            let next = (len - half) / 2;
            for j in 0..g {
                // SAFETY: base[j] + half < base[j] + len <= n: every lane's window
                // [base, base + len) stays inside `keys` (base moves by at most half while
                // len shrinks by half).
                let probe = unsafe { *keys.get_unchecked(base[j] + half) };
                // a select, not a jump: the outcome is a coin flip
                let b = base[j] + std::hint::select_unpredictable(probe <= group[j], half, 0);
                base[j] = b;
                prefetch(keys.as_ptr().wrapping_add(b + next));
            }
            len -= half;
        }
        for j in 0..g {
            if keys[base[j]] == group[j] {
                hit(c * PROBE_LANES + j, base[j]);
            }
        }
    }
}

/// Probes the index with every S row: count and checksum as in W3.
pub fn probe(exec: &Exec, index: &Index, s: &Table) -> (JoinResult, JoinRun) {
    let probed = exec.for_each(&homes(s), JoinResult::default, |res, i| {
        let mo = &s.morsels[i];
        if let Index::Sorted { keys, vals } = index {
            let sv = mo.vals();
            sorted_lookup(keys, mo.keys(), |p, j| {
                res.count += 1;
                res.checksum = res.checksum.wrapping_add(vals[j] as u64 + sv[p] as u64);
            });
            return;
        }
        for (&k, &v) in mo.keys().iter().zip(mo.vals()) {
            if let Some(rv) = index.get(k) {
                res.count += 1;
                res.checksum = res.checksum.wrapping_add(rv as u64 + v as u64);
            }
        }
    });
    let res = probed
        .states
        .into_iter()
        .fold(JoinResult::default(), |a, b| JoinResult {
            count: a.count + b.count,
            checksum: a.checksum.wrapping_add(b.checksum),
        });
    (
        res,
        JoinRun {
            probe_trace: probed.trace,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive(keys: &[u32], probes: &[u32]) -> Vec<(usize, usize)> {
        probes
            .iter()
            .enumerate()
            .filter_map(|(i, k)| keys.binary_search(k).ok().map(|j| (i, j)))
            .collect()
    }

    fn lockstep(keys: &[u32], probes: &[u32]) -> Vec<(usize, usize)> {
        let mut out = vec![];
        sorted_lookup(keys, probes, |i, j| out.push((i, j)));
        out
    }

    #[test]
    fn lockstep_search_edges() {
        // empty index, one key, keys at both ends, probes below/above every key, a probe
        // group that is not a multiple of the lane count
        assert!(lockstep(&[], &[1, 2, 3]).is_empty());
        assert_eq!(lockstep(&[7], &[6, 7, 8, 7]), vec![(1, 0), (3, 0)]);
        let keys: Vec<u32> = (0..1000).map(|i| i * 3 + 1).collect();
        let probes: Vec<u32> = vec![0, 1, 2, 2998, 2999, u32::MAX, 4, 1500, 1501];
        assert_eq!(lockstep(&keys, &probes), naive(&keys, &probes));
        let all: Vec<u32> = (0..3100).collect();
        assert_eq!(lockstep(&keys, &all), naive(&keys, &all));
        assert_eq!(lockstep(&keys, &all).len(), 1000);
    }

    proptest! {
        #[test]
        fn lockstep_search_equals_binary_search(
            mut keys in proptest::collection::vec(any::<u32>(), 0..300),
            probes in proptest::collection::vec(any::<u32>(), 0..100),
            extra in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
        ) {
            keys.sort_unstable();
            keys.dedup();
            // half the probes hit: draw some from the keys themselves
            let mut probes = probes;
            if !keys.is_empty() {
                probes.extend(extra.iter().map(|ix| keys[ix.index(keys.len())]));
            }
            prop_assert_eq!(lockstep(&keys, &probes), naive(&keys, &probes));
        }
    }
}
