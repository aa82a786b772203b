//! The result-buffer pool: memory of dropped `subarray` results, kept (already faulted in) for
//! the next result that wants the same placement, the way an array database keeps a buffer pool
//! for repeated queries.
//!
//! A fresh result mapping pays a page fault and the kernel's zeroing for every page it writes;
//! for a query that copies at memory bandwidth that is most of its time (measured in `loci bench
//! subarray`: a memcpy into a new mapping runs at about half the speed of one into a prefaulted
//! buffer). A pooled buffer's pages are already there.
//!
//! **Placement stays right.** Every pooled buffer carries its [`Binding`]: the node each of its
//! pages was bound to with `mbind(MPOL_BIND)` before it was first touched. A buffer is handed out
//! only for a result whose wanted binding agrees on every byte it uses
//! ([`Binding::serves`]), so the pool never hands memory of one node to a result planned on
//! another: the result then misses and gets a fresh mapping bound where it is planned. Buffers
//! whose placement was not planned (first touch by threads of unknown node) never enter the pool.
//!
//! **Bounded.** The pool holds at most [`BufferPool::cap`] bytes (default: 1 GiB or an eighth of
//! the physical memory, whichever is smaller). Buffers are kept last-in first-out (the most
//! recently used one is the warmest in the caches and TLB); when a returned buffer would exceed
//! the cap, the oldest ones are unmapped; a buffer larger than the cap is unmapped at once.
//!
//! Hand-written rather than a general allocator (mimalloc, jemalloc, glibc's malloc) because
//! those neither know nor keep the NUMA binding of the memory they reuse.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use loci_place::region::NodeRegion;
use serde::{Deserialize, Serialize};

/// The node each page of a buffer is bound to: segments `[start, end) -> node` that cover the
/// buffer from offset 0 without gaps, page aligned, adjacent segments on different nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    segs: Vec<(Range<usize>, u32)>,
}

impl Binding {
    /// Every byte of `0..len` on `node`.
    pub fn node(len: usize, node: u32) -> Self {
        Self {
            segs: if len == 0 {
                Vec::new()
            } else {
                vec![(0..len, node)]
            },
        }
    }

    /// From segment starts (`(offset, node)`, any order; the first segment is stretched to start
    /// at 0, each one ends where the next starts, the last at `len`). Starts at or past `len` are
    /// dropped, adjacent segments on one node merged.
    pub fn from_starts(mut starts: Vec<(usize, u32)>, len: usize) -> Self {
        starts.retain(|&(s, _)| s < len);
        starts.sort_unstable();
        let mut segs: Vec<(Range<usize>, u32)> = Vec::with_capacity(starts.len());
        for (s, n) in starts {
            match segs.last_mut() {
                None => segs.push((0..len, n)),
                Some(last) if last.1 == n => {}
                Some(last) if last.0.start == s => last.1 = n,
                Some(last) => {
                    last.0.end = s;
                    segs.push((s..len, n));
                }
            }
        }
        // Merge neighbours left equal by a start that overwrote a node.
        let mut out: Vec<(Range<usize>, u32)> = Vec::with_capacity(segs.len());
        for (r, n) in segs {
            match out.last_mut() {
                Some(last) if last.1 == n => last.0.end = r.end,
                _ => out.push((r, n)),
            }
        }
        Self { segs: out }
    }

    /// The segments, in address order.
    pub fn segments(&self) -> &[(Range<usize>, u32)] {
        &self.segs
    }

    /// Bytes covered.
    pub fn len(&self) -> usize {
        self.segs.last().map_or(0, |(r, _)| r.end)
    }

    /// Whether nothing is covered.
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// The node of byte `offset`.
    pub fn node_at(&self, offset: usize) -> Option<u32> {
        let i = self.segs.partition_point(|(r, _)| r.end <= offset);
        self.segs
            .get(i)
            .filter(|(r, _)| r.contains(&offset))
            .map(|s| s.1)
    }

    /// Whether a buffer bound like `self` can hold a result that wants `want`: it is at least as
    /// long, and every byte of `want` sits on the same node in both.
    pub fn serves(&self, want: &Binding) -> bool {
        if self.len() < want.len() {
            return false;
        }
        let mut i = 0;
        for (r, n) in &want.segs {
            // Every segment of `self` that overlaps `r` must be on `n`.
            while self.segs[i].0.end <= r.start {
                i += 1;
            }
            let mut j = i;
            while j < self.segs.len() && self.segs[j].0.start < r.end {
                if self.segs[j].1 != *n {
                    return false;
                }
                j += 1;
            }
        }
        true
    }
}

impl fmt::Display for Binding {
    /// `0..4096@0 4096..8192@1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (r, n)) in self.segs.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{}..{}@{n}", r.start, r.end)?;
        }
        Ok(())
    }
}

/// A buffer in the pool, or on loan to a result.
pub(crate) struct Pooled {
    pub(crate) map: NodeRegion,
    pub(crate) binding: Binding,
}

/// Counters of a pool since it was made (or since [`BufferPool::reset_stats`]), and what it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStats {
    /// Results served from a pooled buffer.
    pub hits: u64,
    /// Results with a planned placement that found no pooled buffer to serve them (mapped fresh).
    pub misses: u64,
    /// Results whose placement was not planned (threads of unknown node): mapped fresh, first
    /// touch, never pooled.
    pub bypassed: u64,
    /// Buffers given back by dropped results and kept.
    pub returned: u64,
    /// Buffers unmapped to stay under the cap (oldest first), or at once because larger than it.
    pub evicted: u64,
    /// Bytes and buffers held now.
    pub bytes_held: usize,
    pub buffers_held: usize,
    /// The byte cap now.
    pub cap: usize,
}

impl PoolStats {
    /// The counters of `self` minus those of an earlier snapshot `before` (held bytes and cap as
    /// in `self`).
    pub fn since(&self, before: &PoolStats) -> PoolStats {
        PoolStats {
            hits: self.hits - before.hits,
            misses: self.misses - before.misses,
            bypassed: self.bypassed - before.bypassed,
            returned: self.returned - before.returned,
            evicted: self.evicted - before.evicted,
            ..*self
        }
    }
}

struct Inner {
    /// Oldest first; taken from the back (LIFO).
    free: Vec<Pooled>,
    stats: PoolStats,
}

/// A bounded pool of result buffers, safe to share between threads (one mutex, held only to pick
/// or file a buffer; mapping and unmapping happen outside it).
pub struct BufferPool {
    inner: Mutex<Inner>,
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// A buffer may serve a result at most this many times its size (or 2 MiB more), so that a small
/// result does not sit on a big buffer a big query could use.
const MAX_OVERSIZE: usize = 4;

impl BufferPool {
    /// An empty pool that holds at most `cap` bytes (0: keeps nothing).
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner {
                free: Vec::new(),
                stats: PoolStats {
                    cap,
                    ..Default::default()
                },
            }),
        })
    }

    /// The default cap: 1 GiB or an eighth of the physical memory, whichever is smaller.
    pub fn default_cap() -> usize {
        // SAFETY: sysconf only reads system constants.
        let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
        let phys = if pages > 0 {
            pages as usize * loci_place::sys::page_size()
        } else {
            usize::MAX
        };
        (1usize << 30).min(phys / 8)
    }

    /// The process-wide pool [`crate::SubarrayOptions`] use by default (cap
    /// [`BufferPool::default_cap`]; change it with [`BufferPool::set_cap`]).
    pub fn global() -> &'static Arc<BufferPool> {
        static POOL: OnceLock<Arc<BufferPool>> = OnceLock::new();
        POOL.get_or_init(|| BufferPool::new(Self::default_cap()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The pool's state is consistent after every statement that can panic (none can while
        // the lock is held but an allocation failure), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The byte cap.
    pub fn cap(&self) -> usize {
        self.lock().stats.cap
    }

    /// Sets the byte cap, unmapping the oldest buffers until the pool fits (0 empties it and
    /// keeps nothing from then on).
    pub fn set_cap(&self, cap: usize) {
        let evicted = {
            let mut g = self.lock();
            g.stats.cap = cap;
            Self::trim(&mut g)
        };
        drop(evicted); // unmapped outside the lock
    }

    /// Unmaps every pooled buffer (counters stay).
    pub fn clear(&self) {
        let all = {
            let mut g = self.lock();
            g.stats.bytes_held = 0;
            g.stats.buffers_held = 0;
            std::mem::take(&mut g.free)
        };
        drop(all);
    }

    /// Counters and holdings now.
    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// Zeroes the counters (holdings stay).
    pub fn reset_stats(&self) {
        let mut g = self.lock();
        g.stats = PoolStats {
            cap: g.stats.cap,
            bytes_held: g.stats.bytes_held,
            buffers_held: g.stats.buffers_held,
            ..Default::default()
        };
    }

    /// The most recently returned buffer that serves `want` and is at most [`MAX_OVERSIZE`] times
    /// its size (or 2 MiB more); counts a hit, and a miss when `count_miss` (a caller that will
    /// ask again for another binding does not count its first try).
    pub(crate) fn take(&self, want: &Binding, count_miss: bool) -> Option<Pooled> {
        let limit = want
            .len()
            .saturating_mul(MAX_OVERSIZE)
            .max(want.len().saturating_add(2 << 20));
        let mut g = self.lock();
        let at = g
            .free
            .iter()
            .rposition(|p| p.map.len() <= limit && p.binding.serves(want));
        match at {
            Some(i) => {
                let p = g.free.remove(i);
                g.stats.hits += 1;
                g.stats.bytes_held -= p.map.len();
                g.stats.buffers_held -= 1;
                Some(p)
            }
            None => {
                if count_miss {
                    g.stats.misses += 1;
                }
                None
            }
        }
    }

    /// Counts a result that bypassed the pool (placement not planned).
    pub(crate) fn count_bypass(&self) {
        self.lock().stats.bypassed += 1;
    }

    /// Files a buffer given back by a dropped result; evicts the oldest ones over the cap.
    pub(crate) fn give(&self, p: Pooled) {
        let evicted = {
            let mut g = self.lock();
            if p.map.len() > g.stats.cap {
                g.stats.evicted += 1;
                vec![p]
            } else {
                g.stats.returned += 1;
                g.stats.bytes_held += p.map.len();
                g.stats.buffers_held += 1;
                g.free.push(p);
                Self::trim(&mut g)
            }
        };
        drop(evicted); // unmapped outside the lock
    }

    /// Removes the oldest buffers until the pool fits its cap; the caller unmaps them (drops)
    /// after releasing the lock.
    fn trim(g: &mut Inner) -> Vec<Pooled> {
        let mut n = 0;
        let mut held = g.stats.bytes_held;
        while held > g.stats.cap {
            held -= g.free[n].map.len();
            n += 1;
        }
        let out: Vec<Pooled> = g.free.drain(..n).collect();
        g.stats.bytes_held = held;
        g.stats.buffers_held -= n;
        g.stats.evicted += n as u64;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_merge_and_serve_by_node_per_byte() {
        let b = Binding::from_starts(vec![(8192, 1), (0, 0), (4096, 0), (12288, 1)], 16384);
        assert_eq!(b.segments(), &[(0..8192, 0), (8192..16384, 1)]);
        assert_eq!(b.node_at(8191), Some(0));
        assert_eq!(b.node_at(8192), Some(1));
        assert_eq!(b.node_at(16384), None);
        assert_eq!(b.to_string(), "0..8192@0 8192..16384@1");
        // Two starts at one offset: the later (in sorted order) wins, then equal neighbours merge.
        let c = Binding::from_starts(vec![(0, 1), (4096, 0), (4096, 1)], 8192);
        assert_eq!(c.segments(), &[(0..8192, 1)]);
        // The first segment always starts at 0; starts past the end are dropped.
        let d = Binding::from_starts(vec![(4096, 2), (9999, 3)], 8192);
        assert_eq!(d.segments(), &[(0..8192, 2)]);

        assert!(b.serves(&Binding::node(4096, 0)));
        assert!(b.serves(&Binding::node(8192, 0)));
        assert!(!b.serves(&Binding::node(8193, 0)), "byte 8192 is on node 1");
        assert!(!b.serves(&Binding::node(4096, 1)));
        assert!(b.serves(&b));
        assert!(b.serves(&Binding::from_starts(vec![(0, 0), (8192, 1)], 12288)));
        assert!(!b.serves(&Binding::node(20000, 0)), "too short");
        assert!(!Binding::node(16384, 0).serves(&b));
        assert!(
            b.serves(&Binding::node(0, 5)),
            "an empty want is served by anything"
        );
    }

    fn buf(len: usize, node: u32) -> Pooled {
        let ps = loci_place::sys::page_size();
        let len = len.next_multiple_of(ps);
        Pooled {
            map: NodeRegion::map(len, &loci_place::MemPlan::first_touch(), false).unwrap(),
            binding: Binding::node(len, node),
        }
    }

    #[test]
    fn lifo_by_binding_with_a_size_limit() {
        let pool = BufferPool::new(1 << 30);
        let ps = loci_place::sys::page_size();
        pool.give(buf(4 * ps, 0));
        pool.give(buf(8 * ps, 0));
        pool.give(buf(8 * ps, 1));
        let s = pool.stats();
        assert_eq!((s.returned, s.buffers_held, s.bytes_held), (3, 3, 20 * ps));
        // Node 0, 3 pages: the most recent node-0 buffer (8 pages) serves it.
        let p = pool.take(&Binding::node(3 * ps, 0), true).unwrap();
        assert_eq!((p.map.len(), p.binding.node_at(0)), (8 * ps, Some(0)));
        // Node 2: nothing, never a buffer of another node.
        assert!(pool.take(&Binding::node(ps, 2), true).is_none());
        // Too big for any node-0 buffer left.
        assert!(pool.take(&Binding::node(5 * ps, 0), true).is_none());
        let s = pool.stats();
        assert_eq!((s.hits, s.misses, s.buffers_held), (1, 2, 2));
        // A tiny want is not served by a buffer more than 4x (and 2 MiB) its size.
        let big = 1024 * ps;
        pool.give(buf(big, 3));
        assert!(pool.take(&Binding::node(ps, 3), true).is_none());
        assert!(pool.take(&Binding::node(big / 4, 3), true).is_some());
        pool.give(p);
        pool.clear();
        assert_eq!(pool.stats().bytes_held, 0);
        assert_eq!(pool.stats().buffers_held, 0);
    }

    #[test]
    fn cap_evicts_oldest_first_and_rejects_oversized() {
        let ps = loci_place::sys::page_size();
        let pool = BufferPool::new(10 * ps);
        pool.give(buf(4 * ps, 0)); // oldest
        pool.give(buf(4 * ps, 1));
        pool.give(buf(4 * ps, 2)); // over the cap: the node-0 buffer goes
        let s = pool.stats();
        assert_eq!((s.bytes_held, s.buffers_held, s.evicted), (8 * ps, 2, 1));
        assert!(pool.take(&Binding::node(ps, 0), true).is_none());
        assert!(pool.take(&Binding::node(ps, 1), true).is_some());
        pool.give(buf(11 * ps, 0)); // larger than the cap: unmapped at once
        let s = pool.stats();
        assert_eq!((s.bytes_held, s.buffers_held, s.evicted), (4 * ps, 1, 2));
        pool.set_cap(0);
        assert_eq!(pool.stats().bytes_held, 0);
        pool.give(buf(ps, 0));
        assert_eq!(pool.stats().buffers_held, 0, "cap 0 keeps nothing");
        pool.reset_stats();
        assert_eq!(
            pool.stats(),
            PoolStats {
                cap: 0,
                ..Default::default()
            }
        );
    }

    #[test]
    fn since_subtracts_counters() {
        let a = PoolStats {
            hits: 5,
            misses: 2,
            bytes_held: 10,
            ..Default::default()
        };
        let b = PoolStats {
            hits: 2,
            misses: 1,
            bytes_held: 3,
            ..Default::default()
        };
        let d = a.since(&b);
        assert_eq!((d.hits, d.misses, d.bytes_held), (3, 1, 10));
    }
}
