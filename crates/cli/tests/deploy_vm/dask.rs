//! `loci deploy dask` in NUMA VMs (issue 24). Python and Dask come from the host's root
//! filesystem (read-only in the VM; bench/peers/.venv, installed by `bench/peers/setup --dask`):
//! nothing is written to the venv (PYTHONDONTWRITEBYTECODE, Dask's config and temporary files in
//! the deployment's directory under the VM's /tmp).
//!
//! On `4n`, `--design win` starts 4 workers: each worker's threads run on its node's cpus (the
//! supervisor's check from /proc, and the worker's own affinity read from inside it), its pages sit
//! on its node (100% of its anonymous pages, `loci deploy status --json` after the workloads ran),
//! and the group-by and join answers equal pandas' and those of a WIM deployment. On `cpuless`,
//! only the nodes with cpus get workers.

use std::time::Duration;

use serde_json::Value;

use super::common::{dask_python, repo_root};
use super::deploy_vm::{assert_win_instance, nodes_with_cpus};
use super::{loci_vm as vm, run_script as run, tagged_json as tagged};

/// Deploys `design` in the VM, waits for $2 workers, answers both workloads with
/// bench/deploy/deploy.py check, takes `status --json`, and stops.
const CLUSTER: &str = r#"
set -e
export PYTHONDONTWRITEBYTECODE=1
ip link set lo up
L="$LOCI_BIN"; D=$(mktemp -d)
cluster() {
  "$L" deploy dask --design "$1" --grace 5 --manifest "$D/$1.json" > "$D/$1.out" 2> "$D/$1.err" &
  S=$!
  if ! "$DASK_PY" "$DASK_DRIVER" check --scheduler tcp://127.0.0.1:8786 --workers "$2" \
       --rows 100000 --parts 4 --wait 600 > "$D/$1.check" 2> "$D/$1.checkerr"; then
    cat "$D/$1.err" "$D/$1.checkerr" >&2; kill $S; exit 1
  fi
  "$L" deploy status --json "$D/$1.json" > "$D/$1.status"
  "$L" deploy stop "$D/$1.json" >&2
  wait $S || true
  grep -v '^\[' "$D/$1.err" >&2 || true
  echo "CHECK-$1 $(tr -d '\n' < "$D/$1.check")"
  echo "STATUS-$1 $(tr -d '\n' < "$D/$1.status")"
}
cluster win "$WIN_WORKERS"
if [ -n "$WITH_WIM" ]; then cluster wim 1; fi
"#;

/// Runs the cluster script on `topology`; checks every WIN worker against its node and returns
/// (the WIN check, the WIM check when asked for); `None` when Dask is not installed.
fn win_workers_on_their_nodes(topology: &str, with_wim: bool) -> Option<(Value, Option<Value>)> {
    let py = dask_python()?;
    let vm = vm(topology)
        .timeout(Duration::from_secs(1800))
        .mem_per_node("1G");
    let cfg = vm.config().unwrap();
    let nodes = nodes_with_cpus(&cfg);
    let vm = vm
        .env("DASK_PY", py.to_str().unwrap())
        .env(
            "DASK_DRIVER",
            repo_root().join("bench/deploy/deploy.py").to_str().unwrap(),
        )
        .env("WIN_WORKERS", &nodes.len().to_string())
        .env("WITH_WIM", if with_wim { "1" } else { "" });
    let out = run(&vm, CLUSTER);
    let status = tagged(&out, "STATUS-win ");
    let check = tagged(&out, "CHECK-win ");
    let inst = status["instances"].as_array().unwrap();
    assert_eq!(
        inst.len(),
        nodes.len() + 1,
        "a worker per node with cpus and the scheduler: {status:#}"
    );
    assert_eq!(status["dask"]["scheduler_instance"], nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        // Taken by `status` after the workloads: every thread of the worker, all its pages.
        let (v, _) = assert_win_instance(&inst[i], &format!("worker {i}"), *node, &cfg);
        assert!(
            v["threads"].as_u64().unwrap() > 1,
            "worker {i}: a Dask worker has several threads: {v}"
        );
        assert_eq!(v["remote_share"], 0.0, "worker {i}: {v}");
        let per = v["anon_bytes"].as_object().unwrap();
        let total: u64 = per.values().map(|b| b.as_u64().unwrap()).sum();
        let on = per
            .get(&node.to_string())
            .and_then(Value::as_u64)
            .unwrap_or(0);
        assert!(
            total > 8 << 20 && on == total,
            "worker {i}: all of its pages on node {node}: {per:?}"
        );
    }
    // From inside each worker: its affinity is its node's cpus, and it is the manifest's pid.
    let workers = check["workers"].as_object().unwrap();
    assert_eq!(workers.len(), nodes.len());
    for w in workers.values() {
        let name = w["name"].as_str().unwrap();
        let i: usize = name[1..name.find('-').unwrap()].parse().unwrap();
        assert_eq!(name, format!("w{i}-node{}@127.0.0.1", nodes[i]));
        assert_eq!(w["pid"], inst[i]["pid"], "{name}");
        let seen: Vec<u32> = serde_json::from_value(w["cpus"].clone()).unwrap();
        assert_eq!(
            seen,
            cfg.node_cpus(nodes[i]).iter().collect::<Vec<_>>(),
            "{name}"
        );
    }
    for wl in ["groupby", "join"] {
        assert_eq!(check[wl]["correct"], true, "{wl}: {check:#}");
    }
    eprintln!(
        "VM {topology}: {} Dask workers under win, each with its threads on its node's cpus and 100% of its pages on its node; answers equal pandas'",
        nodes.len()
    );
    let wim = with_wim.then(|| tagged(&out, "CHECK-wim "));
    Some((check, wim))
}

#[test]
fn dask_win_workers_sit_on_their_nodes_and_answer_as_wim_in_a_4_node_vm() {
    if !loci_vm::vm_tests_enabled() {
        return;
    }
    let Some((win, Some(wim))) = win_workers_on_their_nodes("4n", true) else {
        return;
    };
    assert_eq!(wim["workers"].as_object().unwrap().len(), 1);
    for wl in ["groupby", "join"] {
        assert_eq!(
            win[wl]["hash"], wim[wl]["hash"],
            "{wl}: win and wim answer alike"
        );
        assert_eq!(wim[wl]["correct"], true);
    }
    eprintln!("VM 4n: the Dask answers of win (4 workers) equal wim's (1 worker)");
}

#[test]
fn dask_win_skips_cpuless_nodes_in_a_vm() {
    if loci_vm::vm_tests_enabled() {
        win_workers_on_their_nodes("cpuless", false);
    }
}
