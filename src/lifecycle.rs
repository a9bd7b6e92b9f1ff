//! Start, fork and exit: when pinguard sets itself up, what a fork child inherits, and the report
//! at exit.

use crate::accounting::{callsite, ledger};
use crate::budget;
use crate::output::report;
use crate::runtime::config::Config;
use crate::runtime::guard::{self, Reentry, Thread};
use crate::runtime::{kernel, log};
use pinguard_common::vars;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};
use std::sync::OnceLock;

/// The signal hooks (`hooks::signal`), or, in the builds without hooks (unit tests, fuzzing),
/// what stands for them.
#[cfg(not(any(test, feature = "fuzzing")))]
pub(crate) use crate::hooks::signal as signals;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod signals {
    pub fn take_over(_sig: i32) {}
    pub fn recheck() {}
    pub fn prepare() {}
    pub fn after_fork_child() {}
    pub fn in_handler() -> bool {
        false
    }
    pub fn may_set_up() -> bool {
        true
    }
}

/// Where the process is in pinguard's start: every hooked call reads it, set-up moves it once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Nothing set up: the state of a process that never pinned.
    Uninit = 0,
    /// One thread is setting up; the others yield until it is done.
    Running = 1,
    /// Set up, with `CONFIG` in force.
    Ready = 2,
    /// Disabled, or a copy that stands down: every hook passes its call through.
    Off = 3,
}

/// A `Phase` in one atomic byte.
struct AtomicPhase(AtomicU8);

impl AtomicPhase {
    const fn new(p: Phase) -> Self {
        Self(AtomicU8::new(p as u8))
    }
    fn load(&self, o: Ordering) -> Phase {
        Phase::from(self.0.load(o))
    }
    fn store(&self, p: Phase, o: Ordering) {
        self.0.store(p as u8, o)
    }
    fn compare_exchange(
        &self,
        from: Phase,
        to: Phase,
        ok: Ordering,
        fail: Ordering,
    ) -> Result<Phase, Phase> {
        self.0
            .compare_exchange(from as u8, to as u8, ok, fail)
            .map(Phase::from)
            .map_err(Phase::from)
    }
}

impl From<u8> for Phase {
    /// Only `AtomicPhase` stores, and only a `Phase`'s byte.
    fn from(b: u8) -> Self {
        match b {
            0 => Phase::Uninit,
            1 => Phase::Running,
            2 => Phase::Ready,
            _ => Phase::Off,
        }
    }
}

static STATE: AtomicPhase = AtomicPhase::new(Phase::Uninit);
static CONFIG: OnceLock<Config> = OnceLock::new();
/// `CONFIG`'s value once `STATE` is `Phase::Ready` (null before, and when pinguard is off), in one load.
static READY_CONFIG: std::sync::atomic::AtomicPtr<Config> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
/// The same for hooked calls (`hooks_ready`), null again in a fork child until its first hooked
/// call has restarted the report thread. In a page that every fork child finds zeroed (`WIPED`).
static HOOKS_CONFIG: &std::sync::atomic::AtomicPtr<Config> = &WIPED.hooks_config;
static EXIT_DONE: AtomicBool = AtomicBool::new(false);
/// The process whose memory holds pinguard's state: the one that started it, or a fork child
/// (set in its fork handler). A `vfork` child shares that memory but is another process.
pub(crate) static OWNER: AtomicI32 = AtomicI32::new(0);

/// Whether this process owns pinguard's state (true before start-up, when there is none yet).
/// One system call.
pub fn owns_state() -> bool {
    let owner = OWNER.load(Ordering::Relaxed);
    owner == 0 || owner == kernel::raw_pid()
}

/// The constructor. It runs after the constructors of libraries loaded before pinguard, which may
/// already pin: the hooks therefore also initialise lazily.
#[cfg(not(any(test, feature = "fuzzing")))]
#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;

// Unit tests build no constructor.
#[cfg_attr(test, allow(dead_code))]
extern "C" fn constructor() {
    // A copy that stands down (`copies`) does nothing at all: no handler, no thread state. The
    // copy in charge scrubs the environment (its constructor too runs before the program's code).
    if !crate::runtime::copies::in_charge() {
        return;
    }
    // A musl process: pinguard, built against glibc, stands down there (`stand_down`).
    if crate::runtime::dl::foreign_libc() {
        stand_down();
        return;
    }
    // First: before anything of the program's can read the environment or start a child.
    crate::runtime::node::scrub_environment();
    // Loaded by the first stage (`front`) at a first pinning call: it kept fd 2's stream and a
    // place among the exit handlers from the program's start for this copy.
    let front = crate::runtime::front::attach(at_exit);
    // Which stream fd 2 is, before the program can close it and open a file of its own there:
    // one `fstat` (pinguard's lines go only there, `log::write_stderr`).
    log::mark_stderr();
    let Some(r) = Reentry::enter() else { return };
    crate::runtime::clock::mark_start();
    // The real functions the exit, signal and jump hooks call, found now rather than from inside
    // a signal handler or a vfork child; those hooks run even when pinguard is disabled.
    signals::prepare();
    #[cfg(not(any(test, feature = "fuzzing")))]
    {
        crate::hooks::exit::prepare();
        crate::hooks::dlclose::prepare();
    }
    // Registered now, so that the exit report runs after every exit handler the program registers
    // (a handler that frees pinned memory at exit comes first), as with start-up at load. No
    // allocation, no system call: glibc keeps the first handlers in a static block.
    if !front {
        // SAFETY: `at_exit` is an `extern "C" fn()` in a preloaded library that is never
        // unloaded; the constructor runs once.
        unsafe { libc::atexit(at_exit) };
    }
    // Set up at the first hooked call, not here: most processes of a node never pin, and each
    // would pay the set-up's mappings and reads (issue 44 item 8). Settings that act before any
    // pin (a report signal's handler, the interval thread, joining a group) start at once.
    if starts_at_once() {
        ensure_init(r.thread());
        // Not inside the first stage's `dlopen`, where the thread cannot run before it returns.
        if !front {
            crate::output::reporter::wait_running();
        }
    }
}

/// Whether a setting asks for work before the first pinning call: read without allocating.
fn starts_at_once() -> bool {
    [vars::SIGNAL.name, vars::INTERVAL.name, vars::GROUP.name]
        .iter()
        .any(|name| early(name).is_some_and(|v| !v.is_empty()))
        && !crate::runtime::config::early_disabled(early(vars::DISABLE.name))
}

/// The configuration once pinguard is set up; `None` when it is disabled. The caller holds a
/// `Reentry`, so whatever initialisation calls (std's `mmap`, `dlsym`) passes through the hooks;
/// errno is the caller's again on return.
#[inline(always)]
pub fn ensure_init(t: &Thread) -> Option<&'static Config> {
    let p = READY_CONFIG.load(Ordering::Acquire);
    if !p.is_null() {
        if missed_fork_handlers() || ASIDE.load(Ordering::Relaxed) {
            return unprepared_child(t);
        }
        // SAFETY: `READY_CONFIG` is null or points at `CONFIG`'s value, set once and never moved.
        return Some(unsafe { &*p });
    }
    // Off (disabled, or a copy that stands down): the call passes through without pinguard's
    // stack being made for this thread.
    if STATE.load(Ordering::Acquire) == Phase::Off {
        return None;
    }
    let e = t.errno();
    // Never from inside a signal handler (it may have interrupted malloc): a later call sets up.
    if STATE.load(Ordering::Acquire) == Phase::Uninit && !signals::may_set_up() {
        t.set_errno(e);
        return None;
    }
    // Set-up parses the configuration and reads files: on pinguard's stack, not the caller's.
    let cfg = crate::runtime::workstack::run(t, init_once);
    t.set_errno(e);
    if cfg.is_some() && (missed_fork_handlers() || ASIDE.load(Ordering::Relaxed)) {
        // A signal handler forked while set-up ran, before the fork handlers were registered.
        return unprepared_child(t);
    }
    cfg
}

/// Runs `f` for an application call that is not an allocation (`dlclose`): only when pinguard is
/// set up (before the first pinning call there is nothing to update, and such a call must not
/// set pinguard up: most processes never pin) and this thread is not already inside pinguard,
/// with `errno` as the caller left it and a panic kept inside.
pub fn quietly_when_ready<T>(f: impl FnOnce() -> T) -> Option<T> {
    let reentry = Reentry::enter()?;
    let t = reentry.thread();
    let err = t.errno();
    // `ensure_init` once set up: a child the fork handlers did not prepare gets its own state first.
    let out = ready()
        .and_then(|_| ensure_init(t))
        .and_then(|_| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok());
    t.set_errno(err);
    out
}

/// The configuration if pinguard is set up already; never sets it up.
#[inline(always)]
pub fn ready() -> Option<&'static Config> {
    let p = READY_CONFIG.load(Ordering::Acquire);
    // SAFETY: `READY_CONFIG` is null or points at `CONFIG`'s value, set once and never moved.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// `ensure_init` for a hooked call: in a fork child, the first one also restarts the report
/// thread (`reporter::restart_if_forked`), and every later one finds the configuration in one load.
/// `pinning`: the call may pin (a release is never turned away: it needs no memory of pinguard's).
/// `wire`: the caller's (`track`'s) start-up, run on this slow path once pinguard is set up, so
/// that its first hooked call has done it (the steady path never looks).
#[inline(always)]
pub fn hooks_ready(t: &Thread, pinning: bool, wire: fn()) -> Option<&'static Config> {
    let p = WIPED.hooks_config.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: `HOOKS_CONFIG` is null or points at `CONFIG`'s value, set once and never moved.
        return Some(unsafe { &*p });
    }
    hooks_ready_slow(t, pinning, wire)
}

/// pinguard's heap had a request refused (`heap::on_short`): hooked calls take the slow path,
/// where pinning calls pass through untracked until the heap finds room again. Only a store: it
/// may run under the heap's lock.
fn heap_short() {
    HOOKS_CONFIG.store(std::ptr::null_mut(), Ordering::Release);
}

#[cold]
#[inline(never)]
fn hooks_ready_slow(t: &Thread, pinning: bool, wire: fn()) -> Option<&'static Config> {
    let cfg = ensure_init(t)?;
    wire();
    if !crate::runtime::heap::recover() {
        if pinning {
            // Recording it could need memory pinguard has not got: the call is the kernel's or
            // the runtime's alone, counted, and the report says why (`out_of_memory_count`).
            ledger::count_untracked();
            return None;
        }
        return Some(cfg);
    }
    crate::runtime::workstack::run(t, || crate::output::reporter::restart_if_forked(cfg));
    // Metrics wanted and no thread yet: the first pinning call that can start one does, at its
    // entry, outside every lock of pinguard's; until then every hooked call comes this way, so
    // that the steady path never looks (one load per call cost the CUDA pair 5 instructions).
    let waiting =
        crate::output::reporter::metrics_waiting(cfg) && !(pinning && start_metrics(t, cfg));
    // A report thread this call started, or the constructor did inside the first stage's
    // `dlopen`: it runs before the call goes on (`reporter::wait_running`).
    crate::output::reporter::wait_running();
    if waiting {
        return Some(cfg);
    }
    HOOKS_CONFIG.store(cfg as *const Config as *mut Config, Ordering::Release);
    Some(cfg)
}

#[cold]
fn init_once() -> Option<&'static Config> {
    loop {
        match STATE.load(Ordering::Acquire) {
            Phase::Ready => return CONFIG.get(),
            Phase::Off => return None,
            Phase::Uninit => {
                if STATE
                    .compare_exchange(
                        Phase::Uninit,
                        Phase::Running,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
                {
                    // Set-up reads files and may wait: a cancellation requested meanwhile waits
                    // for the application's own next cancellation point.
                    let _nc = crate::runtime::sys::NoCancel::new();
                    let on = std::panic::catch_unwind(init).unwrap_or(false);
                    if let (true, Some(cfg)) = (on, CONFIG.get()) {
                        READY_CONFIG.store(cfg as *const Config as *mut Config, Ordering::Release);
                    }
                    STATE.store(
                        if on { Phase::Ready } else { Phase::Off },
                        Ordering::Release,
                    );
                }
            }
            // Another thread is setting up; it never waits on this one.
            Phase::Running => std::thread::yield_now(),
        }
    }
}

fn init() -> bool {
    // Another copy of pinguard is in charge of this process: this one stays off, before it has
    // made anything (no handlers, threads or files) and with its hooks passing calls through.
    if !crate::runtime::copies::in_charge() {
        return false;
    }
    if crate::runtime::dl::foreign_libc() || !unwinder_loaded() {
        return stand_down();
    }
    // Before anything a child could inherit: set-up runs inside the first pinning call, and a
    // signal handler may fork before it has registered the fork handlers.
    arm_wipe();
    OWNER.store(kernel::raw_pid(), Ordering::Relaxed);
    if crate::runtime::clock::start_ms() == 0 {
        crate::runtime::clock::mark_start();
    }
    let mut cfg = configure();
    if let (Some(name), false) = (cfg.group.clone(), cfg.disabled) {
        crate::budget::group::init(&name, cfg.group_budget, &mut cfg.errors);
    }
    // Found by the constructor too; here for a hook that runs before it (another library's
    // constructor that pins).
    signals::prepare();
    #[cfg(not(any(test, feature = "fuzzing")))]
    crate::hooks::exit::prepare();
    if cfg.disabled {
        return false;
    }
    log::mark_stderr(); // where a hook ran before the constructor
    log::init(&cfg.log);
    // The reserve before the budget: without a budget, it still needs the bytes counted.
    budget::host::init(cfg.host_reserve, &mut cfg.errors);
    budget::cgroup::init(cfg.cgroup_reserve, &mut cfg.errors);
    if cfg.cgroup_reserve.is_none() {
        // The memory hierarchy, found once here (it allocates): a refused or failed call's line
        // then reads the cgroup's headroom without allocating (`runtime::room`).
        crate::runtime::cgroup::init();
    }
    budget::set_limit(cfg.budget);
    if cfg.fails_closed() {
        budget::fail_closed();
    }
    crate::accounting::level::ceiling(budget::reserved);
    crate::accounting::callsite::set_max(cfg.max_callsites);
    crate::output::files::init_template(cfg.report.as_deref());
    debug_settings(&cfg);
    crate::runtime::objects::own_range();
    let _ = CONFIG.set(cfg);
    let Some(cfg) = CONFIG.get() else {
        return false;
    };
    crate::runtime::heap::on_short(heap_short);
    ledger::on_first_count(first_count);
    crate::output::metrics::forget_previous_image(cfg);
    crate::accounting::arena::prepare(crate::accounting::arena::Place {
        path: Box::new(crate::output::files::state_path),
        taken: crate::output::files::state_taken,
        info: Box::new(|| report::state_info(cfg)),
        levels: ledger::use_levels,
    });
    crate::accounting::arena::forget_previous_image();
    if let Some(sig) = cfg.signal {
        signals::take_over(sig);
    }
    crate::output::reporter::start(cfg, signals::recheck);
    // The exit handler is the constructor's (registered early, for its order); the fork
    // handlers are registered once, here (`init` runs once: the STATE compare-and-swap).
    register_atfork();
    true
}

/// `PINGUARD_LOG=debug`: the settings in force, once, at start-up (nothing per call).
fn debug_settings(cfg: &Config) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let size = |b: Option<u64>| b.map_or("none".to_string(), |b| format!("{b} bytes"));
    let families: Vec<&str> = pinguard_common::vars::FAMILIES
        .iter()
        .enumerate()
        .filter(|(i, _)| cfg.hooks & (1 << i) != 0)
        .map(|(_, n)| *n)
        .collect();
    tracing::debug!(
        "settings: budget {}, policy {}, depth {}, hooks {}, report {}, host reserve {}, cgroup reserve {}{}",
        size(cfg.budget),
        cfg.policy.name(),
        cfg.depth,
        families.join(","),
        crate::output::files::template().0,
        size(cfg.host_reserve),
        size(cfg.cgroup_reserve),
        if cfg.strict { ", strict" } else { "" },
    );
    if let Some(g) = crate::budget::group::how_opened() {
        tracing::debug!("{g}");
    }
}

/// The settings in force: the environment's over the node configuration file's; in secure mode
/// (set-user-ID, file capabilities) the file's alone, the environment's having been removed.
fn configure() -> Config {
    crate::runtime::node::scrub_environment();
    let secure = kernel::secure_mode();
    let vars = crate::runtime::node::pinguard_vars();
    let file = crate::runtime::node::settings();
    let mut cfg = Config::from_layers(&vars, file.as_ref(), &kernel::Host);
    let n = crate::runtime::node::scrubbed();
    if secure && n > 0 {
        cfg.errors.push(format!(
            "secure-mode (setuid) process: {n} PINGUARD_* variable(s) of the environment ignored and removed; settings come from the node configuration file only"
        ));
        cfg.notes += 1;
    }
    cfg
}

/// A process whose C library is not glibc (musl's): pinguard, built against glibc, does nothing
/// there, no file, no thread, no handler; its exports pass each call to the C library's own
/// function, found now (the exit and signal functions are called where no look-up may run).
#[cold]
fn stand_down() -> bool {
    signals::prepare();
    #[cfg(not(any(test, feature = "fuzzing")))]
    crate::hooks::exit::prepare();
    false
}

/// glibc's unwinder, which the library finds at run time rather than naming it (a musl loader
/// would fail the program over `libgcc_s.so.1`): without it a panic could not be caught, so
/// pinguard stands down (an image with glibc and no `libgcc_s`).
fn unwinder_loaded() -> bool {
    #[cfg(not(any(test, feature = "fuzzing")))]
    return crate::runtime::unwinder::load();
    #[cfg(any(test, feature = "fuzzing"))]
    true
}

/// The fork handlers, through glibc's `__register_atfork` found at run time: `pthread_atfork` is
/// a static stub (libc_nonshared.a) that would import it, a symbol musl's loader cannot resolve,
/// and it would fail every musl program the library is preloaded into. The
/// handlers are this object's (its `__dso_handle`, as `pthread_atfork` passes).
fn register_atfork() {
    extern "C" {
        /// This object's handle, defined (hidden) by the C runtime's `crtbeginS.o`.
        static __dso_handle: u8;
    }
    type RegisterAtfork = unsafe extern "C" fn(
        Option<unsafe extern "C" fn()>,
        Option<unsafe extern "C" fn()>,
        Option<unsafe extern "C" fn()>,
        *mut std::ffi::c_void,
    ) -> i32;
    let f = crate::runtime::dl::real_dlsym(libc::RTLD_DEFAULT, c"__register_atfork");
    if f.is_null() {
        log::write_stderr("pinguard: no __register_atfork in this C library; fork children share the parent's records\n");
        return;
    }
    // SAFETY: glibc's `__register_atfork` has this signature; the handlers are `extern "C"` fns of
    // the types it expects, in a preloaded library that is never unloaded.
    unsafe {
        std::mem::transmute::<*mut std::ffi::c_void, RegisterAtfork>(f)(
            Some(fork_prepare),
            Some(fork_parent),
            Some(fork_child),
            &raw const __dso_handle as *mut std::ffi::c_void,
        )
    };
}

/// Whether this process printed its configuration's problems (`announce`). Not reset in a fork
/// child: the child runs with its parent's settings, the parent already told the user about them
/// on the same terminal, and a pool of forked workers that pin would otherwise repeat every line
/// once per worker, which is the noise this is here to avoid. The child's report still lists
/// them under `config.errors`. A child forked before its parent pinned prints them when it pins.
static ANNOUNCED: AtomicBool = AtomicBool::new(false);

/// Prints the configuration's problems (bad values, unknown variables, a group that cannot be
/// joined) on stderr, once per process, when the process first counts something, that is when
/// it is going to write a report: not at start-up, which every process that loads pinguard goes
/// through (a shell script's every `sed` and `ls`, none of which pins).
fn announce() {
    let Some(cfg) = CONFIG.get() else { return };
    if cfg.errors.is_empty() || ANNOUNCED.swap(true, Ordering::Relaxed) {
        return;
    }
    // One write (a raw system call: no cancellation point), so the lines stay together.
    let mut text = String::new();
    for e in &cfg.errors {
        text.push_str("pinguard: ");
        text.push_str(e);
        text.push('\n');
    }
    log::write_stderr(&text);
}

/// When the process first counts something (and again in a fork child): its settings' problems,
/// and the metrics written at once (`reporter::on_activity`).
fn first_count() {
    announce();
    if let Some(cfg) = CONFIG.get() {
        crate::output::reporter::on_activity(cfg);
    }
}

/// Starts the metrics thread from a pinning call's entry, unless this is a `vfork` child or the
/// call runs inside a signal handler (creating a thread allocates in the C library, which the
/// handler may have interrupted): then a later call does. errno is the caller's again.
#[cold]
#[inline(never)]
fn start_metrics(t: &Thread, cfg: &'static Config) -> bool {
    // Asked on the caller's stack: the walk looks for a signal frame above this one.
    if !owns_state() || signals::in_handler() {
        return false;
    }
    let e = t.errno();
    let _ = std::panic::catch_unwind(|| {
        crate::runtime::workstack::run(t, || crate::output::reporter::start_metrics(cfg))
    });
    t.set_errno(e);
    true
}

/// Whether `family` is intercepted, answerable before pinguard has started (the first `dlsym` of
/// a process can come from another library's constructor): then the two switches are read from
/// the environment directly, without allocating.
pub fn hooks_enabled(family: crate::api::Family) -> bool {
    match STATE.load(Ordering::Acquire) {
        Phase::Ready => CONFIG.get().is_some_and(|c| c.hooks & family.bit() != 0),
        Phase::Off => false,
        _ if !crate::runtime::copies::in_charge() => false,
        _ => crate::runtime::config::early_hooks_enabled(
            early(vars::DISABLE.name),
            early(vars::HOOKS.name),
            family,
        ),
    }
}

/// `PINGUARD_DEVICE_MEMORY`, answerable before pinguard has started (a device allocation may come
/// first): then read from the environment (or the node file) directly, without allocating, as
/// the configuration will read it. Read once, then kept.
#[inline(always)]
pub fn device_memory() -> crate::runtime::config::DeviceMemory {
    match crate::runtime::devices::mode() {
        Some(m) => m,
        None => device_memory_first(),
    }
}

#[cold]
#[inline(never)]
fn device_memory_first() -> crate::runtime::config::DeviceMemory {
    use crate::runtime::config::DeviceMemory;
    // Switched off, the raw value is kept too: the device is then never asked (`hooks_enabled`)
    // and no call is counted (`Hook::enter`).
    let m = match ready() {
        Some(cfg) => cfg.device_memory,
        None => DeviceMemory::from_raw(early(vars::DEVICE_MEMORY.name)),
    };
    crate::runtime::devices::keep_mode(m);
    m
}

/// Whether the signal hooks wrap the application's handlers: not once pinguard is disabled
/// (`PINGUARD_DISABLE`), which before start-up is read from the environment without allocating.
pub fn wraps_signals() -> bool {
    match STATE.load(Ordering::Acquire) {
        Phase::Ready => true,
        Phase::Off => false,
        _ => {
            crate::runtime::copies::in_charge()
                && !crate::runtime::config::early_disabled(early(vars::DISABLE.name))
        }
    }
}

/// A setting before start-up, without allocating: as `Config` will read it, the environment's
/// over the node file's (the file's alone in secure mode).
fn early(name: &str) -> Option<&'static [u8]> {
    crate::runtime::node::early(name)
}

extern "C" fn at_exit() {
    let Some(_r) = Reentry::enter() else { return };
    let e = guard::errno();
    let _ = std::panic::catch_unwind(forget_previous_image_at_exit);
    exit_report();
    guard::set_errno(e);
}

/// At the exit of a process that never set pinguard up (it never pinned): the image `exec`
/// replaced (same pid, same start) may have left its state at this process's path, which would
/// read as a death once this process is gone. Set-up removes it at the first pinning call; here a
/// process that never pins does, reading its settings only now (allocating at exit is fine).
fn forget_previous_image_at_exit() {
    if STATE.load(Ordering::Acquire) != Phase::Uninit
        || !owns_state()
        || !crate::runtime::copies::in_charge()
        || crate::runtime::dl::foreign_libc()
    {
        return;
    }
    let cfg = configure();
    if cfg.disabled {
        return;
    }
    crate::output::files::init_template(cfg.report.as_deref());
    if let Some(path) = crate::output::files::state_path(0, false) {
        crate::accounting::arena::forget_previous_image_at(path);
    }
}

/// A process not asked for a report (no `PINGUARD_REPORT` in the environment or the node file, no
/// snapshots) that pinned only through the `mlock` family, never more than `PINGUARD_QUIET_BELOW`
/// at once, with nothing refused or let over a budget and every setting usable: `gpg`'s secure memory under a node-wide
/// preload. It leaves no report and prints no line (issue 44 item 9); a GPU process still reports.
fn quiet_at_exit(cfg: &Config) -> bool {
    use crate::api::Api;
    // A setting that could not be used is always told (its report lists it).
    if cfg.report.is_some()
        || cfg.interval_ms.is_some()
        || cfg.signal.is_some()
        || !cfg.errors.is_empty()
    {
        return false;
    }
    let t = ledger::totals();
    let locking = |api: Api| {
        matches!(
            api,
            Api::Mlock
                | Api::Mlock2
                | Api::Mlockall
                | Api::Mmap
                | Api::Munlock
                | Api::Munlockall
                | Api::Munmap
        )
    };
    t.peak_live_bytes <= cfg.quiet_below
        && t.denied_count + t.downgraded_count + t.over_budget_count == 0
        && ledger::apis().iter().all(|(api, _)| locking(*api))
}

/// Exactly one exit report per process, whichever way it ends; none in a process that does not
/// own pinguard's state (a `vfork` child, or a child of a raw `clone`), whose flags, report and
/// group share would be its parent's.
fn exit_report() {
    if STATE.load(Ordering::Acquire) != Phase::Ready
        || !owns_state()
        || EXIT_DONE.swap(true, Ordering::AcqRel)
    {
        return;
    }
    // Writing reads and writes files: never a cancellation point inside pinguard.
    let _nc = crate::runtime::sys::NoCancel::new();
    let quiet = CONFIG.get().is_some_and(quiet_at_exit);
    if let (true, false, Some(cfg)) = (ledger::touched(), quiet, CONFIG.get()) {
        // Printed already, unless all that was counted passed through untracked.
        let _ = std::panic::catch_unwind(announce);
        let _ = std::panic::catch_unwind(|| report::write_exit(cfg));
    } else {
        report::exiting();
        // Nothing was counted: the state file (made when a hook or the C API first needed it)
        // holds nothing to read, and a process that pins nothing leaves nothing behind.
        crate::accounting::arena::remove_file();
    }
    let _ = std::panic::catch_unwind(|| {
        // No metrics write can start now (the exit report is decided): the file goes, the
        // report keeping the final figures.
        crate::output::metrics::remove_own();
        crate::budget::group::leave();
    });
}

/// From the `_exit`/`_Exit` hooks. A signal handler that calls `_exit` may have interrupted code
/// holding malloc's or the loader's locks, and writing a report takes both: from inside a
/// handler, pinguard leaves the report to the last snapshot rather than risk hanging the exit.
/// Whether this is inside a handler is `hooks::signal::in_handler`'s reading of the thread (the
/// alternate stack, a signal frame on the way up), not a guess from the blocked signals (a
/// program may block a handled signal and exit normally); a handler that interrupted pinguard's
/// own work on this thread is caught before (`Reentry`).
pub fn exit_report_from_exit_call() {
    let Some(_r) = Reentry::enter() else { return };
    if STATE.load(Ordering::Acquire) != Phase::Ready
        || !owns_state()
        || EXIT_DONE.load(Ordering::Acquire)
        || !ledger::touched()
    {
        return;
    }
    // The line below and the report are I/O: no cancellation acted on inside pinguard (the
    // state change is a compare-and-swap in glibc, safe in a handler too).
    let _nc = crate::runtime::sys::NoCancel::new();
    if signals::in_handler() {
        EXIT_DONE.store(true, Ordering::Release);
        log::write_stderr("pinguard: _exit called from a signal handler; exit report not written (the last snapshot stands)\n");
        return;
    }
    exit_report();
}

/// Fork: every lock pinguard has, and the gate in front of the loader's lock, are taken before
/// the fork, so the child inherits none held by a thread it does not have. The order matters: a
/// report being written holds the report lock, then passes the gate, then takes the others.
/// Whether the forking thread was already inside pinguard (it never is, unless a runtime forks
/// from inside a hooked call); restored after the fork. Written under the report lock.
static FORK_WAS_INSIDE: AtomicBool = AtomicBool::new(false);

/// A module with state a fork child must not inherit half-changed: `hold` takes its locks before
/// the fork; `let_go` lets go of them after it, in the parent (`false`) or, having first forgotten
/// the parent's state, in the child (`true`). `let_go` may only run after `hold` on the same
/// thread, in a fork handler.
struct ForkState {
    hold: fn(),
    let_go: unsafe fn(bool),
    /// The child's `let_go` unmaps state that the others' forget pointers into: it comes after
    /// every other module's.
    unmaps: bool,
}

const fn fork_state(hold: fn(), let_go: unsafe fn(bool)) -> ForkState {
    ForkState {
        hold,
        let_go,
        unmaps: false,
    }
}

/// The fork protocol, after the report lock (`fork_prepare`): taken in this order, let go of in
/// reverse. The order is the locks' order everywhere else: a module's lock comes after every lock
/// its holders may hold while taking it (the heap's last, since every other holder may allocate).
/// A new module with fork state is one line here.
static FORK_STATES: &[ForkState] = &[
    // Before the gate: the unwinder builds its tables through the gate, holding its lock.
    fork_state(crate::capture::unwind::hold, crate::capture::unwind::let_go),
    fork_state(crate::capture::python::hold, crate::capture::python::let_go),
    fork_state(close_gate, crate::runtime::gate::reopen),
    fork_state(callsite::hold, callsite::let_go),
    fork_state(ledger::hold, ledger::let_go),
    fork_state(
        crate::accounting::physical::hold,
        crate::accounting::physical::let_go,
    ),
    fork_state(
        crate::accounting::pools::hold,
        crate::accounting::pools::let_go,
    ),
    ForkState {
        unmaps: true,
        ..fork_state(
            crate::accounting::arena::hold,
            crate::accounting::arena::let_go,
        )
    },
    fork_state(crate::runtime::heap::hold, crate::runtime::heap::let_go),
];

/// Spins for each lock a fork from inside pinguard tries before it gives up (`lock::try_holding`):
/// a lock another thread holds for a moment is still had; one held by the code below this
/// thread's signal frame costs this much and no more.
const PREPARE_SPINS: u32 = 100;

/// How this thread's last `fork_prepare` went: what its parent's and child's handlers do.
#[derive(Clone, Copy, PartialEq)]
enum Forked {
    /// Every lock held (waited for, or tried and had): the protocol as written.
    Held,
    /// This thread was inside pinguard and a lock could not be had without waiting: nothing is
    /// held, and the child gets state of its own at its first hooked call (`rebirth`).
    Missed,
    /// This process stands aside (`stand_aside`), and so will the child.
    Aside,
}

thread_local! {
    static FORKED: std::cell::Cell<Forked> = const { std::cell::Cell::new(Forked::Held) };
}

/// Whether the gate was closed by a fork that tries (`close_gate`): opened again if it gives up.
static GATE_TRIED: AtomicBool = AtomicBool::new(false);

/// The gate's row of the protocol: waits for the threads inside, unless the fork must not wait.
fn close_gate() {
    if !crate::runtime::lock::trying() {
        return crate::runtime::gate::close();
    }
    if crate::runtime::gate::try_close() {
        GATE_TRIED.store(true, Ordering::Relaxed);
    } else {
        crate::runtime::lock::mark_missed();
    }
}

/// Takes the report lock and every module's locks, in the protocol's order: waiting for each
/// (`None`), or trying each at most `spins` more times and, if one is missed, letting go of the
/// others again (`false`). `child`: a fork child's, where a module may abandon a lock still held
/// (`lock::hold_or_abandon`).
fn hold_all(spins: Option<u32>, child: bool) -> bool {
    let Some(spins) = spins else {
        report::hold();
        FORK_STATES.iter().for_each(|m| (m.hold)());
        return true;
    };
    crate::runtime::lock::try_holding(spins, child);
    report::hold();
    for m in FORK_STATES {
        if crate::runtime::lock::missed() {
            break;
        }
        (m.hold)();
    }
    let held = crate::runtime::lock::stop_trying();
    let gate = GATE_TRIED.swap(false, Ordering::Relaxed);
    if !held {
        report::hold_abandoned();
        if gate {
            crate::runtime::gate::reopen_in_parent();
        }
    }
    held
}

extern "C" fn fork_prepare() {
    // Inside pinguard from here to the parent's or child's handler: the locks below are held, and
    // a signal handler's hooked call on this thread must pass through rather than wait for them.
    let was = guard::mark_inside();
    if !was && missed_fork_handlers() {
        // A child nothing prepared, forking before its first hooked call: its own state first.
        rebirth();
    }
    let how = if ASIDE.load(Ordering::Relaxed) {
        Forked::Aside
    } else if !was {
        hold_all(None, false);
        Forked::Held
    } else if hold_all(Some(PREPARE_SPINS), false) {
        // A fork from a signal handler that interrupted pinguard on this thread (or a runtime
        // forking inside a hooked call): the interrupted code may hold any of the locks, and
        // waiting for it would wait for ever.
        Forked::Held
    } else {
        Forked::Missed
    };
    FORKED.with(|f| f.set(how));
    if how == Forked::Held {
        // Under the report lock.
        FORK_WAS_INSIDE.store(was, Ordering::Relaxed);
    }
}
/// Every module's `let_go`, in reverse of `fork_prepare`'s order; in the child, those that unmap
/// state last. Then the report lock.
fn let_go_after_fork(child: bool) {
    let rev = FORK_STATES.iter().rev();
    for m in rev
        .clone()
        .filter(|m| !(child && m.unmaps))
        .chain(rev.filter(|m| child && m.unmaps))
    {
        // SAFETY: pthread runs the parent's and the child's handler only after `fork_prepare`,
        // on the forking thread, which took every module's locks in `hold` (`let_go`'s contract).
        unsafe { (m.let_go)(child) };
    }
    // SAFETY: as above: `fork_prepare` took the report lock on this thread.
    unsafe { report::let_go(child) };
}

extern "C" fn fork_parent() {
    if FORKED.with(|f| f.get()) != Forked::Held {
        return guard::unmark_inside(true);
    }
    let_go_after_fork(false);
    guard::unmark_inside(FORK_WAS_INSIDE.load(Ordering::Relaxed));
}

extern "C" fn fork_child() {
    match FORKED.with(|f| f.get()) {
        Forked::Held => {}
        Forked::Aside => return guard::unmark_inside(true),
        Forked::Missed => {
            // The parent's state as the interrupted code left it, locks and all: off the parent's
            // file at once (that code may run again when the handler returns), and replaced by
            // fresh state at the first hooked call, once that code is done.
            // SAFETY: the child's handler, before the interrupted code runs again.
            unsafe { crate::accounting::arena::leave_parent_unlocked() };
            PENDING.store(true, Ordering::Relaxed);
            HOOKS_CONFIG.store(std::ptr::null_mut(), Ordering::Release);
            return guard::unmark_inside(true);
        }
    }
    let_go_after_fork(true);
    start_over_in_child();
    guard::unmark_inside(FORK_WAS_INSIDE.load(Ordering::Relaxed));
}

/// The rest of a fork child's state, once every module has let go of its parent's.
fn start_over_in_child() {
    OWNER.store(kernel::raw_pid(), Ordering::Relaxed);
    signals::after_fork_child();
    budget::reset();
    guard::forget_tid();
    crate::runtime::devices::forget();
    crate::output::reporter::after_fork_child(CONFIG.get());
    HOOKS_CONFIG.store(std::ptr::null_mut(), Ordering::Release);
    crate::budget::group::after_fork_child();
    crate::runtime::clock::mark_start();
    if ARMED.load(Ordering::Relaxed) {
        WIPED.mark.store(1, Ordering::Relaxed);
    }
}

// ---- Children the fork handlers did not prepare ---------------------------------------------
//
// `_Fork` (glibc 2.34) and a raw `clone` without `CLONE_VM` run no atfork handler, and a fork
// from a signal handler that interrupted pinguard may not have held its locks (`Forked::Missed`):
// such a child must notice at its first hooked call, without a cost on every call, that its
// state is its parent's. `HOOKS_CONFIG` and a mark live in a page of their own that the kernel
// hands every fork child zeroed (`MADV_WIPEONFORK`, Linux 4.14; not a `vfork` child, which is the
// same memory): the child's first hooked call takes the slow path and finds the mark zero.

/// `HOOKS_CONFIG` and `mark`, alone in one page of the library's zero-filled data.
#[repr(C, align(4096))]
struct WipedOnFork {
    hooks_config: std::sync::atomic::AtomicPtr<Config>,
    /// 1 in a process whose state is its own: set when the page is armed, and again by the fork
    /// child's handler and by `rebirth`; zero in a fork child nothing prepared.
    mark: std::sync::atomic::AtomicUsize,
}

static WIPED: WipedOnFork = WipedOnFork {
    hooks_config: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
    mark: std::sync::atomic::AtomicUsize::new(0),
};
/// Whether `WIPED`'s page is wiped in fork children (the advice was taken), and whether it was
/// asked. A kernel without the advice leaves `_Fork` and `clone` children unnoticed.
static ARMED: AtomicBool = AtomicBool::new(false);
static ARM_ASKED: AtomicBool = AtomicBool::new(false);
/// Set by the child's handler of a fork that held nothing (`Forked::Missed`).
static PENDING: AtomicBool = AtomicBool::new(false);
/// This process could not get state of its own (a lock of its parent's was held by a thread it
/// does not have): every hooked call passes straight through, and it writes nothing.
static ASIDE: AtomicBool = AtomicBool::new(false);

/// Asks for `WIPED`'s page to be wiped in fork children; once, at set-up.
fn arm_wipe() {
    if ARM_ASKED.swap(true, Ordering::Relaxed) {
        return;
    }
    let e = guard::errno();
    // SAFETY: the page is `WIPED`'s alone (its size and alignment), and the advice changes only
    // what a fork child finds in it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_madvise,
            &WIPED as *const WipedOnFork as usize,
            std::mem::size_of::<WipedOnFork>(),
            libc::MADV_WIPEONFORK,
        )
    };
    guard::set_errno(e);
    if rc == 0 {
        WIPED.mark.store(1, Ordering::Relaxed);
        ARMED.store(true, Ordering::Release);
    }
}

fn missed_fork_handlers() -> bool {
    PENDING.load(Ordering::Relaxed)
        || (ARMED.load(Ordering::Acquire) && WIPED.mark.load(Ordering::Relaxed) == 0)
}

/// `ensure_init` in a child the fork handlers did not prepare (its first hooked call, C API call
/// or `dlclose`: the caller's `Reentry` says no code of pinguard's runs below it on this thread):
/// state of its own first, or `None` once it stands aside.
#[cold]
#[inline(never)]
fn unprepared_child(t: &Thread) -> Option<&'static Config> {
    if missed_fork_handlers() {
        let e = t.errno();
        rebirth();
        t.set_errno(e);
    }
    if ASIDE.load(Ordering::Relaxed) {
        return None;
    }
    CONFIG.get()
}

/// A child the fork handlers did not prepare, at its first hooked call (no code of pinguard's
/// runs below it on this thread): every lock of its parent's that is free is its own to take,
/// and then it starts over as a prepared child would. A lock still held was held by a thread the
/// child does not have, over data it may have left half-changed: then the child stands aside.
#[cold]
#[inline(never)]
fn rebirth() {
    PENDING.store(false, Ordering::Relaxed);
    // No spinning: nobody in this process will ever let go of a lock that is held now.
    if hold_all(Some(0), true) {
        let_go_after_fork(true);
        start_over_in_child();
    } else {
        stand_aside();
    }
    if ARMED.load(Ordering::Relaxed) {
        WIPED.mark.store(1, Ordering::Relaxed);
    }
}

/// This process passes every call straight through, writes no report or state, and leaves its
/// parent's state file alone; so do its own children.
fn stand_aside() {
    ASIDE.store(true, Ordering::Relaxed);
    // SAFETY: no code of pinguard's runs on this thread below this call (`rebirth`), and the
    // process has no other thread of pinguard's.
    unsafe { crate::accounting::arena::leave_parent_unlocked() };
}
