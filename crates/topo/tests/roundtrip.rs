//! Round trip: random valid machines, written out as a Linux sysfs tree and as an hwloc v2 XML
//! export (`lstopo --of xml`), read back through [`loci_topo::load`] to the same [`Topology`].
//!
//! The generator builds machines the way kernels and hwloc describe them: 1-8 nodes with sparse
//! kernel ids in any order, CPU-less and memoryless nodes (always one node with cpus and one with
//! memory), 1-4 packages (possibly sparse ids) holding one node, two nodes (sub-NUMA clustering)
//! or all sharing one node, cores with 1-4 threads (some single-threaded on hybrid parts), cpu ids
//! with holes, SMT siblings numbered apart (Intel) or adjacent, per-package `core_id`s with holes,
//! L1d/L1i per core, L2 per core or per core pair, L3 per package, per node or none, memory in
//! 4 KiB pages and a symmetric SLIT matrix (10 local, 11-254 remote, uniform or not).
//!
//! What is compared: nodes (id, cpus, memory, free memory, allowed, kind, initiators, merged),
//! cpus (id, package, node, online, allowed), the partition of cpus into cores (the readers
//! renumber cores machine-wide, so the numbers themselves are not compared, only which cpus
//! share one), caches as a sorted list (level, kind, size, cpus), distances, devices and the
//! readers' repair notes (a clean tree needs none). Normalised, because a source cannot carry it:
//! `source` (each loader names its own) and, for XML only, `free_bytes` (hwloc does not export
//! it). Not generated (other tests cover them): offline cpus (hwloc does not export them),
//! devices, HMAT initiators and memory kinds (every node is ordinary DRAM). The XML property
//! skips the few machines hwloc cannot export faithfully ([`Hwloc::valid_for_hwloc`]); the sysfs
//! property runs every machine.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use loci_topo::{Cache, CacheKind, Cpu, CpuSet, Node, NodeSet, Source, Topology};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------------------------
// The generated machine
// ---------------------------------------------------------------------------------------------

/// A machine: the topology loci should read back, plus what the files say that the model does
/// not keep.
#[derive(Clone)]
struct Machine {
    topo: Topology,
    /// The kernel's `core_id` of each cpu (unique only inside a package).
    core_id: BTreeMap<u32, u32>,
    /// sysfs: which files the kernel writes.
    kernel: Kernel,
    /// XML: a CPU-less node hangs off the Machine inside an empty Group of its own (as hwloc
    /// attaches one) rather than directly (as in exports made with groups filtered out).
    cpuless_group: bool,
    /// XML: hwloc gives a CPU-less node the cpus of the nodes nearest to it by distance (what
    /// hwloc 2.x on Linux does when those are unambiguous), so it sits beside them.
    cpuless_locality: bool,
    /// XML: the order of the node indexes in `<distances2>` (a permutation of node positions).
    index_order: Vec<usize>,
}

/// Compact, so that a failing case reads as a machine.
impl fmt::Debug for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.topo;
        writeln!(f, "Machine {{")?;
        for n in &t.nodes {
            writeln!(
                f,
                "  node {}: cpus [{}] memory {:?} free {:?}",
                n.id, n.cpus, n.memory_bytes, n.free_bytes
            )?;
        }
        let mut cores: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for c in &t.cpus {
            cores.entry(c.core).or_default().push(c.id);
        }
        for (core, cpus) in cores {
            let c = t.cpu(cpus[0]).unwrap();
            writeln!(
                f,
                "  core {core} (package {}, core_id {}): cpus {cpus:?}",
                c.package, self.core_id[&cpus[0]]
            )?;
        }
        for c in &t.caches {
            writeln!(
                f,
                "  L{} {:?} {} B: [{}]",
                c.level, c.kind, c.size_bytes, c.cpus
            )?;
        }
        writeln!(f, "  distances {:?}", t.distances)?;
        writeln!(
            f,
            "  kernel {:?} cpuless_group {} cpuless_locality {} index_order {:?}",
            self.kernel, self.cpuless_group, self.cpuless_locality, self.index_order
        )?;
        write!(f, "}}")
    }
}

/// The files a kernel writes for the same machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// Linux 5.x and later: `core_cpus_list` and `thread_siblings_list`, lists and masks.
    Current,
    /// Before 5.x: no `core_cpus*`; `thread_siblings_list` and the `thread_siblings` mask.
    Old,
    /// 2.6.1x: masks only (`thread_siblings`, `shared_cpu_map`, node `cpumap`), no lists.
    Ancient,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    NodePerPackage,
    /// Sub-NUMA clustering: two nodes per package.
    TwoNodesPerPackage,
    /// Every package in one node (node interleaving in the firmware, or one package).
    OneNode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum L3 {
    None,
    Package,
    Node,
}

#[derive(Debug, Clone)]
enum Dist {
    /// Every remote distance the same (no SLIT, or a symmetric machine).
    Uniform(u32),
    /// The upper triangle, row by row.
    Random(Vec<u32>),
}

/// The random choices a machine is built from.
#[derive(Debug, Clone)]
struct Params {
    packages: usize,
    layout: Layout,
    /// Cores of each (package, node) part.
    cores: Vec<u32>,
    smt: u32,
    hybrid: bool,
    single_thread: Vec<bool>,
    adjacent: bool,
    cpu_gaps: Vec<u32>,
    core_id_gaps: Vec<u32>,
    package_gaps: Vec<u32>,
    cpuless: usize,
    node_order: Option<Vec<usize>>,
    node_gaps: Vec<u32>,
    memless: Vec<bool>,
    mem_pages: Vec<u64>,
    free_permille: Vec<u64>,
    dist: Dist,
    l1d: u64,
    l1i: u64,
    l2: u64,
    l2_pairs: bool,
    l3: L3,
    l3_size: u64,
    kernel: Kernel,
    cpuless_group: bool,
    cpuless_locality: bool,
    index_order: Vec<usize>,
}

const MAX_NODES: usize = 8;
const MAX_CORES_PER_PART: u32 = 3;
const MAX_CORES: usize = MAX_NODES * MAX_CORES_PER_PART as usize;
const MAX_CPUS: usize = MAX_CORES * 4;

fn gap() -> impl Strategy<Value = u32> {
    // Mostly contiguous; sometimes a small hole; now and then one wide enough to leave a whole
    // 32-bit word of a mask empty.
    prop_oneof![12 => Just(0u32), 3 => 1u32..=3, 1 => 30u32..=40]
}

fn params() -> impl Strategy<Value = Params> {
    let shape = (
        1usize..=4,
        prop_oneof![
            Just(Layout::NodePerPackage),
            Just(Layout::TwoNodesPerPackage),
            Just(Layout::OneNode)
        ],
        proptest::collection::vec(1u32..=MAX_CORES_PER_PART, MAX_NODES),
        prop_oneof![3 => 1u32..=2, 1 => 3u32..=4],
        any::<bool>(),
        proptest::collection::vec(any::<bool>(), MAX_CORES),
        any::<bool>(),
    );
    let ids = (
        proptest::collection::vec(gap(), MAX_CPUS),
        proptest::collection::vec(prop_oneof![4 => Just(0u32), 1 => 1u32..=3], MAX_CORES),
        proptest::collection::vec(prop_oneof![4 => Just(0u32), 1 => 1u32..=2], 4),
        0usize..=3,
        proptest::option::of(Just((0..MAX_NODES).collect::<Vec<_>>()).prop_shuffle()),
        proptest::collection::vec(prop_oneof![2 => Just(0u32), 1 => 1u32..=2], MAX_NODES),
    );
    let memory = (
        proptest::collection::vec(proptest::bool::weighted(0.25), MAX_NODES),
        proptest::collection::vec(1u64..=1 << 26, MAX_NODES),
        proptest::collection::vec(0u64..=1000, MAX_NODES),
        prop_oneof![
            (11u32..=40).prop_map(Dist::Uniform),
            proptest::collection::vec(11u32..=254, MAX_NODES * (MAX_NODES - 1) / 2)
                .prop_map(Dist::Random),
        ],
    );
    let caches = (
        prop_oneof![Just(32u64 << 10), Just(48 << 10)],
        prop_oneof![Just(32u64 << 10), Just(64 << 10)],
        prop_oneof![
            Just(256u64 << 10),
            Just(512 << 10),
            Just(1 << 20),
            Just(2 << 20)
        ],
        any::<bool>(),
        prop_oneof![Just(L3::None), Just(L3::Package), Just(L3::Node)],
        prop_oneof![
            Just(2u64 << 20),
            Just(6 << 20),
            Just(16 << 20),
            Just(30 << 20),
            Just(36 << 20)
        ],
    );
    let formats = (
        prop_oneof![
            2 => Just(Kernel::Current),
            1 => Just(Kernel::Old),
            1 => Just(Kernel::Ancient)
        ],
        any::<bool>(),
        any::<bool>(),
        Just((0..MAX_NODES).collect::<Vec<_>>()).prop_shuffle(),
    );
    (shape, ids, memory, caches, formats).prop_map(
        |(
            (packages, layout, cores, smt, hybrid, single_thread, adjacent),
            (cpu_gaps, core_id_gaps, package_gaps, cpuless, node_order, node_gaps),
            (memless, mem_pages, free_permille, dist),
            (l1d, l1i, l2, l2_pairs, l3, l3_size),
            (kernel, cpuless_group, cpuless_locality, index_order),
        )| Params {
            packages,
            layout,
            cores,
            smt,
            hybrid,
            single_thread,
            adjacent,
            cpu_gaps,
            core_id_gaps,
            package_gaps,
            cpuless,
            node_order,
            node_gaps,
            memless,
            mem_pages,
            free_permille,
            dist,
            l1d,
            l1i,
            l2,
            l2_pairs,
            l3,
            l3_size,
            kernel,
            cpuless_group,
            cpuless_locality,
            index_order,
        },
    )
}

/// Builds the machine `p` describes.
fn build(p: &Params) -> Machine {
    // Parts: (package index, logical cpu node) in package order.
    let parts: Vec<(usize, usize)> = match p.layout {
        Layout::NodePerPackage => (0..p.packages).map(|k| (k, k)).collect(),
        Layout::TwoNodesPerPackage => (0..p.packages)
            .flat_map(|k| [(k, 2 * k), (k, 2 * k + 1)])
            .collect(),
        Layout::OneNode => (0..p.packages).map(|k| (k, 0)).collect(),
    };
    let cpu_nodes = parts.iter().map(|x| x.1).max().unwrap() + 1;
    let n_nodes = cpu_nodes + p.cpuless.min(MAX_NODES - cpu_nodes);

    let mut package_id = Vec::new();
    let mut next = 0;
    for k in 0..p.packages {
        package_id.push(next + p.package_gaps[k]);
        next = package_id[k] + 1;
    }

    // Cores: (part, threads, kernel core_id).
    let mut cores: Vec<(usize, u32, u32)> = Vec::new();
    let mut next_core_id = vec![0u32; p.packages];
    for (pi, &(pkg, _)) in parts.iter().enumerate() {
        for _ in 0..p.cores[pi] {
            let k = cores.len();
            let threads = if p.hybrid && p.single_thread[k] {
                1
            } else {
                p.smt
            };
            let id = next_core_id[pkg] + p.core_id_gaps[k];
            next_core_id[pkg] = id + 1;
            cores.push((pi, threads, id));
        }
    }

    // Cpu ids: siblings adjacent (core by core) or apart (thread by thread), ids with holes.
    let mut slots: Vec<usize> = Vec::new();
    if p.adjacent {
        for (k, c) in cores.iter().enumerate() {
            for _ in 0..c.1 {
                slots.push(k);
            }
        }
    } else {
        for t in 0..p.smt {
            for (k, c) in cores.iter().enumerate() {
                if t < c.1 {
                    slots.push(k);
                }
            }
        }
    }
    let mut core_cpus: Vec<CpuSet> = vec![CpuSet::new(); cores.len()];
    let mut next = 0;
    for (i, &k) in slots.iter().enumerate() {
        let id = next + p.cpu_gaps[i];
        core_cpus[k].insert(id);
        next = id + 1;
    }

    // Node ids: logical nodes 0..cpu_nodes have cpus, the rest not; kernel ids follow either
    // that order or a shuffled one, with holes.
    let order: Vec<usize> = match &p.node_order {
        Some(perm) => perm.iter().copied().filter(|&v| v < n_nodes).collect(),
        None => (0..n_nodes).collect(),
    };
    let mut node_id = vec![0u32; n_nodes];
    let mut next = 0;
    for (i, &v) in order.iter().enumerate() {
        node_id[v] = next + p.node_gaps[i];
        next = node_id[v] + 1;
    }

    let mut mem: Vec<u64> = (0..n_nodes)
        .map(|v| {
            if v < cpu_nodes && p.memless[v] {
                0
            } else {
                p.mem_pages[v] * 4096
            }
        })
        .collect();
    if mem.iter().all(|&m| m == 0) {
        mem[0] = p.mem_pages[0] * 4096;
    }
    let free: Vec<u64> = (0..n_nodes)
        .map(|v| mem[v] / 4096 * p.free_permille[v] / 1000 * 4096)
        .collect();

    let part_node = |pi: usize| parts[pi].1;
    let mut node_cpus = vec![CpuSet::new(); n_nodes];
    for (k, c) in cores.iter().enumerate() {
        let v = part_node(c.0);
        node_cpus[v] = node_cpus[v].union(&core_cpus[k]);
    }

    // Position of each logical node once sorted by id.
    let mut by_id: Vec<usize> = (0..n_nodes).collect();
    by_id.sort_by_key(|&v| node_id[v]);
    let tri = |a: usize, b: usize| -> u32 {
        let (a, b) = (a.min(b), a.max(b));
        match &p.dist {
            Dist::Uniform(r) => *r,
            // Row a of the upper triangle starts after rows 0..a.
            Dist::Random(v) => v[a * (2 * MAX_NODES - a - 1) / 2 + (b - a - 1)],
        }
    };
    let distances: Vec<Vec<u32>> = by_id
        .iter()
        .map(|&a| {
            by_id
                .iter()
                .map(|&b| if a == b { 10 } else { tri(a, b) })
                .collect()
        })
        .collect();
    let nodes: Vec<Node> = by_id
        .iter()
        .map(|&v| {
            let mut n = Node::new(node_id[v], node_cpus[v].clone(), Some(mem[v]));
            n.free_bytes = Some(free[v]);
            n
        })
        .collect();

    let mut cpus: Vec<Cpu> = Vec::new();
    let mut core_id = BTreeMap::new();
    for (k, c) in cores.iter().enumerate() {
        let (pkg, v) = parts[c.0];
        for id in core_cpus[k].iter() {
            cpus.push(Cpu {
                id,
                core: k as u32,
                package: package_id[pkg],
                node: Some(node_id[v]),
                online: true,
                allowed: true,
            });
            core_id.insert(id, c.2);
        }
    }
    cpus.sort_by_key(|c| c.id);

    // Caches.
    let mut caches = Vec::new();
    let cache = |level: u8, kind: CacheKind, size_bytes: u64, cpus: CpuSet| Cache {
        level,
        kind,
        size_bytes,
        cpus,
    };
    for set in &core_cpus {
        caches.push(cache(1, CacheKind::Data, p.l1d, set.clone()));
        caches.push(cache(1, CacheKind::Instruction, p.l1i, set.clone()));
    }
    for pi in 0..parts.len() {
        let ks: Vec<usize> = (0..cores.len()).filter(|&k| cores[k].0 == pi).collect();
        let step = if p.l2_pairs { 2 } else { 1 };
        for chunk in ks.chunks(step) {
            let set = chunk
                .iter()
                .fold(CpuSet::new(), |s, &k| s.union(&core_cpus[k]));
            caches.push(cache(2, CacheKind::Unified, p.l2, set));
        }
    }
    let l3 = match (p.l3, p.layout) {
        // A node spanning packages: an L3 never does.
        (L3::Node, Layout::OneNode) => L3::Package,
        (l, _) => l,
    };
    let mut groups: BTreeMap<usize, CpuSet> = BTreeMap::new();
    for (k, c) in cores.iter().enumerate() {
        let key = match l3 {
            L3::None => continue,
            L3::Package => parts[c.0].0,
            L3::Node => part_node(c.0),
        };
        let g = groups.entry(key).or_default();
        *g = g.union(&core_cpus[k]);
    }
    for set in groups.into_values() {
        caches.push(cache(3, CacheKind::Unified, p.l3_size, set));
    }

    let topo = Topology {
        source: "generated".into(),
        nodes,
        cpus,
        caches,
        devices: vec![],
        distances,
        notes: vec![],
    };
    topo.validate()
        .expect("the generator builds valid topologies");
    Machine {
        topo,
        core_id,
        kernel: p.kernel,
        cpuless_group: p.cpuless_group,
        cpuless_locality: p.cpuless_locality,
        index_order: p
            .index_order
            .iter()
            .copied()
            .filter(|&i| i < n_nodes)
            .collect(),
    }
}

fn machine() -> impl Strategy<Value = Machine> {
    params().prop_map(|p| build(&p))
}

/// The machines hwloc exports faithfully (about 96% of them, see [`Hwloc::valid_for_hwloc`]).
fn hwloc_machine() -> impl Strategy<Value = Machine> {
    machine().prop_filter(
        "hwloc would report an error, or its XML could not tell which node owns the cpus",
        |m| Hwloc::new(m).valid_for_hwloc(&m.topo),
    )
}

// ---------------------------------------------------------------------------------------------
// Writing a sysfs tree
// ---------------------------------------------------------------------------------------------

/// A directory written afresh.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Tree {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("roundtrip")
            .join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Tree(d)
    }
    fn file(&self, rel: &str, text: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    fn link(&self, rel: &str, target: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, p).unwrap();
    }
}

/// A cpu mask as the kernel prints it (`%*pb`): `nbits` bits in 32-bit hex words, most
/// significant first, separated by commas; the first word has only the digits its bits need.
fn kernel_mask(set: &CpuSet, nbits: u32) -> String {
    let words = nbits.div_ceil(32);
    let mut out = String::new();
    for w in (0..words).rev() {
        let mut v = 0u32;
        for bit in 0..32 {
            if set.contains(w * 32 + bit) {
                v |= 1 << bit;
            }
        }
        let width = match nbits % 32 {
            r if r > 0 && w == words - 1 => r.div_ceil(4) as usize,
            _ => 8,
        };
        if !out.is_empty() {
            out.push(',');
        }
        let _ = write!(out, "{v:0width$x}");
    }
    out
}

fn kernel_kind(k: CacheKind) -> &'static str {
    match k {
        CacheKind::Data => "Data",
        CacheKind::Instruction => "Instruction",
        CacheKind::Unified => "Unified",
    }
}

/// Lays `m` out under `dir/sys` as Linux does.
fn write_sysfs(m: &Machine, t: &Tree) {
    let topo = &m.topo;
    let present = topo.cpu_ids();
    let nbits = present.last().unwrap() + 1;
    let possible: CpuSet = (0..nbits).collect();
    let list = |s: &CpuSet| format!("{s}\n");
    let mask = |s: &CpuSet| format!("{}\n", kernel_mask(s, nbits));
    let cpu = "sys/devices/system/cpu";
    t.file(&format!("{cpu}/online"), &list(&present));
    t.file(&format!("{cpu}/present"), &list(&present));
    t.file(&format!("{cpu}/possible"), &list(&possible));
    t.file(
        &format!("{cpu}/offline"),
        &list(&possible.difference(&present)),
    );
    t.file(&format!("{cpu}/kernel_max"), "8191\n");

    // Caches in the kernel's index order: by level, data before instruction before unified.
    let mut caches: Vec<&Cache> = topo.caches.iter().collect();
    caches.sort_by_key(|c| (c.level, c.kind as u8, c.cpus.first()));

    for c in &topo.cpus {
        let d = format!("{cpu}/cpu{}", c.id);
        let siblings = topo.smt_siblings(c.id);
        let tp = format!("{d}/topology");
        t.file(
            &format!("{tp}/physical_package_id"),
            &format!("{}\n", c.package),
        );
        t.file(&format!("{tp}/core_id"), &format!("{}\n", m.core_id[&c.id]));
        if m.kernel != Kernel::Ancient {
            t.file(&format!("{tp}/thread_siblings_list"), &list(&siblings));
        }
        if m.kernel == Kernel::Current {
            t.file(&format!("{tp}/core_cpus_list"), &list(&siblings));
        } else {
            t.file(&format!("{tp}/thread_siblings"), &mask(&siblings));
        }
        // cpu0 cannot be taken offline on most machines: no `online` file.
        if c.id != present.first().unwrap() {
            t.file(&format!("{d}/online"), "1\n");
        }
        let node = c.node.unwrap();
        t.link(
            &format!("{d}/node{node}"),
            &format!("../../node/node{node}"),
        );
        let mine = caches.iter().filter(|x| x.cpus.contains(c.id));
        for (index, x) in mine.enumerate() {
            let ix = format!("{d}/cache/index{index}");
            t.file(&format!("{ix}/level"), &format!("{}\n", x.level));
            t.file(&format!("{ix}/type"), &format!("{}\n", kernel_kind(x.kind)));
            t.file(&format!("{ix}/size"), &format!("{}K\n", x.size_bytes >> 10));
            t.file(&format!("{ix}/shared_cpu_map"), &mask(&x.cpus));
            if m.kernel != Kernel::Ancient {
                t.file(&format!("{ix}/shared_cpu_list"), &list(&x.cpus));
            }
        }
    }

    let node = "sys/devices/system/node";
    let ids: NodeSet = topo.nodes.iter().map(|n| n.id).collect();
    let ids_where = |f: &dyn Fn(&Node) -> bool| -> NodeSet {
        topo.nodes.iter().filter(|n| f(n)).map(|n| n.id).collect()
    };
    t.file(&format!("{node}/online"), &format!("{ids}\n"));
    let possible_nodes: NodeSet = (0..=ids.last().unwrap()).collect();
    t.file(&format!("{node}/possible"), &format!("{possible_nodes}\n"));
    t.file(
        &format!("{node}/has_cpu"),
        &format!("{}\n", ids_where(&|n| !n.cpus.is_empty())),
    );
    let with_memory = ids_where(&|n| n.memory_bytes != Some(0));
    t.file(&format!("{node}/has_memory"), &format!("{with_memory}\n"));
    t.file(
        &format!("{node}/has_normal_memory"),
        &format!("{with_memory}\n"),
    );
    for (i, n) in topo.nodes.iter().enumerate() {
        let d = format!("{node}/node{}", n.id);
        if m.kernel != Kernel::Ancient {
            t.file(&format!("{d}/cpulist"), &list(&n.cpus));
        }
        t.file(&format!("{d}/cpumap"), &mask(&n.cpus));
        let row: Vec<String> = topo.distances[i].iter().map(u32::to_string).collect();
        t.file(&format!("{d}/distance"), &format!("{}\n", row.join(" ")));
        let kb = |b: Option<u64>| b.unwrap() >> 10;
        let (total, free) = (kb(n.memory_bytes), kb(n.free_bytes));
        let mut meminfo = String::new();
        for (key, v) in [
            ("MemTotal", total),
            ("MemFree", free),
            ("MemUsed", total - free),
            ("SwapCached", 0),
            ("Active", (total - free) / 2),
            ("Inactive", (total - free) / 4),
            ("Active(anon)", (total - free) / 8),
            ("Dirty", 0),
            ("FilePages", (total - free) / 4),
            ("AnonHugePages", 0),
        ] {
            let _ = writeln!(meminfo, "Node {} {:<16}{v:>8} kB", n.id, format!("{key}:"));
        }
        for key in ["HugePages_Total", "HugePages_Free", "HugePages_Surp"] {
            let _ = writeln!(meminfo, "Node {} {key}: {:>5}", n.id, 0);
        }
        t.file(&format!("{d}/meminfo"), &meminfo);
    }
}

// ---------------------------------------------------------------------------------------------
// Writing an hwloc XML export
// ---------------------------------------------------------------------------------------------

/// One object of the hwloc tree.
struct XObj {
    ty: &'static str,
    /// hwloc's order among objects with the same cpuset (a smaller one is the parent).
    order: u8,
    cpuset: CpuSet,
    /// Type-specific attributes, already formatted (` os_index="3"`, cache attributes).
    attrs: String,
    parent: Option<usize>,
    children: Vec<usize>,
    /// Positions (in `topo.nodes`) of the NUMA nodes attached here.
    memory: Vec<usize>,
}

/// The tree `lstopo --of xml` would export for a machine, built as hwloc builds it: objects
/// inserted by cpuset (Machine > Package > L3 > L2 > L1d > L1i > Core > PU), each NUMA node
/// attached to the highest object whose cpuset is the node's (a memory Group is made where none
/// is, as for sub-NUMA clusters), CPU-less nodes to the Machine.
struct Hwloc {
    objs: Vec<XObj>,
    /// Each node's cpuset as hwloc has it (a CPU-less node may get its nearest nodes' cpus).
    node_cpuset: Vec<CpuSet>,
    /// Each node's attachment object.
    anchor: Vec<usize>,
    /// A CPU-less node's cpuset cuts through a package or cache (no Group could be made).
    crosses: bool,
}

/// hwloc bitmap syntax: 32-bit words, most significant first, `0x%08x` each; a zero word is
/// empty between commas except the last, which is `0x0` (so the empty set is `0x0`).
fn hwloc_bitmap(ids: impl Iterator<Item = u32>) -> String {
    let mut words: BTreeMap<u32, u32> = BTreeMap::new();
    for id in ids {
        *words.entry(id / 32).or_default() |= 1 << (id % 32);
    }
    let Some(&hi) = words.keys().last() else {
        return "0x0".into();
    };
    (0..=hi)
        .rev()
        .map(|w| match words.get(&w) {
            Some(v) => format!("0x{v:08x}"),
            None if w == 0 => "0x0".into(),
            None => String::new(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl Hwloc {
    fn new(m: &Machine) -> Hwloc {
        let t = &m.topo;
        let all = t.cpu_ids();
        let mut objs: Vec<XObj> = Vec::new();
        let obj = |ty, order, cpuset, attrs| XObj {
            ty,
            order,
            cpuset,
            attrs,
            parent: None,
            children: vec![],
            memory: vec![],
        };
        objs.push(obj("Machine", 0, all.clone(), String::new()));

        let mut packages: BTreeMap<u32, CpuSet> = BTreeMap::new();
        let mut cores: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for c in &t.cpus {
            packages.entry(c.package).or_default().insert(c.id);
            cores.entry(c.core).or_default().insert(c.id);
        }
        let mut normal = Vec::new();
        for (id, set) in packages {
            normal.push(obj("Package", 4, set, format!(" os_index=\"{id}\"")));
        }
        for c in &t.caches {
            let (ty, order, code) = match (c.level, c.kind) {
                (1, CacheKind::Instruction) => ("L1iCache", 13, 2),
                (1, k) => ("L1Cache", 12, if k == CacheKind::Data { 1 } else { 0 }),
                (2, _) => ("L2Cache", 10, 0),
                (3, _) => ("L3Cache", 8, 0),
                other => panic!("the generator makes no {other:?} cache"),
            };
            let attrs = format!(
                " cache_size=\"{}\" depth=\"{}\" cache_linesize=\"64\" cache_associativity=\"8\" cache_type=\"{code}\"",
                c.size_bytes, c.level
            );
            normal.push(obj(ty, order, c.cpus.clone(), attrs));
        }
        for set in cores.into_values() {
            let id = m.core_id[&set.first().unwrap()];
            normal.push(obj("Core", 14, set, format!(" os_index=\"{id}\"")));
        }
        for c in &t.cpus {
            normal.push(obj(
                "PU",
                18,
                CpuSet::single(c.id),
                format!(" os_index=\"{}\"", c.id),
            ));
        }

        // hwloc's cpusets of the nodes: a CPU-less node gets the cpus of the nodes nearest to
        // it when they are nearer than itself and not all the others
        // (`fixup_cpuless_node_locality_from_distances`, in node order).
        let n = t.nodes.len();
        let mut node_cpuset: Vec<CpuSet> = t.nodes.iter().map(|x| x.cpus.clone()).collect();
        if m.cpuless_locality && n >= 2 {
            for i in 0..n {
                if !node_cpuset[i].is_empty() {
                    continue;
                }
                let row = &t.distances[i];
                let (mut min, mut nb) = (u32::MAX, 0);
                for (j, &d) in row.iter().enumerate() {
                    if j == i {
                        continue;
                    }
                    if d < min {
                        (min, nb) = (d, 1);
                    } else if d == min {
                        nb += 1;
                    }
                }
                if min <= row[i] || nb == n - 1 {
                    continue;
                }
                for j in 0..n {
                    if j != i && row[j] == min {
                        node_cpuset[i] = node_cpuset[i].union(&node_cpuset[j]);
                    }
                }
            }
        }
        // A memory Group for every node cpuset that no object has.
        let mut group_sets: BTreeSet<CpuSet> = BTreeSet::new();
        for set in &node_cpuset {
            if !set.is_empty() && *set != all && !normal.iter().any(|o| o.cpuset == *set) {
                group_sets.insert(set.clone());
            }
        }
        // A CPU-less node near cpus of several packages can get a cpuset that cuts through a
        // package: hwloc then fails to insert objects and reports an error from the operating
        // system. Such machines are not generated (see `valid_for_hwloc`).
        let laminar = |a: &CpuSet, b: &CpuSet| {
            a.is_subset(b) || b.is_subset(a) || a.intersection(b).is_empty()
        };
        let crosses = group_sets.iter().any(|g| {
            normal.iter().any(|o| !laminar(g, &o.cpuset))
                || group_sets.iter().any(|h| !laminar(g, h))
        });
        if !crosses {
            for set in group_sets {
                normal.push(obj("Group", 1, set, " kind=\"1001\" subkind=\"0\"".into()));
            }
        }

        // Insert by cpuset, bigger sets first, then by type order.
        normal.sort_by_key(|o| (std::cmp::Reverse(o.cpuset.len()), o.order, o.cpuset.first()));
        for o in normal {
            let mut at = 0;
            while let Some(&c) = objs[at]
                .children
                .iter()
                .find(|&&c| o.cpuset.is_subset(&objs[c].cpuset))
            {
                at = c;
            }
            let idx = objs.len();
            objs.push(XObj {
                parent: Some(at),
                ..o
            });
            objs[at].children.push(idx);
        }
        let first = |objs: &Vec<XObj>, c: usize| objs[c].cpuset.first();
        for i in 0..objs.len() {
            let mut ch = std::mem::take(&mut objs[i].children);
            ch.sort_by_key(|&c| first(&objs, c));
            objs[i].children = ch;
        }

        // Attach the nodes: the highest object covering exactly the node's cpuset, never a PU.
        let mut anchor = vec![0; n];
        for i in 0..n {
            let set = &node_cpuset[i];
            if set.is_empty() {
                if m.cpuless_group {
                    let idx = objs.len();
                    let mut g = obj(
                        "Group",
                        1,
                        CpuSet::new(),
                        " kind=\"1001\" subkind=\"0\"".into(),
                    );
                    g.parent = Some(0);
                    objs.push(g);
                    objs[0].children.push(idx);
                    anchor[i] = idx;
                } else {
                    anchor[i] = 0;
                }
                continue;
            }
            let mut at = 0;
            loop {
                match objs[at]
                    .children
                    .iter()
                    .find(|&&c| set.is_subset(&objs[c].cpuset))
                {
                    None => break,
                    Some(&c) if objs[c].cpuset == *set => {
                        at = c;
                        break;
                    }
                    Some(&c) => at = c,
                }
            }
            if objs[at].ty == "PU" {
                at = objs[at].parent.unwrap();
            }
            assert!(
                crosses || objs[at].cpuset == *set,
                "node {i} has no home object"
            );
            anchor[i] = at;
        }
        for (i, &a) in anchor.iter().enumerate() {
            objs[a].memory.push(i);
        }
        Hwloc {
            objs,
            node_cpuset,
            anchor,
            crosses,
        }
    }

    /// Whether hwloc would export this machine without an error and without losing which node
    /// owns which cpus.
    fn valid_for_hwloc(&self, t: &Topology) -> bool {
        !self.crosses && !self.ambiguous(t)
    }

    /// Whether a node with cpus shares its attachment point with a lower-numbered node that hwloc
    /// says is local to the same cpus: nothing in the export then tells which of the two owns
    /// them (hwloc has no subtype for plain DRAM), and any reader must guess.
    fn ambiguous(&self, t: &Topology) -> bool {
        t.nodes.iter().enumerate().any(|(i, x)| {
            !x.cpus.is_empty()
                && t.nodes.iter().enumerate().any(|(j, y)| {
                    j != i
                        && self.anchor[j] == self.anchor[i]
                        && x.cpus.is_subset(&self.node_cpuset[j])
                        && y.id < x.id
                })
        })
    }

    /// The XML text.
    fn xml(&self, m: &Machine) -> String {
        let t = &m.topo;
        // Nodes local to each object: attached at it, above it or below it.
        let mut below: Vec<NodeSet> = vec![NodeSet::new(); self.objs.len()];
        for idx in (0..self.objs.len()).rev() {
            // Children always come after their parent in `objs`.
            let mut s: NodeSet = self.objs[idx]
                .memory
                .iter()
                .map(|&i| t.nodes[i].id)
                .collect();
            for &c in &self.objs[idx].children {
                s = s.union(&below[c]);
            }
            below[idx] = s;
        }
        let mut out = String::from(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n<topology version=\"2.0\">\n",
        );
        let mut gp = 1u64;
        self.emit(m, 0, 1, &NodeSet::new(), &below, &mut gp, &mut out);
        let n = t.nodes.len();
        if n >= 2 {
            let _ = writeln!(
                out,
                "  <distances2 type=\"NUMANode\" nbobjs=\"{n}\" kind=\"5\" name=\"NUMALatency\" indexing=\"os\">"
            );
            let order = &m.index_order;
            let indexes: Vec<u64> = order.iter().map(|&i| t.nodes[i].id as u64).collect();
            let values: Vec<u64> = order
                .iter()
                .flat_map(|&a| order.iter().map(move |&b| t.distances[a][b] as u64))
                .collect();
            for (tag, vals) in [("indexes", indexes), ("u64values", values)] {
                for chunk in vals.chunks(10) {
                    let text: String = chunk.iter().map(|v| format!("{v} ")).collect();
                    let _ = writeln!(out, "    <{tag} length=\"{}\">{text}</{tag}>", text.len());
                }
            }
            out.push_str("  </distances2>\n");
        }
        out.push_str("  <support name=\"discovery.pu\"/>\n  <support name=\"discovery.numa\"/>\n");
        out.push_str("</topology>\n");
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        m: &Machine,
        idx: usize,
        depth: usize,
        above: &NodeSet,
        below: &[NodeSet],
        gp: &mut u64,
        out: &mut String,
    ) {
        let t = &m.topo;
        let o = &self.objs[idx];
        let pad = "  ".repeat(depth);
        let here: NodeSet = o.memory.iter().map(|&i| t.nodes[i].id).collect();
        let above = above.union(&here);
        let nodeset = hwloc_bitmap(above.union(&below[idx]).iter());
        let cpuset = hwloc_bitmap(o.cpuset.iter());
        let _ = write!(
            out,
            "{pad}<object type=\"{}\"{} cpuset=\"{cpuset}\" complete_cpuset=\"{cpuset}\"",
            o.ty,
            if idx == 0 { " os_index=\"0\"" } else { "" },
        );
        if idx == 0 {
            let _ = write!(out, " allowed_cpuset=\"{cpuset}\"");
        }
        let _ = write!(out, " nodeset=\"{nodeset}\" complete_nodeset=\"{nodeset}\"");
        if idx == 0 {
            let _ = write!(out, " allowed_nodeset=\"{nodeset}\"");
        }
        let _ = write!(out, " gp_index=\"{gp}\"{}", o.attrs);
        *gp += 1;
        if o.children.is_empty() && o.memory.is_empty() && idx != 0 {
            out.push_str("/>\n");
            return;
        }
        out.push_str(">\n");
        if idx == 0 {
            let _ = writeln!(out, "{pad}  <info name=\"Backend\" value=\"Linux\"/>");
        }
        for &i in &o.memory {
            let node = &t.nodes[i];
            let cs = hwloc_bitmap(self.node_cpuset[i].iter());
            let ns = hwloc_bitmap(std::iter::once(node.id));
            let _ = write!(
                out,
                "{pad}  <object type=\"NUMANode\" os_index=\"{}\" cpuset=\"{cs}\" complete_cpuset=\"{cs}\" nodeset=\"{ns}\" complete_nodeset=\"{ns}\" gp_index=\"{gp}\"",
                node.id
            );
            *gp += 1;
            let mem = node.memory_bytes.unwrap();
            // hwloc leaves `local_memory` out when it is 0 (a memoryless node).
            if mem != 0 {
                let _ = write!(out, " local_memory=\"{mem}\"");
            }
            out.push_str(">\n");
            for (size, count) in [(4096u64, mem / 4096), (2 << 20, 0), (1 << 30, 0)] {
                let _ = writeln!(
                    out,
                    "{pad}    <page_type size=\"{size}\" count=\"{count}\"/>"
                );
            }
            let _ = writeln!(out, "{pad}  </object>");
        }
        for &c in &o.children {
            self.emit(m, c, depth + 1, &above, below, gp, out);
        }
        let _ = writeln!(out, "{pad}</object>");
    }
}

// ---------------------------------------------------------------------------------------------
// Comparing
// ---------------------------------------------------------------------------------------------

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
fn same(want: &Topology, got: &Topology, keep_free: bool) -> Result<(), TestCaseError> {
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

// ---------------------------------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sysfs_tree_reads_back(m in machine()) {
        let tree = Tree::new("sysfs");
        write_sysfs(&m, &tree);
        let got = loci_topo::load(&Source::Sysfs(tree.0.clone()))
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        same(&m.topo, &got, true)?;
        prop_assert_eq!(got.source, format!("sysfs-dir:{}", tree.0.display()));
    }

    #[test]
    fn hwloc_xml_reads_back(m in hwloc_machine()) {
        let dir = Tree::new("xml");
        let path = dir.0.join("topology.xml");
        std::fs::write(&path, Hwloc::new(&m).xml(&m)).unwrap();
        let got = loci_topo::load(&Source::HwlocXml(path.clone()))
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        same(&m.topo, &got, false)?;
        prop_assert_eq!(got.source, format!("xml:{}", path.display()));
    }
}

// ---------------------------------------------------------------------------------------------
// The writers themselves
// ---------------------------------------------------------------------------------------------

#[test]
fn masks_are_written_as_kernel_and_hwloc_write_them() {
    let s = |l: &str| CpuSet::parse(l).unwrap();
    // Real files: fakeheteromemtiers (6 cpus), a 64-cpu machine.
    assert_eq!(kernel_mask(&s("0-1"), 6), "03");
    assert_eq!(kernel_mask(&s("0-5"), 6), "3f");
    assert_eq!(kernel_mask(&s("0-3"), 64), "00000000,0000000f");
    assert_eq!(kernel_mask(&s("32"), 40), "01,00000000");
    assert_eq!(kernel_mask(&s(""), 4), "0");
    // Real exports: memorysidecaches.xml, 192em64t-24n8c2t.xml.
    assert_eq!(hwloc_bitmap(s("40").iter()), "0x00000100,0x0");
    assert_eq!(
        hwloc_bitmap(s("0-7,192-199").iter()),
        "0x000000ff,,,,,,0x000000ff"
    );
    assert_eq!(hwloc_bitmap(s("").iter()), "0x0");
    assert_eq!(hwloc_bitmap(s("0-3").iter()), "0x0000000f");
    // And the loci parsers read them back.
    assert_eq!(CpuSet::parse_mask("01,00000000").unwrap(), s("32"));
}
