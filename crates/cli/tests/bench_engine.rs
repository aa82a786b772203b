//! `loci bench w1|w2|w3|w4` end to end on tiny sizes: the scheduler axis (`--sched`), the rows
//! and configs of the result JSON, the local-access ratio, W4's four indexes on 64-bit keys
//! giving one answer (and DuckDB's, when the peers' venv is there), and clear errors for bad
//! choices.

use std::path::Path;

use serde_json::Value;

mod common;
use common::loci;

/// `loci bench ARGS` (space-separated) writing its `--json` to `json`: (success, stdout, stderr).
fn bench(args: &str, json: &Path) -> (bool, String, String) {
    let mut all = vec!["bench"];
    all.extend(args.split_whitespace());
    all.extend(["--json", json.to_str().unwrap()]);
    loci(&all)
}

fn rows(json: &Path) -> Vec<Value> {
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
    let (ok, out, err) = bench(
        "w2 --rows 30000 --groups 500 --reps 1 --morsel-rows 4000 --sched las,nls,unpinned \
         --threads os,sparse --mem first-touch,per-node",
        &json,
    );
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
    let (ok, _, err) = bench(
        "w4 --rows 32000 --reps 1 --morsel-rows 3000 --sched las,nls --threads sparse \
         --mem interleave --variant sorted,art",
        &json,
    );
    assert!(ok, "{err}");
    let rs = rows(&json);
    // 2 schedulers x 2 indexes x (build, probe), on the default sparse keys.
    assert_eq!(rs.len(), 8);
    let probe: Vec<&Value> = rs
        .iter()
        .filter(|r| r["case"].as_str().unwrap().ends_with("/probe"))
        .collect();
    assert_eq!(probe.len(), 4);
    for r in &probe {
        assert!(r["case"].as_str().unwrap().starts_with("sparse/"), "{r}");
        assert_eq!(r["extra"]["checksum"]["count"], 32000, "{r}");
        assert!(r["local_access_ratio"].as_f64().is_some());
    }
}

/// The join digest of a W4 row or a peer row: (count, payload sum, pair hash).
fn join_digest(r: &Value) -> (u64, i64, u64) {
    let c = &r["extra"]["checksum"];
    (
        c["count"].as_u64().unwrap(),
        c["sum"].as_i64().unwrap(),
        c["hash"].as_u64().unwrap(),
    )
}

#[test]
fn w4_indexes_agree_on_64_bit_keys_of_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("w4.json");
    let (ok, _, err) = bench(
        "w4 --rows 48000 --reps 1 --morsel-rows 5000 --threads sparse --mem first-touch \
         --keys sparse,dense --seed 7 --variant sorted,btree,skiplist,art",
        &json,
    );
    assert!(ok, "{err}");
    let rs = rows(&json);
    // 2 key layouts x 4 indexes x (build, probe).
    assert_eq!(rs.len(), 16);
    let mut by_keys = Vec::new();
    for keys in ["sparse", "dense"] {
        let mut variants = Vec::new();
        for v in ["sorted", "btree", "skiplist", "art"] {
            for part in ["build", "probe"] {
                let case = format!("{keys}/{v}/{part}");
                let r = rs
                    .iter()
                    .find(|r| r["case"] == case.as_str())
                    .unwrap_or_else(|| panic!("no row {case}"));
                assert!(r["median_s"].as_f64().unwrap() > 0.0, "{r}");
                variants.push(join_digest(r));
            }
        }
        // Every index gave the same count, payload sum and pair hash; every S row matched.
        assert!(
            variants.iter().all(|d| *d == variants[0]),
            "{keys}: {variants:?}"
        );
        assert_eq!(variants[0].0, 48000, "{keys}");
        by_keys.push(variants[0]);
    }
    // Same ranks, different keys: the pair hashes differ, the payload sums do not.
    assert_ne!(by_keys[0].2, by_keys[1].2);
    assert_eq!(by_keys[0].1, by_keys[1].1);
}

/// The peers' venv, made by bench/peers/setup, when it imports `modules` (e.g. "duckdb,
/// numpy"); None when it is not there.
fn peers_venv(modules: &str) -> Option<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2)?;
    let py = root.join("bench/peers/.venv/bin/python");
    let ok = std::process::Command::new(&py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(py)
}

#[test]
fn w4_duckdb_gives_the_same_answer_on_the_same_64_bit_tables() {
    if peers_venv("duckdb, numpy").is_none() {
        eprintln!(
            "NOTE: skipped: bench/peers/.venv with duckdb is not there (bench/peers/setup makes it)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for keys in ["sparse", "dense"] {
        let json = dir.path().join(format!("w4-{keys}.json"));
        let (ok, out, err) = bench(
            &format!(
                "w4 --rows 32000 --reps 1 --morsel-rows 3000 --threads sparse \
                 --mem first-touch --keys {keys} --peers duckdb"
            ),
            &json,
        );
        assert!(ok, "{keys}: {out}\n{err}");
        let rs = rows(&json);
        let peer = rs
            .iter()
            .find(|r| r["system"] == "duckdb")
            .expect("a duckdb row");
        assert_eq!(peer["case"], format!("{keys}/peer hash join").as_str());
        let want = join_digest(peer);
        assert_eq!(want.0, 32000);
        let loci: Vec<&Value> = rs.iter().filter(|r| r["system"] == "loci").collect();
        // sorted, btree, art (the skip list runs only when named) x (build, probe).
        assert_eq!(loci.len(), 6, "{keys}");
        for r in loci {
            assert_eq!(join_digest(r), want, "{keys}: {r}");
        }
        // The ratio lines compare loci's default (build + probe) and its best with DuckDB.
        assert!(
            out.contains(&format!("{keys}: loci default vs duckdb")),
            "{out}"
        );
        assert!(out.contains("best of matrix vs duckdb"), "{out}");
    }
}

#[test]
fn w1_and_w3_agree_across_schedulers() {
    let dir = tempfile::tempdir().unwrap();
    for (w, extra) in [("w1", "--groups 700"), ("w3", "--seed 9")] {
        let json = dir.path().join(format!("{w}.json"));
        let (ok, _, err) = bench(
            &format!(
                "{w} --rows 48000 {extra} --reps 1 --morsel-rows 5000 --sched las,nls,unpinned \
                 --threads compact --mem first-touch --gen workers,one-thread --keys sparse,dense"
            ),
            &json,
        );
        assert!(ok, "{w}: {err}");
        let rs = rows(&json);
        // 3 schedulers x 2 generations x 2 key layouts (sparse, dense), one variant each.
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
    // (arguments after `bench`, what the error must say)
    let cases: [(&str, &[&str]); 10] = [
        (
            "w2 --rows 100 --sched las,lass",
            &["lass", "las, nls, unpinned"],
        ),
        ("w1 --rows 100 --threads sparce", &["sparce", "compact"]),
        ("w2 --rows 100 --keys sparce", &["sparce", "sparse, dense"]),
        ("w4 --rows 100 --keys dens", &["'dens'", "sparse, dense"]),
        (
            "w4 --rows 100 --variant sorted,hash",
            &["'hash'", "sorted, btree, skiplist, art"],
        ),
        (
            "w2 --rows 100 --mem first-touch-1",
            &["first-touch-1", "per-node[:NODES]", "--gen one-thread"],
        ),
        ("w2 --rows 100 --gen one", &["'one'", "workers, one-thread"]),
        ("w1 --rows 100 --values i64,f32", &["'f32'", "i64, f64"]),
        (
            "w3 --rows 100 --values f64",
            &["--values f64", "w3 joins i64 payloads"],
        ),
        ("w2 --rows 100 --workers 100000", &["allowed cpus"]),
    ];
    for (args, says) in cases {
        let mut all = vec!["bench"];
        all.extend(args.split_whitespace());
        let (ok, _, err) = loci(&all);
        assert!(!ok, "{args} succeeded");
        for s in says {
            assert!(err.contains(s), "{args}: no {s:?} in {err}");
        }
    }
}

#[test]
fn locality_option_is_recorded_agrees_and_rejects_bad_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut sums = Vec::new();
    for loc in ["balanced", "strict"] {
        let json = dir.path().join(format!("w2-{loc}.json"));
        let (ok, _, err) = bench(
            &format!(
                "w2 --rows 20000 --groups 300 --reps 1 --morsel-rows 3000 --sched las \
                 --threads sparse --mem per-node --locality {loc}"
            ),
            &json,
        );
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

/// W2/W1 on `--values i64,f64`: rows labelled by value type, every configuration agrees within a
/// type, the two types give different digests, and DuckDB and Polars (when the venv has them)
/// agree with loci on the same doubles (the run fails otherwise).
#[test]
fn f64_values_are_labelled_and_agree_across_configurations_and_peers() {
    let peers = peers_venv("duckdb, polars, numpy").is_some();
    if !peers {
        eprintln!(
            "NOTE: the peer half is skipped: bench/peers/.venv with duckdb and polars is not there \
             (bench/peers/setup makes it)"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    for w in ["w2", "w1"] {
        let json = dir.path().join(format!("{w}.json"));
        let (ok, out, err) = bench(
            &format!(
                "{w} --rows 40000 --groups 900 --reps 1 --morsel-rows 3000 --threads sparse,os \
                 --mem first-touch --values i64,f64 --seed 11{}",
                if peers { " --peers duckdb,polars" } else { "" }
            ),
            &json,
        );
        assert!(ok, "{w}: {out}\n{err}");
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(
            v["params"]["values"],
            serde_json::json!(["i64", "f64"]),
            "{w}"
        );
        let rs = rows(&json);
        let variant = if w == "w2" { "hash" } else { "partition" };
        let mut digests = Vec::new();
        for values in ["i64", "f64"] {
            let case = format!("zipf/sparse/{values}/{variant}");
            let loci: Vec<&Value> = rs.iter().filter(|r| r["case"] == case.as_str()).collect();
            // threads sparse and os, one memory policy: one row each, the same digest.
            assert_eq!(loci.len(), 2, "{w} {case}: {out}");
            let ck = &loci[0]["extra"]["checksum"];
            assert_eq!(loci[1]["extra"]["checksum"], *ck, "{w} {case}");
            assert_eq!(ck["groups"], 900, "{w} {case}");
            digests.push(ck["hash"].clone());
            if peers {
                for p in ["duckdb", "polars"] {
                    let pc = format!("zipf/sparse/{values}/peer");
                    let r = rs
                        .iter()
                        .find(|r| r["system"] == p && r["case"] == pc.as_str())
                        .unwrap_or_else(|| panic!("{w}: no {p} row {pc}: {out}"));
                    // Groups and hash are exact on both value types; the float sums agreed
                    // within the tolerance, or the run would have failed.
                    assert_eq!(
                        r["extra"]["checksum"]["hash"], ck["hash"],
                        "{w} {p} {values}"
                    );
                    assert_eq!(r["extra"]["checksum"]["groups"], 900, "{w} {p} {values}");
                    assert!(
                        out.contains(&format!("zipf/sparse/{values}: loci default vs {p}")),
                        "{out}"
                    );
                }
            }
        }
        assert_ne!(
            digests[0], digests[1],
            "{w}: i64 and f64 hash different fields"
        );
    }
}
