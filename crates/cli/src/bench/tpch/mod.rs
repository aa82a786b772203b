//! `loci bench tpch` (seed 002's W5): TPC-H on real database engines, each run under
//! `loci run` with the configuration under test (allocator x thread placement x memory policy x
//! THP), per-query medians of warm runs, geometric means, and ratios to the engine's default
//! configuration. Answers are checked across engines and configurations.
//!
//! Engines: DuckDB and DataFusion embedded in bench/tpch/tpch.py (the Python process is the
//! engine), PostgreSQL (a cluster loaded once per scale factor, see [`postgres`]; the server runs under `loci run`, the
//! client does not), and loci-engine (Q1, Q3, Q5, Q6, Q18 in this process, see [`loci`]; it runs
//! after the others and its answers are checked against theirs on the queries it runs).
//! Data: [`data`]. Queries: bench/tpch/queries/qNN.sql.

mod answers;
pub(crate) mod data;
mod loci;
mod postgres;
mod summary;

pub use summary::{baseline, summary};

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use loci_report::{Machine, Report, Row};

use crate::bench::common;
use crate::stats::Samples;

#[derive(Args, Debug)]
pub struct TpchArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Scale factor: 0.01, 0.1, 1 or 10 (default 1; --quick: 0.01). Generated once into
    /// ${XDG_CACHE_HOME:-~/.cache}/loci/tpch/sfS.
    #[arg(long)]
    pub sf: Option<String>,
    /// Engines, comma separated: duckdb, datafusion (embedded, Python packages), postgres
    /// (Debian package), loci (loci-engine in this process: queries 1, 3, 5, 6 and 18 only;
    /// not in the default list).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "duckdb,postgres,datafusion"
    )]
    pub engines: Vec<String>,
    /// Queries: a comma-separated list of 1..22, or all.
    #[arg(long, default_value = "all")]
    pub queries: String,
    #[command(flatten)]
    pub matrix: super::Matrix<TpchDefaults>,
    /// Transparent huge pages (`loci run --thp`), comma separated: default (leave the system
    /// setting), on, off.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    pub thp: Vec<String>,
    /// Untimed runs of each query before its timed run, in every engine session.
    #[arg(long, default_value_t = 1)]
    pub warm: usize,
    /// Run only the configurations the knob lists make. Without it the engine's default
    /// configuration (glibc, os, first-touch, system THP) is added and run first, so every row
    /// has a ratio to it; `loci advise` passes this to time exactly one configuration per trial.
    #[arg(long)]
    pub no_default: bool,
    /// PostgreSQL: load the scale factor's cluster anew instead of reusing the one an earlier
    /// run loaded (kept in /var/tmp/loci-tpch-postgres-UID/sfS).
    #[arg(long)]
    pub reload: bool,
    /// Run nothing: print the table and summary (configuration search included) of a result
    /// that `loci bench tpch --json` saved.
    #[arg(
        long,
        value_name = "FILE.json",
        conflicts_with_all = [
            "sf", "engines", "queries", "thp", "warm", "no_default", "reload", "alloc", "threads",
            "mem", "quick", "reps",
        ]
    )]
    pub summary: Option<PathBuf>,
}

/// TPC-H's sweep without flags: the engines' own threads, unpinned, on first-touch memory.
#[derive(Clone, Debug)]
pub struct TpchDefaults;

impl super::MatrixDefaults for TpchDefaults {
    const THREADS: &'static str = "os";
    const MEM: &'static str = "first-touch";
}

/// The engines this bench runs.
const ENGINES: [&str; 4] = ["duckdb", "postgres", "datafusion", "loci"];

/// One configuration under test: the knobs `loci run` applies to the engine.
#[derive(Clone, Debug, PartialEq)]
struct Config {
    alloc: String,
    threads: String,
    mem: String,
    thp: String,
}

impl Config {
    fn default_config() -> Self {
        Config {
            alloc: "glibc".into(),
            threads: "os".into(),
            mem: "first-touch".into(),
            thp: "default".into(),
        }
    }

    /// `loci run --threads T --mem M --alloc A [--thp on|off] --`.
    fn loci_run(&self) -> anyhow::Result<Vec<OsString>> {
        let exe = std::env::current_exe().context("finding this loci executable")?;
        let thp = (self.thp != "default").then_some(self.thp.as_str());
        let args = crate::run_cmd::knob_args(&self.threads, None, &self.mem, &self.alloc, thp);
        Ok(std::iter::once(exe.into())
            .chain(args.into_iter().map(OsString::from))
            .chain(std::iter::once("--".into()))
            .collect())
    }

    fn row(&self, row: Row) -> Row {
        row.config("alloc", &self.alloc)
            .config("threads", &self.threads)
            .config("mem", &self.mem)
            .config("thp", &self.thp)
    }
}

/// Every combination of the knob lists, the default configuration first (added when the lists
/// leave it out, so every engine has its baseline, unless `--no-default`). Each value is checked here against the
/// vocabulary `loci run` takes, so a typo fails before any engine starts.
fn configs(a: &TpchArgs) -> anyhow::Result<Vec<Config>> {
    for x in &a.matrix.alloc {
        crate::run_cmd::Alloc::from_str(x, false).map_err(|_| {
            anyhow::anyhow!(
                "--alloc {x}: unknown; valid: glibc, jemalloc, tcmalloc, tbbmalloc, mimalloc, loci"
            )
        })?;
    }
    a.matrix.strategies()?;
    for x in &a.matrix.mem {
        x.parse::<loci_place::MemPolicy>()
            .map_err(|e| anyhow::anyhow!("--mem {x}: {e}"))?;
    }
    for x in &a.thp {
        if !["default", "on", "off"].contains(&x.as_str()) {
            bail!("--thp {x}: unknown; valid: default, on, off");
        }
    }
    let mut out = match a.no_default {
        true => vec![],
        false => vec![Config::default_config()],
    };
    let m = &a.matrix;
    for [alloc, threads, mem, thp] in
        crate::run_cmd::product4([&m.alloc, &m.threads, &m.mem, &a.thp])
    {
        let c = Config {
            alloc: alloc.into(),
            threads: threads.into(),
            mem: mem.into(),
            thp: thp.into(),
        };
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Ok(out)
}

/// `--queries`: `all` or a list of numbers in 1..=22.
pub fn parse_queries(s: &str) -> anyhow::Result<Vec<u32>> {
    if s == "all" {
        return Ok((1..=22).collect());
    }
    let mut v = Vec::new();
    for p in s.split(',') {
        match p.trim().parse::<u32>() {
            Ok(q) if (1..=22).contains(&q) => v.push(q),
            _ => bail!(
                "--queries: '{p}' is not a TPC-H query; valid: 1..22, comma separated, or all"
            ),
        }
    }
    Ok(v)
}

/// Where the bench's files are: bench/tpch (driver and queries) and the venv's programs.
struct Paths {
    tpch: PathBuf,
    python: PathBuf,
    tpchgen: PathBuf,
}

impl Paths {
    /// Finds bench/ and makes sure the venv has the TPC-H set (`bench/peers/setup --tpch`).
    fn setup() -> anyhow::Result<Self> {
        let peers = common::peers_setup("tpch", "../tpch/tpch.py")?;
        let bin = peers.join(".venv/bin");
        Ok(Paths {
            tpch: peers
                .parent()
                .expect("bench/peers has a parent")
                .join("tpch"),
            python: bin.join("python"),
            tpchgen: bin.join("tpchgen-cli"),
        })
    }

    /// `python bench/tpch/tpch.py MODE` with the query arguments of this run.
    fn driver(&self, mode: &str, run: &RunSpec, answers: Option<&Path>) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![
            self.python.clone().into(),
            self.tpch.join("tpch.py").into(),
            mode.into(),
        ];
        let list = run.queries.iter().map(u32::to_string).collect::<Vec<_>>();
        for (k, val) in [
            ("--data", run.data.display().to_string()),
            ("--queries", self.tpch.join("queries").display().to_string()),
            ("--sf", run.sf.clone()),
            ("--list", list.join(",")),
            ("--warm", run.warm.to_string()),
            ("--threads", run.cpus.to_string()),
        ] {
            v.push(k.into());
            v.push(val.into());
        }
        if let Some(p) = answers {
            v.push("--answers".into());
            v.push(p.into());
        }
        v
    }
}

/// What every engine session of one invocation shares.
struct RunSpec {
    sf: String,
    data: PathBuf,
    queries: Vec<u32>,
    warm: usize,
    cpus: usize,
    /// Load PostgreSQL's cached cluster anew.
    reload: bool,
}

/// One engine session's output: the timed run of each query, and the driver's facts about the
/// engine process (version, pid, allocators mapped, own allocator, cpus allowed).
struct Session {
    times: BTreeMap<u32, f64>,
    facts: serde_json::Value,
}

/// Runs `argv` and reads the driver's JSON lines from its stdout.
fn drive(argv: &[OsString]) -> anyhow::Result<Session> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {argv:?}"))?;
    let mut s = Session {
        times: BTreeMap::new(),
        facts: serde_json::Value::Null,
    };
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        let v: serde_json::Value = serde_json::from_str(&line).with_context(|| {
            format!("bench/tpch/tpch.py printed a line that is not JSON: {line}")
        })?;
        match (v["query"].as_u64(), v["time_s"].as_f64()) {
            (Some(q), Some(t)) => {
                s.times.insert(q as u32, t);
            }
            _ => s.facts = v,
        }
    }
    let st = child.wait()?;
    if !st.success() {
        bail!("{argv:?} failed ({st})");
    }
    Ok(s)
}

/// One engine, started as the harness needs it for a run.
enum Engine {
    /// In the driver's process: its mode of bench/tpch/tpch.py (`duckdb`, `datafusion`).
    Embedded(&'static str),
    Postgres(postgres::Cluster),
    /// loci-engine in this process.
    Loci(loci::Loci),
}

impl Engine {
    /// Embedded engines need nothing; PostgreSQL gets its cluster of this scale factor, loaded
    /// from the Parquet tables by a server started without loci (the load is not measured) unless
    /// an earlier invocation loaded the same (see [`postgres`]); loci-engine generates its tables
    /// in its first session.
    fn prepare(name: &str, paths: Option<&Paths>, run: &RunSpec) -> anyhow::Result<Self> {
        if name == "loci" {
            return Ok(Engine::Loci(loci::Loci::default()));
        }
        let paths = paths.context("the Python peers' paths")?;
        match name {
            "duckdb" => Ok(Engine::Embedded("duckdb")),
            "datafusion" => Ok(Engine::Embedded("datafusion")),
            "postgres" => {
                let mut cluster = postgres::Cluster::open(
                    &run.sf,
                    &run.data,
                    &paths.tpch.join("tpch.py"),
                    run.reload,
                    run.cpus,
                )?;
                if !cluster.loaded() {
                    let server = cluster.start(&[])?;
                    eprintln!(
                        "loading PostgreSQL sf {} (COPY, keys, indexes, ANALYZE)",
                        run.sf
                    );
                    let mut argv = paths.driver("load-postgres", run, None);
                    argv.extend(pg_client_args(&cluster));
                    argv.push("--csv-dir".into());
                    argv.push(cluster.socket_dir().into());
                    drive(&argv).context("loading PostgreSQL")?;
                    server.stop()?;
                    cluster.mark_loaded()?;
                }
                Ok(Engine::Postgres(cluster))
            }
            other => bail!("--engines {other}: unknown; valid: {ENGINES:?}"),
        }
    }

    /// One session under `cfg`: every query warmed and timed once.
    fn session(
        &self,
        paths: Option<&Paths>,
        run: &RunSpec,
        cfg: &Config,
        answers: Option<&Path>,
    ) -> anyhow::Result<Session> {
        if let Engine::Loci(l) = self {
            return l.session(run, cfg, answers);
        }
        let paths = paths.context("the Python peers' paths")?;
        match self {
            Engine::Embedded(mode) => {
                let mut argv = cfg.loci_run()?;
                argv.extend(paths.driver(mode, run, answers));
                drive(&argv)
            }
            Engine::Postgres(cluster) => {
                let server = cluster.start(&cfg.loci_run()?)?;
                let mut argv = paths.driver("postgres", run, answers);
                argv.extend(pg_client_args(cluster));
                let s = drive(&argv);
                server.stop()?;
                s
            }
            Engine::Loci(_) => unreachable!("handled above"),
        }
    }
}

fn pg_client_args(c: &postgres::Cluster) -> Vec<OsString> {
    vec![
        "--socket".into(),
        c.socket_dir().into(),
        "--port".into(),
        postgres::PORT.into(),
    ]
}

pub fn run(a: TpchArgs) -> anyhow::Result<Report> {
    if let Some(p) = &a.summary {
        return saved(p);
    }
    let sf =
        data::check_scale(
            a.sf.as_deref()
                .unwrap_or(if a.common.quick { "0.01" } else { "1" }),
        )?
        .to_string();
    let queries = parse_queries(&a.queries)?;
    let cfgs = configs(&a)?;
    for e in &a.engines {
        if !ENGINES.contains(&e.as_str()) {
            bail!("--engines {e}: unknown; valid: {ENGINES:?}");
        }
    }
    // loci-engine runs after the other engines, so their answers are the reference its own are
    // checked against (on the queries it runs).
    let mut engines: Vec<String> = a.engines.iter().filter(|e| *e != "loci").cloned().collect();
    let with_loci = a.engines.iter().any(|e| e == "loci");
    if with_loci {
        let unsupported: Vec<u32> = queries
            .iter()
            .copied()
            .filter(|q| !loci::QUERIES.contains(q))
            .collect();
        if engines.is_empty() && !unsupported.is_empty() {
            bail!(
                "--engines loci: loci-engine runs queries {:?} only; --queries {} asks for {unsupported:?} too",
                loci::QUERIES,
                a.queries
            );
        }
        if loci::supported(&queries).is_empty() {
            eprintln!("tpch: loci-engine runs none of these queries; it is left out");
        } else {
            engines.push("loci".into());
        }
    }
    let reps = a.common.reps.unwrap_or(if a.common.quick { 1 } else { 3 });
    let topo = crate::this_machine()?;
    // The Python peers (and their Parquet data) only when an engine other than loci runs.
    let paths = match engines.iter().any(|e| e != "loci") {
        true => Some(Paths::setup()?),
        false => None,
    };
    let run = RunSpec {
        data: match &paths {
            Some(p) => data::ensure(&sf, &p.tpchgen)?,
            None => PathBuf::new(),
        },
        sf,
        queries,
        warm: a.warm,
        cpus: topo.allowed_cpus().len().max(1),
        reload: a.reload,
    };
    let mut rep = Report::new(
        "tpch",
        serde_json::json!({
            "sf": run.sf, "engines": engines, "queries": run.queries, "reps": reps,
            "warm": run.warm, "engine_threads": run.cpus,
            "answers_tolerance": answers::TOLERANCE_TEXT,
        }),
        Machine::of(&topo),
    );
    // The default brackets every round when it is compared with other configurations.
    let bracket = !a.no_default && cfgs.len() > 1;
    let scratch = tempfile::Builder::new().prefix("loci-tpch-").tempdir()?;
    let mut check = answers::Check::default();
    for name in &engines {
        // The configurations this engine can apply (loci-engine: not --alloc or --thp).
        let runs: Vec<usize> = (0..cfgs.len())
            .filter(|&i| applies(name, &cfgs[i]))
            .collect();
        if runs.len() < cfgs.len() {
            let left: Vec<String> = (0..cfgs.len())
                .filter(|i| !runs.contains(i))
                .map(|i| label(&cfgs[i]))
                .collect();
            eprintln!(
                "tpch {name}: left out {} (loci-engine runs in this process, so --alloc and --thp \
                 cannot apply to it; run `loci run --alloc A --thp T -- loci bench tpch --engines loci` for them)",
                left.join(", ")
            );
            rep.params[format!("{name}_left_out")] = left.into();
        }
        if runs.is_empty() {
            continue;
        }
        let engine = Engine::prepare(name, paths.as_ref(), &run)?;
        // sessions[config]: each session's round and query times; facts of each config's last
        // session.
        let mut sessions: Vec<Vec<(usize, BTreeMap<u32, f64>)>> = vec![Vec::new(); cfgs.len()];
        let mut facts = vec![serde_json::Value::Null; cfgs.len()];
        let bracket = bracket && runs[0] == 0 && runs.len() > 1;
        for round in 0..reps {
            for (k, end) in round_order(runs.len(), round, bracket) {
                let i = runs[k];
                // Answers from each configuration's first session (the default's bracket start).
                let ans = sessions[i]
                    .is_empty()
                    .then(|| scratch.path().join(format!("{name}-{i}.json")));
                eprintln!(
                    "tpch {name} round {}/{reps}: {}{}",
                    round + 1,
                    label(&cfgs[i]),
                    end.map(|e| format!(" (default, bracket {e})"))
                        .unwrap_or_default()
                );
                let s = engine.session(paths.as_ref(), &run, &cfgs[i], ans.as_deref())?;
                if let Some(p) = &ans {
                    let who = format!("{name} {}", label(&cfgs[i]));
                    match &engine {
                        Engine::Loci(_) => check.add_subset(&who, p)?,
                        _ => check.add(&who, p)?,
                    }
                }
                sessions[i].push((round, s.times));
                facts[i] = s.facts;
            }
        }
        if let Engine::Postgres(c) = &engine {
            rep.params["postgres_user"] = c.user().unwrap_or("(this user)").into();
        }
        for &i in &runs {
            push_rows(&mut rep, name, &cfgs[i], &sessions[i], &facts[i]);
        }
    }
    rep.params["answers"] = check.summary().into();
    if run.sf == "1" {
        let line = check.against_dbgen()?;
        eprintln!("tpch: {line}");
        rep.params["answers_dbgen"] = line.into();
    }
    Ok(rep)
}

/// The sessions of one round: each configuration's index, and for the default's bracketing
/// sessions which end of the round it is. Bracketed (`cfgs[0]` the default, more than one
/// configuration): the default first and last, the others between in an order rotated by the
/// round, and each of their times is paired with the mean of the default's two, so drift within
/// the round cancels on average. Otherwise every configuration once, rotated by the round, so
/// drift (page cache, heat) spreads over the configurations.
fn round_order(n: usize, round: usize, bracket: bool) -> Vec<(usize, Option<&'static str>)> {
    if !bracket || n < 2 {
        return (0..n).map(|k| ((k + round) % n, None)).collect();
    }
    std::iter::once((0, Some("start")))
        .chain((0..n - 1).map(|k| (1 + (k + round) % (n - 1), None)))
        .chain(std::iter::once((0, Some("end"))))
        .collect()
}

/// Whether `engine` can run under configuration `c`: loci-engine runs in this process, where
/// only --threads and --mem apply.
fn applies(engine: &str, c: &Config) -> bool {
    engine != "loci" || (c.alloc == "glibc" && c.thp == "default")
}

fn label(c: &Config) -> String {
    format!("{}/{}/{}/{}", c.alloc, c.mem, c.thp, c.threads)
}

/// A saved result (`--summary`): read back, and checked to be one of this bench.
fn saved(p: &Path) -> anyhow::Result<Report> {
    let text = std::fs::read_to_string(p)
        .with_context(|| format!("--summary {}: cannot read it", p.display()))?;
    let rep: Report = serde_json::from_str(&text).with_context(|| {
        format!(
            "--summary {}: not a loci bench result (the JSON that `loci bench tpch --json` writes)",
            p.display()
        )
    })?;
    if rep.workload != "tpch" {
        bail!(
            "--summary {}: a result of `loci bench {}`, not of tpch; give a file that \
             `loci bench tpch --json` wrote",
            p.display(),
            rep.workload
        );
    }
    Ok(rep)
}

/// Rows of one engine and configuration from its sessions (each with its round): one per query
/// (case `ENGINE qNN`) and the geometric mean over the queries (case `ENGINE geomean`, one value
/// per session that ran every query). Each row names the round of each of its times
/// (`extra.rounds`): the search pairs a configuration's time with the default's of the same
/// round, the mean of the default's two where it bracketed the round (its rounds listed twice).
fn push_rows(
    rep: &mut Report,
    engine: &str,
    cfg: &Config,
    sessions: &[(usize, BTreeMap<u32, f64>)],
    facts: &serde_json::Value,
) {
    let honoured = allocator_honoured(&cfg.alloc, facts);
    let with_facts = |row: Row| {
        cfg.row(row)
            .extra("version", facts["version"].clone())
            .extra("maps_allocators", facts["maps_allocators"].clone())
            .extra("own_allocator", facts["own_allocator"].clone())
            .extra("cpus_allowed", facts["cpus_allowed"].clone())
            .extra("thp_enabled", facts["thp_enabled"].clone())
            .extra("allocator_preloaded", honoured)
    };
    let mut rows = |case: String, s: &Samples| {
        rep.results.push(with_facts(
            Row::from_times(engine, s.values.clone())
                .case(&case)
                .extra("rounds", &s.passes),
        ))
    };
    let mut times: BTreeMap<u32, Samples> = BTreeMap::new();
    for (round, t) in sessions {
        for (&q, &v) in t {
            times.entry(q).or_default().push(*round, v);
        }
    }
    for (q, s) in &times {
        rows(format!("{engine} q{q:02}"), s);
    }
    let mut geo = Samples::default();
    for (round, t) in sessions {
        let each: Option<Vec<f64>> = times.keys().map(|q| t.get(q).copied()).collect();
        if let Some(each) = each {
            geo.push(*round, geomean(each.into_iter()));
        }
    }
    if geo.runs() > 0 {
        rows(format!("{engine} geomean"), &geo);
    }
}

/// Whether the allocator asked for is mapped into the engine process (glibc: always).
fn allocator_honoured(alloc: &str, facts: &serde_json::Value) -> bool {
    let lib = match alloc {
        "glibc" => return true,
        "loci" => "loci_malloc",
        a => a,
    };
    facts["maps_allocators"].as_array().is_some_and(|v| {
        v.iter()
            .any(|x| x.as_str().is_some_and(|s| s.contains(lib)))
    })
}

fn geomean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x.max(1e-9).ln(), n + 1));
    (s / n.max(1) as f64).exp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: TpchArgs,
    }

    fn args(s: &str) -> TpchArgs {
        Cli::parse_from(std::iter::once("tpch").chain(s.split_whitespace())).a
    }

    #[test]
    fn loci_engine_runs_only_the_configurations_it_can_apply() {
        let c = configs(&args(
            "--alloc jemalloc,glibc --thp off,default --mem interleave",
        ))
        .unwrap();
        let loci: Vec<String> = c.iter().filter(|x| applies("loci", x)).map(label).collect();
        assert_eq!(
            loci,
            [
                "glibc/first-touch/default/os",
                "glibc/interleave/default/os"
            ]
        );
        assert!(c.iter().all(|x| applies("duckdb", x)));
    }

    #[test]
    fn the_matrix_starts_with_the_default_and_has_each_combination_once() {
        let c = configs(&args("--alloc jemalloc,glibc --thp off,default")).unwrap();
        assert_eq!(c[0], Config::default_config());
        assert_eq!(c.len(), 4);
        assert!(c.iter().any(|x| x.alloc == "jemalloc" && x.thp == "off"));
        assert!(baseline(&c[0].row(Row::default())));
        assert!(!baseline(&c[1].row(Row::default())));
        let argv = c[1].loci_run().unwrap();
        let s: Vec<String> = argv[1..]
            .iter()
            .map(|x| x.to_string_lossy().into())
            .collect();
        assert_eq!(s[0], "run");
        assert_eq!(s.last().map(String::as_str), Some("--"));
        assert!(configs(&args("--mem nowhere")).is_err());
        // --no-default: exactly the listed combinations.
        let c = configs(&args("--alloc jemalloc --no-default")).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].alloc, "jemalloc");
    }

    #[test]
    fn the_default_brackets_each_round_and_the_others_rotate_between() {
        let idx = |v: Vec<(usize, Option<&str>)>| v.into_iter().map(|x| x.0).collect::<Vec<_>>();
        let r1 = round_order(4, 1, true);
        assert_eq!(r1[0], (0, Some("start")));
        assert_eq!(r1[4], (0, Some("end")));
        assert_eq!(idx(r1), vec![0, 2, 3, 1, 0]);
        // Over three rounds each other configuration runs once at each place in between.
        for k in 1..4 {
            let mut at: Vec<usize> = (0..3).map(|r| idx(round_order(4, r, true))[k]).collect();
            at.sort_unstable();
            assert_eq!(at, vec![1, 2, 3], "place {k}");
        }
        // Unbracketed (--no-default, or one configuration): each once, rotated, as before.
        assert_eq!(idx(round_order(3, 1, false)), vec![1, 2, 0]);
        assert_eq!(round_order(1, 2, true), vec![(0, None)]);
    }

    #[test]
    fn loci_engine_queries_are_checked_before_anything_starts() {
        let e = run(args("--engines loci --queries 1,2"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[1, 3, 5, 6, 18]") && e.contains("[2]"), "{e}");
        let e = run(args("--engines loci,mysql")).unwrap_err().to_string();
        assert!(e.contains("mysql") && e.contains("loci"), "{e}");
        assert_eq!(loci::supported(&[22, 18, 6]), vec![18, 6]);
    }

    #[test]
    fn summary_reads_back_a_saved_result_and_refuses_another_bench() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        let mut rep = Report::new("tpch", serde_json::json!({}), Machine::default());
        rep.write_json(&p).unwrap();
        assert_eq!(
            run(args(&format!("--summary {}", p.display()))).unwrap(),
            rep
        );
        rep.workload = "w1".into();
        rep.write_json(&p).unwrap();
        let e = format!("{:#}", saved(&p).unwrap_err());
        assert!(e.contains("`loci bench w1`, not of tpch"), "{e}");
        std::fs::write(&p, "{\"rows\": 1}").unwrap();
        let e = format!("{:#}", saved(&p).unwrap_err());
        assert!(
            e.contains("not a loci bench result") && e.contains("r.json"),
            "{e}"
        );
        let e = format!("{:#}", saved(&dir.path().join("none.json")).unwrap_err());
        assert!(e.contains("none.json: cannot read it"), "{e}");
        // A saved result is read, not combined with the flags of a run.
        let e = Cli::try_parse_from(["tpch", "--summary", "r.json", "--sf", "1"]);
        assert!(e.is_err());
        <Cli as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn queries_and_geomean() {
        assert_eq!(parse_queries("all").unwrap().len(), 22);
        assert_eq!(parse_queries("1,5,18").unwrap(), vec![1, 5, 18]);
        assert!(parse_queries("0").is_err() && parse_queries("x").is_err());
        assert!((geomean([1.0, 4.0].into_iter()) - 2.0).abs() < 1e-12);
        assert!(allocator_honoured("glibc", &serde_json::Value::Null));
        let facts = serde_json::json!({"maps_allocators": ["libjemalloc.so.2"]});
        assert!(allocator_honoured("jemalloc", &facts));
        assert!(!allocator_honoured("mimalloc", &facts));
    }
}
