//! The measured part of `loci advise`: successive halving over the candidates within a time
//! budget, repetitions interleaved across candidates, and a verdict per candidate from a
//! bootstrap interval of the ratio of its median to the default's median.
//!
//! The statistic: resample each side's measurements with replacement, take the ratio of the two
//! medians, 4000 times; the interval is the central `1 - 0.05/m` of those ratios, `m` the number
//! of candidates compared with the default (a Bonferroni correction, so that with eight
//! candidates and nothing mattering, the chance of any false "better" stays near 5%). A candidate
//! is better only when the whole interval lies below 1 and its median ratio is at least
//! [`MIN_EFFECT`] away from 1; worse symmetrically.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The smallest difference from the default reported as a difference (2%).
pub const MIN_EFFECT: f64 = 0.02;
/// Runs each side needs before a verdict: a bootstrap over fewer samples understates the spread.
pub const MIN_RUNS: usize = 5;
const RESAMPLES: usize = 4000;

/// How a candidate compares with the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Default,
    Better,
    Worse,
    /// Within the noise.
    Same,
    /// Dropped by successive halving before it was measured often enough to compare, or failed.
    Dropped,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Default => "baseline",
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::Same => "same (noise)",
            Verdict::Dropped => "too few runs",
        }
    }
}

/// One candidate's measurements and verdict. `score`: lower is better (a time, or the negated
/// figure when a higher one is better).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub samples: Vec<f64>,
    /// Median of the candidate over median of the default (in the metric's own sense: below 1 is
    /// better for times, above 1 is better for maximised figures).
    pub ratio: f64,
    pub ci: (f64, f64),
    pub verdict: Verdict,
    /// The halving round in which it was dropped (`None`: it reached the end).
    pub dropped_in: Option<usize>,
}

/// The median (mean of the middle two for an even count).
pub fn median(v: &[f64]) -> f64 {
    loci_report::median(v).unwrap_or(f64::NAN)
}

/// Bootstrap interval of `median(a) / median(b)` at confidence `1 - alpha`.
pub fn ratio_interval(a: &[f64], b: &[f64], alpha: f64, seed: u64) -> (f64, f64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut buf_a = vec![0.0; a.len()];
    let mut buf_b = vec![0.0; b.len()];
    let mut ratios: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for x in buf_a.iter_mut() {
                *x = a[rng.usize(..a.len())];
            }
            for x in buf_b.iter_mut() {
                *x = b[rng.usize(..b.len())];
            }
            median(&buf_a) / median(&buf_b)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((q * (RESAMPLES - 1) as f64).round() as usize).min(RESAMPLES - 1)];
    (at(alpha / 2.0), at(1.0 - alpha / 2.0))
}

/// Judges `cand` against `base` (both lower-is-better scores), `m` candidates compared in all.
pub fn judge(cand: &[f64], base: &[f64], m: usize, seed: u64) -> (f64, (f64, f64), Verdict) {
    let ratio = median(cand) / median(base);
    if cand.len() < MIN_RUNS || base.len() < MIN_RUNS {
        return (ratio, (f64::NAN, f64::NAN), Verdict::Dropped);
    }
    let ci = ratio_interval(cand, base, 0.05 / m.max(1) as f64, seed);
    let verdict = if ci.1 < 1.0 && ratio <= 1.0 - MIN_EFFECT {
        Verdict::Better
    } else if ci.0 > 1.0 && ratio >= 1.0 + MIN_EFFECT {
        Verdict::Worse
    } else {
        Verdict::Same
    };
    (ratio, ci, verdict)
}

/// Successive halving's plan: how many repetitions each round gives every survivor.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub first_reps: usize,
    pub rounds: usize,
}

impl Schedule {
    /// Fits the rounds into `budget` given one trial's estimated cost: round `r` gives each of
    /// the `k / 2^r` survivors `first_reps * 2^r` runs, so every round costs about the same.
    pub fn fit(candidates: usize, trial: Duration, budget: Duration) -> Schedule {
        let rounds = (candidates.max(2) as f64).log2().ceil() as usize;
        let per_round = budget.as_secs_f64() / rounds as f64;
        let first_reps = (per_round / (trial.as_secs_f64().max(1e-3) * candidates as f64)) as usize;
        Schedule {
            first_reps: first_reps.clamp(MIN_RUNS, 50),
            rounds,
        }
    }
}

/// Runs successive halving. Candidate 0 is the default: it is measured in every round and never
/// dropped. `measure(i)` runs candidate `i` once and returns its score (lower is better).
/// `on_trial` is told after every measurement (for a progress bar). Stops starting new rounds
/// when the budget is spent; a round once started is finished so that its survivors are compared
/// on equal counts.
pub fn halve(
    candidates: usize,
    schedule: &Schedule,
    budget: Duration,
    mut measure: impl FnMut(usize) -> anyhow::Result<f64>,
    mut on_trial: impl FnMut(usize, usize),
) -> anyhow::Result<Vec<Outcome>> {
    let start = Instant::now();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); candidates];
    let mut dropped_in: Vec<Option<usize>> = vec![None; candidates];
    let mut alive: Vec<usize> = (0..candidates).collect();
    let mut reps = schedule.first_reps;
    let mut done = 0;
    for round in 0.. {
        // Interleaved: every repetition visits every survivor, in an order rotated per repetition
        // so that no candidate always runs right after the same one.
        for rep in 0..reps {
            for j in 0..alive.len() {
                let i = alive[(j + rep) % alive.len()];
                samples[i].push(measure(i)?);
                done += 1;
                on_trial(done, i);
            }
        }
        let challengers = alive.len() - 1;
        if challengers <= 1 || start.elapsed() >= budget || round + 1 >= schedule.rounds.max(1) {
            break;
        }
        // Keep the better half of the challengers by median; the default always stays.
        let mut ranked: Vec<usize> = alive[1..].to_vec();
        ranked.sort_by(|&a, &b| median(&samples[a]).total_cmp(&median(&samples[b])));
        let keep = challengers.div_ceil(2);
        for &i in &ranked[keep..] {
            dropped_in[i] = Some(round);
        }
        alive = std::iter::once(0)
            .chain(ranked[..keep].iter().copied())
            .collect();
        reps *= 2;
        // Skip a round that cannot finish inside what is left of the budget (estimated from the
        // mean trial so far); the default and survivors keep the measurements they have.
        let mean_trial = start.elapsed().as_secs_f64() / done as f64;
        let next_cost = mean_trial * (reps * alive.len()) as f64;
        if start.elapsed().as_secs_f64() + next_cost > budget.as_secs_f64() * 1.1 {
            break;
        }
    }
    Ok(outcomes(&samples, &dropped_in))
}

/// Judges every candidate's samples against candidate 0's (the default).
pub fn outcomes(samples: &[Vec<f64>], dropped_in: &[Option<usize>]) -> Vec<Outcome> {
    let m = samples.len().saturating_sub(1);
    (0..samples.len())
        .map(|i| {
            let (ratio, ci, verdict) = if i == 0 {
                (1.0, (1.0, 1.0), Verdict::Default)
            } else {
                judge(&samples[i], &samples[0], m, 0x5eed + i as u64)
            };
            Outcome {
                samples: samples[i].clone(),
                ratio,
                ci,
                verdict,
                dropped_in: dropped_in.get(i).copied().flatten(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A noisy synthetic workload: candidate `i` takes `means[i]` with 3% multiplicative noise.
    fn run(means: &[f64], seed: u64) -> Vec<Outcome> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let schedule = Schedule::fit(
            means.len(),
            Duration::from_millis(10),
            Duration::from_secs(3600),
        );
        halve(
            means.len(),
            &schedule,
            Duration::from_secs(3600),
            |i| Ok(means[i] * (1.0 + 0.03 * (rng.f64() * 2.0 - 1.0))),
            |_, _| {},
        )
        .unwrap()
    }

    #[test]
    fn a_planted_winner_is_found_and_nothing_else_is_called_better() {
        for seed in 0..10 {
            let out = run(&[1.0, 1.0, 1.0 / 1.5, 1.0, 1.0, 1.0, 1.0], seed);
            assert_eq!(out[2].verdict, Verdict::Better, "seed {seed}: {:?}", out[2]);
            assert!((out[2].ratio - 0.667).abs() < 0.05, "{}", out[2].ratio);
            for (i, o) in out.iter().enumerate() {
                if i != 2 && i != 0 {
                    assert_ne!(o.verdict, Verdict::Better, "seed {seed}, candidate {i}");
                }
            }
        }
    }

    #[test]
    fn when_nothing_matters_no_candidate_is_better() {
        let mut false_better = 0;
        for seed in 0..20 {
            let out = run(&[1.0; 8], 100 + seed);
            false_better += out.iter().filter(|o| o.verdict == Verdict::Better).count();
        }
        assert!(false_better <= 1, "{false_better} false winners in 20 runs");
    }

    #[test]
    fn a_slower_candidate_is_worse_or_dropped_and_the_default_is_kept() {
        let out = run(&[1.0, 2.0, 1.0, 1.0], 7);
        assert!(matches!(out[1].verdict, Verdict::Worse | Verdict::Dropped));
        assert_eq!(out[0].verdict, Verdict::Default);
        assert!(out[0].samples.len() >= out[2].samples.len());
    }

    #[test]
    fn schedule_fits_the_budget_and_keeps_enough_reps_for_a_verdict() {
        let s = Schedule::fit(8, Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(s.rounds, 3);
        assert_eq!(
            s.first_reps, MIN_RUNS,
            "60 s / 3 rounds / 8 candidates is 2.5 s: the floor"
        );
        let s = Schedule::fit(4, Duration::from_millis(100), Duration::from_secs(60));
        assert_eq!(s.first_reps, 50);
    }

    #[test]
    fn interval_brackets_a_clear_ratio() {
        let a: Vec<f64> = (0..20).map(|i| 2.0 + 0.01 * i as f64).collect();
        let b: Vec<f64> = (0..20).map(|i| 1.0 + 0.01 * i as f64).collect();
        let (lo, hi) = ratio_interval(&a, &b, 0.05, 3);
        assert!(lo > 1.8 && hi < 2.2 && lo <= hi, "{lo} {hi}");
        let (r, _, v) = judge(&a, &b, 1, 3);
        assert!((r - 1.9).abs() < 0.1);
        assert_eq!(v, Verdict::Worse);
    }
}
