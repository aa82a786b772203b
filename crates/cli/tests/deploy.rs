//! `loci deploy` end to end: layouts and templates on presets (dry runs), errors before anything
//! starts, and real deployments on this machine (status, kill -9 and restart, stop, signals,
//! exit statuses and the restart cap).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

mod common;
use common::{all_verified, deploy_fails_before_start, loci, loci_json_after, pids, Manifest};

/// A dry run's manifest.
fn plan(args: &[&str]) -> Value {
    loci_json_after(&["deploy", "--dry-run", "--json"], args)
}

fn strs(v: &Value, key: &str) -> Vec<String> {
    v["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| match &i[key] {
            Value::String(s) => s.clone(),
            x => x.to_string(),
        })
        .collect()
}

#[test]
fn win_on_a_two_node_preset_binds_each_instance_to_its_node() {
    let m = plan(&[
        "--design",
        "win",
        "--preset",
        "xeon-gold-6346-2s",
        "--",
        "w",
        "--id={instance}/{ninstances}",
        "{node}",
        "{port}",
        "{nic}@{nic_node}",
        "{ncpus}",
    ]);
    assert_eq!(m["state"], "planned");
    assert_eq!(strs(&m, "nodes"), ["0", "1"]);
    assert_eq!(strs(&m, "cpus"), ["0-15,32-47", "16-31,48-63"]);
    assert_eq!(strs(&m, "mem"), ["bind:0", "bind:1"]);
    let i1 = &m["instances"][1];
    let words = |key: &str| -> Vec<String> { serde_json::from_value(i1[key].clone()).unwrap() };
    assert_eq!(
        words("command"),
        ["w", "--id=1/2", "1", "20001", "ens5f0np0@1", "32"]
    );
    let run = words("run");
    assert_eq!(
        &run[1..9],
        [
            "run",
            "--threads",
            "nodes:1",
            "-n",
            "1",
            "--mem",
            "bind:1",
            "--"
        ]
    );
    assert_eq!(i1["plan"]["threads"][0]["cpus"], "16-31,48-63");
    assert_eq!(i1["plan"]["memory"]["policy"], "bind");
}

#[test]
fn four_node_preset_layouts() {
    let p = "xeon-e5-4660v4-4s";
    let win = plan(&["--design", "win", "--preset", p, "--", "w"]);
    assert_eq!(strs(&win, "nodes"), ["0", "1", "2", "3"]);
    let wic = plan(&["--design", "wic", "--preset", p, "--", "w", "{cpus}"]);
    assert_eq!(wic["instances"].as_array().unwrap().len(), 64);
    assert!(strs(&wic, "cpus")
        .iter()
        .all(|c| loci_topo::CpuSet::parse(c).unwrap().len() == 2));
    let sp = plan(&["--design", "spmwin", "--preset", p, "--", "w"]);
    assert_eq!(strs(&sp, "nodes"), ["0-3"; 4]);
    assert!(strs(&sp, "cpus")
        .iter()
        .all(|c| loci_topo::CpuSet::parse(c).unwrap().len() == 32));
    // One plan thread per hardware thread of the instance's 16 cores.
    assert_eq!(
        sp["instances"][0]["plan"]["threads"]
            .as_array()
            .unwrap()
            .len(),
        32
    );
    let wim = plan(&[
        "--design",
        "wim",
        "--preset",
        p,
        "--mem",
        "interleave",
        "--",
        "w",
        "{nodes}",
    ]);
    assert_eq!(strs(&wim, "mem"), ["interleave"]);
    assert_eq!(wim["instances"][0]["command"][1], "0-3");
    assert_eq!(wim["instances"][0]["mem_nodes"], "0-3");
    // The text form shows each instance's plan and command line.
    let (ok, out, _) = loci(&[
        "deploy",
        "--design",
        "win",
        "--preset",
        p,
        "--dry-run",
        "--",
        "w",
        "-p",
        "{port}",
    ]);
    assert!(ok);
    assert!(
        out.contains("instance 3: nodes 3")
            && out.contains("--threads nodes:3 -n 1 --mem bind:3 -- w -p 20003"),
        "{out}"
    );
}

#[test]
fn cpuless_and_memoryless_nodes_are_handled_and_said() {
    let m = plan(&[
        "--design",
        "win",
        "--synthetic",
        "nodes=4,cores=2,cpuless=3,memless=2",
        "--",
        "w",
        "{node}",
    ]);
    assert_eq!(strs(&m, "nodes"), ["0", "1", "2"]);
    assert_eq!(m["instances"][2]["mem"], "bind:0");
    let notes = m["notes"].to_string();
    assert!(
        notes.contains("node 3 has no cpus") && notes.contains("node 2 has no memory"),
        "{notes}"
    );
}

#[test]
fn bad_templates_and_impossible_layouts_fail_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("m.json");
    let man = man.to_str().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--design", "wim", "--", "sleep", "{cpu}"],
            &["{cpu}", "{cpus}", "{nic_node}"],
        ),
        (
            &["--design", "wim", "--", "sleep", "{node"],
            &["not closed"],
        ),
        (
            &["--design", "wim", "--instances", "2", "--", "sleep", "1"],
            &["wim", "valid: 1"],
        ),
        (
            &["--design", "win", "--instances", "999", "--", "sleep", "1"],
            &["--instances 999", "valid: 1-"],
        ),
        (
            &["--design", "win", "--nics", "nope0", "--", "sleep", "1"],
            &["nope0", "present:"],
        ),
        (
            &["--design", "wim", "--", "no-such-program-here"],
            &["no-such-program-here", "PATH"],
        ),
        (
            &[
                "--design",
                "win",
                "--preset",
                "xeon-gold-6346-2s",
                "--",
                "sleep",
                "1",
            ],
            &["--dry-run"],
        ),
        (
            &[
                "--design",
                "win",
                "--synthetic",
                "nodes=2",
                "--dry-run",
                "--port-base",
                "65535",
                "--",
                "w",
                "{port}",
            ],
            &["65535", "65536"],
        ),
        (
            &["--grace", "1e300", "--", "sleep", "1"],
            &["--grace", "outside 0..=3600"],
        ),
        (
            &["--grace", "inf", "--", "sleep", "1"],
            &["outside 0..=3600"],
        ),
    ];
    for (args, want) in cases {
        deploy_fails_before_start(&["deploy"], man, args, want);
    }
}

/// `deploy stop` and `status` refuse a manifest whose grace time or process ids are out of
/// range (a pid of 1 or 0 would make kill(2) signal every process or loci's own group), naming
/// the field, and signal nothing.
#[test]
fn damaged_manifests_are_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("m.json");
    let man = man.to_str().unwrap();
    let v = plan(&[
        "--design",
        "wim",
        "--synthetic",
        "nodes=2",
        "--",
        "sleep",
        "1",
    ]);
    let cases: [(&str, Value, &str); 3] = [
        (
            "grace_s",
            serde_json::json!(1e300),
            "grace_s: 1e300 seconds is outside 0..=3600",
        ),
        ("supervisor_pid", serde_json::json!(1), "supervisor_pid = 1"),
        ("runner_pid", serde_json::json!(0), "runner_pid = 0"),
    ];
    for (field, value, want) in cases {
        let mut m = v.clone();
        if field == "runner_pid" {
            m["instances"][0][field] = value;
        } else {
            m[field] = value;
        }
        std::fs::write(man, m.to_string()).unwrap();
        for cmd in ["stop", "status"] {
            let (ok, out, err) = loci(&["deploy", cmd, man]);
            assert!(!ok, "{cmd} with {field} accepted: {out}");
            assert!(
                err.contains(want) && !err.contains("panicked"),
                "{cmd}: {err}"
            );
        }
    }
}

/// A deployment running in the background.
struct Deploy {
    child: Child,
    manifest: Manifest,
    _dir: tempfile::TempDir,
}

impl Deploy {
    fn start(args: &[&str]) -> Deploy {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("m.json");
        let child = Command::new(env!("CARGO_BIN_EXE_loci"))
            .args([
                "deploy",
                "--manifest",
                manifest.to_str().unwrap(),
                "--grace",
                "3",
            ])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Deploy {
            child,
            manifest: Manifest {
                path: manifest,
                wait: Duration::from_secs(10),
            },
            _dir: dir,
        }
    }

    /// Waits for the supervisor: its exit code, stdout, stderr and last manifest.
    fn finish(self) -> (Option<i32>, String, String, Value) {
        let out = self.child.wait_with_output().unwrap();
        let text = std::fs::read_to_string(&self.manifest.path).unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            serde_json::from_str(&text).unwrap(),
        )
    }
}

/// How many wic instances this machine gets (its allowed cores).
fn cores() -> usize {
    plan(&["--design", "wic", "--", "true"])["instances"]
        .as_array()
        .unwrap()
        .len()
}

#[test]
fn kill_minus_9_restarts_one_instance_and_leaves_the_others() {
    if cores() < 2 {
        eprintln!("skipped: needs 2 allowed cores for two wic instances");
        return;
    }
    let d = Deploy::start(&[
        "--design",
        "wic",
        "--instances",
        "2",
        "--",
        "sh",
        "-c",
        "echo up {instance} {cpus}; exec sleep 60",
    ]);
    let m = d.manifest.until("both instances verified", all_verified);
    for (i, inst) in m["instances"].as_array().unwrap().iter().enumerate() {
        assert_eq!(inst["state"], "running");
        assert_eq!(
            inst["verify"]["threads"], inst["verify"]["threads_on_cpus"],
            "instance {i}: {inst}"
        );
        // The kernel agrees with the manifest about where the instance runs.
        let pid = inst["pid"].as_i64().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim();
        assert_eq!(cpus, inst["cpus"].as_str().unwrap(), "instance {i}");
    }
    let (ok, out, err) = loci(&["deploy", "status", d.manifest.arg()]);
    assert!(
        ok && out.contains("instance 1: running") && out.contains("now: 1/1 threads on cpus"),
        "{out}{err}"
    );
    let before = pids(&m);
    // SAFETY: kill(2) on a pid this test's deployment started.
    unsafe { libc::kill(before[1] as i32, libc::SIGKILL) };
    let m = d.manifest.until("instance 1 restarted", |m| {
        m["instances"][1]["restarts"] == 1 && m["instances"][1]["verify"]["ok"] == true
    });
    let after = pids(&m);
    assert_eq!(after[0], before[0], "instance 0 untouched");
    assert_ne!(after[1], before[1]);
    assert_eq!(m["instances"][0]["restarts"], 0);
    assert_eq!(m["instances"][1]["last_exit"], 137);
    assert_eq!(m["instances"][1]["state"], "running");
    let (ok, out, err) = loci(&["deploy", "stop", d.manifest.arg()]);
    assert!(ok && out.contains("stopped"), "{out}{err}");
    let m = d.manifest.read();
    assert_eq!(m["state"], "stopped");
    assert_eq!(strs(&m, "state"), ["stopped", "stopped"]);
    for p in after {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "pid {p} still runs: {stat}"
        );
    }
    let (code, out, err, _) = d.finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("[0] up 0") && out.contains("[1] up 1"),
        "prefixed output: {out}"
    );
    assert!(
        err.contains("instance 1 ended with status 137: restarting"),
        "{err}"
    );
}

#[test]
fn sigint_is_forwarded_to_every_instance() {
    let d = Deploy::start(&["--design", "wim", "--json", "--", "sleep", "60"]);
    d.manifest.until("verified", all_verified);
    // SAFETY: kill(2) on the deployment this test started.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGINT) };
    let (code, out, err, m) = d.finish();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(m["state"], "stopped");
    // --json: the manifest once, when every instance was verified.
    let at_start: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(at_start["state"], "running");
    assert!(all_verified(&at_start), "{at_start:#}");
    assert!(
        err.contains("signal 2 received") && err.contains("status 130: stopped"),
        "{err}"
    );
}

#[test]
fn exits_are_kept_and_failures_restarted_up_to_the_cap() {
    let d = Deploy::start(&["--design", "wim", "--", "sh", "-c", "echo last words"]);
    let (code, out, err, m) = d.finish();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out, "[0] last words\n",
        "the last line of an instance that exits at once"
    );
    assert_eq!(
        (&m["state"], &m["instances"][0]["state"]),
        (&"exited".into(), &"exited".into())
    );
    // A program that always fails: restarted up to the cap, or never.
    for (flag, value, restarts) in [("--max-restarts", "2", 2), ("--restart", "never", 0)] {
        let args = ["--design", "wim", flag, value, "--", "sh", "-c", "exit 3"];
        let (code, _, err, m) = Deploy::start(&args).finish();
        assert_eq!(code, Some(1), "{flag} {value}");
        assert!(err.contains("instance(s) 0 failed"), "{err}");
        assert_eq!(m["state"], "failed");
        assert_eq!(m["instances"][0]["state"], "failed");
        assert_eq!(m["instances"][0]["restarts"], restarts, "{flag} {value}");
        assert_eq!(m["instances"][0]["last_exit"], 3);
    }
}
