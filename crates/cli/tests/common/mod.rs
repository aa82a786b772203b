//! Shared by the CLI's end-to-end tests: run the built `loci` binary, read this process's cpus.
// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::process::Command;

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
