//! `search`: an online search over thread placements that starts from topology- and data-derived
//! candidates and hill-climbs from the best one, with a per-machine, per-workload cache of
//! winners so the next run starts where the last one ended.
//!
//! Every evaluation is one **trial** (a measured run, or a modeled cost on a machine loci is not
//! on). The search:
//! 1. evaluates the starting candidates in order (a cached winner first, then the caller's list:
//!    data-aware `home`, `compact`, `sparse`, `shared`, whole-node subsets...), skipping
//!    duplicates;
//! 2. hill-climbs from the best: moves are tried in the order most likely to help (move a thread
//!    onto the node that holds most of its bytes; move a thread off a core it shares; move a
//!    thread to a free cpu of another node, nearest first; swap two threads on different nodes),
//!    taking the first move that improves by more than the noise tolerance;
//! 3. stops at the trial budget or at a local optimum (a full round of moves without a gain).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use loci_topo::{CpuSet, Topology};
use serde::{Deserialize, Serialize};

use crate::error::ArrayError;
use crate::model::{modeled_cpus, CostModel, ModelWorkload};
use crate::pin::Pinning;
use crate::seismic::mix64;

/// Something that can say how long a run takes under a pinning (lower is better).
pub trait Evaluator {
    /// Seconds (measured or modeled) of one run under `p`.
    fn eval(&mut self, p: &Pinning) -> Result<f64, ArrayError>;
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
    fn eval(&mut self, p: &Pinning) -> Result<f64, ArrayError> {
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
    pub pinning: Pinning,
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
/// (ties: the node with more free cpus, then the lower id), filling a node in compact order;
/// threads with no known bytes go where there is most room.
pub fn home_pinning(topo: &Topology, bytes_by_node: &[Vec<(u32, f64)>]) -> Pinning {
    home_pinning_weighted(topo, bytes_by_node, 0.0)
}

/// Like [`home_pinning`], plus `alpha` x the bytes each node's memory already serves (source
/// bytes read from it and result bytes written by the threads placed there so far) in a node's
/// score, so that writers spread away from busy memory. `alpha = 10` weighs a byte of node load
/// like a byte read locally (distance 10).
pub fn home_pinning_weighted(
    topo: &Topology,
    bytes_by_node: &[Vec<(u32, f64)>],
    alpha: f64,
) -> Pinning {
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
    let mut busy: std::collections::HashSet<(u32, u32)> = std::collections::HashSet::new();
    for t in order {
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
            // More threads than cpus: wrap around.
            None => all[t % all.len()],
        };
    }
    Pinning::on_cpus(&out)
}

/// Every thread on the cpus of one node, in compact order (wrapping when there are more threads).
pub fn node_pinning(topo: &Topology, node: u32, threads: usize) -> Option<Pinning> {
    let cpus = node_cpus_compact(topo, node);
    if cpus.is_empty() {
        return None;
    }
    Some(Pinning::on_cpus(
        &(0..threads)
            .map(|i| cpus[i % cpus.len()])
            .collect::<Vec<_>>(),
    ))
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
    // A free cpu on node n, preferring one whose core is idle.
    let pick = |n: u32| -> Option<u32> {
        let busy: std::collections::HashSet<(u32, u32)> =
            cur.iter().map(|&c| core_of(topo, c)).collect();
        let f = free_on(n);
        f.iter()
            .copied()
            .find(|&c| !busy.contains(&core_of(topo, c)))
            .or(f.first().copied())
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
    // 1b. Unload the busiest memory node (estimated from the hint: bytes read from a node plus
    // result bytes written by the threads on it): its biggest writers swap with the smallest
    // threads elsewhere, or move to a free cpu nearby.
    if let Some(h) = hint {
        let total =
            |t: usize| -> f64 { h.get(t).map(|r| r.iter().map(|e| e.1).sum()).unwrap_or(0.0) };
        let mut load: BTreeMap<u32, f64> = BTreeMap::new();
        for (t, &c) in cur.iter().enumerate() {
            *load.entry(node(c)).or_default() += total(t);
            for &(n, b) in h.get(t).map(Vec::as_slice).unwrap_or(&[]) {
                *load.entry(n).or_default() += b;
            }
        }
        if let Some((&busy, _)) = load.iter().max_by(|a, b| a.1.total_cmp(b.1)) {
            let mut on: Vec<usize> = (0..t_count).filter(|&t| node(cur[t]) == busy).collect();
            let mut off: Vec<usize> = (0..t_count).filter(|&t| node(cur[t]) != busy).collect();
            on.sort_by(|&a, &b| total(b).total_cmp(&total(a)));
            off.sort_by(|&a, &b| total(a).total_cmp(&total(b)));
            for &a in on.iter().take(3) {
                for &b in off.iter().take(3) {
                    if total(a) > total(b) {
                        let mut p = cur.to_vec();
                        p.swap(a, b);
                        out.push((2, format!("swap t{a},t{b} (unload node {busy})"), p));
                    }
                }
                for n in nodes_by_distance(topo, busy).into_iter().skip(1).take(2) {
                    if let Some(c) = pick(n) {
                        let mut p = cur.to_vec();
                        p[a] = c;
                        out.push((2, format!("t{a} off busy node {busy} -> cpu {c}"), p));
                    }
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

/// Runs the search. `candidates` are the starting points in order (name, pinning); `hint` is
/// each thread's bytes by source node when known (enables the data-aware moves).
pub fn search(
    topo: &Topology,
    candidates: &[(String, Pinning)],
    hint: Option<&[Vec<(u32, f64)>]>,
    eval: &mut dyn Evaluator,
    cfg: &SearchConfig,
) -> Result<SearchOutcome, ArrayError> {
    let Some(threads) = candidates.first().map(|c| c.1.len()) else {
        return Err(ArrayError::Parse(
            "search needs at least one starting candidate".into(),
        ));
    };
    if candidates.iter().any(|c| c.1.len() != threads) {
        return Err(ArrayError::Parse(
            "search candidates disagree on the thread count".into(),
        ));
    }
    let budget = cfg.budget.max(1);
    let mut trials: Vec<Trial> = Vec::new();
    let mut seen: std::collections::HashSet<Pinning> = std::collections::HashSet::new();
    for (label, p) in candidates {
        if trials.len() >= budget {
            break;
        }
        if !seen.insert(p.clone()) {
            continue;
        }
        let cost = eval.eval(p)?;
        trials.push(Trial {
            label: label.clone(),
            pinning: p.clone(),
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
    let mut cur: Vec<u32> = best
        .pinning
        .single_cpus()
        .unwrap_or_else(|| modeled_cpus(topo, &best.pinning));
    // The kind of move that last paid off is tried first in the next round.
    let mut prefer: Option<u8> = None;
    let mut flat = 0;
    'climb: while trials.len() < budget {
        let mut improved = false;
        let mut ms = moves(topo, &cur, hint, &mut rng);
        ms.sort_by_key(|m| Some(m.0) != prefer);
        for (kind, label, cand) in ms {
            if trials.len() >= budget {
                break 'climb;
            }
            let p = Pinning::on_cpus(&cand);
            if !seen.insert(p.clone()) {
                continue;
            }
            let cost = eval.eval(&p)?;
            let t = Trial {
                label,
                pinning: p,
                cost,
            };
            trials.push(t.clone());
            // Plateaus: with a noiseless cost, an equal move is taken too (a few in a row),
            // since two moves are often needed where one alone changes nothing (the slowest
            // thread is still the same).
            let sideways = cfg.tolerance == 0.0 && cost <= best.cost && flat < 4;
            if cost < best.cost * (1.0 - cfg.tolerance) || sideways {
                flat = if cost < best.cost { 0 } else { flat + 1 };
                best = t;
                cur = cand;
                prefer = Some(kind);
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
    pub fn get(&self, topo: &Topology, workload: &str, threads: usize) -> Option<Pinning> {
        let e = self.file.entries.get(&Self::key(topo, workload))?;
        let p = Pinning {
            threads: e.threads.clone(),
        };
        (p.len() == threads && p.check(topo).is_ok()).then_some(p)
    }

    /// Records a winner (in memory; [`SearchCache::save`] writes it).
    pub fn put(&mut self, topo: &Topology, workload: &str, out: &SearchOutcome) {
        self.file.version = 1;
        self.file.entries.insert(
            Self::key(topo, workload),
            CacheEntry {
                threads: out.best.pinning.threads.clone(),
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
