//! Remote frees handed over as batches of block addresses (and, when a heap's batch pool is
//! out, as chains): producer threads allocate blocks of every class size (and some block runs
//! above it), stamp them and send them in messages; consumer threads check and free them, each
//! exiting after a quota of messages with a partly filled outbox (handed over at its exit), while
//! producers exit mid-stream with their blocks still out (their heaps are collected by the
//! freers). A block handed out twice shows as a wrong stamp; a block the owner's drain loses
//! shows as live bytes left at the end. In a binary of its own so that the counters it checks
//! are not moved by other tests.

use std::alloc::{alloc, dealloc, Layout};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use loci_alloc::workloads::Rng;
use loci_alloc::LociAlloc;

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

/// A block in flight: its address, size and stamp.
type Msg = Vec<(usize, usize, u64)>;

const PRODUCERS: u64 = 4;
/// Blocks per message.
const PER_MSG: usize = 50;
/// Messages a consumer takes before it exits (not a multiple of anything in the allocator).
const QUOTA: usize = 37;

/// The tests read the global counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

/// The stamp's fill byte for the rest of the block.
fn fill(stamp: u64) -> u8 {
    (stamp ^ (stamp >> 8) ^ (stamp >> 16)) as u8
}

/// A block of `size` bytes stamped with `stamp` (first word) and its fill byte (the rest).
fn make(size: usize, stamp: u64) -> usize {
    // SAFETY: `size >= 8`: a non-zero layout; the block is written in full within its size.
    unsafe {
        let p = alloc(layout(size));
        assert!(!p.is_null(), "allocation of {size} bytes failed");
        (p as *mut u64).write(stamp);
        std::ptr::write_bytes(p.add(8), fill(stamp), size - 8);
        p as usize
    }
}

/// Checks a block's stamp, then frees it.
fn check_and_free(p: usize, size: usize, stamp: u64) {
    // SAFETY: `p` is a live block of `size` bytes made by `make`, read within its size and
    // freed once, here.
    unsafe {
        let got = (p as *const u64).read();
        assert_eq!(got, stamp, "block {p:#x} ({size} B): stamp overwritten");
        let rest = std::slice::from_raw_parts((p as *const u8).add(8), size - 8);
        if let Some(i) = rest.iter().position(|&b| b != fill(stamp)) {
            panic!(
                "block {p:#x} ({size} B, stamp {stamp}): byte {} overwritten",
                i + 8
            );
        }
        dealloc(p as *mut u8, layout(size));
    }
}

/// Producer `t`: `msgs` messages of blocks of 9 B .. 8 KiB (every class but the smallest,
/// small ones most often) and a few of 8 .. 32 KiB, then exits with its blocks still in the consumers' hands.
fn produce(t: u64, msgs: u64, tx: mpsc::SyncSender<Msg>) {
    let mut rng = Rng(0x9e37_79b9 ^ (t << 32));
    for m in 0..msgs {
        let msg: Msg = (0..PER_MSG as u64)
            .map(|k| {
                let size = if rng.next_u64().is_multiple_of(64) {
                    rng.size(14, 15)
                } else {
                    rng.size(4, 13)
                };
                let stamp = (t << 48) | (m << 16) | k;
                (make(size, stamp), size, stamp)
            })
            .collect();
        tx.send(msg).unwrap();
    }
}

/// Takes up to `QUOTA` messages, holding the last few a while (their blocks are freed later,
/// among other owners' blocks), then frees what it holds and exits. True: the channel is closed.
fn consume(rx: &Mutex<Receiver<Msg>>) -> bool {
    // A heap of its own first: a thread without one frees straight into the owners' bins.
    let own = make(64, u64::MAX);
    let mut held: Vec<Msg> = Vec::new();
    let mut closed = false;
    for _ in 0..QUOTA {
        let Ok(msg) = rx.lock().unwrap().recv() else {
            closed = true;
            break;
        };
        held.push(msg);
        if held.len() > 3 {
            for (p, size, stamp) in held.remove(0) {
                check_and_free(p, size, stamp);
            }
        }
    }
    for msg in held {
        for (p, size, stamp) in msg {
            check_and_free(p, size, stamp);
        }
    }
    check_and_free(own, 64, u64::MAX);
    closed
}

#[test]
fn remote_frees_in_batches_reach_their_owners_across_thread_exits() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Warm-up: std's one-time allocations (thread set-up) are made before the baseline.
    thread::spawn(|| make(16, 0)).join().unwrap();
    loci_alloc::task_finished();
    let base = loci_alloc::stats();
    let (tx, rx) = mpsc::sync_channel::<Msg>(8);
    let rx = Arc::new(Mutex::new(rx));
    // Producers of different lengths: the short ones exit early, while the blocks they made
    // are still out.
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|t| {
            let tx = tx.clone();
            thread::spawn(move || produce(t, 200 + 300 * t, tx))
        })
        .collect();
    drop(tx);
    let mut generations = 0;
    loop {
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let rx = rx.clone();
                thread::spawn(move || consume(&rx))
            })
            .collect();
        generations += 1;
        let closed = consumers
            .into_iter()
            .fold(false, |c, h| h.join().unwrap() | c);
        if closed {
            break;
        }
    }
    for p in producers {
        p.join().unwrap();
    }
    drop(rx);
    loci_alloc::task_finished();
    let end = loci_alloc::stats();
    let blocks = PER_MSG as u64 * (0..PRODUCERS).map(|t| 200 + 300 * t).sum::<u64>();
    assert!(generations > 10, "{generations} consumer generations");
    assert!(
        end.cross_thread_frees - base.cross_thread_frees >= blocks * 9 / 10,
        "{} cross-thread frees for {blocks} blocks",
        end.cross_thread_frees - base.cross_thread_frees
    );
    assert!(
        end.recollected > base.recollected,
        "nothing went through a bin"
    );
    // Every block came back to its run: every thread but this one has exited (their outboxes
    // handed over, their heaps collected), and this one has drained its bins.
    let grown = end.live_block_bytes - base.live_block_bytes;
    assert!(
        grown < 16 * 1024,
        "live bytes grew by {grown} over {blocks} blocks"
    );
}

#[test]
fn an_idle_owner_gets_batches_and_the_chains_after_the_pool_ran_out() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // More blocks than a heap's batch pool holds (256 batches of 64 addresses; not a multiple
    // of 64, so one outbox waits in the idle freer): while the
    // owner allocates nothing, its bins fill with the freer's batches, then with chains.
    const N: u64 = 40_017;
    let (to_freer, blocks) = mpsc::channel::<Vec<usize>>();
    let (freed, exit) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let (freed2, exit2) = (freed.clone(), exit.clone());
    let freer = thread::spawn(move || {
        let own = make(64, u64::MAX);
        let list = blocks.recv().unwrap();
        for (k, &p) in list.iter().enumerate() {
            check_and_free(p, 48, k as u64);
        }
        freed2.wait();
        exit2.wait();
        drop(list);
        check_and_free(own, 64, u64::MAX);
    });
    let owner = thread::spawn(move || {
        let list: Vec<usize> = (0..N).map(|k| make(48, k)).collect();
        let base = loci_alloc::stats();
        to_freer.send(list).unwrap();
        freed.wait();
        // One allocation drains the bins: every block but one outbox's has arrived.
        let probe = make(48, 0);
        let mid = loci_alloc::stats();
        exit.wait();
        freer.join().unwrap();
        check_and_free(probe, 48, 0);
        // The blocks come back out of their runs intact, each once.
        let again: Vec<usize> = (0..N).map(|k| make(48, k)).collect();
        let mut sorted = again.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len() as u64, N, "a block handed out twice");
        for (k, p) in again.into_iter().enumerate() {
            check_and_free(p, 48, k as u64);
        }
        (base, mid)
    });
    let (base, mid) = owner.join().unwrap();
    let arrived = mid.recollected - base.recollected;
    assert!(
        (N - 64..N).contains(&arrived),
        "{arrived} of {N} remote frees reached the idle owner (all but one outbox must)"
    );
}
