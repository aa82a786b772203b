//! Cell types of array attributes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::by_name;

/// The type of one attribute's cells. Values are stored little-endian in native layout
/// (loci only runs on little-endian Linux targets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F64,
    I32,
    U16,
}

impl DType {
    /// Every type, for tests and `--help`.
    pub const ALL: [DType; 4] = [DType::F32, DType::F64, DType::I32, DType::U16];
    /// Valid spellings, for error messages.
    pub const CHOICES: &'static str = "f32, f64, i32, u16";

    /// Bytes per cell.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 => 8,
            DType::U16 => 2,
        }
    }

    /// The name and its numpy-style alias (`f32`, `float32`).
    const fn names(self) -> [&'static str; 2] {
        match self {
            DType::F32 => ["f32", "float32"],
            DType::F64 => ["f64", "float64"],
            DType::I32 => ["i32", "int32"],
            DType::U16 => ["u16", "uint16"],
        }
    }

    /// The numpy dtype string of the same layout (for the Python peers).
    pub const fn numpy(self) -> &'static str {
        match self {
            DType::F32 => "<f4",
            DType::F64 => "<f8",
            DType::I32 => "<i4",
            DType::U16 => "<u2",
        }
    }

    /// Writes `v` converted to this type (saturating for the integer types, like `as`) into
    /// `out`, which must be exactly [`DType::size`] bytes.
    pub fn encode(self, v: f64, out: &mut [u8]) {
        match self {
            DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.copy_from_slice(&v.to_le_bytes()),
            DType::I32 => out.copy_from_slice(&(v.round() as i32).to_le_bytes()),
            DType::U16 => out.copy_from_slice(&(v.round() as u16).to_le_bytes()),
        }
    }

    /// Reads one cell as `f64` from exactly [`DType::size`] bytes.
    pub fn decode(self, b: &[u8]) -> f64 {
        match self {
            DType::F32 => f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
            DType::F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")),
            DType::I32 => i32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
            DType::U16 => u16::from_le_bytes(b.try_into().expect("2 bytes")) as f64,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.names()[0])
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        by_name(&DType::ALL, DType::names, "cell type", DType::CHOICES, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_roundtrip_every_type() {
        for t in DType::ALL {
            let mut b = vec![0u8; t.size()];
            t.encode(1234.0, &mut b);
            assert_eq!(t.decode(&b), 1234.0, "{t}");
            assert_eq!(t.to_string().parse::<DType>().unwrap(), t);
            assert_eq!(t.names()[1].parse::<DType>().unwrap(), t);
        }
        let mut b = [0u8; 2];
        DType::U16.encode(70000.0, &mut b);
        assert_eq!(DType::U16.decode(&b), 65535.0);
        let e = "f16".parse::<DType>().unwrap_err();
        assert!(e.contains("f16") && e.contains("u16"), "{e}");
    }
}
