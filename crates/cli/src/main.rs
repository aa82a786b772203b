//! The `loci` command line.

use clap::{Parser, Subcommand};

mod bench;
mod os_cmd;
mod plan_cmd;
mod run_cmd;
mod stream;
mod topo;
pub mod topo_args;

/// loci places threads and memory on purpose on NUMA machines, and proves where they ended up.
#[derive(Parser)]
#[command(name = "loci", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show a machine: nodes, cpus, cores and SMT siblings, caches and which cpus share them,
    /// memory per node, the distance matrix, devices with their home node, and which cpus and
    /// nodes this process may use (allowed) next to what is present. Without a source flag it
    /// reads this machine's /sys; --json prints the schema documented in README.md.
    Topo(topo::TopoCmd),
    /// Run a workload and compare it with peers in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    Plan(plan_cmd::PlanCmd),
    Run(run_cmd::RunCmd),
    #[command(subcommand)]
    Os(os_cmd::OsCmd),
    /// Stream detector data between machines: compress, send, receive, decompress, each stage
    /// pinned by a plan (seed 001), with authentication, integrity checks and resume.
    #[command(subcommand)]
    Stream(stream::StreamCmd),
}

/// The topology of the machine loci runs on, read from /sys, with the cpus and nodes this process
/// may use marked allowed (affinity mask and cgroup cpuset).
pub fn this_machine() -> anyhow::Result<loci_topo::Topology> {
    Ok(loci_topo::load(&loci_topo::Source::live())?)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Topo(t) => topo::run(t),
        Cmd::Bench(b) => bench::run(b),
        Cmd::Plan(c) => plan_cmd::run(c),
        Cmd::Run(c) => run_cmd::run(c),
        Cmd::Os(c) => os_cmd::run(c),
        Cmd::Stream(s) => stream::run(s),
    }
}
