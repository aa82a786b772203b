//! The machine limit's parts, each measured on one core in the same run: the two LZ4
//! implementations (compress, decompress) and loopback TCP (see the formula in the parent module).

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use loci_report::{Report, Row};
use loci_stream::Codec;

use super::cpu_seconds;

/// The machine limit's inputs: cpu-seconds per GB of each unavoidable part, on one core.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    /// Allowed cpus.
    pub cores: usize,
    /// LZ4 compression, cpu-s per GB of raw input.
    pub compress_s_per_gb: f64,
    /// LZ4 decompression, cpu-s per GB of raw output.
    pub decompress_s_per_gb: f64,
    /// Loopback TCP, sender and receiver together, cpu-s per GB moved (compressed bytes).
    pub tcp_s_per_gb: f64,
    /// Raw bytes per compressed byte.
    pub ratio: f64,
}

impl Limit {
    pub const FORMULA: &'static str =
        "cores / (compress cpu-s per raw GB + tcp cpu-s per wire GB / ratio + decompress cpu-s per raw GB)";

    /// CPU seconds the unavoidable work costs per raw GB.
    pub fn cpu_s_per_raw_gb(&self) -> f64 {
        self.compress_s_per_gb + self.tcp_s_per_gb / self.ratio + self.decompress_s_per_gb
    }

    /// Raw GB/s if every core did only this work.
    pub fn raw_gb_per_s(&self) -> f64 {
        self.cores as f64 / self.cpu_s_per_raw_gb()
    }
}

/// One codec's cost on one core, from [`codec_rows`].
#[derive(Clone, Copy, Debug)]
pub(super) struct CodecCost {
    pub(super) compress_s_per_gb: f64,
    pub(super) decompress_s_per_gb: f64,
    pub(super) ratio: f64,
}

/// One core each: compress then decompress every chunk of the file with both implementations,
/// alternating between them every repetition (load on a shared machine drifts). Rows carry wall
/// time; the returned costs (one per [`Codec::ALL`]) are the median thread CPU time per GB.
pub(super) fn codec_rows(
    rep: &mut Report,
    data: &Path,
    chunk: usize,
    reps: usize,
) -> anyhow::Result<Vec<CodecCost>> {
    let raw = std::fs::read(data)?;
    // At least 8 projections (88 MB, beyond any cache) whatever the chunk size.
    let raw = &raw[..raw
        .len()
        .min(8 * chunk.max(loci_stream::phantom::PROJECTION_BYTES))];
    let n = raw.chunks(chunk).count();
    let mut comp: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; Codec::bound(chunk)]).collect();
    let mut sizes = vec![0usize; n];
    let mut out = vec![0u8; chunk];
    let mut ct = vec![Vec::new(); Codec::ALL.len()];
    let mut dt = vec![Vec::new(); Codec::ALL.len()];
    let mut ccpu = vec![Vec::new(); Codec::ALL.len()];
    let mut dcpu = vec![Vec::new(); Codec::ALL.len()];
    let mut ratio = vec![0f64; Codec::ALL.len()];
    for _ in 0..reps {
        for (k, codec) in Codec::ALL.into_iter().enumerate() {
            let c0 = cpu_seconds(libc::RUSAGE_THREAD);
            let t = Instant::now();
            for ((c, s), r) in comp.iter_mut().zip(&mut sizes).zip(raw.chunks(chunk)) {
                *s = codec.compress(r, c)?;
            }
            ct[k].push(t.elapsed().as_secs_f64());
            ccpu[k].push(cpu_seconds(libc::RUSAGE_THREAD) - c0);
            let c0 = cpu_seconds(libc::RUSAGE_THREAD);
            let t = Instant::now();
            for ((c, s), r) in comp.iter().zip(&sizes).zip(raw.chunks(chunk)) {
                codec.decompress(&c[..*s], &mut out[..r.len()])?;
            }
            dt[k].push(t.elapsed().as_secs_f64());
            dcpu[k].push(cpu_seconds(libc::RUSAGE_THREAD) - c0);
            ratio[k] = raw.len() as f64 / sizes.iter().sum::<usize>() as f64;
        }
    }
    let gb = raw.len() as f64 / 1e9;
    let per_gb = |v: &[f64]| loci_report::median(v).expect("at least one rep") / gb;
    for (case, times, cpu) in [("lz4-compress", ct, &ccpu), ("lz4-decompress", dt, &dcpu)] {
        for (k, codec) in Codec::ALL.into_iter().enumerate() {
            rep.results.push(
                Row::from_times(codec.name(), times[k].clone())
                    .case(case)
                    .config("threads", 1)
                    .work(raw.len() as f64, "B/s")
                    .extra("compression_ratio", ratio[k])
                    .extra("cpu_s_per_gb", per_gb(&cpu[k])),
            );
        }
    }
    Ok((0..Codec::ALL.len())
        .map(|k| CodecCost {
            compress_s_per_gb: per_gb(&ccpu[k]),
            decompress_s_per_gb: per_gb(&dcpu[k]),
            ratio: ratio[k],
        })
        .collect())
}

/// Loopback TCP cost: a sender thread writes `wire` bytes (the compressed size of the file) in
/// frames of one compressed chunk, a receiver thread reads them; both count their own thread CPU
/// time. Pushes a row (wall time) and returns the median cpu-seconds per GB moved.
pub(super) fn tcp_rows(
    rep: &mut Report,
    data: &Path,
    wire: u64,
    chunk: usize,
    ratio: f64,
    reps: usize,
) -> anyhow::Result<f64> {
    // Frames as loci sends them: about one compressed chunk each. The content does not matter to
    // TCP; it is phantom data, not a constant.
    let frame = ((chunk as f64 / ratio) as usize).max(1);
    let mut payload = vec![0u8; frame];
    let got = File::open(data)?.read_at(&mut payload, 0)?;
    payload.truncate(got.max(1));
    let mut secs = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..reps {
        let (s, c) = tcp_once(&payload, wire)?;
        secs.push(s);
        cpu.push(c);
    }
    let cpu_s_per_gb = loci_report::median(&cpu).expect("at least one rep") * 1e9 / wire as f64;
    rep.results.push(
        Row::from_times("loopback", secs)
            .case("tcp-loopback")
            .config("threads", "1 sender + 1 receiver")
            .work(wire as f64, "B/s")
            .extra("cpu_s_per_gb", cpu_s_per_gb),
    );
    Ok(cpu_s_per_gb)
}

/// One loopback transfer of `wire` bytes; (wall seconds, sender + receiver thread cpu-seconds).
fn tcp_once(payload: &[u8], wire: u64) -> anyhow::Result<(f64, f64)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let cap = payload.len().max(1 << 20);
    let rx = std::thread::spawn(move || -> std::io::Result<(u64, f64)> {
        let (mut s, _) = l.accept()?;
        let c0 = cpu_seconds(libc::RUSAGE_THREAD);
        let mut buf = vec![0u8; cap];
        let mut got = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => break,
                n => got += n as u64,
            }
        }
        Ok((got, cpu_seconds(libc::RUSAGE_THREAD) - c0))
    });
    let t = Instant::now();
    let tx = std::thread::scope(|sc| {
        sc.spawn(|| -> std::io::Result<f64> {
            let c0 = cpu_seconds(libc::RUSAGE_THREAD);
            let mut s = TcpStream::connect(addr)?;
            let mut left = wire;
            while left > 0 {
                let n = left.min(payload.len() as u64) as usize;
                s.write_all(&payload[..n])?;
                left -= n as u64;
            }
            s.shutdown(std::net::Shutdown::Write)?;
            Ok(cpu_seconds(libc::RUSAGE_THREAD) - c0)
        })
        .join()
        .expect("sender thread")
    })?;
    let (got, rx_cpu) = rx.join().expect("receiver thread")?;
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        got == wire,
        "loopback TCP measurement: received {got} of {wire} bytes"
    );
    Ok((secs, tx + rx_cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_is_cores_over_the_cpu_seconds_per_raw_gb() {
        let l = Limit {
            cores: 2,
            compress_s_per_gb: 1.6,
            decompress_s_per_gb: 0.4,
            tcp_s_per_gb: 0.4,
            ratio: 2.0,
        };
        // 1.6 + 0.4 / 2 + 0.4 = 2.2 cpu-s per raw GB; 2 cores -> 0.909 GB/s.
        assert!((l.cpu_s_per_raw_gb() - 2.2).abs() < 1e-12);
        assert!((l.raw_gb_per_s() - 2.0 / 2.2).abs() < 1e-12);
        // Linear in cores; a better ratio makes TCP cheaper per raw byte.
        let four = Limit { cores: 4, ..l };
        assert!((four.raw_gb_per_s() - 2.0 * l.raw_gb_per_s()).abs() < 1e-12);
        let better = Limit { ratio: 4.0, ..l };
        assert!((better.cpu_s_per_raw_gb() - 2.1).abs() < 1e-12);
        // No compression cost at all: bounded by decompress + TCP alone.
        let free = Limit {
            compress_s_per_gb: 0.0,
            ..l
        };
        assert!((free.raw_gb_per_s() - 2.0 / 0.6).abs() < 1e-12);
    }
}
