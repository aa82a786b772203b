//! Strategies and policies on hand-built topologies, and properties over random ones.

use std::collections::BTreeMap;

use loci_place::policy::PolicyError;
use loci_place::strategy::{compact_order, deal, place_threads};
use loci_place::testing::regular;
use loci_place::{MemPlan, MemPolicy, Plan, Strategy as Threads};
use loci_topo::{CpuSet, Topology};
use proptest::prelude::*;

fn s(x: &str) -> Threads {
    x.parse().unwrap()
}

/// Parsing `text` as a `T` fails with an error that names every one of `parts`.
fn refused<T: std::str::FromStr>(text: &str, parts: &[&str])
where
    T::Err: std::fmt::Display,
{
    let e = match text.parse::<T>() {
        Ok(_) => panic!("{text:?} parsed"),
        Err(e) => e.to_string(),
    };
    assert!(parts.iter().all(|p| e.contains(p)), "{text:?}: {e}");
}

/// The error of placing `n` threads by `st` on `topo`.
fn placement_error(topo: &Topology, st: &str, n: usize) -> String {
    place_threads(topo, &s(st), n, false)
        .unwrap_err()
        .to_string()
}

/// The memory policy `policy` resolved on `topo`: its plan and notes.
fn resolve(topo: &Topology, policy: &str) -> Result<(MemPlan, Vec<String>), PolicyError> {
    policy.parse::<MemPolicy>().unwrap().resolve(topo)
}

fn cpus_of(topo: &Topology, st: &str, n: usize) -> Vec<String> {
    let (p, _) = place_threads(topo, &s(st), n, false).unwrap();
    p.into_iter().map(|p| p.cpus.to_string()).collect()
}

/// 4 nodes x 2 cores x 2 SMT: node k has cores with cpus {2k, 2k+8} and {2k+1, 2k+9}.
fn four() -> Topology {
    regular(4, 2, 2, 1)
}

#[test]
fn strategy_parsing_and_errors() {
    assert_eq!(s("compact").to_string(), "compact");
    assert_eq!(s("shared:4@core").to_string(), "shared:4@core");
    assert_eq!(s("nodes:0-1").bind().to_string(), "node");
    assert_eq!(s("group").bind().to_string(), "group");
    assert_eq!(s("sparse").bind().to_string(), "cpu");
    refused::<Threads>("spread", &["`spread`", "compact", "cpus:LIST"]);
    refused::<Threads>("compact@socket", &["@socket", "cpu, core, group, node"]);
    refused::<Threads>("shared", &["group size"]);
    refused::<Threads>("shared:0", &[]);
    refused::<Threads>("random:x", &["`x`"]);
    refused::<Threads>("cpus:0-x", &["0-x"]);
    refused::<Threads>("os@cpu", &[]);
    refused::<Threads>("compact:3", &[]);
}

#[test]
fn compact_fills_physical_cores_of_a_node_first() {
    let t = four();
    assert_eq!(
        cpus_of(&t, "compact", 6),
        vec!["0", "1", "8", "9", "2", "3"]
    );
    assert_eq!(cpus_of(&t, "compact@core", 2), vec!["0,8", "1,9"]);
    assert_eq!(cpus_of(&t, "compact@node", 1), vec!["0-1,8-9"]);
}

#[test]
fn sparse_round_robins_over_nodes() {
    let t = four();
    assert_eq!(cpus_of(&t, "sparse", 6), vec!["0", "2", "4", "6", "1", "3"]);
    let (p, _) = place_threads(&regular(8, 2, 1, 1), &s("sparse"), 8, false).unwrap();
    let nodes: Vec<String> = p.iter().map(|p| p.nodes.to_string()).collect();
    assert_eq!(nodes, (0..8).map(|n| n.to_string()).collect::<Vec<_>>());
}

#[test]
fn shared_groups_share_a_node_and_llc() {
    // 2 nodes x 4 cores, 2 LLCs per node: LLC {0,1} {2,3} on node 0, {4,5} {6,7} on node 1.
    let t = regular(2, 4, 1, 2);
    assert_eq!(
        cpus_of(&t, "shared:2", 6),
        vec!["0", "1", "4", "5", "2", "3"]
    );
    // A group of 3 does not fit an LLC of 2: spans LLCs inside the node, with a note.
    let (p, notes) = place_threads(&t, &s("shared:3"), 6, false).unwrap();
    let nodes: Vec<String> = p.iter().map(|p| p.nodes.to_string()).collect();
    assert_eq!(nodes, vec!["0", "0", "0", "1", "1", "1"]);
    assert!(notes[0].contains("span"), "{notes:?}");
    let e = placement_error(&t, "shared:5", 5);
    assert!(e.contains("largest node has 4"), "{e}");
}

#[test]
fn group_binds_to_llc_groups_alternating_nodes() {
    let t = regular(2, 4, 1, 2);
    assert_eq!(
        cpus_of(&t, "group", 5),
        vec!["0-1", "4-5", "2-3", "6-7", "0-1"]
    );
    assert_eq!(cpus_of(&t, "group@cpu", 3), vec!["0", "4", "2"]);
}

#[test]
fn a_binding_widens_one_anchor_cpu_as_a_strategy_would() {
    use loci_place::Bind;
    let t = regular(2, 4, 1, 2);
    let widen = |b: &str, anchor| b.parse::<Bind>().unwrap().widen(&t, anchor).to_string();
    assert_eq!(widen("cpu", 5), "5");
    assert_eq!(widen("group", 5), "4-5");
    assert_eq!(widen("node", 5), "4-7");
    assert_eq!(widen(" node ", 1), "0-3");
    assert_eq!(four().smt_siblings(9).to_string(), "1,9");
    assert_eq!(Bind::Core.widen(&four(), 9).to_string(), "1,9");
    // The same sets as the strategies' `@BIND` on the same anchors.
    assert_eq!(
        cpus_of(&t, "sparse@group", 2),
        vec![widen("group", 0), widen("group", 4)]
    );
    refused::<Bind>("socket", &["`socket`", "cpu, core, group, node"]);
}

#[test]
fn lists_and_their_errors() {
    let t = four();
    assert_eq!(cpus_of(&t, "cpus:3,5", 2), vec!["3", "5"]);
    assert_eq!(
        cpus_of(&t, "nodes:1,3", 3),
        vec!["2-3,10-11", "6-7,14-15", "2-3,10-11"]
    );
    assert_eq!(cpus_of(&t, "nodes:!0", 1), vec!["2-3,10-11"]);
    let e = placement_error(&t, "cpus:99", 1);
    assert!(e.contains("cpu 99") && e.contains("0-15"), "{e}");
    let e = placement_error(&t, "nodes:7", 1);
    assert!(e.contains("node 7") && e.contains("0-3"), "{e}");
}

#[test]
fn oversubscription_is_refused_unless_asked() {
    let t = regular(1, 2, 1, 1);
    let e = placement_error(&t, "compact", 3);
    assert!(
        e.contains("3 threads") && e.contains("--oversubscribe"),
        "{e}"
    );
    let (p, _) = place_threads(&t, &s("compact"), 3, true).unwrap();
    assert_eq!(p[2].cpus.to_string(), "0");
    assert!(place_threads(&t, &s("cpus:1"), 2, false).is_err());
    assert!(place_threads(&t, &s("compact"), 0, false).is_err());
    for strategy in ["os", "compact"] {
        let e = placement_error(&t, strategy, usize::MAX);
        assert!(e.contains("must be 1..=65536"), "{e}");
    }
    // Unpinned threads are never two to a cpu by our hand: more than cpus is a note.
    let (p, notes) = place_threads(&t, &s("os"), 3, false).unwrap();
    assert_eq!(p.len(), 3);
    assert!(p.iter().all(|p| p.cpus.to_string() == "0-1"));
    assert!(
        notes.iter().any(|n| n.contains("3 threads on 2 cpus")),
        "{notes:?}"
    );
}

#[test]
fn only_allowed_cpus_are_used() {
    let mut t = four();
    for c in t.cpus.iter_mut().filter(|c| c.id % 2 == 0) {
        c.allowed = false;
    }
    let (p, _) = place_threads(&t, &s("compact"), 8, false).unwrap();
    assert!(p.iter().all(|p| p.cpus.iter().all(|c| c % 2 == 1)));
    let e = placement_error(&t, "cpus:0", 1);
    assert!(
        e.contains("not allowed") && e.contains("allowed cpus: 1,3"),
        "{e}"
    );
}

#[test]
fn os_pins_nothing_and_random_is_a_permutation() {
    let t = four();
    let plan = Plan::new(&t, &s("os"), 3, &MemPolicy::FirstTouch, false).unwrap();
    assert!(!plan.pinned);
    assert!(plan.threads.iter().all(|th| th.cpus.to_string() == "0-15"));
    let r = cpus_of(&t, "random:7", 16);
    let mut sorted: Vec<u32> = r.iter().map(|c| c.parse().unwrap()).collect();
    sorted.sort();
    assert_eq!(sorted, (0..16).collect::<Vec<_>>());
    assert_ne!(r, cpus_of(&t, "random:8", 16));
}

#[test]
fn policies_resolve_with_notes_and_errors() {
    let t = four();
    let p = |x: &str| resolve(&t, x);
    let (m, n) = p("interleave").unwrap();
    assert_eq!((m.to_string(), n.len()), ("interleave:0-3".into(), 0));
    let (m, n) = p("interleave:2").unwrap();
    assert_eq!(m.to_string(), "preferred:2");
    assert!(n[0].contains("applied as preferred:2"), "{n:?}");
    assert_eq!(p("bind:!0").unwrap().0.to_string(), "bind:1-3");
    assert_eq!(p("localalloc").unwrap().0.to_string(), "localalloc");
    assert_eq!(p("first-touch").unwrap().0.to_string(), "first-touch");
    let e = p("bind:5").unwrap_err().to_string();
    assert!(
        e.contains("node 5") && e.contains("present nodes: 0-3"),
        "{e}"
    );
    let e = p("preferred:9").unwrap_err().to_string();
    assert!(e.contains("node 9"), "{e}");
    refused::<MemPolicy>("spread", &["`spread`", "weighted-interleave:NODES"]);
    refused::<MemPolicy>("bind", &["node list"]);
    refused::<MemPolicy>("bind:1-x", &["1-x"]);

    // A memoryless node is dropped from lists (said once) and refused for preferred.
    let mut t2 = four();
    t2.nodes[3].memory_bytes = Some(0);
    let (m, n) = resolve(&t2, "interleave:2-3").unwrap();
    assert_eq!(m.to_string(), "preferred:2");
    assert!(
        n.iter().any(|n| n.contains("nodes 3 have no memory")),
        "{n:?}"
    );
    let m = resolve(&t2, "interleave").unwrap().0;
    assert_eq!(m.to_string(), "interleave:0-2");
    let e = resolve(&t2, "preferred:3").unwrap_err().to_string();
    assert!(
        e.contains("node 3 has no memory") && e.contains("0-2"),
        "{e}"
    );
    t2.nodes[1].allowed = false;
    let e = resolve(&t2, "bind:1").unwrap_err().to_string();
    assert!(e.contains("node 1 is not allowed"), "{e}");
}

#[test]
fn gpu_memory_only_when_named_and_merged_nodes_bind_all_their_kernel_nodes() {
    let mut t = four();
    t.nodes[3].cpus = Default::default();
    t.cpus.retain(|c| c.node != Some(3));
    t.nodes[3].kind = loci_topo::NodeKind::Gpu;
    t.nodes[0].merged = "7-8".parse().unwrap();
    let r = |x: &str| resolve(&t, x).map(|(m, _)| m.to_string());
    // Default sets and `all` leave GPU memory out; naming it uses it.
    assert_eq!(r("interleave").unwrap(), "interleave:0-2,7-8");
    assert_eq!(r("bind:all").unwrap(), "bind:0-2,7-8");
    assert_eq!(r("bind:3").unwrap(), "bind:3");
    assert_eq!(r("preferred:3").unwrap(), "preferred:3");
    // Node 0 stands for the kernel nodes merged into it.
    assert_eq!(r("bind:0").unwrap(), "bind:0,7-8");
}

#[test]
fn plan_json_is_the_documented_schema() {
    let t = four();
    let plan = Plan::new(&t, &s("sparse"), 2, &"interleave".parse().unwrap(), false).unwrap();
    let j = serde_json::to_string(&plan.to_json()).unwrap();
    assert_eq!(
        j,
        r#"{"threads":[{"index":0,"cpus":"0","nodes":"0"},{"index":1,"cpus":"2","nodes":"1"}],"memory":{"policy":"interleave","nodes":"0-3"}}"#
    );
    let text = plan.to_string();
    assert!(text.contains("memory interleave:0-3"), "{text}");
    assert_eq!(plan.expected_mem_nodes().to_string(), "0-3");
}

#[test]
fn deal_is_balanced_and_respects_capacity() {
    assert_eq!(
        deal(&[2, 1, 2], 5),
        vec![(0, 0), (1, 0), (2, 0), (0, 1), (2, 1)]
    );
    assert_eq!(deal(&[1, 1], 3), vec![(0, 0), (1, 0), (0, 0)]);
}

/// A random regular-ish topology with some cpus not allowed.
fn arb_topo() -> impl proptest::strategy::Strategy<Value = Topology> {
    (
        1u32..6,
        1u32..5,
        1u32..3,
        proptest::collection::vec(any::<bool>(), 64),
    )
        .prop_map(|(nodes, cores, smt, mask)| {
            let mut t = regular(nodes, cores, smt, 1);
            let total = t.cpus.len();
            for (i, c) in t.cpus.iter_mut().enumerate() {
                // Keep at least cpu 0 allowed.
                c.allowed = i == 0 || mask[i % 64] || total == 1;
            }
            t
        })
}

fn arb_strategy() -> impl proptest::strategy::Strategy<Value = String> {
    prop_oneof![
        Just("os".to_string()),
        Just("compact".to_string()),
        Just("sparse".to_string()),
        Just("group".to_string()),
        (1usize..4).prop_map(|g| format!("shared:{g}")),
        any::<u16>().prop_map(|s| format!("random:{s}")),
        Just("compact@core".to_string()),
        Just("sparse@node".to_string()),
        Just("nodes:all".to_string()),
    ]
}

proptest! {
    #[test]
    fn every_thread_lies_in_the_allowed_cpus(t in arb_topo(), st in arb_strategy(), n in 1usize..40) {
        let allowed = t.allowed_cpus();
        match place_threads(&t, &s(&st), n, false) {
            Ok((p, _)) => {
                prop_assert_eq!(p.len(), n);
                for pl in &p {
                    prop_assert!(!pl.cpus.is_empty());
                    prop_assert!(pl.cpus.is_subset(&allowed), "{} not in {}", pl.cpus, allowed);
                }
            }
            Err(e) => {
                let e = e.to_string();
                prop_assert!(
                    n > allowed.len() || (st.starts_with("shared") && (e.contains("fit") || e.contains("cannot share"))),
                    "{}", e
                );
            }
        }
    }

    #[test]
    fn compact_fills_a_node_before_the_next(t in arb_topo(), n in 1usize..40) {
        let allowed = t.allowed_cpus();
        let n = n.min(allowed.len());
        let (p, _) = place_threads(&t, &s("compact"), n, false).unwrap();
        let node_idx: Vec<usize> = p.iter()
            .map(|pl| t.node_index(t.node_of_cpu(pl.cpus.first().unwrap()).unwrap()).unwrap())
            .collect();
        // Node indexes never go back, and a node is left only when all its allowed cpus are used.
        for w in node_idx.windows(2) {
            prop_assert!(w[0] <= w[1]);
        }
        for (k, &ni) in node_idx.iter().enumerate() {
            if k + 1 < n && node_idx[k + 1] != ni {
                let used = node_idx.iter().filter(|&&x| x == ni).count();
                prop_assert_eq!(used, t.allowed_cpus_of(t.nodes[ni].id).len());
            }
        }
        // Physical cores before SMT siblings inside a node.
        let order = compact_order(&t, &allowed);
        let placed: Vec<u32> = p.iter().map(|pl| pl.cpus.first().unwrap()).collect();
        prop_assert_eq!(&placed[..], &order[..n]);
    }

    #[test]
    fn sparse_balances_nodes(t in arb_topo(), n in 1usize..40) {
        let allowed = t.allowed_cpus();
        let n = n.min(allowed.len());
        let (p, _) = place_threads(&t, &s("sparse"), n, false).unwrap();
        let mut per: BTreeMap<u32, usize> = BTreeMap::new();
        for pl in &p {
            *per.entry(t.node_of_cpu(pl.cpus.first().unwrap()).unwrap()).or_default() += 1;
        }
        // Among nodes that still have room, counts differ by at most one; full nodes may have fewer.
        let with_cpus: Vec<u32> = t.nodes.iter().map(|nd| nd.id)
            .filter(|&id| !t.allowed_cpus_of(id).is_empty()).collect();
        let counts: Vec<usize> = with_cpus.iter().map(|id| per.get(id).copied().unwrap_or(0)).collect();
        let not_full: Vec<usize> = with_cpus.iter().zip(&counts)
            .filter(|(id, &c)| c < t.allowed_cpus_of(**id).len())
            .map(|(_, &c)| c).collect();
        if let (Some(mx), Some(mn)) = (counts.iter().max(), not_full.iter().min()) {
            prop_assert!(mx - mn <= 1, "counts {:?}", counts);
        }
        let mx = counts.iter().max().unwrap();
        let mn = counts.iter().min().unwrap();
        let all_same_size = with_cpus.iter().map(|id| t.allowed_cpus_of(*id).len()).collect::<std::collections::BTreeSet<_>>().len() == 1;
        if all_same_size {
            prop_assert!(mx - mn <= 1, "counts {:?}", counts);
        }
    }

    #[test]
    fn random_is_reproducible_by_seed(t in arb_topo(), seed in any::<u64>(), n in 1usize..20) {
        let n = n.min(t.allowed_cpus().len());
        let st = s(&format!("random:{seed}"));
        let a = place_threads(&t, &st, n, false).unwrap().0;
        let b = place_threads(&t, &st, n, false).unwrap().0;
        prop_assert_eq!(a.clone(), b);
        let distinct: std::collections::BTreeSet<CpuSet> = a.into_iter().map(|p| p.cpus).collect();
        prop_assert_eq!(distinct.len(), n);
    }
}
