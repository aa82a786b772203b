//! Run inside a multi-node VM (crates/sched/tests/vm.rs): seed 003's locality claim on real nodes.
//! 16 concurrent pipeline requests under LAS and NLS; the node of each task comes from the
//! scheduler's counters (workers have their group's affinity, so the node is real).
//!
//! Checks (`LOCI-CHECK ok|FAIL NAME -- DETAIL`, the loci-vm format; exit 1 if one failed):
//! - `sched/las-separates-requests`: LAS mean main-node share >= 80%, at least 8 of 16 requests
//!   >= 90% on one node, NLS at most 2, and LAS's mean at least 25 points above NLS's.
//!
//! The strict form (every request >= 90% under LAS) is printed as a `LOCI-INFO` line, not
//! asserted: in the TCG VM 4 vCPUs share the host's cores, so a node's vCPU can stall for a host
//! time slice while the others finish their requests and then (by rule 4, as designed) help with
//! its last one, which splits that request.

use loci_sched::workload::{locality_check, LocalityOutcome, PipelineSpec};
use loci_sched::Affinity;

fn main() {
    let spec = PipelineSpec {
        chains: 4,
        buffers: 16,
        buffer_bytes: 16 << 10,
    };
    let mut failed = false;
    let mut report = |name: &str, r: Result<String, String>| match r {
        Ok(d) => println!("LOCI-CHECK ok {name} -- {d}"),
        Err(e) => {
            failed = true;
            println!("LOCI-CHECK FAIL {name} -- {e}");
        }
    };
    let topo = match loci_topo::load(&loci_topo::Source::live()) {
        Ok(t) => t,
        Err(e) => {
            report("sched/topology", Err(e.to_string()));
            std::process::exit(1);
        }
    };
    match locality_check(&topo, Affinity::Group, 16, spec) {
        Err(e) => report("sched/locality-run", Err(e)),
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
            report("sched/locality-run", Ok(detail.clone()));
            let separated = las.mean_share() >= 0.8
                && las.at_least(0.9) >= 8
                && nls.at_least(0.9) <= 2
                && las.mean_share() >= nls.mean_share() + 0.25;
            report(
                "sched/las-separates-requests",
                if separated {
                    Ok(detail.clone())
                } else {
                    Err(format!(
                        "{detail}; LAS {:?}; NLS {:?}",
                        las.shares, nls.shares
                    ))
                },
            );
            match LocalityOutcome::check(&las, &nls, 0.9) {
                Ok(()) => println!(
                    "LOCI-INFO strict: every request >= 90% on one node under LAS -- {detail}"
                ),
                Err(e) => println!("LOCI-INFO strict: not met -- {e}"),
            }
        }
    }
    std::process::exit(i32::from(failed));
}
