//! `Ctx::join`: results of deep and unbalanced trees, borrowing, panics from either half (popped
//! back or stolen), joins from many tasks and requests at once, joins while other requests run,
//! and the counters of the two paths (second half run by its joiner, or stolen).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loci_sched::fixtures::{self, grid_scheduler};
use loci_sched::{Ctx, Policy, RequestError, Stats};

const POLICIES: [Policy; 3] = [Policy::Las, Policy::Nls, Policy::Unpinned];

/// The sum of `lo..hi` by halving the range down to single numbers with joins.
fn range_sum(ctx: &Ctx, lo: u64, hi: u64) -> u64 {
    if hi - lo == 1 {
        return lo;
    }
    let mid = lo + (hi - lo) / 2;
    let (a, b) = ctx.join(|c| range_sum(c, lo, mid), |c| range_sum(c, mid, hi));
    a + b
}

/// A chain of `depth` joins whose second half recurses (the first is a leaf): every join's
/// job sits under the next one's on the worker's queue.
fn chain(ctx: &Ctx, depth: u64) -> u64 {
    if depth == 0 {
        return 0;
    }
    let (a, b) = ctx.join(|_| depth, |c| chain(c, depth - 1));
    a + b
}

/// Adds one to every element, splitting the slice with joins (both halves borrow mutably).
fn add_one(ctx: &Ctx, xs: &mut [u64]) {
    if xs.len() <= 8 {
        xs.iter_mut().for_each(|x| *x += 1);
        return;
    }
    let (l, r) = xs.split_at_mut(xs.len() / 2);
    ctx.join(|c| add_one(c, l), |c| add_one(c, r));
}

/// Waits (up to a deadline) until `flag` is set, so that the other half of a join must be
/// stolen by another worker for the wait to end early.
fn wait_for(flag: &AtomicBool) -> bool {
    let end = Instant::now() + Duration::from_secs(20);
    while !flag.load(Ordering::Acquire) {
        if Instant::now() > end {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

#[test]
fn deep_and_unbalanced_join_trees_give_the_sequential_result() {
    for policy in POLICIES {
        let s = grid_scheduler(policy, (2, 2, 2));
        let before = s.stats();
        for n in [1u64, 2, 3, 1000, 1 << 17] {
            let got = s.run(|ctx| range_sum(ctx, 0, n)).unwrap();
            assert_eq!(got, n * (n - 1) / 2, "{policy:?} sum of 0..{n}");
        }
        assert_eq!(s.run(|ctx| chain(ctx, 1000)).unwrap(), 1000 * 1001 / 2);
        let mut xs: Vec<u64> = (0..100_000).collect();
        s.run(|ctx| add_one(ctx, &mut xs)).unwrap();
        assert!(xs.iter().enumerate().all(|(i, &x)| x == i as u64 + 1));
        // One join per inner node of each range tree (n - 1), per link of the chain, per split
        // of the slice.
        fn splits(len: usize) -> u64 {
            if len <= 8 {
                0
            } else {
                1 + splits(len / 2) + splits(len - len / 2)
            }
        }
        let ranges = 1 + 2 + 999 + (1 << 17) - 1;
        let st = s.stats().since(&before);
        assert_eq!(st.joins, ranges + 1000 + splits(100_000), "{policy:?}");
        check_accounting(&st, policy);
    }
}

/// The scheduler's books after joins: every task run is counted once by the rule that found it
/// and in its request's record; stolen halves are a subset of the joins.
fn check_accounting(st: &Stats, policy: Policy) {
    assert_eq!(st.found.iter().sum::<u64>(), st.tasks, "{policy:?}: {st:?}");
    let recorded: u64 = st.requests.iter().map(|r| r.tasks()).sum();
    assert_eq!(recorded, st.tasks, "{policy:?}: {st:?}");
    assert!(st.join_steals <= st.joins, "{policy:?}: {st:?}");
    assert!(st.requests.iter().all(|r| !r.failed), "{policy:?}: {st:?}");
}

#[test]
fn both_paths_are_taken_and_counted() {
    // A second half that is stolen: the first half waits until another worker ran it.
    let s = grid_scheduler(Policy::Las, (1, 1, 2));
    let before = s.stats();
    let (stolen, (me, thief)) = s
        .run(|ctx| {
            let started = AtomicBool::new(false);
            let (ok, thief) = ctx.join(
                |_| wait_for(&started),
                |c| {
                    started.store(true, Ordering::Release);
                    c.worker()
                },
            );
            (ok, (ctx.worker(), thief))
        })
        .unwrap();
    assert!(
        stolen,
        "the idle worker did not steal the second half within 20 s"
    );
    assert_ne!(me, thief);
    let st = s.stats().since(&before);
    assert_eq!((st.joins, st.join_steals), (1, 1), "{st:?}");
    // The stolen half is a task of the request, stolen within the group (one group here).
    assert_eq!(st.tasks, 2, "{st:?}");
    assert_eq!(st.steals.same_group, 1, "{st:?}");
    check_accounting(&st, Policy::Las);

    // A second half popped back: on one worker nobody can steal it.
    let one = grid_scheduler(Policy::Las, (1, 1, 1));
    let before = one.stats();
    assert_eq!(
        one.run(|ctx| range_sum(ctx, 0, 1 << 12)).unwrap(),
        4095 * 4096 / 2
    );
    let st = one.stats().since(&before);
    assert_eq!((st.joins, st.join_steals, st.tasks), ((1 << 12) - 1, 0, 1));
    check_accounting(&st, Policy::Las);
}

#[test]
fn panics_propagate_after_both_halves_finish() {
    fixtures::without_panic_messages(|| {
        for grid in [(1, 1, 1), (1, 1, 2)] {
            let s = grid_scheduler(Policy::Las, grid);
            for (a_panics, b_panics) in [(true, false), (false, true), (true, true)] {
                let (ran_a, ran_b) = (AtomicBool::new(false), AtomicBool::new(false));
                let r = catch_unwind(AssertUnwindSafe(|| {
                    s.run(|ctx| {
                        ctx.join(
                            |_| {
                                ran_a.store(true, Ordering::Relaxed);
                                assert!(!a_panics, "first half");
                            },
                            |_| {
                                std::thread::sleep(Duration::from_millis(1));
                                ran_b.store(true, Ordering::Relaxed);
                                assert!(!b_panics, "second half");
                            },
                        )
                    })
                }));
                let msg = fixtures::panic_message(&*r.expect_err("the panic reaches the caller"));
                let want = if a_panics {
                    "first half"
                } else {
                    "second half"
                };
                assert_eq!(msg, want, "{grid:?}");
                assert!(ran_a.load(Ordering::Relaxed) && ran_b.load(Ordering::Relaxed));
            }
            // A stolen half's panic reaches the joiner, and an uncaught one fails the request only.
            let started = Arc::new(AtomicBool::new(false));
            let st2 = started.clone();
            let h = s.submit(move |ctx| {
                let st3 = st2.clone();
                ctx.join(
                    move |_| grid.2 == 1 || wait_for(&st2),
                    move |_| {
                        st3.store(true, Ordering::Release);
                        panic!("stolen half")
                    },
                )
            });
            match h.wait() {
                Err(RequestError::Panicked { message, .. }) => assert_eq!(message, "stolen half"),
                other => panic!("{grid:?}: expected the request to fail, got {other:?}"),
            }
            assert!(started.load(Ordering::Relaxed));
            assert_eq!(s.run(|ctx| range_sum(ctx, 0, 100)).unwrap(), 4950);
        }
    });
}

#[test]
fn joins_from_many_tasks_and_requests_at_once() {
    for policy in POLICIES {
        // Every run checks every sum and the accounting. That an idle worker steals a join's
        // second half at all depends on how the OS shares 2 cpus among 8 workers, so the runs
        // repeat (at most 4) until one saw a stolen join; `both_paths_are_taken_and_counted`
        // makes one steal for certain.
        let mut stolen = Vec::new();
        for _ in 0..4 {
            let st = many_requests_with_joins(policy);
            stolen.push(st.join_steals);
            if st.join_steals > 0 {
                break;
            }
        }
        assert!(
            stolen.iter().any(|&n| n > 0),
            "{policy:?}: 8 workers never stole a join in {} runs",
            stolen.len()
        );
    }
}

/// 16 requests of 32 tasks each, immediate and deferred, each task a join tree; checks the
/// sums and the counters, and returns the counters.
fn many_requests_with_joins(policy: Policy) -> Stats {
    let s = grid_scheduler(policy, (2, 2, 2));
    let before = s.stats();
    let handles: Vec<_> = (0..16u64)
        .map(|r| {
            s.submit(move |ctx| {
                let total = Arc::new(AtomicU64::new(0));
                for t in 0..32u64 {
                    let total = total.clone();
                    let job = move |c: &Ctx| {
                        let n = 1000 + r * 32 + t;
                        total.fetch_add(range_sum(c, 0, n), Ordering::Relaxed);
                    };
                    if t % 2 == 0 {
                        ctx.spawn_immediate(job);
                    } else {
                        ctx.spawn_deferred(job);
                    }
                }
                total
            })
        })
        .collect();
    let mut joins = 0;
    for (r, h) in handles.into_iter().enumerate() {
        let got = h.wait().unwrap().load(Ordering::Relaxed);
        let want: u64 = (0..32)
            .map(|t| 1000 + r as u64 * 32 + t)
            .map(|n| n * (n - 1) / 2)
            .sum();
        assert_eq!(got, want, "{policy:?} request {r}");
        joins += (0..32).map(|t| 1000 + r as u64 * 32 + t - 1).sum::<u64>();
    }
    let st = s.stats().since(&before);
    assert_eq!(st.joins, joins, "{policy:?}");
    assert!(st.join_steals < st.joins, "{policy:?}: {st:?}");
    check_accounting(&st, policy);
    st
}

#[test]
fn joins_while_other_requests_run() {
    for policy in POLICIES {
        let s = grid_scheduler(policy, (2, 1, 2));
        let before = s.stats();
        let ran = Arc::new(AtomicUsize::new(0));
        // Requests of slow deferred and immediate tasks, which a waiting joiner may run.
        let slow: Vec<_> = (0..6)
            .map(|_| {
                let ran = ran.clone();
                s.submit(move |ctx| {
                    for k in 0..20 {
                        let ran = ran.clone();
                        let job = move |_: &Ctx| {
                            std::thread::sleep(Duration::from_micros(300));
                            ran.fetch_add(1, Ordering::Relaxed);
                        };
                        if k % 2 == 0 {
                            ctx.spawn_deferred(job);
                        } else {
                            ctx.spawn_immediate(job);
                        }
                    }
                })
            })
            .collect();
        let joining: Vec<_> = (0..4)
            .map(|_| s.submit(|ctx| range_sum(ctx, 0, 200_000) + chain(ctx, 200)))
            .collect();
        for h in joining {
            assert_eq!(h.wait().unwrap(), 200_000 * 199_999 / 2 + 200 * 201 / 2);
        }
        for h in slow {
            h.wait().unwrap();
        }
        assert_eq!(ran.load(Ordering::Relaxed), 6 * 20);
        let st = s.stats().since(&before);
        // The slow requests (the first six) hold exactly their 21 tasks each in their records,
        // wherever they ran; the joining ones at least their first task.
        assert_eq!(st.requests.len(), 10, "{policy:?}");
        for r in &st.requests {
            let want = if r.id < 6 { 21..=21 } else { 1..=u64::MAX };
            assert!(want.contains(&r.tasks()), "{policy:?}: {r:?}");
        }
        check_accounting(&st, policy);
    }
}
