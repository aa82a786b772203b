//! Runs loci-engine's TPC-H queries and prints each one's fastest of N runs and its first row.
//!
//! `cargo run --release -p loci-engine --example tpch -- [SF] [RUNS] [QUERIES]`
//! (defaults: 1, 5, 1,3,5,6,18). The timed comparison with DuckDB is `loci bench tpch`.

use std::time::Instant;

use loci_engine::tpch::{self, Data, Query};
use loci_engine::{Exec, MemPolicy, Sched, Strategy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sf: f64 = args.first().map_or(Ok(1.0), |s| s.parse())?;
    let runs: usize = args.get(1).map_or(Ok(5), |s| s.parse())?;
    let queries: Vec<Query> = match args.get(2) {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => Query::ALL.to_vec(),
    };
    let topo = loci_topo::load(&loci_topo::Source::live())?;
    let exec = Exec::new(&topo, Sched::Las, Strategy::os(), None)?;
    let t0 = Instant::now();
    let data = Data::generate(&exec, sf, tpch::MORSEL_ORDERS, &MemPolicy::FirstTouch)?;
    println!(
        "sf {sf}: generated in {:.2} s, {} workers",
        t0.elapsed().as_secs_f64(),
        exec.workers()
    );
    for q in queries {
        let mut best = f64::INFINITY;
        let mut answer = None;
        for _ in 0..runs.max(1) {
            let t = Instant::now();
            let a = tpch::run(&exec, &data, q);
            best = best.min(t.elapsed().as_secs_f64());
            answer = Some(a);
        }
        let a = answer.expect("at least one run");
        let first: Vec<String> = a
            .rows
            .first()
            .into_iter()
            .flatten()
            .map(|v| v.to_string())
            .collect();
        println!(
            "{q}: {:8.2} ms  {} rows, first: {}",
            best * 1e3,
            a.rows.len(),
            first.join(" | ")
        );
    }
    Ok(())
}
