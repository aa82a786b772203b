//! The goals printed after the table: loci against its peers like for like, per case.

use loci_report::{median, Report, Row};

/// Which loci rows a comparison takes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loci {
    /// `loci` rows with the result-buffer pool on (results in recycled, faulted memory).
    Pool,
    /// `loci-nopool` rows, or `loci` rows of a `--pool off` run (fresh memory every result).
    NoPool,
}

/// What loci is compared with in one line of the goals.
#[derive(Clone, Copy, Debug)]
enum Peer {
    /// The row of this system (and, for memcpy, this `dst`).
    Row(&'static str, Option<&'static str>),
    /// Per case, the fastest of these systems' rows.
    FastestOf(&'static [&'static str]),
}

/// One line of the goals: loci (`loci`) against `peer`; ratio = peer's median time / loci's.
#[derive(Clone, Copy, Debug)]
struct Goal {
    what: &'static str,
    loci: Loci,
    peer: Peer,
    bar: f64,
    /// Only cases whose result has more bytes than this (0: every case).
    min_bytes: u64,
}

/// The headline: like with like. loci reusing its result memory (the pool) against numpy
/// reusing its result on as many threads, and against memcpy into a faulted buffer; loci
/// mapping fresh memory for each result against numpy allocating a fresh one, and against
/// memcpy into a new mapping.
const HEADLINE: [Goal; 4] = [
    Goal {
        what: "loci, pool on  vs numpy-threads (np.copyto into a reused result, as many threads)",
        loci: Loci::Pool,
        peer: Peer::Row("numpy-threads", None),
        bar: 1.3,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool off vs numpy (a fresh result every rep, 1 thread)",
        loci: Loci::NoPool,
        peer: Peer::Row("numpy", None),
        bar: 1.3,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool on  vs memcpy into a prefaulted buffer (the limit, 1 thread)",
        loci: Loci::Pool,
        peer: Peer::Row("memcpy", Some("prefaulted")),
        bar: 0.8,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool off vs memcpy into a new mapping (page faults included, 1 thread)",
        loci: Loci::NoPool,
        peer: Peer::Row("memcpy", Some("new-mapping")),
        bar: 0.8,
        min_bytes: 0,
    },
];

/// Extra lines, not like with like (labelled so): the headline before 2026-11-25 (loci with the
/// pool against numpy's fresh result and a new mapping), numpy's reused result on one thread, the
/// faster numpy with a reused result per case, and what the pool is worth to loci.
const EXTRA: [Goal; 6] = [
    Goal {
        what: "loci, pool on  vs numpy (fresh result, 1 thread; the headline before 2026-11-25)",
        loci: Loci::Pool,
        peer: Peer::Row("numpy", None),
        bar: 1.3,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool on  vs numpy-prealloc (np.copyto into a reused result, 1 thread)",
        loci: Loci::Pool,
        peer: Peer::Row("numpy-prealloc", None),
        bar: 1.3,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool on  vs the faster of numpy-prealloc and numpy-threads per case",
        loci: Loci::Pool,
        peer: Peer::FastestOf(&["numpy-prealloc", "numpy-threads"]),
        bar: 1.3,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool on  vs memcpy into a new mapping (the line before 2026-11-25)",
        loci: Loci::Pool,
        peer: Peer::Row("memcpy", Some("new-mapping")),
        bar: 0.8,
        min_bytes: 0,
    },
    Goal {
        what: "loci, pool off vs numpy, results over 32 MiB only (smaller ones glibc's malloc recycles for numpy)",
        loci: Loci::NoPool,
        peer: Peer::Row("numpy", None),
        bar: 1.3,
        min_bytes: GLIBC_MMAP_THRESHOLD_MAX,
    },
    Goal {
        what: "loci, pool on  vs loci-nopool (what the pool is worth)",
        loci: Loci::Pool,
        peer: Peer::Row("loci-nopool", None),
        bar: 1.0,
        min_bytes: 0,
    },
];

/// glibc's largest dynamic mmap threshold (`DEFAULT_MMAP_THRESHOLD_MAX`, 64-bit): once a freed
/// mmapped block has raised the threshold, `malloc` serves blocks up to this size from its heap,
/// so numpy's "fresh" result of each rep is recycled, already faulted memory below it (page faults
/// per rep measured: docs/array.md). Only larger results are fresh memory for numpy too.
const GLIBC_MMAP_THRESHOLD_MAX: u64 = 32 << 20;

/// The pool setting of a loci row (`on` for rows written before the field existed).
fn pool_of(r: &Row) -> &str {
    r.extra.get("pool").and_then(|v| v.as_str()).unwrap_or("on")
}

/// The loci row of one case's `rows` that a goal takes: of the rows with (`Pool`) or without
/// (`NoPool`) the pool, the `search` one, else the first.
fn loci_row<'a>(rows: &[&'a Row], which: Loci) -> Option<&'a Row> {
    let of_kind: Vec<&Row> = rows
        .iter()
        .copied()
        .filter(|r| match which {
            Loci::Pool => r.system == "loci" && pool_of(r) == "on",
            Loci::NoPool => {
                r.system == "loci-nopool" || (r.system == "loci" && pool_of(r) == "off")
            }
        })
        .collect();
    of_kind
        .iter()
        .find(|r| r.config.get("threads").map(String::as_str) == Some("search"))
        .or_else(|| of_kind.first())
        .copied()
}

/// The peer row of one case's `rows` that a goal takes.
fn peer_row<'a>(rows: &[&'a Row], peer: Peer) -> Option<&'a Row> {
    match peer {
        Peer::Row(sys, dst) => rows.iter().copied().find(|r| {
            r.system == sys
                && dst.is_none_or(|d| r.config.get("dst").map(String::as_str) == Some(d))
        }),
        Peer::FastestOf(systems) => rows
            .iter()
            .copied()
            .filter(|r| systems.contains(&r.system.as_str()))
            .min_by(|a, b| a.median_s.total_cmp(&b.median_s)),
    }
}

/// Per case (in the report's order), the ratio of a goal: peer's median time / loci's.
fn goal_ratios(rep: &Report, g: &Goal) -> Vec<(String, f64)> {
    let mut cases: Vec<&str> = Vec::new();
    for r in &rep.results {
        if let Some(c) = r.case.as_deref() {
            if !cases.contains(&c) {
                cases.push(c);
            }
        }
    }
    cases
        .into_iter()
        .filter_map(|case| {
            let rows: Vec<&Row> = rep.rows_of(Some(case)).collect();
            let loci = loci_row(&rows, g.loci)?;
            let bytes = loci.extra.get("result_bytes").and_then(|b| b.as_u64());
            if g.min_bytes > 0 && bytes.is_none_or(|b| b <= g.min_bytes) {
                return None;
            }
            let peer = peer_row(&rows, g.peer)?;
            Some((case.to_string(), peer.median_s / loci.median_s))
        })
        .collect()
}

/// One printed line of a goal: median, count at the bar, and (with `below`) the cases under it.
fn goal_line(g: &Goal, ratios: &[(String, f64)], below: bool) -> Option<String> {
    if ratios.is_empty() {
        return None;
    }
    let v: Vec<f64> = ratios.iter().map(|(_, x)| *x).collect();
    let met = v.iter().filter(|&&x| x >= g.bar).count();
    let mut line = format!(
        "  {}: median {:.2}x, {met} of {} cases >= {}x",
        g.what,
        median(&v).unwrap_or(0.0),
        v.len(),
        g.bar
    );
    let under: Vec<String> = ratios
        .iter()
        .filter(|(_, x)| *x < g.bar)
        .map(|(c, x)| format!("{c} {x:.2}x"))
        .collect();
    if below && !under.is_empty() {
        line += &format!("; below: {}", under.join(", "));
    }
    Some(line + "\n")
}

/// The bars from this run, like with like (the headline, [`HEADLINE`]): per case, loci's
/// `search` (else the first loci strategy) with the result-buffer pool against `numpy-threads`
/// (speed-up, bar 1.3x) and memcpy into a prefaulted buffer (bandwidth ratio, bar 0.8x), and
/// loci without the pool against `numpy`'s fresh result (1.3x) and memcpy into a new mapping
/// (0.8x); then the labelled extra ratios ([`EXTRA`]), the thread counts of loci and
/// numpy-threads, and the result-buffer pool's counters.
pub fn goals(rep: &Report) -> String {
    let mut out = String::from(
        "
subarray goals, like for like (loci `search`, or the first loci strategy, per case; medians of the reps):
",
    );
    for g in &HEADLINE {
        out += &goal_line(g, &goal_ratios(rep, g), true).unwrap_or_default();
    }
    let extra: String = EXTRA
        .iter()
        .filter_map(|g| goal_line(g, &goal_ratios(rep, g), false))
        .collect();
    if !extra.is_empty() {
        out += "extra ratios (not like for like, or not a goal):\n";
        out += &extra;
    }
    let loci_threads = rep.params.get("threads").and_then(|t| t.as_u64());
    let np_threads: Vec<&str> = rep
        .results
        .iter()
        .filter(|r| r.system == "numpy-threads")
        .filter_map(|r| r.config.get("threads").map(String::as_str))
        .collect();
    if let Some(n) = loci_threads {
        out += &format!("  threads per query: loci {n}");
        if let Some(t) = np_threads.first() {
            let same = np_threads.iter().all(|x| x.parse::<u64>().ok() == Some(n));
            out += &format!(
                ", numpy-threads {t}{}",
                if same { " (equal)" } else { " (NOT equal)" }
            );
        }
        out += "; numpy, numpy-prealloc and memcpy 1\n";
    }
    match rep.params.get("pool_stats") {
        Some(st) => {
            out += &format!(
                "  result-buffer pool (cap {} MiB): {} hits, {} misses, {} bypassed, {} evicted; {} MiB in {} buffers held at the end\n",
                st["cap"].as_u64().unwrap_or(0) >> 20,
                st["hits"], st["misses"], st["bypassed"], st["evicted"],
                st["bytes_held"].as_u64().unwrap_or(0) >> 20,
                st["buffers_held"],
            );
        }
        None => out += "  result-buffer pool: off (every result in fresh memory)\n",
    }
    out
}

#[cfg(test)]
mod tests {
    use loci_report::Machine;

    use super::*;

    /// A row of `sys` in `case` whose median is `s` seconds.
    fn row(sys: &str, case: &str, s: f64) -> Row {
        Row::from_times(sys, vec![s]).case(case)
    }

    /// A run with the pool on, two cases: loci `os` and `search` (pool on), loci-nopool, the
    /// numpy peers and both memcpys.
    fn report(np_threads: &str) -> Report {
        let mut rep = Report::new(
            "subarray",
            serde_json::json!({ "threads": 2, "pool": "on" }),
            Machine {
                nodes: 1,
                cpus: 2,
                ..Machine::default()
            },
        );
        for (case, k, bytes) in [("a", 1.0, 10u64 << 20), ("b", 2.0, 100 << 20)] {
            rep.results.extend([
                // `os` is slower and listed first: the goals must take `search`.
                row("loci", case, 9.0 * k)
                    .config("threads", "os")
                    .extra("pool", "on"),
                row("loci", case, 1.0 * k)
                    .config("threads", "search")
                    .extra("pool", "on"),
                row("loci-nopool", case, 2.0 * k)
                    .config("threads", "search")
                    .extra("pool", "off")
                    .extra("result_bytes", bytes),
                row("numpy", case, 3.0 * k).config("threads", 1),
                row("numpy-prealloc", case, 1.2 * k).config("threads", 1),
                row("numpy-threads", case, if case == "a" { 1.5 } else { 2.2 })
                    .config("threads", np_threads),
                row("memcpy", case, 0.7 * k).config("dst", "prefaulted"),
                row("memcpy", case, 1.8 * k).config("dst", "new-mapping"),
            ]);
        }
        rep
    }

    /// The line of `goals` output that starts with `what`.
    fn line<'a>(out: &'a str, what: &str) -> &'a str {
        out.lines()
            .find(|l| l.trim_start().starts_with(what))
            .unwrap_or_else(|| panic!("no line `{what}` in\n{out}"))
    }

    /// The headline pairs like with like: loci with the pool against numpy-threads and the
    /// prefaulted memcpy, loci-nopool against numpy's fresh result and the new mapping; the old
    /// ratios stay as labelled extra lines; the cases under a bar are named.
    #[test]
    fn goals_pair_like_with_like() {
        let out = goals(&report("2"));
        // numpy-threads / loci search (pool on): a 1.5/1.0, b 2.2/2.0.
        assert_eq!(
            line(&out, "loci, pool on  vs numpy-threads"),
            "  loci, pool on  vs numpy-threads (np.copyto into a reused result, as many threads): \
             median 1.30x, 1 of 2 cases >= 1.3x; below: b 1.10x"
        );
        // numpy / loci-nopool: 1.5 in both.
        assert!(
            line(&out, "loci, pool off vs numpy (").ends_with("median 1.50x, 2 of 2 cases >= 1.3x"),
            "{out}"
        );
        // memcpy prefaulted / loci (pool on): 0.7; new mapping / loci-nopool: 0.9.
        assert!(
            line(&out, "loci, pool on  vs memcpy into a prefaulted buffer")
                .ends_with("median 0.70x, 0 of 2 cases >= 0.8x; below: a 0.70x, b 0.70x"),
            "{out}"
        );
        assert!(
            line(&out, "loci, pool off vs memcpy into a new mapping")
                .ends_with("median 0.90x, 2 of 2 cases >= 0.8x"),
            "{out}"
        );
        // The headline comes before the extra lines.
        let extra_at = out.find("extra ratios").expect("extra section");
        assert!(out.find("loci, pool off vs memcpy").unwrap() < extra_at);
        // Old headline (numpy fresh against loci with the pool): 3.0 in both.
        assert!(
            line(&out, "loci, pool on  vs numpy (fresh result")
                .ends_with("median 3.00x, 2 of 2 cases >= 1.3x"),
            "{out}"
        );
        assert!(line(&out, "loci, pool on  vs numpy-prealloc").contains("median 1.20x"));
        // The faster numpy with a reused result: a prealloc 1.2 (1.2x), b threads 2.2 (1.1x).
        assert!(
            line(&out, "loci, pool on  vs the faster of")
                .ends_with("median 1.15x, 0 of 2 cases >= 1.3x"),
            "{out}"
        );
        assert!(line(&out, "loci, pool on  vs loci-nopool").contains("median 2.00x"));
        // Only `b`'s result is over 32 MiB.
        assert!(
            line(&out, "loci, pool off vs numpy, results over 32 MiB")
                .ends_with("median 1.50x, 1 of 1 cases >= 1.3x"),
            "{out}"
        );
        assert!(
            line(&out, "threads per query").contains("loci 2, numpy-threads 2 (equal)"),
            "{out}"
        );
        assert!(out.contains("result-buffer pool: off"), "{out}");
        // A pool of another size than loci's threads is called out.
        let out = goals(&report("1"));
        assert!(
            line(&out, "threads per query").contains("(NOT equal)"),
            "{out}"
        );
    }

    /// A `--pool off` run has no pooled loci rows: its loci rows pair with numpy's fresh result
    /// and the new mapping, and the pool-on lines are left out rather than filled wrongly.
    #[test]
    fn goals_of_a_pool_off_run() {
        let mut rep = report("2");
        rep.results.retain(|r| {
            r.system != "loci-nopool" && r.config.get("threads").map(String::as_str) != Some("os")
        });
        for r in &mut rep.results {
            if r.system == "loci" {
                r.extra.insert("pool".into(), "off".into());
            }
        }
        let out = goals(&rep);
        assert!(!out.contains("pool on "), "{out}");
        // numpy / loci (pool off): 3.0; new mapping: 1.8.
        assert!(line(&out, "loci, pool off vs numpy (").contains("median 3.00x"));
        assert!(line(&out, "loci, pool off vs memcpy into a new mapping").contains("median 1.80x"));
        // Rows of JSON written before the `pool` field count as pool on.
        let mut old = report("2");
        for r in &mut old.results {
            r.extra.remove("pool");
        }
        old.results.retain(|r| r.system != "loci-nopool");
        let out = goals(&old);
        assert!(line(&out, "loci, pool on  vs numpy-threads").contains("median 1.30x"));
        assert!(!out.contains("pool off vs"), "{out}");
    }
}
