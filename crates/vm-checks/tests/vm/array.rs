//! loci-array's real placement in the NUMA VMs (scripts/numa-vm), checked by
//! `loci-array-vm-check` (src/bin/array.rs): chunk pages on their home nodes, threads on their
//! planned cpus, local-access ratio of the data-aware pinning. Runs only with LOCI_NUMA_VM=1
//! (scripts/test sets it when the VM harness can run).

use std::collections::BTreeSet;
use std::time::Duration;

use loci_vm::{vm_tests_enabled, NumaVm};

const CHECK: &str = env!("CARGO_BIN_EXE_loci-array-vm-check");

fn suite(topology: &str, args: &[&str], want: &[String]) {
    if !vm_tests_enabled() {
        return;
    }
    let out = NumaVm::new(topology)
        .timeout(Duration::from_secs(400))
        .run(CHECK, args)
        .unwrap_or_else(|e| panic!("{e}"));
    // The measured notes (ratios, pool reuse, pages per node) for the test log.
    for l in out.stdout.lines().filter(|l| l.starts_with('#')) {
        println!("VM {topology}: {l}");
    }
    let report = out.checks();
    let ran: BTreeSet<&str> = report.names().into_iter().collect();
    for want in want {
        assert!(
            ran.contains(want.as_str()),
            "VM {topology}: check {want} did not run"
        );
    }
    report.print_and_assert();
}

/// The checks of a full run on `nodes` nodes.
fn full(nodes: u32) -> Vec<String> {
    let mut want: Vec<String> = [
        "array/bind/pages-on-home",
        "array/first-touch/pages-on-generator-node",
        "array/subarray/home/threads-where-planned",
        "array/subarray/home/local-access>=0.95",
        "array/subarray/search/threads-where-planned",
        "array/subarray/search/local-access>=0.95",
        "array/subarray/equals-reference",
        "array/pool/reuse-same-node",
        "array/pool/never-across-nodes",
        "array/pool/spread-binding-pages-where-planned",
    ]
    .map(String::from)
    .to_vec();
    want.extend(team(nodes));
    want
}

/// The copy team's checks on `nodes` nodes.
fn team(nodes: u32) -> Vec<String> {
    (0..nodes)
        .map(|n| format!("array/team/node{n}/parts-and-pages-on-callers-node"))
        .collect()
}

#[test]
fn vm_4n() {
    suite("4n", &["64"], &full(4));
}

#[test]
fn vm_8n() {
    suite("8n", &["64"], &full(8));
}

/// Two cpus per node: the caller's helper is on its node, and takes part.
#[test]
fn vm_2n_team() {
    suite("2n", &["64", "team"], &team(2));
}
