//! Where a sender's chunks come from: a raw binary file, or the synthetic phantom.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

use xxhash_rust::xxh3::xxh3_64;

use crate::phantom::{Phantom, WIDTH};

/// A source of raw bytes, read in chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// A raw binary file, streamed as is.
    File(PathBuf),
    /// `bytes` of phantom projections from `seed`.
    Synthetic { bytes: u64, seed: u64 },
}

/// Distinct phantom projections a synthetic source computes up front; chunk `i` is projection
/// `i % POOL` with its first 8 bytes replaced by `i` (so every chunk differs and a misplaced chunk
/// is caught). Computing a projection costs about 50 ms, far slower than the pipeline.
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
            SourceSpec::Synthetic { bytes, seed } => format!("synthetic:{bytes}:{seed}:{POOL}"),
        };
        Ok(xxh3_64(format!("{desc}:{chunk_bytes}").as_bytes()))
    }
    /// Opens a reader of `chunk_bytes` chunks.
    pub fn open(&self, chunk_bytes: usize) -> std::io::Result<ChunkReader> {
        match self {
            SourceSpec::File(p) => {
                Ok(ChunkReader::File(File::open(p).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
                })?))
            }
            SourceSpec::Synthetic { bytes, seed } => {
                let chunks = bytes.div_ceil(chunk_bytes as u64).min(POOL);
                Ok(ChunkReader::Synthetic(phantom_pool(
                    *seed,
                    chunk_bytes,
                    chunks,
                )))
            }
        }
    }
}

/// Computes `n` phantom projections of `chunk_bytes` each, on all cpus.
pub fn phantom_pool(seed: u64, chunk_bytes: usize, n: u64) -> Vec<Vec<u8>> {
    let height = chunk_bytes.div_ceil(2 * WIDTH).max(1);
    let ph = Phantom::new(seed, WIDTH, height);
    let mut pool: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; chunk_bytes]).collect();
    let threads = std::thread::available_parallelism()
        .map(|t| t.get())
        .unwrap_or(1);
    let per = (pool.len().div_ceil(threads)).max(1);
    std::thread::scope(|s| {
        for (k, part) in pool.chunks_mut(per).enumerate() {
            let ph = &ph;
            s.spawn(move || {
                let mut full = vec![0u8; ph.chunk_bytes()];
                for (j, out) in part.iter_mut().enumerate() {
                    ph.fill((k * per + j) as u64, &mut full);
                    let n = out.len();
                    out.copy_from_slice(&full[..n]);
                }
            });
        }
    });
    pool
}

/// Reads chunks.
pub enum ChunkReader {
    File(File),
    Synthetic(Vec<Vec<u8>>),
}

impl ChunkReader {
    /// Fills `out` with the bytes at `offset` (chunk `seq`); `out.len()` is the chunk's size.
    pub fn read(&mut self, seq: u64, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        match self {
            ChunkReader::File(f) => f.read_exact_at(out, offset),
            ChunkReader::Synthetic(pool) => {
                let p = &pool[(seq % pool.len() as u64) as usize];
                out.copy_from_slice(&p[..out.len()]);
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
    let mut r = spec.open(chunk_bytes)?;
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
