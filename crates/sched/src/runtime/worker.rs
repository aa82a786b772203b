//! The worker side of a [`Ctx`]: finding the next task by the scheduler's rules over a live
//! view of the queues, running it (panics fail its request), accounting runs of tasks of one
//! request, and the worker loop (find, run, spin, sleep).

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::ctx::{Ctx, Run, NO_RUN};
use super::request::{panic_message, ReqRef};
use super::sleep::sleep;
use super::stats::bump;
use super::task::Task;
use super::EXTERNAL;
use crate::rules::{choose_las, choose_nls, Pick, QueueView};
use crate::sync::{thread, Ordering};

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
    /// Finds the next task by the scheduler's rules, or `None` when every queue it may take from
    /// looks empty.
    pub(super) fn find(&self) -> Option<Task> {
        // Rule 1 (both policies) without building the view: a pop of the own queue is exactly
        // what the rule functions choose first whenever that queue is nonempty.
        if let Some(t) = self.local.pop() {
            self.found_own();
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

    /// Counts a task taken from this worker's own immediate queue (rule 1 of both policies).
    #[inline]
    pub(super) fn found_own(&self) {
        let sh = &*self.shared;
        bump(&sh.counters[self.w].found[Pick::OwnImmediate.rule(sh.las) as usize]);
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
    pub(super) fn flush(&self) {
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
    pub(super) fn switch_to(&self, req: ReqRef, node: usize) {
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

    #[inline]
    pub(super) fn exec_node(&self) -> usize {
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

    pub(super) fn execute(&self, t: Task) {
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
}

pub(super) fn worker_loop(ctx: &Ctx) {
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
