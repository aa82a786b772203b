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

impl Setting {
    /// The key as `loci os set` takes it.
    pub fn key(&self) -> &'static str {
        match self {
            Setting::AutoNuma(_) => "autonuma",
            Setting::Thp(_) => "thp",
        }
    }
}

/// A change [`check`] found possible: the knob file, its value before and after (as `loci os
/// status` shows them), and the raw texts written to make and to undo it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: PathBuf,
    pub old: String,
    pub new: String,
    old_raw: String,
    new_raw: String,
}

/// Checks `setting` against the knob under `root` without writing: the knob exists, offers the
/// value, and its current value reads. Returns the change it would make.
pub fn check(root: &Path, setting: &Setting) -> io::Result<Change> {
    let (rel, new_raw, new) = match setting {
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
    let (old, old_raw) = match setting {
        Setting::AutoNuma(_) => {
            parse_autonuma(&old_text).map(|old| (old, old_text.trim().to_string()))
        }
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
            parse_choice(&old_text).map(|old| (old.clone(), old))
        }
    }
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Change {
        path,
        old,
        new,
        old_raw,
        new_raw,
    })
}

/// Applies a setting under `root` and returns (file, old value, new value). Errors if the knob is
/// absent or the write is refused (not root).
pub fn set(root: &Path, setting: &Setting) -> io::Result<(PathBuf, String, String)> {
    let mut done = set_all(root, std::slice::from_ref(setting))?;
    let c = done.remove(0);
    Ok((c.path, c.old, c.new))
}

/// Applies several settings under `root` as one: every one is checked first (nothing is written
/// when one is refused, or when a knob is named twice), then they are written in order; if a write
/// fails, the ones already written get their old values back and the error says which.
pub fn set_all(root: &Path, settings: &[Setting]) -> io::Result<Vec<Change>> {
    set_all_with(root, settings, |p, text| std::fs::write(p, text))
}

/// [`set_all`] with the file writes made by `write` (tests make one fail).
fn set_all_with(
    root: &Path,
    settings: &[Setting],
    mut write: impl FnMut(&Path, &str) -> io::Result<()>,
) -> io::Result<Vec<Change>> {
    for (i, s) in settings.iter().enumerate() {
        if settings[..i].iter().any(|t| t.key() == s.key()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{}` given twice; give each setting once", s.key()),
            ));
        }
    }
    let changes = settings
        .iter()
        .map(|s| check(root, s))
        .collect::<io::Result<Vec<_>>>()?;
    for (i, c) in changes.iter().enumerate() {
        let Err(e) = write(&c.path, &c.new_raw) else {
            continue;
        };
        let mut undo = Vec::new();
        for d in changes[..i].iter().rev() {
            undo.push(match write(&d.path, &d.old_raw) {
                Ok(()) => format!("restored {} to {}", d.path.display(), d.old),
                Err(e2) => format!(
                    "could not restore {} to {} ({e2}): it stays {}",
                    d.path.display(),
                    d.old,
                    d.new
                ),
            });
        }
        let after = if undo.is_empty() {
            "nothing was changed".to_string()
        } else {
            undo.join("; ")
        };
        return Err(io::Error::new(
            e.kind(),
            format!("writing {}: {e}; {after}", c.path.display()),
        ));
    }
    Ok(changes)
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

    /// A fake root with AutoNUMA on and THP `madvise`.
    fn fake_root(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("loci-knobs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("proc/sys/kernel")).unwrap();
        std::fs::create_dir_all(dir.join("sys/kernel/mm/transparent_hugepage")).unwrap();
        std::fs::write(dir.join(NUMA_BALANCING), "2\n").unwrap();
        std::fs::write(dir.join(THP_ENABLED), "always [madvise] never\n").unwrap();
        dir
    }

    #[test]
    fn set_all_checks_every_setting_before_writing_any() {
        let dir = fake_root("check");
        let autonuma_off = Setting::AutoNuma(false);
        // The second is refused: the first must not have been written.
        std::fs::write(dir.join(THP_ENABLED), "[always] never\n").unwrap();
        let e = set_all(
            &dir,
            &[autonuma_off.clone(), Setting::Thp("madvise".into())],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`madvise` is not one of them"), "{e}");
        let balancing = || std::fs::read_to_string(dir.join(NUMA_BALANCING)).unwrap();
        assert_eq!(balancing(), "2\n");
        std::fs::remove_file(dir.join(THP_ENABLED)).unwrap();
        let e = set_all(&dir, &[autonuma_off.clone(), Setting::Thp("never".into())])
            .unwrap_err()
            .to_string();
        assert!(e.contains("transparent_hugepage/enabled"), "{e}");
        let e = set_all(&dir, &[autonuma_off.clone(), Setting::AutoNuma(true)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`autonuma` given twice"), "{e}");
        assert_eq!(balancing(), "2\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn set_all_restores_what_it_wrote_when_a_later_write_fails() {
        let dir = fake_root("restore");
        let thp = dir.join(THP_ENABLED);
        let settings = [Setting::AutoNuma(false), Setting::Thp("never".into())];
        let refuse_thp = |p: &Path, text: &str| {
            if p == thp {
                Err(io::Error::new(io::ErrorKind::PermissionDenied, "refused"))
            } else {
                std::fs::write(p, text)
            }
        };
        let e = set_all_with(&dir, &settings, refuse_thp)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("writing {}: refused", thp.display()))
                && e.contains("numa_balancing to on (mode 2)"),
            "{e}"
        );
        // Restored to the exact old mode, not just "on".
        assert_eq!(
            std::fs::read_to_string(dir.join(NUMA_BALANCING)).unwrap(),
            "2"
        );
        // A restore that fails too is said, with the value the knob is left at.
        let e = set_all_with(&dir, &settings, |p: &Path, text: &str| {
            if text == "0" {
                std::fs::write(p, text)
            } else {
                Err(io::Error::new(io::ErrorKind::PermissionDenied, "refused"))
            }
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("could not restore") && e.contains("stays off"),
            "{e}"
        );
        // All writes succeed: every change is returned, in order.
        std::fs::write(dir.join(NUMA_BALANCING), "1\n").unwrap();
        let done = set_all(&dir, &settings).unwrap();
        let shown: Vec<(&str, &str)> = done
            .iter()
            .map(|c| (c.old.as_str(), c.new.as_str()))
            .collect();
        assert_eq!(shown, vec![("on", "off"), ("madvise", "never")]);
        assert_eq!(std::fs::read_to_string(&thp).unwrap(), "never");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_this_machine() {
        // Presence depends on the kernel; parsing must not fail.
        read(Path::new("/")).unwrap();
    }
}
