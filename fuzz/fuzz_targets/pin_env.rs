//! The contract between `loci run` and the pin library (`loci_place::pinenv`): the environment
//! variables the library reads when it loads into a program (`decode_cpus` of `LOCI_PIN_CPUS`,
//! `parse_skip` of `LOCI_PIN_SKIP`, then the `Dealer` that hands out plan entries) and the log
//! file `loci run --verify` reads back (`parse_log` of `LOCI_PIN_LOG`), each fed the whole input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loci_place::pinenv::{self, Dealer, PinRole};

/// Every entry of `LOCI_PIN_CPUS` and every `cpus=` of the log is a set built, printed and built
/// again: inputs are cut here and skipped above [`loci_fuzz::LIST_IDS_BUDGET`] ids, so that one
/// run stays well under the timeout.
const MAX_INPUT: usize = 2048;

/// Roles the dealer hands out in one run: past the 64 bits of the skip mask.
const DRAWS: usize = 80;

fuzz_target!(|data: &[u8]| {
    let s = loci_fuzz::text(&data[..data.len().min(MAX_INPUT)]);
    let s: &str = &s;
    if loci_fuzz::list_ids_bound(s) > loci_fuzz::LIST_IDS_BUDGET {
        return;
    }

    // LOCI_PIN_CPUS: one non-empty set per `;`-separated entry, printed and decoded back.
    let entries = match pinenv::decode_cpus(s) {
        Ok(sets) => {
            assert_eq!(sets.len(), s.trim().split(';').count());
            assert!(sets.iter().all(|c| !c.is_empty()));
            let printed = pinenv::encode_cpus(&sets);
            let back = pinenv::decode_cpus(&printed).unwrap_or_else(|e| {
                panic!("{s:?} decoded, its encoding {printed:?} does not: {e}")
            });
            assert_eq!(back, sets, "{s:?} -> {printed:?}");
            sets.len()
        }
        Err(e) => {
            assert!(e.contains(pinenv::ENV_CPUS), "{e}");
            1 + s.len() % 8
        }
    };

    // LOCI_PIN_SKIP: a hex mask, with or without `0x`, prints and parses back.
    let skip = match pinenv::parse_skip(s) {
        Ok(v) => {
            assert_eq!(pinenv::parse_skip(&format!("{v:#x}")), Ok(v));
            assert_eq!(pinenv::parse_skip(&format!("{v:X}")), Ok(v));
            v
        }
        Err(e) => {
            assert!(e.contains(pinenv::ENV_SKIP), "{e}");
            data.iter()
                .take(8)
                .fold(0u64, |m, &b| m << 8 | u64::from(b))
        }
    };

    // The dealer: thread `j` is a helper exactly when bit `j` of the mask is set; the others
    // take plan entries 1, 2, ... in order, then are extras.
    let mut d = Dealer::new(entries, skip);
    let mut next = 1;
    for j in 0..DRAWS {
        match d.next_role() {
            PinRole::Skip => assert!(j < 64 && skip >> j & 1 == 1, "thread {j} skipped"),
            PinRole::Thread(i) => {
                assert!(j >= 64 || skip >> j & 1 == 0, "thread {j} not skipped");
                assert_eq!(i, next, "plan entries in order");
                assert!(i < entries);
                next += 1;
            }
            PinRole::Extra => {
                assert!(j >= 64 || skip >> j & 1 == 0, "thread {j} not skipped");
                assert_eq!(next, entries, "an extra only when the plan is used up");
            }
        }
    }

    // The pin log: one entry (a thread or an exit reading) per non-blank line; the log prints as
    // lines that parse back.
    match pinenv::parse_log(s) {
        Ok(log) => {
            let lines = s.lines().filter(|l| !l.trim().is_empty()).count();
            assert_eq!(log.threads.len() + log.exits.len(), lines, "{s:?}");
            let printed = log.text();
            let back = pinenv::parse_log(&printed)
                .unwrap_or_else(|e| panic!("{s:?} parsed, its print {printed:?} does not: {e}"));
            assert_eq!(back, log, "{s:?} -> {printed:?}");
        }
        Err(e) => assert!(e.starts_with("pin log line "), "{e}"),
    }
});
