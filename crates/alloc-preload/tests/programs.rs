//! Real programs on libloci_malloc.so via LD_PRELOAD: python3, the sqlite3 shell, sort, and a C
//! program exercising the whole C ABI (also under valgrind memcheck). Each output is compared
//! with the same program on glibc's malloc.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The library, built by cargo next to this test binary (target/<profile>/libloci_malloc.so).
/// `cargo test` does not build a cdylib for integration tests, so the first call builds it
/// (a no-op when `cargo build` already did).
fn lib() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "-q", "-p", "loci-alloc-preload"]);
            if !cfg!(debug_assertions) {
                cmd.arg("--release");
            }
            cmd.env("CARGO_TARGET_DIR", dir.parent().unwrap());
            let st = cmd.status().unwrap();
            assert!(st.success(), "building libloci_malloc.so failed");
            let p = dir.join("libloci_malloc.so");
            assert!(p.exists(), "{} missing after the build", p.display());
            p
        })
        .clone()
}

fn tool(name: &str, package: &str) -> PathBuf {
    for d in ["/usr/bin", "/bin", "/usr/local/bin"] {
        let p = Path::new(d).join(name);
        if p.exists() {
            return p;
        }
    }
    // `which` for tools installed elsewhere (pyenv shims, ...)
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        !s.is_empty(),
        "{name} not found: install the Debian package {package} (scripts/install-deps)"
    );
    PathBuf::from(s)
}

fn run(cmd: &mut Command, preload: bool) -> Output {
    if preload {
        cmd.env("LD_PRELOAD", lib());
    } else {
        cmd.env_remove("LD_PRELOAD");
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} (preload {preload}) failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("loci-alloc-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn python3_runs_a_script_on_loci() {
    let script = r#"
import ctypes, json, threading, hashlib
assert ctypes.CDLL(None).loci_alloc_task_finished, "not on loci"
d = {i: str(i) * (i % 50) for i in range(200000)}
out = []
def work(k):
    acc = [bytearray(1000 + 97 * j % 300000) for j in range(300)]
    out.append(sum(len(a) for a in acc) + k)
ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
for t in ts: t.start()
for t in ts: t.join()
s = json.dumps(d)
print(len(s), hashlib.sha256(s.encode()).hexdigest(), sorted(out))
"#;
    let py = tool("python3", "python3");
    let base = run(
        Command::new(&py)
            .arg("-c")
            .arg(script.replace("assert ctypes", "#")),
        false,
    );
    let loci = run(Command::new(&py).arg("-c").arg(script), true);
    assert_eq!(
        String::from_utf8_lossy(&loci.stdout),
        String::from_utf8_lossy(&base.stdout)
    );
}

#[test]
fn sqlite3_shell_on_a_generated_table() {
    let sql = "create table t(a integer, b text, c real);
with recursive n(x) as (select 1 union all select x + 1 from n where x < 300000)
insert into t select x, printf('%08x-%s', (x * 2654435761) % 4294967296, substr('abcdefghij', 1 + x % 10)), x * 0.5 from n;
create index tb on t(b);
select count(*), sum(a), sum(c), min(b), max(b) from t;
select count(*) from t where b like 'a%';
select b, count(*) from t group by substr(b, 10) order by 2 desc limit 3;
delete from t where a % 3 = 0; vacuum;
select count(*), total(length(b)) from t;";
    let sq = tool("sqlite3", "sqlite3");
    let base = run(Command::new(&sq).arg(":memory:").arg(sql), false);
    let loci = run(Command::new(&sq).arg(":memory:").arg(sql), true);
    assert!(!base.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&loci.stdout),
        String::from_utf8_lossy(&base.stdout)
    );
}

#[test]
fn sort_of_a_large_file() {
    let d = tmpdir("sort");
    let input = d.join("in.txt");
    // 3M lines (~40 MB), deterministic pseudo-random keys
    let mut text = String::with_capacity(45 << 20);
    let mut x: u64 = 88172645463325252;
    for i in 0..3_000_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(&format!("{:016x} {}\n", x, i % 1000));
    }
    std::fs::write(&input, text).unwrap();
    let sort = tool("sort", "coreutils");
    let args = ["--parallel=2", "-S", "64M", "-T"];
    let base = run(Command::new(&sort).args(args).arg(&d).arg(&input), false);
    let loci = run(Command::new(&sort).args(args).arg(&d).arg(&input), true);
    assert_eq!(base.stdout.len(), loci.stdout.len());
    assert!(base.stdout == loci.stdout, "sort output differs on loci");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The C-ABI test program, compiled once per test process: the two tests that run it would
/// otherwise write the same file while the other executes it (`Text file busy`).
fn build_cabi() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let d = tmpdir("cabi");
            let exe = d.join("cabi");
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cabi.c");
            // cc: the C compiler Rust links with.
            let mut cc = Command::new("cc");
            cc.args(["-O1", "-g", "-pthread", "-o"])
                .arg(&exe)
                .arg(src)
                .arg("-ldl");
            run(&mut cc, false);
            exe
        })
        .clone()
}

#[test]
fn c_abi_program() {
    let exe = build_cabi();
    let out = run(&mut Command::new(&exe), true);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "cabi ok\n");
    // and without the preload it refuses (the check that it really ran on loci)
    let plain = Command::new(&exe)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(!plain.status.success());
}

#[test]
fn c_abi_program_under_valgrind_memcheck() {
    let exe = build_cabi();
    let vg = tool("valgrind", "valgrind");
    let mut memcheck = Command::new(vg);
    memcheck
        .args(["--tool=memcheck", "--error-exitcode=99", "-q"])
        // replace malloc only inside libc (so glibc, the small-block delegate, is checked), not ours
        .arg("--soname-synonyms=somalloc=nouserintercepts")
        .arg(&exe);
    let out = run(&mut memcheck, true);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "cabi ok\n");
}

/// A bad setting is named with its valid range on stderr and the default is used: the program
/// still runs. A size suffix is not a count.
#[test]
fn bad_settings_are_named_and_the_program_runs() {
    for (var, value, says) in [
        ("LOCI_ALLOC_CACHE", "8K", "from 0 to 1048576; using 8"),
        ("LOCI_ALLOC_CACHE", "2000000", "from 0 to 1048576; using 8"),
        ("LOCI_ALLOC_SUPERBLOCK", "1K", "between 2M and 64M"),
    ] {
        // `ls` allocates, which is when the settings are read.
        let out = run(Command::new("ls").arg("/").env(var, value), true);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{var}={value}")) && err.contains(says),
            "{var}={value}: {err}"
        );
    }
    let out = run(
        Command::new("ls").arg("/").env("LOCI_ALLOC_CACHE", "16"),
        true,
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// bench/alloc/paired.c (scripts/alloc-paired), the in-process paired comparison: it opens
/// libloci_malloc.so late, beside glibc's allocator, runs both on seed 002's loop and prints a
/// ratio for each against the first; a malformed library argument is refused with the usage.
#[test]
fn paired_harness_runs_loci_beside_glibc_in_one_process() {
    let d = tmpdir("paired");
    let exe = d.join("paired");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/alloc/paired.c");
    let mut cc = Command::new("cc");
    cc.args(["-O2", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&exe)
        .arg(src)
        .arg("-ldl");
    run(&mut cc, false);
    let loci = format!("{}:malloc:free", lib().display());
    let out = run(
        Command::new(&exe)
            .args(["-r", "5", "-n", "20000", "-s", "12", "-t", "2"])
            .args([loci.as_str(), "libc.so.6:__libc_malloc:__libc_free"]),
        false,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("time vs first"))
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(
        rows[0].contains("libloci_malloc.so") && rows[0].contains("time vs first: 1.000"),
        "{text}"
    );
    assert!(rows[1].starts_with("libc.so.6"), "{text}");
    let bad = Command::new(&exe)
        .arg("libc.so.6:__libc_malloc")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not LIB:MALLOC:FREE"));
}
