//! An allocator other than glibc: the whole matrix in a child process of this binary under
//! `LD_PRELOAD` of the allocator's library.

use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use loci_report::{Report, Row};

use super::{EngineArgs, Workload, CHILD_ENV};
use crate::bench::common::{allocator, find_system_lib};

/// Runs the matrix of one allocator in a child process under LD_PRELOAD and returns its rows.
pub(super) fn run_child(w: Workload, a: &EngineArgs, alloc: &str) -> anyhow::Result<Vec<Row>> {
    let al = allocator(alloc).expect("checked");
    let file = al.lib.expect("checked: a preloaded allocator");
    let Some(lib) = find_system_lib(file) else {
        bail!(
            "allocator {alloc}: {file} is not installed (Debian package {}; scripts/install-deps installs it)",
            al.package
        );
    };
    let out = std::env::temp_dir().join(format!("loci-bench-{}-{alloc}.json", std::process::id()));
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("bench").arg(w.name());
    if a.common.quick {
        cmd.arg("--quick");
    }
    if let Some(r) = a.common.reps {
        cmd.arg("--reps").arg(r.to_string());
    }
    if let Some(r) = a.rows {
        cmd.arg("--rows").arg(r.to_string());
    }
    if let Some(g) = a.groups {
        cmd.arg("--groups").arg(g.to_string());
    }
    if let Some(n) = a.workers {
        cmd.arg("--workers").arg(n.to_string());
    }
    cmd.arg("--dist").arg(a.dist.join(","));
    cmd.arg("--keys").arg(a.keys.join(","));
    cmd.arg("--values").arg(a.values.join(","));
    cmd.arg("--threads").arg(a.matrix.threads.join(","));
    cmd.arg("--mem").arg(a.matrix.mem.join(","));
    cmd.arg("--gen").arg(a.gen.join(","));
    cmd.arg("--sched").arg(a.sched.join(","));
    cmd.arg("--locality").arg(&a.locality);
    if !a.variant.is_empty() {
        cmd.arg("--variant").arg(a.variant.join(","));
    }
    cmd.arg("--seed").arg(a.seed.to_string());
    cmd.arg("--morsel-rows").arg(a.morsel_rows.to_string());
    cmd.arg("--json").arg(&out);
    cmd.env("LD_PRELOAD", lib).env(CHILD_ENV, alloc);
    cmd.stdout(Stdio::null());
    let st = cmd
        .status()
        .context("starting the allocator child process")?;
    if !st.success() {
        bail!("the bench under {alloc} failed ({st})");
    }
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    let rep: Report = serde_json::from_str(&text)?;
    Ok(rep.results)
}
