//! Helpers shared by the fuzz targets in `fuzz_targets/`: what every target does with a topology
//! that a parser accepted, and small fixed machines to plan on.
//!
//! Every target asserts "no panic" by construction (libFuzzer reports a panic as a crash) and,
//! where it is cheap, a property: a printed value parses back to the same value.

use loci_place::strategy::place_threads;
use loci_place::{MemPolicy, Strategy};
use loci_topo::{Topology, TopologyJson};

/// `text` parsed as a `T`; a value that parses must print as text that parses back to it.
pub fn parse_round_trip<T>(text: &str) -> Result<T, T::Err>
where
    T: std::str::FromStr + std::fmt::Display + PartialEq + std::fmt::Debug,
    T::Err: std::fmt::Display,
{
    let v = text.parse::<T>()?;
    let printed = v.to_string();
    let back: T = printed
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} parsed, its print {printed:?} does not: {e}"));
    assert_eq!(back, v, "{text:?} -> {printed:?}");
    Ok(v)
}

/// Planning is quadratic in the number of cpus (`compact_order` and `core_groups` look cpus up
/// by linear search), so a parsed topology is planned on only up to this many cpus: a 65536-cpu
/// synthetic machine takes 15 s per plan natively, minutes under instrumentation: a hang.
pub const PLAN_MAX_CPUS: usize = 256;

/// The JSON round trip of a 65536-cpu machine (tens of MB of JSON) takes about a second under
/// the fuzzer's instrumentation; larger topologies are only validated, so that short runs
/// (`scripts/test` gives each target 5 s) still get through their seed corpus.
pub const ROUNDTRIP_MAX_CPUS: usize = 4096;

/// See the all-pairs `hops` loop in [`exercise_topology`].
pub const HOPS_MAX_NODES: usize = 32;

/// What loci does with a topology that a source (XML, JSON, synthetic spec) produced: validate it,
/// print it as `loci topo --json` and load that back, ask the model the questions the planner
/// asks, and plan a few strategies and memory policies on it. Panics on any broken invariant.
pub fn exercise_topology(t: &Topology) {
    if t.validate().is_err() {
        return;
    }
    if t.cpus.len() > ROUNDTRIP_MAX_CPUS {
        return;
    }
    // `loci topo --json` of a valid topology loads back (`--topology FILE.json`) as the same one.
    let text = serde_json::to_string(&t.to_json()).expect("a topology serializes");
    let doc: TopologyJson = serde_json::from_str(&text).expect("printed JSON parses back");
    let back = doc
        .into_topology()
        .unwrap_or_else(|e| panic!("printed JSON of a valid topology fails to load: {e}"));
    assert_eq!(&back, t, "JSON round trip changed the topology");

    if t.cpus.len() > PLAN_MAX_CPUS {
        return;
    }
    // The model's queries, on every node and cpu: none may panic on a valid topology. The
    // distance table of `loci topo` asks `hops` for every pair; `hops` sorts the whole matrix
    // each call, so all pairs cost O(nodes^4 log nodes) (7 s for 256 nodes, natively): asked
    // here up to HOPS_MAX_NODES nodes only, so that this known slowness does not read as a hang.
    for a in &t.nodes {
        for b in t.nodes.iter().take(if t.nodes.len() <= HOPS_MAX_NODES {
            usize::MAX
        } else {
            2
        }) {
            let _ = t.distance(a.id, b.id);
            let _ = t.hops(a.id, b.id);
        }
        let _ = t.allowed_cpus_of(a.id);
    }
    if let Some(l) = t.llc_level() {
        let _ = t.core_groups(l);
    }
    for c in &t.cpus {
        let _ = t.smt_siblings(c.id);
    }
    plan_some(t);
}

/// Plans every strategy and a few memory policies on `t` with a few thread counts. Errors are
/// fine (a CPU-less machine has nowhere to put threads); panics are not.
pub fn plan_some(t: &Topology) {
    let allowed = t.allowed_cpus().len();
    for spec in [
        "os",
        "compact",
        "sparse@core",
        "shared:2",
        "random:7@group",
        "group",
        "nodes:all",
        "cpus:all@node",
    ] {
        let s: Strategy = spec.parse().expect("fixed strategy parses");
        for n in [1, 2, allowed.max(1), allowed + 1] {
            if let Ok((places, _)) = place_threads(t, &s, n, true) {
                assert_eq!(places.len(), n, "{spec} -n {n}: one placement per thread");
            }
        }
    }
    for spec in [
        "first-touch",
        "interleave",
        "localalloc",
        "bind:all",
        "preferred-many:!0",
    ] {
        let p: MemPolicy = spec.parse().expect("fixed policy parses");
        let _ = p.resolve(t);
    }
}

/// Lossy UTF-8 view of fuzz bytes: the parsers take `&str`, as they get from files and argv.
pub fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// Ids a run may put into cpu and node sets. A list like `0-65535` is a 65536-id set, about
/// 0.1-0.2 s to build under the fuzzer's instrumentation: text that asks for more is skipped, so
/// that a run stays well under the timeout however many such lists the input repeats.
pub const LIST_IDS_BUDGET: u64 = 200_000;

/// An upper bound on the ids that the cpu and node lists in `text` can name: the size of every
/// `A-B` range between the separators of the formats that hold lists (`;` of `LOCI_PIN_CPUS`,
/// `,` of a list, `:` of a `/proc` line or a stride, `=` of a log token, line ends), plus one
/// per other item. `IdSet::parse` trims spaces inside a token (`0 - 3`), so spaces do not split.
pub fn list_ids_bound(text: &str) -> u64 {
    text.split([';', ',', ':', '=', '\n'])
        .map(|item| {
            let range = item.split_once('-').and_then(|(a, b)| {
                let a: u64 = a.trim().parse().ok()?;
                let b: u64 = b.trim().parse().ok()?;
                Some(b.min(65_535).saturating_sub(a) + 1)
            });
            range.unwrap_or(1)
        })
        .fold(0u64, u64::saturating_add)
}
