//! The locking family's view of the locked pages, kept in line with the kernel's.

use super::levels::live_delta;
use super::live::{Backing, Live, LIVE};
use crate::accounting::callsite::Callsite;
use crate::accounting::ranges::{RangeSet, Stamp};
use crate::api::Api;
use crate::runtime::guard::Thread;
use crate::runtime::lock::{Mutex, MutexGuard};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// The locking family's live pages, keyed by address: the kernel's locked mappings as pinguard
/// knows them, each page attributed to the call that locked it (`mlockall`'s pages to it).
///
/// The kernel is the truth (`VmLck`). Hooked calls keep the view exact; what pinguard cannot see
/// (glibc's own `munmap` of a freed block and `mremap` in `realloc`, pages locked while a signal
/// handler interrupted pinguard, a locked stack growing, `MCL_FUTURE`) is found by `check`: one
/// read of `VmLck`, and only when it differs from the view, a walk of `/proc/self/smaps` that
/// makes the view the kernel's.
pub struct LockedPages {
    pub ranges: RangeSet<Live>,
    /// The `mlockall(MCL_FUTURE)` in force: later mappings the kernel locks by itself are its.
    pub future: Option<Live>,
    /// `VmLck` minus the view right after the last walk: pages the kernel counts without showing
    /// them locked in `smaps`, or the reverse (none on the kernels tried), so that such pages do
    /// not make every check walk again.
    skew: i64,
    /// The latest `mlock` seen to fail at a hole (`note_hole`).
    hole: Option<Hole>,
}

/// An `mlock` or `mlock2` call: what a call must match to be the same one again.
#[derive(Clone, Copy)]
pub struct LockCall {
    pub api: Api,
    pub start: usize,
    pub end: usize,
    pub flags: c_int,
    pub site: &'static Callsite,
}

impl LockCall {
    #[inline(always)]
    fn same(&self, o: &LockCall) -> bool {
        self.start == o.start
            && self.end == o.end
            && self.api == o.api
            && self.flags == o.flags
            && std::ptr::eq(self.site, o.site)
    }
}

/// An `mlock` that a system call showed to stop at a hole before any page the view holds
/// unlocked, so that it changed nothing the view does not hold.
#[derive(Clone, Copy)]
struct Hole {
    call: LockCall,
    /// The bytes of the range the view holds unlocked.
    gaps: u64,
    /// The view's stamp then: the same stamp, the same gaps.
    stamp: Stamp,
    /// When the hole was seen (coarse unix ms).
    seen_ms: u64,
}

/// How long a hole seen is taken to be there still (milliseconds): a mapping that fills it
/// unseen (glibc's own `mmap`) is found by the call's answer, within this time by its next check.
const HOLE_MS: u64 = 100;

/// What a walk changed in the view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Synced {
    pub added: u64,
    pub removed: u64,
}

impl Synced {
    pub fn any(self) -> bool {
        self != Synced::default()
    }
}

impl LockedPages {
    /// Notes that `call` failed at a hole before `gaps` bytes the view holds unlocked, as a
    /// system call showed at `now` (coarse unix ms).
    pub fn note_hole(&mut self, call: LockCall, gaps: u64, now: u64) {
        self.hole = Some(Hole {
            call,
            gaps,
            stamp: self.ranges.stamp(),
            seen_ms: now,
        });
    }

    /// Whether an `mlock` was seen to fail at a hole (`hole_again` may answer).
    #[inline(always)]
    pub fn hole_noted(&self) -> bool {
        self.hole.is_some()
    }

    /// Where `call` is the one last seen to fail at a hole, less than `HOLE_MS` ago, and the view
    /// has not changed since: the bytes of its range the view holds unlocked, which the call
    /// reserves in case the hole was filled meanwhile; no system call needed to know it fails.
    pub fn hole_again(&self, call: &LockCall, now: u64) -> Option<u64> {
        let h = self.hole.as_ref()?;
        let fresh = now >= h.seen_ms && now < h.seen_ms + HOLE_MS;
        (h.call.same(call) && h.stamp == self.ranges.stamp() && fresh).then_some(h.gaps)
    }

    /// The call noted did not fail at its hole: the hole is no longer known.
    pub fn forget_hole(&mut self) {
        self.hole = None;
    }

    /// Adds `[s, e)`, a gap of the view, for `live`'s call, with the live figures. The budget is
    /// the caller's.
    pub fn add(&mut self, t: &Thread, s: usize, e: usize, live: Live, now: u64) {
        self.ranges.insert(
            s,
            e,
            Live {
                size: (e - s) as u64,
                ..live
            },
        );
        live_delta(t, live.api, live.site, (e - s) as i64, 1, now);
    }

    /// Removes `[s, e)` from the view, with the live figures; returns the bytes removed, which
    /// the caller gives back to the budget.
    pub fn cut(&mut self, t: &Thread, s: usize, e: usize, now: u64) -> u64 {
        let mut removed = 0;
        self.ranges.remove(s, e, |l, b, c| {
            live_delta(t, l.api, l.site, -(b as i64), c, now);
            removed += b;
        });
        self.pass_on(t, removed, now)
    }

    /// Of `removed` bytes the view let go of, those no other route still pins: pages a
    /// registration still holds pass to it (`shared`), counted once all along.
    #[inline(always)]
    fn pass_on(&self, t: &Thread, removed: u64, now: u64) -> u64 {
        if !super::shared::any() {
            return removed;
        }
        self.pass_on_shared(t, removed, now)
    }

    #[cold]
    #[inline(never)]
    fn pass_on_shared(&self, t: &Thread, removed: u64, now: u64) -> u64 {
        let kept = super::shared::view_changed(t, &self.ranges, now);
        (removed as i64 - kept).max(0) as u64
    }

    /// Everything unlocked (`munlockall`), with the live figures; returns the bytes removed, which
    /// the caller gives back to the budget.
    pub fn clear(&mut self, t: &Thread, now: u64) -> u64 {
        let mut removed = 0;
        self.ranges.clear(|l, b, c| {
            live_delta(t, l.api, l.site, -(b as i64), c, now);
            removed += b;
        });
        self.future = None;
        self.skew = 0;
        self.pass_on(t, removed, now)
    }

    /// Compares with the kernel and, when they differ, makes the view the kernel's (`sync`).
    /// Returns what changed, for the caller to tell the budget.
    pub fn check(
        &mut self,
        t: &Thread,
        now: u64,
        owner: impl FnMut(usize, usize) -> Option<(Api, &'static Callsite)>,
    ) -> Synced {
        match crate::runtime::kernel::vm_lck() {
            Some(kernel) => self.check_against(kernel, t, now, owner),
            None => Synced::default(),
        }
    }

    /// `check` before a refusal, which a walk can only spare by finding pages the view holds and
    /// the kernel no longer has locked. Where a runtime pins with `mlock` (`note_runtime_lock`),
    /// `VmLck` moves with every runtime call, so only a kernel count below the view's own (such
    /// pages for certain) is worth a walk.
    pub fn check_before_refusal(&mut self, kernel: u64, t: &Thread, now: u64) -> Synced {
        if RUNTIME_LOCKS.load(Relaxed) && kernel >= self.ranges.bytes() {
            return Synced::default();
        }
        self.check_against(kernel, t, now, |_, _| None)
    }

    /// `check` with `VmLck` already read (`kernel`, in bytes).
    pub fn check_against(
        &mut self,
        kernel: u64,
        t: &Thread,
        now: u64,
        owner: impl FnMut(usize, usize) -> Option<(Api, &'static Callsite)>,
    ) -> Synced {
        let view = self.ranges.bytes();
        if kernel as i64 == view as i64 + self.skew {
            return Synced::default();
        }
        tracing::debug!("locked pages drifted from the kernel's: VmLck {kernel} bytes, pinguard's view {view} bytes; reading /proc/self/smaps");
        self.sync(t, now, owner)
    }

    /// Walks the kernel's mappings and makes the view match: pages no longer locked leave it,
    /// pages locked without pinguard's knowledge join it. Returns both, for the caller to tell the
    /// budget (`removed` given back, `added` taken whatever the limit: locked already); where the
    /// mappings could not be read whole, what was changed before. A new part is attributed to
    /// `owner`'s answer, else to the range it extends (a locked mapping that grew), else to the
    /// `MCL_FUTURE` call in force, else to no callsite.
    ///
    /// Pages inside a live runtime record (a runtime that pins with `mlock` inside its own hooked
    /// call, as the emulated ones do) stay that record's: counted once, not joined to the view.
    /// Once such a runtime was seen (`note_runtime_lock`), pages nobody claims are left out.
    pub fn sync(
        &mut self,
        t: &Thread,
        now: u64,
        mut owner: impl FnMut(usize, usize) -> Option<(Api, &'static Callsite)>,
    ) -> Synced {
        let mut out = Synced::default();
        let mut cur = 0usize;
        let mut runtime: Option<Vec<(usize, usize)>> = None;
        let complete = crate::runtime::kernel::for_each_vma(|v| {
            if v.start > cur {
                out.removed += self.cut(t, cur, v.start, now); // nothing mapped there
            }
            if v.locked {
                let gaps = self.ranges.gaps(v.start, v.end);
                let spans = match (&runtime, gaps.is_empty()) {
                    (_, true) => &[][..],
                    (Some(r), _) => &r[..],
                    (None, false) => &runtime.insert(runtime_spans())[..],
                };
                for (s, e) in gaps.into_iter().flat_map(|(s, e)| outside(s, e, spans)) {
                    let claimed = owner(s, e);
                    if claimed.is_none() && RUNTIME_LOCKS.load(Relaxed) {
                        // Pages nobody claims may be a runtime call's in flight, its record not
                        // yet written: never charge them to the view (the skew absorbs them).
                        continue;
                    }
                    let (api, site) = claimed
                        .or_else(|| self.ranges.adjacent(s, e).map(|l| (l.api, l.site)))
                        .or_else(|| self.future.map(|l| (l.api, l.site)))
                        .unwrap_or_else(|| (Api::Mlock, crate::accounting::callsite::empty()));
                    self.add(
                        t,
                        s,
                        e,
                        Live::new(t, api, 0, site, Backing::Pinned, now),
                        now,
                    );
                    out.added += (e - s) as u64;
                }
            } else {
                out.removed += self.cut(t, v.start, v.end, now);
            }
            cur = cur.max(v.end);
        });
        if complete {
            out.removed += self.cut(t, cur, usize::MAX, now);
        }
        if !complete {
            return out;
        }
        if let Some(kernel) = crate::runtime::kernel::vm_lck() {
            self.skew = kernel as i64 - self.ranges.bytes() as i64;
        }
        out
    }
}

pub(super) static LOCKED_PAGES: Mutex<Option<LockedPages>> = Mutex::new(None);
/// Lets `munmap` and `mmap(MAP_FIXED)` skip the lock while nothing is locked.
pub(super) static LOCKED_ANY: AtomicBool = AtomicBool::new(false);

pub struct LockedPagesGuard(MutexGuard<'static, Option<LockedPages>>);

impl std::ops::Deref for LockedPagesGuard {
    type Target = LockedPages;
    fn deref(&self) -> &LockedPages {
        self.0.as_ref().expect("initialised in locked_pages()")
    }
}

impl std::ops::DerefMut for LockedPagesGuard {
    fn deref_mut(&mut self) -> &mut LockedPages {
        self.0.as_mut().expect("initialised in locked_pages()")
    }
}

impl Drop for LockedPagesGuard {
    fn drop(&mut self) {
        let l = self.0.as_ref().expect("initialised in locked_pages()");
        LOCKED_ANY.store(!l.ranges.is_empty() || l.future.is_some(), Relaxed);
    }
}

pub fn locked_pages() -> LockedPagesGuard {
    // Interned now, before the lock, if not yet: a walk attributes pages nobody claims to it, and
    // the callsite table's lock comes before the view's in the fork handlers' order.
    crate::accounting::callsite::empty();
    let mut g = LOCKED_PAGES.lock();
    g.get_or_insert_with(|| LockedPages {
        ranges: RangeSet::default(),
        future: None,
        skew: 0,
        hole: None,
    });
    LockedPagesGuard(g)
}

pub fn locked_any() -> bool {
    LOCKED_ANY.load(Relaxed)
}

/// The page spans of every live pinned record of the runtimes, sorted: what they pinned is
/// theirs even where the kernel shows it locked.
pub(super) fn runtime_spans() -> Vec<(usize, usize)> {
    let page = crate::runtime::sys::page_size();
    let mut v = Vec::new();
    for s in &LIVE {
        // Called under the view's lock, which a fork's prepare handler takes after every shard:
        // a shard that stays busy is skipped (its pages, if locked, join the view until the next
        // walk) rather than waited for.
        let Some(map) = (0..1000).find_map(|_| {
            s.try_lock().or_else(|| {
                std::hint::spin_loop();
                None
            })
        }) else {
            continue;
        };
        v.extend(
            map.iter()
                .filter(|(_, l)| !l.downgraded())
                .filter_map(|(a, l)| {
                    crate::accounting::ranges::page_span(a, l.size as usize, page)
                }),
        );
    }
    v.extend(super::shared::spans());
    v.sort_unstable();
    v
}

/// The parts of `[s, e)` outside every span of `spans` (sorted; they may overlap each other).
pub(super) fn outside(
    s: usize,
    e: usize,
    spans: &[(usize, usize)],
) -> crate::accounting::ranges::Gaps {
    crate::accounting::ranges::uncovered(s, e, spans.iter().copied())
}

/// Set once a runtime pinned with `mlock` inside its own tracked call (the emulated runtimes do;
/// NVIDIA's pins through its driver, outside `VmLck`): from then on, locked pages of unknown origin
/// may be such a call's, in flight, and are not taken into the view.
pub(super) static RUNTIME_LOCKS: AtomicBool = AtomicBool::new(false);

#[inline]
pub fn note_runtime_lock() {
    if !RUNTIME_LOCKS.load(Relaxed) {
        RUNTIME_LOCKS.store(true, Relaxed);
    }
}

#[cfg(test)]
mod locked_tests {
    #[test]
    fn outside_runtime_spans() {
        let spans = [(0x1000, 0x3000), (0x2000, 0x2800), (0x5000, 0x6000)];
        assert_eq!(
            super::outside(0x0, 0x8000, &spans).to_vec(),
            vec![(0x0, 0x1000), (0x3000, 0x5000), (0x6000, 0x8000)]
        );
        assert_eq!(super::outside(0x2000, 0x2800, &spans).to_vec(), vec![]);
        assert_eq!(
            super::outside(0x2800, 0x5800, &spans).to_vec(),
            vec![(0x3000, 0x5000)]
        );
        assert_eq!(
            super::outside(0x7000, 0x8000, &[]).to_vec(),
            vec![(0x7000, 0x8000)]
        );
    }
}
