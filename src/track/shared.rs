//! A registration of memory another route pins already (issue 45 item 2): LMCache and SGLang's
//! HiCache register with the card pools `cudaHostAlloc` pinned, DeepSpeed `mlock`s a range and
//! then `cudaHostRegister`s it. A page pinned twice is pinned once: only the bytes no route pins
//! yet go through the budget, the range counts once, and its bytes go when the last route lets
//! go (`ledger::overlap`). Off the steady path: an allocation never looks (its memory is new), a
//! release looks only when no record of its kind is in the tables.

use super::{keep, Admission, Hook, Request};
use crate::accounting::ledger::{self, overlap, Backing, LockedPagesGuard, Member, Outcome};
use crate::api::Api;
use crate::budget;

/// The locked-page view, where there is anything in it: its pages count before any route's.
fn view() -> Option<LockedPagesGuard> {
    ledger::locked_any().then(ledger::locked_pages)
}

/// A change in the charges that the budget did not see coming: more taken (locked already, so
/// whatever the limit), or fewer given back.
fn settle(delta: i64) {
    match delta {
        d if d > 0 => budget::force(d as u64),
        d if d < 0 => budget::release(d.unsigned_abs()),
        _ => {}
    }
}

/// A registration the budget did not let pin: how pinguard answered it itself.
pub(crate) enum NotPinned {
    /// Refused: the API's out-of-memory answer.
    Refused,
    /// Downgraded: left unpinned and recorded, the API's success.
    Downgraded,
}

impl Hook {
    /// Of `[addr, addr + bytes)`, the bytes another route pins already, when any route overlaps it.
    #[cold]
    pub(crate) fn pinned_by_others(&self, addr: usize, bytes: u64) -> Option<u64> {
        let end = addr.checked_add(bytes as usize)?;
        let spans = overlap::table_spans(addr, end);
        let view = view();
        let view = view.as_deref().map(|v| &v.ranges);
        let (pinned, any) = overlap::pinned_within(view, addr, end, spans);
        any.then_some(pinned)
    }

    /// The budget's answer for a registration over memory other routes pin: only `growth`, the
    /// bytes none of them pins, is asked for. Downgraded, the new part stays unpinned, as for any
    /// downgraded registration: recorded here, the runtime not called.
    pub(crate) fn admit_shared(
        &self,
        api: Api,
        addr: usize,
        growth: u64,
        site: &'static crate::accounting::callsite::Callsite,
        req: Request,
    ) -> Result<Option<budget::Reservation>, NotPinned> {
        let admission = if growth == 0 {
            Admission::Pass
        } else {
            self.admit(api, growth, site, req)
        };
        match admission {
            Admission::Pin(r) => Ok(Some(r)),
            Admission::Pass => Ok(None),
            Admission::Refuse => Err(NotPinned::Refused),
            Admission::Downgrade(over) => {
                if let Some(old) =
                    ledger::insert(addr, self.live(api, growth, site, Backing::Unpinned))
                {
                    self.gone(&old);
                }
                self.answered(Outcome::Downgraded, api, site, growth, over);
                ledger::downgraded_live_delta(self.t, growth as i64);
                Err(NotPinned::Downgraded)
            }
        }
    }

    /// A registration over memory other routes pin, which the runtime accepted: it joins them
    /// under `key` (its address, or the handle it was answered with), charged what it added.
    pub(crate) fn pinned_shared(
        &self,
        api: Api,
        key: usize,
        addr: usize,
        bytes: u64,
        site: &'static crate::accounting::callsite::Callsite,
        reservation: Option<budget::Reservation>,
    ) {
        let m = Member {
            key,
            start: addr,
            end: addr.saturating_add(bytes as usize),
            live: self.live(api, 0, site, Backing::Pinned),
        };
        let taken = overlap::take_overlapped(m.start, m.end);
        let view = view();
        let view_ranges = view.as_deref().map(|v| &v.ranges);
        let grew = overlap::join(self.t, view_ranges, taken, m, self.now());
        drop(view);
        // The reservation's bytes are kept only for a runtime that was asked (`Pass`: nothing
        // reserved, so `grew` is taken whatever the limit).
        let held = reservation.as_ref().map_or(0, |r| r.bytes());
        if let Some(r) = reservation {
            keep(Some(r), held);
        }
        settle(grew - held as i64);
        ledger::count_alloc(self.t, api, site, grew.max(0) as u64);
    }

    /// The member under `addr` that a release of `frees` takes, taken out, with the bytes only it
    /// held (`None`: no such member, the release is of a pointer pinguard never saw).
    #[cold]
    #[inline(never)]
    pub(crate) fn leave_shared(&self, addr: usize, frees: &[Api]) -> Option<(Member, u64)> {
        let view = view();
        let accept = |l: &ledger::Live| frees.contains(&l.api);
        let view_ranges = view.as_deref().map(|v| &v.ranges);
        overlap::leave(self.t, view_ranges, addr, accept, self.now())
    }

    /// The release of a registration or allocation that shared its range with another route
    /// (`leave_shared`): the bytes that only it held go back once the runtime let go; if the
    /// runtime refuses, it joins the others again.
    #[cold]
    pub(crate) fn release_shared<R: Copy + PartialEq>(
        &self,
        api: Api,
        (m, freed): (Member, u64),
        ok: R,
        real: impl FnOnce() -> R,
    ) -> R {
        self.call(real, |&rc, _| {
            if rc == ok {
                budget::release(freed);
                ledger::count_release(self.t);
                return;
            }
            let view = view();
            let grew = overlap::rejoin(self.t, view.as_deref().map(|v| &v.ranges), m, self.now());
            drop(view);
            settle(grew - freed as i64);
            ledger::count_failed(self.t, api);
        })
    }
}
