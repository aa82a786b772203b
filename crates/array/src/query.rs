//! The boxes of the subarray benchmark (seed 000, section IV-A): a query touches one chunk, a
//! fifth of the chunks, or all of them, and selects a given fraction of the cells of the chunks it
//! touches.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{by_name, ArrayError};
use crate::layout::{Bounds, Layout};

/// Which chunks a query touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Span {
    /// The middle chunk only.
    One,
    /// The first fifth of the chunks along the first dimension that has at least two chunks.
    Fifth,
    /// Every chunk.
    All,
}

impl Span {
    pub const CHOICES: &'static str = "one, fifth, all";
    const ALL: [Span; 3] = [Span::One, Span::Fifth, Span::All];

    const fn name(self) -> &'static str {
        match self {
            Span::One => "one",
            Span::Fifth => "fifth",
            Span::All => "all",
        }
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Span {
    type Err = ArrayError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        by_name(&Span::ALL, |x| [x.name()], "span", Span::CHOICES, s).map_err(ArrayError::Parse)
    }
}

/// A benchmark query: its box and what it really touches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Query {
    pub bounds: Bounds,
    /// Chunks the box meets.
    pub chunks: usize,
    /// Cells of the box / cells of the chunks it spans (the selectivity actually reached).
    pub selectivity: f64,
    /// Cells of the box / cells of the array.
    pub fraction: f64,
}

impl Query {
    /// The box for `span` and `selectivity` (in `(0, 1]`) on `layout`.
    ///
    /// The span region `R` is a box of whole chunks (see [`Span`]). The selectivity is then taken
    /// along the dimensions where `R` is one chunk wide (so the box still meets every chunk of
    /// `R`), as `selectivity^(1/k)` of each of those `k` dimensions, centred. When every
    /// dimension of `R` is several chunks wide, it is taken along the dimension with the fewest
    /// chunks, and the box meets fewer chunks than `R` has ([`Query::chunks`] says how many).
    pub fn new(layout: &Layout, span: Span, selectivity: f64) -> Result<Self, ArrayError> {
        if !(selectivity > 0.0 && selectivity <= 1.0) {
            return Err(ArrayError::Parse(format!(
                "selectivity {selectivity} is not in (0, 1]"
            )));
        }
        if layout.cells() == 0 {
            return Err(ArrayError::Parse("the array is empty".into()));
        }
        let grid = layout.grid();
        let mut region: Bounds = layout.dims.iter().map(|d| 0..d.len).collect();
        match span {
            Span::All => {}
            Span::One => region = layout.chunk_box(layout.chunk_count() / 2),
            Span::Fifth => {
                if let Some(d) = grid.iter().position(|&g| g >= 2) {
                    let k = grid[d].div_ceil(5);
                    region[d] = 0..layout.chunk_range(d, k - 1).end;
                }
            }
        }
        let rspan = layout.grid_span(&region);
        let mut free: Vec<usize> = (0..layout.ndim())
            .filter(|&d| rspan[d].len() == 1)
            .collect();
        if free.is_empty() {
            let d = (0..layout.ndim())
                .min_by_key(|&d| rspan[d].len())
                .expect("at least one dimension");
            free.push(d);
        }
        // Short dimensions round badly: leave them whole when a longer free one exists.
        let longest = free.iter().map(|&d| region[d].len()).max().unwrap_or(1);
        free.retain(|&d| region[d].len() >= 16 || region[d].len() == longest);
        free.sort_by_key(|&d| std::cmp::Reverse(region[d].len()));
        let f = selectivity.powf(1.0 / free.len() as f64);
        let total: usize = free.iter().map(|&d| region[d].len()).product();
        let target = total as f64 * selectivity;
        let mut b = region.clone();
        let mut so_far = 1usize;
        for (i, &d) in free.iter().enumerate() {
            let r: &Range<usize> = &region[d];
            let n = r.end - r.start;
            // The last dimension takes whatever is left, so rounding does not add up.
            let want = if i + 1 == free.len() {
                target / so_far as f64
            } else {
                n as f64 * f
            };
            let m = (want.round() as usize).clamp(1, n);
            so_far *= m;
            let lo = r.start + (n - m) / 2;
            b[d] = lo..lo + m;
        }
        let cells = |x: &[Range<usize>]| x.iter().map(|r| r.end - r.start).product::<usize>();
        let spanned: usize = layout
            .intersecting(&b)
            .iter()
            .map(|(c, _)| cells(&layout.chunk_box(*c)))
            .sum();
        Ok(Self {
            chunks: layout.intersecting(&b).len(),
            selectivity: cells(&b) as f64 / spanned.max(1) as f64,
            fraction: cells(&b) as f64 / layout.cells() as f64,
            bounds: b,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{seismic_layout, Chunking, DType};

    #[test]
    fn spans_touch_the_promised_chunks_at_the_promised_selectivity() {
        for count in [1, 10, 100, 1000] {
            let l = seismic_layout([512, 64, 64], DType::F32, &Chunking::Count(count)).unwrap();
            let n = l.chunk_count();
            for s in [0.2, 0.7] {
                let one = Query::new(&l, Span::One, s).unwrap();
                assert_eq!(one.chunks, 1);
                assert!((one.selectivity - s).abs() < 0.05, "{count} {s} {one:?}");
                let all = Query::new(&l, Span::All, s).unwrap();
                assert_eq!(all.chunks, n, "{count} {s} {all:?}");
                assert!((all.selectivity - s).abs() < 0.05, "{count} {s} {all:?}");
                let fifth = Query::new(&l, Span::Fifth, s).unwrap();
                if n >= 5 {
                    let g = l.grid();
                    assert_eq!(fifth.chunks, g[0].div_ceil(5) * g[1] * g[2], "{count} {s}");
                }
                assert!(
                    (fifth.selectivity - s).abs() < 0.05,
                    "{count} {s} {fifth:?}"
                );
                l.check_box(&fifth.bounds).unwrap();
            }
        }
        let l = seismic_layout([8, 8, 8], DType::F32, &Chunking::Count(1)).unwrap();
        assert!(Query::new(&l, Span::All, 0.0).is_err());
        assert!(Query::new(&l, Span::All, 1.5).is_err());
        assert_eq!(Query::new(&l, Span::All, 1.0).unwrap().fraction, 1.0);
        for x in Span::ALL {
            assert_eq!(format!(" {x} ").parse::<Span>().unwrap(), x);
        }
        assert!("most"
            .parse::<Span>()
            .unwrap_err()
            .to_string()
            .contains("one, fifth, all"));
    }
}
