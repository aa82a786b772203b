//! Writing a machine out as a Linux sysfs tree.

use std::fmt::Write as _;

use loci_topo::{Cache, CacheKind, CpuSet, Node, NodeSet};

use crate::common::Tree;
use crate::machine::{Kernel, Machine};

/// A cpu mask as the kernel prints it (`%*pb`): `nbits` bits in 32-bit hex words, most
/// significant first, separated by commas; the first word has only the digits its bits need.
pub(crate) fn kernel_mask(set: &CpuSet, nbits: u32) -> String {
    let words = nbits.div_ceil(32);
    let mut out = String::new();
    for w in (0..words).rev() {
        let mut v = 0u32;
        for bit in 0..32 {
            if set.contains(w * 32 + bit) {
                v |= 1 << bit;
            }
        }
        let width = match nbits % 32 {
            r if r > 0 && w == words - 1 => r.div_ceil(4) as usize,
            _ => 8,
        };
        if !out.is_empty() {
            out.push(',');
        }
        let _ = write!(out, "{v:0width$x}");
    }
    out
}

fn kernel_kind(k: CacheKind) -> &'static str {
    match k {
        CacheKind::Data => "Data",
        CacheKind::Instruction => "Instruction",
        CacheKind::Unified => "Unified",
    }
}

/// Lays `m` out under `dir/sys` as Linux does.
pub(crate) fn write_sysfs(m: &Machine, t: &Tree) {
    let topo = &m.topo;
    let present = topo.cpu_ids();
    let nbits = present.last().unwrap() + 1;
    let possible: CpuSet = (0..nbits).collect();
    let list = |s: &CpuSet| format!("{s}\n");
    let mask = |s: &CpuSet| format!("{}\n", kernel_mask(s, nbits));
    let cpu = "sys/devices/system/cpu";
    t.file(&format!("{cpu}/online"), &list(&present));
    t.file(&format!("{cpu}/present"), &list(&present));
    t.file(&format!("{cpu}/possible"), &list(&possible));
    t.file(
        &format!("{cpu}/offline"),
        &list(&possible.difference(&present)),
    );
    t.file(&format!("{cpu}/kernel_max"), "8191\n");

    // Caches in the kernel's index order: by level, data before instruction before unified.
    let mut caches: Vec<&Cache> = topo.caches.iter().collect();
    caches.sort_by_key(|c| (c.level, c.kind as u8, c.cpus.first()));

    for c in &topo.cpus {
        let d = format!("{cpu}/cpu{}", c.id);
        let siblings = topo.smt_siblings(c.id);
        let tp = format!("{d}/topology");
        t.file(
            &format!("{tp}/physical_package_id"),
            &format!("{}\n", c.package),
        );
        t.file(&format!("{tp}/core_id"), &format!("{}\n", m.core_id[&c.id]));
        if m.kernel != Kernel::Ancient {
            t.file(&format!("{tp}/thread_siblings_list"), &list(&siblings));
        }
        if m.kernel == Kernel::Current {
            t.file(&format!("{tp}/core_cpus_list"), &list(&siblings));
        } else {
            t.file(&format!("{tp}/thread_siblings"), &mask(&siblings));
        }
        // cpu0 cannot be taken offline on most machines: no `online` file.
        if c.id != present.first().unwrap() {
            t.file(&format!("{d}/online"), "1\n");
        }
        let node = c.node.unwrap();
        t.link(
            &format!("{d}/node{node}"),
            &format!("../../node/node{node}"),
        );
        let mine = caches.iter().filter(|x| x.cpus.contains(c.id));
        for (index, x) in mine.enumerate() {
            let ix = format!("{d}/cache/index{index}");
            t.file(&format!("{ix}/level"), &format!("{}\n", x.level));
            t.file(&format!("{ix}/type"), &format!("{}\n", kernel_kind(x.kind)));
            t.file(&format!("{ix}/size"), &format!("{}K\n", x.size_bytes >> 10));
            t.file(&format!("{ix}/shared_cpu_map"), &mask(&x.cpus));
            if m.kernel != Kernel::Ancient {
                t.file(&format!("{ix}/shared_cpu_list"), &list(&x.cpus));
            }
        }
    }

    let node = "sys/devices/system/node";
    let ids: NodeSet = topo.nodes.iter().map(|n| n.id).collect();
    let ids_where = |f: &dyn Fn(&Node) -> bool| -> NodeSet {
        topo.nodes.iter().filter(|n| f(n)).map(|n| n.id).collect()
    };
    t.file(&format!("{node}/online"), &format!("{ids}\n"));
    let possible_nodes: NodeSet = (0..=ids.last().unwrap()).collect();
    t.file(&format!("{node}/possible"), &format!("{possible_nodes}\n"));
    t.file(
        &format!("{node}/has_cpu"),
        &format!("{}\n", ids_where(&|n| !n.cpus.is_empty())),
    );
    let with_memory = ids_where(&|n| n.memory_bytes != Some(0));
    t.file(&format!("{node}/has_memory"), &format!("{with_memory}\n"));
    t.file(
        &format!("{node}/has_normal_memory"),
        &format!("{with_memory}\n"),
    );
    for (i, n) in topo.nodes.iter().enumerate() {
        let d = format!("{node}/node{}", n.id);
        if m.kernel != Kernel::Ancient {
            t.file(&format!("{d}/cpulist"), &list(&n.cpus));
        }
        t.file(&format!("{d}/cpumap"), &mask(&n.cpus));
        let row: Vec<String> = topo.distances[i].iter().map(u32::to_string).collect();
        t.file(&format!("{d}/distance"), &format!("{}\n", row.join(" ")));
        let kb = |b: Option<u64>| b.unwrap() >> 10;
        let (total, free) = (kb(n.memory_bytes), kb(n.free_bytes));
        let mut meminfo = String::new();
        for (key, v) in [
            ("MemTotal", total),
            ("MemFree", free),
            ("MemUsed", total - free),
            ("SwapCached", 0),
            ("Active", (total - free) / 2),
            ("Inactive", (total - free) / 4),
            ("Active(anon)", (total - free) / 8),
            ("Dirty", 0),
            ("FilePages", (total - free) / 4),
            ("AnonHugePages", 0),
        ] {
            let _ = writeln!(meminfo, "Node {} {:<16}{v:>8} kB", n.id, format!("{key}:"));
        }
        for key in ["HugePages_Total", "HugePages_Free", "HugePages_Surp"] {
            let _ = writeln!(meminfo, "Node {} {key}: {:>5}", n.id, 0);
        }
        t.file(&format!("{d}/meminfo"), &meminfo);
    }
}
