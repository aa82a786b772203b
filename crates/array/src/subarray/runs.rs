//! A part's source runs (the longest contiguous stretches of its chunk) and their copy into the
//! part's block of the result.

use std::ops::Range;

use crate::array::{Array, Chunk};
use crate::layout::PerDim;

use super::stores::StreamWriter;
use super::Part;

/// The source runs of a part inside its chunk: calls `run(src_offset_cells, run_cells)` for each
/// contiguous run, in destination order.
pub(super) fn for_each_run(
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
pub(super) struct DstPtr(pub(super) *mut u8);
// SAFETY: every part writes a disjoint range of its result chunk (parts split an intersection
// along a dimension whose outer dimensions have extent 1, so their destination ranges are
// disjoint contiguous blocks), and nothing reads the result until all threads are joined.
unsafe impl Send for DstPtr {}
// SAFETY: see above.
unsafe impl Sync for DstPtr {}

pub(super) fn copy_part(
    src: &Array,
    dst_chunks: &[(DstPtr, &[usize])],
    part: &Part,
    stream: bool,
) -> usize {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
