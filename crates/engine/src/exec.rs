//! Running operators on loci-sched: the [`Exec`] that every operator takes.
//!
//! An operator phase is a list of work items (morsels of a table, or partitions), each with an
//! optional home node. [`Exec::for_each`] turns every item into a *deferred task queued on a core
//! group of its home node* (items without a home, or homed on a node without workers, are dealt
//! round robin over the nodes that have workers), inside one request of the scheduler, and waits
//! for all of them. The item tasks of a node are spawned by one task queued on that node, so
//! each node's worker fills its own queues and no single thread spawns every task. What happens next is the scheduler's choice (`--sched`):
//! - **LAS** (seed 003): a worker takes its own group's deferred tasks first and crosses to
//!   another node only when its group has none left, so a morsel normally runs on the node its
//!   pages sit on;
//! - **NLS**: one shared FIFO, any worker takes any morsel (placement-unaware);
//! - **unpinned**: NLS with workers not pinned at all (the OS places them).
//!
//! Under LAS a phase is one request, usually the only one running, and rule 4 of loci-sched lets
//! idle nodes share a lone request (seed 003): a node that finishes its own morsels takes the
//! oldest morsels of another node, so a slow node is helped at the cost of remote reads at the
//! tail. [`Locality`] chooses: `balanced` (the default) keeps that; `strict` submits the phase
//! with `RequestOptions::stay_on_node`, so every morsel runs on its home node (the local-access
//! ratio is 1 for homed morsels) and a slow node is not helped, as with one engine instance per
//! node (seed 004). NLS and unpinned ignore it.
//!
//! Which cpus carry workers is loci-place's [`Strategy`] (the same vocabulary as `loci plan` and
//! `loci run --threads`): e.g. `sparse` (round robin over nodes), `compact` (fill a node first),
//! `shared:G`, `nodes:LIST`; the executor's scheduler is built from the resulting plan and pins
//! each worker to its core group. `os` builds the compact layout but leaves the threads unpinned.
//!
//! Per-worker state (aggregation arrays, scatter buffers) is created lazily on the first item a
//! worker runs and handed back at the end; every item records the node of the worker that ran it
//! (the pinned group's node, or for unpinned workers the node of the cpu it was on when the item
//! started), which is what the local-access ratio is computed from.

use std::sync::Mutex;

use loci_place::strategy::Strategy;
use loci_place::sys;
use loci_sched::{Affinity, Config, Ctx, Policy, RequestOptions, Scheduler};
use loci_topo::{CpuSet, Topology};

use crate::{EngineError, Trace};

/// Whether idle nodes may take another node's morsels (LAS only; see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Locality {
    /// Seed 003's rule 4: a phase (one request) is shared by idle nodes at its tail.
    #[default]
    Balanced,
    /// Every morsel runs on a worker of its home node (loci-sched's `stay_on_node` requests).
    Strict,
}

named_choices!(Locality, "locality", "balanced, strict",
    Balanced => "balanced",
    Strict => "strict",
);

/// Parses a scheduler name: `las`, `nls` or `unpinned`.
pub fn parse_sched(s: &str) -> Result<Policy, EngineError> {
    Policy::parse(s).map_err(|_| EngineError::BadChoice {
        what: "scheduler",
        given: s.into(),
        valid: "las, nls, unpinned",
    })
}

/// The operators' own regions and their policies on a machine of several memory nodes (on one,
/// first touch): the radix partitions, part `i` bound to the `i`-th node.
pub const REGIONS: [(&str, &str); 1] = [(PARTITIONS, "per-node")];
/// Region name of the radix partitions (one part per allowed memory node).
pub const PARTITIONS: &str = "partitions";

/// The workers an operator runs on: a loci-sched scheduler over the chosen cpus.
pub struct Exec {
    /// The whole machine (memory nodes come from here).
    topo: Topology,
    sched: Scheduler,
    policy: Policy,
    threads: Strategy,
    locality: Locality,
    /// Workers stay on their group's cpus (so a worker's node is its group's node).
    pinned: bool,
    /// The plan the scheduler was built from, with the operators' regions.
    plan: loci_place::Plan,
    /// Nodes that have workers, ascending.
    nodes: Vec<u32>,
    workers: usize,
}

impl Exec {
    /// `workers` workers (default: one per allowed cpu) on the cpus `threads` picks from `topo`,
    /// scheduled by `policy`.
    pub fn new(
        topo: &Topology,
        policy: Policy,
        threads: Strategy,
        workers: Option<usize>,
    ) -> Result<Exec, EngineError> {
        let allowed = topo.allowed_cpus();
        let n = workers.unwrap_or(allowed.len());
        if n == 0 {
            return Err(EngineError::Invalid("at least one worker is needed".into()));
        }
        if n > allowed.len() {
            return Err(EngineError::Invalid(format!(
                "{n} workers but only {} allowed cpus ({allowed}): loci-sched runs one worker per cpu",
                allowed.len()
            )));
        }
        // Which cpus: the strategy's (an unpinned `os` run keeps the compact layout, so its
        // groups and nodes are those of the same number of pinned workers).
        let layout_strategy = if threads.pins() {
            threads.clone()
        } else {
            Strategy::compact()
        };
        // The workers' own memory is left to first touch; tables are placed per table by the
        // storage layer, and the operators' regions as the plan names them (see `REGIONS`).
        let mut plan = loci_place::Plan::new(
            topo,
            &layout_strategy,
            n,
            &loci_place::MemPolicy::FirstTouch,
            false,
        )
        .map_err(|e| EngineError::Invalid(format!("placing {n} workers: {e}")))?;
        if topo.allowed_mems().len() > 1 {
            for (name, policy) in REGIONS {
                let p: loci_place::MemPolicy = policy.parse().expect("a valid policy");
                plan = plan
                    .with_region(topo, name, &p)
                    .map_err(|e| EngineError::Invalid(format!("region {name}: {e}")))?;
            }
        }
        let pinned = threads.pins() && policy != Policy::Unpinned;
        let config = Config {
            policy,
            affinity: if pinned {
                Affinity::Group
            } else {
                Affinity::None
            },
            // The engine submits one request per phase; the per-request records are not read.
            max_request_records: 0,
            ..Config::default()
        };
        let sched = Scheduler::from_plan(topo, &plan, config)
            .map_err(|e| EngineError::Invalid(format!("starting the scheduler: {e}")))?;
        let nodes = sched.layout().nodes.clone();
        let workers = sched.layout().workers.len();
        Ok(Exec {
            topo: topo.clone(),
            sched,
            policy,
            threads,
            locality: Locality::default(),
            pinned,
            plan,
            nodes,
            workers,
        })
    }

    /// The same executor with phases submitted under `locality` (default: balanced).
    pub fn with_locality(mut self, locality: Locality) -> Exec {
        self.locality = locality;
        self
    }

    /// Submits the following phases under `locality`.
    pub fn set_locality(&mut self, locality: Locality) {
        self.locality = locality;
    }

    /// Whether idle nodes may take another node's morsels (LAS).
    pub fn locality(&self) -> Locality {
        self.locality
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The machine's topology (memory nodes, distances).
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// The plan: the workers' cpus and the memory plan of the operators' regions ([`REGIONS`]).
    pub fn plan(&self) -> &loci_place::Plan {
        &self.plan
    }

    /// The scheduling policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The thread placement.
    pub fn threads(&self) -> &Strategy {
        &self.threads
    }

    /// Nodes that have workers, ascending.
    pub fn worker_nodes(&self) -> &[u32] {
        &self.nodes
    }

    /// The scheduler (layout, counters).
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Whether `node` has workers.
    pub fn has_workers(&self, node: u32) -> bool {
        self.nodes.binary_search(&node).is_ok()
    }

    /// The node of the worker running `ctx` now: its group's node when pinned, else the node of
    /// the cpu it is on (None if the cpu is unknown).
    fn node_now(&self, ctx: &Ctx) -> Option<u32> {
        if self.pinned {
            Some(ctx.node())
        } else {
            sys::current_cpu()
                .ok()
                .and_then(|c| self.topo.node_of_cpu(c))
        }
    }

    /// Runs `f` as the first task of a new request (`stay_on_node` under `--locality strict`) and
    /// returns its result once the request and every task it spawned are done; `f` may borrow
    /// from the caller (`Scheduler::run_with`). A panic inside is resumed here. Must not be
    /// called from inside a task.
    fn request<R: Send>(&self, f: impl FnOnce(&Ctx) -> R + Send) -> R {
        let opts = RequestOptions {
            stay_on_node: self.locality == Locality::Strict,
        };
        self.sched
            .run_with(opts, f)
            .unwrap_or_else(|e| panic!("engine request: {e}"))
    }

    /// Runs `f` once, on one worker (single-threaded phases: `--gen one-thread` generation, an
    /// index built by one thread). Returns its result and the node of the worker that ran it.
    pub fn one<R: Send>(&self, f: impl FnOnce() -> R + Send) -> (R, Option<u32>) {
        self.request(|ctx| {
            let node = self.node_now(ctx);
            (f(), node)
        })
    }

    /// Runs `body(state, i)` for every item `i` in `0..homes.len()`, each as a deferred task on a
    /// core group of `homes[i]` (see the module docs), and waits for all. `state` is the running
    /// worker's own, made by `init` on its first item. Returns the states of the workers that ran
    /// items and which node ran each item.
    pub fn for_each<S, I, B>(&self, homes: &[Option<u32>], init: I, body: B) -> Pass<S>
    where
        S: Send,
        I: Fn() -> S + Sync,
        B: Fn(&mut S, usize) + Sync,
    {
        let slots: Vec<Mutex<Slot<S>>> = (0..self.workers)
            .map(|_| {
                Mutex::new(Slot {
                    state: None,
                    touched: Vec::new(),
                })
            })
            .collect();
        if !homes.is_empty() {
            // Items per target node (homeless ones dealt round robin over the nodes).
            let k = self.nodes.len();
            let mut per_node: Vec<Vec<usize>> = vec![Vec::new(); k];
            let mut rr = 0usize;
            for (i, h) in homes.iter().enumerate() {
                let at = match h.and_then(|n| self.nodes.binary_search(&n).ok()) {
                    Some(x) => x,
                    None => {
                        rr += 1;
                        (rr - 1) % k
                    }
                };
                per_node[at].push(i);
            }
            let (slots, init, body, per_node) = (&slots, &init, &body, &per_node);
            self.request(|ctx| {
                ctx.scope(|s| {
                    // One spawner task per node, queued there: each node's morsel tasks are
                    // spawned by a worker of that node (in parallel, without one thread spawning
                    // thousands of tasks while the others steal them), into that node's groups.
                    for (x, items) in per_node.iter().enumerate() {
                        if items.is_empty() {
                            continue;
                        }
                        let node = self.nodes[x];
                        s.spawn_deferred_on(node, move |s| {
                            for &i in items {
                                s.spawn_deferred_on(node, move |s| {
                                    let ctx = s.ctx();
                                    let at = self.node_now(ctx);
                                    // One task at a time per worker, and bodies cannot open
                                    // scopes (they get no context), so this lock is never
                                    // contended or re-entered.
                                    let mut g = slots[ctx.worker()]
                                        .lock()
                                        .unwrap_or_else(|e| e.into_inner());
                                    let slot = &mut *g;
                                    let st = slot.state.get_or_insert_with(init);
                                    body(st, i);
                                    slot.touched.push((i, at));
                                })
                                .expect("the node has workers");
                            }
                        })
                        .expect("the node has workers");
                    }
                })
            });
        }
        let mut states = Vec::new();
        let mut touched = Vec::with_capacity(homes.len());
        for s in slots {
            let s = s.into_inner().unwrap_or_else(|e| e.into_inner());
            states.extend(s.state);
            touched.extend(s.touched);
        }
        Pass {
            states,
            trace: Trace { touched },
        }
    }

    /// [`Exec::for_each`] where each item yields a result: the results in item order, and the
    /// trace.
    pub fn map<S, R, I, B>(&self, homes: &[Option<u32>], init: I, body: B) -> (Vec<R>, Trace)
    where
        S: Send,
        R: Send,
        I: Fn() -> S + Sync,
        B: Fn(&mut S, usize) -> R + Sync,
    {
        let pass = self.for_each(
            homes,
            || (init(), Vec::new()),
            |(s, out): &mut (S, Vec<(usize, R)>), i| {
                let r = body(s, i);
                out.push((i, r));
            },
        );
        let mut all: Vec<(usize, R)> = pass.states.into_iter().flat_map(|(_, o)| o).collect();
        all.sort_unstable_by_key(|x| x.0);
        (all.into_iter().map(|x| x.1).collect(), pass.trace)
    }
}

struct Slot<S> {
    state: Option<S>,
    touched: Vec<(usize, Option<u32>)>,
}

/// What one [`Exec::for_each`] left: per-worker states and the trace.
pub struct Pass<S> {
    /// The state of every worker that ran at least one item.
    pub states: Vec<S>,
    /// Which node ran each item.
    pub trace: Trace,
}

/// A one-node topology of the cpus this thread may run on (tests, and machines without sysfs).
pub fn flat_topology() -> Topology {
    Topology::flat(
        sys::get_affinity(0).unwrap_or_else(|_| CpuSet::single(0)),
        "affinity",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_item_runs_once_with_per_worker_state() {
        let t = flat_topology();
        for policy in [Policy::Las, Policy::Nls, Policy::Unpinned] {
            for threads in [Strategy::os(), Strategy::sparse(), Strategy::compact()] {
                let ex = Exec::new(&t, policy, threads.clone(), None).unwrap();
                let homes: Vec<Option<u32>> = (0..1000)
                    .map(|i| [Some(0), None, Some(77)][i % 3])
                    .collect();
                let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
                let pass = ex.for_each(
                    &homes,
                    || 0usize,
                    |n, i| {
                        *n += 1;
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    },
                );
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                assert!(pass.states.len() <= ex.workers());
                assert_eq!(pass.states.iter().sum::<usize>(), 1000);
                let mut items: Vec<usize> = pass.trace.touched.iter().map(|x| x.0).collect();
                items.sort_unstable();
                assert_eq!(items, (0..1000).collect::<Vec<_>>());
                // One node here: every item ran on node 0, pinned or not.
                assert!(pass.trace.touched.iter().all(|x| x.1 == Some(0)));
                let (v, _) = ex.map(&homes, || (), |_, i| i * 2);
                assert_eq!(v, (0..1000).map(|i| i * 2).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn borrowed_data_and_panics_come_back_to_the_caller() {
        let ex = Exec::new(&flat_topology(), Policy::Las, Strategy::sparse(), None).unwrap();
        let data: Vec<u64> = (0..10_000).collect();
        let (sums, _) = ex.map(
            &[None; 10],
            || (),
            |_, i| data[i * 1000..(i + 1) * 1000].iter().sum::<u64>(),
        );
        assert_eq!(sums.iter().sum::<u64>(), data.iter().sum::<u64>());
        let (v, node) = ex.one(|| data.len());
        assert_eq!((v, node), (10_000, Some(0)));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ex.for_each(&[None; 4], || (), |_, i| assert!(i != 2, "item two failed"))
        }));
        let p = r.err().expect("the panic reaches the caller");
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        assert!(msg.contains("item two failed"), "{msg}");
        // The executor still works after a failed phase.
        assert_eq!(ex.one(|| 5).0, 5);
    }

    /// Two nodes (a synthetic topology over cpus 0 and 1, one worker pinned on each): every item
    /// is homed on node 0. `strict` runs all of them on node 0 although node 1's worker is idle;
    /// `balanced` (seed 003's rule 4 for a lone request) lets node 1 take some. Items on node 0
    /// wait (up to 10 s) until node 1 has taken one, so a loaded machine that leaves node 1's
    /// worker unscheduled for a while cannot fail the test; only a node 1 that never takes an
    /// item does.
    #[test]
    fn strict_locality_keeps_every_item_on_its_home_node() {
        let here = sys::get_affinity(0).unwrap();
        assert!(
            here.contains(0) && here.contains(1),
            "this test pins workers to cpus 0 and 1 (allowed: {here})"
        );
        let topo = loci_sched::fixtures::grid(2, 1, 1);
        let run = |loc: Locality| {
            let ex = Exec::new(&topo, Policy::Las, Strategy::sparse(), None)
                .unwrap()
                .with_locality(loc);
            assert_eq!(ex.locality(), loc);
            assert_eq!(ex.worker_nodes(), &[0, 1]);
            let homes = vec![Some(0u32); 64];
            let node1_took = std::sync::atomic::AtomicBool::new(false);
            let start = std::time::Instant::now();
            let pass = ex.for_each(
                &homes,
                || (),
                |_, _| {
                    use std::sync::atomic::Ordering::Relaxed;
                    if sys::current_cpu().unwrap() == 1 {
                        node1_took.store(true, Relaxed);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    while loc == Locality::Balanced
                        && !node1_took.load(Relaxed)
                        && start.elapsed() < std::time::Duration::from_secs(10)
                    {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                },
            );
            assert_eq!(pass.trace.touched.len(), 64);
            pass.trace.touched.iter().filter(|x| x.1 != Some(0)).count()
        };
        assert_eq!(run(Locality::Strict), 0);
        assert!(run(Locality::Balanced) > 0, "node 1 took no item");
    }

    #[test]
    fn bad_configurations_are_named() {
        let t = flat_topology();
        let n = t.allowed_cpus().len();
        let e = Exec::new(&t, Policy::Las, Strategy::sparse(), Some(n + 1))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("allowed cpus"), "{e}");
        assert!(Exec::new(&t, Policy::Las, Strategy::os(), Some(0)).is_err());
        let e = "spars".parse::<Strategy>().unwrap_err().to_string();
        assert!(e.contains("sparse") && e.contains("compact"), "{e}");
        let e = "strikt".parse::<Locality>().unwrap_err().to_string();
        assert!(e.contains("balanced, strict"), "{e}");
        assert_eq!("strict".parse::<Locality>().unwrap(), Locality::Strict);
        assert_eq!(Locality::default().to_string(), "balanced");
        let e = parse_sched("lass").unwrap_err().to_string();
        assert!(e.contains("las, nls, unpinned"), "{e}");
    }
}
