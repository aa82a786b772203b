//! loci-engine: in-memory query operators over node-homed data (seeds 002 and 004).
//!
//! Glossary (DESIGN.md): a **morsel** is a slice of a table with a **home node**; a **worker** is
//! a thread, pinned to a cpu (or not); the **local-access ratio** is the share of bytes a worker
//! read from morsels whose pages sit on its own node, sampled with `move_pages(2)`.
//!
//! - [`gen`]: seeded, chunking-independent data generators (aggregation datasets, join tables).
//! - [`storage`]: tables of `(key: u32, val: u32)` morsels placed by a [`MemPolicy`].
//! - [`exec`]: the [`Executor`] trait, a pinned pool, the NUMA-aware [`MorselQueue`].
//! - [`partition`]: two-pass radix partitioning into node-homed partitions.
//! - [`agg`]: W2 (count/sum/min/max/avg by key) and W1 (exact median by key).
//! - [`join`]: W3 hash join, shared table and partitioned (per-node) variants.
//! - [`index`]: W4 index nested-loop join over sorted array, B-tree, skip list or ART.
//! - [`reference`]: simple single-thread answers the differential tests compare against.

pub mod agg;
pub mod exec;
pub mod gen;
pub mod index;
pub mod join;
pub mod partition;
pub mod reference;
pub mod storage;

pub use exec::{Executor, MorselQueue, PinnedPool, Threads, Worker};
pub use gen::{AggGen, AggSpec, Dist, JoinSpec};
pub use storage::{MemPolicy, Morsel, Table};

/// Errors of the engine: bad input named with the valid choices, or a failed system call.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("unknown {what} '{given}'; valid: {valid}")]
    BadChoice {
        what: &'static str,
        given: String,
        valid: &'static str,
    },
    #[error("node {node} is not an allowed memory node here (allowed: {valid})")]
    BadNode { node: u32, valid: String },
    #[error("{0}")]
    Invalid(String),
    #[error("{what} failed: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

/// Default rows per morsel: 1 Mi rows = 8 MiB of key+value, large enough to amortize scheduling
/// and page sampling, small enough for 100 morsels per 100M-row table.
pub const MORSEL_ROWS: usize = 1 << 20;

/// A raw pointer that may cross threads; users promise disjoint access (see each SAFETY note).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub *mut T);
impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper, not the field).
    #[inline(always)]
    pub(crate) fn ptr(&self) -> *mut T {
        self.0
    }
}

// SAFETY: only used to hand disjoint ranges or distinct elements of one allocation to workers.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

/// Allowed memory nodes of the executor's topology, ascending.
pub fn mem_nodes(exec: &impl Executor) -> Vec<u32> {
    let t = exec.topology();
    let mut v: Vec<u32> = t.allowed_mems().iter().collect();
    if v.is_empty() {
        v = t.nodes.iter().map(|n| n.id).collect();
    }
    v
}

/// What one generation or operator pass did: which node ran each morsel.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// (morsel, node of the worker that processed it).
    pub touched: Vec<(usize, Option<u32>)>,
}

/// Generates a table of `rows` rows with `fill(start_row, keys, vals)`, morsel by morsel on the
/// executor's workers, straight into storage placed by `policy`. For first touch, each morsel's
/// home becomes the node of the worker that generated it; `FirstTouchSingle` uses one worker.
pub fn generate(
    exec: &impl Executor,
    rows: usize,
    morsel_rows: usize,
    policy: &MemPolicy,
    fill: &(dyn Fn(u64, &mut [u32], &mut [u32]) + Sync),
) -> Result<(Table, Trace), EngineError> {
    let nodes = mem_nodes(exec);
    let mut table = Table::alloc(rows, morsel_rows, policy, &nodes)?;
    let homes: Vec<Option<u32>> = table.morsels.iter().map(|m| m.home).collect();
    let starts: Vec<u64> = table
        .morsels
        .iter()
        .scan(0u64, |s, m| {
            let r = *s;
            *s += m.rows() as u64;
            Some(r)
        })
        .collect();
    let q = MorselQueue::for_exec(exec, &homes);
    let base = SendPtr(table.morsels.as_mut_ptr());
    let topo = exec.topology();
    let body = |w: &Worker| {
        let mut range: Option<(u32, u32)> = None;
        loop {
            let node = exec::worker_node(topo, w);
            let Some(i) = q.next(node) else { break };
            // SAFETY: the queue hands out every morsel index exactly once, so this is the only
            // reference to morsel i; the Vec is not resized while workers run.
            let m = unsafe { &mut *base.ptr().add(i) };
            let (k, v) = m.cols_mut();
            fill(starts[i], k, v);
            for &x in k.iter() {
                range = Some(match range {
                    None => (x, x),
                    Some((a, b)) => (a.min(x), b.max(x)),
                });
            }
        }
        range
    };
    let ranges: Vec<Option<(u32, u32)>> = if *policy == MemPolicy::FirstTouchSingle {
        vec![exec.run_one(&body)]
    } else {
        exec.run(&body)
    };
    table.key_range = ranges
        .into_iter()
        .flatten()
        .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)));
    let touched = q.touched();
    if matches!(policy, MemPolicy::FirstTouch | MemPolicy::FirstTouchSingle) {
        for &(i, n) in &touched {
            table.morsels[i].home = n;
        }
    }
    Ok((table, Trace { touched }))
}

/// Generates an aggregation dataset.
pub fn generate_agg(
    exec: &impl Executor,
    spec: AggSpec,
    morsel_rows: usize,
    policy: &MemPolicy,
) -> Result<Table, EngineError> {
    let g = AggGen::new(spec)?;
    Ok(generate(exec, spec.rows, morsel_rows, policy, &|s, k, v| {
        g.fill(s, k, v)
    })?
    .0)
}

/// Generates the join tables R and S.
pub fn generate_join(
    exec: &impl Executor,
    spec: JoinSpec,
    morsel_rows: usize,
    policy: &MemPolicy,
) -> Result<(Table, Table), EngineError> {
    spec.check()?;
    let r = generate(exec, spec.r_rows, morsel_rows, policy, &|s, k, v| {
        spec.fill_r(s, k, v)
    })?
    .0;
    let s = generate(exec, spec.s_rows, morsel_rows, policy, &|st, k, v| {
        spec.fill_s(st, k, v)
    })?
    .0;
    Ok((r, s))
}
