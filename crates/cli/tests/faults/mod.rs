//! The fault scenarios of `loci stream`, shared by `stream_faults.rs` (loopback and namespaces on
//! the host) and `vm.rs` (namespaces with `tc netem` inside a VM whose kernel has sch_netem).
//! Every wait is bounded; every child process is killed on drop; nothing asserts a duration.
//!
//! Every scenario measures what matters to a user before it asserts anything else, and adds it to
//! a per-thread [`Tally`] (read by the `fault_table` test): source bytes missing from the sink
//! where the stream had to complete, bytes in the sink that differ from the source, and reports
//! claiming `verified` that are not true.
#![allow(dead_code)] // each test target uses its own subset

pub mod mitm;
mod sink_and_flood;

pub use sink_and_flood::{half_open_flood, power_loss, two_streams_one_file};

use std::cell::Cell;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{sh, Netns};

/// How much data one fault scenario streams: `chunks` chunks of `chunk` bytes (the last one short).
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub chunk: usize,
    pub chunks: u64,
    /// Multiplies every wait's limit (an emulated CPU on a loaded host is many times slower).
    pub patience: u32,
}

/// On the host: 48 chunks of 1 MiB.
pub const HOST: Scale = Scale {
    chunk: 1 << 20,
    chunks: 48,
    patience: 1,
};

/// Inside a TCG VM (emulated CPU, netem's 1% loss throttling TCP): 48 chunks of 256 KiB.
pub const VM: Scale = Scale {
    chunk: 256 << 10,
    chunks: 48,
    patience: 5,
};

/// The man-in-the-middle scenarios (many short streams): 48 chunks of 256 KiB.
pub const SMALL: Scale = Scale {
    chunk: 256 << 10,
    chunks: 48,
    patience: 1,
};

const SECRET: &str = "fault-test-secret";

fn loci() -> &'static str {
    env!("CARGO_BIN_EXE_loci")
}

/// Kills a child on drop, so a failing assertion never leaves processes behind.
pub struct Guard(Option<Child>);
impl Guard {
    fn kill9(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }
    /// Waits (bounded) for exit and returns the output.
    fn finish(&mut self, limit: Duration) -> Output {
        let mut c = self.0.take().expect("running");
        let deadline = Instant::now() + limit;
        loop {
            if c.try_wait().unwrap().is_some() {
                return c.wait_with_output().unwrap();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let out = c.wait_with_output().unwrap();
                panic!(
                    "process did not finish within {limit:?}; stderr:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
impl Guard {
    /// Whether the process is still running.
    fn running(&mut self) -> bool {
        self.0
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
    /// Waits (bounded) for exit; a process still running at the limit is killed. Returns the
    /// output and whether it had to be killed.
    fn finish_or_kill(&mut self, limit: Duration) -> (Output, bool) {
        let deadline = Instant::now() + limit;
        while self.running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let killed = self.running();
        (self.kill_output(), killed)
    }
    /// Kills the process if it still runs (SIGKILL) and returns what it printed.
    fn kill_output(&mut self) -> Output {
        let mut c = self.0.take().expect("running");
        let _ = c.kill();
        c.wait_with_output().unwrap()
    }
}
impl Drop for Guard {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Where the two sides run: loopback, or two namespaces.
pub struct Net {
    ns: Option<(String, String)>,
    recv_ip: String,
}

impl Net {
    pub fn loopback() -> Net {
        Net {
            ns: None,
            recv_ip: "127.0.0.1".into(),
        }
    }
    /// The queueing disciplines of both ends of the veth pair (`tc qdisc show`), empty on loopback.
    pub fn qdiscs(&self) -> String {
        let Some((a, b)) = &self.ns else {
            return String::new();
        };
        [a, b]
            .iter()
            .map(|n| {
                Command::new("ip")
                    .args(["netns", "exec", n, "tc", "qdisc", "show"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default()
            })
            .collect()
    }
    /// TCP segments retransmitted in both namespaces so far (`RetransSegs` of /proc/net/snmp):
    /// proof that the link really lost packets. 0 on loopback.
    pub fn tcp_retransmits(&self) -> u64 {
        let Some((a, b)) = &self.ns else {
            return 0;
        };
        [a, b]
            .iter()
            .map(|n| {
                let out = Command::new("ip")
                    .args(["netns", "exec", n, "cat", "/proc/net/snmp"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                // Two "Tcp:" lines: field names, then values.
                let tcp: Vec<Vec<&str>> = out
                    .lines()
                    .filter(|l| l.starts_with("Tcp:"))
                    .map(|l| l.split_whitespace().collect())
                    .collect();
                match tcp.as_slice() {
                    [names, values] => names
                        .iter()
                        .position(|&f| f == "RetransSegs")
                        .and_then(|i| values.get(i)?.parse::<u64>().ok())
                        .unwrap_or(0),
                    _ => 0,
                }
            })
            .sum()
    }
    fn cmd(&self, receiver_side: bool) -> Command {
        match &self.ns {
            None => Command::new(loci()),
            Some((a, b)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", if receiver_side { b } else { a }, loci()]);
                c
            }
        }
    }
}

/// Two namespaces joined by a veth pair (see [`Netns`]) with `tc netem` delay, 1% loss and
/// reordering on both ends where the kernel has it, and the [`Net`] across it.
pub fn namespaces(tag: &str) -> Result<(Netns, Net), String> {
    let ns = Netns::new(tag, 231)?;
    let mut netem = Ok(());
    for (n, v) in ns.names.iter().zip(&ns.veths) {
        let r = sh(&[
            "ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", v, "root", "netem", "delay",
            "4ms", "2ms", "loss", "1%", "reorder", "10%", "50%",
        ]);
        if r.is_err() {
            netem = r;
            break;
        }
    }
    if let Err(e) = netem {
        if std::env::var_os("LOCI_REQUIRE_NETEM").is_some() {
            return Err(format!(
                "tc netem is required (LOCI_REQUIRE_NETEM) but failed: {e}"
            ));
        }
        eprintln!(
            "NOTE: tc netem is not available in this kernel ({e}); the namespace test runs over \
             the veth pair without delay, loss or reordering"
        );
    }
    let net = Net {
        ns: Some((ns.names[0].clone(), ns.names[1].clone())),
        recv_ip: ns.ips[1].clone(),
    };
    Ok((ns, net))
}

/// What a fault did to the data, summed over scenarios (per thread; see [`take_tally`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Source bytes missing from the sink at the end of a scenario whose stream had to complete.
    pub bytes_lost: u64,
    /// Sink bytes that differ from the source's: anywhere, for a completed stream; in a chunk the
    /// journal records, or a non-zero byte anywhere else, for a stream that had to fail closed.
    pub bytes_corrupted: u64,
    /// Reports that say `verified` when the sink is not byte-identical to the source, the two
    /// sides' checksums differ, or the stream had to fail.
    pub false_verified: u64,
}

impl Tally {
    pub fn add(&mut self, o: Tally) {
        self.bytes_lost += o.bytes_lost;
        self.bytes_corrupted += o.bytes_corrupted;
        self.false_verified += o.false_verified;
    }
    pub fn is_clean(&self) -> bool {
        *self == Tally::default()
    }
}

thread_local! {
    static TALLY: Cell<Tally> = const { Cell::new(Tally { bytes_lost: 0, bytes_corrupted: 0, false_verified: 0 }) };
}

/// Adds to this thread's tally (done before a scenario asserts, so a failing run is counted too).
fn note(t: Tally) {
    TALLY.with(|c| {
        let mut x = c.get();
        x.add(t);
        c.set(x);
    });
    if !t.is_clean() {
        eprintln!("FAULT TALLY: {t:?}");
    }
}

/// This thread's tally since the last call.
pub fn take_tally() -> Tally {
    TALLY.with(|c| c.replace(Tally::default()))
}

struct Setup {
    _dir: tempfile::TempDir,
    scale: Scale,
    dir: PathBuf,
    src: PathBuf,
    out: PathBuf,
    port: u16,
    /// The sender's `--reconnect-timeout` (seconds).
    reconnect_timeout: u64,
}

impl Setup {
    fn source_bytes(&self) -> u64 {
        self.scale.chunks * self.scale.chunk as u64 - 999
    }
}

fn setup(port: u16, scale: Scale) -> Setup {
    let Scale { chunk, chunks, .. } = scale;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    let src = dir.join("src.raw");
    loci_stream::source::write_synthetic_file(&src, chunks * chunk as u64 - 999, 7, chunk).unwrap();
    std::fs::write(dir.join("send.toml"), send_toml(scale, 0)).unwrap();
    std::fs::write(dir.join("recv.toml"), "sync = \"data\"\n").unwrap();
    Setup {
        scale,
        out: dir.join("out.raw"),
        src,
        dir,
        _dir: d,
        port,
        reconnect_timeout: 60 * scale.patience as u64,
    }
}

fn send_toml(scale: Scale, stream: u32) -> String {
    let chunk = scale.chunk;
    format!(
        "stream = {stream}\nchunk_bytes = {chunk}\nwindow = 8\nqueue_depth = 4\n\
         [compress]\ncount = 2\n[send]\ncount = 2\n"
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_recv(net: &Net, s: &Setup) -> Guard {
    start_recv_with(net, s, &[])
}

fn start_recv_with(net: &Net, s: &Setup, extra: &[&str]) -> Guard {
    let mut cmd = net.cmd(true);
    let cmd = cmd
        .args(["stream", "recv", "--json", "--listen"])
        .arg(format!("{}:{}", net.recv_ip, s.port))
        .arg("--config")
        .arg(s.dir.join("recv.toml"))
        .arg("--sink")
        .arg(&s.out);
    spawn(cmd, extra)
}

/// Starts `cmd EXTRA` with the shared secret in its environment, its output captured.
fn spawn(cmd: &mut Command, extra: &[&str]) -> Guard {
    let child = cmd
        .args(extra)
        .env("LOCI_STREAM_SECRET", SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Guard(Some(child))
}

fn start_send(net: &Net, s: &Setup, extra: &[&str]) -> Guard {
    let to = format!("{}:{}", net.recv_ip, s.port);
    start_send_with(net, s, &to, &s.dir.join("send.toml"), &s.src, extra)
}

fn start_send_with(
    net: &Net,
    s: &Setup,
    to: &str,
    config: &Path,
    src: &Path,
    extra: &[&str],
) -> Guard {
    let mut cmd = net.cmd(false);
    let cmd = cmd
        .args([
            "stream",
            "send",
            "--json",
            "--reconnect-timeout",
            &s.reconnect_timeout.to_string(),
            "--to",
            to,
        ])
        .arg("--source")
        .arg(src)
        .arg("--config")
        .arg(config);
    spawn(cmd, extra)
}

/// The distinct chunks the receiver's journal (`FILE.loci-journal`) records, sorted: the records
/// after the 48-byte header (24 bytes each in journal version 2: seq, chunk hash, check; 16 in
/// version 1), up to the first short record or one naming a chunk beyond the stream.
fn journal(out: &Path) -> Vec<u64> {
    let mut j = out.as_os_str().to_owned();
    j.push(".loci-journal");
    let Ok(data) = std::fs::read(PathBuf::from(j)) else {
        return vec![];
    };
    if data.len() < 48 || &data[..8] != b"LOCIJRNL" {
        return vec![];
    }
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let version = u32::from_le_bytes(data[8..12].try_into().unwrap());
    let total = u64_at(&data, 32);
    let rec = if version >= 2 { 24 } else { 16 };
    let mut seqs = BTreeSet::new();
    for r in data[48..].chunks_exact(rec) {
        let seq = u64_at(r, 0);
        if seq >= total {
            break;
        }
        seqs.insert(seq);
    }
    seqs.into_iter().collect()
}

/// Chunks the receiver's journal records as durable.
fn journaled(out: &Path) -> u64 {
    journal(out).len() as u64
}

fn wait_journaled(out: &Path, n: u64, patience: u32) {
    let deadline = Instant::now() + Duration::from_secs(60) * patience;
    while journaled(out) < n {
        assert!(
            Instant::now() < deadline,
            "the receiver never journaled {n} chunks"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn report(o: &Output, who: &str) -> serde_json::Value {
    assert!(
        o.status.success(),
        "{who} failed: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{who} printed no JSON report ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    });
    v[0].clone()
}

/// Every report a process printed (none when it printed no JSON, e.g. killed or failed).
fn reports(o: &Output) -> Vec<serde_json::Value> {
    match serde_json::from_slice::<serde_json::Value>(&o.stdout) {
        Ok(serde_json::Value::Array(v)) => v,
        _ => vec![],
    }
}

fn says_verified(o: &Output) -> usize {
    reports(o)
        .iter()
        .filter(|r| r["verified"] == serde_json::Value::Bool(true))
        .count()
}

/// The last line of a process's stderr (its error, for a failed `loci`).
fn last_line(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}

/// (source bytes missing from the end of the sink, bytes that differ or lie past the source's end).
fn compare(src: &[u8], out: &[u8]) -> (u64, u64) {
    let common = src.len().min(out.len());
    let differ = src[..common]
        .iter()
        .zip(&out[..common])
        .filter(|(a, b)| a != b)
        .count() as u64;
    let lost = src.len().saturating_sub(out.len()) as u64;
    let extra = out.len().saturating_sub(src.len()) as u64;
    (lost, differ + extra)
}

/// Measures a stream that had to complete, and notes it: what the sink lacks or has wrong, and
/// reports claiming `verified` over a sink that is not the source (or with checksums that differ).
fn tally_complete(src: &Path, out: &Path, outputs: &[&Output]) -> Tally {
    let a = std::fs::read(src).unwrap();
    let b = std::fs::read(out).unwrap_or_default();
    let (lost, corrupted) = compare(&a, &b);
    let reps: Vec<serde_json::Value> = outputs.iter().flat_map(|o| reports(o)).collect();
    let sums: BTreeSet<String> = reps.iter().map(|r| r["stream_xxh3"].to_string()).collect();
    let wrong = lost + corrupted > 0 || sums.len() > 1;
    let t = Tally {
        bytes_lost: lost,
        bytes_corrupted: corrupted,
        false_verified: if wrong {
            reps.iter().filter(|r| r["verified"] == true).count() as u64
        } else {
            0
        },
    };
    note(t);
    t
}

/// Measures a stream that had to fail closed, and notes it: every chunk the journal records must
/// hold the source's bytes (a missing one counts as lost, a differing byte as corrupted), every
/// other chunk the source's bytes or none (zeros: never written); every `verified` report is false.
fn tally_fail_closed(s: &Setup, outputs: &[&Output]) -> Tally {
    let a = std::fs::read(&s.src).unwrap();
    let b = std::fs::read(&s.out).unwrap_or_default();
    let rec: BTreeSet<u64> = journal(&s.out).into_iter().collect();
    let chunk = s.scale.chunk;
    let mut t = Tally::default();
    for (seq, want) in a.chunks(chunk).enumerate() {
        let off = seq * chunk;
        let have = b.get(off..(off + want.len()).min(b.len())).unwrap_or(&[]);
        if rec.contains(&(seq as u64)) {
            let (lost, corrupted) = compare(want, have);
            t.bytes_lost += lost;
            t.bytes_corrupted += corrupted;
        } else {
            t.bytes_corrupted += want
                .iter()
                .zip(have)
                .filter(|&(x, y)| x != y && *y != 0)
                .count() as u64;
        }
    }
    t.bytes_corrupted += b.len().saturating_sub(a.len()) as u64;
    t.false_verified = outputs.iter().map(|o| says_verified(o) as u64).sum();
    note(t);
    t
}

/// Same bytes in the sink as in the source, and both sides agree on the whole-stream checksum.
fn check_exact(s: &Setup, send: &serde_json::Value, recv: &serde_json::Value) {
    assert_eq!(send["verified"], true);
    assert_eq!(recv["verified"], true);
    assert_eq!(send["stream_xxh3"], recv["stream_xxh3"]);
    let a = std::fs::read(&s.src).unwrap();
    let b = std::fs::read(&s.out).unwrap();
    assert_eq!(a.len(), b.len(), "sink size");
    assert!(a == b, "sink content differs from the source");
}

/// Waits for the sender, then the receiver (bounded, scaled by the patience; a receiver whose
/// sender failed is killed instead of waited for), notes the tally, checks the sink is exact and
/// returns both reports.
fn finish_exact(s: &Setup, mut send: Guard, recv: Guard) -> (serde_json::Value, serde_json::Value) {
    let so = send.finish(Duration::from_secs(120) * s.scale.patience);
    finish_exact_after(s, so, recv)
}

/// [`finish_exact`] for a sender that already exited with `so`.
fn finish_exact_after(
    s: &Setup,
    so: Output,
    mut recv: Guard,
) -> (serde_json::Value, serde_json::Value) {
    let ro = if so.status.success() {
        recv.finish(Duration::from_secs(30) * s.scale.patience)
    } else {
        recv.kill_output()
    };
    tally_complete(&s.src, &s.out, &[&so, &ro]);
    let sr = report(&so, "sender");
    let rr = report(&ro, "receiver");
    check_exact(s, &sr, &rr);
    (sr, rr)
}

pub fn receiver_killed_and_restarted(net: &Net, scale: Scale) {
    let s = setup(free_port(), scale);
    let mut recv = start_recv(net, &s);
    let send = start_send(net, &s, &["--fault-delay-ms", "25"]);
    wait_journaled(&s.out, 12, s.scale.patience);
    recv.kill9();
    let had = journaled(&s.out);
    assert!(had < s.scale.chunks, "killed mid-stream");
    std::thread::sleep(Duration::from_millis(300));
    let recv = start_recv(net, &s);
    let (sr, rr) = finish_exact(&s, send, recv);
    assert!(sr["reconnects"].as_u64().unwrap() >= 1, "{sr}");
    assert!(
        rr["skipped_chunks"].as_u64().unwrap() >= 12,
        "restarted receiver resumed: {rr}"
    );
}

pub fn sender_killed_and_resumed(net: &Net, scale: Scale) {
    let s = setup(free_port(), scale);
    let recv = start_recv(net, &s);
    let mut send = start_send(net, &s, &["--fault-delay-ms", "25"]);
    wait_journaled(&s.out, 12, s.scale.patience);
    send.kill9();
    assert!(journaled(&s.out) < s.scale.chunks, "killed mid-stream");
    let send = start_send(net, &s, &["--resume"]);
    let (sr, _) = finish_exact(&s, send, recv);
    assert!(
        sr["skipped_chunks"].as_u64().unwrap() >= 12,
        "resumed sender skipped: {sr}"
    );
}

/// The sender flips a payload byte in the first transmission of 6 chunks (`--fault-corrupt`).
/// With authenticated frames (the default) each fails its tag: the receiver ends that connection
/// and the sender resends the chunk on a new one.
pub fn corrupt_frames_are_resent(net: &Net, scale: Scale) {
    corrupt_frames(net, scale, false);
}

/// The same with `--unauthenticated` on both sides (checksum-only frames): the receiver finds
/// each corrupt payload by its xxh3 and NACKs it; the sender resends it.
pub fn corrupt_frames_are_nacked_unauthenticated(net: &Net, scale: Scale) {
    corrupt_frames(net, scale, true);
}

fn corrupt_frames(net: &Net, scale: Scale, unauthenticated: bool) {
    let s = setup(free_port(), scale);
    let flag: &[&str] = if unauthenticated {
        &["--unauthenticated"]
    } else {
        &[]
    };
    let recv = start_recv_with(net, &s, flag);
    let seqs = format!("0,5,17-19,{}", s.scale.chunks - 1);
    let send = start_send(net, &s, &[flag, &["--fault-corrupt", &seqs]].concat());
    let (sr, rr) = finish_exact(&s, send, recv);
    if unauthenticated {
        assert!(
            rr["nacks"].as_u64().unwrap() >= 6,
            "receiver detected every corrupt frame: {rr}"
        );
    }
    // Every corrupted chunk was refused and sent again.
    assert!(sr["resent_chunks"].as_u64().unwrap() >= 6, "{sr}");
}

/// One named fault scenario on loopback at the host's scale (the `fault_table` runs each many
/// times).
pub struct Scenario {
    pub name: String,
    pub run: Box<dyn Fn() + Send + Sync>,
}

/// Every fault scenario on loopback, in the order of the table.
pub fn scenarios() -> Vec<Scenario> {
    use mitm::{Attack, Mode, Persist};
    let lo = Net::loopback;
    let mut v: Vec<Scenario> = vec![];
    let mut add = |name: &str, run: Box<dyn Fn() + Send + Sync>| {
        v.push(Scenario {
            name: name.to_string(),
            run,
        })
    };
    type OnNet = fn(&Net, Scale);
    let on_loopback: [(&str, OnNet); 4] = [
        ("receiver kill -9, restart", receiver_killed_and_restarted),
        ("sender kill -9, --resume", sender_killed_and_resumed),
        ("corrupt frames (auth)", corrupt_frames_are_resent),
        (
            "corrupt frames (checksum, NACK)",
            corrupt_frames_are_nacked_unauthenticated,
        ),
    ];
    for (name, f) in on_loopback {
        add(name, Box::new(move || f(&lo(), HOST)));
    }
    type OnHost = fn(Scale);
    let on_host: [(&str, OnHost); 4] = [
        ("power loss, sender reconnects", |s| power_loss(s, true)),
        ("power loss, sender --resume", |s| power_loss(s, false)),
        ("two streams into one FILE", two_streams_one_file),
        ("200 half-open connections", half_open_flood),
    ];
    for (name, f) in on_host {
        add(name, Box::new(move || f(HOST)));
    }
    for attack in Attack::ALL {
        for persist in [Persist::Always, Persist::Once] {
            for mode in Mode::ALL {
                let name = format!(
                    "mitm {} {} ({})",
                    attack.name(),
                    match persist {
                        Persist::Always => "always",
                        Persist::Once => "once",
                    },
                    mode.name()
                );
                add(&name, Box::new(move || mitm::mitm(attack, persist, mode)));
            }
        }
    }
    v
}
