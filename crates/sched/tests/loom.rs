//! Loom models of the scheduler core: sleep/wake, request completion, scope completion, the
//! deferred queue and the NLS FIFO, the join latch handoff, with every interleaving loom explores
//! (bounded preemptions).
//!
//! Run: `scripts/loom-sched` (RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test
//! -p loci-sched --release --test loom). The immediate queues are a mutex-guarded deque under loom
//! (see src/sync.rs); everything else is the production code.
#![cfg(loom)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use loci_sched::{fixtures, Affinity, Config, Policy, Scheduler};

fn config(policy: Policy) -> Config {
    Config {
        policy,
        affinity: Affinity::None,
        spin_rounds: 0,
        max_request_records: 4,
        ..Config::default()
    }
}

/// Runs `body` on a scheduler over `fixtures::grid(nodes, groups, cpus)` under every interleaving
/// loom explores; the scheduler is dropped (its workers joined) inside the model.
fn model(policy: Policy, grid: (u32, u32, u32), body: impl Fn(&Scheduler) + Send + Sync + 'static) {
    loom::model(move || {
        let s = Scheduler::new(&fixtures::grid(grid.0, grid.1, grid.2), config(policy)).unwrap();
        body(&s);
        drop(s);
    });
}

/// A request whose root spawns one immediate and one deferred task completes with both counted,
/// whichever worker wakes, sleeps or steals when.
fn request_with_children(policy: Policy, nodes: u32, groups: u32, cpus: u32) {
    model(policy, (nodes, groups, cpus), |s| {
        let h = s.submit(|ctx| {
            let n = Arc::new(AtomicU64::new(0));
            let (a, b) = (n.clone(), n.clone());
            ctx.spawn_immediate(move |_| {
                a.fetch_add(1, Ordering::Relaxed);
            });
            ctx.spawn_deferred(move |_| {
                b.fetch_add(10, Ordering::Relaxed);
            });
            n
        });
        assert_eq!(h.wait().unwrap().load(Ordering::Relaxed), 11);
    });
}

#[test]
fn las_one_group_two_workers() {
    request_with_children(Policy::Las, 1, 1, 2);
}

#[test]
fn las_two_nodes_one_worker_each() {
    request_with_children(Policy::Las, 2, 1, 1);
}

#[test]
fn nls_two_workers() {
    request_with_children(Policy::Nls, 1, 2, 1);
}

/// A scope's owner waits (helping or blocked) until its child ran on either worker.
#[test]
fn scope_completion() {
    model(Policy::Las, (1, 1, 2), |s| {
        let h = s.submit(|ctx| {
            let mut x = 0u64;
            ctx.scope(|sc| {
                sc.spawn_deferred(|_| x = 7);
            });
            x
        });
        assert_eq!(h.wait().unwrap(), 7);
    });
}

/// Two requests submitted from outside race with the workers' sleep; a panic fails only its own.
#[test]
fn two_requests_one_fails() {
    model(Policy::Las, (2, 1, 1), |s| {
        let a = s.submit(|_| -> u32 { panic!("boom") });
        let b = s.submit(|_| 2u32);
        assert!(a.wait().is_err());
        assert_eq!(b.wait().unwrap(), 2);
    });
}

/// A task queued on another node's group: once the second request is submitted (a crowd on two
/// nodes), only that node's worker may take it, so the spawn must wake it through the strict
/// (fenced) path of the two-phase sleep, whatever point of going to sleep that worker is at.
/// (Before the crowd forms either worker may take it.)
#[test]
fn kept_task_on_another_node_wakes_its_worker() {
    model(Policy::Las, (2, 1, 1), |s| {
        let a = s.submit(|ctx| {
            let n = Arc::new(AtomicU64::new(0));
            let m = n.clone();
            let other = 1 - ctx.node();
            ctx.spawn_deferred_on(other, move |_| {
                m.store(1, Ordering::Relaxed);
            })
            .unwrap();
            n
        });
        let b = s.submit(|_| 2u32);
        assert_eq!(a.wait().unwrap().load(Ordering::Relaxed), 1);
        assert_eq!(b.wait().unwrap(), 2);
    });
}

/// A lone request that stays on its node (`RequestOptions::stay_on_node`): its first task is
/// woken only within its node, and a task it queues on the other node only that node's worker
/// may take (no crowd needed), so both wake-ups go through the node-only orders; the task runs
/// on the node it was queued for.
#[test]
fn stay_on_node_request_wakes_only_its_nodes_workers() {
    model(Policy::Las, (2, 1, 1), |s| {
        let a = s
            .submit_on_with(0, loci_sched::RequestOptions::stay_on_node(), |ctx| {
                assert_eq!(ctx.node(), 0);
                let n = Arc::new(AtomicU64::new(u64::MAX));
                let m = n.clone();
                ctx.spawn_deferred_on(1, move |ctx| {
                    m.store(u64::from(ctx.node()), Ordering::Relaxed);
                })
                .unwrap();
                n
            })
            .unwrap();
        assert_eq!(a.wait().unwrap().load(Ordering::Relaxed), 1);
    });
}

/// A join's second half runs exactly once, popped back by its joiner or stolen by the other
/// worker (which then sets the latch the joiner polls or naps on), and the joiner returns both
/// results after it, whatever the interleaving of push, steal, pop and latch.
#[test]
fn join_handoff() {
    model(Policy::Las, (1, 1, 2), |s| {
        let h = s.submit(|ctx| {
            let runs = AtomicU64::new(0);
            let (a, b) = ctx.join(
                |_| 1u64,
                |_| {
                    runs.fetch_add(1, Ordering::Relaxed);
                    2u64
                },
            );
            (a, b, runs.load(Ordering::Relaxed))
        });
        assert_eq!(h.wait().unwrap(), (1, 2, 1));
    });
}

/// A panic in a join's second half, popped back or stolen, reaches the joiner after the handoff
/// and fails the request with its message.
#[test]
fn join_panic_in_second_half() {
    model(Policy::Las, (1, 1, 2), |s| {
        let h = s.submit(|ctx| ctx.join(|_| 1u64, |_| -> u64 { panic!("second half") }));
        match h.wait() {
            Err(loci_sched::RequestError::Panicked { message, .. }) => {
                assert_eq!(message, "second half")
            }
            other => panic!("expected the request to fail, got {other:?}"),
        }
    });
}
