//! Topology for `loci plan` and `loci run` until the shared topology-source flags (`TopoArgs`)
//! are available to them: this machine only.

use clap::Args;

/// Which machine to plan for: this one.
#[derive(Args, Clone, Debug, Default)]
pub struct TopoArgs {}

impl TopoArgs {
    /// This machine's topology.
    pub fn load(&self) -> anyhow::Result<loci_topo::Topology> {
        crate::this_machine()
    }
}
