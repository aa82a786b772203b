//! The TPC-H tables the five queries read, generated in process by the `tpchgen` crate (dbgen's
//! data, row for row) straight into node-homed columnar morsels.
//!
//! A morsel is a [`Block`]: its columns side by side in one mapping placed by loci-place's
//! memory plan before the first touch, with a home node. Column types: keys `u32`, dates `i32`
//! days since 1970-01-01, decimals integers scaled by 100 (money `i64`; quantity `u16`, discount
//! and tax `u8`, the narrowest integer their TPC-H domain fits), one-letter flags a byte, other
//! strings fixed-width byte arrays padded with NULs.
//!
//! `orders` and `lineitem` are generated part by part with the same part numbers, so lineitem
//! morsel `i` holds exactly the line items of orders morsel `i`, both ascending by order key
//! (checked while generating): the plans join them morsel pair by morsel pair, with a join
//! table over the pair's order-key range.
//! `nation` and `region` (25 and 5 rows) are plain vectors every worker reads.

use std::sync::Mutex;

use loci_place::region::NodeRegion;
use loci_place::MemPlan;
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, RegionGenerator,
    SupplierGenerator,
};

use crate::{storage, EngineError, Exec, MemPolicy, Trace};

/// Plain column element types: no padding, every bit pattern valid.
///
/// # Safety
/// Implementors must be plain integers or arrays of them.
pub unsafe trait Plain: Copy + Send + Sync + 'static {}
// SAFETY: plain integers.
unsafe impl Plain for u8 {}
// SAFETY: plain integers.
unsafe impl Plain for u16 {}
// SAFETY: plain integers.
unsafe impl Plain for u32 {}
// SAFETY: plain integers.
unsafe impl Plain for i32 {}
// SAFETY: plain integers.
unsafe impl Plain for i64 {}
// SAFETY: an array of bytes.
unsafe impl<const N: usize> Plain for [u8; N] {}

/// One column being built: its bytes and element size.
pub(crate) struct ColBuf {
    bytes: Vec<u8>,
    elem: usize,
}

impl ColBuf {
    pub(crate) fn of<T: Plain>(v: &[T]) -> ColBuf {
        let elem = std::mem::size_of::<T>();
        // SAFETY: `T` is plain (no padding), so its `len * elem` bytes are initialized.
        let bytes = unsafe {
            std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v))
        };
        ColBuf {
            bytes: bytes.to_vec(),
            elem,
        }
    }
}

/// A morsel of a columnar table: `rows` rows of every column in one placed mapping.
pub struct Block {
    region: NodeRegion,
    rows: usize,
    /// (byte offset, element size) of each column.
    cols: Vec<(usize, usize)>,
    /// The node the block is meant to live on (first touch: the node of the worker that wrote
    /// it; None: interleaved or unknown).
    pub home: Option<u32>,
}

impl Block {
    /// Copies `cols` (all of `rows` elements) into a new mapping placed by `plan`: the copy is
    /// the first touch, by the calling worker.
    pub(crate) fn build(
        plan: &MemPlan,
        rows: usize,
        cols: &[ColBuf],
        home: Option<u32>,
    ) -> Result<Block, EngineError> {
        let mut offs = Vec::with_capacity(cols.len());
        let mut len = 0usize;
        for c in cols {
            assert_eq!(c.bytes.len(), rows * c.elem, "column of {rows} rows");
            offs.push((len, c.elem));
            len = (len + c.bytes.len()).next_multiple_of(64);
        }
        let region = storage::map_region(len.max(64), plan)?;
        for (c, &(off, _)) in cols.iter().zip(&offs) {
            // SAFETY: `off + len` lies inside the fresh mapping (sized above); nobody else
            // holds it; the source is a separate allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    c.bytes.as_ptr(),
                    region.as_ptr().add(off),
                    c.bytes.len(),
                )
            };
        }
        Ok(Block {
            region,
            rows,
            cols: offs,
            home,
        })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Column `c` as `T`; panics when `T` is not the column's element size (a plan bug).
    #[inline]
    pub fn col<T: Plain>(&self, c: usize) -> &[T] {
        let (off, elem) = self.cols[c];
        assert_eq!(
            elem,
            std::mem::size_of::<T>(),
            "column {c} read as wrong type"
        );
        // SAFETY: the column's `rows` elements of `elem == size_of::<T>()` bytes were written at
        // `off` (64-byte aligned, so aligned for every Plain type); the mapping lives as long as
        // `self` and is not written after `build`.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr().add(off) as *const T, self.rows) }
    }
}

/// `Block::build(plan, rows, &[ColBuf::of(&a), ...], home)` over column vectors of one length,
/// laid out in the order listed; the rows are the first column's length.
macro_rules! block_of {
    ($plan:expr, $home:expr; $first:ident $(, $col:ident)* $(,)?) => {
        Block::build(
            $plan,
            $first.len(),
            &[ColBuf::of(&$first) $(, ColBuf::of(&$col))*],
            $home,
        )
    };
}

/// Declares a table's column indexes as `pub const NAME: usize`, numbered from 0 in the order
/// listed (the order `build` lays the columns out in).
macro_rules! columns {
    ($($(#[$doc:meta])* $name:ident),+ $(,)?) => {
        columns!(@at 0usize; $($(#[$doc])* $name),+);
    };
    (@at $i:expr; $(#[$doc:meta])* $name:ident $(, $($rest:tt)*)?) => {
        $(#[$doc])*
        pub const $name: usize = $i;
        $(columns!(@at $i + 1; $($rest)*);)?
    };
    (@at $i:expr;) => {};
}

/// Columns of `lineitem`.
pub mod l {
    columns! {
        ORDERKEY,
        SUPPKEY,
        /// u16, scaled by 100.
        QUANTITY,
        /// i64 cents.
        EXTENDEDPRICE,
        /// u8, scaled by 100.
        DISCOUNT,
        /// u8, scaled by 100.
        TAX,
        /// u8 letter.
        RETURNFLAG,
        /// u8 letter.
        LINESTATUS,
        /// i32 days.
        SHIPDATE,
    }
}

/// Columns of `orders`.
pub mod o {
    columns! {
        ORDERKEY,
        CUSTKEY,
        /// i64 cents.
        TOTALPRICE,
        /// i32 days.
        ORDERDATE,
        /// i32.
        SHIPPRIORITY,
    }
}

/// Columns of `customer`.
pub mod c {
    columns! {
        CUSTKEY,
        /// u8.
        NATIONKEY,
        /// [u8; 10] (`char(10)`).
        MKTSEGMENT,
        /// [u8; 25] (`varchar(25)`).
        NAME,
    }
}

/// Columns of `supplier`.
pub mod s {
    columns! {
        SUPPKEY,
        /// u8.
        NATIONKEY,
    }
}

/// Width of `c_mktsegment` (`char(10)`).
pub const SEGMENT_LEN: usize = 10;
/// Width of `c_name` (`varchar(25)`).
pub const NAME_LEN: usize = 25;

/// A string in a fixed-width field, NUL padded; None when it does not fit.
pub fn fixed<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    (b.len() <= N).then(|| {
        let mut a = [0u8; N];
        a[..b.len()].copy_from_slice(b);
        a
    })
}

/// The text of a fixed-width field (up to the first NUL).
pub fn unfixed(a: &[u8]) -> String {
    let n = a.iter().position(|&b| b == 0).unwrap_or(a.len());
    String::from_utf8_lossy(&a[..n]).into_owned()
}

/// A row of `nation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nation {
    pub key: u8,
    pub name: String,
    pub region: u8,
}

/// The generated tables of one scale factor.
pub struct Data {
    pub sf: f64,
    pub lineitem: Vec<Block>,
    pub orders: Vec<Block>,
    pub customer: Vec<Block>,
    pub supplier: Vec<Block>,
    pub nation: Vec<Nation>,
    /// (r_regionkey, r_name).
    pub region: Vec<(u8, String)>,
    /// Largest c_custkey and s_suppkey (sizes of the plans' key-indexed tables).
    pub max_custkey: u32,
    pub max_suppkey: u32,
}

/// Orders per morsel (about four times as many line items).
pub const MORSEL_ORDERS: usize = 1 << 15;
/// Customers or suppliers per morsel.
pub const MORSEL_DIM_ROWS: usize = 1 << 16;

/// Checks a scale factor: a finite number in 0.001..=100 (keys stay within `u32`).
pub fn check_sf(sf: f64) -> Result<f64, EngineError> {
    if sf.is_finite() && (0.001..=100.0).contains(&sf) {
        Ok(sf)
    } else {
        Err(EngineError::Invalid(format!(
            "TPC-H scale factor {sf}: valid: a number from 0.001 to 100"
        )))
    }
}

fn gen_err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> EngineError + '_ {
    move |e| EngineError::Invalid(format!("generating {what}: {e}"))
}

/// The date as days since 1970-01-01.
fn days(d: tpchgen::dates::TPCHDate) -> i32 {
    d.to_unix_epoch()
}

impl Data {
    /// Generates the tables at scale factor `sf`, `morsel_orders` orders per morsel (and their
    /// line items), each morsel by a task on its home node's workers, placed by `policy`.
    pub fn generate(
        exec: &Exec,
        sf: f64,
        morsel_orders: usize,
        policy: &MemPolicy,
    ) -> Result<Data, EngineError> {
        let sf = check_sf(sf)?;
        if morsel_orders == 0 {
            return Err(EngineError::Invalid(
                "orders per morsel must be at least one".into(),
            ));
        }
        let plan = storage::resolve(exec.topology(), policy)?;
        let n_orders = (OrderGenerator::SCALE_BASE as f64 * sf) as usize;
        let n_cust = CustomerGenerator::calculate_row_count(sf, 1, 1) as usize;
        let n_supp = SupplierGenerator::calculate_row_count(sf, 1, 1) as usize;
        let parts = n_orders.div_ceil(morsel_orders).max(1);
        let pairs = build_parts(exec, &plan, sf, parts, gen_orders_lineitem)?;
        let (orders, lineitem) = pairs.into_iter().unzip();
        let cparts = n_cust.div_ceil(MORSEL_DIM_ROWS).max(1);
        let customer = build_parts(exec, &plan, sf, cparts, gen_customer)?;
        let sparts = n_supp.div_ceil(MORSEL_DIM_ROWS).max(1);
        let supplier = build_parts(exec, &plan, sf, sparts, gen_supplier)?;
        let nation = NationGenerator::new(sf, 1, 1)
            .iter()
            .map(|n| Nation {
                key: n.n_nationkey as u8,
                name: n.n_name.to_string(),
                region: n.n_regionkey as u8,
            })
            .collect();
        let region = RegionGenerator::new(sf, 1, 1)
            .iter()
            .map(|r| (r.r_regionkey as u8, r.r_name.to_string()))
            .collect();
        let max_of = |bs: &Vec<Block>, col: usize| {
            bs.iter()
                .flat_map(|b| b.col::<u32>(col).iter().copied())
                .max()
                .unwrap_or(0)
        };
        Ok(Data {
            sf,
            max_custkey: max_of(&customer, c::CUSTKEY),
            max_suppkey: max_of(&supplier, s::SUPPKEY),
            lineitem,
            orders,
            customer,
            supplier,
            nation,
            region,
        })
    }

    /// Rows of `lineitem`.
    pub fn lineitem_rows(&self) -> usize {
        self.lineitem.iter().map(Block::rows).sum()
    }

    /// Home nodes of the orders/lineitem morsel pairs.
    pub(crate) fn pair_homes(&self) -> Vec<Option<u32>> {
        self.lineitem.iter().map(|b| b.home).collect()
    }
}

/// Which slice of a table a generator makes: part `p` of `parts` (1-based, tpchgen's numbering)
/// at scale factor `sf`.
#[derive(Clone, Copy)]
struct Part {
    sf: f64,
    p: i32,
    parts: i32,
}

/// Runs `make(part, home, plan)` for parts `1..=parts` at scale factor `sf`, each a task on its
/// home node: the morsel's part of `plan` (`per-node`: contiguous shares per node); for first
/// touch the parts are dealt to the nodes with workers in contiguous shares and each morsel's
/// home is the node of the worker that wrote it.
fn build_parts<T: Send + Homed, F>(
    exec: &Exec,
    plan: &MemPlan,
    sf: f64,
    parts: usize,
    make: F,
) -> Result<Vec<T>, EngineError>
where
    F: Fn(Part, Option<u32>, &MemPlan) -> Result<T, EngineError> + Sync,
{
    let wn = exec.worker_nodes();
    let touch = matches!(plan.policy, "first-touch" | "localalloc");
    let plans: Vec<MemPlan> = (0..parts).map(|i| plan.part(i, parts)).collect();
    let homes: Vec<Option<u32>> = (0..parts)
        .map(|i| match touch {
            true => Some(wn[loci_place::PartOrder::Blocks.node_index(i, parts, wn.len())]),
            false => plans[i].part_node(0, 1),
        })
        .collect();
    let out: Vec<Mutex<Option<Result<T, EngineError>>>> =
        (0..parts).map(|_| Mutex::new(None)).collect();
    let pass = exec.for_each(
        &homes,
        || (),
        |_, i| {
            let home = if touch { None } else { homes[i] };
            let part = Part {
                sf,
                p: i as i32 + 1,
                parts: parts as i32,
            };
            let r = make(part, home, &plans[i]);
            *out[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        },
    );
    let trace = Trace {
        touched: pass.trace.touched,
    };
    let mut nodes = vec![None; parts];
    for &(i, n) in &trace.touched {
        nodes[i] = n;
    }
    out.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let r = m
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every part ran");
            r.map(|mut t| {
                if touch {
                    t.set_home(nodes[i]);
                }
                t
            })
        })
        .collect()
}

/// What a part makes: blocks whose home is set once the worker that wrote them is known.
trait Homed {
    fn set_home(&mut self, n: Option<u32>);
}
impl Homed for Block {
    fn set_home(&mut self, n: Option<u32>) {
        self.home = n;
    }
}
impl Homed for (Block, Block) {
    fn set_home(&mut self, n: Option<u32>) {
        self.0.home = n;
        self.1.home = n;
    }
}

/// Orders part `p` of `parts` and its line items: two blocks, both ascending by order key.
fn gen_orders_lineitem(
    part: Part,
    home: Option<u32>,
    plan: &MemPlan,
) -> Result<(Block, Block), EngineError> {
    let Part { sf, p, parts: n } = part;
    let key = |k: i64, what: &str| {
        u32::try_from(k).map_err(|_| EngineError::Invalid(format!("{what} {k} exceeds u32")))
    };
    let mut ok = Vec::new();
    let mut ck = Vec::new();
    let mut tp = Vec::new();
    let mut od = Vec::new();
    let mut sp = Vec::new();
    for r in OrderGenerator::new(sf, p, n).iter() {
        ok.push(key(r.o_orderkey, "o_orderkey")?);
        ck.push(key(r.o_custkey, "o_custkey")?);
        tp.push(r.o_totalprice.into_inner());
        od.push(days(r.o_orderdate));
        sp.push(r.o_shippriority);
    }
    let mut lok = Vec::new();
    let mut lsk = Vec::new();
    let mut qty = Vec::new();
    let mut price = Vec::new();
    let mut disc = Vec::new();
    let mut tax = Vec::new();
    let mut rf = Vec::new();
    let mut ls = Vec::new();
    let mut ship = Vec::new();
    let small = |v: i64, what: &str| {
        u8::try_from(v).map_err(|_| EngineError::Invalid(format!("{what} {v} out of range")))
    };
    for r in LineItemGenerator::new(sf, p, n).iter() {
        lok.push(key(r.l_orderkey, "l_orderkey")?);
        lsk.push(key(r.l_suppkey, "l_suppkey")?);
        qty.push(
            u16::try_from(r.l_quantity * 100)
                .map_err(|_| EngineError::Invalid(format!("l_quantity {}", r.l_quantity)))?,
        );
        price.push(r.l_extendedprice.into_inner());
        disc.push(small(r.l_discount.into_inner(), "l_discount")?);
        tax.push(small(r.l_tax.into_inner(), "l_tax")?);
        rf.push(one_letter(r.l_returnflag)?);
        ls.push(one_letter(r.l_linestatus)?);
        ship.push(days(r.l_shipdate));
    }
    check_copartitioned(&ok, &lok)?;
    let orders = block_of!(plan, home; ok, ck, tp, od, sp)?;
    let lineitem = block_of!(plan, home; lok, lsk, qty, price, disc, tax, rf, ls, ship)?;
    Ok((orders, lineitem))
}

fn one_letter(s: &str) -> Result<u8, EngineError> {
    match s.as_bytes() {
        [b] => Ok(*b),
        _ => Err(EngineError::Invalid(format!(
            "flag '{s}' is not one letter"
        ))),
    }
}

/// What the per-pair joins of the plans rely on: order keys strictly ascending, line items'
/// order keys ascending, every line item's order in the same morsel and every order with at
/// least one line item.
pub(crate) fn check_copartitioned(orders: &[u32], lines: &[u32]) -> Result<(), EngineError> {
    let bad = |why: &str| {
        Err(EngineError::Invalid(format!(
            "orders and lineitem morsels are not co-partitioned: {why}"
        )))
    };
    if orders.windows(2).any(|w| w[0] >= w[1]) {
        return bad("order keys not ascending");
    }
    let mut j = 0;
    for &k in orders {
        let start = j;
        while j < lines.len() && lines[j] == k {
            j += 1;
        }
        if j == start {
            return bad(&format!("order {k} has no line item in its morsel"));
        }
    }
    if j != lines.len() {
        return bad(&format!("line item of order {} out of place", lines[j]));
    }
    Ok(())
}

fn gen_customer(part: Part, home: Option<u32>, plan: &MemPlan) -> Result<Block, EngineError> {
    let mut key = Vec::new();
    let mut nat = Vec::new();
    let mut seg = Vec::new();
    let mut name = Vec::new();
    for r in CustomerGenerator::new(part.sf, part.p, part.parts).iter() {
        key.push(u32::try_from(r.c_custkey).map_err(gen_err("c_custkey"))?);
        nat.push(u8::try_from(r.c_nationkey).map_err(gen_err("c_nationkey"))?);
        seg.push(fixed::<SEGMENT_LEN>(r.c_mktsegment).ok_or_else(|| {
            EngineError::Invalid(format!("c_mktsegment '{}' too long", r.c_mktsegment))
        })?);
        let n = r.c_name.to_string();
        name.push(
            fixed::<NAME_LEN>(&n)
                .ok_or_else(|| EngineError::Invalid(format!("c_name '{n}' too long")))?,
        );
    }
    block_of!(plan, home; key, nat, seg, name)
}

fn gen_supplier(part: Part, home: Option<u32>, plan: &MemPlan) -> Result<Block, EngineError> {
    let mut key = Vec::new();
    let mut nat = Vec::new();
    for r in SupplierGenerator::new(part.sf, part.p, part.parts).iter() {
        key.push(u32::try_from(r.s_suppkey).map_err(gen_err("s_suppkey"))?);
        nat.push(u8::try_from(r.s_nationkey).map_err(gen_err("s_nationkey"))?);
    }
    block_of!(plan, home; key, nat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_numbered_in_the_order_listed() {
        assert_eq!(
            [l::ORDERKEY, l::SUPPKEY, l::QUANTITY, l::TAX, l::SHIPDATE],
            [0, 1, 2, 5, 8]
        );
        assert_eq!([o::ORDERKEY, o::ORDERDATE, o::SHIPPRIORITY], [0, 3, 4]);
        assert_eq!([c::CUSTKEY, c::MKTSEGMENT, c::NAME], [0, 2, 3]);
        assert_eq!([s::SUPPKEY, s::NATIONKEY], [0, 1]);
    }
}
