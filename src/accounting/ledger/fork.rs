//! Fork support: every lock of the ledger held across `fork`, and the child's ledger empty.

use super::blocks::{BLOCKS, FREE, KEY, MADE};
use super::count::UNTRACKED;
use super::events::{Bounded, Timeline, EVENTS, TIMELINE, TIMELINE_MS};
use super::first_count::TOUCHED;
use super::levels::{Levels, LEVELS, OWN_LEVELS};
use super::live::{LIVE, OVER};
use super::locked_pages::{LOCKED_ANY, LOCKED_PAGES};
use super::shared::{SHARED, SHARED_ANY};
use crate::runtime::guard;
use crate::runtime::lock;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Set by `hold` in a child made without the fork handlers whose locked-page view was held by a
/// thread it does not have (the locking family holds it across the kernel's call): the view is
/// forgotten unread (`let_go`).
static PAGES_ABANDONED: AtomicBool = AtomicBool::new(false);

/// Fork support: take every lock of the ledger so the child inherits none held.
pub fn hold() {
    for s in &LIVE {
        lock::hold(s);
    }
    PAGES_ABANDONED.store(!lock::hold_or_abandon(&LOCKED_PAGES), Relaxed);
    // Taken under the view's lock, and the live figures (the timeline's lock) under it.
    lock::hold(&SHARED);
    lock::hold(&EVENTS);
    lock::hold(&TIMELINE);
    lock::hold(&FREE);
    lock::hold(&OVER);
}

/// # Safety
/// Only after `hold` on this thread. With `clear` (the child), the ledger starts empty:
/// pinned memory and `mlock` locks are not inherited across `fork`. A lock `hold` abandoned is
/// reset here like the others: the thread that held it is not in the child.
pub unsafe fn let_go(clear: bool) {
    if clear {
        // SAFETY: `hold` took every one of these locks (the caller's contract), and the fork
        // child has no other thread: the data behind them is this thread's alone.
        unsafe {
            for s in &LIVE {
                (*s.data_ptr()).forget();
            }
            if PAGES_ABANDONED.swap(false, Relaxed) {
                // Half-changed, maybe: never read, never dropped.
                std::ptr::write(LOCKED_PAGES.data_ptr(), None);
            } else {
                *LOCKED_PAGES.data_ptr() = None;
            }
            *EVENTS.data_ptr() = Bounded {
                items: VecDeque::new(),
                dropped: 0,
            };
            *TIMELINE.data_ptr() = Timeline::EMPTY;
            *FREE.data_ptr() = Vec::new();
            *OVER.data_ptr() = Vec::new();
            *SHARED.data_ptr() = Vec::new();
        }
        LOCKED_ANY.store(false, Relaxed);
        super::kernel_pinned::forget();
        SHARED_ANY.store(false, Relaxed);
        TIMELINE_MS.store(0, Relaxed);
        reset_counters();
    }
    // SAFETY: each of these locks was taken by `hold` on this thread (the caller's contract),
    // let go of once here, in the parent or in the child as `clear` says.
    unsafe {
        lock::let_go(&FREE, clear);
        lock::let_go(&OVER, clear);
        lock::let_go(&SHARED, clear);
        for s in &LIVE {
            if clear {
                lock::let_go_in_child(s)
            } else {
                lock::let_go_in_parent(s)
            }
        }
        if clear {
            lock::let_go_in_child(&LOCKED_PAGES);
            lock::let_go_in_child(&EVENTS);
            lock::let_go_in_child(&TIMELINE);
        } else {
            lock::let_go_in_parent(&LOCKED_PAGES);
            lock::let_go_in_parent(&EVENTS);
            lock::let_go_in_parent(&TIMELINE);
        }
    }
}

/// The child's counters start from nothing: the parent's blocks (in the parent's state file,
/// which the child lets go of, or on the heap) are forgotten, and this thread adopts a new one.
pub(super) fn reset_counters() {
    BLOCKS.store(std::ptr::null_mut(), Relaxed);
    MADE.store(0, Relaxed);
    crate::accounting::level::forget_slots();
    guard::here().counters.set(std::ptr::null());
    if let Some(&Some(key)) = KEY.get() {
        if (key as usize) < guard::PTHREAD_KEY_INLINE {
            // SAFETY: our key; clearing it keeps the thread's exit from handing back a parent's block.
            unsafe { libc::pthread_setspecific(key, std::ptr::null()) };
        }
    }
    LEVELS.store(&OWN_LEVELS as *const Levels as *mut Levels, Relaxed);
    for l in std::iter::once(&OWN_LEVELS.total).chain(OWN_LEVELS.apis.iter()) {
        l.reset();
    }
    UNTRACKED.store(0, Relaxed);
    crate::runtime::workstack::forget_short();
    TOUCHED.store(false, Relaxed);
}
