//! The parsers of outside input in the `loci` command itself (`loci_cli::inputs`): command-line
//! values (`--budget`, sizes, `--verify-wait`, `--grace`, `--queries`, counts, `--scheduler`,
//! `--nthreads`), `loci deploy`'s command templates and its manifest file, the advise cache
//! file, a program's output read with `advise --metric REGEX`, /proc/vmstat, and the values of
//! the benches' options that loci-array, loci-engine and loci-sched parse (thread strategies,
//! data types, spans, TPC-H queries, schedulers). The first byte picks the parser, the rest is
//! its text (cut at [`MAX_INPUT`] bytes).
#![no_main]

use std::ffi::OsString;

use libfuzzer_sys::fuzz_target;
use loci_array::{DType, Span, ThreadPlacement};
use loci_cli::inputs::{self, Manifest, Template, Values};
use loci_engine::tpch::Query;

/// Every parser here is linear in its input; 16 KB keeps a manifest or an advise cache entry
/// (about 5 KB for 7 candidates) whole.
const MAX_INPUT: usize = 16384;

/// One week: the longest `--budget`.
const WEEK_S: f64 = 604_800.0;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let s = loci_fuzz::text(&rest[..rest.len().min(MAX_INPUT)]);
    let s: &str = &s;
    match which % 13 {
        0 => template(s),
        1 => {
            // `--scheduler`: the URL it gives the workers parses back to itself.
            if let Ok((url, host, port)) = inputs::parse_address(s) {
                assert!(port >= 1 && !host.is_empty(), "{s:?}");
                assert!(url.starts_with("tcp://") && url.ends_with(&format!(":{port}")));
                let (again, _, port2) = inputs::parse_address(&url)
                    .unwrap_or_else(|e| panic!("{s:?} gave {url:?}, which does not parse: {e}"));
                assert_eq!((again, port2), (url, port));
            }
        }
        2 => {
            if let Ok(n) = inputs::parse_nthreads(s) {
                let printed = format!("{n:?}");
                assert!(
                    s == "auto" || s.parse::<usize>().is_ok_and(|v| v > 0),
                    "{printed}"
                );
            }
        }
        3 => {
            // `--budget`: a millisecond to a week, and its seconds parse back to it.
            if let Ok(d) = inputs::parse_duration(s) {
                let secs = d.as_secs_f64();
                assert!((0.000_999..=WEEK_S).contains(&secs), "{s:?} -> {d:?}");
                let back = inputs::parse_duration(&format!("{secs}s"))
                    .unwrap_or_else(|e| panic!("{s:?} -> {secs} s does not parse: {e}"));
                assert!(back.abs_diff(d).as_nanos() <= 1, "{s:?}: {d:?} -> {back:?}");
            }
        }
        4 => {
            // Sizes: a parsed size prints as plain bytes that parse back to it.
            if let Ok(n) = inputs::parse_bytes(s) {
                assert_eq!(inputs::parse_bytes(&n.to_string()), Ok(n));
                assert_eq!(inputs::parse_usize_bytes(s), Ok(n as usize));
            }
        }
        5 => {
            if let Ok(v) = inputs::parse_wait(s) {
                assert!((0.0..=3600.0).contains(&v), "{s:?} -> {v}");
                assert_eq!(inputs::parse_wait(&v.to_string()), Ok(v));
            }
            if let Ok(v) = inputs::parse_grace(s) {
                assert!(v >= 0.0 && v.is_finite(), "{s:?} -> {v}");
                assert_eq!(inputs::parse_grace(&v.to_string()), Ok(v));
            }
            if let Ok(n) = inputs::at_least_one(s) {
                assert!(n >= 1);
            }
        }
        6 => {
            // `--queries`: TPC-H query numbers, printed and parsed back.
            if let Ok(q) = inputs::parse_queries(s) {
                assert!(
                    !q.is_empty() && q.iter().all(|n| (1..=22).contains(n)),
                    "{s:?}"
                );
                let printed: Vec<String> = q.iter().map(u32::to_string).collect();
                assert_eq!(inputs::parse_queries(&printed.join(",")).ok(), Some(q));
            }
        }
        7 => {
            // The manifest `loci deploy stop|status` reads back: a manifest it accepts writes
            // JSON that it accepts again, unchanged.
            if let Ok(m) = Manifest::parse(s) {
                let json = serde_json::to_string(&m).expect("a manifest serializes");
                let again = Manifest::parse(&json)
                    .unwrap_or_else(|e| panic!("{json} was written from a manifest: {e:#}"));
                assert_eq!(serde_json::to_string(&again).unwrap(), json);
            }
        }
        8 => {
            // The advise cache: an entry it uses writes back as an entry it uses.
            if let Some(f) = inputs::parse_cached(s) {
                let json = serde_json::to_string(&f).expect("a cache entry serializes");
                assert!(inputs::parse_cached(&json).is_some(), "{json}");
            }
        }
        9 => {
            // `--metric REGEX` over a program's output: the first line is the regex (size-capped
            // as a user's would be compiled), the rest the output. A figure is finite and above 0.
            let (re, out) = s.split_once('\n').unwrap_or((s, ""));
            let Ok(re) = regex::RegexBuilder::new(re).size_limit(1 << 20).build() else {
                return;
            };
            if let Ok(v) = inputs::parse_metric(&re, out) {
                assert!(v.is_finite() && v > 0.0, "{v}");
            }
        }
        10 => {
            // /proc/vmstat: a counter found is the number on a line that starts with its name.
            let (key, text) = s.split_once('\n').unwrap_or((s, ""));
            if let Some(v) = inputs::parse_vmstat(text, key) {
                assert!(
                    text.lines().any(|l| l
                        .split_once(' ')
                        .is_some_and(|(k, n)| k == key && n.trim().parse() == Ok(v))),
                    "{key:?} -> {v}"
                );
            }
        }
        11 => {
            // The benches' option values (loci-array, loci-engine, loci-sched): each one parsed
            // prints and parses back to itself.
            if let Ok(list) = ThreadPlacement::parse_list(s) {
                for t in list {
                    let _ = loci_fuzz::parse_round_trip::<ThreadPlacement>(&t.to_string());
                }
            }
            let _ = loci_fuzz::parse_round_trip::<ThreadPlacement>(s);
            let _ = loci_fuzz::parse_round_trip::<DType>(s);
            let _ = loci_fuzz::parse_round_trip::<Span>(s);
            let _ = loci_fuzz::parse_round_trip::<Query>(s);
            if let Ok(p) = loci_sched::Policy::parse(s) {
                assert_eq!(loci_sched::Policy::parse(p.name()), Ok(p));
                assert_eq!(loci_engine::exec::parse_sched(s).ok(), Some(p));
            }
        }
        _ => {
            // Any text, its braces escaped, is a template that expands to the text itself.
            let escaped = s.replace('{', "{{").replace('}', "}}");
            let t = Template::parse(&[OsString::from(&escaped)])
                .unwrap_or_else(|e| panic!("{escaped:?}: {e:#}"));
            assert_eq!(t.expand(&values(1)).unwrap(), vec![s.to_string()]);
        }
    }
});

/// What one instance fills in: one node, a network device, so every placeholder has a value.
fn values(instance: usize) -> Values {
    Values {
        instance,
        ninstances: instance + 1,
        nodes: loci_topo::NodeSet::single(instance as u32),
        cpus: loci_topo::CpuSet::parse("0-3").expect("a cpu list"),
        port: 20_000 + instance as u16,
        nic: Some(("eth0".to_string(), Some(instance as u32))),
    }
}

/// `loci deploy`'s template: one argument per line. A template that parses expands for an
/// instance that has a value for every placeholder, to as many arguments as it has, and no
/// placeholder name is left in braces unless the input escaped it.
fn template(s: &str) {
    let args: Vec<OsString> = s.split('\n').map(OsString::from).collect();
    match Template::parse(&args) {
        Ok(t) => {
            let out = t
                .expand(&values(2))
                .unwrap_or_else(|e| panic!("{s:?} parsed but does not expand: {e:#}"));
            assert_eq!(out.len(), args.len());
            if !s.contains("{{") {
                for (name, _) in inputs::PLACEHOLDERS {
                    let slot = format!("{{{name}}}");
                    assert!(out.iter().all(|a| !a.contains(&slot)), "{s:?} -> {out:?}");
                }
            }
        }
        Err(e) => assert!(e.to_string().contains("template argument"), "{e:#}"),
    }
}
