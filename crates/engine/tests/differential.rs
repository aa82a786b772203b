//! Differential tests: every memory placement, scheduler (LAS, NLS, unpinned), locality
//! (balanced, strict), thread placement, worker count and morsel size gives the same answer as
//! the single-thread reference, on every dataset and the edge cases (empty input, one group,
//! all-distinct keys, skew, sparse keys, extreme keys and values, duplicate join keys and
//! misses). Allocators: `allocators_agree`
//! re-runs the matrix and edge-case tests under each Debian allocator library found
//! (LD_PRELOAD), as `loci bench --alloc` does.

use loci_engine::agg::{w1, w1_lists, w2};
use loci_engine::exec::flat_topology;
use loci_engine::index::{build, probe, IndexKind};
use loci_engine::wide;
use loci_engine::{
    generate, generate_agg, generate_join, reference, AggSpec, Dist, Exec, Fill, Gen, JoinSpec,
    Keys, Locality, MemPolicy, Sched, Strategy, Table, TableMem,
};
use proptest::prelude::*;

/// Every scheduler, each thread placement, one worker and all cpus.
fn execs() -> Vec<Exec> {
    let t = flat_topology();
    [
        (Sched::Las, Strategy::sparse(), None, Locality::Balanced),
        (Sched::Las, Strategy::sparse(), None, Locality::Strict),
        (Sched::Las, Strategy::os(), Some(1), Locality::Balanced),
        (Sched::Las, Strategy::os(), Some(1), Locality::Strict),
        (Sched::Nls, Strategy::compact(), None, Locality::Balanced),
        (Sched::Nls, Strategy::sparse(), Some(1), Locality::Strict),
        (Sched::Unpinned, Strategy::os(), None, Locality::Balanced),
    ]
    .into_iter()
    .map(|(s, th, n, l)| Exec::new(&t, s, th, n).unwrap().with_locality(l))
    .collect()
}

fn name(ex: &Exec) -> String {
    format!(
        "{}/{}/{}w/{}",
        ex.policy().name(),
        ex.threads(),
        ex.workers(),
        ex.locality()
    )
}

fn policies() -> Vec<TableMem> {
    ["first-touch", "interleave", "bind:0", "per-node"]
        .into_iter()
        .map(|p| TableMem::from(p.parse::<MemPolicy>().unwrap()))
        .chain([TableMem {
            policy: MemPolicy::FirstTouch,
            gen: Gen::OneThread,
        }])
        .collect()
}

fn check_agg(pool: &Exec, t: &Table, what: &str) {
    let (k, v) = t.to_vecs();
    let want2 = reference::w2(&k, &v);
    assert_eq!(w2(pool, t).unwrap().0, want2, "w2 {what}");
    let want1 = reference::w1(&k, &v);
    assert_eq!(w1(pool, t).unwrap().0, want1, "w1 {what}");
    assert_eq!(w1_lists(pool, t).unwrap().0, want1, "w1 lists {what}");
}

/// W4 on 64-bit tables: a probe of every index kind (built on `r`, unique keys) and W3's hash
/// join against the reference join digest; the reference's match count.
fn check_index_joins(pool: &Exec, r: &Table, s: &Table, what: &str) -> u64 {
    let (rk, rv) = r.to_vecs64();
    let (sk, sv) = s.to_vecs64();
    let want = wide::reference::join(&rk, &rv, &sk, &sv);
    assert_eq!(wide::w3(pool, r, s).unwrap().0, want, "w3 {what}");
    for kind in IndexKind::ALL {
        let idx = build(pool, r, kind).unwrap();
        assert_eq!(idx.len(), rk.len(), "{kind} {what}");
        assert_eq!(probe(pool, &idx, s).unwrap().0, want, "{kind} {what}");
    }
    want.count
}

#[test]
fn aggregation_matches_reference_on_every_dataset_and_configuration() {
    let execs = execs();
    for dist in Dist::ALL {
        for groups in [1u32, 7, 5000, 40_000] {
            let spec = AggSpec {
                rows: 30_000,
                groups,
                dist,
                seed: 11,
            };
            for (i, pool) in execs.iter().enumerate() {
                for pol in policies() {
                    // Vary the morsel size with the configuration: tiny, odd, and one morsel.
                    let morsel = [1000, 4097, 30_000, 777, 2048, 1500, 5003][i];
                    let t = generate_agg(pool, spec, None, morsel, &pol).unwrap();
                    check_agg(pool, &t, &format!("{dist} g={groups} {} {pol}", name(pool)));
                }
            }
        }
    }
}

/// The whole matrix (every scheduler x memory placement) on small versions of every dataset
/// (one group, 300 groups, more groups than rows: all distinct for `sequential`) and one join,
/// every operator and index: re-run under each allocator by `allocators_agree`.
#[test]
fn matrix_matches_reference() {
    for pool in &execs() {
        for pol in policies() {
            let what = format!("{} {pol}", name(pool));
            for dist in Dist::ALL {
                for groups in [1, 300, 10_000] {
                    let spec = AggSpec {
                        rows: 6000,
                        groups,
                        dist,
                        seed: 5,
                    };
                    let t = generate_agg(pool, spec, None, 500, &pol).unwrap();
                    check_agg(pool, &t, &format!("{what} {dist} g={groups}"));
                }
            }
            let js = JoinSpec::ratio16(400, 8);
            for keys in [Keys::Sparse, Keys::Dense] {
                let (r, s) = generate_join(pool, js, keys, 700, &pol).unwrap();
                check_index_joins(pool, &r, &s, &format!("{what} {keys}"));
            }
        }
    }
}

#[test]
fn aggregation_edge_cases() {
    for pool in &execs() {
        aggregation_edge_cases_on(pool);
    }
}

fn aggregation_edge_cases_on(pool: &Exec) {
    // Empty input.
    let t = Table::from_rows(&[], &[], 100).unwrap();
    assert!(w2(pool, &t).unwrap().0.is_empty());
    assert!(w1(pool, &t).unwrap().0.is_empty());
    // All-distinct keys: sequential with more groups than rows.
    let spec = AggSpec {
        rows: 20_000,
        groups: 1_000_000,
        dist: Dist::Sequential,
        seed: 1,
    };
    let t = generate_agg(pool, spec, None, 3000, &MemPolicy::FirstTouch.into()).unwrap();
    assert_eq!(w2(pool, &t).unwrap().0.len(), 20_000);
    check_agg(pool, &t, "all distinct");
    // Sparse keys over the whole u32 range (hash-partitioned plans), extremes included.
    let mut keys: Vec<u32> = (0..20_000u32)
        .map(|i| loci_engine::gen::perm32(5, i % 3000))
        .collect();
    keys[0] = u32::MAX;
    keys[1] = 0;
    keys[2] = u32::MAX;
    let vals: Vec<u32> = (0..20_000u32).map(|i| i.wrapping_mul(2654435761)).collect();
    let t = Table::from_rows(&keys, &vals, 999).unwrap();
    assert_eq!(w2(pool, &t).unwrap().1.plan, "hash-partitioned");
    check_agg(pool, &t, "sparse");
    // Extreme values.
    let t = Table::from_rows(&[3, 3, 3, 9], &[u32::MAX, 0, u32::MAX, 5], 2).unwrap();
    check_agg(pool, &t, "extreme values");
    let g = w2(pool, &t).unwrap().0;
    assert_eq!(g[0].sum, 2 * u32::MAX as u64);
    assert_eq!(w1(pool, &t).unwrap().0[0].twice_median, 2 * u32::MAX as u64);
}

#[test]
fn joins_match_reference_on_every_configuration() {
    for (i, pool) in execs().iter().enumerate() {
        for pol in policies() {
            for r_rows in [0usize, 1, 300, 20_000] {
                let spec = JoinSpec::ratio16(r_rows, 3 + i as u64);
                let morsel = [1000, 4097, 50_000, 777, 3000, 2500, 6001][i];
                for keys in [Keys::Sparse, Keys::Dense] {
                    let (r, s) = generate_join(pool, spec, keys, morsel, &pol).unwrap();
                    let what = format!("{} {pol} r={r_rows} {keys}", name(pool));
                    assert_eq!(check_index_joins(pool, &r, &s, &what), spec.s_rows as u64);
                }
            }
        }
    }
}

#[test]
fn joins_handle_duplicates_misses_and_the_empty_marker() {
    for pool in &execs() {
        joins_edge_cases_on(pool);
    }
}

fn joins_edge_cases_on(pool: &Exec) {
    // Index joins take 64-bit tables and say so.
    let r = Table::from_rows(&[5, 7, u32::MAX], &[1, 2, u32::MAX], 2).unwrap();
    for kind in IndexKind::ALL {
        let e = build(pool, &r, kind).err().expect("32-bit R rejected");
        assert!(e.to_string().contains("64-bit"), "{kind}: {e}");
    }
    // Index joins need unique R keys and say so; duplicates on the probe side are fine.
    let rk = [5u64, 9, u64::MAX, 0, 5];
    let rv = [1i64, 2, i64::MIN, i64::MAX, 3];
    let r = Table::from_rows64(&rk, &rv, 2).unwrap();
    for kind in IndexKind::ALL {
        let e = build(pool, &r, kind)
            .err()
            .expect("duplicates rejected")
            .to_string();
        assert!(
            e.contains("unique") && e.contains("4 distinct"),
            "{kind}: {e}"
        );
    }
    let r = Table::from_rows64(&rk[..4], &rv[..4], 3).unwrap();
    let sk = [u64::MAX, 0, 0, 8, u64::MAX, 9, 1];
    let sv = [-1i64, i64::MIN, 2, 3, i64::MAX, 4, 5];
    let s = Table::from_rows64(&sk, &sv, 2).unwrap();
    assert_eq!(check_index_joins(pool, &r, &s, "edges"), 5);
    let s32 = Table::from_rows(&[5], &[1], 2).unwrap();
    let idx = build(pool, &r, IndexKind::Sorted).unwrap();
    let e = probe(pool, &idx, &s32).expect_err("32-bit S rejected");
    assert!(e.to_string().contains("S has 32-bit rows"), "{e}");
}

#[test]
fn generation_is_independent_of_workers_and_morsels() {
    let spec = AggSpec {
        rows: 50_000,
        groups: 1000,
        dist: Dist::Zipf,
        seed: 42,
    };
    let ps = execs();
    let a = generate_agg(&ps[1], spec, None, 50_000, &MemPolicy::FirstTouch.into()).unwrap();
    let b = generate_agg(
        &ps[4],
        spec,
        None,
        1234,
        &MemPolicy::Interleave(None).into(),
    )
    .unwrap();
    assert_eq!(a.to_vecs(), b.to_vecs());
    assert_eq!(a.key_range, b.key_range);
}

#[test]
fn first_touch_homes_are_where_the_pages_are() {
    let pool = &execs()[0];
    let (t, trace) = generate(
        pool,
        100_000,
        8192,
        &MemPolicy::FirstTouch.into(),
        Fill::U32(&|s, k, v| {
            for (j, (a, b)) in k.iter_mut().zip(v.iter_mut()).enumerate() {
                *a = (s as u32).wrapping_add(j as u32);
                *b = 1;
            }
        }),
    )
    .unwrap();
    assert_eq!(trace.touched.len(), t.morsels.len());
    let pl = t.placement(8).unwrap();
    for (m, p) in t.morsels.iter().zip(&pl) {
        assert_eq!(m.home, Some(0));
        assert_eq!(p, &vec![(0, 1.0)]);
    }
    let ratio = loci_engine::storage::local_access_ratio(&t, &pl, &trace.touched).unwrap();
    assert!((ratio - 1.0).abs() < 1e-9, "{ratio}");
}

#[test]
fn bad_configuration_is_named() {
    let t = flat_topology();
    let pool = Exec::new(&t, Sched::Las, Strategy::sparse(), None).unwrap();
    let spec = AggSpec {
        rows: 10,
        groups: 0,
        dist: Dist::Uniform,
        seed: 1,
    };
    let e = generate_agg(&pool, spec, None, 10, &MemPolicy::FirstTouch.into())
        .err()
        .unwrap();
    assert!(e.to_string().contains("--groups"), "{e}");
    let spec = AggSpec { groups: 3, ..spec };
    let e = generate_agg(&pool, spec, None, 10, &MemPolicy::Bind("77".into()).into())
        .err()
        .unwrap();
    assert!(e.to_string().contains("node 77"), "{e}");
    let e = "node:x".parse::<MemPolicy>().unwrap_err().to_string();
    assert!(e.contains("node") && e.contains("per-node[:NODES]"), "{e}");
    let e = "one".parse::<Gen>().unwrap_err().to_string();
    assert!(
        e.contains("'one'") && e.contains("workers, one-thread"),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_tables_match_reference(
        rows in proptest::collection::vec((0u32..50, any::<u32>()), 0..600),
        sparse in any::<bool>(),
        morsel in 1usize..200,
        which in 0usize..4,
    ) {
        let sched = [Sched::Las, Sched::Nls, Sched::Unpinned, Sched::Las][which];
        let loc = if which == 3 { Locality::Strict } else { Locality::Balanced };
        let pool = &Exec::new(&flat_topology(), sched, Strategy::sparse(), None).unwrap().with_locality(loc);
        let keys: Vec<u32> = rows.iter().map(|r| if sparse { r.0.wrapping_mul(0x9e37_79b9) } else { r.0 }).collect();
        let vals: Vec<u32> = rows.iter().map(|r| r.1).collect();
        let t = Table::from_rows(&keys, &vals, morsel).unwrap();
        prop_assert_eq!(w2(pool, &t).unwrap().0, reference::w2(&keys, &vals));
        prop_assert_eq!(w1(pool, &t).unwrap().0, reference::w1(&keys, &vals));
    }
}

/// Libraries `loci bench --alloc` preloads (Debian paths).
const ALLOCATORS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/x86_64-linux-gnu/libtbbmalloc_proxy.so.2",
    "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
];

#[test]
fn allocators_agree() {
    if std::env::var_os("LOCI_ENGINE_ALLOC_CHILD").is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut ran = 0;
    for lib in ALLOCATORS {
        if !std::path::Path::new(lib).exists() {
            eprintln!("allocators_agree: {lib} not installed (scripts/install-deps installs it)");
            continue;
        }
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "joins_handle_duplicates_misses_and_the_empty_marker",
                "aggregation_edge_cases",
                "matrix_matches_reference",
            ])
            .env("LD_PRELOAD", lib)
            .env("LOCI_ENGINE_ALLOC_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{lib}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("3 passed"), "{lib}: {text}");
        ran += 1;
    }
    eprintln!("allocators_agree: {ran} allocators");
}

/// A table whose byte size would wrap is refused by name (it would otherwise map less memory
/// than its columns claim).
#[test]
fn tables_too_large_to_address_are_refused() {
    let plan = loci_place::MemPlan::first_touch();
    let rows = (1usize << 61) + 1;
    let e = Table::alloc_width(rows, rows, &plan, 8)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains(&format!("a morsel of {rows} rows")), "{e}");
    assert!(Table::alloc_width(1000, 100, &plan, 8).is_ok());
}
