//! The last events (refusals, downgrades, calls over budget) and the live bytes' timeline,
//! both bounded.

use super::figures::live_bytes;
use super::over::Over;
use crate::accounting::callsite::Callsite;
use crate::api::Api;
use crate::runtime::lock::Mutex;
use crate::runtime::room::Room;
use pinguard_report::EventKind;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub struct EventRec {
    pub unix_ms: u64,
    pub kind: EventKind,
    pub api: Api,
    pub size: u64,
    pub callsite: u32,
    pub live_bytes: u64,
    /// A refusal under `downgrade` of a callsite outside `PINGUARD_DOWNGRADE_MATCH`.
    pub out_of_scope: bool,
    /// The limit the call went over (`None`: a call the runtime or the kernel failed).
    pub over: Option<Over>,
    /// The process's room then, for a refusal, a downgrade or a failure.
    pub room: Option<Room>,
}

pub(super) const MAX_EVENTS: usize = 10_000;
pub(super) const MAX_TIMELINE: usize = 10_000;

pub(super) struct Bounded<T> {
    pub(super) items: VecDeque<T>,
    pub(super) dropped: u64,
}

pub(super) static EVENTS: Mutex<Bounded<EventRec>> = Mutex::new(Bounded {
    items: VecDeque::new(),
    dropped: 0,
});
/// A point of the timeline: the process's live bytes at `unix_ms`, and the entry point whose call
/// made the point with its own live bytes then (issue 37: a track per entry point).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub unix_ms: u64,
    pub live: u64,
    /// `None` for the point a report adds at its write.
    pub api: Option<Api>,
    pub api_live: u64,
}

pub(super) static TIMELINE: Mutex<Bounded<Point>> = Mutex::new(Bounded {
    items: VecDeque::new(),
    dropped: 0,
});
pub(super) static TIMELINE_MS: AtomicU64 = AtomicU64::new(0);

pub(super) fn event_with(
    kind: EventKind,
    api: Api,
    size: u64,
    site: &'static Callsite,
    over: Option<Over>,
    out_of_scope: bool,
    room: Option<Room>,
) {
    let rec = EventRec {
        unix_ms: crate::runtime::clock::unix_ms(),
        kind,
        api,
        size,
        callsite: site.id(),
        live_bytes: live_bytes(),
        out_of_scope,
        over,
        room,
    };
    let mut e = EVENTS.lock();
    if e.items.len() >= MAX_EVENTS {
        e.items.pop_front();
        e.dropped += 1;
    }
    e.items.push_back(rec);
}

/// One point per millisecond at most: the lock is taken at most a thousand times a second however
/// hot the allocation loop is; `timeline_now` adds the final value when a report is written.
/// The point also takes `api`'s live bytes: the call that made it moved them, so that entry
/// point's track has a point wherever the process's has one for its call.
#[inline(always)]
pub(super) fn timeline_tick(now: u64, api: Api) {
    let last = TIMELINE_MS.load(Relaxed);
    if now > last {
        tick(now, last, api);
    }
}

/// Out of the hooked call's line: once a millisecond at most.
#[cold]
#[inline(never)]
fn tick(now: u64, last: u64, api: Api) {
    if TIMELINE_MS
        .compare_exchange(last, now, Relaxed, Relaxed)
        .is_ok()
    {
        push_point(Point {
            unix_ms: now,
            live: live_bytes(),
            api: Some(api),
            api_live: super::levels::levels().apis[api as usize].bytes(),
        });
    }
}

pub(super) fn push_point(p: Point) {
    let mut t = TIMELINE.lock();
    if let Some(back) = t.items.back_mut() {
        if back.unix_ms >= p.unix_ms {
            // Same millisecond (or a racing thread's later one): one point, the latest total; an
            // entry point's reading stays with its own (a point has room for one).
            back.live = p.live;
            if p.api.is_some() && (back.api.is_none() || back.api == p.api) {
                (back.api, back.api_live) = (p.api, p.api_live);
            }
            return;
        }
    }
    if t.items.len() >= MAX_TIMELINE {
        t.items.pop_front();
        t.dropped += 1;
    }
    t.items.push_back(p);
}

pub fn timeline_now() {
    push_point(Point {
        unix_ms: crate::runtime::clock::unix_ms(),
        live: live_bytes(),
        api: None,
        api_live: 0,
    });
}

pub fn events() -> (Vec<EventRec>, u64) {
    let e = EVENTS.lock();
    (
        e.items
            .iter()
            .map(|r| EventRec {
                unix_ms: r.unix_ms,
                kind: r.kind,
                api: r.api,
                size: r.size,
                callsite: r.callsite,
                live_bytes: r.live_bytes,
                out_of_scope: r.out_of_scope,
                over: r.over,
                room: r.room,
            })
            .collect(),
        e.dropped,
    )
}

pub fn timeline() -> (Vec<Point>, u64) {
    let t = TIMELINE.lock();
    (t.items.iter().copied().collect(), t.dropped)
}
