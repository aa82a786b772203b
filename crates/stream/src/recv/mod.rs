//! The receiving side: accept authenticated connections, receive frames (recv stage), decompress
//! and store them (decompress stage), make them durable and acknowledge them (committer), and
//! verify the whole-stream checksum at the end. Several streams at once, each on its own cores.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::hash::xxh3_64;
use crossbeam_channel::{Receiver as Rx, Sender as Tx};

use crate::buf::{Pool, PooledBuf};
use crate::codec::{Codec, CodecError};
use crate::config::{ReceiverConfig, StreamPart};
use crate::proto::{
    self, kind, Header, Hello, Opener, Protection, ProtoError, Sealer, StreamHasher,
};
use crate::sink::{SinkSpec, StreamSink, Transfer};
use crate::stats::{QueueStats, StageStats, StreamReport, Totals};

mod accept;

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
    /// This machine, which every stream's stage plans are made against.
    here: loci_topo::Topology,
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
        let here = crate::config::this_machine().map_err(|e| RecvError::Fatal(e.to_string()))?;
        // Every configured stage must place on this machine: said now, not at a first connection.
        for p in &opts.config.streams {
            for (what, stage) in [("recv", &p.recv), ("decompress", &p.decompress)] {
                stage
                    .plan(&here, &format!("stream {}.{what}", p.id))
                    .map_err(|e| RecvError::Fatal(e.to_string()))?;
            }
        }
        let listener = TcpListener::bind(addr).map_err(|err| RecvError::Listen {
            addr: addr.into(),
            err,
        })?;
        Ok(Receiver {
            listener,
            opts,
            here,
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
            here: self.here.clone(),
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
                                if let Err(e) = accept::handle(&sh, s) {
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
    here: loci_topo::Topology,
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
    sink: StreamSink,
    jobs: Tx<Job>,
    queue_stats: QueueStats,
    /// Committed (durable, acknowledged) chunks; and chunks between receipt and commit.
    state: Mutex<Progress>,
    changed: Condvar,
    committed_bytes: AtomicU64,
    /// The whole-stream checksum of what this receiver holds: each chunk's hash once its decoded
    /// data passed the check against the frame's `c`; chunks the sink held before a restart with
    /// the hashes the journal recorded (re-verified on disk when the sink was opened).
    hasher: Mutex<StreamHasher>,
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
        let totals = Totals {
            chunks: self.t.total_chunks,
            raw_bytes: self.committed_bytes.load(Relaxed),
            wire_bytes: self.wire_bytes.load(Relaxed),
            started: self.started,
        };
        let stages = [&self.recv_stats, &self.dec_stats, &self.commit_stats];
        let queues = [&self.queue_stats];
        StreamReport {
            verified,
            nacks: self.nacks.load(Relaxed),
            skipped_chunks: self.prior,
            ..StreamReport::from_totals("recv", self.id, totals, &stages, &queues, checksum)
        }
    }
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
        st.recv_stats.buffer_node(i),
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
        if hs.hashed() != st.t.total_chunks {
            (2, 0)
        } else {
            let sum = hs.digest();
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
        if let StreamSink::Memory(_) = st.sink {
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
    st.dec_stats.enter(i)?;
    // A raw chunk is done once the sink has it: one buffer per thread, and a spare.
    let pool = Pool::new(st.t.chunk_bytes as usize, st.dec_stats.buffer_node(i), 2);
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
        st.hasher.lock().unwrap().add(job.seq, hash);
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
