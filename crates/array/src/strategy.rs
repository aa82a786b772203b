//! How the threads of a subarray run are placed (seed 000's strategies), and how each choice
//! becomes a loci-place [`Plan`].
//!
//! | `--threads` | plan |
//! |---|---|
//! | `os`, `compact`, `sparse`, `shared:G`, `random:SEED`, `group`, `nodes:LIST`, `cpus:LIST`, each optionally `@BIND` | the loci-place strategy itself, as `loci plan --threads` spells it |
//! | `shared` | loci-place `shared:G` with `G` = threads per chunk the query touches (threads that work on the same chunk share a node) |
//! | `best-of:K` | search: the best of `K` random plans (loci-place `random:0` .. `random:K-1`), each measured once: what seed 000 did with K = 20 |
//! | `elastic` | search: all threads bound to a growing set of active cpus (compact order, one node at a time); grows while the run gets faster, keeps the best (the idea of seed 000's Petri-net baseline) |
//! | `search` | search: the placement search of [`crate::search()`], started from a cached winner when there is one |
//!
//! Strategies cost no trial; the searches evaluate plans (measured runs here, modeled costs on
//! presets) and report every trial.

use std::fmt;
use std::str::FromStr;

use loci_place::strategy::{compact_order, Kind};
use loci_place::{Plan, Strategy};
use loci_topo::Topology;

use crate::error::ArrayError;
use crate::pin;
use crate::search::{
    home_cpus, home_cpus_weighted, one_node_cpus, search, Evaluator, SearchCache, SearchConfig,
    Trial,
};

/// A search over plans: it tries several and keeps the fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlanSearch {
    /// `best-of:K`: the best of this many random plans.
    BestOf(usize),
    /// `elastic`: a growing set of cpus shared by all threads.
    Elastic,
    /// `search`: the placement search.
    Search,
}

/// How the threads of a subarray run are placed: the value of `loci bench subarray --threads`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ThreadPlacement {
    /// A loci-place strategy (no trial).
    Strategy(Strategy),
    /// `shared`: loci-place `shared:G` with `G` = threads per touched chunk.
    SharedPerChunk,
    /// A search (trials).
    Search(PlanSearch),
}

impl ThreadPlacement {
    /// `search`.
    pub const SEARCH: ThreadPlacement = ThreadPlacement::Search(PlanSearch::Search);
    /// What `loci bench subarray` runs by default: seed 000's strategies and the searches.
    pub const DEFAULTS: &'static str = "os,compact,sparse,shared,best-of:20,elastic,search";

    /// Valid spellings, for errors and `--help`.
    pub fn choices() -> String {
        format!(
            "{}; shared (G = threads per touched chunk); searches: best-of:K, elastic, search",
            Strategy::CHOICES
        )
    }

    /// Whether choosing the plan needs trials.
    pub fn adaptive(&self) -> bool {
        matches!(self, ThreadPlacement::Search(_))
    }

    /// Parses a comma-separated list (`os,compact,best-of:20,search`).
    pub fn parse_list(s: &str) -> Result<Vec<Self>, ArrayError> {
        s.split(',')
            .filter(|x| !x.trim().is_empty())
            .map(str::parse)
            .collect()
    }
}

impl FromStr for ThreadPlacement {
    type Err = ArrayError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let bad = |why: String| ArrayError::Parse(format!("thread strategy `{s}`: {why}"));
        let name = s.split([':', '@']).next().unwrap_or(s);
        // What follows the name: ``, `:ARG`, `@BIND` or `:ARG@BIND`.
        let rest = &s[name.len()..];
        let search = |p: PlanSearch| match rest {
            "" => Ok(ThreadPlacement::Search(p)),
            _ => Err(bad(format!(
                "`{name}` is a search and takes nothing after its name, got `{rest}`"
            ))),
        };
        match (name, rest.strip_prefix(':')) {
            ("shared", _) if rest.is_empty() => Ok(ThreadPlacement::SharedPerChunk),
            ("best-of", Some(k)) => match k.parse::<usize>() {
                Ok(k) if k >= 1 => Ok(ThreadPlacement::Search(PlanSearch::BestOf(k))),
                _ => Err(bad(format!(
                    "`{k}` is not a number of random plans to try (a positive integer)"
                ))),
            },
            ("best-of", None) => Err(bad(
                "needs the number of random plans to try, e.g. `best-of:20`".into(),
            )),
            ("elastic", _) => search(PlanSearch::Elastic),
            ("search", _) => search(PlanSearch::Search),
            // `random:K` was the best of K before it meant loci-place's seed: say so.
            ("random", None) => Err(bad(
                "needs a seed, e.g. `random:7` (one random plan); the best of K random plans is `best-of:K`"
                    .into(),
            )),
            ("place", Some(spec)) => Err(bad(format!(
                "the `place:` prefix is gone: write the loci-place strategy itself, `{spec}`"
            ))),
            _ => s.parse::<Strategy>().map(ThreadPlacement::Strategy).map_err(|e| {
                if e.to_string().starts_with("unknown thread strategy") {
                    ArrayError::Parse(format!(
                        "unknown thread strategy `{s}`; valid: {}",
                        Self::choices()
                    ))
                } else {
                    bad(e.to_string())
                }
            }),
        }
    }
}

impl fmt::Display for PlanSearch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanSearch::BestOf(k) => write!(f, "best-of:{k}"),
            PlanSearch::Elastic => f.write_str("elastic"),
            PlanSearch::Search => f.write_str("search"),
        }
    }
}

impl fmt::Display for ThreadPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThreadPlacement::Strategy(s) => s.fmt(f),
            ThreadPlacement::SharedPerChunk => f.write_str("shared"),
            ThreadPlacement::Search(p) => p.fmt(f),
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

/// A chosen plan and how it was chosen.
#[derive(Debug, Clone)]
pub struct Choice {
    pub plan: Plan,
    /// What the plan is (`compact`, `random:13`, `elastic:8 cpus`, a search move...).
    pub label: String,
    /// Every evaluation made to choose (empty for strategies).
    pub trials: Vec<Trial>,
    /// Whether `search` started from a cached winner.
    pub from_cache: bool,
    /// Things to tell the user once (a corrupt cache, for example).
    pub notes: Vec<String>,
}

impl Choice {
    /// A choice without trials.
    fn of(plan: Plan, label: String, notes: Vec<String>) -> Self {
        Choice {
            plan,
            label,
            trials: vec![],
            from_cache: false,
            notes,
        }
    }

    /// The cheapest of `trials` (at least one), keeping every trial.
    fn best_of(trials: Vec<Trial>) -> Self {
        let b = trials
            .iter()
            .min_by(|a, b| a.cost.total_cmp(&b.cost))
            .expect("at least one trial")
            .clone();
        Choice {
            trials,
            ..Choice::of(b.plan, b.label, vec![])
        }
    }
}

fn kind(k: Kind) -> Strategy {
    Strategy {
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

/// The loci-place strategy of a placement (`shared` resolved to `shared:G`; `None` for the
/// searches).
pub fn strategy_of(
    topo: &Topology,
    p: &ThreadPlacement,
    threads: usize,
    info: &RunInfo,
) -> Option<Strategy> {
    match p {
        ThreadPlacement::Strategy(s) => Some(s.clone()),
        ThreadPlacement::SharedPerChunk => {
            Some(kind(Kind::Shared(shared_group(topo, threads, info.chunks))))
        }
        ThreadPlacement::Search(_) => None,
    }
}

/// The starting candidates of `search`: a cached winner, the data-aware `home` placement, the
/// strategies `compact`, `sparse` and `shared`, and whole-node subsets of the nodes holding most
/// data.
pub fn search_candidates(
    topo: &Topology,
    threads: usize,
    info: &RunInfo,
    cached: Option<Plan>,
) -> Result<Vec<(String, Plan)>, ArrayError> {
    let mut out = Vec::new();
    if let Some(p) = cached {
        out.push(("cache".to_string(), p));
    }
    if let Some(h) = &info.bytes_by_node {
        // Two weights of node load against distance besides none: heavy (writers keep off busy
        // memory) and light (mostly distance, but no second thread on a core while a core is
        // idle).
        for (label, cpus) in [
            ("home", home_cpus(topo, h)),
            ("home-balanced", home_cpus_weighted(topo, h, 10.0)),
            ("home-balanced-light", home_cpus_weighted(topo, h, 2.0)),
        ] {
            out.push((label.to_string(), pin::plan_on_cpus(topo, &cpus)?));
        }
    }
    for s in [
        ThreadPlacement::Strategy(Strategy::compact()),
        ThreadPlacement::Strategy(Strategy::sparse()),
        ThreadPlacement::SharedPerChunk,
    ] {
        if let Some(st) = strategy_of(topo, &s, threads, info) {
            out.push((s.to_string(), pin::plan(topo, &st, threads)?));
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
        if let Some(cpus) = one_node_cpus(topo, n, threads) {
            out.push((format!("node {n}"), pin::plan_on_cpus(topo, &cpus)?));
        }
    }
    Ok(out)
}

/// Chooses the plan of `placement` for `threads` threads. Searches call `eval` for each trial;
/// `search` reads and updates `cache` when given.
pub fn choose(
    topo: &Topology,
    placement: &ThreadPlacement,
    threads: usize,
    info: &RunInfo,
    eval: &mut dyn Evaluator,
    cache: Option<&mut SearchCache>,
    cfg: &SearchConfig,
) -> Result<Choice, ArrayError> {
    let search_kind = match placement {
        ThreadPlacement::Search(k) => *k,
        _ => {
            let s = strategy_of(topo, placement, threads, info).expect("not a search");
            let mut notes = vec![];
            if let Kind::Random(seed) = s.kind {
                notes.push(format!(
                    "`random:{seed}` is one random plan (seed {seed}); the best of {seed} random plans is `best-of:{seed}`"
                ));
            }
            return Ok(Choice::of(
                pin::plan(topo, &s, threads)?,
                placement.to_string(),
                notes,
            ));
        }
    };
    let mut trial = |label: String, plan: Plan| -> Result<Trial, ArrayError> {
        let cost = eval.eval(&plan)?;
        Ok(Trial { label, plan, cost })
    };
    match search_kind {
        PlanSearch::BestOf(k) => {
            let trials = (0..k as u64)
                .map(|seed| {
                    let p = pin::plan(topo, &kind(Kind::Random(seed)), threads)?;
                    trial(format!("random:{seed}"), p)
                })
                .collect::<Result<_, _>>()?;
            Ok(Choice::best_of(trials))
        }
        PlanSearch::Elastic => {
            let order = compact_order(topo, &topo.allowed_cpus());
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
                let t = trial(
                    format!("elastic:{k} cpus"),
                    pin::plan_on(topo, vec![set; threads])?,
                )?;
                let better = trials
                    .last()
                    .is_none_or(|last| t.cost < last.cost * (1.0 - cfg.tolerance.max(0.0)));
                trials.push(t);
                // Grow while it pays; stop at the first step that does not, or when all are on.
                if !better || k >= order.len() || trials.len() >= cfg.budget.max(1) {
                    break;
                }
                k = (k + step).min(order.len());
            }
            Ok(Choice::best_of(trials))
        }
        PlanSearch::Search => {
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
                trials: out.trials,
                from_cache: out.from_cache,
                ..Choice::of(
                    out.best.plan.clone(),
                    format!("search ({})", out.best.label),
                    notes,
                )
            })
        }
    }
}
