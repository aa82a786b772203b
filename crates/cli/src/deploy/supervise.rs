//! The supervisor: starts every instance as `loci run ...` in its own process group, prefixes its
//! output, verifies it once it runs, forwards SIGINT/SIGTERM, restarts failures with backoff, and
//! keeps the manifest current.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::manifest::{alive, signal, signal_group, InstanceRecord, Manifest, Verdict};
use super::{Common, Restart};
use crate::run_cmd::exit_code;

/// The last SIGINT/SIGTERM received (0: none since it was read).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// How long after the program is found running it is checked: its first threads and pages.
const SETTLE: Duration = Duration::from_millis(100);

/// Restart delay after `restarts` earlier restarts: 0.25 s doubling, at most 8 s.
fn backoff(restarts: u32) -> Duration {
    Duration::from_millis(250u64 << restarts.min(5))
}

/// One instance's processes as the supervisor holds them.
#[derive(Default)]
struct Live {
    child: Option<Child>,
    started: Option<Instant>,
    restart_at: Option<Instant>,
    verify_at: Option<Instant>,
}

/// Copies `from` line by line to stdout or stderr, each line prefixed `[i] `.
fn pump(from: impl Read + Send + 'static, index: usize, to_stderr: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        let mut line = Vec::new();
        while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            let mut out = Vec::with_capacity(line.len() + 8);
            out.extend_from_slice(format!("[{index}] ").as_bytes());
            out.extend_from_slice(&line);
            // One write per line, so lines of different instances never interleave.
            let _ = if to_stderr {
                std::io::stderr().lock().write_all(&out)
            } else {
                std::io::stdout().lock().write_all(&out)
            };
            line.clear();
        }
    })
}

/// Starts one instance; the threads copying its output join `pumps`.
fn spawn(
    rec: &mut InstanceRecord,
    live: &mut Live,
    pumps: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<()> {
    let mut cmd = Command::new(&rec.run[0]);
    cmd.args(&rec.run[1..])
        .env("LOCI_DEPLOY_INSTANCE", rec.index.to_string())
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("instance {}: starting {}", rec.index, rec.run[0]))?;
    pumps.push(pump(child.stdout.take().expect("piped"), rec.index, false));
    pumps.push(pump(child.stderr.take().expect("piped"), rec.index, true));
    rec.runner_pid = Some(child.id() as i32);
    rec.pid = None;
    rec.verify = None;
    rec.state = "starting".into();
    *live = Live {
        child: Some(child),
        started: Some(Instant::now()),
        ..Live::default()
    };
    Ok(())
}

/// The program `loci run` (pid `runner`) started, once it has exec'd (its executable is no
/// longer `loci`).
fn program_pid(runner: i32, loci: &Path) -> Option<i32> {
    let kids = std::fs::read_to_string(format!("/proc/{runner}/task/{runner}/children")).ok()?;
    let pid: i32 = kids.split_whitespace().next()?.parse().ok()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    (exe != loci).then_some(pid)
}

fn terminal(state: &str) -> bool {
    matches!(state, "exited" | "failed" | "stopped")
}

/// Supervises the instances of `m` until every one has ended or been stopped.
pub fn run(mut m: Manifest, a: &Common) -> anyhow::Result<()> {
    for r in &m.instances {
        if crate::run_cmd::resolve(&r.command[0].clone().into()).is_none() {
            bail!(
                "instance {}: `{}` is not a file and is not found in PATH",
                r.index,
                r.command[0]
            );
        }
    }
    // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let loci = std::env::current_exe().context("locating the loci binary")?;
    let path = a.manifest.clone();
    m.supervisor_pid = Some(std::process::id() as i32);
    m.state = "running".into();
    let mut lives: Vec<Live> = m.instances.iter().map(|_| Live::default()).collect();
    let mut pumps = Vec::new();
    let stopped = watch(&mut m, &mut lives, &mut pumps, a, &loci, &path);
    if stopped.is_err() {
        // The supervisor cannot go on (a manifest it cannot write, a restart that cannot spawn):
        // it takes its instances with it rather than leave them unsupervised.
        for (rec, live) in m.instances.iter().zip(lives.iter()) {
            if let (Some(g), Some(_)) = (rec.runner_pid, &live.child) {
                signal_group(g, libc::SIGKILL);
            }
        }
    }
    // The instances' last lines: their pipes close when their groups are gone; a process that
    // left its group and keeps a pipe open is not waited for beyond a second.
    let until = Instant::now() + Duration::from_secs(1);
    while pumps.iter().any(|p| !p.is_finished()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stopped = stopped?;
    let failed: Vec<String> = m
        .instances
        .iter()
        .filter(|r| r.state == "failed")
        .map(|r| r.index.to_string())
        .collect();
    m.state = if stopped {
        "stopped"
    } else if failed.is_empty() {
        "exited"
    } else {
        "failed"
    }
    .into();
    m.write(&path)?;
    if !failed.is_empty() && !stopped {
        bail!(
            "instance(s) {} failed (see {} for their last status)",
            failed.join(", "),
            path.display()
        );
    }
    Ok(())
}

/// Starts every instance and supervises them until all have ended; true when stopped by a
/// signal.
fn watch(
    m: &mut Manifest,
    lives: &mut [Live],
    pumps: &mut Vec<JoinHandle<()>>,
    a: &Common,
    loci: &Path,
    path: &Path,
) -> anyhow::Result<bool> {
    let t0 = Instant::now();
    for (rec, live) in m.instances.iter_mut().zip(lives.iter_mut()) {
        spawn(rec, live, pumps)?;
    }
    m.write(path)?;
    let mut all_verified = false;
    let mut stop_at: Option<Instant> = None;
    let mut killed = false;
    loop {
        let mut changed = false;
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            let first = stop_at.is_none();
            eprintln!(
                "loci: deploy: signal {sig} received; {}",
                if first {
                    format!(
                        "forwarding it to every instance (SIGKILL after {} s)",
                        a.grace
                    )
                } else {
                    "a second one: SIGKILL now".into()
                }
            );
            for (rec, live) in m.instances.iter_mut().zip(lives.iter_mut()) {
                if live.child.is_none() {
                    if !terminal(&rec.state) {
                        rec.state = "stopped".into();
                    }
                    continue;
                }
                match (rec.pid.filter(|&p| alive(p)), rec.runner_pid) {
                    (Some(p), _) => signal(p, sig),
                    (None, Some(g)) => signal_group(g, sig),
                    _ => false,
                };
            }
            stop_at = Some(if first {
                Instant::now() + Duration::from_secs_f64(a.grace)
            } else {
                Instant::now()
            });
            m.state = "stopping".into();
            changed = true;
        }
        if !killed && stop_at.is_some_and(|t| Instant::now() >= t) {
            for (rec, live) in m.instances.iter().zip(lives.iter()) {
                if let (Some(g), Some(_)) = (rec.runner_pid, &live.child) {
                    signal_group(g, libc::SIGKILL);
                }
            }
            killed = true;
        }
        for (rec, live) in m.instances.iter_mut().zip(lives.iter_mut()) {
            let now = Instant::now();
            if let Some(child) = &mut live.child {
                if let Some(st) = child.try_wait()? {
                    let code = exit_code(st);
                    // Whatever the program left in its group goes with it.
                    if let Some(g) = rec.runner_pid {
                        signal_group(g, libc::SIGKILL);
                    }
                    live.child = None;
                    rec.last_exit = Some(code);
                    rec.pid = None;
                    let again = a.restart == Restart::OnFailure
                        && code != 0
                        && rec.restarts < m.max_restarts;
                    rec.state = if stop_at.is_some() {
                        "stopped"
                    } else if code == 0 {
                        "exited"
                    } else if again {
                        live.restart_at = Some(now + backoff(rec.restarts));
                        "restarting"
                    } else {
                        "failed"
                    }
                    .into();
                    eprintln!(
                        "loci: deploy: instance {} ended with status {code}: {}{}",
                        rec.index,
                        rec.state,
                        match live.restart_at {
                            Some(t) if again && stop_at.is_none() => format!(
                                " (restart {} of at most {} in {:.2} s)",
                                rec.restarts + 1,
                                m.max_restarts,
                                (t - now).as_secs_f64()
                            ),
                            _ => String::new(),
                        }
                    );
                    changed = true;
                } else if rec.pid.is_none() {
                    if let Some(p) = rec.runner_pid.and_then(|r| program_pid(r, loci)) {
                        rec.pid = Some(p);
                        rec.state = "running".into();
                        live.verify_at = Some(now + SETTLE);
                        changed = true;
                    }
                } else if let (Some(p), Some(at)) = (rec.pid, live.verify_at) {
                    if now >= at {
                        let since = live.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
                        rec.verify = Verdict::take(p, rec, since);
                        live.verify_at = None;
                        if let Some(v) = &rec.verify {
                            eprintln!(
                                "loci: deploy: instance {} (pid {p}) verified: {}",
                                rec.index,
                                v.line(&rec.cpus)
                            );
                        }
                        changed = true;
                    }
                }
            } else if let Some(t) = live.restart_at {
                if stop_at.is_some() {
                    live.restart_at = None;
                    rec.state = "stopped".into();
                    changed = true;
                } else if now >= t {
                    rec.restarts += 1;
                    spawn(rec, live, pumps)?;
                    changed = true;
                }
            }
        }
        if !all_verified
            && m.instances
                .iter()
                .all(|r| r.verify.is_some() || terminal(&r.state))
        {
            all_verified = true;
            let ok = m
                .instances
                .iter()
                .filter(|r| r.verify.as_ref().is_some_and(|v| v.ok))
                .count();
            eprintln!(
                "loci: deploy: {ok} of {} instances verified as planned, {:.2} s after their start",
                m.instances.len(),
                t0.elapsed().as_secs_f64()
            );
            if a.json {
                println!("{}", serde_json::to_string(&*m)?);
            }
        }
        if changed {
            m.write(path)?;
        }
        if m.instances.iter().all(|r| terminal(&r.state)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(stop_at.is_some())
}
