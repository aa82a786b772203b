//! The measured part of `loci advise`: successive halving over the candidates within a time
//! budget, repetitions interleaved across candidates, and a verdict per candidate from a
//! bootstrap interval of its paired ratio to the default (the statistic of [`crate::stats`]:
//! the default runs in every pass over the candidates, and a candidate's run is paired with the
//! default's run of the same pass).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::stats::judge;
pub use crate::stats::{median, ratios_to_default, Samples, Verdict, MIN_EFFECT, MIN_RUNS};

/// The fewest runs per candidate in the first round, the screening round, when trials are long:
/// survivors collect [`MIN_RUNS`] in the rounds that follow.
pub const SCREEN_RUNS: usize = 3;
/// How far past `--budget` a search may plan to run (its estimates come from the mean trial).
const BUDGET_SLACK: f64 = 1.1;
/// The most runs per candidate in the first round; round `r` may give up to `2^r` times this.
const MAX_FIRST_REPS: usize = 50;

/// One candidate's measurements and verdict. `score`: lower is better (a time, or the negated
/// figure when a higher one is better).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub samples: Vec<f64>,
    /// The pass over the candidates each sample was measured in (the default's run of the same
    /// pass is its pair).
    #[serde(default)]
    pub passes: Vec<usize>,
    /// Median of the per-pass ratios candidate / default (on scores: below 1 is better).
    pub ratio: f64,
    pub ci: (f64, f64),
    pub verdict: Verdict,
    /// The halving round in which it was dropped (`None`: it reached the end).
    pub dropped_in: Option<usize>,
}

impl From<&Outcome> for Samples {
    fn from(o: &Outcome) -> Samples {
        Samples {
            values: o.samples.clone(),
            passes: o.passes.clone(),
        }
    }
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
        // One round: every run counts for the verdict. Several: the first only screens, and the
        // survivors are topped up to MIN_RUNS by the rounds after it (or by `halve` at the end).
        let floor = if rounds == 1 { MIN_RUNS } else { SCREEN_RUNS };
        Schedule {
            first_reps: first_reps.clamp(floor, MAX_FIRST_REPS),
            rounds,
        }
    }

    /// Runs in the smallest search [`halve`] can run with this schedule: the first round, then
    /// the survivors topped up to [`MIN_RUNS`] (the default among them).
    pub fn least_runs(&self, candidates: usize) -> usize {
        let survivors = if self.rounds > 1 {
            1 + candidates.saturating_sub(1).div_ceil(2)
        } else {
            candidates
        };
        self.first_reps * candidates + survivors * MIN_RUNS.saturating_sub(self.first_reps)
    }
}

/// Seconds by which `more` runs, at the mean trial so far (`spent` over `done` runs), would end
/// past `budget`; `None` when they end within it (and its [`BUDGET_SLACK`]).
pub fn overrun(spent: Duration, done: usize, more: usize, budget: Duration) -> Option<f64> {
    let spent = spent.as_secs_f64();
    let end = spent + more as f64 * spent / done.max(1) as f64;
    (end > budget.as_secs_f64() * BUDGET_SLACK).then_some(end - budget.as_secs_f64())
}

/// Runs successive halving. Candidate 0 is the default: it is measured in every pass and never
/// dropped. `measure(i)` runs candidate `i` once and returns its score (lower is better).
/// `on_trial` is told after every measurement (for a progress bar). Stops starting new rounds
/// when the budget is spent; a round once started is finished so that its survivors are compared
/// on equal counts, and survivors with fewer than [`MIN_RUNS`] pairs are topped up to it.
pub fn halve(
    candidates: usize,
    schedule: &Schedule,
    budget: Duration,
    mut measure: impl FnMut(usize) -> anyhow::Result<f64>,
    mut on_trial: impl FnMut(usize, usize),
) -> anyhow::Result<Vec<Outcome>> {
    let start = Instant::now();
    let mut samples: Vec<Samples> = vec![Samples::default(); candidates];
    let mut dropped_in: Vec<Option<usize>> = vec![None; candidates];
    let mut alive: Vec<usize> = (0..candidates).collect();
    let mut reps = schedule.first_reps;
    let mut done = 0;
    let mut pass = 0;
    // One pass: every survivor once, in an order rotated per pass so that no candidate always
    // runs right after the same one.
    let mut run_pass = |alive: &[usize], samples: &mut [Samples], pass: usize, done: &mut usize| {
        for j in 0..alive.len() {
            let i = alive[(j + pass) % alive.len()];
            samples[i].push(pass, measure(i)?);
            *done += 1;
            on_trial(*done, i);
        }
        anyhow::Ok(())
    };
    // Runs per survivor that one round's share of the budget left holds at the mean run so far,
    // at most `cap`. The trial that sized the schedule may have been a cold one (on W3 here
    // 0.93 s against 0.37 s for the runs after it), which left 45 s of a 75 s budget unused.
    let fits = |done: usize, rounds_left: usize, alive: usize, cap: usize| {
        let spent = start.elapsed().as_secs_f64();
        let mean = spent / done.max(1) as f64;
        let share = (budget.as_secs_f64() - spent) / rounds_left.max(1) as f64;
        ((share / (mean * alive as f64)).max(0.0) as usize).min(cap)
    };
    let rounds = schedule.rounds.max(1);
    for round in 0.. {
        let mut k = 0;
        while k < reps {
            run_pass(&alive, &mut samples, pass, &mut done)?;
            pass += 1;
            k += 1;
            // The first round is sized again from its first pass, which ran every candidate.
            if round == 0 && k == 1 {
                reps = reps.max(1 + fits(done, rounds, alive.len(), MAX_FIRST_REPS - 1));
            }
        }
        let challengers = alive.len() - 1;
        if challengers <= 1 || round + 1 >= rounds {
            break;
        }
        // Keep the better half of the challengers by paired ratio; the default always stays.
        let mut ranked: Vec<usize> = alive[1..].to_vec();
        let key = |i: usize| median(&ratios_to_default(&samples[i], &samples[0]));
        ranked.sort_by(|&a, &b| key(a).total_cmp(&key(b)));
        let keep = challengers.div_ceil(2);
        for &i in &ranked[keep..] {
            dropped_in[i] = Some(round);
        }
        alive = std::iter::once(0)
            .chain(ranked[..keep].iter().copied())
            .collect();
        // Twice the runs of the round before, or what this round's share of the budget left
        // holds, where that is more than the round before had.
        let more = fits(
            done,
            rounds - (round + 1),
            alive.len(),
            MAX_FIRST_REPS << (round + 1),
        );
        reps = if more > reps { more } else { reps * 2 };
        // Skip a round that cannot finish inside what is left of the budget (estimated from the
        // mean trial so far); the survivors are topped up below instead.
        if overrun(start.elapsed(), done, reps * alive.len(), budget).is_some() {
            break;
        }
    }
    // Pairs, not runs: a disturbed pass of the default pairs nothing (see `ratios_to_default`). The
    // extra passes are capped, as every pass could in principle be disturbed.
    let short = |samples: &[Samples], i: usize| {
        let pairs = match i {
            0 => samples[0].runs(),
            _ => ratios_to_default(&samples[i], &samples[0]).len(),
        };
        pairs < MIN_RUNS
    };
    let mut extra = 0;
    while extra < 2 * MIN_RUNS && alive.iter().any(|&i| short(&samples, i)) {
        run_pass(&alive, &mut samples, pass, &mut done)?;
        pass += 1;
        extra += 1;
    }
    Ok(outcomes(&samples, &dropped_in))
}

/// Runs two configurations once in each pass of `passes`, the first of the two alternating
/// with the pass: `run(true)` measures the one whose samples go to `sa`, `run(false)` the other
/// (into `sb`); `on_trial` is told after every run.
pub fn run_pairs(
    passes: std::ops::Range<usize>,
    sa: &mut Samples,
    sb: &mut Samples,
    mut run: impl FnMut(bool) -> anyhow::Result<f64>,
    mut on_trial: impl FnMut(),
) -> anyhow::Result<()> {
    for pass in passes {
        for k in 0..2 {
            let first = (k + pass) % 2 == 0;
            let v = run(first)?;
            if first { &mut *sa } else { &mut *sb }.push(pass, v);
            on_trial();
        }
    }
    Ok(())
}

/// Judges every candidate's samples against candidate 0's (the default), pair by pair.
pub fn outcomes(samples: &[Samples], dropped_in: &[Option<usize>]) -> Vec<Outcome> {
    let m = samples.len().saturating_sub(1);
    (0..samples.len())
        .map(|i| {
            let (ratio, ci, verdict) = if i == 0 {
                (1.0, (1.0, 1.0), Verdict::Default)
            } else {
                judge(&samples[i], &samples[0], m, 0x5eed + i as u64)
            };
            Outcome {
                samples: samples[i].values.clone(),
                passes: samples[i].passes.clone(),
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
    fn overrun_is_measured_from_the_mean_trial_and_allows_the_slack() {
        let s = Duration::from_secs;
        // 10 runs in 20 s: 2 s each. 10 more end at 40 s.
        assert_eq!(overrun(s(20), 10, 10, s(40)), None);
        assert_eq!(
            overrun(s(20), 10, 10, s(37)),
            None,
            "within 10% of the budget"
        );
        let over = overrun(s(20), 10, 10, s(30)).unwrap();
        assert!((over - 10.0).abs() < 1e-9, "{over}");
        assert!(overrun(s(20), 10, 0, s(10)).is_some(), "already past it");
    }

    #[test]
    fn least_runs_counts_the_screen_and_the_top_up_of_the_survivors() {
        // 8 candidates, 3 screening runs each, then the default and 4 survivors to MIN_RUNS.
        let sched = Schedule {
            first_reps: SCREEN_RUNS,
            rounds: 3,
        };
        let runs = 8 * SCREEN_RUNS + 5 * (MIN_RUNS - SCREEN_RUNS);
        assert_eq!(sched.least_runs(8), runs);
        // One round: every candidate gets its verdict's runs in it.
        let one = Schedule {
            first_reps: MIN_RUNS,
            rounds: 1,
        };
        assert_eq!(one.least_runs(2), 2 * MIN_RUNS);
    }

    #[test]
    fn schedule_fits_the_budget_and_keeps_enough_reps_for_a_verdict() {
        let s = Schedule::fit(8, Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(s.rounds, 3);
        assert_eq!(
            s.first_reps, SCREEN_RUNS,
            "60 s / 3 rounds / 8 candidates is 2.5 s: the screening floor"
        );
        let s = Schedule::fit(2, Duration::from_secs(10), Duration::from_secs(10));
        assert_eq!(
            (s.rounds, s.first_reps),
            (1, MIN_RUNS),
            "one round: every run is a pair"
        );
        let s = Schedule::fit(4, Duration::from_millis(100), Duration::from_secs(60));
        assert_eq!(s.first_reps, 50);
    }

    #[test]
    fn rounds_after_the_first_are_sized_from_the_runs_not_the_first_trial() {
        // The trial that sized the schedule took 50 ms (a cold first run); the runs take about
        // 1 ms. Sized by the trial alone every candidate would be screened on 3 runs and the
        // default would get 3 + 6 + 12 = 21 of a 2 s budget's worth of about 2000.
        let schedule = Schedule::fit(7, Duration::from_millis(50), Duration::from_secs(2));
        assert_eq!((schedule.first_reps, schedule.rounds), (SCREEN_RUNS, 3));
        let out = halve(
            7,
            &schedule,
            Duration::from_secs(2),
            |i| {
                std::thread::sleep(Duration::from_millis(1));
                Ok(1.0 + i as f64 * 0.1)
            },
            |_, _| {},
        )
        .unwrap();
        let runs = out[0].samples.len();
        assert!(runs > 21, "the default ran {runs} times");
        // The first round too is sized from its first pass: every candidate screened on more
        // than the schedule's 3 runs.
        assert!(
            out.iter().all(|o| o.samples.len() > SCREEN_RUNS),
            "{:?}",
            out.iter().map(|o| o.samples.len()).collect::<Vec<_>>()
        );
        // No round exceeds its cap.
        assert!(runs <= 7 * MAX_FIRST_REPS + 2 * MIN_RUNS, "{runs}");
    }

    #[test]
    fn when_the_budget_ends_early_the_survivors_are_topped_up_to_a_verdict() {
        let means = [1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 0.9];
        let schedule = Schedule {
            first_reps: SCREEN_RUNS,
            rounds: 3,
        };
        let mut rng = fastrand::Rng::with_seed(9);
        let out = halve(
            means.len(),
            &schedule,
            Duration::ZERO,
            |i| Ok(means[i] * (1.0 + 0.01 * rng.f64())),
            |_, _| {},
        )
        .unwrap();
        let survivors: Vec<usize> = (1..out.len())
            .filter(|&i| out[i].dropped_in.is_none())
            .collect();
        assert_eq!(survivors.len(), 3, "{out:?}");
        assert!(survivors.contains(&2));
        for &i in &survivors {
            assert_eq!(out[i].samples.len(), MIN_RUNS);
        }
        assert_eq!(out[2].verdict, Verdict::Better);
        let dropped = (1..out.len()).filter(|&i| out[i].verdict == Verdict::Dropped);
        assert_eq!(
            dropped.count(),
            3,
            "screened out with {SCREEN_RUNS} runs: no verdict"
        );
    }

    #[test]
    fn passes_where_a_burst_slowed_only_the_default_are_set_aside_and_made_up() {
        // The default's runs in passes 3 and 4 (the top-up's first two) take twice as long: every
        // candidate of those passes would pair at about 0.5. They pair nothing; the top-up goes
        // on until each survivor has MIN_RUNS pairs, and only the planted winner is better.
        let means = [1.0, 1.0, 0.8, 1.0, 1.0];
        let schedule = Schedule {
            first_reps: SCREEN_RUNS,
            rounds: 3,
        };
        let mut rng = fastrand::Rng::with_seed(4);
        let mut default_runs = 0;
        let out = halve(
            means.len(),
            &schedule,
            Duration::ZERO,
            |i| {
                let burst = i == 0 && {
                    default_runs += 1;
                    matches!(default_runs, 4 | 5)
                };
                let noise = 1.0 + 0.01 * rng.f64();
                Ok(means[i] * noise * if burst { 2.0 } else { 1.0 })
            },
            |_, _| {},
        )
        .unwrap();
        let default = Samples::from(&out[0]);
        assert_eq!(crate::stats::disturbed_passes(&default), vec![3, 4]);
        let survivors: Vec<usize> = (1..out.len())
            .filter(|&i| out[i].dropped_in.is_none())
            .collect();
        assert_eq!(survivors.len(), 2, "{out:?}");
        for &i in &survivors {
            let o = &out[i];
            assert_eq!(o.samples.len(), MIN_RUNS + 2, "{o:?}");
            assert_eq!(ratios_to_default(&o.into(), &default).len(), MIN_RUNS);
            let want = if i == 2 {
                Verdict::Better
            } else {
                Verdict::Same
            };
            assert_eq!(o.verdict, want, "candidate {i}: {o:?}");
        }
        assert!((out[2].ratio - 0.8).abs() < 0.02, "{}", out[2].ratio);
    }
}
