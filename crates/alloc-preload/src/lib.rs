//! `libloci_malloc.so`: the C allocation ABI on loci-alloc.
//!
//! `LD_PRELOAD=/path/to/libloci_malloc.so program` puts every allocation of an unmodified
//! program on loci-alloc. Being preloaded, the library is initialized before any allocation, so
//! no pointer from another allocator reaches its `free` except small blocks it delegated to
//! glibc itself (`LOCI_ALLOC_SMALL=system`), which it recognizes and returns to glibc.
//! Initialization reads sysfs and the environment with raw syscalls and never allocates, so
//! it cannot recurse into `malloc`; the only `dlsym` (glibc's `malloc_usable_size`, for
//! delegated blocks) is resolved lazily after initialization.

use core::ffi::c_void;
use loci_alloc::c;

/// # Safety
/// C contract of `malloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    // SAFETY: forwarded C contract.
    unsafe { c::malloc(size) }
}

/// # Safety
/// C contract of `free(3)`.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    // SAFETY: forwarded C contract.
    unsafe { c::free(p) }
}

/// # Safety
/// C contract of `cfree` (an old alias of free).
#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: forwarded C contract.
    unsafe { c::free(p) }
}

/// # Safety
/// C contract of `calloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    // SAFETY: forwarded C contract.
    unsafe { c::calloc(n, size) }
}

/// # Safety
/// C contract of `realloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: forwarded C contract.
    unsafe { c::realloc(p, size) }
}

/// # Safety
/// C contract of `reallocarray(3)`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    // SAFETY: forwarded C contract.
    unsafe { c::reallocarray(p, n, size) }
}

/// # Safety
/// C contract of `posix_memalign(3)`.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    // SAFETY: forwarded C contract.
    unsafe { c::posix_memalign(out, align, size) }
}

/// # Safety
/// C contract of `aligned_alloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    // SAFETY: forwarded C contract.
    unsafe { c::aligned_alloc(align, size) }
}

/// # Safety
/// C contract of `memalign(3)`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: forwarded C contract.
    unsafe { c::memalign(align, size) }
}

/// # Safety
/// C contract of `valloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    // SAFETY: forwarded C contract.
    unsafe { c::valloc(size) }
}

/// # Safety
/// C contract of `pvalloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    // SAFETY: forwarded C contract.
    unsafe { c::pvalloc(size) }
}

/// # Safety
/// C contract of `malloc_usable_size(3)`.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    // SAFETY: forwarded C contract.
    unsafe { c::malloc_usable_size(p) }
}

/// Drains the calling thread's recollection bins (for task runtimes that end tasks; loci's
/// scheduler calls the Rust function directly).
#[no_mangle]
pub extern "C" fn loci_alloc_task_finished() {
    loci_alloc::task_finished()
}

/// Number of counters [`loci_alloc_stats`] writes.
pub const LOCI_ALLOC_STATS_LEN: usize = 13;

/// Writes the allocator's counters into `out[0..n]` (n <= 13) and returns how many it wrote:
/// allocs, frees, bytes requested, live block bytes, cross-thread frees, recollected blocks,
/// heaps, bytes held from the OS, superblocks in use, superblocks cached, large-block bytes,
/// mbind failures (these five summed over nodes), memoryless fallbacks (thread heaps started
/// on a node without memory, served by the nearest node with memory).
///
/// # Safety
/// `out` is valid for `n` writes of u64.
#[no_mangle]
pub unsafe extern "C" fn loci_alloc_stats(out: *mut u64, n: usize) -> usize {
    let s = loci_alloc::stats();
    let sum = |f: fn(&loci_alloc::NodeStats) -> u64| s.nodes.iter().map(f).sum::<u64>();
    let v: [u64; LOCI_ALLOC_STATS_LEN] = [
        s.allocs,
        s.frees,
        s.bytes_requested,
        s.live_block_bytes.max(0) as u64,
        s.cross_thread_frees,
        s.recollected,
        s.heaps,
        sum(|n| n.os_bytes),
        sum(|n| n.superblocks_in_use),
        sum(|n| n.superblocks_cached),
        sum(|n| n.large_bytes),
        sum(|n| n.mbind_failures),
        s.memoryless_fallbacks,
    ];
    let k = n.min(LOCI_ALLOC_STATS_LEN);
    for (i, x) in v.iter().take(k).enumerate() {
        // SAFETY: i < k <= n, the caller's buffer length.
        unsafe { *out.add(i) = *x };
    }
    k
}
