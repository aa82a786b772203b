//! One trial of `loci advise`: the workload run once under one configuration, through the same
//! `loci run` line the advice prints, and the figure read from it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use regex::Regex;

use super::Knobs;

/// A built-in workload: the arguments of `loci bench` run once per trial. Its figure is the
/// workload's own timed region (data generation and process start left out): the `loci` rows'
/// medians of its result file, summed (the run gets `--reps 1 --json FILE`), or, when `printed`
/// is set, the number that regex captures in its output.
pub struct Workload {
    pub name: &'static str,
    pub about: &'static str,
    pub bench: &'static str,
    pub printed: Option<&'static str>,
}

/// `loci advise --workload NAME`. The sizes keep one trial near a second on a 2-core machine;
/// engine workloads run unpinned on first-touch memory so that `loci run` decides both.
pub const WORKLOADS: &[Workload] = &[
    Workload {
        name: "w3",
        about: "hash join, 16M x 1M rows, sparse u64 keys (seed 002 W3; the default)",
        bench: "w3 --rows 16000000 --threads os --mem first-touch",
        printed: None,
    },
    Workload {
        name: "w1",
        about: "exact median by group, 10M rows, 100K groups (seed 002 W1)",
        bench: "w1 --rows 10000000 --groups 100000 --threads os --mem first-touch",
        printed: None,
    },
    Workload {
        name: "w2",
        about: "count/sum/min/max/avg by group, 10M rows, 100K groups (seed 002 W2)",
        bench: "w2 --rows 10000000 --groups 100000 --threads os --mem first-touch",
        printed: None,
    },
    Workload {
        name: "w4",
        about: "index nested-loop join over a sorted index, 16M probes (seed 002 W4)",
        bench: "w4 --rows 16000000 --variant sorted --threads os --mem first-touch",
        printed: None,
    },
    Workload {
        name: "subarray",
        about: "subarray slicing of a 64 MiB volume in 100 chunks, 6 boxes (seed 000)",
        bench: "subarray --quick --chunks 100 --threads os --peers memcpy",
        printed: None,
    },
    Workload {
        name: "alloc",
        about: "seed 002's allocator microbenchmark (`general`, 2 threads x 2M operations) in the allocator `loci run` preloads",
        bench: "alloc --child general --ops 2000000",
        printed: Some(r#""seconds":([0-9.eE+-]+)"#),
    },
    Workload {
        name: "stream",
        about: "LZ4 compress, send over loopback TCP, receive, decompress: 221 MB, 20 projections (seed 001)",
        bench: "stream --quick --no-os --peers= --protection=",
        printed: None,
    },
];

/// The engines `--workload tpch:ENGINE` takes (those of `loci bench tpch`).
pub const TPCH_ENGINES: [&str; 3] = ["duckdb", "postgres", "datafusion"];

/// The scale factors `tpch:ENGINE:SF` takes (those of `loci bench tpch`).
pub const TPCH_SCALES: [&str; 4] = ["0.01", "0.1", "1", "10"];

/// Every built-in workload name, for help and errors.
pub fn workload_names() -> String {
    let mut v: Vec<String> = WORKLOADS.iter().map(|w| w.name.to_string()).collect();
    v.extend(TPCH_ENGINES.iter().map(|e| format!("tpch:{e}")));
    v.join(", ")
}

/// Looks up a built-in workload, naming the valid ones when `name` is not one.
pub fn workload(name: &str) -> anyhow::Result<&'static Workload> {
    WORKLOADS.iter().find(|w| w.name == name).with_context(|| {
        format!(
            "unknown workload `{name}`; valid: {} (or give a command after `--`)",
            workload_names()
        )
    })
}

/// What a trial's figure is.
pub enum Metric {
    /// Built-in workloads: the summed `median_s` of the `loci` rows of the JSON result.
    Report,
    /// `tpch:ENGINE`: the geometric mean over the queries (the `ENGINE geomean` row).
    QueryGeomean,
    /// Wall time of the whole `loci run` process.
    Time,
    /// The first number the regex captures (group 1, else the whole match) in stdout+stderr.
    Regex(Regex),
}

/// What advise runs: a built-in workload or the user's command.
pub struct Target {
    pub name: String,
    /// The program and its arguments (a built-in workload: this `loci` and its bench arguments).
    pub argv: Vec<OsString>,
    pub metric: Metric,
    /// Whether a larger figure is better (`--maximize`).
    pub maximize: bool,
    /// Set for built-in workloads that write a result file: where it goes.
    json: Option<PathBuf>,
    builtin: bool,
    /// The configuration is handed to the program as its own `--threads/--mem/--alloc/--thp`
    /// flags instead of wrapping it in `loci run`: `loci bench tpch` starts each engine under its
    /// own `loci run` (the PostgreSQL server, not its client, must get the allocator).
    pub config_flags: bool,
}

impl Target {
    pub fn builtin(w: &Workload, exe: &Path, scratch: &Path) -> Target {
        let mut argv = vec![exe.as_os_str().to_owned(), "bench".into()];
        argv.extend(w.bench.split_whitespace().map(OsString::from));
        let (metric, json) = match w.printed {
            Some(re) => (
                Metric::Regex(Regex::new(re).expect("valid built-in regex")),
                None,
            ),
            None => {
                let json = scratch.join("trial.json");
                argv.extend([
                    "--reps".into(),
                    "1".into(),
                    "--json".into(),
                    json.clone().into_os_string(),
                ]);
                (Metric::Report, Some(json))
            }
        };
        Target {
            name: w.name.to_string(),
            builtin: true,
            argv,
            metric,
            maximize: false,
            json,
            config_flags: false,
        }
    }

    /// `tpch:ENGINE[:SF]`: the 22 TPC-H queries (SF 0.1 unless given) on one engine, one timed
    /// run of each after one warm run, through `loci bench tpch` with the configuration as its
    /// flags.
    pub fn tpch(spec: &str, exe: &Path, scratch: &Path) -> anyhow::Result<Target> {
        let (engine, sf) = spec.split_once(':').unwrap_or((spec, "0.1"));
        if !TPCH_SCALES.contains(&sf) {
            bail!(
                "unknown scale factor `{sf}` in `tpch:{spec}`; valid: {}",
                TPCH_SCALES.join(", ")
            );
        }
        if !TPCH_ENGINES.contains(&engine) {
            bail!(
                "unknown TPC-H engine `{engine}` in `tpch:{engine}`; valid: {}",
                TPCH_ENGINES.map(|e| format!("tpch:{e}")).join(", ")
            );
        }
        let json = scratch.join("trial.json");
        let mut argv: Vec<OsString> = vec![exe.as_os_str().to_owned()];
        argv.extend(
            [
                "bench",
                "tpch",
                "--engines",
                engine,
                "--sf",
                sf,
                "--reps",
                "1",
                "--warm",
                "1",
                // One configuration per trial: the bench would otherwise add and time the
                // default beside it.
                "--no-default",
            ]
            .map(OsString::from),
        );
        argv.extend(["--json".into(), json.clone().into_os_string()]);
        Ok(Target {
            name: format!("tpch:{engine}:{sf}"),
            builtin: true,
            argv,
            metric: Metric::QueryGeomean,
            maximize: false,
            json: Some(json),
            config_flags: true,
        })
    }

    pub fn command(argv: Vec<OsString>, metric: Metric, maximize: bool) -> Target {
        let name = Path::new(&argv[0])
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Target {
            name,
            argv,
            metric,
            maximize,
            json: None,
            builtin: false,
            config_flags: false,
        }
    }

    /// What the figure is, for the report.
    pub fn metric_name(&self) -> String {
        match &self.metric {
            Metric::QueryGeomean => "the geometric mean of the queries' times (s)".into(),
            _ if self.builtin => "the workload's timed region (s)".into(),
            Metric::Time => "wall time (s)".into(),
            Metric::Report => "the loci rows' medians of the result file (s)".into(),
            Metric::Regex(re) => format!("regex `{re}`"),
        }
    }

    /// The command as a user would type it (a built-in's result-file arguments left out).
    pub fn shown(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut skip = false;
        for (i, a) in self.argv.iter().enumerate() {
            let a = a.to_string_lossy();
            if skip {
                skip = false;
                continue;
            }
            if self.json.is_some() && a == "--json" {
                skip = true;
                continue;
            }
            out.push(if i == 0 && self.builtin {
                "loci".into()
            } else {
                a.into_owned()
            });
        }
        out
    }

    /// Runs the target once under `config` with `n` plan threads and returns its score (lower is
    /// better: a maximised figure is inverted, so ratios of scores stay ratios of figures).
    pub fn trial(&self, exe: &Path, config: &Knobs, n: usize) -> anyhow::Result<f64> {
        if let Some(j) = &self.json {
            let _ = std::fs::remove_file(j);
        }
        let mut cmd = if self.config_flags {
            let mut cmd = Command::new(&self.argv[0]);
            cmd.args(&self.argv[1..]).args(config.bench_flags());
            cmd
        } else {
            let mut cmd = Command::new(exe);
            cmd.args(config.run_args(n)).arg("--").args(&self.argv);
            cmd
        };
        cmd.stdin(Stdio::null());
        let start = Instant::now();
        let out = cmd
            .output()
            .with_context(|| format!("starting {}", exe.display()))?;
        let wall = start.elapsed().as_secs_f64();
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(6).collect();
            bail!(
                "`{}` failed ({}): {}",
                config.label(),
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            );
        }
        let figure = match &self.metric {
            Metric::Time => wall,
            Metric::Report | Metric::QueryGeomean => {
                let path = self.json.as_ref().expect("built-in targets write a report");
                report_time(path, matches!(self.metric, Metric::QueryGeomean))?
            }
            Metric::Regex(re) => {
                let text = format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                parse_metric(re, &text)?
            }
        };
        if !(figure > 0.0 && figure.is_finite()) {
            bail!(
                "`{}`: the figure {figure} is not a positive number",
                config.label()
            );
        }
        Ok(if self.maximize { 1.0 / figure } else { figure })
    }
}

/// The kernel's count of huge-page faults that fell back to 4 KiB pages (`thp_fault_fallback` in
/// /proc/vmstat): when it grows during a trial, THP could not get 2 MiB pages, and THP-on figures
/// drift as memory fragments. `None` where the kernel has no such counter.
pub fn thp_fault_fallbacks() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    parse_vmstat(&text, "thp_fault_fallback")
}

pub fn parse_vmstat(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The figure of a result file: the summed `median_s` of its `loci` rows, or with `geomean` the
/// `median_s` of its `ENGINE geomean` row (`loci bench tpch`).
fn report_time(path: &Path, geomean: bool) -> anyhow::Result<f64> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("the workload wrote no result file {}", path.display()))?;
    let r: loci_report::Report =
        serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
    let times: Vec<f64> = r
        .results
        .iter()
        .filter(|row| {
            if geomean {
                row.case.as_deref().is_some_and(|c| c.ends_with(" geomean"))
            } else {
                row.system == "loci"
            }
        })
        .map(|row| row.median_s)
        .collect();
    match times[..] {
        [] if geomean => bail!("{} has no `ENGINE geomean` row", path.display()),
        [] => bail!("{} has no `loci` row", path.display()),
        [_, _, ..] if geomean => bail!(
            "{} has {} `ENGINE geomean` rows: a trial must time one configuration of one engine",
            path.display(),
            times.len()
        ),
        _ => Ok(times.iter().sum()),
    }
}

/// The number `re` finds in `text`: capture group 1 if the regex has one, else the whole match.
/// It must be finite and above 0: trials are compared by ratios (and a higher-is-better figure
/// is inverted), which a 0, a negative number, `inf` or `NaN` would turn into nonsense.
pub fn parse_metric(re: &Regex, text: &str) -> anyhow::Result<f64> {
    let caps = re
        .captures(text)
        .with_context(|| format!("--metric `{re}` matched nothing in the program's output"))?;
    let m = caps
        .get(1)
        .or_else(|| caps.get(0))
        .expect("a match has group 0");
    let v = m.as_str().trim().parse::<f64>().with_context(|| {
        format!(
            "--metric `{re}` matched `{}`, which is not a number (put the number in a capture group)",
            m.as_str()
        )
    })?;
    anyhow::ensure!(
        v.is_finite() && v > 0.0,
        "--metric `{re}` matched `{}`: the figure must be a finite number above 0 (times and rates are compared by ratios)",
        m.as_str()
    );
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_regex_takes_the_group_or_the_match() {
        let re = Regex::new(r"took ([0-9.]+) s").unwrap();
        assert_eq!(parse_metric(&re, "x\ntook 1.25 s\n").unwrap(), 1.25);
        let re = Regex::new(r"[0-9]+\.[0-9]+").unwrap();
        assert_eq!(parse_metric(&re, "rate 3.5 GB/s").unwrap(), 3.5);
        let e = parse_metric(&Regex::new("(took) ").unwrap(), "took 1").unwrap_err();
        assert!(e.to_string().contains("not a number"), "{e}");
        let e = parse_metric(&Regex::new("zzz").unwrap(), "took 1").unwrap_err();
        assert!(e.to_string().contains("matched nothing"), "{e}");
        // Figures compared by ratios: no zero, negative, infinite or NaN ones.
        let re = Regex::new(r"took (\S+) s").unwrap();
        for bad in ["0", "-2.5", "inf", "NaN", "1e999"] {
            let e = parse_metric(&re, &format!("took {bad} s")).unwrap_err();
            assert!(
                e.to_string().contains("finite number above 0"),
                "{bad}: {e}"
            );
            assert!(e.to_string().contains(bad), "{bad}: {e}");
        }
        assert_eq!(parse_metric(&re, "took 2e-3 s").unwrap(), 2e-3);
    }

    #[test]
    fn unknown_workload_lists_the_valid_ones() {
        let e = workload("w9").err().unwrap().to_string();
        assert!(
            e.contains("w9") && e.contains("w3, w1, w2, w4, subarray, alloc, stream, tpch:duckdb"),
            "{e}"
        );
    }

    #[test]
    fn every_builtin_workload_is_a_valid_loci_command() {
        use clap::Parser;
        let scratch = Path::new("/tmp/x");
        for w in WORKLOADS {
            let t = Target::builtin(w, Path::new("loci"), scratch);
            if let Err(e) = crate::Cli::try_parse_from(&t.argv) {
                panic!("workload {}: {e}", w.name);
            }
        }
    }

    #[test]
    fn tpch_target_hands_the_configuration_to_the_bench_as_flags() {
        use clap::Parser;
        let t = Target::tpch("postgres", Path::new("loci"), Path::new("/tmp/x")).unwrap();
        assert!(t.config_flags);
        let c = Knobs {
            alloc: "jemalloc".into(),
            thp: "off".into(),
            ..Knobs::default()
        };
        let mut argv = t.argv.clone();
        argv.extend(c.bench_flags().into_iter().map(OsString::from));
        if let Err(e) = crate::Cli::try_parse_from(&argv) {
            panic!("{e}");
        }
        let line = argv
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            line.contains("--engines postgres") && line.contains("--alloc jemalloc --thp off"),
            "{line}"
        );
        assert!(line.contains("--sf 0.1 "), "{line}");
        let e = Target::tpch("sqlite", Path::new("loci"), Path::new("/tmp/x"))
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("tpch:duckdb, tpch:postgres, tpch:datafusion"),
            "{e}"
        );
        let e = Target::tpch("duckdb:3", Path::new("loci"), Path::new("/tmp/x"))
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("`3`") && e.to_string().contains("0.01, 0.1, 1, 10"),
            "{e}"
        );
        let t = Target::tpch("duckdb:0.01", Path::new("loci"), Path::new("/tmp/x")).unwrap();
        assert_eq!(t.name, "tpch:duckdb:0.01");
    }

    #[test]
    fn tpch_figure_is_the_geomean_row() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        let mut r = loci_report::Report::new(
            "tpch",
            serde_json::json!({}),
            loci_report::Machine::default(),
        );
        r.results
            .push(loci_report::Row::from_times("duckdb", vec![0.5]).case("duckdb q01"));
        r.results
            .push(loci_report::Row::from_times("duckdb", vec![0.25]).case("duckdb geomean"));
        r.write_json(&p).unwrap();
        assert_eq!(report_time(&p, true).unwrap(), 0.25);
        // Two configurations' geomeans are not one trial's figure (they were once summed).
        r.results
            .push(loci_report::Row::from_times("duckdb", vec![0.5]).case("duckdb geomean"));
        r.write_json(&p).unwrap();
        let e = report_time(&p, true).unwrap_err().to_string();
        assert!(e.contains("2 `ENGINE geomean` rows"), "{e}");
        assert!(report_time(&p, false)
            .unwrap_err()
            .to_string()
            .contains("no `loci` row"));
    }

    #[test]
    fn builtin_shown_command_drops_the_result_file() {
        let t = Target::builtin(
            workload("w3").unwrap(),
            Path::new("/x/loci"),
            Path::new("/tmp/s"),
        );
        let shown = t.shown().join(" ");
        assert!(
            shown.starts_with("loci bench w3 --rows 16000000"),
            "{shown}"
        );
        assert!(!shown.contains("json"), "{shown}");
    }

    #[test]
    fn vmstat_counter_is_read_by_exact_name() {
        let text = "thp_fault_alloc 12\nthp_fault_fallback 7\nthp_fault_fallback_charge 3\n";
        assert_eq!(parse_vmstat(text, "thp_fault_fallback"), Some(7));
        assert_eq!(parse_vmstat(text, "thp_split_page"), None);
    }
}
