//! A pinning: where each worker thread of an array operation runs, and the runner that binds
//! persistent worker threads there.

use std::fmt;

use loci_topo::{CpuSet, Topology};

use crate::error::ArrayError;

/// One entry per thread: the cpus it is bound to, or `None` when the OS chooses (not pinned).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pinning {
    pub threads: Vec<Option<CpuSet>>,
}

impl Pinning {
    /// `n` threads the OS places.
    pub fn unpinned(n: usize) -> Self {
        Self {
            threads: vec![None; n],
        }
    }

    /// Thread `i` on exactly `cpus[i]`.
    pub fn on_cpus(cpus: &[u32]) -> Self {
        Self {
            threads: cpus.iter().map(|&c| Some(CpuSet::single(c))).collect(),
        }
    }

    /// Number of threads.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// The node of each thread when all its cpus are on one node (`None` otherwise or unpinned).
    pub fn nodes(&self, topo: &Topology) -> Vec<Option<u32>> {
        self.threads
            .iter()
            .map(|t| {
                let set = t.as_ref()?;
                let mut nodes = set.iter().map(|c| topo.node_of_cpu(c));
                let first = nodes.next()??;
                nodes.all(|n| n == Some(first)).then_some(first)
            })
            .collect()
    }

    /// The single cpu of each thread, when every thread is pinned to exactly one.
    pub fn single_cpus(&self) -> Option<Vec<u32>> {
        self.threads
            .iter()
            .map(|t| t.as_ref().filter(|s| s.len() == 1).and_then(|s| s.first()))
            .collect()
    }

    /// Checks that every pinned cpu is allowed on `topo`.
    pub fn check(&self, topo: &Topology) -> Result<(), ArrayError> {
        if self.threads.is_empty() {
            return Err(ArrayError::Pin(
                "a pinning needs at least one thread".into(),
            ));
        }
        // Checked per cpu without building sets (this runs on every subarray call); the sets are
        // built only for the error message.
        let allowed = |c: u32| topo.cpu(c).is_some_and(|c| c.online && c.allowed);
        for (i, t) in self.threads.iter().enumerate() {
            if let Some(s) = t {
                if s.is_empty() {
                    return Err(ArrayError::Pin(format!("thread {i} has an empty cpu set")));
                }
                if !s.iter().all(allowed) {
                    let allowed = topo.allowed_cpus();
                    let bad = s.difference(&allowed);
                    return Err(ArrayError::Pin(format!(
                        "thread {i} is planned on cpus {bad}, which are not allowed here (allowed cpus: {allowed})"
                    )));
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for Pinning {
    /// `t0:0 t1:4-5 t2:os`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.threads.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            match t {
                Some(s) => write!(f, "t{i}:{s}")?,
                None => write!(f, "t{i}:os")?,
            }
        }
        Ok(())
    }
}

/// Runs `work(i)` on thread `i` of `pinning` (each bound first) and returns the results in thread
/// order. A thread that cannot be bound does no work and the call fails naming the thread and its
/// cpus. A panic in `work` is resumed on the caller.
///
/// The threads are persistent: one pool of `pinning.len()` workers per thread count, kept for the
/// life of the process (rayon's `broadcast` runs a borrowing closure once on every worker of a
/// pool and waits for all). Each worker remembers the cpus it is bound to and calls
/// `sched_setaffinity` only when the pinning asks for others; an unpinned thread gets the
/// caller's cpus, as a thread the caller spawned would. Why: starting and binding two threads
/// per call cost ~170 us on the development machine (a 1.05 MB subarray took 226 us on two
/// fresh threads against 54 us on the calling thread), which kept every result under 4 MiB on
/// one thread.
///
/// Why not loci-sched's workers: a pinning places each individual thread on a chosen cpu or cpu
/// set (two threads on one cpu, an unpinned thread next to pinned ones, `elastic`'s shared set),
/// and the static schedule (and the cost model) needs part `p` on thread `p*T/P`. loci-sched
/// runs one worker per cpu of its core groups (affinity group, cpu or none, even when built on a
/// restricted topology) and hands tasks out by its stealing rules, so it can express neither a
/// placement per thread nor which thread runs a part.
pub fn run_pinned<R: Send>(
    pinning: &Pinning,
    work: impl Fn(usize) -> R + Sync,
) -> Result<Vec<R>, ArrayError> {
    let n = pinning.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let caller = if pinning.threads.iter().any(Option::is_none) {
        Some(
            loci_place::sys::get_affinity(0)
                .map_err(|e| ArrayError::Pin(format!("cannot read the caller's cpus: {e}")))?,
        )
    } else {
        None
    };
    let pool = workers(n)?;
    let out: Vec<Result<R, ArrayError>> = pool.broadcast(|ctx| {
        let i = ctx.index();
        // Unpinned: the caller's cpus (read above whenever some thread is unpinned).
        let Some(want) = pinning.threads[i].as_ref().or(caller.as_ref()) else {
            unreachable!("the caller's cpus are read when a thread is unpinned")
        };
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

    #[test]
    fn threads_run_where_pinned() {
        let cpus = loci_place::sys::get_affinity(0).unwrap();
        let list: Vec<u32> = cpus.iter().chain(cpus.iter()).collect();
        let p = Pinning::on_cpus(&list);
        let got = run_pinned(&p, |_| loci_place::sys::current_cpu().unwrap()).unwrap();
        assert_eq!(got, list);
    }

    /// The persistent workers follow each call's pinning (swapped cpus, then unpinned: the
    /// caller's cpus), a panic in one worker's work reaches the caller, and the workers serve
    /// the next call after it.
    #[test]
    fn workers_follow_each_pinning_and_pass_panics_on() {
        let cpus: Vec<u32> = loci_place::sys::get_affinity(0).unwrap().iter().collect();
        let a = [cpus[0], cpus[cpus.len() - 1]];
        let b = [a[1], a[0]];
        for list in [a, b, a] {
            let p = Pinning::on_cpus(&list);
            let got = run_pinned(&p, |_| loci_place::sys::current_cpu().unwrap()).unwrap();
            assert_eq!(got, list);
        }
        let mine = loci_place::sys::get_affinity(0).unwrap();
        let sets = run_pinned(&Pinning::unpinned(2), |_| {
            loci_place::sys::get_affinity(0).unwrap()
        })
        .unwrap();
        assert!(sets.iter().all(|s| *s == mine), "{sets:?} vs {mine}");
        let r = std::panic::catch_unwind(|| {
            run_pinned(&Pinning::on_cpus(&a), |i| {
                if i == 1 {
                    panic!("part failed");
                }
                i
            })
        });
        assert!(r.is_err(), "the worker's panic must reach the caller");
        let got = run_pinned(&Pinning::on_cpus(&b), |i| i).unwrap();
        assert_eq!(got, vec![0, 1]);
    }

    #[test]
    fn bad_cpu_is_an_error_naming_the_thread() {
        let p = Pinning::on_cpus(&[4000]);
        let e = run_pinned(&p, |_| ()).unwrap_err().to_string();
        assert!(e.contains("thread 0") && e.contains("4000"), "{e}");
    }

    /// `check` accepts allowed cpus and unpinned threads, and names the thread, its cpus that are
    /// not allowed (only those) and the allowed ones otherwise.
    #[test]
    fn check_names_the_cpus_that_are_not_allowed() {
        let topo = loci_place::testing::regular(2, 2, 1, 1);
        assert!(Pinning::on_cpus(&[0, 3, 3]).check(&topo).is_ok());
        assert!(Pinning::unpinned(3).check(&topo).is_ok());
        let mut p = Pinning::on_cpus(&[1, 2]);
        p.threads[1] = Some([2, 3, 9, 12].into_iter().collect());
        let e = p.check(&topo).unwrap_err().to_string();
        assert!(e.contains("thread 1") && e.contains("cpus 9,12"), "{e}");
        assert!(e.contains("allowed cpus: 0-3"), "{e}");
        assert!(Pinning::unpinned(0).check(&topo).is_err());
    }
}
