//! loci-alloc: a NUMA-aware memory allocator (seed 003, section 5).
//!
//! * A local allocator per thread ([`engine`]'s heaps), lock-free on its fast path: one
//!   sub-allocator per size class below 8 KiB, working on runs of about 64 KiB carved from its
//!   node's superblocks. Runs are ordered by occupancy and blocks come from the most occupied
//!   one that has room; free blocks form a LIFO list inside the blocks.
//! * A superblock allocator per node: superblocks (10 MiB by default, `LOCI_ALLOC_SUPERBLOCK`)
//!   mapped and bound to their node with `mbind`, so placement does not depend on which cpu
//!   first touches a page; carved into page runs that coalesce when freed; a LIFO cache of
//!   released superblocks; one lock per node.
//! * Blocks of 8 KiB..512 KiB (seed 003's medium classes) are page spans of the node's
//!   superblocks, freed straight back to the node by any thread: with per-class and per-thread
//!   pools the memory held was the sum of their peaks (see [`engine::SPAN_MIN`]).
//! * Frees of smaller blocks by a thread that does not own them go to the owner's recollection
//!   bin for that (owner, freer) pair; the owner drains its bins on allocation and on
//!   [`task_finished`]. A thread that exits hands its heap to its node's pool; the next thread
//!   there adopts it.
//! * Threads on a node without memory get memory of the nearest node with memory, counted in
//!   [`AllocStats::memoryless_fallbacks`] and said once on stderr.
//! * Below 8 KiB: small classes of the same design (or glibc, `LOCI_ALLOC_SMALL=system`); see
//!   [`engine::AllocConfig::small_own`] for why own is the default. Above 512 KiB: one node-bound
//!   mapping per block.
//!
//! Use it as the global allocator of a Rust program:
//! ```no_run
//! #[global_allocator]
//! static ALLOC: loci_alloc::LociAlloc = loci_alloc::LociAlloc;
//! ```
//! or put any program on it with `LD_PRELOAD=libloci_malloc.so` (crate `loci-alloc-preload`).

#![deny(unsafe_op_in_unsafe_fn)]

use core::alloc::{GlobalAlloc, Layout};

pub mod classes;
pub mod engine;
pub mod os;
pub mod workloads;

pub use engine::{
    config, node_of, stats, task_finished, AllocConfig, AllocError, AllocStats, NodeStats,
    COUNTERS, MEMORYLESS_FALLBACKS,
};

/// The allocator as a [`GlobalAlloc`]. Stateless handle: all state is process-global.
#[derive(Debug, Clone, Copy, Default)]
pub struct LociAlloc;

// SAFETY: engine::alloc returns null or a block of at least `size` bytes aligned to `align`,
// valid until freed; `free`/`realloc` accept exactly the blocks it returned.
unsafe impl GlobalAlloc for LociAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: Layout guarantees a power-of-two alignment.
        unsafe { engine::alloc(layout.size(), layout.align()) }
    }
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the caller passes a live block of this allocator.
        unsafe { engine::free(ptr) }
    }
    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for alloc.
        unsafe { engine::alloc_zeroed(layout.size(), layout.align()) }
    }
    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` is a live block of this allocator; the alignment comes from a Layout.
        unsafe { engine::realloc(ptr, new_size, layout.align()) }
    }
}

/// Allocates `layout` on `node`, from any thread. Free it with [`free`] (or through
/// [`LociAlloc`] / the C `free` of the preload library).
pub fn alloc_on(node: usize, layout: Layout) -> Result<core::ptr::NonNull<u8>, AllocError> {
    // SAFETY: Layout's alignment is a power of two; the block is returned to the caller.
    let p = unsafe { engine::alloc_on(node, layout.size(), layout.align())? };
    core::ptr::NonNull::new(p).ok_or(AllocError::OutOfMemory {
        size: layout.size(),
    })
}

/// Frees a block of this allocator.
///
/// # Safety
/// `p` is a live block from this allocator (or [`alloc_on`]) and is not used afterwards.
pub unsafe fn free(p: *mut u8) {
    // SAFETY: forwarded contract.
    unsafe { engine::free(p) }
}

/// The C allocation ABI on top of the engine (what `libloci_malloc.so` exports), kept here so
/// its contracts are tested in Rust too.
pub mod c {
    use super::engine;
    use core::ffi::c_void;

    fn set_errno(e: i32) {
        // SAFETY: __errno_location returns this thread's errno.
        unsafe { *libc::__errno_location() = e };
    }

    fn page() -> usize {
        4096
    }

    /// `malloc(3)`.
    ///
    /// # Safety
    /// C contract.
    #[inline(always)]
    pub unsafe fn malloc(size: usize) -> *mut c_void {
        // SAFETY: no preconditions beyond the C contract.
        let p = unsafe { engine::alloc_small_fast(size) };
        if !p.is_null() {
            return p as *mut c_void;
        }
        // SAFETY: as above.
        unsafe { malloc_slow(size) }
    }

    /// Everything `malloc`'s inlined fast path does not serve; sets errno on failure.
    /// `extern "C"` so that the call is known not to unwind (see `engine::alloc_full`).
    ///
    /// # Safety
    /// None beyond `malloc`'s: the block is the caller's, to free with [`free`].
    #[inline(never)]
    unsafe extern "C" fn malloc_slow(size: usize) -> *mut c_void {
        // SAFETY: 16 is a power of two.
        let p = unsafe { engine::alloc_full(size, 16) };
        if p.is_null() {
            set_errno(libc::ENOMEM);
        }
        p as *mut c_void
    }

    /// `free(3)`.
    ///
    /// # Safety
    /// C contract.
    #[inline(always)]
    pub unsafe fn free(p: *mut c_void) {
        // SAFETY: forwarded C contract.
        unsafe { engine::free(p as *mut u8) }
    }

    /// `calloc(3)`, with the overflow check.
    ///
    /// # Safety
    /// C contract.
    pub unsafe fn calloc(n: usize, size: usize) -> *mut c_void {
        let Some(total) = n.checked_mul(size) else {
            set_errno(libc::ENOMEM);
            return core::ptr::null_mut();
        };
        // SAFETY: 16 is a power of two.
        let p = unsafe { engine::alloc_zeroed(total, 16) };
        if p.is_null() {
            set_errno(libc::ENOMEM);
        }
        p as *mut c_void
    }

    /// `realloc(3)`: null acts as malloc; size 0 frees and returns null (glibc's behaviour).
    ///
    /// # Safety
    /// C contract.
    pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
        if !p.is_null() && size == 0 {
            // SAFETY: live block, freed once.
            unsafe { engine::free(p as *mut u8) };
            return core::ptr::null_mut();
        }
        // SAFETY: forwarded C contract.
        let q = unsafe { engine::realloc(p as *mut u8, size, 16) };
        if q.is_null() {
            set_errno(libc::ENOMEM);
        }
        q as *mut c_void
    }

    /// `reallocarray(3)`.
    ///
    /// # Safety
    /// C contract.
    pub unsafe fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
        match n.checked_mul(size) {
            // SAFETY: forwarded C contract.
            Some(t) => unsafe { realloc(p, t) },
            None => {
                set_errno(libc::ENOMEM);
                core::ptr::null_mut()
            }
        }
    }

    /// `posix_memalign(3)`: EINVAL unless `align` is a power of two multiple of `sizeof(void*)`.
    ///
    /// # Safety
    /// `out` is writable.
    pub unsafe fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
        if !align.is_power_of_two() || !align.is_multiple_of(core::mem::size_of::<*mut c_void>()) {
            return libc::EINVAL;
        }
        // SAFETY: power of two checked.
        let p = unsafe { engine::alloc(size, align) };
        if p.is_null() {
            return libc::ENOMEM;
        }
        // SAFETY: caller's out pointer.
        unsafe { *out = p as *mut c_void };
        0
    }

    /// `aligned_alloc(3)`: any power-of-two alignment (glibc accepts sizes that are not a
    /// multiple of it); EINVAL and null otherwise.
    ///
    /// # Safety
    /// C contract.
    pub unsafe fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
        if !align.is_power_of_two() {
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        }
        // SAFETY: power of two checked.
        let p = unsafe { engine::alloc(size, align) };
        if p.is_null() {
            set_errno(libc::ENOMEM);
        }
        p as *mut c_void
    }

    /// `memalign(3)`: a non-power-of-two alignment is rounded up (as glibc does).
    ///
    /// # Safety
    /// C contract.
    pub unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
        let Some(a) = align.max(1).checked_next_power_of_two() else {
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        };
        // SAFETY: power of two.
        unsafe { aligned_alloc(a, size) }
    }

    /// `valloc(3)`: page aligned.
    ///
    /// # Safety
    /// C contract.
    pub unsafe fn valloc(size: usize) -> *mut c_void {
        // SAFETY: page size is a power of two.
        unsafe { aligned_alloc(page(), size) }
    }

    /// `pvalloc(3)`: page aligned, size rounded up to whole pages (0 gives one page).
    ///
    /// # Safety
    /// C contract.
    pub unsafe fn pvalloc(size: usize) -> *mut c_void {
        let Some(s) = size.max(1).checked_add(page() - 1) else {
            set_errno(libc::ENOMEM);
            return core::ptr::null_mut();
        };
        // SAFETY: page size is a power of two.
        unsafe { aligned_alloc(page(), s / page() * page()) }
    }

    /// `malloc_usable_size(3)`; 0 for null.
    ///
    /// # Safety
    /// `p` is null or a live block.
    pub unsafe fn malloc_usable_size(p: *mut c_void) -> usize {
        if p.is_null() {
            return 0;
        }
        // SAFETY: live block of ours or of the system allocator.
        unsafe {
            engine::usable_size(p as *const u8)
                .unwrap_or_else(|| engine::sys_usable_size(p as *mut u8))
        }
    }
}
