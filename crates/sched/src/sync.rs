//! The concurrency primitives the scheduler core uses, behind one shim so that loom can run the
//! core (`RUSTFLAGS="--cfg loom"`), the pattern crossbeam uses.
//!
//! Under loom the immediate queues are a `Mutex<VecDeque>` instead of crossbeam-deque (which is not
//! instrumented for loom): the loom tests check loci's own protocol (sleep/wake, request and scope
//! completion, the deferred queue), not crossbeam's deque, which has its own loom tests.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread;

/// Locks, ignoring poisoning: the scheduler never panics while holding one of its own locks
/// (task panics are caught before they reach scheduler code), so a poisoned lock still holds
/// consistent data.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits on a condition variable, ignoring poisoning (see [`lock`]).
pub(crate) fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(g).unwrap_or_else(|e| e.into_inner())
}

/// Waits on a condition variable for at most `dur` (a wake-up may also be spurious), ignoring
/// poisoning. Under loom, a plain [`wait`] (loom has no clock): a model must not need the
/// waiter to wake by timeout, i.e. to run a task only it may take (the callers recheck their
/// condition after every wake-up, so no result depends on the timeout).
#[cfg(not(loom))]
pub(crate) fn wait_for<'a, T>(
    cv: &Condvar,
    g: MutexGuard<'a, T>,
    dur: std::time::Duration,
) -> MutexGuard<'a, T> {
    match cv.wait_timeout(g, dur) {
        Ok((g, _)) => g,
        Err(e) => e.into_inner().0,
    }
}
#[cfg(loom)]
pub(crate) fn wait_for<'a, T>(
    cv: &Condvar,
    g: MutexGuard<'a, T>,
    _dur: std::time::Duration,
) -> MutexGuard<'a, T> {
    wait(cv, g)
}

/// Takes from a crossbeam queue, retrying lost races; `None` when it is empty.
#[cfg(not(loom))]
fn steal_retrying<T>(steal: impl Fn() -> crossbeam_deque::Steal<T>) -> Option<T> {
    use crossbeam_deque::Steal;
    loop {
        match steal() {
            Steal::Success(t) => return Some(t),
            Steal::Empty => return None,
            Steal::Retry => std::hint::spin_loop(),
        }
    }
}

#[cfg(not(loom))]
mod queues {
    use crossbeam_deque::{Injector, Stealer as CbStealer, Worker};

    /// A worker's own immediate queue: the owner pushes and pops the youngest task (LIFO),
    /// others steal the oldest (crossbeam's Chase-Lev deque does exactly this).
    pub(crate) struct Local<T>(Worker<T>);
    /// The stealing side of a [`Local`].
    pub(crate) struct Stealer<T>(CbStealer<T>);

    pub(crate) fn local<T>() -> (Local<T>, Stealer<T>) {
        let w = Worker::new_lifo();
        let s = w.stealer();
        (Local(w), Stealer(s))
    }

    impl<T> Local<T> {
        #[inline]
        pub(crate) fn push(&self, t: T) {
            self.0.push(t)
        }
        #[inline]
        pub(crate) fn pop(&self) -> Option<T> {
            self.0.pop()
        }
        #[inline]
        pub(crate) fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }

    impl<T> Stealer<T> {
        /// The oldest task, or `None` when the queue is empty.
        #[inline]
        pub(crate) fn steal(&self) -> Option<T> {
            super::steal_retrying(|| self.0.steal())
        }
        #[inline]
        pub(crate) fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }

    /// NLS's one shared deferred queue: a multi-producer multi-consumer FIFO.
    pub(crate) struct Fifo<T>(Injector<T>);

    impl<T> Fifo<T> {
        pub(crate) fn new() -> Self {
            Fifo(Injector::new())
        }
        pub(crate) fn push(&self, t: T) {
            self.0.push(t)
        }
        pub(crate) fn steal(&self) -> Option<T> {
            super::steal_retrying(|| self.0.steal())
        }
        pub(crate) fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }
}

/// Under loom every queue is one locked `VecDeque` ([`Fifo`]): pushed at the back, popped by its
/// owner at the back (LIFO), stolen and taken from the front (FIFO).
#[cfg(loom)]
mod queues {
    use super::{lock, Mutex};
    use std::collections::VecDeque;
    use std::sync::Arc;

    pub(crate) struct Fifo<T>(Mutex<VecDeque<T>>);

    impl<T> Fifo<T> {
        pub(crate) fn new() -> Self {
            Fifo(Mutex::new(VecDeque::new()))
        }
        pub(crate) fn push(&self, t: T) {
            lock(&self.0).push_back(t)
        }
        pub(crate) fn steal(&self) -> Option<T> {
            lock(&self.0).pop_front()
        }
        pub(crate) fn is_empty(&self) -> bool {
            lock(&self.0).is_empty()
        }
    }

    pub(crate) struct Local<T>(Arc<Fifo<T>>);
    pub(crate) struct Stealer<T>(Arc<Fifo<T>>);

    pub(crate) fn local<T>() -> (Local<T>, Stealer<T>) {
        let q = Arc::new(Fifo::new());
        (Local(q.clone()), Stealer(q))
    }
    impl<T> Local<T> {
        pub(crate) fn push(&self, t: T) {
            self.0.push(t)
        }
        pub(crate) fn pop(&self) -> Option<T> {
            lock(&self.0 .0).pop_back()
        }
        pub(crate) fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }
    impl<T> Stealer<T> {
        pub(crate) fn steal(&self) -> Option<T> {
            self.0.steal()
        }
        pub(crate) fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }
}

pub(crate) use queues::{local, Fifo, Local, Stealer};
