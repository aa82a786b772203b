//! The sysfs reader on small trees written by the test: sparse node ids, CPU-less and memoryless
//! nodes, an offline cpu, a kernel without NUMA, and the live-root rules for allowed cpus and
//! nodes (cgroup v1 and v2 cpusets, `Mems_allowed_list`) read through a root path.

mod common;

use common::{assert_load_fails_naming, sparse_machine, Tree};
use loci_topo::{CacheKind, DeviceKind, Source};

#[test]
fn sparse_cpuless_memoryless_offline() {
    let t = sparse_machine("sparse");
    let topo = loci_topo::load(&Source::Sysfs(t.0.clone())).unwrap();
    let ids: Vec<u32> = topo.nodes.iter().map(|n| n.id).collect();
    assert_eq!(ids, [0, 2, 5]);
    assert_eq!(topo.node(2).unwrap().cpus.to_string(), "2-3");
    assert_eq!(topo.node(5).unwrap().cpus.to_string(), "");
    assert_eq!(topo.node(2).unwrap().memory_bytes, Some(0));
    assert_eq!(topo.node(5).unwrap().memory_bytes, Some(8 << 30));
    assert_eq!(topo.node(5).unwrap().free_bytes, Some(4 << 30));
    assert_eq!(topo.allowed_mems().to_string(), "0,5");
    let c3 = topo.cpu(3).unwrap();
    assert!(!c3.online);
    assert_eq!(c3.node, Some(2));
    assert_eq!(topo.allowed_cpus().to_string(), "0-2");
    // core ids unique machine-wide: cpu 2 is core 0 of package 1.
    let cores: Vec<u32> = topo.cpus.iter().map(|c| c.core).collect();
    assert_eq!(cores[..3], [0, 1, 2]);
    assert_eq!(topo.distance(2, 5), Some(30));
    assert_eq!(topo.hops(0, 2), Some(1));
    assert_eq!(topo.hops(0, 5), Some(2));
    assert_eq!(topo.caches.len(), 3);
    assert!(topo.caches.iter().all(|c| c.kind == CacheKind::Unified));
    let devs: Vec<(String, DeviceKind, Option<u32>)> = topo
        .devices
        .iter()
        .map(|d| (d.name.clone(), d.kind, d.node))
        .collect();
    assert_eq!(
        devs,
        [
            ("ens1".to_string(), DeviceKind::Net, Some(5)),
            ("nvme0n1".to_string(), DeviceKind::Block, Some(0)),
        ]
    );
    // A captured tree without a cgroup cpuset allows everything present.
    assert!(topo.nodes.iter().all(|n| n.allowed));
    assert!(topo.notes.is_empty(), "{:?}", topo.notes);
}

#[test]
fn numa_off_kernel_is_one_node() {
    let t = Tree::new("numa-off");
    t.cpu(0, 0, 0).cpu(1, 0, 0).cpu(2, 0, 1).cpu(3, 0, 1);
    t.file("proc/meminfo", "MemTotal: 1024 kB\nMemFree: 512 kB\n");
    let topo = loci_topo::load(&Source::Sysfs(t.0.clone())).unwrap();
    assert_eq!(topo.nodes.len(), 1);
    assert_eq!(topo.nodes[0].cpus.to_string(), "0-3");
    assert_eq!(topo.nodes[0].memory_bytes, Some(1 << 20));
    assert_eq!(topo.distances, vec![vec![10]]);
    assert_eq!(topo.smt_siblings(2).to_string(), "2-3");
}

#[test]
fn bad_files_are_named() {
    let t = sparse_machine("bad-distance");
    t.file("sys/devices/system/node/node2/distance", "20 10\n");
    assert_load_fails_naming(
        &Source::Sysfs(t.0.clone()),
        &[
            "node2/distance",
            "2 distances, but 3 node directories (0,2,5)",
            "`20 10`",
        ],
    );
    let t = sparse_machine("bad-cpulist");
    t.file("sys/devices/system/node/node0/cpulist", "0-x\n");
    assert_load_fails_naming(&Source::Sysfs(t.0.clone()), &["node0/cpulist", "`0-x`"]);
    assert_load_fails_naming(
        &Source::Sysfs("/nonexistent-root".into()),
        &["/nonexistent-root/sys/devices/system/cpu"],
    );
}

#[test]
fn live_root_cgroup_v2_and_mems_allowed() {
    let t = sparse_machine("live-v2");
    t.file("proc/self/cgroup", "0::/job.slice/run-7.scope\n")
        .file(
            "proc/self/mountinfo",
            "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
        )
        .file(
            "proc/self/status",
            "Cpus_allowed_list:\t0-3\nMems_allowed_list:\t0-2,5\n",
        )
        // The scope has no cpuset files (controller not enabled there): its parent's apply.
        .file("sys/fs/cgroup/job.slice/run-7.scope/cgroup.procs", "1\n")
        .file("sys/fs/cgroup/job.slice/cpuset.cpus.effective", "1-2\n")
        .file("sys/fs/cgroup/job.slice/cpuset.mems.effective", "0,2\n");
    let topo = loci_topo::load(&Source::Live { root: t.0.clone() }).unwrap();
    assert_eq!(topo.allowed_cpus().to_string(), "1-2");
    assert!(!topo.cpu(0).unwrap().allowed);
    assert!(topo.node(0).unwrap().allowed);
    assert!(!topo.node(5).unwrap().allowed);
    // Node 2 is allowed but has no memory: not a place to allocate.
    assert_eq!(topo.allowed_mems().to_string(), "0");
    assert_eq!(topo.allowed_cpus_of(0).to_string(), "1");
    assert_eq!(topo.source, format!("sysfs:{}", t.0.display()));
}

#[test]
fn live_root_cgroup_v1_and_affinity_from_status() {
    let t = sparse_machine("live-v1");
    t.file(
        "proc/self/cgroup",
        "4:memory:/x\n3:cpuset:/batch/42\n0::/\n",
    )
    .file(
        "proc/self/mountinfo",
        "33 25 0:28 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n\
             38 33 0:33 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n",
    )
    .file(
        "proc/self/status",
        "Cpus_allowed_list:\t0,2\nMems_allowed_list:\t0-63\n",
    )
    .file(
        "sys/fs/cgroup/cpuset/batch/42/cpuset.effective_cpus",
        "0-1\n",
    )
    .file("sys/fs/cgroup/cpuset/batch/42/cpuset.effective_mems", "5\n");
    let topo = loci_topo::load(&Source::Live { root: t.0.clone() }).unwrap();
    // Affinity 0,2 and cpuset 0-1: only cpu 0.
    assert_eq!(topo.allowed_cpus().to_string(), "0");
    assert_eq!(topo.allowed_mems().to_string(), "5");
}

#[test]
fn this_machine_is_consistent() {
    let topo = loci_topo::load(&Source::live()).unwrap();
    assert_eq!(topo.source, "sysfs:/");
    let allowed = topo.allowed_cpus();
    assert!(!allowed.is_empty());
    // The process's own affinity (from /proc) is what the reader reports as allowed, within
    // what is present.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = loci_topo::sysfs::status_field(&status, "Cpus_allowed_list").unwrap();
    let from_proc = loci_topo::CpuSet::parse(list).unwrap();
    assert!(allowed.is_subset(&from_proc), "{allowed} vs {from_proc}");
    assert!(allowed.is_subset(&topo.cpu_ids()));
    for n in &topo.nodes {
        assert!(n.memory_bytes.is_some(), "node {} memory", n.id);
    }
}
