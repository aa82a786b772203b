//! [`StreamWriter`]: a part's runs written to its destination with non-temporal stores, the
//! source prefetched ahead.

/// How far ahead of the copy [`StreamWriter`] prefetches the source, in bytes of runs: each run
/// starts a new source stream that the hardware prefetcher needs a few lines to pick up, and
/// issuing the next runs' lines early keeps the misses overlapped. The lines go to L2, not L1
/// (see [`prefetch`]), so 16 KiB ahead fits (distances and hints measured: docs/array.md,
/// Streaming stores). Regular-store copies gained nothing from it and do not.
const PREFETCH_BYTES: usize = 16384;
/// Runs queued between their prefetch and their copy (a bound on the queue when runs are tiny).
const PREFETCH_RUNS: usize = 64;
/// [`StreamWriter`] also prefetches the one line this many bytes past each run's start. Runs of a
/// box sit at a fixed stride in their chunk, so for short runs that line is the first of a run
/// several runs further on: its first touch (a new DRAM page, or under nested paging a new
/// translation) starts long before the near prefetch reaches it. For a longer run it is a line
/// of the run itself, which the hardware prefetcher fetches anyway (measured: docs/array.md).
const FAR_PREFETCH_BYTES: usize = 16384;

/// Copies a part's runs, in order, into its contiguous destination range with non-temporal
/// (streaming) stores: each whole 64-byte destination line is written exactly once and goes to
/// memory without being read first and without evicting the caches, which is what a result larger
/// than the caches wants (a regular store reads each destination line before writing it: three
/// transfers per byte instead of two). A line that several runs share is gathered in a line-sized
/// buffer (in L1) and streamed when complete, so short runs stream as well as long ones. Only the
/// first and last lines of the range, which may hold bytes of a neighbouring range (another part,
/// possibly another thread's), get regular stores of just this range's bytes. The source is
/// prefetched [`PREFETCH_BYTES`] ahead across runs, and one line [`FAR_PREFETCH_BYTES`] past
/// each run's start.
///
/// Hand-written (SSE2 intrinsics) because the runs of a subarray are short (a row of a box, often
/// 0.4-2 KB) and glibc's `memcpy` streams only single copies larger than a share of the
/// last-level cache (measured against one streaming copy per run: docs/array.md).
pub(super) struct StreamWriter {
    /// Next destination byte.
    d: *mut u8,
    /// The destination line that holds `d` when `d` is not line-aligned: its bytes `lo..d % 64`.
    line: Line,
    /// First byte of the pending line that belongs to this range (non-zero only on its first line).
    lo: usize,
    /// Runs prefetched and not yet copied (a ring): source, length, bytes prefetched.
    queue: [(*const u8, usize, usize); PREFETCH_RUNS],
    head: usize,
    queued: usize,
    ahead: usize,
}

#[repr(C, align(64))]
struct Line([u8; 64]);

impl StreamWriter {
    pub(super) fn new(d: *mut u8) -> Self {
        StreamWriter {
            d,
            line: Line([0; 64]),
            lo: d as usize % 64,
            queue: [(std::ptr::null(), 0, 0); PREFETCH_RUNS],
            head: 0,
            queued: 0,
            ahead: 0,
        }
    }

    /// Queues the next run (prefetching its first bytes) and copies the runs that are far enough
    /// behind.
    ///
    /// # Safety
    /// `p..p+n` stays readable until [`finish`](Self::finish); the next `n` bytes of the
    /// destination range are writable; source and destination do not overlap.
    pub(super) unsafe fn run(&mut self, p: *const u8, n: usize) {
        let pf = n.min(PREFETCH_BYTES);
        let mut a = p as usize & !63;
        while a < p as usize + pf {
            prefetch(a as *const u8);
            a += 64;
        }
        prefetch((p as usize).wrapping_add(FAR_PREFETCH_BYTES) as *const u8);
        self.queue[(self.head + self.queued) % PREFETCH_RUNS] = (p, n, pf);
        self.queued += 1;
        self.ahead += pf;
        while self.queued == PREFETCH_RUNS || (self.queued > 1 && self.ahead > PREFETCH_BYTES) {
            // SAFETY: the caller's contract for the queued run.
            unsafe { self.copy_oldest() };
        }
    }

    /// # Safety
    /// As [`run`](Self::run), for the oldest queued run (there is one).
    unsafe fn copy_oldest(&mut self) {
        let (p, n, pf) = self.queue[self.head];
        self.head = (self.head + 1) % PREFETCH_RUNS;
        self.queued -= 1;
        self.ahead -= pf;
        // SAFETY: the caller's contract.
        unsafe { self.write(p, n) };
    }

    /// # Safety
    /// As [`run`](Self::run).
    unsafe fn write(&mut self, mut p: *const u8, mut n: usize) {
        let fill = self.d as usize % 64;
        // SAFETY: every store below is to `d..d+n` (the caller's writable range) or to the line
        // buffer; `line` mirrors the destination line at `d - fill`.
        unsafe {
            if fill != 0 {
                let k = n.min(64 - fill);
                std::ptr::copy_nonoverlapping(p, self.line.0.as_mut_ptr().add(fill), k);
                p = p.add(k);
                n -= k;
                self.d = self.d.add(k);
                if !(self.d as usize).is_multiple_of(64) {
                    return;
                }
                let base = self.d.sub(64);
                if self.lo == 0 {
                    stream_line(self.line.0.as_ptr(), base);
                } else {
                    // The range's first line: bytes before `lo` are someone else's.
                    let lo = self.lo;
                    std::ptr::copy_nonoverlapping(
                        self.line.0.as_ptr().add(lo),
                        base.add(lo),
                        64 - lo,
                    );
                    self.lo = 0;
                }
            }
            while n >= 64 {
                stream_line(p, self.d);
                p = p.add(64);
                self.d = self.d.add(64);
                n -= 64;
            }
            std::ptr::copy_nonoverlapping(p, self.line.0.as_mut_ptr(), n);
            self.d = self.d.add(n);
        }
    }

    /// Copies the queued runs, writes the pending partial line's bytes (regular stores) and
    /// orders the streamed stores before this thread's later stores.
    ///
    /// # Safety
    /// As [`run`](Self::run), for every queued run.
    pub(super) unsafe fn finish(mut self) {
        while self.queued > 0 {
            // SAFETY: the caller's contract.
            unsafe { self.copy_oldest() };
        }
        let fill = self.d as usize % 64;
        if fill > self.lo {
            // SAFETY: bytes `lo..fill` of the line at `d - fill` are this range's (already
            // counted into `d`), and the caller's range covers them.
            unsafe {
                let base = self.d.sub(fill);
                std::ptr::copy_nonoverlapping(
                    self.line.0.as_ptr().add(self.lo),
                    base.add(self.lo),
                    fill - self.lo,
                );
            }
        }
        stream_fence();
    }
}

/// Stores the 64 bytes at `src` to the 64-byte aligned `dst` with non-temporal stores.
///
/// # Safety
/// `src..src+64` readable, `dst..dst+64` writable, `dst` 64-byte aligned.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn stream_line(src: *const u8, dst: *mut u8) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // SAFETY: the caller's ranges; the stores are 16-byte aligned (dst is 64-byte aligned); SSE2
    // is part of x86_64.
    unsafe {
        let s = src as *const __m128i;
        let d = dst as *mut __m128i;
        let (a, b, c, e) = (
            _mm_loadu_si128(s),
            _mm_loadu_si128(s.add(1)),
            _mm_loadu_si128(s.add(2)),
            _mm_loadu_si128(s.add(3)),
        );
        _mm_stream_si128(d, a);
        _mm_stream_si128(d.add(1), b);
        _mm_stream_si128(d.add(2), c);
        _mm_stream_si128(d.add(3), e);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream_line(src: *const u8, dst: *mut u8) {
    // SAFETY: the caller's ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, 64) }
}

/// Asks for the cache line holding `p` into L2 (never faults, whatever `p` is). Into L2 rather
/// than L1: a prefetch into L1 holds one of L1's few miss buffers until its line arrives, and
/// the streaming stores need those buffers too; with the T0 hint the copy of 1.2 KB rows ran at
/// half the speed (docs/array.md, Streaming stores).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint and does not fault on any address; SSE is part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T1)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Orders the streaming stores of this thread before its later stores (and so before the thread
/// signals that it is done): they are weakly ordered otherwise.
fn stream_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions (SSE, part of x86_64).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A streamed sequence of runs equals their concatenation for every destination alignment
    /// and mix of run lengths (empty, shorter than a line, crossing lines, many lines; more runs
    /// than the prefetch queue holds and more bytes than it prefetches), and writes nothing
    /// outside its range.
    #[test]
    fn stream_writer_equals_concatenated_runs_at_every_alignment() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let patterns: [&[usize]; 8] = [
            &[],
            &[0],
            &[1, 15, 16, 17, 0, 63, 64, 65],
            &[500],
            &[100; 40],
            &[7; 70],
            &[4096, 3, 5000, 129, 61, 2],
            &[9000, 8000],
        ];
        assert!(patterns.iter().any(|p| p.len() > PREFETCH_RUNS));
        assert!(patterns
            .iter()
            .any(|p| p.iter().sum::<usize>() > PREFETCH_BYTES));
        for off in 0..70 {
            for runs in patterns {
                let total: usize = runs.iter().sum();
                let mut dst = vec![0xEEu8; total + 200];
                let mut want = Vec::new();
                let mut w = StreamWriter::new(dst[off..].as_mut_ptr());
                let mut at = 11;
                for &n in runs {
                    // SAFETY: each run is a slice of `src`, the destination range `off..off+total`
                    // lies inside `dst`, and the two vectors do not overlap.
                    unsafe { w.run(src[at..].as_ptr(), n) };
                    want.extend_from_slice(&src[at..at + n]);
                    at += n + 37;
                }
                // SAFETY: as above.
                unsafe { w.finish() };
                assert_eq!(&dst[off..off + total], &want[..], "off {off} runs {runs:?}");
                assert!(
                    dst[..off].iter().all(|&b| b == 0xEE),
                    "off {off} runs {runs:?}"
                );
                assert!(
                    dst[off + total..].iter().all(|&b| b == 0xEE),
                    "off {off} runs {runs:?}"
                );
            }
        }
    }
}
