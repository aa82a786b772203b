//! The result-buffer pool under `subarray`: reuse, the byte cap, pool off, and many threads taking
//! and giving back buffers at once, every result checked against the source cell by cell.

use std::ops::Range;
use std::sync::Arc;

use loci_array::*;
use loci_topo::Topology;

/// This machine as one node with the cpus this process may use, and a two-attribute source
/// array of 48x40x32 cells on it.
fn here_and_source() -> (Topology, Array) {
    let topo = Topology::flat(loci_place::sys::get_affinity(0).unwrap(), "test:affinity");
    let layout = Layout::new(
        vec![Dim::new("z", 48), Dim::new("y", 40), Dim::new("x", 32)],
        vec![Attr::new("v", DType::F32), Attr::new("w", DType::U16)],
        &Chunking::Shape(vec![12, 20, 16]),
    )
    .unwrap();
    let src = Array::from_fn(layout, &topo, |a, c| {
        (a * 1_000_000 + c[0] * 10_000 + c[1] * 100 + c[2]) as f64 % 60_000.0
    })
    .unwrap();
    (topo, src)
}

fn check(src: &Array, b: &[Range<usize>], out: &Array) {
    let ext: Vec<usize> = b.iter().map(|r| r.end - r.start).collect();
    assert_eq!(out.layout().shape(), ext);
    for a in 0..src.layout().attrs.len() {
        for z in 0..ext[0] {
            for y in 0..ext[1] {
                for x in 0..ext[2] {
                    assert_eq!(
                        out.cell_bytes(a, &[z, y, x]),
                        src.cell_bytes(a, &[z + b[0].start, y + b[1].start, x + b[2].start]),
                        "attr {a} cell {z},{y},{x} of box {b:?}"
                    );
                }
            }
        }
    }
}

fn opts(pool: &Arc<BufferPool>, threads_copy: bool) -> SubarrayOptions {
    SubarrayOptions {
        pool: Some(pool.clone()),
        inline_bytes: if threads_copy { 0 } else { usize::MAX },
        inline_bytes_pooled: 0,
        ..Default::default()
    }
}

/// `n` threads on this process's cpus in id order, wrapping (loci-place `cpus:all`).
fn on_cpus(topo: &Topology, n: usize) -> Plan {
    pin::plan(topo, &"cpus:all".parse().unwrap(), n).unwrap()
}

#[test]
fn a_dropped_result_serves_the_next_one_bound_the_same() {
    let (topo, src) = here_and_source();
    let pool = BufferPool::new(64 << 20);
    let b = vec![3..40, 5..35, 0..32];
    for threads_copy in [false, true] {
        pool.clear();
        pool.reset_stats();
        let p = on_cpus(&topo, 2);
        let (first, st) = subarray(&src, &b, &p, &opts(&pool, threads_copy), &topo).unwrap();
        assert_eq!(st.pool, PoolOutcome::Miss);
        check(&src, &b, &first);
        let addr = first.arena().as_ptr();
        let binding = first
            .arena()
            .binding()
            .cloned()
            .expect("a pooled result is bound");
        assert_eq!(binding.segments().len(), 1, "{binding}");
        assert_eq!(binding.node_at(0), Some(0));
        drop(first);
        let s = pool.stats();
        assert_eq!((s.returned, s.buffers_held), (1, 1));
        // The same query again: the same memory, the same binding, the right cells.
        let (again, st) = subarray(&src, &b, &p, &opts(&pool, threads_copy), &topo).unwrap();
        assert_eq!(st.pool, PoolOutcome::Hit);
        assert_eq!(again.arena().as_ptr(), addr);
        assert_eq!(again.arena().binding(), Some(&binding));
        check(&src, &b, &again);
        drop(again);
        // A smaller box reuses it too, and none of the old cells leak into the result.
        let small = vec![10..20, 0..40, 7..9];
        let (s2, st) = subarray(&src, &small, &p, &opts(&pool, threads_copy), &topo).unwrap();
        assert_eq!(st.pool, PoolOutcome::Hit);
        assert_eq!(s2.arena().as_ptr(), addr);
        check(&src, &small, &s2);
        // While it is out, another result cannot have it.
        let (other, st) = subarray(&src, &small, &p, &opts(&pool, threads_copy), &topo).unwrap();
        assert_eq!(st.pool, PoolOutcome::Miss);
        assert_ne!(other.arena().as_ptr(), addr);
        drop((s2, other));
        let s = pool.stats();
        assert_eq!((s.hits, s.misses, s.buffers_held), (2, 2, 2));
    }
}

#[test]
fn pool_off_maps_fresh_memory_and_keeps_nothing() {
    let (topo, src) = here_and_source();
    let b = vec![0..48, 0..40, 0..32];
    let o = SubarrayOptions {
        pool: None,
        ..Default::default()
    };
    let (out, st) = subarray(&src, &b, &on_cpus(&topo, 2), &o, &topo).unwrap();
    assert_eq!(st.pool, PoolOutcome::Off);
    assert!(out.arena().binding().is_none());
    check(&src, &b, &out);
    // An empty box needs no memory.
    let pool = BufferPool::new(1 << 20);
    let (e, st) = subarray(
        &src,
        &[4..4, 0..40, 0..32],
        &on_cpus(&topo, 2),
        &opts(&pool, true),
        &topo,
    )
    .unwrap();
    assert_eq!(st.pool, PoolOutcome::Empty);
    drop(e);
    assert_eq!(pool.stats(), BufferPool::new(1 << 20).stats());
}

#[test]
fn the_cap_bounds_what_dropped_results_leave_behind() {
    let (topo, src) = here_and_source();
    let ps = loci_place::sys::page_size();
    // Every whole-array result (about 190 KB) is larger than the cap: unmapped when dropped.
    let pool = BufferPool::new(16 * ps);
    let full = vec![0..48, 0..40, 0..32];
    let (out, _) = subarray(&src, &full, &on_cpus(&topo, 1), &opts(&pool, false), &topo).unwrap();
    assert!(out.arena().mapped() > pool.cap());
    drop(out);
    let s = pool.stats();
    assert_eq!((s.evicted, s.returned, s.bytes_held), (1, 0, 0));
    // Six results held at once (each a miss: nothing pooled can serve it), then dropped in order:
    // the pool keeps the newest that fit under the cap, the oldest go first.
    let boxes: Vec<Vec<Range<usize>>> = (1..=6).map(|k| vec![0..2 * k, 0..40, 0..32]).collect();
    let mut held = Vec::new();
    for b in &boxes {
        let (r, st) = subarray(&src, b, &on_cpus(&topo, 1), &opts(&pool, false), &topo).unwrap();
        assert_eq!(st.pool, PoolOutcome::Miss);
        check(&src, b, &r);
        held.push(r);
    }
    let sizes: Vec<usize> = held.iter().map(|r| r.arena().mapped()).collect();
    for r in held {
        drop(r);
        assert!(pool.stats().bytes_held <= pool.cap());
    }
    let s = pool.stats();
    // The newest buffers that fit under the cap, and nothing else.
    let mut kept = 0;
    let mut n = 0;
    // (A buffer larger than the cap is unmapped when it comes back and takes no room.)
    for &z in sizes.iter().rev().filter(|&&z| z <= pool.cap()) {
        if kept + z > pool.cap() {
            break;
        }
        kept += z;
        n += 1;
    }
    assert_eq!((s.bytes_held, s.buffers_held), (kept, n), "{sizes:?} {s:?}");
    assert!(n >= 1 && s.evicted >= 2, "{sizes:?} {s:?}");
    // Lowering the cap evicts down to it.
    pool.set_cap(0);
    assert_eq!(pool.stats().bytes_held, 0);
}

/// Four threads run random boxes against one small pool (so buffers are taken, given back,
/// evicted and rejected all the time), each holding a few results for a while; every result
/// equals the source, and at the end every buffer the pool ever made is accounted for.
#[test]
fn stress_concurrent_subarrays_share_one_pool() {
    let (topo, src) = here_and_source();
    let pool = BufferPool::new(160 << 10);
    let rounds = 60;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (src, topo, pool) = (&src, &topo, &pool);
            s.spawn(move || {
                let mut rng = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) + 1;
                let mut next = move |n: usize| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    (rng % n as u64) as usize
                };
                let mut held: Vec<(Vec<Range<usize>>, Array)> = Vec::new();
                for round in 0..rounds {
                    let shape = [48, 40, 32];
                    let b: Vec<Range<usize>> = shape
                        .iter()
                        .map(|&n| {
                            let lo = next(n);
                            lo..lo + 1 + next(n - lo)
                        })
                        .collect();
                    let threads_copy = round % 3 == 0;
                    let o = SubarrayOptions {
                        // Streaming stores every other round.
                        stream_bytes: if round % 2 == 0 { 0 } else { usize::MAX },
                        ..opts(pool, threads_copy)
                    };
                    let (out, st) =
                        subarray(src, &b, &on_cpus(topo, 1 + next(3)), &o, topo).unwrap();
                    assert!(matches!(st.pool, PoolOutcome::Hit | PoolOutcome::Miss));
                    check(src, &b, &out);
                    held.push((b, out));
                    if held.len() > next(4) {
                        let (b, out) = held.remove(next(held.len()));
                        // Still intact while other threads reuse other buffers.
                        check(src, &b, &out);
                    }
                }
            });
        }
    });
    let s = pool.stats();
    assert_eq!(s.hits + s.misses, 4 * rounds as u64);
    assert!(s.hits > 0 && s.evicted > 0, "{s:?}");
    assert!(s.bytes_held <= pool.cap());
    // Every buffer made on a miss is now either held by the pool or was unmapped.
    assert_eq!(s.misses, s.buffers_held as u64 + s.evicted, "{s:?}");
}

/// A result between `inline_bytes` and `inline_bytes_pooled` goes to the plan's threads when
/// it needs fresh memory, and is copied inline (the calling thread and at most 2 helpers) when a
/// pooled buffer serves it.
#[test]
fn warm_results_under_inline_bytes_pooled_are_copied_inline() {
    let (topo, src) = here_and_source();
    let pool = BufferPool::new(64 << 20);
    let b = vec![0..48, 0..40, 0..32];
    let o = SubarrayOptions {
        pool: Some(pool.clone()),
        inline_bytes: 0,
        inline_bytes_pooled: 1 << 30,
        ..Default::default()
    };
    let p = on_cpus(&topo, 3);
    let (first, st) = subarray(&src, &b, &p, &o, &topo).unwrap();
    assert_eq!(st.pool, PoolOutcome::Miss);
    assert!(!st.inline, "fresh memory: the threads copy");
    assert_eq!(st.bytes_per_thread.len(), 3);
    drop(first);
    let (again, st) = subarray(&src, &b, &p, &o, &topo).unwrap();
    assert_eq!(st.pool, PoolOutcome::Hit);
    assert!(
        st.inline,
        "pooled memory: the calling thread (and helpers) copy"
    );
    assert!((1..=3).contains(&st.bytes_per_thread.len()), "{st:?}");
    check(&src, &b, &again);
    // The first try for the calling thread's binding is not counted as a miss.
    let s = pool.stats();
    assert_eq!((s.hits, s.misses), (1, 1));
}
