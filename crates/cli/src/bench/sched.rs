//! `loci bench sched`: the locality-aware scheduler (LAS) against its baselines (NLS, unpinned)
//! and rayon, on seed 003's shapes: tiny tasks (scheduling overhead), independent tasks that do
//! real work (a few KiB of memory read per task), 16 concurrent pipeline requests, one pipeline
//! request.
//!
//! rayon runs each case in its best form for the shape, in the row named `rayon` (the baseline
//! of the ratios; `config.form` says which): a `join` tree for tiny tasks, `par_iter().for_each`
//! for independent tasks, `scope` spawns for the pipelines (a chain spawns its successor, which
//! `join` cannot express). Other rayon forms of the same case are labelled rows of their own
//! (`rayon-scope`, `rayon-join`), never the baseline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;
use loci_report::{median, Machine, Report, Row};
use loci_sched::workload::{
    aggregate, check_checksums, locality_check, pipeline_expected, produce, run_pipelines_into,
    transform, tree, PipelineSpec,
};
use loci_sched::{Affinity, Config, Ctx, Policy, Rule, Scheduler, Stats};

#[derive(Args, Debug)]
pub struct SchedArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Cases to run (comma list of tiny-tasks, real-work, multi-request, single-request).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tiny-tasks,real-work,multi-request,single-request"
    )]
    pub cases: Vec<String>,
    /// Systems to run (comma list of loci-las, loci-nls, loci-unpinned, rayon; rayon runs its
    /// best form per case plus the labelled other forms: rayon-scope in tiny-tasks, rayon-join in
    /// real-work).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "loci-las,loci-nls,loci-unpinned,rayon"
    )]
    pub systems: Vec<String>,
    /// Empty tasks in the tiny-tasks case (default 10M, 1M with --quick).
    #[arg(long)]
    pub tasks: Option<u64>,
    /// Tasks in the real-work case (default 1M, 100k with --quick).
    #[arg(long)]
    pub work_tasks: Option<u64>,
    /// Bytes each real-work task reads (a multiple of 8).
    #[arg(long, default_value_t = 16 << 10)]
    pub work_bytes: usize,
    /// Bytes of the shared buffer the real-work tasks read from (larger than the LLC).
    #[arg(long, default_value_t = 64 << 20)]
    pub work_buffer_bytes: usize,
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
const CASES: [&str; 4] = ["tiny-tasks", "real-work", "multi-request", "single-request"];

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

/// rayon's best form of the tiny-tasks tree (its documented fork-join primitive): the same tree
/// of exactly `n` tasks as loci's [`tree`] (a node with `n` tasks has children of `(n-1)/2` and
/// the rest), each node one call; a node with two children `join`s them (the second is a job on
/// the worker's stack that another worker may steal, the first runs inline), a node with one
/// child calls it. `visit` runs once per task (a no-op in the benchmark; tests count with it).
fn rayon_join_tree<F: Fn() + Sync>(n: u64, visit: &F) {
    visit();
    if n <= 1 {
        return;
    }
    let rest = n - 1;
    let left = rest / 2;
    let right = rest - left;
    if left > 0 {
        rayon::join(
            || rayon_join_tree(left, visit),
            || rayon_join_tree(right, visit),
        );
    } else {
        rayon_join_tree(right, visit);
    }
}

/// The real-work case: `tasks` independent tasks; task `i` reads `words` words (a few KiB) of a
/// shared buffer larger than the LLC, at a slice picked by a hash of `i`, folds them into one
/// word and writes that into its own slot `out[i]`. Deterministic: [`RealWork::checksum`] of the
/// slots is the same for every system that ran every task once.
struct RealWork {
    data: Vec<u64>,
    words: usize,
    out: Vec<AtomicU64>,
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl RealWork {
    /// `buffer_bytes` of pseudo-random words (rounded down to whole slices of `bytes`, at least
    /// one) and `tasks` zeroed result slots.
    fn new(tasks: u64, bytes: usize, buffer_bytes: usize) -> RealWork {
        let words = (bytes / 8).max(1);
        let slices = (buffer_bytes / 8 / words).max(1);
        let mut s = 0x5EED_u64;
        let data = (0..slices * words)
            .map(|_| {
                s = mix(s);
                s
            })
            .collect();
        RealWork {
            data,
            words,
            out: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn tasks(&self) -> u64 {
        self.out.len() as u64
    }

    /// Task `i`'s work (never inlined: the same machine code under every scheduler).
    #[inline(never)]
    fn item(&self, i: u64) -> u64 {
        let slices = (self.data.len() / self.words) as u64;
        let s = (mix(i) % slices) as usize * self.words;
        self.data[s..s + self.words]
            .iter()
            .fold(i, |a, &x| a.wrapping_add(x ^ (a >> 3)))
    }

    /// Runs task `i`: its result into its own slot.
    #[inline]
    fn run(&self, i: u64) {
        self.out[i as usize].store(self.item(i), Ordering::Relaxed);
    }

    fn clear(&self) {
        for o in &self.out {
            o.store(0, Ordering::Relaxed);
        }
    }

    /// A checksum of every slot with its index (a skipped task leaves a 0 that changes it).
    fn checksum(&self) -> u64 {
        self.out.iter().enumerate().fold(0u64, |a, (i, o)| {
            a.wrapping_add(mix(o.load(Ordering::Relaxed) ^ (i as u64).rotate_left(32)))
        })
    }

    /// The checksum every system must produce, computed on this thread.
    fn expected(&self) -> u64 {
        self.out.iter().enumerate().fold(0u64, |a, (i, _)| {
            a.wrapping_add(mix(self.item(i as u64) ^ (i as u64).rotate_left(32)))
        })
    }
}

/// loci's form of the real-work case: the tiny-tasks tree (immediate spawns, one request), each
/// node one task that first spawns its children (the items after it: `lo+1..lo+1+left` and the
/// rest) and then runs item `lo`. A free worker steals the oldest task of the other's queue,
/// which is the largest subtree still unclaimed. Spawned rather than joined: loci has no join,
/// and no task waits for its children (the request ends when its last task does).
fn loci_work_tree(ctx: &Ctx, w: &'static RealWork, lo: u64, n: u64) {
    if n > 1 {
        let rest = n - 1;
        let left = rest / 2;
        let right = rest - left;
        // The right subtree first: this worker runs the youngest task next (the left subtree,
        // so items run in about ascending order, as in rayon's join), another steals the oldest.
        ctx.spawn_immediate(move |c| loci_work_tree(c, w, lo + 1 + left, right));
        if left > 0 {
            ctx.spawn_immediate(move |c| loci_work_tree(c, w, lo + 1, left));
        }
    }
    w.run(lo);
}

/// rayon's `join` over the same tree as [`loci_work_tree`] (the labelled `rayon-join` row of
/// real-work): one call per task, the subtrees joined.
fn rayon_work_join(w: &RealWork, lo: u64, n: u64) {
    if n > 1 {
        let rest = n - 1;
        let left = rest / 2;
        let right = rest - left;
        if left > 0 {
            rayon::join(
                || rayon_work_join(w, lo + 1, left),
                || rayon_work_join(w, lo + 1 + left, right),
            );
        } else {
            rayon_work_join(w, lo + 1 + left, right);
        }
    }
    w.run(lo);
}

/// rayon's best form for independent tasks, what its documentation leads to: a parallel
/// iterator over the task indices (adaptive splitting: a worker runs a range of items as plain
/// loop iterations and splits it only when another worker is idle to steal the other half).
fn rayon_work_par_iter(w: &RealWork) {
    use rayon::prelude::*;
    (0..w.tasks()).into_par_iter().for_each(|i| w.run(i));
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
    let work_tasks = a
        .work_tasks
        .unwrap_or(if quick { 100_000 } else { 1_000_000 });
    let spec = PipelineSpec {
        chains: a.chains,
        buffers: a.buffers.unwrap_or(if quick { 16 } else { 64 }),
        buffer_bytes: a.buffer_bytes,
    };
    anyhow::ensure!(tasks > 0, "--tasks must be positive");
    anyhow::ensure!(work_tasks > 0, "--work-tasks must be positive");
    anyhow::ensure!(
        a.work_bytes >= 8 && a.work_bytes.is_multiple_of(8) && a.work_buffer_bytes >= a.work_bytes,
        "--work-bytes must be a positive multiple of 8 and at most --work-buffer-bytes, got {} and {}",
        a.work_bytes,
        a.work_buffer_bytes
    );
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
            "work_tasks": work_tasks, "work_bytes": a.work_bytes,
            "work_buffer_bytes": a.work_buffer_bytes,
            "cache_level": a.cache_level, "affinity": format!("{affinity:?}").to_lowercase(),
        }),
        Machine::of(&topo),
    );
    if a.check_locality {
        return Ok(rep);
    }
    let threads = topo.allowed_cpus().len();
    let bytes_per_request = (spec.chains * spec.buffers * spec.buffer_bytes) as f64;
    let pipelines = a
        .cases
        .iter()
        .any(|c| c == "multi-request" || c == "single-request");
    let expected: Vec<u64> = (0..if pipelines { a.requests as u64 } else { 0 })
        .map(|s| pipeline_expected(s, spec))
        .collect();
    // Every system's request i adds its checksum into accs[i]: the same slots, touched the same
    // way, on every system (loci's tasks carry a `&'static` like rayon's scoped tasks carry a
    // borrow, with no reference count to bump per task). Leaked once: a few bytes per run.
    let accs: &'static [AtomicU64] =
        Box::leak((0..a.requests).map(|_| AtomicU64::new(0)).collect());
    // The real-work buffer and result slots, shared the same way (leaked once per run of the
    // bench), and the checksum every system must produce, computed here before any timing.
    let work: Option<(&'static RealWork, u64)> = if a.cases.iter().any(|c| c == "real-work") {
        let w: &'static RealWork = Box::leak(Box::new(RealWork::new(
            work_tasks,
            a.work_bytes,
            a.work_buffer_bytes,
        )));
        Some((w, w.expected()))
    } else {
        None
    };

    // Every system exists for the whole run (idle pools park their workers), and each rep runs
    // the systems one after the other in a rotating order: on a shared machine a load spike then
    // hits every system of a rep rather than all reps of one system.
    struct System {
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
        systems.push(System { sched, pool });
    }
    // One timed run of one row: wall and process cpu seconds. Results are checked after the
    // timing (the pipelines' loci side checks inside `run_pipelines_into`, as before).
    let run_once = |sys: &System, row: &RowSpec, case: &str| -> anyhow::Result<(f64, f64)> {
        if let Some((w, _)) = work.filter(|_| case == "real-work") {
            w.clear();
        }
        let c0 = process_cpu_s();
        let t = Instant::now();
        match (case, &sys.sched, &sys.pool) {
            ("tiny-tasks", Some(s), _) => s
                .submit(move |ctx| tree(ctx, tasks))
                .wait()
                .map_err(anyhow::Error::msg)?,
            ("tiny-tasks", _, Some(p)) => match row.form {
                Form::Join => p.install(|| rayon_join_tree(tasks, &|| {})),
                _ => p.scope(|s| rayon_tree(s, tasks)),
            },
            ("real-work", Some(s), _) => {
                let (w, _) = work.expect("built for real-work");
                s.submit(move |ctx| loci_work_tree(ctx, w, 0, w.tasks()))
                    .wait()
                    .map_err(anyhow::Error::msg)?
            }
            ("real-work", _, Some(p)) => {
                let (w, _) = work.expect("built for real-work");
                match row.form {
                    Form::Join => p.install(|| rayon_work_join(w, 0, w.tasks())),
                    _ => p.install(|| rayon_work_par_iter(w)),
                }
            }
            (c, Some(s), _) => {
                let n = if c == "multi-request" { a.requests } else { 1 };
                run_pipelines_into(s, spec, &accs[..n], &expected)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", row.name))?;
            }
            (c, _, Some(p)) => {
                let n = if c == "multi-request" { a.requests } else { 1 };
                rayon_pipelines(p, spec, &accs[..n]);
                check_checksums(
                    accs[..n].iter().map(|a| a.load(Ordering::Relaxed)),
                    &expected,
                )
                .map_err(|e| anyhow::anyhow!("{}: {e}", row.name))?;
            }
            _ => unreachable!("one of sched/pool exists"),
        }
        let wall = t.elapsed().as_secs_f64();
        let cpu = process_cpu_s() - c0;
        if let Some((w, want)) = work.filter(|_| case == "real-work") {
            let got = w.checksum();
            anyhow::ensure!(
                got == want,
                "{} real-work: checksum {got:#x}, expected {want:#x} (computed on one thread)",
                row.name
            );
        }
        Ok((wall, cpu))
    };

    for case in &a.cases {
        let before: Vec<Option<Stats>> = systems
            .iter()
            .map(|s| s.sched.as_ref().map(|s| s.stats()))
            .collect();
        // The rows of this case: (system index, row).
        let rows: Vec<(usize, RowSpec)> = a
            .systems
            .iter()
            .enumerate()
            .flat_map(|(i, name)| row_specs(case, name).into_iter().map(move |r| (i, r)))
            .collect();
        let per_run = tasks_per_run(case, tasks, work_tasks, a.requests, spec);
        let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(reps); rows.len()];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::with_capacity(reps); rows.len()];
        // The first round warms up (threads, allocator); it is not timed.
        for (i, r) in &rows {
            run_once(&systems[*i], r, case)?;
        }
        for rep_i in 0..reps {
            for k in 0..rows.len() {
                let j = (k + rep_i) % rows.len();
                let (i, r) = &rows[j];
                let (w, c) = run_once(&systems[*i], r, case)?;
                times[j].push(w);
                cpu[j].push(c);
            }
        }
        for (((i, spec_row), t), c) in rows.iter().zip(times).zip(cpu) {
            let sys = &systems[*i];
            let cpu_med = median(&c).unwrap_or(0.0);
            let mut row = Row::from_times(&spec_row.name, t)
                .case(case)
                .config("threads", threads)
                .extra("cpu_s_median", cpu_med)
                .extra("tasks_per_run", per_run)
                .extra("cpu_ns_per_task", cpu_med * 1e9 / per_run as f64)
                .extra("cpu_s", &c);
            if spec_row.form != Form::Loci {
                row = row.config("form", spec_row.form.name());
            }
            row = match case.as_str() {
                "tiny-tasks" => row.work(tasks as f64, "tasks/s"),
                "real-work" => row.work(work_tasks as f64, "tasks/s").extra(
                    "checksum",
                    format!("{:#x}", work.map(|(_, e)| e).unwrap_or(0)),
                ),
                "multi-request" => row.work(bytes_per_request * a.requests as f64, "B/s"),
                _ => row.work(bytes_per_request, "B/s"),
            };
            if let (Some(s), Some(b)) = (&sys.sched, &before[*i]) {
                let st = s.stats().since(b);
                row = row.extra("counters", counters_json(&st));
            }
            rep.results.push(row);
        }
    }
    Ok(rep)
}

/// How a row's system runs a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// A loci scheduler (the case's one loci form; see docs/sched.md).
    Loci,
    /// `rayon::join` recursion.
    Join,
    /// `rayon::scope` spawns (a boxed job per task).
    Scope,
    /// `into_par_iter().for_each` over the task indices.
    ParIter,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::Loci => "loci",
            Form::Join => "join",
            Form::Scope => "scope",
            Form::ParIter => "par_iter",
        }
    }
}

/// One row of a case: its system name in the report and how it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RowSpec {
    name: String,
    form: Form,
}

/// The rows that `system` contributes to `case`: a loci system one; rayon its best form for the
/// case as `rayon` (the baseline of the ratios), then its other forms as labelled rows.
fn row_specs(case: &str, system: &str) -> Vec<RowSpec> {
    let r = |name: &str, form| RowSpec {
        name: name.to_string(),
        form,
    };
    if policy_of(system).is_some() {
        return vec![r(system, Form::Loci)];
    }
    match case {
        // join: rayon's cheapest fork (a stack job, no allocation); scope: the fire-and-forget
        // spawn that matches loci's tree spawn for spawn (a boxed job per task).
        "tiny-tasks" => vec![r("rayon", Form::Join), r("rayon-scope", Form::Scope)],
        // par_iter: what rayon's documentation leads to for independent items; join: the same
        // one-call-per-task tree as loci's.
        "real-work" => vec![r("rayon", Form::ParIter), r("rayon-join", Form::Join)],
        // A chain spawns its successor and the stages of one buffer follow each other: spawns
        // into one scope (join would make every producer wait for its whole chain).
        _ => vec![r("rayon", Form::Scope)],
    }
}

/// Tasks in one run of `case`, the same count for every system (the denominator of cpu time per
/// task): the tree's tasks; the real-work tasks; per pipeline request its first task and three
/// stage tasks per buffer (rayon: the per-request spawn and three spawns per buffer).
fn tasks_per_run(
    case: &str,
    tasks: u64,
    work_tasks: u64,
    requests: usize,
    spec: PipelineSpec,
) -> u64 {
    let per_request = 1 + 3 * (spec.chains * spec.buffers) as u64;
    match case {
        "tiny-tasks" => tasks,
        "real-work" => work_tasks,
        "multi-request" => requests as u64 * per_request,
        _ => per_request,
    }
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

/// Cpu time per task of every row, one table per case: process cpu time (user + system) per
/// timed run, median over the reps, divided by the case's tasks per run.
pub fn cpu_table(rep: &Report) -> String {
    let mut out = String::new();
    let mut cases: Vec<&str> = Vec::new();
    for r in &rep.results {
        if let Some(c) = r.case.as_deref() {
            if !cases.contains(&c) {
                cases.push(c);
            }
        }
    }
    for case in cases {
        out += &format!(
            "\nsched {case}: cpu time per task (process user+sys per timed run, median)\n  {:<22} {:>12} {:>14} {:>10}\n",
            "system", "cpu s/run", "cpu ns/task", "cpus busy"
        );
        for r in rep.rows_of(Some(case)) {
            let f = |k: &str| r.extra.get(k).and_then(|v| v.as_f64());
            if let (Some(c), Some(ns)) = (f("cpu_s_median"), f("cpu_ns_per_task")) {
                out += &format!(
                    "  {:<22} {:>12.4} {:>14.1} {:>10.2}\n",
                    r.label(),
                    c,
                    ns,
                    c / r.median_s
                );
            }
        }
    }
    out
}

/// The goals of the like-for-like comparison: loci-las at most 1.00x the time of rayon's best
/// form (`rayon`) in tiny-tasks (a join tree) and real-work (par_iter), and the ratios against
/// the other rayon forms for reference.
pub fn goals(rep: &Report) -> String {
    let mut out = String::new();
    for case in ["tiny-tasks", "real-work"] {
        let rows: Vec<&Row> = rep.rows_of(Some(case)).collect();
        let (Some(loci), Some(best)) = (
            rows.iter().find(|r| r.system == "loci-las"),
            rows.iter().find(|r| r.system == "rayon"),
        ) else {
            continue;
        };
        let form = best.config.get("form").map(String::as_str).unwrap_or("?");
        let ratio = loci.median_s / best.median_s;
        out += &format!(
            "{case}: loci-las {ratio:.2}x the time of rayon {form} (goal <= 1.00x): {}",
            if ratio <= 1.0 { "met" } else { "NOT met" }
        );
        for r in rows.iter().filter(|r| r.system.starts_with("rayon-")) {
            out += &format!("; {:.2}x {}", loci.median_s / r.median_s, r.system);
        }
        out += "\n";
    }
    out
}

/// Prints the cpu time per task, the counters of the loci rows and the goals (after the table).
pub fn print_counters(rep: &Report) {
    print!("{}", cpu_table(rep));
    println!();
    for r in &rep.results {
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
    print!("{}", goals(rep));
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    fn scheduler(policy: Policy) -> Scheduler {
        let topo = crate::this_machine().unwrap();
        Scheduler::new(
            &topo,
            Config {
                policy,
                ..Config::default()
            },
        )
        .unwrap()
    }

    /// rayon's join tree runs exactly as many tasks as loci's spawn tree of the same size.
    #[test]
    fn rayon_join_tree_runs_exactly_n_tasks() {
        let p = pool(2);
        let sched = scheduler(Policy::Las);
        for n in (1..=70).chain([1000, 4097, 100_000]) {
            let count = AtomicU64::new(0);
            p.install(|| {
                rayon_join_tree(n, &|| {
                    count.fetch_add(1, Ordering::Relaxed);
                })
            });
            assert_eq!(count.load(Ordering::Relaxed), n, "join tree of {n}");
            let before = sched.stats();
            sched.submit(move |ctx| tree(ctx, n)).wait().unwrap();
            assert_eq!(sched.stats().since(&before).tasks, n, "loci tree of {n}");
        }
    }

    /// Every system's form of the real-work case runs every task once: the checksum equals the
    /// one computed on one thread, for loci (LAS, NLS) and rayon (par_iter, join); a skipped
    /// task changes it.
    #[test]
    fn real_work_checksum_is_the_same_for_every_system() {
        let p = pool(2);
        let las = scheduler(Policy::Las);
        let nls = scheduler(Policy::Nls);
        for (n, bytes, buffer) in [
            (1u64, 64, 64),
            (2, 64, 4096),
            (1000, 256, 1 << 16),
            (5001, 4096, 1 << 20),
        ] {
            let w: &'static RealWork = Box::leak(Box::new(RealWork::new(n, bytes, buffer)));
            let want = w.expected();
            let mut got = Vec::new();
            for s in [&las, &nls] {
                w.clear();
                s.submit(move |ctx| loci_work_tree(ctx, w, 0, w.tasks()))
                    .wait()
                    .unwrap();
                got.push(w.checksum());
            }
            w.clear();
            p.install(|| rayon_work_par_iter(w));
            got.push(w.checksum());
            w.clear();
            p.install(|| rayon_work_join(w, 0, w.tasks()));
            got.push(w.checksum());
            assert_eq!(got, vec![want; 4], "n={n} bytes={bytes}");
            // The same run with the last task skipped does not pass.
            w.clear();
            for i in 0..n - 1 {
                w.run(i);
            }
            assert_ne!(
                w.checksum(),
                want,
                "n={n}: a skipped task must change the checksum"
            );
        }
        // Different tasks read different slices: the results are not all the same word.
        let w = RealWork::new(64, 64, 1 << 16);
        let items: std::collections::HashSet<u64> = (0..64).map(|i| w.item(i)).collect();
        assert!(items.len() > 60);
    }

    #[test]
    fn rayon_rows_put_the_best_form_first_as_rayon() {
        let names = |case: &str| -> Vec<(String, Form)> {
            row_specs(case, "rayon")
                .into_iter()
                .map(|r| (r.name, r.form))
                .collect()
        };
        assert_eq!(
            names("tiny-tasks"),
            [
                ("rayon".into(), Form::Join),
                ("rayon-scope".into(), Form::Scope)
            ]
        );
        assert_eq!(
            names("real-work"),
            [
                ("rayon".into(), Form::ParIter),
                ("rayon-join".into(), Form::Join)
            ]
        );
        assert_eq!(names("multi-request"), [("rayon".into(), Form::Scope)]);
        assert_eq!(row_specs("tiny-tasks", "loci-las")[0].form, Form::Loci);
        let spec = PipelineSpec {
            chains: 4,
            buffers: 16,
            buffer_bytes: 64,
        };
        assert_eq!(tasks_per_run("tiny-tasks", 7, 9, 16, spec), 7);
        assert_eq!(tasks_per_run("real-work", 7, 9, 16, spec), 9);
        assert_eq!(tasks_per_run("single-request", 7, 9, 16, spec), 1 + 3 * 64);
        assert_eq!(
            tasks_per_run("multi-request", 7, 9, 16, spec),
            16 * (1 + 3 * 64)
        );
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: SchedArgs,
    }

    /// A tiny run of both new-shape cases: every row is there, carries cpu time per task, and
    /// the goals compare loci-las with the `rayon` row (its best form).
    #[test]
    fn tiny_run_reports_cpu_per_task_and_goals() {
        let cli = Cli::parse_from([
            "x",
            "--cases",
            "tiny-tasks,real-work",
            "--tasks",
            "5000",
            "--work-tasks",
            "300",
            "--work-bytes",
            "512",
            "--work-buffer-bytes",
            "65536",
            "--reps",
            "2",
        ]);
        let rep = run(cli.a).unwrap();
        let labels: Vec<String> = rep
            .results
            .iter()
            .map(|r| format!("{} {}", r.case.as_deref().unwrap(), r.system))
            .collect();
        assert_eq!(
            labels,
            [
                "tiny-tasks loci-las",
                "tiny-tasks loci-nls",
                "tiny-tasks loci-unpinned",
                "tiny-tasks rayon",
                "tiny-tasks rayon-scope",
                "real-work loci-las",
                "real-work loci-nls",
                "real-work loci-unpinned",
                "real-work rayon",
                "real-work rayon-join",
            ]
        );
        for r in &rep.results {
            let per = r.extra["tasks_per_run"].as_u64().unwrap();
            assert_eq!(
                per,
                if r.case.as_deref() == Some("tiny-tasks") {
                    5000
                } else {
                    300
                }
            );
            let ns = r.extra["cpu_ns_per_task"].as_f64().unwrap();
            let cpu = r.extra["cpu_s_median"].as_f64().unwrap();
            assert!((ns - cpu * 1e9 / per as f64).abs() < 1e-6 * ns.max(1.0));
            assert_eq!(r.extra["cpu_s"].as_array().unwrap().len(), 2);
        }
        let form = |i: usize| rep.results[i].config.get("form").cloned();
        assert_eq!(form(3).as_deref(), Some("join"));
        assert_eq!(form(8).as_deref(), Some("par_iter"));
        assert_eq!(form(0), None);
        let g = goals(&rep);
        assert!(
            g.contains("tiny-tasks: loci-las") && g.contains("of rayon join"),
            "{g}"
        );
        assert!(
            g.contains("real-work: loci-las") && g.contains("of rayon par_iter"),
            "{g}"
        );
        assert!(cpu_table(&rep).contains("rayon-scope scope/"));
    }

    #[test]
    fn goals_say_met_only_at_or_below_parity() {
        let row = |sys: &str, case: &str, t: f64| Row::from_times(sys, vec![t]).case(case);
        let mut rep = Report::new(
            "sched",
            serde_json::json!({}),
            Machine { nodes: 1, cpus: 2 },
        );
        rep.results = vec![
            row("loci-las", "tiny-tasks", 2.0),
            row("rayon", "tiny-tasks", 1.0).config("form", "join"),
            row("rayon-scope", "tiny-tasks", 4.0),
            row("loci-las", "real-work", 1.0),
            row("rayon", "real-work", 1.0).config("form", "par_iter"),
        ];
        let g = goals(&rep);
        assert!(
            g.contains("tiny-tasks: loci-las 2.00x the time of rayon join (goal <= 1.00x): NOT met; 0.50x rayon-scope"),
            "{g}"
        );
        assert!(
            g.contains("real-work: loci-las 1.00x the time of rayon par_iter (goal <= 1.00x): met"),
            "{g}"
        );
    }
}
