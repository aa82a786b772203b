//! Where a result's memory comes from (the pool, bound to the nodes of the threads that will
//! write it, or fresh first-touch memory) and, after the copy, how local its reads were.

use loci_topo::{CpuSet, Topology};

use crate::array::{Array, Chunk};
use crate::error::ArrayError;
use crate::mem::Region;
use crate::pool::Binding;
use loci_place::Plan;

use super::runs::for_each_run;
use super::{Part, PoolOutcome, Schedule, SubarrayOptions};

/// The node of a thread whose cpus are `cpus`, when they all sit on one node that has memory
/// this process may use.
fn node_of(cpus: &CpuSet, topo: &Topology) -> Option<u32> {
    let mut nodes = cpus.iter().map(|c| topo.node_of_cpu(c));
    let first = nodes.next()??;
    (nodes.all(|n| n == Some(first)) && has_usable_memory(first, topo)).then_some(first)
}

/// Whether this process may allocate on node `n` (as [`Topology::allowed_mems`] says, without
/// building the set: this runs on every subarray call).
fn has_usable_memory(n: u32, topo: &Topology) -> bool {
    topo.node(n)
        .is_some_and(|x| x.allowed && x.memory_bytes != Some(0))
}

/// The node that will write each part, when every one is known before the copy: the calling
/// thread's node for an inline copy; for the plan's threads, the node of the thread the static
/// schedule gives the part, or under the dynamic schedule the one node all threads share. An
/// unpinned thread's node is known when every cpu this process may use is on one node.
fn planned_part_nodes(
    parts: &[Part],
    plan: &Plan,
    schedule: Schedule,
    inline: bool,
    topo: &Topology,
) -> Option<Vec<u32>> {
    if inline {
        let cpu = loci_place::sys::current_cpu().ok()?;
        let n = topo
            .node_of_cpu(cpu)
            .filter(|&n| has_usable_memory(n, topo))?;
        return Some(vec![n; parts.len()]);
    }
    let anywhere = topo.allowed_cpus();
    let thread_nodes: Vec<u32> = plan
        .threads
        .iter()
        .map(|t| node_of(if plan.pinned { &t.cpus } else { &anywhere }, topo))
        .collect::<Option<_>>()?;
    let threads = thread_nodes.len();
    match schedule {
        Schedule::Static => {
            let n = parts.len();
            let mut out = Vec::with_capacity(n);
            for (t, &node) in thread_nodes.iter().enumerate() {
                out.extend(std::iter::repeat_n(
                    node,
                    (t + 1) * n / threads - t * n / threads,
                ));
            }
            Some(out)
        }
        Schedule::Dynamic => {
            let first = thread_nodes[0];
            thread_nodes
                .iter()
                .all(|&n| n == first)
                .then(|| vec![first; parts.len()])
        }
    }
}

/// The binding a result wants over `mapped` bytes of its arena: every page on the node of the
/// part that writes the page's first byte (a page shared by two parts goes to the one that starts
/// on it earlier, the way first touch would give it to either).
fn wanted_binding(
    src: &Array,
    parts: &[Part],
    nodes: &[u32],
    out_chunks: &[Chunk],
    mapped: usize,
) -> Binding {
    if let Some(&first) = nodes.first() {
        if nodes.iter().all(|&n| n == first) {
            return Binding::node(mapped, first);
        }
    }
    let ps = loci_place::sys::page_size();
    let layout = src.layout();
    let mut starts = Vec::with_capacity(parts.len() * layout.attrs.len());
    for (p, &n) in parts.iter().zip(nodes) {
        let c = &out_chunks[p.dst];
        for (a, attr) in layout.attrs.iter().enumerate() {
            let sz = attr.dtype.size();
            let from = c.offset + c.attr_off[a] + p.dst_offset * sz;
            let to = from + p.len() * sz;
            let page = from.next_multiple_of(ps);
            if page < to {
                starts.push((page, n));
            }
        }
    }
    Binding::from_starts(starts, mapped)
}

/// The result's arena, and whether the calling thread copies (inline): from the pool when one is
/// given and the writers' nodes are planned (bound to them), else a fresh first-touch mapping.
/// A result under `inline_bytes` is copied inline; one under `inline_bytes_pooled` too when a
/// pooled buffer bound for the calling thread serves it.
#[allow(clippy::too_many_arguments)]
pub(super) fn result_memory(
    src: &Array,
    parts: &[Part],
    out_chunks: &[Chunk],
    len: usize,
    plan: &Plan,
    opts: &SubarrayOptions,
    result_bytes: usize,
    topo: &Topology,
) -> Result<(Region, PoolOutcome, bool), ArrayError> {
    let inline = result_bytes < opts.inline_bytes;
    if len == 0 {
        return Ok((Region::map(0, false)?, PoolOutcome::Empty, inline));
    }
    let Some(pool) = &opts.pool else {
        return Ok((Region::map(len, opts.huge_pages)?, PoolOutcome::Off, inline));
    };
    if !inline && result_bytes < opts.inline_bytes_pooled {
        if let Some(nodes) = planned_part_nodes(parts, plan, opts.schedule, true, topo) {
            let want = wanted_binding(src, parts, &nodes, out_chunks, len);
            if let Some(p) = pool.take(&want, false) {
                let r = Region::from_pooled(p, len, pool.clone());
                return Ok((r, PoolOutcome::Hit, true));
            }
        }
    }
    let Some(nodes) = planned_part_nodes(parts, plan, opts.schedule, inline, topo) else {
        pool.count_bypass();
        return Ok((
            Region::map(len, opts.huge_pages)?,
            PoolOutcome::Bypass,
            inline,
        ));
    };
    if let Some(p) = pool.take(&wanted_binding(src, parts, &nodes, out_chunks, len), true) {
        let r = Region::from_pooled(p, len, pool.clone());
        return Ok((r, PoolOutcome::Hit, inline));
    }
    let mut r = Region::map(len, opts.huge_pages)?;
    let binding = wanted_binding(src, parts, &nodes, out_chunks, r.mapped());
    r.bind_for_pool(binding, pool.clone())?;
    Ok((r, PoolOutcome::Miss, inline))
}

/// Local-access ratio of a finished run: for every part, up to 4 pages of its source runs are
/// looked up with `move_pages`; a part's bytes count as local in the proportion of its sampled
/// pages that sit on the node of the cpu its thread ran on.
pub(super) fn local_access_ratio(
    src: &Array,
    parts: &[Part],
    part_thread: &[(usize, Option<u32>)],
    topo: &Topology,
) -> Result<Option<f64>, ArrayError> {
    let layout = src.layout();
    let cell = layout.cell_bytes();
    let mut local = 0.0;
    let mut total = 0.0;
    for (p, &(_, cpu)) in parts.iter().zip(part_thread) {
        let Some(node) = cpu.and_then(|c| topo.node_of_cpu(c)) else {
            continue;
        };
        let chunk = &src.chunks()[p.src];
        let sz0 = layout.attrs[0].dtype.size();
        let mut offs = Vec::new();
        for_each_run(&chunk.bounds, &p.cells, |off, n| {
            offs.push(chunk.offset + chunk.attr_off[0] + off * sz0);
            offs.push(chunk.offset + chunk.attr_off[0] + (off + n - 1) * sz0);
        });
        let k = offs.len();
        let pick: Vec<usize> = if k <= 4 {
            offs
        } else {
            (0..4).map(|i| offs[i * (k - 1) / 3]).collect()
        };
        let nodes = src.arena().nodes_at(&pick)?;
        let known: Vec<i32> = nodes.into_iter().filter(|&n| n >= 0).collect();
        if known.is_empty() {
            continue;
        }
        let frac = known.iter().filter(|&&n| n as u32 == node).count() as f64 / known.len() as f64;
        let bytes = (p.len() * cell) as f64;
        local += frac * bytes;
        total += bytes;
    }
    Ok((total > 0.0).then(|| local / total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;
    use crate::mem::Home;
    use crate::subarray::plan_parts;

    /// With parts written on different nodes, every page is bound to the node of the part that
    /// writes its first byte, for every attribute; with one node the binding is one segment.
    #[test]
    fn wanted_binding_follows_the_writer_of_each_page() {
        let topo = Topology::flat(loci_place::sys::get_affinity(0).unwrap(), "test");
        let l = Layout::new(
            vec![crate::Dim::new("a", 300), crate::Dim::new("b", 40)],
            vec![
                crate::Attr::new("v", crate::DType::F64),
                crate::Attr::new("w", crate::DType::U16),
            ],
            &crate::Chunking::Shape(vec![100, 40]),
        )
        .unwrap();
        let src = Array::from_fn(l, &topo, |_, c| c[0] as f64).unwrap();
        let b = vec![10..290, 0..40];
        let parts = plan_parts(src.layout(), &b, 4, Some(3000));
        assert!(parts.len() > 8);
        let nodes: Vec<u32> = (0..parts.len()).map(|i| (i % 3) as u32).collect();
        let out = src.layout().sub_layout(&b);
        let (len, chunks) = Array::plan_chunks(&out, |_| Home::Unknown);
        let bind = wanted_binding(&src, &parts, &nodes, &chunks, len);
        assert_eq!(bind.len(), len);
        let ps = loci_place::sys::page_size();
        let mut checked = 0;
        for (p, &n) in parts.iter().zip(&nodes) {
            let c = &chunks[p.dst];
            for (a, sz) in [(0, 8), (1, 2)] {
                let from = c.offset + c.attr_off[a] + p.dst_offset * sz;
                let to = from + p.len() * sz;
                let mut page = from.next_multiple_of(ps);
                while page < to {
                    assert_eq!(bind.node_at(page), Some(n), "page {page} of part {p:?}");
                    page += ps;
                    checked += 1;
                }
            }
        }
        assert!(checked > 10);
        let one = wanted_binding(&src, &parts, &vec![2; parts.len()], &chunks, len + ps);
        assert_eq!(one.segments(), &[(0..len + ps, 2)]);
    }
}
