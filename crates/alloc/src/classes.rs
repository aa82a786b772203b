//! Size classes.
//!
//! * small (1 B ..= 7168 B): 16-byte steps up to 128 B, then four classes per doubling up to
//!   1 KiB and eight above (at most 12.5% internal waste where blocks are largest);
//! * medium (7169 B ..= 512 KiB): seed 003's classes, the first 8 KiB and each next one 1.07x
//!   the previous, rounded up to the cache line (64 B): 62 classes, at most 7% internal waste.
//!
//! The engine serves requests of 8 KiB and more as page spans (see `engine::SPAN_MIN`), so of
//! the medium classes only the first (8 KiB, for 7169..8191 B) serves blocks; the table stays
//! whole because it is the seed's and `class_of` is defined on all of 1..=512 KiB.
//!
//! Everything is computed at compile time; lookups are one or two table reads.

/// Cache line size the medium classes are rounded to.
pub const LINE: usize = 64;
/// Largest size served by a small class.
pub const SMALL_MAX: usize = 7168;
/// Smallest medium class (seed 003's S0).
pub const MEDIUM_MIN: usize = 8192;
/// Largest size served from superblocks; bigger requests get their own node-bound mapping.
pub const MEDIUM_MAX: usize = 512 * 1024;

const fn build_small() -> ([usize; 48], usize) {
    let mut s = [0usize; 48];
    let mut n = 0;
    let mut size = 16;
    while size <= 128 {
        s[n] = size;
        n += 1;
        size += 16;
    }
    let mut base = 128;
    while base < SMALL_MAX {
        let per = if base < 1024 { 4 } else { 8 };
        let step = base / per;
        let mut k = 1;
        while k <= per && base + k * step <= SMALL_MAX {
            s[n] = base + k * step;
            n += 1;
            k += 1;
        }
        base *= 2;
    }
    (s, n)
}

const fn build_medium() -> ([usize; 64], usize) {
    let mut s = [0usize; 64];
    s[0] = MEDIUM_MIN;
    let mut n = 1;
    while s[n - 1] < MEDIUM_MAX {
        // ceil(prev * 1.07), then up to the next cache line
        let mut next = (s[n - 1] * 107).div_ceil(100);
        next = next.div_ceil(LINE) * LINE;
        if next > MEDIUM_MAX {
            next = MEDIUM_MAX;
        }
        s[n] = next;
        n += 1;
    }
    (s, n)
}

const SMALL: ([usize; 48], usize) = build_small();
const MEDIUM: ([usize; 64], usize) = build_medium();
/// Number of small classes.
pub const NSMALL: usize = SMALL.1;
/// Number of medium classes (seed 003 quotes "63"; this rounding gives 62).
pub const NMEDIUM: usize = MEDIUM.1;
/// All classes: small ones first, then medium.
pub const NCLASSES: usize = NSMALL + NMEDIUM;

const fn build_sizes() -> [usize; NCLASSES] {
    let mut s = [0usize; NCLASSES];
    let mut i = 0;
    while i < NSMALL {
        s[i] = SMALL.0[i];
        i += 1;
    }
    while i < NCLASSES {
        s[i] = MEDIUM.0[i - NSMALL];
        i += 1;
    }
    s
}

/// Block size of every class.
pub const SIZES: [usize; NCLASSES] = build_sizes();

const fn first_class_at_least(size: usize) -> usize {
    let mut c = 0;
    while c < NCLASSES && SIZES[c] < size {
        c += 1;
    }
    c
}

// Tables for small sizes: entry i is the class of size i * step (the class of 1 B for i = 0),
// indexed by (size + 15) / 16 up to 1024 (step 16), then (size + 127) / 128 up to SMALL_MAX.
const fn build_lut<const N: usize>(step: usize) -> [u8; N] {
    let mut t = [0u8; N];
    let mut i = 0;
    while i < N {
        t[i] = first_class_at_least(if i == 0 { 1 } else { i * step }) as u8;
        i += 1;
    }
    t
}
// Medium: index ceil(size / 512); the class of the bucket's low end, then at most one step up
// because consecutive medium classes are more than 512 B apart.
const fn build_medium_lut() -> [u8; 1025] {
    let mut t = [0u8; 1025];
    let mut i = 0;
    while i <= 1024 {
        let low = if i == 0 { 1 } else { (i - 1) * 512 + 1 };
        t[i] = first_class_at_least(low) as u8;
        i += 1;
    }
    t
}
// Every small class is a multiple of 16: one table indexed by ceil(size / 16) serves all of
// 0..=SMALL_MAX exactly (449 bytes). The allocation fast path uses it turned into the byte
// offsets of the classes' states in a heap (`engine::class_run::small_class_state`).
pub(crate) const GRANULES: usize = SMALL_MAX / 16 + 1;
pub(crate) const fn build_granule_lut() -> [u8; GRANULES] {
    let mut t = [0u8; GRANULES];
    let mut i = 0;
    while i < GRANULES {
        t[i] = first_class_at_least(if i == 0 { 1 } else { i * 16 }) as u8;
        i += 1;
    }
    t
}
static SMALL_LUT: [u8; 65] = build_lut(16);
static MID_LUT: [u8; 57] = build_lut(128);
static MEDIUM_LUT: [u8; 1025] = build_medium_lut();

/// Class for a request of `size` bytes (`1 <= size <= MEDIUM_MAX`).
#[inline]
pub fn class_of(size: usize) -> usize {
    debug_assert!(size <= MEDIUM_MAX);
    if size <= 1024 {
        SMALL_LUT[size.div_ceil(16)] as usize
    } else if size <= SMALL_MAX {
        MID_LUT[size.div_ceil(128)] as usize
    } else {
        let c = MEDIUM_LUT[size.div_ceil(512)] as usize;
        if SIZES[c] >= size {
            c
        } else {
            c + 1
        }
    }
}

/// Class for a request of `size <= SMALL_MAX` bytes (0 counts as 1): one table load.
#[inline(always)]
pub fn small_class_of(size: usize) -> usize {
    debug_assert!(size <= SMALL_MAX);
    // A `const`, not the `static`: its copy is private to the code that uses it, addressed
    // relative to the instruction pointer; the `static` was reached through the GOT (one
    // load more on every malloc of the preload library).
    const LUT: [u8; GRANULES] = build_granule_lut();
    // SAFETY: size <= SMALL_MAX, so (size + 15) / 16 < GRANULES.
    unsafe { *LUT.get_unchecked((size + 15) >> 4) as usize }
}

/// `ceil(2^64 / d)`: with it, `(off * m) >> 64 == off / d` exactly for every `off * d < 2^64`
/// (block index from a pointer without a division on the free path).
pub const fn magic(d: usize) -> u64 {
    ((1u128 << 64).div_ceil(d as u128)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_table_is_seed_003s() {
        assert_eq!(SIZES[NSMALL], 8192);
        assert_eq!(SIZES[NCLASSES - 1], MEDIUM_MAX);
        assert_eq!(NMEDIUM, 62);
        for c in NSMALL + 1..NCLASSES {
            let (a, b) = (SIZES[c - 1], SIZES[c]);
            assert_eq!(b % LINE, 0, "class {c} not a cache-line multiple");
            assert!(b > a && b <= (a * 107).div_ceil(100).div_ceil(LINE) * LINE);
            assert!(
                b - a > 512,
                "medium lookup needs classes more than 512 B apart"
            );
        }
        for c in 1..NSMALL {
            assert!(SIZES[c] > SIZES[c - 1] && SIZES[c].is_multiple_of(16));
        }
        assert_eq!(SIZES[NSMALL - 1], SMALL_MAX);
    }

    #[test]
    fn class_of_is_the_smallest_fitting_class() {
        for size in 1..=MEDIUM_MAX {
            let c = class_of(size);
            assert!(SIZES[c] >= size, "size {size} class {c}");
            assert!(c == 0 || SIZES[c - 1] < size, "size {size} class {c}");
        }
    }

    #[test]
    fn small_class_of_agrees_with_class_of() {
        assert_eq!(small_class_of(0), class_of(1));
        for size in 1..=SMALL_MAX {
            assert_eq!(small_class_of(size), class_of(size), "size {size}");
        }
    }

    #[test]
    fn magic_division_is_exact_for_superblock_offsets() {
        for &d in SIZES.iter() {
            let m = magic(d);
            for off in (0..(256usize << 20))
                .step_by(d / 2 + 7)
                .chain([d - 1, d, d + 1])
            {
                let q = ((off as u128 * m as u128) >> 64) as usize;
                assert_eq!(q, off / d, "d {d} off {off}");
            }
        }
    }
}
