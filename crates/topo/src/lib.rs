//! loci-topo: the machine as a value.
//!
//! See [`model`] for the glossary and types, [`idset`] for the cpu/node list syntax, [`source`]
//! for where a topology comes from ([`load`] is the one entry point), [`error`] for why loading
//! failed.

pub mod error;
pub mod idset;
pub mod json;
pub mod model;
pub mod preset;
pub mod source;
pub mod synthetic;
pub mod sysfs;
pub mod xml;

pub use error::TopoError;
pub use idset::{CpuSet, IdSet, ListError, NodeSet};
pub use json::TopologyJson;
pub use model::{
    Cache, CacheKind, CoreGroup, Cpu, Device, DeviceKind, ModelError, Node, NodeKind, Topology,
};
pub use source::{load, Source, SourceSyntaxError};
