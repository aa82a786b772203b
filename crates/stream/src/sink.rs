//! Where a receiver puts chunks: discard, memory, or positional writes into a file with a
//! journal of what is durable (so a restarted receiver knows where a sender must resume).
//!
//! Journal (`FILE.loci-journal`): a 48-byte header (magic `LOCIJRNL`, version u32, reserved u32,
//! transfer u64, chunk bytes u64, total chunks u64, xxh3 of the preceding 40 bytes), then one
//! 16-byte record per chunk (seq u64, xxh3 of seq and transfer). A torn or foreign record ends
//! the journal on load; records are appended only after the chunk's data is written (and, with
//! `sync = "data"`, fdatasync'd), then the journal is fsync'd, then the chunk is acknowledged.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use xxhash_rust::xxh3::xxh3_64;

use crate::config::Sync;

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

/// An open sink for one stream.
pub enum Sink {
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

fn journal_path(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".loci-journal");
    s.into()
}

fn jheader(t: &Transfer) -> [u8; 48] {
    let mut h = [0u8; 48];
    h[..8].copy_from_slice(JMAGIC);
    h[8..12].copy_from_slice(&1u32.to_le_bytes());
    h[16..24].copy_from_slice(&t.transfer.to_le_bytes());
    h[24..32].copy_from_slice(&t.chunk_bytes.to_le_bytes());
    h[32..40].copy_from_slice(&t.total_chunks.to_le_bytes());
    let c = xxh3_64(&h[..40]);
    h[40..].copy_from_slice(&c.to_le_bytes());
    h
}

fn jrecord(seq: u64, transfer: u64) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..8].copy_from_slice(&seq.to_le_bytes());
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&seq.to_le_bytes());
    k[8..].copy_from_slice(&transfer.to_le_bytes());
    r[8..].copy_from_slice(&xxh3_64(&k).to_le_bytes());
    r
}

/// Chunks a journal records for transfer `t`; `None` if there is no journal for this transfer.
pub fn load_journal(path: &Path, t: &Transfer) -> io::Result<Option<Vec<u64>>> {
    let jp = journal_path(path);
    let mut f = match File::open(&jp) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut data = Vec::new();
    f.read_to_end(&mut data)?;
    if data.len() < 48 || data[..48] != jheader(t) {
        return Ok(None);
    }
    let mut have = Vec::new();
    for rec in data[48..].chunks_exact(16) {
        let seq = u64::from_le_bytes(rec[..8].try_into().unwrap());
        if seq >= t.total_chunks || rec != jrecord(seq, t.transfer) {
            break; // torn tail
        }
        have.push(seq);
    }
    have.sort_unstable();
    have.dedup();
    Ok(Some(have))
}

impl Sink {
    /// Opens the sink of one stream. With `resume`, a file sink keeps what its journal says it
    /// has for the same transfer and returns those chunks; otherwise it starts empty.
    pub fn open(
        spec: &SinkSpec,
        id: u32,
        t: Transfer,
        resume: bool,
        sync: Sync,
    ) -> io::Result<(Sink, Vec<u64>)> {
        match spec {
            SinkSpec::Null => Ok((Sink::Null, vec![])),
            SinkSpec::Memory => Ok((Sink::Memory(Mutex::new(BTreeMap::new())), vec![])),
            _ => {
                let path = spec.path_of(id).expect("file sink");
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)?;
                }
                let have = if resume {
                    load_journal(&path, &t)?
                } else {
                    None
                };
                let ctx =
                    |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(have.is_none())
                    .open(&path)
                    .map_err(ctx)?;
                let jp = journal_path(&path);
                let journal = match &have {
                    Some(h) => {
                        // Rewrite compactly (drops a torn tail), then append from there.
                        let mut body = jheader(&t).to_vec();
                        for &s in h {
                            body.extend_from_slice(&jrecord(s, t.transfer));
                        }
                        let tmp = journal_path(&path.with_extension("tmp"));
                        std::fs::write(&tmp, &body)?;
                        File::open(&tmp)?.sync_all()?;
                        std::fs::rename(&tmp, &jp)?;
                        OpenOptions::new().append(true).open(&jp)?
                    }
                    None => {
                        let f = OpenOptions::new()
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .open(&jp)?;
                        f.write_all_at(&jheader(&t), 0)?;
                        f.sync_all()?;
                        OpenOptions::new().append(true).open(&jp)?
                    }
                };
                Ok((
                    Sink::File(FileSink {
                        path,
                        file,
                        journal: Mutex::new(journal),
                        sync,
                        t,
                    }),
                    have.unwrap_or_default(),
                ))
            }
        }
    }

    /// Stores chunk `seq` (at `seq * chunk_bytes`).
    pub fn write(&self, seq: u64, chunk_bytes: u64, data: &[u8]) -> io::Result<()> {
        match self {
            Sink::Null => Ok(()),
            Sink::Memory(m) => {
                m.lock().unwrap().insert(seq, data.to_vec());
                Ok(())
            }
            Sink::File(f) => f.file.write_all_at(data, seq * chunk_bytes),
        }
    }

    /// Makes chunks durable as configured and records them in the journal.
    pub fn commit(&self, seqs: &[u64]) -> io::Result<()> {
        let Sink::File(f) = self else { return Ok(()) };
        if seqs.is_empty() {
            return Ok(());
        }
        if f.sync == Sync::Data {
            f.file.sync_data()?;
        }
        let mut rec = Vec::with_capacity(seqs.len() * 16);
        for &s in seqs {
            rec.extend_from_slice(&jrecord(s, f.t.transfer));
        }
        let j = f.journal.lock().unwrap();
        use std::io::Write;
        (&*j).write_all(&rec)?;
        if f.sync != Sync::None {
            j.sync_data()?;
        }
        Ok(())
    }

    /// Reads back a stored chunk (file sinks; for the whole-stream checksum after a restart).
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        match self {
            Sink::File(f) => f.file.read_exact_at(out, offset),
            _ => Err(io::Error::other(
                "this sink does not keep chunks from before a restart",
            )),
        }
    }

    /// Ends the stream: trims the file to its exact size and syncs.
    pub fn finish(&self, total_bytes: u64) -> io::Result<()> {
        if let Sink::File(f) = self {
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
            Sink::Memory(m) => Some(m.lock().unwrap().values().flatten().copied().collect()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let spec = SinkSpec::File(p.clone());
        let (s, have) = Sink::open(&spec, 0, t, true, Sync::Data).unwrap();
        assert!(have.is_empty());
        s.write(3, 4, b"abcd").unwrap();
        s.write(0, 4, b"wxyz").unwrap();
        s.commit(&[3, 0]).unwrap();
        drop(s);
        // A torn record at the end.
        let jp = journal_path(&p);
        let mut j = std::fs::read(&jp).unwrap();
        j.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&jp, &j).unwrap();
        let (s, have) = Sink::open(&spec, 0, t, true, Sync::Data).unwrap();
        assert_eq!(have, vec![0, 3]);
        let mut b = [0u8; 4];
        s.read_at(12, &mut b).unwrap();
        assert_eq!(&b, b"abcd");
        drop(s);
        // Another transfer: nothing is resumed, and the file starts empty.
        let other = Transfer { transfer: 10, ..t };
        let (_, have) = Sink::open(&spec, 0, other, true, Sync::Data).unwrap();
        assert!(have.is_empty());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
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
