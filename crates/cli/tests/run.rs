//! `loci plan`, `loci run` and `loci os` end to end: the probe reports from the inside what the
//! kernel says, /proc says it from the outside, and both must agree with the plan.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Once;

use serde_json::Value;

mod common;

fn loci() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_loci"))
}

/// Builds the pin library and the probe next to `loci` (same profile) once per test run.
fn built() -> PathBuf {
    static BUILD: Once = Once::new();
    let dir = loci().parent().unwrap().to_path_buf();
    BUILD.call_once(|| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-q", "-p", "loci-pin", "-p", "loci-probe"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("running cargo build");
        assert!(
            st.success(),
            "cargo build of loci-pin and loci-probe failed"
        );
    });
    assert!(dir.join("libloci_pin.so").exists());
    dir.join("loci-probe")
}

fn run(args: &[&str]) -> Output {
    Command::new(loci())
        .args(args)
        .output()
        .expect("running loci")
}

/// Runs `loci` with the whitespace-separated `args`.
fn run_words(args: &str) -> Output {
    run(&args.split_whitespace().collect::<Vec<_>>())
}

/// Runs `loci run ARGS --verify-json FILE -- loci-probe PROBE_ARGS`, which must succeed; returns
/// its output and the verify JSON (FILE, named after `tag`, is removed).
fn run_probe_verified(tag: &str, args: &[&str], probe_args: &[&str]) -> (Output, Value) {
    let probe = built();
    let json = std::env::temp_dir().join(format!("loci-{tag}-{}.json", std::process::id()));
    let (j, p) = (json.to_str().unwrap(), probe.to_str().unwrap());
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    all.extend(["--verify-json", j, "--", p]);
    all.extend_from_slice(probe_args);
    let o = run(&all);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    (o, v)
}

/// Runs `loci run --threads compact -n 1 --verify-json FILE -- sh -c SCRIPT`; returns its output
/// (whatever its status) and the verify JSON (FILE, named after `tag`, is removed).
fn sh_verified(tag: &str, script: &str) -> (Output, Value) {
    let json = std::env::temp_dir().join(format!("loci-{tag}-{}.json", std::process::id()));
    let j = json.to_str().unwrap();
    let o = run(&[
        "run",
        "--threads",
        "compact",
        "-n",
        "1",
        "--verify-json",
        j,
        "--",
        "sh",
        "-c",
        script,
    ]);
    let written = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("{j}: {e}; loci said: {}", text(&o.stderr)));
    std::fs::remove_file(&json).unwrap();
    (o, serde_json::from_str(&written).unwrap())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn allowed() -> Vec<u32> {
    common::allowed_cpus().iter().collect()
}

#[test]
fn cpus_and_bind_show_in_proc_status() {
    let cpu = *allowed().last().unwrap();
    let o = run_words(&format!(
        "run --threads cpus:{cpu} --mem bind:0 -- cat /proc/self/status"
    ));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.contains(&format!("Cpus_allowed_list:\t{cpu}\n")),
        "{out}"
    );
}

#[test]
fn exit_status_and_signals_pass_through() {
    let o = run(&["run", "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7));
    let o = run(&["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(o.status.code(), Some(128 + 15));
    let o = run(&["run", "--", "/nonexistent/program"]);
    assert_eq!(o.status.code(), Some(127));
    assert!(text(&o.stderr).contains("/nonexistent/program"));
}

#[test]
fn jemalloc_is_mapped() {
    let o = run(&["run", "--alloc", "jemalloc", "--", "cat", "/proc/self/maps"]);
    if !o.status.success() {
        // Only acceptable failure: the library is not installed, and then the error names the package.
        let e = text(&o.stderr);
        assert!(e.contains("libjemalloc2"), "{e}");
        eprintln!("note: jemalloc not installed here; checked the error instead");
        return;
    }
    assert!(text(&o.stdout).contains("libjemalloc.so.2"));
}

/// `loci run --alloc jemalloc -- loci bench w2 ...` (the line `loci advise` recommends): the
/// bench's rows name jemalloc, the allocator its process runs on, not glibc (the bench's own
/// `--alloc` default, which without a preload means glibc's malloc).
#[test]
fn a_bench_under_a_preloaded_allocator_labels_its_rows_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("w2.json");
    let bin = loci();
    let o = run(&[
        "run",
        "--alloc",
        "jemalloc",
        "--",
        bin.to_str().unwrap(),
        "bench",
        "w2",
        "--rows",
        "3000",
        "--groups",
        "50",
        "--reps",
        "1",
        "--threads",
        "os",
        "--mem",
        "first-touch",
        "--json",
        json.to_str().unwrap(),
    ]);
    if !o.status.success() {
        let e = text(&o.stderr);
        assert!(e.contains("libjemalloc2"), "{e}");
        eprintln!("note: jemalloc not installed here; checked the error instead");
        return;
    }
    assert!(
        text(&o.stderr).contains("runs on jemalloc (LD_PRELOAD)"),
        "{}",
        text(&o.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows: Vec<&Value> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["system"] == "loci")
        .collect();
    assert!(!rows.is_empty(), "{v}");
    for r in rows {
        assert_eq!(r["config"]["alloc"], "jemalloc", "{r}");
    }
}

#[test]
fn probe_reports_the_planned_affinity_and_policy_per_thread() {
    let probe = built();
    let cpus = allowed();
    let n = cpus.len().min(4);
    let o = run(&[
        "run",
        "--threads",
        "compact",
        "-n",
        &n.to_string(),
        "--mem",
        "bind:0",
        "--thp",
        "off",
        "--",
        probe.to_str().unwrap(),
        "--threads",
        &(n - 1).to_string(),
        "--alloc",
        "4M",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    // Plan on this machine (what `loci plan --json` says) is the reference.
    let p = run_words(&format!("plan --threads compact -n {n} --json"));
    let plan: Value = serde_json::from_slice(&p.stdout).unwrap();
    assert_eq!(r["cpus"], plan["threads"][0]["cpus"], "{r}");
    for t in r["threads"].as_array().unwrap() {
        let i = t["index"].as_u64().unwrap() as usize;
        assert_eq!(t["cpus"], plan["threads"][i]["cpus"], "{r}");
        assert_eq!(t["mempolicy"]["policy"], "bind");
    }
    assert_eq!(r["mempolicy"]["policy"], "bind");
    assert_eq!(r["mempolicy"]["nodes"], "0");
    assert_eq!(r["thp_disabled"], true);
    // Every page with a known node is on node 0 (pages of unknown node, -EFAULT while AutoNUMA
    // scans, are counted apart and are neither).
    let a = &r["alloc"];
    let on0 = a["pages_per_node"]["0"].as_u64().unwrap();
    assert!(on0 > 0, "{r}");
    assert_eq!(
        on0 + a["unknown"].as_u64().unwrap(),
        a["pages"].as_u64().unwrap(),
        "{r}"
    );
}

#[test]
fn skipped_helper_threads_take_no_plan_entry() {
    let probe = built();
    let cpus = allowed();
    if cpus.len() < 2 {
        eprintln!("note: needs 2 cpus");
        return;
    }
    let (a, b) = (cpus[0], cpus[1]);
    // Plan: main on a, thread 1 on b. The first created thread is a helper (skip 0x1).
    let o = run(&[
        "run",
        "--threads",
        &format!("cpus:{a},{b}"),
        "-n",
        "2",
        "--skip",
        "0x1",
        "--",
        probe.to_str().unwrap(),
        "--threads",
        "2",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["cpus"], a.to_string());
    let t = r["threads"].as_array().unwrap();
    // Probe threads are created in index order: thread 1 is the skipped helper (whole footprint),
    // thread 2 is plan thread 1.
    let both: loci_topo::CpuSet = [a, b].into_iter().collect();
    assert_eq!(t[0]["cpus"], both.to_string(), "{r}");
    assert_eq!(t[1]["cpus"], b.to_string(), "{r}");
}

#[test]
fn verify_agrees_with_proc_and_the_probe() {
    let n = allowed().len().min(2);
    let (o, v) = run_probe_verified(
        "verify",
        &[
            "--threads",
            "sparse",
            "-n",
            &n.to_string(),
            "--mem",
            "bind:0",
        ],
        &[
            "--threads",
            &(n - 1).to_string(),
            "--alloc",
            "16M",
            "--hold",
            "400",
        ],
    );
    let err = text(&o.stderr);
    assert!(err.contains("loci verify: threads started"), "{err}");
    assert!(err.contains("loci verify: at exit"), "{err}");
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    for which in ["started", "exit"] {
        let c = &v[which];
        assert_eq!(c["all_ok"], true, "{which}: {c}");
        let rows = c["rows"].as_array().unwrap();
        assert_eq!(rows.len(), n, "{which}: {c}");
        // Every row agrees with what the probe saw from the inside.
        for row in rows {
            let tid = row["tid"].as_i64().unwrap();
            let inside = if r["tid"].as_i64() == Some(tid) {
                &r
            } else {
                r["threads"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|t| t["tid"].as_i64() == Some(tid))
                    .expect("verify row for a thread the probe does not know")
            };
            assert_eq!(row["actual_cpus"], inside["cpus"], "{which}: {row}");
            assert_eq!(row["plan_cpus"], inside["cpus"], "{which}: {row}");
            assert_eq!(row["policy"], "bind:0", "{which}: {row}");
        }
        assert_eq!(c["remote_share"], 0.0);
    }
    // The 16 MiB buffer was seen on node 0 by the exit reading.
    let bytes = v["exit"]["anon_bytes"]["0"].as_u64().unwrap();
    assert!(bytes >= 16 << 20, "{bytes}");
}

/// Memory the program touches in its last moments, after loci's last numa_maps poll, is in the
/// exit report: the pin library reads it at exit(3). A program killed by a signal runs no exit
/// code, so its exit report falls back to the last poll and says so.
#[test]
fn the_exit_report_counts_memory_touched_just_before_exit() {
    let (o, v) = run_probe_verified(
        "exit-memory",
        &["--threads", "compact", "-n", "1"],
        &["--alloc", "256M"],
    );
    let e = &v["exit"];
    assert_eq!(e["memory_by"], "program-at-exit", "{e}");
    let total: u64 = e["anon_bytes"]
        .as_object()
        .unwrap()
        .values()
        .map(|b| b.as_u64().unwrap())
        .sum();
    assert!(total >= 256 << 20, "{e}");
    let err = text(&o.stderr);
    assert!(err.contains("; read by the program at exit"), "{err}");
    assert_eq!(v["started"]["memory_by"], "poll");

    // An unpinned plan loads the library for the reading alone: nothing is bound, not even by an
    // inherited LOCI_PIN_CPUS.
    let probe = built();
    let json = std::env::temp_dir().join(format!("loci-os-exit-{}.json", std::process::id()));
    let o = Command::new(loci())
        .args([
            "run",
            "-n",
            "1",
            "--verify-json",
            json.to_str().unwrap(),
            "--",
        ])
        .arg(&probe)
        .args(["--alloc", "64M"])
        .env("LOCI_PIN_CPUS", "0")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["cpus"], common::allowed_cpus().to_string(), "{r}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    assert_eq!(v["exit"]["memory_by"], "program-at-exit", "{}", v["exit"]);
    let total: u64 = v["exit"]["anon_bytes"]
        .as_object()
        .unwrap()
        .values()
        .map(|b| b.as_u64().unwrap())
        .sum();
    assert!(total >= 64 << 20, "{}", v["exit"]);

    let (o, v) = sh_verified("killed", "sleep 0.4; kill -KILL $$");
    assert_eq!(o.status.code(), Some(128 + 9), "{}", text(&o.stderr));
    assert_eq!(v["exit"]["memory_by"], "poll", "{}", v["exit"]);
    let at = v["exit"]["memory_at_s"].as_f64().unwrap();
    assert!(at > 0.0, "{}", v["exit"]);
    assert!(
        text(&o.stderr).contains(&format!("; read at +{at:.2}s")),
        "{}",
        text(&o.stderr)
    );
}

/// The started report's second reading counts for the exit report too: a program that exits
/// before loci's next poll is judged by it, not by the reading before it (taken at +0.00s, before
/// the pin library had run).
#[test]
fn the_exit_report_keeps_the_started_reports_reading() {
    let (o, v) = sh_verified("short", "sleep 0.03");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let (st, ex) = (v["started"]["at_s"].as_f64(), v["exit"]["at_s"].as_f64());
    assert!(ex >= st, "exit readings at {ex:?}, started at {st:?}");
    assert_eq!(v["exit"]["all_ok"], true, "{}", v["exit"]);
}

#[test]
fn bad_input_names_the_bad_part_and_the_choices() {
    let e = text(&run(&["plan", "--threads", "spread", "-n", "2"]).stderr);
    assert!(e.contains("`spread`") && e.contains("compact"), "{e}");
    let e = text(&run(&["plan", "--mem", "spray", "-n", "1"]).stderr);
    assert!(e.contains("`spray`") && e.contains("interleave"), "{e}");
    let e = text(&run(&["plan", "--threads", "cpus:4000", "-n", "1"]).stderr);
    assert!(e.contains("cpu 4000") && e.contains("present cpus"), "{e}");
    let e = text(&run(&["plan", "--mem", "bind:7", "-n", "1"]).stderr);
    assert!(e.contains("node 7") && e.contains("present nodes"), "{e}");
    let n = allowed().len() + 1;
    let o = run(&["plan", "--threads", "compact", "-n", &n.to_string()]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("--oversubscribe"));
    let o = run_words(&format!("plan --threads compact -n {n} --oversubscribe"));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = run_words(&format!("run --threads compact -n {n} -- true"));
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("--oversubscribe"));
}

#[test]
fn interleave_on_one_node_says_what_it_is_applied_as() {
    let topo = run(&["plan", "--mem", "interleave", "-n", "1", "--json"]);
    let plan: Value = serde_json::from_slice(&topo.stdout).unwrap();
    let nodes = plan["memory"]["nodes"].as_str().unwrap().to_string();
    if nodes.contains(',') || nodes.contains('-') {
        eprintln!("note: several nodes here; nothing to apply as something else");
        assert_eq!(plan["memory"]["policy"], "interleave");
        return;
    }
    assert_eq!(plan["memory"]["policy"], "preferred");
    let e = text(&topo.stderr);
    assert_eq!(e.matches("applied as preferred").count(), 1, "{e}");
}

#[test]
fn os_status_reads_the_knobs_and_set_needs_root() {
    let o = run(&["os", "status", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    if let Ok(t) = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled") {
        let sel = t.split_whitespace().find(|w| w.starts_with('[')).unwrap();
        assert_eq!(v["thp_enabled"], sel.trim_matches(|c| c == '[' || c == ']'));
    }
    let e = text(&run(&["os", "set", "thp=sometimes"]).stderr);
    assert!(e.contains("always, madvise, never"), "{e}");
    // Not root: a clear error. Run as nobody where we can (we are root with setpriv).
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let setpriv = std::path::Path::new("/usr/bin/setpriv").exists();
    if root && setpriv {
        let o = Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(loci())
            .args(["os", "set", "autonuma=off"])
            .output()
            .unwrap();
        assert!(!o.status.success());
        assert!(
            text(&o.stderr).contains("needs root"),
            "{}",
            text(&o.stderr)
        );
        // As root, setting the current value again changes nothing and prints the old value.
        if let Some(cur) = v["thp_enabled"].as_str() {
            let o = run(&["os", "set", &format!("thp={cur}")]);
            assert!(o.status.success(), "{}", text(&o.stderr));
            assert!(text(&o.stdout).contains(&format!("{cur} -> {cur}")));
        }
    } else if !root {
        let e = text(&run(&["os", "set", "autonuma=off"]).stderr);
        assert!(e.contains("needs root"), "{e}");
    }
}

#[test]
fn plan_json_schema_on_this_machine() {
    let o = run_words("plan --threads compact -n 1 --mem bind:0 --json");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, vec!["memory", "threads"]);
    assert_eq!(v["threads"][0]["index"], 0);
    assert_eq!(v["threads"][0]["cpus"], allowed()[0].to_string());
    assert_eq!(v["memory"]["policy"], "bind");
    assert_eq!(v["memory"]["nodes"], "0");
}

#[test]
fn every_plan_entry_is_used_once_and_extras_get_the_footprint() {
    let (_, v) = run_probe_verified(
        "extra",
        &["--threads", "compact", "-n", "8", "--oversubscribe"],
        &["--threads", "11", "--hold", "300"],
    );
    let rows = v["exit"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 12, "{}", v["exit"]);
    let mut idx: Vec<u64> = rows.iter().filter_map(|r| r["index"].as_u64()).collect();
    idx.sort();
    assert_eq!(idx, (0..8).collect::<Vec<_>>());
    let footprint: loci_topo::CpuSet = v["plan"]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| loci_topo::CpuSet::parse(t["cpus"].as_str().unwrap()).unwrap())
        .fold(loci_topo::CpuSet::new(), |a, s| a.union(&s));
    let extras: Vec<&Value> = rows.iter().filter(|r| r["role"] == "extra").collect();
    assert_eq!(extras.len(), 4);
    for e in extras {
        assert_eq!(e["actual_cpus"], footprint.to_string());
    }
    assert_eq!(v["exit"]["all_ok"], true);
}

/// Threads created concurrently from several threads still each get a distinct plan entry and
/// end up where that entry says.
#[test]
fn concurrent_thread_creation_stress() {
    for round in 0..3 {
        // 1 main + 4 spawners + 28 workers = 33 threads, all planned.
        let (_, v) = run_probe_verified(
            &format!("stress-{round}"),
            &["--threads", "random:7", "-n", "33", "--oversubscribe"],
            &["--threads", "28", "--spawners", "4", "--hold", "300"],
        );
        let rows = v["exit"]["rows"].as_array().unwrap();
        let mut idx: Vec<u64> = rows.iter().filter_map(|r| r["index"].as_u64()).collect();
        idx.sort();
        assert_eq!(idx, (0..33).collect::<Vec<_>>(), "round {round}");
        assert_eq!(v["exit"]["all_ok"], true, "round {round}: {}", v["exit"]);
    }
}

#[test]
fn newer_policies_apply_where_the_kernel_has_them() {
    let probe = built();
    for (policy, name) in [
        ("weighted-interleave:0", "weighted-interleave"),
        ("preferred-many:0", "preferred-many"),
    ] {
        let o = run(&["run", "--mem", policy, "--", probe.to_str().unwrap()]);
        if !o.status.success() {
            // Older kernel: the error says which Linux version is needed.
            let e = text(&o.stderr);
            assert!(
                e.contains("not supported by this kernel") && e.contains("Linux"),
                "{e}"
            );
            continue;
        }
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["mempolicy"]["policy"], name, "{r}");
        assert_eq!(r["mempolicy"]["nodes"], "0");
    }
}

#[test]
fn plan_for_another_machine_from_a_preset() {
    let o = run_words("plan --preset opteron-8220-8s --threads sparse -n 8 --json");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let nodes: Vec<&str> = v["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["nodes"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["0", "1", "2", "3", "4", "5", "6", "7"]);
    // Running a plan made for another machine is refused with the cpus that do not exist here.
    let o = run_words("run --preset opteron-8220-8s --threads cpus:15 -- true");
    if allowed().contains(&15) {
        return;
    }
    assert!(!o.status.success());
    let e = text(&o.stderr);
    assert!(e.contains("15") && e.contains("may not run on here"), "{e}");
}

#[test]
fn verify_waits_a_bounded_time_for_missing_threads() {
    built();
    if allowed().len() < 2 {
        eprintln!("note: needs 2 cpus");
        return;
    }
    let o = run_words("run --threads compact -n 2 --verify --verify-wait 0.2 -- sleep 0.6");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let e = text(&o.stderr);
    assert!(
        e.contains("after 0.2s only 1 of 2 planned threads exist"),
        "{e}"
    );
    assert!(e.contains("loci verify: at exit"), "{e}");
}

/// A program that exits within one poll is never reported wrongly placed: a thread read only
/// before the pin library bound it is "not verified", never "NO".
#[test]
fn verify_does_not_judge_a_thread_by_a_reading_before_its_binding() {
    built();
    for _ in 0..8 {
        let o = run_words("run --threads compact -n 1 --verify -- true");
        assert!(o.status.success(), "{}", text(&o.stderr));
        let e = text(&o.stderr);
        assert!(e.contains("loci verify: at exit"), "{e}");
        assert!(!e.contains(" NO"), "{e}");
    }
    let o = run_words("run --verify-json /nonexistent-dir/v.json -- true");
    assert!(!o.status.success());
    let e = text(&o.stderr);
    assert!(e.contains("--verify-json /nonexistent-dir/v.json"), "{e}");
    let o = run(&["run", "--verify", "--verify-wait=-1", "--", "true"]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("0 to 3600"));
    let o = Command::new(loci())
        .args([
            "run",
            "--threads",
            "compact",
            "-n",
            "2",
            "--oversubscribe",
            "--",
            "true",
        ])
        .env("LOCI_PIN_LIB", "/nonexistent/libloci_pin.so")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("LOCI_PIN_LIB=/nonexistent/libloci_pin.so: no such file"));
}

/// Counts of 0 are refused by the flag's name everywhere (never silently run once), and a plan
/// too large for the pin library's environment string is refused before the program starts.
#[test]
fn zero_counts_and_oversized_plans_are_refused() {
    for args in [
        &["bench", "tpch", "--reps", "0"][..],
        &["bench", "deploy", "--partitions", "0"],
        &["bench", "deploy", "--keys", "0"],
        &["bench", "subarray", "--nthreads", "0"],
        &["bench", "alloc", "--blocks", "0"],
        &["advise", "--matrix", "--matrix-reps", "0"],
    ] {
        let o = run(args);
        assert!(!o.status.success(), "{args:?} ran");
        let e = text(&o.stderr);
        assert!(
            e.contains("'0'") && !e.contains("panicked"),
            "{args:?}: {e}"
        );
    }
    let o = run(&["bench", "w2", "--rows", "0"]);
    assert!(text(&o.stderr).contains("--rows must be at least 1"));
    let o = run_words("run --threads compact -n 65536 --oversubscribe -- true");
    assert!(!o.status.success());
    let e = text(&o.stderr);
    assert!(
        e.contains("more than an environment string may hold") && e.contains("-n"),
        "{e}"
    );
}

/// The pin library reports `LOCI_PIN_CPUS` and `LOCI_PIN_SKIP` values that are not UTF-8 by the
/// variable's name (never as if unset), and takes a `LOCI_PIN_LOG` path of any bytes.
#[test]
fn pin_library_reports_non_utf8_values_and_takes_any_log_path() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    built();
    let lib = loci().parent().unwrap().join("libloci_pin.so");
    let cpu = *allowed().last().unwrap();
    let bad = || OsString::from_vec(b"0;\xff".to_vec());
    let preloaded = |vars: &[(&str, OsString)]| {
        let mut cmd = Command::new("true");
        cmd.env("LD_PRELOAD", &lib)
            .env_remove("LOCI_PIN_SKIP")
            .env_remove("LOCI_PIN_LOG");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stderr)
    };
    let e = preloaded(&[("LOCI_PIN_CPUS", bad())]);
    assert!(
        e.contains("loci-pin: LOCI_PIN_CPUS=`0;\u{fffd}` is not valid UTF-8")
            && e.contains("threads are not pinned"),
        "{e}"
    );
    let e = preloaded(&[
        ("LOCI_PIN_CPUS", cpu.to_string().into()),
        ("LOCI_PIN_SKIP", bad()),
    ]);
    assert!(
        e.contains("loci-pin: LOCI_PIN_SKIP=") && e.contains("not valid UTF-8"),
        "{e}"
    );
    let mut log = std::env::temp_dir()
        .join(format!("loci-pin-{}-", std::process::id()))
        .into_os_string()
        .into_vec();
    log.extend_from_slice(b"\xff.log");
    let log = PathBuf::from(OsString::from_vec(log));
    let e = preloaded(&[
        ("LOCI_PIN_CPUS", cpu.to_string().into()),
        ("LOCI_PIN_LOG", log.clone().into_os_string()),
    ]);
    assert!(e.is_empty(), "{e}");
    let written = std::fs::read_to_string(&log).unwrap();
    std::fs::remove_file(&log).unwrap();
    assert!(
        written.contains(&format!("thread=0 cpus={cpu}")),
        "{written}"
    );
}

/// `-n` with an inherited OMP_NUM_THREADS: the program keeps the user's value and a note names
/// both; an agreeing value gets no note.
#[test]
fn inherited_omp_num_threads_is_kept_with_a_note() {
    let run_n2 = |omp: &str| {
        Command::new(loci())
            .args(["run", "-n", "2", "--", "sh", "-c", "echo $OMP_NUM_THREADS"])
            .env("OMP_NUM_THREADS", omp)
            .output()
            .unwrap()
    };
    let o = run_n2("3");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), "3");
    let e = text(&o.stderr);
    assert!(
        e.contains("note: OMP_NUM_THREADS=3 is kept") && e.contains("-n asks for 2"),
        "{e}"
    );
    let o = run_n2("2");
    assert_eq!(text(&o.stdout).trim(), "2");
    assert!(
        !text(&o.stderr).contains("OMP_NUM_THREADS"),
        "{}",
        text(&o.stderr)
    );
    let o = Command::new(loci())
        .args(["run", "-n", "2", "--", "sh", "-c", "echo $OMP_NUM_THREADS"])
        .env_remove("OMP_NUM_THREADS")
        .output()
        .unwrap();
    assert_eq!(text(&o.stdout).trim(), "2");
}
