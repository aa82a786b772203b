//! `loci bench alloc`: the allocator microbenchmark of seed 002 and the buffer-passing case of
//! seed 003, for glibc, jemalloc, tcmalloc, tbbmalloc, mimalloc and loci-alloc.
//!
//! Every allocator runs the same code: this binary re-executes itself (`--child CASE`) with the
//! allocator's library in `LD_PRELOAD` (glibc: none) and the child prints one JSON line with its
//! time, its peak RSS above the RSS it had before the timed phase, and the peak of the bytes
//! it had requested and not yet freed. Nothing is installed here: a missing library is
//! reported with its Debian package and its column skipped.
//!
//! * `general` (seed 002): each of T threads does N operations on its own table of slots: an
//!   empty slot gets a block (allocate, then write all of it), a full slot is read (first and
//!   last byte checked) and freed. Size classes 16 B .. 512 KiB (powers of two) are drawn with
//!   probability inversely proportional to the class size, the size uniform inside the class.
//! * `buffer-passing` (seed 003): T threads in a ring; each allocates batches of 8 KiB .. 512 KiB
//!   blocks (same size law), writes them, and sends each batch to the next thread, which checks
//!   them (one word per page) and frees them: every block is freed by another thread than the
//!   one that allocated it.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use loci_report::{median, Machine, Report, Row};
use serde::{Deserialize, Serialize};

use super::common::{
    cpu_seconds, find_system_lib, loci_alloc_stats, max_rss_bytes, Allocator, ALLOCATORS,
    MEMORYLESS_FALLBACKS,
};

#[derive(Args, Debug)]
pub struct AllocArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Threads per case (default: the cpus this process may use, at least 2).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Operations per thread in `general` (default 20M, --quick 2M).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Blocks each thread allocates and passes on in `buffer-passing` (default ops / 16).
    #[arg(long)]
    pub blocks: Option<u64>,
    /// Blocks per message in `buffer-passing` (a thread allocates a batch, sends it, then
    /// frees the batch it received: about two batches per thread are live at a time).
    #[arg(long, default_value_t = 1024)]
    pub batch: usize,
    /// Allocators to compare, comma separated: glibc, jemalloc, tcmalloc, tbbmalloc, mimalloc,
    /// loci, and loci-small-system (loci with blocks below 8 KiB delegated to glibc).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "glibc,jemalloc,tcmalloc,tbbmalloc,mimalloc,loci"
    )]
    pub peers: Vec<String>,
    /// Cases to run, comma separated: general, buffer-passing.
    #[arg(long, value_delimiter = ',', default_value = "general,buffer-passing")]
    pub cases: Vec<String>,
    /// libloci_malloc.so to use for `loci` (default: next to this executable, where
    /// `cargo build --release` puts it).
    #[arg(long, value_name = "FILE")]
    pub loci_lib: Option<PathBuf>,
    /// Internal: run one case in this process and print its measurement as JSON.
    #[arg(long, hide = true)]
    pub child: Option<String>,
}

const CASES: [&str; 2] = ["general", "buffer-passing"];

/// What a child measured.
#[derive(Debug, Serialize, Deserialize)]
pub struct ChildResult {
    pub seconds: f64,
    /// Peak RSS minus the RSS before the timed phase.
    pub rss_bytes: u64,
    /// Peak RSS of the whole process.
    pub max_rss_bytes: u64,
    /// Peak of bytes requested and not yet freed (summed over threads).
    pub requested_bytes: u64,
    /// Operations (general) or blocks passed (buffer-passing).
    pub work: u64,
    /// Bytes allocated in total.
    pub bytes: u64,
    pub checksum: u64,
    /// loci-alloc's own counters when the child ran on it (see `loci_alloc_stats` in
    /// libloci_malloc.so), by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loci_stats: Option<std::collections::BTreeMap<String, u64>>,
}

pub fn run(a: AllocArgs) -> anyhow::Result<Report> {
    let cpus = loci_place::sys::get_affinity(0)
        .map(|c| c.len())
        .unwrap_or(2);
    let threads = a.threads.unwrap_or(cpus.max(2));
    anyhow::ensure!(threads >= 1, "--threads must be at least 1");
    let ops = a.ops.unwrap_or(if a.common.quick {
        2_000_000
    } else {
        20_000_000
    });
    anyhow::ensure!(ops > 0, "--ops must be positive");
    let blocks = a.blocks.unwrap_or((ops / 16).max(1));
    if let Some(case) = &a.child {
        let mut r = match case.as_str() {
            "general" => general(threads, ops),
            "buffer-passing" => {
                anyhow::ensure!(threads >= 2, "buffer-passing needs at least 2 threads");
                buffer_passing(threads, blocks, a.batch)
            }
            other => bail!("unknown case {other:?}; valid: {}", CASES.join(", ")),
        };
        r.loci_stats = loci_alloc_stats();
        println!("{}", serde_json::to_string(&r)?);
        std::process::exit(0);
    }
    for c in &a.cases {
        anyhow::ensure!(
            CASES.contains(&c.as_str()),
            "unknown case {c:?}; valid cases: {}",
            CASES.join(", ")
        );
    }
    if a.cases.iter().any(|c| c == "buffer-passing") {
        anyhow::ensure!(threads >= 2, "buffer-passing needs --threads 2 or more");
    }
    let reps = a.common.reps.unwrap_or(5);
    anyhow::ensure!(reps > 0, "--reps must be positive");
    let exe = std::env::current_exe().context("cannot find the loci executable")?;
    let loci_lib = a
        .loci_lib
        .clone()
        .unwrap_or_else(|| exe.with_file_name("libloci_malloc.so"));

    // Which allocators can run.
    let mut chosen: Vec<(&Allocator, Option<PathBuf>)> = Vec::new();
    for name in &a.peers {
        let Some(al) = ALLOCATORS.iter().find(|x| x.name == name) else {
            let valid: Vec<&str> = ALLOCATORS.iter().map(|x| x.name).collect();
            bail!("unknown allocator {name:?}; valid: {}", valid.join(", "));
        };
        let lib = if al.name.starts_with("loci") {
            if !loci_lib.exists() {
                eprintln!(
                    "alloc: {} not found (build it: cargo build --release -p loci-alloc-preload, or pass --loci-lib); column {} skipped",
                    loci_lib.display(),
                    al.name
                );
                continue;
            }
            Some(loci_lib.clone())
        } else if let Some(file) = al.lib {
            match find_system_lib(file) {
                Some(p) => Some(p),
                None => {
                    eprintln!(
                        "alloc: {file} not found; install the Debian package {} (scripts/install-deps installs it); column {} skipped",
                        al.package, al.name
                    );
                    continue;
                }
            }
        } else {
            None
        };
        chosen.push((al, lib));
    }

    let topo = crate::this_machine()?;
    let mut rep = Report::new(
        "alloc",
        serde_json::json!({
            "threads": threads, "ops_per_thread": ops, "blocks_per_thread": blocks,
            "reps": reps, "general_slots_per_thread": GENERAL_SLOTS,
            "general_sizes": "classes 16 B..512 KiB, P(class) ~ 1/size",
            "buffer_sizes": "8193 B..512 KiB (power-of-two classes, P(class) ~ 1/size)",
            "buffer_batch": a.batch,
            "rss": "peak RSS minus RSS before the timed phase",
            "requested": "peak of bytes requested and not yet freed",
        }),
        Machine::of(&topo),
    );
    for case in &a.cases {
        // Each rep runs every allocator once, in an order rotated by one per rep (as `loci bench
        // sched` does): a load spike on the host then hits one rep of every allocator rather
        // than every rep of one, and the medians stay comparable.
        let mut times = vec![Vec::new(); chosen.len()];
        let mut results: Vec<Vec<ChildResult>> = (0..chosen.len()).map(|_| Vec::new()).collect();
        let mut cpus = vec![Vec::new(); chosen.len()];
        for r in 0..reps {
            for k in 0..chosen.len() {
                let i = (k + r) % chosen.len();
                let (al, lib) = &chosen[i];
                let mut cmd = Command::new(&exe);
                cmd.args(["bench", "alloc", "--child", case])
                    .args(["--threads", &threads.to_string()])
                    .args(["--ops", &ops.to_string()])
                    .args(["--blocks", &blocks.to_string()])
                    .args(["--batch", &a.batch.to_string()]);
                cmd.env_remove("LD_PRELOAD");
                cmd.env_remove("LOCI_ALLOC_SMALL");
                if let Some(l) = lib {
                    cmd.env("LD_PRELOAD", l);
                }
                for (k, v) in al.env {
                    cmd.env(k, v);
                }
                eprint!("alloc: {case} {} rep {}/{reps} ... ", al.name, r + 1);
                std::io::stderr().flush().ok();
                let cpu0 = cpu_seconds(libc::RUSAGE_CHILDREN);
                let out = cmd.output().context("cannot start the benchmark child")?;
                cpus[i].push(cpu_seconds(libc::RUSAGE_CHILDREN) - cpu0);
                if !out.status.success() {
                    eprintln!("failed");
                    bail!(
                        "{case} on {} failed ({}): {}",
                        al.name,
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                let text = String::from_utf8_lossy(&out.stdout);
                let line = text.lines().last().unwrap_or("");
                let res: ChildResult = serde_json::from_str(line)
                    .with_context(|| format!("child of {} printed {line:?}", al.name))?;
                eprintln!("{:.3} s", res.seconds);
                times[i].push(res.seconds);
                results[i].push(res);
            }
        }
        for (((al, lib), times), (results, cpus)) in
            chosen.iter().zip(times).zip(results.into_iter().zip(cpus))
        {
            // RSS: the worst rep (a user meets the worst case); time: the median rep.
            let rss = results.iter().map(|r| r.rss_bytes).max().unwrap_or(0);
            let req = results.iter().map(|r| r.requested_bytes).max().unwrap_or(0);
            let (work, unit) = if case == "general" {
                (results[0].work as f64 * threads as f64, "ops/s")
            } else {
                (results[0].bytes as f64, "B/s")
            };
            let mut row = Row::from_times(al.name, times)
                .case(case)
                .config("threads", threads)
                .work(work, unit)
                .extra("rss_over_requested", rss as f64 / req.max(1) as f64)
                .extra("cpu_s_median", median(&cpus).unwrap_or(0.0))
                .extra(
                    "max_rss_bytes",
                    results.iter().map(|r| r.max_rss_bytes).max(),
                );
            if let Some(l) = lib {
                row = row.extra("library", l.display().to_string());
            }
            if let Some(st) = results.last().and_then(|r| r.loci_stats.clone()) {
                row = row.extra("loci_stats", st);
            }
            row.rss_bytes = Some(rss);
            row.requested_bytes = Some(req);
            rep.results.push(row);
        }
    }
    Ok(rep)
}

/// The fastest row of a case that is not loci: the peer the goals are measured against.
pub fn best_peer<'a>(rep: &'a Report, case: &'a str) -> Option<&'a Row> {
    rep.rows_of(Some(case))
        .filter(|r| !r.system.starts_with("loci"))
        .min_by(|a, b| a.median_s.total_cmp(&b.median_s))
}

/// Lines that state loci's ratios against the best peer and the goals.
pub fn goals(rep: &Report) -> String {
    let mut out = String::new();
    for case in CASES {
        let (Some(best), Some(loci)) = (
            best_peer(rep, case),
            rep.rows_of(Some(case)).find(|r| r.system == "loci"),
        ) else {
            continue;
        };
        let speed = best.median_s / loci.median_s;
        let rss =
            loci.rss_bytes.unwrap_or(0) as f64 / loci.requested_bytes.unwrap_or(1).max(1) as f64;
        out += &format!(
            "{case}: loci throughput {speed:.2}x of the best peer ({}), loci RSS {rss:.2}x of bytes requested",
            best.system
        );
        let met = if case == "buffer-passing" {
            out += " (goal: >= 1.00x throughput, <= 1.15x RSS)";
            speed >= 1.0 && rss <= 1.15
        } else {
            out += " (goal: within 1.3x of the best, i.e. >= 0.77x throughput)";
            speed >= 1.0 / 1.3
        };
        out += if met { ": met" } else { ": NOT met" };
        let cpu = |r: &Row| r.extra.get("cpu_s_median").and_then(|v| v.as_f64());
        if let (Some(b), Some(l)) = (cpu(best), cpu(loci)) {
            out += &format!(" [CPU seconds: loci {l:.2}, {} {b:.2}]", best.system);
        }
        out += "\n";
    }
    // Threads that ran on a node without memory got memory of another node: loci's rows then
    // do not measure node-local allocation, and the user should know.
    for r in rep.results.iter().filter(|r| r.system.starts_with("loci")) {
        let n = r
            .extra
            .get("loci_stats")
            .and_then(|s| s.get(MEMORYLESS_FALLBACKS))
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        if n > 0 {
            out += &format!(
                "NOTE {} {}: {n} thread heap(s) started on a node without memory and got memory of the nearest node with memory\n",
                r.system,
                r.case.as_deref().unwrap_or("")
            );
        }
    }
    for case in CASES {
        let rows: Vec<String> = rep
            .rows_of(Some(case))
            .map(|r| {
                format!(
                    "{} {:.2}",
                    r.system,
                    r.rss_bytes.unwrap_or(0) as f64 / r.requested_bytes.unwrap_or(1).max(1) as f64
                )
            })
            .collect();
        if !rows.is_empty() {
            out += &format!("{case} RSS / requested: {}\n", rows.join(", "));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The workloads (run in the child, on whatever malloc the child was given)

const GENERAL_SLOTS: usize = 1 << 18;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A size whose power-of-two class 2^lo..=2^hi is drawn with probability ~ 1/class size,
    /// uniform inside the class (2^(k-1), 2^k].
    fn size(&mut self, lo: u32, hi: u32) -> usize {
        loop {
            let x = self.next();
            let k = lo + x.trailing_zeros();
            if k <= hi {
                let top = 1usize << k;
                let half = top / 2;
                return half + 1 + (x >> 40) as usize % half;
            }
        }
    }
}

fn rss_now() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * loci_place::sys::page_size() as u64
}

fn fill_byte(size: usize) -> u8 {
    (size as u8) | 1
}

/// What one `general` thread hands back: peak live bytes, checksum, bytes allocated, and its
/// slot table (the blocks still live, freed by the caller).
type GeneralThread = (u64, u64, u64, Vec<(usize, usize)>);

fn general(threads: usize, ops: u64) -> ChildResult {
    // slot tables first, so the RSS baseline includes them
    let mut tables: Vec<Vec<(usize, usize)>> = (0..threads)
        .map(|_| vec![(0usize, 0usize); GENERAL_SLOTS])
        .collect();
    // The tables are the harness's memory, not the workload's: write every page of them now.
    // Some allocators zero a large calloc themselves and others hand out untouched zero pages;
    // left untouched, the first read of a slot inside the timed loop maps the shared zero page
    // and the first write then takes a copy-on-write fault with a TLB shootdown to every cpu,
    // which would charge the harness's page faults to whichever allocator skipped the memset.
    let per_page = loci_place::sys::page_size() / std::mem::size_of::<(usize, usize)>();
    for t in &mut tables {
        for i in (0..t.len()).step_by(per_page.max(1)) {
            // SAFETY: i < len; a volatile write cannot be elided as a store of zero to
            // calloc'ed memory.
            unsafe { std::ptr::write_volatile(t.as_mut_ptr().add(i), (0, 0)) };
        }
    }
    let base = rss_now();
    let t0 = Instant::now();
    let results: Vec<GeneralThread> = std::thread::scope(|s| {
        let hs: Vec<_> = tables
            .drain(..)
            .enumerate()
            .map(|(t, mut slots)| {
                s.spawn(move || {
                    let mut r =
                        Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1).wrapping_mul(0xdead_beef));
                    let (mut live, mut peak, mut sum, mut bytes) = (0u64, 0u64, 0u64, 0u64);
                    for _ in 0..ops {
                        let i = (r.next() % GENERAL_SLOTS as u64) as usize;
                        let (p, n) = slots[i];
                        if p == 0 {
                            let n = r.size(4, 19);
                            // SAFETY: plain malloc; checked for null below.
                            let p = unsafe { libc::malloc(n) } as *mut u8;
                            assert!(!p.is_null(), "malloc({n}) failed");
                            // SAFETY: p has n bytes.
                            unsafe { std::ptr::write_bytes(p, fill_byte(n), n) };
                            slots[i] = (p as usize, n);
                            live += n as u64;
                            bytes += n as u64;
                            peak = peak.max(live);
                        } else {
                            let q = p as *mut u8;
                            // SAFETY: live block of n bytes written above.
                            let (a, b) = unsafe { (*q, *q.add(n - 1)) };
                            assert!(a == fill_byte(n) && b == fill_byte(n), "block corrupted");
                            sum = sum.wrapping_add(a as u64 + b as u64);
                            // SAFETY: live block from malloc.
                            unsafe { libc::free(q as *mut libc::c_void) };
                            slots[i] = (0, 0);
                            live -= n as u64;
                        }
                    }
                    (peak, sum, bytes, slots)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let seconds = t0.elapsed().as_secs_f64();
    let max = max_rss_bytes();
    let mut r = ChildResult {
        seconds,
        rss_bytes: max.saturating_sub(base),
        max_rss_bytes: max,
        requested_bytes: 0,
        work: ops,
        bytes: 0,
        checksum: 0,
        loci_stats: None,
    };
    for (peak, sum, bytes, slots) in results {
        r.requested_bytes += peak;
        r.checksum = r.checksum.wrapping_add(sum);
        r.bytes += bytes;
        for (p, _) in slots {
            if p != 0 {
                // SAFETY: live block from malloc.
                unsafe { libc::free(p as *mut libc::c_void) };
            }
        }
    }
    r
}

struct Batch(Vec<(usize, usize)>);
// SAFETY: blocks are plain memory handed to the next thread, which frees them.
unsafe impl Send for Batch {}

fn buffer_passing(threads: usize, blocks: u64, batch: usize) -> ChildResult {
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
    let rounds = blocks.div_ceil(batch as u64);
    let live = AtomicI64::new(0);
    let peak = AtomicU64::new(0);
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..threads).map(|_| mpsc::sync_channel::<Batch>(1)).unzip();
    let mut rxs: Vec<Option<mpsc::Receiver<Batch>>> = rxs.into_iter().map(Some).collect();
    let base = rss_now();
    let t0 = Instant::now();
    let page = loci_place::sys::page_size();
    let totals: Vec<(u64, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let tx = txs[(t + 1) % threads].clone();
                let rx = rxs[t].take().unwrap();
                let (live, peak) = (&live, &peak);
                s.spawn(move || {
                    let mut r = Rng(0x51_7cc1_b727_220a ^ (t as u64 + 7).wrapping_mul(0x9e37_79b9));
                    let (mut bytes, mut sum) = (0u64, 0u64);
                    for _ in 0..rounds {
                        let mut out = Vec::with_capacity(batch);
                        let mut got = 0i64;
                        for _ in 0..batch {
                            // seed 003's 8 KiB..512 KiB (power-of-two classes (8K,16K] ..
                            // (256K,512K], the same 1/size law as `general`)
                            let n = r.size(14, 19);
                            // SAFETY: plain malloc; checked below.
                            let p = unsafe { libc::malloc(n) } as *mut u8;
                            assert!(!p.is_null(), "malloc({n}) failed");
                            // SAFETY: p has n bytes.
                            unsafe { std::ptr::write_bytes(p, fill_byte(n), n) };
                            out.push((p as usize, n));
                            got += n as i64;
                            bytes += n as u64;
                        }
                        let now = live.fetch_add(got, Relaxed) + got;
                        peak.fetch_max(now as u64, Relaxed);
                        tx.send(Batch(out)).unwrap();
                        let Batch(inb) = rx.recv().unwrap();
                        let mut freed = 0i64;
                        for (p, n) in inb {
                            let q = p as *const u8;
                            let mut off = 0;
                            while off < n {
                                // SAFETY: off < n, live block.
                                let v = unsafe { *q.add(off) };
                                assert_eq!(v, fill_byte(n), "block corrupted");
                                sum = sum.wrapping_add(v as u64);
                                off += page;
                            }
                            // SAFETY: live block from malloc, freed by this (other) thread.
                            unsafe { libc::free(p as *mut libc::c_void) };
                            freed += n as i64;
                        }
                        live.fetch_sub(freed, Relaxed);
                    }
                    (bytes, sum)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let seconds = t0.elapsed().as_secs_f64();
    let max = max_rss_bytes();
    ChildResult {
        seconds,
        rss_bytes: max.saturating_sub(base),
        max_rss_bytes: max,
        requested_bytes: peak.load(Relaxed),
        work: rounds * batch as u64 * threads as u64,
        bytes: totals.iter().map(|t| t.0).sum(),
        checksum: totals.iter().fold(0, |a, t| a ^ t.1),
        loci_stats: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_law_is_inverse_to_class_size() {
        let mut r = Rng(42);
        let mut counts = [0u64; 20];
        for _ in 0..200_000 {
            let n = r.size(4, 19);
            assert!((9..=1 << 19).contains(&n));
            counts[n.next_power_of_two().trailing_zeros() as usize] += 1;
        }
        // each class about half as frequent as the one below it
        for k in 5..10 {
            let ratio = counts[k] as f64 / counts[k + 1] as f64;
            assert!((1.7..2.3).contains(&ratio), "class {k}: ratio {ratio}");
        }
        for _ in 0..1000 {
            assert!((8193..=1 << 19).contains(&r.size(14, 19)));
        }
    }

    #[test]
    fn workloads_run_and_account_bytes() {
        let g = general(2, 20_000);
        assert_eq!(g.work, 20_000);
        assert!(g.requested_bytes > 0 && g.bytes >= g.requested_bytes);
        let b = buffer_passing(2, 300, 256);
        assert_eq!(b.work, 2 * 2 * 256);
        assert!(b.requested_bytes >= 8192 * 256);
    }
}
