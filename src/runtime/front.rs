//! `libpinguard-lazy.so`, the first stage (front/front.c): a small preload that exports every
//! name this library exports and loads this library at the first call that can pin. When it
//! loaded this copy, two things it saw at the program's start stand for this copy's own: the
//! stream descriptor 2 was then (`log`), and the place among the exit handlers, which the first
//! stage took at its load and fills with this copy's exit work (`lifecycle::at_exit`).

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// The name of the first stage's record, which marks it among the loaded objects.
pub const MARK: &[u8] = b"pinguard_front";

/// front/front.c's `struct pinguard_front`, field for field.
#[repr(C)]
pub struct Front {
    version: u32,
    stderr_known: u32,
    stderr_dev: u64,
    stderr_ino: u64,
    at_exit: AtomicUsize,
}

/// The first stage that loaded this copy, when one did (set once, by `copies` at start).
static FRONT: AtomicPtr<Front> = AtomicPtr::new(std::ptr::null_mut());

/// From `copies`' first walk: the record of a first stage before this copy, which leads.
pub fn found(addr: usize) {
    if addr != 0 {
        FRONT.store(addr as *mut Front, Ordering::Release);
    }
}

fn front() -> Option<&'static Front> {
    let p = FRONT.load(Ordering::Acquire);
    // SAFETY: `p` is null or the address of the first stage's `pinguard_front`, a static of an
    // object the loader keeps (a preload), laid out as `Front`; its version is checked below.
    let f = unsafe { p.as_ref() }?;
    (f.version == 1).then_some(f)
}

/// At this copy's start: when a first stage loaded it, its exit work goes into the stage's place
/// among the exit handlers (true), and descriptor 2 is the stream it was at the program's start.
pub fn attach(at_exit: extern "C" fn()) -> bool {
    let Some(f) = front() else { return false };
    if f.stderr_known != 0 {
        crate::runtime::log::mark_stderr_as(f.stderr_dev, f.stderr_ino);
    }
    f.at_exit.store(at_exit as usize, Ordering::Release);
    true
}
