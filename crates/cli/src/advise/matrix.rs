//! `loci advise --matrix`: the reference the advice is checked against. Every combination of the
//! values the rules left open is measured the same number of times, interleaved, in the same
//! run; the advice is then compared with the best of that full matrix, in quality and in time.

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::rules::Advice;
use super::search::median;
use super::trial::Target;
use super::Config;

/// What the full matrix says about the advice.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatrixCheck {
    pub configs: usize,
    pub reps: usize,
    pub elapsed_s: f64,
    /// Every configuration and its median score.
    pub medians: Vec<(Config, f64)>,
    pub best: Config,
    /// Median of the advised configuration over the matrix's best median, both from the matrix
    /// run (1.0 = advise found the best).
    pub advised_over_best: f64,
    /// Advise's measuring time over the matrix's.
    pub time_share: f64,
}

/// Every combination of the open values.
pub fn combinations(a: &Advice) -> Vec<Config> {
    let mut out = Vec::new();
    for t in &a.threads {
        for m in &a.mem {
            for al in &a.alloc {
                for h in &a.thp {
                    out.push(Config {
                        threads: t.clone(),
                        mem: m.clone(),
                        alloc: al.clone(),
                        thp: h.clone(),
                    });
                }
            }
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
    advised: &Config,
    advise_s: f64,
    reps: usize,
) -> anyhow::Result<MatrixCheck> {
    let configs = combinations(advice);
    let start = Instant::now();
    let bar = indicatif::ProgressBar::new((configs.len() * reps) as u64);
    let mut samples = vec![Vec::new(); configs.len()];
    for rep in 0..reps {
        for j in 0..configs.len() {
            let i = (j + rep) % configs.len();
            bar.set_message(configs[i].label());
            samples[i].push(target.trial(exe, &configs[i], threads)?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let medians: Vec<(Config, f64)> = configs
        .into_iter()
        .zip(samples.iter().map(|s| median(s)))
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
        println!("  {:<58} {:>10.4}", c.label(), med);
    }
    if rows.len() > 5 {
        println!("  ... {} more", rows.len() - 5);
    }
    println!(
        "  the advised configuration: {:.3}x the matrix's best median (goal <= 1.05), found in {:.2} of the matrix's time (goal <= 0.25)",
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
            recommended: Config::default(),
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
        assert!(c.contains(&Config::default()));
        let mut uniq = c.clone();
        uniq.dedup();
        assert_eq!(uniq.len(), 24);
    }
}
