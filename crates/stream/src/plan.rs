//! The stream configuration generator: from the sender's and the receiver's topology, the NIC's
//! node and the number of streams, where every stage's threads run and where their buffers live.
//!
//! Rules, from seed 001's observations (section numbers of the paper):
//! 1. Receiving threads run on the node the NIC hangs off (obs. 1 and 4: +15% network throughput).
//! 2. One thread per physical core; never two busy threads of a stage on one core (obs. 2: more
//!    threads than cores halves throughput by context switching).
//! 3. The cores of the NIC's node are split evenly between the streams (section 4.2: 16 cores,
//!    4 streams -> 4 receiving threads each), and each stream has as many sending threads and TCP
//!    connections as receiving threads.
//! 4. Decompression runs on the remaining cores, spread over the other nodes in turn (obs. 3:
//!    spreading decompressors over nodes avoids LLC and memory-controller contention), split
//!    evenly between streams. On a single-node receiver (or one without enough other cores) the
//!    NIC node's share of each stream is divided: a third receives, the rest decompresses.
//! 5. Compression runs on every core of the sender (obs. 2 and section 4.1: 32 compression
//!    threads on a 32-core sender), each thread fetching its next chunk from the source itself
//!    (section 3.2: "compressor threads successively fetch sequential data chunks"), sending
//!    threads on the sender's NIC node (obs. 4: their location barely matters, so they share
//!    cores with compressors rather than take cores away).
//! 6. Each thread's buffers live on its own cpu's node.
//!
//! 7. Each thread is bound to the node of the cpu the rules chose for it, as seed 001 binds its
//!    tasks with `numa_bind` (and as the work it cites found binding to the local processor better
//!    than binding to cores); the OS picks the core inside the node. `--bind cpu` pins each thread
//!    to that one cpu instead (`core` and `group` are in between).
//!
//! The rules choose one cpu per thread; every stage's threads then become a loci-place [`Plan`]
//! (that cpu widened by the binding, memory `localalloc`), which the configs are written from and
//! the stage threads are started with. Queue depths and the resend window are sized from the
//! thread counts so that no stage starves while another holds chunks (see [`plan`]).

use loci_place::{Bind, MemPolicy, Plan};
use loci_topo::{DeviceKind, Topology};

use crate::codec::Codec;
use crate::config::{ReceiverConfig, SenderConfig, Stage, StreamPart};

/// Inputs besides the two topologies.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Number of streams into the receiver.
    pub streams: usize,
    /// The receiver's NIC, by interface name (looked up in the receiver topology's devices).
    pub nic: Option<String>,
    /// The receiver's NIC node, given directly.
    pub nic_node: Option<u32>,
    /// The senders' NIC node (default: the same interface name in the sender topology, else the
    /// node with the most cores).
    pub sender_nic_node: Option<u32>,
    /// All streams leave one sender machine (its cores are split between them); default: each
    /// stream has its own sender machine of this topology (seed 001 used four).
    pub shared_sender: bool,
    /// Chunk size (default [`crate::config::DEFAULT_CHUNK_BYTES`]).
    pub chunk_bytes: usize,
    pub codec: Codec,
    /// How wide each thread's binding is around the cpu the rules chose (rule 7; default: its
    /// node).
    pub bind: Bind,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            streams: 1,
            nic: None,
            nic_node: None,
            sender_nic_node: None,
            shared_sender: false,
            chunk_bytes: crate::config::DEFAULT_CHUNK_BYTES,
            codec: Codec::default(),
            bind: Bind::Node,
        }
    }
}

/// One stage of one stream as a loci-place plan.
#[derive(Debug, Clone, PartialEq)]
pub struct StagePlan {
    /// `sender` or `receiver`.
    pub side: &'static str,
    pub stream: u32,
    /// `compress`, `send` (sender) or `recv`, `decompress` (receiver).
    pub stage: &'static str,
    pub plan: Plan,
}

/// The generated plans and the configurations written from them.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamPlan {
    /// Every stage of every stream, senders' first.
    pub stages: Vec<StagePlan>,
    /// One per stream (`send-K.toml`).
    pub senders: Vec<SenderConfig>,
    /// The receiver (`recv.toml`).
    pub receiver: ReceiverConfig,
    /// Why each choice was made, for the file headers and `loci stream plan` output.
    pub notes: Vec<String>,
}

impl StreamPlan {
    /// The plan of stage `name` (`compress`, `send`, `recv`, `decompress`) of `stream`.
    pub fn stage(&self, stream: u32, name: &str) -> Option<&Plan> {
        let s = self
            .stages
            .iter()
            .find(|s| s.stream == stream && s.stage == name);
        s.map(|s| &s.plan)
    }
}

/// A stream plan cannot be made.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StreamPlanError {
    #[error("--streams must be at least 1")]
    NoStreams,
    #[error("--chunk-bytes {bytes} outside 1..={max}")]
    ChunkBytes { bytes: usize, max: u64 },
    #[error("{side}: node {node} does not exist (nodes: {valid})")]
    UnknownNode {
        side: &'static str,
        node: u32,
        valid: String,
    },
    #[error("receiver: no network device {name:?} (network devices: {valid})")]
    UnknownNic { name: String, valid: String },
    #[error("receiver: NIC {name} reports no NUMA node (numa_node = -1); give --nic-node N")]
    NicWithoutNode { name: String },
    #[error("receiver: which NIC? it has {nodes} nodes and network devices {valid}; give --nic IFACE or --nic-node N")]
    AmbiguousNic { nodes: usize, valid: String },
    #[error("{side}: node {node} has {cores} usable cores, fewer than the {streams} streams that each need one")]
    TooFewCores {
        side: &'static str,
        node: u32,
        cores: usize,
        streams: usize,
    },
    #[error("{side}: no usable cpus")]
    NoCpus { side: &'static str },
    #[error("{side}: {message}")]
    Placement { side: &'static str, message: String },
}

/// One cpu per physical core of `node` (the lowest-numbered sibling), allowed and online.
pub fn cores_of(t: &Topology, node: u32) -> Vec<u32> {
    let allowed = t.allowed_cpus_of(node);
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for cpu in allowed.iter() {
        let Some(c) = t.cpu(cpu) else { continue };
        if seen.insert((c.package, c.core)) {
            out.push(cpu);
        }
    }
    out
}

fn node_check(t: &Topology, side: &'static str, node: u32) -> Result<(), StreamPlanError> {
    if t.node(node).is_none() {
        return Err(StreamPlanError::UnknownNode {
            side,
            node,
            valid: t.node_ids().to_string(),
        });
    }
    Ok(())
}

fn net_names(t: &Topology) -> String {
    let v: Vec<&str> = t
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Net)
        .map(|d| d.name.as_str())
        .collect();
    if v.is_empty() {
        "(none)".into()
    } else {
        v.join(", ")
    }
}

/// The receiver's NIC node from the options and the topology.
pub fn nic_node(t: &Topology, o: &PlanOptions) -> Result<u32, StreamPlanError> {
    if let Some(n) = o.nic_node {
        node_check(t, "receiver", n)?;
        return Ok(n);
    }
    if let Some(name) = &o.nic {
        let d = t
            .devices
            .iter()
            .find(|d| d.kind == DeviceKind::Net && &d.name == name)
            .ok_or_else(|| StreamPlanError::UnknownNic {
                name: name.clone(),
                valid: net_names(t),
            })?;
        return d
            .node
            .ok_or(StreamPlanError::NicWithoutNode { name: name.clone() });
    }
    if t.nodes.len() == 1 {
        return Ok(t.nodes[0].id);
    }
    let mut nodes: Vec<u32> = t
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Net)
        .filter_map(|d| d.node)
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    match nodes[..] {
        [n] => Ok(n),
        _ => Err(StreamPlanError::AmbiguousNic {
            nodes: t.nodes.len(),
            valid: net_names(t),
        }),
    }
}

/// Plans one stage: thread `i` bound to `cpus[i]` widened by `bind` (rule 7), its memory on that
/// cpu's node (`localalloc`, rule 6); records the plan and returns the config stage written from
/// it.
fn stage(
    t: &Topology,
    (side, stream, bind): (&'static str, u32, Bind),
    name: &'static str,
    cpus: &[u32],
    stages: &mut Vec<StagePlan>,
) -> Result<Stage, StreamPlanError> {
    let sets = cpus.iter().map(|&c| bind.widen(t, c)).collect();
    let plan = Plan::from_cpu_sets(t, sets, &MemPolicy::Local).map_err(|e| {
        StreamPlanError::Placement {
            side,
            message: crate::config::plan_message(e),
        }
    })?;
    let config = Stage::from_plan(&plan);
    stages.push(StagePlan {
        side,
        stream,
        stage: name,
        plan,
    });
    Ok(config)
}

/// Each of `streams` streams needs one of the `cores` cores (of `node` on `side`).
fn enough_cores(
    side: &'static str,
    node: u32,
    cores: usize,
    streams: usize,
) -> Result<(), StreamPlanError> {
    if cores < streams {
        return Err(StreamPlanError::TooFewCores {
            side,
            node,
            cores,
            streams,
        });
    }
    Ok(())
}

/// Interleaves the cores of several nodes: first core of each node, then the second, ...
fn interleave(lists: Vec<Vec<u32>>) -> Vec<u32> {
    let n = lists.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..n {
        for l in &lists {
            if let Some(&c) = l.get(i) {
                out.push(c);
            }
        }
    }
    out
}

/// Generates the sender and receiver configurations.
pub fn plan(
    sender: &Topology,
    receiver: &Topology,
    o: &PlanOptions,
) -> Result<StreamPlan, StreamPlanError> {
    let k = o.streams;
    if k == 0 {
        return Err(StreamPlanError::NoStreams);
    }
    if o.chunk_bytes == 0 || o.chunk_bytes as u64 > crate::config::MAX_CHUNK_BYTES {
        return Err(StreamPlanError::ChunkBytes {
            bytes: o.chunk_bytes,
            max: crate::config::MAX_CHUNK_BYTES,
        });
    }
    let mut notes = Vec::new();
    // Receiver.
    let nic = nic_node(receiver, o)?;
    let nic_cores = cores_of(receiver, nic);
    enough_cores("receiver", nic, nic_cores.len(), k)?;
    let others: Vec<Vec<u32>> = receiver
        .nodes
        .iter()
        .filter(|n| n.id != nic)
        .map(|n| cores_of(receiver, n.id))
        .filter(|c| !c.is_empty())
        .collect();
    let other_count: usize = others.iter().map(Vec::len).sum();
    let mut parts = Vec::new();
    if other_count >= k {
        let r = nic_cores.len() / k;
        let mut pool = interleave(others);
        pool.extend_from_slice(&nic_cores[r * k..]);
        let d = pool.len() / k;
        notes.push(format!(
            "receiver: {r} receiving thread(s) per stream on node {nic} (the NIC's node, cores split \
             evenly between {k} stream(s)); {d} decompressing thread(s) per stream on the other \
             nodes' cores, taken from each node in turn"
        ));
        for s in 0..k {
            parts.push((
                nic_cores[s * r..(s + 1) * r].to_vec(),
                pool[s * d..(s + 1) * d].to_vec(),
            ));
        }
    } else {
        let mut all = nic_cores.clone();
        all.extend(others.into_iter().flatten());
        let p = all.len() / k;
        let r = (p / 3).max(1);
        notes.push(format!(
            "receiver: no other node with cores to spare; each stream's {p} core(s) on node {nic} \
             split into {r} receiving and {} decompressing thread(s)",
            p.saturating_sub(r).max(1)
        ));
        for s in 0..k {
            let share = &all[s * p..(s + 1) * p];
            let (rc, dc) = if share.len() > r {
                (share[..r].to_vec(), share[r..].to_vec())
            } else {
                notes.push(format!(
                    "receiver: stream {s} has a single core; its receiving and decompressing \
                     threads share cpu {}",
                    share[0]
                ));
                (share.to_vec(), share.to_vec())
            };
            parts.push((rc, dc));
        }
    }
    // Sender(s).
    let snic = match o.sender_nic_node {
        Some(n) => {
            node_check(sender, "sender", n)?;
            n
        }
        None => o
            .nic
            .as_ref()
            .and_then(|name| {
                sender
                    .devices
                    .iter()
                    .find(|d| d.kind == DeviceKind::Net && &d.name == name)
                    .and_then(|d| d.node)
            })
            .unwrap_or_else(|| {
                sender
                    .nodes
                    .iter()
                    .max_by_key(|n| (cores_of(sender, n.id).len(), std::cmp::Reverse(n.id)))
                    .map(|n| n.id)
                    .unwrap_or(0)
            }),
    };
    let sender_cores: Vec<u32> = interleave(
        sender
            .nodes
            .iter()
            .map(|n| cores_of(sender, n.id))
            .collect(),
    );
    if sender_cores.is_empty() {
        return Err(StreamPlanError::NoCpus { side: "sender" });
    }
    let snic_cores = cores_of(sender, snic);
    let snic_cores = if snic_cores.is_empty() {
        sender_cores.clone()
    } else {
        snic_cores
    };
    let per_sender = if o.shared_sender {
        enough_cores("sender", snic, sender_cores.len(), k)?;
        sender_cores.len() / k
    } else {
        sender_cores.len()
    };
    notes.push(format!(
        "sender: {per_sender} compressing thread(s) per stream, one per core{}, each reading its \
         own chunks from the source; sending threads (one TCP connection each, as many as the \
         stream's receiving threads) on node {snic}, sharing cores with compressors",
        if o.shared_sender {
            format!(" ({k} streams share one sender)")
        } else {
            " (every core of its sender)".into()
        }
    ));
    let mut senders = Vec::new();
    let mut rparts = Vec::new();
    let (mut stages, mut rstages) = (Vec::new(), Vec::new());
    for (s, (rc, dc)) in parts.into_iter().enumerate() {
        let (on_sender, on_receiver) =
            (("sender", s as u32, o.bind), ("receiver", s as u32, o.bind));
        let comp: Vec<u32> = if o.shared_sender {
            sender_cores[s * per_sender..(s + 1) * per_sender].to_vec()
        } else {
            sender_cores.clone()
        };
        let nsend = rc.len();
        let send: Vec<u32> = (0..nsend)
            .map(|j| {
                let base = if o.shared_sender { s * nsend } else { 0 };
                // The NIC node's last cores.
                snic_cores[snic_cores.len() - 1 - (base + j) % snic_cores.len()]
            })
            .collect();
        let recv_depth = 2 * dc.len() + 2;
        let queue_depth = 2 * nsend + 2;
        let window = comp.len() + queue_depth + nsend + recv_depth + dc.len() + 4;
        senders.push(SenderConfig {
            stream: s as u32,
            chunk_bytes: o.chunk_bytes,
            codec: o.codec,
            window,
            queue_depth,
            secret: None,
            secret_file: None,
            encrypt: false,
            unauthenticated: false,
            compress: stage(sender, on_sender, "compress", &comp, &mut stages)?,
            send: stage(sender, on_sender, "send", &send, &mut stages)?,
        });
        rparts.push(StreamPart {
            id: s as u32,
            queue_depth: recv_depth,
            recv: stage(receiver, on_receiver, "recv", &rc, &mut rstages)?,
            decompress: stage(receiver, on_receiver, "decompress", &dc, &mut rstages)?,
        });
    }
    notes.push(match o.bind {
        Bind::Cpu => "binding: each thread pinned to the cpu the rules chose (--bind cpu)".into(),
        b => format!(
            "binding: each thread may run on every allowed cpu of its {}, the OS picks (seed \
             001 binds with numa_bind); --bind cpu pins it to the cpu the rules chose",
            match b {
                Bind::Node => "node",
                Bind::Group => "last-level cache group",
                _ => "core (its SMT siblings)",
            }
        ),
    });
    notes.push(
        "queues: compress->send 2 per sending thread + 2, recv->decompress 2 per decompressing \
         thread + 2; window (chunks held until acknowledged) covers every queue and thread on \
         the way"
            .into(),
    );
    stages.extend(rstages);
    Ok(StreamPlan {
        stages,
        senders,
        receiver: ReceiverConfig {
            streams: rparts,
            ..ReceiverConfig::default()
        },
        notes,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use loci_topo::{Cpu, CpuSet, Device, Node};

    /// A hand-built machine: `nodes` nodes of `cores` cores with 2 hardware threads each, Linux
    /// numbering (first threads of all cores, then the siblings), NICs on the given nodes.
    pub fn machine(nodes: u32, cores: u32, nics: &[(&str, Option<u32>)]) -> Topology {
        let total = nodes * cores;
        let mut cpus = Vec::new();
        for id in 0..2 * total {
            let core = id % total;
            cpus.push(Cpu {
                id,
                core,
                package: core / cores,
                node: Some(core / cores),
                online: true,
                allowed: true,
            });
        }
        Topology {
            source: "test".into(),
            nodes: (0..nodes)
                .map(|n| Node {
                    id: n,
                    cpus: cpus
                        .iter()
                        .filter(|c| c.node == Some(n))
                        .map(|c| c.id)
                        .collect(),
                    memory_bytes: Some(512 << 30),
                    ..Default::default()
                })
                .collect(),
            cpus,
            caches: vec![],
            devices: nics
                .iter()
                .map(|(n, node)| Device {
                    name: n.to_string(),
                    kind: DeviceKind::Net,
                    node: *node,
                })
                .collect(),
            distances: (0..nodes)
                .map(|i| (0..nodes).map(|j| if i == j { 10 } else { 21 }).collect())
                .collect(),
            notes: vec![],
        }
    }

    /// Seed 001's gateway: 2 x Xeon Gold 6346 (16 cores, 32 threads each), the 200 Gb/s NIC used
    /// for streaming on node 1 and the Lustre NIC on node 0.
    pub fn xeon_6346() -> Topology {
        machine(2, 16, &[("ens1f0", Some(0)), ("ens2f0", Some(1))])
    }

    fn nodes_of(t: &Topology, s: &Stage) -> Vec<u32> {
        s.cpus
            .iter()
            .map(|c| t.node_of_cpu(c.first().unwrap()).unwrap())
            .collect()
    }

    /// The plan for a machine streaming to itself.
    fn plan_on(t: &Topology, o: PlanOptions) -> StreamPlan {
        plan(t, t, &o).unwrap()
    }

    fn preset(name: &str) -> Topology {
        loci_topo::load(&loci_topo::Source::Preset(name.into())).unwrap()
    }

    /// Four streams into the seed's gateway through `nic`: 4 receiving threads per stream on
    /// node 1, 4 decompressors on node 0 (section 4.2), 32 compressors and 4 senders per sender.
    fn check_seed_split(t: &Topology, nic: &str) -> StreamPlan {
        let nic = Some(nic.into());
        let p = plan_on(
            t,
            PlanOptions {
                streams: 4,
                nic,
                bind: Bind::Cpu, // the rules' own cpus
                ..Default::default()
            },
        );
        for part in &p.receiver.streams {
            assert_eq!(part.recv.count, 4);
            assert!(nodes_of(t, &part.recv).iter().all(|&n| n == 1));
            assert_eq!(part.decompress.count, 4);
            assert!(nodes_of(t, &part.decompress).iter().all(|&n| n == 0));
        }
        assert!(p
            .senders
            .iter()
            .all(|s| s.compress.count == 32 && s.send.count == 4));
        p
    }

    #[test]
    fn seed_machine_four_streams_matches_the_papers_configuration() {
        let t = xeon_6346();
        let p = check_seed_split(&t, "ens2f0");
        assert_eq!(p.senders.len(), 4);
        let mut recv_cpus = CpuSet::new();
        let mut dec_cpus = CpuSet::new();
        for part in &p.receiver.streams {
            assert_eq!(part.recv.mem, vec![1; 4]);
            assert_eq!(part.decompress.mem, vec![0; 4]);
            for c in part.recv.cpus.iter().chain(&part.decompress.cpus) {
                assert!(
                    c.len() == 1 && c.first().unwrap() < 32,
                    "one cpu per core: {c}"
                );
                assert!(
                    recv_cpus.union(&dec_cpus).intersection(c).is_empty(),
                    "cores are not shared"
                );
            }
            for c in &part.recv.cpus {
                recv_cpus = recv_cpus.union(c);
            }
            for c in &part.decompress.cpus {
                dec_cpus = dec_cpus.union(c);
            }
        }
        assert_eq!(recv_cpus.len(), 16);
        assert_eq!(dec_cpus.len(), 16);
        for s in &p.senders {
            // Senders on the NIC's node.
            assert!(nodes_of(&t, &s.send).iter().all(|&n| n == 1));
            s.validate().unwrap();
        }
        p.receiver.validate().unwrap();
    }

    #[test]
    fn the_gold_6346_preset_gives_the_same_plan_as_the_hand_built_machine() {
        check_seed_split(&preset("xeon-gold-6346-2s"), "ens5f0np0");
    }

    #[test]
    fn stage_plans_put_receivers_on_the_nic_nodes_cpus_of_a_four_node_preset() {
        let t = preset("xeon-e7-4850v4-4s");
        let nic_node = Some(2);
        let p = plan_on(
            &t,
            PlanOptions {
                streams: 2,
                nic_node,
                bind: Bind::Cpu,
                ..Default::default()
            },
        );
        let of = |stage: &str| -> Vec<&StagePlan> {
            p.stages.iter().filter(|s| s.stage == stage).collect()
        };
        let nic_cpus = t.allowed_cpus_of(2);
        let recv = of("recv");
        assert_eq!(recv.len(), 2, "one recv plan per stream");
        for (k, s) in recv.iter().enumerate() {
            assert_eq!((s.side, s.stream), ("receiver", k as u32));
            assert!(s.plan.pinned && s.plan.memory.policy == "localalloc");
            assert_eq!(
                s.plan.threads.len(),
                8,
                "16 cores of node 2 split between 2 streams"
            );
            for th in &s.plan.threads {
                assert_eq!(th.cpus.len(), 1, "one cpu per thread: {}", th.cpus);
                assert!(th.cpus.is_subset(&nic_cpus), "{} not on node 2", th.cpus);
                assert_eq!(th.nodes, loci_topo::NodeSet::single(2));
            }
        }
        assert!(recv[0]
            .plan
            .footprint()
            .intersection(&recv[1].plan.footprint())
            .is_empty());
        for s in of("decompress") {
            assert!(
                !s.plan.thread_nodes().contains(2),
                "decompressors off the NIC node"
            );
            assert_eq!(
                s.plan.thread_nodes().len(),
                3,
                "spread over the 3 other nodes"
            );
        }
        // The configs are the plans written out: reading them back gives the same cpus.
        for s in &p.stages {
            let written = match (s.side, s.stage) {
                ("receiver", "recv") => &p.receiver.streams[s.stream as usize].recv,
                ("receiver", _) => &p.receiver.streams[s.stream as usize].decompress,
                (_, "compress") => &p.senders[s.stream as usize].compress,
                _ => &p.senders[s.stream as usize].send,
            };
            let back = written.plan(&t, s.stage).unwrap();
            assert_eq!(back.threads, s.plan.threads, "{} {}", s.side, s.stage);
        }
        assert_eq!(p.stages.len(), 2 * 4);
    }

    #[test]
    fn decompressors_spread_over_every_other_node() {
        let t = machine(4, 4, &[("eth0", Some(2))]);
        let p = plan_on(&t, PlanOptions::default());
        let part = &p.receiver.streams[0];
        assert!(nodes_of(&t, &part.recv).iter().all(|&n| n == 2));
        assert_eq!(part.recv.count, 4);
        let dn = nodes_of(&t, &part.decompress);
        assert_eq!(dn.len(), 12);
        assert_eq!(&dn[..3], &[0, 1, 3], "taken from each node in turn");
    }

    #[test]
    fn single_node_machine_splits_its_cores() {
        let t = machine(1, 2, &[]);
        let cpu = PlanOptions {
            bind: Bind::Cpu,
            ..Default::default()
        };
        let p = plan_on(&t, cpu);
        let part = &p.receiver.streams[0];
        assert_eq!((part.recv.count, part.decompress.count), (1, 1));
        assert_ne!(part.recv.cpus, part.decompress.cpus);
        assert_eq!(p.senders[0].compress.count, 2);
        assert_eq!(p.senders[0].send.count, 1);
        let t1 = machine(1, 1, &[]);
        let p = plan_on(&t1, PlanOptions::default());
        assert!(p.notes.iter().any(|n| n.contains("share cpu")));
    }

    #[test]
    fn threads_are_bound_to_their_node_by_default_and_as_asked_otherwise() {
        let t = xeon_6346();
        let nic_node = Some(1);
        let by = |bind| {
            plan_on(
                &t,
                PlanOptions {
                    nic_node,
                    bind,
                    ..Default::default()
                },
            )
        };
        let (node, cpu, core) = (
            plan_on(
                &t,
                PlanOptions {
                    nic_node,
                    ..Default::default()
                },
            ),
            by(Bind::Cpu),
            by(Bind::Core),
        );
        assert_eq!(node, by(Bind::Node), "node binding is the default");
        assert!(node.notes.iter().any(|n| n.contains("numa_bind")));
        for ((n, c), k) in node.stages.iter().zip(&cpu.stages).zip(&core.stages) {
            let what = format!("{} {}", n.side, n.stage);
            assert_eq!(n.plan.threads.len(), c.plan.threads.len(), "{what}");
            for ((tn, tc), tk) in n
                .plan
                .threads
                .iter()
                .zip(&c.plan.threads)
                .zip(&k.plan.threads)
            {
                // Widened around the cpu the rules chose, never moved off it.
                let anchor = tc.cpus.first().unwrap();
                assert_eq!(tc.cpus.len(), 1, "{what}: cpu binding pins one cpu");
                let home = t.node_of_cpu(anchor).unwrap();
                assert_eq!(tn.cpus, t.allowed_cpus_of(home), "{what}: the whole node");
                assert_eq!(tn.nodes, tc.nodes, "{what}: the same node either way");
                assert_eq!(
                    tk.cpus,
                    t.smt_siblings(anchor),
                    "{what}: the core's siblings"
                );
            }
        }
        // The configs say the same, and the buffers stay on the thread's node.
        let part = &node.receiver.streams[0];
        assert!(part.recv.cpus.iter().all(|c| *c == t.allowed_cpus_of(1)));
        assert_eq!(part.recv.mem, cpu.receiver.streams[0].recv.mem);
        assert!(part.recv.mem.iter().all(|&m| m == 1));
        let comp = node.senders[0].compress.plan(&t, "compress").unwrap();
        let home = comp.threads[0].nodes.first().unwrap();
        assert_eq!(comp.threads[0].cpus, t.allowed_cpus_of(home));
    }

    #[test]
    fn cores_split_evenly_between_streams_of_a_shared_sender() {
        let t = xeon_6346();
        let (nic_node, shared_sender) = (Some(1), true);
        let o = PlanOptions {
            streams: 2,
            nic_node,
            shared_sender,
            bind: Bind::Cpu,
            ..Default::default()
        };
        let p = plan_on(&t, o);
        let (a, b) = (p.stage(0, "compress"), p.stage(1, "compress"));
        let (a, b) = (a.unwrap().footprint(), b.unwrap().footprint());
        assert_eq!((a.len(), b.len()), (16, 16));
        assert!(a.intersection(&b).is_empty());
        assert_eq!(p.stage(0, "recv").unwrap().threads.len(), 8);
        assert!(p.stage(2, "recv").is_none() && p.stage(0, "bogus").is_none());
    }

    #[test]
    fn bad_inputs_name_what_is_wrong() {
        let o = PlanOptions::default;
        let nonode = machine(2, 2, &[("eth0", None)]);
        let cases: [(Topology, PlanOptions, &str); 8] = [
            (xeon_6346(), o(), "which NIC"),
            (
                xeon_6346(),
                PlanOptions {
                    chunk_bytes: 0,
                    ..o()
                },
                "--chunk-bytes 0 outside 1..=268435456",
            ),
            (
                xeon_6346(),
                PlanOptions {
                    chunk_bytes: 8 << 30,
                    ..o()
                },
                "--chunk-bytes 8589934592 outside",
            ),
            (
                xeon_6346(),
                PlanOptions {
                    nic: Some("eth9".into()),
                    ..o()
                },
                "ens1f0, ens2f0",
            ),
            (
                xeon_6346(),
                PlanOptions {
                    nic_node: Some(7),
                    ..o()
                },
                "nodes: 0-1",
            ),
            (xeon_6346(), PlanOptions { streams: 0, ..o() }, "at least 1"),
            (
                xeon_6346(),
                PlanOptions {
                    streams: 17,
                    nic_node: Some(1),
                    ..o()
                },
                "fewer than the 17",
            ),
            (
                nonode,
                PlanOptions {
                    nic: Some("eth0".into()),
                    ..o()
                },
                "--nic-node",
            ),
        ];
        for (t, o, want) in cases {
            let e = plan(&t, &t, &o).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
