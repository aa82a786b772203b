//! `loci bench sched`: the locality-aware scheduler (LAS) against its baselines (NLS, unpinned)
//! and rayon, on seed 003's shapes: tiny tasks (scheduling overhead), 16 concurrent pipeline
//! requests, one pipeline request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;
use loci_report::{median, Machine, Report, Row};
use loci_sched::workload::{
    aggregate, check_checksums, locality_check, pipeline_expected, produce, run_pipelines_into,
    transform, tree, PipelineSpec,
};
use loci_sched::{Affinity, Config, Policy, Rule, Scheduler, Stats};

#[derive(Args, Debug)]
pub struct SchedArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Cases to run (comma list of tiny-tasks, multi-request, single-request).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tiny-tasks,multi-request,single-request"
    )]
    pub cases: Vec<String>,
    /// Systems to run (comma list of loci-las, loci-nls, loci-unpinned, rayon).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "loci-las,loci-nls,loci-unpinned,rayon"
    )]
    pub systems: Vec<String>,
    /// Empty tasks in the tiny-tasks case (default 10M, 1M with --quick).
    #[arg(long)]
    pub tasks: Option<u64>,
    /// Concurrent requests in the multi-request case.
    #[arg(long, default_value_t = 16)]
    pub requests: usize,
    /// Producer chains per pipeline request.
    #[arg(long, default_value_t = 4)]
    pub chains: usize,
    /// Buffers per chain (default 64, 16 with --quick).
    #[arg(long)]
    pub buffers: Option<usize>,
    /// Bytes per pipeline buffer.
    #[arg(long, default_value_t = 64 << 10)]
    pub buffer_bytes: usize,
    /// Cache level that forms core groups (default: the last-level cache), e.g. 2 for L2 groups.
    #[arg(long)]
    pub cache_level: Option<u8>,
    /// Pin each loci worker to one cpu instead of giving it its group's cpus.
    #[arg(long)]
    pub pin_cpu: bool,
    /// Instead of timing: run the multi-request case under LAS and NLS and fail unless LAS keeps
    /// >= 90% of each request's tasks on one node and NLS does not (needs >= 2 nodes).
    #[arg(long)]
    pub check_locality: bool,
}

const SYSTEMS: [&str; 4] = ["loci-las", "loci-nls", "loci-unpinned", "rayon"];
const CASES: [&str; 3] = ["tiny-tasks", "multi-request", "single-request"];

fn policy_of(system: &str) -> Option<Policy> {
    match system {
        "loci-las" => Some(Policy::Las),
        "loci-nls" => Some(Policy::Nls),
        "loci-unpinned" => Some(Policy::Unpinned),
        _ => None,
    }
}

fn rayon_tree<'s>(s: &rayon::Scope<'s>, n: u64) {
    if n <= 1 {
        return;
    }
    let rest = n - 1;
    let left = rest / 2;
    let right = rest - left;
    if left > 0 {
        s.spawn(move |s| rayon_tree(s, left));
    }
    s.spawn(move |s| rayon_tree(s, right));
}

fn rayon_producer<'s>(
    s: &rayon::Scope<'s>,
    seed: u64,
    chain: usize,
    k: usize,
    spec: PipelineSpec,
    acc: &'s AtomicU64,
) {
    if k + 1 < spec.buffers {
        s.spawn(move |s| rayon_producer(s, seed, chain, k + 1, spec, acc));
    }
    let mut buf = produce(seed, chain, k, spec.buffer_bytes);
    s.spawn(move |s| {
        transform(&mut buf);
        s.spawn(move |_| {
            acc.fetch_add(aggregate(&buf), Ordering::Relaxed);
        });
    });
}

/// The same pipeline requests on rayon: one scope, every stage a spawn (rayon has no requests or
/// deferred tasks). Request `i` adds its checksum into `accs[i]`, which this zeroes first, as
/// `run_pipelines_into` does for loci.
fn rayon_pipelines(pool: &rayon::ThreadPool, spec: PipelineSpec, accs: &[AtomicU64]) {
    for a in accs {
        a.store(0, Ordering::Relaxed);
    }
    pool.scope(|s| {
        for (seed, acc) in accs.iter().enumerate() {
            s.spawn(move |s| {
                for chain in 0..spec.chains {
                    s.spawn(move |s| rayon_producer(s, seed as u64, chain, 0, spec, acc));
                }
            });
        }
    });
}

fn counters_json(st: &Stats) -> serde_json::Value {
    let found: serde_json::Map<String, serde_json::Value> = Rule::ALL
        .iter()
        .filter(|&&r| st.found_by(r) > 0)
        .map(|&r| (r.name().to_string(), st.found_by(r).into()))
        .collect();
    let shares: Vec<f64> = st.requests.iter().map(|r| r.main_node().1).collect();
    serde_json::json!({
        "tasks": st.tasks,
        "parks": st.parks,
        "found_by_rule": found,
        "steals": {
            "same_group": st.steals.same_group,
            "same_node": st.steals.same_node,
            "other_node": st.steals.other_node,
        },
        "requests": st.requests.len(),
        "min_main_node_share": shares.iter().copied().fold(1.0, f64::min),
        "mean_main_node_share": shares.iter().sum::<f64>() / shares.len().max(1) as f64,
        "tasks_per_node_by_request": st.requests.iter().map(|r| {
            serde_json::json!({ "id": r.id, "nodes": r.tasks_per_node.iter()
                .map(|(n, c)| serde_json::json!([n, c])).collect::<Vec<_>>() })
        }).collect::<Vec<_>>(),
    })
}

pub fn run(a: SchedArgs) -> anyhow::Result<Report> {
    for s in &a.systems {
        anyhow::ensure!(
            SYSTEMS.contains(&s.as_str()),
            "unknown system {s:?}; valid: {}",
            SYSTEMS.join(", ")
        );
    }
    for c in &a.cases {
        anyhow::ensure!(
            CASES.contains(&c.as_str()),
            "unknown case {c:?}; valid: {}",
            CASES.join(", ")
        );
    }
    let quick = a.common.quick;
    let tasks = a
        .tasks
        .unwrap_or(if quick { 1_000_000 } else { 10_000_000 });
    let spec = PipelineSpec {
        chains: a.chains,
        buffers: a.buffers.unwrap_or(if quick { 16 } else { 64 }),
        buffer_bytes: a.buffer_bytes,
    };
    anyhow::ensure!(tasks > 0, "--tasks must be positive");
    anyhow::ensure!(a.requests > 0, "--requests must be positive");
    anyhow::ensure!(
        spec.chains > 0 && spec.buffers > 0,
        "--chains and --buffers must be positive"
    );
    anyhow::ensure!(
        spec.buffer_bytes >= 8 && spec.buffer_bytes & 7 == 0,
        "--buffer-bytes must be a positive multiple of 8, got {}",
        spec.buffer_bytes
    );
    let reps = a.common.reps.unwrap_or(5);
    anyhow::ensure!(reps > 0, "--reps must be positive");
    let topo = crate::this_machine()?;
    let affinity = if a.pin_cpu {
        Affinity::Cpu
    } else {
        Affinity::Group
    };

    if a.check_locality {
        let [las, nls] =
            locality_check(&topo, affinity, a.requests, spec).map_err(anyhow::Error::msg)?;
        for o in [&las, &nls] {
            println!(
                "{}: main-node share of each request's tasks: min {:.1}%, mean {:.1}%",
                o.policy.name(),
                100.0 * o.min_share(),
                100.0 * o.mean_share()
            );
        }
        loci_sched::workload::LocalityOutcome::check(&las, &nls, 0.9)
            .map_err(anyhow::Error::msg)?;
        println!(
            "locality check passed: LAS keeps >= 90% of each request on one node, NLS does not"
        );
    }

    let mut rep = Report::new(
        "sched",
        serde_json::json!({
            "tasks": tasks, "requests": a.requests, "chains": spec.chains,
            "buffers": spec.buffers, "buffer_bytes": spec.buffer_bytes, "reps": reps,
            "cache_level": a.cache_level, "affinity": format!("{affinity:?}").to_lowercase(),
        }),
        Machine::of(&topo),
    );
    if a.check_locality {
        return Ok(rep);
    }
    let threads = topo.allowed_cpus().len();
    let bytes_per_request = (spec.chains * spec.buffers * spec.buffer_bytes) as f64;
    let pipelines = a.cases.iter().any(|c| c != "tiny-tasks");
    let expected: Vec<u64> = (0..if pipelines { a.requests as u64 } else { 0 })
        .map(|s| pipeline_expected(s, spec))
        .collect();
    // Every system's request i adds its checksum into accs[i]: the same slots, touched the same
    // way, on every system (loci's tasks carry a `&'static` like rayon's scoped tasks carry a
    // borrow, with no reference count to bump per task). Leaked once: a few bytes per run.
    let accs: &'static [AtomicU64] =
        Box::leak((0..a.requests).map(|_| AtomicU64::new(0)).collect());

    // Every system exists for the whole run (idle pools park their workers), and each rep runs
    // the systems one after the other in a rotating order: on a shared machine a load spike then
    // hits every system of a rep rather than all reps of one system.
    struct System {
        name: String,
        sched: Option<Scheduler>,
        pool: Option<rayon::ThreadPool>,
    }
    let mut systems = Vec::new();
    for name in &a.systems {
        let (sched, pool) = match policy_of(name) {
            Some(p) => (
                Some(Scheduler::new(
                    &topo,
                    Config {
                        policy: p,
                        cache_level: a.cache_level,
                        affinity,
                        ..Config::default()
                    },
                )?),
                None,
            ),
            None => (
                None,
                Some(
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()?,
                ),
            ),
        };
        systems.push(System {
            name: name.clone(),
            sched,
            pool,
        });
    }
    let run_once = |sys: &System, case: &str| -> anyhow::Result<(f64, f64)> {
        let c0 = process_cpu_s();
        let t = Instant::now();
        match (case, &sys.sched, &sys.pool) {
            ("tiny-tasks", Some(s), _) => s
                .submit(move |ctx| tree(ctx, tasks))
                .wait()
                .map_err(anyhow::Error::msg)?,
            ("tiny-tasks", _, Some(p)) => p.scope(|s| rayon_tree(s, tasks)),
            (c, Some(s), _) => {
                let n = if c == "multi-request" { a.requests } else { 1 };
                run_pipelines_into(s, spec, &accs[..n], &expected)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", sys.name))?;
            }
            (c, _, Some(p)) => {
                let n = if c == "multi-request" { a.requests } else { 1 };
                rayon_pipelines(p, spec, &accs[..n]);
                check_checksums(
                    accs[..n].iter().map(|a| a.load(Ordering::Relaxed)),
                    &expected,
                )
                .map_err(|e| anyhow::anyhow!("rayon: {e}"))?;
            }
            _ => unreachable!("one of sched/pool exists"),
        }
        let wall = t.elapsed().as_secs_f64();
        Ok((wall, process_cpu_s() - c0))
    };

    for case in &a.cases {
        let before: Vec<Option<Stats>> = systems
            .iter()
            .map(|s| s.sched.as_ref().map(|s| s.stats()))
            .collect();
        let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(reps); systems.len()];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::with_capacity(reps); systems.len()];
        // The first round warms up (threads, allocator); it is not timed.
        for sys in &systems {
            run_once(sys, case)?;
        }
        for rep_i in 0..reps {
            for k in 0..systems.len() {
                let i = (k + rep_i) % systems.len();
                let (w, c) = run_once(&systems[i], case)?;
                times[i].push(w);
                cpu[i].push(c);
            }
        }
        for (((sys, t), b), c) in systems.iter().zip(times).zip(&before).zip(cpu) {
            let cpu_med = median(&c).unwrap_or(0.0);
            let mut row = Row::from_times(&sys.name, t)
                .case(case)
                .config("threads", threads)
                .extra("cpu_s_median", cpu_med);
            row = match case.as_str() {
                "tiny-tasks" => row.work(tasks as f64, "tasks/s"),
                "multi-request" => row.work(bytes_per_request * a.requests as f64, "B/s"),
                _ => row.work(bytes_per_request, "B/s"),
            };
            if let (Some(s), Some(b)) = (&sys.sched, b) {
                let st = s.stats().since(b);
                row = row.extra("counters", counters_json(&st));
            }
            rep.results.push(row);
        }
    }
    Ok(rep)
}

/// CPU time (user + system) of the whole process so far, in seconds.
fn process_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Prints the counters of the loci rows (after the table).
pub fn print_counters(rep: &Report) {
    for r in &rep.results {
        if let Some(c) = r.extra.get("cpu_s_median").and_then(|v| v.as_f64()) {
            println!(
                "  {} {}: process cpu time per run (median) {:.4} s = {:.2} cpus busy over the median wall time",
                r.system,
                r.case.as_deref().unwrap_or(""),
                c,
                c / r.median_s
            );
        }
        let Some(c) = r.extra.get("counters") else {
            continue;
        };
        let found = c["found_by_rule"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        println!(
            "  {} {}: {found}; parks={}; steals same-group={} same-node={} other-node={}; main-node share min {:.2} mean {:.2}",
            r.system,
            r.case.as_deref().unwrap_or(""),
            c["parks"],
            c["steals"]["same_group"],
            c["steals"]["same_node"],
            c["steals"]["other_node"],
            c["min_main_node_share"].as_f64().unwrap_or(0.0),
            c["mean_main_node_share"].as_f64().unwrap_or(0.0),
        );
    }
}
