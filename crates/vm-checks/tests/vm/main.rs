//! The VM tests of the libraries' placement (`--test vm`, the VM step of scripts/test): each boots
//! NUMA VMs (scripts/numa-vm, through loci-vm) and runs one of this crate's check programs inside.
//! Run only with `LOCI_NUMA_VM=1`; without it each test prints a skip note and passes.

mod array;
mod engine;
mod sched;

/// Boots a VM of `topology`, runs the check program `bin` with `args` inside (stopped after
/// `timeout`), prints its `LOCI-INFO` and `#` lines, and fails unless every check named in
/// `must_run` ran and none failed. Does nothing (a skip) without `LOCI_NUMA_VM=1`.
fn run_checks(
    bin: &str,
    topology: &str,
    timeout: std::time::Duration,
    args: &[&str],
    must_run: &[&str],
) {
    if !loci_vm::vm_tests_enabled() {
        return;
    }
    let out = loci_vm::NumaVm::new(topology)
        .timeout(timeout)
        .run(bin, args)
        .unwrap_or_else(|e| panic!("{e}"));
    for line in out
        .stdout
        .lines()
        .filter(|l| l.starts_with("LOCI-INFO") || l.starts_with('#'))
    {
        println!("VM {topology} {line}");
    }
    let report = out.checks();
    for name in must_run {
        assert!(
            report.names().contains(name),
            "check {name} did not run:\n{}",
            out.stdout
        );
    }
    report.print_and_assert();
}
