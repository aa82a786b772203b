//! Verify: read back where a process's threads and pages actually are, and compare with the plan.
//!
//! Sources, all readable without ptrace:
//! - `/proc/PID/task/TID/status`: `Cpus_allowed_list` (the thread's affinity);
//! - `/proc/PID/task/TID/stat`: field 39 `processor` (the cpu it last ran on);
//! - `/proc/PID/numa_maps`: pages per node (`N<node>=<pages>`) of every mapping;
//! - the pin library's log (`LOCI_PIN_LOG`, see [`crate::pinenv`]): which plan thread each tid is,
//!   and the memory policy each thread saw (another process's policy is not visible in /proc).
//!
//! Every parser takes `&str` and is unit-tested on literal text.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;

use loci_topo::{CpuSet, NodeSet};
use serde::Serialize;

use crate::pinenv::{PinLogEntry, PinRole};
use crate::plan::Plan;

/// What loci reads from `/proc/PID/task/TID/status`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    pub name: String,
    pub cpus_allowed: CpuSet,
    pub mems_allowed: NodeSet,
    pub threads: usize,
}

/// Error from a /proc parser: the file, the field and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {what}")]
pub struct ProcError {
    pub file: &'static str,
    pub what: String,
}

/// Parses `/proc/.../status`.
pub fn parse_status(text: &str) -> Result<Status, ProcError> {
    let err = |what: String| ProcError {
        file: "status",
        what,
    };
    let mut st = Status::default();
    let mut seen_cpus = false;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k {
            "Name" => st.name = v.to_string(),
            "Cpus_allowed_list" => {
                st.cpus_allowed =
                    CpuSet::parse(v).map_err(|e| err(format!("Cpus_allowed_list: {e}")))?;
                seen_cpus = true;
            }
            "Mems_allowed_list" => {
                st.mems_allowed =
                    NodeSet::parse(v).map_err(|e| err(format!("Mems_allowed_list: {e}")))?
            }
            "Threads" => {
                st.threads = v
                    .parse()
                    .map_err(|_| err(format!("Threads: `{v}` is not a number")))?
            }
            _ => {}
        }
    }
    if !seen_cpus {
        return Err(err("no Cpus_allowed_list line".into()));
    }
    Ok(st)
}

/// Fields loci reads from `/proc/.../stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub tid: i32,
    pub comm: String,
    pub state: char,
    /// Field 39: the cpu the task last ran on.
    pub processor: u32,
}

/// Parses `/proc/.../stat`. The command name (field 2) is in parentheses and may itself contain
/// spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Result<Stat, ProcError> {
    let err = |what: String| ProcError { file: "stat", what };
    let open = text
        .find('(')
        .ok_or_else(|| err("no `(` before the command name".into()))?;
    let close = text
        .rfind(')')
        .ok_or_else(|| err("no `)` after the command name".into()))?;
    let tid = text[..open]
        .trim()
        .parse()
        .map_err(|_| err(format!("pid `{}` is not a number", text[..open].trim())))?;
    let comm = text[open + 1..close].to_string();
    // Fields after ")" start at field 3 (state).
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let field = |n: usize| {
        rest.get(n - 3)
            .copied()
            .ok_or_else(|| err(format!("only {} fields, need field {n}", rest.len() + 2)))
    };
    let state = field(3)?.chars().next().unwrap_or('?');
    let p = field(39)?;
    let processor = p
        .parse()
        .map_err(|_| err(format!("field 39 (processor) `{p}` is not a number")))?;
    Ok(Stat {
        tid,
        comm,
        state,
        processor,
    })
}

/// One mapping of `/proc/PID/numa_maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaMap {
    pub addr: u64,
    /// The mapping's policy as the kernel prints it (`default`, `bind:0`, `interleave:0-3`, ...).
    pub policy: String,
    /// `file=` path if file-backed.
    pub file: Option<String>,
    /// Heap, stack or other anonymous memory (no file).
    pub anon: bool,
    /// Pages per node (`N<node>=<pages>`), in units of `page_kb`.
    pub pages: BTreeMap<u32, u64>,
    pub page_kb: u64,
}

/// Parses `/proc/PID/numa_maps`.
pub fn parse_numa_maps(text: &str) -> Result<Vec<NumaMap>, ProcError> {
    let mut out = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let err = |what: String| ProcError {
            file: "numa_maps",
            what: format!("line {}: {what}", ln + 1),
        };
        let mut it = line.split_whitespace();
        let Some(addr) = it.next() else { continue };
        let addr = u64::from_str_radix(addr, 16)
            .map_err(|_| err(format!("address `{addr}` is not hex")))?;
        let policy = it
            .next()
            .ok_or_else(|| err("no policy".into()))?
            .to_string();
        let mut m = NumaMap {
            addr,
            policy,
            file: None,
            anon: true,
            pages: BTreeMap::new(),
            page_kb: 4,
        };
        for tok in it {
            let Some((k, v)) = tok.split_once('=') else {
                continue; // flags such as `heap`, `stack`, `huge`
            };
            if k == "file" {
                m.file = Some(v.to_string());
                m.anon = false;
            } else if k == "kernelpagesize_kB" {
                m.page_kb = v
                    .parse()
                    .map_err(|_| err(format!("kernelpagesize_kB `{v}` is not a number")))?;
            } else if let Some(node) = k.strip_prefix('N') {
                if let Ok(node) = node.parse::<u32>() {
                    let pages: u64 = v
                        .parse()
                        .map_err(|_| err(format!("`{tok}`: page count is not a number")))?;
                    let sum = m.pages.entry(node).or_insert(0);
                    *sum = sum.checked_add(pages).ok_or_else(|| {
                        err(format!("`{tok}`: pages of node {node} add up beyond 2^64"))
                    })?;
                }
            }
        }
        out.push(m);
    }
    Ok(out)
}

/// Bytes per node of the anonymous (non-file) mappings: the program's own data. Saturates at
/// `u64::MAX` bytes (only a forged numa_maps gets there).
pub fn anon_bytes_per_node(maps: &[NumaMap]) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for m in maps.iter().filter(|m| m.anon) {
        for (&n, &p) in &m.pages {
            let bytes = p.saturating_mul(m.page_kb).saturating_mul(1024);
            let sum: &mut u64 = out.entry(n).or_insert(0);
            *sum = sum.saturating_add(bytes);
        }
    }
    out
}

/// Share of bytes not on `expected` nodes (0.0 when there are none).
pub fn remote_share(per_node: &BTreeMap<u32, u64>, expected: &NodeSet) -> f64 {
    // Summed in u128: the sum of 2^32 u64 values cannot wrap.
    let total: u128 = per_node.values().map(|&b| u128::from(b)).sum();
    if total == 0 {
        return 0.0;
    }
    let remote: u128 = per_node
        .iter()
        .filter(|(n, _)| !expected.contains(**n))
        .map(|(_, &b)| u128::from(b))
        .sum();
    remote as f64 / total as f64
}

/// What `move_pages(2)` in query mode says about one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageStatus {
    /// Resident on this node.
    Node(u32),
    /// Not faulted in yet (`-ENOENT`).
    NotPresent,
    /// The kernel did not say (`-EFAULT`). Not a failure and not a node: on Linux 6.1, while
    /// automatic NUMA balancing scans a range (it makes the pages PROT_NONE to catch the next
    /// access), `move_pages` reports `-EFAULT` for pages that are resident; it is also what an
    /// unmapped address gets.
    Unknown,
    /// Any other `-errno`.
    Error(i32),
}

impl PageStatus {
    /// Classifies one status word of `move_pages` (a node id or `-errno`).
    pub fn from_status(s: i32) -> Self {
        match s {
            n if n >= 0 => PageStatus::Node(n as u32),
            s if s == -libc::ENOENT => PageStatus::NotPresent,
            s if s == -libc::EFAULT => PageStatus::Unknown,
            s => PageStatus::Error(-s),
        }
    }
}

/// Where the pages of one of this process's own buffers are: pages per node, and pages not yet
/// faulted in (move_pages(2) in query mode; exact, unlike numa_maps which sums whole mappings).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct BufferPages {
    pub per_node: BTreeMap<u32, usize>,
    pub not_present: usize,
    /// Pages the kernel gave no node for (`-EFAULT`, see [`PageStatus::Unknown`]): neither
    /// counted on a node nor as a failure.
    pub unknown: usize,
    /// Pages with any other error, by errno.
    pub errors: BTreeMap<i32, usize>,
}

impl BufferPages {
    /// Counts the status words of `move_pages` (see [`PageStatus::from_status`]).
    pub fn from_statuses(statuses: &[i32]) -> Self {
        let mut out = BufferPages::default();
        for &s in statuses {
            match PageStatus::from_status(s) {
                PageStatus::Node(n) => *out.per_node.entry(n).or_insert(0) += 1,
                PageStatus::NotPresent => out.not_present += 1,
                PageStatus::Unknown => out.unknown += 1,
                PageStatus::Error(e) => *out.errors.entry(e).or_insert(0) += 1,
            }
        }
        out
    }

    /// Pages counted in any class.
    pub fn pages(&self) -> usize {
        self.per_node.values().sum::<usize>()
            + self.not_present
            + self.unknown
            + self.errors.values().sum::<usize>()
    }

    /// Share of present pages not on `expected` nodes.
    pub fn remote_share(&self, expected: &NodeSet) -> f64 {
        let total: usize = self.per_node.values().sum();
        if total == 0 {
            return 0.0;
        }
        self.pages_outside(expected) as f64 / total as f64
    }

    /// Pages on a node that is not in `nodes`.
    pub fn pages_outside(&self, nodes: &NodeSet) -> usize {
        self.per_node
            .iter()
            .filter(|(n, _)| !nodes.contains(**n))
            .map(|(_, p)| p)
            .sum()
    }

    /// Checks that every page whose node is known is resident on `want`: no page on another
    /// node, none missing, no error, and at least one page known. Pages of unknown node
    /// ([`PageStatus::Unknown`]) are neither evidence for nor against; the message counts them.
    pub fn check_all_on(&self, want: &NodeSet) -> Result<(), String> {
        let outside = self.pages_outside(want);
        let known: usize = self.per_node.values().sum();
        let unknown = if self.unknown > 0 {
            format!(", {} of unknown node (-EFAULT)", self.unknown)
        } else {
            String::new()
        };
        if outside > 0 || self.not_present > 0 || !self.errors.is_empty() || known == 0 {
            return Err(format!(
                "pages per node {:?}, {} not present, errors by errno {:?}{unknown}: want all {} on node(s) {want}",
                self.per_node,
                self.not_present,
                self.errors,
                self.pages()
            ));
        }
        Ok(())
    }
}

/// Pages per node of `buf`, a buffer of this process.
pub fn buffer_pages(buf: &[u8]) -> io::Result<BufferPages> {
    buffer_pages_at(buf.as_ptr(), buf.len())
}

/// Pages per node of the range `[addr, addr+len)` of this process (a mapping loci made itself,
/// for example). Only queries: the range need not be valid (unmapped pages count as unknown).
pub fn buffer_pages_at(addr: *const u8, len: usize) -> io::Result<BufferPages> {
    let st = crate::sys::buffer_pages_nodes(addr, len)?;
    Ok(BufferPages::from_statuses(&st))
}

/// One thread as read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskSample {
    pub tid: i32,
    pub name: String,
    pub cpus: CpuSet,
    pub last_cpu: u32,
}

/// One look at a process.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the program started.
    pub at_s: f64,
    pub tasks: Vec<TaskSample>,
    /// Anonymous memory per node in bytes (from numa_maps).
    pub anon_bytes: BTreeMap<u32, u64>,
    /// When `anon_bytes` was read (seconds since the program started) and by whom.
    pub memory_at_s: f64,
    pub memory_by: MemoryBy,
}

/// Who read a sample's memory figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryBy {
    /// loci, polling `/proc/PID/numa_maps` from outside.
    Poll,
    /// The program itself, at `exit(3)` (the pin library's `exit-anon` log line).
    ProgramAtExit,
}

/// Reads one thread; `None` if it has exited meanwhile.
pub fn sample_task(pid: i32, tid: i32) -> Option<TaskSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let status = parse_status(&status).ok()?;
    let stat = parse_stat(&stat).ok()?;
    Some(TaskSample {
        tid,
        name: status.name,
        cpus: status.cpus_allowed,
        last_cpu: stat.processor,
    })
}

/// Reads every thread of `pid`, and (if `with_memory`) its numa_maps.
pub fn sample(pid: i32, at_s: f64, with_memory: bool) -> io::Result<Sample> {
    let tids = crate::apply::task_ids(pid)?;
    let tasks = tids
        .into_iter()
        .filter_map(|t| sample_task(pid, t))
        .collect();
    let anon_bytes = if with_memory {
        match std::fs::read_to_string(format!("/proc/{pid}/numa_maps")) {
            Ok(t) => anon_bytes_per_node(
                &parse_numa_maps(&t).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
            ),
            Err(_) => BTreeMap::new(),
        }
    } else {
        BTreeMap::new()
    };
    Ok(Sample {
        at_s,
        tasks,
        anon_bytes,
        memory_at_s: at_s,
        memory_by: MemoryBy::Poll,
    })
}

/// One thread's plan vs actual (a row of the `loci run --verify` table).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadVerdict {
    pub tid: i32,
    pub name: String,
    /// Plan thread index; `None` for threads the plan does not cover (skipped helpers, extras).
    pub index: Option<usize>,
    /// How the pin library treated it: `plan`, `skip`, `extra`, or `unknown` without its log.
    pub role: String,
    pub plan_cpus: Option<CpuSet>,
    pub actual_cpus: CpuSet,
    pub last_cpu: u32,
    pub plan_nodes: Option<NodeSet>,
    /// The memory policy this thread reported through the pin log, as `mode[:nodes]`.
    pub policy: Option<String>,
    /// Actual affinity equals the plan and the last cpu lies in it (always true for unplanned rows
    /// and for `os` plans, whose sets are only where threads may run).
    pub ok: bool,
}

/// Plan vs actual at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub at_s: f64,
    pub rows: Vec<ThreadVerdict>,
    pub plan_memory: String,
    pub anon_bytes: BTreeMap<u32, u64>,
    pub memory_at_s: f64,
    pub memory_by: MemoryBy,
    pub expected_nodes: NodeSet,
    pub remote_share: f64,
    pub all_ok: bool,
}

/// Compares a sample with the plan. `log` maps tids to plan threads (from the pin library);
/// without it the lowest tid (the main thread) is thread 0 and other threads are unknown.
pub fn compare(plan: &Plan, sample: &Sample, log: &[PinLogEntry]) -> Comparison {
    let main_tid = sample.tasks.iter().map(|t| t.tid).min();
    let rows: Vec<ThreadVerdict> = sample
        .tasks
        .iter()
        .map(|t| {
            let entry = log.iter().rev().find(|e| e.tid == t.tid);
            let (index, role) = match entry {
                Some(e) => match e.role {
                    PinRole::Thread(i) => (Some(i), "plan"),
                    PinRole::Skip => (None, "skip"),
                    PinRole::Extra => (None, "extra"),
                },
                None if Some(t.tid) == main_tid => (Some(0), "plan"),
                None => (None, "unknown"),
            };
            let planned = index.and_then(|i| plan.threads.get(i));
            let ok = match planned {
                Some(p) if plan.pinned => t.cpus == p.cpus && p.cpus.contains(t.last_cpu),
                _ => true,
            };
            ThreadVerdict {
                tid: t.tid,
                name: t.name.clone(),
                index,
                role: role.into(),
                plan_cpus: planned.map(|p| p.cpus.clone()),
                actual_cpus: t.cpus.clone(),
                last_cpu: t.last_cpu,
                plan_nodes: planned.map(|p| p.nodes.clone()),
                policy: entry.and_then(|e| e.policy.clone()),
                ok,
            }
        })
        .collect();
    let expected = plan.expected_mem_nodes();
    Comparison {
        at_s: sample.at_s,
        all_ok: rows.iter().all(|r| r.ok),
        plan_memory: plan.memory.to_string(),
        remote_share: remote_share(&sample.anon_bytes, &expected),
        anon_bytes: sample.anon_bytes.clone(),
        memory_at_s: sample.memory_at_s,
        memory_by: sample.memory_by,
        expected_nodes: expected,
        rows,
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

impl Comparison {
    /// The human-readable table `loci run --verify` prints.
    pub fn render(&self, title: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "loci verify: {title} (+{:.2}s)", self.at_s);
        let w = self
            .rows
            .iter()
            .flat_map(|r| {
                [
                    r.plan_cpus
                        .as_ref()
                        .map(|c| c.to_string().len())
                        .unwrap_or(1),
                    r.actual_cpus.to_string().len(),
                ]
            })
            .max()
            .unwrap_or(4)
            .max(9);
        let _ = writeln!(
            s,
            "  {:>6}  {:>8}  {:<w$}  {:<w$}  {:>8}  {:<10}  {:<16}  ok",
            "thread", "tid", "plan cpus", "actual", "last cpu", "plan nodes", "policy"
        );
        for r in &self.rows {
            let idx = match r.index {
                Some(i) => i.to_string(),
                None => r.role.clone(),
            };
            let dash = || "-".to_string();
            let _ = writeln!(
                s,
                "  {:>6}  {:>8}  {:<w$}  {:<w$}  {:>8}  {:<10}  {:<16}  {}",
                idx,
                r.tid,
                r.plan_cpus
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_else(dash),
                r.actual_cpus.to_string(),
                r.last_cpu,
                r.plan_nodes
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_else(dash),
                r.policy.clone().unwrap_or_else(dash),
                if r.ok { "yes" } else { "NO" }
            );
        }
        let total: u64 = self.anon_bytes.values().sum();
        let per: Vec<String> = self
            .anon_bytes
            .iter()
            .map(|(n, b)| format!("node {n}: {}", mib(*b)))
            .collect();
        let read = match self.memory_by {
            MemoryBy::Poll => format!("read at +{:.2}s", self.memory_at_s),
            MemoryBy::ProgramAtExit => "read by the program at exit".into(),
        };
        let _ = writeln!(
            s,
            "  memory: plan {}; anonymous pages {} ({}); remote share {:.1}% (not on nodes {}); {read}",
            self.plan_memory,
            mib(total),
            if per.is_empty() {
                "none".into()
            } else {
                per.join(", ")
            },
            self.remote_share * 100.0,
            self.expected_nodes
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tloci-probe\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nThreads:\t3\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed:\t00000000,00000001\nMems_allowed_list:\t0\n";

    #[test]
    fn status_fields() {
        let s = parse_status(STATUS).unwrap();
        assert_eq!(s.name, "loci-probe");
        assert_eq!(s.cpus_allowed.to_string(), "0-1");
        assert_eq!(s.mems_allowed.to_string(), "0");
        assert_eq!(s.threads, 3);
        assert!(parse_status("Name:\tx\n").is_err());
        let e = parse_status("Cpus_allowed_list:\t0-x\n").unwrap_err();
        assert!(e.to_string().contains("0-x"), "{e}");
    }

    #[test]
    fn stat_processor_is_field_39_even_with_odd_names() {
        let t = "13817 (cat) R 13812 13812 6613 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 60998 3133440 394 18446744073709551615 93917498793984 93917498813865 140729706754000 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 93917498829872 93917498831488 93917727903744 140729706756788 140729706756808 140729706756808 140729706758123 0\n";
        let s = parse_stat(t).unwrap();
        assert_eq!(
            (s.tid, s.comm.as_str(), s.state, s.processor),
            (13817, "cat", 'R', 1)
        );
        let odd = t.replace("(cat)", "(a) b (c)");
        let s = parse_stat(&odd).unwrap();
        assert_eq!((s.comm.as_str(), s.processor), ("a) b (c", 1));
        assert!(parse_stat("12 (x) S 1 2").is_err());
        assert!(parse_stat("no parens").is_err());
    }

    #[test]
    fn numa_maps_counts() {
        let t = "55afa36a4000 default file=/usr/bin/cat mapped=2 N0=2 kernelpagesize_kB=4\n\
                 55afa4000000 default heap anon=300 dirty=300 N0=100 N1=200 kernelpagesize_kB=4\n\
                 7f0000000000 interleave:0-1 anon=4 dirty=4 N0=2 N1=2 kernelpagesize_kB=2048\n\
                 7ffd00000000 default stack anon=3 dirty=3 N1=3 kernelpagesize_kB=4\n";
        let m = parse_numa_maps(t).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].file.as_deref(), Some("/usr/bin/cat"));
        assert!(!m[0].anon && m[1].anon);
        assert_eq!(m[2].policy, "interleave:0-1");
        assert_eq!(m[2].page_kb, 2048);
        let per = anon_bytes_per_node(&m);
        assert_eq!(per[&0], 100 * 4096 + 2 * 2048 * 1024);
        assert_eq!(per[&1], 203 * 4096 + 2 * 2048 * 1024);
        let share = remote_share(&per, &NodeSet::single(0));
        assert!((share - per[&1] as f64 / (per[&0] + per[&1]) as f64).abs() < 1e-12);
        assert_eq!(remote_share(&BTreeMap::new(), &NodeSet::single(0)), 0.0);
        assert!(parse_numa_maps("zz default N0=1\n").is_err());
        assert!(parse_numa_maps("1000 default N0=x\n").is_err());
    }

    #[test]
    fn numa_maps_with_huge_counts_saturate_instead_of_wrapping() {
        // Found by the fuzz target proc_text: pages times page size overflowed (a panic with
        // overflow checks, a wrong byte count without).
        let m =
            parse_numa_maps("7f0000000005 interleave:0-1 anon=4 N0=203744114072970675\n").unwrap();
        let per = anon_bytes_per_node(&m);
        assert_eq!(per[&0], u64::MAX);
        let m = parse_numa_maps(&format!(
            "1000 default N0={0}\n2000 default N0={0} N1=1\n",
            u64::MAX
        ))
        .unwrap();
        let per = anon_bytes_per_node(&m);
        assert_eq!(per[&0], u64::MAX);
        let share = remote_share(&per, &NodeSet::single(1));
        assert!((share - 1.0).abs() < 1e-12, "{share}");
        // Two counts of one node on one line that add up beyond u64 (read while writing the
        // target): an error naming the token, not a wrap.
        let e = parse_numa_maps(&format!("1000 default N0={} N0=1\n", u64::MAX)).unwrap_err();
        assert!(e.to_string().contains("line 1: `N0=1`"), "{e}");
        let per = BTreeMap::from([(0, u64::MAX), (1, u64::MAX)]);
        assert_eq!(remote_share(&per, &NodeSet::single(0)), 0.5);
    }

    #[test]
    fn page_statuses_are_classified_efault_as_unknown() {
        assert_eq!(PageStatus::from_status(0), PageStatus::Node(0));
        assert_eq!(PageStatus::from_status(7), PageStatus::Node(7));
        assert_eq!(
            PageStatus::from_status(-libc::ENOENT),
            PageStatus::NotPresent
        );
        assert_eq!(PageStatus::from_status(-libc::EFAULT), PageStatus::Unknown);
        assert_eq!(
            PageStatus::from_status(-libc::EACCES),
            PageStatus::Error(libc::EACCES)
        );
        // Three pages on node 1, one on node 0, two unknown (AutoNUMA scanning), one missing.
        let f = -libc::EFAULT;
        let b = BufferPages::from_statuses(&[1, 1, f, 0, 1, f, -libc::ENOENT]);
        assert_eq!(b.per_node, BTreeMap::from([(0, 1), (1, 3)]));
        assert_eq!((b.unknown, b.not_present, b.pages()), (2, 1, 7));
        assert!(b.errors.is_empty());
        // Unknown pages are not remote: the share is over pages with a known node.
        assert_eq!(b.remote_share(&NodeSet::single(1)), 0.25);
        // Unknown pages neither fail nor pass a check; the known ones decide.
        let on1 = BufferPages::from_statuses(&[1, f, 1, f]);
        assert_eq!(on1.check_all_on(&NodeSet::single(1)), Ok(()));
        let e = on1.check_all_on(&NodeSet::single(0)).unwrap_err();
        assert!(e.contains("2 of unknown node (-EFAULT)"), "{e}");
        let e = BufferPages::from_statuses(&[f, f])
            .check_all_on(&NodeSet::single(1))
            .unwrap_err();
        assert!(
            e.contains("want all 2 on node(s) 1"),
            "nothing known proves nothing: {e}"
        );
        assert!(BufferPages::from_statuses(&[1, -libc::ENOENT])
            .check_all_on(&NodeSet::single(1))
            .is_err());
        assert!(BufferPages::from_statuses(&[1, -libc::EACCES])
            .check_all_on(&NodeSet::single(1))
            .is_err());
    }

    #[test]
    fn own_buffer_pages() {
        let ps = crate::sys::page_size();
        // Page-aligned 16 pages; touch only the first 8.
        let mut v = vec![0u8; 17 * ps];
        let off = v.as_ptr().align_offset(ps);
        let buf = &mut v[off..off + 16 * ps];
        // SAFETY: madvise(DONTNEED) on a private anonymous page range we own: pages read as zero
        // afterwards and are not present until touched again.
        unsafe { libc::madvise(buf.as_mut_ptr().cast(), buf.len(), libc::MADV_DONTNEED) };
        for p in 0..8 {
            buf[p * ps] = 1;
        }
        let b = buffer_pages(buf).unwrap();
        assert_eq!(b.per_node.values().sum::<usize>(), 8, "{b:?}");
        assert_eq!(b.not_present, 8, "{b:?}");
        let here: NodeSet = b.per_node.keys().copied().collect();
        assert_eq!(b.remote_share(&here), 0.0);
        assert_eq!(b.remote_share(&NodeSet::new()), 1.0);
    }

    #[test]
    fn samples_this_process() {
        let me = std::process::id() as i32;
        let s = sample(me, 0.0, true).unwrap();
        assert!(s.tasks.iter().any(|t| t.tid == me));
        let mine = s.tasks.iter().find(|t| t.tid == me).unwrap();
        assert!(mine.cpus.contains(mine.last_cpu));
        assert!(!s.anon_bytes.is_empty());
    }
}
