//! `_exit` and `_Exit`: the process ends without running `atexit` handlers (Python's `os._exit`,
//! forked workers, many daemons), so the exit report is written here, by the process that owns
//! pinguard's state only (a `vfork` child calls `_exit` in its parent's memory: see
//! `lifecycle::exit_report_from_exit_call`).

use crate::lifecycle;
use crate::runtime::resolve::Real;
use std::os::raw::c_int;

type ExitFn = unsafe extern "C" fn(c_int) -> !;

fn real_exit() -> &'static Real {
    super::real!("_exit")
}

fn real_upper_exit() -> &'static Real {
    super::real!("_Exit")
}

/// Finds both real functions at start-up: a `vfork` child must not run the loader's look-up in
/// its parent's memory.
pub fn prepare() {
    let _ = real_exit().addr();
    let _ = real_upper_exit().addr();
}

unsafe fn finish(status: c_int, real: &'static Real) -> ! {
    lifecycle::exit_report_from_exit_call();
    // SAFETY: `real` is one of `real_exit`/`real_upper_exit`, both of type `ExitFn`.
    match unsafe { real.get::<ExitFn>() } {
        // SAFETY: `f` is the real exit function; any status is valid.
        Some(f) => unsafe { f(status) },
        None => loop {
            // SAFETY: `exit_group` takes a plain status and never returns.
            unsafe { libc::syscall(libc::SYS_exit_group, status) };
        },
    }
}

#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    // SAFETY: `real_exit()` names `_exit`, an `ExitFn`.
    unsafe { finish(status, real_exit()) }
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: `real_upper_exit()` names `_Exit`, an `ExitFn`.
    unsafe { finish(status, real_upper_exit()) }
}
