//! Multi-node VM test (runs with LOCI_NUMA_VM=1, as scripts/test sets it): on the `4n` VM
//! (4 nodes x 1 cpu, real affinity), 16 concurrent pipeline requests keep at least 90% of EACH
//! request's tasks on one node under LAS, and NLS breaks that bound (at most 2 of 16 requests
//! reach it). The checks: `loci-sched-vm-check`, src/bin/sched.rs.

use std::time::Duration;

#[test]
fn las_locality_on_4_nodes() {
    super::run_checks(
        env!("CARGO_BIN_EXE_loci-sched-vm-check"),
        "4n",
        Duration::from_secs(300),
        &[],
        &[
            "sched/locality-run",
            "sched/las-keeps-each-request",
            "sched/nls-breaks-the-bound",
        ],
    );
}
