//! Real placement in the NUMA VMs (scripts/numa-vm): chunk pages on their home nodes, threads on
//! their planned cpus, local-access ratio of the data-aware pinning. Runs only with
//! LOCI_NUMA_VM=1 (scripts/test sets it when the VM harness can run).

use std::collections::BTreeSet;
use std::time::Duration;

use loci_vm::{vm_tests_enabled, NumaVm};

const CHECK: &str = env!("CARGO_BIN_EXE_loci-array-vm-check");

fn suite(topology: &str) {
    if !vm_tests_enabled() {
        return;
    }
    let out = NumaVm::new(topology)
        .timeout(Duration::from_secs(400))
        .run(CHECK, &["64"])
        .unwrap_or_else(|e| panic!("{e}"));
    // The measured notes (ratios, pool reuse, pages per node) for the test log.
    for l in out.stdout.lines().filter(|l| l.starts_with('#')) {
        println!("VM {topology}: {l}");
    }
    let report = out.checks();
    let ran: BTreeSet<&str> = report.names().into_iter().collect();
    for want in [
        "array/bind/pages-on-home",
        "array/first-touch/pages-on-generator-node",
        "array/subarray/home/threads-where-planned",
        "array/subarray/home/local-access>=0.95",
        "array/subarray/equals-reference",
        "array/pool/reuse-same-node",
        "array/pool/never-across-nodes",
        "array/pool/spread-binding-pages-where-planned",
    ] {
        assert!(
            ran.contains(want),
            "VM {topology}: check {want} did not run"
        );
    }
    report.print_and_assert();
}

#[test]
fn vm_4n() {
    suite("4n");
}

#[test]
fn vm_8n() {
    suite("8n");
}
