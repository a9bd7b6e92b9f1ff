//! `dlclose`: the stack walker reads each object's unwind tables where the loader mapped them, so
//! it must learn that an object is gone before another can be mapped at its addresses. `dlopen`
//! is not hooked (glibc reads its caller's address); a new object shows up as a return address
//! in no known object instead (see `unwind`). The callsites with frames in the object are named
//! before it goes (see `unload`). The real functions found in it are forgotten when it goes
//! (`resolve::forget_unloaded`): a runtime loaded again, elsewhere, is looked up again.

use super::hand_hooks;
use std::os::raw::{c_int, c_void};

hand_hooks! {
    /// Unloads an object, once nothing else holds it.
    fn dlclose(handle: *mut c_void) -> c_int => close;
}

/// Finds libc's `dlclose` ahead of the first call (from the constructor): a process that never
/// pins but closes a library then maps no stack of pinguard's for the look-up.
pub fn prepare() {
    dlclose::REAL.prepare();
}

unsafe fn close(handle: *mut c_void) -> c_int {
    let Some(real) = dlclose::get() else {
        return -1;
    };
    // pinguard's own look-ups close what they opened with RTLD_NOLOAD: nothing is unloaded then.
    // In a musl process pinguard stands down and keeps nothing that an unload could outdate.
    if crate::runtime::guard::inside() || crate::runtime::dl::foreign_libc() {
        // SAFETY: `real` is libc's `dlclose`, given the C caller's handle.
        return unsafe { real(handle) };
    }
    let closing =
        crate::lifecycle::quietly_when_ready(|| crate::output::unload::before(handle)).flatten();
    // SAFETY: `real` is libc's `dlclose`, given the C caller's handle.
    let rc = unsafe { real(handle) };
    // Whether pinguard tracks or not, its exports call the functions it found by name.
    // So are the runtimes' answers about their devices: another runtime may come in its place.
    if let Some(_r) = crate::runtime::guard::Reentry::enter() {
        if crate::runtime::resolve::forget_unloaded() {
            crate::runtime::devices::forget();
        }
    }
    crate::capture::unwind::objects_removed();
    if let Some(c) = closing {
        crate::lifecycle::quietly_when_ready(|| crate::output::unload::after(c));
    }
    rc
}
