//! Inputs the fuzz targets (`fuzz/`, docs/testing.md section Fuzzing) found to break planning,
//! each fed exactly as found.

use loci_place::strategy::place_threads;
use loci_place::Strategy;
use loci_topo::{CpuSet, Topology};

/// Every strategy places `n` threads (one placement each, on allowed cpus) or says why not.
fn every_strategy_places_every_thread(t: &Topology) {
    let allowed = t.allowed_cpus();
    for spec in [
        "compact",
        "sparse",
        "shared:1",
        "random:3",
        "group",
        "group@cpu",
        "nodes:all",
        "cpus:all",
    ] {
        let s: Strategy = spec.parse().unwrap();
        for n in 1..=allowed.len() + 1 {
            // An error is an answer (`nodes:all` where no node lists a cpu); an empty plan is not.
            if let Ok((places, _)) = place_threads(t, &s, n, true) {
                assert_eq!(places.len(), n, "{spec} -n {n}: {places:?}");
                for p in &places {
                    assert!(!p.cpus.is_empty() && p.cpus.is_subset(&allowed), "{spec}");
                }
            }
        }
    }
}

/// fuzz target `hwloc_xml`, minimized: a PU outside the subtree its only NUMA node is attached to,
/// so the cpu's node is unknown. `group` used to return zero placements for one thread: its core
/// groups came from the nodes' cpu lists, which leave such a cpu out.
#[test]
fn group_places_a_cpu_that_no_node_lists() {
    let xml = r#"<topology version="3"><object><object><object type="NUMANode" os_index="2"/></object><object type="PU" os_index="1"/></object></topology>"#;
    let t = loci_topo::xml::parse(xml).unwrap();
    every_strategy_places_every_thread(&t);
    let (places, _) = place_threads(&t, &"group".parse().unwrap(), 1, false).unwrap();
    assert_eq!(places[0].cpus.to_string(), "1");
}

/// The same without XML: a memory-only node and cpus whose node is unknown (1) or whose node's
/// list leaves them out (2, 3: one core), next to a listed one (0).
#[test]
fn group_covers_cpus_outside_every_node_list() {
    let mut t = Topology::flat(CpuSet::parse("0-3").unwrap(), "test:unlisted-cpus");
    t.nodes[0].cpus = CpuSet::parse("0").unwrap();
    t.cpus[1].node = None;
    t.cpus[3].core = 2; // cpus 2 and 3: SMT siblings
    t.validate().unwrap();
    every_strategy_places_every_thread(&t);
    let (places, _) = place_threads(&t, &"group".parse().unwrap(), 4, false).unwrap();
    let got: Vec<String> = places.iter().map(|p| p.cpus.to_string()).collect();
    // Node 0's group first, then one group per core of the unlisted cpus.
    assert_eq!(got, vec!["0", "1", "2-3", "2-3"]);
}
