//! Stress: 1e7 tasks in all (1e6 in debug builds) as random spawn trees of many concurrent
//! requests, under LAS, NLS and unpinned, on layouts with several nodes and groups. Every task
//! must run exactly once, every request must complete with the result a sequential replay of
//! the same tree computes, and a request with an injected panic must fail alone. The same for
//! random join trees (`Ctx::join`, with scoped spawns mixed in).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use loci_sched::{fixtures, Ctx, Policy, RequestError, Scope};

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The children of task `id` with `budget` tasks in its subtree (itself included): ids, budgets
/// and how each is spawned (0 immediate, 1 deferred, 2 deferred on a node), and whether the task
/// spawns them inside a scope.
fn children(id: u64, budget: u64) -> (Vec<(u64, u64, u8)>, bool) {
    if budget <= 1 {
        return (vec![], false);
    }
    let h = mix(id);
    let k = 1 + (h % 4).min(budget - 2);
    let mut left = budget - 1;
    let mut out = Vec::new();
    for i in 0..k {
        let c = mix(id ^ (i + 1).wrapping_mul(0x1000_0000_01B3));
        let b = if i + 1 == k {
            left
        } else {
            1 + c % (left - (k - 1 - i))
        };
        left -= b;
        out.push((c, b, ((c >> 40) % 3) as u8));
    }
    (out, (h >> 20) & 15 == 0)
}

fn expected(id: u64, budget: u64) -> u64 {
    let (cs, _) = children(id, budget);
    cs.iter().fold(mix(id ^ 0xABCD), |a, &(c, b, _)| {
        a.wrapping_add(expected(c, b))
    })
}

struct Req {
    acc: AtomicU64,
    tasks: AtomicU64,
    poison: u64,
    nodes: Vec<u32>,
}

fn spawn_child(ctx: &Ctx, req: &Arc<Req>, c: u64, b: u64, kind: u8) {
    let r = req.clone();
    match kind {
        0 => ctx.spawn_immediate(move |ctx| task(ctx, &r, c, b)),
        1 => ctx.spawn_deferred(move |ctx| task(ctx, &r, c, b)),
        _ => {
            let node = req.nodes[(c % req.nodes.len() as u64) as usize];
            ctx.spawn_deferred_on(node, move |ctx| task(ctx, &r, c, b))
                .expect("node with workers")
        }
    }
}

fn spawn_scoped<'s>(s: &Scope<'s>, req: &Arc<Req>, c: u64, b: u64, kind: u8) {
    let r = req.clone();
    match kind {
        0 => s.spawn_immediate(move |s| task(s.ctx(), &r, c, b)),
        1 => s.spawn_deferred(move |s| task(s.ctx(), &r, c, b)),
        _ => {
            let node = req.nodes[(c % req.nodes.len() as u64) as usize];
            s.spawn_deferred_on(node, move |s| task(s.ctx(), &r, c, b))
                .expect("node with workers")
        }
    }
}

fn task(ctx: &Ctx, req: &Arc<Req>, id: u64, budget: u64) {
    req.tasks.fetch_add(1, Ordering::Relaxed);
    if id == req.poison {
        panic!("poisoned task {id:#x}");
    }
    req.acc.fetch_add(mix(id ^ 0xABCD), Ordering::Relaxed);
    let (cs, scoped) = children(id, budget);
    if scoped {
        ctx.scope(|s| {
            for &(c, b, k) in &cs {
                spawn_scoped(s, req, c, b, k);
            }
        });
    } else {
        for &(c, b, k) in &cs {
            spawn_child(ctx, req, c, b, k);
        }
    }
}

/// A task id in the tree (for poisoning): walk a few levels down.
fn some_task(root: u64, budget: u64, depth: u32) -> (u64, u64) {
    let (mut id, mut b) = (root, budget);
    for _ in 0..depth {
        let (cs, _) = children(id, b);
        match cs.last() {
            Some(&(c, cb, _)) => {
                id = c;
                b = cb;
            }
            None => break,
        }
    }
    (id, b)
}

fn run(policy: Policy, topo: &loci_topo::Topology, requests: u64, per_request: u64) {
    let s = fixtures::scheduler(topo, policy);
    let nodes = s.layout().nodes.clone();
    let mut handles = Vec::new();
    for r in 0..requests {
        let root = mix(r.wrapping_mul(7919) ^ policy as u64);
        // Every 8th request has a task that panics (before spawning its subtree of `lost`
        // further tasks).
        let (poison, lost) = if r % 8 == 5 {
            let (id, b) = some_task(root, per_request, 3);
            (id, b - 1)
        } else {
            (u64::MAX, 0)
        };
        let req = Arc::new(Req {
            acc: AtomicU64::new(0),
            tasks: AtomicU64::new(0),
            poison,
            nodes: nodes.clone(),
        });
        let q = req.clone();
        let h = s.submit(move |ctx| task(ctx, &q, root, per_request));
        handles.push((r, root, req, h, lost));
    }
    let mut total = 0;
    for (r, root, req, h, lost) in handles {
        total += per_request - lost;
        let res = h.wait();
        if req.poison != u64::MAX {
            match res {
                Err(RequestError::Panicked { message, .. }) => {
                    assert!(message.contains("poisoned task"), "{message}")
                }
                other => panic!("{policy:?} request {r}: expected failure, got {other:?}"),
            }
            // Every other task still ran exactly once (a failed request is not abandoned).
            assert_eq!(req.tasks.load(Ordering::Relaxed), per_request - lost);
            continue;
        }
        res.unwrap_or_else(|e| panic!("{policy:?} request {r}: {e}"));
        assert_eq!(
            req.tasks.load(Ordering::Relaxed),
            per_request,
            "{policy:?} request {r}: tasks lost or run twice"
        );
        assert_eq!(
            req.acc.load(Ordering::Relaxed),
            expected(root, per_request),
            "{policy:?} request {r}: wrong result"
        );
    }
    let st = s.stats();
    assert_eq!(st.tasks, total, "{policy:?}");
    assert_eq!(st.requests.len() as u64, requests);
    assert_eq!(
        st.requests.iter().filter(|r| r.failed).count() as u64,
        requests / 8
    );
    for rec in st.requests.iter().filter(|r| !r.failed) {
        assert_eq!(rec.tasks(), per_request, "{policy:?} {rec:?}");
    }
}

/// 4 runs of TOTAL/4 tasks each: LAS on a 2-node machine with 2 groups of 2 per node, LAS on the
/// E5310 layout (rule 5 territory), NLS, unpinned.
fn runs() -> [(Policy, loci_topo::Topology); 4] {
    [
        (Policy::Las, fixtures::grid(2, 2, 2)),
        (Policy::Las, fixtures::xeon_e5310()),
        (Policy::Nls, fixtures::grid(2, 2, 2)),
        (Policy::Unpinned, fixtures::grid(2, 1, 2)),
    ]
}

const TOTAL: u64 = if cfg!(debug_assertions) {
    1_000_000
} else {
    10_000_000
};

/// The injected panics are expected: keep them out of the output (other panics still print).
fn quiet_poisoned_tasks() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.payload().downcast_ref::<String>().map_or("", |s| s);
        if !msg.starts_with("poisoned task") {
            default(info);
        }
    }));
}

#[test]
fn stress_random_spawn_trees() {
    quiet_poisoned_tasks();
    let requests = 40;
    let per_request = TOTAL / 4 / requests;
    for (p, t) in &runs() {
        let start = std::time::Instant::now();
        run(*p, t, requests, per_request);
        eprintln!(
            "{p:?} on {}: {} tasks in {:.2?}",
            t.source,
            requests * per_request,
            start.elapsed()
        );
    }
}

#[test]
fn tree_shape_is_exact() {
    // The generator itself: a subtree of budget b has exactly b tasks.
    fn count(id: u64, b: u64) -> u64 {
        1 + children(id, b)
            .0
            .iter()
            .map(|&(c, cb, _)| count(c, cb))
            .sum::<u64>()
    }
    for (id, b) in [(1, 1), (2, 2), (3, 17), (4, 1000)] {
        assert_eq!(count(id, b), b);
    }
}

/// A join tree node's split: `None` for a leaf, else the left budget (0: the node has one
/// child, called directly), the two children's ids, and whether the left child runs as a
/// scoped deferred task (beside the right one computed inline) instead of a join.
fn join_split(id: u64, budget: u64) -> Option<(u64, u64, u64, bool)> {
    let rest = budget.checked_sub(1).filter(|&r| r > 0)?;
    let h = mix(id ^ 0x5151);
    Some((
        h % rest,
        mix(id ^ 1),
        mix(id ^ 2),
        (h >> 40).is_multiple_of(8),
    ))
}

fn join_expected(id: u64, budget: u64) -> u64 {
    let own = mix(id ^ 0x1234);
    match join_split(id, budget) {
        None => own,
        Some((l, lid, rid, _)) => {
            let left = if l > 0 { join_expected(lid, l) } else { 0 };
            own.wrapping_add(left)
                .wrapping_add(join_expected(rid, budget - 1 - l))
        }
    }
}

/// One node of a random join tree of `budget` nodes: counts itself, joins (or scopes) its
/// children, and panics after them if it is the request's poisoned node.
fn join_node(ctx: &Ctx, req: &Req, id: u64, budget: u64) -> u64 {
    req.tasks.fetch_add(1, Ordering::Relaxed);
    let mut acc = mix(id ^ 0x1234);
    if let Some((l, lid, rid, scoped)) = join_split(id, budget) {
        let r = budget - 1 - l;
        let (a, b) = if l == 0 {
            (0, join_node(ctx, req, rid, r))
        } else if scoped {
            let (mut a, mut b) = (0, 0);
            ctx.scope(|s| {
                s.spawn_deferred(|s| a = join_node(s.ctx(), req, lid, l));
                b = join_node(ctx, req, rid, r);
            });
            (a, b)
        } else {
            ctx.join(|c| join_node(c, req, lid, l), |c| join_node(c, req, rid, r))
        };
        acc = acc.wrapping_add(a).wrapping_add(b);
    }
    if id == req.poison {
        panic!("poisoned task {id:#x}");
    }
    acc
}

/// Join stress: random (unbalanced) join trees with scoped spawns mixed in, 40 concurrent
/// requests per layout and policy. Every node runs exactly once (a panic propagates only after
/// both halves of every join finished), every request's result equals the sequential replay, a
/// request with a poisoned node fails, and the counters add up: tasks per request record, and
/// joins taken both ways (over all layouts).
#[test]
fn stress_random_join_trees() {
    quiet_poisoned_tasks();
    let requests = 40u64;
    let per_request = TOTAL / 4 / requests;
    // With 40 requests in flight workers mostly find other requests' tasks before an idle
    // worker's steal of a join (none at all under NLS, whose shared FIFO comes before stealing,
    // in some runs); the tails of the runs steal some.
    let mut stolen = 0;
    for (policy, topo) in &runs() {
        let s = fixtures::scheduler(topo, *policy);
        let start = std::time::Instant::now();
        let handles: Vec<_> = (0..requests)
            .map(|r| {
                let root = mix(r ^ 0xF00D ^ *policy as u64);
                let poison = if r % 8 == 3 {
                    some_join_node(root, per_request)
                } else {
                    u64::MAX
                };
                let req = Arc::new(Req {
                    acc: AtomicU64::new(0),
                    tasks: AtomicU64::new(0),
                    poison,
                    nodes: vec![],
                });
                let q = req.clone();
                (
                    root,
                    req,
                    s.submit(move |ctx| join_node(ctx, &q, root, per_request)),
                )
            })
            .collect();
        for (root, req, h) in handles {
            let res = h.wait();
            assert_eq!(req.tasks.load(Ordering::Relaxed), per_request, "{policy:?}");
            if req.poison == u64::MAX {
                assert_eq!(res.unwrap(), join_expected(root, per_request), "{policy:?}");
            } else {
                assert!(
                    matches!(res, Err(RequestError::Panicked { .. })),
                    "{policy:?}"
                );
            }
        }
        let st = s.stats();
        assert_eq!(st.requests.iter().map(|r| r.tasks()).sum::<u64>(), st.tasks);
        assert!(st.join_steals < st.joins, "{policy:?}: {st:?}");
        stolen += st.join_steals;
        eprintln!(
            "{policy:?} on {}: {} join-tree nodes ({} joins, {} stolen) in {:.2?}",
            topo.source,
            requests * per_request,
            st.joins,
            st.join_steals,
            start.elapsed()
        );
    }
    assert!(stolen > 0, "no join was stolen on any layout");
}

/// A node a few levels down a join tree (the poisoned one of a request).
fn some_join_node(root: u64, budget: u64) -> u64 {
    let (mut id, mut b) = (root, budget);
    for _ in 0..4 {
        match join_split(id, b) {
            Some((l, _, rid, _)) => {
                id = rid;
                b -= 1 + l;
            }
            None => break,
        }
    }
    id
}
