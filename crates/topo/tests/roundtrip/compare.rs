//! What is compared of a topology read back, part by part so that a failure names the part.

use std::collections::BTreeMap;

use loci_topo::{CpuSet, Topology};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

type NodeView = (
    u32,
    String,
    Option<u64>,
    Option<u64>,
    bool,
    String,
    String,
    String,
);

/// What is compared of a topology, in a form that prints well.
#[derive(Debug, PartialEq)]
struct View {
    nodes: Vec<NodeView>,
    /// (id, package, node, online, allowed)
    cpus: Vec<(u32, u32, Option<u32>, bool, bool)>,
    /// The cpus of each core, sorted: the partition, whatever the core numbers.
    cores: Vec<String>,
    /// (level, kind, size, cpus), sorted.
    caches: Vec<(u8, String, u64, String)>,
    distances: Vec<Vec<u32>>,
    devices: Vec<String>,
    notes: Vec<String>,
}

fn view(t: &Topology, keep_free: bool) -> View {
    let mut cores: BTreeMap<u32, CpuSet> = BTreeMap::new();
    for c in &t.cpus {
        cores.entry(c.core).or_default().insert(c.id);
    }
    let mut cores: Vec<CpuSet> = cores.into_values().collect();
    cores.sort();
    let mut caches: Vec<(u8, String, u64, String)> = t
        .caches
        .iter()
        .map(|c| {
            (
                c.level,
                format!("{:?}", c.kind),
                c.size_bytes,
                c.cpus.to_string(),
            )
        })
        .collect();
    caches.sort();
    View {
        nodes: t
            .nodes
            .iter()
            .map(|n| {
                (
                    n.id,
                    n.cpus.to_string(),
                    n.memory_bytes,
                    // Normalised for XML: hwloc does not export free memory.
                    n.free_bytes.filter(|_| keep_free),
                    n.allowed,
                    n.kind.name().to_string(),
                    n.initiators.to_string(),
                    n.merged.to_string(),
                )
            })
            .collect(),
        cpus: t
            .cpus
            .iter()
            .map(|c| (c.id, c.package, c.node, c.online, c.allowed))
            .collect(),
        cores: cores.iter().map(|s| s.to_string()).collect(),
        caches,
        distances: t.distances.clone(),
        devices: t.devices.iter().map(|d| format!("{d:?}")).collect(),
        notes: t.notes.clone(),
    }
}

/// Compares part by part, so that a failure names the part.
pub(crate) fn same(want: &Topology, got: &Topology, keep_free: bool) -> Result<(), TestCaseError> {
    let (w, g) = (view(want, keep_free), view(got, keep_free));
    prop_assert_eq!(&g.nodes, &w.nodes, "nodes");
    prop_assert_eq!(&g.cpus, &w.cpus, "cpus");
    prop_assert_eq!(&g.cores, &w.cores, "cores (cpus sharing one)");
    prop_assert_eq!(&g.caches, &w.caches, "caches");
    prop_assert_eq!(&g.distances, &w.distances, "distances");
    prop_assert_eq!(&g.devices, &w.devices, "devices");
    prop_assert_eq!(&g.notes, &w.notes, "repair notes");
    // Cores are numbered machine-wide: no two packages share a core number.
    let mut seen: BTreeMap<u32, u32> = BTreeMap::new();
    for c in &got.cpus {
        let p = *seen.entry(c.core).or_insert(c.package);
        prop_assert_eq!(p, c.package, "core {} spans packages", c.core);
    }
    Ok(())
}
