//! `loci bench subarray` end to end at a tiny size: every case and strategy gives a row with the
//! same result checksum, adaptive strategies report their trials, and bad input is refused
//! before any work is done.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn loci() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_loci"))
}

fn bench(args: &[&str], cache: &Path) -> Output {
    Command::new(loci())
        .args(["bench", "subarray"])
        .args(args)
        // The search cache goes to a private directory, not the user's.
        .env("XDG_CACHE_HOME", cache)
        .output()
        .unwrap()
}

/// `loci bench subarray` on the tiny volume (256 Ki values, selectivity 0.5) with the
/// space-separated `flags`, writing `--json` to `json` when given; it must succeed.
fn tiny(dir: &Path, flags: &str, json: Option<&Path>) -> Output {
    let mut args = vec!["--size", "262144", "--selectivity", "0.5"];
    args.extend(flags.split_whitespace());
    let json = json.map(|j| j.to_str().unwrap());
    if let Some(j) = json {
        args.extend(["--json", j]);
    }
    let o = bench(&args, dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

/// An empty private directory for one test's files (and search cache).
fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn tiny_sweep_gives_a_row_per_case_and_strategy() {
    let dir = fresh_dir("loci-bench-subarray");
    let json = dir.join("r.json");
    let o = tiny(
        &dir,
        "--chunks 1,10 --span one,all --threads os,compact,best-of:3,search --peers memcpy --reps 1",
        Some(&json),
    );
    // Not a terminal: progress comes as one line per step (4 cases x 4 strategies + 4 memcpy).
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("[1/20 "), "{err}");
    assert!(
        err.contains("[20/20 ") && err.contains("c10/all/s0.5 memcpy done"),
        "{err}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["results"].as_array().unwrap();
    let loci: Vec<&Value> = rows.iter().filter(|r| r["system"] == "loci").collect();
    // 2 chunk counts x 2 spans x 1 selectivity = 4 cases, 4 strategies each.
    assert_eq!(loci.len(), 16, "{v}");
    assert_eq!(
        rows.iter().filter(|r| r["system"] == "memcpy").count(),
        8,
        "two memcpy rows per case"
    );
    for case in ["c1/one/s0.5", "c1/all/s0.5", "c10/one/s0.5", "c10/all/s0.5"] {
        let of_case: Vec<&&Value> = loci.iter().filter(|r| r["case"] == case).collect();
        assert_eq!(of_case.len(), 4, "{case}");
        let sums: Vec<&Value> = of_case.iter().map(|r| &r["extra"]["sum32"]).collect();
        assert!(sums.iter().all(|s| *s == sums[0]), "{case}: {sums:?}");
    }
    for r in &loci {
        let trials = r["extra"]["trials"].as_u64().unwrap();
        match r["config"]["threads"].as_str().unwrap() {
            "best-of:3" => assert_eq!(trials, 3, "{r}"),
            "search" => assert!((1..=19).contains(&trials), "{r}"),
            _ => assert_eq!(trials, 0, "{r}"),
        }
    }
    // The search cached its winners in the private cache directory.
    assert!(dir.join("loci").join("search.json").is_file());
    // The result-buffer pool is on by default: recorded, counted per row and in total.
    assert_eq!(v["params"]["pool"], "on", "{}", v["params"]);
    let st = &v["params"]["pool_stats"];
    assert!(st["hits"].as_u64().unwrap() > 0, "{st}");
    for r in &loci {
        assert_eq!(r["extra"]["pool"], "on", "{r}");
        assert!(r["extra"]["pool_hits"].as_u64().is_some(), "{r}");
    }
    let dsts: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter(|r| r["system"] == "memcpy")
        .map(|r| r["config"]["dst"].as_str().unwrap())
        .collect();
    assert_eq!(
        dsts.into_iter().collect::<Vec<_>>(),
        ["new-mapping", "prefaulted"]
    );
    // The bars are printed from the run's own rows.
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("vs memcpy into a prefaulted buffer") && out.contains("result-buffer pool"),
        "{out}"
    );
    // --pool off: fresh memory for every result, no pool counters, the same results.
    let off = dir.join("off.json");
    let o = tiny(
        &dir,
        "--chunks 10 --span all --threads compact --peers memcpy --reps 2 --pool off",
        Some(&off),
    );
    let w: Value = serde_json::from_str(&std::fs::read_to_string(&off).unwrap()).unwrap();
    assert_eq!(w["params"]["pool"], "off");
    assert!(w["params"].get("pool_stats").is_none(), "{}", w["params"]);
    let row = w["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["system"] == "loci")
        .unwrap();
    assert_eq!(row["extra"]["pool"], "off");
    assert!(row["extra"].get("pool_hits").is_none(), "{row}");
    let on_sum = loci
        .iter()
        .find(|r| r["case"] == "c10/all/s0.5")
        .map(|r| r["extra"]["sum32"].clone())
        .unwrap();
    assert_eq!(row["extra"]["sum32"], on_sum);
    assert!(String::from_utf8_lossy(&o.stdout).contains("result-buffer pool: off"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_refused_before_work() {
    let dir = std::env::temp_dir();
    for (args, says) in [
        (vec!["--span", "half"], "one, fifth, all"),
        (vec!["--selectivity", "1.5"], "not in (0, 1]"),
        (vec!["--threads", "spread"], "search"),
        (vec!["--peers", "pandas"], "numpy, xarray, tiledb, memcpy"),
        (vec!["--pool", "maybe"], "[possible values: on, off]"),
    ] {
        let mut all = vec!["--size", "262144", "--peers", "memcpy"];
        all.extend(args.iter());
        let o = bench(&all, &dir);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// A Python peer whose module the interpreter lacks fails the run before the loci matrix, naming
/// the modules and how to install them (not after minutes of measuring).
#[test]
fn a_missing_python_module_is_refused_before_work() {
    use std::os::unix::fs::PermissionsExt;
    let dir = fresh_dir("loci-bench-subarray-nomodule");
    let py = dir.join("python");
    std::fs::write(
        &py,
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'xarray'\" >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = bench(
        &[
            "--size",
            "262144",
            "--peers",
            "memcpy,xarray",
            "--python",
            py.to_str().unwrap(),
        ],
        &dir,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("cannot import numpy and xarray")
            && err.contains("No module named 'xarray'")
            && err.contains("bench/peers/setup --subarray"),
        "{err}"
    );
    assert!(!err.contains(" done"), "measured before refusing: {err}");
}

/// The like-for-like rows: `loci-nopool` repeats the headline strategy with fresh memory (same
/// result, pool off) and the goals pair it with the new mapping; with the Python venv present,
/// numpy-prealloc and numpy-threads run with as many threads as loci and match its checksums.
#[test]
fn like_for_like_rows_and_goals() {
    let dir = fresh_dir("loci-bench-subarray-lfl");
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../bench/peers/.venv/bin/python");
    // The venv may hold other peer sets without numpy (bench/peers/setup --tpch, --dask).
    let python = venv.is_file()
        && std::process::Command::new(&venv)
            .args(["-c", "import numpy"])
            .status()
            .is_ok_and(|s| s.success());
    let peers = if python {
        "memcpy,loci-nopool,numpy,numpy-prealloc,numpy-threads"
    } else {
        eprintln!("no numpy in {}: Python peers not checked", venv.display());
        "memcpy,loci-nopool"
    };
    let json = dir.join("r.json");
    let o = tiny(
        &dir,
        &format!(
            "--chunks 1,10 --span all --threads os,search --nthreads 3 --reps 2 --peers {peers}"
        ),
        Some(&json),
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["results"].as_array().unwrap();
    for case in ["c1/all/s0.5", "c10/all/s0.5"] {
        let of = |sys: &str| -> Vec<&Value> {
            rows.iter()
                .filter(|r| r["case"] == case && r["system"] == sys)
                .collect()
        };
        let nopool = of("loci-nopool");
        assert_eq!(nopool.len(), 1, "{case}");
        assert_eq!(nopool[0]["config"]["threads"], "search");
        assert_eq!(nopool[0]["extra"]["pool"], "off");
        let search = of("loci")
            .into_iter()
            .find(|r| r["config"]["threads"] == "search")
            .unwrap();
        assert_eq!(nopool[0]["extra"]["sum32"], search["extra"]["sum32"]);
        if python {
            for (sys, threads, result) in [
                ("numpy", "1", "fresh"),
                ("numpy-prealloc", "1", "reused"),
                ("numpy-threads", "3", "reused"),
            ] {
                let r = of(sys);
                assert_eq!(r.len(), 1, "{case} {sys}");
                assert_eq!(r[0]["config"]["threads"], threads, "{sys}");
                assert_eq!(r[0]["extra"]["result"], result, "{sys}");
                assert_eq!(r[0]["extra"]["sum32"], search["extra"]["sum32"], "{sys}");
            }
        }
    }
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("loci, pool off vs memcpy into a new mapping")
            && out.contains("loci, pool on  vs loci-nopool"),
        "{out}"
    );
    if python {
        assert!(out.contains("loci, pool on  vs numpy-threads"), "{out}");
        assert!(out.contains("loci 3, numpy-threads 3 (equal)"), "{out}");
    }
    // With --pool off, loci-nopool would repeat the loci rows: it is skipped, with a note.
    let o = tiny(
        &dir,
        "--chunks 10 --span all --threads compact --peers loci-nopool --reps 1 --pool off",
        None,
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("loci-nopool skipped"));
    let _ = std::fs::remove_dir_all(&dir);
}
