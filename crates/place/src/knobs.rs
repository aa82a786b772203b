//! OS knobs that change NUMA behaviour behind a program's back: AutoNUMA (automatic page and
//! task migration, `/proc/sys/kernel/numa_balancing`) and transparent huge pages
//! (`/sys/kernel/mm/transparent_hugepage/{enabled,defrag}`).
//!
//! Reading is always allowed. System-wide changes are only made by [`set`] (behind the explicit
//! `loci os set`), need root, and return the old value. For one program, THP is turned off
//! without root by `prctl(PR_SET_THP_DISABLE)` in the child (see [`crate::apply::ChildSetup`]).

use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Knob files, relative to a root (`/` on a live system; a directory in tests).
pub const NUMA_BALANCING: &str = "proc/sys/kernel/numa_balancing";
pub const THP_ENABLED: &str = "sys/kernel/mm/transparent_hugepage/enabled";
pub const THP_DEFRAG: &str = "sys/kernel/mm/transparent_hugepage/defrag";

/// The knobs as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Knobs {
    /// `on`, `off`, or `on (mode N)` for the memory-tiering modes; `None` if the file is absent
    /// (kernel without CONFIG_NUMA_BALANCING).
    pub autonuma: Option<String>,
    /// The selected THP mode (`always`, `madvise`, `never`).
    pub thp_enabled: Option<String>,
    /// The selected THP defrag mode.
    pub thp_defrag: Option<String>,
}

/// Parses `numa_balancing` (`0` off, `1` on, `2`/`3` memory-tiering modes).
pub fn parse_autonuma(text: &str) -> Result<String, String> {
    let v = text.trim();
    match v.parse::<u32>() {
        Ok(0) => Ok("off".into()),
        Ok(1) => Ok("on".into()),
        Ok(n) => Ok(format!("on (mode {n})")),
        Err(_) => Err(format!("numa_balancing: `{v}` is not a number")),
    }
}

/// Parses a sysfs choice file such as `always [madvise] never`: the bracketed word.
pub fn parse_choice(text: &str) -> Result<String, String> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .map(str::to_string)
        .ok_or_else(|| format!("no [selected] choice in `{}`", text.trim()))
}

/// The choices a sysfs choice file offers.
pub fn choices(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
        .collect()
}

fn read_opt(root: &Path, rel: &str) -> io::Result<Option<String>> {
    match std::fs::read_to_string(root.join(rel)) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the knobs under `root`.
pub fn read(root: &Path) -> io::Result<Knobs> {
    let inv = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
    Ok(Knobs {
        autonuma: read_opt(root, NUMA_BALANCING)?
            .map(|t| parse_autonuma(&t))
            .transpose()
            .map_err(inv)?,
        thp_enabled: read_opt(root, THP_ENABLED)?
            .map(|t| parse_choice(&t))
            .transpose()
            .map_err(inv)?,
        thp_defrag: read_opt(root, THP_DEFRAG)?
            .map(|t| parse_choice(&t))
            .transpose()
            .map_err(inv)?,
    })
}

/// A system-wide change `loci os set` may make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    AutoNuma(bool),
    /// `always`, `madvise` or `never`.
    Thp(String),
}

impl std::str::FromStr for Setting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (k, v) = s.split_once('=').ok_or_else(|| {
            format!("`{s}` is not KEY=VALUE; valid: autonuma=on|off, thp=always|madvise|never")
        })?;
        match (k, v) {
            ("autonuma", "on") => Ok(Setting::AutoNuma(true)),
            ("autonuma", "off") => Ok(Setting::AutoNuma(false)),
            ("autonuma", _) => Err(format!("autonuma=`{v}`: valid values are on, off")),
            ("thp", "always" | "madvise" | "never") => Ok(Setting::Thp(v.into())),
            ("thp", _) => Err(format!(
                "thp=`{v}`: valid values are always, madvise, never"
            )),
            _ => Err(format!("unknown setting `{k}`; valid: autonuma, thp")),
        }
    }
}

/// Applies a setting under `root` and returns (file, old value, new value). Errors if the knob is
/// absent or the write is refused (not root).
pub fn set(root: &Path, setting: &Setting) -> io::Result<(PathBuf, String, String)> {
    let (rel, new_raw, new_shown) = match setting {
        Setting::AutoNuma(on) => (
            NUMA_BALANCING,
            if *on { "1" } else { "0" }.to_string(),
            if *on { "on" } else { "off" }.to_string(),
        ),
        Setting::Thp(v) => (THP_ENABLED, v.clone(), v.clone()),
    };
    let path = root.join(rel);
    let old_text = std::fs::read_to_string(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{}: {e} (this kernel may lack the knob)", path.display()),
        )
    })?;
    let old = match setting {
        Setting::AutoNuma(_) => parse_autonuma(&old_text),
        Setting::Thp(v) => {
            if !choices(&old_text).contains(v) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "this kernel offers thp = {}; `{v}` is not one of them",
                        choices(&old_text).join(", ")
                    ),
                ));
            }
            parse_choice(&old_text)
        }
    }
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    std::fs::write(&path, &new_raw)
        .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", path.display())))?;
    Ok((path, old, new_shown))
}

/// Whether the process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        assert_eq!(parse_autonuma("0\n").unwrap(), "off");
        assert_eq!(parse_autonuma("1").unwrap(), "on");
        assert_eq!(parse_autonuma("2").unwrap(), "on (mode 2)");
        assert!(parse_autonuma("x").is_err());
        // Found by the fuzz target proc_text: `00` read as "on (mode 0)", not as off.
        assert_eq!(parse_autonuma("00\n").unwrap(), "off");
        assert_eq!(parse_autonuma("+1").unwrap(), "on");
        assert_eq!(parse_choice("always [madvise] never\n").unwrap(), "madvise");
        assert_eq!(
            parse_choice("always defer defer+madvise [madvise] never").unwrap(),
            "madvise"
        );
        assert!(parse_choice("always madvise never").is_err());
        assert_eq!(
            choices("[always] madvise never"),
            vec!["always", "madvise", "never"]
        );
    }

    #[test]
    fn settings_parse_with_clear_errors() {
        assert_eq!(
            "autonuma=off".parse::<Setting>().unwrap(),
            Setting::AutoNuma(false)
        );
        assert_eq!(
            "thp=never".parse::<Setting>().unwrap(),
            Setting::Thp("never".into())
        );
        assert!("thp=sometimes"
            .parse::<Setting>()
            .unwrap_err()
            .contains("always, madvise, never"));
        assert!("swap=on"
            .parse::<Setting>()
            .unwrap_err()
            .contains("autonuma, thp"));
        assert!("autonuma"
            .parse::<Setting>()
            .unwrap_err()
            .contains("KEY=VALUE"));
    }

    #[test]
    fn read_and_set_on_a_fake_root() {
        let dir = std::env::temp_dir().join(format!("loci-knobs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("proc/sys/kernel")).unwrap();
        std::fs::create_dir_all(dir.join("sys/kernel/mm/transparent_hugepage")).unwrap();
        std::fs::write(dir.join(NUMA_BALANCING), "1\n").unwrap();
        std::fs::write(dir.join(THP_ENABLED), "always [madvise] never\n").unwrap();
        let k = read(&dir).unwrap();
        assert_eq!(k.autonuma.as_deref(), Some("on"));
        assert_eq!(k.thp_enabled.as_deref(), Some("madvise"));
        assert_eq!(k.thp_defrag, None);
        let (_, old, new) = set(&dir, &Setting::AutoNuma(false)).unwrap();
        assert_eq!((old.as_str(), new.as_str()), ("on", "off"));
        assert_eq!(
            std::fs::read_to_string(dir.join(NUMA_BALANCING)).unwrap(),
            "0"
        );
        let (_, old, _) = set(&dir, &Setting::Thp("never".into())).unwrap();
        assert_eq!(old, "madvise");
        std::fs::write(dir.join(THP_ENABLED), "[always] never\n").unwrap();
        assert!(set(&dir, &Setting::Thp("madvise".into())).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_this_machine() {
        // Presence depends on the kernel; parsing must not fail.
        read(Path::new("/")).unwrap();
    }
}
