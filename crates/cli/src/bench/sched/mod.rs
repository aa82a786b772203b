//! `loci bench sched`: the locality-aware scheduler (LAS) against its baselines (NLS, unpinned)
//! and rayon, on seed 003's shapes: tiny tasks (scheduling overhead), independent tasks that do
//! real work (a few KiB of memory read per task), 16 concurrent pipeline requests, one pipeline
//! request.
//!
//! loci runs tiny-tasks and real-work as a tree of `Ctx::join`s, the very tree code rayon's `join`
//! rows run (`cases::Fork`); loci-las also runs them as a tree of fire-and-forget spawns, the
//! labelled row `loci-las-spawn`. The pipeline cases are requests.
//!
//! rayon runs each case in its best form for the shape, in the row named `rayon` (the baseline
//! of the ratios; `config.form` says which): a `join` tree for tiny tasks, `par_iter().for_each`
//! for independent tasks, `scope` spawns for the pipelines (a chain spawns its successor, which
//! `join` cannot express). Other rayon forms of the same case are labelled rows of their own
//! (`rayon-scope`, `rayon-join`), never the baseline.
//!
//! Files: `cases` (how each system runs each case), `summary` (what is printed after the table).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;
use loci_report::{median, Machine, Report, Row};
use loci_sched::workload::{
    check_checksums, locality_check, pipeline_expected, run_pipelines_into, tree, PipelineSpec,
};
use loci_sched::{Affinity, Config, Policy, Scheduler, Stats};

mod cases;
mod summary;

use cases::{
    join_tree, loci_work_tree, rayon_pipelines, rayon_tree, rayon_work_par_iter, row_specs,
    tasks_per_run, work_join, Form, RayonJoin, RealWork, RowSpec,
};
use summary::counters_json;
pub use summary::print_counters;

const DEFAULT_CASES: &str = "tiny-tasks,real-work,multi-request,single-request";
const DEFAULT_SYSTEMS: &str = "loci-las,loci-nls,loci-unpinned,rayon";

#[derive(Args, Debug)]
pub struct SchedArgs {
    #[command(flatten)]
    pub common: super::Common,
    /// Cases to run (comma list of tiny-tasks, real-work, multi-request, single-request).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_CASES)]
    pub cases: Vec<String>,
    /// Systems to run (comma list of loci-las, loci-nls, loci-unpinned, rayon; rayon runs its
    /// best form per case plus the labelled other forms: rayon-scope in tiny-tasks, rayon-join in
    /// real-work; loci-las adds its spawn tree as loci-las-spawn in both).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_SYSTEMS)]
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
    // A loci system's labelled rows (loci-las-spawn, loci-las-join) get a scheduler each, so that
    // every loci row's counters are its own runs'.
    let mut system_names: Vec<(String, &str)> = Vec::new();
    for name in &a.systems {
        system_names.push((name.clone(), name.as_str()));
        if policy_of(name).is_none() {
            continue;
        }
        for case in &a.cases {
            for r in row_specs(case, name) {
                if !system_names.iter().any(|(n, _)| *n == r.name) {
                    system_names.push((r.name, name.as_str()));
                }
            }
        }
    }
    let mut systems = Vec::new();
    for (_, name) in &system_names {
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
            ("tiny-tasks", Some(s), _) => match row.form {
                Form::LociSpawn => s.submit(move |ctx| tree(ctx, tasks)),
                _ => s.submit(move |ctx| join_tree(ctx, tasks, &|| {})),
            }
            .wait()
            .map_err(anyhow::Error::msg)?,
            ("tiny-tasks", _, Some(p)) => match row.form {
                Form::Join => p.install(|| join_tree(&RayonJoin, tasks, &|| {})),
                _ => p.scope(|s| rayon_tree(s, tasks)),
            },
            ("real-work", Some(s), _) => {
                let (w, _) = work.expect("built for real-work");
                match row.form {
                    Form::LociSpawn => s.submit(move |ctx| loci_work_tree(ctx, w, 0, w.tasks())),
                    Form::LociJoin => s.submit(move |ctx| work_join(ctx, w, 0, w.tasks())),
                    _ => s.submit(move |ctx| ctx.for_each(0..w.tasks(), |_, i| w.run(i))),
                }
                .wait()
                .map_err(anyhow::Error::msg)?
            }
            ("real-work", _, Some(p)) => {
                let (w, _) = work.expect("built for real-work");
                match row.form {
                    Form::Join => p.install(|| work_join(&RayonJoin, w, 0, w.tasks())),
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
        // The rows of this case: (system index, row); a row runs on the system of its own name
        // if there is one (loci-las-spawn), else on its system's (the rayon rows share a pool).
        let system_of = |name: &str| system_names.iter().position(|(n, _)| n == name);
        let mut rows: Vec<(usize, RowSpec)> = Vec::new();
        for name in &a.systems {
            for r in row_specs(case, name) {
                let i = system_of(&r.name).or_else(|| system_of(name));
                rows.push((i.expect("every system is built"), r));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::summary::{cpu_table, goals};
    use super::*;
    use clap::Parser;

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
                "tiny-tasks loci-las-spawn",
                "tiny-tasks loci-nls",
                "tiny-tasks loci-unpinned",
                "tiny-tasks rayon",
                "tiny-tasks rayon-scope",
                "real-work loci-las",
                "real-work loci-las-join",
                "real-work loci-las-spawn",
                "real-work loci-nls",
                "real-work loci-nls-join",
                "real-work loci-unpinned",
                "real-work loci-unpinned-join",
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
        let forms: Vec<Option<String>> = (0..rep.results.len()).map(form).collect();
        let want = ["join", "spawn", "join", "join", "join", "scope"];
        let want_work = [
            "for_each", "join", "spawn", "for_each", "join", "for_each", "join", "par_iter", "join",
        ];
        assert_eq!(
            forms,
            want.iter()
                .chain(&want_work)
                .map(|f| Some(f.to_string()))
                .collect::<Vec<_>>()
        );
        // Every loci join row counted its joins: one per node with two children. The for_each
        // row's loop joined at least once and at most once per index boundary in each of its 3
        // runs (warm-up and 2 reps); how few it needs is loci-sched's tests/for_each.rs.
        let joins = |i: usize| rep.results[i].extra["counters"]["joins"].as_u64().unwrap();
        assert!(joins(0) > 5000 / 3 && joins(7) > 300 / 3, "{}", joins(0));
        assert!(
            (1..=3 * 299).contains(&joins(6)),
            "for_each: {} joins",
            joins(6)
        );
        assert_eq!(
            (joins(1), joins(8)),
            (0, 0),
            "the spawn rows have counters of their own"
        );
        let g = goals(&rep);
        assert!(
            g.contains("tiny-tasks: loci-las join") && g.contains("of rayon join"),
            "{g}"
        );
        assert!(
            g.contains("real-work: loci-las for_each")
                && g.contains("of rayon par_iter")
                && g.contains("loci-las-join"),
            "{g}"
        );
        assert!(g.contains("loci-las-spawn"), "{g}");
        assert!(cpu_table(&rep).contains("rayon-scope scope/"));
    }
}
