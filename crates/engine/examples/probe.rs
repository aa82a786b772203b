//! The W4 `sorted` index probe: one binary search at a time (`Index::get`) against the
//! lock-step searches of `index::sorted_lookup`, on the same sorted keys and the same probe
//! keys, one thread, best of 3. Prints both times and their ratio.
//!
//! `cargo run --release -p loci-engine --example probe [KEYS] [PROBES]`
//! (defaults: 16M u64 keys, the full-size W4 R; 16M probes).

use std::time::Instant;

use loci_engine::index::{sorted_lookup, Index};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut num = |default: usize| -> usize {
        match args.next() {
            None => default,
            Some(a) => a.parse().unwrap_or_else(|_| {
                eprintln!("probe: '{a}' is not a count; usage: probe [KEYS] [PROBES]");
                std::process::exit(2)
            }),
        }
    };
    let (n, m) = (num(16 << 20), num(16 << 20));
    // unique 64-bit keys spread over the domain with gaps (rank i at i * step), probes at
    // uniform ranks, exact or one off: ~half hit
    let step = (u64::MAX / (n as u64 + 1)).max(2);
    let keys: Vec<u64> = (0..n as u64).map(|i| i * step).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let probes: Vec<u64> = (0..m)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let rank = x % n as u64;
            rank * step + (x >> 63)
        })
        .collect();
    let index = Index::Sorted {
        keys: keys.clone(),
        vals: keys.iter().map(|&k| k as i64).collect(),
    };
    let best = |f: &dyn Fn() -> u64| {
        (0..3)
            .map(|_| {
                let t = Instant::now();
                let c = std::hint::black_box(f());
                (t.elapsed().as_secs_f64(), c)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap()
    };
    let (one, c1) = best(&|| probes.iter().filter(|&&k| index.get(k).is_some()).count() as u64);
    let (lock, c2) = best(&|| {
        let mut c = 0u64;
        sorted_lookup(&keys, &probes, |_, _| c += 1);
        c
    });
    assert_eq!(c1, c2, "both searches must find the same keys");
    println!("sorted index, {n} keys, {m} probes, {c1} hits, one thread, best of 3");
    println!(
        "  one at a time  {one:8.3} s  {:7.1} ns/probe",
        one * 1e9 / m as f64
    );
    println!(
        "  lock step x{:<3} {lock:8.3} s  {:7.1} ns/probe  ({:.2}x the time of one at a time)",
        loci_engine::index::PROBE_LANES,
        lock * 1e9 / m as f64,
        lock / one
    );
}
