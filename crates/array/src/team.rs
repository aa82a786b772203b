//! A small result's copy team: the calling thread and the helpers of its node that are awake.
//!
//! A subarray result of a few hundred KiB takes one thread a few microseconds to copy. Handing
//! parts to sleeping worker threads costs more than that: a rayon `broadcast` from outside its pool
//! took 19 us per call on the development machine (2 cores; workers are woken by a futex and the
//! caller sleeps on a latch), where a cache line round trip between the two cores takes 80 ns.
//! So a small result is copied by the calling thread together with **helpers**: one thread per
//! cpu, bound to it, that after each job spins for [`SPIN`] waiting for the next one, then sleeps.
//! A query stream finds them spinning and shares each copy with them at the cost of a few cache
//! line transfers; a lone query wakes the sleeping ones (a futex wake) and does not wait for them
//! to arrive: a helper that has not started by the time the caller has taken every part is
//! released unstarted, so a call is never slower than the caller alone by more than the offer.
//!
//! rayon and loci-sched park idle workers within microseconds by design (they run long task
//! graphs, where spinning wastes cpu), and crossbeam has the parts (a `Backoff`) but no team; the
//! protocol here is a per-helper slot with a compare-and-swap, small enough to check under loom
//! (`scripts/loom-array`). OpenMP runtimes spin the same way (GNU `GOMP_SPINCOUNT`, LLVM
//! `KMP_BLOCKTIME` of 200 ms); [`SPIN`] is far shorter.
//!
//! A slot holds `IDLE` (the helper spins, looking for a job), `SLEEP` (it is parked or about
//! to be), `BUSY` (it took a job), `STOP` (it is to exit: tests only), or the address of an
//! offered `Job`. The caller offers a job by a compare-and-swap from `IDLE` or `SLEEP` to the
//! job's address (and unparks a sleeper); the helper takes it by a compare-and-swap from the
//! address to `BUSY`; the caller, once its own share is done, takes back every offer not yet taken
//! by a compare-and-swap from the address to `IDLE`, then waits for the taken ones to finish.

#[cfg(loom)]
use loom::{
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    sync::Mutex,
    thread,
};
#[cfg(not(loom))]
use std::{
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    sync::Mutex,
    thread,
};

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// How long a helper spins for the next job after finishing one (and after it starts or is woken)
/// before it sleeps. A query stream's calls come microseconds apart; 100 us of spinning per
/// stream end is the cpu it costs.
pub const SPIN: std::time::Duration = std::time::Duration::from_micros(100);

const IDLE: usize = 0;
const SLEEP: usize = 1;
const BUSY: usize = 2;
const STOP: usize = 3;

/// One helper: its slot and its thread (to unpark it).
pub(crate) struct Helper {
    slot: AtomicUsize,
    thread: thread::Thread,
}

/// A job on the caller's stack: the work, the next participant index to hand out, the helpers
/// holding it (offered and not taken back, or taken and not finished), and whether one of them
/// panicked. `align(8)` keeps its address clear of the slot's small states.
#[repr(align(8))]
struct Job<'a> {
    work: &'a (dyn Fn(usize) + Sync),
    next: AtomicUsize,
    holders: AtomicUsize,
    panicked: AtomicBool,
}

impl Helper {
    /// The calling thread's helper record (the thread then runs [`Helper::serve`]).
    fn for_current_thread() -> Helper {
        Helper {
            slot: AtomicUsize::new(IDLE),
            thread: thread::current(),
        }
    }

    /// Starts a helper bound by `bind` (run first on the new thread; an error there ends the
    /// thread and is returned).
    #[cfg(not(loom))]
    pub(crate) fn start(
        name: String,
        bind: impl FnOnce() -> std::io::Result<()> + Send + 'static,
    ) -> std::io::Result<&'static Helper> {
        let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<&'static Helper>>();
        std::thread::Builder::new().name(name).spawn(move || {
            if let Err(e) = bind() {
                let _ = tx.send(Err(e));
                return;
            }
            let h: &'static Helper = Box::leak(Box::new(Helper::for_current_thread()));
            let _ = tx.send(Ok(h));
            h.serve(spin_budget);
        })?;
        rx.recv()
            .map_err(|_| std::io::Error::other("the helper thread ended before it started"))?
    }

    /// The helper's loop: spin for a job while `keep_spinning` says so, then sleep until
    /// offered one; run each job taken. Returns when the slot says [`STOP`].
    fn serve(&self, keep_spinning: impl Fn(&mut SpinState) -> bool) {
        let mut spin = SpinState::default();
        loop {
            let s = self.slot.load(Ordering::Acquire);
            match s {
                STOP => return,
                IDLE => {
                    if keep_spinning(&mut spin) {
                        spin_hint();
                        continue;
                    }
                    if self
                        .slot
                        .compare_exchange(IDLE, SLEEP, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                    {
                        while self.slot.load(Ordering::Acquire) == SLEEP {
                            thread::park();
                        }
                        spin = SpinState::default();
                    }
                }
                SLEEP | BUSY => unreachable!("only the helper sets its slot to SLEEP or BUSY"),
                job => {
                    if self
                        .slot
                        .compare_exchange(job, BUSY, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        // SAFETY: `job` is the address of a live `Job`: its caller keeps it alive
                        // until `holders` is 0, and this helper counts in `holders` from the offer
                        // until the `fetch_sub` below, after which it does not touch the job.
                        let job = unsafe { &*(job as *const Job<'static>) };
                        let i = job.next.fetch_add(1, Ordering::Relaxed);
                        if catch_unwind(AssertUnwindSafe(|| (job.work)(i))).is_err() {
                            job.panicked.store(true, Ordering::Relaxed);
                        }
                        self.slot.swap(IDLE, Ordering::Release);
                        job.holders.fetch_sub(1, Ordering::Release);
                        spin = SpinState::default();
                    }
                }
            }
        }
    }

    /// Tells the helper to exit (tests: a helper normally lives as long as the process).
    #[cfg(any(test, loom))]
    fn stop(&self) {
        self.slot.swap(STOP, Ordering::Release);
        self.thread.unpark();
    }
}

/// A helper's spinning since its last job.
#[derive(Default)]
struct SpinState {
    spins: u32,
    #[cfg(not(loom))]
    since: Option<std::time::Instant>,
}

/// The real spin budget: [`SPIN`] of wall time (the clock is read every 64 spins).
#[cfg(not(loom))]
fn spin_budget(s: &mut SpinState) -> bool {
    s.spins = s.spins.wrapping_add(1);
    if !s.spins.is_multiple_of(64) {
        return true;
    }
    let now = std::time::Instant::now();
    now.duration_since(*s.since.get_or_insert(now)) < SPIN
}

#[cfg(not(loom))]
fn spin_hint() {
    std::hint::spin_loop();
}
#[cfg(loom)]
fn spin_hint() {
    loom::thread::yield_now();
}

/// Runs `work(i)` on the calling thread (`i` = 0) and on each of `helpers` that takes the offer
/// before the caller's own `work(0)` returns (`i` = 1, 2, ... in the order they start); returns
/// the results by `i` once every call that started has returned. `work` is expected to share
/// its work out dynamically (each call takes parts until none is left), so whoever arrives late
/// finds nothing to do and a helper that never arrives costs nothing. A panic in any call is
/// raised here after all have returned.
pub(crate) fn share<R: Send>(helpers: &[&Helper], work: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let results = Mutex::new(smallvec::SmallVec::<[(usize, R); 4]>::new());
    let run = |i: usize| {
        let r = work(i);
        results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((i, r));
    };
    let job = Job {
        work: &run,
        next: AtomicUsize::new(1),
        holders: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    };
    let addr = &job as *const Job<'_> as usize;
    /// Takes back untaken offers and waits for the taken ones, also when the caller's own share
    /// unwinds: a helper may be running on the caller's stack data.
    struct Settle<'j, 'a, 'h> {
        job: &'j Job<'a>,
        addr: usize,
        offered: smallvec::SmallVec<[&'h Helper; 4]>,
    }
    impl Drop for Settle<'_, '_, '_> {
        fn drop(&mut self) {
            for h in &self.offered {
                if h.slot
                    .compare_exchange(self.addr, IDLE, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    self.job.holders.fetch_sub(1, Ordering::Relaxed);
                }
            }
            let mut spins = 0u32;
            while self.job.holders.load(Ordering::Acquire) != 0 {
                // A helper runs on another cpu, unless the caller was moved onto its cpu since:
                // then only yielding lets it finish.
                spins = spins.saturating_add(1);
                if spins < 1 << 10 {
                    spin_hint();
                } else {
                    thread::yield_now();
                }
            }
        }
    }
    let mut settle = Settle {
        job: &job,
        addr,
        offered: smallvec::SmallVec::new(),
    };
    for &h in helpers {
        job.holders.fetch_add(1, Ordering::Relaxed);
        let mut state = h.slot.load(Ordering::Relaxed);
        let offered = loop {
            if state != IDLE && state != SLEEP {
                break false;
            }
            match h
                .slot
                .compare_exchange(state, addr, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break true,
                Err(now) => state = now,
            }
        };
        if offered {
            if state == SLEEP {
                h.thread.unpark();
            }
            settle.offered.push(h);
        } else {
            job.holders.fetch_sub(1, Ordering::Relaxed);
        }
    }
    run(0);
    drop(settle);
    if job.panicked.load(Ordering::Relaxed) {
        resume_unwind(Box::new("a copy helper panicked"));
    }
    let mut out = results.into_inner().unwrap_or_else(|e| e.into_inner());
    out.sort_unstable_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// The helpers of this process by cpu, each started on first use (`None`: the cpu cannot be
/// bound, for example it is not in this process's affinity).
#[cfg(not(loom))]
type Helpers = std::collections::HashMap<u32, Option<&'static Helper>>;

/// The process's helpers, locked.
#[cfg(not(loom))]
fn helpers() -> std::sync::MutexGuard<'static, Helpers> {
    static HELPERS: std::sync::OnceLock<std::sync::Mutex<Helpers>> = std::sync::OnceLock::new();
    HELPERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// The helper bound to `cpu`, started if it is the first ask.
#[cfg(not(loom))]
fn helper_in(map: &mut Helpers, cpu: u32) -> Option<&'static Helper> {
    *map.entry(cpu).or_insert_with(|| {
        Helper::start(format!("loci-copy-{cpu}"), move || {
            loci_place::sys::set_affinity(0, &loci_topo::CpuSet::from_iter([cpu]))
        })
        .ok()
    })
}

/// The helper bound to `cpu` (see [`helper_in`]).
#[cfg(all(test, not(loom)))]
fn helper_of(cpu: u32) -> Option<&'static Helper> {
    helper_in(&mut helpers(), cpu)
}

/// Up to `max` helpers on the calling thread's node, other than the one on its own cpu, in cpu
/// order (on Linux an SMT sibling usually has a far higher number, so distinct cores come
/// first). A result copied with them then lands on the caller's node, as it would copied alone.
#[cfg(not(loom))]
pub(crate) fn near_helpers(
    topo: &loci_topo::Topology,
    max: usize,
) -> smallvec::SmallVec<[&'static Helper; 4]> {
    let mut out = smallvec::SmallVec::new();
    if max == 0 {
        return out;
    }
    let Ok(cpu) = loci_place::sys::current_cpu() else {
        return out;
    };
    let Some(node) = topo.node_of_cpu(cpu).and_then(|n| topo.node(n)) else {
        return out;
    };
    let mut map = helpers();
    out.extend(
        node.cpus
            .iter()
            .filter(|&c| c != cpu)
            .filter_map(|c| helper_in(&mut map, c))
            .take(max),
    );
    out
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn unbound(n: usize) -> Vec<&'static Helper> {
        (0..n)
            .map(|i| Helper::start(format!("test-helper-{i}"), || Ok(())).unwrap())
            .collect()
    }

    #[test]
    fn every_item_is_done_once_and_results_come_back_by_participant() {
        let helpers = unbound(3);
        for round in 0..2000u64 {
            let n = (round % 50) as usize;
            let next = AtomicUsize::new(0);
            let sum = AtomicU64::new(0);
            let per = share(&helpers, |i| {
                let mut mine = Vec::new();
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= n {
                        break;
                    }
                    sum.fetch_add(k as u64 + round, Ordering::Relaxed);
                    mine.push(k);
                }
                (i, mine)
            });
            // Participant indices are 0..len, in order, the caller's first.
            assert!(!per.is_empty() && per.len() <= 4);
            for (j, (i, _)) in per.iter().enumerate() {
                assert_eq!(*i, j);
            }
            let mut all: Vec<usize> = per.into_iter().flat_map(|(_, m)| m).collect();
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>(), "round {round}");
            let want = (0..n as u64).map(|k| k + round).sum::<u64>();
            assert_eq!(sum.load(Ordering::Relaxed), want);
        }
        for h in helpers {
            h.stop();
        }
    }

    #[test]
    fn spinning_helpers_take_part_and_sleeping_ones_wake() {
        let helpers = unbound(1);
        // Work long enough (1 ms of items) that a woken helper arrives while items are left.
        let took_part = |helpers: &[&'static Helper]| {
            let next = AtomicUsize::new(0);
            let per = share(helpers, |i| {
                let mut n = 0;
                while next.fetch_add(1, Ordering::Relaxed) < 1000 {
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_micros(1) {}
                    n += 1;
                }
                (i, n)
            });
            per.len() == 2 && per[1].1 > 0
        };
        // Asleep after the spin budget: the offer wakes it.
        std::thread::sleep(SPIN * 20);
        assert_eq!(helpers[0].slot.load(Ordering::Relaxed), SLEEP);
        assert!((0..20).any(|_| took_part(&helpers)));
        // Right after a job it spins, and the next offer is taken.
        assert!((0..20).any(|_| took_part(&helpers)));
        helpers[0].stop();
    }

    #[test]
    fn a_panic_in_any_share_reaches_the_caller_after_all_returned() {
        let helpers = unbound(1);
        let live = AtomicUsize::new(0);
        for who in [0usize, 1] {
            let r = catch_unwind(AssertUnwindSafe(|| {
                share(&helpers, |i| {
                    live.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    live.fetch_sub(1, Ordering::SeqCst);
                    if i == who {
                        panic!("share {i} fails");
                    }
                })
            }));
            assert!(r.is_err(), "panic of share {who} lost");
            assert_eq!(live.load(Ordering::SeqCst), 0, "a share still ran");
        }
        // The helper still serves.
        assert_eq!(share(&helpers, |i| i)[0], 0);
        helpers[0].stop();
    }

    #[test]
    fn helpers_are_bound_to_their_cpu_and_unbindable_cpus_get_none() {
        let cpus = loci_place::sys::get_affinity(0).unwrap();
        let cpu = cpus.iter().next().unwrap();
        let h = helper_of(cpu).expect("an allowed cpu gets a helper");
        assert!(
            std::ptr::eq(h, helper_of(cpu).unwrap()),
            "one helper per cpu"
        );
        let got = share(&[h], |_| loci_place::sys::current_cpu().unwrap());
        if got.len() == 2 {
            assert_eq!(got[1], cpu);
        }
        assert!(helper_of(100_000).is_none());
    }
}

/// Under loom there are no real cpus to bind helpers to: callers copy alone.
#[cfg(loom)]
pub(crate) fn near_helpers(
    _topo: &loci_topo::Topology,
    _max: usize,
) -> smallvec::SmallVec<[&'static Helper; 4]> {
    smallvec::SmallVec::new()
}

/// Loom models of the offer / take / take-back / sleep protocol, with every interleaving loom
/// explores (bounded preemptions). Run: `scripts/loom-array`.
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;

    /// A helper on a loom thread that spins `spins` times for a job before it sleeps.
    fn helper(spins: u32) -> (Arc<Helper>, loom::thread::JoinHandle<()>) {
        let (tx, rx) = loom::sync::mpsc::channel();
        let t = loom::thread::spawn(move || {
            let h = Arc::new(Helper::for_current_thread());
            tx.send(h.clone()).unwrap();
            h.serve(move |s| {
                s.spins += 1;
                s.spins <= spins
            });
        });
        (rx.recv().unwrap(), t)
    }

    /// Shares two items with `helpers`; every item is done exactly once and the results come
    /// back by participant, whoever took what.
    fn share_two(helpers: &[&Helper]) {
        let next = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let per = share(helpers, |i| {
            let mut mine = 0;
            while next.fetch_add(1, Ordering::Relaxed) < 2 {
                done.fetch_add(1, Ordering::Relaxed);
                mine += 1;
            }
            (i, mine)
        });
        assert_eq!(done.load(Ordering::Relaxed), 2);
        assert_eq!(per.iter().map(|(_, m)| m).sum::<usize>(), 2);
        for (j, (i, _)) in per.iter().enumerate() {
            assert_eq!(*i, j);
        }
    }

    /// A helper that spins `spins` times before it sleeps serves `jobs` jobs in a row, then stops.
    fn jobs_in_a_row(spins: u32, jobs: usize) {
        loom::model(move || {
            let (h, t) = helper(spins);
            for _ in 0..jobs {
                share_two(&[&h]);
            }
            h.stop();
            t.join().unwrap();
        });
    }

    #[test]
    fn a_helper_stops() {
        jobs_in_a_row(0, 0);
    }

    #[test]
    fn a_spinning_helper_takes_the_offer_or_is_released() {
        jobs_in_a_row(1, 1);
    }

    #[test]
    fn a_sleeping_helper_is_woken_and_serves_the_next_job() {
        jobs_in_a_row(0, 2);
    }

    #[test]
    fn two_callers_offer_to_one_helper() {
        loom::model(|| {
            let (h, t) = helper(1);
            let h2 = h.clone();
            let other = loom::thread::spawn(move || share_two(&[&h2]));
            share_two(&[&h]);
            other.join().unwrap();
            h.stop();
            t.join().unwrap();
        });
    }
}
