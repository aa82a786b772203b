//! Presets: the machines the seed papers measured on, so that plans can be made for them from
//! anywhere (`loci plan --preset NAME ...`).
//!
//! Core counts, memory, cache sizes and interconnect come from the seeds where they say (seed 000:
//! Xeon Silver 4114; seed 001: Xeon Gold 6346 with its NICs; seed 002: Opteron 8220, Xeon E7520,
//! Xeon E7-4850 v4 with relative latencies; seed 003: Xeon E5310 and E7-4820; seed 004: Xeon
//! E5-4660 v4 and Platinum 8275CL) and from the processors' data sheets otherwise. Distances the
//! seeds do not give are the usual firmware SLIT values for the platform (10 local, 21 remote on
//! Intel QPI/UPI machines). Cpu numbering follows Linux on these machines: hyper-thread siblings
//! are cpu `i` and `i + N` (N = physical cores), cores of a node are consecutive.

use crate::error::TopoError;
use crate::model::{CacheKind, Device, DeviceKind, Topology};
use crate::synthetic::{uniform_distances, CacheSpec, Shape, Share};

/// The preset names, in the order `loci topo --help` lists them.
pub const NAMES: &[&str] = &[
    "xeon-silver-4114-2s",
    "xeon-gold-6346-2s",
    "opteron-8220-8s",
    "xeon-e7520-4s",
    "xeon-e7-4850v4-4s",
    "xeon-e7-4820-4s",
    "xeon-e5310-2s",
    "xeon-e5-4660v4-4s",
    "xeon-platinum-8275cl-2s",
];

/// One line per preset, for help texts.
pub fn describe(name: &str) -> Option<&'static str> {
    Some(match name {
        "xeon-silver-4114-2s" => "2 nodes x 10 cores x 2 threads, 14 MB L3 per socket, 128 GB (seed 000)",
        "xeon-gold-6346-2s" => "2 nodes x 16 cores x 2 threads, 36 MB L3, 1 TB, 200 Gb/s ConnectX-6 on each node; the streaming NIC is on node 1 (seed 001)",
        "opteron-8220-8s" => "8 nodes x 2 cores, 1 MB L2 per core, twisted ladder: SLIT 10/12/14/16 for 0-3 hops (seed 002 machine A)",
        "xeon-e7520-4s" => "4 nodes x 4 cores x 2 threads, 18 MB L3, fully connected, SLIT 10/11 (seed 002 machine B)",
        "xeon-e7-4850v4-4s" => "4 nodes x 16 cores x 2 threads, 40 MB L3, 3 TB, fully connected, SLIT 10/21 (seed 002 machine C)",
        "xeon-e7-4820-4s" => "4 nodes x 8 cores x 2 threads, 18 MB L3, 32 GB per node (seed 003)",
        "xeon-e5310-2s" => "SMP: 1 node, 2 sockets x 4 cores, each pair of cores shares a 4 MB L2 (seed 003)",
        "xeon-e5-4660v4-4s" => "4 nodes x 16 cores x 2 threads, 40 MB L3, 128 GB (seed 004)",
        "xeon-platinum-8275cl-2s" => "2 nodes x 24 cores x 2 threads, 35.75 MB L3, 192 GB (seed 004)",
        _ => return None,
    })
}

const K: u64 = 1 << 10;
const M: u64 = 1 << 20;
const G: u64 = 1 << 30;

fn cache(level: u8, kind: CacheKind, size: u64, share: Share) -> CacheSpec {
    CacheSpec {
        level,
        kind,
        size,
        share,
    }
}

/// A multi-socket Intel server: one node per socket, private L1/L2, L3 per socket.
#[allow(clippy::too_many_arguments)]
fn intel(
    sockets: u32,
    cores: u32,
    smt: u32,
    l1d: u64,
    l2: u64,
    l3: u64,
    mem_per_node: u64,
    remote: u32,
) -> Shape {
    let mut s = Shape::new(sockets, cores, smt);
    s.caches = vec![
        cache(1, CacheKind::Data, l1d, Share::Cores(1)),
        cache(1, CacheKind::Instruction, 32 * K, Share::Cores(1)),
        cache(2, CacheKind::Unified, l2, Share::Cores(1)),
        cache(3, CacheKind::Unified, l3, Share::Node),
    ];
    s.mem_per_node = mem_per_node;
    s.distances = uniform_distances(sockets, 10, remote);
    s
}

/// The links of the 8-socket Opteron "twisted ladder" (seed 002, Fig. 1a): two rails of four
/// sockets (0-2-4-6 and 1-3-5-7), closed by rungs at both ends (0-1, 6-7), with the middle rungs
/// crossed (2-5, 3-4). Corner sockets use their third HyperTransport link for I/O. Diameter 3.
pub const TWISTED_LADDER: [(u32, u32); 10] = [
    (0, 2),
    (2, 4),
    (4, 6),
    (1, 3),
    (3, 5),
    (5, 7),
    (0, 1),
    (6, 7),
    (2, 5),
    (3, 4),
];

/// Hop counts between all pairs of a graph on `n` nodes (breadth-first search).
pub fn hop_matrix(n: u32, links: &[(u32, u32)]) -> Vec<Vec<u32>> {
    let n = n as usize;
    let mut out = vec![vec![u32::MAX; n]; n];
    for (s, row) in out.iter_mut().enumerate() {
        row[s] = 0;
        let mut frontier = vec![s];
        let mut d = 0;
        while !frontier.is_empty() {
            d += 1;
            let mut next = Vec::new();
            for &u in &frontier {
                for &(a, b) in links {
                    let v = match (a as usize, b as usize) {
                        (a, b) if a == u => b,
                        (a, b) if b == u => a,
                        _ => continue,
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
    out
}

fn shape(name: &str) -> Option<Shape> {
    Some(match name {
        "xeon-silver-4114-2s" => intel(2, 10, 2, 32 * K, M, 13 * M + 768 * K, 64 * G, 21),
        "xeon-gold-6346-2s" => {
            let mut s = intel(2, 16, 2, 48 * K, 1280 * K, 36 * M, 512 * G, 20);
            let nic = |name: &str, node| Device {
                name: name.into(),
                kind: DeviceKind::Net,
                node: Some(node),
            };
            // Dual-port ConnectX-6 on each socket's PCIe 4.0 root; node 0's serves Lustre,
            // node 1's carries the detector streams (seed 001).
            s.devices = vec![
                nic("ens1f0np0", 0),
                nic("ens1f1np1", 0),
                nic("ens5f0np0", 1),
                nic("ens5f1np1", 1),
                Device {
                    name: "nvme0n1".into(),
                    kind: DeviceKind::Block,
                    node: Some(0),
                },
            ];
            s
        }
        "opteron-8220-8s" => {
            let mut s = Shape::new(8, 2, 1);
            s.caches = vec![
                cache(1, CacheKind::Data, 64 * K, Share::Cores(1)),
                cache(1, CacheKind::Instruction, 64 * K, Share::Cores(1)),
                cache(2, CacheKind::Unified, M, Share::Cores(1)),
            ];
            s.mem_per_node = 16 * G;
            // Relative latency 1.0/1.2/1.4/1.6 by hops (seed 002) as SLIT 10/12/14/16.
            s.distances = hop_matrix(8, &TWISTED_LADDER)
                .into_iter()
                .map(|r| r.into_iter().map(|h| 10 + 2 * h).collect())
                .collect();
            s
        }
        "xeon-e7520-4s" => intel(4, 4, 2, 32 * K, 256 * K, 18 * M, 16 * G, 11),
        "xeon-e7-4850v4-4s" => intel(4, 16, 2, 32 * K, 256 * K, 40 * M, 768 * G, 21),
        "xeon-e7-4820-4s" => intel(4, 8, 2, 32 * K, 256 * K, 18 * M, 32 * G, 21),
        "xeon-e5310-2s" => {
            let mut s = Shape::new(1, 8, 1);
            s.cores_per_package = 4;
            s.caches = vec![
                cache(1, CacheKind::Data, 32 * K, Share::Cores(1)),
                cache(1, CacheKind::Instruction, 32 * K, Share::Cores(1)),
                cache(2, CacheKind::Unified, 4 * M, Share::Cores(2)),
            ];
            s.mem_per_node = 8 * G;
            s.distances = vec![vec![10]];
            // Linux numbers these Clovertown boxes across sockets and L2 pairs: socket p's
            // cores are p, p+4, p+2, p+6 (cores 0-1 share an L2, as do 2-3): the same pattern
            // as hwloc's captured PowerEdge 2950 (8em64t-2s2ca2c).
            s.cpu_ids = Some(
                (0..8u32)
                    .map(|g| {
                        let (p, k) = (g / 4, g % 4);
                        p + 4 * (k % 2) + 2 * (k / 2)
                    })
                    .collect(),
            );
            s
        }
        "xeon-e5-4660v4-4s" => intel(4, 16, 2, 32 * K, 256 * K, 40 * M, 32 * G, 21),
        "xeon-platinum-8275cl-2s" => intel(2, 24, 2, 32 * K, M, 35 * M + 768 * K, 96 * G, 21),
        _ => return None,
    })
}

/// Builds a preset by name; an unknown name is an error listing the valid ones.
pub fn build(name: &str) -> Result<Topology, TopoError> {
    shape(name)
        .map(|s| s.build())
        .ok_or_else(|| TopoError::UnknownPreset {
            name: name.to_string(),
            valid: NAMES.join(", "),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_builds_and_validates() {
        for name in NAMES {
            let t = build(name).unwrap();
            t.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(describe(name).is_some(), "{name} has no description");
            // Every node with cpus has at least one cache of every level the machine has.
            let llc = t.llc_level().unwrap();
            for n in t.nodes.iter().filter(|n| !n.cpus.is_empty()) {
                assert!(
                    t.caches_at(llc)
                        .any(|c| !c.cpus.intersection(&n.cpus).is_empty()),
                    "{name}: node {} has no L{llc}",
                    n.id
                );
            }
        }
    }

    #[test]
    fn unknown_preset_lists_valid_names() {
        let e = build("xeon-9999").unwrap_err().to_string();
        assert!(e.contains("`xeon-9999`"), "{e}");
        for name in NAMES {
            assert!(e.contains(name), "{e}");
        }
    }

    #[test]
    fn shapes_match_the_seeds() {
        let count = |n: &str| {
            let t = build(n).unwrap();
            (t.nodes.len(), t.cpus.len())
        };
        assert_eq!(count("xeon-silver-4114-2s"), (2, 40));
        assert_eq!(count("xeon-gold-6346-2s"), (2, 64));
        assert_eq!(count("opteron-8220-8s"), (8, 16));
        assert_eq!(count("xeon-e7520-4s"), (4, 32));
        assert_eq!(count("xeon-e7-4850v4-4s"), (4, 128));
        assert_eq!(count("xeon-e7-4820-4s"), (4, 64));
        assert_eq!(count("xeon-e5310-2s"), (1, 8));
        assert_eq!(count("xeon-e5-4660v4-4s"), (4, 128));
        assert_eq!(count("xeon-platinum-8275cl-2s"), (2, 96));
    }

    #[test]
    fn gold_6346_numbering_and_nic() {
        let t = build("xeon-gold-6346-2s").unwrap();
        assert_eq!(t.nodes[0].cpus.to_string(), "0-15,32-47");
        assert_eq!(t.nodes[1].cpus.to_string(), "16-31,48-63");
        assert_eq!(t.smt_siblings(17).to_string(), "17,49");
        let nic = t.devices.iter().find(|d| d.name == "ens5f0np0").unwrap();
        assert_eq!(nic.node, Some(1));
        assert_eq!(t.nodes[1].memory_bytes, Some(512 << 30));
    }

    #[test]
    fn opteron_twisted_ladder() {
        let t = build("opteron-8220-8s").unwrap();
        // Each socket has at most three links; corners two (the third goes to I/O).
        for n in 0..8u32 {
            let deg = TWISTED_LADDER
                .iter()
                .filter(|(a, b)| *a == n || *b == n)
                .count();
            assert!(deg == 2 || deg == 3, "node {n} degree {deg}");
        }
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..8u32 {
            for j in 0..8u32 {
                let d = t.distance(i, j).unwrap();
                assert_eq!(d, t.distance(j, i).unwrap(), "symmetric");
                seen.insert(d);
                assert_eq!(t.hops(i, j).unwrap(), (d - 10) / 2);
            }
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![10, 12, 14, 16]);
        // Spot checks on the ladder: rung neighbours 1 hop, crossed middle rungs 1 hop,
        // opposite corners 3 hops.
        assert_eq!(t.distance(0, 1), Some(12));
        assert_eq!(t.distance(2, 5), Some(12));
        assert_eq!(t.distance(0, 5), Some(14));
        assert_eq!(t.distance(0, 7), Some(16));
        assert_eq!(t.llc_level(), Some(2));
    }

    #[test]
    fn e5310_pairs_share_l2() {
        let t = build("xeon-e5310-2s").unwrap();
        assert_eq!(t.nodes.len(), 1);
        let l2: Vec<String> = t.caches_at(2).map(|c| c.cpus.to_string()).collect();
        assert_eq!(l2, vec!["0,4", "1,5", "2,6", "3,7"]);
        assert_eq!(t.cpu(4).unwrap().package, 0);
        assert_eq!(t.cpu(1).unwrap().package, 1);
        let groups = t.core_groups(2);
        assert_eq!(groups.len(), 4);
    }

    #[test]
    fn e7_4820_hyperthreading() {
        let t = build("xeon-e7-4820-4s").unwrap();
        assert_eq!(t.nodes[3].cpus.to_string(), "24-31,56-63");
        assert_eq!(t.caches_at(3).count(), 4);
        assert_eq!(t.caches_at(3).next().unwrap().size_bytes, 18 << 20);
    }
}
