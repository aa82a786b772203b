//! The `loci` command line.

use clap::{Parser, Subcommand};

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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Topo => {
            println!("{}", loci_place::sys::get_affinity(0)?);
            Ok(())
        }
    }
}
