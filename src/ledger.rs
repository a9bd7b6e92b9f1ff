//! What is pinned right now and what happened so far: live allocations, locked ranges, the
//! process, per-API and per-callsite counters, events and the timeline.
//!
//! Hooks never touch this directly; `track` turns each hooked call into these records.

use crate::api::Api;
use crate::callsite::Callsite;
use crate::guard;
use crate::ranges::RangeSet;
use crate::lock::{self, Mutex, MutexGuard};
use pinguard_report::{ApiStats, EventKind, Totals};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};

#[derive(Clone, Copy)]
pub struct Live {
    pub size: u64,
    pub api: Api,
    pub downgraded: bool,
    pub tid: u32,
    pub unix_ms: u64,
    pub site: &'static Callsite,
}

impl Live {
    pub fn new(api: Api, size: u64, site: &'static Callsite, downgraded: bool) -> Live {
        Live { size, api, downgraded, tid: guard::tid(), unix_ms: guard::coarse_unix_ms(), site }
    }
}

/// Event counters. Each thread adds to one of `STRIPES` copies (by thread id) and readers sum
/// them: two threads pinning at once then write no common cache line for these.
struct Counters {
    live_count: AtomicI64,
    alloc_count: AtomicU64,
    alloc_bytes: AtomicU64,
    release_count: AtomicU64,
    failed_count: AtomicU64,
    denied_count: AtomicU64,
    denied_bytes: AtomicU64,
    downgraded_count: AtomicU64,
    downgraded_bytes: AtomicU64,
    downgraded_live_bytes: AtomicI64,
    over_budget_count: AtomicU64,
    unknown_release_count: AtomicU64,
}

struct ApiCounters {
    alloc_count: AtomicU64,
    alloc_bytes: AtomicU64,
    live_count: AtomicI64,
    failed_count: AtomicU64,
    denied_count: AtomicU64,
    downgraded_count: AtomicU64,
    unknown_release_count: AtomicU64,
}

macro_rules! zeroed {
    ($ty:ident { $($f:ident),* }) => { $ty { $($f: Zero::ZERO),* } };
}

trait Zero {
    const ZERO: Self;
}
impl Zero for AtomicU64 {
    const ZERO: Self = AtomicU64::new(0);
}
impl Zero for AtomicI64 {
    const ZERO: Self = AtomicI64::new(0);
}

const STRIPES: usize = 16;

#[repr(align(128))]
struct Stripe {
    totals: Counters,
    apis: [ApiCounters; Api::COUNT],
}

#[allow(clippy::declare_interior_mutable_const)]
const STRIPE: Stripe = Stripe {
    totals: zeroed!(Counters {
        live_count, alloc_count, alloc_bytes, release_count, failed_count, denied_count, denied_bytes,
        downgraded_count, downgraded_bytes, downgraded_live_bytes, over_budget_count, unknown_release_count
    }),
    apis: [const { zeroed!(ApiCounters { alloc_count, alloc_bytes, live_count, failed_count, denied_count, downgraded_count, unknown_release_count }) }; Api::COUNT],
};

static STRIPED: [Stripe; STRIPES] = [STRIPE; STRIPES];

/// This thread's stripe.
fn mine() -> &'static Stripe {
    &STRIPED[guard::tid() as usize % STRIPES]
}

/// Sums one counter over the stripes.
fn sum<T: Copy + Into<i128>>(f: impl Fn(&'static Stripe) -> T) -> i128 {
    STRIPED.iter().map(|s| f(s).into()).sum()
}

/// Live bytes and their peak: one copy that every thread updates, since a peak is exact only
/// over one running sum.
#[repr(align(128))]
struct Level {
    live_bytes: AtomicI64,
    peak_live_bytes: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const LEVEL: Level = Level { live_bytes: AtomicI64::new(0), peak_live_bytes: AtomicU64::new(0) };
static TOTAL_LEVEL: Level = LEVEL;
static API_LEVEL: [Level; Api::COUNT] = [LEVEL; Api::COUNT];

/// Set once anything was counted: a process that pins nothing writes no report.
static TOUCHED: AtomicBool = AtomicBool::new(false);

const SHARDS: usize = 64;
/// One cache line (two, with the adjacent-line prefetcher) per shard: threads on different shards
/// must not share a line.
#[repr(align(128))]
struct Shard(Mutex<Option<FxHashMap<usize, Live>>>);
impl std::ops::Deref for Shard {
    type Target = Mutex<Option<FxHashMap<usize, Live>>>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
static LIVE: [Shard; SHARDS] = [const { Shard(Mutex::new(None)) }; SHARDS];

fn shard(addr: usize) -> &'static Shard {
    // Allocations are at least 16-byte aligned and usually page-aligned; mix the bits so
    // neighbouring pages spread over the shards.
    let h = (addr as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    &LIVE[(h >> 58) as usize % SHARDS]
}

/// The locking family's live pages, keyed by address; the `mlockall` entry sits beside them.
pub struct Locked {
    pub ranges: RangeSet<Live>,
    pub mlockall: Option<Live>,
}

static LOCKED: Mutex<Option<Locked>> = Mutex::new(None);
/// Lets `munmap` and `mmap(MAP_FIXED)` skip the lock while nothing is locked.
static LOCKED_ANY: AtomicBool = AtomicBool::new(false);

pub struct LockedGuard(MutexGuard<'static, Option<Locked>>);

impl std::ops::Deref for LockedGuard {
    type Target = Locked;
    fn deref(&self) -> &Locked {
        self.0.as_ref().expect("initialised in locked()")
    }
}

impl std::ops::DerefMut for LockedGuard {
    fn deref_mut(&mut self) -> &mut Locked {
        self.0.as_mut().expect("initialised in locked()")
    }
}

impl Drop for LockedGuard {
    fn drop(&mut self) {
        let l = self.0.as_ref().expect("initialised in locked()");
        LOCKED_ANY.store(!l.ranges.is_empty() || l.mlockall.is_some(), Relaxed);
    }
}

pub fn locked() -> LockedGuard {
    let mut g = LOCKED.lock();
    g.get_or_insert_with(|| Locked { ranges: RangeSet::default(), mlockall: None });
    LockedGuard(g)
}

pub fn locked_any() -> bool {
    LOCKED_ANY.load(Relaxed)
}

/// Moves pinned bytes in or out of the live figures (every level: process, API, callsite).
pub fn live_delta(api: Api, site: &'static Callsite, bytes: i64, count: i64) {
    let now = TOTAL_LEVEL.live_bytes.fetch_add(bytes, Relaxed) + bytes;
    let level = &API_LEVEL[api as usize];
    let api_now = level.live_bytes.fetch_add(bytes, Relaxed) + bytes;
    if bytes > 0 {
        raise(&TOTAL_LEVEL.peak_live_bytes, now);
        raise(&level.peak_live_bytes, api_now);
    }
    let m = mine();
    m.totals.live_count.fetch_add(count, Relaxed);
    m.apis[api as usize].live_count.fetch_add(count, Relaxed);
    site.add_live(bytes, count);
    timeline_tick(now.max(0) as u64);
}

/// Raises a peak to `now`. A load first: a peak that is not being raised stays a shared cache
/// line that no thread writes.
#[inline]
pub fn raise(peak: &AtomicU64, now: i64) {
    let now = now.max(0) as u64;
    if now > peak.load(Relaxed) {
        peak.fetch_max(now, Relaxed);
    }
}

/// A successful pinning call of `bytes` new pinned bytes.
pub fn count_alloc(api: Api, site: &'static Callsite, bytes: u64) {
    touch();
    let m = mine();
    m.totals.alloc_count.fetch_add(1, Relaxed);
    m.totals.alloc_bytes.fetch_add(bytes, Relaxed);
    let a = &m.apis[api as usize];
    a.alloc_count.fetch_add(1, Relaxed);
    a.alloc_bytes.fetch_add(bytes, Relaxed);
    site.alloc_count.fetch_add(1, Relaxed);
    site.alloc_bytes.fetch_add(bytes, Relaxed);
    site.note_api(api);
}

pub fn count_release() {
    mine().totals.release_count.fetch_add(1, Relaxed);
}

pub fn count_failed(api: Api) {
    touch();
    let m = mine();
    m.totals.failed_count.fetch_add(1, Relaxed);
    m.apis[api as usize].failed_count.fetch_add(1, Relaxed);
}

pub fn count_unknown_release(api: Api) {
    touch();
    let m = mine();
    m.totals.unknown_release_count.fetch_add(1, Relaxed);
    m.apis[api as usize].unknown_release_count.fetch_add(1, Relaxed);
}

pub fn count_denied(api: Api, site: &'static Callsite, bytes: u64) {
    touch();
    let m = mine();
    m.totals.denied_count.fetch_add(1, Relaxed);
    m.totals.denied_bytes.fetch_add(bytes, Relaxed);
    m.apis[api as usize].denied_count.fetch_add(1, Relaxed);
    site.denied_count.fetch_add(1, Relaxed);
    site.note_api(api);
    crate::group::note_denied();
    event(EventKind::Denied, api, bytes, site);
}

/// A call served with pageable memory (or left unpinned) instead of pinned memory.
pub fn count_downgraded(api: Api, site: &'static Callsite, bytes: u64) {
    touch();
    let m = mine();
    m.totals.downgraded_count.fetch_add(1, Relaxed);
    m.totals.downgraded_bytes.fetch_add(bytes, Relaxed);
    m.apis[api as usize].downgraded_count.fetch_add(1, Relaxed);
    site.downgraded_count.fetch_add(1, Relaxed);
    site.note_api(api);
    crate::group::note_downgraded();
    event(EventKind::Downgraded, api, bytes, site);
}

pub fn count_over_budget(api: Api, site: &'static Callsite, bytes: u64) {
    mine().totals.over_budget_count.fetch_add(1, Relaxed);
    event(EventKind::OverBudget, api, bytes, site);
}

pub fn downgraded_live_delta(bytes: i64) {
    mine().totals.downgraded_live_bytes.fetch_add(bytes, Relaxed);
}

pub fn insert(addr: usize, live: Live) {
    shard(addr).lock().get_or_insert_with(FxHashMap::default).insert(addr, live);
}

/// Removes the record at `addr` if `accept` says the release call matches how it was taken
/// (`cudaFreeHost` does not free a `cudaHostRegister`ed range).
pub fn take(addr: usize, accept: impl Fn(Api) -> bool) -> Option<Live> {
    let mut g = shard(addr).lock();
    let map = g.as_mut()?;
    match map.get(&addr) {
        Some(l) if accept(l.api) => map.remove(&addr),
        _ => None,
    }
}

/// Marks the process as having something to report; a load first, so that the hot path does
/// not keep writing one shared cache line.
fn touch() {
    if !TOUCHED.load(Relaxed) {
        TOUCHED.store(true, Relaxed);
    }
}

pub fn touched() -> bool {
    TOUCHED.load(Relaxed)
}

pub fn live_bytes() -> u64 {
    TOTAL_LEVEL.live_bytes.load(Relaxed).max(0) as u64
}

pub fn totals() -> Totals {
    let u = |v: i128| v.max(0) as u64;
    Totals {
        live_bytes: TOTAL_LEVEL.live_bytes.load(Relaxed).max(0) as u64,
        live_count: u(sum(|s| s.totals.live_count.load(Relaxed))),
        peak_live_bytes: TOTAL_LEVEL.peak_live_bytes.load(Relaxed),
        alloc_count: u(sum(|s| s.totals.alloc_count.load(Relaxed))),
        alloc_bytes: u(sum(|s| s.totals.alloc_bytes.load(Relaxed))),
        release_count: u(sum(|s| s.totals.release_count.load(Relaxed))),
        failed_count: u(sum(|s| s.totals.failed_count.load(Relaxed))),
        denied_count: u(sum(|s| s.totals.denied_count.load(Relaxed))),
        denied_bytes: u(sum(|s| s.totals.denied_bytes.load(Relaxed))),
        downgraded_count: u(sum(|s| s.totals.downgraded_count.load(Relaxed))),
        downgraded_bytes: u(sum(|s| s.totals.downgraded_bytes.load(Relaxed))),
        downgraded_live_bytes: u(sum(|s| s.totals.downgraded_live_bytes.load(Relaxed))),
        over_budget_count: u(sum(|s| s.totals.over_budget_count.load(Relaxed))),
        unknown_release_count: u(sum(|s| s.totals.unknown_release_count.load(Relaxed))),
    }
}

/// Per-API figures for every entry point that saw any activity.
pub fn apis() -> Vec<(Api, ApiStats)> {
    Api::ALL
        .iter()
        .map(|&api| {
            let i = api as usize;
            let u = |v: i128| v.max(0) as u64;
            (
                api,
                ApiStats {
                    alloc_count: u(sum(|s| s.apis[i].alloc_count.load(Relaxed))),
                    alloc_bytes: u(sum(|s| s.apis[i].alloc_bytes.load(Relaxed))),
                    live_count: u(sum(|s| s.apis[i].live_count.load(Relaxed))),
                    live_bytes: API_LEVEL[i].live_bytes.load(Relaxed).max(0) as u64,
                    peak_live_bytes: API_LEVEL[i].peak_live_bytes.load(Relaxed),
                    failed_count: u(sum(|s| s.apis[i].failed_count.load(Relaxed))),
                    denied_count: u(sum(|s| s.apis[i].denied_count.load(Relaxed))),
                    downgraded_count: u(sum(|s| s.apis[i].downgraded_count.load(Relaxed))),
                    unknown_release_count: u(sum(|s| s.apis[i].unknown_release_count.load(Relaxed))),
                },
            )
        })
        .filter(|(_, s)| *s != ApiStats::default())
        .collect()
}

/// Every live record: allocations and registrations, locked ranges, the `mlockall` entry.
pub fn live_records() -> Vec<(usize, Live)> {
    let mut v = Vec::new();
    for s in &LIVE {
        if let Some(map) = s.lock().as_ref() {
            v.extend(map.iter().map(|(&a, &l)| (a, l)));
        }
    }
    let g = locked();
    v.extend(g.ranges.iter().map(|(s, e, l)| (s, Live { size: (e - s) as u64, ..*l })));
    if let Some(l) = g.mlockall {
        v.push((0, l));
    }
    v
}

pub struct EventRec {
    pub unix_ms: u64,
    pub kind: EventKind,
    pub api: Api,
    pub size: u64,
    pub callsite: u32,
    pub live_bytes: u64,
}

const MAX_EVENTS: usize = 10_000;
const MAX_TIMELINE: usize = 10_000;

struct Bounded<T> {
    items: VecDeque<T>,
    dropped: u64,
}

static EVENTS: Mutex<Bounded<EventRec>> = Mutex::new(Bounded { items: VecDeque::new(), dropped: 0 });
static TIMELINE: Mutex<Bounded<(u64, u64)>> = Mutex::new(Bounded { items: VecDeque::new(), dropped: 0 });
static TIMELINE_MS: AtomicU64 = AtomicU64::new(0);

fn event(kind: EventKind, api: Api, size: u64, site: &'static Callsite) {
    let rec = EventRec { unix_ms: guard::unix_ms(), kind, api, size, callsite: site.id, live_bytes: live_bytes() };
    let mut e = EVENTS.lock();
    if e.items.len() >= MAX_EVENTS {
        e.items.pop_front();
        e.dropped += 1;
    }
    e.items.push_back(rec);
}

/// One point per millisecond at most: the lock is taken at most a thousand times a second however
/// hot the allocation loop is; `timeline_now` adds the final value when a report is written.
fn timeline_tick(live: u64) {
    let now = guard::coarse_unix_ms();
    let last = TIMELINE_MS.load(Relaxed);
    if now <= last || TIMELINE_MS.compare_exchange(last, now, Relaxed, Relaxed).is_err() {
        return;
    }
    push_point(now, live);
}

fn push_point(now: u64, live: u64) {
    let mut t = TIMELINE.lock();
    if let Some(back) = t.items.back_mut() {
        if back.0 >= now {
            back.1 = live;
            return;
        }
    }
    if t.items.len() >= MAX_TIMELINE {
        t.items.pop_front();
        t.dropped += 1;
    }
    t.items.push_back((now, live));
}

pub fn timeline_now() {
    push_point(guard::unix_ms(), live_bytes());
}

pub fn events() -> (Vec<EventRec>, u64) {
    let e = EVENTS.lock();
    (
        e.items
            .iter()
            .map(|r| EventRec { unix_ms: r.unix_ms, kind: r.kind, api: r.api, size: r.size, callsite: r.callsite, live_bytes: r.live_bytes })
            .collect(),
        e.dropped,
    )
}

pub fn timeline() -> (Vec<(u64, u64)>, u64) {
    let t = TIMELINE.lock();
    (t.items.iter().copied().collect(), t.dropped)
}

/// Fork support: take every lock of the ledger so the child inherits none held.
pub fn lock_all() {
    for s in &LIVE {
        lock::hold(s);
    }
    lock::hold(&LOCKED);
    lock::hold(&EVENTS);
    lock::hold(&TIMELINE);
}

/// # Safety
/// Only after `lock_all` on this thread. With `clear` (the child), the ledger starts empty:
/// pinned memory and `mlock` locks are not inherited across `fork`.
pub unsafe fn unlock_all(clear: bool) {
    if clear {
        for s in &LIVE {
            *s.data_ptr() = None;
        }
        *LOCKED.data_ptr() = None;
        LOCKED_ANY.store(false, Relaxed);
        *EVENTS.data_ptr() = Bounded { items: VecDeque::new(), dropped: 0 };
        *TIMELINE.data_ptr() = Bounded { items: VecDeque::new(), dropped: 0 };
        TIMELINE_MS.store(0, Relaxed);
        reset_counters();
    }
    for s in &LIVE {
        if clear { lock::release_in_child(s) } else { lock::release_in_parent(s) }
    }
    if clear {
        lock::release_in_child(&LOCKED);
        lock::release_in_child(&EVENTS);
        lock::release_in_child(&TIMELINE);
    } else {
        lock::release_in_parent(&LOCKED);
        lock::release_in_parent(&EVENTS);
        lock::release_in_parent(&TIMELINE);
    }
}

fn reset_counters() {
    for st in &STRIPED {
        let t = &st.totals;
        for c in [&t.live_count, &t.downgraded_live_bytes] {
            c.store(0, Relaxed);
        }
        for c in [
            &t.alloc_count, &t.alloc_bytes, &t.release_count, &t.failed_count, &t.denied_count, &t.denied_bytes,
            &t.downgraded_count, &t.downgraded_bytes, &t.over_budget_count, &t.unknown_release_count,
        ] {
            c.store(0, Relaxed);
        }
        for a in &st.apis {
            a.live_count.store(0, Relaxed);
            for c in [&a.alloc_count, &a.alloc_bytes, &a.failed_count, &a.denied_count, &a.downgraded_count, &a.unknown_release_count] {
                c.store(0, Relaxed);
            }
        }
    }
    for l in std::iter::once(&TOTAL_LEVEL).chain(API_LEVEL.iter()) {
        l.live_bytes.store(0, Relaxed);
        l.peak_live_bytes.store(0, Relaxed);
    }
    TOUCHED.store(false, Relaxed);
}
