//! `loci advise`: how should this workload run on this machine. Seed 002's flowchart as rules
//! ([`rules`]), then the configurations the rules leave open measured against the default by
//! successive halving ([`search`]), each trial the exact `loci run` line the advice prints
//! ([`trial`]).

mod matrix;
pub(crate) mod output;
mod rules;
mod search;
pub(crate) mod trial;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::run_cmd::Alloc;
use crate::topo_args::TopoArgs;
use rules::Facts;
use search::{Outcome, Samples, Schedule, Verdict};
use trial::{Metric, Target};

/// Find how a workload should run on this machine: threads, memory policy, allocator, THP
///
/// First the decision flowchart of seed 002 (application-agnostic tuning) runs as rules over the
/// topology and the OS state (nodes, threads against cpus, AutoNUMA, THP, root, installed
/// allocators); each rule prints its conclusion and the paper's evidence. Then every setting the
/// rules leave open is measured against the default configuration (unpinned threads, first
/// touch, glibc malloc, THP as the system has it): repetitions interleaved across candidates,
/// successive halving within --budget, and a candidate is called better only when a bootstrap
/// interval of its paired ratio to the default (the median of its run over the default's run in
/// the same pass; passes where the default's run took over 1.5x its nearby median set aside)
/// lies wholly below 1 (Bonferroni-corrected over the candidates) and the ratio
/// is at least 2% off 1. Each trial runs the exact `loci run` line the advice prints. Results
/// are cached per machine and workload (--fresh measures again).
///
/// On a one-node machine only the allocator and THP can matter; placement is shown on machines
/// with several nodes (or planned with --rules-only --preset NAME).
///
/// Examples:
///   loci advise                                    the built-in default (W3 hash join), ~1-2 min
///   loci advise --workload alloc --budget 60s
///   loci advise --budget 2m -- ./my_query --sf 1   any program, whole-process wall time
///   loci advise --metric 'took ([0-9.]+) s' -- ./app
///   loci advise --rules-only --preset xeon-e7-4850v4-4s -n 16
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct AdviseCmd {
    /// A built-in workload: w1, w2, w3, w4, subarray, alloc, stream (default: w3), or
    /// tpch:ENGINE[:SF] (duckdb, postgres, datafusion; SF 0.01, 0.1 (default), 1, 10: TPC-H's 22
    /// queries through `loci bench tpch`, the configuration applied to the engine; needs
    /// bench/peers/setup --tpch).
    #[arg(long, value_name = "NAME", conflicts_with = "cmd")]
    workload: Option<String>,
    /// Time for the measured part: 90s, 2m, 45 (seconds); 1ms to a week. The search fits its
    /// rounds into it, except that every candidate needs a few runs for a verdict: when those
    /// alone take longer, advise says so before it starts and takes the time.
    #[arg(long, value_name = "DURATION", default_value = "75s", value_parser = parse_duration)]
    budget: Duration,
    /// What a trial's figure is: `time` (the program's wall time) or a regex over its output
    /// whose first capture group (or whole match) is the number, finite and above 0 (lower is
    /// better unless --maximize). Built-in workloads report their own timed region.
    #[arg(long, value_name = "time|REGEX")]
    metric: Option<String>,
    /// A larger --metric figure is better (a throughput).
    #[arg(long, requires = "metric")]
    maximize: bool,
    /// Threads the workload runs (the plan's thread count; default: every allowed cpu).
    #[arg(short = 'n', long = "nthreads", value_name = "N")]
    n: Option<usize>,
    /// Only the flowchart: print the rules' conclusions and their `loci run` line, measure nothing.
    #[arg(long)]
    rules_only: bool,
    /// Apply the recommended OS settings (AutoNUMA, THP) system-wide. Needs root; never done
    /// without this flag.
    #[arg(long)]
    apply_os: bool,
    /// After advising, measure every combination of the open values (--matrix-reps runs each,
    /// interleaved) and compare the advice with the best of that matrix, in quality and in time.
    #[arg(long)]
    matrix: bool,
    /// Runs per configuration for --matrix.
    #[arg(long, value_name = "N", default_value_t = 5, requires = "matrix", value_parser = crate::at_least_one)]
    matrix_reps: usize,
    /// Measure again even if a cached result exists for this machine and workload.
    #[arg(long)]
    fresh: bool,
    /// Write the result (common result format, the advice under `params`) to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw the candidates' medians as an SVG bar chart.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    #[command(flatten)]
    topo: TopoArgs,
    /// The program to advise on, with its arguments (instead of --workload).
    #[arg(last = true, value_name = "CMD")]
    cmd: Vec<OsString>,
}

/// One configuration: the `loci run` flags under test.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Knobs {
    pub threads: String,
    pub mem: String,
    pub alloc: String,
    /// `off` (`--thp off`), or empty for THP as the system has it.
    pub thp: String,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            threads: "os".into(),
            mem: "first-touch".into(),
            alloc: "glibc".into(),
            thp: String::new(),
        }
    }
}

impl Knobs {
    /// The `loci run` arguments before `--`.
    pub fn run_args(&self, n: usize) -> Vec<String> {
        let thp = (!self.thp.is_empty()).then_some(self.thp.as_str());
        crate::run_cmd::knob_args(&self.threads, Some(n), &self.mem, &self.alloc, thp)
    }

    /// The same configuration as a bench's own flags (`loci bench tpch`, which starts its
    /// engines under `loci run` itself).
    pub fn bench_flags(&self) -> Vec<String> {
        let thp = if self.thp.is_empty() {
            "default"
        } else {
            self.thp.as_str()
        };
        [
            "--threads",
            &self.threads,
            "--mem",
            &self.mem,
            "--alloc",
            &self.alloc,
            "--thp",
            thp,
        ]
        .map(String::from)
        .to_vec()
    }

    pub fn label(&self) -> String {
        format!(
            "threads={} mem={} alloc={} thp={}",
            self.threads,
            self.mem,
            self.alloc,
            if self.thp.is_empty() {
                "system"
            } else {
                &self.thp
            }
        )
    }
}

/// One measured candidate.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measured {
    pub config: Knobs,
    pub outcome: Outcome,
    /// Why the candidate could not run, if it could not.
    pub failed: Option<String>,
    /// Huge-page faults that fell back to 4 KiB pages during this candidate's runs (summed; see
    /// [`trial::thp_fault_fallbacks`]).
    #[serde(default)]
    pub thp_fallbacks: u64,
}

/// Everything advise found, as cached and written with --json.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Found {
    pub workload: String,
    pub command: Vec<String>,
    /// The command takes the configuration as its own flags (`tpch:ENGINE`) instead of running
    /// under `loci run`.
    #[serde(default)]
    pub config_flags: bool,
    pub metric: String,
    pub maximize: bool,
    pub threads: usize,
    pub facts: Facts,
    pub advice: rules::Advice,
    pub measured: Vec<Measured>,
    /// The configuration to use: the best significantly better candidate, else the default.
    pub best: Knobs,
    pub budget_s: f64,
    pub elapsed_s: f64,
    /// Seconds since the Unix epoch when it was measured.
    pub when: u64,
    /// The --matrix check, when asked for.
    #[serde(default)]
    pub matrix: Option<matrix::MatrixCheck>,
    /// A combination of promising values left unmeasured because the budget was spent, and
    /// about how many seconds more it would have needed.
    #[serde(default)]
    pub combination_not_measured: Option<(String, f64)>,
}

/// The longest `--budget`: a week.
const MAX_BUDGET_S: f64 = 604_800.0;
/// The shortest `--budget`: a millisecond (a shorter one would round to nothing).
const MIN_BUDGET_S: f64 = 0.001;

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(v) = s.strip_suffix("ms") {
        (v, 0.001)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('m') {
        (v, 60.0)
    } else if let Some(v) = s.strip_suffix('h') {
        (v, 3600.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v * mult < MIN_BUDGET_S => Err(format!(
            "`{s}` is shorter than a millisecond, the shortest budget"
        )),
        Ok(v) if v > 0.0 && v * mult <= MAX_BUDGET_S => Ok(Duration::from_secs_f64(v * mult)),
        Ok(v) if v > 0.0 => Err(format!(
            "`{s}` is longer than a week ({MAX_BUDGET_S} s), the longest budget"
        )),
        _ => Err(format!(
            "`{s}` is not a duration; write e.g. 90s, 2m, 45 (seconds)"
        )),
    }
}

/// The allocators `loci run --alloc` can load here, and those it cannot with what installs them.
fn allocators(exe_dir: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for a in Alloc::value_variants() {
        let name = a
            .to_possible_value()
            .expect("no hidden variants")
            .get_name()
            .to_string();
        match a.library(exe_dir) {
            Ok(_) => found.push(name),
            Err(e) => {
                let how = e.to_string();
                let how = how
                    .rsplit_once("; ")
                    .map(|(_, h)| h.to_string())
                    .unwrap_or(how);
                missing.push((name, how));
            }
        }
    }
    (found, missing)
}

/// The facts of the machine this process runs on (OS state from `/`), for `threads` threads.
fn facts(topo: &loci_topo::Topology, threads: usize, program: Option<&Path>) -> Facts {
    let knobs = loci_place::knobs::read(Path::new("/")).ok();
    let exe = std::env::current_exe().ok();
    let exe_dir = exe
        .as_deref()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."));
    let (allocators, missing_allocators) = allocators(exe_dir);
    let static_binary = program
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| crate::run_cmd::is_static_elf(&b))
        .unwrap_or(false);
    Facts {
        cpu_nodes: topo
            .nodes
            .iter()
            .filter(|n| !topo.allowed_cpus_of(n.id).is_empty())
            .count(),
        mem_nodes: topo.allowed_mems().len(),
        cpus: topo.allowed_cpus().len(),
        threads,
        autonuma_on: knobs
            .as_ref()
            .and_then(|k| k.autonuma.as_ref())
            .map(|a| a != "off"),
        thp: knobs.and_then(|k| k.thp_enabled),
        root: loci_place::knobs::is_root(),
        allocators,
        missing_allocators,
        static_binary,
        pin_library: crate::run_cmd::pin_library(exe_dir).is_ok_and(|p| p.exists()),
        dram_nodes: {
            let mems = topo.allowed_mems();
            let dram: loci_topo::NodeSet = mems
                .iter()
                .filter(|&n| {
                    topo.node(n)
                        .is_some_and(|n| n.kind == loci_topo::NodeKind::Dram)
                })
                .collect();
            (!dram.is_empty() && dram.len() < mems.len()).then(|| dram.to_string())
        },
    }
}

/// The default with every factor set to its most promising value, when two factors or more have
/// one and that combination was not measured yet. A value is promising when its candidate's
/// median paired ratio is at least [`search::MIN_EFFECT`] below the default's, whatever its
/// verdict: effects that add up can each hide in the noise alone (W3 with a THP-on baseline that
/// varies by 25% on this machine: allocators at 0.83-0.85x and THP off at 0.94x, none "better";
/// the matrix put the allocators with THP off at 0.79-0.84x). The combination gets a verdict of
/// its own, so it is recommended only when it is better beyond the noise.
fn combine(configs: &[Knobs], outcomes: &[Outcome]) -> Option<Knobs> {
    let mut best: [Option<(f64, String)>; 4] = Default::default();
    let base = &configs[0];
    for (c, o) in configs.iter().zip(outcomes) {
        // (NaN and infinite ratios, of failed candidates, are not promising.)
        let promising = o.ratio <= 1.0 - search::MIN_EFFECT;
        if o.verdict == Verdict::Default || !promising {
            continue;
        }
        let fields = [
            (&c.threads, &base.threads),
            (&c.mem, &base.mem),
            (&c.alloc, &base.alloc),
            (&c.thp, &base.thp),
        ];
        let changed: Vec<usize> = (0..4).filter(|&k| fields[k].0 != fields[k].1).collect();
        if let [k] = changed[..] {
            if best[k].as_ref().is_none_or(|(r, _)| o.ratio < *r) {
                best[k] = Some((o.ratio, fields[k].0.clone()));
            }
        }
    }
    if best.iter().flatten().count() < 2 {
        return None;
    }
    let pick = |k: usize, d: &String| {
        best[k]
            .as_ref()
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| d.clone())
    };
    let combo = Knobs {
        threads: pick(0, &base.threads),
        mem: pick(1, &base.mem),
        alloc: pick(2, &base.alloc),
        thp: pick(3, &base.thp),
    };
    (!configs.contains(&combo)).then_some(combo)
}

/// The candidates: the default, every value the rules leave open changed one factor at a time,
/// and the flowchart's own answer.
fn candidates(a: &rules::Advice) -> Vec<Knobs> {
    let base = Knobs::default();
    let mut out = vec![base.clone()];
    let mut add = |c: Knobs| {
        if !out.contains(&c) {
            out.push(c);
        }
    };
    type Setter = fn(&mut Knobs, &str);
    let factors: [(&[String], Setter); 4] = [
        (&a.threads, |c, v| c.threads = v.into()),
        (&a.mem, |c, v| c.mem = v.into()),
        (&a.alloc, |c, v| c.alloc = v.into()),
        (&a.thp, |c, v| c.thp = v.into()),
    ];
    for (values, set) in factors {
        for v in values {
            let mut c = base.clone();
            set(&mut c, v);
            add(c);
        }
    }
    add(a.recommended.clone());
    out
}

pub fn run(c: AdviseCmd) -> anyhow::Result<()> {
    let topo = c.topo.load()?;
    let exe = std::env::current_exe().context("finding the loci executable")?;
    let threads = c.n.unwrap_or_else(|| topo.allowed_cpus().len().max(1));
    if threads == 0 {
        bail!("-n 0: a workload needs at least one thread");
    }
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    let target = if c.cmd.is_empty() {
        if c.metric.is_some() {
            bail!("--metric applies to a command after `--`; built-in workloads report their own timed region");
        }
        let name = c.workload.as_deref().unwrap_or("w3");
        if let Some(spec) = name.strip_prefix("tpch:") {
            let t = Target::tpch(spec, &exe, scratch.path())?;
            eprintln!("loci advise: workload {} - the 22 TPC-H queries (seed 002 W5) through `loci bench tpch`", t.name);
            t
        } else {
            let w = trial::workload(name)?;
            eprintln!("loci advise: workload {} - {}", w.name, w.about);
            Target::builtin(w, &exe, scratch.path())
        }
    } else {
        let metric = match c.metric.as_deref() {
            None | Some("time") => Metric::Time,
            Some(re) => Metric::Regex(
                regex::Regex::new(re)
                    .with_context(|| format!("--metric `{re}` is not a valid regex"))?,
            ),
        };
        Target::command(c.cmd.clone(), metric, c.maximize)
    };
    let program = c.cmd.first().and_then(crate::run_cmd::resolve);
    let facts = facts(&topo, threads, program.as_deref());
    let advice = rules::decide(&facts);
    output::print_rules(&facts, &advice, &target, threads);
    if c.rules_only || !c.topo.is_live() {
        if !c.topo.is_live() && !c.rules_only {
            eprintln!("loci advise: the topology is not this machine's, so nothing is measured (the rules above used this machine's OS state)");
        }
        return output::finish_rules_only(&c, &advice, &target, threads, &topo);
    }

    let key = output::cache_key(&topo, &facts, &target, &c.metric, threads, c.budget);
    let mut found = match (c.fresh, output::cache_load(&key)) {
        (false, Some(found)) => {
            eprintln!(
                "loci advise: measured earlier on this machine ({}); --fresh measures again",
                output::ago(found.when)
            );
            found
        }
        _ => {
            let found = measure(&c, &exe, &target, threads, facts, advice)?;
            output::cache_store(&key, &found);
            found
        }
    };
    output::print_found(&found, &target);
    if c.matrix {
        let m = matrix::check(
            &target,
            &exe,
            threads,
            &found.advice,
            &found.best,
            found.elapsed_s,
            c.matrix_reps,
        )?;
        matrix::print(&m);
        found.matrix = Some(m);
    }
    output::write_outputs(&found, &c.json, &c.plot, &topo)?;
    if c.apply_os {
        output::apply_os(&found.advice.os_changes)?;
    }
    Ok(())
}

fn measure(
    c: &AdviseCmd,
    exe: &Path,
    target: &Target,
    threads: usize,
    facts: Facts,
    advice: rules::Advice,
) -> anyhow::Result<Found> {
    let configs = candidates(&advice);
    let start = Instant::now();
    // The default runs once first: it proves the command works and sizes the rounds (the search
    // sizes them again from its own runs, as this first one may be cold).
    let t0 = Instant::now();
    target
        .trial(exe, &configs[0], threads)
        .context("the default configuration does not run")?;
    let trial_time = t0.elapsed();
    let schedule = Schedule::fit(configs.len(), trial_time, c.budget);
    eprintln!(
        "loci advise: {} candidates, one trial {:.2} s: {} rounds of successive halving, {} runs each in the first (more if the runs are shorter than this one), within {:.0} s",
        configs.len(),
        trial_time.as_secs_f64(),
        schedule.rounds,
        schedule.first_reps,
        c.budget.as_secs_f64()
    );
    // The default's first run is spent; the smallest search with verdicts comes after it.
    let least = schedule.least_runs(configs.len());
    if let Some(over) = search::overrun(trial_time, 1, least, c.budget) {
        let needs = c.budget.as_secs_f64() + over;
        eprintln!(
            "note: at {:.2} s a trial, the smallest search that gives every candidate a verdict takes about {needs:.0} s, more than --budget {:.0} s; it runs to its end (--budget {:.0}s plans for it)",
            trial_time.as_secs_f64(),
            c.budget.as_secs_f64(),
            needs.ceil()
        );
    }
    let bar = indicatif::ProgressBar::new(c.budget.as_secs());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} s  {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let mut failed: Vec<Option<String>> = vec![None; configs.len()];
    let mut fallbacks: Vec<u64> = vec![0; configs.len()];
    let mut outcomes = search::halve(
        configs.len(),
        &schedule,
        c.budget,
        |i| {
            if failed[i].is_some() {
                return Ok(f64::INFINITY);
            }
            let before = trial::thp_fault_fallbacks();
            let result = target.trial(exe, &configs[i], threads);
            if let (Some(a), Some(b)) = (before, trial::thp_fault_fallbacks()) {
                fallbacks[i] += b.saturating_sub(a);
            }
            match result {
                Ok(v) => Ok(v),
                Err(e) if i > 0 => {
                    failed[i] = Some(e.to_string());
                    Ok(f64::INFINITY)
                }
                Err(e) => Err(e.context("the default configuration failed")),
            }
        },
        |n, i| {
            bar.set_position(start.elapsed().as_secs().min(c.budget.as_secs()));
            bar.set_message(format!("trial {n}: {}", configs[i].label()));
        },
    )?;
    // Where better values of different factors were found separately, their combination is
    // measured too (interleaved with the default) and judged like the others.
    let mut configs = configs;
    let mut combination_not_measured = None;
    let combo_runs = 2 * schedule.first_reps.max(search::MIN_RUNS);
    let combo = combine(&configs, &outcomes).filter(|combo| {
        // Measured only inside the budget: the runs it needs, at the mean trial so far (the
        // first run of the default included).
        let done = 1 + outcomes.iter().map(|o| o.samples.len()).sum::<usize>();
        let over = search::overrun(start.elapsed(), done, combo_runs, c.budget);
        combination_not_measured = over.map(|s| (combo.label(), s));
        over.is_none()
    });
    if let Some(combo) = combo {
        bar.set_message(format!("combination: {}", combo.label()));
        let mut samples: Vec<Samples> = outcomes.iter().map(Samples::from).collect();
        let dropped: Vec<Option<usize>> = outcomes.iter().map(|o| o.dropped_in).collect();
        let mut extra = Samples::default();
        let mut trial = |default: bool| {
            if default {
                target.trial(exe, &configs[0], threads)
            } else {
                Ok(target.trial(exe, &combo, threads).unwrap_or(f64::INFINITY))
            }
        };
        let first_pass = samples[0].passes.iter().max().map_or(0, |p| p + 1);
        let mut end = first_pass + combo_runs / 2;
        search::run_pairs(
            first_pass..end,
            &mut samples[0],
            &mut extra,
            &mut trial,
            || {},
        )?;
        // Passes set aside pair nothing: more, until the verdict has its pairs (capped).
        while search::ratios_to_default(&extra, &samples[0]).len() < search::MIN_RUNS
            && end < first_pass + combo_runs / 2 + 2 * search::MIN_RUNS
        {
            search::run_pairs(end..end + 1, &mut samples[0], &mut extra, &mut trial, || {})?;
            end += 1;
        }
        samples.push(extra);
        configs.push(combo);
        failed.push(None);
        fallbacks.push(0);
        outcomes = search::outcomes(&samples, &dropped);
    }
    bar.finish_and_clear();
    let measured: Vec<Measured> = configs
        .into_iter()
        .zip(outcomes)
        .zip(failed.into_iter().zip(fallbacks))
        .map(|((config, mut outcome), (failed, thp_fallbacks))| {
            if failed.is_some() {
                outcome.verdict = Verdict::Dropped;
                let keep: Vec<bool> = outcome.samples.iter().map(|v| v.is_finite()).collect();
                let mut k = keep.iter();
                outcome.samples.retain(|_| *k.next().unwrap_or(&false));
                let mut k = keep.iter();
                outcome.passes.retain(|_| *k.next().unwrap_or(&false));
            }
            Measured {
                config,
                outcome,
                failed,
                thp_fallbacks,
            }
        })
        .collect();
    let best = measured
        .iter()
        .filter(|m| m.outcome.verdict == Verdict::Better)
        .min_by(|a, b| a.outcome.ratio.total_cmp(&b.outcome.ratio))
        .map(|m| m.config.clone())
        .unwrap_or_default();
    Ok(Found {
        workload: target.name.clone(),
        command: target.shown(),
        config_flags: target.config_flags,
        metric: target.metric_name(),
        maximize: target.maximize,
        threads,
        facts,
        advice,
        measured,
        best,
        budget_s: c.budget.as_secs_f64(),
        elapsed_s: start.elapsed().as_secs_f64(),
        when: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        matrix: None,
        combination_not_measured,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_bad_ones_say_how() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("45").unwrap(), Duration::from_secs(45));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        let e = parse_duration("soon").unwrap_err();
        assert!(e.contains("`soon`") && e.contains("90s"), "{e}");
        assert!(parse_duration("-3s").is_err());
        for tiny in ["1e-300", "0.0001s", "0.5ms"] {
            let e = parse_duration(tiny).unwrap_err();
            assert!(e.contains("shorter than a millisecond"), "{tiny}: {e}");
        }
        assert_eq!(parse_duration("1ms").unwrap(), Duration::from_millis(1));
        for huge in ["1e300", "5e20", "170h"] {
            let e = parse_duration(huge).unwrap_err();
            assert!(e.contains("longer than a week"), "{huge}: {e}");
        }
        assert_eq!(
            parse_duration("168h").unwrap(),
            Duration::from_secs(604_800)
        );
    }

    fn two_node_facts() -> Facts {
        Facts {
            cpu_nodes: 2,
            mem_nodes: 2,
            cpus: 8,
            threads: 8,
            autonuma_on: Some(true),
            thp: Some("always".into()),
            root: false,
            allocators: vec!["glibc".into(), "tbbmalloc".into()],
            missing_allocators: vec![],
            static_binary: false,
            pin_library: true,
            dram_nodes: None,
        }
    }

    #[test]
    fn a_cached_result_without_the_baselines_runs_is_a_miss() {
        let f = two_node_facts();
        let found = Found {
            workload: "w3".into(),
            command: vec!["true".into()],
            config_flags: false,
            metric: "wall time".into(),
            maximize: false,
            threads: 8,
            advice: rules::decide(&f),
            facts: f,
            measured: vec![Measured {
                config: Knobs::default(),
                outcome: Outcome {
                    samples: vec![1.0, 1.1],
                    passes: vec![0, 1],
                    ratio: 1.0,
                    ci: (1.0, 1.0),
                    verdict: Verdict::Default,
                    dropped_in: None,
                },
                failed: None,
                thp_fallbacks: 0,
            }],
            best: Knobs::default(),
            budget_s: 60.0,
            elapsed_s: 3.0,
            when: 0,
            matrix: None,
            combination_not_measured: None,
        };
        let text = serde_json::to_string(&found).unwrap();
        assert!(output::parse_cached(&text).is_some());
        assert!(output::parse_cached("not json").is_none());
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["measured"] = serde_json::json!([]);
        assert!(output::parse_cached(&v.to_string()).is_none());
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["measured"][0]["outcome"]["samples"] = serde_json::json!([]);
        assert!(output::parse_cached(&v.to_string()).is_none());
    }

    #[test]
    fn candidates_vary_one_factor_and_include_the_flowchart_answer() {
        let f = two_node_facts();
        let a = rules::decide(&f);
        let c = candidates(&a);
        assert_eq!(c[0], Knobs::default());
        let changed = |x: &Knobs| {
            let d = Knobs::default();
            [
                x.threads != d.threads,
                x.mem != d.mem,
                x.alloc != d.alloc,
                x.thp != d.thp,
            ]
            .iter()
            .filter(|b| **b)
            .count()
        };
        // os/sparse/compact, ft/interleave/localalloc, glibc/tbbmalloc, system/off, + the answer.
        assert_eq!(c.len(), 1 + 2 + 2 + 1 + 1 + 1);
        assert!(c[1..c.len() - 1].iter().all(|x| changed(x) == 1));
        let last = c.last().unwrap();
        assert_eq!(
            (
                last.threads.as_str(),
                last.mem.as_str(),
                last.alloc.as_str(),
                last.thp.as_str()
            ),
            ("sparse", "interleave", "tbbmalloc", "off")
        );
        assert_eq!(
            last.run_args(8).join(" "),
            "run --threads sparse -n 8 --mem interleave --alloc tbbmalloc --thp off"
        );
    }

    #[test]
    fn promising_values_of_two_factors_are_combined_once() {
        let d = Knobs::default();
        let c = vec![
            d.clone(),
            Knobs {
                alloc: "jemalloc".into(),
                ..d.clone()
            },
            Knobs {
                alloc: "tbbmalloc".into(),
                ..d.clone()
            },
            Knobs {
                thp: "off".into(),
                ..d.clone()
            },
            Knobs {
                mem: "interleave".into(),
                ..d.clone()
            },
        ];
        let o = |ratio: f64, verdict: Verdict| Outcome {
            samples: vec![],
            passes: vec![],
            ratio,
            ci: (0.0, 0.0),
            verdict,
            dropped_in: None,
        };
        let mut out = vec![
            o(1.0, Verdict::Default),
            o(0.9, Verdict::Better),
            o(0.8, Verdict::Better),
            o(0.95, Verdict::Better),
            o(0.99, Verdict::Same),
        ];
        let combo = combine(&c, &out).unwrap();
        assert_eq!(
            (combo.alloc.as_str(), combo.thp.as_str(), combo.mem.as_str()),
            ("tbbmalloc", "off", "first-touch"),
            "0.99 is within MIN_EFFECT of the default: not promising"
        );
        let mut with = c.clone();
        with.push(combo);
        assert_eq!(combine(&with, &out), None, "already measured");
        // Promising values count whatever their verdict: noise can hide each effect alone.
        out[3].verdict = Verdict::Same;
        out[4] = o(0.9, Verdict::Dropped);
        let combo = combine(&c, &out).unwrap();
        assert_eq!(
            (combo.alloc.as_str(), combo.thp.as_str(), combo.mem.as_str()),
            ("tbbmalloc", "off", "interleave")
        );
        out[3] = o(1.01, Verdict::Same);
        out[4] = o(f64::INFINITY, Verdict::Dropped);
        assert_eq!(combine(&c, &out), None, "one factor only");
    }

    #[test]
    fn facts_of_a_four_node_preset() {
        let topo = loci_topo::load(&loci_topo::Source::Preset("xeon-e7-4850v4-4s".into())).unwrap();
        let f = facts(&topo, 16, None);
        assert_eq!((f.cpu_nodes, f.mem_nodes), (4, 4));
        assert!(f.allocators.contains(&"glibc".to_string()));
        let a = rules::decide(&Facts {
            autonuma_on: Some(true),
            root: false,
            pin_library: true,
            ..f
        });
        assert_eq!(a.recommended.mem, "interleave");
        assert_eq!(a.recommended.threads, "sparse");
    }
}
