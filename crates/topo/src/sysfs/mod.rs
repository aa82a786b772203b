//! Linux sysfs reader: the machine as the kernel describes it under `/sys` (and a little `/proc`).
//!
//! Everything is read through a root directory, so a captured tree (`DIR/sys/...`) reads exactly
//! like the live machine (`/sys/...`). What is read:
//!
//! - cpus: every `sys/devices/system/cpu/cpuN` directory is a present cpu. Its
//!   `topology/{physical_package_id,core_id}` and thread siblings (`core_cpus_list`,
//!   `thread_siblings_list` or `thread_siblings`), and `cpuN/online` or `cpu/online`. The
//!   kernel's `core_id` is unique only inside a package (or die); loci numbers cores
//!   machine-wide in order of (first cpu of) appearance, one per distinct (package, siblings,
//!   core_id). A cpu without a `topology` directory (offline cpus) is a core of its own.
//! - nodes ([`nodes`]): `sys/devices/system/node/nodeN/{cpulist,meminfo,distance}`, cut to the
//!   present cpus; distance rows that list offline nodes are read by node id; the kind of
//!   memory (dram, hbm, nvm, gpu); firmware duplicates merged. Without `node/` (kernel without
//!   NUMA): one node 0 holding every cpu, memory from `proc/meminfo`.
//! - caches ([`caches`]), devices ([`devices`]).
//! - allowed ([`allowed`]): the cgroup cpuset found in the tree; for the live machine also the
//!   affinity mask and `Mems_allowed_list`.
//!
//! Values are taken as kernels write them: trailing NUL bytes, newlines and blanks are dropped,
//! an empty file means "not said" (an empty `cpuN/online` means online), a missing file is
//! optional. A value that cannot be used is an error naming the file and showing its bytes
//! escaped. Nothing here panics on what a file holds. The parsers of file text are in [`text`].

mod allowed;
mod caches;
mod devices;
mod nodes;
pub mod text;

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

pub use allowed::{cgroup_cpuset, cpuset_dirs, CpusetKind};
pub use caches::{resolve_caches, CacheEntry};
pub use text::*;

use crate::error::TopoError;
use crate::idset::{CpuSet, NodeSet};
use crate::model::{Cpu, Node, Topology};

// ---------------------------------------------------------------------------------------------
// File helpers
// ---------------------------------------------------------------------------------------------

/// The value in a sysfs or procfs file, cleaned the way the kernel's readers need: trailing NUL
/// bytes (some drivers pad values with them), newlines and blanks dropped, leading blanks too.
/// `None` when the file is missing or hidden (a captured tree or a restricted container may
/// lack single files: every file read through here is optional by definition). A file that is
/// not text is an error showing its bytes.
pub(crate) fn read_opt(path: &Path) -> Result<Option<String>, TopoError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => return Ok(None),
        Err(e) => return Err(TopoError::io(path, e)),
    };
    let end = bytes
        .iter()
        .rposition(|b| !(*b == 0 || b.is_ascii_whitespace()))
        .map_or(0, |i| i + 1);
    let start = bytes[..end]
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(end);
    match std::str::from_utf8(&bytes[start..end]) {
        Ok(s) => Ok(Some(s.to_string())),
        Err(_) => Err(TopoError::parse(
            path,
            format!("not text: the file holds \"{}\"", escaped(&bytes)),
        )),
    }
}

/// At most 160 bytes of `b`, escaped so that control characters and NULs show (`\x00`, `\n`).
fn escaped(b: &[u8]) -> String {
    let cut = b.len() > 160;
    let mut s = b[..b.len().min(160)].escape_ascii().to_string();
    if cut {
        s.push_str(&format!("... ({} bytes)", b.len()));
    }
    s
}

/// An error for a file whose (cleaned) value `raw` cannot be used: names the file, says why and
/// shows the value escaped.
pub(crate) fn bad(path: &Path, raw: &str, why: impl std::fmt::Display) -> TopoError {
    TopoError::parse(
        path,
        format!("{why}; the file holds \"{}\"", escaped(raw.as_bytes())),
    )
}

/// An integer file; `None` when missing or empty.
fn read_int_opt(path: &Path) -> Result<Option<i64>, TopoError> {
    match read_opt(path)? {
        Some(t) if !t.is_empty() => parse_int(&t).map(Some).map_err(|m| bad(path, &t, m)),
        _ => Ok(None),
    }
}

/// A cpu list file; an empty file is the empty set.
fn read_list_opt(path: &Path) -> Result<Option<CpuSet>, TopoError> {
    read_opt(path)?
        .map(|t| CpuSet::parse(&t).map_err(|e| bad(path, &t, e)))
        .transpose()
}

/// Entries `PREFIXn` of a directory, sorted by n.
fn numbered_entries(dir: &Path, prefix: &str) -> Result<Vec<(u32, PathBuf)>, TopoError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(vec![]),
        Err(e) if e.kind() == ErrorKind::NotADirectory => return Ok(vec![]),
        Err(e) => return Err(TopoError::io(dir, e)),
    };
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| TopoError::io(dir, e))?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name.strip_prefix(prefix) {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                if let Ok(id) = n.parse::<u32>() {
                    out.push((id, ent.path()));
                }
            }
        }
    }
    out.sort_by_key(|(id, _)| *id);
    Ok(out)
}

/// `root` joined with an absolute path as the process sees it.
fn under(root: &Path, abs: &Path) -> PathBuf {
    root.join(abs.strip_prefix("/").unwrap_or(abs))
}

// ---------------------------------------------------------------------------------------------
// The reader
// ---------------------------------------------------------------------------------------------

/// Reads the tree under `root`. Allowed cpus and nodes follow the cgroup cpuset found in the
/// tree; with `live` also this process's affinity and `Mems_allowed_list`.
pub fn read(root: &Path, live: bool) -> Result<Topology, TopoError> {
    let sys = root.join("sys");
    let cpu_dir = sys.join("devices/system/cpu");
    let cpu_entries = numbered_entries(&cpu_dir, "cpu")?;
    if cpu_entries.is_empty() {
        return Err(TopoError::parse(
            &cpu_dir,
            "no cpuN directories (is this a Linux sysfs tree? a captured tree must hold sys/devices/system/cpu)",
        ));
    }
    let present: CpuSet = cpu_entries.iter().map(|(id, _)| *id).collect();
    let global_online = read_list_opt(&cpu_dir.join("online"))?.filter(|s| !s.is_empty());
    let mut notes = Vec::new();

    // --- nodes
    let node_dir = sys.join("devices/system/node");
    let nodes::RawNodes {
        mut nodes,
        mut distances,
    } = nodes::read_nodes(&node_dir, &present, &mut notes)?;
    let numa = !nodes.is_empty();
    if numa {
        nodes::merge_duplicates(&mut nodes, &mut distances, &mut notes);
        // A cpu listed by two nodes stays in the first (a cpu has one home node).
        let mut seen = CpuSet::new();
        for n in &mut nodes {
            let twice = n.cpus.intersection(&seen);
            if !twice.is_empty() {
                notes.push(format!(
                    "cpus {twice} are also listed by node {}; kept in the lower node",
                    n.id
                ));
                n.cpus = n.cpus.difference(&twice);
            }
            seen = seen.union(&n.cpus);
        }
        nodes::classify(root, &node_dir, &mut nodes)?;
    } else {
        let mpath = root.join("proc/meminfo");
        let (total, free) = match read_opt(&mpath)? {
            Some(t) => parse_meminfo(&t).map_err(|m| bad(&mpath, &t, m))?,
            None => (None, None),
        };
        nodes.push(Node {
            cpus: present.clone(),
            memory_bytes: total,
            free_bytes: free,
            ..Default::default()
        });
        distances = vec![vec![10]];
    }

    // --- cpus
    let mut cpus = Vec::with_capacity(cpu_entries.len());
    let mut core_ids: HashMap<(i64, Vec<u32>, i64), u32> = HashMap::new();
    let mut next_core = 0u32;
    for (id, dir) in &cpu_entries {
        let topo = dir.join("topology");
        let package = read_int_opt(&topo.join("physical_package_id"))?;
        let core_id = read_int_opt(&topo.join("core_id"))?;
        // The hardware threads of this cpu's core. A core is (package, siblings, core_id):
        // `core_id` repeats across the dies of one package (AMD Opteron 6200), and on AMD
        // family 15h the kernel lists a compute unit's two cores as siblings while giving
        // them different core ids; hwloc builds cores the same way.
        let siblings: Vec<u32> = match read_list_opt(&topo.join("core_cpus_list"))? {
            Some(s) if !s.is_empty() => s.iter().collect(),
            _ => match read_list_opt(&topo.join("thread_siblings_list"))? {
                Some(s) if !s.is_empty() => s.iter().collect(),
                _ => match read_opt(&topo.join("thread_siblings"))? {
                    Some(t) if !t.is_empty() => {
                        let p = topo.join("thread_siblings");
                        CpuSet::parse_mask(&t)
                            .map_err(|e| bad(&p, &t, e))?
                            .iter()
                            .collect()
                    }
                    _ => vec![],
                },
            },
        };
        let opath = dir.join("online");
        let online = match read_opt(&opath)? {
            Some(t) if t.is_empty() => true,
            Some(t) => parse_int(&t).map_err(|m| bad(&opath, &t, m))? != 0,
            None => !matches!(&global_online, Some(s) if !s.contains(*id)),
        };
        let core = match core_id {
            Some(c) => *core_ids
                .entry((package.unwrap_or(0), siblings, c))
                .or_insert_with(|| {
                    next_core += 1;
                    next_core - 1
                }),
            None => {
                next_core += 1;
                next_core - 1
            }
        };
        let node = if numa {
            match nodes.iter().find(|n| n.cpus.contains(*id)) {
                Some(n) => Some(n.id),
                // Offline cpus are not in their node's cpulist; the `cpuN/nodeM` link says.
                None => numbered_entries(dir, "node")?
                    .first()
                    .and_then(|(m, _)| nodes.iter().find(|n| n.kernel_ids().contains(*m)))
                    .map(|n| n.id),
            }
        } else {
            Some(0)
        };
        cpus.push(Cpu {
            id: *id,
            core,
            package: package.filter(|p| *p >= 0).unwrap_or(0) as u32,
            node,
            online,
            allowed: true,
        });
    }
    // A cpu found only through its `nodeM` link still belongs in that node's list.
    for c in &cpus {
        if let Some(n) = c.node.and_then(|n| nodes.iter_mut().find(|x| x.id == n)) {
            n.cpus.insert(c.id);
        }
    }

    let caches = caches::read_caches(&cpu_entries)?;
    let node_ids: NodeSet = nodes
        .iter()
        .flat_map(|n| n.kernel_ids().iter().collect::<Vec<_>>())
        .collect();
    let mut devices = devices::read_devices(&sys, &node_ids)?;
    // A device on a merged node hangs off the node that absorbed it.
    for d in &mut devices {
        d.node = d.node.and_then(|k| {
            nodes
                .iter()
                .find(|n| n.kernel_ids().contains(k))
                .map(|n| n.id)
        });
    }

    let restrict = allowed::allowed(root, live)?;
    for c in &mut cpus {
        c.allowed = !matches!(&restrict.cpus, Some(a) if !a.contains(c.id));
    }
    for n in &mut nodes {
        n.allowed = !matches!(&restrict.mems, Some(a) if n.kernel_ids().intersection(a).is_empty());
    }
    let mut t = Topology::from_parts(String::new(), nodes, cpus, caches, devices, distances);
    t.notes = notes;
    Ok(t)
}
