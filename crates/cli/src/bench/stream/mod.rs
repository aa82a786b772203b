//! `loci bench stream`: the streaming pipeline on loopback against `lz4 | nc` (one pipeline, and
//! one pipeline per core over slices of the file) and raw `nc`, on the same phantom data in one
//! run, plus loci's own plan against OS placement, plus the two LZ4 implementations on one core
//! (the measurement that picked the default codec), plus the machine limit for this data.
//!
//! **The machine limit** is the raw throughput this machine could sustain if every allowed core
//! did nothing but the work the job cannot avoid: LZ4-compress the raw bytes, move the compressed
//! bytes over loopback TCP (both ends), LZ4-decompress them. Each part is measured in the same
//! run as CPU time on one core (thread CPU time, which drifts less than wall time on a shared
//! machine), as cpu-seconds per GB, again before every round of runs; each run is set against its
//! round's limit, and a row's fraction of the limit is the median of its rounds':
//!
//! ```text
//! limit [raw GB/s] = cores / (compress [cpu-s per raw GB]
//!                             + tcp [cpu-s per wire GB] / compression ratio
//!                             + decompress [cpu-s per raw GB])
//! ```
//!
//! Everything else a system does (reading the file, checksums, framing, buffer memory, waiting)
//! counts against it. Every end-to-end row carries its goodput as a fraction of the limit and its
//! CPU time as cpu-seconds per GB of raw data (`cpu_s_per_gb`; 1 cpu-s/GB = 1 ns of CPU per byte).
//!
//! **Frame protection** (`--protection`, case `protection`): loci with the plan, on the same file
//! and cores, once per protection mode of the wire protocol (`checksum`: xxh3 only, no
//! authentication; `auth`: an AES-256-GCM tag per frame, the default; `encrypt`: AES-256-GCM), the
//! modes' repetitions interleaved with the order rotated every round (so load drift hits every
//! mode alike). Each mode's goodput and cpu-s/GB is set against `checksum`'s, and the goals are
//! checked: authentication costs at most 10% of the checksum-only goodput, encryption at most 35%.
//!
//! Files: `limit` (the machine limit's measurements), `loci` (one loci run), `peers` (the shell
//! pipelines), `protection` (the protection comparison), `summary` (the printed headline).

use std::collections::BTreeMap;

use anyhow::bail;
use clap::Args;
use loci_report::{Machine, Report, Row};
use loci_stream::plan::{plan, PlanOptions};
use loci_stream::proto::Protection;
use loci_stream::Codec;

use super::common::cpu_seconds;

mod limit;
mod loci;
mod peers;
mod protection;
mod summary;

use limit::{codec_rows, Probe, Sample};
use loci::{loci_once, stage_medians_per_gb};
use peers::{lz4_threads_missing, peer_once};
use protection::{protection_modes, protection_rows};
use summary::summary;

#[derive(Args, Debug)]
pub struct StreamArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Bytes streamed per run (default 663 MB = 60 projections; --quick: 20 projections).
    #[arg(long, value_parser = crate::stream::parse_bytes)]
    pub bytes: Option<u64>,
    /// Peers run in the same invocation: lz4-nc (one `lz4 -1 -c F | nc` -> `nc -l | lz4 -d`
    /// pipeline: one compressing core), lz4-nc-par (one such pipeline per allowed cpu, each over
    /// its own slice of the file), lz4-mt (`lz4 -1 -T<cpus>`, where the installed lz4 has it),
    /// raw-tcp (uncompressed `nc`). Empty: none.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lz4-nc,lz4-nc-par,lz4-mt,raw-tcp"
    )]
    pub peers: Vec<String>,
    /// Only compare the LZ4 implementations on one core (lz4 C library vs lz4_flex).
    #[arg(long)]
    pub codec_only: bool,
    /// Skip the OS-placement run of loci.
    #[arg(long)]
    pub no_os: bool,
    /// Bindings of the plan's threads to run, comma separated (as `loci stream plan --bind`):
    /// the first is the `loci plan` row, goals included; each further one adds a row `loci
    /// plan@BIND` (e.g. `--bind node,cpu` sets the default's node binding against per-cpu pins).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "node",
        value_name = "BINDS"
    )]
    pub bind: Vec<loci_place::Bind>,
    /// Frame protection modes to compare, in a section of their own: loci with the plan on the
    /// same data and cores in each mode, the modes' repetitions interleaved. checksum = xxh3 only
    /// (no authentication: `--unauthenticated` on both sides), auth = an AES-256-GCM tag per frame (the
    /// default), encrypt = AES-256-GCM (`--encrypt`). Prints each mode's goodput and cpu-s/GB
    /// against checksum's and the goals (auth costs at most 10% of the checksum goodput, encrypt
    /// at most 35%). Empty (`--protection ''`): skip the section.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "checksum,auth,encrypt",
        value_name = "MODES"
    )]
    pub protection: Vec<String>,
    /// Only the protection comparison (plus the machine limit its rows are set against): no
    /// plan-vs-OS rows, no peers (so lz4 and nc are not needed).
    #[arg(long, conflicts_with = "codec_only")]
    pub protection_only: bool,
    /// Chunk size of loci's stream and of the limit's codec and TCP measurements (the data stays
    /// the same phantom projections). Default: `loci stream`'s, 1 MiB.
    #[arg(long, default_value_t = loci_stream::config::DEFAULT_CHUNK_BYTES, value_parser = crate::stream::parse_usize_bytes)]
    pub chunk_bytes: usize,
}

/// Every `--peers` name (the pipelines are in `peers`).
const PEERS: [&str; 4] = ["lz4-nc", "lz4-nc-par", "lz4-mt", "raw-tcp"];

/// Bytes per run without `--bytes` or `--quick`: the size the goals are stated for.
const FULL_PROJECTIONS: u64 = 60;

pub fn run(mut a: StreamArgs) -> anyhow::Result<Report> {
    a.peers.retain(|p| !p.is_empty()); // `--peers ''`: none
    for p in &a.peers {
        if !PEERS.contains(&p.as_str()) {
            bail!("unknown peer {p:?} (valid: {})", PEERS.join(", "));
        }
    }
    let modes = protection_modes(&a.protection)?;
    anyhow::ensure!(
        !(a.protection_only && modes.is_empty()),
        "--protection-only with no --protection modes: nothing to run"
    );
    let projection = loci_stream::phantom::PROJECTION_BYTES;
    let full_bytes = FULL_PROJECTIONS * projection as u64;
    let bytes = a.bytes.unwrap_or(if a.common.quick {
        20 * projection as u64
    } else {
        full_bytes
    });
    let reps = a.common.reps_or(1, 3);
    anyhow::ensure!(bytes > 0, "--bytes must be positive");
    // Allowed cpus (affinity, cgroup quota): the parallel peer's pipeline count and the limit's cores.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let topo = crate::this_machine()?;
    anyhow::ensure!(!a.bind.is_empty(), "--bind needs at least one binding");
    let plans = a
        .bind
        .iter()
        .map(|&bind| {
            plan(
                &topo,
                &topo,
                &PlanOptions {
                    chunk_bytes: a.chunk_bytes,
                    bind,
                    ..PlanOptions::default()
                },
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let p = &plans[0];
    let chunk = p.senders[0].chunk_bytes;
    let mut rep = Report::new(
        "stream",
        serde_json::json!({ "bytes": bytes, "chunk_bytes": chunk, "reps": reps, "data": "phantom seed 42", "sink": "discard", "link": "loopback", "cores": cores }),
        Machine::of(&topo),
    );
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("phantom.raw");
    eprintln!(
        "writing {bytes} bytes of phantom projections to {}",
        data.display()
    );
    loci_stream::source::write_synthetic_file(&data, bytes, 42, projection)?;
    // Written back before anything is timed: otherwise the kernel writes the dirty pages out
    // during the first rounds, on the cores they measure.
    std::fs::File::open(&data)?.sync_all()?;
    let mut sample = Sample::read(&data, chunk)?;
    let costs = codec_rows(&mut rep, &mut sample, reps)?;
    if a.codec_only {
        return Ok(rep);
    }
    // The limit's parts for the codec loci streams with, measured again before every round.
    let codec = p.senders[0].codec;
    let ratio = costs[Codec::ALL
        .iter()
        .position(|c| *c == codec)
        .expect("Codec::ALL lists every codec")]
    .ratio;
    let mut probe = Probe::new(sample, codec, cores, bytes, ratio);
    let limit_at = rep.results.len();
    if a.protection_only {
        protection_rows(&mut rep, &data, p, &modes, reps, &mut probe)?;
        probe.report(&mut rep, bytes, limit_at);
        print!("{}", summary(&rep, &[], full_bytes));
        return Ok(rep);
    }

    let mut not_run: Vec<(String, String)> = Vec::new();
    if a.peers.iter().any(|p| p == "lz4-mt") {
        if let Some(why) = lz4_threads_missing() {
            eprintln!("lz4-mt: not run: {why}");
            not_run.push(("lz4-mt".into(), why));
            a.peers.retain(|p| p != "lz4-mt");
        }
    }
    // The plan rows' bindings, in row order (`loci plan` first).
    rep.params["bind"] =
        serde_json::json!(a.bind.iter().map(|b| b.to_string()).collect::<Vec<_>>());
    rep.params["peers_not_run"] = serde_json::json!(not_run
        .iter()
        .map(|(p, why)| serde_json::json!({ "peer": p, "why": why }))
        .collect::<Vec<_>>());

    // Every system once per round, rounds repeated: load on a shared machine drifts, and
    // interleaving spreads it over all systems alike.
    let mut systems: Vec<String> = vec!["loci plan".into()];
    systems.extend(a.bind[1..].iter().map(|b| format!("loci plan@{b}")));
    if !a.no_os {
        systems.push("loci os".into());
    }
    systems.extend(a.peers.iter().cloned());
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    let mut last: Vec<Option<loci_stream::StreamReport>> = vec![None; systems.len()];
    // loci's runs: CPU seconds of each stage of both sides, per run.
    let mut stage_cpu: Vec<Vec<BTreeMap<String, f64>>> = vec![Vec::new(); systems.len()];
    // CPU seconds (user + system) per run: loci's sender in this process and its receiver child;
    // the peers' in their children (and, for lz4-nc-par, the threads here that feed the slices).
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    // Each run's goodput over its round's limit.
    let mut fractions: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    for round in 0..reps {
        let limit_bps = probe.measure()?;
        eprintln!("round {round}: machine limit {:.1} MB/s", limit_bps / 1e6);
        // The order rotates every round, so that no system always runs right after the same
        // other one (finding the memory it just freed, the caches it left).
        for k in 0..systems.len() {
            let i = (round + k) % systems.len();
            let sys = &systems[i];
            let c0 = cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN);
            let t = match sys.as_str() {
                loci if loci.starts_with("loci ") => {
                    // `loci os` runs the default plan's thread counts unpinned.
                    let pinned = loci != "loci os";
                    // The plan rows come first in `systems`, in `--bind` order.
                    let p = if pinned { &plans[i] } else { p };
                    let run = loci_once(&data, p, pinned, Protection::default())?;
                    last[i] = Some(run.report);
                    stage_cpu[i].push(run.stage_cpu_s);
                    run.secs
                }
                peer => peer_once(peer, &data, bytes, cores, dir.path())?,
            };
            cpu[i].push(cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN) - c0);
            eprintln!("round {round}: {sys} {:.1} MB/s", bytes as f64 / t / 1e6);
            times[i].push(t);
            fractions[i].push(bytes as f64 / t / limit_bps);
        }
    }
    for (((((sys, t), r), c), fr), sc) in systems
        .iter()
        .zip(times)
        .zip(last)
        .zip(cpu)
        .zip(fractions)
        .zip(stage_cpu)
    {
        let cpu_median = loci_report::median(&c).expect("at least one rep");
        let row = match sys.strip_prefix("loci ") {
            Some(placement) => {
                let r = r.expect("loci ran");
                Row::from_times("loci", t)
                    .config("placement", placement)
                    .extra("protection", Protection::default().name())
                    .extra("compression_ratio", r.compression_ratio)
                    .extra("network_bytes_per_s", r.network_bytes_per_s)
                    .extra("bottleneck", &r.bottleneck)
                    .extra(
                        "busy_share",
                        r.stages
                            .iter()
                            .map(|s| (s.name.clone(), s.busy_share))
                            .collect::<BTreeMap<_, _>>(),
                    )
                    .extra("stage_cpu_s_per_gb", stage_medians_per_gb(&sc, bytes))
            }
            None => {
                let row = Row::from_times(sys, t);
                match sys.as_str() {
                    "lz4-nc" => row.config("cores", "1 core"),
                    "lz4-nc-par" | "lz4-mt" => row
                        .config("cores", format!("{cores} cores"))
                        .extra("pipelines", if sys == "lz4-mt" { 1 } else { cores }),
                    _ => row,
                }
            }
        };
        let row = row.case("end-to-end").work(bytes as f64, "B/s");
        rep.results.push(
            row.extra("cpu_s", cpu_median)
                .extra("cpu_ns_per_byte", cpu_median * 1e9 / bytes as f64)
                .extra("cpu_s_per_gb", cpu_median * 1e9 / bytes as f64)
                .extra(
                    "fraction_of_limit",
                    loci_report::median(&fr).expect("at least one rep"),
                )
                .extra("fraction_of_limit_per_round", fr),
        );
        eprintln!("{sys}: {cpu_median:.2} cpu-s per run (median)");
    }
    protection_rows(&mut rep, &data, p, &modes, reps, &mut probe)?;
    probe.report(&mut rep, bytes, limit_at);
    print!("{}", summary(&rep, &not_run, full_bytes));
    Ok(rep)
}

/// A loopback TCP port free at the time of the call.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Whether a socket listens on loopback TCP `port` (read from /proc/net/tcp).
fn listening(port: u16) -> bool {
    std::fs::read_to_string("/proc/net/tcp")
        .map(|t| {
            let hex = format!(":{port:04X} ");
            t.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[1].ends_with(hex.trim_end()) && f[3] == "0A"
            })
        })
        .unwrap_or(false)
}
