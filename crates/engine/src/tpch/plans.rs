//! The five plans (see the module docs of [`crate::tpch`]).

use std::cmp::Ordering;

use hashbrown::{HashMap, HashSet};

use super::data::{c, fixed, l, o, s, unfixed, Block, Data, SEGMENT_LEN};
use super::{days_from_civil, Answer, Value};
use crate::Exec;

/// The join table of one orders/lineitem morsel pair: a slot per order key of the morsel's key
/// range (`key - base`), set to `empty`; every line item's order key falls in that range
/// (checked when the data was generated), so probing is an index, in ascending order.
fn key_table<V: Copy>(buf: &mut Vec<V>, okeys: &[u32], empty: V) -> u32 {
    let base = okeys[0];
    let span = (okeys[okeys.len() - 1] - base) as usize + 1;
    buf.clear();
    buf.resize(span, empty);
    base
}

/// A lineitem block's order keys, extended prices and discounts, the last two cut to the keys'
/// length (inlined, so a probe loop over `0..keys.len()` indexes them without bounds checks).
#[inline(always)]
fn priced_lines(lb: &Block) -> (&[u32], &[i64], &[u8]) {
    let lk = lb.col::<u32>(l::ORDERKEY);
    let n = lk.len();
    let price = &lb.col::<i64>(l::EXTENDEDPRICE)[..n];
    (lk, price, &lb.col::<u8>(l::DISCOUNT)[..n])
}

/// Runs `scan(state, block)` over every block of `blocks` on its home node; returns the
/// workers' states.
fn scan<S: Send>(
    exec: &Exec,
    blocks: &[Block],
    init: impl Fn() -> S + Sync,
    body: impl Fn(&mut S, &Block) + Sync,
) -> Vec<S> {
    let homes: Vec<Option<u32>> = blocks.iter().map(|b| b.home).collect();
    exec.for_each(&homes, init, |st, i| body(st, &blocks[i]))
        .states
}

/// Runs `body(state, orders, lineitem)` over every orders/lineitem morsel pair on its home node.
fn scan_pairs<S: Send>(
    exec: &Exec,
    data: &Data,
    init: impl Fn() -> S + Sync,
    body: impl Fn(&mut S, &Block, &Block) + Sync,
) -> Vec<S> {
    exec.for_each(&data.pair_homes(), init, |st, i| {
        body(st, &data.orders[i], &data.lineitem[i])
    })
    .states
}

/// A key-indexed array over the dense keys `0..=max` (the build side of a join whose keys are
/// dense): `fill` from `(key, value)` pairs collected by a parallel scan of `blocks`.
fn build_dense<V: Copy + Send>(
    exec: &Exec,
    blocks: &[Block],
    max: u32,
    empty: V,
    pick: impl Fn(&Block, &mut Vec<(u32, V)>) + Sync,
) -> Vec<V> {
    let parts = scan(exec, blocks, Vec::new, |v, b| pick(b, v));
    let mut out = vec![empty; max as usize + 1];
    for p in parts {
        for (k, v) in p {
            out[k as usize] = v;
        }
    }
    out
}

/// Keeps the best `k` rows by `cmp` (a worker's top-k; merged with [`TopK::merge`]).
struct TopK<T> {
    k: usize,
    rows: Vec<T>,
}

impl<T> TopK<T> {
    fn new(k: usize) -> Self {
        TopK {
            k,
            rows: Vec::new(),
        }
    }

    fn push(&mut self, t: T, cmp: impl Fn(&T, &T) -> Ordering) {
        self.rows.push(t);
        if self.rows.len() >= 4 * self.k.max(16) {
            self.rows.sort_unstable_by(&cmp);
            self.rows.truncate(self.k);
        }
    }

    fn merge(parts: Vec<TopK<T>>, k: usize, cmp: impl Fn(&T, &T) -> Ordering) -> Vec<T> {
        let mut all: Vec<T> = parts.into_iter().flat_map(|p| p.rows).collect();
        all.sort_unstable_by(cmp);
        all.truncate(k);
        all
    }
}

/// Q1's per-group sums.
#[derive(Clone, Copy, Default)]
struct Q1Acc {
    qty: i64,
    base: i64,
    disc_price: i128,
    charge: i128,
    disc: i64,
    count: i64,
}

/// A worker's Q1 state: slot of each two-letter key (0: none yet, else index + 1).
struct Q1State {
    slot: Vec<u32>,
    keys: Vec<(u8, u8)>,
    acc: Vec<Q1Acc>,
}

pub(super) fn q1(exec: &Exec, data: &Data) -> Answer {
    let cut = days_from_civil(1998, 9, 2);
    let states = scan(
        exec,
        &data.lineitem,
        || Q1State {
            slot: vec![0; 1 << 16],
            keys: Vec::new(),
            acc: Vec::new(),
        },
        |st, b| {
            let ship = b.col::<i32>(l::SHIPDATE);
            let rf = b.col::<u8>(l::RETURNFLAG);
            let ls = b.col::<u8>(l::LINESTATUS);
            let qty = b.col::<u16>(l::QUANTITY);
            let price = b.col::<i64>(l::EXTENDEDPRICE);
            let disc = b.col::<u8>(l::DISCOUNT);
            let tax = b.col::<u8>(l::TAX);
            for r in 0..b.rows() {
                if ship[r] > cut {
                    continue;
                }
                let key = ((rf[r] as usize) << 8) | ls[r] as usize;
                let mut sl = st.slot[key] as usize;
                if sl == 0 {
                    st.keys.push((rf[r], ls[r]));
                    st.acc.push(Q1Acc::default());
                    sl = st.acc.len();
                    // At most 65536 two-byte keys, so slot numbers (index + 1) fit a u32.
                    st.slot[key] = sl as u32;
                }
                let a = &mut st.acc[sl - 1];
                let p = price[r];
                let d = disc[r] as i64;
                let dp = p * (100 - d);
                a.qty += qty[r] as i64;
                a.base += p;
                a.disc_price += dp as i128;
                a.charge += (dp * (100 + tax[r] as i64)) as i128;
                a.disc += d;
                a.count += 1;
            }
        },
    );
    let mut groups: Vec<((u8, u8), Q1Acc)> = Vec::new();
    for st in states {
        for (k, a) in st.keys.into_iter().zip(st.acc) {
            match groups.iter_mut().find(|g| g.0 == k) {
                Some((_, g)) => {
                    g.qty += a.qty;
                    g.base += a.base;
                    g.disc_price += a.disc_price;
                    g.charge += a.charge;
                    g.disc += a.disc;
                    g.count += a.count;
                }
                None => groups.push((k, a)),
            }
        }
    }
    groups.sort_by_key(|g| g.0);
    let letter = |b: u8| Value::Text((b as char).to_string());
    Answer {
        columns: vec![
            "l_returnflag",
            "l_linestatus",
            "sum_qty",
            "sum_base_price",
            "sum_disc_price",
            "sum_charge",
            "avg_qty",
            "avg_price",
            "avg_disc",
            "count_order",
        ],
        rows: groups
            .into_iter()
            .map(|((f, s), a)| {
                let n = a.count as f64;
                vec![
                    letter(f),
                    letter(s),
                    Value::Dec(a.qty as i128, 2),
                    Value::Dec(a.base as i128, 2),
                    Value::Dec(a.disc_price, 4),
                    Value::Dec(a.charge, 6),
                    Value::Float(a.qty as f64 / 100.0 / n),
                    Value::Float(a.base as f64 / 100.0 / n),
                    Value::Float(a.disc as f64 / 100.0 / n),
                    Value::Int(a.count),
                ]
            })
            .collect(),
    }
}

/// Q6's scan of one morsel: `sum(price * discount)` over the rows that pass, as the sums of
/// `price` per discount value 5, 6 and 7 (the only ones the predicate keeps), so the loop is
/// masked adds the compiler vectorizes.
#[inline(always)]
fn q6_kernel(ship: &[i32], qty: &[u16], price: &[i64], disc: &[u8], lo: i32, span: u32) -> i64 {
    let n = ship.len();
    let (qty, price, disc) = (&qty[..n], &price[..n], &disc[..n]);
    let mut acc = [0i64; 3];
    for r in 0..n {
        let d = disc[r];
        let keep = ((ship[r].wrapping_sub(lo) as u32) < span) & (qty[r] < 2400);
        for (k, a) in acc.iter_mut().enumerate() {
            let m = keep & (d == 5 + k as u8);
            *a += price[r] & -(m as i64);
        }
    }
    5 * acc[0] + 6 * acc[1] + 7 * acc[2]
}

/// [`q6_kernel`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q6_kernel_avx2(
    ship: &[i32],
    qty: &[u16],
    price: &[i64],
    disc: &[u8],
    lo: i32,
    span: u32,
) -> i64 {
    q6_kernel(ship, qty, price, disc, lo, span)
}

pub(super) fn q6(exec: &Exec, data: &Data) -> Answer {
    let lo = days_from_civil(1994, 1, 1);
    let span = (days_from_civil(1995, 1, 1) - lo) as u32;
    let sums = scan(
        exec,
        &data.lineitem,
        || 0i64,
        |sum, b| {
            let ship = b.col::<i32>(l::SHIPDATE);
            let qty = b.col::<u16>(l::QUANTITY);
            let price = b.col::<i64>(l::EXTENDEDPRICE);
            let disc = b.col::<u8>(l::DISCOUNT);
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the cpu has AVX2 (checked just above).
                *sum += unsafe { q6_kernel_avx2(ship, qty, price, disc, lo, span) };
                return;
            }
            *sum += q6_kernel(ship, qty, price, disc, lo, span);
        },
    );
    Answer {
        columns: vec!["revenue"],
        rows: vec![vec![Value::Dec(sums.into_iter().sum::<i64>() as i128, 4)]],
    }
}

/// Q3's row: (revenue, o_orderdate, l_orderkey, o_shippriority).
type Q3Row = (i64, i32, u32, i32);

fn q3_order(a: &Q3Row, b: &Q3Row) -> Ordering {
    b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
}

pub(super) fn q3(exec: &Exec, data: &Data) -> Answer {
    let day = days_from_civil(1995, 3, 15);
    let seg = fixed::<SEGMENT_LEN>("BUILDING").expect("fits char(10)");
    let building = build_dense(exec, &data.customer, data.max_custkey, false, |b, v| {
        let keys = b.col::<u32>(c::CUSTKEY);
        let segs = b.col::<[u8; SEGMENT_LEN]>(c::MKTSEGMENT);
        v.extend(
            (0..b.rows())
                .filter(|&r| segs[r] == seg)
                .map(|r| (keys[r], true)),
        );
    });
    // Per morsel pair: build the join table on the qualifying orders (slot: order index + 1,
    // 0 none), probe it with every line item (branch-free: a line of no qualifying order, or
    // shipped too early, adds 0 to slot 0), then keep the orders with revenue. Revenue is
    // positive exactly when a line joined (prices are positive, discounts at most 10%).
    let tops = scan_pairs(
        exec,
        data,
        || (TopK::<Q3Row>::new(10), Vec::new(), Vec::new(), Vec::new()),
        |(top, slots, rev, picked), ob, lb| {
            let (ok, ck) = (ob.col::<u32>(o::ORDERKEY), ob.col::<u32>(o::CUSTKEY));
            if ok.is_empty() {
                return;
            }
            let od = ob.col::<i32>(o::ORDERDATE);
            let sp = ob.col::<i32>(o::SHIPPRIORITY);
            let base = key_table(slots, ok, 0u32);
            picked.clear();
            for i in 0..ok.len() {
                if od[i] < day && building[ck[i] as usize] {
                    slots[(ok[i] - base) as usize] = i as u32 + 1;
                    picked.push(i);
                }
            }
            rev.clear();
            rev.resize(ok.len() + 1, 0i64);
            let (lk, price, disc) = priced_lines(lb);
            let n = lk.len();
            let ship = &lb.col::<i32>(l::SHIPDATE)[..n];
            for x in 0..n {
                let slot = slots[(lk[x] - base) as usize] as usize;
                let m = -((ship[x] > day) as i64);
                rev[slot] += (price[x] * (100 - disc[x] as i64)) & m;
            }
            for &i in picked.iter() {
                if rev[i + 1] > 0 {
                    top.push((rev[i + 1], od[i], ok[i], sp[i]), q3_order);
                }
            }
        },
    );
    let tops: Vec<TopK<Q3Row>> = tops.into_iter().map(|t| t.0).collect();
    Answer {
        columns: vec!["l_orderkey", "revenue", "o_orderdate", "o_shippriority"],
        rows: TopK::merge(tops, 10, q3_order)
            .into_iter()
            .map(|(rev, od, ok, sp)| {
                vec![
                    Value::Int(ok as i64),
                    Value::Dec(rev as i128, 4),
                    Value::Date(od),
                    Value::Int(sp as i64),
                ]
            })
            .collect(),
    }
}

/// No nation (outside the region).
const NO_NATION: u8 = u8::MAX;

pub(super) fn q5(exec: &Exec, data: &Data) -> Answer {
    let lo = days_from_civil(1994, 1, 1);
    let hi = days_from_civil(1995, 1, 1);
    let columns = vec!["n_name", "revenue"];
    let Some(&(region, _)) = data.region.iter().find(|r| r.1 == "ASIA") else {
        return Answer {
            columns,
            rows: Vec::new(),
        };
    };
    let mut in_region = [false; 256];
    for n in data.nation.iter().filter(|n| n.region == region) {
        in_region[n.key as usize] = true;
    }
    // Key-indexed nation of the region's customers or suppliers (NO_NATION for the others).
    let region_nation = |blocks: &[Block], max_key: u32, key_col: usize, nat_col: usize| {
        build_dense(exec, blocks, max_key, NO_NATION, |b, v| {
            let keys = b.col::<u32>(key_col);
            let nats = b.col::<u8>(nat_col);
            v.extend(
                (0..b.rows())
                    .filter(|&r| in_region[nats[r] as usize])
                    .map(|r| (keys[r], nats[r])),
            );
        })
    };
    let cust = region_nation(&data.customer, data.max_custkey, c::CUSTKEY, c::NATIONKEY);
    let supp = region_nation(&data.supplier, data.max_suppkey, s::SUPPKEY, s::NATIONKEY);
    // Per morsel pair: join table on the 1994 orders of the region's customers (slot: the
    // customer's nation, NO_NATION none), probed by every line item; a line counts when its
    // supplier's nation is that nation (branch-free: others add 0 to the NO_NATION slot).
    let states = scan_pairs(
        exec,
        data,
        || (vec![0i64; 256], vec![0u64; 256], Vec::new()),
        |(rev, hits, slots), ob, lb| {
            let (ok, ck) = (ob.col::<u32>(o::ORDERKEY), ob.col::<u32>(o::CUSTKEY));
            if ok.is_empty() {
                return;
            }
            let od = ob.col::<i32>(o::ORDERDATE);
            let base = key_table(slots, ok, NO_NATION);
            for i in 0..ok.len() {
                if od[i] >= lo && od[i] < hi {
                    slots[(ok[i] - base) as usize] = cust[ck[i] as usize];
                }
            }
            let (lk, price, disc) = priced_lines(lb);
            let n = lk.len();
            let sk = &lb.col::<u32>(l::SUPPKEY)[..n];
            for x in 0..n {
                let nat = slots[(lk[x] - base) as usize];
                let keep = (nat != NO_NATION) & (supp[sk[x] as usize] == nat);
                rev[nat as usize] += (price[x] * (100 - disc[x] as i64)) & -(keep as i64);
                hits[nat as usize] += keep as u64;
            }
        },
    );
    let mut rev = [0i64; 256];
    let mut seen = [false; 256];
    for (r, h, _) in states {
        for n in 0..256 {
            rev[n] += r[n];
            seen[n] |= h[n] > 0;
        }
    }
    let mut rows: Vec<(String, i64)> = data
        .nation
        .iter()
        .filter(|n| seen[n.key as usize])
        .map(|n| (n.name.clone(), rev[n.key as usize]))
        .collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Answer {
        columns,
        rows: rows
            .into_iter()
            .map(|(n, r)| vec![Value::Text(n), Value::Dec(r as i128, 4)])
            .collect(),
    }
}

/// Q18's candidate: (o_totalprice, o_orderdate, o_orderkey, o_custkey, sum of l_quantity).
type Q18Row = (i64, i32, u32, u32, i64);

fn q18_order(a: &Q18Row, b: &Q18Row) -> Ordering {
    b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
}

pub(super) fn q18(exec: &Exec, data: &Data) -> Answer {
    // sum(l_quantity) > 300, at scale 100.
    let over = 300 * 100;
    // Per morsel pair: the subquery's aggregation (sum of l_quantity per order key, in a slot
    // per key of the morsel's range: every line of an order is in its pair), then the orders
    // over the limit.
    let tops = scan_pairs(
        exec,
        data,
        || (TopK::<Q18Row>::new(100), Vec::new()),
        |(top, sums), ob, lb| {
            let ok = ob.col::<u32>(o::ORDERKEY);
            if ok.is_empty() {
                return;
            }
            let base = key_table(sums, ok, 0u32);
            let lk = lb.col::<u32>(l::ORDERKEY);
            let qty = &lb.col::<u16>(l::QUANTITY)[..lk.len()];
            for (k, &q) in lk.iter().zip(qty) {
                sums[(k - base) as usize] += q as u32;
            }
            let ck = ob.col::<u32>(o::CUSTKEY);
            let od = ob.col::<i32>(o::ORDERDATE);
            let tp = ob.col::<i64>(o::TOTALPRICE);
            for i in 0..ok.len() {
                let sum = sums[(ok[i] - base) as usize] as i64;
                if sum > over {
                    top.push((tp[i], od[i], ok[i], ck[i], sum), q18_order);
                }
            }
        },
    );
    let tops: Vec<TopK<Q18Row>> = tops.into_iter().map(|t| t.0).collect();
    let best = TopK::merge(tops, 100, q18_order);
    // Hash join: build on the few customers of the chosen orders, probe with a scan of customer.
    let want: HashSet<u32> = best.iter().map(|r| r.3).collect();
    let found = scan(exec, &data.customer, Vec::new, |v, b| {
        let keys = b.col::<u32>(c::CUSTKEY);
        let names = b.col::<[u8; super::data::NAME_LEN]>(c::NAME);
        for r in 0..b.rows() {
            if want.contains(&keys[r]) {
                v.push((keys[r], unfixed(&names[r])));
            }
        }
    });
    let names: HashMap<u32, String> = found.into_iter().flatten().collect();
    Answer {
        columns: vec![
            "c_name",
            "c_custkey",
            "o_orderkey",
            "o_orderdate",
            "o_totalprice",
            "sum_qty",
        ],
        rows: best
            .into_iter()
            .filter_map(|(tp, od, ok, ck, q)| {
                // Inner join: an order whose customer is missing has no row.
                let name = names.get(&ck)?.clone();
                Some(vec![
                    Value::Text(name),
                    Value::Int(ck as i64),
                    Value::Int(ok as i64),
                    Value::Date(od),
                    Value::Dec(tp as i128, 2),
                    Value::Dec(q as i128, 2),
                ])
            })
            .collect(),
    }
}
