//! What is printed after the table: the baseline row of the `vs base` column and the ratios of
//! loci to each peer.

use loci_report::{Report, Row};

use super::DEFAULT_CONFIG;

/// Whether a row ran loci's default configuration.
fn is_default(r: &Row) -> bool {
    r.system == "loci"
        && DEFAULT_CONFIG
            .iter()
            .all(|(k, v)| r.config.get(*k).map(String::as_str) == Some(*v))
}

/// The baseline row of the `vs base` column: `os + first-touch (by the workers) + glibc`, under the unpinned
/// scheduler when it ran (the OS-default configuration of seed 002), else under the first one.
pub fn baseline(rep: &Report) -> impl Fn(&Row) -> bool {
    let base = |r: &Row| {
        r.system == "loci"
            && r.config.get("threads").map(String::as_str) == Some("os")
            && r.config.get("mem").map(String::as_str) == Some("first-touch")
            && r.config.get("gen").map(String::as_str) == Some("workers")
            && r.config.get("alloc").map(String::as_str) == Some("glibc")
    };
    let unpinned = rep
        .results
        .iter()
        .any(|r| base(r) && r.config.get("sched").map(String::as_str) == Some("unpinned"));
    move |r: &Row| {
        base(r) && (!unpinned || r.config.get("sched").map(String::as_str) == Some("unpinned"))
    }
}

/// Median time of a loci row, for W4 the build plus the probe of the same configuration and
/// index (`.../probe` rows; None for the others).
fn loci_time(rep: &Report, r: &Row) -> Option<f64> {
    let case = r.case.as_deref().unwrap_or("");
    match case.strip_suffix("/probe") {
        Some(stem) => {
            let build = rep.results.iter().find(|b| {
                b.system == "loci"
                    && b.config == r.config
                    && b.case.as_deref() == Some(&format!("{stem}/build"))
            })?;
            Some(r.median_s + build.median_s)
        }
        None if case.ends_with("/build") => None,
        None => Some(r.median_s),
    }
}

/// Lines comparing loci with each peer, medians of the reps on both sides: first loci's default
/// configuration ([`DEFAULT_CONFIG`], fixed before the run: the headline ratio), then the best
/// row of the matrix, labelled as such. W4: loci's build + probe against the peer's hash join
/// (which builds and probes).
pub fn peer_ratios(rep: &Report) -> Vec<String> {
    let mut out = Vec::new();
    let peers: Vec<&Row> = rep.results.iter().filter(|r| r.system != "loci").collect();
    for p in peers {
        let case = p.case.as_deref().unwrap_or("");
        let prefix = case
            .strip_suffix("/peer hash join")
            .or_else(|| case.strip_suffix("/peer"))
            .unwrap_or(case);
        let loci: Vec<(&Row, f64)> = rep
            .results
            .iter()
            .filter(|r| {
                r.system == "loci"
                    && r.case
                        .as_deref()
                        .is_some_and(|c| c.starts_with(&format!("{prefix}/")))
            })
            .filter_map(|r| loci_time(rep, r).map(|t| (r, t)))
            .collect();
        let timed = p.extra.get("timed").and_then(|t| t.as_str()).unwrap_or("");
        let peer_th = p.config.get("threads").cloned().unwrap_or_default();
        let what = |r: &Row| {
            format!(
                "{} [{}]",
                r.label(),
                r.case.as_deref().unwrap_or("").trim_end_matches("/probe")
            )
        };
        // The default row: the first variant of the default configuration.
        match loci.iter().find(|(r, _)| is_default(r)) {
            Some((r, t)) => out.push(format!(
                "{prefix}: loci default vs {}: {:.2}x  ({} {:.3} s vs {} {:.3} s with {peer_th} threads{}; medians of reps)",
                p.system,
                t / p.median_s,
                what(r),
                t,
                p.system,
                p.median_s,
                if timed.is_empty() {
                    String::new()
                } else {
                    format!("; {} timed: {timed}", p.system)
                }
            )),
            None => out.push(format!(
                "{prefix}: loci default vs {}: not run (the default configuration {} is not in this matrix)",
                p.system,
                DEFAULT_CONFIG
                    .iter()
                    .map(|x| x.1)
                    .collect::<Vec<_>>()
                    .join("/")
            )),
        }
        if let Some((r, t)) = loci.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
            out.push(format!(
                "{prefix}: loci best of matrix vs {}: {:.2}x  ({} {:.3} s vs {} {:.3} s; medians of reps)",
                p.system,
                t / p.median_s,
                what(r),
                t,
                p.system,
                p.median_s
            ));
        }
    }
    out
}
