//! `loci bench w1|w2|w3|w4` end to end on tiny sizes: the scheduler axis (`--sched`), the rows
//! and configs of the result JSON, the local-access ratio, and clear errors for bad choices.

use serde_json::Value;

mod common;
use common::loci;

fn rows(json: &std::path::Path) -> Vec<Value> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    v["results"].as_array().unwrap().clone()
}

fn cfg<'a>(r: &'a Value, k: &str) -> &'a str {
    r["config"][k].as_str().unwrap()
}

#[test]
fn scheduler_axis_runs_every_pair_once_and_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("w2.json");
    let (ok, out, err) = loci(&[
        "bench",
        "w2",
        "--rows",
        "30000",
        "--groups",
        "500",
        "--reps",
        "1",
        "--morsel-rows",
        "4000",
        "--sched",
        "las,nls,unpinned",
        "--threads",
        "os,sparse",
        "--mem",
        "first-touch,bind-per-node",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let rs = rows(&json);
    // las x {os, sparse} + nls x {os, sparse} + unpinned once (as os), times 2 policies.
    assert_eq!(rs.len(), 10, "{out}");
    let mut pairs: Vec<(String, String, String)> = rs
        .iter()
        .map(|r| {
            (
                cfg(r, "sched").to_string(),
                cfg(r, "threads").to_string(),
                cfg(r, "mem").to_string(),
            )
        })
        .collect();
    pairs.sort();
    pairs.dedup();
    assert_eq!(pairs.len(), 10);
    assert!(rs
        .iter()
        .filter(|r| cfg(r, "sched") == "unpinned")
        .all(|r| cfg(r, "threads") == "os"));
    // One node here: every read is local, and every configuration gave the same checksum.
    for r in &rs {
        assert_eq!(r["local_access_ratio"].as_f64(), Some(1.0), "{r}");
        assert_eq!(r["extra"]["checksum"], rs[0]["extra"]["checksum"]);
    }
    // The baseline of `vs base` is the unpinned OS-default row.
    assert!(out.contains("first-touch/unpinned/os`"), "{out}");
}

#[test]
fn joins_run_on_each_scheduler() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("w4.json");
    let (ok, _, err) = loci(&[
        "bench",
        "w4",
        "--rows",
        "32000",
        "--reps",
        "1",
        "--morsel-rows",
        "3000",
        "--sched",
        "las,nls",
        "--threads",
        "sparse",
        "--mem",
        "interleave",
        "--variant",
        "sorted,art",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let rs = rows(&json);
    // 2 schedulers x 2 indexes x (build, probe).
    assert_eq!(rs.len(), 8);
    let probe: Vec<&Value> = rs
        .iter()
        .filter(|r| r["case"].as_str().unwrap().ends_with("/probe"))
        .collect();
    assert_eq!(probe.len(), 4);
    for r in &probe {
        assert_eq!(r["extra"]["checksum"]["count"], 32000, "{r}");
        assert!(r["local_access_ratio"].as_f64().is_some());
    }
}

#[test]
fn w1_and_w3_agree_across_schedulers() {
    let dir = tempfile::tempdir().unwrap();
    for (w, extra) in [("w1", ["--groups", "700"]), ("w3", ["--seed", "9"])] {
        let json = dir.path().join(format!("{w}.json"));
        let (ok, _, err) = loci(&[
            "bench",
            w,
            "--rows",
            "48000",
            extra[0],
            extra[1],
            "--reps",
            "1",
            "--morsel-rows",
            "5000",
            "--sched",
            "las,nls,unpinned",
            "--threads",
            "compact",
            "--mem",
            "first-touch-1,interleave",
            "--keys",
            "sparse,dense",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert!(ok, "{w}: {err}");
        let rs = rows(&json);
        // 3 schedulers x 2 policies x 2 key layouts (sparse, dense), one variant each.
        assert_eq!(rs.len(), 12, "{w}");
        for r in &rs {
            let case = r["case"].as_str().unwrap();
            let first = rs.iter().find(|x| x["case"] == r["case"]).unwrap();
            assert_eq!(
                r["extra"]["checksum"], first["extra"]["checksum"],
                "{w}: {r}"
            );
            assert!(
                case.contains("sparse/") || case.contains("dense/"),
                "{case}"
            );
        }
        let d = |k: &str| {
            rs.iter()
                .find(|x| x["case"].as_str().unwrap().contains(k))
                .unwrap()["extra"]["checksum"]
                .clone()
        };
        // Both layouts have the same groups and counts but different keys: different digests.
        assert_ne!(d("sparse/"), d("dense/"), "{w}");
    }
}

#[test]
fn bad_choices_are_named_with_the_valid_ones() {
    let (ok, _, err) = loci(&["bench", "w2", "--rows", "100", "--sched", "las,lass"]);
    assert!(!ok);
    assert!(
        err.contains("lass") && err.contains("las, nls, unpinned"),
        "{err}"
    );
    let (ok, _, err) = loci(&["bench", "w1", "--rows", "100", "--threads", "sparce"]);
    assert!(!ok);
    assert!(err.contains("sparce") && err.contains("compact"), "{err}");
    let (ok, _, err) = loci(&["bench", "w2", "--rows", "100", "--keys", "sparce"]);
    assert!(!ok);
    assert!(
        err.contains("sparce") && err.contains("sparse, dense"),
        "{err}"
    );
    let (ok, _, err) = loci(&["bench", "w2", "--rows", "100", "--workers", "100000"]);
    assert!(!ok);
    assert!(err.contains("allowed cpus"), "{err}");
}

#[test]
fn locality_option_is_recorded_agrees_and_rejects_bad_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut sums = Vec::new();
    for loc in ["balanced", "strict"] {
        let json = dir.path().join(format!("w2-{loc}.json"));
        let (ok, _, err) = loci(&[
            "bench",
            "w2",
            "--rows",
            "20000",
            "--groups",
            "300",
            "--reps",
            "1",
            "--morsel-rows",
            "3000",
            "--sched",
            "las",
            "--threads",
            "sparse",
            "--mem",
            "bind-per-node",
            "--locality",
            loc,
            "--json",
            json.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
        let rs = rows(&json);
        assert_eq!(rs.len(), 1);
        assert_eq!(cfg(&rs[0], "locality"), loc);
        sums.push(rs[0]["extra"]["checksum"].clone());
    }
    assert_eq!(sums[0], sums[1]);
    let (ok, _, err) = loci(&["bench", "w2", "--rows", "1000", "--locality", "strikt"]);
    assert!(!ok);
    assert!(
        err.contains("balanced, strict") && err.contains("strikt"),
        "{err}"
    );
}
