//! Round trip: random valid machines, written out as a Linux sysfs tree and as an hwloc v2 XML
//! export (`lstopo --of xml`), read back through [`loci_topo::load`] to the same [`Topology`].
//!
//! The generator builds machines the way kernels and hwloc describe them: 1-8 nodes with sparse
//! kernel ids in any order, CPU-less and memoryless nodes (always one node with cpus and one with
//! memory), 1-4 packages (possibly sparse ids) holding one node, two nodes (sub-NUMA clustering)
//! or all sharing one node, cores with 1-4 threads (some single-threaded on hybrid parts), cpu ids
//! with holes, SMT siblings numbered apart (Intel) or adjacent, per-package `core_id`s with holes,
//! L1d/L1i per core, L2 per core or per core pair, L3 per package, per node or none, memory in
//! 4 KiB pages and a symmetric SLIT matrix (10 local, 11-254 remote, uniform or not).
//!
//! What is compared: nodes (id, cpus, memory, free memory, allowed, kind, initiators, merged),
//! cpus (id, package, node, online, allowed), the partition of cpus into cores (the readers
//! renumber cores machine-wide, so the numbers themselves are not compared, only which cpus
//! share one), caches as a sorted list (level, kind, size, cpus), distances, devices and the
//! readers' repair notes (a clean tree needs none). Normalised, because a source cannot carry it:
//! `source` (each loader names its own) and, for XML only, `free_bytes` (hwloc does not export
//! it). Not generated (other tests cover them): offline cpus (hwloc does not export them),
//! devices, HMAT initiators and memory kinds (every node is ordinary DRAM). The XML property
//! skips the few machines hwloc cannot export faithfully ([`Hwloc::valid_for_hwloc`]); the sysfs
//! property runs every machine.
//!
//! Files: `machine` (the generator), `sysfs` and `hwloc` (the two writers), `compare` (what is
//! compared, part by part).

#[path = "../common/mod.rs"]
mod common;
mod compare;
mod hwloc;
mod machine;
mod sysfs;

use loci_topo::{CpuSet, Source};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use common::Tree;
use compare::same;
use hwloc::{hwloc_bitmap, Hwloc};
use machine::{machine, Machine};
use sysfs::{kernel_mask, write_sysfs};

/// The machines hwloc exports faithfully (about 96% of them, see [`Hwloc::valid_for_hwloc`]).
fn hwloc_machine() -> impl Strategy<Value = Machine> {
    machine().prop_filter(
        "hwloc would report an error, or its XML could not tell which node owns the cpus",
        |m| Hwloc::new(m).valid_for_hwloc(&m.topo),
    )
}

// ---------------------------------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sysfs_tree_reads_back(m in machine()) {
        let tree = Tree::new("roundtrip-sysfs");
        write_sysfs(&m, &tree);
        let got = loci_topo::load(&Source::Sysfs(tree.0.clone()))
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        same(&m.topo, &got, true)?;
        prop_assert_eq!(got.source, format!("sysfs-dir:{}", tree.0.display()));
    }

    #[test]
    fn hwloc_xml_reads_back(m in hwloc_machine()) {
        let dir = Tree::new("roundtrip-xml");
        let path = dir.0.join("topology.xml");
        std::fs::write(&path, Hwloc::new(&m).xml(&m)).unwrap();
        let got = loci_topo::load(&Source::HwlocXml(path.clone()))
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        same(&m.topo, &got, false)?;
        prop_assert_eq!(got.source, format!("xml:{}", path.display()));
    }
}

// ---------------------------------------------------------------------------------------------
// The writers themselves
// ---------------------------------------------------------------------------------------------

#[test]
fn masks_are_written_as_kernel_and_hwloc_write_them() {
    let s = |l: &str| CpuSet::parse(l).unwrap();
    // Real files: fakeheteromemtiers (6 cpus), a 64-cpu machine.
    assert_eq!(kernel_mask(&s("0-1"), 6), "03");
    assert_eq!(kernel_mask(&s("0-5"), 6), "3f");
    assert_eq!(kernel_mask(&s("0-3"), 64), "00000000,0000000f");
    assert_eq!(kernel_mask(&s("32"), 40), "01,00000000");
    assert_eq!(kernel_mask(&s(""), 4), "0");
    // Real exports: memorysidecaches.xml, 192em64t-24n8c2t.xml.
    assert_eq!(hwloc_bitmap(s("40").iter()), "0x00000100,0x0");
    assert_eq!(
        hwloc_bitmap(s("0-7,192-199").iter()),
        "0x000000ff,,,,,,0x000000ff"
    );
    assert_eq!(hwloc_bitmap(s("").iter()), "0x0");
    assert_eq!(hwloc_bitmap(s("0-3").iter()), "0x0000000f");
    // And the loci parsers read them back.
    assert_eq!(CpuSet::parse_mask("01,00000000").unwrap(), s("32"));
}
