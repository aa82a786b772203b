//! The manifest of a deployment (JSON, documented in docs/deploy.md), the check of a running
//! instance against its placement, and `loci deploy status|stop MANIFEST`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use loci_place::verify;
use loci_place::PlanJson;
use loci_topo::{CpuSet, NodeSet};
use serde::{Deserialize, Serialize};

/// The whole deployment as the supervisor last wrote it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub design: String,
    /// The machine the layout was made for (`sysfs:/` when deployed).
    pub topology: String,
    /// `planned` (--dry-run), `running`, `stopping`, `stopped`, `exited` (all instances ended on
    /// their own with status 0), `failed` (some instance ended otherwise and was not restarted).
    pub state: String,
    /// The `loci deploy` process that supervises the instances (absent for --dry-run).
    pub supervisor_pid: Option<i32>,
    pub restart: String,
    pub max_restarts: u32,
    /// Seconds `stop` waits after SIGTERM before SIGKILL.
    pub grace_s: f64,
    pub notes: Vec<String>,
    pub instances: Vec<InstanceRecord>,
    /// `loci deploy dask`: the scheduler and which instance runs it (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dask: Option<super::dask::DaskInfo>,
}

/// One instance: its placement, command, processes and history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InstanceRecord {
    pub index: usize,
    pub nodes: NodeSet,
    pub cpus: CpuSet,
    /// The `--mem` policy of its `loci run`.
    pub mem: String,
    /// Nodes its pages are expected on (the bound nodes; for first-touch its own nodes; for
    /// interleave every node with memory).
    pub mem_nodes: NodeSet,
    pub nic: Option<String>,
    pub nic_node: Option<u32>,
    pub port: u16,
    pub plan: PlanJson,
    /// The expanded template.
    pub command: Vec<String>,
    /// The full command line it is started with (`loci run ... -- COMMAND`).
    pub run: Vec<String>,
    /// `planned`, `starting`, `running`, `restarting`, `exited`, `failed`, `stopped`.
    pub state: String,
    /// The `loci run` process (the leader of the instance's process group).
    pub runner_pid: Option<i32>,
    /// The program itself (the child of `loci run`).
    pub pid: Option<i32>,
    pub restarts: u32,
    /// The last exit status (128+N for death by signal N).
    pub last_exit: Option<i32>,
    /// The check after the latest start.
    pub verify: Option<Verdict>,
}

/// A running instance checked against its placement: every thread's affinity and last cpu inside
/// the instance's cpus (read from /proc/PID/task/*/status and stat), and its anonymous pages per
/// node (/proc/PID/numa_maps), as `loci run --verify` reads them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Seconds since the instance was started.
    pub at_s: f64,
    pub threads: usize,
    /// Threads whose affinity lies inside the instance's cpus and that last ran there.
    pub threads_on_cpus: usize,
    pub anon_bytes: BTreeMap<u32, u64>,
    /// Share of the anonymous bytes not on `mem_nodes`.
    pub remote_share: f64,
    /// Whether pages count toward `ok`: only under `bind`, where the kernel must keep them there.
    pub pages_checked: bool,
    pub ok: bool,
}

impl Verdict {
    /// Checks process `pid` now; `None` when it is gone.
    pub fn take(pid: i32, rec: &InstanceRecord, at_s: f64) -> Option<Verdict> {
        let s = verify::sample(pid, at_s, true).ok()?;
        if s.tasks.is_empty() {
            return None;
        }
        let on = s
            .tasks
            .iter()
            .filter(|t| t.cpus.is_subset(&rec.cpus) && rec.cpus.contains(t.last_cpu))
            .count();
        let remote_share = verify::remote_share(&s.anon_bytes, &rec.mem_nodes);
        let pages_checked = rec.mem.starts_with("bind");
        Some(Verdict {
            at_s,
            threads: s.tasks.len(),
            threads_on_cpus: on,
            remote_share,
            pages_checked,
            ok: on == s.tasks.len() && (!pages_checked || remote_share == 0.0),
            anon_bytes: s.anon_bytes,
        })
    }

    /// One line: `3/3 threads on cpus 0-3; pages node 0: 12.0 MiB (0.0% remote)`.
    pub fn line(&self, cpus: &CpuSet) -> String {
        let per: Vec<String> = self
            .anon_bytes
            .iter()
            .map(|(n, b)| format!("node {n}: {:.1} MiB", *b as f64 / (1u64 << 20) as f64))
            .collect();
        format!(
            "{}/{} threads on cpus {cpus}; pages {} ({:.1}% not on the expected nodes{}){}",
            self.threads_on_cpus,
            self.threads,
            if per.is_empty() {
                "none".into()
            } else {
                per.join(", ")
            },
            self.remote_share * 100.0,
            if self.pages_checked {
                ""
            } else {
                ", not checked"
            },
            if self.ok { "" } else { " -- NOT AS PLANNED" }
        )
    }
}

impl Manifest {
    pub fn read(path: &Path) -> anyhow::Result<Manifest> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the manifest {}", path.display()))?;
        Manifest::parse(&text).with_context(|| path.display().to_string())
    }

    /// A manifest from its JSON text, with every value `stop` and `status` act on checked.
    pub fn parse(text: &str) -> anyhow::Result<Manifest> {
        let m: Manifest = serde_json::from_str(text)
            .context("not a loci deploy manifest (see docs/deploy.md)")?;
        m.check().context("a damaged or edited manifest")?;
        Ok(m)
    }

    /// The values `stop` and `status` act on are in range: a grace time `Duration` can hold and
    /// process ids that can name one process (0 and 1 would make kill(2) signal loci's own group
    /// or every process).
    fn check(&self) -> anyhow::Result<()> {
        check_grace(self.grace_s).map_err(|e| anyhow::anyhow!("grace_s: {e}"))?;
        let pids = self.supervisor_pid.iter().map(|&p| ("supervisor_pid", p));
        let pids = pids.chain(self.instances.iter().flat_map(|r| {
            [("pid", r.pid), ("runner_pid", r.runner_pid)]
                .into_iter()
                .filter_map(|(k, p)| p.map(|p| (k, p)))
        }));
        for (field, pid) in pids {
            anyhow::ensure!(pid > 1, "{field} = {pid}: a process id must be above 1");
        }
        Ok(())
    }

    /// Writes atomically (a temporary file renamed over it), so readers never see half of it.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    }

    /// Whether the supervisor recorded here is still running.
    pub fn supervisor_alive(&self) -> bool {
        self.supervisor_pid.is_some_and(is_deploy)
    }
}

/// Whether `pid` exists (a zombie counts as gone).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| verify::parse_stat(&s).ok())
        .is_some_and(|s| s.state != 'Z')
}

/// Longest grace time between SIGTERM and SIGKILL, in seconds.
pub const MAX_GRACE_S: f64 = 3600.0;

/// A grace time in seconds: finite, 0 to [`MAX_GRACE_S`].
pub fn check_grace(s: f64) -> Result<f64, String> {
    if (0.0..=MAX_GRACE_S).contains(&s) {
        Ok(s)
    } else {
        let shown = if s.abs() < 1e9 {
            format!("{s}")
        } else {
            format!("{s:e}")
        };
        Err(format!("{shown} seconds is outside 0..={MAX_GRACE_S}"))
    }
}

/// Whether `pgid` is a live `loci run` leading its own process group (what an instance's runner
/// is), not a process that reused the number.
fn is_runner(pgid: i32) -> bool {
    pgid > 1
        && alive(pgid)
        // SAFETY: getpgid(2) has no memory-safety preconditions.
        && unsafe { libc::getpgid(pgid) } == pgid
        && has_arg(pgid, b"run")
}

/// Whether `pid`'s command line has the argument `arg`.
fn has_arg(pid: i32, arg: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == arg))
}

/// Whether `pid` is a live `loci deploy` (not a process that reused the number).
fn is_deploy(pid: i32) -> bool {
    alive(pid) && has_arg(pid, b"deploy")
}

/// Sends `sig` to a process group; false when the group is gone.
pub fn signal_group(pgid: i32, sig: i32) -> bool {
    if pgid <= 1 {
        return false; // kill(0) and kill(-1) would signal loci's own group or every process
    }
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    unsafe { libc::kill(-pgid, sig) == 0 }
}

/// Sends `sig` to one process.
pub fn signal(pid: i32, sig: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Show a deployment: every instance's state, processes, restarts, and a fresh check of where its
/// threads and pages are now.
#[derive(Args, Debug)]
pub struct StatusCmd {
    /// The manifest `loci deploy` wrote (--manifest).
    #[arg(value_name = "MANIFEST")]
    pub manifest: PathBuf,
    /// Print the manifest with each running instance's `verify` taken now.
    #[arg(long)]
    pub json: bool,
}

/// Stop a deployment: SIGTERM to its supervisor, which forwards it to every instance and waits
/// (SIGKILL after the grace time); without a live supervisor, to the instances directly.
#[derive(Args, Debug)]
pub struct StopCmd {
    #[arg(value_name = "MANIFEST")]
    pub manifest: PathBuf,
}

pub fn status(c: StatusCmd) -> anyhow::Result<()> {
    let mut m = Manifest::read(&c.manifest)?;
    let sup = m.supervisor_alive();
    let mut fresh = vec![false; m.instances.len()];
    for (r, fresh) in m.instances.iter_mut().zip(&mut fresh) {
        if let Some(pid) = r.pid.filter(|&p| alive(p)) {
            let at = r.verify.as_ref().map_or(0.0, |v| v.at_s);
            r.verify = Verdict::take(pid, r, at);
            *fresh = r.verify.is_some();
        } else if r.state == "running" {
            r.state = "gone".into();
        }
    }
    if c.json {
        println!("{}", serde_json::to_string_pretty(&m)?);
        return Ok(());
    }
    println!(
        "deploy {} ({} instances), {}; supervisor {}",
        m.design,
        m.instances.len(),
        m.state,
        match (m.supervisor_pid, sup) {
            (Some(p), true) => format!("pid {p}"),
            (Some(p), false) => format!("pid {p} is gone"),
            (None, _) => "none (a dry run)".into(),
        }
    );
    if let Some(d) = &m.dask {
        println!("  {}", d.line(m.instances.len()));
    }
    for (r, fresh) in m.instances.iter().zip(fresh) {
        println!(
            "  instance {}: {}{}, restarts {}, nodes {}, cpus {}, mem {}{}",
            r.index,
            r.state,
            r.pid.map(|p| format!(" pid {p}")).unwrap_or_default(),
            r.restarts,
            r.nodes,
            r.cpus,
            r.mem,
            r.last_exit
                .map(|e| format!(", last exit {e}"))
                .unwrap_or_default()
        );
        if let Some(v) = &r.verify {
            let when = if fresh { "now" } else { "after its last start" };
            println!("    {when}: {}", v.line(&r.cpus));
        }
    }
    Ok(())
}

pub fn stop(c: StopCmd) -> anyhow::Result<()> {
    let m = Manifest::read(&c.manifest)?;
    let grace = Duration::from_secs_f64(m.grace_s);
    if let Some(sup) = m.supervisor_pid.filter(|_| m.supervisor_alive()) {
        signal(sup, libc::SIGTERM);
        let until = Instant::now() + grace + Duration::from_secs(5);
        while alive(sup) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        anyhow::ensure!(
            !alive(sup),
            "the supervisor (pid {sup}) did not exit within the grace time + 5 s"
        );
        let m = Manifest::read(&c.manifest)?;
        println!("stopped: deploy {} is {}", m.design, m.state);
        return Ok(());
    }
    // No supervisor: end the instances' process groups ourselves.
    let mut groups = vec![];
    for g in m.instances.iter().filter_map(|r| r.runner_pid) {
        if is_runner(g) {
            groups.push(g);
        } else if alive(g) {
            eprintln!(
                "loci: runner pid {g} is no longer a `loci run` leading its group: left alone"
            );
        }
    }
    let live: Vec<i32> = groups
        .iter()
        .copied()
        .filter(|&g| signal_group(g, libc::SIGTERM))
        .collect();
    let until = Instant::now() + grace;
    while live.iter().any(|&g| signal_group(g, 0)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &g in &live {
        signal_group(g, libc::SIGKILL);
    }
    let mut m = m;
    m.state = "stopped".into();
    for r in &mut m.instances {
        if !matches!(r.state.as_str(), "exited" | "failed" | "planned") {
            r.state = "stopped".into();
        }
    }
    m.write(&c.manifest)?;
    println!(
        "stopped: the supervisor was gone; {} instance group(s) ended",
        live.len()
    );
    Ok(())
}
