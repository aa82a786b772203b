//! Simple single-thread answers: what the differential tests compare every configuration with.

use std::collections::BTreeMap;

use crate::agg::{GroupAgg, GroupMedian};

/// W2 by a BTreeMap.
pub fn w2(keys: &[u32], vals: &[u32]) -> Vec<GroupAgg> {
    let mut m: BTreeMap<u32, GroupAgg> = BTreeMap::new();
    for (&k, &v) in keys.iter().zip(vals) {
        m.entry(k).or_insert(GroupAgg::empty(k)).add(v);
    }
    m.into_values().collect()
}

/// W1 by sorting each group's values.
pub fn w1(keys: &[u32], vals: &[u32]) -> Vec<GroupMedian> {
    medians(keys, vals, |key, count, lo, hi| GroupMedian {
        key,
        count,
        twice_median: lo as u64 + hi as u64,
    })
}

/// Sorts each group's values and makes its answer with `median(key, count, lo, hi)`: `lo` and
/// `hi` are the two middle values (the same one for an odd count). Keys in order. Values are
/// integers or NaN-free floats.
pub fn medians<K: Ord + Copy, V: PartialOrd + Copy, T>(
    keys: &[K],
    vals: &[V],
    median: impl Fn(K, u64, V, V) -> T,
) -> Vec<T> {
    groups(keys, vals)
        .into_iter()
        .map(|(key, mut v)| {
            v.sort_unstable_by(|a, b| a.partial_cmp(b).expect("values are not NaN"));
            let n = v.len();
            median(key, n as u64, v[(n - 1) / 2], v[n / 2])
        })
        .collect()
}

/// Every value of each key, keys in order (the grouping all the reference answers start from).
pub fn groups<K: Ord + Copy, V: Copy>(keys: &[K], vals: &[V]) -> BTreeMap<K, Vec<V>> {
    let mut m: BTreeMap<K, Vec<V>> = BTreeMap::new();
    for (&k, &v) in keys.iter().zip(vals) {
        m.entry(k).or_default().push(v);
    }
    m
}

/// Calls `pair(key, r_val, s_val)` for every matching pair of an R row and an S row (S in row
/// order, R's payloads of a key in row order).
pub fn join_pairs<K: Ord + Copy, V: Copy>(
    rk: &[K],
    rv: &[V],
    sk: &[K],
    sv: &[V],
    mut pair: impl FnMut(K, V, V),
) {
    let m = groups(rk, rv);
    for (&k, &q) in sk.iter().zip(sv) {
        for &p in m.get(&k).into_iter().flatten() {
            pair(k, p, q);
        }
    }
}
