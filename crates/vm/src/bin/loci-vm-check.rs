//! `loci-vm-check`: placement facts verified inside a NUMA VM, one `LOCI-CHECK` line each.
//!
//! Run by the loci-vm tests through `scripts/numa-vm` (one boot per topology runs every group). It maps its regions
//! as loci-place's `NodeRegion` with no plan, talks to the kernel through `loci_place::sys` directly (mbind,
//! set_mempolicy, move_pages, sched_setaffinity) and reads sysfs itself, so it proves the syscall layer and the VM
//! independently of loci's memory plans; the `cli` group then checks the `loci` binary against the same facts.

use std::io;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use loci_place::region::HUGE_PAGE;
use loci_place::sys::{self, mode};
use loci_place::verify::{buffer_pages_at, BufferPages};
use loci_place::{MemPlan, NodeRegion};
use loci_topo::{CpuSet, NodeSet};
use loci_vm::{Checker, VmConfig};

#[path = "loci-vm-check/place.rs"]
mod place;

/// Placement checks to run inside a NUMA VM (see the loci-vm crate). Prints one `LOCI-CHECK ok|FAIL NAME` line per
/// fact; exits 0 when all passed.
#[derive(Parser, Debug)]
#[command(name = "loci-vm-check")]
struct Args {
    /// The VM's configuration as `scripts/numa-vm --describe` prints it (JSON); needed by the sysfs and cli groups.
    #[arg(long)]
    expect: Option<String>,
    /// Size of each test region in MiB.
    #[arg(long, default_value_t = 64)]
    region_mib: usize,
    /// The `loci` binary, for the cli, place and cli-errors groups.
    #[arg(long)]
    loci: Option<PathBuf>,
    /// The `loci-probe` binary (the unmodified child that `loci run` places), for the place group.
    #[arg(long)]
    probe: Option<PathBuf>,
    /// Thread counts for which the place group runs an unmodified child under `loci run` (comma list; default every
    /// n = 1..=cpus). loci's own threads are always checked for every n.
    #[arg(long, value_delimiter = ',')]
    child_ns: Option<Vec<usize>>,
    /// Child mode for the `loci run --verify` check: bind a region of --region-mib MiB to this node, touch it,
    /// print its own numa_maps reading as JSON and exit at once, the region still mapped: only the pin library's
    /// reading at exit can see it, loci's polls all but surely come too early.
    #[arg(long, hide = true)]
    touch_remote: Option<u32>,
    /// Which groups to run (default: sysfs mem threads errors, plus cli when --loci is given).
    groups: Vec<Group>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Group {
    /// The kernel sees the configured nodes, cpus, memory and distances.
    Sysfs,
    /// Pages of a region sit where each memory policy says (move_pages).
    Mem,
    /// Threads pinned to a node's or a cpu's set run only there.
    Threads,
    /// Impossible placements fail with an error, not a crash.
    Errors,
    /// The `loci` binary reports the same machine.
    Cli,
    /// `loci plan` / `loci run` place threads (loci's own and an unmodified child's) and memory where they say,
    /// and `loci run --verify` reports the remote share that numa_maps shows.
    Place,
    /// `loci` rejects impossible placements with a clear error, not a crash.
    CliErrors,
}

/// A node as the kernel reports it in sysfs.
#[derive(Debug, Clone)]
struct SysNode {
    id: u32,
    cpus: CpuSet,
    mem_total_kb: u64,
    mem_free_kb: u64,
    /// Distances to every online node, in the order of the online list.
    distances: Vec<u32>,
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
}

fn read_nodes() -> Result<Vec<SysNode>, String> {
    let base = "/sys/devices/system/node";
    let online = NodeSet::parse(read(&format!("{base}/online"))?.trim())
        .map_err(|e| format!("{base}/online: {e}"))?;
    online
        .iter()
        .map(|id| {
            let d = format!("{base}/node{id}");
            let cpus = CpuSet::parse(read(&format!("{d}/cpulist"))?.trim())
                .map_err(|e| format!("{d}/cpulist: {e}"))?;
            let distances = read(&format!("{d}/distance"))?
                .split_whitespace()
                .map(|v| v.parse::<u32>().map_err(|e| format!("{d}/distance: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            let meminfo = read(&format!("{d}/meminfo"))?;
            let field = |name: &str| -> Result<u64, String> {
                meminfo
                    .lines()
                    .find_map(|l| {
                        let mut w = l.split_whitespace();
                        // "Node 0 MemTotal:   211316 kB"
                        (w.nth(2) == Some(name)).then(|| w.next()).flatten()
                    })
                    .ok_or_else(|| format!("{d}/meminfo has no {name}"))?
                    .parse::<u64>()
                    .map_err(|e| format!("{d}/meminfo {name}: {e}"))
            };
            Ok(SysNode {
                id,
                cpus,
                mem_total_kb: field("MemTotal:")?,
                mem_free_kb: field("MemFree:")?,
                distances,
            })
        })
        .collect()
}

/// Bytes of the kernel image (code through bss) from /proc/iomem; it lives on node 0 (the VM boots with nokaslr).
fn kernel_image_bytes() -> Result<u64, String> {
    let text = read("/proc/iomem")?;
    let range = |name: &str| -> Option<(u64, u64)> {
        let l = text.lines().find(|l| l.trim_end().ends_with(name))?;
        let (a, b) = l.trim().split(' ').next()?.split_once('-')?;
        Some((
            u64::from_str_radix(a, 16).ok()?,
            u64::from_str_radix(b, 16).ok()?,
        ))
    };
    let (start, _) = range(": Kernel code").ok_or("no 'Kernel code' in /proc/iomem")?;
    let (_, end) = range(": Kernel bss").ok_or("no 'Kernel bss' in /proc/iomem")?;
    Ok(end + 1 - start)
}

/// Whether transparent huge pages can back a region that asks for them.
fn thp_available() -> bool {
    read("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|s| !s.contains("[never]"))
        .unwrap_or(false)
}

/// A fresh, untouched region of `len` bytes with no policy of its own (loci-place's node-bound
/// region under the first-touch plan); `huge` asks for transparent huge pages (the region is then
/// aligned to them, so interleave counts are exact).
fn map_region(len: usize, huge: bool) -> Result<NodeRegion, String> {
    NodeRegion::map(len, &MemPlan::first_touch(), huge).map_err(|e| e.to_string())
}

/// What the checks do to a region through the raw syscalls, below loci-place's memory plans.
trait RawPolicy {
    /// `mbind(2)` of the whole region with a kernel policy mode (before the first touch).
    fn mbind(&self, policy: i32, nodes: &NodeSet) -> io::Result<()>;
    /// Where the pages are (move_pages query, classified by loci-place: per node, not present,
    /// unknown = -EFAULT while AutoNUMA scans, other errors).
    fn placement(&self) -> Result<BufferPages, String>;
    /// `madvise(MADV_NOHUGEPAGE)`: only base pages back it (before the first touch).
    fn refuse_huge_pages(&self) -> Result<(), String>;
}

impl RawPolicy for NodeRegion {
    fn mbind(&self, policy: i32, nodes: &NodeSet) -> io::Result<()> {
        // SAFETY: the range is our own mapping, page aligned, not yet touched (no migration).
        unsafe { sys::mbind(self.as_ptr(), self.len(), policy, nodes, 0) }
    }

    fn placement(&self) -> Result<BufferPages, String> {
        buffer_pages_at(self.as_ptr(), self.len()).map_err(|e| format!("move_pages query: {e}"))
    }

    fn refuse_huge_pages(&self) -> Result<(), String> {
        // SAFETY: advice on our own mapping; no memory is freed or moved.
        let r = unsafe { libc::madvise(self.as_ptr().cast(), self.len(), libc::MADV_NOHUGEPAGE) };
        if r != 0 {
            return Err(format!("madvise: {}", io::Error::last_os_error()));
        }
        Ok(())
    }
}

/// Runs `f` on a new thread pinned to `cpus` (when given) and returns its result; a panic becomes an error.
/// The calling thread's affinity reads back as `set`, and over `rounds` yields it runs only on
/// cpus of `set`.
fn stays_on(set: &CpuSet, rounds: usize) -> Result<(), String> {
    let got = sys::get_affinity(0).map_err(|e| e.to_string())?;
    if &got != set {
        return Err(format!("affinity reads back {got}, want {set}"));
    }
    for _ in 0..rounds {
        let cpu = sys::current_cpu().map_err(|e| e.to_string())?;
        if !set.contains(cpu) {
            return Err(format!("ran on cpu {cpu}, outside {set}"));
        }
        std::thread::yield_now();
    }
    Ok(())
}

fn on_thread<T: Send>(
    cpus: Option<&CpuSet>,
    f: impl FnOnce() -> Result<T, String> + Send,
) -> Result<T, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Some(c) = cpus {
                sys::set_affinity(0, c).map_err(|e| format!("sched_setaffinity({c}): {e}"))?;
            }
            f()
        })
        .join()
        .map_err(|_| "the check thread panicked".to_string())?
    })
}

/// The memory nodes nearest to `node` by distance (itself when it has memory).
fn nearest_memory(nodes: &[SysNode], node: u32) -> NodeSet {
    let idx = nodes.iter().position(|n| n.id == node).unwrap();
    let mem: Vec<(usize, &SysNode)> = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.mem_total_kb > 0)
        .collect();
    let best = mem
        .iter()
        .map(|(j, _)| nodes[idx].distances[*j])
        .min()
        .unwrap_or(0);
    mem.iter()
        .filter(|(j, _)| nodes[idx].distances[*j] == best)
        .map(|(_, n)| n.id)
        .collect()
}

fn expect_einval(what: &str, r: io::Result<()>) -> Result<(), String> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Err(e) => Err(format!("{what}: want EINVAL, got {e}")),
        Ok(()) => Err(format!("{what}: succeeded, want EINVAL")),
    }
}

fn sysfs_checks(c: &mut Checker, nodes: &[SysNode], expect: &VmConfig) {
    c.check("sysfs/node-ids", || {
        let got: Vec<u32> = nodes.iter().map(|n| n.id).collect();
        let want: Vec<u32> = expect.nodes.iter().map(|n| n.id).collect();
        (got == want)
            .then_some(())
            .ok_or(format!("online nodes {got:?}, configured {want:?}"))
    });
    let kernel = kernel_image_bytes();
    for (i, want) in expect.nodes.iter().enumerate() {
        let Some(got) = nodes.iter().find(|n| n.id == want.id) else {
            continue; // reported by node-ids
        };
        c.check(format!("sysfs/node{}/cpus", want.id), || {
            let w = expect.node_cpus(want.id);
            (got.cpus == w)
                .then_some(())
                .ok_or(format!("cpus {}, configured {w}", got.cpus))
        });
        c.check(format!("sysfs/node{}/distances", want.id), || {
            (got.distances == expect.distances[i])
                .then_some(())
                .ok_or(format!(
                    "distances {:?}, configured {:?}",
                    got.distances, expect.distances[i]
                ))
        });
        c.check(format!("sysfs/node{}/memory", want.id), || {
            let want_kb = want.mem_mib * 1024;
            let got_kb = got.mem_total_kb;
            // 5% for the kernel's own page tables and struct pages; node 0 also holds the kernel image.
            let mut slack = want_kb / 20;
            if want.id == 0 {
                slack += kernel.clone()? / 1024;
            }
            (got_kb <= want_kb && want_kb - got_kb <= slack)
                .then_some(())
                .ok_or(format!(
                    "MemTotal {got_kb} kB, configured {want_kb} kB (allowed shortfall {slack} kB)"
                ))
        });
    }
}

fn mem_checks(c: &mut Checker, nodes: &[SysNode], region: usize) {
    let ps = sys::page_size();
    let mem_nodes: NodeSet = nodes
        .iter()
        .filter(|n| n.mem_total_kb > 0)
        .map(|n| n.id)
        .collect();
    let region_kb = (region / 1024) as u64;
    let room = |k: u32| -> Result<(), String> {
        // Re-read: earlier checks' memory is free again, but the kernel may lag a little.
        let n = read_nodes()?.into_iter().find(|n| n.id == k).unwrap();
        if n.mem_free_kb < region_kb + 16 * 1024 {
            return Err(format!(
                "node {k} has {} kB free, the check needs {region_kb} kB + 16 MiB; give the VM more memory",
                n.mem_free_kb
            ));
        }
        Ok(())
    };
    for k in mem_nodes.iter() {
        let one = NodeSet::single(k);
        for (name, policy) in [
            ("bind", mode::MPOL_BIND),
            ("preferred", mode::MPOL_PREFERRED),
        ] {
            c.check(format!("mem/{name}/node{k}"), || {
                room(k)?;
                let mut r = map_region(region, false)?;
                r.mbind(policy, &one)
                    .map_err(|e| format!("mbind {name} {k}: {e}"))?;
                r.populate();
                r.placement()?.check_all_on(&one)
            });
        }
        c.check(format!("mem/apply_range-migrate/node{k}"), || {
            // Pages first-touched wherever this thread runs, then moved by loci-place's
            // apply_range (mbind with MPOL_MF_MOVE) onto node k: move_pages must find them there.
            room(k)?;
            let mut r = map_region(region, false)?;
            r.populate();
            let plan = loci_place::MemPlan {
                policy: "bind",
                nodes: one.clone(),
            };
            // SAFETY: our own mapping; only this thread uses it while its pages move.
            unsafe { loci_place::apply::apply_range(&plan, r.as_ptr(), r.len(), true) }
                .map_err(|e| e.to_string())?;
            r.placement()?.check_all_on(&one)
        });
        c.check(format!("mem/set_mempolicy-bind/node{k}"), || {
            room(k)?;
            on_thread(None, || {
                sys::set_mempolicy(mode::MPOL_BIND, &one)
                    .map_err(|e| format!("set_mempolicy bind {k}: {e}"))?;
                let (m, n) = sys::get_mempolicy().map_err(|e| format!("get_mempolicy: {e}"))?;
                if m != mode::MPOL_BIND || n != one {
                    return Err(format!(
                        "get_mempolicy says mode {m} nodes {n}, want bind {one}"
                    ));
                }
                let mut r = map_region(region, false)?;
                r.populate();
                r.placement()?.check_all_on(&one)
            })
        });
    }
    let mut interleave_sets = vec![("all".to_string(), mem_nodes.clone())];
    if mem_nodes.len() >= 3 {
        let sub: NodeSet = [mem_nodes.first().unwrap(), mem_nodes.last().unwrap()]
            .into_iter()
            .collect();
        interleave_sets.push((format!("{sub}"), sub));
    }
    if mem_nodes.len() >= 2 {
        // Interleave places whole folios: 4 KiB pages when transparent huge pages are off for the region (the
        // spread is then within 1 page per node), 2 MiB huge pages when THP backs it (within one huge page).
        let thp = thp_available();
        for (label, set) in interleave_sets {
            for huge in [false, true] {
                if huge && !thp {
                    continue;
                }
                let set = set.clone();
                let name = if huge { "interleave-thp" } else { "interleave" };
                c.check(format!("mem/{name}/{label}"), move || {
                    let mut r = map_region(region, huge)?;
                    if !huge {
                        r.refuse_huge_pages()?;
                    }
                    r.mbind(mode::MPOL_INTERLEAVE, &set)
                        .map_err(|e| format!("mbind interleave {set}: {e}"))?;
                    r.populate();
                    let h = r.placement()?;
                    h.check_all_on(&set)?;
                    let counts: Vec<usize> = set
                        .iter()
                        .map(|n| h.per_node.get(&n).copied().unwrap_or(0))
                        .collect();
                    let (lo, hi) = (
                        *counts.iter().min().unwrap(),
                        *counts.iter().max().unwrap(),
                    );
                    let unit = if huge { HUGE_PAGE / ps } else { 1 };
                    if hi - lo > unit + h.unknown {
                        return Err(format!(
                            "pages per node {h:?}: interleave over {set} differs by {} pages (allowed {unit})",
                            hi - lo
                        ));
                    }
                    Ok(())
                });
            }
        }
    }
    for n in nodes.iter().filter(|n| !n.cpus.is_empty()) {
        let k = n.id;
        let want = nearest_memory(nodes, k);
        let cpus = n.cpus.clone();
        for (label, policy) in [
            ("localalloc", Some(mode::MPOL_LOCAL)),
            ("first-touch", None),
        ] {
            let (want, cpus) = (want.clone(), cpus.clone());
            c.check(format!("mem/{label}/node{k}"), move || {
                for w in want.iter() {
                    room(w)?;
                }
                on_thread(Some(&cpus), || {
                    if let Some(p) = policy {
                        sys::set_mempolicy(p, &NodeSet::new())
                            .map_err(|e| format!("set_mempolicy local: {e}"))?;
                    }
                    let mut r = map_region(region, false)?;
                    r.populate();
                    let cpu = sys::current_cpu().map_err(|e| e.to_string())?;
                    if !cpus.contains(cpu) {
                        return Err(format!("pinned to {cpus} but ran on cpu {cpu}"));
                    }
                    r.placement()?
                        .check_all_on(&want)
                        .map_err(|e| format!("{e} (thread pinned to node {k}, cpus {cpus})"))
                })
            });
        }
    }
}

fn thread_checks(c: &mut Checker, nodes: &[SysNode]) {
    let sets: Vec<(String, CpuSet)> = nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .map(|n| (format!("node{}", n.id), n.cpus.clone()))
        .chain(
            nodes
                .iter()
                .flat_map(|n| n.cpus.iter())
                .map(|cpu| (format!("cpu{cpu}"), CpuSet::single(cpu))),
        )
        .collect();
    for (label, set) in sets {
        c.check(format!("threads/pin/{label}"), || {
            on_thread(Some(&set), || {
                stays_on(&set, 200).map_err(|e| format!("pinned: {e}"))
            })
        });
    }
}

fn error_checks(c: &mut Checker, nodes: &[SysNode]) {
    let has_memory = read("/sys/devices/system/node/has_memory")
        .ok()
        .and_then(|s| NodeSet::parse(s.trim()).ok())
        .unwrap_or_default();
    for n in nodes.iter().filter(|n| n.mem_total_kb == 0) {
        let k = n.id;
        let one = NodeSet::single(k);
        c.check(format!("errors/memoryless-node{k}/mbind-bind"), || {
            if has_memory.contains(k) {
                return Err(format!(
                    "has_memory {has_memory} lists node {k}, which has no memory"
                ));
            }
            let r = map_region(1 << 20, false)?;
            expect_einval("mbind bind", r.mbind(mode::MPOL_BIND, &one))
        });
        c.check(format!("errors/memoryless-node{k}/set_mempolicy"), || {
            on_thread(None, || {
                expect_einval(
                    "set_mempolicy bind",
                    sys::set_mempolicy(mode::MPOL_BIND, &one),
                )?;
                expect_einval(
                    "set_mempolicy preferred",
                    sys::set_mempolicy(mode::MPOL_PREFERRED, &one),
                )?;
                expect_einval(
                    "set_mempolicy interleave",
                    sys::set_mempolicy(mode::MPOL_INTERLEAVE, &one),
                )
            })
        });
    }
    for n in nodes.iter().filter(|n| n.cpus.is_empty()) {
        let k = n.id;
        c.check(format!("errors/cpuless-node{k}/affinity"), || {
            on_thread(None, || {
                // EINVAL from the kernel, or loci_place::sys refusing the empty set before the syscall.
                match sys::set_affinity(0, &n.cpus) {
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::InvalidInput => Ok(()),
                    other => Err(format!(
                        "sched_setaffinity(empty): want EINVAL or InvalidInput, got {other:?}"
                    )),
                }
            })
        });
    }
    let missing = nodes.iter().map(|n| n.id).max().unwrap_or(0) + 1;
    for k in [missing, 1023] {
        let one = NodeSet::single(k);
        c.check(format!("errors/no-such-node{k}"), || {
            let r = map_region(1 << 20, false)?;
            expect_einval("mbind bind", r.mbind(mode::MPOL_BIND, &one))?;
            on_thread(None, || {
                expect_einval(
                    "set_mempolicy bind",
                    sys::set_mempolicy(mode::MPOL_BIND, &one),
                )
            })
        });
    }
    c.check("errors/node-beyond-mask", || {
        match sys::set_mempolicy(mode::MPOL_BIND, &NodeSet::single(5000)) {
            Err(e) if e.kind() == io::ErrorKind::InvalidInput && e.to_string().contains("5000") => {
                Ok(())
            }
            other => Err(format!(
                "want an InvalidInput naming node 5000, got {other:?}"
            )),
        }
    });
    let ncpus: u32 = nodes.iter().map(|n| n.cpus.len() as u32).sum();
    c.check("errors/no-such-cpu", || {
        on_thread(None, || {
            expect_einval(
                "sched_setaffinity(absent cpu)",
                sys::set_affinity(0, &CpuSet::single(ncpus + 3)),
            )
        })
    });
}

fn cli_checks(c: &mut Checker, loci: &std::path::Path, expect: &VmConfig, nodes: &[SysNode]) {
    c.check("cli/topo-json", || {
        let out = std::process::Command::new(loci)
            .args(["topo", "--json"])
            .output()
            .map_err(|e| format!("{}: {e}", loci.display()))?;
        if !out.status.success() {
            return Err(format!(
                "loci topo --json exited {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("loci topo --json printed no JSON: {e}"))?;
        let got = v["nodes"]
            .as_array()
            .ok_or("no \"nodes\" array in loci topo --json")?;
        if got.len() != expect.nodes.len() {
            return Err(format!(
                "{} nodes, configured {}",
                got.len(),
                expect.nodes.len()
            ));
        }
        let kernel_kb = kernel_image_bytes()? / 1024;
        let mut errs = Vec::new();
        for (i, (g, w)) in got.iter().zip(&expect.nodes).enumerate() {
            if g["id"].as_u64() != Some(w.id as u64) {
                errs.push(format!("node {i}: id {}, configured {}", g["id"], w.id));
            }
            let gc = g["cpus"].as_str().and_then(|s| CpuSet::parse(s).ok());
            if gc.as_ref() != Some(&expect.node_cpus(w.id)) {
                errs.push(format!("node {}: cpus {}, configured {:?}", w.id, g["cpus"], w.cpus));
            }
            let gd: Option<Vec<u32>> = g["distances"].as_array().map(|a| {
                a.iter()
                    .map(|x| x.as_u64().unwrap_or(0) as u32)
                    .collect()
            });
            if gd.as_ref() != Some(&expect.distances[i]) {
                errs.push(format!(
                    "node {}: distances {}, configured {:?}",
                    w.id, g["distances"], expect.distances[i]
                ));
            }
            let want_kb = w.mem_mib * 1024;
            let slack = want_kb / 20 + if w.id == 0 { kernel_kb } else { 0 };
            match g["memory_bytes"].as_u64() {
                Some(b) if b / 1024 <= want_kb && want_kb - b / 1024 <= slack => {}
                other => errs.push(format!(
                    "node {}: memory_bytes {other:?}, configured {want_kb} kB (allowed shortfall {slack} kB)",
                    w.id
                )),
            }
        }
        let _ = nodes;
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    });
}

fn main() {
    let args = Args::parse();
    if let Some(node) = args.touch_remote {
        // Returns only on failure: on success the child exits with its region still mapped.
        match place::touch_remote(node, args.region_mib << 20) {
            Ok(never) => match never {},
            Err(e) => {
                eprintln!("loci-vm-check --touch-remote: {e}");
                std::process::exit(1);
            }
        }
    }
    let mut groups = args.groups.clone();
    if groups.is_empty() {
        groups = vec![Group::Sysfs, Group::Mem, Group::Threads, Group::Errors];
        if args.loci.is_some() {
            groups.extend([Group::Cli, Group::CliErrors]);
            if args.probe.is_some() {
                groups.push(Group::Place);
            }
        }
    }
    let expect: Option<VmConfig> = match args.expect.as_deref().map(serde_json::from_str) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(e)) => {
            eprintln!("loci-vm-check: --expect is not a numa-vm --describe JSON: {e}");
            std::process::exit(2);
        }
    };
    let mut c = Checker::new();
    let nodes = match read_nodes() {
        Ok(n) => n,
        Err(e) => {
            c.check("sysfs/read", || Err(e));
            std::process::exit(1);
        }
    };
    let region = args.region_mib << 20;
    for g in groups {
        match g {
            Group::Sysfs => match &expect {
                Some(x) => sysfs_checks(&mut c, &nodes, x),
                None => c.check("sysfs", || Err("the sysfs group needs --expect".into())),
            },
            Group::Mem => mem_checks(&mut c, &nodes, region),
            Group::Threads => thread_checks(&mut c, &nodes),
            Group::Errors => error_checks(&mut c, &nodes),
            Group::Cli => match (&args.loci, &expect) {
                (Some(l), Some(x)) => cli_checks(&mut c, l, x, &nodes),
                _ => c.check("cli", || {
                    Err("the cli group needs --loci and --expect".into())
                }),
            },
            Group::Place => match (&args.loci, &args.probe) {
                (Some(l), Some(p)) => place::checks(&mut c, l, p, &nodes, args.child_ns.as_deref()),
                _ => c.check("place", || {
                    Err("the place group needs --loci and --probe".into())
                }),
            },
            Group::CliErrors => match &args.loci {
                Some(l) => place::error_checks(&mut c, l, &nodes),
                None => c.check("cli-errors", || {
                    Err("the cli-errors group needs --loci".into())
                }),
            },
        }
    }
    std::process::exit(c.exit_code());
}
