//! LZ4 block compression, with two interchangeable implementations.
//!
//! Both produce and accept the standard LZ4 *block* format, so either side of a stream may use
//! either one, and both do the same compression work (greedy LZ4 at acceleration 1, what `lz4 -1`
//! does; on the phantom the ratios differ by 0.2%: 1.861 vs 1.864). Which is faster on this
//! project's data was decided by measurement: `loci bench stream --codec-only` (and every
//! `loci bench stream` run) compresses and decompresses 8 phantom projections (88 MB) on one core
//! with both, alternating every repetition, and prints the time ratio (docs/stream.md).
//! Under load (eight runs at load 4 to 13) the two traded places (`lz4_flex` ahead in 7 of 9, by a
//! median 3%). On the quiet 2-core machine (2026-11-22, load below 2, four runs of 5 repetitions)
//! the C library was ahead in every run: compression 1.00x-1.12x faster (e.g. 614 vs 581 MB/s),
//! decompression 1.01x-1.12x (2.4 vs 2.2 GB/s). Quiet runs decide, so the default is
//! [`Codec::Lz4C`]; `lz4_flex` stays selectable (`codec = "lz4-flex"`).

use serde::{Deserialize, Serialize};

/// An LZ4 block codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Codec {
    /// The reference C library (`liblz4` through the `lz4` crate), `LZ4_compress_default`
    /// (the same as `lz4 -1`); the default, a few per cent faster on the phantom in every quiet
    /// `loci bench stream --codec-only` run (see the module doc).
    #[default]
    Lz4C,
    /// The pure-Rust `lz4_flex` crate (unsafe fast paths, bounds-checked decoding).
    Lz4Flex,
}

/// A codec failed: the data did not fit, or a compressed block was malformed.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("{codec:?}: compression failed: {msg}")]
    Compress { codec: Codec, msg: String },
    #[error("{codec:?}: malformed compressed block: {msg}")]
    Decompress { codec: Codec, msg: String },
    #[error("decompressed {got} bytes, the frame said {want}")]
    Size { got: usize, want: usize },
    #[error("stored (uncompressed) payload of {got} bytes for a chunk of {want} raw bytes")]
    Stored { got: usize, want: usize },
}

impl Codec {
    /// All codecs, for benchmarks and tests.
    pub const ALL: [Codec; 2] = [Codec::Lz4C, Codec::Lz4Flex];

    /// Short name (`lz4-c`, `lz4-flex`), as in configs.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Lz4C => "lz4-c",
            Codec::Lz4Flex => "lz4-flex",
        }
    }

    /// Worst-case compressed size of `raw` input bytes (LZ4's `LZ4_COMPRESSBOUND`).
    pub fn bound(raw: usize) -> usize {
        // The larger of LZ4_COMPRESSBOUND and what lz4_flex asks its output to hold.
        (raw + raw / 255 + 16).max(lz4_flex::block::get_maximum_output_size(raw))
    }

    /// Compresses `src` into `dst` (which must hold [`Codec::bound`] bytes); returns the size.
    pub fn compress(self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        match self {
            Codec::Lz4C => lz4::block::compress_to_buffer(src, None, false, dst).map_err(|e| {
                CodecError::Compress {
                    codec: self,
                    msg: e.to_string(),
                }
            }),
            Codec::Lz4Flex => {
                lz4_flex::block::compress_into(src, dst).map_err(|e| CodecError::Compress {
                    codec: self,
                    msg: e.to_string(),
                })
            }
        }
    }

    /// Decompresses `src` into exactly `dst.len()` bytes. A block that decodes to any other size,
    /// or that is malformed, is an error (never a panic, never a write outside `dst`).
    pub fn decompress(self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let want = dst.len();
        let got = match self {
            Codec::Lz4C => {
                let size = i32::try_from(want).map_err(|_| CodecError::Decompress {
                    codec: self,
                    msg: format!("{want} bytes is beyond the C library's limit"),
                })?;
                lz4::block::decompress_to_buffer(src, Some(size), dst).map_err(|e| {
                    CodecError::Decompress {
                        codec: self,
                        msg: e.to_string(),
                    }
                })?
            }
            Codec::Lz4Flex => {
                lz4_flex::block::decompress_into(src, dst).map_err(|e| CodecError::Decompress {
                    codec: self,
                    msg: e.to_string(),
                })?
            }
        };
        if got != want {
            return Err(CodecError::Size { got, want });
        }
        Ok(())
    }
}

impl std::str::FromStr for Codec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lz4-c" | "lz4" => Ok(Codec::Lz4C),
            "lz4-flex" => Ok(Codec::Lz4Flex),
            _ => Err(format!("unknown codec {s:?} (valid: lz4-c, lz4-flex)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` bytes of projection `frame` of a phantom.
    fn phantom(len: usize, seed: u64, w: usize, h: usize, frame: u64) -> Vec<u8> {
        let mut data = vec![0u8; len];
        crate::phantom::Phantom::new(seed, w, h).fill(frame, &mut data);
        data
    }

    /// The block `codec` compresses `data` into.
    fn block(codec: Codec, data: &[u8]) -> Vec<u8> {
        let mut c = vec![0u8; Codec::bound(data.len())];
        let n = codec.compress(data, &mut c).unwrap();
        c.truncate(n);
        c
    }

    #[test]
    fn both_codecs_roundtrip_and_interoperate() {
        let data = phantom(300_000, 7, 400, 375, 3);
        for a in Codec::ALL {
            let c = block(a, &data);
            assert!(c.len() < data.len(), "{a:?} did not compress the phantom");
            for b in Codec::ALL {
                let mut out = vec![0u8; data.len()];
                b.decompress(&c, &mut out).unwrap();
                assert_eq!(out, data, "{a:?} -> {b:?}");
            }
        }
    }

    #[test]
    fn corrupt_blocks_are_errors_not_panics() {
        let data = phantom(100_000, 1, 250, 200, 0);
        for codec in Codec::ALL {
            let c = block(codec, &data);
            let n = c.len();
            let mut out = vec![0u8; data.len()];
            // Truncated block.
            assert!(codec.decompress(&c[..n / 2], &mut out).is_err());
            // Wrong expected size.
            let mut short = vec![0u8; data.len() - 1];
            assert!(codec.decompress(&c[..n], &mut short).is_err());
            // Garbage must never panic (it may or may not decode to the right size).
            for i in (0..n).step_by(97) {
                let mut bad = c.clone();
                bad[i] ^= 0xff;
                let _ = codec.decompress(&bad, &mut out);
            }
        }
    }
}
