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

pub fn count_denied(
    t: &Thread,
    api: Api,
    site: &'static Callsite,
    bytes: u64,
    over: Over,
    room: Room,
) {
    denied(t, api, site, bytes, over, false, room);
}

/// A refusal under `downgrade` of a call outside `PINGUARD_DOWNGRADE_MATCH`: its event says so.
pub fn count_denied_out_of_scope(
    t: &Thread,
    api: Api,
    site: &'static Callsite,
    bytes: u64,
    over: Over,
    room: Room,
) {
    denied(t, api, site, bytes, over, true, room);
}

pub(super) fn denied(
    t: &Thread,
    api: Api,
    site: &'static Callsite,
    bytes: u64,
    over: Over,
    out_of_scope: bool,
    room: Room,
) {
    touch();
    let m = mine(t);
    add(&m.totals.denied_count, 1);
    add(&m.totals.denied_bytes, bytes);
    add(&m.apis[api as usize].denied_count, 1);
    over.count(m);
    site.denied_count.fetch_add(1, Relaxed);
    site.denied_bytes.fetch_add(bytes, Relaxed);
    site.note_api(api);
    event_with(
        EventKind::Denied,
        api,
        bytes,
        site,
        Some(over),
        out_of_scope,
        Some(room),
    );
}

/// A call served with pageable memory (or left unpinned) instead of pinned memory.
pub fn count_downgraded(
    t: &Thread,
    api: Api,
    site: &'static Callsite,
    bytes: u64,
    over: Over,
    room: Room,
) {
    touch();
    let m = mine(t);
    add(&m.totals.downgraded_count, 1);
    add(&m.totals.downgraded_bytes, bytes);
    add(&m.apis[api as usize].downgraded_count, 1);
    over.count(m);
    site.downgraded_count.fetch_add(1, Relaxed);
    site.downgraded_bytes.fetch_add(bytes, Relaxed);
    site.note_api(api);
    event_with(
        EventKind::Downgraded,
        api,
        bytes,
        site,
        Some(over),
        false,
        Some(room),
    );
}

pub fn count_over_budget(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, over: Over) {
    touch();
    let m = mine(t);
    add(&m.totals.over_budget_count, 1);
    over.count(m);
    site.over_budget_count.fetch_add(1, Relaxed);
    site.note_api(api);
    event_with(
        EventKind::OverBudget,
        api,
        bytes,
        site,
        Some(over),
        false,
        None,
    );
}

pub fn downgraded_live_delta(t: &Thread, bytes: i64) {
    add(&mine(t).totals.downgraded_live_bytes, bytes as u64); // two's complement: read as signed
}
