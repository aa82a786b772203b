//! Answers checked across engines and configurations: every session's rows (written by
//! bench/tpch/tpch.py with `--answers`) must equal the first session's, row by row in order
//! (every multi-row TPC-H query orders its result; the query files add tie-breakers where the
//! spec's order leaves ties).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use serde_json::Value;

/// Numbers agree when |a - b| <= max(RELATIVE * max(|a|, |b|), ABSOLUTE): sums of decimals are
/// exact in every engine, but averages and ratios are floating point in DuckDB, NUMERIC in
/// PostgreSQL and DECIMAL with 6 digits after the point (truncated) in DataFusion.
pub const RELATIVE: f64 = 1e-9;
pub const ABSOLUTE: f64 = 1e-6;
pub const TOLERANCE_TEXT: &str =
    "numbers within 1e-9 relative or 1e-6 absolute, text and dates exact, rows in order";

type Answers = BTreeMap<String, Vec<Vec<Value>>>;

/// dbgen's answer to query `q` at SF 1, as rows of trimmed cells (the header line left out). The
/// tpchgen crate ships them (tpchgen-cli, which writes the data, is built on that crate and
/// writes dbgen's data byte for byte).
fn dbgen_sf1(q: u32) -> Option<Vec<Vec<String>>> {
    let text = tpchgen::q_and_a::answers_sf1::answer(q as i32)?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    lines.next()?;
    Some(
        lines
            .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
            .collect(),
    )
}

/// How a cell agrees with dbgen's printed value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Agree {
    /// To the last digit dbgen prints; counts, keys and text exactly.
    Printed,
    /// Only within TPC-H's own validation tolerance (clause 2.1.3.5: sums within 100, averages
    /// and ratios within 1%), taken as the smaller of the two so that it holds for either kind.
    Spec,
    No,
}

/// One cell against dbgen's printed value. Numbers printed with decimals (money, averages,
/// ratios; dbgen rounds them to cents) agree to one unit of the last digit, or failing that
/// within the spec's tolerance; whole numbers (counts, keys) exactly, up to the f64 rounding of a
/// large one; text exactly after trimming the padding of fixed-width columns.
fn agree(got: &Value, want: &str) -> Agree {
    let got_text = match got {
        Value::String(s) => s.trim().to_string(),
        other => other.to_string(),
    };
    let (Ok(g), Ok(w)) = (got_text.parse::<f64>(), want.parse::<f64>()) else {
        return if got_text == want {
            Agree::Printed
        } else {
            Agree::No
        };
    };
    let d = (g - w).abs();
    match want.split_once('.').map_or(0, |(_, x)| x.len()) {
        0 if d <= 1e-9 * w.abs() => Agree::Printed,
        0 => Agree::No,
        decimals if d <= 10f64.powi(-(decimals as i32)) => Agree::Printed,
        _ if d <= (0.01 * w.abs()).min(100.0) => Agree::Spec,
        _ => Agree::No,
    }
}

/// Cells the shipped reference prints cut short: Q11's `ps_partkey` holds only the key's first
/// four digits (`1297` for part 129760; the value beside it is complete). They are compared as a
/// prefix.
const CUT_SHORT: [(u32, usize); 1] = [(11, 0)];

/// `got` against dbgen's SF 1 answers, for the queries both have: the queries that agree only
/// within the spec's tolerance, or the first difference.
fn diff_dbgen(got: &Answers) -> Result<Vec<String>, String> {
    let mut loose = Vec::new();
    for (name, rows) in got {
        let Some(want) = name
            .trim_start_matches('q')
            .parse()
            .ok()
            .and_then(dbgen_sf1)
        else {
            continue;
        };
        let q: u32 = name.trim_start_matches('q').parse().unwrap_or(0);
        if rows.len() != want.len() {
            return Err(format!("{name}: {} rows, dbgen {}", rows.len(), want.len()));
        }
        let mut worst = Agree::Printed;
        for (i, (g, w)) in rows.iter().zip(&want).enumerate() {
            let cell = |c: usize, a: &Value, b: &String| {
                if CUT_SHORT.contains(&(q, c)) {
                    let a = a.to_string();
                    if a.trim_matches('"').starts_with(b.as_str()) {
                        Agree::Printed
                    } else {
                        Agree::No
                    }
                } else {
                    agree(a, b)
                }
            };
            let row = (g.len() == w.len())
                .then(|| {
                    g.iter()
                        .zip(w)
                        .enumerate()
                        .map(|(c, (a, b))| cell(c, a, b))
                        .max()
                })
                .flatten()
                .unwrap_or(Agree::No);
            if row == Agree::No {
                return Err(format!("{name} row {i}: {g:?}, dbgen {w:?}"));
            }
            worst = worst.max(row);
        }
        if worst == Agree::Spec {
            loose.push(name.clone());
        }
    }
    Ok(loose)
}

/// The reference answers (the first session's) and who matched them.
#[derive(Default)]
pub struct Check {
    reference: Option<(String, Answers)>,
    matched: Vec<String>,
}

impl Check {
    /// Compares the answers in `path` (of session `who`) with the reference, or makes them it.
    pub fn add(&mut self, who: &str, path: &Path) -> anyhow::Result<()> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let got: Answers =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        match &self.reference {
            None => self.reference = Some((who.to_string(), got)),
            Some((ref_who, want)) => {
                if let Some(diff) = diff(want, &got) {
                    bail!("TPC-H answers differ: {who} vs {ref_who}: {diff}");
                }
            }
        }
        self.matched.push(who.to_string());
        Ok(())
    }

    /// Like [`Check::add`] for an engine that runs some of the queries (loci-engine): its
    /// answers are compared with the reference's answers to the same queries; with no
    /// reference yet they become it.
    pub fn add_subset(&mut self, who: &str, path: &Path) -> anyhow::Result<()> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let got: Answers =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let n = got.len();
        match &self.reference {
            None => self.reference = Some((who.to_string(), got)),
            Some((ref_who, want)) => {
                let want: Answers = want
                    .iter()
                    .filter(|(q, _)| got.contains_key(*q))
                    .map(|(q, r)| (q.clone(), r.clone()))
                    .collect();
                if let Some(diff) = diff(&want, &got) {
                    bail!("TPC-H answers differ: {who} vs {ref_who}: {diff}");
                }
            }
        }
        self.matched.push(format!("{who} ({n} queries)"));
        Ok(())
    }

    /// At SF 1: the reference answers against dbgen's (those every other session matched).
    pub fn against_dbgen(&self) -> anyhow::Result<String> {
        let Some((who, got)) = &self.reference else {
            bail!("no answers to compare with dbgen's");
        };
        let loose = diff_dbgen(got).map_err(|d| {
            anyhow::anyhow!(
                "TPC-H answers differ from dbgen's reference answers at SF 1: {who}: {d}"
            )
        })?;
        let mut line = format!(
            "{} of {} queries equal dbgen's reference answers at SF 1 to the digit it prints",
            got.len() - loose.len(),
            got.len()
        );
        if !loose.is_empty() {
            line += &format!(
                "; {} within TPC-H's validation tolerance (sums within 100, averages 1%) only",
                loose.join(", ")
            );
        }
        Ok(line)
    }

    /// One line: how many queries agreed across which sessions.
    pub fn summary(&self) -> String {
        let n = self.reference.as_ref().map_or(0, |r| r.1.len());
        format!(
            "{n} queries identical across {} ({TOLERANCE_TEXT})",
            self.matched.join(", ")
        )
    }
}

/// The first difference between two answer sets, described; None when they agree.
pub fn diff(want: &Answers, got: &Answers) -> Option<String> {
    if want.keys().ne(got.keys()) {
        return Some(format!(
            "different queries: {:?} vs {:?}",
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>()
        ));
    }
    for (q, w) in want {
        let g = &got[q];
        if g.len() != w.len() {
            return Some(format!("{q}: {} rows vs {}", g.len(), w.len()));
        }
        for (i, (gr, wr)) in g.iter().zip(w).enumerate() {
            if gr.len() != wr.len() || gr.iter().zip(wr).any(|(a, b)| !same(a, b)) {
                return Some(format!("{q} row {i}: {gr:?} vs {wr:?}"));
            }
        }
    }
    None
}

/// One value: numbers within [`RELATIVE`] or [`ABSOLUTE`], anything else equal.
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() <= (RELATIVE * x.abs().max(y.abs())).max(ABSOLUTE),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dbgen_answers_are_read_and_compared_to_the_printed_digit() {
        let q6 = dbgen_sf1(6).unwrap();
        assert_eq!(q6, vec![vec!["123141078.23".to_string()]]);
        assert_eq!(dbgen_sf1(1).unwrap().len(), 4);
        assert!(dbgen_sf1(23).is_none());
        let ok = answers(serde_json::json!({"q06": [[123141078.2283]]}));
        assert_eq!(diff_dbgen(&ok), Ok(vec![]));
        let spec = answers(serde_json::json!({"q06": [[123141078.25]]}));
        assert_eq!(
            diff_dbgen(&spec),
            Ok(vec!["q06".to_string()]),
            "within 100 of a sum"
        );
        let off = answers(serde_json::json!({"q06": [[123141278.23]]}));
        assert!(diff_dbgen(&off).unwrap_err().contains("q06 row 0"));
        assert_eq!(
            agree(&serde_json::json!(25.6), "25.52"),
            Agree::Spec,
            "an average within 1%"
        );
        assert_eq!(agree(&serde_json::json!(26.0), "25.52"), Agree::No);
        let q4 = answers(serde_json::json!({"q04": [
            ["1-URGENT", 10594], ["2-HIGH", 10476], ["3-MEDIUM", 10410],
            ["4-NOT SPECIFIED", 10556], ["5-LOW", 10487]]}));
        assert_eq!(diff_dbgen(&q4), Ok(vec![]));
        let count_off = answers(serde_json::json!({"q04": [
            ["1-URGENT", 10595], ["2-HIGH", 10476], ["3-MEDIUM", 10410],
            ["4-NOT SPECIFIED", 10556], ["5-LOW", 10487]]}));
        assert!(diff_dbgen(&count_off).is_err(), "counts are exact");
        let short = answers(serde_json::json!({"q04": [["1-URGENT", 10594]]}));
        assert!(diff_dbgen(&short).unwrap_err().contains("1 rows, dbgen 5"));
        let q11 = answers(serde_json::json!({"q11": [[129760, 17538456.86]]}));
        let q11: Answers = q11
            .into_iter()
            .map(|(k, mut v)| {
                v.extend(dbgen_sf1(11).unwrap().into_iter().skip(1).map(|r| {
                    let key = format!("{}99", r[0]);
                    vec![
                        serde_json::json!(key.parse::<u64>().unwrap()),
                        serde_json::json!(r[1].parse::<f64>().unwrap()),
                    ]
                }));
                (k, v)
            })
            .collect();
        assert_eq!(
            diff_dbgen(&q11),
            Ok(vec![]),
            "Q11's keys are printed cut short"
        );
        let text = |s: &str, w: &str| agree(&serde_json::json!(s), w);
        assert_eq!(
            text("Supplier#000005359   ", "Supplier#000005359"),
            Agree::Printed
        );
        assert_eq!(text("1995-03-05", "1995-03-05"), Agree::Printed);
        assert_eq!(text("1995-03-06", "1995-03-05"), Agree::No);
    }

    fn answers(v: Value) -> Answers {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_subset_is_checked_on_its_own_queries() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, v: Value| {
            let p = dir.path().join(name);
            std::fs::write(&p, v.to_string()).unwrap();
            p
        };
        let all = write(
            "all.json",
            serde_json::json!({"q01": [[1.0]], "q02": [[2.0]]}),
        );
        let same = write("same.json", serde_json::json!({"q01": [[1.0]]}));
        let off = write("off.json", serde_json::json!({"q01": [[1.5]]}));
        let extra = write("extra.json", serde_json::json!({"q03": [[1.0]]}));
        let mut c = Check::default();
        c.add("duckdb", &all).unwrap();
        c.add_subset("loci", &same).unwrap();
        let e = c.add_subset("loci", &off).unwrap_err().to_string();
        assert!(e.contains("q01 row 0"), "{e}");
        let e = c.add_subset("loci", &extra).unwrap_err().to_string();
        assert!(e.contains("different queries"), "{e}");
        assert!(c.summary().contains("loci (1 queries)"), "{}", c.summary());
    }

    #[test]
    fn numbers_within_tolerance_agree_and_others_do_not() {
        let a = answers(serde_json::json!({"q01": [["A", 1.0, "1998-09-02", 3]]}));
        assert_eq!(diff(&a, &a), None);
        let close = answers(serde_json::json!({"q01": [["A", 1.0 + 9e-7, "1998-09-02", 3.0]]}));
        assert_eq!(diff(&a, &close), None);
        let far = answers(serde_json::json!({"q01": [["A", 1.001, "1998-09-02", 3]]}));
        assert!(diff(&a, &far).unwrap().contains("q01 row 0"));
        let text = answers(serde_json::json!({"q01": [["B", 1.0, "1998-09-02", 3]]}));
        assert!(diff(&a, &text).is_some());
        let order =
            answers(serde_json::json!({"q01": [["A", 1.0, "1998-09-02", 3], ["B", 2, null, 1]]}));
        let swapped =
            answers(serde_json::json!({"q01": [["B", 2, null, 1], ["A", 1.0, "1998-09-02", 3]]}));
        assert!(diff(&order, &swapped).is_some());
        assert!(diff(&a, &order).unwrap().contains("2 rows vs 1"));
        let other = answers(serde_json::json!({"q02": []}));
        assert!(diff(&a, &other).unwrap().contains("different queries"));
    }
}
