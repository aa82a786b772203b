//! `libloci_pin.so`: places the threads of an unmodified, dynamically linked program.
//!
//! `loci run` preloads it (`LD_PRELOAD`) with the plan in environment variables (see
//! `loci_place::pinenv`). The technique is likwid-pin's: the library defines `pthread_create`,
//! finds the real one with `dlsym(RTLD_NEXT)`, and places the k-th new thread as plan thread k.
//! Unlike likwid-pin it wraps the start routine, so the new thread binds itself before any of the
//! program's code runs in it (no window in which it runs on the creator's cpus). The main thread
//! is plan thread 0, bound when the library is loaded.
//!
//! Static binaries do not go through the dynamic linker, so they cannot be wrapped: `loci run`
//! then only binds the whole process.
//!
//! With `LOCI_PIN_LOG` set, the library also logs, from a destructor run at `exit(3)`, the
//! process's anonymous memory per node as its own numa_maps gives it then (`loci run --verify`'s
//! exit report). Without `LOCI_PIN_CPUS` it binds nothing and only logs that: `loci run --verify`
//! of an unpinned plan loads it so.

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, OnceLock};

use loci_place::pinenv::{self, Dealer, ExitMemory, PinLogEntry, PinRole};
use loci_place::policy::name_of_mode;
use loci_place::sys::{self, CpuMask};
use loci_topo::CpuSet;

type StartFn = extern "C" fn(*mut c_void) -> *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartFn,
    *mut c_void,
) -> c_int;

struct State {
    /// Per plan thread: the set and its precomputed mask.
    entries: Vec<(CpuSet, CpuMask)>,
    /// Union of all entries: where skipped and extra threads run.
    footprint: (CpuSet, CpuMask),
    dealer: Mutex<Dealer>,
}

static STATE: OnceLock<Option<State>> = OnceLock::new();
static LOG_FD: OnceLock<c_int> = OnceLock::new();
static REAL_CREATE: OnceLock<usize> = OnceLock::new();

fn warn(msg: &str) {
    let line = format!("loci-pin: {msg}\n");
    // SAFETY: writing a valid buffer to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

fn load() -> Option<State> {
    // A value that is not UTF-8 is reported like any other bad value, not taken as unset.
    let text = |name: &str| {
        pinenv::text_var(name)
            .map_err(|e| warn(&format!("{e}; threads are not pinned")))
            .ok()
    };
    let cpus = text(pinenv::ENV_CPUS)??;
    let sets = match pinenv::decode_cpus(&cpus) {
        Ok(s) => s,
        Err(e) => {
            warn(&format!("{e}; threads are not pinned"));
            return None;
        }
    };
    let skip = match text(pinenv::ENV_SKIP)? {
        Some(s) => match pinenv::parse_skip(&s) {
            Ok(v) => v,
            Err(e) => {
                warn(&format!("{e}; threads are not pinned"));
                return None;
            }
        },
        None => 0,
    };
    let mut entries = Vec::new();
    for s in &sets {
        match CpuMask::new(s) {
            Ok(m) => entries.push((s.clone(), m)),
            Err(e) => {
                warn(&format!(
                    "{}: {e}; threads are not pinned",
                    pinenv::ENV_CPUS
                ));
                return None;
            }
        }
    }
    let union = sets.iter().fold(CpuSet::new(), |a, s| a.union(s));
    let umask = CpuMask::new(&union).ok()?;
    Some(State {
        dealer: Mutex::new(Dealer::new(entries.len(), skip)),
        entries,
        footprint: (union, umask),
    })
}

fn state() -> Option<&'static State> {
    STATE.get_or_init(load).as_ref()
}

/// The log's file descriptor (opened once, on first use), or -1 without `LOCI_PIN_LOG`. The log
/// is independent of the plan: `loci run --verify` of an unpinned plan loads the library without
/// `LOCI_PIN_CPUS`, for the memory reading at exit alone.
fn log_fd() -> c_int {
    *LOG_FD.get_or_init(|| {
        // A path, so any bytes (a TMPDIR that is not UTF-8 included).
        let Some(path) = std::env::var_os(pinenv::ENV_LOG) else {
            return -1;
        };
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(path.as_bytes()) else {
            warn(&format!("{} holds a NUL byte; no log", pinenv::ENV_LOG));
            return -1;
        };
        // SAFETY: valid C string; flags are plain integers.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC,
                0o644,
            )
        };
        if fd < 0 {
            warn(&format!(
                "cannot open {}={}; no log",
                pinenv::ENV_LOG,
                path.to_string_lossy()
            ));
        }
        fd
    })
}

/// Binds the calling thread and logs it.
fn bind_self(st: &State, role: PinRole) {
    let (set, mask) = match role {
        PinRole::Thread(i) => (&st.entries[i].0, &st.entries[i].1),
        PinRole::Skip | PinRole::Extra => (&st.footprint.0, &st.footprint.1),
    };
    if let Err(e) = mask.apply(0) {
        warn(&format!("binding a thread to cpus {set}: {e}"));
    }
    let fd = log_fd();
    if fd >= 0 {
        let policy = sys::get_mempolicy().ok().map(|(m, nodes)| {
            if nodes.is_empty() {
                name_of_mode(m).to_string()
            } else {
                format!("{}:{nodes}", name_of_mode(m))
            }
        });
        let line = PinLogEntry {
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
            tid: sys::gettid(),
            role,
            cpus: set.clone(),
            policy,
        }
        .line();
        // SAFETY: valid buffer; one write in O_APPEND mode keeps lines whole.
        unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
    }
}

/// Runs when the library is loaded: opens the log, binds the main thread as plan thread 0.
extern "C" fn on_load() {
    log_fd();
    if let Some(st) = state() {
        bind_self(st, PinRole::Thread(0));
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// Runs at `exit(3)` (a library destructor): logs the process's anonymous memory per node, read
/// from its own numa_maps while every mapping is still there. `loci run --verify` polls
/// numa_maps every 250 ms, so without this line its exit report could miss whatever the program
/// touched after its last poll.
extern "C" fn on_exit() {
    let fd = log_fd();
    if fd < 0 {
        return;
    }
    let maps = match std::fs::read_to_string("/proc/self/numa_maps") {
        Ok(t) => t,
        Err(e) => return warn(&format!("reading /proc/self/numa_maps at exit: {e}")),
    };
    let maps = match loci_place::verify::parse_numa_maps(&maps) {
        Ok(m) => m,
        Err(e) => return warn(&format!("/proc/self/numa_maps at exit: {e}")),
    };
    let line = ExitMemory {
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
        anon_bytes: loci_place::verify::anon_bytes_per_node(&maps),
    }
    .line();
    // SAFETY: valid buffer; one write in O_APPEND mode keeps the line whole.
    unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
}

#[used]
#[link_section = ".fini_array"]
static ON_EXIT: extern "C" fn() = on_exit;

struct Start {
    f: StartFn,
    arg: *mut c_void,
    role: PinRole,
}

extern "C" fn trampoline(p: *mut c_void) -> *mut c_void {
    // SAFETY: `p` is the Box<Start> leaked by pthread_create below, handed to exactly this thread.
    let start = unsafe { Box::from_raw(p.cast::<Start>()) };
    if let Some(st) = state() {
        bind_self(st, start.role);
    }
    (start.f)(start.arg)
}

fn real_create() -> Option<CreateFn> {
    let p = *REAL_CREATE.get_or_init(|| {
        // SAFETY: dlsym with a valid C string; RTLD_NEXT finds the next definition (libc's).
        unsafe { libc::dlsym(libc::RTLD_NEXT, c"pthread_create".as_ptr()) as usize }
    });
    // SAFETY: a non-null result of dlsym("pthread_create") has pthread_create's signature.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, CreateFn>(p) })
}

/// The wrapper the dynamic linker resolves the program's `pthread_create` to.
///
/// # Safety
/// Same contract as `pthread_create(3)`.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    f: StartFn,
    arg: *mut c_void,
) -> c_int {
    let Some(real) = real_create() else {
        return libc::EAGAIN;
    };
    let Some(st) = state() else {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { real(thread, attr, f, arg) };
    };
    let role = st
        .dealer
        .lock()
        .map(|mut d| d.next_role())
        .unwrap_or(PinRole::Extra);
    let start = Box::into_raw(Box::new(Start { f, arg, role }));
    // SAFETY: the trampoline takes ownership of `start` in the new thread.
    let r = unsafe { real(thread, attr, trampoline, start.cast()) };
    if r != 0 {
        // SAFETY: the thread was not created, so the box is still ours.
        drop(unsafe { Box::from_raw(start) });
    }
    r
}
