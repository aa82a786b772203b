//! A long multithreaded stress of loci-alloc as the global allocator of this test binary:
//! exactly `LOCI_ALLOC_STRESS_OPS` operations (by default 1e8 in release builds, 2e6 in debug
//! builds and under AddressSanitizer, `scripts/asan-alloc`) of malloc, free and realloc over 8
//! threads, sizes 1 B .. 4 MiB (most small, some medium, a few large), some requests with
//! alignments 64 .. 4096, a quarter of the frees done by another thread than the one holding
//! the block. Every block carries a pattern
//! derived from its address, size and id (all of a block up to 256 B; else its first and last
//! 32 bytes and one word per 4 KiB page), checked before every free and realloc; a realloc
//! must keep the old pattern in the part the old and the new size share. At the end every
//! block was freed exactly once, and the allocator's own counters show no block left.
//!
//! The operation count: a malloc is paid for with 2 (itself and the block's later free,
//! wherever it happens), a realloc with 1; each thread spends its share of the total exactly,
//! and the frees, mallocs and reallocs actually done are counted and summed. A short warm-up
//! run (not counted) comes first, so that std's one-time set-up of threads is not taken for a
//! leak.

use std::alloc::{alloc, dealloc, realloc, Layout};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Instant;

use loci_alloc::workloads::Rng;
use loci_alloc::LociAlloc;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

const THREADS: usize = 8;
/// Operations of the release run.
const OPS_FULL: u64 = 100_000_000;
/// Operations under AddressSanitizer (`--cfg loci_asan`; `scripts/asan-alloc` sets
/// `LOCI_ALLOC_STRESS_OPS` to the same), to keep that run short.
const OPS_ASAN: u64 = 2_000_000;
/// Operations of a debug build (`cargo test` without `--release`: unoptimized code).
const OPS_DEBUG: u64 = 2_000_000;
/// Operations of the warm-up run before the counted one.
const WARM_UP: u64 = 20_000;
/// Below this many operations the run is too short for the checks that it covered every
/// kind of operation (the threads spend the first ~16_000 filling their slots).
const COVERAGE_MIN: u64 = 1_000_000;
/// The environment variable that sets the operation count.
const OPS_VAR: &str = "LOCI_ALLOC_STRESS_OPS";
/// Slots per thread: a thread holds up to this many blocks at once (about half of them).
const SLOTS: usize = 2048;
/// The largest request, and the malloc alignment every block must have.
const MAX_SIZE: usize = 4 << 20;
const MIN_ALIGN: usize = 16;
/// Blocks up to this size carry the pattern in every byte; larger ones at their head, their
/// tail (`EDGE` bytes each) and one word per page.
const FULL_FILL: usize = 256;
const EDGE: usize = 32;
const PAGE: usize = 4096;

/// Size bands `(lo, hi, weight per 100_000)`, a size log-uniform inside its band: small class
/// blocks, larger class blocks, page spans of superblocks (8 KiB .. 512 KiB), large blocks
/// mapped on their own (above 512 KiB).
const BANDS: [(usize, usize, u32); 4] = [
    (1, FULL_FILL, 70_000),
    (FULL_FILL + 1, 8 << 10, 22_000),
    ((8 << 10) + 1, 512 << 10, 7_980),
    ((512 << 10) + 1, MAX_SIZE, 20),
];

fn band_of(size: usize) -> usize {
    BANDS.iter().position(|b| size <= b.1).unwrap()
}

/// A size log-uniform in band `b` (both ends included).
fn size_in(r: &mut Rng, b: usize) -> usize {
    let (lo, hi, _) = BANDS[b];
    let u = (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let s = (lo as f64 * ((hi + 1) as f64 / lo as f64).powf(u)) as usize;
    s.clamp(lo, hi)
}

fn random_band(r: &mut Rng) -> usize {
    let total: u32 = BANDS.iter().map(|b| b.2).sum();
    let mut x = (r.next_u64() % total as u64) as u32;
    for (i, b) in BANDS.iter().enumerate() {
        if x < b.2 {
            return i;
        }
        x -= b.2;
    }
    unreachable!()
}

/// 97% of requests with the default alignment (8 or 16), 3% with 64 .. 4096.
fn random_align(r: &mut Rng) -> usize {
    let x = r.next_u64() % 1000;
    match x {
        0..=29 => 64 << (x % 7),
        30..=514 => 8,
        _ => 16,
    }
}

/// A live block: where, its layout, and an id (thread << 48 | sequence) its pattern includes.
struct Block {
    p: *mut u8,
    layout: Layout,
    id: u64,
}
// SAFETY: a block is plain memory handed from one thread to another with its ownership.
unsafe impl Send for Block {}

fn key(p: *mut u8, size: usize, id: u64) -> u64 {
    (p as u64).rotate_left(29) ^ (size as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ id
}

/// The pattern's word number `w`; byte `o` of a block is byte `o % 8` of word `o / 8`.
#[inline]
fn word(key: u64, w: usize) -> u64 {
    let mut x = key ^ (w as u64).wrapping_mul(0xd6e8_feb8_6659_fd93);
    x ^= x >> 32;
    x = x.wrapping_mul(0xd6e8_feb8_6659_fd93);
    x ^ x >> 29
}

/// The byte ranges of a block of `size` bytes (within `limit`) that carry the pattern.
fn regions(size: usize, limit: usize, mut f: impl FnMut(usize, usize)) {
    let end = size.min(limit);
    if size <= FULL_FILL {
        f(0, end);
        return;
    }
    f(0, EDGE.min(end));
    (PAGE..size - EDGE)
        .step_by(PAGE)
        .filter(|&o| o + 8 <= end)
        .for_each(|o| f(o, o + 8));
    if size - EDGE < end {
        f(size - EDGE, end);
    }
}

fn write_pattern(p: *mut u8, size: usize, key: u64) {
    regions(size, size, |start, end| {
        let mut o = start;
        while o < end {
            if o % 8 == 0 && o + 8 <= end {
                // SAFETY: o + 8 <= size: inside the live block `p`.
                unsafe { (p.add(o) as *mut u64).write_unaligned(word(key, o / 8)) };
                o += 8;
            } else {
                // SAFETY: o < size.
                unsafe { p.add(o).write(word(key, o / 8).to_le_bytes()[o % 8]) };
                o += 1;
            }
        }
    });
}

/// Checks the pattern of a block of `size` bytes with `key` in its first `limit` bytes.
fn check_pattern(p: *mut u8, size: usize, limit: usize, key: u64) -> Result<(), usize> {
    let mut bad = None;
    regions(size, limit, |start, end| {
        if bad.is_some() {
            return;
        }
        let mut o = start;
        while o < end {
            if o % 8 == 0 && o + 8 <= end {
                // SAFETY: o + 8 <= limit <= the live block's size.
                let v = unsafe { (p.add(o) as *const u64).read_unaligned() };
                if v != word(key, o / 8) {
                    let i = (v ^ word(key, o / 8))
                        .to_le_bytes()
                        .iter()
                        .position(|&b| b != 0);
                    bad = Some(o + i.unwrap());
                    return;
                }
                o += 8;
            } else {
                // SAFETY: o < limit.
                if unsafe { p.add(o).read() } != word(key, o / 8).to_le_bytes()[o % 8] {
                    bad = Some(o);
                    return;
                }
                o += 1;
            }
        }
    });
    bad.map_or(Ok(()), Err)
}

/// What a thread did.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    mallocs: u64,
    reallocs: u64,
    frees: u64,
    /// Blocks this thread freed that another thread had allocated or reallocated last.
    foreign_frees: u64,
    /// Blocks this thread sent to another thread to free.
    sent: u64,
    aligned: u64,
    large: u64,
    /// Reallocs whose new size is in another band than the old.
    realloc_cross: u64,
    min_size: usize,
    max_size: usize,
    /// Whether the thread stopped early because another one failed.
    stopped: bool,
}

struct Worker {
    t: usize,
    rng: Rng,
    seq: u64,
    c: Counts,
}

impl Worker {
    fn fail(&self, b: &Block, what: &str, at: usize, key: u64, got: *mut u8) -> String {
        let want = word(key, at / 8).to_le_bytes()[at % 8];
        // SAFETY: `at` is inside the live block at `got`.
        let have = unsafe { got.add(at).read() };
        format!(
            "thread {}: pattern broken {what}: block of size {} (align {}, id {:#x}, \
             allocated by thread {}) at {got:?}: byte at offset {at} is {have:#04x}, expected \
             {want:#04x}",
            self.t,
            b.layout.size(),
            b.layout.align(),
            b.id,
            b.id >> 48,
        )
    }

    fn check(&self, b: &Block, what: &str) -> Result<(), String> {
        let size = b.layout.size();
        let k = key(b.p, size, b.id);
        check_pattern(b.p, size, size, k).map_err(|at| self.fail(b, what, at, k, b.p))
    }

    fn check_aligned(&self, p: *mut u8, l: Layout, what: &str) -> Result<(), String> {
        if p.is_null() {
            return Err(format!("thread {}: {what} of {l:?} returned null", self.t));
        }
        let align = l.align().max(MIN_ALIGN);
        if !(p as usize).is_multiple_of(align) {
            return Err(format!(
                "thread {}: {what} of {l:?} returned {p:?}, not aligned to {align}",
                self.t
            ));
        }
        Ok(())
    }

    fn malloc(&mut self) -> Result<Block, String> {
        let band = random_band(&mut self.rng);
        let size = size_in(&mut self.rng, band);
        let align = random_align(&mut self.rng);
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { alloc(layout) };
        self.check_aligned(p, layout, "malloc")?;
        self.seq += 1;
        let id = (self.t as u64) << 48 | self.seq;
        write_pattern(p, size, key(p, size, id));
        self.c.mallocs += 1;
        self.c.aligned += (align > MIN_ALIGN) as u64;
        self.c.large += (size > 512 << 10) as u64;
        self.c.min_size = self.c.min_size.min(size);
        self.c.max_size = self.c.max_size.max(size);
        Ok(Block { p, layout, id })
    }

    /// Reallocs `b` to a size in its own band (15 in 16) or in a random one, growing or
    /// shrinking; the contents the two sizes share must survive.
    fn realloc(&mut self, b: Block) -> Result<Block, String> {
        self.check(&b, "before realloc")?;
        let old = b.layout.size();
        let ob = band_of(old);
        let nb = if self.rng.next_u64().is_multiple_of(16) {
            random_band(&mut self.rng)
        } else {
            ob
        };
        let size = size_in(&mut self.rng, nb);
        // SAFETY: `b` is a live block of this layout; `size` is non-zero and, rounded up to
        // the alignment, far below isize::MAX.
        let p = unsafe { realloc(b.p, b.layout, size) };
        let layout = Layout::from_size_align(size, b.layout.align()).unwrap();
        self.check_aligned(p, layout, "realloc")?;
        let k = key(b.p, old, b.id);
        check_pattern(p, old, size, k).map_err(|at| {
            let what = format!("by realloc from {:?} ({old} bytes) to {size} bytes", b.p);
            self.fail(&b, &what, at, k, p)
        })?;
        self.seq += 1;
        let id = (self.t as u64) << 48 | self.seq;
        write_pattern(p, size, key(p, size, id));
        self.c.reallocs += 1;
        self.c.realloc_cross += (nb != ob) as u64;
        self.c.large += (size > 512 << 10) as u64;
        self.c.min_size = self.c.min_size.min(size);
        self.c.max_size = self.c.max_size.max(size);
        Ok(Block { p, layout, id })
    }

    fn free(&mut self, b: Block) -> Result<(), String> {
        self.check(&b, "before free")?;
        // SAFETY: a live block of this layout, owned here, freed once.
        unsafe { dealloc(b.p, b.layout) };
        self.c.frees += 1;
        self.c.foreign_frees += (b.id >> 48 != self.t as u64) as u64;
        Ok(())
    }

    fn drain(&mut self, rx: &Receiver<Block>) -> Result<(), String> {
        while let Ok(b) = rx.try_recv() {
            self.free(b)?;
        }
        Ok(())
    }

    /// Spends `budget` (see the module's doc) on random operations over the thread's slots,
    /// then frees what it holds and what the others send until they are all done.
    fn run(
        &mut self,
        mut budget: u64,
        txs: Vec<Sender<Block>>,
        rx: Receiver<Block>,
        failed: &AtomicBool,
    ) -> Result<(), String> {
        let mut slots: Vec<Option<Block>> = (0..SLOTS).map(|_| None).collect();
        let mut held = 0usize;
        let mut i = 0u64;
        // Invariant: an odd budget (one realloc still to do) leaves a block held.
        while budget > 0 {
            i += 1;
            if i.is_multiple_of(64) {
                self.drain(&rx)?;
                if failed.load(Relaxed) {
                    self.c.stopped = true;
                    break;
                }
            }
            let x = self.rng.next_u64();
            let s = (x % SLOTS as u64) as usize;
            match slots[s].take() {
                None if budget >= 2 => {
                    slots[s] = Some(self.malloc()?);
                    held += 1;
                    budget -= 2;
                }
                None => {} // only reallocs left: find a held block
                Some(b) if x >> 62 == 0 || budget % 2 == 1 && held == 1 => {
                    slots[s] = Some(self.realloc(b)?);
                    budget -= 1;
                }
                Some(b) => {
                    held -= 1;
                    if (x >> 60) & 3 == 0 {
                        let to = (self.t + 1 + (x >> 32) as usize % (THREADS - 1)) % THREADS;
                        match txs[to].send(b) {
                            Ok(()) => self.c.sent += 1,
                            // the receiver stopped (it failed): free it here
                            Err(e) => self.free(e.0)?,
                        }
                    } else {
                        self.free(b)?;
                    }
                }
            }
        }
        for b in slots.into_iter().flatten() {
            self.free(b)?;
        }
        drop(txs);
        // until every other thread has dropped its senders
        for b in rx.iter() {
            self.free(b)?;
        }
        Ok(())
    }
}

fn ops_total() -> u64 {
    let default = if cfg!(loci_asan) {
        OPS_ASAN
    } else if cfg!(debug_assertions) {
        OPS_DEBUG
    } else {
        OPS_FULL
    };
    match std::env::var(OPS_VAR) {
        Err(_) => default,
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n >= 2 * THREADS as u64 => n,
            _ => panic!(
                "{OPS_VAR}={v:?}: expected a whole number of operations, at least {} \
                 (default here {default})",
                2 * THREADS
            ),
        },
    }
}

/// Runs `ops` operations over [`THREADS`] threads: what each thread did, or the errors.
fn run_threads(ops: u64) -> Result<Vec<Counts>, String> {
    let failed = AtomicBool::new(false);
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<Block>()).unzip();
    let results: Vec<Result<Counts, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .map(|(t, rx)| {
                let txs = txs.clone();
                let failed = &failed;
                // each thread's share; every share is at least 2, so it starts with a malloc
                let budget = ops / THREADS as u64 + ((t as u64) < ops % THREADS as u64) as u64;
                sc.spawn(move || {
                    let mut w = Worker {
                        t,
                        rng: Rng(0x2545_f491_4f6c_dd1d ^ ((t as u64 + 1) * 0x9e37_79b9)),
                        seq: 0,
                        c: Counts {
                            min_size: usize::MAX,
                            ..Counts::default()
                        },
                    };
                    let r = w.run(budget, txs, rx, failed);
                    if r.is_err() {
                        failed.store(true, Relaxed);
                    }
                    r.map(|()| w.c)
                })
            })
            .collect();
        drop(txs);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let errors: Vec<String> = results.iter().filter_map(|r| r.clone().err()).collect();
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    Ok(results.into_iter().map(Result::unwrap).collect())
}

/// The threads' counts summed (sizes: the smallest and the largest; stopped: any).
fn total(counts: &[Counts]) -> Counts {
    let mut t = Counts {
        min_size: usize::MAX,
        ..Counts::default()
    };
    for c in counts {
        t.mallocs += c.mallocs;
        t.reallocs += c.reallocs;
        t.frees += c.frees;
        t.foreign_frees += c.foreign_frees;
        t.sent += c.sent;
        t.aligned += c.aligned;
        t.large += c.large;
        t.realloc_cross += c.realloc_cross;
        t.min_size = t.min_size.min(c.min_size);
        t.max_size = t.max_size.max(c.max_size);
        t.stopped |= c.stopped;
    }
    t
}

#[test]
fn stress_1e8_ops_8_threads_cross_thread_frees_reallocs_pattern_checked() {
    let ops = ops_total();
    // A short run first: the first threads and channels of the process set up a few blocks of
    // std's that stay (up to 3 blocks, ~1 KiB, in some runs), not to be counted as the run's.
    run_threads(WARM_UP).unwrap_or_else(|e| panic!("warm-up run: {e}"));
    // What the recollection bins of this thread hold is not counted as freed until drained.
    loci_alloc::task_finished();
    let before = loci_alloc::stats();
    let start = Instant::now();
    let counts = run_threads(ops).unwrap_or_else(|e| panic!("{e}"));
    let secs = start.elapsed().as_secs_f64();
    let c = total(&counts);
    drop(counts);

    // The allocator's own counters: no block of the run left, so no more live blocks than
    // before it. (Fewer is possible: a free is counted when the block's owner takes it out of
    // its recollection bin, and the harness's thread may take out blocks freed before the run
    // during it.) Nothing is printed before this snapshot (the test harness keeps captured
    // output in blocks). Each heap's counters are exact but a snapshot sums them without
    // stopping threads, and the harness's thread may hold a block of its own for a moment: a
    // difference has to last to count.
    let large = |s: &loci_alloc::AllocStats| s.nodes.iter().map(|n| n.large_blocks).sum::<u64>();
    let mut tries = 0;
    let after = loop {
        loci_alloc::task_finished();
        let after = loci_alloc::stats();
        let balanced = after.live_block_bytes <= before.live_block_bytes
            && after.allocs - before.allocs <= after.frees - before.frees
            && large(&after) <= large(&before);
        tries += 1;
        if balanced || tries == 20 {
            break after;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    eprintln!(
        "stress: {} operations in {secs:.1} s on {THREADS} threads: {} mallocs, {} reallocs \
         ({} to another size band), {} frees ({} by another thread than the allocating one, {} \
         passed on); {} with alignments above {MIN_ALIGN}, {} above 512 KiB; sizes {} .. {}",
        c.mallocs + c.reallocs + c.frees,
        c.mallocs,
        c.reallocs,
        c.realloc_cross,
        c.frees,
        c.foreign_frees,
        c.sent,
        c.aligned,
        c.large,
        c.min_size,
        c.max_size,
    );
    eprintln!(
        "stress: allocator counters over the run: {} allocs, {} frees, {} cross-thread frees, \
         live block bytes {:+}, large blocks {:+}",
        after.allocs - before.allocs,
        after.frees - before.frees,
        after.cross_thread_frees - before.cross_thread_frees,
        after.live_block_bytes - before.live_block_bytes,
        large(&after) as i64 - large(&before) as i64,
    );
    assert!(!c.stopped);
    assert_eq!(c.mallocs + c.reallocs + c.frees, ops, "operations counted");
    assert_eq!(c.frees, c.mallocs, "every block freed exactly once");
    // the run covered what it is meant to
    if ops >= COVERAGE_MIN {
        assert!(c.reallocs > ops / 20, "{} reallocs", c.reallocs);
        assert!(c.sent > ops / 20, "{} blocks passed on", c.sent);
        assert!(c.aligned > ops / 200, "{} aligned", c.aligned);
        assert!(c.large > ops / 50_000, "{} large", c.large);
        assert_eq!(c.min_size, 1);
        assert!(c.max_size > 3 << 20, "largest block {}", c.max_size);
    }
    assert!(
        after.cross_thread_frees - before.cross_thread_frees >= c.sent / 2,
        "cross-thread frees not counted: {} blocks passed on",
        c.sent
    );
    assert!(
        after.live_block_bytes <= before.live_block_bytes,
        "{} bytes of superblock blocks left live",
        after.live_block_bytes - before.live_block_bytes
    );
    assert!(
        after.allocs - before.allocs <= after.frees - before.frees,
        "{} superblock blocks allocated, {} freed",
        after.allocs - before.allocs,
        after.frees - before.frees
    );
    assert!(
        large(&after) <= large(&before),
        "{} large blocks left mapped",
        large(&after) - large(&before)
    );
}
