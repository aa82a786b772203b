//! When a result is copied inline and when it is written with streaming stores: the defaults of
//! [`SubarrayOptions`]' thresholds and the per-topology streaming threshold.

use loci_topo::{CacheKind, Topology};

use super::SubarrayOptions;

/// Default of [`SubarrayOptions::inline_bytes`]: results smaller than this are copied by the
/// calling thread and its helpers (see [`subarray`](super::subarray())).
pub const INLINE_BYTES: usize = 1 << 20;

/// Default of [`SubarrayOptions::inline_bytes_pooled`]. Into pooled memory (no page faults)
/// handing parts to the plan's workers costs about 19 us a call (a broadcast to the persistent
/// workers of [`run_pinned`](crate::run_pinned)), against a few hundred nanoseconds for the
/// calling thread's spinning helpers ([`crate::team`]); up to here a result is too small for its
/// placement to matter more than that (measured: docs/array.md, the copy team).
pub const INLINE_POOLED_BYTES: usize = 2 << 20;

/// The streaming threshold where the topology reports no cache (or no cache size), for example
/// [`Topology::flat`] or a source without cache data: 8 MiB, a quarter of the 32 MiB L3 of the
/// development machine the threshold was measured on (see [`stream_bytes_for`]).
pub const STREAM_BYTES: usize = 8 << 20;

/// The smallest threshold [`stream_bytes_for`] gives, however small the cache.
pub const MIN_STREAM_BYTES: usize = 64 << 10;

/// The default of [`SubarrayOptions::stream_bytes`]: not a byte count but "a quarter of the largest
/// cache of the topology given to [`subarray`](super::subarray()), at most four times its level 2"
/// ([`stream_bytes_for`]), resolved per call by
/// [`SubarrayOptions::stream_bytes_on`]. No real threshold is lost to it: a result of
/// `usize::MAX - 1` bytes cannot exist, so it would never stream either way.
pub const STREAM_BYTES_AUTO: usize = usize::MAX - 1;

/// Default of [`SubarrayOptions::stream_bytes`]: [`STREAM_BYTES_AUTO`] (see [`stream_bytes_for`]).
pub const fn default_stream_bytes() -> usize {
    STREAM_BYTES_AUTO
}

/// The streaming threshold for `topo`: a quarter of the largest data or unified cache that holds
/// the topology's first cpu (cpu 0 on a live machine), but at most four times its level-2 cache,
/// and at least [`MIN_STREAM_BYTES`]; [`STREAM_BYTES`] when the topology reports no such cache or
/// no size for it. The cache also holds the source lines being read and the previous results of
/// a query stream (the pool hands back recently written buffers), so a result of a quarter of the
/// cache already pushes its own lines out before anyone reads them: they are better written
/// straight to memory. A smaller result is better left in the cache. The cap: a last-level cache
/// shared by many cores (in a virtual machine, by other guests too) keeps far less of one query's
/// result than its size says (measured on a 32 MiB and a 480 MiB L3: docs/array.md, "Streaming
/// stores" and "The streaming threshold capped by the level 2").
pub fn stream_bytes_for(topo: &Topology) -> usize {
    let Some(first) = topo.cpus.first().map(|c| c.id) else {
        return STREAM_BYTES;
    };
    let size = |c: &loci_topo::Cache| usize::try_from(c.size_bytes).unwrap_or(usize::MAX);
    let own = || {
        topo.caches
            .iter()
            .filter(|c| c.kind != CacheKind::Instruction && c.cpus.contains(first))
    };
    let Some(largest) = own().map(size).max().filter(|&b| b > 0) else {
        return STREAM_BYTES;
    };
    let cap = own()
        .filter(|c| c.level == 2)
        .map(size)
        .max()
        .filter(|&b| b > 0)
        .map_or(usize::MAX, |l2| l2.saturating_mul(4));
    (largest / 4).min(cap).max(MIN_STREAM_BYTES)
}

impl SubarrayOptions {
    /// The streaming threshold of a run on `topo`: [`Self::stream_bytes`], or with
    /// [`STREAM_BYTES_AUTO`] the one [`stream_bytes_for`] derives from `topo`'s caches.
    pub fn stream_bytes_on(&self, topo: &Topology) -> usize {
        if self.stream_bytes == STREAM_BYTES_AUTO {
            stream_bytes_for(topo)
        } else {
            self.stream_bytes
        }
    }

    /// Whether a result of `bytes` bytes on `topo` is written with streaming stores.
    pub(super) fn streams(&self, bytes: usize, topo: &Topology) -> bool {
        // Below the smallest automatic threshold the topology's caches need not be looked at.
        if self.stream_bytes == STREAM_BYTES_AUTO && bytes < MIN_STREAM_BYTES {
            return false;
        }
        bytes >= self.stream_bytes_on(topo)
    }
}

#[cfg(test)]
mod tests {
    use loci_topo::CpuSet;

    use super::*;

    /// The streaming threshold comes from the topology's caches: a quarter of the largest data or
    /// unified cache of the first cpu, at most four times its level 2, at least 64 KiB, 8 MiB
    /// with no cache; an explicit threshold is kept as given.
    #[test]
    fn stream_threshold_follows_the_topology_caches() {
        let cpus = CpuSet::parse("0-3").unwrap();
        let mut topo = Topology::flat(cpus.clone(), "test");
        assert_eq!(stream_bytes_for(&topo), STREAM_BYTES);
        let cache = |level, kind, size_bytes, cpus: &str| loci_topo::Cache {
            level,
            kind,
            size_bytes,
            cpus: CpuSet::parse(cpus).unwrap(),
        };
        // No size known: the fallback.
        topo.caches.push(cache(3, CacheKind::Unified, 0, "0-3"));
        assert_eq!(stream_bytes_for(&topo), STREAM_BYTES);
        topo.caches.push(cache(1, CacheKind::Data, 48 << 10, "0"));
        assert_eq!(stream_bytes_for(&topo), MIN_STREAM_BYTES);
        topo.caches.push(cache(2, CacheKind::Unified, 2 << 20, "0"));
        assert_eq!(stream_bytes_for(&topo), 512 << 10);
        // Instruction caches and caches of other cpus do not count.
        topo.caches
            .push(cache(1, CacheKind::Instruction, 64 << 20, "0"));
        topo.caches
            .push(cache(3, CacheKind::Unified, 64 << 20, "2-3"));
        assert_eq!(stream_bytes_for(&topo), 512 << 10);
        topo.caches
            .push(cache(3, CacheKind::Unified, 32 << 20, "0-1"));
        assert_eq!(stream_bytes_for(&topo), 8 << 20);
        // A last-level cache far larger than the level 2: at most four times the level 2.
        let mut huge = topo.clone();
        huge.caches
            .push(cache(3, CacheKind::Unified, 480 << 20, "0-3"));
        assert_eq!(stream_bytes_for(&huge), 8 << 20);
        huge.caches.retain(|c| c.level != 2);
        assert_eq!(
            stream_bytes_for(&huge),
            120 << 20,
            "no level 2 known: no cap"
        );
        huge.caches
            .push(cache(2, CacheKind::Unified, 1 << 20, "0-1"));
        assert_eq!(stream_bytes_for(&huge), 4 << 20);
        huge.caches.push(cache(2, CacheKind::Unified, 8 << 10, "2"));
        assert_eq!(
            stream_bytes_for(&huge),
            4 << 20,
            "another cpu's level 2 does not count"
        );

        let auto = SubarrayOptions::default();
        assert_eq!(auto.stream_bytes, STREAM_BYTES_AUTO);
        assert_eq!(auto.stream_bytes_on(&topo), 8 << 20);
        assert!(!auto.streams((8 << 20) - 1, &topo) && auto.streams(8 << 20, &topo));
        assert!(!auto.streams(MIN_STREAM_BYTES - 1, &Topology::flat(cpus, "t")));
        for fixed in [0, 1 << 20, usize::MAX] {
            let o = SubarrayOptions {
                stream_bytes: fixed,
                ..SubarrayOptions::default()
            };
            assert_eq!(o.stream_bytes_on(&topo), fixed);
        }
        assert!(SubarrayOptions {
            stream_bytes: 0,
            ..SubarrayOptions::default()
        }
        .streams(1, &topo));
    }
}
