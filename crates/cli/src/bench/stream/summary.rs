//! What `loci bench stream` prints after its table: the machine limit, the end-to-end goals and
//! the protection comparison.

use loci_report::{Report, Row};

use super::protection::PROTECTION_GOALS;

/// The end-to-end rows as a headline: goodput, fraction of the machine limit, cpu-s per GB, and
/// the two goals (at least 0.9x the limit; faster than the same-core `lz4 | nc` peer).
pub(super) fn summary(rep: &Report, not_run: &[(String, String)], full_bytes: u64) -> String {
    let f = |r: &Row, k: &str| r.extra.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    let mut out = String::new();
    if let Some(l) = rep.rows_of(Some("machine-limit")).next() {
        out += &format!(
            "\nmachine limit for this data: {}B/s raw = {} / ({:.3} compress + {:.3} tcp / {:.3} ratio + {:.3} decompress cpu-s per GB), {} = {:.3} cpu-s per raw GB\n",
            loci_report::si(l.throughput.unwrap_or(f64::NAN)),
            l.config.get("cores").map_or("?", String::as_str),
            f(l, "compress_cpu_s_per_gb"),
            f(l, "tcp_cpu_s_per_wire_gb"),
            f(l, "compression_ratio"),
            f(l, "decompress_cpu_s_per_gb"),
            l.extra.get("codec").and_then(|v| v.as_str()).unwrap_or("?"),
            f(l, "cpu_s_per_gb"),
        );
    }
    let rows: Vec<&Row> = rep.rows_of(Some("end-to-end")).collect();
    if rows.is_empty() {
        return out + &protection_summary(rep, full_bytes);
    }
    let par = rows.iter().find(|r| r.system == "lz4-nc-par").copied();
    let w = loci_report::label_width(&rows);
    let cols = [
        ("goodput", 12),
        ("of limit", 8),
        ("cpu-s/run", 9),
        ("cpu-s/GB", 8),
        ("vs lz4-nc-par", 13),
    ];
    out += &header("system", w, &cols);
    for r in &rows {
        let cells = [
            goodput(r),
            format!("{:.2}", f(r, "fraction_of_limit")),
            format!("{:.2}", f(r, "cpu_s")),
            format!("{:.2}", f(r, "cpu_s_per_gb")),
            par.map_or("-".into(), |p| {
                let x = r.throughput.unwrap_or(f64::NAN) / p.throughput.unwrap_or(f64::NAN);
                format!("{x:.2}x")
            }),
        ];
        out += &line(&r.label(), w, &cols, &cells);
    }
    out += "  (of limit = goodput / machine limit; vs lz4-nc-par = goodput ratio, above 1.00x is faster)\n";
    for (p, why) in not_run {
        out += &format!("  {p}: not run: {why}\n");
    }
    let limit = rep.rows_of(Some("machine-limit")).next();
    for r in rows.iter().filter(|r| r.system == "loci") {
        out += &stage_line(r, limit);
    }
    for r in rows.iter().filter(|r| r.system == "loci") {
        let frac = f(r, "fraction_of_limit");
        out += &format!(
            "goal {}: at least 0.90 of the machine limit: {} ({frac:.2})\n",
            r.label(),
            if frac >= 0.9 { "met" } else { "MISSED" }
        );
        if let Some(p) = par {
            let x = r.throughput.unwrap_or(f64::NAN) / p.throughput.unwrap_or(f64::NAN);
            out += &format!(
                "goal {}: faster than the same-core peer {}: {} ({x:.2}x its goodput)\n",
                r.label(),
                p.label(),
                if x > 1.0 { "met" } else { "MISSED" }
            );
        }
    }
    out + &protection_summary(rep, full_bytes)
}

/// Where a loci row's CPU went, stage by stage (sender, then receiver), against the limit's
/// parts: the codec's stages carry their LZ4 work plus reading, hashing and framing, the others
/// the TCP work and the hand-offs. Empty when the row has no stage figures.
fn stage_line(r: &Row, limit: Option<&Row>) -> String {
    let Some(st) = r
        .extra
        .get("stage_cpu_s_per_gb")
        .and_then(|v| v.as_object())
    else {
        return String::new();
    };
    let order = ["compress", "send", "recv", "decompress", "commit"];
    let mut names: Vec<&String> = st.keys().collect();
    names.sort_by_key(|n| order.iter().position(|o| o == n).unwrap_or(order.len()));
    let cell = |n: &String| st[n].as_f64().unwrap_or(f64::NAN);
    let parts: Vec<String> = names
        .iter()
        .map(|n| format!("{n} {:.3}", cell(n)))
        .collect();
    let total: f64 = names.iter().map(|n| cell(n)).sum();
    let mut out = format!(
        "{}: cpu-s per raw GB by stage (median of runs): {}; all stages {total:.3}",
        r.label(),
        parts.join(", ")
    );
    if let Some(l) = limit {
        let f = |k: &str| l.extra.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
        out += &format!(
            "; the limit's work {:.3} (LZ4 compress {:.3}, decompress {:.3}, TCP {:.3})",
            f("cpu_s_per_gb"),
            f("compress_cpu_s_per_gb"),
            f("decompress_cpu_s_per_gb"),
            f("tcp_cpu_s_per_wire_gb") / f("compression_ratio"),
        );
    }
    out + "\n"
}

/// The protection rows as a table (goodput and cpu-s/GB, each against checksum) and the goals'
/// verdicts; empty when the comparison did not run.
fn protection_summary(rep: &Report, full_bytes: u64) -> String {
    let f = |r: &Row, k: &str| r.extra.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    let rows: Vec<&Row> = rep.rows_of(Some("protection")).collect();
    let Some(first) = rows.first() else {
        return String::new();
    };
    let bytes = rep.params["bytes"].as_f64().unwrap_or(f64::NAN);
    let ratio = |r: &Row, k: &str| {
        r.extra
            .get(k)
            .and_then(|v| v.as_f64())
            .map_or("-".to_string(), |x| format!("{x:.3}x"))
    };
    let mut out = format!(
        "\nframe protection: loci with the plan, {}B per run, same data and cores, {} rounds with the modes' order rotated\n",
        loci_report::si(bytes),
        first.times_s.len()
    );
    let cols = [
        ("goodput", 12),
        ("vs checksum", 11),
        ("cpu-s/GB", 8),
        ("vs checksum", 11),
        ("of limit", 8),
    ];
    let w = "protection".len();
    out += &header("protection", w, &cols);
    for r in &rows {
        let cells = [
            goodput(r),
            ratio(r, "goodput_vs_checksum"),
            format!("{:.3}", f(r, "cpu_s_per_gb")),
            ratio(r, "cpu_vs_checksum"),
            format!("{:.2}", f(r, "fraction_of_limit")),
        ];
        let mode = r.config.get("protection").map_or("?", String::as_str);
        out += &line(mode, w, &cols, &cells);
    }
    out += "  (goodput vs checksum: below 1.000x is slower; cpu-s/GB vs checksum: above 1.000x costs more CPU; every run's stream verified)\n";
    for (mode, max_cost) in PROTECTION_GOALS {
        let Some(r) = rows
            .iter()
            .find(|r| r.config.get("protection").map(String::as_str) == Some(mode.name()))
        else {
            continue;
        };
        let goal = format!(
            "goal protection {}: costs at most {:.0}% of the checksum-only goodput",
            mode.name(),
            max_cost * 100.0
        );
        let x = f(r, "goodput_vs_checksum");
        out += &if x.is_nan() {
            format!("{goal}: not measured (checksum was not in --protection)\n")
        } else {
            let cost = 1.0 - x;
            format!(
                "{goal}: {} (costs {:.1}%: {x:.3}x the checksum goodput)\n",
                if cost <= max_cost { "met" } else { "MISSED" },
                cost * 100.0
            )
        };
    }
    if bytes < full_bytes as f64 {
        out += &format!(
            "  (the goals are for the full size, {}B per run; this run streamed {}B, so its verdicts are indicative only)\n",
            loci_report::si(full_bytes as f64),
            loci_report::si(bytes)
        );
    }
    out
}

/// A row's goodput, as the tables print it.
fn goodput(r: &Row) -> String {
    format!("{}B/s", loci_report::si(r.throughput.unwrap_or(f64::NAN)))
}

/// A table line: `label` left-aligned in `w` columns, then each cell right-aligned in the width
/// of its column in `cols` (name, width), two spaces apart.
fn line(label: &str, w: usize, cols: &[(&str, usize)], cells: &[String]) -> String {
    let mut out = format!("  {label:<w$}");
    for (&(_, cw), c) in cols.iter().zip(cells) {
        out += &format!("  {c:>cw$}");
    }
    out + "\n"
}

/// The header line of a table whose label column is `label` (see [`line`]).
fn header(label: &str, w: usize, cols: &[(&str, usize)]) -> String {
    let names: Vec<String> = cols.iter().map(|(n, _)| n.to_string()).collect();
    line(label, w, cols, &names)
}
