//! subarray against a naive cell-by-cell reference: random boxes, every type, 1-6 dimensions and
//! 1-5 attributes (past 4 the per-dimension vectors leave the stack), chunk-boundary cases, empty
//! and full boxes, every schedule and thread count.

use std::ops::Range;

use loci_array::*;
use loci_topo::Topology;
use proptest::prelude::*;

/// This machine as one node with the cpus this process may use.
fn here() -> Topology {
    Topology::flat(loci_place::sys::get_affinity(0).unwrap(), "test:affinity")
}

/// `n` threads on this process's cpus in id order, wrapping (loci-place `cpus:all`).
fn on_cpus(topo: &Topology, n: usize) -> Plan {
    pin::plan(topo, &"cpus:all".parse().unwrap(), n).unwrap()
}

/// A value that differs in every cell and attribute and is exact in every type.
fn value(a: usize, cell: &[usize]) -> f64 {
    let h = cell.iter().fold(a as u64 * 7919 + 1, |h, &x| {
        h.wrapping_mul(1_000_003) ^ x as u64
    });
    (seismic::mix64(h) % 60_000) as f64
}

fn array(shape: &[usize], chunk: &[usize], dtypes: &[DType], topo: &Topology) -> Array {
    let dims = shape
        .iter()
        .enumerate()
        .map(|(i, &n)| Dim::new(&format!("d{i}"), n))
        .collect();
    let attrs = dtypes
        .iter()
        .enumerate()
        .map(|(i, &t)| Attr::new(&format!("a{i}"), t))
        .collect();
    let layout = Layout::new(dims, attrs, &Chunking::Shape(chunk.to_vec())).unwrap();
    Array::from_fn(layout, topo, value).unwrap()
}

/// The naive reference: every cell of the box read one by one from the source.
fn check_against_reference(src: &Array, b: &[Range<usize>], out: &Array) {
    let ext: Vec<usize> = b.iter().map(|r| r.end - r.start).collect();
    assert_eq!(out.layout().shape(), ext);
    let cells: usize = ext.iter().product();
    for a in 0..src.layout().attrs.len() {
        for i in 0..cells {
            let mut rest = i;
            let mut rel = vec![0; ext.len()];
            for d in (0..ext.len()).rev() {
                rel[d] = rest % ext[d];
                rest /= ext[d];
            }
            let abs: Vec<usize> = rel.iter().zip(b).map(|(x, r)| x + r.start).collect();
            assert_eq!(
                out.cell_bytes(a, &rel),
                src.cell_bytes(a, &abs),
                "attr {a} cell {abs:?} box {b:?}"
            );
        }
    }
}

fn run(
    src: &Array,
    b: &[Range<usize>],
    threads: usize,
    schedule: Schedule,
    part: Option<usize>,
) -> Array {
    let topo = here();
    let plan = on_cpus(&topo, threads);
    let opts = SubarrayOptions {
        schedule,
        part_bytes: part,
        sample_locality: true,
        huge_pages: false,
        // Odd thread counts copy inline (one thread: the calling thread alone; three: with up to
        // two helpers), even ones always on the pinned threads, whatever the result's size, so
        // every path meets the reference.
        inline_bytes: if threads % 2 == 1 { usize::MAX } else { 0 },
        inline_bytes_pooled: 0,
        // Streaming stores for every run with an even thread count, regular ones otherwise.
        stream_bytes: if threads.is_multiple_of(2) {
            0
        } else {
            usize::MAX
        },
        // The process-wide result-buffer pool: results reuse the memory of earlier ones (of
        // other sizes and boxes), so stale bytes would show up as differences.
        pool: Some(BufferPool::global().clone()),
    };
    let (out, stats) = subarray(src, b, &plan, &opts, &topo).unwrap();
    assert_eq!(stats.inline, threads % 2 == 1);
    assert!(stats.bytes_per_thread.len() <= threads);
    // One node here: every thread's node is known, so a non-empty result is bound and pooled.
    if out.arena().is_empty() {
        assert_eq!(stats.pool, PoolOutcome::Empty);
    } else {
        assert!(
            matches!(stats.pool, PoolOutcome::Hit | PoolOutcome::Miss),
            "{:?}",
            stats.pool
        );
        assert!(out.chunks().iter().all(|c| c.home == Home::Node(0)));
    }
    let copied: usize = stats.bytes_per_thread.iter().sum();
    assert_eq!(
        copied,
        b.iter().map(|r| r.end - r.start).product::<usize>() * src.layout().cell_bytes()
    );
    if copied > 0 {
        // One node here: every sampled byte is local.
        assert_eq!(stats.local_access_ratio, Some(1.0));
    }
    out
}

#[allow(clippy::type_complexity)]
fn case() -> impl Strategy<
    Value = (
        Vec<usize>,
        Vec<usize>,
        Vec<Range<usize>>,
        Vec<DType>,
        usize,
        bool,
        usize,
    ),
> {
    (1usize..=6)
        .prop_flat_map(|nd| {
            // Five and six dimensions: shorter sides, so the naive reference stays quick.
            let side = if nd > 4 { 4 } else { 9 };
            (
                proptest::collection::vec(1usize..=side, nd),
                proptest::collection::vec(1usize..=5, nd),
                proptest::collection::vec(any::<(u16, u16)>(), nd),
                proptest::collection::vec(proptest::sample::select(DType::ALL.to_vec()), 1..=5),
                1usize..=4,
                any::<bool>(),
                prop_oneof![Just(1usize), Just(8), Just(100), Just(1 << 20)],
            )
        })
        .prop_map(|(shape, chunk, raw, dtypes, threads, dynamic, part)| {
            let b = shape
                .iter()
                .zip(&raw)
                .map(|(&n, &(x, y))| {
                    let (x, y) = (x as usize % (n + 1), y as usize % (n + 1));
                    x.min(y)..x.max(y)
                })
                .collect();
            (shape, chunk, b, dtypes, threads, dynamic, part)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn subarray_equals_reference((shape, chunk, b, dtypes, threads, dynamic, part) in case()) {
        let topo = here();
        let src = array(&shape, &chunk, &dtypes, &topo);
        let sched = if dynamic { Schedule::Dynamic } else { Schedule::Static };
        let out = run(&src, &b, threads, sched, Some(part));
        check_against_reference(&src, &b, &out);
        // The result is an array like any other: slicing it again agrees with slicing the source.
        let inner: Vec<Range<usize>> = b.iter().map(|r| {
            let n = r.end - r.start;
            (n / 3)..(n - n / 3)
        }).collect();
        let twice = out.subarray(&inner, &topo).unwrap();
        let direct: Vec<Range<usize>> = inner.iter().zip(&b).map(|(i, r)| r.start + i.start..r.start + i.end).collect();
        check_against_reference(&src, &direct, &twice);
    }
}

#[test]
fn chunk_boundary_empty_and_full_boxes() {
    let topo = here();
    let src = array(&[12, 10, 9], &[4, 5, 3], &DType::ALL, &topo);
    let boxes: Vec<Vec<Range<usize>>> = vec![
        vec![0..12, 0..10, 0..9],  // full
        vec![4..8, 5..10, 3..6],   // exactly one chunk
        vec![3..5, 4..6, 2..4],    // straddles every boundary by one cell
        vec![4..4, 0..10, 0..9],   // empty along one dimension
        vec![0..0; 3],             // empty everywhere
        vec![11..12, 9..10, 8..9], // last cell
        vec![0..12, 0..10, 3..6],  // complete outer dims, one chunk column
    ];
    for b in boxes {
        for threads in [1, 3] {
            for s in [Schedule::Static, Schedule::Dynamic] {
                let out = run(&src, &b, threads, s, None);
                check_against_reference(&src, &b, &out);
            }
        }
    }
    // A full box of a single-chunk array is one memcpy per attribute and equal to the source.
    let one = array(&[5, 6], &[5, 6], &[DType::F64], &topo);
    let out = one.subarray(&[0..5, 0..6], &topo).unwrap();
    assert_eq!(out.to_dense(0), one.to_dense(0));
}

#[test]
fn bad_boxes_are_clear_errors() {
    let topo = here();
    let src = array(&[12, 10], &[4, 5], &[DType::F32], &topo);
    // The error of box `b` names every one of `says`.
    let refused = |b: &[Range<usize>], says: &[&str]| {
        let e = src.subarray(b, &topo).err().unwrap().to_string();
        assert!(says.iter().all(|w| e.contains(w)), "{e}");
    };
    let reversed = Range { start: 7, end: 3 };
    refused(&[0..12, reversed], &["`d1`", "7..3", "reversed", "0..10"]);
    refused(&[5..13, 0..3], &["`d0`", "5..13", "outside", "0..12"]);
    #[allow(clippy::single_range_in_vec_init)]
    refused(&[0..1], &["1 ranges", "2 dimensions"]);
}

#[test]
fn to_dense_is_c_order() {
    let topo = here();
    let src = array(&[7, 5, 3], &[2, 2, 2], &[DType::I32, DType::U16], &topo);
    for a in 0..2 {
        let d = src.to_dense(a);
        let sz = src.layout().attrs[a].dtype.size();
        for z in 0..7 {
            for y in 0..5 {
                for x in 0..3 {
                    let i = (z * 5 + y) * 3 + x;
                    assert_eq!(&d[i * sz..(i + 1) * sz], src.cell_bytes(a, &[z, y, x]));
                }
            }
        }
    }
}

#[test]
fn seismic_chunks_match_the_reference_formula_whatever_the_chunking() {
    let topo = here();
    let shape = [24, 10, 14];
    let s = Seismic { seed: 7, layers: 5 };
    let whole = Array::build(
        seismic_layout(shape, DType::F64, &Chunking::Count(1)).unwrap(),
        &BuildOptions::first_touch(&topo, 1).unwrap(),
        &topo,
        |c| s.fill(c),
    )
    .unwrap();
    let opts = BuildOptions {
        mem: "round-robin".parse().unwrap(),
        plan: on_cpus(&topo, topo.allowed_cpus().len()),
        huge_pages: true,
    };
    let chunked = Array::build(
        seismic_layout(shape, DType::F64, &Chunking::Shape(vec![5, 3, 4])).unwrap(),
        &opts,
        &topo,
        |c| s.fill(c),
    )
    .unwrap();
    assert_eq!(whole.to_dense(0), chunked.to_dense(0));
    let mut layers = std::collections::BTreeSet::new();
    for z in 0..shape[0] {
        for y in 0..shape[1] {
            for x in 0..shape[2] {
                let v = s.velocity(shape, [z, y, x]);
                assert_eq!(chunked.get(0, &[z, y, x]), v);
                assert!((1200.0..6500.0).contains(&v), "velocity {v} at {z},{y},{x}");
                layers.insert((v / 500.0) as i64);
            }
        }
    }
    assert!(layers.len() >= 4, "layered: {layers:?}");
    // Velocity grows with depth on average (layers get faster).
    let mean = |z: usize| {
        (0..shape[1])
            .map(|y| s.velocity(shape, [z, y, 3]))
            .sum::<f64>()
    };
    assert!(mean(shape[0] - 1) > mean(0) + 1000.0);
    // Another seed gives another volume.
    assert_ne!(
        Seismic { seed: 8, layers: 5 }.velocity(shape, [3, 3, 3]),
        s.velocity(shape, [3, 3, 3])
    );
    // Homes: bound chunks say their node and their pages are there.
    for (c, nodes) in chunked.chunks().iter().zip(chunked.page_nodes(3).unwrap()) {
        assert_eq!(c.home, Home::Node(0));
        assert!(nodes.iter().all(|&n| n == 0), "{nodes:?}");
    }
}

#[test]
fn first_touch_records_the_generator_node() {
    let topo = here();
    let opts = BuildOptions {
        mem: loci_place::MemPolicy::FirstTouch,
        plan: on_cpus(&topo, topo.allowed_cpus().len()),
        huge_pages: false,
    };
    let a = Array::build(
        seismic_layout([16, 8, 8], DType::F32, &Chunking::Count(4)).unwrap(),
        &opts,
        &topo,
        |c| Seismic::default().fill(c),
    )
    .unwrap();
    assert!(a.chunks().iter().all(|c| c.home == Home::Node(0)));
    let e = chunk_policy("round-robin:7", &topo)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("node 7") && e.contains("present nodes: 0"),
        "{e}"
    );
    let e = chunk_policy("spread", &topo).unwrap_err().to_string();
    assert!(
        e.contains("spread") && e.contains("round-robin[:NODES]"),
        "{e}"
    );
    assert_eq!(
        chunk_policy("interleave", &topo).unwrap(),
        loci_place::MemPolicy::Interleave(None)
    );
}

#[test]
fn stress_many_threads_many_parts() {
    // More threads than cpus, tiny parts, dynamic and static: every run equals the reference.
    let topo = here();
    let src = array(&[40, 30, 20], &[7, 30, 6], &[DType::F32, DType::U16], &topo);
    for round in 0..20 {
        let b = vec![round..40 - round / 2, 3..29, round % 5..20];
        let s = if round % 2 == 0 {
            Schedule::Dynamic
        } else {
            Schedule::Static
        };
        let out = run(&src, &b, 8, s, Some(16 + round));
        check_against_reference(&src, &b, &out);
    }
}

/// A result under `inline_bytes` is copied by the calling thread and at most threads - 1 helpers
/// (with a one-thread plan, the caller alone reports every part and every byte); with
/// `inline_bytes: 0` the same box goes to the plan's threads. All equal the reference.
#[test]
fn small_results_are_copied_by_the_callers_team_unless_told_otherwise() {
    let topo = here();
    let src = array(&[40, 30, 20], &[10, 10, 10], &[DType::F32], &topo);
    let b = vec![0..40, 0..30, 0..20]; // 96 KB
    let on = |n: usize| on_cpus(&topo, n);
    let bytes = 40 * 30 * 20 * 4;
    for (pin, inline, most, least) in [
        (on(1), loci_array::subarray::INLINE_BYTES, 1, 1),
        (on(3), loci_array::subarray::INLINE_BYTES, 3, 1),
        (on(3), 0, 3, 3),
    ] {
        let opts = SubarrayOptions {
            inline_bytes: inline,
            inline_bytes_pooled: 0,
            part_bytes: Some(4 << 10),
            ..Default::default()
        };
        let (out, stats) = subarray(&src, &b, &pin, &opts, &topo).unwrap();
        check_against_reference(&src, &b, &out);
        let used = stats.bytes_per_thread.len();
        assert_eq!(stats.inline, inline > 0);
        assert!(
            (least..=most).contains(&used),
            "{} threads, inline_bytes {inline}: {used} copied",
            pin.threads.len()
        );
        assert_eq!(stats.bytes_per_thread.iter().sum::<usize>(), bytes);
        assert!(
            stats.part_thread.iter().all(|(t, _)| *t < used),
            "{stats:?}"
        );
        if inline == 0 {
            assert!(stats.bytes_per_thread.iter().all(|b| *b > 0), "{stats:?}");
        }
    }
    // With a second cpu on the node, its helper (spinning after the first call) takes parts.
    // The other tests of this binary may keep that cpu busy for a while (the caller then takes
    // back the helper's offers, as it should), so calls go on for up to 10 s, not a fixed count.
    if topo.allowed_cpus().len() >= 2 {
        let opts = SubarrayOptions {
            inline_bytes_pooled: 0,
            part_bytes: Some(4 << 10),
            ..Default::default()
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut calls = 0;
        let shared = loop {
            let (_, stats) = subarray(&src, &b, &on(2), &opts, &topo).unwrap();
            calls += 1;
            if stats.bytes_per_thread.len() == 2 && stats.bytes_per_thread[1] > 0 {
                break true;
            }
            if std::time::Instant::now() > until {
                break false;
            }
        };
        assert!(shared, "no helper took a part in {calls} calls over 10 s");
    }
}

/// A run built from a loci-place plan copies where the plan says: under `cpus:C` (C the last
/// allowed cpu: cpu 1 on a 2-cpu machine) every part of both threads ran on cpu C, and under
/// `os` the threads ran on the caller's cpus.
#[test]
fn a_plan_from_a_strategy_places_the_copying_threads() {
    let topo = here();
    let src = array(&[40, 30, 20], &[10, 10, 10], &[DType::F32], &topo);
    let b = vec![0..40, 0..30, 0..20];
    let opts = SubarrayOptions {
        inline_bytes: 0,
        inline_bytes_pooled: 0,
        part_bytes: Some(4 << 10),
        ..Default::default()
    };
    let last = topo.allowed_cpus().iter().last().unwrap();
    let plan = pin::plan(&topo, &format!("cpus:{last}").parse().unwrap(), 2).unwrap();
    let (out, stats) = subarray(&src, &b, &plan, &opts, &topo).unwrap();
    check_against_reference(&src, &b, &out);
    assert!(!stats.inline && stats.part_thread.len() > 2, "{stats:?}");
    assert!(
        stats.part_thread.iter().all(|&(_, cpu)| cpu == Some(last)),
        "{stats:?}"
    );
    let os = pin::unpinned(&topo, 2).unwrap();
    let (_, stats) = subarray(&src, &b, &os, &opts, &topo).unwrap();
    let mine = loci_place::sys::get_affinity(0).unwrap();
    assert!(
        stats
            .part_thread
            .iter()
            .all(|&(_, cpu)| cpu.is_some_and(|c| mine.contains(c))),
        "{stats:?}"
    );
}
