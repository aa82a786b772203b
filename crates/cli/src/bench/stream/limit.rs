//! The machine limit's parts, each measured on one core in the same run: the two LZ4
//! implementations (compress, decompress) and loopback TCP (see the formula in the parent module).
//!
//! [`codec_rows`] compares the two implementations once, up front. [`Probe`] measures the parts
//! for the codec loci streams with again in every round of the comparisons, right before the
//! round's runs, so that each run is set against a limit measured under the same machine speed.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Instant;

use loci_report::{median, Report, Row};
use loci_stream::Codec;

use loci_place::sys::thread_cpu_seconds;

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

    /// Raw bytes per second if every core did only this work.
    pub fn raw_bytes_per_s(&self) -> f64 {
        self.raw_gb_per_s() * 1e9
    }
}

/// One codec's cost on one core, from [`codec_rows`].
#[derive(Clone, Copy, Debug)]
pub(super) struct CodecCost {
    pub(super) compress_s_per_gb: f64,
    pub(super) decompress_s_per_gb: f64,
    pub(super) ratio: f64,
}

/// The codec measurements' input: the file's first 8 projections (88 MB, beyond any cache)
/// whatever the chunk size, in memory, and the buffers one pass over it needs. Read once; the
/// up-front codec comparison and then the per-round [`Probe`] use it.
pub(super) struct Sample {
    raw: Vec<u8>,
    chunk: usize,
    comp: Vec<Vec<u8>>,
    sizes: Vec<usize>,
    out: Vec<u8>,
}

/// One pass of one codec over the sample, on this thread.
struct Pass {
    compress_wall_s: f64,
    compress_cpu_s: f64,
    decompress_wall_s: f64,
    decompress_cpu_s: f64,
    ratio: f64,
}

impl Sample {
    pub(super) fn read(data: &Path, chunk: usize) -> anyhow::Result<Self> {
        let want = 8 * chunk.max(loci_stream::phantom::PROJECTION_BYTES);
        let mut raw = Vec::with_capacity(want);
        File::open(data)?.take(want as u64).read_to_end(&mut raw)?;
        anyhow::ensure!(!raw.is_empty(), "{}: empty", data.display());
        let n = raw.chunks(chunk).count();
        Ok(Self {
            comp: (0..n).map(|_| vec![0u8; Codec::bound(chunk)]).collect(),
            sizes: vec![0; n],
            out: vec![0; chunk],
            raw,
            chunk,
        })
    }

    fn gb(&self) -> f64 {
        self.raw.len() as f64 / 1e9
    }

    /// Compress every chunk, then decompress every chunk: wall and thread CPU time of each.
    fn pass(&mut self, codec: Codec) -> anyhow::Result<Pass> {
        let c0 = thread_cpu_seconds();
        let t = Instant::now();
        for ((c, s), r) in self
            .comp
            .iter_mut()
            .zip(&mut self.sizes)
            .zip(self.raw.chunks(self.chunk))
        {
            *s = codec.compress(r, c)?;
        }
        let compress_wall_s = t.elapsed().as_secs_f64();
        let compress_cpu_s = thread_cpu_seconds() - c0;
        let c0 = thread_cpu_seconds();
        let t = Instant::now();
        for ((c, s), r) in self
            .comp
            .iter()
            .zip(&self.sizes)
            .zip(self.raw.chunks(self.chunk))
        {
            codec.decompress(&c[..*s], &mut self.out[..r.len()])?;
        }
        Ok(Pass {
            compress_wall_s,
            compress_cpu_s,
            decompress_wall_s: t.elapsed().as_secs_f64(),
            decompress_cpu_s: thread_cpu_seconds() - c0,
            ratio: self.raw.len() as f64 / self.sizes.iter().sum::<usize>() as f64,
        })
    }
}

/// One core each: compress then decompress every chunk of the sample with both implementations,
/// alternating between them every repetition (load on a shared machine drifts). Rows carry wall
/// time; the returned costs (one per [`Codec::ALL`]) are the median thread CPU time per GB.
pub(super) fn codec_rows(
    rep: &mut Report,
    sample: &mut Sample,
    reps: usize,
) -> anyhow::Result<Vec<CodecCost>> {
    let mut passes: Vec<Vec<Pass>> = Codec::ALL.iter().map(|_| Vec::new()).collect();
    for _ in 0..reps {
        for (k, codec) in Codec::ALL.into_iter().enumerate() {
            passes[k].push(sample.pass(codec)?);
        }
    }
    let gb = sample.gb();
    let med = |v: Vec<f64>| median(&v).expect("at least one rep");
    let costs: Vec<CodecCost> = passes
        .iter()
        .map(|p| CodecCost {
            compress_s_per_gb: med(p.iter().map(|p| p.compress_cpu_s).collect()) / gb,
            decompress_s_per_gb: med(p.iter().map(|p| p.decompress_cpu_s).collect()) / gb,
            ratio: p.last().expect("at least one rep").ratio,
        })
        .collect();
    for case in ["lz4-compress", "lz4-decompress"] {
        for (k, codec) in Codec::ALL.into_iter().enumerate() {
            let (wall, per_gb) = if case == "lz4-compress" {
                let w = passes[k].iter().map(|p| p.compress_wall_s).collect();
                (w, costs[k].compress_s_per_gb)
            } else {
                let w = passes[k].iter().map(|p| p.decompress_wall_s).collect();
                (w, costs[k].decompress_s_per_gb)
            };
            rep.results.push(
                Row::from_times(codec.name(), wall)
                    .case(case)
                    .config("threads", 1)
                    .work(sample.raw.len() as f64, "B/s")
                    .extra("compression_ratio", costs[k].ratio)
                    .extra("cpu_s_per_gb", per_gb),
            );
        }
    }
    Ok(costs)
}

/// The limit's parts for the codec loci streams with, measured again before every round of the
/// end-to-end and protection comparisons: passes of the codec over the sample and loopback
/// transfers of the stream's compressed size, each on one core. Each round's runs are set against
/// that round's limit. A limit measured once, before all rounds, drifted with this machine's speed
/// and moved the fraction of the limit by up to 0.14 between runs (docs/stream.md).
pub(super) struct Probe {
    codec: Codec,
    cores: usize,
    sample: Sample,
    /// One TCP write: about one compressed chunk, as loci sends them (phantom data: the content
    /// does not matter to TCP, but it is not a constant).
    payload: Vec<u8>,
    /// Bytes per loopback transfer: the stream's compressed size.
    wire: u64,
    /// Every measurement so far: the limit and the loopback transfer's wall seconds.
    taken: Vec<(Limit, f64)>,
}

impl Probe {
    /// `ratio` (raw per compressed byte, from [`codec_rows`]) sizes the TCP transfer and frames.
    pub(super) fn new(sample: Sample, codec: Codec, cores: usize, bytes: u64, ratio: f64) -> Self {
        let frame = ((sample.chunk as f64 / ratio) as usize).clamp(1, sample.raw.len());
        Self {
            codec,
            cores,
            payload: sample.raw[..frame].to_vec(),
            sample,
            wire: (bytes as f64 / ratio).ceil() as u64,
            taken: Vec::new(),
        }
    }

    /// Measures the parts now, each the cheaper of two passes; returns the limit in raw bytes
    /// per second. A limit is what the machine can do, and one pass of about 0.1 s now and then
    /// caught a hiccup of the machine (one round's limit at 0.6x the others').
    pub(super) fn measure(&mut self) -> anyhow::Result<f64> {
        let mut best: Option<(Limit, f64)> = None;
        for _ in 0..2 {
            let pass = self.sample.pass(self.codec)?;
            let (tcp_wall_s, tcp_cpu_s) = tcp_once(&self.payload, self.wire)?;
            let gb = self.sample.gb();
            let l = Limit {
                cores: self.cores,
                compress_s_per_gb: pass.compress_cpu_s / gb,
                decompress_s_per_gb: pass.decompress_cpu_s / gb,
                tcp_s_per_gb: tcp_cpu_s * 1e9 / self.wire as f64,
                ratio: pass.ratio,
            };
            best = Some(match best {
                None => (l, tcp_wall_s),
                Some((b, w)) => (
                    Limit {
                        compress_s_per_gb: b.compress_s_per_gb.min(l.compress_s_per_gb),
                        decompress_s_per_gb: b.decompress_s_per_gb.min(l.decompress_s_per_gb),
                        tcp_s_per_gb: b.tcp_s_per_gb.min(l.tcp_s_per_gb),
                        ..b
                    },
                    w.min(tcp_wall_s),
                ),
            });
        }
        let (limit, tcp_wall_s) = best.expect("two passes");
        self.taken.push((limit, tcp_wall_s));
        Ok(limit.raw_bytes_per_s())
    }

    /// The `machine-limit` row (one time per measurement: `bytes` at that round's limit, so its
    /// median is the median limit), the `tcp-loopback` row, both inserted at `at` in the results,
    /// and `params.machine_limit` with the parts' medians and the limit of every round.
    pub(super) fn report(&self, rep: &mut Report, bytes: u64, at: usize) {
        let med = |part: fn(&Limit) -> f64| {
            median(&self.taken.iter().map(|(l, _)| part(l)).collect::<Vec<_>>())
                .expect("the limit was measured")
        };
        let per_round: Vec<f64> = self
            .taken
            .iter()
            .map(|(l, _)| l.raw_bytes_per_s())
            .collect();
        let (compress, decompress, tcp, ratio, cpu) = (
            med(|l| l.compress_s_per_gb),
            med(|l| l.decompress_s_per_gb),
            med(|l| l.tcp_s_per_gb),
            med(|l| l.ratio),
            med(Limit::cpu_s_per_raw_gb),
        );
        rep.params["machine_limit"] = serde_json::json!({
            "codec": self.codec.name(),
            "cores": self.cores,
            "compress_cpu_s_per_gb": compress,
            "decompress_cpu_s_per_gb": decompress,
            "tcp_cpu_s_per_wire_gb": tcp,
            "compression_ratio": ratio,
            "raw_bytes_per_s": median(&per_round),
            "raw_bytes_per_s_per_round": per_round,
            "measured": "before every round, on one core each",
            "formula": Limit::FORMULA,
        });
        let limit = Row::from_times(
            "limit",
            per_round.iter().map(|b| bytes as f64 / b).collect(),
        )
        .case("machine-limit")
        .config("cores", format!("{} cores", self.cores))
        .work(bytes as f64, "B/s")
        .extra("computed", true)
        .extra("codec", self.codec.name())
        .extra("cpu_s_per_gb", cpu)
        .extra("compress_cpu_s_per_gb", compress)
        .extra("decompress_cpu_s_per_gb", decompress)
        .extra("tcp_cpu_s_per_wire_gb", tcp)
        .extra("compression_ratio", ratio)
        .extra("formula", Limit::FORMULA);
        let tcp_row = Row::from_times("loopback", self.taken.iter().map(|(_, s)| *s).collect())
            .case("tcp-loopback")
            .config("threads", "1 sender + 1 receiver")
            .work(self.wire as f64, "B/s")
            .extra("cpu_s_per_gb", tcp);
        rep.results.insert(at, limit);
        rep.results.insert(at, tcp_row);
    }
}

/// One loopback transfer of `wire` bytes; (wall seconds, sender + receiver thread cpu-seconds).
fn tcp_once(payload: &[u8], wire: u64) -> anyhow::Result<(f64, f64)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let cap = payload.len().max(1 << 20);
    let rx = std::thread::spawn(move || -> std::io::Result<(u64, f64)> {
        let (mut s, _) = l.accept()?;
        let c0 = thread_cpu_seconds();
        let mut buf = vec![0u8; cap];
        let mut got = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => break,
                n => got += n as u64,
            }
        }
        Ok((got, thread_cpu_seconds() - c0))
    });
    let t = Instant::now();
    let tx = std::thread::scope(|sc| {
        sc.spawn(|| -> std::io::Result<f64> {
            let c0 = thread_cpu_seconds();
            let mut s = TcpStream::connect(addr)?;
            let mut left = wire;
            while left > 0 {
                let n = left.min(payload.len() as u64) as usize;
                s.write_all(&payload[..n])?;
                left -= n as u64;
            }
            s.shutdown(std::net::Shutdown::Write)?;
            Ok(thread_cpu_seconds() - c0)
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
