//! Two-pass radix partitioning of a table into node-homed partitions of packed rows
//! (`key << 32 | val` in one u64).
//!
//! Pass 1 counts, per morsel, how many rows go to each partition; a prefix sum gives every
//! (morsel, partition) pair its exact output range; pass 2 scatters. No buffer grows, no lock is
//! taken, and each partition's rows live in one mapping bound to the partition's home node, so
//! the phase that consumes a partition reads local memory (remote traffic happens once, in the
//! scatter, as in radix joins on NUMA machines). Rows keep table order inside a partition.
//!
//! The scatter goes through a small per-partition write-combining buffer (one cache line) so
//! the hot loop touches one line per partition instead of one random store per row.

use crate::exec::Exec;
use crate::storage::{map_region, Morsel, Table};
use crate::{EngineError, SendPtr, Trace};

/// Packs a row.
#[inline(always)]
pub fn pack(k: u32, v: u32) -> u64 {
    (k as u64) << 32 | v as u64
}

/// Key of a packed row.
#[inline(always)]
pub fn key_of(x: u64) -> u32 {
    (x >> 32) as u32
}

/// Value of a packed row.
#[inline(always)]
pub fn val_of(x: u64) -> u32 {
    x as u32
}

/// The 64-bit multiplicative hash used by partitioning and hash tables (Fibonacci hashing: the
/// top bits are well mixed).
#[inline(always)]
pub fn hash(k: u32) -> u64 {
    (k as u64 ^ 0x5bd1_e995).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Which partition a key goes to.
pub trait PartFn: Sync {
    /// Number of partitions.
    fn parts(&self) -> usize;
    /// Partition of `k`, below `parts()`.
    fn part(&self, k: u32) -> usize;
}

/// Range partitioning: `(k - min) >> shift` (keys in one partition form a key range; order of
/// partitions is key order). Built by [`RangePart::new`], which checks the range.
#[derive(Debug, Clone, Copy)]
pub struct RangePart {
    min: u32,
    shift: u32,
    parts: usize,
}

impl RangePart {
    /// Partitions of `2^shift` keys covering `[min, max]` (`min <= max`, `shift` below 32).
    pub fn new(min: u32, max: u32, shift: u32) -> Result<RangePart, EngineError> {
        if min > max || shift >= 32 {
            return Err(EngineError::Invalid(format!(
                "range partitioning of keys {min}..={max} by 2^{shift}: give min <= max and a shift of 0 to 31"
            )));
        }
        let parts = (((max - min) as u64 >> shift) + 1) as usize;
        Ok(RangePart { min, shift, parts })
    }
}

impl PartFn for RangePart {
    fn parts(&self) -> usize {
        self.parts
    }
    #[inline(always)]
    fn part(&self, k: u32) -> usize {
        (k.wrapping_sub(self.min) >> self.shift) as usize
    }
}

/// Hash partitioning on the top `bits` bits of [`hash`]. Built by [`HashPart::new`].
#[derive(Debug, Clone, Copy)]
pub struct HashPart {
    bits: u32,
}

impl HashPart {
    /// The most bits: 2^20 partitions (a histogram row per morsel is 4 bytes per partition).
    pub const MAX_BITS: u32 = 20;

    /// `2^bits` partitions, `bits` at most [`HashPart::MAX_BITS`].
    pub fn new(bits: u32) -> Result<HashPart, EngineError> {
        if bits > Self::MAX_BITS {
            return Err(EngineError::Invalid(format!(
                "hash partitioning into 2^{bits} partitions: give 0 to {} bits",
                Self::MAX_BITS
            )));
        }
        Ok(HashPart { bits })
    }
}

impl PartFn for HashPart {
    fn parts(&self) -> usize {
        1 << self.bits
    }
    #[inline(always)]
    fn part(&self, k: u32) -> usize {
        if self.bits == 0 {
            0
        } else {
            (hash(k) >> (64 - self.bits)) as usize
        }
    }
}

/// The partitions of one table: rows of type `T` (packed `u64` for 32-bit tables).
pub struct Partitioned<T = u64> {
    regions: Vec<Option<loci_place::NodeRegion>>,
    /// (region index, first element, length) per partition.
    parts: Vec<(usize, usize, usize)>,
    /// Home node of each partition.
    pub homes: Vec<Option<u32>>,
    /// Which node read each input morsel (histogram pass, then scatter pass).
    pub trace: Trace,
    _rows: std::marker::PhantomData<T>,
}

impl<T: Copy> Partitioned<T> {
    /// Number of partitions.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// True when there are no partitions.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Rows of partition `p`.
    pub fn part(&self, p: usize) -> &[T] {
        let (r, start, len) = self.parts[p];
        if len == 0 {
            return &[];
        }
        let reg = self.regions[r]
            .as_ref()
            .expect("non-empty partitions have a region");
        // SAFETY: the range was fully written by pass 2 (exact counts) and lies in the region.
        unsafe { std::slice::from_raw_parts((reg.as_ptr() as *const T).add(start), len) }
    }

    /// Largest partition, in rows.
    pub fn max_len(&self) -> usize {
        self.parts.iter().map(|p| p.2).max().unwrap_or(0)
    }
}

/// Home node of partition `p` of `n`: contiguous shares over the nodes, so partitions that are
/// neighbours in key space (range partitioning) share a node.
pub fn part_home(nodes: &[u32], p: usize, n: usize) -> u32 {
    nodes[p * nodes.len() / n.max(1)]
}

/// Partitions `table` by `f` on the executor's workers. A key `f` puts at or beyond
/// `f.parts()` (a key outside a [`RangePart`]'s range) is an error.
pub fn partition<F: PartFn>(exec: &Exec, table: &Table, f: &F) -> Result<Partitioned, EngineError> {
    partition_rows(
        exec,
        table,
        f.parts(),
        |mo, h| {
            // Out-of-range partitions are left uncounted; the scatter pass reports them.
            for &k in mo.keys() {
                if let Some(c) = h.get_mut(f.part(k)) {
                    *c += 1;
                }
            }
        },
        |mo, sink| {
            for (&k, &v) in mo.keys().iter().zip(mo.vals()) {
                sink.push(f.part(k), pack(k, v));
            }
        },
    )
}

/// Rows per write-combining buffer of the scatter.
const WC: usize = 8;

/// Where the scatter of one morsel writes: per partition a small write-combining buffer, the
/// next output slot and the end of the slots the histogram reserved.
pub struct Sink<'a, T> {
    buf: &'a mut [[T; WC]],
    fill: &'a mut [u8],
    pos: &'a mut [usize],
    end: &'a [usize],
    bases: &'a [SendPtr<T>],
    /// The first partition whose pushes did not match the histogram (those rows are dropped).
    bad: Option<usize>,
}

impl<T: Copy> Sink<'_, T> {
    /// Appends `row` to partition `p`. A row the histogram did not count there (or a partition
    /// out of range) is not written: [`partition_rows`] then returns an error.
    #[inline(always)]
    pub fn push(&mut self, p: usize, row: T) {
        let Some(b) = self.buf.get_mut(p) else {
            self.bad.get_or_insert(p);
            return;
        };
        let n = self.fill[p] as usize;
        b[n] = row;
        if n == WC - 1 {
            if self.pos[p] + WC > self.end[p] {
                self.bad.get_or_insert(p);
            } else {
                // SAFETY: pos[p]..pos[p]+WC lies inside the range reserved for (morsel, p) by
                // the histogram of pass 1 (checked just above); no other morsel writes it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        b.as_ptr(),
                        self.bases[p].ptr().add(self.pos[p]),
                        WC,
                    )
                };
            }
            self.pos[p] += WC;
            self.fill[p] = 0;
        } else {
            self.fill[p] = n as u8 + 1;
        }
    }

    /// Writes the buffered rows; every partition must now have exactly its reserved rows.
    fn flush(&mut self) {
        for p in 0..self.fill.len() {
            let n = self.fill[p] as usize;
            if self.pos[p] + n != self.end[p] {
                self.bad.get_or_insert(p);
                continue;
            }
            if n > 0 {
                // SAFETY: as in `push`, the last n < WC rows of (morsel, p), ending at end[p].
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.buf[p].as_ptr(),
                        self.bases[p].ptr().add(self.pos[p]),
                        n,
                    )
                };
            }
        }
    }
}

/// Partitions `table` into `np` partitions of rows `T`: `count(morsel, hist)` adds each row's
/// partition to `hist` (pass 1), `scatter(morsel, sink)` pushes every row to the same partition
/// (pass 2). Passes that disagree (a row pushed where it was not counted, a counted row never
/// pushed) are an error naming the partition; nothing is written outside the reserved slots.
pub fn partition_rows<T, C, S>(
    exec: &Exec,
    table: &Table,
    np: usize,
    count: C,
    scatter: S,
) -> Result<Partitioned<T>, EngineError>
where
    T: Copy + Default + Send + Sync,
    C: Fn(&Morsel, &mut [u32]) + Sync,
    S: Fn(&Morsel, &mut Sink<'_, T>) + Sync,
{
    let nm = table.morsels.len();
    let nodes = crate::mem_nodes(exec);
    let homes: Vec<Option<u32>> = table.morsels.iter().map(|m| m.home).collect();
    let size = std::mem::size_of::<T>();

    // Pass 1: histogram per morsel.
    let mut hist = vec![0u32; nm * np];
    let hp = SendPtr(hist.as_mut_ptr());
    let counted = exec.for_each(
        &homes,
        || (),
        |_, m| {
            // SAFETY: row m of the histogram belongs to the one task of morsel m.
            let h = unsafe { std::slice::from_raw_parts_mut(hp.ptr().add(m * np), np) };
            count(&table.morsels[m], h);
        },
    );

    // Layout: per node one region holding its partitions back to back; per (morsel, partition)
    // the first output slot.
    let part_node: Vec<usize> = (0..np)
        .map(|p| {
            nodes
                .iter()
                .position(|&n| n == part_home(&nodes, p, np))
                .expect("node")
        })
        .collect();
    let mut totals = vec![0usize; np];
    for m in 0..nm {
        for p in 0..np {
            totals[p] += hist[m * np + p] as usize;
        }
    }
    let mut node_len = vec![0usize; nodes.len()];
    let mut parts = Vec::with_capacity(np);
    for p in 0..np {
        let r = part_node[p];
        parts.push((r, node_len[r], totals[p]));
        node_len[r] += totals[p];
    }
    // Partition region i is part i of the plan's `partitions` region (bound to node i).
    let plan = exec.plan().region(crate::exec::PARTITIONS);
    let mut regions = Vec::with_capacity(nodes.len());
    for (i, &len) in node_len.iter().enumerate() {
        regions.push(if len == 0 {
            None
        } else {
            Some(map_region(len * size, &plan.part(i, nodes.len()))?)
        });
    }
    // starts[m * np + p]: first slot of morsel m's rows of partition p (element offset inside the
    // partition's region).
    let mut starts = vec![0usize; nm * np];
    for p in 0..np {
        let mut at = parts[p].1;
        for m in 0..nm {
            starts[m * np + p] = at;
            at += hist[m * np + p] as usize;
        }
    }
    let bases: Vec<SendPtr<T>> = (0..np)
        .map(|p| {
            SendPtr(
                regions[part_node[p]]
                    .as_ref()
                    .map(|r| r.as_ptr() as *mut T)
                    .unwrap_or(std::ptr::null_mut()),
            )
        })
        .collect();

    // Pass 2: scatter through write-combining buffers (per worker).
    type ScatterState<T> = (Vec<[T; WC]>, Vec<u8>, Vec<usize>, Vec<usize>, Option<usize>);
    let scattered = exec.for_each(
        &homes,
        || {
            (
                vec![[T::default(); WC]; np],
                vec![0u8; np],
                vec![0usize; np],
                vec![0usize; np],
                None,
            )
        },
        |(buf, fill, pos, end, bad): &mut ScatterState<T>, m| {
            let row = m * np..(m + 1) * np;
            pos.copy_from_slice(&starts[row.clone()]);
            for ((e, &s), &h) in end.iter_mut().zip(&starts[row.clone()]).zip(&hist[row]) {
                *e = s + h as usize;
            }
            fill.iter_mut().for_each(|x| *x = 0);
            let mut sink = Sink {
                buf,
                fill,
                pos,
                end,
                bases: &bases,
                bad: None,
            };
            scatter(&table.morsels[m], &mut sink);
            sink.flush();
            if bad.is_none() {
                *bad = sink.bad;
            }
        },
    );
    if let Some(p) = scattered.states.iter().find_map(|s| s.4) {
        return Err(EngineError::Invalid(format!(
            "partitioning into {np} partitions: the rows pushed to partition {p} are not the rows counted for it (a partition function must give every row the same partition below {np} in both passes)"
        )));
    }
    let trace = counted.trace.and(scattered.trace);
    Ok(Partitioned {
        regions,
        parts,
        homes: (0..np).map(|p| Some(part_home(&nodes, p, np))).collect(),
        trace,
        _rows: std::marker::PhantomData,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::flat_topology;
    use crate::{Sched, Strategy};

    fn exec() -> Exec {
        Exec::new(&flat_topology(), Sched::Las, Strategy::os(), Some(1)).unwrap()
    }

    /// Keys 0..rows, in morsels of 100 rows.
    fn table(rows: u32) -> Table {
        let keys: Vec<u32> = (0..rows).collect();
        Table::from_rows(&keys, &keys, 100).unwrap()
    }

    #[test]
    fn partition_functions_refuse_impossible_ranges() {
        let e = RangePart::new(9, 3, 0).unwrap_err().to_string();
        assert!(e.contains("keys 9..=3") && e.contains("min <= max"), "{e}");
        let e = RangePart::new(0, 3, 32).unwrap_err().to_string();
        assert!(e.contains("shift of 0 to 31"), "{e}");
        assert_eq!(RangePart::new(0, u32::MAX, 31).unwrap().parts(), 2);
        assert_eq!(RangePart::new(5, 5, 0).unwrap().parts(), 1);
        let e = HashPart::new(21).unwrap_err().to_string();
        assert!(e.contains("2^21") && e.contains("0 to 20 bits"), "{e}");
        assert_eq!(HashPart::new(0).unwrap().parts(), 1);
    }

    #[test]
    fn rows_land_in_their_partitions_in_table_order() {
        let ex = exec();
        let t = table(1000);
        let f = RangePart::new(0, 999, 8).unwrap();
        let parts = partition(&ex, &t, &f).unwrap();
        assert_eq!(parts.len(), 4);
        for p in 0..4 {
            let keys: Vec<u32> = parts.part(p).iter().map(|&x| key_of(x)).collect();
            let want: Vec<u32> = (p as u32 * 256..((p as u32 + 1) * 256).min(1000)).collect();
            assert_eq!(keys, want, "partition {p}");
        }
    }

    #[test]
    fn keys_outside_the_range_and_disagreeing_passes_are_errors() {
        let ex = exec();
        let t = table(1000);
        // Keys 500..999 fall beyond a range that ends at 499.
        let f = RangePart::new(0, 499, 8).unwrap();
        let e = partition(&ex, &t, &f).err().unwrap().to_string();
        assert!(
            e.contains("into 2 partitions") && e.contains("partition"),
            "{e}"
        );
        // The scatter puts every row in partition 0, the count spreads them over 4: more rows
        // than partition 0's slots, none for the others. Nothing is written outside them.
        let e = partition_rows::<u64, _, _>(
            &ex,
            &t,
            4,
            |mo, h| {
                for &k in mo.keys() {
                    h[k as usize % 4] += 1;
                }
            },
            |mo, sink| {
                for &k in mo.keys() {
                    sink.push(0, k as u64);
                }
            },
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("not the rows counted"), "{e}");
        // A counted row never pushed.
        let e = partition_rows::<u64, _, _>(
            &ex,
            &t,
            2,
            |mo, h| h[1] += mo.keys().len() as u32,
            |mo, sink| {
                for &k in mo.keys().iter().skip(1) {
                    sink.push(1, k as u64);
                }
            },
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("partition 1"), "{e}");
        // A partition beyond the count.
        let e = partition_rows::<u64, _, _>(&ex, &t, 2, |_, _| {}, |_, sink| sink.push(7, 0))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("partition 7"), "{e}");
    }
}
