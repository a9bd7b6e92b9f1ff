//! The shared machinery every hook calls: guard, callsite, budget decision, real call (or the
//! pageable fallback), ledger. Hooks only translate their API's arguments and codes into these.

use crate::api::{Api, Family};
use crate::budget;
use crate::callsite::{self, Callsite};
use crate::config::{Config, Policy};
use crate::guard::{self, Reentry, Thread};
use crate::kernel;
use crate::ledger::{self, Live};
use crate::lifecycle;
use crate::pageable;
use crate::ranges::{page_size, page_span};
use crate::stack;
use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

/// One intercepted call, on the outermost level of this thread, with tracking switched on.
pub struct Hook {
    _reentry: Reentry,
    t: &'static Thread,
    entry_errno: c_int,
    /// The coarse clock, read at most once per call (0: not yet).
    now: Cell<u64>,
    cfg: &'static Config,
    /// The hook's own frame, where a stack walk starts.
    from: crate::unwind::Regs,
}

/// What a pinning call asks for, as far as the budget decision is concerned.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Pageable memory can stand in for it (`downgrade` may serve it).
    Pageable,
    /// The device maps it: pinned or nothing.
    Mapped,
    /// Arguments the runtime rejects (unknown flags): the runtime's own answer is passed on,
    /// whatever the budget says, so the caller sees exactly the error it would see without pinguard.
    Rejected,
}

impl Request {
    /// Classifies `flags` against the API's known flags and its device-mapping flag.
    pub fn from_flags(flags: u32, known: u32, mapped: u32) -> Request {
        if flags & !known != 0 {
            Request::Rejected
        } else if flags & mapped != 0 {
            Request::Mapped
        } else {
            Request::Pageable
        }
    }
}

enum Admission {
    Pin,
    Refuse,
    Downgrade,
}

/// Runs pinguard's own bookkeeping; a panic in it must never cross into the host's C code.
fn quiet<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// Runs `f` for an application call that is not an allocation (`dlclose`): only when tracking is
/// on and this thread is not already inside pinguard, with `errno` as the caller left it.
pub fn quietly_tracked<T>(f: impl FnOnce() -> T) -> Option<T> {
    let reentry = Reentry::enter()?;
    let t = reentry.thread();
    let err = t.errno();
    let out = lifecycle::ensure_init(t).and_then(|_| quiet(f));
    t.set_errno(err);
    out
}

impl Hook {
    /// `None`: pass the call straight through (nested call, pinguard disabled, family off).
    /// Inlined into each hook, so that `from` is the hook's frame.
    #[inline(always)]
    pub fn enter(family: Family) -> Option<Hook> {
        let from = crate::unwind::Regs::here();
        let t = guard::here();
        let reentry = Reentry::enter_on(t)?;
        let cfg = lifecycle::ensure_init(t)?;
        if cfg.hooks & family.bit() == 0 {
            return None;
        }
        crate::reporter::restart_if_forked(cfg);
        Some(Hook { _reentry: reentry, t, entry_errno: t.errno(), now: Cell::new(0), cfg, from })
    }

    #[inline]
    fn now(&self) -> u64 {
        match self.now.get() {
            0 => {
                let now = guard::coarse_unix_ms();
                self.now.set(now);
                now
            }
            now => now,
        }
    }

    #[inline]
    fn live(&self, api: Api, size: u64, site: &'static Callsite, downgraded: bool) -> Live {
        Live::new(self.t, api, size, site, downgraded, self.now())
    }

    /// A call pinguard does not account (no out-pointer, nothing to pin): the runtime answers,
    /// and a failure still counts as one.
    fn untracked<R: PartialEq>(&self, api: Api, ok: R, rc: R) -> R {
        if rc != ok {
            let err = self.t.errno();
            quiet(|| ledger::count_failed(self.t, api));
            self.t.set_errno(err);
        }
        rc
    }

    #[inline]
    fn site(&self) -> &'static Callsite {
        if self.cfg.depth == 0 && (self.cfg.py_depth == 0 || !crate::python::known(self.t)) {
            return callsite::empty(); // no frames to gather: no buffer to clear either
        }
        // Native frames, a separator, Python frames: only the part this configuration can fill
        // is cleared (the whole buffer is 2 KiB, and clearing it cost more than the walk).
        let depth = (self.cfg.depth as usize).min(stack::MAX_FRAMES);
        let py_depth = (self.cfg.py_depth as usize).min(stack::MAX_FRAMES);
        let mut buf = std::mem::MaybeUninit::<[usize; 2 * stack::MAX_FRAMES + 1]>::uninit();
        let used = depth + 1 + py_depth;
        // SAFETY: `used` <= the buffer's length, and the slice covers only what was just zeroed.
        let frames = unsafe {
            let base = buf.as_mut_ptr() as *mut usize;
            std::ptr::write_bytes(base, 0, used);
            std::slice::from_raw_parts_mut(base, used)
        };
        let (native, rest) = frames.split_at_mut(depth);
        let mut n = stack::capture(self.from, native);
        let py = crate::python::capture(self.t, py_depth, &mut rest[1..]);
        if py > 0 {
            frames[n] = callsite::PYTHON;
            frames.copy_within(depth + 1..depth + 1 + py, n + 1);
            n += 1 + py;
        }
        callsite::intern(&frames[..n])
    }

    #[inline]
    fn admit(&self, api: Api, bytes: u64, site: &'static Callsite, req: Request) -> Admission {
        if req == Request::Rejected {
            budget::force(bytes); // given back when the runtime refuses, as it will
            return Admission::Pin;
        }
        if budget::try_reserve(bytes) {
            return Admission::Pin;
        }
        match self.cfg.policy {
            Policy::Downgrade if req == Request::Pageable => Admission::Downgrade,
            Policy::Error | Policy::Downgrade => {
                ledger::count_denied(self.t, api, site, bytes);
                Admission::Refuse
            }
            Policy::Warn => {
                budget::force(bytes);
                ledger::count_over_budget(self.t, api, site, bytes);
                if !site.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "{} of {} bytes goes over the budget of {} bytes (callsite {}; logged once per callsite)",
                        api.name(),
                        bytes,
                        budget::limit().unwrap_or(0),
                        site.id
                    );
                }
                Admission::Pin
            }
        }
    }

    /// `cudaHostAlloc` and friends: the runtime writes the new pointer to `out`.
    pub fn alloc<R: Copy + PartialEq>(
        self,
        api: Api,
        out: *mut *mut c_void,
        size: usize,
        req: Request,
        ok: R,
        oom: R,
        real: impl FnOnce() -> R,
    ) -> R {
        if out.is_null() || size == 0 {
            return self.untracked(api, ok, real()); // the runtime's own answer; nothing gets pinned
        }
        let bytes = size as u64;
        let Some((site, admission)) = quiet(|| {
            let site = self.site();
            (site, self.admit(api, bytes, site, req))
        }) else {
            return real();
        };
        match admission {
            Admission::Refuse => {
                self.t.set_errno(self.entry_errno);
                return oom;
            }
            Admission::Downgrade => {
                let Some(p) = pageable::alloc(size) else {
                    quiet(|| ledger::count_denied(self.t, api, site, bytes));
                    self.t.set_errno(self.entry_errno);
                    return oom;
                };
                unsafe { *out = p };
                quiet(|| {
                    ledger::insert(p as usize, self.live(api, bytes, site, true));
                    ledger::count_downgraded(self.t, api, site, bytes);
                    ledger::downgraded_live_delta(self.t, bytes as i64);
                });
                self.t.set_errno(self.entry_errno);
                return ok;
            }
            Admission::Pin => {}
        }
        let rc = real();
        let err = self.t.errno();
        let p = if rc == ok { unsafe { (*out) as usize } } else { 0 };
        quiet(|| {
            if p != 0 {
                ledger::insert(p, self.live(api, bytes, site, false));
                ledger::count_alloc(self.t, api, site, bytes);
                ledger::live_delta(self.t, api, site, bytes as i64, 1, self.now());
            } else {
                budget::release(bytes);
                if rc != ok {
                    ledger::count_failed(self.t, api);
                }
            }
        });
        self.t.set_errno(err);
        rc
    }

    /// `cudaHostRegister` and friends: pins memory the caller already owns.
    pub fn register<R: Copy + PartialEq>(
        self,
        api: Api,
        addr: *mut c_void,
        size: usize,
        req: Request,
        ok: R,
        oom: R,
        real: impl FnOnce() -> R,
    ) -> R {
        if addr.is_null() || size == 0 {
            return self.untracked(api, ok, real());
        }
        let bytes = size as u64;
        let Some((site, admission)) = quiet(|| {
            let site = self.site();
            (site, self.admit(api, bytes, site, req))
        }) else {
            return real();
        };
        match admission {
            Admission::Refuse => {
                self.t.set_errno(self.entry_errno);
                return oom;
            }
            Admission::Downgrade => {
                quiet(|| {
                    ledger::insert(addr as usize, self.live(api, bytes, site, true));
                    ledger::count_downgraded(self.t, api, site, bytes);
                    ledger::downgraded_live_delta(self.t, bytes as i64);
                });
                self.t.set_errno(self.entry_errno);
                return ok;
            }
            Admission::Pin => {}
        }
        let rc = real();
        let err = self.t.errno();
        quiet(|| {
            if rc == ok {
                ledger::insert(addr as usize, self.live(api, bytes, site, false));
                ledger::count_alloc(self.t, api, site, bytes);
                ledger::live_delta(self.t, api, site, bytes as i64, 1, self.now());
            } else {
                budget::release(bytes);
                ledger::count_failed(self.t, api);
            }
        });
        self.t.set_errno(err);
        rc
    }

    /// `cudaFreeHost`, `cudaHostUnregister` and friends. `frees` says which entry points' records
    /// this call releases; `owned` that pinguard allocated a downgraded one itself.
    pub fn release<R: Copy + PartialEq>(
        self,
        api: Api,
        addr: *mut c_void,
        frees: &[Api],
        ok: R,
        real: impl FnOnce() -> R,
    ) -> R {
        if addr.is_null() {
            return self.untracked(api, ok, real());
        }
        let taken = quiet(|| ledger::take(addr as usize, |a| frees.contains(&a))).flatten();
        match taken {
            Some(l) if l.downgraded => {
                quiet(|| {
                    if matches!(
                        l.api,
                        Api::CudaHostAlloc
                            | Api::CudaMallocHost
                            | Api::CuMemHostAlloc
                            | Api::CuMemAllocHostV2
                            | Api::CuMemAllocHost
                            | Api::AclrtMallocHost
                            | Api::AclrtMallocHostWithCfg
                    ) {
                        pageable::free(addr as usize, l.size as usize);
                    }
                    ledger::downgraded_live_delta(self.t, -(l.size as i64));
                    ledger::count_release(self.t);
                });
                self.t.set_errno(self.entry_errno);
                ok
            }
            Some(l) => {
                let rc = real();
                let err = self.t.errno();
                quiet(|| {
                    if rc == ok {
                        // Live figures first, budget second: a thread that takes the freed budget
                        // must never see the ledger above the budget.
                        ledger::live_delta(self.t, l.api, l.site, -(l.size as i64), -1, self.now());
                        budget::release(l.size);
                        ledger::count_release(self.t);
                    } else {
                        ledger::insert(addr as usize, l);
                        ledger::count_failed(self.t, api);
                    }
                });
                self.t.set_errno(err);
                rc
            }
            None => {
                let rc = real();
                let err = self.t.errno();
                quiet(|| {
                    ledger::count_unknown_release(self.t, api);
                    if rc != ok {
                        ledger::count_failed(self.t, api);
                    }
                });
                self.t.set_errno(err);
                rc
            }
        }
    }

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
            Admission::Pin => {}
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
            Admission::Pin => {}
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
            Admission::Pin => {}
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
