//! The sysfs reader against real machines: hwloc's captured `/sys` trees in
//! `../shared/topologies/sysfs`, checked against hwloc's own rendering of the same machine (the
//! `.console` file beside each tarball, or `.expected.xml` where there is no console): node ids,
//! cpus per node, memory per node, the cpus of each core, and which cpus share each L2 and L3.
//!
//! The trees are unpacked with the system `tar` (bzip2 is installed by scripts/install-deps).
//! Without ../shared the test prints a note and passes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use loci_topo::{CpuSet, NodeKind, Source, Topology};

mod common;

/// `../shared/topologies` (see `common::shared_topologies`).
fn shared() -> Option<PathBuf> {
    common::shared_topologies("", "the captured-machine tests")
}

/// Unpacks `NAME.tar.bz2` (once: a marker naming the tarball's size and mtime makes later runs
/// reuse the tree) and returns the machine's root (the one directory the tarball holds).
fn unpack(tarball: &Path) -> PathBuf {
    let name = tarball.file_name().unwrap().to_str().unwrap();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("captured")
        .join(name.trim_end_matches(".tar.bz2"));
    let meta = std::fs::metadata(tarball).unwrap();
    let stamp = format!(
        "{} {:?}",
        meta.len(),
        meta.modified()
            .ok()
            .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
    );
    let marker = dir.join(".unpacked");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(stamp.as_str()) {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let st = Command::new("tar")
            .arg("-xjf")
            .arg(tarball)
            .arg("-C")
            .arg(&dir)
            .status()
            .expect("run tar (install bzip2 and tar: scripts/install-deps)");
        assert!(st.success(), "tar -xjf {} failed", tarball.display());
        std::fs::write(&marker, &stamp).unwrap();
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(entries.len(), 1, "{name} should hold one directory");
    entries.pop().unwrap()
}

/// What hwloc says about a machine (only what this process may use: lstopo leaves out cpus
/// and nodes outside the cgroup cpuset, and GPU memory nodes).
#[derive(Debug, Default)]
struct Oracle {
    /// (os index, cpus, memory lower bound, memory upper bound exclusive); for a CPU-less node
    /// the cpus of the object it hangs off (its initiators).
    nodes: Vec<(u32, CpuSet, u64, u64)>,
    /// Rendered with `--filter all:structure` (NAME.test says): objects that add no structure
    /// (cores, private caches) are left out.
    structure_only: bool,
    /// The NUMA latency matrix by os index, when hwloc printed one.
    distances: Option<std::collections::BTreeMap<(u32, u32), u32>>,
    l2: BTreeSet<CpuSet>,
    l3: BTreeSet<CpuSet>,
    /// cpus of each Package object.
    packages: BTreeSet<CpuSet>,
    /// cpus of each Core object (SMT siblings).
    cores: BTreeSet<CpuSet>,
}

/// `8190MiB` -> the byte range hwloc's print stands for (lstopo rounds to the nearest unit).
fn size_range(s: &str) -> (u64, u64) {
    let units = [("KiB", 10), ("MiB", 20), ("GiB", 30), ("TiB", 40)];
    for (u, shift) in units {
        if let Some(v) = s.strip_suffix(u) {
            let v: u64 = v.parse().unwrap();
            let half = 1u64 << (shift - 1);
            return ((v << shift) - half, (v << shift) + half);
        }
    }
    panic!("size `{s}`")
}

/// Parses lstopo's text rendering (`.console`): the object tree by indentation.
fn parse_console(text: &str) -> Oracle {
    struct Obj {
        indent: usize,
        kind: String,
        line: String,
        parent: Option<usize>,
    }
    let mut objs: Vec<Obj> = Vec::new();
    let mut stack: Vec<usize> = Vec::new();
    let mut matrix: Vec<Vec<u32>> = Vec::new();
    let mut in_matrix = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("Relative latency matrix") {
            in_matrix = matrix.is_empty();
            continue;
        }
        if in_matrix {
            match t
                .split_whitespace()
                .map(|v| v.parse::<u32>())
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(row) if !row.is_empty() => matrix.push(row),
                _ if t.starts_with("index") => matrix.push(
                    t.split_whitespace()
                        .skip(1)
                        .map(|v| v.parse().unwrap())
                        .collect(),
                ),
                _ => in_matrix = false,
            }
            continue;
        }
    }
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("depth") || t.starts_with("Special depth") {
            break;
        }
        if t.is_empty() {
            continue;
        }
        let indent = line.len() - t.len();
        let kind = t.split([' ', '(']).next().unwrap().to_string();
        while let Some(&top) = stack.last() {
            if objs[top].indent >= indent {
                stack.pop();
            } else {
                break;
            }
        }
        objs.push(Obj {
            indent,
            kind,
            line: t.to_string(),
            parent: stack.last().copied(),
        });
        stack.push(objs.len() - 1);
    }
    let attr = |line: &str, key: &str| -> Option<String> {
        let i = line.find(key)?;
        let rest = &line[i + key.len()..];
        Some(rest.split([' ', ')']).next().unwrap().to_string())
    };
    // PUs in the subtree of each object.
    let n = objs.len();
    let mut pus: Vec<CpuSet> = vec![CpuSet::new(); n];
    for i in 0..n {
        if objs[i].kind == "PU" {
            let id: u32 = attr(&objs[i].line, "P#").unwrap().parse().unwrap();
            let mut p = Some(i);
            while let Some(j) = p {
                pus[j].insert(id);
                p = objs[j].parent;
            }
        }
    }
    let mut o = Oracle::default();
    let mut logical_to_os = std::collections::BTreeMap::new();
    for (i, obj) in objs.iter().enumerate() {
        match obj.kind.as_str() {
            k if k.starts_with("NUMANode") => {
                let id: u32 = attr(&obj.line, "P#").unwrap().parse().unwrap();
                let logical: u32 = attr(&obj.line, "L#").unwrap().parse().unwrap();
                logical_to_os.insert(logical, id);
                let (lo, hi) = size_range(&attr(&obj.line, "local=").unwrap());
                let cpus = obj.parent.map(|p| pus[p].clone()).unwrap_or_default();
                o.nodes.push((id, cpus, lo, hi));
            }
            "L2Cache" => {
                o.l2.insert(pus[i].clone());
            }
            "L3Cache" => {
                o.l3.insert(pus[i].clone());
            }
            "Package" => {
                o.packages.insert(pus[i].clone());
            }
            "Core" => {
                o.cores.insert(pus[i].clone());
            }
            _ => {}
        }
    }
    o.nodes.sort_by_key(|n| n.0);
    // The matrix: a header row of logical indexes, then rows that start with their own index.
    if let Some((header, rows)) = matrix.split_first() {
        let mut d = std::collections::BTreeMap::new();
        for row in rows {
            let from = logical_to_os[&row[0]];
            for (col, v) in header.iter().zip(&row[1..]) {
                d.insert((from, logical_to_os[col]), *v);
            }
        }
        o.distances = Some(d);
    }
    o
}

fn groups(t: &Topology, level: u8) -> BTreeSet<CpuSet> {
    let allowed = t.allowed_cpus();
    t.caches_at(level)
        .map(|c| c.cpus.intersection(&allowed))
        .filter(|c| !c.is_empty())
        .collect()
}

/// The allowed cpus of each core (SMT siblings together).
fn cores(t: &Topology) -> BTreeSet<CpuSet> {
    let allowed = t.allowed_cpus();
    t.cpus
        .iter()
        .map(|c| t.smt_siblings(c.id).intersection(&allowed))
        .filter(|c| !c.is_empty())
        .collect()
}

/// Where loci deliberately differs from hwloc's rendering of a captured machine (each is
/// documented in docs/topology.md, "Captured machines"): the tree, and what the check expects.
enum Known {
    /// hwloc keeps the first of the duplicated firmware nodes and its memory; loci merges them
    /// and counts the memory of all (a policy on the merged node binds to every kernel node).
    MergedMemory { node: u32, merged: &'static str },
    /// A cgroup v1 whose effective sets are narrower than the configured ones: loci honours
    /// `cpuset.effective_{cpus,mems}` (what the kernel enforces), hwloc reads `cpuset.{cpus,mems}`.
    /// The check asserts loci's sets, then compares the rest with hwloc over the configured ones.
    EffectiveNarrower {
        cpus: &'static str,
        nodes: &'static str,
    },
}

fn known(name: &str) -> Option<Known> {
    match name {
        "8em64t-2s2ca2c-buggynuma" => Some(Known::MergedMemory {
            node: 0,
            merged: "1-7",
        }),
        "nvidiagpunumanodes" => Some(Known::EffectiveNarrower {
            cpus: "0-15",
            nodes: "0",
        }),
        _ => None,
    }
}

/// The nodes loci plans memory for on this machine as hwloc shows them: allowed, not GPU memory.
fn shown_nodes(t: &Topology) -> Vec<&loci_topo::Node> {
    t.nodes
        .iter()
        .filter(|n| n.allowed && n.kind != NodeKind::Gpu)
        .collect()
}

/// Compares loci's reading with hwloc's; returns one summary row for the agreement table.
fn check(name: &str, t: &Topology, o: &Oracle) -> String {
    t.validate().unwrap();
    let allowed = t.allowed_cpus();
    // `--filter all:structure` renderings (see NAME.test) leave Core objects out.
    if !o.cores.is_empty() {
        assert_eq!(cores(t), o.cores, "{name}: allowed cpus of each core");
    }
    let shown = shown_nodes(t);
    let ids: Vec<u32> = shown.iter().map(|n| n.id).collect();
    let want: Vec<u32> = o.nodes.iter().map(|n| n.0).collect();
    assert_eq!(ids, want, "{name}: allowed node ids");
    for (node, (id, cpus, lo, hi)) in shown.iter().zip(&o.nodes) {
        // A CPU-less node sits below its initiators in hwloc's tree.
        let ours = if node.cpus.is_empty() {
            node.initiators
                .iter()
                .filter_map(|i| t.node(i))
                .fold(CpuSet::new(), |a, n| a.union(&n.cpus))
        } else {
            node.cpus.clone()
        };
        assert_eq!(
            &ours.intersection(&allowed),
            cpus,
            "{name}: allowed cpus of node {id}"
        );
        let m = node.memory_bytes.expect("memory");
        match known(name) {
            Some(Known::MergedMemory { node: k, merged }) if k == *id => {
                assert_eq!(node.merged.to_string(), merged, "{name}: merged nodes");
                assert!(
                    m > *hi,
                    "{name}: node {id} memory {m} should hold the merged nodes'"
                );
            }
            _ => assert!(
                (*lo..*hi).contains(&m),
                "{name}: node {id} memory {m} not in hwloc's [{lo}, {hi})"
            ),
        }
    }
    if let Some(d) = &o.distances {
        for a in &ids {
            for b in &ids {
                assert_eq!(
                    t.distance(*a, *b),
                    d.get(&(*a, *b)).copied(),
                    "{name}: distance {a} -> {b}"
                );
            }
        }
    }
    for (level, want) in [(2, &o.l2), (3, &o.l3)] {
        let ours = groups(t, level);
        assert!(
            want.is_subset(&ours),
            "{name}: hwloc's L{level} instances {want:?} are not all in ours {ours:?}"
        );
        // hwloc drops a cache whose cpus equal an enclosing Package's when its sysfs data
        // conflict (the `pci-conflicts` capture: cpu2/cache/index3/shared_cpu_list still lists
        // the L3 of package 2). Anything extra must be such a case, never a made-up instance.
        // `--filter all:structure` also drops caches that add no structure (a private L2).
        for extra in ours.difference(want).filter(|_| !o.structure_only) {
            assert!(
                o.packages.contains(extra),
                "{name}: L{level} over cpus {extra} is not in hwloc's view"
            );
        }
    }
    let kinds: BTreeSet<String> = t
        .nodes
        .iter()
        .filter(|n| n.kind != NodeKind::Dram)
        .map(|n| format!("{} {}", n.kind.name(), n.id))
        .collect();
    format!(
        "| {name} | {} ({}) | {} of {} | {} | {} | {} |",
        ids.len(),
        t.nodes.len(),
        allowed.len(),
        t.cpus.len(),
        if o.distances.is_some() { "equal" } else { "-" },
        if kinds.is_empty() {
            "-".to_string()
        } else {
            kinds.into_iter().collect::<Vec<_>>().join(", ")
        },
        t.notes.len()
    )
}

#[test]
fn captured_trees_agree_with_hwloc() {
    let Some(shared) = shared() else { return };
    let dir = shared.join("sysfs");
    let mut tarballs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(".tar.bz2"))
        .collect();
    tarballs.sort();
    assert!(
        tarballs.len() >= 15,
        "expected the 15 captured machines, found {}",
        tarballs.len()
    );
    let mut rows = Vec::new();
    for tb in &tarballs {
        let name = tb
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .trim_end_matches(".tar.bz2")
            .to_string();
        let root = unpack(tb);
        let mut t =
            loci_topo::load(&Source::Sysfs(root.clone())).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(Known::EffectiveNarrower { cpus, nodes }) = known(&name) {
            assert_eq!(t.allowed_cpus().to_string(), cpus, "{name}: allowed cpus");
            let mems: loci_topo::NodeSet =
                t.nodes.iter().filter(|n| n.allowed).map(|n| n.id).collect();
            assert_eq!(mems.to_string(), nodes, "{name}: allowed nodes");
            // hwloc's configured sets allow everything present on this capture.
            t.cpus.iter_mut().for_each(|c| c.allowed = true);
            t.nodes.iter_mut().for_each(|n| n.allowed = true);
        }
        let console = dir.join(format!("{name}.console"));
        let xml = [
            dir.join(format!("{name}.expected.xml")),
            dir.join(format!("{name}.xml")),
        ]
        .into_iter()
        .find(|p| p.exists());
        let mut oracle = if console.exists() {
            parse_console(&std::fs::read_to_string(&console).unwrap())
        } else if let Some(xml) = xml {
            if name.contains("nvme") {
                check_devices(&name, &t, &xml);
            }
            oracle_from_xml(&xml)
        } else {
            panic!("{name}: no .console, .xml or .expected.xml beside the tarball");
        };
        oracle.structure_only = std::fs::read_to_string(dir.join(format!("{name}.test")))
            .is_ok_and(|t| t.contains("all:structure"));
        for n in &t.notes {
            eprintln!("{name}: note: {n}");
        }
        rows.push(check(&name, &t, &oracle));
    }
    eprintln!(
        "| machine | nodes allowed (present) | cpus allowed | distances | node kinds | notes |"
    );
    eprintln!("|---|---|---|---|---|---|");
    for r in &rows {
        eprintln!("{r}");
    }
    assert_eq!(rows.len(), tarballs.len());
}

/// Network and block devices: where the kernel names a home node, it is hwloc's too.
fn check_devices(name: &str, t: &Topology, xml: &Path) {
    let h = loci_topo::load(&Source::HwlocXml(xml.to_path_buf())).unwrap();
    let mut compared = 0;
    for d in &t.devices {
        let theirs = h.devices.iter().find(|x| x.name == d.name);
        if let (Some(ours), Some(theirs)) = (d.node, theirs) {
            assert_eq!(Some(ours), theirs.node, "{name}: home node of {}", d.name);
            compared += 1;
        }
    }
    assert!(compared >= 5, "{name}: only {compared} devices compared");
}

/// hwloc's expected XML as an oracle: read with loci's own XML reader (tested on its own in
/// tests/xml.rs) -- it is hwloc's view of the same machine, independent of the sysfs reader.
fn oracle_from_xml(path: &Path) -> Oracle {
    let t = loci_topo::load(&Source::HwlocXml(path.to_path_buf())).unwrap();
    Oracle {
        nodes: t
            .nodes
            .iter()
            .map(|n| {
                let m = n.memory_bytes.unwrap();
                (n.id, n.cpus.clone(), m, m + 1)
            })
            .collect(),
        l2: groups(&t, 2),
        l3: groups(&t, 3),
        packages: BTreeSet::new(),
        cores: cores(&t),
        structure_only: false,
        distances: Some(
            t.nodes
                .iter()
                .flat_map(|a| t.nodes.iter().map(move |b| (a.id, b.id)))
                .map(|(a, b)| ((a, b), t.distance(a, b).unwrap()))
                .collect(),
        ),
    }
}

#[test]
fn console_parser_reads_nesting() {
    let text = "\
Machine (P#0 total=16GiB)
  Package L#0 (P#0 total=8190MiB)
    NUMANode L#0 (P#0 local=8190MiB total=8190MiB)
    L2Cache L#0 (size=1024KiB)
      Core L#0 (P#0)
        PU L#0 (P#0)
        PU L#1 (P#4)
  Package L#1 (P#1)
    NUMANode L#1 (P#2 local=8GiB total=8GiB)
    L2Cache L#1 (size=1024KiB)
      Core L#1 (P#0)
        PU L#2 (P#1)
depth 0:           1 Machine (type #0)
";
    let o = parse_console(text);
    assert_eq!(o.nodes.len(), 2);
    assert_eq!(o.nodes[0].0, 0);
    assert_eq!(o.nodes[0].1.to_string(), "0,4");
    assert_eq!(o.nodes[0].2, (8190 << 20) - (1 << 19));
    assert_eq!(o.nodes[1].0, 2);
    assert_eq!(o.nodes[1].1.to_string(), "1");
    assert_eq!(o.l2.len(), 2);
    assert!(o.l3.is_empty());
}
