//! Sleep and wake: the two-phase sleep of an idle worker ([`sleep`]) and the spawner's side,
//! [`Shared::notify`], which makes sure a worker will look for a task just published (see the
//! module docs of `runtime` for the protocol).

use super::ctx::Ctx;
use super::shared::Shared;
use super::stats::bump;
use crate::sync::{fence, lock, wait, Ordering};

pub(super) struct SleepState {
    /// Workers waiting on the condition variable (with or without a token).
    pub(super) parked: usize,
    /// Wake-ups handed out and not yet taken by a parked worker.
    pub(super) tokens: usize,
}

/// Fields of `GroupState::word`: workers announced sleepy and still scanning (bits 0-15),
/// parked workers without a wake token (bits 16-31), the jobs event counter (bits 32-63; wraps).
const SEARCHING: u64 = 1;
const WAKEABLE: u64 = 1 << 16;
const JEC: u64 = 1 << 32;

#[inline]
fn searching(w: u64) -> u64 {
    w & 0xFFFF
}
#[inline]
fn wakeable(w: u64) -> u64 {
    (w >> 16) & 0xFFFF
}

impl Shared {
    /// After publishing a task: makes sure a worker of the groups in `order` (first the
    /// preferred) will look for it. `strict`: nobody else is bound to look (the task went into
    /// another group's queue or came from outside), so fence first (see the `runtime` module
    /// docs).
    #[inline]
    pub(super) fn notify(&self, order: &[usize], strict: bool) {
        if strict {
            fence(Ordering::SeqCst);
        }
        if self.idle.load(Ordering::Acquire) == 0 {
            return;
        }
        self.notify_slow(order);
    }

    #[cold]
    fn notify_slow(&self, order: &[usize]) {
        for &g in order {
            let gs = &self.groups[g];
            let mut w = gs.word.load(Ordering::Acquire);
            if searching(w) > 0 {
                // A sleepy worker of this group is scanning: make it scan again before it parks
                // (it will see the task, or be running another one and look again after). The
                // RMW reads the latest word: if no worker is still searching by then, they all
                // parked with the old counter and one must be woken instead.
                w = gs.word.fetch_add(JEC, Ordering::SeqCst);
                if searching(w) > 0 {
                    return;
                }
            }
            if wakeable(w) == 0 {
                continue;
            }
            let mut st = lock(&gs.sleep);
            if st.parked > st.tokens {
                st.tokens += 1;
                gs.word.fetch_sub(WAKEABLE, Ordering::SeqCst);
                gs.cv.notify_one();
                return;
            }
        }
    }
}

/// The two-phase sleep (see the `runtime` module docs): announce sleepy, scan once more, then
/// park unless a spawn bumped the group's jobs event counter meanwhile; wait for a wake token
/// (or shutdown). Returns to the worker loop, which scans again.
pub(super) fn sleep(ctx: &Ctx) {
    let sh = &*ctx.shared;
    let gs = &sh.groups[ctx.group];
    // Phase 1: sleepy. The group word first, then `idle`: a spawner that sees `idle` > 0 sees
    // this worker in the word (the RMWs are ordered and `idle` is read with acquire).
    let jec = gs.word.fetch_add(SEARCHING, Ordering::SeqCst) >> 32;
    sh.idle.fetch_add(1, Ordering::SeqCst);
    // Pairs with a strict spawner's fence: either it sees this worker, or the scan sees its task.
    fence(Ordering::SeqCst);
    let leave = || {
        gs.word.fetch_sub(SEARCHING, Ordering::SeqCst);
        sh.idle.fetch_sub(1, Ordering::SeqCst);
    };
    if let Some(t) = ctx.find() {
        leave();
        ctx.execute(t);
        return;
    }
    // Phase 2: park, unless a spawn since the announcement asked this group to look again. The
    // CAS is under the group mutex, so a spawner that sees the worker wakeable takes the mutex
    // after the worker waits (or hands a token it will find).
    let mut st = lock(&gs.sleep);
    st.parked += 1;
    loop {
        let w = gs.word.load(Ordering::SeqCst);
        if w >> 32 != jec {
            st.parked -= 1;
            drop(st);
            leave();
            return;
        }
        let parked = w - SEARCHING + WAKEABLE;
        if gs
            .word
            .compare_exchange(w, parked, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            break;
        }
    }
    bump(&sh.counters[ctx.w].parks);
    while st.tokens == 0 && !sh.shutdown.load(Ordering::SeqCst) {
        st = wait(&gs.cv, st);
    }
    if st.tokens > 0 {
        // The waker already took this worker out of the wakeable count.
        st.tokens -= 1;
    } else {
        gs.word.fetch_sub(WAKEABLE, Ordering::SeqCst);
    }
    st.parked -= 1;
    drop(st);
    sh.idle.fetch_sub(1, Ordering::SeqCst);
}
