//! The peers on the same volume: memcpy of the same bytes (here), and numpy / xarray / TileDB
//! (bench/peers/subarray.py, one run over every case).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use loci_array::Region;
use loci_report::{Report, Row};

use super::Progress;
use crate::bench::{common, copied, memcpy_source};

/// Every `--peers` name; the Python ones run in bench/peers/subarray.py.
pub(super) const PEERS: [&str; 7] = [
    "numpy",
    "xarray",
    "tiledb",
    "memcpy",
    "numpy-prealloc",
    "numpy-threads",
    "loci-nopool",
];
/// The default `--peers` (TileDB only when named).
pub(super) const DEFAULT_PEERS: &str =
    "numpy,numpy-prealloc,numpy-threads,xarray,memcpy,loci-nopool";

/// Whether peer `p` runs in the Python script (not in this process).
pub(super) fn is_python_peer(p: &str) -> bool {
    !matches!(p, "memcpy" | "loci-nopool")
}

/// Checks, before any measurement, that the Python peers among `peers` can run: `python`
/// exists and imports the modules they need (numpy for every Python peer, xarray for `xarray`;
/// TileDB, whose wheel may not install, is skipped with a note instead), so that a missing one
/// fails the run at once, not after the loci matrix.
pub(super) fn check_python_peers(python: &Path, peers: &[String]) -> anyhow::Result<()> {
    if !peers.iter().any(|p| is_python_peer(p)) {
        return Ok(());
    }
    if !python.is_file() {
        bail!(
            "the Python peers need {} (create it with bench/peers/setup --subarray, or pass --python)",
            python.display()
        );
    }
    let mut mods = vec!["numpy"];
    if peers.iter().any(|p| p == "xarray") {
        mods.push("xarray");
    }
    let out = Command::new(python)
        .arg("-c")
        .arg(format!("import {}", mods.join(", ")))
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("").trim();
        bail!(
            "{} cannot import {} ({last}): install them with bench/peers/setup --subarray, pass \
             another --python, or leave those peers out of --peers",
            python.display(),
            mods.join(" and ")
        );
    }
    Ok(())
}

/// The bench/peers directory holding subarray.py (else bench/peers under the current directory,
/// for the error that names the missing interpreter).
pub(super) fn peers_dir() -> PathBuf {
    common::peers_dir("subarray.py").unwrap_or_else(|| {
        std::env::current_dir()
            .unwrap_or_default()
            .join("bench/peers")
    })
}

/// The memcpy peer of one case: `reps` copies of `bytes` into a prefaulted buffer and into a new
/// mapping each, one row per destination.
pub(super) fn memcpy_rows(
    rep: &mut Report,
    case: &str,
    bytes: usize,
    reps: usize,
    huge: bool,
) -> anyhow::Result<()> {
    let srcbuf = memcpy_source(bytes);
    // The limit: a destination mapped like loci's results (huge pages as asked) and written once
    // before the clock starts.
    let mut pre = Region::map(bytes, huge)?;
    pre.as_mut_slice().fill(1);
    let mut fresh = Vec::with_capacity(reps);
    let mut warm = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        pre.as_mut_slice()
            .copy_from_slice(std::hint::black_box(&srcbuf));
        warm.push(t.elapsed().as_secs_f64());
        std::hint::black_box(&mut pre);
        let t = Instant::now();
        let r = Region::map(bytes, huge)?;
        // SAFETY: `r` is a fresh mapping of `bytes` bytes; `srcbuf` has `bytes`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::hint::black_box(srcbuf.as_ptr()),
                r.as_mut_ptr(),
                bytes,
            )
        };
        fresh.push(t.elapsed().as_secs_f64());
        std::hint::black_box(&r);
        anyhow::ensure!(
            copied(&srcbuf, pre.as_slice()) && copied(&srcbuf, r.as_slice()),
            "memcpy peer: the copy did not happen"
        );
    }
    for (dst, times) in [("prefaulted", warm), ("new-mapping", fresh)] {
        rep.results.push(
            Row::from_times("memcpy", times)
                .case(case)
                .config("dst", dst)
                .config("threads", 1)
                .work(bytes as f64, "B/s"),
        );
    }
    Ok(())
}

/// What the Python peers are given: the volume written out, and the sweep's settings.
pub(super) struct PythonJob<'a> {
    pub python: &'a Path,
    pub peers: &'a [&'a String],
    /// The volume as a dense file, and its [`super::sum32`].
    pub volume: &'a Path,
    pub volume_sum: u64,
    pub shape: [usize; 3],
    pub reps: usize,
    pub threads: usize,
}

/// Runs the Python peers on every case in `queries` and adds their rows; a result that differs
/// from loci's (`loci_sums`, per case) fails the run.
pub(super) fn python_rows(
    rep: &mut Report,
    pb: &Progress,
    job: &PythonJob,
    queries: &[serde_json::Value],
    loci_sums: &HashMap<String, u64>,
) -> anyhow::Result<()> {
    let pdir = peers_dir();
    let tdb = std::env::temp_dir().join(format!("loci-subarray-tiledb-{}", std::process::id()));
    let spec = serde_json::json!({
        "file": job.volume, "shape": job.shape, "dtype": "<f4", "sum32": job.volume_sum,
        "reps": job.reps, "threads": job.threads, "peers": job.peers, "tiledb_dir": tdb,
        "queries": queries,
    });
    let job_path = job.volume.with_extension("json");
    std::fs::write(&job_path, serde_json::to_string(&spec)?)?;
    pb.start(format!(
        "peers {:?} with {} (all cases)",
        job.peers,
        job.python.display()
    ));
    let out = Command::new(job.python)
        .arg(pdir.join("subarray.py"))
        .arg(&job_path)
        .output();
    let _ = std::fs::remove_file(job.volume);
    let _ = std::fs::remove_file(&job_path);
    let _ = std::fs::remove_dir_all(&tdb);
    pb.done();
    let out = out.with_context(|| {
        format!(
            "cannot run {} (create it with bench/peers/setup --subarray, or pass --python)",
            job.python.display()
        )
    })?;
    let bytes_of = |case: &str| -> f64 {
        queries
            .iter()
            .find(|q| q["case"] == case)
            .and_then(|q| q["bytes"].as_f64())
            .unwrap_or(0.0)
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("peer output is not JSON: {line}"))?;
        if let Some(e) = v.get("error") {
            bail!("peer failed: {e}");
        }
        if let Some(why) = v.get("skipped") {
            pb.say(format!("note: {} skipped: {why}", v["system"]));
            continue;
        }
        let case = v["case"].as_str().unwrap_or_default().to_string();
        let sys = v["system"].as_str().unwrap_or_default().to_string();
        let times: Vec<f64> = serde_json::from_value(v["times_s"].clone())?;
        let sum = v["sum32"].as_u64();
        if sum != loci_sums.get(&case).copied() {
            bail!(
                "{sys} result of {case} differs from loci's (sum32 {sum:?} vs {:?})",
                loci_sums.get(&case)
            );
        }
        let threads = match &v["threads"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => "1".to_string(),
            t => t.to_string(),
        };
        let mut row = Row::from_times(&sys, times)
            .case(&case)
            .config("threads", threads)
            .work(bytes_of(&case), "B/s")
            .extra("version", v["version"].clone())
            .extra("sum32", sum);
        if let Some(r) = v.get("result") {
            row = row.extra("result", r.clone());
        }
        if let Some(n) = v.get("slabs") {
            row = row.extra("slabs", n.clone());
        }
        rep.results.push(row);
    }
    if !out.status.success() {
        bail!(
            "peer script failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
