//! `loci advise --matrix`: the reference the advice is checked against. Every combination of the
//! values the rules left open is measured the same number of times, interleaved, in the same
//! run; the advice is then compared with the best of that full matrix, in quality and in time.
//! Configurations are compared by their paired ratio to the default (the median over passes of
//! the configuration's run over the default's run in the same pass), as advise's own search does,
//! so that the machine drifting during a long matrix does not pick the winner.
//!
//! The matrix's best is the lowest of many noisy medians, so it sits below the true best (the
//! winner's curse): the more configurations and the noisier the trials, the further. After the
//! matrix, the advised configuration and the matrix's best therefore run head to head again, in
//! fresh paired runs, and that ratio is the one set against the goal.

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::rules::Advice;
use super::search::{median, ratios_to_default, run_pairs, Samples, MIN_RUNS};
use super::trial::Target;
use super::Knobs;
use crate::stats::{median_interval, paired_ratios};

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
    /// (1.0 = advise found the best); biased upward by the choice of the best among them.
    pub advised_over_best: f64,
    /// The two measured again, head to head (`None` when advise found the matrix's best).
    #[serde(default)]
    pub head_to_head: Option<HeadToHead>,
    /// Advise's measuring time over the matrix's (the head-to-head runs not counted).
    pub time_share: f64,
}

/// The advised configuration against the matrix's best in fresh runs after the matrix: each pass
/// runs both, in alternating order, and the ratio is the median over passes of advised / best.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeadToHead {
    pub runs: usize,
    pub ratio: f64,
    /// The bootstrap interval of that median at 95%.
    pub ci: (f64, f64),
    pub elapsed_s: f64,
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
                .map(|s| median(&ratios_to_default(s, &samples[default]))),
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
    let head_to_head = if &best == advised {
        None
    } else {
        Some(head_to_head(
            |c| target.trial(exe, c, threads),
            advised,
            &best,
            reps.max(MIN_RUNS),
        )?)
    };
    Ok(MatrixCheck {
        configs: medians.len(),
        reps,
        elapsed_s,
        medians,
        thp_fallbacks: fallbacks,
        best,
        advised_over_best: advised_median / best_median,
        head_to_head,
        time_share: advise_s / elapsed_s,
    })
}

/// Runs `advised` and `best` in `passes` passes (the first of each pass alternating) and returns
/// their paired ratio advised / best.
pub fn head_to_head(
    mut trial: impl FnMut(&Knobs) -> anyhow::Result<f64>,
    advised: &Knobs,
    best: &Knobs,
    passes: usize,
) -> anyhow::Result<HeadToHead> {
    let start = Instant::now();
    let bar = indicatif::ProgressBar::new((2 * passes) as u64);
    bar.set_message("head to head: the advised configuration and the matrix's best");
    let (mut a, mut b) = (Samples::default(), Samples::default());
    run_pairs(
        0..passes,
        &mut a,
        &mut b,
        |first| trial(if first { advised } else { best }),
        || bar.inc(1),
    )?;
    bar.finish_and_clear();
    let ratios = paired_ratios(&a, &b);
    Ok(HeadToHead {
        runs: passes,
        ratio: median(&ratios),
        ci: median_interval(&ratios, 0.05, 0x4e2d),
        elapsed_s: start.elapsed().as_secs_f64(),
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
    match &m.head_to_head {
        None => println!(
            "  the advised configuration is the matrix's best; found in {:.2} of the matrix's time (goal <= 0.25)",
            m.time_share
        ),
        Some(h) => println!(
            "  the advised configuration: {:.3}x the matrix's best in the matrix (paired ratios to the default; the lowest of {} noisy medians is biased low), {:.3}x ({:.3}-{:.3}) head to head in {} fresh pairs (goal <= 1.05); found in {:.2} of the matrix's time (goal <= 0.25)",
            m.advised_over_best, m.configs, h.ratio, h.ci.0, h.ci.1, h.runs, m.time_share
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs(alloc: &str) -> Knobs {
        Knobs {
            alloc: alloc.into(),
            ..Knobs::default()
        }
    }

    /// The head-to-head ratio is advised / best over fresh pairs, and a drift common to both
    /// runs of a pass cancels.
    #[test]
    fn head_to_head_pairs_the_two_and_cancels_a_common_drift() {
        let (advised, best) = (knobs("glibc"), knobs("jemalloc"));
        let mut calls = Vec::new();
        let mut drift = 1.0;
        let h = head_to_head(
            |c| {
                calls.push(c.alloc.clone());
                drift *= 1.05;
                Ok(drift * if c.alloc == "jemalloc" { 0.8 } else { 1.0 })
            },
            &advised,
            &best,
            6,
        )
        .unwrap();
        assert_eq!(h.runs, 6);
        assert_eq!(calls.len(), 12);
        // the first of each pass alternates, so neither always runs first
        assert_eq!(calls[0], "glibc");
        assert_eq!(calls[2], "jemalloc");
        // per pass: 1.0 / 0.8 times 1.05 or 1/1.05 from the order, median 1.25
        assert!((h.ratio - 1.25).abs() < 0.07, "{h:?}");
        assert!(h.ci.0 <= h.ratio && h.ratio <= h.ci.1, "{h:?}");
        assert!(h.ci.0 > 1.0, "a 25% gap shows in six pairs: {h:?}");
    }

    #[test]
    fn a_failing_run_stops_the_head_to_head() {
        let e = head_to_head(
            |_| anyhow::bail!("no such program"),
            &knobs("glibc"),
            &knobs("loci"),
            5,
        )
        .unwrap_err();
        assert!(e.to_string().contains("no such program"));
    }

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
