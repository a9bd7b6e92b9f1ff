//! `_exit` and `_Exit`: the process ends without running `atexit` handlers (Python's `os._exit`,
//! forked workers, many daemons), so the exit report is written here, by the process that owns
//! pinguard's state only (a `vfork` child calls `_exit` in its parent's memory: see
//! `lifecycle::exit_report_from_exit_call`).

use super::hand_hooks;
use crate::lifecycle;
use std::os::raw::c_int;

/// Finds both real functions at start-up: a `vfork` child must not run the loader's look-up in
/// its parent's memory.
pub fn prepare() {
    _exit::REAL.prepare();
    _Exit::REAL.prepare();
}

/// The exit report, then the real function `real` gives (the system call when there is none).
fn finish(status: c_int, real: fn() -> Option<unsafe extern "C" fn(c_int) -> !>) -> ! {
    lifecycle::exit_report_from_exit_call();
    match real() {
        // SAFETY: `f` is the real exit function; any status is valid.
        Some(f) => unsafe { f(status) },
        None => loop {
            // SAFETY: `exit_group` takes a plain status and never returns.
            unsafe { libc::syscall(libc::SYS_exit_group, status) };
        },
    }
}

fn exit_lower(status: c_int) -> ! {
    finish(status, _exit::get)
}

fn exit_upper(status: c_int) -> ! {
    finish(status, _Exit::get)
}

hand_hooks! {
    /// Ends the process without `atexit` handlers.
    fn _exit(status: c_int) -> ! => exit_lower;
    /// The same, by its C99 name.
    fn _Exit(status: c_int) -> ! => exit_upper;
}
