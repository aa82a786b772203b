//! `loci deploy` in NUMA VMs (issue 24): `--design win` on `4n` and `cpuless` starts one
//! loci-probe per node with cpus; each probe reports from the inside that its threads run on its
//! node's cpus and its 32 MiB sit on its node (bound), and the supervisor's own check agrees. On
//! `4n`, kill -9 of one instance of a long-running deployment restarts it alone, and the manifest
//! says so.

use serde_json::Value;

const PROBES: &str = r#"
set -e
L="$LOCI_BIN"; P="$PROBE_BIN"; D=$(mktemp -d)
if ! "$L" deploy --design win --manifest "$D/w.json" -- "$P" --threads 1 --hold 500 --alloc 32M > "$D/out" 2> "$D/err"; then
  cat "$D/err" >&2; exit 1
fi
cat "$D/err" >&2
sed -n 's/^\[\([0-9]*\)\] {/PROBE \1 {/p' "$D/out"
echo "MANIFEST $(tr -d '\n' < "$D/w.json")"
"#;

const KILL: &str = r#"
set -e
L="$LOCI_BIN"; D=$(mktemp -d); M="$D/k.json"
# Waits until one snapshot of the manifest ($D/s, written atomically by the supervisor) has 4
# verified instances and one with $1 restarts.
settle() {
  for i in $(seq 300); do
    cp "$M" "$D/s" 2>/dev/null || true
    v=$(grep -c '"threads_on_cpus"' "$D/s" 2>/dev/null || true)
    r=$(grep -c "\"restarts\": $1" "$D/s" 2>/dev/null || true)
    [ "$v" = 4 ] && [ "$r" -ge 1 ] && return 0
    sleep 0.1
  done
  echo "manifest never settled:" >&2; cat "$M" >&2; return 1
}
"$L" deploy --design win --grace 2 --manifest "$M" -- sleep 120 > /dev/null 2> "$D/err" &
S=$!
settle 0
echo "BEFORE $(tr -d '\n' < "$D/s")"
kill -9 $(grep -o '"pid": [0-9]*' "$D/s" | sed -n 3p | tr -dc 0-9)
settle 1
echo "AFTER $(tr -d '\n' < "$D/s")"
"$L" deploy stop "$M" >&2
wait $S
cat "$D/err" >&2
echo "STOPPED $(tr -d '\n' < "$M")"
"#;

use super::{loci_vm as vm, run_script as run, tagged_json as tagged};

fn cpus(v: &Value) -> loci_topo::CpuSet {
    loci_topo::CpuSet::parse(v.as_str().unwrap()).unwrap()
}

/// The VM's nodes that have cpus: those `--design win` gives an instance each, in order.
pub(crate) fn nodes_with_cpus(cfg: &loci_vm::VmConfig) -> Vec<u32> {
    cfg.nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .map(|n| n.id)
        .collect()
}

/// Checks the manifest record `rec` of `who`, the win instance of `node`: on that node, its cpus
/// and memory bound there, and the supervisor's check passed. Returns the record's `verify`
/// object and the node's cpus.
pub(crate) fn assert_win_instance<'a>(
    rec: &'a Value,
    who: &str,
    node: u32,
    cfg: &loci_vm::VmConfig,
) -> (&'a Value, loci_topo::CpuSet) {
    let own = cfg.node_cpus(node);
    assert_eq!(rec["nodes"], node.to_string(), "{who}");
    assert_eq!(cpus(&rec["cpus"]), own, "{who}");
    assert_eq!(rec["mem"], format!("bind:{node}"), "{who}");
    let v = &rec["verify"];
    assert_eq!(v["ok"], true, "supervisor's check of {who}: {rec:#}");
    assert_eq!(v["threads"], v["threads_on_cpus"], "{who}: {v}");
    (v, own)
}

/// One probe per node with cpus, each inside its node: threads, pages and the supervisor's check.
fn probes_on_their_nodes(topology: &str) {
    let vm = vm(topology);
    let cfg = vm.config().unwrap();
    let out = run(&vm, PROBES);
    let with_cpus = nodes_with_cpus(&cfg);
    let m = tagged(&out, "MANIFEST ");
    let inst = m["instances"].as_array().unwrap();
    assert_eq!(
        inst.len(),
        with_cpus.len(),
        "one instance per node with cpus: {m:#}"
    );
    assert_eq!(m["state"], "exited");
    for (i, node) in with_cpus.iter().enumerate() {
        let (_, own) = assert_win_instance(&inst[i], &format!("instance {i}"), *node, &cfg);
        let p = tagged(&out, &format!("PROBE {i} "));
        for t in std::iter::once(&p).chain(p["threads"].as_array().unwrap()) {
            assert!(
                cpus(&t["cpus"]).is_subset(&own),
                "instance {i} thread on {}, node {node} has {own}",
                t["cpus"]
            );
            assert!(
                own.contains(t["cpu"].as_u64().unwrap() as u32),
                "instance {i}: {t}"
            );
        }
        let per = p["alloc"]["pages_per_node"].as_object().unwrap();
        let on: u64 = per
            .get(&node.to_string())
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let total: u64 = per.values().map(|v| v.as_u64().unwrap()).sum();
        assert!(
            total >= 8192 * 9 / 10 && on == total,
            "instance {i}: 32 MiB all on node {node}: {per:?}"
        );
    }
    eprintln!("VM {topology}: {} win instances, each with its threads and 100% of its sampled pages on its node", with_cpus.len());
}

#[test]
fn win_instances_run_and_allocate_on_their_nodes_in_a_4_node_vm() {
    if loci_vm::vm_tests_enabled() {
        probes_on_their_nodes("4n");
    }
}

#[test]
fn win_skips_cpuless_nodes_in_a_vm() {
    if loci_vm::vm_tests_enabled() {
        probes_on_their_nodes("cpuless");
    }
}

#[test]
fn kill_minus_9_restarts_one_instance_in_a_4_node_vm() {
    if !loci_vm::vm_tests_enabled() {
        return;
    }
    let out = run(&vm("4n"), KILL);
    let (before, after) = (tagged(&out, "BEFORE "), tagged(&out, "AFTER "));
    let pid = |m: &Value, i: usize| m["instances"][i]["pid"].as_i64().unwrap();
    assert_eq!(before["instances"].as_array().unwrap().len(), 4);
    for i in [0, 1, 3] {
        assert_eq!(pid(&after, i), pid(&before, i), "instance {i} untouched");
        assert_eq!(after["instances"][i]["restarts"], 0);
    }
    let two = &after["instances"][2];
    assert!(
        pid(&after, 2) != pid(&before, 2) && two["restarts"] == 1 && two["last_exit"] == 137,
        "{two:#}"
    );
    assert_eq!(two["verify"]["ok"], true, "{two:#}");
    assert_eq!(two["state"], "running");
    let stopped = tagged(&out, "STOPPED ");
    assert_eq!(stopped["state"], "stopped");
    assert!(
        stopped["instances"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["state"] == "stopped"),
        "{stopped:#}"
    );
    eprintln!(
        "VM 4n: kill -9 of instance 2 restarted it alone (pid {} -> {}), and stop ended all four",
        pid(&before, 2),
        pid(&after, 2)
    );
}
