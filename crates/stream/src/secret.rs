//! The shared secret of a stream: where it comes from (file, config, environment), and the
//! checks that refuse a short one or a file others can read.

use std::path::Path;

use crate::config::ConfigError;

/// Shortest shared secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;
/// Largest secret file read, in bytes.
const MAX_SECRET_FILE_BYTES: u64 = 64 << 10;
/// The environment variable holding the shared secret when neither a file nor the config gives one.
pub const SECRET_ENV: &str = "LOCI_STREAM_SECRET";
const MAKE_SECRET: &str = "head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE";

/// Refuses a shared secret shorter than [`MIN_SECRET_BYTES`].
pub fn check_secret(s: &[u8]) -> Result<(), ConfigError> {
    if s.len() < MIN_SECRET_BYTES {
        return Err(ConfigError::Secret(format!(
            "the shared secret is {} bytes, at least {MIN_SECRET_BYTES} are needed; make one with \
             `{MAKE_SECRET}` and give the same FILE to both sides (--secret-file FILE)",
            s.len()
        )));
    }
    Ok(())
}

/// The shared secret, from the first of: the secret `file` (the CLI passes `--secret-file` if
/// given, else the config's `secret_file`), the config's `secret` (`from_config`), the environment
/// variable `LOCI_STREAM_SECRET`. An empty `secret` or variable counts as absent. A secret file
/// must be a regular file (symbolic links are followed) whose mode gives nothing to group or
/// others (0600 or 0400); its bytes are the secret, less one trailing newline (`\n` or `\r\n`).
/// The secret must have at least [`MIN_SECRET_BYTES`] bytes ([`check_secret`]). Errors say where
/// the secret came from and how to fix it.
pub fn secret(file: Option<&Path>, from_config: Option<&str>) -> Result<Vec<u8>, ConfigError> {
    let (s, from) = if let Some(path) = file {
        (
            read_secret_file(path)?,
            format!("secret file {}", path.display()),
        )
    } else if let Some(s) = from_config.filter(|s| !s.is_empty()) {
        (s.as_bytes().to_vec(), "`secret` in the config".to_string())
    } else {
        match std::env::var_os(SECRET_ENV) {
            Some(s) if !s.is_empty() => {
                use std::os::unix::ffi::OsStringExt;
                (s.into_vec(), format!("environment variable {SECRET_ENV}"))
            }
            _ => {
                return Err(ConfigError::Secret(format!(
                    "none given: make one with `{MAKE_SECRET}` and pass --secret-file FILE (or \
                     `secret_file = \"FILE\"` in the config) on both sides; or set the \
                     environment variable {SECRET_ENV} or `secret = \"...\"` in the config to \
                     the same value on sender and receiver"
                )))
            }
        }
    };
    check_secret(&s).map_err(|e| match e {
        ConfigError::Secret(m) => ConfigError::Secret(format!("{from}: {m}")),
        e => e,
    })?;
    Ok(s)
}

/// Reads a secret file after checking that it is a regular file only its owner can read.
fn read_secret_file(path: &Path) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let read_err = |err| ConfigError::Read {
        path: format!("secret file {}", path.display()),
        err,
    };
    // O_NONBLOCK: opening a FIFO must not wait for a writer; the type is checked right after.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(read_err)?;
    // The metadata of the open file (fstat): what is read is what was checked.
    let meta = f.metadata().map_err(read_err)?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(ConfigError::Secret(format!(
            "secret file {} is {kind}; give a regular file holding the secret",
            path.display()
        )));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::Secret(format!(
            "secret file {p} has mode {mode:04o}: group or others may read or change it; \
             allow only its owner (0600 or 0400): chmod 600 {p}",
            p = path.display()
        )));
    }
    if meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(ConfigError::Secret(format!(
            "secret file {} is {} bytes, more than a secret file may hold ({MAX_SECRET_FILE_BYTES})",
            path.display(),
            meta.len()
        )));
    }
    let mut s = Vec::with_capacity(meta.len() as usize);
    f.by_ref()
        .take(MAX_SECRET_FILE_BYTES + 1)
        .read_to_end(&mut s)
        .map_err(read_err)?;
    if s.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(ConfigError::Secret(format!(
            "secret file {} grew beyond {MAX_SECRET_FILE_BYTES} bytes while it was read",
            path.display()
        )));
    }
    if s.ends_with(b"\r\n") {
        s.truncate(s.len() - 2);
    } else if s.ends_with(b"\n") {
        s.truncate(s.len() - 1);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    const GOOD: &str = "0123456789abcdef-good";

    fn write_secret(dir: &Path, name: &str, text: &[u8], mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn short_secrets_are_refused_with_the_length_and_a_recipe() {
        check_secret(&[7; MIN_SECRET_BYTES]).unwrap();
        let e = check_secret(&[7; MIN_SECRET_BYTES - 1])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("15 bytes")
                && e.contains("at least 16")
                && e.contains("head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE"),
            "{e}"
        );
        let e = check_secret(b"").unwrap_err().to_string();
        assert!(e.contains("0 bytes"), "{e}");
        // From the config: the message also says where the secret came from.
        let e = secret(None, Some("short")).unwrap_err().to_string();
        assert!(
            e.contains("5 bytes") && e.contains("`secret` in the config"),
            "{e}"
        );
        // From a file: one trailing newline does not count.
        let d = tempfile::tempdir().unwrap();
        let p = write_secret(d.path(), "short", b"0123456789abcde\n", 0o600);
        let e = secret(Some(&p), None).unwrap_err().to_string();
        assert!(
            e.contains("15 bytes") && e.contains(&p.display().to_string()),
            "{e}"
        );
    }

    #[test]
    fn secret_files_only_their_owner_can_read_are_accepted() {
        let d = tempfile::tempdir().unwrap();
        for mode in [0o600, 0o400] {
            let p = write_secret(d.path(), &format!("ok-{mode:o}"), GOOD.as_bytes(), mode);
            assert_eq!(secret(Some(&p), None).unwrap(), GOOD.as_bytes());
        }
        // One trailing newline is stripped (LF or CRLF), only one.
        let p = write_secret(d.path(), "lf", format!("{GOOD}\n").as_bytes(), 0o600);
        assert_eq!(secret(Some(&p), None).unwrap(), GOOD.as_bytes());
        let p = write_secret(d.path(), "crlf", format!("{GOOD}\r\n").as_bytes(), 0o600);
        assert_eq!(secret(Some(&p), None).unwrap(), GOOD.as_bytes());
        let p = write_secret(d.path(), "lflf", format!("{GOOD}\n\n").as_bytes(), 0o600);
        assert_eq!(
            secret(Some(&p), None).unwrap(),
            format!("{GOOD}\n").as_bytes()
        );
        // Binary secrets are taken as they are.
        let bin: Vec<u8> = (0..=255u8).collect();
        let p = write_secret(d.path(), "bin", &bin, 0o600);
        assert_eq!(secret(Some(&p), None).unwrap(), bin);
        // A symbolic link to a good file is followed.
        let l = d.path().join("link");
        std::os::unix::fs::symlink(d.path().join("ok-600"), &l).unwrap();
        assert_eq!(secret(Some(&l), None).unwrap(), GOOD.as_bytes());
    }

    #[test]
    fn secret_files_others_can_read_are_refused() {
        let d = tempfile::tempdir().unwrap();
        for mode in [
            0o640,
            0o604,
            0o660,
            0o644,
            0o606,
            0o610,
            0o601,
            0o700 | 0o020,
        ] {
            let p = write_secret(d.path(), &format!("m-{mode:o}"), GOOD.as_bytes(), mode);
            let e = secret(Some(&p), Some(GOOD)).unwrap_err().to_string();
            let ps = p.display().to_string();
            assert!(
                e.contains(&ps)
                    && e.contains(&format!("{mode:04o}"))
                    && e.contains(&format!("chmod 600 {ps}")),
                "mode {mode:o}: {e}"
            );
        }
    }

    #[test]
    fn secret_files_that_are_not_regular_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        // A directory, even one only its owner may enter.
        let sub = d.path().join("dir");
        std::fs::create_dir(&sub).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = secret(Some(&sub), None).unwrap_err().to_string();
        assert!(e.contains("a directory") && e.contains("dir"), "{e}");
        // A FIFO: refused without waiting for a writer.
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = secret(Some(&fifo), None).unwrap_err().to_string();
        assert!(
            e.contains("not a regular file") && e.contains("fifo"),
            "{e}"
        );
        // /dev/null: a character device.
        let e = secret(Some(Path::new("/dev/null")), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // Missing: the error names the file; the config's secret is not used instead.
        let missing = d.path().join("missing");
        let e = secret(Some(&missing), Some(GOOD)).unwrap_err().to_string();
        assert!(e.contains(&missing.display().to_string()), "{e}");
        // Too large to be a secret.
        let big = write_secret(d.path(), "big", &vec![b'x'; 100_000], 0o600);
        let e = secret(Some(&big), None).unwrap_err().to_string();
        assert!(e.contains("100000 bytes"), "{e}");
    }

    /// The one test that touches `LOCI_STREAM_SECRET` (tests run in parallel threads of one
    /// process; no other test reads the variable).
    #[test]
    fn secret_order_file_then_config_then_environment() {
        let d = tempfile::tempdir().unwrap();
        let file = write_secret(d.path(), "k", b"from-the-file-0123456\n", 0o600);
        let from_config = "from-the-config-0123456";
        let from_env = "from-the-environment-0123456";
        let saved = std::env::var_os(SECRET_ENV);
        std::env::set_var(SECRET_ENV, from_env);
        let got = |f: Option<&Path>, c: Option<&str>| secret(f, c).map(String::from_utf8);
        assert_eq!(
            got(Some(&file), Some(from_config)).unwrap().unwrap(),
            "from-the-file-0123456"
        );
        assert_eq!(got(None, Some(from_config)).unwrap().unwrap(), from_config);
        assert_eq!(got(None, None).unwrap().unwrap(), from_env);
        // An empty config value counts as absent.
        assert_eq!(got(None, Some("")).unwrap().unwrap(), from_env);
        // A short environment value is refused, naming the variable.
        std::env::set_var(SECRET_ENV, "short");
        let e = secret(None, None).unwrap_err().to_string();
        assert!(e.contains("5 bytes") && e.contains(SECRET_ENV), "{e}");
        // Nothing anywhere: every way to give one is named.
        std::env::remove_var(SECRET_ENV);
        let e = secret(None, None).unwrap_err().to_string();
        assert!(
            e.contains("--secret-file")
                && e.contains("secret_file")
                && e.contains(SECRET_ENV)
                && e.contains("head -c 32 /dev/urandom"),
            "{e}"
        );
        std::env::set_var(SECRET_ENV, "");
        assert!(secret(None, None).is_err());
        match saved {
            Some(v) => std::env::set_var(SECRET_ENV, v),
            None => std::env::remove_var(SECRET_ENV),
        }
    }
}
