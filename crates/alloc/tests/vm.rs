//! The placement check (`examples/placement_check.rs`) inside NUMA VMs: threads pinned to node k
//! get >= 99% of their pages on k, `alloc_on(k)` from another node's thread too, and `node_of`
//! agrees. Runs only with `LOCI_NUMA_VM=1` (scripts/test sets it).

use std::path::PathBuf;

/// The example binary cargo builds alongside the tests (target/<profile>/examples/).
fn placement_check() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/placement_check");
    assert!(
        p.is_file(),
        "{} missing: cargo test builds examples; or cargo build --release -p loci-alloc --example placement_check",
        p.display()
    );
    p
}

/// `mem`: memory per node, enough for the check's ~70 MB of blocks per node next to the kernel's
/// own use (with less, MPOL_PREFERRED rightly falls back to other nodes).
fn run(topology: &str, mem: Option<&str>, expect: usize) {
    if !loci_vm::vm_tests_enabled() {
        return;
    }
    let mut vm = loci_vm::NumaVm::new(topology);
    if let Some(m) = mem {
        vm = vm.mem_per_node(m);
    }
    let out = vm
        .run(placement_check(), &[] as &[&str])
        .unwrap_or_else(|e| panic!("{e}"));
    let report = out.checks();
    println!("{}", out.stdout);
    assert!(
        report.names().len() >= expect,
        "VM {topology}: expected a check per node ({expect}), got {:?} (exit status {}; stderr: {})",
        report.names(),
        out.status,
        out.stderr.trim()
    );
    report.print_and_assert();
}

#[test]
fn placement_on_2_nodes() {
    run("2n", None, 2);
}

#[test]
fn placement_on_4_nodes() {
    run("4n", Some("512M"), 4);
}

#[test]
fn placement_with_a_memoryless_node() {
    run("memless", None, 2);
}
