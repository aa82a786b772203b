//! The strategies and the placement search on preset machines, with the MODELED cost (see
//! `loci_array::model`): the search is never worse than the best static strategy and reaches the
//! best of 20 random plans in fewer than 20 trials. All costs here are modeled, not measured.

use loci_array::search::SearchCache;
use loci_array::strategy::{choose, RunInfo};
use loci_array::*;
use loci_place::Strategy;
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
        Homes::RoundRobin => chunk_homes(&"round-robin".parse().unwrap(), topo, chunks).unwrap(),
        Homes::Blocks => {
            let all = topo.allowed_cpus().len();
            let gen = pin::plan(topo, &Strategy::compact(), all).unwrap();
            (0..chunks)
                .map(|i| Home::Node(gen.threads[i * all / chunks].nodes.first().unwrap()))
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

fn cost(c: &Case, p: &Plan) -> f64 {
    CostModel::default().cost(&c.topo, &c.workload, p)
}

/// A plan with thread `i` on `cpus[i]` on the case's machine.
fn on(c: &Case, cpus: &[u32]) -> Plan {
    pin::plan_on_cpus(&c.topo, cpus).unwrap()
}

/// `choose` on the case with the modeled cost.
fn try_run(
    c: &Case,
    s: &ThreadPlacement,
    cache: Option<&mut SearchCache>,
) -> Result<strategy::Choice, ArrayError> {
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
}

fn run(c: &Case, s: &ThreadPlacement, cache: Option<&mut SearchCache>) -> strategy::Choice {
    try_run(c, s, cache).unwrap()
}

#[test]
fn search_beats_static_and_best_of_20_random_on_every_preset() {
    // The grid of the full `loci bench subarray` sweep (chunks 1,10,100,1000; spans one, fifth,
    // all; selectivity 0.2, 0.7), with chunk homes round robin or in blocks, and 2 threads per
    // node, half the cpus, every cpu (the bench's default) and more threads than cpus (1.5x + 1:
    // 25 threads on the Opteron's 16 cpus): 768 cases, all MODELED costs.
    let mut cases = 0;
    let mut trials_needed = Vec::new();
    let mut missed: Vec<String> = Vec::new();
    for &name in PRESETS {
        let topo = preset(name);
        let cpus = topo.allowed_cpus().len();
        let nodes = topo.nodes.len();
        for threads in [nodes * 2, cpus / 2, cpus, cpus + cpus / 2 + 1] {
            for chunks in [1, 10, 100, 1000] {
                for span in [Span::One, Span::Fifth, Span::All] {
                    for sel in [0.2, 0.7] {
                        for h in [Homes::RoundRobin, Homes::Blocks] {
                            let c = case(name, chunks, span, sel, h, threads);
                            let statics: Vec<(String, f64)> = ["compact", "sparse", "shared"]
                                .iter()
                                .map(|s| {
                                    let choice = run(&c, &s.parse().unwrap(), None);
                                    assert!(choice.trials.is_empty(), "{s} is a strategy");
                                    (s.to_string(), cost(&c, &choice.plan))
                                })
                                .collect();
                            let best_static = statics.iter().map(|s| s.1).fold(f64::MAX, f64::min);
                            let random = run(&c, &"best-of:20".parse().unwrap(), None);
                            assert_eq!(random.trials.len(), 20);
                            let best_random = random
                                .trials
                                .iter()
                                .map(|t| t.cost)
                                .fold(f64::MAX, f64::min);
                            let found = run(&c, &ThreadPlacement::SEARCH, None);
                            assert!(found.trials.len() <= 19, "budget respected");
                            let best = found.trials.iter().map(|t| t.cost).fold(f64::MAX, f64::min);
                            // The chosen plan really has the reported cost.
                            assert_eq!(cost(&c, &found.plan), best);
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
    assert_eq!(cases, PRESETS.len() * 4 * 4 * 3 * 2 * 2);
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
        let cpus = search::home_cpus_weighted(&c.topo, h, alpha);
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
    let p = on(&c, &search::one_node_cpus(&c.topo, 0, 16).unwrap());
    let l = CostModel::default().limits(&c.topo, &c.workload, &p);
    assert_eq!(l.time(), cost(&c, &p));
    assert!(
        l.busiest_node > l.slowest_thread || l.interconnect > l.slowest_thread,
        "{l:?}"
    );
    // Spread over all nodes on their data, the interconnect carries less.
    let home = search::home_cpus(&c.topo, c.info.bytes_by_node.as_ref().unwrap());
    let lh = CostModel::default().limits(&c.topo, &c.workload, &on(&c, &home));
    assert!(lh.interconnect < l.interconnect, "{lh:?} vs {l:?}");
}

#[test]
fn the_model_prefers_local_and_balanced_placements() {
    // Blocks of chunks per node, all chunks read: threads on their data's node beat all threads
    // on one node (remote reads, one memory controller) and beat threads on the wrong nodes.
    let c = case("xeon-e7-4820-4s", 100, Span::All, 0.7, Homes::Blocks, 8);
    let home = search::home_cpus(&c.topo, c.info.bytes_by_node.as_ref().unwrap());
    let one_node = search::one_node_cpus(&c.topo, 0, 8).unwrap();
    assert!(cost(&c, &on(&c, &home)) < cost(&c, &on(&c, &one_node)));
    // Reversed: thread t on the node of thread 7-t.
    let mut rev = home.clone();
    rev.reverse();
    assert!(cost(&c, &on(&c, &home)) < cost(&c, &on(&c, &rev)));
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
    assert!(m.cost(t, &w, &on(&c, &sib)) > m.cost(t, &w, &on(&c, &[0, 1])));
}

#[test]
fn search_caches_its_winner_and_starts_from_it() {
    let dir = std::env::temp_dir().join(format!("loci-array-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("loci").join("search.json");
    let c = case("opteron-8220-8s", 100, Span::All, 0.2, Homes::Blocks, 8);
    let mut cache = SearchCache::open(&path);
    assert!(cache.warning.is_none());
    let first = run(&c, &ThreadPlacement::SEARCH, Some(&mut cache));
    assert!(!first.from_cache);
    let best = cost(&c, &first.plan);
    // A new process would open the file again.
    let mut cache = SearchCache::open(&path);
    let again = run(&c, &ThreadPlacement::SEARCH, Some(&mut cache));
    assert!(again.from_cache);
    assert_eq!(again.trials[0].label, "cache");
    assert_eq!(
        again.trials[0].cost, best,
        "first trial is the cached winner"
    );
    assert!(cost(&c, &again.plan) <= best);
    // Another workload on the same machine does not hit the entry.
    let other = case("opteron-8220-8s", 10, Span::One, 0.2, Homes::Blocks, 8);
    let mut cache = SearchCache::open(&path);
    let o = run(&other, &ThreadPlacement::SEARCH, Some(&mut cache));
    assert!(!o.from_cache);
    // A corrupt file: a clear warning, then a fresh cache that works.
    std::fs::write(&path, "{ not json").unwrap();
    let mut cache = SearchCache::open(&path);
    let w = cache.warning.clone().unwrap();
    assert!(w.contains("search.json") && w.contains("not valid"), "{w}");
    let r = run(&c, &ThreadPlacement::SEARCH, Some(&mut cache));
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
    let e = run(&c, &"elastic".parse().unwrap(), None);
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
    assert_eq!(cost(&c, &e.plan), best);
    // Threads are bound to sets of whole nodes, grown in compact order.
    let first = e.trials[0].plan.threads[0].cpus.clone();
    assert_eq!(first.len(), 16, "one node of the E7-4820 has 16 cpus");
}

/// The spellings: loci-place's strategies as `loci plan --threads` writes them, `shared` alone,
/// and the searches; a spelling that used to mean something else is an error that says what to
/// write now.
#[test]
fn strategy_text_parses_and_errors_name_the_choices() {
    for s in [
        "os",
        "compact",
        "sparse",
        "shared",
        "shared:4",
        "random:20",
        "group",
        "nodes:0-1",
        "cpus:0-3",
        "compact@core",
        "best-of:20",
        "elastic",
        "search",
    ] {
        let p: ThreadPlacement = s.parse().unwrap();
        assert_eq!(p.to_string(), s);
        assert_eq!(
            p.adaptive(),
            ["best-of:20", "elastic", "search"].contains(&s)
        );
    }
    let place = |s: &str| ThreadPlacement::Strategy(s.parse().unwrap());
    assert_eq!(
        "random:20".parse::<ThreadPlacement>().unwrap(),
        place("random:20")
    );
    assert_eq!(
        "shared:4".parse::<ThreadPlacement>().unwrap(),
        place("shared:4")
    );
    assert_eq!(
        "best-of:20".parse::<ThreadPlacement>().unwrap(),
        ThreadPlacement::Search(PlanSearch::BestOf(20))
    );
    let err = |s: &str| s.parse::<ThreadPlacement>().unwrap_err().to_string();
    for s in ["random", "random@core"] {
        let e = err(s);
        assert!(e.contains("seed") && e.contains("best-of:K"), "{e}");
    }
    for (s, says) in [
        ("best-of", "best-of:20"),
        ("best-of:0", "`0` is not a number of random plans"),
        ("best-of:x", "`x` is not a number of random plans"),
        ("search:3", "takes nothing after its name, got `:3`"),
        ("elastic@node", "takes nothing after its name, got `@node`"),
        (
            "place:cpus:0-3",
            "write the loci-place strategy itself, `cpus:0-3`",
        ),
        ("shared:0", "at least 1"),
        ("compact@socket", "cpu, core, group, node"),
    ] {
        let e = err(s);
        assert!(
            e.contains(&format!("`{s}`")) && e.contains(says),
            "{s}: {e}"
        );
    }
    let e = err("spread");
    assert!(
        e.contains("`spread`")
            && e.contains("nodes:LIST")
            && e.contains("best-of:K, elastic, search"),
        "{e}"
    );
    assert_eq!(ThreadPlacement::parse_list("os,search").unwrap().len(), 2);
    let defaults = ThreadPlacement::parse_list(ThreadPlacement::DEFAULTS).unwrap();
    assert_eq!(defaults.iter().filter(|p| p.adaptive()).count(), 3);
}

/// `random:SEED` is one plan, no trial, with a note that the best of K is `best-of:K`;
/// `best-of:K` tries seeds 0..K; a strategy's cpus that are not allowed are named.
#[test]
fn random_is_a_seed_and_best_of_tries_k_seeds() {
    let c = e7_all_chunks_round_robin_16();
    let one = run(&c, &"random:3".parse().unwrap(), None);
    assert!(one.trials.is_empty());
    assert_eq!(one.plan.strategy.to_string(), "random:3");
    assert!(
        one.notes.iter().any(|n| n.contains("best-of:3")),
        "{:?}",
        one.notes
    );
    let best = run(&c, &"best-of:3".parse().unwrap(), None);
    let labels: Vec<&str> = best.trials.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(labels, ["random:0", "random:1", "random:2"]);
    assert!(best.notes.is_empty());
    let seeded = best.trials.iter().find(|t| t.label == best.label).unwrap();
    assert_eq!(best.plan, seeded.plan);
    let e = try_run(&c, &"cpus:200".parse().unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cpus:200") && e.contains("cpu 200"), "{e}");
}
