//! Where a [`Topology`] comes from, and the one entry point that loads it: [`load`].
//!
//! | source | what it reads | allowed cpus/mems |
//! |---|---|---|
//! | [`Source::Live`] | this machine's `/sys` and `/proc` through a root path (default `/`) | the process's affinity mask and cgroup cpuset |
//! | [`Source::Sysfs`] | a captured `/sys` (+ `/proc`) tree in a directory | everything present |
//! | [`Source::HwlocXml`] | an `lstopo --of xml` export (hwloc v2) | everything present |
//! | [`Source::Json`] | a saved `loci topo --json` | as saved |
//! | [`Source::Preset`] | a machine the seeds measured on, see [`crate::preset`] | everything present |
//! | [`Source::Synthetic`] | a spec such as `nodes=4,cores=8,smt=2`, see [`crate::synthetic`] | everything present |

use std::fmt;
use std::path::PathBuf;

use crate::model::Topology;
// The error type lives in crate::error; re-exported here so `loci_topo::source::TopoError`
// still names it.
pub use crate::error::TopoError;

/// A topology source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The machine this process runs on, read through `root` (normally `/`). Allowed cpus and
    /// nodes honour `sched_getaffinity` (only when `root` is `/`), the cgroup v1/v2 cpuset found
    /// through `root/proc/self/cgroup`, and `Mems_allowed_list` of `root/proc/self/status`.
    Live { root: PathBuf },
    /// A captured tree: a directory holding `sys/` (and optionally `proc/`), as produced by
    /// copying a machine's `/sys`. Every cpu and node counts as allowed.
    Sysfs(PathBuf),
    /// An hwloc v2 XML export (`lstopo --of xml`).
    HwlocXml(PathBuf),
    /// A saved `loci topo --json` (see [`crate::json`]): plan on one machine for another.
    Json(PathBuf),
    /// A named preset, see [`crate::preset::NAMES`].
    Preset(String),
    /// A synthetic spec, see [`crate::synthetic`].
    Synthetic(String),
}

impl Source {
    /// This machine, read through `/`.
    pub fn live() -> Self {
        Source::Live { root: "/".into() }
    }
}

impl fmt::Display for Source {
    /// The string stored in [`Topology::source`]: `sysfs:/`, `sysfs-dir:DIR`, `xml:FILE`,
    /// `preset:NAME`, `synthetic:SPEC`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Live { root } => write!(f, "sysfs:{}", root.display()),
            Source::Sysfs(dir) => write!(f, "sysfs-dir:{}", dir.display()),
            Source::HwlocXml(p) => write!(f, "xml:{}", p.display()),
            Source::Json(p) => write!(f, "json:{}", p.display()),
            Source::Preset(n) => write!(f, "preset:{n}"),
            Source::Synthetic(s) => write!(f, "synthetic:{s}"),
        }
    }
}

/// A topology source written as one string, for places that take a machine as a single argument
/// (`loci stream plan --sender preset:xeon-gold-6346-2s`). Accepts what [`Source`]'s `Display`
/// prints, plus `local` for this machine and `sysfs:DIR` for a captured tree.
impl std::str::FromStr for Source {
    type Err = SourceSyntaxError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
        Ok(match (kind, arg) {
            ("local", "") | ("sysfs", "/") => Source::live(),
            ("sysfs" | "sysfs-dir", d) if !d.is_empty() => Source::Sysfs(d.into()),
            ("xml", f) if !f.is_empty() => Source::HwlocXml(f.into()),
            ("json", f) if !f.is_empty() => Source::Json(f.into()),
            ("preset", n) if !n.is_empty() => Source::Preset(n.into()),
            ("synthetic", spec) if !spec.is_empty() => Source::Synthetic(spec.into()),
            _ => return Err(SourceSyntaxError(s.to_string())),
        })
    }
}

/// A topology source string that is none of the known forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown topology source `{0}` (valid: local, sysfs:DIR, xml:FILE, json:FILE, preset:NAME, synthetic:SPEC)"
)]
pub struct SourceSyntaxError(pub String);

/// Loads a topology from `source` and checks it with [`Topology::validate`].
pub fn load(source: &Source) -> Result<Topology, TopoError> {
    let topo = match source {
        Source::Live { root } => crate::sysfs::read(root, true)?,
        Source::Sysfs(dir) => crate::sysfs::read(dir, false)?,
        Source::HwlocXml(path) => crate::xml::read_file(path)?,
        Source::Json(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| TopoError::io(path, e))?;
            let doc: crate::json::TopologyJson = serde_json::from_str(&text).map_err(|e| {
                TopoError::parse(path, format!("not a `loci topo --json` document: {e}"))
            })?;
            // The saved source string is kept inside, the file named outside.
            let inner = doc.source.clone();
            let mut t = doc.into_topology().map_err(|err| TopoError::Model {
                source_name: format!("json:{}", path.display()),
                err,
            })?;
            t.source = format!("json:{} ({inner})", path.display());
            t.validate().map_err(|err| TopoError::Model {
                source_name: t.source.clone(),
                err,
            })?;
            return Ok(t);
        }
        Source::Preset(name) => crate::preset::build(name)?,
        Source::Synthetic(spec) => crate::synthetic::build(spec)?,
    };
    let mut topo = topo;
    topo.source = source.to_string();
    topo.validate().map_err(|err| TopoError::Model {
        source_name: source.to_string(),
        err,
    })?;
    Ok(topo)
}

#[cfg(test)]
mod source_syntax_tests {
    use super::*;

    #[test]
    fn parses_every_form_and_names_bad_ones() {
        for (text, want) in [
            ("local", Source::live()),
            ("sysfs:/", Source::live()),
            ("sysfs:/tmp/x", Source::Sysfs("/tmp/x".into())),
            ("xml:a.xml", Source::HwlocXml("a.xml".into())),
            ("json:t.json", Source::Json("t.json".into())),
            ("preset:p", Source::Preset("p".into())),
            (
                "synthetic:nodes=2,cores=2",
                Source::Synthetic("nodes=2,cores=2".into()),
            ),
        ] {
            assert_eq!(text.parse::<Source>().unwrap(), want, "{text}");
        }
        // What Display prints parses back to the same source.
        for s in [
            Source::Sysfs("/d".into()),
            Source::Preset("p".into()),
            Source::Json("j".into()),
        ] {
            assert_eq!(s.to_string().parse::<Source>().unwrap(), s);
        }
        let e = "preset:".parse::<Source>().unwrap_err().to_string();
        assert!(
            e.contains("`preset:`") && e.contains("synthetic:SPEC"),
            "{e}"
        );
        assert!("nonsense".parse::<Source>().is_err());
    }
}
