//! The running scheduler: worker threads, queues, requests, scopes, sleep and wake.
//!
//! Invariants (read these before changing anything here):
//! - A request's `pending` counts its tasks that exist and have not been *accounted* as finished,
//!   plus spawn credits that workers reserved and have not used yet. A worker reserves credits in
//!   batches (`CREDIT_BATCH`, one RMW per batch instead of one per spawn) and spends one before a
//!   task becomes visible; it accounts finished tasks and gives back unused credits in batches
//!   (`Run`), always before it looks for work and finds none, and before it runs a task of
//!   another request. So `pending` reaches 0 exactly once, after the last task of the request
//!   finished, and a worker never sits idle on an unaccounted task or an unused credit.
//! - The tasks of a request share one strong reference to its `RequestState` (taken at submit,
//!   released by whoever brings `pending` to 0); a `Task` holds a raw pointer, valid while it
//!   exists because it is counted in `pending`.
//! - A task is 16 bytes: a thin pointer to one heap block (a header with the block's call
//!   function and the spawning worker, then the closure) and the request pointer. Running it
//!   moves the closure out and frees the block before the closure runs.
//! - Sleep is two-phase (see `sleep`): an idle worker announces itself *sleepy* in its group's
//!   word (`GroupState::word`: searching count, wakeable count, jobs event counter) and in the
//!   scheduler-wide `idle` count, fences, scans every queue it may take from once more, and parks
//!   only if no spawn bumped its group's event counter meanwhile (a CAS under the group mutex).
//!   A spawner publishes the task and reads `idle`: zero (the common case when everyone is busy)
//!   costs one load, no fence, no RMW, no syscall. Otherwise it bumps the event counter of each
//!   group in its wake order that has a searching worker, and hands a wake token to the first
//!   that has a parked one. Spawns that only their own worker's group or node can take
//!   (immediate tasks, deferred tasks into the spawner's own group) skip the fence, as rayon's
//!   internal pushes do: if the store-load race hides the task from a worker going to sleep, the
//!   spawner itself takes it later (it looks at its own queues before it idles), so at worst
//!   parallelism drops for a moment. Spawns into another group's queue and external submits
//!   fence first (a Dekker pair with the sleeper's fence), so one of the two always sees the
//!   other and nothing is stranded. Tokens live under the group's mutex, so a wake that arrives
//!   before the sleeper waits is not lost.
//! - Only a worker pushes to its own immediate queue, and a worker sleeps only after finding that
//!   queue and its group's deferred queue empty; every group's deferred queue is served by that
//!   group's own workers (rule 3). So no task is stranded.
//! - Tasks must not block on something only a task they spawned can release, except through
//!   `Ctx::scope` or `Ctx::join` (which run tasks while they wait): a blocked worker runs
//!   nothing.
//! - A join's second half is a job on the joiner's stack, queued like an immediate task but not
//!   counted in `pending`; it counts itself (from the runner's credits) only if it runs as a task.
//!   The joiner returns only after the job came back unrun or its latch was set (see `join`).
//!
//! The files:
//! - `task`: a task's heap block (header and closure), the workers' block caches, `Task`.
//! - `request`: a request's shared state and its options, handle and errors.
//! - `stats`: the public counters ([`Stats`], [`RequestRecord`]) and the workers' own.
//! - `shared`: the state all workers share (`Shared`): groups, queues, request accounting.
//! - `ctx`: a worker's context ([`Ctx`]) as tasks see it: spawns, credits, where it runs.
//! - `worker`: the worker loop: finding a task by the rules, running it, accounting runs.
//! - `sleep`: the two-phase sleep of idle workers and the spawner's wake-up.
//! - `scope`: [`Ctx::scope`], [`Ctx::for_each_morsel`] and [`Scope`].
//! - `join`: [`Ctx::join`], fork-join with the second half a job on the joiner's stack.
//! - `scheduler`: [`Scheduler`]: starting the workers, submitting requests, counters, shutdown.

mod ctx;
mod for_each;
mod join;
mod request;
mod scheduler;
mod scope;
mod shared;
mod sleep;
mod stats;
mod task;
mod worker;

pub use ctx::Ctx;
pub(crate) use request::panic_message;
pub use request::{RequestError, RequestHandle, RequestOptions};
pub use scheduler::Scheduler;
pub use scope::Scope;
pub use stats::{RequestRecord, Stats, Steals};

/// Spawner index of tasks submitted from outside the pool.
const EXTERNAL: u32 = u32::MAX;

/// Spawn credits a worker reserves in one RMW on a request's `pending` (see module docs).
const CREDIT_BATCH: usize = 64;
