//! loci-alloc as the global allocator of this test binary: everything the test harness, std
//! and the tests allocate goes through it. Concurrent stress with cross-thread frees and a
//! pattern checked before every free, a collections/threads/strings workload, and the C-ABI
//! contracts (alignment, calloc zeroing, realloc).

use std::alloc::{alloc, dealloc, GlobalAlloc, Layout};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::mpsc;

use loci_alloc::workloads::Rng;
use loci_alloc::{c, LociAlloc};

#[global_allocator]
static ALLOC: LociAlloc = LociAlloc;

/// Words of a block that carry the pattern: all of it up to 1 KiB, else the first and last
/// 64 bytes and one word per 4 KiB page.
fn pattern_offsets(size: usize, mut f: impl FnMut(usize)) {
    let words = size / 8;
    if size <= 1024 {
        (0..words).for_each(|w| f(w * 8));
    } else {
        (0..8).for_each(|w| f(w * 8));
        (words - 8..words).for_each(|w| f(w * 8));
        (512..words).step_by(512).for_each(|w| f(w * 8));
    }
}

fn tag(p: *mut u8, size: usize, off: usize) -> u64 {
    (p as u64).rotate_left(17) ^ (size as u64) << 40 ^ off as u64
}

fn write_pattern(p: *mut u8, size: usize) {
    pattern_offsets(size, |o| {
        // SAFETY: o + 8 <= size, p is a live block of `size` bytes aligned to 8.
        unsafe { (p.add(o) as *mut u64).write(tag(p, size, o)) }
    });
}

fn check_pattern(p: *mut u8, size: usize) {
    pattern_offsets(size, |o| {
        // SAFETY: as in write_pattern.
        let v = unsafe { (p.add(o) as *const u64).read() };
        assert_eq!(
            v,
            tag(p, size, o),
            "block {p:?} size {size}: word at {o} overwritten"
        );
    });
}

fn random_layout(r: &mut Rng) -> Layout {
    let x = r.next_u64();
    let size = match x % 1000 {
        0 => 512 * 1024 + (x >> 20) as usize % (2 << 20), // large: direct mapping
        1..=60 => 8 * 1024 + (x >> 20) as usize % (504 * 1024), // medium classes
        _ => 8 + (x >> 20) as usize % 2048,               // small classes
    };
    let align = match (x >> 10) % 64 {
        0 => 4096,
        1..=3 => 64,
        _ => 8,
    };
    Layout::from_size_align(size, align).unwrap()
}

struct Block(*mut u8, Layout);
// SAFETY: a block is plain memory handed from one thread to another.
unsafe impl Send for Block {}

#[test]
fn stress_8_threads_cross_thread_frees_pattern_checked() {
    const THREADS: usize = 8;
    // 1e7 operations in release builds; debug builds (10x slower) run a fifth of it.
    let ops_per_thread: usize = if cfg!(debug_assertions) {
        250_000
    } else {
        1_250_000
    };
    let before = loci_alloc::stats();
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<Block>()).unzip();
    let handles: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(t, rx)| {
            let txs = txs.clone();
            std::thread::spawn(move || {
                let mut r = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678));
                let mut slots: Vec<Option<Block>> = (0..2048).map(|_| None).collect();
                let mut sent = 0u64;
                for i in 0..ops_per_thread {
                    let s = (r.next_u64() % slots.len() as u64) as usize;
                    match slots[s].take() {
                        None => {
                            let l = random_layout(&mut r);
                            // SAFETY: non-zero size.
                            let p = unsafe { alloc(l) };
                            assert!(!p.is_null(), "out of memory for {l:?}");
                            assert_eq!(p as usize % l.align(), 0, "misaligned {l:?}");
                            write_pattern(p, l.size());
                            slots[s] = Some(Block(p, l));
                        }
                        Some(b) => {
                            check_pattern(b.0, b.1.size());
                            if r.next_u64().is_multiple_of(4) {
                                // freed by another thread
                                let to =
                                    (t + 1 + (r.next_u64() as usize % (THREADS - 1))) % THREADS;
                                txs[to].send(b).unwrap();
                                sent += 1;
                            } else {
                                // SAFETY: live block with its layout.
                                unsafe { dealloc(b.0, b.1) };
                            }
                        }
                    }
                    if i % 64 == 0 {
                        while let Ok(b) = rx.try_recv() {
                            check_pattern(b.0, b.1.size());
                            // SAFETY: live block with its layout, now owned here.
                            unsafe { dealloc(b.0, b.1) };
                        }
                    }
                }
                for b in slots.into_iter().flatten() {
                    check_pattern(b.0, b.1.size());
                    // SAFETY: live block.
                    unsafe { dealloc(b.0, b.1) };
                }
                (rx, sent)
            })
        })
        .collect();
    drop(txs);
    let mut total_sent = 0;
    let mut rxs = Vec::new();
    for h in handles {
        let (rx, sent) = h.join().unwrap();
        total_sent += sent;
        rxs.push(rx);
    }
    // blocks sent after their receiver stopped polling
    for rx in rxs {
        while let Ok(b) = rx.try_recv() {
            check_pattern(b.0, b.1.size());
            // SAFETY: live block.
            unsafe { dealloc(b.0, b.1) };
        }
    }
    let after = loci_alloc::stats();
    assert!(total_sent > (THREADS * ops_per_thread / 20) as u64);
    assert!(
        after.cross_thread_frees - before.cross_thread_frees >= total_sent / 2,
        "cross-thread frees not counted: {} sent",
        total_sent
    );
}

#[test]
fn collections_threads_strings_workload() {
    // a differential check: the same computation on 4 threads and on 1 gives the same answer
    fn work(seed: u64, n: usize) -> (usize, u64, String) {
        let mut r = Rng(seed | 1);
        let mut map: HashMap<String, Vec<u64>> = HashMap::new();
        let mut tree = BTreeMap::new();
        let mut q = VecDeque::new();
        for i in 0..n {
            let k = format!("key-{}", r.next_u64() % 5000);
            map.entry(k.clone()).or_default().push(i as u64);
            tree.insert(r.next_u64() % 100_000, k.repeat((i % 7) + 1));
            q.push_back(vec![i as u8; i % 3000]);
            if q.len() > 500 {
                q.pop_front();
            }
        }
        let sum: u64 = map.values().map(|v| v.iter().sum::<u64>()).sum();
        let longest = tree.values().map(String::len).max().unwrap_or(0);
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort();
        (
            longest + q.len(),
            sum,
            keys[..3].iter().map(|s| s.as_str()).collect(),
        )
    }
    let serial: Vec<_> = (0..4).map(|s| work(s, 60_000)).collect();
    let parallel: Vec<_> = (0..4)
        .map(|s| std::thread::spawn(move || work(s, 60_000)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(serial, parallel);
    let text: String = (0..100_000).map(|i| format!("{i},")).collect();
    let parsed: u64 = text
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>().unwrap())
        .sum();
    assert_eq!(parsed, 99_999 * 100_000 / 2);
}

#[test]
fn every_alignment_and_size_class_is_honoured() {
    // up to 64 MiB: past the region slot (16 MiB with 10 MiB superblocks), where alignments
    // are handed to glibc
    let max_align = loci_alloc::config().max_align;
    // Under AddressSanitizer (scripts/asan-alloc) `__libc_memalign` is the sanitizer's own while
    // `__libc_free` stays glibc's, so blocks handed to glibc cannot be freed there: the
    // alignments past max_align are checked in the plain runs only.
    // (`scripts/asan-alloc` builds with `--cfg loci_asan`.)
    let asan = cfg!(loci_asan);
    if asan {
        eprintln!("note: AddressSanitizer run: alignments above {max_align} (glibc's) skipped");
    }
    for shift in 0..=26 {
        if asan && 1usize << shift > max_align {
            break;
        }
        let align = 1usize << shift;
        for size in [
            1,
            7,
            16,
            100,
            4095,
            7168,
            7169,
            8192,
            100_000,
            524_288,
            524_289,
            3 << 20,
        ] {
            let l = Layout::from_size_align(size, align).unwrap();
            // SAFETY: non-zero size.
            let p = unsafe { ALLOC.alloc(l) };
            assert!(!p.is_null());
            assert_eq!(p as usize % align, 0, "size {size} align {align}");
            // SAFETY: live block of at least `size` bytes.
            unsafe {
                std::ptr::write_bytes(p, 0xab, size);
                let us = c::malloc_usable_size(p as *mut _);
                assert!(us >= size, "usable {us} < {size}");
                assert_eq!(
                    loci_alloc::node_of(p).is_some(),
                    align <= max_align,
                    "size {size} align {align}: node-bound up to {max_align}"
                );
                ALLOC.dealloc(p, l);
            }
        }
    }
}

/// Aligned blocks handed out from inside a class block (a memalign pads the block and aligns
/// into it) share runs with plain blocks of the same class; freeing both kinds in any order
/// must put whole blocks back on the run's free list, or the next allocations overlap.
#[test]
fn aligned_pointers_inside_class_blocks_free_whole_blocks() {
    let mut r = Rng(7);
    let plain = Layout::from_size_align(90, 8).unwrap(); // the 96 B class
    let aligned = Layout::from_size_align(40, 64).unwrap(); // padded to 88 B: the same class
    for round in 0..4 {
        let mut live: Vec<(*mut u8, Layout)> = Vec::new();
        for i in 0..20_000 {
            let l = if (i + round) % 3 == 0 { aligned } else { plain };
            // SAFETY: non-zero size.
            let p = unsafe { ALLOC.alloc(l) };
            assert!(!p.is_null() && (p as usize).is_multiple_of(l.align()));
            write_pattern(p, l.size());
            live.push((p, l));
        }
        // free in random order, checking every block first
        while !live.is_empty() {
            let i = (r.next_u64() % live.len() as u64) as usize;
            let (p, l) = live.swap_remove(i);
            check_pattern(p, l.size());
            // SAFETY: live block of this layout.
            unsafe { ALLOC.dealloc(p, l) };
        }
        // the freed blocks come back as whole, disjoint blocks
        let blocks: Vec<*mut u8> = (0..40_000)
            // SAFETY: non-zero size.
            .map(|_| unsafe { ALLOC.alloc(plain) })
            .collect();
        for &p in &blocks {
            write_pattern(p, plain.size());
        }
        for &p in &blocks {
            check_pattern(p, plain.size());
            // SAFETY: live block of this layout.
            unsafe { ALLOC.dealloc(p, plain) };
        }
    }
}

/// Superblocks are advised as transparent huge pages (VmFlags `hg` in smaps) exactly when
/// `LOCI_ALLOC_HUGEPAGES=on` (scripts/test runs this with it; the default is off).
#[test]
fn superblocks_are_advised_as_huge_pages() {
    let l = Layout::from_size_align(64, 8).unwrap();
    // SAFETY: non-zero size.
    let p = unsafe { ALLOC.alloc(l) } as usize;
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut flags = None;
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&p);
                    continue;
                }
            }
        }
        if inside {
            if let Some(f) = line.strip_prefix("VmFlags:") {
                flags = Some(f.split_whitespace().map(str::to_string).collect::<Vec<_>>());
            }
        }
    }
    let flags = flags.expect("the block's mapping is in /proc/self/smaps");
    assert_eq!(
        flags.iter().any(|f| f == "hg"),
        loci_alloc::config().hugepages,
        "VmFlags {flags:?}"
    );
    // SAFETY: live block of this layout.
    unsafe { ALLOC.dealloc(p as *mut u8, l) };
}

#[test]
fn c_abi_contracts() {
    // SAFETY: the C contracts are followed in every call below.
    unsafe {
        // calloc zeroes, including reused blocks that held data before
        for size in [24usize, 3000, 20_000, 600_000] {
            let p = c::malloc(size) as *mut u8;
            std::ptr::write_bytes(p, 0xff, size);
            c::free(p as *mut _);
            let z = c::calloc(1, size) as *mut u8;
            assert!((0..size).all(|i| *z.add(i) == 0), "calloc({size}) not zero");
            c::free(z as *mut _);
        }
        assert!(
            c::calloc(usize::MAX / 2, 3).is_null(),
            "calloc overflow must fail"
        );
        // realloc keeps contents, grows and shrinks across classes and the large path
        let mut p = c::realloc(std::ptr::null_mut(), 10) as *mut u8;
        for i in 0..10 {
            *p.add(i) = i as u8;
        }
        let mut len = 10;
        for new in [100usize, 9000, 200_000, 2_000_000, 50, 1] {
            p = c::realloc(p as *mut _, new) as *mut u8;
            assert!(!p.is_null());
            for i in 0..len.min(new) {
                assert_eq!(*p.add(i), i as u8, "realloc to {new} lost byte {i}");
            }
            for i in len.min(new)..new {
                *p.add(i) = i as u8;
            }
            len = new;
        }
        assert!(c::realloc(p as *mut _, 0).is_null(), "realloc(p, 0) frees");
        // aligned entry points
        let mut out = std::ptr::null_mut();
        assert_eq!(c::posix_memalign(&mut out, 3, 10), libc::EINVAL);
        assert_eq!(c::posix_memalign(&mut out, 4, 10), libc::EINVAL);
        assert_eq!(c::posix_memalign(&mut out, 256, 10), 0);
        assert_eq!(out as usize % 256, 0);
        c::free(out);
        assert!(c::aligned_alloc(48, 96).is_null());
        let a = c::aligned_alloc(64, 96);
        assert_eq!(a as usize % 64, 0);
        c::free(a);
        let m = c::memalign(48, 10); // rounded up to 64, as glibc does
        assert_eq!(m as usize % 64, 0);
        c::free(m);
        let v = c::valloc(10);
        assert_eq!(v as usize % 4096, 0);
        c::free(v);
        let pv = c::pvalloc(5000);
        assert_eq!(pv as usize % 4096, 0);
        assert!(c::malloc_usable_size(pv) >= 8192);
        c::free(pv);
        assert_eq!(c::malloc_usable_size(std::ptr::null_mut()), 0);
        c::free(std::ptr::null_mut());
        assert!(
            !c::malloc(0).is_null(),
            "malloc(0) returns a unique pointer"
        );
    }
}

#[test]
fn alloc_on_places_on_the_node_and_rejects_unknown_nodes() {
    let l = Layout::from_size_align(64 * 1024, 64).unwrap();
    let p = loci_alloc::alloc_on(0, l).unwrap();
    assert_eq!(loci_alloc::node_of(p.as_ptr()), Some(0));
    // freed by another thread than the one that allocated it
    let addr = p.as_ptr() as usize;
    std::thread::spawn(move || unsafe { loci_alloc::free(addr as *mut u8) })
        .join()
        .unwrap();
    let err = loci_alloc::alloc_on(63, l).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("node 63") && msg.contains("valid nodes: 0"),
        "{msg}"
    );
    assert!(loci_alloc::alloc_on(64, l).is_err());
    // alignments past half a region slot would cover the slot's header: refused, with the limit
    let max = loci_alloc::config().max_align;
    let big = Layout::from_size_align(4096, max * 2).unwrap();
    let msg = loci_alloc::alloc_on(0, big).unwrap_err().to_string();
    assert!(msg.contains(&format!("1 to {max}")), "{msg}");
    let ok = Layout::from_size_align(4096, max).unwrap();
    let p = loci_alloc::alloc_on(0, ok).unwrap();
    assert_eq!(p.as_ptr() as usize % max, 0);
    assert_eq!(loci_alloc::node_of(p.as_ptr()), Some(0));
    // SAFETY: live block from alloc_on.
    unsafe { loci_alloc::free(p.as_ptr()) };
    let mut v: Vec<u8> = Vec::with_capacity(10);
    v.push(1);
    assert_eq!(loci_alloc::node_of(std::ptr::null()), None);
}
