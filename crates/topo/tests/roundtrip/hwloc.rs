//! Writing a machine out as an hwloc v2 XML export (`lstopo --of xml`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use loci_topo::{CacheKind, CpuSet, NodeSet, Topology};

use crate::machine::Machine;

/// One object of the hwloc tree.
struct XObj {
    ty: &'static str,
    /// hwloc's order among objects with the same cpuset (a smaller one is the parent).
    order: u8,
    cpuset: CpuSet,
    /// Type-specific attributes, already formatted (` os_index="3"`, cache attributes).
    attrs: String,
    parent: Option<usize>,
    children: Vec<usize>,
    /// Positions (in `topo.nodes`) of the NUMA nodes attached here.
    memory: Vec<usize>,
}

/// The tree `lstopo --of xml` would export for a machine, built as hwloc builds it: objects
/// inserted by cpuset (Machine > Package > L3 > L2 > L1d > L1i > Core > PU), each NUMA node
/// attached to the highest object whose cpuset is the node's (a memory Group is made where none
/// is, as for sub-NUMA clusters), CPU-less nodes to the Machine.
pub(crate) struct Hwloc {
    objs: Vec<XObj>,
    /// Each node's cpuset as hwloc has it (a CPU-less node may get its nearest nodes' cpus).
    node_cpuset: Vec<CpuSet>,
    /// Each node's attachment object.
    anchor: Vec<usize>,
    /// A CPU-less node's cpuset cuts through a package or cache (no Group could be made).
    crosses: bool,
}

/// hwloc bitmap syntax: 32-bit words, most significant first, `0x%08x` each; a zero word is
/// empty between commas except the last, which is `0x0` (so the empty set is `0x0`).
pub(crate) fn hwloc_bitmap(ids: impl Iterator<Item = u32>) -> String {
    let mut words: BTreeMap<u32, u32> = BTreeMap::new();
    for id in ids {
        *words.entry(id / 32).or_default() |= 1 << (id % 32);
    }
    let Some(&hi) = words.keys().last() else {
        return "0x0".into();
    };
    (0..=hi)
        .rev()
        .map(|w| match words.get(&w) {
            Some(v) => format!("0x{v:08x}"),
            None if w == 0 => "0x0".into(),
            None => String::new(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl Hwloc {
    pub(crate) fn new(m: &Machine) -> Hwloc {
        let t = &m.topo;
        let all = t.cpu_ids();
        let mut objs: Vec<XObj> = Vec::new();
        let obj = |ty, order, cpuset, attrs| XObj {
            ty,
            order,
            cpuset,
            attrs,
            parent: None,
            children: vec![],
            memory: vec![],
        };
        objs.push(obj("Machine", 0, all.clone(), String::new()));

        let mut packages: BTreeMap<u32, CpuSet> = BTreeMap::new();
        let mut cores: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for c in &t.cpus {
            packages.entry(c.package).or_default().insert(c.id);
            cores.entry(c.core).or_default().insert(c.id);
        }
        let mut normal = Vec::new();
        for (id, set) in packages {
            normal.push(obj("Package", 4, set, format!(" os_index=\"{id}\"")));
        }
        for c in &t.caches {
            let (ty, order, code) = match (c.level, c.kind) {
                (1, CacheKind::Instruction) => ("L1iCache", 13, 2),
                (1, k) => ("L1Cache", 12, if k == CacheKind::Data { 1 } else { 0 }),
                (2, _) => ("L2Cache", 10, 0),
                (3, _) => ("L3Cache", 8, 0),
                other => panic!("the generator makes no {other:?} cache"),
            };
            let attrs = format!(
                " cache_size=\"{}\" depth=\"{}\" cache_linesize=\"64\" cache_associativity=\"8\" cache_type=\"{code}\"",
                c.size_bytes, c.level
            );
            normal.push(obj(ty, order, c.cpus.clone(), attrs));
        }
        for set in cores.into_values() {
            let id = m.core_id[&set.first().unwrap()];
            normal.push(obj("Core", 14, set, format!(" os_index=\"{id}\"")));
        }
        for c in &t.cpus {
            normal.push(obj(
                "PU",
                18,
                CpuSet::single(c.id),
                format!(" os_index=\"{}\"", c.id),
            ));
        }

        // hwloc's cpusets of the nodes: a CPU-less node gets the cpus of the nodes nearest to
        // it when they are nearer than itself and not all the others
        // (`fixup_cpuless_node_locality_from_distances`, in node order).
        let n = t.nodes.len();
        let mut node_cpuset: Vec<CpuSet> = t.nodes.iter().map(|x| x.cpus.clone()).collect();
        if m.cpuless_locality && n >= 2 {
            for i in 0..n {
                if !node_cpuset[i].is_empty() {
                    continue;
                }
                let row = &t.distances[i];
                let (mut min, mut nb) = (u32::MAX, 0);
                for (j, &d) in row.iter().enumerate() {
                    if j == i {
                        continue;
                    }
                    if d < min {
                        (min, nb) = (d, 1);
                    } else if d == min {
                        nb += 1;
                    }
                }
                if min <= row[i] || nb == n - 1 {
                    continue;
                }
                for j in 0..n {
                    if j != i && row[j] == min {
                        node_cpuset[i] = node_cpuset[i].union(&node_cpuset[j]);
                    }
                }
            }
        }
        // A memory Group for every node cpuset that no object has.
        let mut group_sets: BTreeSet<CpuSet> = BTreeSet::new();
        for set in &node_cpuset {
            if !set.is_empty() && *set != all && !normal.iter().any(|o| o.cpuset == *set) {
                group_sets.insert(set.clone());
            }
        }
        // A CPU-less node near cpus of several packages can get a cpuset that cuts through a
        // package: hwloc then fails to insert objects and reports an error from the operating
        // system. Such machines are not generated (see `valid_for_hwloc`).
        let laminar = |a: &CpuSet, b: &CpuSet| {
            a.is_subset(b) || b.is_subset(a) || a.intersection(b).is_empty()
        };
        let crosses = group_sets.iter().any(|g| {
            normal.iter().any(|o| !laminar(g, &o.cpuset))
                || group_sets.iter().any(|h| !laminar(g, h))
        });
        if !crosses {
            for set in group_sets {
                normal.push(obj("Group", 1, set, " kind=\"1001\" subkind=\"0\"".into()));
            }
        }

        // Insert by cpuset, bigger sets first, then by type order.
        normal.sort_by_key(|o| (std::cmp::Reverse(o.cpuset.len()), o.order, o.cpuset.first()));
        for o in normal {
            let mut at = 0;
            while let Some(&c) = objs[at]
                .children
                .iter()
                .find(|&&c| o.cpuset.is_subset(&objs[c].cpuset))
            {
                at = c;
            }
            let idx = objs.len();
            objs.push(XObj {
                parent: Some(at),
                ..o
            });
            objs[at].children.push(idx);
        }
        let first = |objs: &Vec<XObj>, c: usize| objs[c].cpuset.first();
        for i in 0..objs.len() {
            let mut ch = std::mem::take(&mut objs[i].children);
            ch.sort_by_key(|&c| first(&objs, c));
            objs[i].children = ch;
        }

        // Attach the nodes: the highest object covering exactly the node's cpuset, never a PU.
        let mut anchor = vec![0; n];
        for i in 0..n {
            let set = &node_cpuset[i];
            if set.is_empty() {
                if m.cpuless_group {
                    let idx = objs.len();
                    let mut g = obj(
                        "Group",
                        1,
                        CpuSet::new(),
                        " kind=\"1001\" subkind=\"0\"".into(),
                    );
                    g.parent = Some(0);
                    objs.push(g);
                    objs[0].children.push(idx);
                    anchor[i] = idx;
                } else {
                    anchor[i] = 0;
                }
                continue;
            }
            let mut at = 0;
            loop {
                match objs[at]
                    .children
                    .iter()
                    .find(|&&c| set.is_subset(&objs[c].cpuset))
                {
                    None => break,
                    Some(&c) if objs[c].cpuset == *set => {
                        at = c;
                        break;
                    }
                    Some(&c) => at = c,
                }
            }
            if objs[at].ty == "PU" {
                at = objs[at].parent.unwrap();
            }
            assert!(
                crosses || objs[at].cpuset == *set,
                "node {i} has no home object"
            );
            anchor[i] = at;
        }
        for (i, &a) in anchor.iter().enumerate() {
            objs[a].memory.push(i);
        }
        Hwloc {
            objs,
            node_cpuset,
            anchor,
            crosses,
        }
    }

    /// Whether hwloc would export this machine without an error and without losing which node
    /// owns which cpus.
    pub(crate) fn valid_for_hwloc(&self, t: &Topology) -> bool {
        !self.crosses && !self.ambiguous(t)
    }

    /// Whether a node with cpus shares its attachment point with a lower-numbered node that hwloc
    /// says is local to the same cpus: nothing in the export then tells which of the two owns
    /// them (hwloc has no subtype for plain DRAM), and any reader must guess.
    fn ambiguous(&self, t: &Topology) -> bool {
        t.nodes.iter().enumerate().any(|(i, x)| {
            !x.cpus.is_empty()
                && t.nodes.iter().enumerate().any(|(j, y)| {
                    j != i
                        && self.anchor[j] == self.anchor[i]
                        && x.cpus.is_subset(&self.node_cpuset[j])
                        && y.id < x.id
                })
        })
    }

    /// The XML text.
    pub(crate) fn xml(&self, m: &Machine) -> String {
        let t = &m.topo;
        // Nodes local to each object: attached at it, above it or below it.
        let mut below: Vec<NodeSet> = vec![NodeSet::new(); self.objs.len()];
        for idx in (0..self.objs.len()).rev() {
            // Children always come after their parent in `objs`.
            let mut s: NodeSet = self.objs[idx]
                .memory
                .iter()
                .map(|&i| t.nodes[i].id)
                .collect();
            for &c in &self.objs[idx].children {
                s = s.union(&below[c]);
            }
            below[idx] = s;
        }
        let mut out = String::from(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n<topology version=\"2.0\">\n",
        );
        let mut gp = 1u64;
        self.emit(m, 0, 1, &NodeSet::new(), &below, &mut gp, &mut out);
        let n = t.nodes.len();
        if n >= 2 {
            let _ = writeln!(
                out,
                "  <distances2 type=\"NUMANode\" nbobjs=\"{n}\" kind=\"5\" name=\"NUMALatency\" indexing=\"os\">"
            );
            let order = &m.index_order;
            let indexes: Vec<u64> = order.iter().map(|&i| t.nodes[i].id as u64).collect();
            let values: Vec<u64> = order
                .iter()
                .flat_map(|&a| order.iter().map(move |&b| t.distances[a][b] as u64))
                .collect();
            for (tag, vals) in [("indexes", indexes), ("u64values", values)] {
                for chunk in vals.chunks(10) {
                    let text: String = chunk.iter().map(|v| format!("{v} ")).collect();
                    let _ = writeln!(out, "    <{tag} length=\"{}\">{text}</{tag}>", text.len());
                }
            }
            out.push_str("  </distances2>\n");
        }
        out.push_str("  <support name=\"discovery.pu\"/>\n  <support name=\"discovery.numa\"/>\n");
        out.push_str("</topology>\n");
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        m: &Machine,
        idx: usize,
        depth: usize,
        above: &NodeSet,
        below: &[NodeSet],
        gp: &mut u64,
        out: &mut String,
    ) {
        let t = &m.topo;
        let o = &self.objs[idx];
        let pad = "  ".repeat(depth);
        let here: NodeSet = o.memory.iter().map(|&i| t.nodes[i].id).collect();
        let above = above.union(&here);
        let nodeset = hwloc_bitmap(above.union(&below[idx]).iter());
        let cpuset = hwloc_bitmap(o.cpuset.iter());
        let _ = write!(
            out,
            "{pad}<object type=\"{}\"{} cpuset=\"{cpuset}\" complete_cpuset=\"{cpuset}\"",
            o.ty,
            if idx == 0 { " os_index=\"0\"" } else { "" },
        );
        if idx == 0 {
            let _ = write!(out, " allowed_cpuset=\"{cpuset}\"");
        }
        let _ = write!(out, " nodeset=\"{nodeset}\" complete_nodeset=\"{nodeset}\"");
        if idx == 0 {
            let _ = write!(out, " allowed_nodeset=\"{nodeset}\"");
        }
        let _ = write!(out, " gp_index=\"{gp}\"{}", o.attrs);
        *gp += 1;
        if o.children.is_empty() && o.memory.is_empty() && idx != 0 {
            out.push_str("/>\n");
            return;
        }
        out.push_str(">\n");
        if idx == 0 {
            let _ = writeln!(out, "{pad}  <info name=\"Backend\" value=\"Linux\"/>");
        }
        for &i in &o.memory {
            let node = &t.nodes[i];
            let cs = hwloc_bitmap(self.node_cpuset[i].iter());
            let ns = hwloc_bitmap(std::iter::once(node.id));
            let _ = write!(
                out,
                "{pad}  <object type=\"NUMANode\" os_index=\"{}\" cpuset=\"{cs}\" complete_cpuset=\"{cs}\" nodeset=\"{ns}\" complete_nodeset=\"{ns}\" gp_index=\"{gp}\"",
                node.id
            );
            *gp += 1;
            let mem = node.memory_bytes.unwrap();
            // hwloc leaves `local_memory` out when it is 0 (a memoryless node).
            if mem != 0 {
                let _ = write!(out, " local_memory=\"{mem}\"");
            }
            out.push_str(">\n");
            for (size, count) in [(4096u64, mem / 4096), (2 << 20, 0), (1 << 30, 0)] {
                let _ = writeln!(
                    out,
                    "{pad}    <page_type size=\"{size}\" count=\"{count}\"/>"
                );
            }
            let _ = writeln!(out, "{pad}  </object>");
        }
        for &c in &o.children {
            self.emit(m, c, depth + 1, &above, below, gp, out);
        }
        let _ = writeln!(out, "{pad}</object>");
    }
}
