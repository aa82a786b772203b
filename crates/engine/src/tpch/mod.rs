//! TPC-H Q1, Q3, Q5, Q6 and Q18 as physical plans over node-homed columnar morsels.
//!
//! [`Data::generate`] builds the tables in process with the `tpchgen` crate (dbgen's rows);
//! [`run`] executes one query on an [`Exec`]: every morsel (or orders/lineitem morsel pair) is a
//! task on its home node's workers, each worker keeps its own partial state (aggregation slots,
//! top-k lists), and the partial states are merged once at the end. The plans, with TPC-H's
//! validation substitution parameters (those of dbgen's reference answers):
//!
//! - **Q1**: scan lineitem, filter `l_shipdate <= 1998-09-02`, hash aggregation on
//!   `(l_returnflag, l_linestatus)` (a direct-mapped slot per two-letter key), merge, sort.
//! - **Q3**: build a key-indexed set of `BUILDING` customers (hash join build on a dense key);
//!   per orders/lineitem morsel pair: a join table over the pair's order-key range holding the
//!   orders with `o_orderdate < 1995-03-15` of those customers, probed by every line item with
//!   `l_shipdate > 1995-03-15` (branch-free), revenue per order, a per-worker top 10; merge.
//! - **Q5**: resolve `ASIA`'s nations; build customer -> nation and supplier -> nation arrays
//!   (only nations of the region); per morsel pair: a join table of the 1994 orders holding
//!   their customer's nation, probed by every line item, kept when the supplier's nation is
//!   that nation; revenue per nation.
//! - **Q6**: scan lineitem with the four predicates as masked sums of `l_extendedprice` per
//!   discount value (vectorized; AVX2 when the cpu has it).
//! - **Q18**: per morsel pair: sum `l_quantity` per order key (the `IN` subquery's aggregation,
//!   complete inside the pair), keep orders over 300; hash join those orders' customers with a
//!   scan of customer for `c_name`; sort, limit 100.
//!
//! Money stays exact: sums are integers at the scale of their expression (cents x 100 for
//! `price * (1 - discount)`, and so on); averages are the exact sum over the count as `f64`.

pub mod data;
mod plans;

pub use data::{check_sf, Block, Data, Nation, MORSEL_ORDERS};

use crate::{EngineError, Exec};

/// The queries this engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Query {
    Q1,
    Q3,
    Q5,
    Q6,
    Q18,
}

impl Query {
    /// All of them, in number order.
    pub const ALL: [Query; 5] = [Query::Q1, Query::Q3, Query::Q5, Query::Q6, Query::Q18];
    /// The numbers [`Query::from_number`] accepts.
    pub const CHOICES: &'static str = "1, 3, 5, 6, 18";

    /// The TPC-H query number.
    pub fn number(self) -> u32 {
        match self {
            Query::Q1 => 1,
            Query::Q3 => 3,
            Query::Q5 => 5,
            Query::Q6 => 6,
            Query::Q18 => 18,
        }
    }

    /// The query of TPC-H number `q`, or an error listing the numbers this engine runs.
    pub fn from_number(q: u32) -> Result<Query, EngineError> {
        Query::ALL
            .into_iter()
            .find(|x| x.number() == q)
            .ok_or_else(|| EngineError::BadChoice {
                what: "TPC-H query of loci-engine",
                given: q.to_string(),
                valid: Query::CHOICES,
            })
    }
}

impl std::fmt::Display for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "q{:02}", self.number())
    }
}

impl std::str::FromStr for Query {
    type Err = EngineError;
    /// `1`, `q1` or `q01` style.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().trim_start_matches(['q', 'Q']);
        match t.parse::<u32>() {
            Ok(q) => Query::from_number(q).map_err(|_| EngineError::BadChoice {
                what: "TPC-H query of loci-engine",
                given: s.into(),
                valid: Query::CHOICES,
            }),
            Err(_) => Err(EngineError::BadChoice {
                what: "TPC-H query of loci-engine",
                given: s.into(),
                valid: Query::CHOICES,
            }),
        }
    }
}

/// One cell of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Counts, keys, integers.
    Int(i64),
    /// An exact decimal: `v / 10^scale`.
    Dec(i128, u32),
    /// Averages.
    Float(f64),
    /// Days since 1970-01-01.
    Date(i32),
    Text(String),
}

impl Value {
    /// The number (decimals and dates as f64; text: None).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Int(v) => Some(v as f64),
            Value::Dec(v, s) => Some(v as f64 / 10f64.powi(s as i32)),
            Value::Float(v) => Some(v),
            Value::Date(d) => Some(d as f64),
            Value::Text(_) => None,
        }
    }
}

impl std::fmt::Display for Value {
    /// Decimals exactly, dates as `YYYY-MM-DD`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Dec(v, 0) => write!(f, "{v}"),
            Value::Dec(v, s) => {
                let p = 10i128.pow(*s);
                let sign = if *v < 0 { "-" } else { "" };
                let a = v.unsigned_abs();
                write!(
                    f,
                    "{sign}{}.{:0w$}",
                    a / p as u128,
                    a % p as u128,
                    w = *s as usize
                )
            }
            Value::Float(v) => write!(f, "{v}"),
            Value::Date(d) => {
                let (y, m, dd) = civil_from_days(*d);
                write!(f, "{y:04}-{m:02}-{dd:02}")
            }
            Value::Text(s) => f.write_str(s),
        }
    }
}

/// A query's result: column names and rows in the query's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub columns: Vec<&'static str>,
    pub rows: Vec<Vec<Value>>,
}

/// Runs `q` over `data` on `exec`'s workers.
pub fn run(exec: &Exec, data: &Data, q: Query) -> Answer {
    match q {
        Query::Q1 => plans::q1(exec, data),
        Query::Q3 => plans::q3(exec, data),
        Query::Q5 => plans::q5(exec, data),
        Query::Q6 => plans::q6(exec, data),
        Query::Q18 => plans::q18(exec, data),
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`,
/// written here: the plans need only this and its inverse, and no date crate is in the
/// workspace; the answers' dates, printed through the inverse, are compared with DuckDB's and
/// dbgen's).
pub fn days_from_civil(y: i32, m: u32, d: u32) -> i32 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i32 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i32 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// (year, month, day) of days since 1970-01-01.
pub fn civil_from_days(z: i32) -> (i32, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i32::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip_and_print() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(1992, 1, 1), 8035);
        for d in [0, 8035, 10_000, 10_471, -1, 11_000] {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
        assert_eq!(
            Value::Date(days_from_civil(1998, 9, 2)).to_string(),
            "1998-09-02"
        );
        assert_eq!(Value::Dec(12345, 2).to_string(), "123.45");
        assert_eq!(Value::Dec(-5, 2).to_string(), "-0.05");
        assert_eq!(Value::Dec(7, 4).as_f64(), Some(0.0007));
    }

    #[test]
    fn queries_parse_and_bad_ones_list_the_choices() {
        assert_eq!("q18".parse::<Query>().unwrap(), Query::Q18);
        assert_eq!("6".parse::<Query>().unwrap(), Query::Q6);
        assert_eq!(Query::Q3.to_string(), "q03");
        for bad in ["2", "q22", "x", ""] {
            let e = bad.parse::<Query>().unwrap_err().to_string();
            assert!(e.contains("1, 3, 5, 6, 18"), "{e}");
        }
        assert!(Query::from_number(4).is_err());
    }
}
