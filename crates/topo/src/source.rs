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
use std::path::{Path, PathBuf};

use crate::model::{ModelError, Topology};

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

/// Why a topology could not be loaded. Every variant names the bad part (file, key, name) and,
/// where there is a fixed set, the valid choices.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {msg}", path.display())]
    Parse { path: PathBuf, msg: String },
    #[error("hwloc XML {}: {msg}", path.display())]
    Xml { path: PathBuf, msg: String },
    #[error("unknown preset `{name}`; valid presets: {valid}")]
    UnknownPreset { name: String, valid: String },
    #[error("synthetic spec `{spec}`: {msg}")]
    Synthetic { spec: String, msg: String },
    #[error("topology from {source_name} is inconsistent: {err}")]
    Model {
        source_name: String,
        #[source]
        err: ModelError,
    },
}

impl TopoError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        TopoError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    pub(crate) fn parse(path: &Path, msg: impl Into<String>) -> Self {
        TopoError::Parse {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }
}

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
