//! Hand-built topologies of the machines seed 003 ran on, plus a small synthetic grid, for tests
//! that check the scheduling rules without threads and for stress tests that run many core groups
//! on a small machine (with [`crate::Affinity::None`]).
//!
//! loci-topo is getting presets of the same machines; these builders stay as the scheduler's own
//! fixtures (and cross-check the presets in the tests once they agree).

use loci_topo::{Cache, CacheKind, Cpu, CpuSet, Node, Topology};

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
            free_bytes: None,
            allowed: true,
        })
        .collect();
    let mut cpus = cpus;
    cpus.sort_by_key(|c| c.id);
    let t = Topology {
        source: source.into(),
        nodes,
        cpus,
        caches,
        devices: vec![],
        distances,
    };
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

/// 4 x Intel Xeon E7-4820: 4 nodes, 8 cores per node, 2 hardware threads per core (64 cpus).
/// L1/L2 per core, one 18 MB L3 per package. Cpu numbering as Linux does it on such machines:
/// node n has cpus `8n..8n+7` and their siblings `32+8n..32+8n+7`. Distances 10 local, 20 remote.
pub fn xeon_e7_4820() -> Topology {
    let mut cpus = Vec::new();
    let mut caches = Vec::new();
    for n in 0..4u32 {
        for k in 0..8u32 {
            let core = n * 8 + k;
            let (a, b) = (core, 32 + core);
            cpus.push(cpu(a, core, n, n));
            cpus.push(cpu(b, core, n, n));
            caches.push(cache(1, 32 << 10, [a, b]));
            caches.push(cache(2, 256 << 10, [a, b]));
        }
        caches.push(cache(
            3,
            18 << 20,
            (0..8).flat_map(|k| [n * 8 + k, 32 + n * 8 + k]),
        ));
    }
    let distances = (0..4)
        .map(|i| (0..4).map(|j| if i == j { 10 } else { 20 }).collect())
        .collect();
    build("fixture:xeon-e7-4820", cpus, caches, distances)
}

/// Hop counts of the 8-socket Opteron "twisted ladder": two rails 0-2-4-6 and 1-3-5-7, rungs
/// 0-1, 2-3, 4-5, 6-7, and the twist 0-7 across the ends (at most 3 HyperTransport links per
/// socket, diameter 3).
pub fn twisted_ladder_hops() -> Vec<Vec<u32>> {
    let edges = [
        (0, 2),
        (2, 4),
        (4, 6),
        (1, 3),
        (3, 5),
        (5, 7),
        (0, 1),
        (2, 3),
        (4, 5),
        (6, 7),
        (0, 7),
    ];
    let n = 8;
    let mut hops = vec![vec![u32::MAX; n]; n];
    for (s, row) in hops.iter_mut().enumerate() {
        row[s] = 0;
        let mut frontier = vec![s];
        let mut d = 0;
        while !frontier.is_empty() {
            d += 1;
            let mut next = Vec::new();
            for &u in &frontier {
                for &(a, b) in &edges {
                    let v = if a == u {
                        b
                    } else if b == u {
                        a
                    } else {
                        continue;
                    };
                    if row[v] == u32::MAX {
                        row[v] = d;
                        next.push(v);
                    }
                }
            }
            frontier = next;
        }
    }
    hops
}

/// 8 x AMD Opteron 8220: 8 nodes of 2 cores, each core with its own 1 MB L2 and no shared cache
/// (so every core is its own core group), distances 10/12/14/16 for 0/1/2/3 hops on the
/// twisted ladder ([`twisted_ladder_hops`]).
pub fn opteron_8220() -> Topology {
    let mut cpus = Vec::new();
    let mut caches = Vec::new();
    for n in 0..8u32 {
        for k in 0..2u32 {
            let id = n * 2 + k;
            cpus.push(cpu(id, id, n, n));
            caches.push(cache(1, 64 << 10, [id]));
            caches.push(cache(2, 1 << 20, [id]));
        }
    }
    let distances = twisted_ladder_hops()
        .iter()
        .map(|r| r.iter().map(|h| 10 + 2 * h).collect())
        .collect();
    build("fixture:opteron-8220", cpus, caches, distances)
}

/// 2 x Intel Xeon E5310: one node (front-side bus), 2 packages x 4 cores, each pair of cores
/// shares a 4 MB L2: four core groups of 2 cpus (`0-1`, `2-3`, `4-5`, `6-7`).
pub fn xeon_e5310() -> Topology {
    let mut cpus = Vec::new();
    let mut caches = Vec::new();
    for id in 0..8u32 {
        cpus.push(cpu(id, id, id / 4, 0));
        caches.push(cache(1, 32 << 10, [id]));
    }
    for p in 0..4u32 {
        caches.push(cache(2, 4 << 20, [2 * p, 2 * p + 1]));
    }
    build("fixture:xeon-e5310", cpus, caches, vec![vec![10]])
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
