//! Frame protection: the per-connection keys (HKDF over the secret and both nonces), and what
//! seals and opens every frame after the handshake in each [`Protection`] mode.

use std::io::Read;

use crate::hash::{xxh3_128, xxh3_64};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use aws_lc_rs::{constant_time, hkdf};

use super::{kind, Header, Hello, Protection, ProtoError, FIELDS, HEADER, SEALED_EXTRA};

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
    let key = |dir: &[u8]| {
        let mut info = b"loci-stream/3 frames ".to_vec();
        info.extend_from_slice(dir);
        info.extend_from_slice(&hello.stream.to_le_bytes());
        info.extend_from_slice(&hello.conn.to_le_bytes());
        FrameKey::new(hello.protection, hkdf_sha256(&salt, secret, &info))
    };
    let (s2r, r2s) = (key(b"s->r"), key(b"r->s"));
    match side {
        Side::Sender => (Sealer(s2r), Opener(r2s)),
        Side::Receiver => (Sealer(r2s), Opener(s2r)),
    }
}

/// HKDF-SHA256 (RFC 5869): 32 bytes expanded with `info` from the key extracted from `ikm` with
/// `salt`.
fn hkdf_sha256(salt: &[u8], ikm: &[u8], info: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 32];
    hkdf::Salt::new(hkdf::HKDF_SHA256, salt)
        .extract(ikm)
        .expand(&[info], hkdf::HKDF_SHA256)
        .and_then(|okm| okm.fill(&mut k))
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    k
}

/// AES-256-GCM from aws-lc (`aws-lc-rs`): on this project's machines it runs the AVX-512
/// VAES/VPCLMULQDQ code paths, 6-8x RustCrypto's `aes-gcm` and, for authentication alone, about
/// 4x keyed BLAKE3 (docs/stream.md, "Frame protection with aws-lc").
enum Cipher {
    Checksum,
    /// `auth`: the GCM tag of the payload as associated data and the header fields as plaintext
    /// (their ciphertext is not sent).
    Mac(LessSafeKey),
    /// `encrypt`: GCM over the payload, the header fields as associated data.
    Aead(LessSafeKey),
}

/// One direction's key and frame counter.
struct FrameKey {
    cipher: Cipher,
    counter: u64,
}

impl FrameKey {
    fn new(p: Protection, k: [u8; 32]) -> Self {
        let gcm = || {
            LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &k).expect("32 bytes is an AES-256 key"))
        };
        let cipher = match p {
            Protection::Checksum => Cipher::Checksum,
            Protection::Auth => Cipher::Mac(gcm()),
            Protection::Encrypt => Cipher::Aead(gcm()),
        };
        FrameKey { cipher, counter: 0 }
    }
    fn next(&mut self) -> u64 {
        let c = self.counter;
        self.counter += 1;
        c
    }
    /// The `auth` tag of a frame: AES-256-GCM's tag with the payload as associated data and the
    /// 40 header bytes as plaintext. GCM's tag authenticates both, and it reads the payload once
    /// with GHASH alone, no cipher. The receiver computes the same tag from what it received.
    fn mac(key: &LessSafeKey, counter: u64, fields: &[u8], payload: &[u8]) -> [u8; 16] {
        let mut f: [u8; FIELDS] = fields.try_into().expect("the header's fields");
        let tag = key
            .seal_in_place_separate_tag(Self::nonce(counter), Aad::from(payload), &mut f)
            .expect("AES-GCM seals any frame below 64 GiB");
        tag.as_ref().try_into().expect("a 16-byte GCM tag")
    }
    /// The frame's nonce: its counter, then four zero bytes. Each direction of each connection
    /// has its own key and counts from 0, so no nonce repeats under a key.
    fn nonce(counter: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[..8].copy_from_slice(&counter.to_le_bytes());
        Nonce::assume_unique_for_key(n)
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
                    .seal_in_place_separate_tag(FrameKey::nonce(counter), Aad::from(&f), scratch)
                    .expect("AES-GCM seals any frame below 64 GiB");
                out[FIELDS..].copy_from_slice(tag.as_ref());
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
                if constant_time::verify_slices_are_equal(&want, tag).is_err() {
                    return Err(ProtoError::FrameAuth);
                }
                Ok((h, 0))
            }
            Cipher::Aead(c) => {
                c.open_in_place_separate_tag(
                    FrameKey::nonce(counter),
                    Aad::from(fields),
                    tag,
                    wire,
                )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::handshake::tests::hello;
    use crate::proto::FLAG_LZ4;

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
    fn hkdf_matches_rfc_5869() {
        // RFC 5869, A.1: the first 32 of its 42 output bytes.
        let ikm = [0x0bu8; 22];
        let salt: Vec<u8> = (0u8..=0x0c).collect();
        let info: Vec<u8> = (0xf0u8..=0xf9).collect();
        let want = "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf";
        let got: String = hkdf_sha256(&salt, &ikm, &info)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, want);
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
}
