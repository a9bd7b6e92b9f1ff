//! The shared machinery every hook calls: guard, callsite, budget decision, real call (or the
//! pageable fallback), ledger. Hooks only translate their API's arguments and codes into these.

use crate::accounting::callsite::{self, Callsite};
use crate::accounting::ledger::{self, Backing, Live, Outcome, Over};
use crate::api::{Api, Family};
use crate::budget;
use crate::capture::stack;
use crate::lifecycle;
use crate::runtime::config::{Config, Policy};
use crate::runtime::guard::{self, Reentry, Thread};
use crate::runtime::pageable;
use crate::runtime::room::Room;
use crate::runtime::workstack;
use pinguard_common::units::format_bytes;
use pinguard_common::Limit;
use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

/// One intercepted call, on the outermost level of this thread, with tracking switched on.
pub struct Hook {
    _reentry: Reentry,
    t: &'static Thread,
    /// This thread's `errno`, looked up once per call.
    errno: *mut c_int,
    entry_errno: c_int,
    /// The coarse clock, read at most once per call (0: not yet).
    now: Cell<u64>,
    cfg: &'static Config,
    /// The hook's own frame, where a stack walk starts.
    from: crate::capture::unwind::Regs,
}

/// What the `warn` line says about a call over the budget, the first from its callsite.
#[derive(Clone, Copy)]
struct OverBudget {
    site: &'static Callsite,
    api: Api,
    bytes: u64,
    /// Which limit it goes over.
    over: Over,
}

/// A `warn` line held back while the locking family holds the locked-page view: naming a
/// callsite takes locks (Python's frame table, the fork gate, the loader's) that are never to be
/// taken under the view's (the fork handlers take them first). Made before the view's guard, so
/// dropped after it, whichever way the call returns; the other families write the line at once.
pub(crate) struct WarnLater<'h> {
    hook: &'h Hook,
    over: Cell<Option<OverBudget>>,
}

impl<'h> WarnLater<'h> {
    #[inline]
    pub(crate) fn new(hook: &'h Hook) -> WarnLater<'h> {
        WarnLater {
            hook,
            over: Cell::new(None),
        }
    }
}

impl Drop for WarnLater<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(w) = self.over.get() {
            self.hook.warn_over_budget(w);
        }
    }
}

// Used by the hooks, which tests and the fuzz targets build without.
#[cfg_attr(any(test, feature = "fuzzing"), allow(dead_code))]
pub mod device;
mod handles;
mod locking;
mod physical;
mod pools;
mod shared;
// Used by the hooks, which tests and the fuzz targets build without.
#[cfg_attr(any(test, feature = "fuzzing"), allow(unused_imports))]
pub use locking::{kernel_truth, MmapArgs};
#[cfg_attr(any(test, feature = "fuzzing"), allow(unused_imports))]
pub use pools::PoolApi;
mod scope;

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

/// A family's answers in its API's own codes: success, which tells the runtime's answers apart,
/// and those pinguard gives itself without calling the runtime. One constant per family (CUDA
/// runtime, CUDA driver, ACL), passed whole.
#[derive(Clone, Copy)]
pub struct Codes<R> {
    pub ok: R,
    /// Out of memory: a refusal over the budget.
    pub oom: R,
    /// Memory registered twice (the second registration of memory `downgrade` left unpinned).
    pub already: R,
}

/// A registration's arguments, as the budget and the ledger see them.
#[derive(Clone, Copy)]
struct Registration {
    api: Api,
    addr: usize,
    bytes: u64,
    req: Request,
}

pub(crate) enum Admission {
    /// Pin, with the budget's bytes held for the call.
    Pin(budget::Reservation),
    /// The runtime will reject the arguments: its own answer, the budget untouched.
    Pass,
    Refuse,
    /// Serve pageable memory instead: the call went over this limit.
    Downgrade(Over),
}

/// The limit a refused reservation went over, as the ledger records it.
pub(crate) fn over(why: budget::Refused) -> Over {
    match why {
        budget::Refused::Budget if budget::closed() => Over::config_error(),
        budget::Refused::Budget => Over::budget(),
        budget::Refused::Group => Over::group_budget(),
        budget::Refused::GroupUnavailable => Over::group_unavailable(),
        budget::Refused::Host { available } => Over::host_reserve(available),
        budget::Refused::Cgroup { headroom } => Over::cgroup_reserve(headroom),
    }
}

/// The process's room for a refused, downgraded or failed call's event (never read on a call
/// that succeeds within its limits): a cgroup reserve's refusal carries its own reading.
#[cold]
#[inline(never)]
pub(crate) fn room(over: Over, code: Option<i32>) -> Room {
    Room::now(over.cgroup_headroom(), budget::limit(), code)
}

/// A pinning call the runtime or the kernel failed with `code`: counted, with an event that
/// says what room the process had, or counted into the event of the same failure just before,
/// in a burst of it (`failed_again`). Every family's failure comes here.
#[cold]
#[inline(never)]
pub(crate) fn failed(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, code: i32) {
    let asked = crate::runtime::room::asked();
    let now = crate::runtime::clock::coarse_unix_ms();
    if !failed_again(t, api, site, bytes, code, asked, now) {
        let room = Room::now(None, budget::limit(), Some(code));
        ledger::count_failed_at(t, api, site, bytes, room);
    }
}

/// A failure counted into the latest event, where that is the same failure less than 100 ms
/// before `now` (`ledger::failed_again`); whether it was. Cheap enough for the caller's stack.
#[inline]
pub(crate) fn failed_again(
    t: &Thread,
    api: Api,
    site: &'static Callsite,
    bytes: u64,
    code: i32,
    asked: Option<u64>,
    now: u64,
) -> bool {
    let f = ledger::Failure {
        api,
        site,
        bytes,
        code,
        asked,
        budget: budget::limit(),
    };
    let again = ledger::failed_again(&f, now);
    if again {
        ledger::count_failed(t, api);
    }
    again
}

/// A call the host or cgroup reserve stopped, in the group's shared page too (for `pinguard top`).
fn note_host_reserve(over: Over) {
    match over.limit() {
        Limit::HostReserve => budget::group::note_host_reserve(),
        Limit::CgroupReserve => budget::group::note_cgroup_reserve(),
        _ => {}
    }
}

/// Keeps a successful pinning call's bytes: its reservation, or, for arguments pinguard expected
/// the runtime to reject (no reservation), the bytes taken from here on whatever the limit.
#[inline]
fn keep(reservation: Option<budget::Reservation>, bytes: u64) {
    match reservation {
        Some(r) => r.commit(),
        None => budget::force(bytes),
    }
}

/// What the stages before this layer need of it, handed over once pinguard is set up (by the first
/// hooked call, `lifecycle::hooks_ready`, or a C API call): the output stage matches its figures
/// with the kernel's through `kernel_truth`, which moves the budget with the view, and never moves
/// the budget itself. Idempotent.
pub(crate) fn wire() {
    crate::output::report::on_kernel_truth(|t, locked| kernel_truth(t, locked).0);
}

/// Marks the path that calls it as rare. Without it, a steady path reached past a run of early
/// returns (each one even odds, to the optimiser) looks cold: LLVM then gives its calls a much
/// smaller inlining budget (a call site under 2% of its function's estimated frequency), which
/// left the successful `mlock`'s bookkeeping and the locked view's guard out of line, about 60
/// instructions a page pair (callgrind). The empty `asm!` keeps the call from being removed.
#[cold]
#[inline(never)]
pub(crate) fn rare() {
    // SAFETY: an empty instruction sequence: it reads and writes nothing.
    unsafe { std::arch::asm!("", options(nomem, nostack, preserves_flags)) }
}

/// Runs pinguard's own bookkeeping; a panic in it must never cross into the host's C code.
pub(crate) fn quiet<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// A live record taken out for a release call, put back if the call unwinds before it returns.
struct PutBack<'l>(usize, &'l Live);

impl PutBack<'_> {
    /// The call returned: nothing to put back (and no drop to run).
    #[inline(always)]
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for PutBack<'_> {
    fn drop(&mut self) {
        let _ = quiet(|| ledger::insert(self.0, *self.1));
    }
}

impl Hook {
    /// `None`: pass the call straight through (nested call, pinguard disabled, family off).
    /// Inlined into each hook, so that `from` is the hook's frame.
    #[inline(always)]
    pub fn enter(family: Family) -> Option<Hook> {
        Hook::enter_from(family, crate::capture::unwind::Regs::here(), true)
    }

    /// `enter` for a release, which never walks the stack.
    #[inline(always)]
    pub fn enter_release(family: Family) -> Option<Hook> {
        Hook::enter_from(family, crate::capture::unwind::Regs::NONE, false)
    }

    #[inline(always)]
    fn enter_from(
        family: Family,
        from: crate::capture::unwind::Regs,
        pinning: bool,
    ) -> Option<Hook> {
        let t = guard::here();
        let reentry = Reentry::enter_on(t)?;
        let cfg = lifecycle::hooks_ready(t, pinning, wire)?;
        if cfg.hooks & family.bit() == 0 {
            return None;
        }
        let errno = t.errno_location();
        // SAFETY: `errno_location` is this thread's errno, valid for the thread's whole life.
        let entry_errno = unsafe { *errno };
        Some(Hook {
            _reentry: reentry,
            t,
            errno,
            entry_errno,
            now: Cell::new(0),
            cfg,
            from,
        })
    }

    /// Runs the whole tracked call `f` on this thread's own stack (`workstack`), the real call
    /// included: for calls whose real function is a plain system call (the locking family), which
    /// needs no stack of the caller's and is no cancellation point.
    #[inline(always)]
    pub fn on_own_stack<R>(self, f: impl FnOnce(Hook) -> R) -> R {
        let t = self.t;
        // The closure that crosses holds two pointers: the hook itself is moved once, over there.
        let mut hook = Some(self);
        workstack::run_hook(t, || hook.take().map(f).expect("taken once"))
    }

    /// Runs pinguard's work `f` on this thread's own stack (`workstack`): anything that may need
    /// more than a few hundred bytes of stack (a walk, a callsite's first sight, a `warn` line, the
    /// group's ledger).
    #[inline(always)]
    pub(crate) fn work<R>(&self, f: impl FnOnce() -> R) -> R {
        workstack::run(self.t, f)
    }

    /// The caller's `errno`, as it is now.
    #[inline(always)]
    pub(crate) fn errno(&self) -> c_int {
        // SAFETY: `self.errno` is this thread's errno (`enter_from`), and a hook never leaves its thread.
        unsafe { *self.errno }
    }

    #[inline(always)]
    pub(crate) fn set_errno(&self, v: c_int) {
        // SAFETY: as in `errno`.
        unsafe { *self.errno = v }
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match self.now.get() {
            0 => {
                let now = crate::runtime::clock::coarse_unix_ms();
                self.now.set(now);
                now
            }
            now => now,
        }
    }

    #[inline]
    pub(crate) fn live(
        &self,
        api: Api,
        size: u64,
        site: &'static Callsite,
        backing: Backing,
    ) -> Live {
        Live::new(self.t, api, size, site, backing, self.now())
    }

    /// A call pinguard does not account (no out-pointer, nothing to pin): the runtime answers,
    /// and a failure still counts as one.
    pub(crate) fn untracked<R: PartialEq>(&self, api: Api, ok: R, rc: R) -> R {
        if rc != ok {
            self.errno_kept(|| quiet(|| ledger::count_failed(self.t, api)));
        }
        rc
    }

    /// Runs pinguard's own `f` (a record, a `warn` line), the caller's `errno` as it was before.
    #[inline(always)]
    pub(crate) fn errno_kept<T>(&self, f: impl FnOnce() -> T) -> T {
        let err = self.errno();
        let out = f();
        self.set_errno(err);
        out
    }

    /// Makes the real call and records its answer: `record` (under `quiet`) sees what it
    /// returned and the `errno` it left, which is the `errno` the caller sees afterwards, whatever
    /// the record did to it.
    #[inline(always)]
    pub(crate) fn call<R>(&self, real: impl FnOnce() -> R, record: impl FnOnce(&R, c_int)) -> R {
        let rc = real();
        let err = self.errno();
        quiet(|| record(&rc, err));
        self.set_errno(err);
        rc
    }

    /// `call` under `guard` (the locked-page view's), held through the record and let go before
    /// the caller's `errno` is put back (letting it go may be a system call). `record` runs as
    /// it is, putting `quiet` around what may panic itself: on the locking family's steady path,
    /// a `quiet` around the whole record kept it out of line (about 25 instructions an `mlock`
    /// pair, callgrind).
    #[inline(always)]
    pub(crate) fn call_holding<G, R>(
        &self,
        mut guard: G,
        real: impl FnOnce() -> R,
        record: impl FnOnce(&R, c_int, &mut G),
    ) -> R {
        let rc = real();
        let err = self.errno();
        record(&rc, err, &mut guard);
        drop(guard);
        self.set_errno(err);
        rc
    }

    /// An answer pinguard gives without calling the runtime (a refusal, a downgrade), with
    /// `errno` as the program left it on entry.
    #[inline(always)]
    pub(crate) fn answer<R>(&self, rc: R) -> R {
        self.set_errno(self.entry_errno);
        rc
    }

    /// A failure pinguard answers itself, with the `errno` the kernel would have set.
    #[inline(always)]
    pub(crate) fn fail<R>(&self, rc: R, errno: c_int) -> R {
        self.set_errno(errno);
        rc
    }

    // Always inlined: at depth 0 the call is the whole cost of this function, and the memo's
    // check (`from_tag`) grew by a generation compare that tipped the inliner the other way.
    #[inline(always)]
    pub(crate) fn site(&self) -> &'static Callsite {
        let python = self.cfg.py_depth != 0 && crate::capture::python::known(self.t);
        if self.cfg.depth == 0 && !python {
            return callsite::empty(); // no frames to gather: no buffer to clear either
        }
        if !python {
            // Native frames alone: a walk this thread remembers names its callsite at once.
            let depth = (self.cfg.depth as usize).min(stack::MAX_FRAMES);
            let recalled = stack::recall(&self.from, depth);
            // SAFETY: tags are set below, from `callsite::tag`, and nowhere else.
            if let Some(cs) = recalled.and_then(|t| unsafe { callsite::from_tag(t) }) {
                return cs;
            }
        }
        self.walk_site(python)
    }

    /// `site` for a stack no remembered walk names: walk it (or recall its frames), add the Python
    /// frames, and find or make its callsite.
    #[inline(never)]
    fn walk_site(&self, python: bool) -> &'static Callsite {
        self.work(|| {
            if workstack::is_short(self.t) {
                return callsite::empty(); // no stack of pinguard's to walk on: the call still counts
            }
            self.walk_site_here(python)
        })
    }

    fn walk_site_here(&self, python: bool) -> &'static Callsite {
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
        let py = if python {
            crate::capture::python::capture(self.t, py_depth, &mut rest[1..])
        } else {
            0
        };
        if py > 0 {
            frames[n] = callsite::PYTHON;
            frames.copy_within(depth + 1..depth + 1 + py, n + 1);
            n += 1 + py;
        }
        let cs = callsite::intern(&frames[..n]);
        if let Some(tag) = callsite::tag(cs).filter(|_| !python && n > 0) {
            stack::tag(self.from, tag);
        }
        cs
    }

    // Always inlined: out of line, the call and the decision's return through memory cost the
    // CUDA pair about 30 instructions (callgrind), a twentieth of pinguard's share.
    #[inline(always)]
    pub(crate) fn admit(
        &self,
        api: Api,
        bytes: u64,
        site: &'static Callsite,
        req: Request,
    ) -> Admission {
        self.admit_or_hold(api, bytes, site, req, None)
    }

    /// `admit`, with the `warn` line held in `later` when there is one (under the locked-page view).
    #[inline(always)]
    pub(crate) fn admit_or_hold(
        &self,
        api: Api,
        bytes: u64,
        site: &'static Callsite,
        req: Request,
        later: Option<&WarnLater>,
    ) -> Admission {
        if req == Request::Rejected {
            return Admission::Pass;
        }
        let reserved = budget::reserve(bytes);
        match reserved {
            Ok(r) => Admission::Pin(r),
            Err(why) => self.over_budget(api, bytes, site, req, later, over(why)),
        }
    }

    /// The policy's answer for a call that `over` has no room for, on this thread's own stack
    /// (the `warn` line names the callsite from symbol tables).
    #[inline(never)]
    fn over_budget(
        &self,
        api: Api,
        bytes: u64,
        site: &'static Callsite,
        req: Request,
        later: Option<&WarnLater>,
        over: Over,
    ) -> Admission {
        self.work(|| match self.unseen_let_go(bytes) {
            Some(r) => Admission::Pin(r),
            None => self.policy_answer(api, bytes, site, req, later, over),
        })
    }

    /// Before a refusal: pins the kernel counts and no call explains (`VmPin`) count against the
    /// budget, and may have been let go since they were last read (an `io_uring` ring's buffers
    /// unregistered). Read again only while some are counted; a reservation if they made room.
    fn unseen_let_go(&self, bytes: u64) -> Option<budget::Reservation> {
        if ledger::kernel_pinned() == 0 {
            return None;
        }
        let (_, d) = kernel_truth(self.t, false);
        if d.removed == 0 {
            return None;
        }
        budget::reserve(bytes).ok()
    }

    fn policy_answer(
        &self,
        api: Api,
        bytes: u64,
        site: &'static Callsite,
        req: Request,
        later: Option<&WarnLater>,
        over: Over,
    ) -> Admission {
        match self.policy(over) {
            Policy::Downgrade if req == Request::Pageable => {
                if self.downgrade_in_scope(site) {
                    Admission::Downgrade(over)
                } else {
                    self.answered(Outcome::DeniedOutOfScope, api, site, bytes, over);
                    Admission::Refuse
                }
            }
            Policy::Error | Policy::Downgrade => {
                self.answered(Outcome::Denied, api, site, bytes, over);
                Admission::Refuse
            }
            Policy::Warn => {
                // More than the figures can hold (SIZE_MAX) is the runtime's to reject.
                let Some(r) = budget::reserve_over(bytes) else {
                    return Admission::Pass;
                };
                ledger::count_outcome(self.t, Outcome::OverBudget, api, site, bytes, over, None);
                note_host_reserve(over);
                if !site.warned.swap(true, Ordering::Relaxed) {
                    let w = OverBudget {
                        site,
                        api,
                        bytes,
                        over,
                    };
                    match later {
                        Some(l) => l.over.set(Some(w)),
                        None => self.warn_over_budget(w),
                    }
                }
                Admission::Pin(r)
            }
        }
    }

    /// The policy for a call over `over`: a setting that could not be used (`PINGUARD_STRICT`)
    /// is refused whatever the policy says.
    pub(crate) fn policy(&self, over: Over) -> Policy {
        if over.limit() == Limit::ConfigError {
            Policy::Error
        } else {
            self.cfg.policy
        }
    }

    /// The `warn` line, once per callsite: `cudaHostAlloc of 4.00 MiB goes over the budget of
    /// 3.00 MiB at grow_kv_cache; allowed (policy warn; logged once per callsite)`, or for the
    /// host reserve `cudaHostAlloc of 4.00 MiB would leave the host 900 MiB available, below the
    /// reserve of 1.00 GiB at ...`. The callsite is named as `pinguard report` names it, but
    /// cheaply, since the application's call waits for it (`output::quick`); never under a lock
    /// of pinguard's (`WarnLater`).
    /// On pinguard's own stack: a held line is written when `WarnLater` drops, which may be on
    /// the caller's (the locking family's steady path).
    #[cold]
    #[inline(never)]
    fn warn_over_budget(&self, w: OverBudget) {
        if !tracing::enabled!(tracing::Level::WARN) {
            return;
        }
        self.work(|| self.write_warning(w));
    }

    fn write_warning(&self, w: OverBudget) {
        let _ = self.errno_kept(|| quiet(|| {
            let limit = |b: Option<u64>| b.map_or_else(|| "none".to_string(), format_bytes);
            let what = match (w.over.limit(), budget::group::snapshot()) {
                (Limit::HostReserve, _) => format!(
                    "would leave the host {} available, below the reserve of {}",
                    format_bytes(w.over.host_available().unwrap_or(0).saturating_sub(w.bytes)),
                    limit(budget::host::reserve())
                ),
                (Limit::CgroupReserve, _) => format!(
                    "would leave the cgroup {} of headroom, below the reserve of {}",
                    format_bytes(w.over.cgroup_headroom().unwrap_or(0).saturating_sub(w.bytes)),
                    limit(budget::cgroup::floor().reserve())
                ),
                (Limit::GroupBudget, Some(g)) => format!("goes over group {}'s budget of {}", g.name, limit(g.budget)),
                (Limit::GroupUnavailable, g) => format!(
                    "cannot be checked against group {}'s budget (its ledger's lock is held past {} ms by a member that does not run: group_unavailable)",
                    g.map(|g| g.name).unwrap_or_default(),
                    budget::group::LOCK_WAIT_MS
                ),
                _ => format!("goes over the budget of {}", limit(budget::limit())),
            };
            let at = crate::output::quick::short_label(w.site).map(|l| format!(" at {l}")).unwrap_or_default();
            let room = crate::output::why::room_line(&room(w.over, None));
            tracing::warn!("{} of {} {what}{at}; allowed (policy warn; logged once per callsite); {room}", w.api.name(), format_bytes(w.bytes));
        }));
    }

    /// The budget's answer for a call that no pageable memory can stand in for (the device maps
    /// it): `None` when refused (the caller answers with the API's out-of-memory code, errno as
    /// the program left it), else what is held for the call (nothing for arguments the runtime
    /// will reject).
    fn pinned_only(&self, admission: Admission) -> Option<Option<budget::Reservation>> {
        match admission {
            Admission::Refuse | Admission::Downgrade(_) => self.answer(None),
            Admission::Pin(r) => Some(Some(r)),
            Admission::Pass => Some(None),
        }
    }

    /// A call over a limit refused or downgraded (`outcome`), in the process's figures and the
    /// group's (whose members' refusals and downgrades are summed in the group's shared page).
    fn answered(
        &self,
        outcome: Outcome,
        api: Api,
        site: &'static Callsite,
        bytes: u64,
        over: Over,
    ) {
        let room = Some(room(over, None));
        ledger::count_outcome(self.t, outcome, api, site, bytes, over, room);
        match outcome {
            Outcome::Downgraded => budget::group::note_downgraded(),
            _ => budget::group::note_denied(),
        }
        note_host_reserve(over);
    }

    /// Records a successful pinning call at `addr`. A record already there is one whose release
    /// pinguard never saw (another route freed it): its figures go, so nothing counts twice.
    #[inline]
    fn record(&self, api: Api, addr: usize, bytes: u64, site: &'static Callsite) {
        if let Some(old) = ledger::insert(addr, self.live(api, bytes, site, Backing::Pinned)) {
            self.gone(&old);
        }
        ledger::alloc_live(self.t, api, site, bytes, self.now());
    }

    /// Records memory served in place of pinned memory (`downgrade`): pinguard's own pageable
    /// memory for an allocation, the caller's memory left unpinned for a registration.
    fn record_downgraded(
        &self,
        api: Api,
        addr: usize,
        bytes: u64,
        site: &'static Callsite,
        backing: Backing,
        over: Over,
    ) {
        if let Some(old) = ledger::insert(addr, self.live(api, bytes, site, backing)) {
            self.gone(&old);
        }
        self.answered(Outcome::Downgraded, api, site, bytes, over);
        ledger::downgraded_live_delta(self.t, bytes as i64);
    }

    /// A record's memory is no longer held: its figures leave the live levels and, were it
    /// pinned, its bytes go back to the budget (live figures first: a thread that takes the freed
    /// budget must never see the ledger above the budget). Pageable memory pinguard served is
    /// freed by the caller of this, which knows whether the runtime or pinguard holds it.
    #[inline(always)]
    fn gone(&self, l: &Live) {
        match l.backing {
            Backing::Pinned => {
                ledger::live_release(self.t, l.api, l.site, l.size, self.now());
                budget::release(l.size);
            }
            Backing::Pageable | Backing::Unpinned => {
                ledger::downgraded_live_delta(self.t, -(l.size as i64))
            }
        }
    }

    /// The callsite and the budget's decision for a pinning call of `bytes`.
    #[inline(always)]
    fn decide(&self, api: Api, bytes: u64, req: Request) -> (&'static Callsite, Admission) {
        let site = self.site();
        (site, self.admit(api, bytes, site, req))
    }

    /// A pinning call that succeeded: its reservation is kept and the memory recorded. Without a
    /// reservation (arguments pinguard expected the runtime to reject), the bytes are counted from
    /// here on, whatever the limit.
    #[inline]
    fn pinned(
        &self,
        api: Api,
        addr: usize,
        bytes: u64,
        site: &'static Callsite,
        reservation: Option<budget::Reservation>,
    ) {
        keep(reservation, bytes);
        self.record(api, addr, bytes, site);
    }

    /// `cudaHostAlloc` and friends: the runtime writes the new pointer to `out`.
    pub fn alloc<R: Copy + PartialEq + Into<i64>>(
        self,
        api: Api,
        out: *mut *mut c_void,
        size: usize,
        req: Request,
        codes: Codes<R>,
        real: impl FnOnce() -> R,
    ) -> R {
        if out.is_null() || size == 0 {
            return self.untracked(api, codes.ok, real()); // the runtime's own answer; nothing gets pinned
        }
        let bytes = size as u64;
        let Some((site, admission)) = quiet(|| self.decide(api, bytes, req)) else {
            return real();
        };
        let reservation = match admission {
            Admission::Refuse => return self.answer(codes.oom),
            Admission::Downgrade(over) => {
                return self.alloc_pageable(api, out, bytes, site, over, codes)
            }
            Admission::Pin(r) => Some(r),
            Admission::Pass => None,
        };
        // If `real` unwinds (a cancellation point inside the runtime), the reservation goes back.
        self.call(real, |&rc, _| {
            let p = if rc == codes.ok {
                // SAFETY: on success the runtime wrote the new pointer to `out`, which is not null.
                unsafe { (*out) as usize }
            } else {
                0
            };
            match p {
                0 if rc != codes.ok => failed(self.t, api, site, bytes, rc.into() as i32),
                0 => {}
                p => self.pinned(api, p, bytes, site, reservation),
            }
        })
    }

    /// An allocation over the budget served with pinguard's own pageable memory (`downgrade`).
    fn alloc_pageable<R: Copy>(
        &self,
        api: Api,
        out: *mut *mut c_void,
        bytes: u64,
        site: &'static Callsite,
        over: Over,
        codes: Codes<R>,
    ) -> R {
        let Some(p) = pageable::alloc(bytes as usize) else {
            quiet(|| self.answered(Outcome::Denied, api, site, bytes, over));
            return self.answer(codes.oom);
        };
        // SAFETY: `out` is not null (checked on entry) and the caller passed it for the runtime
        // to write the new pointer to.
        unsafe { *out = p };
        quiet(|| self.record_downgraded(api, p as usize, bytes, site, Backing::Pageable, over));
        self.answer(codes.ok)
    }

    /// `cudaHostRegister` and friends: pins memory the caller already owns. `codes.already` is
    /// the API's answer for memory registered twice.
    pub fn register<R: Copy + PartialEq + Into<i64>>(
        self,
        api: Api,
        addr: *mut c_void,
        size: usize,
        req: Request,
        codes: Codes<R>,
        real: impl FnOnce() -> R,
    ) -> R {
        if addr.is_null() || size == 0 {
            return self.untracked(api, codes.ok, real());
        }
        // A pointer with a live record is never recorded twice in its table. Downgraded: the
        // runtime never saw it, and answers as it would have had the first call pinned, without
        // pinning it now. Pinned: the runtime answers (CUDA refuses memory it pinned already;
        // ACL maps it for the device), and a registration it accepts adds only the bytes the
        // record did not cover (`register_over`).
        let reg = Registration {
            api,
            addr: addr as usize,
            bytes: size as u64,
            req,
        };
        match quiet(|| ledger::live_at(reg.addr)).flatten() {
            Some(l) if l.downgraded() => {
                quiet(|| ledger::count_failed(self.t, api));
                return self.answer(codes.already);
            }
            Some(l) => return self.register_over(reg, l.size, codes, real),
            None => {}
        }
        if let Some(pinned) = quiet(|| self.pinned_by_others(reg.addr, reg.bytes)).flatten() {
            return self.register_shared(reg, pinned, codes, real);
        }
        let Some((site, admission)) = quiet(|| self.decide(api, reg.bytes, req)) else {
            return real();
        };
        let reservation = match admission {
            Admission::Refuse => return self.answer(codes.oom),
            Admission::Downgrade(over) => {
                quiet(|| {
                    self.record_downgraded(api, reg.addr, reg.bytes, site, Backing::Unpinned, over)
                });
                return self.answer(codes.ok);
            }
            Admission::Pin(r) => Some(r),
            Admission::Pass => None,
        };
        self.call(real, |&rc, _| match rc == codes.ok {
            false => failed(self.t, api, site, reg.bytes, rc.into() as i32),
            true => self.pinned(api, reg.addr, reg.bytes, site, reservation),
        })
    }

    /// A registration of `reg.bytes` at `reg.addr`, where a pinned record of `covered` bytes
    /// starts already: pinned bytes are pages, so only the bytes past that record are new, and
    /// only they go through the budget. The registration is kept apart (`ledger::insert_over`),
    /// so that each release, in either order, takes exactly its own record.
    #[cold]
    fn register_over<R: Copy + PartialEq + Into<i64>>(
        self,
        reg: Registration,
        covered: u64,
        codes: Codes<R>,
        real: impl FnOnce() -> R,
    ) -> R {
        let Registration {
            api,
            addr,
            bytes,
            req,
        } = reg;
        let extra = bytes.saturating_sub(covered);
        let Some((site, admission)) = quiet(|| {
            let site = self.site();
            let admission = if extra == 0 {
                Admission::Pass
            } else {
                self.admit(api, extra, site, req)
            };
            (site, admission)
        }) else {
            return real();
        };
        let reservation = match admission {
            Admission::Refuse => return self.answer(codes.oom),
            Admission::Downgrade(over) => {
                // The new part stays unpinned; the runtime is not called, as for any downgraded
                // registration.
                quiet(|| {
                    ledger::insert_over(addr, self.live(api, extra, site, Backing::Unpinned));
                    self.answered(Outcome::Downgraded, api, site, extra, over);
                    ledger::downgraded_live_delta(self.t, extra as i64);
                });
                return self.answer(codes.ok);
            }
            Admission::Pin(r) => Some(r),
            Admission::Pass => None,
        };
        self.call(real, |&rc, _| {
            if rc != codes.ok {
                failed(self.t, api, site, bytes, rc.into() as i32);
                return;
            }
            keep(reservation, extra);
            ledger::insert_over(addr, self.live(api, extra, site, Backing::Pinned));
            ledger::count_alloc(self.t, api, site, extra);
            ledger::live_delta(self.t, api, site, extra as i64, 1, self.now());
        })
    }

    /// A registration of `reg.bytes` at `reg.addr`, `pinned` of which another route (an
    /// allocation, a registration, locked pages) pins already: only the rest goes through the
    /// budget, and the registration joins the routes it shares pages with (`track::shared`).
    #[cold]
    #[inline(never)]
    fn register_shared<R: Copy + PartialEq + Into<i64>>(
        self,
        reg: Registration,
        pinned: u64,
        codes: Codes<R>,
        real: impl FnOnce() -> R,
    ) -> R {
        let growth = reg.bytes.saturating_sub(pinned);
        let Some((site, admitted)) = quiet(|| {
            let site = self.site();
            (
                site,
                self.admit_shared(reg.api, reg.addr, growth, site, reg.req),
            )
        }) else {
            return real();
        };
        let reservation = match admitted {
            Ok(r) => r,
            Err(shared::NotPinned::Refused) => return self.answer(codes.oom),
            Err(shared::NotPinned::Downgraded) => return self.answer(codes.ok),
        };
        self.call(real, |&rc, _| match rc == codes.ok {
            false => failed(self.t, reg.api, site, reg.bytes, rc.into() as i32),
            true => self.pinned_shared(reg.api, reg.addr, reg.addr, reg.bytes, site, reservation),
        })
    }

    /// A release with no record of its kind at the address: a registration over already-pinned
    /// memory (`register_over`), which lives apart and is looked for only now, off the usual
    /// path; else a pointer pinguard never saw.
    #[cold]
    #[inline(never)]
    fn release_unknown<R: Copy + PartialEq>(
        self,
        api: Api,
        addr: usize,
        frees: &[Api],
        ok: R,
        real: impl FnOnce() -> R,
    ) -> R {
        if let Some(l) = quiet(|| ledger::take_over(addr, |a| frees.contains(&a))).flatten() {
            return self.release_over(api, addr, l, ok, real);
        }
        if ledger::overlap::any() {
            if let Some(left) = quiet(|| self.leave_shared(addr, frees)).flatten() {
                return self.release_shared(api, left, ok, real);
            }
        }
        self.call(real, |&rc, _| {
            ledger::count_unknown_release(self.t, api);
            if rc != ok {
                ledger::count_failed(self.t, api);
            }
        })
    }

    /// The release of a registration over already-pinned memory (`register_over`): like any
    /// release, but the record lives apart. A downgraded one never reached the runtime.
    #[cold]
    fn release_over<R: Copy + PartialEq>(
        self,
        api: Api,
        addr: usize,
        l: Live,
        ok: R,
        real: impl FnOnce() -> R,
    ) -> R {
        if l.downgraded() {
            quiet(|| {
                self.gone(&l);
                ledger::count_release(self.t);
            });
            return self.answer(ok);
        }
        self.call(real, |&rc, _| {
            if rc == ok {
                self.gone(&l);
                ledger::count_release(self.t);
            } else {
                ledger::insert_over(addr, l);
                ledger::count_failed(self.t, api);
            }
        })
    }

    /// `cudaFreeHost`, `cudaHostUnregister` and friends. `frees` says which entry points' records
    /// this call releases; the record says how its memory is backed.
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
        // A registration over already-pinned memory is found only when no record of the call's
        // kind has the address (`register_over`).
        let taken = quiet(|| ledger::take(addr as usize, |a| frees.contains(&a))).flatten();
        match taken {
            Some(l) if l.downgraded() => {
                quiet(|| {
                    if l.backing == Backing::Pageable {
                        pageable::free(addr as usize, l.size as usize);
                    }
                    self.gone(&l);
                    ledger::count_release(self.t);
                });
                self.answer(ok)
            }
            Some(l) => {
                // Should `real` unwind (a cancellation point inside the runtime), the record goes
                // back: the runtime still holds the memory.
                let back = PutBack(addr as usize, &l);
                let rc = self.call(real, |&rc, _| {
                    if rc == ok {
                        self.gone(&l);
                        ledger::count_release(self.t);
                    } else {
                        let _ = ledger::insert(addr as usize, l);
                        ledger::count_failed(self.t, api);
                    }
                });
                back.disarm();
                rc
            }
            None => self.release_unknown(api, addr as usize, frees, ok, real),
        }
    }
}
