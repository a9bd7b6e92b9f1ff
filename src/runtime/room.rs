//! The room a refused or failed pinning call had, as its event and its line say it (issue 46,
//! item 13): the figures users otherwise gather by hand from `ulimit -l`, `/proc/self/status`,
//! `capsh` and the cgroup's files. Read only on a refusal or a failure, never on a successful
//! call: raw reads into buffers on the stack and plain system calls, no lock, no allocation (a
//! hooked call may run inside a signal handler).

use crate::runtime::{cgroup, clock, kernel};
use std::sync::atomic::{AtomicU64, Ordering};

/// A cgroup reading older than this many milliseconds is taken again: a burst of refusals (a
/// cache filling until memory runs out, a retry loop) shares one walk of the cgroup's files, the
/// dearest part of the room (as the cgroup reserve's readings, `budget::floor::READING_MS`).
const HEADROOM_MS: u64 = 100;
/// The latest reading (`NONE`: none found) and when it was taken (`coarse_monotonic_ms`; 0: never).
static HEADROOM: AtomicU64 = AtomicU64::new(NONE);
static HEADROOM_AT: AtomicU64 = AtomicU64::new(0);
const NONE: u64 = u64::MAX;

/// The process's room when a call was refused or failed. `None`: not known (or, for
/// `rlimit_memlock`, unlimited: `rlimit_unlimited` tells which).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Room {
    pub rlimit_memlock: Option<u64>,
    pub rlimit_unlimited: bool,
    pub cap_ipc_lock: bool,
    pub vm_lck: Option<u64>,
    pub vm_pin: Option<u64>,
    /// The cgroup's headroom before its OOM killer, where its memory hierarchy is known.
    pub cgroup_headroom: Option<u64>,
    /// The process budget in force (`None`: none).
    pub budget: Option<u64>,
    /// The API's answer: the runtime's code, or the kernel's errno for the locking family; `None`
    /// for pinguard's own refusal (the family's out-of-memory answer, named at write time).
    pub code: Option<i32>,
    /// The bytes the caller asked for, where pinguard counts another figure (the `mlock` family
    /// counts whole pages): `None` where the two are the same.
    pub asked: Option<u64>,
}

std::thread_local! {
    /// The bytes the current locking call asked for, set only on its way to a refusal (`Asking`).
    static ASKED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// While alive, a refusal or failure on this thread records `bytes` as what its call asked for.
pub struct Asking(());

impl Asking {
    pub fn new(bytes: u64) -> Asking {
        ASKED.with(|a| a.set(bytes));
        Asking(())
    }
}

impl Drop for Asking {
    fn drop(&mut self) {
        ASKED.with(|a| a.set(0));
    }
}

/// The bytes this thread's call asked for, where `Asking` set them.
pub fn asked() -> Option<u64> {
    Some(ASKED.with(|a| a.get())).filter(|&b| b != 0)
}

impl Room {
    /// The kernel's figures now; `headroom` when the caller read it already (a cgroup reserve's
    /// refusal carries its reading), `budget` the process budget.
    pub fn now(headroom: Option<u64>, budget: Option<u64>, code: Option<i32>) -> Room {
        let (vm_lck, vm_pin) = locked_and_pinned();
        let rlimit_memlock = kernel::rlimit_memlock();
        Room {
            rlimit_memlock,
            rlimit_unlimited: rlimit_memlock.is_none() && kernel::rlimit_memlock_read(),
            cap_ipc_lock: kernel::cap_ipc_lock(),
            vm_lck,
            vm_pin,
            cgroup_headroom: headroom.or_else(headroom_now),
            budget,
            code,
            asked: asked(),
        }
    }
}

/// The cgroup's headroom, read afresh unless a reading of the last `HEADROOM_MS` stands. Two
/// threads may both read and store: each stores a fresh reading, so either is right.
fn headroom_now() -> Option<u64> {
    let now = clock::coarse_monotonic_ms();
    let at = HEADROOM_AT.load(Ordering::Acquire);
    if at != 0 && now.saturating_sub(at) < HEADROOM_MS {
        return Some(HEADROOM.load(Ordering::Relaxed)).filter(|&h| h != NONE);
    }
    let h = cgroup::headroom().ok().map(|h| h.bytes);
    HEADROOM.store(h.unwrap_or(NONE), Ordering::Relaxed);
    HEADROOM_AT.store(now.max(1), Ordering::Release);
    h
}

/// `VmLck` and `VmPin`, from one read of `/proc/self/status`.
pub fn locked_and_pinned() -> (Option<u64>, Option<u64>) {
    let s = kernel::status();
    (s.vm_lck, s.vm_pin)
}
