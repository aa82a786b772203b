//! The contract between `loci run` and the pin library (`libloci_pin.so`, crate `crates/pin`):
//! environment variables in, a log file out. Shared here so both sides use one implementation.
//!
//! In (set by `loci run`, also usable by hand):
//! - `LOCI_PIN_CPUS`: one cpu list per plan thread, separated by `;` (`0;1;2-3`). Entry 0 is the
//!   main thread (pinned when the library loads), entry `k` the `k`-th pinned thread the program
//!   creates.
//! - `LOCI_PIN_SKIP`: a hex mask (`0x1`, likwid-pin's convention): bit `j` set means the `j`-th
//!   thread created (0 = the first `pthread_create` call) is a helper (an OpenMP or MPI progress
//!   thread, say) and does not consume a plan entry; it runs on the plan's whole footprint.
//! - `LOCI_PIN_LOG`: a file the library appends one line per thread to (format below).
//!
//! Threads created after the plan's last entry are *extra*: they run on the plan's footprint
//! (the union of all entries) instead of wrapping around onto an already used cpu.
//!
//! Out (`LOCI_PIN_LOG`), one line per thread, written with a single `write(2)` in append mode:
//! `pid=4242 tid=4243 thread=1 cpus=1 policy=bind:0` where `thread` is a plan index, `skip` or
//! `extra`, and `policy` is the thread's memory policy as `get_mempolicy(2)` reports it. When the
//! program ends through `exit(3)` (or returns from `main`), one more line gives its anonymous
//! memory per node as the process read it itself, at exit: `pid=4242 exit-anon=0:16384,1:33554432`
//! (`exit-anon=none` when it has no anonymous pages). A poller cannot take that reading: between
//! its last look and the exit the program may have touched any amount of memory.

use std::collections::BTreeMap;
use std::ffi::OsString;

use loci_topo::CpuSet;

/// Environment variable: per-thread cpu lists.
pub const ENV_CPUS: &str = "LOCI_PIN_CPUS";
/// Environment variable: skip mask (hex).
pub const ENV_SKIP: &str = "LOCI_PIN_SKIP";
/// Environment variable: log file path.
pub const ENV_LOG: &str = "LOCI_PIN_LOG";

/// Reads the text variable `name` ([`ENV_CPUS`], [`ENV_SKIP`]): `Ok(None)` when unset, an error
/// naming the variable when its value is not UTF-8 (never taken as unset).
pub fn text_var(name: &str) -> Result<Option<String>, String> {
    text_value(name, std::env::var_os(name))
}

/// [`text_var`] on a value already read.
pub fn text_value(name: &str, value: Option<OsString>) -> Result<Option<String>, String> {
    value
        .map(|v| {
            v.into_string().map_err(|v| {
                format!(
                    "{name}=`{}` is not valid UTF-8 (expected {})",
                    v.to_string_lossy(),
                    if name == ENV_SKIP {
                        "a hex mask such as 0x1"
                    } else {
                        "cpu lists separated by `;`, such as 0;2-3"
                    }
                )
            })
        })
        .transpose()
}

/// Encodes per-thread cpu sets for [`ENV_CPUS`].
pub fn encode_cpus(sets: &[CpuSet]) -> String {
    sets.iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(";")
}

/// Cpu ids [`decode_cpus`] accepts over all entries together: 16 Mi, 2,048 threads on every cpu
/// of an 8,192-cpu machine. Each id costs a few bytes, and a hand-written value of 128 KiB (the
/// kernel's limit for one environment string) made of full ranges (`0-65535;0-65535;...`) would
/// otherwise ask for gigabytes inside the program being pinned.
pub const MAX_PIN_IDS: usize = 1 << 24;

/// Decodes [`ENV_CPUS`]. Errors name the entry.
pub fn decode_cpus(s: &str) -> Result<Vec<CpuSet>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err(format!("{ENV_CPUS} is empty"));
    }
    let mut total = 0usize;
    s.split(';')
        .enumerate()
        .map(|(i, e)| {
            let set = CpuSet::parse(e).map_err(|err| format!("{ENV_CPUS} entry {i}: {err}"))?;
            total += set.len();
            if set.is_empty() {
                Err(format!("{ENV_CPUS} entry {i} is empty"))
            } else if total > MAX_PIN_IDS {
                Err(format!(
                    "{ENV_CPUS} names more than {MAX_PIN_IDS} cpu ids over its entries (reached at \
                     entry {i}); a plan needs one list per thread, each of the cpus that thread may use"
                ))
            } else {
                Ok(set)
            }
        })
        .collect()
}

/// Parses [`ENV_SKIP`]: hex with or without `0x`.
pub fn parse_skip(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let h = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u64::from_str_radix(h, 16)
        .map_err(|_| format!("{ENV_SKIP}=`{s}` is not a hex mask such as 0x1 (at most 64 bits)"))
}

/// What the pin library did with a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinRole {
    /// Plan thread with this index (0 = main).
    Thread(usize),
    /// A helper named in the skip mask.
    Skip,
    /// Beyond the plan's last entry.
    Extra,
}

/// Decides the role of each newly created thread, in creation order.
#[derive(Debug, Clone)]
pub struct Dealer {
    skip: u64,
    entries: usize,
    created: usize,
    next: usize,
}

impl Dealer {
    /// `entries`: plan threads including the main thread (entry 0, already used).
    pub fn new(entries: usize, skip: u64) -> Self {
        Self {
            skip,
            entries,
            created: 0,
            next: 1,
        }
    }
    /// The role of the next `pthread_create`.
    pub fn next_role(&mut self) -> PinRole {
        let j = self.created;
        self.created += 1;
        if j < 64 && self.skip >> j & 1 == 1 {
            return PinRole::Skip;
        }
        if self.next < self.entries {
            self.next += 1;
            PinRole::Thread(self.next - 1)
        } else {
            PinRole::Extra
        }
    }
}

/// One line of the pin log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinLogEntry {
    pub pid: i32,
    pub tid: i32,
    pub role: PinRole,
    pub cpus: CpuSet,
    /// `mode[:nodes]` as in plan JSON names (`bind:0`, `first-touch`).
    pub policy: Option<String>,
}

impl PinLogEntry {
    /// The log line, with a trailing newline.
    pub fn line(&self) -> String {
        let role = match self.role {
            PinRole::Thread(i) => i.to_string(),
            PinRole::Skip => "skip".into(),
            PinRole::Extra => "extra".into(),
        };
        let mut s = format!(
            "pid={} tid={} thread={} cpus={}",
            self.pid, self.tid, role, self.cpus
        );
        if let Some(p) = &self.policy {
            s.push_str(" policy=");
            s.push_str(p);
        }
        s.push('\n');
        s
    }
}

/// A process's anonymous memory per node (bytes), as it read `/proc/self/numa_maps` at exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitMemory {
    pub pid: i32,
    pub anon_bytes: BTreeMap<u32, u64>,
}

impl ExitMemory {
    /// The log line, with a trailing newline.
    pub fn line(&self) -> String {
        let per: Vec<String> = self
            .anon_bytes
            .iter()
            .map(|(n, b)| format!("{n}:{b}"))
            .collect();
        let per = if per.is_empty() {
            "none".to_string()
        } else {
            per.join(",")
        };
        format!("pid={} exit-anon={per}\n", self.pid)
    }
}

/// The pin log: one entry per thread the library bound, and the exit readings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PinLog {
    pub threads: Vec<PinLogEntry>,
    pub exits: Vec<ExitMemory>,
}

impl PinLog {
    /// Only the lines of process `pid` (a program's forked children log to the same file).
    pub fn of_pid(self, pid: i32) -> PinLog {
        PinLog {
            threads: self.threads.into_iter().filter(|e| e.pid == pid).collect(),
            exits: self.exits.into_iter().filter(|e| e.pid == pid).collect(),
        }
    }

    /// The log as the library writes it: thread lines, then exit lines.
    pub fn text(&self) -> String {
        self.threads
            .iter()
            .map(PinLogEntry::line)
            .chain(self.exits.iter().map(ExitMemory::line))
            .collect()
    }
}

fn parse_exit_anon(v: &str) -> Result<BTreeMap<u32, u64>, String> {
    let mut out = BTreeMap::new();
    if v == "none" {
        return Ok(out);
    }
    for part in v.split(',') {
        let (n, b) = part
            .split_once(':')
            .ok_or_else(|| format!("exit-anon entry `{part}` is not NODE:BYTES"))?;
        let n: u32 = n
            .parse()
            .map_err(|_| format!("exit-anon entry `{part}`: node `{n}` is not a number"))?;
        let b: u64 = b
            .parse()
            .map_err(|_| format!("exit-anon entry `{part}`: bytes `{b}` is not a number"))?;
        if out.insert(n, b).is_some() {
            return Err(format!("exit-anon names node {n} twice"));
        }
    }
    Ok(out)
}

/// Parses the pin log. Errors name the line and the bad field.
pub fn parse_log(text: &str) -> Result<PinLog, String> {
    let mut out = PinLog::default();
    for (ln, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |what: &str| format!("pin log line {}: {what}: `{line}`", ln + 1);
        let (mut pid, mut tid, mut role, mut cpus, mut policy) = (None, None, None, None, None);
        let mut exit_anon = None;
        for tok in line.split_whitespace() {
            let (k, v) = tok
                .split_once('=')
                .ok_or_else(|| bad("token without `=`"))?;
            match k {
                "pid" => pid = Some(v.parse().map_err(|_| bad("pid"))?),
                "exit-anon" => exit_anon = Some(parse_exit_anon(v).map_err(|e| bad(&e))?),
                "tid" => tid = Some(v.parse().map_err(|_| bad("tid"))?),
                "thread" => {
                    role = Some(match v {
                        "skip" => PinRole::Skip,
                        "extra" => PinRole::Extra,
                        n => PinRole::Thread(n.parse().map_err(|_| bad("thread"))?),
                    })
                }
                "cpus" => cpus = Some(CpuSet::parse(v).map_err(|e| bad(&e.to_string()))?),
                "policy" => policy = Some(v.to_string()),
                _ => {}
            }
        }
        if let Some(anon_bytes) = exit_anon {
            if tid.is_some() || role.is_some() || cpus.is_some() {
                return Err(bad("an exit-anon line names no thread"));
            }
            out.exits.push(ExitMemory {
                pid: pid.ok_or_else(|| bad("no pid"))?,
                anon_bytes,
            });
            continue;
        }
        out.threads.push(PinLogEntry {
            pid: pid.ok_or_else(|| bad("no pid"))?,
            tid: tid.ok_or_else(|| bad("no tid"))?,
            role: role.ok_or_else(|| bad("no thread"))?,
            cpus: cpus.ok_or_else(|| bad("no cpus"))?,
            policy,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_roundtrip_and_errors() {
        let sets = vec![
            CpuSet::parse("0").unwrap(),
            CpuSet::parse("2-3").unwrap(),
            CpuSet::parse("1,5").unwrap(),
        ];
        let e = encode_cpus(&sets);
        assert_eq!(e, "0;2-3;1,5");
        assert_eq!(decode_cpus(&e).unwrap(), sets);
        assert!(decode_cpus("0;;1").unwrap_err().contains("entry 1"));
        assert!(decode_cpus("0;x").unwrap_err().contains("entry 1"));
        assert!(decode_cpus("").is_err());
        // Full ranges repeated past the cap: refused at the entry that crosses it, before the
        // rest is parsed.
        let full = vec!["0-65535"; 300].join(";");
        let err = decode_cpus(&full).unwrap_err();
        assert!(
            err.contains("entry 256") && err.contains("16777216"),
            "{err}"
        );
        assert_eq!(
            decode_cpus(&vec!["0-65535"; 256].join(";")).unwrap().len(),
            256
        );
    }

    #[test]
    fn non_utf8_values_are_errors_naming_the_variable() {
        use std::os::unix::ffi::OsStringExt;
        assert_eq!(text_value(ENV_CPUS, None), Ok(None));
        assert_eq!(
            text_value(ENV_CPUS, Some("0;1".into())),
            Ok(Some("0;1".into()))
        );
        let bad = OsString::from_vec(b"0;\xff".to_vec());
        let e = text_value(ENV_CPUS, Some(bad.clone())).unwrap_err();
        assert!(
            e.starts_with("LOCI_PIN_CPUS=`0;\u{fffd}` is not valid UTF-8"),
            "{e}"
        );
        assert!(e.contains("0;2-3"), "{e}");
        let e = text_value(ENV_SKIP, Some(bad)).unwrap_err();
        assert!(e.starts_with("LOCI_PIN_SKIP=") && e.contains("0x1"), "{e}");
    }

    #[test]
    fn skip_mask() {
        assert_eq!(parse_skip("0x1").unwrap(), 1);
        assert_eq!(parse_skip("6").unwrap(), 6);
        assert_eq!(parse_skip("0XfF").unwrap(), 255);
        assert!(parse_skip("0xg").unwrap_err().contains("0xg"));
    }

    #[test]
    fn dealer_skips_and_extras() {
        // 3 entries (main + 2), skip the first created thread.
        let mut d = Dealer::new(3, 0x1);
        let roles: Vec<PinRole> = (0..5).map(|_| d.next_role()).collect();
        assert_eq!(
            roles,
            vec![
                PinRole::Skip,
                PinRole::Thread(1),
                PinRole::Thread(2),
                PinRole::Extra,
                PinRole::Extra
            ]
        );
        let mut d = Dealer::new(1, 0);
        assert_eq!(d.next_role(), PinRole::Extra);
    }

    #[test]
    fn log_roundtrip() {
        let e = PinLogEntry {
            pid: 10,
            tid: 11,
            role: PinRole::Thread(1),
            cpus: CpuSet::parse("1").unwrap(),
            policy: Some("bind:0".into()),
        };
        let s = e.line()
            + &PinLogEntry {
                role: PinRole::Skip,
                policy: None,
                ..e.clone()
            }
            .line();
        let exit = ExitMemory {
            pid: 10,
            anon_bytes: [(0, 16384), (1, 33554432)].into(),
        };
        let s = s + &exit.line();
        assert!(s.ends_with("pid=10 exit-anon=0:16384,1:33554432\n"), "{s}");
        let log = parse_log(&s).unwrap();
        let v = &log.threads;
        assert_eq!(v[0], e);
        assert_eq!(v[1].role, PinRole::Skip);
        assert_eq!(log.exits, vec![exit]);
        assert_eq!(parse_log(&log.text()).unwrap(), log);
        assert_eq!(log.clone().of_pid(11), PinLog::default());
        let none = parse_log("pid=3 exit-anon=none\n").unwrap();
        assert_eq!(none.exits[0].anon_bytes, BTreeMap::new());
        assert_eq!(none.exits[0].line(), "pid=3 exit-anon=none\n");
        for (text, want) in [
            ("pid=1 exit-anon=0:1,0:2", "node 0 twice"),
            ("pid=1 exit-anon=0", "`0` is not NODE:BYTES"),
            ("pid=1 exit-anon=x:1", "node `x`"),
            ("pid=1 exit-anon=0:-1", "bytes `-1`"),
            ("pid=1 tid=2 exit-anon=none", "names no thread"),
            ("exit-anon=none", "no pid"),
        ] {
            let e = parse_log(text).unwrap_err();
            assert!(e.contains(want) && e.contains("line 1"), "{text}: {e}");
        }
        assert!(parse_log("pid=1 tid=2 thread=x cpus=0\n")
            .unwrap_err()
            .contains("line 1"));
        assert!(parse_log("pid=1 thread=0 cpus=0\n")
            .unwrap_err()
            .contains("no tid"));
    }
}
