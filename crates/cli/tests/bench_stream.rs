//! `loci bench stream` end to end at a tiny size: every default peer gives an end-to-end row
//! (or says why it did not run), each `--bind` a loci row, every row carries cpu-seconds per GB
//! and its fraction of the machine limit, loci's rows their CPU per stage of both sides, and the
//! limit is printed with its parts; the
//! frame-protection comparison runs
//! loci in all three modes (checksum, auth, encrypt), each with positive goodput and a verified
//! stream, and states a verdict for each goal.

mod common;

use std::process::Command;

use serde_json::Value;

/// `loci bench stream ARGS`, which must succeed: its stdout.
fn bench_stream(args: &[&str]) -> String {
    let (ok, out, err) = common::loci(&[&["bench", "stream"], args].concat());
    assert!(ok, "{out}\n{err}");
    out
}

/// A JSON array of numbers.
fn floats(v: &Value) -> Vec<f64> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter().map(|x| x.as_f64().unwrap()).collect()
}

/// Whether `lz4` or `nc` is missing (the peers need both); says so on stderr.
fn lz4_or_nc_missing() -> bool {
    let have = |tool: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool} > /dev/null")])
            .status()
            .is_ok_and(|s| s.success())
    };
    let missing = !(have("lz4") && have("nc"));
    if missing {
        eprintln!("NOTE: lz4 or nc missing (scripts/install-deps installs them); skipped");
    }
    missing
}

/// A peer whose tools are not installed fails with what its shell said and how to install them,
/// not only with a timeout (here `nc` is missing: PATH holds `sh`, and `lz4` where there is one).
#[test]
fn a_peer_without_its_tools_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["sh", "lz4"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap();
        let path = String::from_utf8(found.stdout).unwrap();
        if !path.trim().is_empty() {
            std::os::unix::fs::symlink(path.trim(), bin.join(tool)).unwrap();
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_loci"))
        .args([
            "bench",
            "stream",
            "--bytes",
            "8M",
            "--reps",
            "1",
            "--no-os",
            "--protection",
            "",
            "--peers",
            "lz4-nc-par",
        ])
        .env("PATH", &bin)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("lz4-nc-par")
            && err.contains("nc: not found")
            && err.contains("scripts/install-deps"),
        "{err}"
    );
}

#[test]
fn tiny_run_reports_every_peer_the_limit_and_cpu_per_gb() {
    if lz4_or_nc_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let json_arg = json.to_str().unwrap();
    let out = bench_stream(&[
        "--bytes", "8M", "--reps", "1", "--no-os", "--bind", "node,cpu", "--json", json_arg,
    ]);
    assert!(out.contains("machine limit for this data:"), "{out}");
    assert!(
        out.contains("goal loci plan: at least 0.90 of the machine limit:"),
        "{out}"
    );
    assert!(
        out.contains("goal loci plan: faster than the same-core peer"),
        "{out}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let lim = &v["params"]["machine_limit"];
    for k in [
        "compress_cpu_s_per_gb",
        "decompress_cpu_s_per_gb",
        "tcp_cpu_s_per_wire_gb",
        "compression_ratio",
        "raw_bytes_per_s",
    ] {
        assert!(lim[k].as_f64().unwrap() > 0.0, "{k}: {lim}");
    }
    let rows = v["results"].as_array().unwrap();
    let e2e: Vec<&Value> = rows.iter().filter(|r| r["case"] == "end-to-end").collect();
    let systems: Vec<&str> = e2e.iter().map(|r| r["system"].as_str().unwrap()).collect();
    let not_run: Vec<&str> = v["params"]["peers_not_run"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["peer"].as_str().unwrap())
        .collect();
    for s in ["loci", "lz4-nc", "lz4-nc-par", "lz4-mt", "raw-tcp"] {
        assert!(
            systems.contains(&s) || not_run.contains(&s),
            "{s} neither ran nor said why: {systems:?} {not_run:?}"
        );
    }
    for r in &e2e {
        assert!(r["extra"]["cpu_s_per_gb"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            r["extra"]["fraction_of_limit"].as_f64().unwrap() > 0.0,
            "{r}"
        );
        assert_eq!(
            r["extra"]["fraction_of_limit_per_round"]
                .as_array()
                .unwrap()
                .len(),
            1,
            "{r}"
        );
    }
    // `--bind node,cpu`: the default plan's row and one more for per-cpu pins.
    let placements: Vec<&str> = e2e
        .iter()
        .filter(|r| r["system"] == "loci")
        .map(|r| r["config"]["placement"].as_str().unwrap())
        .collect();
    assert_eq!(placements, ["plan", "plan@cpu"], "{out}");
    // Each loci row says where its CPU went, stage by stage, on both sides.
    for r in e2e.iter().filter(|r| r["system"] == "loci") {
        let st = r["extra"]["stage_cpu_s_per_gb"].as_object().unwrap();
        let names: Vec<&str> = st.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["commit", "compress", "decompress", "recv", "send"],
            "{r}"
        );
        assert!(st.values().all(|v| v.as_f64().unwrap() > 0.0), "{r}");
    }
    assert!(
        out.contains("loci plan: cpu-s per raw GB by stage (median of runs): compress "),
        "{out}"
    );
    assert!(out.contains("the limit's work "), "{out}");
    assert_eq!(v["params"]["bind"], serde_json::json!(["node", "cpu"]));
    assert!(out.contains("goal loci plan@cpu: at least 0.90"), "{out}");
    let par = e2e.iter().find(|r| r["system"] == "lz4-nc-par").unwrap();
    let cores = v["params"]["cores"].as_u64().unwrap();
    assert_eq!(par["extra"]["pipelines"].as_u64(), Some(cores));
    assert!(rows
        .iter()
        .any(|r| r["case"] == "machine-limit" && r["throughput"].as_f64().unwrap() > 0.0));
    // The protection comparison runs by default, all three modes.
    assert_eq!(
        rows.iter().filter(|r| r["case"] == "protection").count(),
        3,
        "{rows:?}"
    );
}

/// `--protection-only` at a tiny size: one `protection` row per mode, in the order checksum, auth,
/// encrypt, each with positive goodput and CPU per GB and every run's stream verified; auth and
/// encrypt carry their ratio to checksum, and both goals get a verdict (met or MISSED: this checks
/// behaviour, not speed). Needs neither lz4 nor nc.
#[test]
fn protection_comparison_runs_all_three_modes_verified() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let json_arg = json.to_str().unwrap();
    let out = bench_stream(&[
        "--bytes",
        "4M",
        "--reps",
        "2",
        "--protection-only",
        "--json",
        json_arg,
    ]);
    assert!(
        out.contains("frame protection: loci with the plan"),
        "{out}"
    );
    for (mode, pct) in [("auth", 10), ("encrypt", 35)] {
        let goal =
            format!("goal protection {mode}: costs at most {pct}% of the checksum-only goodput: ");
        let line = out
            .lines()
            .find(|l| l.starts_with(&goal))
            .unwrap_or_else(|| panic!("no verdict for {mode}: {out}"));
        let verdict = &line[goal.len()..];
        assert!(
            verdict.starts_with("met (") || verdict.starts_with("MISSED ("),
            "{line}"
        );
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["results"].as_array().unwrap();
    // --protection-only: no plan-vs-OS rows and no peers.
    assert!(!rows.iter().any(|r| r["case"] == "end-to-end"), "{rows:?}");
    let prot: Vec<&Value> = rows.iter().filter(|r| r["case"] == "protection").collect();
    let modes: Vec<&str> = prot
        .iter()
        .map(|r| r["config"]["protection"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["checksum", "auth", "encrypt"]);
    for r in &prot {
        assert_eq!(r["system"], "loci", "{r}");
        assert_eq!(r["times_s"].as_array().unwrap().len(), 2, "{r}");
        assert!(r["throughput"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["extra"]["verified"], true, "{r}");
        assert!(r["extra"]["cpu_s_per_gb"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            r["extra"]["fraction_of_limit"].as_f64().unwrap() > 0.0,
            "{r}"
        );
        assert!(
            r["extra"]["goodput_vs_checksum"].as_f64().unwrap() > 0.0,
            "{r}"
        );
        assert!(r["extra"]["cpu_vs_checksum"].as_f64().unwrap() > 0.0, "{r}");
        let st = r["extra"]["stage_cpu_s_per_gb"].as_object().unwrap();
        assert_eq!(st.len(), 5, "every stage of both sides: {r}");
        assert!(st.values().all(|v| v.as_f64().unwrap() > 0.0), "{r}");
        let per_round = r["extra"]["cpu_s_per_round"].as_array().unwrap();
        assert_eq!(per_round.len(), 2, "{r}");
        // Each run against the limit measured just before its round; the row's figure is their
        // median (of two: the mean).
        let fr = floats(&r["extra"]["fraction_of_limit_per_round"]);
        assert_eq!(fr.len(), 2, "{r}");
        let f = r["extra"]["fraction_of_limit"].as_f64().unwrap();
        assert!((f - (fr[0] + fr[1]) / 2.0).abs() < 1e-9, "{r}");
    }
    // The limit was measured once per round; its figure lies between the rounds'.
    let lim = &v["params"]["machine_limit"];
    let per_round = floats(&lim["raw_bytes_per_s_per_round"]);
    assert_eq!(per_round.len(), 2, "{lim}");
    let mid = lim["raw_bytes_per_s"].as_f64().unwrap();
    let (lo, hi) = (
        per_round[0].min(per_round[1]),
        per_round[0].max(per_round[1]),
    );
    assert!(lo > 0.0 && lo <= mid && mid <= hi, "{lim}");
    // Encrypted DATA frames carry 8 more bytes each (the raw chunk's hash, inside the ciphertext).
    let wire = |i: usize| prot[i]["extra"]["wire_bytes"].as_u64().unwrap();
    assert!(wire(2) > wire(1), "{} vs {}", wire(2), wire(1));
    assert_eq!(prot[0]["extra"]["goodput_vs_checksum"].as_f64(), Some(1.0));
    let goals = &v["params"]["protection_goals"];
    for (mode, max) in [("auth", 0.10), ("encrypt", 0.35)] {
        assert_eq!(goals[mode]["max_cost"].as_f64(), Some(max), "{goals}");
        assert!(goals[mode]["met"].is_boolean(), "{goals}");
    }
}

/// `--protection` takes a subset; an unknown mode is refused with the valid names.
#[test]
fn protection_flag_selects_modes_and_refuses_unknown_ones() {
    let run = |modes: &str| {
        let args = [
            "--bytes",
            "2M",
            "--reps",
            "1",
            "--protection-only",
            "--protection",
            modes,
        ];
        common::loci(&[&["bench", "stream"], &args[..]].concat())
    };
    let (ok, out, err) = run("auth,checksum");
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("goal protection auth: costs at most 10%"),
        "{out}"
    );
    assert!(!out.contains("goal protection encrypt"), "{out}");
    let (ok, _, err) = run("auth,aes");
    assert!(!ok);
    assert!(
        err.contains("unknown protection \"aes\"") && err.contains("checksum, auth, encrypt"),
        "{err}"
    );
}
