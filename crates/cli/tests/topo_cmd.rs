//! `loci topo` end to end: the JSON schema on this machine and on presets, the tree, and errors.

use loci_topo::json::{CACHE_KEYS, CPU_KEYS, NODE_KEYS, TOP_KEYS};
use serde_json::Value;

mod common;
use common::{loci, loci_json};

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(|s| s.as_str()).collect();
    k.sort();
    k
}

#[test]
fn json_of_this_machine_follows_the_schema() {
    let v = loci_json(&["topo", "--json"]);
    assert_eq!(keys(&v), TOP_KEYS);
    assert!(v["notes"].is_array());
    assert_eq!(v["source"], "sysfs:/");
    let nodes = v["nodes"].as_array().unwrap();
    assert!(!nodes.is_empty());
    let cpus = v["cpus"].as_array().unwrap();
    for n in nodes {
        assert_eq!(keys(n), NODE_KEYS);
        assert_eq!(n["kind"], "dram");
        assert_eq!(n["distances"].as_array().unwrap().len(), nodes.len());
        assert!(
            n["memory_bytes"].as_u64().is_some(),
            "memory of node {}",
            n["id"]
        );
        assert!(n["cpus"].is_string());
    }
    for c in cpus {
        assert_eq!(keys(c), CPU_KEYS);
    }
    // Every cpu is listed in the node it names.
    for c in cpus {
        let node = nodes.iter().find(|n| n["id"] == c["node"]).unwrap();
        let list = loci_topo::CpuSet::parse(node["cpus"].as_str().unwrap()).unwrap();
        assert!(list.contains(c["id"].as_u64().unwrap() as u32));
    }
    for c in v["caches"].as_array().unwrap() {
        assert_eq!(keys(c), CACHE_KEYS);
    }
    // The cpus this test process may use are the allowed ones.
    let mine = common::allowed_cpus();
    let allowed: loci_topo::CpuSet = cpus
        .iter()
        .filter(|c| c["allowed"] == true)
        .map(|c| c["id"].as_u64().unwrap() as u32)
        .collect();
    let present: loci_topo::CpuSet = cpus
        .iter()
        .map(|c| c["id"].as_u64().unwrap() as u32)
        .collect();
    // (The kernel's list may name possible cpus that are not present.)
    assert_eq!(allowed, mine.intersection(&present));
}

#[test]
fn opteron_preset_has_ladder_distances() {
    let v = loci_json(&["topo", "--preset", "opteron-8220-8s", "--json"]);
    assert_eq!(v["source"], "preset:opteron-8220-8s");
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 8);
    assert_eq!(nodes[0]["cpus"], "0-1");
    assert_eq!(
        nodes[0]["distances"],
        serde_json::json!([10, 12, 12, 14, 14, 14, 16, 16])
    );
    assert_eq!(
        nodes[7]["distances"],
        serde_json::json!([16, 16, 14, 14, 14, 12, 12, 10])
    );
    let (ok, tree, _) = loci(&["topo", "--preset", "opteron-8220-8s"]);
    assert!(ok);
    assert!(tree.contains("Distances (SLIT"), "{tree}");
    assert!(tree.contains("Node 7: cpus 14-15"), "{tree}");
}

#[test]
fn cpuless_node_has_empty_cpu_string() {
    let v = loci_json(&["topo", "--synthetic", "nodes=2,cores=2,cpuless=1", "--json"]);
    assert_eq!(v["nodes"][1]["cpus"], "");
    assert_eq!(v["nodes"][0]["cpus"], "0-1");
}

#[test]
fn bad_sources_name_the_problem() {
    let (ok, _, err) = loci(&["topo", "--preset", "xeon-9999"]);
    assert!(!ok);
    assert!(
        err.contains("`xeon-9999`") && err.contains("opteron-8220-8s"),
        "{err}"
    );
    let (ok, _, err) = loci(&["topo", "--synthetic", "nodes=2,sockets=2"]);
    assert!(!ok);
    assert!(
        err.contains("`sockets`") && err.contains("packages"),
        "{err}"
    );
    let (ok, _, err) = loci(&[
        "topo",
        "--preset",
        "opteron-8220-8s",
        "--synthetic",
        "nodes=2",
    ]);
    assert!(!ok);
    assert!(err.contains("cannot be used with"), "{err}");
    let (ok, _, err) = loci(&["topo", "--sysfs-root", "/nonexistent"]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/sys/devices/system/cpu"), "{err}");
}
