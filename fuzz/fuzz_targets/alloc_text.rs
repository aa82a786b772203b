//! The text the allocator (`loci_alloc::os`) reads inside its first `malloc`, without allocating:
//! Linux cpu and node lists (`parse_list`: `/sys/devices/system/node/online`, `has_memory`,
//! `nodeN/cpulist` through `NodeMap::add_node`), a node's `distance` row
//! (`NodeMap::add_distances`) and the sizes and counts of its environment
//! (`parse_size`: `LOCI_ALLOC_SUPERBLOCK=10M`, `LOCI_ALLOC_CACHE`).
//!
//! Input: `node | online | TEXT`. `node` (mod 72, so some are beyond the 64 the allocator
//! keeps) is the node `TEXT` is added as; `online` spreads into the mask of online nodes a
//! distance row is read against, and the mask of nodes with memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loci_alloc::os::{self, NodeMap, MAX_CPUS, MAX_LIST_ID, MAX_NODES};
use loci_topo::IdSet;

/// The allocator reads lists into 4096-byte buffers; a range is up to 65536 ids, so every byte
/// allowed here is more work per run (`0-65535,` repeated): cut well below that.
const MAX_TEXT: usize = 512;

/// Ids a list may name: one bit each.
struct Bits([u64; (MAX_LIST_ID + 1) / 64]);

impl Bits {
    fn new() -> Self {
        Bits([0; (MAX_LIST_ID + 1) / 64])
    }
    fn set(&mut self, id: usize) {
        self.0[id / 64] |= 1 << (id % 64);
    }
    fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &bits)| {
            (0..64)
                .filter(move |b| bits >> b & 1 == 1)
                .map(move |b| (w * 64 + b) as u32)
        })
    }
}

/// A list `parse_list` accepts, with what it called back; `None` if it refused the text.
fn parse_list(text: &[u8]) -> Option<(Bits, usize)> {
    let mut bits = Bits::new();
    let mut calls = 0usize;
    let ok = os::parse_list(text, |id| {
        assert!(id <= MAX_LIST_ID, "id {id} beyond the limit");
        bits.set(id);
        calls += 1;
    });
    ok.then_some((bits, calls))
}

/// What `parse_size` must return for `s`, computed without its code: digits and an optional
/// K/M/G suffix, `None` when empty, malformed or beyond `usize`.
fn size_model(s: &[u8]) -> Option<usize> {
    let (digits, mult): (&[u8], u128) = match s.last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: u128 = 0;
    for &d in digits {
        v = v.checked_mul(10)?.checked_add(u128::from(d - b'0'))?;
        if v > usize::MAX as u128 {
            return None;
        }
    }
    usize::try_from(v * mult).ok()
}

fuzz_target!(|data: &[u8]| {
    let [node, online, text @ ..] = data else {
        return;
    };
    let text = &text[..text.len().min(MAX_TEXT)];
    let node = *node as usize % 72;
    let online = u64::from(*online)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(7);

    // A list: the ids called back are those of the same text read by loci_topo's `IdSet`, and
    // the list `IdSet` prints is read as the same ids, in order, once each.
    let end = text
        .iter()
        .position(u8::is_ascii_whitespace)
        .unwrap_or(text.len());
    let head = &text[..end];
    let plain = head
        .iter()
        .all(|b| b.is_ascii_digit() || *b == b'-' || *b == b',');
    let parsed = parse_list(text);
    if let Some((bits, calls)) = &parsed {
        assert!(plain, "{text:?} accepted");
        // Output bounded by the input: at most a full range per item.
        let items = head.iter().filter(|&&b| b == b',').count() + 1;
        assert!(*calls <= items * (MAX_LIST_ID + 1));
        // A trailing comma is the one thing parse_list reads that IdSet refuses.
        let head = std::str::from_utf8(head).unwrap();
        // (Up to MAX_CPUS ids, and below for the converse, short lists only: a 65536-id IdSet
        // costs about 0.1 s under instrumentation.)
        if *calls <= MAX_CPUS {
            let set = IdSet::parse(head.strip_suffix(',').unwrap_or(head))
                .unwrap_or_else(|e| panic!("parse_list accepts {head:?}, IdSet does not: {e}"));
            assert!(set.iter().eq(bits.ids()), "{head:?}");
            let printed = set.to_string();
            let mut again = Vec::new();
            assert!(os::parse_list(printed.as_bytes(), |id| again.push(id as u32)));
            assert!(set.iter().eq(again.iter().copied()), "{printed:?}");
        }
    } else if plain && head.len() <= 24 {
        if let Ok(set) = IdSet::parse(std::str::from_utf8(head).unwrap()) {
            panic!("IdSet reads {head:?} as {set}, parse_list refuses it");
        }
    }

    // A node's cpu list: every cpu it lists (below MAX_CPUS) now maps to the node.
    let mut map = NodeMap::single();
    map.nodes = 0;
    let added = map.add_node(node, text);
    assert_eq!(added, node < MAX_NODES && parsed.is_some());
    if let (true, Some((bits, _))) = (added, &parsed) {
        assert_eq!(map.nodes, 1 << node);
        for id in bits.ids().take_while(|&i| (i as usize) < MAX_CPUS) {
            assert_eq!(map.cpu_node[id as usize] as usize, node);
        }
    }

    // A distance row: one value of 0..=255 per online node in node order, nothing else.
    let mut map = NodeMap::single();
    map.nodes = online;
    map.mem_nodes = online.rotate_left(node as u32);
    let tokens: Vec<&[u8]> = text
        .split(u8::is_ascii_whitespace)
        .filter(|t| !t.is_empty())
        .collect();
    let values: Option<Vec<u8>> = tokens
        .iter()
        .map(|t| {
            let t = std::str::from_utf8(t).ok()?;
            if !t.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            t.parse::<u64>().ok().and_then(|v| u8::try_from(v).ok())
        })
        .collect();
    let fits = tokens.len() <= online.count_ones() as usize;
    let ok = map.add_distances(node, text);
    assert_eq!(ok, node < MAX_NODES && values.is_some() && fits, "{text:?}");
    if ok {
        let to = (0..MAX_NODES).filter(|&n| online >> n & 1 == 1);
        for (t, v) in to.zip(values.unwrap()) {
            assert_eq!(map.distance[node][t], v);
        }
    }
    // Where a node's threads get memory: itself if it has some, else a node with memory.
    for n in [node, 0, MAX_NODES - 1] {
        match map.memory_node(n) {
            Some(m) => {
                assert!(map.mem_nodes >> m & 1 == 1, "node {m} has no memory");
                if n < MAX_NODES && map.mem_nodes >> n & 1 == 1 {
                    assert_eq!(m, n);
                }
            }
            None => assert_eq!(map.mem_nodes, 0),
        }
    }

    // A size: as the model says; a parsed size prints (plainly, and with a unit) and parses back.
    let size = os::parse_size(text);
    assert_eq!(size, size_model(text), "{text:?}");
    if let Some(v) = size {
        let mut buf = [0u8; 20];
        assert_eq!(os::parse_size(os::fmt_usize(v, &mut buf)), Some(v));
        if v % (1 << 20) == 0 {
            assert_eq!(os::parse_size(format!("{}M", v >> 20).as_bytes()), Some(v));
        }
    }
});
