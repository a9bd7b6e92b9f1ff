//! The C API declared in `include/pinguard.h`.

use crate::accounting::ledger;
use crate::lifecycle;
use crate::output::report;
use crate::runtime::guard::{self, Reentry};
use pinguard_common::Reason;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::path::Path;

/// The copy of pinguard in charge's own export of this C API function when this copy stands down
/// (`runtime::copies`): its answer is the process's, this one's would be nothing.
macro_rules! forward {
    ($name:literal($($arg:expr),*) as $ty:ty) => {
        if let Some(f) = crate::runtime::copies::in_charge_export($name) {
            // SAFETY: `f` is the other copy's definition of this very C API function, whose C type
            // is `$ty` (`pinguard.h`); the arguments are the C caller's, under that contract.
            return unsafe { std::mem::transmute::<usize, $ty>(f)($($arg),*) };
        }
    };
}

/// Writes a report now (reason `request`) to `path`, or to `PINGUARD_REPORT` when `path` is NULL.
/// Returns 0 on success, -1 on failure (pinguard disabled, unwritable path).
#[no_mangle]
pub unsafe extern "C" fn pinguard_write_report(path: *const c_char) -> c_int {
    forward!(c"pinguard_write_report"(path) as unsafe extern "C" fn(*const c_char) -> c_int);
    let Some(_r) = Reentry::enter() else {
        return -1;
    };
    let e = guard::errno();
    let rc = std::panic::catch_unwind(|| {
        let Some(cfg) = lifecycle::ensure_init(_r.thread()) else {
            return -1;
        };
        crate::track::wire();
        let p = if path.is_null() {
            None
        } else {
            Some(
                // SAFETY: not null, so a NUL-terminated path (the C API's contract, `pinguard.h`).
                unsafe { CStr::from_ptr(path) }
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        match report::write(cfg, Reason::Request, p.as_deref().map(Path::new)) {
            Ok(_) => 0,
            Err(msg) => {
                tracing::warn!("pinguard_write_report: {msg}");
                -1
            }
        }
    })
    .unwrap_or(-1);
    guard::set_errno(e);
    rc
}

/// The path of this process's report (where the exit report will go) as a NUL-terminated string
/// in `buf` (truncated to `size - 1` bytes). Returns the path's full length, as `snprintf` does,
/// or -1 when pinguard is disabled or the process is setuid.
#[no_mangle]
pub unsafe extern "C" fn pinguard_common_path(buf: *mut c_char, size: usize) -> isize {
    forward!(
        c"pinguard_common_path"(buf, size) as unsafe extern "C" fn(*mut c_char, usize) -> isize
    );
    let Some(_r) = Reentry::enter() else {
        return -1;
    };
    let e = guard::errno();
    let rc = std::panic::catch_unwind(|| {
        if lifecycle::ensure_init(_r.thread()).is_none() || crate::runtime::kernel::secure_mode() {
            return -1;
        }
        let p = report::path();
        let bytes = p.as_os_str().as_encoded_bytes();
        if !buf.is_null() && size > 0 {
            let n = bytes.len().min(size - 1);
            // SAFETY: `buf` is not null, so writable for `size` bytes (the C API's contract), and
            // `n < size`: the copy and its NUL fit. `bytes` is our own string, apart from `buf`.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
                *buf.add(n) = 0;
            }
        }
        bytes.len() as isize
    })
    .unwrap_or(-1);
    guard::set_errno(e);
    rc
}

/// Pinned bytes live right now (downgraded memory excluded). The locked pages are first compared
/// with the kernel's `VmLck` (one read of `/proc/self/status`; the mappings are walked only when
/// they differ), so what this returns for them is what the kernel has locked, including changes
/// pinguard could not see (glibc's own `munmap` of a freed block). The same read's `VmPin` updates
/// the kernel-pinned bytes no record explains (the report's `totals.kernel_pinned_bytes`): not in
/// this figure, but counted against the budget.
#[no_mangle]
pub extern "C" fn pinguard_live_bytes() -> u64 {
    forward!(c"pinguard_live_bytes"() as extern "C" fn() -> u64);
    if let Some(r) = Reentry::enter() {
        let t = r.thread();
        let e = t.errno();
        let _ = std::panic::catch_unwind(|| {
            if let Some(c) = lifecycle::ensure_init(t) {
                let locked = c.hooks & crate::api::Family::Mlock.bit() != 0;
                crate::track::kernel_truth(t, locked);
            }
        });
        t.set_errno(e);
    }
    ledger::live_bytes()
}

/// The most pinned bytes live at any moment so far (downgraded memory excluded): the report's
/// `totals.peak_live_bytes`, the figure a node's memory has to hold. Locked pages are first
/// matched with the kernel's, as for `pinguard_live_bytes`.
#[no_mangle]
pub extern "C" fn pinguard_peak_bytes() -> u64 {
    forward!(c"pinguard_peak_bytes"() as extern "C" fn() -> u64);
    let _ = pinguard_live_bytes();
    ledger::totals().peak_live_bytes
}

/// Starts a peak window: from now, `pinguard_peak_window_bytes` answers the most pinned bytes
/// live since this call (the live bytes now at first), while `pinguard_peak_bytes` and the
/// report keep the whole process's peak. For a test's own peak (the pytest plugin's
/// `limit_pinned`): exact when one thread pins at a time, as the process's peak is.
#[no_mangle]
pub extern "C" fn pinguard_peak_window_start() {
    forward!(c"pinguard_peak_window_start"() as extern "C" fn());
    let _ = pinguard_live_bytes();
    let _ = std::panic::catch_unwind(ledger::restart_window);
}

/// The most pinned bytes live since the last `pinguard_peak_window_start` (since the start of
/// the process before any), locked pages matched with the kernel's first.
#[no_mangle]
pub extern "C" fn pinguard_peak_window_bytes() -> u64 {
    forward!(c"pinguard_peak_window_bytes"() as extern "C" fn() -> u64);
    let _ = pinguard_live_bytes();
    ledger::window_peak()
}

/// The library's version, a static string.
#[no_mangle]
pub extern "C" fn pinguard_version() -> *const c_char {
    forward!(c"pinguard_version"() as extern "C" fn() -> *const c_char);
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}
