//! A MODELED cost of a subarray run under a plan, for machines loci is not running on
//! (presets) and for testing the search. Never a measurement: everything it returns is labelled
//! modeled.
//!
//! The model (all numbers are parameters of [`CostModel`]):
//! - the work is the parts of the run, each with its bytes, the home of its source chunk and the
//!   thread that copies it (static schedule: thread `t` of `T` takes parts `t*P/T..(t+1)*P/T`);
//! - where a thread runs: its single cpu; a thread bound to several cpus (or unpinned: an `os`
//!   plan's threads have all allowed cpus) is modeled as the OS spreading the threads that share that set over its
//!   cpus in id order (the `k`-th thread with set `S` on the `k mod |S|`-th cpu of `S`);
//! - a thread copies at `core_gbps` scaled by the copy's distance: half of the traffic is the read
//!   of the source, slowed by `distance(thread node, source node) / 10` (the SLIT ratio, so 21 =
//!   2.1x slower), the other half the write of the result, which is local (first touch);
//! - threads that share a physical core split `core_gbps * smt_yield` (1.0 for one thread), and
//!   threads on the same cpu split it evenly;
//! - every node's memory serves at most `node_gbps` (the source bytes read from it plus the result
//!   bytes written to it); interleaved chunks are read evenly from their nodes;
//! - every remote byte crosses the interconnect, which carries at most `link_gbps` per node of
//!   the machine in total;
//! - the run takes as long as the slowest of: the slowest thread, the busiest node's memory, the
//!   interconnect.

use loci_topo::Topology;
use serde::{Deserialize, Serialize};

use crate::layout::Layout;
use crate::mem::Home;
use crate::subarray::plan_parts;
use loci_place::Plan;

/// Parameters of the modeled machine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Copy rate of one thread alone on a core, local data, GB/s.
    pub core_gbps: f64,
    /// Throughput of a physical core running two or more threads, relative to one.
    pub smt_yield: f64,
    /// Memory bandwidth of one node, GB/s.
    pub node_gbps: f64,
    /// Interconnect capacity per node of the machine, GB/s (total = this x nodes).
    pub link_gbps: f64,
}

impl Default for CostModel {
    /// Round numbers of a 2010s server: 6 GB/s per core, 20 GB/s per node, 8 GB/s of
    /// interconnect per node, SMT adds 20%.
    fn default() -> Self {
        Self {
            core_gbps: 6.0,
            smt_yield: 1.2,
            node_gbps: 20.0,
            link_gbps: 8.0,
        }
    }
}

/// One part as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPart {
    /// The thread that copies it.
    pub thread: usize,
    /// Bytes copied (read once, written once).
    pub bytes: u64,
    /// Home of the source chunk.
    pub home: Home,
}

/// A subarray run described for the model: which thread copies how many bytes from where.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelWorkload {
    pub threads: usize,
    pub parts: Vec<ModelPart>,
}

impl ModelWorkload {
    /// The parts of `subarray(b)` on `layout` for `threads` threads with the static schedule,
    /// with the home of each chunk from `home(chunk id)`.
    pub fn subarray(
        layout: &Layout,
        b: &[std::ops::Range<usize>],
        threads: usize,
        home: impl Fn(usize) -> Home,
    ) -> Self {
        let parts = plan_parts(layout, b, threads, None);
        let n = parts.len();
        let cell = layout.cell_bytes() as u64;
        Self {
            threads,
            parts: parts
                .iter()
                .enumerate()
                .map(|(i, p)| ModelPart {
                    // Inverse of the static schedule's block split.
                    thread: (0..threads)
                        .find(|&t| i < (t + 1) * n / threads)
                        .unwrap_or(threads - 1),
                    bytes: p.len() as u64 * cell,
                    home: home(p.src),
                })
                .collect(),
        }
    }

    /// Bytes of each thread by source node (for interleaved homes split evenly), as
    /// `(node, bytes)` lists: what a data-aware placement wants to know.
    pub fn bytes_by_node(&self) -> Vec<Vec<(u32, f64)>> {
        let mut out = vec![Vec::<(u32, f64)>::new(); self.threads];
        for p in &self.parts {
            for (n, b) in split_home(&p.home, p.bytes as f64) {
                let row = &mut out[p.thread];
                match row.iter_mut().find(|(m, _)| *m == n) {
                    Some(e) => e.1 += b,
                    None => row.push((n, b)),
                }
            }
        }
        out
    }
}

fn split_home(h: &Home, bytes: f64) -> Vec<(u32, f64)> {
    match h {
        Home::Node(n) => vec![(*n, bytes)],
        Home::Interleave(s) if !s.is_empty() => {
            let k = s.len() as f64;
            s.iter().map(|n| (n, bytes / k)).collect()
        }
        // Unknown homes are modeled as local to whoever reads them (no penalty).
        _ => vec![],
    }
}

/// The cpu each thread is modeled on (see the module doc for sets).
pub fn modeled_cpus(topo: &Topology, p: &Plan) -> Vec<u32> {
    let allowed = topo.allowed_cpus();
    let mut seen: Vec<(loci_topo::CpuSet, usize)> = Vec::new();
    p.threads
        .iter()
        .map(|t| {
            let set = if p.pinned { &t.cpus } else { &allowed }.clone();
            let k = match seen.iter_mut().find(|(s, _)| *s == set) {
                Some(e) => {
                    e.1 += 1;
                    e.1 - 1
                }
                None => {
                    seen.push((set.clone(), 1));
                    0
                }
            };
            let cpus: Vec<u32> = set.iter().collect();
            cpus[k % cpus.len()]
        })
        .collect()
}

/// The three limits of a modeled run, in modeled seconds; the run takes the largest.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModelLimits {
    /// The slowest thread's copy time.
    pub slowest_thread: f64,
    /// The busiest node's memory: bytes it serves / `node_gbps`.
    pub busiest_node: f64,
    /// Remote bytes / the interconnect's capacity.
    pub interconnect: f64,
}

impl ModelLimits {
    /// The modeled run time: the largest limit.
    pub fn time(&self) -> f64 {
        self.slowest_thread
            .max(self.busiest_node)
            .max(self.interconnect)
    }
}

impl CostModel {
    /// Modeled seconds of `w` under plan `p` on `topo`.
    pub fn cost(&self, topo: &Topology, w: &ModelWorkload, p: &Plan) -> f64 {
        self.limits(topo, w, p).time()
    }

    /// The three limits of `w` under `p` (see the module doc); [`CostModel::cost`] is their
    /// maximum.
    pub fn limits(&self, topo: &Topology, w: &ModelWorkload, p: &Plan) -> ModelLimits {
        assert_eq!(
            p.threads.len(),
            w.threads,
            "plan and workload disagree on the thread count"
        );
        let cpus = modeled_cpus(topo, p);
        let node_of = |c: u32| topo.node_of_cpu(c).unwrap_or(0);
        let gb = 1e9;
        // Sharing: threads per cpu and per physical core.
        let mut per_cpu = std::collections::HashMap::new();
        let mut per_core = std::collections::HashMap::new();
        for &c in &cpus {
            *per_cpu.entry(c).or_insert(0usize) += 1;
            let core = topo.cpu(c).map(|x| (x.package, x.core)).unwrap_or((0, c));
            per_core.entry(core).or_insert_with(Vec::new).push(c);
        }
        let rate = |c: u32| -> f64 {
            let core = topo.cpu(c).map(|x| (x.package, x.core)).unwrap_or((0, c));
            let on_core = &per_core[&core];
            let mut distinct = on_core.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let y = if distinct.len() > 1 {
                self.smt_yield
            } else {
                1.0
            };
            // The core's throughput split over its threads.
            self.core_gbps * gb * y / on_core.len() as f64
        };
        let mut thread_time = vec![0.0f64; w.threads];
        let mut node_bytes = std::collections::HashMap::<u32, f64>::new();
        let mut remote = 0.0;
        for part in &w.parts {
            let c = cpus[part.thread];
            let me = node_of(c);
            let bytes = part.bytes as f64;
            let sources = split_home(&part.home, bytes);
            let mut read_factor = 0.0;
            if sources.is_empty() {
                read_factor = bytes;
                *node_bytes.entry(me).or_default() += bytes;
            }
            for (n, b) in sources {
                let d = topo.distance(me, n).unwrap_or(10) as f64 / 10.0;
                read_factor += b * d;
                *node_bytes.entry(n).or_default() += b;
                if n != me {
                    remote += b;
                }
            }
            // Result written locally by first touch.
            *node_bytes.entry(me).or_default() += bytes;
            thread_time[part.thread] += (0.5 * read_factor + 0.5 * bytes) / rate(c);
        }
        let slowest_thread = thread_time.iter().cloned().fold(0.0, f64::max);
        let busiest_node = node_bytes.values().cloned().fold(0.0, f64::max) / (self.node_gbps * gb);
        let interconnect = remote / (self.link_gbps * gb * topo.nodes.len() as f64);
        ModelLimits {
            slowest_thread,
            busiest_node,
            interconnect,
        }
    }
}
