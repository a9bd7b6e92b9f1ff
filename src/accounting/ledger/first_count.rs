//! Whether anything was counted yet: the process that pins nothing writes no report, and the
//! composition layer is told of the first count.

use crate::runtime::guard;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Set once anything was counted: a process that pins nothing writes no report.
pub(super) static TOUCHED: AtomicBool = AtomicBool::new(false);

/// Marks the process as having something to report; a load first, so that the hot path does
/// not keep writing one shared cache line.
#[inline]
pub(super) fn touch() {
    if !TOUCHED.load(Relaxed) {
        first_touch();
    }
}

/// Told once per process (and again in a fork child, whose counters start from nothing) when the
/// first thing is counted: the composition layer prints what it held back until the process
/// turned out to pin (`on_first_count`).
pub(super) static FIRST_COUNT: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// `f` runs when this process first counts anything (a pin, a refusal, a downgrade, a failure...),
/// on the counting thread, inside pinguard, from wherever the count is made (possibly under the
/// locked-page view's lock): it must take none of the locks the fork handlers take before the
/// ledger's.
pub fn on_first_count(f: fn()) {
    let _ = FIRST_COUNT.set(f);
}

/// On pinguard's own stack: the composition layer's function may print.
#[cold]
#[inline(never)]
pub(super) fn first_touch() {
    // One thread wins the flag; the others go on counting without waiting for it.
    if !TOUCHED.swap(true, Relaxed) {
        if let Some(f) = FIRST_COUNT.get() {
            crate::runtime::workstack::run(guard::here(), f);
        }
    }
}

pub fn touched() -> bool {
    TOUCHED.load(Relaxed)
}
