//! `loci bench subarray`: seed 000's subarray on a seismic velocity volume, under thread
//! strategies, against numpy / xarray / TileDB on the same bytes and memcpy of the same bytes.
//!
//! Rows: one per case (`c<chunks>/<span>/s<selectivity>`) and system/strategy. Throughput is bytes
//! of result per second. loci rows carry the local-access ratio (move_pages samples of the source
//! pages each thread read), the pinning used, and for adaptive strategies the trials it took.

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
    /// Peers on the same volume in the same run: numpy, xarray, tiledb (Python, from
    /// bench/peers/.venv: run bench/peers/setup --subarray once), memcpy (same bytes, one thread).
    #[arg(long, value_delimiter = ',', default_value = "numpy,xarray,memcpy")]
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

/// Wrapping sum of the little-endian u32 words (the checksum the Python peers compute too).
fn sum32(b: &[u8]) -> u64 {
    b.chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")) as u64)
        .fold(0u64, u64::wrapping_add)
}

fn repo_root() -> PathBuf {
    // The binary lives in target/<profile>/; the peers live in the source tree.
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors()
        .find(|p| p.join("bench/peers/subarray.py").exists())
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().unwrap_or_default())
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
        if !["numpy", "xarray", "tiledb", "memcpy"].contains(&p.as_str()) {
            bail!("unknown peer `{p}`; valid: numpy, xarray, tiledb, memcpy");
        }
    }
    // The Python peers' interpreter, checked before the loci matrix runs (not after minutes of it).
    let python = a
        .python
        .clone()
        .unwrap_or_else(|| repo_root().join("bench/peers/.venv/bin/python"));
    if a.peers.iter().any(|p| p != "memcpy") && !python.is_file() {
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
    let mut cache = SearchCache::default_path().map(|p| SearchCache::open(&p));
    let mut rep = Report::new(
        "subarray",
        serde_json::json!({
            "shape": shape, "dtype": "f32", "bytes": side * side * side * 4,
            "chunks": a.chunks, "selectivity": a.selectivity, "span": a.span,
            "threads": nthreads, "mem": mem.to_string(), "huge_pages": huge, "reps": reps,
            "seed": Seismic::default().seed, "layers": Seismic::default().layers,
            "pool": a.pool, "pool_cap": pool_cap, "stream_bytes": opts.stream_bytes,
            "inline_bytes": opts.inline_bytes, "inline_bytes_pooled": opts.inline_bytes_pooled,
        }),
        Machine::of(&topo),
    );
    let mut queries = Vec::new(); // for the Python peers
                                  // One step per (case, strategy), one per case for memcpy, one for the Python peers.
    let cases = (a.chunks.len() * spans.len() * a.selectivity.len()) as u64;
    let py_steps = u64::from(a.peers.iter().any(|p| p != "memcpy"));
    let memcpy_steps = if a.peers.iter().any(|p| p == "memcpy") {
        cases
    } else {
        0
    };
    let pb = Progress::new(cases * strategies.len() as u64 + memcpy_steps + py_steps);
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
        if volume_file.is_none() && a.peers.iter().any(|p| p != "memcpy") {
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
    let py_peers: Vec<&String> = a.peers.iter().filter(|p| *p != "memcpy").collect();
    if let (false, Some((path, vsum))) = (py_peers.is_empty(), &volume_file) {
        let root = repo_root();
        let tdb = std::env::temp_dir().join(format!("loci-subarray-tiledb-{}", std::process::id()));
        let job = serde_json::json!({
            "file": path, "shape": shape, "dtype": "<f4", "sum32": vsum, "reps": reps,
            "peers": py_peers, "tiledb_dir": tdb, "queries": queries,
        });
        let job_path = path.with_extension("json");
        std::fs::write(&job_path, serde_json::to_string(&job)?)?;
        pb.start(format!(
            "peers {py_peers:?} with {} (all cases)",
            python.display()
        ));
        let out = Command::new(&python)
            .arg(root.join("bench/peers/subarray.py"))
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
            rep.results.push(
                Row::from_times(&sys, times)
                    .case(&case)
                    .config("threads", 1)
                    .work(bytes_of(&case), "B/s")
                    .extra("version", v["version"].clone())
                    .extra("sum32", sum),
            );
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

/// The bars from this run: per case, `search` (else the first loci strategy) against
/// numpy (speed-up, bar 1.3x) and against both memcpy peers (bandwidth ratio, bar 0.8x), and the
/// result-buffer pool's counters.
pub fn goals(rep: &Report) -> String {
    let mut cases: Vec<&str> = Vec::new();
    for r in &rep.results {
        if let Some(c) = r.case.as_deref() {
            if !cases.contains(&c) {
                cases.push(c);
            }
        }
    }
    let mut ratios: [(Vec<f64>, &str, f64); 3] = [
        (Vec::new(), "numpy (speed-up)", 1.3),
        (
            Vec::new(),
            "memcpy into a prefaulted buffer (the limit)",
            0.8,
        ),
        (
            Vec::new(),
            "memcpy into a new mapping (page faults included)",
            0.8,
        ),
    ];
    for case in &cases {
        let rows: Vec<&Row> = rep.rows_of(Some(case)).collect();
        let loci = rows
            .iter()
            .filter(|r| r.system == "loci")
            .find(|r| r.config.get("threads").map(String::as_str) == Some("search"))
            .or_else(|| rows.iter().find(|r| r.system == "loci"));
        let Some(loci) = loci else { continue };
        let peer = |sys: &str, dst: Option<&str>| {
            rows.iter()
                .find(|r| {
                    r.system == sys
                        && dst.is_none_or(|d| r.config.get("dst").map(String::as_str) == Some(d))
                })
                .map(|r| r.median_s / loci.median_s)
        };
        for (i, p) in [
            peer("numpy", None),
            peer("memcpy", Some("prefaulted")),
            peer("memcpy", Some("new-mapping")),
        ]
        .into_iter()
        .enumerate()
        {
            if let Some(x) = p {
                ratios[i].0.push(x);
            }
        }
    }
    let mut out = String::from(
        "
subarray goals (loci `search`, or the first loci strategy, per case; medians of the reps):
",
    );
    for (v, what, bar) in ratios {
        if v.is_empty() {
            continue;
        }
        let n = v.len();
        let met = v.iter().filter(|&&x| x >= bar).count();
        out += &format!(
            "  vs {what}: median {:.2}x, {met} of {n} cases >= {bar}x\n",
            median(&v).unwrap_or(0.0)
        );
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
}
