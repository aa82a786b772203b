//! Small sysfs trees written by the tests themselves, and where the shared captured machines are.
#![allow(dead_code)] // each test binary uses a part

use std::path::{Path, PathBuf};

use loci_topo::Source;

/// `../shared/topologies/SUB` of the repository root; `LOCI_SHARED` overrides, and a git worktree
/// nested deeper finds it in the nearest ancestor that has one. `None`, with a note on stderr
/// naming what `skipping` skips, when it is absent.
pub fn shared_topologies(sub: &str, skipping: &str) -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("LOCI_SHARED") {
        Some(s) => vec![PathBuf::from(s).join("topologies").join(sub)],
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .skip(3)
            .map(|a| a.join("shared/topologies").join(sub))
            .collect(),
    };
    let found = candidates.iter().find(|p| p.is_dir()).cloned();
    if found.is_none() {
        eprintln!(
            "note: ../shared/topologies/{sub} is absent (looked at {}); skipping {skipping}",
            candidates
                .first()
                .map_or(String::new(), |p| p.display().to_string())
        );
    }
    found
}

/// Loading `source` fails with a message that names every one of `parts` (the bad file, the bad
/// text, what was expected).
pub fn assert_load_fails_naming(source: &Source, parts: &[&str]) {
    let e = loci_topo::load(source).unwrap_err().to_string();
    for p in parts {
        assert!(e.contains(p), "{e:?} does not name {p:?}");
    }
}

/// A tree under the test target's scratch directory, made anew.
pub struct Tree(pub PathBuf);

impl Tree {
    pub fn new(name: &str) -> Tree {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("fake-roots")
            .join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Tree(d)
    }
    pub fn file(&self, rel: &str, text: &str) -> &Self {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
        self
    }
    pub fn link(&self, rel: &str, target: &str) -> &Self {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, p).unwrap();
        self
    }
    /// A cpu with topology and one private L2.
    pub fn cpu(&self, id: u32, package: u32, core: u32) -> &Self {
        let c = format!("sys/devices/system/cpu/cpu{id}");
        self.file(
            &format!("{c}/topology/physical_package_id"),
            &format!("{package}\n"),
        )
        .file(&format!("{c}/topology/core_id"), &format!("{core}\n"))
        .file(&format!("{c}/cache/index0/level"), "2\n")
        .file(&format!("{c}/cache/index0/type"), "Unified\n")
        .file(&format!("{c}/cache/index0/size"), "1024K\n")
        .file(
            &format!("{c}/cache/index0/shared_cpu_list"),
            &format!("{id}\n"),
        )
    }
    pub fn node(&self, id: u32, cpus: &str, mem_kb: u64, dist: &str) -> &Self {
        let n = format!("sys/devices/system/node/node{id}");
        self.file(&format!("{n}/cpulist"), &format!("{cpus}\n"))
            .file(
                &format!("{n}/meminfo"),
                &format!(
                    "Node {id} MemTotal: {mem_kb} kB\nNode {id} MemFree: {} kB\n",
                    mem_kb / 2
                ),
            )
            .file(&format!("{n}/distance"), &format!("{dist}\n"))
    }
}

/// Nodes 0, 2 (memoryless) and 5 (CPU-less), cpus 0-3 with cpu 3 offline (in node 2 only by its
/// `node2` link), one NIC on node 5's PCI root, a virtual interface and an NVMe namespace.
pub fn sparse_machine(name: &str) -> Tree {
    let t = Tree::new(name);
    t.cpu(0, 0, 0).cpu(1, 0, 1).cpu(2, 1, 0);
    t.file("sys/devices/system/cpu/cpu3/online", "0\n")
        .link("sys/devices/system/cpu/cpu3/node2", "../../node/node2")
        .file("sys/devices/system/cpu/online", "0-2\n");
    t.node(0, "0-1", 4 << 20, "10 20 30")
        .node(2, "2", 0, "20 10 30")
        .node(5, "", 8 << 20, "30 30 10");
    t.file("sys/devices/pci0000:00/0000:00:01.0/numa_node", "5\n")
        .file(
            "sys/devices/pci0000:00/0000:00:01.0/net/ens1/addr_len",
            "6\n",
        )
        .link(
            "sys/class/net/ens1",
            "../../devices/pci0000:00/0000:00:01.0/net/ens1",
        )
        .file("sys/devices/virtual/net/lo/addr_len", "6\n")
        .link("sys/class/net/lo", "../../devices/virtual/net/lo")
        .file("sys/devices/pci0000:00/0000:00:02.0/numa_node", "0\n")
        .file(
            "sys/devices/pci0000:00/0000:00:02.0/nvme/nvme0/nvme0n1/size",
            "1\n",
        )
        .link(
            "sys/class/block/nvme0n1",
            "../../devices/pci0000:00/0000:00:02.0/nvme/nvme0/nvme0n1",
        )
        .file(
            "sys/devices/pci0000:00/0000:00:02.0/nvme/nvme0/nvme0n1/nvme0n1p1/partition",
            "1\n",
        )
        .link(
            "sys/class/block/nvme0n1p1",
            "../../devices/pci0000:00/0000:00:02.0/nvme/nvme0/nvme0n1/nvme0n1p1",
        )
        .file("sys/devices/virtual/block/loop0/size", "0\n")
        .link("sys/class/block/loop0", "../../devices/virtual/block/loop0");
    t
}
