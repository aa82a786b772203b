//! W3: hash join of R (build) and S (probe) on key; the output is the match count and the sum
//! of `r.val + s.val` over matches (a payload checksum). Duplicate keys in R are joined like SQL
//! does (every matching pair counts).
//!
//! - [`w3_shared`]: one shared open-addressing table (linear probing, packed `key << 32 | val`
//!   slots, built with compare-and-swap), interleaved over the nodes, probed in batches with
//!   software prefetch. No partitioning pass; every probe is a (likely remote) cache miss.
//! - [`w3_partitioned`]: R and S are radix-partitioned on the hash into node-homed partitions
//!   small enough that a partition's table fits the L2 cache; each node's workers build and probe
//!   their own node's partitions.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::exec::Exec;
use crate::partition::{hash, key_of, pack, partition, val_of, HashPart};
use crate::storage::{map_region, Table};
use crate::{EngineError, Trace};

/// Slot value meaning "empty". A real row `(u32::MAX, u32::MAX)` packs to the same value, so
/// such rows are kept aside in a small list.
const EMPTY: u64 = u64::MAX;

/// Result of a join.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JoinResult {
    /// Number of matching (r, s) pairs.
    pub count: u64,
    /// Sum of `r.val + s.val` over the pairs.
    pub checksum: u64,
}

impl JoinResult {
    fn add(self, o: JoinResult) -> JoinResult {
        JoinResult {
            count: self.count + o.count,
            checksum: self.checksum.wrapping_add(o.checksum),
        }
    }
}

/// How a join ran.
#[derive(Debug, Clone, Default)]
pub struct JoinRun {
    /// Which node read each S morsel (probe side, the bulk of the bytes).
    pub probe_trace: Trace,
}

/// Slots for `n` rows: a power of two at least twice `n`.
fn slots_for(n: usize) -> usize {
    (n.max(1) * 2).next_power_of_two()
}

/// The shared hash table variant.
pub fn w3_shared(exec: &Exec, r: &Table, s: &Table) -> Result<(JoinResult, JoinRun), EngineError> {
    let n = slots_for(r.rows());
    let bits = n.trailing_zeros();
    let region = map_region(n * 8, exec.plan().region(crate::exec::HASH_TABLE))?;
    // SAFETY: the region holds n u64 slots; AtomicU64 has the layout of u64; every slot is
    // initialised below (by the workers, so first touch spreads pages) before any other use.
    let slots: &[AtomicU64] =
        unsafe { std::slice::from_raw_parts(region.as_ptr() as *const AtomicU64, n) };
    // Initialise in one chunk per worker (homeless: dealt over the nodes, like the pages).
    let nw = exec.workers();
    exec.for_each(
        &vec![None; nw],
        || (),
        |_, c| {
            for x in &slots[c * n / nw..(c + 1) * n / nw] {
                x.store(EMPTY, Ordering::Relaxed);
            }
        },
    );
    let idx = |k: u32| (hash(k) >> (64 - bits)) as usize;

    // Build.
    let homes = |t: &Table| t.morsels.iter().map(|m| m.home).collect::<Vec<_>>();
    let built = exec.for_each(&homes(r), Vec::new, |aside: &mut Vec<u32>, m| {
        let mo = &r.morsels[m];
        for (&k, &v) in mo.keys().iter().zip(mo.vals()) {
            let x = pack(k, v);
            if x == EMPTY {
                aside.push(v);
                continue;
            }
            let mut i = idx(k);
            loop {
                match slots[i].compare_exchange(EMPTY, x, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(_) => i = (i + 1) & (n - 1),
                }
            }
        }
    });
    let aside: Vec<u32> = built.states.into_iter().flatten().collect();

    // Probe, 16 rows at a time: hash and prefetch all, then look up all.
    const B: usize = 16;
    let probed = exec.for_each(&homes(s), JoinResult::default, |res, m| {
        let mut at = [0usize; B];
        let mo = &s.morsels[m];
        let (ks, vs) = (mo.keys(), mo.vals());
        for (kc, vc) in ks.chunks(B).zip(vs.chunks(B)) {
            for (j, &k) in kc.iter().enumerate() {
                at[j] = idx(k);
                prefetch(&slots[at[j]]);
            }
            for (j, (&k, &v)) in kc.iter().zip(vc).enumerate() {
                let mut i = at[j];
                loop {
                    let x = slots[i].load(Ordering::Relaxed);
                    if x == EMPTY {
                        break;
                    }
                    if key_of(x) == k {
                        res.count += 1;
                        res.checksum = res.checksum.wrapping_add(val_of(x) as u64 + v as u64);
                    }
                    i = (i + 1) & (n - 1);
                }
                if k == u32::MAX {
                    for &rv in &aside {
                        res.count += 1;
                        res.checksum = res.checksum.wrapping_add(rv as u64 + v as u64);
                    }
                }
            }
        }
    });
    let res = probed
        .states
        .into_iter()
        .fold(JoinResult::default(), JoinResult::add);
    Ok((
        res,
        JoinRun {
            probe_trace: probed.trace,
        },
    ))
}

#[inline(always)]
fn prefetch<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint; any address is allowed, this one is valid anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const T as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Radix bits for the partitioned join: R partitions of about 16K rows (a 32K-slot, 256 KiB
/// table: fits L2), at most 2^12 partitions.
pub fn join_bits(r_rows: usize) -> u32 {
    let mut b = 0;
    while b < 12 && (r_rows >> b) > (1 << 14) {
        b += 1;
    }
    b
}

/// The partitioned (per-node) variant.
pub fn w3_partitioned(
    exec: &Exec,
    r: &Table,
    s: &Table,
) -> Result<(JoinResult, JoinRun), EngineError> {
    let f = HashPart {
        bits: join_bits(r.rows()),
    };
    let pr = partition(exec, r, &f)?;
    let ps = partition(exec, s, &f)?;
    let cap = slots_for(pr.max_len());
    let joined = exec.for_each(
        &pr.homes,
        || (vec![EMPTY; cap], Vec::<u32>::new(), JoinResult::default()),
        |(table, aside, res), p| {
            let rp = pr.part(p);
            let n = slots_for(rp.len());
            let bits = n.trailing_zeros();
            let t = &mut table[..n];
            t.fill(EMPTY);
            aside.clear();
            // The partition's keys share their top `f.bits` hash bits; index with the next ones.
            let idx = |k: u32| ((hash(k) << f.bits) >> (64 - bits)) as usize & (n - 1);
            for &x in rp {
                if x == EMPTY {
                    aside.push(val_of(x));
                    continue;
                }
                let mut i = idx(key_of(x));
                while t[i] != EMPTY {
                    i = (i + 1) & (n - 1);
                }
                t[i] = x;
            }
            for &y in ps.part(p) {
                let k = key_of(y);
                let v = val_of(y) as u64;
                let mut i = idx(k);
                loop {
                    let x = t[i];
                    if x == EMPTY {
                        break;
                    }
                    if key_of(x) == k {
                        res.count += 1;
                        res.checksum = res.checksum.wrapping_add(val_of(x) as u64 + v);
                    }
                    i = (i + 1) & (n - 1);
                }
                if k == u32::MAX {
                    for &rv in aside.iter() {
                        res.count += 1;
                        res.checksum = res.checksum.wrapping_add(rv as u64 + v);
                    }
                }
            }
        },
    );
    let res = joined
        .states
        .into_iter()
        .map(|x| x.2)
        .fold(JoinResult::default(), JoinResult::add);
    Ok((
        res,
        JoinRun {
            probe_trace: ps.trace.clone(),
        },
    ))
}
