//! The NUMA VM suite: every topology boots once and runs every placement check inside (see `loci-vm-check`).
//!
//! Runs only with `LOCI_NUMA_VM=1` (scripts/test sets it); then a VM that cannot start fails the test. Each test
//! prints a one-line report per topology: `VM 8n: 198 checks, 198 passed, 0 failed (113.3 s boot+run+power-off)`.

use std::collections::BTreeSet;
use std::time::Duration;

use loci_vm::{vm_tests_enabled, NumaVm, VmConfig, VmError, VmTopology};

const CHECK: &str = env!("CARGO_BIN_EXE_loci-vm-check");

/// The ids of the VM's nodes that have memory.
fn memory_nodes(cfg: &VmConfig) -> Vec<u32> {
    cfg.nodes
        .iter()
        .filter(|n| n.mem_mib > 0)
        .map(|n| n.id)
        .collect()
}

/// The check names a topology must produce, derived from its configuration alone, so a check that silently stops
/// running (or a group that is skipped) fails the test instead of passing with fewer checks.
fn required_checks(cfg: &VmConfig) -> BTreeSet<String> {
    let mut want = BTreeSet::new();
    want.insert("sysfs/node-ids".to_string());
    let mem = memory_nodes(cfg);
    for n in &cfg.nodes {
        for what in ["cpus", "distances", "memory"] {
            want.insert(format!("sysfs/node{}/{what}", n.id));
        }
        let cpus = cfg.node_cpus(n.id);
        if n.mem_mib > 0 {
            for p in [
                "bind",
                "preferred",
                "apply_range-migrate",
                "set_mempolicy-bind",
            ] {
                want.insert(format!("mem/{p}/node{}", n.id));
            }
        } else {
            want.insert(format!("errors/memoryless-node{}/mbind-bind", n.id));
            want.insert(format!("errors/memoryless-node{}/set_mempolicy", n.id));
        }
        if cpus.is_empty() {
            want.insert(format!("errors/cpuless-node{}/affinity", n.id));
        } else {
            want.insert(format!("mem/localalloc/node{}", n.id));
            want.insert(format!("mem/first-touch/node{}", n.id));
            want.insert(format!("threads/pin/node{}", n.id));
            for c in cpus.iter() {
                want.insert(format!("threads/pin/cpu{c}"));
            }
        }
    }
    if mem.len() >= 2 {
        want.insert("mem/interleave/all".to_string());
    }
    let missing = cfg.nodes.len() as u32;
    want.insert(format!("errors/no-such-node{missing}"));
    want.insert("errors/no-such-node1023".to_string());
    want.insert("errors/node-beyond-mask".to_string());
    want.insert("errors/no-such-cpu".to_string());
    want.insert("cli/topo-json".to_string());
    want
}

/// How much of loci's placement layer (`loci plan`, `loci run` with `loci-probe`) a topology checks.
#[derive(Clone, Copy)]
enum Place<'a> {
    /// Not at all (syscall layer and `loci topo` only).
    None,
    /// Every strategy; loci's own threads for every n; an unmodified child under `loci run` for these n
    /// (`None` = every n = 1..=cpus).
    Threads(Option<&'a [usize]>),
}

const STRATEGIES: &[&str] = &[
    "os", "compact", "sparse", "shared:2", "random:7", "group", "nodes:", "cpus:all",
];

fn required_place_checks(cfg: &VmConfig, child_ns: Option<&[usize]>) -> BTreeSet<String> {
    let mut want = BTreeSet::new();
    let ncpus = cfg.cpu_count();
    let cpu_nodes: loci_topo::NodeSet = cfg
        .nodes
        .iter()
        .filter(|n| !cfg.node_cpus(n.id).is_empty())
        .map(|n| n.id)
        .collect();
    // shared:2 only where every node with cpus holds a pair (as loci-vm-check decides).
    let shared = cpu_nodes.iter().all(|k| cfg.node_cpus(k).len() >= 2);
    for s in STRATEGIES {
        if *s == "shared:2" && !shared {
            continue;
        }
        let s = if *s == "nodes:" {
            format!("nodes:{cpu_nodes}")
        } else {
            s.to_string()
        };
        want.insert(format!("place/plan-json/{s}/n{ncpus}"));
        for n in 1..=ncpus {
            want.insert(format!("place/own-threads/{s}/n{n}"));
            if !matches!(child_ns, Some(ns) if !ns.contains(&n)) {
                want.insert(format!("place/child-threads/{s}/n{n}"));
            }
        }
    }
    let mem = memory_nodes(cfg);
    for k in &mem {
        want.insert(format!("place/run-mem/bind:{k}"));
        want.insert(format!("place/run-mem/preferred:{k}"));
    }
    if mem.len() >= 2 {
        want.insert("place/run-mem/interleave".to_string());
    }
    for k in cpu_nodes.iter() {
        want.insert(format!("place/run-mem/localalloc/node{k}"));
        want.insert(format!("place/run-mem/first-touch/node{k}"));
    }
    // --verify: threads on the first node with cpus, memory on a memory node that is not its nearest.
    if let Some(cn) = cpu_nodes.first() {
        let row = &cfg.distances[cfg.nodes.iter().position(|n| n.id == cn).unwrap()];
        let near = mem.iter().map(|&m| row[m as usize]).min();
        if let Some(m) = mem.iter().find(|&&m| Some(row[m as usize]) != near) {
            want.insert(format!(
                "place/verify-remote-share/threads-node{cn}-memory-node{m}"
            ));
        }
    }
    for n in &cfg.nodes {
        if n.mem_mib == 0 {
            want.insert(format!("cli-errors/bind-memoryless-node{}", n.id));
            want.insert(format!("cli-errors/preferred-memoryless-node{}", n.id));
        }
        if cfg.node_cpus(n.id).is_empty() {
            want.insert(format!("cli-errors/threads-cpuless-node{}", n.id));
        }
    }
    let missing = cfg.nodes.len();
    want.insert(format!("cli-errors/bind-no-such-node{missing}"));
    want.insert(format!("cli-errors/threads-no-such-node{missing}"));
    want.insert("cli-errors/no-such-cpu".to_string());
    want.insert("cli-errors/more-threads-than-cpus".to_string());
    want
}

/// Boots `topology` once, runs every check group, prints the report, fails on any failed or missing check.
fn suite(topology: VmTopology, place: Place) {
    if !vm_tests_enabled() {
        return;
    }
    let vm = NumaVm::new(topology).timeout(Duration::from_secs(300));
    let cfg = vm.config().unwrap_or_else(|e| panic!("{e}"));
    let expect = serde_json::to_string(&cfg).unwrap();
    let loci = loci_vm::target_bin("loci").unwrap_or_else(|e| panic!("{e}"));
    let loci = loci.to_str().expect("utf-8 path");
    let probe = loci_vm::target_bin("loci-probe").unwrap_or_else(|e| panic!("{e}"));
    let probe = probe.to_str().expect("utf-8 path");
    let mut args = vec!["--expect", &expect, "--loci", loci];
    let mut want = required_checks(&cfg);
    let ns_arg;
    match place {
        Place::None => args.extend(["sysfs", "mem", "threads", "errors", "cli", "cli-errors"]),
        Place::Threads(ns) => {
            args.extend(["--probe", probe]);
            if let Some(ns) = ns {
                ns_arg = ns
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                args.extend(["--child-ns", &ns_arg]);
            }
            want.extend(required_place_checks(&cfg, ns));
        }
    }
    if matches!(place, Place::None) {
        want.extend(
            required_place_checks(&cfg, Some(&[]))
                .into_iter()
                .filter(|n| n.starts_with("cli-errors/")),
        );
    }
    let out = vm.run(CHECK, &args).unwrap_or_else(|e| panic!("{e}"));
    let report = out.checks();
    let ran: BTreeSet<&str> = report.names().into_iter().collect();
    let missing: Vec<String> = want
        .into_iter()
        .filter(|n| !ran.contains(n.as_str()))
        .collect();
    report.print_and_assert();
    assert!(
        missing.is_empty(),
        "VM {}: these checks did not run: {missing:?}",
        report.topology
    );
}

/// One test per preset topology (each boots its own VM, so they run and fail apart).
macro_rules! preset_suites {
    ($($name:ident: $topology:literal, $place:expr;)*) => {
        $(
            #[test]
            fn $name() {
                suite($topology.into(), $place);
            }
        )*
    };
}

preset_suites! {
    vm_2n: "2n", Place::Threads(None);
    vm_4n: "4n", Place::Threads(Some(&[4]));
    vm_8n: "8n", Place::Threads(Some(&[8]));
    vm_asym: "asym", Place::Threads(Some(&[4]));
    vm_cpuless: "cpuless", Place::Threads(Some(&[4]));
    vm_memless: "memless", Place::Threads(Some(&[4]));
}

#[test]
fn vm_custom_chain_of_3() {
    // Three nodes in a chain (0-1-2), different cpu counts and memory sizes.
    suite(
        VmTopology::Custom {
            cpus: vec![1, 2, 1],
            mem: vec!["384M".into(), "256M".into(), "320M".into()],
            dist: Some("10,16,22/16,10,16/22,16,10".into()),
        },
        Place::None,
    );
}

/// The harness itself: arguments arrive intact, stdout/stderr/status come back separately and faithfully, the
/// kernel console stays out of stdout.
#[test]
fn vm_harness_passes_args_and_keeps_streams_apart() {
    if !vm_tests_enabled() {
        return;
    }
    let out = NumaVm::new("2n")
        .env("LOCI_TEST_VAR", "x y'z")
        .run(
            "/bin/sh",
            &[
                "-c",
                "printf '%s|' \"$@\"; printf 'env=%s|topo=%s\\n' \"$LOCI_TEST_VAR\" \"$LOCI_VM_TOPOLOGY\"; \
                 echo to-stderr >&2; touch \"$LOCI_VM_SHARE/w\" && echo share-writable >&2; exit 7",
                "sh",
                "a b",
                "c'd",
                "",
                "$HOME",
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status, 7, "stderr: {}", out.stderr);
    assert_eq!(out.stdout, "a b|c'd||$HOME|env=x y'z|topo=2n\n");
    assert_eq!(out.stderr, "to-stderr\nshare-writable\n");
    assert!(
        out.console.contains("reboot: Power down"),
        "console: {}",
        out.console
    );
    println!(
        "VM 2n harness: args, env, stdout, stderr, exit status ok ({:.1} s boot+run+power-off)",
        out.elapsed.as_secs_f64()
    );
}

/// A VM that runs past its timeout is killed (the script waits for qemu to exit) and reported as a timeout.
#[test]
fn vm_harness_timeout_kills_the_vm() {
    if !vm_tests_enabled() {
        return;
    }
    let err = NumaVm::new("2n")
        .timeout(Duration::from_secs(2))
        .run("/bin/sleep", &["600"])
        .unwrap_err();
    match &err {
        VmError::Timeout {
            seconds, message, ..
        } => {
            assert_eq!(*seconds, 2);
            assert!(message.contains("timeout"), "{message}");
        }
        other => panic!("want a timeout, got {other}"),
    }
    println!("VM 2n harness: timeout reported and VM killed: {err}");
}

/// A VM that has not booted to the program within its boot limit is killed and booted again (a boot hang says
/// nothing about the program): with the first boot's limit at 1 s (LOCI_VM_FIRST_BOOT_TIMEOUT) the first boot is
/// always cut short, the note says so, and a later boot (limit LOCI_VM_BOOT_TIMEOUT, 60 s; the third boot has only
/// --timeout) runs the program. A bad value of either variable is refused, naming it.
#[test]
fn vm_harness_boots_again_after_a_boot_hang() {
    if !vm_tests_enabled() {
        return;
    }
    let out = std::process::Command::new(loci_vm::script_path())
        .env("LOCI_VM_FIRST_BOOT_TIMEOUT", "1")
        .args(["--topology", "2n", "--", "/bin/echo", "ran"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    assert!(
        stderr.contains("did not boot to the program within 1s (boot 1 of 3")
            && stderr.contains("booting it once more"),
        "{stderr}"
    );
    for var in ["LOCI_VM_BOOT_TIMEOUT", "LOCI_VM_FIRST_BOOT_TIMEOUT"] {
        let bad = std::process::Command::new(loci_vm::script_path())
            .env(var, "soon")
            .args(["--topology", "2n", "--", "/bin/true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&bad.stderr);
        assert_ne!(bad.status.code(), Some(0));
        assert!(
            stderr.contains(&format!("{var} must be a positive number"))
                && stderr.contains("'soon'"),
            "{stderr}"
        );
    }
    println!("VM 2n harness: a boot cut short is booted once more");
}

/// Errors that need no VM: a program that does not exist, an unknown topology.
#[test]
fn harness_rejects_bad_input_clearly() {
    let e = NumaVm::new("2n")
        .run("/no/such/program", &[] as &[&str])
        .unwrap_err()
        .to_string();
    assert!(e.contains("/no/such/program does not exist"), "{e}");
    let e = NumaVm::new("3n").config().unwrap_err().to_string();
    assert!(e.contains("unknown topology '3n'"), "{e}");
}

/// `kernel_module` with a module the VM's kernel does not have: refused before any VM boots, naming
/// the module and where it was looked for. (Needs the kernel cache, so it runs with the VM tests;
/// the stream netem test in crates/cli loads real modules.)
#[test]
fn harness_rejects_an_unknown_kernel_module() {
    if !loci_vm::vm_tests_enabled() {
        return;
    }
    let e = NumaVm::new("2n")
        .kernel_module("no_such_module")
        .run("/bin/true", &[] as &[&str])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--kmod no_such_module: no such module in kernel")
            && e.contains("modules.order"),
        "{e}"
    );
}
