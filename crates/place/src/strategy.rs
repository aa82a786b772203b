//! Thread strategies: where thread `i` of `n` runs.
//!
//! A strategy string is `NAME[@BIND]`:
//!
//! | name | thread `i` goes to |
//! |---|---|
//! | `os` | nowhere in particular: not pinned, the OS chooses among the allowed cpus |
//! | `compact` | the `i`-th cpu in compact order: node by node, inside a node one hardware thread of every physical core first, then the SMT siblings |
//! | `sparse` | round-robin over nodes: thread 0 on the first node, thread 1 on the next, ...; inside a node in compact order |
//! | `shared:G` | threads `G*k .. G*k+G-1` form group `k`; a group shares one node and, where it fits, one LLC; groups go round-robin over nodes |
//! | `random:SEED` | a shuffle of the allowed cpus, reproducible from `SEED` |
//! | `group` | a core group (the cpus sharing the last-level cache inside one node); groups are dealt round-robin, alternating nodes; the OS picks the cpu inside the group |
//! | `nodes:LIST` | round-robin over the listed nodes, bound to the whole node (like `numactl --cpunodebind`, one node per thread) |
//! | `cpus:LIST` | the `i`-th listed cpu (ascending) |
//!
//! Each strategy first picks one *anchor* cpu per thread; the binding granularity `@BIND` then
//! widens the anchor to the set the thread is bound to: `@cpu` (the anchor only), `@core` (its
//! SMT siblings), `@group` (its core group), `@node` (every allowed cpu of its node). Defaults:
//! `@node` for `nodes:`, `@group` for `group`, `@cpu` for everything else. Widening never leaves
//! the strategy's pool (the allowed cpus, or the listed cpus/nodes).
//!
//! Only allowed cpus (online, in the affinity mask and cgroup cpuset) are used. More threads than
//! cpus in the pool is an error unless oversubscription is requested; then anchors wrap around.
//! `os` pins nothing, so for it more threads than cpus is a note, not an error.

use std::fmt;
use std::str::FromStr;

use loci_topo::{CpuSet, IdSet, NodeSet, Topology};

/// How wide a thread's binding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bind {
    /// Exactly one cpu (hardware thread).
    Cpu,
    /// All SMT siblings of one physical core.
    Core,
    /// One core group: the cpus sharing the last-level cache inside one node.
    Group,
    /// All allowed cpus of one node.
    Node,
}

impl Bind {
    /// Valid spellings, for error messages.
    pub const CHOICES: &'static str = "cpu, core, group, node";

    /// The cpus a thread anchored at `anchor` is bound to on `topo`, among its allowed cpus (what
    /// a strategy's `@BIND` does to each of its anchors).
    pub fn widen(self, topo: &Topology, anchor: u32) -> CpuSet {
        let pool = topo.allowed_cpus();
        let groups = if self == Bind::Group {
            llc_groups(topo, &pool)
        } else {
            vec![]
        };
        widen(topo, &pool, &groups, self, anchor)
    }

    fn parse(s: &str) -> Result<Self, StrategyError> {
        match s {
            "cpu" => Ok(Bind::Cpu),
            "core" => Ok(Bind::Core),
            "group" => Ok(Bind::Group),
            "node" => Ok(Bind::Node),
            _ => Err(StrategyError::Syntax(format!(
                "unknown binding `@{s}`; valid: {}",
                Self::CHOICES
            ))),
        }
    }
}

impl FromStr for Bind {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Bind::parse(s.trim()).map_err(|_| {
            StrategyError::Syntax(format!(
                "unknown binding `{}`; valid: {}",
                s.trim(),
                Self::CHOICES
            ))
        })
    }
}

impl fmt::Display for Bind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Bind::Cpu => "cpu",
            Bind::Core => "core",
            Bind::Group => "group",
            Bind::Node => "node",
        })
    }
}

/// The kind of a strategy (without binding).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kind {
    Os,
    Compact,
    Sparse,
    /// Groups of this many threads share a node and LLC.
    Shared(usize),
    Random(u64),
    Group,
    /// A node list as written (may use `all` and `!`; resolved against the topology).
    Nodes(String),
    /// A cpu list as written (may use `all` and `!`; resolved against the topology).
    Cpus(String),
}

/// A thread strategy with its binding granularity: the value of `--threads`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Strategy {
    pub kind: Kind,
    /// Explicit `@BIND`; `None` = the strategy's default (see [`Strategy::bind`]).
    pub bind: Option<Bind>,
}

/// Bad strategy text, or a strategy that cannot be placed on a topology.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StrategyError {
    #[error("{0}")]
    Syntax(String),
    #[error("{0}")]
    Placement(String),
}

impl Strategy {
    /// Valid strategy forms, for error messages and `--help`.
    pub const CHOICES: &'static str =
        "os, compact, sparse, shared:G, random:SEED, group, nodes:LIST, cpus:LIST (each optionally @cpu|@core|@group|@node)";

    /// The binding in effect (explicit or the strategy's default).
    pub fn bind(&self) -> Bind {
        self.bind.unwrap_or(match self.kind {
            Kind::Nodes(_) => Bind::Node,
            Kind::Group => Bind::Group,
            _ => Bind::Cpu,
        })
    }

    /// Whether threads are pinned at all (`os` is not).
    pub fn pins(&self) -> bool {
        self.kind != Kind::Os
    }

    /// `os`: not pinned, the OS scheduler places the threads.
    pub fn os() -> Strategy {
        Strategy {
            kind: Kind::Os,
            bind: None,
        }
    }

    /// `compact`: fill one node's cores before the next.
    pub fn compact() -> Strategy {
        Strategy {
            kind: Kind::Compact,
            bind: None,
        }
    }

    /// `sparse`: spread over nodes round robin.
    pub fn sparse() -> Strategy {
        Strategy {
            kind: Kind::Sparse,
            bind: None,
        }
    }
}

impl FromStr for Strategy {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (body, bind) = match s.rsplit_once('@') {
            Some((b, g)) => (b, Some(Bind::parse(g)?)),
            None => (s, None),
        };
        let (name, arg) = match body.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (body, None),
        };
        let need = |what: &str| -> Result<&str, StrategyError> {
            match arg {
                Some(a) if !a.trim().is_empty() => Ok(a.trim()),
                _ => Err(StrategyError::Syntax(format!(
                    "strategy `{name}` needs {what} after `:` (e.g. `{name}:{}`)",
                    match name {
                        "shared" => "2",
                        "random" => "42",
                        "nodes" => "0-1",
                        _ => "0-3",
                    }
                ))),
            }
        };
        let no_arg = |k: Kind| -> Result<Kind, StrategyError> {
            match arg {
                None => Ok(k),
                Some(a) => Err(StrategyError::Syntax(format!(
                    "strategy `{name}` takes no argument, got `:{a}`"
                ))),
            }
        };
        let check_list = |l: &str| -> Result<String, StrategyError> {
            // Syntax check now; `all`/`!` are resolved against the machine when planning.
            let inner = l.strip_prefix('!').unwrap_or(l);
            if inner != "all" {
                IdSet::parse(inner).map_err(|e| StrategyError::Syntax(e.to_string()))?;
            }
            Ok(l.to_string())
        };
        let kind = match name {
            "os" => no_arg(Kind::Os)?,
            "compact" => no_arg(Kind::Compact)?,
            "sparse" | "scatter" => no_arg(Kind::Sparse)?,
            "group" => no_arg(Kind::Group)?,
            "shared" => {
                let g = need("a group size")?;
                let g: usize = g.parse().map_err(|_| {
                    StrategyError::Syntax(format!(
                        "`{g}` in `{s}` is not a group size (a positive integer)"
                    ))
                })?;
                if g == 0 {
                    return Err(StrategyError::Syntax(format!(
                        "group size in `{s}` must be at least 1"
                    )));
                }
                Kind::Shared(g)
            }
            "random" => {
                let v = need("a seed")?;
                Kind::Random(v.parse().map_err(|_| {
                    StrategyError::Syntax(format!(
                        "`{v}` in `{s}` is not a seed (a non-negative integer)"
                    ))
                })?)
            }
            "nodes" => Kind::Nodes(check_list(need("a node list")?)?),
            "cpus" => Kind::Cpus(check_list(need("a cpu list")?)?),
            _ => {
                return Err(StrategyError::Syntax(format!(
                    "unknown thread strategy `{name}`; valid: {}",
                    Self::CHOICES
                )))
            }
        };
        if kind == Kind::Os && bind.is_some() {
            return Err(StrategyError::Syntax(
                "`os` does not pin, so it takes no `@BIND`".into(),
            ));
        }
        Ok(Strategy { kind, bind })
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Os => f.write_str("os")?,
            Kind::Compact => f.write_str("compact")?,
            Kind::Sparse => f.write_str("sparse")?,
            Kind::Shared(g) => write!(f, "shared:{g}")?,
            Kind::Random(s) => write!(f, "random:{s}")?,
            Kind::Group => f.write_str("group")?,
            Kind::Nodes(l) => write!(f, "nodes:{l}")?,
            Kind::Cpus(l) => write!(f, "cpus:{l}")?,
        }
        if let Some(b) = self.bind {
            write!(f, "@{b}")?;
        }
        Ok(())
    }
}

/// Where one thread goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The cpus the thread is bound to (for `os`: every allowed cpu).
    pub cpus: CpuSet,
    /// The nodes of those cpus.
    pub nodes: NodeSet,
}

/// The cpus a strategy draws from, and the anchor cpu of each thread.
struct Anchors {
    pool: CpuSet,
    anchors: Vec<u32>,
    notes: Vec<String>,
}

/// Most threads one plan places (as many as cpu ids).
pub const MAX_THREADS: usize = 65_536;

/// Places `n` threads on `topo` with `strategy`. Returns one placement per thread and notes
/// (things the user should know that are not errors).
pub fn place_threads(
    topo: &Topology,
    strategy: &Strategy,
    n: usize,
    oversubscribe: bool,
) -> Result<(Vec<Placement>, Vec<String>), StrategyError> {
    if n == 0 || n > MAX_THREADS {
        return Err(StrategyError::Placement(format!(
            "{n} threads: the number of threads must be 1..={MAX_THREADS}"
        )));
    }
    let allowed = topo.allowed_cpus();
    if allowed.is_empty() {
        return Err(StrategyError::Placement(
            "this topology has no allowed online cpu".into(),
        ));
    }
    let pool = pool_of(topo, &strategy.kind, &allowed)?;
    if strategy.kind == Kind::Os {
        // Unpinned: every thread may run on every cpu, so more threads than cpus puts no two on
        // one cpu by our hand; the OS time-slices them, which is worth a note, not an error.
        let notes = if n > pool.len() {
            vec![format!(
                "{n} threads on {} cpus, not pinned: the OS time-slices them (seed 001: more busy threads than cores costs throughput)",
                pool.len()
            )]
        } else {
            vec![]
        };
        let p = Placement {
            nodes: nodes_of(topo, &pool),
            cpus: pool,
        };
        return Ok((vec![p; n], notes));
    }
    if n > pool.len() && !oversubscribe {
        return Err(StrategyError::Placement(format!(
            "{n} threads but strategy `{strategy}` has only {} allowed cpus ({}); pass --oversubscribe to put several threads on one cpu, or use fewer threads",
            pool.len(),
            pool
        )));
    }
    let Anchors {
        pool,
        anchors,
        notes,
    } = anchors(topo, strategy, n, pool, oversubscribe)?;
    let bind = strategy.bind();
    let groups = llc_groups(topo, &pool);
    let out = anchors
        .iter()
        .map(|&a| {
            let cpus = widen(topo, &pool, &groups, bind, a);
            Placement {
                nodes: nodes_of(topo, &cpus),
                cpus,
            }
        })
        .collect();
    Ok((out, notes))
}

fn nodes_of(topo: &Topology, cpus: &CpuSet) -> NodeSet {
    cpus.iter().filter_map(|c| topo.node_of_cpu(c)).collect()
}

fn pool_of(topo: &Topology, kind: &Kind, allowed: &CpuSet) -> Result<CpuSet, StrategyError> {
    match kind {
        Kind::Cpus(list) => {
            let present = topo.cpu_ids();
            // `all` and `!LIST` mean the allowed cpus; explicitly named cpus are checked below.
            let set = CpuSet::parse_in(list, allowed)
                .map_err(|e| StrategyError::Syntax(e.to_string()))?;
            if let Some(bad) = set.iter().find(|c| !present.contains(*c)) {
                return Err(StrategyError::Placement(format!(
                    "cpu {bad} is not present on this machine (present cpus: {present})"
                )));
            }
            let not_allowed = set.difference(allowed);
            if !not_allowed.is_empty() {
                return Err(StrategyError::Placement(format!(
                    "cpus {not_allowed} are not allowed for this process (allowed cpus: {allowed})"
                )));
            }
            if set.is_empty() {
                return Err(StrategyError::Placement(format!(
                    "cpu list `{list}` is empty"
                )));
            }
            Ok(set)
        }
        Kind::Nodes(list) => {
            let present = topo.node_ids();
            // `all` and `!LIST` mean the nodes with allowed cpus; named nodes are checked below.
            let usable: NodeSet = present
                .iter()
                .filter(|&n| !topo.allowed_cpus_of(n).is_empty())
                .collect();
            let set = NodeSet::parse_in(list, &usable)
                .map_err(|e| StrategyError::Syntax(e.to_string()))?;
            if let Some(bad) = set.iter().find(|n| !present.contains(*n)) {
                return Err(StrategyError::Placement(format!(
                    "node {bad} is not present on this machine (present nodes: {present})"
                )));
            }
            let mut pool = CpuSet::new();
            for node in set.iter() {
                let c = topo.allowed_cpus_of(node);
                if c.is_empty() {
                    let with: NodeSet = present
                        .iter()
                        .filter(|&n| !topo.allowed_cpus_of(n).is_empty())
                        .collect();
                    return Err(StrategyError::Placement(format!(
                        "node {node} has no allowed cpu (CPU-less or outside the cpuset); nodes with allowed cpus: {with}"
                    )));
                }
                pool = pool.union(&c);
            }
            if pool.is_empty() {
                return Err(StrategyError::Placement(format!(
                    "node list `{list}` is empty"
                )));
            }
            Ok(pool)
        }
        _ => Ok(allowed.clone()),
    }
}

/// Cpus of `pool` in compact order: by node (topology order, cpus without a node last), inside a
/// node the first hardware thread of every core before any second one.
pub fn compact_order(topo: &Topology, pool: &CpuSet) -> Vec<u32> {
    let node_rank = |c: u32| {
        topo.node_of_cpu(c)
            .and_then(|n| topo.node_index(n))
            .unwrap_or(usize::MAX)
    };
    let smt_rank = |c: u32| {
        topo.smt_siblings(c)
            .intersection(pool)
            .iter()
            .position(|s| s == c)
            .unwrap_or(0)
    };
    let mut v: Vec<u32> = pool.iter().collect();
    v.sort_by_key(|&c| (node_rank(c), smt_rank(c), c));
    v
}

/// Nodes (in topology order; `None` last) with their pool cpus in compact order.
fn per_node(topo: &Topology, pool: &CpuSet) -> Vec<Vec<u32>> {
    let mut out: Vec<(usize, Vec<u32>)> = Vec::new();
    for c in compact_order(topo, pool) {
        let r = topo
            .node_of_cpu(c)
            .and_then(|n| topo.node_index(n))
            .unwrap_or(usize::MAX);
        match out.iter_mut().find(|(k, _)| *k == r) {
            Some((_, v)) => v.push(c),
            None => out.push((r, vec![c])),
        }
    }
    out.into_iter().map(|(_, v)| v).collect()
}

/// LLC core groups restricted to `pool` (non-empty ones), each in compact order, with their node
/// (`None`: unknown). Every pool cpu is in a group: pool cpus that no node lists (a cpu whose node
/// is unknown, or one its node's cpu list leaves out, as an hwloc XML or a saved JSON may say)
/// come last, one group per physical core. Without them `group` placed no thread at all on such
/// a machine (found by the fuzz target `hwloc_xml`).
fn llc_groups(topo: &Topology, pool: &CpuSet) -> Vec<(Option<u32>, Vec<u32>)> {
    let groups = match topo.llc_level() {
        Some(l) => topo.core_groups(l),
        // No cache information: a core group is a whole node.
        None => topo
            .nodes
            .iter()
            .map(|n| loci_topo::CoreGroup {
                node: n.id,
                cpus: n.cpus.clone(),
            })
            .collect(),
    };
    let mut out: Vec<(Option<u32>, Vec<u32>)> = groups
        .into_iter()
        .filter_map(|g| {
            let c = g.cpus.intersection(pool);
            (!c.is_empty()).then(|| (Some(g.node), compact_order(topo, &c)))
        })
        .collect();
    let mut left = pool.clone();
    for (_, cpus) in &out {
        for &c in cpus {
            left.remove(c);
        }
    }
    for g in topo.split_by_core(&left) {
        let node = g.first().and_then(|c| topo.node_of_cpu(c));
        out.push((node, compact_order(topo, &g)));
    }
    out
}

/// Deals `n` items round-robin over buckets of the given capacities, skipping full buckets.
/// When every bucket is full it starts over (the caller has already refused that unless
/// oversubscription was asked for). Returns (bucket, slot inside the bucket) per item.
pub fn deal(capacities: &[usize], n: usize) -> Vec<(usize, usize)> {
    let mut used = vec![0usize; capacities.len()];
    let mut out = Vec::with_capacity(n);
    let mut b = 0usize;
    let total: usize = capacities.iter().sum();
    for i in 0..n {
        if total == 0 {
            break;
        }
        if i > 0 && i % total == 0 {
            used.iter_mut().for_each(|u| *u = 0);
            b = 0;
        }
        while used[b] >= capacities[b] {
            b = (b + 1) % capacities.len();
        }
        out.push((b, used[b]));
        used[b] += 1;
        b = (b + 1) % capacities.len();
    }
    out
}

/// splitmix64: a tiny, fully specified PRNG. Hand-written on purpose: `random:SEED` promises the
/// same placement for the same seed forever, which a library PRNG whose stream may change between
/// versions cannot promise.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn anchors(
    topo: &Topology,
    strategy: &Strategy,
    n: usize,
    pool: CpuSet,
    oversubscribe: bool,
) -> Result<Anchors, StrategyError> {
    let mut notes = Vec::new();
    let anchors: Vec<u32> = match &strategy.kind {
        Kind::Os => unreachable!("os has no anchors"),
        Kind::Compact => {
            let order = compact_order(topo, &pool);
            (0..n).map(|i| order[i % order.len()]).collect()
        }
        Kind::Cpus(_) => {
            let order: Vec<u32> = pool.iter().collect();
            (0..n).map(|i| order[i % order.len()]).collect()
        }
        Kind::Random(seed) => {
            let mut order: Vec<u32> = pool.iter().collect();
            let mut st = *seed;
            for i in (1..order.len()).rev() {
                let j = (splitmix64(&mut st) % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
            (0..n).map(|i| order[i % order.len()]).collect()
        }
        Kind::Sparse | Kind::Nodes(_) => {
            let nodes = per_node(topo, &pool);
            let caps: Vec<usize> = nodes.iter().map(|v| v.len()).collect();
            deal(&caps, n)
                .into_iter()
                .map(|(b, s)| nodes[b][s])
                .collect()
        }
        Kind::Group => {
            let groups = llc_groups(topo, &pool);
            // Alternate nodes: the first group of every node, then the second of every node...
            let mut order: Vec<usize> = (0..groups.len()).collect();
            let rank_in_node = |i: usize| groups[..i].iter().filter(|g| g.0 == groups[i].0).count();
            let node_rank = |i: usize| {
                groups[i]
                    .0
                    .and_then(|n| topo.node_index(n))
                    .unwrap_or(usize::MAX)
            };
            order.sort_by_key(|&i| (rank_in_node(i), node_rank(i)));
            let caps: Vec<usize> = order.iter().map(|&i| groups[i].1.len()).collect();
            deal(&caps, n)
                .into_iter()
                .map(|(b, s)| groups[order[b]].1[s])
                .collect()
        }
        Kind::Shared(g) => shared(topo, &pool, *g, n, oversubscribe, &mut notes)?,
    };
    Ok(Anchors {
        pool,
        anchors,
        notes,
    })
}

/// `shared:G`: group `k` (threads `G*k..G*k+G`) goes to node `k mod N` (skipping nodes without
/// `G` free cpus), inside it to the first LLC group with `G` free cpus, else to the node's next
/// free cpus in compact order (the group then spans LLCs, said in a note).
fn shared(
    topo: &Topology,
    pool: &CpuSet,
    g: usize,
    n: usize,
    oversubscribe: bool,
    notes: &mut Vec<String>,
) -> Result<Vec<u32>, StrategyError> {
    let nodes = per_node(topo, pool);
    let biggest = nodes.iter().map(|v| v.len()).max().unwrap_or(0);
    if g.min(n) > biggest {
        return Err(StrategyError::Placement(format!(
            "shared:{g}: a group of {g} threads cannot share one node: the largest node has {biggest} allowed cpus"
        )));
    }
    let groups = llc_groups(topo, pool);
    let mut free: Vec<bool> = vec![true; 0];
    let all: Vec<u32> = pool.iter().collect();
    let idx = |c: u32| all.binary_search(&c).unwrap();
    let reset = |free: &mut Vec<bool>| *free = vec![true; all.len()];
    reset(&mut free);
    let mut out = Vec::with_capacity(n);
    let mut next_node = 0usize;
    let mut spanned = false;
    let ngroups = n.div_ceil(g);
    for k in 0..ngroups {
        let size = g.min(n - k * g);
        // Find a node with `size` free cpus, starting at next_node.
        let count_free =
            |free: &Vec<bool>, v: &Vec<u32>| v.iter().filter(|&&c| free[idx(c)]).count();
        let find = |free: &Vec<bool>| {
            (0..nodes.len())
                .map(|t| (next_node + t) % nodes.len())
                .find(|&b| count_free(free, &nodes[b]) >= size)
        };
        let b = match find(&free) {
            Some(b) => b,
            None if oversubscribe => {
                // Every node is too full for a whole group: start over (cpus get shared).
                reset(&mut free);
                find(&free).expect("a node holds a whole group (checked above)")
            }
            None => {
                return Err(StrategyError::Placement(format!(
                    "shared:{g}: {n} threads do not fit in groups of {g} that each stay on one node (allowed cpus per node: {}); use fewer threads or --oversubscribe",
                    nodes.iter().map(|v| v.len().to_string()).collect::<Vec<_>>().join(", ")
                )))
            }
        };
        next_node = b + 1;
        let node_id = topo.node_of_cpu(nodes[b][0]);
        let in_llc = groups
            .iter()
            .filter(|(nid, cpus)| *nid == node_id && cpus.iter().all(|c| nodes[b].contains(c)))
            .find(|(_, cpus)| count_free(&free, cpus) >= size);
        let cpus: Vec<u32> = match in_llc {
            Some((_, cpus)) => cpus
                .iter()
                .copied()
                .filter(|&c| free[idx(c)])
                .take(size)
                .collect(),
            None => {
                spanned = true;
                nodes[b]
                    .iter()
                    .copied()
                    .filter(|&c| free[idx(c)])
                    .take(size)
                    .collect()
            }
        };
        for &c in &cpus {
            free[idx(c)] = false;
        }
        out.extend(cpus);
    }
    if spanned {
        notes.push(format!(
            "shared:{g}: some groups do not fit in one last-level cache and span several inside their node"
        ));
    }
    Ok(out)
}

fn widen(
    topo: &Topology,
    pool: &CpuSet,
    groups: &[(Option<u32>, Vec<u32>)],
    bind: Bind,
    anchor: u32,
) -> CpuSet {
    match bind {
        Bind::Cpu => CpuSet::single(anchor),
        Bind::Core => topo.smt_siblings(anchor).intersection(pool),
        Bind::Group => groups
            .iter()
            .find(|(_, c)| c.contains(&anchor))
            .map(|(_, c)| c.iter().copied().collect())
            .unwrap_or_else(|| CpuSet::single(anchor)),
        Bind::Node => match topo.node_of_cpu(anchor) {
            Some(n) => topo.allowed_cpus_of(n).intersection(pool),
            None => CpuSet::single(anchor),
        },
    }
}
