//! The receiver's journal (`FILE.loci-journal`) as a resumed file sink loads it
//! (`sink::parse_journal`, the bytes `load_journal` reads): what survived a crash or a power loss
//! is outside input, torn, overwritten or forged.
//!
//! Input: `opts | transfer | chunk_bytes-1 (u16 LE) | total_chunks-1 (u8) | ops...`. The input
//! after the first five bytes is first loaded as a whole journal as it is (the fuzzer cannot
//! forge its checksums; no panic, and it must not be read as this transfer's). Then the harness
//! writes a journal itself, in the format the module doc of `sink.rs` describes, from the ops:
//! `0 seq hash[8]` a record of this transfer, `1 seq hash[8] x` one of another transfer,
//! `2 bytes[24]` 24 bytes as they are, `3 seq hash[8] bit` a record with one bit flipped,
//! `4 seq hash[8] n` the first `n % 24` bytes of a record, the end of the journal (a torn
//! write). `opts` bits 0-1 pick the header: 0 this transfer's, 1 one byte changed (at
//! `opts >> 2`), 2 version 1, 3 another chunk size.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use loci_stream::hash::xxh3_64;
use loci_stream::sink::{parse_journal, Transfer};

const HEADER: usize = 48;
const RECORD: usize = 24;

/// The 48-byte header: magic, version, reserved, transfer, chunk bytes, total chunks, xxh3-64 of
/// the 40 bytes before it.
fn header(t: &Transfer, version: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(b"LOCIJRNL");
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[16..24].copy_from_slice(&t.transfer.to_le_bytes());
    h[24..32].copy_from_slice(&t.chunk_bytes.to_le_bytes());
    h[32..40].copy_from_slice(&t.total_chunks.to_le_bytes());
    let c = xxh3_64(&h[..40]);
    h[40..].copy_from_slice(&c.to_le_bytes());
    h
}

/// A 24-byte record: seq, chunk hash, xxh3-64 of (seq, chunk hash, transfer).
fn record(seq: u64, hash: u64, transfer: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[..8].copy_from_slice(&seq.to_le_bytes());
    r[8..16].copy_from_slice(&hash.to_le_bytes());
    r[16..].copy_from_slice(&transfer.to_le_bytes());
    let c = xxh3_64(&r);
    r[16..].copy_from_slice(&c.to_le_bytes());
    r
}

/// Whether `rec` is a valid record of `t` (its fields, if so).
fn valid(rec: &[u8], t: &Transfer) -> Option<(u64, u64)> {
    let seq = u64::from_le_bytes(rec[..8].try_into().unwrap());
    let hash = u64::from_le_bytes(rec[8..16].try_into().unwrap());
    (seq < t.total_chunks && rec == record(seq, hash, t.transfer)).then_some((seq, hash))
}

/// What every load returns: seqs sorted, unique and inside the stream, at most one per record.
fn check_shape(got: &[(u64, u64)], len: usize, t: &Transfer) {
    assert!(
        got.windows(2).all(|w| w[0].0 < w[1].0),
        "sorted by seq, once each"
    );
    assert!(got.iter().all(|&(s, _)| s < t.total_chunks));
    assert!(got.len() <= len.saturating_sub(HEADER) / RECORD);
}

/// Takes `n` bytes from the front of `input`.
fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = input.split_at_checked(n)?;
    *input = rest;
    Some(head)
}

fn u64_of(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().unwrap())
}

fuzz_target!(|data: &[u8]| {
    let [opts, tid, c0, c1, n0, rest @ ..] = data else {
        return;
    };
    let chunk_bytes = 1 + u64::from(u16::from_le_bytes([*c0, *c1]));
    let total_chunks = 1 + u64::from(*n0);
    let t = Transfer {
        transfer: u64::from(*tid),
        chunk_bytes,
        total_chunks,
        total_bytes: chunk_bytes * total_chunks,
    };

    // The fuzzer's bytes as they are: its own header could only match by forging a checksum.
    if let Some(got) = parse_journal(rest, &t) {
        assert_eq!(&rest[..HEADER], &header(&t, 2), "a foreign header was read");
        check_shape(&got, rest.len(), &t);
    }

    // A journal written from the ops, and what loading it must give: the last record of each
    // seq, up to the first record that is not a valid record of this transfer.
    let mut j = header(&t, 2).to_vec();
    let mut want = BTreeMap::new();
    let mut ended = false;
    let mut input = rest;
    while let Some(&[op]) = take(&mut input, 1) {
        let rec = match op % 5 {
            2 => {
                let Some(b) = take(&mut input, RECORD) else {
                    break;
                };
                b.try_into().unwrap()
            }
            op => {
                let Some(b) = take(&mut input, 9) else { break };
                let (seq, hash) = (u64::from(b[0]), u64_of(&b[1..]));
                let mut r = record(seq, hash, t.transfer);
                match op {
                    0 => {}
                    1 => {
                        let Some(x) = take(&mut input, 1) else { break };
                        let other = t.transfer ^ (1 + u64::from(x[0]));
                        r = record(seq, hash, other);
                        ended = true;
                    }
                    3 => {
                        let Some(x) = take(&mut input, 1) else { break };
                        let bit = x[0] as usize % (RECORD * 8);
                        r[bit / 8] ^= 1 << (bit % 8);
                        ended = true;
                    }
                    _ => {
                        let Some(x) = take(&mut input, 1) else { break };
                        j.extend_from_slice(&r[..x[0] as usize % RECORD]);
                        break;
                    }
                }
                r
            }
        };
        // (Another transfer's record, or one with a flipped bit, ends the journal: it could only
        // check by a 64-bit collision.)
        if !ended {
            match valid(&rec, &t) {
                Some((seq, hash)) => {
                    want.insert(seq, hash);
                }
                None => ended = true,
            }
        }
        j.extend_from_slice(&rec);
    }
    let want: Vec<(u64, u64)> = want.into_iter().collect();

    let (journal, expect) = match opts & 3 {
        0 => (j, Some(want.clone())),
        1 => {
            let at = (*opts >> 2) as usize % HEADER;
            j[at] ^= 1 + (*opts >> 2 & 0x7f);
            (j, None)
        }
        2 => {
            j[..HEADER].copy_from_slice(&header(&t, 1));
            (j, None)
        }
        _ => {
            let other = Transfer {
                chunk_bytes: t.chunk_bytes + 1,
                ..t
            };
            j[..HEADER].copy_from_slice(&header(&other, 2));
            (j, None)
        }
    };
    let got = parse_journal(&journal, &t);
    assert_eq!(got, expect, "opts {opts}");
    if let Some(got) = &got {
        check_shape(got, journal.len(), &t);
        // A resume rewrites the journal listing only what it kept: that loads back the same.
        let mut compact = header(&t, 2).to_vec();
        for &(seq, hash) in got {
            compact.extend_from_slice(&record(seq, hash, t.transfer));
        }
        assert_eq!(parse_journal(&compact, &t).as_ref(), Some(got));
        // Any other transfer reads none of it.
        let other = Transfer {
            transfer: t.transfer + 1,
            ..t
        };
        assert_eq!(parse_journal(&journal, &other), None);
    }
    // A journal cut anywhere after its header (what a torn tail leaves) loads, and records only
    // chunks the whole journal records.
    if let Some(full) = &got {
        for cut in [HEADER, journal.len() - 1, journal.len() / 2] {
            let Some(part) = journal.get(..cut).filter(|p| p.len() >= HEADER) else {
                continue;
            };
            let part = parse_journal(part, &t).expect("the header is intact");
            assert!(part.iter().all(|(s, _)| full.iter().any(|(f, _)| f == s)));
        }
    }
});
