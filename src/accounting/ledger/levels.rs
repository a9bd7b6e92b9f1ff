//! Live bytes and counts and their peaks (the process's, each entry point's, each callsite's):
//! where they are kept, and the moves of pinned bytes in and out of them.

use super::blocks::{add, mine};
use super::events::timeline_tick;
use super::first_count::touch;
use crate::accounting::callsite::Callsite;
use crate::accounting::level::Level;
use crate::api::Api;
use crate::runtime::guard::Thread;
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};

/// Live bytes and counts, and their peaks: the process's and each entry point's. In the state
/// file once there is one (`use_levels`); until then, and where there is none, here.
#[repr(C)]
pub struct Levels {
    pub(super) total: Level<16>,
    pub(super) apis: [Level<16>; Api::COUNT],
}
pub(super) static OWN_LEVELS: Levels = Levels {
    total: Level::NEW,
    apis: [const { Level::NEW }; Api::COUNT],
};
pub(super) static LEVELS: AtomicPtr<Levels> =
    AtomicPtr::new(&OWN_LEVELS as *const Levels as *mut Levels);

#[inline(always)]
pub(super) fn levels() -> &'static Levels {
    // SAFETY: `LEVELS` points at `OWN_LEVELS` or at levels in the arena, which stay mapped for
    // the process's life (a fork child points back at `OWN_LEVELS` before it lets go of them).
    unsafe { &*LEVELS.load(Relaxed) }
}

/// The arena placed the levels at `p` (zeroed, `Levels`' size and alignment), before anything
/// was counted: from now on they are counted there.
pub fn use_levels(p: *mut u8) {
    LEVELS.store(p as *mut Levels, Relaxed);
}

/// Moves pinned bytes in or out of the live figures (every level: process, API, callsite).
/// `now_ms` is the hooked call's coarse clock reading (`Live::unix_ms`).
#[inline]
pub fn live_delta(
    t: &Thread,
    api: Api,
    site: &'static Callsite,
    bytes: i64,
    count: i64,
    now_ms: u64,
) {
    let slot = mine(t).slot;
    levels().total.live_ticked(slot, bytes, count);
    levels().apis[api as usize].live(slot, bytes, count);
    site.level.live(slot, bytes, count);
    timeline_tick(now_ms, api);
}

/// A successful pinning call of `bytes` new pinned bytes, now live: `count_alloc` and
/// `live_delta` in one pass over the levels (the path every pinning call takes).
#[inline]
pub fn alloc_live(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, now_ms: u64) {
    touch();
    let m = mine(t);
    let slot = m.slot; // read once: the stores below could be to it, as far as the compiler knows
    add(&m.totals.alloc_count, 1);
    add(&m.totals.alloc_bytes, bytes);
    let levels = levels();
    levels.total.grow_ticked(slot, bytes);
    levels.apis[api as usize].alloc_live(slot, bytes);
    site.level.alloc_live(slot, bytes);
    site.note_api(api);
    timeline_tick(now_ms, api);
}

/// A pinned record of `bytes` released: `live_delta` of minus its bytes and one allocation,
/// without the peak's checks, which a release never needs.
#[inline(never)]
pub fn live_release(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, now_ms: u64) {
    let slot = mine(t).slot;
    let levels = levels();
    levels.total.release_ticked(slot, bytes);
    levels.apis[api as usize].release(slot, bytes);
    site.level.release(slot, bytes);
    timeline_tick(now_ms, api);
}
