//! The event counters: allocations, releases, failures, refusals, downgrades, calls passed
//! through untracked.

use super::blocks::{add, mine};
use super::events::event_with;
use super::first_count::{touch, TOUCHED};
use super::levels::levels;
use super::over::Over;
use crate::accounting::callsite::Callsite;
use crate::api::Api;
use crate::runtime::guard::Thread;
use crate::runtime::room::Room;
use pinguard_common::EventKind;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Locking calls (`mlock`, `mlock2`, `mlockall`, `mmap` with `MAP_LOCKED`) that arrived while
/// their thread was already inside pinguard (a signal handler that interrupted a hook): passed
/// straight through, uncounted elsewhere. One relaxed add: no allocation, no lock.
pub(super) static UNTRACKED: AtomicU64 = AtomicU64::new(0);

/// From a signal handler that interrupted pinguard on its thread: only the flag, without telling
/// `on_first_count`'s function, which may allocate (the exit report tells it instead).
#[inline]
pub fn count_untracked() {
    UNTRACKED.fetch_add(1, Relaxed);
    if !TOUCHED.load(Relaxed) {
        TOUCHED.store(true, Relaxed);
    }
}

/// A successful pinning call of `bytes` new pinned bytes.
#[inline]
pub fn count_alloc(t: &Thread, api: Api, site: &'static Callsite, bytes: u64) {
    touch();
    let m = mine(t);
    add(&m.totals.alloc_count, 1);
    add(&m.totals.alloc_bytes, bytes);
    levels().apis[api as usize].alloc(m.slot, bytes);
    site.level.alloc(m.slot, bytes);
    site.note_api(api);
}

#[inline]
pub fn count_release(t: &Thread) {
    add(&mine(t).totals.release_count, 1);
}

pub fn count_failed(t: &Thread, api: Api) {
    touch();
    let m = mine(t);
    add(&m.totals.failed_count, 1);
    add(&m.apis[api as usize].failed_count, 1);
}

/// A pinning call the runtime or the kernel failed, with an event saying what room it had.
pub fn count_failed_at(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, room: Room) {
    count_failed(t, api);
    site.note_api(api);
    event_with(EventKind::Failed, api, bytes, site, None, false, Some(room));
}

pub fn count_unknown_release(t: &Thread, api: Api) {
    touch();
    let m = mine(t);
    add(&m.totals.unknown_release_count, 1);
    add(&m.apis[api as usize].unknown_release_count, 1);
}

/// How a call over a limit was answered: each outcome is one set of counters and one event kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Refused with the API's own code.
    Denied,
    /// Refused under `downgrade`, the callsite being outside `PINGUARD_DOWNGRADE_MATCH`: the
    /// event says so.
    DeniedOutOfScope,
    /// Served with pageable memory (or left unpinned) instead of pinned memory.
    Downgraded,
    /// Pinned over the budget under `warn`.
    OverBudget,
}

/// A call over a limit, answered as `outcome`, in the process's, the entry point's and the
/// callsite's figures, and its event (with the room it was decided in, where there was one).
pub fn count_outcome(
    t: &Thread,
    outcome: Outcome,
    api: Api,
    site: &'static Callsite,
    bytes: u64,
    over: Over,
    room: Option<Room>,
) {
    touch();
    let m = mine(t);
    let kind = match outcome {
        Outcome::Denied | Outcome::DeniedOutOfScope => {
            add(&m.totals.denied_count, 1);
            add(&m.totals.denied_bytes, bytes);
            add(&m.apis[api as usize].denied_count, 1);
            site.denied_count.fetch_add(1, Relaxed);
            site.denied_bytes.fetch_add(bytes, Relaxed);
            EventKind::Denied
        }
        Outcome::Downgraded => {
            add(&m.totals.downgraded_count, 1);
            add(&m.totals.downgraded_bytes, bytes);
            add(&m.apis[api as usize].downgraded_count, 1);
            site.downgraded_count.fetch_add(1, Relaxed);
            site.downgraded_bytes.fetch_add(bytes, Relaxed);
            EventKind::Downgraded
        }
        Outcome::OverBudget => {
            add(&m.totals.over_budget_count, 1);
            site.over_budget_count.fetch_add(1, Relaxed);
            EventKind::OverBudget
        }
    };
    over.count(m);
    site.note_api(api);
    let out_of_scope = outcome == Outcome::DeniedOutOfScope;
    event_with(kind, api, bytes, site, Some(over), out_of_scope, room);
}

pub fn downgraded_live_delta(t: &Thread, bytes: i64) {
    add(&mine(t).totals.downgraded_live_bytes, bytes as u64); // two's complement: read as signed
}
