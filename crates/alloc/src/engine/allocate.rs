//! The allocation entry points: [`alloc`] with its call-free fast path
//! ([`alloc_small_fast`]) and everything else ([`alloc_full`]: delegated small blocks, class
//! blocks, spans, aligned and large blocks), [`alloc_zeroed`], [`realloc`], and the usable size
//! of a block ([`usable_size`], [`sys_usable_size`]).

use core::ptr::null_mut;
use core::sync::atomic::{
    AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

use super::blocks::{alloc_large, alloc_large_span, alloc_sized, realloc_large};
use super::class_run::{alloc_class, block_start, cache_pop, pop, small_class_state};
use super::config::{current_node, ensure_init, home, SMALL_OWN};
use super::deallocate::free;
use super::heap::{heap, tls_heap_or_none};
use super::spans::run_at;
use super::structs::{Heap, Large, OWNER_ALIGNED, R_CLASS, R_CLASS_ALIGNED};
use super::{__libc_calloc, __libc_malloc, __libc_memalign, __libc_realloc, bump, PAGE};
use crate::classes::{class_of, LINE, MEDIUM_MAX, SMALL_MAX};
use crate::os;

#[inline]
fn small_delegated() -> bool {
    !SMALL_OWN.load(Relaxed)
}

/// Allocates `size` bytes aligned to `align` (a power of two). Null when out of memory.
///
/// # Safety
/// `align` must be a power of two.
#[inline(always)]
pub unsafe fn alloc(size: usize, align: usize) -> *mut u8 {
    if align <= 16 {
        // SAFETY: no preconditions; the block is returned to the caller.
        let p = unsafe { alloc_small_fast(size) };
        if !p.is_null() {
            return p;
        }
    }
    // SAFETY: `align` is a power of two (contract above).
    unsafe { alloc_full(size, align) }
}

/// The call-free fast path of an allocation of `size` bytes aligned to 16: the class's cached
/// blocks (the last ones this thread freed) or a block from the class's active run of the
/// thread's heap, nothing pending in its bins. Null when it does not apply (the caller then
/// takes [`alloc_full`]).
///
/// Kept free of calls and panics so that it needs no saved registers and inlines into the C
/// `malloc` (callgrind showed the pushes and pops of the full path at ~13 of its
/// instructions per malloc), and loads only the heap's own lines: its bins' pending mask
/// (with the bit that keeps a heap off this path), the class's state (with the class's
/// counters) and the run's first line.
///
/// # Safety
/// None beyond calling it from a thread that may allocate (any thread); the block is the
/// caller's to free with [`free`].
#[inline(always)]
pub unsafe fn alloc_small_fast(size: usize) -> *mut u8 {
    if size <= SMALL_MAX {
        let h = tls_heap_or_none();
        // A thread with a heap has passed init (it created or adopted the heap after it). One
        // word says "nothing pending in the bins, fast path allowed" (see `Shared::pending`);
        // a thread without a heap reads NO_HEAP's, which never allows it.
        // SAFETY: `h` is this thread's heap (never unmapped) or NO_HEAP; `shared` is at
        // offset 0 of either.
        if unsafe { (*h).shared.pending.load(Relaxed) } == 0 {
            // SAFETY: size <= SMALL_MAX; `h` is this thread's heap.
            let cs = unsafe { small_class_state(h, size) };
            // SAFETY: `h` is this thread's heap, whose claim it holds.
            let s = unsafe { cache_pop(cs) };
            if !s.is_null() {
                // A block of the class this thread freed last (see `ClassState::cache`).
                bump(&cs.allocs, 1);
                bump(&cs.requested, size as u64);
                return s as *mut u8;
            }
            let sb = cs.active;
            if !sb.is_null() {
                // SAFETY: `sb` is the active run of this thread's heap, whose claim it holds.
                let p = unsafe { pop(sb) };
                if !p.is_null() {
                    bump(&cs.allocs, 1);
                    bump(&cs.requested, size as u64);
                    return p;
                }
            }
        }
    }
    null_mut()
}

/// Every allocation the fast path of [`alloc`] does not serve.
///
/// `extern "C"` (it aborts instead of unwinding) so that calls to it are known not to unwind
/// and the C `malloc` can end in a tail call without a landing pad or a stack frame.
///
/// # Safety
/// `align` must be a power of two.
#[inline(never)]
pub unsafe extern "C" fn alloc_full(size: usize, align: usize) -> *mut u8 {
    ensure_init();
    let size = size.max(1);
    if align <= 16 {
        if size <= SMALL_MAX {
            if small_delegated() {
                // SAFETY: glibc's malloc has no preconditions.
                return unsafe { __libc_malloc(size) };
            }
            let h = heap();
            if h.is_null() {
                return h as *mut u8;
            }
            // SAFETY: initialized; `h` is this thread's heap, whose claim it holds; a size in
            // 1..=SMALL_MAX has a class below NCLASSES.
            return unsafe { alloc_class(h, class_of(size), size) };
        }
        if size <= MEDIUM_MAX {
            let h = heap();
            if h.is_null() {
                return h as *mut u8;
            }
            // SAFETY: initialized; this thread's heap, claim held; `size <= MEDIUM_MAX`.
            return unsafe { alloc_sized(h, size, size) };
        }
    }
    // SAFETY: initialized, `size >= 1`, `align` a power of two (contract above).
    unsafe { alloc_aligned_slow(size, align) }
}

/// [`alloc_full`] for alignments above 16 and sizes above `MEDIUM_MAX`: padded class or span
/// blocks, large mappings, or glibc for alignments of a whole region.
///
/// # Safety
/// The allocator is initialized, `size >= 1`, and `align` is a power of two.
#[cold]
unsafe fn alloc_aligned_slow(size: usize, align: usize) -> *mut u8 {
    if align <= LINE && size > SMALL_MAX && size <= MEDIUM_MAX {
        // medium blocks are cache-line aligned already (runs start on pages, sizes are lines)
        let h = heap();
        if h.is_null() {
            return h as *mut u8;
        }
        // SAFETY: initialized; this thread's heap, claim held; `size <= MEDIUM_MAX`.
        return unsafe { alloc_sized(h, size, size) };
    }
    if align <= PAGE && size <= MEDIUM_MAX - align {
        let padded = size + align - 16;
        if padded <= SMALL_MAX && small_delegated() {
            // SAFETY: glibc's memalign has no preconditions (`align` is a power of two anyway).
            return unsafe { __libc_memalign(align, size) };
        }
        let h = heap();
        if h.is_null() {
            return h as *mut u8;
        }
        // SAFETY: initialized; this thread's heap, claim held; `padded <= MEDIUM_MAX`.
        let p = unsafe { alloc_sized(h, padded, size) };
        if p.is_null() {
            return p;
        }
        // SAFETY: `p` is a block just allocated from this thread's heap (claim held), padded
        // by `align - 16` bytes.
        return unsafe { align_into(p, align) };
    }
    if align >= region_size() {
        // A block aligned to a region boundary starts on the first page of a region slot, where
        // `free` looks for that slot's header: the block would cover its own header. Such
        // alignments (the region size, 4 MiB or more) are left to glibc, whose pointers `free`
        // recognises as foreign; they are not node-bound.
        // SAFETY: glibc's memalign has no preconditions (`align` is a power of two anyway).
        return unsafe { __libc_memalign(align, size) };
    }
    let h = heap();
    if align <= LINE && !h.is_null() {
        // Memory already touched first (spans start on 1 KiB units, so up to a line's
        // alignment); a mapping of its own only when none is long enough.
        // SAFETY: initialized; this thread's heap, claim held; `size >= 1`.
        let p = unsafe { alloc_large_span(h, size) };
        if !p.is_null() {
            return p;
        }
    }
    let node = if h.is_null() {
        home(current_node())
    } else {
        // SAFETY: this thread's heap (never unmapped).
        unsafe { (*h).mem_node }
    };
    // SAFETY: initialized; `align` is a power of two below the region size (checked above).
    unsafe { alloc_large(size, align, node) }
}

/// Bytes of one region slot of the region map: large blocks and superblocks start on one, and
/// an alignment must stay below it (see `alloc_aligned_slow`).
#[inline]
pub(super) fn region_size() -> usize {
    1usize << os::REGION_SHIFT.load(Relaxed)
}

/// The first address aligned to `align` in the block `p` (allocated with room for it). When
/// that is inside a block of a class run, the run becomes R_CLASS_ALIGNED: its frees then take
/// the slow path, which finds the block start by division.
///
/// # Safety
/// `p` is a live block of this allocator, padded by `align - 16` bytes or more; the caller
/// holds the claim of the heap that owns its run.
pub(super) unsafe fn align_into(p: *mut u8, align: usize) -> *mut u8 {
    let q = (p as usize + align - 1) & !(align - 1);
    if q != p as usize {
        if let Some((base, os::REGION_SUPERBLOCK)) = os::region(p as usize) {
            // SAFETY: the region is a live superblock at `base` and `p` lies in one of its
            // runs in use; the claim the caller holds lets it set the run's state.
            unsafe {
                let r = run_at(base, p as usize);
                if (*r).state.load(Relaxed) == R_CLASS {
                    (*r).state.store(R_CLASS_ALIGNED, Relaxed);
                    // Keeps its frees off the fast path, which compares only the owner.
                    let o = (*r).owner.load(Relaxed) as usize;
                    (*r).owner.store((o | OWNER_ALIGNED) as *mut Heap, Relaxed);
                }
            }
        }
    }
    q as *mut u8
}

/// Zeroed allocation.
///
/// # Safety
/// `align` must be a power of two.
pub unsafe fn alloc_zeroed(size: usize, align: usize) -> *mut u8 {
    ensure_init();
    if align <= 16 && size <= SMALL_MAX && small_delegated() {
        // SAFETY: glibc's calloc has no preconditions.
        return unsafe { __libc_calloc(1, size.max(1)) };
    }
    // SAFETY: `align` is a power of two (contract above).
    let p = unsafe { alloc(size, align) };
    if p.is_null() {
        return p;
    }
    if let Some((_, os::REGION_LARGE)) = os::region(p as usize) {
        return p; // fresh anonymous mapping: already zero
    }
    // SAFETY: `p` is a fresh block of at least `size` bytes, ours to write.
    unsafe { core::ptr::write_bytes(p, 0, size) };
    p
}

/// Bytes usable at `p` (at least what was asked for), or None if `p` is not this allocator's.
///
/// # Safety
/// `p` is a live block.
pub unsafe fn usable_size(p: *const u8) -> Option<usize> {
    let (base, kind) = os::region(p as usize)?;
    if kind == os::REGION_LARGE {
        // SAFETY: the header of a live large block's region is a `Large`.
        return Some(
            base + unsafe { (*(os::header_of(base) as *const Large)).map_len } - p as usize,
        );
    }
    // SAFETY: not large, the region is a live superblock at `base`, and the live block `p`
    // lies in one of its runs in use.
    unsafe {
        let r = run_at(base, p as usize);
        Some(block_start(r, p as usize) + (*r).bsize as usize - p as usize)
    }
}

type UsableFn = unsafe extern "C" fn(*mut libc::c_void) -> usize;
static SYS_USABLE: AtomicUsize = AtomicUsize::new(0);

/// `malloc_usable_size` of the system allocator for a delegated block.
///
/// # Safety
/// `p` is a live block of the system allocator.
pub unsafe fn sys_usable_size(p: *mut u8) -> usize {
    let mut f = SYS_USABLE.load(Acquire);
    if f == 0 {
        // Resolved lazily, never during init: dlsym may allocate (through us, which is fine
        // once initialized). RTLD_NEXT skips our own export when this code is the preload.
        // SAFETY: a NUL-terminated symbol name and the RTLD_NEXT pseudo-handle.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) } as usize;
        if f == 0 {
            return 0;
        }
        SYS_USABLE.store(f, Release);
    }
    // SAFETY: `f` is the non-null address of the C library's `malloc_usable_size`, whose C
    // signature `UsableFn` is; `p` is a live block of the system allocator (contract above).
    unsafe {
        let func: UsableFn = core::mem::transmute(f);
        func(p as *mut libc::c_void)
    }
}

/// Resizes with C `realloc` semantics (null `p` allocates; the caller handles size 0).
///
/// # Safety
/// `p` is null or a live block; `align` a power of two.
pub unsafe fn realloc(p: *mut u8, new: usize, align: usize) -> *mut u8 {
    if p.is_null() {
        // SAFETY: `align` is a power of two (contract above).
        return unsafe { alloc(new, align) };
    }
    ensure_init();
    // SAFETY: `p` is a live block (contract above).
    let old = match unsafe { usable_size(p) } {
        Some(us) => {
            // Keep the block when it fits and at most half of it would be wasted.
            if new <= us && (new >= us / 2 || us <= 64) {
                return p;
            }
            us
        }
        None => {
            if align <= 16 && new <= SMALL_MAX && small_delegated() {
                // SAFETY: not ours, so `p` is a live block of the system allocator, given up.
                return unsafe { __libc_realloc(p, new.max(1)) };
            }
            // SAFETY: as above, a live block of the system allocator.
            unsafe { sys_usable_size(p) }
        }
    };
    if new > MEDIUM_MAX {
        if let Some((base, os::REGION_LARGE)) = os::region(p as usize) {
            // SAFETY: `p` is a live large block (its region is a large mapping), the start of
            // the block (contract above), and the caller gives it up; `new > MEDIUM_MAX`.
            let q = unsafe { realloc_large(base, p, new) };
            if !q.is_null() {
                return q;
            }
        }
    }
    // SAFETY: `align` is a power of two (contract above).
    let q = unsafe { alloc(new, align) };
    if q.is_null() {
        return q;
    }
    // SAFETY: `p` has `old` usable bytes and `q` at least `new`; they are distinct live blocks.
    unsafe { core::ptr::copy_nonoverlapping(p, q, old.min(new)) };
    // SAFETY: `p` is live and the caller gives it up: freed once.
    unsafe { free(p) };
    q
}
