//! [`Value64`]: the value types of the 64-bit aggregation tables (`--values i64|f64`) and what
//! W2 and W1 need of them.

use crate::gen;
use crate::storage::Morsel;

/// A value type of the 64-bit aggregation tables (`--values`): what W2 and W1 need of it.
/// Values are never NaN (the generators make none).
pub trait Value64: Copy + Default + PartialOrd + Send + Sync + std::fmt::Debug + 'static {
    /// Whether sums and medians are exact (`i64`: hashed into the digests) or rounded in an
    /// order-dependent way (`f64`: compared within [`RTOL`]).
    const EXACT: bool;
    /// The value of row `i` of data seeded by `seed` ([`gen::val64`], [`gen::val_f64`]).
    fn at(seed: u64, i: u64) -> Self;
    /// A 64-bit morsel's value column, read as this type.
    fn col(m: &Morsel) -> &[Self];
    /// The running sum: wrapping for `i64`, IEEE addition for `f64`.
    fn plus(self, o: Self) -> Self;
    /// The smaller of two values (`self` when they compare equal, e.g. `0.0` and `-0.0`).
    #[inline(always)]
    fn lesser(self, o: Self) -> Self {
        if o < self {
            o
        } else {
            self
        }
    }
    /// The larger of two values (`self` when they compare equal).
    #[inline(always)]
    fn greater(self, o: Self) -> Self {
        if o > self {
            o
        } else {
            self
        }
    }
    /// As a double (avg, the digests' float sums).
    fn to_f64(self) -> f64;
    /// The pattern [`tuple_hash`] takes: two's complement for `i64`; for `f64` its bits with
    /// `-0.0` as `+0.0` (which zero a min or max keeps is up to the system).
    fn bits(self) -> u64;
    /// Moves the `n`-th smallest value to `v[n]`, smaller ones before it (any order).
    fn select_nth(v: &mut [Self], n: usize);
}

impl Value64 for i64 {
    const EXACT: bool = true;
    #[inline(always)]
    fn at(seed: u64, i: u64) -> i64 {
        gen::val64(seed, i)
    }
    #[inline(always)]
    fn col(m: &Morsel) -> &[i64] {
        m.vals64()
    }
    #[inline(always)]
    fn plus(self, o: i64) -> i64 {
        self.wrapping_add(o)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn bits(self) -> u64 {
        self as u64
    }
    #[inline]
    fn select_nth(v: &mut [i64], n: usize) {
        v.select_nth_unstable(n);
    }
}

impl Value64 for f64 {
    const EXACT: bool = false;
    #[inline(always)]
    fn at(seed: u64, i: u64) -> f64 {
        gen::val_f64(seed, i)
    }
    #[inline(always)]
    fn col(m: &Morsel) -> &[f64] {
        m.vals_f64()
    }
    #[inline(always)]
    fn plus(self, o: f64) -> f64 {
        self + o
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn bits(self) -> u64 {
        (self + 0.0).to_bits()
    }
    #[inline]
    fn select_nth(v: &mut [f64], n: usize) {
        v.select_nth_unstable_by(n, f64::total_cmp);
    }
}
