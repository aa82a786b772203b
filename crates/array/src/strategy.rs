//! The thread strategies of the subarray workload (seed 000) and how each one picks a pinning.
//!
//! | strategy | pinning |
//! |---|---|
//! | `os` | not pinned: the OS places the threads (the baseline) |
//! | `compact` | loci-place `compact`: fill node 0's cores, then node 1's, ... |
//! | `sparse` | loci-place `sparse`: thread `i` on node `i mod N` |
//! | `shared` | loci-place `shared:G` with `G` = threads per chunk the query touches (threads that work on the same chunk share a node); `shared:G` fixes `G` |
//! | `random:K` | the best of `K` seeded random pinnings (loci-place `random:0` .. `random:K-1`), each measured once: what seed 000 did with K = 20 |
//! | `elastic` | all threads bound to a growing set of active cpus (compact order, one node at a time); grows while the run gets faster, keeps the best (the idea of seed 000's Petri-net baseline) |
//! | `search` | the placement search of [`crate::search`], started from a cached winner when there is one |
//! | `place:SPEC` | any other loci-place strategy, e.g. `place:cpus:0-3`, `place:random:7` |
//!
//! Static strategies cost no trial; `random:K`, `elastic` and `search` evaluate pinnings (measured
//! runs here, modeled costs on presets) and report every trial.

use std::fmt;
use std::str::FromStr;

use loci_place::strategy::{place_threads, Kind};
use loci_topo::Topology;

use crate::error::ArrayError;
use crate::pin::Pinning;
use crate::search::{
    home_pinning, home_pinning_weighted, node_pinning, search, Evaluator, SearchCache,
    SearchConfig, Trial,
};

/// A thread strategy of the subarray workload.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ThreadStrategy {
    Os,
    Compact,
    Sparse,
    /// Group size, or `None` for threads per touched chunk.
    Shared(Option<usize>),
    /// Best of this many random pinnings.
    Random(usize),
    Elastic,
    Search,
    /// Any loci-place strategy.
    Place(loci_place::Strategy),
}

impl ThreadStrategy {
    /// Valid spellings, for errors and `--help`.
    pub const CHOICES: &'static str =
        "os, compact, sparse, shared[:G], random:K, elastic, search, place:SPEC";

    /// Whether choosing the pinning needs trials.
    pub fn adaptive(&self) -> bool {
        matches!(
            self,
            ThreadStrategy::Random(_) | ThreadStrategy::Elastic | ThreadStrategy::Search
        )
    }

    /// Parses a comma-separated list (`os,compact,random:20,search`).
    pub fn parse_list(s: &str) -> Result<Vec<Self>, ArrayError> {
        s.split(',')
            .filter(|x| !x.trim().is_empty())
            .map(str::parse)
            .collect()
    }
}

impl FromStr for ThreadStrategy {
    type Err = ArrayError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let bad = |why: String| ArrayError::Parse(format!("thread strategy `{s}`: {why}"));
        let num = |v: &str, what: &str| -> Result<usize, ArrayError> {
            match v.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(bad(format!("`{v}` is not a {what} (a positive integer)"))),
            }
        };
        if let Some(spec) = s.strip_prefix("place:") {
            return spec
                .parse::<loci_place::Strategy>()
                .map(ThreadStrategy::Place)
                .map_err(|e| bad(e.to_string()));
        }
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        Ok(match (name, arg) {
            ("os", None) => ThreadStrategy::Os,
            ("compact", None) => ThreadStrategy::Compact,
            ("sparse", None) => ThreadStrategy::Sparse,
            ("shared", None) => ThreadStrategy::Shared(None),
            ("shared", Some(g)) => ThreadStrategy::Shared(Some(num(g, "group size")?)),
            ("random", Some(k)) => ThreadStrategy::Random(num(k, "number of pinnings")?),
            ("random", None) => {
                return Err(bad(
                    "needs the number of pinnings to try, e.g. `random:20`".into()
                ))
            }
            ("elastic", None) => ThreadStrategy::Elastic,
            ("search", None) => ThreadStrategy::Search,
            _ => {
                return Err(ArrayError::Parse(format!(
                    "unknown thread strategy `{s}`; valid: {}",
                    Self::CHOICES
                )))
            }
        })
    }
}

impl fmt::Display for ThreadStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThreadStrategy::Os => f.write_str("os"),
            ThreadStrategy::Compact => f.write_str("compact"),
            ThreadStrategy::Sparse => f.write_str("sparse"),
            ThreadStrategy::Shared(None) => f.write_str("shared"),
            ThreadStrategy::Shared(Some(g)) => write!(f, "shared:{g}"),
            ThreadStrategy::Random(k) => write!(f, "random:{k}"),
            ThreadStrategy::Elastic => f.write_str("elastic"),
            ThreadStrategy::Search => f.write_str("search"),
            ThreadStrategy::Place(p) => write!(f, "place:{p}"),
        }
    }
}

/// What the strategies may know about the run.
#[derive(Debug, Clone, Default)]
pub struct RunInfo {
    /// Chunks the query touches (for `shared`).
    pub chunks: usize,
    /// Each thread's bytes by source node, when the chunk homes are known (for `search`).
    pub bytes_by_node: Option<Vec<Vec<(u32, f64)>>>,
    /// A description of the workload, the cache key of `search` together with the machine.
    pub workload: String,
}

/// A chosen pinning and how it was chosen.
#[derive(Debug, Clone)]
pub struct Choice {
    pub pinning: Pinning,
    /// What the pinning is (`compact`, `random:13`, `elastic:8 cpus`, a search move...).
    pub label: String,
    /// Every evaluation made to choose (empty for static strategies).
    pub trials: Vec<Trial>,
    /// Whether `search` started from a cached winner.
    pub from_cache: bool,
    /// Things to tell the user once (a corrupt cache, for example).
    pub notes: Vec<String>,
}

impl Choice {
    /// The cheapest of `trials` (at least one), keeping every trial.
    fn best_of(trials: Vec<Trial>) -> Self {
        let b = trials
            .iter()
            .min_by(|a, b| a.cost.total_cmp(&b.cost))
            .expect("at least one trial")
            .clone();
        Choice {
            pinning: b.pinning,
            label: b.label,
            trials,
            from_cache: false,
            notes: vec![],
        }
    }
}

/// A loci-place strategy as a pinning of `threads` threads (oversubscribing when there are more
/// threads than cpus, as a database's worker pool would).
pub fn place_pinning(
    topo: &Topology,
    s: &loci_place::Strategy,
    threads: usize,
) -> Result<Pinning, ArrayError> {
    let (places, _notes) = place_threads(topo, s, threads, true)
        .map_err(|e| ArrayError::Parse(format!("thread strategy `{s}`: {e}")))?;
    Ok(Pinning {
        threads: places
            .into_iter()
            .map(|p| s.pins().then_some(p.cpus))
            .collect(),
    })
}

fn kind(k: Kind) -> loci_place::Strategy {
    loci_place::Strategy {
        kind: k,
        bind: None,
    }
}

/// The group size of `shared`: threads per touched chunk, at least 1 and at most the cpus of the
/// largest node (a group must fit on one node).
pub fn shared_group(topo: &Topology, threads: usize, chunks: usize) -> usize {
    let node_max = topo
        .nodes
        .iter()
        .map(|n| topo.allowed_cpus_of(n.id).len())
        .max()
        .unwrap_or(1)
        .max(1);
    (threads / chunks.max(1)).clamp(1, node_max)
}

/// The pinning of a static strategy (`None` for the adaptive ones).
pub fn static_pinning(
    topo: &Topology,
    s: &ThreadStrategy,
    threads: usize,
    info: &RunInfo,
) -> Result<Option<Pinning>, ArrayError> {
    let p = match s {
        ThreadStrategy::Os => kind(Kind::Os),
        ThreadStrategy::Compact => kind(Kind::Compact),
        ThreadStrategy::Sparse => kind(Kind::Sparse),
        ThreadStrategy::Shared(g) => kind(Kind::Shared(
            g.unwrap_or_else(|| shared_group(topo, threads, info.chunks)),
        )),
        ThreadStrategy::Place(p) => p.clone(),
        _ => return Ok(None),
    };
    place_pinning(topo, &p, threads).map(Some)
}

/// The starting candidates of `search`: a cached winner, the data-aware `home` placement, the
/// static strategies, and whole-node subsets of the nodes holding most data.
pub fn search_candidates(
    topo: &Topology,
    threads: usize,
    info: &RunInfo,
    cached: Option<Pinning>,
) -> Result<Vec<(String, Pinning)>, ArrayError> {
    let mut out = Vec::new();
    if let Some(p) = cached {
        out.push(("cache".to_string(), p));
    }
    if let Some(h) = &info.bytes_by_node {
        out.push(("home".to_string(), home_pinning(topo, h)));
        // Two weights of node load against distance: heavy (writers keep off busy memory)
        // and light (mostly distance, but no second thread on a core while a core is idle).
        out.push((
            "home-balanced".to_string(),
            home_pinning_weighted(topo, h, 10.0),
        ));
        out.push((
            "home-balanced-light".to_string(),
            home_pinning_weighted(topo, h, 2.0),
        ));
    }
    for s in [
        ThreadStrategy::Compact,
        ThreadStrategy::Sparse,
        ThreadStrategy::Shared(None),
    ] {
        if let Some(p) = static_pinning(topo, &s, threads, info)? {
            out.push((s.to_string(), p));
        }
    }
    // Whole-node subsets, nodes with most data first (all nodes in order when homes are unknown).
    let mut by_bytes: Vec<(u32, f64)> = topo.nodes.iter().map(|n| (n.id, 0.0)).collect();
    if let Some(h) = &info.bytes_by_node {
        for row in h {
            for &(n, b) in row {
                if let Some(e) = by_bytes.iter_mut().find(|e| e.0 == n) {
                    e.1 += b;
                }
            }
        }
    }
    by_bytes.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    for (n, _) in by_bytes.into_iter().take(2) {
        if let Some(p) = node_pinning(topo, n, threads) {
            out.push((format!("node {n}"), p));
        }
    }
    Ok(out)
}

/// Chooses the pinning of `strategy` for `threads` threads. Adaptive strategies call `eval` for
/// each trial; `search` reads and updates `cache` when given.
pub fn choose(
    topo: &Topology,
    strategy: &ThreadStrategy,
    threads: usize,
    info: &RunInfo,
    eval: &mut dyn Evaluator,
    cache: Option<&mut SearchCache>,
    cfg: &SearchConfig,
) -> Result<Choice, ArrayError> {
    if let Some(p) = static_pinning(topo, strategy, threads, info)? {
        return Ok(Choice {
            pinning: p,
            label: strategy.to_string(),
            trials: vec![],
            from_cache: false,
            notes: vec![],
        });
    }
    match strategy {
        ThreadStrategy::Random(k) => {
            let mut trials = Vec::with_capacity(*k);
            for seed in 0..*k as u64 {
                let p = place_pinning(topo, &kind(Kind::Random(seed)), threads)?;
                let cost = eval.eval(&p)?;
                trials.push(Trial {
                    label: format!("random:{seed}"),
                    pinning: p,
                    cost,
                });
            }
            Ok(Choice::best_of(trials))
        }
        ThreadStrategy::Elastic => {
            let order: Vec<u32> =
                place_pinning(topo, &kind(Kind::Compact), topo.allowed_cpus().len())?
                    .single_cpus()
                    .unwrap_or_default();
            let step = topo
                .nodes
                .iter()
                .map(|n| topo.allowed_cpus_of(n.id).len())
                .filter(|&c| c > 0)
                .min()
                .unwrap_or(1);
            let mut trials: Vec<Trial> = Vec::new();
            let mut k = step.min(order.len());
            loop {
                let set: loci_topo::CpuSet = order[..k].iter().copied().collect();
                let p = Pinning {
                    threads: vec![Some(set); threads],
                };
                let cost = eval.eval(&p)?;
                let better = trials
                    .last()
                    .is_none_or(|last| cost < last.cost * (1.0 - cfg.tolerance.max(0.0)));
                trials.push(Trial {
                    label: format!("elastic:{k} cpus"),
                    pinning: p,
                    cost,
                });
                // Grow while it pays; stop at the first step that does not, or when all are on.
                if !better || k >= order.len() || trials.len() >= cfg.budget.max(1) {
                    break;
                }
                k = (k + step).min(order.len());
            }
            Ok(Choice::best_of(trials))
        }
        ThreadStrategy::Search => {
            let mut notes = Vec::new();
            let cached = cache.as_ref().and_then(|c| {
                if let Some(w) = &c.warning {
                    notes.push(w.clone());
                }
                c.get(topo, &info.workload, threads)
            });
            let cands = search_candidates(topo, threads, info, cached)?;
            let out = search(topo, &cands, info.bytes_by_node.as_deref(), eval, cfg)?;
            if let Some(c) = cache {
                c.put(topo, &info.workload, &out);
                if let Err(e) = c.save() {
                    notes.push(e.to_string());
                }
            }
            Ok(Choice {
                pinning: out.best.pinning.clone(),
                label: format!("search ({})", out.best.label),
                trials: out.trials,
                from_cache: out.from_cache,
                notes,
            })
        }
        _ => unreachable!("static strategies returned above"),
    }
}
