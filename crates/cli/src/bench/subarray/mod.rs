//! `loci bench subarray`: seed 000's subarray on a seismic velocity volume, under thread
//! strategies, against numpy / xarray / TileDB on the same bytes and memcpy of the same bytes.
//!
//! Rows: one per case (`c<chunks>/<span>/s<selectivity>`) and system/strategy. Throughput is bytes
//! of result per second. loci rows carry the local-access ratio (move_pages samples of the source
//! pages each thread read), the plan used (`pinning`: each thread's cpus), and for the searches
//! the trials they took.
//!
//! Like for like (2026-11-25): loci with its result-buffer pool (`loci`, pool on: results in
//! recycled, faulted memory) is compared with numpy writing into a reused, faulted result on as
//! many threads (`numpy-threads`), and loci without the pool (`loci-nopool`: fresh memory every
//! result) with numpy allocating a fresh result every rep (`numpy`); see [`goals`].
//!
//! Files: `peers` (memcpy and the Python peers), `goals` (the printed comparison), `progress`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;

use loci_array::strategy::{choose, PlanSearch, RunInfo, ThreadPlacement};
use loci_array::{
    pin, seismic_layout, subarray, Array, BufferPool, BuildOptions, Chunking, DType, Evaluator,
    ModelWorkload, Plan, Query, SearchCache, SearchConfig, Seismic, Span, SubarrayOptions,
};
use loci_report::{Machine, Report, Row};
use loci_topo::Topology;

mod goals;
mod peers;
mod progress;

pub use goals::goals;
use peers::{
    check_python_peers, is_python_peer, memcpy_rows, peers_dir, python_rows, PythonJob,
    DEFAULT_PEERS, PEERS,
};
use progress::Progress;

#[derive(Args, Debug)]
pub struct SubarrayArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Bytes of the f32 volume (a cube; --quick: 64 MiB).
    #[arg(long, default_value_t = 512 << 20)]
    pub size: usize,
    /// Chunk counts to sweep (chunks are slabs along depth first; the real count is reported).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    pub chunks: Vec<usize>,
    /// Fractions of the touched chunks' cells the box selects.
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.7")]
    pub selectivity: Vec<f64>,
    /// Which chunks the box touches: one (the middle chunk), fifth (the first fifth), all.
    #[arg(long, value_delimiter = ',', default_value = "one,fifth,all")]
    pub span: Vec<String>,
    /// Thread strategies, as `loci plan --threads` spells them (os, compact, sparse, shared:G,
    /// random:SEED, group, nodes:LIST, cpus:LIST, each optionally @BIND), `shared` (G = threads
    /// per touched chunk), and the searches: best-of:K (the best of K seeded random plans, each
    /// one measured run), elastic, search (cached per machine and workload under
    /// ${XDG_CACHE_HOME:-~/.cache}/loci/search.json). Write lists inside a strategy as ranges
    /// (cpus:0-3): commas separate strategies here.
    #[arg(long, value_delimiter = ',', default_value = ThreadPlacement::DEFAULTS)]
    pub threads: Vec<String>,
    /// Worker threads per query (default: every allowed cpu).
    #[arg(long, value_parser = crate::at_least_one)]
    pub nthreads: Option<usize>,
    /// Peers on the same volume in the same run: numpy (a fresh result per rep, one thread),
    /// numpy-prealloc (`np.copyto` into a reused, faulted result, one thread), numpy-threads (the
    /// same, the box split over a thread pool of loci's thread count), xarray, tiledb (Python,
    /// from bench/peers/.venv: run bench/peers/setup --subarray once), memcpy (same bytes, one
    /// thread), loci-nopool (loci's headline strategy again, its plan, with the result-buffer
    /// pool off: fresh memory for every result; only with --pool on).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_PEERS)]
    pub peers: Vec<String>,
    /// Home nodes of the volume's chunks, in loci-place's vocabulary: first-touch (by a compact
    /// generator on every cpu), round-robin[:NODES] (chunk i on the (i mod k)-th node),
    /// per-node[:NODES] (contiguous shares), bind:N, interleave[:NODES].
    #[arg(long, default_value = "first-touch")]
    pub mem: String,
    /// Do not ask for transparent huge pages for the volume and the results.
    #[arg(long)]
    pub no_huge_pages: bool,
    /// Result-buffer pool: `on` (default) gives a dropped result's memory (already faulted in,
    /// bound to the node that wrote it) to the next result bound the same way; `off` maps fresh
    /// memory for every result (page faults and kernel zeroing on every page, like a new malloc).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub pool: String,
    /// Byte cap of the result-buffer pool (default: 1 GiB or an eighth of the memory, the smaller).
    #[arg(long)]
    pub pool_cap: Option<usize>,
    /// Results under this many bytes are copied inline (the calling thread and spinning helpers on
    /// its node) when a pooled buffer serves them; larger ones by the plan's threads (default
    /// 2 MiB, measured; 0: always the threads).
    #[arg(long, value_name = "BYTES", default_value_t = loci_array::subarray::INLINE_POOLED_BYTES)]
    pub inline_pooled: usize,
    /// Python with numpy/xarray/tiledb (default: bench/peers/.venv/bin/python).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

/// A measured subarray run as an evaluator for the searches: one run per trial.
struct Measure<'a> {
    src: &'a Array,
    bounds: &'a [std::ops::Range<usize>],
    opts: &'a SubarrayOptions,
    topo: &'a Topology,
}

impl Evaluator for Measure<'_> {
    fn eval(&mut self, p: &Plan) -> Result<f64, loci_array::ArrayError> {
        let t = Instant::now();
        let (r, _) = subarray(self.src, self.bounds, p, self.opts, self.topo)?;
        let s = t.elapsed().as_secs_f64();
        drop(r);
        Ok(s)
    }
    fn modeled(&self) -> bool {
        false
    }
}

/// Untimed calls of `loci-nopool` before its timed reps (their times go to `warmup_s`): the loop
/// keeps two results alive, so its first calls map memory the process has not touched yet, which
/// in this VM cost up to 15x a steady-state call (docs/array.md, 2026-11-25). The numpy peer and
/// loci's pooled rows are measured in that steady state; every timed call of `loci-nopool` still
/// maps, faults and unmaps fresh memory.
const NOPOOL_WARMUP: usize = 2;

/// The loci strategy the goals (and the `loci-nopool` row) use: `search` when it runs, else the
/// first one.
fn headline_strategy(strategies: &[ThreadPlacement]) -> Option<&ThreadPlacement> {
    strategies
        .iter()
        .find(|s| **s == ThreadPlacement::SEARCH)
        .or_else(|| strategies.first())
}

/// Wrapping sum of the little-endian u32 words (the checksum the Python peers compute too).
fn sum32(b: &[u8]) -> u64 {
    b.chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")) as u64)
        .fold(0u64, u64::wrapping_add)
}

/// Bytes of result each system copies per case at least: a case with a small result gets more
/// timed reps than `--reps` (the same number for loci and every peer), because one call of a few
/// microseconds swings with the state of the caches and the branch predictors, and a median of
/// 5 such calls moved by 20-50% between runs.
const REPS_BYTES: usize = 64 << 20;
/// The most timed reps of one case.
const MAX_REPS: usize = 1000;

/// Timed reps of a case whose result has `bytes` bytes: `min` (the `--reps`), or enough to copy
/// [`REPS_BYTES`], at most [`MAX_REPS`].
fn case_reps(min: usize, bytes: usize) -> usize {
    min.max((REPS_BYTES / bytes.max(1)).min(MAX_REPS))
}

pub fn run(a: SubarrayArgs) -> anyhow::Result<Report> {
    let quick = a.common.quick;
    let reps = a.common.reps_or(3, 5);
    let size = if quick { a.size.min(64 << 20) } else { a.size };
    let side = ((size / 4) as f64).cbrt().floor() as usize;
    anyhow::ensure!(
        side >= 8,
        "--size {size} is too small: the volume needs at least 8^3 cells"
    );
    let shape = [side, side, side];
    let topo = crate::this_machine()?;
    let nthreads = a.nthreads.unwrap_or(topo.allowed_cpus().len()).max(1);
    let mut strategies: Vec<ThreadPlacement> = a
        .threads
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    if quick {
        for s in &mut strategies {
            if let ThreadPlacement::Search(PlanSearch::BestOf(k)) = s {
                *k = (*k).min(4);
            }
        }
    }
    let spans: Vec<Span> = a.span.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    for s in &a.selectivity {
        anyhow::ensure!(*s > 0.0 && *s <= 1.0, "--selectivity {s} is not in (0, 1]");
    }
    for p in &a.peers {
        if !PEERS.contains(&p.as_str()) {
            bail!("unknown peer `{p}`; valid: {}", PEERS.join(", "));
        }
    }
    let has_py_peers = a.peers.iter().any(|p| is_python_peer(p));
    // The Python peers' interpreter and modules, checked before the loci matrix runs (not after
    // minutes of it).
    let python = a
        .python
        .clone()
        .unwrap_or_else(|| peers_dir().join(".venv/bin/python"));
    check_python_peers(&python, &a.peers)?;
    let mem = loci_array::chunk_policy(&a.mem, &topo)?;
    let huge = !a.no_huge_pages;
    let gen = BuildOptions {
        mem: mem.clone(),
        // One generator thread on every allowed cpu, in id order.
        plan: pin::plan(&topo, &"cpus:all".parse()?, topo.allowed_cpus().len())?,
        huge_pages: huge,
    };
    let pool = (a.pool == "on").then(|| {
        let p = BufferPool::global().clone();
        if let Some(cap) = a.pool_cap {
            p.set_cap(cap);
        }
        p
    });
    let pool_cap = pool.as_ref().map(|p| p.cap());
    let opts = SubarrayOptions {
        huge_pages: huge,
        pool: pool.clone(),
        inline_bytes_pooled: a.inline_pooled,
        ..Default::default()
    };
    // loci without its pool (the like-for-like partner of numpy's fresh result): the headline
    // strategy's plan again, results in fresh memory. Redundant when --pool off.
    let nopool = a.peers.iter().any(|p| p == "loci-nopool");
    if nopool && pool.is_none() {
        eprintln!("note: peer loci-nopool skipped: --pool off already gives loci without its pool");
    }
    let nopool = nopool && pool.is_some();
    let headline = headline_strategy(&strategies).cloned();
    let opts_nopool = SubarrayOptions {
        pool: None,
        ..opts.clone()
    };
    let mut cache = SearchCache::default_path().map(|p| SearchCache::open(&p));
    let mut rep = Report::new(
        "subarray",
        serde_json::json!({
            "shape": shape, "dtype": "f32", "bytes": side * side * side * 4,
            "chunks": a.chunks, "selectivity": a.selectivity, "span": a.span,
            "threads": nthreads, "mem": mem.to_string(), "huge_pages": huge, "reps": reps,
            "seed": Seismic::default().seed, "layers": Seismic::default().layers,
            "pool": a.pool, "pool_cap": pool_cap, "stream_bytes": opts.stream_bytes_on(&topo),
            "inline_bytes": opts.inline_bytes, "inline_bytes_pooled": opts.inline_bytes_pooled,
        }),
        Machine::of(&topo),
    );
    // For the Python peers.
    let mut queries = Vec::new();
    // One step per (case, strategy), one per case for memcpy, one for the Python peers.
    let cases = (a.chunks.len() * spans.len() * a.selectivity.len()) as u64;
    let py_steps = u64::from(has_py_peers);
    let memcpy_steps = if a.peers.iter().any(|p| p == "memcpy") {
        cases
    } else {
        0
    };
    let nopool_steps = if nopool { cases } else { 0 };
    let pb =
        Progress::new(cases * strategies.len() as u64 + memcpy_steps + nopool_steps + py_steps);
    pb.say(format!(
        "threads: loci copies with {nthreads} per query (every strategy{}){}",
        if nopool { ", and loci-nopool" } else { "" },
        if a.peers.iter().any(|p| p == "numpy-threads") {
            format!("; numpy-threads uses a pool of {nthreads}")
        } else {
            String::new()
        }
    ));
    let mut loci_sums = std::collections::HashMap::new();
    let mut volume_file: Option<(PathBuf, u64)> = None;
    for &count in &a.chunks {
        let layout = seismic_layout(shape, DType::F32, &Chunking::Count(count))?;
        let t = Instant::now();
        pb.start(format!("generating the volume in {count} chunks"));
        let src = Array::build(layout, &gen, &topo, |c| Seismic::default().fill(c))?;
        pb.say(format!(
            "volume {side}^3 f32 in {} chunks (asked {count}) generated in {:.2}s",
            src.chunks().len(),
            t.elapsed().as_secs_f64()
        ));
        if volume_file.is_none() && has_py_peers {
            let dense = src.to_dense(0);
            let path =
                std::env::temp_dir().join(format!("loci-subarray-{}.raw", std::process::id()));
            std::fs::write(&path, &dense).with_context(|| format!("writing {}", path.display()))?;
            volume_file = Some((path, sum32(&dense)));
        }
        let homes: Vec<loci_array::Home> = src.chunks().iter().map(|c| c.home.clone()).collect();
        for &span in &spans {
            for &sel in &a.selectivity {
                let q = Query::new(src.layout(), span, sel)?;
                let case = format!("c{count}/{span}/s{sel}");
                let bytes = q.bounds.iter().map(|r| r.end - r.start).product::<usize>() * 4;
                let reps = case_reps(reps, bytes);
                let w = ModelWorkload::subarray(src.layout(), &q.bounds, nthreads, |c| {
                    homes[c].clone()
                });
                let info = RunInfo {
                    chunks: q.chunks,
                    bytes_by_node: Some(w.bytes_by_node()),
                    workload: format!(
                        "subarray f32 {shape:?} chunk {:?} box {:?} threads {nthreads} mem {mem}",
                        src.layout().chunk,
                        q.bounds
                    ),
                };
                let mut headline_plan = None;
                for s in &strategies {
                    pb.start(format!("{case} {s}"));
                    let mut eval = Measure {
                        src: &src,
                        bounds: &q.bounds,
                        opts: &opts,
                        topo: &topo,
                    };
                    let cfg = SearchConfig {
                        tolerance: 0.03,
                        ..SearchConfig::default()
                    };
                    let cache_ref = if *s == ThreadPlacement::SEARCH {
                        cache.as_mut()
                    } else {
                        None
                    };
                    let choice = choose(&topo, s, nthreads, &info, &mut eval, cache_ref, &cfg)?;
                    for n in &choice.notes {
                        pb.say(format!("note: {n}"));
                    }
                    let mut times = Vec::with_capacity(reps);
                    let mut last = None;
                    let before = pool.as_ref().map(|p| p.stats());
                    for _ in 0..reps {
                        let t = Instant::now();
                        let (r, _) = subarray(&src, &q.bounds, &choice.plan, &opts, &topo)?;
                        times.push(t.elapsed().as_secs_f64());
                        // The previous result is dropped here, after the next one was made (as
                        // the Python peers' `out = fn()` does): the pool serves rep k with the
                        // memory of rep k-2 (or of the strategy's trials).
                        last = Some(r);
                    }
                    let during = pool.as_ref().zip(before).map(|(p, b)| p.stats().since(&b));
                    let result = last.expect("reps > 0");
                    let sum = sum32(&result.to_dense(0));
                    loci_sums.insert(case.clone(), sum);
                    drop(result);
                    // Locality from one more run with page sampling (not timed).
                    let sampled = SubarrayOptions {
                        sample_locality: true,
                        ..opts.clone()
                    };
                    let (_, stats) = subarray(&src, &q.bounds, &choice.plan, &sampled, &topo)?;
                    let mut row = Row::from_times("loci", times)
                        .case(&case)
                        .config("threads", s)
                        .work(bytes as f64, "B/s")
                        .extra("pinning", pin::describe(&choice.plan))
                        .extra("chosen", &choice.label)
                        .extra("trials", choice.trials.len())
                        .extra("from_cache", choice.from_cache)
                        .extra("chunks_touched", q.chunks)
                        .extra("chunks", src.chunks().len())
                        .extra("parts", stats.parts)
                        .extra("result_bytes", bytes)
                        .extra("selectivity_real", q.selectivity)
                        .extra("sum32", sum)
                        .extra("pool", &a.pool);
                    if let Some(d) = during {
                        row = row
                            .extra("pool_hits", d.hits)
                            .extra("pool_misses", d.misses)
                            .extra("pool_bypassed", d.bypassed);
                    }
                    if !choice.trials.is_empty() {
                        row = row.extra(
                            "trial_times_s",
                            choice.trials.iter().map(|t| t.cost).collect::<Vec<_>>(),
                        );
                    }
                    row.local_access_ratio = stats.local_access_ratio;
                    rep.results.push(row);
                    if Some(s) == headline.as_ref() {
                        headline_plan = Some(choice.plan);
                    }
                    pb.done();
                }
                if let (true, Some(s), Some(plan)) = (nopool, &headline, &headline_plan) {
                    pb.start(format!("{case} loci-nopool {s}"));
                    let mut times = Vec::with_capacity(reps);
                    let mut warmup = Vec::with_capacity(NOPOOL_WARMUP);
                    let mut last = None;
                    for i in 0..NOPOOL_WARMUP + reps {
                        let t = Instant::now();
                        let (r, _) = subarray(&src, &q.bounds, plan, &opts_nopool, &topo)?;
                        let took = t.elapsed().as_secs_f64();
                        if i < NOPOOL_WARMUP {
                            warmup.push(took);
                        } else {
                            times.push(took);
                        }
                        // As above: the previous result lives until the next one is made, and
                        // then its memory is unmapped (no pool).
                        last = Some(r);
                    }
                    let sum = sum32(&last.expect("reps > 0").to_dense(0));
                    if Some(&sum) != loci_sums.get(&case) {
                        bail!(
                            "loci-nopool result of {case} differs from loci's with the pool (sum32 {sum} vs {:?})",
                            loci_sums.get(&case)
                        );
                    }
                    rep.results.push(
                        Row::from_times("loci-nopool", times)
                            .case(&case)
                            .config("threads", s)
                            .work(bytes as f64, "B/s")
                            .extra("pinning", pin::describe(plan))
                            .extra("nthreads", nthreads)
                            .extra("result_bytes", bytes)
                            .extra("sum32", sum)
                            .extra("pool", "off")
                            .extra("warmup_s", &warmup),
                    );
                    pb.done();
                }
                if a.peers.iter().any(|p| p == "memcpy") {
                    pb.start(format!("{case} memcpy"));
                    memcpy_rows(&mut rep, &case, bytes, reps, huge)?;
                    pb.done();
                }
                queries.push(serde_json::json!({
                    "case": case,
                    "bounds": q.bounds.iter().map(|r| [r.start, r.end]).collect::<Vec<_>>(),
                    "tile": src.layout().chunk,
                    "bytes": bytes,
                    "reps": reps,
                }));
            }
        }
    }
    let py_peers: Vec<&String> = a.peers.iter().filter(|p| is_python_peer(p)).collect();
    if let (false, Some((path, vsum))) = (py_peers.is_empty(), &volume_file) {
        let job = PythonJob {
            python: &python,
            peers: &py_peers,
            volume: path,
            volume_sum: *vsum,
            shape,
            reps,
            threads: nthreads,
        };
        python_rows(&mut rep, &pb, &job, &queries, &loci_sums)?;
    }
    pb.finish();
    if let Some(p) = &pool {
        let st = p.stats();
        rep.params["pool_stats"] = serde_json::to_value(st)?;
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small results get more reps (the same for every system), large ones `--reps`; never
    /// fewer than asked, never more than the cap unless asked.
    #[test]
    fn small_results_get_more_reps() {
        assert_eq!(case_reps(5, 107 << 20), 5);
        assert_eq!(case_reps(5, 13 << 20), 5);
        assert_eq!(case_reps(5, 104_424), 642);
        assert_eq!(case_reps(5, 1), MAX_REPS);
        assert_eq!(case_reps(5, 0), MAX_REPS);
        assert_eq!(case_reps(3000, 1), 3000);
        assert_eq!(case_reps(7, 1 << 20), 64);
    }

    /// loci-nopool repeats `search` when it runs, else the first strategy; only the numpy,
    /// xarray and TileDB peers go to the Python script; every peer name is accepted.
    #[test]
    fn headline_strategy_and_peer_kinds() {
        let s =
            |v: &[&str]| -> Vec<ThreadPlacement> { v.iter().map(|x| x.parse().unwrap()).collect() };
        assert_eq!(
            headline_strategy(&s(&["os", "compact", "search"])),
            Some(&ThreadPlacement::SEARCH)
        );
        assert_eq!(
            headline_strategy(&s(&["compact", "os"])),
            s(&["compact"]).first()
        );
        assert_eq!(headline_strategy(&[]), None);
        for p in PEERS {
            assert_eq!(
                is_python_peer(p),
                !matches!(p, "memcpy" | "loci-nopool"),
                "{p}"
            );
        }
        assert!(["numpy-prealloc", "numpy-threads"]
            .iter()
            .all(|p| is_python_peer(p)));
    }
}
