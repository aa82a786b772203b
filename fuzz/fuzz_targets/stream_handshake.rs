//! The stream handshake over an in-memory connection: the sender's side (`client_handshake`,
//! reading a ServerHello, a status, the receiver's MAC and its resume ranges) and the receiver's
//! (`server_hello`, reading and authenticating a ClientHello; then `server_accept`), followed by
//! whatever frame headers the peer sends next.
//!
//! Input: `opts | total_chunks (u8) | the peer's bytes`. `opts` bit 0: fuzz the receiver's side
//! (else the sender's); bit 1: the MAC the side under test checks is computed correctly here, so
//! what lies behind authentication is reached (the fuzzer cannot forge HMAC-SHA256). The
//! connection reads the peer's bytes and then EOF, so no read can block.
#![no_main]

use std::io::{self, Read, Write};

use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use loci_stream::proto::{
    client_handshake, server_accept, server_hello, to_ranges, Hello, Protection,
};
use loci_stream::Codec;
use sha2::Sha256;

const SECRET: &[u8] = b"fuzz-secret";
/// ClientHello size (its last 32 bytes are the MAC), and the size of what the MAC covers.
const CLIENT_HELLO: usize = 125;
const CLIENT_BODY: usize = CLIENT_HELLO - 32;

/// Computes bytes to splice into the reads from (what the side under test wrote, the script).
type Inject = fn(&[u8], &[u8]) -> Vec<u8>;

fn mac(parts: &[&[u8]]) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

/// An in-memory connection. Reads return the peer's `script`, with `inject` (computed from what
/// the side under test wrote so far, e.g. a MAC over its random nonce) spliced in once the read
/// position reaches `hook_at`; then EOF.
struct Conn<'a> {
    script: &'a [u8],
    pos: usize,
    hook_at: Option<usize>,
    inject: Inject,
    pending: Vec<u8>,
    written: Vec<u8>,
}

impl Read for Conn<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.hook_at == Some(self.pos) {
            self.hook_at = None;
            self.pending = (self.inject)(&self.written, self.script);
        }
        if !self.pending.is_empty() {
            let n = buf.len().min(self.pending.len());
            buf[..n].copy_from_slice(&self.pending[..n]);
            self.pending.drain(..n);
            return Ok(n);
        }
        // Stop at the hook so that the injection happens at exactly that point.
        let end = self
            .hook_at
            .unwrap_or(self.script.len())
            .min(self.script.len());
        let n = buf.len().min(end - self.pos);
        buf[..n].copy_from_slice(&self.script[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n) // 0 at the end: EOF
    }
}

impl Write for Conn<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let [opts, total, script @ ..] = data else {
        return;
    };
    let valid_mac = opts & 2 != 0;
    if opts & 1 != 0 {
        receiver_side(script, valid_mac);
    } else {
        sender_side(script, valid_mac, *total as u64);
    }
});

/// The sender's side: the script is the receiver talking.
fn sender_side(script: &[u8], valid_mac: bool, total_chunks: u64) {
    let hello = Hello {
        stream: 1,
        conn: 0,
        conns: 1,
        session: 7,
        transfer: 9,
        chunk_bytes: 1 << 20,
        total_chunks,
        total_bytes: total_chunks << 20,
        resume: true,
        codec: Codec::Lz4Flex,
        protection: Protection::Auth,
    };
    // ServerHello (44), the status byte and the resume list (count u32 and ranges) come from the
    // script; then, when asked, the receiver's MAC over the sender's nonce (bytes 61..93 of what
    // it wrote), the challenge and the list.
    let listed_end = script
        .get(45..49)
        .map(|n| u32::from_le_bytes(n.try_into().unwrap()) as usize)
        .filter(|&n| n <= 64)
        .map(|n| 49 + 16 * n)
        .filter(|&end| end <= script.len());
    let mut c = Conn {
        script,
        pos: 0,
        hook_at: if valid_mac { listed_end } else { None },
        inject: |written, script| {
            if written.len() < CLIENT_HELLO || script.get(44) != Some(&0) {
                return vec![];
            }
            let n = u32::from_le_bytes(script[45..49].try_into().unwrap()) as usize;
            mac(&[
                b"loci-stream/3 server",
                &written[61..93],
                &script[12..44],
                &script[45..49 + 16 * n],
            ])
        },
        pending: vec![],
        written: vec![],
    };
    if let Ok(mut est) = client_handshake(&mut c, SECRET, &hello) {
        // Resume ranges are sorted, disjoint, non-empty and inside the stream.
        let mut prev = 0;
        for &(a, b) in &est.have {
            assert!(
                prev <= a && a < b && b <= total_chunks,
                "bad range {a}..{b}"
            );
            prev = b;
        }
        // Then the sender reads ACK/NACK frames until the connection ends (the fuzzer cannot
        // forge their tags: each one read ends it; stream_frame fuzzes what lies behind).
        while est.open.read_control(&mut c).is_ok() {}
    }
}

/// The receiver's side: the script is the sender talking.
fn receiver_side(script: &[u8], valid_mac: bool) {
    // The ClientHello body (93 bytes) comes from the script; when asked, its MAC over the
    // receiver's random challenge (bytes 12..44 of what the receiver wrote) is spliced in.
    let mut c = Conn {
        script,
        pos: 0,
        hook_at: valid_mac.then_some(CLIENT_BODY),
        inject: |written, script| {
            if written.len() < 44 || script.len() < CLIENT_BODY {
                return vec![];
            }
            mac(&[
                b"loci-stream/1 client",
                &written[12..44],
                &script[..CLIENT_BODY],
            ])
        },
        pending: vec![],
        written: vec![],
    };
    if let Ok((hello, challenge, cn)) = server_hello(&mut c, SECRET) {
        assert!(valid_mac, "authenticated without the secret");
        // The receiver answers with the chunks its sink holds.
        let have = to_ranges(0..hello.total_chunks.min(3));
        let (_, mut open) =
            server_accept(&mut c, SECRET, &hello, &challenge, &cn, &have).expect("in-memory write");
        while open.read_control(&mut c).is_ok() {}
    }
}
