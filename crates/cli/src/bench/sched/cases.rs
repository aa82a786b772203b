//! How each system runs each case: the rows a system contributes ([`Form`], [`row_specs`]),
//! rayon's forms (join tree, scope spawns, par_iter, the pipelines as spawns) and the real-work
//! tasks with loci's tree for them.

use std::sync::atomic::{AtomicU64, Ordering};

use loci_sched::workload::{
    aggregate, produce, splitmix as mix, transform, tree_children, PipelineSpec,
};
use loci_sched::Ctx;

use super::policy_of;

pub(super) fn rayon_tree<'s>(s: &rayon::Scope<'s>, n: u64) {
    let Some((left, right)) = tree_children(n) else {
        return;
    };
    if left > 0 {
        s.spawn(move |s| rayon_tree(s, left));
    }
    s.spawn(move |s| rayon_tree(s, right));
}

/// A fork-join primitive, so that rayon and loci run the very same tree code (monomorphised:
/// no indirection): [`RayonJoin`] is `rayon::join` on the installed pool, a loci [`Ctx`] is
/// [`Ctx::join`] (the second closure gets the context of the worker that runs it).
pub(super) trait Fork {
    fn fork(&self, a: impl FnOnce(&Self) + Send, b: impl FnOnce(&Self) + Send);
}

/// `rayon::join` (on the pool the caller installed).
pub(super) struct RayonJoin;

impl Fork for RayonJoin {
    #[inline]
    fn fork(&self, a: impl FnOnce(&Self) + Send, b: impl FnOnce(&Self) + Send) {
        rayon::join(|| a(&RayonJoin), || b(&RayonJoin));
    }
}

impl Fork for Ctx {
    #[inline]
    fn fork(&self, a: impl FnOnce(&Self) + Send, b: impl FnOnce(&Self) + Send) {
        self.join(a, b);
    }
}

/// The tiny-tasks tree as fork-join (rayon's best form, and loci's): the same tree of exactly
/// `n` tasks as loci's spawn [`tree`](loci_sched::workload::tree) (a node with `n` tasks has
/// children of `(n-1)/2` and the rest), each node one call; a node with two children joins them
/// (the second is a job on the worker's stack that another worker may steal, the first runs
/// inline), a node with one child calls it. `visit` runs once per task (a no-op in the
/// benchmark; tests count with it).
pub(super) fn join_tree<J: Fork, F: Fn() + Sync>(j: &J, n: u64, visit: &F) {
    visit();
    let Some((left, right)) = tree_children(n) else {
        return;
    };
    if left > 0 {
        j.fork(
            |j| join_tree(j, left, visit),
            |j| join_tree(j, right, visit),
        );
    } else {
        join_tree(j, right, visit);
    }
}

/// The real-work case: `tasks` independent tasks; task `i` reads `words` words (a few KiB) of a
/// shared buffer larger than the LLC, at a slice picked by a hash of `i`, folds them into one
/// word and writes that into its own slot `out[i]`. Deterministic: [`RealWork::checksum`] of the
/// slots is the same for every system that ran every task once.
pub(super) struct RealWork {
    data: Vec<u64>,
    words: usize,
    out: Vec<AtomicU64>,
}

impl RealWork {
    /// `buffer_bytes` of pseudo-random words (rounded down to whole slices of `bytes`, at least
    /// one) and `tasks` zeroed result slots.
    pub(super) fn new(tasks: u64, bytes: usize, buffer_bytes: usize) -> RealWork {
        let words = (bytes / 8).max(1);
        let slices = (buffer_bytes / 8 / words).max(1);
        let mut s = 0x5EED_u64;
        let data = (0..slices * words)
            .map(|_| {
                s = mix(s);
                s
            })
            .collect();
        RealWork {
            data,
            words,
            out: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(super) fn tasks(&self) -> u64 {
        self.out.len() as u64
    }

    /// Task `i`'s work (never inlined: the same machine code under every scheduler).
    #[inline(never)]
    fn item(&self, i: u64) -> u64 {
        let slices = (self.data.len() / self.words) as u64;
        let s = (mix(i) % slices) as usize * self.words;
        self.data[s..s + self.words]
            .iter()
            .fold(i, |a, &x| a.wrapping_add(x ^ (a >> 3)))
    }

    /// Runs task `i`: its result into its own slot.
    #[inline]
    pub(super) fn run(&self, i: u64) {
        self.out[i as usize].store(self.item(i), Ordering::Relaxed);
    }

    pub(super) fn clear(&self) {
        for o in &self.out {
            o.store(0, Ordering::Relaxed);
        }
    }

    /// A checksum of every slot with its index (a skipped task leaves a 0 that changes it).
    pub(super) fn checksum(&self) -> u64 {
        self.out.iter().enumerate().fold(0u64, |a, (i, o)| {
            a.wrapping_add(mix(o.load(Ordering::Relaxed) ^ (i as u64).rotate_left(32)))
        })
    }

    /// The checksum every system must produce, computed on this thread.
    pub(super) fn expected(&self) -> u64 {
        self.out.iter().enumerate().fold(0u64, |a, (i, _)| {
            a.wrapping_add(mix(self.item(i as u64) ^ (i as u64).rotate_left(32)))
        })
    }
}

/// The real-work case as the tiny-tasks tree of spawns (the labelled `loci-las-spawn` row): each
/// node one task that first spawns its children (the items after it: `lo+1..lo+1+left` and the
/// rest) as immediate tasks and then runs item `lo`. A free worker steals the oldest task of the
/// other's queue, which is the largest subtree still unclaimed; no task waits for its children
/// (the request ends when its last task does).
pub(super) fn loci_work_tree(ctx: &Ctx, w: &'static RealWork, lo: u64, n: u64) {
    if let Some((left, right)) = tree_children(n) {
        // The right subtree first: this worker runs the youngest task next (the left subtree,
        // so items run in about ascending order, as in the join tree), another steals the oldest.
        ctx.spawn_immediate(move |c| loci_work_tree(c, w, lo + 1 + left, right));
        if left > 0 {
            ctx.spawn_immediate(move |c| loci_work_tree(c, w, lo + 1, left));
        }
    }
    w.run(lo);
}

/// The real-work tree as fork-join (loci's form, and rayon's labelled `rayon-join` row): one
/// call per task, the subtrees joined, then the node's own item.
pub(super) fn work_join<J: Fork>(j: &J, w: &RealWork, lo: u64, n: u64) {
    if let Some((left, right)) = tree_children(n) {
        if left > 0 {
            j.fork(
                |j| work_join(j, w, lo + 1, left),
                |j| work_join(j, w, lo + 1 + left, right),
            );
        } else {
            work_join(j, w, lo + 1 + left, right);
        }
    }
    w.run(lo);
}

/// rayon's best form for independent tasks, what its documentation leads to: a parallel
/// iterator over the task indices (adaptive splitting: a worker runs a range of items as plain
/// loop iterations and splits it only when another worker is idle to steal the other half).
pub(super) fn rayon_work_par_iter(w: &RealWork) {
    use rayon::prelude::*;
    (0..w.tasks()).into_par_iter().for_each(|i| w.run(i));
}

fn rayon_producer<'s>(
    s: &rayon::Scope<'s>,
    seed: u64,
    chain: usize,
    k: usize,
    spec: PipelineSpec,
    acc: &'s AtomicU64,
) {
    if k + 1 < spec.buffers {
        s.spawn(move |s| rayon_producer(s, seed, chain, k + 1, spec, acc));
    }
    let mut buf = produce(seed, chain, k, spec.buffer_bytes);
    s.spawn(move |s| {
        transform(&mut buf);
        s.spawn(move |_| {
            acc.fetch_add(aggregate(&buf), Ordering::Relaxed);
        });
    });
}

/// The same pipeline requests on rayon: one scope, every stage a spawn (rayon has no requests or
/// deferred tasks). Request `i` adds its checksum into `accs[i]`, which this zeroes first, as
/// `run_pipelines_into` does for loci.
pub(super) fn rayon_pipelines(pool: &rayon::ThreadPool, spec: PipelineSpec, accs: &[AtomicU64]) {
    for a in accs {
        a.store(0, Ordering::Relaxed);
    }
    pool.scope(|s| {
        for (seed, acc) in accs.iter().enumerate() {
            s.spawn(move |s| {
                for chain in 0..spec.chains {
                    s.spawn(move |s| rayon_producer(s, seed as u64, chain, 0, spec, acc));
                }
            });
        }
    });
}

/// How a row's system runs a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Form {
    /// loci's pipeline requests (the multi- and single-request cases).
    Loci,
    /// loci's `Ctx::join` over the case's tree (tiny-tasks; the labelled `-join` row of
    /// real-work).
    LociJoin,
    /// loci's `Ctx::for_each` over the task indices (real-work: adaptive splitting, as par_iter).
    LociForEach,
    /// loci's tree of immediate spawns, fire and forget (the labelled `loci-las-spawn` row).
    LociSpawn,
    /// `rayon::join` recursion.
    Join,
    /// `rayon::scope` spawns (a boxed job per task).
    Scope,
    /// `into_par_iter().for_each` over the task indices.
    ParIter,
}

impl Form {
    pub(super) fn name(self) -> &'static str {
        match self {
            Form::Loci => "requests",
            Form::LociJoin | Form::Join => "join",
            Form::LociSpawn => "spawn",
            Form::LociForEach => "for_each",
            Form::Scope => "scope",
            Form::ParIter => "par_iter",
        }
    }
}

/// One row of a case: its system name in the report and how it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RowSpec {
    pub(super) name: String,
    pub(super) form: Form,
}

/// The system of loci's labelled second form (spawn trees) in tiny-tasks and real-work.
pub(super) const LOCI_SPAWN_OF: &str = "loci-las";

/// The rows that `system` contributes to `case`. A loci system: its join tree in tiny-tasks, its
/// `for_each` loop in real-work with the join tree as the labelled `-join` row (plus, for
/// loci-las, the spawn tree as `loci-las-spawn` in both), its requests otherwise.
/// rayon: its best form for the case as `rayon` (the baseline of the ratios), then its other
/// forms as labelled rows.
pub(super) fn row_specs(case: &str, system: &str) -> Vec<RowSpec> {
    let r = |name: &str, form| RowSpec {
        name: name.to_string(),
        form,
    };
    let trees = case == "tiny-tasks" || case == "real-work";
    if policy_of(system).is_some() {
        if !trees {
            return vec![r(system, Form::Loci)];
        }
        let mut rows = if case == "real-work" {
            vec![
                r(system, Form::LociForEach),
                r(&format!("{system}-join"), Form::LociJoin),
            ]
        } else {
            vec![r(system, Form::LociJoin)]
        };
        if system == LOCI_SPAWN_OF {
            rows.push(r(&format!("{system}-spawn"), Form::LociSpawn));
        }
        return rows;
    }
    match case {
        // join: rayon's cheapest fork (a stack job, no allocation); scope: the fire-and-forget
        // spawn that matches loci's spawn tree spawn for spawn (a boxed job per task).
        "tiny-tasks" => vec![r("rayon", Form::Join), r("rayon-scope", Form::Scope)],
        // par_iter: what rayon's documentation leads to for independent items; join: the same
        // one-call-per-task tree as loci's.
        "real-work" => vec![r("rayon", Form::ParIter), r("rayon-join", Form::Join)],
        // A chain spawns its successor and the stages of one buffer follow each other: spawns
        // into one scope (join would make every producer wait for its whole chain).
        _ => vec![r("rayon", Form::Scope)],
    }
}

/// Tasks in one run of `case`, the same count for every system (the denominator of cpu time per
/// task): the tree's tasks; the real-work tasks; per pipeline request its first task and three
/// stage tasks per buffer (rayon: the per-request spawn and three spawns per buffer).
pub(super) fn tasks_per_run(
    case: &str,
    tasks: u64,
    work_tasks: u64,
    requests: usize,
    spec: PipelineSpec,
) -> u64 {
    let per_request = 1 + 3 * (spec.chains * spec.buffers) as u64;
    match case {
        "tiny-tasks" => tasks,
        "real-work" => work_tasks,
        "multi-request" => requests as u64 * per_request,
        _ => per_request,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loci_sched::workload::tree;
    use loci_sched::{Config, Policy, Scheduler};

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    fn scheduler(policy: Policy) -> Scheduler {
        let topo = crate::this_machine().unwrap();
        Scheduler::new(
            &topo,
            Config {
                policy,
                ..Config::default()
            },
        )
        .unwrap()
    }

    /// Joins in the tree of `n` tasks: one per node with two children.
    fn joins_in(n: u64) -> u64 {
        match tree_children(n) {
            Some((l, r)) if l > 0 => 1 + joins_in(l) + joins_in(r),
            Some((_, r)) => joins_in(r),
            None => 0,
        }
    }

    /// The join tree runs exactly `n` tasks on rayon and on loci (LAS and NLS), as many as
    /// loci's spawn tree of the same size; loci counts one join per node with two children.
    #[test]
    fn join_trees_run_exactly_n_tasks() {
        let p = pool(2);
        let las = scheduler(Policy::Las);
        let nls = scheduler(Policy::Nls);
        for n in (1..=70).chain([1000, 4097, 100_000]) {
            let count = AtomicU64::new(0);
            let visit = || {
                count.fetch_add(1, Ordering::Relaxed);
            };
            p.install(|| join_tree(&RayonJoin, n, &visit));
            assert_eq!(count.load(Ordering::Relaxed), n, "rayon join tree of {n}");
            for s in [&las, &nls] {
                count.store(0, Ordering::Relaxed);
                let before = s.stats();
                s.run(|ctx| join_tree(ctx, n, &visit)).unwrap();
                assert_eq!(count.load(Ordering::Relaxed), n, "loci join tree of {n}");
                assert_eq!(s.stats().since(&before).joins, joins_in(n), "joins in {n}");
            }
            let before = las.stats();
            las.submit(move |ctx| tree(ctx, n)).wait().unwrap();
            assert_eq!(las.stats().since(&before).tasks, n, "loci tree of {n}");
        }
    }

    /// Every system's form of the real-work case runs every task once: the checksum equals the
    /// one computed on one thread, for loci (LAS, NLS; join and spawn trees) and rayon (par_iter,
    /// join); a skipped
    /// task changes it.
    #[test]
    fn real_work_checksum_is_the_same_for_every_system() {
        let p = pool(2);
        let las = scheduler(Policy::Las);
        let nls = scheduler(Policy::Nls);
        for (n, bytes, buffer) in [
            (1u64, 64, 64),
            (2, 64, 4096),
            (1000, 256, 1 << 16),
            (5001, 4096, 1 << 20),
        ] {
            let w: &'static RealWork = Box::leak(Box::new(RealWork::new(n, bytes, buffer)));
            let want = w.expected();
            let mut got = Vec::new();
            for s in [&las, &nls] {
                w.clear();
                s.run(|ctx| work_join(ctx, w, 0, w.tasks())).unwrap();
                got.push(w.checksum());
                w.clear();
                s.run(|ctx| ctx.for_each(0..w.tasks(), |_, i| w.run(i)))
                    .unwrap();
                got.push(w.checksum());
                w.clear();
                s.submit(move |ctx| loci_work_tree(ctx, w, 0, w.tasks()))
                    .wait()
                    .unwrap();
                got.push(w.checksum());
            }
            w.clear();
            p.install(|| rayon_work_par_iter(w));
            got.push(w.checksum());
            w.clear();
            p.install(|| work_join(&RayonJoin, w, 0, w.tasks()));
            got.push(w.checksum());
            assert_eq!(got, vec![want; 8], "n={n} bytes={bytes}");
            // The same run with the last task skipped does not pass.
            w.clear();
            for i in 0..n - 1 {
                w.run(i);
            }
            assert_ne!(
                w.checksum(),
                want,
                "n={n}: a skipped task must change the checksum"
            );
        }
        // Different tasks read different slices: the results are not all the same word.
        let w = RealWork::new(64, 64, 1 << 16);
        let items: std::collections::HashSet<u64> = (0..64).map(|i| w.item(i)).collect();
        assert!(items.len() > 60);
    }

    #[test]
    fn rows_put_the_best_forms_first() {
        use Form::*;
        /// A case, a system and its rows, best first.
        type Want = (&'static str, &'static str, &'static [(&'static str, Form)]);
        #[rustfmt::skip]
        let want: [Want; 8] = [
            ("tiny-tasks", "rayon", &[("rayon", Join), ("rayon-scope", Scope)]),
            ("real-work", "rayon", &[("rayon", ParIter), ("rayon-join", Join)]),
            ("multi-request", "rayon", &[("rayon", Scope)]),
            ("tiny-tasks", "loci-las", &[("loci-las", LociJoin), ("loci-las-spawn", LociSpawn)]),
            ("tiny-tasks", "loci-nls", &[("loci-nls", LociJoin)]),
            ("real-work", "loci-las",
                &[("loci-las", LociForEach), ("loci-las-join", LociJoin), ("loci-las-spawn", LociSpawn)]),
            ("real-work", "loci-nls", &[("loci-nls", LociForEach), ("loci-nls-join", LociJoin)]),
            ("single-request", "loci-las", &[("loci-las", Loci)]),
        ];
        for (case, system, rows) in want {
            let got: Vec<(String, Form)> = row_specs(case, system)
                .into_iter()
                .map(|r| (r.name, r.form))
                .collect();
            let rows: Vec<(String, Form)> = rows.iter().map(|&(n, f)| (n.into(), f)).collect();
            assert_eq!(got, rows, "{case} on {system}");
        }
        let spec = PipelineSpec {
            chains: 4,
            buffers: 16,
            buffer_bytes: 64,
        };
        assert_eq!(tasks_per_run("tiny-tasks", 7, 9, 16, spec), 7);
        assert_eq!(tasks_per_run("real-work", 7, 9, 16, spec), 9);
        assert_eq!(tasks_per_run("single-request", 7, 9, 16, spec), 1 + 3 * 64);
        assert_eq!(
            tasks_per_run("multi-request", 7, 9, 16, spec),
            16 * (1 + 3 * 64)
        );
    }
}
