//! The room a refused or failed pinning call had, as its event and its line say it (issue 46,
//! item 13): the figures users otherwise gather by hand from `ulimit -l`, `/proc/self/status`,
//! `capsh` and the cgroup's files. Read only on a refusal or a failure, never on a successful
//! call: raw reads into buffers on the stack and plain system calls, no lock, no allocation (a
//! hooked call may run inside a signal handler).

use crate::runtime::{cgroup, kernel};

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
            cgroup_headroom: headroom.or_else(|| cgroup::headroom().ok().map(|h| h.bytes)),
            budget,
            code,
        }
    }
}

/// `VmLck` and `VmPin`, from one read of `/proc/self/status`.
pub fn locked_and_pinned() -> (Option<u64>, Option<u64>) {
    let s = kernel::status();
    (s.vm_lck, s.vm_pin)
}
