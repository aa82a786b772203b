//! The loci-stream wire protocol, version 3. All integers are little-endian. (Version 2 carried
//! only an xxh3 checksum in every frame, which anyone on the path could recompute; version 3
//! authenticates every frame. The labels `loci-stream/1 ...` inside the handshake MACs are fixed
//! domain separators, not versions.)
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
//! - `auth` (the default): the first 16 bytes of BLAKE3 keyed with the direction's key over
//!   `counter u64 || the 40 header bytes || payload`; `b` is 0.
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

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes256Gcm, KeyInit as _};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use xxhash_rust::xxh3::{xxh3_128, xxh3_64, Xxh3};

use crate::codec::Codec;

/// Protocol magic.
pub const MAGIC: &[u8; 8] = b"LOCISTRM";
/// The protocol version this build speaks.
pub const VERSION: u16 = 3;
/// Frame header size.
pub const HEADER: usize = 56;
/// Header bytes covered by the tag (everything before it).
const FIELDS: usize = 40;
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
    /// Every frame authenticated (BLAKE3 keyed with a per-connection key).
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
    fn code(self) -> u8 {
        self as u8
    }
    fn from_code(c: u8) -> Option<Self> {
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

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn verify_mac(secret: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    let mut m = <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
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
    pub protection: Protection,
}

const CLIENT_HELLO: usize = 8 + 2 + 4 + 2 + 2 + 8 * 5 + 1 + 1 + 1 + 32 + 32;

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
        b.push(self.protection.code());
        b.extend_from_slice(nonce);
        b
    }
}

/// Half-open ranges of sequence numbers `[start, end)`.
pub type Ranges = Vec<(u64, u64)>;

/// What an accepted handshake gives the sender.
pub struct Established {
    /// The chunks the receiver already has.
    pub have: Ranges,
    /// Seals the frames this side sends on the connection.
    pub seal: Sealer,
    /// Opens the frames this side receives on it.
    pub open: Opener,
}

/// Sender side of the handshake.
pub fn client_handshake<S: Read + Write>(
    s: &mut S,
    secret: &[u8],
    hello: &Hello,
) -> Result<Established, ProtoError> {
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
        let msg = String::from_utf8_lossy(&msg).into();
        return Err(if st[0] == STATUS_BUSY {
            ProtoError::Busy(msg)
        } else {
            ProtoError::Refused(msg)
        });
    }
    // The chunks the receiver holds, then its MAC over them: nothing of it is believed before
    // the MAC checks out.
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let count = u32::from_le_bytes(n) as usize;
    if count > 1 << 20 {
        return Err(ProtoError::Limit(format!("{count} resume ranges")));
    }
    let mut listed = n.to_vec();
    listed.resize(4 + 16 * count, 0);
    s.read_exact(&mut listed[4..])?;
    let mut smac = [0u8; 32];
    s.read_exact(&mut smac)?;
    if !verify_mac(
        secret,
        &[b"loci-stream/3 server", &cn, &challenge, &listed],
        &smac,
    ) {
        return Err(ProtoError::Auth(
            "the receiver's answer does not carry the shared secret's MAC: a receiver with \
             another secret, or the answer was altered on the way"
                .into(),
        ));
    }
    let mut ranges: Ranges = Vec::with_capacity(count);
    for r in listed[4..].chunks_exact(16) {
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
    let (seal, open) = frame_keys(secret, &challenge, &cn, hello, Side::Sender);
    Ok(Established {
        have: ranges,
        seal,
        open,
    })
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
        protection: match Protection::from_code(b[60]) {
            Some(p) => p,
            None => {
                let msg = format!(
                    "unknown frame protection {} (valid: 0 checksum, 1 auth, 2 encrypt)",
                    b[60]
                );
                let _ = refuse(s, &msg);
                return Err(ProtoError::Limit(msg));
            }
        },
    };
    let cn: [u8; 32] = b[61..93].try_into().unwrap();
    Ok((hello, challenge, cn))
}

/// Receiver side, part 2: accept, proving the secret, and tell the sender what the sink has.
/// Returns the receiver's frame keys for the connection: (sealer for r->s, opener for s->r).
pub fn server_accept<W: Write>(
    s: &mut W,
    secret: &[u8],
    hello: &Hello,
    challenge: &[u8; 32],
    client_nonce: &[u8; 32],
    have: &[(u64, u64)],
) -> io::Result<(Sealer, Opener)> {
    let mut listed = (have.len() as u32).to_le_bytes().to_vec();
    for &(a, b) in have {
        listed.extend_from_slice(&a.to_le_bytes());
        listed.extend_from_slice(&b.to_le_bytes());
    }
    let mut out = vec![0u8];
    out.extend_from_slice(&listed);
    out.extend_from_slice(&mac(
        secret,
        &[b"loci-stream/3 server", client_nonce, challenge, &listed],
    ));
    s.write_all(&out)?;
    s.flush()?;
    Ok(frame_keys(
        secret,
        challenge,
        client_nonce,
        hello,
        Side::Receiver,
    ))
}

/// Refusal status: for good (a wrong secret, an unknown stream, a bad hello).
const STATUS_REFUSED: u8 = 1;
/// Refusal status: for now (the stream is live with another sender); the sender may try again.
const STATUS_BUSY: u8 = 2;

/// Receiver side: refuse with a message the sender prints.
pub fn refuse<W: Write>(s: &mut W, msg: &str) -> io::Result<()> {
    refusal(s, STATUS_REFUSED, msg)
}

/// Receiver side: refuse for now (the sender retries until its reconnect timeout).
pub fn refuse_busy<W: Write>(s: &mut W, msg: &str) -> io::Result<()> {
    refusal(s, STATUS_BUSY, msg)
}

fn refusal<W: Write>(s: &mut W, status: u8, msg: &str) -> io::Result<()> {
    let m = &msg.as_bytes()[..msg.len().min(u16::MAX as usize)];
    let mut out = vec![status];
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

/// Which end of a connection a key set is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Sender,
    Receiver,
}

/// The frame keys of one connection, from the handshake's secret and both nonces (see the
/// module documentation): a sealer for what `side` sends and an opener for what it receives.
pub fn frame_keys(
    secret: &[u8],
    challenge: &[u8; 32],
    client_nonce: &[u8; 32],
    hello: &Hello,
    side: Side,
) -> (Sealer, Opener) {
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(challenge);
    salt[32..].copy_from_slice(client_nonce);
    let hk = hkdf::Hkdf::<Sha256>::new(Some(&salt), secret);
    let key = |dir: &[u8]| {
        let mut info = b"loci-stream/3 frames ".to_vec();
        info.extend_from_slice(dir);
        info.extend_from_slice(&hello.stream.to_le_bytes());
        info.extend_from_slice(&hello.conn.to_le_bytes());
        let mut k = [0u8; 32];
        hk.expand(&info, &mut k)
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        FrameKey::new(hello.protection, k)
    };
    let (s2r, r2s) = (key(b"s->r"), key(b"r->s"));
    match side {
        Side::Sender => (Sealer(s2r), Opener(r2s)),
        Side::Receiver => (Sealer(r2s), Opener(s2r)),
    }
}

enum Cipher {
    Checksum,
    Mac([u8; 32]),
    Aead(Box<Aes256Gcm>),
}

/// One direction's key and frame counter.
struct FrameKey {
    cipher: Cipher,
    counter: u64,
}

impl FrameKey {
    fn new(p: Protection, k: [u8; 32]) -> Self {
        let cipher = match p {
            Protection::Checksum => Cipher::Checksum,
            Protection::Auth => Cipher::Mac(k),
            Protection::Encrypt => Cipher::Aead(Box::new(Aes256Gcm::new(&k.into()))),
        };
        FrameKey { cipher, counter: 0 }
    }
    fn next(&mut self) -> u64 {
        let c = self.counter;
        self.counter += 1;
        c
    }
    fn mac(key: &[u8; 32], counter: u64, fields: &[u8], payload: &[u8]) -> [u8; 16] {
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(&counter.to_le_bytes());
        h.update(fields);
        h.update(payload);
        h.finalize().as_bytes()[..16].try_into().unwrap()
    }
    fn nonce(counter: u64) -> aes_gcm::Nonce<aes_gcm::aead::consts::U12> {
        let mut n = [0u8; 12];
        n[..8].copy_from_slice(&counter.to_le_bytes());
        n.into()
    }
}

/// Seals the frames one side sends on one connection.
pub struct Sealer(FrameKey);

impl Sealer {
    /// The protection it applies.
    pub fn protection(&self) -> Protection {
        match self.0.cipher {
            Cipher::Checksum => Protection::Checksum,
            Cipher::Mac(_) => Protection::Auth,
            Cipher::Aead(_) => Protection::Encrypt,
        }
    }

    /// A sealed control frame (no payload).
    pub fn control(&mut self, h: Header) -> [u8; HEADER] {
        let mut scratch = Vec::new();
        self.seal(h, &[], &mut scratch).0
    }

    /// Seals a frame: its header, and the bytes to send after it (`payload` itself, or its
    /// ciphertext written into `scratch`). DATA's `b` (and, encrypted, `c`) are set here.
    pub fn seal<'a>(
        &mut self,
        mut h: Header,
        payload: &'a [u8],
        scratch: &'a mut Vec<u8>,
    ) -> ([u8; HEADER], &'a [u8]) {
        let counter = self.0.next();
        let data = h.kind == kind::DATA;
        let mut out = [0u8; HEADER];
        match &self.0.cipher {
            Cipher::Checksum => {
                if data {
                    h.b = xxh3_64(payload);
                }
                out[..FIELDS].copy_from_slice(&h.fields());
                let tag = xxh3_128(&out[..FIELDS]);
                out[FIELDS..].copy_from_slice(&tag.to_le_bytes());
                (out, payload)
            }
            Cipher::Mac(k) => {
                if data {
                    h.b = 0;
                }
                let f = h.fields();
                out[..FIELDS].copy_from_slice(&f);
                out[FIELDS..].copy_from_slice(&FrameKey::mac(k, counter, &f, payload));
                (out, payload)
            }
            Cipher::Aead(c) => {
                scratch.clear();
                if data {
                    scratch.extend_from_slice(&h.c.to_le_bytes());
                    scratch.extend_from_slice(payload);
                    h.b = 0;
                    h.c = 0;
                }
                let f = h.fields();
                out[..FIELDS].copy_from_slice(&f);
                let tag = c
                    .encrypt_in_place_detached(&FrameKey::nonce(counter), &f, scratch)
                    .expect("AES-GCM seals any frame below 64 GiB");
                out[FIELDS..].copy_from_slice(&tag);
                (out, &scratch[..])
            }
        }
    }
}

/// A frame header as read, not yet authenticated (see [`Opener::open`]).
#[derive(Debug, Clone, Copy)]
pub struct Incoming {
    /// The parsed fields; trust them only for limits until the frame is opened.
    pub hdr: Header,
    raw: [u8; HEADER],
}

impl Incoming {
    /// The bytes that follow the header on the wire.
    pub fn wire_len(&self, p: Protection) -> usize {
        if self.hdr.kind != kind::DATA {
            0
        } else if p == Protection::Encrypt {
            self.hdr.comp_len as usize + SEALED_EXTRA
        } else {
            self.hdr.comp_len as usize
        }
    }
}

/// Opens (authenticates, decrypts) the frames one side receives on one connection.
pub struct Opener(FrameKey);

impl Opener {
    /// The protection it checks.
    pub fn protection(&self) -> Protection {
        match self.0.cipher {
            Cipher::Checksum => Protection::Checksum,
            Cipher::Mac(_) => Protection::Auth,
            Cipher::Aead(_) => Protection::Encrypt,
        }
    }

    /// Reads one frame header. In checksum mode its checksum is checked here (a mismatch means
    /// framing is lost); otherwise the tag is checked by [`Opener::open`] with the payload.
    pub fn read_header<R: Read>(&self, r: &mut R) -> Result<Incoming, ProtoError> {
        let mut raw = [0u8; HEADER];
        r.read_exact(&mut raw)?;
        if matches!(self.0.cipher, Cipher::Checksum) {
            let tag = u128::from_le_bytes(raw[FIELDS..].try_into().unwrap());
            if tag != xxh3_128(&raw[..FIELDS]) {
                return Err(ProtoError::HeaderCheck);
            }
        }
        Ok(Incoming {
            hdr: Header::parse(&raw)?,
            raw,
        })
    }

    /// Checks a frame read with [`Opener::read_header`] and `wire`, the [`Incoming::wire_len`]
    /// bytes after it, and returns its header and where its payload starts in `wire`. Encrypted
    /// payloads are decrypted in place and the raw chunk's hash is restored into `c`. Every
    /// frame advances the counter, so frames must be opened in the order they arrived.
    /// `ProtoError::FrameAuth` ends the connection; `ProtoError::PayloadCheck` (checksum mode
    /// only) names a damaged DATA payload that can be asked for again.
    pub fn open(&mut self, f: &Incoming, wire: &mut [u8]) -> Result<(Header, usize), ProtoError> {
        let counter = self.0.next();
        let mut h = f.hdr;
        let fields = &f.raw[..FIELDS];
        let tag = &f.raw[FIELDS..];
        match &self.0.cipher {
            Cipher::Checksum => {
                if h.kind == kind::DATA && xxh3_64(wire) != h.b {
                    return Err(ProtoError::PayloadCheck);
                }
                Ok((h, 0))
            }
            Cipher::Mac(k) => {
                let want = FrameKey::mac(k, counter, fields, wire);
                if !bool::from(want.ct_eq(tag)) {
                    return Err(ProtoError::FrameAuth);
                }
                Ok((h, 0))
            }
            Cipher::Aead(c) => {
                c.decrypt_in_place_detached(&FrameKey::nonce(counter), fields, wire, tag.into())
                    .map_err(|_| ProtoError::FrameAuth)?;
                if h.kind != kind::DATA {
                    return Ok((h, 0));
                }
                if wire.len() < SEALED_EXTRA {
                    return Err(ProtoError::FrameAuth);
                }
                h.c = u64::from_le_bytes(wire[..SEALED_EXTRA].try_into().unwrap());
                Ok((h, SEALED_EXTRA))
            }
        }
    }

    /// Reads and opens a control frame (one without payload); a DATA frame is an error.
    pub fn read_control<R: Read>(&mut self, r: &mut R) -> Result<Header, ProtoError> {
        let f = self.read_header(r)?;
        if f.hdr.kind == kind::DATA {
            return Err(ProtoError::Limit(
                "a DATA frame where only control frames may come".into(),
            ));
        }
        Ok(self.open(&f, &mut [])?.0)
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
            protection: Protection::Auth,
        }
    }

    fn run(client_secret: &'static [u8], server_secret: &'static [u8]) -> (String, String) {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let srv = std::thread::spawn(move || match server_hello(&mut b, server_secret) {
            Ok((h, ch, cn)) => {
                assert_eq!(h, hello());
                server_accept(&mut b, server_secret, &h, &ch, &cn, &[(0, 3), (5, 6)]).unwrap();
                "accepted".to_string()
            }
            Err(e) => e.to_string(),
        });
        let c = match client_handshake(&mut a, client_secret, &hello()) {
            Ok(r) => format!("{:?}", r.have),
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
            let (h, ch, cn) = server_hello(&mut b, b"k").unwrap();
            server_accept(&mut b, b"k", &h, &ch, &cn, &[(0, 3), (2, 4)]).unwrap();
        });
        let Err(e) = client_handshake(&mut a, b"k", &hello()) else {
            panic!("accepted overlapping ranges")
        };
        srv.join().unwrap();
        assert!(e.to_string().contains("overlaps"), "{e}");
    }

    /// The resume list is covered by the receiver's MAC: a party on the path that rewrites it
    /// (to make the sender skip chunks the receiver lacks) is caught.
    #[test]
    fn an_altered_resume_list_fails_the_receivers_mac() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let srv = std::thread::spawn(move || {
            let (h, ch, cn) = server_hello(&mut b, b"k").unwrap();
            let mut out = Vec::new();
            server_accept(&mut out, b"k", &h, &ch, &cn, &[(0, 3)]).unwrap();
            out[1 + 4 + 8] = 9; // the range's end: 0..3 becomes 0..9
            b.write_all(&out).unwrap();
        });
        let Err(e) = client_handshake(&mut a, b"k", &hello()) else {
            panic!("an altered resume list was believed")
        };
        srv.join().unwrap();
        assert!(matches!(e, ProtoError::Auth(_)), "{e}");
    }

    #[test]
    fn a_busy_refusal_is_told_apart() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let srv = std::thread::spawn(move || {
            server_hello(&mut b, b"k").unwrap();
            refuse_busy(&mut b, "stream 3 is live with another sender").unwrap();
        });
        let Err(e) = client_handshake(&mut a, b"k", &hello()) else {
            panic!("accepted")
        };
        srv.join().unwrap();
        assert!(
            matches!(e, ProtoError::Busy(ref m) if m.contains("live")),
            "{e}"
        );
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

    /// Both ends' frame keys for one connection of `hello()` with protection `p`.
    fn keys(p: Protection, secret: &[u8], nonce_byte: u8) -> ((Sealer, Opener), (Sealer, Opener)) {
        let h = Hello {
            protection: p,
            ..hello()
        };
        let (ch, cn) = ([nonce_byte; 32], [7u8; 32]);
        (
            frame_keys(secret, &ch, &cn, &h, Side::Sender),
            frame_keys(secret, &ch, &cn, &h, Side::Receiver),
        )
    }

    fn data(seq: u64) -> (Header, Vec<u8>) {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 + seq as u32) as u8).collect();
        let h = Header {
            kind: kind::DATA,
            flags: FLAG_LZ4,
            raw_len: 2000,
            comp_len: payload.len() as u32,
            a: seq,
            b: 0,
            c: 0xfeed_0000 + seq,
        };
        (h, payload)
    }

    /// Seals a frame into wire bytes.
    fn wire(seal: &mut Sealer, h: Header, payload: &[u8]) -> Vec<u8> {
        let mut scratch = Vec::new();
        let (hd, p) = seal.seal(h, payload, &mut scratch);
        let mut w = hd.to_vec();
        w.extend_from_slice(p);
        w
    }

    /// Reads and opens one frame from wire bytes: its header and payload.
    fn unwire(open: &mut Opener, w: &[u8]) -> Result<(Header, Vec<u8>), ProtoError> {
        let mut r = w;
        let f = open.read_header(&mut r)?;
        let mut buf = vec![0u8; f.wire_len(open.protection())];
        r.read_exact(&mut buf)?;
        let (h, off) = open.open(&f, &mut buf)?;
        Ok((h, buf[off..].to_vec()))
    }

    #[test]
    fn sealed_frames_round_trip_in_every_mode() {
        for p in [Protection::Checksum, Protection::Auth, Protection::Encrypt] {
            let ((mut s_seal, mut s_open), (mut r_seal, mut r_open)) = keys(p, b"secret", 1);
            for seq in 0..3 {
                let (h, payload) = data(seq);
                let w = wire(&mut s_seal, h, &payload);
                if p == Protection::Encrypt {
                    assert_eq!(w.len(), HEADER + SEALED_EXTRA + payload.len());
                    assert!(
                        !w.windows(64).any(|x| x == &payload[..64]),
                        "plaintext on the wire"
                    );
                    assert!(
                        !w.windows(8).any(|x| x == h.c.to_le_bytes()),
                        "raw hash on the wire"
                    );
                }
                let (got, body) = unwire(&mut r_open, &w).unwrap();
                assert_eq!(
                    (got.a, got.c, got.comp_len),
                    (h.a, h.c, h.comp_len),
                    "{p:?}"
                );
                assert_eq!(body, payload, "{p:?}");
            }
            let ack = r_seal.control(Header::control(kind::ACK, 0, 3, 0));
            let got = s_open.read_control(&mut &ack[..]).unwrap();
            assert_eq!((got.kind, got.a, got.b), (kind::ACK, 0, 3));
        }
    }

    #[test]
    fn authenticated_frames_refuse_forgery_replay_reordering_and_splicing() {
        for p in [Protection::Auth, Protection::Encrypt] {
            // Forgery: any flipped bit, in the header or the payload.
            let (h, payload) = data(5);
            let w = {
                let ((mut seal, _), _) = keys(p, b"secret", 1);
                wire(&mut seal, h, &payload)
            };
            for bit in (0..w.len() * 8).step_by(61) {
                let mut x = w.clone();
                x[bit / 8] ^= 1 << (bit % 8);
                let (_, (_, mut open)) = keys(p, b"secret", 1);
                let r = unwire(&mut open, &x);
                assert!(r.is_err(), "{p:?}: flipped bit {bit} accepted");
            }
            // Replay and reordering: frames 0 and 1, opened as 1, 0 or 0, 0.
            let ((mut seal, _), _) = keys(p, b"secret", 1);
            let f0 = wire(&mut seal, data(0).0, &data(0).1);
            let f1 = wire(&mut seal, data(1).0, &data(1).1);
            let (_, (_, mut open)) = keys(p, b"secret", 1);
            assert!(
                matches!(unwire(&mut open, &f1), Err(ProtoError::FrameAuth)),
                "{p:?}"
            );
            let (_, (_, mut open)) = keys(p, b"secret", 1);
            unwire(&mut open, &f0).unwrap();
            assert!(
                matches!(unwire(&mut open, &f0), Err(ProtoError::FrameAuth)),
                "{p:?}"
            );
            // Splicing: a frame of another connection (other nonces), of another stream, or
            // from the other direction; a wrong secret.
            let (_, (_, mut other_conn)) = keys(p, b"secret", 2);
            assert!(unwire(&mut other_conn, &f0).is_err(), "{p:?}");
            let h2 = Hello {
                stream: 4,
                protection: p,
                ..hello()
            };
            let (_, mut other_stream) =
                frame_keys(b"secret", &[1; 32], &[7; 32], &h2, Side::Receiver);
            assert!(unwire(&mut other_stream, &f0).is_err(), "{p:?}");
            let ((_, mut wrong_dir), _) = keys(p, b"secret", 1);
            assert!(unwire(&mut wrong_dir, &f0).is_err(), "{p:?}");
            let (_, (_, mut wrong_secret)) = keys(p, b"other", 1);
            assert!(unwire(&mut wrong_secret, &f0).is_err(), "{p:?}");
        }
    }

    #[test]
    fn checksum_frames_catch_accidents_only() {
        let ((mut seal, _), (_, mut open)) = keys(Protection::Checksum, b"secret", 1);
        let (h, payload) = data(0);
        let w = wire(&mut seal, h, &payload);
        // A flipped header bit is lost framing; a flipped payload bit is a NACK.
        for bit in 0..HEADER * 8 {
            let mut x = w.clone();
            x[bit / 8] ^= 1 << (bit % 8);
            let (_, (_, mut o)) = keys(Protection::Checksum, b"secret", 1);
            assert!(unwire(&mut o, &x).is_err(), "bit {bit}");
        }
        let mut x = w.clone();
        x[HEADER + 10] ^= 1;
        assert!(matches!(
            unwire(&mut open, &x),
            Err(ProtoError::PayloadCheck)
        ));
        // ... and anyone can forge one: no key is needed to seal a frame.
        let (_, (_, mut o)) = keys(Protection::Checksum, b"secret", 1);
        let ((mut forger, _), _) = keys(Protection::Checksum, b"not the secret", 9);
        let forged = wire(&mut forger, Header { comp_len: 11, ..h }, b"forged data");
        assert_eq!(unwire(&mut o, &forged).unwrap().1, b"forged data");
    }

    #[test]
    fn unknown_protection_is_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let srv = std::thread::spawn(move || server_hello(&mut b, b"k").map(|_| ()));
        let mut sh = [0u8; 44];
        a.read_exact(&mut sh).unwrap();
        let challenge: [u8; 32] = sh[12..44].try_into().unwrap();
        let mut body = hello().body(&[3; 32]);
        body[60] = 9;
        let tag = mac(b"k", &[b"loci-stream/1 client", &challenge, &body]);
        body.extend_from_slice(&tag);
        a.write_all(&body).unwrap();
        let e = srv.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("unknown frame protection 9"), "{e}");
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
