//! A man in the middle: a TCP proxy (threads of the test process) between a `loci stream send`
//! and its receiver that parses the wire protocol (the 44-byte ServerHello, the 125-byte ClientHello
//! whose byte 60 is the frame protection, the accept answer or refusal, then 56-byte frame
//! headers; a DATA frame's payload is `comp_len` bytes, 8 more in encrypt mode; control frames
//! have none) and attacks the frames without knowing the secret.
//!
//! [`Attack`] says what it does, to every connection it can ([`Persist::Always`]) or to one frame
//! once ([`Persist::Once`]). An attack on every connection must make the stream fail closed: the
//! sender exits with an error, the receiver confirms nothing, and the sink holds no wrong byte
//! (a replay or a forged ACK, which let each connection store a chunk or two first, may instead
//! complete, byte-identical and verified). A single altered frame must be survived: the sender
//! reconnects, resends, and the stream completes byte-identical and verified (forged resume
//! ranges fail the receiver's MAC over its answer, which ends the transfer: closed, not survived). The proxy
//! counts the frames it altered, and every scenario asserts that count is above 0, so none can
//! pass without an attack.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use loci_stream::proto::kind::{ACK, DATA, END, END_ACK};
use loci_stream::proto::HEADER;

use super::{
    finish_exact_after, free_port, last_line, says_verified, setup, start_recv_with,
    start_send_with, tally_fail_closed, Net, SMALL,
};

const CLIENT_HELLO: usize = 125;
const SERVER_HELLO: usize = 44;

/// What the proxy does to the frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// Flips a byte in the middle of a DATA payload (sender -> receiver).
    ForgeData,
    /// Flips a byte of an ACK's range (its first seq; receiver -> sender).
    ForgeAck,
    /// Sends a connection's first DATA frame again after its second.
    Replay,
    /// Swaps a connection's first two DATA frames.
    Reorder,
    /// Injects a DATA frame recorded on another connection before a connection's own first one.
    Splice,
    /// Keeps END from the receiver and answers the sender with an END_ACK of its own saying
    /// "equal", with the sender's whole-stream checksum (read from END) and a made-up tag.
    ForgeEndAck,
    /// Rewrites the resume ranges of the receiver's accept answer (covered by its MAC) to "I hold
    /// every chunk".
    ForgeRanges,
}

impl Attack {
    pub const ALL: [Attack; 7] = [
        Attack::ForgeData,
        Attack::ForgeAck,
        Attack::Replay,
        Attack::Reorder,
        Attack::Splice,
        Attack::ForgeEndAck,
        Attack::ForgeRanges,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Attack::ForgeData => "forge DATA",
            Attack::ForgeAck => "forge ACK",
            Attack::Replay => "replay DATA",
            Attack::Reorder => "reorder DATA",
            Attack::Splice => "splice DATA",
            Attack::ForgeEndAck => "forge END_ACK",
            Attack::ForgeRanges => "forge resume ranges",
        }
    }
    /// Whether the attack, on every connection, leaves the sender no way to complete: every data
    /// connection fails before its first chunk is used (forged, reordered, spliced), or the
    /// confirmation never comes (END_ACK). A replay comes after two good frames and a forged ACK
    /// after the chunks it acknowledges are stored, so those streams may progress a little on
    /// each connection (and, the receiver telling a reconnecting sender what it holds, may even
    /// complete): they must still never store or confirm a wrong byte.
    pub fn must_fail(self) -> bool {
        !matches!(self, Attack::ForgeAck | Attack::Replay)
    }
    /// Whether one altered frame must be survived (the stream completes verified). Not so for
    /// forged resume ranges: the receiver's MAC over its answer fails, which the sender takes as
    /// a receiver without the secret (a refusal, not a retry): it fails closed at once.
    pub fn once_survived(self) -> bool {
        self != Attack::ForgeRanges
    }
}

/// Every connection, or one frame once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    Always,
    Once,
}

/// Frame protection of the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Auth,
    Encrypt,
}

impl Mode {
    pub const ALL: [Mode; 2] = [Mode::Auth, Mode::Encrypt];
    pub fn name(self) -> &'static str {
        match self {
            Mode::Auth => "auth",
            Mode::Encrypt => "encrypt",
        }
    }
    fn flags(self) -> &'static [&'static str] {
        match self {
            Mode::Auth => &[],
            Mode::Encrypt => &["--encrypt"],
        }
    }
}

struct State {
    attack: Attack,
    persist: Persist,
    upstream: SocketAddr,
    stop: AtomicBool,
    /// Frames altered, injected or withheld.
    altered: AtomicU64,
    conns: AtomicU64,
    data_frames: AtomicU64,
    /// Total chunks of the stream (from the last ClientHello).
    total_chunks: AtomicU64,
    /// `Persist::Once`: taken by the one alteration.
    latch: AtomicBool,
    /// First DATA frame of each connection, for splicing: (connection, whole frame).
    recorded: Mutex<Vec<(u64, Vec<u8>)>>,
    recorded_cv: Condvar,
    socks: Mutex<Vec<TcpStream>>,
    errors: Mutex<Vec<String>>,
}

impl State {
    /// Whether to alter now: always, or the first time only.
    fn take(&self) -> bool {
        match self.persist {
            Persist::Always => true,
            Persist::Once => !self.latch.swap(true, Relaxed),
        }
    }
    /// An alteration that was taken but could not happen: another connection may try.
    fn release(&self) {
        if self.persist == Persist::Once {
            self.latch.store(false, Relaxed);
        }
    }
    fn altered(&self) {
        self.altered.fetch_add(1, Relaxed);
    }
    fn error(&self, e: String) {
        self.errors.lock().unwrap().push(e);
    }
}

/// The proxy; stops, closes every connection and joins its listener on drop.
pub struct Proxy {
    pub addr: SocketAddr,
    st: Arc<State>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    pub fn start(attack: Attack, persist: Persist, upstream: SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let st = Arc::new(State {
            attack,
            persist,
            upstream,
            stop: AtomicBool::new(false),
            altered: AtomicU64::new(0),
            conns: AtomicU64::new(0),
            data_frames: AtomicU64::new(0),
            total_chunks: AtomicU64::new(0),
            latch: AtomicBool::new(false),
            recorded: Mutex::new(vec![]),
            recorded_cv: Condvar::new(),
            socks: Mutex::new(vec![]),
            errors: Mutex::new(vec![]),
        });
        let st2 = st.clone();
        let accept = std::thread::spawn(move || {
            while !st2.stop.load(Relaxed) {
                match l.accept() {
                    Ok((c, _)) => {
                        let k = st2.conns.fetch_add(1, Relaxed);
                        let st3 = st2.clone();
                        std::thread::spawn(move || connection(st3, k, c));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Proxy {
            addr,
            st,
            accept: Some(accept),
        }
    }
    pub fn altered(&self) -> u64 {
        self.st.altered.load(Relaxed)
    }
    pub fn connections(&self) -> u64 {
        self.st.conns.load(Relaxed)
    }
    pub fn data_frames(&self) -> u64 {
        self.st.data_frames.load(Relaxed)
    }
    pub fn errors(&self) -> Vec<String> {
        self.st.errors.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.st.stop.store(true, Relaxed);
        self.st.recorded_cv.notify_all();
        for s in self.st.socks.lock().unwrap().iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// One proxied connection: connects upstream (retrying while the receiver starts), then pumps
/// both directions on two threads; when either ends, both sockets are shut down.
fn connection(st: Arc<State>, k: u64, client: TcpStream) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let server = loop {
        match TcpStream::connect_timeout(&st.upstream, Duration::from_secs(2)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline && !st.stop.load(Relaxed) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(_) => return,
        }
    };
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
        st.socks.lock().unwrap().push(s.try_clone().unwrap());
    }
    let to_client = Arc::new(Mutex::new(client.try_clone().unwrap()));
    let (st2, server2, client2, tc2) = (
        st.clone(),
        server.try_clone().unwrap(),
        client.try_clone().unwrap(),
        to_client.clone(),
    );
    let down = std::thread::spawn(move || {
        let _ = downstream(&st2, server2, &tc2);
        let _ = client2.shutdown(Shutdown::Both);
    });
    let _ = upstream(
        &st,
        k,
        client.try_clone().unwrap(),
        server.try_clone().unwrap(),
        &to_client,
    );
    let _ = server.shutdown(Shutdown::Both);
    let _ = client.shutdown(Shutdown::Both);
    let _ = down.join();
}

enum Got {
    Full,
    /// Nothing of the frame arrived for 100 ms (only when `idle_ok`).
    Idle,
}

/// Reads exactly `buf.len()` bytes, across read timeouts; with `idle_ok`, returns `Idle` after a
/// timeout that came before any byte.
fn fill(st: &State, s: &mut TcpStream, buf: &mut [u8], idle_ok: bool) -> io::Result<Got> {
    let mut n = 0;
    while n < buf.len() {
        if st.stop.load(Relaxed) {
            return Err(io::ErrorKind::Interrupted.into());
        }
        match s.read(&mut buf[n..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(m) => n += m,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if idle_ok && n == 0 {
                    return Ok(Got::Idle);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Got::Full)
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// Sender -> receiver: the ClientHello, then frames.
fn upstream(
    st: &State,
    k: u64,
    mut from: TcpStream,
    mut to: TcpStream,
    to_client: &Mutex<TcpStream>,
) -> io::Result<()> {
    let mut hello = [0u8; CLIENT_HELLO];
    fill(st, &mut from, &mut hello, false)?;
    let version = u16::from_le_bytes([hello[8], hello[9]]);
    if &hello[..8] != b"LOCISTRM" || version != loci_stream::proto::VERSION {
        st.error(format!(
            "connection {k}: not a protocol v{} ClientHello (magic {:?}, version {version})",
            loci_stream::proto::VERSION,
            String::from_utf8_lossy(&hello[..8])
        ));
        to.write_all(&hello)?;
        io::copy(&mut from, &mut to)?;
        return Ok(());
    }
    st.total_chunks.store(u64_at(&hello, 42), Relaxed);
    let extra = match hello[60] {
        2 => 8, // encrypt: the raw chunk's hash travels inside the ciphertext
        _ => 0,
    };
    to.write_all(&hello)?;
    let mut n_data = 0u64;
    let mut first: Option<Vec<u8>> = None;
    let mut held: Option<Vec<u8>> = None;
    let mut idle = 0;
    loop {
        let mut f = vec![0u8; HEADER];
        match fill(st, &mut from, &mut f, held.is_some())? {
            Got::Idle => {
                idle += 1;
                if idle >= 3 {
                    // Reorder: nothing to swap the held frame with.
                    let h = held.take().expect("held");
                    match st.persist {
                        // On every connection: none may deliver a chunk; end this one.
                        Persist::Always => return Ok(()),
                        Persist::Once => {
                            st.release();
                            to.write_all(&h)?;
                        }
                    }
                }
                continue;
            }
            Got::Full => idle = 0,
        }
        let kind = f[0];
        if kind == DATA {
            let len = u32_at(&f, 8) as usize + extra;
            f.resize(HEADER + len, 0);
            fill(st, &mut from, &mut f[HEADER..], false)?;
            st.data_frames.fetch_add(1, Relaxed);
        }
        match (st.attack, kind) {
            (Attack::ForgeData, DATA) if st.take() => {
                let mid = HEADER + (f.len() - HEADER) / 2;
                f[mid] ^= 0x01;
                st.altered();
                to.write_all(&f)?;
            }
            (Attack::Replay, DATA) => {
                to.write_all(&f)?;
                n_data += 1;
                if n_data == 1 {
                    first = Some(f);
                } else if n_data == 2 && st.take() {
                    to.write_all(first.as_ref().expect("first frame"))?;
                    st.altered();
                }
            }
            (Attack::Reorder, DATA) => {
                n_data += 1;
                if let Some(h) = held.take() {
                    to.write_all(&f)?;
                    to.write_all(&h)?;
                    st.altered();
                } else if n_data == 1 && st.take() {
                    held = Some(f);
                } else {
                    to.write_all(&f)?;
                }
            }
            (Attack::Splice, DATA) => {
                n_data += 1;
                if n_data == 1 {
                    {
                        st.recorded.lock().unwrap().push((k, f.clone()));
                        st.recorded_cv.notify_all();
                    }
                    if st.take() {
                        match foreign_frame(st, k) {
                            Some(g) => {
                                to.write_all(&g)?;
                                st.altered();
                            }
                            None if st.persist == Persist::Always => return Ok(()),
                            None => st.release(),
                        }
                    }
                }
                to.write_all(&f)?;
            }
            (Attack::ForgeEndAck, END) if st.take() => {
                // The receiver never sees END; the sender gets "equal" from us.
                let mut a = [0u8; HEADER];
                a[0] = END_ACK;
                a[16..24].copy_from_slice(&f[32..40]); // "our checksum" = the sender's own
                a[32..40].copy_from_slice(&f[16..24]); // chunks = total chunks
                a[40..56].copy_from_slice(&f[40..56]); // a tag that is not the receiver's
                to_client.lock().unwrap().write_all(&a)?;
                st.altered();
            }
            _ => {
                if let Some(h) = held.take() {
                    // A control frame behind a held DATA frame: nothing was swapped.
                    st.release();
                    to.write_all(&h)?;
                }
                to.write_all(&f)?;
            }
        }
    }
}

/// A first DATA frame recorded on another connection (waits up to 3 s for one).
fn foreign_frame(st: &State, k: u64) -> Option<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut r = st.recorded.lock().unwrap();
    loop {
        if let Some((_, f)) = r.iter().rev().find(|(c, _)| *c != k) {
            return Some(f.clone());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || st.stop.load(Relaxed) {
            return None;
        }
        r = st.recorded_cv.wait_timeout(r, left).unwrap().0;
    }
}

/// Receiver -> sender: the ServerHello, the accept answer (or a refusal), then control frames.
fn downstream(st: &State, mut from: TcpStream, to: &Mutex<TcpStream>) -> io::Result<()> {
    let send = |b: &[u8]| to.lock().unwrap().write_all(b);
    let mut sh = [0u8; SERVER_HELLO];
    fill(st, &mut from, &mut sh, false)?;
    send(&sh)?;
    let mut status = [0u8; 1];
    fill(st, &mut from, &mut status, false)?;
    send(&status)?;
    if status[0] != 0 {
        let mut l = [0u8; 2];
        fill(st, &mut from, &mut l, false)?;
        let mut msg = vec![0u8; u16::from_le_bytes(l) as usize];
        fill(st, &mut from, &mut msg, false)?;
        send(&l)?;
        return send(&msg);
    }
    // count u32 | count x (start u64, end u64) | the receiver's MAC over them (32).
    let mut count = [0u8; 4];
    fill(st, &mut from, &mut count, false)?;
    let n = u32::from_le_bytes(count) as usize;
    if n > 1 << 20 {
        return Err(io::Error::other(format!("{n} resume ranges")));
    }
    let mut ranges = vec![0u8; n * 16];
    fill(st, &mut from, &mut ranges, false)?;
    let mut mac = [0u8; 32];
    fill(st, &mut from, &mut mac, false)?;
    if st.attack == Attack::ForgeRanges && st.take() {
        count = 1u32.to_le_bytes();
        ranges = [0u64, st.total_chunks.load(Relaxed)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        st.altered();
    }
    send(&count)?;
    send(&ranges)?;
    send(&mac)?;
    loop {
        let mut f = [0u8; HEADER];
        fill(st, &mut from, &mut f, false)?;
        if st.attack == Attack::ForgeAck && f[0] == ACK && st.take() {
            f[16] ^= 0x01; // the range's first seq
            st.altered();
        }
        send(&f)?;
    }
}

/// One man-in-the-middle scenario over loopback: receiver, proxy in front of it, sender through
/// the proxy (2 connections, 48 chunks of 256 KiB, `--reconnect-timeout 5`). What the stream did
/// is measured first (the tally), then:
///
/// - a stream that completed must be byte-identical to the source and verified on both sides,
///   and the sender must have reconnected (the altered frame ended its connection; not for
///   END_ACK or resume ranges, which are not data connections);
/// - a stream that failed must have failed closed: the sender exits non-zero with an error; the
///   receiver (killed once the sender is done) confirmed nothing; every chunk its journal
///   records holds the source's bytes and no other byte of the sink differs from the source
///   unless never written (zero);
/// - `Persist::Always` with [`Attack::must_fail`]: the stream must fail (any "verified" is false);
/// - `Persist::Once` with [`Attack::once_survived`]: exactly one frame altered, and the stream
///   must complete.
pub fn mitm(attack: Attack, persist: Persist, mode: Mode) {
    let net = Net::loopback();
    let mut s = setup(free_port(), SMALL);
    s.reconnect_timeout = 5;
    let what = format!("{} ({:?}, {})", attack.name(), persist, mode.name());
    let mut recv = start_recv_with(&net, &s, mode.flags());
    let proxy = Proxy::start(attack, persist, SocketAddr::from(([127, 0, 0, 1], s.port)));
    let mut send = start_send_with(
        &net,
        &s,
        &proxy.addr.to_string(),
        &s.dir.join("send.toml"),
        &s.src,
        mode.flags(),
    );
    let so = send.finish(Duration::from_secs(90));
    let must_fail = persist == Persist::Always && attack.must_fail();
    let must_complete = persist == Persist::Once && attack.once_survived();
    if persist == Persist::Once {
        assert!(proxy.altered() <= 1, "{what}: more than one frame altered");
    }
    if so.status.success() && !must_fail {
        let (sr, _) = finish_exact_after(&s, so, recv);
        eprintln!(
            "mitm {what}: completed verified; {} frames altered, {} connections through the \
             proxy, {} reconnects, {} chunks resent",
            proxy.altered(),
            proxy.connections(),
            sr["reconnects"],
            sr["resent_chunks"]
        );
        assert!(proxy.errors().is_empty(), "{what}: {:?}", proxy.errors());
        assert!(proxy.altered() > 0, "{what}: the proxy altered nothing");
        if !matches!(attack, Attack::ForgeEndAck | Attack::ForgeRanges) {
            assert!(
                sr["reconnects"].as_u64().unwrap() >= 1,
                "{what}: the altered frame did not end its connection: {sr}"
            );
        }
        return;
    }
    let receiver_exited = !recv.running();
    let ro: Output = recv.kill_output();
    let t = tally_fail_closed(&s, &[&so, &ro]);
    eprintln!(
        "mitm {what}: {}; {} frames altered of {} DATA frames seen, {} connections; sender: \
         {:?}; {} chunks journaled, tally {t:?}",
        if so.status.success() {
            "COMPLETED although it had to fail"
        } else {
            "failed closed"
        },
        proxy.altered(),
        proxy.data_frames(),
        proxy.connections(),
        last_line(&so),
        super::journaled(&s.out),
    );
    assert!(proxy.errors().is_empty(), "{what}: {:?}", proxy.errors());
    assert!(proxy.altered() > 0, "{what}: the proxy altered nothing");
    assert!(
        !so.status.success() && !last_line(&so).is_empty(),
        "{what}: the sender must fail with an error: {}\n{}",
        so.status,
        String::from_utf8_lossy(&so.stdout)
    );
    assert_eq!(
        says_verified(&ro),
        0,
        "{what}: the receiver confirmed a stream (exited by itself: {receiver_exited}): {}",
        String::from_utf8_lossy(&ro.stdout)
    );
    assert!(t.is_clean(), "{what}: the sink holds wrong bytes: {t:?}");
    assert!(
        !must_complete,
        "{what}: one altered frame must be survived, but the sender failed: {}",
        last_line(&so)
    );
}
