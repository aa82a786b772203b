//! Fork-join without allocation: [`Ctx::join`]. The second closure becomes a job on the joining
//! worker's stack (a [`JobHeader`], the closure, a result slot and a [`Latch`]), queued as an
//! immediate task on the worker's own deque, where idle workers steal it by the scheduler's
//! rules (under LAS: the worker's group first, then its node, by cache distance; never another
//! node). The joiner runs the first closure inline, then pops its deque back down to the job and
//! runs it inline; if a thief took it, the joiner runs other tasks (by the rules) until the
//! thief sets the latch.
//!
//! Accounting: a job popped back costs its request nothing (no `pending` count, no task
//! counter, no hook). A job that runs as a task (stolen, or taken from the queue by a nested
//! wait of its own worker) first counts itself in its request's `pending` from the runner's
//! spawn credits, exactly as if it had been spawned there, so `execute`'s accounting of the task
//! balances; it is then a task like any other (counters, steals by distance, the request's
//! tasks per node, `on_task_finished`). The request cannot finish meanwhile: the joining task
//! is still running and counted.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::time::Duration;

use super::ctx::Ctx;
use super::scope::MAX_SCOPE_DEPTH;
use super::stats::bump;
use super::task::{JobHeader, Task};
use crate::sync::{lock, thread, wait, wait_for, AtomicBool, Condvar, Mutex, Ordering};

/// How long a joiner whose job was stolen, having found no task to run and spun
/// `Config::spin_rounds` times, blocks on the latch before it looks for tasks again (the thief
/// may spawn or expose stealable work meanwhile; a latch set wakes it at once).
const JOIN_NAP: Duration = Duration::from_micros(100);

/// Set once the job's result is written. The flag is what the joiner polls; the mutex makes the
/// handoff safe to free: the setter holds it while it sets the flag, and the joiner takes it
/// before it returns (and frees the latch with its stack frame).
struct Latch {
    set: AtomicBool,
    done: Mutex<bool>,
    cv: Condvar,
}

impl Latch {
    fn new() -> Latch {
        Latch {
            set: AtomicBool::new(false),
            done: Mutex::new(false),
            cv: Condvar::new(),
        }
    }

    fn set(&self) {
        let mut d = lock(&self.done);
        *d = true;
        self.set.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    #[inline]
    fn probe(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Blocks until the latch is set or `JOIN_NAP` passed.
    fn nap(&self) {
        let d = lock(&self.done);
        if !*d {
            drop(wait_for(&self.cv, d, JOIN_NAP));
        }
    }

    /// Returns once the latch is set and its setter has let go of it.
    fn confirm(&self) {
        let mut d = lock(&self.done);
        while !*d {
            d = wait(&self.cv, d);
        }
    }
}

/// A join's second closure on the joiner's stack; starts with the header a [`Task`] points to.
#[repr(C)]
struct StackJob<F, R> {
    header: JobHeader,
    f: UnsafeCell<Option<F>>,
    result: UnsafeCell<Option<std::thread::Result<R>>>,
    latch: Latch,
}

/// The job's `call`: runs the closure as a task on `ctx` (counted in its request first, see the
/// module docs), or drops it (`None`: the task was dropped unrun), then stores the outcome and
/// sets the latch.
///
/// SAFETY: `p` points to the header of a live `StackJob<F, R>` queued by [`Ctx::join`], whose
/// closure is still there; the joiner does not return before the latch is set, and nothing
/// touches the job after `set`.
unsafe fn call_job<F: FnOnce(&Ctx) -> R, R>(p: NonNull<JobHeader>, ctx: Option<&Ctx>) {
    // SAFETY: see the contract; the job was made from a whole `StackJob<F, R>` (`repr(C)`, the
    // header first), and only the one thread running this call touches `f` and `result` until
    // the latch is set.
    let job = unsafe { p.cast::<StackJob<F, R>>().as_ref() };
    // SAFETY: as above.
    let f = unsafe { (*job.f.get()).take() }.expect("a join job runs once");
    let r = match ctx {
        Some(c) => {
            c.spend_credit(c.req());
            if c.w as u32 != job.header.spawner {
                bump(&c.shared.counters[c.w].join_steals);
            }
            catch_unwind(AssertUnwindSafe(|| f(c)))
        }
        None => {
            drop(f);
            Err(Box::new("the second closure of a join was dropped without running") as _)
        }
    };
    // SAFETY: as above; the joiner reads the result only after the latch is set.
    unsafe { *job.result.get() = Some(r) };
    job.latch.set();
}

/// Both results, or the first closure's panic, else the second's.
fn both<RA, RB>(ra: std::thread::Result<RA>, rb: std::thread::Result<RB>) -> (RA, RB) {
    match (ra, rb) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(p), _) | (_, Err(p)) => resume_unwind(p),
    }
}

impl Ctx {
    /// Runs `a` and `b`, potentially in parallel, and returns both results (rayon's `join`):
    /// `b` is queued on this worker's immediate queue as a job on this stack (no allocation),
    /// where an idle worker of the group or node may steal it by the scheduler's rules; `a` runs
    /// here; then `b` runs here too unless it was stolen, in which case this worker runs other
    /// tasks until it finished. Both closures may borrow from the caller. `b` gets the context
    /// of the worker that runs it. A panic in either is re-raised here after both finished (`a`'s
    /// if both panicked). Nested deeper than 48 waits (joins or scopes waiting for stolen work),
    /// both run here one after the other, so a waiting worker's stack stays bounded.
    pub fn join<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce(&Ctx) -> RA,
        B: FnOnce(&Ctx) -> RB + Send,
        RB: Send,
    {
        bump(&self.shared.counters[self.w].joins);
        if self.depth.get() >= MAX_SCOPE_DEPTH {
            let ra = catch_unwind(AssertUnwindSafe(|| a(self)));
            return both(ra, catch_unwind(AssertUnwindSafe(|| b(self))));
        }
        let job = StackJob {
            header: JobHeader {
                call: call_job::<B, RB>,
                spawner: self.w as u32,
            },
            f: UnsafeCell::new(Some(b)),
            result: UnsafeCell::new(None),
            latch: Latch::new(),
        };
        let me = NonNull::from(&job).cast::<JobHeader>();
        // SAFETY: `job` lives until this function returns, which happens only after the task was
        // popped back here (and taken apart, not run) or its `call` set the latch.
        self.push_local(unsafe { Task::from_job(me, self.req()) });
        let ra = catch_unwind(AssertUnwindSafe(|| a(self)));
        let rb = if self.pop_back(me) {
            // SAFETY: the job came back unrun: no other thread has or will see it.
            let f = unsafe { (*job.f.get()).take() }.expect("an unrun join job has its closure");
            catch_unwind(AssertUnwindSafe(|| f(self)))
        } else {
            self.wait_latch(&job.latch);
            // SAFETY: the latch is set and its setter let go: the result is written and nobody
            // else touches the job any more.
            unsafe { (*job.result.get()).take() }.expect("a set latch has a result")
        };
        both(ra, rb)
    }

    /// Pops this worker's immediate queue down to the job `me`: true if it is there (not stolen).
    /// Tasks the first closure left above it run first, as tasks found by rule 1.
    #[inline]
    fn pop_back(&self, me: NonNull<JobHeader>) -> bool {
        while let Some(t) = self.local.pop() {
            if t.is(me) {
                let _ = t.into_job();
                return true;
            }
            self.found_own();
            self.nested(|| self.execute(t));
        }
        false
    }

    /// Runs other tasks until `latch` is set: by the scheduler's rules; when there are none,
    /// spinning like an idle worker, then napping on the latch.
    #[cold]
    fn wait_latch(&self, latch: &Latch) {
        self.nested(|| {
            let mut idle = 0;
            while !latch.probe() {
                if let Some(t) = self.find() {
                    self.execute(t);
                    idle = 0;
                    continue;
                }
                // Nothing to run: account what ran (see the `runtime` module docs) and idle.
                self.flush();
                if idle < self.shared.spin_rounds {
                    thread::yield_now();
                    idle += 1;
                } else {
                    latch.nap();
                }
            }
        });
        latch.confirm();
    }

    /// Runs `f` one wait deeper (see `MAX_SCOPE_DEPTH`).
    #[inline]
    fn nested(&self, f: impl FnOnce()) {
        self.depth.set(self.depth.get() + 1);
        f();
        self.depth.set(self.depth.get() - 1);
    }
}
