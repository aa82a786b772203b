//! Which cpus and nodes a process may use, as hwloc works it out: the cgroup cpuset (v2
//! `cpuset.{cpus,mems}.effective`; v1 `cpuset.effective_{cpus,mems}` or `cpuset.{cpus,mems}`;
//! the legacy `cpuset` filesystem and v1 mounted with `noprefix`, whose files have no `cpuset.`
//! prefix), found through `proc/self/cgroup` (else `proc/self/cpuset`) and `proc/self/mountinfo`
//! (else `proc/mounts`); for the live machine also the affinity mask and `Mems_allowed_list`.

use std::path::{Path, PathBuf};

use super::text::{
    parse_mountinfo, parse_proc_cgroup, parse_proc_mounts, status_field, CgroupPaths, Mount,
};
use super::{read_opt, under};
use crate::error::TopoError;
use crate::idset::{CpuSet, NodeSet};

/// How a cpuset hierarchy is mounted, which decides where its files are and what they are called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpusetKind {
    /// cgroup v2: `cpuset.cpus.effective`, present only where the controller is enabled.
    V2,
    /// cgroup v1 with the `cpuset.` prefix: `cpuset.effective_cpus`, else `cpuset.cpus`.
    V1,
    /// The legacy `cpuset` filesystem, or cgroup v1 mounted with `noprefix`: `effective_cpus`,
    /// else `cpus`.
    V1NoPrefix,
}

impl CpusetKind {
    /// (effective cpus, effective mems, configured cpus, configured mems) file names.
    fn files(self) -> [&'static str; 4] {
        match self {
            CpusetKind::V2 => [
                "cpuset.cpus.effective",
                "cpuset.mems.effective",
                "cpuset.cpus.effective",
                "cpuset.mems.effective",
            ],
            CpusetKind::V1 => [
                "cpuset.effective_cpus",
                "cpuset.effective_mems",
                "cpuset.cpus",
                "cpuset.mems",
            ],
            CpusetKind::V1NoPrefix => ["effective_cpus", "effective_mems", "cpus", "mems"],
        }
    }
}

/// Directories (absolute, as the process sees them) that hold the process's cpuset files, with
/// how they are mounted: v2 first, then v1.
pub fn cpuset_dirs(cg: &CgroupPaths, mounts: &[Mount]) -> Vec<(PathBuf, CpusetKind)> {
    fn join(m: &Mount, path: &str) -> PathBuf {
        // A mount showing cgroup `m.root` at `m.mount_point`: strip that prefix off `path`.
        let rel = if m.root == "/" {
            path.trim_start_matches('/')
        } else {
            match path.strip_prefix(m.root.as_str()) {
                Some(r) if r.is_empty() || r.starts_with('/') => r.trim_start_matches('/'),
                // The process's cgroup is outside what is mounted (container namespaces): the
                // mount point itself is the process's view of its own cgroup.
                _ => "",
            }
        };
        let mut p = PathBuf::from(&m.mount_point);
        if !rel.is_empty() {
            p.push(rel);
        }
        p
    }
    let has_opt = |m: &Mount, o: &str| m.super_options.split(',').any(|x| x == o);
    let mut out = Vec::new();
    if let Some(path) = &cg.v2 {
        if let Some(m) = mounts.iter().find(|m| m.fs_type == "cgroup2") {
            out.push((join(m, path), CpusetKind::V2));
        }
    }
    if let Some(path) = &cg.v1_cpuset {
        let v1 = mounts.iter().find_map(|m| match m.fs_type.as_str() {
            "cgroup" if has_opt(m, "cpuset") => Some((
                m,
                if has_opt(m, "noprefix") {
                    CpusetKind::V1NoPrefix
                } else {
                    CpusetKind::V1
                },
            )),
            "cpuset" => Some((m, CpusetKind::V1NoPrefix)),
            _ => None,
        });
        if let Some((m, kind)) = v1 {
            out.push((join(m, path), kind));
        }
    }
    out
}

/// The cgroup cpuset of the process whose `/proc` and cgroup mounts are under `root`:
/// (effective cpus, effective mems), each `None` when no cpuset applies.
pub fn cgroup_cpuset(root: &Path) -> Result<(Option<CpuSet>, Option<NodeSet>), TopoError> {
    // `proc/self/cgroup` names each hierarchy's path; kernels and captures without it have
    // `proc/self/cpuset`, the one cpuset path, which then serves v1 and v2 alike.
    let cg = match read_opt(&root.join("proc/self/cgroup"))? {
        Some(t) if !t.is_empty() => parse_proc_cgroup(&t),
        _ => CgroupPaths::default(),
    };
    let cg = if cg.v2.is_none() && cg.v1_cpuset.is_none() {
        match read_opt(&root.join("proc/self/cpuset"))? {
            Some(p) if p.starts_with('/') => CgroupPaths {
                v2: Some(p.clone()),
                v1_cpuset: Some(p),
            },
            _ => return Ok((None, None)),
        }
    } else {
        cg
    };
    let mounts = match read_opt(&root.join("proc/self/mountinfo"))? {
        Some(t) if !t.is_empty() => parse_mountinfo(&t),
        _ => match read_opt(&root.join("proc/mounts"))? {
            Some(t) => parse_proc_mounts(&t),
            None => return Ok((None, None)),
        },
    };
    let mut cpus: Option<CpuSet> = None;
    let mut mems: Option<NodeSet> = None;
    for (dir, kind) in cpuset_dirs(&cg, &mounts) {
        let [cf, mf, cf_conf, mf_conf] = kind.files();
        // v2: the files exist only where the cpuset controller is enabled; above that the
        // parent's effective set applies, so walk up to the mount point.
        let mount_top = mounts
            .iter()
            .map(|m| PathBuf::from(&m.mount_point))
            .filter(|mp| dir.starts_with(mp))
            .max_by_key(|mp| mp.as_os_str().len())
            .unwrap_or_else(|| PathBuf::from("/"));
        let mut d = dir.clone();
        loop {
            let host = under(root, &d);
            // The effective sets, else the configured ones (v1 kernels before 4.x).
            let mut found = None;
            for (c, m) in [(cf, mf), (cf_conf, mf_conf)] {
                if let Some(t) = read_opt(&host.join(c))?.filter(|t| !t.is_empty()) {
                    found = Some((host.join(c), t, host.join(m)));
                    break;
                }
            }
            if let Some((cp, c, mp)) = found {
                let set = CpuSet::parse(&c).map_err(|e| super::bad(&cp, &c, e))?;
                cpus = Some(match cpus {
                    Some(prev) => prev.intersection(&set),
                    None => set,
                });
                if let Some(m) = read_opt(&mp)?.filter(|m| !m.is_empty()) {
                    let set = NodeSet::parse(&m).map_err(|e| super::bad(&mp, &m, e))?;
                    mems = Some(match mems {
                        Some(prev) => prev.intersection(&set),
                        None => set,
                    });
                }
                break;
            }
            if d == mount_top || !d.pop() {
                break;
            }
        }
    }
    Ok((cpus, mems))
}

/// The process's affinity mask through `sched_getaffinity(0)`.
fn sched_affinity() -> Option<CpuSet> {
    let mut words = 16usize; // 1024 cpus; grown while the kernel says the buffer is too small.
    loop {
        let mut buf = vec![0u64; words];
        // SAFETY: `buf` is a live, writable allocation of `words * 8` bytes and that is the size
        // passed; the raw syscall writes at most that many bytes and returns how many it wrote.
        let r =
            unsafe { libc::syscall(libc::SYS_sched_getaffinity, 0, words * 8, buf.as_mut_ptr()) };
        if r < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINVAL) && words < (1 << 14) {
                words *= 2;
                continue;
            }
            return None;
        }
        let bytes = r as usize;
        let mut set = CpuSet::new();
        for (w, word) in buf.iter().enumerate().take(bytes.div_ceil(8)) {
            for bit in 0..64 {
                if word >> bit & 1 == 1 {
                    set.insert((w * 64 + bit) as u32);
                }
            }
        }
        return Some(set);
    }
}

/// What restricts the cpus and nodes: `None` where nothing does.
#[derive(Debug, Default)]
pub(super) struct Allowed {
    pub cpus: Option<CpuSet>,
    pub mems: Option<NodeSet>,
}

fn narrow<T: Clone>(a: Option<T>, b: Option<T>, both: impl Fn(&T, &T) -> T) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(both(&a, &b)),
        (a, b) => a.or(b),
    }
}

/// The restrictions under `root`. Always the cgroup cpuset found there (a captured tree's own, as
/// hwloc reads it); with `live` also this process's affinity (`sched_getaffinity` when `root`
/// is `/`, else `Cpus_allowed_list` of `proc/self/status`) and `Mems_allowed_list`.
pub(super) fn allowed(root: &Path, live: bool) -> Result<Allowed, TopoError> {
    let (cg_cpus, cg_mems) = cgroup_cpuset(root)?;
    let mut out = Allowed {
        cpus: cg_cpus,
        mems: cg_mems,
    };
    if !live {
        return Ok(out);
    }
    let status_path = root.join("proc/self/status");
    let status = read_opt(&status_path)?;
    let field = |key: &str| status.as_deref().and_then(|s| status_field(s, key));
    let affinity = match (root == Path::new("/")).then(sched_affinity).flatten() {
        Some(a) => Some(a),
        None => field("Cpus_allowed_list")
            .map(|v| CpuSet::parse(v).map_err(|e| super::bad(&status_path, v, e)))
            .transpose()?,
    };
    let mems_allowed = field("Mems_allowed_list")
        .map(|v| NodeSet::parse(v).map_err(|e| super::bad(&status_path, v, e)))
        .transpose()?;
    out.cpus = narrow(out.cpus, affinity, |a, b| a.intersection(b));
    out.mems = narrow(out.mems, mems_allowed, |a, b| a.intersection(b));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::text::tests::MOUNTINFO;
    use super::*;

    #[test]
    fn cpuset_dirs_v1_v2_and_namespaced() {
        let mounts = parse_mountinfo(MOUNTINFO);
        let cg = parse_proc_cgroup("3:cpuset:/jobs/42\n0::/user.slice\n");
        assert_eq!(
            cpuset_dirs(&cg, &mounts),
            vec![
                (
                    PathBuf::from("/sys/fs/cgroup/unified/user.slice"),
                    CpusetKind::V2
                ),
                (
                    PathBuf::from("/sys/fs/cgroup/cpuset/jobs/42"),
                    CpusetKind::V1
                ),
            ]
        );
        // A pure v2 system with a namespaced mount: the process's cgroup is the mount root.
        let mounts = parse_mountinfo(
            "30 20 0:26 /../../init.scope /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        let cg = parse_proc_cgroup("0::/\n");
        assert_eq!(
            cpuset_dirs(&cg, &mounts),
            vec![(PathBuf::from("/sys/fs/cgroup"), CpusetKind::V2)]
        );
        // No cgroup mounts at all: nothing to read.
        assert!(cpuset_dirs(&cg, &[]).is_empty());
    }

    #[test]
    fn legacy_cpuset_fs_and_noprefix() {
        let cg = CgroupPaths {
            v2: None,
            v1_cpuset: Some("/job".into()),
        };
        let legacy = parse_proc_mounts("none /dev/cpuset cpuset rw 0 0\n");
        assert_eq!(
            cpuset_dirs(&cg, &legacy),
            vec![(PathBuf::from("/dev/cpuset/job"), CpusetKind::V1NoPrefix)]
        );
        let noprefix = parse_proc_mounts("cpuset /cs cgroup rw,relatime,cpuset,noprefix 0 0\n");
        assert_eq!(
            cpuset_dirs(&cg, &noprefix),
            vec![(PathBuf::from("/cs/job"), CpusetKind::V1NoPrefix)]
        );
        assert_eq!(CpusetKind::V1NoPrefix.files()[2], "cpus");
    }
}
