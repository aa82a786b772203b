//! Stream frames as the receiver handles them: a 48-byte header (`Header::decode`: checksum,
//! type), the limits of a DATA header (`check_data`, before any buffer is allocated), then its
//! payload turned into the raw chunk (`recv::decode_payload`: LZ4 block or stored bytes), with
//! both codecs. Also the codecs themselves: any payload compresses and decompresses back.
//!
//! Input: `opts | chunk_bytes-1 (u16 LE) | total_chunks-1 (u8) | frames...`, each frame a header
//! and, for DATA, `comp_len` payload bytes. `opts` bit 0 rewrites each header's checksum (the
//! fuzzer cannot find xxh3 values, and the checks behind it are the interesting part), bit 1
//! picks lz4_flex instead of the C library, bit 2 runs the codec round trip on each payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loci_stream::proto::{kind, Header, ProtoError, FLAG_LZ4, HEADER};
use loci_stream::recv::decode_payload;
use loci_stream::Codec;
use xxhash_rust::xxh3::xxh3_64;

fuzz_target!(|data: &[u8]| {
    let [opts, c0, c1, t0, rest @ ..] = data else {
        return;
    };
    let fix_check = opts & 1 != 0;
    let codec = if opts & 2 != 0 {
        Codec::Lz4Flex
    } else {
        Codec::Lz4C
    };
    let chunk_bytes = 1 + u16::from_le_bytes([*c0, *c1]) as u64;
    let total_chunks = 1 + *t0 as u64;
    let mut input = rest;
    while input.len() >= HEADER {
        let mut h: [u8; HEADER] = input[..HEADER].try_into().unwrap();
        input = &input[HEADER..];
        if fix_check {
            let check = xxh3_64(&h[..40]);
            h[40..].copy_from_slice(&check.to_le_bytes());
        }
        let hdr = match Header::decode(&h) {
            Ok(hdr) => hdr,
            Err(ProtoError::HeaderCheck | ProtoError::Type(_)) => return, // framing lost
            Err(e) => panic!("decode can only fail on the checksum or the type, got {e}"),
        };
        // What decodes encodes back to a header that decodes to the same value (the reserved
        // bytes are not kept, so the bytes themselves may differ).
        assert_eq!(Header::decode(&hdr.encode()).ok(), Some(hdr));
        if hdr.kind != kind::DATA {
            continue; // END/ACK/NACK/END_ACK carry no payload
        }
        if hdr.check_data(chunk_bytes, total_chunks).is_err() {
            return; // the receiver closes the connection here
        }
        assert!(hdr.a < total_chunks && hdr.raw_len as u64 <= chunk_bytes);
        assert!(hdr.comp_len as usize <= Codec::bound(hdr.raw_len as usize));
        let Some(payload) = input.get(..hdr.comp_len as usize) else {
            return; // the connection ended inside a payload
        };
        input = &input[hdr.comp_len as usize..];
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
