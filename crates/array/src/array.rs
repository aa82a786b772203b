//! A dense chunked array with its data: one mapping (the arena) holding every chunk at a
//! page-aligned offset, so each chunk's pages can be given their own home node with `mbind` and
//! large arrays can use transparent huge pages.

use std::ops::Range;

use loci_topo::Topology;

use crate::error::ArrayError;
use crate::layout::{Bounds, Layout, PerDim};
use crate::mem::{chunk_homes, Home, Region};
use crate::pin::{self, run_pinned};
use loci_place::MemPolicy;
use loci_place::Plan;

/// One chunk: its cells (C order over its own shape), one attribute after the other.
pub struct Chunk {
    /// Where its pages live (planned by policy, or the node of the thread that first touched it).
    pub home: Home,
    /// The chunk's cells in array coordinates.
    pub bounds: Bounds,
    /// Byte offset of the chunk in the arena (page aligned) and its length.
    pub(crate) offset: usize,
    pub(crate) len: usize,
    /// Byte offset of each attribute in the chunk.
    pub(crate) attr_off: PerDim<usize>,
}

impl Chunk {
    /// Number of cells.
    pub fn cells(&self) -> usize {
        self.bounds.iter().map(|r| r.end - r.start).product()
    }

    /// Shape (extent along each dimension).
    pub fn shape(&self) -> Vec<usize> {
        self.bounds.iter().map(|r| r.end - r.start).collect()
    }

    /// Byte offset of the chunk in its array's arena, and its length.
    pub fn extent(&self) -> (usize, usize) {
        (self.offset, self.len)
    }
}

/// Mutable view of one chunk while it is being filled by a generator.
pub struct ChunkFill<'a> {
    /// The chunk's id.
    pub id: usize,
    /// The chunk's cells in array coordinates.
    pub bounds: &'a [Range<usize>],
    layout: &'a Layout,
    bytes: &'a mut [u8],
    attr_off: &'a [usize],
}

impl ChunkFill<'_> {
    /// The array's layout.
    pub fn layout(&self) -> &Layout {
        self.layout
    }

    /// The bytes of attribute `a` (C order over the chunk's shape).
    pub fn attr_mut(&mut self, a: usize) -> &mut [u8] {
        let cells: usize = self.bounds.iter().map(|r| r.end - r.start).product();
        let n = cells * self.layout.attrs[a].dtype.size();
        let off = self.attr_off[a];
        &mut self.bytes[off..off + n]
    }

    /// Fills every attribute cell by cell with `f(attr, cell)` converted to the attribute's type.
    /// Simple and slow (a closure call per cell): meant for tests and small arrays.
    pub fn fill_with(&mut self, f: &dyn Fn(usize, &[usize]) -> f64) {
        let shape: Vec<usize> = self.bounds.iter().map(|r| r.end - r.start).collect();
        let origin: Vec<usize> = self.bounds.iter().map(|r| r.start).collect();
        for a in 0..self.layout.attrs.len() {
            let t = self.layout.attrs[a].dtype;
            let sz = t.size();
            let out = self.attr_mut(a);
            let mut cell = origin.clone();
            for (i, slot) in out.chunks_exact_mut(sz).enumerate() {
                let mut rest = i;
                for d in (0..shape.len()).rev() {
                    cell[d] = origin[d] + rest % shape[d];
                    rest /= shape[d];
                }
                t.encode(f(a, &cell), slot);
            }
        }
    }
}

/// How an array is built.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Home nodes of the chunks: loci-place's policy, chunk `i` of `n` on part `i` of its plan
    /// (see [`crate::mem::chunk_homes`]).
    pub mem: MemPolicy,
    /// Generator threads: chunks are dealt to them in contiguous blocks (thread `t` of `T` fills
    /// chunks `t*C/T .. (t+1)*C/T`), so with first touch a chunk lands on its generator's node.
    pub plan: Plan,
    /// Ask for transparent huge pages (`madvise`).
    pub huge_pages: bool,
}

impl BuildOptions {
    /// First touch, `threads` unpinned generator threads on `topo`, no huge pages.
    pub fn first_touch(topo: &Topology, threads: usize) -> Result<Self, ArrayError> {
        Ok(Self {
            mem: MemPolicy::FirstTouch,
            plan: pin::unpinned(topo, threads.max(1))?,
            huge_pages: false,
        })
    }
}

/// A dense N-dimensional array split into chunks.
pub struct Array {
    layout: Layout,
    arena: Region,
    /// Invariant: offsets are page aligned, increasing with the id, and ranges do not overlap.
    chunks: Vec<Chunk>,
}

impl Array {
    /// Maps every chunk, places it by `opts.mem`, and fills it in parallel on the generator
    /// threads with `fill`. `topo` maps the generator's cpu to a node (recorded as the home of
    /// first-touched chunks).
    pub fn build(
        layout: Layout,
        opts: &BuildOptions,
        topo: &Topology,
        fill: impl Fn(&mut ChunkFill<'_>) + Sync,
    ) -> Result<Self, ArrayError> {
        pin::check(&opts.plan, topo)?;
        let homes = chunk_homes(&opts.mem, topo, layout.chunk_count())?;
        let (mut arena, mut chunks) =
            Self::map_chunks(&layout, opts.huge_pages, |i| homes[i].clone())?;
        for c in &chunks {
            arena.place(c.offset, c.len, &c.home)?;
        }
        // Disjoint mutable slices of the arena, one per chunk (offsets increase with the id).
        let mut slices: Vec<&mut [u8]> = Vec::with_capacity(chunks.len());
        let mut rest: &mut [u8] = arena.as_mut_slice();
        let mut at = 0;
        for c in &chunks {
            let (_, tail) = rest.split_at_mut(c.offset - at);
            let (mine, tail) = tail.split_at_mut(c.len);
            slices.push(mine);
            rest = tail;
            at = c.offset + c.len;
        }
        let threads = opts.plan.threads.len();
        let n = chunks.len();
        // Contiguous blocks of chunks per generator thread; each thread gets exclusive `&mut`.
        #[allow(clippy::type_complexity)]
        let mut blocks: Vec<std::sync::Mutex<Vec<(usize, &mut Chunk, &mut [u8])>>> = (0..threads)
            .map(|_| std::sync::Mutex::new(Vec::new()))
            .collect();
        for (i, (c, bytes)) in chunks.iter_mut().zip(slices).enumerate() {
            let t = i * threads / n.max(1);
            blocks[t]
                .get_mut()
                .expect("not poisoned")
                .push((i, c, bytes));
        }
        let layout_ref = &layout;
        let fill = &fill;
        let blocks_ref = &blocks;
        run_pinned(&opts.plan, |t| {
            let mine = std::mem::take(&mut *blocks_ref[t].lock().expect("not poisoned"));
            for (id, c, bytes) in mine {
                let touched = loci_place::sys::current_cpu()
                    .ok()
                    .and_then(|cpu| topo.node_of_cpu(cpu));
                let mut f = ChunkFill {
                    id,
                    bounds: &c.bounds,
                    layout: layout_ref,
                    bytes,
                    attr_off: &c.attr_off,
                };
                fill(&mut f);
                if c.home == Home::Unknown {
                    if let Some(node) = touched {
                        c.home = Home::Node(node);
                    }
                }
            }
        })?;
        drop(blocks);
        Ok(Self {
            layout,
            arena,
            chunks,
        })
    }

    /// Maps (but does not touch) an arena for every chunk of `layout`, chunks at page-aligned
    /// offsets in id order.
    pub(crate) fn map_chunks(
        layout: &Layout,
        huge: bool,
        home: impl Fn(usize) -> Home,
    ) -> Result<(Region, Vec<Chunk>), ArrayError> {
        let (at, chunks) = Self::plan_chunks(layout, home);
        Ok((Region::map(at, huge)?, chunks))
    }

    /// The chunks of `layout` at page-aligned offsets in id order, and the bytes they span.
    pub(crate) fn plan_chunks(
        layout: &Layout,
        home: impl Fn(usize) -> Home,
    ) -> (usize, Vec<Chunk>) {
        let ps = loci_place::sys::page_size();
        let mut at = 0;
        let chunks: Vec<Chunk> = (0..layout.chunk_count())
            .map(|i| {
                let bounds = layout.chunk_box(i);
                let cells = bounds.iter().map(|r| r.end - r.start).product();
                let (attr_off, bytes) = layout.attr_offsets(cells);
                let c = Chunk {
                    home: home(i),
                    bounds,
                    offset: at,
                    len: bytes,
                    attr_off,
                };
                at += bytes.next_multiple_of(ps);
                c
            })
            .collect();
        (at, chunks)
    }

    pub(crate) fn from_parts(layout: Layout, arena: Region, chunks: Vec<Chunk>) -> Self {
        Self {
            layout,
            arena,
            chunks,
        }
    }

    /// The mapping that holds every chunk.
    pub fn arena(&self) -> &Region {
        &self.arena
    }

    /// Builds an array cell by cell from `f(attr, cell)` on one unpinned thread, first touch.
    /// Simple and slow: for tests and small arrays.
    pub fn from_fn(
        layout: Layout,
        topo: &Topology,
        f: impl Fn(usize, &[usize]) -> f64 + Sync,
    ) -> Result<Self, ArrayError> {
        Self::build(layout, &BuildOptions::first_touch(topo, 1)?, topo, |c| {
            c.fill_with(&f)
        })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// Bytes of data (cells times cell bytes, without padding).
    pub fn data_bytes(&self) -> usize {
        self.layout.cells() * self.layout.cell_bytes()
    }

    /// The bytes of attribute `a` of chunk `c`.
    pub fn attr_bytes(&self, c: usize, a: usize) -> &[u8] {
        let ch = &self.chunks[c];
        let n = ch.cells() * self.layout.attrs[a].dtype.size();
        &self.arena.as_slice()[ch.offset + ch.attr_off[a]..ch.offset + ch.attr_off[a] + n]
    }

    /// The raw bytes of one cell of attribute `a`. `cell` must be inside the array.
    pub fn cell_bytes(&self, a: usize, cell: &[usize]) -> &[u8] {
        let (c, local) = self.layout.locate(cell);
        let shape = self.chunks[c].shape();
        let idx = local
            .iter()
            .zip(&shape)
            .fold(0, |acc, (&x, &n)| acc * n + x);
        let sz = self.layout.attrs[a].dtype.size();
        &self.attr_bytes(c, a)[idx * sz..(idx + 1) * sz]
    }

    /// One cell of attribute `a` as `f64`.
    pub fn get(&self, a: usize, cell: &[usize]) -> f64 {
        self.layout.attrs[a].dtype.decode(self.cell_bytes(a, cell))
    }

    /// Attribute `a` of the whole array in C order, as one contiguous buffer (for peers and
    /// checksums).
    pub fn to_dense(&self, a: usize) -> Vec<u8> {
        let sz = self.layout.attrs[a].dtype.size();
        let shape = self.layout.shape();
        let mut out = vec![0u8; self.layout.cells() * sz];
        let full: Bounds = shape.iter().map(|&n| 0..n).collect();
        for (c, inter) in self.layout.intersecting(&full) {
            let src = self.attr_bytes(c, a);
            let cshape = self.chunks[c].shape();
            // Rows along the last dimension are contiguous in both.
            let last = shape.len() - 1;
            let row = cshape[last];
            let rows = self.chunks[c].cells() / row.max(1);
            for r in 0..rows {
                let mut rest = r;
                let mut cell = vec![0; shape.len()];
                for d in (0..last).rev() {
                    cell[d] = inter[d].start + rest % cshape[d];
                    rest /= cshape[d];
                }
                cell[last] = inter[last].start;
                let dst = cell.iter().zip(&shape).fold(0, |acc, (&x, &n)| acc * n + x);
                out[dst * sz..(dst + row) * sz]
                    .copy_from_slice(&src[r * row * sz..(r + 1) * row * sz]);
            }
        }
        out
    }

    /// Node of a sample of pages of every chunk (`samples` spread evenly over each region):
    /// the truth behind [`Chunk::home`]. Entries are node ids or `-errno`.
    pub fn page_nodes(&self, samples: usize) -> Result<Vec<Vec<i32>>, ArrayError> {
        self.chunks
            .iter()
            .map(|c| {
                let k = samples.max(1);
                let offs: Vec<usize> = (0..k).map(|i| c.offset + i * c.len / k).collect();
                self.arena.nodes_at(&offs)
            })
            .collect()
    }
}
