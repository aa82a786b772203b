//! The synthetic spec (`--synthetic nodes=4,cores=8,smt=2,...`, `loci_topo::synthetic::build`)
//! and the one-string topology sources (`synthetic:SPEC`, `preset:NAME`, `json:FILE`, ...,
//! `Source::from_str`). A built machine goes through `exercise_topology`: JSON round trip,
//! model queries, planning.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loci_topo::{synthetic, Source};

fuzz_target!(|data: &[u8]| {
    let s = loci_fuzz::text(data);
    // A source string prints back as what it parsed from (up to the `local` alias).
    if let Ok(Source::Preset(name)) = loci_fuzz::parse_round_trip::<Source>(&s) {
        let _ = loci_topo::preset::build(&name);
    }
    if let Ok(t) = synthetic::build(&s) {
        t.validate()
            .unwrap_or_else(|e| panic!("synthetic spec {s:?} builds an invalid topology: {e}"));
        loci_fuzz::exercise_topology(&t);
    }
});
