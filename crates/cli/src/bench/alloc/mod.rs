//! `loci bench alloc`: the allocator microbenchmark of seed 002 and the buffer-passing case of
//! seed 003, for glibc, jemalloc, tcmalloc, tbbmalloc, mimalloc and loci-alloc.
//!
//! Every allocator runs the same code: this binary re-executes itself (`--child CASE`) with the
//! allocator's library in `LD_PRELOAD` (glibc: none) and the child prints one JSON line with its
//! time, its peak RSS above the RSS it had before the timed phase, and the peak of the bytes
//! it had requested and not yet freed. Nothing is installed here: a missing library is
//! reported with its Debian package and its column skipped.
//!
//! The workloads (seed 002's `general`, seed 003's `buffer-passing`) are
//! `loci_alloc::workloads`; this module runs them per allocator and reports. With `--programs`
//! it runs real programs instead (sqlite3, python3, a C++ producer/consumer, DuckDB's TPC-H):
//! see [`programs`].

mod programs;

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};
use clap::Args;
use loci_alloc::workloads::{self, Params, CASES, GENERAL_SLOTS};
use loci_alloc::MEMORYLESS_FALLBACKS;
use loci_report::{median, Machine, Report, Row};
use serde::{Deserialize, Serialize};

use super::common::{
    cpu_seconds, find_system_lib, loci_alloc_stats, max_rss_bytes, Allocator, ALLOCATORS,
    LOCI_CRATE, LOCI_LIB,
};

const DEFAULT_PEERS: &str = "glibc,jemalloc,tcmalloc,tbbmalloc,mimalloc,loci";

#[derive(Args, Debug)]
pub struct AllocArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Threads per case (default: the cpus this process may use, at least 2).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Operations per thread in `general` (default 20M, --quick 2M).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Blocks each thread allocates and passes on in `buffer-passing` (default ops / 16).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub blocks: Option<u64>,
    /// Blocks per message in `buffer-passing` (a thread allocates a batch, sends it, then
    /// frees the batch it received: about two batches per thread are live at a time).
    #[arg(long, default_value_t = 1024)]
    pub batch: usize,
    /// Allocators to compare, comma separated: glibc, jemalloc, tcmalloc, tbbmalloc, mimalloc,
    /// loci, and loci-small-system (loci with blocks below 8 KiB delegated to glibc).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_PEERS)]
    pub peers: Vec<String>,
    /// Cases to run, comma separated: general, buffer-passing.
    #[arg(long, value_delimiter = ',', default_value = "general,buffer-passing")]
    pub cases: Vec<String>,
    /// libloci_malloc.so to use for `loci` (default: next to this executable, where
    /// `cargo build --release` puts it).
    #[arg(long, value_name = "FILE")]
    pub loci_lib: Option<PathBuf>,
    /// Run real programs under every allocator instead of the synthetic cases: the sqlite3
    /// shell on a fixed SQL workload (bench/alloc/workload.sql), python3 on an allocation-heavy
    /// script (bench/alloc/alloc_heavy.py), a multithreaded C++ producer/consumer whose blocks
    /// are freed by other threads (bench/alloc/prodcons.cpp, compiled here with g++ -O2
    /// -pthread), and DuckDB answering the 22 TPC-H queries (bench/peers/.venv, made by
    /// `bench/peers/setup --tpch`). Each program does fixed work; its output must be the same
    /// under every allocator (a crash or a different answer is reported, not timed). Reports
    /// the median wall time, the peak RSS of the program's process tree, the ratio to the best
    /// allocator, and whether the program really ran on the preloaded malloc (it may link its
    /// own). A program whose tool is not installed is skipped with a note. Try
    /// `loci bench alloc --programs --quick` first (smaller inputs, 3 reps: 1-2 minutes); the
    /// default (5 reps) takes about 10 minutes. --threads sets the C++ program's producers and
    /// consumers (half each) and DuckDB's threads.
    #[arg(long)]
    pub programs: bool,
    /// With --programs: which programs, comma separated: sqlite3, python3, cxx, duckdb-tpch.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sqlite3,python3,cxx,duckdb-tpch",
        requires = "programs"
    )]
    pub program: Vec<String>,
    /// With --programs: TPC-H scale factor for duckdb-tpch: 0.01, 0.1 or 1 (default 0.1,
    /// --quick 0.01). The tables are generated once into ${XDG_CACHE_HOME:-~/.cache}/loci/tpch.
    #[arg(long, requires = "programs")]
    pub sf: Option<String>,
    /// Internal: run one case in this process and print its measurement as JSON.
    #[arg(long, hide = true)]
    pub child: Option<String>,
}

/// What a child measured (the JSON line it prints).
#[derive(Debug, Serialize, Deserialize)]
pub struct ChildResult {
    pub seconds: f64,
    /// Peak RSS minus the RSS before the timed phase.
    pub rss_bytes: u64,
    /// Peak RSS of the whole process.
    pub max_rss_bytes: u64,
    /// Peak of bytes requested and not yet freed (summed over threads).
    pub requested_bytes: u64,
    /// Operations (general) or blocks passed (buffer-passing).
    pub work: u64,
    /// Bytes allocated in total.
    pub bytes: u64,
    pub checksum: u64,
    /// loci-alloc's own counters when the child ran on it (see `loci_alloc_stats` in
    /// libloci_malloc.so), by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loci_stats: Option<std::collections::BTreeMap<String, u64>>,
}

pub fn run(a: AllocArgs) -> anyhow::Result<Report> {
    let cpus = loci_place::sys::get_affinity(0)
        .map(|c| c.len())
        .unwrap_or(2);
    let threads = a.threads.unwrap_or(cpus.max(2));
    anyhow::ensure!(threads >= 1, "--threads must be at least 1");
    let ops = a.ops.unwrap_or(if a.common.quick {
        2_000_000
    } else {
        20_000_000
    });
    anyhow::ensure!(ops > 0, "--ops must be positive");
    if a.programs {
        return programs::run(&a, threads);
    }
    let blocks = a.blocks.unwrap_or((ops / 16).max(1));
    let params = Params {
        threads,
        ops,
        blocks,
        batch: a.batch,
    };
    if let Some(case) = &a.child {
        let m = workloads::run(case, params).map_err(anyhow::Error::msg)?;
        let max_rss = max_rss_bytes();
        let r = ChildResult {
            seconds: m.seconds,
            rss_bytes: max_rss.saturating_sub(m.rss_before),
            max_rss_bytes: max_rss,
            requested_bytes: m.requested_bytes,
            work: m.work,
            bytes: m.bytes,
            checksum: m.checksum,
            loci_stats: loci_alloc_stats(),
        };
        println!("{}", serde_json::to_string(&r)?);
        std::process::exit(0);
    }
    for c in &a.cases {
        anyhow::ensure!(
            CASES.contains(&c.as_str()),
            "unknown case {c:?}; valid cases: {}",
            CASES.join(", ")
        );
    }
    if a.cases.iter().any(|c| c == "buffer-passing") {
        anyhow::ensure!(threads >= 2, "buffer-passing needs --threads 2 or more");
    }
    anyhow::ensure!(a.batch > 0, "--batch must be positive");
    let reps = a.common.reps.unwrap_or(5);
    let (exe, chosen) = choose_allocators(&a)?;

    let topo = crate::this_machine()?;
    let mut rep = Report::new(
        "alloc",
        serde_json::json!({
            "threads": threads, "ops_per_thread": ops, "blocks_per_thread": blocks,
            "reps": reps, "general_slots_per_thread": GENERAL_SLOTS,
            "general_sizes": "classes 16 B..512 KiB, P(class) ~ 1/size",
            "buffer_sizes": "8193 B..512 KiB (power-of-two classes, P(class) ~ 1/size)",
            "buffer_batch": a.batch,
            "rss": "peak RSS minus RSS before the timed phase",
            "requested": "peak of bytes requested and not yet freed",
        }),
        Machine::of(&topo),
    );
    for case in &a.cases {
        // Each rep runs every allocator once, in an order rotated by one per rep (as `loci bench
        // sched` does): a load spike on the host then hits one rep of every allocator rather
        // than every rep of one, and the medians stay comparable.
        let mut times = vec![Vec::new(); chosen.len()];
        let mut results: Vec<Vec<ChildResult>> = (0..chosen.len()).map(|_| Vec::new()).collect();
        let mut cpus = vec![Vec::new(); chosen.len()];
        for r in 0..reps {
            for k in 0..chosen.len() {
                let i = (k + r) % chosen.len();
                let (al, lib) = &chosen[i];
                let mut cmd = Command::new(&exe);
                cmd.args(["bench", "alloc", "--child", case])
                    .args(["--threads", &threads.to_string()])
                    .args(["--ops", &ops.to_string()])
                    .args(["--blocks", &blocks.to_string()])
                    .args(["--batch", &a.batch.to_string()]);
                cmd.env_remove("LD_PRELOAD");
                cmd.env_remove("LOCI_ALLOC_SMALL");
                if let Some(l) = lib {
                    cmd.env("LD_PRELOAD", l);
                }
                for (k, v) in al.env {
                    cmd.env(k, v);
                }
                eprint!("alloc: {case} {} rep {}/{reps} ... ", al.name, r + 1);
                std::io::stderr().flush().ok();
                let cpu0 = cpu_seconds(libc::RUSAGE_CHILDREN);
                let out = cmd.output().context("cannot start the benchmark child")?;
                cpus[i].push(cpu_seconds(libc::RUSAGE_CHILDREN) - cpu0);
                if !out.status.success() {
                    eprintln!("failed");
                    bail!(
                        "{case} on {} failed ({}): {}",
                        al.name,
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                let text = String::from_utf8_lossy(&out.stdout);
                let line = text.lines().last().unwrap_or("");
                let res: ChildResult = serde_json::from_str(line)
                    .with_context(|| format!("child of {} printed {line:?}", al.name))?;
                eprintln!("{:.3} s", res.seconds);
                times[i].push(res.seconds);
                results[i].push(res);
            }
        }
        for (((al, lib), times), (results, cpus)) in
            chosen.iter().zip(times).zip(results.into_iter().zip(cpus))
        {
            // RSS: the worst rep (a user meets the worst case); time: the median rep.
            let rss = results.iter().map(|r| r.rss_bytes).max().unwrap_or(0);
            let req = results.iter().map(|r| r.requested_bytes).max().unwrap_or(0);
            let (work, unit) = if case == "general" {
                (results[0].work as f64 * threads as f64, "ops/s")
            } else {
                (results[0].bytes as f64, "B/s")
            };
            let mut row = Row::from_times(al.name, times)
                .case(case)
                .config("threads", threads)
                .work(work, unit)
                .extra("rss_over_requested", rss as f64 / req.max(1) as f64)
                .extra("cpu_s_median", median(&cpus).unwrap_or(0.0))
                .extra(
                    "max_rss_bytes",
                    results.iter().map(|r| r.max_rss_bytes).max(),
                );
            if let Some(l) = lib {
                row = row.extra("library", l.display().to_string());
            }
            if let Some(st) = results.last().and_then(|r| r.loci_stats.clone()) {
                row = row.extra("loci_stats", st);
            }
            row.rss_bytes = Some(rss);
            row.requested_bytes = Some(req);
            rep.results.push(row);
        }
    }
    Ok(rep)
}

/// An allocator to run and the library to preload for it (`None`: glibc).
pub(crate) type Chosen = (&'static Allocator, Option<PathBuf>);

/// This executable, and the allocators of `--peers` that can run here, each with the library
/// to preload (`None`: glibc; loci's is `--loci-lib` or the one built beside this executable).
/// A missing library is reported with its Debian package (or the crate that builds it) and left
/// out; an unknown name is an error naming the valid ones.
pub(crate) fn choose_allocators(a: &AllocArgs) -> anyhow::Result<(PathBuf, Vec<Chosen>)> {
    let exe = std::env::current_exe().context("cannot find the loci executable")?;
    let loci_lib = a
        .loci_lib
        .clone()
        .unwrap_or_else(|| exe.with_file_name(LOCI_LIB));
    let mut chosen: Vec<Chosen> = Vec::new();
    for name in &a.peers {
        let Some(al) = ALLOCATORS.iter().find(|x| x.name == name) else {
            let valid: Vec<&str> = ALLOCATORS.iter().map(|x| x.name).collect();
            bail!("unknown allocator {name:?}; valid: {}", valid.join(", "));
        };
        let lib = if al.name.starts_with("loci") {
            if !loci_lib.exists() {
                eprintln!(
                    "alloc: {} not found (build it: cargo build --release -p {LOCI_CRATE}, or pass --loci-lib); column {} skipped",
                    loci_lib.display(),
                    al.name
                );
                continue;
            }
            Some(loci_lib.to_path_buf())
        } else if let Some(file) = al.lib {
            match find_system_lib(file) {
                Some(p) => Some(p),
                None => {
                    eprintln!(
                        "alloc: {file} not found; install the Debian package {} (scripts/install-deps installs it); column {} skipped",
                        al.package, al.name
                    );
                    continue;
                }
            }
        } else {
            None
        };
        chosen.push((al, lib));
    }
    Ok((exe, chosen))
}

/// The rows the table's ratios are against: the fastest peer of each case.
/// With `--programs`: the fastest allocator of each program.
pub fn baseline(rep: &Report) -> impl Fn(&Row) -> bool {
    let best: Vec<(Option<String>, String)> = if programs::is_programs(rep) {
        programs::best_rows(rep)
            .map(|r| (r.case.clone(), r.system.clone()))
            .collect()
    } else {
        CASES
            .iter()
            .filter_map(|c| best_peer(rep, c).map(|r| (r.case.clone(), r.system.clone())))
            .collect()
    };
    move |r| best.iter().any(|(c, s)| *c == r.case && *s == r.system)
}

/// The fastest row of a case that is not loci: the peer the goals are measured against.
fn best_peer<'a>(rep: &'a Report, case: &'a str) -> Option<&'a Row> {
    rep.rows_of(Some(case))
        .filter(|r| !r.system.starts_with("loci"))
        .min_by(|a, b| a.median_s.total_cmp(&b.median_s))
}

/// loci's throughput against `best`'s paired by rep: every rep runs each allocator once, seconds
/// apart, so the per-rep ratio `best time / loci time` cancels the machine's drift between reps,
/// which the ratio of the two medians above does not. The median of those ratios with its 95%
/// bootstrap interval (the project's noise statistic, `crate::stats`) says whether this run
/// resolves the 1.0x goal at all.
fn paired_line(case: &str, best: &Row, loci: &Row) -> String {
    let ratios: Vec<f64> = best
        .times_s
        .iter()
        .zip(&loci.times_s)
        .filter(|(_, l)| **l > 0.0)
        .map(|(b, l)| b / l)
        .collect();
    let n = ratios.len();
    // As for `loci advise`'s verdicts: a bootstrap over fewer pairs understates the spread.
    let min = crate::stats::MIN_RUNS;
    if n < min {
        return format!(
            "{case}: paired by rep: {n} rep(s), too few for an interval (at least {min}; --reps)\n"
        );
    }
    let m = crate::stats::median(&ratios);
    let (lo, hi) = crate::stats::median_interval(&ratios, 0.05, 0x5eed_a110c);
    let reading = if lo > 1.0 {
        "loci faster, resolved by this run"
    } else if hi < 1.0 {
        "loci slower, resolved by this run"
    } else {
        "the interval holds 1.00x: this run does not resolve the goal"
    };
    format!(
        "{case}: paired by rep, loci throughput {m:.2}x {}'s (95% interval {lo:.2}-{hi:.2}x over {n} reps): {reading}\n",
        best.system
    )
}

/// Lines that state loci's ratios against the best peer and the goals.
pub fn goals(rep: &Report) -> String {
    if programs::is_programs(rep) {
        return programs::goals(rep);
    }
    let mut out = String::new();
    for case in CASES {
        let (Some(best), Some(loci)) = (
            best_peer(rep, case),
            rep.rows_of(Some(case)).find(|r| r.system == "loci"),
        ) else {
            continue;
        };
        let speed = best.median_s / loci.median_s;
        let rss =
            loci.rss_bytes.unwrap_or(0) as f64 / loci.requested_bytes.unwrap_or(1).max(1) as f64;
        out += &format!(
            "{case}: loci throughput {speed:.2}x of the best peer ({}), loci RSS {rss:.2}x of bytes requested",
            best.system
        );
        // The general-purpose malloc's goals: at least the best of the five everywhere.
        let max_rss = if case == "buffer-passing" { 1.15 } else { 1.3 };
        out += &format!(" (goal: >= 1.00x throughput, <= {max_rss:.2}x RSS)");
        let met = speed >= 1.0 && rss <= max_rss;
        out += if met { ": met" } else { ": NOT met" };
        let cpu = |r: &Row| r.extra.get("cpu_s_median").and_then(|v| v.as_f64());
        if let (Some(b), Some(l)) = (cpu(best), cpu(loci)) {
            out += &format!(" [CPU seconds: loci {l:.2}, {} {b:.2}]", best.system);
        }
        out += "\n";
        out += &paired_line(case, best, loci);
    }
    // Threads that ran on a node without memory got memory of another node: loci's rows then
    // do not measure node-local allocation, and the user should know.
    for r in rep.results.iter().filter(|r| r.system.starts_with("loci")) {
        let n = r
            .extra
            .get("loci_stats")
            .and_then(|s| s.get(MEMORYLESS_FALLBACKS))
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        if n > 0 {
            out += &format!(
                "NOTE {} {}: {n} thread heap(s) started on a node without memory and got memory of the nearest node with memory\n",
                r.system,
                r.case.as_deref().unwrap_or("")
            );
        }
    }
    for case in CASES {
        let rows: Vec<String> = rep
            .rows_of(Some(case))
            .map(|r| {
                format!(
                    "{} {:.2}",
                    r.system,
                    r.rss_bytes.unwrap_or(0) as f64 / r.requested_bytes.unwrap_or(1).max(1) as f64
                )
            })
            .collect();
        if !rows.is_empty() {
            out += &format!("{case} RSS / requested: {}\n", rows.join(", "));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(mimalloc: &[f64], loci: &[f64]) -> Report {
        let mut rep = Report::new(
            "alloc",
            serde_json::json!({ "threads": 2 }),
            Machine::default(),
        );
        for (name, times) in [
            ("glibc", vec![9.0; mimalloc.len()]),
            ("mimalloc", mimalloc.to_vec()),
            ("loci", loci.to_vec()),
        ] {
            let mut row = Row::from_times(name, times).case("general");
            row.rss_bytes = Some(140);
            row.requested_bytes = Some(100);
            rep.results.push(row);
        }
        rep
    }

    fn paired(out: &str) -> &str {
        out.lines()
            .find(|l| l.starts_with("general: paired by rep"))
            .unwrap_or_else(|| panic!("{out}"))
    }

    #[test]
    fn a_drifting_machine_is_cancelled_by_pairing() {
        // The machine slows down 4x over the run and loci is 5% faster in every rep: every pair
        // says 1.05, so the interval is that point and the run resolves it.
        let mi = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0];
        let lo: Vec<f64> = mi.iter().map(|t| t / 1.05).collect();
        let out = goals(&report(&mi, &lo));
        assert!(
            out.contains("general: loci throughput 1.05x of the best peer (mimalloc)"),
            "{out}"
        );
        let line = paired(&out);
        assert!(
            line.contains("loci throughput 1.05x mimalloc's (95% interval 1.05-1.05x over 7 reps)"),
            "{line}"
        );
        assert!(
            line.ends_with("loci faster, resolved by this run"),
            "{line}"
        );
    }

    #[test]
    fn noise_around_one_is_not_resolved_and_few_reps_get_no_interval() {
        let mi = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        let lo = [0.9, 1.1, 0.95, 1.05, 0.92, 1.08];
        let line = paired(&goals(&report(&mi, &lo))).to_string();
        assert!(
            line.ends_with("this run does not resolve the goal"),
            "{line}"
        );
        let slow = [1.2, 1.25, 1.3, 1.2, 1.22];
        let line = paired(&goals(&report(&mi[..5], &slow))).to_string();
        assert!(
            line.ends_with("loci slower, resolved by this run"),
            "{line}"
        );
        let line = paired(&goals(&report(&mi[..3], &lo[..3]))).to_string();
        assert!(
            line.contains("3 rep(s), too few for an interval (at least 5"),
            "{line}"
        );
    }
}
