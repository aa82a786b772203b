//! Applying a plan: to the calling thread, to the whole current process, or to a child process
//! between `fork` and `exec`.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

use loci_topo::CpuSet;

use crate::plan::Plan;
use crate::policy::MemPlan;
use crate::sys::{self, CpuMask, PolicyMask};

/// Binds the calling thread as thread `index` of `plan`: its cpus (if the plan pins) and the
/// plan's memory policy (unless first-touch).
pub fn apply_thread(plan: &Plan, index: usize) -> io::Result<()> {
    let t = plan.threads.get(index).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "thread {index} is not in the plan (it has {} threads)",
                plan.threads.len()
            ),
        )
    })?;
    if plan.pinned {
        sys::set_affinity(0, &t.cpus)?;
    }
    if !plan.memory.is_default() {
        sys::set_mempolicy(plan.memory.mode(), &plan.memory.nodes)?;
    }
    Ok(())
}

/// A memory plan that could not be applied to an address range (`mbind(2)` failed or the range
/// was not page aligned). The message names the range, the policy and, for the usual errno
/// values, the likely cause.
#[derive(Debug, thiserror::Error)]
#[error("applying memory policy {policy} to [{start:#x}, {end:#x}) ({len} bytes) failed: {source}{hint}", end = .start + .len)]
pub struct RangeError {
    /// First byte of the range.
    pub start: usize,
    /// Length of the range in bytes.
    pub len: usize,
    /// The plan as `--mem` prints it (e.g. `interleave:0-3`).
    pub policy: String,
    /// What the kernel (or the alignment check) said.
    pub source: io::Error,
    /// The likely cause, with a leading `; `, or empty.
    hint: String,
}

/// Applies a resolved memory plan (from [`MemPolicy::resolve`](crate::MemPolicy::resolve)) to
/// `[addr, addr+len)` with `mbind(2)`: pages of the range faulted in later go where the plan
/// says, whatever the policy of the thread that touches them. `first-touch` resets the range to
/// the thread's policy (`MPOL_DEFAULT`), `localalloc` places each page on the node of the cpu
/// that touches it.
///
/// With `migrate`, pages already faulted in are moved to conform (`MPOL_MF_MOVE`: only pages
/// this process alone maps; contents and addresses stay). Without it they stay where they are,
/// so call it before the first touch. `addr` must be page aligned; the kernel rounds `len` up to
/// whole pages. An empty range is a no-op.
///
/// # Safety
/// The range must be mapped memory the caller owns (no other code relies on where its pages
/// live); with `migrate`, its pages may move between nodes while other threads use them.
pub unsafe fn apply_range(
    plan: &MemPlan,
    addr: *mut u8,
    len: usize,
    migrate: bool,
) -> Result<(), RangeError> {
    let err = |source: io::Error, hint: String| RangeError {
        start: addr as usize,
        len,
        policy: plan.to_string(),
        source,
        hint,
    };
    if plan.part_order().is_some() {
        return Err(err(
            io::Error::new(io::ErrorKind::InvalidInput, "a per-part policy"),
            "; it places the parts of a region: apply each part's plan (`MemPlan::part`)".into(),
        ));
    }
    let ps = sys::page_size();
    if !(addr as usize).is_multiple_of(ps) {
        return Err(err(
            io::Error::new(io::ErrorKind::InvalidInput, "start is not page aligned"),
            format!("; mbind works on whole pages of {ps} bytes"),
        ));
    }
    if len == 0 {
        return Ok(());
    }
    let flags = if migrate { sys::mode::MPOL_MF_MOVE } else { 0 };
    // SAFETY: the caller guarantees the range is its own mapping; alignment was checked.
    unsafe { sys::mbind(addr, len, plan.mode(), &plan.nodes, flags) }.map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::EFAULT) => "; part of the range is not mapped".to_string(),
            Some(libc::EINVAL) => format!(
                "; the kernel rejects mode {} with nodes {} (a mode newer than this kernel, or nodes it does not have)",
                plan.mode(),
                plan.nodes
            ),
            Some(libc::ENOMEM) => "; the kernel ran out of memory for the range policy".into(),
            Some(libc::EIO) => "; some pages could not be moved".into(),
            _ => String::new(),
        };
        err(e, hint)
    })
}

/// Kernel thread ids of a process (`/proc/PID/task`), ascending.
pub fn task_ids(pid: i32) -> io::Result<Vec<i32>> {
    let dir = if pid == 0 {
        "/proc/self/task".to_string()
    } else {
        format!("/proc/{pid}/task")
    };
    let mut v: Vec<i32> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// Binds every thread of the current process: existing threads in thread-id order get plan
/// threads 0, 1, ... (the main thread has the lowest id, so it is thread 0); threads beyond the
/// plan get the plan's whole footprint. The memory policy is per thread in Linux and can only be
/// set by a thread itself, so it is applied to the calling thread (threads it creates later
/// inherit it). Returns the (tid, plan index) pairs bound.
pub fn apply_process(plan: &Plan) -> io::Result<Vec<(i32, Option<usize>)>> {
    let mut out = Vec::new();
    if plan.pinned {
        let all = plan.footprint();
        for (k, tid) in task_ids(0)?.into_iter().enumerate() {
            let (cpus, idx) = match plan.threads.get(k) {
                Some(t) => (&t.cpus, Some(k)),
                None => (&all, None),
            };
            match sys::set_affinity(tid, cpus) {
                Ok(()) => out.push((tid, idx)),
                // The thread exited meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
    }
    if !plan.memory.is_default() {
        sys::set_mempolicy(plan.memory.mode(), &plan.memory.nodes)?;
    }
    Ok(out)
}

/// Everything a child needs between `fork` and `exec`, converted ahead of time so that the
/// child only makes syscalls (async-signal-safe: no allocation, no locks).
#[derive(Clone, Copy)]
pub struct ChildSetup {
    cpus: Option<CpuMask>,
    mem: Option<PolicyMask>,
    thp_disable: Option<bool>,
}

impl ChildSetup {
    /// `cpus`: the affinity of the child's main thread at exec (`None` = inherit);
    /// memory: the plan's policy (inherited by every thread the child creates);
    /// `thp_disable`: `Some(true)` = `prctl(PR_SET_THP_DISABLE)` in the child.
    pub fn new(cpus: Option<&CpuSet>, plan: &Plan, thp_disable: Option<bool>) -> io::Result<Self> {
        Ok(Self {
            cpus: cpus.map(CpuMask::new).transpose()?,
            mem: if plan.memory.is_default() {
                None
            } else {
                Some(PolicyMask::new(plan.memory.mode(), &plan.memory.nodes)?)
            },
            thp_disable,
        })
    }

    /// Applies in the calling thread; what `pre_exec` runs. Async-signal-safe.
    pub fn apply(&self) -> io::Result<()> {
        if let Some(m) = &self.mem {
            m.apply()?;
        }
        if let Some(c) = &self.cpus {
            c.apply(0)?;
        }
        if let Some(d) = self.thp_disable {
            sys::set_thp_disable(d)?;
        }
        Ok(())
    }

    /// Installs [`ChildSetup::apply`] as the command's `pre_exec` hook.
    pub fn install(self, cmd: &mut Command) {
        // SAFETY: the closure only calls `apply`, which makes raw syscalls on data prepared
        // before fork: no allocation, no locks, so it is safe in the forked child.
        unsafe {
            cmd.pre_exec(move || self.apply());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::MemPolicy;
    use crate::strategy::Strategy;
    use crate::testing::one_node_here;
    use loci_topo::NodeSet;

    #[test]
    fn child_gets_affinity_and_policy_before_exec() {
        let topo = one_node_here();
        let first = topo.allowed_cpus().first().unwrap();
        let plan = bind0_plan(&topo, &format!("cpus:{first}"), 1);
        let setup = ChildSetup::new(Some(&plan.threads[0].cpus), &plan, Some(true)).unwrap();
        let mut cmd = Command::new("grep");
        cmd.args([
            "-E",
            "^(Cpus_allowed_list|Mems_allowed_list)",
            "/proc/self/status",
        ]);
        setup.install(&mut cmd);
        let out = cmd.output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains(&format!("Cpus_allowed_list:\t{first}\n")),
            "{text}"
        );
    }

    /// Resolves `--mem` text on this machine's one node.
    fn mem_plan(text: &str) -> MemPlan {
        let m: MemPolicy = text.parse().unwrap();
        m.resolve(&one_node_here()).unwrap().0
    }

    /// Four fresh untouched pages, unmapped on drop.
    fn four_pages() -> sys::AnonMap {
        sys::AnonMap::new(4 * sys::page_size(), sys::page_size(), 0).unwrap()
    }

    #[test]
    fn range_policy_reads_back_per_page() {
        let r = four_pages();
        let ps = sys::page_size();
        let bind = mem_plan("bind:0");
        // SAFETY: our own fresh mapping; pages 1..3 only.
        unsafe { apply_range(&bind, r.as_ptr().add(ps), 2 * ps, false) }.unwrap();
        let at = |page: usize| sys::get_range_policy(unsafe { r.as_ptr().add(page * ps) }).unwrap();
        assert_eq!(at(1), (sys::mode::MPOL_BIND, NodeSet::single(0)));
        assert_eq!(at(2), (sys::mode::MPOL_BIND, NodeSet::single(0)));
        // Outside the range the thread's policy (default here) governs.
        assert_eq!(at(0).0, sys::mode::MPOL_DEFAULT);
        assert_eq!(at(3).0, sys::mode::MPOL_DEFAULT);
        // Interleave over the only node resolves to preferred:0; then first-touch resets.
        let pref = mem_plan("interleave");
        assert_eq!(pref.policy, "preferred");
        // SAFETY: as above; the pages are untouched so nothing migrates.
        unsafe { apply_range(&pref, r.as_ptr(), 4 * ps, true) }.unwrap();
        assert_eq!(at(0), (sys::mode::MPOL_PREFERRED, NodeSet::single(0)));
        assert_eq!(at(2), (sys::mode::MPOL_PREFERRED, NodeSet::single(0)));
        // SAFETY: as above.
        unsafe { apply_range(&mem_plan("first-touch"), r.as_ptr(), 4 * ps, false) }.unwrap();
        assert_eq!(at(2).0, sys::mode::MPOL_DEFAULT);
        // Touched pages moved with `migrate` stay readable and land on the plan's node.
        // SAFETY: writes inside our mapping.
        unsafe { r.as_ptr().write_bytes(7, 4 * ps) };
        unsafe { apply_range(&bind, r.as_ptr(), 4 * ps, true) }.unwrap();
        assert!(sys::buffer_pages_nodes(r.as_ptr(), 4 * ps)
            .unwrap()
            .iter()
            .all(|&n| n == 0));
        // SAFETY: reads inside our mapping.
        assert!((0..4 * ps).all(|i| unsafe { *r.as_ptr().add(i) } == 7));
        // An empty range is a no-op, even unaligned.
        assert!(unsafe { apply_range(&bind, r.as_ptr(), 0, false) }.is_ok());
    }

    #[test]
    fn range_errors_name_range_policy_and_cause() {
        let r = four_pages();
        let ps = sys::page_size();
        let bind = mem_plan("bind:0");
        // SAFETY: inside our mapping; rejected before any syscall.
        let e = unsafe { apply_range(&bind, r.as_ptr().add(1), ps, false) }.unwrap_err();
        let msg = e.to_string();
        let start = format!("{:#x}", r.as_ptr() as usize + 1);
        assert!(msg.contains(&start) && msg.contains("bind:0"), "{msg}");
        assert!(msg.contains("not page aligned"), "{msg}");
        assert_eq!(e.len, ps);

        // A range with an unmapped hole: EFAULT, said as such.
        // SAFETY: unmaps the last page of our own mapping; Pages' drop unmapping it again is harmless.
        unsafe { libc::munmap(r.as_ptr().add(3 * ps) as *mut libc::c_void, ps) };
        let e = unsafe { apply_range(&bind, r.as_ptr(), 4 * ps, false) }.unwrap_err();
        let msg = e.to_string();
        let end = format!("{:#x}", r.as_ptr() as usize + 4 * ps);
        assert!(msg.contains(&end) && msg.contains("bind:0"), "{msg}");
        assert!(msg.contains("not mapped"), "{msg}");
        assert_eq!(e.source.raw_os_error(), Some(libc::EFAULT));

        // A node the kernel does not have (a plan built by hand, not resolved): EINVAL, named.
        let bad = MemPlan {
            policy: "bind",
            nodes: NodeSet::single(1000),
        };
        let e = unsafe { apply_range(&bad, r.as_ptr(), ps, false) }.unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("bind:1000") && msg.contains("rejects"),
            "{msg}"
        );
    }

    /// A plan of `threads` threads under `strategy` with memory bound to node 0.
    fn bind0_plan(topo: &loci_topo::Topology, strategy: &str, threads: usize) -> Plan {
        let s: Strategy = strategy.parse().unwrap();
        let m: MemPolicy = "bind:0".parse().unwrap();
        Plan::new(topo, &s, threads, &m, false).unwrap()
    }

    #[test]
    fn thread_binding_reads_back() {
        let topo = one_node_here();
        let plan = bind0_plan(&topo, "compact", 1);
        std::thread::spawn(move || {
            apply_thread(&plan, 0).unwrap();
            assert_eq!(sys::get_affinity(0).unwrap(), plan.threads[0].cpus);
            let (m, n) = sys::get_mempolicy().unwrap();
            assert_eq!(m, crate::sys::mode::MPOL_BIND);
            assert_eq!(n.to_string(), "0");
            assert!(apply_thread(&plan, 5).is_err());
        })
        .join()
        .unwrap();
    }

    /// Runs in a re-executed copy of this test binary (so binding the whole process cannot
    /// disturb other tests): starts two threads, applies a plan to the process, checks each.
    #[test]
    fn process_binding_in_a_child() {
        if std::env::var_os("LOCI_APPLY_PROCESS_CHILD").is_none() {
            let out = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "apply::tests::process_binding_in_a_child",
                    "--nocapture",
                ])
                .env("LOCI_APPLY_PROCESS_CHILD", "1")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
            return;
        }
        let topo = one_node_here();
        let n = topo.allowed_cpus().len().min(2);
        let plan = bind0_plan(&topo, "compact", n);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let helper = {
            let rx = rx.clone();
            std::thread::spawn(move || {
                rx.lock().unwrap().recv().unwrap();
                sys::get_affinity(0).unwrap()
            })
        };
        let bound = apply_process(&plan).unwrap();
        let tids = task_ids(0).unwrap();
        // Every thread was bound: by tid order to plan threads, the rest to the footprint.
        assert_eq!(bound.len(), tids.len());
        for (k, (tid, idx)) in bound.iter().enumerate() {
            let want = match plan.threads.get(k) {
                Some(t) => t.cpus.clone(),
                None => plan.footprint(),
            };
            assert_eq!(*idx, plan.threads.get(k).map(|_| k));
            assert_eq!(sys::get_affinity(*tid).unwrap(), want);
        }
        tx.send(()).unwrap();
        let helper_cpus = helper.join().unwrap();
        assert!(helper_cpus.is_subset(&plan.footprint()));
        assert_eq!(sys::get_mempolicy().unwrap().0, crate::sys::mode::MPOL_BIND);
    }
}
