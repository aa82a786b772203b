//! The receiver's and sender's bounds against misbehaving peers, each shown on the real runtime
//! over loopback: a handshake trickled byte by byte, a flood of idle connections, a peer that
//! answers with ACK ranges outside the stream, a second sender taking over a live stream. Every
//! wait is bounded; no test asserts a duration.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{Recv, Reports};
use loci_stream::config::{ReceiverConfig, SenderConfig, Stage, Sync};
use loci_stream::proto::{self, kind, Header};
use loci_stream::source::SourceSpec;
use loci_stream::{SendOptions, SinkSpec, StreamReport};

const SECRET: &str = "limits-test-secret-0123";

fn receiver(config: ReceiverConfig, sink: SinkSpec) -> (String, Arc<AtomicBool>, Reports) {
    receiver_with(config, sink, false)
}

fn receiver_with(
    config: ReceiverConfig,
    sink: SinkSpec,
    verify_on_disk: bool,
) -> (String, Arc<AtomicBool>, Reports) {
    let limit = Duration::from_secs(90);
    let r = Recv {
        secret: SECRET,
        streams: 1,
        verify_on_disk,
        limit,
    };
    common::start(config, sink, &r)
}

fn sender(to: &str, stream: u32, bytes: u64) -> SendOptions {
    let config = SenderConfig {
        stream,
        chunk_bytes: 64 << 10,
        window: 4,
        queue_depth: 2,
        compress: Stage::os(1),
        send: Stage::os(1),
        ..SenderConfig::default()
    };
    let source = SourceSpec::Synthetic { bytes, seed: 5 };
    common::send_options(to, config, source, SECRET)
}

/// Reads until EOF or an error, at most `limit`; true if the peer closed the connection.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let until = Instant::now() + limit;
    let mut buf = [0u8; 256];
    while Instant::now() < until {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

/// A client that sends one byte of its hello every 200 ms (it would take 25 s) is cut off by the
/// one deadline of the whole handshake (1 s here), not kept alive by each byte.
#[test]
fn a_trickled_handshake_is_cut_at_one_deadline() {
    let (addr, stop, rx) = receiver(
        ReceiverConfig {
            handshake_timeout_secs: 1,
            ..ReceiverConfig::default()
        },
        SinkSpec::Null,
    );
    let mut s = TcpStream::connect(&addr).unwrap();
    let mut sh = [0u8; 44];
    s.read_exact(&mut sh).unwrap();
    let w = s.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        let mut w = w;
        let mut sent = 0;
        for b in proto::MAGIC.iter().chain([0u8; 117].iter()) {
            if w.write_all(&[*b]).is_err() {
                break;
            }
            sent += 1;
            std::thread::sleep(Duration::from_millis(200));
        }
        sent
    });
    assert!(
        closed_within(&mut s, Duration::from_secs(15)),
        "the receiver kept a trickling handshake open"
    );
    let sent = trickle.join().unwrap();
    assert!(sent < 125, "the whole hello went through ({sent} bytes)");
    stop.store(true, Relaxed);
    let _ = rx.join();
}

/// With `max_connections = 4`, four idle connections are held and a fifth is closed at once
/// without a ServerHello; once they go, new connections are served again.
#[test]
fn connections_beyond_the_cap_are_closed_at_once() {
    let (addr, stop, rx) = receiver(
        ReceiverConfig {
            max_connections: 4,
            handshake_timeout_secs: 60,
            ..ReceiverConfig::default()
        },
        SinkSpec::Null,
    );
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(&addr).unwrap();
        let mut sh = [0u8; 44];
        s.read_exact(&mut sh).unwrap(); // served: the ServerHello arrives
        held.push(s);
    }
    let mut fifth = TcpStream::connect(&addr).unwrap();
    let mut sh = [0u8; 44];
    fifth
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(
        fifth.read_exact(&mut sh).is_err(),
        "a fifth connection was served beyond max_connections = 4"
    );
    drop(held);
    // The slots free up as the serving threads see their connections end.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if s.read_exact(&mut sh).is_ok() {
            break;
        }
        assert!(Instant::now() < until, "the freed slots never served again");
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Relaxed);
    let _ = rx.join();
}

/// A peer holding the secret (so every frame authenticates) that acknowledges a range beyond the
/// stream: the sender ends that connection, reconnects, meets the same answer, and gives up
/// after a bounded number of connections with no progress instead of looping or panicking.
#[test]
fn ack_ranges_outside_the_stream_end_the_connection_and_the_sender_gives_up() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sv = served.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            sv.fetch_add(1, Relaxed);
            std::thread::spawn(move || {
                let Ok((hello, ch, cn)) = proto::server_hello(&mut s, SECRET.as_bytes()) else {
                    return;
                };
                let Ok((mut seal, _)) =
                    proto::server_accept(&mut s, SECRET.as_bytes(), &hello, &ch, &cn, &[])
                else {
                    return;
                };
                let bad = seal.control(Header::control(
                    kind::ACK,
                    0,
                    hello.total_chunks + 1_000_000,
                    0,
                ));
                let _ = s.write_all(&bad);
                let mut sink = [0u8; 1 << 16];
                while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
            });
        }
    });
    let e = loci_stream::send(sender(&addr, 0, 8 * (64 << 10)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("connections in a row"), "{e}");
    assert!(served.load(Relaxed) >= 16, "{}", served.load(Relaxed));
}

/// A first stream into a FILE sink in `dir`, slowed by `delay` per chunk, once it is live (its
/// journal exists): the file, the receiver's address and reports, and the sender's thread.
fn first_stream_live(
    dir: &std::path::Path,
    file: &str,
    (stream, chunks, delay): (u32, u64, Duration),
) -> (
    std::path::PathBuf,
    String,
    Reports,
    std::thread::JoinHandle<Result<StreamReport, loci_stream::send::SendError>>,
) {
    let out = dir.join(file);
    let (addr, _stop, rx) = receiver(ReceiverConfig::default(), SinkSpec::File(out.clone()));
    let mut first = sender(&addr, stream, chunks * (64 << 10));
    first.faults.delay = delay;
    let t = std::thread::spawn(move || loci_stream::send(first));
    let journal = dir.join(format!("{file}.loci-journal"));
    let until = Instant::now() + Duration::from_secs(20);
    while !journal.exists() {
        assert!(Instant::now() < until, "the first stream never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    (out, addr, rx, t)
}

/// While a stream is live, a fresh sender for the same stream id (another transfer) is refused,
/// with a message naming why; the first stream completes, verified.
#[test]
fn a_fresh_hello_for_a_live_stream_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // About 3.6 s: it outlasts the second sender's 1 s of retries ("busy") by a wide margin.
    let first = (3, 24, Duration::from_millis(150));
    let (out, addr, rx, t) = first_stream_live(dir.path(), "out.raw", first);
    let mut second = sender(&addr, 3, 5 * (64 << 10) + 1);
    second.reconnect_timeout = Duration::from_secs(1);
    let e = loci_stream::send(second).unwrap_err().to_string();
    assert!(e.contains("is live with another sender"), "{e}");
    let rep = t.join().unwrap().unwrap();
    assert!(rep.verified);
    let recv = rx.join().unwrap().unwrap();
    assert!(recv[0].verified);
    assert_eq!(
        std::fs::metadata(&out).unwrap().len(),
        24 * (64 << 10),
        "the second sender touched the file"
    );
}

/// A FILE sink takes one stream: a second stream id is refused with the file named.
#[test]
fn a_file_sink_refuses_a_second_stream() {
    let dir = tempfile::tempdir().unwrap();
    let first = (1, 16, Duration::from_millis(30));
    let (_out, addr, rx, t) = first_stream_live(dir.path(), "one.raw", first);
    let e = loci_stream::send(sender(&addr, 2, 4 * (64 << 10)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("one.raw") && e.contains("holds stream 1") && e.contains("DIR/"),
        "{e}"
    );
    assert!(t.join().unwrap().unwrap().verified);
    assert!(rx.join().unwrap().unwrap()[0].verified);
}

/// `verify_on_disk`: the stream is confirmed from the file read back (page cache dropped), and
/// the file is the source, byte for byte.
#[test]
fn verify_on_disk_confirms_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.raw");
    let (addr, _stop, rx) = receiver_with(
        ReceiverConfig {
            sync: Sync::Data,
            ..ReceiverConfig::default()
        },
        SinkSpec::File(out.clone()),
        true,
    );
    let bytes = 9 * (64 << 10) + 123;
    let rep = loci_stream::send(sender(&addr, 0, bytes)).unwrap();
    let recv = rx.join().unwrap().unwrap();
    assert!(rep.verified && recv[0].verified);
    let src = dir.path().join("src.raw");
    loci_stream::source::write_synthetic_file(&src, bytes, 5, 64 << 10).unwrap();
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&src).unwrap());
}
