//! The PostgreSQL cluster of a scale factor: `initdb` into a cache directory, loaded once and
//! reused by later invocations (loading SF 1 takes minutes, a session of the 22 queries well under
//! one), the server on a Unix socket in that directory (no TCP), started (under `loci run`) and
//! stopped by the harness.
//!
//! The cache is `/var/tmp/loci-tpch-postgres-UID/sfS` (under /var/tmp because, as root, the
//! server user cannot reach root's home). `loaded.json` there names what was loaded (the scale
//! factor, the server programs, the Parquet files' sizes and times, the driver's hash); a cluster
//! is reused only when all of it matches, and is written only after a load that finished and a
//! clean shutdown. An exclusive lock (`sfS.lock`, flock) keeps two invocations off one cluster.
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

/// An initialised cluster in its cache directory, locked for this process while it lives.
pub struct Cluster {
    dir: PathBuf,
    /// Held open for the flock; released when dropped.
    _lock: std::fs::File,
    /// Whether the tables are already loaded (a reused cluster).
    loaded: bool,
    /// What a load into this cluster holds (written to `loaded.json` by `mark_loaded`).
    key: serde_json::Value,
    bin: PathBuf,
    user: Option<(String, u32, u32)>,
    /// `-c` settings of every server start.
    settings: Vec<String>,
}

impl Cluster {
    /// The cluster of scale factor `sf` for the Parquet tables in `data`, loaded by the driver
    /// script `driver`: the cached one when what it holds matches (and `reload` is false), else
    /// a new one from `initdb` ([`Cluster::loaded`] tells which). Its servers get `cpus`
    /// parallel workers and memory settings sized to this machine's RAM.
    pub fn open(
        sf: &str,
        data: &Path,
        driver: &Path,
        reload: bool,
        cpus: usize,
    ) -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        let user = server_user()?;
        let key = load_key(sf, &bin, data, driver)?;
        // SAFETY: getuid has no preconditions.
        let root = PathBuf::from(format!("/var/tmp/loci-tpch-postgres-{}", unsafe {
            libc::getuid()
        }));
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let lock = lock(&root.join(format!("sf{sf}.lock")))?;
        let dir = root.join(format!("sf{sf}"));
        let key_file = dir.join(LOADED);
        let cached = std::fs::read(&key_file)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        let loaded = !reload && cached.as_ref() == Some(&key);
        if loaded {
            eprintln!(
                "PostgreSQL sf {sf}: reusing the loaded cluster in {} (--reload loads it anew)",
                dir.display()
            );
        } else {
            if dir.exists() {
                std::fs::remove_dir_all(&dir)
                    .with_context(|| format!("removing the stale cluster {}", dir.display()))?;
            }
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            if let Some((_, uid, gid)) = &user {
                let p = CString::new(dir.as_os_str().as_encoded_bytes()).context("cache path")?;
                // SAFETY: a NUL-terminated path; chown only changes the owner.
                if unsafe { libc::chown(p.as_ptr(), *uid, *gid) } != 0 {
                    bail!(
                        "chown {}: {}",
                        dir.display(),
                        std::io::Error::last_os_error()
                    );
                }
            }
        }
        let ram = ram_bytes();
        let mb = |b: u64| format!("{}MB", b >> 20);
        let settings = vec![
            "listen_addresses=".to_string(),
            format!("unix_socket_directories={}", dir.display()),
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
            _lock: lock,
            loaded,
            key,
            bin,
            user,
            settings,
        };
        if loaded {
            return Ok(c);
        }
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

    /// Whether the tables were loaded by an earlier invocation.
    pub fn loaded(&self) -> bool {
        self.loaded
    }

    /// Records that the load finished (call after the loading server stopped cleanly), so later
    /// invocations that would load the same reuse the cluster.
    pub fn mark_loaded(&mut self) -> anyhow::Result<()> {
        let p = self.dir.join(LOADED);
        std::fs::write(&p, serde_json::to_vec_pretty(&self.key)?)
            .with_context(|| format!("writing {}", p.display()))?;
        self.loaded = true;
        Ok(())
    }

    /// The socket directory (also the cluster's root).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
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
        let log = self.dir.join("server.log");
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
                bail!(
                    "PostgreSQL exited at start ({st}){}: {}",
                    match self.loaded {
                        true => " from the cached cluster (--reload loads it anew)",
                        false => "",
                    },
                    server.log_tail()
                );
            }
            if t0.elapsed() > Duration::from_secs(120) {
                bail!("PostgreSQL not ready after 120 s: {}", server.log_tail());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The file in a cluster's directory that says what was loaded into it.
const LOADED: &str = "loaded.json";

/// What a load holds: the scale factor, the server programs, each table file's size and
/// modification time, and the driver's hash (its schema, load and indexes).
fn load_key(sf: &str, bin: &Path, data: &Path, driver: &Path) -> anyhow::Result<serde_json::Value> {
    let mut tables = serde_json::Map::new();
    for t in super::data::TABLES {
        let p = data.join(format!("{t}.parquet"));
        let m = std::fs::metadata(&p).with_context(|| format!("reading {}", p.display()))?;
        let mtime = m
            .modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        tables.insert(t.into(), serde_json::json!([m.len(), mtime.to_string()]));
    }
    let script = std::fs::read(driver).with_context(|| format!("reading {}", driver.display()))?;
    Ok(serde_json::json!({
        "sf": sf,
        "server": bin.display().to_string(),
        "tables": tables,
        "driver_blake3": blake3::hash(&script).to_hex().to_string(),
    }))
}

/// `path` opened and locked exclusively (flock), waiting, with a note, while another process
/// holds it.
fn lock(path: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; it only takes an advisory lock.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!(
            "PostgreSQL: waiting for the other loci process that holds {}",
            path.display()
        );
        // SAFETY: as above, blocking this time.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "locking {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(f)
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
