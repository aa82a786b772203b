//! Multi-node VM test (runs with LOCI_NUMA_VM=1, as scripts/test sets it): on the `4n` VM
//! (4 nodes x 1 cpu, real affinity), 16 concurrent pipeline requests keep at least 90% of EACH
//! request's tasks on one node under LAS, and NLS breaks that bound (at most 2 of 16 requests
//! reach it). The checks: `loci-sched-vm-check`, src/bin/sched.rs.

use std::time::Duration;

#[test]
fn las_locality_on_4_nodes() {
    if !loci_vm::vm_tests_enabled() {
        return;
    }
    let check = env!("CARGO_BIN_EXE_loci-sched-vm-check");
    let out = loci_vm::NumaVm::new("4n")
        .timeout(Duration::from_secs(300))
        .run(check, &[] as &[&str])
        .unwrap_or_else(|e| panic!("{e}"));
    let report = out.checks();
    for line in out
        .stdout
        .lines()
        .filter(|l| l.starts_with("LOCI-INFO") || l.starts_with('#'))
    {
        println!("VM 4n {line}");
    }
    for name in [
        "sched/locality-run",
        "sched/las-keeps-each-request",
        "sched/nls-breaks-the-bound",
    ] {
        assert!(
            out.stdout.contains(name),
            "check {name} did not run:\n{}",
            out.stdout
        );
    }
    report.print_and_assert();
}
