//! Engine placement on a real 4-node kernel (loci-vm): runs `loci-engine-vm-check`
//! (src/bin/engine.rs) on 16 Mi rows in the `4n` VM. `per-node` morsels processed under LAS
//! (loci-sched) with strict locality (`stay_on_node` requests) must give a local-access ratio of
//! at least 0.95 in every pass (the default balanced mode's ratios are printed); a table
//! first-touched by one generating task sits on one node, so a static split over workers on all 4
//! nodes reads 0.25 locally (within 0.02) and NLS at most 0.6 (LAS is reported); every answer must
//! equal the single-thread reference. Runs only with `LOCI_NUMA_VM=1` (scripts/test).

use std::time::Duration;

#[test]
fn engine_placement_on_4_nodes() {
    if !loci_vm::vm_tests_enabled() {
        return;
    }
    let check = env!("CARGO_BIN_EXE_loci-engine-vm-check");
    let out = loci_vm::NumaVm::new("4n")
        .timeout(Duration::from_secs(400))
        .run(check, &["16777216"])
        .unwrap_or_else(|e| panic!("{e}"));
    let report = out.checks();
    for name in [
        "engine/per-node/pages-on-home",
        "engine/per-node/strict/local-access>=0.95",
        "engine/per-node/answer",
        "engine/one-thread/pages-on-generator-node",
        "engine/one-thread/local-access-about-1/k",
        "engine/one-thread/answer",
    ] {
        assert!(
            report.names().contains(&name),
            "check {name} did not run:\n{}",
            out.stdout
        );
    }
    println!("{}", out.stdout);
    report.print_and_assert();
}
