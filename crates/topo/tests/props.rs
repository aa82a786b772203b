//! Property tests over random synthetic topologies: every generated machine validates, core
//! groups partition each node's cpus at every cache level, SMT siblings share a core, the JSON
//! form round-trips, and hops rank distances.

use loci_topo::{CpuSet, Source, Topology, TopologyJson};
use proptest::prelude::*;

/// The divisors of `n`, ascending.
fn divisors(n: u32) -> Vec<u32> {
    (1..=n).filter(|&d| n.is_multiple_of(d)).collect()
}

/// A random valid spec. Cache groups must split a node evenly and an L2 group an L3 group, so
/// numeric `llc` and `l2` are picked among the divisors (by index, modulo their count).
fn spec() -> impl Strategy<Value = String> {
    (
        1u32..=6,
        1u32..=6,
        1u32..=4,
        prop_oneof![
            Just("node".to_string()),
            Just("core".to_string()),
            Just("package".to_string()),
            (0usize..4).prop_map(|i| format!("#{i}"))
        ],
        prop_oneof![Just("core".to_string()), (0usize..4).prop_map(|i| format!("#{i}"))],
        any::<bool>(),
        0u32..3,
        0u32..3,
        10u32..=12,
        13u32..=40,
    )
        .prop_map(
            |(nodes, cores, smt, llc, l2, adjacent, cpuless, memless, local, remote)| {
                let pick = |choice: String, of: u32| match choice.strip_prefix('#') {
                    Some(i) => {
                        let d = divisors(of);
                        (d[i.parse::<usize>().unwrap() % d.len()].to_string(), true)
                    }
                    None => (choice, false),
                };
                let (llc, numeric) = pick(llc, cores);
                let l3_cores = if numeric { llc.parse().unwrap() } else { cores };
                let (l2, _) = pick(l2, l3_cores);
                // cpuless: the last `cpuless` nodes, memless: the first ones, never all, never
                // both on one node.
                let cpuless = cpuless.min(nodes - 1);
                let memless = memless.min(nodes - cpuless);
                let mut s = format!(
                    "nodes={nodes},cores={cores},smt={smt},llc={llc},l2={l2},dist={local}:{remote},siblings={}",
                    if adjacent { "adjacent" } else { "apart" }
                );
                if cpuless > 0 {
                    s += &format!(",cpuless={}-{}", nodes - cpuless, nodes - 1);
                }
                if memless > 0 {
                    s += &format!(",memless=0-{}", memless - 1);
                }
                s
            },
        )
}

fn load(spec: &str) -> Topology {
    loci_topo::load(&Source::Synthetic(spec.to_string())).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn synthetic_machines_are_consistent(spec in spec()) {
        let t = load(&spec);
        prop_assert!(t.validate().is_ok());
        // Every cpu lies in exactly the node it names.
        for c in &t.cpus {
            let n = c.node.unwrap();
            prop_assert!(t.node(n).unwrap().cpus.contains(c.id));
            prop_assert_eq!(t.nodes.iter().filter(|x| x.cpus.contains(c.id)).count(), 1);
        }
        // Core groups partition each node's cpus, at every level.
        for level in 1..=3u8 {
            let groups = t.core_groups(level);
            for node in &t.nodes {
                let mut union = CpuSet::new();
                let mut total = 0;
                for g in groups.iter().filter(|g| g.node == node.id) {
                    prop_assert!(!g.cpus.is_empty());
                    prop_assert!(g.cpus.is_subset(&node.cpus));
                    total += g.cpus.len();
                    union = union.union(&g.cpus);
                }
                prop_assert_eq!(total, node.cpus.len(), "overlapping groups in {}", spec);
                prop_assert_eq!(&union, &node.cpus);
            }
        }
        // SMT siblings: same core, same node, and every core has the same number of threads.
        for c in &t.cpus {
            let sib = t.smt_siblings(c.id);
            prop_assert!(sib.contains(c.id));
            for s in sib.iter() {
                prop_assert_eq!(t.cpu(s).unwrap().node, c.node);
            }
        }
        // Caches of one level and kind are disjoint.
        for (i, a) in t.caches.iter().enumerate() {
            for b in &t.caches[i + 1..] {
                if a.level == b.level && a.kind == b.kind {
                    prop_assert!(a.cpus.intersection(&b.cpus).is_empty());
                }
            }
        }
        // Hops: 0 on the diagonal, 1 for the single remote class.
        for a in &t.nodes {
            for b in &t.nodes {
                let h = t.hops(a.id, b.id).unwrap();
                prop_assert_eq!(h == 0, a.id == b.id);
                prop_assert!(h <= 1);
            }
        }
        // JSON round trip.
        let text = serde_json::to_string(&t.to_json()).unwrap();
        let back: TopologyJson = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(back.into_topology().unwrap(), t);
    }

    #[test]
    fn bad_keys_never_panic(key in "[a-z]{1,8}", value in "[a-z0-9:/-]{0,8}") {
        let spec = format!("{key}={value}");
        match loci_topo::load(&Source::Synthetic(spec.clone())) {
            Ok(t) => prop_assert!(t.validate().is_ok()),
            Err(e) => {
                let m = e.to_string();
                prop_assert!(m.contains(&spec) || m.contains(&key), "{}", m);
            }
        }
    }
}
