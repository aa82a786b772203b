//! NUMA nodes from `sys/devices/system/node`: cpus, memory and distances as real kernels write
//! them (rows for offline nodes, cpus that are not present), the kind of memory each node holds,
//! and firmware nodes that describe one locality domain several times.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::text::{parse_distance_row, parse_meminfo, parse_numa_status};
use super::{bad, numbered_entries, read_list_opt, read_opt};
use crate::error::TopoError;
use crate::idset::{CpuSet, NodeSet};
use crate::model::{Node, NodeKind};

/// The nodes as read, before cpus are attached: every node directory, its distance row
/// aligned to the node directories, and what was repaired on the way.
pub(super) struct RawNodes {
    pub nodes: Vec<Node>,
    pub distances: Vec<Vec<u32>>,
}

/// Reads every `nodeN` directory under `node_dir`. `present` are the cpus that have a `cpuN`
/// directory: a node cpulist naming others (kernels list possible cpus of a node) is cut to
/// them, with a note.
pub(super) fn read_nodes(
    node_dir: &Path,
    present: &CpuSet,
    notes: &mut Vec<String>,
) -> Result<RawNodes, TopoError> {
    let entries = numbered_entries(node_dir, "node")?;
    let mut nodes = Vec::with_capacity(entries.len());
    let mut rows = Vec::with_capacity(entries.len());
    let mut absent: BTreeMap<u32, CpuSet> = BTreeMap::new();
    for (id, dir) in &entries {
        // `cpulist` since Linux 2.6.2x; older kernels have only the `cpumap` mask.
        let listed = match read_list_opt(&dir.join("cpulist"))? {
            Some(c) => c,
            None => match read_opt(&dir.join("cpumap"))? {
                Some(t) if !t.is_empty() => {
                    let p = dir.join("cpumap");
                    CpuSet::parse_mask(&t).map_err(|e| bad(&p, &t, e))?
                }
                _ => numbered_entries(dir, "cpu")?
                    .into_iter()
                    .map(|(c, _)| c)
                    .collect(),
            },
        };
        let cpus = listed.intersection(present);
        let missing = listed.difference(present);
        if !missing.is_empty() {
            absent.insert(*id, missing);
        }
        let mpath = dir.join("meminfo");
        let (total, free) = match read_opt(&mpath)? {
            Some(t) => parse_meminfo(&t).map_err(|m| bad(&mpath, &t, m))?,
            None => (None, None),
        };
        let dpath = dir.join("distance");
        let row = match read_opt(&dpath)? {
            Some(t) => parse_distance_row(&t).map_err(|m| bad(&dpath, &t, m))?,
            None => vec![],
        };
        nodes.push(Node {
            id: *id,
            cpus,
            memory_bytes: total,
            free_bytes: free,
            ..Default::default()
        });
        rows.push((dpath, row));
    }
    for (id, missing) in &absent {
        notes.push(format!(
            "node {id}'s cpulist names cpus {missing} that are not present (no cpuN directory); left out"
        ));
    }
    let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    let online = read_set(&node_dir.join("online"))?;
    let possible = read_set(&node_dir.join("possible"))?;
    let distances = align_distances(&ids, rows, &[online, possible], notes)?;
    Ok(RawNodes { nodes, distances })
}

/// A node list file (`online`, `possible`, `has_cpu`); `None` when missing or empty.
fn read_set(path: &Path) -> Result<Option<NodeSet>, TopoError> {
    match read_opt(path)? {
        Some(t) if !t.is_empty() => NodeSet::parse(&t).map(Some).map_err(|e| bad(path, &t, e)),
        _ => Ok(None),
    }
}

/// The distance matrix over the node directories `ids`. The kernel prints one value per online
/// node, so a row is longer than `ids` when a node is online without a directory, or when a
/// capture was edited to take a node offline: such a row is read through the first node list
/// (`online`, `possible`; `0..len` when neither file exists) that has as many entries and holds every id. A missing
/// row is the kernel's default without a SLIT (10 local, 20 remote).
fn align_distances(
    ids: &[u32],
    rows: Vec<(PathBuf, Vec<u32>)>,
    lists: &[Option<NodeSet>],
    notes: &mut Vec<String>,
) -> Result<Vec<Vec<u32>>, TopoError> {
    let n = ids.len();
    let dirs: NodeSet = ids.iter().copied().collect();
    let mut realigned = false;
    let mut out = Vec::with_capacity(n);
    for (i, (path, row)) in rows.into_iter().enumerate() {
        if row.is_empty() {
            out.push((0..n).map(|j| if i == j { 10 } else { 20 }).collect());
            continue;
        }
        if row.len() == n {
            out.push(row);
            continue;
        }
        // Without `online` and `possible` (edited captures), value k is taken as node k's.
        let by_index: NodeSet = (0..row.len() as u32).collect();
        let fallback = lists.iter().all(Option::is_none).then_some(&by_index);
        let order = lists
            .iter()
            .flatten()
            .chain(fallback)
            .find(|l| l.len() == row.len() && dirs.is_subset(l));
        let Some(order) = order else {
            let shown = |l: &Option<NodeSet>| l.as_ref().map_or("-".into(), |l| l.to_string());
            return Err(TopoError::parse(
                &path,
                format!(
                    "{} distances, but {n} node directories ({dirs}), {} online and {} possible nodes: no node list lines up with the row `{}`",
                    row.len(),
                    shown(&lists[0]),
                    shown(&lists[1]),
                    row.iter().map(u32::to_string).collect::<Vec<_>>().join(" "),
                ),
            ));
        };
        // `order` holds every id (checked above), so each finds its column.
        let order: Vec<u32> = order.iter().collect();
        out.push(
            ids.iter()
                .filter_map(|id| order.iter().position(|o| o == id).map(|p| row[p]))
                .collect(),
        );
        realigned = true;
    }
    if realigned {
        notes.push(format!(
            "distance rows list nodes without a directory (offline nodes); read by node id for nodes {dirs}"
        ));
    }
    Ok(out)
}

/// Sets each node's kind and, for CPU-less nodes, its initiators. In order: NVIDIA's
/// `proc/driver/nvidia/gpus/*/numa_status` names GPU memory; a DAX device onlined as the node's
/// memory (`sys/bus/dax/devices/*/target_node`) below an `hmem` platform device is
/// specific-purpose memory (hbm), below an NVDIMM region (`ndbus`) it is nvm; otherwise the
/// HMAT read bandwidth (`nodeN/access1/initiators/read_bandwidth`, else `access0`) against the
/// slowest node with cpus: at least 1.5x is hbm, at most 1/1.5 is nvm (a margin so that DIMM
/// population differences between sockets stay dram).
pub(super) fn classify(root: &Path, node_dir: &Path, nodes: &mut [Node]) -> Result<(), TopoError> {
    let gpus = fs::read_dir(root.join("proc/driver/nvidia/gpus"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| read_opt(&e.path().join("numa_status")).ok().flatten())
                .filter_map(|t| parse_numa_status(&t))
                .collect::<NodeSet>()
        })
        .unwrap_or_default();
    let mut dax: BTreeMap<u32, NodeKind> = BTreeMap::new();
    if let Ok(rd) = fs::read_dir(root.join("sys/bus/dax/devices")) {
        for e in rd.filter_map(|e| e.ok()) {
            let Ok(real) = fs::canonicalize(e.path()) else {
                continue;
            };
            let target = read_opt(&real.join("target_node"))?.and_then(|t| t.parse::<u32>().ok());
            let path = real.to_string_lossy();
            let kind = if path.contains("/hmem") {
                NodeKind::Hbm
            } else if path.contains("/ndbus") {
                NodeKind::Nvm
            } else {
                continue;
            };
            if let Some(t) = target {
                dax.insert(t, kind);
            }
        }
    }
    let mut bandwidth: BTreeMap<u32, u64> = BTreeMap::new();
    for node in nodes.iter_mut() {
        let dir = node_dir.join(format!("node{}", node.id));
        for access in ["access1", "access0"] {
            let init = dir.join(access).join("initiators");
            let ids: NodeSet = numbered_entries(&init, "node")?
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            if ids.is_empty() {
                continue;
            }
            if let Some(bw) = read_opt(&init.join("read_bandwidth"))?
                .and_then(|t| t.parse::<u64>().ok())
                .filter(|bw| *bw > 0)
            {
                bandwidth.insert(node.id, bw);
            }
            if node.cpus.is_empty() {
                node.initiators = ids;
            }
            break;
        }
    }
    let slowest_cpu_node = nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .filter_map(|n| bandwidth.get(&n.id))
        .min()
        .copied();
    for node in nodes.iter_mut() {
        node.kind = if gpus.contains(node.id) && node.cpus.is_empty() {
            NodeKind::Gpu
        } else if let Some(k) = dax.get(&node.id) {
            *k
        } else {
            match (bandwidth.get(&node.id), slowest_cpu_node) {
                (Some(&bw), Some(base)) if bw as f64 >= base as f64 * 1.5 => NodeKind::Hbm,
                (Some(&bw), Some(base)) if bw as f64 * 1.5 <= base as f64 => NodeKind::Nvm,
                _ => NodeKind::Dram,
            }
        };
    }
    Ok(())
}

/// Folds nodes that firmware described as one locality domain: the same non-empty cpus as an
/// earlier node and the local distance between them (hwloc merges these too). The first keeps
/// its id, adds the others' memory and lists them in `merged`; their rows and columns leave the
/// distance matrix.
pub(super) fn merge_duplicates(
    nodes: &mut Vec<Node>,
    distances: &mut Vec<Vec<u32>>,
    notes: &mut Vec<String>,
) {
    let mut i = 0;
    while i < nodes.len() {
        let local = distances[i][i];
        let dups: Vec<usize> = (i + 1..nodes.len())
            .filter(|&j| {
                !nodes[i].cpus.is_empty()
                    && nodes[j].cpus == nodes[i].cpus
                    && distances[i][j] == local
                    && distances[j][i] == local
            })
            .collect();
        if !dups.is_empty() {
            let ids: NodeSet = dups.iter().map(|&j| nodes[j].id).collect();
            for &j in dups.iter().rev() {
                let d = nodes.remove(j);
                distances.remove(j);
                for row in distances.iter_mut() {
                    row.remove(j);
                }
                let keep = &mut nodes[i];
                keep.memory_bytes = keep.memory_bytes.zip(d.memory_bytes).map(|(a, b)| a + b);
                keep.free_bytes = keep.free_bytes.zip(d.free_bytes).map(|(a, b)| a + b);
                keep.merged = keep.merged.union(&d.kernel_ids());
            }
            notes.push(format!(
                "nodes {ids} list the same cpus ({}) as node {} at the local distance {local}: firmware NUMA data without locality, merged into node {} (a memory policy on it applies to nodes {})",
                nodes[i].cpus,
                nodes[i].id,
                nodes[i].id,
                nodes[i].kernel_ids()
            ));
        }
        i += 1;
    }
}
