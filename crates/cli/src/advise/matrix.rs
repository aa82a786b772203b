//! `loci advise --matrix`: the reference the advice is checked against. Every combination of the
//! values the rules left open is measured the same number of times, interleaved, in the same
//! run; the advice is then compared with the best of that full matrix, in quality and in time.
//! Configurations are compared by their paired ratio to the default (the median over passes of
//! the configuration's run over the default's run in the same pass), as advise's own search does,
//! so that the machine drifting during a long matrix does not pick the winner.

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::rules::Advice;
use super::search::{median, paired_ratios, Samples};
use super::trial::Target;
use super::Knobs;

/// What the full matrix says about the advice.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatrixCheck {
    pub configs: usize,
    pub reps: usize,
    pub elapsed_s: f64,
    /// Every configuration and its median paired ratio to the default (below 1 is better).
    pub medians: Vec<(Knobs, f64)>,
    /// Huge-page faults that fell back to 4 KiB pages during each configuration's runs, in the
    /// order of `medians`.
    #[serde(default)]
    pub thp_fallbacks: Vec<u64>,
    pub best: Knobs,
    /// The advised configuration's paired ratio over the matrix's best, both from the matrix run
    /// (1.0 = advise found the best).
    pub advised_over_best: f64,
    /// Advise's measuring time over the matrix's.
    pub time_share: f64,
}

/// Every combination of the open values, and the default (the pairs' other half) where the open
/// values leave it out.
pub fn combinations(a: &Advice) -> Vec<Knobs> {
    let mut out = vec![Knobs::default()];
    for [threads, mem, alloc, thp] in
        crate::run_cmd::product4([&a.threads, &a.mem, &a.alloc, &a.thp])
    {
        let c = Knobs {
            threads: threads.into(),
            mem: mem.into(),
            alloc: alloc.into(),
            thp: thp.into(),
        };
        if c != out[0] {
            out.push(c);
        }
    }
    out
}

/// Measures the matrix and compares `advised` (found in `advise_s` seconds) with its best.
pub fn check(
    target: &Target,
    exe: &Path,
    threads: usize,
    advice: &Advice,
    advised: &Knobs,
    advise_s: f64,
    reps: usize,
) -> anyhow::Result<MatrixCheck> {
    let configs = combinations(advice);
    let start = Instant::now();
    let bar = indicatif::ProgressBar::new((configs.len() * reps) as u64);
    let mut samples = vec![Samples::default(); configs.len()];
    let mut fallbacks = vec![0u64; configs.len()];
    for pass in 0..reps {
        for j in 0..configs.len() {
            let i = (j + pass) % configs.len();
            bar.set_message(configs[i].label());
            let before = super::trial::thp_fault_fallbacks();
            samples[i].push(pass, target.trial(exe, &configs[i], threads)?);
            if let (Some(a), Some(b)) = (before, super::trial::thp_fault_fallbacks()) {
                fallbacks[i] += b.saturating_sub(a);
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let default = 0;
    let medians: Vec<(Knobs, f64)> = configs
        .into_iter()
        .zip(
            samples
                .iter()
                .map(|s| median(&paired_ratios(s, &samples[default]))),
        )
        .collect();
    let (best, best_median) = medians
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .cloned()
        .expect("the matrix has the default at least");
    let advised_median = medians
        .iter()
        .find(|(c, _)| c == advised)
        .map(|(_, m)| *m)
        .unwrap_or(f64::NAN);
    let elapsed_s = start.elapsed().as_secs_f64();
    Ok(MatrixCheck {
        configs: medians.len(),
        reps,
        elapsed_s,
        medians,
        thp_fallbacks: fallbacks,
        best,
        advised_over_best: advised_median / best_median,
        time_share: advise_s / elapsed_s,
    })
}

pub fn print(m: &MatrixCheck) {
    println!(
        "\nfull matrix (--matrix): {} configurations x {} runs, interleaved, in {:.0} s",
        m.configs, m.reps, m.elapsed_s
    );
    let mut rows = m.medians.clone();
    rows.sort_by(|a, b| a.1.total_cmp(&b.1));
    for (c, med) in rows.iter().take(5) {
        println!("  {:<58} {:>8.3}x the default", c.label(), med);
    }
    if rows.len() > 5 {
        println!("  ... {} more", rows.len() - 5);
    }
    let fell: u64 = m.thp_fallbacks.iter().sum();
    if fell > 0 {
        println!("  THP: {fell} huge-page faults fell back to 4 KiB pages during the matrix");
    }
    println!(
        "  the advised configuration: {:.3}x the matrix's best (paired ratios to the default; goal <= 1.05), found in {:.2} of the matrix's time (goal <= 0.25)",
        m.advised_over_best, m.time_share
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_cover_every_open_value() {
        let a = Advice {
            findings: vec![],
            recommended: Knobs::default(),
            threads: vec!["os".into(), "sparse".into()],
            mem: vec![
                "first-touch".into(),
                "interleave".into(),
                "localalloc".into(),
            ],
            alloc: vec!["glibc".into(), "jemalloc".into()],
            thp: vec![String::new(), "off".into()],
            os_changes: vec![],
        };
        let c = combinations(&a);
        assert_eq!(c.len(), 24);
        assert_eq!(c[0], Knobs::default());
        let mut uniq = c.clone();
        uniq.dedup();
        assert_eq!(uniq.len(), 24);
    }
}
