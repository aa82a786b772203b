//! Saved topologies (`loci topo --json`, loaded by `--topology FILE.json`): serde's parse of
//! `TopologyJson`, `into_topology` (which validates), then `exercise_topology`: printed back and
//! reloaded unchanged, queried, planned on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loci_topo::TopologyJson;

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<TopologyJson>(data) else {
        return;
    };
    if let Ok(t) = doc.into_topology() {
        loci_fuzz::exercise_topology(&t);
    }
});
