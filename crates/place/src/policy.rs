//! Memory policies: where a thread's new pages go (`set_mempolicy(2)`), as `--mem` spells them.
//!
//! | `--mem` | kernel mode | numactl equivalent |
//! |---|---|---|
//! | `first-touch` | `MPOL_DEFAULT` | (none) |
//! | `interleave[:NODES]` | `MPOL_INTERLEAVE` (all allowed nodes with memory when no list) | `--interleave` |
//! | `localalloc` | `MPOL_LOCAL` | `--localalloc` |
//! | `preferred:N` | `MPOL_PREFERRED` | `--preferred` |
//! | `bind:NODES` | `MPOL_BIND` | `--membind` |
//! | `preferred-many:NODES` | `MPOL_PREFERRED_MANY` (Linux 5.15+) | `--preferred-many` |
//! | `weighted-interleave:NODES` | `MPOL_WEIGHTED_INTERLEAVE` (Linux 6.9+, weights from `/sys/kernel/mm/mempolicy/weighted_interleave/`) | `--weighted-interleave` |
//! | `per-node[:NODES]` | `MPOL_BIND` per part: part `i` of `m` on node `i*k/m` (contiguous shares) | (none) |
//! | `round-robin[:NODES]` | `MPOL_BIND` per part: part `i` on the `i mod k`-th node | (none) |
//!
//! The last two place the *parts* of a region (engine morsels, array chunks): the region is split
//! into parts and each part is bound to one node, as [`PartOrder::node_index`] says (the one
//! definition every runtime asks, through [`MemPlan::part`]). They are not a thread's policy.
//!
//! [`MemPolicy::resolve`] checks a policy against a topology: nodes that are not present or not
//! allowed are errors that name the node and list the valid ones; a memoryless node in a list is
//! dropped, and interleaving over a single node is applied as `preferred:N`, each said once in a
//! note.

use std::fmt;
use std::str::FromStr;

use loci_topo::{NodeSet, Topology};

use crate::sys::mode;

/// A memory policy as the user wrote it (node lists still unresolved).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MemPolicy {
    FirstTouch,
    /// `None` = every allowed node with memory.
    Interleave(Option<String>),
    Local,
    Preferred(u32),
    Bind(String),
    PreferredMany(String),
    WeightedInterleave(String),
    /// `per-node` / `round-robin`: each part of a region bound to one node (`None` = every
    /// allowed node with memory).
    Parts(PartOrder, Option<String>),
}

/// How the parts of a region are dealt to the `k` nodes of a per-part policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartOrder {
    /// `per-node`: part `i` of `m` on node index `i*k/m`: each node holds one contiguous share
    /// (seed 004's one-instance-per-node layout inside one process).
    Blocks,
    /// `round-robin`: part `i` on node index `i mod k`: neighbouring parts on different nodes.
    RoundRobin,
}

impl PartOrder {
    /// The policy name of this order (`per-node`, `round-robin`).
    pub fn name(self) -> &'static str {
        match self {
            PartOrder::Blocks => "per-node",
            PartOrder::RoundRobin => "round-robin",
        }
    }

    /// Index (`0..k`) of the node that holds part `i` of `parts`, over `k` nodes.
    pub fn node_index(self, i: usize, parts: usize, k: usize) -> usize {
        assert!(
            k > 0 && i < parts.max(1),
            "part {i} of {parts} over {k} nodes"
        );
        match self {
            PartOrder::Blocks => i * k / parts.max(1),
            PartOrder::RoundRobin => i % k,
        }
    }
}

/// Bad policy text, or a policy that cannot apply on a topology.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

impl MemPolicy {
    /// Valid policy forms, for error messages and `--help`.
    pub const CHOICES: &'static str = "first-touch, interleave[:NODES], localalloc, preferred:N, bind:NODES, preferred-many:NODES, weighted-interleave:NODES, and for the parts of a region (the bench workloads' morsels and chunks, not a thread's memory) per-node[:NODES], round-robin[:NODES]";

    /// Whether this policy places the parts of a region (`per-node`, `round-robin`).
    pub fn is_per_part(&self) -> bool {
        matches!(self, MemPolicy::Parts(..))
    }
}

impl FromStr for MemPolicy {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let s = s.trim();
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a.trim())),
            None => (s, None),
        };
        let list = |a: Option<&str>| -> Result<String, PolicyError> {
            let a = a.filter(|a| !a.is_empty()).ok_or_else(|| {
                PolicyError(format!(
                    "memory policy `{name}` needs a node list after `:` (e.g. `{name}:0-1`)"
                ))
            })?;
            let inner = a.strip_prefix('!').unwrap_or(a);
            if inner != "all" {
                NodeSet::parse(inner).map_err(|e| PolicyError(e.to_string()))?;
            }
            Ok(a.to_string())
        };
        let opt_list = |a: Option<&str>| a.map(|_| list(a)).transpose();
        let no_arg = |p: MemPolicy| match arg {
            None => Ok(p),
            Some(a) => Err(PolicyError(format!(
                "memory policy `{name}` takes no argument, got `:{a}`"
            ))),
        };
        match name {
            "first-touch" | "default" => no_arg(MemPolicy::FirstTouch),
            "localalloc" | "local" => no_arg(MemPolicy::Local),
            "interleave" => Ok(MemPolicy::Interleave(opt_list(arg)?)),
            "per-node" | "bind-per-node" => Ok(MemPolicy::Parts(PartOrder::Blocks, opt_list(arg)?)),
            "round-robin" => Ok(MemPolicy::Parts(PartOrder::RoundRobin, opt_list(arg)?)),
            "preferred" => {
                let a = arg.filter(|a| !a.is_empty()).ok_or_else(|| {
                    PolicyError(
                        "memory policy `preferred` needs one node (e.g. `preferred:0`)".into(),
                    )
                })?;
                a.parse().map(MemPolicy::Preferred).map_err(|_| {
                    PolicyError(format!(
                        "`{a}` in `{s}` is not one node id (for several nodes use preferred-many:NODES)"
                    ))
                })
            }
            "bind" | "membind" => Ok(MemPolicy::Bind(list(arg)?)),
            "preferred-many" => Ok(MemPolicy::PreferredMany(list(arg)?)),
            "weighted-interleave" => Ok(MemPolicy::WeightedInterleave(list(arg)?)),
            _ => Err(PolicyError(format!(
                "unknown memory policy `{name}`; valid: {}",
                MemPolicy::CHOICES
            ))),
        }
    }
}

impl fmt::Display for MemPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemPolicy::FirstTouch => f.write_str("first-touch"),
            MemPolicy::Interleave(None) => f.write_str("interleave"),
            MemPolicy::Interleave(Some(l)) => write!(f, "interleave:{l}"),
            MemPolicy::Local => f.write_str("localalloc"),
            MemPolicy::Preferred(n) => write!(f, "preferred:{n}"),
            MemPolicy::Bind(l) => write!(f, "bind:{l}"),
            MemPolicy::PreferredMany(l) => write!(f, "preferred-many:{l}"),
            MemPolicy::WeightedInterleave(l) => write!(f, "weighted-interleave:{l}"),
            MemPolicy::Parts(o, None) => f.write_str(o.name()),
            MemPolicy::Parts(o, Some(l)) => write!(f, "{}:{l}", o.name()),
        }
    }
}

/// A policy resolved against a topology: the kernel mode and node set to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemPlan {
    /// Policy name as in the plan JSON: `first-touch`, `interleave`, `localalloc`, `preferred`,
    /// `bind`, `preferred-many`, `weighted-interleave`, `per-node`, `round-robin`.
    pub policy: &'static str,
    /// The nodes (empty for `first-touch` and `localalloc`).
    pub nodes: NodeSet,
}

impl MemPlan {
    /// First touch: the kernel default.
    pub fn first_touch() -> MemPlan {
        MemPlan {
            policy: "first-touch",
            nodes: NodeSet::new(),
        }
    }
    /// `bind:N` on one node (not checked against a topology).
    pub fn bind(node: u32) -> MemPlan {
        MemPlan {
            policy: "bind",
            nodes: NodeSet::single(node),
        }
    }
    /// `preferred:N` (not checked against a topology): a full node falls back instead of failing.
    pub fn preferred(node: u32) -> MemPlan {
        MemPlan {
            policy: "preferred",
            nodes: NodeSet::single(node),
        }
    }
    /// `interleave:NODES` (not checked against a topology).
    pub fn interleave(nodes: NodeSet) -> MemPlan {
        MemPlan {
            policy: "interleave",
            nodes,
        }
    }
    /// The kernel mode of this plan (`MPOL_BIND` for the parts of `per-node` and `round-robin`).
    pub fn mode(&self) -> i32 {
        mode_of(self.policy)
    }
    /// Whether applying it changes anything (first-touch is the kernel default).
    pub fn is_default(&self) -> bool {
        self.policy == "first-touch"
    }
    /// How parts are dealt to nodes, for `per-node` and `round-robin`; `None` for the others.
    pub fn part_order(&self) -> Option<PartOrder> {
        match self.policy {
            "per-node" => Some(PartOrder::Blocks),
            "round-robin" => Some(PartOrder::RoundRobin),
            _ => None,
        }
    }
    /// The plan of part `i` of a region split into `parts`: `bind` to the part's node for
    /// `per-node` and `round-robin` ([`PartOrder::node_index`]), this plan itself otherwise.
    pub fn part(&self, i: usize, parts: usize) -> MemPlan {
        match self.part_order() {
            Some(o) => {
                let k = o.node_index(i, parts, self.nodes.len());
                MemPlan::bind(self.nodes.iter().nth(k).expect("k < nodes"))
            }
            None => self.clone(),
        }
    }
    /// The one node part `i` of `parts` lives on, when the plan names one: a per-part policy,
    /// or `bind`/`preferred` to a single node. `None` for first touch, interleaving and sets.
    pub fn part_node(&self, i: usize, parts: usize) -> Option<u32> {
        let p = self.part(i, parts);
        (matches!(p.policy, "bind" | "preferred") && p.nodes.len() == 1)
            .then(|| p.nodes.first())
            .flatten()
    }
}

impl fmt::Display for MemPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nodes.is_empty() {
            f.write_str(self.policy)
        } else {
            write!(f, "{}:{}", self.policy, self.nodes)
        }
    }
}

/// Plan-JSON policy name of a kernel mode.
pub fn name_of_mode(m: i32) -> &'static str {
    match m {
        mode::MPOL_DEFAULT => "first-touch",
        mode::MPOL_PREFERRED => "preferred",
        mode::MPOL_BIND => "bind",
        mode::MPOL_INTERLEAVE => "interleave",
        mode::MPOL_LOCAL => "localalloc",
        mode::MPOL_PREFERRED_MANY => "preferred-many",
        mode::MPOL_WEIGHTED_INTERLEAVE => "weighted-interleave",
        _ => "unknown",
    }
}

/// Kernel mode of a plan-JSON policy name.
pub fn mode_of(name: &str) -> i32 {
    match name {
        "preferred" => mode::MPOL_PREFERRED,
        "bind" => mode::MPOL_BIND,
        "interleave" => mode::MPOL_INTERLEAVE,
        "localalloc" => mode::MPOL_LOCAL,
        "preferred-many" => mode::MPOL_PREFERRED_MANY,
        "weighted-interleave" => mode::MPOL_WEIGHTED_INTERLEAVE,
        "per-node" | "round-robin" => mode::MPOL_BIND,
        _ => mode::MPOL_DEFAULT,
    }
}

impl MemPolicy {
    /// Checks this policy against `topo`. Returns what will be applied and notes to print once.
    pub fn resolve(&self, topo: &Topology) -> Result<(MemPlan, Vec<String>), PolicyError> {
        let mut notes = Vec::new();
        let present = topo.node_ids();
        let usable = topo.allowed_mems();
        if usable.is_empty() {
            return Err(PolicyError(
                "no node with memory is allowed for this process".into(),
            ));
        }
        let nodes = |list: &str, what: &str, notes: &mut Vec<String>| {
            node_list(topo, list, what, &present, &usable, notes)
        };
        let plan = match self {
            MemPolicy::FirstTouch => MemPlan {
                policy: "first-touch",
                nodes: NodeSet::new(),
            },
            MemPolicy::Local => MemPlan {
                policy: "localalloc",
                nodes: NodeSet::new(),
            },
            MemPolicy::Interleave(list) => {
                let set = match list {
                    Some(l) => nodes(l, &self.to_string(), &mut notes)?,
                    None => usable.clone(),
                };
                if set.len() == 1 {
                    let n = set.first().unwrap();
                    notes.push(format!(
                        "{self}: interleaving over one node (node {n}) is the same as preferred:{n}; applied as preferred:{n}"
                    ));
                    MemPlan {
                        policy: "preferred",
                        nodes: set,
                    }
                } else {
                    MemPlan {
                        policy: "interleave",
                        nodes: set,
                    }
                }
            }
            MemPolicy::Preferred(n) => {
                check_node(topo, *n, &present, &usable, &self.to_string(), true)?;
                MemPlan {
                    policy: "preferred",
                    nodes: NodeSet::single(*n),
                }
            }
            MemPolicy::Bind(l) => MemPlan {
                policy: "bind",
                nodes: nodes(l, &self.to_string(), &mut notes)?,
            },
            MemPolicy::PreferredMany(l) => MemPlan {
                policy: "preferred-many",
                nodes: nodes(l, &self.to_string(), &mut notes)?,
            },
            MemPolicy::WeightedInterleave(l) => MemPlan {
                policy: "weighted-interleave",
                nodes: nodes(l, &self.to_string(), &mut notes)?,
            },
            MemPolicy::Parts(o, list) => MemPlan {
                policy: o.name(),
                nodes: match list {
                    Some(l) => nodes(l, &self.to_string(), &mut notes)?,
                    None => usable.clone(),
                },
            },
        };
        // A node that absorbed firmware duplicates (`Node::merged`) stands for all of them.
        let mut plan = plan;
        plan.nodes = plan
            .nodes
            .iter()
            .flat_map(|n| {
                topo.node(n)
                    .map_or_else(|| NodeSet::single(n), |x| x.kernel_ids())
                    .iter()
                    .collect::<Vec<_>>()
            })
            .collect();
        Ok((plan, notes))
    }
}

/// Parses and checks a node list; drops memoryless nodes with a note.
fn node_list(
    topo: &Topology,
    list: &str,
    what: &str,
    present: &NodeSet,
    usable: &NodeSet,
    notes: &mut Vec<String>,
) -> Result<NodeSet, PolicyError> {
    // `all` and `!LIST` range over the default memory set; named nodes are checked below.
    let set = NodeSet::parse_in(list, usable).map_err(|e| PolicyError(e.to_string()))?;
    for n in set.iter() {
        check_node(topo, n, present, usable, what, false)?;
    }
    // Named nodes need memory, not membership of the default set (GPU memory is named only).
    let memless: NodeSet = set
        .iter()
        .filter(|&n| topo.node(n).is_some_and(|x| x.memory_bytes == Some(0)))
        .collect();
    if set.is_empty() {
        return Err(PolicyError(format!(
            "{what}: node list `{list}` is empty; nodes with memory: {usable}"
        )));
    }
    let kept = set.difference(&memless);
    if kept.is_empty() {
        return Err(PolicyError(format!(
            "{what}: nodes {set} have no memory; nodes with memory: {usable}"
        )));
    }
    if !memless.is_empty() {
        notes.push(format!(
            "{what}: nodes {memless} have no memory and are left out; applied over nodes {kept}"
        ));
    }
    Ok(kept)
}

fn check_node(
    topo: &Topology,
    n: u32,
    present: &NodeSet,
    usable: &NodeSet,
    what: &str,
    need_memory: bool,
) -> Result<(), PolicyError> {
    let Some(node) = topo.node(n) else {
        return Err(PolicyError(format!(
            "{what}: node {n} is not present (present nodes: {present})"
        )));
    };
    if !node.allowed {
        return Err(PolicyError(format!(
            "{what}: node {n} is not allowed for this process (cgroup cpuset.mems / Mems_allowed); allowed nodes with memory: {usable}"
        )));
    }
    if need_memory && node.memory_bytes == Some(0) {
        return Err(PolicyError(format!(
            "{what}: node {n} has no memory; nodes with memory: {usable}"
        )));
    }
    Ok(())
}

/// Whether the running kernel accepts a policy mode (tried on a scratch thread, so the caller's
/// policy is untouched). `EINVAL` means the kernel predates the mode.
pub fn kernel_supports(mode: i32, nodes: &NodeSet) -> std::io::Result<bool> {
    let nodes = nodes.clone();
    std::thread::spawn(move || match crate::sys::set_mempolicy(mode, &nodes) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    })
    .join()
    .unwrap_or_else(|_| Err(std::io::Error::other("probe thread panicked")))
}

/// Errors when the running kernel lacks the plan's policy mode, naming the kernel version needed.
pub fn check_kernel(plan: &MemPlan) -> Result<(), PolicyError> {
    let need = match plan.policy {
        "preferred-many" => "5.15",
        "weighted-interleave" => "6.9",
        _ => return Ok(()),
    };
    match kernel_supports(plan.mode(), &plan.nodes) {
        Ok(true) => Ok(()),
        Ok(false) => Err(PolicyError(format!(
            "memory policy {} is not supported by this kernel (needs Linux {need} or later); use interleave:{} or bind:{} instead",
            plan.policy, plan.nodes, plan.nodes
        ))),
        Err(e) => Err(PolicyError(format!(
            "memory policy {plan} cannot be applied here: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::regular;

    #[test]
    fn per_part_policies_parse_print_and_resolve() {
        let topo = regular(4, 2, 1, 1);
        let plan = |s: &str| s.parse::<MemPolicy>().unwrap().resolve(&topo).unwrap().0;
        for (text, shown, policy, nodes) in [
            ("per-node", "per-node", "per-node", "0-3"),
            ("bind-per-node", "per-node", "per-node", "0-3"),
            ("per-node:1,3", "per-node:1,3", "per-node", "1,3"),
            ("round-robin", "round-robin", "round-robin", "0-3"),
            ("round-robin:!0", "round-robin:!0", "round-robin", "1-3"),
        ] {
            let m: MemPolicy = text.parse().unwrap();
            assert!(m.is_per_part(), "{text}");
            assert_eq!(m.to_string(), shown);
            let p = plan(text);
            assert_eq!((p.policy, p.nodes.to_string().as_str()), (policy, nodes));
            assert_eq!(p.mode(), mode::MPOL_BIND);
        }
        assert!(!"bind:0".parse::<MemPolicy>().unwrap().is_per_part());
        // Errors name the bad part and the valid choices or nodes.
        let e = "per-nod".parse::<MemPolicy>().unwrap_err().0;
        assert!(
            e.contains("per-nod") && e.contains(MemPolicy::CHOICES),
            "{e}"
        );
        let e = "per-node:".parse::<MemPolicy>().unwrap_err().0;
        assert!(e.contains("needs a node list"), "{e}");
        let e = "round-robin:x".parse::<MemPolicy>().unwrap_err().0;
        assert!(e.contains('x'), "{e}");
        let e = "per-node:0,9"
            .parse::<MemPolicy>()
            .unwrap()
            .resolve(&topo)
            .unwrap_err()
            .0;
        assert!(e.contains("node 9") && e.contains("0-3"), "{e}");
    }

    #[test]
    fn parts_map_to_nodes_in_blocks_or_round_robin() {
        let blocks: Vec<usize> = (0..8)
            .map(|i| PartOrder::Blocks.node_index(i, 8, 3))
            .collect();
        assert_eq!(blocks, [0, 0, 0, 1, 1, 1, 2, 2]);
        let rr: Vec<usize> = (0..5)
            .map(|i| PartOrder::RoundRobin.node_index(i, 5, 2))
            .collect();
        assert_eq!(rr, [0, 1, 0, 1, 0]);
        // Fewer parts than nodes: blocks spread them, one per node at most.
        assert_eq!(PartOrder::Blocks.node_index(1, 2, 4), 2);

        let per_node = MemPlan {
            policy: "per-node",
            nodes: NodeSet::parse("2,5,7").unwrap(),
        };
        assert_eq!(per_node.part(0, 6), MemPlan::bind(2));
        assert_eq!(per_node.part(3, 6), MemPlan::bind(5));
        assert_eq!(per_node.part_node(5, 6), Some(7));
        let rr = MemPlan {
            policy: "round-robin",
            ..per_node.clone()
        };
        assert_eq!(rr.part_node(4, 6), Some(5));
        // Other plans are the same for every part; only a single node is a part's node.
        let il = MemPlan::interleave(NodeSet::parse("0-1").unwrap());
        assert_eq!(il.part(3, 4), il);
        assert_eq!(il.part_node(3, 4), None);
        assert_eq!(MemPlan::preferred(3).part_node(0, 1), Some(3));
        assert_eq!(MemPlan::first_touch().part_node(0, 1), None);
        let two = MemPlan {
            policy: "bind",
            nodes: NodeSet::parse("0-1").unwrap(),
        };
        assert_eq!(two.part_node(0, 1), None);
    }

    #[test]
    fn an_empty_node_list_is_named() {
        let t = loci_topo::preset::build("xeon-silver-4114-2s").unwrap();
        for text in ["bind:!all", "interleave:!all", "preferred-many:!0-1"] {
            let e = text
                .parse::<MemPolicy>()
                .unwrap()
                .resolve(&t)
                .unwrap_err()
                .to_string();
            let list = text.split_once(':').unwrap().1;
            assert!(
                e.contains(&format!("node list `{list}` is empty")) && e.contains("0-1"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn kernel_support_detection() {
        let n = NodeSet::single(0);
        assert!(kernel_supports(mode::MPOL_INTERLEAVE, &n).unwrap());
        // A mode no kernel has: EINVAL, reported as unsupported rather than an error.
        assert!(!kernel_supports(99, &n).unwrap());
        let plan = MemPlan {
            policy: "bind",
            nodes: n,
        };
        assert!(check_kernel(&plan).is_ok());
    }
}
