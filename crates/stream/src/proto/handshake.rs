//! The handshake, one per TCP connection (layout in the module documentation of `proto`): the
//! receiver's challenge, the sender's authenticated hello, the receiver's answer (the chunks it
//! holds, under its MAC) or refusal; both ends then derive the connection's frame keys.

use std::io::{self, Read, Write};

use aws_lc_rs::{constant_time, hmac};

use super::seal::{frame_keys, Opener, Sealer, Side};
use super::{Protection, ProtoError, Ranges, MAGIC, VERSION};
use crate::codec::Codec;

/// HMAC-SHA256 of the concatenated `parts` under `secret`.
fn mac(secret: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, secret));
    for p in parts {
        m.update(p);
    }
    m.sign()
        .as_ref()
        .try_into()
        .expect("HMAC-SHA256 tags are 32 bytes")
}

/// Whether `tag` is the HMAC-SHA256 of `parts` under `secret` (compared in constant time).
fn verify_mac(secret: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    constant_time::verify_slices_are_equal(&mac(secret, parts), tag).is_ok()
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::thread::JoinHandle;

    #[test]
    fn mac_is_hmac_sha256_of_the_parts_concatenated() {
        // RFC 4231, test case 2, the data split in two parts.
        let want = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        let parts: [&[u8]; 2] = [b"what do ya ", b"want for nothing?"];
        let got: String = mac(b"Jefe", &parts)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, want);
        let tag = mac(b"Jefe", &parts);
        assert!(verify_mac(b"Jefe", &parts, &tag));
        let mut bad = tag;
        bad[31] ^= 1;
        assert!(!verify_mac(b"Jefe", &parts, &bad));
        assert!(!verify_mac(b"Jefe", &parts, &tag[..16]), "a short tag");
    }

    pub(crate) fn hello() -> Hello {
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

    /// A client end whose server has sent its hello (returned too) and waits in `server_hello`
    /// (secret `k`) for the client's; its thread ends with that verdict.
    fn greeted() -> (UnixStream, [u8; 44], JoinHandle<Result<(), ProtoError>>) {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let srv = std::thread::spawn(move || server_hello(&mut b, b"k").map(|_| ()));
        let mut sh = [0u8; 44];
        a.read_exact(&mut sh).unwrap();
        (a, sh, srv)
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
        let (mut a, _, srv) = greeted();
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

        let (mut a, _, srv) = greeted();
        a.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        assert!(matches!(srv.join().unwrap(), Err(ProtoError::Magic(_))));
    }

    #[test]
    fn unknown_protection_is_refused() {
        let (mut a, sh, srv) = greeted();
        let challenge: [u8; 32] = sh[12..44].try_into().unwrap();
        let mut body = hello().body(&[3; 32]);
        body[60] = 9;
        let tag = mac(b"k", &[b"loci-stream/1 client", &challenge, &body]);
        body.extend_from_slice(&tag);
        a.write_all(&body).unwrap();
        let e = srv.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("unknown frame protection 9"), "{e}");
    }
}
