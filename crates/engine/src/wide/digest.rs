//! The digests of the 64-bit operators' outputs ([`JoinDigest`], [`AggDigest`],
//! [`MedianDigest`]): the wrapping sum of [`tuple_hash`] over every output tuple, and the float
//! sums compared within [`RTOL`]. `bench/peers/peers.py` computes the very same.

use super::{Group64, Median64, Value64};
use crate::gen::mix64;

/// Result of a 64-bit join.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JoinDigest {
    /// Number of matching (r, s) pairs.
    pub count: u64,
    /// `sum(r.val + s.val)` over the pairs (wrapping).
    pub sum: i64,
    /// Wrapping sum of `tuple_hash([key, r.val, s.val])` over the pairs.
    pub hash: u64,
}

impl JoinDigest {
    /// Adds the matched pair `(key, r.val = p, s.val = q)`.
    #[inline(always)]
    pub fn add_pair(&mut self, k: u64, p: i64, q: i64) {
        self.count += 1;
        self.sum = self.sum.wrapping_add(p.wrapping_add(q));
        self.hash = self.hash.wrapping_add(tuple_hash(&[k, p as u64, q as u64]));
    }

    /// Both digests' pairs (the digests of two disjoint sets of pairs, in any order).
    pub fn merge(self, o: JoinDigest) -> JoinDigest {
        JoinDigest {
            count: self.count + o.count,
            sum: self.sum.wrapping_add(o.sum),
            hash: self.hash.wrapping_add(o.hash),
        }
    }
}

/// Start value of [`tuple_hash`].
pub const TUPLE_SEED: u64 = 0x243f_6a88_85a3_08d3;
/// Salt of [`key_weight`].
pub const WEIGHT_SALT: u64 = 0x1319_8a2e_0370_7344;

/// The hash of one output tuple (each field as its 64-bit two's-complement pattern):
/// `h = TUPLE_SEED; for x in fields { h = mix64(h ^ x) }`. `bench/peers/peers.py` has the same.
#[inline(always)]
pub fn tuple_hash(fields: &[u64]) -> u64 {
    let mut h = TUPLE_SEED;
    for &x in fields {
        h = mix64(h ^ x);
    }
    h
}

/// The weight that binds a group's float results to its key in the weighted sums of
/// [`AggDigest`] and [`MedianDigest`]: in `[0, 1)`.
#[inline(always)]
pub fn key_weight(key: u64) -> f64 {
    (mix64(key ^ WEIGHT_SALT) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Relative tolerance of the float comparisons of the digests (sums of doubles in different
/// orders): `|a - b| <= RTOL * max(|a|, |b|, 1)`.
pub const RTOL: f64 = 1e-9;

/// Whether two float sums of a digest agree within [`RTOL`].
#[inline]
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= RTOL * a.abs().max(b.abs()).max(1.0)
}

/// A float result `x` of every group, summed plain and weighted by [`key_weight`]: `(sum(x),
/// sum(x * w(key)))`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FloatSums {
    pub sum: f64,
    pub wsum: f64,
}

impl FloatSums {
    #[inline]
    fn add(&mut self, key: u64, x: f64) {
        self.sum += x;
        self.wsum += x * key_weight(key);
    }

    /// Both sums within [`RTOL`].
    pub fn agrees(&self, o: &FloatSums) -> bool {
        close(self.sum, o.sum) && close(self.wsum, o.wsum)
    }
}

/// Order-independent digest of a W2 answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AggDigest {
    pub groups: u64,
    /// Wrapping sum of `tuple_hash` over every group, compared exactly: `[key, count, sum, min,
    /// max]` for `i64` values, `[key, count, min, max]` for `f64` ones (their sums round in the
    /// order of addition).
    pub hash: u64,
    /// Every group's sum as f64 ([`FloatSums`]).
    pub sum: FloatSums,
    /// Every group's avg.
    pub avg: FloatSums,
}

impl AggDigest {
    /// Digest of a W2 answer.
    pub fn of<V: Value64>(groups: &[Group64<V>]) -> AggDigest {
        let mut d = AggDigest {
            groups: groups.len() as u64,
            hash: 0,
            sum: FloatSums::default(),
            avg: FloatSums::default(),
        };
        for g in groups {
            let (c, mn, mx) = (g.count, g.min.bits(), g.max.bits());
            let h = if V::EXACT {
                tuple_hash(&[g.key, c, g.sum.bits(), mn, mx])
            } else {
                tuple_hash(&[g.key, c, mn, mx])
            };
            d.hash = d.hash.wrapping_add(h);
            d.sum.add(g.key, g.sum.to_f64());
            d.avg.add(g.key, g.avg);
        }
        d
    }

    /// Whether two digests agree: groups and hash exactly, the float sums within [`RTOL`].
    pub fn agrees(&self, o: &AggDigest) -> bool {
        self.groups == o.groups
            && self.hash == o.hash
            && self.sum.agrees(&o.sum)
            && self.avg.agrees(&o.avg)
    }
}

/// Order-independent digest of a W1 answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MedianDigest {
    pub groups: u64,
    /// Wrapping sum of `tuple_hash` over every group, compared exactly: `[key, count,
    /// twice_median]` for `i64` values, `[key, count]` for `f64` ones (DuckDB's `(lo + hi) / 2`
    /// and Polars' `lo + (hi - lo) / 2` differ in the last bit).
    pub hash: u64,
    /// Every group's median ([`FloatSums`]).
    pub median: FloatSums,
}

impl MedianDigest {
    /// Digest of a W1 answer.
    pub fn of<V: Value64>(groups: &[Median64<V>]) -> MedianDigest {
        let mut d = MedianDigest {
            groups: groups.len() as u64,
            hash: 0,
            median: FloatSums::default(),
        };
        for g in groups {
            let h = if V::EXACT {
                tuple_hash(&[g.key, g.count, g.twice_median.bits()])
            } else {
                tuple_hash(&[g.key, g.count])
            };
            d.hash = d.hash.wrapping_add(h);
            d.median.add(g.key, g.median());
        }
        d
    }

    /// Whether two digests agree: groups and hash exactly, the median sums within [`RTOL`].
    pub fn agrees(&self, o: &MedianDigest) -> bool {
        self.groups == o.groups && self.hash == o.hash && self.median.agrees(&o.median)
    }
}
