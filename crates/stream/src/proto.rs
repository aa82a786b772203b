//! The loci-stream wire protocol, version 2. All integers are little-endian. (Version 1 defined
//! END's whole-stream checksum as xxh3 over the raw bytes; version 2 hashes the chunks' hashes,
//! see [`StreamHasher`]. The labels `loci-stream/1 ...` inside the MACs are fixed domain
//! separators, not versions.)
//!
//! ## Handshake (one per TCP connection)
//! 1. receiver -> sender, `ServerHello` (44 bytes): magic `LOCISTRM` (8) | version u16 | reserved
//!    u16 | challenge (32 random bytes).
//! 2. sender -> receiver, `ClientHello` (124 bytes): magic (8) | version u16 | stream id u32 |
//!    connection index u16 | connection count u16 | session u64 (random per sender process) |
//!    transfer u64 (identity of the data: same source, same value; a resumed sender must present
//!    the same one) | chunk bytes u64 | total chunks u64 | total raw bytes u64 | mode u8
//!    (0 = fresh, 1 = resume) | codec u8 | client nonce (32) | mac (32) where
//!    `mac = HMAC-SHA256(secret, "loci-stream/1 client" || challenge || every preceding byte of
//!    the ClientHello)`.
//! 3. receiver -> sender: status u8. `0` = accepted, followed by `HMAC-SHA256(secret,
//!    "loci-stream/1 server" || client nonce || challenge)` (32) so the sender knows it talks to
//!    a receiver holding the secret, then the chunks the receiver's sink already has as ranges:
//!    count u32 | count x (start u64, end u64 exclusive). Any other status = refused, followed by
//!    a message (length u16 | UTF-8), e.g. a wrong secret, an unknown stream id, a version the
//!    receiver does not speak, or chunk sizes beyond its limits.
//!
//! ## Frames (after the handshake): a 48-byte header, then `comp_len` payload bytes (DATA only)
//! `type u8 | flags u8 | reserved u16 | raw_len u32 | comp_len u32 | reserved u32 | a u64 | b u64
//! | c u64 | check u64`, where `check` = xxh3-64 of the 40 bytes before it. A header whose check
//! fails means framing is lost: the connection is closed and the sender resends whatever was
//! unacknowledged on it.
//!
//! | type | dir | a | b | c |
//! |---|---|---|---|---|
//! | 1 DATA | s->r | sequence number | xxh3 of the payload as sent | xxh3 of the raw chunk |
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

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::codec::Codec;

/// Protocol magic.
pub const MAGIC: &[u8; 8] = b"LOCISTRM";
/// The protocol version this build speaks.
pub const VERSION: u16 = 2;
/// Frame header size.
pub const HEADER: usize = 48;

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
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error("corrupt frame header (checksum mismatch); framing lost")]
    HeaderCheck,
    #[error("frame violates a limit: {0}")]
    Limit(String),
    #[error("unknown frame type {0}")]
    Type(u8),
}

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn verify_mac(secret: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.verify_slice(tag).is_ok() // constant-time comparison
}

/// 32 random bytes from the OS.
pub fn nonce() -> [u8; 32] {
    use rand::Rng;
    let mut n = [0u8; 32];
    rand::rng().fill_bytes(&mut n);
    n
}

/// What a sender says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub stream: u32,
    pub conn: u16,
    pub conns: u16,
    pub session: u64,
    pub transfer: u64,
    pub chunk_bytes: u64,
    pub total_chunks: u64,
    pub total_bytes: u64,
    pub resume: bool,
    pub codec: Codec,
}

const CLIENT_HELLO: usize = 8 + 2 + 4 + 2 + 2 + 8 * 5 + 1 + 1 + 32 + 32;

impl Hello {
    fn body(&self, nonce: &[u8; 32]) -> Vec<u8> {
        let mut b = Vec::with_capacity(CLIENT_HELLO);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.stream.to_le_bytes());
        b.extend_from_slice(&self.conn.to_le_bytes());
        b.extend_from_slice(&self.conns.to_le_bytes());
        for v in [
            self.session,
            self.transfer,
            self.chunk_bytes,
            self.total_chunks,
            self.total_bytes,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.push(self.resume as u8);
        b.push(match self.codec {
            Codec::Lz4C => 0,
            Codec::Lz4Flex => 1,
        });
        b.extend_from_slice(nonce);
        b
    }
}

/// Half-open ranges of sequence numbers `[start, end)`.
pub type Ranges = Vec<(u64, u64)>;

/// Sender side of the handshake: returns the chunks the receiver already has.
pub fn client_handshake<S: Read + Write>(
    s: &mut S,
    secret: &[u8],
    hello: &Hello,
) -> Result<Ranges, ProtoError> {
    let mut sh = [0u8; 44];
    s.read_exact(&mut sh)?;
    let magic: [u8; 8] = sh[..8].try_into().unwrap();
    if &magic != MAGIC {
        return Err(ProtoError::Magic(magic));
    }
    let ver = u16::from_le_bytes([sh[8], sh[9]]);
    if ver != VERSION {
        return Err(ProtoError::Version {
            peer: ver,
            ours: VERSION,
        });
    }
    let challenge: [u8; 32] = sh[12..44].try_into().unwrap();
    let cn = nonce();
    let mut body = hello.body(&cn);
    let tag = mac(secret, &[b"loci-stream/1 client", &challenge, &body]);
    body.extend_from_slice(&tag);
    s.write_all(&body)?;
    s.flush()?;
    let mut st = [0u8; 1];
    s.read_exact(&mut st)?;
    if st[0] != 0 {
        let mut l = [0u8; 2];
        s.read_exact(&mut l)?;
        let mut msg = vec![0u8; u16::from_le_bytes(l) as usize];
        s.read_exact(&mut msg)?;
        return Err(ProtoError::Refused(String::from_utf8_lossy(&msg).into()));
    }
    let mut smac = [0u8; 32];
    s.read_exact(&mut smac)?;
    if !verify_mac(secret, &[b"loci-stream/1 server", &cn, &challenge], &smac) {
        return Err(ProtoError::Auth(
            "the receiver does not hold the same shared secret (LOCI_STREAM_SECRET or `secret` in \
             the config)"
                .into(),
        ));
    }
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > 1 << 20 {
        return Err(ProtoError::Limit(format!("{n} resume ranges")));
    }
    let mut ranges: Ranges = Vec::with_capacity(n);
    for _ in 0..n {
        let mut r = [0u8; 16];
        s.read_exact(&mut r)?;
        let a = u64::from_le_bytes(r[..8].try_into().unwrap());
        let b = u64::from_le_bytes(r[8..].try_into().unwrap());
        if a >= b || b > hello.total_chunks {
            return Err(ProtoError::Limit(format!(
                "resume range {a}..{b} outside 0..{}",
                hello.total_chunks
            )));
        }
        // The receiver sends sorted, disjoint ranges (`to_ranges` of its sink's set); overlaps
        // would count chunks twice (the sender sums them at the end).
        if let Some(&(_, prev_end)) = ranges.last() {
            if a < prev_end {
                return Err(ProtoError::Limit(format!(
                    "resume range {a}..{b} overlaps or precedes the one before (ending at \
                     {prev_end})"
                )));
            }
        }
        ranges.push((a, b));
    }
    Ok(ranges)
}

/// Receiver side, part 1: sends the challenge, reads and authenticates the hello. On an
/// authentication or version failure the refusal is already sent to the peer.
pub fn server_hello<S: Read + Write>(
    s: &mut S,
    secret: &[u8],
) -> Result<(Hello, [u8; 32], [u8; 32]), ProtoError> {
    let challenge = nonce();
    let mut sh = Vec::with_capacity(44);
    sh.extend_from_slice(MAGIC);
    sh.extend_from_slice(&VERSION.to_le_bytes());
    sh.extend_from_slice(&[0, 0]);
    sh.extend_from_slice(&challenge);
    s.write_all(&sh)?;
    s.flush()?;
    let mut b = [0u8; CLIENT_HELLO];
    // Read the fixed prefix first so a peer speaking another version gets a clear refusal.
    s.read_exact(&mut b[..10])?;
    let magic: [u8; 8] = b[..8].try_into().unwrap();
    if &magic != MAGIC {
        return Err(ProtoError::Magic(magic));
    }
    let ver = u16::from_le_bytes([b[8], b[9]]);
    if ver != VERSION {
        let _ = refuse(
            s,
            &format!("protocol version {ver} is not supported (this receiver speaks {VERSION})"),
        );
        return Err(ProtoError::Version {
            peer: ver,
            ours: VERSION,
        });
    }
    s.read_exact(&mut b[10..])?;
    let body = &b[..CLIENT_HELLO - 32];
    let tag = &b[CLIENT_HELLO - 32..];
    if !verify_mac(secret, &[b"loci-stream/1 client", &challenge, body], tag) {
        let msg = "authentication failed: the sender's HMAC does not match; both sides need the \
                   same shared secret (LOCI_STREAM_SECRET or `secret` in the config)";
        let _ = refuse(s, msg);
        return Err(ProtoError::Auth(msg.into()));
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let hello = Hello {
        stream: u32::from_le_bytes(b[10..14].try_into().unwrap()),
        conn: u16_at(14),
        conns: u16_at(16),
        session: u64_at(18),
        transfer: u64_at(26),
        chunk_bytes: u64_at(34),
        total_chunks: u64_at(42),
        total_bytes: u64_at(50),
        resume: b[58] != 0,
        codec: if b[59] == 1 {
            Codec::Lz4Flex
        } else {
            Codec::Lz4C
        },
    };
    let cn: [u8; 32] = b[60..92].try_into().unwrap();
    Ok((hello, challenge, cn))
}

/// Receiver side, part 2: accept, proving the secret, and tell the sender what the sink has.
pub fn server_accept<W: Write>(
    s: &mut W,
    secret: &[u8],
    challenge: &[u8; 32],
    client_nonce: &[u8; 32],
    have: &[(u64, u64)],
) -> io::Result<()> {
    let mut out = vec![0u8];
    out.extend_from_slice(&mac(
        secret,
        &[b"loci-stream/1 server", client_nonce, challenge],
    ));
    out.extend_from_slice(&(have.len() as u32).to_le_bytes());
    for &(a, b) in have {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
    s.write_all(&out)?;
    s.flush()
}

/// Receiver side: refuse with a message the sender prints.
pub fn refuse<W: Write>(s: &mut W, msg: &str) -> io::Result<()> {
    let m = &msg.as_bytes()[..msg.len().min(u16::MAX as usize)];
    let mut out = vec![1u8];
    out.extend_from_slice(&(m.len() as u16).to_le_bytes());
    out.extend_from_slice(m);
    s.write_all(&out)?;
    s.flush()
}

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
    /// Encodes with the header checksum.
    pub fn encode(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[0] = self.kind;
        h[1] = self.flags;
        h[4..8].copy_from_slice(&self.raw_len.to_le_bytes());
        h[8..12].copy_from_slice(&self.comp_len.to_le_bytes());
        h[16..24].copy_from_slice(&self.a.to_le_bytes());
        h[24..32].copy_from_slice(&self.b.to_le_bytes());
        h[32..40].copy_from_slice(&self.c.to_le_bytes());
        let check = xxh3_64(&h[..40]);
        h[40..48].copy_from_slice(&check.to_le_bytes());
        h
    }
    /// Decodes and checks the header checksum and the frame type.
    pub fn decode(h: &[u8; HEADER]) -> Result<Self, ProtoError> {
        let check = u64::from_le_bytes(h[40..48].try_into().unwrap());
        if check != xxh3_64(&h[..40]) {
            return Err(ProtoError::HeaderCheck);
        }
        let hd = Header {
            kind: h[0],
            flags: h[1],
            raw_len: u32::from_le_bytes(h[4..8].try_into().unwrap()),
            comp_len: u32::from_le_bytes(h[8..12].try_into().unwrap()),
            a: u64::from_le_bytes(h[16..24].try_into().unwrap()),
            b: u64::from_le_bytes(h[24..32].try_into().unwrap()),
            c: u64::from_le_bytes(h[32..40].try_into().unwrap()),
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

/// Reads one header.
pub fn read_header<R: Read>(r: &mut R) -> Result<Header, ProtoError> {
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h)?;
    Header::decode(&h)
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
    use std::os::unix::net::UnixStream;

    fn hello() -> Hello {
        Hello {
            stream: 3,
            conn: 1,
            conns: 4,
            session: 99,
            transfer: 1234,
            chunk_bytes: 1000,
            total_chunks: 10,
            total_bytes: 9999,
            resume: true,
            codec: Codec::Lz4Flex,
        }
    }

    fn run(client_secret: &'static [u8], server_secret: &'static [u8]) -> (String, String) {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let srv = std::thread::spawn(move || match server_hello(&mut b, server_secret) {
            Ok((h, ch, cn)) => {
                assert_eq!(h, hello());
                server_accept(&mut b, server_secret, &ch, &cn, &[(0, 3), (5, 6)]).unwrap();
                "accepted".to_string()
            }
            Err(e) => e.to_string(),
        });
        let c = match client_handshake(&mut a, client_secret, &hello()) {
            Ok(r) => format!("{r:?}"),
            Err(e) => e.to_string(),
        };
        (c, srv.join().unwrap())
    }

    #[test]
    fn handshake_accepts_same_secret_and_reports_resume_ranges() {
        let (c, s) = run(b"k1", b"k1");
        assert_eq!(s, "accepted");
        assert_eq!(c, "[(0, 3), (5, 6)]");
    }

    #[test]
    fn overlapping_resume_ranges_are_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let srv = std::thread::spawn(move || {
            let (_, ch, cn) = server_hello(&mut b, b"k").unwrap();
            server_accept(&mut b, b"k", &ch, &cn, &[(0, 3), (2, 4)]).unwrap();
        });
        let e = client_handshake(&mut a, b"k", &hello()).unwrap_err();
        srv.join().unwrap();
        assert!(e.to_string().contains("overlaps"), "{e}");
    }

    #[test]
    fn wrong_secret_is_refused_with_a_clear_message() {
        let (c, s) = run(b"wrong", b"right");
        assert!(s.contains("authentication failed"), "{s}");
        assert!(
            c.contains("refused") && c.contains("LOCI_STREAM_SECRET"),
            "{c}"
        );
    }

    #[test]
    fn other_versions_and_non_peers_are_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let srv = std::thread::spawn(move || server_hello(&mut b, b"k").map(|_| ()));
        let mut sh = [0u8; 44];
        a.read_exact(&mut sh).unwrap();
        let mut bad = MAGIC.to_vec();
        bad.extend_from_slice(&7u16.to_le_bytes());
        a.write_all(&bad).unwrap();
        let e = srv.join().unwrap().unwrap_err();
        assert!(matches!(e, ProtoError::Version { peer: 7, .. }), "{e}");
        let mut st = [0u8; 3];
        a.read_exact(&mut st).unwrap();
        assert_eq!(st[0], 1);
        let mut msg = vec![0u8; u16::from_le_bytes([st[1], st[2]]) as usize];
        a.read_exact(&mut msg).unwrap();
        assert!(String::from_utf8(msg).unwrap().contains("version 7"));

        let (mut a, mut b) = UnixStream::pair().unwrap();
        let srv = std::thread::spawn(move || server_hello(&mut b, b"k").map(|_| ()));
        a.read_exact(&mut sh).unwrap();
        a.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        assert!(matches!(srv.join().unwrap(), Err(ProtoError::Magic(_))));
    }

    #[test]
    fn header_roundtrip_and_every_flipped_bit_is_caught() {
        let h = Header {
            kind: kind::DATA,
            flags: FLAG_LZ4,
            raw_len: 1000,
            comp_len: 600,
            a: 7,
            b: 0xdead,
            c: 0xbeef,
        };
        let e = h.encode();
        assert_eq!(Header::decode(&e).unwrap(), h);
        for bit in 0..HEADER * 8 {
            let mut x = e;
            x[bit / 8] ^= 1 << (bit % 8);
            assert!(Header::decode(&x).is_err(), "bit {bit}");
        }
    }

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
