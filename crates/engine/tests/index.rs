//! W4's indexes on 64-bit keys against a naive nested loop: every index kind, built on R with
//! unique keys, probed with S; the keys are adversarial (0, u64::MAX, 2^63, neighbours of R's
//! keys, duplicates on the probe side, misses), the payloads too (i64::MIN, i64::MAX).

use loci_engine::exec::flat_topology;
use loci_engine::index::{build, probe, IndexKind};
use loci_engine::wide::{tuple_hash, JoinDigest};
use loci_engine::{Exec, Sched, Strategy, Table};
use proptest::prelude::*;

/// The join by a nested loop over every (S row, R row): count, payload sum and pair digest,
/// written out here rather than through `JoinDigest::add_pair`.
fn nested_loop(rk: &[u64], rv: &[i64], sk: &[u64], sv: &[i64]) -> JoinDigest {
    let mut d = JoinDigest::default();
    for (&k, &q) in sk.iter().zip(sv) {
        for (&rkey, &p) in rk.iter().zip(rv) {
            if rkey == k {
                d.count += 1;
                d.sum = d.sum.wrapping_add(p.wrapping_add(q));
                d.hash = d.hash.wrapping_add(tuple_hash(&[k, p as u64, q as u64]));
            }
        }
    }
    d
}

fn execs() -> Vec<Exec> {
    let t = flat_topology();
    vec![
        Exec::new(&t, Sched::Las, Strategy::sparse(), None).unwrap(),
        Exec::new(&t, Sched::Nls, Strategy::os(), Some(1)).unwrap(),
    ]
}

/// Every index kind against the nested loop, and `Index::get` against R for every probe key.
fn check(ex: &Exec, rk: &[u64], rv: &[i64], sk: &[u64], sv: &[i64], morsel: usize) {
    let want = nested_loop(rk, rv, sk, sv);
    let r = Table::from_rows64(rk, rv, morsel).unwrap();
    let s = Table::from_rows64(sk, sv, morsel).unwrap();
    for kind in IndexKind::ALL {
        let idx = build(ex, &r, kind).unwrap();
        assert_eq!(idx.len(), rk.len(), "{kind}");
        assert_eq!(probe(ex, &idx, &s).unwrap().0, want, "{kind}");
        for &k in sk {
            let at = rk.iter().position(|&x| x == k).map(|i| rv[i]);
            assert_eq!(idx.get(k), at, "{kind} get({k})");
        }
    }
}

/// Keys that break careless code: both ends of the domain, the sign bit, their neighbours.
fn edge_key() -> impl proptest::strategy::Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1u64),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(1u64 << 63),
        Just((1u64 << 63) - 1),
        Just(u32::MAX as u64),
        Just(1u64 << 32),
        any::<u64>(),
        0u64..64,
    ]
}

#[test]
fn fixed_edges() {
    let rk = [0u64, u64::MAX, 1 << 63, 7, u64::MAX - 1];
    let rv = [i64::MIN, i64::MAX, -1, 0, 1];
    // duplicates on the probe side, misses next to every hit, the empty probe side
    let sk = [
        0u64,
        0,
        u64::MAX,
        u64::MAX,
        u64::MAX - 2,
        1,
        (1 << 63) - 1,
        1 << 63,
        (1 << 63) + 1,
        6,
        7,
        8,
    ];
    let sv = [1i64, -1, i64::MAX, i64::MIN, 5, 6, 7, 8, 9, 10, 11, 12];
    for ex in &execs() {
        check(ex, &rk, &rv, &sk, &sv, 2);
        check(ex, &rk, &rv, &[], &[], 2);
        check(ex, &[], &[], &sk, &sv, 3);
        check(
            ex,
            &[u64::MAX],
            &[3],
            &[u64::MAX, 0, u64::MAX],
            &[1, 2, 3],
            1,
        );
        // dense keys 0..n, probed with every key and its neighbours
        let rk: Vec<u64> = (0..5000).collect();
        let rv: Vec<i64> = rk.iter().map(|&k| k as i64 * -3).collect();
        let sk: Vec<u64> = (0..5100).rev().collect();
        let sv: Vec<i64> = sk.iter().map(|&k| k as i64).collect();
        check(ex, &rk, &rv, &sk, &sv, 777);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn every_index_equals_a_nested_loop(
        r in proptest::collection::btree_map(edge_key(), any::<i64>(), 0..200),
        misses in proptest::collection::vec((edge_key(), any::<i64>()), 0..60),
        hits in proptest::collection::vec((any::<prop::sample::Index>(), any::<i64>()), 0..200),
        morsel in 1usize..64,
        which in 0usize..2,
    ) {
        // R: unique keys (a map), rows in shuffled order so the build must sort
        let mut rows: Vec<(u64, i64)> = r.into_iter().collect();
        let n = rows.len();
        for i in 0..n {
            rows.swap(i, (i * 7919 + 13) % n);
        }
        let rk: Vec<u64> = rows.iter().map(|x| x.0).collect();
        let rv: Vec<i64> = rows.iter().map(|x| x.1).collect();
        // S: R's keys drawn with repeats (duplicates on the probe side), mixed with misses
        let mut s: Vec<(u64, i64)> = misses;
        if n > 0 {
            s.extend(hits.iter().map(|(ix, v)| (rk[ix.index(n)], *v)));
        }
        s.sort_by_key(|x| x.1);
        let sk: Vec<u64> = s.iter().map(|x| x.0).collect();
        let sv: Vec<i64> = s.iter().map(|x| x.1).collect();
        check(&execs()[which], &rk, &rv, &sk, &sv, morsel);
    }
}
