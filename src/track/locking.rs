//! The locking family's accounting: `mlock`, `mlock2`, `munlock`, `munmap`, `mremap`,
//! `mmap(MAP_LOCKED)`, `mlockall`, `munlockall`. Pages are counted as the kernel counts them: a
//! page locked twice is locked once, and the kernel's `VmLck` is the truth (`ledger::locked_pages`).
//!
//! Every call here holds the view's lock from before the real call to after its bookkeeping, so
//! hooked calls change the kernel's state and the view in the same order.

use super::{quiet, rare, Admission, Hook, Request, WarnLater};
use crate::accounting::ledger::Over;

/// A locking call's admission. A failed call may still have locked part of its range: its
/// reservation goes back whole, and a walk of the kernel's mappings takes what was locked.
enum Lock {
    /// Lock, with the budget's bytes held for the call (none when nothing new is to be locked).
    Pin(budget::Reservation),
    Refuse,
    Downgrade(u64, Over),
}
use crate::api::Api;
use crate::budget;
use crate::accounting::callsite::Callsite;
use crate::runtime::config::Policy;
use crate::runtime::kernel;
use crate::accounting::ledger::{self, Backing, LockedPagesGuard};
use crate::accounting::ranges::{page_span, uncovered, Gaps};
use crate::runtime::sys::page_size;
use std::os::raw::{c_int, c_void};

/// Tells the budget what a walk of the kernel's mappings changed in the view (the ledger
/// records, the budget is moved here); whether anything changed.
fn walked(s: ledger::Synced) -> bool {
    budget::adjust(s.removed, s.added);
    s.any()
}

/// The limit `MCL_FUTURE` is refused for (it would lock later mappings without asking any):
/// the process budget, else the group's, else the host reserve.
fn blank_cheque_over() -> Over {
    if budget::limit().is_some() {
        Over::budget()
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
        let r = if cfg!(debug_assertions) { self.on_own_stack(f) } else { f(self) };
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
    #[allow(clippy::too_many_arguments)]
    fn admit_lock(
        &self,
        locked: &mut LockedPagesGuard,
        later: &WarnLater,
        api: Api,
        site: &'static Callsite,
        req: Request,
        bytes: u64,
        recount: impl FnOnce(&LockedPagesGuard) -> Option<u64>,
        rejected: impl FnOnce(u64) -> Option<c_int>,
    ) -> Result<Lock, c_int> {
        if let Some(r) = budget::reserve(bytes) {
            return Ok(Lock::Pin(r));
        }
        self.work(|| self.admit_lock_refused(locked, later, api, site, req, bytes, recount, rejected))
    }

    /// `admit_lock` once the reservation failed: `VmLck`, maybe a walk of `smaps`, the kernel's
    /// answer, the policy (on pinguard's own stack).
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn admit_lock_refused(
        &self,
        locked: &mut LockedPagesGuard,
        later: &WarnLater,
        api: Api,
        site: &'static Callsite,
        req: Request,
        mut bytes: u64,
        recount: impl FnOnce(&LockedPagesGuard) -> Option<u64>,
        rejected: impl FnOnce(u64) -> Option<c_int>,
    ) -> Result<Lock, c_int> {
        let kernel = kernel::vm_lck();
        let stands = matches!((budget::limit(), kernel), (Some(limit), Some(k)) if k.saturating_add(bytes) > limit);
        if !stands && kernel.is_some_and(|k| walked(locked.check_before_refusal(k, self.t, self.now()))) {
            match recount(locked) {
                Some(b) => bytes = b,
                None => return Ok(Lock::Pin(budget::Reservation::none())),
            }
            if let Some(r) = budget::reserve(bytes) {
                return Ok(Lock::Pin(r));
            }
        }
        if self.cfg.policy != Policy::Warn {
            if let Some(err) = rejected(bytes) {
                ledger::count_failed(self.t, api);
                return Err(err);
            }
        }
        Ok(match self.admit_or_hold(api, bytes, site, req, Some(later)) {
            Admission::Pin(r) => Lock::Pin(r),
            // More than the figures can hold, under `warn`: the kernel answers, nothing reserved.
            Admission::Pass => Lock::Pin(budget::Reservation::none()),
            Admission::Refuse => Lock::Refuse,
            Admission::Downgrade(over) => Lock::Downgrade(bytes, over),
        })
    }

    /// `mlock`, `mlock2`: only pages not already locked count, as in the kernel.
    pub fn lock_range(self, api: Api, addr: usize, len: usize, flags: c_int, real: impl FnOnce() -> c_int) -> c_int {
        let Some((start, end)) = page_span(addr, len, page_size()).filter(|_| len > 0) else {
            rare();
            return self.untracked(api, 0, real());
        };
        if flags & !MLOCK_ONFAULT != 0 {
            rare();
            return self.untracked(api, 0, real()); // the kernel's EINVAL; nothing locked
        }
        let Some(site) = quiet(|| self.site()) else { return real() };
        self.scope_ahead(site);
        // Before the view's guard: a `warn` line waits until the view is let go.
        let later = WarnLater::new(&self);
        let mut locked = ledger::locked_pages();
        let now = self.now();
        let mut gaps = locked.ranges.gaps(start, end);
        // The view thinks some of these pages locked: cheap evidence that it may be stale (a
        // freed block unmapped by glibc, its address handed out again).
        if total(&gaps) < (end - start) as u64 && self.recheck(&mut locked, now) {
            gaps = locked.ranges.gaps(start, end);
        }
        let new = total(&gaps);
        if new == 0 {
            rare();
            drop(locked);
            return self.untracked(api, 0, real()); // every page is locked already
        }
        // The gaps counted again after a walk, kept outside the call that may unwind: only the
        // small decision crosses `quiet`.
        let mut fresh = None;
        let decided = quiet(|| {
            self.admit_lock(
                &mut locked,
                &later,
                api,
                site,
                Request::Pageable,
                new,
                |l| {
                    let g = l.ranges.gaps(start, end);
                    let n = total(&g);
                    fresh = Some(g);
                    (n > 0).then_some(n)
                },
                |n| kernel::mlock_rejected(start, end, n),
            )
        });
        let Some(decided) = decided else {
            drop(locked);
            return real();
        };
        if let Some(g) = fresh {
            gaps = g;
        }
        let reservation = match decided {
            Err(err) => {
                rare();
                drop(locked);
                self.set_errno(err);
                return -1;
            }
            Ok(Lock::Pin(r)) if r.bytes() == 0 => {
                rare();
                r.commit(); // nothing held: nothing to give back
                drop(locked);
                return self.untracked(api, 0, real());
            }
            Ok(Lock::Refuse) => {
                rare();
                drop(locked);
                self.set_errno(libc::ENOMEM);
                return -1;
            }
            Ok(Lock::Downgrade(n, over)) => {
                rare();
                drop(locked);
                self.work(|| quiet(|| self.downgraded(api, site, n, over)));
                self.set_errno(self.entry_errno);
                return 0;
            }
            Ok(Lock::Pin(r)) => r,
        };
        let new = reservation.bytes();
        let rc = real();
        let err = self.errno();
        // Kept when the pages were locked; given back when not (a walk then takes whatever the
        // kernel locked before it failed).
        if rc == 0 {
            reservation.commit();
            quiet(|| {
                for &(s, e) in &gaps {
                    locked.add(self.t, s, e, self.live(api, 0, site, Backing::Pinned), now);
                }
                ledger::count_alloc(self.t, api, site, new);
            });
        } else {
            self.lock_failed(&mut locked, reservation, &gaps, api, site, (start, end), err, now);
        }
        drop(locked);
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
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn lock_failed(&self, locked: &mut LockedPagesGuard, reservation: budget::Reservation, gaps: &Gaps, api: Api, site: &'static Callsite, span: (usize, usize), err: c_int, now: u64) {
        let (start, end) = span;
        self.work(|| {
            drop(reservation);
            let _ = quiet(|| self.lock_failed_here(locked, gaps, api, site, start, end, err, now));
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn lock_failed_here(&self, locked: &mut LockedPagesGuard, gaps: &Gaps, api: Api, site: &'static Callsite, start: usize, end: usize, err: c_int, now: u64) {
        let mut added = 0;
        if partial(err) && mlock_changed(gaps) {
            walked(locked.sync(self.t, now, |s, e| {
                (s >= start && e <= end).then(|| {
                    added += (e - s) as u64;
                    (api, site)
                })
            }));
        }
        if added > 0 {
            ledger::count_alloc(self.t, api, site, added);
        }
        ledger::count_failed(self.t, api);
    }

    /// `munlock`, `munmap`, and `mmap(MAP_FIXED)` over existing pages: whatever they cover stops
    /// being locked once the real call succeeds.
    pub fn unlock_range<R>(self, api: Api, addr: usize, len: usize, real: impl FnOnce() -> R, ok: impl Fn(&R) -> bool) -> R {
        let span = page_span(addr, len, page_size());
        let (Some((start, end)), true) = (span, ledger::locked_any()) else {
            return real();
        };
        let mut locked = ledger::locked_pages();
        let rc = real();
        let err = self.errno();
        let now = self.now();
        if ok(&rc) {
            quiet(|| {
                let removed = locked.cut(self.t, start, end, now);
                if removed > 0 {
                    budget::release(removed);
                    ledger::count_release(self.t);
                }
            });
        } else if api == Api::Munlock && partial(err) {
            self.unlock_failed(&mut locked, start, end, now);
        }
        drop(locked);
        self.set_errno(err);
        rc
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
    #[allow(clippy::too_many_arguments)]
    pub fn mmap_locked(
        self,
        addr: usize,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
        real: impl Fn(c_int) -> *mut c_void,
    ) -> *mut c_void {
        let api = Api::Mmap;
        let page = page_size();
        let Some((_, rounded)) = page_span(0, len, page).filter(|_| len > 0) else {
            return real(flags);
        };
        let bytes = rounded as u64;
        let Some(site) = quiet(|| self.site()) else { return real(flags) };
        self.scope_ahead(site);
        let later = WarnLater::new(&self);
        let mut locked = ledger::locked_pages();
        let now = self.now();
        let decided = quiet(|| {
            self.admit_lock(&mut locked, &later, api, site, Request::Pageable, bytes, |_| Some(bytes), |_| {
                kernel::mmap_rejected(addr, len, prot, flags, fd, off, page)
            })
        });
        let reservation = match decided {
            None => {
                drop(locked);
                return real(flags);
            }
            Some(Err(err)) => {
                drop(locked);
                self.set_errno(err);
                return libc::MAP_FAILED;
            }
            Some(Ok(Lock::Refuse)) => {
                drop(locked);
                self.set_errno(libc::EAGAIN);
                return libc::MAP_FAILED;
            }
            Some(Ok(Lock::Downgrade(_, over))) => {
                drop(locked);
                let p = real(flags & !libc::MAP_LOCKED);
                let err = self.errno();
                if p != libc::MAP_FAILED {
                    quiet(|| self.downgraded(api, site, bytes, over));
                }
                self.set_errno(err);
                return p;
            }
            Some(Ok(Lock::Pin(r))) => r,
        };
        let p = real(flags);
        let err = self.errno();
        quiet(|| {
            if p != libc::MAP_FAILED {
                let start = p as usize;
                // The kernel handed out these pages: whatever the view had there is gone, replaced
                // by MAP_FIXED or unmapped behind pinguard's back.
                budget::release(locked.cut(self.t, start, start + rounded, now));
                locked.add(self.t, start, start + rounded, self.live(api, 0, site, Backing::Pinned), now);
                reservation.commit();
                ledger::count_alloc(self.t, api, site, bytes);
            } else {
                drop(reservation);
                ledger::count_failed(self.t, api);
            }
        });
        drop(locked);
        self.set_errno(err);
        p
    }

    /// `mremap`. The kernel keeps the lock on the pages it moves, locks the part a locked mapping
    /// grows by (new locked memory: the budget decides, and a refusal is the kernel's EAGAIN for a
    /// growth over `RLIMIT_MEMLOCK`), and unlocks the part it shrinks by.
    #[allow(clippy::too_many_arguments)]
    pub fn mremap(self, old: usize, old_size: usize, new_size: usize, flags: c_int, new_addr: usize, real: impl FnOnce() -> *mut c_void) -> *mut c_void {
        let page = page_size();
        let round = |n: usize| n.checked_add(page - 1).map(|v| v & !(page - 1));
        let known = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
        let (Some(old_len), Some(new_len)) = (round(old_size), round(new_size)) else { return real() };
        let bad = flags & !known != 0 || (flags & libc::MREMAP_FIXED != 0 && flags & libc::MREMAP_MAYMOVE == 0);
        let Some(old_end) = old.checked_add(old_len) else { return real() };
        if bad || old & (page - 1) != 0 || new_len == 0 || new_addr.checked_add(new_len).is_none() {
            return real(); // the kernel's EINVAL; nothing changes
        }
        let later = WarnLater::new(&self);
        let mut locked = ledger::locked_pages();
        let now = self.now();
        let held = locked.ranges.covered(old, old_end);
        let owner = locked.ranges.at(old_end.saturating_sub(1)).or_else(|| locked.ranges.at(old)).copied();
        let grow = match owner {
            Some(_) if held > 0 && new_len > old_len => (new_len - old_len) as u64,
            _ => 0,
        };
        let mut reservation = budget::Reservation::none();
        if let (true, Some(o)) = (grow > 0, owner) {
            let decided = quiet(|| self.admit_lock(&mut locked, &later, o.api, o.site, Request::Mapped, grow, |_| Some(grow), |_| None));
            match decided {
                Some(Ok(Lock::Pin(r))) => reservation = r,
                Some(Ok(_)) => {
                    drop(locked);
                    self.set_errno(libc::EAGAIN);
                    return libc::MAP_FAILED;
                }
                Some(Err(err)) => {
                    drop(locked);
                    self.set_errno(err);
                    return libc::MAP_FAILED;
                }
                None => {}
            }
        }
        let r = real();
        let err = self.errno();
        quiet(|| {
            if r == libc::MAP_FAILED {
                drop(reservation);
                // MREMAP_FIXED may have unmapped the target before failing.
                if flags & libc::MREMAP_FIXED != 0 && locked.ranges.covered(new_addr, new_addr + new_len) > 0 {
                    walked(locked.sync(self.t, now, |_, _| None));
                }
                return;
            }
            let r = r as usize;
            let mut released = 0;
            if new_len < old_len {
                released += locked.cut(self.t, old + new_len, old_end, now);
            }
            if r != old {
                // Moved (with MREMAP_DONTUNMAP the old pages stay, unlocked): the locks go along.
                let keep = old_len.min(new_len);
                let pieces = locked.ranges.take(old, old + keep, |l, b, c| {
                    ledger::live_delta(self.t, l.api, l.site, -(b as i64), c, now);
                });
                released += locked.cut(self.t, r, r + new_len, now); // what the view had there is gone
                for (s, e, l) in pieces {
                    locked.add(self.t, s - old + r, e - old + r, l, now);
                }
            } else if new_len > old_len {
                released += locked.cut(self.t, old_end, old + new_len, now);
            }
            budget::release(released);
            let uniform = held == 0 || held == old_len as u64;
            if let (true, true, Some(o)) = (reservation.bytes() > 0, uniform, owner) {
                // The whole mapping was locked: so is the part it grew by.
                locked.add(self.t, r + old_len, r + new_len, o, now);
                ledger::count_alloc(self.t, o.api, o.site, reservation.bytes());
                reservation.commit();
            }
            if !uniform && (r != old || new_len > old_len) {
                // The view had part of one mapping locked: the kernel knows what became of it.
                walked(locked.sync(self.t, now, |_, _| None));
            }
        });
        drop(locked);
        self.set_errno(err);
        r
    }

    /// `mlockall`: the pages it locks are found in the kernel's mappings afterwards and recorded
    /// as ranges of this call, like any other lock (so `munmap`, `munlock` and a later `mlock` of
    /// them count exactly).
    pub fn mlockall(self, flags: c_int, real: impl FnOnce() -> c_int) -> c_int {
        let api = Api::Mlockall;
        if !kernel::mlockall_flags_valid(flags) {
            return self.untracked(api, 0, real()); // the kernel's EINVAL; nothing locked
        }
        let Some(site) = quiet(|| self.site()) else { return real() };
        self.scope_ahead(site);
        let later = WarnLater::new(&self);
        let mut locked = ledger::locked_pages();
        let now = self.now();
        // MCL_FUTURE locks every later mapping without asking anyone: under a budget (and not
        // `warn`), that is a refusal, or under `downgrade` a success that locks nothing.
        let blank_cheque = flags & libc::MCL_FUTURE != 0 && budget::limited() && self.cfg.policy != Policy::Warn;
        // What MCL_CURRENT will lock: every lockable mapping not locked yet (a walk of the
        // mappings, only when a budget needs the figure).
        let estimate = || -> u64 {
            let mut bytes = 0u64;
            if flags & libc::MCL_CURRENT != 0 && budget::limited() {
                kernel::for_each_vma(|v| {
                    if v.lockable && !v.locked {
                        bytes += (v.end - v.start) as u64;
                    }
                });
            }
            bytes
        };
        let decided = quiet(|| {
            if blank_cheque {
                if let Some(err) = kernel::mlockall_rejected(flags) {
                    ledger::count_failed(self.t, api);
                    return Err(err);
                }
                let bytes = estimate();
                let over = blank_cheque_over();
                return Ok(match self.cfg.policy {
                    Policy::Downgrade if self.downgrade_in_scope(site) => Lock::Downgrade(bytes, over),
                    Policy::Downgrade => {
                        self.denied_out_of_scope(api, site, bytes, over);
                        Lock::Refuse
                    }
                    _ => {
                        self.denied(api, site, bytes, over);
                        Lock::Refuse
                    }
                });
            }
            // The kernel refuses it up front (over RLIMIT_MEMLOCK, or EPERM) having changed
            // nothing: its answer, without the walk the estimate costs (asked first only where
            // the estimate is a walk).
            if flags & libc::MCL_CURRENT != 0 && budget::limited() {
                if let Some(err) = kernel::mlockall_rejected(flags) {
                    ledger::count_failed(self.t, api);
                    return Err(err);
                }
            }
            let bytes = estimate();
            self.admit_lock(&mut locked, &later, api, site, Request::Pageable, bytes, |_| Some(estimate()), |_| kernel::mlockall_rejected(flags))
        });
        let reservation = match decided {
            None => {
                drop(locked);
                return real();
            }
            Some(Err(err)) => {
                drop(locked);
                self.set_errno(err);
                return -1;
            }
            Some(Ok(Lock::Refuse)) => {
                drop(locked);
                self.set_errno(libc::ENOMEM);
                return -1;
            }
            Some(Ok(Lock::Downgrade(bytes, over))) => {
                drop(locked);
                quiet(|| self.downgraded(api, site, bytes, over));
                self.set_errno(self.entry_errno);
                return 0;
            }
            Some(Ok(Lock::Pin(r))) => r,
        };
        let rc = real();
        let err = self.errno();
        quiet(|| {
            drop(reservation); // the walk takes what the kernel actually locked
            if rc == 0 {
                let mut added = 0;
                walked(locked.sync(self.t, now, |s, e| {
                    added += (e - s) as u64;
                    Some((api, site))
                }));
                // mlockall without MCL_FUTURE ends an earlier one's.
                locked.future = (flags & libc::MCL_FUTURE != 0).then(|| self.live(api, 0, site, Backing::Pinned));
                ledger::count_alloc(self.t, api, site, added);
            } else {
                ledger::count_failed(self.t, api);
            }
        });
        drop(locked);
        self.set_errno(err);
        rc
    }

    pub fn munlockall(self, real: impl FnOnce() -> c_int) -> c_int {
        let mut locked = ledger::locked_pages();
        let rc = real();
        let err = self.errno();
        if rc == 0 {
            quiet(|| {
                let removed = locked.clear(self.t, self.now());
                if removed > 0 {
                    budget::release(removed);
                    ledger::count_release(self.t);
                }
            });
        }
        drop(locked);
        self.set_errno(err);
        rc
    }
}
