//! Placement check for loci-alloc, meant for multi-node machines and the NUMA VMs: for every
//! node k with cpus, a thread pinned to node k allocates and writes small, medium and large
//! blocks (three large ones grown by `realloc`), and `move_pages` must find at least 99% of their pages on node k; blocks that
//! `alloc_on(k)` gives to a thread of another node must sit on k as well.
//!
//! Prints one check line per node with loci-vm's `Checker` (`LOCI-CHECK ok NAME` and a
//! `# NAME: DETAIL` line with what it measured, or `LOCI-CHECK FAIL NAME -- DETAIL`) and exits 1
//! if any failed. Nodes without memory cannot hold pages: there the blocks must be on
//! the nearest node with memory (`NodeStats::memory_from`), the allocator must have counted the
//! fallback (`NodeStats::fallback_heaps`), and `alloc_on` of the node must be an error.
//! `cargo run --release -p loci-alloc --example placement_check`

use std::alloc::Layout;

use loci_alloc::os::NodeMap;
use loci_alloc::LociAlloc;
use loci_topo::CpuSet;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

/// Result for one node.
#[derive(Debug)]
pub struct NodeCheck {
    pub node: usize,
    pub pages: usize,
    pub on_node: usize,
    pub alloc_on_pages: usize,
    pub alloc_on_on_node: usize,
    pub node_of_agrees: bool,
    /// The node has memory. Else the thread's blocks must be on `target`, the nearest node
    /// with memory, and the allocator must have counted the fallback.
    pub has_memory: bool,
    /// Where the blocks must be: `node`, or the fallback for a memoryless node.
    pub target: usize,
    /// `stats().nodes[node].fallback_heaps` grew (memoryless nodes only; true otherwise).
    pub fallback_reported: bool,
}

impl NodeCheck {
    pub fn ratio(&self) -> f64 {
        self.on_node as f64 / self.pages.max(1) as f64
    }
    pub fn alloc_on_ratio(&self) -> f64 {
        if self.alloc_on_pages == 0 {
            1.0
        } else {
            self.alloc_on_on_node as f64 / self.alloc_on_pages as f64
        }
    }
    /// The check's name: `alloc/pinned/nodeK`, or `alloc/memoryless-nodeK/falls-back`.
    pub fn name(&self) -> String {
        if self.has_memory {
            format!("alloc/pinned/node{}", self.node)
        } else {
            format!("alloc/memoryless-node{}/falls-back", self.node)
        }
    }

    /// What was measured, for the check line.
    pub fn detail(&self) -> String {
        format!(
            "{} of {} pages on node {} ({:.4}); alloc_on: {} of {} ({:.4}); node_of agrees: {}; fallback counted: {}",
            self.on_node,
            self.pages,
            self.target,
            self.ratio(),
            self.alloc_on_on_node,
            self.alloc_on_pages,
            self.alloc_on_ratio(),
            self.node_of_agrees,
            self.fallback_reported
        )
    }

    pub fn ok(&self) -> bool {
        if !self.has_memory {
            return self.pages > 0
                && self.ratio() >= 0.99
                && self.node_of_agrees
                && self.fallback_reported
                && self.target != self.node;
        }
        self.pages > 0
            && self.ratio() >= 0.99
            && self.alloc_on_ratio() >= 0.99
            && self.node_of_agrees
    }
}

fn sizes() -> Vec<usize> {
    let mut v = Vec::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(match i % 10 {
            0..=5 => 8192 + (x % (504 * 1024)) as usize, // medium classes
            6..=8 => 64 + (x % 7000) as usize,           // small classes
            _ => (1 << 20) + (x % (2 << 20)) as usize,   // large mappings
        });
    }
    v
}

/// Allocates and writes the blocks, then counts their pages on `node`.
fn count(blocks: &[(usize, usize)], node: usize) -> (usize, usize) {
    let (mut pages, mut on) = (0, 0);
    for &(p, n) in blocks {
        let st = loci_place::sys::buffer_pages_nodes(p as *const u8, n).expect("move_pages");
        pages += st.len();
        on += st.iter().filter(|&&s| s == node as i32).count();
    }
    (pages, on)
}

fn alloc_write(n: usize) -> (usize, usize) {
    let l = Layout::from_size_align(n, 16).unwrap();
    // SAFETY: non-zero size; written right away.
    let p = unsafe { std::alloc::alloc(l) };
    assert!(!p.is_null());
    // SAFETY: p has n bytes.
    unsafe { std::ptr::write_bytes(p, 0x5a, n) };
    (p as usize, n)
}

/// Grows the first three large blocks by 16 MiB with `realloc` and writes the new bytes: the
/// mapping grows in place or, past its region slot, moves (`mremap`), and its pages, old and
/// new, must stay on the block's node. (Three: the 4-node VM has 256 MiB per node.)
fn grow_large(blocks: &mut [(usize, usize)]) {
    const MORE: usize = 16 << 20;
    for b in blocks.iter_mut().filter(|b| b.1 > 512 << 10).take(3) {
        let (p, n) = *b;
        let l = Layout::from_size_align(n, 16).unwrap();
        // SAFETY: a live block of `n` bytes allocated with `l`.
        let q = unsafe { std::alloc::realloc(p as *mut u8, l, n + MORE) };
        assert!(!q.is_null());
        // SAFETY: q has n + MORE bytes.
        unsafe { std::ptr::write_bytes(q.add(n), 0x5a, MORE) };
        *b = (q as usize, n + MORE);
    }
}

fn free_all(blocks: Vec<(usize, usize)>) {
    for (p, _) in blocks {
        // SAFETY: live blocks of this allocator.
        unsafe { loci_alloc::free(p as *mut u8) };
    }
}

/// Runs the check on every node with cpus.
pub fn check_all() -> Vec<NodeCheck> {
    let mut map = NodeMap::single();
    map.read_sysfs();
    let allowed = loci_place::sys::get_affinity(0).expect("sched_getaffinity");
    let nodes: Vec<usize> = (0..64).filter(|n| map.nodes >> n & 1 == 1).collect();
    let mut with_mem = 0u64;
    let mut buf = [0u8; 4096];
    match loci_alloc::os::read_file(c"/sys/devices/system/node/has_memory", &mut buf) {
        Some(n) => {
            loci_alloc::os::parse_list(&buf[..n], |x| {
                if x < 64 {
                    with_mem |= 1 << x
                }
            });
        }
        None => with_mem = map.nodes,
    }
    let cpus_of = |n: usize| -> CpuSet {
        allowed
            .iter()
            .filter(|&c| {
                (c as usize) < map.cpu_node.len() && map.cpu_node[c as usize] as usize == n
            })
            .collect()
    };
    let mut out = Vec::new();
    for &k in &nodes {
        let cpus = cpus_of(k);
        if cpus.is_empty() {
            continue; // memory-only node or not allowed here
        }
        let has_memory = with_mem >> k & 1 == 1;
        let before = loci_alloc::stats();
        let target = if has_memory {
            k
        } else {
            before.nodes[k].memory_from
        };
        let (pages, on_node, agrees) = std::thread::spawn(move || {
            // a heap is created before pinning, as in real programs
            let warm = alloc_write(100_000);
            loci_place::sys::set_affinity(0, &cpus).expect("sched_setaffinity");
            let mut blocks: Vec<_> = sizes().into_iter().map(alloc_write).collect();
            grow_large(&mut blocks);
            let agrees = blocks
                .iter()
                .all(|&(p, _)| loci_alloc::node_of(p as *const u8) == Some(target));
            let (pages, on) = count(&blocks, target);
            free_all(blocks);
            free_all(vec![warm]);
            (pages, on, agrees)
        })
        .join()
        .unwrap();
        let fallback_reported = has_memory
            || loci_alloc::stats().nodes[k].fallback_heaps > before.nodes[k].fallback_heaps;
        // alloc_on(k) from a thread pinned to another node (when there is one)
        if !has_memory {
            let l = Layout::from_size_align(4096, 8).unwrap();
            let e =
                loci_alloc::alloc_on(k, l).expect_err("alloc_on of a memoryless node must fail");
            assert!(e.to_string().contains("has no memory"), "{e}");
        }
        let other = nodes
            .iter()
            .copied()
            .find(|&m| m != k && has_memory && !cpus_of(m).is_empty());
        let (ap, aon, aagrees) = match other {
            None => (0, 0, true),
            Some(m) => {
                let cpus = cpus_of(m);
                std::thread::spawn(move || {
                    loci_place::sys::set_affinity(0, &cpus).expect("sched_setaffinity");
                    let blocks: Vec<(usize, usize)> = sizes()
                        .into_iter()
                        .map(|n| {
                            let l = Layout::from_size_align(n, 64).unwrap();
                            let p = loci_alloc::alloc_on(k, l).expect("alloc_on").as_ptr();
                            // SAFETY: p has n bytes.
                            unsafe { std::ptr::write_bytes(p, 0xa5, n) };
                            (p as usize, n)
                        })
                        .collect();
                    let agrees = blocks
                        .iter()
                        .all(|&(p, _)| loci_alloc::node_of(p as *const u8) == Some(k));
                    let (pages, on) = count(&blocks, k);
                    free_all(blocks);
                    (pages, on, agrees)
                })
                .join()
                .unwrap()
            }
        };
        out.push(NodeCheck {
            node: k,
            pages,
            on_node,
            alloc_on_pages: ap,
            alloc_on_on_node: aon,
            node_of_agrees: agrees && aagrees,
            has_memory,
            target,
            fallback_reported,
        });
    }
    out
}

#[allow(dead_code)]
fn main() {
    let mut c = loci_vm::Checker::new();
    let res = check_all();
    if res.is_empty() {
        c.check("alloc/nodes", || Err("no node with cpus found".to_string()));
    }
    for r in &res {
        c.check_noted(r.name(), || {
            if r.ok() {
                Ok(r.detail())
            } else {
                Err(r.detail())
            }
        });
    }
    std::process::exit(c.exit_code());
}
