//! `loci bench tpch` end to end at scale factor 0.01: the data generated into a fresh cache,
//! DuckDB, PostgreSQL and DataFusion started by the harness and answering all 22 queries alike, the
//! allocator knob visible in the PostgreSQL backend's /proc/PID/maps, and clear errors for bad
//! choices. A test skips (with a note saying which) only when a dependency cannot be installed.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod common;
use common::loci;

/// The repository root (crates/cli/../..).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
}

/// Installs what the bench needs (the venv's TPC-H set, PostgreSQL and jemalloc through
/// scripts/install-deps); the dependency that could not be installed, if any.
fn install() -> Option<&'static str> {
    let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
    if !ok(Command::new(root().join("bench/peers/setup")).arg("--tpch")) {
        return Some(
            "bench/peers/setup --tpch (tpchgen-cli, duckdb, datafusion, psycopg from PyPI)",
        );
    }
    let _ = Command::new(root().join("scripts/install-deps")).status();
    let pg = Path::new("/usr/lib/postgresql").exists()
        || ok(Command::new("sh").args(["-c", "command -v postgres && command -v initdb"]));
    if !pg {
        return Some("PostgreSQL (Debian package postgresql, scripts/install-deps)");
    }
    let jemalloc = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ]
    .iter()
    .any(|d| Path::new(d).join("libjemalloc.so.2").exists());
    if !jemalloc {
        return Some("jemalloc (Debian package libjemalloc2, scripts/install-deps)");
    }
    None
}

/// `loci ARGS` with XDG_CACHE_HOME set to `cache`: (success, stdout, stderr).
fn loci_cached(args: &[&str], cache: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_loci"))
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn generates_and_every_engine_answers_all_22_queries_alike_with_knobs_applied() {
    if let Some(dep) = install() {
        eprintln!("NOTE: skipped: {dep} could not be installed here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("tpch.json");
    let (ok, out, err) = loci_cached(
        &[
            "bench",
            "tpch",
            "--quick",
            "--alloc",
            "jemalloc",
            "--thp",
            "off",
            "--json",
            json.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(ok, "{out}\n{err}");
    // Generated once into the cache, complete, with no partial directory left.
    let data = dir.path().join("loci/tpch/sf0.01");
    for t in [
        "region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem",
    ] {
        assert!(data.join(format!("{t}.parquet")).is_file(), "{t} missing");
    }
    assert!(!dir.path().join("loci/tpch/sf0.01.partial").exists());

    let rep: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let answers = rep["params"]["answers"].as_str().unwrap();
    assert!(
        answers.starts_with("22 queries identical across"),
        "{answers}"
    );
    for e in ["duckdb", "postgres", "datafusion"] {
        assert!(answers.contains(&format!("{e} jemalloc")), "{e}: {answers}");
    }
    let rows = rep["results"].as_array().unwrap();
    // 3 engines x 2 configurations (the default and jemalloc/thp off) x (22 queries + geomean).
    assert_eq!(rows.len(), 3 * 2 * 23, "{out}");
    let row = |engine: &str, alloc: &str, case: &str| -> &Value {
        rows.iter()
            .find(|r| {
                r["system"] == engine
                    && r["config"]["alloc"] == alloc
                    && r["case"] == format!("{engine} {case}")
            })
            .unwrap_or_else(|| panic!("no row {engine} {alloc} {case}"))
    };
    let maps = |r: &Value| r["extra"]["maps_allocators"].to_string();
    // The allocator knob reaches the PostgreSQL backend that ran the queries (its maps).
    let pg = row("postgres", "jemalloc", "q18");
    assert!(maps(pg).contains("libjemalloc.so.2"), "{pg}");
    assert_eq!(pg["extra"]["allocator_preloaded"], true);
    assert_eq!(maps(row("postgres", "glibc", "q18")), "[]");
    // THP off reaches the engine process where the kernel reports it.
    if !pg["extra"]["thp_enabled"].is_null() {
        assert_eq!(pg["extra"]["thp_enabled"], "0", "{pg}");
    }
    // Embedded engines: the preloaded jemalloc is mapped, and the allocator linked into the
    // engine's module (which its own allocations use) is reported.
    for (engine, own) in [("duckdb", "jemalloc"), ("datafusion", "mimalloc")] {
        let r = row(engine, "jemalloc", "q01");
        assert!(maps(r).contains("libjemalloc.so.2"), "{r}");
        let linked = r["extra"]["own_allocator"].as_str().unwrap_or("");
        assert!(linked.contains(own), "{r}");
    }
    // The summary gives each configuration's geometric mean against the engine's default.
    assert!(
        out.contains("tpch postgres glibc/first-touch/default/os: geomean"),
        "{out}"
    );
    assert!(out.contains("1.000x default"), "{out}");
    assert!(
        row("duckdb", "glibc", "geomean")["median_s"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // Two configurations: the search line names the fastest against the default.
    assert!(
        out.contains("tpch postgres search: the fastest of 1 configurations"),
        "{out}"
    );

    // PostgreSQL's loaded cluster is reused by the next invocation on the same tables (in this
    // test, so no other test's tables replace it in between), and --reload loads it anew.
    let again = |extra: &[&str]| {
        let mut a = vec![
            "bench",
            "tpch",
            "--quick",
            "--engines",
            "postgres",
            "--queries",
            "6",
        ];
        a.extend(extra);
        let (ok, out, err) = loci_cached(&a, dir.path());
        assert!(ok, "{out}\n{err}");
        err
    };
    let err = again(&[]);
    assert!(err.contains("reusing the loaded cluster"), "{err}");
    assert!(!err.contains("loading PostgreSQL"), "{err}");
    let err = again(&["--reload"]);
    assert!(
        err.contains("loading PostgreSQL") && !err.contains("reusing"),
        "{err}"
    );
}

#[test]
fn bad_choices_are_named_with_the_valid_ones() {
    for (args, want) in [
        ("--sf 3", "valid: [\"0.01\", \"0.1\", \"1\", \"10\"]"),
        ("--queries 1,23", "'23' is not a TPC-H query"),
        ("--engines duckdb,mysql", "--engines mysql: unknown"),
        (
            "--alloc glibc,hoard",
            "--alloc hoard: unknown; valid: glibc, jemalloc",
        ),
        (
            "--thp maybe",
            "--thp maybe: unknown; valid: default, on, off",
        ),
        ("--threads nowhere", "--threads nowhere"),
    ] {
        let mut all = vec!["bench", "tpch"];
        all.extend(args.split_whitespace());
        let (ok, _, err) = loci(&all);
        assert!(!ok, "{args}");
        assert!(err.contains(want), "{args}: {err}");
    }
}

/// A result row of the shape `loci bench tpch --json` writes (without the engine's facts).
fn row(alloc: &str, case: &str, times: &[f64]) -> Value {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    serde_json::json!({
        "system": "postgres", "case": case, "times_s": times,
        "median_s": sorted[times.len() / 2], "min_s": sorted[0], "max_s": sorted[times.len() - 1],
        "config": {"alloc": alloc, "mem": "first-touch", "thp": "default", "threads": "os"},
        "extra": {"rounds": (0..times.len()).collect::<Vec<_>>()},
    })
}

#[test]
fn summary_reprints_a_saved_result_and_refuses_another_bench() {
    let dir = tempfile::tempdir().unwrap();
    // Five rounds drifting 20%; jemalloc 5% faster than the default in each.
    let base = [1.0, 1.05, 1.1, 1.15, 1.2];
    let fast: Vec<f64> = base.iter().map(|t| 0.95 * t).collect();
    let result = |workload: &str| {
        serde_json::json!({
            "workload": workload,
            "params": {"answers": "22 queries identical"},
            "machine": {"nodes": 1, "cpus": 2},
            "results": [
                row("glibc", "postgres geomean", &base),
                row("jemalloc", "postgres geomean", &fast),
            ],
        })
    };
    let saved = dir.path().join("tpch.json");
    std::fs::write(&saved, result("tpch").to_string()).unwrap();
    let (ok, out, err) = loci(&["bench", "tpch", "--summary", saved.to_str().unwrap()]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("tpch postgres search"), "{out}");
    let g = out.lines().find(|l| l.contains("geomean  ")).unwrap();
    assert!(
        g.contains("0.950x") && g.contains("faster beyond noise"),
        "{out}"
    );
    assert!(out.contains("tpch answers: 22 queries identical"), "{out}");

    let other = dir.path().join("w1.json");
    std::fs::write(&other, result("w1").to_string()).unwrap();
    let (ok, _, err) = loci(&["bench", "tpch", "--summary", other.to_str().unwrap()]);
    assert!(
        !ok && err.contains("w1.json: a result of `loci bench w1`, not of tpch"),
        "{err}"
    );
    std::fs::write(&other, "[1, 2]").unwrap();
    let (ok, _, err) = loci(&["bench", "tpch", "--summary", other.to_str().unwrap()]);
    assert!(!ok && err.contains("not a loci bench result"), "{err}");
    let (ok, _, err) = loci(&["bench", "tpch", "--summary", "x.json", "--sf", "1"]);
    assert!(!ok && err.contains("--sf"), "{err}");
}
