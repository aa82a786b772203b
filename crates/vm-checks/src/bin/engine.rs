//! `loci-engine-vm-check`: loci-engine's placement on multi-node machines (run inside the NUMA VMs
//! of loci-vm by tests/vm/engine.rs, or on real hardware). Prints one `LOCI-CHECK` line per fact
//! with loci-vm's `Checker`, and the measured local-access ratios as `#` lines; exits 1 if any
//! check failed.
//!
//! 1. `per-node` morsels processed by W2 under LAS (loci-sched, workers pinned to their
//!    node's core group, every morsel a task queued on its home node): every morsel's pages sit on
//!    its home node, and with `--locality strict` (loci-sched's `stay_on_node` requests) the
//!    local-access ratio is at least 0.95 in every one of five passes after a warm-up (it is 1.0
//!    when no morsel leaves its node). The default `balanced` mode is run and printed for
//!    information, not checked: a phase is one request, and a node that runs out of its own
//!    morsels takes another node's at the tail (seed 003's rule 4 for a lone request), so its
//!    ratio depends on how evenly the emulated cpus progress (a loaded host). Each pass prints
//!    which node ran the morsels of which home;
//! 2. first touch by one generating thread (one task; half the rows, so that one node holds
//!    them): every page sits on the generator's node,
//!    and a placement-unaware static split (morsel i to worker i mod n) reads 1/k of the bytes
//!    locally (within 0.02); W2 under NLS (one shared queue) reads at most 0.6 locally (about
//!    1/k, but how many morsels each emulated cpu takes depends on host load); W2 under LAS on
//!    that table is reported too;
//! 3. every run gives the single-thread reference answer.
//!
//! Usage: loci-engine-vm-check [ROWS]   (default 1M rows, 10K groups, zipf; 32 Ki-row morsels)

use loci_engine::agg::w2;
use loci_engine::storage::local_access_ratio;
use loci_engine::{
    generate_agg, reference, AggSpec, Dist, Exec, Gen, Locality, MemPolicy, Sched, Strategy,
    TableMem,
};
use loci_vm::Checker;

fn main() {
    let rows: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("ROWS must be a number"))
        .unwrap_or(1 << 20);
    let topo = match loci_topo::load(&loci_topo::Source::live()) {
        Ok(t) => t,
        Err(e) => {
            let mut c = Checker::new();
            c.check("engine/topology", || Err(e.to_string()));
            std::process::exit(c.exit_code());
        }
    };
    let cpu_nodes: Vec<u32> = topo
        .nodes
        .iter()
        .filter(|n| !topo.allowed_cpus_of(n.id).is_empty())
        .map(|n| n.id)
        .collect();
    let k = cpu_nodes.len();
    let workers = topo.allowed_cpus().len();
    println!("# {k} nodes with cpus, {workers} workers (one per cpu), {rows} rows");
    let mut c = Checker::new();
    let spec = AggSpec {
        rows,
        groups: 10_000,
        dist: Dist::Zipf,
        seed: 42,
    };
    // 64 Ki rows (512 KiB) per morsel: 256 morsels at the test's 16 Mi rows, 64 per node.
    let morsel = 1 << 16;

    // 1. per-node under LAS.
    let mut pool = Exec::new(&topo, Sched::Las, Strategy::sparse(), None).expect("scheduler");
    let t = generate_agg(
        &pool,
        spec,
        None,
        morsel,
        &"per-node".parse::<MemPolicy>().unwrap().into(),
    )
    .expect("generate");
    let place = t.placement(8).expect("move_pages");
    c.check_noted("engine/per-node/pages-on-home", || {
        for (i, (m, p)) in t.morsels.iter().zip(&place).enumerate() {
            let home = m.home.ok_or(format!("morsel {i} has no home"))?;
            if p.iter().any(|(n, _)| *n != home) {
                return Err(format!("morsel {i} homed on {home} has pages on {p:?}"));
            }
        }
        let homes: std::collections::BTreeSet<u32> =
            t.morsels.iter().filter_map(|m| m.home).collect();
        Ok(format!("morsels on nodes {homes:?}"))
    });
    // Per locality: one warm-up pass (first touch of the workers' arrays, first wake-ups), then
    // five passes, each one request. Strict is checked in every pass; balanced is printed.
    let mut got = Vec::new();
    let mut strict_ratios = Vec::new();
    for loc in [Locality::Strict, Locality::Balanced] {
        pool.set_locality(loc);
        w2(&pool, &t).expect("w2");
        let mut ratios = Vec::new();
        for pass in 0..5 {
            let t0 = std::time::Instant::now();
            let before = pool.scheduler().stats();
            let (g, run) = w2(&pool, &t).expect("w2");
            let st = pool.scheduler().stats().since(&before);
            let lar = local_access_ratio(&t, &place, &run.trace.touched).unwrap_or(0.0);
            // Morsels by (home node, node that ran them).
            let mut by: std::collections::BTreeMap<(Option<u32>, Option<u32>), usize> =
                std::collections::BTreeMap::new();
            for &(m, n) in &run.trace.touched {
                *by.entry((t.morsels[m].home, n)).or_default() += 1;
            }
            println!(
                "# W2 under LAS ({loc}) on per-node, pass {pass}: {:.3} s, local-access {lar:.3}, {} tasks, {} taken from another node's queue (rule 4); morsels by (home, ran on): {by:?}",
                t0.elapsed().as_secs_f64(),
                st.tasks,
                st.found_by(loci_sched::Rule::RemoteDeferred)
            );
            ratios.push(lar);
            got.push(g);
        }
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "# W2 under LAS ({loc}) on per-node: local-access min {:.3}, median {:.3}, max {:.3}, passes {ratios:.3?}",
            sorted[0],
            sorted[sorted.len() / 2],
            sorted[sorted.len() - 1]
        );
        if loc == Locality::Strict {
            strict_ratios = ratios;
        }
    }
    let worst = strict_ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let note = format!("strict: every pass {strict_ratios:.3?}");
    c.check_noted("engine/per-node/strict/local-access>=0.95", || {
        if worst >= 0.95 {
            Ok(note)
        } else {
            Err(note)
        }
    });
    let (k1, v1) = t.to_vecs();
    let want = reference::w2(&k1, &v1);
    c.check_noted("engine/per-node/answer", || {
        if got.iter().all(|g| *g == want) {
            Ok(format!("{} passes (strict and balanced)", got.len()))
        } else {
            Err("differs from the reference".into())
        }
    });
    drop(t);

    // 2. first touch by one task, read by workers spread over all nodes. Half the rows: one node
    // holds the whole table (the 4n VM has 256 MiB per node; a full node spills to the next).
    let spec = AggSpec {
        rows: rows / 2,
        ..spec
    };
    let one = TableMem {
        policy: MemPolicy::FirstTouch,
        gen: Gen::OneThread,
    };
    let t = generate_agg(&pool, spec, None, morsel / 2, &one).expect("generate");
    let place = t.placement(8).expect("move_pages");
    let (k1, v1) = t.to_vecs();
    let want1 = reference::w2(&k1, &v1);
    let gen_node = t.morsels.first().and_then(|m| m.home);
    c.check_noted("engine/one-thread/pages-on-generator-node", || {
        for (i, p) in place.iter().enumerate() {
            if p.iter().any(|(n, _)| Some(*n) != gen_node) {
                return Err(format!("morsel {i}: {p:?}, generator on {gen_node:?}"));
            }
        }
        Ok(format!("generator on node {gen_node:?}"))
    });
    pool.set_locality(Locality::Balanced);
    let (got_las, run) = w2(&pool, &t).expect("w2");
    let las = local_access_ratio(&t, &place, &run.trace.touched).unwrap_or(0.0);
    drop(pool);
    let nls_pool = Exec::new(&topo, Sched::Nls, Strategy::sparse(), None).expect("scheduler");
    let (got, run) = w2(&nls_pool, &t).expect("w2");
    let nls = local_access_ratio(&t, &place, &run.trace.touched).unwrap_or(0.0);
    // A placement-unaware static split (morsel i to worker i mod n, as an OpenMP static
    // schedule does): the ratio then depends only on where the pages really are.
    let nodes: Vec<Option<u32>> = nls_pool
        .scheduler()
        .layout()
        .workers
        .iter()
        .map(|w| Some(w.node))
        .collect();
    let split: Vec<(usize, Option<u32>)> = (0..t.morsels.len())
        .map(|i| (i, nodes[i % nodes.len()]))
        .collect();
    let stat = local_access_ratio(&t, &place, &split).unwrap_or(0.0);
    let expect = 1.0 / k.max(1) as f64;
    // The page fact is deterministic: a static split reads exactly 1/k locally. NLS's ratio
    // depends on how fast each emulated cpu drains the shared queue (0.10-0.32 seen on a loaded
    // host), so it is only required to stay far from local (at most 0.6).
    c.check_noted("engine/one-thread/local-access-about-1/k", ||
        if (stat - expect).abs() <= 0.02 && nls <= 0.6 {
            Ok(format!(
                "W2 under NLS {nls:.3}, 1/k = {expect:.3}; static split {stat:.3}; W2 under LAS {las:.3}"
            ))
        } else {
            Err(format!(
                "W2 under NLS {nls:.3}, expected about {expect:.3} (static split {stat:.3}, LAS {las:.3})"
            ))
        });
    c.check_noted("engine/one-thread/answer", || {
        if got == want1 && got_las == want1 {
            Ok(String::new())
        } else {
            Err("differs from the reference".into())
        }
    });
    std::process::exit(c.exit_code());
}
