//! hwloc XML reader (`lstopo --of xml`, hwloc 2.x and 3.x exports: XML format versions 2 and 3).
//!
//! What is taken from the object tree:
//! - `PU` objects are the cpus (`os_index`); their `Core` ancestor is the core (renumbered
//!   machine-wide in document order; a PU without a Core is its own core), their `Package`
//!   ancestor's `os_index` the package.
//! - `NUMANode` objects are the nodes (`os_index`, `local_memory` bytes). hwloc attaches nodes as
//!   memory children of the object whose cpus are local to them (possibly below a memory-side
//!   `MemCache`). Each PU belongs to the nearest ancestor's attached node whose `cpuset`
//!   (`complete_cpuset` where written) holds the PU; where several nodes share one attachment
//!   point (DRAM plus HBM or NVM), the cpus go to the ordinary one (no subtype or `DRAM`, then
//!   the lowest id) and the others are CPU-less, as Linux numbers them. A node without
//!   `local_memory` is memoryless (hwloc leaves out a 0) when other nodes have it.
//! - `L1Cache`..`L5Cache` and `L1iCache`..`L3iCache`: level from `depth`, size from
//!   `cache_size`, kind from `cache_type` (0 unified, 1 data, 2 instruction); the sharing cpus
//!   are the PUs below. Memory-side caches (`MemCache`) are not cpu caches and are skipped.
//! - `<distances2 type="NUMANode">`: the matrix whose `kind` has the latency bit (4), preferring
//!   the one named `NUMALatency`; values are listed row-major in the order of `<indexes>`
//!   (os indexes when `indexing="os"`, gp indexes otherwise). Without one: 10 local, 20 remote.
//! - `OSDev` objects: network interfaces, storage and GPUs (`osdev_type`: an enum in format 2, a
//!   bitmask in format 3), DMA channels skipped. The home node is that of the PUs below the
//!   device's nearest non-I/O ancestor, when they all lie in one node.
//!
//! Allowed cpus and nodes are the Machine's `allowed_cpuset` / `allowed_nodeset` (what the
//! exporting process could use) where present, everything otherwise; every cpu counts as online.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use roxmltree::{Document, Node as XNode};

use crate::error::TopoError;
use crate::idset::{CpuSet, NodeSet};
use crate::model::{Cache, CacheKind, Cpu, Device, DeviceKind, Node, NodeKind, Topology};

/// Reads an hwloc XML file.
pub fn read_file(path: &Path) -> Result<Topology, TopoError> {
    let text = std::fs::read_to_string(path).map_err(|e| TopoError::io(path, e))?;
    parse(&text).map_err(|msg| TopoError::Xml {
        path: path.to_path_buf(),
        msg,
    })
}

fn is_obj(n: &XNode) -> bool {
    n.is_element() && n.has_tag_name("object")
}

fn ty<'a>(n: &XNode<'a, '_>) -> &'a str {
    n.attribute("type").unwrap_or("")
}

/// An `os_index` (a cpu, node or package id): a number no larger than the ids cpu and node
/// lists can hold ([`crate::idset::MAX_ID`]).
fn attr_id(n: &XNode, key: &str) -> Result<Option<u32>, String> {
    match attr_u64(n, key)? {
        Some(v) if v > crate::idset::MAX_ID as u64 => Err(format!(
            "line {}: `{key}=\"{v}\"` on a {} object is beyond the largest id {}",
            n.document().text_pos_at(n.range().start).row,
            ty(n),
            crate::idset::MAX_ID
        )),
        v => Ok(v.map(|v| v as u32)),
    }
}

fn attr_u64(n: &XNode, key: &str) -> Result<Option<u64>, String> {
    n.attribute(key)
        .map(|v| {
            v.trim().parse::<u64>().map_err(|_| {
                format!(
                    "line {}: `{key}=\"{v}\"` on a {} object is not a number",
                    n.document().text_pos_at(n.range().start).row,
                    ty(n)
                )
            })
        })
        .transpose()
}

fn is_io(t: &str) -> bool {
    matches!(t, "Bridge" | "PCIDev" | "OSDev" | "Misc")
}

/// Cache level and kind of a cache object type, if it is a cpu cache.
fn cache_type(t: &str) -> Option<(u8, Option<CacheKind>)> {
    let rest = t.strip_prefix('L')?;
    let (digits, tail) = rest.split_at(rest.find(|c: char| !c.is_ascii_digit())?);
    let level: u8 = digits.parse().ok()?;
    match tail {
        "Cache" => Some((level, None)),
        "iCache" => Some((level, Some(CacheKind::Instruction))),
        _ => None,
    }
}

/// An hwloc bitmap string: comma-separated 32-bit hex words, most significant first, each with
/// `0x` (`0x000000ff,0xffffffff`); hwloc leaves a zero word empty unless it is the last one
/// (`0x000000ff,,,0x0`); a leading `0xf...f` word means "and everything above". `None` for the
/// all-set bitmap (no restriction).
pub fn parse_hwloc_bitmap(s: &str) -> Result<Option<CpuSet>, String> {
    let t = s.trim();
    if t.starts_with("0xf...f") {
        return Ok(None);
    }
    if t.is_empty() {
        return Err("an empty hwloc bitmap (expected e.g. `0x0000ffff`)".into());
    }
    let words: Vec<&str> = t
        .split(',')
        .map(|w| match w.trim().trim_start_matches("0x") {
            "" => "0",
            w => w,
        })
        .collect();
    CpuSet::parse_mask(&words.join(","))
        .map(Some)
        .map_err(|_| format!("`{t}` is not an hwloc bitmap (expected e.g. `0x0000ffff`)"))
}

fn bitmap_attr(n: &XNode, key: &str) -> Result<Option<CpuSet>, String> {
    match n.attribute(key) {
        None => Ok(None),
        Some(v) => parse_hwloc_bitmap(v).map_err(|m| format!("`{key}`: {m}")),
    }
}

/// Parses the XML text of an hwloc export.
pub fn parse(text: &str) -> Result<Topology, String> {
    // hwloc writes `<!DOCTYPE topology SYSTEM "hwloc2.dtd">`; the DTD is only a reference.
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = Document::parse_with_options(text, opts)
        .map_err(|e| format!("not well-formed XML: {e}"))?;
    let root = doc.root_element();
    if !root.has_tag_name("topology") {
        return Err(format!(
            "root element is <{}>, expected <topology> (an `lstopo --of xml` export)",
            root.tag_name().name()
        ));
    }
    let version_major: u32 = root
        .attribute("version")
        .and_then(|v| v.split('.').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    if version_major < 2 {
        return Err(
            "hwloc 1.x XML is not supported; export with hwloc 2 or later (`lstopo --of xml`)"
                .into(),
        );
    }
    let machine = root
        .children()
        .find(is_obj)
        .ok_or("no <object> below <topology>")?;

    // NUMA nodes, with their attachment point (the normal parent above any MemCache).
    struct NumaInfo<'a> {
        id: u32,
        mem: Option<u64>,
        ordinary: bool,
        kind: NodeKind,
        anchor: XNode<'a, 'a>,
        gp: Option<u64>,
        /// The cpus hwloc says are local to the node (`complete_cpuset`, else `cpuset`).
        local: Option<CpuSet>,
    }
    let mut numa: Vec<NumaInfo> = Vec::new();
    for n in machine
        .descendants()
        .filter(|n| is_obj(n) && ty(n) == "NUMANode")
    {
        let id = attr_id(&n, "os_index")?.ok_or("a NUMANode has no os_index")?;
        let mut anchor = n.parent().ok_or("NUMANode without parent")?;
        while is_obj(&anchor) && ty(&anchor) == "MemCache" {
            anchor = anchor.parent().ok_or("MemCache without parent")?;
        }
        let subtype = n.attribute("subtype");
        numa.push(NumaInfo {
            id,
            mem: attr_u64(&n, "local_memory")?,
            ordinary: subtype.is_none() || subtype == Some("DRAM"),
            // hwloc's memory subtypes (see docs/topology.md, "Node kinds").
            kind: match subtype {
                Some("HBM" | "MCDRAM" | "SPM") => NodeKind::Hbm,
                Some("NVM" | "CXL-DRAM") => NodeKind::Nvm,
                Some("GPUMemory") => NodeKind::Gpu,
                _ => NodeKind::Dram,
            },
            anchor,
            gp: attr_u64(&n, "gp_index")?,
            local: match n.attribute("complete_cpuset") {
                Some(_) => bitmap_attr(&n, "complete_cpuset")?,
                None => bitmap_attr(&n, "cpuset")?,
            },
        });
    }

    // Cpus.
    let mut cpus: Vec<Cpu> = Vec::new();
    let mut core_ids: HashMap<roxmltree::NodeId, u32> = HashMap::new();
    let mut next_core = 0u32;
    let mut node_cpus: BTreeMap<u32, CpuSet> = numa.iter().map(|n| (n.id, CpuSet::new())).collect();
    for pu in machine.descendants().filter(|n| is_obj(n) && ty(n) == "PU") {
        let id = attr_id(&pu, "os_index")?.ok_or("a PU has no os_index")?;
        let mut core = None;
        let mut package = None;
        let mut home = None;
        for a in pu.ancestors().skip(1).filter(is_obj) {
            match ty(&a) {
                "Core" if core.is_none() => core = Some(a.id()),
                "Package" if package.is_none() => {
                    package = Some(attr_id(&a, "os_index")?.unwrap_or(0))
                }
                _ => {}
            }
            if home.is_none() {
                // A node whose cpuset leaves this PU out is not its home even when attached
                // here: a CPU-less node hangs off the Machine beside a node spanning the
                // whole machine with `cpuset="0x0"`.
                let mut local: Vec<&NumaInfo> = numa
                    .iter()
                    .filter(|n| n.anchor == a && !matches!(&n.local, Some(s) if !s.contains(id)))
                    .collect();
                local.sort_by_key(|n| (!n.ordinary, n.id));
                home = local.first().map(|n| n.id);
            }
        }
        let core = match core {
            Some(c) => *core_ids.entry(c).or_insert_with(|| {
                next_core += 1;
                next_core - 1
            }),
            None => {
                next_core += 1;
                next_core - 1
            }
        };
        if let Some(h) = home {
            node_cpus.get_mut(&h).expect("home is a node").insert(id);
        }
        cpus.push(Cpu {
            id,
            core,
            package: package.unwrap_or(0),
            node: home,
            online: true,
            allowed: true,
        });
    }
    if cpus.is_empty() {
        return Err("no PU objects (no cpus) in the topology".into());
    }
    cpus.sort_by_key(|c| c.id);
    if cpus.windows(2).any(|w| w[0].id == w[1].id) {
        return Err("two PU objects have the same os_index".into());
    }
    let numa_off = numa.is_empty();
    // hwloc writes `local_memory` only when it is not 0: where the export gives other nodes
    // their memory, a node without the attribute is memoryless (hwloc on Linux reads every
    // node's meminfo). Where no node has it, the export does not say.
    if numa.iter().any(|n| n.mem.is_some()) {
        for n in &mut numa {
            n.mem.get_or_insert(0);
        }
    }
    numa.sort_by_key(|n| n.id);
    if numa.windows(2).any(|w| w[0].id == w[1].id) {
        return Err("two NUMANode objects have the same os_index".into());
    }
    let mut nodes: Vec<Node> = numa
        .iter()
        .map(|n| Node {
            id: n.id,
            cpus: node_cpus.remove(&n.id).unwrap_or_default(),
            memory_bytes: n.mem,
            kind: n.kind,
            ..Default::default()
        })
        .collect();
    if numa_off {
        for c in &mut cpus {
            c.node = Some(0);
        }
        nodes.push(Node {
            id: 0,
            cpus: cpus.iter().map(|c| c.id).collect(),
            memory_bytes: None,
            ..Default::default()
        });
    }

    // PUs below an object.
    let pus_below = |n: &XNode| -> CpuSet {
        n.descendants()
            .filter(|d| is_obj(d) && ty(d) == "PU")
            .filter_map(|d| d.attribute("os_index")?.parse().ok())
            .collect()
    };

    // Caches.
    let mut caches = Vec::new();
    for c in machine.descendants().filter(is_obj) {
        let Some((type_level, fixed_kind)) = cache_type(ty(&c)) else {
            continue;
        };
        let level = attr_u64(&c, "depth")?.map_or(type_level, |d| d as u8);
        let kind = match fixed_kind {
            Some(k) => k,
            None => match attr_u64(&c, "cache_type")?.unwrap_or(0) {
                0 => CacheKind::Unified,
                1 => CacheKind::Data,
                2 => CacheKind::Instruction,
                other => {
                    return Err(format!(
                        "cache_type=\"{other}\" on a {} (valid: 0 unified, 1 data, 2 instruction)",
                        ty(&c)
                    ))
                }
            },
        };
        let cpus = pus_below(&c);
        if cpus.is_empty() {
            continue;
        }
        caches.push(Cache {
            level,
            kind,
            size_bytes: attr_u64(&c, "cache_size")?.unwrap_or(0),
            cpus,
        });
    }
    caches.sort_by_key(|c| (c.level, c.kind as u8, c.cpus.first()));

    // Distances.
    let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    let distances = read_distances(
        &root,
        &numa.iter().map(|n| (n.id, n.gp)).collect::<Vec<_>>(),
    )?
    .unwrap_or_else(|| {
        (0..ids.len())
            .map(|i| {
                (0..ids.len())
                    .map(|j| if i == j { 10 } else { 20 })
                    .collect()
            })
            .collect()
    });

    // Devices.
    let mut devices = Vec::new();
    for d in machine
        .descendants()
        .filter(|n| is_obj(n) && ty(n) == "OSDev")
    {
        let Some(name) = d.attribute("name") else {
            continue;
        };
        let t = attr_u64(&d, "osdev_type")?.unwrap_or(u64::MAX);
        let kind = if version_major >= 3 {
            // Format 3: a bitmask. STORAGE 1, MEMORY 2, GPU 4, COPROC 8, NETWORK 16,
            // OPENFABRICS 32, DMA 64.
            if t & 64 != 0 {
                continue;
            } else if t & 32 != 0 {
                DeviceKind::Other
            } else if t & 16 != 0 {
                DeviceKind::Net
            } else if t & 4 != 0 {
                DeviceKind::Gpu
            } else if t & 1 != 0 {
                DeviceKind::Block
            } else {
                DeviceKind::Other
            }
        } else {
            // Format 2: BLOCK 0, GPU 1, NETWORK 2, OPENFABRICS 3, DMA 4, COPROC 5.
            match t {
                0 => DeviceKind::Block,
                1 => DeviceKind::Gpu,
                2 => DeviceKind::Net,
                4 => continue,
                _ => DeviceKind::Other,
            }
        };
        let anchor = d.ancestors().skip(1).find(|a| is_obj(a) && !is_io(ty(a)));
        let node = anchor.and_then(|a| {
            let local: NodeSet = pus_below(&a)
                .iter()
                .filter_map(|p| cpus.iter().find(|c| c.id == p).and_then(|c| c.node))
                .collect();
            (local.len() == 1).then(|| local.first().expect("one node"))
        });
        devices.push(Device {
            name: name.to_string(),
            kind,
            node,
        });
    }

    // What the exporting process was allowed to use (hwloc records its cgroup and binding).
    if let Some(allowed) = bitmap_attr(&machine, "allowed_cpuset")? {
        for c in &mut cpus {
            c.allowed = allowed.contains(c.id);
        }
    }
    if let Some(allowed) = bitmap_attr(&machine, "allowed_nodeset")? {
        for n in &mut nodes {
            n.allowed = allowed.contains(n.id);
        }
    }

    let t = Topology::from_parts(String::new(), nodes, cpus, caches, devices, distances);
    Ok(t)
}

/// The NUMA latency matrix, reordered to ascending node ids. `nodes` is (os index, gp index),
/// sorted by os index.
fn read_distances(
    root: &XNode,
    nodes: &[(u32, Option<u64>)],
) -> Result<Option<Vec<Vec<u32>>>, String> {
    let mut candidates: Vec<XNode> = root
        .children()
        .filter(|n| n.is_element() && n.has_tag_name("distances2"))
        .filter(|n| n.attribute("type") == Some("NUMANode"))
        .filter(|n| {
            n.attribute("kind")
                .and_then(|k| k.parse::<u64>().ok())
                .is_some_and(|k| k & 4 != 0)
        })
        .collect();
    candidates.sort_by_key(|n| n.attribute("name") != Some("NUMALatency"));
    let Some(d) = candidates.first() else {
        return Ok(None);
    };
    let nums =
        |tag: &str| -> Result<Vec<u64>, String> {
            let mut out = Vec::new();
            for el in d
                .children()
                .filter(|n| n.is_element() && n.has_tag_name(tag))
            {
                for t in el.text().unwrap_or("").split_whitespace() {
                    out.push(t.parse::<u64>().map_err(|_| {
                        format!("<{tag}> value `{t}` in <distances2> is not a number")
                    })?);
                }
            }
            Ok(out)
        };
    let indexes = nums("indexes")?;
    let values = nums("u64values")?;
    let n = indexes.len();
    if values.len() != n * n {
        return Err(format!(
            "<distances2> has {} values for {n} indexes (expected {})",
            values.len(),
            n * n
        ));
    }
    let by_gp = d.attribute("indexing") == Some("gp");
    // Position in the matrix of each node (sorted by os index).
    let mut pos = Vec::with_capacity(nodes.len());
    for (os, gp) in nodes {
        let key = if by_gp {
            gp.unwrap_or(u64::MAX)
        } else {
            *os as u64
        };
        match indexes.iter().position(|&i| i == key) {
            Some(p) => pos.push(p),
            None => {
                return Err(format!(
                    "the NUMA distance matrix does not cover node {os} (its indexes: {indexes:?})"
                ))
            }
        }
    }
    let mut out = Vec::with_capacity(nodes.len());
    for &i in &pos {
        let mut row = Vec::with_capacity(nodes.len());
        for &j in &pos {
            let v = values[i * n + j];
            row.push(u32::try_from(v).map_err(|_| format!("distance {v} is too large"))?);
        }
        out.push(row);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<topology version="3.0">
  <object type="Machine" os_index="0">
    <object type="Package" os_index="0">
      <object type="NUMANode" os_index="0" local_memory="1073741824"/>
      <object type="NUMANode" os_index="7" subtype="HBM" local_memory="2147483648"/>
      <object type="L2Cache" cache_size="1048576" depth="2" cache_type="0">
        <object type="L1Cache" cache_size="32768" depth="1" cache_type="1">
          <object type="Core" os_index="0">
            <object type="PU" os_index="0"/>
            <object type="PU" os_index="2"/>
          </object>
        </object>
      </object>
      <object type="Bridge">
        <object type="PCIDev">
          <object type="OSDev" name="eth0" osdev_type="16"/>
          <object type="OSDev" name="dma0chan0" osdev_type="64"/>
        </object>
      </object>
    </object>
    <object type="Package" os_index="1">
      <object type="NUMANode" os_index="1" local_memory="1073741824"/>
      <object type="Core" os_index="0">
        <object type="PU" os_index="1"/>
      </object>
    </object>
    <object type="Bridge">
      <object type="OSDev" name="sda" osdev_type="1"/>
    </object>
  </object>
  <distances2 type="NUMANode" nbobjs="3" kind="5" name="NUMALatency" indexing="os">
    <indexes length="6">7 1 0 </indexes>
    <u64values length="20">10 31 30 31 10 20 30 20 10 </u64values>
  </distances2>
</topology>
"#;

    /// `xml` read, and valid.
    fn parse_valid(xml: &str) -> Topology {
        let t = parse(xml).unwrap();
        t.validate().unwrap();
        t
    }

    #[test]
    fn small_export() {
        let t = parse_valid(SMALL);
        let ids: Vec<u32> = t.nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, vec![0, 1, 7]);
        assert_eq!(t.nodes[0].cpus.to_string(), "0,2");
        assert_eq!(t.nodes[2].cpus.to_string(), "", "HBM is CPU-less");
        assert_eq!(t.nodes[2].memory_bytes, Some(2 << 30));
        // Reordered from indexes 7 1 0 to ids 0 1 7.
        assert_eq!(
            t.distances,
            vec![vec![10, 20, 30], vec![20, 10, 31], vec![30, 31, 10]]
        );
        assert_eq!(t.cpu(2).unwrap().core, t.cpu(0).unwrap().core);
        assert_ne!(t.cpu(1).unwrap().core, t.cpu(0).unwrap().core);
        assert_eq!(t.cpu(1).unwrap().package, 1);
        let l2: Vec<_> = t.caches_at(2).collect();
        assert_eq!(l2.len(), 1);
        assert_eq!(l2[0].cpus.to_string(), "0,2");
        assert_eq!(t.caches[0].kind, CacheKind::Data);
        let dev: Vec<(&str, DeviceKind, Option<u32>)> = t
            .devices
            .iter()
            .map(|d| (d.name.as_str(), d.kind, d.node))
            .collect();
        assert_eq!(
            dev,
            vec![
                ("eth0", DeviceKind::Net, Some(0)),
                ("sda", DeviceKind::Block, None)
            ]
        );
    }

    #[test]
    fn bad_documents_are_named() {
        assert!(parse("<topology").unwrap_err().contains("not well-formed"));
        assert!(parse("<foo/>").unwrap_err().contains("<topology>"));
        assert!(
            parse(r#"<topology version="1.0"><object type="Machine"/></topology>"#)
                .unwrap_err()
                .contains("1.x")
        );
        let no_pu = r#"<topology version="2.0"><object type="Machine"/></topology>"#;
        assert!(parse(no_pu).unwrap_err().contains("no PU"));
        let bad_mem = SMALL.replace(
            "1073741824\"/>\n      <object type=\"NUMANode\" os_index=\"7\"",
            "lots\"/>\n      <object type=\"NUMANode\" os_index=\"7\"",
        );
        assert!(parse(&bad_mem)
            .unwrap_err()
            .contains("local_memory=\"lots\""));
        for id in ["99999999999", "4294967295", "65536"] {
            let big = SMALL.replace(
                r#"<object type="PU" os_index="2"/>"#,
                &format!(r#"<object type="PU" os_index="{id}"/>"#),
            );
            let e = parse(&big).unwrap_err();
            assert!(
                e.contains(&format!("os_index=\"{id}\""))
                    && e.contains("beyond the largest id 65535"),
                "{e}"
            );
        }
        let short = SMALL.replace("10 31 30 31 10 20 30 20 10", "10 31 30");
        assert!(parse(&short)
            .unwrap_err()
            .contains("3 values for 3 indexes"));
    }

    #[test]
    fn bitmaps_and_allowed_sets() {
        assert_eq!(
            parse_hwloc_bitmap("0x0000ffff")
                .unwrap()
                .unwrap()
                .to_string(),
            "0-15"
        );
        assert_eq!(
            parse_hwloc_bitmap("0x00000001,0x80000000")
                .unwrap()
                .unwrap()
                .to_string(),
            "31-32"
        );
        assert_eq!(parse_hwloc_bitmap("0xf...f").unwrap(), None);
        assert!(parse_hwloc_bitmap("0xzz").unwrap_err().contains("`0xzz`"));
        assert!(parse_hwloc_bitmap("").is_err());
        // hwloc leaves zero words empty, except the last (192em64t-24n8c2t.xml,
        // memorysidecaches.xml).
        let set = |s: &str| parse_hwloc_bitmap(s).unwrap().unwrap().to_string();
        assert_eq!(set("0x000000ff,,,,,,0x000000ff"), "0-7,192-199");
        assert_eq!(set("0x00000100,0x0"), "40");
        assert_eq!(set("0x00000001,,0x0"), "64");
        assert_eq!(set("0x0"), "");
        let restricted = SMALL.replace(
            r#"<object type="Machine" os_index="0">"#,
            r#"<object type="Machine" os_index="0" allowed_cpuset="0x00000005" allowed_nodeset="0x00000080">"#,
        );
        let t = parse(&restricted).unwrap();
        assert_eq!(t.allowed_cpus().to_string(), "0,2");
        assert_eq!(t.allowed_mems().to_string(), "7");
        let bad = SMALL.replace(
            r#"<object type="Machine" os_index="0">"#,
            r#"<object type="Machine" os_index="0" allowed_cpuset="nope">"#,
        );
        assert!(parse(&bad).unwrap_err().contains("allowed_cpuset"));
    }

    /// As hwloc exports a machine whose one node with cpus spans both packages (so it hangs off
    /// the Machine), with a CPU-less node 0 beside it (`cpuset="0x0"`) and a memoryless node 5
    /// (hwloc writes no `local_memory` when it is 0).
    const BESIDE: &str = r#"<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003">
    <object type="NUMANode" os_index="0" cpuset="0x0" complete_cpuset="0x0" local_memory="4096"/>
    <object type="NUMANode" os_index="1" cpuset="0x00000003" complete_cpuset="0x00000003" local_memory="8192"/>
    <object type="Package" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001">
      <object type="Core" os_index="0"><object type="PU" os_index="0"/></object>
    </object>
    <object type="Package" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002">
      <object type="Core" os_index="0"><object type="PU" os_index="1"/></object>
    </object>
    <object type="Group" cpuset="0x0" complete_cpuset="0x0">
      <object type="NUMANode" os_index="5" cpuset="0x0" complete_cpuset="0x0"/>
    </object>
  </object>
</topology>
"#;

    #[test]
    fn cpuless_beside_a_machine_wide_node_and_memoryless_nodes() {
        let t = parse_valid(BESIDE);
        let cpus: Vec<String> = t.nodes.iter().map(|n| n.cpus.to_string()).collect();
        assert_eq!(cpus, ["", "0-1", ""]);
        assert_eq!(t.cpu(0).unwrap().node, Some(1));
        let mem: Vec<Option<u64>> = t.nodes.iter().map(|n| n.memory_bytes).collect();
        assert_eq!(mem, [Some(4096), Some(8192), Some(0)]);
        assert_eq!(t.allowed_mems().to_string(), "0-1");
        // Without a `local_memory` anywhere, the export does not say.
        let t = parse(
            &BESIDE
                .replace(r#" local_memory="4096""#, "")
                .replace(r#" local_memory="8192""#, ""),
        )
        .unwrap();
        assert!(t.nodes.iter().all(|n| n.memory_bytes.is_none()));
        // Without cpusets on the nodes, the lowest id at the attachment point gets the cpus.
        let t = parse(&BESIDE.replace(r#" cpuset="0x0" complete_cpuset="0x0" local"#, " local"))
            .unwrap();
        assert_eq!(t.nodes[0].cpus.to_string(), "0-1");
    }

    #[test]
    fn numa_off_export_is_one_node() {
        let t = parse_valid(
            r#"<topology version="2.0"><object type="Machine"><object type="PU" os_index="0"/><object type="PU" os_index="1"/></object></topology>"#,
        );
        assert_eq!(t.nodes.len(), 1);
        assert_eq!(t.nodes[0].cpus.to_string(), "0-1");
        assert_eq!(t.distances, vec![vec![10]]);
    }
}
