//! The node-targeted API: [`alloc_on`] (a block on a given node, from any thread, through the
//! node's shared heap when the calling thread's heap serves another node) and its
//! [`AllocError`], [`node_of`], and [`task_finished`] (drain the calling thread's bins now).

use core::sync::atomic::Ordering::Relaxed;

use super::allocate::{align_into, region_size};
use super::blocks::{alloc_large, alloc_sized};
use super::config::{ensure_init, nodemap};
use super::heap::{collect, create_heap, drain, tls_heap};
use super::structs::{Heap, Large, NODES};
use super::{PAGE, SLOW};
use crate::classes::MEDIUM_MAX;
use crate::os::{self, MAX_NODES};

/// Why [`alloc_on`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// The node is not one the allocator knows; `valid` has bit n set for each valid node.
    NoSuchNode { node: usize, valid: u64 },
    /// The node has no memory of its own; `with_memory` has bit n set for each node that has.
    NoMemory { node: usize, with_memory: u64 },
    /// The OS refused the memory.
    OutOfMemory { size: usize },
    /// The alignment is not a power of two, or above `max` (half a region slot: a block
    /// aligned to a whole slot would cover the slot's header).
    BadAlign { align: usize, max: usize },
}

impl core::fmt::Display for AllocError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let list = |f: &mut core::fmt::Formatter<'_>, mask: u64| -> core::fmt::Result {
            let mut first = true;
            for n in 0..64 {
                if mask >> n & 1 == 1 {
                    write!(f, "{}{n}", if first { "" } else { "," })?;
                    first = false;
                }
            }
            Ok(())
        };
        match self {
            AllocError::NoSuchNode { node, valid } => {
                write!(f, "node {node} does not exist; valid nodes: ")?;
                list(f, *valid)
            }
            AllocError::NoMemory { node, with_memory } => {
                write!(f, "node {node} has no memory; nodes with memory: ")?;
                list(f, *with_memory)
            }
            AllocError::OutOfMemory { size } => write!(f, "out of memory allocating {size} bytes"),
            AllocError::BadAlign { align, max } => write!(
                f,
                "alignment {align} is not valid: a power of two from 1 to {max} is"
            ),
        }
    }
}

impl std::error::Error for AllocError {}

/// Allocates on `node` whatever thread calls: from the calling thread's heap when it serves
/// that node, else from the node's shared heap (behind its claim), or a node-bound mapping.
///
/// # Safety
/// The block must be released with [`free`](super::free) (or the C `free` of the preload library).
pub unsafe fn alloc_on(node: usize, size: usize, align: usize) -> Result<*mut u8, AllocError> {
    ensure_init();
    let valid = nodemap().nodes;
    if node >= MAX_NODES || valid >> node & 1 == 0 {
        return Err(AllocError::NoSuchNode { node, valid });
    }
    let with_memory = nodemap().mem_nodes;
    if with_memory >> node & 1 == 0 {
        return Err(AllocError::NoMemory { node, with_memory });
    }
    if !align.is_power_of_two() || align >= region_size() {
        return Err(AllocError::BadAlign {
            align,
            max: region_size() / 2,
        });
    }
    let size = size.max(1);
    let oom = Err(AllocError::OutOfMemory { size });
    let padded = if align <= 16 {
        Some(size)
    } else if align <= PAGE {
        size.checked_add(align - 16)
    } else {
        None
    };
    let Some(padded) = padded.filter(|&p| p <= MEDIUM_MAX) else {
        // SAFETY: initialized; `align` is a power of two below the region size (checked above).
        let p = unsafe { alloc_large(size, align, node) };
        return if p.is_null() { oom } else { Ok(p) };
    };
    let mine = tls_heap();
    // SAFETY: a non-null `mine` is this thread's heap (never unmapped).
    let p = if !mine.is_null() && unsafe { (*mine).node } == node {
        // SAFETY: initialized; this thread's heap, whose claim it holds; `padded <= MEDIUM_MAX`.
        unsafe { alloc_sized(mine, padded, size) }
    } else {
        let h = shared_heap(node);
        if h.is_null() {
            return oom;
        }
        // SAFETY: `h` is the node's shared heap (never unmapped).
        unsafe {
            (*h).shared.claim_spinning();
        }
        // SAFETY: initialized; this thread now holds `h`'s claim; `padded <= MEDIUM_MAX`.
        let mut p = unsafe { alloc_sized(h, padded, size) };
        if !p.is_null() {
            // SAFETY: `p` was just allocated from `h` (claim held), padded by `align - 16` bytes.
            p = unsafe { align_into(p, align) };
        }
        // SAFETY: `h` is a heap; its claim is given back, then collected like any thread.
        unsafe {
            (*h).shared.release();
            collect(h);
        }
        return if p.is_null() { oom } else { Ok(p) };
    };
    if p.is_null() {
        return oom;
    }
    // SAFETY: `p` was just allocated from this thread's heap (claim held), padded by
    // `align - 16` bytes.
    Ok(unsafe { align_into(p, align) })
}

pub(super) fn shared_heap(node: usize) -> *mut Heap {
    let ns = &NODES[node];
    ns.lock.lock();
    // SAFETY: node lock held.
    let inner = unsafe { &mut *ns.inner.get() };
    if inner.shared_heap.is_null() {
        inner.shared_heap = create_heap(node, false);
    }
    let h = inner.shared_heap;
    ns.lock.unlock();
    h
}

/// The node a block of this allocator was bound to; None for blocks of the system allocator.
pub fn node_of(p: *const u8) -> Option<usize> {
    let base = os::region_of(p as usize)?;
    // SAFETY: every region has a header at header_of(base) whose first word is the node
    // (`Segment` and `Large` both start with it).
    Some(unsafe { (*(os::header_of(base) as *const Large)).node } as usize)
}

/// Drains the calling thread's recollection bins now (the scheduler calls this when a task
/// ends, seed 003).
pub fn task_finished() {
    let h = tls_heap();
    if !h.is_null() {
        // SAFETY: this thread holds its heap's claim.
        unsafe {
            if (*h).shared.pending.load(Relaxed) & !SLOW != 0 {
                drain(h);
            }
        }
    }
}
