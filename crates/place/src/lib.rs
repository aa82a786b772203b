//! loci-place: where threads run and where memory lives.
//!
//! - [`strategy`]: thread strategies (`compact`, `sparse`, `shared:G`, ...) -> one cpu set per thread;
//! - [`policy`]: memory policies (`interleave`, `bind:NODES`, ...) checked against a topology;
//! - [`plan`]: both together, printable and diffable, with the stable plan JSON;
//! - [`apply`]: bind the calling thread, the whole process, or a child before `exec`; apply a
//!   memory plan to an address range;
//! - [`pinenv`]: the contract with the pin library that places threads of unmodified programs;
//! - [`region`]: the one node-bound memory region: an anonymous mapping with a memory plan applied
//!   before its first touch;
//! - [`verify`]: read back affinity, last cpu and pages per node from `/proc`, compare with the plan;
//! - [`knobs`]: AutoNUMA and transparent huge pages;
//! - [`sys`]: the checked syscalls underneath.

pub mod apply;
pub mod knobs;
pub mod pinenv;
pub mod plan;
pub mod policy;
pub mod region;
pub mod strategy;
pub mod sys;
pub mod testing;
pub mod verify;

pub use plan::{Plan, PlanError, PlanJson, RegionPlan, ThreadPlan};
pub use policy::{MemPlan, MemPolicy, PartOrder};
pub use region::NodeRegion;
pub use strategy::{Bind, Strategy};
