//! Checks of loci's own placement layer and CLI: `loci plan`, `loci run` (with the pthread_create pin library on an
//! unmodified child, `loci-probe`), loci's in-process `apply_thread`, `loci run --verify`, and CLI errors.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use loci_place::verify::BufferPages;
use loci_place::{apply, MemPolicy, Plan, Strategy};
use loci_topo::{CpuSet, NodeSet};
use serde_json::Value;

use super::{map_region, nearest_memory, stays_on, Checker, RawPolicy, SysNode};

/// Strategies checked for every thread count (`nodes:` gets the list of nodes that have cpus; `shared:2` runs only
/// where every node with cpus has at least 2, its precondition: see `shared_applies`).
const STRATEGIES: &[&str] = &[
    "os", "compact", "sparse", "shared:2", "random:7", "group", "nodes:", "cpus:all",
];

fn run(prog: &Path, args: &[&str]) -> Result<Output, String> {
    Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", prog.display()))
}

fn show(args: &[&str]) -> String {
    args.join(" ")
}

/// Runs a command that must succeed and print JSON on stdout.
/// [`run_json`] of `loci` with `args` separated by spaces, `PROBE` standing for the probe
/// program's path `probe` (which may hold spaces).
fn run_probe_json(loci: &Path, args: &str, probe: &str) -> Result<Value, String> {
    let args: Vec<&str> = args
        .split_whitespace()
        .map(|a| if a == "PROBE" { probe } else { a })
        .collect();
    run_json(loci, &args)
}

fn run_json(prog: &Path, args: &[&str]) -> Result<Value, String> {
    let out = run(prog, args)?;
    if !out.status.success() {
        return Err(format!(
            "`{} {}` exited {}: {}",
            prog.display(),
            show(args),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "`{} {}` printed no JSON ({e}): {}",
            prog.display(),
            show(args),
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn cpus_of(v: &Value, what: &str) -> Result<CpuSet, String> {
    v.as_str()
        .and_then(|s| CpuSet::parse(s).ok())
        .ok_or_else(|| format!("{what}: not a cpu list: {v}"))
}

/// Per-thread cpu sets of `loci plan --json`.
fn cli_plan(loci: &Path, strategy: &str, n: usize, extra: &[&str]) -> Result<Vec<CpuSet>, String> {
    let ns = n.to_string();
    let mut args = vec!["plan", "--threads", strategy, "-n", &ns, "--json"];
    args.extend_from_slice(extra);
    let v = run_json(loci, &args)?;
    v["threads"]
        .as_array()
        .ok_or("plan JSON has no threads")?
        .iter()
        .map(|t| cpus_of(&t["cpus"], "plan thread cpus"))
        .collect()
}

/// `shared:2` puts each pair of threads on one node; checked where every node with cpus can hold a pair.
pub(super) fn shared_applies(nodes: &[SysNode]) -> bool {
    nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .all(|n| n.cpus.len() >= 2)
}

/// Threads of loci's own process placed by `loci_place::apply::apply_thread`: each reads back its plan's set and
/// runs only there.
fn own_threads(plan: &Plan, n: usize) -> Result<(), String> {
    if plan.threads.len() != n {
        return Err(format!(
            "the plan for -n {n} has {} threads",
            plan.threads.len()
        ));
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..plan.threads.len())
            .map(|i| {
                s.spawn(move || -> Result<(), String> {
                    apply::apply_thread(plan, i).map_err(|e| format!("apply_thread {i}: {e}"))?;
                    stays_on(&plan.threads[i].cpus, 50)
                        .map_err(|e| format!("own thread {i} (want the plan's cpus): {e}"))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| "own thread panicked".to_string())?)
            .collect::<Result<Vec<()>, String>>()
            .map(|_| ())
    })
}

/// `loci run --threads S -n N -- loci-probe --threads N-1`: every thread of the unmodified child sits on its plan's
/// cpus (the main thread is plan thread 0, the k-th pthread_create is plan thread k).
fn child_threads(
    loci: &Path,
    probe: &Path,
    strategy: &str,
    n: usize,
    plan: &[CpuSet],
) -> Result<(), String> {
    let probe_s = probe.to_str().ok_or("probe path is not UTF-8")?;
    let v = run_probe_json(
        loci,
        &format!(
            "run --threads {strategy} -n {n} -- PROBE --threads {}",
            n - 1
        ),
        probe_s,
    )?;
    let mut seen = vec![(0usize, v["cpus"].clone(), v["cpu"].clone())];
    for t in v["threads"].as_array().ok_or("probe JSON has no threads")? {
        let i = t["index"].as_u64().ok_or("probe thread without index")? as usize;
        seen.push((i, t["cpus"].clone(), t["cpu"].clone()));
    }
    if seen.len() != n {
        return Err(format!(
            "the child reported {} threads, want {n}",
            seen.len()
        ));
    }
    for (i, cpus, cpu) in seen {
        let got = cpus_of(&cpus, "probe cpus")?;
        let want = plan
            .get(i)
            .ok_or(format!("child thread {i} is beyond the plan"))?;
        if &got != want {
            return Err(format!("child thread {i}: affinity {got}, plan {want}"));
        }
        let c = cpu.as_u64().ok_or("probe cpu missing")? as u32;
        if !want.contains(c) {
            return Err(format!("child thread {i}: on cpu {c}, plan {want}"));
        }
    }
    Ok(())
}

/// Pages of the probe's buffer as it reported them (`alloc`), in loci-place's classes.
fn probe_pages(v: &Value) -> Result<BufferPages, String> {
    let a = &v["alloc"];
    let pages = a["pages"].as_u64().ok_or("probe JSON has no alloc.pages")? as usize;
    let count = |x: &Value| x.as_u64().unwrap_or(0) as usize;
    let map = |k: &str| -> Result<BTreeMap<u32, usize>, String> {
        let Some(o) = a[k].as_object() else {
            return Ok(BTreeMap::new());
        };
        o.iter()
            .map(|(n, c)| {
                n.parse()
                    .map(|n| (n, count(c)))
                    .map_err(|_| format!("probe JSON alloc.{k} has key {n:?}"))
            })
            .collect()
    };
    if a["pages_per_node"].as_object().is_none() {
        return Err("probe JSON has no alloc.pages_per_node".into());
    }
    let b = BufferPages {
        per_node: map("pages_per_node")?,
        not_present: count(&a["not_present"]),
        unknown: count(&a["unknown"]),
        errors: map("errors")?
            .into_iter()
            .map(|(e, c)| (e as i32, c))
            .collect(),
    };
    if b.pages() != pages {
        return Err(format!("probe: {pages} pages but {b:?} counted"));
    }
    Ok(b)
}

/// All pages of the probe's buffer whose node is known are on `want` (none missing; pages of
/// unknown node, -EFAULT while AutoNUMA scans, are neither failure nor proof).
fn all_on(v: &Value, want: &NodeSet, what: &str) -> Result<(), String> {
    probe_pages(v)?
        .check_all_on(want)
        .map_err(|e| format!("{what}: {e}"))
}

fn policy_is(v: &Value, want: &str) -> Result<(), String> {
    let got = v["mempolicy"]["policy"].as_str().unwrap_or("?");
    if got != want {
        return Err(format!("the child's get_mempolicy says {got}, want {want}"));
    }
    Ok(())
}

/// `child_ns`: the thread counts for which an unmodified child is run through `loci run` (each run costs about a
/// second in the VM); loci's own threads are checked for every n = 1..=cpus.
pub(super) fn checks(
    c: &mut Checker,
    loci: &Path,
    probe: &Path,
    nodes: &[SysNode],
    child_ns: Option<&[usize]>,
) {
    let topo = match loci_topo::load(&loci_topo::Source::live()) {
        Ok(t) => t,
        Err(e) => {
            c.check("place/topology", || {
                Err(format!("loading this machine: {e}"))
            });
            return;
        }
    };
    let ncpus: usize = nodes.iter().map(|n| n.cpus.len()).sum();
    let probe_s = probe.to_str().unwrap_or_default().to_string();
    let cpu_nodes: NodeSet = nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .map(|n| n.id)
        .collect();
    // Threads: every strategy, n = 1..=cpus: the plan of `loci plan --json` equals loci_place's, loci's own threads
    // (apply_thread) and the threads of an unmodified child under `loci run` (the pin library) sit on their plan.
    for &strategy in STRATEGIES {
        if strategy == "shared:2" && !shared_applies(nodes) {
            continue;
        }
        let strategy = if strategy == "nodes:" {
            format!("nodes:{cpu_nodes}")
        } else {
            strategy.to_string()
        };
        let s: Strategy = match strategy.parse() {
            Ok(s) => s,
            Err(e) => {
                c.check(format!("place/threads/{strategy}"), || {
                    Err(format!("strategy {strategy}: {e}"))
                });
                continue;
            }
        };
        let mut plans = Vec::new();
        for n in 1..=ncpus {
            let plan = Plan::new(&topo, &s, n, &MemPolicy::FirstTouch, false);
            c.check(format!("place/own-threads/{strategy}/n{n}"), || {
                own_threads(plan.as_ref().map_err(|e| e.to_string())?, n)
            });
            plans.push(plan.ok());
        }
        c.check(format!("place/plan-json/{strategy}/n{ncpus}"), || {
            let cli = cli_plan(loci, &strategy, ncpus, &[])?;
            let lib: Vec<CpuSet> = plans[ncpus - 1]
                .as_ref()
                .ok_or("no plan")?
                .threads
                .iter()
                .map(|t| t.cpus.clone())
                .collect();
            (lib == cli).then_some(()).ok_or(format!(
                "loci plan --json says {cli:?}, loci_place::Plan says {lib:?}"
            ))
        });
        for n in 1..=ncpus {
            if child_ns.is_some_and(|ns| !ns.contains(&n)) {
                continue;
            }
            c.check(format!("place/child-threads/{strategy}/n{n}"), || {
                let plan = plans[n - 1].as_ref().ok_or("no plan")?;
                let cpus: Vec<CpuSet> = plan.threads.iter().map(|t| t.cpus.clone()).collect();
                child_threads(loci, probe, &strategy, n, &cpus)
            });
        }
    }
    // Memory through `loci run --mem`, on the unmodified child's 64 MiB buffer.
    let mem_nodes: Vec<u32> = nodes
        .iter()
        .filter(|n| n.mem_total_kb > 0)
        .map(|n| n.id)
        .collect();
    for &k in &mem_nodes {
        for (policy, name) in [("bind", "bind"), ("preferred", "preferred")] {
            let probe_s = probe_s.clone();
            c.check(format!("place/run-mem/{policy}:{k}"), move || {
                let p = format!("{policy}:{k}");
                let v = run_probe_json(
                    loci,
                    &format!("run --mem {p} -- PROBE --alloc 16M"),
                    &probe_s,
                )?;
                policy_is(&v, name)?;
                all_on(&v, &NodeSet::single(k), &p)
            });
        }
    }
    if mem_nodes.len() >= 2 {
        let (probe_s, mem_nodes) = (probe_s.clone(), mem_nodes.clone());
        c.check("place/run-mem/interleave", move || {
            // THP off: interleave then spreads 4 KiB pages, within 1 page per node.
            let v = run_probe_json(
                loci,
                "run --mem interleave --thp off -- PROBE --alloc 16M",
                &probe_s,
            )?;
            policy_is(&v, "interleave")?;
            let b = probe_pages(&v)?;
            let counts: Vec<usize> = mem_nodes
                .iter()
                .map(|n| b.per_node.get(n).copied().unwrap_or(0))
                .collect();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            // Pages of unknown node (-EFAULT) may be missing from any node's count.
            if counts.iter().sum::<usize>() + b.unknown != b.pages() || hi - lo > 1 + b.unknown {
                return Err(format!(
                    "pages {b:?}: want all on {mem_nodes:?}, within 1 page"
                ));
            }
            Ok(())
        });
    }
    for n in nodes.iter().filter(|n| !n.cpus.is_empty()) {
        let k = n.id;
        let want = nearest_memory(nodes, k);
        let nodes_k = format!("nodes:{k}");
        {
            let (want, nodes_k, probe_s) = (want.clone(), nodes_k.clone(), probe_s.clone());
            c.check(format!("place/run-mem/localalloc/node{k}"), move || {
                let v = run_probe_json(
                    loci,
                    &format!("run --threads {nodes_k} -n 1 --mem localalloc -- PROBE --alloc 16M"),
                    &probe_s,
                )?;
                policy_is(&v, "localalloc")?;
                all_on(&v, &want, &format!("localalloc on node {k}"))
            });
        }
        let probe_s = probe_s.clone();
        c.check(format!("place/run-mem/first-touch/node{k}"), move || {
            // Thread 1 of the child (placed by the pin library) touches the buffer; --oversubscribe for 1-cpu nodes.
            let v = run_probe_json(
                loci,
                &format!(
                    "run --threads {nodes_k} -n 2 --oversubscribe -- PROBE --threads 1 --alloc 16M \
                     --alloc-thread 1"
                ),
                &probe_s,
            )?;
            all_on(&v, &want, &format!("first touch by a thread on node {k}"))
        });
    }
    // `loci run --verify`: the remote share it reports agrees with the child's own numa_maps reading.
    let cpu_node = nodes.iter().find(|n| !n.cpus.is_empty());
    let remote = cpu_node.and_then(|cn| {
        let near = nearest_memory(nodes, cn.id);
        mem_nodes
            .iter()
            .copied()
            .find(|m| !near.contains(*m))
            .map(|m| (cn.id, m))
    });
    if let Some((cn, m)) = remote {
        c.check(
            format!("place/verify-remote-share/threads-node{cn}-memory-node{m}"),
            || verify_share(loci, cn, m),
        );
    }
}

/// Child side of the verify check: a region bound to `node`, touched, then this process's own numa_maps
/// (anonymous mappings: lines without `file=`) printed as `{"anon_bytes": {"NODE": bytes}}`.
pub(super) fn touch_remote(node: u32, len: usize) -> Result<std::convert::Infallible, String> {
    let mut r = map_region(len, false)?;
    r.mbind(loci_place::sys::mode::MPOL_BIND, &NodeSet::single(node))
        .map_err(|e| format!("mbind bind {node}: {e}"))?;
    r.populate();
    let maps = std::fs::read_to_string("/proc/self/numa_maps")
        .map_err(|e| format!("/proc/self/numa_maps: {e}"))?;
    let mut per: BTreeMap<u32, u64> = BTreeMap::new();
    for line in maps.lines().filter(|l| !l.contains(" file=")) {
        let page_kb = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("kernelpagesize_kB="))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(4);
        for w in line.split_whitespace() {
            if let Some((n, pages)) = w.strip_prefix('N').and_then(|r| r.split_once('=')) {
                if let (Ok(n), Ok(p)) = (n.parse::<u32>(), pages.parse::<u64>()) {
                    *per.entry(n).or_insert(0) += p * page_kb * 1024;
                }
            }
        }
    }
    println!(
        "{}",
        serde_json::json!({ "anon_bytes": per.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>() })
    );
    use std::io::Write;
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    // exit(3), the region still mapped: the pin library's destructor reads numa_maps then.
    std::process::exit(0)
}

fn verify_share(loci: &Path, cpu_node: u32, mem_node: u32) -> Result<(), String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let me = me.to_str().ok_or("own path is not UTF-8")?.to_string();
    let json = std::env::temp_dir().join(format!("loci-verify-{}.json", std::process::id()));
    let json_s = json.to_str().unwrap().to_string();
    let threads = format!("nodes:{cpu_node}");
    let m = mem_node.to_string();
    let out = run(
        loci,
        &[
            "run",
            "--threads",
            &threads,
            "-n",
            "1",
            "--verify-json",
            &json_s,
            "--",
            &me,
            "--touch-remote",
            &m,
            "--region-mib",
            "32",
        ],
    )?;
    if !out.status.success() {
        return Err(format!(
            "loci run --verify-json exited {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let child: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("child printed no JSON: {e}"))?;
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(&json).map_err(|e| format!("{json_s}: {e}"))?,
    )
    .map_err(|e| format!("{json_s}: {e}"))?;
    let _ = std::fs::remove_file(&json);
    let exit = &v["exit"];
    let loci_share = exit["remote_share"]
        .as_f64()
        .ok_or("verify JSON has no exit.remote_share")?;
    let expected = exit["expected_nodes"]
        .as_str()
        .and_then(|s| NodeSet::parse(s).ok())
        .ok_or("verify JSON has no exit.expected_nodes")?;
    let per: BTreeMap<u32, u64> = child["anon_bytes"]
        .as_object()
        .ok_or("child JSON has no anon_bytes")?
        .iter()
        .map(|(k, b)| (k.parse().unwrap_or(u32::MAX), b.as_u64().unwrap_or(0)))
        .collect();
    let total: u64 = per.values().sum();
    let remote: u64 = per
        .iter()
        .filter(|(n, _)| !expected.contains(**n))
        .map(|(_, b)| b)
        .sum();
    let ours = remote as f64 / total.max(1) as f64;
    if exit["memory_by"] != "program-at-exit" {
        return Err(format!(
            "the exit report's memory was not read by the program at exit: memory_by {}, anon {}",
            exit["memory_by"], exit["anon_bytes"]
        ));
    }
    // The child's reading and the pin library's at exit are moments apart; the 32 MiB region dominates both.
    if (ours - loci_share).abs() > 0.02 || ours < 0.5 {
        return Err(format!(
            "loci --verify remote share {loci_share:.4} (anon {}), numa_maps in the child {ours:.4} ({per:?}), \
             expected nodes {expected}",
            exit["anon_bytes"]
        ));
    }
    Ok(())
}

/// `loci ARGS` must fail cleanly: nonzero exit that is not a panic (101) or a signal, a message on stderr that names
/// `mention`, and no Rust panic text.
fn clean_error(loci: &Path, args: &[&str], mention: &str) -> Result<(), String> {
    let out = run(loci, args)?;
    let err = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    if out.status.success() {
        return Err(format!("`loci {}` succeeded, want an error", show(args)));
    }
    if code.is_none() || code == Some(101) || err.contains("panicked") {
        return Err(format!(
            "`loci {}` crashed ({}): {}",
            show(args),
            out.status,
            err.trim()
        ));
    }
    if !err.contains(mention) {
        return Err(format!(
            "`loci {}`: the error does not name {mention:?}: {}",
            show(args),
            err.trim()
        ));
    }
    Ok(())
}

/// `loci` commands that must fail with a clean error naming the bad number `N`: (check name, the
/// arguments), `N` standing for the number in both (a name without `N` is the check's whole name).
const ON_MEMORYLESS_NODE: [(&str, &str); 2] = [
    ("bind-memoryless-nodeN", "run --mem bind:N -- true"),
    (
        "preferred-memoryless-nodeN",
        "plan --mem preferred:N --json",
    ),
];
const ON_CPULESS_NODE: [(&str, &str); 1] =
    [("threads-cpuless-nodeN", "run --threads nodes:N -- true")];
const ON_MISSING_NODE: [(&str, &str); 2] = [
    ("bind-no-such-nodeN", "run --mem bind:N -- true"),
    ("threads-no-such-nodeN", "plan --threads nodes:N --json"),
];
const ON_MISSING_CPU: [(&str, &str); 1] = [("no-such-cpu", "plan --threads cpus:N --json")];
const ON_TOO_MANY_THREADS: [(&str, &str); 1] = [(
    "more-threads-than-cpus",
    "plan --threads compact -n N --json",
)];

pub(super) fn error_checks(c: &mut Checker, loci: &Path, nodes: &[SysNode]) {
    let missing_node = nodes.iter().map(|n| n.id as usize).max().unwrap_or(0) + 1;
    let ncpus: usize = nodes.iter().map(|n| n.cpus.len()).sum();
    let mut cases: Vec<(&[(&str, &str)], usize)> = Vec::new();
    for n in nodes {
        if n.mem_total_kb == 0 {
            cases.push((&ON_MEMORYLESS_NODE, n.id as usize));
        }
        if n.cpus.is_empty() {
            cases.push((&ON_CPULESS_NODE, n.id as usize));
        }
    }
    cases.push((&ON_MISSING_NODE, missing_node));
    cases.push((&ON_MISSING_CPU, ncpus + 5));
    cases.push((&ON_TOO_MANY_THREADS, ncpus + 1));
    for (commands, number) in cases {
        let number = number.to_string();
        for (name, args) in commands {
            c.check(format!("cli-errors/{}", name.replace('N', &number)), || {
                let args = args.replace('N', &number);
                let args: Vec<&str> = args.split_whitespace().collect();
                clean_error(loci, &args, &number)
            });
        }
    }
}
