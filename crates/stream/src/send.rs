//! The sending side: C compressing threads, each reading its next chunk from the source,
//! compressing and hashing it -> send over S connections, keeping every chunk until the receiver
//! acknowledges it, and resending after a NACK or a reconnect. With `resume`, chunks the
//! receiver's sink already holds are skipped.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, BufReader, IoSlice, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::hash::xxh3_64;
use crossbeam_channel::{select, Receiver as Rx, Sender as Tx};

use crate::buf::{Pool, PooledBuf};
use crate::codec::Codec;
use crate::config::SenderConfig;
use crate::proto::{
    self, kind, Established, Header, Hello, Opener, Protection, ProtoError, Sealer, StreamHasher,
};
use crate::source::{ChunkReader, SourceSpec};
use crate::stats::{QueueStats, StageStats, StreamReport, Totals};

/// Test hooks that inject faults (used by the fault tests; `loci stream send --fault-corrupt`).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Flip one payload byte on the wire in the first transmission of these chunks.
    pub corrupt: BTreeSet<u64>,
    /// Flip one header byte (framing lost: the connection is dropped) on the first transmission.
    pub corrupt_header: BTreeSet<u64>,
    /// Record a wrong hash of the raw bytes for these chunks, as if their bytes had changed
    /// between compressing and hashing: every transmission is NACKed.
    pub wrong_hash: BTreeSet<u64>,
    /// Wait this long before the first transmission of every chunk (slows a test stream down so
    /// that a process can be killed in the middle of it).
    pub delay: Duration,
}

/// What a sender needs.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Receiver address, `HOST:PORT`.
    pub to: String,
    pub config: SenderConfig,
    pub secret: Vec<u8>,
    pub source: SourceSpec,
    /// Continue a transfer: skip what the receiver's sink already holds.
    pub resume: bool,
    pub progress: bool,
    /// Give up when a lost connection cannot be re-established for this long.
    pub reconnect_timeout: Duration,
    pub faults: Faults,
}

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{0}")]
    Source(String),
    #[error("cannot reach the receiver at {to}: {err}")]
    Connect { to: String, err: String },
    #[error("{0}")]
    Protocol(String),
    #[error(
        "the receiver's whole-stream checksum {theirs:016x} differs from the sender's {ours:016x}"
    )]
    Checksum { ours: u64, theirs: u64 },
    #[error("{0}")]
    Fatal(String),
    /// The receiver lost acknowledged chunks (a restart after a power loss, a damaged file): they
    /// are read from the source and sent again by a resume pass.
    #[error(
        "the receiver holds {held} of {total} chunks after acknowledging all of them (a sink \
         that does not survive a restart, e.g. memory, cannot be resumed; a file sink that lost \
         or damaged chunks is repaired by a resume pass)"
    )]
    Lost { held: u64, total: u64 },
    /// A frame from the receiver failed authentication (retried by the END exchange).
    #[error("{}", ProtoError::FrameAuth)]
    FrameAuth,
}

struct Frame {
    hdr: Header,
    payload: PooledBuf,
}

struct Entry {
    frame: Arc<Frame>,
    /// Connection it was last written to (None: waiting to be (re)sent).
    conn: Option<u64>,
    /// NACKs it got: the receiver decoded it to bytes that fail its hash.
    nacks: u32,
}

/// NACKs of one chunk after which the sender gives up: resending the same frame cannot help.
const MAX_NACKS: u32 = 8;

struct Shared {
    opts: SendOptions,
    hello: Hello,
    unacked: Mutex<HashMap<u64, Entry>>,
    window_tx: Tx<()>,
    /// Wakes the monitor at once when the last unacknowledged chunk is acknowledged or a thread
    /// fails, instead of at its next 10 ms tick (a tick is 3% of a 20-chunk loopback run).
    wake_tx: Tx<()>,
    wake_rx: Rx<()>,
    window_rx: Rx<()>,
    resend_tx: Tx<u64>,
    resend_rx: Rx<u64>,
    finished: AtomicBool,
    fatal: Mutex<Option<SendError>>,
    acked_chunks: AtomicU64,
    acked_bytes: AtomicU64,
    wire_bytes: AtomicU64,
    resent: AtomicU64,
    nacks: AtomicU64,
    reconnects: AtomicU64,
    /// Connections that ended since a chunk was last acknowledged (see [`Shared::lost`]).
    lost_without_progress: AtomicU64,
    next_conn: AtomicU64,
    sent_once: Mutex<BTreeSet<u64>>,
    /// The whole-stream checksum, fed with every chunk's hash as the compressing threads compute
    /// it (also of the chunks the receiver already holds, which they read and hash only).
    stream_hash: Mutex<StreamHasher>,
    /// Every chunk has been read (every compressing thread has finished).
    done_reading: AtomicBool,
    comp_stats: StageStats,
    send_stats: StageStats,
}

impl Shared {
    fn fail(&self, e: SendError) {
        let mut f = self.fatal.lock().unwrap();
        if f.is_none() {
            *f = Some(e);
        }
        self.finished.store(true, Relaxed);
        let _ = self.wake_tx.try_send(());
    }
    fn ack(&self, a: u64, b: u64) {
        let mut u = self.unacked.lock().unwrap();
        for s in keys_in(&u, a, b) {
            if let Some(e) = u.remove(&s) {
                let _ = self.window_rx.try_recv();
                self.acked_chunks.fetch_add(1, Relaxed);
                self.acked_bytes
                    .fetch_add(e.frame.hdr.raw_len as u64, Relaxed);
            }
        }
        if u.is_empty() {
            let _ = self.wake_tx.try_send(());
        }
        self.lost_without_progress.store(0, Relaxed);
    }
    /// A connection ended. A frame that fails authentication ends its connection, and so does a
    /// receiver that crashes; either way the sender reconnects and resends. When connections keep
    /// ending with nothing acknowledged in between, something on the path is altering frames (or
    /// the receiver fails every time): give up rather than loop for ever.
    fn lost(&self) {
        let limit = (2 * self.hello.conns as u64).max(16);
        let n = self.lost_without_progress.fetch_add(1, Relaxed) + 1;
        if n >= limit {
            self.fail(SendError::Protocol(format!(
                "{n} connections in a row ended with no chunk acknowledged in between: frames are \
                 failing authentication (something on the path is altering, replaying or \
                 reordering them) or the receiver fails on every connection (see its log)"
            )));
        }
    }
    /// Everything last written to connection `conn` goes back to the resend queue.
    fn requeue(&self, conn: u64) {
        let mut u = self.unacked.lock().unwrap();
        for (s, e) in u.iter_mut() {
            if e.conn == Some(conn) {
                e.conn = None;
                let _ = self.resend_tx.send(*s);
            }
        }
    }
    fn connect(&self, index: u16, resume: bool) -> Result<(TcpStream, Established), SendError> {
        let to = &self.opts.to;
        let cerr = |err: String| SendError::Connect {
            to: to.clone(),
            err,
        };
        let addr = to
            .to_socket_addrs()
            .map_err(|e| cerr(e.to_string()))?
            .next()
            .ok_or_else(|| cerr("no address".into()))?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| cerr(e.to_string()))?;
        s.set_nodelay(true).map_err(|e| cerr(e.to_string()))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| cerr(e.to_string()))?;
        let mut h = self.hello.clone();
        h.conn = index;
        h.resume = resume;
        let est = proto::client_handshake(&mut s, &self.opts.secret, &h).map_err(|e| match e {
            ProtoError::Io(e) => cerr(format!("during the handshake: {e}")),
            // The stream is live with another sender: retried until the reconnect timeout.
            e @ ProtoError::Busy(_) => cerr(format!("during the handshake: {e}")),
            e => SendError::Protocol(e.to_string()),
        })?;
        s.set_read_timeout(None).map_err(|e| cerr(e.to_string()))?;
        Ok((s, est))
    }
    /// Reconnects until the deadline; protocol refusals are fatal at once.
    fn reconnect(&self, index: u16) -> Option<(TcpStream, Established)> {
        let deadline = deadline_after(self.opts.reconnect_timeout);
        let mut wait = Duration::from_millis(20);
        loop {
            if self.finished.load(Relaxed) {
                return None;
            }
            match self.connect(index, true) {
                Ok((s, est)) => {
                    for &(a, b) in &est.have {
                        self.ack(a, b);
                    }
                    return Some((s, est));
                }
                Err(e @ SendError::Protocol(_)) => {
                    self.fail(e);
                    return None;
                }
                Err(e) if Instant::now() >= deadline => {
                    self.fail(e);
                    return None;
                }
                Err(_) => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_millis(500));
                }
            }
        }
    }
}

/// Streams the source to the receiver; returns the sender's report once the receiver confirmed
/// the whole-stream checksum.
pub fn send(mut opts: SendOptions) -> Result<StreamReport, SendError> {
    // A receiver that lost acknowledged chunks (restarted after a power loss: its resume found
    // them missing or damaged on disk) is repaired by running the transfer again as a resume,
    // which reads just those chunks from the source again. Bounded: a sink that keeps losing
    // chunks fails.
    let mut passes = 0;
    // One session for the whole process: the receiver takes the resume pass as the same sender.
    let session = u64::from_le_bytes(proto::nonce()[..8].try_into().unwrap());
    loop {
        match send_pass(opts.clone(), session) {
            Err(SendError::Lost { .. }) if passes < 3 => {
                passes += 1;
                opts.resume = true;
            }
            r => return r,
        }
    }
}

fn send_pass(opts: SendOptions, session: u64) -> Result<StreamReport, SendError> {
    let cfg = opts.config.clone();
    cfg.validate()
        .map_err(|e| SendError::Fatal(e.to_string()))?;
    crate::config::check_secret(&opts.secret).map_err(|e| SendError::Fatal(e.to_string()))?;
    let total_bytes = opts
        .source
        .total_bytes()
        .map_err(|e| SendError::Source(e.to_string()))?;
    let chunk = cfg.chunk_bytes as u64;
    let total_chunks = total_bytes.div_ceil(chunk);
    let transfer = opts
        .source
        .transfer_id(cfg.chunk_bytes)
        .map_err(|e| SendError::Source(e.to_string()))?;
    let hello = Hello {
        stream: cfg.stream,
        conn: 0,
        conns: cfg.send.count as u16,
        session,
        transfer,
        chunk_bytes: chunk,
        total_chunks,
        total_bytes,
        resume: opts.resume,
        codec: cfg.codec,
        protection: if cfg.encrypt {
            Protection::Encrypt
        } else if cfg.unauthenticated {
            Protection::Checksum
        } else {
            Protection::Auth
        },
    };
    let (window_tx, window_rx) = crossbeam_channel::bounded(cfg.window);
    let (resend_tx, resend_rx) = crossbeam_channel::unbounded();
    let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
    let here = crate::config::this_machine().map_err(|e| SendError::Fatal(e.to_string()))?;
    let planned = |name, stage| StageStats::planned(name, stage, &here).map_err(SendError::Fatal);
    let sh = Arc::new(Shared {
        comp_stats: planned("compress", &cfg.compress)?,
        send_stats: planned("send", &cfg.send)?,
        opts,
        hello,
        unacked: Mutex::new(HashMap::new()),
        window_tx,
        window_rx,
        wake_tx,
        wake_rx,
        resend_tx,
        resend_rx,
        finished: AtomicBool::new(false),
        fatal: Mutex::new(None),
        acked_chunks: AtomicU64::new(0),
        acked_bytes: AtomicU64::new(0),
        wire_bytes: AtomicU64::new(0),
        resent: AtomicU64::new(0),
        nacks: AtomicU64::new(0),
        reconnects: AtomicU64::new(0),
        lost_without_progress: AtomicU64::new(0),
        next_conn: AtomicU64::new(0),
        sent_once: Mutex::new(BTreeSet::new()),
        stream_hash: Mutex::new(StreamHasher::new()),
        done_reading: AtomicBool::new(false),
    });
    let started = Instant::now();
    // Open every connection first: the first tells us what the receiver already has.
    let mut conns = Vec::new();
    let mut have: BTreeSet<u64> = BTreeSet::new();
    // A receiver that is not up yet (or restarting) is waited for, up to the reconnect timeout.
    let deadline = deadline_after(sh.opts.reconnect_timeout);
    for j in 0..cfg.send.count {
        let (s, h) = loop {
            match sh.connect(j as u16, sh.opts.resume) {
                Ok(x) => break x,
                Err(e @ SendError::Connect { .. }) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        };
        if j == 0 {
            have = h.have.iter().flat_map(|&(a, b)| a..b).collect();
        }
        conns.push((s, h));
    }
    let skipped = have.len() as u64;
    let (frame_tx, frame_rx) = crossbeam_channel::bounded::<u64>(cfg.queue_depth);
    let q_frame = QueueStats::new("compress->send", cfg.queue_depth);
    let mut handles = Vec::new();
    // Compressing threads. Each takes the next chunk number and reads that chunk itself, as seed
    // 001's compressor threads "successively fetch sequential data chunks": no reader thread
    // hands raw chunks over: a file's chunk is compressed and hashed straight from its mapping
    // (the page cache), any other source's is read into a buffer on the compressor's node and is
    // still in that core's cache when it is compressed and hashed.
    let reader = Arc::new(
        sh.opts
            .source
            .open()
            .map_err(|e| SendError::Source(e.to_string()))?,
    );
    let claim = Arc::new(Claim {
        next: AtomicU64::new(0),
        total: total_chunks,
        have,
        running: AtomicUsize::new(cfg.compress.count),
    });
    for i in 0..cfg.compress.count {
        let (sh, tx, reader, claim) = (sh.clone(), frame_tx.clone(), reader.clone(), claim.clone());
        handles.push(spawn(&format!("loci-comp-{i}"), move || {
            if let Err(e) = sh.comp_stats.enter(i) {
                return sh.fail(SendError::Fatal(e));
            }
            compress_chunks(&sh, i, &reader, &claim, &tx);
            if claim.running.fetch_sub(1, Relaxed) == 1 {
                sh.done_reading.store(true, Relaxed);
            }
        })?);
    }
    drop(frame_tx);
    // Senders, one connection each.
    for (j, conn) in conns.into_iter().enumerate() {
        let (sh, rx) = (sh.clone(), frame_rx.clone());
        handles.push(spawn(&format!("loci-send-{j}"), move || {
            sender_loop(&sh, j, conn, rx)
        })?);
    }
    // Monitor until every chunk is read and acknowledged.
    let bar = progress_bar(sh.opts.progress, total_bytes);
    let frame_rx_probe = frame_rx.clone();
    drop(frame_rx);
    loop {
        if let Some(e) = sh.fatal.lock().unwrap().take() {
            sh.finished.store(true, Relaxed);
            drop(frame_rx_probe);
            return Err(e);
        }
        let done_reading = sh.done_reading.load(Relaxed);
        if done_reading && sh.unacked.lock().unwrap().is_empty() && frame_rx_probe.is_empty() {
            let acked = sh.acked_chunks.load(Relaxed) + skipped;
            if acked >= total_chunks {
                break;
            }
        }
        q_frame.sample(frame_rx_probe.len());
        if let Some(b) = &bar {
            b.set_position(sh.acked_bytes.load(Relaxed) + skipped * chunk);
        }
        let _ = sh.wake_rx.recv_timeout(Duration::from_millis(10));
    }
    sh.finished.store(true, Relaxed);
    drop(frame_rx_probe);
    // Wake every sending thread now rather than at its next 20 ms poll: a sequence number past
    // any stream is "acknowledged meanwhile" to them, and the loop then sees `finished`.
    for _ in 0..cfg.send.count {
        let _ = sh.resend_tx.send(u64::MAX);
    }
    for h in handles {
        let _ = h.join();
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let ours = {
        let h = sh.stream_hash.lock().unwrap();
        if h.hashed() != total_chunks {
            return Err(SendError::Fatal(format!(
                "internal: {} of {total_chunks} chunk hashes recorded at the end",
                h.hashed()
            )));
        }
        h.digest()
    };
    // End of stream on a control connection, retried across receiver restarts.
    let deadline = deadline_after(sh.opts.reconnect_timeout);
    // A forged or damaged END_ACK fails its tag and ends that connection: retried, but not for
    // ever.
    let mut auth_failures = 0;
    let theirs = loop {
        match end_exchange(&sh, ours) {
            Ok(v) => break v,
            Err(
                e @ (SendError::Protocol(_) | SendError::Checksum { .. } | SendError::Lost { .. }),
            ) => return Err(e),
            Err(e @ SendError::FrameAuth) => {
                auth_failures += 1;
                if auth_failures >= 3 {
                    return Err(SendError::Protocol(format!(
                        "the receiver's answer to END failed authentication {auth_failures} times \
                         (something on the path alters frames): {e}"
                    )));
                }
            }
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let totals = Totals {
        chunks: total_chunks,
        raw_bytes: sh.acked_bytes.load(Relaxed),
        wire_bytes: sh.wire_bytes.load(Relaxed),
        started,
    };
    let stages = [&sh.comp_stats, &sh.send_stats];
    Ok(StreamReport {
        verified: true,
        resent_chunks: sh.resent.load(Relaxed),
        nacks: sh.nacks.load(Relaxed),
        reconnects: sh.reconnects.load(Relaxed),
        skipped_chunks: skipped,
        ..StreamReport::from_totals("send", cfg.stream, totals, &stages, &[&q_frame], theirs)
    })
}

/// The chunk numbers the compressing threads take in turn.
struct Claim {
    next: AtomicU64,
    total: u64,
    /// Chunks the receiver already holds: read and hashed, not sent.
    have: BTreeSet<u64>,
    /// Compressing threads not finished yet.
    running: AtomicUsize,
}

/// The loop of compressing thread `i`: take the next chunk number, read the chunk, compress it,
/// hash it, keep it until acknowledged and queue it for sending; until every chunk is taken, the
/// transfer is finished, or something fails.
fn compress_chunks(sh: &Shared, i: usize, reader: &ChunkReader, claim: &Claim, tx: &Tx<u64>) {
    let chunk = sh.opts.config.chunk_bytes as u64;
    let total_bytes = sh.hello.total_bytes;
    let codec = sh.opts.config.codec;
    let node = sh.comp_stats.buffer_node(i);
    // One raw buffer, reused for every chunk that is copied (a mapped file's only after it
    // changed): it is free again once its chunk is compressed.
    let raw_pool = Pool::new(chunk as usize, node, 1);
    // Frames live until acknowledged: up to the whole window can be out.
    // Sized for LZ4's worst case, filled about half: pages fault in as written.
    let pool = Pool::lazy(Codec::bound(chunk as usize), node, sh.opts.config.window);
    match pool.probe() {
        Ok(b) => sh.comp_stats.saw_buffer(i, &b),
        Err(e) => return sh.fail(SendError::Fatal(format!("buffer: {e}"))),
    }
    let mut first = true;
    while !sh.finished.load(Relaxed) {
        let seq = claim.next.fetch_add(1, Relaxed);
        if seq >= claim.total {
            return;
        }
        let held = claim.have.contains(&seq);
        // A window slot first: blocks while `window` chunks are unacknowledged.
        if !held && sh.window_tx.send(()).is_err() {
            return;
        }
        let t0 = Instant::now();
        let off = seq * chunk;
        let len = (total_bytes - off).min(chunk) as usize;
        // The chunk's bytes are borrowed from the mapped file, or read into this thread's raw
        // buffer (on its node), free again once the chunk is compressed.
        let raw = || {
            let b = raw_pool.get()?;
            if first {
                sh.comp_stats.saw_buffer(i, &b);
                first = false;
            }
            Ok(b)
        };
        let reading = |e| SendError::Source(format!("reading chunk {seq}: {e}"));
        if held {
            // The receiver holds it already: only its hash, for the whole-stream checksum.
            match reader.with_chunk(seq, off, len, raw, xxh3_64) {
                Ok(h) => sh.stream_hash.lock().unwrap().add(seq, h),
                Err(e) => return sh.fail(reading(e)),
            }
            sh.comp_stats.busy_since(t0);
            continue;
        }
        let encoded = reader.with_chunk(seq, off, len, raw, |src| {
            let mut out = pool.get()?;
            let (flags, n) = match codec.compress(src, out.spare()) {
                Ok(n) if n < src.len() => (proto::FLAG_LZ4, n),
                _ => {
                    out.spare()[..src.len()].copy_from_slice(src);
                    (0, src.len())
                }
            };
            out.set_len(n);
            Ok::<_, std::io::Error>((out, flags, xxh3_64(src)))
        });
        let (out, flags, mut c) = match encoded {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => return sh.fail(SendError::Fatal(format!("buffer: {e}"))),
            Err(e) => return sh.fail(reading(e)),
        };
        if sh.opts.faults.wrong_hash.contains(&seq) {
            c ^= 1;
        }
        let hdr = Header {
            kind: kind::DATA,
            flags,
            raw_len: len as u32,
            comp_len: out.len() as u32,
            a: seq,
            b: 0, // set when sealed: a checksum, or nothing when the tag covers it
            c,
        };
        sh.stream_hash.lock().unwrap().add(seq, c);
        sh.unacked.lock().unwrap().insert(
            seq,
            Entry {
                frame: Arc::new(Frame { hdr, payload: out }),
                conn: None,
                nacks: 0,
            },
        );
        sh.comp_stats.saw_cpu(i);
        sh.comp_stats.chunks.fetch_add(1, Relaxed);
        sh.comp_stats.busy_since(t0);
        if tx.send(seq).is_err() {
            return;
        }
    }
}

fn spawn(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, SendError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| SendError::Fatal(format!("spawning {name}: {e}")))
}

fn progress_bar(on: bool, total: u64) -> Option<indicatif::ProgressBar> {
    if !on {
        return None;
    }
    let b = indicatif::ProgressBar::new(total);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} acknowledged ({bytes_per_sec}, eta {eta})",
        )
        .expect("template"),
    );
    Some(b)
}

/// Sends END and waits for the receiver's verdict.
fn end_exchange(sh: &Arc<Shared>, ours: u64) -> Result<u64, SendError> {
    let (mut s, mut est) = sh.connect(sh.hello.conns, true)?;
    let n: u64 = est.have.iter().map(|(a, b)| b - a).sum();
    if n < sh.hello.total_chunks {
        return Err(SendError::Lost {
            held: n,
            total: sh.hello.total_chunks,
        });
    }
    let cerr = |e: String| SendError::Connect {
        to: sh.opts.to.clone(),
        err: e,
    };
    let h = sh.hello.clone();
    let end = est.seal.control(Header::control(
        kind::END,
        h.total_chunks,
        h.total_bytes,
        ours,
    ));
    s.write_all(&end).map_err(|e| cerr(e.to_string()))?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let mut r = BufReader::new(s);
    loop {
        let f = est.open.read_control(&mut r).map_err(|e| match e {
            ProtoError::FrameAuth => SendError::FrameAuth,
            e => cerr(e.to_string()),
        })?;
        if f.kind == kind::END_ACK {
            return match f.b {
                0 if f.a == ours => Ok(f.a),
                2 => Err(SendError::Protocol(
                    "the receiver reports chunks missing at the end of the stream".into(),
                )),
                _ => Err(SendError::Checksum { ours, theirs: f.a }),
            };
        }
    }
}

/// Reads ACK/NACK frames of one connection until it closes or a frame fails its checks.
fn ack_loop(sh: Arc<Shared>, conn: u64, s: TcpStream, mut open: Opener, dead: Arc<AtomicBool>) {
    let mut r = BufReader::new(s.try_clone().expect("socket clone"));
    let total = sh.hello.total_chunks;
    let why = loop {
        match open.read_control(&mut r) {
            // Ranges come from the receiver: a range outside the stream is a broken peer.
            Ok(h) if h.kind == kind::ACK && h.a < h.b && h.b <= total => sh.ack(h.a, h.b),
            Ok(h) if h.kind == kind::NACK && h.a < total => {
                sh.nacks.fetch_add(1, Relaxed);
                let mut u = sh.unacked.lock().unwrap();
                if let Some(e) = u.get_mut(&h.a) {
                    e.nacks += 1;
                    if e.nacks >= MAX_NACKS {
                        drop(u);
                        sh.fail(SendError::Source(format!(
                            "chunk {} failed its checksum at the receiver {MAX_NACKS} times: its \
                             bytes change while they are read (the source written through a \
                             mapping during the send?) or memory on one side is failing",
                            h.a
                        )));
                        continue;
                    }
                    e.conn = None;
                    let _ = sh.resend_tx.send(h.a);
                }
            }
            Ok(h) => {
                break format!(
                    "frame type {} (a {}, b {}) outside the stream's {total} chunks or not \
                     expected from a receiver",
                    h.kind, h.a, h.b
                )
            }
            Err(e) => break e.to_string(),
        }
    };
    if !sh.finished.load(Relaxed) {
        log(&format!("connection {conn} ended: {why}"));
    }
    dead.store(true, Relaxed);
    let _ = s.shutdown(Shutdown::Both);
    sh.requeue(conn);
}

fn log(msg: &str) {
    if std::env::var_os("LOCI_STREAM_DEBUG").is_some() {
        eprintln!("loci-stream send: {msg}");
    }
}

/// A live connection of a sending thread.
struct Writer {
    id: u64,
    s: TcpStream,
    seal: Sealer,
    dead: Arc<AtomicBool>,
}

fn sender_loop(sh: &Arc<Shared>, j: usize, first: (TcpStream, Established), rx: Rx<u64>) {
    if let Err(e) = sh.send_stats.enter(j) {
        return sh.fail(SendError::Fatal(e));
    }
    let mut conn = Some(first);
    let mut writer: Option<Writer> = None;
    let mut queue_open = true;
    // Encrypted frames are sealed here: the frame itself stays plain for resends on other
    // connections (other keys).
    let mut scratch: Vec<u8> = Vec::new();
    loop {
        if sh.finished.load(Relaxed) {
            // Close the connection both ways: its ack reader (which holds a clone of the socket)
            // returns, and the receiver sees the connection end now, not when the process exits.
            if let Some(w) = writer {
                let _ = w.s.shutdown(Shutdown::Both);
            }
            return;
        }
        if writer.as_ref().is_some_and(|w| w.dead.load(Relaxed)) {
            writer = None; // the ack reader saw the connection die
            sh.lost();
        }
        if writer.is_none() {
            let (s, est) = match conn.take() {
                Some(c) => c,
                None => {
                    sh.reconnects.fetch_add(1, Relaxed);
                    match sh.reconnect(j as u16) {
                        Some(c) => c,
                        None => return,
                    }
                }
            };
            let id = sh.next_conn.fetch_add(1, Relaxed);
            let dead = Arc::new(AtomicBool::new(false));
            let (sh2, s2, d2) = (sh.clone(), s.try_clone(), dead.clone());
            let open = est.open;
            match s2 {
                Ok(s2) => {
                    std::thread::spawn(move || ack_loop(sh2, id, s2, open, d2));
                }
                Err(_) => continue,
            }
            writer = Some(Writer {
                id,
                s,
                seal: est.seal,
                dead,
            });
        }
        // Next chunk: resends first.
        let seq = match sh.resend_rx.try_recv() {
            Ok(s) => Some(s),
            Err(_) if queue_open => select! {
                recv(sh.resend_rx) -> s => s.ok(),
                recv(rx) -> s => match s {
                    Ok(s) => Some(s),
                    Err(_) => { queue_open = false; None }
                },
                default(Duration::from_millis(20)) => None,
            },
            Err(_) => sh.resend_rx.recv_timeout(Duration::from_millis(20)).ok(),
        };
        let Some(seq) = seq else { continue };
        let w = writer.as_mut().expect("connected");
        let frame = {
            let mut u = sh.unacked.lock().unwrap();
            match u.get_mut(&seq) {
                Some(e) => {
                    e.conn = Some(w.id);
                    e.frame.clone()
                }
                None => continue, // acknowledged meanwhile
            }
        };
        let first_time = sh.sent_once.lock().unwrap().insert(seq);
        if first_time && !sh.opts.faults.delay.is_zero() {
            std::thread::sleep(sh.opts.faults.delay);
        }
        let t0 = Instant::now();
        if !first_time {
            sh.resent.fetch_add(1, Relaxed);
        }
        let (mut hdr, p) = w.seal.seal(frame.hdr, &frame.payload, &mut scratch);
        let faults = &sh.opts.faults;
        let flip_payload = first_time && faults.corrupt.contains(&seq);
        if first_time && faults.corrupt_header.contains(&seq) {
            hdr[20] ^= 0x40;
        }
        // Header and payload in one gathered write (no copy into a staging buffer, no separate
        // header segment); the kernel copies the payload straight from the frame's buffer.
        let r = if flip_payload {
            let k = p.len() / 2;
            write_all_vectored(&mut w.s, &[&hdr, &p[..k], &[p[k] ^ 0x01], &p[k + 1..]])
        } else {
            write_all_vectored(&mut w.s, &[&hdr, p])
        };
        sh.send_stats.saw_cpu(j);
        sh.send_stats.busy_since(t0);
        match r {
            Ok(()) => {
                sh.wire_bytes.fetch_add(p.len() as u64, Relaxed);
                sh.send_stats.chunks.fetch_add(1, Relaxed);
            }
            Err(_) => {
                let w = writer.take().expect("connected");
                w.dead.store(true, Relaxed);
                let _ = w.s.shutdown(Shutdown::Both);
                sh.requeue(w.id);
                sh.lost();
            }
        }
    }
}

/// Writes every byte of `parts`, in order, with as few `writev` calls as the socket allows
/// (`Write::write_all_vectored` is not stable yet).
fn write_all_vectored(w: &mut TcpStream, parts: &[&[u8]]) -> io::Result<()> {
    let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    let mut first = 0;
    while first < parts.len() {
        let slices: Vec<IoSlice> = parts[first..].iter().map(|p| IoSlice::new(p)).collect();
        let mut n = match w.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while first < parts.len() && n >= parts[first].len() {
            n -= parts[first].len();
            first += 1;
        }
        if n > 0 {
            parts[first] = &parts[first][n..];
        }
    }
    Ok(())
}

/// The keys of `map` inside `a..b`. An ACK's range comes from the peer: walking it number by
/// number would let one `ACK 0..u64::MAX` frame spin for ever holding the lock, so the shorter
/// of the range and the map is walked.
fn keys_in<V>(map: &HashMap<u64, V>, a: u64, b: u64) -> Vec<u64> {
    if b.saturating_sub(a) <= map.len() as u64 {
        (a..b).filter(|s| map.contains_key(s)).collect()
    } else {
        map.keys().copied().filter(|s| (a..b).contains(s)).collect()
    }
}

/// `timeout` from now; a timeout beyond what an `Instant` can hold means no deadline in practice.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(u32::MAX as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ack_of_a_huge_range_only_walks_the_chunks_in_flight() {
        let map: HashMap<u64, ()> = [3, 7, 1 << 40].into_iter().map(|k| (k, ())).collect();
        let mut all = keys_in(&map, 0, u64::MAX);
        all.sort_unstable();
        assert_eq!(all, vec![3, 7, 1 << 40]);
        assert_eq!(keys_in(&map, 2, 4), vec![3]);
        assert!(keys_in(&map, 8, 8).is_empty());
        assert!(keys_in(&map, 9, 2).is_empty());
    }
}
