//! Faults of the sink and of the listener: a power loss on a receiver with `sync = "none"`,
//! repaired on resume; two streams into one FILE sink; a flood of half-open connections during a
//! stream.

use super::*;

/// Simulated power loss on a receiver with `sync = "none"` and a FILE sink: killed -9 in
/// mid-stream, then the data file loses its tail (cut inside the third-last journaled chunk),
/// 4 KiB of a journaled chunk in the middle are overwritten and the journal's last record is
/// torn. The receiver restarts; the sender either survived and reconnects
/// (`sender_survives`), or was killed too and restarts with `--resume`. The resumed receiver
/// must find the damaged chunks by re-hashing what its journal records, and have them sent
/// again: the file ends byte-identical to the source and both sides verified.
pub fn power_loss(scale: Scale, sender_survives: bool) {
    let net = Net::loopback();
    let s = setup(free_port(), scale);
    std::fs::write(s.dir.join("recv.toml"), "sync = \"none\"\n").unwrap();
    let chunk = s.scale.chunk as u64;
    let mut recv = start_recv(&net, &s);
    let mut send = start_send(&net, &s, &["--fault-delay-ms", "25"]);
    wait_journaled(&s.out, 16, s.scale.patience);
    recv.kill9();
    if !sender_survives {
        send.kill9();
    }
    let rec = journal(&s.out);
    assert!(
        rec.len() >= 16 && (rec.len() as u64) < s.scale.chunks,
        "killed mid-stream: {} chunks journaled",
        rec.len()
    );
    // Power loss: the tail of the data file never reached the disk...
    let tail = rec[rec.len() - 3];
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&s.out)
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len((tail * chunk + chunk / 3).min(len)).unwrap();
    // ...a journaled chunk in the middle came back with other bytes...
    let victim = rec[rec.len() / 3];
    assert!(victim < tail);
    let garbage = vec![0x5au8; 4096];
    let at = victim * chunk + 512;
    let mut was = vec![0u8; garbage.len()];
    std::fs::File::open(&s.src)
        .unwrap()
        .read_exact_at(&mut was, at)
        .unwrap();
    assert_ne!(was, garbage);
    f.write_all_at(&garbage, at).unwrap();
    drop(f);
    // ...and the journal's last record is torn.
    let mut jp = s.out.as_os_str().to_owned();
    jp.push(".loci-journal");
    let j = std::fs::OpenOptions::new().write(true).open(&jp).unwrap();
    let jl = j.metadata().unwrap().len();
    j.set_len(jl - 7).unwrap();
    drop(j);
    eprintln!(
        "power loss: {} chunks journaled; file cut inside chunk {tail}, chunk {victim} \
         overwritten, journal torn; sender {}",
        rec.len(),
        if sender_survives {
            "reconnects"
        } else {
            "killed, restarted with --resume"
        }
    );
    let recv = start_recv(&net, &s);
    let send = if sender_survives {
        send
    } else {
        start_send(&net, &s, &["--resume"])
    };
    let (sr, rr) = finish_exact(&s, send, recv);
    eprintln!(
        "power loss: receiver skipped {} chunks, resent by the sender {}, sender skipped {}",
        rr["skipped_chunks"], sr["resent_chunks"], sr["skipped_chunks"]
    );
    // The damaged chunks were not taken as held (the victim and the three at the tail; the last
    // journal record may name one of them).
    assert!(
        rr["skipped_chunks"].as_u64().unwrap() <= rec.len() as u64 - 4,
        "the resumed receiver kept damaged chunks: {rr}"
    );
}

/// Two streams into one FILE sink: stream 1 runs (slowed down); meanwhile a sender of stream 2
/// (another source) must be refused with an error naming the file, and two more senders of
/// stream 1 from other sessions (fresh, and `--resume`) must be refused while stream 1 is live.
/// Stream 1 then completes byte-identical and verified.
pub fn two_streams_one_file(scale: Scale) {
    let net = Net::loopback();
    let mut s = setup(free_port(), scale);
    let to = format!("{}:{}", net.recv_ip, s.port);
    let src2 = s.dir.join("src2.raw");
    loci_stream::source::write_synthetic_file(&src2, s.source_bytes(), 8, s.scale.chunk).unwrap();
    let c1 = s.dir.join("send-1.toml");
    let c2 = s.dir.join("send-2.toml");
    std::fs::write(&c1, send_toml(s.scale, 1)).unwrap();
    std::fs::write(&c2, send_toml(s.scale, 2)).unwrap();
    let recv = start_recv(&net, &s);
    // Slow enough to outlast the three other senders (each retries for its 2 s reconnect
    // timeout): 48 chunks at 400 ms over 2 connections, about 10 s.
    let mut first = start_send_with(&net, &s, &to, &c1, &s.src, &["--fault-delay-ms", "400"]);
    wait_journaled(&s.out, 4, s.scale.patience);
    let limit = Duration::from_secs(15) * s.scale.patience;
    // A sender refused "for now" (the stream is live with another sender) retries until its
    // reconnect timeout: short here, so the refusal shows within the limit.
    let first_timeout = std::mem::replace(&mut s.reconnect_timeout, 2 * s.scale.patience as u64);
    let other = start_send_with(&net, &s, &to, &c2, &src2, &[]).finish_or_kill(limit);
    let same_fresh = start_send_with(&net, &s, &to, &c1, &s.src, &[]).finish_or_kill(limit);
    let same_resume =
        start_send_with(&net, &s, &to, &c1, &s.src, &["--resume"]).finish_or_kill(limit);
    s.reconnect_timeout = first_timeout;
    let first_still_running = first.running();
    for (o, _) in [&other, &same_fresh, &same_resume] {
        // A second sender that "verified" would have written into stream 1's file.
        note(Tally {
            false_verified: says_verified(o) as u64,
            ..Tally::default()
        });
    }
    let path = s.out.display().to_string();
    let outcome = |(o, killed): &(Output, bool)| {
        if *killed {
            "still running after 15 s, killed".to_string()
        } else {
            format!("{}: {:?}", o.status, last_line(o))
        }
    };
    eprintln!(
        "two streams, one FILE: stream 2 -> {}; stream 1 from another session -> {}; the same \
         with --resume -> {}",
        outcome(&other),
        outcome(&same_fresh),
        outcome(&same_resume)
    );
    // Stream 1 itself (bounded; 48 chunks at 400 ms each over 2 connections take about 10 s).
    let (so, killed) = first.finish_or_kill(Duration::from_secs(30) * s.scale.patience);
    let mut recv = recv;
    let ro = if so.status.success() {
        recv.finish(Duration::from_secs(30) * s.scale.patience)
    } else {
        recv.kill_output()
    };
    tally_complete(&s.src, &s.out, &[&so, &ro]);
    assert!(
        first_still_running,
        "stream 1 ended before the other senders were tried; slow it down more"
    );
    let (o, k) = &other;
    assert!(
        !k && !o.status.success() && String::from_utf8_lossy(&o.stderr).contains(&path),
        "a second stream into {path} must be refused with an error naming the file: {}",
        outcome(&other)
    );
    for (what, r) in [("fresh", &same_fresh), ("--resume", &same_resume)] {
        let (o, k) = r;
        assert!(
            !k && !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("refused"),
            "a {what} sender of live stream 1 from another session must be refused: {}",
            outcome(r)
        );
    }
    assert!(!killed, "stream 1 did not complete within 30 s");
    let sr = report(&so, "sender of stream 1");
    let rr = report(&ro, "receiver");
    check_exact(&s, &sr, &rr);
    assert_eq!(sr["stream"], 1);
}

/// Holds `n` half-open connections to a receiver: even ones send nothing, odd ones the first
/// 10 bytes of a ClientHello (magic, version) and stall. One that the receiver closes (its
/// handshake deadline) is opened again, so the pressure lasts. Stopped and joined on drop.
pub struct Flood {
    stop: Arc<AtomicBool>,
    /// Connections the receiver closed (and the flood reopened).
    pub reopened: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    pub fn start(to: SocketAddr, n: usize) -> Flood {
        let open = move |i: usize| -> Option<TcpStream> {
            let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(2)).ok()?;
            if i % 2 == 1 {
                let mut partial = b"LOCISTRM".to_vec();
                partial.extend_from_slice(&loci_stream::proto::VERSION.to_le_bytes());
                c.write_all(&partial).ok()?;
            }
            c.set_nonblocking(true).ok()?;
            Some(c)
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut conns: Vec<Option<TcpStream>> = Vec::with_capacity(n);
        for i in 0..n {
            loop {
                if let Some(c) = open(i) {
                    conns.push(Some(c));
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "flood: connection {i} of {n} not established"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let reopened = Arc::new(AtomicU64::new(0));
        let (st, re) = (stop.clone(), reopened.clone());
        let thread = std::thread::spawn(move || {
            let mut scratch = [0u8; 512];
            while !st.load(Relaxed) {
                for (i, slot) in conns.iter_mut().enumerate() {
                    let closed = match slot {
                        Some(c) => match c.read(&mut scratch) {
                            Ok(0) => true,
                            Ok(_) => false, // the ServerHello or a refusal: ignored
                            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                        },
                        None => true,
                    };
                    if closed {
                        if slot.is_some() {
                            re.fetch_add(1, Relaxed);
                        }
                        *slot = open(i);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Flood {
            stop,
            reopened,
            thread: Some(thread),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Goodput of a finished stream: raw bytes over the sender's wall time, MB/s.
fn goodput(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e6
}

/// 200 half-open connections held while a real stream runs: the stream completes byte-identical
/// and verified. Prints the goodput without and with the flood (not asserted).
pub fn half_open_flood(scale: Scale) {
    let net = Net::loopback();
    let mut rates = vec![];
    for flood in [false, true] {
        let s = setup(free_port(), scale);
        let recv = start_recv(&net, &s);
        let f = flood.then(|| Flood::start(SocketAddr::from(([127, 0, 0, 1], s.port)), 200));
        let t0 = Instant::now();
        let mut send = start_send(&net, &s, &[]);
        let so = send.finish(Duration::from_secs(120) * s.scale.patience);
        let wall = t0.elapsed();
        // Closed by the receiver while the stream ran (its exit closes the rest).
        let reopened = f.as_ref().map(|f| f.reopened.load(Relaxed)).unwrap_or(0);
        let (sr, _) = finish_exact_after(&s, so, recv);
        drop(f);
        rates.push((
            goodput(s.source_bytes(), wall),
            sr["end_to_end_bytes_per_s"].as_f64().unwrap_or(0.0) / 1e6,
            reopened,
        ));
    }
    eprintln!(
        "half-open flood: goodput without {:.0} MB/s (sender's report {:.0} MB/s), with 200 \
         half-open connections {:.0} MB/s (report {:.0} MB/s; {} of them closed by the receiver \
         and reopened)",
        rates[0].0, rates[0].1, rates[1].0, rates[1].1, rates[1].2
    );
}
