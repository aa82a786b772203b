//! `loci-array-vm-check`: loci-array's placement on multi-node machines (run inside the NUMA VMs
//! of loci-vm by tests/vm/array.rs, or on real hardware). Prints one `LOCI-CHECK` line per fact
//! with loci-vm's `Checker`, and the measured local-access ratios as `#` lines; exits 1 if any
//! check failed.
//!
//! 1. chunks bound round-robin to the nodes: every sampled page of every chunk is on its home;
//! 2. first touch by a compact generator pinned on every cpu: pages on the recorded home node;
//! 3. subarray of every chunk of the first-touched volume under the data-aware `home` plan:
//!    threads ran on the cpus planned for them, and the local-access ratio is >= 0.95 (the round-robin bound volume's
//!    ratio, which a static schedule caps at 1/2 here, is reported);
//! 4. the same query under `compact` (every thread on the first node(s)) is reported for contrast;
//!    and under the plan `search` returns on this machine with the MODELED cost (timing in a VM
//!    means nothing): every part ran on a cpu of its thread's set, and the local-access ratio is
//!    >= 0.95;
//! 5. results equal a slice of the dense volume;
//! 6. the result-buffer pool: a dropped result's memory serves the next result on the same node
//!    (pages still there), never one on another node (that one gets fresh memory on its node),
//!    and a result spread over every node, reused, has each page on the node its binding names.
//!
//! 7. a small result copied inline, with the calling thread pinned to each node in
//!    turn: every part was copied on the caller's node, some call had a helper take part where
//!    the node has a second cpu, and the first-touched result's pages are on that node.
//!
//! Usage: loci-array-vm-check [SIDE] [team]   (volume SIDE^3 f32, default 96; `team`: only 7)

use loci_array::search::home_cpus;
use loci_array::strategy::{choose, RunInfo, ThreadPlacement};
use loci_place::Strategy;
use loci_vm::Checker;

use loci_array::{
    pin, seismic_layout, subarray, Array, BufferPool, BuildOptions, Chunking, CostModel, DType,
    Home, ModelEval, ModelWorkload, Plan, PoolOutcome, Query, RunStats, SearchConfig, Seismic,
    Span, SubarrayOptions,
};

fn pages_on_home(a: &Array) -> Result<String, String> {
    let nodes = a.page_nodes(8).map_err(|e| e.to_string())?;
    for (i, (c, p)) in a.chunks().iter().zip(&nodes).enumerate() {
        let Home::Node(h) = c.home else {
            return Err(format!("chunk {i} has no single home ({})", c.home));
        };
        // Sampled pages of unknown node (-EFAULT while AutoNUMA scans) prove nothing either way.
        let b = loci_place::verify::BufferPages::from_statuses(p);
        b.check_all_on(&loci_topo::NodeSet::single(h))
            .map_err(|e| format!("chunk {i} homed on node {h}: {e}"))?;
    }
    let homes: std::collections::BTreeSet<String> =
        a.chunks().iter().map(|c| c.home.to_string()).collect();
    Ok(format!("{} chunks on {homes:?}", a.chunks().len()))
}

fn main() {
    let side: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("SIDE must be a number"))
        .unwrap_or(96);
    let topo = loci_topo::load(&loci_topo::Source::live()).unwrap_or_else(|e| {
        let mut c = Checker::new();
        c.check("array/topology", || Err(e.to_string()));
        std::process::exit(c.exit_code())
    });
    let cpus: Vec<u32> = topo.allowed_cpus().iter().collect();
    let mems = topo.allowed_mems();
    let threads = cpus.len();
    println!(
        "# {} nodes with memory ({mems}), {threads} cpus, volume {side}^3 f32",
        mems.len()
    );
    let mut c = Checker::new();
    let shape = [side, side, side];
    let chunks = 2 * mems.len().max(1);
    if std::env::args().nth(2).as_deref() == Some("team") {
        team_checks(&mut c, &topo, shape, chunks);
        std::process::exit(c.exit_code());
    }

    // 1. bind round-robin.
    let bound = Array::build(
        seismic_layout(shape, DType::F32, &Chunking::Count(chunks)).expect("layout"),
        &BuildOptions {
            mem: loci_place::MemPolicy::Parts(loci_place::PartOrder::RoundRobin, None),
            plan: pin::unpinned(&topo, threads).expect("os plan"),
            huge_pages: false,
        },
        &topo,
        |c| Seismic::default().fill(c),
    )
    .expect("build");
    c.check_noted("array/bind/pages-on-home", || pages_on_home(&bound));

    // 2. first touch by a compact generator on every cpu.
    let gen = pin::plan(&topo, &Strategy::compact(), threads).expect("compact");
    let touched = Array::build(
        seismic_layout(shape, DType::F32, &Chunking::Count(chunks)).expect("layout"),
        &BuildOptions {
            mem: loci_place::MemPolicy::FirstTouch,
            plan: gen,
            huge_pages: false,
        },
        &topo,
        |c| Seismic::default().fill(c),
    )
    .expect("build");
    c.check_noted("array/first-touch/pages-on-generator-node", || {
        pages_on_home(&touched)
    });

    // 3. and 4. subarray of all chunks under `home` and `compact`, on the first-touched volume
    // (contiguous blocks of chunks per node, so the static schedule's thread blocks can be local;
    // with round-robin bound chunks each thread's block spans nodes, reported below).
    let bound_rr = bound;
    let bound = touched;
    let q = Query::new(bound.layout(), Span::All, 0.7).expect("query");
    let homes: Vec<Home> = bound.chunks().iter().map(|c| c.home.clone()).collect();
    let w = ModelWorkload::subarray(bound.layout(), &q.bounds, threads, |c| homes[c].clone());
    let home = pin::plan_on_cpus(&topo, &home_cpus(&topo, &w.bytes_by_node())).expect("home");
    let opts = SubarrayOptions {
        sample_locality: true,
        // Placement is the point here: the pinned threads copy even a small result.
        inline_bytes: 0,
        inline_bytes_pooled: 0,
        ..Default::default()
    };
    let run = subarray(&bound, &q.bounds, &home, &opts, &topo).map_err(|e| e.to_string());
    let ok = format!("plan {}", pin::describe(&home));
    placed_run_checks(&mut c, "home", Some(&home), ok, &run);
    search_checks(&mut c, &topo, &bound, &q, &w, &opts);
    let compact = pin::plan(&topo, &Strategy::compact(), threads.div_ceil(2)).expect("compact");
    match subarray(&bound, &q.bounds, &compact, &opts, &topo) {
        Ok((_, st)) => println!(
            "# array/subarray/compact ({} threads): local-access ratio {:?}",
            compact.threads.len(),
            st.local_access_ratio
        ),
        Err(e) => println!("# array/subarray/compact: {e}"),
    }

    {
        let hs: Vec<Home> = bound_rr.chunks().iter().map(|c| c.home.clone()).collect();
        let w = ModelWorkload::subarray(bound_rr.layout(), &q.bounds, threads, |c| hs[c].clone());
        let p = pin::plan_on_cpus(&topo, &home_cpus(&topo, &w.bytes_by_node())).expect("home");
        match subarray(&bound_rr, &q.bounds, &p, &opts, &topo) {
            Ok((_, st)) => println!(
                "# array/subarray/bind-round-robin/home: local-access ratio {:?}",
                st.local_access_ratio
            ),
            Err(e) => println!("# array/subarray/bind-round-robin/home: {e}"),
        }
    }
    // 5. the result equals the dense slice.
    c.check_noted("array/subarray/equals-reference", || match &run {
        Err(e) => Err(e.to_string()),
        Ok((out, _)) => {
            let dense = bound.to_dense(0);
            let got = out.to_dense(0);
            let b = &q.bounds;
            let mut want = Vec::with_capacity(got.len());
            for z in b[0].clone() {
                for y in b[1].clone() {
                    let at = ((z * side + y) * side + b[2].start) * 4;
                    want.extend_from_slice(&dense[at..at + (b[2].end - b[2].start) * 4]);
                }
            }
            if want == got {
                Ok(String::new())
            } else {
                Err("result differs from the dense slice".into())
            }
        }
    });

    // 6. The result-buffer pool keeps placement: a result copied on node A, dropped, serves the
    // next result on A (same memory, pages still on A); a result on node B does not get it (a
    // fresh buffer, pages on B); a result spread over every node (the `home` plan) reused
    // from the pool has every sampled page on the node its binding names.
    let nodes_with_cpus: Vec<u32> = mems
        .iter()
        .filter(|&n| !topo.allowed_cpus_of(n).is_empty())
        .collect();
    if nodes_with_cpus.len() >= 2 {
        let (na, nb) = (nodes_with_cpus[0], nodes_with_cpus[1]);
        let pool = BufferPool::new(1 << 30);
        let popts = SubarrayOptions {
            pool: Some(pool.clone()),
            inline_bytes: 0,
            inline_bytes_pooled: 0,
            // Streaming stores into the bound pages (placement is set before the first touch,
            // whatever kind of store touches first).
            stream_bytes: 0,
            ..Default::default()
        };
        let on = |n: u32| {
            let cpus: Vec<u32> = topo.allowed_cpus_of(n).iter().collect();
            pin::plan_on_cpus(&topo, &cpus).expect("node plan")
        };
        let run = |p: &Plan| subarray(&bound, &q.bounds, p, &popts, &topo);
        let first = run(&on(na));
        let addr = first.as_ref().map(|(r, _)| r.arena().as_ptr()).ok();
        let first_ok = match &first {
            Err(e) => Err(e.to_string()),
            Ok((r, st)) if st.pool != PoolOutcome::Miss => Err(format!(
                "first result: pool {:?}, want miss ({} B)",
                st.pool,
                r.arena().len()
            )),
            Ok((r, _)) => result_pages_on(r, na),
        };
        drop(first);
        c.check_noted("array/pool/reuse-same-node", || {
            first_ok.and_then(|_| match run(&on(na)) {
                Err(e) => Err(e.to_string()),
                Ok((r, st)) => {
                    if st.pool != PoolOutcome::Hit || Some(r.arena().as_ptr()) != addr {
                        Err(format!(
                            "second result on node {na}: pool {:?}, same memory: {}",
                            st.pool,
                            Some(r.arena().as_ptr()) == addr
                        ))
                    } else {
                        result_pages_on(&r, na).map(|n| format!("node {na}, reused: {n}"))
                    }
                }
            })
        });
        // The node-A buffer is in the pool now; a result on B must not get it.
        let other = run(&on(nb));
        c.check_noted("array/pool/never-across-nodes", || match &other {
                Err(e) => Err(e.to_string()),
                Ok((r, st)) => {
                    if st.pool == PoolOutcome::Hit || Some(r.arena().as_ptr()) == addr {
                        Err(format!("result on node {nb} got pooled memory ({:?}) while only node {na}'s buffer was pooled", st.pool))
                    } else {
                        let held = pool.stats().buffers_held;
                        result_pages_on(r, nb).and_then(|n| {
                            (held == 1)
                                .then(|| format!("node {nb}: {n}; node {na}'s buffer still pooled"))
                                .ok_or(format!("pool holds {held} buffers, want node {na}'s one"))
                        })
                    }
                }
            });
        drop(other);
        // Spread over every node: bound per page to the node of its writer, and so when reused.
        let spread = |_: ()| subarray(&bound, &q.bounds, &home, &popts, &topo);
        let r1 = spread(());
        drop(r1);
        c.check_noted(
            "array/pool/spread-binding-pages-where-planned",
            || match spread(()) {
                Err(e) => Err(e.to_string()),
                Ok((r, st)) => {
                    let b = r.arena().binding().cloned();
                    match (st.pool, b) {
                        (PoolOutcome::Hit, Some(b)) => pages_follow_binding(&r, &b),
                        (o, b) => Err(format!("second spread result: pool {o:?}, binding {b:?}")),
                    }
                }
            },
        );
    } else {
        println!("# array/pool: fewer than 2 nodes with cpus and memory, pool checks skipped");
    }
    team_checks(&mut c, &topo, shape, chunks);
    std::process::exit(c.exit_code());
}

/// Check 4's `search` half: the placement the search picks with the modeled cost, run for real.
fn search_checks(
    c: &mut Checker,
    topo: &loci_topo::Topology,
    src: &Array,
    q: &Query,
    w: &ModelWorkload,
    opts: &SubarrayOptions,
) {
    let info = RunInfo {
        chunks: q.chunks,
        bytes_by_node: Some(w.bytes_by_node()),
        workload: "loci-array-vm-check".into(),
    };
    let mut eval = ModelEval {
        model: CostModel::default(),
        topo,
        workload: w,
    };
    let threads = topo.allowed_cpus().len();
    let choice = choose(
        topo,
        &ThreadPlacement::SEARCH,
        threads,
        &info,
        &mut eval,
        None,
        &SearchConfig::default(),
    );
    let (plan, ok, run) = match choice {
        Ok(c) => {
            let ok = format!(
                "{} after {} modeled trials: {}",
                c.label,
                c.trials.len(),
                pin::describe(&c.plan)
            );
            let run = subarray(src, &q.bounds, &c.plan, opts, topo).map_err(|e| e.to_string());
            (Some(c.plan), ok, run)
        }
        Err(e) => (None, String::new(), Err(e.to_string())),
    };
    placed_run_checks(c, "search", plan.as_ref(), ok, &run);
}

/// `array/subarray/NAME/threads-where-planned` (every part ran on a cpu of its thread's set; `ok`
/// is the detail printed when it holds) and `array/subarray/NAME/local-access>=0.95` for a run
/// under `plan` (`None`: the plan could not be made, and `run` says why).
fn placed_run_checks(
    c: &mut Checker,
    name: &str,
    plan: Option<&Plan>,
    ok: String,
    run: &Result<(Array, RunStats), String>,
) {
    let placed =
        run.as_ref().map_err(Clone::clone).and_then(|(_, st)| {
            let plan = plan.ok_or("no plan")?;
            let planned = |t: usize| &plan.threads[t].cpus;
            match st.part_thread.iter().enumerate().find(|(_, (t, cpu))| {
                !(plan.pinned && cpu.is_some_and(|c| planned(*t).contains(c)))
            }) {
                Some((i, (t, cpu))) => Err(format!(
                    "part {i}: thread {t} planned on {} ran on {cpu:?}",
                    planned(*t)
                )),
                None => Ok(ok),
            }
        });
    c.check_noted(
        format!("array/subarray/{name}/threads-where-planned"),
        || placed,
    );
    let local =
        run.as_ref()
            .map_err(Clone::clone)
            .and_then(|(_, st)| match st.local_access_ratio {
                Some(r) if r >= 0.95 => Ok(format!("local-access ratio {r:.3}")),
                other => Err(format!("local-access ratio {other:?}")),
            });
    c.check_noted(format!("array/subarray/{name}/local-access>=0.95"), || {
        local
    });
}

/// Check 7, for each node with cpus and memory: the calling thread pinned to the node's first cpu copies
/// a small box inline (fresh memory, first touch, up to `cpus - 1` helpers); every part ran on
/// the node, a helper took part in some of 50 calls where the node has another cpu, and the
/// last result's pages are on the node.
fn team_checks(c: &mut Checker, topo: &loci_topo::Topology, shape: [usize; 3], chunks: usize) {
    let src = Array::build(
        seismic_layout(shape, DType::F32, &Chunking::Count(chunks)).expect("layout"),
        &BuildOptions::first_touch(topo, 1).expect("os plan"),
        topo,
        |c| Seismic::default().fill(c),
    )
    .expect("build");
    let q = Query::new(src.layout(), Span::All, 0.7).expect("query");
    let opts = SubarrayOptions {
        inline_bytes: usize::MAX,
        pool: None,
        ..Default::default()
    };
    let all = topo.allowed_cpus();
    let threads = pin::unpinned(topo, all.len()).expect("os plan");
    let mems = topo.allowed_mems();
    for n in mems.iter() {
        let cpus = topo.allowed_cpus_of(n);
        let Some(first) = cpus.iter().next() else {
            continue;
        };
        let name = format!("array/team/node{n}/parts-and-pages-on-callers-node");
        if let Err(e) = loci_place::sys::set_affinity(0, &loci_topo::CpuSet::single(first)) {
            c.check_noted(&name, || {
                Err(format!("cannot pin the caller to cpu {first}: {e}"))
            });
            continue;
        }
        let mut helped = 0;
        let mut outcome = Ok(String::new());
        let mut last = None;
        for _ in 0..50 {
            match subarray(&src, &q.bounds, &threads, &opts, topo) {
                Err(e) => {
                    outcome = Err(e.to_string());
                    break;
                }
                Ok((r, st)) => {
                    if !st.inline {
                        outcome = Err("the result was not copied inline".into());
                        break;
                    }
                    if let Some((i, (t, cpu))) = st
                        .part_thread
                        .iter()
                        .enumerate()
                        .find(|(_, (_, cpu))| cpu.and_then(|c| topo.node_of_cpu(c)) != Some(n))
                    {
                        outcome = Err(format!("part {i}: participant {t} ran on cpu {cpu:?}"));
                        break;
                    }
                    helped += (st.bytes_per_thread.iter().skip(1).any(|&b| b > 0)) as usize;
                    last = Some(r);
                }
            }
        }
        let outcome = outcome.and_then(|_| {
            if cpus.len() >= 2 && helped == 0 {
                return Err(format!(
                    "node {n} has cpus {cpus} but no helper took a part in 50 calls"
                ));
            }
            let r = last.as_ref().expect("50 calls ran");
            result_pages_on(r, n).map(|p| {
                format!("node {n} (cpus {cpus}): a helper took part in {helped} of 50 calls; {p}")
            })
        });
        c.check_noted(&name, || outcome);
    }
    let _ = loci_place::sys::set_affinity(0, &all);
}

/// Every sampled page of a result's memory (64 samples over its length) is on `node`.
fn result_pages_on(r: &Array, node: u32) -> Result<String, String> {
    let len = r.arena().len();
    let offs: Vec<usize> = (0..64).map(|i| i * len / 64).collect();
    let st = r.arena().nodes_at(&offs).map_err(|e| e.to_string())?;
    let b = loci_place::verify::BufferPages::from_statuses(&st);
    b.check_all_on(&loci_topo::NodeSet::single(node))
        .map(|_| format!("{} sampled pages on node {node}", st.len()))
}

/// Every page of a result's memory (one sample per page, at most 4096 pages) is on the node its
/// binding names, and the binding spans more than one node.
fn pages_follow_binding(r: &Array, b: &loci_array::Binding) -> Result<String, String> {
    let ps = loci_place::sys::page_size();
    let len = r.arena().len();
    let step = (len.div_ceil(ps) / 4096).max(1) * ps;
    let offs: Vec<usize> = (0..len).step_by(step).collect();
    let st = r.arena().nodes_at(&offs).map_err(|e| e.to_string())?;
    let mut wrong = Vec::new();
    for (&o, &n) in offs.iter().zip(&st) {
        let want = b.node_at(o).map(|x| x as i32);
        if Some(n) != want {
            wrong.push(format!("offset {o}: page on {n}, bound to {want:?}"));
        }
    }
    let nodes: std::collections::BTreeSet<u32> = b.segments().iter().map(|s| s.1).collect();
    if !wrong.is_empty() {
        return Err(format!(
            "{} of {} pages off their binding: {}",
            wrong.len(),
            offs.len(),
            wrong[..wrong.len().min(4)].join("; ")
        ));
    }
    if nodes.len() < 2 {
        return Err(format!("the spread result is bound to one node only ({b})"));
    }
    Ok(format!(
        "{} pages on their bound node, {} segments over nodes {nodes:?}",
        offs.len(),
        b.segments().len()
    ))
}
