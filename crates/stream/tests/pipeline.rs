//! End-to-end pipeline tests in one process, on loopback.

use std::time::Duration;

mod common;

use common::{send_options as opts, Recv, Reports};
use loci_stream::config::{ReceiverConfig, SenderConfig, Stage};
use loci_stream::recv::MEMORY;
use loci_stream::source::SourceSpec;
use loci_stream::stats::StageReport;
use loci_stream::SinkSpec;

const CHUNK: usize = 1 << 20;

fn sender_cfg(stream: u32, compress: usize, send: usize) -> SenderConfig {
    SenderConfig {
        stream,
        chunk_bytes: CHUNK,
        window: 8,
        queue_depth: 4,
        compress: Stage::os(compress),
        send: Stage::os(send),
        ..SenderConfig::default()
    }
}

fn start_receiver(sink: SinkSpec, streams: usize, secret: &str) -> (String, Reports) {
    start_receiver_with(ReceiverConfig::default(), sink, streams, secret)
}

fn start_receiver_with(
    config: ReceiverConfig,
    sink: SinkSpec,
    streams: usize,
    secret: &str,
) -> (String, Reports) {
    let limit = Duration::from_secs(60);
    let r = Recv {
        secret,
        streams,
        verify_on_disk: false,
        limit,
    };
    let (addr, _stop, reports) = common::start(config, sink, &r);
    (addr, reports)
}

fn synthetic(bytes: u64, seed: u64) -> SourceSpec {
    SourceSpec::Synthetic { bytes, seed }
}

fn expected(bytes: u64, seed: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("src.raw");
    loci_stream::source::write_synthetic_file(&p, bytes, seed, CHUNK).unwrap();
    std::fs::read(p).unwrap()
}

/// Damaged frames in every protection mode: with checksums only, a damaged payload is NACKed
/// and sent again on the same connection; authenticated or encrypted, any damaged frame fails its
/// tag, ends its connection, and is sent again on a new one. A damaged header always ends the
/// connection. Either way every byte arrives once.
#[test]
fn memory_sink_gets_every_byte_with_corrupt_frames_resent() {
    for (mode, id) in [("checksum", 7u32), ("auth", 8), ("encrypt", 9)] {
        corrupt_frames_resent(mode, id);
    }
}

fn corrupt_frames_resent(mode: &str, id: u32) {
    let bytes = 20 * CHUNK as u64 + 12345; // a short last chunk
    let secret = "s3cret-pipeline-test-0123";
    let rcfg = ReceiverConfig {
        unauthenticated: mode == "checksum",
        encrypt: mode == "encrypt",
        ..ReceiverConfig::default()
    };
    let (addr, rx) = start_receiver_with(rcfg, SinkSpec::Memory, 1, secret);
    let scfg = SenderConfig {
        unauthenticated: mode == "checksum",
        encrypt: mode == "encrypt",
        ..sender_cfg(id, 2, 2)
    };
    let mut o = opts(&addr, scfg, synthetic(bytes, 3), secret);
    o.faults.corrupt = [2u64, 5, 20].into_iter().collect();
    o.faults.corrupt_header = [9u64].into_iter().collect();
    let rep = loci_stream::send(o).unwrap();
    let recv = rx.join().unwrap().unwrap();
    assert_eq!(recv.len(), 1);
    assert!(recv[0].verified && rep.verified, "{mode}");
    assert_eq!(recv[0].stream_xxh3, rep.stream_xxh3);
    assert!(
        rep.resent_chunks >= 4,
        "{mode}: corrupted chunks were resent: {}",
        rep.resent_chunks
    );
    if mode == "checksum" {
        // A damaged payload is NACKed, unless it was in flight on the connection that the damaged
        // header (chunk 9) ended: then it goes again with the others of that connection.
        assert!(rep.nacks >= 1, "{mode}: {rep:?}");
        assert!(rep.reconnects >= 1, "a corrupt header drops the connection");
    } else {
        assert_eq!(rep.nacks, 0, "{mode}: {rep:?}");
        // Every damaged frame ends its connection (frames already in flight on it are resent
        // with it, so two damaged ones can share one reconnect).
        assert!(rep.reconnects >= 2, "{mode}: {rep:?}");
    }
    assert_eq!(rep.raw_bytes, bytes);
    let got = MEMORY.lock().unwrap().remove(&id).unwrap();
    assert_eq!(got.len() as u64, bytes);
    assert!(
        got == expected(bytes, 3),
        "memory sink content differs from the source"
    );
    // Compression happened: raw bytes over wire bytes, where the wire also carried every resend
    // (in auth and encrypt mode a damaged frame's connection ends, and the frames in flight on it
    // go again), so the ratio per transmission is what compresses.
    let per_send =
        rep.compression_ratio * (rep.chunks + rep.resent_chunks) as f64 / rep.chunks as f64;
    assert!(per_send > 1.5, "{mode}: ratio per transmission {per_send}");
}

#[test]
fn file_source_into_file_sink_and_two_streams_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.raw");
    let bytes = 9 * CHUNK as u64 + 7;
    loci_stream::source::write_synthetic_file(&src, bytes, 11, CHUNK).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let (addr, rx) = start_receiver(SinkSpec::Dir(out.clone()), 2, "two-streams-secret-0123");
    let a = {
        let o = opts(
            &addr,
            sender_cfg(0, 1, 1),
            SourceSpec::File(src.clone()),
            "two-streams-secret-0123",
        );
        std::thread::spawn(move || loci_stream::send(o))
    };
    let b = {
        let o = opts(
            &addr,
            sender_cfg(1, 2, 3),
            synthetic(5 * CHUNK as u64, 1),
            "two-streams-secret-0123",
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

/// A source file that another program cuts short while it streams (mapped by the sender): the
/// sender stops with an error that names the file and both sizes, the receiver confirms nothing,
/// and no signal ends the process.
#[test]
fn a_source_file_cut_short_during_the_send_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.raw");
    let bytes = 40 * CHUNK as u64;
    loci_stream::source::write_synthetic_file(&src, bytes, 5, CHUNK).unwrap();
    let (addr, rx) = start_receiver(SinkSpec::Null, 1, "cut-short-secret-0123456");
    let mut o = opts(
        &addr,
        SenderConfig {
            window: 2,
            ..sender_cfg(0, 2, 1)
        },
        SourceSpec::File(src.clone()),
        "cut-short-secret-0123456",
    );
    // 40 chunks at 20 ms each: the cut comes while most are still to be read.
    o.faults.delay = Duration::from_millis(20);
    let sender = std::thread::spawn(move || loci_stream::send(o));
    std::thread::sleep(Duration::from_millis(150));
    std::fs::File::options()
        .write(true)
        .open(&src)
        .unwrap()
        .set_len(3 * CHUNK as u64)
        .unwrap();
    let e = sender.join().unwrap().unwrap_err().to_string();
    assert!(
        e.contains("shrank")
            && e.contains(&src.display().to_string())
            && e.contains(&format!("it had {bytes} bytes, now {}", 3 * CHUNK)),
        "{e}"
    );
    if rx.is_finished() {
        let reps = rx.join().unwrap();
        assert!(reps.iter().flatten().all(|r| !r.verified), "{reps:?}");
    }
}

/// A chunk whose frame decodes to bytes that fail its hash every time (as when the source is
/// written through a mapping while it is read): resending the same frame cannot help, so the
/// sender gives up after 8 NACKs with an error that says so, instead of resending forever.
#[test]
fn a_chunk_nacked_again_and_again_ends_the_send_with_an_error() {
    let (addr, _rx) = start_receiver(SinkSpec::Null, 1, "nacked-again-secret-0123");
    let mut o = opts(
        &addr,
        sender_cfg(0, 1, 1),
        synthetic(4 * CHUNK as u64, 2),
        "nacked-again-secret-0123",
    );
    o.faults.wrong_hash.insert(2);
    let e = loci_stream::send(o).unwrap_err().to_string();
    assert!(
        e.contains("chunk 2 failed its checksum at the receiver 8 times"),
        "{e}"
    );
}

#[test]
fn a_sender_without_the_secret_is_refused_clearly() {
    let (addr, _rx) = start_receiver(SinkSpec::Null, 1, "the-right-secret-0123456");
    let o = opts(
        &addr,
        sender_cfg(0, 1, 1),
        synthetic(1000, 1),
        "the-wrong-secret-0123456",
    );
    let e = loci_stream::send(o).unwrap_err().to_string();
    assert!(
        e.contains("authentication failed") && e.contains("LOCI_STREAM_SECRET"),
        "{e}"
    );
}

/// Many tiny chunks through many threads and connections, a small window, and faults on a tenth
/// of the chunks (payload flips) plus dropped connections (header flips): the sink must still
/// hold every byte exactly once. Repeated to shake out interleavings.
#[test]
fn stress_many_small_chunks_with_faults() {
    for round in 0..3u64 {
        let chunk = 4096 + 512 * round as usize;
        let bytes = 700 * chunk as u64 + 77;
        let (addr, rx) = start_receiver(SinkSpec::Memory, 1, "stress-test-secret-0123456");
        let cfg = SenderConfig {
            stream: 100 + round as u32,
            chunk_bytes: chunk,
            window: 3 + round as usize,
            queue_depth: 2,
            compress: Stage::os(4),
            send: Stage::os(4),
            ..SenderConfig::default()
        };
        let mut o = opts(
            &addr,
            cfg,
            synthetic(bytes, round),
            "stress-test-secret-0123456",
        );
        o.faults.corrupt = (0..700).filter(|s| (s * 7 + round) % 10 == 0).collect();
        o.faults.corrupt_header = [13u64, 250, 251, 699].into_iter().collect();
        let rep = loci_stream::send(o).unwrap();
        let recv = rx.join().unwrap().unwrap();
        assert_eq!(recv[0].stream_xxh3, rep.stream_xxh3);
        assert!(recv[0].verified);
        // Every corrupted chunk is sent again, after a connection was dropped (a damaged frame
        // fails its authentication tag). A damaged frame that was still queued on a connection
        // already dropped for another is resent without a reconnect of its own (69 reconnects
        // for 74 damaged frames were seen under load), so reconnects are only bounded below.
        assert!(rep.resent_chunks >= 70 && rep.reconnects >= 35, "{rep:?}");
        let got = MEMORY
            .lock()
            .unwrap()
            .remove(&(100 + round as u32))
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("src.raw");
        loci_stream::source::write_synthetic_file(&p, bytes, round, chunk).unwrap();
        assert!(
            got == std::fs::read(p).unwrap(),
            "round {round}: content differs"
        );
    }
}

fn pinned(cpus: &[u32]) -> Stage {
    Stage {
        count: cpus.len(),
        cpus: cpus.iter().map(|&c| loci_topo::CpuSet::single(c)).collect(),
        mem: vec![0; cpus.len()],
    }
}

/// Every stage thread runs where the config says and its buffers sit on the configured node, as
/// the kernel reports it (affinity, sched_getcpu, move_pages). On a multi-node machine (the VM
/// test) the same check covers node placement.
#[test]
fn threads_and_buffers_are_where_the_config_puts_them() {
    let cpus: Vec<u32> = loci_place::sys::get_affinity(0).unwrap().iter().collect();
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    let (addr, rx) = start_receiver(SinkSpec::Null, 1, "pinning-test-secret-0123");
    let cfg = SenderConfig {
        compress: pinned(&[a, b]),
        send: pinned(&[b]),
        ..sender_cfg(0, 2, 1)
    };
    let rep = loci_stream::send(opts(
        &addr,
        cfg,
        synthetic(6 * CHUNK as u64, 2),
        "pinning-test-secret-0123",
    ))
    .unwrap();
    rx.join().unwrap().unwrap();
    // No reader thread: the compressing threads read their own chunks, into buffers on their
    // node (the raw buffer is among each compressor's `buffer_nodes` below).
    let names: Vec<&str> = rep.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["compress", "send"]);
    let queues: Vec<&str> = rep.queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(queues, ["compress->send"]);
    for st in &rep.stages {
        for (i, seen) in st.seen.iter().enumerate() {
            let plan = st.planned_cpus[i].clone().unwrap();
            assert_eq!(seen.affinity, plan, "{} thread {i} affinity", st.name);
            assert!(
                seen.ran_on.is_subset(&plan),
                "{} thread {i} ran on {}",
                st.name,
                seen.ran_on
            );
            if st.name != "send" {
                assert_eq!(
                    seen.buffer_nodes,
                    loci_topo::NodeSet::single(0),
                    "{} thread {i} buffers",
                    st.name
                );
            }
        }
    }
}

/// User + system CPU seconds of this whole process so far.
fn process_cpu_s() -> f64 {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }, 0);
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Every stage of both sides reports the CPU time its threads used, counted after each piece of
/// work: above 0 for every stage, compression the largest of the sender's, and all of them
/// together within what the whole process used meanwhile (both sides run in this process; other
/// tests' threads only add to the process's figure). A stage charged its threads' whole CPU time
/// again at every chunk would be far above it.
#[test]
fn every_stage_reports_its_threads_cpu_time() {
    let secret = "cpu-time-test-secret-0123";
    let (addr, rx) = start_receiver(SinkSpec::Null, 1, secret);
    let before = process_cpu_s();
    let rep = loci_stream::send(opts(
        &addr,
        sender_cfg(0, 2, 1),
        synthetic(24 * CHUNK as u64, 5),
        secret,
    ))
    .unwrap();
    let recv = rx.join().unwrap().unwrap();
    let spent = process_cpu_s() - before;
    assert!(rep.verified && recv[0].verified);
    let stages: Vec<&StageReport> = rep.stages.iter().chain(&recv[0].stages).collect();
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["compress", "send", "recv", "decompress", "commit"]);
    for s in &stages {
        assert!(s.cpu_s > 0.0, "{}: {}", s.name, s.cpu_s);
        assert!(s.cpu_s_per_gb(rep.raw_bytes) > 0.0, "{}", s.name);
    }
    assert!(
        rep.stages[0].cpu_s > rep.stages[1].cpu_s,
        "compressing costs more than sending: {:?}",
        rep.stages
    );
    let total: f64 = stages.iter().map(|s| s.cpu_s).sum();
    assert!(
        total <= spent + 0.05,
        "stages {total:.3} cpu-s, the whole process {spent:.3}"
    );
    assert!(rep.text().contains("s per raw GB"), "{}", rep.text());
}

#[test]
fn a_cpu_that_does_not_exist_is_a_clear_error() {
    let (addr, _rx) = start_receiver(SinkSpec::Null, 1, "pinning-test-secret-0123");
    let cfg = SenderConfig {
        compress: pinned(&[1000]),
        ..sender_cfg(0, 1, 1)
    };
    let e = loci_stream::send(opts(
        &addr,
        cfg,
        synthetic(1000, 2),
        "pinning-test-secret-0123",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("compress: thread 0") && e.contains("cpu 1000") && e.contains("present cpus"),
        "{e}"
    );
}

/// A receiver config naming a cpu this machine lacks is refused when the receiver binds, naming
/// the stream, the stage, the thread and the cpu.
#[test]
fn a_receiver_cpu_that_does_not_exist_is_refused_at_bind() {
    let part = loci_stream::config::StreamPart {
        id: 4,
        queue_depth: 2,
        recv: Stage::os(1),
        decompress: pinned(&[1000]),
    };
    let config = ReceiverConfig {
        streams: vec![part],
        ..ReceiverConfig::default()
    };
    let limit = Duration::from_secs(60);
    let secret = "pinning-test-secret-0123";
    let r = Recv {
        secret,
        streams: 1,
        verify_on_disk: false,
        limit,
    };
    let Err(e) = common::bind(config, SinkSpec::Null, &r) else {
        panic!("a receiver with cpu 1000 bound");
    };
    let e = e.to_string();
    assert!(
        e.contains("stream 4.decompress: thread 0: cpu 1000 is not present"),
        "{e}"
    );
}
