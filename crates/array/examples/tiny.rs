use loci_array::*;
use std::time::Instant;
fn main() {
    let topo = loci_topo::load(&loci_topo::Source::live()).unwrap();
    let side: usize = std::env::var("SIDE")
        .map(|v| v.parse().unwrap())
        .unwrap_or(256);
    let l = seismic_layout(
        [side, side, side],
        DType::F32,
        &Chunking::Count(
            std::env::var("COUNT")
                .map(|v| v.parse().unwrap())
                .unwrap_or(1000),
        ),
    )
    .unwrap();
    let src = Array::build(
        l,
        &BuildOptions {
            huge_pages: true,
            ..BuildOptions::first_touch(2)
        },
        &topo,
        |c| Seismic::default().fill(c),
    )
    .unwrap();
    let sel: f64 = std::env::var("SEL")
        .map(|v| v.parse().unwrap())
        .unwrap_or(0.2);
    let span: Span = std::env::var("SPAN")
        .unwrap_or("one".into())
        .parse()
        .unwrap();
    let q = Query::new(src.layout(), span, sel).unwrap();
    let pin = Pinning::on_cpus(&[0, 1]);
    let mode = std::env::args().nth(1).unwrap_or("on".into());
    let opts = SubarrayOptions {
        huge_pages: true,
        pool: if mode == "on" {
            Some(BufferPool::global().clone())
        } else {
            None
        },
        inline_bytes: std::env::var("INLINE")
            .map(|v| v.parse().unwrap())
            .unwrap_or(1 << 20),
        stream_bytes: std::env::var("STREAM")
            .map(|v| v.parse().unwrap())
            .unwrap_or(32 << 20),
        ..Default::default()
    };
    let n: usize = std::env::var("N")
        .map(|v| v.parse().unwrap())
        .unwrap_or(200000);
    if std::env::var("ALT").is_ok() {
        let mut t = [Vec::new(), Vec::new()];
        let mut last = None;
        for i in 0..n {
            let mut o = opts.clone();
            o.stream_bytes = if i % 2 == 0 { 0 } else { usize::MAX };
            let s = Instant::now();
            let (r, _) = subarray(&src, &q.bounds, &pin, &o, &topo).unwrap();
            t[i % 2].push(s.elapsed().as_secs_f64() * 1e3);
            last = Some(r);
        }
        drop(last);
        for (k, v) in t.iter_mut().enumerate() {
            v.sort_by(f64::total_cmp);
            println!(
                "{}: min {:.2} ms median {:.2} ms",
                if k == 0 { "stream" } else { "regular" },
                v[0],
                v[v.len() / 2]
            );
        }
        return;
    }
    let mut last = None;
    let t = Instant::now();
    for _ in 0..n {
        let (r, _) = subarray(&src, &q.bounds, &pin, &opts, &topo).unwrap();
        last = Some(r);
    }
    let dt = t.elapsed().as_secs_f64() / n as f64;
    let bytes = last.unwrap().arena().len();
    println!("{mode}: {:.2} us per subarray of {bytes} B", dt * 1e6);
}
