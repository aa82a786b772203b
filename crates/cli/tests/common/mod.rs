//! Shared by the CLI's end-to-end tests: run the built `loci` binary.

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
