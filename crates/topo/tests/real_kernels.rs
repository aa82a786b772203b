//! What real kernels write, each on a small tree built here: values padded with NUL bytes and
//! white space, empty files, files old kernels lack, distance rows for offline nodes, node
//! cpulists naming absent cpus, cpus without a topology directory; cgroup cpusets found the ways
//! hwloc finds them; node kinds; firmware-duplicated nodes. Unusable files are errors naming the
//! file with its bytes escaped, and no file content makes the reader panic.

mod common;

use common::{assert_load_fails_naming, sparse_machine, Tree};
use loci_topo::{NodeKind, Source, Topology};
use proptest::prelude::*;

fn load(t: &Tree) -> Topology {
    loci_topo::load(&Source::Sysfs(t.0.clone())).unwrap_or_else(|e| panic!("{e}"))
}

/// Two nodes of two cpus each, written with the given padding after every value.
fn padded(name: &str, pad: &str) -> Tree {
    let t = Tree::new(name);
    for (id, pkg) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
        let c = format!("sys/devices/system/cpu/cpu{id}");
        t.file(
            &format!("{c}/topology/physical_package_id"),
            &format!("{pkg}{pad}"),
        )
        .file(&format!("{c}/topology/core_id"), &format!("{id}{pad}"))
        .file(&format!("{c}/online"), &format!("1{pad}"))
        .file(&format!("{c}/cache/index0/level"), &format!("2{pad}"))
        .file(&format!("{c}/cache/index0/type"), &format!("Unified{pad}"))
        .file(&format!("{c}/cache/index0/size"), &format!("1024K{pad}"))
        .file(
            &format!("{c}/cache/index0/shared_cpu_map"),
            &format!("{:08x}{pad}", 1u32 << id),
        );
    }
    t.file("sys/devices/system/cpu/online", &format!("0-3{pad}"));
    for (id, cpus, dist) in [(0, "0-1", "10 21"), (1, "2-3", "21 10")] {
        let n = format!("sys/devices/system/node/node{id}");
        t.file(&format!("{n}/cpulist"), &format!("{cpus}{pad}"))
            .file(&format!("{n}/distance"), &format!("{dist}{pad}"))
            .file(
                &format!("{n}/meminfo"),
                &format!("Node {id} MemTotal: 1024 kB\nNode {id} MemFree: 512 kB{pad}"),
            );
    }
    t
}

#[test]
fn values_padded_with_nuls_and_white_space_read_the_same() {
    let plain = load(&padded("pad-none", "\n"));
    for (name, pad) in [
        ("pad-nul", "\0"),
        ("pad-nuls-newline", "\n\0\0\0"),
        ("pad-blanks", " \t \n"),
        ("pad-mixed", "\0 \n\0"),
    ] {
        let mut t = load(&padded(name, pad));
        t.source.clone_from(&plain.source);
        assert_eq!(t, plain, "padding {pad:?}");
    }
    assert_eq!(plain.distance(0, 1), Some(21));
    assert_eq!(plain.node(1).unwrap().memory_bytes, Some(1 << 20));
    assert_eq!(plain.caches.len(), 4);
}

#[test]
fn empty_files_mean_not_said() {
    let t = padded("empty", "\n");
    t.file("sys/devices/system/cpu/cpu1/online", "") // empty online: online
        .file("sys/devices/system/cpu/online", "")
        .file("sys/devices/system/cpu/cpu2/topology/core_id", "")
        .file("sys/devices/system/cpu/cpu3/cache/index0/type", "")
        .file("sys/devices/system/cpu/cpu0/cache/index0/size", "\0")
        .file("sys/devices/system/node/node1/distance", "")
        .file("sys/devices/system/node/node1/meminfo", "");
    let topo = load(&t);
    assert!(topo.cpus.iter().all(|c| c.online));
    assert_eq!(topo.allowed_cpus().to_string(), "0-3");
    // No core_id: a core of its own.
    assert_eq!(topo.smt_siblings(2).to_string(), "2");
    // No type: cpu 3's cache is unknown; no size: 0 bytes.
    assert!(topo.caches.iter().all(|c| !c.cpus.contains(3)));
    assert_eq!(
        topo.caches
            .iter()
            .find(|c| c.cpus.contains(0))
            .unwrap()
            .size_bytes,
        0
    );
    // No distance row: the kernel's default without a SLIT.
    assert_eq!(topo.distance(1, 0), Some(20));
    assert_eq!(topo.distance(0, 1), Some(21));
    assert_eq!(topo.node(1).unwrap().memory_bytes, None);
}

#[test]
fn files_old_kernels_lack() {
    let t = Tree::new("old-kernel");
    // Cpus without topology directories, no online files; a node with only a cpumap mask and no
    // distance or meminfo.
    for id in 0..4 {
        t.file(&format!("sys/devices/system/cpu/cpu{id}/uevent"), "");
    }
    t.file("sys/devices/system/node/node0/cpumap", "0000000f\n");
    let topo = load(&t);
    assert_eq!(topo.node(0).unwrap().cpus.to_string(), "0-3");
    assert_eq!(topo.node(0).unwrap().memory_bytes, None);
    assert_eq!(topo.distances, vec![vec![10]]);
    // Each cpu without topology is a core of its own, in package 0, online.
    assert_eq!(
        topo.cpus.iter().map(|c| c.core).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert!(topo.cpus.iter().all(|c| c.package == 0 && c.online));
}

#[test]
fn distance_rows_of_offline_nodes_are_read_by_node_id() {
    // Node 0 offline (no directory); node 1's row still lists both possible nodes.
    let t = Tree::new("offline-node0");
    t.cpu(1, 1, 0).cpu(3, 1, 1);
    t.file("sys/devices/system/cpu/cpu0/online", "0\n")
        .node(1, "1,3", 1 << 20, "21 10")
        .file("sys/devices/system/node/online", "1\n")
        .file("sys/devices/system/node/possible", "0-1\n");
    let topo = load(&t);
    assert_eq!(topo.node_ids().to_string(), "1");
    assert_eq!(topo.distances, vec![vec![10]]);
    assert!(
        topo.notes.iter().any(|n| n.contains("offline nodes")),
        "{:?}",
        topo.notes
    );
    // An online node without a directory: rows of three values for directories 0 and 2.
    let t = Tree::new("online-without-dir");
    t.cpu(0, 0, 0).cpu(1, 1, 0);
    t.node(0, "0", 1 << 20, "10 20 30")
        .node(2, "1", 1 << 20, "30 20 10")
        .file("sys/devices/system/node/online", "0-2\n");
    let topo = load(&t);
    assert_eq!(topo.distance(0, 2), Some(30));
    assert_eq!(topo.distance(2, 2), Some(10));
    // No list lines up: an error that names the file, the row and the lists.
    t.file("sys/devices/system/node/online", "0,2\n")
        .file("sys/devices/system/node/possible", "0,2,7,9\n");
    assert_load_fails_naming(
        &Source::Sysfs(t.0.clone()),
        &["node0/distance", "`10 20 30`", "0,2,7,9"],
    );
}

#[test]
fn node_cpulists_are_cut_to_present_cpus() {
    let t = Tree::new("absent-cpus");
    t.cpu(0, 0, 0).cpu(1, 0, 1).cpu(8, 1, 0).cpu(9, 1, 1);
    t.node(0, "0-7", 1 << 20, "10 20")
        .node(1, "8-15", 1 << 20, "20 10")
        .file("sys/devices/system/cpu/present", "0-1,8-9\n");
    let topo = load(&t);
    assert_eq!(topo.node(0).unwrap().cpus.to_string(), "0-1");
    assert_eq!(topo.node(1).unwrap().cpus.to_string(), "8-9");
    assert_eq!(topo.notes.len(), 2, "{:?}", topo.notes);
    assert!(topo.notes[0].contains("node 0") && topo.notes[0].contains("2-7"));
    // A cpu two nodes list stays in the first.
    t.file("sys/devices/system/node/node1/cpulist", "1,8-9\n");
    let topo = load(&t);
    assert_eq!(topo.node(1).unwrap().cpus.to_string(), "8-9");
    assert_eq!(topo.cpu(1).unwrap().node, Some(0));
}

#[test]
fn unusable_files_are_named_with_their_bytes() {
    let t = padded("bad-bytes", "\n");
    t.file("sys/devices/system/node/node0/distance", "10 \x01 21\n");
    assert_load_fails_naming(&Source::Sysfs(t.0.clone()), &["node0/distance", "\\x01"]);
    let t = padded("not-text", "\n");
    std::fs::write(
        t.0.join("sys/devices/system/node/node1/meminfo"),
        b"Node 1 MemTotal: \xff\xfe kB",
    )
    .unwrap();
    assert_load_fails_naming(
        &Source::Sysfs(t.0.clone()),
        &["node1/meminfo", "not text", "\\xff\\xfe"],
    );
    let t = padded("bad-online", "\n");
    t.file("sys/devices/system/cpu/cpu2/online", "yes\0\n");
    assert_load_fails_naming(&Source::Sysfs(t.0.clone()), &["cpu2/online", "\"yes\""]);
}

/// The files a hostile or broken tree may fill with anything.
const FILES: [&str; 12] = [
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/cpu1/online",
    "sys/devices/system/cpu/cpu1/topology/core_id",
    "sys/devices/system/cpu/cpu1/topology/core_cpus_list",
    "sys/devices/system/cpu/cpu1/cache/index0/size",
    "sys/devices/system/cpu/cpu1/cache/index0/shared_cpu_map",
    "sys/devices/system/node/node1/cpulist",
    "sys/devices/system/node/node1/distance",
    "sys/devices/system/node/node1/meminfo",
    "sys/devices/system/node/possible",
    "proc/self/cpuset",
    "proc/mounts",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// Any bytes in any of these files: the reader returns a topology or an error, never panics.
    #[test]
    fn no_file_content_panics(which in 0..FILES.len(), bytes in prop::collection::vec(any::<u8>(), 0..64),
                              text in "[0-9a-fx, \\-:\\n\\x00/]{0,40}") {
        let t = padded(&format!("garbage-{which}"), "\n");
        t.file("proc/self/cpuset", "/job\n").file("dev/cpuset/job/cpus", "0-2\n");
        std::fs::create_dir_all(t.0.join("proc")).unwrap();
        let path = t.0.join(FILES[which]);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        for content in [bytes.as_slice(), text.as_bytes()] {
            std::fs::write(&path, content).unwrap();
            if let Ok(topo) = loci_topo::load(&Source::Sysfs(t.0.clone())) {
                topo.validate().unwrap();
            }
        }
    }
}

#[test]
fn cgroup_v1_cpusets_as_hwloc_finds_them() {
    // (tree, files written, allowed cpus, allowed memory nodes)
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
        &'static str,
    );
    let cases: [Case; 3] = [
        // The legacy cpuset filesystem (no `cpuset.` prefix), found through /proc/self/cpuset
        // and /proc/mounts (no cgroup or mountinfo file): a captured tree's own restriction.
        (
            "legacy-cpuset",
            &[
                ("proc/self/cpuset", "/dummy\n"),
                ("proc/mounts", "none /dev/cpuset cpuset rw 0 0\n"),
                ("dev/cpuset/dummy/cpus", "0,2-3\n"),
                ("dev/cpuset/dummy/mems", "5\n"),
            ],
            "0,2",
            "5",
        ),
        // cgroup v1 mounted with `noprefix`, beside a v2 mount without the cpuset controller.
        (
            "noprefix",
            &[
                ("proc/self/cpuset", "/prout\n"),
                (
                    "proc/mounts",
                    "cgroup2 /dev/cgroup cgroup2 rw 0 0\ncpuset /dev/cpuset cgroup rw,relatime,cpuset,noprefix 0 0\n",
                ),
                ("dev/cgroup/cgroup.controllers", "memory pids\n"),
                ("dev/cpuset/prout/cpus", "1-2\n"),
                ("dev/cpuset/prout/mems", "0\n"),
            ],
            "1-2",
            "0",
        ),
        // v1 with effective sets: those win over the configured ones.
        (
            "v1-effective",
            &[
                ("proc/self/cgroup", "3:cpuset:/j\n"),
                ("proc/mounts", "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n"),
                ("sys/fs/cgroup/cpuset/j/cpuset.cpus", "0-3\n"),
                ("sys/fs/cgroup/cpuset/j/cpuset.mems", "0,5\n"),
                ("sys/fs/cgroup/cpuset/j/cpuset.effective_cpus", "0\n"),
                ("sys/fs/cgroup/cpuset/j/cpuset.effective_mems", "0\n"),
            ],
            "0",
            "0",
        ),
    ];
    for (name, files, cpus, mems) in cases {
        let t = sparse_machine(name);
        for (path, text) in files {
            t.file(path, text);
        }
        let topo = load(&t);
        assert_eq!(topo.allowed_cpus().to_string(), cpus, "{name}");
        assert_eq!(topo.allowed_mems().to_string(), mems, "{name}");
    }
}

#[test]
fn cgroup_v2_through_proc_self_cpuset() {
    let t = sparse_machine("v2-cpuset-path");
    t.file("proc/self/cpuset", "/uid_1/job_2/step_0\n")
        .file("proc/mounts", "none /cgroup/unified cgroup2 rw 0 0\n")
        .file(
            "cgroup/unified/uid_1/job_2/step_0/cpuset.cpus.effective",
            "1\n",
        )
        .file(
            "cgroup/unified/uid_1/job_2/step_0/cpuset.mems.effective",
            "0\n",
        );
    let topo = load(&t);
    assert_eq!(topo.allowed_cpus().to_string(), "1");
    assert_eq!(topo.allowed_mems().to_string(), "0");
    assert!(!topo.node(5).unwrap().allowed);
}

#[test]
fn node_kinds_from_the_kernels_own_descriptions() {
    let t = Tree::new("kinds");
    t.cpu(0, 0, 0).cpu(1, 0, 1);
    let d = "10 20 20 20 20";
    t.node(0, "0-1", 1 << 20, d)
        .node(1, "", 1 << 20, d)
        .node(2, "", 1 << 20, d)
        .node(3, "", 1 << 20, d)
        .node(4, "", 1 << 20, d);
    // HMAT bandwidths seen from node 0: node 1 much faster, node 2 much slower.
    for (n, bw) in [(0, 1000), (1, 4000), (2, 300), (3, 900)] {
        let init = format!("sys/devices/system/node/node{n}/access1/initiators");
        t.file(&format!("{init}/read_bandwidth"), &format!("{bw}\n"))
            .link(&format!("{init}/node0"), "../../../node0");
    }
    // Node 3 is a DAX device of an NVDIMM region; node 4 a GPU's memory.
    let dax = "sys/devices/LNXSYSTM:00/ndbus0/region1/dax1.0";
    t.file(&format!("{dax}/target_node"), "3\n")
        .link("sys/bus/dax/devices/dax1.0", &format!("../../../../{dax}"))
        .file(
            "proc/driver/nvidia/gpus/0004:04:00.0/numa_status",
            "Node:      4\nStatus:    online\n",
        );
    let topo = load(&t);
    let kinds: Vec<NodeKind> = topo.nodes.iter().map(|n| n.kind).collect();
    assert_eq!(
        kinds,
        [
            NodeKind::Dram,
            NodeKind::Hbm,
            NodeKind::Nvm,
            NodeKind::Nvm,
            NodeKind::Gpu
        ]
    );
    assert_eq!(topo.node(1).unwrap().initiators.to_string(), "0");
    assert!(topo.node(0).unwrap().initiators.is_empty());
    // GPU memory is never in a default memory set; the others are.
    assert_eq!(topo.allowed_mems().to_string(), "0-3");
    let json = serde_json::to_value(topo.to_json()).unwrap();
    assert_eq!(json["nodes"][4]["kind"], "gpu");
    assert_eq!(json["nodes"][1]["initiators"], "0");
}

#[test]
fn firmware_duplicated_nodes_are_merged() {
    let t = Tree::new("dup-nodes");
    t.cpu(0, 0, 0).cpu(1, 0, 1).cpu(2, 0, 2);
    for n in 0..3 {
        t.node(n, "0-2", 2 << 20, "10 10 10");
    }
    let topo = load(&t);
    assert_eq!(topo.node_ids().to_string(), "0");
    let n0 = topo.node(0).unwrap();
    assert_eq!(n0.merged.to_string(), "1-2");
    assert_eq!(n0.kernel_ids().to_string(), "0-2");
    assert_eq!(n0.memory_bytes, Some(6 << 30));
    assert_eq!(topo.distances, vec![vec![10]]);
    assert!(
        topo.notes[0].contains("merged into node 0"),
        "{:?}",
        topo.notes
    );
    // The same cpus at a remote distance are two real nodes (memory-only siblings are not
    // duplicates either): nothing is merged.
    let t = Tree::new("same-cpus-remote");
    t.cpu(0, 0, 0);
    t.node(0, "0", 1 << 20, "10 20")
        .node(1, "0", 1 << 20, "20 10");
    let topo = load(&t);
    assert_eq!(topo.node_ids().to_string(), "0-1");
    assert!(topo.node(0).unwrap().merged.is_empty());
}
