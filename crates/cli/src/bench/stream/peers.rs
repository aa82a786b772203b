//! The peers: `lz4 | nc` shell pipelines (one, one per core over slices of the file, `lz4 -T`)
//! and raw `nc`, each checked to deliver every byte.

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::{free_port, listening};

/// Slices of the file for `lz4-nc-par` start at multiples of this (whole pages for `splice`).
const SLICE_ALIGN: u64 = 1 << 20;

/// `n` contiguous slices covering `0..len` exactly once, in order, boundaries at multiples of
/// `align` (the last takes the remainder); empty slices are left out (a file smaller than
/// `n * align` gets fewer).
pub fn slices(len: u64, n: usize, align: u64) -> Vec<Range<u64>> {
    let align = align.max(1);
    let n = n.max(1) as u64;
    let units = len.div_ceil(align);
    let (per, extra) = (units / n, units % n);
    let mut out = Vec::new();
    let mut start = 0u64;
    for i in 0..n {
        let u = per + u64::from(i < extra);
        let end = (start + u * align).min(len);
        if end > start {
            out.push(start..end);
        }
        start = end;
    }
    out
}

/// The byte count `lz4 -d -v` reports on stderr (`stdin : decoded N bytes`), the last one.
pub fn lz4_decoded_bytes(stderr: &str) -> Option<u64> {
    let i = stderr.rfind("decoded ")?;
    let rest = &stderr[i + "decoded ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if !rest[digits.len()..].starts_with(" bytes") {
        return None;
    }
    digits.parse().ok()
}

/// Why `lz4 -T` (multithreaded compression, lz4 1.10.0 and later) cannot be used here, or None.
pub(super) fn lz4_threads_missing() -> Option<String> {
    // `*** LZ4 command line interface 64-bits v1.9.4, by Yann Collet ***` -> `v1.9.4`
    let version = Command::new("lz4")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find(|w| w.starts_with('v') && w[1..].starts_with(|c: char| c.is_ascii_digit()))
                .map(|v| format!("installed: lz4 {}", v.trim_end_matches(',')))
        })
        .unwrap_or_default();
    let ok = Command::new("sh")
        .args(["-c", "lz4 -1 -T2 -c < /dev/null > /dev/null 2>&1"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    (!ok).then(|| {
        format!(
            "the installed lz4 has no -T (multithreaded compression came in lz4 1.10.0; {})",
            if version.is_empty() {
                "lz4 not found"
            } else {
                &version
            }
        )
    })
}

/// One pipeline of a peer: the receiving and sending shell commands, and the slice of the file
/// fed to the sender's stdin (None: the sender reads what its command names).
struct Pipeline {
    rx: String,
    tx: String,
    feed: Option<Range<u64>>,
    /// Raw bytes the receiver must report decoding (`lz4 -d -v`); None: not checked.
    expect: Option<u64>,
}

/// One run of a shell pipeline peer; seconds from the first sender's start to the last
/// receiver's exit. Every lz4 peer's receiver decodes with `lz4 -d -v` (which checks the
/// frame's content checksum) and must report exactly the raw bytes its sender was given.
pub(super) fn peer_once(
    peer: &str,
    data: &Path,
    len: u64,
    cores: usize,
    dir: &Path,
) -> anyhow::Result<f64> {
    let f = format!("'{}'", data.display());
    let mut ports: Vec<u16> = Vec::new();
    let mut port = || -> anyhow::Result<u16> {
        loop {
            let p = free_port()?;
            if !ports.contains(&p) {
                ports.push(p);
                return Ok(p);
            }
        }
    };
    let lz4_rx = |p: u16| format!("nc -l 127.0.0.1 {p} | lz4 -d -c -v > /dev/null");
    let pipes: Vec<Pipeline> = match peer {
        "lz4-nc" | "lz4-mt" => {
            let p = port()?;
            // lz4-mt: the same pipeline with lz4's own threads, one per core.
            let threads = if peer == "lz4-mt" {
                format!(" -T{cores}")
            } else {
                String::new()
            };
            vec![Pipeline {
                rx: lz4_rx(p),
                tx: format!("lz4 -1{threads} -c {f} | nc -N 127.0.0.1 {p}"),
                feed: None,
                expect: Some(len),
            }]
        }
        "lz4-nc-par" => slices(len, cores, SLICE_ALIGN)
            .into_iter()
            .map(|s| {
                let p = port()?;
                Ok(Pipeline {
                    rx: lz4_rx(p),
                    tx: format!("lz4 -1 -c | nc -N 127.0.0.1 {p}"),
                    expect: Some(s.end - s.start),
                    feed: Some(s),
                })
            })
            .collect::<anyhow::Result<_>>()?,
        "raw-tcp" => {
            let p = port()?;
            vec![Pipeline {
                rx: format!("nc -l 127.0.0.1 {p} > /dev/null"),
                tx: format!("nc -N 127.0.0.1 {p} < {f}"),
                feed: None,
                expect: None,
            }]
        }
        _ => bail!("unknown peer {peer}"),
    };
    if let Some(total) = pipes
        .iter()
        .map(|p| p.expect)
        .sum::<Option<u64>>()
        .filter(|_| pipes.iter().all(|p| p.expect.is_some()))
    {
        anyhow::ensure!(
            total == len,
            "peer {peer}: slices cover {total} of {len} bytes"
        );
    }
    run_pipelines(peer, &pipes, data, &ports, dir)
}

fn run_pipelines(
    peer: &str,
    pipes: &[Pipeline],
    data: &Path,
    ports: &[u16],
    dir: &Path,
) -> anyhow::Result<f64> {
    let kill_all = |cs: &mut Vec<Child>| {
        for c in cs.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    };
    let mut recvs: Vec<Child> = Vec::new();
    let mut errs = Vec::new();
    for (i, p) in pipes.iter().enumerate() {
        // stderr to a file: `lz4 -v` reports the decoded byte count there, and a file never
        // blocks the receiver the way an unread pipe could.
        let err = dir.join(format!("{peer}-rx-{i}.err"));
        let spawned = Command::new("sh")
            .args(["-c", &p.rx])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&err)?)
            .spawn()
            .with_context(|| {
                format!(
                    "starting `{}` (are netcat-openbsd and lz4 installed?)",
                    p.rx
                )
            });
        match spawned {
            Ok(c) => recvs.push(c),
            Err(e) => {
                kill_all(&mut recvs);
                return Err(e);
            }
        }
        errs.push(err);
    }
    // Wait (bounded) until every listener accepts connections.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ports.iter().all(|&p| listening(p)) {
        if Instant::now() > deadline
            || recvs
                .iter_mut()
                .any(|c| matches!(c.try_wait(), Ok(Some(_))))
        {
            kill_all(&mut recvs);
            // What a receiver said (e.g. `sh: 1: nc: not found`).
            let mut said: Vec<String> = Vec::new();
            for text in errs.iter().filter_map(|e| std::fs::read_to_string(e).ok()) {
                for l in text
                    .split(['\r', '\n'])
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                {
                    if said.len() < 4 && !said.iter().any(|s| s == l) {
                        said.push(l.to_owned());
                    }
                }
            }
            bail!(
                "peer {peer}: the receivers did not all start listening on {ports:?}{} (are \
                 netcat-openbsd and lz4 installed? scripts/install-deps installs them)",
                if said.is_empty() {
                    String::new()
                } else {
                    format!(": {}", said.join("; "))
                }
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let file = File::open(data)?;
    let t = Instant::now();
    let result = std::thread::scope(|sc| -> anyhow::Result<Vec<String>> {
        let mut sends = Vec::new();
        let mut feeders = Vec::new();
        for p in pipes {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", &p.tx]);
            match &p.feed {
                Some(range) => {
                    let (r, w) = pipe()?;
                    cmd.stdin(Stdio::from(r));
                    let file = &file;
                    let range = range.clone();
                    feeders.push(sc.spawn(move || feed_slice(file, range, w)));
                }
                None => {
                    cmd.stdin(Stdio::null());
                }
            }
            // `cmd` (and with it the pipe's read end here) drops after the spawn: the sender
            // holds the only read end, so a dead sender makes the feeder fail, not hang.
            sends.push(
                cmd.spawn()
                    .with_context(|| format!("starting `{}`", p.tx))?,
            );
        }
        let mut failed = Vec::new();
        for (s, p) in sends.iter_mut().zip(pipes) {
            let st = s.wait()?;
            if !st.success() {
                failed.push(format!("`{}` -> {st}", p.tx));
            }
        }
        for f in feeders {
            if let Err(e) = f.join().expect("feeder thread") {
                failed.push(format!("feeding a slice of the file: {e}"));
            }
        }
        Ok(failed)
    });
    let mut failed = match result {
        Ok(f) => f,
        Err(e) => {
            kill_all(&mut recvs);
            return Err(e);
        }
    };
    // A receiver whose sender failed may wait forever for a connection: bounded.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, (r, p)) in recvs.iter_mut().zip(pipes).enumerate() {
        let st = loop {
            if let Some(st) = r.try_wait()? {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = r.kill();
                let _ = r.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        match st {
            Some(st) if st.success() => {}
            Some(st) => failed.push(format!("`{}` -> {st}", p.rx)),
            None => failed.push(format!("`{}` did not finish", p.rx)),
        }
        if let Some(want) = p.expect {
            let err = std::fs::read_to_string(&errs[i]).unwrap_or_default();
            match lz4_decoded_bytes(&err) {
                Some(got) if got == want => {}
                got => failed.push(format!(
                    "pipeline {i}: received {} of {want} raw bytes ({})",
                    got.map_or("no count".into(), |g| g.to_string()),
                    err.trim().replace('\r', " ")
                )),
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    if !failed.is_empty() {
        bail!("peer {peer} failed: {}", failed.join("; "));
    }
    Ok(secs)
}

/// A pipe (both ends close-on-exec, so no other child inherits the write end and keeps the
/// reader from seeing end of file), 1 MiB deep where the system allows.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both are open descriptors that nothing else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on an open descriptor; failure (a lower pipe-max-size) only leaves 64 KiB.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
    Ok((r, w))
}

/// Feeds bytes `range` of `file` into the pipe `w` with `splice` (page-cache pages move into
/// the pipe without a copy, so the slicing adds no pass over the data: the sender's `lz4` reads
/// from the pipe what it would read from the file); `pread` + `write` where splice is refused.
/// Its CPU time is this process's, counted in the peer's row.
fn feed_slice(file: &File, range: Range<u64>, w: OwnedFd) -> std::io::Result<()> {
    let mut off = range.start as libc::loff_t;
    let end = range.end as libc::loff_t;
    while off < end {
        let want = ((end - off) as usize).min(1 << 20);
        // SAFETY: both descriptors are open; `off` is a valid offset pointer for the file side.
        let n = unsafe {
            libc::splice(
                file.as_raw_fd(),
                &mut off,
                w.as_raw_fd(),
                std::ptr::null_mut(),
                want,
                libc::SPLICE_F_MOVE,
            )
        };
        if n > 0 {
            continue;
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EINVAL) | Some(libc::ENOSYS) => {
                let mut w = File::from(w);
                let mut buf = vec![0u8; 1 << 20];
                while off < end {
                    let want = ((end - off) as usize).min(buf.len());
                    let got = file.read_at(&mut buf[..want], off as u64)?;
                    if got == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    w.write_all(&buf[..got])?;
                    off += got as libc::loff_t;
                }
                return Ok(());
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn slices_cover_the_file_exactly_once_in_order() {
        for len in [
            0u64,
            1,
            4095,
            4096,
            4097,
            1 << 20,
            3 << 20,
            (3 << 20) + 7,
            663_552_000,
        ] {
            for n in 1..=9 {
                for align in [1u64, 4096, 1 << 20] {
                    let s = slices(len, n, align);
                    assert!(s.len() <= n, "{len} {n} {align}: {s:?}");
                    let mut at = 0;
                    for (k, r) in s.iter().enumerate() {
                        assert_eq!(r.start, at, "{len} {n} {align}: gap or overlap {s:?}");
                        assert!(r.end > r.start, "empty slice {s:?}");
                        if k + 1 < s.len() {
                            assert_eq!(r.end % align, 0, "unaligned boundary {s:?}");
                        }
                        at = r.end;
                    }
                    assert_eq!(at, len, "{len} {n} {align}: {s:?}");
                    assert_eq!(s.iter().map(|r| r.end - r.start).sum::<u64>(), len);
                }
            }
        }
        // The default run on 2 cores: two halves of 60 projections, 1 MiB-aligned.
        let s = slices(663_552_000, 2, 1 << 20);
        assert_eq!(s, vec![0..332_398_592, 332_398_592..663_552_000]);
    }

    #[test]
    fn lz4_decoded_count_is_read_from_verbose_stderr() {
        let err = "*** LZ4 command line interface 64-bits v1.9.4, by Yann Collet ***\n\r                                                                               \rstdin                : decoded 5000000 bytes \n";
        assert_eq!(lz4_decoded_bytes(err), Some(5_000_000));
        assert_eq!(lz4_decoded_bytes("Error 68 : Unfinished stream \n"), None);
        assert_eq!(lz4_decoded_bytes(""), None);
        assert_eq!(lz4_decoded_bytes("decoded 12 blocks"), None);
    }

    fn have(tool: &str) -> bool {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool} > /dev/null")])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A pipeline peer that drops bytes fails the run, even when every process in it exits 0
    /// (the sender drops all but 1000 bytes of its slice and sends a valid LZ4 frame of those);
    /// the same pipelines without the loss pass.
    #[test]
    fn a_peer_that_loses_bytes_fails_the_run() {
        if !(have("lz4") && have("nc")) {
            eprintln!("NOTE: lz4 or nc missing (scripts/install-deps installs them); skipped");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        for lossy in [false, true] {
            let mut ports = Vec::new();
            let pipes: Vec<Pipeline> = slices(data.len() as u64, 2, 4096)
                .into_iter()
                .enumerate()
                .map(|(i, s)| {
                    let p = loop {
                        let p = free_port().unwrap();
                        if !ports.contains(&p) {
                            break p;
                        }
                    };
                    ports.push(p);
                    let take = if lossy && i == 1 {
                        "(head -c 1000; cat > /dev/null)"
                    } else {
                        "cat"
                    };
                    Pipeline {
                        rx: format!("nc -l 127.0.0.1 {p} | lz4 -d -c -v > /dev/null"),
                        tx: format!("{take} | lz4 -1 -c | nc -N 127.0.0.1 {p}"),
                        expect: Some(s.end - s.start),
                        feed: Some(s),
                    }
                })
                .collect();
            let r = run_pipelines("test", &pipes, &path, &ports, dir.path());
            if lossy {
                let e = r.expect_err("a lossy peer must fail").to_string();
                assert!(e.contains("pipeline 1: received 1000 of"), "{e}");
            } else {
                r.unwrap();
            }
        }
    }

    /// The slice feeder moves exactly the asked bytes through a pipe.
    #[test]
    fn feed_slice_sends_exactly_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        for range in slices(data.len() as u64, 3, 4096) {
            let (r, w) = pipe().unwrap();
            let mut got = Vec::new();
            std::thread::scope(|sc| {
                let h = sc.spawn(|| feed_slice(&file, range.clone(), w));
                File::from(r).read_to_end(&mut got).unwrap();
                h.join().unwrap().unwrap();
            });
            assert_eq!(got, &data[range.start as usize..range.end as usize]);
        }
    }
}
