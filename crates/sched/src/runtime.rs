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
//!   `Ctx::scope` (which runs tasks while it waits): a blocked worker runs nothing.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout as AllocLayout};
use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::deferred::DeferredQueue;
use crate::layout::Layout;
use crate::rules::{choose_las, choose_nls, Pick, QueueView, Rule, Rule4Class};
use crate::sync::{
    fence, local, lock, thread, wait, AtomicBool, AtomicU64, AtomicUsize, Condvar, Fifo, Local,
    Mutex, Ordering, Stealer,
};
use crate::{Affinity, Config, Policy, SchedError};

/// Spawner index of tasks submitted from outside the pool.
const EXTERNAL: u32 = u32::MAX;

/// Spawn credits a worker reserves in one RMW on a request's `pending` (see module docs).
const CREDIT_BATCH: usize = 64;

/// The start of a task's heap block; the closure follows it (`JobBlock`).
#[repr(C)]
struct JobHeader {
    /// Moves the closure out, frees the block, then runs the closure with the context (`Some`)
    /// or drops it (`None`).
    call: unsafe fn(NonNull<JobHeader>, Option<&Ctx>),
    /// The worker that spawned the task (`EXTERNAL` for submits).
    spawner: u32,
}

#[repr(C)]
struct JobBlock<F> {
    header: JobHeader,
    f: F,
}

/// The size class of small task blocks: blocks that fit are allocated with this layout and
/// recycled through the workers' free lists (`BlockCache`).
const SMALL_BLOCK: AllocLayout = match AllocLayout::from_size_align(64, 16) {
    Ok(l) => l,
    Err(_) => panic!("valid layout"),
};

/// Whether `JobBlock<F>` uses the small size class.
const fn small_block<F>() -> bool {
    std::mem::size_of::<JobBlock<F>>() <= SMALL_BLOCK.size()
        && std::mem::align_of::<JobBlock<F>>() <= SMALL_BLOCK.align()
}

/// A worker's free list of small task blocks. Hand-written because a task block is allocated on
/// one worker and freed on whichever runs it, one per task: glibc's per-thread cache keeps only 7
/// blocks per size, so a spawning worker falls through to the arena on most spawns (a third of
/// the cost of an empty task, measured with perf). Bounded, so blocks that travel to a worker
/// that only consumes go back to the global allocator beyond `BLOCK_CACHE_MAX`.
struct BlockCache {
    free: UnsafeCell<Vec<NonNull<u8>>>,
}

const BLOCK_CACHE_MAX: usize = 256;

impl BlockCache {
    fn new() -> BlockCache {
        BlockCache {
            free: UnsafeCell::new(Vec::with_capacity(BLOCK_CACHE_MAX)),
        }
    }

    /// A small block (uninitialised).
    #[inline]
    fn alloc(&self) -> NonNull<u8> {
        // SAFETY: a BlockCache belongs to one worker's Ctx, which only its thread uses (Ctx is
        // not Sync), and no reference into `free` outlives this call.
        if let Some(p) = unsafe { &mut *self.free.get() }.pop() {
            return p;
        }
        alloc_small()
    }

    /// Gives back a small block (its contents already moved out).
    #[inline]
    fn free(&self, p: NonNull<u8>) {
        // SAFETY: as in `alloc`.
        let v = unsafe { &mut *self.free.get() };
        if v.len() < BLOCK_CACHE_MAX {
            v.push(p); // within the capacity reserved in `new`: no reallocation
        } else {
            // SAFETY: every small block is allocated with SMALL_BLOCK.
            unsafe { dealloc(p.as_ptr(), SMALL_BLOCK) };
        }
    }
}

impl Drop for BlockCache {
    fn drop(&mut self) {
        for p in self.free.get_mut().drain(..) {
            // SAFETY: every small block is allocated with SMALL_BLOCK.
            unsafe { dealloc(p.as_ptr(), SMALL_BLOCK) };
        }
    }
}

fn alloc_small() -> NonNull<u8> {
    // SAFETY: SMALL_BLOCK has a nonzero size.
    let p = unsafe { alloc(SMALL_BLOCK) };
    NonNull::new(p).unwrap_or_else(|| handle_alloc_error(SMALL_BLOCK))
}

/// SAFETY: `p` points to the header of a `JobBlock<F>` made by `Task::new_unchecked`, and this
/// is the block's only use (it is freed here). `ctx`, when given, is the running worker's.
unsafe fn call_block<F: FnOnce(&Ctx)>(p: NonNull<JobHeader>, ctx: Option<&Ctx>) {
    let block = p.as_ptr() as *mut JobBlock<F>;
    // SAFETY: see the function contract; the closure is moved out exactly once, then the block
    // is freed with the layout it was allocated with.
    let f = unsafe { std::ptr::addr_of!((*block).f).read() };
    if small_block::<F>() {
        match ctx {
            Some(c) => c.blocks.free(p.cast()),
            // SAFETY: small blocks are allocated with SMALL_BLOCK.
            None => unsafe { dealloc(p.as_ptr().cast(), SMALL_BLOCK) },
        }
    } else {
        // SAFETY: large blocks are allocated with their own layout.
        unsafe { dealloc(p.as_ptr().cast(), AllocLayout::new::<JobBlock<F>>()) };
    }
    if let Some(ctx) = ctx {
        f(ctx);
    }
}

/// A queued task (16 bytes): its heap block and its request.
pub(crate) struct Task {
    job: NonNull<JobHeader>,
    req: ReqRef,
}

// SAFETY: the closure in the block is `Send` (required by every constructor), and the request
// pointer is `Send` (see ReqRef).
unsafe impl Send for Task {}

impl Task {
    /// SAFETY: whatever `f` borrows must outlive the task's run (or drop); `'static` closures
    /// always qualify, scoped ones because the scope waits for them. `cache`, when given, is the
    /// calling worker's.
    #[inline]
    unsafe fn new_unchecked<F: FnOnce(&Ctx) + Send>(
        f: F,
        req: ReqRef,
        spawner: u32,
        cache: Option<&BlockCache>,
    ) -> Task {
        let p: NonNull<JobBlock<F>> = if small_block::<F>() {
            cache.map_or_else(alloc_small, BlockCache::alloc).cast()
        } else {
            let l = AllocLayout::new::<JobBlock<F>>();
            // SAFETY: a JobBlock has a nonzero size (its header).
            NonNull::new(unsafe { alloc(l) })
                .unwrap_or_else(|| handle_alloc_error(l))
                .cast()
        };
        // SAFETY: `p` is a fresh allocation with room and alignment for a JobBlock<F>.
        unsafe {
            p.as_ptr().write(JobBlock {
                header: JobHeader {
                    call: call_block::<F>,
                    spawner,
                },
                f,
            })
        };
        Task { job: p.cast(), req }
    }

    #[inline]
    fn new<F: FnOnce(&Ctx) + Send + 'static>(
        f: F,
        req: ReqRef,
        spawner: u32,
        cache: Option<&BlockCache>,
    ) -> Task {
        // SAFETY: a 'static closure borrows nothing.
        unsafe { Task::new_unchecked(f, req, spawner, cache) }
    }

    #[inline]
    fn spawner(&self) -> u32 {
        // SAFETY: the block lives until the task is run or dropped.
        unsafe { self.job.as_ref() }.spawner
    }

    /// Runs the closure on `ctx` (the block is freed before the closure runs).
    #[inline]
    fn run(self, ctx: &Ctx) {
        let p = self.job;
        std::mem::forget(self);
        // SAFETY: the block is live and used once, here.
        unsafe {
            let call = p.as_ref().call;
            call(p, Some(ctx));
        }
    }
}

impl Drop for Task {
    /// A task dropped without running (never in normal operation: the workers drain every queue
    /// before they exit) frees its closure; its request then never completes.
    fn drop(&mut self) {
        // SAFETY: the block is live and used once, here.
        unsafe {
            let call = self.job.as_ref().call;
            call(self.job, None);
        }
    }
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

/// `RequestState::share_epoch` of a request submitted into a crowd (never shareable).
const CROWDED: u64 = u64::MAX;

pub(crate) struct RequestState {
    id: u64,
    pending: CachePadded<AtomicUsize>,
    /// Some task of the request has started running (rule 4 moves only requests that have not).
    started: AtomicBool,
    /// The crowd epoch (`Shared::crowd_epoch`) when the request was submitted, `CROWDED` if at
    /// least as many requests as nodes were live then. Rule 4 lets other nodes share a started
    /// request only while the scheduler's epoch still equals this (no crowd since its submit)
    /// and fewer requests than nodes are live (see `rules::Rule4Class`).
    share_epoch: u64,
    /// [`RequestOptions::stay_on_node`]: no worker of another node takes a task of it.
    stay_on_node: bool,
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
    /// Queued tasks that rule 4 moved to the thief's group along with the task it stole.
    pub migrated: u64,
    /// Times a worker parked (slept on its group's condition variable after finding no work).
    pub parks: u64,
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
            migrated: self.migrated - earlier.migrated,
            parks: self.parks - earlier.parks,
            found,
            steals: Steals {
                same_group: self.steals.same_group - earlier.steals.same_group,
                same_node: self.steals.same_node - earlier.steals.same_node,
                other_node: self.steals.other_node - earlier.steals.other_node,
            },
            requests: self
                .requests
                .iter()
                .filter(|r| !matches!(last, Some(l) if r.id <= l))
                .cloned()
                .collect(),
        }
    }
}

#[derive(Default)]
struct WorkerCounters {
    tasks: AtomicU64,
    migrated: AtomicU64,
    parks: AtomicU64,
    found: [AtomicU64; 8],
    steals: [AtomicU64; 3],
}

/// Adds one to a counter that only its worker writes (a plain load and store, no locked RMW).
#[inline]
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

struct SleepState {
    /// Workers waiting on the condition variable (with or without a token).
    parked: usize,
    /// Wake-ups handed out and not yet taken by a parked worker.
    tokens: usize,
}

/// Fields of `GroupState::word`: workers announced sleepy and still scanning (bits 0-15),
/// parked workers without a wake token (bits 16-31), the jobs event counter (bits 32-63; wraps).
const SEARCHING: u64 = 1;
const WAKEABLE: u64 = 1 << 16;
const JEC: u64 = 1 << 32;

#[inline]
fn searching(w: u64) -> u64 {
    w & 0xFFFF
}
#[inline]
fn wakeable(w: u64) -> u64 {
    (w >> 16) & 0xFFFF
}

struct GroupState {
    deferred: DeferredQueue<Task>,
    sleep: Mutex<SleepState>,
    cv: Condvar,
    /// Searching and wakeable workers and the jobs event counter (see `sleep`).
    word: AtomicU64,
}

pub(crate) struct Shared {
    pub(crate) layout: Layout,
    las: bool,
    unpinned: bool,
    /// Rule 4 moves the rest of the stolen request along (Config::migrate_requests).
    migrate: bool,
    groups: Vec<CachePadded<GroupState>>,
    stealers: Vec<Stealer<Task>>,
    fifo: Fifo<Task>,
    /// Workers inside the sleep protocol (announced sleepy, parked, or just woken): a spawner
    /// that reads 0 here has nobody to wake and stops.
    idle: CachePadded<AtomicUsize>,
    /// Requests submitted and not finished.
    live: CachePadded<AtomicUsize>,
    /// How many times the live requests reached the number of nodes (see `share_epoch`).
    crowd_epoch: AtomicU64,
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
    /// After publishing a task: makes sure a worker of the groups in `order` (first the
    /// preferred) will look for it. `strict`: nobody else is bound to look (the task went into
    /// another group's queue or came from outside), so fence first (see module docs).
    #[inline]
    fn notify(&self, order: &[usize], strict: bool) {
        if strict {
            fence(Ordering::SeqCst);
        }
        if self.idle.load(Ordering::Acquire) == 0 {
            return;
        }
        self.notify_slow(order);
    }

    #[cold]
    fn notify_slow(&self, order: &[usize]) {
        for &g in order {
            let gs = &self.groups[g];
            let mut w = gs.word.load(Ordering::Acquire);
            if searching(w) > 0 {
                // A sleepy worker of this group is scanning: make it scan again before it parks
                // (it will see the task, or be running another one and look again after). The
                // RMW reads the latest word: if no worker is still searching by then, they all
                // parked with the old counter and one must be woken instead.
                w = gs.word.fetch_add(JEC, Ordering::SeqCst);
                if searching(w) > 0 {
                    return;
                }
            }
            if wakeable(w) == 0 {
                continue;
            }
            let mut st = lock(&gs.sleep);
            if st.parked > st.tokens {
                st.tokens += 1;
                gs.word.fetch_sub(WAKEABLE, Ordering::SeqCst);
                gs.cv.notify_one();
                return;
            }
        }
    }

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
    fn rule4_class(&self, st: &RequestState, same_node: bool) -> Rule4Class {
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
    fn deferred_order(&self, g: usize, st: &RequestState) -> &[usize] {
        let grp = &self.layout.groups[g];
        if self.remote_ok(st) {
            &grp.wake_deferred
        } else {
            &grp.wake_immediate
        }
    }

    /// Accounts `n` finished tasks of `r`; the last one completes the request.
    fn finish(&self, r: ReqRef, n: usize) {
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

    fn submit_job<F: FnOnce(&Ctx) + Send + 'static>(
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

/// Where a spawn puts its task.
#[derive(Clone, Copy)]
enum Where {
    Immediate,
    Deferred,
    DeferredOn(usize),
}

/// Accounting of a run of tasks of one request on one worker: finished tasks not yet subtracted
/// from the request's `pending`, and spawn credits reserved in it and not used yet.
#[derive(Clone, Copy)]
struct Run {
    req: Option<ReqRef>,
    node: usize,
    count: usize,
    credit: usize,
}

const NO_RUN: Run = Run {
    req: None,
    node: 0,
    count: 0,
    credit: 0,
};

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
    /// Groups where rule 4 found nothing it may take during the current search (bit per group).
    skip: Box<[Cell<u64>]>,
    /// Whether any bit of `skip` is set.
    skipping: Cell<bool>,
    /// Recycled small task blocks.
    blocks: BlockCache,
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
        if self.0.skipping.get() && self.0.skip[g / 64].get() & (1 << (g % 64)) != 0 {
            return 0;
        }
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

    /// Queues a task of the running request and wakes a worker for it if one sleeps.
    #[inline]
    fn push(&self, wh: Where, task: Task) {
        let req = task.req;
        // SAFETY: the running task keeps its request alive.
        let st = unsafe { req.state() };
        self.spend_credit(req);
        let sh = &*self.shared;
        let lg = &sh.layout.groups;
        match wh {
            Where::Immediate => {
                self.local.push(task);
                if sh.las {
                    sh.notify(&lg[self.group].wake_immediate, false);
                } else {
                    sh.notify(&lg[self.group].wake_deferred, false);
                }
            }
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

    /// Counts one more task of `req` in its `pending` before the task becomes visible: from this
    /// worker's reserved credits, reserving a batch when none is left.
    #[inline]
    fn spend_credit(&self, req: ReqRef) {
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

    /// Finds the next task by the scheduler's rules, or `None` when every queue it may take from
    /// looks empty.
    fn find(&self) -> Option<Task> {
        let sh = &*self.shared;
        // Rule 1 (both policies) without building the view: a pop of the own queue is exactly
        // what the rule functions choose first whenever that queue is nonempty.
        if let Some(t) = self.local.pop() {
            let rule = Pick::OwnImmediate.rule(sh.las) as usize;
            bump(&sh.counters[self.w].found[rule]);
            return Some(t);
        }
        let t = self.find_by_rules();
        if self.skipping.get() {
            self.skipping.set(false);
            for c in self.skip.iter() {
                c.set(0);
            }
        }
        t
    }

    fn find_by_rules(&self) -> Option<Task> {
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
                Pick::OwnDeferred => sh.groups[self.group].deferred.take_own(),
                Pick::RemoteDeferred { group, .. } => {
                    let same_node = sh.layout.groups[group].node == self.node();
                    // SAFETY (closure): a queued task keeps its request alive.
                    let got = sh.groups[group].deferred.take_remote(sh.migrate, |t| {
                        sh.rule4_class(unsafe { t.req.state() }, same_node)
                    });
                    match got {
                        Some((t, id, rest)) => {
                            if !rest.is_empty() {
                                let c = &sh.counters[self.w].migrated;
                                c.store(
                                    c.load(Ordering::Relaxed) + rest.len() as u64,
                                    Ordering::Relaxed,
                                );
                                sh.groups[self.group].deferred.push_all(id, rest);
                                sh.notify(&sh.layout.groups[self.group].wake_immediate, false);
                            }
                            Some(t)
                        }
                        None => {
                            // Nothing here this worker may take (or the queue just emptied):
                            // rule 4 goes on to the next group.
                            let cell = &self.skip[group / 64];
                            cell.set(cell.get() | 1 << (group % 64));
                            self.skipping.set(true);
                            None
                        }
                    }
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

    /// Subtracts the finished tasks and the unused spawn credits of the current run from its
    /// request.
    fn flush(&self) {
        let r = self.run.get();
        if let Some(req) = r.req {
            self.run.set(NO_RUN);
            if r.count > 0 {
                // SAFETY: the unaccounted count keeps the request alive until `finish`.
                let st = unsafe { req.state() };
                st.nodes[r.node].fetch_add(r.count as u64, Ordering::Relaxed);
            }
            if r.count + r.credit > 0 {
                self.shared.finish(req, r.count + r.credit);
            }
        }
    }

    #[inline]
    fn switch_to(&self, req: ReqRef, node: usize) {
        let r = self.run.get();
        if r.req != Some(req) || r.node != node {
            self.flush();
            // The first task of a run of `req` on this worker: mark the request started (rule 4
            // moves only requests that have not). Here rather than per task: off the fast path.
            // SAFETY: the caller is about to run a task of `req` (or spawn one from a running
            // task of it), which keeps it alive.
            let started = &unsafe { req.state() }.started;
            if !started.load(Ordering::Relaxed) {
                started.store(true, Ordering::Relaxed);
            }
            self.run.set(Run {
                req: Some(req),
                node,
                count: 0,
                credit: 0,
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
        let req = t.req;
        let spawner = t.spawner();
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
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| t.run(self))) {
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
        let ctx = self.ctx();
        // SAFETY: the job runs (and drops its captures) before the scope returns, so nothing
        // borrowed for `'s` is used after `'s` ends.
        let task = unsafe { Task::new_unchecked(job, ctx.req(), ctx.w as u32, Some(&ctx.blocks)) };
        if ctx.depth.get() >= MAX_SCOPE_DEPTH {
            // Deep in nested waits: run it now, on this stack.
            ctx.spend_credit(task.req);
            ctx.execute(task);
        } else {
            ctx.push(wh, task);
        }
    }
}

/// Per-request options ([`Scheduler::submit_with`], [`Scheduler::submit_on_with`]);
/// `RequestOptions::default()` is what [`Scheduler::submit`] uses.
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
    #[error("Scheduler::run called on a worker thread of the scheduler would block it (use Ctx::scope inside tasks)")]
    RunOnWorker,
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
        let ngroups = layout.groups.len();
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
                        parked: 0,
                        tokens: 0,
                    }),
                    cv: Condvar::new(),
                    word: AtomicU64::new(0),
                })
            })
            .collect();
        let node_ids: Arc<[u32]> = layout.nodes.clone().into();
        let shared = Arc::new(Shared {
            las: config.policy == Policy::Las,
            unpinned,
            migrate: config.migrate_requests,
            groups,
            stealers,
            fifo: Fifo::new(),
            idle: CachePadded::new(AtomicUsize::new(0)),
            live: CachePadded::new(AtomicUsize::new(0)),
            crowd_epoch: AtomicU64::new(0),
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
                    run: Cell::new(NO_RUN),
                    depth: Cell::new(0),
                    skip: (0..ngroups.div_ceil(64)).map(|_| Cell::new(0)).collect(),
                    skipping: Cell::new(false),
                    blocks: BlockCache::new(),
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
        self.submit_with(RequestOptions::default(), f)
    }

    /// [`Scheduler::submit`] with per-request options (see [`RequestOptions`]).
    pub fn submit_with<T, F>(&self, opts: RequestOptions, f: F) -> RequestHandle<T>
    where
        T: Send + 'static,
        F: FnOnce(&Ctx) -> T + Send + 'static,
    {
        let ng = self.shared.layout.groups.len();
        let g = self.shared.next_group.fetch_add(1, Ordering::Relaxed) % ng;
        self.submit_to(g, opts, f)
    }

    /// Runs `f` as the first task of a new request and returns its result once every task of
    /// the request has finished. Unlike [`Scheduler::submit`], `f` and its result may borrow from
    /// the caller (the scoped-thread pattern: the caller blocks until the request is done, so
    /// nothing `f` borrowed is used after `run` returns); inside, `ctx.scope` spawns borrowing
    /// tasks. A panic in `f` (or in a scoped task, which the scope re-raises in `f`) is resumed
    /// here with its payload; a panic in an unscoped task of the request fails it with
    /// [`RequestError::Panicked`]. Called on a worker of a scheduler it returns
    /// [`RequestError::RunOnWorker`] (the waiting worker would hold a cpu the request may need).
    pub fn run<'a, R, F>(&self, f: F) -> Result<R, RequestError>
    where
        R: Send + 'a,
        F: FnOnce(&Ctx) -> R + Send + 'a,
    {
        self.run_with(RequestOptions::default(), f)
    }

    /// [`Scheduler::run`] with per-request options (see [`RequestOptions`]).
    pub fn run_with<'a, R, F>(&self, opts: RequestOptions, f: F) -> Result<R, RequestError>
    where
        R: Send + 'a,
        F: FnOnce(&Ctx) -> R + Send + 'a,
    {
        #[cfg(not(loom))]
        if ON_WORKER.with(|w| w.get()) {
            return Err(RequestError::RunOnWorker);
        }
        /// The result slot on the caller's stack, written by the first task.
        struct Out<R>(*mut Option<std::thread::Result<R>>);
        // SAFETY: the slot is written by exactly one task and read by the caller only after the
        // request is done (the request's completion orders the write before the read).
        unsafe impl<R: Send> Send for Out<R> {}
        let mut out: Option<std::thread::Result<R>> = None;
        let slot = Out(&mut out);
        let job = move |ctx: &Ctx| {
            let slot = slot;
            let r = catch_unwind(AssertUnwindSafe(|| f(ctx)));
            // SAFETY: `out` lives on the stack of `run_with`, which does not return before the
            // request is done; nobody else writes it.
            unsafe { *slot.0 = Some(r) };
        };
        let job: Box<dyn FnOnce(&Ctx) + Send + 'a> = Box::new(job);
        // SAFETY: only the lifetime is erased. The first task of a request always runs, exactly
        // once (the scheduler runs every submitted task and lives as long as `&self`), and
        // consumes `f` with every borrow in it; `wait` below returns only after every task of
        // the request has finished, and this function does not return before it.
        let job: Box<dyn FnOnce(&Ctx) + Send + 'static> = unsafe { std::mem::transmute(job) };
        self.submit_with(opts, move |ctx: &Ctx| job(ctx)).wait()?;
        match out
            .take()
            .expect("the first task ran before its request finished")
        {
            Ok(v) => Ok(v),
            Err(p) => resume_unwind(p),
        }
    }

    /// Submits a request whose first task is queued on a group of `node`.
    pub fn submit_on<T, F>(&self, node: u32, f: F) -> Result<RequestHandle<T>, SchedError>
    where
        T: Send + 'static,
        F: FnOnce(&Ctx) -> T + Send + 'static,
    {
        self.submit_on_with(node, RequestOptions::default(), f)
    }

    /// [`Scheduler::submit_on`] with per-request options (see [`RequestOptions`]).
    pub fn submit_on_with<T, F>(
        &self,
        node: u32,
        opts: RequestOptions,
        f: F,
    ) -> Result<RequestHandle<T>, SchedError>
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
        Ok(self.submit_to(gs[k % gs.len()], opts, f))
    }

    fn submit_to<T, F>(&self, group: usize, opts: RequestOptions, f: F) -> RequestHandle<T>
    where
        T: Send + 'static,
        F: FnOnce(&Ctx) -> T + Send + 'static,
    {
        let sh = &*self.shared;
        let id = sh.next_request.fetch_add(1, Ordering::Relaxed);
        // A crowd forms when the live requests reach the number of nodes: from then on rule 4
        // splits none of them (nor any submitted before) across nodes.
        let live = sh.live.fetch_add(1, Ordering::Relaxed) + 1;
        let share_epoch = if live >= sh.layout.nodes.len() {
            if live == sh.layout.nodes.len() {
                sh.crowd_epoch.fetch_add(1, Ordering::Relaxed);
            }
            CROWDED
        } else {
            sh.crowd_epoch.load(Ordering::Relaxed)
        };
        let state = Arc::new(RequestState {
            id,
            pending: CachePadded::new(AtomicUsize::new(1)),
            started: AtomicBool::new(false),
            share_epoch,
            stay_on_node: opts.stay_on_node,
            failed: AtomicBool::new(false),
            panic_msg: Mutex::new(None),
            done: Mutex::new(false),
            done_cv: Condvar::new(),
            nodes: sh.node_ids.iter().map(|_| AtomicU64::new(0)).collect(),
            node_ids: sh.node_ids.clone(),
        });
        let slot = Arc::new(Mutex::new(None));
        let s2 = slot.clone();
        sh.submit_job(group, &state, move |ctx: &Ctx| {
            let v = f(ctx);
            *lock(&s2) = Some(v);
        });
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
            s.migrated += c.migrated.load(Ordering::Relaxed);
            s.parks += c.parks.load(Ordering::Relaxed);
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

/// The two-phase sleep (see module docs): announce sleepy, scan once more, then park unless a
/// spawn bumped the group's jobs event counter meanwhile; wait for a wake token (or shutdown).
/// Returns to the worker loop, which scans again.
fn sleep(ctx: &Ctx) {
    let sh = &*ctx.shared;
    let gs = &sh.groups[ctx.group];
    // Phase 1: sleepy. The group word first, then `idle`: a spawner that sees `idle` > 0 sees
    // this worker in the word (the RMWs are ordered and `idle` is read with acquire).
    let jec = gs.word.fetch_add(SEARCHING, Ordering::SeqCst) >> 32;
    sh.idle.fetch_add(1, Ordering::SeqCst);
    // Pairs with a strict spawner's fence: either it sees this worker, or the scan sees its task.
    fence(Ordering::SeqCst);
    let leave = || {
        gs.word.fetch_sub(SEARCHING, Ordering::SeqCst);
        sh.idle.fetch_sub(1, Ordering::SeqCst);
    };
    if let Some(t) = ctx.find() {
        leave();
        ctx.execute(t);
        return;
    }
    // Phase 2: park, unless a spawn since the announcement asked this group to look again. The
    // CAS is under the group mutex, so a spawner that sees the worker wakeable takes the mutex
    // after the worker waits (or hands a token it will find).
    let mut st = lock(&gs.sleep);
    st.parked += 1;
    loop {
        let w = gs.word.load(Ordering::SeqCst);
        if w >> 32 != jec {
            st.parked -= 1;
            drop(st);
            leave();
            return;
        }
        let parked = w - SEARCHING + WAKEABLE;
        if gs
            .word
            .compare_exchange(w, parked, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            break;
        }
    }
    bump(&sh.counters[ctx.w].parks);
    while st.tokens == 0 && !sh.shutdown.load(Ordering::SeqCst) {
        st = wait(&gs.cv, st);
    }
    if st.tokens > 0 {
        // The waker already took this worker out of the wakeable count.
        st.tokens -= 1;
    } else {
        gs.word.fetch_sub(WAKEABLE, Ordering::SeqCst);
    }
    st.parked -= 1;
    drop(st);
    sh.idle.fetch_sub(1, Ordering::SeqCst);
}
