//! The pure parsers of what the kernel writes under `/sys` and `/proc`: each takes the text of
//! one file (already cleaned of trailing NULs and white space by the reader) and is unit-tested
//! on literal text, and fuzzed (`fuzz/`).

use crate::model::CacheKind;

/// `MemTotal` and `MemFree` in bytes from a node `meminfo` (`Node 0 MemTotal:  8386704 kB`) or
/// from `/proc/meminfo` (`MemTotal:  8386704 kB`).
pub fn parse_meminfo(text: &str) -> Result<(Option<u64>, Option<u64>), String> {
    let mut total = None;
    let mut free = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let key = key.split_whitespace().last().unwrap_or("");
        let slot = match key {
            "MemTotal" => &mut total,
            "MemFree" => &mut free,
            _ => continue,
        };
        let mut it = value.split_whitespace();
        let num: u64 = it
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("bad {key} line `{}`", line.trim()))?;
        let mult = match it.next() {
            None => 1,
            Some(u) if u.eq_ignore_ascii_case("kb") => 1024,
            Some(u) => {
                return Err(format!(
                    "unknown unit `{u}` in {key} line `{}`",
                    line.trim()
                ))
            }
        };
        *slot = Some(
            num.checked_mul(mult)
                .ok_or_else(|| format!("{key} line `{}` is beyond 2^64 bytes", line.trim()))?,
        );
    }
    Ok((total, free))
}

/// One row of a node `distance` file: `10 20 20 20`.
pub fn parse_distance_row(text: &str) -> Result<Vec<u32>, String> {
    text.split_whitespace()
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| format!("`{t}` is not a distance (expected integers like `10 20`)"))
        })
        .collect()
}

/// A size in bytes: `32K`, `8M`, `16G`, `1T` (binary units, either case) or plain bytes. The
/// one size syntax of loci: a cache `size` file, a synthetic machine's `mem`, the probe's
/// `--alloc`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        Some((i, 'T' | 't')) => (&t[..i], 40),
        _ => (t, 0),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| {
            format!(
                "`{t}` is not a size (expected e.g. `32K`, `8M`, `16G`, `1T` or bytes, below 2^64)"
            )
        })
}

/// A cache `type` file: `Data`, `Instruction` or `Unified`.
pub fn parse_cache_type(text: &str) -> Result<CacheKind, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "data" => Ok(CacheKind::Data),
        "instruction" => Ok(CacheKind::Instruction),
        "unified" => Ok(CacheKind::Unified),
        other => Err(format!(
            "unknown cache type `{other}` (valid: Data, Instruction, Unified)"
        )),
    }
}

/// A file holding one integer (`core_id`, `numa_node`, `level`, ...). May be negative (-1).
pub fn parse_int(text: &str) -> Result<i64, String> {
    let t = text.trim();
    t.parse::<i64>()
        .map_err(|_| format!("`{t}` is not an integer"))
}

/// A line `Key:\tvalue` of `/proc/PID/status`, e.g. `Mems_allowed_list`.
pub fn status_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// The process's cgroup paths, from `/proc/self/cgroup`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupPaths {
    /// The unified (v2) hierarchy's path, from the `0::PATH` line.
    pub v2: Option<String>,
    /// The v1 cpuset hierarchy's path, from a `N:...cpuset...:PATH` line.
    pub v1_cpuset: Option<String>,
}

/// Parses `/proc/self/cgroup` (`hierarchy-id:controllers:path` per line).
pub fn parse_proc_cgroup(text: &str) -> CgroupPaths {
    let mut out = CgroupPaths::default();
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            out.v2 = Some(path.to_string());
        } else if ctrls.split(',').any(|c| c == "cpuset") {
            out.v1_cpuset = Some(path.to_string());
        }
    }
    out
}

/// One line of `/proc/self/mountinfo`, the fields loci needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The path inside the filesystem that is mounted (for cgroups: the cgroup the mount shows).
    pub root: String,
    pub mount_point: String,
    pub fs_type: String,
    pub super_options: String,
}

/// Parses `/proc/self/mountinfo` (see proc(5)): `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3
/// /dev/root rw,errors=continue`. Octal escapes (`\040` for a space) are decoded.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 5 || fields.len() < sep + 3 {
            continue;
        }
        out.push(Mount {
            root: unescape_octal(fields[3]),
            mount_point: unescape_octal(fields[4]),
            fs_type: fields[sep + 1].to_string(),
            super_options: fields.get(sep + 3).unwrap_or(&"").to_string(),
        });
    }
    out
}

/// Decodes the octal escapes (`\040` for a space) of mount tables.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |a, c| a * 8 + (c - b'0') as u32);
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `/proc/mounts` (`DEVICE MOUNTPOINT TYPE OPTIONS 0 0`), the older sibling of
/// `mountinfo` that captured trees and old kernels may have alone. The mounted path inside the
/// filesystem is not given there, so `root` is `/`.
pub fn parse_proc_mounts(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() >= 4).then(|| Mount {
                root: "/".into(),
                mount_point: unescape_octal(f[1]),
                fs_type: f[2].to_string(),
                super_options: f[3].to_string(),
            })
        })
        .collect()
}

/// The NUMA node of a GPU's memory from NVIDIA's `/proc/driver/nvidia/gpus/BUS/numa_status`
/// (`Node:      250` on its first line); `None` when the GPU's memory is not a NUMA node (`-1`)
/// or the text has no `Node:` line.
pub fn parse_numa_status(text: &str) -> Option<u32> {
    let v = status_field(text, "Node")?;
    v.parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn meminfo_node_and_proc() {
        let node = "\nNode 0 MemTotal:      8386704 kB\nNode 0 MemFree:       6895672 kB\nNode 0 MemUsed:       1491032 kB\n";
        assert_eq!(
            parse_meminfo(node).unwrap(),
            (Some(8386704 * 1024), Some(6895672 * 1024))
        );
        let proc =
            "MemTotal:       24570740 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(
            parse_meminfo(proc).unwrap(),
            (Some(24570740 * 1024), Some(1000 * 1024))
        );
        assert_eq!(
            parse_meminfo("Node 3 Active: 5 kB\n").unwrap(),
            (None, None)
        );
        let err = parse_meminfo("Node 0 MemTotal: lots kB").unwrap_err();
        assert!(err.contains("MemTotal"), "{err}");
        let err = parse_meminfo("Node 0 MemTotal: 5 MB").unwrap_err();
        assert!(err.contains("unit `MB`"), "{err}");
    }

    #[test]
    fn distance_rows() {
        assert_eq!(
            parse_distance_row("10 20 20 20\n").unwrap(),
            vec![10, 20, 20, 20]
        );
        assert_eq!(parse_distance_row("10").unwrap(), vec![10]);
        let err = parse_distance_row("10 2x").unwrap_err();
        assert!(err.contains("`2x`"), "{err}");
    }

    #[test]
    fn cache_sizes_and_types() {
        for (text, bytes) in [
            ("32K\n", 32 << 10),
            ("32768K", 32 << 20),
            ("8M", 8 << 20),
            ("512m", 512 << 20),
            ("16G", 16 << 30),
            ("1T", 1 << 40),
            ("4096", 4096),
        ] {
            assert_eq!(parse_size(text).unwrap(), bytes, "{text:?}");
        }
        assert!(parse_size("K").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("é").is_err());
        assert!(parse_size("12Q").unwrap_err().contains("`12Q`"));
        // Found by the sysfs_text fuzz target: the unit multiplication overflowed.
        assert!(parse_size("18446744073709551615m").is_err());
        assert!(parse_meminfo("MemTotal: 18446744073709551615 kB").is_err());
        assert_eq!(parse_cache_type("Data\n").unwrap(), CacheKind::Data);
        assert_eq!(
            parse_cache_type("Instruction").unwrap(),
            CacheKind::Instruction
        );
        assert_eq!(parse_cache_type("Unified").unwrap(), CacheKind::Unified);
        assert!(parse_cache_type("Trace").unwrap_err().contains("valid"));
    }

    #[test]
    fn ints() {
        assert_eq!(parse_int("-1\n").unwrap(), -1);
        assert_eq!(parse_int(" 7 ").unwrap(), 7);
        assert!(parse_int("x").unwrap_err().contains("`x`"));
    }

    #[test]
    fn status_fields() {
        let s = "Name:\tcat\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n";
        assert_eq!(status_field(s, "Cpus_allowed_list"), Some("0-1"));
        assert_eq!(status_field(s, "Mems_allowed_list"), Some("0"));
        assert_eq!(status_field(s, "Nope"), None);
    }

    #[test]
    fn proc_cgroup_v1_and_v2() {
        let v1 = "9:name=systemd:/\n4:memory:/process_api/36c1\n3:cpuset:/jobs/42\n2:cpu,cpuacct:/\n0::/\n";
        let cg = parse_proc_cgroup(v1);
        assert_eq!(cg.v1_cpuset.as_deref(), Some("/jobs/42"));
        assert_eq!(cg.v2.as_deref(), Some("/"));
        let v2 = "0::/user.slice/user-1000.slice/session-2.scope\n";
        let cg = parse_proc_cgroup(v2);
        assert_eq!(cg.v1_cpuset, None);
        assert_eq!(
            cg.v2.as_deref(),
            Some("/user.slice/user-1000.slice/session-2.scope")
        );
        // cpuset combined with other controllers in one v1 hierarchy.
        let cg = parse_proc_cgroup("5:cpu,cpuset:/a\n");
        assert_eq!(cg.v1_cpuset.as_deref(), Some("/a"));
    }

    pub(crate) const MOUNTINFO: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
38 33 0:33 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpuset
39 33 0:34 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 30 0:40 / /mnt/with\\040space rw - ext4 /dev/sda1 rw
";

    #[test]
    fn mountinfo() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 6);
        assert_eq!(m[2].fs_type, "cgroup2");
        assert_eq!(m[2].mount_point, "/sys/fs/cgroup/unified");
        assert_eq!(m[3].super_options, "rw,cpuset");
        assert_eq!(m[4].root, "/docker/abc");
        assert_eq!(m[5].mount_point, "/mnt/with space");
    }

    #[test]
    fn proc_mounts_and_numa_status() {
        let m = parse_proc_mounts(
            "none /dev/cpuset cpuset rw 0 0\ncpuset /dev/cpuset2 cgroup rw,relatime,cpuset,noprefix 0 0\nshort line\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].fs_type, "cpuset");
        assert_eq!(m[0].root, "/");
        assert_eq!(m[1].super_options, "rw,relatime,cpuset,noprefix");
        assert_eq!(
            parse_numa_status("Node:      250\nStatus:    online\n"),
            Some(250)
        );
        assert_eq!(parse_numa_status("Node: -1\n"), None);
        assert_eq!(parse_numa_status("Status: online\n"), None);
    }
}
