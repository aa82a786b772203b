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
use std::fmt;
use std::str::FromStr;

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

impl IndexKind {
    /// Names accepted by [`FromStr`].
    pub const CHOICES: &'static str = "sorted, btree, skiplist, art";
    /// Every kind.
    pub const ALL: [IndexKind; 4] = [
        IndexKind::Sorted,
        IndexKind::BTree,
        IndexKind::SkipList,
        IndexKind::Art,
    ];
}

impl fmt::Display for IndexKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IndexKind::Sorted => "sorted",
            IndexKind::BTree => "btree",
            IndexKind::SkipList => "skiplist",
            IndexKind::Art => "art",
        })
    }
}

impl FromStr for IndexKind {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "sorted" | "array" => IndexKind::Sorted,
            "btree" | "b-tree" => IndexKind::BTree,
            "skiplist" | "skip-list" => IndexKind::SkipList,
            "art" => IndexKind::Art,
            _ => {
                return Err(EngineError::BadChoice {
                    what: "index",
                    given: s.into(),
                    valid: Self::CHOICES,
                })
            }
        })
    }
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
                // Branch-free search for the last key <= k.
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

/// Probes the index with every S row: count and checksum as in W3.
pub fn probe(exec: &Exec, index: &Index, s: &Table) -> (JoinResult, JoinRun) {
    let probed = exec.for_each(&homes(s), JoinResult::default, |res, i| {
        let mo = &s.morsels[i];
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
