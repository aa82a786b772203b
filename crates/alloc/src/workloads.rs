//! The allocator workloads of `loci bench alloc`, written against the C `malloc`/`free` so that
//! they measure whichever allocator the process runs on (the bench runs each one in a child
//! process with the allocator's library in `LD_PRELOAD`; glibc: none).
//!
//! * `general` (seed 002): each of T threads does N operations on its own table of slots: an
//!   empty slot gets a block (allocate, then write all of it), a full slot is read (first and
//!   last byte checked) and freed. Size classes 16 B .. 512 KiB (powers of two) are drawn with
//!   probability inversely proportional to the class size, the size uniform inside the class.
//! * `buffer-passing` (seed 003): T threads in a ring; each allocates batches of 8 KiB .. 512 KiB
//!   blocks (same size law), writes them, and sends each batch to the next thread, which checks
//!   them (one word per page) and frees them: every block is freed by another thread than the
//!   one that allocated it.

use std::sync::mpsc;
use std::time::Instant;

/// The workloads [`run`] knows, by name.
pub const CASES: [&str; 2] = ["general", "buffer-passing"];

/// Slots per thread in `general`.
pub const GENERAL_SLOTS: usize = 1 << 18;

/// The shape of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub threads: usize,
    /// Operations per thread in `general`.
    pub ops: u64,
    /// Blocks each thread allocates and passes on in `buffer-passing`.
    pub blocks: u64,
    /// Blocks per message in `buffer-passing`.
    pub batch: usize,
}

/// What one run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    /// Wall time of the timed phase.
    pub seconds: f64,
    /// The process's RSS just before the timed phase (the caller subtracts it from the peak).
    pub rss_before: u64,
    /// Peak of bytes requested and not yet freed (summed over threads).
    pub requested_bytes: u64,
    /// Operations per thread (general) or blocks passed (buffer-passing).
    pub work: u64,
    /// Bytes allocated in total.
    pub bytes: u64,
    pub checksum: u64,
}

/// Runs the workload `case` (one of [`CASES`]).
pub fn run(case: &str, p: Params) -> Result<Measurement, String> {
    if p.threads == 0 || p.ops == 0 || p.blocks == 0 || p.batch == 0 {
        return Err(format!(
            "threads, ops, blocks and batch must be positive (got {p:?})"
        ));
    }
    match case {
        "general" => Ok(general(p.threads, p.ops)),
        "buffer-passing" if p.threads < 2 => {
            Err("buffer-passing needs at least 2 threads".to_string())
        }
        "buffer-passing" => Ok(buffer_passing(p.threads, p.blocks, p.batch)),
        other => Err(format!(
            "unknown case {other:?}; valid cases: {}",
            CASES.join(", ")
        )),
    }
}

/// xorshift64*: the workloads' sizes and slots (and the tests' random blocks).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A size whose power-of-two class 2^lo..=2^hi is drawn with probability ~ 1/class size,
    /// uniform inside the class (2^(k-1), 2^k].
    pub fn size(&mut self, lo: u32, hi: u32) -> usize {
        loop {
            let x = self.next_u64();
            let k = lo + x.trailing_zeros();
            if k <= hi {
                let top = 1usize << k;
                let half = top / 2;
                return half + 1 + (x >> 40) as usize % half;
            }
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as usize
    } else {
        4096
    }
}

fn rss_now() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * page_size() as u64
}

fn fill_byte(size: usize) -> u8 {
    (size as u8) | 1
}

/// `malloc(n)`, every byte written with [`fill_byte`]; panics when malloc fails.
fn malloc_filled(n: usize) -> *mut u8 {
    // SAFETY: plain malloc; checked for null below.
    let p = unsafe { libc::malloc(n) } as *mut u8;
    assert!(!p.is_null(), "malloc({n}) failed");
    // SAFETY: p has n bytes.
    unsafe { std::ptr::write_bytes(p, fill_byte(n), n) };
    p
}

/// What one `general` thread hands back: peak live bytes, checksum, bytes allocated, and its
/// slot table (the blocks still live, freed by the caller).
type GeneralThread = (u64, u64, u64, Vec<(usize, usize)>);

fn general(threads: usize, ops: u64) -> Measurement {
    // slot tables first, so the RSS baseline includes them
    let mut tables: Vec<Vec<(usize, usize)>> = (0..threads)
        .map(|_| vec![(0usize, 0usize); GENERAL_SLOTS])
        .collect();
    // The tables are the harness's memory, not the workload's: write every page of them now.
    // Some allocators zero a large calloc themselves and others hand out untouched zero pages;
    // left untouched, the first read of a slot inside the timed loop maps the shared zero page
    // and the first write then takes a copy-on-write fault with a TLB shootdown to every cpu,
    // which would charge the harness's page faults to whichever allocator skipped the memset.
    let per_page = page_size() / std::mem::size_of::<(usize, usize)>();
    for t in &mut tables {
        for i in (0..t.len()).step_by(per_page.max(1)) {
            // SAFETY: i < len; a volatile write cannot be elided as a store of zero to
            // calloc'ed memory.
            unsafe { std::ptr::write_volatile(t.as_mut_ptr().add(i), (0, 0)) };
        }
    }
    let rss_before = rss_now();
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
                        let i = (r.next_u64() % GENERAL_SLOTS as u64) as usize;
                        let (p, n) = slots[i];
                        if p == 0 {
                            let n = r.size(4, 19);
                            slots[i] = (malloc_filled(n) as usize, n);
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
    let mut m = Measurement {
        seconds: t0.elapsed().as_secs_f64(),
        rss_before,
        requested_bytes: 0,
        work: ops,
        bytes: 0,
        checksum: 0,
    };
    for (peak, sum, bytes, slots) in results {
        m.requested_bytes += peak;
        m.checksum = m.checksum.wrapping_add(sum);
        m.bytes += bytes;
        for (p, _) in slots {
            if p != 0 {
                // SAFETY: live block from malloc.
                unsafe { libc::free(p as *mut libc::c_void) };
            }
        }
    }
    m
}

struct Batch(Vec<(usize, usize)>);
// SAFETY: blocks are plain memory handed to the next thread, which frees them.
unsafe impl Send for Batch {}

fn buffer_passing(threads: usize, blocks: u64, batch: usize) -> Measurement {
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
    let rounds = blocks.div_ceil(batch as u64);
    let live = AtomicI64::new(0);
    let peak = AtomicU64::new(0);
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..threads).map(|_| mpsc::sync_channel::<Batch>(1)).unzip();
    let mut rxs: Vec<Option<mpsc::Receiver<Batch>>> = rxs.into_iter().map(Some).collect();
    let rss_before = rss_now();
    let t0 = Instant::now();
    let page = page_size();
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
                            out.push((malloc_filled(n) as usize, n));
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
                            for off in (0..n).step_by(page) {
                                // SAFETY: off < n, live block.
                                let v = unsafe { *q.add(off) };
                                assert_eq!(v, fill_byte(n), "block corrupted");
                                sum = sum.wrapping_add(v as u64);
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
    Measurement {
        seconds: t0.elapsed().as_secs_f64(),
        rss_before,
        requested_bytes: peak.load(Relaxed),
        work: rounds * batch as u64 * threads as u64,
        bytes: totals.iter().map(|t| t.0).sum(),
        checksum: totals.iter().fold(0, |a, t| a ^ t.1),
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

    const SMALL: Params = Params {
        threads: 2,
        ops: 20_000,
        blocks: 300,
        batch: 256,
    };

    #[test]
    fn workloads_run_and_account_bytes() {
        let p = SMALL;
        let g = run("general", p).unwrap();
        assert_eq!(g.work, 20_000);
        assert!(g.requested_bytes > 0 && g.bytes >= g.requested_bytes);
        assert!(g.rss_before > 0);
        let b = run("buffer-passing", p).unwrap();
        assert_eq!(b.work, 2 * 2 * 256);
        assert!(b.requested_bytes >= 8192 * 256);
    }

    #[test]
    fn bad_parameters_are_named() {
        let p = Params {
            threads: 1,
            ops: 10,
            ..SMALL
        };
        let e = run("buffer-passing", p).unwrap_err();
        assert!(e.contains("at least 2 threads"), "{e}");
        let e = run("genral", p).unwrap_err();
        assert!(
            e.contains("\"genral\"") && e.contains("general, buffer-passing"),
            "{e}"
        );
        let e = run("general", Params { ops: 0, ..p }).unwrap_err();
        assert!(e.contains("must be positive"), "{e}");
    }
}
