//! The scheduler workloads of BENCHMARKS.md (seed 003's shapes), shared by `loci bench sched`,
//! the tests and the multi-node locality check.
//!
//! - **tiny tasks**: a tree of `n` empty tasks (scheduling overhead only).
//! - **pipeline request**: `chains` producer chains; each producer fills a buffer (64 KB by
//!   default) and hands it to a transform as an *immediate* task (the buffer is hot in its
//!   cache), which hands it to an aggregate as an immediate task; the next producer of the chain
//!   is spawned *deferred* (it shares nothing with the current buffer). The result is a checksum
//!   that [`pipeline_expected`] computes sequentially.
//!
//! The stage functions are never inlined, so every scheduler a benchmark compares runs the
//! same machine code for them (inlined into each scheduler's task wrapper, the loops were
//! compiled differently per caller).

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{Ctx, Policy, RequestRecord, Scheduler};

/// The subtrees under the root of a task tree of `n` tasks: `(left, right)` task counts (`left`
/// may be 0), `None` when the root is a leaf. Every tree of the benchmarks (loci's and rayon's
/// forms) splits this way, so they run the same number of tasks.
#[inline]
pub fn tree_children(n: u64) -> Option<(u64, u64)> {
    let rest = n.checked_sub(1).filter(|&r| r > 0)?;
    let left = rest / 2;
    Some((left, rest - left))
}

/// Spawns a binary tree of exactly `n` tasks (counting the caller's task as the first) as
/// immediate tasks; each task does no work besides spawning its children.
pub fn tree(ctx: &Ctx, n: u64) {
    let Some((left, right)) = tree_children(n) else {
        return;
    };
    if left > 0 {
        ctx.spawn_immediate(move |c| tree(c, left));
    }
    ctx.spawn_immediate(move |c| tree(c, right));
}

/// Shape of one pipeline request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineSpec {
    /// Independent producer chains per request.
    pub chains: usize,
    /// Buffers each chain produces.
    pub buffers: usize,
    /// Bytes per buffer (a multiple of 8).
    pub buffer_bytes: usize,
}

impl Default for PipelineSpec {
    fn default() -> Self {
        PipelineSpec {
            chains: 4,
            buffers: 64,
            buffer_bytes: 64 << 10,
        }
    }
}

/// splitmix64's finalizer: the workloads' (and the benchmarks') deterministic mixing.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Stage 1: a buffer of pseudo-random words for (request seed, chain, index).
#[inline(never)]
pub fn produce(seed: u64, chain: usize, k: usize, bytes: usize) -> Vec<u64> {
    let mut s = splitmix(seed ^ ((chain as u64) << 32) ^ k as u64);
    (0..bytes / 8)
        .map(|_| {
            s = splitmix(s);
            s
        })
        .collect()
}

/// Stage 2: an in-place transform that reads and writes every word.
#[inline(never)]
pub fn transform(buf: &mut [u64]) {
    for x in buf.iter_mut() {
        *x = x.wrapping_mul(0x2545_F491_4F6C_DD1D).rotate_left(17) ^ (*x >> 7);
    }
}

/// Stage 3: a checksum of the buffer.
#[inline(never)]
pub fn aggregate(buf: &[u64]) -> u64 {
    buf.iter().fold(0u64, |a, &x| a.wrapping_add(x ^ (a >> 3)))
}

/// The request's checksum, computed on one thread (the differential baseline).
pub fn pipeline_expected(seed: u64, spec: PipelineSpec) -> u64 {
    let mut total = 0u64;
    for c in 0..spec.chains {
        for k in 0..spec.buffers {
            let mut b = produce(seed, c, k, spec.buffer_bytes);
            transform(&mut b);
            total = total.wrapping_add(aggregate(&b));
        }
    }
    total
}

/// A handle to a request's checksum accumulator that tasks carry: an `Arc<AtomicU64>` (the
/// request owns it), or a `&'static AtomicU64` (a caller-owned slot: no reference count to bump
/// per task, like a borrowed accumulator in a scoped fork-join).
pub trait Accumulator: Deref<Target = AtomicU64> + Clone + Send + 'static {}
impl<A: Deref<Target = AtomicU64> + Clone + Send + 'static> Accumulator for A {}

fn producer<A: Accumulator>(
    ctx: &Ctx,
    seed: u64,
    chain: usize,
    k: usize,
    spec: PipelineSpec,
    acc: A,
) {
    if k + 1 < spec.buffers {
        let a = acc.clone();
        ctx.spawn_deferred(move |c| producer(c, seed, chain, k + 1, spec, a));
    }
    let mut buf = produce(seed, chain, k, spec.buffer_bytes);
    ctx.spawn_immediate(move |c| {
        transform(&mut buf);
        c.spawn_immediate(move |_| {
            acc.fetch_add(aggregate(&buf), Ordering::Relaxed);
        });
    });
}

/// The body of one pipeline request: spawns the chains (deferred), which add their checksums
/// into `acc`; `acc` holds the request's checksum once the request is done.
pub fn pipeline_request_into<A: Accumulator>(ctx: &Ctx, seed: u64, spec: PipelineSpec, acc: A) {
    for chain in 0..spec.chains {
        let a = acc.clone();
        ctx.spawn_deferred(move |c| producer(c, seed, chain, 0, spec, a));
    }
}

/// The body of one pipeline request: spawns the chains (deferred) and returns the accumulator,
/// which holds the checksum once the request is done.
pub fn pipeline_request(ctx: &Ctx, seed: u64, spec: PipelineSpec) -> Arc<AtomicU64> {
    let acc = Arc::new(AtomicU64::new(0));
    pipeline_request_into(ctx, seed, spec, acc.clone());
    acc
}

/// Runs one pipeline request per slot of `accs` at once (request `i` has seed `i` and adds its
/// checksum into `accs[i]`, which this zeroes first), waits for all of them and checks every
/// checksum against `expected` (waiting for the youngest request first, see the body). The timed form of [`run_pipelines`] for benchmarks: no
/// reference-counted accumulator per request and no request records are collected.
pub fn run_pipelines_into(
    sched: &Scheduler,
    spec: PipelineSpec,
    accs: &'static [AtomicU64],
    expected: &[u64],
) -> Result<(), String> {
    for a in accs {
        a.store(0, Ordering::Relaxed);
    }
    let handles: Vec<_> = accs
        .iter()
        .enumerate()
        .map(|(seed, acc)| {
            sched.submit(move |ctx| pipeline_request_into(ctx, seed as u64, spec, acc))
        })
        .collect();
    // The batch is done when its last request is: wait for the youngest first. Requests finish
    // about in submission order (every policy serves the oldest request first), so the waiting
    // thread sleeps once per batch, as on rayon's one scope latch, instead of being woken (and
    // taking a cpu from a worker) once per finished request; the other waits then find their
    // request done.
    for h in handles.into_iter().rev() {
        h.wait().map_err(|e| e.to_string())?;
    }
    check_checksums(accs.iter().map(|a| a.load(Ordering::Relaxed)), expected)
}

/// Compares the checksums of requests with seeds 0.. against `expected`.
pub fn check_checksums(got: impl IntoIterator<Item = u64>, expected: &[u64]) -> Result<(), String> {
    for (seed, got) in got.into_iter().enumerate() {
        let want = *expected
            .get(seed)
            .ok_or_else(|| format!("no expected checksum for request {seed}"))?;
        if got != want {
            return Err(format!(
                "request with seed {seed}: checksum {got:#x}, expected {want:#x}"
            ));
        }
    }
    Ok(())
}

/// Runs `requests` pipeline requests at once (seeds 0..requests) and checks every checksum
/// against `expected` (computed here with [`pipeline_expected`] when `None`; pass precomputed
/// values when timing). Returns the records of the finished requests.
pub fn run_pipelines(
    sched: &Scheduler,
    requests: usize,
    spec: PipelineSpec,
    expected: Option<&[u64]>,
) -> Result<Vec<RequestRecord>, String> {
    run_pipelines_released(sched, requests, spec, expected, false)
}

/// [`run_pipelines`]; with `together`, every request's first task waits (yielding) until all
/// `requests` are submitted before it spawns anything, so the requests are concurrent from
/// their first spawn rather than arriving one by one behind a submitting thread that may lose
/// its cpu between submits (as it does on a VM's emulated vCPUs).
fn run_pipelines_released(
    sched: &Scheduler,
    requests: usize,
    spec: PipelineSpec,
    expected: Option<&[u64]>,
    together: bool,
) -> Result<Vec<RequestRecord>, String> {
    let go = Arc::new(std::sync::atomic::AtomicBool::new(!together));
    let handles: Vec<_> = (0..requests as u64)
        .map(|seed| {
            let go = go.clone();
            (
                seed,
                sched.submit(move |ctx| {
                    while !go.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    pipeline_request(ctx, seed, spec)
                }),
            )
        })
        .collect();
    go.store(true, Ordering::Release);
    let ids: Vec<u64> = handles.iter().map(|(_, h)| h.id()).collect();
    for (seed, h) in handles {
        let got = h.wait().map_err(|e| e.to_string())?.load(Ordering::Relaxed);
        let want = match expected {
            Some(e) => *e
                .get(seed as usize)
                .ok_or_else(|| format!("no expected checksum for request {seed}"))?,
            None => pipeline_expected(seed, spec),
        };
        if got != want {
            return Err(format!(
                "request with seed {seed}: checksum {got:#x}, expected {want:#x}"
            ));
        }
    }
    Ok(sched
        .stats()
        .requests
        .into_iter()
        .filter(|r| ids.contains(&r.id))
        .collect())
}

/// Per-policy outcome of [`locality_check`].
#[derive(Debug, Clone)]
pub struct LocalityOutcome {
    pub policy: Policy,
    /// For each request: its main node and the share of its tasks that ran there.
    pub shares: Vec<(u64, u32, f64)>,
}

impl LocalityOutcome {
    /// Smallest main-node share over the requests.
    pub fn min_share(&self) -> f64 {
        self.shares.iter().map(|s| s.2).fold(1.0, f64::min)
    }
    /// Mean main-node share over the requests.
    pub fn mean_share(&self) -> f64 {
        self.shares.iter().map(|s| s.2).sum::<f64>() / self.shares.len().max(1) as f64
    }
}

/// Runs `requests` concurrent pipeline requests under LAS and then NLS on `topo` and reports,
/// per request, the share of its tasks that ran on its main node. Needs at least two nodes with
/// cpus. [`LocalityOutcome::check`] applies seed 003's claim to the outcomes.
///
/// The requests are released together (their first tasks wait until all are submitted): the
/// claim is about concurrent requests. While fewer requests than nodes are live, LAS shares a
/// started request with idle nodes on purpose (seed 003 rule 4), so requests trickling in one by
/// one behind a slow submitter would measure that instead.
///
/// With [`crate::Affinity::None`] (a synthetic topology on a small machine) the nodes are the
/// scheduler's logical ones (the node of the group whose worker ran the task): it then measures
/// the scheduling decisions, not where the OS ran the threads.
pub fn locality_check(
    topo: &loci_topo::Topology,
    affinity: crate::Affinity,
    requests: usize,
    spec: PipelineSpec,
) -> Result<[LocalityOutcome; 2], String> {
    let mut out = Vec::new();
    for policy in [Policy::Las, Policy::Nls] {
        let sched = Scheduler::new(
            topo,
            crate::Config {
                policy,
                affinity,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        if sched.layout().nodes.len() < 2 {
            return Err(format!(
                "the locality check needs at least 2 nodes with cpus; this topology has {} ({})",
                sched.layout().nodes.len(),
                topo.source
            ));
        }
        let recs = run_pipelines_released(&sched, requests, spec, None, true)?;
        if recs.len() != requests {
            return Err(format!(
                "{} request records for {requests} requests",
                recs.len()
            ));
        }
        let shares = recs
            .iter()
            .map(|r| {
                let (n, s) = r.main_node();
                (r.id, n, s)
            })
            .collect();
        out.push(LocalityOutcome { policy, shares });
    }
    let nls = out.pop().expect("two outcomes");
    let las = out.pop().expect("two outcomes");
    Ok([las, nls])
}

impl LocalityOutcome {
    /// Requests with at least `threshold` of their tasks on their main node.
    pub fn at_least(&self, threshold: f64) -> usize {
        self.shares.iter().filter(|s| s.2 >= threshold).count()
    }

    /// Seed 003's claim (`las`, `nls` from [`locality_check`]): LAS keeps at least `threshold`
    /// of each request's tasks on one node; NLS does not (its mean share is below `threshold`).
    pub fn check(
        las: &LocalityOutcome,
        nls: &LocalityOutcome,
        threshold: f64,
    ) -> Result<(), String> {
        if las.min_share() < threshold {
            return Err(format!(
                "LAS kept only {:.1}% of some request's tasks on one node (want >= {:.0}% for each): {:?}",
                100.0 * las.min_share(),
                100.0 * threshold,
                las.shares
            ));
        }
        if nls.mean_share() >= threshold {
            return Err(format!(
                "NLS kept {:.1}% of tasks on one node on average: the check cannot tell LAS from NLS here",
                100.0 * nls.mean_share()
            ));
        }
        Ok(())
    }
}
