//! cpu/node lists: `IdSet::parse` (`0-3,8,10-11`, strides `0-7:2`), `parse_in` with a universe
//! (`all`, `!LIST`), the kernel hex masks of `parse_mask` (`ff,00000003`), hwloc bitmaps
//! (`0x000000ff,0xffffffff`), and the typed `CpuSet` wrapper (`NodeSet` is the same macro) with
//! its JSON form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loci_topo::{xml::parse_hwloc_bitmap, CpuSet, IdSet};

/// Prints `set` as a list and as a hex mask; both must parse back to `set`.
fn roundtrip(set: &IdSet, from: &str) {
    let printed = set.to_string();
    let back = IdSet::parse(&printed)
        .unwrap_or_else(|e| panic!("{from:?} parsed, but its print {printed:?} does not: {e}"));
    assert_eq!(&back, set, "{from:?} -> {printed:?} parses to another set");
    if let Some(last) = set.last() {
        let mut words = vec![0u32; last as usize / 32 + 1];
        for id in set.iter() {
            words[id as usize / 32] |= 1 << (id % 32);
        }
        // Most significant 32-bit word first, as the kernel prints `Cpus_allowed`.
        let words: Vec<String> = words.iter().rev().map(|w| format!("{w:08x}")).collect();
        let mask = words.join(",");
        let back = IdSet::parse_mask(&mask)
            .unwrap_or_else(|e| panic!("mask {mask:?} of {printed:?} does not parse: {e}"));
        assert_eq!(
            &back, set,
            "mask {mask:?} of {printed:?} parses to another set"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let s = loci_fuzz::text(data);
    let plain = IdSet::parse(&s);
    if let Ok(set) = &plain {
        roundtrip(set, &s);
        // The typed sets and their JSON form (a list string) agree with the plain parse.
        let c = CpuSet::parse(&s).expect("CpuSet parses what IdSet parses");
        assert_eq!(&c.0, set);
        let json = serde_json::to_string(&c).expect("a CpuSet serializes");
        let back: CpuSet = serde_json::from_str(&json).expect("a CpuSet's JSON parses back");
        assert_eq!(back, c);
    }
    // With a universe: a plain list means the same as without one; `all`/`!` stay inside it.
    // (Few universes: each is one more parse, and a 65536-id set costs ~0.1 s under coverage.)
    for universe in ["", "0-7", "0-3,8-11,64"] {
        let u = IdSet::parse(universe).expect("fixed universe parses");
        match IdSet::parse_in(&s, &u) {
            Ok(set) => {
                if let Ok(p) = &plain {
                    assert_eq!(&set, p, "parse_in of a plain list differs from parse");
                } else {
                    assert!(set.is_subset(&u), "{s:?}: `all`/`!` left the universe {u}");
                    roundtrip(&set, &s);
                }
            }
            Err(_) => assert!(plain.is_err(), "{s:?}: parse accepts it, parse_in refuses"),
        }
    }
    // A kernel hex mask.
    if let Ok(set) = IdSet::parse_mask(&s) {
        roundtrip(&set, &s);
    }
    // An hwloc bitmap (`None` = every cpu).
    if let Ok(Some(set)) = parse_hwloc_bitmap(&s) {
        roundtrip(&set.0, &s);
    }
});
