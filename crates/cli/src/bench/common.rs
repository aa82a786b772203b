//! Helpers the workloads share: the allocator table (`loci bench alloc` and the engine
//! workloads' `--alloc`), the counters of libloci_malloc.so, where `bench/peers` is, and CPU time
//! and peak RSS from `getrusage(2)`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// Allocators

/// One allocator: name, library file, Debian package, extra environment.
pub struct Allocator {
    pub name: &'static str,
    /// The system library preloaded for it (`None`: glibc, or loci's own library, found apart).
    pub lib: Option<&'static str>,
    pub package: &'static str,
    pub env: &'static [(&'static str, &'static str)],
}

/// Every allocator the benchmarks (and `loci run --alloc`) know. The ones with a [`Allocator::lib`] run under
/// `LD_PRELOAD` of that Debian library (found by [`find_system_lib`]).
pub const ALLOCATORS: [Allocator; 7] = [
    Allocator {
        name: "glibc",
        lib: None,
        package: "libc6",
        env: &[],
    },
    Allocator {
        name: "jemalloc",
        lib: Some("libjemalloc.so.2"),
        package: "libjemalloc2",
        env: &[],
    },
    Allocator {
        name: "tcmalloc",
        lib: Some("libtcmalloc_minimal.so.4"),
        package: "libtcmalloc-minimal4",
        env: &[],
    },
    Allocator {
        name: "tbbmalloc",
        lib: Some("libtbbmalloc_proxy.so.2"),
        package: "libtbbmalloc2",
        env: &[],
    },
    Allocator {
        name: "mimalloc",
        lib: Some("libmimalloc.so.2"),
        package: "libmimalloc2.0",
        env: &[],
    },
    Allocator {
        name: "loci",
        lib: None,
        package: "",
        env: &[],
    },
    Allocator {
        name: "loci-small-system",
        lib: None,
        package: "",
        env: &[("LOCI_ALLOC_SMALL", "system")],
    },
];

/// The allocator called `name`, if any.
pub fn allocator(name: &str) -> Option<&'static Allocator> {
    ALLOCATORS.iter().find(|a| a.name == name)
}

/// loci's own allocator library, found next to the `loci` binary, and the crate that builds it.
pub const LOCI_LIB: &str = "libloci_malloc.so";
pub const LOCI_CRATE: &str = "loci-alloc-preload";

/// The allocator this process runs on when it was started with one preloaded (`loci run
/// --alloc`, or `LD_PRELOAD` set by hand): the first library of `LD_PRELOAD` that is one of
/// [`ALLOCATORS`] or loci's own. `None`: glibc's malloc, or no library loci knows.
pub fn preloaded_allocator() -> Option<&'static str> {
    let list = std::env::var_os("LD_PRELOAD")?;
    let small = std::env::var("LOCI_ALLOC_SMALL").ok();
    allocator_in_preload(&list.to_string_lossy(), small.as_deref())
}

/// [`preloaded_allocator`] of an `LD_PRELOAD` value (entries separated by colons or spaces, as
/// ld.so reads them) and a `LOCI_ALLOC_SMALL` value.
fn allocator_in_preload(list: &str, small: Option<&str>) -> Option<&'static str> {
    list.split([':', ' '])
        .filter_map(|e| Path::new(e).file_name()?.to_str())
        .find_map(|file| {
            if file == LOCI_LIB {
                // loci's variants differ only by their environment (`loci-small-system`).
                let variant = ALLOCATORS.iter().find(|a| {
                    a.env
                        .iter()
                        .any(|&(k, v)| k == "LOCI_ALLOC_SMALL" && Some(v) == small)
                });
                Some(variant.map_or("loci", |a| a.name))
            } else {
                ALLOCATORS
                    .iter()
                    .find(|a| a.lib == Some(file))
                    .map(|a| a.name)
            }
        })
}

/// Where Debian installs shared libraries for this machine's architecture, in search order.
pub fn system_lib_dirs() -> [String; 5] {
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    [
        format!("/usr/lib/{triple}"),
        format!("/lib/{triple}"),
        "/usr/lib64".into(),
        "/usr/lib".into(),
        "/usr/local/lib".into(),
    ]
}

/// Where the Debian library `file` is installed, if it is.
pub fn find_system_lib(file: &str) -> Option<PathBuf> {
    system_lib_dirs()
        .iter()
        .map(|d| Path::new(d).join(file))
        .find(|p| p.exists())
}

// ---------------------------------------------------------------------------------------------
// The counters of libloci_malloc.so

/// The counters of libloci_malloc.so (`loci_alloc::COUNTERS`) when this process runs on it
/// (`None` otherwise), by name.
pub fn loci_alloc_stats() -> Option<BTreeMap<String, u64>> {
    // SAFETY: dlsym with a NUL-terminated name; the symbol, when present, has this signature.
    unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, c"loci_alloc_stats".as_ptr());
        if f.is_null() {
            return None;
        }
        let f: unsafe extern "C" fn(*mut u64, usize) -> usize = std::mem::transmute(f);
        let mut v = [0u64; loci_alloc::COUNTERS.len()];
        let n = f(v.as_mut_ptr(), v.len());
        Some(
            loci_alloc::COUNTERS
                .iter()
                .zip(&v[..n])
                .map(|(k, x)| (k.to_string(), *x))
                .collect(),
        )
    }
}

// ---------------------------------------------------------------------------------------------
// bench/peers

/// The repository's `bench/{dir}` directory holding `file` (a path relative to it): in the
/// source tree this binary was built from, else above the executable (it lives in
/// `target/<profile>/`), else under the current directory.
pub fn bench_dir(dir: &str, file: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut roots: Vec<&Path> = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .into_iter()
        .collect();
    roots.extend(exe.ancestors());
    let cwd = std::env::current_dir().unwrap_or_default();
    roots.push(&cwd);
    roots
        .into_iter()
        .map(|root| root.join("bench").join(dir))
        .find(|d| d.join(file).exists())
}

/// The repository's `bench/peers` directory holding `script` (`peers.py`, `subarray.py`); see
/// [`bench_dir`].
pub fn peers_dir(script: &str) -> Option<PathBuf> {
    bench_dir("peers", script)
}

/// The `bench/peers` directory (found by `script`, relative to it) after `bench/peers/setup
/// --{set}` made sure its venv has that set of peers (`tpch`, `dask`, ...).
pub fn peers_setup(set: &str, script: &str) -> anyhow::Result<PathBuf> {
    use anyhow::Context;
    let peers = peers_dir(script).with_context(|| {
        let shown = match script.strip_prefix("../") {
            Some(rest) => format!("bench/{rest}"),
            None => format!("bench/peers/{script}"),
        };
        format!("{shown} not found (run loci from the repository root)")
    })?;
    let st = std::process::Command::new(peers.join("setup"))
        .arg(format!("--{set}"))
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running bench/peers/setup --{set}"))?;
    if !st.success() {
        anyhow::bail!(
            "bench/peers/setup --{set} failed ({st}): it needs python3 with venv and PyPI access"
        );
    }
    Ok(peers)
}

// ---------------------------------------------------------------------------------------------
// getrusage

/// `getrusage(who)`, `None` when it fails.
fn rusage(who: i32) -> Option<libc::rusage> {
    // SAFETY: rusage is plain data and getrusage only writes it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    (unsafe { libc::getrusage(who, &mut u) } == 0).then_some(u)
}

/// User + system CPU seconds of this process (`RUSAGE_SELF`), of its waited-for children
/// (`RUSAGE_CHILDREN`) or of the calling thread (`RUSAGE_THREAD`); 0 when unreadable. A bench
/// that waits for one child at a time gets one child's CPU time as a difference of
/// `RUSAGE_CHILDREN` readings: steadier than wall time on a shared machine.
pub fn cpu_seconds(who: i32) -> f64 {
    let Some(u) = rusage(who) else {
        return 0.0;
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Peak RSS of this process in bytes (`ru_maxrss`); 0 when unreadable.
pub fn max_rss_bytes() -> u64 {
    rusage(libc::RUSAGE_SELF).map_or(0, |u| u.ru_maxrss as u64 * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preloaded_allocator_has_a_package() {
        for a in &ALLOCATORS {
            assert_eq!(allocator(a.name).map(|x| x.name), Some(a.name));
            assert!(a.lib.is_none() || !a.package.is_empty(), "{}", a.name);
        }
        assert!(allocator("nonesuch").is_none());
    }

    #[test]
    fn the_preloaded_allocator_is_the_first_known_library_of_ld_preload() {
        let f = allocator_in_preload;
        assert_eq!(f("", None), None);
        assert_eq!(
            f("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2", None),
            Some("mimalloc")
        );
        // loci run puts its pinning library first; it is not an allocator.
        assert_eq!(
            f(
                "/x/libloci_pin.so:/usr/lib/libjemalloc.so.2 /y/libtcmalloc_minimal.so.4",
                None
            ),
            Some("jemalloc")
        );
        assert_eq!(
            f("/x/libloci_pin.so /t/libloci_malloc.so", None),
            Some("loci")
        );
        assert_eq!(
            f("libloci_malloc.so", Some("system")),
            Some("loci-small-system")
        );
        assert_eq!(f("libloci_malloc.so", Some("other")), Some("loci"));
        assert_eq!(
            f("/x/libfoo.so:/x/libmimalloc.so", None),
            None,
            "unknown names are not guessed"
        );
    }

    #[test]
    fn rusage_reads() {
        assert!(max_rss_bytes() > 0);
        let t0 = cpu_seconds(libc::RUSAGE_THREAD);
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(cpu_seconds(libc::RUSAGE_THREAD) >= t0);
        assert!(peers_dir("peers.py").is_some_and(|d| d.ends_with("bench/peers")));
    }
}
