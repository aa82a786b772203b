//! The /proc and /sys text loci reads about a running program and the OS: what `loci run
//! --verify` reads (`verify::parse_status` of `/proc/PID/task/TID/status`, `parse_stat` of its
//! `stat`, `parse_numa_maps` of `/proc/PID/numa_maps`, then `anon_bytes_per_node` and
//! `remote_share` on the result) and the OS knobs of `loci os` (`knobs::parse_autonuma` of
//! `numa_balancing`, `parse_choice` and `choices` of the THP choice files), each fed the whole
//! input as the file it reads.
#![no_main]

use std::fmt::Write as _;

use libfuzzer_sys::fuzz_target;
use loci_place::knobs;
use loci_place::verify::{self, NumaMap, Stat, Status};
use loci_topo::NodeSet;

/// Every `Cpus_allowed_list` and `Mems_allowed_list` line of a status file is parsed into a set:
/// inputs are cut here (a real status file is about 1.5 KB) and skipped above
/// [`loci_fuzz::LIST_IDS_BUDGET`] ids, so that one run stays well under the timeout.
const MAX_INPUT: usize = 4096;

/// `st` printed the way the kernel prints the lines `parse_status` reads.
fn render_status(st: &Status) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Name:\t{}", st.name);
    let _ = writeln!(s, "Threads:\t{}", st.threads);
    let _ = writeln!(s, "Cpus_allowed_list:\t{}", st.cpus_allowed);
    let _ = writeln!(s, "Mems_allowed_list:\t{}", st.mems_allowed);
    s
}

/// `st` printed as a `stat` line: fields 4..=38 are zeros, field 39 is the processor.
fn render_stat(st: &Stat) -> String {
    let mut s = format!("{} ({}) {}", st.tid, st.comm, st.state);
    for _ in 4..39 {
        s.push_str(" 0");
    }
    let _ = writeln!(s, " {} 0 0", st.processor);
    s
}

/// `maps` printed as `numa_maps` lines (one token per field `parse_numa_maps` reads).
fn render_numa_maps(maps: &[NumaMap]) -> String {
    let mut s = String::new();
    for m in maps {
        let _ = write!(s, "{:x} {}", m.addr, m.policy);
        if let Some(f) = &m.file {
            let _ = write!(s, " file={f}");
        }
        for (n, p) in &m.pages {
            let _ = write!(s, " N{n}={p}");
        }
        let _ = writeln!(s, " kernelpagesize_kB={}", m.page_kb);
    }
    s
}

fuzz_target!(|data: &[u8]| {
    let s = loci_fuzz::text(&data[..data.len().min(MAX_INPUT)]);
    let s: &str = &s;
    if loci_fuzz::list_ids_bound(s) > loci_fuzz::LIST_IDS_BUDGET {
        return;
    }

    if let Ok(st) = verify::parse_status(s) {
        let printed = render_status(&st);
        let back = verify::parse_status(&printed)
            .unwrap_or_else(|e| panic!("{s:?} parsed, its print {printed:?} does not: {e}"));
        assert_eq!(back, st, "{s:?} -> {printed:?}");
    }

    match verify::parse_stat(s) {
        Ok(st) => {
            let printed = render_stat(&st);
            let back = verify::parse_stat(&printed)
                .unwrap_or_else(|e| panic!("{s:?} parsed, its print {printed:?} does not: {e}"));
            assert_eq!(back, st, "{s:?} -> {printed:?}");
        }
        Err(e) => assert_eq!(e.file, "stat"),
    }

    match verify::parse_numa_maps(s) {
        Ok(maps) => {
            // One mapping per line with a token: nothing dropped, nothing made up.
            let lines = s
                .lines()
                .filter(|l| l.split_whitespace().next().is_some())
                .count();
            assert_eq!(maps.len(), lines, "{s:?}");
            let printed = render_numa_maps(&maps);
            let back = verify::parse_numa_maps(&printed)
                .unwrap_or_else(|e| panic!("{s:?} parsed, its print {printed:?} does not: {e}"));
            assert_eq!(back, maps, "{s:?} -> {printed:?}");
            // What `loci run --verify` does with them.
            let per_node = verify::anon_bytes_per_node(&maps);
            assert!(maps.iter().any(|m| m.anon) || per_node.is_empty());
            for expected in [NodeSet::new(), NodeSet::single(0)] {
                let share = verify::remote_share(&per_node, &expected);
                assert!((0.0..=1.0).contains(&share), "remote share {share}");
            }
        }
        Err(e) => assert!(e.what.starts_with("line "), "{e}"),
    }

    match knobs::parse_autonuma(s) {
        Ok(v) => {
            let n: u32 = s.trim().parse().expect("only a number parses");
            let want = match n {
                0 => "off".to_string(),
                1 => "on".to_string(),
                n => format!("on (mode {n})"),
            };
            assert_eq!(v, want);
        }
        Err(e) => assert!(e.contains(s.trim()), "{e}"),
    }

    // A choice file: the selected word is one of the choices, without its brackets.
    let offered = knobs::choices(s);
    assert_eq!(offered.len(), s.split_whitespace().count());
    if let Ok(c) = knobs::parse_choice(s) {
        assert!(
            offered.contains(&c.trim_matches(['[', ']']).to_string()),
            "{c:?} not among {offered:?}"
        );
    }
    // The words of the input as the kernel would print them, each selected in turn.
    let words: Vec<String> = offered
        .iter()
        .filter(|w| !w.is_empty())
        .take(8)
        .cloned()
        .collect();
    for k in 0..words.len() {
        let file: Vec<String> = words
            .iter()
            .enumerate()
            .map(|(i, w)| if i == k { format!("[{w}]") } else { w.clone() })
            .collect();
        let file = file.join(" ") + "\n";
        assert_eq!(
            knobs::parse_choice(&file).as_ref(),
            Ok(&words[k]),
            "{file:?}"
        );
        assert_eq!(knobs::choices(&file), words, "{file:?}");
    }
});
