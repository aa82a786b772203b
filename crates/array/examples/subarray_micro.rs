//! Micro-measurement of one repeated `subarray` query, for the choices inside it that the full
//! benchmark (`loci bench subarray`) cannot isolate: the result-buffer pool on or off, the inline
//! thresholds, and streaming stores (with `ALT=1`, stream and regular runs alternate in one
//! process, so both see the same machine load).
//!
//! ```text
//! cargo build --release -p loci-array --example subarray_micro
//! ALT=1 SIDE=320 COUNT=100 SEL=0.7 SPAN=all N=40 target/release/examples/subarray_micro on
//! ```
//!
//! Argument: `on` (default) or `off` (the pool). Environment: `SIDE` (volume side, f32 cells;
//! 256), `COUNT` (chunks; 1000), `SPAN` (one, fifth, all; one), `SEL` (selectivity; 0.2), `N`
//! (queries; 200000), `INLINE` (`inline_bytes`; 1 MiB), `INLINE_POOLED` (`inline_bytes_pooled`;
//! 2 MiB), `STREAM` (`stream_bytes`; the largest
//! cache), `ALT` (set: alternate streaming on and off and print min and median of each), `PEER`
//! (set: alternate the query with a memcpy of its result's bytes into a prefaulted buffer, the
//! bench's limit peer, and with the box's rows copied by a bare loop of one `memcpy` per row,
//! no planning and no result to build: numpy's copy, and the bound for a copy run by run; print
//! the medians, each one's bandwidth against the memcpy, and how many queries a copy helper took
//! part in).
//! Two threads, on cpus 0 and 1 (or the allowed cpus, repeated).

use std::time::Instant;

use loci_array::*;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} does not parse")),
        Err(_) => default,
    }
}

fn main() -> Result<(), ArrayError> {
    let topo = loci_topo::load(&loci_topo::Source::live())
        .map_err(|e| ArrayError::Parse(format!("topology: {e}")))?;
    let side: usize = env("SIDE", 256);
    let layout = seismic_layout(
        [side, side, side],
        DType::F32,
        &Chunking::Count(env("COUNT", 1000)),
    )?;
    let gen = BuildOptions {
        huge_pages: true,
        ..BuildOptions::first_touch(&topo, 2)?
    };
    let src = Array::build(layout, &gen, &topo, |c| Seismic::default().fill(c))?;
    let span: Span = env("SPAN", "one".to_string()).parse()?;
    let q = Query::new(src.layout(), span, env("SEL", 0.2))?;
    let cpus: Vec<u32> = topo.allowed_cpus().iter().collect();
    let pin = if std::env::var("OS").is_ok() {
        pin::unpinned(&topo, 2)?
    } else {
        pin::plan_on_cpus(&topo, &[cpus[0], cpus[1 % cpus.len()]])?
    };
    let pool = std::env::args().nth(1).unwrap_or("on".into()) == "on";
    let opts = SubarrayOptions {
        huge_pages: true,
        pool: pool.then(|| BufferPool::global().clone()),
        inline_bytes: env("INLINE", subarray::INLINE_BYTES),
        inline_bytes_pooled: env("INLINE_POOLED", subarray::INLINE_POOLED_BYTES),
        stream_bytes: env("STREAM", subarray::default_stream_bytes()),
        ..Default::default()
    };
    let n: usize = env("N", 200_000);
    let mut last = None;
    if std::env::var("PEER").is_ok() {
        // Subarray, the bench's `memcpy prefaulted` peer (one memcpy of the result's bytes into a
        // buffer written before) and the bare row loop, alternating call by call.
        let bytes = q.bounds.iter().map(|r| r.end - r.start).product::<usize>() * 4;
        let from: Vec<u8> = (0..bytes).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut to = vec![1u8; bytes];
        let (mut ts, mut tm) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut tr = Vec::with_capacity(n);
        let mut to2 = vec![1u8; bytes];
        let mut helped = 0;
        let inter = src.layout().intersecting(&q.bounds);
        for _ in 0..n {
            let s = Instant::now();
            let mut d = 0;
            for (c, b) in &inter {
                let ch = &src.chunks()[*c];
                let sh = ch.shape();
                let a = src.attr_bytes(*c, 0);
                let run = (b[2].end - b[2].start) * 4;
                for i in b[0].clone() {
                    for j in b[1].clone() {
                        let o = (((i - ch.bounds[0].start) * sh[1] + j - ch.bounds[1].start)
                            * sh[2]
                            + b[2].start
                            - ch.bounds[2].start)
                            * 4;
                        to2[d..d + run].copy_from_slice(&a[o..o + run]);
                        d += run;
                    }
                }
            }
            std::hint::black_box(&mut to2);
            tr.push(s.elapsed().as_secs_f64() * 1e6);
            let s = Instant::now();
            let (r, st) = subarray(&src, &q.bounds, &pin, &opts, &topo)?;
            ts.push(s.elapsed().as_secs_f64() * 1e6);
            helped += st.bytes_per_thread.iter().skip(1).any(|&b| b > 0) as usize;
            last = Some(r);
            let s = Instant::now();
            to.copy_from_slice(std::hint::black_box(&from));
            std::hint::black_box(&mut to);
            tm.push(s.elapsed().as_secs_f64() * 1e6);
        }
        drop(last);
        assert!(from == to);
        ts.sort_by(f64::total_cmp);
        tm.sort_by(f64::total_cmp);
        tr.sort_by(f64::total_cmp);
        let (s, m, r) = (ts[n / 2], tm[n / 2], tr[n / 2]);
        println!(
            "box {:?} of chunks {:?}, {} chunk(s)",
            q.bounds,
            src.layout().chunk,
            inter.len()
        );
        println!(
            "{bytes} B, medians: memcpy {m:.2} us; subarray {s:.2} us ({:.2}x memcpy's bandwidth); \
             bare row loop {r:.2} us ({:.2}x); a helper took part in {helped} of {n} queries",
            m / s,
            m / r
        );
        return Ok(());
    }
    if std::env::var("ALT").is_ok() {
        let mut t = [Vec::new(), Vec::new()];
        for i in 0..n {
            let o = SubarrayOptions {
                stream_bytes: if i % 2 == 0 { 0 } else { usize::MAX },
                ..opts.clone()
            };
            let s = Instant::now();
            let (r, _) = subarray(&src, &q.bounds, &pin, &o, &topo)?;
            t[i % 2].push(s.elapsed().as_secs_f64() * 1e3);
            last = Some(r);
        }
        let bytes = last.map_or(0, |r| r.arena().len());
        for (k, v) in t.iter_mut().enumerate() {
            v.sort_by(f64::total_cmp);
            println!(
                "{} ({bytes} B): min {:.3} ms, median {:.3} ms",
                ["stream", "regular"][k],
                v[0],
                v[v.len() / 2]
            );
        }
        return Ok(());
    }
    let t = Instant::now();
    for _ in 0..n {
        let (r, _) = subarray(&src, &q.bounds, &pin, &opts, &topo)?;
        last = Some(r);
    }
    let per = t.elapsed().as_secs_f64() / n.max(1) as f64;
    let bytes = last.map_or(0, |r| r.arena().len());
    println!(
        "pool {}: {:.2} us per subarray of {bytes} B; {:?}",
        if pool { "on" } else { "off" },
        per * 1e6,
        BufferPool::global().stats()
    );
    Ok(())
}
