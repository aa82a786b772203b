//! A plan: the concrete answer to "where does thread i run, where does its memory go".
//!
//! Printable (one line per thread) and diffable (the JSON form is stable and sorted by thread).
//! JSON schema (kept stable, documented in docs/plans.md):
//!
//! ```json
//! {"threads": [{"index": 0, "cpus": "0", "nodes": "0"}], "memory": {"policy": "interleave", "nodes": "0-3"}}
//! ```
//! `cpus` and `nodes` use the Linux list syntax; `memory.nodes` is `""` for `first-touch` and
//! `localalloc`.

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

/// The plan JSON document (exactly the documented schema).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanJson {
    pub threads: Vec<ThreadPlan>,
    pub memory: MemoryJson,
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
        let (memory, mnotes) = mem.resolve(topo)?;
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
            notes,
        })
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
            memory: MemoryJson {
                policy: self.memory.policy.to_string(),
                nodes: self.memory.nodes.clone(),
            },
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
        write!(f, "memory {}", self.memory)
    }
}
