//! memcpy bandwidth of one thread: the limit for any copy-bound workload (subarray, stream sinks).

use std::time::Instant;

use clap::Args;
use loci_report::{Machine, Report, Row};

#[derive(Args, Debug)]
pub struct MemcpyArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Bytes copied per repetition.
    #[arg(long, default_value_t = 256 << 20)]
    pub bytes: usize,
}

pub fn run(a: MemcpyArgs) -> anyhow::Result<Report> {
    let bytes = if a.common.quick {
        a.bytes.min(64 << 20)
    } else {
        a.bytes
    };
    let reps = a.common.reps_or(3, 5);
    anyhow::ensure!(bytes > 0, "--bytes must be positive");
    let src = super::memcpy_source(bytes);
    let mut dst = vec![0u8; bytes];
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        times.push(t.elapsed().as_secs_f64());
    }
    anyhow::ensure!(super::copied(&src, &dst), "copy did not happen");
    let topo = crate::this_machine()?;
    let mut rep = Report::new(
        "memcpy",
        serde_json::json!({ "bytes": bytes, "reps": reps }),
        Machine::of(&topo),
    );
    rep.results.push(
        Row::from_times("loci", times)
            .config("threads", "1")
            .work(bytes as f64, "B/s"),
    );
    Ok(rep)
}
