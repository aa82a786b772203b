//! The topology model: what a machine looks like, as a value.
//!
//! Glossary (shared with the rest of loci, see DESIGN.md):
//! - **node**: a NUMA domain (memory and usually cpus; may be CPU-less or memoryless). Ids are the
//!   kernel's and may be sparse (0, 2, 5).
//! - **cpu**: a hardware thread as the kernel numbers it; **core**: a physical core; **package**: a socket.
//! - **distance**: the kernel's SLIT value (10 = local); **hops** are derived from it.
//! - **core group**: the cpus that share one cache of a given level inside one node.
//!
//! A `Topology` is passed around as a value; nothing in loci reads the machine from a global.

use serde::{Deserialize, Serialize};

use crate::idset::{CpuSet, NodeSet};

/// What kind of memory a node holds. Ordinary nodes are `Dram`; the others are told apart by the
/// kernel's own descriptions (see docs/topology.md, "Node kinds"), never guessed from sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// Ordinary memory.
    #[default]
    Dram,
    /// Faster than the slowest node with cpus (HMAT read bandwidth), or a DAX device of
    /// specific-purpose memory: HBM, MCDRAM.
    Hbm,
    /// Slower than the slowest node with cpus (HMAT read bandwidth), or a DAX device of an NVDIMM
    /// region: NVM, CXL-attached memory.
    Nvm,
    /// A GPU's memory that the driver onlined as a NUMA node (NVIDIA's `numa_status`). Shown, but
    /// never in a default memory set ([`Topology::allowed_mems`]): only a policy that names it
    /// places pages there.
    Gpu,
}

impl NodeKind {
    pub fn name(self) -> &'static str {
        match self {
            NodeKind::Dram => "dram",
            NodeKind::Hbm => "hbm",
            NodeKind::Nvm => "nvm",
            NodeKind::Gpu => "gpu",
        }
    }
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// The kernel's node id.
    pub id: u32,
    /// Every present cpu of this node (allowed or not). Empty for a CPU-less node.
    pub cpus: CpuSet,
    /// Total memory in bytes; 0 for a memoryless node; `None` when the source does not say.
    pub memory_bytes: Option<u64>,
    /// Free memory in bytes when the source says (live sysfs does, presets and XML do not).
    pub free_bytes: Option<u64>,
    /// Whether this process may allocate here (cgroup `cpuset.mems.effective`, `Mems_allowed`).
    pub allowed: bool,
    pub kind: NodeKind,
    /// For a CPU-less node: the nodes whose cpus reach it best (the kernel's HMAT access class,
    /// `nodeN/access1/initiators`); empty when the source does not say.
    pub initiators: NodeSet,
    /// Kernel node ids folded into this one because firmware described them as one locality
    /// domain (the same cpus, local distance between them); empty normally. A memory policy on
    /// this node applies to all of them.
    pub merged: NodeSet,
}

/// An allowed, empty, ordinary node 0: the base for `Node { id, cpus, ..Default::default() }`.
impl Default for Node {
    fn default() -> Node {
        Node::new(0, CpuSet::new(), None)
    }
}

impl Node {
    /// An allowed ordinary node (kind `dram`, no initiators, nothing merged).
    pub fn new(id: u32, cpus: CpuSet, memory_bytes: Option<u64>) -> Node {
        Node {
            id,
            cpus,
            memory_bytes,
            free_bytes: None,
            allowed: true,
            kind: NodeKind::Dram,
            initiators: NodeSet::new(),
            merged: NodeSet::new(),
        }
    }
    /// This node's id and the ids merged into it: the kernel nodes a policy on it names.
    pub fn kernel_ids(&self) -> NodeSet {
        let mut s = self.merged.clone();
        s.insert(self.id);
        s
    }
}

/// One hardware thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cpu {
    pub id: u32,
    /// Physical core id, unique across the machine (the kernel's `core_id` is only unique
    /// within a package, so sources renumber: see [`Topology::validate`]).
    pub core: u32,
    pub package: u32,
    /// Home node; `None` only if the source has no NUMA information for it.
    pub node: Option<u32>,
    /// In this process's affinity mask and cgroup cpuset. Always true for presets/XML/synthetic.
    pub allowed: bool,
    pub online: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheKind {
    Data,
    Instruction,
    Unified,
}

/// One cache instance (for example "the L3 shared by cpus 0-9").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cache {
    pub level: u8,
    pub kind: CacheKind,
    pub size_bytes: u64,
    /// The cpus that share this instance.
    pub cpus: CpuSet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Net,
    Block,
    Gpu,
    Other,
}

/// A device whose locality matters (NICs for streaming, block devices for file sinks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    pub kind: DeviceKind,
    /// Home node, `None` when the kernel reports -1 (no affinity).
    pub node: Option<u32>,
}

/// A whole machine as loci sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Where this came from, e.g. `sysfs:/`, `sysfs:DIR`, `xml:FILE`, `preset:NAME`, `synthetic:SPEC`.
    pub source: String,
    /// Sorted by id.
    pub nodes: Vec<Node>,
    /// Sorted by id.
    pub cpus: Vec<Cpu>,
    pub caches: Vec<Cache>,
    pub devices: Vec<Device>,
    /// SLIT distances: `distances[i][j]` is from `nodes[i]` to `nodes[j]` (index order, not id).
    pub distances: Vec<Vec<u32>>,
    /// What the source had to repair or leave out to make sense of the machine (a node cpulist
    /// naming absent cpus, distance rows for offline nodes, merged firmware nodes), one sentence
    /// each. Shown by `loci topo`.
    pub notes: Vec<String>,
}

/// Why a topology is inconsistent (a source produced something loci cannot trust).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("topology has no nodes")]
    NoNodes,
    #[error("distance matrix is {rows}x? but there are {nodes} nodes")]
    DistanceShape { rows: usize, nodes: usize },
    #[error("cpu {cpu} names node {node}, which does not exist (nodes: {valid})")]
    CpuNode { cpu: u32, node: u32, valid: String },
    #[error("node ids are not sorted and unique")]
    NodeOrder,
    #[error("cpu ids are not sorted and unique")]
    CpuOrder,
    #[error("node {node} lists cpu {cpu}, but cpu {cpu} names node {other}")]
    NodeCpus { node: u32, cpu: u32, other: u32 },
}

impl Topology {
    /// One node 0 holding `cpus` (one core each, no caches, memory unknown): the machine as seen
    /// through an affinity mask alone. Used where no /sys is readable and by tests that need
    /// "the cpus this process may use" as a topology.
    pub fn flat(cpus: CpuSet, source: &str) -> Topology {
        Topology {
            source: source.to_string(),
            nodes: vec![Node::new(0, cpus.clone(), None)],
            cpus: cpus
                .iter()
                .map(|id| Cpu {
                    id,
                    core: id,
                    package: 0,
                    node: Some(0),
                    online: true,
                    allowed: true,
                })
                .collect(),
            caches: vec![],
            devices: vec![],
            distances: vec![vec![10]],
            notes: vec![],
        }
    }

    /// A topology of these parts with no notes, not yet checked (see [`validate`](Self::validate)):
    /// what every reader and generator assembles at its end.
    pub fn from_parts(
        source: String,
        nodes: Vec<Node>,
        cpus: Vec<Cpu>,
        caches: Vec<Cache>,
        devices: Vec<Device>,
        distances: Vec<Vec<u32>>,
    ) -> Topology {
        Topology {
            source,
            nodes,
            cpus,
            caches,
            devices,
            distances,
            notes: vec![],
        }
    }

    /// Checks the invariants every source must establish.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.nodes.is_empty() {
            return Err(ModelError::NoNodes);
        }
        if !self.nodes.windows(2).all(|w| w[0].id < w[1].id) {
            return Err(ModelError::NodeOrder);
        }
        if !self.cpus.windows(2).all(|w| w[0].id < w[1].id) {
            return Err(ModelError::CpuOrder);
        }
        let n = self.nodes.len();
        if self.distances.len() != n || self.distances.iter().any(|r| r.len() != n) {
            return Err(ModelError::DistanceShape {
                rows: self.distances.len(),
                nodes: n,
            });
        }
        for c in &self.cpus {
            if let Some(node) = c.node {
                if self.node_index(node).is_none() {
                    return Err(ModelError::CpuNode {
                        cpu: c.id,
                        node,
                        valid: self.node_ids().to_string(),
                    });
                }
            }
        }
        // A node's cpu list and the cpus' own node agree: placement reads both. (Cpus are sorted
        // by id, checked above: a binary search keeps this linear-logarithmic at 65536 cpus.)
        let node_of = |id: u32| {
            let i = self.cpus.binary_search_by_key(&id, |c| c.id).ok()?;
            self.cpus[i].node
        };
        for n in &self.nodes {
            for id in n.cpus.iter() {
                if let Some(m) = node_of(id).filter(|&m| m != n.id) {
                    return Err(ModelError::NodeCpus {
                        node: n.id,
                        cpu: id,
                        other: m,
                    });
                }
            }
        }
        Ok(())
    }

    pub fn node_ids(&self) -> NodeSet {
        self.nodes.iter().map(|n| n.id).collect()
    }
    pub fn node(&self, id: u32) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }
    /// Index of node `id` in `nodes` (and in the distance matrix).
    pub fn node_index(&self, id: u32) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }
    pub fn cpu(&self, id: u32) -> Option<&Cpu> {
        self.cpus.iter().find(|c| c.id == id)
    }
    /// All present cpus.
    pub fn cpu_ids(&self) -> CpuSet {
        self.cpus.iter().map(|c| c.id).collect()
    }
    /// Cpus this process may run on (online and allowed).
    pub fn allowed_cpus(&self) -> CpuSet {
        self.cpus
            .iter()
            .filter(|c| c.online && c.allowed)
            .map(|c| c.id)
            .collect()
    }
    /// Nodes this process may allocate memory on by default: allowed, with memory (where known),
    /// and not GPU memory (which only a policy naming it uses).
    pub fn allowed_mems(&self) -> NodeSet {
        self.nodes
            .iter()
            .filter(|n| n.allowed && n.memory_bytes != Some(0) && n.kind != NodeKind::Gpu)
            .map(|n| n.id)
            .collect()
    }
    /// Marks every online cpu and every node allowed, ignoring cgroup cpusets and affinity
    /// (`--whole-system`), and says so in the notes.
    pub fn allow_everything(&mut self) {
        let before = (self.allowed_cpus(), self.allowed_mems());
        self.cpus.iter_mut().for_each(|c| c.allowed = true);
        self.nodes.iter_mut().for_each(|n| n.allowed = true);
        self.notes.push(format!(
            "--whole-system: planning over every cpu and node; allowed were cpus {} and memory on nodes {}",
            before.0, before.1
        ));
    }
    /// Allowed cpus of one node.
    pub fn allowed_cpus_of(&self, node: u32) -> CpuSet {
        self.node(node)
            .map(|n| n.cpus.intersection(&self.allowed_cpus()))
            .unwrap_or_default()
    }
    /// Distance between two nodes by id (SLIT units, 10 = local).
    pub fn distance(&self, a: u32, b: u32) -> Option<u32> {
        Some(self.distances[self.node_index(a)?][self.node_index(b)?])
    }
    /// Hops between nodes, derived from distances: 0 for local; otherwise the rank of the
    /// distance among the distinct remote distances of the machine (1 = nearest remote class).
    /// For every pair at once, [`Topology::hops_matrix`] sorts the classes only once.
    pub fn hops(&self, a: u32, b: u32) -> Option<u32> {
        if a == b {
            return Some(0);
        }
        let d = self.distance(a, b)?;
        Some(hop_of(&self.distance_classes(), d))
    }
    /// `hops` for every pair, in the order of `nodes`.
    pub fn hops_matrix(&self) -> Vec<Vec<u32>> {
        let classes = self.distance_classes();
        self.distances
            .iter()
            .enumerate()
            .map(|(i, row)| {
                row.iter()
                    .enumerate()
                    .map(|(j, &d)| if i == j { 0 } else { hop_of(&classes, d) })
                    .collect()
            })
            .collect()
    }
    /// The distinct remote distances of the machine, ascending.
    fn distance_classes(&self) -> Vec<u32> {
        let mut classes: Vec<u32> = self
            .distances
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                r.iter()
                    .enumerate()
                    .filter(move |(j, _)| *j != i)
                    .map(|(_, &v)| v)
            })
            .collect();
        classes.sort_unstable();
        classes.dedup();
        classes
    }
    /// Caches of one level, deduplicated (each instance once).
    pub fn caches_at(&self, level: u8) -> impl Iterator<Item = &Cache> {
        self.caches
            .iter()
            .filter(move |c| c.level == level && c.kind != CacheKind::Instruction)
    }
    /// The highest cache level present (the LLC), if any cache is known.
    pub fn llc_level(&self) -> Option<u8> {
        self.caches.iter().map(|c| c.level).max()
    }
    /// Core groups: for each node, the cpus that share one cache instance of `level` (restricted to
    /// the node, so a cache spanning nodes still yields one group per node). Cpus with no cache of
    /// that level form one group per core. Groups are ordered by node, then by first cpu.
    pub fn core_groups(&self, level: u8) -> Vec<CoreGroup> {
        let mut out = Vec::new();
        for node in &self.nodes {
            let mut left = node.cpus.clone();
            let mut groups: Vec<CpuSet> = Vec::new();
            for cache in self.caches_at(level) {
                let g = cache.cpus.intersection(&node.cpus);
                if !g.is_empty() && g.is_subset(&left) {
                    left = left.difference(&g);
                    groups.push(g);
                }
            }
            // Remaining cpus: one group per physical core.
            groups.extend(self.split_by_core(&left));
            groups.sort_by_key(|g| g.first());
            for cpus in groups {
                out.push(CoreGroup {
                    node: node.id,
                    cpus,
                });
            }
        }
        out
    }
    /// `set` split into one set per physical core (the same package and core id; cpus this
    /// topology does not list form one set), in the order of their first cpus.
    pub fn split_by_core(&self, set: &CpuSet) -> Vec<CpuSet> {
        let mut left = set.clone();
        let mut out = Vec::new();
        while let Some(first) = left.first() {
            let core = self.cpu(first).map(|c| (c.package, c.core));
            let g: CpuSet = left
                .iter()
                .filter(|&id| self.cpu(id).map(|c| (c.package, c.core)) == core)
                .collect();
            left = left.difference(&g);
            out.push(g);
        }
        out
    }
    /// Node of a cpu, if known.
    pub fn node_of_cpu(&self, cpu: u32) -> Option<u32> {
        self.cpu(cpu).and_then(|c| c.node)
    }
    /// Sibling hardware threads of a cpu (same package and core), including itself.
    pub fn smt_siblings(&self, cpu: u32) -> CpuSet {
        let Some(c) = self.cpu(cpu) else {
            return CpuSet::new();
        };
        self.cpus
            .iter()
            .filter(|o| o.package == c.package && o.core == c.core)
            .map(|o| o.id)
            .collect()
    }
}

/// Cpus that share a cache level inside one node (seed 003's unit of scheduling).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreGroup {
    pub node: u32,
    pub cpus: CpuSet,
}

/// The hop class of distance `d` among `classes` (1 = nearest remote class).
fn hop_of(classes: &[u32], d: u32) -> u32 {
    classes.binary_search(&d).map(|p| p as u32 + 1).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn hops_matrix_is_hops_of_every_pair() {
        let t = crate::preset::build("opteron-8220-8s").unwrap();
        let m = t.hops_matrix();
        for (i, a) in t.nodes.iter().enumerate() {
            for (j, b) in t.nodes.iter().enumerate() {
                assert_eq!(Some(m[i][j]), t.hops(a.id, b.id));
            }
        }
        assert_eq!(m[0].iter().max(), Some(&3));
    }

    #[test]
    fn a_node_listing_another_nodes_cpu_is_inconsistent() {
        let mut t = crate::preset::build("xeon-silver-4114-2s").unwrap();
        assert_eq!(t.validate(), Ok(()));
        let foreign = t.nodes[1].cpus.iter().next().unwrap();
        t.nodes[0].cpus.insert(foreign);
        let e = t.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("node 0 lists cpu {foreign}, but cpu {foreign} names node 1")
        );
    }
}
