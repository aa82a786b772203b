//! Where a receiver puts chunks: discard, memory, or positional writes into a file with a
//! journal of what is stored (so a restarted receiver knows where a sender must resume, and can
//! repair what did not survive).
//!
//! ## Journal v2 (`FILE.loci-journal`)
//! A 48-byte header: magic `LOCIJRNL` | version u32 (2) | reserved u32 | transfer u64 | chunk
//! bytes u64 | total chunks u64 | xxh3-64 of the preceding 40 bytes. Then one 24-byte record per
//! committed chunk: seq u64 LE | chunk hash u64 LE (xxh3-64 of the raw chunk, the `c` of its
//! DATA frame) | xxh3-64 of (seq u64 LE, chunk hash u64 LE, transfer u64 LE). All integers are
//! little-endian.
//!
//! A journal whose header is not exactly the one of this transfer (another transfer or chunk
//! size, a version 1 journal, anything foreign) counts as no journal: the sink starts fresh and
//! truncates the file. On load, the first record that is torn (short), names a seq beyond the
//! stream, or fails its check (e.g. one written for another transfer) ends the journal: it and
//! everything after it are ignored. When a seq appears more than once, its last record counts.
//!
//! ## Resume: re-verified on disk
//! With `resume`, every journaled chunk is read back from the data file (in seq order, through
//! one reused buffer) and hashed with xxh3-64. Only chunks whose bytes still match the journaled
//! hash are kept ([`Resumed::have`]); chunks that differ, are short or lie beyond the end of the
//! file are dropped ([`Resumed::repaired`]), so the sender sends them again. With `sync = "data"`
//! the data file is then fdatasync'd (what was read may have been only in the page cache). The
//! journal is rewritten compactly, listing only the kept chunks: written to
//! `FILE.loci-journal.tmp`, fsync'd, renamed over `FILE.loci-journal`, then the directory is
//! fsync'd. Resumed writes append to that journal.
//!
//! ## fsync order
//! - Fresh open: the journal is truncated, its header written and fsync'd (so no stale record
//!   outlives the data it names), then the data file is created/truncated, then the parent
//!   directory is fsync'd so both names survive a power loss.
//! - Each commit (chunks already written with positional writes): with `sync = "data"` the data
//!   file is fdatasync'd; then the records are appended to the journal; then, unless
//!   `sync = "none"`, the journal is fdatasync'd; only then does the receiver acknowledge them.
//! - [`StreamSink::finish`] trims the file to the stream's size and, unless `sync = "none"`, fsyncs it.
//!
//! ## What each [`Sync`] mode promises for acknowledged chunks
//! | `sync` | receiver process crash | power loss (or kernel crash) |
//! |---|---|---|
//! | `none` | kept: data and journal are in the page cache | recent journal records may be lost (those chunks are resent) and data may not have reached the disk; a finished file may be incomplete |
//! | `journal` | kept | the journal survives but data it names may not; the resume check finds such chunks (`repaired`) and has them resent |
//! | `data` | kept | kept: a chunk's data is durable before the journal record naming it |
//!
//! In every mode a resume only reports chunks whose bytes were re-read and re-hashed, so a
//! resumed transfer repairs itself; the modes differ in how much is resent after a power loss,
//! and whether a file that was reported finished is intact without a resume.
//!
//! [`StreamSink::disk_digest`] (`--verify-on-disk`) fdatasyncs the file, drops its pages from the page
//! cache and re-reads every chunk, so the whole-stream checksum is computed over what the disk
//! returns rather than over what the receiver wrote.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::hash::{xxh3_64, Xxh3};

use crate::config::Sync;
use crate::proto::StreamHasher;
/// Where received chunks go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkSpec {
    /// Discard (measures the pipeline without storage).
    Null,
    /// Keep in memory (tests; the report's checksum covers it).
    Memory,
    /// Positional writes into one file (one stream).
    File(PathBuf),
    /// One file per stream, `DIR/stream-ID.raw`.
    Dir(PathBuf),
}

impl std::str::FromStr for SinkSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "" => return Err("empty sink (valid: null, memory, FILE, DIR/)".into()),
            "null" => SinkSpec::Null,
            "memory" => SinkSpec::Memory,
            p if p.ends_with('/') || Path::new(p).is_dir() => SinkSpec::Dir(p.into()),
            p => SinkSpec::File(p.into()),
        })
    }
}

impl SinkSpec {
    /// The file of stream `id`, for file sinks.
    pub fn path_of(&self, id: u32) -> Option<PathBuf> {
        match self {
            SinkSpec::File(p) => Some(p.clone()),
            SinkSpec::Dir(d) => Some(d.join(format!("stream-{id}.raw"))),
            _ => None,
        }
    }
}

/// Identity of what is being received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    pub transfer: u64,
    pub chunk_bytes: u64,
    pub total_chunks: u64,
    pub total_bytes: u64,
}

/// What a resumed file sink found on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resumed {
    /// (seq, chunk hash) of the journaled chunks whose bytes on disk still match their hash,
    /// sorted by seq: the sender need not send them.
    pub have: Vec<(u64, u64)>,
    /// Journaled chunks whose bytes on disk no longer match their hash (or are short): dropped
    /// from the journal, so the sender sends them again. Sorted.
    pub repaired: Vec<u64>,
}

/// An open sink for one stream.
pub enum StreamSink {
    Null,
    Memory(Mutex<BTreeMap<u64, Vec<u8>>>),
    File(FileSink),
}

/// A file sink and its journal.
pub struct FileSink {
    pub path: PathBuf,
    file: File,
    journal: Mutex<File>,
    sync: Sync,
    t: Transfer,
}

const JMAGIC: &[u8; 8] = b"LOCIJRNL";
const JVERSION: u32 = 2;
const JHEADER: usize = 48;
const JRECORD: usize = 24;
/// The most a read-back holds in memory at once (chunks can be up to 256 MiB).
const READ_BUF: u64 = 8 << 20;

fn journal_path(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".loci-journal");
    s.into()
}

fn journal_tmp_path(p: &Path) -> PathBuf {
    let mut s = journal_path(p).into_os_string();
    s.push(".tmp");
    s.into()
}

fn jheader(t: &Transfer) -> [u8; JHEADER] {
    let mut h = [0u8; JHEADER];
    h[..8].copy_from_slice(JMAGIC);
    h[8..12].copy_from_slice(&JVERSION.to_le_bytes());
    h[16..24].copy_from_slice(&t.transfer.to_le_bytes());
    h[24..32].copy_from_slice(&t.chunk_bytes.to_le_bytes());
    h[32..40].copy_from_slice(&t.total_chunks.to_le_bytes());
    let c = xxh3_64(&h[..40]);
    h[40..].copy_from_slice(&c.to_le_bytes());
    h
}

fn jrecord(seq: u64, hash: u64, transfer: u64) -> [u8; JRECORD] {
    let mut r = [0u8; JRECORD];
    r[..8].copy_from_slice(&seq.to_le_bytes());
    r[8..16].copy_from_slice(&hash.to_le_bytes());
    r[16..].copy_from_slice(&transfer.to_le_bytes());
    let c = xxh3_64(&r);
    r[16..].copy_from_slice(&c.to_le_bytes());
    r
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Adds the path to an error.
fn at(p: &Path) -> impl FnOnce(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

/// fsyncs the directory holding `p`, so a created, truncated or renamed name survives a power
/// loss.
fn sync_dir(p: &Path) -> io::Result<()> {
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir).and_then(|d| d.sync_all()).map_err(at(dir))
}

/// (offset, length) of chunk `seq`, or `None` if the stream has no such chunk.
fn chunk_span(t: &Transfer, seq: u64) -> Option<(u64, u64)> {
    let off = seq.checked_mul(t.chunk_bytes)?;
    (seq < t.total_chunks && off < t.total_bytes)
        .then(|| (off, t.chunk_bytes.min(t.total_bytes - off)))
}

/// Checks that the transfer's chunk layout is consistent.
fn check_layout(t: &Transfer) -> io::Result<()> {
    if t.chunk_bytes == 0 || t.total_chunks != t.total_bytes.div_ceil(t.chunk_bytes) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "inconsistent transfer: {} bytes in {} chunks of {} bytes",
                t.total_bytes, t.total_chunks, t.chunk_bytes
            ),
        ));
    }
    Ok(())
}

/// A read-back buffer for chunks of `t` (at most [`READ_BUF`]).
fn read_buf(t: &Transfer) -> Vec<u8> {
    vec![0u8; t.chunk_bytes.clamp(1, READ_BUF) as usize]
}

/// xxh3-64 of `len` bytes of `file` at `off`, read through `buf` (any non-empty size).
fn hash_at(file: &File, off: u64, len: u64, buf: &mut [u8]) -> io::Result<u64> {
    let mut h = Xxh3::new();
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], off + done)?;
        h.update(&buf[..n]);
        done += n as u64;
    }
    Ok(h.digest())
}

/// Chunks a journal records for transfer `t`, as (seq, chunk hash) sorted by seq; `None` if there
/// is no (version 2) journal for this transfer.
pub fn load_journal(path: &Path, t: &Transfer) -> io::Result<Option<Vec<(u64, u64)>>> {
    let jp = journal_path(path);
    let mut f = match File::open(&jp) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(at(&jp)(e)),
    };
    let mut data = Vec::new();
    f.read_to_end(&mut data).map_err(at(&jp))?;
    Ok(parse_journal(&data, t))
}

/// The chunks that the bytes of a journal file record for transfer `t`, as (seq, chunk hash)
/// sorted by seq; `None` if they are not a version 2 journal of this transfer. What survived a
/// crash or a power loss is outside input: a torn or forged journal loads as its valid prefix
/// (the rules are in the module doc), never as an error.
pub fn parse_journal(data: &[u8], t: &Transfer) -> Option<Vec<(u64, u64)>> {
    if data.len() < JHEADER || data[..JHEADER] != jheader(t) {
        return None;
    }
    let mut have = BTreeMap::new();
    for rec in data[JHEADER..].chunks_exact(JRECORD) {
        let (seq, hash) = (u64_at(rec, 0), u64_at(rec, 8));
        if seq >= t.total_chunks || rec != jrecord(seq, hash, t.transfer) {
            break; // torn tail, or not ours
        }
        have.insert(seq, hash);
    }
    Some(have.into_iter().collect())
}

/// Reads every journaled chunk back from `file` and sorts them into kept and repaired.
fn reverify(file: &File, t: &Transfer, journaled: Vec<(u64, u64)>) -> io::Result<Resumed> {
    let file_len = file.metadata()?.len();
    let mut buf = read_buf(t);
    let mut r = Resumed::default();
    for (seq, hash) in journaled {
        let ok = match chunk_span(t, seq) {
            Some((off, len)) if off + len <= file_len => match hash_at(file, off, len, &mut buf) {
                Ok(h) => h == hash,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
                Err(e) => return Err(e),
            },
            _ => false,
        };
        if ok {
            r.have.push((seq, hash));
        } else {
            r.repaired.push(seq);
        }
    }
    Ok(r)
}

impl StreamSink {
    /// Opens the sink of one stream. With `resume`, a file sink keeps the chunks its journal
    /// records for the same transfer whose bytes on disk still match (see the module doc) and
    /// rewrites the journal to list only those; otherwise (or without such a journal) it starts
    /// empty and truncates the file.
    pub fn open(
        spec: &SinkSpec,
        id: u32,
        t: Transfer,
        resume: bool,
        sync: Sync,
    ) -> io::Result<(StreamSink, Resumed)> {
        match spec {
            SinkSpec::Null => Ok((StreamSink::Null, Resumed::default())),
            SinkSpec::Memory => Ok((
                StreamSink::Memory(Mutex::new(BTreeMap::new())),
                Resumed::default(),
            )),
            _ => {
                let path = spec.path_of(id).expect("file sink");
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(at(dir))?;
                }
                let jp = journal_path(&path);
                let journaled = if resume {
                    load_journal(&path, &t)?
                } else {
                    None
                };
                let open_data = |truncate: bool| {
                    OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(truncate)
                        .open(&path)
                        .map_err(at(&path))
                };
                let (file, resumed) = match journaled {
                    None => {
                        // The journal first, so no old record outlives the data it names.
                        let j = OpenOptions::new()
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .open(&jp)
                            .map_err(at(&jp))?;
                        j.write_all_at(&jheader(&t), 0)
                            .and_then(|()| j.sync_all())
                            .map_err(at(&jp))?;
                        let file = open_data(true)?;
                        sync_dir(&path)?;
                        (file, Resumed::default())
                    }
                    Some(journaled) => {
                        let file = open_data(false)?;
                        let resumed = reverify(&file, &t, journaled).map_err(at(&path))?;
                        if sync == Sync::Data {
                            file.sync_data().map_err(at(&path))?;
                        }
                        // Rewrite compactly: only the verified chunks (drops a torn tail too).
                        let mut body = Vec::with_capacity(JHEADER + resumed.have.len() * JRECORD);
                        body.extend_from_slice(&jheader(&t));
                        for &(s, h) in &resumed.have {
                            body.extend_from_slice(&jrecord(s, h, t.transfer));
                        }
                        let tmp = journal_tmp_path(&path);
                        let mut f = File::create(&tmp).map_err(at(&tmp))?;
                        f.write_all(&body)
                            .and_then(|()| f.sync_all())
                            .map_err(at(&tmp))?;
                        drop(f);
                        std::fs::rename(&tmp, &jp).map_err(at(&jp))?;
                        sync_dir(&path)?;
                        (file, resumed)
                    }
                };
                let journal = OpenOptions::new().append(true).open(&jp).map_err(at(&jp))?;
                Ok((
                    StreamSink::File(FileSink {
                        path,
                        file,
                        journal: Mutex::new(journal),
                        sync,
                        t,
                    }),
                    resumed,
                ))
            }
        }
    }

    /// Stores chunk `seq` (at `seq * chunk_bytes`).
    pub fn write(&self, seq: u64, chunk_bytes: u64, data: &[u8]) -> io::Result<()> {
        match self {
            StreamSink::Null => Ok(()),
            StreamSink::Memory(m) => {
                m.lock().unwrap().insert(seq, data.to_vec());
                Ok(())
            }
            StreamSink::File(f) => f.file.write_all_at(data, seq * chunk_bytes),
        }
    }

    /// Makes written chunks durable as configured and records them in the journal, as
    /// (seq, chunk hash) pairs where the hash is xxh3-64 of the raw chunk. The chunks may be
    /// acknowledged once this returns.
    pub fn commit(&self, chunks: &[(u64, u64)]) -> io::Result<()> {
        let StreamSink::File(f) = self else {
            return Ok(());
        };
        if chunks.is_empty() {
            return Ok(());
        }
        if f.sync == Sync::Data {
            f.file.sync_data().map_err(at(&f.path))?;
        }
        let mut rec = Vec::with_capacity(chunks.len() * JRECORD);
        for &(s, h) in chunks {
            rec.extend_from_slice(&jrecord(s, h, f.t.transfer));
        }
        let j = f.journal.lock().unwrap();
        (&*j).write_all(&rec)?;
        if f.sync != Sync::None {
            j.sync_data()?;
        }
        Ok(())
    }

    /// The whole-stream checksum ([`StreamHasher`]) of what the sink holds, for
    /// `--verify-on-disk`. A file sink is fdatasync'd, its pages are dropped from the page cache,
    /// and every chunk of `t` is read back from the file (bytes past `t.total_bytes` are not
    /// covered; [`StreamSink::finish`] trims them). A memory sink hashes its chunks. The null sink
    /// stores nothing: an error.
    pub fn disk_digest(&self, t: &Transfer) -> io::Result<u64> {
        match self {
            StreamSink::Null => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "--verify-on-disk: the null sink stores nothing to verify \
                 (valid sinks: FILE or DIR/, memory)",
            )),
            StreamSink::Memory(m) => {
                check_layout(t)?;
                let m = m.lock().unwrap();
                let mut h = StreamHasher::new();
                for seq in 0..t.total_chunks {
                    let c = m.get(&seq).ok_or_else(|| {
                        io::Error::other(format!(
                            "--verify-on-disk: chunk {seq} of {} is not in the memory sink",
                            t.total_chunks
                        ))
                    })?;
                    h.add(seq, xxh3_64(c));
                }
                Ok(h.digest())
            }
            StreamSink::File(f) => f.disk_digest(t).map_err(at(&f.path)),
        }
    }

    /// Ends the stream: trims the file to its exact size and syncs.
    pub fn finish(&self, total_bytes: u64) -> io::Result<()> {
        if let StreamSink::File(f) = self {
            f.file.set_len(total_bytes)?;
            if f.sync != Sync::None {
                f.file.sync_all()?;
            }
        }
        Ok(())
    }

    /// The bytes of a memory sink, in order.
    pub fn memory_bytes(&self) -> Option<Vec<u8>> {
        match self {
            StreamSink::Memory(m) => Some(m.lock().unwrap().values().flatten().copied().collect()),
            _ => None,
        }
    }
}

impl FileSink {
    fn disk_digest(&self, t: &Transfer) -> io::Result<u64> {
        check_layout(t)?;
        self.file.sync_data()?;
        let len = self.file.metadata()?.len();
        if len < t.total_bytes {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "--verify-on-disk: the file holds {len} bytes, the stream has {}",
                    t.total_bytes
                ),
            ));
        }
        // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is owned by
        // `self.file`, which stays open for the whole call. It gives advice about the page cache
        // and touches no memory of this process.
        let rc =
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            let e = io::Error::from_raw_os_error(rc);
            return Err(io::Error::new(
                e.kind(),
                format!("--verify-on-disk: cannot drop the file from the page cache: {e}"),
            ));
        }
        let mut buf = read_buf(t);
        let mut h = StreamHasher::new();
        for seq in 0..t.total_chunks {
            let (off, n) = chunk_span(t, seq).expect("layout checked");
            h.add(seq, hash_at(&self.file, off, n, &mut buf)?);
        }
        Ok(h.digest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten chunks of 4 bytes, the last one short (2 bytes).
    fn t38() -> Transfer {
        Transfer {
            transfer: 9,
            chunk_bytes: 4,
            total_chunks: 10,
            total_bytes: 38,
        }
    }

    fn chunk(seq: u64, t: &Transfer) -> Vec<u8> {
        let (_, n) = chunk_span(t, seq).unwrap();
        (0..n).map(|i| (seq * 31 + i * 7 + 1) as u8).collect()
    }

    /// Writes and commits every chunk of `t` (in a scrambled order).
    fn fill(s: &StreamSink, t: &Transfer) -> Vec<(u64, u64)> {
        let mut all = Vec::new();
        for seq in (0..t.total_chunks).rev() {
            let c = chunk(seq, t);
            s.write(seq, t.chunk_bytes, &c).unwrap();
            all.push((seq, xxh3_64(&c)));
        }
        s.commit(&all).unwrap();
        all.sort_unstable();
        all
    }

    #[test]
    fn journal_survives_reopen_and_ignores_torn_tail_and_other_transfers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.raw");
        let t = Transfer {
            transfer: 9,
            chunk_bytes: 4,
            total_chunks: 10,
            total_bytes: 40,
        };
        let (h0, h3, h6) = (xxh3_64(b"wxyz"), xxh3_64(b"abcd"), xxh3_64(b"6666"));
        let spec = SinkSpec::File(p.clone());
        let (s, r) = StreamSink::open(&spec, 0, t, true, Sync::Data).unwrap();
        assert_eq!(r, Resumed::default());
        s.write(3, 4, b"abcd").unwrap();
        s.write(0, 4, b"wxyz").unwrap();
        s.write(6, 4, b"6666").unwrap();
        s.commit(&[(3, h3), (0, h0)]).unwrap();
        drop(s);
        // A record of another transfer ends the journal: a valid record after it is not read.
        let jp = journal_path(&p);
        let mut j = std::fs::read(&jp).unwrap();
        assert_eq!(j.len(), JHEADER + 2 * JRECORD);
        assert_eq!(&j[8..12], &2u32.to_le_bytes());
        j.extend_from_slice(&jrecord(6, h6, 10));
        j.extend_from_slice(&jrecord(6, h6, 9));
        // And a torn record at the end.
        j.extend_from_slice(&jrecord(6, h6, 9)[..11]);
        std::fs::write(&jp, &j).unwrap();
        let (s, r) = StreamSink::open(&spec, 0, t, true, Sync::Data).unwrap();
        assert_eq!(r.have, vec![(0, h0), (3, h3)]);
        assert!(r.repaired.is_empty());
        assert_eq!(&std::fs::read(&p).unwrap()[12..16], b"abcd");
        drop(s);
        // The journal was rewritten compactly.
        assert_eq!(
            std::fs::metadata(&jp).unwrap().len(),
            (JHEADER + 2 * JRECORD) as u64
        );
        assert!(!journal_tmp_path(&p).exists());
        // Without resume, nothing is kept.
        let (_, r) = StreamSink::open(&spec, 0, t, false, Sync::Data).unwrap();
        assert_eq!(r, Resumed::default());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
        assert_eq!(load_journal(&p, &t).unwrap(), Some(vec![]));
        // Another transfer: nothing is resumed, and the file starts empty.
        let (s, _) = StreamSink::open(&spec, 0, t, true, Sync::Journal).unwrap();
        s.write(3, 4, b"abcd").unwrap();
        s.commit(&[(3, h3)]).unwrap();
        drop(s);
        let other = Transfer { transfer: 10, ..t };
        let (_, r) = StreamSink::open(&spec, 0, other, true, Sync::Data).unwrap();
        assert_eq!(r, Resumed::default());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
    }

    #[test]
    fn journal_bytes_parse_without_a_file() {
        let t = t38();
        let mut j = jheader(&t).to_vec();
        assert_eq!(parse_journal(&j, &t), Some(vec![]));
        assert_eq!(parse_journal(&j[..JHEADER - 1], &t), None);
        j.extend_from_slice(&jrecord(7, 70, t.transfer));
        j.extend_from_slice(&jrecord(2, 20, t.transfer));
        j.extend_from_slice(&jrecord(7, 71, t.transfer));
        // A seq beyond the stream ends the journal, as a torn record does.
        j.extend_from_slice(&jrecord(t.total_chunks, 1, t.transfer));
        j.extend_from_slice(&jrecord(3, 30, t.transfer));
        assert_eq!(parse_journal(&j, &t), Some(vec![(2, 20), (7, 71)]));
        let other = Transfer {
            chunk_bytes: 5,
            ..t
        };
        assert_eq!(parse_journal(&j, &other), None);
    }

    #[test]
    fn resume_finds_overwritten_and_truncated_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let spec = SinkSpec::Dir(dir.path().to_owned());
        let p = spec.path_of(2).unwrap();
        let t = t38();
        let (s, _) = StreamSink::open(&spec, 2, t, false, Sync::Data).unwrap();
        let all = fill(&s, &t);
        drop(s);
        // Intact (the short last chunk included): everything is kept.
        let (s, r) = StreamSink::open(&spec, 2, t, true, Sync::Data).unwrap();
        assert_eq!(r.have, all);
        assert!(r.repaired.is_empty());
        drop(s);
        // Chunk 4 (bytes 16..20) overwritten in the middle; the file cut at 35 bytes, so chunk 8
        // (32..36) is short and chunk 9 (36..38) is gone.
        let byte = std::fs::read(&p).unwrap()[17];
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[byte ^ 0x5a], 17).unwrap();
        f.set_len(35).unwrap();
        drop(f);
        let (s, r) = StreamSink::open(&spec, 2, t, true, Sync::Journal).unwrap();
        assert_eq!(r.repaired, vec![4, 8, 9]);
        let kept: Vec<_> = all
            .iter()
            .copied()
            .filter(|(s, _)| ![4, 8, 9].contains(s))
            .collect();
        assert_eq!(r.have, kept);
        // The journal on disk no longer lists them.
        assert_eq!(load_journal(&p, &t).unwrap(), Some(kept.clone()));
        assert_eq!(
            std::fs::metadata(journal_path(&p)).unwrap().len(),
            (JHEADER + kept.len() * JRECORD) as u64
        );
        // The repaired chunks are sent again; then everything is there.
        let mut again = Vec::new();
        for seq in [9, 4, 8] {
            let c = chunk(seq, &t);
            s.write(seq, t.chunk_bytes, &c).unwrap();
            again.push((seq, xxh3_64(&c)));
        }
        s.commit(&again).unwrap();
        drop(s);
        let (_, r) = StreamSink::open(&spec, 2, t, true, Sync::None).unwrap();
        assert_eq!(r.have, all);
        assert!(r.repaired.is_empty());
    }

    #[test]
    fn version_1_journal_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.raw");
        let t = t38();
        // A v1 journal (16-byte records: seq, xxh3 of seq and transfer) and its data.
        let mut h = jheader(&t);
        h[8..12].copy_from_slice(&1u32.to_le_bytes());
        let c = xxh3_64(&h[..40]);
        h[40..].copy_from_slice(&c.to_le_bytes());
        let mut j = h.to_vec();
        for seq in 0..t.total_chunks {
            let mut k = [0u8; 16];
            k[..8].copy_from_slice(&seq.to_le_bytes());
            k[8..].copy_from_slice(&t.transfer.to_le_bytes());
            j.extend_from_slice(&seq.to_le_bytes());
            j.extend_from_slice(&xxh3_64(&k).to_le_bytes());
        }
        std::fs::write(journal_path(&p), &j).unwrap();
        let data: Vec<u8> = (0..t.total_chunks).flat_map(|s| chunk(s, &t)).collect();
        std::fs::write(&p, &data).unwrap();
        let (_, r) = StreamSink::open(&SinkSpec::File(p.clone()), 0, t, true, Sync::Data).unwrap();
        assert_eq!(r, Resumed::default());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
        // Replaced by an empty v2 journal.
        let j = std::fs::read(journal_path(&p)).unwrap();
        assert_eq!(j, jheader(&t));
        assert_eq!(&j[8..12], &2u32.to_le_bytes());
    }

    #[test]
    fn disk_digest_matches_the_chunks_and_sees_a_changed_byte() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.raw");
        let t = t38();
        let mut expect = StreamHasher::new();
        for seq in 0..t.total_chunks {
            expect.add(seq, xxh3_64(&chunk(seq, &t)));
        }
        let expect = expect.digest();

        let (s, _) = StreamSink::open(&SinkSpec::File(p.clone()), 0, t, false, Sync::None).unwrap();
        fill(&s, &t);
        s.finish(t.total_bytes).unwrap();
        assert_eq!(s.disk_digest(&t).unwrap(), expect);
        // One byte changes on disk (through another handle).
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[0xff], 37).unwrap();
        drop(f);
        let changed = s.disk_digest(&t).unwrap();
        assert_ne!(changed, expect);
        // A file shorter than the stream is an error.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(30)
            .unwrap();
        assert!(s.disk_digest(&t).is_err());

        let (m, _) = StreamSink::open(&SinkSpec::Memory, 0, t, false, Sync::None).unwrap();
        fill(&m, &t);
        assert_eq!(m.disk_digest(&t).unwrap(), expect);
        m.write(5, t.chunk_bytes, b"five").unwrap();
        assert_ne!(m.disk_digest(&t).unwrap(), expect);
    }

    #[test]
    fn hash_at_streams_through_a_small_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = File::open(&p).unwrap();
        for (off, len) in [(0, 5000), (100, 4000), (4999, 1), (10, 0)] {
            let want = xxh3_64(&data[off as usize..(off + len) as usize]);
            assert_eq!(hash_at(&f, off, len, &mut [0u8; 7]).unwrap(), want);
            assert_eq!(hash_at(&f, off, len, &mut [0u8; 8192]).unwrap(), want);
        }
        let e = hash_at(&f, 4990, 20, &mut [0u8; 7]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn null_sink_has_nothing_to_verify() {
        let (s, _) = StreamSink::open(&SinkSpec::Null, 0, t38(), false, Sync::Data).unwrap();
        let e = s.disk_digest(&t38()).unwrap_err().to_string();
        for valid in ["FILE", "DIR/", "memory"] {
            assert!(e.contains(valid), "{e}");
        }
        assert!(e.contains("null"), "{e}");
    }

    #[test]
    fn sink_specs_parse() {
        assert_eq!("null".parse::<SinkSpec>().unwrap(), SinkSpec::Null);
        assert_eq!("memory".parse::<SinkSpec>().unwrap(), SinkSpec::Memory);
        assert_eq!(
            "out/".parse::<SinkSpec>().unwrap(),
            SinkSpec::Dir("out/".into())
        );
        assert_eq!(
            SinkSpec::Dir("d".into()).path_of(3).unwrap(),
            PathBuf::from("d/stream-3.raw")
        );
        assert!("".parse::<SinkSpec>().is_err());
    }
}
