//! The project's one noise statistic for "is this configuration faster than the default": the
//! median of paired ratios with a bootstrap interval. `loci advise` judges its candidates with it
//! and `loci bench tpch` its configuration search.
//!
//! Pairing: the default runs in every pass (advise) or round (bench tpch) over the candidates,
//! so each run of a candidate has a run of the default from the same pass, minutes apart at most.
//! The statistic is the median of the per-pass ratios `candidate / default`; a slow drift of the
//! machine (page-cache or huge-page fragmentation over a long search) moves both sides of a pair
//! alike and cancels, where a ratio of pooled medians (or of pooled extremes) would credit it to
//! whichever candidate ran early, or widen every interval by the drift. The interval resamples
//! the pairs with replacement, 4000 times, and keeps the central `1 - 0.05/m` of the medians, `m`
//! the number of candidates compared with the default (a Bonferroni correction, so that with
//! eight candidates and nothing mattering, the chance of any false "better" stays near 5%). A
//! candidate is better only when it has at least [`MIN_RUNS`] pairs, the whole interval lies
//! below 1 and its median ratio is at least [`MIN_EFFECT`] away from 1; worse symmetrically.
//!
//! One run of the default partners every candidate of its pass, so a burst of noise that slows
//! just that run would make the whole pass read as faster; passes whose default run took over
//! [`DISTURBED`] times the default's median nearby pair nothing ([`disturbed_passes`]).

use serde::{Deserialize, Serialize};

/// The smallest difference from the default reported as a difference (2%).
pub const MIN_EFFECT: f64 = 0.02;
/// Pairs a candidate needs before a verdict: a bootstrap over fewer understates the spread.
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
    /// Fewer than [`MIN_RUNS`] pairs: dropped by advise's successive halving before it was
    /// measured often enough to compare, failed, or a bench run with too few rounds.
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

/// The median (mean of the middle two for an even count).
pub fn median(v: &[f64]) -> f64 {
    loci_report::median(v).unwrap_or(f64::NAN)
}

/// Bootstrap interval of the median of `ratios` at confidence `1 - alpha`.
pub fn median_interval(ratios: &[f64], alpha: f64, seed: u64) -> (f64, f64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut buf = vec![0.0; ratios.len()];
    let mut medians: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for x in buf.iter_mut() {
                *x = ratios[rng.usize(..ratios.len())];
            }
            median(&buf)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    let at = |q: f64| medians[((q * (RESAMPLES - 1) as f64).round() as usize).min(RESAMPLES - 1)];
    (at(alpha / 2.0), at(1.0 - alpha / 2.0))
}

/// The interval a verdict is drawn from: [`median_interval`] at `1 - 0.05/m`, `m` candidates
/// compared with the default.
pub fn corrected_interval(ratios: &[f64], m: usize, seed: u64) -> (f64, f64) {
    median_interval(ratios, 0.05 / m.max(1) as f64, seed)
}

/// A default's run this many times the median of its runs in the [`NEAREST`] nearest passes is
/// a disturbed pass (a burst of the machine's own noise), whose pairs are set aside.
pub const DISTURBED: f64 = 1.5;
/// How many of the default's passes, nearest first and the pass itself included, make the
/// reference a run is checked against: nine stay robust to four slow passes in a row, and span
/// too few passes for a drift to reach [`DISTURBED`].
const NEAREST: usize = 9;

/// The passes whose default run is disturbed: slower than [`DISTURBED`] times the median of the
/// default's runs in the [`NEAREST`] nearest passes. One default run is the partner of every
/// candidate's run in its pass, so a burst of noise that slows only it would read as every
/// candidate of that pass being faster; a candidate's own slow run spoils only its own pair, which
/// the median over pairs already absorbs. The pairs set aside are mostly a candidate's lowest, so
/// this leans towards keeping the default (whose slow tail, if real, still shows in its spread).
pub fn disturbed_passes(base: &Samples) -> Vec<usize> {
    let mut passes: Vec<usize> = base.passes.clone();
    passes.sort_unstable();
    passes.dedup();
    let values: Vec<f64> = passes.iter().map(|&p| base.at(p).unwrap()).collect();
    let n = values.len();
    (0..n)
        .filter(|&i| {
            // The default runs in every pass, so its nearest passes are a window around `i`,
            // shifted inwards at either end.
            let lo = i.saturating_sub(NEAREST / 2).min(n.saturating_sub(NEAREST));
            values[i] > DISTURBED * median(&values[lo..(lo + NEAREST).min(n)])
        })
        .map(|i| passes[i])
        .collect()
}

/// The per-pass ratios of `cand`'s samples to `base`'s sample of the same pass (the mean of
/// `base`'s samples of that pass where it has several, see [`Samples::at`]).
pub fn paired_ratios(cand: &Samples, base: &Samples) -> Vec<f64> {
    cand.iter()
        .filter_map(|(pass, v)| base.at(pass).map(|b| v / b))
        .collect()
}

/// [`paired_ratios`] of a candidate to the default that ran in every pass, the default's
/// [`disturbed_passes`] left out: the pairs every verdict is drawn from.
pub fn ratios_to_default(cand: &Samples, default: &Samples) -> Vec<f64> {
    let disturbed = disturbed_passes(default);
    cand.iter()
        .filter(|(pass, _)| !disturbed.contains(pass))
        .filter_map(|(pass, v)| default.at(pass).map(|b| v / b))
        .collect()
}

/// Judges `cand` against `base` (both lower-is-better scores, paired by pass), `m` candidates
/// compared in all: the median paired ratio, its interval (NaN under [`MIN_RUNS`] pairs) and
/// the verdict.
pub fn judge(cand: &Samples, base: &Samples, m: usize, seed: u64) -> (f64, (f64, f64), Verdict) {
    let ratios = ratios_to_default(cand, base);
    let ratio = median(&ratios);
    if ratios.len() < MIN_RUNS {
        return (ratio, (f64::NAN, f64::NAN), Verdict::Dropped);
    }
    let ci = corrected_interval(&ratios, m, seed);
    let verdict = if ci.1 < 1.0 && ratio <= 1.0 - MIN_EFFECT {
        Verdict::Better
    } else if ci.0 > 1.0 && ratio >= 1.0 + MIN_EFFECT {
        Verdict::Worse
    } else {
        Verdict::Same
    };
    (ratio, ci, verdict)
}

/// One candidate's scores, each with the pass it was measured in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    pub values: Vec<f64>,
    pub passes: Vec<usize>,
}

impl Samples {
    pub fn push(&mut self, pass: usize, v: f64) {
        self.passes.push(pass);
        self.values.push(v);
    }
    /// The score measured in `pass`, if any: the mean where the pass measured it more than once
    /// (bench tpch runs the default at the start and the end of each round, and pairs each
    /// candidate with the mean of the two, so drift within the round cancels).
    pub fn at(&self, pass: usize) -> Option<f64> {
        let (sum, n) = self
            .iter()
            .filter(|&(p, _)| p == pass)
            .fold((0.0, 0usize), |(s, n), (_, v)| (s + v, n + 1));
        (n > 0).then(|| sum / n as f64)
    }
    pub fn iter(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.passes.iter().copied().zip(self.values.iter().copied())
    }
    pub fn runs(&self) -> usize {
        self.values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(values: impl IntoIterator<Item = f64>) -> Samples {
        let mut s = Samples::default();
        for (p, v) in values.into_iter().enumerate() {
            s.push(p, v);
        }
        s
    }

    #[test]
    fn interval_brackets_a_clear_ratio() {
        let a = samples((0..20).map(|i| 2.0 + 0.01 * i as f64));
        let b = samples((0..20).map(|i| 1.0 + 0.01 * (19 - i) as f64));
        let (r, (lo, hi), v) = judge(&a, &b, 1, 3);
        assert!(lo > 1.6 && hi < 2.4 && lo <= hi, "{lo} {hi}");
        assert!((r - 1.9).abs() < 0.2, "{r}");
        assert_eq!(v, Verdict::Worse);
    }

    #[test]
    fn drift_between_passes_cancels_in_the_pairs() {
        // The machine slows 3% per pass. The candidate equals the default but ran only in the
        // first 6 passes (dropped, then the default ran on): pooled medians would call it 8%
        // faster; the pairs see no difference.
        let drift = |p: usize| 1.0 + 0.03 * p as f64;
        let base = samples((0..12).map(drift));
        let cand = samples((0..6).map(drift));
        let pooled = median(&cand.values) / median(&base.values);
        assert!(pooled < 0.95, "{pooled}");
        let (r, _, v) = judge(&cand, &base, 1, 5);
        assert!((r - 1.0).abs() < 1e-12, "{r}");
        assert_eq!(v, Verdict::Same);
    }

    #[test]
    fn a_pass_measured_twice_pairs_with_its_mean() {
        // bench tpch's default brackets each round: the candidate between its two sessions is
        // paired with their mean; a pass measured once keeps its value exactly.
        let mut base = Samples::default();
        for (p, v) in [(0, 1.0), (0, 1.2), (1, 0.7)] {
            base.push(p, v);
        }
        assert_eq!(base.at(0), Some(1.1));
        assert_eq!(base.at(1), Some(0.7));
        assert_eq!(base.at(2), None);
        let cand = samples([1.1, 0.7]);
        assert_eq!(paired_ratios(&cand, &base), vec![1.0, 1.0]);
    }

    #[test]
    fn a_candidate_without_pairs_gets_no_verdict() {
        let base = samples([1.0; 10]);
        let mut cand = Samples::default();
        for p in 20..30 {
            cand.push(p, 0.5);
        }
        let (_, _, v) = judge(&cand, &base, 1, 1);
        assert_eq!(v, Verdict::Dropped);
        // Pairs, but fewer than MIN_RUNS: no verdict either, however clear the ratio.
        let (r, ci, v) = judge(&samples([0.5; 4]), &base, 1, 1);
        assert_eq!((r, v), (0.5, Verdict::Dropped));
        assert!(ci.0.is_nan() && ci.1.is_nan());
    }

    #[test]
    fn a_burst_that_slows_only_the_default_is_set_aside() {
        // The default's 26 runs of a `loci advise` on a noisy afternoon (w3, seconds): passes 1,
        // 2, 22 and 24 took about twice the rest. A candidate screened out on passes 0-2 (its
        // median 0.482 s, above the default's) paired 0.56x with them.
        let default = samples([
            0.447, 0.889, 0.877, 0.45, 0.47, 0.479, 0.409, 0.474, 0.447, 0.463, 0.46, 0.493, 0.46,
            0.476, 0.422, 0.477, 0.467, 0.431, 0.442, 0.505, 0.454, 0.49, 0.984, 0.487, 0.893,
            0.488,
        ]);
        assert_eq!(disturbed_passes(&default), vec![1, 2, 22, 24]);
        let cand = samples([0.482, 0.468, 0.492]);
        assert!(median(&paired_ratios(&cand, &default)) < 0.6);
        assert_eq!(ratios_to_default(&cand, &default), vec![0.482 / 0.447]);
        // A steady drift is no burst: a machine 3% slower each pass sets nothing aside, nor does
        // a slower level that most of the nearest passes share.
        let drift = samples((0..40).map(|p| 1.0 + 0.03 * p as f64));
        assert!(disturbed_passes(&drift).is_empty());
        let shared = samples([1.0, 1.0, 1.6, 1.6, 1.6, 1.6, 1.6, 1.0, 1.0]);
        assert!(disturbed_passes(&shared).is_empty());
        // Four slow passes in a row among nine are still found.
        let four = samples([1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(disturbed_passes(&four), vec![3, 4, 5, 6]);
        // A fast run never is (only a slow one is a burst of noise).
        assert!(disturbed_passes(&samples([1.0, 0.3, 1.0, 1.0, 1.0])).is_empty());
    }

    #[test]
    fn the_correction_widens_the_interval_with_the_number_of_candidates() {
        let r: Vec<f64> = (0..12).map(|i| 0.9 + 0.01 * i as f64).collect();
        let one = corrected_interval(&r, 1, 7);
        let eleven = corrected_interval(&r, 11, 7);
        assert!(eleven.0 <= one.0 && eleven.1 >= one.1, "{one:?} {eleven:?}");
        assert!(eleven.1 - eleven.0 > one.1 - one.0, "{one:?} {eleven:?}");
    }
}
