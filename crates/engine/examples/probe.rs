//! The W4 `sorted` index probe, one thread, best of 3, on the same keys and probes: a binary
//! search per probe (`slice::binary_search`), binary searches in lock step (the probe before the
//! directory; kept here as the baseline), and the directory index ([`Sorted`]) one probe at a
//! time and in batches ([`Sorted::lookup`], what `loci bench w4` runs). Prints times and ratios.
//!
//! `cargo run --release -p loci-engine --example probe [KEYS] [PROBES]`
//! (defaults: 16M u64 keys, the full-size W4 R; 16M probes).

use std::time::Instant;

use loci_engine::index::{Sorted, PROBE_LANES};
use loci_engine::wide::Row64;

/// Binary searches advancing in lock step, [`PROBE_LANES`] at a time, each step prefetching the
/// key every lane reads next.
fn lockstep(keys: &[u64], probes: &[u64], mut hit: impl FnMut(usize, usize)) {
    let n = keys.len();
    for (c, group) in probes.chunks(PROBE_LANES).enumerate() {
        let mut base = [0usize; PROBE_LANES];
        let mut len = n;
        while len > 1 {
            let half = len / 2;
            let next = (len - half) / 2;
            for j in 0..group.len() {
                let probe = keys[base[j] + half];
                let b = base[j] + std::hint::select_unpredictable(probe <= group[j], half, 0);
                base[j] = b;
                #[cfg(target_arch = "x86_64")]
                // SAFETY: a prefetch is a hint; it never faults, whatever the address.
                unsafe {
                    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                    _mm_prefetch::<_MM_HINT_T0>(keys.as_ptr().wrapping_add(b + next) as *const i8)
                };
            }
            len -= half;
        }
        for j in 0..group.len() {
            if n > 0 && keys[base[j]] == group[j] {
                hit(c * PROBE_LANES + j, base[j]);
            }
        }
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

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
    // sparse keys as W4 has them (a bijective hash of the rank: anywhere in the 64-bit domain),
    // probes at uniform ranks, exact or one off: about half hit
    let mut keys: Vec<u64> = (0..n as u64).map(splitmix).collect();
    keys.sort_unstable();
    let probes: Vec<u64> = (0..m as u64)
        .map(|i| {
            let x = splitmix(i ^ 0x5555);
            keys[(x % n as u64) as usize].wrapping_add(x >> 63)
        })
        .collect();
    // every row reads the payload of each hit, as the W4 probe does: the count plus the
    // payloads' sum, so all rows must agree on both
    let vals: Vec<i64> = keys.iter().map(|&k| (k >> 1) as i64).collect();
    let fold = |c: u64, v: i64| c.wrapping_add(1 + ((v as u64) << 32));
    let rows = keys
        .iter()
        .zip(&vals)
        .map(|(&k, &v)| Row64 { k, v })
        .collect();
    let index = Sorted::new(rows).expect("keys are unique");
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
    let rows: [(&str, (f64, u64)); 4] = [
        (
            "binary search, one at a time",
            best(&|| {
                probes.iter().fold(0, |c, k| match keys.binary_search(k) {
                    Ok(j) => fold(c, vals[j]),
                    Err(_) => c,
                })
            }),
        ),
        (
            "binary search, lock step",
            best(&|| {
                let mut c = 0u64;
                lockstep(&keys, &probes, |_, j| c = fold(c, vals[j]));
                c
            }),
        ),
        (
            "directory, one at a time",
            best(&|| {
                probes
                    .iter()
                    .fold(0, |c, &k| index.get(k).map_or(c, |v| fold(c, v)))
            }),
        ),
        (
            "directory, batched (W4)",
            best(&|| {
                let mut c = 0u64;
                index.lookup(&probes, |_, j| c = fold(c, index.row(j).v));
                c
            }),
        ),
    ];
    let (base, hits) = rows[0].1;
    assert!(
        rows.iter().all(|r| r.1 .1 == hits),
        "every search must find the same keys and payloads"
    );
    println!(
        "sorted index, {n} sparse u64 keys, {m} probes, {} hits (payloads read), one thread, \
         best of 3, {PROBE_LANES} lanes",
        hits & 0xffff_ffff
    );
    for (name, (t, _)) in rows {
        println!(
            "  {name:<30} {t:8.3} s  {:7.1} ns/probe  {:.2}x the time of the first",
            t * 1e9 / m as f64,
            t / base
        );
    }
}
