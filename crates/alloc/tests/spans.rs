//! A node's free memory stays shared between the span pools of its threads: spans freed in
//! superblocks another thread took serve a thread's requests before any fresh superblock is
//! mapped. In a binary of its own so that the superblock counters are not moved by other tests.

use std::alloc::{alloc, dealloc, Layout};
use std::sync::mpsc;

use loci_alloc::LociAlloc;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

const BIG: usize = 256 << 10;

fn big() -> Layout {
    Layout::from_size_align(BIG, 16).unwrap()
}

/// Allocates and writes `n` blocks of 256 KiB.
fn take(n: usize) -> Vec<usize> {
    (0..n)
        .map(|_| {
            // SAFETY: non-zero size; written whole below.
            let p = unsafe { alloc(big()) };
            assert!(!p.is_null());
            // SAFETY: p has BIG bytes.
            unsafe { std::ptr::write_bytes(p, 0x5a, BIG) };
            p as usize
        })
        .collect()
}

fn give(blocks: Vec<usize>) {
    for p in blocks {
        // SAFETY: live blocks of this layout.
        unsafe { dealloc(p as *mut u8, big()) };
    }
}

#[test]
fn freed_spans_serve_other_threads_before_new_superblocks() {
    // Thread A takes ~30 MiB of 256 KiB spans and keeps one 8 KiB span per 8 big ones alive
    // (so no superblock becomes empty and goes to the cache), then frees the big ones. Thread B,
    // alive at the same time (a heap of its own, so another span pool), then takes the same
    // amount again: it must find it in A's superblocks' free spans, not in new superblocks.
    let (to_a, a_rx) = mpsc::channel::<()>();
    let (a_tx, from_a) = mpsc::channel::<()>();
    let a = std::thread::spawn(move || {
        let pin = Layout::from_size_align(8192, 16).unwrap();
        let mut pins = Vec::new();
        let mut bigs = Vec::new();
        for i in 0..120 {
            bigs.extend(take(1));
            if i % 8 == 7 {
                // SAFETY: non-zero size.
                pins.push(unsafe { alloc(pin) } as usize);
            }
        }
        give(bigs);
        a_tx.send(()).unwrap();
        a_rx.recv().unwrap(); // stay alive (keep the heap) until B is done
        for p in pins {
            // SAFETY: live blocks of this layout.
            unsafe { dealloc(p as *mut u8, pin) };
        }
    });
    from_a.recv().unwrap();
    let before = loci_alloc::stats();
    let b = std::thread::spawn(|| give(take(120)));
    b.join().unwrap();
    let after = loci_alloc::stats();
    to_a.send(()).unwrap();
    a.join().unwrap();
    let sb = loci_alloc::config().superblock as u64;
    assert!(
        after.os_bytes() <= before.os_bytes() + sb,
        "thread B mapped {} MiB more although thread A had freed {} MiB in superblocks still held",
        (after.os_bytes() - before.os_bytes()) >> 20,
        (120 * BIG) >> 20
    );
}
