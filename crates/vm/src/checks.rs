//! The check-line protocol between a check program inside a VM and the test outside.
//!
//! Inside, a program prints one line per verified fact to stdout:
//!
//! ```text
//! LOCI-CHECK ok mem/bind/node1
//! LOCI-CHECK FAIL mem/interleave/all -- node 2 got 4100 pages, node 0 got 4092
//! ```
//!
//! ([`Checker`] does this for Rust; a shell script can `echo` the same lines.) Outside, [`CheckReport::parse`]
//! collects them and [`CheckReport::print_and_assert`] prints the per-topology report and fails the test when a check
//! failed, when none ran, or when the program crashed.

use std::fmt::{self, Display};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// Prefix of every check line.
pub const PREFIX: &str = "LOCI-CHECK";

/// Runs named checks inside the VM and prints one protocol line for each.
#[derive(Debug, Default)]
pub struct Checker {
    passed: usize,
    failed: usize,
}

impl Checker {
    /// A checker with nothing run yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` and prints its verdict. A panic inside `f` is caught and reported as a failure ("crashed: ...").
    pub fn check(&mut self, name: impl Display, f: impl FnOnce() -> Result<(), String>) {
        self.check_noted(name, || f().map(|()| String::new()));
    }

    /// [`check`](Self::check) for a check that measured something worth keeping in the test log: when it passes
    /// with a non-empty note, the line `# NAME: NOTE` follows its `ok` line (the report ignores `#` lines; a test
    /// can print them).
    pub fn check_noted(&mut self, name: impl Display, f: impl FnOnce() -> Result<String, String>) {
        let name = name.to_string().replace(char::is_whitespace, "_");
        let verdict = match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(p) => Err(format!(
                "crashed: {}",
                p.downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| p.downcast_ref::<&str>().copied())
                    .unwrap_or("panic")
            )),
        };
        match verdict {
            Ok(note) => {
                self.passed += 1;
                println!("{PREFIX} ok {name}");
                if !note.is_empty() {
                    println!("# {name}: {}", note.replace('\n', " | "));
                }
            }
            Err(why) => {
                self.failed += 1;
                println!("{PREFIX} FAIL {name} -- {}", why.replace('\n', " | "));
            }
        }
    }

    /// Checks passed so far.
    pub fn passed(&self) -> usize {
        self.passed
    }

    /// Checks failed so far.
    pub fn failed(&self) -> usize {
        self.failed
    }

    /// Exit status for the check program: 0 when every check passed and at least one ran, else 1.
    pub fn exit_code(&self) -> i32 {
        if self.failed == 0 && self.passed > 0 {
            0
        } else {
            1
        }
    }
}

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub name: String,
    pub passed: bool,
    /// Why it failed (empty when it passed).
    pub detail: String,
}

/// The checks of one VM run.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub topology: String,
    pub results: Vec<CheckResult>,
    /// Exit status of the check program.
    pub status: i32,
    /// The program's stderr (shown when something failed).
    pub stderr: String,
    /// Lines that look like check lines but do not parse (protocol errors count as failures).
    pub malformed: Vec<String>,
    /// Boot + run + power-off wall time.
    pub elapsed: Option<Duration>,
}

impl CheckReport {
    /// Collects the check lines of `stdout`; other lines are ignored.
    pub fn parse(topology: &str, stdout: &str, status: i32, stderr: &str) -> Self {
        let mut results = Vec::new();
        let mut malformed = Vec::new();
        for line in stdout.lines() {
            let Some(rest) = line.strip_prefix(PREFIX) else {
                continue;
            };
            let rest = rest.trim_start();
            if let Some(name) = rest.strip_prefix("ok ") {
                results.push(CheckResult {
                    name: name.trim().to_string(),
                    passed: true,
                    detail: String::new(),
                });
            } else if let Some(r) = rest.strip_prefix("FAIL ") {
                let (name, detail) = r.split_once(" -- ").unwrap_or((r, ""));
                results.push(CheckResult {
                    name: name.trim().to_string(),
                    passed: false,
                    detail: detail.trim().to_string(),
                });
            } else {
                malformed.push(line.to_string());
            }
        }
        CheckReport {
            topology: topology.to_string(),
            results,
            status,
            stderr: stderr.to_string(),
            malformed,
            elapsed: None,
        }
    }

    /// Adds the VM's wall time to the report line.
    pub fn with_elapsed(mut self, d: Duration) -> Self {
        self.elapsed = Some(d);
        self
    }

    /// Number of checks that passed.
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.passed).count()
    }

    /// Number of checks that failed.
    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }

    /// True when at least one check ran, none failed, no line was malformed and the program exited 0.
    pub fn ok(&self) -> bool {
        !self.results.is_empty()
            && self.failed() == 0
            && self.malformed.is_empty()
            && self.status == 0
    }

    /// Names of the checks that ran.
    pub fn names(&self) -> Vec<&str> {
        self.results.iter().map(|r| r.name.as_str()).collect()
    }

    /// Prints the report (summary line, then the failures) to stdout and panics when not [`ok`](Self::ok).
    #[track_caller]
    pub fn print_and_assert(&self) {
        println!("{self}");
        if !self.ok() {
            panic!("NUMA VM {}: checks failed (report above)", self.topology);
        }
    }
}

impl Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VM {}: {} checks, {} passed, {} failed",
            self.topology,
            self.results.len(),
            self.passed(),
            self.failed()
        )?;
        if let Some(e) = self.elapsed {
            write!(f, " ({:.1} s boot+run+power-off)", e.as_secs_f64())?;
        }
        for r in self.results.iter().filter(|r| !r.passed) {
            write!(f, "\n  FAIL {}: {}", r.name, r.detail)?;
        }
        for m in &self.malformed {
            write!(f, "\n  malformed check line: {m}")?;
        }
        if self.results.is_empty() {
            write!(f, "\n  no check ran")?;
        }
        if self.status != 0 {
            write!(f, "\n  check program exited {}", self.status)?;
            let t: Vec<&str> = self.stderr.lines().collect();
            for l in &t[t.len().saturating_sub(15)..] {
                write!(f, "\n  stderr: {l}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ok_fail_and_malformed_lines() {
        let out =
            "hello\nLOCI-CHECK ok a/b\nLOCI-CHECK FAIL c -- node 2: 5 pages\nLOCI-CHECK maybe x\n";
        let r = CheckReport::parse("2n", out, 1, "boom");
        assert_eq!(r.names(), ["a/b", "c"]);
        assert_eq!(r.passed(), 1);
        assert_eq!(r.failed(), 1);
        assert_eq!(r.results[1].detail, "node 2: 5 pages");
        assert_eq!(r.malformed, ["LOCI-CHECK maybe x"]);
        assert!(!r.ok());
        let s = r.to_string();
        assert!(s.starts_with("VM 2n: 2 checks, 1 passed, 1 failed"), "{s}");
        assert!(
            s.contains("FAIL c: node 2: 5 pages") && s.contains("stderr: boom"),
            "{s}"
        );
    }

    #[test]
    fn no_checks_or_nonzero_exit_is_not_ok() {
        assert!(!CheckReport::parse("4n", "", 0, "").ok());
        assert!(!CheckReport::parse("4n", "LOCI-CHECK ok a\n", 101, "").ok());
        assert!(CheckReport::parse("4n", "LOCI-CHECK ok a\n", 0, "").ok());
    }

    #[test]
    fn checker_counts_and_catches_panics() {
        let mut c = Checker::new();
        c.check("fine", || Ok(()));
        c.check("bad", || Err("because".into()));
        c.check("crash", || panic!("oops"));
        assert_eq!((c.passed(), c.failed(), c.exit_code()), (1, 2, 1));
        c.check_noted("noted", || Ok("ratio 1.000".into()));
        c.check_noted("noted/bad", || Err("ratio 0.5".into()));
        assert_eq!((c.passed(), c.failed()), (2, 3));
    }
}
