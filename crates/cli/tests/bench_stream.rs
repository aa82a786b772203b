//! `loci bench stream` end to end at a tiny size: every default peer gives an end-to-end row
//! (or says why it did not run), every row carries cpu-seconds per GB and its fraction of the
//! machine limit, and the limit is printed with its parts.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool} > /dev/null")])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn tiny_run_reports_every_peer_the_limit_and_cpu_per_gb() {
    if !(have("lz4") && have("nc")) {
        eprintln!("NOTE: lz4 or nc missing (scripts/install-deps installs them); skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = Command::new(PathBuf::from(env!("CARGO_BIN_EXE_loci")))
        .args([
            "bench", "stream", "--bytes", "8M", "--reps", "1", "--no-os", "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
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
    }
    let par = e2e.iter().find(|r| r["system"] == "lz4-nc-par").unwrap();
    let cores = v["params"]["cores"].as_u64().unwrap();
    assert_eq!(par["extra"]["pipelines"].as_u64(), Some(cores));
    assert!(rows
        .iter()
        .any(|r| r["case"] == "machine-limit" && r["throughput"].as_f64().unwrap() > 0.0));
}
