//! Stream frames as the receiver handles them: a 56-byte header (`Opener::read_header`: type, and
//! in checksum mode the header checksum), the limits of a DATA header (`check_data`, before any
//! buffer is allocated), the frame opened (`Opener::open`: tag, decryption), then its payload
//! turned into the raw chunk (`recv::decode_payload`: LZ4 block or stored bytes), with both
//! codecs. Also the codecs themselves: any payload compresses and decompresses back.
//!
//! Input: `opts | chunk_bytes-1 (u16 LE) | total_chunks-1 (u8) | frames...`, each frame a header
//! and, for DATA, `comp_len` payload bytes. `opts` bit 0 seals each frame with the sender's key
//! before the receiver reads it (the fuzzer cannot forge tags, and the checks behind them are the
//! interesting part); bit 1 picks lz4_flex instead of the C library; bit 2 runs the codec round
//! trip on each payload; bits 3-4 pick the protection (0 checksum, 1 auth, 2-3 encrypt).
#![no_main]

use libfuzzer_sys::fuzz_target;
use loci_stream::hash::xxh3_64;
use loci_stream::proto::{
    frame_keys, kind, Header, Hello, Protection, ProtoError, Side, FLAG_LZ4, HEADER,
};
use loci_stream::recv::decode_payload;
use loci_stream::Codec;

fuzz_target!(|data: &[u8]| {
    let [opts, c0, c1, t0, rest @ ..] = data else {
        return;
    };
    let seal_first = opts & 1 != 0;
    let codec = if opts & 2 != 0 {
        Codec::Lz4Flex
    } else {
        Codec::Lz4C
    };
    let protection = match (opts >> 3) & 3 {
        0 => Protection::Checksum,
        1 => Protection::Auth,
        _ => Protection::Encrypt,
    };
    let chunk_bytes = 1 + u16::from_le_bytes([*c0, *c1]) as u64;
    let total_chunks = 1 + *t0 as u64;
    let hello = Hello {
        stream: 1,
        conn: 0,
        conns: 1,
        session: 2,
        transfer: 3,
        chunk_bytes,
        total_chunks,
        total_bytes: chunk_bytes * total_chunks,
        resume: false,
        codec,
        protection,
    };
    let (mut seal, _) = frame_keys(b"fuzz-secret", &[1; 32], &[2; 32], &hello, Side::Sender);
    let (_, mut open) = frame_keys(b"fuzz-secret", &[1; 32], &[2; 32], &hello, Side::Receiver);
    let mut input = rest;
    let mut scratch = Vec::new();
    while input.len() >= HEADER {
        let h: [u8; HEADER] = input[..HEADER].try_into().unwrap();
        input = &input[HEADER..];
        let Ok(fields) = Header::parse(&h) else {
            return; // an unknown type: framing lost
        };
        let plain_len = if fields.kind == kind::DATA {
            fields.comp_len as usize
        } else {
            0
        };
        let Some(payload) = input.get(..plain_len) else {
            return; // the connection ended inside a payload
        };
        input = &input[plain_len..];
        // The frame as the receiver reads it: sealed by the sender, or the fuzzer's bytes as
        // they are.
        let mut wire = h.to_vec();
        if seal_first {
            let (sh, p) = seal.seal(fields, payload, &mut scratch);
            wire = sh.to_vec();
            wire.extend_from_slice(p);
        } else {
            wire.extend_from_slice(payload);
        }
        let mut r = &wire[..];
        let f = match open.read_header(&mut r) {
            Ok(f) => f,
            Err(ProtoError::HeaderCheck | ProtoError::Type(_)) => return, // framing lost
            Err(e) => panic!("a header read can only fail on the checksum or the type: {e}"),
        };
        if f.hdr.kind == kind::DATA && f.hdr.check_data(chunk_bytes, total_chunks).is_err() {
            return; // the receiver closes the connection here
        }
        let mut body = vec![0u8; f.wire_len(protection)];
        if std::io::Read::read_exact(&mut r, &mut body).is_err() {
            return; // fuzzer bytes shorter than the frame claims
        }
        let (hdr, off) = match open.open(&f, &mut body) {
            Ok(x) => x,
            Err(ProtoError::PayloadCheck) => continue, // checksum mode: NACKed, framing holds
            Err(ProtoError::FrameAuth) => {
                assert!(
                    !seal_first || protection == Protection::Checksum,
                    "a frame sealed with the right key failed to open"
                );
                return; // the connection ends
            }
            Err(e) => panic!("open fails only on the tag or the payload checksum: {e}"),
        };
        if seal_first {
            // What was sealed opens to the same fields and bytes.
            assert_eq!(
                (hdr.kind, hdr.a, hdr.raw_len, hdr.comp_len),
                (fields.kind, fields.a, fields.raw_len, fields.comp_len)
            );
            if hdr.kind == kind::DATA {
                assert_eq!(hdr.c, fields.c);
                assert_eq!(&body[off..], payload);
            }
        }
        if hdr.kind != kind::DATA {
            continue; // END/ACK/NACK/END_ACK carry no payload
        }
        assert!(hdr.a < total_chunks && hdr.raw_len as u64 <= chunk_bytes);
        assert!(hdr.comp_len as usize <= Codec::bound(hdr.raw_len as usize));
        let payload = &body[off..];
        let mut raw = vec![0u8; hdr.raw_len as usize];
        if decode_payload(codec, &hdr, payload, &mut raw).is_ok() && hdr.flags & FLAG_LZ4 == 0 {
            assert_eq!(raw, payload, "a stored payload is the chunk itself");
        }
        let _ = xxh3_64(&raw) == hdr.c; // the receiver's check of the decoded chunk
        if opts & 4 != 0 {
            codec_roundtrip(payload);
        }
    }
});

/// `src` compressed by each codec decompresses to `src` with each codec, also through the
/// receiver's `decode_payload`.
fn codec_roundtrip(src: &[u8]) {
    for a in Codec::ALL {
        let mut block = vec![0u8; Codec::bound(src.len())];
        let n = a
            .compress(src, &mut block)
            .expect("compression into the bound fits");
        let hdr = Header {
            kind: kind::DATA,
            flags: FLAG_LZ4,
            raw_len: src.len() as u32,
            comp_len: n as u32,
            ..Default::default()
        };
        for b in Codec::ALL {
            let mut out = vec![0u8; src.len()];
            decode_payload(b, &hdr, &block[..n], &mut out)
                .unwrap_or_else(|e| panic!("{a:?} -> {b:?}: {e}"));
            assert_eq!(out, src, "{a:?} -> {b:?}");
        }
    }
}
