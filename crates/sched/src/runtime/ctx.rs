//! A worker's context as the tasks it runs see it ([`Ctx`]): where it runs, spawning tasks
//! into its queues, and the spawn credits that keep a request's `pending` count ahead of its
//! visible tasks.

use std::cell::Cell;
use std::sync::Arc;

use super::request::ReqRef;
use super::shared::Shared;
use super::task::{BlockCache, Task};
use super::CREDIT_BATCH;
use crate::layout::WorkerLayout;
use crate::sync::{Local, Ordering};
use crate::SchedError;

/// Where a spawn puts its task.
#[derive(Clone, Copy)]
pub(super) enum Where {
    Immediate,
    Deferred,
    DeferredOn(usize),
}

/// Accounting of a run of tasks of one request on one worker: finished tasks not yet subtracted
/// from the request's `pending`, and spawn credits reserved in it and not used yet.
#[derive(Clone, Copy)]
pub(super) struct Run {
    pub(super) req: Option<ReqRef>,
    pub(super) node: usize,
    pub(super) count: usize,
    pub(super) credit: usize,
}

pub(super) const NO_RUN: Run = Run {
    req: None,
    node: 0,
    count: 0,
    credit: 0,
};

/// A worker's context, handed to every task it runs: spawn more tasks of the same request, open a
/// scope, ask where you run.
pub struct Ctx {
    pub(super) shared: Arc<Shared>,
    pub(super) w: usize,
    pub(super) group: usize,
    pub(super) node_slot: usize,
    pub(super) local: Local<Task>,
    pub(super) rr: Cell<usize>,
    pub(super) on_rr: Cell<usize>,
    pub(super) current: Cell<Option<ReqRef>>,
    pub(super) run: Cell<Run>,
    /// Scope waits this worker is nested in (each may run other tasks while it waits).
    pub(super) depth: Cell<u32>,
    /// Groups where rule 4 found nothing it may take during the current search (bit per group).
    pub(super) skip: Box<[Cell<u64>]>,
    /// Whether any bit of `skip` is set.
    pub(super) skipping: Cell<bool>,
    /// Recycled small task blocks.
    pub(super) blocks: BlockCache,
}

impl Ctx {
    /// This worker's index (0..workers).
    pub fn worker(&self) -> usize {
        self.w
    }
    /// This worker's core group.
    pub fn group(&self) -> usize {
        self.group
    }
    /// The node of this worker's group (for the unpinned baseline: the group it was built for,
    /// which the OS may ignore).
    pub fn node(&self) -> u32 {
        self.shared.layout.groups[self.group].node
    }
    /// The layout of the scheduler this worker belongs to.
    pub fn layout(&self) -> &WorkerLayout {
        &self.shared.layout
    }
    #[inline]
    pub(super) fn req(&self) -> ReqRef {
        self.current
            .get()
            .expect("a Ctx is only handed to running tasks")
    }
    /// Id of the request the running task belongs to.
    pub fn request_id(&self) -> u64 {
        // SAFETY: the running task keeps its request alive.
        unsafe { self.req().state() }.id
    }
    /// Whether a task of the running request has panicked (the request will fail; remaining
    /// tasks may stop early).
    pub fn request_failed(&self) -> bool {
        // SAFETY: the running task keeps its request alive.
        unsafe { self.req().state() }.failed.load(Ordering::Relaxed)
    }

    /// Spawns an immediate task (seed 003): onto this worker's own queue; it runs next here
    /// (youngest first) or is stolen by a worker of the same node. Use for work that shares most
    /// of its data with the spawning task.
    pub fn spawn_immediate(&self, f: impl FnOnce(&Ctx) + Send + 'static) {
        self.push(
            Where::Immediate,
            Task::new(f, self.req(), self.w as u32, Some(&self.blocks)),
        );
    }
    /// Spawns a deferred task: into this group's deferred queue (LAS) or the shared FIFO (NLS);
    /// it runs when a worker is free and may travel to another node. Use for detached work and for
    /// work that will spawn much more.
    pub fn spawn_deferred(&self, f: impl FnOnce(&Ctx) + Send + 'static) {
        self.push(
            Where::Deferred,
            Task::new(f, self.req(), self.w as u32, Some(&self.blocks)),
        );
    }
    /// Spawns a deferred task into the deferred queue of a group of `node` (for work whose data
    /// lives there). Under NLS and unpinned this is [`Ctx::spawn_deferred`] (they ignore
    /// locality).
    pub fn spawn_deferred_on(
        &self,
        node: u32,
        f: impl FnOnce(&Ctx) + Send + 'static,
    ) -> Result<(), SchedError> {
        let g = self.group_on(node)?;
        self.push(
            Where::DeferredOn(g),
            Task::new(f, self.req(), self.w as u32, Some(&self.blocks)),
        );
        Ok(())
    }

    pub(super) fn group_on(&self, node: u32) -> Result<usize, SchedError> {
        let l = &self.shared.layout;
        if node == self.node() {
            return Ok(self.group);
        }
        let gs = l.groups_of_known(node)?;
        let k = self.on_rr.get();
        self.on_rr.set(k.wrapping_add(1));
        Ok(gs[k % gs.len()])
    }

    /// Queues a task of the running request and wakes a worker for it if one sleeps.
    #[inline]
    pub(super) fn push(&self, wh: Where, task: Task) {
        let req = task.req;
        // SAFETY: the running task keeps its request alive.
        let st = unsafe { req.state() };
        self.spend_credit(req);
        let sh = &*self.shared;
        let lg = &sh.layout.groups;
        match wh {
            Where::Immediate => self.push_local(task),
            _ if !sh.las => {
                sh.fifo.push(task);
                sh.notify(&lg[self.group].wake_deferred, false);
            }
            Where::Deferred => {
                sh.groups[self.group].deferred.push(st.id, task);
                sh.notify(sh.deferred_order(self.group, st), false);
            }
            Where::DeferredOn(g) => {
                sh.groups[g].deferred.push(st.id, task);
                sh.notify(sh.deferred_order(g, st), g != self.group);
            }
        }
    }

    /// Puts a task onto this worker's immediate queue (already counted in `pending`, or a join's
    /// job, which is counted when it runs as a task) and wakes a worker that may steal it.
    #[inline]
    pub(super) fn push_local(&self, task: Task) {
        let sh = &*self.shared;
        let g = &sh.layout.groups[self.group];
        self.local.push(task);
        sh.notify(
            if sh.las {
                &g.wake_immediate
            } else {
                &g.wake_deferred
            },
            false,
        );
    }

    /// Counts one more task of `req` in its `pending` before the task becomes visible: from this
    /// worker's reserved credits, reserving a batch when none is left.
    #[inline]
    pub(super) fn spend_credit(&self, req: ReqRef) {
        let mut r = self.run.get();
        if r.req != Some(req) {
            // A scope wait inside the running task ran tasks of another request meanwhile.
            self.switch_to(req, self.exec_node());
            r = self.run.get();
        }
        if r.credit == 0 {
            // SAFETY: the running task keeps its request alive. Relaxed: the queue push that
            // publishes the task is a release, so whoever runs it sees this increment first.
            unsafe { req.state() }
                .pending
                .fetch_add(CREDIT_BATCH, Ordering::Relaxed);
            r.credit = CREDIT_BATCH;
        }
        r.credit -= 1;
        self.run.set(r);
    }
}
