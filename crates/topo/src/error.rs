//! Why a topology could not be loaded: [`TopoError`], shared by every reader (sysfs, XML,
//! preset, synthetic) and by [`crate::load`], so that none of them imports another for it.

use std::path::{Path, PathBuf};

use crate::model::ModelError;

/// Why a topology could not be loaded. Every variant names the bad part (file, key, name) and,
/// where there is a fixed set, the valid choices. The message carries its cause, so no variant
/// also reports it as `source()` (a printed error chain would say it twice).
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    #[error("cannot read {}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
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
        err: ModelError,
    },
}

impl TopoError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        TopoError::Io {
            path: path.to_path_buf(),
            err: source,
        }
    }
    pub(crate) fn parse(path: &Path, msg: impl Into<String>) -> Self {
        TopoError::Parse {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }
}
