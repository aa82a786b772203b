//! hwloc XML exports (`lstopo --of xml`, `--topology FILE.xml`): `loci_topo::xml::parse`, the
//! text half of `xml::read_file`. An accepted topology goes through `exercise_topology`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = loci_fuzz::text(data);
    if let Ok(t) = loci_topo::xml::parse(&s) {
        loci_fuzz::exercise_topology(&t);
    }
});
