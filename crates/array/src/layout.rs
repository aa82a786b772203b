//! The shape of a chunked array without its data: dimensions, attributes, and the chunk grid.
//!
//! Chunk grid: along dimension `d` with chunk length `c` and phase `p` (`0 <= p < c`), chunk `k`
//! covers cells `[k*c - p, (k+1)*c - p)` clipped to `[0, len)`. Arrays built from scratch have
//! phase 0; the result of a subarray keeps the source's chunk boundaries (phase = where the box
//! starts inside its first chunk), so every result chunk is exactly one source chunk cut by the
//! box and can be copied as one block from one source chunk.
//!
//! Chunks are numbered in C order over the grid; cells inside a chunk are stored in C order over
//! the chunk's own (clipped) shape, one attribute after the other.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::dtype::DType;
use crate::error::ArrayError;

/// A named dimension with cells `0..len`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dim {
    /// Shared: a subarray's layout names its dimensions without copying the strings.
    pub name: Arc<str>,
    pub len: usize,
}

impl Dim {
    pub fn new(name: &str, len: usize) -> Self {
        Self {
            name: name.into(),
            len,
        }
    }
}

/// A named attribute: every cell of the array holds one value of each attribute.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attr {
    pub name: Arc<str>,
    pub dtype: DType,
}

impl Attr {
    pub fn new(name: &str, dtype: DType) -> Self {
        Self {
            name: name.into(),
            dtype,
        }
    }
}

/// How to split an array into chunks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Chunking {
    /// About this many chunks: the grid is made by handing the prime factors of the count, largest
    /// first, to the outermost dimension that still has room (so a count of 10 on a 3-D volume
    /// gives 10 slabs along the first dimension). The real count can be lower when a dimension is
    /// too short; [`Layout::chunk_count`] says what it became.
    Count(usize),
    /// This many cells per chunk along each dimension (the last chunk of a dimension may be shorter).
    Shape(Vec<usize>),
}

/// Dimensions, attributes and chunk grid of an array.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    pub dims: PerDim<Dim>,
    pub attrs: PerDim<Attr>,
    /// Chunk length along each dimension; each at least 1.
    pub chunk: PerDim<usize>,
    /// Grid phase along each dimension; `phase[d] < chunk[d]`.
    pub phase: PerDim<usize>,
}

/// Inline room for this many dimensions (or attributes) in the small vectors of a layout, a box
/// and a chunk: arrays of up to four dimensions and attributes plan a query without the heap.
pub const INLINE_DIMS: usize = 4;

/// One value per dimension (or attribute), on the stack up to [`INLINE_DIMS`].
pub type PerDim<T> = SmallVec<[T; INLINE_DIMS]>;

/// A box: one half-open range per dimension, `lo..hi`.
pub type Bounds = PerDim<Range<usize>>;

/// Prints a box as `depth=0..10, inline=5..7`.
pub struct ShowBox<'a>(pub &'a Layout, pub &'a [Range<usize>]);

impl fmt::Display for ShowBox<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.1.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let name = self.0.dims.get(i).map(|d| &*d.name).unwrap_or("?");
            write!(f, "{name}={}..{}", r.start, r.end)?;
        }
        Ok(())
    }
}

impl Layout {
    /// Checks names and sizes and resolves the chunking.
    pub fn new(dims: Vec<Dim>, attrs: Vec<Attr>, chunking: &Chunking) -> Result<Self, ArrayError> {
        if dims.is_empty() {
            return Err(ArrayError::Schema(
                "an array needs at least one dimension".into(),
            ));
        }
        if attrs.is_empty() {
            return Err(ArrayError::Schema(
                "an array needs at least one attribute".into(),
            ));
        }
        check_names(
            "dimension",
            &dims.iter().map(|d| &*d.name).collect::<Vec<_>>(),
        )?;
        check_names(
            "attribute",
            &attrs.iter().map(|a| &*a.name).collect::<Vec<_>>(),
        )?;
        // Every cell of every attribute must be addressable: the product of the dimensions
        // times the bytes of a cell must not wrap (the arena would be smaller than the array).
        let cell_bytes: usize = attrs.iter().map(|a| a.dtype.size()).sum();
        let bytes = dims
            .iter()
            .try_fold(cell_bytes, |acc, d| acc.checked_mul(d.len))
            .filter(|&b| b <= isize::MAX as usize);
        if bytes.is_none() {
            return Err(ArrayError::Schema(format!(
                "an array of {} cells of {cell_bytes} bytes is larger than memory can address",
                dims.iter()
                    .map(|d| format!("{}={}", d.name, d.len))
                    .collect::<Vec<_>>()
                    .join(" x ")
            )));
        }
        let chunk = match chunking {
            Chunking::Shape(s) => {
                if s.len() != dims.len() {
                    return Err(ArrayError::Schema(format!(
                        "chunk shape has {} lengths but the array has {} dimensions ({})",
                        s.len(),
                        dims.len(),
                        dims.iter().map(|d| &*d.name).collect::<Vec<_>>().join(", ")
                    )));
                }
                if let Some(i) = s.iter().position(|&c| c == 0) {
                    return Err(ArrayError::Schema(format!(
                        "chunk length along `{}` is 0; it must be at least 1",
                        dims[i].name
                    )));
                }
                s.iter().copied().collect()
            }
            Chunking::Count(n) => {
                if *n == 0 {
                    return Err(ArrayError::Schema("chunk count must be at least 1".into()));
                }
                // Outer dimensions first: give the first dimension as many chunks as it can take
                // (choosing the chunk length whose real count is nearest the wish), then what is
                // still wanted to the next one. Uniform chunk lengths cannot hit every count (100
                // slabs of a 512-cell dimension are 103 slabs of 5), so the result is the nearest.
                let mut want = *n;
                dims.iter()
                    .map(|d| {
                        if want <= 1 || d.len == 0 {
                            return d.len.max(1);
                        }
                        let g = want.min(d.len);
                        let real = |c: usize| d.len.div_ceil(c);
                        let lo = (d.len / g).max(1);
                        let c = [lo, lo + 1]
                            .into_iter()
                            .min_by_key(|&c| real(c).abs_diff(g))
                            .expect("two candidates");
                        want = ((want as f64 / real(c) as f64).round() as usize).max(1);
                        c
                    })
                    .collect()
            }
        };
        Ok(Self {
            phase: smallvec::smallvec![0; dims.len()],
            dims: dims.into(),
            attrs: attrs.into(),
            chunk,
        })
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.dims.len()
    }

    /// Lengths of the dimensions.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().map(|d| d.len).collect()
    }

    /// Number of cells.
    pub fn cells(&self) -> usize {
        self.dims.iter().map(|d| d.len).product()
    }

    /// Bytes of one cell over all attributes.
    pub fn cell_bytes(&self) -> usize {
        self.attrs.iter().map(|a| a.dtype.size()).sum()
    }

    /// Index of the attribute called `name`.
    pub fn attr_index(&self, name: &str) -> Result<usize, ArrayError> {
        self.attrs
            .iter()
            .position(|a| &*a.name == name)
            .ok_or_else(|| {
                ArrayError::Schema(format!(
                    "no attribute `{name}`; attributes: {}",
                    self.attrs
                        .iter()
                        .map(|a| &*a.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// Chunks along each dimension.
    pub fn grid(&self) -> PerDim<usize> {
        self.dims
            .iter()
            .enumerate()
            .map(|(d, dim)| {
                if dim.len == 0 {
                    0
                } else {
                    (dim.len + self.phase[d]).div_ceil(self.chunk[d])
                }
            })
            .collect()
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.grid().iter().product()
    }

    /// Cells `lo..hi` of chunk `k` along dimension `d`.
    pub fn chunk_range(&self, d: usize, k: usize) -> Range<usize> {
        let c = self.chunk[d];
        let lo = (k * c).saturating_sub(self.phase[d]);
        let hi = ((k + 1) * c - self.phase[d]).min(self.dims[d].len);
        lo..hi
    }

    /// Grid coordinates of chunk `id`.
    pub fn chunk_coords(&self, id: usize) -> PerDim<usize> {
        let grid = self.grid();
        let mut rest = id;
        let mut out: PerDim<usize> = smallvec::smallvec![0; grid.len()];
        for d in (0..grid.len()).rev() {
            out[d] = rest % grid[d];
            rest /= grid[d];
        }
        out
    }

    /// Chunk id of grid coordinates.
    pub fn chunk_id(&self, coords: &[usize]) -> usize {
        let grid = self.grid();
        coords
            .iter()
            .zip(&grid)
            .fold(0, |acc, (&c, &g)| acc * g + c)
    }

    /// The cells of chunk `id`.
    pub fn chunk_box(&self, id: usize) -> Bounds {
        self.chunk_coords(id)
            .iter()
            .enumerate()
            .map(|(d, &k)| self.chunk_range(d, k))
            .collect()
    }

    /// Chunk holding a cell, and the cell's coordinates inside that chunk.
    pub fn locate(&self, cell: &[usize]) -> (usize, Vec<usize>) {
        let coords: Vec<usize> = cell
            .iter()
            .enumerate()
            .map(|(d, &x)| (x + self.phase[d]) / self.chunk[d])
            .collect();
        let local = cell
            .iter()
            .enumerate()
            .map(|(d, &x)| x - self.chunk_range(d, coords[d]).start)
            .collect();
        (self.chunk_id(&coords), local)
    }

    /// Byte offset of each attribute inside a chunk of `cells` cells (64-byte aligned), and the
    /// chunk's total bytes.
    pub fn attr_offsets(&self, cells: usize) -> (PerDim<usize>, usize) {
        let mut off = 0;
        let mut out = PerDim::with_capacity(self.attrs.len());
        for a in &self.attrs {
            out.push(off);
            off += (cells * a.dtype.size()).next_multiple_of(64);
        }
        (out, off)
    }

    /// Checks a box against the array: one range per dimension, not reversed, inside the extent.
    pub fn check_box(&self, b: &[Range<usize>]) -> Result<(), ArrayError> {
        if b.len() != self.ndim() {
            return Err(ArrayError::BoxDims {
                got: b.len(),
                want: self.ndim(),
                dims: self
                    .dims
                    .iter()
                    .map(|d| &*d.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        for (d, r) in b.iter().enumerate() {
            let dim = &self.dims[d];
            let why = if r.start > r.end {
                "reversed (start after end)"
            } else if r.end > dim.len {
                "outside the array"
            } else {
                continue;
            };
            return Err(ArrayError::Range {
                dim: dim.name.to_string(),
                lo: r.start,
                hi: r.end,
                len: dim.len,
                why,
            });
        }
        Ok(())
    }

    /// The layout of `subarray(b)`: same names and attributes, lengths of the box, chunk
    /// boundaries kept where the source had them. `b` must have passed [`Layout::check_box`].
    pub fn sub_layout(&self, b: &[Range<usize>]) -> Layout {
        Layout {
            dims: self
                .dims
                .iter()
                .zip(b)
                .map(|(d, r)| Dim {
                    name: d.name.clone(),
                    len: r.end - r.start,
                })
                .collect(),
            attrs: self.attrs.clone(),
            chunk: self.chunk.clone(),
            phase: b
                .iter()
                .enumerate()
                .map(|(d, r)| (r.start + self.phase[d]) % self.chunk[d])
                .collect(),
        }
    }

    /// Range of chunk grid coordinates along each dimension that a (checked, non-empty) box meets.
    pub fn grid_span(&self, b: &[Range<usize>]) -> PerDim<Range<usize>> {
        b.iter()
            .enumerate()
            .map(|(d, r)| {
                if r.start >= r.end {
                    0..0
                } else {
                    (r.start + self.phase[d]) / self.chunk[d]
                        ..(r.end - 1 + self.phase[d]) / self.chunk[d] + 1
                }
            })
            .collect()
    }

    /// Every chunk a (checked) box meets, with the part of the box inside it, in chunk-id order.
    pub fn intersecting(&self, b: &[Range<usize>]) -> Vec<(usize, Bounds)> {
        let span = self.grid_span(b);
        if span.iter().any(|s| s.is_empty()) {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut k: PerDim<usize> = span.iter().map(|s| s.start).collect();
        loop {
            let inter: Bounds = k
                .iter()
                .enumerate()
                .map(|(d, &kd)| {
                    let c = self.chunk_range(d, kd);
                    c.start.max(b[d].start)..c.end.min(b[d].end)
                })
                .collect();
            out.push((self.chunk_id(&k), inter));
            // Next grid coordinate in C order inside the span.
            let mut d = k.len();
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                k[d] += 1;
                if k[d] < span[d].end {
                    break;
                }
                k[d] = span[d].start;
            }
        }
    }
}

/// Every name of `what` (dimensions or attributes) is non-empty and used once.
fn check_names(what: &str, names: &[&str]) -> Result<(), ArrayError> {
    for (i, n) in names.iter().enumerate() {
        if n.is_empty() {
            return Err(ArrayError::Schema(format!("{what} {i} has an empty name")));
        }
        if names[..i].contains(n) {
            return Err(ArrayError::Schema(format!(
                "{what} name `{n}` is used twice"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(n: [usize; 3], ch: Chunking) -> Layout {
        Layout::new(
            vec![
                Dim::new("depth", n[0]),
                Dim::new("inline", n[1]),
                Dim::new("crossline", n[2]),
            ],
            vec![Attr::new("v", DType::F32)],
            &ch,
        )
        .unwrap()
    }

    #[test]
    fn chunk_count_goes_to_outer_dims_first() {
        for (count, grid) in [
            (10, [10, 1, 1]),
            (1000, [512, 2, 1]),
            (100, [103, 1, 1]),
            (1, [1, 1, 1]),
        ] {
            let got = vol([512, 512, 512], Chunking::Count(count)).grid();
            assert_eq!(got[..], grid, "{count} chunks");
        }
        let l = vol([4, 4, 4], Chunking::Count(100));
        assert_eq!(l.grid()[..], [4, 4, 4]);
        assert_eq!(l.chunk_count(), 64);
        assert_eq!(vol([5, 10, 10], Chunking::Count(20)).grid()[..], [5, 4, 1]);
    }

    #[test]
    fn chunk_ranges_tile_each_dimension() {
        let l = vol([10, 7, 3], Chunking::Shape(vec![4, 3, 5]));
        assert_eq!(l.grid()[..], [3, 3, 1]);
        assert_eq!(l.chunk_range(0, 2), 8..10);
        assert_eq!(l.chunk_range(1, 2), 6..7);
        for id in 0..l.chunk_count() {
            assert_eq!(l.chunk_id(&l.chunk_coords(id)), id);
        }
        let (id, local) = l.locate(&[9, 4, 2]);
        assert_eq!(l.chunk_coords(id)[..], [2, 1, 0]);
        assert_eq!(local, vec![1, 1, 2]);
    }

    #[test]
    fn sub_layout_keeps_source_boundaries() {
        let l = vol([10, 7, 3], Chunking::Shape(vec![4, 3, 5]));
        let b = vec![3..10, 1..7, 0..3];
        let s = l.sub_layout(&b);
        let inter = l.intersecting(&b);
        assert_eq!(s.chunk_count(), inter.len());
        for (i, (_, ib)) in inter.iter().enumerate() {
            let shifted: Bounds = ib
                .iter()
                .zip(&b)
                .map(|(r, o)| r.start - o.start..r.end - o.start)
                .collect();
            assert_eq!(s.chunk_box(i), shifted, "result chunk {i}");
        }
    }

    #[test]
    fn bad_boxes_name_the_dimension() {
        let l = vol([10, 7, 3], Chunking::Count(2));
        let e = l
            .check_box(&[0..10, std::ops::Range { start: 5, end: 2 }, 0..3])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("inline") && e.contains("5..2") && e.contains("0..7"),
            "{e}"
        );
        let e = l.check_box(&[0..11, 0..7, 0..3]).unwrap_err().to_string();
        assert!(
            e.contains("depth") && e.contains("0..11") && e.contains("0..10"),
            "{e}"
        );
        #[allow(clippy::single_range_in_vec_init)]
        let e = l.check_box(&[0..1]).unwrap_err().to_string();
        assert!(e.contains("3") && e.contains("crossline"), "{e}");
    }

    #[test]
    fn bad_schemas_are_refused() {
        let d = || vec![Dim::new("x", 4)];
        assert!(Layout::new(
            vec![],
            vec![Attr::new("a", DType::F32)],
            &Chunking::Count(1)
        )
        .is_err());
        assert!(Layout::new(d(), vec![], &Chunking::Count(1)).is_err());
        assert!(Layout::new(d(), vec![Attr::new("a", DType::F32)], &Chunking::Count(0)).is_err());
        let e = Layout::new(
            d(),
            vec![Attr::new("a", DType::F32)],
            &Chunking::Shape(vec![0]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`x`"), "{e}");
        let e = Layout::new(
            vec![Dim::new("x", 1 << 62), Dim::new("y", 1)],
            vec![Attr::new("a", DType::F32)],
            &Chunking::Count(1),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("x=4611686018427387904 x y=1") && e.contains("larger than memory"),
            "{e}"
        );
        let named = |dims: &[&str], attrs: &[&str]| {
            let dims = dims.iter().map(|n| Dim::new(n, 1)).collect();
            let attrs = attrs.iter().map(|n| Attr::new(n, DType::F32)).collect();
            Layout::new(dims, attrs, &Chunking::Count(1)).map(|_| ())
        };
        assert!(named(&["x", "y"], &["a", "b"]).is_ok());
        for (dims, attrs, says) in [
            (
                &["x", "x"][..],
                &["a"][..],
                "dimension name `x` is used twice",
            ),
            (&["x", ""], &["a"], "dimension 1 has an empty name"),
            (&["x"], &["a", "a"], "attribute name `a` is used twice"),
            (&["x"], &["", "a"], "attribute 0 has an empty name"),
        ] {
            let e = named(dims, attrs).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }
}
