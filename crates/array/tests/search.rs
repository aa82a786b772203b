//! The strategies and the placement search on preset machines, with the MODELED cost (see
//! `loci_array::model`): the search is never worse than the best static strategy and reaches the
//! best of 20 random pinnings in fewer than 20 trials. All costs here are modeled, not measured.

use loci_array::search::SearchCache;
use loci_array::strategy::{choose, place_pinning, static_pinning, RunInfo, ThreadStrategy};
use loci_array::*;
use loci_place::strategy::Kind;
use loci_topo::Topology;

const PRESETS: &[&str] = &[
    "opteron-8220-8s",
    "xeon-e7-4820-4s",
    "xeon-silver-4114-2s",
    "xeon-e7-4850v4-4s",
];

fn preset(name: &str) -> Topology {
    loci_topo::preset::build(name).unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Homes {
    /// Chunk i bound to node i mod N.
    RoundRobin,
    /// First touch by a compact generator on every cpu: contiguous blocks of chunks per node.
    Blocks,
}

fn homes(topo: &Topology, chunks: usize, h: Homes) -> Vec<Home> {
    match h {
        Homes::RoundRobin => {
            let m = ChunkMem::Bind(topo.allowed_mems());
            (0..chunks).map(|i| m.home_of(i)).collect()
        }
        Homes::Blocks => {
            let all = topo.allowed_cpus().len();
            let gen = place_pinning(
                topo,
                &loci_place::Strategy {
                    kind: Kind::Compact,
                    bind: None,
                },
                all,
            )
            .unwrap();
            let nodes = gen.nodes(topo);
            (0..chunks)
                .map(|i| Home::Node(nodes[i * all / chunks].unwrap()))
                .collect()
        }
    }
}

struct Case {
    topo: Topology,
    workload: ModelWorkload,
    info: RunInfo,
    threads: usize,
}

fn case(name: &str, chunks: usize, span: Span, sel: f64, h: Homes, threads: usize) -> Case {
    let topo = preset(name);
    let layout = seismic_layout([512, 512, 512], DType::F32, &Chunking::Count(chunks)).unwrap();
    let q = Query::new(&layout, span, sel).unwrap();
    let hs = homes(&topo, layout.chunk_count(), h);
    let workload = ModelWorkload::subarray(&layout, &q.bounds, threads, |c| hs[c].clone());
    let info = RunInfo {
        chunks: q.chunks,
        bytes_by_node: Some(workload.bytes_by_node()),
        workload: format!("{name} {chunks} {span} {sel} {h:?} {threads}"),
    };
    Case {
        topo,
        workload,
        info,
        threads,
    }
}

/// The 4-node E7-4820 with 16 threads copying 70% of all 100 chunks, bound round robin.
fn e7_all_chunks_round_robin_16() -> Case {
    case(
        "xeon-e7-4820-4s",
        100,
        Span::All,
        0.7,
        Homes::RoundRobin,
        16,
    )
}

fn cost(c: &Case, p: &Pinning) -> f64 {
    CostModel::default().cost(&c.topo, &c.workload, p)
}

fn run(c: &Case, s: &ThreadStrategy, cache: Option<&mut SearchCache>) -> strategy::Choice {
    let mut eval = ModelEval {
        model: CostModel::default(),
        topo: &c.topo,
        workload: &c.workload,
    };
    choose(
        &c.topo,
        s,
        c.threads,
        &c.info,
        &mut eval,
        cache,
        &SearchConfig::default(),
    )
    .unwrap()
}

#[test]
fn search_beats_static_and_best_of_20_random_on_every_preset() {
    // The grid of the full `loci bench subarray` sweep (chunks 1,10,100,1000; spans one, fifth,
    // all; selectivity 0.2, 0.7), with chunk homes round robin or in blocks, and 2 threads per
    // node, half the cpus and every cpu (the bench's default): 576 cases, all MODELED costs.
    let mut cases = 0;
    let mut trials_needed = Vec::new();
    let mut missed: Vec<String> = Vec::new();
    for &name in PRESETS {
        let topo = preset(name);
        let cpus = topo.allowed_cpus().len();
        let nodes = topo.nodes.len();
        for threads in [nodes * 2, cpus / 2, cpus] {
            for chunks in [1, 10, 100, 1000] {
                for span in [Span::One, Span::Fifth, Span::All] {
                    for sel in [0.2, 0.7] {
                        for h in [Homes::RoundRobin, Homes::Blocks] {
                            let c = case(name, chunks, span, sel, h, threads);
                            let statics: Vec<(String, f64)> = [
                                ThreadStrategy::Compact,
                                ThreadStrategy::Sparse,
                                ThreadStrategy::Shared(None),
                            ]
                            .iter()
                            .map(|s| {
                                let p = static_pinning(&c.topo, s, threads, &c.info)
                                    .unwrap()
                                    .unwrap();
                                (s.to_string(), cost(&c, &p))
                            })
                            .collect();
                            let best_static = statics.iter().map(|s| s.1).fold(f64::MAX, f64::min);
                            let random = run(&c, &ThreadStrategy::Random(20), None);
                            assert_eq!(random.trials.len(), 20);
                            let best_random = random
                                .trials
                                .iter()
                                .map(|t| t.cost)
                                .fold(f64::MAX, f64::min);
                            let found = run(&c, &ThreadStrategy::Search, None);
                            assert!(found.trials.len() <= 19, "budget respected");
                            let best = found.trials.iter().map(|t| t.cost).fold(f64::MAX, f64::min);
                            // The chosen pinning really has the reported cost.
                            assert_eq!(cost(&c, &found.pinning), best);
                            let what = format!(
                                "{name} threads={threads} chunks={chunks} span={span} sel={sel} homes={h:?}: search {best:.4e} ({}), statics {statics:?}, best random {best_random:.4e}",
                                found.label
                            );
                            assert!(
                                best <= best_static * (1.0 + 1e-12),
                                "worse than static: {what}"
                            );
                            let mut running = f64::MAX;
                            let reach = found.trials.iter().position(|t| {
                                running = running.min(t.cost);
                                running <= best_random * (1.0 + 1e-12)
                            });
                            match reach {
                                Some(i) => trials_needed.push(i + 1),
                                None => missed.push(what),
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, PRESETS.len() * 3 * 4 * 3 * 2 * 2);
    assert!(
        missed.is_empty(),
        "{} of {cases} cases never reached best-of-20-random in 19 trials:\n{}",
        missed.len(),
        missed.join("\n")
    );
    let mean = trials_needed.iter().sum::<usize>() as f64 / trials_needed.len() as f64;
    // On average the search needs far fewer trials than the 20 random ones.
    assert!(mean < 5.0, "mean trials to reach best-of-20-random: {mean}");
}

#[test]
fn threads_without_work_never_share_a_core_with_working_ones() {
    // A one-chunk query on the 2-node Silver 4114 with 20 threads: only 5 threads get parts.
    // The data-aware candidates put the 15 idle threads on cores of their own, so the 5 that
    // copy run at a whole core's rate (the idle ones would halve it in the model).
    let c = case(
        "xeon-silver-4114-2s",
        100,
        Span::One,
        0.7,
        Homes::RoundRobin,
        20,
    );
    let h = c.info.bytes_by_node.as_ref().unwrap();
    let working: Vec<usize> = (0..20).filter(|&t| !h[t].is_empty()).collect();
    assert!(working.len() < 20, "the case has idle threads");
    for alpha in [0.0, 2.0, 10.0] {
        let p = search::home_pinning_weighted(&c.topo, h, alpha);
        let cpus = p.single_cpus().unwrap();
        let mut cores = std::collections::HashMap::new();
        for &cpu in &cpus {
            let x = c.topo.cpu(cpu).unwrap();
            *cores.entry((x.package, x.core)).or_insert(0) += 1;
        }
        for &t in &working {
            let x = c.topo.cpu(cpus[t]).unwrap();
            assert_eq!(
                cores[&(x.package, x.core)],
                1,
                "alpha {alpha}: working thread {t} shares its core: {cpus:?}"
            );
        }
    }
}

#[test]
fn model_limits_name_the_bottleneck() {
    // All threads on one node of the E7-4820 reading data spread over four nodes: the busiest
    // node's memory or the interconnect limits, not the threads; the cost is the largest limit.
    let c = e7_all_chunks_round_robin_16();
    let p = search::node_pinning(&c.topo, 0, 16).unwrap();
    let l = CostModel::default().limits(&c.topo, &c.workload, &p);
    assert_eq!(l.time(), cost(&c, &p));
    assert!(
        l.busiest_node > l.slowest_thread || l.interconnect > l.slowest_thread,
        "{l:?}"
    );
    // Spread over all nodes on their data, the interconnect carries less.
    let home = search::home_pinning(&c.topo, c.info.bytes_by_node.as_ref().unwrap());
    let lh = CostModel::default().limits(&c.topo, &c.workload, &home);
    assert!(lh.interconnect < l.interconnect, "{lh:?} vs {l:?}");
}

#[test]
fn the_model_prefers_local_and_balanced_placements() {
    // Blocks of chunks per node, all chunks read: threads on their data's node beat all threads
    // on one node (remote reads, one memory controller) and beat threads on the wrong nodes.
    let c = case("xeon-e7-4820-4s", 100, Span::All, 0.7, Homes::Blocks, 8);
    let home = search::home_pinning(&c.topo, c.info.bytes_by_node.as_ref().unwrap());
    let one_node = search::node_pinning(&c.topo, 0, 8).unwrap();
    assert!(cost(&c, &home) < cost(&c, &one_node));
    // Reversed: thread t on the node of thread 7-t.
    let mut rev = home.clone();
    rev.threads.reverse();
    assert!(cost(&c, &home) < cost(&c, &rev));
    // Two threads on SMT siblings are slower than on two cores.
    let t = &c.topo;
    let sib: Vec<u32> = t.smt_siblings(0).iter().collect();
    assert_eq!(sib.len(), 2);
    let w = ModelWorkload {
        threads: 2,
        parts: vec![
            model::ModelPart {
                thread: 0,
                bytes: 1 << 30,
                home: Home::Node(0),
            },
            model::ModelPart {
                thread: 1,
                bytes: 1 << 30,
                home: Home::Node(0),
            },
        ],
    };
    let m = CostModel::default();
    assert!(m.cost(t, &w, &Pinning::on_cpus(&sib)) > m.cost(t, &w, &Pinning::on_cpus(&[0, 1])));
}

#[test]
fn search_caches_its_winner_and_starts_from_it() {
    let dir = std::env::temp_dir().join(format!("loci-array-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("loci").join("search.json");
    let c = case("opteron-8220-8s", 100, Span::All, 0.2, Homes::Blocks, 8);
    let mut cache = SearchCache::open(&path);
    assert!(cache.warning.is_none());
    let first = run(&c, &ThreadStrategy::Search, Some(&mut cache));
    assert!(!first.from_cache);
    let best = cost(&c, &first.pinning);
    // A new process would open the file again.
    let mut cache = SearchCache::open(&path);
    let again = run(&c, &ThreadStrategy::Search, Some(&mut cache));
    assert!(again.from_cache);
    assert_eq!(again.trials[0].label, "cache");
    assert_eq!(
        again.trials[0].cost, best,
        "first trial is the cached winner"
    );
    assert!(cost(&c, &again.pinning) <= best);
    // Another workload on the same machine does not hit the entry.
    let other = case("opteron-8220-8s", 10, Span::One, 0.2, Homes::Blocks, 8);
    let mut cache = SearchCache::open(&path);
    let mut eval = ModelEval {
        model: CostModel::default(),
        topo: &other.topo,
        workload: &other.workload,
    };
    let o = choose(
        &other.topo,
        &ThreadStrategy::Search,
        8,
        &other.info,
        &mut eval,
        Some(&mut cache),
        &SearchConfig::default(),
    )
    .unwrap();
    assert!(!o.from_cache);
    // A corrupt file: a clear warning, then a fresh cache that works.
    std::fs::write(&path, "{ not json").unwrap();
    let mut cache = SearchCache::open(&path);
    let w = cache.warning.clone().unwrap();
    assert!(w.contains("search.json") && w.contains("not valid"), "{w}");
    let r = run(&c, &ThreadStrategy::Search, Some(&mut cache));
    assert!(!r.from_cache);
    assert!(r.notes.iter().any(|n| n.contains("not valid")));
    assert!(
        SearchCache::open(&path).warning.is_none(),
        "rewritten valid"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn elastic_grows_while_it_pays() {
    let c = e7_all_chunks_round_robin_16();
    let e = run(&c, &ThreadStrategy::Elastic, None);
    assert!(e.trials.len() >= 2);
    // Every trial but the last improved on the one before; the choice is the best trial.
    for w in e.trials.windows(2).take(e.trials.len().saturating_sub(2)) {
        assert!(
            w[1].cost < w[0].cost,
            "{:?}",
            e.trials
                .iter()
                .map(|t| (&t.label, t.cost))
                .collect::<Vec<_>>()
        );
    }
    let best = e.trials.iter().map(|t| t.cost).fold(f64::MAX, f64::min);
    assert_eq!(cost(&c, &e.pinning), best);
    // Threads are bound to sets of whole nodes, grown in compact order.
    let first = e.trials[0].pinning.threads[0].clone().unwrap();
    assert_eq!(first.len(), 16, "one node of the E7-4820 has 16 cpus");
}

#[test]
fn strategy_text_parses_and_errors_name_the_choices() {
    for s in [
        "os",
        "compact",
        "sparse",
        "shared",
        "shared:4",
        "random:20",
        "elastic",
        "search",
        "place:cpus:0-3",
    ] {
        let p: ThreadStrategy = s.parse().unwrap();
        assert_eq!(p.to_string(), s);
    }
    let e = "random".parse::<ThreadStrategy>().unwrap_err().to_string();
    assert!(e.contains("random:20"), "{e}");
    let e = "spread".parse::<ThreadStrategy>().unwrap_err().to_string();
    assert!(e.contains("elastic") && e.contains("search"), "{e}");
    assert!("shared:0".parse::<ThreadStrategy>().is_err());
    assert!("place:bogus".parse::<ThreadStrategy>().is_err());
    assert_eq!(ThreadStrategy::parse_list("os,search").unwrap().len(), 2);
}
