//! The `loci` command line, as a library: the binary (`src/main.rs`) calls [`main`]; the fuzz
//! targets reach the parsers of outside input through [`inputs`].

use clap::{Parser, Subcommand};

mod advise;
mod bench;
mod deploy;
mod os_cmd;
mod plan_cmd;
mod run_cmd;
mod stats;
mod stream;
mod topo;
pub mod topo_args;

/// The parsers of outside input that live in this crate (the library crates' parsers have fuzz
/// targets of their own): command-line values, `loci deploy` templates and manifests, the
/// advise cache, a program's output read with `advise --metric`, and /proc/vmstat. Exported for
/// the fuzz target `cli_text` (fuzz/fuzz_targets/cli_text.rs); not an API.
#[doc(hidden)]
pub mod inputs {
    pub use crate::advise::output::parse_cached;
    pub use crate::advise::parse_duration;
    pub use crate::advise::trial::{parse_metric, parse_vmstat};
    pub use crate::at_least_one;
    pub use crate::bench::tpch::parse_queries;
    pub use crate::deploy::dask::{parse_address, parse_nthreads};
    pub use crate::deploy::manifest::Manifest;
    pub use crate::deploy::parse_grace;
    pub use crate::deploy::template::{Template, Values, PLACEHOLDERS};
    pub use crate::run_cmd::parse_wait;
    pub use crate::stream::{parse_bytes, parse_usize_bytes};
}

/// loci places threads and memory on purpose on NUMA machines, and proves where they ended up.
#[derive(Parser)]
#[command(
    name = "loci",
    version,
    about,
    long_about = None,
    after_help = "\
A first session:
  loci advise                                how a workload should run here (threads, memory,
                                             allocator, THP): rules, then measured trials
  loci topo                                  this machine: nodes, cpus, caches, distances, NICs
  loci plan --preset opteron-8220-8s --threads sparse -n 8
                                             where 8 threads would go on another machine
  loci run --threads compact -n 4 --mem interleave --verify -- ./my-program
                                             run a program placed, then show plan vs actual
  loci bench w2 --quick --peers duckdb       a workload against a peer, in the same run

Cpu and node lists use the kernel's syntax (0-3,8,10-11), plus `all` and `!LIST`.
`loci COMMAND --help` explains each command."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Advise(advise::AdviseCmd),
    /// Show a machine: nodes, cpus, caches, memory, distances, devices (this one or another).
    ///
    /// Shows nodes, cpus, cores and SMT siblings, caches and which cpus share them, memory per
    /// node, the distance matrix, devices with their home node, and which cpus and nodes this
    /// process may use (allowed) next to what is present. Without a source flag it reads this
    /// machine's /sys; --json prints the schema documented in docs/topology.md.
    Topo(topo::TopoCmd),
    Plan(plan_cmd::PlanCmd),
    Run(run_cmd::RunCmd),
    Deploy(deploy::DeployCmd),
    /// Run a workload and compare it with peers in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// Stream detector data between machines: compress, send, receive, decompress, each stage
    /// pinned by a plan (seed 001), with authentication, integrity checks and resume.
    #[command(subcommand)]
    Stream(stream::StreamCmd),
    #[command(subcommand)]
    Os(os_cmd::OsCmd),
}

/// A count given on the command line that must be at least 1 (`--reps`, `--streams`, ...).
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?}: give a whole number of at least 1")),
    }
}

/// The topology of the machine loci runs on, read from /sys, with the cpus and nodes this process
/// may use marked allowed (affinity mask and cgroup cpuset).
pub fn this_machine() -> anyhow::Result<loci_topo::Topology> {
    Ok(loci_topo::load(&loci_topo::Source::live())?)
}

/// The `loci` command: parses the arguments, runs the command, prints an error chain on failure.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Errors are for users: the message chain only (`error: X: Y`), never a backtrace, even
    // when RUST_BACKTRACE is set in the environment.
    match dispatch(cli.cmd) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loci: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn dispatch(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Topo(t) => topo::run(t),
        Cmd::Advise(a) => advise::run(a),
        Cmd::Bench(b) => bench::run(b),
        Cmd::Plan(c) => plan_cmd::run(c),
        Cmd::Run(c) => run_cmd::run(c),
        Cmd::Deploy(c) => deploy::run(c),
        Cmd::Os(c) => os_cmd::run(c),
        Cmd::Stream(s) => stream::run(s),
    }
}
