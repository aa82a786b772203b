//! Cache instances from `cpuN/cache/indexM`, each once, with the kernel's contradicting
//! sharing masks repaired as hwloc repairs them.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use super::text::{parse_cache_type, parse_size};
use super::{bad, numbered_entries, read_int_opt, read_list_opt, read_opt};
use crate::error::TopoError;
use crate::idset::CpuSet;
use crate::model::{Cache, CacheKind};

/// Reads the cache directories of every cpu in `cpu_entries` (id, `cpuN` directory).
pub(super) fn read_caches(cpu_entries: &[(u32, PathBuf)]) -> Result<Vec<Cache>, TopoError> {
    let mut entries = Vec::new();
    for (id, dir) in cpu_entries {
        for (_, idx) in numbered_entries(&dir.join("cache"), "index")? {
            let Some(level) = read_int_opt(&idx.join("level"))? else {
                continue;
            };
            let tpath = idx.join("type");
            let kind = match read_opt(&tpath)? {
                Some(t) if !t.is_empty() => parse_cache_type(&t).map_err(|m| bad(&tpath, &t, m))?,
                _ => continue,
            };
            let spath = idx.join("size");
            let size = match read_opt(&spath)? {
                Some(t) if !t.is_empty() => parse_size(&t).map_err(|m| bad(&spath, &t, m))?,
                _ => 0,
            };
            let mpath = idx.join("shared_cpu_map");
            let map = match read_opt(&mpath)? {
                Some(t) if !t.is_empty() => {
                    Some(CpuSet::parse_mask(&t).map_err(|e| bad(&mpath, &t, e))?)
                }
                _ => None,
            };
            let list = read_list_opt(&idx.join("shared_cpu_list"))?.filter(|l| !l.is_empty());
            let level = u8::try_from(level).map_err(|_| {
                TopoError::parse(&idx.join("level"), format!("cache level {level}"))
            })?;
            entries.push(CacheEntry {
                cpu: *id,
                level,
                kind,
                size,
                map,
                list,
            });
        }
    }
    Ok(resolve_caches(&entries))
}

/// One `cpuN/cache/indexM` directory as read.
#[derive(Debug, Clone)]
pub struct CacheEntry {
    pub cpu: u32,
    pub level: u8,
    pub kind: CacheKind,
    pub size: u64,
    /// `shared_cpu_map`, parsed.
    pub map: Option<CpuSet>,
    /// `shared_cpu_list`, parsed.
    pub list: Option<CpuSet>,
}

/// Turns per-cpu cache entries into cache instances, each once.
///
/// The kernel prints the sharing twice (`shared_cpu_map`, `shared_cpu_list`) and old kernels got
/// one of them wrong now and then: AMD family 15h lists only the cpu itself next to a right
/// map; other captures have a map that overlaps a neighbour's instance. An instance must hold
/// its own cpu and, per level and kind, instances must be equal or disjoint. The map is tried
/// first (as hwloc does), then the list; an entry neither of which fits is dropped (its cpu
/// then has no cache of that level, as in hwloc's view of such a machine).
pub fn resolve_caches(entries: &[CacheEntry]) -> Vec<Cache> {
    let first = |e: &CacheEntry| -> Option<CpuSet> {
        e.map
            .clone()
            .or_else(|| e.list.clone())
            .or_else(|| Some(CpuSet::single(e.cpu)))
    };
    let candidates: HashMap<(u32, u8, u8), [Option<CpuSet>; 2]> = entries
        .iter()
        .map(|e| ((e.cpu, e.level, e.kind as u8), [first(e), e.list.clone()]))
        .collect();
    // `set` is agreed when it holds the entry's cpu and every member cpu that has an entry of
    // the same level and kind names the very same set (in its map or its list).
    let agreed = |e: &CacheEntry, set: &CpuSet| -> bool {
        set.contains(e.cpu)
            && set.iter().all(|d| {
                !matches!(
                    candidates.get(&(d, e.level, e.kind as u8)),
                    Some(c) if !c.iter().any(|f| f.as_ref() == Some(set))
                )
            })
    };
    let mut out: BTreeMap<(u8, u8, Vec<u32>), Cache> = BTreeMap::new();
    for e in entries {
        let chosen = [first(e), e.list.clone()]
            .into_iter()
            .flatten()
            .find(|s| agreed(e, s));
        let Some(cpus) = chosen else { continue };
        out.entry((e.level, e.kind as u8, cpus.iter().collect()))
            .or_insert(Cache {
                level: e.level,
                kind: e.kind,
                size_bytes: e.size,
                cpus,
            });
    }
    let mut caches: Vec<Cache> = out.into_values().collect();
    caches.sort_by_key(|c| (c.level, c.kind as u8, c.cpus.first()));
    caches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(cpu: u32, map: &str, list: &str) -> CacheEntry {
        CacheEntry {
            cpu,
            level: 3,
            kind: CacheKind::Unified,
            size: 1 << 20,
            map: (!map.is_empty()).then(|| CpuSet::parse_mask(map).unwrap()),
            list: (!list.is_empty()).then(|| CpuSet::parse(list).unwrap()),
        }
    }

    #[test]
    fn caches_deduplicated_and_repaired() {
        // Each cpu's `CPU:MAP:LIST` (shared_cpu_map, shared_cpu_list; empty: the file is
        // missing), then the caches' cpus.
        for (cpus, want) in [
            // Two instances of 2 cpus each, seen from each cpu: two caches.
            ("0:3:0-1 1:3:0-1 2:c:2-3 3:c:2-3", "0-1 2-3"),
            // AMD family 15h: the list names only the cpu, the map is right.
            ("0:3:0 1:3:1", "0-1"),
            // A wrong map overlapping the neighbours' instance: cpu 2's list is used.
            ("0:5:0,2 2:3:0,2 1:a:1,3 3:a:1,3", "0,2 1,3"),
            // Neither fits (and the set lacks the cpu itself): dropped.
            ("0:2:1 1:2:1", "1"),
            // Only a list, or nothing: the list, or the cpu alone.
            ("5::5 6::", "5 6"),
        ] {
            let entries: Vec<CacheEntry> = cpus
                .split_whitespace()
                .map(|w| {
                    let f: Vec<&str> = w.split(':').collect();
                    entry(f[0].parse().unwrap(), f[1], f[2])
                })
                .collect();
            let got: Vec<String> = resolve_caches(&entries)
                .iter()
                .map(|c| c.cpus.to_string())
                .collect();
            assert_eq!(got.join(" "), want, "{cpus}");
        }
    }
}
