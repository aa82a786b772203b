//! `loci bench WORKLOAD`: every workload writes the one result format of BENCHMARKS.md.
//!
//! Adding a workload: a file `bench/NAME.rs` with an `Args` struct (flatten [`Common`]) and
//! `run(args) -> anyhow::Result<Report>`, and a variant in [`BenchCmd`].

use std::path::PathBuf;

use clap::{Args, Subcommand};
use loci_report::Report;

mod alloc;
pub(crate) mod common;
mod deploy;
mod engine;
mod memcpy;
mod sched;
mod stream;
mod subarray;
pub(crate) mod tpch;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Single-thread memory copy bandwidth: the ceiling other copy workloads are compared to.
    Memcpy(memcpy::MemcpyArgs),
    /// Task scheduling (seed 003): locality-aware LAS vs NLS, unpinned and rayon; tiny tasks,
    /// 16 concurrent pipeline requests, one request. Prints ratios vs rayon and LAS counters.
    Sched(sched::SchedArgs),
    /// Allocators compared (glibc, jemalloc, tcmalloc, tbbmalloc, mimalloc, loci): seed 002's
    /// microbenchmark (`general`) and seed 003's buffer passing between threads
    /// (`buffer-passing`); time, peak RSS and bytes requested. Each allocator runs in a child
    /// of this binary with its Debian library in LD_PRELOAD. `--programs` runs real programs
    /// under each allocator instead: sqlite3, python3, a C++ producer/consumer and DuckDB's TPC-H.
    Alloc(alloc::AllocArgs),
    /// Seed 000's subarray: copy a box of a chunked seismic volume under thread strategies
    /// (os, compact, sparse, shared, best-of:K, elastic, search); GB/s of result, speedup vs
    /// `os`, local-access ratio; numpy/xarray/TileDB and memcpy on the same bytes. A case with a
    /// result under 13 MiB gets more timed reps than --reps, the same for every system: enough
    /// to copy 64 MiB, at most 1000.
    Subarray(subarray::SubarrayArgs),
    /// Streaming (seed 001): loci's pipeline vs `lz4 | nc` and raw `nc` on loopback, the plan vs
    /// OS placement, and the two LZ4 implementations on one core.
    Stream(stream::StreamArgs),
    /// W1 holistic aggregation: exact median of v by key (seed 002), over the matrix
    /// threads x memory policy x allocator; --peers duckdb,polars on the same rows.
    W1(engine::EngineArgs),
    /// W2 distributive aggregation: count, sum, min, max, avg of v by key (seed 002).
    W2(engine::EngineArgs),
    /// W3 hash join R (S/16 rows) with S on key: shared table and per-node partitioned variants.
    W3(engine::EngineArgs),
    /// W4 index nested-loop join over a sorted array, B-tree, skip list or ART built on R;
    /// build and probe timed apart.
    W4(engine::EngineArgs),
    /// W5 TPC-H (seed 002): the 22 queries on DuckDB, PostgreSQL and DataFusion, each run under
    /// `loci run` with every configuration of --alloc x --threads x --mem x --thp; per-query
    /// medians, geometric mean and ratios to the engine's default, answers checked across engines.
    Tpch(tpch::TpchArgs),
    /// Dask dataframe workloads (a group-by like W2, a join like W3, data made in the workers) on
    /// a cluster `loci deploy dask` lays out as WIM, WIN and WIC with the same total threads;
    /// ratios to WIM, answers compared across designs, time from the command to every instance
    /// verified and to every worker joined.
    Deploy(deploy::DeployArgs),
}

/// Flags every benchmark takes.
#[derive(Args, Clone, Debug)]
pub struct Common {
    /// Small preset that finishes in about a minute.
    #[arg(long)]
    pub quick: bool,
    /// Repetitions per configuration (median, min and max are reported).
    #[arg(long, value_parser = crate::at_least_one)]
    pub reps: Option<usize>,
    /// Write the results as JSON (the result format of BENCHMARKS.md).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw the results as an SVG bar chart.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

impl Common {
    /// `--reps` when given, else the workload's default: `quick` under `--quick`, else `full`.
    pub fn reps_or(&self, quick: usize, full: usize) -> usize {
        self.reps.unwrap_or(if self.quick { quick } else { full })
    }
}

/// A workload's defaults for [`Matrix`]: the thread placements and memory policies it sweeps
/// without flags.
pub trait MatrixDefaults: Clone + std::fmt::Debug + Send + Sync + 'static {
    const THREADS: &'static str;
    const MEM: &'static str;
}

/// The axes of a workload's configuration matrix that `loci run` also takes: thread placement,
/// memory policy and allocator, each a list; the workload runs every combination.
#[derive(Args, Clone, Debug)]
pub struct Matrix<D: MatrixDefaults> {
    /// Thread placements, comma separated, in loci-place's strategy vocabulary (as `loci plan`
    /// and `loci run --threads`): os (not pinned; the OS places the threads), sparse
    /// (round-robin over nodes), compact (fill a node first), shared:G, group, nodes:LIST,
    /// cpus:LIST, random:SEED. Write lists inside a strategy as ranges (nodes:0-1): commas
    /// separate strategies here.
    #[arg(long, value_delimiter = ',', default_value = D::THREADS)]
    pub threads: Vec<String>,
    /// Memory policies, comma separated, in loci-place's vocabulary (as `loci plan` and
    /// `loci run --mem`): first-touch (each page where the thread that first writes it runs),
    /// interleave[:NODES], bind:NODES, per-node[:NODES] and round-robin[:NODES] (w1-w4: morsel i
    /// of m on node i*k/m, each node holding a contiguous share, or on the (i mod k)-th node),
    /// ... Write lists inside a policy as ranges (per-node:0-1): commas separate policies here.
    #[arg(long, value_delimiter = ',', default_value = D::MEM)]
    pub mem: Vec<String>,
    /// Allocators, comma separated: glibc, jemalloc, tcmalloc, tbbmalloc, mimalloc, and for tpch
    /// also loci. Each but glibc is preloaded from its library (LD_PRELOAD, as
    /// `loci run --alloc`); w1-w4 run it in a child process of the bench. w1-w4 started on a
    /// preloaded allocator (`loci run --alloc X -- loci bench w3`) label their glibc rows X.
    #[arg(long, value_delimiter = ',', default_value = "glibc")]
    pub alloc: Vec<String>,
    #[arg(skip)]
    defaults: std::marker::PhantomData<D>,
}

impl<D: MatrixDefaults> Matrix<D> {
    /// The `--threads` strategies; an unknown one is named with loci-place's valid choices.
    pub fn strategies(&self) -> anyhow::Result<Vec<loci_place::Strategy>> {
        self.threads
            .iter()
            .map(|s| s.parse().map_err(|e| anyhow::anyhow!("--threads {s}: {e}")))
            .collect()
    }
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Memcpy(a) => {
            let common = a.common.clone();
            let rep = memcpy::run(a)?;
            finish(&rep, &common, |r| r.system == "loci")
        }
        BenchCmd::Sched(a) => {
            let common = a.common.clone();
            let check = a.check_locality;
            let rep = sched::run(a)?;
            if check {
                return Ok(());
            }
            finish(&rep, &common, |r| r.system == "rayon")?;
            sched::print_counters(&rep);
            Ok(())
        }
        BenchCmd::Subarray(a) => {
            let common = a.common.clone();
            let rep = subarray::run(a)?;
            let os = |r: &loci_report::Row| {
                r.system == "loci" && r.config.get("threads").map(String::as_str) == Some("os")
            };
            finish_with_goals(&rep, &common, os, subarray::goals)
        }
        BenchCmd::Alloc(a) => {
            let common = a.common.clone();
            let rep = alloc::run(a)?;
            finish_with_goals(&rep, &common, alloc::baseline(&rep), alloc::goals)
        }
        BenchCmd::Stream(a) => {
            let common = a.common.clone();
            let rep = stream::run(a)?;
            // Ratios against the lz4 | nc pipeline (end to end) and the C library (codecs).
            finish(&rep, &common, |r| {
                r.system == "lz4-nc" || r.system == "lz4-c"
            })
        }
        BenchCmd::W1(a) => run_engine(engine::Workload::W1, a),
        BenchCmd::W2(a) => run_engine(engine::Workload::W2, a),
        BenchCmd::W3(a) => run_engine(engine::Workload::W3, a),
        BenchCmd::W4(a) => run_engine(engine::Workload::W4, a),
        BenchCmd::Tpch(a) => {
            let common = a.common.clone();
            let rep = tpch::run(a)?;
            finish_with_goals(&rep, &common, tpch::baseline, tpch::summary)
        }
        BenchCmd::Deploy(a) => {
            let common = a.common.clone();
            let rep = deploy::run(a)?;
            finish_with_goals(&rep, &common, deploy::baseline, deploy::summary)?;
            deploy::answers_agree(&rep)
        }
    }
}

fn run_engine(w: engine::Workload, a: engine::EngineArgs) -> anyhow::Result<()> {
    let common = a.common.clone();
    let child = std::env::var_os("LOCI_BENCH_ALLOC_CHILD").is_some();
    let rep = engine::run(w, a)?;
    if child {
        if let Some(p) = &common.json {
            rep.write_json(p)?;
        }
        return Ok(());
    }
    finish(&rep, &common, engine::baseline(&rep))?;
    for line in engine::peer_ratios(&rep) {
        println!("{line}");
    }
    Ok(())
}

/// Prints the table (ratios against the first row that `is_baseline` picks) and writes the
/// JSON and plot files that were asked for.
pub fn finish(
    rep: &Report,
    common: &Common,
    is_baseline: impl Fn(&loci_report::Row) -> bool,
) -> anyhow::Result<()> {
    println!("{}", rep.table(is_baseline));
    if let Some(p) = &common.json {
        rep.write_json(p)?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &common.plot {
        rep.plot_svg(p)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

/// [`finish`], then the workload's lines on its goals.
fn finish_with_goals(
    rep: &Report,
    common: &Common,
    is_baseline: impl Fn(&loci_report::Row) -> bool,
    goals: fn(&Report) -> String,
) -> anyhow::Result<()> {
    finish(rep, common, is_baseline)?;
    print!("{}", goals(rep));
    Ok(())
}

/// The source of a memcpy peer: `bytes` bytes of varied data, hidden from the optimizer.
///
/// A source made as `vec![c; n]` lets LLVM see that it holds one repeated byte and turn the
/// peer's copy into a `memset` of the destination (no source read at all: half the memory
/// traffic of a copy, so the "memcpy limit" came out twice as fast as any real copy). The data
/// here varies per word and reaches the copy through `black_box`, so the peer reads every byte.
pub fn memcpy_source(bytes: usize) -> Vec<u8> {
    let mut v = vec![0u8; bytes];
    for (i, w) in v.chunks_mut(8).enumerate() {
        let x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes();
        w.copy_from_slice(&x[..w.len()]);
    }
    std::hint::black_box(v)
}

/// Whether `dst` holds a copy of `src`, checked at a few spread positions (cheap; it catches a
/// copy that was skipped or replaced by a fill).
pub fn copied(src: &[u8], dst: &[u8]) -> bool {
    src.len() == dst.len()
        && (0..16).all(|k| {
            let i = k * src.len() / 16;
            src.get(i..(i + 8).min(src.len())) == dst.get(i..(i + 8).min(dst.len()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memcpy peer's source is not one repeated byte (which the optimizer folds into a
    /// memset of the destination), and `copied` tells a copy from a fill or a skipped copy.
    #[test]
    fn memcpy_source_varies_and_copied_checks_the_bytes() {
        let src = memcpy_source(1 << 16);
        assert_eq!(src.len(), 1 << 16);
        assert!(src.windows(2).any(|w| w[0] != w[1]));
        assert!(src[..8] != src[8..16]);
        let mut dst = vec![0u8; src.len()];
        assert!(!copied(&src, &dst));
        dst.fill(src[0]);
        assert!(!copied(&src, &dst));
        dst.copy_from_slice(&src);
        assert!(copied(&src, &dst));
        assert!(!copied(&src, &dst[1..]));
        assert_eq!(memcpy_source(13).len(), 13);
    }
}
