//! A parallel loop over an index range: [`Ctx::for_each`], rayon's adaptive splitting on top of
//! [`Ctx::join`]. A range is halved only while it has split credits left; a half that another
//! worker stole gets its credits back, so the range is cut finer exactly where workers are idle
//! and runs as a plain loop everywhere else (rayon's `Splitter`, in
//! rayon/src/iter/plumbing/mod.rs, which par_iter's `for_each` uses).

use std::ops::Range;

use super::ctx::Ctx;

/// Split credits per worker a loop starts with (and a stolen half gets back). rayon starts
/// with one per thread; with one, the real-work bench left 2-4% of 2 workers idle at the loop's
/// end (`cpus busy` 1.91-1.95) waiting on the last large pieces, with four 1.99 and the same time
/// as par_iter (docs/sched.md). Still a few dozen joins per million indices.
const SPLITS_PER_WORKER: usize = 4;

impl Ctx {
    /// Calls `f(ctx, i)` once for every `i` in `range`, in parallel, and returns when all calls
    /// returned: the range is halved with [`Ctx::join`] while it has split credits (initially
    /// four per worker of the scheduler; each split halves them, and a half stolen by another
    /// worker starts again from that number), then each piece runs as a loop on the worker that
    /// holds it. Idle workers take halves by the scheduler's stealing rules (under LAS: this
    /// worker's group, then its node, never another node). `f` gets the context of the worker
    /// that runs the index. A panic in `f` is re-raised here once the other halves finished.
    pub fn for_each<F>(&self, range: Range<u64>, f: F)
    where
        F: Fn(&Ctx, u64) + Sync,
    {
        let credits = SPLITS_PER_WORKER * self.shared.layout.workers.len();
        split(self, range, credits, false, credits, &f);
    }
}

/// Runs `range` on `ctx`, split while `splits` allows (see [`Ctx::for_each`]); `stolen`: this
/// piece was taken by another worker than the one that split it off, and gets `credits` (the
/// initial credits) back.
fn split<F: Fn(&Ctx, u64) + Sync>(
    ctx: &Ctx,
    range: Range<u64>,
    mut splits: usize,
    stolen: bool,
    credits: usize,
    f: &F,
) {
    let len = range.end.saturating_sub(range.start);
    let halve = len >= 2
        && if stolen {
            splits = credits.max(splits / 2);
            true
        } else if splits > 0 {
            splits /= 2;
            true
        } else {
            false
        };
    if !halve {
        for i in range {
            f(ctx, i);
        }
        return;
    }
    let mid = range.start + len / 2;
    let me = ctx.worker();
    ctx.join(
        |c| split(c, range.start..mid, splits, false, credits, f),
        |c| split(c, mid..range.end, splits, c.worker() != me, credits, f),
    );
}
