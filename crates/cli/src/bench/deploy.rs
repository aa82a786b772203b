//! `loci bench deploy` (issue 24): Dask dataframe workloads (a group-by like W2, a join like W3,
//! data generated inside the workers by bench/deploy/deploy.py) on a cluster that `loci deploy
//! dask` lays out as WIM, WIN and WIC, all with the machine's allowed cpus as the total threads.
//! Per design: the workloads' times and answers (hashes compared across designs), and the time
//! from the deploy command to every instance verified and to every worker joined.
//!
//! Each round deploys every design once (the order rotated per round, so drift spreads over the
//! designs), runs each workload `--warm` times untimed and once timed, and stops the cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Args;
use loci_report::{Machine, Report, Row};

use crate::bench::common;

#[derive(Args, Debug)]
pub struct DeployArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Designs, comma separated, from wim, win, wic (wim is the baseline of the ratios).
    #[arg(long, value_delimiter = ',', default_value = "wim,win,wic")]
    pub designs: Vec<String>,
    /// Workloads, comma separated, from groupby, join.
    #[arg(long, value_delimiter = ',', default_value = "groupby,join")]
    pub workloads: Vec<String>,
    /// Rows of the group-by table and of the join's S (R has 1/16 as many) [default: 8000000;
    /// --quick: 1000000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub rows: Option<u64>,
    /// Distinct keys of the group-by.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,
    /// Partitions of every table [default: 4 per cpu, the same for every design].
    #[arg(long, value_parser = crate::at_least_one)]
    pub partitions: Option<usize>,
    /// Untimed runs of each workload before its timed run, in every round.
    #[arg(long, default_value_t = 1)]
    pub warm: usize,
    /// The scheduler port of the clusters (workers listen on the ports after it).
    #[arg(long, default_value_t = 8786)]
    pub scheduler_port: u16,
}

const DESIGNS: [&str; 3] = ["wim", "win", "wic"];
const WORKLOADS: [&str; 2] = ["groupby", "join"];

/// bench/deploy/deploy.py and the venv's Python, with the Dask set installed.
struct Paths {
    python: PathBuf,
    driver: PathBuf,
}

impl Paths {
    fn setup() -> anyhow::Result<Paths> {
        let peers = common::peers_setup("dask", "../deploy/deploy.py")?;
        Ok(Paths {
            python: peers.join(".venv/bin/python"),
            driver: peers.join("../deploy/deploy.py"),
        })
    }
}

/// A cluster deployed by `loci deploy dask`, stopped on drop.
struct Cluster {
    child: Option<Child>,
    manifest: PathBuf,
    log: PathBuf,
}

impl Cluster {
    /// Starts `loci deploy dask --design D` and waits (60 s at most) until every instance is
    /// verified; returns the cluster and the seconds from the command to that point.
    fn start(design: &str, port: u16, dir: &Path) -> anyhow::Result<(Cluster, f64)> {
        let manifest = dir.join(format!("{design}.json"));
        let log = dir.join(format!("{design}.log"));
        // The last round's manifest of this design would read as verified at once.
        match std::fs::remove_file(&manifest) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", manifest.display()))
            }
            _ => {}
        }
        let t0 = Instant::now();
        let child = Command::new(std::env::current_exe()?)
            .args(["deploy", "dask", "--design", design, "--grace", "5"])
            .arg("--scheduler-port")
            .arg(port.to_string())
            .arg("--manifest")
            .arg(&manifest)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting loci deploy dask")?;
        let mut c = Cluster {
            child: Some(child),
            manifest,
            log,
        };
        let until = t0 + Duration::from_secs(60);
        loop {
            if let Some(m) = c.verified() {
                if !m {
                    bail!(
                        "deploy dask --design {design}: an instance is not as planned; {}",
                        c.tail()
                    );
                }
                return Ok((c, t0.elapsed().as_secs_f64()));
            }
            let exited = c.child.as_mut().and_then(|ch| ch.try_wait().ok().flatten());
            if let Some(st) = exited {
                bail!("deploy dask --design {design} ended ({st}) before its instances were verified; {}", c.tail());
            }
            if Instant::now() > until {
                bail!(
                    "deploy dask --design {design}: instances not verified within 60 s; {}",
                    c.tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `Some(all ok)` once every instance of the manifest has been verified.
    fn verified(&self) -> Option<bool> {
        let text = std::fs::read_to_string(&self.manifest).ok()?;
        let m: serde_json::Value = serde_json::from_str(&text).ok()?;
        let inst = m["instances"].as_array()?;
        let mine = self.child.as_ref().map(|c| c.id() as i64);
        if m["supervisor_pid"].as_i64() != mine {
            return None;
        }
        inst.iter()
            .all(|i| i["verify"].is_object())
            .then(|| inst.iter().all(|i| i["verify"]["ok"] == true))
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "its last lines ({}):\n{}",
            self.log.display(),
            lines[lines.len().saturating_sub(15)..].join("\n")
        )
    }

    /// `loci deploy stop`, then waits for the supervisor.
    fn stop(mut self) -> anyhow::Result<()> {
        let st = Command::new(std::env::current_exe()?)
            .args(["deploy", "stop"])
            .arg(&self.manifest)
            .stdout(Stdio::null())
            .status()?;
        if let Some(mut ch) = self.child.take() {
            ch.wait()?;
        }
        if !st.success() {
            bail!("loci deploy stop {} failed ({st})", self.manifest.display());
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut ch) = self.child.take() {
            // SAFETY: kill(2) on the supervisor this bench started; it forwards SIGTERM.
            unsafe { libc::kill(ch.id() as i32, libc::SIGTERM) };
            let _ = ch.wait();
        }
    }
}

/// One round of one design: the driver's facts line and each workload's time and hash.
struct Session {
    facts: serde_json::Value,
    times: BTreeMap<String, (f64, String)>,
}

/// Every worker count of a design on this machine (`loci deploy dask --dry-run --json`).
fn workers_of(design: &str) -> anyhow::Result<usize> {
    let out = Command::new(std::env::current_exe()?)
        .args(["deploy", "dask", "--dry-run", "--json", "--design", design])
        .output()?;
    if !out.status.success() {
        bail!(
            "loci deploy dask --design {design} --dry-run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let m: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    m["dask"]["workers"]
        .as_array()
        .map(Vec::len)
        .context("the dry run's manifest has no dask workers")
}

fn session(
    paths: &Paths,
    design: &str,
    workers: usize,
    a: &DeployArgs,
    rows: u64,
    parts: usize,
    dir: &Path,
) -> anyhow::Result<(Session, f64)> {
    let epoch = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
    let (cluster, verified_s) = Cluster::start(design, a.scheduler_port, dir)?;
    let out = Command::new(&paths.python)
        .arg(&paths.driver)
        .arg("bench")
        .args([
            "--scheduler",
            &format!("tcp://127.0.0.1:{}", a.scheduler_port),
        ])
        .args(["--workers", &workers.to_string()])
        .args(["--rows", &rows.to_string()])
        .args(["--keys", &a.keys.to_string()])
        .args(["--parts", &parts.to_string()])
        .args(["--workloads", &a.workloads.join(",")])
        .args(["--warm", &a.warm.to_string()])
        .args(["--t0", &format!("{epoch:.6}")])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stderr(Stdio::inherit())
        .output()
        .context("running bench/deploy/deploy.py")?;
    cluster.stop()?;
    if !out.status.success() {
        bail!(
            "bench/deploy/deploy.py bench on {design} failed ({})",
            out.status
        );
    }
    let mut s = Session {
        facts: serde_json::Value::Null,
        times: BTreeMap::new(),
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| {
            format!("bench/deploy/deploy.py printed a line that is not JSON: {line}")
        })?;
        match (v["workload"].as_str(), v["time_s"].as_f64()) {
            (Some(w), Some(t)) => {
                let h = v["hash"].as_str().unwrap_or_default().to_string();
                s.times.insert(w.to_string(), (t, h));
            }
            _ => s.facts = v,
        }
    }
    Ok((s, verified_s))
}

pub fn run(a: DeployArgs) -> anyhow::Result<Report> {
    for d in &a.designs {
        if !DESIGNS.contains(&d.as_str()) {
            bail!("--designs {d}: unknown; valid: wim, win, wic");
        }
    }
    for w in &a.workloads {
        if !WORKLOADS.contains(&w.as_str()) {
            bail!("--workloads {w}: unknown; valid: groupby, join");
        }
    }
    if a.designs.is_empty() || a.workloads.is_empty() {
        bail!("--designs and --workloads need at least one each");
    }
    let topo = crate::this_machine()?;
    let cpus = topo.allowed_cpus().len().max(1);
    let rows = a
        .rows
        .unwrap_or(if a.common.quick { 1_000_000 } else { 8_000_000 });
    let parts = a.partitions.unwrap_or(4 * cpus);
    let reps = a.common.reps_or(1, 3);
    let paths = Paths::setup()?;
    let workers: Vec<usize> = a
        .designs
        .iter()
        .map(|d| workers_of(d))
        .collect::<anyhow::Result<_>>()?;
    let mut rep = Report::new(
        "deploy",
        serde_json::json!({
            "engine": "dask", "designs": a.designs, "workloads": a.workloads, "rows": rows,
            "join_r_rows": (rows / 16).max(1), "keys": a.keys, "partitions": parts,
            "reps": reps, "warm": a.warm, "total_threads": cpus, "workers": workers,
        }),
        Machine::of(&topo),
    );
    let scratch = tempfile::Builder::new()
        .prefix("loci-bench-deploy-")
        .tempdir()?;
    // times[design][workload] and hashes; deploy times per design.
    let n = a.designs.len();
    let mut times: Vec<BTreeMap<String, Vec<f64>>> = vec![BTreeMap::new(); n];
    let mut hashes: Vec<BTreeMap<String, String>> = vec![BTreeMap::new(); n];
    let mut verified: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut ready: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut facts = vec![serde_json::Value::Null; n];
    for round in 0..reps {
        for k in 0..n {
            let i = (k + round) % n;
            let d = &a.designs[i];
            eprintln!(
                "deploy round {}/{reps}: {d} ({} workers)",
                round + 1,
                workers[i]
            );
            let (s, v) = session(&paths, d, workers[i], &a, rows, parts, scratch.path())?;
            verified[i].push(v);
            if let Some(r) = s.facts["ready_s"].as_f64() {
                ready[i].push(r);
            }
            for (w, (t, h)) in s.times {
                times[i].entry(w.clone()).or_default().push(t);
                let seen = hashes[i].entry(w.clone()).or_insert_with(|| h.clone());
                if *seen != h {
                    bail!("{d} {w}: the answer changed between rounds ({seen} then {h})");
                }
            }
            facts[i] = s.facts;
        }
    }
    for (i, d) in a.designs.iter().enumerate() {
        let w = &facts[i]["workers"];
        let per: Vec<serde_json::Value> = w
            .as_object()
            .map(|m| m.values().map(|x| x["nthreads"].clone()).collect())
            .unwrap_or_default();
        let row = |r: Row| {
            r.config("design", d)
                .extra("workers", workers[i])
                .extra("threads", facts[i]["nthreads"].clone())
                .extra("threads_per_worker", per.clone())
                .extra("versions", facts[i]["versions"].clone())
        };
        for (wl, t) in &times[i] {
            rep.results.push(
                row(Row::from_times("dask", t.clone()).case(wl))
                    .work(rows as f64, "rows/s")
                    .extra("answer", hashes[i].get(wl).cloned().unwrap_or_default()),
            );
        }
        rep.results.push(row(
            Row::from_times("dask", verified[i].clone()).case("deploy to verified")
        ));
        if !ready[i].is_empty() {
            rep.results.push(row(
                Row::from_times("dask", ready[i].clone()).case("deploy to joined")
            ));
        }
    }
    rep.params["answers"] = answers(&a.designs, &hashes).into();
    Ok(rep)
}

/// `equal: ...` when every design answered every workload alike, else `DIFFER: ...`.
fn answers(designs: &[String], hashes: &[BTreeMap<String, String>]) -> String {
    let mut differ = Vec::new();
    let mut same = Vec::new();
    for w in WORKLOADS {
        let got: Vec<(&String, &String)> = designs
            .iter()
            .zip(hashes)
            .filter_map(|(d, h)| h.get(w).map(|x| (d, x)))
            .collect();
        let Some((_, first)) = got.first() else {
            continue;
        };
        if got.iter().all(|(_, h)| h == first) {
            same.push(format!("{w} {first}"));
        } else {
            let each: Vec<String> = got.iter().map(|(d, h)| format!("{d} {h}")).collect();
            differ.push(format!("{w}: {}", each.join(", ")));
        }
    }
    if differ.is_empty() {
        format!("equal across {}: {}", designs.join(", "), same.join(", "))
    } else {
        format!("DIFFER: {}", differ.join("; "))
    }
}

/// WIM is the baseline of every case.
pub fn baseline(r: &Row) -> bool {
    r.config.get("design").map(String::as_str) == Some("wim")
}

/// An error when the designs' answers differ (after the report was printed and written).
pub fn answers_agree(rep: &Report) -> anyhow::Result<()> {
    let a = rep.params["answers"].as_str().unwrap_or("");
    if a.starts_with("DIFFER") {
        bail!("loci bench deploy: the designs' answers differ: {a}");
    }
    Ok(())
}

/// Lines after the table: each design against WIM, the deploy times, the answers, and what a
/// machine with one node can and cannot show.
pub fn summary(rep: &Report) -> String {
    let mut out = String::new();
    let cases: Vec<String> =
        rep.results
            .iter()
            .filter_map(|r| r.case.clone())
            .fold(Vec::new(), |mut v, c| {
                if !v.contains(&c) {
                    v.push(c);
                }
                v
            });
    for case in &cases {
        let rows: Vec<&Row> = rep.rows_of(Some(case)).collect();
        let base = rows.iter().find(|r| baseline(r));
        for r in &rows {
            out += &format!(
                "deploy {case} {}: median {:.3} s{}\n",
                r.config.get("design").map(String::as_str).unwrap_or("-"),
                r.median_s,
                match base {
                    Some(b) if !case.starts_with("deploy ") => {
                        format!(", {:.2}x wim's time", r.median_s / b.median_s)
                    }
                    _ => String::new(),
                }
            );
        }
    }
    out += &format!(
        "deploy answers: {}\n",
        rep.params["answers"].as_str().unwrap_or("-")
    );
    if rep.machine.nodes <= 1 {
        out += "deploy: this machine has one NUMA node: WIM, WIN and WIC differ only in how many worker \
                processes share its cpus and whether they are pinned, not in memory locality; seed 004's \
                2-3x for WIN needs several nodes and cannot show here\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_equal_or_name_what_differs() {
        let d = vec!["wim".to_string(), "win".to_string()];
        let h = |g: &str, j: &str| {
            BTreeMap::from([
                ("groupby".to_string(), g.to_string()),
                ("join".to_string(), j.to_string()),
            ])
        };
        let same = answers(&d, &[h("a", "b"), h("a", "b")]);
        assert_eq!(same, "equal across wim, win: groupby a, join b");
        let diff = answers(&d, &[h("a", "b"), h("a", "c")]);
        assert_eq!(diff, "DIFFER: join: wim b, win c");
        let mut rep = Report::new(
            "deploy",
            serde_json::json!({"answers": diff}),
            Machine::sized(1, 2),
        );
        assert!(answers_agree(&rep).is_err());
        rep.params["answers"] = same.into();
        assert!(answers_agree(&rep).is_ok());
        let wim = Row::from_times("dask", vec![2.0])
            .case("groupby")
            .config("design", "wim");
        let win = Row::from_times("dask", vec![1.0])
            .case("groupby")
            .config("design", "win");
        assert!(baseline(&wim) && !baseline(&win));
        rep.results = vec![wim, win];
        let s = summary(&rep);
        assert!(
            s.contains("groupby win: median 1.000 s, 0.50x wim's time"),
            "{s}"
        );
        assert!(s.contains("one NUMA node"), "{s}");
    }
}
