//! The locking family's accounting: `mlock`, `mlock2`, `munlock`, `munmap`, `mmap(MAP_LOCKED)`,
//! `mlockall`, `munlockall`. Pages are counted as the kernel counts them: a page locked twice is
//! locked once.

use super::{quiet, Admission, Hook, Request};
use crate::api::Api;
use crate::budget;
use crate::callsite::Callsite;
use crate::config::Policy;
use crate::kernel;
use crate::ledger;
use crate::ranges::{page_size, page_span};
use std::os::raw::{c_int, c_void};

impl Hook {
    /// `mlock`, `mlock2`: only pages not already locked count, as in the kernel.
    pub fn lock_range(self, api: Api, addr: usize, len: usize, real: impl FnOnce() -> c_int) -> c_int {
        let Some((start, end)) = page_span(addr, len, page_size()).filter(|_| len > 0) else {
            return self.untracked(api, 0, real());
        };
        let Some(site) = quiet(|| self.site()) else { return real() };
        let mut locked = ledger::locked();
        let gaps = locked.ranges.gaps(start, end);
        let new: u64 = gaps.iter().map(|(s, e)| (e - s) as u64).sum();
        if new == 0 {
            return self.untracked(api, 0, real()); // every page is locked already
        }
        let Some(admission) = quiet(|| self.admit(api, new, site, Request::Pageable)) else { return real() };
        match admission {
            Admission::Refuse => {
                self.t.set_errno(libc::ENOMEM);
                return -1;
            }
            Admission::Downgrade => {
                quiet(|| ledger::count_downgraded(self.t, api, site, new));
                self.t.set_errno(self.entry_errno);
                return 0;
            }
            // The bytes are given back by hand below when the call fails.
            Admission::Pin(r) => r.commit(),
            Admission::Pass => {}
        }
        let rc = real();
        let err = self.t.errno();
        quiet(|| {
            if rc == 0 {
                for (s, e) in gaps {
                    locked.ranges.insert(s, e, self.live(api, (e - s) as u64, site, false));
                    ledger::live_delta(self.t, api, site, (e - s) as i64, 1, self.now());
                }
                ledger::count_alloc(self.t, api, site, new);
            } else {
                // The kernel may have locked the pages before a hole in the range.
                let added = self.reconcile(&mut locked, start, end, Some((api, site)));
                budget::release(new.saturating_sub(added));
                if added > 0 {
                    ledger::count_alloc(self.t, api, site, added);
                }
                ledger::count_failed(self.t, api);
            }
        });
        drop(locked);
        self.t.set_errno(err);
        rc
    }

    /// `munlock`, `munmap`, and `mmap(MAP_FIXED)` over existing pages: whatever they cover stops
    /// being locked once the real call succeeds.
    pub fn unlock_range<R>(self, api: Api, addr: usize, len: usize, real: impl FnOnce() -> R, ok: impl Fn(&R) -> bool) -> R {
        let span = page_span(addr, len, page_size());
        let (Some((start, end)), true) = (span, ledger::locked_any()) else {
            return real();
        };
        let mut locked = ledger::locked();
        let rc = real();
        let err = self.t.errno();
        if ok(&rc) {
            quiet(|| {
                let mut removed = 0u64;
                locked.ranges.remove(start, end, |l, bytes, count| {
                    ledger::live_delta(self.t, l.api, l.site, -(bytes as i64), count, self.now());
                    removed += bytes;
                });
                if removed > 0 {
                    budget::release(removed);
                    ledger::count_release(self.t);
                }
            });
        } else if api == Api::Munlock {
            // A failed munlock still unlocked the mappings before the first hole.
            quiet(|| self.reconcile(&mut locked, start, end, None));
        }
        drop(locked);
        self.t.set_errno(err);
        rc
    }

    /// `mmap` with `MAP_LOCKED`. `real` takes the flags so the downgrade can drop `MAP_LOCKED`.
    pub fn mmap_locked(self, addr: usize, len: usize, flags: c_int, real: impl Fn(c_int) -> *mut c_void) -> *mut c_void {
        let api = Api::Mmap;
        let Some((_, rounded)) = page_span(0, len, page_size()).filter(|_| len > 0) else {
            return real(flags);
        };
        let bytes = rounded as u64;
        let Some((site, admission)) = quiet(|| {
            let site = self.site();
            (site, self.admit(api, bytes, site, Request::Pageable))
        }) else {
            return real(flags);
        };
        match admission {
            Admission::Refuse => {
                self.t.set_errno(libc::EAGAIN);
                return libc::MAP_FAILED;
            }
            Admission::Downgrade => {
                let p = real(flags & !libc::MAP_LOCKED);
                let err = self.t.errno();
                if p != libc::MAP_FAILED {
                    quiet(|| ledger::count_downgraded(self.t, api, site, bytes));
                }
                self.t.set_errno(err);
                return p;
            }
            // The bytes are given back by hand below when the call fails.
            Admission::Pin(r) => r.commit(),
            Admission::Pass => {}
        }
        let mut locked = ledger::locked();
        let p = real(flags);
        let err = self.t.errno();
        quiet(|| {
            if p != libc::MAP_FAILED {
                let start = p as usize;
                if flags & libc::MAP_FIXED != 0 || addr == start {
                    // A fixed mapping replaces what was there, locks included.
                    let mut removed = 0u64;
                    locked.ranges.remove(start, start + rounded, |l, b, c| {
                        ledger::live_delta(self.t, l.api, l.site, -(b as i64), c, self.now());
                        removed += b;
                    });
                    budget::release(removed);
                }
                locked.ranges.insert(start, start + rounded, self.live(api, bytes, site, false));
                ledger::live_delta(self.t, api, site, bytes as i64, 1, self.now());
                ledger::count_alloc(self.t, api, site, bytes);
            } else {
                budget::release(bytes);
                ledger::count_failed(self.t, api);
            }
        });
        drop(locked);
        self.t.set_errno(err);
        p
    }

    /// `mlockall` cannot be attributed per page: the kernel's `VmLck` before and after is the entry.
    pub fn mlockall(self, flags: c_int, real: impl FnOnce() -> c_int) -> c_int {
        let api = Api::Mlockall;
        let status = kernel::status();
        let before = status.vm_lck.unwrap_or(0);
        // What MCL_CURRENT may lock: every mapped page (the pages locked already are in VmSize
        // too, so this is an upper bound, which is what a budget needs).
        let estimate = if flags & libc::MCL_CURRENT != 0 { status.vm_size.unwrap_or(0) } else { 0 };
        // MCL_FUTURE locks every later mapping without asking anyone: under a budget (and not
        // `warn`), that is a refusal, or under `downgrade` a success that locks nothing.
        let blank_cheque = flags & libc::MCL_FUTURE != 0 && budget::limited() && self.cfg.policy != Policy::Warn;
        let Some((site, admission)) = quiet(|| {
            let site = self.site();
            if blank_cheque {
                let a = match self.cfg.policy {
                    Policy::Downgrade => Admission::Downgrade,
                    _ => {
                        ledger::count_denied(self.t, api, site, estimate);
                        Admission::Refuse
                    }
                };
                return (site, a);
            }
            (site, self.admit(api, estimate, site, Request::Pageable))
        }) else {
            return real();
        };
        match admission {
            Admission::Refuse => {
                self.t.set_errno(libc::ENOMEM);
                return -1;
            }
            Admission::Downgrade => {
                quiet(|| ledger::count_downgraded(self.t, api, site, estimate));
                self.t.set_errno(self.entry_errno);
                return 0;
            }
            // The bytes are given back by hand below when the call fails.
            Admission::Pin(r) => r.commit(),
            Admission::Pass => {}
        }
        let mut locked = ledger::locked();
        let rc = real();
        let err = self.t.errno();
        quiet(|| {
            budget::release(estimate);
            if rc == 0 {
                let delta = kernel::status().vm_lck.unwrap_or(0).saturating_sub(before);
                budget::force(delta);
                let fresh = locked.mlockall.is_none();
                let entry = locked.mlockall.get_or_insert_with(|| self.live(api, 0, site, false));
                entry.size += delta;
                let owner = entry.site;
                ledger::live_delta(self.t, api, owner, delta as i64, fresh as i64, self.now());
                ledger::count_alloc(self.t, api, site, delta);
            } else {
                ledger::count_failed(self.t, api);
            }
        });
        drop(locked);
        self.t.set_errno(err);
        rc
    }

    pub fn munlockall(self, real: impl FnOnce() -> c_int) -> c_int {
        let mut locked = ledger::locked();
        let rc = real();
        let err = self.t.errno();
        if rc == 0 {
            quiet(|| {
                let mut removed = 0u64;
                locked.ranges.clear(|l, b, c| {
                    ledger::live_delta(self.t, l.api, l.site, -(b as i64), c, self.now());
                    removed += b;
                });
                if let Some(l) = locked.mlockall.take() {
                    ledger::live_delta(self.t, l.api, l.site, -(l.size as i64), -1, self.now());
                    removed += l.size;
                }
                if removed > 0 {
                    budget::release(removed);
                    ledger::count_release(self.t);
                }
            });
        }
        drop(locked);
        self.t.set_errno(err);
        rc
    }

    /// Makes the ledger's view of `[start, end)` match the kernel's after a call that failed part-way.
    /// Pages the kernel no longer has locked are released; with `lock`, pages it newly locked are
    /// recorded for that call. Returns the bytes added.
    fn reconcile(&self, locked: &mut ledger::LockedGuard, start: usize, end: usize, lock: Option<(Api, &'static Callsite)>) -> u64 {
        let Some(parts) = kernel::locked_parts(start, end) else { return 0 };
        let mut removed = 0u64;
        let mut cur = start;
        for &(s, e) in parts.iter().chain(std::iter::once(&(end, end))) {
            if s > cur {
                locked.ranges.remove(cur, s, |l, b, c| {
                    ledger::live_delta(self.t, l.api, l.site, -(b as i64), c, self.now());
                    removed += b;
                });
            }
            cur = cur.max(e);
        }
        if removed > 0 {
            budget::release(removed);
            ledger::count_release(self.t);
        }
        let mut added = 0u64;
        if let Some((api, site)) = lock {
            for (s, e) in parts {
                for (gs, ge) in locked.ranges.gaps(s, e) {
                    locked.ranges.insert(gs, ge, self.live(api, (ge - gs) as u64, site, false));
                    ledger::live_delta(self.t, api, site, (ge - gs) as i64, 1, self.now());
                    added += (ge - gs) as u64;
                }
            }
        }
        added
    }
}
