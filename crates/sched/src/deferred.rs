//! A core group's deferred queue (seed 003 section 4.1): a priority queue of per-request deques,
//! ordered by request id (ids are sequential, so the lowest id is the oldest request).
//!
//! Hand-written because no crate offers "deques keyed by priority with access to both ends of
//! the first two": it is a sorted list (a `SmallVec`, see [`DeferredQueue`]) of `(request id,
//! VecDeque)` under one mutex (the seed's implementation locks too). Requests mostly arrive in
//! id order, so an insert is usually a push at the end; the number of requests with queued tasks
//! stays small (about the number of concurrent requests). An atomic count lets the rule view test emptiness without the lock.

use std::collections::VecDeque;

use crossbeam_utils::CachePadded;
use smallvec::SmallVec;

use crate::rules::{rule4_target, Rule4Class, Rule4Take};
use crate::sync::{lock, AtomicUsize, Mutex, Ordering};

/// Requests whose deques are kept inline, right after the lock (seed 003 runs 16 concurrent
/// requests); beyond this many the list moves to the heap.
const INLINE_REQUESTS: usize = 16;

type Entries<T> = SmallVec<[(u64, VecDeque<T>); INLINE_REQUESTS]>;

/// Layout, for the workers of a group that push and take on every deferred task: the lock word
/// and the oldest request's deque header (where rule 3 takes and the running request pushes)
/// share one cache line, so a take or push moves that line and the task's slot between cores,
/// not a third line for a heap-allocated list (on 4 KB pipeline buffers with two workers,
/// shared machine: about 1.10x -> 1.08x rayon's cpu time). The `requests` hint, which every idle worker's
/// rule view reads, has a line of its own: a view read no longer pulls the lock's line into the
/// shared state just before the lock's RMW needs it exclusive.
pub(crate) struct DeferredQueue<T> {
    inner: Mutex<Entries<T>>,
    /// Requests with at least one queued task (a hint for the lock-free view).
    requests: CachePadded<AtomicUsize>,
}

impl<T> DeferredQueue<T> {
    pub(crate) fn new() -> Self {
        DeferredQueue {
            inner: Mutex::new(SmallVec::new()),
            requests: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Number of requests with queued tasks (may be stale by the time it is used).
    #[inline]
    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    pub(crate) fn push(&self, request: u64, task: T) {
        let mut v = lock(&self.inner);
        let pos = match v.last() {
            Some((id, _)) if *id < request => v.len(),
            _ => v.partition_point(|(id, _)| *id < request),
        };
        if pos < v.len() && v[pos].0 == request {
            v[pos].1.push_back(task);
        } else {
            v.insert(pos, (request, VecDeque::from([task])));
            // SeqCst: pairs with the sleeping worker's fence (see runtime::sleep).
            self.requests.store(v.len(), Ordering::SeqCst);
        }
    }

    /// Rule 3: the youngest task of the oldest request.
    pub(crate) fn take_own(&self) -> Option<T> {
        let mut v = lock(&self.inner);
        let q = &mut v.first_mut()?.1;
        let t = q.pop_back();
        if q.is_empty() {
            v.remove(0);
            self.requests.store(v.len(), Ordering::SeqCst);
        }
        t
    }

    /// Rule 4 ([`rule4_target`] picks the request; `class` classifies a request by its first
    /// queued task). Returns the task, its request id and, for a whole move, the request's other
    /// queued tasks (oldest first); `None` when this queue holds nothing rule 4 may take.
    pub(crate) fn take_remote(
        &self,
        migrate: bool,
        class: impl Fn(&T) -> Rule4Class,
    ) -> Option<(T, u64, VecDeque<T>)> {
        let mut v = lock(&self.inner);
        let pick = rule4_target(
            v.len(),
            |i| v[i].1.front().map_or(Rule4Class::Kept, &class),
            migrate,
        )?;
        match pick {
            Rule4Take::Whole(i) => {
                let (id, mut rest) = v.remove(i);
                self.requests.store(v.len(), Ordering::SeqCst);
                drop(v);
                let t = rest.pop_front()?;
                Some((t, id, rest))
            }
            Rule4Take::Oldest(i) => {
                let (id, q) = &mut v[i];
                let id = *id;
                let t = q.pop_front();
                if q.is_empty() {
                    v.remove(i);
                    self.requests.store(v.len(), Ordering::SeqCst);
                }
                t.map(|t| (t, id, VecDeque::new()))
            }
        }
    }

    /// Appends tasks of one request (migrated from another group), oldest first.
    pub(crate) fn push_all(&self, request: u64, tasks: VecDeque<T>) {
        if tasks.is_empty() {
            return;
        }
        let mut v = lock(&self.inner);
        let pos = v.partition_point(|(id, _)| *id < request);
        if pos < v.len() && v[pos].0 == request {
            v[pos].1.extend(tasks);
        } else {
            v.insert(pos, (request, tasks));
            self.requests.store(v.len(), Ordering::SeqCst);
        }
    }

    /// Request ids with queued tasks, oldest first (the unit tests, which loom builds leave out).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn ids(&self) -> Vec<u64> {
        lock(&self.inner).iter().map(|(id, _)| *id).collect()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn rules_3_and_4_take_the_right_ends() {
        let q = DeferredQueue::new();
        // Rule 4 on a queue whose requests may all be shared.
        let take_remote = || q.take_remote(false, |_| Rule4Class::Shareable).map(|x| x.0);
        assert_eq!(q.take_own(), None::<(u64, u32)>);
        for (r, t) in [(5, 1), (3, 1), (5, 2), (3, 2), (7, 1), (3, 3)] {
            q.push(r, (r, t));
        }
        assert_eq!(q.ids(), vec![3, 5, 7]);
        assert_eq!(q.requests(), 3);
        // Rule 3: youngest of the oldest request (3).
        assert_eq!(q.take_own(), Some((3, 3)));
        // Rule 4: oldest of the second-oldest request (5).
        assert_eq!(take_remote(), Some((5, 1)));
        assert_eq!(take_remote(), Some((5, 2)));
        assert_eq!(q.ids(), vec![3, 7]);
        assert_eq!(take_remote(), Some((7, 1)));
        // Only request 3 left: rule 4 takes its oldest task.
        assert_eq!(take_remote(), Some((3, 1)));
        assert_eq!(q.take_own(), Some((3, 2)));
        assert_eq!(q.requests(), 0);
        assert_eq!(take_remote(), None);
    }

    #[test]
    fn rule4_moves_fresh_requests_whole_and_skips_kept_ones() {
        // A task is (request, index, class of its request).
        use Rule4Class::{Fresh, Kept, Shareable};
        let class = |t: &(u64, u32, Rule4Class)| t.2;
        let q = DeferredQueue::new();
        for (r, t, c) in [
            (1, 1, Kept),
            (2, 1, Fresh),
            (2, 2, Fresh),
            (3, 1, Fresh),
            (2, 3, Fresh),
        ] {
            q.push(r, (r, t, c));
        }
        // The second-oldest request (2) is fresh: it moves whole.
        let (t, id, rest) = q.take_remote(true, class).unwrap();
        assert_eq!((t.1, id), (1, 2));
        assert_eq!(rest.iter().map(|t| t.1).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(q.ids(), vec![1, 3]);
        let other = DeferredQueue::new();
        other.push(5, (5, 1, Kept));
        other.push_all(id, rest);
        assert_eq!(other.ids(), vec![2, 5]);
        // Request 3 moves next; then only the kept request 1 is left: nothing for a thief.
        assert_eq!(q.take_remote(true, class).map(|x| x.1), Some(3));
        assert!(q.take_remote(true, class).is_none());
        assert_eq!(q.ids(), vec![1]);
        // The seed's rule passes over a kept request too (under it only requests that stay on
        // their node are kept); the own group's workers take it (rule 3).
        assert!(q.take_remote(false, class).is_none());
        assert_eq!(q.take_own().map(|t| (t.0, t.1)), Some((1, 1)));
        // A shareable request gives one task at a time, second-oldest first.
        for (r, t, c) in [(7, 1, Shareable), (7, 2, Shareable), (8, 1, Shareable)] {
            q.push(r, (r, t, c));
        }
        assert_eq!(
            q.take_remote(true, class).map(|x| (x.1, x.2.len())),
            Some((8, 0))
        );
        assert_eq!(
            q.take_remote(true, class).map(|x| (x.0 .1, x.1)),
            Some((1, 7))
        );
        assert_eq!(q.ids(), vec![7]);
    }
}
