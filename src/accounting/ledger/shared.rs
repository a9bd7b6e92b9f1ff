//! Ranges pinned by more than one route (issue 45 item 2): a pool `cudaHostAlloc` pinned and then
//! registered with the card, a range `mlock`ed and then `cudaHostRegister`ed. A page pinned twice
//! is pinned once, so such a range counts once, and stays counted until the last route lets go.
//!
//! A registration that overlaps what is already pinned (a live record of the runtimes' by
//! address, a member here, the locked-page view) joins this list, with the records it overlaps
//! taken out of their table. Each member is charged, in the order they joined, the bytes of its
//! range that neither the locked-page view (the kernel's truth for locked pages, reconciled on
//! its own) nor an earlier member holds: the first route shows its whole size, a later one what
//! it added. When a member leaves or the view changes, the charges are worked out again, so the
//! bytes only the leaver held go, and the rest pass to whoever still pins them. Few, and reached
//! only off the steady path: a release that finds no record of its kind in the tables, an
//! `munlock` while the list is not empty.

use super::levels::live_delta;
use super::live::{Live, LIVE};
use crate::accounting::ranges::{uncovered, RangeSet};
use crate::runtime::guard::Thread;
use crate::runtime::lock::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// One route's pin of `[start, end)`, its record kept under `key` (an address, or the handle
/// its release names); `live.size` is what it is charged.
#[derive(Clone, Copy)]
pub struct Member {
    pub key: usize,
    pub start: usize,
    pub end: usize,
    pub live: Live,
}

pub(super) static SHARED: Mutex<Vec<Member>> = Mutex::new(Vec::new());
/// Whether `SHARED` has members: the locked-page view's changes look here only then.
pub(super) static SHARED_ANY: AtomicBool = AtomicBool::new(false);

pub fn any() -> bool {
    SHARED_ANY.load(Relaxed)
}

/// The spans of the runtimes' pinned records in the tables that overlap `[start, end)` (their
/// key is their address; handles and pools are left out). Never under the locked-page view's
/// lock: a fork's prepare handler takes the tables' locks before it.
pub fn table_spans(start: usize, end: usize) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    for s in &LIVE {
        let map = s.lock();
        v.extend(
            map.iter()
                .filter(|(_, l)| !l.downgraded() && l.api.keyed_by_address())
                .map(|(a, l)| (a, a.saturating_add(l.size as usize)))
                .filter(|&(a, e)| a < end && start < e),
        );
    }
    v
}

/// The bytes of `[start, end)` already pinned by another route (the runtimes' records of
/// `table_spans`, a member, the locked-page view), and whether any route overlaps it at all.
pub fn pinned_within(
    view: Option<&RangeSet<Live>>,
    start: usize,
    end: usize,
    mut spans: Vec<(usize, usize)>,
) -> (u64, bool) {
    spans.extend(
        SHARED
            .lock()
            .iter()
            .filter(|m| m.start < end && start < m.end)
            .map(|m| (m.start, m.end)),
    );
    if let Some(view) = view {
        spans.extend(
            view.iter()
                .filter(|&(s, e, _)| s < end && start < e)
                .map(|(s, e, _)| (s, e)),
        );
    }
    if spans.is_empty() {
        return (0, false);
    }
    spans.sort_unstable();
    let free: usize = uncovered(start, end, spans)
        .iter()
        .map(|(s, e)| e - s)
        .sum();
    ((end - start - free) as u64, true)
}

/// Takes the runtimes' records that overlap `[start, end)` out of their tables, as members
/// charged their whole size, for `join`. Never under the locked-page view's lock (`table_spans`).
pub fn take_overlapped(start: usize, end: usize) -> Vec<Member> {
    let mut taken = Vec::new();
    for s in &LIVE {
        let mut map = s.lock();
        let keys: Vec<usize> = map
            .iter()
            .filter(|(_, l)| !l.downgraded() && l.api.keyed_by_address())
            .filter(|&(a, l)| a < end && start < a.saturating_add(l.size as usize))
            .map(|(a, _)| a)
            .collect();
        for a in keys {
            if let Some(l) = map.remove_if(a, |_| true) {
                taken.push(Member {
                    key: a,
                    start: a,
                    end: a.saturating_add(l.size as usize),
                    live: l,
                });
            }
        }
    }
    taken
}

/// Adds `m` (charged nothing yet) after `taken` (`take_overlapped`), and works out every charge
/// again. Returns how much the charges grew in all: what the caller takes from the budget (the
/// new member's share, unless something changed meanwhile). `m` is in its figures with one
/// allocation.
pub fn join(
    t: &Thread,
    view: Option<&RangeSet<Live>>,
    taken: Vec<Member>,
    m: Member,
    now: u64,
) -> i64 {
    let mut shared = SHARED.lock();
    shared.extend(taken);
    shared.push(Member {
        live: Live { size: 0, ..m.live },
        ..m
    });
    SHARED_ANY.store(true, Relaxed);
    live_delta(t, m.live.api, m.live.site, 0, 1, now);
    recharge(t, &mut shared, view, now)
}

/// Takes out the member under `key` that `accept` takes (the release call's kind), works out the
/// others' charges again and returns the leaver with what the charges fell by in all, which the
/// caller gives back to the budget once the runtime let go. `None`: no such member.
pub fn leave(
    t: &Thread,
    view: Option<&RangeSet<Live>>,
    key: usize,
    accept: impl Fn(&Live) -> bool,
    now: u64,
) -> Option<(Member, u64)> {
    let mut shared = SHARED.lock();
    let i = shared
        .iter()
        .position(|m| m.key == key && accept(&m.live))?;
    let gone = shared.remove(i);
    live_delta(
        t,
        gone.live.api,
        gone.live.site,
        -(gone.live.size as i64),
        -1,
        now,
    );
    let others = recharge(t, &mut shared, view, now);
    SHARED_ANY.store(!shared.is_empty(), Relaxed);
    Some((gone, (gone.live.size as i64 - others).max(0) as u64))
}

/// Puts back a member `leave` took whose release the runtime refused, charges worked out again;
/// returns how much they grew (taken from the budget again by the caller).
pub fn rejoin(t: &Thread, view: Option<&RangeSet<Live>>, m: Member, now: u64) -> i64 {
    let mut shared = SHARED.lock();
    shared.push(Member {
        live: Live { size: 0, ..m.live },
        ..m
    });
    SHARED_ANY.store(true, Relaxed);
    live_delta(t, m.live.api, m.live.site, 0, 1, now);
    recharge(t, &mut shared, view, now)
}

/// The locked-page view changed (called under its lock, with it): every member's charge worked
/// out again. Returns how much the charges grew (pages the view let go of that a member still
/// pins: the view's caller gives back only the rest).
pub fn view_changed(t: &Thread, view: &RangeSet<Live>, now: u64) -> i64 {
    let mut shared = SHARED.lock();
    recharge(t, &mut shared, Some(view), now)
}

/// Each member's charge: its range less the view's pages and every earlier member's range. The
/// changes go into the live figures; returns their sum.
fn recharge(t: &Thread, members: &mut [Member], view: Option<&RangeSet<Live>>, now: u64) -> i64 {
    let mut total = 0;
    for i in 0..members.len() {
        let (earlier, rest) = members.split_at_mut(i);
        let m = &mut rest[0];
        let mut spans: Vec<(usize, usize)> = earlier
            .iter()
            .filter(|o| o.start < m.end && m.start < o.end)
            .map(|o| (o.start, o.end))
            .collect();
        if let Some(view) = view {
            spans.extend(
                view.iter()
                    .filter(|&(s, e, _)| s < m.end && m.start < e)
                    .map(|(s, e, _)| (s, e)),
            );
        }
        spans.sort_unstable();
        let charge: usize = uncovered(m.start, m.end, spans)
            .iter()
            .map(|(s, e)| e - s)
            .sum();
        let delta = charge as i64 - m.live.size as i64;
        if delta != 0 {
            live_delta(t, m.live.api, m.live.site, delta, 0, now);
            m.live.size = charge as u64;
            total += delta;
        }
    }
    total
}

/// Every member, for the report's live records.
pub fn members() -> Vec<(usize, Live)> {
    SHARED.lock().iter().map(|m| (m.key, m.live)).collect()
}

/// The members' spans, for the locked-page walk: what they pin is theirs.
pub(super) fn spans() -> Vec<(usize, usize)> {
    SHARED.lock().iter().map(|m| (m.start, m.end)).collect()
}

/// The bytes the members made by `routes` cover, each rounded up to whole pages of `page` bytes
/// plus one for an unaligned start: what the kernel may count pinned for them (`VmPin`).
pub(super) fn span_bytes(routes: &[crate::api::Api], page: u64) -> u64 {
    SHARED
        .lock()
        .iter()
        .filter(|m| routes.contains(&m.live.api))
        .map(|m| ((m.end - m.start) as u64 + page - 1).div_ceil(page) * page)
        .fold(0, u64::saturating_add)
}
