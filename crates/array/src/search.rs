//! `search`: an online search over thread placements that starts from topology- and data-derived
//! candidates and hill-climbs from the best one, with a per-machine, per-workload cache of
//! winners so the next run starts where the last one ended.
//!
//! Every evaluation is one **trial** (a measured run, or a MODELED cost on a machine loci is not
//! on; see [`crate::model`]). The search:
//! 1. evaluates the starting candidates in order (a cached winner first, then the caller's list:
//!    data-aware `home`, `home-balanced`, `compact`, `sparse`, `shared`, whole-node subsets...),
//!    skipping duplicates; threads without known bytes (a small query has fewer parts than
//!    threads) go last, onto cores of their own, so they never halve a working thread's core;
//!    with more threads than cpus, the surplus goes onto the cores of the threads with the
//!    least work;
//! 2. hill-climbs from the best. Kinds of move, each list most promising first: (1) a thread to
//!    the node holding most of its bytes, or trading places with a thread there; (2) balancing
//!    the memory nodes: moves and swaps off the busiest node whose shift of write load is closest
//!    to half the gap to a less busy node; (3) a thread off a shared core; (4) a thread to another
//!    node, nearest first, and random swaps. The kinds take turns (the kind that last paid off
//!    first, the one that last went only sideways last), and the first move better by more than
//!    the noise tolerance is taken; with a noiseless cost, a few equal moves in a row are taken
//!    too (plateaus). With more threads than cpus, a thread may move onto the least busy cpu of
//!    a node;
//! 3. stops at the trial budget or at a local optimum (a full round of moves without a gain).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use loci_topo::{CpuSet, Topology};
use serde::{Deserialize, Serialize};

use crate::error::ArrayError;
use crate::model::{modeled_cpus, CostModel, ModelWorkload};
use crate::pin;
use crate::seismic::mix64;
use loci_place::Plan;

/// Something that can say how long a run takes under a plan (lower is better).
pub trait Evaluator {
    /// Seconds (measured or modeled) of one run under `p`.
    fn eval(&mut self, p: &Plan) -> Result<f64, ArrayError>;
    /// Whether the seconds are modeled rather than measured.
    fn modeled(&self) -> bool;
}

/// The cost model as an evaluator.
pub struct ModelEval<'a> {
    pub model: CostModel,
    pub topo: &'a Topology,
    pub workload: &'a ModelWorkload,
}

impl Evaluator for ModelEval<'_> {
    fn eval(&mut self, p: &Plan) -> Result<f64, ArrayError> {
        Ok(self.model.cost(self.topo, self.workload, p))
    }
    fn modeled(&self) -> bool {
        true
    }
}

/// One evaluated placement.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// Where it came from: a candidate name, `cache`, or the move that produced it.
    pub label: String,
    pub plan: Plan,
    pub cost: f64,
}

/// Search parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchConfig {
    /// Most trials (evaluations) in total.
    pub budget: usize,
    /// Seed of the order of the random moves.
    pub seed: u64,
    /// A move is taken only if it is faster by more than this fraction (0 for a model; a few
    /// percent for measurements, so noise is not chased).
    pub tolerance: f64,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            budget: 19,
            seed: 1,
            tolerance: 0.0,
        }
    }
}

/// What a search found and how.
#[derive(Debug, Clone)]
pub struct SearchOutcome {
    pub best: Trial,
    /// Every trial in order.
    pub trials: Vec<Trial>,
    /// Whether the first trial was a cached winner.
    pub from_cache: bool,
    /// Whether the costs are modeled.
    pub modeled: bool,
}

impl SearchOutcome {
    /// The number of trials after which the best so far was at most `target` (1-based).
    pub fn trials_to_reach(&self, target: f64) -> Option<usize> {
        let mut best = f64::INFINITY;
        for (i, t) in self.trials.iter().enumerate() {
            best = best.min(t.cost);
            if best <= target {
                return Some(i + 1);
            }
        }
        None
    }
}

/// Physical core of a cpu (package, core).
fn core_of(topo: &Topology, c: u32) -> (u32, u32) {
    topo.cpu(c).map(|x| (x.package, x.core)).unwrap_or((0, c))
}

/// Allowed cpus of a node in compact order: one hardware thread of every core first, then the
/// siblings.
fn node_cpus_compact(topo: &Topology, node: u32) -> Vec<u32> {
    let cpus: Vec<u32> = topo.allowed_cpus_of(node).iter().collect();
    let mut seen = std::collections::HashSet::new();
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for c in cpus {
        if seen.insert(core_of(topo, c)) {
            first.push(c);
        } else {
            rest.push(c);
        }
    }
    first.extend(rest);
    first
}

/// Nodes with allowed cpus, nearest to `from` first.
fn nodes_by_distance(topo: &Topology, from: u32) -> Vec<u32> {
    let mut v: Vec<u32> = topo
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|&n| !topo.allowed_cpus_of(n).is_empty())
        .collect();
    v.sort_by_key(|&n| (topo.distance(from, n).unwrap_or(u32::MAX), n));
    v
}

/// Data-aware placement: threads in order of their bytes (biggest first) each take a free cpu
/// of the node with the lowest distance-weighted read cost `sum(bytes on n * distance(node, n))`
/// (ties: the node with more free cpus, then the lower id), filling a node in compact order.
/// Threads with no known bytes (a small query has fewer parts than threads) are placed last,
/// each on a core no other thread uses while there is one (node with most such cores first), so
/// that they never share a core with a thread that works. With more threads than cpus, a thread
/// that finds no free cpu joins the core whose slowest thread would finish soonest with it there
/// (so the biggest threads keep a core each and the surplus shares cores with the smallest).
pub fn home_cpus(topo: &Topology, bytes_by_node: &[Vec<(u32, f64)>]) -> Vec<u32> {
    home_cpus_weighted(topo, bytes_by_node, 0.0)
}

/// Like [`home_cpus`], plus `alpha` x the bytes each node's memory already serves (source
/// bytes read from it and result bytes written by the threads placed there so far) in a node's
/// score, so that writers spread away from busy memory. `alpha = 10` weighs a byte of node load
/// like a byte read locally (distance 10).
pub fn home_cpus_weighted(
    topo: &Topology,
    bytes_by_node: &[Vec<(u32, f64)>],
    alpha: f64,
) -> Vec<u32> {
    let mut load: BTreeMap<u32, f64> = BTreeMap::new();
    for row in bytes_by_node {
        for &(n, b) in row {
            *load.entry(n).or_default() += b;
        }
    }
    let mut free: BTreeMap<u32, Vec<u32>> = topo
        .nodes
        .iter()
        .map(|n| {
            let mut v = node_cpus_compact(topo, n.id);
            v.reverse(); // pop() takes from the front of compact order
            (n.id, v)
        })
        .collect();
    let all: Vec<u32> = topo.allowed_cpus().iter().collect();
    let total = |t: usize| -> f64 { bytes_by_node[t].iter().map(|e| e.1).sum() };
    let mut order: Vec<usize> = (0..bytes_by_node.len()).collect();
    order.sort_by(|&a, &b| total(b).total_cmp(&total(a)).then(a.cmp(&b)));
    let mut out = vec![0u32; bytes_by_node.len()];
    // Threads per physical core and the largest copy work among them (read slowed by distance,
    // plus the local write; the cost model's terms): where surplus threads go when every cpu is
    // taken.
    let mut on_core: BTreeMap<(u32, u32), (usize, f64)> = BTreeMap::new();
    let work = |t: usize, c: u32| -> f64 {
        let n = topo.node_of_cpu(c).unwrap_or(0);
        let read: f64 = bytes_by_node[t]
            .iter()
            .map(|&(m, b)| b * topo.distance(n, m).unwrap_or(10) as f64 / 10.0)
            .sum();
        0.5 * read + 0.5 * total(t)
    };
    // More threads than cpus: a cpu of the core where the slowest thread finishes soonest with
    // t added (k threads on a core each get about 1/k of it, so its slowest takes about k x its
    // work; SMT's extra yield is left out); ties to the lower work of t there (its data's node),
    // then the lower cpu id.
    let surplus_cpu = |t: usize, on_core: &BTreeMap<(u32, u32), (usize, f64)>| -> u32 {
        all.iter()
            .map(|&c| {
                let (k, w) = on_core.get(&core_of(topo, c)).copied().unwrap_or((0, 0.0));
                let mine = work(t, c);
                ((k + 1) as f64 * w.max(mine), mine, c)
            })
            .min_by(|a, b| {
                a.0.total_cmp(&b.0)
                    .then(a.1.total_cmp(&b.1))
                    .then(a.2.cmp(&b.2))
            })
            .map(|e| e.2)
            .unwrap_or(all[t % all.len()])
    };
    let mut busy: std::collections::HashSet<(u32, u32)> = std::collections::HashSet::new();
    let (working, idle): (Vec<usize>, Vec<usize>) =
        order.into_iter().partition(|&t| total(t) > 0.0);
    for t in working {
        let row = &bytes_by_node[t];
        let score = |n: u32| -> f64 {
            row.iter()
                .map(|&(m, b)| b * topo.distance(n, m).unwrap_or(10) as f64)
                .sum::<f64>()
                + alpha * (load.get(&n).copied().unwrap_or(0.0) + total(t))
        };
        // The next cpu of a node sharing a core already in use costs like a second copy.
        let smt = |v: &Vec<u32>| -> f64 {
            match v.last() {
                Some(&c) if alpha > 0.0 && busy.contains(&core_of(topo, c)) => alpha * total(t),
                _ => 0.0,
            }
        };
        let best = free
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(&n, v)| (n, score(n) + smt(v), v.len()))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)))
            .map(|e| e.0);
        if let Some(n) = best {
            *load.entry(n).or_default() += total(t);
        }
        out[t] = match best.and_then(|n| free.get_mut(&n).and_then(|v| v.pop())) {
            Some(c) => {
                busy.insert(core_of(topo, c));
                c
            }
            None => surplus_cpu(t, &on_core),
        };
        let e = on_core.entry(core_of(topo, out[t])).or_default();
        e.0 += 1;
        e.1 = e.1.max(work(t, out[t]));
    }
    for t in idle {
        out[t] = match take_idle_core_cpu(topo, &mut free, &mut busy) {
            Some(c) => c,
            None => surplus_cpu(t, &on_core),
        };
        on_core.entry(core_of(topo, out[t])).or_default().0 += 1;
    }
    out
}

/// Takes a free cpu for a thread without work: on a core nobody uses (from the node with most
/// such cores, ties to the lower id), else the next free cpu of the node with most free cpus.
/// `free` holds each node's free cpus in reverse compact order (as [`home_cpus_weighted`]
/// keeps them); `busy` the cores in use, updated.
fn take_idle_core_cpu(
    topo: &Topology,
    free: &mut BTreeMap<u32, Vec<u32>>,
    busy: &mut std::collections::HashSet<(u32, u32)>,
) -> Option<u32> {
    let idle_cores = |v: &Vec<u32>| -> usize {
        let mut cores: Vec<(u32, u32)> = v
            .iter()
            .map(|&c| core_of(topo, c))
            .filter(|k| !busy.contains(k))
            .collect();
        cores.sort_unstable();
        cores.dedup();
        cores.len()
    };
    let pick = free
        .iter()
        .map(|(&n, v)| (n, idle_cores(v), v.len()))
        .filter(|e| e.2 > 0)
        .max_by(|a, b| a.1.cmp(&b.1).then(a.2.cmp(&b.2)).then(b.0.cmp(&a.0)))?;
    let v = free.get_mut(&pick.0)?;
    // The last free cpu (front of compact order) whose core is idle, else the last one.
    let i = v
        .iter()
        .rposition(|&c| !busy.contains(&core_of(topo, c)))
        .unwrap_or(v.len() - 1);
    let c = v.remove(i);
    busy.insert(core_of(topo, c));
    Some(c)
}

/// Every thread on the cpus of one node, in compact order (wrapping when there are more threads).
pub fn one_node_cpus(topo: &Topology, node: u32, threads: usize) -> Option<Vec<u32>> {
    let cpus = node_cpus_compact(topo, node);
    if cpus.is_empty() {
        return None;
    }
    Some((0..threads).map(|i| cpus[i % cpus.len()]).collect())
}

/// Each thread's cpus, `None` where the plan does not pin: the identity of a plan for the search
/// (two candidates with the same are one) and the form of a cached winner.
fn cpu_lists(p: &Plan) -> Vec<Option<CpuSet>> {
    p.threads
        .iter()
        .map(|t| p.pinned.then(|| t.cpus.clone()))
        .collect()
}

/// A deterministic pseudo-random sequence (SplitMix64 over a counter).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix64(self.0)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Moves from `cur` (one cpu per thread), most promising first.
fn moves(
    topo: &Topology,
    cur: &[u32],
    hint: Option<&[Vec<(u32, f64)>]>,
    rng: &mut Rng,
) -> Vec<(u8, String, Vec<u32>)> {
    let node = |c: u32| topo.node_of_cpu(c).unwrap_or(0);
    let used: std::collections::HashSet<u32> = cur.iter().copied().collect();
    let free_on = |n: u32| -> Vec<u32> {
        node_cpus_compact(topo, n)
            .into_iter()
            .filter(|c| !used.contains(c))
            .collect()
    };
    // More threads than cpus: no cpu is ever free, so a thread moves onto the cpu of the
    // target node that runs the fewest threads.
    let oversubscribed = cur.len() > topo.allowed_cpus().len();
    let mut per_cpu: BTreeMap<u32, usize> = BTreeMap::new();
    for &c in cur {
        *per_cpu.entry(c).or_default() += 1;
    }
    // A free cpu on node n, preferring one whose core is idle.
    let pick = |n: u32| -> Option<u32> {
        let busy: std::collections::HashSet<(u32, u32)> =
            cur.iter().map(|&c| core_of(topo, c)).collect();
        let f = free_on(n);
        f.iter()
            .copied()
            .find(|&c| !busy.contains(&core_of(topo, c)))
            .or(f.first().copied())
            .or_else(|| {
                oversubscribed
                    .then(|| {
                        node_cpus_compact(topo, n)
                            .into_iter()
                            .min_by_key(|c| per_cpu.get(c).copied().unwrap_or(0))
                    })
                    .flatten()
            })
    };
    let mut out = Vec::new();
    let t_count = cur.len();
    // 1. Onto the node holding most of the thread's bytes, most bytes to gain first.
    if let Some(h) = hint {
        let mut order: Vec<(usize, u32, f64)> = (0..t_count)
            .filter_map(|t| {
                let row = h.get(t)?;
                let total: f64 = row.iter().map(|e| e.1).sum();
                let (best, b) = row.iter().max_by(|a, b| a.1.total_cmp(&b.1))?;
                let here: f64 = row
                    .iter()
                    .filter(|e| e.0 == node(cur[t]))
                    .map(|e| e.1)
                    .sum();
                (*best != node(cur[t])).then_some((t, *best, b - here + 1e-9 * total))
            })
            .collect();
        order.sort_by(|a, b| b.2.total_cmp(&a.2));
        for (t, n, _) in order {
            if let Some(c) = pick(n) {
                let mut p = cur.to_vec();
                p[t] = c;
                out.push((1, format!("t{t}->home node {n} (cpu {c})"), p));
            }
            {
                // Or trade places with the thread there that has the fewest bytes on that node
                // (keeps the number of threads per node).
                let on_n = |u: usize| -> f64 {
                    h.get(u)
                        .map(|r| r.iter().filter(|e| e.0 == n).map(|e| e.1).sum())
                        .unwrap_or(0.0)
                };
                if let Some(u) = (0..t_count)
                    .filter(|&u| node(cur[u]) == n && u != t && on_n(u) < on_n(t))
                    .min_by(|&a, &b| on_n(a).total_cmp(&on_n(b)))
                {
                    let mut p = cur.to_vec();
                    p.swap(t, u);
                    out.push((1, format!("swap t{t},t{u} (t{t} to home node {n})"), p));
                }
            }
        }
    }
    // 1b. Balance the memory nodes (load estimated from the hint: bytes read from a node plus
    // result bytes written by the threads on it). Moving a thread of `b` bytes from the busiest
    // node to another shifts `b` of write load; swapping two shifts their difference. Either
    // helps only while the shift is below the gap between the two nodes, and helps most at
    // half the gap, so the shifts closest to half the gap are tried first (the biggest writer
    // alone usually overshoots).
    if let Some(h) = hint {
        let total =
            |t: usize| -> f64 { h.get(t).map(|r| r.iter().map(|e| e.1).sum()).unwrap_or(0.0) };
        let mut load: BTreeMap<u32, f64> = BTreeMap::new();
        for n in nodes_by_distance(topo, node(cur[0])) {
            load.insert(n, 0.0);
        }
        for (t, &c) in cur.iter().enumerate() {
            *load.entry(node(c)).or_default() += total(t);
            for &(n, b) in h.get(t).map(Vec::as_slice).unwrap_or(&[]) {
                *load.entry(n).or_default() += b;
            }
        }
        if let Some((&busy, &top)) = load.iter().max_by(|a, b| a.1.total_cmp(b.1)) {
            let mut others: Vec<(u32, f64)> = load
                .iter()
                .filter(|e| *e.0 != busy && !topo.allowed_cpus_of(*e.0).is_empty())
                .map(|(&n, &l)| (n, l))
                .collect();
            others.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            let on: Vec<usize> = (0..t_count).filter(|&t| node(cur[t]) == busy).collect();
            let mut shifts: Vec<(f64, String, Vec<u32>)> = Vec::new();
            for &(to, l) in others.iter().take(2) {
                let gap = top - l;
                let half = gap / 2.0;
                for &a in &on {
                    if total(a) > 0.0 && total(a) < gap {
                        if let Some(c) = pick(to) {
                            let mut p = cur.to_vec();
                            p[a] = c;
                            shifts.push((
                                (total(a) - half).abs(),
                                format!("t{a} off busy node {busy} -> cpu {c}"),
                                p,
                            ));
                        }
                    }
                    for b in (0..t_count).filter(|&b| node(cur[b]) == to) {
                        let d = total(a) - total(b);
                        if d > 0.0 && d < gap {
                            let mut p = cur.to_vec();
                            p.swap(a, b);
                            shifts.push((
                                (d - half).abs(),
                                format!("swap t{a},t{b} (unload node {busy})"),
                                p,
                            ));
                        }
                    }
                }
            }
            shifts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut tried = std::collections::HashSet::new();
            for (_, label, p) in shifts {
                if tried.len() >= 6 {
                    break;
                }
                if tried.insert(p.clone()) {
                    out.push((2, label, p));
                }
            }
        }
    }
    // 2. Off a shared core onto an idle core of the same node, else of the nearest node.
    let mut per_core: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    for &c in cur {
        *per_core.entry(core_of(topo, c)).or_default() += 1;
    }
    for t in 0..t_count {
        if per_core[&core_of(topo, cur[t])] > 1 {
            for n in nodes_by_distance(topo, node(cur[t])) {
                let busy: std::collections::HashSet<(u32, u32)> =
                    cur.iter().map(|&c| core_of(topo, c)).collect();
                if let Some(c) = free_on(n)
                    .into_iter()
                    .find(|&c| !busy.contains(&core_of(topo, c)))
                {
                    let mut p = cur.to_vec();
                    p[t] = c;
                    out.push((3, format!("t{t} off shared core -> cpu {c}"), p));
                    break;
                }
            }
        }
    }
    // 3. A thread to another node (random thread order, nearest nodes first); 4. swaps.
    let mut ts: Vec<usize> = (0..t_count).collect();
    for i in (1..ts.len()).rev() {
        ts.swap(i, rng.below(i + 1));
    }
    for &t in &ts {
        for n in nodes_by_distance(topo, node(cur[t])).into_iter().skip(1) {
            if let Some(c) = pick(n) {
                let mut p = cur.to_vec();
                p[t] = c;
                out.push((4, format!("t{t} -> node {n} (cpu {c})"), p));
            }
        }
    }
    for _ in 0..t_count * 2 {
        let (a, b) = (rng.below(t_count), rng.below(t_count));
        if node(cur[a]) != node(cur[b]) {
            let mut p = cur.to_vec();
            p.swap(a, b);
            out.push((4, format!("swap t{a},t{b}"), p));
        }
    }
    out
}

/// Runs the search. `candidates` are the starting points in order (name, plan); `hint` is
/// each thread's bytes by source node when known (enables the data-aware moves).
pub fn search(
    topo: &Topology,
    candidates: &[(String, Plan)],
    hint: Option<&[Vec<(u32, f64)>]>,
    eval: &mut dyn Evaluator,
    cfg: &SearchConfig,
) -> Result<SearchOutcome, ArrayError> {
    let Some(threads) = candidates.first().map(|c| c.1.threads.len()) else {
        return Err(ArrayError::Parse(
            "search needs at least one starting candidate".into(),
        ));
    };
    if candidates.iter().any(|c| c.1.threads.len() != threads) {
        return Err(ArrayError::Parse(
            "search candidates disagree on the thread count".into(),
        ));
    }
    let budget = cfg.budget.max(1);
    let mut trials: Vec<Trial> = Vec::new();
    let mut seen: std::collections::HashSet<Vec<Option<CpuSet>>> = std::collections::HashSet::new();
    for (label, p) in candidates {
        if trials.len() >= budget {
            break;
        }
        if !seen.insert(cpu_lists(p)) {
            continue;
        }
        let cost = eval.eval(p)?;
        trials.push(Trial {
            label: label.clone(),
            plan: p.clone(),
            cost,
        });
    }
    let best_of = |ts: &[Trial]| -> Trial {
        ts.iter()
            .min_by(|a, b| a.cost.total_cmp(&b.cost))
            .expect("at least one trial")
            .clone()
    };
    let mut best = best_of(&trials);
    let mut rng = Rng(cfg.seed);
    // Hill climbing on one cpu per thread (sets are spread as the model spreads them).
    let mut cur: Vec<u32> =
        pin::single_cpus(&best.plan).unwrap_or_else(|| modeled_cpus(topo, &best.plan));
    // The kind of move that last paid off is tried first in the next round.
    let mut prefer: Option<u8> = None;
    // The kind of move that last went sideways (tried last in the next round).
    let mut demote: Option<u8> = None;
    let mut flat = 0;
    'climb: while trials.len() < budget {
        let mut improved = false;
        let ms = moves(topo, &cur, hint, &mut rng);
        // The kinds take turns (the first move of every kind, then the second of every kind,
        // ...), the kind that last paid off first in each turn and the one that last went
        // sideways last, so that no single kind with many moves spends the whole budget.
        let mut nth: BTreeMap<u8, usize> = BTreeMap::new();
        let mut keyed: Vec<_> = ms
            .into_iter()
            .map(|m| {
                let k = nth.entry(m.0).or_default();
                *k += 1;
                let class = if Some(m.0) == prefer {
                    0
                } else if Some(m.0) == demote {
                    2
                } else {
                    1
                };
                ((*k, class, m.0), m)
            })
            .collect();
        keyed.sort_by_key(|e| e.0);
        let ms: Vec<(u8, String, Vec<u32>)> = keyed.into_iter().map(|e| e.1).collect();
        for (kind, label, cand) in ms {
            if trials.len() >= budget {
                break 'climb;
            }
            let p = pin::plan_on_cpus(topo, &cand)?;
            if !seen.insert(cpu_lists(&p)) {
                continue;
            }
            let cost = eval.eval(&p)?;
            let t = Trial {
                label,
                plan: p,
                cost,
            };
            trials.push(t.clone());
            // Plateaus: with a noiseless cost, an equal move is taken too (a few in a row),
            // since two moves are often needed where one alone changes nothing (the slowest
            // thread is still the same).
            let sideways = cfg.tolerance == 0.0 && cost <= best.cost && flat < 4;
            if cost < best.cost * (1.0 - cfg.tolerance) || sideways {
                // Only a real gain makes its kind of move the first to try next round: a
                // sideways step says nothing about which kind of move pays.
                if cost < best.cost {
                    flat = 0;
                    prefer = Some(kind);
                    demote = None;
                } else {
                    // A sideways step: let the other kinds of move go first next round, so
                    // one kind cannot spend the budget wandering on a plateau.
                    flat += 1;
                    demote = Some(kind);
                    if prefer == demote {
                        prefer = None;
                    }
                }
                best = t;
                cur = cand;
                improved = true;
                break;
            }
        }
        if !improved {
            break;
        }
    }
    let from_cache = candidates.first().is_some_and(|c| c.0 == "cache");
    Ok(SearchOutcome {
        best,
        trials,
        from_cache,
        modeled: eval.modeled(),
    })
}

/// FNV-1a, 64 bit: a stable hash for fingerprints (std's hasher may change between releases).
pub fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Fingerprint of a machine: nodes, cpus (id, core, package, node, allowed) and distances.
pub fn machine_fingerprint(topo: &Topology) -> String {
    let mut s = String::new();
    for n in &topo.nodes {
        s += &format!("n{}:{};", n.id, n.cpus);
    }
    for c in &topo.cpus {
        s += &format!(
            "c{}:{}:{}:{:?}:{};",
            c.id,
            c.core,
            c.package,
            c.node,
            c.allowed && c.online
        );
    }
    s += &format!("{:?}", topo.distances);
    format!("{:016x}", fnv64(s.as_bytes()))
}

/// A cached winner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheEntry {
    /// One cpu list per thread (`null` = unpinned).
    pub threads: Vec<Option<CpuSet>>,
    pub cost: f64,
    pub modeled: bool,
    pub trials: usize,
    /// Human-readable descriptions of what was fingerprinted.
    pub machine: String,
    pub workload: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct CacheFile {
    version: u32,
    entries: BTreeMap<String, CacheEntry>,
}

/// The winners cache: a small JSON file, by default `${XDG_CACHE_HOME:-~/.cache}/loci/search.json`.
/// Keys are `MACHINE-FINGERPRINT/WORKLOAD-FINGERPRINT`.
pub struct SearchCache {
    path: PathBuf,
    file: CacheFile,
    /// What went wrong reading it (a corrupt file is ignored and rewritten on save).
    pub warning: Option<String>,
}

impl SearchCache {
    /// The default path (`$XDG_CACHE_HOME/loci/search.json`, else `$HOME/.cache/loci/search.json`).
    pub fn default_path() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("loci").join("search.json"))
    }

    /// Opens (or starts) the cache at `path`. A missing file is an empty cache; an unreadable or
    /// corrupt one is also empty, with [`SearchCache::warning`] saying why.
    pub fn open(path: &Path) -> Self {
        let mut warning = None;
        let file = match std::fs::read_to_string(path) {
            Ok(text) => match serde_json::from_str::<CacheFile>(&text) {
                Ok(f) => f,
                Err(e) => {
                    warning = Some(format!(
                        "search cache {} is not valid ({e}); starting a new one",
                        path.display()
                    ));
                    CacheFile::default()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => CacheFile::default(),
            Err(e) => {
                warning = Some(format!("cannot read search cache {}: {e}", path.display()));
                CacheFile::default()
            }
        };
        Self {
            path: path.to_path_buf(),
            file,
            warning,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The key of a machine and a workload description.
    pub fn key(topo: &Topology, workload: &str) -> String {
        format!(
            "{}/{:016x}",
            machine_fingerprint(topo),
            fnv64(workload.as_bytes())
        )
    }

    /// The cached winner for this machine and workload, if its thread count matches and its
    /// cpus are still allowed.
    pub fn get(&self, topo: &Topology, workload: &str, threads: usize) -> Option<Plan> {
        let e = self.file.entries.get(&Self::key(topo, workload))?;
        if e.threads.len() != threads {
            return None;
        }
        let sets: Option<Vec<CpuSet>> = e.threads.iter().cloned().collect();
        match sets {
            Some(sets) => pin::plan_on(topo, sets).ok(),
            None if e.threads.iter().all(Option::is_none) => pin::unpinned(topo, threads).ok(),
            None => None,
        }
    }

    /// Records a winner (in memory; [`SearchCache::save`] writes it).
    pub fn put(&mut self, topo: &Topology, workload: &str, out: &SearchOutcome) {
        self.file.version = 1;
        self.file.entries.insert(
            Self::key(topo, workload),
            CacheEntry {
                threads: cpu_lists(&out.best.plan),
                cost: out.best.cost,
                modeled: out.modeled,
                trials: out.trials.len(),
                machine: topo.source.clone(),
                workload: workload.to_string(),
            },
        );
    }

    /// Writes the file atomically (temporary file + rename), creating the directory.
    pub fn save(&self) -> Result<(), ArrayError> {
        let err = |e: std::io::Error| {
            ArrayError::Io(format!(
                "cannot write search cache {}: {e}",
                self.path.display()
            ))
        };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let tmp = self
            .path
            .with_extension(format!("json.tmp{}", std::process::id()));
        let text = serde_json::to_string_pretty(&self.file).expect("cache serializes");
        std::fs::write(&tmp, text + "\n").map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)
    }
}
