//! Tasks: a task is a thin pointer to one heap block (a [`JobHeader`] with the block's call
//! function and the spawning worker, then the closure) and its request. Small blocks are
//! recycled through each worker's [`BlockCache`].

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout as AllocLayout};
use std::cell::UnsafeCell;
use std::ptr::NonNull;

use super::ctx::Ctx;
use super::request::ReqRef;

/// The start of a task's heap block; the closure follows it (`JobBlock`). A join's job on the
/// joining worker's stack starts with one too (see `join`).
#[repr(C)]
pub(super) struct JobHeader {
    /// Moves the closure out, frees the block, then runs the closure with the context (`Some`)
    /// or drops it (`None`).
    pub(super) call: unsafe fn(NonNull<JobHeader>, Option<&Ctx>),
    /// The worker that spawned the task (`EXTERNAL` for submits).
    pub(super) spawner: u32,
}

#[repr(C)]
struct JobBlock<F> {
    header: JobHeader,
    f: F,
}

/// The size class of small task blocks: blocks that fit are allocated with this layout and
/// recycled through the workers' free lists (`BlockCache`).
const SMALL_BLOCK: AllocLayout = match AllocLayout::from_size_align(64, 16) {
    Ok(l) => l,
    Err(_) => panic!("valid layout"),
};

/// Whether `JobBlock<F>` uses the small size class.
const fn small_block<F>() -> bool {
    std::mem::size_of::<JobBlock<F>>() <= SMALL_BLOCK.size()
        && std::mem::align_of::<JobBlock<F>>() <= SMALL_BLOCK.align()
}

/// A worker's free list of small task blocks. Hand-written because a task block is allocated on
/// one worker and freed on whichever runs it, one per task: glibc's per-thread cache keeps only 7
/// blocks per size, so a spawning worker falls through to the arena on most spawns (a third of
/// the cost of an empty task, measured with perf). Bounded, so blocks that travel to a worker
/// that only consumes go back to the global allocator beyond `BLOCK_CACHE_MAX`.
pub(super) struct BlockCache {
    free: UnsafeCell<Vec<NonNull<u8>>>,
}

const BLOCK_CACHE_MAX: usize = 256;

impl BlockCache {
    pub(super) fn new() -> BlockCache {
        BlockCache {
            free: UnsafeCell::new(Vec::with_capacity(BLOCK_CACHE_MAX)),
        }
    }

    /// A small block (uninitialised).
    #[inline]
    fn alloc(&self) -> NonNull<u8> {
        // SAFETY: a BlockCache belongs to one worker's Ctx, which only its thread uses (Ctx is
        // not Sync), and no reference into `free` outlives this call.
        if let Some(p) = unsafe { &mut *self.free.get() }.pop() {
            return p;
        }
        alloc_small()
    }

    /// Gives back a small block (its contents already moved out).
    #[inline]
    fn free(&self, p: NonNull<u8>) {
        // SAFETY: as in `alloc`.
        let v = unsafe { &mut *self.free.get() };
        if v.len() < BLOCK_CACHE_MAX {
            v.push(p); // within the capacity reserved in `new`: no reallocation
        } else {
            // SAFETY: every small block is allocated with SMALL_BLOCK.
            unsafe { dealloc(p.as_ptr(), SMALL_BLOCK) };
        }
    }
}

impl Drop for BlockCache {
    fn drop(&mut self) {
        for p in self.free.get_mut().drain(..) {
            // SAFETY: every small block is allocated with SMALL_BLOCK.
            unsafe { dealloc(p.as_ptr(), SMALL_BLOCK) };
        }
    }
}

fn alloc_small() -> NonNull<u8> {
    // SAFETY: SMALL_BLOCK has a nonzero size.
    let p = unsafe { alloc(SMALL_BLOCK) };
    NonNull::new(p).unwrap_or_else(|| handle_alloc_error(SMALL_BLOCK))
}

/// SAFETY: `p` points to the header of a `JobBlock<F>` made by `Task::new_unchecked`, and this
/// is the block's only use (it is freed here). `ctx`, when given, is the running worker's.
unsafe fn call_block<F: FnOnce(&Ctx)>(p: NonNull<JobHeader>, ctx: Option<&Ctx>) {
    let block = p.as_ptr() as *mut JobBlock<F>;
    // SAFETY: see the function contract; the closure is moved out exactly once, then the block
    // is freed with the layout it was allocated with.
    let f = unsafe { std::ptr::addr_of!((*block).f).read() };
    if small_block::<F>() {
        match ctx {
            Some(c) => c.blocks.free(p.cast()),
            // SAFETY: small blocks are allocated with SMALL_BLOCK.
            None => unsafe { dealloc(p.as_ptr().cast(), SMALL_BLOCK) },
        }
    } else {
        // SAFETY: large blocks are allocated with their own layout.
        unsafe { dealloc(p.as_ptr().cast(), AllocLayout::new::<JobBlock<F>>()) };
    }
    if let Some(ctx) = ctx {
        f(ctx);
    }
}

/// A queued task (16 bytes): its heap block and its request.
pub(crate) struct Task {
    job: NonNull<JobHeader>,
    pub(super) req: ReqRef,
}

// SAFETY: the closure in the block is `Send` (required by every constructor), and the request
// pointer is `Send` (see ReqRef).
unsafe impl Send for Task {}

impl Task {
    /// SAFETY: whatever `f` borrows must outlive the task's run (or drop); `'static` closures
    /// always qualify, scoped ones because the scope waits for them. `cache`, when given, is the
    /// calling worker's.
    #[inline]
    pub(super) unsafe fn new_unchecked<F: FnOnce(&Ctx) + Send>(
        f: F,
        req: ReqRef,
        spawner: u32,
        cache: Option<&BlockCache>,
    ) -> Task {
        let p: NonNull<JobBlock<F>> = if small_block::<F>() {
            cache.map_or_else(alloc_small, BlockCache::alloc).cast()
        } else {
            let l = AllocLayout::new::<JobBlock<F>>();
            // SAFETY: a JobBlock has a nonzero size (its header).
            NonNull::new(unsafe { alloc(l) })
                .unwrap_or_else(|| handle_alloc_error(l))
                .cast()
        };
        // SAFETY: `p` is a fresh allocation with room and alignment for a JobBlock<F>.
        unsafe {
            p.as_ptr().write(JobBlock {
                header: JobHeader {
                    call: call_block::<F>,
                    spawner,
                },
                f,
            })
        };
        Task { job: p.cast(), req }
    }

    #[inline]
    pub(super) fn new<F: FnOnce(&Ctx) + Send + 'static>(
        f: F,
        req: ReqRef,
        spawner: u32,
        cache: Option<&BlockCache>,
    ) -> Task {
        // SAFETY: a 'static closure borrows nothing.
        unsafe { Task::new_unchecked(f, req, spawner, cache) }
    }

    /// A task whose job is not a heap block of this module (a join's stack job).
    ///
    /// SAFETY: `job` points to a header whose `call` may be called once with `job` while the
    /// task exists, and stays valid until then (or until the task is taken back by
    /// [`Task::into_job`]).
    #[inline]
    pub(super) unsafe fn from_job(job: NonNull<JobHeader>, req: ReqRef) -> Task {
        Task { job, req }
    }

    /// Whether this task's job is `job`.
    #[inline]
    pub(super) fn is(&self, job: NonNull<JobHeader>) -> bool {
        self.job == job
    }

    /// Takes the task apart without running or dropping its job (the caller owns the job).
    #[inline]
    pub(super) fn into_job(self) -> NonNull<JobHeader> {
        let p = self.job;
        std::mem::forget(self);
        p
    }

    #[inline]
    pub(super) fn spawner(&self) -> u32 {
        // SAFETY: the block lives until the task is run or dropped.
        unsafe { self.job.as_ref() }.spawner
    }

    /// Runs the closure on `ctx` (the block is freed before the closure runs).
    #[inline]
    pub(super) fn run(self, ctx: &Ctx) {
        let p = self.into_job();
        // SAFETY: the block is live and used once, here.
        unsafe {
            let call = p.as_ref().call;
            call(p, Some(ctx));
        }
    }
}

impl Drop for Task {
    /// A task dropped without running (never in normal operation: the workers drain every queue
    /// before they exit) frees its closure; its request then never completes.
    fn drop(&mut self) {
        // SAFETY: the block is live and used once, here.
        unsafe {
            let call = self.job.as_ref().call;
            call(self.job, None);
        }
    }
}
