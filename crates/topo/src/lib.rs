//! loci-topo: the machine as a value.
//!
//! See [`model`] for the glossary and types, [`idset`] for the cpu/node list syntax.

pub mod idset;
pub mod model;

pub use idset::{CpuSet, IdSet, ListError, NodeSet};
pub use model::{Cache, CacheKind, CoreGroup, Cpu, Device, DeviceKind, ModelError, Node, Topology};
