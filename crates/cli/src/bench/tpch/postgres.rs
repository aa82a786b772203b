//! A throwaway PostgreSQL cluster: `initdb` into a temporary directory, the server on a Unix
//! socket in that directory (no TCP), started (under `loci run`) and stopped by the harness.
//!
//! PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres` user of
//! the Debian package (`nobody` where there is none) and every server command runs through
//! `setpriv --reuid/--regid` (it execs, so the server stays the process `loci run` placed).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The port named in the socket file (`.s.PGSQL.5432`); nothing listens on TCP.
pub const PORT: &str = "5432";

/// The directory of the server programs of the newest PostgreSQL installed (Debian's
/// /usr/lib/postgresql/N/bin, else the directory of `postgres` on PATH).
fn bin_dir() -> anyhow::Result<PathBuf> {
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((v, bin))
        })
        .max();
    if let Some((_, bin)) = debian {
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|d| d.join("postgres").is_file() && d.join("initdb").is_file())
        .context(
            "PostgreSQL not found (no /usr/lib/postgresql/N/bin/postgres, no postgres and initdb on \
             PATH): run scripts/install-deps (Debian package postgresql)",
        )
}

/// The user the server runs as when we are root: (name, uid, gid).
fn server_user() -> anyhow::Result<Option<(String, u32, u32)>> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        let c = CString::new(name).expect("no NUL");
        // SAFETY: a NUL-terminated name; the result, when not null, points to a static passwd
        // that is read at once, before any other getpw* call.
        let pw = unsafe { libc::getpwnam(c.as_ptr()) };
        if !pw.is_null() {
            // SAFETY: checked non-null above.
            let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
            return Ok(Some((name.to_string(), uid, gid)));
        }
    }
    bail!("running as root, but neither user postgres nor nobody exists to run PostgreSQL as")
}

/// An initialised cluster in a temporary directory (removed on drop).
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    user: Option<(String, u32, u32)>,
    /// `-c` settings of every server start.
    settings: Vec<String>,
}

impl Cluster {
    /// `initdb` a new cluster; its servers get `cpus` parallel workers and memory settings sized
    /// to this machine's RAM.
    pub fn init(cpus: usize) -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        let user = server_user()?;
        let dir = tempfile::Builder::new()
            .prefix("loci-tpch-pg-")
            .tempdir()
            .context("creating the cluster's temporary directory")?;
        if let Some((_, uid, gid)) = &user {
            let p = CString::new(dir.path().as_os_str().as_encoded_bytes()).context("temp path")?;
            // SAFETY: a NUL-terminated path; chown only changes the owner.
            if unsafe { libc::chown(p.as_ptr(), *uid, *gid) } != 0 {
                bail!(
                    "chown {}: {}",
                    dir.path().display(),
                    std::io::Error::last_os_error()
                );
            }
        }
        let ram = ram_bytes();
        let mb = |b: u64| format!("{}MB", b >> 20);
        let settings = vec![
            "listen_addresses=".to_string(),
            format!("unix_socket_directories={}", dir.path().display()),
            format!("port={PORT}"),
            // A scratch copy of generated data: durability off, load and checkpoints fast.
            "fsync=off".into(),
            "synchronous_commit=off".into(),
            "full_page_writes=off".into(),
            "max_wal_size=8GB".into(),
            // Memory-resident like seed 002's runs: the buffer pool holds the database.
            format!("shared_buffers={}", mb(ram / 4)),
            format!("effective_cache_size={}", mb(ram / 2)),
            format!("work_mem={}", mb((ram / 64).clamp(64 << 20, 1 << 30))),
            format!(
                "maintenance_work_mem={}",
                mb((ram / 16).clamp(64 << 20, 2 << 30))
            ),
            // Parallel workers set to the cpus.
            format!("max_worker_processes={}", cpus + 8),
            format!("max_parallel_workers={cpus}"),
            format!("max_parallel_workers_per_gather={cpus}"),
            format!("max_parallel_maintenance_workers={cpus}"),
            // JIT compilation time dominates short queries and varies from run to run.
            "jit=off".into(),
        ];
        let c = Cluster {
            dir,
            bin,
            user,
            settings,
        };
        let out = c
            .as_server_user(&c.bin.join("initdb"))
            .arg("-D")
            .arg(c.data())
            .args([
                "--auth=trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-locale",
            ])
            .output()
            .context("running initdb")?;
        if !out.status.success() {
            bail!(
                "initdb failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(c)
    }

    /// The socket directory (also the cluster's root).
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server user, when we are root.
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|u| u.0.as_str())
    }

    /// The program `prog` run as the server user: `setpriv` to it when we are root.
    fn as_server_user(&self, prog: &Path) -> Command {
        self.server_user_argv(prog)
            .split_first()
            .map(|(p, rest)| {
                let mut c = Command::new(p);
                c.args(rest);
                c
            })
            .expect("argv has a program")
    }

    /// `[setpriv --reuid=U --regid=G --clear-groups --] prog`.
    fn server_user_argv(&self, prog: &Path) -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> = Vec::new();
        if let Some((_, uid, gid)) = &self.user {
            v.extend(
                [
                    "setpriv".to_string(),
                    format!("--reuid={uid}"),
                    format!("--regid={gid}"),
                    "--clear-groups".into(),
                    "--".into(),
                ]
                .map(Into::into),
            );
        }
        v.push(prog.into());
        v
    }

    /// Starts the server with `prefix` (e.g. `loci run ... --`) before it, and waits until it
    /// accepts connections.
    pub fn start(&self, prefix: &[std::ffi::OsString]) -> anyhow::Result<Server> {
        let mut argv: Vec<std::ffi::OsString> = prefix.to_vec();
        argv.extend(self.server_user_argv(&self.bin.join("postgres")));
        argv.push("-D".into());
        argv.push(self.data().into());
        for s in &self.settings {
            argv.push("-c".into());
            argv.push(s.into());
        }
        let log = self.dir.path().join("server.log");
        let logf = std::fs::File::create(&log).context("creating server.log")?;
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .with_context(|| format!("starting {:?}", argv))?;
        let mut server = Server {
            child,
            pid_file: self.data().join("postmaster.pid"),
            log,
        };
        let t0 = Instant::now();
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .arg("-q")
                .arg("-h")
                .arg(self.socket_dir())
                .args(["-p", PORT])
                .status()
                .context("running pg_isready")?;
            if ready.success() {
                return Ok(server);
            }
            if let Some(st) = server.child.try_wait()? {
                bail!("PostgreSQL exited at start ({st}): {}", server.log_tail());
            }
            if t0.elapsed() > Duration::from_secs(120) {
                bail!("PostgreSQL not ready after 120 s: {}", server.log_tail());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A running server (stopped on drop).
pub struct Server {
    child: Child,
    pid_file: PathBuf,
    log: PathBuf,
}

impl Server {
    fn log_tail(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// Fast shutdown (SIGINT to the postmaster) and wait for it and its wrapper to exit.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> anyhow::Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        let pid: Option<i32> = std::fs::read_to_string(&self.pid_file)
            .ok()
            .and_then(|t| t.lines().next()?.trim().parse().ok());
        match pid {
            // SAFETY: kill with a pid read from the server's own pid file.
            Some(pid) => unsafe {
                libc::kill(pid, libc::SIGINT);
            },
            None => self.child.kill()?,
        }
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Physical memory in bytes (`_SC_PHYS_PAGES` x page size; 4 GiB when unknown).
fn ram_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && size > 0 {
        pages as u64 * size as u64
    } else {
        4 << 30
    }
}
