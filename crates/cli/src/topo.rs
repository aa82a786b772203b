//! `loci topo`: show a machine as a readable tree or as the stable JSON of docs/topology.md.

use std::fmt::Write as _;

use clap::Args;
use loci_topo::{CacheKind, CpuSet, NodeKind, Topology};

use crate::topo_args::TopoArgs;

/// Flags of `loci topo`.
#[derive(Args, Debug)]
pub struct TopoCmd {
    #[command(flatten)]
    pub source: TopoArgs,
    /// Print JSON instead of the tree (schema in docs/topology.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: TopoCmd) -> anyhow::Result<()> {
    let topo = cmd.source.load()?;
    if cmd.json {
        println!("{}", serde_json::to_string_pretty(&topo.to_json())?);
    } else {
        print!("{}", render(&topo));
    }
    Ok(())
}

/// Bytes in binary units, as lstopo prints them (`16 GiB`, `1280 KiB`).
pub fn human_bytes(b: impl Into<u128>) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = b.into() as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if (v - v.round()).abs() < 0.005 {
        format!("{:.0} {}", v, UNITS[u])
    } else {
        format!("{:.1} {}", v, UNITS[u])
    }
}

fn cache_name(level: u8, kind: CacheKind) -> String {
    match kind {
        CacheKind::Data => format!("L{level}d"),
        CacheKind::Instruction => format!("L{level}i"),
        CacheKind::Unified => format!("L{level}"),
    }
}

/// Appends `items` separated by spaces, wrapping at about 100 columns with `indent`.
fn wrap(out: &mut String, indent: &str, items: impl IntoIterator<Item = String>) {
    let mut col = indent.len();
    out.push_str(indent);
    let mut first = true;
    for it in items {
        if !first && col + 1 + it.len() > 100 {
            out.push('\n');
            out.push_str(indent);
            col = indent.len();
        } else if !first {
            out.push(' ');
            col += 1;
        }
        out.push_str(&it);
        col += it.len();
        first = false;
    }
    out.push('\n');
}

/// The readable tree: machine summary, per node its cpus, memory, packages and cores (SMT
/// siblings joined by `+`), caches per level with the cpus sharing each instance; then the
/// distance matrix and devices.
pub fn render(t: &Topology) -> String {
    let mut o = String::new();
    let present = t.cpu_ids();
    let allowed = t.allowed_cpus();
    let offline: CpuSet = t.cpus.iter().filter(|c| !c.online).map(|c| c.id).collect();
    let packages: std::collections::BTreeSet<u32> = t.cpus.iter().map(|c| c.package).collect();
    let cores: std::collections::BTreeSet<(u32, u32)> =
        t.cpus.iter().map(|c| (c.package, c.core)).collect();
    // Summed in u128: node sizes from a synthetic spec or a saved file can add past u64.
    let total_mem: Option<u128> = t.nodes.iter().map(|n| n.memory_bytes.map(u128::from)).sum();
    let _ = writeln!(o, "Machine ({})", t.source);
    let _ = writeln!(
        o,
        "  {} node(s), {} package(s), {} core(s), {} cpu(s){}",
        t.nodes.len(),
        packages.len(),
        cores.len(),
        present.len(),
        total_mem.map_or(String::new(), |m| format!(", {} memory", human_bytes(m)))
    );
    let _ = writeln!(o, "  cpus present: {present}");
    let _ = writeln!(
        o,
        "  cpus allowed: {allowed}{}",
        if allowed == present {
            String::new()
        } else {
            format!(" ({} of {})", allowed.len(), present.len())
        }
    );
    if !offline.is_empty() {
        let _ = writeln!(o, "  cpus offline: {offline}");
    }
    let _ = writeln!(
        o,
        "  memory allowed on nodes: {}",
        t.nodes
            .iter()
            .filter(|n| n.allowed)
            .map(|n| n.id)
            .collect::<loci_topo::NodeSet>()
    );
    for node in &t.nodes {
        let mem = match (node.memory_bytes, node.free_bytes) {
            (Some(0), _) => "no memory".to_string(),
            (Some(m), Some(f)) => format!("{} total, {} free", human_bytes(m), human_bytes(f)),
            (Some(m), None) => human_bytes(m),
            (None, _) => "memory unknown".to_string(),
        };
        let cpus = if node.cpus.is_empty() {
            "no cpus".to_string()
        } else {
            format!("cpus {}", node.cpus)
        };
        let mut what = String::new();
        if node.kind != NodeKind::Dram {
            let _ = write!(what, " [{}]", node.kind.name());
        }
        if !node.initiators.is_empty() {
            let _ = write!(what, " near node(s) {}", node.initiators);
        }
        if !node.merged.is_empty() {
            let _ = write!(what, " (kernel nodes {} merged)", node.kernel_ids());
        }
        let _ = writeln!(
            o,
            "Node {}{what}: {cpus}; {mem}{}",
            node.id,
            match (node.allowed, node.kind) {
                (false, _) => " (memory not allowed for this process)",
                (true, NodeKind::Gpu) => " (used only by a memory policy that names it)",
                _ => "",
            }
        );
        let na = node.cpus.intersection(&allowed);
        if na != node.cpus {
            let _ = writeln!(
                o,
                "  allowed cpus: {}",
                if na.is_empty() {
                    "none".into()
                } else {
                    na.to_string()
                }
            );
        }
        // Packages and cores of this node.
        let mut pk: Vec<u32> = t
            .cpus
            .iter()
            .filter(|c| c.node == Some(node.id))
            .map(|c| c.package)
            .collect();
        pk.sort_unstable();
        pk.dedup();
        for p in pk {
            let mut core_ids: Vec<u32> = t
                .cpus
                .iter()
                .filter(|c| c.node == Some(node.id) && c.package == p)
                .map(|c| c.core)
                .collect();
            core_ids.sort_unstable();
            core_ids.dedup();
            let threads = core_ids
                .iter()
                .map(|&k| {
                    t.cpus
                        .iter()
                        .filter(|c| c.package == p && c.core == k && c.node == Some(node.id))
                        .count()
                })
                .max()
                .unwrap_or(1);
            let _ = writeln!(
                o,
                "  Package {p}: {} core(s) x {threads} thread(s); cores (cpus):",
                core_ids.len()
            );
            wrap(
                &mut o,
                "    ",
                core_ids.iter().map(|&k| {
                    let ids: Vec<String> = t
                        .cpus
                        .iter()
                        .filter(|c| c.package == p && c.core == k && c.node == Some(node.id))
                        .map(|c| c.id.to_string())
                        .collect();
                    format!("{k}({})", ids.join("+"))
                }),
            );
        }
        // Caches touching this node, by level and kind, largest level first.
        let mut kinds: Vec<(u8, CacheKind, u64)> = t
            .caches
            .iter()
            .filter(|c| !c.cpus.intersection(&node.cpus).is_empty())
            .map(|c| (c.level, c.kind, c.size_bytes))
            .collect();
        kinds.sort_by_key(|(l, k, s)| (std::cmp::Reverse(*l), *k as u8, *s));
        kinds.dedup();
        for (level, kind, size) in kinds {
            let inst: Vec<String> = t
                .caches
                .iter()
                .filter(|c| {
                    c.level == level
                        && c.kind == kind
                        && c.size_bytes == size
                        && !c.cpus.intersection(&node.cpus).is_empty()
                })
                .map(|c| c.cpus.to_string())
                .collect();
            let _ = writeln!(
                o,
                "  {} {} x {} (cpus sharing each):",
                cache_name(level, kind),
                human_bytes(size),
                inst.len()
            );
            wrap(&mut o, "    ", inst.into_iter().map(|s| format!("[{s}]")));
        }
    }
    if t.nodes.len() > 1 {
        let _ = writeln!(o, "Distances (SLIT, 10 = local; hops in parentheses):");
        let w = t
            .nodes
            .iter()
            .map(|n| n.id.to_string().len())
            .max()
            .unwrap_or(1)
            .max(3);
        let _ = write!(o, "  {:>w$}", "");
        for n in &t.nodes {
            let _ = write!(o, " {:>8}", n.id);
        }
        o.push('\n');
        let hops = t.hops_matrix();
        for (i, a) in t.nodes.iter().enumerate() {
            let _ = write!(o, "  {:>w$}", a.id);
            for (d, h) in t.distances[i].iter().zip(&hops[i]) {
                let _ = write!(o, " {:>8}", format!("{d} ({h})"));
            }
            o.push('\n');
        }
    }
    if !t.notes.is_empty() {
        let _ = writeln!(o, "Notes (what the source had to repair or leave out):");
        for n in &t.notes {
            let _ = writeln!(o, "  - {n}");
        }
    }
    if !t.devices.is_empty() {
        let _ = writeln!(o, "Devices:");
        for d in &t.devices {
            let kind = serde_json::to_value(d.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let _ = writeln!(
                o,
                "  {} ({kind}): {}",
                d.name,
                d.node
                    .map_or("no home node".to_string(), |n| format!("node {n}"))
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(human_bytes(16u64 << 30), "16 GiB");
        assert_eq!(human_bytes(1280u64 << 10), "1.2 MiB");
        assert_eq!(human_bytes(32u64 << 10), "32 KiB");
        assert_eq!(human_bytes(0u64), "0 B");
        assert_eq!(human_bytes(u128::from(u64::MAX) * 2), "32 EiB");
    }

    #[test]
    fn tree_of_a_preset() {
        let t = loci_topo::load(&loci_topo::Source::Preset("opteron-8220-8s".into())).unwrap();
        let s = render(&t);
        assert!(
            s.contains("8 node(s), 8 package(s), 16 core(s), 16 cpu(s)"),
            "{s}"
        );
        assert!(s.contains("Node 7: cpus 14-15; 16 GiB"), "{s}");
        assert!(s.contains("L2 1 MiB x 2"), "{s}");
        assert!(s.contains("16 (3)"), "{s}");
        let t = loci_topo::load(&loci_topo::Source::Preset("xeon-gold-6346-2s".into())).unwrap();
        let s = render(&t);
        assert!(s.contains("ens5f0np0 (net): node 1"), "{s}");
        assert!(s.contains("16 core(s) x 2 thread(s)"), "{s}");
        assert!(s.contains("0(0+32)"), "{s}");
    }

    #[test]
    fn kinds_merges_and_notes_are_shown() {
        let mut t = loci_topo::load(&loci_topo::Source::Synthetic(
            "nodes=3,cores=2,cpuless=1-2".into(),
        ))
        .unwrap();
        t.nodes[1].kind = NodeKind::Hbm;
        t.nodes[1].initiators = "0".parse().unwrap();
        t.nodes[2].kind = NodeKind::Gpu;
        t.nodes[0].merged = "5".parse().unwrap();
        t.notes
            .push("node 0's cpulist names cpus 9 that are not present".into());
        let s = render(&t);
        assert!(
            s.contains("Node 0 (kernel nodes 0,5 merged): cpus 0-1"),
            "{s}"
        );
        assert!(s.contains("Node 1 [hbm] near node(s) 0: no cpus"), "{s}");
        assert!(
            s.contains(
                "Node 2 [gpu]: no cpus; 16 GiB (used only by a memory policy that names it)"
            ),
            "{s}"
        );
        assert!(s.contains("  - node 0's cpulist names cpus 9"), "{s}");
    }
}
