//! Hand-built topologies for tests (here, in the CLI and in other crates): small, regular
//! machines whose right answers are easy to write down.

use loci_topo::{Cache, CacheKind, CpuSet, Node, Topology};

/// A regular machine: `nodes` nodes of `cores` physical cores with `smt` hardware threads each,
/// `llcs` last-level caches per node (cores split evenly), one package per node, distance 10
/// local and 20 remote. Cpus are numbered as Linux does on x86: the first hardware thread of every
/// core of the machine first (`node * cores + core`), then the second ones, and so on.
pub fn regular(nodes: u32, cores: u32, smt: u32, llcs: u32) -> Topology {
    assert!(nodes > 0 && cores > 0 && smt > 0 && llcs > 0 && (cores / llcs) * llcs == cores);
    let total_cores = nodes * cores;
    let cpu_id = |node: u32, core: u32, t: u32| t * total_cores + node * cores + core;
    let mut cpus = Vec::new();
    for t in 0..smt {
        for node in 0..nodes {
            for core in 0..cores {
                cpus.push(loci_topo::Cpu {
                    id: cpu_id(node, core, t),
                    core: node * cores + core,
                    package: node,
                    node: Some(node),
                    online: true,
                    allowed: true,
                });
            }
        }
    }
    cpus.sort_by_key(|c| c.id);
    let node_cpus = |node: u32| -> CpuSet {
        (0..cores)
            .flat_map(|c| (0..smt).map(move |t| cpu_id(node, c, t)))
            .collect()
    };
    let mut caches = Vec::new();
    let per = cores / llcs;
    for node in 0..nodes {
        for l in 0..llcs {
            caches.push(Cache {
                level: 3,
                kind: CacheKind::Unified,
                size_bytes: 16 << 20,
                cpus: (l * per..(l + 1) * per)
                    .flat_map(|c| (0..smt).map(move |t| cpu_id(node, c, t)))
                    .collect(),
            });
        }
        for c in 0..cores {
            caches.push(Cache {
                level: 2,
                kind: CacheKind::Unified,
                size_bytes: 1 << 20,
                cpus: (0..smt).map(|t| cpu_id(node, c, t)).collect(),
            });
        }
    }
    let topo = Topology {
        source: format!("test:nodes={nodes},cores={cores},smt={smt},llcs={llcs}"),
        nodes: (0..nodes)
            .map(|id| Node {
                id,
                cpus: node_cpus(id),
                memory_bytes: Some(1 << 30),
                ..Default::default()
            })
            .collect(),
        cpus,
        caches,
        devices: vec![],
        distances: (0..nodes)
            .map(|i| (0..nodes).map(|j| if i == j { 10 } else { 20 }).collect())
            .collect(),
        notes: vec![],
    };
    topo.validate().expect("regular topology is valid");
    topo
}

/// This machine as one node holding the cpus this process may run on, with memory: enough to
/// test binding for real on any Linux box.
pub fn one_node_here() -> Topology {
    Topology::flat(
        crate::sys::get_affinity(0).expect("sched_getaffinity"),
        "test:affinity",
    )
}
