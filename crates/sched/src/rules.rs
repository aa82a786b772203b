//! Where a free worker takes its next task from: seed 003's rules as a pure function over an
//! abstract view of the queues. The runtime asks the same function with a live view, then tries
//! to take the task; if another worker was faster it asks again.

use crate::layout::WorkerLayout;

/// What a rule needs to know about the queues (a snapshot; the runtime's answers may be stale).
pub trait QueueView {
    /// Whether worker `w`'s immediate queue holds a task.
    fn immediate_nonempty(&self, w: usize) -> bool;
    /// How many requests have tasks in group `g`'s deferred queue (LAS) that the asking worker
    /// may take (for another group's queue, [`rule4_target`] decides which requests count; the
    /// runtime reports 0 for a group where it found none).
    fn deferred_requests(&self, g: usize) -> usize;
    /// Whether the one shared deferred FIFO holds a task (NLS).
    fn shared_deferred_nonempty(&self) -> bool;
}

/// Which rule found a task. LAS uses rules 1-5 of seed 003 section 4.2, NLS the three of
/// section 6.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// LAS 1: own immediate queue, youngest task.
    OwnImmediate,
    /// LAS 2: another worker of the group (by cache distance), oldest task.
    GroupImmediate,
    /// LAS 3: own group's deferred queue, youngest task of the oldest request.
    OwnDeferred,
    /// LAS 4: another group's deferred queue (by NUMA distance), oldest task of the second-oldest
    /// request (of the oldest if it is the only one); which request exactly: [`rule4_target`].
    RemoteDeferred,
    /// LAS 5: immediate queue of a worker of another group of the same node, oldest task, round
    /// robin.
    NodeImmediate,
    /// NLS 1: own immediate queue, youngest task.
    NlsOwnImmediate,
    /// NLS 2: the shared deferred FIFO, oldest task.
    NlsSharedDeferred,
    /// NLS 3: another worker's immediate queue, oldest task.
    NlsSteal,
}

impl Rule {
    /// Every rule, in counter order.
    pub const ALL: [Rule; 8] = [
        Rule::OwnImmediate,
        Rule::GroupImmediate,
        Rule::OwnDeferred,
        Rule::RemoteDeferred,
        Rule::NodeImmediate,
        Rule::NlsOwnImmediate,
        Rule::NlsSharedDeferred,
        Rule::NlsSteal,
    ];
    /// Short name used in counters and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Rule::OwnImmediate => "las1-own-immediate",
            Rule::GroupImmediate => "las2-group-immediate",
            Rule::OwnDeferred => "las3-own-deferred",
            Rule::RemoteDeferred => "las4-remote-deferred",
            Rule::NodeImmediate => "las5-node-immediate",
            Rule::NlsOwnImmediate => "nls1-own-immediate",
            Rule::NlsSharedDeferred => "nls2-shared-deferred",
            Rule::NlsSteal => "nls3-steal",
        }
    }
}

/// The queue a rule chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// LAS 1 / NLS 1: pop the youngest task of the own immediate queue.
    OwnImmediate,
    /// LAS 2: steal the oldest immediate task of `victim` (same group).
    GroupImmediate { victim: usize },
    /// LAS 3: youngest task of the oldest request of the own group's deferred queue.
    OwnDeferred,
    /// LAS 4: from `group`'s deferred queue; `second`: it holds two or more requests, so the
    /// oldest task of the second-oldest request, else the oldest task of the only one.
    RemoteDeferred { group: usize, second: bool },
    /// LAS 5: steal the oldest immediate task of `victim`, found at position `cursor` of the
    /// worker's rule-5 list (the next scan starts after it).
    NodeImmediate { victim: usize, cursor: usize },
    /// NLS 2: oldest task of the shared deferred FIFO.
    SharedDeferred,
    /// NLS 3: oldest immediate task of `victim`.
    Steal { victim: usize },
}

impl Pick {
    /// The rule this pick belongs to, under LAS (`las`) or NLS.
    pub fn rule(self, las: bool) -> Rule {
        match self {
            Pick::OwnImmediate if las => Rule::OwnImmediate,
            Pick::OwnImmediate => Rule::NlsOwnImmediate,
            Pick::GroupImmediate { .. } => Rule::GroupImmediate,
            Pick::OwnDeferred => Rule::OwnDeferred,
            Pick::RemoteDeferred { .. } => Rule::RemoteDeferred,
            Pick::NodeImmediate { .. } => Rule::NodeImmediate,
            Pick::SharedDeferred => Rule::NlsSharedDeferred,
            Pick::Steal { .. } => Rule::NlsSteal,
        }
    }
}

/// How rule 4 may treat one request queued in another group's deferred queue (loci's rule 4,
/// `Config::migrate_requests`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule4Class {
    /// No task of the request has started: it may move to the thief's group whole.
    Fresh,
    /// Started, but the thief may take one task of it: the thief is on the victim group's node,
    /// or the request started while fewer requests than nodes were live and that is still so
    /// (seed 003: nodes cooperate "in case there are not enough requests in the system to occupy
    /// all the nodes").
    Shareable,
    /// Started while at least as many requests as nodes were live (or more are live now): its
    /// tasks stay on their node, so no thief from another node takes one.
    Kept,
}

/// What rule 4 takes from a victim group's deferred queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule4Take {
    /// Every queued task of the request at this queue position (oldest first) moves to the
    /// thief's group; the thief runs the oldest.
    Whole(usize),
    /// The oldest task of the request at this queue position.
    Oldest(usize),
}

/// Rule 4 over one victim queue holding `n` requests, oldest first; `class(i)` classifies the
/// request at position `i` (asked lazily, at most twice per request).
///
/// `migrate == false` is exactly seed 003: the oldest task of the second-oldest request, or of
/// the oldest if it is alone; only a `Kept` request (there: one that stays on its node,
/// `RequestOptions::stay_on_node`) is passed over, for the next in seed order (second-oldest
/// first, the oldest last). `migrate == true` (loci's default) lets requests change node only
/// whole: the oldest fresh request after the first moves whole (then the first, if fresh);
/// otherwise the oldest task of the first shareable request in seed order (second-oldest first,
/// the oldest last); `Kept` requests are never split, and `None` means this victim has nothing
/// for the thief (rule 4 goes on to the next group).
pub fn rule4_target(
    n: usize,
    class: impl Fn(usize) -> Rule4Class,
    migrate: bool,
) -> Option<Rule4Take> {
    if n == 0 {
        return None;
    }
    let seed_order = || (1..n).chain(std::iter::once(0));
    if !migrate {
        return seed_order()
            .find(|&i| class(i) != Rule4Class::Kept)
            .map(Rule4Take::Oldest);
    }
    if let Some(i) = seed_order().find(|&i| class(i) == Rule4Class::Fresh) {
        return Some(Rule4Take::Whole(i));
    }
    seed_order()
        .find(|&i| class(i) == Rule4Class::Shareable)
        .map(Rule4Take::Oldest)
}

/// LAS (seed 003 section 4.2) for worker `w`. `rr` is the rule-5 position where the worker last
/// found a task (`usize::MAX` before the first); the scan resumes after it.
#[inline]
pub fn choose_las(
    layout: &WorkerLayout,
    w: usize,
    view: &impl QueueView,
    rr: usize,
) -> Option<Pick> {
    if view.immediate_nonempty(w) {
        return Some(Pick::OwnImmediate);
    }
    let slot = &layout.workers[w];
    for &v in &slot.same_group {
        if view.immediate_nonempty(v) {
            return Some(Pick::GroupImmediate { victim: v });
        }
    }
    if view.deferred_requests(slot.group) > 0 {
        return Some(Pick::OwnDeferred);
    }
    for &g in &slot.other_groups {
        let n = view.deferred_requests(g);
        if n > 0 {
            return Some(Pick::RemoteDeferred {
                group: g,
                second: n >= 2,
            });
        }
    }
    let list = &slot.same_node;
    let len = list.len();
    let start = if rr < len { rr + 1 } else { 0 };
    for k in 0..len {
        let cursor = (start + k) % len;
        if view.immediate_nonempty(list[cursor]) {
            return Some(Pick::NodeImmediate {
                victim: list[cursor],
                cursor,
            });
        }
    }
    None
}

/// NLS (seed 003 section 6.1) for worker `w`.
#[inline]
pub fn choose_nls(layout: &WorkerLayout, w: usize, view: &impl QueueView) -> Option<Pick> {
    if view.immediate_nonempty(w) {
        return Some(Pick::OwnImmediate);
    }
    if view.shared_deferred_nonempty() {
        return Some(Pick::SharedDeferred);
    }
    layout.workers[w]
        .others
        .iter()
        .find(|&&v| view.immediate_nonempty(v))
        .map(|&victim| Pick::Steal { victim })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use loci_topo::Topology;

    /// A queue snapshot: which immediate queues are nonempty, how many requests each deferred
    /// queue holds.
    struct View {
        imm: Vec<bool>,
        def: Vec<usize>,
        shared: bool,
    }
    impl View {
        fn empty(l: &WorkerLayout) -> View {
            View {
                imm: vec![false; l.workers.len()],
                def: vec![0; l.groups.len()],
                shared: false,
            }
        }
    }
    impl QueueView for View {
        fn immediate_nonempty(&self, w: usize) -> bool {
            self.imm[w]
        }
        fn deferred_requests(&self, g: usize) -> usize {
            self.def[g]
        }
        fn shared_deferred_nonempty(&self) -> bool {
            self.shared
        }
    }
    fn worker_of_cpu(l: &WorkerLayout, cpu: u32) -> usize {
        l.workers.iter().position(|w| w.cpu == cpu).unwrap()
    }
    fn layout(t: &Topology, level: Option<u8>) -> WorkerLayout {
        WorkerLayout::new(t, level).unwrap()
    }

    #[test]
    fn e7_rules_in_order() {
        let l = layout(&fixtures::xeon_e7_4820(), None);
        let me = worker_of_cpu(&l, 3);
        let sib = worker_of_cpu(&l, 35);
        let far_same_group = worker_of_cpu(&l, 6);
        let other_node = worker_of_cpu(&l, 8);
        let mut v = View::empty(&l);
        assert_eq!(choose_las(&l, me, &v, usize::MAX), None);

        // Rule 5 has nothing to scan on this machine (one group per node): an immediate task of
        // another node is never taken.
        v.imm[other_node] = true;
        assert_eq!(choose_las(&l, me, &v, usize::MAX), None);

        // Rule 4: another node's deferred queue with one request: its oldest task.
        // With more than one request there, the second-oldest request's oldest task.
        for (requests, second) in [(1, false), (3, true)] {
            v.def[1] = requests;
            let want = Pick::RemoteDeferred { group: 1, second };
            assert_eq!(choose_las(&l, me, &v, usize::MAX), Some(want));
        }
        // Rule 3 beats rule 4.
        v.def[0] = 2;
        assert_eq!(choose_las(&l, me, &v, usize::MAX), Some(Pick::OwnDeferred));
        // Rule 2 beats rule 3; the SMT sibling (shares L1) beats a core that shares only L3.
        v.imm[far_same_group] = true;
        assert_eq!(
            choose_las(&l, me, &v, usize::MAX),
            Some(Pick::GroupImmediate {
                victim: far_same_group
            })
        );
        v.imm[sib] = true;
        assert_eq!(
            choose_las(&l, me, &v, usize::MAX),
            Some(Pick::GroupImmediate { victim: sib })
        );
        // Rule 1 beats everything.
        v.imm[me] = true;
        assert_eq!(choose_las(&l, me, &v, usize::MAX), Some(Pick::OwnImmediate));
    }

    #[test]
    fn e7_remote_deferred_by_distance_all_equal_then_rotation() {
        let l = layout(&fixtures::xeon_e7_4820(), None);
        // Every remote node is at distance 20: ties rotate, so node 1 looks at 2 first, node 2 at 3.
        let mut v = View::empty(&l);
        v.def = vec![1, 0, 1, 1];
        let w1 = worker_of_cpu(&l, 8);
        let w2 = worker_of_cpu(&l, 16);
        assert_eq!(
            choose_las(&l, w1, &v, usize::MAX),
            Some(Pick::RemoteDeferred {
                group: 2,
                second: false
            })
        );
        v.def = vec![1, 1, 0, 1];
        assert_eq!(
            choose_las(&l, w2, &v, usize::MAX),
            Some(Pick::RemoteDeferred {
                group: 3,
                second: false
            })
        );
    }

    #[test]
    fn opteron_remote_deferred_prefers_fewer_hops() {
        let t = fixtures::opteron_8220();
        let l = layout(&t, None);
        let hops = fixtures::twisted_ladder_hops();
        // Worker on node 1 (cpu 2). Deferred work on nodes 6 (3 hops: 1-3-4-6), 2 (2 hops:
        // 1-0-2) and 3 (1 hop): the 1-hop node wins, then the 2-hop, then the 3-hop one.
        let me = worker_of_cpu(&l, 2);
        assert_eq!(l.workers[me].node, 1);
        let group_on = |node: u32| l.groups_of(node).next().unwrap();
        let mut v = View::empty(&l);
        for n in [6u32, 2, 3] {
            v.def[group_on(n)] = 1;
        }
        let order: Vec<u32> = [3u32, 2, 6]
            .into_iter()
            .map(|n| hops[1][n as usize])
            .collect();
        assert_eq!(order, vec![1, 2, 3]);
        let mut seen = vec![];
        for _ in 0..3 {
            match choose_las(&l, me, &v, usize::MAX) {
                Some(Pick::RemoteDeferred { group, .. }) => {
                    seen.push(l.groups[group].node);
                    v.def[group] = 0;
                }
                p => panic!("unexpected {p:?}"),
            }
        }
        assert_eq!(seen, vec![3, 2, 6]);
        // The other core of the own node is a different group: rule 4 looks there first.
        let sibling_group = l.workers[worker_of_cpu(&l, 3)].group;
        v.def[sibling_group] = 1;
        v.def[group_on(3)] = 1;
        assert_eq!(
            choose_las(&l, me, &v, usize::MAX),
            Some(Pick::RemoteDeferred {
                group: sibling_group,
                second: false
            })
        );
        // Rule 5: the other core's immediate queue (same node, other group).
        let mut v = View::empty(&l);
        let other = worker_of_cpu(&l, 3);
        v.imm[other] = true;
        assert_eq!(
            choose_las(&l, me, &v, usize::MAX),
            Some(Pick::NodeImmediate {
                victim: other,
                cursor: 0
            })
        );
        // But never an immediate queue of another node.
        let mut v = View::empty(&l);
        v.imm[worker_of_cpu(&l, 4)] = true;
        assert_eq!(choose_las(&l, me, &v, usize::MAX), None);
    }

    #[test]
    fn e5310_rule5_round_robin_remembers_last() {
        let l = layout(&fixtures::xeon_e5310(), None);
        let me = worker_of_cpu(&l, 0);
        let list = l.workers[me].same_node.clone();
        assert_eq!(list.len(), 6);
        let mut v = View::empty(&l);
        for &w in &list {
            v.imm[w] = true;
        }
        // With every queue nonempty, successive scans visit each in turn.
        let mut rr = usize::MAX;
        let mut visited = vec![];
        for _ in 0..list.len() {
            match choose_las(&l, me, &v, rr) {
                Some(Pick::NodeImmediate { victim, cursor }) => {
                    visited.push(victim);
                    rr = cursor;
                }
                p => panic!("unexpected {p:?}"),
            }
        }
        assert_eq!(visited, list);
        // The scan resumes after the last one found, wrapping around.
        v.imm[list[1]] = false;
        let p = choose_las(&l, me, &v, 0);
        assert_eq!(
            p,
            Some(Pick::NodeImmediate {
                victim: list[2],
                cursor: 2
            })
        );
        // Rule 2 (the L2 partner, cpu 4) comes before rule 5.
        let partner = worker_of_cpu(&l, 4);
        v.imm[partner] = true;
        assert_eq!(
            choose_las(&l, me, &v, 0),
            Some(Pick::GroupImmediate { victim: partner })
        );
    }

    #[test]
    fn nls_order() {
        let l = layout(&fixtures::xeon_e7_4820(), None);
        let me = 5;
        let mut v = View::empty(&l);
        assert_eq!(choose_nls(&l, me, &v), None);
        // NLS steals from any worker, any node (no locality).
        let far = l.workers.len() - 1;
        v.imm[far] = true;
        assert_eq!(choose_nls(&l, me, &v), Some(Pick::Steal { victim: far }));
        v.imm[7] = true;
        assert_eq!(choose_nls(&l, me, &v), Some(Pick::Steal { victim: 7 }));
        v.shared = true;
        assert_eq!(choose_nls(&l, me, &v), Some(Pick::SharedDeferred));
        // Per-group deferred queues are not NLS's business.
        v.def = vec![5; l.groups.len()];
        assert_eq!(choose_nls(&l, me, &v), Some(Pick::SharedDeferred));
        v.imm[me] = true;
        assert_eq!(choose_nls(&l, me, &v), Some(Pick::OwnImmediate));
        assert_eq!(Pick::OwnImmediate.rule(false), Rule::NlsOwnImmediate);
    }

    /// Exhaustive check on small views of the E5310: the chosen queue is nonempty, and no
    /// earlier rule had a nonempty queue.
    #[test]
    fn e5310_choice_is_first_applicable_rule() {
        let l = layout(&fixtures::xeon_e5310(), None);
        let nw = l.workers.len();
        let ng = l.groups.len();
        for bits in 0u32..(1 << (nw + ng)) {
            let mut v = View::empty(&l);
            for w in 0..nw {
                v.imm[w] = bits & (1 << w) != 0;
            }
            for g in 0..ng {
                v.def[g] = ((bits >> (nw + g)) & 1) as usize * (1 + g % 2);
            }
            for me in 0..nw {
                let p = choose_las(&l, me, &v, usize::MAX);
                let s = &l.workers[me];
                let r1 = v.imm[me];
                let r2 = s.same_group.iter().any(|&o| v.imm[o]);
                let r3 = v.def[s.group] > 0;
                let r4 = s.other_groups.iter().any(|&g| v.def[g] > 0);
                let r5 = s.same_node.iter().any(|&o| v.imm[o]);
                let expect = if r1 {
                    Some(Rule::OwnImmediate)
                } else if r2 {
                    Some(Rule::GroupImmediate)
                } else if r3 {
                    Some(Rule::OwnDeferred)
                } else if r4 {
                    Some(Rule::RemoteDeferred)
                } else if r5 {
                    Some(Rule::NodeImmediate)
                } else {
                    None
                };
                assert_eq!(p.map(|p| p.rule(true)), expect, "bits {bits:b} worker {me}");
                match p {
                    Some(Pick::GroupImmediate { victim })
                    | Some(Pick::NodeImmediate { victim, .. }) => {
                        assert!(v.imm[victim])
                    }
                    Some(Pick::RemoteDeferred { group, second }) => {
                        assert!(v.def[group] > 0);
                        assert_eq!(second, v.def[group] >= 2);
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn rule4_moves_fresh_requests_whole_and_never_splits_kept_ones() {
        use Rule4Class::{Fresh, Kept, Shareable};
        use Rule4Take::{Oldest, Whole};
        let rule4_target = |v: &[Rule4Class], m| super::rule4_target(v.len(), |i| v[i], m);
        // The seed's rule: the second-oldest, the oldest if alone; only Kept ones (requests that
        // stay on their node) are passed over.
        assert_eq!(rule4_target(&[Fresh], false), Some(Oldest(0)));
        assert_eq!(
            rule4_target(&[Shareable, Fresh, Fresh], false),
            Some(Oldest(1))
        );
        assert_eq!(rule4_target(&[Kept], false), None);
        assert_eq!(
            rule4_target(&[Shareable, Kept, Fresh], false),
            Some(Oldest(2))
        );
        assert_eq!(rule4_target(&[Fresh, Kept], false), Some(Oldest(0)));
        assert_eq!(rule4_target(&[], false), None);
        assert_eq!(rule4_target(&[], true), None);
        // Fresh requests after the first move whole, the oldest of them first.
        assert_eq!(
            rule4_target(&[Kept, Kept, Fresh, Fresh], true),
            Some(Whole(2))
        );
        assert_eq!(
            rule4_target(&[Fresh, Shareable, Fresh], true),
            Some(Whole(2))
        );
        // A fresh first request moves whole only when no later one is fresh.
        assert_eq!(rule4_target(&[Fresh, Kept], true), Some(Whole(0)));
        assert_eq!(rule4_target(&[Fresh], true), Some(Whole(0)));
        // No fresh request: one task of a shareable one, second-oldest before the oldest.
        assert_eq!(rule4_target(&[Shareable, Shareable], true), Some(Oldest(1)));
        assert_eq!(rule4_target(&[Shareable, Kept], true), Some(Oldest(0)));
        assert_eq!(
            rule4_target(&[Kept, Kept, Shareable], true),
            Some(Oldest(2))
        );
        assert_eq!(rule4_target(&[Shareable], true), Some(Oldest(0)));
        // Requests that started among enough others are never split across nodes.
        assert_eq!(rule4_target(&[Kept], true), None);
        assert_eq!(rule4_target(&[Kept, Kept, Kept], true), None);
    }
}
