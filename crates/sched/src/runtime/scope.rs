//! Scopes: [`Ctx::scope`] (tasks that may borrow from the caller's stack; the caller runs tasks
//! while it waits for them), [`Ctx::for_each_morsel`] (a scope of deferred tasks queued on
//! their home nodes) and [`Scope`].

use std::any::Any;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use super::ctx::{Ctx, Where};
use super::task::Task;
use crate::sync::{lock, wait, AtomicUsize, Condvar, Mutex, Ordering};
use crate::SchedError;

/// Beyond this many nested scope waits, scoped spawns run inline: a waiting worker runs any
/// task, which may open a scope and wait again, so without a bound the nesting (and the stack)
/// could grow with the number of queued tasks rather than with the program's own nesting.
/// [`Ctx::join`] runs both halves inline beyond it, for the same reason.
pub(super) const MAX_SCOPE_DEPTH: u32 = 48;

impl Ctx {
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
