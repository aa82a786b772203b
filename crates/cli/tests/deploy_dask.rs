//! `loci deploy dask` end to end: dry runs on presets (workers, threads, memory limits, names, the
//! scheduler instance), bad inputs refused before anything starts, and with the Dask set of
//! bench/peers (installed by the test through `bench/peers/setup --dask`; a test skips with a note
//! when it cannot be installed): a real WIC cluster of 2 workers that computes right answers, is
//! listed by `status`, restarts only the worker killed with -9 and is ended by `stop`; and two
//! network namespaces standing for two machines, the second joining the first's scheduler.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

mod common;
use common::{
    all_verified, dask_python, deploy_fails_before_start, loci, loci_json_after, loci_report,
    output_of, pids, repo_root, Manifest, Netns,
};

/// A dry run's manifest.
fn plan(args: &[&str]) -> Value {
    loci_json_after(&["deploy", "dask", "--dry-run", "--json"], args)
}

fn words(v: &Value) -> Vec<String> {
    serde_json::from_value(v.clone()).unwrap()
}

/// The value after `flag` in an instance's command.
fn flag(inst: &Value, flag: &str) -> String {
    let c = words(&inst["command"]);
    let i = c
        .iter()
        .position(|w| w == flag)
        .unwrap_or_else(|| panic!("no {flag} in {c:?}"));
    c[i + 1].clone()
}

#[test]
fn dry_run_lays_out_one_worker_per_node_and_an_unpinned_scheduler() {
    let m = plan(&["--design", "win", "--preset", "xeon-e5-4660v4-4s"]);
    let inst = m["instances"].as_array().unwrap();
    assert_eq!(inst.len(), 5, "4 workers and the scheduler");
    assert_eq!(m["dask"]["scheduler"], "tcp://127.0.0.1:8786");
    assert_eq!(m["dask"]["scheduler_instance"], 4);
    for (i, w) in inst[..4].iter().enumerate() {
        let c = words(&w["command"]);
        assert_eq!(&c[1..3], ["worker", "tcp://127.0.0.1:8786"], "{c:?}");
        // 16 cores x 2 hardware threads per node, 32 GiB per node.
        assert_eq!(flag(w, "--nthreads"), "32");
        assert_eq!(flag(w, "--memory-limit"), (32u64 << 30).to_string());
        assert_eq!(flag(w, "--name"), format!("w{i}-node{i}@127.0.0.1"));
        assert_eq!(flag(w, "--worker-port"), (8788 + i).to_string());
        assert!(c.contains(&"--no-nanny".to_string()));
        let run = words(&w["run"]);
        let node = format!("nodes:{i}");
        let bind = format!("bind:{i}");
        assert_eq!(
            &run[1..9],
            ["run", "--threads", &node, "-n", "1", "--mem", &bind, "--"]
        );
        assert_eq!(m["dask"]["workers"][i], flag(w, "--name"));
    }
    let s = &inst[4];
    assert_eq!(s["index"], 4);
    assert_eq!(&words(&s["command"])[1..2], ["scheduler"]);
    assert_eq!(flag(s, "--port"), "8786");
    assert_eq!(flag(s, "--dashboard-address"), "127.0.0.1:8787");
    let run = words(&s["run"]);
    assert_eq!(
        &run[1..6],
        ["run", "--threads", "os", "--mem", "first-touch"]
    );
    // The text form says where the scheduler is.
    let (ok, out, err) = loci(&[
        "deploy",
        "dask",
        "--design",
        "win",
        "--preset",
        "xeon-e5-4660v4-4s",
        "--dry-run",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("dask: scheduler tcp://127.0.0.1:8786 (instance 4 of 5, started here)")
            && out.contains("0 w0-node0@127.0.0.1"),
        "{out}"
    );
}

#[test]
fn dry_run_wic_shares_node_memory_and_joining_starts_no_scheduler() {
    let m = plan(&[
        "--design",
        "wic",
        "--preset",
        "xeon-e5-4660v4-4s",
        "--scheduler",
        "tcp://10.1.2.3:9000",
        "--host",
        "10.1.2.4",
        "--nthreads",
        "1",
    ]);
    let inst = m["instances"].as_array().unwrap();
    assert_eq!(inst.len(), 64, "one worker per core, no scheduler");
    assert_eq!(m["dask"]["scheduler_instance"], Value::Null);
    assert_eq!(m["dask"]["scheduler"], "tcp://10.1.2.3:9000");
    let w = &inst[17];
    assert_eq!(flag(w, "--nthreads"), "1");
    // 16 cores per node share its 32 GiB.
    assert_eq!(flag(w, "--memory-limit"), (2u64 << 30).to_string());
    assert_eq!(flag(w, "--name"), "w17-node1@10.1.2.4");
    assert_eq!(flag(w, "--host"), "10.1.2.4");
    assert!(words(&w["command"]).contains(&"tcp://10.1.2.3:9000".to_string()));
    // CPU-less nodes get no worker.
    let m = plan(&["--synthetic", "nodes=4,cores=2,cpuless=3"]);
    assert_eq!(m["dask"]["workers"].as_array().unwrap().len(), 3);
    assert!(m["notes"].to_string().contains("node 3 has no cpus"));
}

/// An executable shell script in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn bad_inputs_fail_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("m.json");
    let man = man.to_str().unwrap();
    // A `dask` without `distributed` (its `scheduler` command fails), and one that passes the check.
    let no_distributed = script(
        dir.path(),
        "dask-bare",
        "#!/bin/sh\necho \"No such command '$1'\" >&2; exit 2\n",
    );
    let fake = script(dir.path(), "dask-fake", "#!/bin/sh\nexit 0\n");
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port().to_string();
    // A port nothing listens on: bound, then closed.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = format!("127.0.0.1:{closed}");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--scheduler", "nonsense"],
            vec!["--scheduler nonsense", "no port", "tcp://HOST:PORT"],
        ),
        (
            vec!["--scheduler", "udp://a:1"],
            vec!["`udp` is not supported"],
        ),
        (
            vec!["--scheduler", "a:70000"],
            vec!["`70000` is not a port"],
        ),
        (
            vec!["--scheduler", &closed],
            vec!["nothing answers", "start the scheduler first"],
        ),
        (vec!["--nthreads", "0"], vec!["valid: auto"]),
        (vec!["--design", "wix"], vec!["wim", "win", "wic"]),
        (
            vec!["--instances", "999"],
            vec!["--instances 999", "valid: 1-"],
        ),
        (
            vec!["--dask", "/no/such/dask"],
            vec!["/no/such/dask", "bench/peers/setup --dask"],
        ),
        (
            vec!["--dask", &no_distributed],
            vec!["`distributed`", "bench/peers/setup --dask"],
        ),
        (
            vec!["--dask", &fake, "--scheduler-port", &busy_port],
            vec!["--scheduler-port", "in use"],
        ),
        (
            vec!["--dask", &fake, "--host", "203.0.113.9"],
            vec!["203.0.113.9", "not an address of this machine"],
        ),
        (
            vec!["--preset", "xeon-gold-6346-2s", "--dask", &fake],
            vec!["--dry-run"],
        ),
        (
            vec!["--dask", &fake, "--dry-run", "--scheduler-port", "65534"],
            vec!["--scheduler-port 65534", "give --port-base"],
        ),
    ];
    for (args, want) in &cases {
        deploy_fails_before_start(&["deploy", "dask"], man, args, want);
    }
    drop(busy);
}

/// A `loci deploy dask` running in the background (in a network namespace when `netns` is set),
/// stopped on drop.
struct Deploy {
    child: Option<Child>,
    manifest: Manifest,
}

impl Deploy {
    fn start(netns: Option<&str>, dir: &Path, name: &str, args: &[&str]) -> Deploy {
        let manifest = dir.join(format!("{name}.json"));
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_loci")]);
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_loci")),
        };
        let child = cmd
            .args(["deploy", "dask", "--grace", "5", "--manifest"])
            .arg(&manifest)
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
            .spawn()
            .unwrap();
        Deploy {
            child: Some(child),
            // Python starts slowly on a busy host.
            manifest: Manifest {
                path: manifest,
                wait: Duration::from_secs(60),
            },
        }
    }

    fn stop(&mut self) -> (bool, String) {
        let (ok, out, err) = loci(&["deploy", "stop", self.manifest.arg()]);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        (ok, out + &err)
    }
}

impl Drop for Deploy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on the supervisor this test started; it stops its instances.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

/// bench/deploy/deploy.py check against `scheduler` (in `netns` if set): the cluster's workers
/// and its answers next to pandas' on the same data.
fn check(py: &Path, netns: Option<&str>, scheduler: &str, workers: usize) -> Value {
    let driver = repo_root().join("bench/deploy/deploy.py");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(py);
            c
        }
        None => Command::new(py),
    };
    cmd.arg(driver)
        .args([
            "check",
            "--scheduler",
            scheduler,
            "--workers",
            &workers.to_string(),
        ])
        .args(["--rows", "200000", "--parts", "6", "--wait", "90"])
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let out = output_of(&mut cmd).unwrap_or_else(|e| panic!("deploy.py check: {e}"));
    serde_json::from_slice(&out).unwrap()
}

/// Both workloads right and every worker answered its pinned task; the workers' names.
fn assert_correct(c: &Value) -> Vec<String> {
    for w in ["groupby", "join"] {
        assert_eq!(c[w]["correct"], true, "{w}: {c:#}");
    }
    let pinned = c["pinned_tasks_correct"].as_object().unwrap();
    assert!(pinned.values().all(|v| v == true), "{c:#}");
    let mut names: Vec<String> = pinned.keys().cloned().collect();
    names.sort();
    names
}

/// A free TCP port on loopback (bound, then closed) and the next `n` ones free too.
fn free_ports(n: u16) -> u16 {
    for _ in 0..50 {
        let p = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p < 60000 && (0..=n).all(|k| TcpListener::bind(("127.0.0.1", p + k)).is_ok()) {
            return p;
        }
    }
    panic!("no run of {n} free ports");
}

#[test]
fn wic_cluster_computes_restarts_the_killed_worker_alone_and_stops() {
    let Some(py) = dask_python() else { return };
    let cores = plan(&["--design", "wic"])["dask"]["workers"]
        .as_array()
        .unwrap()
        .len();
    if cores < 2 {
        eprintln!("NOTE: skipped: needs 2 allowed cores for two wic workers");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_ports(3);
    let ps = port.to_string();
    let mut d = Deploy::start(
        None,
        dir.path(),
        "wic",
        &[
            "--design",
            "wic",
            "--instances",
            "2",
            "--scheduler-port",
            &ps,
        ],
    );
    let m = d
        .manifest
        .until("2 workers and the scheduler verified", all_verified);
    assert_eq!(m["instances"].as_array().unwrap().len(), 3);
    let sched = format!("tcp://127.0.0.1:{port}");
    assert_eq!(m["dask"]["scheduler"], sched.as_str());
    let c = check(&py, None, &sched, 2);
    let names = assert_correct(&c);
    assert_eq!(names, ["w0-node0@127.0.0.1", "w1-node0@127.0.0.1"]);
    // Each worker, asked from the inside, runs on its instance's cpus with its --nthreads.
    for w in c["workers"].as_object().unwrap().values() {
        let i: usize = w["name"].as_str().unwrap()[1..2].parse().unwrap();
        let inst = &m["instances"][i];
        assert_eq!(w["pid"], inst["pid"], "{w} vs {inst}");
        let cpus: Vec<u32> = serde_json::from_value(w["cpus"].clone()).unwrap();
        let want: Vec<u32> = loci_topo::CpuSet::parse(inst["cpus"].as_str().unwrap())
            .unwrap()
            .iter()
            .collect();
        assert_eq!(cpus, want, "worker {i}");
        assert_eq!(w["nthreads"].as_u64().unwrap() as usize, want.len());
    }
    let (ok, out, err) = loci(&["deploy", "status", d.manifest.arg()]);
    assert!(
        ok && out.contains(&format!(
            "dask: scheduler {sched} (instance 2 of 3, started here)"
        )) && out.contains("0 w0-node0@127.0.0.1, 1 w1-node0@127.0.0.1")
            && out.contains("instance 1: running"),
        "{out}{err}"
    );
    let before = pids(&m);
    // SAFETY: kill(2) on a worker this test's deployment started.
    unsafe { libc::kill(before[1] as i32, libc::SIGKILL) };
    let m = d.manifest.until("worker 1 restarted and verified", |m| {
        m["instances"][1]["restarts"] == 1 && m["instances"][1]["verify"]["ok"] == true
    });
    let after = pids(&m);
    assert_eq!(
        (after[0], after[2]),
        (before[0], before[2]),
        "worker 0 and the scheduler untouched"
    );
    assert_ne!(after[1], before[1]);
    assert_eq!(m["instances"][1]["last_exit"], 137);
    // The restarted worker joins again under its name, and the cluster answers right.
    let c = check(&py, None, &sched, 2);
    assert_eq!(assert_correct(&c), names);
    let (ok, out) = d.stop();
    assert!(ok && out.contains("stopped"), "{out}");
    let m = d.manifest.read();
    assert_eq!(m["state"], "stopped");
    for p in after {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "pid {p} still runs: {stat}"
        );
    }
}

#[test]
fn two_namespaces_standing_for_two_machines_form_one_cluster() {
    let Some(py) = dask_python() else { return };
    let ns = match Netns::new("D", 232) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("NOTE: skipped: creating network namespaces needs root and iproute2 ({e})");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (ns.names[0].as_str(), ns.names[1].as_str());
    let sched = format!("tcp://{}:8786", ns.ips[0]);
    // Machine A: scheduler and one worker per node; machine B joins it with one per core.
    let mut da = Deploy::start(
        Some(a),
        dir.path(),
        "a",
        &["--design", "win", "--host", &ns.ips[0]],
    );
    let ma = da.manifest.until("machine A verified", all_verified);
    // B checks that A's scheduler answers: wait until it listens (it writes its scheduler file).
    let file = dir.path().join("a.dask/scheduler.json");
    da.manifest.until("A's scheduler file", |_| file.exists());
    let mut db = Deploy::start(
        Some(b),
        dir.path(),
        "b",
        &["--design", "wic", "--scheduler", &sched],
    );
    let mb = db.manifest.until("machine B verified", all_verified);
    let na = ma["dask"]["workers"].as_array().unwrap().len();
    let nb = mb["dask"]["workers"].as_array().unwrap().len();
    assert_eq!(
        mb["dask"]["scheduler_instance"],
        Value::Null,
        "B starts no scheduler"
    );
    assert_eq!(mb["instances"].as_array().unwrap().len(), nb);
    let c = check(&py, Some(a), &sched, na + nb);
    let names = assert_correct(&c);
    let on = |ip: &str| {
        names
            .iter()
            .filter(|n| n.ends_with(&format!("@{ip}")))
            .count()
    };
    assert_eq!((on(&ns.ips[0]), on(&ns.ips[1])), (na, nb), "{names:?}");
    for w in c["workers"].as_object().unwrap().keys() {
        assert!(
            w.contains(&ns.ips[0]) || w.contains(&ns.ips[1]),
            "worker address {w}"
        );
    }
    eprintln!(
        "two namespaces: one cluster of {} workers ({names:?}), answers equal pandas'",
        na + nb
    );
    let (ok, out) = db.stop();
    assert!(ok, "{out}");
    let (ok, out) = da.stop();
    assert!(ok, "{out}");
}

#[test]
fn bench_deploy_answers_alike_under_every_design() {
    if dask_python().is_none() {
        return;
    }
    let port = free_ports(8).to_string();
    let (out, rep) = loci_report(&[
        "bench",
        "deploy",
        "--quick",
        "--rows",
        "100000",
        "--warm",
        "0",
        "--scheduler-port",
        &port,
    ]);
    assert_eq!(rep["workload"], "deploy");
    let rows = rep["results"].as_array().unwrap();
    for d in ["wim", "win", "wic"] {
        for case in ["groupby", "join", "deploy to verified", "deploy to joined"] {
            let r = rows
                .iter()
                .find(|r| r["config"]["design"] == d && r["case"] == case)
                .unwrap_or_else(|| panic!("no {d} {case} row: {rep:#}"));
            assert!(r["median_s"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
    let answers = rep["params"]["answers"].as_str().unwrap();
    assert!(
        answers.starts_with("equal across wim, win, wic"),
        "{answers}"
    );
    assert!(
        out.contains("deploy groupby win: median") && out.contains("x wim's time"),
        "{out}"
    );
}
