//! `subarray`: copy the cells of a box into a new array.
//!
//! Only the chunks the box meets are visited. Each intersection (box ∩ chunk) becomes exactly one
//! chunk of the result (the result keeps the source's chunk boundaries, see `layout`), so the
//! destination of an intersection is one contiguous block. Intersections are cut into **parts**
//! along their first dimension longer than one cell (a part is then also contiguous in the
//! destination) and the parts are dealt to the worker threads. Inside a part the source is read as
//! its longest contiguous runs: trailing dimensions the box covers completely merge with the first
//! one it cuts, and each run is one `memcpy`.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use loci_topo::{CacheKind, CpuSet, Topology};
use serde::{Deserialize, Serialize};

use crate::array::{Array, Chunk};
use crate::error::ArrayError;
use crate::layout::{Bounds, Layout, PerDim};
use crate::mem::{Home, Region};
use crate::pin::{run_pinned, Pinning};
use crate::pool::{Binding, BufferPool};
use crate::team;

/// How parts are dealt to threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Thread `t` of `T` takes parts `t*P/T .. (t+1)*P/T` (in chunk order), like OpenMP's static
    /// schedule: which thread reads which chunk is fixed, so thread placement decides locality.
    #[default]
    Static,
    /// Threads take the next part from a shared counter (morsel style).
    Dynamic,
}

/// One unit of work: a sub-box of one intersection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Source chunk id.
    pub src: usize,
    /// Result chunk id.
    pub dst: usize,
    /// The cells, in source array coordinates.
    pub cells: Bounds,
    /// Offset (in cells) of the part's first cell inside the result chunk.
    pub dst_offset: usize,
}

impl Part {
    /// Number of cells.
    pub fn len(&self) -> usize {
        self.cells.iter().map(|r| r.end - r.start).product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Options of one subarray run.
#[derive(Debug, Clone)]
pub struct SubarrayOptions {
    pub schedule: Schedule,
    /// Target bytes per part (all attributes); `None`: total / (4 x threads), clamped to
    /// 64 KiB ..= 4 MiB.
    pub part_bytes: Option<usize>,
    /// After the copy, sample source pages with `move_pages` to compute the local-access ratio.
    pub sample_locality: bool,
    /// Ask for transparent huge pages for the result.
    pub huge_pages: bool,
    /// Results smaller than this many bytes are copied by the calling thread and the copy
    /// helpers of its node ([`crate::team`]: at most threads - 1 of them, those that are awake)
    /// instead of the pinning's threads (default [`INLINE_BYTES`]; 0 always uses the pinning's
    /// threads).
    pub inline_bytes: usize,
    /// Results smaller than this many bytes are copied by the calling thread and its helpers
    /// when a pooled buffer (already faulted in) serves them (default [`INLINE_POOLED_BYTES`];
    /// below `inline_bytes` they copy anyway; 0 turns this off).
    pub inline_bytes_pooled: usize,
    /// Results of at least this many bytes are written with non-temporal (streaming) stores,
    /// which skip reading each destination line first and leave the caches to the source (default
    /// [`STREAM_BYTES_AUTO`]: a quarter of the largest cache of the topology the run is given, see
    /// [`stream_bytes_for`]; `usize::MAX` never streams).
    pub stream_bytes: usize,
    /// The result-buffer pool the result's memory comes from and goes back to when the result is
    /// dropped (default: [`BufferPool::global`]); `None` maps fresh memory for every result and
    /// unmaps it on drop. With a pool, a result whose threads' nodes are known before the copy
    /// (pinned threads, or a machine with one node) has its pages bound (`MPOL_BIND`) to the node
    /// of the thread that writes them, and reuses only pooled memory bound the same way; a result
    /// of threads of unknown node is first-touched in fresh memory and never pooled.
    pub pool: Option<Arc<BufferPool>>,
}

impl Default for SubarrayOptions {
    fn default() -> Self {
        Self {
            schedule: Schedule::Static,
            part_bytes: None,
            sample_locality: false,
            huge_pages: false,
            inline_bytes: INLINE_BYTES,
            inline_bytes_pooled: INLINE_POOLED_BYTES,
            stream_bytes: STREAM_BYTES_AUTO,
            pool: Some(BufferPool::global().clone()),
        }
    }
}

/// Where a result's memory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PoolOutcome {
    /// No pool: fresh memory, first touch.
    #[default]
    Off,
    /// A pooled buffer bound as the result wants.
    Hit,
    /// No pooled buffer served it: fresh memory bound as the result wants (pooled when dropped).
    Miss,
    /// The threads' nodes were not known before the copy: fresh memory, first touch, not pooled.
    Bypass,
    /// The result has no bytes.
    Empty,
}

/// What a run did, besides the result.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    /// Number of parts and of source chunks visited.
    pub parts: usize,
    pub chunks: usize,
    /// Bytes copied by each thread: the pinning's threads in order, or for a result copied
    /// inline the calling thread first, then each helper that took part.
    pub bytes_per_thread: Vec<usize>,
    /// For each part: the thread that copied it and the cpu it ran on when it started.
    pub part_thread: Vec<(usize, Option<u32>)>,
    /// Bytes read by a thread on the node of the page it read / bytes sampled (from `move_pages`;
    /// `None` when not sampled or nothing could be attributed).
    pub local_access_ratio: Option<f64>,
    /// Where the result's memory came from.
    pub pool: PoolOutcome,
    /// Whether the result was copied inline (by the calling thread and its helpers, under
    /// [`SubarrayOptions::inline_bytes`] or `inline_bytes_pooled`) rather than by the pinning's
    /// threads.
    pub inline: bool,
}

/// The parts of `subarray(b)` on `layout` for `threads` threads (the box must be checked).
pub fn plan_parts(
    layout: &Layout,
    b: &[Range<usize>],
    threads: usize,
    part_bytes: Option<usize>,
) -> Vec<Part> {
    let cell_bytes = layout.cell_bytes().max(1);
    let total: usize = b.iter().map(|r| r.end - r.start).product::<usize>() * cell_bytes;
    let target = part_bytes
        .unwrap_or_else(|| (total / (4 * threads.max(1))).clamp(64 << 10, 4 << 20))
        .max(1);
    let mut out = Vec::new();
    for (dst, (src, inter)) in layout.intersecting(b).into_iter().enumerate() {
        let ext: PerDim<usize> = inter.iter().map(|r| r.end - r.start).collect();
        let sd = ext.iter().position(|&e| e > 1).unwrap_or(0);
        let rows = ext[sd];
        let row_cells: usize = ext[sd + 1..].iter().product();
        let per_part = (target / (row_cells * cell_bytes).max(1)).max(1);
        let n = rows.div_ceil(per_part).max(1);
        for p in 0..n {
            let lo = p * rows / n;
            let hi = (p + 1) * rows / n;
            if lo == hi {
                continue;
            }
            let mut cells = inter.clone();
            cells[sd] = inter[sd].start + lo..inter[sd].start + hi;
            out.push(Part {
                src,
                dst,
                cells,
                dst_offset: lo * row_cells,
            });
        }
    }
    out
}

/// The source runs of a part inside its chunk: calls `run(src_offset_cells, run_cells)` for each
/// contiguous run, in destination order.
fn for_each_run(
    chunk_bounds: &[Range<usize>],
    cells: &[Range<usize>],
    mut run: impl FnMut(usize, usize),
) {
    let n = chunk_bounds.len();
    let shape: PerDim<usize> = chunk_bounds.iter().map(|r| r.end - r.start).collect();
    let ext: PerDim<usize> = cells.iter().map(|r| r.end - r.start).collect();
    if ext.contains(&0) {
        return;
    }
    let local: PerDim<usize> = cells
        .iter()
        .zip(chunk_bounds)
        .map(|(c, b)| c.start - b.start)
        .collect();
    let mut stride: PerDim<usize> = smallvec::smallvec![1usize; n];
    for d in (0..n.saturating_sub(1)).rev() {
        stride[d] = stride[d + 1] * shape[d + 1];
    }
    // k: the innermost dimension the part does not cover completely; all dimensions after it are
    // complete, so a run is ext[k] * stride[k] cells.
    let k = (0..n).rev().find(|&d| ext[d] != shape[d]);
    let Some(k) = k else {
        run(0, shape.iter().product());
        return;
    };
    let run_cells = ext[k] * stride[k];
    let base: usize = (0..=k).map(|d| local[d] * stride[d]).sum();
    let Some(j) = k.checked_sub(1) else {
        run(base, run_cells);
        return;
    };
    // Consecutive runs step along dimension j = k-1, `stride[j]` cells apart: a tight loop over
    // them, and an odometer over dimensions 0..j between rows of runs. (One odometer step per
    // run cost about as many instructions as copying a 120-byte run.)
    let (count, step) = (ext[j], stride[j]);
    let mut idx: PerDim<usize> = smallvec::smallvec![0usize; j];
    let mut off = base;
    loop {
        let mut o = off;
        for _ in 0..count {
            run(o, run_cells);
            o += step;
        }
        let mut d = j;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            off += stride[d];
            if idx[d] < ext[d] {
                break;
            }
            off -= ext[d] * stride[d];
            idx[d] = 0;
        }
    }
}

/// One past the last cell (in the chunk's C order) that the runs of `cells` touch: the source
/// slice a part reads must be at least this long.
fn runs_end(chunk_bounds: &[Range<usize>], cells: &[Range<usize>]) -> usize {
    if cells.iter().any(|c| c.is_empty()) {
        return 0;
    }
    let mut end = 0;
    let mut stride = 1;
    for (c, b) in cells.iter().zip(chunk_bounds).rev() {
        end += (c.end - 1 - b.start) * stride;
        stride *= b.end - b.start;
    }
    end + 1
}

/// A raw destination pointer that may cross threads.
#[derive(Clone, Copy)]
struct DstPtr(*mut u8);
// SAFETY: every part writes a disjoint range of its result chunk (parts split an intersection
// along a dimension whose outer dimensions have extent 1, so their destination ranges are
// disjoint contiguous blocks), and nothing reads the result until all threads are joined.
unsafe impl Send for DstPtr {}
// SAFETY: see above.
unsafe impl Sync for DstPtr {}

/// How far ahead of the copy [`StreamWriter`] prefetches the source, in bytes of runs.
///
/// Measured on the 2-core development machine (107 MB result of 1.2 KB runs, streamed, median of
/// 10 alternating queries): no prefetch 11.3 ms, 1 KiB ahead 8.7, 2 KiB 8.4, 4 KiB 8.5, 8 KiB
/// 8.6, 16 KiB 8.3. Each run starts a new source stream that the hardware prefetcher needs a few
/// lines to pick up; issuing the next runs' lines early keeps the misses overlapped. Results
/// copied with regular stores gained nothing from it (their destination reads dominate), so they
/// do not prefetch.
const PREFETCH_BYTES: usize = 4096;
/// Runs queued between their prefetch and their copy (a bound on the queue when runs are tiny).
const PREFETCH_RUNS: usize = 16;
/// [`StreamWriter`] also prefetches the one line this many bytes past each run's start. Runs of a
/// box sit at a fixed stride in their chunk, so for short runs that line is the first of a run
/// several runs further on (8 rows of 2 KiB ahead here): its first touch (a new DRAM page, and
/// under a hypervisor's nested paging a new translation every two such rows) starts long before
/// the near prefetch above reaches it. For a run longer than this it is a line of the run itself,
/// which the hardware prefetcher fetches anyway.
///
/// Measured on 2026-11-25 (2-core development machine, 512 MiB volume, `subarray_micro`, 11
/// calls per distance alternated call by call with a one-thread memcpy, two processes per case;
/// time without -> with this line at 16 KiB): 1000 chunks, box over all, s0.2 (408 B runs)
/// 20.9 / 20.6 -> 19.1 / 18.2 ms; s0.7 (1432 B runs) 33.1 / 33.7 -> 31.3 / 32.0 ms; box over a
/// fifth, s0.2: 2.72 / 1.90 -> 1.89 / 1.60 ms; 100 chunks, all, s0.2: 14.4 / 13.8 -> 13.9 / 13.1
/// ms; 10 chunks, a fifth, s0.2: 2.77 / 2.55 -> 2.52 / 2.30 ms. 8 KiB and 32 KiB gave about the
/// same; no case was slower.
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
/// last-level cache. Measured against one streaming `memcpy`-like copy per run (whole lines of
/// each run streamed, its partial end lines stored regularly), same machine, 2 threads: 107 MB of
/// 1.2 KB runs 11.3 -> 8.5 ms, 376 MB of 1.2 KB runs 20.7 -> 19.0 ms.
struct StreamWriter {
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
    fn new(d: *mut u8) -> Self {
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
    unsafe fn run(&mut self, p: *const u8, n: usize) {
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
    unsafe fn finish(mut self) {
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

/// Asks for the cache line holding `p` (never faults, whatever `p` is).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint and does not fault on any address; SSE is part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
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

fn copy_part(src: &Array, dst_chunks: &[(DstPtr, &[usize])], part: &Part, stream: bool) -> usize {
    let layout = src.layout();
    let chunk: &Chunk = &src.chunks()[part.src];
    let (dptr, doff) = &dst_chunks[part.dst];
    let mut bytes = 0;
    // The same cells for every attribute: how far their runs reach, and how many there are.
    let (end_cell, cells) = (runs_end(&chunk.bounds, &part.cells), part.len());
    for (a, attr) in layout.attrs.iter().enumerate() {
        let sz = attr.dtype.size();
        let s = src.attr_bytes(part.src, a);
        // SAFETY: `doff[a]` is the attribute's offset inside the result chunk's region, which is
        // big enough for all its cells; the part's cells start at `dst_offset` (see DstPtr).
        let mut d = unsafe { dptr.0.add(doff[a] + part.dst_offset * sz) };
        let end = end_cell * sz;
        assert!(
            end <= s.len(),
            "part reads {end} bytes of a {}-byte chunk",
            s.len()
        );
        let from = s.as_ptr();
        // Both loops: every run lies inside `0..end` of `s` (checked above), which outlives
        // this call; the runs of a part fill its disjoint destination block in order, so
        // `d..d+len` is inside it; no overlap between the source and a result buffer.
        if stream {
            let mut w = StreamWriter::new(d);
            for_each_run(&chunk.bounds, &part.cells, |off, n| {
                // SAFETY: see above.
                unsafe { w.run(from.add(off * sz), n * sz) };
            });
            // SAFETY: the queued runs are slices of `s`, still borrowed here.
            unsafe { w.finish() };
        } else {
            for_each_run(&chunk.bounds, &part.cells, |off, n| {
                // SAFETY: see above.
                unsafe {
                    std::ptr::copy_nonoverlapping(from.add(off * sz), d, n * sz);
                    d = d.add(n * sz);
                }
            });
        }
        bytes += cells * sz;
    }
    bytes
}

impl Array {
    /// `subarray(b)` on one unpinned thread (see [`subarray`] for the parallel, pinned form).
    pub fn subarray(&self, b: &[Range<usize>], topo: &Topology) -> Result<Array, ArrayError> {
        subarray(
            self,
            b,
            &Pinning::unpinned(1),
            &SubarrayOptions::default(),
            topo,
        )
        .map(|(a, _)| a)
    }
}

/// Default of [`SubarrayOptions::inline_bytes`]: results smaller than this are copied by the
/// calling thread and its helpers (see [`subarray`]).
pub const INLINE_BYTES: usize = 1 << 20;

/// Default of [`SubarrayOptions::inline_bytes_pooled`]. Into pooled memory (no page faults)
/// handing parts to the pinning's workers costs about 19 us a call (a broadcast to the persistent
/// workers of [`run_pinned`]: they are woken and the caller sleeps until they are done), against
/// a few hundred nanoseconds for the calling thread's spinning helpers ([`crate::team`]). Up to
/// here a result is too small for its placement to matter more than that. Measured with
/// `subarray_micro` before the helpers existed (the caller copying alone against the workers):
/// 1.05 MB 54-65 us against 75-110 us, 2.6 MB 298-391 against 205-246, 3.67 MB 341 against 225.
/// With the helpers (medians of alternated calls): 0.10 MB 3.2-3.5 us (4.4 alone), 0.37 MB 8.0 us
/// (15.8 alone), 1.05 MB 25 us (37 alone), and 3.67 MB 143 us against 219 us on the workers.
pub const INLINE_POOLED_BYTES: usize = 2 << 20;

/// The streaming threshold where the topology reports no cache (or no cache size), for example
/// [`Topology::flat`] or a source without cache data: 8 MiB, a quarter of the 32 MiB L3 of the
/// development machine the threshold was measured on (see [`stream_bytes_for`]).
pub const STREAM_BYTES: usize = 8 << 20;

/// The smallest threshold [`stream_bytes_for`] gives, however small the cache.
pub const MIN_STREAM_BYTES: usize = 64 << 10;

/// The default of [`SubarrayOptions::stream_bytes`]: not a byte count but "a quarter of the largest
/// cache of the topology given to [`subarray`]" ([`stream_bytes_for`]), resolved per call by
/// [`SubarrayOptions::stream_bytes_on`]. No real threshold is lost to it: a result of
/// `usize::MAX - 1` bytes cannot exist, so it would never stream either way.
pub const STREAM_BYTES_AUTO: usize = usize::MAX - 1;

/// Default of [`SubarrayOptions::stream_bytes`]: [`STREAM_BYTES_AUTO`] (a quarter of the largest
/// cache of the topology each [`subarray`] call is given, see [`stream_bytes_for`]).
pub const fn default_stream_bytes() -> usize {
    STREAM_BYTES_AUTO
}

/// The streaming threshold for `topo`: a quarter of the largest data or unified cache that holds
/// the topology's first cpu (cpu 0 on a live machine, the cache the threshold was measured
/// against), at least [`MIN_STREAM_BYTES`]; [`STREAM_BYTES`] when the topology reports no such
/// cache or no size for it. The cache also holds the source lines being read and the previous
/// results of a query stream (the pool hands back recently written buffers), so a result of a
/// quarter of the cache already pushes its own lines out before anyone reads them: they are
/// better written straight to memory. A smaller result is better left in the cache. Measured on
/// the development machine (32 MiB L3, pooled result memory, 2 threads, streamed and regular
/// queries alternating in one process, medians of 60, quiet machine, `StreamWriter`): 3.7 MB
/// 0.18 ms streamed against 0.12 ms regular; 5.4 MB 0.74 against 0.98; 8.3 MB 0.37 against 0.36;
/// 10.7 MB 0.96 against 1.14; 22 MB 3.5 against 4.2; 107 MB 8.5 against 8.8-11; 376 MB 19.0
/// against 27.
pub fn stream_bytes_for(topo: &Topology) -> usize {
    let Some(first) = topo.cpus.first().map(|c| c.id) else {
        return STREAM_BYTES;
    };
    topo.caches
        .iter()
        .filter(|c| c.kind != CacheKind::Instruction && c.cpus.contains(first))
        .map(|c| usize::try_from(c.size_bytes).unwrap_or(usize::MAX))
        .max()
        .filter(|&b| b > 0)
        .map_or(STREAM_BYTES, |b| (b / 4).max(MIN_STREAM_BYTES))
}

impl SubarrayOptions {
    /// The streaming threshold of a run on `topo`: [`Self::stream_bytes`], or with
    /// [`STREAM_BYTES_AUTO`] the one [`stream_bytes_for`] derives from `topo`'s caches.
    pub fn stream_bytes_on(&self, topo: &Topology) -> usize {
        if self.stream_bytes == STREAM_BYTES_AUTO {
            stream_bytes_for(topo)
        } else {
            self.stream_bytes
        }
    }

    /// Whether a result of `bytes` bytes on `topo` is written with streaming stores.
    fn streams(&self, bytes: usize, topo: &Topology) -> bool {
        // Below the smallest automatic threshold the topology's caches need not be looked at.
        if self.stream_bytes == STREAM_BYTES_AUTO && bytes < MIN_STREAM_BYTES {
            return false;
        }
        bytes >= self.stream_bytes_on(topo)
    }
}

/// Copies the box `b` of `src` into a new array, with the worker threads of `pinning` (results
/// under [`SubarrayOptions::inline_bytes`] by the calling thread and the copy helpers of its node
/// that are awake, at most `pinning.len() - 1` of them: see [`crate::team`]).
/// The result's chunks are mapped untouched, so their pages land where the copying thread runs
/// (first touch); each result chunk's home is the node of the thread that copied its first part.
pub fn subarray(
    src: &Array,
    b: &[Range<usize>],
    pinning: &Pinning,
    opts: &SubarrayOptions,
    topo: &Topology,
) -> Result<(Array, RunStats), ArrayError> {
    let layout = src.layout();
    layout.check_box(b)?;
    pinning.check(topo)?;
    let threads = pinning.len();
    let out_layout = layout.sub_layout(b);
    let parts = plan_parts(layout, b, threads, opts.part_bytes);
    let (arena_len, mut out_chunks) = Array::plan_chunks(&out_layout, |_| Home::Unknown);
    let result_bytes: usize = parts.iter().map(|p| p.len()).sum::<usize>() * layout.cell_bytes();
    let (arena, pool_outcome, inline) = result_memory(
        src,
        &parts,
        &out_chunks,
        arena_len,
        pinning,
        opts,
        result_bytes,
        topo,
    )?;
    if let Some(binding) = arena.binding() {
        // Bound pages: each chunk's home is the node its first page is bound to.
        for c in &mut out_chunks {
            if let Some(n) = binding.node_at(c.offset) {
                c.home = Home::Node(n);
            }
        }
    }
    let dst: Vec<(DstPtr, &[usize])> = out_chunks
        .iter()
        // SAFETY: the chunk's offset is inside the arena (map_chunks sized it).
        .map(|c| {
            (
                DstPtr(unsafe { arena.as_mut_ptr().add(c.offset) }),
                &c.attr_off[..],
            )
        })
        .collect();
    let next = AtomicUsize::new(0);
    let parts_ref = &parts;
    let dst_ref = &dst;
    let stream = opts.streams(result_bytes, topo);
    // Thread `t`'s parts under `schedule`: the bytes it copied, and each part with the cpu it
    // started on.
    let work = |t: usize, schedule: Schedule| {
        let mut done: Vec<(usize, Option<u32>)> = Vec::new();
        let mut bytes = 0;
        let mut one = |i: usize| {
            let cpu = loci_place::sys::current_cpu().ok();
            bytes += copy_part(src, dst_ref, &parts_ref[i], stream);
            done.push((i, cpu));
        };
        match schedule {
            Schedule::Static => {
                let n = parts_ref.len();
                for i in t * n / threads..(t + 1) * n / threads {
                    one(i);
                }
            }
            Schedule::Dynamic => loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= parts_ref.len() {
                    break;
                }
                one(i);
            },
        }
        (bytes, done)
    };
    let per_thread = if inline {
        // A small result is copied by the calling thread and its node's spinning helpers, which
        // take parts from the counter (the dynamic schedule: however many arrive, whenever, share
        // what is left): waking the pinning's workers and sleeping until they finish (about 19
        // us) costs more than copying it. The run reports the caller as thread 0, then each
        // helper that took part.
        let helpers = team::near_helpers(topo, threads.min(parts.len()).saturating_sub(1));
        team::share(&helpers, |t| work(t, Schedule::Dynamic))
    } else {
        run_pinned(pinning, |t| work(t, opts.schedule))?
    };
    let mut stats = RunStats {
        parts: parts.len(),
        chunks: out_chunks.len(),
        bytes_per_thread: per_thread.iter().map(|(b, _)| *b).collect(),
        part_thread: vec![(0, None); parts.len()],
        local_access_ratio: None,
        pool: pool_outcome,
        inline,
    };
    for (t, (_, done)) in per_thread.into_iter().enumerate() {
        for (i, cpu) in done {
            stats.part_thread[i] = (t, cpu);
        }
    }
    // Home of each result chunk not bound above: the node of the thread that wrote its first part.
    for (i, p) in parts.iter().enumerate() {
        if out_chunks[p.dst].home == Home::Unknown {
            if let Some(n) = stats.part_thread[i].1.and_then(|c| topo.node_of_cpu(c)) {
                out_chunks[p.dst].home = Home::Node(n);
            }
        }
    }
    if opts.sample_locality {
        stats.local_access_ratio = local_access_ratio(src, &parts, &stats.part_thread, topo)?;
    }
    Ok((Array::from_parts(out_layout, arena, out_chunks), stats))
}

/// The node of a thread whose cpus are `cpus`, when they all sit on one node that has memory
/// this process may use.
fn node_of(cpus: &CpuSet, topo: &Topology) -> Option<u32> {
    let mut nodes = cpus.iter().map(|c| topo.node_of_cpu(c));
    let first = nodes.next()??;
    (nodes.all(|n| n == Some(first)) && has_usable_memory(first, topo)).then_some(first)
}

/// Whether this process may allocate on node `n` (as [`Topology::allowed_mems`] says, without
/// building the set: this runs on every subarray call).
fn has_usable_memory(n: u32, topo: &Topology) -> bool {
    topo.node(n)
        .is_some_and(|x| x.allowed && x.memory_bytes != Some(0))
}

/// The node that will write each part, when every one is known before the copy: the calling
/// thread's node for an inline copy; for the pinning's threads, the node of the thread the static
/// schedule gives the part, or under the dynamic schedule the one node all threads share. An
/// unpinned thread's node is known when every cpu this process may use is on one node.
fn planned_part_nodes(
    parts: &[Part],
    pinning: &Pinning,
    schedule: Schedule,
    inline: bool,
    topo: &Topology,
) -> Option<Vec<u32>> {
    if inline {
        let cpu = loci_place::sys::current_cpu().ok()?;
        let n = topo
            .node_of_cpu(cpu)
            .filter(|&n| has_usable_memory(n, topo))?;
        return Some(vec![n; parts.len()]);
    }
    let anywhere = topo.allowed_cpus();
    let thread_nodes: Vec<u32> = pinning
        .threads
        .iter()
        .map(|t| node_of(t.as_ref().unwrap_or(&anywhere), topo))
        .collect::<Option<_>>()?;
    let threads = thread_nodes.len();
    match schedule {
        Schedule::Static => {
            let n = parts.len();
            let mut out = Vec::with_capacity(n);
            for (t, &node) in thread_nodes.iter().enumerate() {
                out.extend(std::iter::repeat_n(
                    node,
                    (t + 1) * n / threads - t * n / threads,
                ));
            }
            Some(out)
        }
        Schedule::Dynamic => {
            let first = thread_nodes[0];
            thread_nodes
                .iter()
                .all(|&n| n == first)
                .then(|| vec![first; parts.len()])
        }
    }
}

/// The binding a result wants over `mapped` bytes of its arena: every page on the node of the
/// part that writes the page's first byte (a page shared by two parts goes to the one that starts
/// on it earlier, the way first touch would give it to either).
fn wanted_binding(
    src: &Array,
    parts: &[Part],
    nodes: &[u32],
    out_chunks: &[Chunk],
    mapped: usize,
) -> Binding {
    if let Some(&first) = nodes.first() {
        if nodes.iter().all(|&n| n == first) {
            return Binding::node(mapped, first);
        }
    }
    let ps = loci_place::sys::page_size();
    let layout = src.layout();
    let mut starts = Vec::with_capacity(parts.len() * layout.attrs.len());
    for (p, &n) in parts.iter().zip(nodes) {
        let c = &out_chunks[p.dst];
        for (a, attr) in layout.attrs.iter().enumerate() {
            let sz = attr.dtype.size();
            let from = c.offset + c.attr_off[a] + p.dst_offset * sz;
            let to = from + p.len() * sz;
            let page = from.next_multiple_of(ps);
            if page < to {
                starts.push((page, n));
            }
        }
    }
    Binding::from_starts(starts, mapped)
}

/// The result's arena, and whether the calling thread copies (inline): from the pool when one is
/// given and the writers' nodes are planned (bound to them), else a fresh first-touch mapping.
/// A result under `inline_bytes` is copied inline; one under `inline_bytes_pooled` too when a
/// pooled buffer bound for the calling thread serves it.
#[allow(clippy::too_many_arguments)]
fn result_memory(
    src: &Array,
    parts: &[Part],
    out_chunks: &[Chunk],
    len: usize,
    pinning: &Pinning,
    opts: &SubarrayOptions,
    result_bytes: usize,
    topo: &Topology,
) -> Result<(Region, PoolOutcome, bool), ArrayError> {
    let inline = result_bytes < opts.inline_bytes;
    if len == 0 {
        return Ok((Region::map(0, false)?, PoolOutcome::Empty, inline));
    }
    let Some(pool) = &opts.pool else {
        return Ok((Region::map(len, opts.huge_pages)?, PoolOutcome::Off, inline));
    };
    if !inline && result_bytes < opts.inline_bytes_pooled {
        if let Some(nodes) = planned_part_nodes(parts, pinning, opts.schedule, true, topo) {
            let want = wanted_binding(src, parts, &nodes, out_chunks, len);
            if let Some(p) = pool.take(&want, false) {
                let r = Region::from_pooled(p, len, pool.clone());
                return Ok((r, PoolOutcome::Hit, true));
            }
        }
    }
    let Some(nodes) = planned_part_nodes(parts, pinning, opts.schedule, inline, topo) else {
        pool.count_bypass();
        return Ok((
            Region::map(len, opts.huge_pages)?,
            PoolOutcome::Bypass,
            inline,
        ));
    };
    if let Some(p) = pool.take(&wanted_binding(src, parts, &nodes, out_chunks, len), true) {
        let r = Region::from_pooled(p, len, pool.clone());
        return Ok((r, PoolOutcome::Hit, inline));
    }
    let mut r = Region::map(len, opts.huge_pages)?;
    let binding = wanted_binding(src, parts, &nodes, out_chunks, r.mapped());
    r.bind_for_pool(binding, pool.clone())?;
    Ok((r, PoolOutcome::Miss, inline))
}

/// Local-access ratio of a finished run: for every part, up to 4 pages of its source runs are
/// looked up with `move_pages`; a part's bytes count as local in the proportion of its sampled
/// pages that sit on the node of the cpu its thread ran on.
fn local_access_ratio(
    src: &Array,
    parts: &[Part],
    part_thread: &[(usize, Option<u32>)],
    topo: &Topology,
) -> Result<Option<f64>, ArrayError> {
    let layout = src.layout();
    let cell = layout.cell_bytes();
    let mut local = 0.0;
    let mut total = 0.0;
    for (p, &(_, cpu)) in parts.iter().zip(part_thread) {
        let Some(node) = cpu.and_then(|c| topo.node_of_cpu(c)) else {
            continue;
        };
        let chunk = &src.chunks()[p.src];
        let sz0 = layout.attrs[0].dtype.size();
        let mut offs = Vec::new();
        for_each_run(&chunk.bounds, &p.cells, |off, n| {
            offs.push(chunk.offset + chunk.attr_off[0] + off * sz0);
            offs.push(chunk.offset + chunk.attr_off[0] + (off + n - 1) * sz0);
        });
        let k = offs.len();
        let pick: Vec<usize> = if k <= 4 {
            offs
        } else {
            (0..4).map(|i| offs[i * (k - 1) / 3]).collect()
        };
        let nodes = src.arena().nodes_at(&pick)?;
        let known: Vec<i32> = nodes.into_iter().filter(|&n| n >= 0).collect();
        if known.is_empty() {
            continue;
        }
        let frac = known.iter().filter(|&&n| n as u32 == node).count() as f64 / known.len() as f64;
        let bytes = (p.len() * cell) as f64;
        local += frac * bytes;
        total += bytes;
    }
    Ok((total > 0.0).then(|| local / total))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streaming threshold comes from the topology's caches: a quarter of the largest data or
    /// unified cache of the first cpu, at least 64 KiB, 8 MiB with no cache; an explicit
    /// threshold is kept as given.
    #[test]
    fn stream_threshold_follows_the_topology_caches() {
        let cpus = CpuSet::parse("0-3").unwrap();
        let mut topo = Topology::flat(cpus.clone(), "test");
        assert_eq!(stream_bytes_for(&topo), STREAM_BYTES);
        let cache = |level, kind, size_bytes, cpus: &str| loci_topo::Cache {
            level,
            kind,
            size_bytes,
            cpus: CpuSet::parse(cpus).unwrap(),
        };
        // No size known: the fallback.
        topo.caches.push(cache(3, CacheKind::Unified, 0, "0-3"));
        assert_eq!(stream_bytes_for(&topo), STREAM_BYTES);
        topo.caches.push(cache(1, CacheKind::Data, 48 << 10, "0"));
        assert_eq!(stream_bytes_for(&topo), MIN_STREAM_BYTES);
        topo.caches.push(cache(2, CacheKind::Unified, 2 << 20, "0"));
        assert_eq!(stream_bytes_for(&topo), 512 << 10);
        // Instruction caches and caches of other cpus do not count.
        topo.caches
            .push(cache(1, CacheKind::Instruction, 64 << 20, "0"));
        topo.caches
            .push(cache(3, CacheKind::Unified, 64 << 20, "2-3"));
        assert_eq!(stream_bytes_for(&topo), 512 << 10);
        topo.caches
            .push(cache(3, CacheKind::Unified, 32 << 20, "0-1"));
        assert_eq!(stream_bytes_for(&topo), 8 << 20);

        let auto = SubarrayOptions::default();
        assert_eq!(auto.stream_bytes, STREAM_BYTES_AUTO);
        assert_eq!(auto.stream_bytes_on(&topo), 8 << 20);
        assert!(!auto.streams((8 << 20) - 1, &topo) && auto.streams(8 << 20, &topo));
        assert!(!auto.streams(MIN_STREAM_BYTES - 1, &Topology::flat(cpus, "t")));
        for fixed in [0, 1 << 20, usize::MAX] {
            let o = SubarrayOptions {
                stream_bytes: fixed,
                ..SubarrayOptions::default()
            };
            assert_eq!(o.stream_bytes_on(&topo), fixed);
        }
        assert!(SubarrayOptions {
            stream_bytes: 0,
            ..SubarrayOptions::default()
        }
        .streams(1, &topo));
    }

    #[test]
    fn runs_merge_complete_trailing_dimensions() {
        let chunk = vec![0..4, 0..5, 0..6];
        let mut runs = Vec::new();
        for_each_run(&chunk, &[1..3, 0..5, 0..6], |o, n| runs.push((o, n)));
        assert_eq!(runs, vec![(30, 60)]);
        runs.clear();
        for_each_run(&chunk, &[1..3, 2..4, 0..6], |o, n| runs.push((o, n)));
        assert_eq!(runs, vec![(42, 12), (72, 12)]);
        runs.clear();
        for_each_run(&chunk, &[0..4, 0..5, 0..6], |o, n| runs.push((o, n)));
        assert_eq!(runs, vec![(0, 120)]);
        runs.clear();
        for_each_run(&chunk, &[3..4, 4..5, 2..3], |o, n| runs.push((o, n)));
        assert_eq!(runs, vec![(3 * 30 + 4 * 6 + 2, 1)]);
        runs.clear();
        for_each_run(&chunk, &[0..0, 0..5, 0..6], |o, n| runs.push((o, n)));
        assert!(runs.is_empty());
    }

    /// `runs_end` is one past the furthest cell any run touches, for boxes of every shape
    /// (checked against the runs themselves on a 4-D chunk).
    #[test]
    fn runs_end_bounds_every_run() {
        let chunk = vec![2..6, 0..3, 1..5, 0..7];
        let mut seed = 7u64;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n
        };
        for _ in 0..2000 {
            let cells: Vec<Range<usize>> = chunk
                .iter()
                .map(|b| {
                    let len = b.end - b.start;
                    let lo = b.start + next(len + 1);
                    let hi = lo + next(b.end - lo + 1);
                    lo..hi
                })
                .collect();
            let mut furthest = 0;
            let mut cells_seen = 0;
            for_each_run(&chunk, &cells, |o, n| {
                furthest = furthest.max(o + n);
                cells_seen += n;
            });
            assert_eq!(runs_end(&chunk, &cells), furthest, "{cells:?}");
            let want: usize = cells.iter().map(|c| c.end - c.start).product();
            assert_eq!(cells_seen, want, "{cells:?}");
        }
    }

    /// A streamed sequence of runs equals their concatenation for every destination alignment
    /// and mix of run lengths (empty, shorter than a line, crossing lines, many lines; more runs
    /// than the prefetch queue holds and more bytes than it prefetches), and writes nothing
    /// outside its range.
    #[test]
    fn stream_writer_equals_concatenated_runs_at_every_alignment() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let patterns: [&[usize]; 7] = [
            &[],
            &[0],
            &[1, 15, 16, 17, 0, 63, 64, 65],
            &[500],
            &[100; 40],
            &[7; 70],
            &[4096, 3, 5000, 129, 61, 2],
        ];
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

    /// With parts written on different nodes, every page is bound to the node of the part that
    /// writes its first byte, for every attribute; with one node the binding is one segment.
    #[test]
    fn wanted_binding_follows_the_writer_of_each_page() {
        let topo = Topology::flat(loci_place::sys::get_affinity(0).unwrap(), "test");
        let l = Layout::new(
            vec![crate::Dim::new("a", 300), crate::Dim::new("b", 40)],
            vec![
                crate::Attr::new("v", crate::DType::F64),
                crate::Attr::new("w", crate::DType::U16),
            ],
            &crate::Chunking::Shape(vec![100, 40]),
        )
        .unwrap();
        let src = Array::from_fn(l, &topo, |_, c| c[0] as f64).unwrap();
        let b = vec![10..290, 0..40];
        let parts = plan_parts(src.layout(), &b, 4, Some(3000));
        assert!(parts.len() > 8);
        let nodes: Vec<u32> = (0..parts.len()).map(|i| (i % 3) as u32).collect();
        let out = src.layout().sub_layout(&b);
        let (len, chunks) = Array::plan_chunks(&out, |_| Home::Unknown);
        let bind = wanted_binding(&src, &parts, &nodes, &chunks, len);
        assert_eq!(bind.len(), len);
        let ps = loci_place::sys::page_size();
        let mut checked = 0;
        for (p, &n) in parts.iter().zip(&nodes) {
            let c = &chunks[p.dst];
            for (a, sz) in [(0, 8), (1, 2)] {
                let from = c.offset + c.attr_off[a] + p.dst_offset * sz;
                let to = from + p.len() * sz;
                let mut page = from.next_multiple_of(ps);
                while page < to {
                    assert_eq!(bind.node_at(page), Some(n), "page {page} of part {p:?}");
                    page += ps;
                    checked += 1;
                }
            }
        }
        assert!(checked > 10);
        let one = wanted_binding(&src, &parts, &vec![2; parts.len()], &chunks, len + ps);
        assert_eq!(one.segments(), &[(0..len + ps, 2)]);
    }

    #[test]
    fn parts_tile_the_box_and_their_destinations() {
        let l = Layout::new(
            vec![crate::Dim::new("a", 37), crate::Dim::new("b", 11)],
            vec![crate::Attr::new("v", crate::DType::F64)],
            &crate::Chunking::Shape(vec![10, 4]),
        )
        .unwrap();
        let b = vec![3..30, 1..10];
        let parts = plan_parts(&l, &b, 3, Some(64));
        let total: usize = parts.iter().map(|p| p.len()).sum();
        assert_eq!(total, 27 * 9);
        let sub = l.sub_layout(&b);
        for dst in 0..sub.chunk_count() {
            let mut ranges: Vec<(usize, usize)> = parts
                .iter()
                .filter(|p| p.dst == dst)
                .map(|p| (p.dst_offset, p.dst_offset + p.len()))
                .collect();
            ranges.sort();
            let cells: usize = sub.chunk_box(dst).iter().map(|r| r.end - r.start).product();
            let mut at = 0;
            for (lo, hi) in ranges {
                assert_eq!(lo, at, "gap or overlap in result chunk {dst}");
                at = hi;
            }
            assert_eq!(at, cells);
        }
    }
}
