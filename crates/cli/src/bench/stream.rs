//! `loci bench stream`: the streaming pipeline on loopback against `lz4 | nc` (one pipeline, and
//! one pipeline per core over slices of the file) and raw `nc`, on the same phantom data in one
//! run, plus loci's own plan against OS placement, plus the two LZ4 implementations on one core
//! (the measurement that picked the default codec), plus the machine limit for this data.
//!
//! **The machine limit** is the raw throughput this machine could sustain if every allowed core
//! did nothing but the work the job cannot avoid: LZ4-compress the raw bytes, move the compressed
//! bytes over loopback TCP (both ends), LZ4-decompress them. Each part is measured in the same
//! run as CPU time on one core (thread CPU time, which drifts less than wall time on a shared
//! machine), as cpu-seconds per GB:
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
//! authentication; `auth`: a BLAKE3 MAC per frame, the default; `encrypt`: AES-256-GCM), the
//! modes' repetitions interleaved with the order rotated every round (so load drift hits every
//! mode alike). Each mode's goodput and cpu-s/GB is set against `checksum`'s, and the goals are
//! checked: authentication costs at most 10% of the checksum-only goodput, encryption at most 35%.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use loci_report::{Machine, Report, Row};
use loci_stream::config::Sync;
use loci_stream::plan::{plan, PlanOptions};
use loci_stream::proto::Protection;
use loci_stream::{Codec, Faults, SendOptions, SourceSpec};

use super::common::cpu_seconds;

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
    /// Frame protection modes to compare, in a section of their own: loci with the plan on the
    /// same data and cores in each mode, the modes' repetitions interleaved. checksum = xxh3 only
    /// (no authentication: `--unauthenticated` on both sides), auth = a BLAKE3 MAC per frame (the
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
}

const PEERS: [&str; 4] = ["lz4-nc", "lz4-nc-par", "lz4-mt", "raw-tcp"];

/// Every frame protection, weakest first (the order of the comparison's rows).
const PROTECTIONS: [Protection; 3] = [Protection::Checksum, Protection::Auth, Protection::Encrypt];

/// The protection goals: the most of the checksum-only goodput each mode may cost.
const PROTECTION_GOALS: [(Protection, f64); 2] =
    [(Protection::Auth, 0.10), (Protection::Encrypt, 0.35)];

/// Bytes per run without `--bytes` or `--quick`: the size the goals are stated for.
const FULL_CHUNKS: u64 = 60;

/// The modes named in `--protection`, weakest first, each once; an unknown name is an error.
fn protection_modes(names: &[String]) -> anyhow::Result<Vec<Protection>> {
    let mut want = Vec::new();
    for n in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        match PROTECTIONS.iter().find(|p| p.name() == n) {
            Some(p) => want.push(*p),
            None => bail!(
                "unknown protection {n:?} (valid: {})",
                PROTECTIONS.map(Protection::name).join(", ")
            ),
        }
    }
    Ok(PROTECTIONS
        .into_iter()
        .filter(|p| want.contains(p))
        .collect())
}

/// Slices of the file for `lz4-nc-par` start at multiples of this (whole pages for `splice`).
const SLICE_ALIGN: u64 = 1 << 20;

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
    let chunk = loci_stream::phantom::CHUNK_BYTES;
    let full_bytes = FULL_CHUNKS * chunk as u64;
    let bytes = a.bytes.unwrap_or(if a.common.quick {
        20 * chunk as u64
    } else {
        full_bytes
    });
    let reps = a.common.reps.unwrap_or(if a.common.quick { 1 } else { 3 });
    anyhow::ensure!(bytes > 0 && reps > 0, "--bytes and --reps must be positive");
    // Allowed cpus (affinity, cgroup quota): the parallel peer's pipeline count and the limit's cores.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let topo = crate::this_machine()?;
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
    loci_stream::source::write_synthetic_file(&data, bytes, 42, chunk)?;
    let costs = codec_rows(&mut rep, &data, chunk, reps)?;
    if a.codec_only {
        return Ok(rep);
    }
    let p = plan(&topo, &topo, &PlanOptions::default())?;
    // The limit's parts, for the codec loci streams with: one core each, measured now.
    let codec = p.senders[0].codec;
    let cost = costs[Codec::ALL
        .iter()
        .position(|c| *c == codec)
        .expect("Codec::ALL lists every codec")];
    let wire = (bytes as f64 / cost.ratio).ceil() as u64;
    let tcp = tcp_rows(&mut rep, &data, wire, chunk, cost.ratio, reps)?;
    let limit = Limit {
        cores,
        compress_s_per_gb: cost.compress_s_per_gb,
        decompress_s_per_gb: cost.decompress_s_per_gb,
        tcp_s_per_gb: tcp,
        ratio: cost.ratio,
    };
    let limit_bps = limit.raw_gb_per_s() * 1e9;
    rep.params["machine_limit"] = serde_json::json!({
        "codec": codec.name(),
        "cores": cores,
        "compress_cpu_s_per_gb": limit.compress_s_per_gb,
        "decompress_cpu_s_per_gb": limit.decompress_s_per_gb,
        "tcp_cpu_s_per_wire_gb": limit.tcp_s_per_gb,
        "compression_ratio": limit.ratio,
        "raw_bytes_per_s": limit_bps,
        "formula": Limit::FORMULA,
    });
    rep.results.push(
        Row::from_times("limit", vec![bytes as f64 / limit_bps])
            .case("machine-limit")
            .config("cores", format!("{cores} cores"))
            .work(bytes as f64, "B/s")
            .extra("computed", true)
            .extra("codec", codec.name())
            .extra("cpu_s_per_gb", limit.cpu_s_per_raw_gb())
            .extra("compress_cpu_s_per_gb", limit.compress_s_per_gb)
            .extra("decompress_cpu_s_per_gb", limit.decompress_s_per_gb)
            .extra("tcp_cpu_s_per_wire_gb", limit.tcp_s_per_gb)
            .extra("compression_ratio", limit.ratio)
            .extra("formula", Limit::FORMULA),
    );
    if a.protection_only {
        protection_rows(&mut rep, &data, &p, &modes, reps, limit_bps)?;
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
    rep.params["peers_not_run"] = serde_json::json!(not_run
        .iter()
        .map(|(p, why)| serde_json::json!({ "peer": p, "why": why }))
        .collect::<Vec<_>>());

    // Every system once per round, rounds repeated: load on a shared machine drifts, and
    // interleaving spreads it over all systems alike.
    let mut systems: Vec<String> = vec!["loci plan".into()];
    if !a.no_os {
        systems.push("loci os".into());
    }
    systems.extend(a.peers.iter().cloned());
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    let mut last: Vec<Option<loci_stream::StreamReport>> = vec![None; systems.len()];
    // CPU seconds (user + system) per run: loci's sender in this process and its receiver child;
    // the peers' in their children (and, for lz4-nc-par, the threads here that feed the slices).
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    for round in 0..reps {
        for (i, sys) in systems.iter().enumerate() {
            let c0 = cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN);
            let t = match sys.as_str() {
                "loci plan" | "loci os" => {
                    let (t, r) = loci_once(&data, &p, sys == "loci plan", Protection::default())?;
                    last[i] = Some(r);
                    t
                }
                peer => peer_once(peer, &data, bytes, cores, dir.path())?,
            };
            cpu[i].push(cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN) - c0);
            eprintln!("round {round}: {sys} {:.1} MB/s", bytes as f64 / t / 1e6);
            times[i].push(t);
        }
    }
    for (((sys, t), r), c) in systems.iter().zip(times).zip(last).zip(cpu) {
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
                            .collect::<std::collections::BTreeMap<_, _>>(),
                    )
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
        let goodput = row.throughput.expect("work set");
        rep.results.push(
            row.extra("cpu_s", cpu_median)
                .extra("cpu_ns_per_byte", cpu_median * 1e9 / bytes as f64)
                .extra("cpu_s_per_gb", cpu_median * 1e9 / bytes as f64)
                .extra("fraction_of_limit", goodput / limit_bps),
        );
        eprintln!("{sys}: {cpu_median:.2} cpu-s per run (median)");
    }
    protection_rows(&mut rep, &data, &p, &modes, reps, limit_bps)?;
    print!("{}", summary(&rep, &not_run, full_bytes));
    Ok(rep)
}

/// The protection comparison: loci with the plan, once per mode per round, the order rotated
/// every round (round r starts with mode r mod n), so drift over the run hits every mode alike.
/// One `protection` row per mode (goodput, cpu-s/GB, ratios to checksum when it ran) and the
/// goals' verdicts in `params.protection_goals`. Every run must end with the whole-stream
/// checksum confirmed by the receiver.
fn protection_rows(
    rep: &mut Report,
    data: &Path,
    p: &loci_stream::plan::StreamPlan,
    modes: &[Protection],
    reps: usize,
    limit_bps: f64,
) -> anyhow::Result<()> {
    if modes.is_empty() {
        return Ok(());
    }
    let bytes = std::fs::metadata(data)?.len();
    anyhow::ensure!(bytes > 0, "{}: empty", data.display());
    let n = modes.len();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut last: Vec<Option<loci_stream::StreamReport>> = vec![None; n];
    for round in 0..reps {
        for k in 0..n {
            let m = (round + k) % n;
            let c0 = cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN);
            let (t, r) = loci_once(data, p, true, modes[m])?;
            cpu[m].push(cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN) - c0);
            anyhow::ensure!(
                r.verified,
                "protection {}: the receiver did not confirm the whole-stream checksum",
                modes[m].name()
            );
            eprintln!(
                "round {round}: loci plan/{} {:.1} MB/s",
                modes[m].name(),
                bytes as f64 / t / 1e6
            );
            times[m].push(t);
            last[m] = Some(r);
        }
    }
    let med = |v: &[f64]| loci_report::median(v).expect("at least one rep");
    let base = modes.iter().position(|m| *m == Protection::Checksum);
    let mut goals = serde_json::Map::new();
    for (m, mode) in modes.iter().enumerate() {
        let r = last[m].take().expect("every mode ran");
        let cpu_s_per_gb = med(&cpu[m]) * 1e9 / bytes as f64;
        let mut row = Row::from_times("loci", times[m].clone())
            .case("protection")
            .config("placement", "plan")
            .config("protection", mode.name())
            .work(bytes as f64, "B/s")
            .extra("verified", true)
            .extra("cpu_s", med(&cpu[m]))
            .extra("cpu_s_per_round", &cpu[m])
            .extra("cpu_ns_per_byte", cpu_s_per_gb)
            .extra("cpu_s_per_gb", cpu_s_per_gb)
            .extra(
                "fraction_of_limit",
                bytes as f64 / med(&times[m]) / limit_bps,
            )
            .extra("wire_bytes", r.wire_bytes)
            .extra("compression_ratio", r.compression_ratio)
            .extra("bottleneck", &r.bottleneck);
        if let Some(b) = base {
            // Goodput ratio: the checksum mode's time over this mode's (same bytes), of the
            // medians and, to show the spread, round by round.
            let goodput_ratio = med(&times[b]) / med(&times[m]);
            let per_round: Vec<f64> = times[b]
                .iter()
                .zip(&times[m])
                .map(|(tb, tm)| tb / tm)
                .collect();
            let cpu_ratio = med(&cpu[m]) / med(&cpu[b]);
            row = row
                .extra("goodput_vs_checksum", goodput_ratio)
                .extra("goodput_vs_checksum_per_round", per_round)
                .extra("cpu_vs_checksum", cpu_ratio);
            if let Some((_, max_cost)) = PROTECTION_GOALS.iter().find(|(g, _)| g == mode) {
                let cost = 1.0 - goodput_ratio;
                goals.insert(
                    mode.name().into(),
                    serde_json::json!({
                        "max_cost": max_cost,
                        "cost": cost,
                        "goodput_vs_checksum": goodput_ratio,
                        "met": cost <= *max_cost,
                    }),
                );
            }
        }
        rep.results.push(row);
    }
    rep.params["protection"] =
        serde_json::json!(modes.iter().map(|m| m.name()).collect::<Vec<_>>());
    rep.params["protection_goals"] = serde_json::Value::Object(goals);
    Ok(())
}

/// The machine limit's inputs: cpu-seconds per GB of each unavoidable part, on one core.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    /// Allowed cpus.
    pub cores: usize,
    /// LZ4 compression, cpu-s per GB of raw input.
    pub compress_s_per_gb: f64,
    /// LZ4 decompression, cpu-s per GB of raw output.
    pub decompress_s_per_gb: f64,
    /// Loopback TCP, sender and receiver together, cpu-s per GB moved (compressed bytes).
    pub tcp_s_per_gb: f64,
    /// Raw bytes per compressed byte.
    pub ratio: f64,
}

impl Limit {
    pub const FORMULA: &'static str =
        "cores / (compress cpu-s per raw GB + tcp cpu-s per wire GB / ratio + decompress cpu-s per raw GB)";

    /// CPU seconds the unavoidable work costs per raw GB.
    pub fn cpu_s_per_raw_gb(&self) -> f64 {
        self.compress_s_per_gb + self.tcp_s_per_gb / self.ratio + self.decompress_s_per_gb
    }

    /// Raw GB/s if every core did only this work.
    pub fn raw_gb_per_s(&self) -> f64 {
        self.cores as f64 / self.cpu_s_per_raw_gb()
    }
}

/// One codec's cost on one core, from [`codec_rows`].
#[derive(Clone, Copy, Debug)]
struct CodecCost {
    compress_s_per_gb: f64,
    decompress_s_per_gb: f64,
    ratio: f64,
}

/// One core each: compress then decompress every chunk of the file with both implementations,
/// alternating between them every repetition (load on a shared machine drifts). Rows carry wall
/// time; the returned costs (one per [`Codec::ALL`]) are the median thread CPU time per GB.
fn codec_rows(
    rep: &mut Report,
    data: &Path,
    chunk: usize,
    reps: usize,
) -> anyhow::Result<Vec<CodecCost>> {
    let raw = std::fs::read(data)?;
    let raw = &raw[..raw.len().min(8 * chunk)];
    let n = raw.chunks(chunk).count();
    let mut comp: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; Codec::bound(chunk)]).collect();
    let mut sizes = vec![0usize; n];
    let mut out = vec![0u8; chunk];
    let mut ct = vec![Vec::new(); Codec::ALL.len()];
    let mut dt = vec![Vec::new(); Codec::ALL.len()];
    let mut ccpu = vec![Vec::new(); Codec::ALL.len()];
    let mut dcpu = vec![Vec::new(); Codec::ALL.len()];
    let mut ratio = vec![0f64; Codec::ALL.len()];
    for _ in 0..reps {
        for (k, codec) in Codec::ALL.into_iter().enumerate() {
            let c0 = cpu_seconds(libc::RUSAGE_THREAD);
            let t = Instant::now();
            for ((c, s), r) in comp.iter_mut().zip(&mut sizes).zip(raw.chunks(chunk)) {
                *s = codec.compress(r, c)?;
            }
            ct[k].push(t.elapsed().as_secs_f64());
            ccpu[k].push(cpu_seconds(libc::RUSAGE_THREAD) - c0);
            let c0 = cpu_seconds(libc::RUSAGE_THREAD);
            let t = Instant::now();
            for ((c, s), r) in comp.iter().zip(&sizes).zip(raw.chunks(chunk)) {
                codec.decompress(&c[..*s], &mut out[..r.len()])?;
            }
            dt[k].push(t.elapsed().as_secs_f64());
            dcpu[k].push(cpu_seconds(libc::RUSAGE_THREAD) - c0);
            ratio[k] = raw.len() as f64 / sizes.iter().sum::<usize>() as f64;
        }
    }
    let gb = raw.len() as f64 / 1e9;
    let per_gb = |v: &[f64]| loci_report::median(v).expect("at least one rep") / gb;
    for (case, times, cpu) in [("lz4-compress", ct, &ccpu), ("lz4-decompress", dt, &dcpu)] {
        for (k, codec) in Codec::ALL.into_iter().enumerate() {
            rep.results.push(
                Row::from_times(codec.name(), times[k].clone())
                    .case(case)
                    .config("threads", 1)
                    .work(raw.len() as f64, "B/s")
                    .extra("compression_ratio", ratio[k])
                    .extra("cpu_s_per_gb", per_gb(&cpu[k])),
            );
        }
    }
    Ok((0..Codec::ALL.len())
        .map(|k| CodecCost {
            compress_s_per_gb: per_gb(&ccpu[k]),
            decompress_s_per_gb: per_gb(&dcpu[k]),
            ratio: ratio[k],
        })
        .collect())
}

/// Loopback TCP cost: a sender thread writes `wire` bytes (the compressed size of the file) in
/// frames of one compressed chunk, a receiver thread reads them; both count their own thread CPU
/// time. Pushes a row (wall time) and returns the median cpu-seconds per GB moved.
fn tcp_rows(
    rep: &mut Report,
    data: &Path,
    wire: u64,
    chunk: usize,
    ratio: f64,
    reps: usize,
) -> anyhow::Result<f64> {
    // Frames as loci sends them: about one compressed chunk each. The content does not matter to
    // TCP; it is phantom data, not a constant.
    let frame = ((chunk as f64 / ratio) as usize).max(1);
    let mut payload = vec![0u8; frame];
    let got = File::open(data)?.read_at(&mut payload, 0)?;
    payload.truncate(got.max(1));
    let mut secs = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..reps {
        let (s, c) = tcp_once(&payload, wire)?;
        secs.push(s);
        cpu.push(c);
    }
    let cpu_s_per_gb = loci_report::median(&cpu).expect("at least one rep") * 1e9 / wire as f64;
    rep.results.push(
        Row::from_times("loopback", secs)
            .case("tcp-loopback")
            .config("threads", "1 sender + 1 receiver")
            .work(wire as f64, "B/s")
            .extra("cpu_s_per_gb", cpu_s_per_gb),
    );
    Ok(cpu_s_per_gb)
}

/// One loopback transfer of `wire` bytes; (wall seconds, sender + receiver thread cpu-seconds).
fn tcp_once(payload: &[u8], wire: u64) -> anyhow::Result<(f64, f64)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let cap = payload.len().max(1 << 20);
    let rx = std::thread::spawn(move || -> std::io::Result<(u64, f64)> {
        let (mut s, _) = l.accept()?;
        let c0 = cpu_seconds(libc::RUSAGE_THREAD);
        let mut buf = vec![0u8; cap];
        let mut got = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => break,
                n => got += n as u64,
            }
        }
        Ok((got, cpu_seconds(libc::RUSAGE_THREAD) - c0))
    });
    let t = Instant::now();
    let tx = std::thread::scope(|sc| {
        sc.spawn(|| -> std::io::Result<f64> {
            let c0 = cpu_seconds(libc::RUSAGE_THREAD);
            let mut s = TcpStream::connect(addr)?;
            let mut left = wire;
            while left > 0 {
                let n = left.min(payload.len() as u64) as usize;
                s.write_all(&payload[..n])?;
                left -= n as u64;
            }
            s.shutdown(std::net::Shutdown::Write)?;
            Ok(cpu_seconds(libc::RUSAGE_THREAD) - c0)
        })
        .join()
        .expect("sender thread")
    })?;
    let (got, rx_cpu) = rx.join().expect("receiver thread")?;
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        got == wire,
        "loopback TCP measurement: received {got} of {wire} bytes"
    );
    Ok((secs, tx + rx_cpu))
}

/// The end-to-end rows as a headline: goodput, fraction of the machine limit, cpu-s per GB, and
/// the two goals (at least 0.9x the limit; faster than the same-core `lz4 | nc` peer).
fn summary(rep: &Report, not_run: &[(String, String)], full_bytes: u64) -> String {
    let f = |r: &Row, k: &str| r.extra.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    let mut out = String::new();
    if let Some(l) = rep.rows_of(Some("machine-limit")).next() {
        out += &format!(
            "\nmachine limit for this data: {}B/s raw = {} / ({:.3} compress + {:.3} tcp / {:.3} ratio + {:.3} decompress cpu-s per GB), {} = {:.3} cpu-s per raw GB\n",
            loci_report::si(l.throughput.unwrap_or(f64::NAN)),
            l.config.get("cores").map_or("?", String::as_str),
            f(l, "compress_cpu_s_per_gb"),
            f(l, "tcp_cpu_s_per_wire_gb"),
            f(l, "compression_ratio"),
            f(l, "decompress_cpu_s_per_gb"),
            l.extra.get("codec").and_then(|v| v.as_str()).unwrap_or("?"),
            f(l, "cpu_s_per_gb"),
        );
    }
    let rows: Vec<&Row> = rep.rows_of(Some("end-to-end")).collect();
    if rows.is_empty() {
        return out + &protection_summary(rep, full_bytes);
    }
    let par = rows.iter().find(|r| r.system == "lz4-nc-par").copied();
    let w = rows
        .iter()
        .map(|r| r.label().len())
        .max()
        .unwrap_or(6)
        .max(6);
    out += &format!(
        "  {:<w$}  {:>12}  {:>8}  {:>9}  {:>8}  {:>13}\n",
        "system", "goodput", "of limit", "cpu-s/run", "cpu-s/GB", "vs lz4-nc-par"
    );
    for r in &rows {
        out += &format!(
            "  {:<w$}  {:>12}  {:>8.2}  {:>9.2}  {:>8.2}  {:>13}\n",
            r.label(),
            format!("{}B/s", loci_report::si(r.throughput.unwrap_or(f64::NAN))),
            f(r, "fraction_of_limit"),
            f(r, "cpu_s"),
            f(r, "cpu_s_per_gb"),
            par.map_or("-".into(), |p| format!(
                "{:.2}x",
                r.throughput.unwrap_or(f64::NAN) / p.throughput.unwrap_or(f64::NAN)
            )),
        );
    }
    out += "  (of limit = goodput / machine limit; vs lz4-nc-par = goodput ratio, above 1.00x is faster)\n";
    for (p, why) in not_run {
        out += &format!("  {p}: not run: {why}\n");
    }
    for r in rows.iter().filter(|r| r.system == "loci") {
        let frac = f(r, "fraction_of_limit");
        out += &format!(
            "goal {}: at least 0.90 of the machine limit: {} ({frac:.2})\n",
            r.label(),
            if frac >= 0.9 { "met" } else { "MISSED" }
        );
        if let Some(p) = par {
            let x = r.throughput.unwrap_or(f64::NAN) / p.throughput.unwrap_or(f64::NAN);
            out += &format!(
                "goal {}: faster than the same-core peer {}: {} ({x:.2}x its goodput)\n",
                r.label(),
                p.label(),
                if x > 1.0 { "met" } else { "MISSED" }
            );
        }
    }
    out + &protection_summary(rep, full_bytes)
}

/// The protection rows as a table (goodput and cpu-s/GB, each against checksum) and the goals'
/// verdicts; empty when the comparison did not run.
fn protection_summary(rep: &Report, full_bytes: u64) -> String {
    let f = |r: &Row, k: &str| r.extra.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    let rows: Vec<&Row> = rep.rows_of(Some("protection")).collect();
    let Some(first) = rows.first() else {
        return String::new();
    };
    let bytes = rep.params["bytes"].as_f64().unwrap_or(f64::NAN);
    let ratio = |r: &Row, k: &str| {
        r.extra
            .get(k)
            .and_then(|v| v.as_f64())
            .map_or("-".to_string(), |x| format!("{x:.3}x"))
    };
    let mut out = format!(
        "\nframe protection: loci with the plan, {}B per run, same data and cores, {} rounds with the modes' order rotated\n",
        loci_report::si(bytes),
        first.times_s.len()
    );
    out += &format!(
        "  {:<10}  {:>12}  {:>11}  {:>8}  {:>11}  {:>8}\n",
        "protection", "goodput", "vs checksum", "cpu-s/GB", "vs checksum", "of limit"
    );
    for r in &rows {
        out += &format!(
            "  {:<10}  {:>12}  {:>11}  {:>8.3}  {:>11}  {:>8.2}\n",
            r.config.get("protection").map_or("?", String::as_str),
            format!("{}B/s", loci_report::si(r.throughput.unwrap_or(f64::NAN))),
            ratio(r, "goodput_vs_checksum"),
            f(r, "cpu_s_per_gb"),
            ratio(r, "cpu_vs_checksum"),
            f(r, "fraction_of_limit"),
        );
    }
    out += "  (goodput vs checksum: below 1.000x is slower; cpu-s/GB vs checksum: above 1.000x costs more CPU; every run's stream verified)\n";
    for (mode, max_cost) in PROTECTION_GOALS {
        let Some(r) = rows
            .iter()
            .find(|r| r.config.get("protection").map(String::as_str) == Some(mode.name()))
        else {
            continue;
        };
        let goal = format!(
            "goal protection {}: costs at most {:.0}% of the checksum-only goodput",
            mode.name(),
            max_cost * 100.0
        );
        let x = f(r, "goodput_vs_checksum");
        out += &if x.is_nan() {
            format!("{goal}: not measured (checksum was not in --protection)\n")
        } else {
            let cost = 1.0 - x;
            format!(
                "{goal}: {} (costs {:.1}%: {x:.3}x the checksum goodput)\n",
                if cost <= max_cost { "met" } else { "MISSED" },
                cost * 100.0
            )
        };
    }
    if bytes < full_bytes as f64 {
        out += &format!(
            "  (the goals are for the full size, {}B per run; this run streamed {}B, so its verdicts are indicative only)\n",
            loci_report::si(full_bytes as f64),
            loci_report::si(bytes)
        );
    }
    out
}

/// loci over loopback into a discarding sink; seconds from the sender's start to the receiver's
/// confirmation of the whole-stream checksum. The receiver is its own process (`loci stream recv`,
/// this binary), as on a real gateway and as the peers' `nc -l | lz4 -d` is: in one process, the
/// two sides' buffer mappings and faults would contend on one address space's locks and TLB
/// shootdowns, which no deployment has. The sender runs in this process (its report feeds the row).
fn loci_once(
    data: &Path,
    p: &loci_stream::plan::StreamPlan,
    pinned: bool,
    protection: Protection,
) -> anyhow::Result<(f64, loci_stream::StreamReport)> {
    let secret = "loci-bench-stream-secret";
    let mut rcfg = if pinned {
        p.receiver.clone()
    } else {
        p.receiver.unpinned()
    };
    rcfg.sync = Sync::None;
    let mut scfg = if pinned {
        p.senders[0].clone()
    } else {
        p.senders[0].unpinned()
    };
    // The sender asks for the mode; the receiver requires exactly it (encrypt), or allows it
    // (checksum frames are refused unless the receiver allows them).
    let (encrypt, unauthenticated) = match protection {
        Protection::Checksum => (false, true),
        Protection::Auth => (false, false),
        Protection::Encrypt => (true, false),
    };
    scfg.encrypt = encrypt;
    scfg.unauthenticated = unauthenticated;
    rcfg.encrypt = encrypt;
    rcfg.unauthenticated = unauthenticated;
    let dir = data.parent().unwrap_or(Path::new("."));
    let rpath = dir.join(if pinned {
        "recv-plan.toml"
    } else {
        "recv-os.toml"
    });
    std::fs::write(&rpath, rcfg.to_toml())?;
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let mut recv = Command::new(std::env::current_exe()?)
        .args([
            "stream", "recv", "--listen", &addr, "--sink", "null", "--config",
        ])
        .arg(&rpath)
        .env("LOCI_STREAM_SECRET", secret)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the receiver (`loci stream recv`)")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listening(port) {
        if Instant::now() > deadline || recv.try_wait()?.is_some() {
            let _ = recv.kill();
            let out = recv.wait_with_output()?;
            bail!(
                "the receiver did not start listening on {addr}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = Instant::now();
    let sent = loci_stream::send(SendOptions {
        to: addr,
        config: scfg,
        secret: secret.as_bytes().to_vec(),
        source: SourceSpec::File(data.to_path_buf()),
        resume: false,
        progress: false,
        reconnect_timeout: Duration::from_secs(30),
        faults: Faults::default(),
    });
    let secs = t.elapsed().as_secs_f64();
    // The receiver exits once its stream ended; bounded, and killed if it does not.
    let deadline = Instant::now() + Duration::from_secs(30);
    while recv.try_wait()?.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if recv.try_wait()?.is_none() {
        let _ = recv.kill();
    }
    let out = recv.wait_with_output()?;
    let rep = sent?;
    if !out.status.success() {
        bail!(
            "the receiver failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((secs, rep))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `n` contiguous slices covering `0..len` exactly once, in order, boundaries at multiples of
/// `align` (the last takes the remainder); empty slices are left out (a file smaller than
/// `n * align` gets fewer).
pub fn slices(len: u64, n: usize, align: u64) -> Vec<Range<u64>> {
    let align = align.max(1);
    let n = n.max(1) as u64;
    let units = len.div_ceil(align);
    let (per, extra) = (units / n, units % n);
    let mut out = Vec::new();
    let mut start = 0u64;
    for i in 0..n {
        let u = per + u64::from(i < extra);
        let end = (start + u * align).min(len);
        if end > start {
            out.push(start..end);
        }
        start = end;
    }
    out
}

/// The byte count `lz4 -d -v` reports on stderr (`stdin : decoded N bytes`), the last one.
pub fn lz4_decoded_bytes(stderr: &str) -> Option<u64> {
    let i = stderr.rfind("decoded ")?;
    let rest = &stderr[i + "decoded ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if !rest[digits.len()..].starts_with(" bytes") {
        return None;
    }
    digits.parse().ok()
}

/// Why `lz4 -T` (multithreaded compression, lz4 1.10.0 and later) cannot be used here, or None.
fn lz4_threads_missing() -> Option<String> {
    // `*** LZ4 command line interface 64-bits v1.9.4, by Yann Collet ***` -> `v1.9.4`
    let version = Command::new("lz4")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find(|w| w.starts_with('v') && w[1..].starts_with(|c: char| c.is_ascii_digit()))
                .map(|v| format!("installed: lz4 {}", v.trim_end_matches(',')))
        })
        .unwrap_or_default();
    let ok = Command::new("sh")
        .args(["-c", "lz4 -1 -T2 -c < /dev/null > /dev/null 2>&1"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    (!ok).then(|| {
        format!(
            "the installed lz4 has no -T (multithreaded compression came in lz4 1.10.0; {})",
            if version.is_empty() {
                "lz4 not found"
            } else {
                &version
            }
        )
    })
}

/// One pipeline of a peer: the receiving and sending shell commands, and the slice of the file
/// fed to the sender's stdin (None: the sender reads what its command names).
struct Pipeline {
    rx: String,
    tx: String,
    feed: Option<Range<u64>>,
    /// Raw bytes the receiver must report decoding (`lz4 -d -v`); None: not checked.
    expect: Option<u64>,
}

/// One run of a shell pipeline peer; seconds from the first sender's start to the last
/// receiver's exit. Every lz4 peer's receiver decodes with `lz4 -d -v` (which checks the
/// frame's content checksum) and must report exactly the raw bytes its sender was given.
fn peer_once(peer: &str, data: &Path, len: u64, cores: usize, dir: &Path) -> anyhow::Result<f64> {
    let f = format!("'{}'", data.display());
    let mut ports: Vec<u16> = Vec::new();
    let mut port = || -> anyhow::Result<u16> {
        loop {
            let p = free_port()?;
            if !ports.contains(&p) {
                ports.push(p);
                return Ok(p);
            }
        }
    };
    let lz4_rx = |p: u16| format!("nc -l 127.0.0.1 {p} | lz4 -d -c -v > /dev/null");
    let pipes: Vec<Pipeline> = match peer {
        "lz4-nc" => {
            let p = port()?;
            vec![Pipeline {
                rx: lz4_rx(p),
                tx: format!("lz4 -1 -c {f} | nc -N 127.0.0.1 {p}"),
                feed: None,
                expect: Some(len),
            }]
        }
        "lz4-mt" => {
            let p = port()?;
            vec![Pipeline {
                rx: lz4_rx(p),
                tx: format!("lz4 -1 -T{cores} -c {f} | nc -N 127.0.0.1 {p}"),
                feed: None,
                expect: Some(len),
            }]
        }
        "lz4-nc-par" => slices(len, cores, SLICE_ALIGN)
            .into_iter()
            .map(|s| {
                let p = port()?;
                Ok(Pipeline {
                    rx: lz4_rx(p),
                    tx: format!("lz4 -1 -c | nc -N 127.0.0.1 {p}"),
                    expect: Some(s.end - s.start),
                    feed: Some(s),
                })
            })
            .collect::<anyhow::Result<_>>()?,
        "raw-tcp" => {
            let p = port()?;
            vec![Pipeline {
                rx: format!("nc -l 127.0.0.1 {p} > /dev/null"),
                tx: format!("nc -N 127.0.0.1 {p} < {f}"),
                feed: None,
                expect: None,
            }]
        }
        _ => bail!("unknown peer {peer}"),
    };
    if let Some(total) = pipes
        .iter()
        .map(|p| p.expect)
        .sum::<Option<u64>>()
        .filter(|_| pipes.iter().all(|p| p.expect.is_some()))
    {
        anyhow::ensure!(
            total == len,
            "peer {peer}: slices cover {total} of {len} bytes"
        );
    }
    run_pipelines(peer, &pipes, data, &ports, dir)
}

fn run_pipelines(
    peer: &str,
    pipes: &[Pipeline],
    data: &Path,
    ports: &[u16],
    dir: &Path,
) -> anyhow::Result<f64> {
    let kill_all = |cs: &mut Vec<Child>| {
        for c in cs.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    };
    let mut recvs: Vec<Child> = Vec::new();
    let mut errs = Vec::new();
    for (i, p) in pipes.iter().enumerate() {
        // stderr to a file: `lz4 -v` reports the decoded byte count there, and a file never
        // blocks the receiver the way an unread pipe could.
        let err = dir.join(format!("{peer}-rx-{i}.err"));
        let spawned = Command::new("sh")
            .args(["-c", &p.rx])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&err)?)
            .spawn()
            .with_context(|| {
                format!(
                    "starting `{}` (are netcat-openbsd and lz4 installed?)",
                    p.rx
                )
            });
        match spawned {
            Ok(c) => recvs.push(c),
            Err(e) => {
                kill_all(&mut recvs);
                return Err(e);
            }
        }
        errs.push(err);
    }
    // Wait (bounded) until every listener accepts connections.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ports.iter().all(|&p| listening(p)) {
        if Instant::now() > deadline {
            kill_all(&mut recvs);
            bail!("peer {peer}: the receivers did not all start listening on {ports:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let file = File::open(data)?;
    let t = Instant::now();
    let result = std::thread::scope(|sc| -> anyhow::Result<Vec<String>> {
        let mut sends = Vec::new();
        let mut feeders = Vec::new();
        for p in pipes {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", &p.tx]);
            match &p.feed {
                Some(range) => {
                    let (r, w) = pipe()?;
                    cmd.stdin(Stdio::from(r));
                    let file = &file;
                    let range = range.clone();
                    feeders.push(sc.spawn(move || feed_slice(file, range, w)));
                }
                None => {
                    cmd.stdin(Stdio::null());
                }
            }
            // `cmd` (and with it the pipe's read end here) drops after the spawn: the sender
            // holds the only read end, so a dead sender makes the feeder fail, not hang.
            sends.push(
                cmd.spawn()
                    .with_context(|| format!("starting `{}`", p.tx))?,
            );
        }
        let mut failed = Vec::new();
        for (s, p) in sends.iter_mut().zip(pipes) {
            let st = s.wait()?;
            if !st.success() {
                failed.push(format!("`{}` -> {st}", p.tx));
            }
        }
        for f in feeders {
            if let Err(e) = f.join().expect("feeder thread") {
                failed.push(format!("feeding a slice of the file: {e}"));
            }
        }
        Ok(failed)
    });
    let mut failed = match result {
        Ok(f) => f,
        Err(e) => {
            kill_all(&mut recvs);
            return Err(e);
        }
    };
    // A receiver whose sender failed may wait forever for a connection: bounded.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, (r, p)) in recvs.iter_mut().zip(pipes).enumerate() {
        let st = loop {
            if let Some(st) = r.try_wait()? {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = r.kill();
                let _ = r.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        match st {
            Some(st) if st.success() => {}
            Some(st) => failed.push(format!("`{}` -> {st}", p.rx)),
            None => failed.push(format!("`{}` did not finish", p.rx)),
        }
        if let Some(want) = p.expect {
            let err = std::fs::read_to_string(&errs[i]).unwrap_or_default();
            match lz4_decoded_bytes(&err) {
                Some(got) if got == want => {}
                got => failed.push(format!(
                    "pipeline {i}: received {} of {want} raw bytes ({})",
                    got.map_or("no count".into(), |g| g.to_string()),
                    err.trim().replace('\r', " ")
                )),
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    if !failed.is_empty() {
        bail!("peer {peer} failed: {}", failed.join("; "));
    }
    Ok(secs)
}

/// A pipe (both ends close-on-exec, so no other child inherits the write end and keeps the
/// reader from seeing end of file), 1 MiB deep where the system allows.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both are open descriptors that nothing else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on an open descriptor; failure (a lower pipe-max-size) only leaves 64 KiB.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
    Ok((r, w))
}

/// Feeds bytes `range` of `file` into the pipe `w` with `splice` (page-cache pages move into
/// the pipe without a copy, so the slicing adds no pass over the data: the sender's `lz4` reads
/// from the pipe what it would read from the file); `pread` + `write` where splice is refused.
/// Its CPU time is this process's, counted in the peer's row.
fn feed_slice(file: &File, range: Range<u64>, w: OwnedFd) -> std::io::Result<()> {
    let mut off = range.start as libc::loff_t;
    let end = range.end as libc::loff_t;
    while off < end {
        let want = ((end - off) as usize).min(1 << 20);
        // SAFETY: both descriptors are open; `off` is a valid offset pointer for the file side.
        let n = unsafe {
            libc::splice(
                file.as_raw_fd(),
                &mut off,
                w.as_raw_fd(),
                std::ptr::null_mut(),
                want,
                libc::SPLICE_F_MOVE,
            )
        };
        if n > 0 {
            continue;
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EINVAL) | Some(libc::ENOSYS) => {
                let mut w = File::from(w);
                let mut buf = vec![0u8; 1 << 20];
                while off < end {
                    let want = ((end - off) as usize).min(buf.len());
                    let got = file.read_at(&mut buf[..want], off as u64)?;
                    if got == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    w.write_all(&buf[..got])?;
                    off += got as libc::loff_t;
                }
                return Ok(());
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_file_exactly_once_in_order() {
        for len in [
            0u64,
            1,
            4095,
            4096,
            4097,
            1 << 20,
            3 << 20,
            (3 << 20) + 7,
            663_552_000,
        ] {
            for n in 1..=9 {
                for align in [1u64, 4096, 1 << 20] {
                    let s = slices(len, n, align);
                    assert!(s.len() <= n, "{len} {n} {align}: {s:?}");
                    let mut at = 0;
                    for (k, r) in s.iter().enumerate() {
                        assert_eq!(r.start, at, "{len} {n} {align}: gap or overlap {s:?}");
                        assert!(r.end > r.start, "empty slice {s:?}");
                        if k + 1 < s.len() {
                            assert_eq!(r.end % align, 0, "unaligned boundary {s:?}");
                        }
                        at = r.end;
                    }
                    assert_eq!(at, len, "{len} {n} {align}: {s:?}");
                    assert_eq!(s.iter().map(|r| r.end - r.start).sum::<u64>(), len);
                }
            }
        }
        // The default run on 2 cores: two halves of 60 projections, 1 MiB-aligned.
        let s = slices(663_552_000, 2, 1 << 20);
        assert_eq!(s, vec![0..332_398_592, 332_398_592..663_552_000]);
    }

    #[test]
    fn limit_is_cores_over_the_cpu_seconds_per_raw_gb() {
        let l = Limit {
            cores: 2,
            compress_s_per_gb: 1.6,
            decompress_s_per_gb: 0.4,
            tcp_s_per_gb: 0.4,
            ratio: 2.0,
        };
        // 1.6 + 0.4 / 2 + 0.4 = 2.2 cpu-s per raw GB; 2 cores -> 0.909 GB/s.
        assert!((l.cpu_s_per_raw_gb() - 2.2).abs() < 1e-12);
        assert!((l.raw_gb_per_s() - 2.0 / 2.2).abs() < 1e-12);
        // Linear in cores; a better ratio makes TCP cheaper per raw byte.
        let four = Limit { cores: 4, ..l };
        assert!((four.raw_gb_per_s() - 2.0 * l.raw_gb_per_s()).abs() < 1e-12);
        let better = Limit { ratio: 4.0, ..l };
        assert!((better.cpu_s_per_raw_gb() - 2.1).abs() < 1e-12);
        // No compression cost at all: bounded by decompress + TCP alone.
        let free = Limit {
            compress_s_per_gb: 0.0,
            ..l
        };
        assert!((free.raw_gb_per_s() - 2.0 / 0.6).abs() < 1e-12);
    }

    #[test]
    fn lz4_decoded_count_is_read_from_verbose_stderr() {
        let err = "*** LZ4 command line interface 64-bits v1.9.4, by Yann Collet ***\n\r                                                                               \rstdin                : decoded 5000000 bytes \n";
        assert_eq!(lz4_decoded_bytes(err), Some(5_000_000));
        assert_eq!(lz4_decoded_bytes("Error 68 : Unfinished stream \n"), None);
        assert_eq!(lz4_decoded_bytes(""), None);
        assert_eq!(lz4_decoded_bytes("decoded 12 blocks"), None);
    }

    fn have(tool: &str) -> bool {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool} > /dev/null")])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A pipeline peer that drops bytes fails the run, even when every process in it exits 0
    /// (the sender drops all but 1000 bytes of its slice and sends a valid LZ4 frame of those);
    /// the same pipelines without the loss pass.
    #[test]
    fn a_peer_that_loses_bytes_fails_the_run() {
        if !(have("lz4") && have("nc")) {
            eprintln!("NOTE: lz4 or nc missing (scripts/install-deps installs them); skipped");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        for lossy in [false, true] {
            let mut ports = Vec::new();
            let pipes: Vec<Pipeline> = slices(data.len() as u64, 2, 4096)
                .into_iter()
                .enumerate()
                .map(|(i, s)| {
                    let p = loop {
                        let p = free_port().unwrap();
                        if !ports.contains(&p) {
                            break p;
                        }
                    };
                    ports.push(p);
                    let take = if lossy && i == 1 {
                        "(head -c 1000; cat > /dev/null)"
                    } else {
                        "cat"
                    };
                    Pipeline {
                        rx: format!("nc -l 127.0.0.1 {p} | lz4 -d -c -v > /dev/null"),
                        tx: format!("{take} | lz4 -1 -c | nc -N 127.0.0.1 {p}"),
                        expect: Some(s.end - s.start),
                        feed: Some(s),
                    }
                })
                .collect();
            let r = run_pipelines("test", &pipes, &path, &ports, dir.path());
            if lossy {
                let e = r.expect_err("a lossy peer must fail").to_string();
                assert!(e.contains("pipeline 1: received 1000 of"), "{e}");
            } else {
                r.unwrap();
            }
        }
    }

    /// The slice feeder moves exactly the asked bytes through a pipe.
    #[test]
    fn feed_slice_sends_exactly_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        for range in slices(data.len() as u64, 3, 4096) {
            let (r, w) = pipe().unwrap();
            let mut got = Vec::new();
            std::thread::scope(|sc| {
                let h = sc.spawn(|| feed_slice(&file, range.clone(), w));
                File::from(r).read_to_end(&mut got).unwrap();
                h.join().unwrap().unwrap();
            });
            assert_eq!(got, &data[range.start as usize..range.end as usize]);
        }
    }
}
