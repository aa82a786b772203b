//! The receiving side: accept authenticated connections, receive frames (recv stage), decompress
//! and store them (decompress stage), make them durable and acknowledge them (committer), and
//! verify the whole-stream checksum at the end. Several streams at once, each on its own cores.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver as Rx, Sender as Tx};
use xxhash_rust::xxh3::xxh3_64;

use crate::buf::{Pool, PooledBuf};
use crate::codec::{Codec, CodecError};
use crate::config::{ReceiverConfig, StreamPart};
use crate::proto::{
    self, kind, Header, Hello, Opener, Protection, ProtoError, Sealer, StreamHasher,
};
use crate::sink::{Sink, SinkSpec, Transfer};
use crate::stats::{pin, QueueStats, StageStats, StreamReport, Totals};

/// What a receiver needs.
#[derive(Clone)]
pub struct RecvOptions {
    pub config: ReceiverConfig,
    pub secret: Vec<u8>,
    pub sink: SinkSpec,
    /// Show live progress on stderr.
    pub progress: bool,
    /// Return after this many streams ended (default: every configured stream, or 1).
    pub streams: Option<usize>,
    /// Before confirming a stream, read every chunk back from the file sink (page cache dropped
    /// first) and check the whole-stream checksum over what is on disk.
    pub verify_on_disk: bool,
}

/// A bound receiver.
pub struct Receiver {
    listener: TcpListener,
    opts: RecvOptions,
    stop: Arc<AtomicBool>,
}

/// A receiver could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    #[error("cannot listen on {addr}: {err}")]
    Listen { addr: String, err: io::Error },
    #[error("{0}")]
    Fatal(String),
    #[error("stopped before every stream ended")]
    Stopped,
}

impl Receiver {
    /// Binds the listening socket (port 0 picks a free port; see [`Receiver::local_addr`]).
    pub fn bind(addr: &str, opts: RecvOptions) -> Result<Self, RecvError> {
        crate::config::check_secret(&opts.secret).map_err(|e| RecvError::Fatal(e.to_string()))?;
        opts.config
            .validate()
            .map_err(|e| RecvError::Fatal(e.to_string()))?;
        let listener = TcpListener::bind(addr).map_err(|err| RecvError::Listen {
            addr: addr.into(),
            err,
        })?;
        Ok(Receiver {
            listener,
            opts,
            stop: Arc::new(AtomicBool::new(false)),
        })
    }
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound socket")
    }
    /// Setting this flag makes [`Receiver::run`] return.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Serves until the expected number of streams ended; returns one report per stream.
    pub fn run(self) -> Result<Vec<StreamReport>, RecvError> {
        let want = self
            .opts
            .streams
            .unwrap_or(self.opts.config.streams.len().max(1));
        let shared = Arc::new(Shared {
            opts: self.opts.clone(),
            streams: Mutex::new(HashMap::new()),
            reports: Mutex::new(Vec::new()),
            ended: Condvar::new(),
            fatal: Mutex::new(None),
            live: AtomicUsize::new(0),
        });
        self.listener
            .set_nonblocking(true)
            .map_err(|e| RecvError::Fatal(e.to_string()))?;
        let bar = progress_bar(self.opts.progress);
        loop {
            if self.stop.load(Relaxed) {
                return Err(RecvError::Stopped);
            }
            if let Some(f) = shared.fatal.lock().unwrap().take() {
                return Err(RecvError::Fatal(f));
            }
            if shared.reports.lock().unwrap().len() >= want {
                break;
            }
            match self.listener.accept() {
                Ok((s, peer)) => {
                    // A cap on connections (handshaking or streaming): a flood of idle or
                    // half-open connections cannot exhaust threads or memory.
                    let max = shared.opts.config.max_connections;
                    if shared.live.load(Relaxed) >= max {
                        log(&format!(
                            "{peer}: closed at once, {max} connections are open (max_connections)"
                        ));
                        continue;
                    }
                    shared.live.fetch_add(1, Relaxed);
                    let sh = shared.clone();
                    let spawned =
                        std::thread::Builder::new()
                            .name("loci-recv".into())
                            .spawn(move || {
                                if let Err(e) = handle(&sh, s) {
                                    log(&format!("connection from {peer} ended: {e}"));
                                }
                                sh.live.fetch_sub(1, Relaxed);
                            });
                    if let Err(e) = spawned {
                        // That connection alone is lost (the socket closes with the closure);
                        // its sender reconnects.
                        shared.live.fetch_sub(1, Relaxed);
                        log(&format!("{peer}: no thread for the connection: {e}"));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Up to 10 ms for the next connection, returning as soon as one arrives (a
                    // plain sleep delayed every connect, the END exchange's included).
                    wait_readable(&self.listener, 10);
                    let st = shared.streams.lock().unwrap();
                    let mut done = 0;
                    for s in st.values() {
                        s.queue_stats.sample(s.jobs.len());
                        done += s.committed_bytes.load(Relaxed);
                    }
                    if let Some(b) = &bar {
                        b.set_position(done);
                    }
                }
                Err(e) => return Err(RecvError::Fatal(format!("accept: {e}"))),
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        let mut r = shared.reports.lock().unwrap().clone();
        r.sort_by_key(|r| r.stream);
        Ok(r)
    }
}

/// Waits until the listener has a connection to accept, at most `ms` milliseconds.
fn wait_readable(l: &TcpListener, ms: i32) {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: l.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call. Errors (EINTR) just end the wait.
    unsafe { libc::poll(&mut p, 1, ms) };
}

fn progress_bar(on: bool) -> Option<indicatif::ProgressBar> {
    if !on {
        return None;
    }
    let b = indicatif::ProgressBar::new_spinner();
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} received {bytes} ({bytes_per_sec}) in {elapsed}",
        )
        .expect("template"),
    );
    Some(b)
}

fn log(msg: &str) {
    if std::env::var_os("LOCI_STREAM_DEBUG").is_some() {
        eprintln!("loci-stream recv: {msg}");
    }
}

struct Shared {
    opts: RecvOptions,
    streams: Mutex<HashMap<u32, Arc<StreamState>>>,
    reports: Mutex<Vec<StreamReport>>,
    ended: Condvar,
    fatal: Mutex<Option<String>>,
    /// Connections being served.
    live: AtomicUsize,
}

struct Job {
    seq: u64,
    hdr: Header,
    payload: PooledBuf,
    /// Where the payload starts in `payload` (after the decrypted chunk hash, encrypted frames).
    off: usize,
}

/// The write half of a connection and the key that seals what goes out on it. Control frames
/// come from several threads; the mutex keeps their order and the frame counter in step.
struct Conn {
    s: TcpStream,
    seal: Sealer,
}

impl Conn {
    fn send(&mut self, h: Header) -> io::Result<()> {
        let f = self.seal.control(h);
        self.s.write_all(&f)
    }
}

/// Everything about one stream on the receiver.
struct StreamState {
    id: u32,
    part: StreamPart,
    /// The sender session the stream belongs to; a resuming sender takes it over once the old
    /// one is gone.
    session: AtomicU64,
    t: Transfer,
    codec: Codec,
    sink: Sink,
    jobs: Tx<Job>,
    queue_stats: QueueStats,
    /// Committed (durable, acknowledged) chunks; and chunks between receipt and commit.
    state: Mutex<Progress>,
    changed: Condvar,
    committed_bytes: AtomicU64,
    hasher: Mutex<OrderedHasher>,
    /// Write halves of live connections (acks, nacks go to any of them).
    conns: Mutex<Vec<(u64, Arc<Mutex<Conn>>)>>,
    /// When a connection last arrived or ended (a stream with no connection for a while may be
    /// replaced by a fresh sender).
    last_seen: Mutex<Instant>,
    next_conn: AtomicU64,
    recv_stats: StageStats,
    dec_stats: StageStats,
    commit_stats: StageStats,
    wire_bytes: AtomicU64,
    nacks: AtomicU64,
    prior: u64,
    started: Instant,
    ended: AtomicBool,
}

#[derive(Default)]
struct Progress {
    committed: BTreeSet<u64>,
    inflight: BTreeSet<u64>,
}

/// The whole-stream checksum ([`StreamHasher`]) of what this receiver holds: fed with each chunk's
/// hash once its decoded data passed the check against the frame's `c`; chunks the sink held
/// before a restart come with the hashes the journal recorded (re-verified on disk when the sink
/// was opened).
struct OrderedHasher {
    h: StreamHasher,
}

impl StreamState {
    fn send_control(&self, h: Header) {
        let conns = self.conns.lock().unwrap().clone();
        if conns.is_empty() {
            return; // the sender resends after it reconnects
        }
        let start = self.next_conn.fetch_add(1, Relaxed) as usize;
        for k in 0..conns.len() {
            let (id, c) = &conns[(start + k) % conns.len()];
            if c.lock().unwrap().send(h).is_ok() {
                return;
            }
            self.conns.lock().unwrap().retain(|(i, _)| i != id);
        }
    }

    fn expected_len(&self, seq: u64) -> u64 {
        (self.t.total_bytes - seq * self.t.chunk_bytes).min(self.t.chunk_bytes)
    }

    fn report(&self, verified: bool, checksum: u64) -> StreamReport {
        let secs = self.started.elapsed().as_secs_f64();
        let raw = self.committed_bytes.load(Relaxed);
        let wire = self.wire_bytes.load(Relaxed);
        let stages = vec![
            self.recv_stats.report(secs),
            self.dec_stats.report(secs),
            self.commit_stats.report(secs),
        ];
        let totals = Totals {
            chunks: self.t.total_chunks,
            raw_bytes: raw,
            wire_bytes: wire,
            seconds: secs,
        };
        let queues = vec![self.queue_stats.report()];
        StreamReport {
            verified,
            nacks: self.nacks.load(Relaxed),
            skipped_chunks: self.prior,
            ..StreamReport::from_totals("recv", self.id, totals, stages, queues, checksum)
        }
    }
}

fn refuse(s: &mut TcpStream, msg: &str) -> io::Error {
    let _ = proto::refuse(s, msg);
    log(msg);
    io::Error::other(msg.to_string())
}

/// A connection during its handshake: every read and write gets only what is left of one
/// deadline, so a peer trickling a byte at a time cannot hold a thread past it.
struct Deadline<'a> {
    s: &'a mut TcpStream,
    until: Instant,
}

impl Deadline<'_> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the handshake did not complete in time (handshake_timeout_secs)",
            ));
        }
        Ok(left)
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.s.set_read_timeout(Some(left))?;
        self.s.read(buf)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.s.set_write_timeout(Some(left))?;
        self.s.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

/// The weakest frame protection this receiver accepts.
fn required(cfg: &ReceiverConfig) -> Protection {
    if cfg.encrypt {
        Protection::Encrypt
    } else if cfg.unauthenticated {
        Protection::Checksum
    } else {
        Protection::Auth
    }
}

/// One connection: handshake, then the recv stage loop.
fn handle(sh: &Arc<Shared>, mut s: TcpStream) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    let cfg = &sh.opts.config;
    let until = Instant::now() + Duration::from_secs(cfg.handshake_timeout_secs);
    let mut d = Deadline { s: &mut s, until };
    let (hello, challenge, cn) = match proto::server_hello(&mut d, &sh.opts.secret) {
        Ok(x) => x,
        Err(e) => {
            log(&format!("handshake failed: {e}"));
            return Ok(());
        }
    };
    let need = required(cfg);
    if hello.protection < need {
        let msg = format!(
            "this receiver requires {} frames, the sender asked for {} ({})",
            need.name(),
            hello.protection.name(),
            if need == Protection::Encrypt {
                "start the sender with --encrypt"
            } else {
                "start the sender without --unauthenticated, or the receiver with \
                 --unauthenticated on an isolated link"
            }
        );
        return Err(refuse(d.s, &msg));
    }
    let st = match stream_for(sh, &hello) {
        Ok(st) => st,
        Err(Refusal { busy: true, msg }) => {
            let _ = proto::refuse_busy(d.s, &msg);
            log(&msg);
            return Err(io::Error::other(msg));
        }
        Err(Refusal { msg, .. }) => return Err(refuse(d.s, &msg)),
    };
    let have = proto::to_ranges(st.state.lock().unwrap().committed.iter().copied());
    let (seal, open) =
        proto::server_accept(&mut d, &sh.opts.secret, &hello, &challenge, &cn, &have)?;
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    let conn_id = st.next_conn.fetch_add(1, Relaxed) + (1 << 32);
    let w = Arc::new(Mutex::new(Conn {
        s: s.try_clone()?,
        seal,
    }));
    st.conns.lock().unwrap().push((conn_id, w.clone()));
    *st.last_seen.lock().unwrap() = Instant::now();
    let i = hello.conn as usize % st.part.recv.count;
    if let Err(e) = pin("recv", i, st.part.recv.cpus_of(i), st.part.recv.mem_of(i)) {
        *sh.fatal.lock().unwrap() = Some(e.clone());
        return Err(io::Error::other(e));
    }
    st.recv_stats.saw_affinity(i);
    let r = recv_loop(
        sh,
        &st,
        i,
        &mut BufReader::with_capacity(1 << 16, s),
        open,
        &w,
    );
    st.conns.lock().unwrap().retain(|(id, _)| *id != conn_id);
    *st.last_seen.lock().unwrap() = Instant::now();
    r
}

/// Why a hello is refused: for good, or for now (`busy`: the sender may retry).
struct Refusal {
    busy: bool,
    msg: String,
}

impl From<String> for Refusal {
    fn from(msg: String) -> Self {
        Refusal { busy: false, msg }
    }
}

/// Finds or creates the state of the hello's stream.
fn stream_for(sh: &Arc<Shared>, h: &Hello) -> Result<Arc<StreamState>, Refusal> {
    let cfg = &sh.opts.config;
    if h.chunk_bytes == 0 || h.chunk_bytes > cfg.max_chunk_bytes {
        return Err(format!(
            "chunk size {} is outside this receiver's limit 1..={} (max_chunk_bytes)",
            h.chunk_bytes, cfg.max_chunk_bytes
        )
        .into());
    }
    if h.total_chunks != h.total_bytes.div_ceil(h.chunk_bytes) || h.conns == 0 || h.conn > h.conns {
        return Err(format!(
            "inconsistent hello: {} bytes in {} chunks of {}, connection {} of {}",
            h.total_bytes, h.total_chunks, h.chunk_bytes, h.conn, h.conns
        )
        .into());
    }
    let part = cfg.part(h.stream, h.conns as usize)?;
    let mut streams = sh.streams.lock().unwrap();
    if let SinkSpec::File(path) = &sh.opts.sink {
        // One file holds one stream: a second stream id would interleave its chunks into it, or
        // truncate it.
        if let Some(other) = streams.keys().find(|&&id| id != h.stream) {
            return Err(format!(
                "the sink {} holds stream {other}; a FILE sink takes one stream, so stream {} is \
                 refused (give the receiver a directory, DIR/, for one file per stream)",
                path.display(),
                h.stream
            )
            .into());
        }
    }
    if let Some(st) = streams.get(&h.stream) {
        let same = st.t.transfer == h.transfer
            && st.t.chunk_bytes == h.chunk_bytes
            && st.t.total_bytes == h.total_bytes;
        if st.session.load(Relaxed) == h.session {
            if !same {
                return Err(format!(
                    "stream {} is receiving another transfer in this session",
                    h.stream
                )
                .into());
            }
            return Ok(st.clone()); // another connection of the same sender
        }
        // Another sender. Acknowledgements go to any connection of a stream, so two senders must
        // never share one: while the current one has connections or chunks on their way to the
        // sink, the newcomer is asked to retry.
        let active = !st.conns.lock().unwrap().is_empty()
            || !st.state.lock().unwrap().inflight.is_empty()
            || !st.jobs.is_empty();
        let ended = st.ended.load(Relaxed);
        let busy = |what: &str| Refusal {
            busy: true,
            msg: format!(
                "stream {} is live with another sender (transfer {:016x}); {what} is refused \
                 until that one ends or has had no connection for {} s",
                h.stream, st.t.transfer, cfg.handshake_timeout_secs
            ),
        };
        if h.resume && same {
            if active && !ended {
                return Err(busy("a resume from another sender session"));
            }
            // The old sender is gone (a restarted sender resumes the same data), or the stream
            // finished and answers from its final state: this sender takes it over.
            st.session.store(h.session, Relaxed);
            return Ok(st.clone());
        }
        if !ended {
            // A new transfer (or a fresh start) would truncate the sink while this one's threads
            // still write: refused until it ends or its sender is gone for a while.
            let idle = st.last_seen.lock().unwrap().elapsed();
            if active || idle < Duration::from_secs(cfg.handshake_timeout_secs) {
                return Err(busy(&format!(
                    "a {} of transfer {:016x}",
                    if h.resume { "resume" } else { "fresh start" },
                    h.transfer
                )));
            }
            st.ended.store(true, Relaxed);
        }
    }
    let t = Transfer {
        transfer: h.transfer,
        chunk_bytes: h.chunk_bytes,
        total_chunks: h.total_chunks,
        total_bytes: h.total_bytes,
    };
    let (sink, resumed) = Sink::open(&sh.opts.sink, h.stream, t, h.resume, cfg.sync)
        .map_err(|e| format!("cannot open the sink of stream {}: {e}", h.stream))?;
    if !resumed.repaired.is_empty() {
        eprintln!(
            "loci stream recv: stream {}: {} journaled chunk(s) no longer match their hash on disk \
             (lost or damaged since they were acknowledged); asking the sender for them again: {}",
            h.stream,
            resumed.repaired.len(),
            loci_topo::IdSet::from_iter(resumed.repaired.iter().map(|&s| s as u32))
        );
    }
    let prior = resumed.have;
    let (tx, rx) = crossbeam_channel::bounded(part.queue_depth);
    let st = Arc::new(StreamState {
        id: h.stream,
        session: AtomicU64::new(h.session),
        t,
        codec: h.codec,
        sink,
        jobs: tx,
        queue_stats: QueueStats::new("recv->decompress", part.queue_depth),
        state: Mutex::new(Progress {
            committed: prior.iter().map(|&(seq, _)| seq).collect(),
            inflight: BTreeSet::new(),
        }),
        changed: Condvar::new(),
        committed_bytes: AtomicU64::new(0),
        hasher: Mutex::new(OrderedHasher {
            h: StreamHasher::new(),
        }),
        conns: Mutex::new(vec![]),
        last_seen: Mutex::new(Instant::now()),
        next_conn: AtomicU64::new(0),
        recv_stats: StageStats::new("recv", &part.recv),
        dec_stats: StageStats::new("decompress", &part.decompress),
        commit_stats: StageStats::new("commit", &crate::config::Stage::os(1)),
        wire_bytes: AtomicU64::new(0),
        nacks: AtomicU64::new(0),
        prior: prior.len() as u64,
        started: Instant::now(),
        ended: AtomicBool::new(false),
        part,
    });
    let committed: u64 = prior.iter().map(|&(s, _)| st.expected_len(s)).sum();
    st.committed_bytes.store(committed, Relaxed);
    // Decompressors and the committer.
    let (ctx, crx) = crossbeam_channel::unbounded::<(u64, u64)>();
    for i in 0..st.part.decompress.count {
        let (st2, rx2, ctx2, sh2) = (st.clone(), rx.clone(), ctx.clone(), sh.clone());
        std::thread::Builder::new()
            .name(format!("loci-dec-{}-{i}", st.id))
            .spawn(move || {
                if let Err(e) = decompress_loop(&st2, i, rx2, ctx2) {
                    *sh2.fatal.lock().unwrap() = Some(e);
                }
            })
            .map_err(|e| e.to_string())?;
    }
    drop(ctx);
    let (st2, sh2) = (st.clone(), sh.clone());
    std::thread::Builder::new()
        .name(format!("loci-commit-{}", st.id))
        .spawn(move || {
            if let Err(e) = commit_loop(&st2, crx) {
                *sh2.fatal.lock().unwrap() = Some(format!(
                    "stream {}: cannot make chunks durable: {e}",
                    st2.id
                ));
            }
        })
        .map_err(|e| e.to_string())?;
    // What the sink already had enters the whole-stream checksum with its journaled hash.
    {
        let mut hs = st.hasher.lock().unwrap();
        for &(seq, hash) in &prior {
            hs.h.add(seq, hash);
        }
    }
    streams.insert(h.stream, st.clone());
    Ok(st)
}

fn recv_loop(
    sh: &Arc<Shared>,
    st: &Arc<StreamState>,
    i: usize,
    r: &mut BufReader<TcpStream>,
    mut open: Opener,
    w: &Arc<Mutex<Conn>>,
) -> io::Result<()> {
    // Sized for LZ4's worst case (and an encrypted frame's chunk hash), filled about half: pages
    // fault in as written.
    let pool = Pool::lazy(
        Codec::bound(st.t.chunk_bytes as usize) + proto::SEALED_EXTRA,
        st.part.recv.mem_of(i),
        st.part.queue_depth + 2,
    );
    let proto_err = |e: ProtoError| io::Error::other(e.to_string());
    let protection = open.protection();
    st.recv_stats.saw_buffer(i, &*pool.probe()?);
    loop {
        let f = match open.read_header(r) {
            Ok(f) => f,
            Err(ProtoError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(proto_err(e)),
        };
        let t0 = Instant::now();
        match f.hdr.kind {
            kind::DATA => {
                // Limits first, on the header as read: nothing is allocated or read beyond them.
                f.hdr
                    .check_data(st.t.chunk_bytes, st.t.total_chunks)
                    .map_err(proto_err)?;
                let mut buf = pool.get()?;
                buf.set_len(f.wire_len(protection));
                r.read_exact(&mut buf)?;
                st.wire_bytes.fetch_add(buf.len() as u64, Relaxed);
                st.recv_stats.saw_cpu(i);
                let (hdr, off) = match open.open(&f, &mut buf) {
                    Ok(x) => x,
                    Err(ProtoError::PayloadCheck) => {
                        // Checksum mode: the header checked out, so framing holds; ask again.
                        let seq = f.hdr.a;
                        st.nacks.fetch_add(1, Relaxed);
                        log(&format!(
                            "chunk {seq}: payload checksum mismatch, asking again"
                        ));
                        w.lock()
                            .unwrap()
                            .send(Header::control(kind::NACK, seq, 1, 0))?;
                        st.recv_stats.busy_since(t0);
                        continue;
                    }
                    Err(e) => return Err(proto_err(e)),
                };
                let seq = hdr.a;
                if hdr.raw_len as u64 != st.expected_len(seq) {
                    return Err(proto_err(ProtoError::Limit(format!(
                        "chunk {seq} has {} raw bytes, the stream's layout says {}",
                        hdr.raw_len,
                        st.expected_len(seq)
                    ))));
                }
                {
                    let mut p = st.state.lock().unwrap();
                    if p.committed.contains(&seq) {
                        drop(p);
                        w.lock()
                            .unwrap()
                            .send(Header::control(kind::ACK, seq, seq + 1, 0))?;
                        st.recv_stats.busy_since(t0);
                        continue;
                    }
                    if !p.inflight.insert(seq) {
                        st.recv_stats.busy_since(t0);
                        continue; // a resend of a chunk on its way to the sink
                    }
                }
                st.recv_stats.chunks.fetch_add(1, Relaxed);
                st.recv_stats.busy_since(t0);
                if st
                    .jobs
                    .send(Job {
                        seq,
                        hdr,
                        payload: buf,
                        off,
                    })
                    .is_err()
                {
                    return Ok(());
                }
            }
            kind::END => {
                let (hdr, _) = open.open(&f, &mut []).map_err(proto_err)?;
                end_of_stream(sh, st, hdr, w)?;
                return Ok(());
            }
            k => {
                return Err(io::Error::other(format!(
                    "unexpected frame type {k} from a sender"
                )))
            }
        }
    }
}

fn end_of_stream(
    sh: &Arc<Shared>,
    st: &Arc<StreamState>,
    hdr: Header,
    w: &Arc<Mutex<Conn>>,
) -> io::Result<()> {
    // The sender sends END once every chunk is acknowledged, so everything is committed; wait
    // briefly while chunks are still on their way to the sink (nothing in flight and chunks
    // missing: answer at once).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut p = st.state.lock().unwrap();
    while (p.committed.len() as u64) < st.t.total_chunks
        && (!p.inflight.is_empty() || !st.jobs.is_empty())
        && Instant::now() < deadline
    {
        p = st
            .changed
            .wait_timeout(p, Duration::from_millis(100))
            .unwrap()
            .0;
    }
    let complete = p.committed.len() as u64 == st.t.total_chunks;
    drop(p);
    let (mut status, sum) = if !complete || hdr.a != st.t.total_chunks || hdr.b != st.t.total_bytes
    {
        (2, 0)
    } else {
        let hs = st.hasher.lock().unwrap();
        if hs.h.hashed() != st.t.total_chunks {
            (2, 0)
        } else {
            let sum = hs.h.digest();
            ((sum != hdr.c) as u64, sum)
        }
    };
    if status == 0 {
        st.sink.finish(st.t.total_bytes)?;
        if sh.opts.verify_on_disk {
            // What reached the disk, not what passed through memory.
            let disk = st.sink.disk_digest(&st.t)?;
            if disk != sum {
                eprintln!(
                    "loci stream recv: stream {}: the file read back from disk hashes to \
                     {disk:016x}, the stream to {sum:016x}",
                    st.id
                );
                status = 1;
            }
        }
    }
    w.lock().unwrap().send(Header::control(
        kind::END_ACK,
        sum,
        status,
        st.t.total_chunks,
    ))?;
    if !st.ended.swap(true, Relaxed) {
        let rep = st.report(status == 0, sum);
        if let Sink::Memory(_) = st.sink {
            MEMORY
                .lock()
                .unwrap()
                .insert(st.id, st.sink.memory_bytes().unwrap_or_default());
        }
        sh.reports.lock().unwrap().push(rep);
        sh.ended.notify_all();
    }
    Ok(())
}

/// Turns the payload of a DATA frame into the raw chunk, `raw` (sized `hdr.raw_len` by the
/// caller): an LZ4 block ([`proto::FLAG_LZ4`]) is decompressed with `codec` and must decode to
/// exactly `raw.len()` bytes; a stored payload is copied and must be exactly `raw.len()` bytes.
/// Whatever the payload, a mismatch is an error (the receiver NACKs the chunk), never a panic.
/// The receiver's decompress stage runs this on every chunk; the fuzz target `stream_frame`
/// runs it on arbitrary frames.
pub fn decode_payload(
    codec: Codec,
    hdr: &Header,
    payload: &[u8],
    raw: &mut [u8],
) -> Result<(), CodecError> {
    if hdr.flags & proto::FLAG_LZ4 != 0 {
        codec.decompress(payload, raw)
    } else if payload.len() != raw.len() {
        // Header::check_data refuses such a header first; this keeps the copy below panic-free
        // for any caller.
        Err(CodecError::Stored {
            got: payload.len(),
            want: raw.len(),
        })
    } else {
        raw.copy_from_slice(payload);
        Ok(())
    }
}

/// Bytes of memory sinks of streams that ended in this process, by stream id (tests and
/// `--sink memory` users read them here).
pub static MEMORY: Mutex<BTreeMap<u32, Vec<u8>>> = Mutex::new(BTreeMap::new());

fn decompress_loop(
    st: &Arc<StreamState>,
    i: usize,
    rx: Rx<Job>,
    commit: Tx<(u64, u64)>,
) -> Result<(), String> {
    let stage = &st.part.decompress;
    pin("decompress", i, stage.cpus_of(i), stage.mem_of(i))?;
    st.dec_stats.saw_affinity(i);
    // A raw chunk is done once the sink has it: one buffer per thread, and a spare.
    let pool = Pool::new(st.t.chunk_bytes as usize, stage.mem_of(i), 2);
    st.dec_stats
        .saw_buffer(i, &*pool.probe().map_err(|e| e.to_string())?);
    for job in rx {
        let t0 = Instant::now();
        let mut raw = pool.get().map_err(|e| e.to_string())?;
        raw.set_len(job.hdr.raw_len as usize);
        let ok = decode_payload(st.codec, &job.hdr, &job.payload[job.off..], &mut raw).is_ok();
        drop(job.payload);
        let hash = if ok { xxh3_64(&raw) } else { 0 };
        if !ok || hash != job.hdr.c {
            st.nacks.fetch_add(1, Relaxed);
            log(&format!(
                "chunk {}: decoded data fails its checksum, asking again",
                job.seq
            ));
            st.state.lock().unwrap().inflight.remove(&job.seq);
            st.send_control(Header::control(
                kind::NACK,
                job.seq,
                if ok { 2 } else { 3 },
                0,
            ));
            continue;
        }
        st.dec_stats.saw_cpu(i);
        st.sink
            .write(job.seq, st.t.chunk_bytes, &raw)
            .map_err(|e| format!("stream {}: sink write of chunk {}: {e}", st.id, job.seq))?;
        st.hasher.lock().unwrap().h.add(job.seq, hash);
        st.dec_stats.chunks.fetch_add(1, Relaxed);
        st.dec_stats.busy_since(t0);
        if commit.send((job.seq, hash)).is_err() {
            break;
        }
    }
    Ok(())
}

fn commit_loop(st: &Arc<StreamState>, rx: Rx<(u64, u64)>) -> io::Result<()> {
    while let Ok(first) = rx.recv() {
        let t0 = Instant::now();
        let mut batch = vec![first];
        while let Ok(s) = rx.try_recv() {
            batch.push(s);
            if batch.len() >= 1024 {
                break;
            }
        }
        st.sink.commit(&batch)?;
        batch.sort_unstable();
        {
            let mut p = st.state.lock().unwrap();
            for &(s, _) in &batch {
                p.inflight.remove(&s);
                if p.committed.insert(s) {
                    st.committed_bytes.fetch_add(st.expected_len(s), Relaxed);
                }
            }
        }
        st.changed.notify_all();
        for (a, b) in proto::to_ranges(batch.iter().map(|&(s, _)| s)) {
            st.send_control(Header::control(kind::ACK, a, b, 0));
        }
        st.commit_stats
            .chunks
            .fetch_add(batch.len() as u64, Relaxed);
        st.commit_stats.busy_since(t0);
    }
    Ok(())
}
