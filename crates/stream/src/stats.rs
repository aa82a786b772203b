//! Counters every stage thread updates, and the final report: throughput, compression ratio,
//! busy share and CPU time per stage, queue occupancy, bottleneck, and where threads and buffers
//! really were.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use loci_place::apply::apply_thread;
use loci_place::Plan;
use loci_topo::{CpuSet, NodeSet, Topology};
use serde::Serialize;

use crate::config::{buffer_node, Stage};

/// One stage's placement (a loci-place plan) and counters (all its threads).
#[derive(Debug)]
pub struct StageStats {
    pub name: &'static str,
    /// Where its threads run and where their buffers live.
    pub plan: Plan,
    /// Nanoseconds spent working (not waiting on a queue or the network to have something).
    pub busy_ns: AtomicU64,
    /// CPU time of its threads (user + system, kernel work for them included), nanoseconds.
    pub cpu_ns: AtomicU64,
    /// Chunks handled.
    pub chunks: AtomicU64,
    /// Where its threads were seen running and where their buffers sat.
    pub seen: Mutex<Vec<ThreadSeen>>,
}

thread_local! {
    /// The calling thread's CPU time (ns) already added to a stage's `cpu_ns`.
    static CPU_COUNTED: Cell<u64> = const { Cell::new(0) };
}

/// Placement of one thread as the kernel reported it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ThreadSeen {
    pub index: usize,
    /// Affinity mask after pinning.
    pub affinity: CpuSet,
    /// Cpus it was observed running on (sched_getcpu, sampled per chunk).
    pub ran_on: CpuSet,
    /// Nodes holding its buffers' pages (move_pages).
    pub buffer_nodes: NodeSet,
}

impl StageStats {
    /// Counters for a stage placed by `plan`.
    pub fn new(name: &'static str, plan: Plan) -> Self {
        StageStats {
            name,
            busy_ns: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            seen: Mutex::new(vec![ThreadSeen::default(); plan.threads.len()]),
            plan,
        }
    }
    /// Counters for the config stage `stage` planned on `topo` (see [`Stage::plan`]).
    pub fn planned(name: &'static str, stage: &Stage, topo: &Topology) -> Result<Self, String> {
        Ok(Self::new(
            name,
            stage.plan(topo, name).map_err(|e| e.to_string())?,
        ))
    }
    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.plan.threads.len()
    }
    /// The node of thread `i`'s buffers, if the plan sets one.
    pub fn buffer_node(&self, i: usize) -> Option<u32> {
        buffer_node(&self.plan, i)
    }
    /// Places the calling thread as thread `i` of the stage (loci-place's `apply_thread`: its
    /// cpus and the plan's memory policy) and records its affinity. Errors name the stage, the
    /// thread and the cpus; nothing falls back silently.
    pub fn enter(&self, i: usize) -> Result<(), String> {
        apply_thread(&self.plan, i).map_err(|e| {
            let allowed = loci_place::sys::get_affinity(0)
                .map(|a| a.to_string())
                .unwrap_or_default();
            let cpus = self.plan.threads.get(i).map(|t| t.cpus.to_string());
            format!(
                "{} thread {i}: cannot run on cpus {} with memory {}: {e} (cpus allowed here: \
                 {allowed})",
                self.name,
                cpus.unwrap_or_default(),
                self.plan.memory
            )
        })?;
        self.saw_affinity(i);
        Ok(())
    }
    /// Adds busy time since `t`, and the calling thread's CPU time since its previous call (of
    /// any stage; since the thread started, for its first): a stage thread calls this after each
    /// piece of work, so its CPU time is counted as it goes, also while the stream still runs.
    /// Costs one `clock_gettime` per call (per chunk: well under 0.1% of a chunk's work).
    pub fn busy_since(&self, t: Instant) {
        self.busy_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        let now = (loci_place::sys::thread_cpu_seconds() * 1e9) as u64;
        let last = CPU_COUNTED.replace(now);
        self.cpu_ns.fetch_add(now.saturating_sub(last), Relaxed);
    }
    /// Records the cpu thread `i` runs on now.
    pub fn saw_cpu(&self, i: usize) {
        if let Ok(c) = loci_place::sys::current_cpu() {
            if let Some(t) = self.seen.lock().unwrap().get_mut(i) {
                t.ran_on.insert(c);
            }
        }
    }
    /// Records where a buffer of thread `i` lives.
    pub fn saw_buffer(&self, i: usize, b: &crate::buf::NodeBuf) {
        if let Ok(n) = b.actual_nodes() {
            if let Some(t) = self.seen.lock().unwrap().get_mut(i) {
                t.buffer_nodes = t.buffer_nodes.union(&n);
            }
        }
    }
    /// Records the affinity thread `i` ended up with.
    fn saw_affinity(&self, i: usize) {
        if let Ok(a) = loci_place::sys::get_affinity(0) {
            if let Some(t) = self.seen.lock().unwrap().get_mut(i) {
                t.index = i;
                t.affinity = a;
            }
        }
    }
    /// The report entry, over `wall_s` seconds.
    pub fn report(&self, wall_s: f64) -> StageReport {
        let busy = self.busy_ns.load(Relaxed) as f64 / 1e9;
        let n = self.threads();
        StageReport {
            name: self.name.to_string(),
            threads: n,
            chunks: self.chunks.load(Relaxed),
            cpu_s: self.cpu_ns.load(Relaxed) as f64 / 1e9,
            busy_share: if wall_s > 0.0 {
                (busy / (wall_s * n as f64)).min(1.0)
            } else {
                0.0
            },
            planned_cpus: (self.plan.threads.iter())
                .map(|t| self.plan.pinned.then(|| t.cpus.clone()))
                .collect(),
            planned_mem: (0..n).map(|i| self.buffer_node(i)).collect(),
            seen: self.seen.lock().unwrap().clone(),
        }
    }
}

/// A bounded queue's occupancy, sampled by the monitor.
#[derive(Debug, Default)]
pub struct QueueStats {
    pub name: &'static str,
    pub capacity: usize,
    samples: AtomicU64,
    sum: AtomicU64,
    full: AtomicU64,
}

impl QueueStats {
    pub fn new(name: &'static str, capacity: usize) -> Self {
        QueueStats {
            name,
            capacity,
            ..Default::default()
        }
    }
    /// Records one sample of the queue length.
    pub fn sample(&self, len: usize) {
        self.samples.fetch_add(1, Relaxed);
        self.sum.fetch_add(len as u64, Relaxed);
        if len >= self.capacity {
            self.full.fetch_add(1, Relaxed);
        }
    }
    pub fn report(&self) -> QueueReport {
        let n = self.samples.load(Relaxed).max(1) as f64;
        QueueReport {
            name: self.name.to_string(),
            capacity: self.capacity,
            mean_occupancy: self.sum.load(Relaxed) as f64 / n / self.capacity.max(1) as f64,
            full_share: self.full.load(Relaxed) as f64 / n,
        }
    }
}

/// One stage in the final report.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    pub name: String,
    pub threads: usize,
    pub chunks: u64,
    /// Busy time / (wall time x threads).
    pub busy_share: f64,
    /// CPU seconds its threads used (user + system), counted after each piece of work.
    pub cpu_s: f64,
    pub planned_cpus: Vec<Option<CpuSet>>,
    pub planned_mem: Vec<Option<u32>>,
    pub seen: Vec<ThreadSeen>,
}

impl StageReport {
    /// CPU seconds per GB (10^9 bytes) of `raw_bytes`; 0 for none.
    pub fn cpu_s_per_gb(&self, raw_bytes: u64) -> f64 {
        if raw_bytes == 0 {
            0.0
        } else {
            self.cpu_s * 1e9 / raw_bytes as f64
        }
    }
}

/// One queue in the final report.
#[derive(Debug, Clone, Serialize)]
pub struct QueueReport {
    pub name: String,
    pub capacity: usize,
    /// Mean length / capacity.
    pub mean_occupancy: f64,
    /// Share of samples where it was full.
    pub full_share: f64,
}

/// The final report of one side of one stream (`--json` prints it).
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    pub role: String,
    pub stream: u32,
    pub chunks: u64,
    pub raw_bytes: u64,
    /// Compressed bytes on the wire (payloads, first transmissions and resends).
    pub wire_bytes: u64,
    pub seconds: f64,
    /// Wire bytes per second.
    pub network_bytes_per_s: f64,
    /// Raw bytes per second, end to end.
    pub end_to_end_bytes_per_s: f64,
    pub compression_ratio: f64,
    pub stages: Vec<StageReport>,
    pub queues: Vec<QueueReport>,
    /// The stage with the highest busy share.
    pub bottleneck: String,
    /// Whole-stream xxh3 (hex), and whether both sides agreed.
    pub stream_xxh3: String,
    pub verified: bool,
    pub resent_chunks: u64,
    pub nacks: u64,
    pub reconnects: u64,
    /// Chunks the receiver already had (resume).
    pub skipped_chunks: u64,
}

/// What one side of a stream measured; [`StreamReport::from_totals`] derives the rest.
#[derive(Debug, Clone, Copy)]
pub struct Totals {
    pub chunks: u64,
    pub raw_bytes: u64,
    pub wire_bytes: u64,
    /// When the side started: the report covers the time since.
    pub started: Instant,
}

impl StreamReport {
    /// A report from measured totals: rates, compression ratio and bottleneck are derived here,
    /// in one place. Resend and resume counters start at 0 and `verified` at false; callers set
    /// what their side knows with struct update syntax.
    pub fn from_totals(
        role: &str,
        stream: u32,
        t: Totals,
        stages: &[&StageStats],
        queues: &[&QueueStats],
        checksum: u64,
    ) -> Self {
        let (raw, wire) = (t.raw_bytes, t.wire_bytes);
        let secs = t.started.elapsed().as_secs_f64();
        let stages: Vec<StageReport> = stages.iter().map(|s| s.report(secs)).collect();
        let queues = queues.iter().map(|q| q.report()).collect();
        StreamReport {
            role: role.into(),
            stream,
            chunks: t.chunks,
            raw_bytes: raw,
            wire_bytes: wire,
            seconds: secs,
            network_bytes_per_s: wire as f64 / secs,
            end_to_end_bytes_per_s: raw as f64 / secs,
            compression_ratio: if wire > 0 {
                raw as f64 / wire as f64
            } else {
                0.0
            },
            bottleneck: Self::pick_bottleneck(&stages),
            stages,
            queues,
            stream_xxh3: format!("{checksum:016x}"),
            verified: false,
            resent_chunks: 0,
            nacks: 0,
            reconnects: 0,
            skipped_chunks: 0,
        }
    }

    /// Picks the bottleneck: the busiest stage.
    pub fn pick_bottleneck(stages: &[StageReport]) -> String {
        stages
            .iter()
            .max_by(|a, b| a.busy_share.total_cmp(&b.busy_share))
            .map(|s| s.name.clone())
            .unwrap_or_default()
    }
    /// A human summary.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} stream {}: {} chunks, {} raw bytes in {:.2} s{}",
            self.role,
            self.stream,
            self.chunks,
            self.raw_bytes,
            self.seconds,
            if self.skipped_chunks > 0 {
                format!(" ({} chunks already at the receiver)", self.skipped_chunks)
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            s,
            "  end to end {:.1} MB/s raw, network {:.1} MB/s compressed, ratio {:.3}",
            self.end_to_end_bytes_per_s / 1e6,
            self.network_bytes_per_s / 1e6,
            self.compression_ratio
        );
        let stages = self.stages.iter().map(|st| {
            format!(
                "  stage {:<10} {:>3} threads  busy {:>5.1}%  cpu {:>7.3} s ({:.3} s per raw GB)  chunks {}",
                st.name,
                st.threads,
                st.busy_share * 100.0,
                st.cpu_s,
                st.cpu_s_per_gb(self.raw_bytes),
                st.chunks
            )
        });
        let queues = self.queues.iter().map(|q| {
            format!(
                "  queue {:<20} depth {:>3}  mean {:>5.1}% full  at capacity {:>5.1}% of samples",
                q.name,
                q.capacity,
                q.mean_occupancy * 100.0,
                q.full_share * 100.0
            )
        });
        for line in stages.chain(queues) {
            let _ = writeln!(s, "{line}");
        }
        let _ = writeln!(
            s,
            "  bottleneck: {}; resent {} chunks ({} nacks, {} reconnects); stream xxh3 {} {}",
            self.bottleneck,
            self.resent_chunks,
            self.nacks,
            self.reconnects,
            self.stream_xxh3,
            if self.verified {
                "verified by both sides"
            } else {
                "NOT verified"
            }
        );
        s
    }
}
