//! A core group's deferred queue (seed 003 section 4.1): a priority queue of per-request deques,
//! ordered by request id (ids are sequential, so the lowest id is the oldest request).
//!
//! Hand-written because no crate offers "deques keyed by priority with access to both ends of
//! the first two": it is a sorted `Vec` of `(request id, VecDeque)` under one mutex (the seed's
//! implementation locks too). Requests mostly arrive in id order, so an insert is usually a push
//! at the end; the number of requests with queued tasks stays small (about the number of
//! concurrent requests). An atomic count lets the rule view test emptiness without the lock.

use std::collections::VecDeque;

use crate::sync::{lock, AtomicUsize, Mutex, Ordering};

/// Which end of which request a taker wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// Rule 3: youngest task of the oldest request.
    YoungestOfOldest,
    /// Rule 4: oldest task of the second-oldest request, or of the oldest if it is alone.
    OldestOfSecond,
}

pub(crate) struct DeferredQueue<T> {
    inner: Mutex<Vec<(u64, VecDeque<T>)>>,
    /// Requests with at least one queued task (a hint for the lock-free view).
    requests: AtomicUsize,
}

impl<T> DeferredQueue<T> {
    pub(crate) fn new() -> Self {
        DeferredQueue {
            inner: Mutex::new(Vec::new()),
            requests: AtomicUsize::new(0),
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

    pub(crate) fn take(&self, how: Take) -> Option<T> {
        let mut v = lock(&self.inner);
        let i = match how {
            Take::YoungestOfOldest => 0,
            Take::OldestOfSecond => usize::from(v.len() >= 2),
        };
        let q = &mut v.get_mut(i)?.1;
        let t = match how {
            Take::YoungestOfOldest => q.pop_back(),
            Take::OldestOfSecond => q.pop_front(),
        };
        if q.is_empty() {
            v.remove(i);
            self.requests.store(v.len(), Ordering::SeqCst);
        }
        t
    }

    /// Request ids with queued tasks, oldest first (tests and diagnostics).
    #[cfg(test)]
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
        assert_eq!(q.take(Take::YoungestOfOldest), None::<(u64, u32)>);
        for (r, t) in [(5, 1), (3, 1), (5, 2), (3, 2), (7, 1), (3, 3)] {
            q.push(r, (r, t));
        }
        assert_eq!(q.ids(), vec![3, 5, 7]);
        assert_eq!(q.requests(), 3);
        // Rule 3: youngest of the oldest request (3).
        assert_eq!(q.take(Take::YoungestOfOldest), Some((3, 3)));
        // Rule 4: oldest of the second-oldest request (5).
        assert_eq!(q.take(Take::OldestOfSecond), Some((5, 1)));
        assert_eq!(q.take(Take::OldestOfSecond), Some((5, 2)));
        assert_eq!(q.ids(), vec![3, 7]);
        assert_eq!(q.take(Take::OldestOfSecond), Some((7, 1)));
        // Only request 3 left: rule 4 takes its oldest task.
        assert_eq!(q.take(Take::OldestOfSecond), Some((3, 1)));
        assert_eq!(q.take(Take::YoungestOfOldest), Some((3, 2)));
        assert_eq!(q.requests(), 0);
        assert_eq!(q.take(Take::OldestOfSecond), None);
    }
}
