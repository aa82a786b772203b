//! The running scheduler: worker threads, queues, requests, scopes, sleep and wake.
//!
//! Invariants (read these before changing anything here):
//! - A request's `pending` counts its tasks that exist and have not been *accounted* as finished.
//!   A spawn adds 1 before the task becomes visible; a worker accounts finished tasks in batches
//!   (`Run`), always before it looks for work and finds none, and before it runs a task of another
//!   request. So `pending` reaches 0 exactly once, after the last task of the request finished, and
//!   a worker never sits idle on an unaccounted task.
//! - The tasks of a request share one strong reference to its `RequestState` (taken at submit,
//!   released by whoever brings `pending` to 0); a `Task` holds a raw pointer, valid while it
//!   exists because it is counted in `pending`.
//! - Sleep/wake is a Dekker pair: a worker registers as sleeper (SeqCst RMW), fences, then scans
//!   every queue it may take from; a spawner publishes the task, fences, then reads the sleeper
//!   count. One of them sees the other. Wake-ups are tokens under the group's mutex, so a wake
//!   that arrives before the sleeper waits is not lost.
//! - Only a worker pushes to its own immediate queue, and a worker sleeps only after finding that
//!   queue empty; every deferred queue is reachable by every worker. So no task is stranded.

use std::any::Any;
use std::cell::Cell;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::deferred::{DeferredQueue, Take};
use crate::layout::Layout;
use crate::rules::{choose_las, choose_nls, Pick, QueueView, Rule};
use crate::sync::{
    fence, local, lock, thread, wait, AtomicBool, AtomicU64, AtomicUsize, Condvar, Fifo, Local,
    Mutex, Ordering, Stealer,
};
use crate::{Affinity, Config, Policy, SchedError};

/// A task's closure. Runs once, on a worker, with that worker's context.
pub(crate) type Job = Box<dyn FnOnce(&Ctx) + Send>;

/// Spawner index of tasks submitted from outside the pool.
const EXTERNAL: u32 = u32::MAX;

pub(crate) struct Task {
    job: Job,
    req: ReqRef,
    spawner: u32,
}

/// Pointer to a request's state, kept alive by the tasks' shared reference (see module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReqRef(NonNull<RequestState>);
// SAFETY: RequestState is Sync (atomics and mutexes); the pointer is only dereferenced while the
// request's `pending` count keeps the tasks' strong reference alive.
unsafe impl Send for ReqRef {}

impl ReqRef {
    /// SAFETY: the caller holds a task of this request that is counted in `pending`, or a
    /// not-yet-flushed count of finished tasks (both keep `pending` > 0).
    #[inline]
    unsafe fn state<'a>(self) -> &'a RequestState {
        // SAFETY: see the function contract.
        unsafe { self.0.as_ref() }
    }
}

pub(crate) struct RequestState {
    id: u64,
    pending: CachePadded<AtomicUsize>,
    failed: AtomicBool,
    panic_msg: Mutex<Option<String>>,
    done: Mutex<bool>,
    done_cv: Condvar,
    /// Tasks run on each node (index into the layout's node list).
    nodes: Box<[AtomicU64]>,
    node_ids: Arc<[u32]>,
}

impl RequestState {
    fn fail(&self, msg: String) {
        let mut m = lock(&self.panic_msg);
        if m.is_none() {
            *m = Some(msg);
        }
        self.failed.store(true, Ordering::Release);
    }
    fn tasks_per_node(&self) -> Vec<(u32, u64)> {
        self.node_ids
            .iter()
            .zip(self.nodes.iter())
            .map(|(&n, c)| (n, c.load(Ordering::Acquire)))
            .collect()
    }
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// What happened to one request: how many of its tasks ran on each node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub id: u64,
    pub failed: bool,
    /// `(node id, tasks run there)` for every node of the scheduler.
    pub tasks_per_node: Vec<(u32, u64)>,
}

impl RequestRecord {
    /// All tasks of the request.
    pub fn tasks(&self) -> u64 {
        self.tasks_per_node.iter().map(|(_, c)| c).sum()
    }
    /// The node that ran most of its tasks, and the share of tasks it ran (0..=1).
    pub fn main_node(&self) -> (u32, f64) {
        let (n, c) = self
            .tasks_per_node
            .iter()
            .copied()
            .max_by_key(|&(n, c)| (c, std::cmp::Reverse(n)))
            .unwrap_or((0, 0));
        let t = self.tasks();
        (n, if t == 0 { 1.0 } else { c as f64 / t as f64 })
    }
}

/// Steals by distance between the worker that spawned a task and the worker that ran it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Steals {
    pub same_group: u64,
    pub same_node: u64,
    pub other_node: u64,
}

/// Counters of a scheduler, cumulative since it started (see [`Stats::since`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Tasks run.
    pub tasks: u64,
    /// Tasks found by each rule, in [`Rule::ALL`] order.
    pub found: [u64; 8],
    pub steals: Steals,
    /// The most recent finished requests (up to `Config::max_request_records`), oldest first.
    pub requests: Vec<RequestRecord>,
}

impl Stats {
    /// Tasks found by one rule.
    pub fn found_by(&self, r: Rule) -> u64 {
        self.found[Rule::ALL.iter().position(|&x| x == r).expect("rule listed")]
    }
    /// The counters of what happened after `earlier` was taken.
    pub fn since(&self, earlier: &Stats) -> Stats {
        let mut found = self.found;
        for (f, e) in found.iter_mut().zip(earlier.found) {
            *f -= e;
        }
        let last = earlier.requests.last().map(|r| r.id);
        Stats {
            tasks: self.tasks - earlier.tasks,
            found,
            steals: Steals {
                same_group: self.steals.same_group - earlier.steals.same_group,
                same_node: self.steals.same_node - earlier.steals.same_node,
                other_node: self.steals.other_node - earlier.steals.other_node,
            },
            requests: self
                .requests
                .iter()
                .filter(|r| last.map_or(true, |l| r.id > l))
                .cloned()
                .collect(),
        }
    }
}

#[derive(Default)]
struct WorkerCounters {
    tasks: AtomicU64,
    found: [AtomicU64; 8],
    steals: [AtomicU64; 3],
}

/// Adds one to a counter that only its worker writes (a plain load and store, no locked RMW).
#[inline]
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

struct SleepState {
    sleeping: usize,
    tokens: usize,
}

struct GroupState {
    deferred: DeferredQueue<Task>,
    sleep: Mutex<SleepState>,
    cv: Condvar,
    /// Copy of `sleep.sleeping` readable without the lock.
    sleepy: AtomicUsize,
}

pub(crate) struct Shared {
    pub(crate) layout: Layout,
    las: bool,
    unpinned: bool,
    groups: Vec<CachePadded<GroupState>>,
    stealers: Vec<Stealer<Task>>,
    fifo: Fifo<Task>,
    sleepers: CachePadded<AtomicUsize>,
    shutdown: AtomicBool,
    next_request: AtomicU64,
    next_group: AtomicUsize,
    counters: Vec<CachePadded<WorkerCounters>>,
    records: Mutex<VecDeque<RequestRecord>>,
    max_records: usize,
    node_ids: Arc<[u32]>,
    on_task_finished: Option<crate::Hook>,
    on_worker_start: Option<crate::Hook>,
    spin_rounds: u32,
}

impl Shared {
    /// Wakes one sleeper of the first group in `order` that has one.
    #[inline]
    fn wake(&self, order: &[usize]) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Acquire) == 0 {
            return;
        }
        self.wake_slow(order);
    }

    #[cold]
    fn wake_slow(&self, order: &[usize]) {
        for &g in order {
            let gs = &self.groups[g];
            if gs.sleepy.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut st = lock(&gs.sleep);
            if st.sleeping > st.tokens {
                st.tokens += 1;
                gs.cv.notify_one();
                return;
            }
        }
    }

    /// Accounts `n` finished tasks of `r`; the last one completes the request.
    fn finish(&self, r: ReqRef, n: usize) {
        // SAFETY: `n` unaccounted tasks keep the request alive until the fetch_sub below.
        let st = unsafe { r.state() };
        if st.pending.fetch_sub(n, Ordering::AcqRel) != n {
            return;
        }
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

    fn submit_job(&self, group: usize, state: &Arc<RequestState>, job: Job) {
        let ptr = Arc::into_raw(state.clone()) as *mut RequestState;
        // SAFETY: Arc::into_raw never returns null.
        let req = ReqRef(unsafe { NonNull::new_unchecked(ptr) });
        let task = Task {
            job,
            req,
            spawner: EXTERNAL,
        };
        if self.las {
            self.groups[group].deferred.push(state.id, task);
        } else {
            self.fifo.push(task);
        }
        self.wake(&self.layout.groups[group].wake_deferred);
    }
}

/// Where a spawn puts its task.
#[derive(Clone, Copy)]
enum Where {
    Immediate,
    Deferred,
    DeferredOn(usize),
}

/// Accounting of finished tasks not yet subtracted from their request's `pending`.
#[derive(Clone, Copy)]
struct Run {
    req: Option<ReqRef>,
    node: usize,
    count: usize,
}

/// A worker's context, handed to every task it runs: spawn more tasks of the same request, open a
/// scope, ask where you run.
pub struct Ctx {
    shared: Arc<Shared>,
    w: usize,
    group: usize,
    node_slot: usize,
    local: Local<Task>,
    rr: Cell<usize>,
    on_rr: Cell<usize>,
    current: Cell<Option<ReqRef>>,
    run: Cell<Run>,
    /// Scope waits this worker is nested in (each may run other tasks while it waits).
    depth: Cell<u32>,
}

/// Beyond this many nested scope waits, scoped spawns run inline: a waiting worker runs any
/// task, which may open a scope and wait again, so without a bound the nesting (and the stack)
/// could grow with the number of queued tasks rather than with the program's own nesting.
const MAX_SCOPE_DEPTH: u32 = 48;

struct Live<'a>(&'a Ctx);

impl QueueView for Live<'_> {
    #[inline]
    fn immediate_nonempty(&self, w: usize) -> bool {
        if w == self.0.w {
            !self.0.local.is_empty()
        } else {
            !self.0.shared.stealers[w].is_empty()
        }
    }
    #[inline]
    fn deferred_requests(&self, g: usize) -> usize {
        self.0.shared.groups[g].deferred.requests()
    }
    #[inline]
    fn shared_deferred_nonempty(&self) -> bool {
        !self.0.shared.fifo.is_empty()
    }
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
    pub fn layout(&self) -> &Layout {
        &self.shared.layout
    }
    fn req(&self) -> ReqRef {
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
        self.push(Where::Immediate, Box::new(f));
    }
    /// Spawns a deferred task: into this group's deferred queue (LAS) or the shared FIFO (NLS);
    /// it runs when a worker is free and may travel to another node. Use for detached work and for
    /// work that will spawn much more.
    pub fn spawn_deferred(&self, f: impl FnOnce(&Ctx) + Send + 'static) {
        self.push(Where::Deferred, Box::new(f));
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
        self.push(Where::DeferredOn(g), Box::new(f));
        Ok(())
    }

    fn group_on(&self, node: u32) -> Result<usize, SchedError> {
        let l = &self.shared.layout;
        if node == self.node() {
            return Ok(self.group);
        }
        let gs: Vec<usize> = l.groups_of(node).collect();
        if gs.is_empty() {
            return Err(SchedError::UnknownNode {
                node,
                valid: l
                    .nodes
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            });
        }
        let k = self.on_rr.get();
        self.on_rr.set(k.wrapping_add(1));
        Ok(gs[k % gs.len()])
    }

    fn push(&self, wh: Where, job: Job) {
        let req = self.req();
        // SAFETY: the running task keeps its request alive. Relaxed: the push below publishes
        // the task with release, so whoever runs it sees this increment first.
        let st = unsafe { req.state() };
        st.pending.fetch_add(1, Ordering::Relaxed);
        let task = Task {
            job,
            req,
            spawner: self.w as u32,
        };
        let sh = &*self.shared;
        let lg = &sh.layout.groups;
        match wh {
            Where::Immediate => {
                self.local.push(task);
                if sh.las {
                    sh.wake(&lg[self.group].wake_immediate);
                } else {
                    sh.wake(&lg[self.group].wake_deferred);
                }
            }
            _ if !sh.las => {
                sh.fifo.push(task);
                sh.wake(&lg[self.group].wake_deferred);
            }
            Where::Deferred => {
                sh.groups[self.group].deferred.push(st.id, task);
                sh.wake(&lg[self.group].wake_deferred);
            }
            Where::DeferredOn(g) => {
                sh.groups[g].deferred.push(st.id, task);
                sh.wake(&lg[g].wake_deferred);
            }
        }
    }

    /// Finds the next task by the scheduler's rules, or `None` when every queue it may take from
    /// looks empty.
    fn find(&self) -> Option<Task> {
        let sh = &*self.shared;
        loop {
            let view = Live(self);
            let pick = if sh.las {
                choose_las(&sh.layout, self.w, &view, self.rr.get())
            } else {
                choose_nls(&sh.layout, self.w, &view)
            }?;
            let got = match pick {
                Pick::OwnImmediate => self.local.pop(),
                Pick::GroupImmediate { victim } | Pick::Steal { victim } => {
                    sh.stealers[victim].steal()
                }
                Pick::NodeImmediate { victim, cursor } => {
                    let t = sh.stealers[victim].steal();
                    if t.is_some() {
                        self.rr.set(cursor);
                    }
                    t
                }
                Pick::OwnDeferred => sh.groups[self.group].deferred.take(Take::YoungestOfOldest),
                Pick::RemoteDeferred { group, .. } => {
                    sh.groups[group].deferred.take(Take::OldestOfSecond)
                }
                Pick::SharedDeferred => sh.fifo.steal(),
            };
            if let Some(t) = got {
                let rule = pick.rule(sh.las) as usize;
                bump(&sh.counters[self.w].found[rule]);
                return Some(t);
            }
        }
    }

    /// Subtracts the finished tasks of the current run from their request.
    fn flush(&self) {
        let r = self.run.get();
        if let (Some(req), true) = (r.req, r.count > 0) {
            // SAFETY: the unaccounted count keeps the request alive until `finish`.
            let st = unsafe { req.state() };
            st.nodes[r.node].fetch_add(r.count as u64, Ordering::Relaxed);
            self.run.set(Run {
                req: None,
                node: 0,
                count: 0,
            });
            self.shared.finish(req, r.count);
        }
    }

    #[inline]
    fn switch_to(&self, req: ReqRef, node: usize) {
        let r = self.run.get();
        if r.req != Some(req) || r.node != node {
            self.flush();
            self.run.set(Run {
                req: Some(req),
                node,
                count: 0,
            });
        }
    }

    fn exec_node(&self) -> usize {
        if !self.shared.unpinned {
            return self.node_slot;
        }
        #[cfg(not(loom))]
        if let Ok(cpu) = loci_place::sys::current_cpu() {
            if let Some(&n) = self.shared.layout.cpu_node.get(cpu as usize) {
                if n != u32::MAX {
                    return n as usize;
                }
            }
        }
        self.node_slot
    }

    fn execute(&self, t: Task) {
        let Task { job, req, spawner } = t;
        let sh = &*self.shared;
        let c = &sh.counters[self.w];
        if spawner != EXTERNAL && spawner as usize != self.w {
            let l = &sh.layout.workers;
            let (a, b) = (&l[spawner as usize], &l[self.w]);
            let k = if a.group == b.group {
                0
            } else if a.node == b.node {
                1
            } else {
                2
            };
            bump(&c.steals[k]);
        }
        let node = self.exec_node();
        self.switch_to(req, node);
        let prev = self.current.replace(Some(req));
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| job(self))) {
            // SAFETY: this task is still counted in `pending`.
            unsafe { req.state() }.fail(panic_message(&*p));
        }
        self.current.set(prev);
        if let Some(h) = &sh.on_task_finished {
            h(self.w);
        }
        self.switch_to(req, node);
        let mut r = self.run.get();
        r.count += 1;
        self.run.set(r);
        bump(&c.tasks);
    }

    /// Runs `f` with a scope: tasks spawned into it may borrow from the caller's stack, and
    /// `scope` returns only when all of them have finished. Meanwhile this worker keeps running
    /// tasks (its own first, by the scheduler's rules). A panic in a scoped task is re-raised here.
    pub fn scope<'s, R>(&self, f: impl FnOnce(&Scope<'s>) -> R) -> R {
        let core = ScopeCore {
            pending: AtomicUsize::new(1),
            panic: Mutex::new(None),
            done: Mutex::new(false),
            cv: Condvar::new(),
        };
        let s = Scope {
            ctx: self,
            core: &core,
            _marker: PhantomData,
        };
        let r = catch_unwind(AssertUnwindSafe(|| f(&s)));
        if core.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
            self.depth.set(self.depth.get() + 1);
            while core.pending.load(Ordering::Acquire) != 0 {
                match self.find() {
                    Some(t) => self.execute(t),
                    None => {
                        self.flush();
                        break;
                    }
                }
            }
            self.depth.set(self.depth.get() - 1);
            // The last child sets `done` under the lock; waiting for it (even when `pending`
            // already reads 0) guarantees no child touches `core` after we return.
            let mut d = lock(&core.done);
            while !*d {
                d = wait(&core.cv, d);
            }
        }
        if let Some(p) = lock(&core.panic).take() {
            resume_unwind(p);
        }
        match r {
            Ok(v) => v,
            Err(p) => resume_unwind(p),
        }
    }

    /// A parallel loop over morsels: each item becomes a deferred task, queued on a group of its
    /// home node (`home` returns `None` or a node without workers: this worker's group), and the
    /// call returns when all have run. Under LAS the morsels run preferably on their home node.
    pub fn for_each_morsel<M, I, H, B>(&self, items: I, home: H, body: B)
    where
        M: Send,
        I: IntoIterator<Item = M>,
        H: Fn(&M) -> Option<u32>,
        B: Fn(&Ctx, M) + Sync,
    {
        let body = &body;
        self.scope(|s| {
            for m in items {
                let target = home(&m)
                    .and_then(|n| self.group_on(n).ok())
                    .unwrap_or(self.group);
                s.spawn_at(Where::DeferredOn(target), move |s| body(s.ctx(), m));
            }
        });
    }
}

struct ScopeCore {
    pending: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    done: Mutex<bool>,
    cv: Condvar,
}

struct SendPtr<T>(*const T);
// SAFETY: only used for `ScopeCore`, which is Sync; the scope outlives every use (see Scope).
unsafe impl<T> Send for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(&self) -> *const T {
        self.0
    }
}

/// A scope opened by [`Ctx::scope`]: spawn tasks that may borrow data living for `'s`.
pub struct Scope<'s> {
    ctx: *const Ctx,
    core: *const ScopeCore,
    /// Invariant in `'s`, like rayon's scope.
    _marker: PhantomData<&'s mut &'s ()>,
}

impl<'s> Scope<'s> {
    /// The context of the worker running the current task.
    pub fn ctx(&self) -> &Ctx {
        // SAFETY: a Scope is only handed out (by reference) while its ctx's worker runs the call.
        unsafe { &*self.ctx }
    }
    /// [`Ctx::spawn_immediate`] inside the scope.
    pub fn spawn_immediate(&self, f: impl FnOnce(&Scope<'s>) + Send + 's) {
        self.spawn_at(Where::Immediate, f)
    }
    /// [`Ctx::spawn_deferred`] inside the scope.
    pub fn spawn_deferred(&self, f: impl FnOnce(&Scope<'s>) + Send + 's) {
        self.spawn_at(Where::Deferred, f)
    }
    /// [`Ctx::spawn_deferred_on`] inside the scope.
    pub fn spawn_deferred_on(
        &self,
        node: u32,
        f: impl FnOnce(&Scope<'s>) + Send + 's,
    ) -> Result<(), SchedError> {
        let g = self.ctx().group_on(node)?;
        self.spawn_at(Where::DeferredOn(g), f);
        Ok(())
    }

    fn spawn_at(&self, wh: Where, f: impl FnOnce(&Scope<'s>) + Send + 's) {
        // SAFETY: the scope is alive while `self` is (see `ctx`).
        let core = unsafe { &*self.core };
        core.pending.fetch_add(1, Ordering::Relaxed);
        let cp = SendPtr(self.core);
        let job = move |ctx: &Ctx| {
            let core_ptr = cp.get();
            // SAFETY: `Ctx::scope` does not return before `pending` is 0 and `done` is set, which
            // happens only after this job decremented it below.
            let core = unsafe { &*core_ptr };
            let s = Scope {
                ctx,
                core: core_ptr,
                _marker: PhantomData,
            };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(&s))) {
                lock(&core.panic).get_or_insert(p);
            }
            if core.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                let mut d = lock(&core.done);
                *d = true;
                core.cv.notify_all();
            }
        };
        let job: Box<dyn FnOnce(&Ctx) + Send + 's> = Box::new(job);
        // SAFETY: only the lifetime is erased; the job runs (and drops its captures) before the
        // scope returns, so nothing borrowed for `'s` is used after `'s` ends.
        let job: Job = unsafe { std::mem::transmute(job) };
        let ctx = self.ctx();
        if ctx.depth.get() >= MAX_SCOPE_DEPTH {
            // Deep in nested waits: run it now, on this stack (it is counted in the scope only).
            let req = ctx.req();
            // SAFETY: the running task keeps its request alive.
            unsafe { req.state() }
                .pending
                .fetch_add(1, Ordering::Relaxed);
            ctx.execute(Task {
                job,
                req,
                spawner: ctx.w as u32,
            });
        } else {
            ctx.push(wh, job);
        }
    }
}

/// A submitted request: wait for its result.
pub struct RequestHandle<T> {
    state: Arc<RequestState>,
    slot: Arc<Mutex<Option<T>>>,
}

/// Why a request produced no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request {request} failed: a task panicked: {message}")]
    Panicked { request: u64, message: String },
    #[error("request {request}: wait() called on a worker thread of the scheduler would block it (use Ctx::scope inside tasks)")]
    WaitOnWorker { request: u64 },
}

#[cfg(not(loom))]
thread_local! {
    static ON_WORKER: Cell<bool> = const { Cell::new(false) };
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

/// The scheduler: one worker pool per core group. Dropping it lets the workers finish every
/// queued task, then joins them.
pub struct Scheduler {
    shared: Arc<Shared>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Scheduler {
    /// Starts the workers for `topo` (allowed, online cpus only).
    pub fn new(topo: &loci_topo::Topology, config: Config) -> Result<Scheduler, SchedError> {
        let layout = Layout::new(topo, config.cache_level)?;
        let unpinned = config.policy == Policy::Unpinned;
        let affinity = if unpinned {
            Affinity::None
        } else {
            config.affinity
        };
        let nw = layout.workers.len();
        let mut locals = Vec::with_capacity(nw);
        let mut stealers = Vec::with_capacity(nw);
        for _ in 0..nw {
            let (l, s) = local();
            locals.push(l);
            stealers.push(s);
        }
        let groups = layout
            .groups
            .iter()
            .map(|_| {
                CachePadded::new(GroupState {
                    deferred: DeferredQueue::new(),
                    sleep: Mutex::new(SleepState {
                        sleeping: 0,
                        tokens: 0,
                    }),
                    cv: Condvar::new(),
                    sleepy: AtomicUsize::new(0),
                })
            })
            .collect();
        let node_ids: Arc<[u32]> = layout.nodes.clone().into();
        let shared = Arc::new(Shared {
            las: config.policy == Policy::Las,
            unpinned,
            groups,
            stealers,
            fifo: Fifo::new(),
            sleepers: CachePadded::new(AtomicUsize::new(0)),
            shutdown: AtomicBool::new(false),
            next_request: AtomicU64::new(0),
            next_group: AtomicUsize::new(0),
            counters: (0..nw).map(|_| CachePadded::default()).collect(),
            records: Mutex::new(VecDeque::new()),
            max_records: config.max_request_records,
            node_ids,
            on_task_finished: config.on_task_finished.clone(),
            on_worker_start: config.on_worker_start.clone(),
            spin_rounds: config.spin_rounds,
            layout,
        });
        let mut sched = Scheduler {
            shared: shared.clone(),
            threads: Vec::with_capacity(nw),
        };
        #[cfg(not(loom))]
        let (tx, rx) = std::sync::mpsc::channel::<Result<(), SchedError>>();
        for (w, local) in locals.into_iter().enumerate() {
            let sh = shared.clone();
            let slot = &sh.layout.workers[w];
            let (group, node) = (slot.group, slot.node);
            let node_slot = sh.layout.node_index(node).expect("node of a group");
            let pin = match affinity {
                Affinity::Group => Some(sh.layout.groups[group].cpus.clone()),
                Affinity::Cpu => Some(loci_topo::CpuSet::single(slot.cpu)),
                Affinity::None => None,
            };
            #[cfg(not(loom))]
            let tx = tx.clone();
            #[cfg(not(loom))]
            let sh_stack = config.stack_size;
            let body = move || {
                #[cfg(not(loom))]
                {
                    let r = match &pin {
                        Some(cpus) => loci_place::sys::set_affinity(0, cpus).map_err(|e| {
                            SchedError::Affinity {
                                worker: w,
                                cpus: cpus.to_string(),
                                reason: e.to_string(),
                            }
                        }),
                        None => Ok(()),
                    };
                    let ok = r.is_ok();
                    let _ = tx.send(r);
                    drop(tx);
                    if !ok {
                        return;
                    }
                    ON_WORKER.with(|f| f.set(true));
                }
                #[cfg(loom)]
                let _ = pin;
                let ctx = Ctx {
                    shared: sh,
                    w,
                    group,
                    node_slot,
                    local,
                    rr: Cell::new(usize::MAX),
                    on_rr: Cell::new(0),
                    current: Cell::new(None),
                    run: Cell::new(Run {
                        req: None,
                        node: 0,
                        count: 0,
                    }),
                    depth: Cell::new(0),
                };
                if let Some(h) = &ctx.shared.on_worker_start {
                    h(w);
                }
                worker_loop(&ctx);
            };
            #[cfg(not(loom))]
            let h = thread::Builder::new()
                .name(format!("loci-w{w}"))
                .stack_size(sh_stack)
                .spawn(body)
                .map_err(|e| SchedError::Spawn(e.to_string()))?;
            #[cfg(loom)]
            let h = thread::spawn(body);
            sched.threads.push(h);
        }
        #[cfg(not(loom))]
        {
            drop(tx);
            for r in rx.iter() {
                r?; // Drop of `sched` stops the workers that did start.
            }
        }
        Ok(sched)
    }

    /// Submits a request: `f` runs as its first (deferred) task, queued on the next core group in
    /// round robin; the handle yields `f`'s result once every task the request spawned is done.
    pub fn submit<T, F>(&self, f: F) -> RequestHandle<T>
    where
        T: Send + 'static,
        F: FnOnce(&Ctx) -> T + Send + 'static,
    {
        let ng = self.shared.layout.groups.len();
        let g = self.shared.next_group.fetch_add(1, Ordering::Relaxed) % ng;
        self.submit_to(g, f)
    }

    /// Submits a request whose first task is queued on a group of `node`.
    pub fn submit_on<T, F>(&self, node: u32, f: F) -> Result<RequestHandle<T>, SchedError>
    where
        T: Send + 'static,
        F: FnOnce(&Ctx) -> T + Send + 'static,
    {
        let l = &self.shared.layout;
        let gs: Vec<usize> = l.groups_of(node).collect();
        if gs.is_empty() {
            return Err(SchedError::UnknownNode {
                node,
                valid: l
                    .nodes
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            });
        }
        let k = self.shared.next_group.fetch_add(1, Ordering::Relaxed);
        Ok(self.submit_to(gs[k % gs.len()], f))
    }

    fn submit_to<T, F>(&self, group: usize, f: F) -> RequestHandle<T>
    where
        T: Send + 'static,
        F: FnOnce(&Ctx) -> T + Send + 'static,
    {
        let sh = &*self.shared;
        let id = sh.next_request.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(RequestState {
            id,
            pending: CachePadded::new(AtomicUsize::new(1)),
            failed: AtomicBool::new(false),
            panic_msg: Mutex::new(None),
            done: Mutex::new(false),
            done_cv: Condvar::new(),
            nodes: sh.node_ids.iter().map(|_| AtomicU64::new(0)).collect(),
            node_ids: sh.node_ids.clone(),
        });
        let slot = Arc::new(Mutex::new(None));
        let s2 = slot.clone();
        let job: Job = Box::new(move |ctx: &Ctx| {
            let v = f(ctx);
            *lock(&s2) = Some(v);
        });
        sh.submit_job(group, &state, job);
        RequestHandle { state, slot }
    }

    /// The layout: groups, workers, scan orders.
    pub fn layout(&self) -> &Layout {
        &self.shared.layout
    }
    /// Whether this scheduler runs LAS, NLS or unpinned.
    pub fn policy(&self) -> Policy {
        if self.shared.las {
            Policy::Las
        } else if self.shared.unpinned {
            Policy::Unpinned
        } else {
            Policy::Nls
        }
    }

    /// Counters since the start (take two and use [`Stats::since`] for one run).
    pub fn stats(&self) -> Stats {
        let sh = &*self.shared;
        let mut s = Stats::default();
        for c in &sh.counters {
            s.tasks += c.tasks.load(Ordering::Relaxed);
            for (f, x) in s.found.iter_mut().zip(&c.found) {
                *f += x.load(Ordering::Relaxed);
            }
            s.steals.same_group += c.steals[0].load(Ordering::Relaxed);
            s.steals.same_node += c.steals[1].load(Ordering::Relaxed);
            s.steals.other_node += c.steals[2].load(Ordering::Relaxed);
        }
        s.requests = lock(&sh.records).iter().cloned().collect();
        s
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::SeqCst);
        for g in &sh.groups {
            let _st = lock(&g.sleep);
            g.cv.notify_all();
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker_loop(ctx: &Ctx) {
    let sh = &*ctx.shared;
    'outer: loop {
        if let Some(t) = ctx.find() {
            ctx.execute(t);
            continue;
        }
        ctx.flush();
        for _ in 0..sh.spin_rounds {
            thread::yield_now();
            if let Some(t) = ctx.find() {
                ctx.execute(t);
                continue 'outer;
            }
        }
        if sh.shutdown.load(Ordering::SeqCst) {
            return;
        }
        sleep(ctx);
    }
}

/// Registers as a sleeper of the worker's group, looks once more, then waits for a token (or
/// shutdown).
fn sleep(ctx: &Ctx) {
    let sh = &*ctx.shared;
    let gs = &sh.groups[ctx.group];
    {
        let mut st = lock(&gs.sleep);
        st.sleeping += 1;
        gs.sleepy.store(st.sleeping, Ordering::Relaxed);
    }
    sh.sleepers.fetch_add(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    let found = ctx.find();
    let mut st = lock(&gs.sleep);
    if found.is_none() {
        while st.tokens == 0 && !sh.shutdown.load(Ordering::SeqCst) {
            st = wait(&gs.cv, st);
        }
        if st.tokens > 0 {
            st.tokens -= 1;
        }
    }
    st.sleeping -= 1;
    st.tokens = st.tokens.min(st.sleeping);
    gs.sleepy.store(st.sleeping, Ordering::Relaxed);
    drop(st);
    sh.sleepers.fetch_sub(1, Ordering::SeqCst);
    if let Some(t) = found {
        ctx.execute(t);
    }
}
