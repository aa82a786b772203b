//! The state all workers of a scheduler share: per group its deferred queue and sleep state,
//! the immediate queues' stealing ends, NLS's FIFO, request accounting (live requests, the
//! crowd epoch, finished records), and the decisions that depend on a request (rule 4 across
//! nodes, wake order) and complete it.

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use super::ctx::Ctx;
use super::request::{ReqRef, RequestState};
use super::sleep::SleepState;
use super::stats::{RequestRecord, WorkerCounters};
use super::task::Task;
use super::EXTERNAL;
use crate::deferred::DeferredQueue;
use crate::layout::WorkerLayout;
use crate::rules::Rule4Class;
use crate::sync::{
    lock, AtomicBool, AtomicU64, AtomicUsize, Condvar, Fifo, Mutex, Ordering, Stealer,
};

pub(super) struct GroupState {
    pub(super) deferred: DeferredQueue<Task>,
    pub(super) sleep: Mutex<SleepState>,
    pub(super) cv: Condvar,
    /// Searching and wakeable workers and the jobs event counter (see `sleep`).
    pub(super) word: AtomicU64,
}

pub(crate) struct Shared {
    pub(crate) layout: WorkerLayout,
    pub(super) las: bool,
    pub(super) unpinned: bool,
    /// Rule 4 moves the rest of the stolen request along (Config::migrate_requests).
    pub(super) migrate: bool,
    pub(super) groups: Vec<CachePadded<GroupState>>,
    pub(super) stealers: Vec<Stealer<Task>>,
    pub(super) fifo: Fifo<Task>,
    /// Workers inside the sleep protocol (announced sleepy, parked, or just woken): a spawner
    /// that reads 0 here has nobody to wake and stops.
    pub(super) idle: CachePadded<AtomicUsize>,
    /// Requests submitted and not finished.
    pub(super) live: CachePadded<AtomicUsize>,
    /// How many times the live requests reached the number of nodes (see `share_epoch`).
    pub(super) crowd_epoch: AtomicU64,
    pub(super) shutdown: AtomicBool,
    pub(super) next_request: AtomicU64,
    pub(super) next_group: AtomicUsize,
    pub(super) counters: Vec<CachePadded<WorkerCounters>>,
    pub(super) records: Mutex<VecDeque<RequestRecord>>,
    pub(super) max_records: usize,
    pub(super) node_ids: Arc<[u32]>,
    pub(super) on_task_finished: Option<crate::Hook>,
    pub(super) on_worker_start: Option<crate::Hook>,
    pub(super) spin_rounds: u32,
}

impl Shared {
    /// Whether rule 4 of a worker on another node may take a task of the request now.
    #[inline]
    fn remote_ok(&self, st: &RequestState) -> bool {
        !st.stay_on_node
            && (!self.migrate
                || !st.started.load(Ordering::Relaxed)
                || (st.share_epoch == self.crowd_epoch.load(Ordering::Relaxed)
                    && self.live.load(Ordering::Relaxed) < self.layout.nodes.len()))
    }

    /// Rule 4's class of a request for a thief on the victim group's node (`same_node`) or not.
    /// A request that stays on its node is `Kept` for every thief of another node, fresh or not
    /// (it does not move whole either).
    pub(super) fn rule4_class(&self, st: &RequestState, same_node: bool) -> Rule4Class {
        if st.stay_on_node && !same_node {
            return Rule4Class::Kept;
        }
        match st.started.load(Ordering::Relaxed) {
            false => Rule4Class::Fresh,
            _ if same_node || self.remote_ok(st) => Rule4Class::Shareable,
            _ => Rule4Class::Kept,
        }
    }

    /// The wake order for a deferred task of `st` queued on group `g`: by NUMA distance, or
    /// only the groups of `g`'s node if no other node may take it.
    #[inline]
    pub(super) fn deferred_order(&self, g: usize, st: &RequestState) -> &[usize] {
        let grp = &self.layout.groups[g];
        if self.remote_ok(st) {
            &grp.wake_deferred
        } else {
            &grp.wake_immediate
        }
    }

    /// Accounts `n` finished tasks of `r`; the last one completes the request.
    pub(super) fn finish(&self, r: ReqRef, n: usize) {
        // SAFETY: `n` unaccounted tasks keep the request alive until the fetch_sub below.
        let st = unsafe { r.state() };
        if st.pending.fetch_sub(n, Ordering::AcqRel) != n {
            return;
        }
        self.live.fetch_sub(1, Ordering::Relaxed);
        let rec = RequestRecord {
            id: st.id,
            failed: st.failed.load(Ordering::Acquire),
            tasks_per_node: st.tasks_per_node(),
        };
        if self.max_records > 0 {
            let mut recs = lock(&self.records);
            if recs.len() == self.max_records {
                recs.pop_front();
            }
            recs.push_back(rec);
        }
        {
            let mut d = lock(&st.done);
            *d = true;
            st.done_cv.notify_all();
        }
        // SAFETY: this is the tasks' strong reference taken by `Arc::into_raw` at submit; no task
        // of the request is left, so nothing else uses it.
        unsafe { drop(Arc::from_raw(r.0.as_ptr() as *const RequestState)) };
    }

    pub(super) fn submit_job<F: FnOnce(&Ctx) + Send + 'static>(
        &self,
        group: usize,
        state: &Arc<RequestState>,
        f: F,
    ) {
        let ptr = Arc::into_raw(state.clone()) as *mut RequestState;
        // SAFETY: Arc::into_raw never returns null.
        let req = ReqRef(unsafe { NonNull::new_unchecked(ptr) });
        let task = Task::new(f, req, EXTERNAL, None);
        if self.las {
            self.groups[group].deferred.push(state.id, task);
        } else {
            self.fifo.push(task);
        }
        let order = if self.las {
            self.deferred_order(group, state)
        } else {
            &self.layout.groups[group].wake_deferred
        };
        self.notify(order, true);
    }
}
