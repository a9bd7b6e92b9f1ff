//! The last events (refusals, downgrades, calls over budget) and the live bytes' timeline,
//! both bounded.

use super::figures::live_bytes;
use super::over::Over;
use crate::accounting::callsite::Callsite;
use crate::api::Api;
use crate::runtime::lock::Mutex;
use crate::runtime::room::Room;
use pinguard_common::EventKind;
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
    /// A failure: how many more calls failed the same way within `REPEAT_MS` of it
    /// (`failed_again`), and when the latest did (coarse unix ms).
    pub repeats: u64,
    pub repeat_ms: u64,
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
/// made the point with its own live bytes then (issue 37: a track per entry point); and the
/// highest and lowest the process held from this point to the next (issue 46, item 7: a rise and
/// fall between two points is kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub unix_ms: u64,
    pub live: u64,
    /// `None` for the point a report adds at its write.
    pub api: Option<Api>,
    pub api_live: u64,
    pub high: u64,
    pub low: u64,
}

impl Point {
    /// This point standing for itself and `next` too (the timeline full): `next`'s reading and
    /// extremes become this point's extremes, so no highest or lowest is lost.
    fn absorb(&mut self, next: &Point) {
        self.high = self.high.max(next.high).max(next.live);
        self.low = self.low.min(next.low).min(next.live);
    }
}

pub(super) struct Timeline {
    pub(super) items: VecDeque<Point>,
    /// Points folded into their neighbours to keep the timeline bounded.
    pub(super) dropped: u64,
    /// The highest figure the points hold: the peak, once a point has caught up with it.
    pub(super) top: u64,
}

impl Timeline {
    pub(super) const EMPTY: Timeline = Timeline {
        items: VecDeque::new(),
        dropped: 0,
        top: 0,
    };
}

pub(super) static TIMELINE: Mutex<Timeline> = Mutex::new(Timeline::EMPTY);
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
        repeats: 0,
        repeat_ms: 0,
    };
    let mut e = EVENTS.lock();
    if e.items.len() >= MAX_EVENTS {
        e.items.pop_front();
        e.dropped += 1;
    }
    e.items.push_back(rec);
}

/// A failure may be counted into an event this recent (milliseconds), whose room it shares.
const REPEAT_MS: u64 = 100;

/// How far the coarse clock a hook reads may lag the one an event was stamped with.
const COARSE_LAG_MS: u64 = 10;

/// A failed call, as `failed_again` compares it with the latest event.
pub struct Failure {
    pub api: Api,
    pub site: &'static Callsite,
    pub bytes: u64,
    /// The API's answer.
    pub code: i32,
    /// The bytes the call asked for (`room::asked`).
    pub asked: Option<u64>,
    /// The process budget in force.
    pub budget: Option<u64>,
}

/// Counts `f` into the latest event, where that is a failure of the same call (entry point,
/// callsite, bytes, answer, bytes asked, budget) less than `REPEAT_MS` before `now` (coarse unix
/// ms): a burst of one failure (a retry loop, an `mlock` over a hole called again and again) is
/// one event with its count and shares one reading of the kernel's figures, where each would
/// otherwise read `/proc/self/status` (about 20 us, 40 times the failing call: issue 44 item 7)
/// and push 10,000 other events out of the list. Whether it did (the counters are the caller's).
pub fn failed_again(f: &Failure, now: u64) -> bool {
    let mut e = EVENTS.lock();
    e.items
        .back_mut()
        .is_some_and(|last| count_into(last, f, now))
}

/// `failed_again` for the latest event `last`.
fn count_into(last: &mut EventRec, f: &Failure, now: u64) -> bool {
    let Some(room) = last.room else {
        return false;
    };
    let same = last.kind == EventKind::Failed
        && last.api == f.api
        && last.callsite == f.site.id()
        && last.size == f.bytes
        && room.code == Some(f.code)
        && room.asked == f.asked
        && room.budget == f.budget;
    let recent = now + COARSE_LAG_MS >= last.unix_ms && now < last.unix_ms + REPEAT_MS;
    if !(same && recent) {
        return false;
    }
    last.repeats += 1;
    // The coarse clock may read a little before the event's own stamp.
    last.repeat_ms = last.repeat_ms.max(now).max(last.unix_ms);
    true
}

/// One point per tick of the coarse clock at most: the lock is taken at most a thousand times a
/// second however hot the allocation loop is; `timeline_now` adds the final value when a report is
/// written. The process's level keeps each tick's highest and lowest meanwhile
/// (`Level::take_tick`), which the point before this one takes, so a rise and fall within a tick
/// is not lost. The point also takes `api`'s live bytes: the call that made it moved them, so that
/// entry point's track has a point wherever the process's has one for its call.
#[inline(always)]
pub(super) fn timeline_tick(now: u64, api: Api) {
    let last = TIMELINE_MS.load(Relaxed);
    if now > last {
        tick(now, last, api);
    }
}

/// Out of the hooked call's line: once a tick at most.
#[cold]
#[inline(never)]
fn tick(now: u64, last: u64, api: Api) {
    if TIMELINE_MS
        .compare_exchange(last, now, Relaxed, Relaxed)
        .is_ok()
    {
        push_point(now, Some(api));
    }
}

/// A point at `now`: the process's live bytes, the tick's extremes to the point before it.
fn push_point(now: u64, api: Option<Api>) {
    let levels = super::levels::levels();
    let mut t = TIMELINE.lock();
    // Read under the lock: the points' extremes follow one another in the order taken.
    let crate::accounting::level::Tick {
        live,
        high,
        low,
        peak,
    } = levels.total.take_tick();
    let api_live = api.map_or(0, |a| levels.apis[a as usize].bytes());
    // The peak as the points must reach it: a stripe's extreme taken while another thread's call
    // was in flight can be missed; the peak never is.
    let high = if peak > t.top { peak } else { high.min(peak) };
    t.top = t.top.max(high).max(live);
    let p = Point {
        unix_ms: now,
        live,
        api,
        api_live,
        high: live,
        low: live,
    };
    if let Some(back) = t.items.back_mut() {
        back.high = back.high.max(high);
        back.low = back.low.min(low);
        if back.unix_ms >= p.unix_ms {
            // Same millisecond (or a racing thread's later one): one point, the latest total; an
            // entry point's reading stays with its own (a point has room for one).
            back.absorb(&p);
            back.live = p.live;
            if p.api.is_some() && (back.api.is_none() || back.api == p.api) {
                (back.api, back.api_live) = (p.api, p.api_live);
            }
            return;
        }
    }
    if t.items.len() >= MAX_TIMELINE {
        fold_oldest(&mut t);
    }
    t.items.push_back(p);
}

/// Halves the oldest half of a full timeline: each pair of points becomes the first, standing for
/// both (`absorb`), in place. Every extreme stays; the older the points, the coarser.
fn fold_oldest(t: &mut Timeline) {
    let pairs = t.items.len() / 4;
    for i in 0..pairs {
        let (mut a, b) = (t.items[2 * i], t.items[2 * i + 1]);
        a.absorb(&b);
        t.items[i] = a;
    }
    t.items.drain(pairs..2 * pairs);
    t.dropped += pairs as u64;
}

pub fn timeline_now() {
    push_point(crate::runtime::clock::unix_ms(), None);
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
                repeats: r.repeats,
                repeat_ms: r.repeat_ms,
            })
            .collect(),
        e.dropped,
    )
}

pub fn timeline() -> (Vec<Point>, u64) {
    let t = TIMELINE.lock();
    (t.items.iter().copied().collect(), t.dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(unix_ms: u64, live: u64) -> Point {
        Point {
            unix_ms,
            live,
            api: None,
            api_live: 0,
            high: live,
            low: live,
        }
    }

    fn failure(code: i32) -> Failure {
        Failure {
            api: Api::Mlock,
            site: crate::accounting::callsite::empty(),
            bytes: 65536,
            code,
            asked: Some(65536),
            budget: None,
        }
    }

    fn failed_event(f: &Failure, unix_ms: u64) -> EventRec {
        let room = Room {
            rlimit_memlock: None,
            rlimit_unlimited: true,
            cap_ipc_lock: false,
            vm_lck: Some(0),
            vm_pin: Some(0),
            cgroup_headroom: None,
            budget: f.budget,
            code: Some(f.code),
            asked: f.asked,
        };
        EventRec {
            unix_ms,
            kind: EventKind::Failed,
            api: f.api,
            size: f.bytes,
            callsite: f.site.id(),
            live_bytes: 0,
            out_of_scope: false,
            over: None,
            room: Some(room),
            repeats: 0,
            repeat_ms: 0,
        }
    }

    #[test]
    fn a_failure_counts_into_the_same_failures_event_for_100_ms_and_no_other() {
        let f = failure(libc::ENOMEM);
        let mut e = failed_event(&f, 1_000);
        // The coarse clock a little behind the event's stamp, then within 100 ms.
        assert!(count_into(&mut e, &f, 995));
        assert!(count_into(&mut e, &f, 1_099));
        assert_eq!((e.repeats, e.repeat_ms), (2, 1_099));
        assert!(!count_into(&mut e, &f, 1_100), "100 ms on: a new event");
        assert!(!count_into(&mut e, &f, 900), "a clock gone back");
        let other = [
            failure(libc::EAGAIN),
            Failure {
                bytes: 4096,
                ..failure(libc::ENOMEM)
            },
            Failure {
                api: Api::Mlock2,
                ..failure(libc::ENOMEM)
            },
            Failure {
                asked: None,
                ..failure(libc::ENOMEM)
            },
            Failure {
                budget: Some(1 << 20),
                ..failure(libc::ENOMEM)
            },
        ];
        for o in &other {
            assert!(
                !count_into(&mut e, o, 1_050),
                "{:?}",
                (o.api, o.bytes, o.code)
            );
        }
        let mut refused = failed_event(&f, 1_000);
        refused.kind = EventKind::Denied;
        assert!(!count_into(&mut refused, &f, 1_001), "only a failure");
        assert_eq!(e.repeats, 2);
    }

    #[test]
    fn folding_a_full_timeline_keeps_every_extreme() {
        let mut t = Timeline::EMPTY;
        let values = [5, 9, 1, 4, 7, 3, 8, 2];
        for (i, v) in values.iter().enumerate() {
            t.items.push_back(point(i as u64, *v));
        }
        fold_oldest(&mut t);
        // The oldest half, pairwise: (5, 9) and (1, 4); the rest as it was.
        let kept: Vec<(u64, u64, u64, u64)> = t
            .items
            .iter()
            .map(|p| (p.unix_ms, p.live, p.high, p.low))
            .collect();
        assert_eq!(
            kept,
            [
                (0, 5, 9, 5),
                (2, 1, 4, 1),
                (4, 7, 7, 7),
                (5, 3, 3, 3),
                (6, 8, 8, 8),
                (7, 2, 2, 2)
            ]
        );
        assert_eq!(t.dropped, 2);
    }
}
