//! What `loci bench sched` prints after its table: cpu time per task, the scheduler's counters
//! and the goals.

use loci_report::{Report, Row};
use loci_sched::{Rule, Stats};

pub(super) fn counters_json(st: &Stats) -> serde_json::Value {
    let found: serde_json::Map<String, serde_json::Value> = Rule::ALL
        .iter()
        .filter(|&&r| st.found_by(r) > 0)
        .map(|&r| (r.name().to_string(), st.found_by(r).into()))
        .collect();
    let shares: Vec<f64> = st.requests.iter().map(|r| r.main_node().1).collect();
    serde_json::json!({
        "tasks": st.tasks,
        "parks": st.parks,
        "joins": st.joins,
        "join_steals": st.join_steals,
        "found_by_rule": found,
        "steals": {
            "same_group": st.steals.same_group,
            "same_node": st.steals.same_node,
            "other_node": st.steals.other_node,
        },
        "requests": st.requests.len(),
        "min_main_node_share": shares.iter().copied().fold(1.0, f64::min),
        "mean_main_node_share": shares.iter().sum::<f64>() / shares.len().max(1) as f64,
        "tasks_per_node_by_request": st.requests.iter().map(|r| {
            serde_json::json!({ "id": r.id, "nodes": r.tasks_per_node.iter()
                .map(|(n, c)| serde_json::json!([n, c])).collect::<Vec<_>>() })
        }).collect::<Vec<_>>(),
    })
}

/// Cpu time per task of every row, one table per case: process cpu time (user + system) per
/// timed run, median over the reps, divided by the case's tasks per run.
pub fn cpu_table(rep: &Report) -> String {
    let mut out = String::new();
    let mut cases: Vec<&str> = Vec::new();
    for r in &rep.results {
        if let Some(c) = r.case.as_deref() {
            if !cases.contains(&c) {
                cases.push(c);
            }
        }
    }
    for case in cases {
        out += &format!(
            "\nsched {case}: cpu time per task (process user+sys per timed run, median)\n  {:<22} {:>12} {:>14} {:>10}\n",
            "system", "cpu s/run", "cpu ns/task", "cpus busy"
        );
        for r in rep.rows_of(Some(case)) {
            let f = |k: &str| r.extra.get(k).and_then(|v| v.as_f64());
            if let (Some(c), Some(ns)) = (f("cpu_s_median"), f("cpu_ns_per_task")) {
                out += &format!(
                    "  {:<22} {:>12.4} {:>14.1} {:>10.2}\n",
                    r.label(),
                    c,
                    ns,
                    c / r.median_s
                );
            }
        }
    }
    out
}

/// The goals of the like-for-like comparison: loci-las at most 1.00x the time of rayon's best
/// form (`rayon`) in tiny-tasks (join trees on both sides) and real-work (loci's `for_each`
/// against par_iter); for reference its ratios against the other rayon forms, and its labelled
/// rows' (`loci-las-join`, `loci-las-spawn`) against `rayon`.
pub fn goals(rep: &Report) -> String {
    let mut out = String::new();
    for case in ["tiny-tasks", "real-work"] {
        let rows: Vec<&Row> = rep.rows_of(Some(case)).collect();
        let (Some(loci), Some(best)) = (
            rows.iter().find(|r| r.system == "loci-las"),
            rows.iter().find(|r| r.system == "rayon"),
        ) else {
            continue;
        };
        let form = |r: &Row| {
            r.config
                .get("form")
                .map(|f| format!(" {f}"))
                .unwrap_or_default()
        };
        let ratio = loci.median_s / best.median_s;
        out += &format!(
            "{case}: loci-las{} {ratio:.2}x the time of rayon{} (goal <= 1.00x): {}",
            form(loci),
            form(best),
            if ratio <= 1.0 { "met" } else { "NOT met" }
        );
        for r in rows.iter().filter(|r| r.system.starts_with("rayon-")) {
            out += &format!("; {:.2}x {}", loci.median_s / r.median_s, r.system);
        }
        for r in rows.iter().filter(|r| r.system.starts_with("loci-las-")) {
            out += &format!("; {} {:.2}x rayon", r.system, r.median_s / best.median_s);
        }
        out += "\n";
    }
    out
}

/// Prints the cpu time per task, the counters of the loci rows and the goals (after the table).
pub fn print_counters(rep: &Report) {
    print!("{}", cpu_table(rep));
    println!();
    for r in &rep.results {
        let Some(c) = r.extra.get("counters") else {
            continue;
        };
        let found = c["found_by_rule"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        println!(
            "  {} {}: {found}; parks={}; joins={} stolen={}; steals same-group={} same-node={} other-node={}; main-node share min {:.2} mean {:.2}",
            r.system,
            r.case.as_deref().unwrap_or(""),
            c["parks"],
            c["joins"],
            c["join_steals"],
            c["steals"]["same_group"],
            c["steals"]["same_node"],
            c["steals"]["other_node"],
            c["min_main_node_share"].as_f64().unwrap_or(0.0),
            c["mean_main_node_share"].as_f64().unwrap_or(0.0),
        );
    }
    print!("{}", goals(rep));
}

#[cfg(test)]
mod tests {
    use loci_report::Machine;

    use super::*;

    #[test]
    fn goals_say_met_only_at_or_below_parity() {
        let row = |sys: &str, case: &str, t: f64| Row::from_times(sys, vec![t]).case(case);
        let mut rep = Report::new("sched", serde_json::json!({}), Machine::sized(1, 2));
        rep.results = vec![
            row("loci-las", "tiny-tasks", 2.0).config("form", "join"),
            row("loci-las-spawn", "tiny-tasks", 3.0).config("form", "spawn"),
            row("rayon", "tiny-tasks", 1.0).config("form", "join"),
            row("rayon-scope", "tiny-tasks", 4.0),
            row("loci-las", "real-work", 1.0).config("form", "join"),
            row("rayon", "real-work", 1.0).config("form", "par_iter"),
        ];
        let g = goals(&rep);
        assert!(
            g.contains("tiny-tasks: loci-las join 2.00x the time of rayon join (goal <= 1.00x): NOT met; 0.50x rayon-scope; loci-las-spawn 3.00x rayon\n"),
            "{g}"
        );
        assert!(
            g.contains(
                "real-work: loci-las join 1.00x the time of rayon par_iter (goal <= 1.00x): met\n"
            ),
            "{g}"
        );
    }
}
