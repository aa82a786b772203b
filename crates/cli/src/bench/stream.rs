//! `loci bench stream`: the streaming pipeline on loopback against `lz4 | nc` and raw `nc`, on the
//! same phantom data in one run, plus loci's own plan against OS placement, plus the two LZ4
//! implementations on one core (the measurement that picked the default codec).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use loci_report::{Machine, Report, Row};
use loci_stream::config::Sync;
use loci_stream::plan::{plan, PlanOptions};
use loci_stream::{Codec, Faults, SendOptions, SourceSpec};

#[derive(Args, Debug)]
pub struct StreamArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Bytes streamed per run (default 663 MB = 60 projections; --quick: 20 projections).
    #[arg(long, value_parser = crate::stream::parse_bytes)]
    pub bytes: Option<u64>,
    /// Peers run in the same invocation: lz4-nc (`lz4 -1 -c F | nc` -> `nc -l | lz4 -d`),
    /// raw-tcp (uncompressed `nc`). Empty: none.
    #[arg(long, value_delimiter = ',', default_value = "lz4-nc,raw-tcp")]
    pub peers: Vec<String>,
    /// Only compare the LZ4 implementations on one core (lz4 C library vs lz4_flex).
    #[arg(long)]
    pub codec_only: bool,
    /// Skip the OS-placement run of loci.
    #[arg(long)]
    pub no_os: bool,
}

const PEERS: [&str; 2] = ["lz4-nc", "raw-tcp"];

pub fn run(mut a: StreamArgs) -> anyhow::Result<Report> {
    a.peers.retain(|p| !p.is_empty()); // `--peers ''`: none
    for p in &a.peers {
        if !PEERS.contains(&p.as_str()) {
            bail!("unknown peer {p:?} (valid: {})", PEERS.join(", "));
        }
    }
    let chunk = loci_stream::phantom::CHUNK_BYTES;
    let bytes = a
        .bytes
        .unwrap_or(if a.common.quick { 20 } else { 60 } * chunk as u64);
    let reps = a.common.reps.unwrap_or(if a.common.quick { 1 } else { 3 });
    anyhow::ensure!(bytes > 0 && reps > 0, "--bytes and --reps must be positive");
    let topo = crate::this_machine()?;
    let mut rep = Report::new(
        "stream",
        serde_json::json!({ "bytes": bytes, "chunk_bytes": chunk, "reps": reps, "data": "phantom seed 42", "sink": "discard", "link": "loopback" }),
        Machine::of(&topo),
    );
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("phantom.raw");
    eprintln!(
        "writing {bytes} bytes of phantom projections to {}",
        data.display()
    );
    loci_stream::source::write_synthetic_file(&data, bytes, 42, chunk)?;
    codec_rows(&mut rep, &data, chunk, reps)?;
    if a.codec_only {
        return Ok(rep);
    }
    let p = plan(&topo, &topo, &PlanOptions::default())?;
    // Every system once per round, rounds repeated: load on a shared machine drifts, and
    // interleaving spreads it over all systems alike.
    let mut systems: Vec<String> = vec!["loci plan".into()];
    if !a.no_os {
        systems.push("loci os".into());
    }
    systems.extend(a.peers.iter().cloned());
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    let mut last: Vec<Option<loci_stream::StreamReport>> = vec![None; systems.len()];
    // CPU seconds (user + system) per run: loci's in this process, the peers' in their children.
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    for round in 0..reps {
        for (i, sys) in systems.iter().enumerate() {
            let c0 = cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN);
            let t = match sys.as_str() {
                "loci plan" | "loci os" => {
                    let (t, r) = loci_once(&data, &p, sys == "loci plan")?;
                    last[i] = Some(r);
                    t
                }
                peer => peer_once(peer, &data)?,
            };
            cpu[i].push(cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN) - c0);
            eprintln!("round {round}: {sys} {:.1} MB/s", bytes as f64 / t / 1e6);
            times[i].push(t);
        }
    }
    for (((sys, t), r), c) in systems.iter().zip(times).zip(last).zip(cpu) {
        let mut c = c;
        c.sort_by(f64::total_cmp);
        let cpu_median = c[c.len() / 2];
        let row = match sys.strip_prefix("loci ") {
            Some(placement) => {
                let r = r.expect("loci ran");
                Row::from_times("loci", t)
                    .config("placement", placement)
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
            None => Row::from_times(sys, t),
        };
        rep.results.push(
            row.case("end-to-end")
                .work(bytes as f64, "B/s")
                .extra("cpu_s", cpu_median)
                .extra("cpu_ns_per_byte", cpu_median * 1e9 / bytes as f64),
        );
        eprintln!("{sys}: {cpu_median:.2} cpu-s per run (median)");
    }
    Ok(rep)
}

/// One core each: compress then decompress every chunk of the file with both implementations,
/// alternating between them every repetition (load on a shared machine drifts).
fn codec_rows(rep: &mut Report, data: &Path, chunk: usize, reps: usize) -> anyhow::Result<()> {
    let raw = std::fs::read(data)?;
    let raw = &raw[..raw.len().min(8 * chunk)];
    let n = raw.chunks(chunk).count();
    let mut comp: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; Codec::bound(chunk)]).collect();
    let mut sizes = vec![0usize; n];
    let mut out = vec![0u8; chunk];
    let mut ct = vec![Vec::new(); Codec::ALL.len()];
    let mut dt = vec![Vec::new(); Codec::ALL.len()];
    let mut ratio = vec![0f64; Codec::ALL.len()];
    for _ in 0..reps {
        for (k, codec) in Codec::ALL.into_iter().enumerate() {
            let t = Instant::now();
            for ((c, s), r) in comp.iter_mut().zip(&mut sizes).zip(raw.chunks(chunk)) {
                *s = codec.compress(r, c)?;
            }
            ct[k].push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            for ((c, s), r) in comp.iter().zip(&sizes).zip(raw.chunks(chunk)) {
                codec.decompress(&c[..*s], &mut out[..r.len()])?;
            }
            dt[k].push(t.elapsed().as_secs_f64());
            ratio[k] = raw.len() as f64 / sizes.iter().sum::<usize>() as f64;
        }
    }
    for (case, times) in [("lz4-compress", ct), ("lz4-decompress", dt)] {
        for (k, codec) in Codec::ALL.into_iter().enumerate() {
            rep.results.push(
                Row::from_times(codec.name(), times[k].clone())
                    .case(case)
                    .config("threads", 1)
                    .work(raw.len() as f64, "B/s")
                    .extra("compression_ratio", ratio[k]),
            );
        }
    }
    Ok(())
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
) -> anyhow::Result<(f64, loci_stream::StreamReport)> {
    let secret = "loci-bench";
    let mut rcfg = if pinned {
        p.receiver.clone()
    } else {
        p.receiver.unpinned()
    };
    rcfg.sync = Sync::None;
    let scfg = if pinned {
        p.senders[0].clone()
    } else {
        p.senders[0].unpinned()
    };
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

/// User + system CPU seconds of this process (`RUSAGE_SELF`) or of its waited-for children.
fn cpu_seconds(who: i32) -> f64 {
    // SAFETY: rusage is plain data and getrusage only writes it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    if unsafe { libc::getrusage(who, &mut u) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One run of a shell pipeline peer; seconds from the sender's start to the receiver's exit.
fn peer_once(peer: &str, data: &Path) -> anyhow::Result<f64> {
    let port = free_port()?;
    let f = data.display();
    let (rx, tx) = match peer {
        "lz4-nc" => (
            format!("nc -l 127.0.0.1 {port} | lz4 -d -c > /dev/null"),
            format!("lz4 -1 -c {f} | nc -N 127.0.0.1 {port}"),
        ),
        "raw-tcp" => (
            format!("nc -l 127.0.0.1 {port} > /dev/null"),
            format!("nc -N 127.0.0.1 {port} < {f}"),
        ),
        _ => bail!("unknown peer {peer}"),
    };
    let mut recv = Command::new("sh")
        .args(["-c", &rx])
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting `{rx}` (are netcat-openbsd and lz4 installed?)"))?;
    // Wait (bounded) until the listener accepts connections.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listening(port) {
        if Instant::now() > deadline {
            let _ = recv.kill();
            bail!("`{rx}` did not start listening on port {port}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = Instant::now();
    let st = Command::new("sh").args(["-c", &tx]).status()?;
    let rs = recv.wait()?;
    let secs = t.elapsed().as_secs_f64();
    if !st.success() || !rs.success() {
        bail!("peer {peer} failed: `{tx}` -> {st}, `{rx}` -> {rs}");
    }
    Ok(secs)
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
