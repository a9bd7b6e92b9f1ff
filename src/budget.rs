//! The process budget: an atomic count of pinned bytes, live plus reserved by calls in flight.
//!
//! A call reserves before the real function runs and gives the reservation back if the call fails,
//! so no interleaving of threads can make the runtime hold more than the budget.

use std::sync::atomic::{AtomicU64, Ordering};

const NONE: u64 = u64::MAX;

static LIMIT: AtomicU64 = AtomicU64::new(NONE);
static USED: AtomicU64 = AtomicU64::new(0);

pub fn set_limit(limit: Option<u64>) {
    LIMIT.store(limit.unwrap_or(NONE), Ordering::Relaxed);
}

/// Whether any budget (the process's or the group's) is in force.
pub fn limited() -> bool {
    LIMIT.load(Ordering::Relaxed) != NONE || crate::group::limited()
}

/// The bytes the process budget has handed out (live plus in flight), when there is one.
pub fn reserved() -> Option<u64> {
    (LIMIT.load(Ordering::Relaxed) != NONE).then(|| USED.load(Ordering::Relaxed))
}

pub fn limit() -> Option<u64> {
    match LIMIT.load(Ordering::Relaxed) {
        NONE => None,
        l => Some(l),
    }
}

/// Takes `bytes` if they fit the process budget and the group's (when there is one).
#[inline]
pub fn try_reserve(bytes: u64) -> bool {
    if !try_reserve_process(bytes) {
        return false;
    }
    if !crate::group::reserve(bytes, false) {
        release_process(bytes);
        return false;
    }
    true
}

/// Takes `bytes` if they fit. A compare-and-swap loop rather than add-then-roll-back: two racing
/// threads near the limit must not both be refused when one of them fits.
#[inline]
fn try_reserve_process(bytes: u64) -> bool {
    let limit = LIMIT.load(Ordering::Relaxed);
    if limit == NONE {
        // No budget: nothing to refuse, whatever the size (SIZE_MAX is the runtime's to reject),
        // and nothing to count (the ledger has the live figures).
        return true;
    }
    let mut cur = USED.load(Ordering::Relaxed);
    loop {
        let Some(next) = cur.checked_add(bytes) else { return false };
        if limit != NONE && next > limit {
            return false;
        }
        match USED.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(seen) => cur = seen,
        }
    }
}

/// Takes `bytes` whatever the limit (`warn`, and what the kernel reports after `mlockall`).
pub fn force(bytes: u64) {
    if LIMIT.load(Ordering::Relaxed) != NONE {
        let _ = USED.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |c| Some(c.saturating_add(bytes)));
    }
    crate::group::reserve(bytes, true);
}

#[inline]
pub fn release(bytes: u64) {
    release_process(bytes);
    crate::group::release(bytes);
}

#[inline]
fn release_process(bytes: u64) {
    if LIMIT.load(Ordering::Relaxed) == NONE {
        return;
    }
    // Saturating: a miscount must never wrap into "everything is over budget".
    let _ = USED.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |c| Some(c.saturating_sub(bytes)));
}

pub fn reset() {
    USED.store(0, Ordering::Relaxed);
}
