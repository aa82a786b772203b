//! The stable JSON form of a topology (`loci topo --json`), documented in docs/topology.md:
//!
//! ```json
//! {"source": "sysfs:/",
//!  "nodes": [{"id": 0, "cpus": "0-1", "memory_bytes": 25160437760, "distances": [10],
//!             "free_bytes": 1234, "allowed": true}],
//!  "cpus": [{"id": 0, "core": 0, "package": 0, "node": 0, "allowed": true, "online": true}],
//!  "caches": [{"level": 2, "kind": "unified", "size_bytes": 1048576, "cpus": "0"}],
//!  "devices": [{"name": "eth0", "kind": "net", "node": 0}]}
//! ```
//!
//! `distances` follows the order of `nodes`; cpu strings use the list syntax; a CPU-less node has
//! `"cpus": ""`. `memory_bytes`, `free_bytes` and a cpu's or device's `node` are `null` when the
//! source does not say. Beyond the core schema (`source`; node `id`, `cpus`, `memory_bytes`,
//! `distances`; cpu `id`, `core`, `package`, `node`, `allowed`; cache `level`, `kind`,
//! `size_bytes`, `cpus`; device `name`, `kind`, `node`) there are exactly these documented
//! extras: node `free_bytes`, `allowed`, `kind` (`dram`, `hbm`, `nvm`, `gpu`), `initiators` and
//! `merged` (node lists), cpu `online`, and the top-level `notes` (what the source repaired).
//! A document saved before `kind`, `initiators`, `merged` and `notes` existed still reads.

use serde::{Deserialize, Serialize};

use crate::idset::{CpuSet, NodeSet};
use crate::model::{Cache, Cpu, Device, ModelError, Node, NodeKind, Topology};

/// The keys of the JSON form, sorted: of the document, of a node, of a cpu and of a cache (what
/// docs/topology.md documents; the tests hold every writer to them).
pub const TOP_KEYS: [&str; 6] = ["caches", "cpus", "devices", "nodes", "notes", "source"];
pub const NODE_KEYS: [&str; 9] = [
    "allowed",
    "cpus",
    "distances",
    "free_bytes",
    "id",
    "initiators",
    "kind",
    "memory_bytes",
    "merged",
];
pub const CPU_KEYS: [&str; 6] = ["allowed", "core", "id", "node", "online", "package"];
pub const CACHE_KEYS: [&str; 4] = ["cpus", "kind", "level", "size_bytes"];

/// A node in the JSON form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsonNode {
    pub id: u32,
    pub cpus: CpuSet,
    pub memory_bytes: Option<u64>,
    /// Row of the distance matrix, in the order of `nodes`.
    pub distances: Vec<u32>,
    pub free_bytes: Option<u64>,
    pub allowed: bool,
    /// `dram`, `hbm`, `nvm` or `gpu`; documents saved before kinds existed read as `dram`.
    #[serde(default)]
    pub kind: NodeKind,
    #[serde(default)]
    pub initiators: NodeSet,
    #[serde(default)]
    pub merged: NodeSet,
}

/// The whole JSON document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyJson {
    pub source: String,
    pub nodes: Vec<JsonNode>,
    /// Cpus, caches and devices have the model's own form ([`CPU_KEYS`], [`CACHE_KEYS`]; device
    /// `name`, `kind`, `node`), which the tests hold to the documented keys.
    pub cpus: Vec<Cpu>,
    pub caches: Vec<Cache>,
    pub devices: Vec<Device>,
    /// What the source repaired or left out (see [`Topology::notes`]).
    #[serde(default)]
    pub notes: Vec<String>,
}

impl From<&Topology> for TopologyJson {
    fn from(t: &Topology) -> Self {
        TopologyJson {
            source: t.source.clone(),
            nodes: t
                .nodes
                .iter()
                .zip(&t.distances)
                .map(|(n, d)| JsonNode {
                    id: n.id,
                    cpus: n.cpus.clone(),
                    memory_bytes: n.memory_bytes,
                    distances: d.clone(),
                    free_bytes: n.free_bytes,
                    allowed: n.allowed,
                    kind: n.kind,
                    initiators: n.initiators.clone(),
                    merged: n.merged.clone(),
                })
                .collect(),
            cpus: t.cpus.clone(),
            caches: t.caches.clone(),
            devices: t.devices.clone(),
            notes: t.notes.clone(),
        }
    }
}

impl TopologyJson {
    /// Back to the model (so a saved `loci topo --json` can be planned against), validated.
    pub fn into_topology(self) -> Result<Topology, ModelError> {
        let t = Topology {
            source: self.source,
            distances: self.nodes.iter().map(|n| n.distances.clone()).collect(),
            nodes: self
                .nodes
                .into_iter()
                .map(|n| Node {
                    id: n.id,
                    cpus: n.cpus,
                    memory_bytes: n.memory_bytes,
                    free_bytes: n.free_bytes,
                    allowed: n.allowed,
                    kind: n.kind,
                    initiators: n.initiators,
                    merged: n.merged,
                })
                .collect(),
            cpus: self.cpus,
            caches: self.caches,
            devices: self.devices,
            notes: self.notes,
        };
        t.validate()?;
        Ok(t)
    }
}

impl Topology {
    /// The stable JSON form (see [`crate::json`]).
    pub fn to_json(&self) -> TopologyJson {
        TopologyJson::from(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DeviceKind;

    #[test]
    fn schema_fields_and_roundtrip() {
        let mut t = crate::synthetic::build("nodes=3,cores=2,cpuless=2,dist=10:20").unwrap();
        t.source = "synthetic:x".into();
        t.devices.push(Device {
            name: "eth0".into(),
            kind: DeviceKind::Net,
            node: Some(1),
        });
        let v = serde_json::to_value(t.to_json()).unwrap();
        assert_eq!(v["source"], "synthetic:x");
        assert_eq!(v["nodes"][0]["id"], 0);
        assert_eq!(v["nodes"][0]["cpus"], "0-1");
        assert_eq!(v["nodes"][2]["cpus"], "");
        assert_eq!(v["nodes"][1]["distances"], serde_json::json!([20, 10, 20]));
        assert_eq!(v["nodes"][0]["memory_bytes"], 16u64 << 30);
        assert_eq!(v["cpus"][3]["node"], 1);
        assert_eq!(v["cpus"][3]["core"], 3);
        assert_eq!(v["cpus"][3]["package"], 1);
        assert_eq!(v["cpus"][3]["allowed"], true);
        assert_eq!(v["caches"][0]["kind"], "data");
        assert_eq!(v["caches"][0]["cpus"], "0");
        assert!(v["caches"][0]["size_bytes"].is_u64());
        assert_eq!(
            v["devices"][0],
            serde_json::json!({"name": "eth0", "kind": "net", "node": 1})
        );
        // Exactly the documented keys.
        let keys = |o: &serde_json::Value| {
            let mut k: Vec<String> = o.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&v), TOP_KEYS);
        assert_eq!(keys(&v["nodes"][0]), NODE_KEYS);
        assert_eq!(keys(&v["cpus"][0]), CPU_KEYS);
        assert_eq!(keys(&v["caches"][0]), CACHE_KEYS);
        let back: TopologyJson = serde_json::from_value(v).unwrap();
        assert_eq!(back.into_topology().unwrap(), t);
    }
}
