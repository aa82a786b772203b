//! `Ctx::for_each`: every index exactly once under every policy, far fewer joins than indices
//! (adaptive splitting), idle workers taking halves, and panics reaching the caller.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use loci_sched::fixtures::{self, grid_scheduler};
use loci_sched::Policy;

const POLICIES: [Policy; 3] = [Policy::Las, Policy::Nls, Policy::Unpinned];

#[test]
fn every_index_runs_exactly_once_with_few_joins() {
    const N: u64 = 1 << 18;
    for policy in POLICIES {
        for grid in [(1, 1, 1), (1, 1, 2), (2, 2, 2)] {
            let s = grid_scheduler(policy, grid);
            let hits: Vec<AtomicU8> = (0..N + 8).map(|_| AtomicU8::new(0)).collect();
            for range in [0..0, 7..7, 5..6, 3..5, 0..1000, 8..N] {
                let before = s.stats();
                s.run(|ctx| {
                    ctx.for_each(range.clone(), |_, i| {
                        hits[i as usize].fetch_add(1, Ordering::Relaxed);
                    })
                })
                .unwrap();
                for (i, h) in hits.iter().enumerate() {
                    let want = u8::from(range.contains(&(i as u64)));
                    assert_eq!(
                        h.swap(0, Ordering::Relaxed),
                        want,
                        "{policy:?} {grid:?} {range:?} index {i}"
                    );
                }
                let st = s.stats().since(&before);
                // A join tree would make one join per index; the loop splits only while it has
                // credits (4 per worker, halved at each level: 2^levels - 1 joins from the root)
                // or where a worker stole a half (that half and both its children start again
                // from the full credits: at most 2^(levels+1) - 1 joins per steal). Under
                // oversubscription (8 workers on 2 cpus) steals come whenever the OS preempts a
                // worker, so the bound follows the steals seen rather than a fixed count.
                let len = range.end - range.start;
                let workers = (grid.0 * grid.1 * grid.2) as u64;
                let levels = 64 - (4 * workers).leading_zeros() as u64;
                let bound = ((1u64 << levels) - 1) + st.join_steals * ((1u64 << (levels + 1)) - 1);
                assert!(
                    st.joins <= len.saturating_sub(1).min(bound),
                    "{policy:?} {grid:?} {range:?}: {} joins, {} stolen",
                    st.joins,
                    st.join_steals
                );
                if len >= 1 << 16 {
                    assert!(
                        st.joins <= len / 16,
                        "{policy:?} {grid:?} {range:?}: {} joins, {} stolen",
                        st.joins,
                        st.join_steals
                    );
                }
                assert!(st.join_steals <= st.joins);
            }
        }
    }
}

#[test]
fn one_worker_cuts_eight_pieces_and_runs_them_as_loops_in_order() {
    let s = grid_scheduler(Policy::Las, (1, 1, 1));
    let before = s.stats();
    let order = std::sync::Mutex::new(Vec::new());
    s.run(|ctx| ctx.for_each(0..100, |_, i| order.lock().unwrap().push(i)))
        .unwrap();
    // One worker: its four split credits cut the range into 8 pieces (1 + 2 + 4 joins), nobody
    // steals, every piece is a loop (each second half popped back after its first), so the
    // indices come in order.
    assert_eq!(*order.lock().unwrap(), (0..100).collect::<Vec<u64>>());
    let st = s.stats().since(&before);
    assert_eq!((st.joins, st.join_steals), (7, 0), "{st:?}");
}

#[test]
fn an_idle_worker_takes_the_other_half() {
    for policy in POLICIES {
        let s = grid_scheduler(policy, (1, 1, 2));
        let second_half_started = AtomicBool::new(false);
        let workers: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(usize::MAX)).collect();
        let waited = AtomicBool::new(true);
        s.run(|ctx| {
            ctx.for_each(0..64, |c, i| {
                workers[i as usize].store(c.worker(), Ordering::Relaxed);
                if i >= 32 {
                    second_half_started.store(true, Ordering::Release);
                } else if i == 0 {
                    // Index 0 waits until the second half has started: only another worker
                    // can start it while this one waits here.
                    let end = Instant::now() + Duration::from_secs(20);
                    while !second_half_started.load(Ordering::Acquire) {
                        if Instant::now() > end {
                            waited.store(false, Ordering::Relaxed);
                            break;
                        }
                        std::thread::yield_now();
                    }
                }
            })
        })
        .unwrap();
        assert!(
            waited.load(Ordering::Relaxed),
            "{policy:?}: the idle worker did not take the second half within 20 s"
        );
        let w: Vec<usize> = workers.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        assert!(w.iter().all(|&x| x < 2), "{policy:?}: {w:?}");
        assert_ne!(
            w[0], w[32],
            "{policy:?}: both halves ran on one worker: {w:?}"
        );
    }
}

#[test]
fn a_panic_reaches_the_caller_after_the_other_indices_ran() {
    fixtures::without_panic_messages(|| {
        for grid in [(1, 1, 1), (1, 1, 2)] {
            let s = grid_scheduler(Policy::Las, grid);
            let ran = AtomicUsize::new(0);
            let r = catch_unwind(AssertUnwindSafe(|| {
                s.run(|ctx| {
                    ctx.for_each(0..1000, |_, i| {
                        assert!(i != 700, "index 700");
                        ran.fetch_add(1, Ordering::Relaxed);
                    })
                })
            }));
            let p = r.expect_err("the panic reaches the caller");
            assert_eq!(fixtures::panic_message(&*p), "index 700", "{grid:?}");
            // Every piece that did not contain index 700 ran to its end: at least the first half.
            assert!(ran.load(Ordering::Relaxed) >= 500, "{grid:?}");
            // The scheduler is still usable.
            let sum = AtomicUsize::new(0);
            s.run(|ctx| {
                ctx.for_each(0..100, |_, i| {
                    sum.fetch_add(i as usize, Ordering::Relaxed);
                })
            })
            .unwrap();
            assert_eq!(sum.load(Ordering::Relaxed), 4950);
        }
    });
}
