//! Simple single-thread answers: what the differential tests compare every configuration with.

use std::collections::BTreeMap;

use crate::agg::{GroupAgg, GroupMedian};
use crate::join::JoinResult;

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
    let mut m: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&k, &v) in keys.iter().zip(vals) {
        m.entry(k).or_default().push(v);
    }
    m.into_iter()
        .map(|(key, mut v)| {
            v.sort_unstable();
            let n = v.len();
            let twice_median = if n % 2 == 1 {
                2 * v[n / 2] as u64
            } else {
                v[n / 2 - 1] as u64 + v[n / 2] as u64
            };
            GroupMedian {
                key,
                count: n as u64,
                twice_median,
            }
        })
        .collect()
}

/// Join count and checksum by a BTreeMap of R's keys to all their payloads.
pub fn join(rk: &[u32], rv: &[u32], sk: &[u32], sv: &[u32]) -> JoinResult {
    let mut m: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&k, &v) in rk.iter().zip(rv) {
        m.entry(k).or_default().push(v);
    }
    let mut res = JoinResult::default();
    for (&k, &v) in sk.iter().zip(sv) {
        if let Some(ps) = m.get(&k) {
            for &p in ps {
                res.count += 1;
                res.checksum = res.checksum.wrapping_add(p as u64 + v as u64);
            }
        }
    }
    res
}
