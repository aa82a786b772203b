//! `subarray`: copy the cells of a box into a new array.
//!
//! Only the chunks the box meets are visited. Each intersection (box ∩ chunk) becomes exactly one
//! chunk of the result (the result keeps the source's chunk boundaries, see `layout`), so the
//! destination of an intersection is one contiguous block. Intersections are cut into **parts**
//! along their first dimension longer than one cell (a part is then also contiguous in the
//! destination) and the parts are dealt to the worker threads. Inside a part the source is read as
//! its longest contiguous runs: trailing dimensions the box covers completely merge with the first
//! one it cuts, and each run is one `memcpy`.
//!
//! Here: the types and the planning and running of a call. `runs`: a part's source runs and
//! their copy; `stores`: the streaming-store writer; `placement`: where the result's memory comes
//! from and how local the reads were; `thresholds`: when to copy inline and when to stream.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use loci_topo::Topology;
use serde::{Deserialize, Serialize};

use crate::array::Array;
use crate::error::ArrayError;
use crate::layout::{Bounds, Layout, PerDim};
use crate::mem::Home;
use crate::pin::{self, run_pinned};
use crate::pool::BufferPool;
use crate::team;
use loci_place::Plan;

mod placement;
mod runs;
mod stores;
mod thresholds;

use placement::{local_access_ratio, result_memory};
use runs::{copy_part, DstPtr};
pub use thresholds::{
    default_stream_bytes, stream_bytes_for, INLINE_BYTES, INLINE_POOLED_BYTES, MIN_STREAM_BYTES,
    STREAM_BYTES, STREAM_BYTES_AUTO,
};

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
    /// instead of the plan's threads (default [`INLINE_BYTES`]; 0 always uses the plan's
    /// threads).
    pub inline_bytes: usize,
    /// Results smaller than this many bytes are copied by the calling thread and its helpers
    /// when a pooled buffer (already faulted in) serves them (default [`INLINE_POOLED_BYTES`];
    /// below `inline_bytes` they copy anyway; 0 turns this off).
    pub inline_bytes_pooled: usize,
    /// Results of at least this many bytes are written with non-temporal (streaming) stores,
    /// which skip reading each destination line first and leave the caches to the source (default
    /// [`STREAM_BYTES_AUTO`]: a quarter of the largest cache of the topology the run is given, at
    /// most four times its level 2, see [`stream_bytes_for`]; `usize::MAX` never streams).
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
    /// Bytes copied by each thread: the plan's threads in order, or for a result copied
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
    /// [`SubarrayOptions::inline_bytes`] or `inline_bytes_pooled`) rather than by the plan's
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

impl Array {
    /// `subarray(b)` on one unpinned thread (see [`subarray`] for the parallel, pinned form).
    pub fn subarray(&self, b: &[Range<usize>], topo: &Topology) -> Result<Array, ArrayError> {
        let one = pin::unpinned(topo, 1)?;
        subarray(self, b, &one, &SubarrayOptions::default(), topo).map(|(a, _)| a)
    }
}

/// Copies the box `b` of `src` into a new array, with the worker threads of `plan` (results
/// under [`SubarrayOptions::inline_bytes`] by the calling thread and the copy helpers of its node
/// that are awake, at most `plan.threads.len() - 1` of them: see [`crate::team`]).
/// The result's chunks are mapped untouched, so their pages land where the copying thread runs
/// (first touch); each result chunk's home is the node of the thread that copied its first part.
pub fn subarray(
    src: &Array,
    b: &[Range<usize>],
    plan: &Plan,
    opts: &SubarrayOptions,
    topo: &Topology,
) -> Result<(Array, RunStats), ArrayError> {
    let layout = src.layout();
    layout.check_box(b)?;
    pin::check(plan, topo)?;
    let threads = plan.threads.len();
    let out_layout = layout.sub_layout(b);
    let parts = plan_parts(layout, b, threads, opts.part_bytes);
    let (arena_len, mut out_chunks) = Array::plan_chunks(&out_layout, |_| Home::Unknown);
    let result_bytes: usize = parts.iter().map(|p| p.len()).sum::<usize>() * layout.cell_bytes();
    let (arena, pool_outcome, inline) = result_memory(
        src,
        &parts,
        &out_chunks,
        arena_len,
        plan,
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
        // what is left): waking the plan's workers and sleeping until they finish (about 19
        // us) costs more than copying it. The run reports the caller as thread 0, then each
        // helper that took part.
        let helpers = team::near_helpers(topo, threads.min(parts.len()).saturating_sub(1));
        team::share(&helpers, |t| work(t, Schedule::Dynamic))
    } else {
        run_pinned(plan, |t| work(t, opts.schedule))?
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

#[cfg(test)]
mod tests {
    use super::*;

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
