//! Placement check for multi-node machines (run inside the NUMA VMs of loci-vm, or on real
//! hardware): prints one `LOCI-CHECK ok NAME` / `LOCI-CHECK FAIL NAME -- DETAIL` line per fact
//! and the measured local-access ratios; exits 1 if any check failed.
//!
//! 1. chunks bound round-robin to the nodes: every sampled page of every chunk is on its home;
//! 2. first touch by a compact generator pinned on every cpu: pages on the recorded home node;
//! 3. subarray of every chunk of the first-touched volume under the data-aware `home` pinning:
//!    threads ran on the cpus
//!    planned for them, and the local-access ratio is >= 0.95 (the round-robin bound volume's
//!    ratio, which a static schedule caps at 1/2 here, is reported);
//! 4. the same query under `compact` (every thread on the first node(s)) is reported for contrast;
//! 5. results equal a slice of the dense volume.
//!
//! Usage: loci-array-vm-check [SIDE]   (volume SIDE^3 f32, default 96)

use loci_array::search::home_pinning;
use loci_array::strategy::{static_pinning, RunInfo, ThreadStrategy};
use loci_array::{
    seismic_layout, subarray, Array, BuildOptions, ChunkMem, Chunking, DType, Home, ModelWorkload,
    Pinning, Query, Seismic, Span, SubarrayOptions,
};

fn line(name: &str, r: Result<String, String>, failed: &mut bool) {
    match r {
        Ok(note) if note.is_empty() => println!("LOCI-CHECK ok {name}"),
        Ok(note) => println!("LOCI-CHECK ok {name}\n# {name}: {note}"),
        Err(e) => {
            *failed = true;
            println!("LOCI-CHECK FAIL {name} -- {e}");
        }
    }
}

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
    let topo = match loci_topo::load(&loci_topo::Source::live()) {
        Ok(t) => t,
        Err(e) => {
            println!("LOCI-CHECK FAIL array/topology -- {e}");
            std::process::exit(1);
        }
    };
    let cpus: Vec<u32> = topo.allowed_cpus().iter().collect();
    let mems = topo.allowed_mems();
    let threads = cpus.len();
    println!(
        "# {} nodes with memory ({mems}), {threads} cpus, volume {side}^3 f32",
        mems.len()
    );
    let mut failed = false;
    let shape = [side, side, side];
    let chunks = 2 * mems.len().max(1);

    // 1. bind round-robin.
    let bound = Array::build(
        seismic_layout(shape, DType::F32, &Chunking::Count(chunks)).expect("layout"),
        &BuildOptions {
            mem: ChunkMem::Bind(mems.clone()),
            pinning: Pinning::unpinned(threads),
            huge_pages: false,
        },
        &topo,
        |c| Seismic::default().fill(c),
    )
    .expect("build");
    line(
        "array/bind/pages-on-home",
        pages_on_home(&bound),
        &mut failed,
    );

    // 2. first touch by a compact generator on every cpu.
    let gen = static_pinning(
        &topo,
        &ThreadStrategy::Compact,
        threads,
        &RunInfo::default(),
    )
    .expect("compact")
    .expect("static");
    let touched = Array::build(
        seismic_layout(shape, DType::F32, &Chunking::Count(chunks)).expect("layout"),
        &BuildOptions {
            mem: ChunkMem::FirstTouch,
            pinning: gen,
            huge_pages: false,
        },
        &topo,
        |c| Seismic::default().fill(c),
    )
    .expect("build");
    line(
        "array/first-touch/pages-on-generator-node",
        pages_on_home(&touched),
        &mut failed,
    );

    // 3. and 4. subarray of all chunks under `home` and `compact`, on the first-touched volume
    // (contiguous blocks of chunks per node, so the static schedule's thread blocks can be local;
    // with round-robin bound chunks each thread's block spans nodes, reported below).
    let bound_rr = bound;
    let bound = touched;
    let q = Query::new(bound.layout(), Span::All, 0.7).expect("query");
    let homes: Vec<Home> = bound.chunks().iter().map(|c| c.home.clone()).collect();
    let w = ModelWorkload::subarray(bound.layout(), &q.bounds, threads, |c| homes[c].clone());
    let home = home_pinning(&topo, &w.bytes_by_node());
    let opts = SubarrayOptions {
        sample_locality: true,
        // Placement is the point here: the pinned threads copy even a small result.
        inline_bytes: 0,
        ..Default::default()
    };
    let planned = home.single_cpus().expect("one cpu per thread");
    let run = subarray(&bound, &q.bounds, &home, &opts, &topo);
    line(
        "array/subarray/home/threads-where-planned",
        match &run {
            Err(e) => Err(e.to_string()),
            Ok((_, st)) => st
                .part_thread
                .iter()
                .enumerate()
                .find(|(_, (t, cpu))| *cpu != Some(planned[*t]))
                .map(|(i, (t, cpu))| {
                    Err(format!(
                        "part {i}: thread {t} planned on cpu {} ran on {cpu:?}",
                        planned[*t]
                    ))
                })
                .unwrap_or(Ok(format!("pinning {home}"))),
        },
        &mut failed,
    );
    line(
        "array/subarray/home/local-access>=0.95",
        match &run {
            Err(e) => Err(e.to_string()),
            Ok((_, st)) => match st.local_access_ratio {
                Some(r) if r >= 0.95 => Ok(format!("local-access ratio {r:.3}")),
                other => Err(format!("local-access ratio {other:?}")),
            },
        },
        &mut failed,
    );
    let compact = static_pinning(
        &topo,
        &ThreadStrategy::Compact,
        threads.div_ceil(2),
        &RunInfo::default(),
    )
    .expect("compact")
    .expect("static");
    match subarray(&bound, &q.bounds, &compact, &opts, &topo) {
        Ok((_, st)) => println!(
            "# array/subarray/compact ({} threads): local-access ratio {:?}",
            compact.len(),
            st.local_access_ratio
        ),
        Err(e) => println!("# array/subarray/compact: {e}"),
    }

    {
        let hs: Vec<Home> = bound_rr.chunks().iter().map(|c| c.home.clone()).collect();
        let w = ModelWorkload::subarray(bound_rr.layout(), &q.bounds, threads, |c| hs[c].clone());
        let p = home_pinning(&topo, &w.bytes_by_node());
        match subarray(&bound_rr, &q.bounds, &p, &opts, &topo) {
            Ok((_, st)) => println!(
                "# array/subarray/bind-round-robin/home: local-access ratio {:?}",
                st.local_access_ratio
            ),
            Err(e) => println!("# array/subarray/bind-round-robin/home: {e}"),
        }
    }
    // 5. the result equals the dense slice.
    line(
        "array/subarray/equals-reference",
        match &run {
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
        },
        &mut failed,
    );
    std::process::exit(if failed { 1 } else { 0 });
}
