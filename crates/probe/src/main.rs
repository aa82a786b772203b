//! `loci-probe`: a small program that reports, as one JSON document on stdout, where it runs and
//! where its memory lands, as the kernel sees it from the inside. Tests run it under `loci run`
//! (and inside multi-node VMs) and compare the report with the plan.

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use clap::Parser;
use loci_place::policy::name_of_mode;
use loci_place::sys;
use loci_place::verify::BufferPages;
use serde::Serialize;

/// Reports where this process runs and where its memory lands, as JSON on stdout.
///
/// Output (one JSON object):
///   {"pid": 4242, "tid": 4242, "cpus": "0-1", "cpu": 1,
///    "mempolicy": {"policy": "bind", "nodes": "0"}, "thp_disabled": false,
///    "threads": [{"index": 1, "tid": 4243, "cpus": "1", "cpu": 1,
///                 "mempolicy": {"policy": "bind", "nodes": "0"}}],
///    "alloc": {"bytes": 1048576, "by_thread": 0, "pages": 256,
///              "pages_per_node": {"0": 256}, "not_present": 0, "unknown": 0}}
///
/// `cpus` is the affinity (sched_getaffinity) in the Linux list syntax, `cpu` the cpu it was on
/// when asked (sched_getcpu), `mempolicy` what get_mempolicy(2) says (policy names as in
/// `loci plan --json`), `thp_disabled` what prctl(PR_GET_THP_DISABLE) says. Threads are started
/// with pthread_create (so `loci run`'s pin library places them), report after all have started,
/// and stay alive for --hold milliseconds so an outside observer can see them. `alloc` touches
/// every page of a fresh buffer (in the main thread, or in thread --alloc-thread) and asks the
/// kernel where each page is (move_pages(2) in query mode): `not_present` counts pages it says are
/// not faulted in (-ENOENT), `unknown` pages it gave no node for (-EFAULT: on Linux 6.1 resident
/// pages get it while automatic NUMA balancing scans them), `errors` other errnos; none of
/// those are counted on a node.
///
/// Examples:
///   loci-probe                                  # the main thread only
///   loci-probe --threads 3 --hold 500           # plus three threads kept 0.5 s
///   loci-probe --alloc 64M --alloc-thread 1     # 64 MiB first touched by thread 1
#[derive(Parser)]
#[command(name = "loci-probe", version, verbatim_doc_comment)]
struct Args {
    /// Extra threads to start (numbered 1..=T; the main thread is 0).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Bytes to allocate and touch, with an optional K, M or G suffix (powers of 1024).
    #[arg(long, value_parser = parse_bytes)]
    alloc: Option<usize>,
    /// Which thread touches the buffer (0 = main).
    #[arg(long, default_value_t = 0)]
    alloc_thread: usize,
    /// Milliseconds every thread stays alive after reporting (for outside observers).
    #[arg(long, default_value_t = 0)]
    hold: u64,
    /// Create the threads from this many spawner threads at once instead of from the main thread
    /// (a stress test for concurrent pthread_create under the pin library). Spawners are threads
    /// too, created first; they are not in the report.
    #[arg(long, default_value_t = 0)]
    spawners: usize,
    /// Exit with this status after reporting.
    #[arg(long, default_value_t = 0)]
    exit: i32,
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    let n = loci_topo::sysfs::parse_size(s)?;
    usize::try_from(n).map_err(|_| format!("`{s}` is more bytes than this machine can address"))
}

#[derive(Serialize)]
struct Policy {
    policy: &'static str,
    nodes: String,
}

#[derive(Serialize)]
struct ThreadReport {
    index: usize,
    tid: i32,
    cpus: String,
    cpu: u32,
    mempolicy: Policy,
}

#[derive(Serialize)]
struct AllocReport {
    bytes: usize,
    by_thread: usize,
    pages: usize,
    pages_per_node: BTreeMap<String, usize>,
    /// Pages the kernel reported as not faulted in (-ENOENT).
    not_present: usize,
    /// Pages the kernel gave no node for (-EFAULT; see `loci_place::verify::PageStatus`).
    unknown: usize,
    /// Pages with any other error, by errno.
    errors: BTreeMap<String, usize>,
}

#[derive(Serialize)]
struct Report {
    pid: u32,
    tid: i32,
    cpus: String,
    cpu: u32,
    mempolicy: Policy,
    thp_disabled: bool,
    threads: Vec<ThreadReport>,
    alloc: Option<AllocReport>,
}

fn policy() -> Policy {
    match sys::get_mempolicy() {
        Ok((m, n)) => Policy {
            policy: name_of_mode(m),
            nodes: n.to_string(),
        },
        Err(_) => Policy {
            policy: "unknown",
            nodes: String::new(),
        },
    }
}

fn me(index: usize) -> ThreadReport {
    ThreadReport {
        index,
        tid: sys::gettid(),
        cpus: sys::get_affinity(0)
            .map(|c| c.to_string())
            .unwrap_or_default(),
        cpu: sys::current_cpu().unwrap_or(u32::MAX),
        mempolicy: policy(),
    }
}

/// Allocates and touches `bytes`; returns the report and the buffer (kept alive by the caller until
/// exit, so outside observers see its pages in /proc/PID/numa_maps).
fn touch(bytes: usize, by_thread: usize) -> (AllocReport, Vec<u8>) {
    let buf = vec![1u8; bytes];
    // vec! of a non-zero value writes every byte: every page is faulted in by this thread.
    let st = sys::buffer_pages_nodes(buf.as_ptr(), buf.len()).unwrap_or_default();
    let b = BufferPages::from_statuses(&st);
    let r = AllocReport {
        bytes,
        by_thread,
        pages: st.len(),
        pages_per_node: b
            .per_node
            .iter()
            .map(|(n, c)| (n.to_string(), *c))
            .collect(),
        not_present: b.not_present,
        unknown: b.unknown,
        errors: b.errors.iter().map(|(e, c)| (e.to_string(), *c)).collect(),
    };
    (r, std::hint::black_box(buf))
}

fn main() {
    let a = Args::parse();
    if a.alloc_thread > a.threads {
        eprintln!(
            "loci-probe: --alloc-thread {} but only threads 0..={} exist",
            a.alloc_thread, a.threads
        );
        std::process::exit(2);
    }
    let barrier = Arc::new(Barrier::new(a.threads + 1));
    type Out = (ThreadReport, Option<(AllocReport, Vec<u8>)>);
    let worker = |i: usize| {
        let b = barrier.clone();
        let (alloc, hold) = (a.alloc.filter(|_| a.alloc_thread == i), a.hold);
        move || -> Out {
            let r = me(i);
            let al = alloc.map(|bytes| touch(bytes, i));
            b.wait();
            std::thread::sleep(Duration::from_millis(hold));
            (r, al)
        }
    };
    let handles: Vec<std::thread::JoinHandle<Vec<Out>>> = if a.spawners == 0 {
        (1..=a.threads)
            .map(|i| {
                let w = worker(i);
                std::thread::spawn(move || vec![w()])
            })
            .collect()
    } else {
        // Worker i is created by spawner i % spawners; spawners start creating together.
        let go = Arc::new(Barrier::new(a.spawners));
        (0..a.spawners)
            .map(|k| {
                let mine: Vec<_> = (1..=a.threads)
                    .filter(|i| i % a.spawners == k)
                    .map(worker)
                    .collect();
                let go = go.clone();
                std::thread::spawn(move || {
                    go.wait();
                    let hs: Vec<_> = mine.into_iter().map(std::thread::spawn).collect();
                    hs.into_iter()
                        .map(|h| h.join().expect("probe thread panicked"))
                        .collect()
                })
            })
            .collect()
    };
    let main = me(0);
    let mut alloc = a.alloc.filter(|_| a.alloc_thread == 0).map(|b| touch(b, 0));
    barrier.wait();
    std::thread::sleep(Duration::from_millis(a.hold));
    let mut threads = Vec::new();
    for h in handles {
        for (r, al) in h.join().expect("probe thread panicked") {
            threads.push(r);
            if al.is_some() {
                alloc = al;
            }
        }
    }
    threads.sort_by_key(|t| t.index);
    let (alloc, _keep) = match alloc {
        Some((r, buf)) => (Some(r), Some(buf)),
        None => (None, None),
    };
    let report = Report {
        pid: std::process::id(),
        tid: main.tid,
        cpus: main.cpus,
        cpu: main.cpu,
        mempolicy: main.mempolicy,
        thp_disabled: sys::thp_disabled().unwrap_or(false),
        threads,
        alloc,
    };
    println!("{}", serde_json::to_string(&report).expect("serializable"));
    std::process::exit(a.exit);
}
