//! Thin, checked wrappers over the Linux affinity and NUMA memory-policy syscalls.
//!
//! Written by hand on `libc::syscall` because libnuma would add a C dependency for five
//! syscalls, and the Rust crates wrapping them are unmaintained; the kernel ABI here is stable
//! (see `man 2 mbind`, `set_mempolicy`, `get_mempolicy`, `move_pages`).

use std::io;

use loci_topo::{CpuSet, NodeSet};

/// Kernel memory-policy modes (`include/uapi/linux/mempolicy.h`).
pub mod mode {
    pub const MPOL_DEFAULT: i32 = 0;
    pub const MPOL_PREFERRED: i32 = 1;
    pub const MPOL_BIND: i32 = 2;
    pub const MPOL_INTERLEAVE: i32 = 3;
    pub const MPOL_LOCAL: i32 = 4;
    pub const MPOL_PREFERRED_MANY: i32 = 5;
    pub const MPOL_WEIGHTED_INTERLEAVE: i32 = 6;
    /// mbind flags
    pub const MPOL_MF_STRICT: u32 = 1 << 0;
    pub const MPOL_MF_MOVE: u32 = 1 << 1;
    /// get_mempolicy flags
    pub const MPOL_F_NODE: u64 = 1 << 0;
    pub const MPOL_F_ADDR: u64 = 1 << 1;
}

/// Number of bits in the node masks we pass to the kernel. The kernel accepts any maxnode
/// >= its MAX_NUMNODES bits that are actually used; 1024 covers every shipping config.
const MASK_BITS: usize = 1024;
const MASK_WORDS: usize = MASK_BITS / 64;

fn node_mask(nodes: &NodeSet) -> io::Result<[u64; MASK_WORDS]> {
    let mut m = [0u64; MASK_WORDS];
    for n in nodes.iter() {
        let n = n as usize;
        if n >= MASK_BITS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("node {n} is beyond {MASK_BITS}"),
            ));
        }
        m[n / 64] |= 1 << (n % 64);
    }
    Ok(m)
}

fn mask_nodes(m: &[u64]) -> NodeSet {
    let mut s = NodeSet::new();
    for (w, &v) in m.iter().enumerate() {
        for b in 0..64 {
            if v >> b & 1 == 1 {
                s.insert((w * 64 + b) as u32);
            }
        }
    }
    s
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `set_mempolicy(2)` for the calling thread.
pub fn set_mempolicy(mode: i32, nodes: &NodeSet) -> io::Result<()> {
    PolicyMask::new(mode, nodes)?.apply()
}

/// `get_mempolicy(2)` for the calling thread: (mode, nodes).
pub fn get_mempolicy() -> io::Result<(i32, NodeSet)> {
    get_policy(0, 0)
}

/// `get_mempolicy(2)` with `MPOL_F_ADDR`: the policy that governs the page at `addr` (the range
/// policy set by `mbind`, or the thread's policy when the range has none): (mode, nodes).
pub fn get_range_policy(addr: *const u8) -> io::Result<(i32, NodeSet)> {
    get_policy(addr as usize, mode::MPOL_F_ADDR)
}

/// One `get_mempolicy(2)` call; `addr` is only looked up in our address space by the kernel
/// (EFAULT when `MPOL_F_ADDR` names an unmapped address), never dereferenced here.
fn get_policy(addr: usize, flags: u64) -> io::Result<(i32, NodeSet)> {
    let mut mode: i32 = 0;
    let mut m = [0u64; MASK_WORDS];
    // SAFETY: both out-pointers are valid for writes of the sizes given (MASK_BITS bits).
    check(unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut i32,
            m.as_mut_ptr(),
            MASK_BITS,
            addr,
            flags,
        )
    })?;
    Ok((mode, mask_nodes(&m)))
}

/// `mbind(2)` on `[addr, addr+len)`; `addr` must be page aligned.
///
/// # Safety
/// The range must be a mapping owned by the caller; with `MPOL_MF_MOVE` its pages may migrate.
pub unsafe fn mbind(
    addr: *mut u8,
    len: usize,
    mode: i32,
    nodes: &NodeSet,
    flags: u32,
) -> io::Result<()> {
    let m = node_mask(nodes)?;
    let (ptr, max) = if nodes.is_empty() {
        (std::ptr::null(), 0)
    } else {
        (m.as_ptr(), MASK_BITS + 1)
    };
    // SAFETY: caller guarantees the range; the mask pointer is valid for `max` bits.
    check(unsafe { libc::syscall(libc::SYS_mbind, addr, len, mode, ptr, max, flags) }).map(|_| ())
}

/// Node that holds each page (`move_pages(2)` with no target: query only). Entries are node ids,
/// or negative errno (`-ENOENT`: page not yet faulted in, `-EFAULT`: not mapped).
pub fn pages_nodes(pid: i32, pages: &[*const u8]) -> io::Result<Vec<i32>> {
    let mut status = vec![0i32; pages.len()];
    if pages.is_empty() {
        return Ok(status);
    }
    // SAFETY: `pages` and `status` have equal length `count`; nodes = null means query only.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            pid,
            pages.len(),
            pages.as_ptr(),
            std::ptr::null::<i32>(),
            status.as_mut_ptr(),
            0,
        )
    })?;
    Ok(status)
}

/// Node of every page of the buffer `[addr, addr+len)` in this process.
pub fn buffer_pages_nodes(addr: *const u8, len: usize) -> io::Result<Vec<i32>> {
    let ps = page_size();
    let start = addr as usize & !(ps - 1);
    let end = addr as usize + len;
    let pages: Vec<*const u8> = (start..end).step_by(ps).map(|a| a as *const u8).collect();
    pages_nodes(0, &pages)
}

/// Maps `len` bytes of anonymous, private, read-write memory whose address is a multiple of
/// `align` (a power of two; `len` and `align` multiples of the page size), untouched. For an
/// alignment above the page size it maps `len + align` and unmaps the unaligned head and tail.
/// `flags` are added to `MAP_PRIVATE | MAP_ANONYMOUS` (e.g. `libc::MAP_NORESERVE`, or 0).
/// Allocates nothing on the heap. The mapping behind [`AnonMap::new`], which owns the result.
fn map_anonymous_aligned(
    len: usize,
    align: usize,
    flags: i32,
) -> io::Result<std::ptr::NonNull<u8>> {
    let ps = page_size();
    if len == 0 || !align.is_power_of_two() || !len.is_multiple_of(ps) || !align.is_multiple_of(ps)
    {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let extra = if align > ps { align } else { 0 };
    let total = len
        .checked_add(extra)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    // SAFETY: anonymous private mapping at a kernel-chosen address; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let start = p as usize;
    let aligned = (start + align - 1) & !(align - 1);
    let head = aligned - start;
    let tail = total - head - len;
    // SAFETY: both trimmed ranges lie inside the mapping just made, are page aligned (mmap returns
    // page-aligned addresses; align and len are page multiples) and nobody uses them.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
    }
    Ok(std::ptr::NonNull::new(aligned as *mut u8).expect("mmap never maps address 0 here"))
}

/// An anonymous private read-write mapping owned by this value and unmapped when it is dropped:
/// the one owner of mapped memory for loci's arrays, table morsels and stream buffers (each adds
/// its own placement on top). It hands out only raw pointers; whoever writes through them keeps
/// the writes disjoint.
pub struct AnonMap {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: an AnonMap exclusively owns its pages and exposes them only as raw pointers (whose
// dereference is the caller's unsafe responsibility), like a `Box<[u8]>` seen through pointers.
unsafe impl Send for AnonMap {}
// SAFETY: see above; `&AnonMap` reads nothing but the address and the length.
unsafe impl Sync for AnonMap {}

impl AnonMap {
    /// Maps `len` bytes rounded up to whole pages (at least one), at an address that is a
    /// multiple of `align` (a power of two, a multiple of the page size; the page size itself
    /// for no constraint), untouched. `flags` are added to `MAP_PRIVATE | MAP_ANONYMOUS`.
    pub fn new(len: usize, align: usize, flags: i32) -> io::Result<Self> {
        let len = len.max(1).next_multiple_of(page_size());
        let ptr = map_anonymous_aligned(len, align, flags)?;
        Ok(Self { ptr, len })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Node of the pages holding the given byte offsets (`move_pages` query; `-errno` per page,
    /// `-ENOENT` for a page not touched yet). Offsets past the end are left out.
    pub fn nodes_at(&self, offsets: impl IntoIterator<Item = usize>) -> io::Result<Vec<i32>> {
        let pages: Vec<*const u8> = offsets
            .into_iter()
            .filter(|&o| o < self.len)
            // SAFETY: o < len: an address inside the mapping (not dereferenced).
            .map(|o| unsafe { self.ptr.as_ptr().add(o) } as *const u8)
            .collect();
        pages_nodes(0, &pages)
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping this value made and owns; nothing borrows it past `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The system page size in bytes.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as usize
    } else {
        4096
    }
}

/// A cpu set converted to the kernel's `cpu_set_t` ahead of time, so that applying it is a
/// single syscall with no allocation (safe between `fork` and `exec`).
#[derive(Clone, Copy)]
pub struct CpuMask(libc::cpu_set_t);

impl CpuMask {
    /// Converts; errors on a cpu id beyond `CPU_SETSIZE` or an empty set.
    pub fn new(cpus: &CpuSet) -> io::Result<Self> {
        if cpus.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty cpu set: a thread needs at least one cpu",
            ));
        }
        // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for c in cpus.iter() {
            if c as usize >= libc::CPU_SETSIZE as usize {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("cpu {c} is beyond CPU_SETSIZE ({})", libc::CPU_SETSIZE),
                ));
            }
            // SAFETY: c < CPU_SETSIZE was checked above.
            unsafe { libc::CPU_SET(c as usize, &mut set) };
        }
        Ok(Self(set))
    }

    /// `sched_setaffinity(tid, mask)`. Async-signal-safe: one syscall, no allocation
    /// (the error path only builds an `io::Error` from errno, which does not allocate).
    pub fn apply(&self, tid: i32) -> io::Result<()> {
        // SAFETY: `self.0` is a valid cpu_set_t of the size passed.
        let r = unsafe {
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &self.0)
        };
        check(r as libc::c_long).map(|_| ())
    }
}

/// A memory policy converted to its kernel arguments ahead of time (see [`CpuMask`]).
#[derive(Clone, Copy)]
pub struct PolicyMask {
    mode: i32,
    mask: [u64; MASK_WORDS],
    empty: bool,
}

impl PolicyMask {
    /// Converts; errors on a node id beyond the mask size.
    pub fn new(mode: i32, nodes: &NodeSet) -> io::Result<Self> {
        Ok(Self {
            mode,
            mask: node_mask(nodes)?,
            empty: nodes.is_empty(),
        })
    }

    /// `set_mempolicy` for the calling thread. Async-signal-safe: one syscall, no allocation.
    pub fn apply(&self) -> io::Result<()> {
        let (ptr, max) = if self.empty {
            (std::ptr::null(), 0)
        } else {
            (self.mask.as_ptr(), MASK_BITS + 1)
        };
        // SAFETY: `ptr` is null or points at MASK_WORDS u64s, matching `max` bits.
        check(unsafe { libc::syscall(libc::SYS_set_mempolicy, self.mode, ptr, max) }).map(|_| ())
    }
}

/// Sets the affinity of a thread (`tid` 0 = the calling thread) or of a whole process's main thread.
pub fn set_affinity(tid: i32, cpus: &CpuSet) -> io::Result<()> {
    CpuMask::new(cpus)?.apply(tid)
}

/// The calling thread's kernel thread id.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// `prctl(PR_SET_THP_DISABLE)`: `true` turns transparent huge pages off for this process and
/// everything it forks or execs (inherited); no root needed. Async-signal-safe.
pub fn set_thp_disable(disable: bool) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, disable as libc::c_ulong, 0, 0, 0) };
    check(r as libc::c_long).map(|_| ())
}

/// `prctl(PR_GET_THP_DISABLE)`: whether THP is disabled for this process.
pub fn thp_disabled() -> io::Result<bool> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
    check(r as libc::c_long).map(|v| v != 0)
}

/// Affinity of a thread (`tid` 0 = the calling thread).
pub fn get_affinity(tid: i32) -> io::Result<CpuSet> {
    // SAFETY: cpu_set_t is plain data; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and sized as passed.
    let r =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    check(r as libc::c_long)?;
    // SAFETY: every index is below CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .map(|c| c as u32)
        .collect())
}

/// The cpu the calling thread is running on right now.
pub fn current_cpu() -> io::Result<u32> {
    // SAFETY: no preconditions.
    let r = unsafe { libc::sched_getcpu() };
    check(r as libc::c_long).map(|v| v as u32)
}

/// CPU seconds (user + system) the calling thread has used, to the nanosecond
/// (`CLOCK_THREAD_CPUTIME_ID`); 0 when unreadable. For spans of a few milliseconds too:
/// `getrusage(RUSAGE_THREAD)` is split by scheduler ticks and can read 0 for them.
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_cpu_time_counts_this_threads_work_only() {
        let c0 = thread_cpu_seconds();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        // A pass of about a millisecond: the thread clock sees it.
        let spent = thread_cpu_seconds() - c0;
        assert!(spent > 0.0, "{spent}");
        // Another thread's work is not this thread's.
        let c1 = thread_cpu_seconds();
        let other = std::thread::spawn(|| {
            let t0 = thread_cpu_seconds();
            let mut y = 0u64;
            for i in 0..20_000_000u64 {
                y = std::hint::black_box(y.wrapping_mul(31).wrapping_add(i));
            }
            thread_cpu_seconds() - t0
        })
        .join()
        .unwrap();
        assert!(other > 0.0);
        assert!(
            thread_cpu_seconds() - c1 < other,
            "a join costs less than the work joined"
        );
    }

    #[test]
    fn masks_roundtrip() {
        let n = NodeSet::parse("0,3,64,1000").unwrap();
        assert_eq!(mask_nodes(&node_mask(&n).unwrap()), n);
        assert!(node_mask(&NodeSet::single(5000)).is_err());
    }

    #[test]
    fn affinity_roundtrip_on_this_machine() {
        let before = get_affinity(0).unwrap();
        let one = CpuSet::single(before.first().unwrap());
        std::thread::spawn(move || {
            set_affinity(0, &one).unwrap();
            assert_eq!(get_affinity(0).unwrap(), one);
            assert_eq!(current_cpu().unwrap(), one.first().unwrap());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn aligned_anonymous_mappings() {
        let ps = page_size();
        for align in [ps, 2 << 20] {
            let len = 3 * ps;
            let p = map_anonymous_aligned(len, align, libc::MAP_NORESERVE).unwrap();
            assert_eq!(p.as_ptr() as usize % align, 0);
            // SAFETY: the mapping is ours, `len` bytes, read-write.
            unsafe {
                p.as_ptr().write_bytes(7, len);
                assert_eq!(*p.as_ptr().add(len - 1), 7);
                assert_eq!(libc::munmap(p.as_ptr().cast(), len), 0);
            }
        }
        for (len, align) in [(0, ps), (ps + 1, ps), (ps, 3 * ps), (ps, ps / 2)] {
            let e = map_anonymous_aligned(len, align, 0).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{len} {align}");
        }
    }

    #[test]
    fn mempolicy_roundtrip_and_page_query() {
        std::thread::spawn(|| {
            set_mempolicy(mode::MPOL_BIND, &NodeSet::single(0)).unwrap();
            let (m, nodes) = get_mempolicy().unwrap();
            assert_eq!(m, mode::MPOL_BIND);
            assert_eq!(nodes, NodeSet::single(0));
            let v = vec![1u8; 1 << 20];
            let st = buffer_pages_nodes(v.as_ptr(), v.len()).unwrap();
            assert!(st.iter().all(|&s| s == 0), "{st:?}");
            set_mempolicy(mode::MPOL_DEFAULT, &NodeSet::new()).unwrap();
        })
        .join()
        .unwrap();
    }

    /// An AnonMap rounds up to pages, honours the alignment, reports untouched pages as
    /// `-ENOENT` and touched ones on node 0 (one node here), leaves out offsets past its end,
    /// and is unmapped when dropped.
    #[test]
    fn anon_map_owns_and_unmaps_its_pages() {
        let ps = page_size();
        let m = AnonMap::new(ps + 1, 4 * ps, 0).unwrap();
        assert_eq!(m.len(), 2 * ps);
        assert!(!m.is_empty());
        assert_eq!(m.as_ptr() as usize % (4 * ps), 0);
        assert_eq!(m.nodes_at([0, ps]).unwrap(), vec![-libc::ENOENT; 2]);
        // SAFETY: the first byte of the mapping, which is read-write.
        unsafe { m.as_ptr().write(1) };
        assert_eq!(
            m.nodes_at([0, ps, 2 * ps, usize::MAX]).unwrap(),
            vec![0, -libc::ENOENT]
        );
        drop(m);
        // Unmapped on drop, checked in a forked child so that no other test thread can map
        // something at the freed address in between: the child maps, drops, and asks msync
        // about the range (ENOMEM when nothing is mapped there); it touches no heap and no lock.
        // SAFETY: the child runs only the async-signal-safe calls below and `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = match AnonMap::new(ps, ps, 0) {
                Ok(m) => {
                    let (p, len) = (m.as_ptr(), m.len());
                    drop(m);
                    // SAFETY: msync only asks about the range.
                    let r = unsafe { libc::msync(p.cast(), len, libc::MS_ASYNC) };
                    let gone =
                        r == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM);
                    if gone {
                        0
                    } else {
                        1
                    }
                }
                Err(_) => 2,
            };
            // SAFETY: leaves the child at once, running nothing of the parent's.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child saw the dropped mapping still mapped (status {status:#x})"
        );
        assert_eq!(AnonMap::new(0, ps, 0).unwrap().len(), ps);
        assert!(
            AnonMap::new(ps, 3 * ps, 0).is_err(),
            "alignment must be a power of two"
        );
    }
}
