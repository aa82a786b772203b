//! A seismic-like 3-D velocity volume: the data of the subarray benchmark.
//!
//! Dimensions `depth`, `inline`, `crossline` (C order, depth outermost); every attribute holds the
//! P-wave velocity in m/s converted to its type. The model, fully determined by the seed:
//! - `K` layers; the top of layer `k` (k >= 1) lies at depth `nz*k/K + A*sin(2*pi*x/Lx + p_k)
//!   * cos(2*pi*y/Ly + q_k)` with `A = 0.4*nz/K` (folded, never crossing), `Lx = nx/1.5`,
//!   `Ly = ny/1.2`, phases `p_k`, `q_k` drawn from the seed;
//! - layer velocity `v_k = 1500 + 4000*k/(K-1) + j_k` with `j_k` in `[-150, 150]` from the seed,
//!   times a smooth lateral variation `1 + 0.03*sin(2*pi*(x+y)/(nx+ny)*3)`, plus a compaction
//!   gradient of `0.5 m/s` per cell below the layer top;
//! - noise: `+-20 m/s` uniform, from a hash of (seed, cell), so any chunk can be generated
//!   independently and in parallel with identical results.

use std::f64::consts::TAU;

use crate::array::ChunkFill;
use crate::dtype::DType;
use crate::error::ArrayError;
use crate::layout::{Attr, Chunking, Dim, Layout};

/// SplitMix64 finalizer: a fast, well-mixed 64-bit hash (Steele, Lea, Flood 2014).
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in [-1, 1) from a hash.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Parameters of the velocity model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seismic {
    pub seed: u64,
    /// Number of layers (at least 2).
    pub layers: usize,
}

impl Default for Seismic {
    fn default() -> Self {
        Self {
            seed: 42,
            layers: 8,
        }
    }
}

/// The layout of a seismic volume of shape `[depth, inline, crossline]` with one attribute
/// `velocity` of type `dtype`.
pub fn seismic_layout(
    shape: [usize; 3],
    dtype: DType,
    chunking: &Chunking,
) -> Result<Layout, ArrayError> {
    Layout::new(
        vec![
            Dim::new("depth", shape[0]),
            Dim::new("inline", shape[1]),
            Dim::new("crossline", shape[2]),
        ],
        vec![Attr::new("velocity", dtype)],
        chunking,
    )
}

impl Seismic {
    /// The velocity at one cell of a volume of `shape` (the reference formula; [`Seismic::fill`]
    /// computes the same values chunk by chunk).
    pub fn velocity(&self, shape: [usize; 3], cell: [usize; 3]) -> f64 {
        let tops = self.tops(shape, cell[1], cell[2]);
        self.at(shape, &tops, cell)
    }

    fn tops(&self, shape: [usize; 3], y: usize, x: usize) -> Vec<f64> {
        let k = self.layers.max(2);
        let nz = shape[0] as f64;
        let amp = 0.4 * nz / k as f64;
        let lx = (shape[2] as f64 / 1.5).max(1.0);
        let ly = (shape[1] as f64 / 1.2).max(1.0);
        (1..k)
            .map(|i| {
                let p = unit(mix64(self.seed ^ (i as u64) << 32)) * std::f64::consts::PI;
                let q = unit(mix64(self.seed ^ (i as u64) << 40 ^ 1)) * std::f64::consts::PI;
                nz * i as f64 / k as f64
                    + amp * (TAU * x as f64 / lx + p).sin() * (TAU * y as f64 / ly + q).cos()
            })
            .collect()
    }

    fn at(&self, shape: [usize; 3], tops: &[f64], [z, y, x]: [usize; 3]) -> f64 {
        let k = self.layers.max(2);
        let zf = z as f64;
        let layer = tops.iter().take_while(|&&t| t <= zf).count();
        let top = if layer == 0 { 0.0 } else { tops[layer - 1] };
        let jitter = unit(mix64(self.seed.wrapping_mul(31) ^ layer as u64)) * 150.0;
        let v = 1500.0 + 4000.0 * layer as f64 / (k - 1) as f64 + jitter;
        let lateral =
            1.0 + 0.03 * (TAU * 3.0 * (x + y) as f64 / (shape[1] + shape[2]) as f64).sin();
        let idx = ((z * shape[1] + y) * shape[2] + x) as u64;
        let noise = unit(mix64(self.seed ^ idx.wrapping_mul(0x2545_f491_4f6c_dd1d))) * 20.0;
        v * lateral + 0.5 * (zf - top) + noise
    }

    /// Fills one chunk of a volume laid out by [`seismic_layout`] (every attribute gets the
    /// velocity in its own type). Use as the `fill` of [`crate::Array::build`].
    pub fn fill(&self, c: &mut ChunkFill<'_>) {
        let l = c.layout();
        let shape = [l.dims[0].len, l.dims[1].len, l.dims[2].len];
        let dtypes: Vec<DType> = l.attrs.iter().map(|a| a.dtype).collect();
        let b = c.bounds.to_vec();
        let (ny, nx) = (b[1].end - b[1].start, b[2].end - b[2].start);
        // Layer tops per (inline, crossline) column of the chunk: computed once per column.
        let cols: Vec<Vec<f64>> = b[1]
            .clone()
            .flat_map(|y| b[2].clone().map(move |x| (y, x)))
            .map(|(y, x)| self.tops(shape, y, x))
            .collect();
        for (a, t) in dtypes.into_iter().enumerate() {
            let sz = t.size();
            let out = c.attr_mut(a);
            let mut i = 0;
            for z in b[0].clone() {
                for yy in 0..ny {
                    for xx in 0..nx {
                        let v = self.at(
                            shape,
                            &cols[yy * nx + xx],
                            [z, b[1].start + yy, b[2].start + xx],
                        );
                        t.encode(v, &mut out[i..i + sz]);
                        i += sz;
                    }
                }
            }
        }
    }
}
