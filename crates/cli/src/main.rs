//! The `loci` command line.

use clap::{Parser, Subcommand};

mod bench;
mod os_cmd;
mod place_topo;
mod plan_cmd;
mod run_cmd;

/// loci places threads and memory on purpose on NUMA machines, and proves where they ended up.
#[derive(Parser)]
#[command(name = "loci", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show the machine: nodes, cpus, caches, memory, distances, devices.
    Topo,
    /// Run a workload and compare it with peers in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    Plan(plan_cmd::PlanCmd),
    Run(run_cmd::RunCmd),
    #[command(subcommand)]
    Os(os_cmd::OsCmd),
}

/// The topology of the machine loci runs on.
pub fn this_machine() -> anyhow::Result<loci_topo::Topology> {
    let cpus = loci_place::sys::get_affinity(0)?;
    Ok(loci_topo::Topology {
        source: "affinity".into(),
        nodes: vec![loci_topo::Node {
            id: 0,
            cpus: cpus.clone(),
            memory_bytes: None,
            free_bytes: None,
            allowed: true,
        }],
        cpus: cpus
            .iter()
            .map(|id| loci_topo::Cpu {
                id,
                core: id,
                package: 0,
                node: Some(0),
                online: true,
                allowed: true,
            })
            .collect(),
        caches: vec![],
        devices: vec![],
        distances: vec![vec![10]],
    })
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Topo => {
            println!("{}", serde_json::to_string_pretty(&this_machine()?)?);
            Ok(())
        }
        Cmd::Bench(b) => bench::run(b),
        Cmd::Plan(c) => plan_cmd::run(c),
        Cmd::Run(c) => run_cmd::run(c),
        Cmd::Os(c) => os_cmd::run(c),
    }
}
