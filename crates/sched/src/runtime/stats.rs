//! Counters: the public [`Stats`] (tasks found by each rule, steals by distance, parks, the
//! finished requests' [`RequestRecord`]s) and the per-worker counters they are summed from.

use crate::rules::Rule;
use crate::sync::{AtomicU64, Ordering};

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
    /// Calls of [`Ctx::join`](crate::Ctx::join).
    pub joins: u64,
    /// Joins whose second closure another worker stole and ran (the others ran it on the
    /// joining worker, almost always inline, popped back from its own queue). A stolen half
    /// also counts as a task (in `tasks`, the rule and steal counters and its request's
    /// record); a half run by its joiner does not.
    pub join_steals: u64,
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
            joins: self.joins - earlier.joins,
            join_steals: self.join_steals - earlier.join_steals,
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
pub(super) struct WorkerCounters {
    pub(super) tasks: AtomicU64,
    pub(super) migrated: AtomicU64,
    pub(super) parks: AtomicU64,
    pub(super) joins: AtomicU64,
    pub(super) join_steals: AtomicU64,
    pub(super) found: [AtomicU64; 8],
    pub(super) steals: [AtomicU64; 3],
}

/// Adds one to a counter that only its worker writes (a plain load and store, no locked RMW).
#[inline]
pub(super) fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}
