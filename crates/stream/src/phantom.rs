//! A synthetic tomography phantom: X-ray projections of spheres of different densities, with
//! detector noise, as uint16 little-endian images (default 2560x2160 = 11,059,200 bytes). Seeded
//! and reproducible: projection `i` of seed `s` is always the same bytes, whoever computes it and
//! on how many threads.
//!
//! Model: spheres inside a cylindrical sample rotate about the vertical axis; projection `i` is at
//! angle `i * pi / angles`. A detector pixel sees `I0 * exp(-sum(mu_k * L_k))`, where `L_k` is the
//! chord of sphere `k` along the ray, plus uniform noise of +-`noise` counts. The noise amplitude
//! sets how well LZ4 compresses; the default gives about 1.87 with LZ4 level 1 (as in
//! BENCHMARKS.md), see the test `default_ratio_is_about_1_87`.

use rand::{RngExt, SeedableRng};

/// Default detector width (pixels).
pub const WIDTH: usize = 2560;
/// Default detector height (pixels).
pub const HEIGHT: usize = 2160;
/// One projection: 2560 x 2160 x 2 bytes.
pub const PROJECTION_BYTES: usize = WIDTH * HEIGHT * 2;

#[derive(Debug, Clone)]
struct Sphere {
    /// Centre in detector pixel units (x, z in the rotation plane, y vertical).
    x: f32,
    y: f32,
    z: f32,
    r: f32,
    /// Attenuation per pixel of path.
    mu: f32,
}

/// A seeded phantom.
#[derive(Debug, Clone)]
pub struct Phantom {
    seed: u64,
    width: usize,
    height: usize,
    spheres: Vec<Sphere>,
    /// Flat-field intensity (counts).
    pub i0: f32,
    /// Uniform noise amplitude in counts (+-noise).
    pub noise: u32,
    /// Number of projections over 180 degrees.
    pub angles: u32,
}

impl Phantom {
    /// A phantom with `width` x `height` projections (bytes per projection: `2 * width * height`).
    pub fn new(seed: u64, width: usize, height: usize) -> Self {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let (w, h) = (width as f32, height as f32);
        // Sample: a cylinder of radius 0.3 w around the axis, spanning 80% of the height.
        let rc = 0.3 * w;
        let mut spheres = Vec::new();
        // One big low-density body, then inclusions of various sizes and densities.
        spheres.push(Sphere {
            x: 0.0,
            y: 0.5 * h,
            z: 0.0,
            r: rc.min(0.45 * h),
            mu: 0.6 / rc,
        });
        for _ in 0..24 {
            let r = rng.random_range(0.02..0.12) * w.min(h);
            let ang = rng.random_range(0.0..std::f32::consts::TAU);
            let rad = rng.random_range(0.0..(rc - r).max(1.0));
            spheres.push(Sphere {
                x: rad * ang.cos(),
                z: rad * ang.sin(),
                y: rng.random_range(0.1 * h + r..(0.9 * h - r).max(0.1 * h + r + 1.0)),
                r,
                mu: rng.random_range(-0.3..1.5) / rc,
            });
        }
        Phantom {
            seed,
            width,
            height,
            spheres,
            i0: 2000.0,
            noise: 1,
            angles: 1500,
        }
    }

    /// The default 2560x2160 phantom.
    pub fn standard(seed: u64) -> Self {
        Self::new(seed, WIDTH, HEIGHT)
    }

    /// Bytes per projection.
    pub fn projection_bytes(&self) -> usize {
        self.width * self.height * 2
    }

    /// Writes projection `index` into `out` (`out.len()` must be [`Phantom::chunk_bytes`];
    /// a shorter `out` receives the first bytes of the projection).
    pub fn fill(&self, index: u64, out: &mut [u8]) {
        let (w, h) = (self.width, self.height);
        let theta = index as f32 * std::f32::consts::PI / self.angles.max(1) as f32;
        let (s, c) = theta.sin_cos();
        // Line integrals, per pixel.
        let mut path = vec![0f32; w * h];
        for sp in &self.spheres {
            let u = sp.x * c + sp.z * s + 0.5 * w as f32;
            let v = sp.y;
            let y0 = ((v - sp.r).floor().max(0.0)) as usize;
            let y1 = ((v + sp.r).ceil().min(h as f32)) as usize;
            let x0 = ((u - sp.r).floor().max(0.0)) as usize;
            let x1 = ((u + sp.r).ceil().min(w as f32)) as usize;
            let r2 = sp.r * sp.r;
            for y in y0..y1 {
                let dy = y as f32 + 0.5 - v;
                let row = &mut path[y * w..(y + 1) * w];
                for (x, p) in row.iter_mut().enumerate().take(x1).skip(x0) {
                    let dx = x as f32 + 0.5 - u;
                    let d2 = r2 - dx * dx - dy * dy;
                    if d2 > 0.0 {
                        *p += 2.0 * sp.mu * d2.sqrt();
                    }
                }
            }
        }
        // Noise: a fast seeded generator per projection, so projections are independent.
        let mut rng = rand::rngs::SmallRng::seed_from_u64(
            self.seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let span = 2 * self.noise + 1;
        let mut bits = 0u64;
        let mut left = 0;
        for (i, px) in out.chunks_exact_mut(2).enumerate().take(w * h) {
            if left == 0 {
                bits = rng.random::<u64>();
                left = 4;
            }
            let r = (bits & 0xffff) as u32;
            bits >>= 16;
            left -= 1;
            let n = (r * span) >> 16;
            let val = self.i0 * (-path[i]).exp() + n as f32 - self.noise as f32;
            let val = val.round().clamp(0.0, 65535.0) as u16;
            px.copy_from_slice(&val.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Codec;

    #[test]
    fn projections_are_reproducible_and_differ_by_index_and_seed() {
        let p = Phantom::new(5, 256, 216);
        let mut a = vec![0u8; p.projection_bytes()];
        let mut b = vec![0u8; p.projection_bytes()];
        p.fill(10, &mut a);
        Phantom::new(5, 256, 216).fill(10, &mut b);
        assert_eq!(a, b);
        p.fill(11, &mut b);
        assert_ne!(a, b);
        Phantom::new(6, 256, 216).fill(10, &mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn default_ratio_is_about_1_87() {
        let p = Phantom::standard(42);
        let mut raw = vec![0u8; PROJECTION_BYTES];
        let mut c = vec![0u8; Codec::bound(PROJECTION_BYTES)];
        let mut total = 0usize;
        for i in [0u64, 400] {
            p.fill(i, &mut raw);
            total += Codec::Lz4C.compress(&raw, &mut c).unwrap();
        }
        let ratio = (2 * PROJECTION_BYTES) as f64 / total as f64;
        assert!((1.78..1.96).contains(&ratio), "LZ4 ratio {ratio:.3}");
    }
}
