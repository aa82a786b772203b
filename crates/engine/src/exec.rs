//! Running operators on workers: the [`Executor`] trait, a simple pinned pool, and the morsel
//! queue that hands each worker its own node's morsels first.
//!
//! The pool here is the stand-in until loci-sched's LAS/NLS schedulers are wired in behind the
//! same trait: an operator only asks "run this closure once on every worker" and pulls morsels
//! from a [`MorselQueue`].

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use loci_place::sys;
use loci_topo::{CpuSet, Topology};

use crate::EngineError;

/// How workers are placed on cpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// Not pinned: the OS scheduler decides (the baseline).
    Os,
    /// Pinned, spread over nodes round-robin (worker i on node i mod k).
    Sparse,
    /// Pinned, filling one node's cpus before the next.
    Dense,
}

impl Threads {
    /// Names accepted by [`FromStr`].
    pub const CHOICES: &'static str = "os, sparse, dense";
}

impl fmt::Display for Threads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Threads::Os => "os",
            Threads::Sparse => "sparse",
            Threads::Dense => "dense",
        })
    }
}

impl FromStr for Threads {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "os" | "none" | "unpinned" => Threads::Os,
            "sparse" => Threads::Sparse,
            "dense" => Threads::Dense,
            _ => {
                return Err(EngineError::BadChoice {
                    what: "thread placement",
                    given: s.into(),
                    valid: Self::CHOICES,
                })
            }
        })
    }
}

/// One worker: the cpu it is pinned to (None: unpinned) and that cpu's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// Index among the executor's workers.
    pub id: usize,
    /// Pinned cpu; None when the OS places the thread.
    pub cpu: Option<u32>,
    /// Node of the pinned cpu; None when unpinned (then the node is read at each morsel).
    pub node: Option<u32>,
}

/// Runs a closure once on every worker, in parallel, and returns the results in worker order.
pub trait Executor: Sync {
    /// The workers.
    fn workers(&self) -> &[Worker];
    /// The topology the workers live on.
    fn topology(&self) -> &Topology;
    /// Runs `f` on every worker (each call on that worker's thread, pinned as planned).
    fn run<R: Send>(&self, f: &(dyn Fn(&Worker) -> R + Sync)) -> Vec<R>;
    /// Runs `f` on the first worker only (single-threaded phases, `first-touch-1` generation).
    fn run_one<R: Send>(&self, f: &(dyn Fn(&Worker) -> R + Sync)) -> R;
    /// Whether a worker that ran out of its own node's items may take items homed on another
    /// node that has workers of its own (work stealing across nodes). Default: yes.
    fn steals(&self) -> bool {
        true
    }
}

/// A pool of scoped threads, one per worker, pinned by a [`Threads`] strategy. Threads are
/// spawned per call: a phase of an operator is long (milliseconds at least), so the ~20 us
/// spawn cost is noise, and a fresh pinned thread carries no stale state between phases.
pub struct PinnedPool {
    topo: Topology,
    workers: Vec<Worker>,
    steal: bool,
}

impl PinnedPool {
    /// `n` workers placed by `threads` over the allowed cpus of `topo`.
    pub fn new(topo: &Topology, threads: Threads, n: usize) -> Result<PinnedPool, EngineError> {
        if n == 0 {
            return Err(EngineError::Invalid("at least one worker is needed".into()));
        }
        let nodes: Vec<(u32, Vec<u32>)> = topo
            .nodes
            .iter()
            .map(|nd| {
                (
                    nd.id,
                    topo.allowed_cpus_of(nd.id).iter().collect::<Vec<_>>(),
                )
            })
            .filter(|(_, c)| !c.is_empty())
            .collect();
        let total: usize = nodes.iter().map(|x| x.1.len()).sum();
        if total == 0 {
            return Err(EngineError::Invalid(
                "no allowed cpu in the topology".into(),
            ));
        }
        let order: Vec<(u32, u32)> = match threads {
            Threads::Os => vec![],
            Threads::Dense => nodes
                .iter()
                .flat_map(|(n, cs)| cs.iter().map(move |&c| (c, *n)))
                .collect(),
            Threads::Sparse => {
                let mut v = Vec::new();
                let deepest = nodes.iter().map(|x| x.1.len()).max().unwrap_or(0);
                for i in 0..deepest {
                    for (n, cs) in &nodes {
                        if let Some(&c) = cs.get(i) {
                            v.push((c, *n));
                        }
                    }
                }
                v
            }
        };
        let workers = (0..n)
            .map(|id| match threads {
                Threads::Os => Worker {
                    id,
                    cpu: None,
                    node: None,
                },
                _ => {
                    let (c, nd) = order[id % order.len()];
                    Worker {
                        id,
                        cpu: Some(c),
                        node: Some(nd),
                    }
                }
            })
            .collect();
        Ok(PinnedPool {
            topo: topo.clone(),
            workers,
            steal: true,
        })
    }

    /// Sets whether workers steal items homed on other nodes (see [`Executor::steals`]).
    /// Without stealing, a node's items are processed by that node's workers only (items on
    /// nodes without workers are still taken by anyone): every read is local, at the price of
    /// idle workers when nodes finish unevenly.
    pub fn with_steal(mut self, steal: bool) -> PinnedPool {
        self.steal = steal;
        self
    }

    fn enter(w: &Worker) {
        if let Some(c) = w.cpu {
            // A failure here means the cpu left our cpuset after the pool was planned; the work
            // still runs correctly, only unpinned, and the local-access ratio shows it.
            let _ = sys::set_affinity(0, &CpuSet::single(c));
        }
    }
}

impl Executor for PinnedPool {
    fn workers(&self) -> &[Worker] {
        &self.workers
    }
    fn topology(&self) -> &Topology {
        &self.topo
    }
    fn run<R: Send>(&self, f: &(dyn Fn(&Worker) -> R + Sync)) -> Vec<R> {
        std::thread::scope(|s| {
            let hs: Vec<_> = self
                .workers
                .iter()
                .map(|w| {
                    s.spawn(move || {
                        Self::enter(w);
                        f(w)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        })
    }
    fn steals(&self) -> bool {
        self.steal
    }
    fn run_one<R: Send>(&self, f: &(dyn Fn(&Worker) -> R + Sync)) -> R {
        let w = &self.workers[0];
        std::thread::scope(|s| {
            s.spawn(move || {
                Self::enter(w);
                f(w)
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }
}

/// The node a worker runs on now: its pinned node, or the node of the cpu it is on.
pub fn worker_node(topo: &Topology, w: &Worker) -> Option<u32> {
    w.node
        .or_else(|| sys::current_cpu().ok().and_then(|c| topo.node_of_cpu(c)))
}

/// Hands out work items (morsels or partitions) to workers: each item has an optional home
/// node; a worker takes items of its own node first, then items with no home, then steals from
/// other nodes (HyPer-style morsel-driven scheduling). Records which node ran every item, for the
/// local-access ratio.
pub struct MorselQueue {
    /// Items per node (index into `nodes`), plus one last list for items without a home.
    lists: Vec<Vec<usize>>,
    nodes: Vec<u32>,
    /// Per list: may a worker of another node take its items?
    open: Vec<bool>,
    next: Vec<AtomicUsize>,
    touched: Mutex<Vec<(usize, Option<u32>)>>,
}

impl MorselQueue {
    /// A queue over items `0..homes.len()` with the given home nodes.
    pub fn new(homes: &[Option<u32>]) -> MorselQueue {
        let mut nodes: Vec<u32> = homes.iter().flatten().copied().collect();
        nodes.sort_unstable();
        nodes.dedup();
        let mut lists = vec![Vec::new(); nodes.len() + 1];
        for (i, h) in homes.iter().enumerate() {
            let l = match h {
                Some(n) => nodes.binary_search(n).expect("node listed"),
                None => nodes.len(),
            };
            lists[l].push(i);
        }
        let next = (0..lists.len()).map(|_| AtomicUsize::new(0)).collect();
        let open = vec![true; lists.len()];
        MorselQueue {
            lists,
            nodes,
            open,
            next,
            touched: Mutex::new(Vec::with_capacity(homes.len())),
        }
    }

    /// A queue for the executor's workers: as [`MorselQueue::new`], and when the executor does
    /// not steal, items homed on a node with pinned workers go to those workers only.
    pub fn for_exec(exec: &impl Executor, homes: &[Option<u32>]) -> MorselQueue {
        let mut q = MorselQueue::new(homes);
        let pinned: Vec<u32> = exec.workers().iter().filter_map(|w| w.node).collect();
        let all_pinned = exec.workers().iter().all(|w| w.node.is_some());
        if !exec.steals() && all_pinned {
            for (i, n) in q.nodes.iter().enumerate() {
                q.open[i] = !pinned.contains(n);
            }
        }
        q
    }

    /// Next item for a worker now on node `node` (None: unknown node), or None when all are taken.
    pub fn next(&self, node: Option<u32>) -> Option<usize> {
        let own = node.and_then(|n| self.nodes.binary_search(&n).ok());
        let k = self.lists.len();
        let start = own.unwrap_or(k - 1);
        let order = std::iter::once(start)
            .chain(std::iter::once(k - 1))
            .chain((1..k).map(|d| (start + d) % k));
        for l in order {
            if Some(l) != own && !self.open[l] {
                continue;
            }
            let list = &self.lists[l];
            if self.next[l].load(Ordering::Relaxed) >= list.len() {
                continue;
            }
            let i = self.next[l].fetch_add(1, Ordering::Relaxed);
            if i < list.len() {
                let item = list[i];
                self.touched
                    .lock()
                    .expect("no panics while held")
                    .push((item, node));
                return Some(item);
            }
        }
        None
    }

    /// (item, node of the worker that took it), for every item taken so far.
    pub fn touched(self) -> Vec<(usize, Option<u32>)> {
        self.touched.into_inner().expect("no panics while held")
    }
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

    #[test]
    fn queue_hands_out_every_item_once_own_node_first() {
        let homes = vec![Some(1), Some(0), None, Some(1), Some(0)];
        let q = MorselQueue::new(&homes);
        assert_eq!(q.next(Some(1)), Some(0));
        assert_eq!(q.next(Some(1)), Some(3));
        assert_eq!(q.next(Some(1)), Some(2)); // homeless next
        assert_eq!(q.next(Some(1)), Some(1)); // then steal
        assert_eq!(q.next(None), Some(4));
        assert_eq!(q.next(Some(0)), None);
        let t = q.touched();
        assert_eq!(t.len(), 5);
    }

    #[test]
    fn queue_under_contention_loses_nothing() {
        let homes: Vec<Option<u32>> = (0..10_000).map(|i| Some(i % 3)).collect();
        let q = MorselQueue::new(&homes);
        let got: Vec<Vec<usize>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    let q = &q;
                    s.spawn(move || {
                        let mut v = vec![];
                        while let Some(i) = q.next(Some(t % 3)) {
                            v.push(i);
                        }
                        v
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<usize> = got.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(all, (0..10_000).collect::<Vec<_>>());
    }

    #[test]
    fn without_stealing_a_nodes_items_stay_on_its_workers() {
        // Two pretend nodes (queue logic only: nothing is pinned or allocated here).
        let mut t = flat_topology();
        let mut n1 = t.nodes[0].clone();
        n1.id = 1;
        t.nodes.push(n1);
        let pool = PinnedPool::new(&t, Threads::Sparse, 2).unwrap();
        let nodes: Vec<Option<u32>> = pool.workers().iter().map(|w| w.node).collect();
        assert_eq!(nodes, vec![Some(0), Some(1)]);
        let homes = vec![Some(0), Some(0), Some(7), None];
        let q = MorselQueue::for_exec(&pool.with_steal(false), &homes);
        // Node 1's worker: homeless item, then node 7's (no workers there), never node 0's.
        assert_eq!(q.next(Some(1)), Some(3));
        assert_eq!(q.next(Some(1)), Some(2));
        assert_eq!(q.next(Some(1)), None);
        assert_eq!(q.next(Some(0)), Some(0));
        assert_eq!(q.next(Some(0)), Some(1));
        let pool = PinnedPool::new(&t, Threads::Sparse, 2).unwrap();
        let q = MorselQueue::for_exec(&pool, &homes);
        assert_eq!(q.next(Some(1)), Some(3));
        assert_eq!(q.next(Some(1)), Some(0)); // stealing is on by default
    }

    #[test]
    fn pool_pins_sparse_workers() {
        let t = flat_topology();
        let p = PinnedPool::new(&t, Threads::Sparse, 3).unwrap();
        let cpus = p.run(&|w| (w.cpu, sys::current_cpu().unwrap()));
        for (want, got) in cpus {
            assert_eq!(want, Some(got));
        }
        assert!(PinnedPool::new(&t, Threads::Os, 0).is_err());
        assert!("spars"
            .parse::<Threads>()
            .unwrap_err()
            .to_string()
            .contains("sparse"));
    }
}
