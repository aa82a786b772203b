//! A plan: the concrete answer to "where does thread i run, where does its memory go".
//!
//! Printable (one line per thread) and diffable (the JSON form is stable and sorted by thread).
//! JSON schema (kept stable, documented in docs/plans.md):
//!
//! ```json
//! {"threads": [{"index": 0, "cpus": "0", "nodes": "0"}], "memory": {"policy": "interleave", "nodes": "0-3"}}
//! ```
//! `cpus` and `nodes` use the Linux list syntax; `memory.nodes` is `""` for `first-touch` and
//! `localalloc`. A plan with named regions ([`Plan::with_region`]) adds
//! `"regions": [{"name": "table", "policy": "per-node", "nodes": "0-3"}]` (absent when none).

use std::fmt;

use loci_topo::{CpuSet, NodeSet, Topology};
use serde::{Deserialize, Serialize};

use crate::policy::{MemPlan, MemPolicy};
use crate::strategy::{place_threads, Strategy};

/// One thread of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadPlan {
    pub index: usize,
    pub cpus: CpuSet,
    pub nodes: NodeSet,
}

/// Memory part of the plan JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryJson {
    pub policy: String,
    pub nodes: NodeSet,
}

/// One named region in the plan JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionJson {
    pub name: String,
    #[serde(flatten)]
    pub memory: MemoryJson,
}

/// The plan JSON document (exactly the documented schema).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanJson {
    pub threads: Vec<ThreadPlan>,
    pub memory: MemoryJson,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<RegionJson>,
}

impl From<&MemPlan> for MemoryJson {
    fn from(m: &MemPlan) -> Self {
        MemoryJson {
            policy: m.policy.to_string(),
            nodes: m.nodes.clone(),
        }
    }
}

/// The memory plan of one named region a runtime maps (a table, an array's chunks, a stage's
/// buffers): the resolved policy its pages get before their first touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionPlan {
    pub name: String,
    pub memory: MemPlan,
}

impl RegionPlan {
    /// Resolves `policy` for the region `name` on `topo` (any policy, `per-node` and
    /// `round-robin` included). Returns the notes to print once.
    pub fn resolve(
        topo: &Topology,
        name: &str,
        policy: &MemPolicy,
    ) -> Result<(RegionPlan, Vec<String>), crate::policy::PolicyError> {
        let (memory, notes) = policy.resolve(topo)?;
        Ok((
            RegionPlan {
                name: name.to_string(),
                memory,
            },
            notes,
        ))
    }
}

/// A full plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The strategy it came from.
    pub strategy: Strategy,
    /// Whether threads are pinned (false for `os`: the sets then only say where they may run).
    pub pinned: bool,
    pub threads: Vec<ThreadPlan>,
    pub memory: MemPlan,
    /// Memory plans of named regions (see [`Plan::with_region`]); others follow `memory`.
    pub regions: Vec<RegionPlan>,
    /// Things said once to the user: policies applied as something else, groups spanning LLCs.
    pub notes: Vec<String>,
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("--threads: {0}")]
    Strategy(crate::strategy::StrategyError),
    #[error("--mem: {0}")]
    Policy(crate::policy::PolicyError),
}

// Written out rather than `#[from]`, which would also make the inner error the `source` and
// print its message twice in error chains.
impl From<crate::strategy::StrategyError> for PlanError {
    fn from(e: crate::strategy::StrategyError) -> Self {
        PlanError::Strategy(e)
    }
}
impl From<crate::policy::PolicyError> for PlanError {
    fn from(e: crate::policy::PolicyError) -> Self {
        PlanError::Policy(e)
    }
}

/// Resolves the threads' memory policy: any policy but the per-part ones, which place the parts
/// of a region and have no meaning for a thread.
fn thread_memory(
    topo: &Topology,
    mem: &MemPolicy,
) -> Result<(MemPlan, Vec<String>), crate::policy::PolicyError> {
    if mem.is_per_part() {
        return Err(crate::policy::PolicyError(format!(
            "{mem} places the parts of a region (engine morsels, array chunks), not a thread's memory; for threads use bind:NODES or interleave[:NODES]"
        )));
    }
    mem.resolve(topo)
}

impl Plan {
    /// Plans `n` threads with `strategy` and the memory policy `mem` on `topo`.
    pub fn new(
        topo: &Topology,
        strategy: &Strategy,
        n: usize,
        mem: &MemPolicy,
        oversubscribe: bool,
    ) -> Result<Plan, PlanError> {
        let (places, mut notes) = place_threads(topo, strategy, n, oversubscribe)?;
        let (memory, mnotes) = thread_memory(topo, mem)?;
        notes.extend(mnotes);
        Ok(Plan {
            strategy: strategy.clone(),
            pinned: strategy.pins(),
            threads: places
                .into_iter()
                .enumerate()
                .map(|(index, p)| ThreadPlan {
                    index,
                    cpus: p.cpus,
                    nodes: p.nodes,
                })
                .collect(),
            memory,
            regions: Vec::new(),
            notes,
        })
    }

    /// This plan with the region `name` placed by `policy` (replacing an earlier plan of that
    /// name); its notes join the plan's.
    pub fn with_region(
        mut self,
        topo: &Topology,
        name: &str,
        policy: &MemPolicy,
    ) -> Result<Plan, PlanError> {
        let (r, notes) = RegionPlan::resolve(topo, name, policy)?;
        self.notes.extend(notes);
        self.regions.retain(|x| x.name != name);
        self.regions.push(r);
        Ok(self)
    }

    /// The memory plan of the region `name`: its own, or the threads' (`memory`) when the plan
    /// names none for it.
    pub fn region(&self, name: &str) -> &MemPlan {
        self.regions
            .iter()
            .find(|r| r.name == name)
            .map_or(&self.memory, |r| &r.memory)
    }

    /// Every cpu any thread of the plan may use.
    pub fn footprint(&self) -> CpuSet {
        self.threads
            .iter()
            .fold(CpuSet::new(), |a, t| a.union(&t.cpus))
    }

    /// Every node any thread of the plan runs on.
    pub fn thread_nodes(&self) -> NodeSet {
        self.threads
            .iter()
            .fold(NodeSet::new(), |a, t| a.union(&t.nodes))
    }

    /// The nodes where the plan expects memory: the policy's nodes, or for first-touch and
    /// localalloc the nodes the threads run on. Pages elsewhere count as remote in `verify`.
    pub fn expected_mem_nodes(&self) -> NodeSet {
        if self.memory.nodes.is_empty() {
            self.thread_nodes()
        } else {
            self.memory.nodes.clone()
        }
    }

    /// The JSON document of the documented schema.
    pub fn to_json(&self) -> PlanJson {
        PlanJson {
            threads: self.threads.clone(),
            memory: (&self.memory).into(),
            regions: self
                .regions
                .iter()
                .map(|r| RegionJson {
                    name: r.name.clone(),
                    memory: (&r.memory).into(),
                })
                .collect(),
        }
    }
}

impl fmt::Display for Plan {
    /// One line per thread, then the memory policy; stable, so two plans can be diffed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "strategy {}{}, {} threads",
            self.strategy,
            if self.pinned { "" } else { " (not pinned)" },
            self.threads.len()
        )?;
        let w = self
            .threads
            .iter()
            .map(|t| t.cpus.to_string().len())
            .max()
            .unwrap_or(4)
            .max(4);
        writeln!(f, "{:>6}  {:<w$}  nodes", "thread", "cpus")?;
        for t in &self.threads {
            writeln!(f, "{:>6}  {:<w$}  {}", t.index, t.cpus.to_string(), t.nodes)?;
        }
        write!(f, "memory {}", self.memory)?;
        for r in &self.regions {
            write!(f, "\nregion {} {}", r.name, r.memory)?;
        }
        Ok(())
    }
}

impl Plan {
    /// A plan whose thread `i` is bound to exactly `cpus[i]`, for a runtime that chose every
    /// thread's cpus itself (loci-stream's seed-001 rules, a config file's per-thread lists).
    /// Sets may repeat (threads sharing cpus). The strategy is recorded as `cpus:` over their
    /// union. Every cpu must be present and allowed in `topo`; errors name the thread.
    pub fn from_cpu_sets(
        topo: &Topology,
        cpus: Vec<CpuSet>,
        mem: &MemPolicy,
    ) -> Result<Plan, PlanError> {
        use crate::strategy::{Kind, StrategyError};
        if cpus.is_empty() {
            return Err(StrategyError::Placement(
                "the number of threads must be at least 1".into(),
            )
            .into());
        }
        let (present, allowed) = (topo.cpu_ids(), topo.allowed_cpus());
        for (i, set) in cpus.iter().enumerate() {
            let bad = |m: String| StrategyError::Placement(format!("thread {i}: {m}"));
            if set.is_empty() {
                return Err(bad("empty cpu set".into()).into());
            }
            if let Some(c) = set.iter().find(|c| !present.contains(*c)) {
                return Err(bad(format!(
                    "cpu {c} is not present on this machine (present cpus: {present})"
                ))
                .into());
            }
            let not_allowed = set.difference(&allowed);
            if !not_allowed.is_empty() {
                return Err(bad(format!(
                    "cpus {not_allowed} are not allowed for this process (allowed cpus: {allowed})"
                ))
                .into());
            }
        }
        let (memory, notes) = thread_memory(topo, mem)?;
        let threads: Vec<ThreadPlan> = cpus
            .into_iter()
            .enumerate()
            .map(|(index, cpus)| ThreadPlan {
                index,
                nodes: cpus.iter().filter_map(|c| topo.node_of_cpu(c)).collect(),
                cpus,
            })
            .collect();
        let union = threads.iter().fold(CpuSet::new(), |a, t| a.union(&t.cpus));
        Ok(Plan {
            strategy: Strategy {
                kind: Kind::Cpus(union.to_string()),
                bind: None,
            },
            pinned: true,
            threads,
            memory,
            regions: Vec::new(),
            notes,
        })
    }
}

#[cfg(test)]
mod region_tests {
    use super::*;
    use crate::testing::regular;

    #[test]
    fn regions_carry_their_own_policies_and_threads_refuse_per_part_ones() {
        let topo = regular(2, 2, 1, 1);
        let s = Strategy::compact();
        let ft = MemPolicy::FirstTouch;
        let plan = Plan::new(&topo, &s, 2, &ft, false)
            .unwrap()
            .with_region(&topo, "table", &"per-node".parse().unwrap())
            .unwrap()
            .with_region(&topo, "hash", &"interleave".parse().unwrap())
            .unwrap();
        assert_eq!(plan.region("table").to_string(), "per-node:0-1");
        assert_eq!(plan.region("hash").to_string(), "interleave:0-1");
        assert_eq!(
            plan.region("other"),
            &plan.memory,
            "unnamed: the threads' policy"
        );
        assert!(plan
            .to_string()
            .ends_with("region table per-node:0-1\nregion hash interleave:0-1"));
        let json = serde_json::to_string(&plan.to_json()).unwrap();
        assert!(
            json.contains(r#""regions":[{"name":"table","policy":"per-node","nodes":"0-1"}"#),
            "{json}"
        );
        let back: PlanJson = serde_json::from_str(&json).unwrap();
        assert_eq!(back, plan.to_json());
        // Without regions the JSON is the documented schema, unchanged.
        let bare = Plan::new(&topo, &s, 1, &ft, false).unwrap().to_json();
        assert!(!serde_json::to_string(&bare).unwrap().contains("regions"));
        // A region replaces its earlier plan; a bad region policy is named.
        let again = plan
            .clone()
            .with_region(&topo, "table", &"bind:1".parse().unwrap())
            .unwrap();
        assert_eq!(again.regions.len(), 2);
        assert_eq!(again.region("table").to_string(), "bind:1");
        let e = plan
            .with_region(&topo, "t", &"per-node:4".parse().unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("node 4"), "{e}");
        let e = Plan::new(&topo, &s, 1, &"per-node".parse().unwrap(), false).unwrap_err();
        assert!(e.to_string().contains("not a thread's memory"), "{e}");
    }
}

#[cfg(test)]
mod from_cpu_sets_tests {
    use super::*;

    #[test]
    fn threads_get_their_sets_in_order_and_bad_cpus_name_the_thread() {
        let t = crate::testing::regular(2, 2, 1, 1);
        let set = |s: &str| CpuSet::parse(s).unwrap();
        let p = Plan::from_cpu_sets(
            &t,
            vec![set("3"), set("0"), set("3"), set("1-2")],
            &MemPolicy::Local,
        )
        .unwrap();
        let got: Vec<String> = p.threads.iter().map(|t| t.cpus.to_string()).collect();
        assert_eq!(got, ["3", "0", "3", "1-2"]);
        let nodes: Vec<String> = p.threads.iter().map(|t| t.nodes.to_string()).collect();
        assert_eq!(nodes, ["1", "0", "1", "0-1"]);
        assert!(p.pinned && p.memory.policy == "localalloc");
        assert_eq!(p.strategy.to_string(), "cpus:0-3");
        let e = Plan::from_cpu_sets(&t, vec![set("0"), set("9")], &MemPolicy::FirstTouch)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("thread 1") && e.contains("cpu 9") && e.contains("0-3"),
            "{e}"
        );
        assert!(Plan::from_cpu_sets(&t, vec![], &MemPolicy::FirstTouch).is_err());
    }
}
