//! `_exit` and `_Exit`: the process ends without running `atexit` handlers (Python's `os._exit`,
//! forked workers, many daemons), so the exit report is written here.

use crate::lifecycle;
use std::os::raw::c_int;

type ExitFn = unsafe extern "C" fn(c_int) -> !;

unsafe fn finish(status: c_int, f: Option<ExitFn>) -> ! {
    lifecycle::exit_report_from_exit_call();
    match f {
        Some(f) => f(status),
        None => loop {
            libc::syscall(libc::SYS_exit_group, status);
        },
    }
}

#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    finish(status, super::real!("_exit").get::<ExitFn>())
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    finish(status, super::real!("_Exit").get::<ExitFn>())
}
