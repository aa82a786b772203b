//! Seed 004's deployment designs as instance layouts over a Topology value: which cpus, nodes,
//! memory policy and network device each instance gets, and the loci-place plan that says so.

use std::collections::BTreeMap;

use anyhow::bail;
use clap::ValueEnum;
use loci_place::{MemPolicy, Plan, Strategy};
use loci_topo::{CpuSet, DeviceKind, NodeSet, Topology};

/// A design of seed 004.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Design {
    /// One instance for the whole machine, not pinned (the usual default of distributed engines).
    Wim,
    /// One instance per node that has cpus, bound to that node's cpus.
    Win,
    /// One instance per physical core, bound to the core's hardware threads.
    Wic,
    /// As many instances as WIN, each with as many cores, but each core from another node.
    Spmwin,
}

/// Memory policy of every instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MemMode {
    /// The kernel default: a page goes to the node of the thread that first touches it.
    FirstTouch,
    /// Pages round-robin over every allowed node with memory (seed 004's INT).
    Interleave,
    /// Pages only on the instance's own nodes with memory (seed 004's MEM / membind).
    Bind,
}

impl Design {
    pub fn name(self) -> &'static str {
        match self {
            Design::Wim => "wim",
            Design::Win => "win",
            Design::Wic => "wic",
            Design::Spmwin => "spmwin",
        }
    }
    /// The memory policy when `--mem` is not given: seed 004's best for the design.
    pub fn default_mem(self) -> MemMode {
        match self {
            Design::Wim => MemMode::FirstTouch,
            _ => MemMode::Bind,
        }
    }
}

/// One instance: where it runs and the `loci run` placement that puts it there.
#[derive(Debug, Clone)]
pub struct Instance {
    pub index: usize,
    /// Its cpus (the plan's footprint; every allowed cpu for `wim`).
    pub cpus: CpuSet,
    /// The nodes of its cpus.
    pub nodes: NodeSet,
    /// `--threads` and `-n` for `loci run` (`None`: every cpu the strategy may use).
    pub strategy: Strategy,
    pub nthreads: Option<usize>,
    /// `--mem` for `loci run`.
    pub mem: MemPolicy,
    pub plan: Plan,
    /// The network device assigned to it and that device's node.
    pub nic: Option<(String, Option<u32>)>,
}

/// Every instance of a deployment, and what was handled on the way (said once).
#[derive(Debug, Clone)]
pub struct Deployment {
    pub design: Design,
    pub instances: Vec<Instance>,
    pub notes: Vec<String>,
}

/// Layout options besides the design.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub instances: Option<usize>,
    pub mem: Option<MemMode>,
    pub nics: Option<Vec<String>>,
}

/// A physical core: its allowed cpus.
struct Core {
    cpus: CpuSet,
}

/// Allowed cores grouped by node (node order, then core order).
fn cores_by_node(topo: &Topology) -> BTreeMap<u32, Vec<Core>> {
    let allowed = topo.allowed_cpus();
    let mut by_core: BTreeMap<(u32, u32), CpuSet> = BTreeMap::new();
    for c in topo.cpus.iter().filter(|c| allowed.contains(c.id)) {
        if let Some(n) = c.node {
            by_core.entry((n, c.core)).or_default().insert(c.id);
        }
    }
    let mut out: BTreeMap<u32, Vec<Core>> = BTreeMap::new();
    for ((node, _), cpus) in by_core {
        out.entry(node).or_default().push(Core { cpus });
    }
    out
}

/// The instances' cpu sets and nodes for a design, before memory and devices.
fn cpu_sets(
    topo: &Topology,
    design: Design,
    n: Option<usize>,
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<(Strategy, Option<usize>, CpuSet)>> {
    let cores = cores_by_node(topo);
    for node in &topo.nodes {
        if node.cpus.is_empty() {
            notes.push(format!(
                "node {} has no cpus: no instance runs there (its memory serves --mem interleave)",
                node.id
            ));
        } else if !cores.contains_key(&node.id) {
            notes.push(format!(
                "node {} has cpus {} but this process may use none of them: no instance runs there",
                node.id, node.cpus
            ));
        }
    }
    let ncores: usize = cores.values().map(Vec::len).sum();
    if ncores == 0 {
        bail!("no allowed cpu on this machine: nothing can be deployed");
    }
    let nodes: Vec<u32> = cores.keys().copied().collect();
    let mut too_many = |max: usize, what: &str| -> anyhow::Result<usize> {
        match n {
            None => Ok(max),
            Some(0) => bail!("--instances 0: at least one instance"),
            Some(k) if k > max => bail!(
                "--instances {k}: {} has {what}, and this machine has {max}; valid: 1-{max}",
                design.name()
            ),
            Some(k) => {
                if k < max {
                    notes.push(format!(
                        "--instances {k}: {} instances of {max} possible; the first {k} are used",
                        design.name()
                    ));
                }
                Ok(k)
            }
        }
    };
    let parse = |s: String| -> anyhow::Result<Strategy> {
        s.parse()
            .map_err(|e| anyhow::anyhow!("internal strategy `{s}`: {e}"))
    };
    Ok(match design {
        Design::Wim => {
            if let Some(k) = n.filter(|&k| k != 1) {
                bail!("--instances {k}: wim is one instance for the whole machine; valid: 1 (for one per node use --design win, per core wic)");
            }
            vec![(Strategy::os(), None, topo.allowed_cpus())]
        }
        Design::Win => {
            let k = too_many(nodes.len(), "one instance per node with cpus")?;
            nodes[..k]
                .iter()
                .map(|&id| {
                    Ok((
                        parse(format!("nodes:{id}"))?,
                        Some(1),
                        topo.allowed_cpus_of(id),
                    ))
                })
                .collect::<anyhow::Result<_>>()?
        }
        Design::Wic => {
            let k = too_many(ncores, "one instance per core")?;
            cores
                .values()
                .flatten()
                .take(k)
                .map(|c| {
                    // The core's own cpus as the pool: thread 0 widened @core gets all of them.
                    let s = parse(format!("cpus:{}@core", c.cpus))?;
                    Ok((s, Some(1), c.cpus.clone()))
                })
                .collect::<anyhow::Result<_>>()?
        }
        Design::Spmwin => {
            let k = n.unwrap_or(nodes.len());
            if k == 0 || k > ncores {
                bail!("--instances {k}: spmwin needs at least one core per instance; valid: 1-{ncores}");
            }
            spread(&cores, k)
                .into_iter()
                .map(|set| {
                    // One plan thread per hardware thread (cpus:LIST), as `loci run` pins them.
                    let cpus = set.iter().fold(CpuSet::new(), |a, c| a.union(&c.cpus));
                    Ok((parse(format!("cpus:{cpus}"))?, Some(cpus.len()), cpus))
                })
                .collect::<anyhow::Result<_>>()?
        }
    })
}

/// SPMWIN: `k` instances of `ncores / k` cores each; instance `i`'s `j`-th core comes from node
/// `(i + j) mod nodes` (the next node with a core left when that one has none).
fn spread(cores: &BTreeMap<u32, Vec<Core>>, k: usize) -> Vec<Vec<&Core>> {
    let mut queues: Vec<std::collections::VecDeque<&Core>> =
        cores.values().map(|v| v.iter().collect()).collect();
    let per = queues.iter().map(|q| q.len()).sum::<usize>() / k;
    let mut out: Vec<Vec<&Core>> = vec![Vec::new(); k];
    for j in 0..per {
        for (i, inst) in out.iter_mut().enumerate() {
            let m = queues.len();
            let q = (0..m)
                .map(|d| (i + j + d) % m)
                .find(|&q| !queues[q].is_empty())
                .expect("per * k cores exist");
            inst.push(queues[q].pop_front().expect("not empty"));
        }
    }
    out
}

/// The memory policy of an instance on `nodes`; memory-less nodes are said in `notes`.
fn memory(
    topo: &Topology,
    mode: MemMode,
    index: usize,
    nodes: &NodeSet,
    notes: &mut Vec<String>,
) -> anyhow::Result<MemPolicy> {
    let mems = topo.allowed_mems();
    let memless = nodes.difference(&mems);
    Ok(match mode {
        MemMode::FirstTouch => {
            if !memless.is_empty() {
                notes.push(format!("instance {index}: node {memless} has no memory: its first touches fall back to the kernel's nearest node"));
            }
            MemPolicy::FirstTouch
        }
        MemMode::Interleave => MemPolicy::Interleave(None),
        MemMode::Bind => {
            let mut own = nodes.intersection(&mems);
            if own.is_empty() {
                let from = nodes.first().expect("an instance has a node");
                let near = mems
                    .iter()
                    .min_by_key(|&m| (topo.distance(from, m).unwrap_or(u32::MAX), m))
                    .ok_or_else(|| {
                        anyhow::anyhow!("--mem bind: no allowed node has memory on this machine")
                    })?;
                notes.push(format!(
                    "instance {index}: node {memless} has no memory: its memory is bound to node {near}, the nearest with memory"
                ));
                own.insert(near);
            }
            MemPolicy::Bind(own.to_string())
        }
    })
}

/// The network devices to deal (the topology's, or those `--nics` names, in that order).
fn nics(topo: &Topology, names: Option<&[String]>) -> anyhow::Result<Vec<(String, Option<u32>)>> {
    let all: Vec<(String, Option<u32>)> = topo
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Net)
        .map(|d| (d.name.clone(), d.node))
        .collect();
    let Some(names) = names else {
        return Ok(all);
    };
    names
        .iter()
        .map(|want| {
            all.iter().find(|(n, _)| n == want).cloned().ok_or_else(|| {
                let present: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
                anyhow::anyhow!(
                    "--nics {want}: no such network device in the topology; present: {}",
                    if present.is_empty() {
                        "none".to_string()
                    } else {
                        present.join(", ")
                    }
                )
            })
        })
        .collect()
}

/// Lays out `design` on `topo`: every instance's cpus, memory policy, device and plan. Errors
/// (an impossible instance count, no cpu, a device that is not there) come before anything runs.
pub fn layout(topo: &Topology, design: Design, o: &Options) -> anyhow::Result<Deployment> {
    let mut notes = Vec::new();
    let sets = cpu_sets(topo, design, o.instances, &mut notes)?;
    let devices = nics(topo, o.nics.as_deref())?;
    let mode = o.mem.unwrap_or(design.default_mem());
    let mut uses = vec![0usize; devices.len()];
    let mut instances = Vec::new();
    for (index, (strategy, nthreads, cpus)) in sets.into_iter().enumerate() {
        let nodes: NodeSet = cpus.iter().filter_map(|c| topo.node_of_cpu(c)).collect();
        let mem = memory(topo, mode, index, &nodes, &mut notes)?;
        let n = match nthreads {
            Some(n) => n,
            None => crate::plan_cmd::default_threads(topo, &strategy)?,
        };
        let plan = Plan::new(topo, &strategy, n, &mem, false)
            .map_err(|e| anyhow::anyhow!("instance {index}: {e}"))?;
        notes.extend(plan.notes.iter().cloned());
        // The nearest device by SLIT distance from the instance's first node, then the least used.
        let home = nodes.first();
        let nic = (0..devices.len())
            .min_by_key(|&d| {
                let dist = match (home, devices[d].1) {
                    (Some(a), Some(b)) => topo.distance(a, b).unwrap_or(u32::MAX),
                    _ => u32::MAX,
                };
                (dist, uses[d], d)
            })
            .map(|d| {
                uses[d] += 1;
                devices[d].clone()
            });
        instances.push(Instance {
            index,
            cpus: if plan.pinned { plan.footprint() } else { cpus },
            nodes,
            strategy,
            nthreads,
            mem,
            plan,
            nic,
        });
    }
    for (name, _) in devices.iter().filter(|d| d.1.is_none()) {
        notes.push(format!(
            "network device {name} has no node (the kernel says -1): it is dealt as far from every instance"
        ));
    }
    let mut seen = std::collections::HashSet::new();
    notes.retain(|n| seen.insert(n.clone()));
    Ok(Deployment {
        design,
        instances,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(spec: &str) -> Topology {
        loci_topo::load(&loci_topo::Source::Synthetic(spec.into())).unwrap()
    }

    fn sets(l: &Deployment) -> Vec<String> {
        l.instances.iter().map(|i| i.cpus.to_string()).collect()
    }

    #[test]
    fn designs_on_two_nodes() {
        let t = topo("nodes=2,cores=4");
        let o = Options::default();
        let win = layout(&t, Design::Win, &o).unwrap();
        assert_eq!(sets(&win), ["0-3", "4-7"]);
        assert_eq!(win.instances[1].mem, MemPolicy::Bind("1".into()));
        assert_eq!(win.instances[1].strategy.to_string(), "nodes:1");
        let wim = layout(&t, Design::Wim, &o).unwrap();
        assert_eq!(sets(&wim), ["0-7"]);
        assert!(!wim.instances[0].plan.pinned);
        assert_eq!(wim.instances[0].mem, MemPolicy::FirstTouch);
        let wic = layout(&t, Design::Wic, &o).unwrap();
        assert_eq!(wic.instances.len(), 8);
        assert_eq!(wic.instances[5].cpus.to_string(), "5");
        let sp = layout(&t, Design::Spmwin, &o).unwrap();
        // Core j of instance i from node (i + j) mod 2: two cores from each node.
        assert_eq!(sets(&sp), ["0,2,5,7", "1,3-4,6"]);
        assert_eq!(sp.instances[0].mem, MemPolicy::Bind("0-1".into()));
        assert_eq!(sp.instances[0].nthreads, Some(4));
    }

    #[test]
    fn wic_takes_whole_cores_with_smt() {
        let t = topo("nodes=2,cores=2,smt=2");
        let wic = layout(&t, Design::Wic, &Options::default()).unwrap();
        assert_eq!(wic.instances.len(), 4);
        for i in &wic.instances {
            assert_eq!(i.cpus.len(), 2, "{}", i.cpus);
            assert_eq!(i.plan.threads[0].cpus, i.cpus);
            assert_eq!(i.strategy.to_string(), format!("cpus:{}@core", i.cpus));
        }
    }

    #[test]
    fn cpuless_and_memless_nodes_are_handled_and_said() {
        let t = topo("nodes=4,cores=2,cpuless=3,memless=2");
        let l = layout(&t, Design::Win, &Options::default()).unwrap();
        assert_eq!(l.instances.len(), 3);
        assert!(
            l.notes.iter().any(|n| n.contains("node 3 has no cpus")),
            "{:?}",
            l.notes
        );
        let on2 = &l.instances[2];
        assert_eq!(on2.nodes.to_string(), "2");
        let MemPolicy::Bind(b) = &on2.mem else {
            panic!("{:?}", on2.mem)
        };
        assert_ne!(b, "2");
        assert!(
            l.notes.iter().any(|n| n.contains("node 2 has no memory")),
            "{:?}",
            l.notes
        );
    }

    #[test]
    fn impossible_counts_are_errors_naming_the_range() {
        let t = topo("nodes=2,cores=2");
        let e = |d, n| {
            layout(
                &t,
                d,
                &Options {
                    instances: Some(n),
                    ..Default::default()
                },
            )
            .unwrap_err()
            .to_string()
        };
        assert!(
            e(Design::Win, 3).contains("valid: 1-2"),
            "{}",
            e(Design::Win, 3)
        );
        assert!(e(Design::Wic, 5).contains("valid: 1-4"));
        assert!(e(Design::Wim, 2).contains("valid: 1"));
        assert!(e(Design::Spmwin, 5).contains("valid: 1-4"));
        assert!(e(Design::Win, 0).contains("at least one"));
        let l = layout(
            &t,
            Design::Win,
            &Options {
                instances: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(l.instances.len(), 1);
        assert!(l.notes.iter().any(|n| n.contains("first 1")));
    }

    #[test]
    fn nics_go_to_the_nearest_instance() {
        let mut t = topo("nodes=4,cores=1");
        for (name, node) in [("eth0", Some(0)), ("eth2", Some(2)), ("usb0", None)] {
            t.devices.push(loci_topo::Device {
                name: name.into(),
                kind: DeviceKind::Net,
                node,
            });
        }
        let l = layout(&t, Design::Win, &Options::default()).unwrap();
        let got: Vec<_> = l
            .instances
            .iter()
            .map(|i| i.nic.clone().unwrap().0)
            .collect();
        // Equal remote distances: the least used device breaks the tie.
        assert_eq!(got, ["eth0", "eth2", "eth2", "eth0"]);
        assert!(l.notes.iter().any(|n| n.contains("usb0")));
        let o = Options {
            nics: Some(vec!["usb0".into()]),
            ..Default::default()
        };
        let l = layout(&t, Design::Win, &o).unwrap();
        assert!(l
            .instances
            .iter()
            .all(|i| i.nic == Some(("usb0".into(), None))));
        let o = Options {
            nics: Some(vec!["eth9".into()]),
            ..Default::default()
        };
        let e = layout(&t, Design::Win, &o).unwrap_err().to_string();
        assert!(e.contains("eth9") && e.contains("eth0, eth2, usb0"), "{e}");
    }
}
