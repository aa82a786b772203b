//! What the allocator needs from the OS, without ever allocating: anonymous mappings at an
//! alignment, `mbind`, the region map, the cpu -> node map read once from sysfs, environment.
//!
//! `loci_place::sys::mbind` takes a `NodeSet`, which lives on the heap; an allocator cannot
//! allocate while it allocates, so the syscall is issued here with a mask on the stack.

use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering::*};

/// Highest node id + 1 the allocator keeps state for (per-node pools are static arrays).
pub const MAX_NODES: usize = 64;
/// Cpus the cpu -> node map covers; cpus beyond it are treated as node 0.
pub const MAX_CPUS: usize = 4096;

/// Memory policy used to bind superblocks and large mappings to their node.
pub const MPOL_PREFERRED: i32 = 1;
/// Strict binding (page faults fail instead of falling back when the node is full).
pub const MPOL_BIND: i32 = 2;

/// Maps `len` bytes aligned to `align` (a power of two). Null on failure.
pub fn map_aligned(len: usize, align: usize) -> *mut u8 {
    let total = len + align;
    // SAFETY: anonymous private mapping at a kernel-chosen address; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return core::ptr::null_mut();
    }
    let start = p as usize;
    let aligned = (start + align - 1) & !(align - 1);
    let head = aligned - start;
    let tail = total - head - len;
    // SAFETY: both trimmed ranges lie inside the mapping just made and are not used by anyone.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
    }
    aligned as *mut u8
}

/// Resizes the mapping at `p` (`len` bytes) to `new_len` bytes where it lies (`to` None: shrinking
/// always works, growing only where the address space after it is free), or moves it onto `to`,
/// a mapping of `new_len` bytes that it replaces (`mremap` with `MREMAP_FIXED`: the pages move
/// with their contents and memory policy, nothing is copied or faulted in again). False when the
/// kernel refuses.
///
/// # Safety
/// `p..p + len` is a mapping of ours that nothing else uses, and `to`, if any, is one of
/// `new_len` bytes that nothing uses; both are page aligned.
pub unsafe fn remap(p: *mut u8, len: usize, new_len: usize, to: Option<*mut u8>) -> bool {
    // SAFETY: the caller owns both ranges (contract above).
    let q = unsafe {
        match to {
            None => libc::mremap(p as *mut libc::c_void, len, new_len, 0),
            Some(t) => libc::mremap(
                p as *mut libc::c_void,
                len,
                new_len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                t as *mut libc::c_void,
            ),
        }
    };
    q != libc::MAP_FAILED
}

/// Unmaps a range made by [`map_aligned`].
///
/// # Safety
/// Nothing may use the range afterwards.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    // SAFETY: the caller owns the mapping and gives it up.
    unsafe { libc::munmap(p as *mut libc::c_void, len) };
}

/// `mbind(2)` of a range to one node. Returns false when the kernel refused (no NUMA support,
/// node offline); the memory stays usable, only unbound.
///
/// # Safety
/// The range must be a mapping owned by the allocator.
pub unsafe fn bind(p: *mut u8, len: usize, node: usize, mode: i32) -> bool {
    if node >= MAX_NODES {
        return false;
    }
    let mask: [u64; MAX_NODES / 64] = {
        let mut m = [0u64; MAX_NODES / 64];
        m[node / 64] |= 1 << (node % 64);
        m
    };
    // SAFETY: the caller owns the range; the mask is valid for MAX_NODES bits (maxnode is
    // passed as bits + 1, the kernel's convention).
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            p,
            len,
            mode,
            mask.as_ptr(),
            MAX_NODES + 1,
            0u32,
        )
    };
    r == 0
}

/// Advises a range as transparent huge pages (`madvise(MADV_HUGEPAGE)`). The kernel backs its
/// 2 MiB-aligned parts with huge pages where THP is enabled (`always` or `madvise`); where it
/// is not, the call fails or does nothing and the range stays on 4 KiB pages, which is fine.
///
/// # Safety
/// The range must be a mapping owned by the allocator.
pub unsafe fn advise_hugepages(p: *mut u8, len: usize) {
    // SAFETY: the caller owns the range; advice does not change its contents.
    unsafe { libc::madvise(p as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
}

/// Gives the pages of a range back to the kernel (`madvise(MADV_DONTNEED)`): they leave the
/// resident set at once and read as zero when touched again. `MADV_FREE` would leave them
/// counted in RSS until the kernel needs memory.
///
/// # Safety
/// The range is page-aligned, lies in a mapping owned by the allocator and holds nothing
/// anyone will read.
pub unsafe fn purge(p: usize, len: usize) {
    // SAFETY: the caller owns the range and needs none of its contents.
    unsafe { libc::madvise(p as *mut libc::c_void, len, libc::MADV_DONTNEED) };
}

/// The cpu the calling thread runs on (glibc reads it from rseq: a few ns), or 0.
#[inline]
pub fn current_cpu() -> usize {
    // SAFETY: no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 {
        0
    } else {
        c as usize
    }
}

/// If the calling thread may run only on cpus of one node, that node.
pub fn affinity_node(cpu_node: &[u8; MAX_CPUS]) -> Option<usize> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: `set` is writable and sized as passed.
    let r =
        unsafe { libc::sched_getaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return None;
    }
    let mut node = None;
    for (c, &n) in cpu_node.iter().enumerate().take(libc::CPU_SETSIZE as usize) {
        // SAFETY: c < CPU_SETSIZE.
        if unsafe { libc::CPU_ISSET(c, &set) } {
            let n = n as usize;
            match node {
                None => node = Some(n),
                Some(m) if m != n => return None,
                _ => {}
            }
        }
    }
    node
}

// ---------------------------------------------------------------------------------------------
// Region map: one byte per `align`-sized slot of the 47-bit address space, holding the kind of
// the region (superblock or large mapping) of this allocator that starts there, 0 where none
// does. `free` of a pointer reads the byte of `ptr >> shift`: one load tells a foreign pointer
// (0: pointers of the system allocator never lie inside our mappings), a superblock's block
// and a large block apart, without reading the region's header. 32 MiB of zero pages in .bss;
// only touched pages use memory (one page per 4096 slots, i.e. per 16 GiB or more of address
// space).

const ADDR_BITS: usize = 47;
/// Smallest region alignment (the map is sized for it).
pub const MIN_REGION_SHIFT: usize = 22;
/// Largest region alignment (the superblock size is at most 64 MiB).
pub const MAX_REGION_SHIFT: usize = 26;
const MAP_BYTES: usize = 1 << (ADDR_BITS - MIN_REGION_SHIFT);
/// Region kinds in the region map (0: no region of ours starts in the slot).
pub const REGION_SUPERBLOCK: u8 = 1;
pub const REGION_LARGE: u8 = 2;
/// The region shift and the map in one static, so that `free` reaches both from one address
/// (a static of this library is reached through the GOT: one load for each static read).
#[repr(C)]
struct Regions {
    /// log2 of the region alignment; set once at init ([`set_region_shift`]).
    shift: AtomicUsize,
    map: [AtomicU8; MAP_BYTES],
}
static REGIONS: Regions = Regions {
    shift: AtomicUsize::new(MIN_REGION_SHIFT),
    map: [const { AtomicU8::new(0) }; MAP_BYTES],
};
/// log2 of the region alignment; set once at init, always in
/// `MIN_REGION_SHIFT..=MAX_REGION_SHIFT` ([`region`] relies on it).
pub(crate) static REGION_SHIFT: &AtomicUsize = &REGIONS.shift;

/// Sets the region alignment to `2^shift`, clamped to `MIN_REGION_SHIFT..=MAX_REGION_SHIFT`
/// (what [`region`] relies on). Called once at init, before any region is mapped.
pub(crate) fn set_region_shift(shift: usize) {
    REGIONS
        .shift
        .store(shift.clamp(MIN_REGION_SHIFT, MAX_REGION_SHIFT), Relaxed);
}

/// Records the kind of the region starting at `base` (`kind` 0: no region any more). False if
/// the address is outside the range the map covers.
pub(crate) fn mark(base: usize, kind: u8) -> bool {
    if base >> ADDR_BITS != 0 {
        return false;
    }
    REGIONS.map[base >> REGIONS.shift.load(Relaxed)].store(kind, Release);
    true
}

/// Header slots a region's header may sit in (see [`header_of`]).
pub const HEADER_COLORS: usize = 16;
/// Distance between header slots; a region header must fit in it.
pub const HEADER_STEP: usize = 256;

/// Where the header of the region starting at `base` sits: at one of [`HEADER_COLORS`] offsets
/// inside the region's first page, chosen by the region's address. Regions are aligned to
/// 4 MiB or more, so headers at offset 0 would all fall into the same L1 cache set (its index
/// bits are the low 12 bits of the address) and evict each other on every slow free, which
/// reads the header.
#[inline]
pub fn header_of(base: usize) -> usize {
    base + ((base >> REGIONS.shift.load(Relaxed)) & (HEADER_COLORS - 1)) * HEADER_STEP
}

/// Region start of `p` and the region's kind ([`REGION_SUPERBLOCK`] or [`REGION_LARGE`]) if
/// `p` lies in a region of this allocator: free's first step, one load of the region shift
/// and one of the map.
#[inline(always)]
pub fn region(p: usize) -> Option<(usize, u8)> {
    let shift = REGIONS.shift.load(Relaxed);
    // SAFETY: `set_region_shift` stores a shift in MIN_REGION_SHIFT..=MAX_REGION_SHIFT (and
    // the initial value is MIN_REGION_SHIFT); telling the compiler so spares the masking of
    // the count.
    unsafe { core::hint::assert_unchecked((MIN_REGION_SHIFT..=MAX_REGION_SHIFT).contains(&shift)) };
    let i = p >> shift;
    // One comparison with a constant instead of a test of the pointer's high bits before the
    // shift: an index below MAP_BYTES whose slot lies beyond the 47-bit address space (a
    // pointer of 2^47 or more, which no mapping of ours or of the system allocator has) is
    // never marked (`mark` refuses such bases), so it reads 0.
    if i >= MAP_BYTES {
        return None;
    }
    // SAFETY: i < MAP_BYTES, checked above. No bounds check: its panic branch would cost
    // `free` a stack frame.
    let kind = unsafe { REGIONS.map.get_unchecked(i) }.load(Acquire);
    if kind != 0 {
        Some((i << shift, kind))
    } else {
        None
    }
}

/// Region start of `p` and where its header sits (as [`header_of`]) if `p` lies in a region
/// of this allocator.
#[inline]
pub fn region_and_header(p: usize) -> Option<(usize, usize)> {
    region(p).map(|(base, _)| (base, header_of(base)))
}

/// Region start of `p` if it lies in a region of this allocator.
#[inline]
pub fn region_of(p: usize) -> Option<usize> {
    region(p).map(|(base, _)| base)
}

// ---------------------------------------------------------------------------------------------
// sysfs, read with raw syscalls into stack buffers.

/// `/sys/devices/system/node/node<N><suffix>` as a NUL-terminated path on the stack (no heap:
/// the allocator reads sysfs before it can allocate); `suffix` ends with `\0`, `node` < 100.
fn node_file(node: usize, suffix: &[u8]) -> [u8; 64] {
    let mut path = [0u8; 64];
    let prefix = b"/sys/devices/system/node/node";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut k = prefix.len();
    if node >= 10 {
        path[k] = b'0' + (node / 10) as u8;
        k += 1;
    }
    path[k] = b'0' + (node % 10) as u8;
    k += 1;
    path[k..k + suffix.len()].copy_from_slice(suffix);
    path
}

/// Reads a small file into `buf`; returns the bytes read.
pub fn read_file(path: &core::ffi::CStr, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: `path` is NUL-terminated; flags are plain.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut n = 0;
    while n < buf.len() {
        // SAFETY: the destination is the unused tail of `buf`.
        let r = unsafe {
            libc::read(
                fd,
                buf[n..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - n,
            )
        };
        if r <= 0 {
            break;
        }
        n += r as usize;
    }
    // SAFETY: fd was opened above.
    unsafe { libc::close(fd) };
    Some(n)
}

/// The largest id [`parse_list`] accepts: the limit of loci's cpu and node lists
/// (`loci_topo::idset::MAX_ID`). Bounding ids bounds the work of a range (`0-99999999999`
/// would otherwise call `f` for ever).
pub const MAX_LIST_ID: usize = 65_535;

/// Calls `f(id)` for every id of a Linux list (`0-3,8,10-11`). Returns false on malformed text
/// and on an id above [`MAX_LIST_ID`].
pub fn parse_list(text: &[u8], mut f: impl FnMut(usize)) -> bool {
    let mut i = 0;
    let num = |i: &mut usize| -> Option<usize> {
        let s = *i;
        let mut v: usize = 0;
        while *i < text.len() && text[*i].is_ascii_digit() {
            v = v.checked_mul(10)?.checked_add((text[*i] - b'0') as usize)?;
            *i += 1;
        }
        (*i > s && v <= MAX_LIST_ID).then_some(v)
    };
    while i < text.len() && !text[i].is_ascii_whitespace() {
        let Some(a) = num(&mut i) else { return false };
        let mut b = a;
        if i < text.len() && text[i] == b'-' {
            i += 1;
            let Some(v) = num(&mut i) else { return false };
            b = v;
        }
        if b < a {
            return false;
        }
        for x in a..=b {
            f(x);
        }
        if i < text.len() && text[i] == b',' {
            i += 1;
        } else if i < text.len() && !text[i].is_ascii_whitespace() {
            return false;
        }
    }
    true
}

/// The node map: which node every cpu belongs to, and which nodes are online.
pub struct NodeMap {
    /// Node of each cpu (0 where unknown).
    pub cpu_node: [u8; MAX_CPUS],
    /// Bit n set: node n is online and has been seen.
    pub nodes: u64,
    /// Bit n set: node n has memory (`has_memory`; all nodes when the file is missing).
    pub mem_nodes: u64,
    /// `distance[a][b]`: the firmware's (SLIT) distance from node a to node b; 0 where unknown.
    pub distance: [[u8; MAX_NODES]; MAX_NODES],
}

impl NodeMap {
    /// One node holding every cpu (machines without NUMA information).
    pub const fn single() -> Self {
        NodeMap {
            cpu_node: [0; MAX_CPUS],
            nodes: 1,
            mem_nodes: 1,
            distance: [[0; MAX_NODES]; MAX_NODES],
        }
    }

    /// Records node `node`'s row of distances (`/sys/devices/system/node/nodeN/distance`: one
    /// number per online node, in node order). False if malformed.
    pub fn add_distances(&mut self, node: usize, row: &[u8]) -> bool {
        if node >= MAX_NODES {
            return false;
        }
        let mut to = (0..MAX_NODES).filter(|&n| self.nodes >> n & 1 == 1);
        let mut v: u32 = 0;
        let mut digits = 0;
        for &b in row.iter().chain(b" ") {
            if b.is_ascii_digit() {
                v = v * 10 + (b - b'0') as u32;
                digits += 1;
                if v > 255 {
                    return false;
                }
            } else if b.is_ascii_whitespace() {
                if digits > 0 {
                    let Some(t) = to.next() else { return false };
                    self.distance[node][t] = v as u8;
                }
                v = 0;
                digits = 0;
            } else {
                return false;
            }
        }
        true
    }

    /// The node whose memory threads of `node` get: `node` itself when it has memory, else
    /// the nearest node with memory by distance (ties and unknown distances: the lowest id),
    /// which is also where the kernel's own fallback would look first. None when no node has
    /// memory (cannot happen on a running system).
    pub fn memory_node(&self, node: usize) -> Option<usize> {
        if node < MAX_NODES && self.mem_nodes >> node & 1 == 1 {
            return Some(node);
        }
        let dist = |m: usize| -> u32 {
            match self.distance.get(node).map(|row| row[m]) {
                Some(d) if d > 0 => d as u32,
                _ => u32::MAX,
            }
        };
        (0..MAX_NODES)
            .filter(|&m| self.mem_nodes >> m & 1 == 1)
            .min_by_key(|&m| (dist(m), m))
    }

    /// Adds node `node` with the cpus of `cpulist` (Linux list text). False if malformed.
    pub fn add_node(&mut self, node: usize, cpulist: &[u8]) -> bool {
        if node >= MAX_NODES {
            return false;
        }
        self.nodes |= 1 << node;
        let map = &mut self.cpu_node;
        parse_list(cpulist, |c| {
            if c < MAX_CPUS {
                map[c] = node as u8;
            }
        })
    }

    /// Reads `/sys/devices/system/node` (online nodes and their cpu lists); a single node 0 when
    /// the directory is missing or unreadable.
    pub fn read_sysfs(&mut self) {
        let mut buf = [0u8; 4096];
        let Some(n) = read_file(c"/sys/devices/system/node/online", &mut buf) else {
            *self = Self::single();
            return;
        };
        let mut online = 0u64;
        if !parse_list(&buf[..n], |x| {
            if x < MAX_NODES {
                online |= 1 << x
            }
        }) || online == 0
        {
            *self = Self::single();
            return;
        }
        self.nodes = 0;
        for node in 0..MAX_NODES {
            if online >> node & 1 == 0 {
                continue;
            }
            let path = node_file(node, b"/cpulist\0");
            let Ok(p) = core::ffi::CStr::from_bytes_until_nul(&path) else {
                continue;
            };
            let mut cl = [0u8; 4096];
            match read_file(p, &mut cl) {
                Some(m) => {
                    self.add_node(node, &cl[..m]);
                }
                None => self.nodes |= 1 << node,
            }
        }
        if self.nodes == 0 {
            *self = Self::single();
            return;
        }
        for node in 0..MAX_NODES {
            if self.nodes >> node & 1 == 0 {
                continue;
            }
            let path = node_file(node, b"/distance\0");
            let Ok(p) = core::ffi::CStr::from_bytes_until_nul(&path) else {
                continue;
            };
            let mut row = [0u8; 1024];
            if let Some(m) = read_file(p, &mut row) {
                if !self.add_distances(node, &row[..m]) {
                    self.distance[node] = [0; MAX_NODES];
                }
            }
        }
        self.mem_nodes = self.nodes;
        if let Some(n) = read_file(c"/sys/devices/system/node/has_memory", &mut buf) {
            let mut m = 0u64;
            if parse_list(&buf[..n], |x| {
                if x < MAX_NODES {
                    m |= 1 << x
                }
            }) && m != 0
            {
                self.mem_nodes = m & self.nodes;
            }
        }
    }
}

/// Writes `v` in decimal into `buf` and returns the digits (no allocation).
pub fn fmt_usize(mut v: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

/// Parses a byte size with an optional K/M/G suffix (`10M`, `16777216`).
pub fn parse_size(s: &[u8]) -> Option<usize> {
    let (digits, mult) = match s.last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1usize << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: usize = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((d - b'0') as usize)?;
    }
    v.checked_mul(mult)
}

/// The value of an environment variable, without allocating.
pub fn getenv(name: &core::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: `name` is NUL-terminated; getenv returns null or a NUL-terminated string that
    // lives as long as the environment is not modified (read once at init).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null getenv result is a valid C string.
    Some(unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_like_the_kernel_prints_them() {
        let mut v = Vec::new();
        assert!(parse_list(b"0-3,8,10-11\n", |x| v.push(x)));
        assert_eq!(v, [0, 1, 2, 3, 8, 10, 11]);
        assert!(parse_list(b"\n", |_| panic!()));
        assert!(!parse_list(b"3-1", |_| {}));
        assert!(!parse_list(b"1,x", |_| {}));
        assert!(!parse_list(b"-1", |_| {}));
    }

    #[test]
    fn lists_refuse_ids_beyond_the_limit_instead_of_walking_them() {
        // This range called `f` 2^64 times: a hang inside the allocator's first call.
        assert!(!parse_list(b"0-18446744073709551615", |_| {}));
        assert!(!parse_list(b"65536", |_| panic!()));
        let mut n = 0;
        assert!(parse_list(b"65530-65535\n", |_| n += 1));
        assert_eq!(n, 6);
    }

    #[test]
    fn node_map_from_literal_text() {
        let mut m = NodeMap::single();
        m.nodes = 0;
        m.mem_nodes = 0;
        assert!(m.add_node(0, b"0-1,4-5\n"));
        assert!(m.add_node(1, b"2-3,6-7\n"));
        assert!(m.add_node(3, b"\n")); // memory-only node
        assert_eq!(m.nodes, 0b1011);
        assert_eq!(&m.cpu_node[..8], &[0, 0, 1, 1, 0, 0, 1, 1]);
        assert!(!m.add_node(MAX_NODES, b"0"));
    }

    #[test]
    fn memoryless_nodes_fall_back_to_the_nearest_node_with_memory() {
        let mut m = NodeMap::single();
        m.nodes = 0;
        for n in 0..4 {
            assert!(m.add_node(n, b"\n"));
        }
        m.mem_nodes = 0b1101; // node 1 has no memory
        assert!(m.add_distances(0, b"10 20 30 40\n"));
        assert!(m.add_distances(1, b"20 10 12 12\n"));
        assert!(m.add_distances(2, b"30 12 10 20\n"));
        assert!(m.add_distances(3, b"40 12 20 10\n"));
        assert_eq!(m.memory_node(0), Some(0));
        assert_eq!(m.memory_node(2), Some(2));
        // nodes 2 and 3 are equally near node 1: the lower id wins
        assert_eq!(m.memory_node(1), Some(2));
        // without distances: the lowest node with memory
        m.distance = [[0; MAX_NODES]; MAX_NODES];
        assert_eq!(m.memory_node(1), Some(0));
        m.mem_nodes = 0;
        assert_eq!(m.memory_node(1), None);
        // malformed rows are refused
        assert!(!m.add_distances(0, b"10 x\n"));
        assert!(!m.add_distances(0, b"10 20 30 40 50\n"));
        assert!(!m.add_distances(0, b"10 999\n"));
    }

    #[test]
    fn numbers_format_without_allocating() {
        let mut b = [0u8; 20];
        assert_eq!(fmt_usize(0, &mut b), b"0");
        assert_eq!(fmt_usize(63, &mut b), b"63");
        assert_eq!(fmt_usize(usize::MAX, &mut b), b"18446744073709551615");
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size(b"10M"), Some(10 << 20));
        assert_eq!(parse_size(b"4096"), Some(4096));
        assert_eq!(parse_size(b"2g"), Some(2 << 30));
        assert_eq!(parse_size(b"M"), None);
        assert_eq!(parse_size(b"1x"), None);
        assert_eq!(parse_size(b"99999999999999999999G"), None);
    }

    #[test]
    fn aligned_maps_are_aligned_and_marked() {
        let a = 1 << 26; // the largest region alignment, valid whatever init chose
        let p = map_aligned(3 << 20, a);
        assert!(!p.is_null());
        assert_eq!(p as usize % a, 0);
        assert!(mark(p as usize, REGION_LARGE));
        assert_eq!(region_of(p as usize + 12345), Some(p as usize));
        assert_eq!(region(p as usize + 12345), Some((p as usize, REGION_LARGE)));
        // Null and pointers beyond the 47-bit address space are never ours, whatever the
        // shift (a slot index past the space's end is never marked).
        for q in [0, 1 << 47, (1 << 47) + (p as usize), 1 << 52, usize::MAX] {
            assert_eq!(region(q), None, "{q:#x}");
        }
        assert!(mark(p as usize, 0));
        assert_eq!(region_of(p as usize + 12345), None);
        assert_eq!(region(p as usize + 12345), None);
        // SAFETY: mapped above, not used after.
        unsafe { unmap(p, 3 << 20) };
    }
}
