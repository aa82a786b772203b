//! The hwloc XML reader on the five exports in `../shared/topologies/xml` (hwloc's own test
//! files). Facts asserted here were read off the XML text by hand. Skips with a note when
//! ../shared is absent.

use std::path::{Path, PathBuf};

use loci_topo::{DeviceKind, Source, Topology};

mod common;

use common::assert_load_fails_naming;

fn xml_dir() -> Option<PathBuf> {
    common::shared_topologies("xml", "the hwloc XML tests")
}

/// The export `name`, validated, with `nodes` nodes and `cpus` cpus, and each `(node, cpu list)`
/// of `node_cpus` (`None`: ../shared is absent).
fn load(name: &str, nodes: usize, cpus: usize, node_cpus: &[(u32, &str)]) -> Option<Topology> {
    let path = xml_dir()?.join(name);
    let t = loci_topo::load(&Source::HwlocXml(path)).unwrap_or_else(|e| panic!("{name}: {e}"));
    t.validate().unwrap();
    assert_eq!((t.nodes.len(), t.cpus.len()), (nodes, cpus), "{name}");
    for &(node, want) in node_cpus {
        let got = t.node(node).unwrap().cpus.to_string();
        assert_eq!(got, want, "{name}: node {node}");
    }
    Some(t)
}

fn l(t: &Topology, level: u8) -> Vec<String> {
    t.caches_at(level).map(|c| c.cpus.to_string()).collect()
}

#[test]
fn amd_8_nodes_with_several_matrices() {
    // Package 0 holds NUMANode 1 and PUs 0-1; package 1 holds node 0 and PUs 2-3.
    let node_cpus = [(0, "2-3"), (1, "0-1"), (3, "10-11")];
    let Some(t) = load("16amd64-4distances.xml", 8, 16, &node_cpus) else {
        return;
    };
    assert_eq!(t.cpu(2).unwrap().package, 1);
    // Four matrices (NUMANode latency, Package, PU, Core): the NUMA latency one is used.
    for i in 0..8 {
        for j in 0..8 {
            assert_eq!(t.distance(i, j), Some(if i == j { 10 } else { 20 }));
        }
    }
    assert_eq!(t.nodes[0].memory_bytes.map(|m| m >> 20), Some(8190));
    assert_eq!(l(&t, 2).len(), 16);
    assert_eq!(t.llc_level(), Some(2));
}

#[test]
fn intel_24_nodes_384_threads() {
    let node_cpus = [(0, "0-7,192-199"), (23, "184-191,376-383")];
    let Some(t) = load("192em64t-24n8c2t.xml", 24, 384, &node_cpus) else {
        return;
    };
    assert_eq!(t.smt_siblings(5).to_string(), "5,197");
    // Row 0 and the start of row 2 of the NUMALatency matrix.
    assert_eq!(t.distance(0, 1), Some(50));
    assert_eq!(t.distance(0, 2), Some(65));
    assert_eq!(t.distance(0, 10), Some(79));
    assert_eq!(t.distance(2, 3), Some(50));
    assert_eq!(t.hops(0, 1), Some(1));
    assert_eq!(t.hops(0, 2), Some(2));
    assert_eq!(l(&t, 3).len(), 24);
    assert_eq!(l(&t, 3)[0], "0-7,192-199");
    let dev = |n: &str| t.devices.iter().find(|d| d.name == n).unwrap().clone();
    assert_eq!(dev("eth0").node, Some(0));
    assert_eq!(dev("sda").kind, DeviceKind::Block);
    assert_eq!(dev("sda").node, Some(1));
    assert_eq!(dev("eth2").node, Some(4));
    assert_eq!(dev("ib0").node, Some(6));
}

#[test]
fn intel_2_nodes_with_pci_devices() {
    let node_cpus = [(0, "0-7,16-23"), (1, "8-15,24-31")];
    let Some(t) = load("32em64t-2n8c2t-pci-normalio.xml", 2, 32, &node_cpus) else {
        return;
    };
    assert_eq!(t.nodes[0].memory_bytes, Some(34330173440));
    assert_eq!(l(&t, 3), ["0-7,16-23", "8-15,24-31"]);
    assert_eq!(t.caches_at(3).next().unwrap().size_bytes, 20 << 20);
    assert_eq!(l(&t, 2).len(), 16);
    assert_eq!(l(&t, 2)[0], "0,16");
    let find = |n: &str| t.devices.iter().find(|d| d.name == n).cloned();
    assert_eq!(find("sda").unwrap().node, Some(0));
    assert_eq!(find("eth0").unwrap().kind, DeviceKind::Net);
    assert_eq!(find("eth0").unwrap().node, Some(1));
    assert_eq!(find("cuda0").unwrap().kind, DeviceKind::Gpu);
    assert_eq!(find("ib0").unwrap().node, Some(1));
    // No distance matrix in the file: 10 local, 20 remote.
    assert_eq!(t.distance(0, 1), Some(20));
}

#[test]
fn knl_like_dram_plus_hbm() {
    // DRAM nodes 0-3 carry the cpus; the HBM nodes 4-7 attached beside them are CPU-less.
    let node_cpus = [
        (0, "0-3,16-19,32-35,48-51"),
        (4, ""),
        (5, ""),
        (6, ""),
        (7, ""),
    ];
    let Some(t) = load("64intel64-heteromem.xml", 8, 64, &node_cpus) else {
        return;
    };
    for hbm in 4..8 {
        assert_eq!(t.node(hbm).unwrap().memory_bytes, Some(2 << 30));
        assert_eq!(t.node(hbm).unwrap().kind, loci_topo::NodeKind::Hbm);
    }
    assert_eq!(t.node(0).unwrap().kind, loci_topo::NodeKind::Dram);
    assert_eq!(t.node(0).unwrap().memory_bytes, Some(1 << 30));
    assert_eq!(t.allowed_mems().to_string(), "0-7");
    assert_eq!(t.smt_siblings(0).to_string(), "0,16,32,48");
    // core groups partition each node's cpus; CPU-less nodes have none.
    let g = t.core_groups(2);
    assert!(g.iter().all(|g| g.node < 4));
}

#[test]
fn sub_numa_clustering_with_memory_side_caches() {
    let Some(t) = load("memorysidecaches.xml", 4, 80, &[]) else {
        return;
    };
    // Two packages, each split into two nodes (SNC); the MemCache objects are not cpu caches.
    assert_eq!(t.cpu(0).unwrap().package, t.cpu(2).unwrap().package);
    assert_ne!(t.cpu(0).unwrap().package, t.cpu(1).unwrap().package);
    assert!(t.nodes.iter().all(|n| n.cpus.len() == 20));
    assert!(t.caches.iter().all(|c| c.level <= 3));
    assert!(t.caches.iter().all(|c| c.size_bytes < 1 << 30));
    assert_eq!(t.nodes[0].memory_bytes, Some(397816131584));
    assert_eq!(t.distance(0, 2), Some(11));
    assert_eq!(t.distance(0, 1), Some(21));
    assert_eq!(t.distance(1, 3), Some(11));
    assert_eq!(t.hops(0, 2), Some(1));
    assert_eq!(t.hops(0, 1), Some(2));
}

#[test]
fn missing_and_bad_files_are_named() {
    assert_load_fails_naming(
        &Source::HwlocXml("/nonexistent/x.xml".into()),
        &["/nonexistent/x.xml"],
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let bad = dir.join("bad-topology.xml");
    std::fs::write(&bad, "<topology version=\"2.0\"><object type=\"Machine\">").unwrap();
    assert_load_fails_naming(
        &Source::HwlocXml(bad),
        &["bad-topology.xml", "not well-formed"],
    );
}
