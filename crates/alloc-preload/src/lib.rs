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

/// Writes the allocator's counters into `out[0..n]` and returns how many it wrote (at most
/// `loci_alloc::COUNTERS.len()`): the values of `loci_alloc::AllocStats::counters`, named and ordered
/// by `loci_alloc::COUNTERS` (allocs, frees, bytes requested, ..., memoryless fallbacks).
///
/// # Safety
/// `out` is valid for `n` writes of u64.
#[no_mangle]
pub unsafe extern "C" fn loci_alloc_stats(out: *mut u64, n: usize) -> usize {
    let v = loci_alloc::stats().counters();
    let k = n.min(v.len());
    for (i, x) in v.iter().take(k).enumerate() {
        // SAFETY: i < k <= n, the caller's buffer length.
        unsafe { *out.add(i) = *x };
    }
    k
}
