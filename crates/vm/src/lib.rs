//! loci-vm: prove placement claims on real multi-node Linux kernels from any crate's tests.
//!
//! Our development and CI machines have one NUMA node. This crate runs a host-built program inside a QEMU VM whose
//! firmware describes 2..8 NUMA nodes (CPU-less and memoryless nodes included) through `scripts/numa-vm`, and hands
//! back the program's stdout, stderr and exit status. Inside the VM, `mbind`, `set_mempolicy`, `move_pages`,
//! `sched_setaffinity` and sysfs answer exactly as on multi-socket hardware. Timing inside means nothing (the CPU is
//! emulated); placement facts are real.
//!
//! # Switching VM tests on
//! VM tests run when `LOCI_NUMA_VM=1` (what `scripts/test` sets). Then a VM that cannot start FAILS the test, with
//! the reason and the VM console. Without the variable, [`vm_tests_enabled`] prints a note and tests return early,
//! so `cargo test` stays fast and needs no QEMU.
//!
//! # Writing a VM test (any crate)
//! Boots cost seconds, so batch: one boot per topology runs a small check program that prints one
//! [`checks`] line per fact it verified, and the test turns those lines into a per-topology report.
//! A library's check program and its test live in `crates/vm-checks` (`src/bin/`, `tests/vm/`), which depends on
//! loci-vm normally and so prints with [`Checker`]; the library itself does not depend on loci-vm.
//!
//! ```no_run
//! // crates/vm-checks/tests/vm/yourcrate.rs   (a `mod` of tests/vm/main.rs)
//! #[test]
//! fn my_placement_on_4_nodes() {
//!     if !loci_vm::vm_tests_enabled() {
//!         return; // prints "skipped: set LOCI_NUMA_VM=1 ..."
//!     }
//!     // A binary of this package (Cargo builds it for integration tests) or any workspace
//!     // binary in target/<profile> via loci_vm::target_bin("loci").
//!     let check = env!("CARGO_BIN_EXE_loci-vm-check");
//!     let out = loci_vm::NumaVm::new("4n")
//!         .run(check, &["mem"])
//!         .unwrap_or_else(|e| panic!("{e}")); // the VM did not start: a failed test
//!     out.checks().print_and_assert(); // report "VM 4n: 12 checks, 12 passed, 0 failed"
//! }
//! ```
//! The check program prints its facts with [`checks::Checker`] (or plain `LOCI-CHECK ok NAME` /
//! `LOCI-CHECK FAIL NAME -- DETAIL` lines, from any language or a shell script). For a single fact, just look at
//! [`VmOutput::stdout`] and [`VmOutput::status`].
//!
//! Inside the VM the host root is mounted read-only at the same paths (so host binaries and their libraries just
//! work), `/tmp` is a fresh tmpfs, and `$LOCI_VM_SHARE` is a writable directory shared with the host for the run.
//!
//! Topologies: `2n`, `4n`, `8n`, `asym`, `cpuless`, `memless` (see `scripts/numa-vm --help`) or
//! [`VmTopology::Custom`].

pub mod checks;

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use checks::{CheckReport, Checker};

/// The environment variable that switches VM tests on (`1`) and makes a VM that cannot start a test failure.
pub const ENV_ENABLE: &str = "LOCI_NUMA_VM";

/// The preset topology names of `scripts/numa-vm`.
pub const PRESETS: &[&str] = &["2n", "4n", "8n", "asym", "cpuless", "memless"];

/// Whether VM tests should run: true when `LOCI_NUMA_VM=1`. When false, prints a one-line note (to stderr, so it
/// shows with `--nocapture`) naming the calling test's module, and the test should return.
#[track_caller]
pub fn vm_tests_enabled() -> bool {
    match std::env::var(ENV_ENABLE) {
        Ok(v) if v == "1" => true,
        Ok(v) if v.is_empty() || v == "0" => {
            note_skip();
            false
        }
        Ok(v) => {
            panic!("{ENV_ENABLE}={v:?}: use 1 to run the NUMA VM tests, or unset it to skip them")
        }
        Err(_) => {
            note_skip();
            false
        }
    }
}

#[track_caller]
fn note_skip() {
    let at = std::panic::Location::caller();
    eprintln!(
        "note: NUMA VM test at {}:{} skipped: set {ENV_ENABLE}=1 to run it (scripts/test does)",
        at.file(),
        at.line()
    );
}

/// Which topology a VM gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmTopology {
    /// One of [`PRESETS`].
    Preset(String),
    /// Any shape: `cpus[i]` cpus (0 = CPU-less) and `mem[i]` memory (`"512M"`, `"1G"`, `"0"` = memoryless) on
    /// node i; `dist` is `scripts/numa-vm --dist` syntax (rows separated by `/`, e.g. `"10,20/20,10"`, or one
    /// remote value), `None` = 20 between every pair.
    Custom {
        cpus: Vec<u32>,
        mem: Vec<String>,
        dist: Option<String>,
    },
}

impl From<&str> for VmTopology {
    fn from(s: &str) -> Self {
        VmTopology::Preset(s.to_string())
    }
}

impl From<String> for VmTopology {
    fn from(s: String) -> Self {
        VmTopology::Preset(s)
    }
}

impl fmt::Display for VmTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VmTopology::Preset(p) => f.write_str(p),
            VmTopology::Custom { cpus, mem, dist } => {
                let c: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
                write!(f, "custom(cpus {}, mem {}", c.join(","), mem.join(","))?;
                if let Some(d) = dist {
                    write!(f, ", dist {d}")?;
                }
                f.write_str(")")
            }
        }
    }
}

impl VmTopology {
    fn args(&self) -> Vec<String> {
        match self {
            VmTopology::Preset(p) => vec!["--topology".into(), p.clone()],
            VmTopology::Custom { cpus, mem, dist } => {
                let c: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
                let mut a = vec![
                    "--nodes".into(),
                    cpus.len().to_string(),
                    "--cpus".into(),
                    c.join(","),
                    "--mem".into(),
                    mem.join(","),
                ];
                if let Some(d) = dist {
                    a.push("--dist".into());
                    a.push(d.clone());
                }
                a
            }
        }
    }
}

/// The configuration a VM was given, as `scripts/numa-vm --describe` prints it: what tests compare against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmConfig {
    /// Preset name, or `custom`.
    pub name: String,
    /// Nodes in id order (ids are 0..n).
    pub nodes: Vec<VmNode>,
    /// SLIT matrix in node order.
    pub distances: Vec<Vec<u32>>,
}

/// One node of a [`VmConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmNode {
    pub id: u32,
    /// Cpu list (`"0-1"`, `""` for a CPU-less node).
    pub cpus: String,
    /// Memory in MiB (0 = memoryless).
    pub mem_mib: u64,
}

impl VmConfig {
    /// Cpus of node `id` (empty when CPU-less or unknown).
    pub fn node_cpus(&self, id: u32) -> loci_topo::CpuSet {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .and_then(|n| loci_topo::CpuSet::parse(&n.cpus).ok())
            .unwrap_or_default()
    }

    /// Total number of cpus.
    pub fn cpu_count(&self) -> usize {
        self.nodes.iter().map(|n| self.node_cpus(n.id).len()).sum()
    }
}

/// What a program run inside a VM left behind.
#[derive(Debug, Clone)]
pub struct VmOutput {
    /// The topology the VM had.
    pub topology: String,
    /// The program's stdout, exactly (lossy UTF-8).
    pub stdout: String,
    /// The program's stderr, exactly (lossy UTF-8); never mixed with the kernel console.
    pub stderr: String,
    /// The program's exit status (128+N when killed by signal N).
    pub status: i32,
    /// The VM's kernel console (for diagnosis).
    pub console: String,
    /// Wall time from starting QEMU to power-off.
    pub elapsed: Duration,
}

impl VmOutput {
    /// Exit status 0.
    pub fn success(&self) -> bool {
        self.status == 0
    }

    /// The `LOCI-CHECK` lines of stdout as a report (see [`checks`]).
    pub fn checks(&self) -> CheckReport {
        CheckReport::parse(&self.topology, &self.stdout, self.status, &self.stderr)
            .with_elapsed(self.elapsed)
    }

    /// Panics (with stdout, stderr and the console tail) unless the program exited 0; returns self otherwise.
    #[track_caller]
    pub fn expect_success(self) -> Self {
        if !self.success() {
            panic!(
                "program in VM {} exited {}\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- console tail ---\n{}",
                self.topology,
                self.status,
                self.stdout,
                self.stderr,
                tail(&self.console, 20)
            );
        }
        self
    }
}

/// Why a VM run produced no program result.
#[derive(Debug)]
pub enum VmError {
    /// `scripts/numa-vm` is not where we looked.
    NoScript(PathBuf),
    /// A program or binary to run does not exist.
    NoProgram(String),
    /// The harness could not be spawned.
    Spawn(std::io::Error),
    /// The VM ran past its timeout and was killed.
    Timeout {
        topology: String,
        seconds: u64,
        message: String,
        console: String,
    },
    /// The VM did not start, did not reach the program, or the harness refused (bad topology, missing packages).
    NotStarted {
        topology: String,
        exit: Option<i32>,
        message: String,
        console: String,
    },
    /// `--describe` printed something we could not read.
    Describe(String),
}

impl fmt::Display for VmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VmError::NoScript(p) => write!(f, "NUMA VM harness not found at {}", p.display()),
            VmError::NoProgram(m) => f.write_str(m),
            VmError::Spawn(e) => write!(f, "could not run scripts/numa-vm: {e}"),
            VmError::Timeout {
                topology,
                seconds,
                message,
                console,
            } => write!(
                f,
                "NUMA VM {topology}: timed out after {seconds} s\n{message}\n--- console tail ---\n{}",
                tail(console, 25)
            ),
            VmError::NotStarted {
                topology,
                exit,
                message,
                console,
            } => write!(
                f,
                "NUMA VM {topology} could not run the program (harness exit {}):\n{message}\n--- console tail ---\n{}",
                exit.map(|e| e.to_string()).unwrap_or_else(|| "by signal".into()),
                tail(console, 25)
            ),
            VmError::Describe(m) => write!(f, "scripts/numa-vm --describe: {m}"),
        }
    }
}

impl std::error::Error for VmError {}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The workspace root (where `Cargo.toml`, `scripts/` and `target/` live).
pub fn workspace_root() -> PathBuf {
    // crates/vm -> the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Path of `scripts/numa-vm` (override with `LOCI_NUMA_VM_SCRIPT`).
pub fn script_path() -> PathBuf {
    std::env::var_os("LOCI_NUMA_VM_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("scripts/numa-vm"))
}

/// A binary of the workspace built in the same profile as the running test (`target/release/NAME` under
/// `cargo test --release`), found from the test executable's own path, so `CARGO_TARGET_DIR` is honoured.
/// Errors (naming the build command) when it has not been built.
pub fn target_bin(name: &str) -> Result<PathBuf, VmError> {
    let exe = std::env::current_exe().map_err(VmError::Spawn)?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name() == Some(OsStr::new("deps")) {
        dir.pop();
    }
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(VmError::NoProgram(format!(
            "{} is not built; run `cargo build --workspace --release` (or without --release for a debug test run) first",
            p.display()
        )))
    }
}

/// A VM to run programs in. Cheap to build; every [`NumaVm::run`] boots a fresh VM (a few seconds).
#[derive(Debug, Clone)]
pub struct NumaVm {
    topology: VmTopology,
    timeout: Duration,
    env: Vec<(String, String)>,
    mem_per_node: Option<String>,
    autonuma: bool,
    kmods: Vec<String>,
}

impl NumaVm {
    /// A VM of this topology (a preset name such as `"2n"`, or a [`VmTopology::Custom`]), 180 s timeout.
    pub fn new(topology: impl Into<VmTopology>) -> Self {
        NumaVm {
            topology: topology.into(),
            timeout: Duration::from_secs(180),
            env: Vec::new(),
            mem_per_node: None,
            autonuma: false,
            kmods: Vec::new(),
        }
    }

    /// Kill the VM (and fail with [`VmError::Timeout`]) after this long.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Set an environment variable for the program inside.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Override the memory of every node that has memory (`"1G"`).
    pub fn mem_per_node(mut self, size: &str) -> Self {
        self.mem_per_node = Some(size.into());
        self
    }

    /// Boot with automatic NUMA balancing on (the kernel's default). Off by default in the VM: it migrates pages
    /// behind a check's back, and while it scans, `move_pages` reports `-EFAULT` for resident pages.
    pub fn autonuma(mut self, on: bool) -> Self {
        self.autonuma = on;
        self
    }

    /// Load this module of the VM's kernel (and what it depends on) before the program starts, e.g. `"sch_netem"`
    /// and `"veth"` for `tc netem` across a veth pair (`scripts/numa-vm --kmod`). The modules come from the cached
    /// Debian kernel package, so they match the VM's kernel whatever the host runs.
    pub fn kernel_module(mut self, name: &str) -> Self {
        self.kmods.push(name.into());
        self
    }

    /// The topology.
    pub fn topology(&self) -> &VmTopology {
        &self.topology
    }

    fn base_cmd(&self) -> Result<Command, VmError> {
        let script = script_path();
        if !script.is_file() {
            return Err(VmError::NoScript(script));
        }
        let mut c = Command::new(script);
        c.args(self.topology.args());
        if let Some(m) = &self.mem_per_node {
            c.args(["--mem-per-node", m]);
        }
        Ok(c)
    }

    /// The configuration the VM will have (nodes, cpus, memory, distances), without booting it.
    pub fn config(&self) -> Result<VmConfig, VmError> {
        let out = self
            .base_cmd()?
            .arg("--describe")
            .output()
            .map_err(VmError::Spawn)?;
        if !out.status.success() {
            return Err(VmError::Describe(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| VmError::Describe(e.to_string()))
    }

    /// Boots the VM, runs `program args...` inside (cwd and paths as on the host), powers off, and returns what it
    /// printed and its exit status. A nonzero exit status is NOT an error here: look at [`VmOutput::status`].
    pub fn run<S: AsRef<OsStr>>(
        &self,
        program: impl AsRef<Path>,
        args: &[S],
    ) -> Result<VmOutput, VmError> {
        let program = program.as_ref();
        if program.components().count() > 1 && !program.exists() {
            return Err(VmError::NoProgram(format!(
                "program {} does not exist",
                program.display()
            )));
        }
        let dir = tempdir()?;
        let mut c = self.base_cmd()?;
        c.args(["--timeout", &self.timeout.as_secs().max(1).to_string()]);
        c.arg("--out-dir").arg(&dir.0).arg("--quiet-output");
        c.args(["--autonuma", if self.autonuma { "on" } else { "off" }]);
        for (k, v) in &self.env {
            c.arg("--env").arg(format!("{k}={v}"));
        }
        for m in &self.kmods {
            c.args(["--kmod", m]);
        }
        c.arg("--").arg(program).args(args);
        let out = c.output().map_err(VmError::Spawn)?;
        let read = |f: &str| {
            std::fs::read(dir.0.join(f))
                .ok()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        let console = read("console.log").unwrap_or_default();
        let topology = self.topology.to_string();
        let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
        match read("status") {
            Some(s) => {
                let status = s.trim().parse::<i32>().map_err(|_| VmError::NotStarted {
                    topology: topology.clone(),
                    exit: out.status.code(),
                    message: format!("unreadable exit status {s:?}"),
                    console: console.clone(),
                })?;
                let elapsed = read("elapsed")
                    .and_then(|e| e.trim().parse::<f64>().ok())
                    .and_then(|e| Duration::try_from_secs_f64(e).ok())
                    .unwrap_or_default();
                Ok(VmOutput {
                    topology,
                    stdout: read("stdout").unwrap_or_default(),
                    stderr: read("stderr").unwrap_or_default(),
                    status,
                    console,
                    elapsed,
                })
            }
            None if out.status.code() == Some(124) => Err(VmError::Timeout {
                topology,
                seconds: self.timeout.as_secs(),
                message,
                console,
            }),
            None => Err(VmError::NotStarted {
                topology,
                exit: out.status.code(),
                message,
                console,
            }),
        }
    }
}

/// Boots a VM of `topology`, runs `program args...`, returns its output: [`NumaVm::run`] with defaults.
pub fn run_in_vm<S: AsRef<OsStr>>(
    topology: impl Into<VmTopology>,
    program: impl AsRef<Path>,
    args: &[S],
) -> Result<VmOutput, VmError> {
    NumaVm::new(topology).run(program, args)
}

/// A temporary directory removed on drop (std has none; one directory is not worth a dependency).
struct TempDir(PathBuf);

fn tempdir() -> Result<TempDir, VmError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir();
    for _ in 0..100 {
        let p = base.join(format!(
            "loci-vm-out.{}.{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(TempDir(p)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(VmError::Spawn(e)),
        }
    }
    Err(VmError::Spawn(std::io::Error::other(
        "could not create a temporary directory",
    )))
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_topology_becomes_script_arguments() {
        let t = VmTopology::Custom {
            cpus: vec![2, 1, 0],
            mem: vec!["512M".into(), "256M".into(), "256M".into()],
            dist: Some("10,20,30/20,10,30/30,30,10".into()),
        };
        assert_eq!(
            t.args(),
            [
                "--nodes",
                "3",
                "--cpus",
                "2,1,0",
                "--mem",
                "512M,256M,256M",
                "--dist",
                "10,20,30/20,10,30/30,30,10"
            ]
        );
        assert_eq!(
            t.to_string(),
            "custom(cpus 2,1,0, mem 512M,256M,256M, dist 10,20,30/20,10,30/30,30,10)"
        );
        assert_eq!(VmTopology::from("8n").args(), ["--topology", "8n"]);
    }

    #[test]
    fn describe_matches_the_documented_presets() {
        // Runs the script's --describe only (no VM): the harness and these expectations must agree.
        let c = NumaVm::new("8n").config().unwrap();
        assert_eq!(c.nodes.len(), 8);
        assert_eq!(c.cpu_count(), 8);
        // Twisted ladder: 11 links, diameter 3 hops; SLIT 10 + 6 * hops.
        let mut by_value = std::collections::BTreeMap::new();
        for i in 0..8 {
            for j in (i + 1)..8 {
                *by_value.entry(c.distances[i][j]).or_insert(0) += 1;
                assert_eq!(c.distances[i][j], c.distances[j][i]);
            }
        }
        assert_eq!(
            by_value.into_iter().collect::<Vec<_>>(),
            [(16, 11), (22, 14), (28, 3)]
        );
        let m = NumaVm::new("memless").config().unwrap();
        assert_eq!(m.nodes[1].mem_mib, 0);
        assert_eq!(m.node_cpus(1).len(), 2);
        let c = NumaVm::new("cpuless").config().unwrap();
        assert!(c.node_cpus(2).is_empty());
        assert!(c.nodes[2].mem_mib > 0);
        let e = NumaVm::new("9n").config().unwrap_err().to_string();
        assert!(
            e.contains("unknown topology '9n'") && e.contains("2n 4n 8n"),
            "{e}"
        );
        let e = NumaVm::new(VmTopology::Custom {
            cpus: vec![1, 1],
            mem: vec!["256M".into()],
            dist: None,
        })
        .config()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--mem '256M' has 1 entries, --nodes is 2"),
            "{e}"
        );
    }

    #[test]
    fn target_bin_names_the_build_command_when_missing() {
        let e = target_bin("no-such-binary-xyz").unwrap_err().to_string();
        assert!(e.contains("cargo build --workspace --release"), "{e}");
    }
}
