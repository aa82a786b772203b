//! End-to-end pipeline tests in one process, on loopback.

use std::time::Duration;

use loci_stream::config::{ReceiverConfig, SenderConfig, Stage, Sync};
use loci_stream::recv::MEMORY;
use loci_stream::source::SourceSpec;
use loci_stream::{Faults, Receiver, RecvOptions, SendOptions, SinkSpec};

const CHUNK: usize = 1 << 20;

fn sender_cfg(stream: u32, compress: usize, send: usize) -> SenderConfig {
    SenderConfig {
        stream,
        chunk_bytes: CHUNK,
        window: 8,
        queue_depth: 4,
        read_queue_depth: 2,
        compress: Stage::os(compress),
        send: Stage::os(send),
        ..SenderConfig::default()
    }
}

fn start_receiver(
    sink: SinkSpec,
    streams: usize,
    secret: &str,
) -> (
    String,
    std::thread::JoinHandle<Result<Vec<loci_stream::StreamReport>, String>>,
) {
    let r = Receiver::bind(
        "127.0.0.1:0",
        RecvOptions {
            config: ReceiverConfig {
                sync: Sync::None,
                ..ReceiverConfig::default()
            },
            secret: secret.as_bytes().to_vec(),
            sink,
            progress: false,
            streams: Some(streams),
        },
    )
    .unwrap();
    let addr = r.local_addr().to_string();
    let stop = r.stop_flag();
    // Bounded: a receiver that never sees its streams end stops after 60 s.
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    (
        addr,
        std::thread::spawn(move || r.run().map_err(|e| e.to_string())),
    )
}

fn opts(to: &str, cfg: SenderConfig, source: SourceSpec, secret: &str) -> SendOptions {
    SendOptions {
        to: to.into(),
        config: cfg,
        secret: secret.as_bytes().to_vec(),
        source,
        resume: false,
        progress: false,
        reconnect_timeout: Duration::from_secs(20),
        faults: Faults::default(),
    }
}

fn expected(bytes: u64, seed: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("src.raw");
    loci_stream::source::write_synthetic_file(&p, bytes, seed, CHUNK).unwrap();
    std::fs::read(p).unwrap()
}

#[test]
fn memory_sink_gets_every_byte_with_corrupt_frames_resent() {
    let bytes = 20 * CHUNK as u64 + 12345; // a short last chunk
    let (addr, rx) = start_receiver(SinkSpec::Memory, 1, "s3cret");
    let mut o = opts(
        &addr,
        sender_cfg(7, 2, 2),
        SourceSpec::Synthetic { bytes, seed: 3 },
        "s3cret",
    );
    o.faults.corrupt = [2u64, 5, 20].into_iter().collect();
    o.faults.corrupt_header = [9u64].into_iter().collect();
    let rep = loci_stream::send(o).unwrap();
    let recv = rx.join().unwrap().unwrap();
    assert_eq!(recv.len(), 1);
    assert!(recv[0].verified && rep.verified);
    assert_eq!(recv[0].stream_xxh3, rep.stream_xxh3);
    assert!(
        rep.resent_chunks >= 4,
        "corrupted chunks were resent: {}",
        rep.resent_chunks
    );
    assert!(rep.nacks >= 3);
    assert!(rep.reconnects >= 1, "a corrupt header drops the connection");
    assert_eq!(rep.raw_bytes, bytes);
    let got = MEMORY.lock().unwrap().remove(&7).unwrap();
    assert_eq!(got.len() as u64, bytes);
    assert!(
        got == expected(bytes, 3),
        "memory sink content differs from the source"
    );
    assert!(
        rep.compression_ratio > 1.5,
        "ratio {}",
        rep.compression_ratio
    );
}

#[test]
fn file_source_into_file_sink_and_two_streams_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.raw");
    let bytes = 9 * CHUNK as u64 + 7;
    loci_stream::source::write_synthetic_file(&src, bytes, 11, CHUNK).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let (addr, rx) = start_receiver(SinkSpec::Dir(out.clone()), 2, "k");
    let a = {
        let o = opts(
            &addr,
            sender_cfg(0, 1, 1),
            SourceSpec::File(src.clone()),
            "k",
        );
        std::thread::spawn(move || loci_stream::send(o))
    };
    let b = {
        let o = opts(
            &addr,
            sender_cfg(1, 2, 3),
            SourceSpec::Synthetic {
                bytes: 5 * CHUNK as u64,
                seed: 1,
            },
            "k",
        );
        std::thread::spawn(move || loci_stream::send(o))
    };
    a.join().unwrap().unwrap();
    b.join().unwrap().unwrap();
    let reps = rx.join().unwrap().unwrap();
    assert_eq!(reps.len(), 2);
    assert!(reps.iter().all(|r| r.verified));
    assert_eq!(
        std::fs::read(out.join("stream-0.raw")).unwrap(),
        std::fs::read(&src).unwrap()
    );
    assert_eq!(
        std::fs::read(out.join("stream-1.raw")).unwrap(),
        expected(5 * CHUNK as u64, 1)
    );
}

#[test]
fn a_sender_without_the_secret_is_refused_clearly() {
    let (addr, _rx) = start_receiver(SinkSpec::Null, 1, "right");
    let o = opts(
        &addr,
        sender_cfg(0, 1, 1),
        SourceSpec::Synthetic {
            bytes: 1000,
            seed: 1,
        },
        "wrong",
    );
    let e = loci_stream::send(o).unwrap_err().to_string();
    assert!(
        e.contains("authentication failed") && e.contains("LOCI_STREAM_SECRET"),
        "{e}"
    );
}
