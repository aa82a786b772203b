//! The one result format every `loci bench` writes (see BENCHMARKS.md), with timing statistics,
//! a plain-text table with ratios against a baseline row, and an SVG bar chart.
//!
//! ```json
//! { "workload": "w2", "params": {...}, "machine": {"nodes": 1, "cpus": 2, "kernel": "6.1.0-...",
//!   "cpu_model": "...", "autonuma": "off", "thp": "madvise", "allocator": "glibc"},
//!   "results": [ { "system": "loci", "case": "...", "config": {...}, "times_s": [...],
//!                  "median_s": 1.2, "min_s": 1.1, "max_s": 1.3, "throughput": 8e7, "unit": "rows/s",
//!                  "rss_bytes": 1, "requested_bytes": 1, "local_access_ratio": 0.98 } ] }
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use loci_topo::Topology;
use serde::{Deserialize, Serialize};

/// Summary of the machine a benchmark ran on, with the OS state that changes NUMA behaviour, so
/// that runs (and `loci advise`) can be compared.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Machine {
    pub nodes: usize,
    pub cpus: usize,
    /// `model name` of /proc/cpuinfo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    /// The kernel release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// AutoNUMA (`on`, `off`, `on (mode N)`), absent when the kernel has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autonuma: Option<String>,
    /// The system THP mode (`always`, `madvise`, `never`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thp: Option<String>,
    /// The allocator of the benchmark process: the preloaded one (`LD_PRELOAD`), else `glibc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<String>,
}

impl Machine {
    /// A machine of `nodes` nodes and `cpus` cpus, with no OS facts (tests, made-up reports).
    pub fn sized(nodes: usize, cpus: usize) -> Self {
        Machine {
            nodes,
            cpus,
            ..Machine::default()
        }
    }

    /// Nodes and allowed cpus of a topology, and the OS state of the machine this runs on.
    pub fn of(topo: &Topology) -> Self {
        let knobs = loci_place::knobs::read(std::path::Path::new("/")).ok();
        let read = |p: &str| std::fs::read_to_string(p).ok();
        Self {
            nodes: topo.nodes.len(),
            cpus: topo.allowed_cpus().len(),
            cpu_model: read("/proc/cpuinfo").and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            }),
            kernel: read("/proc/sys/kernel/osrelease").map(|k| k.trim().to_string()),
            autonuma: knobs.as_ref().and_then(|k| k.autonuma.clone()),
            thp: knobs.and_then(|k| k.thp_enabled),
            allocator: Some(preloaded_allocator(
                &std::env::var("LD_PRELOAD").unwrap_or_default(),
            )),
        }
    }
}

/// The allocator an `LD_PRELOAD` value loads (`glibc` when it loads none of the known ones).
pub fn preloaded_allocator(preload: &str) -> String {
    const KNOWN: [(&str, &str); 5] = [
        ("jemalloc", "jemalloc"),
        ("tcmalloc", "tcmalloc"),
        ("tbbmalloc", "tbbmalloc"),
        ("mimalloc", "mimalloc"),
        ("loci_malloc", "loci"),
    ];
    KNOWN
        .iter()
        .find(|(lib, _)| preload.contains(lib))
        .map_or("glibc", |(_, name)| name)
        .to_string()
}

/// One measured configuration of one system.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Row {
    /// `loci` or a peer (`duckdb`, `polars`, `numpy`, `memcpy`, `glibc`, `jemalloc`, `rayon`, `lz4-nc`, ...).
    pub system: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub case: Option<String>,
    /// Configuration knobs, e.g. `threads`, `mem`, `alloc`, `sched`.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    pub times_s: Vec<f64>,
    pub median_s: f64,
    pub min_s: f64,
    pub max_s: f64,
    /// Units of work per second at the median time.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub throughput: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub unit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub requested_bytes: Option<u64>,
    /// From real page placement (move_pages), never modeled.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub local_access_ratio: Option<f64>,
    /// Anything else a workload reports (counters, checksums).
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// The median of `values` (the mean of the two middle ones for an even count); None when empty.
/// Every `median_s` of the result format is this.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

impl Row {
    /// A row from repeated timings. `work` units per run give the throughput at the median.
    /// Panics on an empty `times` (a benchmark that measured nothing is a bug in the benchmark).
    pub fn from_times(system: &str, times: Vec<f64>) -> Self {
        let median_s = median(&times).expect("a result row needs at least one timing");
        Row {
            system: system.to_string(),
            min_s: times.iter().copied().fold(f64::INFINITY, f64::min),
            max_s: times.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            median_s,
            times_s: times,
            ..Default::default()
        }
    }
    pub fn case(mut self, case: &str) -> Self {
        self.case = Some(case.to_string());
        self
    }
    pub fn config(mut self, key: &str, value: impl ToString) -> Self {
        self.config.insert(key.to_string(), value.to_string());
        self
    }
    /// Sets throughput = `work / median_s` in `unit`.
    pub fn work(mut self, work: f64, unit: &str) -> Self {
        self.throughput = Some(work / self.median_s);
        self.unit = Some(unit.to_string());
        self
    }
    pub fn extra(mut self, key: &str, value: impl Serialize) -> Self {
        self.extra.insert(
            key.to_string(),
            serde_json::to_value(value).expect("serializable"),
        );
        self
    }
    /// `system` plus config values, for labels: `loci sparse/interleave/glibc`.
    pub fn label(&self) -> String {
        let cfg: Vec<&str> = self.config.values().map(String::as_str).collect();
        if cfg.is_empty() {
            self.system.clone()
        } else {
            format!("{} {}", self.system, cfg.join("/"))
        }
    }
}

/// One benchmark invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub workload: String,
    pub params: serde_json::Value,
    pub machine: Machine,
    pub results: Vec<Row>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot write {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot draw plot {path}: {why}")]
    Plot { path: String, why: String },
}

impl Report {
    pub fn new(workload: &str, params: serde_json::Value, machine: Machine) -> Self {
        Self {
            workload: workload.to_string(),
            params,
            machine,
            results: Vec::new(),
        }
    }

    pub fn write_json(&self, path: &Path) -> Result<(), ReportError> {
        let text = serde_json::to_string_pretty(self).expect("report serializes");
        std::fs::write(path, text + "\n").map_err(|source| ReportError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Rows of one case (all rows when `case` is None).
    pub fn rows_of<'a>(&'a self, case: Option<&'a str>) -> impl Iterator<Item = &'a Row> + 'a {
        self.results
            .iter()
            .filter(move |r| case.is_none() || r.case.as_deref() == case)
    }

    /// A table per case: label, median/min/max, throughput, and `time / baseline time` where the
    /// baseline is the first row of the case whose label satisfies `is_baseline` (ratio < 1 = faster).
    pub fn table(&self, is_baseline: impl Fn(&Row) -> bool) -> String {
        let mut cases: Vec<Option<&str>> = Vec::new();
        for r in &self.results {
            if !cases.contains(&r.case.as_deref()) {
                cases.push(r.case.as_deref());
            }
        }
        let mut out = String::new();
        for case in cases {
            let rows: Vec<&Row> = self.rows_of(case).collect();
            let base = rows
                .iter()
                .find(|r| is_baseline(r))
                .map(|r| (r.label(), r.median_s));
            out += &format!("\n{} {}\n", self.workload, case.unwrap_or(""));
            let w = label_width(&rows);
            out += &format!(
                "  {:<w$}  {:>10} {:>10} {:>10}  {:>14}  {:>9}  {:>6}\n",
                "system", "median s", "min s", "max s", "throughput", "vs base", "local"
            );
            for r in rows {
                let tp = match (&r.throughput, &r.unit) {
                    (Some(t), Some(u)) => format!("{} {u}", si(*t)),
                    _ => "-".into(),
                };
                let ratio = base
                    .as_ref()
                    .map(|(_, b)| format!("{:.2}x", r.median_s / b))
                    .unwrap_or("-".into());
                let local = r
                    .local_access_ratio
                    .map(|l| format!("{l:.2}"))
                    .unwrap_or("-".into());
                out += &format!(
                    "  {:<w$}  {:>10.4} {:>10.4} {:>10.4}  {:>14}  {:>9}  {:>6}\n",
                    r.label(),
                    r.median_s,
                    r.min_s,
                    r.max_s,
                    tp,
                    ratio,
                    local
                );
            }
            if let Some((label, _)) = base {
                out += &format!(
                    "  (vs base = median time / median time of `{label}`; below 1.00x is faster)\n"
                );
            }
        }
        out
    }

    /// Horizontal bar chart of median times (with min-max whiskers), one panel per case.
    pub fn plot_svg(&self, path: &Path) -> Result<(), ReportError> {
        use plotters::prelude::*;
        let perr = |e: &dyn std::fmt::Display| ReportError::Plot {
            path: path.display().to_string(),
            why: e.to_string(),
        };
        let mut cases: Vec<Option<&str>> = Vec::new();
        for r in &self.results {
            if !cases.contains(&r.case.as_deref()) {
                cases.push(r.case.as_deref());
            }
        }
        let rows_total = self.results.len().max(1);
        let height = 80 * cases.len().max(1) as u32 + 24 * rows_total as u32;
        let root = SVGBackend::new(path, (900, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| perr(&e))?;
        let sizes: Vec<u32> = cases
            .iter()
            .map(|c| 80 + 24 * self.rows_of(*c).count() as u32)
            .collect();
        let mut area = root.clone();
        for (case, h) in cases.iter().zip(sizes) {
            let (top, rest) = area.split_vertically(h);
            area = rest;
            let rows: Vec<&Row> = self.rows_of(*case).collect();
            let xmax = rows.iter().map(|r| r.max_s).fold(0.0f64, f64::max) * 1.1 + 1e-9;
            let n = rows.len();
            let mut chart = ChartBuilder::on(&top)
                .caption(
                    format!(
                        "{} {} (median s, min-max)",
                        self.workload,
                        case.unwrap_or("")
                    ),
                    ("sans-serif", 16),
                )
                .margin(8)
                .x_label_area_size(24)
                .y_label_area_size(260)
                .build_cartesian_2d(0.0..xmax, (0..n).into_segmented())
                .map_err(|e| perr(&e))?;
            let labels: Vec<String> = rows.iter().map(|r| r.label()).collect();
            chart
                .configure_mesh()
                .disable_y_mesh()
                .y_label_formatter(&|v| match v {
                    SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                    _ => String::new(),
                })
                .draw()
                .map_err(|e| perr(&e))?;
            chart
                .draw_series(rows.iter().enumerate().map(|(i, r)| {
                    let color = Palette99::pick(i).filled();
                    Rectangle::new(
                        [
                            (0.0, SegmentValue::Exact(i)),
                            (r.median_s, SegmentValue::Exact(i + 1)),
                        ],
                        color,
                    )
                }))
                .map_err(|e| perr(&e))?;
            chart
                .draw_series(rows.iter().enumerate().map(|(i, r)| {
                    PathElement::new(
                        vec![
                            (r.min_s, SegmentValue::CenterOf(i)),
                            (r.max_s, SegmentValue::CenterOf(i)),
                        ],
                        BLACK.stroke_width(2),
                    )
                }))
                .map_err(|e| perr(&e))?;
        }
        root.present().map_err(|e| perr(&e))?;
        Ok(())
    }
}

/// Width of a table's label column: the longest label of `rows`, and at least the header's
/// (`system`).
pub fn label_width(rows: &[&Row]) -> usize {
    rows.iter().map(|r| r.label().len()).fold(6, usize::max)
}

/// Formats a number with an SI prefix: 8.1e7 -> "81.0M".
pub fn si(v: f64) -> String {
    let (d, p) = if v >= 1e12 {
        (1e12, "T")
    } else if v >= 1e9 {
        (1e9, "G")
    } else if v >= 1e6 {
        (1e6, "M")
    } else if v >= 1e3 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    format!("{:.1}{p}", v / d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_format() {
        let r = Row::from_times("loci", vec![3.0, 1.0, 2.0])
            .case("c")
            .config("threads", "sparse")
            .work(6.0, "rows/s");
        assert_eq!((r.min_s, r.median_s, r.max_s), (1.0, 2.0, 3.0));
        assert_eq!(r.throughput, Some(3.0));
        let even = Row::from_times("x", vec![4.0, 1.0, 2.0, 3.0]);
        assert_eq!(even.median_s, 2.5);
        assert_eq!((even.min_s, even.max_s), (1.0, 4.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[5.0]), Some(5.0));
        assert_eq!(median(&[9.0, -1.0, 0.5]), Some(0.5));
        let mut rep = Report::new("w2", serde_json::json!({"rows": 10}), Machine::sized(1, 2));
        rep.results.push(r);
        rep.results
            .push(Row::from_times("duckdb", vec![4.0]).case("c"));
        let v: serde_json::Value = serde_json::to_value(&rep).unwrap();
        assert_eq!(v["workload"], "w2");
        assert_eq!(v["machine"]["cpus"], 2);
        assert_eq!(v["results"][0]["config"]["threads"], "sparse");
        assert_eq!(v["results"][0]["unit"], "rows/s");
        assert!(v["results"][1].get("unit").is_none());
        let t = rep.table(|r| r.system == "duckdb");
        assert!(t.contains("0.50x") && t.contains("1.00x"), "{t}");
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back, rep);
    }

    #[test]
    fn machine_records_the_os_state() {
        let topo = loci_topo::load(&loci_topo::Source::Preset("xeon-e7-4850v4-4s".into())).unwrap();
        let m = Machine::of(&topo);
        assert_eq!(m.nodes, 4);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        assert_eq!(m.kernel.as_deref(), Some(kernel.trim()));
        let v = serde_json::to_value(&m).unwrap();
        assert!(v["allocator"].is_string(), "{v}");
        if std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            assert!(
                ["always", "madvise", "never"].contains(&m.thp.as_deref().unwrap()),
                "{m:?}"
            );
        }
        // An older result without the OS fields still reads.
        let old: Machine = serde_json::from_str(r#"{"nodes": 1, "cpus": 2}"#).unwrap();
        assert_eq!(old.kernel, None);
    }

    #[test]
    fn preloaded_allocator_names() {
        assert_eq!(preloaded_allocator(""), "glibc");
        assert_eq!(
            preloaded_allocator("/x/libloci_pin.so:/usr/lib/libjemalloc.so.2"),
            "jemalloc"
        );
        assert_eq!(preloaded_allocator("/t/libloci_malloc.so"), "loci");
        assert_eq!(
            preloaded_allocator("/usr/lib/libtbbmalloc_proxy.so.2"),
            "tbbmalloc"
        );
    }

    #[test]
    fn plot_writes_svg() {
        let mut rep = Report::new("alloc", serde_json::json!({}), Machine::sized(1, 2));
        rep.results
            .push(Row::from_times("glibc", vec![1.0, 1.2]).case("general"));
        rep.results
            .push(Row::from_times("loci", vec![0.8, 0.9]).case("general"));
        rep.results
            .push(Row::from_times("loci", vec![0.5]).case("buffer-passing"));
        let p = std::env::temp_dir().join(format!("loci-report-test-{}.svg", std::process::id()));
        rep.plot_svg(&p).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        std::fs::remove_file(&p).ok();
        assert!(svg.starts_with("<svg") && svg.contains("glibc") && svg.contains("buffer-passing"));
    }
}
