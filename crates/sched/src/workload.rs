//! The scheduler workloads of BENCHMARKS.md (seed 003's shapes), shared by `loci bench sched`,
//! the tests and the multi-node locality check.
//!
//! - **tiny tasks**: a tree of `n` empty tasks (scheduling overhead only).
//! - **pipeline request**: `chains` producer chains; each producer fills a buffer (64 KB by
//!   default) and hands it to a transform as an *immediate* task (the buffer is hot in its
//!   cache), which hands it to an aggregate as an immediate task; the next producer of the chain
//!   is spawned *deferred* (it shares nothing with the current buffer). The result is a checksum
//!   that [`pipeline_expected`] computes sequentially.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{Ctx, Policy, RequestRecord, Scheduler};

/// Spawns a binary tree of exactly `n` tasks (counting the caller's task as the first) as
/// immediate tasks; each task does no work besides spawning its children.
pub fn tree(ctx: &Ctx, n: u64) {
    if n <= 1 {
        return;
    }
    let rest = n - 1;
    let left = rest / 2;
    let right = rest - left;
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

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Stage 1: a buffer of pseudo-random words for (request seed, chain, index).
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
pub fn transform(buf: &mut [u64]) {
    for x in buf.iter_mut() {
        *x = x.wrapping_mul(0x2545_F491_4F6C_DD1D).rotate_left(17) ^ (*x >> 7);
    }
}

/// Stage 3: a checksum of the buffer.
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

fn producer(ctx: &Ctx, seed: u64, chain: usize, k: usize, spec: PipelineSpec, acc: Arc<AtomicU64>) {
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

/// The body of one pipeline request: spawns the chains (deferred) and returns the accumulator,
/// which holds the checksum once the request is done.
pub fn pipeline_request(ctx: &Ctx, seed: u64, spec: PipelineSpec) -> Arc<AtomicU64> {
    let acc = Arc::new(AtomicU64::new(0));
    for chain in 0..spec.chains {
        let a = acc.clone();
        ctx.spawn_deferred(move |c| producer(c, seed, chain, 0, spec, a));
    }
    acc
}

/// Runs `requests` pipeline requests at once (seeds 0..requests) and checks every checksum.
/// Returns the records of the finished requests.
pub fn run_pipelines(
    sched: &Scheduler,
    requests: usize,
    spec: PipelineSpec,
) -> Result<Vec<RequestRecord>, String> {
    let handles: Vec<_> = (0..requests as u64)
        .map(|seed| {
            (
                seed,
                sched.submit(move |ctx| pipeline_request(ctx, seed, spec)),
            )
        })
        .collect();
    let ids: Vec<u64> = handles.iter().map(|(_, h)| h.id()).collect();
    for (seed, h) in handles {
        let got = h.wait().map_err(|e| e.to_string())?.load(Ordering::Relaxed);
        let want = pipeline_expected(seed, spec);
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

/// Seed 003's claim as a check: with `requests` concurrent pipeline requests, LAS keeps at least
/// `threshold` of each request's tasks on one node, NLS does not (its mean share is below it).
/// Needs a topology with at least two nodes that have cpus.
pub fn locality_check(
    topo: &loci_topo::Topology,
    requests: usize,
    spec: PipelineSpec,
    threshold: f64,
) -> Result<Vec<LocalityOutcome>, String> {
    let mut out = Vec::new();
    for policy in [Policy::Las, Policy::Nls] {
        let sched = Scheduler::new(
            topo,
            crate::Config {
                policy,
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
        let recs = run_pipelines(&sched, requests, spec)?;
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
    let las = &out[0];
    let nls = &out[1];
    if las.min_share() < threshold {
        return Err(format!(
            "LAS kept only {:.1}% of some request's tasks on one node (want >= {:.0}%): {:?}",
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
    Ok(out)
}
