//! loci-sched: the locality-aware task scheduler (LAS) of seed 003, with the NLS and unpinned
//! baselines in the same runtime.
//!
//! # Model
//! - **Core groups**: the cpus of one node that share a cache level (the last-level cache by
//!   default, [`Config::cache_level`] to change it). One worker per cpu; each worker's affinity is
//!   its group's cpu set and the OS picks the cpu inside it ([`Affinity::Cpu`] pins to one cpu).
//! - **Requests**: independent units of work (a query). [`Scheduler::submit`] gives each a
//!   sequential id (lower = older) and queues its first task as deferred; the returned
//!   [`RequestHandle`] waits for its result. A task that panics fails its request (the handle
//!   returns [`RequestError::Panicked`] naming the panic), never the pool.
//! - **Tasks**: *immediate* ([`Ctx::spawn_immediate`]: onto the spawning worker's own LIFO queue,
//!   for work sharing data with its spawner) and *deferred* ([`Ctx::spawn_deferred`]: onto the
//!   spawning worker's group queue, which keeps one deque per request in request-id order).
//!
//! # Finding work (LAS, seed 003 section 4.2)
//! A free worker takes the first task found by: (1) its own immediate queue, youngest; (2) the
//! other workers of its group by increasing cache distance, oldest; (3) its group's deferred
//! queue, youngest task of the oldest request; (4) the other groups by increasing NUMA distance,
//! oldest task of the second-oldest request (of the oldest if there is only one); (5) immediate
//! queues of workers of other groups on the same node, round robin from where it last found one.
//! Idle workers sleep on their group's primitive; a deferred spawn wakes a sleeper of the own
//! group first, then of groups by increasing NUMA distance; an immediate spawn wakes only within
//! its node. The choice is the pure function [`rules::choose_las`] over a [`rules::QueueView`].
//! Rule 4 moves a request to another node only whole unless there are not enough requests to
//! occupy the nodes ([`Config::migrate_requests`], [`rules::rule4_target`]). A request submitted
//! with [`RequestOptions::stay_on_node`] ([`Scheduler::submit_with`]) is never taken across
//! nodes by rule 4, not even when it is alone (rules 1-3 and 5 stay on the node anyway): each of
//! its tasks runs on the node it was queued for, and a slow node is not helped.
//!
//! **Fork-join**: [`Ctx::join`]`(a, b)` runs `a` inline and queues `b` as a job on the calling
//! worker's stack (no allocation) on its immediate queue, where idle workers steal it by the rules
//! above (so within the node under LAS); the caller pops `b` back and runs it inline if nobody
//! took it, else runs other tasks until the thief finished it (rayon's `join`).
//! [`Ctx::for_each`]`(range, f)` is a parallel loop on top of it with rayon's adaptive splitting:
//! the range is halved while it has split credits, a stolen half gets new ones, and each piece
//! runs as a plain loop (par_iter's `for_each`).
//!
//! Tasks must not block waiting for tasks they spawned except through [`Ctx::scope`] or
//! [`Ctx::join`] (which run tasks while they wait).
//!
//! **NLS** (seed 003 section 6.1): own immediate queue (youngest), one shared deferred FIFO, then
//! the oldest immediate task of any other worker. **Unpinned**: NLS with no affinity.
//!
//! # Example
//! ```
//! use loci_sched::{Config, Scheduler};
//!
//! let topo = loci_sched::fixtures::grid(1, 1, 2); // or the machine's topology
//! let sched = Scheduler::new(&topo, Config { affinity: loci_sched::Affinity::None, ..Config::default() })?;
//! let data: Vec<u64> = (0..10_000).collect();
//! let h = sched.submit(move |ctx| {
//!     // Morsels with a home node: each runs preferably on its node (here all on node 0).
//!     let sums = std::sync::Mutex::new(0u64);
//!     ctx.for_each_morsel(data.chunks(1000), |_| Some(0), |_ctx, chunk| {
//!         *sums.lock().unwrap() += chunk.iter().sum::<u64>();
//!     });
//!     // Fork-join with borrowing: immediate tasks in a scope.
//!     let (mut a, mut b) = (0u64, 0u64);
//!     ctx.scope(|s| {
//!         s.spawn_immediate(|_| a = 1);
//!         s.spawn_immediate(|_| b = 2);
//!     });
//!     // Fork-join without allocation: the second closure may be stolen by an idle worker.
//!     let (c, d) = ctx.join(|_| 4u64, |_| 5u64);
//!     // A parallel loop over an index range, split only where workers are idle.
//!     let e = std::sync::atomic::AtomicU64::new(0);
//!     ctx.for_each(0..4, |_, i| {
//!         e.fetch_add(i, std::sync::atomic::Ordering::Relaxed);
//!     });
//!     sums.into_inner().unwrap() + a + b + c + d + e.into_inner()
//! });
//! assert_eq!(h.wait()?, 49_995_000 + 3 + 9 + 6);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Counters ([`Scheduler::stats`]): tasks found by each rule, steals by distance between spawner
//! and runner (same group, same node, other node), joins and how many of them were stolen, and
//! for each finished request the nodes its tasks ran on. [`Config::on_task_finished`] runs on the worker after every task (the
//! allocator drains its recollection bins there).

use std::sync::Arc;

mod deferred;
pub mod fixtures;
pub mod layout;
pub mod rules;
mod runtime;
mod sync;
pub mod workload;

pub use layout::{cache_distance, Group, WorkerLayout, WorkerSlot};
pub use rules::Rule;
pub use runtime::{
    Ctx, RequestError, RequestHandle, RequestOptions, RequestRecord, Scheduler, Scope, Stats,
    Steals,
};

/// Which scheduler runs the tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Locality-aware (seed 003 section 4).
    #[default]
    Las,
    /// Not locality-aware (seed 003 section 6.1), workers keep the affinity of [`Config::affinity`].
    Nls,
    /// NLS with no affinity at all.
    Unpinned,
}

impl Policy {
    /// Parses `las`, `nls` or `unpinned`.
    pub fn parse(s: &str) -> Result<Policy, SchedError> {
        match s {
            "las" => Ok(Policy::Las),
            "nls" => Ok(Policy::Nls),
            "unpinned" => Ok(Policy::Unpinned),
            _ => Err(SchedError::Policy(s.to_string())),
        }
    }
    /// `las`, `nls` or `unpinned`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Las => "las",
            Policy::Nls => "nls",
            Policy::Unpinned => "unpinned",
        }
    }
}

/// Where workers may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Affinity {
    /// Each worker on its group's cpus; the OS picks the cpu inside (seed 003).
    #[default]
    Group,
    /// Each worker pinned to one cpu of its group.
    Cpu,
    /// No affinity (tests of many-group layouts on a small machine; always so for unpinned).
    None,
}

/// A callback run on a worker thread with the worker's index.
pub type Hook = Arc<dyn Fn(usize) + Send + Sync>;

/// Scheduler settings.
#[derive(Clone)]
pub struct Config {
    pub policy: Policy,
    /// Cache level that forms core groups (`None`: the last-level cache).
    pub cache_level: Option<u8>,
    pub affinity: Affinity,
    /// Rounds of yield-and-look a worker spends before it sleeps.
    pub spin_rounds: u32,
    /// Runs on the worker after every task (e.g. drain allocator recollection bins).
    pub on_task_finished: Option<Hook>,
    /// Runs on each worker once, before its first task.
    pub on_worker_start: Option<Hook>,
    /// How many finished requests [`Scheduler::stats`] remembers (0: none).
    pub max_request_records: usize,
    /// Stack size of each worker thread in bytes.
    pub stack_size: usize,
    /// LAS rule 4 lets requests change node only whole (loci's rule 4, see
    /// [`rules::rule4_target`]): a thief takes a request that has not started anywhere with all
    /// its queued tasks; it splits a started request across nodes only while there are not
    /// enough requests to occupy the nodes (the request was submitted while fewer requests than
    /// nodes were live, no crowd formed since, and that is still so), so a request submitted
    /// among at least one request per node keeps all its tasks on its node. Groups of one node
    /// always share. `false`: exactly the seed's rule 4 (the oldest task of the second-oldest
    /// request, or of the only one).
    pub migrate_requests: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::Las,
            cache_level: None,
            affinity: Affinity::Group,
            spin_rounds: 32,
            on_task_finished: None,
            on_worker_start: None,
            max_request_records: 4096,
            stack_size: 8 << 20,
            migrate_requests: true,
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("policy", &self.policy)
            .field("cache_level", &self.cache_level)
            .field("affinity", &self.affinity)
            .field("spin_rounds", &self.spin_rounds)
            .field("on_task_finished", &self.on_task_finished.is_some())
            .field("on_worker_start", &self.on_worker_start.is_some())
            .field("max_request_records", &self.max_request_records)
            .field("stack_size", &self.stack_size)
            .field("migrate_requests", &self.migrate_requests)
            .finish()
    }
}

/// Why a scheduler cannot be built or a spawn target does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("the topology has no allowed online cpus to run workers on")]
    NoCpus,
    #[error("no L{level} cache in this topology; cache levels present: {valid}")]
    CacheLevel { level: u8, valid: String },
    #[error("node {node} has no workers; nodes with workers: {valid}")]
    UnknownNode { node: u32, valid: String },
    #[error("unknown scheduler policy {0:?}; valid: las, nls, unpinned")]
    Policy(String),
    #[error("cannot set the affinity of worker {worker} to cpus {cpus}: {reason}")]
    Affinity {
        worker: usize,
        cpus: String,
        reason: String,
    },
    #[error("cannot start a worker thread: {0}")]
    Spawn(String),
    #[error("the plan cannot run here: {0}")]
    Plan(String),
}
