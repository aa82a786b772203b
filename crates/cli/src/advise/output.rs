//! What `loci advise` prints and writes: the rules, the ranked table, the `loci run` line, the
//! OS settings, the result file and plot, and the per-machine cache.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use loci_report::{Report, Row};

use super::rules::{Advice, Facts, OsChange};
use super::search::{median, Samples, Verdict, MIN_EFFECT, MIN_RUNS};
use super::trial::Target;
use super::{AdviseCmd, Found, Knobs, Measured};
use crate::stats::{disturbed_passes, DISTURBED};

/// The exact command that runs the workload under `config`.
pub fn run_line(config: &Knobs, threads: usize, command: &[String]) -> String {
    let args: Vec<String> = std::iter::once("loci".to_string())
        .chain(config.run_args(threads))
        .chain(std::iter::once("--".to_string()))
        .chain(command.iter().cloned())
        .collect();
    crate::run_cmd::shell_line(&args)
}

/// The line that runs `command` under `config`: wrapped in `loci run`, or, for a command that
/// takes the configuration as its own flags (`loci bench tpch`), with those flags appended.
pub fn advice_line(config: &Knobs, threads: usize, command: &[String], flags: bool) -> String {
    if flags {
        let args: Vec<String> = command
            .iter()
            .cloned()
            .chain(config.bench_flags())
            .collect();
        crate::run_cmd::shell_line(&args)
    } else {
        run_line(config, threads, command)
    }
}

pub fn print_rules(f: &Facts, a: &Advice, target: &Target, threads: usize) {
    let onoff = |v: Option<bool>| match v {
        Some(true) => "on",
        Some(false) => "off",
        None => "absent",
    };
    println!(
        "machine: {} node(s) with cpus, {} with memory, {} cpus; workload threads {}; AutoNUMA {}; THP {}; {}",
        f.cpu_nodes,
        f.mem_nodes,
        f.cpus,
        threads,
        onoff(f.autonuma_on),
        f.thp.as_deref().unwrap_or("absent"),
        if f.root { "root" } else { "not root" }
    );
    println!("\nflowchart (seed 002, figure 10), rule by rule:");
    for x in &a.findings {
        println!("  {:<18} {}", x.rule, x.conclusion);
        println!("  {:<18} evidence: {}", "", x.evidence);
    }
    println!(
        "\nthe flowchart's answer, before measuring:\n  {}",
        advice_line(
            &a.recommended,
            threads,
            &target.shown(),
            target.config_flags
        )
    );
}

pub fn finish_rules_only(
    c: &AdviseCmd,
    advice: &Advice,
    target: &Target,
    threads: usize,
    topo: &loci_topo::Topology,
) -> anyhow::Result<()> {
    print_os(&advice.os_changes);
    if let Some(path) = &c.json {
        let line = advice_line(
            &advice.recommended,
            threads,
            &target.shown(),
            target.config_flags,
        );
        let params = serde_json::json!({
            "workload": target.name, "command": target.shown(), "threads": threads,
            "advice": advice, "flowchart_line": line, "measured": false,
        });
        Report::new("advise", params, loci_report::Machine::of(topo)).write_json(path)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn print_os(changes: &[OsChange]) {
    if changes.is_empty() {
        return;
    }
    println!("\nOS settings the flowchart recommends (system-wide; need root; not measured here, since changing them needs root and affects every program):");
    for ch in changes {
        println!("  {:<14} {}", ch.setting, ch.why);
    }
    let all: Vec<&str> = changes.iter().map(|c| c.setting.as_str()).collect();
    println!(
        "  set them with: loci os set {}   (or: loci advise ... --apply-os)",
        all.join(" ")
    );
}

/// A figure for display: the metric's own unit (a maximised figure was stored as 1/figure).
fn shown(found: &Found, score: f64) -> f64 {
    if found.maximize {
        1.0 / score
    } else {
        score
    }
}

/// The rows of the ranked table: the candidates measured to a verdict by ratio (best first, the
/// default among them), then those the halving screened out on a few pairs (a low ratio there is
/// mostly noise and must not read as the best), then the failed ones.
fn table_order(measured: &[Measured]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..measured.len()).collect();
    let key = |i: usize| (table_group(&measured[i]), measured[i].outcome.ratio);
    order.sort_by(|&a, &b| {
        key(a)
            .partial_cmp(&key(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    order
}

/// A row's group in the ranked table: 0 measured to a verdict, 1 screened out, 2 failed.
fn table_group(m: &Measured) -> u8 {
    if m.failed.is_some() {
        2
    } else if m.outcome.verdict == Verdict::Dropped {
        1
    } else {
        0
    }
}

pub fn print_found(found: &Found, target: &Target) {
    let base = &found.measured[0];
    let runs: usize = found.measured.iter().map(|m| m.outcome.samples.len()).sum();
    println!(
        "\nmeasured: {}, {} runs in {:.0} s (budget {:.0} s), every run a `loci run` line; ranked:",
        found.metric, runs, found.elapsed_s, found.budget_s
    );
    println!(
        "  {:<58} {:>4} {:>10} {:>21} {:>9} {:>15}  verdict",
        "configuration", "runs", "median", "spread (min-max)", "ratio", "interval"
    );
    let mut screened_header = false;
    for i in table_order(&found.measured) {
        let m = &found.measured[i];
        let s = &m.outcome.samples;
        if table_group(m) == 1 && !screened_header {
            screened_header = true;
            println!(
                "  screened out by the halving before a verdict (fewer than {MIN_RUNS} pairs: their \
                 ratios are mostly noise):"
            );
        }
        if let Some(why) = &m.failed {
            println!("  {:<58} failed: {why}", m.config.label());
            continue;
        }
        let (lo, hi) = s
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
                (a.min(shown(found, v)), b.max(shown(found, v)))
            });
        let ratio = if found.maximize {
            1.0 / m.outcome.ratio
        } else {
            m.outcome.ratio
        };
        let ci = if m.outcome.ci.0.is_nan() || i == 0 {
            "-".to_string()
        } else if found.maximize {
            format!("{:.3}-{:.3}", 1.0 / m.outcome.ci.1, 1.0 / m.outcome.ci.0)
        } else {
            format!("{:.3}-{:.3}", m.outcome.ci.0, m.outcome.ci.1)
        };
        println!(
            "  {:<58} {:>4} {:>10.4} {:>10.4}-{:<10.4} {:>8.3}x {:>15}  {}",
            m.config.label(),
            s.len(),
            shown(found, median(s)),
            lo,
            hi,
            ratio,
            ci,
            m.outcome.verdict.word()
        );
    }
    let k = found.measured.len().saturating_sub(1);
    println!(
        "  ratio: median of the per-pass ratios to the default's run in the same pass ({}); interval: \
bootstrap of that median at {:.1}% (95% Bonferroni-corrected over {k} candidates); better = interval wholly {} 1 and at least {:.0}% off",
        if found.maximize { "above 1 is better" } else { "below 1 is faster" },
        100.0 * (1.0 - 0.05 / k.max(1) as f64),
        if found.maximize { "above" } else { "below" },
        MIN_EFFECT * 100.0
    );
    let default = Samples::from(&base.outcome);
    let disturbed = disturbed_passes(&default);
    if !disturbed.is_empty() {
        let list: Vec<String> = disturbed.iter().map(|p| p.to_string()).collect();
        println!(
            "  set aside: {} of the default's {} passes ({} {}, counting from 0), whose default run took over {DISTURBED}x the \
             median of its nearest passes: a burst of noise there would read as every candidate of the pass being faster",
            disturbed.len(),
            default.runs(),
            if disturbed.len() == 1 { "pass" } else { "passes" },
            list.join(", ")
        );
    }
    print_thp_fallbacks(found);
    if let Some((label, more)) = &found.combination_not_measured {
        println!(
            "note: {label} combines values that each looked promising, but was not measured: the budget was spent (with it the search takes about {0:.0} s: --budget {0:.0}s)",
            (found.budget_s + more).ceil()
        );
    }
    let best = found
        .measured
        .iter()
        .find(|m| m.config == found.best)
        .unwrap_or(base);
    println!();
    if best.config == base.config {
        println!(
            "recommendation: keep the default; no candidate beat it beyond the noise. Run it as:"
        );
    } else {
        let r = if found.maximize {
            1.0 / best.outcome.ratio
        } else {
            best.outcome.ratio
        };
        println!(
            "recommendation: {} ({:.3}x the default's {}). Run it as:",
            best.config.label(),
            r,
            if found.maximize { "figure" } else { "time" }
        );
    }
    println!(
        "  {}",
        advice_line(
            &best.config,
            found.threads,
            &target.shown(),
            target.config_flags
        )
    );
    if target.config_flags {
        println!(
            "  (the bench starts the engine as `{} -- ENGINE`: the same flags place your own server)",
            crate::run_cmd::shell_line(
                &std::iter::once("loci".to_string())
                    .chain(best.config.run_args(found.threads))
                    .collect::<Vec<_>>()
            )
        );
    }
    let flow = &found.advice.recommended;
    if *flow != best.config {
        let m = found.measured.iter().find(|m| m.config == *flow);
        let note = match m.map(|m| m.outcome.verdict) {
            Some(Verdict::Better) => "better than the default, but not the best measured",
            Some(Verdict::Worse) => "worse than the default here",
            Some(Verdict::Same) => "no different from the default here, beyond the noise",
            _ => "not measured often enough to judge",
        };
        println!("  (the flowchart's answer, {}, was {note})", flow.label());
    }
    print_os(&found.advice.os_changes);
}

/// Says when huge-page faults fell back to 4 KiB pages during the search: THP-on figures then
/// depend on how fragmented memory was when each ran.
fn print_thp_fallbacks(found: &Found) {
    let total: u64 = found.measured.iter().map(|m| m.thp_fallbacks).sum();
    if total == 0 {
        return;
    }
    let worst: Vec<String> = found
        .measured
        .iter()
        .filter(|m| m.thp_fallbacks > 0)
        .map(|m| format!("{} {}", m.config.label(), m.thp_fallbacks))
        .collect();
    println!(
        "  THP: {total} huge-page faults fell back to 4 KiB pages during the search (the kernel \
had no free 2 MiB page); figures with THP on vary with fragmentation. Per candidate: {}",
        worst.join(", ")
    );
}

pub fn write_outputs(
    found: &Found,
    json: &Option<PathBuf>,
    plot: &Option<PathBuf>,
    topo: &loci_topo::Topology,
) -> anyhow::Result<()> {
    if json.is_none() && plot.is_none() {
        return Ok(());
    }
    let line = advice_line(
        &found.best,
        found.threads,
        &found.command,
        found.config_flags,
    );
    let params = serde_json::json!({
        "workload": found.workload, "command": found.command, "metric": found.metric,
        "maximize": found.maximize, "threads": found.threads, "facts": found.facts,
        "advice": found.advice, "best": found.best, "line": line,
        "budget_s": found.budget_s, "elapsed_s": found.elapsed_s, "measured_at": found.when,
        "matrix": found.matrix,
        "set_aside_passes": disturbed_passes(&Samples::from(&found.measured[0].outcome)),
        "combination_not_measured": found.combination_not_measured.as_ref().map(|(config, past_budget_s)| {
            serde_json::json!({ "config": config, "past_budget_s": past_budget_s })
        }),
    });
    let mut report = Report::new("advise", params, loci_report::Machine::of(topo));
    for m in &found.measured {
        let values: Vec<f64> = m.outcome.samples.iter().map(|&v| shown(found, v)).collect();
        if values.is_empty() {
            continue;
        }
        let mut row = Row::from_times(&found.workload, values)
            .case(&found.workload)
            .config("threads", &m.config.threads)
            .config("mem", &m.config.mem)
            .config("alloc", &m.config.alloc)
            .config(
                "thp",
                if m.config.thp.is_empty() {
                    "system"
                } else {
                    &m.config.thp
                },
            )
            .extra("passes", &m.outcome.passes)
            .extra("ratio", m.outcome.ratio)
            .extra("verdict", m.outcome.verdict)
            .extra("thp_fault_fallbacks", m.thp_fallbacks);
        if !m.outcome.ci.0.is_nan() {
            row = row.extra("interval", [m.outcome.ci.0, m.outcome.ci.1]);
        }
        report.results.push(row);
    }
    if let Some(p) = json {
        report.write_json(p)?;
        println!("wrote {}", p.display());
    }
    if let Some(p) = plot {
        report.plot_svg(p)?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

pub fn apply_os(changes: &[OsChange]) -> anyhow::Result<()> {
    if changes.is_empty() {
        println!("--apply-os: the flowchart recommends no OS change here");
        return Ok(());
    }
    if !loci_place::knobs::is_root() {
        bail!("--apply-os changes system-wide settings and needs root; run as root, or `sudo loci os set ...` as printed above");
    }
    let settings = changes
        .iter()
        .map(|ch| ch.setting.parse().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<loci_place::knobs::Setting>>>()?;
    // All checked before any is written; a failed write restores the earlier ones.
    for c in loci_place::knobs::set_all(Path::new("/"), &settings)? {
        println!("--apply-os: {} {} -> {}", c.path.display(), c.old, c.new);
    }
    Ok(())
}

fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("loci").join("advise"))
}

/// The machine's fingerprint and everything the answer depends on, hashed.
pub fn cache_key(
    topo: &loci_topo::Topology,
    facts: &Facts,
    target: &Target,
    metric: &Option<String>,
    threads: usize,
    budget: std::time::Duration,
) -> String {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(str::to_string)
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    // A user's program that was rebuilt is another workload.
    let program = target
        .argv
        .first()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| {
            (
                m.len(),
                m.modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()),
            )
        });
    let key = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        // Results judged by an older statistic are not shown as if judged by this one.
        "statistic": "paired median ratio; default bursts set aside",
        "cpus": topo.allowed_cpus().to_string(), "mems": topo.allowed_mems().to_string(),
        "cpu_model": cpu_model, "kernel": kernel.trim(), "facts": facts,
        "command": target.shown(), "program": format!("{program:?}"), "metric": metric,
        "threads": threads, "budget_s": budget.as_secs(),
    });
    blake3::hash(key.to_string().as_bytes()).to_hex()[..16].to_string()
}

pub fn cache_load(key: &str) -> Option<Found> {
    let text = std::fs::read_to_string(cache_dir()?.join(format!("{key}.json"))).ok()?;
    parse_cached(&text)
}

/// A cached result; a damaged or hand-edited entry without the default's runs (the baseline)
/// is a miss.
pub fn parse_cached(text: &str) -> Option<Found> {
    serde_json::from_str(text).ok().filter(|f: &Found| {
        f.measured
            .first()
            .is_some_and(|b| !b.outcome.samples.is_empty())
    })
}

/// Stores a result; a cache that cannot be written only costs a later re-measurement.
pub fn cache_store(key: &str, found: &Found) {
    let Some(dir) = cache_dir() else { return };
    let write = || -> anyhow::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!("{key}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_string_pretty(found)?)?;
        std::fs::rename(&tmp, dir.join(format!("{key}.json")))?;
        Ok(())
    };
    if let Err(e) = write().with_context(|| format!("caching the result in {}", dir.display())) {
        eprintln!("loci advise: note: {e:#}");
    }
}

/// "12 minutes ago" for a Unix time.
pub fn ago(when: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(when);
    let s = now.saturating_sub(when);
    match s {
        0..=119 => format!("{s} s ago"),
        120..=7199 => format!("{} minutes ago", s / 60),
        7200..=172_799 => format!("{} hours ago", s / 3600),
        _ => format!("{} days ago", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advise::search::Outcome;

    #[test]
    fn screened_out_candidates_rank_after_those_with_a_verdict_whatever_their_ratio() {
        let m = |alloc: &str, ratio: f64, verdict: Verdict, failed: bool| Measured {
            config: Knobs {
                alloc: alloc.into(),
                ..Knobs::default()
            },
            outcome: Outcome {
                samples: vec![1.0; 4],
                passes: (0..4).collect(),
                ratio,
                ci: (f64::NAN, f64::NAN),
                verdict,
                dropped_in: (verdict == Verdict::Dropped).then_some(0),
            },
            failed: failed.then(|| "no library".to_string()),
            thp_fallbacks: 0,
        };
        let measured = vec![
            m("glibc", 1.0, Verdict::Default, false),
            m("mimalloc", 0.72, Verdict::Dropped, false),
            m("tcmalloc", 0.97, Verdict::Better, false),
            m("jemalloc", 0.80, Verdict::Dropped, false),
            m("tbbmalloc", 0.5, Verdict::Dropped, true),
            m("loci", 1.08, Verdict::Worse, false),
        ];
        let names: Vec<&str> = table_order(&measured)
            .into_iter()
            .map(|i| measured[i].config.alloc.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "tcmalloc",
                "glibc",
                "loci",
                "mimalloc",
                "jemalloc",
                "tbbmalloc"
            ]
        );
    }

    #[test]
    fn run_line_quotes_what_a_shell_would_split() {
        let c = Knobs {
            alloc: "jemalloc".into(),
            thp: "off".into(),
            ..Knobs::default()
        };
        let line = run_line(&c, 4, &["./app".into(), "a b".into(), "it's".into()]);
        assert_eq!(
            line,
            r"loci run --threads os -n 4 --mem first-touch --alloc jemalloc --thp off -- ./app 'a b' 'it'\''s'"
        );
    }

    #[test]
    fn ago_reads_like_a_person() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert_eq!(ago(now - 30), "30 s ago");
        assert_eq!(ago(now - 600), "10 minutes ago");
        assert_eq!(ago(now - 3 * 86400), "3 days ago");
    }
}
