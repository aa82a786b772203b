//! The threads of an array run are a loci-place [`Plan`]: thread `i` runs on
//! `plan.threads[i].cpus` (when `plan.pinned`; an `os` plan leaves them to the OS). This module
//! makes the plans of array runs (first-touch memory, more threads than cpus allowed, as a
//! database's worker pool would) and runs persistent worker threads where a plan says.

use loci_place::{MemPolicy, Plan, PlanError, Strategy};
use loci_topo::{CpuSet, Topology};

use crate::error::ArrayError;

/// The plan of `threads` threads under the loci-place `strategy` on `topo`.
pub fn plan(topo: &Topology, strategy: &Strategy, threads: usize) -> Result<Plan, ArrayError> {
    Plan::new(topo, strategy, threads, &MemPolicy::FirstTouch, true).map_err(|e| match e {
        PlanError::Strategy(e) => ArrayError::Parse(format!("thread strategy `{strategy}`: {e}")),
        other => plan_error(other),
    })
}

/// A plan error without the `--threads:` of the command line.
fn plan_error(e: PlanError) -> ArrayError {
    ArrayError::Pin(match e {
        PlanError::Strategy(e) => e.to_string(),
        other => other.to_string(),
    })
}

/// `threads` threads the OS places (loci-place `os`).
pub fn unpinned(topo: &Topology, threads: usize) -> Result<Plan, ArrayError> {
    plan(topo, &Strategy::os(), threads)
}

/// A pinned plan with thread `i` on `sets[i]` (a search's candidate, where threads may share a
/// cpu and need not go in ascending order); loci-place checks that every cpu is allowed.
pub fn plan_on(topo: &Topology, sets: Vec<CpuSet>) -> Result<Plan, ArrayError> {
    Plan::from_cpu_sets(topo, sets, &MemPolicy::FirstTouch).map_err(plan_error)
}

/// A pinned plan with thread `i` on exactly `cpus[i]`.
pub fn plan_on_cpus(topo: &Topology, cpus: &[u32]) -> Result<Plan, ArrayError> {
    plan_on(topo, cpus.iter().map(|&c| CpuSet::single(c)).collect())
}

/// The single cpu of each thread, when the plan pins every thread to exactly one.
pub fn single_cpus(plan: &Plan) -> Option<Vec<u32>> {
    if !plan.pinned {
        return None;
    }
    plan.threads
        .iter()
        .map(|t| (t.cpus.len() == 1).then(|| t.cpus.first()).flatten())
        .collect()
}

/// The plan in one line: `t0:0 t1:4-5 t2:os` (`os`: not pinned).
pub fn describe(plan: &Plan) -> String {
    let each = plan.threads.iter().enumerate().map(|(i, t)| {
        if plan.pinned {
            format!("t{i}:{}", t.cpus)
        } else {
            format!("t{i}:os")
        }
    });
    each.collect::<Vec<_>>().join(" ")
}

/// Checks that a plan has threads and that every pinned cpu is allowed on `topo` (a plan made
/// for another machine, or before the affinity changed).
pub fn check(plan: &Plan, topo: &Topology) -> Result<(), ArrayError> {
    if plan.threads.is_empty() {
        return Err(ArrayError::Pin("a plan needs at least one thread".into()));
    }
    if !plan.pinned {
        return Ok(());
    }
    // Checked per cpu without building sets (this runs on every subarray call); the sets are
    // built only for the error message.
    let allowed = |c: u32| topo.cpu(c).is_some_and(|c| c.online && c.allowed);
    for (i, t) in plan.threads.iter().enumerate() {
        if t.cpus.is_empty() {
            return Err(ArrayError::Pin(format!("thread {i} has an empty cpu set")));
        }
        if !t.cpus.iter().all(allowed) {
            let allowed = topo.allowed_cpus();
            let bad = t.cpus.difference(&allowed);
            return Err(ArrayError::Pin(format!(
                "thread {i} is planned on cpus {bad}, which are not allowed here (allowed cpus: {allowed})"
            )));
        }
    }
    Ok(())
}

/// Runs `work(i)` on thread `i` of `plan` (each bound first to `plan.threads[i].cpus`) and
/// returns the results in thread order. A thread that cannot be bound does no work and the call
/// fails naming the thread and its cpus. A panic in `work` is resumed on the caller.
///
/// The threads are persistent: one pool of `plan.threads.len()` workers per thread count, kept
/// for the life of the process (rayon's `broadcast` runs a borrowing closure once on every worker
/// of a pool and waits for all). Each worker remembers the cpus it is bound to and calls
/// `sched_setaffinity` only when the plan asks for others; the threads of an unpinned plan get
/// the caller's cpus, as threads the caller spawned would. Why: starting and binding two threads
/// per call cost ~170 us on the development machine (a 1.05 MB subarray took 226 us on two
/// fresh threads against 54 us on the calling thread), which kept every result under 4 MiB on
/// one thread.
///
/// Why not loci-sched's workers: a plan here places each individual thread on a chosen cpu or cpu
/// set (two threads on one cpu, `elastic`'s shared set), and the static schedule (and the cost
/// model) needs part `p` on thread `p*T/P`. loci-sched runs one worker per cpu of its core groups
/// and hands tasks out by its stealing rules, so it can express neither a placement per thread
/// nor which thread runs a part.
pub fn run_pinned<R: Send>(
    plan: &Plan,
    work: impl Fn(usize) -> R + Sync,
) -> Result<Vec<R>, ArrayError> {
    let n = plan.threads.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let caller = if plan.pinned {
        None
    } else {
        Some(
            loci_place::sys::get_affinity(0)
                .map_err(|e| ArrayError::Pin(format!("cannot read the caller's cpus: {e}")))?,
        )
    };
    let pool = workers(n)?;
    let out: Vec<Result<R, ArrayError>> = pool.broadcast(|ctx| {
        let i = ctx.index();
        let want = caller.as_ref().unwrap_or(&plan.threads[i].cpus);
        bind_worker(want).map_err(|e| {
            ArrayError::Pin(format!("thread {i} cannot be bound to cpus {want}: {e}"))
        })?;
        Ok(work(i))
    });
    out.into_iter().collect()
}

/// The persistent pool of `n` workers.
fn workers(n: usize) -> Result<std::sync::Arc<rayon::ThreadPool>, ArrayError> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(p) = pools.get(&n) {
        return Ok(p.clone());
    }
    let p = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("loci-array-{i}"))
            .build()
            .map_err(|e| ArrayError::Pin(format!("cannot start {n} worker threads: {e}")))?,
    );
    pools.insert(n, p.clone());
    Ok(p)
}

/// Binds the calling worker to `want` unless it is bound there already (what it was last bound
/// to is remembered per worker; a failed bind forgets it).
fn bind_worker(want: &CpuSet) -> std::io::Result<()> {
    use std::cell::RefCell;
    thread_local! {
        static BOUND: RefCell<Option<CpuSet>> = const { RefCell::new(None) };
    }
    BOUND.with(|b| {
        let mut b = b.borrow_mut();
        if b.as_ref() == Some(want) {
            return Ok(());
        }
        *b = None;
        loci_place::sys::set_affinity(0, want)?;
        *b = Some(want.clone());
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn here() -> Topology {
        Topology::flat(loci_place::sys::get_affinity(0).unwrap(), "test:affinity")
    }

    fn ran_on(p: &Plan) -> Vec<u32> {
        run_pinned(p, |_| loci_place::sys::current_cpu().unwrap()).unwrap()
    }

    #[test]
    fn threads_run_where_planned() {
        let topo = here();
        let cpus = topo.allowed_cpus();
        let list: Vec<u32> = cpus.iter().chain(cpus.iter()).collect();
        assert_eq!(ran_on(&plan_on_cpus(&topo, &list).unwrap()), list);
    }

    /// A plan made by loci-place from a strategy string binds where it says: `cpus:C` puts the
    /// one thread on the last allowed cpu C (cpu 1 on a 2-cpu machine), seen by `sched_getcpu`.
    #[test]
    fn a_strategy_plan_binds_threads_where_it_says() {
        let topo = here();
        let last = topo.allowed_cpus().iter().last().unwrap();
        let s: Strategy = format!("cpus:{last}").parse().unwrap();
        let p = plan(&topo, &s, 1).unwrap();
        assert!(p.pinned);
        assert_eq!(p.threads[0].cpus, CpuSet::single(last));
        for _ in 0..3 {
            assert_eq!(ran_on(&p), vec![last]);
        }
        let both = plan(&topo, &"compact".parse().unwrap(), 2).unwrap();
        assert_eq!(Some(ran_on(&both)), single_cpus(&both));
    }

    /// The persistent workers follow each call's plan (swapped cpus, then unpinned: the
    /// caller's cpus), a panic in one worker's work reaches the caller, and the workers serve
    /// the next call after it.
    #[test]
    fn workers_follow_each_plan_and_pass_panics_on() {
        let topo = here();
        let cpus: Vec<u32> = topo.allowed_cpus().iter().collect();
        let a = [cpus[0], cpus[cpus.len() - 1]];
        let b = [a[1], a[0]];
        for list in [a, b, a] {
            assert_eq!(ran_on(&plan_on_cpus(&topo, &list).unwrap()), list);
        }
        let mine = loci_place::sys::get_affinity(0).unwrap();
        let os = unpinned(&topo, 2).unwrap();
        let sets = run_pinned(&os, |_| loci_place::sys::get_affinity(0).unwrap()).unwrap();
        assert!(sets.iter().all(|s| *s == mine), "{sets:?} vs {mine}");
        let pa = plan_on_cpus(&topo, &a).unwrap();
        let r = std::panic::catch_unwind(|| {
            run_pinned(&pa, |i| {
                if i == 1 {
                    panic!("part failed");
                }
                i
            })
        });
        assert!(r.is_err(), "the worker's panic must reach the caller");
        let got = run_pinned(&plan_on_cpus(&topo, &b).unwrap(), |i| i).unwrap();
        assert_eq!(got, vec![0, 1]);
    }

    /// Plans on cpus that are not allowed are refused when made (naming the cpus and the
    /// allowed ones) and when run (naming the thread), and `check` names the thread of a plan
    /// made for another machine.
    #[test]
    fn cpus_that_are_not_allowed_are_named() {
        let topo = loci_place::testing::regular(2, 2, 1, 1);
        assert!(check(&plan_on_cpus(&topo, &[0, 3, 3]).unwrap(), &topo).is_ok());
        assert!(check(&unpinned(&topo, 3).unwrap(), &topo).is_ok());
        let e = plan_on_cpus(&topo, &[1, 9]).unwrap_err().to_string();
        assert!(
            e.contains("thread 1") && e.contains("9") && e.contains("0-3"),
            "{e}"
        );
        let e = plan_on(&topo, vec![CpuSet::single(1), CpuSet::new()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("thread 1") && e.contains("empty"), "{e}");
        let big = loci_place::testing::regular(2, 8, 1, 1);
        let mut p = plan_on_cpus(&big, &[1, 2]).unwrap();
        p.threads[1].cpus = [2, 3, 9, 12].into_iter().collect();
        let e = check(&p, &topo).unwrap_err().to_string();
        assert!(e.contains("thread 1") && e.contains("cpus 9,12"), "{e}");
        assert!(e.contains("allowed cpus: 0-3"), "{e}");
        let e = run_pinned(&plan_on_cpus(&big, &[15]).unwrap(), |_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("thread 0") && e.contains("15"), "{e}");
        assert_eq!(
            describe(&plan_on_cpus(&topo, &[3, 0]).unwrap()),
            "t0:3 t1:0"
        );
        assert_eq!(describe(&unpinned(&topo, 2).unwrap()), "t0:os t1:os");
    }
}
