//! Shared by the CLI's end-to-end tests: run the built `loci` binary and other commands, read this
//! process's cpus, watch a deployment's manifest, find the Dask venv, make network namespaces.
// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Runs `loci ARGS` (no backtraces in its stderr): (exited successfully, stdout, stderr).
pub fn loci(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_loci"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Runs `loci ARGS`; it must succeed. Its stdout, parsed as JSON.
pub fn loci_json(args: &[&str]) -> Value {
    let (ok, out, err) = loci(args);
    assert!(ok, "loci {} failed: {err}", args.join(" "));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("loci {}: {e}: {out}", args.join(" ")))
}

/// Runs `loci PREFIX ARGS` (a subcommand and its fixed flags, then the test's own); it must
/// succeed. Its stdout, parsed as JSON.
pub fn loci_json_after(prefix: &[&str], args: &[&str]) -> Value {
    loci_json(&[prefix, args].concat())
}

/// Runs `loci COMMAND --manifest MAN ARGS` (COMMAND: `deploy` or `deploy dask`), which must fail
/// before anything starts: each of `want` in its stderr, no manifest at `man`, no instance's
/// output (`[0] ...`) on stdout or stderr.
pub fn deploy_fails_before_start(command: &[&str], man: &str, args: &[&str], want: &[&str]) {
    let all = [command, &["--manifest", man], args].concat();
    let (ok, out, err) = loci(&all);
    assert!(!ok, "{all:?} succeeded: {out}");
    for w in want {
        assert!(err.contains(w), "{all:?}: `{w}` not in: {err}");
    }
    assert!(
        !Path::new(man).exists() && !out.contains("[0]") && !err.contains("[0]"),
        "{all:?} started something"
    );
}

/// Runs `loci ARGS --json FILE` (FILE in a fresh temporary directory); it must succeed. Returns
/// its stdout and the report it wrote.
pub fn loci_report(args: &[&str]) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let mut all = args.to_vec();
    all.extend(["--json", json.to_str().unwrap()]);
    let (ok, out, err) = loci(&all);
    assert!(ok, "loci {} failed: {out}{err}", args.join(" "));
    let text = std::fs::read_to_string(&json).unwrap();
    (out, serde_json::from_str(&text).unwrap())
}

/// Runs `cmd` to its end: its stdout, or `Err` naming the command and saying why (it did not
/// start, or failed: its status and stderr).
pub fn output_of(cmd: &mut Command) -> Result<Vec<u8>, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs the command `args` (program first); see [`output_of`].
pub fn sh(args: &[&str]) -> Result<(), String> {
    output_of(Command::new(args[0]).args(&args[1..])).map(drop)
}

/// The repository root (crates/cli/../..).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
}

/// The venv's Python once `bench/peers/setup --dask` has installed the Dask set; `None` (with a
/// note) when it cannot be installed here. Installed once per test binary (tests run in parallel,
/// and two pip runs must not share the venv).
pub fn dask_python() -> Option<PathBuf> {
    static PY: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let py = PY.get_or_init(|| {
        let ok = Command::new(repo_root().join("bench/peers/setup"))
            .arg("--dask")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let venv = repo_root().join("bench/peers/.venv/bin");
        (ok && venv.join("dask").is_file()).then(|| venv.join("python"))
    });
    if py.is_none() {
        eprintln!("NOTE: skipped: bench/peers/setup --dask (dask[dataframe], distributed from PyPI) could not install Dask here");
    }
    py.clone()
}

/// Two network namespaces joined by a veth pair, an address on each end and `lo` up in both;
/// deleted on drop. Creating them needs root and iproute2.
pub struct Netns {
    /// The namespaces, `loci{tag}a{pid}` and `loci{tag}b{pid}`.
    pub names: [String; 2],
    /// The veth ends, one in each namespace.
    pub veths: [String; 2],
    /// The ends' addresses, `10.{net}.S.1` and `10.{net}.S.2` (S from the process id).
    pub ips: [String; 2],
}

impl Netns {
    /// `tag` and `net` keep the names and addresses of different users apart.
    pub fn new(tag: &str, net: u8) -> Result<Netns, String> {
        let id = std::process::id() % 10000;
        let sub = 100 + id % 100;
        // Made first, so that what was made is deleted should a step fail.
        let ns = Netns {
            names: [format!("loci{tag}a{id}"), format!("loci{tag}b{id}")],
            veths: [format!("lv{tag}a{id}"), format!("lv{tag}b{id}")],
            ips: [format!("10.{net}.{sub}.1"), format!("10.{net}.{sub}.2")],
        };
        let [va, vb] = &ns.veths;
        for n in &ns.names {
            sh(&["ip", "netns", "add", n])?;
        }
        sh(&["ip", "link", "add", va, "type", "veth", "peer", "name", vb])?;
        for ((n, v), ip) in ns.names.iter().zip(&ns.veths).zip(&ns.ips) {
            let addr = format!("{ip}/24");
            sh(&["ip", "link", "set", v, "netns", n])?;
            sh(&["ip", "-n", n, "addr", "add", &addr, "dev", v])?;
            sh(&["ip", "-n", n, "link", "set", v, "up"])?;
            sh(&["ip", "-n", n, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = sh(&["ip", "netns", "del", n]);
        }
    }
}

/// The cpus this process may use, read from /proc/self/status (not through loci's own code).
pub fn allowed_cpus() -> loci_topo::CpuSet {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap();
    loci_topo::CpuSet::parse(line.split(':').nth(1).unwrap()).unwrap()
}

/// The manifest a running `loci deploy` rewrites as its instances start, verify and restart.
pub struct Manifest {
    pub path: PathBuf,
    /// How long [`Manifest::until`] waits.
    pub wait: Duration,
}

impl Manifest {
    /// The manifest as last written (`Null` before the first write or while it is rewritten).
    pub fn read(&self) -> Value {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Waits until `f` holds for the manifest (`wait` at most), failing the test with `what`.
    pub fn until(&self, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let end = Instant::now() + self.wait;
        loop {
            let m = self.read();
            if f(&m) {
                return m;
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {what}; manifest: {m:#}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The path as a command argument.
    pub fn arg(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

/// Every instance of the manifest passed its placement check.
pub fn all_verified(m: &Value) -> bool {
    m["instances"]
        .as_array()
        .is_some_and(|v| v.iter().all(|i| i["verify"]["ok"] == true))
}

/// Each instance's pid (-1 while it has none).
pub fn pids(m: &Value) -> Vec<i64> {
    m["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["pid"].as_i64().unwrap_or(-1))
        .collect()
}
