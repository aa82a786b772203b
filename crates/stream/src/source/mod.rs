//! Where a sender's chunks come from: a raw binary file (mapped, see [`map`]), or the
//! synthetic phantom.

pub mod map;

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

use crate::buf::PooledBuf;
use crate::hash::xxh3_64;
use map::FileMap;

use crate::phantom::{Phantom, HEIGHT, PROJECTION_BYTES, WIDTH};

/// A source of raw bytes, read in chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// A raw binary file, streamed as is.
    File(PathBuf),
    /// `bytes` of phantom projections from `seed`.
    Synthetic { bytes: u64, seed: u64 },
}

/// Distinct phantom projections a synthetic source computes up front. Its bytes are projections
/// `0, 1, 2, ...` back to back, projection `j` being `j % POOL`, whatever the chunk size; each
/// chunk's first 8 bytes are then replaced by its sequence number (so every chunk differs and a
/// misplaced chunk is caught). Computing a projection costs about 50 ms, far slower than the
/// pipeline.
pub const POOL: u64 = 16;

impl SourceSpec {
    /// Total bytes.
    pub fn total_bytes(&self) -> std::io::Result<u64> {
        match self {
            SourceSpec::File(p) => Ok(std::fs::metadata(p)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))?
                .len()),
            SourceSpec::Synthetic { bytes, .. } => Ok(*bytes),
        }
    }
    /// Identity of the data: a restarted sender with the same source gets the same value.
    pub fn transfer_id(&self, chunk_bytes: usize) -> std::io::Result<u64> {
        let desc = match self {
            SourceSpec::File(p) => {
                let canon = std::fs::canonicalize(p)?;
                let m = std::fs::metadata(&canon)?;
                format!(
                    "file:{}:{}:{}:{}",
                    canon.display(),
                    m.len(),
                    m.mtime(),
                    m.mtime_nsec()
                )
            }
            SourceSpec::Synthetic { bytes, seed } => {
                format!("synthetic-projections:{bytes}:{seed}:{POOL}")
            }
        };
        Ok(xxh3_64(format!("{desc}:{chunk_bytes}").as_bytes()))
    }
    /// Opens a reader: a file is mapped where it can be (else read with copies).
    pub fn open(&self) -> std::io::Result<ChunkReader> {
        match self {
            SourceSpec::File(p) => {
                let f = File::open(p)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
                Ok(match FileMap::new(f, p) {
                    Ok(m) => ChunkReader::Mapped(m),
                    Err(f) => ChunkReader::File(f),
                })
            }
            SourceSpec::Synthetic { bytes, seed } => {
                let n = bytes.div_ceil(PROJECTION_BYTES as u64).clamp(1, POOL);
                Ok(ChunkReader::Synthetic(phantom_pool(*seed, n)))
            }
        }
    }
}

/// Computes phantom projections `0..n` of `seed`, on all cpus.
pub fn phantom_pool(seed: u64, n: u64) -> Vec<Vec<u8>> {
    let ph = Phantom::new(seed, WIDTH, HEIGHT);
    let mut pool: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; PROJECTION_BYTES]).collect();
    let threads = std::thread::available_parallelism()
        .map(|t| t.get())
        .unwrap_or(1);
    let per = (pool.len().div_ceil(threads)).max(1);
    std::thread::scope(|s| {
        for (k, part) in pool.chunks_mut(per).enumerate() {
            let ph = &ph;
            s.spawn(move || {
                for (j, out) in part.iter_mut().enumerate() {
                    ph.fill((k * per + j) as u64, out);
                }
            });
        }
    });
    pool
}

/// Reads chunks at any offset, from any number of threads at once (a mapping, positional reads,
/// or the synthetic pool: all only read).
pub enum ChunkReader {
    /// A regular file, mapped: chunks are borrowed from the page cache.
    Mapped(FileMap),
    /// A file that cannot be mapped, read with positional reads.
    File(File),
    Synthetic(Vec<Vec<u8>>),
}

impl ChunkReader {
    /// Runs `f` on the `len` bytes of chunk `seq` at `offset` and returns what it returns. A
    /// mapped file's bytes are borrowed from the page cache; should the file change while `f`
    /// runs, `f` runs again on a copy (so what it computed, say a compressed frame and a hash,
    /// is of bytes that stayed put), and so does every later chunk. Other sources are read into
    /// a buffer from `buf` first. A file that shrank is an error.
    pub fn with_chunk<T>(
        &self,
        seq: u64,
        offset: u64,
        len: usize,
        buf: impl FnOnce() -> io::Result<PooledBuf>,
        mut f: impl FnMut(&[u8]) -> T,
    ) -> io::Result<T> {
        if let ChunkReader::Mapped(m) = self {
            if let Some(bytes) = m.chunk(offset, len)? {
                let out = f(bytes);
                if m.settled(offset, len)? {
                    return Ok(out);
                }
            }
        }
        let mut b = buf()?;
        b.set_len(len);
        self.read(seq, offset, &mut b[..])?;
        Ok(f(&b[..]))
    }

    /// Fills `out` with the bytes at `offset` (chunk `seq`); `out.len()` is the chunk's size.
    pub fn read(&self, seq: u64, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        match self {
            ChunkReader::Mapped(m) => m.file().read_exact_at(out, offset),
            ChunkReader::File(f) => f.read_exact_at(out, offset),
            ChunkReader::Synthetic(pool) => {
                let period = pool.len() as u64 * PROJECTION_BYTES as u64;
                let mut at = offset % period;
                let mut done = 0;
                while done < out.len() {
                    let p = &pool[(at / PROJECTION_BYTES as u64) as usize];
                    let from = (at % PROJECTION_BYTES as u64) as usize;
                    let n = (PROJECTION_BYTES - from).min(out.len() - done);
                    out[done..done + n].copy_from_slice(&p[from..from + n]);
                    done += n;
                    at = (at + n as u64) % period;
                }
                let tag = seq.to_le_bytes();
                let n = out.len().min(8);
                out[..n].copy_from_slice(&tag[..n]);
                Ok(())
            }
        }
    }
}

/// Writes `bytes` of the synthetic source into a file (for benchmarks and tests that need the
/// same data as a file).
pub fn write_synthetic_file(
    path: &std::path::Path,
    bytes: u64,
    seed: u64,
    chunk_bytes: usize,
) -> std::io::Result<()> {
    let spec = SourceSpec::Synthetic { bytes, seed };
    let r = spec.open()?;
    let f = File::create(path)?;
    let mut buf = vec![0u8; chunk_bytes];
    let mut off = 0u64;
    let mut seq = 0;
    while off < bytes {
        let n = ((bytes - off) as usize).min(chunk_bytes);
        r.read(seq, off, &mut buf[..n])?;
        f.write_all_at(&buf[..n], off)?;
        off += n as u64;
        seq += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chunk of a synthetic source, read with chunks of `chunk` bytes, concatenated, with
    /// the 8 tag bytes at each chunk's start zeroed.
    fn untagged(bytes: u64, chunk: usize) -> Vec<u8> {
        let r = SourceSpec::Synthetic { bytes, seed: 3 }.open().unwrap();
        let mut all = vec![0u8; bytes as usize];
        for (seq, part) in all.chunks_mut(chunk).enumerate() {
            r.read(seq as u64, (seq * chunk) as u64, part).unwrap();
            let n = part.len().min(8);
            part[..n].fill(0);
        }
        all
    }

    #[test]
    fn synthetic_bytes_do_not_depend_on_the_chunk_size() {
        // Two projections and a bit: chunks cross projection boundaries.
        let bytes = 2 * PROJECTION_BYTES as u64 + 12_345;
        let whole = untagged(bytes, PROJECTION_BYTES);
        for chunk in [1 << 20, 524_288 + 7, 4096] {
            let mut small = untagged(bytes, chunk);
            // Zero where the projection-sized reading zeroed its tags, too.
            for p in (0..small.len()).step_by(PROJECTION_BYTES) {
                small[p..(p + 8).min(bytes as usize)].fill(0);
            }
            let mut whole = whole.clone();
            for p in (0..whole.len()).step_by(chunk) {
                whole[p..(p + 8).min(bytes as usize)].fill(0);
            }
            assert!(small == whole, "chunk {chunk}: bytes differ");
        }
        // Projections differ from each other, and chunks carry their sequence number.
        assert_ne!(
            whole[8..4096],
            whole[PROJECTION_BYTES + 8..PROJECTION_BYTES + 4096]
        );
        let r = SourceSpec::Synthetic { bytes, seed: 3 }.open().unwrap();
        let mut c = vec![0u8; 4096];
        r.read(5, 5 * 4096, &mut c).unwrap();
        assert_eq!(c[..8], 5u64.to_le_bytes());
    }
}
