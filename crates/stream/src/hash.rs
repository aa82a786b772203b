//! XXH3, the checksum of every frame, chunk, END sum and journal record of loci-stream.
//!
//! twox-hash chooses its AVX2 code at run time where the cpu has it (SSE2 otherwise). xxhash-rust,
//! used before 2026-12-02, picks its vector width when it is compiled, so a portable build of loci
//! ran the SSE2 code: on 4 MiB chunks here 29-30 GB/s against twox-hash's 54-55 GB/s. A chunk is
//! hashed four times on its way (raw and on the wire at the sender, on the wire and raw at the
//! receiver), so the checksums were about a tenth of the stream's cpu. The values are XXH3's own
//! (seed 0, the default secret), so frames and journals written before still verify; the test
//! below pins them.

use twox_hash::{XxHash3_128, XxHash3_64};

/// XXH3-64 of `bytes`.
#[inline]
pub fn xxh3_64(bytes: &[u8]) -> u64 {
    XxHash3_64::oneshot(bytes)
}

/// XXH3-128 of `bytes`.
#[inline]
pub fn xxh3_128(bytes: &[u8]) -> u128 {
    XxHash3_128::oneshot(bytes)
}

/// Streaming XXH3-64: `update` with the pieces in order, `digest` gives [`xxh3_64`] of their
/// concatenation.
#[derive(Default, Clone)]
pub struct Xxh3(XxHash3_64);

impl Xxh3 {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        std::hash::Hasher::write(&mut self.0, bytes)
    }

    pub fn digest(&self) -> u64 {
        std::hash::Hasher::finish(&self.0)
    }
}

impl std::fmt::Debug for Xxh3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Xxh3")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| (i.wrapping_mul(131) ^ (i >> 7)) as u8)
            .collect()
    }

    /// Values of the reference XXH3 (as xxhash-rust 0.8 computed them, the library frames and
    /// journals were written with before), one length in each of XXH3's code paths: empty, 1-3,
    /// 4-8, 9-16, 17-128, 129-240, and the long loop with and without a partial stripe and block.
    const PINNED: [(usize, u64, u128); 16] = [
        (0, 0x2d06800538d394c2, 0x99aa06d3014798d86001c324468d497f),
        (1, 0xc44bdff4074eecdb, 0xa6cd5e9392000f6ac44bdff4074eecdb),
        (3, 0x6811538b444fc6dc, 0xc925ae1797c3998f6811538b444fc6dc),
        (4, 0xed503340c589a28b, 0x6ae518c60df23fcadb9cecd5eb59a7f1),
        (8, 0xe5b43ab074c9c13b, 0x63f350efc0ba3e2e5b3f49d0f38f9d7d),
        (9, 0x089b8d25b20fb877, 0x83c871b1014e6f76d8a20b5b7aa68a37),
        (16, 0x0a0ec5ae8679cb7f, 0x248181305d3c1039adebb1d9d080b69c),
        (17, 0x57c52d21ce492c1e, 0x825a0db7d0afe2c0cfea252f6b7ed7e9),
        (128, 0x696069c4f1e6a91a, 0x08df79f520370b525cfea347ea4bb687),
        (129, 0x34dfc256c90565f6, 0xbff3391f3ae7259375f3ef9c8cc6bf42),
        (240, 0xc92d1e75d8e9b86a, 0x89b105a2bc13b00d66f21c52f32e742f),
        (241, 0x8ec323309081b1d1, 0x5239da43672ab6fd8ec323309081b1d1),
        (1024, 0x0768cbf99558cbda, 0xecacd3f1d5edb3610768cbf99558cbda),
        (1025, 0x72182781b24cca49, 0xe9e57b4a31cf78ca72182781b24cca49),
        (
            65543,
            0xb230965c2dcff98a,
            0x8dbb19356a29fa56b230965c2dcff98a,
        ),
        (
            4 << 20,
            0x31dde84ea29a2db2,
            0x8c1346f820e67b8431dde84ea29a2db2,
        ),
    ];

    #[test]
    fn values_are_the_reference_xxh3() {
        for (n, h64, h128) in PINNED {
            let d = data(n);
            assert_eq!(xxh3_64(&d), h64, "xxh3_64 of {n} bytes");
            assert_eq!(xxh3_128(&d), h128, "xxh3_128 of {n} bytes");
        }
    }

    #[test]
    fn streaming_equals_one_shot_for_any_split() {
        for (n, h64, _) in PINNED {
            let d = data(n);
            for piece in [1usize, 7, 64, 1000, 1 << 20] {
                let mut h = Xxh3::new();
                for c in d.chunks(piece) {
                    h.update(c);
                }
                assert_eq!(h.digest(), h64, "{n} bytes in pieces of {piece}");
            }
        }
    }
}
