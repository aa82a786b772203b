//! Synthetic topologies from a short spec, for planning and tests on machines you do not have.
//!
//! Grammar: comma-separated `key=value` pairs, every key optional, each at most once:
//!
//! | key | value | default | meaning |
//! |---|---|---|---|
//! | `nodes` | N (1-1024) | 1 | NUMA nodes, ids `0..N` |
//! | `cores` | C (1-4096) | 4 | physical cores per node (nodes listed in `cpuless` get none) |
//! | `smt` | T (1-8) | 1 | hardware threads per core |
//! | `packages` | P | one per node with cpus | sockets; must divide the total core count evenly |
//! | `llc` | `node`, `package`, `core` or a number N | `node` | what shares the L3: a node, a package, nothing (`core`: no L3, the private L2 is the last level) or every N cores of a node |
//! | `l2` | `core` or a number N | `core` | cores sharing one L2 |
//! | `mem` | size per node (`64G`, `512M`, `1T`, bytes) | `16G` | memory of each node (0 for `memless` nodes) |
//! | `dist` | `LOCAL:REMOTE` or a full matrix `a:b/c:d` (rows split by `/`, values by `:`) | `10:21` | SLIT distances |
//! | `cpuless` | node list (`2-3`) | none | nodes with memory but no cpus (HBM, CXL expanders) |
//! | `memless` | node list | none | nodes with cpus but no memory |
//! | `siblings` | `apart` or `adjacent` | `apart` | SMT numbering: `apart` = Intel style (thread t of core c is cpu `c + t*cores`), `adjacent` = siblings get consecutive ids |
//!
//! Caches: L1d and L1i 32 KiB per core, L2 1 MiB per `l2` group, L3 1.5 MiB per sharing core.
//! Layouts no machine has are refused: packages hold whole nodes or split a node evenly, no
//! cache spans packages, `llc=N` divides the cores of a node (or of its package), `l2=N` those of
//! one L3.
//! Example: `nodes=4,cores=8,smt=2,llc=node,dist=10:21`.

use crate::error::TopoError;
use crate::idset::{CpuSet, NodeSet};
use crate::model::{Cache, CacheKind, Cpu, Device, Node, Topology};
use crate::sysfs::parse_size;

/// The keys a spec may use.
pub const KEYS: &[&str] = &[
    "nodes", "cores", "smt", "packages", "llc", "l2", "mem", "dist", "cpuless", "memless",
    "siblings",
];

/// What shares one cache instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Share {
    /// Every N consecutive cores of a node (1 = private).
    Cores(u32),
    /// All cores of a node.
    Node,
    /// All cores of a package (restricted to what the package holds).
    Package,
}

/// One cache level of a regular machine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheSpec {
    pub level: u8,
    pub kind: CacheKind,
    pub size: u64,
    pub share: Share,
}

/// A regular machine: every node with cpus has the same cores; used by presets and specs.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub nodes: u32,
    pub cores_per_node: u32,
    pub smt: u32,
    /// Cores per package (packages hold consecutive cores, in node order).
    pub cores_per_package: u32,
    /// Intel numbering (`c + t*cores`) when true, adjacent siblings when false.
    pub siblings_apart: bool,
    /// Optional explicit numbering: `cpu_ids[thread * total_cores + core]`.
    pub cpu_ids: Option<Vec<u32>>,
    pub caches: Vec<CacheSpec>,
    pub mem_per_node: u64,
    pub distances: Vec<Vec<u32>>,
    pub cpuless: NodeSet,
    pub memless: NodeSet,
    pub devices: Vec<Device>,
}

/// `local` on the diagonal, `remote` elsewhere.
pub(crate) fn uniform_distances(n: u32, local: u32, remote: u32) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| if i == j { local } else { remote })
                .collect()
        })
        .collect()
}

impl Shape {
    /// A plain machine: `nodes` nodes of `cores` cores, one package per node, default caches.
    pub(crate) fn new(nodes: u32, cores: u32, smt: u32) -> Self {
        Shape {
            nodes,
            cores_per_node: cores,
            smt,
            cores_per_package: cores,
            siblings_apart: true,
            cpu_ids: None,
            caches: vec![
                CacheSpec {
                    level: 1,
                    kind: CacheKind::Data,
                    size: 32 << 10,
                    share: Share::Cores(1),
                },
                CacheSpec {
                    level: 1,
                    kind: CacheKind::Instruction,
                    size: 32 << 10,
                    share: Share::Cores(1),
                },
                CacheSpec {
                    level: 2,
                    kind: CacheKind::Unified,
                    size: 1 << 20,
                    share: Share::Cores(1),
                },
                CacheSpec {
                    level: 3,
                    kind: CacheKind::Unified,
                    size: (3 << 19) * cores as u64,
                    share: Share::Node,
                },
            ],
            mem_per_node: 16 << 30,
            distances: uniform_distances(nodes, 10, 21),
            cpuless: NodeSet::new(),
            memless: NodeSet::new(),
            devices: vec![],
        }
    }

    /// Builds the topology (source left empty; [`crate::load`] fills it in).
    pub(crate) fn build(&self) -> Topology {
        let cpu_nodes: Vec<u32> = (0..self.nodes)
            .filter(|n| !self.cpuless.contains(*n))
            .collect();
        let total_cores = cpu_nodes.len() as u32 * self.cores_per_node;
        let cpu_id = |core: u32, t: u32| -> u32 {
            if let Some(ids) = &self.cpu_ids {
                ids[(t * total_cores + core) as usize]
            } else if self.siblings_apart {
                core + t * total_cores
            } else {
                core * self.smt + t
            }
        };
        let mut cpus = Vec::new();
        let mut nodes: Vec<Node> = (0..self.nodes)
            .map(|id| Node {
                id,
                cpus: CpuSet::new(),
                memory_bytes: Some(if self.memless.contains(id) {
                    0
                } else {
                    self.mem_per_node
                }),
                ..Default::default()
            })
            .collect();
        // (node, package, cpus of the core) per global core index.
        let mut cores: Vec<(u32, u32, CpuSet)> = Vec::new();
        for (k, &node) in cpu_nodes.iter().enumerate() {
            for c in 0..self.cores_per_node {
                let g = k as u32 * self.cores_per_node + c;
                let package = g / self.cores_per_package.max(1);
                let mut set = CpuSet::new();
                for t in 0..self.smt {
                    let id = cpu_id(g, t);
                    set.insert(id);
                    cpus.push(Cpu {
                        id,
                        core: g,
                        package,
                        node: Some(node),
                        online: true,
                        allowed: true,
                    });
                    nodes[node as usize].cpus.insert(id);
                }
                cores.push((node, package, set));
            }
        }
        cpus.sort_by_key(|c| c.id);
        let mut caches = Vec::new();
        for spec in &self.caches {
            let mut groups: Vec<CpuSet> = Vec::new();
            match spec.share {
                Share::Cores(n) => {
                    for (k, _) in cpu_nodes.iter().enumerate() {
                        let base = k * self.cores_per_node as usize;
                        let node_cores = &cores[base..base + self.cores_per_node as usize];
                        // Collected, not folded with `union` (a new set per core: quadratic,
                        // seconds for `cores=4096,llc=4096`, found by the fuzz target
                        // `synthetic`).
                        for chunk in node_cores.chunks(n.max(1) as usize) {
                            groups.push(chunk.iter().flat_map(|c| c.2.iter()).collect());
                        }
                    }
                }
                Share::Node => {
                    for &node in &cpu_nodes {
                        groups.push(nodes[node as usize].cpus.clone());
                    }
                }
                Share::Package => {
                    // Packages in ascending id (= first appearance: packages hold consecutive
                    // cores); cpus inserted one by one, for the reason above.
                    let mut pkgs: std::collections::BTreeMap<u32, CpuSet> = Default::default();
                    for (_, p, set) in &cores {
                        let s = pkgs.entry(*p).or_default();
                        for id in set.iter() {
                            s.insert(id);
                        }
                    }
                    groups.extend(pkgs.into_values());
                }
            }
            for cpus in groups {
                caches.push(Cache {
                    level: spec.level,
                    kind: spec.kind,
                    size_bytes: spec.size,
                    cpus,
                });
            }
        }
        caches.sort_by_key(|c| (c.level, c.kind as u8, c.cpus.first()));
        Topology {
            source: String::new(),
            nodes,
            cpus,
            caches,
            devices: self.devices.clone(),
            distances: self.distances.clone(),
            notes: vec![],
        }
    }
}

/// Parses a spec (see the module docs) into a topology.
pub fn build(spec: &str) -> Result<Topology, TopoError> {
    parse(spec).map(|s| s.build())
}

pub(crate) fn parse(spec: &str) -> Result<Shape, TopoError> {
    let err = |msg: String| TopoError::Synthetic {
        spec: spec.to_string(),
        msg,
    };
    let mut seen: Vec<&str> = Vec::new();
    let mut nodes = 1u32;
    let mut cores = 4u32;
    let mut smt = 1u32;
    let mut packages: Option<u32> = None;
    let mut llc = "node".to_string();
    let mut l2 = "core".to_string();
    let mut mem: u64 = 16 << 30;
    let mut dist: Option<String> = None;
    let mut cpuless = NodeSet::new();
    let mut memless = NodeSet::new();
    let mut apart = true;
    let num = |key: &str, v: &str, lo: u32, hi: u32| -> Result<u32, TopoError> {
        let n: u32 = v
            .trim()
            .parse()
            .map_err(|_| err(format!("`{key}={v}`: expected a whole number {lo}-{hi}")))?;
        if !(lo..=hi).contains(&n) {
            return Err(err(format!("`{key}={v}`: must be {lo}-{hi}")));
        }
        Ok(n)
    };
    for item in spec.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some((key, value)) = item.split_once('=') else {
            return Err(err(format!(
                "`{item}` is not `key=value`; valid keys: {}",
                KEYS.join(", ")
            )));
        };
        let key = key.trim();
        let value = value.trim();
        if !KEYS.contains(&key) {
            return Err(err(format!(
                "unknown key `{key}`; valid keys: {}",
                KEYS.join(", ")
            )));
        }
        if seen.contains(&key) {
            return Err(err(format!("key `{key}` given twice")));
        }
        seen.push(key);
        match key {
            "nodes" => nodes = num(key, value, 1, 1024)?,
            "cores" => cores = num(key, value, 1, 4096)?,
            "smt" => smt = num(key, value, 1, 8)?,
            "packages" => packages = Some(num(key, value, 1, 4096)?),
            "llc" | "l2" => {
                let ok = matches!(value, "node" | "package" | "core") && key == "llc"
                    || value == "core"
                    || value.parse::<u32>().is_ok_and(|n| n >= 1);
                if !ok {
                    let choices = if key == "llc" {
                        "`node`, `package`, `core` or a number of cores"
                    } else {
                        "`core` or a number of cores"
                    };
                    return Err(err(format!("`{key}={value}`: expected {choices}")));
                }
                if key == "llc" {
                    llc = value.to_string();
                } else {
                    l2 = value.to_string();
                }
            }
            "mem" => mem = parse_size(value).map_err(|m| err(format!("`mem`: {m}")))?,
            "dist" => dist = Some(value.to_string()),
            "cpuless" | "memless" => {
                let set = NodeSet::parse(value).map_err(|e| err(format!("`{key}`: {e}")))?;
                if key == "cpuless" {
                    cpuless = set;
                } else {
                    memless = set;
                }
            }
            "siblings" => {
                apart = match value {
                    "apart" => true,
                    "adjacent" => false,
                    _ => {
                        return Err(err(format!(
                            "`siblings={value}`: expected `apart` or `adjacent`"
                        )))
                    }
                }
            }
            _ => unreachable!("key checked against KEYS"),
        }
    }
    let all: NodeSet = (0..nodes).collect();
    for (key, set) in [("cpuless", &cpuless), ("memless", &memless)] {
        if !set.is_subset(&all) {
            return Err(err(format!(
                "`{key}={set}` names nodes that do not exist (nodes: {all})"
            )));
        }
    }
    let both = cpuless.intersection(&memless);
    if !both.is_empty() {
        return Err(err(format!(
            "node(s) {both} would have neither cpus nor memory (both `cpuless` and `memless`)"
        )));
    }
    let cpu_nodes = nodes - cpuless.len() as u32;
    if cpu_nodes == 0 {
        return Err(err(
            "every node is `cpuless`; at least one needs cpus".into()
        ));
    }
    let total_cores = cpu_nodes * cores;
    if total_cores as u64 * smt as u64 > crate::idset::MAX_ID as u64 + 1 {
        return Err(err(format!(
            "{} cpus is more than loci supports ({})",
            total_cores as u64 * smt as u64,
            crate::idset::MAX_ID as u64 + 1
        )));
    }
    let packages = packages.unwrap_or(cpu_nodes);
    if total_cores.checked_rem(packages) != Some(0) {
        return Err(err(format!(
            "`packages={packages}` does not divide the {total_cores} cores evenly"
        )));
    }
    let cores_per_package = total_cores / packages;
    // A package holds whole nodes, or a node whole packages: none straddles a node boundary.
    if !cores_per_package.is_multiple_of(cores) && !cores.is_multiple_of(cores_per_package) {
        let valid: Vec<u32> = divisors(cpu_nodes)
            .into_iter()
            .chain(divisors(cores).into_iter().skip(1).map(|k| cpu_nodes * k))
            .collect();
        return Err(err(format!(
            "`packages={packages}`: {cores_per_package} cores per package would split packages across nodes of {cores} cores; valid: {}",
            list(&valid)
        )));
    }
    // The most cores one cache may span inside a node: the node, or its package when the node
    // holds several (no cache spans packages).
    let (unit, unit_name) = if cores_per_package < cores {
        (cores_per_package, "package")
    } else {
        (cores, "node")
    };
    let llc_choices = |unit_has_node: bool| {
        format!(
            "{}`package`, `core` or a number of cores dividing the {unit} cores of a {unit_name}: {}",
            if unit_has_node { "`node`, " } else { "" },
            list(&divisors(unit))
        )
    };
    // Cores sharing one L3 inside a node (the group every L2 must fit in), and how to say it.
    let (l3_cores, l3_what) = match llc.as_str() {
        "node" if cores_per_package < cores => {
            return Err(err(format!(
                "`llc=node`{}: a node of {cores} cores holds {} packages and no L3 spans packages; valid: {}",
                if seen.contains(&"llc") { "" } else { " (the default)" },
                cores / cores_per_package,
                llc_choices(false)
            )))
        }
        "node" | "package" | "core" => (unit, format!("the {unit} cores of a {unit_name}")),
        n => {
            let n: u32 = n.parse().expect("checked above");
            if n > unit || !unit.is_multiple_of(n) {
                let why = if n > unit {
                    format!("more cores than a {unit_name} has ({unit})")
                } else {
                    format!("does not split the {unit} cores of a {unit_name} into equal groups")
                };
                return Err(err(format!(
                    "`llc={n}`: {why}; valid: {}",
                    llc_choices(unit == cores)
                )));
            }
            (n, format!("the {n} cores sharing an L3 (`llc={n}`)"))
        }
    };
    let l2_cores = if l2 == "core" {
        1
    } else {
        l2.parse::<u32>().expect("checked above")
    };
    if !l3_cores.is_multiple_of(l2_cores) {
        let why = if l2_cores > l3_cores {
            format!("more cores than {l3_what}")
        } else {
            format!("does not split {l3_what} into equal groups")
        };
        return Err(err(format!(
            "`l2={l2_cores}`: {why}; valid: `core` or {}",
            list(&divisors(l3_cores))
        )));
    }
    let mut shape = Shape::new(nodes, cores, smt);
    shape.cores_per_package = cores_per_package;
    shape.siblings_apart = apart;
    shape.mem_per_node = mem;
    shape.cpuless = cpuless;
    shape.memless = memless;
    shape.caches[2].share = Share::Cores(l2_cores);
    match llc.as_str() {
        "core" => {
            shape.caches.pop();
        }
        "node" => {}
        "package" => {
            shape.caches[3].share = Share::Package;
            shape.caches[3].size = (3 << 19) * shape.cores_per_package as u64;
        }
        _ => {
            shape.caches[3].share = Share::Cores(l3_cores);
            shape.caches[3].size = (3 << 19) * l3_cores as u64;
        }
    }
    shape.distances = match dist {
        None => uniform_distances(nodes, 10, 21),
        Some(d) => parse_dist(&d, nodes).map_err(|m| err(format!("`dist={d}`: {m}")))?,
    };
    Ok(shape)
}

/// The divisors of `n` (at most 4096 here), ascending.
fn divisors(n: u32) -> Vec<u32> {
    let mut low = Vec::new();
    let mut high = Vec::new();
    let mut d = 1;
    while d * d <= n {
        if n.is_multiple_of(d) {
            low.push(d);
            if d * d != n {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

fn list(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

/// `LOCAL:REMOTE`, `LOCAL` (one node) or a full matrix `a:b/c:d`.
fn parse_dist(d: &str, nodes: u32) -> Result<Vec<Vec<u32>>, String> {
    let val = |t: &str| -> Result<u32, String> {
        t.trim()
            .parse::<u32>()
            .map_err(|_| format!("`{t}` is not a distance"))
    };
    let n = nodes as usize;
    let rows = if !d.contains('/') {
        let parts: Vec<&str> = d.split(':').collect();
        match parts.as_slice() {
            [l, r] => {
                let (l, r) = (val(l)?, val(r)?);
                if r < l && n > 1 {
                    return Err(format!("remote {r} is smaller than local {l}"));
                }
                uniform_distances(nodes, l, r)
            }
            [l] if n == 1 => vec![vec![val(l)?]],
            _ => {
                return Err(format!(
                    "expected `LOCAL:REMOTE` or a {n}x{n} matrix with rows split by `/` (e.g. `10:21/21:10`)"
                ))
            }
        }
    } else {
        let rows: Vec<Vec<u32>> = d
            .split('/')
            .map(|r| r.split(':').map(val).collect::<Result<Vec<_>, _>>())
            .collect::<Result<_, _>>()?;
        if rows.len() != n || rows.iter().any(|r| r.len() != n) {
            return Err(format!(
                "the matrix must be {n}x{n} (rows split by `/`, values by `:`); got {} row(s)",
                rows.len()
            ));
        }
        rows
    };
    // As the kernel's SLIT: 10 local, remote distances not below their row's local one, and
    // every value a byte (at most 255).
    for (i, r) in rows.iter().enumerate() {
        for (j, &v) in r.iter().enumerate() {
            let bad = if v > 255 {
                Some("above 255")
            } else if i == j && v < 10 {
                Some("a local distance below 10")
            } else if i != j && v < r[i] {
                Some("smaller than the row's local distance")
            } else {
                None
            };
            if let Some(why) = bad {
                return Err(format!("row {i}, column {j}: {v} is {why}"));
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(spec: &str) -> Topology {
        let t = build(spec).unwrap();
        t.validate().unwrap();
        t
    }

    fn msg(spec: &str) -> String {
        build(spec).unwrap_err().to_string()
    }

    #[test]
    fn example_spec() {
        let t = topo("nodes=4,cores=8,smt=2,llc=node,dist=10:21");
        assert_eq!(t.nodes.len(), 4);
        assert_eq!(t.cpus.len(), 64);
        // Intel numbering: node 0 holds cores 0-7 and their siblings 32-39.
        assert_eq!(t.nodes[0].cpus.to_string(), "0-7,32-39");
        assert_eq!(t.smt_siblings(3).to_string(), "3,35");
        assert_eq!(t.distance(0, 3), Some(21));
        assert_eq!(t.distance(2, 2), Some(10));
        let l3: Vec<String> = t.caches_at(3).map(|c| c.cpus.to_string()).collect();
        assert_eq!(
            l3,
            vec!["0-7,32-39", "8-15,40-47", "16-23,48-55", "24-31,56-63"]
        );
        assert_eq!(t.caches_at(2).count(), 32);
        assert_eq!(t.nodes[1].memory_bytes, Some(16 << 30));
    }

    #[test]
    fn defaults_and_adjacent_siblings() {
        let t = topo("");
        assert_eq!(t.nodes.len(), 1);
        assert_eq!(t.cpus.len(), 4);
        assert_eq!(t.distances, vec![vec![10]]);
        let t = topo("cores=2,smt=2,siblings=adjacent");
        assert_eq!(t.smt_siblings(0).to_string(), "0-1");
    }

    #[test]
    fn llc_and_l2_sharing() {
        let t = topo("nodes=1,cores=8,llc=4,l2=2");
        let l3: Vec<String> = t.caches_at(3).map(|c| c.cpus.to_string()).collect();
        assert_eq!(l3, vec!["0-3", "4-7"]);
        let l2: Vec<String> = t.caches_at(2).map(|c| c.cpus.to_string()).collect();
        assert_eq!(l2, vec!["0-1", "2-3", "4-5", "6-7"]);
        let t = topo("nodes=2,cores=2,llc=core");
        assert_eq!(t.llc_level(), Some(2));
        let t = topo("nodes=4,cores=2,packages=2,llc=package");
        let l3: Vec<String> = t.caches_at(3).map(|c| c.cpus.to_string()).collect();
        assert_eq!(l3, vec!["0-3", "4-7"]);
        assert_eq!(t.cpu(5).unwrap().package, 1);
    }

    #[test]
    fn cpuless_memless_and_matrix() {
        let t = topo("nodes=3,cores=2,cpuless=2,memless=1,mem=8G,dist=10:20:30/20:10:30/30:30:10");
        assert_eq!(t.nodes[2].cpus.to_string(), "");
        assert_eq!(t.nodes[2].memory_bytes, Some(8 << 30));
        assert_eq!(t.nodes[1].memory_bytes, Some(0));
        assert_eq!(t.nodes[1].cpus.to_string(), "2-3");
        assert_eq!(t.distance(0, 2), Some(30));
        assert_eq!(t.hops(0, 2), Some(2));
        assert_eq!(t.allowed_mems().to_string(), "0,2");
    }

    #[test]
    fn errors_name_the_bad_part() {
        for (spec, says) in [
            ("nodes=2,cpus=4", "unknown key `cpus`"),
            ("nodes=2,cpus=4", "cores"),
            ("nodes=x", "`nodes=x`"),
            ("nodes=0", "1-1024"),
            ("smt", "not `key=value`"),
            ("nodes=2,nodes=3", "twice"),
            ("llc=socket", "`node`, `package`"),
            ("mem=lots", "`mem`"),
            ("nodes=3,dist=10:20/20:10", "3x3"),
            ("nodes=2,dist=10:5", "smaller"),
            (
                "nodes=2,dist=10:21/5:10",
                "row 1, column 0: 5 is smaller than the row's local",
            ),
            (
                "nodes=2,dist=0:0/0:0",
                "row 0, column 0: 0 is a local distance below 10",
            ),
            ("nodes=2,dist=10:300", "300 is above 255"),
            ("nodes=2,cpuless=0-1", "at least one"),
            ("nodes=2,cpuless=5", "do not exist"),
            ("nodes=2,cpuless=1,memless=1", "neither"),
            ("nodes=3,cores=1,packages=2", "evenly"),
            ("siblings=odd", "`apart` or `adjacent`"),
        ] {
            let m = msg(spec);
            assert!(m.contains(says), "{spec}: {m}");
        }
    }

    #[test]
    fn impossible_cache_and_package_layouts_are_refused_with_the_choices() {
        for (spec, says) in [
            (
                "cores=8,llc=16",
                "`llc=16`: more cores than a node has (8); valid: `node`, `package`, `core` or a number of cores dividing the 8 cores of a node: 1, 2, 4, 8",
            ),
            (
                "cores=8,llc=3",
                "`llc=3`: does not split the 8 cores of a node into equal groups; valid: `node`,",
            ),
            (
                "cores=6,l2=4",
                "`l2=4`: does not split the 6 cores of a node into equal groups; valid: `core` or 1, 2, 3, 6",
            ),
            (
                "cores=8,llc=4,l2=8",
                "`l2=8`: more cores than the 4 cores sharing an L3 (`llc=4`); valid: `core` or 1, 2, 4",
            ),
            (
                "cores=8,llc=4,l2=3",
                "`l2=3`: does not split the 4 cores sharing an L3 (`llc=4`) into equal groups",
            ),
            ("cores=4,llc=core,l2=8", "`l2=8`: more cores than the 4 cores of a node"),
            (
                "nodes=1,cores=8,packages=2",
                "`llc=node` (the default): a node of 8 cores holds 2 packages and no L3 spans packages; valid: `package`, `core` or a number of cores dividing the 4 cores of a package: 1, 2, 4",
            ),
            (
                "nodes=1,cores=8,packages=2,llc=8",
                "`llc=8`: more cores than a package has (4); valid: `package`, `core`",
            ),
            (
                "nodes=1,cores=8,packages=2,llc=package,l2=8",
                "`l2=8`: more cores than the 4 cores of a package",
            ),
            (
                "nodes=2,cores=3,packages=3",
                "`packages=3`: 2 cores per package would split packages across nodes of 3 cores; valid: 1, 2, 6",
            ),
        ] {
            let m = msg(spec);
            assert!(m.contains(says), "{spec}: {m}");
        }
        // The same layouts made possible build.
        for spec in [
            "cores=8,llc=8,l2=4",
            "cores=6,llc=3,l2=3",
            "nodes=1,cores=8,packages=2,llc=package,l2=2",
            "nodes=1,cores=8,packages=2,llc=2",
            "nodes=2,cores=3,packages=6,llc=core",
            "nodes=4,cores=3,packages=2,llc=package,l2=3",
        ] {
            topo(spec);
        }
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(36), vec![1, 2, 3, 4, 6, 9, 12, 18, 36]);
        assert_eq!(divisors(4096).len(), 13);
    }

    #[test]
    fn caches_shared_by_thousands_of_cores_are_right() {
        // Sizes the fuzz target `synthetic` found slow (a cache's set folded core by core, a
        // node's cpus looked up one by one in validation): every group must still be exact.
        let t = topo("nodes=8,cores=4096,smt=2,llc=4096");
        assert_eq!(t.cpus.len(), 65536);
        let l3: Vec<&CpuSet> = t.caches_at(3).map(|c| &c.cpus).collect();
        let nodes: Vec<&CpuSet> = t.nodes.iter().map(|n| &n.cpus).collect();
        assert_eq!(l3, nodes);
        // Node 1: cores 4096-8191 and their siblings 32768 higher (Intel numbering).
        assert_eq!(l3[1].to_string(), "4096-8191,36864-40959");
        assert_eq!(t.caches_at(2).count(), 32768);

        let t = topo("nodes=16,cores=4096,llc=package,packages=1");
        let l3: Vec<&CpuSet> = t.caches_at(3).map(|c| &c.cpus).collect();
        assert_eq!(l3, vec![&t.cpu_ids()]);
        assert_eq!(t.cpu_ids().to_string(), "0-65535");
        assert!(t.cpus.iter().all(|c| c.package == 0));

        let t = topo("nodes=1024,cores=64,smt=1");
        for (k, (c, n)) in t.caches_at(3).zip(&t.nodes).enumerate() {
            assert_eq!(c.cpus, n.cpus);
            assert_eq!(n.cpus.to_string(), format!("{}-{}", k * 64, k * 64 + 63));
        }
        assert_eq!(t.caches_at(3).count(), 1024);
    }
}
