//! The shape of a scheduler: core groups, workers, and for each worker the orders in which it
//! looks at the other queues. Computed once from a [`Topology`]; pure data, no threads.

use std::ops::Range;

use loci_topo::{CacheKind, CpuSet, Topology};

use crate::SchedError;

/// One core group: the cpus that share a cache of the chosen level inside one node, served by one
/// worker pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The node the group belongs to (kernel id).
    pub node: u32,
    /// Its cpus (allowed and online ones only); the pool's affinity.
    pub cpus: CpuSet,
    /// The workers of the pool (indices into [`WorkerLayout::workers`]), one per cpu.
    pub workers: Range<usize>,
    /// Groups to wake for a deferred spawn here: this group first, then the others by increasing
    /// NUMA distance.
    pub wake_deferred: Vec<usize>,
    /// Groups to wake for an immediate spawn here: this group first, then the other groups of the
    /// same node (immediate tasks never leave their node).
    pub wake_immediate: Vec<usize>,
}

/// One worker and the orders it scans the other queues in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSlot {
    /// Its core group (index into [`WorkerLayout::groups`]).
    pub group: usize,
    /// Its node (kernel id).
    pub node: u32,
    /// The cpu it stands for (the one it is pinned to with [`crate::Affinity::Cpu`]).
    pub cpu: u32,
    /// Rule 2: the other workers of the group, by increasing cache distance.
    pub same_group: Vec<usize>,
    /// Rule 4: the other groups, by increasing NUMA distance (groups of the same node first).
    pub other_groups: Vec<usize>,
    /// Rule 5: the workers of the other groups of the same node, in a fixed order (scanned round
    /// robin).
    pub same_node: Vec<usize>,
    /// NLS: every other worker, starting after this one.
    pub others: Vec<usize>,
}

/// Groups and workers of a scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLayout {
    /// The cache level the groups were formed at (`None`: the topology knows no caches; each
    /// core is then its own group).
    pub cache_level: Option<u8>,
    pub groups: Vec<Group>,
    pub workers: Vec<WorkerSlot>,
    /// Nodes that have at least one group, sorted; per-node counters use this order.
    pub nodes: Vec<u32>,
    /// Node index (into `nodes`) of each cpu id, `u32::MAX` for cpus outside the layout.
    pub cpu_node: Vec<u32>,
    /// SLIT distance between node indices.
    pub distances: Vec<Vec<u32>>,
}

/// The lowest cache level two cpus share (seed 003's cache distance); 0 for the same cpu and
/// `None` (infinite) when they share no cache.
pub fn cache_distance(topo: &Topology, a: u32, b: u32) -> Option<u8> {
    if a == b {
        return Some(0);
    }
    topo.caches
        .iter()
        .filter(|c| c.kind != CacheKind::Instruction && c.cpus.contains(a) && c.cpus.contains(b))
        .map(|c| c.level)
        .min()
}

impl WorkerLayout {
    /// Groups at `cache_level` (the last-level cache when `None`) of the allowed, online cpus.
    pub fn new(topo: &Topology, cache_level: Option<u8>) -> Result<WorkerLayout, SchedError> {
        WorkerLayout::within(topo, cache_level, &topo.allowed_cpus())
    }

    /// [`WorkerLayout::new`] over `cpus` only (a plan's footprint): one worker per cpu of `cpus`,
    /// grouped as the topology groups them. Every cpu must be allowed and online.
    pub fn within(
        topo: &Topology,
        cache_level: Option<u8>,
        cpus: &loci_topo::CpuSet,
    ) -> Result<WorkerLayout, SchedError> {
        let allowed = topo.allowed_cpus();
        let outside = cpus.difference(&allowed);
        if !outside.is_empty() {
            return Err(SchedError::Plan(format!(
                "cpus {outside} are not allowed or not online here (allowed: {allowed})"
            )));
        }
        let mut levels: Vec<u8> = topo.caches.iter().map(|c| c.level).collect();
        levels.sort_unstable();
        levels.dedup();
        let level = match cache_level {
            Some(l) if !levels.contains(&l) => {
                return Err(SchedError::CacheLevel {
                    level: l,
                    valid: levels
                        .iter()
                        .map(|l| format!("L{l}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
            Some(l) => Some(l),
            None => topo.llc_level(),
        };
        let raw = topo.core_groups(level.unwrap_or(0));
        let mut groups: Vec<Group> = Vec::new();
        let mut workers: Vec<WorkerSlot> = Vec::new();
        for g in raw {
            let cpus = g.cpus.intersection(cpus);
            if cpus.is_empty() {
                continue;
            }
            let gi = groups.len();
            let first = workers.len();
            for cpu in cpus.iter() {
                workers.push(WorkerSlot {
                    group: gi,
                    node: g.node,
                    cpu,
                    same_group: vec![],
                    other_groups: vec![],
                    same_node: vec![],
                    others: vec![],
                });
            }
            groups.push(Group {
                node: g.node,
                cpus,
                workers: first..workers.len(),
                wake_deferred: vec![],
                wake_immediate: vec![],
            });
        }
        if workers.is_empty() {
            return Err(SchedError::NoCpus);
        }
        let mut nodes: Vec<u32> = groups.iter().map(|g| g.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let ni = |id: u32| nodes.iter().position(|&n| n == id).expect("node in layout");
        let distances: Vec<Vec<u32>> = nodes
            .iter()
            .map(|&a| {
                nodes
                    .iter()
                    .map(|&b| topo.distance(a, b).unwrap_or(if a == b { 10 } else { 20 }))
                    .collect()
            })
            .collect();
        let max_cpu = workers.iter().map(|w| w.cpu).max().unwrap_or(0) as usize;
        let mut cpu_node = vec![u32::MAX; max_cpu + 1];
        for w in &workers {
            cpu_node[w.cpu as usize] = ni(w.node) as u32;
        }

        let ng = groups.len();
        let nw = workers.len();
        // Groups by increasing NUMA distance from group `g`, ties broken by a rotation that starts
        // after `g`, so that groups at equal distance are not all drained in the same order.
        let gnode: Vec<usize> = groups.iter().map(|g| ni(g.node)).collect();
        let by_distance = |g: usize| -> Vec<usize> {
            let mut v: Vec<usize> = (0..ng).filter(|&o| o != g).collect();
            let dn = &distances[gnode[g]];
            v.sort_by_key(|&o| (dn[gnode[o]], (o + ng - g) % ng));
            v
        };
        for g in 0..ng {
            let others = by_distance(g);
            let mut wd = vec![g];
            wd.extend(&others);
            let mut wi = vec![g];
            wi.extend(others.iter().filter(|&&o| gnode[o] == gnode[g]));
            groups[g].wake_deferred = wd;
            groups[g].wake_immediate = wi;
        }
        for w in 0..nw {
            let g = workers[w].group;
            let range = groups[g].workers.clone();
            let len = range.len();
            let mut same: Vec<usize> = range.clone().filter(|&o| o != w).collect();
            same.sort_by_key(|&o| {
                (
                    cache_distance(topo, workers[w].cpu, workers[o].cpu).unwrap_or(u8::MAX),
                    (o + len - w) % len,
                )
            });
            let other_groups = by_distance(g);
            let same_node: Vec<usize> = other_groups
                .iter()
                .filter(|&&o| groups[o].node == groups[g].node)
                .flat_map(|&o| groups[o].workers.clone())
                .collect();
            let others: Vec<usize> = (1..nw).map(|k| (w + k) % nw).collect();
            let slot = &mut workers[w];
            slot.same_group = same;
            slot.other_groups = other_groups;
            slot.same_node = same_node;
            slot.others = others;
        }
        Ok(WorkerLayout {
            cache_level: level,
            groups,
            workers,
            nodes,
            cpu_node,
            distances,
        })
    }

    /// Index of a node id in [`WorkerLayout::nodes`].
    pub fn node_index(&self, node: u32) -> Option<usize> {
        self.nodes.iter().position(|&n| n == node)
    }

    /// Groups of one node.
    pub fn groups_of(&self, node: u32) -> impl Iterator<Item = usize> + '_ {
        (0..self.groups.len()).filter(move |&g| self.groups[g].node == node)
    }

    /// Groups of one node, or [`SchedError::UnknownNode`] naming the nodes there are when it has
    /// none.
    pub fn groups_of_known(&self, node: u32) -> Result<Vec<usize>, SchedError> {
        let gs: Vec<usize> = self.groups_of(node).collect();
        if gs.is_empty() {
            let valid: Vec<String> = self.nodes.iter().map(|n| n.to_string()).collect();
            return Err(SchedError::UnknownNode {
                node,
                valid: valid.join(","),
            });
        }
        Ok(gs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    /// A plan's cpus, and only they, become workers, grouped as the topology groups them; a plan
    /// naming cpus that are not here is refused with them named.
    #[test]
    fn a_plan_footprint_gives_the_workers() {
        let t = fixtures::grid(2, 2, 2); // 2 nodes x 2 groups x 2 cpus
        let plan = loci_place::Plan::new(
            &t,
            &"sparse".parse().unwrap(),
            3,
            &"first-touch".parse().unwrap(),
            false,
        )
        .unwrap();
        let l = WorkerLayout::within(&t, None, &plan.footprint()).unwrap();
        let cpus: loci_topo::CpuSet = l.workers.iter().map(|w| w.cpu).collect();
        assert_eq!(cpus, plan.footprint());
        assert_eq!(l.workers.len(), 3);
        // Sparse spreads over both nodes: both appear, each worker in its topology group.
        assert_eq!(l.nodes, vec![0, 1]);
        for w in &l.workers {
            assert!(l.groups[w.group].cpus.contains(w.cpu));
            assert_eq!(t.cpu(w.cpu).unwrap().node, Some(w.node));
        }
        let e = WorkerLayout::within(&t, None, &loci_topo::CpuSet::parse("2,99").unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("99") && e.contains("allowed: 0-7"), "{e}");
    }

    #[test]
    fn e7_groups_are_nodes_and_siblings_come_first() {
        let t = fixtures::xeon_e7_4820();
        let l = WorkerLayout::new(&t, None).unwrap();
        assert_eq!(l.cache_level, Some(3));
        assert_eq!(l.groups.len(), 4);
        assert!(l.groups.iter().all(|g| g.cpus.len() == 16));
        // Worker for cpu 0: its SMT sibling (cpu 32, shares L1) is scanned first.
        let w0 = l.workers.iter().position(|w| w.cpu == 0).unwrap();
        let first = l.same_group_first(w0);
        assert_eq!(l.workers[first].cpu, 32);
        assert_eq!(l.workers[w0].same_group.len(), 15);
        // One group per node: no rule-5 queues.
        assert!(l.workers[w0].same_node.is_empty());
        // Immediate spawns wake only the own group; deferred spawns all four.
        assert_eq!(l.groups[0].wake_immediate, vec![0]);
        assert_eq!(l.groups[0].wake_deferred.len(), 4);
    }

    #[test]
    fn e7_at_l2_gives_core_pairs() {
        let t = fixtures::xeon_e7_4820();
        let l = WorkerLayout::new(&t, Some(2)).unwrap();
        assert_eq!(l.groups.len(), 32);
        let w0 = l.workers.iter().position(|w| w.cpu == 0).unwrap();
        // Rule 5 covers the 14 workers of the other 7 groups of node 0.
        assert_eq!(l.workers[w0].same_node.len(), 14);
        assert!(l.workers[w0]
            .same_node
            .iter()
            .all(|&o| l.workers[o].node == 0 && l.workers[o].group != l.workers[w0].group));
        // Rule 4: the 7 groups of the own node come before the 24 remote ones.
        let og = &l.workers[w0].other_groups;
        assert_eq!(og.len(), 31);
        assert!(og[..7].iter().all(|&g| l.groups[g].node == 0));
        assert!(og[7..].iter().all(|&g| l.groups[g].node != 0));
    }

    #[test]
    fn bad_cache_level_names_valid_levels() {
        let t = fixtures::xeon_e5310();
        let e = WorkerLayout::new(&t, Some(3)).unwrap_err().to_string();
        assert!(e.contains("L3") && e.contains("L1, L2"), "{e}");
    }

    #[test]
    fn opteron_groups_by_distance() {
        let t = fixtures::opteron_8220();
        let hops = fixtures::twisted_ladder_hops();
        assert_eq!(hops.iter().flatten().max(), Some(&3), "diameter 3");
        let l = WorkerLayout::new(&t, None).unwrap();
        assert_eq!(l.groups.len(), 16, "no shared cache: one group per core");
        for w in 0..l.workers.len() {
            let me = l.node_index(l.workers[w].node).unwrap();
            let d: Vec<u32> = l.workers[w]
                .other_groups
                .iter()
                .map(|&g| l.distances[me][l.node_index(l.groups[g].node).unwrap()])
                .collect();
            assert!(d.windows(2).all(|p| p[0] <= p[1]), "{d:?}");
            // The other core of the own node first (distance 10), then 12, 14, 16.
            assert_eq!(d[0], 10);
        }
        // Node 1 to node 6 is three hops: 1-3-4-6.
        assert_eq!(l.distances[1][6], 16);
    }

    #[test]
    fn e5310_pairs_and_rule5_scan() {
        let t = fixtures::xeon_e5310();
        let l = WorkerLayout::new(&t, None).unwrap();
        assert_eq!(l.cache_level, Some(2));
        let cpus: Vec<String> = l.groups.iter().map(|g| g.cpus.to_string()).collect();
        assert_eq!(cpus, ["0,4", "1,5", "2,6", "3,7"]);
        // One node: rule 5 sees the 6 workers of the other groups; every wake order covers all.
        assert_eq!(l.workers[0].same_node.len(), 6);
        assert_eq!(l.groups[1].wake_immediate.len(), 4);
    }

    impl WorkerLayout {
        fn same_group_first(&self, w: usize) -> usize {
            self.workers[w].same_group[0]
        }
    }
}
