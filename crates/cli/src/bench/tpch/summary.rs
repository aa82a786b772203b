//! The summary after `loci bench tpch`'s table: each configuration's geometric mean against the
//! default's, the configuration search judged by the project's paired statistic
//! ([`crate::stats`], as `loci advise`), and loci-engine against DuckDB.

#[cfg(test)]
use loci_report::Machine;
use loci_report::Report;
use loci_report::Row;

use super::{geomean, loci, Config, ENGINES};
use crate::stats::{
    corrected_interval, judge, ratios_to_default, Samples, Verdict, DISTURBED, MIN_EFFECT, MIN_RUNS,
};

/// A row's times with the round each was measured in: its `extra.rounds` (the default's lists
/// each round twice where it bracketed the rounds; pairing takes the mean of the two), or in
/// results saved before rows named their rounds, the position in `times_s` (one time per round,
/// in order).
fn by_round(r: &Row) -> Samples {
    let named = r
        .extra
        .get("rounds")
        .and_then(|v| serde_json::from_value::<Vec<usize>>(v.clone()).ok())
        .filter(|p| p.len() == r.times_s.len());
    Samples {
        values: r.times_s.clone(),
        passes: named.unwrap_or_else(|| (0..r.times_s.len()).collect()),
    }
}

/// The default configuration's row of each case is the baseline.
pub fn baseline(r: &Row) -> bool {
    let d = Config::default_config();
    d.row(Row::default()).config == r.config
}

/// Lines after the table: per engine and configuration, the geometric mean against the
/// default's, and whether the allocator asked for was in the engine process.
pub fn summary(rep: &Report) -> String {
    let mut out = String::new();
    for e in ENGINES {
        let case = format!("{e} geomean");
        let rows: Vec<&Row> = rep.rows_of(Some(&case)).collect();
        let Some(base) = rows.iter().find(|r| baseline(r)) else {
            continue;
        };
        for r in &rows {
            out += &format!(
                "tpch {e} {}: geomean {:.4} s, {:.3}x default{}{}\n",
                r.config.values().cloned().collect::<Vec<_>>().join("/"),
                r.median_s,
                r.median_s / base.median_s,
                match r.extra.get("allocator_preloaded") {
                    Some(serde_json::Value::Bool(false)) => ", allocator NOT in the engine process",
                    _ => "",
                },
                match r.extra.get("own_allocator").and_then(|v| v.as_str()) {
                    Some(own) => format!(", links its own {own}"),
                    None => String::new(),
                }
            );
        }
    }
    for e in ENGINES {
        out += &search(rep, e);
    }
    out += &loci_vs_duckdb(rep);
    out + &format!(
        "tpch answers: {}\n",
        rep.params["answers"].as_str().unwrap_or("-")
    )
}

/// An engine's configuration search: for the geometric mean and each query, the fastest
/// configuration against the default by the project's paired statistic ([`crate::stats`], as
/// `loci advise`): the median of its per-round ratios to the default's time of the same round
/// (the mean of its sessions at the round's start and end where it bracketed it), a bootstrap interval of that median corrected for the number of configurations, a verdict
/// (none under [`MIN_RUNS`] rounds), and how many configurations are faster or slower beyond
/// noise. Empty unless the engine ran more than one configuration.
fn search(rep: &Report, engine: &str) -> String {
    let mut cases = vec![format!("{engine} geomean")];
    cases.extend((1..=22).map(|q| format!("{engine} q{q:02}")));
    let mut lines = Vec::new();
    let mut rounds = 0;
    let mut configs = 0;
    let mut bracketed = false;
    for case in &cases {
        let rows: Vec<&Row> = rep.rows_of(Some(case)).collect();
        let Some(base) = rows.iter().find(|r| baseline(r)) else {
            continue;
        };
        let others: Vec<&Row> = rows.iter().copied().filter(|r| !baseline(r)).collect();
        if others.is_empty() {
            continue;
        }
        configs = others.len();
        let b = by_round(base);
        let mut distinct = b.passes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        rounds = distinct.len();
        bracketed |= distinct.len() < b.passes.len();
        // Seeds as advise's: the default is candidate 0.
        let seed = |i: usize| 0x5eed + 1 + i as u64;
        let judged: Vec<(usize, f64, (f64, f64), Verdict)> = others
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (ratio, ci, v) = judge(&by_round(r), &b, configs, seed(i));
                (i, ratio, ci, v)
            })
            .collect();
        let (i, ratio, mut ci, v) = *judged
            .iter()
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .expect("at least one configuration");
        let best = others[i];
        let pairs = ratios_to_default(&by_round(best), &b);
        if v == Verdict::Dropped && pairs.len() >= 2 {
            // Too few rounds for a verdict: the interval is still shown, for what it is worth.
            ci = corrected_interval(&pairs, configs, seed(i));
        }
        let verdict = match v {
            Verdict::Better => "faster beyond noise",
            Verdict::Worse => "slower beyond noise",
            Verdict::Same | Verdict::Default => "within noise",
            Verdict::Dropped => "too few rounds",
        };
        let count = |w: Verdict| judged.iter().filter(|x| x.3 == w).count();
        lines.push(format!(
            "  {:<8} {:<26} {:<34} {:>6.3}x  {:<12} {:<20} {}/{}\n",
            case.trim_start_matches(engine).trim(),
            format!(
                "{:.4} [{:.4}..{:.4}]",
                base.median_s, base.min_s, base.max_s
            ),
            best.config.values().cloned().collect::<Vec<_>>().join("/"),
            ratio,
            match ci.0.is_nan() {
                true => "-".to_string(),
                false => format!("{:.3}..{:.3}", ci.0, ci.1),
            },
            verdict,
            count(Verdict::Better),
            count(Verdict::Worse),
        ));
    }
    if lines.is_empty() {
        return String::new();
    }
    let bracket = match bracketed {
        true => " (the mean of the default's sessions at the round's start and end)",
        false => "",
    };
    format!(
        "tpch {engine} search: the fastest of {configs} configurations against the default, {rounds} \
         rounds; ratio = median over rounds of its time over the default's in the same \
         round{bracket}, rounds where the default took over {DISTURBED}x its median nearby set \
         aside; interval = bootstrap of that median at {:.2}% confidence (Bonferroni over the \
         configurations, as loci advise); a verdict needs {MIN_RUNS} rounds, the interval clear \
         of 1 and the ratio {:.0}% from 1; last column: configurations faster/slower than the \
         default beyond noise\n  {:<8} {:<26} {:<34} {:>7}  {:<12} {:<20} {}\n{}",
        100.0 * (1.0 - 0.05 / configs.max(1) as f64),
        MIN_EFFECT * 100.0,
        "case",
        "default s [min..max]",
        "fastest configuration",
        "ratio",
        "interval",
        "verdict",
        "f/s",
        lines.concat()
    )
}

/// loci-engine's time over DuckDB's per query (default configuration, same run, same thread
/// count) and the geometric mean of those ratios; empty unless both ran.
fn loci_vs_duckdb(rep: &Report) -> String {
    let median = |engine: &str, q: u32| {
        let case = format!("{engine} q{q:02}");
        let m = rep
            .rows_of(Some(&case))
            .find(|r| baseline(r))
            .map(|r| r.median_s);
        m
    };
    let ratios: Vec<(u32, f64)> = loci::QUERIES
        .iter()
        .filter_map(|&q| Some((q, median("loci", q)? / median("duckdb", q)?)))
        .collect();
    if ratios.is_empty() {
        return String::new();
    }
    let each: Vec<String> = ratios
        .iter()
        .map(|(q, r)| format!("q{q:02} {r:.3}x"))
        .collect();
    format!(
        "tpch loci/duckdb time (default configuration): {}; geomean {:.3}x (q03, q05, q18 join \
         orders and lineitem morsel pair by morsel pair, relying on their co-partitioning by \
         order key, which DuckDB does not use)\n",
        each.join(", "),
        geomean(ratios.iter().map(|x| x.1))
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::bench::tpch::{push_rows, round_order};

    /// Times of one query, each with its round.
    type Timed = Vec<(usize, f64)>;

    /// A report of planted rows, written as the bench writes them: per configuration, times of
    /// q01 and q02 by round (`(round, seconds)`); the n-th time of a round of each query is the
    /// round's n-th session.
    fn planted(engine: &str, runs: &[(&str, Timed, Timed)]) -> Report {
        let mut rep = Report::new("tpch", serde_json::json!({}), Machine::default());
        for (alloc, q1, q2) in runs {
            let mut sessions: Vec<((usize, usize), BTreeMap<u32, f64>)> = Vec::new();
            for (q, v) in [(1, q1), (2, q2)] {
                let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
                for &(r, t) in v {
                    let n = seen.entry(r).or_default();
                    let key = (r, *n);
                    *n += 1;
                    match sessions.iter_mut().find(|s| s.0 == key) {
                        Some(s) => s.1.insert(q, t),
                        None => {
                            sessions.push((key, BTreeMap::from([(q, t)])));
                            None
                        }
                    };
                }
            }
            let sessions: Vec<(usize, BTreeMap<u32, f64>)> =
                sessions.into_iter().map(|((r, _), t)| (r, t)).collect();
            push_rows(
                &mut rep,
                engine,
                &cfg(alloc),
                &sessions,
                &serde_json::Value::Null,
            );
        }
        rep
    }

    fn cfg(alloc: &str) -> Config {
        Config {
            alloc: alloc.to_string(),
            ..Config::default_config()
        }
    }

    fn line_of(s: &str, case: &str) -> String {
        s.lines()
            .find(|l| l.trim_start().starts_with(case))
            .unwrap_or_else(|| panic!("no {case} in {s}"))
            .to_string()
    }

    #[test]
    fn the_search_pairs_configurations_by_round_so_drift_cancels() {
        // Six rounds over which the machine slows by 20%. jemalloc is 5% faster than the default
        // in every round (its rounds recorded in reverse order: pairing is by round, not by
        // position); tcmalloc equals the default within 2% on q01 and is 1.5x slower on q02.
        let drift = |r: usize| 1.0 + 0.04 * r as f64;
        let rounds = 0..6;
        let noise = [1.01, 0.99, 1.02, 0.98, 1.0, 1.01];
        let by = |f: &dyn Fn(usize) -> f64| rounds.clone().map(|r| (r, f(r))).collect::<Vec<_>>();
        let rep = planted(
            "postgres",
            &[
                ("glibc", by(&|r| 2.0 * drift(r)), by(&|r| drift(r))),
                (
                    "jemalloc",
                    by(&|r| 0.95 * 2.0 * drift(r)).into_iter().rev().collect(),
                    by(&|r| 0.95 * drift(r)).into_iter().rev().collect(),
                ),
                (
                    "tcmalloc",
                    by(&|r| 2.0 * drift(r) * noise[r]),
                    by(&|r| 1.5 * drift(r)),
                ),
            ],
        );
        // Through the JSON a run saves and `--summary` reads.
        let rep: Report = serde_json::from_str(&serde_json::to_string(&rep).unwrap()).unwrap();
        let s = search(&rep, "postgres");
        let g = line_of(&s, "geomean");
        assert!(g.contains("jemalloc/first-touch/default/os"), "{g}");
        assert!(g.contains("0.950x") && g.contains("0.950..0.950"), "{g}");
        assert!(
            g.contains("faster beyond noise") && g.ends_with("1/1"),
            "{g}"
        );
        let q = line_of(&s, "q01");
        assert!(
            q.contains("jemalloc") && q.contains("faster beyond noise"),
            "{q}"
        );
        assert!(q.ends_with("1/0"), "tcmalloc is within noise on q01: {q}");
        assert!(line_of(&s, "q02").ends_with("1/1"), "{s}");
        // The unpaired interval (fastest round over the default's slowest .. slowest over its
        // fastest) straddles 1 by the drift and would call jemalloc's 5% noise.
        let row = |alloc: &str| {
            rep.rows_of(Some("postgres q01"))
                .find(|r| r.config["alloc"] == alloc)
                .unwrap()
                .clone()
        };
        let (j, d) = (row("jemalloc"), row("glibc"));
        assert!(j.min_s / d.max_s < 1.0 && j.max_s / d.min_s > 1.0);
        assert!(
            s.contains("of 2 configurations") && s.contains("6 rounds"),
            "{s}"
        );

        // Four rounds: the ratios are given, but no verdict however clear they are.
        let four = |f: &dyn Fn(usize) -> f64| (0..4).map(|r| (r, f(r))).collect::<Vec<_>>();
        let rep = planted(
            "duckdb",
            &[
                ("glibc", four(&|r| drift(r)), four(&|r| drift(r))),
                (
                    "mimalloc",
                    four(&|r| 0.8 * drift(r)),
                    four(&|r| 0.8 * drift(r)),
                ),
            ],
        );
        let g = line_of(&search(&rep, "duckdb"), "geomean");
        assert!(g.contains("0.800x") && g.contains("0.800..0.800"), "{g}");
        assert!(g.contains("too few rounds") && g.ends_with("0/0"), "{g}");

        // One configuration only: no search.
        let rep = planted("datafusion", &[("glibc", four(&drift), four(&drift))]);
        assert_eq!(search(&rep, "datafusion"), "");
    }

    #[test]
    fn rows_name_their_rounds_and_older_results_pair_by_position() {
        let rep = planted(
            "postgres",
            &[(
                "glibc",
                vec![(0, 1.0), (2, 3.0)],
                vec![(0, 1.0), (1, 2.0), (2, 3.0)],
            )],
        );
        let geo = rep.rows_of(Some("postgres geomean")).next().unwrap();
        // Round 1 lacks q01: the geometric mean has rounds 0 and 2 only.
        assert_eq!(by_round(geo).passes, vec![0, 2]);
        assert!((geo.times_s[1] - 3.0).abs() < 1e-12, "{:?}", geo.times_s);
        let mut old = geo.clone();
        old.extra.remove("rounds");
        assert_eq!(by_round(&old).passes, vec![0, 1]);
    }

    #[test]
    fn the_bracketed_default_cancels_drift_within_a_round() {
        // Five configurations that do not differ, eight rounds run as the bench runs them (the
        // default first and last, the others rotated between), on a machine that slows 2% with
        // every session, within rounds and across them.
        let allocs = ["glibc", "jemalloc", "tcmalloc", "mimalloc", "tbbmalloc"];
        let mut sessions: Vec<Vec<(usize, BTreeMap<u32, f64>)>> = vec![Vec::new(); 5];
        let mut k = 0;
        for round in 0..8 {
            for (i, _) in round_order(5, round, true) {
                let t = 1.0 + 0.02 * k as f64;
                k += 1;
                sessions[i].push((round, BTreeMap::from([(1, 2.0 * t), (2, t)])));
            }
        }
        let mut rep = Report::new("tpch", serde_json::json!({}), Machine::default());
        for (a, s) in allocs.iter().zip(&sessions) {
            push_rows(&mut rep, "postgres", &cfg(a), s, &serde_json::Value::Null);
        }
        let rep: Report = serde_json::from_str(&serde_json::to_string(&rep).unwrap()).unwrap();
        let s = search(&rep, "postgres");
        for case in ["geomean", "q01", "q02"] {
            let l = line_of(&s, case);
            assert!(l.contains("within noise") && l.ends_with("0/0"), "{l}");
        }
        assert!(
            s.contains("of 4 configurations")
                && s.contains("8 rounds")
                && s.contains("start and end"),
            "{s}"
        );
        // Both of the default's sessions are its samples; the pairing takes their mean.
        let rows = |case: &str| rep.rows_of(Some(case)).cloned().collect::<Vec<Row>>();
        let geo = rows("postgres geomean");
        let base = by_round(&geo[0]);
        assert_eq!(base.runs(), 16);
        assert_eq!(&base.passes[..4], &[0, 0, 1, 1]);
        // Paired with the default's session at the start of each round only, every other
        // configuration (all ran after it) would be judged slower.
        let mut first = Samples::default();
        for (r, v) in base.iter() {
            if first.at(r).is_none() {
                first.push(r, v);
            }
        }
        for r in &geo[1..] {
            let c = by_round(r);
            assert_eq!(judge(&c, &first, 4, 1).2, Verdict::Worse, "{:?}", r.config);
            let (ratio, _, v) = judge(&c, &base, 4, 1);
            assert_eq!(v, Verdict::Same, "{:?}", r.config);
            assert!((ratio - 1.0).abs() < 0.015, "{ratio}");
        }
    }

    #[test]
    fn a_result_saved_before_rows_named_rounds_re_summarises_as_before() {
        // One default session per round and no `extra.rounds`: paired by position, the same
        // search as with the rounds named.
        let six = |f: &dyn Fn(usize) -> f64| (0..6).map(|r| (r, f(r))).collect::<Vec<_>>();
        let rep = planted(
            "postgres",
            &[
                ("glibc", six(&|r| 1.0 + 0.1 * r as f64), six(&|_| 1.0)),
                (
                    "jemalloc",
                    six(&|r| 0.9 * (1.0 + 0.1 * r as f64)),
                    six(&|_| 1.0),
                ),
            ],
        );
        let mut old = rep.clone();
        for r in &mut old.results {
            r.extra.remove("rounds");
        }
        let s = search(&old, "postgres");
        assert_eq!(s, search(&rep, "postgres"));
        assert!(!s.contains("start and end"), "{s}");
        let g = line_of(&s, "geomean");
        assert!(
            g.contains("faster beyond noise") && s.contains("6 rounds"),
            "{s}"
        );
        assert!(line_of(&s, "q01").contains("0.900x"), "{s}");
    }
}
