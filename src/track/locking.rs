//! The locking family's accounting: `mlock`, `mlock2`, `munlock`, `munmap`, `mremap`,
//! `mmap(MAP_LOCKED)`, `mlockall`, `munlockall`. Pages are counted as the kernel counts them: a
//! page locked twice is locked once, and the kernel's `VmLck` is the truth (`ledger::locked_pages`).
//!
//! Every call here holds the view's lock from before the real call to after its bookkeeping, so
//! hooked calls change the kernel's state and the view in the same order.

use super::{quiet, rare, Admission, Hook, Request, WarnLater};
use crate::accounting::ledger::{Outcome, Over};

/// A locking call's admission. A failed call may still have locked part of its range: its
/// reservation goes back whole, and a walk of the kernel's mappings takes what was locked.
enum Lock {
    /// Lock, with the budget's bytes held for the call (none when nothing new is to be locked).
    Pin(budget::Reservation),
    Refuse,
    Downgrade(u64, Over),
}
use crate::accounting::callsite::Callsite;
use crate::accounting::ledger::{self, Backing, LockCall, LockedPagesGuard};
use crate::accounting::ranges::{page_span, uncovered, Gaps};
use crate::api::Api;
use crate::budget;
use crate::runtime::config::Policy;
use crate::runtime::guard::Thread;
use crate::runtime::kernel::Status;
use crate::runtime::sys::page_size;
use crate::runtime::{kernel, own_maps};
use std::os::raw::{c_int, c_void};

/// Tells the budget what a walk of the kernel's mappings changed in the view (the ledger
/// records, the budget is moved here); whether anything changed.
fn walked(s: ledger::Synced) -> bool {
    budget::adjust(s.removed, s.added);
    s.any()
}

/// The kernel is the truth for locked and pinned pages: the view matched with `VmLck` (with
/// `locked`: the locking family's hooks on) and the unseen pins with `VmPin`, from one read of
/// the status (`ledger::reconcile_kernel`), then the budget moved by what that changed. The one
/// place both happen, so the view and the budget never part: before a refusal, for the C API's
/// figures, and before a report or a metrics write (the output stage is handed this function at
/// start-up, `output::report::on_kernel_truth`, and never moves the budget itself). Returns the
/// status read and what changed.
pub fn kernel_truth(t: &Thread, locked: bool) -> (Status, ledger::Synced) {
    let (status, d) = ledger::reconcile_kernel(t, locked);
    walked(d);
    (status, d)
}

/// The limit `MCL_FUTURE` is refused for (it would lock later mappings without asking any):
/// the process budget, else the group's, else the host reserve.
fn blank_cheque_over() -> Over {
    if budget::limit().is_some() {
        super::over(budget::Refused::Budget)
    } else if budget::group::limited() {
        Over::group_budget()
    } else {
        Over::host_reserve(budget::host::available_now(budget::reserved().unwrap_or(0)))
    }
}

/// `mlock2`'s only flag (not in the `libc` crate for glibc targets).
pub const MLOCK_ONFAULT: c_int = 1;

fn total(gaps: &Gaps) -> u64 {
    gaps.iter().map(|(s, e)| (e - s) as u64).sum()
}

/// Whether a failed lock call may have changed some pages before it failed: the kernel applies
/// `mlock`/`munlock` mapping by mapping and stops at a hole (ENOMEM), and an `mlock` whose pages
/// could not all be faulted in keeps the lock (EAGAIN). EINVAL, EPERM and EINTR change nothing.
/// ENOMEM alone cannot tell: the kernel gives it, having changed nothing, for a range over
/// `RLIMIT_MEMLOCK` or one that starts in a hole (`mlock_changed`, `munlock_changed` ask it).
fn partial(err: c_int) -> bool {
    !matches!(err, libc::EINVAL | libc::EPERM | libc::EINTR)
}

/// Past this many pieces, a failed call's range is walked rather than probed piece by piece.
const PROBES: usize = 8;

/// Whether a failed `mlock` of `gaps` (the pages the view held unlocked) locked any of them: the
/// kernel locks mapping by mapping from the range's start and stops at the first failure, so
/// whatever it locked lies in these gaps, and a mapping there now locked is one it locked (or one
/// locked behind pinguard's back: a walk is due either way). Mappings the kernel never locks
/// (`VM_IO`, `VM_PFNMAP`) may open a gap, so every gap is asked, not only the first page.
/// A system call per gap, never a `/proc` read.
fn mlock_changed(gaps: &Gaps) -> bool {
    gaps.len() > PROBES || gaps.iter().any(|&(s, e)| kernel::any_locked(s, e))
}

/// Why an `mlock` with nothing new to reserve records nothing: every page of it is locked already
/// (no gaps), or it fails at a hole before them (`mlock_new`).
fn nothing_new(gaps: &Gaps, span: Span) -> NotLocked {
    if gaps.is_empty() {
        NotLocked::Untracked
    } else {
        NotLocked::AtHole(span, total(gaps))
    }
}

/// Whether an `mlock` of `span` will stop at a hole before it reaches any page of `gaps` (those
/// the view holds unlocked; the view holds the pages before the first): the kernel locks mapping
/// by mapping from the start and fails at the first hole, so a hole in `[start, first gap's first
/// page]` means the call fails and locks nothing the view does not hold. One `msync`.
fn stops_before_gaps(span: Span, gaps: &Gaps) -> bool {
    let first = gaps.first().map_or(span.end, |&(s, _)| s);
    let upto = (first + page_size()).min(span.end);
    !kernel::mapped(span.start, upto)
}

/// Whether a failed `munlock` of `[start, end)` unlocked any page the view holds there (`held`,
/// the view's pieces of the range): the kernel unlocks from the start in address order, so if it
/// reached any of them, it unlocked the first one's first page. Pages the view does not hold
/// cannot change it.
fn munlock_changed(held: &Gaps) -> bool {
    let page = page_size();
    match held.first() {
        None => false,
        Some(&(s, _)) => held.len() > PROBES || !kernel::any_locked(s, s + page),
    }
}

/// What a locking call's budget decision is made of, besides the bytes.
struct Ask<'a, 'h> {
    api: Api,
    /// The bytes the call asked for (0: the call names none), for a refusal's line: pinguard
    /// counts whole pages.
    asked: u64,
    site: &'static Callsite,
    req: Request,
    /// Where a `warn` line waits until the view's guard is let go.
    later: &'a WarnLater<'h>,
}

/// A range a call locks: its pages `[start, end)`, the call's `mlock2` flags and its clock.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    flags: c_int,
    now: u64,
}

/// Why a locking call records no new lock: what it answers once the view's guard is let go.
enum NotLocked {
    /// Nothing new to lock: the kernel answers, a failure counted.
    Untracked,
    /// An `mlock` of this span that fails at a hole, having relocked only pages the view holds
    /// (`stops_before_gaps`), the bytes the view holds unlocked there: the kernel answers, a
    /// failure counted.
    AtHole(Span, u64),
    /// pinguard's own work failed: the kernel answers, as if pinguard were not there.
    Plain,
    /// The kernel would reject the call: its `errno`, without calling it.
    Rejected(c_int),
    /// Over the budget.
    Refused,
    /// Over the budget, served without the lock (`downgrade`): these bytes, this limit.
    Downgraded(u64, Over),
}

/// The budget's decision (`admit_lock`'s, `None` where pinguard's own work failed), as what the
/// call holds for its lock or why it records none.
#[inline(always)]
fn settle(decided: Option<Result<Lock, c_int>>) -> Result<budget::Reservation, NotLocked> {
    match decided {
        None => Err(NotLocked::Plain),
        Some(Ok(Lock::Pin(r))) => Ok(r),
        Some(Err(err)) => {
            rare();
            Err(NotLocked::Rejected(err))
        }
        Some(Ok(Lock::Refuse)) => {
            rare();
            Err(NotLocked::Refused)
        }
        Some(Ok(Lock::Downgrade(n, over))) => {
            rare();
            Err(NotLocked::Downgraded(n, over))
        }
    }
}

/// The bytes of pinguard's own mappings, which `mlockall` leaves out (`own_maps::mlockall`).
fn own_bytes() -> u64 {
    own_maps::overlap(0, usize::MAX) as u64
}

/// What the kernel weighs against `RLIMIT_MEMLOCK` for `mlockall(flags)`, the size of a failed
/// one's event: the address space less pinguard's own mappings for `MCL_CURRENT` (one read of
/// `/proc/self/status`, on a failure only), nothing for `MCL_FUTURE` alone.
fn mlockall_bytes(flags: c_int) -> u64 {
    if flags & libc::MCL_CURRENT == 0 {
        return 0;
    }
    let size = kernel::status().vm_size.unwrap_or(0);
    size.saturating_sub(own_bytes())
}

/// What `mlockall(MCL_CURRENT)` will lock: every lockable mapping not locked yet (a walk of the
/// mappings, only when a budget needs the figure).
fn mlockall_estimate(flags: c_int) -> u64 {
    let mut bytes = 0u64;
    if flags & libc::MCL_CURRENT != 0 && budget::limited() {
        kernel::for_each_vma(|v| {
            if v.lockable && !v.locked {
                // pinguard's own mappings stay unlocked (`own_maps`).
                bytes += (v.end - v.start - own_maps::overlap(v.start, v.end)) as u64;
            }
        });
    }
    bytes
}

/// `mmap`'s arguments, for the kernel's answer to a call pinguard would refuse.
#[derive(Clone, Copy)]
pub struct MmapArgs {
    pub addr: usize,
    pub len: usize,
    pub prot: c_int,
    pub flags: c_int,
    pub fd: c_int,
    pub off: i64,
}

/// A valid `mremap`'s arguments, lengths rounded to pages.
#[derive(Clone, Copy)]
struct Remap {
    old: usize,
    old_len: usize,
    old_end: usize,
    new_len: usize,
    new_addr: usize,
    flags: c_int,
}

impl Remap {
    /// `None` for arguments the kernel rejects (EINVAL), which change nothing.
    fn new(
        old: usize,
        old_size: usize,
        new_size: usize,
        flags: c_int,
        new_addr: usize,
    ) -> Option<Remap> {
        let page = page_size();
        let round = |n: usize| n.checked_add(page - 1).map(|v| v & !(page - 1));
        let known = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
        let (old_len, new_len) = (round(old_size)?, round(new_size)?);
        let old_end = old.checked_add(old_len)?;
        let bad = flags & !known != 0
            || (flags & libc::MREMAP_FIXED != 0 && flags & libc::MREMAP_MAYMOVE == 0);
        if bad || old & (page - 1) != 0 || new_len == 0 || new_addr.checked_add(new_len).is_none() {
            return None;
        }
        Some(Remap {
            old,
            old_len,
            old_end,
            new_len,
            new_addr,
            flags,
        })
    }
}

/// What the view held of a remapped mapping before the call.
#[derive(Clone, Copy)]
struct Held {
    /// Its locked bytes.
    bytes: u64,
    /// The record of its last (else first) page, which a growth is recorded under.
    owner: Option<ledger::Live>,
    now: u64,
}

impl Hook {
    /// Runs a locking call's tracked path `f` (`lock_range`, `unlock_range`), the thread marked
    /// as inside one (`nested` counts a call a signal handler makes meanwhile), on the caller's
    /// stack: the steady path is a lock, a few atomics and a small frame, and whatever can be
    /// heavy moves to pinguard's own stack by itself (`Hook::work`): a stack walk, a callsite's
    /// first sight, `VmLck` and `smaps` reads, a refusal, a failed call, the group's ledger and
    /// the host reserve (`budget`), a thread's or the process's first count (`ledger`).
    /// Unoptimised (a debug build), the steady path's frames alone take kilobytes: there the whole
    /// path runs on pinguard's stack, so that a handler on an 8 KiB alternate stack still fits.
    #[inline(always)]
    pub fn lock_call<R>(self, f: impl FnOnce(Hook) -> R) -> R {
        let t = self.t;
        let was = t.locking.replace(true);
        // An unwind out of `f` never reaches here: it aborts at the hook's `extern "C"` boundary.
        let r = if cfg!(debug_assertions) {
            self.on_own_stack(f)
        } else {
            f(self)
        };
        t.locking.set(was);
        r
    }

    /// `lock_call` for the family's rare calls (`mlockall`, `munlockall`, `mremap`,
    /// `mmap(MAP_LOCKED)`): all of it on pinguard's own stack.
    #[inline(always)]
    pub fn lock_call_own_stack<R>(self, f: impl FnOnce(Hook) -> R) -> R {
        let t = self.t;
        let was = t.locking.replace(true);
        let r = self.on_own_stack(f);
        t.locking.set(was);
        r
    }

    /// The budget's decision for `bytes` more locked bytes. A reservation first: the usual case,
    /// and no more work. Only when it fails, a comparison with the kernel, since the view may hold
    /// pages the kernel unlocked behind pinguard's back (`recount` gives the request again after
    /// it: `None` when nothing is left to lock), unless the kernel's own count plus the request is
    /// over the process budget already (the refusal stands whatever the view holds); then, unless
    /// the policy only warns, the kernel's own answer where it would reject the call anyway
    /// (`rejected`, asked only here: never for a call that goes through); then the policy.
    /// `Err(errno)`: the kernel's answer, to return without calling it.
    fn admit_lock(
        &self,
        locked: &mut LockedPagesGuard,
        ask: &Ask,
        bytes: u64,
        recount: impl FnOnce(&LockedPagesGuard) -> Option<u64>,
        rejected: impl FnOnce(u64) -> Option<c_int>,
    ) -> Result<Lock, c_int> {
        if let Ok(r) = budget::reserve(bytes) {
            return Ok(Lock::Pin(r));
        }
        self.work(|| self.admit_lock_refused(locked, ask, bytes, recount, rejected))
    }

    /// `admit_lock` once the reservation failed: `VmLck`, maybe a walk of `smaps`, the kernel's
    /// answer, the policy (on pinguard's own stack).
    #[cold]
    #[inline(never)]
    fn admit_lock_refused(
        &self,
        locked: &mut LockedPagesGuard,
        ask: &Ask,
        mut bytes: u64,
        recount: impl FnOnce(&LockedPagesGuard) -> Option<u64>,
        rejected: impl FnOnce(u64) -> Option<c_int>,
    ) -> Result<Lock, c_int> {
        let _asking = (ask.asked != 0).then(|| crate::runtime::room::Asking::new(ask.asked));
        let kernel = kernel::vm_lck();
        let stands = matches!((budget::limit(), kernel), (Some(limit), Some(k)) if k.saturating_add(bytes) > limit);
        if !stands
            && kernel.is_some_and(|k| walked(locked.check_before_refusal(k, self.t, self.now())))
        {
            match recount(locked) {
                Some(b) => bytes = b,
                None => return Ok(Lock::Pin(budget::Reservation::none())),
            }
            if let Ok(r) = budget::reserve(bytes) {
                return Ok(Lock::Pin(r));
            }
        }
        if self.cfg.policy != Policy::Warn {
            if let Some(err) = rejected(bytes) {
                super::failed(self.t, ask.api, ask.site, bytes, err);
                return Err(err);
            }
        }
        Ok(
            match self.admit_or_hold(ask.api, bytes, ask.site, ask.req, Some(ask.later)) {
                Admission::Pin(r) => Lock::Pin(r),
                // More than the figures can hold, under `warn`: the kernel answers, nothing reserved.
                Admission::Pass => Lock::Pin(budget::Reservation::none()),
                Admission::Refuse => Lock::Refuse,
                Admission::Downgrade(over) => Lock::Downgrade(bytes, over),
            },
        )
    }

    /// `mlock`, `mlock2`: only pages not already locked count, as in the kernel.
    pub fn lock_range(
        self,
        api: Api,
        addr: usize,
        len: usize,
        flags: c_int,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let span =
            page_span(addr, len, page_size()).filter(|_| len > 0 && flags & !MLOCK_ONFAULT == 0);
        let Some((start, end)) = span else {
            rare();
            return self.untracked(api, 0, real()); // nothing to lock, or the kernel's EINVAL
        };
        let Some(site) = quiet(|| self.site()) else {
            return real();
        };
        self.scope_ahead(site);
        // Before the view's guard: a `warn` line waits until the view is let go.
        let later = WarnLater::new(&self);
        let ask = Ask {
            api,
            asked: len as u64,
            site,
            req: Request::Pageable,
            later: &later,
        };
        let mut locked = ledger::locked_pages();
        let span = Span {
            start,
            end,
            flags,
            now: self.now(),
        };
        // The call that failed at a hole last time, again: it fails the same way without a look
        // at the kernel's mappings first (issue 44, item 7), its range's gaps reserved meanwhile.
        let again = locked
            .hole_noted()
            .then(|| self.hole_again(&locked, &ask, span));
        if let Some(held) = again.flatten() {
            let rc = real();
            let err = self.errno();
            drop(held);
            return self.at_hole(locked, &ask, span, None, rc, err);
        }
        let mut gaps = locked.ranges.gaps(start, end);
        let new = self.mlock_new(&mut locked, span, &mut gaps);
        // The gaps counted again after a walk, kept outside `quiet`: only the decision crosses it.
        let mut fresh = None;
        let decided = (new > 0).then(|| {
            quiet(|| {
                let recount = |l: &LockedPagesGuard| {
                    let g = l.ranges.gaps(start, end);
                    let n = total(&g);
                    fresh = Some(g);
                    (n > 0).then_some(n)
                };
                self.admit_lock(&mut locked, &ask, new, recount, |n| {
                    kernel::mlock_rejected(start, end, n)
                })
            })
        });
        if let Some(g) = fresh {
            gaps = g;
        }
        let reservation = match decided.map(settle) {
            Some(Ok(r)) if r.bytes() > 0 => r,
            // Every page is locked already, or the call fails at a hole (`mlock_new`).
            None => return self.not_locked(locked, nothing_new(&gaps, span), &ask, real),
            Some(Ok(r)) => {
                r.commit(); // nothing held: nothing to give back
                return self.not_locked(locked, NotLocked::Untracked, &ask, real);
            }
            Some(Err(why)) => return self.not_locked(locked, why, &ask, real),
        };
        // Kept when the pages were locked; given back when not (a walk then takes whatever the
        // kernel locked before it failed). Written out here, not through `call_holding` or a
        // helper taking `Ask`: either cost the steady pair about 60 instructions (callgrind).
        let rc = real();
        let err = self.errno();
        if rc == 0 {
            let new = reservation.bytes();
            reservation.commit();
            quiet(|| {
                for &(s, e) in &gaps {
                    locked.add(
                        self.t,
                        s,
                        e,
                        self.live(api, 0, site, Backing::Pinned),
                        span.now,
                    );
                }
                ledger::count_alloc(self.t, api, site, new);
            });
        } else {
            self.lock_failed(&mut locked, reservation, &gaps, &ask, span, err);
        }
        drop(locked);
        self.set_errno(err);
        rc
    }

    /// The bytes of `span` the view holds unlocked (`gaps`), counted again after a walk where the
    /// view looks stale; 0 with `gaps` left as they are where the call will fail at a hole having
    /// changed nothing the view does not hold already (`stops_before_gaps`).
    #[inline(always)]
    fn mlock_new(&self, locked: &mut LockedPagesGuard, span: Span, gaps: &mut Gaps) -> u64 {
        // The view thinks some of these pages locked: cheap evidence that it may be stale (a
        // freed block unmapped by glibc, its address handed out again).
        if total(gaps) < (span.end - span.start) as u64
            && self.recheck_unless_hole(locked, span, gaps)
        {
            return 0;
        }
        total(gaps)
    }

    /// `mlock_new`'s comparison with the kernel, unless the call will fail at a hole before any
    /// page of `gaps` (then true, and no `/proc/self/status` read: issue 44, item 7, where it cost
    /// 16x the call).
    #[cold]
    #[inline(never)]
    fn recheck_unless_hole(
        &self,
        locked: &mut LockedPagesGuard,
        span: Span,
        gaps: &mut Gaps,
    ) -> bool {
        if stops_before_gaps(span, gaps) {
            return true;
        }
        if self.recheck(locked, span.now) {
            *gaps = locked.ranges.gaps(span.start, span.end);
        }
        false
    }

    /// An `mlock` that was to fail at a hole did not (a mapping filled it meanwhile): a walk
    /// takes what it locked, as this call's. On pinguard's own stack.
    #[cold]
    #[inline(never)]
    fn hole_filled(
        &self,
        locked: &mut LockedPagesGuard,
        api: Api,
        span: Span,
        site: &'static Callsite,
    ) {
        self.work(|| {
            quiet(|| {
                let mut added = 0;
                walked(locked.sync(self.t, span.now, |s, e| {
                    (s >= span.start && e <= span.end).then(|| {
                        added += (e - s) as u64;
                        (api, site)
                    })
                }));
                if added > 0 {
                    ledger::count_alloc(self.t, api, site, added);
                }
            })
        });
    }

    /// The answer of an `mlock` or `mlockall` that records no new lock, the view let go first.
    #[cold]
    #[inline(never)]
    fn not_locked(
        &self,
        view: LockedPagesGuard,
        why: NotLocked,
        ask: &Ask,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        if let NotLocked::AtHole(span, gaps) = why {
            // The kernel locks the pages before the hole, which the view holds (whatever it held
            // there stale is true again), and fails with ENOMEM: nothing reserved, no comparison.
            let rc = real();
            let err = self.errno();
            return self.at_hole(view, ask, span, Some(gaps), rc, err);
        }
        drop(view);
        match why {
            NotLocked::Untracked | NotLocked::AtHole(..) => self.untracked(ask.api, 0, real()),
            NotLocked::Plain => real(),
            NotLocked::Rejected(err) => self.fail(-1, err),
            NotLocked::Refused => self.fail(-1, libc::ENOMEM),
            NotLocked::Downgraded(n, over) => {
                self.work(|| {
                    quiet(|| self.answered(Outcome::Downgraded, ask.api, ask.site, n, over))
                });
                self.answer(0)
            }
        }
    }

    /// Where this call is the one last seen to fail at a hole, and its gaps fit the budget: the
    /// bytes held for them while the call fails again (`LockedPages::hole_again`).
    #[inline(never)]
    fn hole_again(
        &self,
        locked: &LockedPagesGuard,
        ask: &Ask,
        span: Span,
    ) -> Option<budget::Reservation> {
        let gaps = locked.hole_again(&self.lock_call_of(ask, span), span.now)?;
        budget::reserve(gaps).ok()
    }

    fn lock_call_of(&self, ask: &Ask, span: Span) -> LockCall {
        LockCall {
            api: ask.api,
            start: span.start,
            end: span.end,
            flags: span.flags,
            site: ask.site,
        }
    }

    /// The answer `rc`, `err` of an `mlock` of `span` expected to fail at a hole, the view still
    /// held. It did (ENOMEM): the hole is noted (`seen`: the bytes the view holds unlocked there,
    /// where a system call showed the hole just now), and the failure counted, into the same
    /// failure's event just before where there is one, without leaving the caller's stack. It
    /// did not (a mapping filled the hole): a walk takes what the call locked.
    #[inline(never)]
    fn at_hole(
        &self,
        view: LockedPagesGuard,
        ask: &Ask,
        span: Span,
        seen: Option<u64>,
        rc: c_int,
        err: c_int,
    ) -> c_int {
        let mut view = view;
        let pages = (span.end - span.start) as u64;
        if rc != 0 && err == libc::ENOMEM {
            if let Some(gaps) = seen {
                view.note_hole(self.lock_call_of(ask, span), gaps, span.now);
            }
            drop(view);
            let asked = Some(ask.asked).filter(|&a| a != 0);
            if !super::failed_again(self.t, ask.api, ask.site, pages, err, asked, span.now) {
                self.work(|| quiet(|| self.lock_call_failed(ask, pages, err)));
            }
        } else {
            view.forget_hole();
            if rc == 0 || partial(err) {
                self.hole_filled(&mut view, ask.api, span, ask.site);
            }
            drop(view);
            if rc != 0 {
                self.work(|| quiet(|| self.lock_call_failed(ask, pages, err)));
            }
        }
        self.set_errno(err);
        rc
    }

    /// Whether a comparison with the kernel (`VmLck`, and a walk of `smaps` where they differ)
    /// changed the view: on pinguard's own stack.
    #[cold]
    #[inline(never)]
    fn recheck(&self, locked: &mut LockedPagesGuard, now: u64) -> bool {
        self.work(|| quiet(|| walked(locked.check(self.t, now, |_, _| None))).unwrap_or(false))
    }

    /// A failed `mlock` of `gaps` in `span`: its reservation goes back whole, and the kernel may
    /// have locked the pages before a hole in the range (asked cheaply first, since it mostly
    /// refused the call up front: `RLIMIT_MEMLOCK`). On pinguard's own stack.
    #[cold]
    #[inline(never)]
    fn lock_failed(
        &self,
        locked: &mut LockedPagesGuard,
        reservation: budget::Reservation,
        gaps: &Gaps,
        ask: &Ask,
        span: Span,
        err: c_int,
    ) {
        self.work(|| {
            drop(reservation);
            let _ = quiet(|| self.lock_failed_here(locked, gaps, ask, span, err));
        })
    }

    fn lock_failed_here(
        &self,
        locked: &mut LockedPagesGuard,
        gaps: &Gaps,
        ask: &Ask,
        span: Span,
        err: c_int,
    ) {
        let (api, site) = (ask.api, ask.site);
        let mut added = 0;
        if partial(err) && mlock_changed(gaps) {
            walked(locked.sync(self.t, span.now, |s, e| {
                (s >= span.start && e <= span.end).then(|| {
                    added += (e - s) as u64;
                    (api, site)
                })
            }));
        }
        if added > 0 {
            ledger::count_alloc(self.t, api, site, added);
        }
        self.lock_call_failed(ask, (span.end - span.start) as u64, err);
    }

    /// A locking call the kernel failed (or would fail: `err`, without calling it), `bytes` the
    /// figure it counts: counted, with an event that says what room the process had, and the
    /// bytes the call asked for where they differ (`Ask::asked`).
    #[cold]
    #[inline(never)]
    fn lock_call_failed(&self, ask: &Ask, bytes: u64, err: c_int) {
        let _asking = (ask.asked != 0).then(|| crate::runtime::room::Asking::new(ask.asked));
        super::failed(self.t, ask.api, ask.site, bytes, err);
    }

    /// `munlock`, `munmap`, and `mmap(MAP_FIXED)` over existing pages: whatever they cover stops
    /// being locked once the real call succeeds.
    pub fn unlock_range<R>(
        self,
        api: Api,
        addr: usize,
        len: usize,
        real: impl FnOnce() -> R,
        ok: impl Fn(&R) -> bool,
    ) -> R {
        let span = page_span(addr, len, page_size());
        let (Some((start, end)), true) = (span, ledger::locked_any()) else {
            return real();
        };
        self.call_holding(ledger::locked_pages(), real, |rc, err, locked| {
            let now = self.now();
            if ok(rc) {
                quiet(|| self.unlocked(locked.cut(self.t, start, end, now)));
            } else if api == Api::Munlock && partial(err) {
                self.unlock_failed(locked, start, end, now);
            }
        })
    }

    /// `removed` locked bytes the view no longer holds: they go back to the budget.
    #[inline(always)]
    fn unlocked(&self, removed: u64) {
        if removed > 0 {
            budget::release(removed);
            ledger::count_release(self.t);
        }
    }

    /// A failed munlock of `[start, end)` still unlocked the mappings before the first hole, if
    /// it reached any the view holds. On pinguard's own stack.
    #[cold]
    #[inline(never)]
    fn unlock_failed(&self, locked: &mut LockedPagesGuard, start: usize, end: usize, now: u64) {
        self.work(|| {
            quiet(|| {
                let held = uncovered(start, end, locked.ranges.gaps(start, end));
                if munlock_changed(&held) {
                    walked(locked.sync(self.t, now, |_, _| None));
                }
            });
        })
    }

    /// `mmap` with `MAP_LOCKED`. `real` takes the flags so the downgrade can drop `MAP_LOCKED`.
    pub fn mmap_locked(self, m: MmapArgs, real: impl Fn(c_int) -> *mut c_void) -> *mut c_void {
        let api = Api::Mmap;
        let page = page_size();
        let Some((_, rounded)) = page_span(0, m.len, page).filter(|_| m.len > 0) else {
            return real(m.flags);
        };
        let bytes = rounded as u64;
        let Some(site) = quiet(|| self.site()) else {
            return real(m.flags);
        };
        self.scope_ahead(site);
        let later = WarnLater::new(&self);
        let ask = Ask {
            api,
            asked: 0,
            site,
            req: Request::Pageable,
            later: &later,
        };
        let mut locked = ledger::locked_pages();
        let now = self.now();
        let rejected = |_| kernel::mmap_rejected(m.addr, m.len, m.prot, m.flags, m.fd, m.off, page);
        let reservation = match settle(quiet(|| {
            self.admit_lock(&mut locked, &ask, bytes, |_| Some(bytes), rejected)
        })) {
            Ok(r) => r,
            Err(why) => return self.mmap_not_locked(locked, why, &ask, m.flags, real),
        };
        self.call_holding(
            locked,
            || real(m.flags),
            |&p, err, locked| {
                quiet(|| {
                    if p == libc::MAP_FAILED {
                        drop(reservation);
                        self.lock_call_failed(&ask, bytes, err);
                        return;
                    }
                    let start = p as usize;
                    // The kernel handed out these pages: whatever the view had there is gone,
                    // replaced by MAP_FIXED or unmapped behind pinguard's back.
                    budget::release(locked.cut(self.t, start, start + rounded, now));
                    locked.add(
                        self.t,
                        start,
                        start + rounded,
                        self.live(api, 0, site, Backing::Pinned),
                        now,
                    );
                    reservation.commit();
                    ledger::count_alloc(self.t, api, site, bytes);
                });
            },
        )
    }

    /// The answer of an `mmap(MAP_LOCKED)` that records no new lock, the view let go first: a
    /// refusal is the kernel's EAGAIN (over `RLIMIT_MEMLOCK`), a downgrade the same mapping
    /// without the lock.
    #[cold]
    fn mmap_not_locked(
        &self,
        view: LockedPagesGuard,
        why: NotLocked,
        ask: &Ask,
        flags: c_int,
        real: impl Fn(c_int) -> *mut c_void,
    ) -> *mut c_void {
        drop(view);
        match why {
            NotLocked::Untracked | NotLocked::AtHole(..) | NotLocked::Plain => real(flags),
            NotLocked::Rejected(err) => self.fail(libc::MAP_FAILED, err),
            NotLocked::Refused => self.fail(libc::MAP_FAILED, libc::EAGAIN),
            NotLocked::Downgraded(bytes, over) => self.call(
                || real(flags & !libc::MAP_LOCKED),
                |&p, _| {
                    if p != libc::MAP_FAILED {
                        self.answered(Outcome::Downgraded, ask.api, ask.site, bytes, over);
                    }
                },
            ),
        }
    }

    /// `mremap`. The kernel keeps the lock on the pages it moves, locks the part a locked mapping
    /// grows by (new locked memory: the budget decides, and a refusal is the kernel's EAGAIN for a
    /// growth over `RLIMIT_MEMLOCK`), and unlocks the part it shrinks by.
    pub fn mremap(
        self,
        old: usize,
        old_size: usize,
        new_size: usize,
        flags: c_int,
        new_addr: usize,
        real: impl FnOnce() -> *mut c_void,
    ) -> *mut c_void {
        let Some(m) = Remap::new(old, old_size, new_size, flags, new_addr) else {
            return real(); // the kernel's EINVAL; nothing changes
        };
        let later = WarnLater::new(&self);
        let mut locked = ledger::locked_pages();
        let now = self.now();
        let bytes = locked.ranges.covered(m.old, m.old_end);
        let owner = locked
            .ranges
            .at(m.old_end.saturating_sub(1))
            .or_else(|| locked.ranges.at(m.old))
            .copied();
        let held = Held { bytes, owner, now };
        let reservation = match self.remap_growth(&mut locked, &later, m, held) {
            Ok(r) => r,
            Err(err) => return self.fail_unlocked(locked, libc::MAP_FAILED, err),
        };
        self.call_holding(locked, real, |&r, _, locked| {
            quiet(|| match r == libc::MAP_FAILED {
                true => self.remap_failed(locked, m, reservation, now),
                false => self.remapped(locked, m, held, r as usize, reservation),
            });
        })
    }

    /// A failure pinguard answers itself (`Hook::fail`), the view let go first.
    #[cold]
    fn fail_unlocked<R>(&self, view: LockedPagesGuard, rc: R, errno: c_int) -> R {
        drop(view);
        self.fail(rc, errno)
    }

    /// The budget's decision for the part a wholly or partly locked mapping grows by.
    /// `Err(errno)`: the call's answer, without calling the kernel.
    fn remap_growth(
        &self,
        locked: &mut LockedPagesGuard,
        later: &WarnLater,
        m: Remap,
        held: Held,
    ) -> Result<budget::Reservation, c_int> {
        let (Some(o), true) = (held.owner, held.bytes > 0 && m.new_len > m.old_len) else {
            return Ok(budget::Reservation::none());
        };
        let grow = (m.new_len - m.old_len) as u64;
        let ask = Ask {
            api: o.api,
            asked: 0,
            site: o.site,
            req: Request::Mapped,
            later,
        };
        match quiet(|| self.admit_lock(locked, &ask, grow, |_| Some(grow), |_| None)) {
            Some(Ok(Lock::Pin(r))) => Ok(r),
            Some(Ok(_)) => Err(libc::EAGAIN),
            Some(Err(err)) => Err(err),
            None => Ok(budget::Reservation::none()),
        }
    }

    /// A failed `mremap`: its reservation goes back; `MREMAP_FIXED` may have unmapped the target
    /// before failing.
    fn remap_failed(
        &self,
        locked: &mut LockedPagesGuard,
        m: Remap,
        reservation: budget::Reservation,
        now: u64,
    ) {
        drop(reservation);
        if m.flags & libc::MREMAP_FIXED != 0
            && locked.ranges.covered(m.new_addr, m.new_addr + m.new_len) > 0
        {
            walked(locked.sync(self.t, now, |_, _| None));
        }
    }

    /// A successful `mremap` to `r`: the locks move with the pages, the part it shrank by is
    /// unlocked, and the part it grew by is locked when the whole mapping was.
    fn remapped(
        &self,
        locked: &mut LockedPagesGuard,
        m: Remap,
        held: Held,
        r: usize,
        reservation: budget::Reservation,
    ) {
        let (old, now) = (m.old, held.now);
        let mut released = 0;
        if m.new_len < m.old_len {
            released += locked.cut(self.t, old + m.new_len, m.old_end, now);
        }
        if r != old {
            released += self.remap_moved(locked, m, r, now);
        } else if m.new_len > m.old_len {
            released += locked.cut(self.t, m.old_end, old + m.new_len, now);
        }
        budget::release(released);
        let uniform = held.bytes == 0 || held.bytes == m.old_len as u64;
        if let (true, true, Some(o)) = (reservation.bytes() > 0, uniform, held.owner) {
            // The whole mapping was locked: so is the part it grew by.
            locked.add(self.t, r + m.old_len, r + m.new_len, o, now);
            ledger::count_alloc(self.t, o.api, o.site, reservation.bytes());
            reservation.commit();
        }
        if !uniform && (r != old || m.new_len > m.old_len) {
            // The view had part of one mapping locked: the kernel knows what became of it.
            walked(locked.sync(self.t, now, |_, _| None));
        }
    }

    /// A mapping moved to `r` (with MREMAP_DONTUNMAP the old pages stay, unlocked): its locks go
    /// along, and whatever the view had at `r` is gone. The bytes released.
    fn remap_moved(&self, locked: &mut LockedPagesGuard, m: Remap, r: usize, now: u64) -> u64 {
        let (old, keep) = (m.old, m.old_len.min(m.new_len));
        let pieces = locked.ranges.take(old, old + keep, |l, b, c| {
            ledger::live_delta(self.t, l.api, l.site, -(b as i64), c, now);
        });
        let released = locked.cut(self.t, r, r + m.new_len, now);
        for (s, e, l) in pieces {
            locked.add(self.t, s - old + r, e - old + r, l, now);
        }
        released
    }

    /// `mlockall`: the pages it locks are found in the kernel's mappings afterwards and recorded
    /// as ranges of this call, like any other lock (so `munmap`, `munlock` and a later `mlock` of
    /// them count exactly).
    pub fn mlockall(self, flags: c_int, real: impl FnOnce() -> c_int) -> c_int {
        let api = Api::Mlockall;
        if !kernel::mlockall_flags_valid(flags) {
            return self.untracked(api, 0, real()); // the kernel's EINVAL; nothing locked
        }
        let Some(site) = quiet(|| self.site()) else {
            return real();
        };
        self.scope_ahead(site);
        let later = WarnLater::new(&self);
        let ask = Ask {
            api,
            asked: 0,
            site,
            req: Request::Pageable,
            later: &later,
        };
        let mut locked = ledger::locked_pages();
        let now = self.now();
        let reservation = match settle(quiet(|| self.mlockall_decide(&mut locked, &ask, flags))) {
            Ok(r) => r,
            Err(why) => return self.not_locked(locked, why, &ask, real),
        };
        self.call_holding(locked, real, |&rc, err, locked| {
            quiet(|| {
                drop(reservation); // the walk takes what the kernel actually locked
                match rc {
                    0 => self.mlockall_done(locked, &ask, flags, now),
                    _ => self.lock_call_failed(&ask, mlockall_bytes(flags), err),
                }
            });
        })
    }

    /// `mlockall`'s budget decision, under the view's guard.
    fn mlockall_decide(
        &self,
        locked: &mut LockedPagesGuard,
        ask: &Ask,
        flags: c_int,
    ) -> Result<Lock, c_int> {
        // MCL_FUTURE locks every later mapping without asking anyone: under a budget (and not
        // `warn`), that is a refusal, or under `downgrade` a success that locks nothing.
        if flags & libc::MCL_FUTURE != 0 && budget::limited() && self.cfg.policy != Policy::Warn {
            return self.blank_cheque(ask, flags);
        }
        // The kernel refuses it up front (over RLIMIT_MEMLOCK, or EPERM) having changed
        // nothing: its answer, without the walk the estimate costs (asked first only where
        // the estimate is a walk).
        if flags & libc::MCL_CURRENT != 0 && budget::limited() {
            if let Some(err) = kernel::mlockall_rejected(flags, own_bytes()) {
                self.lock_call_failed(ask, mlockall_bytes(flags), err);
                return Err(err);
            }
        }
        let bytes = mlockall_estimate(flags);
        self.admit_lock(
            locked,
            ask,
            bytes,
            |_| Some(mlockall_estimate(flags)),
            |_| kernel::mlockall_rejected(flags, own_bytes()),
        )
    }

    /// `mlockall(MCL_FUTURE)` under a budget: the kernel's answer where it rejects the call, else
    /// a refusal, or under a `downgrade` that covers the callsite a success that locks nothing.
    fn blank_cheque(&self, ask: &Ask, flags: c_int) -> Result<Lock, c_int> {
        if let Some(err) = kernel::mlockall_rejected(flags, own_bytes()) {
            self.lock_call_failed(ask, mlockall_bytes(flags), err);
            return Err(err);
        }
        let (api, site) = (ask.api, ask.site);
        let bytes = mlockall_estimate(flags);
        let over = blank_cheque_over();
        Ok(match self.policy(over) {
            Policy::Downgrade if self.downgrade_in_scope(site) => Lock::Downgrade(bytes, over),
            Policy::Downgrade => {
                self.answered(Outcome::DeniedOutOfScope, api, site, bytes, over);
                Lock::Refuse
            }
            _ => {
                self.answered(Outcome::Denied, api, site, bytes, over);
                Lock::Refuse
            }
        })
    }

    /// A successful `mlockall`: what it locked is found in the kernel's mappings.
    fn mlockall_done(&self, locked: &mut LockedPagesGuard, ask: &Ask, flags: c_int, now: u64) {
        let mut added = 0;
        walked(locked.sync(self.t, now, |s, e| {
            added += (e - s) as u64;
            Some((ask.api, ask.site))
        }));
        // mlockall without MCL_FUTURE ends an earlier one's.
        locked.future = (flags & libc::MCL_FUTURE != 0)
            .then(|| self.live(ask.api, 0, ask.site, Backing::Pinned));
        ledger::count_alloc(self.t, ask.api, ask.site, added);
    }

    pub fn munlockall(self, real: impl FnOnce() -> c_int) -> c_int {
        self.call_holding(ledger::locked_pages(), real, |&rc, _, locked| {
            if rc == 0 {
                quiet(|| self.unlocked(locked.clear(self.t, self.now())));
            }
        })
    }
}
