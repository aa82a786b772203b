//! `loci bench subarray`: seed 000's subarray on a seismic velocity volume, under thread
//! strategies, against numpy / xarray / TileDB on the same bytes and memcpy of the same bytes.
//!
//! Rows: one per case (`c<chunks>/<span>/s<selectivity>`) and system/strategy. Throughput is bytes
//! of result per second. loci rows carry the local-access ratio (move_pages samples of the source
//! pages each thread read), the pinning used, and for adaptive strategies the trials it took.
//!
//! Like for like (2026-11-25): loci with its result-buffer pool (`loci`, pool on: results in
//! recycled, faulted memory) is compared with numpy writing into a reused, faulted result on as
//! many threads (`numpy-threads`), and loci without the pool (`loci-nopool`: fresh memory every
//! result) with numpy allocating a fresh result every rep (`numpy`); see [`goals`].

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use loci_array::strategy::{choose, RunInfo, ThreadStrategy};
use loci_array::{
    seismic_layout, subarray, Array, BufferPool, BuildOptions, ChunkMem, Chunking, DType,
    Evaluator, ModelWorkload, Pinning, Query, Region, SearchCache, SearchConfig, Seismic, Span,
    SubarrayOptions,
};
use loci_report::{median, Machine, Report, Row};
use loci_topo::Topology;

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
    /// Thread strategies: os, compact, sparse, shared[:G], random:K (best of K seeded pinnings,
    /// each one measured run), elastic, search (cached per machine and workload under
    /// ${XDG_CACHE_HOME:-~/.cache}/loci/search.json), place:SPEC.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "os,compact,sparse,shared,random:20,elastic,search"
    )]
    pub threads: Vec<String>,
    /// Worker threads per query (default: every allowed cpu).
    #[arg(long)]
    pub nthreads: Option<usize>,
    /// Peers on the same volume in the same run: numpy (a fresh result per rep, one thread),
    /// numpy-prealloc (`np.copyto` into a reused, faulted result, one thread), numpy-threads (the
    /// same, the box split over a thread pool of loci's thread count), xarray, tiledb (Python,
    /// from bench/peers/.venv: run bench/peers/setup --subarray once), memcpy (same bytes, one
    /// thread), loci-nopool (loci's headline strategy again, its pinning, with the result-buffer
    /// pool off: fresh memory for every result; only with --pool on).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "numpy,numpy-prealloc,numpy-threads,xarray,memcpy,loci-nopool"
    )]
    pub peers: Vec<String>,
    /// Home nodes of the volume's chunks: first-touch (by a compact generator on every cpu),
    /// bind[:NODES] (chunk i on the i-th node, round robin), interleave[:NODES].
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
    /// its node) when a pooled buffer serves them; larger ones by the pinning's threads (default
    /// 2 MiB, measured; 0: always the threads).
    #[arg(long, value_name = "BYTES", default_value_t = loci_array::subarray::INLINE_POOLED_BYTES)]
    pub inline_pooled: usize,
    /// Python with numpy/xarray/tiledb (default: bench/peers/.venv/bin/python).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

/// Progress of the sweep: an indicatif bar on a terminal; elsewhere (a log, a CI job) one line
/// per finished step on stderr, since indicatif draws nothing there.
struct Progress {
    bar: ProgressBar,
    what: std::cell::RefCell<String>,
    started: Instant,
}

impl Progress {
    fn new(steps: u64) -> Self {
        let bar = ProgressBar::new(steps);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} (eta {eta}) {msg}",
            )
            .expect("valid template"),
        );
        Self {
            bar,
            what: Default::default(),
            started: Instant::now(),
        }
    }

    /// Names the step now running.
    fn start(&self, what: String) {
        self.bar.set_message(what.clone());
        *self.what.borrow_mut() = what;
    }

    /// The step named last finished.
    fn done(&self) {
        self.bar.inc(1);
        if self.bar.is_hidden() {
            eprintln!(
                "[{}/{} {:.0}s] {} done",
                self.bar.position(),
                self.bar.length().unwrap_or(0),
                self.started.elapsed().as_secs_f64(),
                self.what.borrow()
            );
        }
    }

    /// A line for the user, above the bar.
    fn say(&self, line: String) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// A measured subarray run as an evaluator for the adaptive strategies: one run per trial.
struct Measure<'a> {
    src: &'a Array,
    bounds: &'a [std::ops::Range<usize>],
    opts: &'a SubarrayOptions,
    topo: &'a Topology,
}

impl Evaluator for Measure<'_> {
    fn eval(&mut self, p: &Pinning) -> Result<f64, loci_array::ArrayError> {
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
/// keeps two results alive, so its first calls map memory the process has not touched yet,
/// which in this VM costs up to 15x a steady-state call (suspected: the guest reports free 2 MiB
/// blocks to the host, virtio-balloon free page reporting, and touching them again faults in the
/// host; `c10/one/s0.7`, 38 MB: 47.6 and 47.2 ms, then 3.2-3.5 ms for 13 calls). The numpy peer
/// is measured in that steady state (its process recycles the memory its earlier cases freed;
/// its reps show no such first calls), loci's pooled rows by construction; every timed call of
/// `loci-nopool` still maps, faults and unmaps fresh memory. In some cases of the sweep the
/// timed calls were still slow, up to all of them (their times show it; nothing is dropped).
const NOPOOL_WARMUP: usize = 2;

/// Every `--peers` name; the Python ones run in bench/peers/subarray.py.
const PEERS: [&str; 7] = [
    "numpy",
    "xarray",
    "tiledb",
    "memcpy",
    "numpy-prealloc",
    "numpy-threads",
    "loci-nopool",
];

/// Whether peer `p` runs in the Python script (not in this process).
fn is_python_peer(p: &str) -> bool {
    !matches!(p, "memcpy" | "loci-nopool")
}

/// The loci strategy the goals (and the `loci-nopool` row) use: `search` when it runs, else the
/// first one.
fn headline_strategy(strategies: &[ThreadStrategy]) -> Option<&ThreadStrategy> {
    strategies
        .iter()
        .find(|s| **s == ThreadStrategy::Search)
        .or_else(|| strategies.first())
}

/// Wrapping sum of the little-endian u32 words (the checksum the Python peers compute too).
fn sum32(b: &[u8]) -> u64 {
    b.chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")) as u64)
        .fold(0u64, u64::wrapping_add)
}

/// The bench/peers directory holding subarray.py (else bench/peers under the current directory,
/// for the error that names the missing interpreter).
fn peers_dir() -> PathBuf {
    super::common::peers_dir("subarray.py").unwrap_or_else(|| {
        std::env::current_dir()
            .unwrap_or_default()
            .join("bench/peers")
    })
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
    let reps = a.common.reps.unwrap_or(if quick { 3 } else { 5 });
    anyhow::ensure!(reps > 0, "--reps must be positive");
    let size = if quick { a.size.min(64 << 20) } else { a.size };
    let side = ((size / 4) as f64).cbrt().floor() as usize;
    anyhow::ensure!(
        side >= 8,
        "--size {size} is too small: the volume needs at least 8^3 cells"
    );
    let shape = [side, side, side];
    let topo = crate::this_machine()?;
    let nthreads = a.nthreads.unwrap_or(topo.allowed_cpus().len()).max(1);
    let mut strategies: Vec<ThreadStrategy> = a
        .threads
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    if quick {
        for s in &mut strategies {
            if let ThreadStrategy::Random(k) = s {
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
    // The Python peers' interpreter, checked before the loci matrix runs (not after minutes of it).
    let python = a
        .python
        .clone()
        .unwrap_or_else(|| peers_dir().join(".venv/bin/python"));
    if has_py_peers && !python.is_file() {
        bail!(
            "the Python peers need {} (create it with bench/peers/setup --subarray, or pass --python)",
            python.display()
        );
    }
    let mem = ChunkMem::parse(&a.mem, &topo)?;
    let huge = !a.no_huge_pages;
    let cpus: Vec<u32> = topo.allowed_cpus().iter().collect();
    let gen = BuildOptions {
        mem: mem.clone(),
        pinning: Pinning::on_cpus(&cpus),
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
    // strategy's pinning again, results in fresh memory. Redundant when --pool off.
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
    let mut queries = Vec::new(); // for the Python peers
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
                let mut headline_pinning = None;
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
                    let cache_ref = if *s == ThreadStrategy::Search {
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
                        let (r, _) = subarray(&src, &q.bounds, &choice.pinning, &opts, &topo)?;
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
                    let (_, stats) = subarray(&src, &q.bounds, &choice.pinning, &sampled, &topo)?;
                    let mut row = Row::from_times("loci", times)
                        .case(&case)
                        .config("threads", s)
                        .work(bytes as f64, "B/s")
                        .extra("pinning", choice.pinning.to_string())
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
                        headline_pinning = Some(choice.pinning.clone());
                    }
                    pb.done();
                }
                if let (true, Some(s), Some(pinning)) = (nopool, &headline, &headline_pinning) {
                    pb.start(format!("{case} loci-nopool {s}"));
                    let mut times = Vec::with_capacity(reps);
                    let mut warmup = Vec::with_capacity(NOPOOL_WARMUP);
                    let mut last = None;
                    for i in 0..NOPOOL_WARMUP + reps {
                        let t = Instant::now();
                        let (r, _) = subarray(&src, &q.bounds, pinning, &opts_nopool, &topo)?;
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
                            .extra("pinning", pinning.to_string())
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
                    let srcbuf = super::memcpy_source(bytes);
                    // The limit: a destination mapped like loci's results (huge pages as asked)
                    // and written once before the clock starts.
                    let mut pre = Region::map(bytes, huge)?;
                    pre.as_mut_slice().fill(1);
                    let mut fresh = Vec::with_capacity(reps);
                    let mut warm = Vec::with_capacity(reps);
                    for _ in 0..reps {
                        let t = Instant::now();
                        pre.as_mut_slice()
                            .copy_from_slice(std::hint::black_box(&srcbuf));
                        warm.push(t.elapsed().as_secs_f64());
                        std::hint::black_box(&mut pre);
                        let t = Instant::now();
                        let r = Region::map(bytes, huge)?;
                        // SAFETY: `r` is a fresh mapping of `bytes` bytes; `srcbuf` has `bytes`.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                std::hint::black_box(srcbuf.as_ptr()),
                                r.as_mut_ptr(),
                                bytes,
                            )
                        };
                        fresh.push(t.elapsed().as_secs_f64());
                        std::hint::black_box(&r);
                        anyhow::ensure!(
                            super::copied(&srcbuf, pre.as_slice())
                                && super::copied(&srcbuf, r.as_slice()),
                            "memcpy peer: the copy did not happen"
                        );
                    }
                    for (dst, times) in [("prefaulted", warm), ("new-mapping", fresh)] {
                        rep.results.push(
                            Row::from_times("memcpy", times)
                                .case(&case)
                                .config("dst", dst)
                                .config("threads", 1)
                                .work(bytes as f64, "B/s"),
                        );
                    }
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
        let pdir = peers_dir();
        let tdb = std::env::temp_dir().join(format!("loci-subarray-tiledb-{}", std::process::id()));
        let job = serde_json::json!({
            "file": path, "shape": shape, "dtype": "<f4", "sum32": vsum, "reps": reps,
            "threads": nthreads, "peers": py_peers, "tiledb_dir": tdb, "queries": queries,
        });
        let job_path = path.with_extension("json");
        std::fs::write(&job_path, serde_json::to_string(&job)?)?;
        pb.start(format!(
            "peers {py_peers:?} with {} (all cases)",
            python.display()
        ));
        let out = Command::new(&python)
            .arg(pdir.join("subarray.py"))
            .arg(&job_path)
            .output();
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(&job_path);
        let _ = std::fs::remove_dir_all(&tdb);
        pb.done();
        let out = out.with_context(|| {
            format!(
                "cannot run {} (create it with bench/peers/setup --subarray, or pass --python)",
                python.display()
            )
        })?;
        let bytes_of = |case: &str| -> f64 {
            queries
                .iter()
                .find(|q| q["case"] == case)
                .and_then(|q| q["bytes"].as_f64())
                .unwrap_or(0.0)
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("peer output is not JSON: {line}"))?;
            if let Some(e) = v.get("error") {
                bail!("peer failed: {e}");
            }
            if let Some(why) = v.get("skipped") {
                pb.say(format!("note: {} skipped: {why}", v["system"]));
                continue;
            }
            let case = v["case"].as_str().unwrap_or_default().to_string();
            let sys = v["system"].as_str().unwrap_or_default().to_string();
            let times: Vec<f64> = serde_json::from_value(v["times_s"].clone())?;
            let sum = v["sum32"].as_u64();
            if sum != loci_sums.get(&case).copied() {
                bail!(
                    "{sys} result of {case} differs from loci's (sum32 {sum:?} vs {:?})",
                    loci_sums.get(&case)
                );
            }
            let threads = match &v["threads"] {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => "1".to_string(),
                t => t.to_string(),
            };
            let mut row = Row::from_times(&sys, times)
                .case(&case)
                .config("threads", threads)
                .work(bytes_of(&case), "B/s")
                .extra("version", v["version"].clone())
                .extra("sum32", sum);
            if let Some(r) = v.get("result") {
                row = row.extra("result", r.clone());
            }
            if let Some(n) = v.get("slabs") {
                row = row.extra("slabs", n.clone());
            }
            rep.results.push(row);
        }
        if !out.status.success() {
            bail!(
                "peer script failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    pb.finish();
    if let Some(p) = &pool {
        let st = p.stats();
        rep.params["pool_stats"] = serde_json::to_value(st)?;
    }
    Ok(rep)
}

/// Which loci rows a comparison takes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loci {
    /// `loci` rows with the result-buffer pool on (results in recycled, faulted memory).
    Pool,
    /// `loci-nopool` rows, or `loci` rows of a `--pool off` run (fresh memory every result).
    NoPool,
}

/// What loci is compared with in one line of the goals.
#[derive(Clone, Copy, Debug)]
enum Peer {
    /// The row of this system (and, for memcpy, this `dst`).
    Row(&'static str, Option<&'static str>),
    /// Per case, the fastest of these systems' rows.
    FastestOf(&'static [&'static str]),
}

/// One line of the goals: loci (`loci`) against `peer`; ratio = peer's median time / loci's.
#[derive(Clone, Copy, Debug)]
struct Goal {
    what: &'static str,
    loci: Loci,
    peer: Peer,
    bar: f64,
    /// Only cases whose result has more bytes than this (0: every case).
    min_bytes: u64,
}

/// The headline: like with like. loci reusing its result memory (the pool) against numpy
/// reusing its result on as many threads, and against memcpy into a faulted buffer; loci
/// mapping fresh memory for each result against numpy allocating a fresh one, and against
/// memcpy into a new mapping.
const HEADLINE: [Goal; 4] = [
    Goal {
        what: "loci, pool on  vs numpy-threads (np.copyto into a reused result, as many threads)",
        loci: Loci::Pool,
        peer: Peer::Row("numpy-threads", None),
        bar: 1.3,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool off vs numpy (a fresh result every rep, 1 thread)",
        loci: Loci::NoPool,
        peer: Peer::Row("numpy", None),
        bar: 1.3,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool on  vs memcpy into a prefaulted buffer (the limit, 1 thread)",
        loci: Loci::Pool,
        peer: Peer::Row("memcpy", Some("prefaulted")),
        bar: 0.8,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool off vs memcpy into a new mapping (page faults included, 1 thread)",
        loci: Loci::NoPool,
        peer: Peer::Row("memcpy", Some("new-mapping")),
        bar: 0.8,
        min_bytes: 0,
    },
];

/// Extra lines, not like with like (labelled so): the headline before 2026-11-25 (loci with the
/// pool against numpy's fresh result and a new mapping), numpy's reused result on one thread, the
/// faster numpy with a reused result per case, and what the pool is worth to loci.
const EXTRA: [Goal; 6] = [
    Goal {
        what: "loci, pool on  vs numpy (fresh result, 1 thread; the headline before 2026-11-25)",
        loci: Loci::Pool,
        peer: Peer::Row("numpy", None),
        bar: 1.3,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool on  vs numpy-prealloc (np.copyto into a reused result, 1 thread)",
        loci: Loci::Pool,
        peer: Peer::Row("numpy-prealloc", None),
        bar: 1.3,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool on  vs the faster of numpy-prealloc and numpy-threads per case",
        loci: Loci::Pool,
        peer: Peer::FastestOf(&["numpy-prealloc", "numpy-threads"]),
        bar: 1.3,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool on  vs memcpy into a new mapping (the line before 2026-11-25)",
        loci: Loci::Pool,
        peer: Peer::Row("memcpy", Some("new-mapping")),
        bar: 0.8,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool off vs numpy, results over 32 MiB only (smaller ones glibc's malloc recycles for numpy)",
        loci: Loci::NoPool,
        peer: Peer::Row("numpy", None),
        bar: 1.3,
        min_bytes: GLIBC_MMAP_THRESHOLD_MAX,
    },
    Goal {
        what: "loci, pool on  vs loci-nopool (what the pool is worth)",
        loci: Loci::Pool,
        peer: Peer::Row("loci-nopool", None),
        bar: 1.0,
        min_bytes: 0,
    },
];

/// glibc's largest dynamic mmap threshold (`DEFAULT_MMAP_THRESHOLD_MAX`, 64-bit): once a freed
/// mmapped block has raised the threshold, `malloc` serves blocks up to this size from its heap,
/// so numpy's "fresh" result of each rep is recycled, already faulted memory below it (measured:
/// 0.1 MB no page fault per rep, 1-30 MB 12-26, 40 MB and more 530 or more: a fresh mapping).
/// Only larger results are fresh memory for numpy too.
const GLIBC_MMAP_THRESHOLD_MAX: u64 = 32 << 20;

/// The pool setting of a loci row (`on` for rows written before the field existed).
fn pool_of(r: &Row) -> &str {
    r.extra.get("pool").and_then(|v| v.as_str()).unwrap_or("on")
}

/// The loci row of one case's `rows` that a goal takes: of the rows with (`Pool`) or without
/// (`NoPool`) the pool, the `search` one, else the first.
fn loci_row<'a>(rows: &[&'a Row], which: Loci) -> Option<&'a Row> {
    let of_kind: Vec<&Row> = rows
        .iter()
        .copied()
        .filter(|r| match which {
            Loci::Pool => r.system == "loci" && pool_of(r) == "on",
            Loci::NoPool => {
                r.system == "loci-nopool" || (r.system == "loci" && pool_of(r) == "off")
            }
        })
        .collect();
    of_kind
        .iter()
        .find(|r| r.config.get("threads").map(String::as_str) == Some("search"))
        .or_else(|| of_kind.first())
        .copied()
}

/// The peer row of one case's `rows` that a goal takes.
fn peer_row<'a>(rows: &[&'a Row], peer: Peer) -> Option<&'a Row> {
    match peer {
        Peer::Row(sys, dst) => rows.iter().copied().find(|r| {
            r.system == sys
                && dst.is_none_or(|d| r.config.get("dst").map(String::as_str) == Some(d))
        }),
        Peer::FastestOf(systems) => rows
            .iter()
            .copied()
            .filter(|r| systems.contains(&r.system.as_str()))
            .min_by(|a, b| a.median_s.total_cmp(&b.median_s)),
    }
}

/// Per case (in the report's order), the ratio of a goal: peer's median time / loci's.
fn goal_ratios(rep: &Report, g: &Goal) -> Vec<(String, f64)> {
    let mut cases: Vec<&str> = Vec::new();
    for r in &rep.results {
        if let Some(c) = r.case.as_deref() {
            if !cases.contains(&c) {
                cases.push(c);
            }
        }
    }
    cases
        .into_iter()
        .filter_map(|case| {
            let rows: Vec<&Row> = rep.rows_of(Some(case)).collect();
            let loci = loci_row(&rows, g.loci)?;
            let bytes = loci.extra.get("result_bytes").and_then(|b| b.as_u64());
            if g.min_bytes > 0 && bytes.is_none_or(|b| b <= g.min_bytes) {
                return None;
            }
            let peer = peer_row(&rows, g.peer)?;
            Some((case.to_string(), peer.median_s / loci.median_s))
        })
        .collect()
}

/// One printed line of a goal: median, count at the bar, and (with `below`) the cases under it.
fn goal_line(g: &Goal, ratios: &[(String, f64)], below: bool) -> Option<String> {
    if ratios.is_empty() {
        return None;
    }
    let v: Vec<f64> = ratios.iter().map(|(_, x)| *x).collect();
    let met = v.iter().filter(|&&x| x >= g.bar).count();
    let mut line = format!(
        "  {}: median {:.2}x, {met} of {} cases >= {}x",
        g.what,
        median(&v).unwrap_or(0.0),
        v.len(),
        g.bar
    );
    let under: Vec<String> = ratios
        .iter()
        .filter(|(_, x)| *x < g.bar)
        .map(|(c, x)| format!("{c} {x:.2}x"))
        .collect();
    if below && !under.is_empty() {
        line += &format!("; below: {}", under.join(", "));
    }
    Some(line + "\n")
}

/// The bars from this run, like with like (the headline, [`HEADLINE`]): per case, loci's
/// `search` (else the first loci strategy) with the result-buffer pool against `numpy-threads`
/// (speed-up, bar 1.3x) and memcpy into a prefaulted buffer (bandwidth ratio, bar 0.8x), and
/// loci without the pool against `numpy`'s fresh result (1.3x) and memcpy into a new mapping
/// (0.8x); then the labelled extra ratios ([`EXTRA`]), the thread counts of loci and
/// numpy-threads, and the result-buffer pool's counters.
pub fn goals(rep: &Report) -> String {
    let mut out = String::from(
        "
subarray goals, like for like (loci `search`, or the first loci strategy, per case; medians of the reps):
",
    );
    for g in &HEADLINE {
        out += &goal_line(g, &goal_ratios(rep, g), true).unwrap_or_default();
    }
    let extra: String = EXTRA
        .iter()
        .filter_map(|g| goal_line(g, &goal_ratios(rep, g), false))
        .collect();
    if !extra.is_empty() {
        out += "extra ratios (not like for like, or not a goal):\n";
        out += &extra;
    }
    let loci_threads = rep.params.get("threads").and_then(|t| t.as_u64());
    let np_threads: Vec<&str> = rep
        .results
        .iter()
        .filter(|r| r.system == "numpy-threads")
        .filter_map(|r| r.config.get("threads").map(String::as_str))
        .collect();
    if let Some(n) = loci_threads {
        out += &format!("  threads per query: loci {n}");
        if let Some(t) = np_threads.first() {
            let same = np_threads.iter().all(|x| x.parse::<u64>().ok() == Some(n));
            out += &format!(
                ", numpy-threads {t}{}",
                if same { " (equal)" } else { " (NOT equal)" }
            );
        }
        out += "; numpy, numpy-prealloc and memcpy 1\n";
    }
    match rep.params.get("pool_stats") {
        Some(st) => {
            out += &format!(
                "  result-buffer pool (cap {} MiB): {} hits, {} misses, {} bypassed, {} evicted; {} MiB in {} buffers held at the end\n",
                st["cap"].as_u64().unwrap_or(0) >> 20,
                st["hits"], st["misses"], st["bypassed"], st["evicted"],
                st["bytes_held"].as_u64().unwrap_or(0) >> 20,
                st["buffers_held"],
            );
        }
        None => out += "  result-buffer pool: off (every result in fresh memory)\n",
    }
    out
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

    /// A row of `sys` in `case` whose median is `s` seconds.
    fn row(sys: &str, case: &str, s: f64) -> Row {
        Row::from_times(sys, vec![s]).case(case)
    }

    /// A run with the pool on, two cases: loci `os` and `search` (pool on), loci-nopool, the
    /// numpy peers and both memcpys.
    fn report(np_threads: &str) -> Report {
        let mut rep = Report::new(
            "subarray",
            serde_json::json!({ "threads": 2, "pool": "on" }),
            Machine { nodes: 1, cpus: 2 },
        );
        for (case, k, bytes) in [("a", 1.0, 10u64 << 20), ("b", 2.0, 100 << 20)] {
            rep.results.extend([
                // `os` is slower and listed first: the goals must take `search`.
                row("loci", case, 9.0 * k)
                    .config("threads", "os")
                    .extra("pool", "on"),
                row("loci", case, 1.0 * k)
                    .config("threads", "search")
                    .extra("pool", "on"),
                row("loci-nopool", case, 2.0 * k)
                    .config("threads", "search")
                    .extra("pool", "off")
                    .extra("result_bytes", bytes),
                row("numpy", case, 3.0 * k).config("threads", 1),
                row("numpy-prealloc", case, 1.2 * k).config("threads", 1),
                row("numpy-threads", case, if case == "a" { 1.5 } else { 2.2 })
                    .config("threads", np_threads),
                row("memcpy", case, 0.7 * k).config("dst", "prefaulted"),
                row("memcpy", case, 1.8 * k).config("dst", "new-mapping"),
            ]);
        }
        rep
    }

    /// The line of `goals` output that starts with `what`.
    fn line<'a>(out: &'a str, what: &str) -> &'a str {
        out.lines()
            .find(|l| l.trim_start().starts_with(what))
            .unwrap_or_else(|| panic!("no line `{what}` in\n{out}"))
    }

    /// The headline pairs like with like: loci with the pool against numpy-threads and the
    /// prefaulted memcpy, loci-nopool against numpy's fresh result and the new mapping; the old
    /// ratios stay as labelled extra lines; the cases under a bar are named.
    #[test]
    fn goals_pair_like_with_like() {
        let out = goals(&report("2"));
        // numpy-threads / loci search (pool on): a 1.5/1.0, b 2.2/2.0.
        assert_eq!(
            line(&out, "loci, pool on  vs numpy-threads"),
            "  loci, pool on  vs numpy-threads (np.copyto into a reused result, as many threads): \
             median 1.30x, 1 of 2 cases >= 1.3x; below: b 1.10x"
        );
        // numpy / loci-nopool: 1.5 in both.
        assert!(
            line(&out, "loci, pool off vs numpy (").ends_with("median 1.50x, 2 of 2 cases >= 1.3x"),
            "{out}"
        );
        // memcpy prefaulted / loci (pool on): 0.7; new mapping / loci-nopool: 0.9.
        assert!(
            line(&out, "loci, pool on  vs memcpy into a prefaulted buffer")
                .ends_with("median 0.70x, 0 of 2 cases >= 0.8x; below: a 0.70x, b 0.70x"),
            "{out}"
        );
        assert!(
            line(&out, "loci, pool off vs memcpy into a new mapping")
                .ends_with("median 0.90x, 2 of 2 cases >= 0.8x"),
            "{out}"
        );
        // The headline comes before the extra lines.
        let extra_at = out.find("extra ratios").expect("extra section");
        assert!(out.find("loci, pool off vs memcpy").unwrap() < extra_at);
        // Old headline (numpy fresh against loci with the pool): 3.0 in both.
        assert!(
            line(&out, "loci, pool on  vs numpy (fresh result")
                .ends_with("median 3.00x, 2 of 2 cases >= 1.3x"),
            "{out}"
        );
        assert!(line(&out, "loci, pool on  vs numpy-prealloc").contains("median 1.20x"));
        // The faster numpy with a reused result: a prealloc 1.2 (1.2x), b threads 2.2 (1.1x).
        assert!(
            line(&out, "loci, pool on  vs the faster of")
                .ends_with("median 1.15x, 0 of 2 cases >= 1.3x"),
            "{out}"
        );
        assert!(line(&out, "loci, pool on  vs loci-nopool").contains("median 2.00x"));
        // Only `b`'s result is over 32 MiB.
        assert!(
            line(&out, "loci, pool off vs numpy, results over 32 MiB")
                .ends_with("median 1.50x, 1 of 1 cases >= 1.3x"),
            "{out}"
        );
        assert!(
            line(&out, "threads per query").contains("loci 2, numpy-threads 2 (equal)"),
            "{out}"
        );
        assert!(out.contains("result-buffer pool: off"), "{out}");
        // A pool of another size than loci's threads is called out.
        let out = goals(&report("1"));
        assert!(
            line(&out, "threads per query").contains("(NOT equal)"),
            "{out}"
        );
    }

    /// A `--pool off` run has no pooled loci rows: its loci rows pair with numpy's fresh result
    /// and the new mapping, and the pool-on lines are left out rather than filled wrongly.
    #[test]
    fn goals_of_a_pool_off_run() {
        let mut rep = report("2");
        rep.results.retain(|r| {
            r.system != "loci-nopool" && r.config.get("threads").map(String::as_str) != Some("os")
        });
        for r in &mut rep.results {
            if r.system == "loci" {
                r.extra.insert("pool".into(), "off".into());
            }
        }
        let out = goals(&rep);
        assert!(!out.contains("pool on "), "{out}");
        // numpy / loci (pool off): 3.0; new mapping: 1.8.
        assert!(line(&out, "loci, pool off vs numpy (").contains("median 3.00x"));
        assert!(line(&out, "loci, pool off vs memcpy into a new mapping").contains("median 1.80x"));
        // Rows of JSON written before the `pool` field count as pool on.
        let mut old = report("2");
        for r in &mut old.results {
            r.extra.remove("pool");
        }
        old.results.retain(|r| r.system != "loci-nopool");
        let out = goals(&old);
        assert!(line(&out, "loci, pool on  vs numpy-threads").contains("median 1.30x"));
        assert!(!out.contains("pool off vs"), "{out}");
    }

    /// loci-nopool repeats `search` when it runs, else the first strategy; only the numpy,
    /// xarray and TileDB peers go to the Python script; every peer name is accepted.
    #[test]
    fn headline_strategy_and_peer_kinds() {
        let s =
            |v: &[&str]| -> Vec<ThreadStrategy> { v.iter().map(|x| x.parse().unwrap()).collect() };
        assert_eq!(
            headline_strategy(&s(&["os", "compact", "search"])),
            Some(&ThreadStrategy::Search)
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
