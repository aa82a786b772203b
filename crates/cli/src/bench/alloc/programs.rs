//! `loci bench alloc --programs`: real programs under every allocator.
//!
//! Programs (sources in bench/alloc/):
//! - `sqlite3`: the sqlite3 shell on an in-memory database, `bench/alloc/workload.sql` with
//!   `@n` rows (page cache, sorter and statements on malloc);
//! - `python3`: `bench/alloc/alloc_heavy.py N` (dicts, strings, JSON, 1 KiB..256 KiB buffers);
//! - `cxx`: `bench/alloc/prodcons.cpp`, compiled here with `g++ -O2 -pthread`: producers
//!   allocate messages, consumers free them (every free crosses threads);
//! - `duckdb-tpch`: the 22 TPC-H queries on DuckDB through `bench/tpch/tpch.py` in the venv of
//!   `bench/peers/setup --tpch`.
//!
//! Each program runs as a child with the allocator's library in `LD_PRELOAD` (glibc: none),
//! reps x allocators in an order rotated by one per rep (as the synthetic cases). A run is timed
//! from spawn to exit; its peak RSS is `ru_maxrss` of `wait4(2)`, which covers the child and
//! the descendants it waited for. The output (the answers file for DuckDB) is reduced to a
//! digest that must be the same under every allocator: a crash or a different answer is
//! reported and not timed. Whether the program really runs on the preloaded malloc is checked
//! once per program and allocator by the dynamic linker's own account (`LD_DEBUG=bindings`:
//! which object each `malloc` reference binds to); an engine that links an allocator of its
//! own (DuckDB's module carries jemalloc) says so in its facts, and the report prints both.
//!
//! PostgreSQL is not among the programs: its memory is spread over backends the postmaster
//! forks and reaps itself, and the cluster must be created and loaded first; `loci bench tpch
//! --engines postgres --alloc ...` compares allocators on it.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use loci_report::{median, Machine, Report, Row};

use super::{choose_allocators, AllocArgs};
use crate::bench::common::{bench_dir, peers_dir, Allocator};

/// The programs `--program` accepts, in the order they run.
pub const PROGRAMS: [&str; 4] = ["sqlite3", "python3", "cxx", "duckdb-tpch"];

/// Goals of the issue: loci within 1.05x of the best allocator's time, peak RSS within 1.2x of
/// the lowest.
const TIME_GOAL: f64 = 1.05;
const RSS_GOAL: f64 = 1.2;

/// The TPC-H scale factors duckdb-tpch takes.
const SCALES: [&str; 3] = ["0.01", "0.1", "1"];

/// Whether `rep` is a `--programs` report.
pub fn is_programs(rep: &Report) -> bool {
    rep.params.get("programs").is_some()
}

/// One program ready to run: its command line, its stdin, how its output becomes a digest.
struct Prepared {
    name: &'static str,
    argv: Vec<OsString>,
    stdin: Vec<u8>,
    env: Vec<(&'static str, String)>,
    /// The program writes its answers here (`{}` in an argument is replaced by a fresh path
    /// per run); the digest is of this file instead of stdout.
    answers: bool,
    /// A short run of the same binary for the preload check.
    probe: Vec<OsString>,
    /// What the fixed work is, for the report.
    work: String,
}

/// The repository's bench/alloc (see [`bench_dir`]).
fn alloc_dir() -> anyhow::Result<PathBuf> {
    bench_dir("alloc", "prodcons.cpp")
        .context("bench/alloc/prodcons.cpp not found (run loci from the repository root)")
}

/// The path of `prog` on PATH, if any.
fn which(prog: &str) -> Option<PathBuf> {
    crate::run_cmd::resolve(&prog.into())
}

/// `tool` on PATH, or the note that it is absent and the Debian package of the same name has it.
fn debian_tool(tool: &str) -> Result<PathBuf, String> {
    which(tool).ok_or_else(|| {
        format!("{tool} not found; install the Debian package {tool} (scripts/install-deps)")
    })
}

/// `bench/alloc/prodcons.cpp` compiled with `g++ -O2 -pthread` into `dir` (again only when the
/// source is newer than the binary).
fn compile_cxx(src: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let bin = dir.join("prodcons");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if bin.exists() && mtime(&bin) >= mtime(src) {
        return Ok(bin);
    }
    let gxx = which("g++").context(
        "g++ not found: the cxx program is compiled from bench/alloc/prodcons.cpp with g++ -O2 -pthread; \
         install it (Debian package g++) or leave the program out (--program sqlite3,python3,duckdb-tpch)",
    )?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join("prodcons.tmp");
    let out = Command::new(&gxx)
        .args(["-O2", "-pthread", "-o"])
        .arg(&tmp)
        .arg(src)
        .output()
        .with_context(|| format!("running {}", gxx.display()))?;
    if !out.status.success() {
        bail!(
            "g++ -O2 -pthread {} failed ({}): {}",
            src.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::rename(&tmp, &bin).with_context(|| format!("renaming to {}", bin.display()))?;
    Ok(bin)
}

/// Prepares `name`, or says why it cannot run here (`Ok(Err(note))`: a tool is absent).
fn prepare(
    name: &str,
    quick: bool,
    threads: usize,
    sf: &str,
    build_dir: &Path,
) -> anyhow::Result<Result<Prepared, String>> {
    let dir = alloc_dir()?;
    let os = |s: &str| OsString::from(s);
    match name {
        "sqlite3" => {
            let bin = match debian_tool("sqlite3") {
                Ok(bin) => bin,
                Err(note) => return Ok(Err(note)),
            };
            let rows = if quick { 20_000 } else { 200_000 };
            let sql = std::fs::read(dir.join("workload.sql")).context("reading workload.sql")?;
            let mut stdin = format!(".parameter set @n {rows}\n").into_bytes();
            stdin.extend(sql);
            Ok(Ok(Prepared {
                name: "sqlite3",
                argv: vec![bin.clone().into(), os(":memory:")],
                stdin,
                env: vec![],
                answers: false,
                probe: vec![bin.into(), os(":memory:"), os("select 1")],
                work: format!("bench/alloc/workload.sql, {rows} rows, in-memory database"),
            }))
        }
        "python3" => {
            let bin = match debian_tool("python3") {
                Ok(bin) => bin,
                Err(note) => return Ok(Err(note)),
            };
            let rounds = if quick { 8 } else { 60 };
            Ok(Ok(Prepared {
                name: "python3",
                argv: vec![
                    bin.clone().into(),
                    dir.join("alloc_heavy.py").into(),
                    os(&rounds.to_string()),
                ],
                stdin: vec![],
                env: vec![
                    ("PYTHONHASHSEED", "0".into()),
                    ("PYTHONDONTWRITEBYTECODE", "1".into()),
                ],
                answers: false,
                probe: vec![bin.into(), os("-c"), os("pass")],
                work: format!(
                    "bench/alloc/alloc_heavy.py {rounds} (default pymalloc for objects <= 512 B)"
                ),
            }))
        }
        "cxx" => {
            let bin = compile_cxx(&dir.join("prodcons.cpp"), build_dir)?;
            let pairs = (threads / 2).max(1);
            let total: usize = if quick { 200_000 } else { 2_000_000 };
            let per = total / pairs;
            let args = |n: usize| {
                vec![
                    bin.clone().into(),
                    os(&pairs.to_string()),
                    os(&pairs.to_string()),
                    os(&n.to_string()),
                ]
            };
            Ok(Ok(Prepared {
                name: "cxx",
                argv: args(per),
                stdin: vec![],
                env: vec![],
                answers: false,
                probe: args(10),
                work: format!(
                    "bench/alloc/prodcons.cpp: {pairs} producers, {pairs} consumers, {per} messages each"
                ),
            }))
        }
        "duckdb-tpch" => {
            let Some(peers) = peers_dir("../tpch/tpch.py") else {
                return Ok(Err("bench/tpch/tpch.py not found".into()));
            };
            let bin = peers.join(".venv/bin");
            let python = bin.join("python");
            let has_duckdb = python.exists()
                && Command::new(&python)
                    .args(["-c", "import duckdb"])
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            if !has_duckdb {
                return Ok(Err(format!(
                    "{} cannot import duckdb; create it with bench/peers/setup --tpch",
                    python.display()
                )));
            }
            let tpchgen = bin.join("tpchgen-cli");
            if !tpchgen.exists() {
                return Ok(Err(format!(
                    "{} not found; install it with bench/peers/setup --tpch",
                    tpchgen.display()
                )));
            }
            let data = super::super::tpch::data::ensure(sf, &tpchgen)?;
            let tpch = peers
                .parent()
                .expect("bench/peers has a parent")
                .join("tpch");
            let mut argv: Vec<OsString> = vec![python.clone().into(), tpch.join("tpch.py").into()];
            for a in ["duckdb", "--data"] {
                argv.push(os(a));
            }
            argv.push(data.into());
            argv.push(os("--queries"));
            argv.push(tpch.join("queries").into());
            for a in [
                "--sf",
                sf,
                "--warm",
                "0",
                "--threads",
                &threads.to_string(),
                "--answers",
                "{}",
            ] {
                argv.push(os(a));
            }
            Ok(Ok(Prepared {
                name: "duckdb-tpch",
                argv,
                stdin: vec![],
                env: vec![],
                answers: true,
                probe: vec![
                    python.into(),
                    os("-c"),
                    os("import duckdb; duckdb.connect().execute('select 1').fetchall()"),
                ],
                work: format!(
                    "bench/tpch/tpch.py duckdb: TPC-H sf {sf}, tables loaded from Parquet, 22 queries once, {threads} threads"
                ),
            }))
        }
        other => bail!("--program {other}: unknown; valid: {}", PROGRAMS.join(", ")),
    }
}

/// One run's outcome.
struct Outcome {
    seconds: f64,
    cpu_s: f64,
    max_rss: u64,
    digest: String,
    /// The output's first line (or the answers' first query), for the report.
    first_line: String,
    /// The JSON facts line the program printed, if any (duckdb-tpch).
    facts: Option<serde_json::Value>,
}

/// A digest of `bytes`: the first 16 hex digits of their BLAKE3 hash.
fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex()[..16].to_string()
}

/// The answers file of tpch.py reduced to text whose floats keep 6 significant digits (DuckDB's
/// parallel sums may differ in the last bits from run to run), then digested.
fn answers_digest(path: &Path) -> anyhow::Result<(String, String)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    fn norm(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Number(n) if n.is_f64() => {
                out.push_str(&format!("{:.5e}", n.as_f64().unwrap_or(0.0)))
            }
            serde_json::Value::Array(a) => {
                out.push('[');
                for x in a {
                    norm(x, out);
                    out.push(',');
                }
                out.push(']');
            }
            serde_json::Value::Object(o) => {
                for (k, x) in o {
                    out.push_str(k);
                    out.push(':');
                    norm(x, out);
                    out.push('\n');
                }
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut s = String::new();
    norm(&v, &mut s);
    let queries = v.as_object().map_or(0, |o| o.len());
    Ok((digest(s.as_bytes()), format!("{queries} queries answered")))
}

/// Runs `p` once with `preload` (and the allocator's environment); `Err` describes a failure
/// (start, crash, exit status) with the end of its stderr.
fn run_once(
    p: &Prepared,
    al: &Allocator,
    preload: Option<&Path>,
    scratch: &Path,
    run_id: usize,
) -> Result<Outcome, String> {
    let answers = scratch.join(format!("answers-{run_id}.json"));
    let argv: Vec<OsString> = p
        .argv
        .iter()
        .map(|a| {
            if a == "{}" {
                answers.clone().into_os_string()
            } else {
                a.clone()
            }
        })
        .collect();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    allocator_env(&mut cmd, al, preload);
    for (k, v) in &p.env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", argv[0]))?;
    let pid = child.id() as libc::pid_t;
    let mut stdin = child.stdin.take().expect("piped");
    let input = p.stdin.clone();
    let writer = std::thread::spawn(move || {
        // A program that exits early closes the pipe: that shows as its exit status.
        let _ = stdin.write_all(&input);
    });
    let mut err_pipe = child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err_pipe.read_to_end(&mut v);
        v
    });
    let mut out = Vec::new();
    let _ = child.stdout.take().expect("piped").read_to_end(&mut out);
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child, not yet waited for (std's Child is never waited on after this:
    // it does not reap on drop); status and ru are valid pointers.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let seconds = t0.elapsed().as_secs_f64();
    let _ = writer.join();
    let err = err_reader.join().unwrap_or_default();
    let tail = || {
        let s = String::from_utf8_lossy(&err);
        let s = s.trim_end();
        s[s.len().saturating_sub(600)..].to_string()
    };
    if r != pid {
        return Err(format!("wait4 failed: {}", std::io::Error::last_os_error()));
    }
    if libc::WIFSIGNALED(status) {
        return Err(format!(
            "crashed: killed by signal {}: {}",
            libc::WTERMSIG(status),
            tail()
        ));
    }
    if libc::WEXITSTATUS(status) != 0 {
        return Err(format!(
            "failed: exit status {}: {}",
            libc::WEXITSTATUS(status),
            tail()
        ));
    }
    let text = String::from_utf8_lossy(&out);
    let facts = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("own_allocator").is_some());
    let (digest, first_line) = if p.answers {
        let d = answers_digest(&answers).map_err(|e| format!("{e:#}"))?;
        let _ = std::fs::remove_file(&answers);
        d
    } else {
        (
            digest(&out),
            text.lines().next().unwrap_or("").chars().take(80).collect(),
        )
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Outcome {
        seconds,
        cpu_s: tv(ru.ru_utime) + tv(ru.ru_stime),
        max_rss: ru.ru_maxrss as u64 * 1024,
        digest,
        first_line,
        facts,
    })
}

/// The environment of a child on allocator `al`: LD_PRELOAD of its library (none for glibc),
/// its own variables, nothing inherited that would change the allocator.
fn allocator_env(cmd: &mut Command, al: &Allocator, preload: Option<&Path>) {
    cmd.env_remove("LD_PRELOAD").env_remove("LOCI_ALLOC_SMALL");
    if let Some(l) = preload {
        cmd.env("LD_PRELOAD", l);
    }
    for (k, v) in al.env {
        cmd.env(k, v);
    }
}

/// Which objects the `malloc` references of `p` bind to under `preload`, by the dynamic linker's
/// account (`LD_DEBUG=bindings` of the probe run): the file names, sorted.
fn malloc_bindings(
    p: &Prepared,
    al: &Allocator,
    preload: Option<&Path>,
    scratch: &Path,
) -> anyhow::Result<BTreeSet<String>> {
    let dir = tempfile::Builder::new()
        .prefix("ld-debug-")
        .tempdir_in(scratch)?;
    let mut cmd = Command::new(&p.probe[0]);
    cmd.args(&p.probe[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    allocator_env(&mut cmd, al, preload);
    cmd.env("LD_DEBUG", "bindings")
        .env("LD_DEBUG_OUTPUT", dir.path().join("ld"));
    let st = cmd
        .status()
        .with_context(|| format!("running {:?}", p.probe))?;
    if !st.success() {
        bail!("the probe run {:?} failed ({st})", p.probe);
    }
    let mut found = BTreeSet::new();
    for e in std::fs::read_dir(dir.path())? {
        let text = std::fs::read_to_string(e?.path()).unwrap_or_default();
        for line in text
            .lines()
            .filter(|l| l.contains("normal symbol `malloc'"))
        {
            // "PID: binding file A [0] to B [0]: normal symbol `malloc' [GLIBC_2.2.5]"
            if let Some(to) = line.split(" to ").nth(1) {
                let obj = to.split(" [").next().unwrap_or("").trim();
                found.insert(obj.rsplit('/').next().unwrap_or(obj).to_string());
            }
        }
    }
    Ok(found)
}

/// Whether the bindings show the allocator in charge: every `malloc` reference bound to the
/// preloaded library (glibc: to libc).
fn honoured(bindings: &BTreeSet<String>, preload: Option<&Path>) -> bool {
    let want = match preload {
        Some(l) => l
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        None => "libc.so".to_string(),
    };
    !bindings.is_empty() && bindings.iter().all(|b| b.starts_with(&want))
}

/// A program's results under one allocator.
#[derive(Default)]
struct Cell {
    outcomes: Vec<Outcome>,
    failure: Option<String>,
}

pub fn run(a: &AllocArgs, threads: usize) -> anyhow::Result<Report> {
    let quick = a.common.quick;
    let sf =
        a.sf.clone()
            .unwrap_or(if quick { "0.01" } else { "0.1" }.into());
    if !SCALES.contains(&sf.as_str()) {
        bail!("--sf {sf}: not a scale factor of duckdb-tpch; valid: {SCALES:?}");
    }
    for p in &a.program {
        if !PROGRAMS.contains(&p.as_str()) {
            bail!("--program {p}: unknown; valid: {}", PROGRAMS.join(", "));
        }
    }
    let reps = a.common.reps_or(3, 5);
    let (exe, chosen) = choose_allocators(a)?;
    anyhow::ensure!(!chosen.is_empty(), "no allocator of --peers can run here");
    let build_dir = exe
        .parent()
        .context("the loci executable has no directory")?
        .join("bench-alloc");
    let scratch = tempfile::Builder::new()
        .prefix("loci-alloc-programs-")
        .tempdir()?;

    let mut prepared = Vec::new();
    let mut skipped = serde_json::Map::new();
    for name in PROGRAMS
        .iter()
        .filter(|p| a.program.iter().any(|x| x == *p))
    {
        match prepare(name, quick, threads, &sf, &build_dir)? {
            Ok(p) => prepared.push(p),
            Err(note) => {
                eprintln!("alloc: program {name} skipped: {note}");
                skipped.insert(name.to_string(), note.into());
            }
        }
    }

    let topo = crate::this_machine()?;
    let mut rep = Report::new(
        "alloc",
        serde_json::json!({
            "programs": prepared.iter().map(|p| (p.name, p.work.clone())).collect::<BTreeMap<_, _>>(),
            "skipped": skipped,
            "reps": reps, "threads": threads, "tpch_sf": sf,
            "time": "wall time from spawn to exit, median over reps",
            "rss": "peak RSS of the program (ru_maxrss of wait4: the child and the descendants it waited for), worst rep",
            "order": "each rep runs every allocator once, rotated by one per rep",
            "goals": format!("loci <= {TIME_GOAL}x the best allocator's time, peak RSS <= {RSS_GOAL}x the lowest"),
        }),
        Machine::of(&topo),
    );
    let mut failures = serde_json::Map::new();
    let mut run_id = 0;
    for p in &prepared {
        // Preload check first (untimed): which object malloc binds to under each allocator.
        let mut bindings = Vec::new();
        for (al, lib) in &chosen {
            let b = malloc_bindings(p, al, lib.as_deref(), scratch.path())
                .map_err(|e| format!("{e:#}"));
            bindings.push(b);
        }
        let mut cells: Vec<Cell> = (0..chosen.len()).map(|_| Cell::default()).collect();
        for r in 0..reps {
            for k in 0..chosen.len() {
                let i = (k + r) % chosen.len();
                let (al, lib) = &chosen[i];
                if cells[i].failure.is_some() {
                    continue;
                }
                eprint!("alloc: {} {} rep {}/{reps} ... ", p.name, al.name, r + 1);
                std::io::stderr().flush().ok();
                run_id += 1;
                match run_once(p, al, lib.as_deref(), scratch.path(), run_id) {
                    Ok(o) => {
                        eprintln!(
                            "{:.3} s, peak RSS {:.1} MiB",
                            o.seconds,
                            o.max_rss as f64 / 1048576.0
                        );
                        cells[i].outcomes.push(o);
                    }
                    Err(e) => {
                        eprintln!("FAILED");
                        eprintln!("alloc: {} on {}: {e}", p.name, al.name);
                        cells[i].failure = Some(e);
                    }
                }
            }
        }
        // The reference answer: glibc's when it ran, else the most common.
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for c in &cells {
            for o in &c.outcomes {
                *counts.entry(&o.digest).or_default() += 1;
            }
        }
        let reference = chosen
            .iter()
            .zip(&cells)
            .find(|((al, _), c)| al.name == "glibc" && !c.outcomes.is_empty())
            .map(|(_, c)| c.outcomes[0].digest.clone())
            .or_else(|| {
                counts
                    .iter()
                    .max_by_key(|(_, n)| **n)
                    .map(|(d, _)| d.to_string())
            })
            .unwrap_or_default();
        for (((al, lib), cell), binding) in chosen.iter().zip(cells).zip(bindings) {
            if let Some(e) = cell.failure {
                failures.insert(format!("{} {}", p.name, al.name), e.into());
                continue;
            }
            let wrong: Vec<&str> = cell
                .outcomes
                .iter()
                .map(|o| o.digest.as_str())
                .filter(|d| *d != reference)
                .collect();
            if !wrong.is_empty() {
                let e = format!(
                    "wrong output: digest {} where the reference is {reference}",
                    wrong[0]
                );
                eprintln!("alloc: {} on {}: {e}", p.name, al.name);
                failures.insert(format!("{} {}", p.name, al.name), e.into());
                continue;
            }
            let times: Vec<f64> = cell.outcomes.iter().map(|o| o.seconds).collect();
            let rss: Vec<f64> = cell.outcomes.iter().map(|o| o.max_rss as f64).collect();
            let cpus: Vec<f64> = cell.outcomes.iter().map(|o| o.cpu_s).collect();
            let last = cell
                .outcomes
                .last()
                .expect("a cell without failure has outcomes");
            let facts = last.facts.clone();
            let mut row = Row::from_times(al.name, times)
                .case(p.name)
                .config("threads", threads)
                .extra("digest", &last.digest)
                .extra("output", &last.first_line)
                .extra("cpu_s_median", median(&cpus).unwrap_or(0.0))
                .extra("rss_median_bytes", median(&rss).unwrap_or(0.0) as u64);
            match &binding {
                Ok(b) => {
                    row = row
                        .extra("malloc_binds_to", b.iter().collect::<Vec<_>>())
                        .extra("preload_honoured", honoured(b, lib.as_deref()));
                }
                Err(e) => row = row.extra("preload_check_failed", e),
            }
            if let Some(f) = &facts {
                row = row
                    .extra("own_allocator", f["own_allocator"].clone())
                    .extra("maps_allocators", f["maps_allocators"].clone())
                    .extra("version", f["version"].clone());
            }
            if let Some(l) = lib {
                row = row.extra("library", l.display().to_string());
            }
            row.rss_bytes = cell.outcomes.iter().map(|o| o.max_rss).max();
            rep.results.push(row);
        }
    }
    rep.params["failures"] = failures.into();
    Ok(rep)
}

/// The fastest row of each program (the ratios' baseline).
pub fn best_rows(rep: &Report) -> impl Iterator<Item = &Row> + '_ {
    let cases: BTreeSet<&str> = rep
        .results
        .iter()
        .filter_map(|r| r.case.as_deref())
        .collect();
    cases.into_iter().filter_map(|c| {
        rep.rows_of(Some(c))
            .min_by(|a, b| a.median_s.total_cmp(&b.median_s))
    })
}

/// Lines after the table: per program, loci's time against the best allocator's and its peak
/// RSS against the lowest (with the goals), whether each allocator was really in the process,
/// and every failure.
pub fn goals(rep: &Report) -> String {
    let mut out = String::new();
    let mib = |b: u64| b as f64 / 1048576.0;
    for best in best_rows(rep) {
        let case = best.case.as_deref().unwrap_or("");
        let rows: Vec<&Row> = rep.rows_of(Some(case)).collect();
        let lowest = rows
            .iter()
            .filter_map(|r| r.rss_bytes.map(|b| (b, r.system.as_str())))
            .min();
        if let (Some(loci), Some((low, low_sys))) =
            (rows.iter().find(|r| r.system == "loci"), lowest)
        {
            let t = loci.median_s / best.median_s;
            let m = loci.rss_bytes.unwrap_or(0) as f64 / low.max(1) as f64;
            out += &format!(
                "{case}: loci time {t:.3}x the best ({} {:.3} s; goal <= {TIME_GOAL}x): {}; peak RSS {m:.2}x the lowest ({low_sys} {:.1} MiB; goal <= {RSS_GOAL}x): {}\n",
                best.system,
                best.median_s,
                if t <= TIME_GOAL { "met" } else { "NOT met" },
                mib(low),
                if m <= RSS_GOAL { "met" } else { "NOT met" },
            );
            // CPU seconds are less sensitive to the host's load than wall time.
            let cpu = |r: &Row| r.extra.get("cpu_s_median").and_then(|v| v.as_f64());
            let lowest_cpu = rows
                .iter()
                .filter_map(|r| cpu(r).map(|c| (c, r.system.as_str())))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if let (Some(l), Some((c, sys))) = (cpu(loci), lowest_cpu) {
                out += &format!(
                    "{case} CPU seconds (median): loci {l:.2}, lowest {sys} {c:.2} ({:.3}x)\n",
                    l / c.max(1e-9)
                );
            }
        } else {
            out += &format!("{case}: no loci row (loci not run or failed)\n");
        }
        let not_in: Vec<&str> = rows
            .iter()
            .filter(|r| r.extra.get("preload_honoured") == Some(&serde_json::Value::Bool(false)))
            .map(|r| r.system.as_str())
            .collect();
        let own = rows
            .iter()
            .find_map(|r| r.extra.get("own_allocator").and_then(|v| v.as_str()));
        out += &format!(
            "{case} preload: {}{}\n",
            if not_in.is_empty() {
                "malloc binds to the preloaded library under every allocator".to_string()
            } else {
                format!("malloc does NOT bind to the preloaded library under {}", not_in.join(", "))
            },
            match own {
                Some(o) => format!(
                    "; the program links its own allocator ({o}): its engine's allocations bypass the preloaded malloc, which serves the rest of the process"
                ),
                None => String::new(),
            }
        );
        out += &format!(
            "{case} peak RSS MiB: {}\n",
            rows.iter()
                .map(|r| format!("{} {:.1}", r.system, mib(r.rss_bytes.unwrap_or(0))))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(s) = rep.params["skipped"].as_object() {
        for (k, v) in s {
            out += &format!("{k}: skipped: {}\n", v.as_str().unwrap_or(""));
        }
    }
    if let Some(f) = rep.params["failures"].as_object() {
        for (k, v) in f {
            out += &format!("FAILED {k}: {}\n", v.as_str().unwrap_or(""));
        }
    }
    out += "postgres: not run by --programs (its backends are forked and reaped by the server, and the cluster must be loaded first); loci bench tpch --engines postgres --alloc LIST compares allocators on it\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_decide_whether_the_preload_is_honoured() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let je = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
        assert!(honoured(&set(&["libjemalloc.so.2"]), Some(je)));
        assert!(!honoured(
            &set(&["libjemalloc.so.2", "libc.so.6"]),
            Some(je)
        ));
        assert!(!honoured(&set(&[]), Some(je)));
        assert!(honoured(&set(&["libc.so.6"]), None));
    }

    #[test]
    fn answers_digest_ignores_float_noise_but_not_values() {
        let dir = tempfile::tempdir().unwrap();
        let w = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            answers_digest(&p).unwrap().0
        };
        let a = w("a", r#"{"q01": [["A", 1234567.0000001, 3]]}"#);
        let b = w("b", r#"{"q01": [["A", 1234567.0000002, 3]]}"#);
        let c = w("c", r#"{"q01": [["A", 1234577.0, 3]]}"#);
        let d = w("d", r#"{"q01": [["B", 1234567.0000001, 3]]}"#);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }
}
