//! The loci-stream wire protocol, version 4. All integers are little-endian. (Version 2 carried
//! only an xxh3 checksum in every frame, which anyone on the path could recompute; version 3
//! authenticates every frame, with keyed BLAKE3 in `auth`; version 4 computes the `auth` tag
//! with AES-256-GCM, several times faster here. The labels `loci-stream/1 ...` and
//! `loci-stream/3 ...` inside the handshake MACs and key derivation are fixed domain separators,
//! not versions.)
//!
//! ## Handshake (one per TCP connection)
//! 1. receiver -> sender, `ServerHello` (44 bytes): magic `LOCISTRM` (8) | version u16 | reserved
//!    u16 | challenge (32 random bytes).
//! 2. sender -> receiver, `ClientHello` (125 bytes): magic (8) | version u16 | stream id u32 |
//!    connection index u16 | connection count u16 | session u64 (random per sender process) |
//!    transfer u64 (identity of the data: same source, same value; a resumed sender must present
//!    the same one) | chunk bytes u64 | total chunks u64 | total raw bytes u64 | mode u8
//!    (0 = fresh, 1 = resume) | codec u8 | protection u8 ([`Protection`]: 0 checksum, 1 auth,
//!    2 encrypt) | client nonce (32) | mac (32) where `mac = HMAC-SHA256(secret, "loci-stream/1
//!    client" || challenge || every preceding byte of the ClientHello)`.
//! 3. receiver -> sender: status u8. `0` = accepted, followed by the chunks the receiver's sink
//!    already has as ranges, `count u32 | count x (start u64, end u64 exclusive)`, then
//!    `HMAC-SHA256(secret, "loci-stream/3 server" || client nonce || challenge || the count and
//!    ranges)` (32), so the sender knows it talks to a receiver holding the secret and that the
//!    list is the receiver's. `1` = refused, `2` = refused for now (the stream is live with another
//!    sender: retry), either followed by a message (length u16 | UTF-8), e.g. a wrong secret, an
//!    unknown stream id, a version the receiver does not speak, a protection below what the
//!    receiver requires, or chunk sizes beyond its limits.
//!
//! ## Frame keys
//! `prk = HKDF-SHA256-Extract(salt = challenge || client nonce, ikm = secret)`, and one key per
//! direction, `HKDF-Expand(prk, "loci-stream/3 frames " || dir || stream id u32 || connection
//! index u16, 32)` with `dir` = `s->r` or `r->s`. Both nonces are fresh per connection, so every
//! connection has its own keys; each direction counts its frames from 0 (the counter is not
//! sent). A frame is therefore bound to its stream, connection, direction and position: a
//! forged, replayed, reordered or spliced frame fails its tag.
//!
//! ## Frames (after the handshake): a 56-byte header, then the payload (DATA only)
//! `type u8 | flags u8 | reserved u16 | raw_len u32 | comp_len u32 | reserved u32 | a u64 | b u64
//! | c u64 | tag (16)`. What `tag` is depends on the [`Protection`] the sender asked for:
//! - `checksum`: xxh3-128 of the 40 bytes before it; DATA's `b` is xxh3-64 of the payload. Catches
//!   accidents, not attacks: anyone on the path can recompute both.
//! - `auth` (the default): the AES-256-GCM tag under the direction's key, nonce `counter u64 ||
//!   0u32`, with the payload as associated data and the 40 header bytes as plaintext (their
//!   ciphertext is not sent: the header travels in the clear); `b` is 0. GCM's tag authenticates
//!   both inputs, and the receiver recomputes it from the header and payload it received.
//! - `encrypt`: AES-256-GCM with the direction's key, nonce `counter u64 || 0u32`, the 40 header
//!   bytes as associated data; a DATA frame's plaintext is `c u64 || payload` (the header's `c`
//!   is 0 on the wire so the raw chunk's hash does not leak), so its wire payload is
//!   `8 + comp_len` bytes; a control frame's plaintext is empty.
//!
//! A frame whose tag fails ends the connection: nothing it carried is used, and the sender resends
//! whatever was unacknowledged on it over a new connection (a new handshake, new keys).
//!
//! | type | dir | a | b | c |
//! |---|---|---|---|---|
//! | 1 DATA | s->r | sequence number | xxh3 of the payload (checksum mode) or 0 | xxh3 of the raw chunk |
//! | 2 END | s->r | total chunks | total raw bytes | whole-stream checksum ([`StreamHasher`]) |
//! | 3 ACK | r->s | first seq | end seq (exclusive) | 0 |
//! | 4 NACK | r->s | seq | reason (1 payload checksum, 2 raw checksum, 3 decode) | 0 |
//! | 5 END_ACK | r->s | receiver's whole-stream xxh3 | status (0 equal, 1 differs, 2 chunks missing) | chunks |
//!
//! DATA flags: bit 0 = payload is an LZ4 block (else stored raw, `comp_len == raw_len`).
//! Limits are checked on the header before any buffer is allocated: `raw_len <=` the chunk size
//! agreed in the handshake (itself `<=` the receiver's `max_chunk_bytes`), `comp_len <=`
//! LZ4's bound of `raw_len` (stored: `comp_len == raw_len`), `seq <` total chunks. The receiver ACKs a chunk only once its sink
//! holds it (for a file sink: written, and recorded in the fsync'd journal); the sender keeps
//! every unacknowledged chunk and resends it after a NACK or a reconnect.

mod handshake;
mod seal;

use std::collections::BTreeMap;
use std::io;

use crate::hash::Xxh3;

use crate::codec::Codec;

pub use handshake::{
    client_handshake, nonce, refuse, refuse_busy, server_accept, server_hello, Established, Hello,
};
pub use seal::{frame_keys, Incoming, Opener, Sealer, Side};

/// Protocol magic.
pub const MAGIC: &[u8; 8] = b"LOCISTRM";
/// The protocol version this build speaks.
pub const VERSION: u16 = 4;
/// Frame header size.
pub const HEADER: usize = 56;
/// Header bytes covered by the tag (everything before it).
pub(crate) const FIELDS: usize = 40;
/// Bytes an encrypted DATA frame adds to its payload: the raw chunk's hash, inside the ciphertext.
pub const SEALED_EXTRA: usize = 8;

/// Frame types.
pub mod kind {
    pub const DATA: u8 = 1;
    pub const END: u8 = 2;
    pub const ACK: u8 = 3;
    pub const NACK: u8 = 4;
    pub const END_ACK: u8 = 5;
}
/// DATA flag: the payload is an LZ4 block.
pub const FLAG_LZ4: u8 = 1;

/// How the frames after the handshake are protected; the sender asks, the receiver may require
/// more. Ordered from weakest to strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Protection {
    /// xxh3 checksums only: accidents are caught, forgeries are not.
    Checksum,
    /// Every frame authenticated (an AES-256-GCM tag under a per-connection key).
    #[default]
    Auth,
    /// Authenticated, and DATA payloads encrypted (AES-256-GCM).
    Encrypt,
}

impl Protection {
    /// The name used in configs, flags and reports.
    pub fn name(self) -> &'static str {
        match self {
            Protection::Checksum => "checksum",
            Protection::Auth => "auth",
            Protection::Encrypt => "encrypt",
        }
    }
    pub(crate) fn code(self) -> u8 {
        self as u8
    }
    pub(crate) fn from_code(c: u8) -> Option<Self> {
        [Protection::Checksum, Protection::Auth, Protection::Encrypt]
            .get(c as usize)
            .copied()
    }
}

/// Errors of the wire protocol. Every one names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("not a loci-stream peer (magic {0:02x?}, expected \"LOCISTRM\")")]
    Magic([u8; 8]),
    #[error("peer speaks protocol version {peer}, this build speaks {ours}")]
    Version { peer: u16, ours: u16 },
    #[error("the receiver refused the connection: {0}")]
    Refused(String),
    #[error("the receiver refused the connection for now: {0}")]
    Busy(String),
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error("corrupt frame header (checksum mismatch); framing lost")]
    HeaderCheck,
    #[error(
        "a frame failed authentication (forged, replayed, reordered or damaged on the path); \
         the connection is closed"
    )]
    FrameAuth,
    #[error("DATA payload checksum mismatch")]
    PayloadCheck,
    #[error("frame violates a limit: {0}")]
    Limit(String),
    #[error("unknown frame type {0}")]
    Type(u8),
}

/// Half-open ranges of sequence numbers `[start, end)`.
pub type Ranges = Vec<(u64, u64)>;

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub kind: u8,
    pub flags: u8,
    pub raw_len: u32,
    pub comp_len: u32,
    pub a: u64,
    pub b: u64,
    pub c: u64,
}

impl Header {
    /// A control frame (no payload).
    pub fn control(kind: u8, a: u64, b: u64, c: u64) -> Self {
        Header {
            kind,
            a,
            b,
            c,
            ..Default::default()
        }
    }
    /// The 40 bytes the tag covers.
    pub fn fields(&self) -> [u8; FIELDS] {
        let mut h = [0u8; FIELDS];
        h[0] = self.kind;
        h[1] = self.flags;
        h[4..8].copy_from_slice(&self.raw_len.to_le_bytes());
        h[8..12].copy_from_slice(&self.comp_len.to_le_bytes());
        h[16..24].copy_from_slice(&self.a.to_le_bytes());
        h[24..32].copy_from_slice(&self.b.to_le_bytes());
        h[32..40].copy_from_slice(&self.c.to_le_bytes());
        h
    }
    /// Reads the fields of a header and checks the frame type. The fields are not yet
    /// authenticated: use them only for limits until [`Opener::open`] has checked the tag.
    pub fn parse(h: &[u8; HEADER]) -> Result<Self, ProtoError> {
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
        let hd = Header {
            kind: h[0],
            flags: h[1],
            raw_len: u32_at(4),
            comp_len: u32_at(8),
            a: u64_at(16),
            b: u64_at(24),
            c: u64_at(32),
        };
        if !(kind::DATA..=kind::END_ACK).contains(&hd.kind) {
            return Err(ProtoError::Type(hd.kind));
        }
        Ok(hd)
    }
    /// Checks a DATA header against the limits agreed in the handshake, before allocating.
    pub fn check_data(&self, chunk_bytes: u64, total_chunks: u64) -> Result<(), ProtoError> {
        if self.a >= total_chunks {
            return Err(ProtoError::Limit(format!(
                "sequence number {} beyond the stream's {total_chunks} chunks",
                self.a
            )));
        }
        if self.raw_len as u64 > chunk_bytes || self.raw_len == 0 {
            return Err(ProtoError::Limit(format!(
                "raw size {} outside 1..={chunk_bytes}",
                self.raw_len
            )));
        }
        // A stored (uncompressed) payload is the chunk itself: exactly `raw_len` bytes. Anything
        // else used to pass here and panic in the receiver's copy into the raw buffer.
        if self.flags & FLAG_LZ4 == 0 && self.comp_len != self.raw_len {
            return Err(ProtoError::Limit(format!(
                "stored (uncompressed) payload of {} bytes for raw size {}; a stored payload must \
                 be exactly the raw size",
                self.comp_len, self.raw_len
            )));
        }
        let max = if self.flags & FLAG_LZ4 != 0 {
            Codec::bound(self.raw_len as usize) as u64
        } else {
            self.raw_len as u64
        };
        if self.comp_len as u64 > max || self.comp_len == 0 {
            return Err(ProtoError::Limit(format!(
                "compressed size {} outside 1..={max} for raw size {}",
                self.comp_len, self.raw_len
            )));
        }
        Ok(())
    }
}

/// The whole-stream checksum carried by END: xxh3-64 over the sequence of every chunk's xxh3-64
/// (the `c` of its DATA frame, 8 bytes little-endian), in sequence order.
///
/// Each side already hashes every raw chunk once (the sender to fill `c`, the receiver to check
/// the decoded data against it), so combining those hashes in order covers every byte, every
/// chunk's presence and their order without hashing the raw stream a second time on each side
/// (a hash list, as in BitTorrent or a one-level Merkle tree). Chunks complete out of order; early
/// ones wait here (8 bytes each) until their turn.
#[derive(Default)]
pub struct StreamHasher {
    next: u64,
    h: Xxh3,
    pending: BTreeMap<u64, u64>,
}

impl StreamHasher {
    /// An empty stream.
    pub fn new() -> Self {
        Self::default()
    }
    /// Records chunk `seq`'s hash. A chunk already recorded (a resend) is ignored.
    pub fn add(&mut self, seq: u64, chunk_hash: u64) {
        if seq < self.next {
            return;
        }
        self.pending.entry(seq).or_insert(chunk_hash);
        while let Some(c) = self.pending.remove(&self.next) {
            self.h.update(&c.to_le_bytes());
            self.next += 1;
        }
    }
    /// How many chunks from the start are hashed (the first gap).
    pub fn hashed(&self) -> u64 {
        self.next
    }
    /// The checksum of the chunks hashed so far.
    pub fn digest(&self) -> u64 {
        self.h.digest()
    }
}

/// Turns a sorted, deduplicated list of numbers into ranges.
pub fn to_ranges(sorted: impl IntoIterator<Item = u64>) -> Ranges {
    let mut out: Ranges = Vec::new();
    for s in sorted {
        match out.last_mut() {
            Some((_, e)) if *e == s => *e += 1,
            _ => out.push((s, s + 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::xxh3_64;

    #[test]
    fn limits_are_checked_before_allocation() {
        let mut h = Header {
            kind: kind::DATA,
            flags: FLAG_LZ4,
            raw_len: 1000,
            comp_len: 600,
            a: 7,
            ..Default::default()
        };
        assert!(h.check_data(1000, 8).is_ok());
        assert!(h
            .check_data(999, 8)
            .unwrap_err()
            .to_string()
            .contains("raw size"));
        assert!(h
            .check_data(1000, 7)
            .unwrap_err()
            .to_string()
            .contains("sequence"));
        h.comp_len = u32::MAX;
        assert!(h
            .check_data(1000, 8)
            .unwrap_err()
            .to_string()
            .contains("compressed size"));
        h.flags = 0;
        h.comp_len = 1001;
        assert!(h.check_data(1000, 8).is_err());
    }

    #[test]
    fn stream_hasher_orders_chunks_and_ignores_resends() {
        let hashes: Vec<u64> = (0..50u64).map(|i| xxh3_64(&i.to_le_bytes())).collect();
        let mut inorder = StreamHasher::new();
        for (i, &c) in hashes.iter().enumerate() {
            inorder.add(i as u64, c);
        }
        assert_eq!(inorder.hashed(), 50);
        // Out of order, with resends: the same digest.
        let mut h = StreamHasher::new();
        for i in (0..50u64).rev().chain([3, 49, 0]) {
            h.add(i, hashes[i as usize]);
        }
        assert_eq!(h.hashed(), 50);
        assert_eq!(h.digest(), inorder.digest());
        // A gap stops it; a changed chunk or a swapped order changes the digest.
        let mut gap = StreamHasher::new();
        for i in (0..50u64).filter(|&i| i != 7) {
            gap.add(i, hashes[i as usize]);
        }
        assert_eq!(gap.hashed(), 7);
        let mut changed = StreamHasher::new();
        let mut swapped = StreamHasher::new();
        for i in 0..50u64 {
            changed.add(i, hashes[i as usize] ^ (i == 20) as u64);
            let j = match i {
                4 => 5,
                5 => 4,
                i => i,
            };
            swapped.add(i, hashes[j as usize]);
        }
        assert_ne!(changed.digest(), inorder.digest());
        assert_ne!(swapped.digest(), inorder.digest());
    }

    #[test]
    fn ranges() {
        assert_eq!(to_ranges([0, 1, 2, 5, 7, 8]), vec![(0, 3), (5, 6), (7, 9)]);
        assert!(to_ranges([]).is_empty());
    }
}
