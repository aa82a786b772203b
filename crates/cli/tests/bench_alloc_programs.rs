//! `loci bench alloc --programs` end to end: every program under every allocator installed here
//! gives the same digest, every row is present and the JSON report parses; a preload the dynamic
//! linker ignores is reported as such; a program that crashes under an allocator is reported as
//! a failure, not timed; bad choices get errors naming the valid ones. A program is skipped
//! (with a printed note) only when its tool is not installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod common;
use common::{loci, loci_report};

/// The directory holding the built `loci` (target/release), where libloci_malloc.so belongs.
fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_loci"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn on_path(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The names of `choices` (name, what it needs) whose need is `present`; a note for each other.
fn installed<'a>(choices: &[(&'a str, &str)], present: impl Fn(&str) -> bool) -> Vec<&'a str> {
    let mut v = Vec::new();
    for &(name, need) in choices {
        if present(need) {
            v.push(name);
        } else {
            println!("note: {need} not installed (scripts/install-deps): {name} not checked");
        }
    }
    v
}

/// libloci_malloc.so next to `loci`, built when absent (the bench would skip the loci column).
fn ensure_loci_lib() {
    if bin_dir().join("libloci_malloc.so").exists() {
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "--release", "-p", "loci-alloc-preload"])
        .status()
        .unwrap();
    assert!(st.success(), "building loci-alloc-preload failed");
}

/// The allocators whose library is installed here (glibc always; loci once built).
fn available_allocators() -> Vec<&'static str> {
    let dirs = [
        format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH),
        format!("/lib/{}-linux-gnu", std::env::consts::ARCH),
        "/usr/lib64".into(),
        "/usr/lib".into(),
        "/usr/local/lib".into(),
    ];
    let found = |f: &str| dirs.iter().any(|d| Path::new(d).join(f).exists());
    let preloads = [
        ("jemalloc", "libjemalloc.so.2"),
        ("tcmalloc", "libtcmalloc_minimal.so.4"),
        ("tbbmalloc", "libtbbmalloc_proxy.so.2"),
        ("mimalloc", "libmimalloc.so.2"),
    ];
    let mut v = vec!["glibc"];
    v.extend(installed(&preloads, found));
    v.push("loci");
    v
}

/// Whether the TPC-H venv can run DuckDB (else duckdb-tpch is skipped by the bench).
fn duckdb_venv() -> bool {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/peers/.venv/bin/python");
    Command::new(py)
        .args(["-c", "import duckdb"])
        .output()
        .is_ok_and(|o| o.status.success())
        && Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../bench/peers/.venv/bin/tpchgen-cli")
            .exists()
}

#[test]
fn every_program_gives_the_same_answer_under_every_allocator() {
    ensure_loci_lib();
    let tools = [
        ("sqlite3", "sqlite3"),
        ("python3", "python3"),
        ("cxx", "g++"),
    ];
    let mut programs = installed(&tools, on_path);
    if duckdb_venv() {
        programs.push("duckdb-tpch");
    } else {
        println!("note: bench/peers/.venv lacks duckdb or tpchgen-cli (bench/peers/setup --tpch): duckdb-tpch not checked");
    }
    if programs.is_empty() {
        println!(
            "note: none of sqlite3, python3, g++, the DuckDB venv is installed: nothing to run"
        );
        return;
    }
    let list = programs.join(",");
    let (out, rep) = quick_programs(&["--program", &list]);
    assert_eq!(rep["workload"], "alloc");
    assert_eq!(
        rep["params"]["failures"].as_object().map(|o| o.len()),
        Some(0),
        "failures: {}",
        rep["params"]["failures"]
    );
    let rows = rep["results"].as_array().unwrap();
    for p in &programs {
        assert!(
            rep["params"]["programs"].get(p).is_some(),
            "{p} not run: {}",
            rep["params"]
        );
        let mut digests = Vec::new();
        for al in available_allocators() {
            let row = rows
                .iter()
                .find(|r| r["case"] == *p && r["system"] == al)
                .unwrap_or_else(|| panic!("no row for {p} under {al}"));
            assert!(row["median_s"].as_f64().unwrap() > 0.0);
            assert!(row["rss_bytes"].as_u64().unwrap() > 1 << 20, "{p} {al}");
            // The dynamic linker bound malloc to the preloaded library (glibc: libc).
            assert_eq!(
                row["extra"]["preload_honoured"], true,
                "{p} under {al}: {}",
                row["extra"]
            );
            digests.push(row["extra"]["digest"].as_str().unwrap().to_string());
        }
        assert!(
            digests.iter().all(|d| *d == digests[0]),
            "{p}: digests differ: {digests:?}"
        );
        assert!(out.contains(&format!("{p}: loci time ")), "{out}");
        assert!(out.contains(&format!("{p} preload: ")), "{out}");
        assert!(
            out.contains(&format!("{p} CPU seconds (median): loci ")),
            "{out}"
        );
    }
    if programs.contains(&"duckdb-tpch") {
        // tpch.py reports the allocator compiled into DuckDB's module, if any; the goals say it.
        let row = rows.iter().find(|r| r["case"] == "duckdb-tpch").unwrap();
        if let Some(own) = row["extra"]["own_allocator"].as_str() {
            assert!(
                out.contains(&format!("links its own allocator ({own})")),
                "{out}"
            );
        }
    }
}

/// `loci bench alloc --programs --quick --reps 1 ARGS`: its stdout and its JSON report.
fn quick_programs(args: &[&str]) -> (String, Value) {
    let mut all = vec!["bench", "alloc", "--programs", "--quick", "--reps", "1"];
    all.extend_from_slice(args);
    loci_report(&all)
}

/// [`quick_programs`] of sqlite3 alone, on glibc and on `lib` as loci's library.
fn sqlite3_glibc_and(lib: &Path) -> (String, Value) {
    let lib = lib.to_str().unwrap();
    quick_programs(&[
        "--program",
        "sqlite3",
        "--peers",
        "glibc,loci",
        "--loci-lib",
        lib,
    ])
}

#[test]
fn an_ignored_preload_and_a_crash_are_reported() {
    if !on_path("sqlite3") || !on_path("cc") {
        println!("note: sqlite3 or cc not installed: not checked");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Not a shared object: the dynamic linker ignores it and sqlite3 runs on glibc's malloc.
    let bogus = dir.path().join("bogus.so");
    std::fs::write(&bogus, "not an ELF file\n").unwrap();
    let (out, _) = sqlite3_glibc_and(&bogus);
    assert!(
        out.contains("malloc does NOT bind to the preloaded library under loci"),
        "{out}"
    );
    // A malloc that aborts: the run is a failure with its signal, and has no row.
    let src = dir.path().join("abort.c");
    std::fs::write(
        &src,
        "#include <stdlib.h>\n#include <stddef.h>\nvoid *malloc(size_t n) { (void)n; abort(); }\n",
    )
    .unwrap();
    let lib = dir.path().join("libabort.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    let (out, rep) = sqlite3_glibc_and(&lib);
    assert!(
        out.contains("FAILED sqlite3 loci: crashed: killed by signal 6"),
        "{out}"
    );
    let rows = rep["results"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["system"] == "glibc"));
    assert!(!rows.iter().any(|r| r["system"] == "loci"));
}

#[test]
fn bad_choices_name_the_valid_ones() {
    let (ok, _, err) = loci(&["bench", "alloc", "--programs", "--program", "nosuch"]);
    assert!(!ok);
    assert!(
        err.contains("--program nosuch: unknown; valid: sqlite3, python3, cxx, duckdb-tpch"),
        "{err}"
    );
    let (ok, _, err) = loci(&["bench", "alloc", "--programs", "--sf", "7"]);
    assert!(!ok);
    assert!(err.contains("--sf 7") && err.contains("0.01"), "{err}");
    let (ok, _, err) = loci(&["bench", "alloc", "--programs", "--peers", "nosuch"]);
    assert!(!ok);
    assert!(err.contains("unknown allocator \"nosuch\""), "{err}");
    // --sf and --program mean nothing without --programs.
    let (ok, _, err) = loci(&["bench", "alloc", "--sf", "0.1"]);
    assert!(!ok);
    assert!(err.contains("--programs"), "{err}");
    let (ok, out, _) = loci(&["bench", "alloc", "--help"]);
    assert!(ok && out.contains("--programs") && out.contains("sqlite3"));
}
