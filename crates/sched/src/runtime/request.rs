//! Requests: the state a request's tasks share ([`RequestState`], reached through [`ReqRef`]),
//! the per-request options, the handle a submitter waits on, and why a request gives no result.

use std::any::Any;
#[cfg(not(loom))]
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::sync::{lock, wait, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};

/// Pointer to a request's state, kept alive by the tasks' shared reference (see the `runtime`
/// module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReqRef(pub(super) NonNull<RequestState>);
// SAFETY: RequestState is Sync (atomics and mutexes); the pointer is only dereferenced while the
// request's `pending` count keeps the tasks' strong reference alive.
unsafe impl Send for ReqRef {}

impl ReqRef {
    /// SAFETY: the caller holds a task of this request that is counted in `pending`, or a
    /// not-yet-flushed count of finished tasks (both keep `pending` > 0).
    #[inline]
    pub(super) unsafe fn state<'a>(self) -> &'a RequestState {
        // SAFETY: see the function contract.
        unsafe { self.0.as_ref() }
    }
}

/// `RequestState::share_epoch` of a request submitted into a crowd (never shareable).
pub(super) const CROWDED: u64 = u64::MAX;

pub(crate) struct RequestState {
    pub(super) id: u64,
    pub(super) pending: CachePadded<AtomicUsize>,
    /// Some task of the request has started running (rule 4 moves only requests that have not).
    pub(super) started: AtomicBool,
    /// The crowd epoch (`Shared::crowd_epoch`) when the request was submitted, `CROWDED` if at
    /// least as many requests as nodes were live then. Rule 4 lets other nodes share a started
    /// request only while the scheduler's epoch still equals this (no crowd since its submit)
    /// and fewer requests than nodes are live (see `rules::Rule4Class`).
    pub(super) share_epoch: u64,
    /// [`RequestOptions::stay_on_node`]: no worker of another node takes a task of it.
    pub(super) stay_on_node: bool,
    pub(super) failed: AtomicBool,
    pub(super) panic_msg: Mutex<Option<String>>,
    pub(super) done: Mutex<bool>,
    pub(super) done_cv: Condvar,
    /// Tasks run on each node (index into the layout's node list).
    pub(super) nodes: Box<[AtomicU64]>,
    pub(super) node_ids: Arc<[u32]>,
}

impl RequestState {
    pub(super) fn fail(&self, msg: String) {
        let mut m = lock(&self.panic_msg);
        if m.is_none() {
            *m = Some(msg);
        }
        self.failed.store(true, Ordering::Release);
    }
    pub(super) fn tasks_per_node(&self) -> Vec<(u32, u64)> {
        self.node_ids
            .iter()
            .zip(self.nodes.iter())
            .map(|(&n, c)| (n, c.load(Ordering::Acquire)))
            .collect()
    }
}

/// The message of a panic payload (a `&str` or `String`; a fixed text for any other payload).
pub(crate) fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Per-request options ([`Scheduler::submit_with`], [`Scheduler::submit_on_with`]);
/// `RequestOptions::default()` is what [`Scheduler::submit`] uses.
///
/// [`Scheduler::submit`]: super::Scheduler::submit
/// [`Scheduler::submit_with`]: super::Scheduler::submit_with
/// [`Scheduler::submit_on_with`]: super::Scheduler::submit_on_with
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestOptions {
    /// Under LAS, every task of the request runs on the node it was queued for: rule 4 never
    /// takes a task of this request (nor moves the request) across nodes, even when the other
    /// node is idle and this is the only request. Rules 1-3 and 5 and rule 4 between groups of
    /// the same node stay on the node anyway, and immediate tasks are only stolen within the
    /// node; so a deferred task queued with [`Ctx::spawn_deferred_on`] runs on that node, and
    /// the request's first task on the node it was submitted to. What it trades: a node that
    /// runs slow (or got more work) is not helped by idle nodes, as with one instance per node
    /// (seed 004). The default (`false`) lets a lone request be shared by idle nodes (seed 003).
    /// NLS and unpinned ignore it (they ignore locality).
    ///
    /// [`Ctx::spawn_deferred_on`]: super::Ctx::spawn_deferred_on
    pub stay_on_node: bool,
}

impl RequestOptions {
    /// Options of a request whose tasks stay on the node they were queued for
    /// ([`RequestOptions::stay_on_node`]).
    pub fn stay_on_node() -> RequestOptions {
        RequestOptions { stay_on_node: true }
    }
}

/// A submitted request: wait for its result.
pub struct RequestHandle<T> {
    pub(super) state: Arc<RequestState>,
    pub(super) slot: Arc<Mutex<Option<T>>>,
}

/// Why a request produced no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request {request} failed: a task panicked: {message}")]
    Panicked { request: u64, message: String },
    #[error("request {request}: wait() called on a worker thread of the scheduler would block it (use Ctx::scope inside tasks)")]
    WaitOnWorker { request: u64 },
    #[error("Scheduler::run called on a worker thread of the scheduler would block it (use Ctx::scope inside tasks)")]
    RunOnWorker,
}

#[cfg(not(loom))]
thread_local! {
    pub(super) static ON_WORKER: Cell<bool> = const { Cell::new(false) };
}

impl<T> RequestHandle<T> {
    /// The request's id (sequential per scheduler, lower = older).
    pub fn id(&self) -> u64 {
        self.state.id
    }
    /// Whether every task of the request has finished.
    pub fn is_done(&self) -> bool {
        *lock(&self.state.done)
    }
    /// Waits until every task of the request has finished; its result, or the panic that failed
    /// it.
    pub fn wait(self) -> Result<T, RequestError> {
        #[cfg(not(loom))]
        if ON_WORKER.with(|w| w.get()) && !self.is_done() {
            return Err(RequestError::WaitOnWorker {
                request: self.state.id,
            });
        }
        let mut d = lock(&self.state.done);
        while !*d {
            d = wait(&self.state.done_cv, d);
        }
        drop(d);
        if let Some(m) = lock(&self.state.panic_msg).clone() {
            return Err(RequestError::Panicked {
                request: self.state.id,
                message: m,
            });
        }
        Ok(lock(&self.slot)
            .take()
            .expect("a request that did not fail has a result"))
    }
    /// Tasks of this request run on each node so far (complete once the request is done).
    pub fn tasks_per_node(&self) -> Vec<(u32, u64)> {
        self.state.tasks_per_node()
    }
}
