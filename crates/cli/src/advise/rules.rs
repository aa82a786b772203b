//! The static part of `loci advise`: seed 002's decision flowchart (its figure 10 and section IV)
//! as explicit rules over the machine and the OS state. Each rule says what it concluded and the
//! seed's evidence; together they give the flowchart's answer without measuring anything and the
//! candidates that are worth measuring.

use serde::{Deserialize, Serialize};

use super::Knobs;

/// What the rules look at.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Facts {
    /// Nodes that have allowed cpus.
    pub cpu_nodes: usize,
    /// Nodes whose memory this process may use.
    pub mem_nodes: usize,
    /// Cpus this process may use.
    pub cpus: usize,
    /// Threads the workload runs.
    pub threads: usize,
    /// `None` when the kernel has no AutoNUMA.
    pub autonuma_on: Option<bool>,
    /// The system THP mode (`always`, `madvise`, `never`), `None` when the kernel has no THP.
    pub thp: Option<String>,
    pub root: bool,
    /// Preloadable allocators found on this machine (glibc is always there).
    pub allocators: Vec<String>,
    /// Allocators that are not installed, with what would install them.
    pub missing_allocators: Vec<(String, String)>,
    /// The program is statically linked: nothing can be preloaded into it.
    pub static_binary: bool,
    /// `libloci_pin.so` (per-thread placement of `loci run`) is built next to `loci`.
    pub pin_library: bool,
    /// The usable DRAM nodes, when some nodes with memory are not DRAM (HBM, NVM, CXL): memory
    /// is then interleaved over these only.
    #[serde(default)]
    pub dram_nodes: Option<String>,
}

/// One rule's conclusion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: String,
    pub conclusion: String,
    pub evidence: String,
}

/// A system-wide OS change the rules recommend (applied only by `--apply-os`, as root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsChange {
    /// `loci os set` syntax: `autonuma=off`, `thp=madvise`.
    pub setting: String,
    pub why: String,
}

/// The flowchart's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Advice {
    pub findings: Vec<Finding>,
    /// The flowchart's answer, before any measurement.
    pub recommended: Knobs,
    /// What to measure: each value a rule leaves open, one factor at a time.
    pub threads: Vec<String>,
    pub mem: Vec<String>,
    pub alloc: Vec<String>,
    pub thp: Vec<String>,
    pub os_changes: Vec<OsChange>,
}

const EV_SPARSE: &str = "seed 002, IV-A: \"Sparse affinity prevents migration-induced cache invalidation\"; \
\"a Sparse placement approach can maximize performance in situations that are memory-bandwidth-bound\"";
const EV_AUTONUMA: &str = "seed 002, IV-C1: \"AutoNUMA slows down the runtime for the First Touch, Interleave, and \
Localalloc policies ... If AutoNUMA is enabled, the best approach is to apply the Interleave policy, which may be \
useful for scenarios where superuser access is unavailable\"";
const EV_INTERLEAVE: &str = "seed 002, IV-C1: \"The best overall approach is to use memory interleaving and disable \
AutoNUMA\"; first touch with AutoNUMA (the system default) was 86% slower than interleave without it";
const EV_THP: &str = "seed 002, IV-C2: \"THP's impact on the workload execution time ranges from detrimental in most \
cases to negligible in other cases\"; \"tcmalloc, jemalloc, and tbbmalloc are currently not handling THP well\"";
const EV_ALLOC: &str = "seed 002, IV-D and V-F: allocators differ considerably; \"tbbmalloc frequently outperformed \
its competitors ... we recommend experimentation with new/updated memory allocators before selecting a solution\"";
const EV_ONE_NODE: &str =
    "one memory node: every page is local to every cpu, so thread placement and memory policy \
cannot change where data lives (seed 002's placement gains are remote-access gains)";
const EV_OVERSUB: &str =
    "seed 001, obs. 2: more busy threads than cores halves throughput by context switching; \
pinning several threads to one cpu makes it worse";
const EV_TIERS: &str = "seed 002 interleaves over DRAM nodes of equal speed; spreading pages over slower (NVM, CXL) \
or capacity-limited (HBM) nodes changes what interleave means, so those are left to an explicit policy";
const EV_PIN: &str =
    "loci run places the threads of an unmodified program one by one through libloci_pin.so \
(preloaded; it pins the k-th pthread_create'd thread), built with the workspace";
const EV_STATIC: &str =
    "allocators and the pin library are loaded with LD_PRELOAD, which a statically linked \
program ignores";

/// Runs the flowchart over `f`.
pub fn decide(f: &Facts) -> Advice {
    let mut findings = Vec::new();
    let mut say = |rule: &'static str, conclusion: String, evidence: &'static str| {
        findings.push(Finding {
            rule: rule.into(),
            conclusion,
            evidence: evidence.into(),
        })
    };
    let multi = f.mem_nodes > 1;
    let oversubscribed = f.threads > f.cpus;
    let mut rec = Knobs::default();
    let mut threads = vec!["os".to_string()];
    let mut mem = vec!["first-touch".to_string()];

    // 1. Thread placement.
    if f.static_binary {
        say(
            "static-binary",
            "the program is statically linked: its threads cannot be placed one by one and no allocator can be preloaded; only memory policy and THP are tried".into(),
            EV_STATIC,
        );
    } else if multi && !f.pin_library {
        say(
            "no-pin-library",
            "libloci_pin.so is not built next to loci, so threads cannot be placed one by one; only unpinned runs are measured (build it: cargo build --release)".into(),
            EV_PIN,
        );
    } else if oversubscribed {
        say(
            "oversubscribed",
            format!(
                "{} threads on {} cpus: pinning would stack threads on cpus; threads stay unpinned (run at most {} threads)",
                f.threads, f.cpus, f.cpus
            ),
            EV_OVERSUB,
        );
    } else if !multi {
        say(
            "one-node",
            "one memory node: thread placement and memory policy cannot change locality here; measured: allocator and THP".into(),
            EV_ONE_NODE,
        );
    } else if f.threads == 1 {
        rec.threads = "compact".into();
        threads.push("compact".into());
        say(
            "one-thread",
            "one thread: pin it (compact) so its first-touched pages stay on its node".into(),
            EV_SPARSE,
        );
    } else {
        rec.threads = "sparse".into();
        threads.extend(["sparse".into(), "compact".into()]);
        say(
            "pin-sparse",
            format!(
                "{} threads over {} nodes: pin them; sparse (round-robin over nodes) first, compact also measured",
                f.threads, f.cpu_nodes
            ),
            EV_SPARSE,
        );
    }

    // 2. Memory policy and AutoNUMA.
    let mut os_changes = Vec::new();
    if multi {
        let interleave = match &f.dram_nodes {
            Some(dram) => {
                say(
                    "tiered-memory",
                    format!("some memory nodes are not DRAM (HBM, NVM or CXL): interleave over the DRAM nodes {dram} only"),
                    EV_TIERS,
                );
                format!("interleave:{dram}")
            }
            None => "interleave".into(),
        };
        rec.mem = interleave.clone();
        mem.extend([interleave, "localalloc".into()]);
        match f.autonuma_on {
            Some(true) if f.root => {
                os_changes.push(OsChange {
                    setting: "autonuma=off".into(),
                    why: "AutoNUMA migrates pages and threads behind an analytic workload's back".into(),
                });
                say(
                    "autonuma-root",
                    "AutoNUMA is on and you are root: turn it off (`loci os set autonuma=off`) and interleave memory".into(),
                    EV_INTERLEAVE,
                );
            }
            Some(true) => say(
                "autonuma-no-root",
                "AutoNUMA is on and you are not root: interleave memory, which mitigates most of its cost".into(),
                EV_AUTONUMA,
            ),
            _ => say(
                "interleave",
                "several memory nodes: interleave memory (first touch and localalloc also measured)".into(),
                EV_INTERLEAVE,
            ),
        }
    } else if f.autonuma_on == Some(true) {
        say(
            "autonuma-one-node",
            "AutoNUMA is on, but with one memory node it has nothing to migrate between; left as is".into(),
            EV_ONE_NODE,
        );
    }

    // 3. Transparent huge pages.
    let mut thp = vec![String::new()];
    match f.thp.as_deref() {
        Some("never") | None => say(
            "thp-off",
            "THP is off system-wide (or absent): nothing to try".into(),
            EV_THP,
        ),
        Some(mode) => {
            thp.push("off".into());
            if mode == "always" {
                rec.thp = "off".into();
                os_changes.push(OsChange {
                    setting: "thp=madvise".into(),
                    why: "THP `always` merges pages for every program; `madvise` leaves it to programs that ask".into(),
                });
            }
            say(
                "thp",
                format!(
                    "THP is `{mode}`: measure the program with THP off (`--thp off`, per process, no root needed){}",
                    if mode == "always" { "; the flowchart's default answer is off" } else { "" }
                ),
                EV_THP,
            );
        }
    }

    // 4. Allocators.
    let mut alloc = vec!["glibc".to_string()];
    if !f.static_binary {
        alloc.extend(f.allocators.iter().filter(|a| *a != "glibc").cloned());
        let missing = if f.missing_allocators.is_empty() {
            String::new()
        } else {
            format!(
                "; not installed: {}",
                f.missing_allocators
                    .iter()
                    .map(|(a, how)| format!("{a} ({how})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        if f.allocators.iter().any(|a| a == "tbbmalloc") {
            rec.alloc = "tbbmalloc".into();
        }
        say(
            "allocator",
            format!(
                "measure every installed allocator: {}{missing}",
                alloc.join(", ")
            ),
            EV_ALLOC,
        );
    }
    if f.static_binary || oversubscribed || !f.pin_library {
        rec.threads = "os".into();
    }
    if f.static_binary {
        rec.alloc = "glibc".into();
    }
    Advice {
        findings,
        recommended: rec,
        threads,
        mem,
        alloc,
        thp,
        os_changes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(mem_nodes: usize, threads: usize) -> Facts {
        Facts {
            cpu_nodes: mem_nodes,
            mem_nodes,
            cpus: 8,
            threads,
            autonuma_on: Some(false),
            thp: Some("madvise".into()),
            root: true,
            allocators: vec!["glibc".into(), "jemalloc".into(), "tbbmalloc".into()],
            missing_allocators: vec![("mimalloc".into(), "apt-get install libmimalloc2.0".into())],
            static_binary: false,
            pin_library: true,
            dram_nodes: None,
        }
    }

    fn rules(a: &Advice) -> Vec<&str> {
        a.findings.iter().map(|f| f.rule.as_str()).collect()
    }

    #[test]
    fn four_nodes_autonuma_on_not_root_interleaves_and_pins_sparse() {
        let mut f = facts(4, 8);
        f.autonuma_on = Some(true);
        f.root = false;
        let a = decide(&f);
        assert_eq!(a.recommended.mem, "interleave");
        assert_eq!(a.recommended.threads, "sparse");
        assert!(rules(&a).contains(&"autonuma-no-root"), "{:?}", rules(&a));
        assert!(a.os_changes.is_empty(), "not root: no OS change offered");
        assert_eq!(a.mem, ["first-touch", "interleave", "localalloc"]);
    }

    #[test]
    fn root_with_autonuma_on_is_told_to_turn_it_off() {
        let mut f = facts(2, 8);
        f.autonuma_on = Some(true);
        let a = decide(&f);
        assert_eq!(a.os_changes[0].setting, "autonuma=off");
        assert!(rules(&a).contains(&"autonuma-root"));
    }

    #[test]
    fn one_node_measures_only_allocator_and_thp() {
        let a = decide(&facts(1, 2));
        assert_eq!(a.threads, ["os"]);
        assert_eq!(a.mem, ["first-touch"]);
        assert_eq!(a.alloc, ["glibc", "jemalloc", "tbbmalloc"]);
        assert_eq!(a.thp, ["", "off"]);
        assert_eq!(a.recommended.alloc, "tbbmalloc");
        assert!(rules(&a).contains(&"one-node"));
        let allocator = a.findings.iter().find(|f| f.rule == "allocator").unwrap();
        assert!(allocator
            .conclusion
            .contains("mimalloc (apt-get install libmimalloc2.0)"));
    }

    #[test]
    fn thp_always_recommends_off_and_madvise() {
        let mut f = facts(1, 2);
        f.thp = Some("always".into());
        let a = decide(&f);
        assert_eq!(a.recommended.thp, "off");
        assert_eq!(a.os_changes[0].setting, "thp=madvise");
        f.thp = Some("never".into());
        let a = decide(&f);
        assert_eq!(a.thp, [""]);
        assert!(a.os_changes.is_empty());
    }

    #[test]
    fn oversubscription_and_static_binaries_keep_threads_unpinned() {
        let a = decide(&facts(2, 16));
        assert_eq!(a.threads, ["os"]);
        assert_eq!(a.recommended.threads, "os");
        assert!(rules(&a).contains(&"oversubscribed"));
        let mut f = facts(2, 4);
        f.static_binary = true;
        let a = decide(&f);
        assert_eq!(a.alloc, ["glibc"]);
        assert_eq!(a.recommended.alloc, "glibc");
        assert_eq!(a.threads, ["os"]);
        assert_eq!(a.mem, ["first-touch", "interleave", "localalloc"]);
    }

    #[test]
    fn without_the_pin_library_threads_are_not_pinned() {
        let mut f = facts(2, 4);
        f.pin_library = false;
        let a = decide(&f);
        assert_eq!(a.threads, ["os"]);
        assert_eq!(a.recommended.threads, "os");
        assert!(rules(&a).contains(&"no-pin-library"));
    }

    #[test]
    fn tiered_memory_interleaves_over_dram_only() {
        let mut f = facts(8, 8);
        f.dram_nodes = Some("0-3".into());
        let a = decide(&f);
        assert_eq!(a.recommended.mem, "interleave:0-3");
        assert_eq!(a.mem, ["first-touch", "interleave:0-3", "localalloc"]);
        assert!(rules(&a).contains(&"tiered-memory"));
    }

    #[test]
    fn one_thread_on_many_nodes_is_pinned_compact() {
        let a = decide(&facts(2, 1));
        assert_eq!(a.recommended.threads, "compact");
        assert_eq!(a.threads, ["os", "compact"]);
    }
}
