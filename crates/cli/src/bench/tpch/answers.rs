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

    fn answers(v: Value) -> Answers {
        serde_json::from_value(v).unwrap()
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
