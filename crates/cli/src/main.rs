//! The `loci` command line.

use clap::{Parser, Subcommand};

mod bench;
mod stream;

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
    /// Stream detector data between machines: compress, send, receive, decompress, each stage
    /// pinned by a plan (seed 001), with authentication, integrity checks and resume.
    #[command(subcommand)]
    Stream(stream::StreamCmd),
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
        Cmd::Stream(s) => stream::run(s),
    }
}
