//! A new connection: its handshake under one deadline, the protection the receiver requires,
//! and the stream it joins or creates (with the rules that keep two senders or two streams from
//! sharing one sink).

use super::*;

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

/// TCP keepalive on an established connection: a peer that died without its FIN or RST
/// arriving (a killed sender whose reset was lost) is found within about 20 s of silence, so its
/// connection ends and its session stops holding the stream against a resuming sender. A live
/// but idle peer's kernel answers the probes, so a slow sink never ends a healthy connection.
pub(super) fn keepalive(s: &TcpStream) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = s.as_raw_fd();
    for (level, name, value) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_S),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 2),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 5),
    ] {
        let v: libc::c_int = value;
        // SAFETY: `fd` is the open socket `s` owns; `v` is a live c_int whose size is passed.
        let r = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Seconds of silence before the first keepalive probe.
pub(super) const KEEPALIVE_IDLE_S: libc::c_int = 10;

/// One connection: handshake, then the recv stage loop.
pub(super) fn handle(sh: &Arc<Shared>, mut s: TcpStream) -> io::Result<()> {
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
    keepalive(&s)?;
    let conn_id = st.next_conn.fetch_add(1, Relaxed) + (1 << 32);
    let w = Arc::new(Mutex::new(Conn {
        s: s.try_clone()?,
        seal,
    }));
    st.conns.lock().unwrap().push((conn_id, w.clone()));
    *st.last_seen.lock().unwrap() = Instant::now();
    let i = hello.conn as usize % st.recv_stats.threads();
    if let Err(e) = st.recv_stats.enter(i) {
        *sh.fatal.lock().unwrap() = Some(e.clone());
        return Err(io::Error::other(e));
    }
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
    let (sink, resumed) = StreamSink::open(&sh.opts.sink, h.stream, t, h.resume, cfg.sync)
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
        hasher: Mutex::new(StreamHasher::new()),
        conns: Mutex::new(vec![]),
        last_seen: Mutex::new(Instant::now()),
        next_conn: AtomicU64::new(0),
        recv_stats: StageStats::planned("recv", &part.recv, &sh.here)?,
        dec_stats: StageStats::planned("decompress", &part.decompress, &sh.here)?,
        commit_stats: StageStats::planned("commit", &crate::config::Stage::os(1), &sh.here)?,
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
    for i in 0..st.dec_stats.threads() {
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
            hs.add(seq, hash);
        }
    }
    streams.insert(h.stream, st.clone());
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(s: &TcpStream, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        use std::os::fd::AsRawFd;
        let mut v: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: the socket is open; `v` and `len` are live and `len` is `v`'s size.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                level,
                name,
                &mut v as *mut libc::c_int as *mut libc::c_void,
                &mut len,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        v
    }

    #[test]
    fn established_connections_probe_a_silent_peer() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(opt(&s, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
        keepalive(&s).unwrap();
        assert_eq!(opt(&s, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(
            opt(&s, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
            KEEPALIVE_IDLE_S
        );
        assert_eq!(opt(&s, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 2);
        assert_eq!(opt(&s, libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 5);
    }
}
