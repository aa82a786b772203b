//! `loci-sched-vm-check`: seed 003's locality claim on real nodes (run inside a multi-node VM of
//! loci-vm by tests/vm/sched.rs). 16 concurrent pipeline requests under LAS and NLS; the node of
//! each task comes from the scheduler's counters (workers have their group's affinity, so the node
//! is real).
//!
//! Checks (one `LOCI-CHECK` line each, printed by loci-vm's `Checker`, the measured shares as a
//! `# NAME: DETAIL` line after a passed check and as `LOCI-INFO`; exit 1 if one failed):
//! - `sched/locality-run`: both runs completed with the right checksums.
//! - `sched/las-keeps-each-request`: under LAS every one of the 16 requests ran at least 90% of
//!   its tasks on one node (the bound, per request).
//! - `sched/nls-breaks-the-bound`: under NLS the bound fails clearly: at most 2 of the 16
//!   requests reach 90% on one node.

use loci_sched::workload::{locality_check, LocalityOutcome, PipelineSpec};
use loci_sched::Affinity;
use loci_vm::Checker;

fn main() {
    let spec = PipelineSpec {
        chains: 4,
        buffers: 16,
        buffer_bytes: 16 << 10,
    };
    let mut c = Checker::new();
    let topo = match loci_topo::load(&loci_topo::Source::live()) {
        Ok(t) => t,
        Err(e) => {
            c.check("sched/topology", || Err(e.to_string()));
            std::process::exit(c.exit_code());
        }
    };
    match locality_check(&topo, Affinity::Group, 16, spec) {
        Err(e) => c.check("sched/locality-run", || Err(e)),
        Ok([las, nls]) => {
            let summary = |o: &LocalityOutcome| {
                format!(
                    "{}: min {:.1}% mean {:.1}%, {} of {} requests >= 90% on one node",
                    o.policy.name(),
                    100.0 * o.min_share(),
                    100.0 * o.mean_share(),
                    o.at_least(0.9),
                    o.shares.len()
                )
            };
            let detail = format!("{}; {}", summary(&las), summary(&nls));
            println!("LOCI-INFO {detail}");
            c.check("sched/locality-run", || Ok(()));
            c.check_noted("sched/las-keeps-each-request", || {
                if las.min_share() >= 0.9 {
                    Ok(summary(&las))
                } else {
                    Err(format!("{}; LAS {:?}", summary(&las), las.shares))
                }
            });
            c.check_noted("sched/nls-breaks-the-bound", || {
                if nls.at_least(0.9) <= 2 {
                    Ok(summary(&nls))
                } else {
                    Err(format!("{}; NLS {:?}", summary(&nls), nls.shares))
                }
            });
        }
    }
    std::process::exit(c.exit_code());
}
