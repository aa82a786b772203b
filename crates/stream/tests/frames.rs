//! Frames that used to break the receiver (the fuzz target `stream_frame`, docs/testing.md
//! section Fuzzing, checks the same path on arbitrary frames), fed as they arrive.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

mod common;

use common::Recv;
use loci_stream::config::ReceiverConfig;
use loci_stream::hash::xxh3_64;
use loci_stream::proto::{self, kind, Header, Hello, Protection, FLAG_LZ4, HEADER};
use loci_stream::recv::decode_payload;
use loci_stream::{Codec, SinkSpec};

/// A stored (uncompressed, flags 0) DATA frame whose `comp_len` (50) is below its `raw_len` (100).
fn short_stored_frame() -> (Header, Vec<u8>) {
    let payload = vec![7u8; 50];
    let hdr = Header {
        kind: kind::DATA,
        flags: 0,
        raw_len: 100,
        comp_len: 50,
        a: 0,
        b: xxh3_64(&payload), // passes the payload checksum
        c: 0,
    };
    (hdr, payload)
}

#[test]
fn a_stored_payload_shorter_than_its_chunk_is_refused_by_the_header_check() {
    let (hdr, payload) = short_stored_frame();
    let decoded = hdr;
    let e = decoded.check_data(100, 1).unwrap_err().to_string();
    assert!(
        e.contains("stored") && e.contains("50") && e.contains("100"),
        "{e}"
    );
    // Longer than the chunk too.
    let long = Header {
        comp_len: 101,
        ..decoded
    };
    assert!(long.check_data(1000, 1).is_err());
    // Exactly the raw size is the only valid stored size.
    let exact = Header {
        comp_len: 100,
        ..decoded
    };
    exact.check_data(100, 1).unwrap();
    // Past the header check, the payload step errs instead of panicking in copy_from_slice.
    let mut raw = vec![0u8; 100];
    for codec in Codec::ALL {
        let e = decode_payload(codec, &hdr, &payload, &mut raw).unwrap_err();
        assert!(e.to_string().contains("stored"), "{e}");
    }
    // And decodes what it should.
    decode_payload(Codec::Lz4C, &exact, &[9u8; 100], &mut raw).unwrap();
    assert_eq!(raw, vec![9u8; 100]);
    let mut block = vec![0u8; Codec::bound(100)];
    let n = Codec::Lz4Flex.compress(&[3u8; 100], &mut block).unwrap();
    let lz4 = Header {
        flags: FLAG_LZ4,
        comp_len: n as u32,
        ..exact
    };
    lz4.check_data(100, 1).unwrap();
    decode_payload(Codec::Lz4C, &lz4, &block[..n], &mut raw).unwrap();
    assert_eq!(raw, vec![3u8; 100]);
}

/// The whole receiver: before the fix, this frame passed every check and its decompress thread
/// panicked (`copy_from_slice` of 50 bytes into 100), leaving the stream stuck. Now the receiver
/// refuses the frame and closes the connection.
#[test]
fn the_receiver_closes_a_connection_that_sends_a_short_stored_frame() {
    let secret = "frames-test-secret-0123";
    let limit = Duration::from_secs(60);
    let r = Recv {
        secret,
        streams: 1,
        verify_on_disk: false,
        limit,
    };
    let (addr, stop, recv) = common::start(ReceiverConfig::default(), SinkSpec::Memory, &r);

    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let hello = Hello {
        stream: 0,
        conn: 0,
        conns: 1,
        session: 1,
        transfer: 2,
        chunk_bytes: 100,
        total_chunks: 1,
        total_bytes: 100,
        resume: false,
        codec: Codec::Lz4C,
        protection: Protection::Auth,
    };
    let mut est = proto::client_handshake(&mut s, secret.as_bytes(), &hello).unwrap();
    assert!(est.have.is_empty());
    // Sealed with the connection's key: the frame authenticates, and only its lengths are wrong.
    let (hdr, payload) = short_stored_frame();
    let mut scratch = Vec::new();
    let (h, p) = est.seal.seal(hdr, &payload, &mut scratch);
    s.write_all(&h).unwrap();
    s.write_all(p).unwrap();
    // The receiver answers with nothing (no ACK, no NACK) and closes: EOF or a reset.
    let mut buf = [0u8; HEADER];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!(
            "the receiver answered a bad frame with {n} bytes: {:?}",
            &buf[..n]
        ),
        Err(e) => assert!(
            e.kind() == std::io::ErrorKind::ConnectionReset,
            "the receiver neither closed nor answered: {e}"
        ),
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        recv.join().unwrap().is_err(),
        "the stream cannot have ended"
    );
}
