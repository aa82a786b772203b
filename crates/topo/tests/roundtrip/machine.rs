//! The generated machine: random choices ([`Params`]) and the valid [`Topology`] built from them,
//! with what the files say that the model does not keep.

use std::collections::BTreeMap;
use std::fmt;

use loci_topo::{Cache, CacheKind, Cpu, CpuSet, Node, Topology};
use proptest::prelude::*;

/// A machine: the topology loci should read back, plus what the files say that the model does
/// not keep.
#[derive(Clone)]
pub(crate) struct Machine {
    pub(crate) topo: Topology,
    /// The kernel's `core_id` of each cpu (unique only inside a package).
    pub(crate) core_id: BTreeMap<u32, u32>,
    /// sysfs: which files the kernel writes.
    pub(crate) kernel: Kernel,
    /// XML: a CPU-less node hangs off the Machine inside an empty Group of its own (as hwloc
    /// attaches one) rather than directly (as in exports made with groups filtered out).
    pub(crate) cpuless_group: bool,
    /// XML: hwloc gives a CPU-less node the cpus of the nodes nearest to it by distance (what
    /// hwloc 2.x on Linux does when those are unambiguous), so it sits beside them.
    pub(crate) cpuless_locality: bool,
    /// XML: the order of the node indexes in `<distances2>` (a permutation of node positions).
    pub(crate) index_order: Vec<usize>,
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
pub(crate) enum Kernel {
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

    let topo = Topology::from_parts("generated".into(), nodes, cpus, caches, vec![], distances);
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

pub(crate) fn machine() -> impl Strategy<Value = Machine> {
    params().prop_map(|p| build(&p))
}
