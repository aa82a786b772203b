//! `loci run`: run an unmodified program placed as a plan says, and optionally show plan vs
//! actual while it runs and at its exit.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use loci_place::apply::ChildSetup;
use loci_place::pinenv;
use loci_place::verify::{self, Comparison, MemoryBy, Sample, TaskSample};
use loci_place::{sys, MemPolicy, Plan, Strategy};
use serde::Serialize;

use crate::bench::common::{allocator, find_system_lib, system_lib_dirs, LOCI_CRATE, LOCI_LIB};
use crate::plan_cmd::{make_plan, MEM_HELP, THREADS_HELP};
use crate::topo_args::TopoArgs;

/// Run a program with its threads and memory placed on purpose, like numactl or likwid-pin
///
/// The memory policy and THP setting are applied in the child between fork and exec, so they hold
/// for every thread the program creates. For per-thread placement loci preloads its pin library
/// (libloci_pin.so, found next to the loci binary): the main thread is plan thread 0 and the k-th
/// thread the program creates with pthread_create is plan thread k (likwid-pin's technique).
/// Threads beyond the plan, and helpers named in --skip, run on all the plan's cpus.
///
/// Static binaries cannot be wrapped (LD_PRELOAD needs the dynamic linker): their threads all run
/// on the union of the plan's cpus; loci says so when it sees a static binary.
///
/// The program's exit status is passed through; if it is killed by signal N, loci exits 128+N.
///
/// --verify prints plan vs actual on stderr twice: once the program has as many threads as the
/// plan (or after --verify-wait seconds), and at exit. It reads /proc/PID/task/TID/status
/// (Cpus_allowed_list), /proc/PID/task/TID/stat (field 39, the last cpu), /proc/PID/numa_maps
/// (anonymous pages per node) and the pin library's log (which tid is which plan thread, and the
/// memory policy each thread saw). The exit report shows every thread seen during the run with
/// its last reading (polled every 20 ms, memory every 250 ms; no ptrace), and the memory the
/// program itself read as it exited (the pin library logs it at exit(3); after a kill or _exit,
/// the last poll). Remote share = share of anonymous pages not on the policy's nodes
/// (first-touch/localalloc: not on the threads' nodes).
///
/// Examples:
///   loci run --threads cpus:1 --mem bind:0 -- cat /proc/self/status
///   loci run --threads sparse -n 8 --mem interleave --verify -- ./my_omp_app
///   loci run --threads compact -n 4 --skip 0x1 -- ./app   # first created thread is a helper
///   loci run --alloc jemalloc --thp off -- ./server
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct RunCmd {
    #[arg(long, value_name = "STRATEGY", default_value = "os", long_help = THREADS_HELP)]
    pub threads: Strategy,
    /// Number of plan threads [default: every cpu the strategy may use]. When given, also sets
    /// OMP_NUM_THREADS for the program unless it is already set (an inherited value is kept; a
    /// note names it when it differs from N).
    #[arg(short = 'n', long = "nthreads", value_name = "N")]
    pub n: Option<usize>,
    #[arg(long, value_name = "POLICY", default_value = "first-touch", long_help = MEM_HELP)]
    pub mem: MemPolicy,
    /// Preload this malloc for the program (the Debian package's library): glibc (none),
    /// jemalloc (libjemalloc2), tcmalloc (libtcmalloc-minimal4), tbbmalloc (libtbbmalloc2),
    /// mimalloc (libmimalloc2.0), loci (libloci_malloc.so next to the loci binary).
    #[arg(long, value_enum, default_value_t = Alloc::Glibc)]
    pub alloc: Alloc,
    /// Transparent huge pages for this program: off = prctl(PR_SET_THP_DISABLE) in the child (no
    /// root needed); on = clear an inherited disable (the system setting still applies).
    #[arg(long, value_enum)]
    pub thp: Option<Thp>,
    /// Hex mask of created threads that are helpers and take no plan entry (bit j = the j-th
    /// pthread_create; 0x1 skips the first, e.g. the Intel OpenMP monitor thread), as likwid-pin -s.
    #[arg(long, value_name = "MASK")]
    pub skip: Option<String>,
    /// Allow more threads than cpus (threads then share cpus).
    #[arg(long)]
    pub oversubscribe: bool,
    /// Print plan vs actual (affinity, last cpu, policy, pages per node) once the threads have
    /// started and again at exit, on stderr.
    #[arg(long)]
    pub verify: bool,
    /// Also write both verify reports as JSON to FILE (implies --verify).
    #[arg(long, value_name = "FILE")]
    pub verify_json: Option<PathBuf>,
    /// Seconds --verify waits for the program to reach the plan's thread count (0 to 3600).
    #[arg(long, value_name = "SECS", default_value_t = 2.0, value_parser = parse_wait)]
    pub verify_wait: f64,
    #[command(flatten)]
    pub topo: TopoArgs,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// Allocators `--alloc` can preload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Alloc {
    Glibc,
    Jemalloc,
    Tcmalloc,
    Tbbmalloc,
    Mimalloc,
    /// loci's own NUMA-aware allocator (crate loci-alloc), `libloci_malloc.so` (crate
    /// loci-alloc-preload) next to `loci`.
    Loci,
}

impl Alloc {
    /// The library to preload (from the allocator table of `bench::common`), or an error naming
    /// the package or crate that provides it.
    pub fn library(self, exe_dir: &Path) -> anyhow::Result<Option<PathBuf>> {
        let name = self.name();
        if self == Alloc::Loci {
            let p = exe_dir.join(LOCI_LIB);
            if !p.exists() {
                bail!(
                    "--alloc {name}: {} not found; build it with `cargo build --release -p {LOCI_CRATE}`",
                    p.display()
                );
            }
            return Ok(Some(p));
        }
        let al = allocator(&name).expect("every --alloc value is in the allocator table");
        let (Some(file), pkg) = (al.lib, al.package) else {
            return Ok(None);
        };
        find_system_lib(file).map(Some).with_context(|| {
            format!(
                "--alloc {name}: {file} not found in {}; install the Debian package {pkg} (apt-get install {pkg})",
                system_lib_dirs().join(", ")
            )
        })
    }

    fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Thp {
    On,
    Off,
}

pub fn parse_wait(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: give seconds from 0 to 3600")),
    }
}

/// The pin library: `LOCI_PIN_LIB` if set, else `libloci_pin.so` next to the loci binary.
pub fn pin_library(exe_dir: &Path) -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("LOCI_PIN_LIB") {
        let p = PathBuf::from(p);
        anyhow::ensure!(
            p.is_file(),
            "LOCI_PIN_LIB={}: no such file (unset it to use libloci_pin.so next to loci)",
            p.display()
        );
        return Ok(p);
    }
    let p = exe_dir.join("libloci_pin.so");
    if p.exists() {
        Ok(p)
    } else {
        bail!(
            "per-thread placement and --verify need {}; build it with `cargo build --release -p loci-pin` (or point LOCI_PIN_LIB at it)",
            p.display()
        )
    }
}

/// `run --threads T [-n N] --mem M --alloc A [--thp X]`: a configuration of `loci run`'s knobs as
/// its arguments (`thp` None: THP as the system has it).
pub fn knob_args(
    threads: &str,
    n: Option<usize>,
    mem: &str,
    alloc: &str,
    thp: Option<&str>,
) -> Vec<String> {
    let mut a = vec!["run".to_string(), "--threads".into(), threads.into()];
    if let Some(n) = n {
        a.extend(["-n".into(), n.to_string()]);
    }
    a.extend(["--mem".into(), mem.into(), "--alloc".into(), alloc.into()]);
    if let Some(t) = thp {
        a.extend(["--thp".into(), t.into()]);
    }
    a
}

/// Every combination of one value from each of four lists, the last list varying fastest.
pub fn product4(lists: [&[String]; 4]) -> Vec<[&str; 4]> {
    let mut out = Vec::new();
    for a in lists[0] {
        for b in lists[1] {
            for c in lists[2] {
                for d in lists[3] {
                    out.push([a.as_str(), b.as_str(), c.as_str(), d.as_str()]);
                }
            }
        }
    }
    out
}

/// A command line as a shell would take it back: arguments with characters a shell treats
/// specially are single-quoted (`{...}` stays bare unless a comma would make it a brace expansion).
pub fn shell_line<S: AsRef<str>>(args: &[S]) -> String {
    args.iter()
        .map(|a| {
            let a = a.as_ref();
            let plain = !a.is_empty()
                && (!a.contains('{') || !a.contains(','))
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+{}".contains(c));
            if plain {
                a.to_string()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Resolves a command name through PATH as execvp would.
pub fn resolve(cmd: &OsString) -> Option<PathBuf> {
    let p = Path::new(cmd);
    if p.components().count() > 1 {
        return Some(p.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(p))
            .find(|f| f.is_file())
    })
}

/// Whether an ELF file is statically linked (no PT_INTERP program header). `None` when it is not
/// a 64-bit little-endian ELF (a script, say), so nothing can be told.
pub fn is_static_elf(bytes: &[u8]) -> Option<bool> {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(bytes.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    let phoff = u64_at(32)? as usize;
    let phentsize = u16_at(54)? as usize;
    let phnum = u16_at(56)? as usize;
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        let ptype = u32::from_le_bytes(bytes.get(o..o + 4)?.try_into().ok()?);
        if ptype == 3 {
            return Some(false);
        }
    }
    Some(true)
}

fn read_head(p: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(p).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = f.read(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

#[derive(Serialize)]
struct VerifyJson {
    plan: loci_place::PlanJson,
    started: Option<Comparison>,
    exit: Option<Comparison>,
}

pub fn run(c: RunCmd) -> anyhow::Result<()> {
    let topo = c.topo.load()?;
    let plan = make_plan(&topo, &c.threads, c.n, &c.mem, c.oversubscribe)?;
    loci_place::policy::check_kernel(&plan.memory).context("--mem")?;
    if plan.pinned {
        let here = sys::get_affinity(0)?;
        let fp = plan.footprint();
        if !fp.is_subset(&here) {
            bail!(
                "the plan uses cpus {} that this process may not run on here (allowed: {here}); is --preset/--topology describing another machine?",
                fp.difference(&here)
            );
        }
    }
    let verify = c.verify || c.verify_json.is_some();
    if let Some(path) = &c.verify_json {
        // Checked before the program runs: a path found unwritable afterwards would cost the
        // program's own exit status.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("--verify-json {}: cannot write there", path.display()))?;
    }
    let skip = c
        .skip
        .as_deref()
        .map(pinenv::parse_skip)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--skip: {e}"))?;
    let exe = std::env::current_exe().context("locating the loci binary")?;
    let exe_dir = exe.parent().unwrap_or(Path::new("/")).to_path_buf();

    let program = resolve(&c.cmd[0]);
    let is_static = program
        .as_deref()
        .and_then(read_head)
        .and_then(|b| is_static_elf(&b))
        .unwrap_or(false);

    let per_thread = plan.pinned && (plan.threads.len() > 1 || verify);
    // Under --verify the pin library is loaded for an unpinned plan too, without a plan: it
    // binds nothing and logs the program's memory at exit.
    let pin_loaded = (per_thread || verify) && !is_static;
    let mut preload: Vec<PathBuf> = Vec::new();
    if per_thread && is_static {
        eprintln!(
            "loci: note: {} is statically linked, so its threads cannot be placed one by one; they all run on cpus {}",
            c.cmd[0].to_string_lossy(),
            plan.footprint()
        );
    }
    if pin_loaded {
        preload.push(pin_library(&exe_dir)?);
    }
    if let Some(lib) = c.alloc.library(&exe_dir)? {
        if is_static {
            eprintln!(
                "loci: note: {} is statically linked; --alloc cannot replace its malloc",
                c.cmd[0].to_string_lossy()
            );
        }
        preload.push(lib);
    }
    if let Some(Thp::On) = c.thp {
        if let Ok(k) = loci_place::knobs::read(Path::new("/")) {
            match k.thp_enabled.as_deref() {
                Some("never") => eprintln!("loci: note: --thp on: THP is `never` system-wide, so the program gets none (as root: loci os set thp=madvise or thp=always)"),
                Some("madvise") => eprintln!("loci: note: --thp on: THP is `madvise` system-wide: only regions the program madvise()s get huge pages"),
                _ => {}
            }
        }
    }

    let child_cpus = if !plan.pinned {
        None
    } else if plan.threads.len() == 1 {
        Some(plan.threads[0].cpus.clone())
    } else {
        Some(plan.footprint())
    };
    let setup = ChildSetup::new(child_cpus.as_ref(), &plan, c.thp.map(|t| t == Thp::Off))?;

    let mut cmd = Command::new(&c.cmd[0]);
    cmd.args(&c.cmd[1..]);
    let log_path = std::env::temp_dir().join(format!("loci-pin-{}.log", std::process::id()));
    if !preload.is_empty() {
        let mut parts: Vec<OsString> = preload.iter().map(|p| p.clone().into_os_string()).collect();
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
            parts.push(old);
        }
        cmd.env("LD_PRELOAD", parts.join(&OsString::from(":")));
    }
    if per_thread && !is_static {
        let sets: Vec<_> = plan.threads.iter().map(|t| t.cpus.clone()).collect();
        let encoded = pinenv::encode_cpus(&sets);
        // The kernel refuses one environment string over 32 pages (MAX_ARG_STRLEN) at exec,
        // which the program would report as "Argument list too long".
        anyhow::ensure!(
            encoded.len() + pinenv::ENV_CPUS.len() < 128 * 1024,
            "the plan's {} threads take {} bytes in {}, more than an environment string may hold (128 KiB); use fewer threads (-n)",
            sets.len(),
            encoded.len(),
            pinenv::ENV_CPUS
        );
        cmd.env(pinenv::ENV_CPUS, encoded);
        match skip {
            Some(m) => cmd.env(pinenv::ENV_SKIP, format!("{m:#x}")),
            None => cmd.env_remove(pinenv::ENV_SKIP),
        };
    } else if pin_loaded {
        // No plan for the library: an inherited value must not pin the program.
        cmd.env_remove(pinenv::ENV_CPUS)
            .env_remove(pinenv::ENV_SKIP);
    }
    if pin_loaded {
        if verify {
            let _ = std::fs::remove_file(&log_path);
            cmd.env(pinenv::ENV_LOG, &log_path);
        } else {
            cmd.env_remove(pinenv::ENV_LOG);
        }
    }
    if let Some(n) = c.n {
        match std::env::var_os("OMP_NUM_THREADS") {
            None => {
                cmd.env("OMP_NUM_THREADS", n.to_string());
            }
            Some(v) => {
                if let Some(note) = omp_threads_note(n, &v) {
                    eprintln!("{note}");
                }
            }
        }
    }
    setup.install(&mut cmd);

    let start = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(ch) => ch,
        Err(e) => {
            let name = c.cmd[0].to_string_lossy();
            eprintln!("loci: cannot run `{name}`: {e}");
            std::process::exit(match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                _ => 126,
            });
        }
    };
    // Like a shell waiting for a foreground job: ^C and ^\ go to the program, loci stays to
    // report its status.
    // SAFETY: setting signal dispositions to SIG_IGN has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
    let status = if verify {
        let pid = child.id() as i32;
        let (status, started, exit) =
            watch(&mut child, pid, &plan, &log_path, start, c.verify_wait)?;
        if let Some(path) = &c.verify_json {
            let doc = VerifyJson {
                plan: plan.to_json(),
                started,
                exit,
            };
            std::fs::write(path, serde_json::to_string_pretty(&doc)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        let _ = std::fs::remove_file(&log_path);
        status
    } else {
        child.wait()?
    };
    std::process::exit(exit_code(status));
}

/// The note for an inherited `OMP_NUM_THREADS` that asks for another thread count than `-n`
/// (its first entry: `4,2` asks for 4 at the outer level); `None` when they agree.
pub fn omp_threads_note(n: usize, inherited: &std::ffi::OsStr) -> Option<String> {
    let v = inherited.to_string_lossy();
    let first = v.split(',').next().unwrap_or("").trim();
    if first.parse::<usize>() == Ok(n) {
        return None;
    }
    Some(format!(
        "loci: note: OMP_NUM_THREADS={v} is kept from the environment, though -n asks for {n} threads; unset it (or set it to {n}) for {n} OpenMP threads"
    ))
}

/// The shell convention: the exit status, or 128+N for death by signal N.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}

fn read_log(path: &Path, pid: i32) -> pinenv::PinLog {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    match pinenv::parse_log(&text) {
        Ok(v) => v.of_pid(pid),
        Err(e) => {
            eprintln!("loci: warning: {e}");
            pinenv::PinLog::default()
        }
    }
}

/// Polls the running program; prints the "started" report once it has the plan's thread count
/// (or after `wait_s`), and the "exit" report from the last readings.
fn watch(
    child: &mut std::process::Child,
    pid: i32,
    plan: &Plan,
    log: &Path,
    start: Instant,
    wait_s: f64,
) -> anyhow::Result<(ExitStatus, Option<Comparison>, Option<Comparison>)> {
    // Each thread's last reading taken after the pin library logged it (so after it was bound),
    // and readings of threads not logged yet: a program that exits within one poll may only
    // have been read before the library ran (even before exec), which says nothing of its
    // placement.
    let mut seen: BTreeMap<i32, TaskSample> = BTreeMap::new();
    let mut early: BTreeMap<i32, TaskSample> = BTreeMap::new();
    let mut mem = (BTreeMap::new(), 0.0);
    let mut last_mem = None::<Instant>;
    let mut last_at = 0.0;
    let mut started = None;
    loop {
        if let Some(st) = child.try_wait()? {
            let final_log = read_log(log, pid);
            let mut unverified = vec![];
            for (tid, t) in early {
                if seen.contains_key(&tid) {
                    continue;
                }
                match final_log.threads.iter().rev().find(|e| e.tid == tid) {
                    Some(e) => unverified.push((tid, e.cpus.clone())),
                    None => {
                        seen.insert(tid, t);
                    }
                }
            }
            // The program's own reading at exit, when the pin library could take it (the program
            // ended through exit(3)); otherwise loci's last poll, which may predate memory the
            // program touched in its last moments.
            let (anon_bytes, memory_at_s, memory_by) = match final_log.exits.last() {
                Some(e) => (
                    e.anon_bytes.clone(),
                    start.elapsed().as_secs_f64(),
                    MemoryBy::ProgramAtExit,
                ),
                None => (mem.0, mem.1, MemoryBy::Poll),
            };
            let exit_sample = Sample {
                at_s: last_at,
                tasks: seen.into_values().collect(),
                anon_bytes,
                memory_at_s,
                memory_by,
            };
            let cmp = verify::compare(plan, &exit_sample, &final_log.threads);
            eprint!(
                "{}",
                cmp.render("at exit: every thread seen, with its last reading")
            );
            if exit_sample.tasks.is_empty() && unverified.is_empty() {
                eprintln!(
                    "loci verify: the program exited before any of its threads could be read: nothing verified"
                );
            }
            for (tid, cpus) in unverified {
                eprintln!(
                    "loci verify: thread {tid} exited before a reading after the pin library bound it (to cpus {cpus}, by its log): not verified"
                );
            }
            return Ok((st, started, Some(cmp)));
        }
        let at = start.elapsed().as_secs_f64();
        let with_mem = last_mem.map(|t| t.elapsed() >= Duration::from_millis(250)) != Some(false)
            || started.is_none();
        // Keeps a sample's thread readings (each as seen or early by the log read before the
        // sample: a thread logged then was bound before it was read) and its memory reading.
        let mut record = |s: &Sample, logged: &pinenv::PinLog| {
            last_at = s.at_s;
            for t in &s.tasks {
                let bound = logged.threads.iter().any(|e| e.tid == t.tid);
                let into = if bound { &mut seen } else { &mut early };
                into.insert(t.tid, t.clone());
            }
            if !s.anon_bytes.is_empty() {
                mem = (s.anon_bytes.clone(), s.memory_at_s);
                last_mem = Some(Instant::now());
            }
        };
        let logged = read_log(log, pid);
        if let Ok(s) = verify::sample(pid, at, with_mem) {
            if s.tasks.is_empty() {
                // Exited between try_wait and the read; the next try_wait reaps it.
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            record(&s, &logged);
            if started.is_none() && (s.tasks.len() >= plan.threads.len() || at >= wait_s) {
                // Give the pin library a moment to log threads that just started; this second
                // reading counts for the exit report too.
                std::thread::sleep(Duration::from_millis(20));
                let logged = read_log(log, pid);
                let s = match verify::sample(pid, start.elapsed().as_secs_f64(), true) {
                    Ok(again) if !again.tasks.is_empty() => {
                        record(&again, &logged);
                        again
                    }
                    _ => s,
                };
                let cmp = verify::compare(plan, &s, &logged.threads);
                let title = if s.tasks.len() >= plan.threads.len() {
                    format!(
                        "threads started ({} of {} planned)",
                        s.tasks.len(),
                        plan.threads.len()
                    )
                } else {
                    format!(
                        "after {wait_s}s only {} of {} planned threads exist",
                        s.tasks.len(),
                        plan.threads.len()
                    )
                };
                eprint!("{}", cmp.render(&title));
                started = Some(cmp);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elf_static_detection() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(is_static_elf(&me), Some(false));
        assert_eq!(is_static_elf(b"#!/bin/sh\necho hi\n"), None);
        // A minimal ELF64 header with no program headers reads as static.
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        assert_eq!(is_static_elf(&h), Some(true));
    }

    #[test]
    fn inherited_omp_num_threads_is_noted_only_when_it_differs() {
        use std::ffi::OsStr;
        let note = omp_threads_note(4, OsStr::new("8")).unwrap();
        assert!(
            note.contains("OMP_NUM_THREADS=8") && note.contains("-n asks for 4"),
            "{note}"
        );
        assert_eq!(omp_threads_note(4, OsStr::new("4")), None);
        assert_eq!(omp_threads_note(4, OsStr::new(" 4,2")), None);
        assert!(omp_threads_note(4, OsStr::new("2,4")).is_some());
        assert!(omp_threads_note(4, OsStr::new("")).is_some());
    }

    #[test]
    fn missing_allocator_names_the_package() {
        let e = Alloc::Loci
            .library(Path::new("/nonexistent"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("libloci_malloc.so") && e.contains("loci-alloc-preload"),
            "{e}"
        );
        assert_eq!(Alloc::Glibc.library(Path::new("/")).unwrap(), None);
    }
}
