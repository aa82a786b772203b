//! Shared by the CLI's end-to-end tests: run the built `loci` binary, read this process's cpus,
//! watch a deployment's manifest.
// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
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
