//! loci-engine's TPC-H plans against a simple single-thread reference computed row by row from
//! the same `tpchgen` rows (nested maps, no morsels, no executor), plus bad input.

use std::collections::{BTreeMap, HashMap, HashSet};

use loci_engine::exec::flat_topology;
use loci_engine::tpch::{self, days_from_civil, Answer, Data, Query, Value};
use loci_engine::{Exec, Locality, MemPolicy, Sched, Strategy};
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, RegionGenerator,
    SupplierGenerator,
};

const SF: f64 = 0.01;

/// Dates as days since 1970 (what tpchgen's unix-epoch conversion gives).
fn day(d: tpchgen::dates::TPCHDate) -> i32 {
    d.to_unix_epoch()
}

/// The reference answer of `q`, from the generators' rows in one thread.
fn reference(q: Query) -> Vec<Vec<Value>> {
    let lines: Vec<_> = LineItemGenerator::new(SF, 1, 1).iter().collect();
    let orders: Vec<_> = OrderGenerator::new(SF, 1, 1).iter().collect();
    let customers: Vec<_> = CustomerGenerator::new(SF, 1, 1).iter().collect();
    let suppliers: Vec<_> = SupplierGenerator::new(SF, 1, 1).iter().collect();
    let nations: Vec<_> = NationGenerator::new(SF, 1, 1).iter().collect();
    let regions: Vec<_> = RegionGenerator::new(SF, 1, 1).iter().collect();
    let order_of: HashMap<i64, usize> = orders
        .iter()
        .enumerate()
        .map(|(i, o)| (o.o_orderkey, i))
        .collect();
    let cust_of: HashMap<i64, usize> = customers
        .iter()
        .enumerate()
        .map(|(i, c)| (c.c_custkey, i))
        .collect();
    match q {
        Query::Q1 => {
            let cut = days_from_civil(1998, 9, 2);
            // (flag, status) -> qty, base, disc_price, charge, disc, count
            let mut g: BTreeMap<(String, String), [i128; 6]> = BTreeMap::new();
            for li in lines.iter().filter(|li| day(li.l_shipdate) <= cut) {
                let a = g
                    .entry((li.l_returnflag.to_string(), li.l_linestatus.to_string()))
                    .or_default();
                let p = li.l_extendedprice.into_inner() as i128;
                let d = li.l_discount.into_inner() as i128;
                let t = li.l_tax.into_inner() as i128;
                a[0] += li.l_quantity as i128 * 100;
                a[1] += p;
                a[2] += p * (100 - d);
                a[3] += p * (100 - d) * (100 + t);
                a[4] += d;
                a[5] += 1;
            }
            g.into_iter()
                .map(|((f, s), a)| {
                    let n = a[5] as f64;
                    vec![
                        Value::Text(f),
                        Value::Text(s),
                        Value::Dec(a[0], 2),
                        Value::Dec(a[1], 2),
                        Value::Dec(a[2], 4),
                        Value::Dec(a[3], 6),
                        Value::Float(a[0] as f64 / 100.0 / n),
                        Value::Float(a[1] as f64 / 100.0 / n),
                        Value::Float(a[4] as f64 / 100.0 / n),
                        Value::Int(a[5] as i64),
                    ]
                })
                .collect()
        }
        Query::Q6 => {
            let (lo, hi) = (days_from_civil(1994, 1, 1), days_from_civil(1995, 1, 1));
            let sum: i128 = lines
                .iter()
                .filter(|li| {
                    let d = li.l_discount.into_inner();
                    (lo..hi).contains(&day(li.l_shipdate))
                        && (5..=7).contains(&d)
                        && li.l_quantity < 24
                })
                .map(|li| (li.l_extendedprice.into_inner() * li.l_discount.into_inner()) as i128)
                .sum();
            vec![vec![Value::Dec(sum, 4)]]
        }
        Query::Q3 => {
            let d = days_from_civil(1995, 3, 15);
            let mut rev: BTreeMap<i64, i128> = BTreeMap::new();
            for li in &lines {
                let o = &orders[order_of[&li.l_orderkey]];
                let c = &customers[cust_of[&o.o_custkey]];
                if c.c_mktsegment == "BUILDING" && day(o.o_orderdate) < d && day(li.l_shipdate) > d
                {
                    *rev.entry(li.l_orderkey).or_default() += (li.l_extendedprice.into_inner()
                        * (100 - li.l_discount.into_inner()))
                        as i128;
                }
            }
            let mut rows: Vec<(i128, i32, i64, i32)> = rev
                .into_iter()
                .map(|(k, r)| {
                    let o = &orders[order_of[&k]];
                    (r, day(o.o_orderdate), k, o.o_shippriority)
                })
                .collect();
            rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            rows.truncate(10);
            rows.into_iter()
                .map(|(r, od, k, sp)| {
                    vec![
                        Value::Int(k),
                        Value::Dec(r, 4),
                        Value::Date(od),
                        Value::Int(sp as i64),
                    ]
                })
                .collect()
        }
        Query::Q5 => {
            let (lo, hi) = (days_from_civil(1994, 1, 1), days_from_civil(1995, 1, 1));
            let asia = regions.iter().find(|r| r.r_name == "ASIA").unwrap();
            let supp_nation: HashMap<i64, i64> = suppliers
                .iter()
                .map(|s| (s.s_suppkey, s.s_nationkey))
                .collect();
            let mut rev: BTreeMap<String, i128> = BTreeMap::new();
            for li in &lines {
                let o = &orders[order_of[&li.l_orderkey]];
                let c = &customers[cust_of[&o.o_custkey]];
                let sn = supp_nation[&li.l_suppkey];
                let n = nations.iter().find(|n| n.n_nationkey == sn).unwrap();
                if (lo..hi).contains(&day(o.o_orderdate))
                    && c.c_nationkey == sn
                    && n.n_regionkey == asia.r_regionkey
                {
                    *rev.entry(n.n_name.to_string()).or_default() +=
                        (li.l_extendedprice.into_inner() * (100 - li.l_discount.into_inner()))
                            as i128;
                }
            }
            let mut rows: Vec<_> = rev.into_iter().collect();
            rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            rows.into_iter()
                .map(|(n, r)| vec![Value::Text(n), Value::Dec(r, 4)])
                .collect()
        }
        Query::Q18 => {
            let mut qty: HashMap<i64, i64> = HashMap::new();
            for li in &lines {
                *qty.entry(li.l_orderkey).or_default() += li.l_quantity;
            }
            let big: HashSet<i64> = qty
                .iter()
                .filter(|(_, &q)| q > 300)
                .map(|(&k, _)| k)
                .collect();
            let mut rows: Vec<_> = orders
                .iter()
                .filter(|o| big.contains(&o.o_orderkey))
                .map(|o| {
                    let c = &customers[cust_of[&o.o_custkey]];
                    (
                        o.o_totalprice.into_inner(),
                        day(o.o_orderdate),
                        o.o_orderkey,
                        c.c_name.to_string(),
                        c.c_custkey,
                        qty[&o.o_orderkey],
                    )
                })
                .collect();
            rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            rows.truncate(100);
            rows.into_iter()
                .map(|(tp, od, ok, name, ck, q)| {
                    vec![
                        Value::Text(name),
                        Value::Int(ck),
                        Value::Int(ok),
                        Value::Date(od),
                        Value::Dec(tp as i128, 2),
                        Value::Dec(q as i128 * 100, 2),
                    ]
                })
                .collect()
        }
    }
}

/// Equal rows; averages (the only floats) within 1e-12 relative.
fn assert_same(q: Query, got: &Answer, want: &[Vec<Value>], what: &str) {
    assert_eq!(got.rows.len(), want.len(), "{q} {what}: row count");
    for (i, (g, w)) in got.rows.iter().zip(want).enumerate() {
        assert_eq!(g.len(), got.columns.len(), "{q} {what} row {i}: width");
        for (a, b) in g.iter().zip(w) {
            let ok = match (a, b) {
                (Value::Float(x), Value::Float(y)) => (x - y).abs() <= 1e-12 * x.abs().max(1.0),
                _ => a == b,
            };
            assert!(ok, "{q} {what} row {i}: {g:?} vs reference {w:?}");
        }
    }
}

fn execs() -> Vec<Exec> {
    let t = flat_topology();
    vec![
        Exec::new(&t, Sched::Las, Strategy::sparse(), None).unwrap(),
        Exec::new(&t, Sched::Las, Strategy::os(), Some(1))
            .unwrap()
            .with_locality(Locality::Strict),
        Exec::new(&t, Sched::Nls, Strategy::compact(), None).unwrap(),
    ]
}

#[test]
fn five_queries_equal_the_row_by_row_reference() {
    let want: Vec<_> = Query::ALL.iter().map(|&q| (q, reference(q))).collect();
    // The reference must be non-trivial for the comparison to mean something.
    for (q, rows) in &want {
        assert!(!rows.is_empty(), "{q}: reference has no rows");
    }
    assert_eq!(want[0].1.len(), 4, "Q1 has four (flag, status) groups");
    assert_eq!(want[1].1.len(), 10, "Q3 keeps ten");
    for ex in execs() {
        // Small morsels (many orders/lineitem pairs) and the default size (one pair).
        for (morsel, policy) in [
            (1000, MemPolicy::FirstTouch),
            (tpch::MORSEL_ORDERS, "per-node".parse().unwrap()),
        ] {
            let data = Data::generate(&ex, SF, morsel, &policy).unwrap();
            assert_eq!(
                data.lineitem_rows(),
                LineItemGenerator::new(SF, 1, 1).iter().count()
            );
            for (q, rows) in &want {
                let got = tpch::run(&ex, &data, *q);
                let what = format!("{} workers, {morsel} orders per morsel", ex.workers());
                assert_same(*q, &got, rows, &what);
            }
        }
    }
}

#[test]
fn answers_print_like_the_reference_answers() {
    let ex = Exec::new(&flat_topology(), Sched::Las, Strategy::sparse(), None).unwrap();
    let data = Data::generate(&ex, SF, 4096, &MemPolicy::FirstTouch).unwrap();
    let q18 = tpch::run(&ex, &data, Query::Q18);
    let first = &q18.rows[0];
    assert!(first[0].to_string().starts_with("Customer#"), "{first:?}");
    assert_eq!(first[3].to_string().len(), 10, "ISO date: {first:?}");
    let q1 = tpch::run(&ex, &data, Query::Q1);
    assert_eq!(q1.rows[0][0].to_string(), "A");
    assert_eq!(q1.rows[0][1].to_string(), "F");
    assert!(
        q1.rows[0][2].to_string().ends_with(".00"),
        "{:?}",
        q1.rows[0]
    );
}

#[test]
fn bad_input_is_named_with_the_valid_choices() {
    for q in [0, 2, 4, 22, 23] {
        let e = Query::from_number(q).unwrap_err().to_string();
        assert!(
            e.contains(&format!("'{q}'")) && e.contains("1, 3, 5, 6, 18"),
            "{e}"
        );
    }
    let e = "q7".parse::<Query>().unwrap_err().to_string();
    assert!(e.contains("q7") && e.contains("1, 3, 5, 6, 18"), "{e}");
    let ex = Exec::new(&flat_topology(), Sched::Las, Strategy::os(), Some(1)).unwrap();
    for sf in [0.0, -1.0, f64::NAN, f64::INFINITY, 1000.0] {
        let e = Data::generate(&ex, sf, 1000, &MemPolicy::FirstTouch)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("scale factor") && e.contains("0.001 to 100"),
            "{e}"
        );
    }
    let e = Data::generate(&ex, SF, 0, &MemPolicy::FirstTouch)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("orders per morsel"), "{e}");
}

/// The venv of `bench/peers/setup --tpch`, when it is there: its python (with duckdb) and
/// tpchgen-cli.
fn peers() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let bin = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/peers/.venv/bin");
    let (py, gen) = (bin.join("python"), bin.join("tpchgen-cli"));
    let has_duckdb = std::process::Command::new(&py)
        .args(["-c", "import duckdb"])
        .status()
        .is_ok_and(|s| s.success());
    (has_duckdb && gen.is_file()).then_some((py, gen))
}

/// DuckDB's answers to the five query files of `bench/tpch/queries` at SF 0.01, from the
/// Parquet tables tpchgen-cli writes: `(query, rows of cells as text)`.
fn duckdb_answers(py: &std::path::Path, gen: &std::path::Path) -> Vec<(u32, Vec<Vec<String>>)> {
    let dir = std::env::temp_dir().join(format!("loci-engine-tpch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let st = std::process::Command::new(gen)
        .args([
            "parquet",
            "--quiet",
            "--scale-factor",
            "0.01",
            "--output-dir",
        ])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "tpchgen-cli failed");
    let queries = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/tpch/queries");
    let script = r#"
import datetime, decimal, os, sys, duckdb
data, qdir = sys.argv[1], sys.argv[2]
con = duckdb.connect()
for t in ["region", "nation", "supplier", "customer", "orders", "lineitem"]:
    con.execute(f"create table {t} as select * from read_parquet('{os.path.join(data, t + '.parquet')}')")
def cell(v):
    if isinstance(v, (decimal.Decimal, float)):
        return repr(float(v))
    if isinstance(v, datetime.date):
        return v.isoformat()
    return str(v)
for q in [1, 3, 5, 6, 18]:
    with open(os.path.join(qdir, f"q{q:02}.sql")) as f:
        rows = con.execute(f.read()).fetchall()
    for r in rows:
        print("\t".join([str(q)] + [cell(v) for v in r]))
"#;
    let out = std::process::Command::new(py)
        .args(["-c", script])
        .arg(&dir)
        .arg(&queries)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut by_query: BTreeMap<u32, Vec<Vec<String>>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let mut cells = line.split('\t').map(str::to_string);
        let q: u32 = cells.next().unwrap().parse().unwrap();
        by_query.entry(q).or_default().push(cells.collect());
    }
    by_query.into_iter().collect()
}

#[test]
fn five_queries_equal_duckdbs_answers_when_the_peers_venv_is_there() {
    let Some((py, gen)) = peers() else {
        eprintln!(
            "NOTE: skipped: bench/peers/.venv with duckdb and tpchgen-cli is absent (bench/peers/setup --tpch)"
        );
        return;
    };
    let want = duckdb_answers(&py, &gen);
    assert_eq!(want.len(), 5, "DuckDB answered every query: {want:?}");
    let ex = Exec::new(&flat_topology(), Sched::Las, Strategy::sparse(), None).unwrap();
    let data = Data::generate(&ex, SF, 2048, &MemPolicy::FirstTouch).unwrap();
    for (q, rows) in want {
        let got = tpch::run(&ex, &data, Query::from_number(q).unwrap());
        assert_eq!(got.rows.len(), rows.len(), "q{q}: rows");
        for (i, (g, w)) in got.rows.iter().zip(&rows).enumerate() {
            assert_eq!(g.len(), w.len(), "q{q} row {i}");
            for (a, b) in g.iter().zip(w) {
                let same = match (a, b.parse::<f64>()) {
                    (Value::Text(_) | Value::Date(_), _) => a.to_string() == *b,
                    (_, Ok(y)) => {
                        let x = a.as_f64().unwrap();
                        (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
                    }
                    (_, Err(_)) => false,
                };
                assert!(same, "q{q} row {i}: {g:?} vs DuckDB {w:?}");
            }
        }
    }
}
