//! A source file mapped read-only, so that the compressing threads compress straight from the
//! page cache instead of copying every chunk into a buffer first (the copy is about 5% of the
//! pipeline's CPU: docs/stream.md, "The source read from its mapping").
//!
//! A mapped file that another program truncates raises SIGBUS at the next read past its new end.
//! A process-wide handler puts a zero page in place of such a page and marks the mapping, and
//! [`FileMap::settled`] turns the mark into an error after the chunk; faults anywhere else go to
//! the handler that was there before (Rust's stack-overflow handler, or the default action).
//! Written by hand: the mapping crates (memmap2) leave SIGBUS to their callers.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// `MADV_POPULATE_READ` (Linux 5.14): maps a range's pages now, and fails with EFAULT where a
/// read would raise SIGBUS. Not in the libc crate yet.
const MADV_POPULATE_READ: libc::c_int = 22;

/// The page-table entries of a mapped range are dropped a span at a time, once every byte of it
/// has been used: one `madvise` per 64 MiB. Dropping them after every chunk cost 0.05 of the
/// limit on the development machine (docs/stream.md, "The source read from its mapping").
const SPAN: usize = 64 << 20;

/// Mappings the SIGBUS handler knows (one per mapped source at a time).
const SLOTS: usize = 64;

struct Slot {
    /// Start address; 0 while the slot is free.
    start: AtomicUsize,
    len: AtomicUsize,
    /// A read past the file's end was answered with a zero page.
    faulted: AtomicBool,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        faulted: AtomicBool::new(false),
    }
}; SLOTS];

/// The SIGBUS disposition before ours, and the page size (read once, outside the handler).
struct Previous {
    action: libc::sigaction,
    page: usize,
}
// SAFETY: plain data (a handler address, flags and a signal mask), written once and then only
// read.
unsafe impl Send for Previous {}
unsafe impl Sync for Previous {}

static PREVIOUS: OnceLock<io::Result<Previous>> = OnceLock::new();

/// Installs the handler once per process; `false` means no mapping may be made.
fn install() -> bool {
    PREVIOUS
        .get_or_init(|| {
            // SAFETY: a zeroed sigaction is a valid value (no handler, empty mask, no flags).
            let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            // SAFETY: as above.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: both pointers are to live sigaction values; the mask was zeroed (empty).
            if unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Previous {
                action: old,
                page: loci_place::sys::page_size(),
            })
        })
        .is_ok()
}

/// Only async-signal-safe work: atomics, `mmap`, `sigaction`, and the previous handler.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let Some(Ok(prev)) = PREVIOUS.get() else {
        // Installed a moment ago and the previous disposition not stored yet (no mapping exists
        // then): the default action, taken when the faulting instruction runs again.
        default_action(sig);
        return;
    };
    for s in &TABLE {
        let start = s.start.load(Acquire);
        if start != 0 && addr >= start && addr - start < s.len.load(Acquire) {
            let page = addr & !(prev.page - 1);
            // SAFETY: the page lies inside a mapping of this module's (registered until just
            // before it is unmapped, and never unmapped while borrowed): a private zero page
            // replaces that one page and nothing else.
            let r = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    prev.page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if r != libc::MAP_FAILED {
                s.faulted.store(true, Release);
                return;
            }
        }
    }
    // Not ours: what was there before. A default or ignored disposition becomes the default
    // again, and the faulting instruction, run again on return, takes it.
    let h = prev.action.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        default_action(sig);
    } else if prev.action.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: an SA_SIGINFO handler has this signature; it gets what the kernel gave us.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain handler takes the signal number only.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

/// Sets `sig`'s disposition back to the default (async-signal-safe).
fn default_action(sig: libc::c_int) {
    // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a live sigaction value; sigaction is async-signal-safe.
    unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
}

/// The size and modification time a file had when it was mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Stamp {
    fn of(f: &File) -> io::Result<Stamp> {
        Ok(Stamp::from(&f.metadata()?))
    }
}

impl From<&std::fs::Metadata> for Stamp {
    fn from(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: m.len(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        }
    }
}

/// A whole regular file mapped read-only and shared (its page cache pages, no copy).
pub struct FileMap {
    file: File,
    path: PathBuf,
    ptr: *const u8,
    len: usize,
    slot: usize,
    stamp: Stamp,
    /// The file's size or modification time changed since it was mapped: read it with copies.
    changed: AtomicBool,
    /// Bytes of each [`SPAN`] used so far.
    used: Vec<AtomicUsize>,
}

// SAFETY: the mapping is read-only and lives as long as the value; reading it from several
// threads at once is sound.
unsafe impl Send for FileMap {}
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Maps `file` (at `path`, for messages). Where it cannot be mapped (an empty or special
    /// file, a file system that cannot map, the handler's table full), gives the file back, for
    /// the caller to read with copies.
    pub fn new(file: File, path: &Path) -> Result<FileMap, File> {
        let Ok(meta) = file.metadata() else {
            return Err(file);
        };
        let stamp = Stamp::from(&meta);
        let len = match usize::try_from(stamp.len) {
            Ok(n) if n > 0 && meta.file_type().is_file() => n,
            _ => return Err(file),
        };
        if !install() {
            return Err(file);
        }
        // SAFETY: a fresh read-only shared mapping of an open file; nothing else is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(file);
        }
        let Some(slot) = TABLE.iter().position(|s| {
            s.start
                .compare_exchange(0, p as usize, AcqRel, Relaxed)
                .is_ok()
        }) else {
            // SAFETY: the mapping made above, not shared with anyone yet.
            unsafe { libc::munmap(p, len) };
            return Err(file);
        };
        TABLE[slot].faulted.store(false, Relaxed);
        TABLE[slot].len.store(len, Release);
        Ok(FileMap {
            file,
            path: path.to_owned(),
            ptr: p as *const u8,
            len,
            slot,
            stamp,
            changed: AtomicBool::new(false),
            used: (0..len.div_ceil(SPAN))
                .map(|_| AtomicUsize::new(0))
                .collect(),
        })
    }

    /// The file, for positional reads.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// `len` bytes at `offset`, mapped in now; `None` once the file has changed (read a copy
    /// instead). Fails where the file no longer reaches.
    pub fn chunk(&self, offset: u64, len: usize) -> io::Result<Option<&[u8]>> {
        if self.changed.load(Acquire) {
            return Ok(None);
        }
        let off = usize::try_from(offset).map_err(io::Error::other)?;
        if off.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(io::Error::other(format!(
                "bytes {off}..{} beyond the {} bytes mapped",
                off.saturating_add(len),
                self.len
            )));
        }
        // SAFETY: off + len is within the mapping (checked above).
        let p = unsafe { self.ptr.add(off) };
        let page = p as usize & !(loci_place::sys::page_size() - 1);
        // SAFETY: the range lies in this mapping; populating only maps pages in.
        let r = unsafe {
            libc::madvise(
                page as *mut libc::c_void,
                p as usize + len - page,
                MADV_POPULATE_READ,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Before Linux 5.14: the pages fault in as read.
                Some(libc::EINVAL) => {}
                Some(libc::EFAULT) => return Err(self.shrank()),
                _ => return Err(e),
            }
        }
        // SAFETY: `len` bytes of a live read-only mapping, borrowed no longer than `self`; a page
        // the file lost meanwhile reads as zeros (the handler) and `settled` reports it.
        Ok(Some(unsafe { std::slice::from_raw_parts(p, len) }))
    }

    /// After bytes from [`FileMap::chunk`] were used (`offset`, `len`; each byte once): `Ok(true)`
    /// when they stayed the file's bytes throughout; `Ok(false)` when the file changed meanwhile
    /// (grown or modified: use a copy of them instead, as every later chunk will); an error when
    /// it shrank. Once every byte of a span has been used, lets the kernel drop its page-table
    /// entries (the page cache keeps the pages), so a long stream does not grow page tables
    /// without end.
    pub fn settled(&self, offset: u64, len: usize) -> io::Result<bool> {
        if TABLE[self.slot].faulted.load(Acquire) {
            return Err(self.shrank());
        }
        let now = Stamp::of(&self.file)?;
        if now.len < self.stamp.len {
            return Err(self.shrank());
        }
        let (start, end) = (offset as usize, offset as usize + len);
        for span in start / SPAN..end.div_ceil(SPAN) {
            let (s0, s1) = (span * SPAN, ((span + 1) * SPAN).min(self.len));
            let n = end.min(s1) - start.max(s0);
            if self.used[span].fetch_add(n, AcqRel) + n == s1 - s0 {
                // SAFETY: a page-aligned range of this mapping that no one reads any more;
                // dropping a shared file mapping's entries loses nothing.
                unsafe {
                    libc::madvise(
                        self.ptr.add(s0) as *mut libc::c_void,
                        s1 - s0,
                        libc::MADV_DONTNEED,
                    )
                };
            }
        }
        if now != self.stamp {
            self.changed.store(true, Release);
            return Ok(false);
        }
        Ok(true)
    }

    /// Kilobytes of the mapping resident in this process (`Rss` in /proc/self/smaps).
    #[cfg(test)]
    fn resident_kb(&self) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{:x}-", self.ptr as usize);
        let at = smaps.find(&head).expect("the mapping is listed");
        let rss = smaps[at..].lines().find(|l| l.starts_with("Rss:")).unwrap();
        rss.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn shrank(&self) -> io::Error {
        let now = Stamp::of(&self.file).map(|s| s.len.to_string());
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "{} shrank while it was being sent (it had {} bytes, now {}): truncated by \
                 another program?",
                self.path.display(),
                self.stamp.len,
                now.as_deref().unwrap_or("?")
            ),
        )
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        TABLE[self.slot].len.store(0, Release);
        TABLE[self.slot].start.store(0, Release);
        // SAFETY: the mapping made in `new`; no borrow of it outlives `self`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ChunkReader, SourceSpec};
    use crate::buf::Pool;
    use crate::hash::xxh3_64;
    use std::os::unix::fs::FileExt;
    use std::time::{Duration, SystemTime};

    const CHUNK: usize = 64 << 10;

    /// A file of 3.5 chunks of distinct bytes, last modified long ago (so that any change gets a
    /// new modification time, whatever the clock's granularity), and its reader.
    fn source(dir: &tempfile::TempDir) -> (std::path::PathBuf, Vec<u8>, ChunkReader) {
        let path = dir.path().join("src.raw");
        let bytes: Vec<u8> = (0..CHUNK * 7 / 2)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))
            .unwrap();
        let r = SourceSpec::File(path.clone()).open().unwrap();
        (path, bytes, r)
    }

    fn chunks(bytes: &[u8]) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
        (0..bytes.len().div_ceil(CHUNK)).map(|s| {
            (
                s as u64,
                (s * CHUNK) as u64,
                CHUNK.min(bytes.len() - s * CHUNK),
            )
        })
    }

    #[test]
    fn a_mapped_file_gives_its_bytes_without_a_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let (_, bytes, r) = source(&dir);
        let ChunkReader::Mapped(m) = &r else {
            panic!("a regular file is mapped")
        };
        for (seq, off, len) in chunks(&bytes) {
            let no_buffer = || -> std::io::Result<_> { panic!("chunk {seq} asked for a buffer") };
            let h = r.with_chunk(seq, off, len, no_buffer, xxh3_64).unwrap();
            assert_eq!(
                h,
                xxh3_64(&bytes[off as usize..off as usize + len]),
                "chunk {seq}"
            );
            // Mapped in while in use; the whole span (here the whole file) is let go only once
            // every chunk of it has been used.
            let resident = m.resident_kb();
            if (seq as usize + 1) * CHUNK < bytes.len() {
                assert!(
                    resident >= (seq + 1) * CHUNK as u64 / 1024,
                    "chunk {seq}: {resident} KiB"
                );
            } else {
                assert_eq!(resident, 0, "after the last chunk");
            }
        }
    }

    #[test]
    fn a_file_changed_while_mapped_is_read_again_from_a_copy() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut bytes, r) = source(&dir);
        let w = std::fs::File::options().write(true).open(&path).unwrap();
        let pool = Pool::new(CHUNK, None, 1);
        let mut calls = 0;
        let h = r
            .with_chunk(
                1,
                CHUNK as u64,
                CHUNK,
                || pool.get(),
                |b| {
                    calls += 1;
                    if calls == 1 {
                        // Another program writes into the chunk while it is being compressed.
                        w.write_all_at(&[0xAB; 100], CHUNK as u64 + 10).unwrap();
                    }
                    xxh3_64(b)
                },
            )
            .unwrap();
        bytes[CHUNK + 10..CHUNK + 110].fill(0xAB);
        assert_eq!(calls, 2, "the chunk is done again from a copy");
        assert_eq!(h, xxh3_64(&bytes[CHUNK..2 * CHUNK]));
        // Every later chunk is copied: a buffer is asked for, and the bytes are the file's now.
        let mut asked = false;
        let h = r
            .with_chunk(
                2,
                2 * CHUNK as u64,
                CHUNK,
                || {
                    asked = true;
                    pool.get()
                },
                xxh3_64,
            )
            .unwrap();
        assert!(asked);
        assert_eq!(h, xxh3_64(&bytes[2 * CHUNK..3 * CHUNK]));
    }

    #[test]
    fn a_file_truncated_while_mapped_is_an_error_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes, r) = source(&dir);
        let w = std::fs::File::options().write(true).open(&path).unwrap();
        let pool = Pool::new(CHUNK, None, 1);
        // Truncated while the chunk is read: its pages go, and reading them raises SIGBUS.
        let e = r
            .with_chunk(
                2,
                2 * CHUNK as u64,
                CHUNK,
                || pool.get(),
                |b| {
                    w.set_len(CHUNK as u64).unwrap();
                    b.iter().map(|&x| x as u64).sum::<u64>()
                },
            )
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        let msg = e.to_string();
        assert!(
            msg.contains("shrank")
                && msg.contains(&format!("it had {} bytes, now {CHUNK}", bytes.len())),
            "{msg}"
        );
        // Truncated before the chunk is read: the same error, before any read.
        let e = r
            .with_chunk(3, 3 * CHUNK as u64, CHUNK / 2, || pool.get(), |_| ())
            .unwrap_err();
        assert!(e.to_string().contains("shrank"), "{e}");
    }

    /// The handler answers faults in loci's mappings only: a read past the end of a file some
    /// other code mapped still ends the process with SIGBUS (run in a child process).
    #[test]
    fn a_fault_outside_loci_mappings_still_kills_the_process() {
        use std::os::unix::process::ExitStatusExt;
        if std::env::var_os("LOCI_FOREIGN_SIGBUS").is_some() {
            let dir = tempfile::tempdir().unwrap();
            let (path, _, r) = source(&dir);
            assert!(
                matches!(r, ChunkReader::Mapped(_)),
                "the handler is installed"
            );
            let f = std::fs::File::options()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            // SAFETY: a fresh read-only mapping of an open file, read once below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    CHUNK * 2,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            f.set_len(0).unwrap();
            // SAFETY: inside the mapping; past the file's new end, so this raises SIGBUS.
            let x = unsafe { std::ptr::read_volatile((p as *const u8).add(CHUNK)) };
            println!("read {x} past the end and lived");
            std::process::exit(0);
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "source::map::tests::a_fault_outside_loci_mappings_still_kills_the_process",
                "--nocapture",
            ])
            .env("LOCI_FOREIGN_SIGBUS", "1")
            .output()
            .unwrap();
        let said = format!(
            "child: {:?}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!said.contains("and lived"), "{said}");
        // Under AddressSanitizer the handler before loci's is ASan's: it reports and aborts.
        let want = if cfg!(loci_asan) {
            libc::SIGABRT
        } else {
            libc::SIGBUS
        };
        assert_eq!(out.status.signal(), Some(want), "{said}");
    }
}
