//! `loci advise` in a 4-node VM (issue 23, item 4): the flowchart's answer for a 4-thread program
//! on `4n` with AutoNUMA on is run exactly as printed, and the program reports from the inside
//! that its threads and pages are where the advice says: thread i on node i mod 4 (sparse) and
//! its buffer interleaved over the four nodes.

use serde_json::Value;

const SCRIPT: &str = r#"
set -e
L="$LOCI_BIN"; P="$PROBE_BIN"; D=$(mktemp -d)
"$L" advise --rules-only -n 4 --json "$D/a.json" -- "$P" --threads 3 --hold 300 --alloc 64M > "$D/a.txt"
cat "$D/a.txt" >&2
line=$(grep -A1 "flowchart's answer" "$D/a.txt" | tail -1)
echo "LINE $line"
set -- $line
shift 2
"$L" run "$@" > "$D/probe.json"
echo "ADVICE $(tr -d '\n' < "$D/a.json")"
echo "PROBE $(tr -d '\n' < "$D/probe.json")"
"#;

use super::{loci_vm, run_script, tagged, tagged_json};

#[test]
fn advised_line_places_threads_and_pages_as_advised_in_a_4_node_vm() {
    if !loci_vm::vm_tests_enabled() {
        return;
    }
    let vm = loci_vm("4n").autonuma(true);
    let cfg = vm.config().unwrap();
    let out = run_script(&vm, SCRIPT);
    let line = tagged(&out, "LINE");
    assert!(
        line.starts_with("loci run --threads sparse -n 4 --mem interleave"),
        "the flowchart's answer on 4 nodes with AutoNUMA on: {line}"
    );
    let advice = tagged_json(&out, "ADVICE");
    let rules: Vec<&str> = advice["params"]["advice"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    assert!(
        rules.contains(&"autonuma-root"),
        "root in the VM with AutoNUMA on: {rules:?}"
    );

    let probe = tagged_json(&out, "PROBE");
    let node_of = |cpus: &Value| {
        let set = loci_topo::CpuSet::parse(cpus.as_str().unwrap()).unwrap();
        let nodes: Vec<u32> = (0..4)
            .filter(|&n| !cfg.node_cpus(n).intersection(&set).is_empty())
            .collect();
        assert_eq!(
            nodes.len(),
            1,
            "a sparse thread is bound inside one node: {set}"
        );
        nodes[0]
    };
    assert_eq!(
        node_of(&probe["cpus"]),
        0,
        "main thread = plan thread 0: {probe}"
    );
    let threads = probe["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 3);
    for t in threads {
        let i = t["index"].as_u64().unwrap() as u32;
        assert_eq!(node_of(&t["cpus"]), i % 4, "thread {i}: {t}");
        assert_eq!(t["mempolicy"]["policy"], "interleave", "thread {i}: {t}");
    }
    let per = probe["alloc"]["pages_per_node"].as_object().unwrap();
    let total: u64 = per.values().map(|v| v.as_u64().unwrap()).sum();
    assert!(total >= 16384 * 9 / 10, "64 MiB touched: {per:?}");
    for n in 0..4 {
        let pages = per.get(&n.to_string()).and_then(Value::as_u64).unwrap_or(0);
        let share = pages as f64 / total as f64;
        assert!(
            (0.2..0.3).contains(&share),
            "node {n} holds {share:.3} of the interleaved buffer: {per:?}"
        );
    }
    eprintln!("VM 4n: the advised line `{line}` placed threads on nodes 0,1,2,3 and the buffer interleaved: {per:?}");
}
