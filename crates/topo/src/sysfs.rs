//! Linux sysfs reader: the machine as the kernel describes it under `/sys` (and a little `/proc`).
//!
//! Everything is read through a root directory, so a captured tree (`DIR/sys/...`) reads exactly
//! like the live machine (`/sys/...`). What is read:
//!
//! - cpus: `sys/devices/system/cpu/cpuN/topology/{physical_package_id,core_id}` and the thread
//!   siblings (`core_cpus_list`, `thread_siblings_list` or `thread_siblings`), `cpuN/online` or
//!   `cpu/online`. The kernel's `core_id` is unique only inside a package (or die); loci numbers
//!   cores machine-wide in order of (first cpu of) appearance, one per distinct
//!   (package, siblings, core_id).
//! - nodes: `sys/devices/system/node/nodeN/{cpulist,meminfo,distance}` (ids may be sparse, nodes
//!   may be CPU-less or memoryless). Without `node/` (kernel without NUMA): one node 0 holding
//!   every cpu, memory from `proc/meminfo`.
//! - caches: `cpuN/cache/indexM/{level,type,size,shared_cpu_map}` (`shared_cpu_list` where there
//!   is no map), one entry per instance.
//! - devices: `sys/class/net/*` and `sys/class/block/*` that are not below
//!   `sys/devices/virtual` (virtual interfaces, loop, ram and zram disks are; partitions are
//!   skipped too). The home node is `device/numa_node`, else the first `numa_node` walking up
//!   from the device (NVMe namespaces sit below their PCI function); -1 means no affinity.
//! - allowed (live only): `sched_getaffinity` when the root is `/` (else `Cpus_allowed_list` of
//!   `proc/self/status`), intersected with the cgroup cpuset (`cpuset.cpus.effective` on v2,
//!   `cpuset.effective_cpus` on v1) found through `proc/self/cgroup` and `proc/self/mountinfo`;
//!   nodes: `Mems_allowed_list` and `cpuset.mems.effective` likewise.
//!
//! The parsers below take `&str` so that each is unit-tested on literal text.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::idset::{CpuSet, NodeSet};
use crate::model::{Cache, CacheKind, Cpu, Device, DeviceKind, Node, Topology};
use crate::source::TopoError;

// ---------------------------------------------------------------------------------------------
// Parsers (pure, on text)
// ---------------------------------------------------------------------------------------------

/// `MemTotal` and `MemFree` in bytes from a node `meminfo` (`Node 0 MemTotal:  8386704 kB`) or
/// from `/proc/meminfo` (`MemTotal:  8386704 kB`).
pub fn parse_meminfo(text: &str) -> Result<(Option<u64>, Option<u64>), String> {
    let mut total = None;
    let mut free = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let key = key.split_whitespace().last().unwrap_or("");
        let slot = match key {
            "MemTotal" => &mut total,
            "MemFree" => &mut free,
            _ => continue,
        };
        let mut it = value.split_whitespace();
        let num: u64 = it
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("bad {key} line `{}`", line.trim()))?;
        let mult = match it.next() {
            None => 1,
            Some(u) if u.eq_ignore_ascii_case("kb") => 1024,
            Some(u) => {
                return Err(format!(
                    "unknown unit `{u}` in {key} line `{}`",
                    line.trim()
                ))
            }
        };
        *slot = Some(num * mult);
    }
    Ok((total, free))
}

/// One row of a node `distance` file: `10 20 20 20`.
pub fn parse_distance_row(text: &str) -> Result<Vec<u32>, String> {
    text.split_whitespace()
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| format!("`{t}` is not a distance (expected integers like `10 20`)"))
        })
        .collect()
}

/// A cache `size` file: `32K`, `1024K`, `8M`, `1G`, or plain bytes.
pub fn parse_cache_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .map(|n| n * mult)
        .map_err(|_| format!("`{t}` is not a cache size (expected e.g. `32K`, `8M`)"))
}

/// A cache `type` file: `Data`, `Instruction` or `Unified`.
pub fn parse_cache_type(text: &str) -> Result<CacheKind, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "data" => Ok(CacheKind::Data),
        "instruction" => Ok(CacheKind::Instruction),
        "unified" => Ok(CacheKind::Unified),
        other => Err(format!(
            "unknown cache type `{other}` (valid: Data, Instruction, Unified)"
        )),
    }
}

/// A file holding one integer (`core_id`, `numa_node`, `level`, ...). May be negative (-1).
pub fn parse_int(text: &str) -> Result<i64, String> {
    let t = text.trim();
    t.parse::<i64>()
        .map_err(|_| format!("`{t}` is not an integer"))
}

/// A line `Key:\tvalue` of `/proc/PID/status`, e.g. `Mems_allowed_list`.
pub fn status_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// The process's cgroup paths, from `/proc/self/cgroup`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupPaths {
    /// The unified (v2) hierarchy's path, from the `0::PATH` line.
    pub v2: Option<String>,
    /// The v1 cpuset hierarchy's path, from a `N:...cpuset...:PATH` line.
    pub v1_cpuset: Option<String>,
}

/// Parses `/proc/self/cgroup` (`hierarchy-id:controllers:path` per line).
pub fn parse_proc_cgroup(text: &str) -> CgroupPaths {
    let mut out = CgroupPaths::default();
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            out.v2 = Some(path.to_string());
        } else if ctrls.split(',').any(|c| c == "cpuset") {
            out.v1_cpuset = Some(path.to_string());
        }
    }
    out
}

/// One line of `/proc/self/mountinfo`, the fields loci needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The path inside the filesystem that is mounted (for cgroups: the cgroup the mount shows).
    pub root: String,
    pub mount_point: String,
    pub fs_type: String,
    pub super_options: String,
}

/// Parses `/proc/self/mountinfo` (see proc(5)): `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3
/// /dev/root rw,errors=continue`. Octal escapes (`\040` for a space) are decoded.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    fn unescape(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\'
                && i + 4 <= b.len()
                && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
            {
                let v = b[i + 1..i + 4]
                    .iter()
                    .fold(0u32, |a, c| a * 8 + (c - b'0') as u32);
                out.push(v as u8);
                i += 4;
                continue;
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 5 || fields.len() < sep + 3 {
            continue;
        }
        out.push(Mount {
            root: unescape(fields[3]),
            mount_point: unescape(fields[4]),
            fs_type: fields[sep + 1].to_string(),
            super_options: fields.get(sep + 3).unwrap_or(&"").to_string(),
        });
    }
    out
}

/// Directories (absolute, as the process sees them) that hold the process's cpuset files, with
/// the cgroup version: v2 first, then v1.
pub fn cpuset_dirs(cg: &CgroupPaths, mounts: &[Mount]) -> Vec<(PathBuf, u8)> {
    fn join(m: &Mount, path: &str) -> PathBuf {
        // A mount showing cgroup `m.root` at `m.mount_point`: strip that prefix off `path`.
        let rel = if m.root == "/" {
            path.trim_start_matches('/')
        } else {
            match path.strip_prefix(m.root.as_str()) {
                Some(r) if r.is_empty() || r.starts_with('/') => r.trim_start_matches('/'),
                // The process's cgroup is outside what is mounted (container namespaces): the
                // mount point itself is the process's view of its own cgroup.
                _ => "",
            }
        };
        let mut p = PathBuf::from(&m.mount_point);
        if !rel.is_empty() {
            p.push(rel);
        }
        p
    }
    let mut out = Vec::new();
    if let Some(path) = &cg.v2 {
        if let Some(m) = mounts.iter().find(|m| m.fs_type == "cgroup2") {
            out.push((join(m, path), 2));
        }
    }
    if let Some(path) = &cg.v1_cpuset {
        if let Some(m) = mounts
            .iter()
            .find(|m| m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == "cpuset"))
        {
            out.push((join(m, path), 1));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// File helpers
// ---------------------------------------------------------------------------------------------

fn read_opt(path: &Path) -> Result<Option<String>, TopoError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        // A captured tree or a restricted container may hide single files; such files are
        // optional by definition of this helper.
        Err(e) if e.kind() == ErrorKind::PermissionDenied => Ok(None),
        Err(e) => Err(TopoError::io(path, e)),
    }
}

fn read_int_opt(path: &Path) -> Result<Option<i64>, TopoError> {
    read_opt(path)?
        .map(|t| parse_int(&t).map_err(|m| TopoError::parse(path, m)))
        .transpose()
}

fn read_list_opt(path: &Path) -> Result<Option<CpuSet>, TopoError> {
    read_opt(path)?
        .map(|t| CpuSet::parse(&t).map_err(|e| TopoError::parse(path, e.to_string())))
        .transpose()
}

/// Entries `PREFIXn` of a directory, sorted by n.
fn numbered_entries(dir: &Path, prefix: &str) -> Result<Vec<(u32, PathBuf)>, TopoError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(vec![]),
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

/// Reads the tree under `root`. With `live`, allowed cpus and nodes come from the process's
/// affinity and cgroup; otherwise everything present is allowed.
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
    let global_online = read_list_opt(&cpu_dir.join("online"))?;

    // --- nodes
    let node_dir = sys.join("devices/system/node");
    let node_entries = numbered_entries(&node_dir, "node")?;
    let mut nodes = Vec::new();
    let mut distances = Vec::new();
    for (id, dir) in &node_entries {
        // `cpulist` since Linux 2.6.2x; older kernels have only the `cpumap` mask.
        let cpus = match read_list_opt(&dir.join("cpulist"))? {
            Some(c) => c,
            None => match read_opt(&dir.join("cpumap"))? {
                Some(t) => CpuSet::parse_mask(&t)
                    .map_err(|e| TopoError::parse(&dir.join("cpumap"), e.to_string()))?,
                None => numbered_entries(dir, "cpu")?
                    .into_iter()
                    .map(|(c, _)| c)
                    .collect(),
            },
        };
        let (total, free) = match read_opt(&dir.join("meminfo"))? {
            Some(t) => parse_meminfo(&t).map_err(|m| TopoError::parse(&dir.join("meminfo"), m))?,
            None => (None, None),
        };
        let dpath = dir.join("distance");
        let row = match read_opt(&dpath)? {
            Some(t) => parse_distance_row(&t).map_err(|m| TopoError::parse(&dpath, m))?,
            None => vec![],
        };
        nodes.push(Node {
            id: *id,
            cpus,
            memory_bytes: total,
            free_bytes: free,
            allowed: true,
        });
        distances.push((dpath, row));
    }
    let numa = !nodes.is_empty();
    let distances: Vec<Vec<u32>> = if numa {
        let n = nodes.len();
        let mut out = Vec::with_capacity(n);
        for (i, (path, row)) in distances.into_iter().enumerate() {
            if row.is_empty() {
                // No distance file: local 10, remote 20 (the kernel's default when the
                // firmware gives no SLIT).
                out.push((0..n).map(|j| if i == j { 10 } else { 20 }).collect());
            } else if row.len() != n {
                return Err(TopoError::parse(
                    &path,
                    format!(
                        "{} distances for {} nodes ({})",
                        row.len(),
                        n,
                        nodes.iter().map(|n| n.id).collect::<NodeSet>()
                    ),
                ));
            } else {
                out.push(row);
            }
        }
        out
    } else {
        vec![vec![10]]
    };

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
            Some(s) => s.iter().collect(),
            None => match read_list_opt(&topo.join("thread_siblings_list"))? {
                Some(s) => s.iter().collect(),
                None => match read_opt(&topo.join("thread_siblings"))? {
                    Some(t) => CpuSet::parse_mask(&t)
                        .map_err(|e| {
                            TopoError::parse(&topo.join("thread_siblings"), e.to_string())
                        })?
                        .iter()
                        .collect(),
                    None => vec![],
                },
            },
        };
        let online = match read_int_opt(&dir.join("online"))? {
            Some(v) => v != 0,
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
                // Offline cpus have no topology directory: give them a core of their own.
                next_core += 1;
                next_core - 1
            }
        };
        let node = if numa {
            match nodes.iter().find(|n| n.cpus.contains(*id)) {
                Some(n) => Some(n.id),
                // Offline cpus are not in their node's cpulist; the `cpuN/nodeM` link says.
                None => numbered_entries(dir, "node")?.first().map(|(n, _)| *n),
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
    if numa {
        // A cpu found only through its `nodeM` link still belongs in that node's list.
        for c in &cpus {
            if let Some(n) = c.node.and_then(|n| nodes.iter_mut().find(|x| x.id == n)) {
                n.cpus.insert(c.id);
            }
        }
    } else {
        let (total, free) = match read_opt(&root.join("proc/meminfo"))? {
            Some(t) => {
                parse_meminfo(&t).map_err(|m| TopoError::parse(&root.join("proc/meminfo"), m))?
            }
            None => (None, None),
        };
        nodes.push(Node {
            id: 0,
            cpus: cpus.iter().map(|c| c.id).collect(),
            memory_bytes: total,
            free_bytes: free,
            allowed: true,
        });
    }

    // --- caches
    let mut entries = Vec::new();
    for (id, dir) in &cpu_entries {
        for (_, idx) in numbered_entries(&dir.join("cache"), "index")? {
            let Some(level) = read_int_opt(&idx.join("level"))? else {
                continue;
            };
            let Some(kind) = read_opt(&idx.join("type"))? else {
                continue;
            };
            let kind =
                parse_cache_type(&kind).map_err(|m| TopoError::parse(&idx.join("type"), m))?;
            let size = match read_opt(&idx.join("size"))? {
                Some(t) => {
                    parse_cache_size(&t).map_err(|m| TopoError::parse(&idx.join("size"), m))?
                }
                None => 0,
            };
            let map = read_opt(&idx.join("shared_cpu_map"))?
                .map(|t| {
                    CpuSet::parse_mask(&t)
                        .map_err(|e| TopoError::parse(&idx.join("shared_cpu_map"), e.to_string()))
                })
                .transpose()?;
            let list = read_list_opt(&idx.join("shared_cpu_list"))?;
            let level = u8::try_from(level).map_err(|_| {
                TopoError::parse(&idx.join("level"), format!("cache level {level}"))
            })?;
            entries.push(CacheEntry {
                cpu: *id,
                level,
                kind,
                size,
                map,
                list,
            });
        }
    }
    let caches = resolve_caches(&entries);

    // --- devices
    let node_ids: NodeSet = nodes.iter().map(|n| n.id).collect();
    let mut devices = Vec::new();
    for (class, kind) in [("net", DeviceKind::Net), ("block", DeviceKind::Block)] {
        let dir = sys.join("class").join(class);
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        for name in names {
            let d = dir.join(&name);
            if d.join("partition").exists() {
                continue;
            }
            // Physical devices live below sys/devices/<bus>; loop, ram, zram, bridges, tunnels
            // below sys/devices/virtual. Very old trees have real directories in sys/class:
            // there a `device` link marks hardware.
            match (fs::canonicalize(&d), fs::canonicalize(sys.join("devices"))) {
                (Ok(c), Ok(top)) if c.starts_with(&top) => {
                    if c.starts_with(top.join("virtual")) {
                        continue;
                    }
                }
                _ => {
                    if !d.join("device").exists() {
                        continue;
                    }
                }
            }
            let node = device_node(&sys, &d)?
                .filter(|n| *n >= 0)
                .map(|n| n as u32)
                .filter(|n| node_ids.contains(*n));
            devices.push(Device { name, kind, node });
        }
    }

    let mut topo = Topology {
        source: String::new(),
        nodes,
        cpus,
        caches,
        devices,
        distances,
    };
    if live {
        apply_allowed(root, &mut topo)?;
    }
    Ok(topo)
}

/// One `cpuN/cache/indexM` directory as read.
#[derive(Debug, Clone)]
pub struct CacheEntry {
    pub cpu: u32,
    pub level: u8,
    pub kind: CacheKind,
    pub size: u64,
    /// `shared_cpu_map`, parsed.
    pub map: Option<CpuSet>,
    /// `shared_cpu_list`, parsed.
    pub list: Option<CpuSet>,
}

/// Turns per-cpu cache entries into cache instances, each once.
///
/// The kernel prints the sharing twice (`shared_cpu_map`, `shared_cpu_list`) and old kernels got
/// one of them wrong now and then: AMD family 15h lists only the cpu itself next to a right
/// map; other captures have a map that overlaps a neighbour's instance. An instance must hold
/// its own cpu and, per level and kind, instances must be equal or disjoint. The map is tried
/// first (as hwloc does), then the list; an entry neither of which fits is dropped (its cpu
/// then has no cache of that level, as in hwloc's view of such a machine).
pub fn resolve_caches(entries: &[CacheEntry]) -> Vec<Cache> {
    let first = |e: &CacheEntry| -> Option<CpuSet> {
        e.map
            .clone()
            .or_else(|| e.list.clone())
            .or_else(|| Some(CpuSet::single(e.cpu)))
    };
    let candidates: HashMap<(u32, u8, u8), [Option<CpuSet>; 2]> = entries
        .iter()
        .map(|e| ((e.cpu, e.level, e.kind as u8), [first(e), e.list.clone()]))
        .collect();
    // `set` is agreed when it holds the entry's cpu and every member cpu that has an entry of
    // the same level and kind names the very same set (in its map or its list).
    let agreed = |e: &CacheEntry, set: &CpuSet| -> bool {
        set.contains(e.cpu)
            && set.iter().all(|d| {
                !matches!(
                    candidates.get(&(d, e.level, e.kind as u8)),
                    Some(c) if !c.iter().any(|f| f.as_ref() == Some(set))
                )
            })
    };
    let mut out: BTreeMap<(u8, u8, Vec<u32>), Cache> = BTreeMap::new();
    for e in entries {
        let chosen = [first(e), e.list.clone()]
            .into_iter()
            .flatten()
            .find(|s| agreed(e, s));
        let Some(cpus) = chosen else { continue };
        out.entry((e.level, e.kind as u8, cpus.iter().collect()))
            .or_insert(Cache {
                level: e.level,
                kind: e.kind,
                size_bytes: e.size,
                cpus,
            });
    }
    let mut caches: Vec<Cache> = out.into_values().collect();
    caches.sort_by_key(|c| (c.level, c.kind as u8, c.cpus.first()));
    caches
}

/// The `numa_node` of a device (`entry` is its `sys/class/CLASS/NAME`): `device/numa_node`, else
/// the first `numa_node` found walking up from the entry towards `sys/devices` (an NVMe namespace
/// sits below its PCI function).
fn device_node(sys: &Path, entry: &Path) -> Result<Option<i64>, TopoError> {
    if let Some(v) = read_int_opt(&entry.join("device/numa_node"))? {
        return Ok(Some(v));
    }
    let (Ok(mut p), Ok(top)) = (
        fs::canonicalize(entry),
        fs::canonicalize(sys.join("devices")),
    ) else {
        return Ok(None);
    };
    while p.starts_with(&top) && p != top {
        if let Some(v) = read_int_opt(&p.join("numa_node"))? {
            return Ok(Some(v));
        }
        if !p.pop() {
            break;
        }
    }
    Ok(None)
}

/// The process's affinity mask through `sched_getaffinity(0)`.
fn sched_affinity() -> Option<CpuSet> {
    let mut words = 16usize; // 1024 cpus; grown while the kernel says the buffer is too small.
    loop {
        let mut buf = vec![0u64; words];
        // SAFETY: `buf` is a live, writable allocation of `words * 8` bytes and that is the size
        // passed; the raw syscall writes at most that many bytes and returns how many it wrote.
        let r =
            unsafe { libc::syscall(libc::SYS_sched_getaffinity, 0, words * 8, buf.as_mut_ptr()) };
        if r < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINVAL) && words < (1 << 14) {
                words *= 2;
                continue;
            }
            return None;
        }
        let bytes = r as usize;
        let mut set = CpuSet::new();
        for (w, word) in buf.iter().enumerate().take(bytes.div_ceil(8)) {
            for bit in 0..64 {
                if word >> bit & 1 == 1 {
                    set.insert((w * 64 + bit) as u32);
                }
            }
        }
        return Some(set);
    }
}

/// The cgroup cpuset of the process under `root`: (effective cpus, effective mems), each `None`
/// when no cpuset applies.
pub fn cgroup_cpuset(root: &Path) -> Result<(Option<CpuSet>, Option<NodeSet>), TopoError> {
    let Some(cg) = read_opt(&root.join("proc/self/cgroup"))? else {
        return Ok((None, None));
    };
    let Some(mi) = read_opt(&root.join("proc/self/mountinfo"))? else {
        return Ok((None, None));
    };
    let cg = parse_proc_cgroup(&cg);
    let mounts = parse_mountinfo(&mi);
    let mut cpus: Option<CpuSet> = None;
    let mut mems: Option<NodeSet> = None;
    for (dir, version) in cpuset_dirs(&cg, &mounts) {
        let (cf, mf, fallback) = match version {
            2 => ("cpuset.cpus.effective", "cpuset.mems.effective", None),
            _ => (
                "cpuset.effective_cpus",
                "cpuset.effective_mems",
                Some(("cpuset.cpus", "cpuset.mems")),
            ),
        };
        // v2: the files exist only where the cpuset controller is enabled; above that the
        // parent's effective set applies, so walk up to the mount point.
        let mount_top = mounts
            .iter()
            .map(|m| PathBuf::from(&m.mount_point))
            .filter(|mp| dir.starts_with(mp))
            .max_by_key(|mp| mp.as_os_str().len())
            .unwrap_or_else(|| PathBuf::from("/"));
        let mut d = dir.clone();
        loop {
            let host = under(root, &d);
            let mut c = read_opt(&host.join(cf))?;
            let mut m = read_opt(&host.join(mf))?;
            if c.is_none() {
                if let Some((fc, fm)) = fallback {
                    c = read_opt(&host.join(fc))?;
                    m = read_opt(&host.join(fm))?;
                }
            }
            if let Some(c) = c.filter(|c| !c.trim().is_empty()) {
                let set = CpuSet::parse(&c)
                    .map_err(|e| TopoError::parse(&host.join(cf), e.to_string()))?;
                cpus = Some(match cpus {
                    Some(prev) => prev.intersection(&set),
                    None => set,
                });
                if let Some(m) = m.filter(|m| !m.trim().is_empty()) {
                    let set = NodeSet::parse(&m)
                        .map_err(|e| TopoError::parse(&host.join(mf), e.to_string()))?;
                    mems = Some(match mems {
                        Some(prev) => prev.intersection(&set),
                        None => set,
                    });
                }
                break;
            }
            if d == mount_top || !d.pop() {
                break;
            }
        }
    }
    Ok((cpus, mems))
}

fn apply_allowed(root: &Path, topo: &mut Topology) -> Result<(), TopoError> {
    let status_path = root.join("proc/self/status");
    let status = read_opt(&status_path)?;
    let affinity = if root == Path::new("/") {
        sched_affinity()
    } else {
        None
    };
    let affinity = match affinity {
        Some(a) => Some(a),
        None => status
            .as_deref()
            .and_then(|s| status_field(s, "Cpus_allowed_list"))
            .map(|v| CpuSet::parse(v).map_err(|e| TopoError::parse(&status_path, e.to_string())))
            .transpose()?,
    };
    let mems_allowed = status
        .as_deref()
        .and_then(|s| status_field(s, "Mems_allowed_list"))
        .map(|v| NodeSet::parse(v).map_err(|e| TopoError::parse(&status_path, e.to_string())))
        .transpose()?;
    let (cg_cpus, cg_mems) = cgroup_cpuset(root)?;
    for c in &mut topo.cpus {
        c.allowed = !matches!(&affinity, Some(a) if !a.contains(c.id))
            && !matches!(&cg_cpus, Some(a) if !a.contains(c.id));
    }
    for n in &mut topo.nodes {
        n.allowed = !matches!(&mems_allowed, Some(a) if !a.contains(n.id))
            && !matches!(&cg_mems, Some(a) if !a.contains(n.id));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_node_and_proc() {
        let node = "\nNode 0 MemTotal:      8386704 kB\nNode 0 MemFree:       6895672 kB\nNode 0 MemUsed:       1491032 kB\n";
        assert_eq!(
            parse_meminfo(node).unwrap(),
            (Some(8386704 * 1024), Some(6895672 * 1024))
        );
        let proc =
            "MemTotal:       24570740 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(
            parse_meminfo(proc).unwrap(),
            (Some(24570740 * 1024), Some(1000 * 1024))
        );
        assert_eq!(
            parse_meminfo("Node 3 Active: 5 kB\n").unwrap(),
            (None, None)
        );
        let err = parse_meminfo("Node 0 MemTotal: lots kB").unwrap_err();
        assert!(err.contains("MemTotal"), "{err}");
        let err = parse_meminfo("Node 0 MemTotal: 5 MB").unwrap_err();
        assert!(err.contains("unit `MB`"), "{err}");
    }

    #[test]
    fn distance_rows() {
        assert_eq!(
            parse_distance_row("10 20 20 20\n").unwrap(),
            vec![10, 20, 20, 20]
        );
        assert_eq!(parse_distance_row("10").unwrap(), vec![10]);
        let err = parse_distance_row("10 2x").unwrap_err();
        assert!(err.contains("`2x`"), "{err}");
    }

    #[test]
    fn cache_sizes_and_types() {
        assert_eq!(parse_cache_size("32K\n").unwrap(), 32 << 10);
        assert_eq!(parse_cache_size("32768K").unwrap(), 32 << 20);
        assert_eq!(parse_cache_size("8M").unwrap(), 8 << 20);
        assert_eq!(parse_cache_size("4096").unwrap(), 4096);
        assert!(parse_cache_size("K").is_err());
        assert!(parse_cache_size("12Q").unwrap_err().contains("`12Q`"));
        assert_eq!(parse_cache_type("Data\n").unwrap(), CacheKind::Data);
        assert_eq!(
            parse_cache_type("Instruction").unwrap(),
            CacheKind::Instruction
        );
        assert_eq!(parse_cache_type("Unified").unwrap(), CacheKind::Unified);
        assert!(parse_cache_type("Trace").unwrap_err().contains("valid"));
    }

    fn entry(cpu: u32, map: &str, list: &str) -> CacheEntry {
        CacheEntry {
            cpu,
            level: 3,
            kind: CacheKind::Unified,
            size: 1 << 20,
            map: (!map.is_empty()).then(|| CpuSet::parse_mask(map).unwrap()),
            list: (!list.is_empty()).then(|| CpuSet::parse(list).unwrap()),
        }
    }

    #[test]
    fn caches_deduplicated_and_repaired() {
        // Two instances of 2 cpus each, seen from each cpu: two caches.
        let e = [
            entry(0, "3", "0-1"),
            entry(1, "3", "0-1"),
            entry(2, "c", "2-3"),
            entry(3, "c", "2-3"),
        ];
        let c = resolve_caches(&e);
        let got: Vec<String> = c.iter().map(|c| c.cpus.to_string()).collect();
        assert_eq!(got, ["0-1", "2-3"]);
        // AMD family 15h: the list names only the cpu, the map is right.
        let e = [entry(0, "3", "0"), entry(1, "3", "1")];
        let got: Vec<String> = resolve_caches(&e)
            .iter()
            .map(|c| c.cpus.to_string())
            .collect();
        assert_eq!(got, ["0-1"]);
        // A wrong map overlapping the neighbours' instance: cpu 2's list is used.
        let e = [
            entry(0, "5", "0,2"),
            entry(2, "3", "0,2"),
            entry(1, "a", "1,3"),
            entry(3, "a", "1,3"),
        ];
        let got: Vec<String> = resolve_caches(&e)
            .iter()
            .map(|c| c.cpus.to_string())
            .collect();
        assert_eq!(got, ["0,2", "1,3"]);
        // Neither fits (and the set lacks the cpu itself): dropped.
        let e = [entry(0, "2", "1"), entry(1, "2", "1")];
        let got: Vec<String> = resolve_caches(&e)
            .iter()
            .map(|c| c.cpus.to_string())
            .collect();
        assert_eq!(got, ["1"]);
        // Only a list, or nothing: the list, or the cpu alone.
        let e = [entry(5, "", "5"), entry(6, "", "")];
        let got: Vec<String> = resolve_caches(&e)
            .iter()
            .map(|c| c.cpus.to_string())
            .collect();
        assert_eq!(got, ["5", "6"]);
    }

    #[test]
    fn ints() {
        assert_eq!(parse_int("-1\n").unwrap(), -1);
        assert_eq!(parse_int(" 7 ").unwrap(), 7);
        assert!(parse_int("x").unwrap_err().contains("`x`"));
    }

    #[test]
    fn status_fields() {
        let s = "Name:\tcat\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n";
        assert_eq!(status_field(s, "Cpus_allowed_list"), Some("0-1"));
        assert_eq!(status_field(s, "Mems_allowed_list"), Some("0"));
        assert_eq!(status_field(s, "Nope"), None);
    }

    #[test]
    fn proc_cgroup_v1_and_v2() {
        let v1 = "9:name=systemd:/\n4:memory:/process_api/36c1\n3:cpuset:/jobs/42\n2:cpu,cpuacct:/\n0::/\n";
        let cg = parse_proc_cgroup(v1);
        assert_eq!(cg.v1_cpuset.as_deref(), Some("/jobs/42"));
        assert_eq!(cg.v2.as_deref(), Some("/"));
        let v2 = "0::/user.slice/user-1000.slice/session-2.scope\n";
        let cg = parse_proc_cgroup(v2);
        assert_eq!(cg.v1_cpuset, None);
        assert_eq!(
            cg.v2.as_deref(),
            Some("/user.slice/user-1000.slice/session-2.scope")
        );
        // cpuset combined with other controllers in one v1 hierarchy.
        let cg = parse_proc_cgroup("5:cpu,cpuset:/a\n");
        assert_eq!(cg.v1_cpuset.as_deref(), Some("/a"));
    }

    const MOUNTINFO: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
38 33 0:33 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpuset
39 33 0:34 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 30 0:40 / /mnt/with\\040space rw - ext4 /dev/sda1 rw
";

    #[test]
    fn mountinfo() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 6);
        assert_eq!(m[2].fs_type, "cgroup2");
        assert_eq!(m[2].mount_point, "/sys/fs/cgroup/unified");
        assert_eq!(m[3].super_options, "rw,cpuset");
        assert_eq!(m[4].root, "/docker/abc");
        assert_eq!(m[5].mount_point, "/mnt/with space");
    }

    #[test]
    fn cpuset_dirs_v1_v2_and_namespaced() {
        let mounts = parse_mountinfo(MOUNTINFO);
        let cg = parse_proc_cgroup("3:cpuset:/jobs/42\n0::/user.slice\n");
        assert_eq!(
            cpuset_dirs(&cg, &mounts),
            vec![
                (PathBuf::from("/sys/fs/cgroup/unified/user.slice"), 2),
                (PathBuf::from("/sys/fs/cgroup/cpuset/jobs/42"), 1),
            ]
        );
        // A pure v2 system with a namespaced mount: the process's cgroup is the mount root.
        let mounts = parse_mountinfo(
            "30 20 0:26 /../../init.scope /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        let cg = parse_proc_cgroup("0::/\n");
        assert_eq!(
            cpuset_dirs(&cg, &mounts),
            vec![(PathBuf::from("/sys/fs/cgroup"), 2)]
        );
        // No cgroup mounts at all: nothing to read.
        assert!(cpuset_dirs(&cg, &[]).is_empty());
    }
}
