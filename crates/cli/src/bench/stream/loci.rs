//! One run of loci's pipeline over loopback: the receiver a child process, the sender here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use loci_stream::config::Sync;
use loci_stream::proto::Protection;
use loci_stream::{Faults, SendOptions, SourceSpec};

use super::{free_port, listening};

/// One run of [`loci_once`].
pub(super) struct LociRun {
    /// From the sender's start to the receiver's confirmation of the whole-stream checksum.
    pub(super) secs: f64,
    /// The sender's report.
    pub(super) report: loci_stream::StreamReport,
    /// CPU seconds of every stage of both sides, by stage name (compress, send: the sender's;
    /// recv, decompress, commit: the receiver's, from its `--json` report).
    pub(super) stage_cpu_s: BTreeMap<String, f64>,
}

/// loci over loopback into a discarding sink; seconds from the sender's start to the receiver's
/// confirmation of the whole-stream checksum. The receiver is its own process (`loci stream recv`,
/// this binary), as on a real gateway and as the peers' `nc -l | lz4 -d` is: in one process, the
/// two sides' buffer mappings and faults would contend on one address space's locks and TLB
/// shootdowns, which no deployment has. The sender runs in this process (its report feeds the row).
pub(super) fn loci_once(
    data: &Path,
    p: &loci_stream::plan::StreamPlan,
    pinned: bool,
    protection: Protection,
) -> anyhow::Result<LociRun> {
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
            "stream", "recv", "--listen", &addr, "--sink", "null", "--json", "--config",
        ])
        .arg(&rpath)
        .env("LOCI_STREAM_SECRET", secret)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
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
    let mut stage_cpu_s: BTreeMap<String, f64> = rep
        .stages
        .iter()
        .map(|s| (s.name.clone(), s.cpu_s))
        .collect();
    stage_cpu_s.extend(receiver_stage_cpu(&out.stdout)?);
    Ok(LociRun {
        secs,
        report: rep,
        stage_cpu_s,
    })
}

/// The stages' CPU seconds in what `loci stream recv --json` printed: a JSON array with one
/// report (this bench's receiver serves one stream).
fn receiver_stage_cpu(stdout: &[u8]) -> anyhow::Result<Vec<(String, f64)>> {
    let v: serde_json::Value = serde_json::from_slice(stdout).with_context(|| {
        format!(
            "the receiver's --json report: {:?}",
            String::from_utf8_lossy(stdout)
        )
    })?;
    let stages = v
        .get(0)
        .and_then(|r| r.get("stages"))
        .and_then(|s| s.as_array())
        .context("the receiver's --json report has no stages")?;
    stages
        .iter()
        .map(|s| {
            let name = s.get("name").and_then(|n| n.as_str());
            let cpu = s.get("cpu_s").and_then(|c| c.as_f64());
            match (name, cpu) {
                (Some(n), Some(c)) => Ok((n.to_string(), c)),
                _ => anyhow::bail!("a receiver stage without name or cpu_s: {s}"),
            }
        })
        .collect()
}

/// Per stage, the median over runs of its CPU seconds per raw GB (10^9 bytes of `bytes`).
pub(super) fn stage_medians_per_gb(
    runs: &[BTreeMap<String, f64>],
    bytes: u64,
) -> BTreeMap<String, f64> {
    let names: BTreeSet<&String> = runs.iter().flat_map(|r| r.keys()).collect();
    names
        .into_iter()
        .map(|n| {
            let v: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.get(n))
                .map(|c| c * 1e9 / bytes as f64)
                .collect();
            (n.clone(), loci_report::median(&v).unwrap_or(f64::NAN))
        })
        .collect()
}
