//! The [`Scheduler`]: starting one worker per cpu of the layout (affinity, hooks), submitting
//! and running requests, the counters, and shutdown on drop.

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use super::ctx::{Ctx, NO_RUN};
#[cfg(not(loom))]
use super::request::ON_WORKER;
use super::request::{RequestError, RequestHandle, RequestOptions, RequestState, CROWDED};
use super::shared::{GroupState, Shared};
use super::sleep::SleepState;
use super::stats::Stats;
use super::task::BlockCache;
use super::worker::worker_loop;
use crate::deferred::DeferredQueue;
use crate::layout::WorkerLayout;
use crate::sync::{
    local, lock, thread, AtomicBool, AtomicU64, AtomicUsize, Condvar, Fifo, Mutex, Ordering,
};
use crate::{Affinity, Config, Policy, SchedError};

/// The scheduler: one worker pool per core group. Dropping it lets the workers finish every
/// queued task, then joins them.
pub struct Scheduler {
    shared: Arc<Shared>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Scheduler {
    /// Starts the workers for `topo` (allowed, online cpus only).
    pub fn new(topo: &loci_topo::Topology, config: Config) -> Result<Scheduler, SchedError> {
        Scheduler::start(WorkerLayout::new(topo, config.cache_level)?, config)
    }

    /// Starts one worker on each cpu of `plan` (loci-place's plan, the handoff from `loci plan`
    /// and the strategies): the workers are grouped by the topology's caches as in
    /// [`Scheduler::new`], over the plan's cpus only. A plan that names cpus not allowed here is
    /// an error.
    pub fn from_plan(
        topo: &loci_topo::Topology,
        plan: &loci_place::Plan,
        config: Config,
    ) -> Result<Scheduler, SchedError> {
        let layout = WorkerLayout::within(topo, config.cache_level, &plan.footprint())?;
        Scheduler::start(layout, config)
    }

    fn start(layout: WorkerLayout, config: Config) -> Result<Scheduler, SchedError> {
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
        let gs = l.groups_of_known(node)?;
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
    pub fn layout(&self) -> &WorkerLayout {
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
            s.joins += c.joins.load(Ordering::Relaxed);
            s.join_steals += c.join_steals.load(Ordering::Relaxed);
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
