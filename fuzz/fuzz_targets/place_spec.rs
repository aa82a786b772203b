//! Thread strategies (`--threads compact|sparse|shared:G|random:SEED|group|nodes:L|cpus:L[@BIND]`,
//! `Strategy::from_str`) and memory policies (`--mem interleave:L|bind:L|preferred:N|...`,
//! `MemPolicy::from_str`), parsed, printed back, and planned on small fixed machines.
//!
//! Input: `STRATEGY` alone (also tried as a policy), or `STRATEGY\nPOLICY`; the thread count is
//! taken from the input's length so that the corpus stays plain text.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use loci_place::strategy::place_threads;
use loci_place::{MemPolicy, Plan, Strategy};
use loci_topo::Topology;

/// Machines to plan on: regular 2x4x2 with two LLCs per node, one with a CPU-less and a
/// memoryless node and sparse ids, and a one-node machine without caches.
fn machines() -> &'static [Topology] {
    static M: OnceLock<Vec<Topology>> = OnceLock::new();
    M.get_or_init(|| {
        let mut v = vec![loci_place::testing::regular(2, 4, 2, 2)];
        for spec in [
            "nodes=3,cores=2,smt=2,cpuless=2,memless=1,dist=10:20:30/20:10:30/30:30:10",
            "nodes=1,cores=3,llc=core",
        ] {
            v.push(loci_topo::synthetic::build(spec).expect("fixed spec builds"));
        }
        let mut sparse = loci_topo::Topology::flat(
            loci_topo::CpuSet::parse("1,3,64").unwrap(),
            "fuzz:sparse-ids",
        );
        sparse.cpus[1].allowed = false; // cpu 3 outside the affinity mask
        v.push(sparse);
        v
    })
}

fuzz_target!(|data: &[u8]| {
    let s = loci_fuzz::text(data);
    let (ts, ps) = s.split_once('\n').unwrap_or((&s, &s));
    let n = 1 + data.len() % 20;
    let strategy = loci_fuzz::parse_round_trip::<Strategy>(ts);
    let policy = loci_fuzz::parse_round_trip::<MemPolicy>(ps);
    for t in machines() {
        if let Ok(st) = &strategy {
            for over in [false, true] {
                if let Ok((places, _)) = place_threads(t, st, n, over) {
                    assert_eq!(places.len(), n);
                    let allowed = t.allowed_cpus();
                    for p in &places {
                        assert!(
                            p.cpus.is_subset(&allowed),
                            "{st} -n {n}: a thread bound outside the allowed cpus"
                        );
                    }
                }
            }
        }
        if let Ok(p) = &policy {
            if let Ok((plan, _)) = p.resolve(t) {
                assert!(
                    plan.nodes.is_subset(&t.node_ids()),
                    "{p}: planned on nodes that do not exist"
                );
            }
            if let Ok(st) = &strategy {
                let _ = Plan::new(t, st, n, p, true).map(|plan| plan.to_json());
            }
        }
    }
});
