//! Hand-built topologies of the machines seed 003 ran on, plus a small synthetic grid, for tests
//! that check the scheduling rules without threads and for stress tests that run many core groups
//! on a small machine (with [`crate::Affinity::None`]).
//!
//! The seed machines come from loci-topo's presets; `grid` is the scheduler's own.

use loci_topo::{preset, Cache, CacheKind, Cpu, CpuSet, Node, Topology};

fn cache(level: u8, size: u64, cpus: impl IntoIterator<Item = u32>) -> Cache {
    Cache {
        level,
        kind: if level == 1 {
            CacheKind::Data
        } else {
            CacheKind::Unified
        },
        size_bytes: size,
        cpus: cpus.into_iter().collect(),
    }
}

fn build(source: &str, cpus: Vec<Cpu>, caches: Vec<Cache>, distances: Vec<Vec<u32>>) -> Topology {
    let n = distances.len() as u32;
    let nodes = (0..n)
        .map(|id| Node {
            id,
            cpus: cpus
                .iter()
                .filter(|c| c.node == Some(id))
                .map(|c| c.id)
                .collect::<CpuSet>(),
            memory_bytes: None,
            ..Default::default()
        })
        .collect();
    let mut cpus = cpus;
    cpus.sort_by_key(|c| c.id);
    let t = Topology::from_parts(source.into(), nodes, cpus, caches, vec![], distances);
    t.validate().expect("fixture topology is consistent");
    t
}

fn cpu(id: u32, core: u32, package: u32, node: u32) -> Cpu {
    Cpu {
        id,
        core,
        package,
        node: Some(node),
        online: true,
        allowed: true,
    }
}

/// 4 x Intel Xeon E7-4820 (seed 003's NUMA machine): loci-topo's preset `xeon-e7-4820-4s`,
/// 4 nodes x 8 cores x 2 threads, L3 per node; node n has cpus `8n..8n+7` and siblings `+32`.
pub fn xeon_e7_4820() -> Topology {
    preset::build("xeon-e7-4820-4s").expect("preset exists")
}

/// Hop counts of the 8-socket Opteron twisted ladder (loci-topo's [`preset::TWISTED_LADDER`]).
pub fn twisted_ladder_hops() -> Vec<Vec<u32>> {
    preset::hop_matrix(8, &preset::TWISTED_LADDER)
}

/// 8 x AMD Opteron 8220: loci-topo's preset `opteron-8220-8s`, 8 nodes of 2 cores with private
/// L2 (each core its own core group), SLIT 10/12/14/16 by hops on the twisted ladder.
pub fn opteron_8220() -> Topology {
    preset::build("opteron-8220-8s").expect("preset exists")
}

/// 2 x Intel Xeon E5310 (seed 003's SMP machine): loci-topo's preset `xeon-e5310-2s`, one node,
/// 2 packages x 4 cores, pairs of cores share a 4 MB L2; Linux numbers them across sockets, so
/// the L2 pairs are cpus `0,4`, `1,5`, `2,6`, `3,7`.
pub fn xeon_e5310() -> Topology {
    preset::build("xeon-e5310-2s").expect("preset exists")
}

/// A synthetic machine: `nodes` nodes, each with `groups` L3 groups of `cpus` cpus (one per
/// core). Distances 10 local, 20 remote. For stress tests with [`crate::Affinity::None`].
pub fn grid(nodes: u32, groups: u32, cpus_per_group: u32) -> Topology {
    let mut cpus = Vec::new();
    let mut caches = Vec::new();
    let mut id = 0;
    for n in 0..nodes {
        for _ in 0..groups {
            let first = id;
            for _ in 0..cpus_per_group {
                cpus.push(cpu(id, id, n, n));
                caches.push(cache(2, 1 << 20, [id]));
                id += 1;
            }
            caches.push(cache(3, 8 << 20, first..id));
        }
    }
    let distances = (0..nodes)
        .map(|i| (0..nodes).map(|j| if i == j { 10 } else { 20 }).collect())
        .collect();
    build(
        &format!("fixture:grid-{nodes}x{groups}x{cpus_per_group}"),
        cpus,
        caches,
        distances,
    )
}

/// A scheduler over `topo` with `policy` and no affinity (a fixture's cpus are not this
/// machine's, so its workers must not pin themselves); panics if the scheduler cannot start.
pub fn scheduler(topo: &Topology, policy: crate::Policy) -> crate::Scheduler {
    let config = crate::Config {
        policy,
        affinity: crate::Affinity::None,
        ..crate::Config::default()
    };
    crate::Scheduler::new(topo, config).expect("a scheduler over a fixture topology")
}

/// [`scheduler`] with `policy` over [`grid`]`(nodes, groups, cpus_per_group)`.
pub fn grid_scheduler(
    policy: crate::Policy,
    (nodes, groups, cpus_per_group): (u32, u32, u32),
) -> crate::Scheduler {
    scheduler(&grid(nodes, groups, cpus_per_group), policy)
}

/// Runs `f`, a test that provokes panics and catches them, with panic messages silenced; puts
/// the previous panic hook back after it. Should `f` itself panic (a failed assertion), that
/// panic goes on with its message once the hook is back, so that the failure says why.
pub fn without_panic_messages<R>(f: impl FnOnce() -> R) -> R {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(previous);
    r.unwrap_or_else(|p| panic!("{}", panic_message(&*p)))
}

/// The message of a caught panic's payload (a `&str` or `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    crate::runtime::panic_message(payload)
}
