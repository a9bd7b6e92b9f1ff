//! Per-thread state for the hooks: the reentrancy flag, errno, the thread id.
//!
//! Everything here is a `const` thread-local `Cell` with no destructor: those stay usable during
//! `_dl_fini`, after Rust's destructible thread-locals are gone (FIELD-NOTES, "Exit").

use std::cell::Cell;
use std::os::raw::c_int;

thread_local! {
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    static TID: Cell<u32> = const { Cell::new(0) };
}

/// Marks the thread as inside pinguard. While it lives, every hook the thread reaches (the
/// runtime calling itself, std calling `mmap` for pinguard's own work) passes straight through, so
/// only the outermost intercepted call is counted.
pub struct Reentry(());

impl Reentry {
    pub fn enter() -> Option<Reentry> {
        ACTIVE.with(|a| {
            if a.get() {
                None
            } else {
                a.set(true);
                Some(Reentry(()))
            }
        })
    }
}

impl Drop for Reentry {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(false));
    }
}

/// Whether this thread is inside pinguard now.
pub fn inside() -> bool {
    ACTIVE.with(|a| a.get())
}

pub fn errno() -> c_int {
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(v: c_int) {
    unsafe { *libc::__errno_location() = v }
}

/// The kernel thread id, cached: `gettid` is a syscall and the report wants it per allocation.
pub fn tid() -> u32 {
    TID.with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        let v = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        t.set(v);
        v
    })
}

/// Forgets the cached thread id; a fork child's only thread has a new one.
pub fn forget_tid() {
    TID.with(|t| t.set(0));
}

pub fn unix_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Milliseconds since the epoch from the coarse clock (a few ms of resolution, a fraction of the
/// cost): for the timestamps taken on every tracked call.
pub fn coarse_unix_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}
