//! The fork gate: pinguard's stack walks, its scans of the loaded objects and its report writing
//! take the loader's `dl_iterate_phdr` lock, which glibc does not reset in a fork child. Those
//! sections hold the gate open; `fork` closes it (the `pthread_atfork` prepare handler) and waits
//! until no thread is inside, so the child never inherits that lock held.
//!
//! Readers count themselves in one of several padded counters (picked by thread), so threads in
//! hooks do not bounce one cache line between cores. Re-entrant on a thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const SLOTS: usize = 16;

#[repr(align(64))]
struct Slot(AtomicUsize);

static READERS: [Slot; SLOTS] = [const { Slot(AtomicUsize::new(0)) }; SLOTS];
static CLOSED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

pub struct Open(usize);

pub fn enter() -> Open {
    if DEPTH.with(|d| d.replace(d.get() + 1)) > 0 {
        return Open(usize::MAX); // already inside on this thread: a fork cannot be waiting on us yet
    }
    let slot = crate::runtime::guard::tid() as usize % SLOTS;
    loop {
        READERS[slot].0.fetch_add(1, Ordering::SeqCst);
        if !CLOSED.load(Ordering::SeqCst) {
            return Open(slot);
        }
        READERS[slot].0.fetch_sub(1, Ordering::SeqCst);
        while CLOSED.load(Ordering::Relaxed) {
            std::thread::yield_now();
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
        if self.0 != usize::MAX {
            READERS[self.0].0.fetch_sub(1, Ordering::Release);
        }
    }
}

/// `fork` prepare: no thread may enter, and every thread inside has left.
pub fn close() {
    CLOSED.store(true, Ordering::SeqCst);
    for s in &READERS {
        while s.0.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

/// `close` without waiting past `lock::spin_until`'s bound (a fork that must not wait, see
/// `lock::try_holding`): false, and the gate open again, when a thread stayed inside.
pub fn try_close() -> bool {
    CLOSED.store(true, Ordering::SeqCst);
    let drained = READERS
        .iter()
        .all(|s| crate::runtime::lock::spin_until(|| s.0.load(Ordering::SeqCst) == 0));
    if !drained {
        CLOSED.store(false, Ordering::SeqCst);
    }
    drained
}

/// `fork`'s parent (`false`) or child (`true`) handler.
pub fn reopen(child: bool) {
    if child {
        reopen_in_child()
    } else {
        reopen_in_parent()
    }
}

pub fn reopen_in_parent() {
    CLOSED.store(false, Ordering::SeqCst);
}

/// In the child, a thread of the parent's may have counted itself in just before giving way to
/// the fork; it does not exist here.
pub fn reopen_in_child() {
    for s in &READERS {
        s.0.store(0, Ordering::SeqCst);
    }
    DEPTH.with(|d| d.set(0));
    CLOSED.store(false, Ordering::SeqCst);
}
