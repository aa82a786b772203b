//! Shared by the stream's integration tests: a loopback receiver that stops itself, and sender
//! options, both with `sync = "none"` and no progress output.
// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use loci_stream::config::{ReceiverConfig, SenderConfig, Sync};
use loci_stream::recv::RecvError;
use loci_stream::source::SourceSpec;
use loci_stream::{Faults, Receiver, RecvOptions, SendOptions, SinkSpec, StreamReport};

pub type Reports = std::thread::JoinHandle<Result<Vec<StreamReport>, String>>;

/// What a test receiver takes besides its config and sink.
pub struct Recv<'a> {
    pub secret: &'a str,
    /// Streams to wait for.
    pub streams: usize,
    pub verify_on_disk: bool,
    /// It stops itself after this long (every wait is bounded).
    pub limit: Duration,
}

/// A receiver bound to a free loopback port (`sync = "none"`).
pub fn bind(config: ReceiverConfig, sink: SinkSpec, r: &Recv) -> Result<Receiver, RecvError> {
    let opts = RecvOptions {
        config: ReceiverConfig {
            sync: Sync::None,
            ..config
        },
        secret: r.secret.as_bytes().to_vec(),
        sink,
        progress: false,
        streams: Some(r.streams),
        verify_on_disk: r.verify_on_disk,
    };
    Receiver::bind("127.0.0.1:0", opts)
}

/// Starts a receiver (see [`bind`]): its address, its stop flag and its reports.
pub fn start(
    config: ReceiverConfig,
    sink: SinkSpec,
    r: &Recv,
) -> (String, Arc<AtomicBool>, Reports) {
    let rx = bind(config, sink, r).unwrap();
    let addr = rx.local_addr().to_string();
    let stop = rx.stop_flag();
    let (s2, limit) = (stop.clone(), r.limit);
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        s2.store(true, Relaxed);
    });
    let reports = std::thread::spawn(move || rx.run().map_err(|e| e.to_string()));
    (addr, stop, reports)
}

/// Options to send `source` to `to` with `config`, no faults, 20 s to reconnect.
pub fn send_options(
    to: &str,
    config: SenderConfig,
    source: SourceSpec,
    secret: &str,
) -> SendOptions {
    SendOptions {
        to: to.into(),
        config,
        secret: secret.as_bytes().to_vec(),
        source,
        resume: false,
        progress: false,
        reconnect_timeout: Duration::from_secs(20),
        faults: Faults::default(),
    }
}
