use loci_array::*;
fn main() {
    for count in [1, 100, 1000] {
        let l = seismic_layout([512, 512, 512], DType::F32, &Chunking::Count(count)).unwrap();
        for span in [Span::One, Span::All] {
            for sel in [0.2, 0.7] {
                let q = Query::new(&l, span, sel).unwrap();
                let parts = plan_parts(&l, &q.bounds, 2, None);
                println!(
                    "c{count} chunk {:?} grid {:?} {span} {sel} box {:?} parts {}",
                    l.chunk,
                    l.grid(),
                    q.bounds,
                    parts.len()
                );
            }
        }
    }
}
