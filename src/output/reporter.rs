//! Snapshots while the process runs: a background thread rewrites the report every
//! `PINGUARD_INTERVAL`, and on `PINGUARD_SIGNAL`, and the metrics file every metrics interval
//! (`metrics::interval_ms`). For the report the thread starts with pinguard; for the metrics
//! alone, at the entry of the process's first pinning call (`start_metrics`): a process that
//! makes none gets no thread. It writes no metrics file until the process has counted something
//! (`metrics::write`), and is woken to write one at once when it first does (`on_activity`).
//!
//! No descriptor lives longer than one report write: the process may close every descriptor
//! (`close_range`, as daemons and launchers do) and reuse the numbers, and a fork child's
//! descriptors are its own. The signal handler (`hooks::signal`'s trampoline) bumps a futex word
//! and wakes it, both async-signal-safe; the thread waits on that word, with a timeout for the
//! interval and for the periodic look at the signal's disposition.

use crate::accounting::ledger;
use crate::output::report;
use crate::runtime::config::Config;
use crate::runtime::guard::Reentry;
use crate::runtime::log;
use pinguard_common::Reason;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Bumped once per report signal, by the handler.
pub(crate) static WAKE: AtomicU32 = AtomicU32::new(0);
/// The value of `WAKE` the thread last acted on.
static SEEN: AtomicU32 = AtomicU32::new(0);
/// Set in a fork child, whose copy of the process has no reporter thread.
static RESTART: AtomicBool = AtomicBool::new(false);
/// Set once this process has its thread (cleared in a fork child): never two.
static STARTED: AtomicBool = AtomicBool::new(false);
/// The process counted something for the first time: the thread writes the metrics soon.
static ACTIVE_NOW: AtomicBool = AtomicBool::new(false);
/// How long after the first count the first metrics file is written.
const FIRST_WRITE_DELAY_MS: u64 = 20;
/// How often the thread looks for a disposition set behind every wrapper (the raw system call).
const RECHECK_MS: u64 = 1000;

fn wanted(cfg: &Config) -> bool {
    cfg.interval_ms.is_some() || cfg.signal.is_some()
}

/// Looks again at the report signal's disposition (`hooks::signal`, handed in by the composition
/// layer, which took the signal over before `start`).
static RECHECK: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// At start-up, once the signal's handler is in place: the thread.
pub fn start(cfg: &'static Config, recheck_signal: fn()) {
    if !wanted(cfg) {
        return;
    }
    let _ = RECHECK.set(recheck_signal);
    spawn(cfg);
}

/// From the signal handler: async-signal-safe (an atomic add and one system call, errno kept).
/// On x86-64 and aarch64 the report signal's trampoline does the same in assembly (`WAKE`).
// The assembly trampolines do this work where they exist.
#[cfg_attr(any(target_arch = "x86_64", target_arch = "aarch64"), allow(dead_code))]
pub fn wake_from_signal() {
    WAKE.fetch_add(1, Ordering::Release);
    // SAFETY: FUTEX_WAKE on a static word of this process; it touches no other memory.
    unsafe {
        let e = *libc::__errno_location();
        libc::syscall(
            libc::SYS_futex,
            WAKE.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
            0usize,
            0usize,
            0u32,
        );
        *libc::__errno_location() = e;
    }
}

/// Waits until `WAKE` is no longer `seen`, or `timeout` passes (forever without one). A wake
/// between the caller's load and this call is not lost: the kernel compares the word first.
fn wait(seen: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as _,
    });
    let tp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT on a static word; `tp` is null or points to a live timespec. A raw
    // system call: no cancellation point (this thread is pinguard's, but the rule holds).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            WAKE.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            seen,
            tp,
            0usize,
            0u32,
        );
    }
}

/// When the process first counts something (`ledger::on_first_count`, maybe under a lock of
/// the ledger's): a flag and a futex wake (no allocation, no lock), so that the metrics file
/// appears at once rather than an interval later.
pub fn on_activity(cfg: &Config) {
    if cfg.metrics.is_some() {
        ACTIVE_NOW.store(true, Ordering::Release);
        // SAFETY: FUTEX_WAKE on a static word; wakes the thread if it waits, else does nothing.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                WAKE.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
                0usize,
                0usize,
                0u32,
            )
        };
    }
}

/// Metrics are wanted and this process has no thread yet (after start-up, or in a fork child).
pub fn metrics_waiting(cfg: &Config) -> bool {
    cfg.metrics.is_some() && !STARTED.load(Ordering::Relaxed)
}

/// Starts the thread for the metrics; the caller holds none of pinguard's locks and is not inside
/// a signal handler (creating a thread allocates in the C library).
pub fn start_metrics(cfg: &'static Config) {
    spawn(cfg);
}

fn spawn(cfg: &'static Config) {
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    // The thread is born with every signal blocked (a new thread inherits its creator's mask):
    // a process-wide signal is never delivered to it, so a program that blocks SIGTERM and waits
    // for it with `sigwait` gets it, and the application's handlers run on its own threads.
    // SAFETY: plain values and valid out-pointers; the mask changes only for this thread and is
    // put back right after the thread is created.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    THREAD.store(SPAWNED, Ordering::Release);
    let r = std::thread::Builder::new()
        .name("pinguard-common".into())
        .spawn(move || {
            THREAD.store(RUNNING, Ordering::Release);
            run(cfg)
        });
    // SAFETY: as above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if r.is_err() {
        THREAD.store(NONE, Ordering::Release);
        log::write_stderr(
            "pinguard: cannot start the report thread; no periodic or signal reports, no metrics\n",
        );
    }
}

/// Where the report thread stands: none, spawned but not yet running its first line, running.
static THREAD: AtomicU8 = AtomicU8::new(NONE);
const NONE: u8 = 0;
const SPAWNED: u8 = 1;
const RUNNING: u8 = 2;

/// Waits, at most a second, for a report thread spawned and not yet running. The C library sets a
/// new thread up with `calloc` (its thread-local destructors) and ends the whole process when that
/// fails ("Fatal glibc error: failed to register TLS destructor"): waited for while memory is still
/// there, since a program lowering its address-space limit right after start could leave none
/// (mem_limits' squeeze, on a loaded machine). Never from inside `dlopen` (the library loaded by
/// the first stage): there the thread's first access to this library's thread-locals waits for
/// the loader's lock that `dlopen` holds, so the first hooked call waits instead. Sleeps in steps
/// of 50 us: no lock, no allocation.
pub fn wait_running() {
    if THREAD.load(Ordering::Acquire) != SPAWNED {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while THREAD.load(Ordering::Acquire) == SPAWNED && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(50));
    }
}

fn run(cfg: &'static Config) {
    // This thread never runs application code: everything it does passes through the hooks.
    let Some(_r) = Reentry::enter() else { return };
    let interval = cfg.interval_ms.map(Duration::from_millis);
    let mut due = interval.map(|i| Instant::now() + i);
    // Metrics at once (a thread started for them finds the process active), then every interval.
    let metrics_every = cfg
        .metrics
        .as_ref()
        .map(|_| Duration::from_millis(crate::output::metrics::interval_ms(cfg)));
    let mut metrics_due = metrics_every.map(|_| Instant::now());
    let recheck = cfg.signal.map(|_| Duration::from_millis(RECHECK_MS));
    loop {
        if let (Some(_), Some(f)) = (recheck, RECHECK.get()) {
            f();
        }
        if ACTIVE_NOW.swap(false, Ordering::AcqRel) {
            // Woken from inside the first counted call, before its figures are all in: the file
            // is written once that call is over (microseconds; a later write corrects a call that
            // was descheduled longer).
            metrics_due =
                metrics_every.map(|_| Instant::now() + Duration::from_millis(FIRST_WRITE_DELAY_MS));
        }
        let now_word = WAKE.load(Ordering::Acquire);
        let reason = if now_word != SEEN.load(Ordering::Relaxed) {
            // Signals that arrive while this report is written make one more report, not one each.
            SEEN.store(now_word, Ordering::Relaxed);
            Reason::Signal
        } else if due.is_some_and(|d| Instant::now() >= d) {
            due = interval.map(|i| Instant::now() + i);
            Reason::Interval
        } else if metrics_due.is_some_and(|d| Instant::now() >= d) {
            metrics_due = metrics_every.map(|i| Instant::now() + i);
            let _ = std::panic::catch_unwind(|| crate::output::metrics::write(cfg));
            continue;
        } else {
            let left = [due, metrics_due]
                .into_iter()
                .flatten()
                .map(|d| d.saturating_duration_since(Instant::now()))
                .min();
            let timeout = match (recheck, left) {
                (Some(r), Some(l)) => Some(r.min(l)),
                (r, l) => r.or(l),
            };
            wait(now_word, timeout);
            continue; // woken, timed out, or interrupted: look again
        };
        if reason == Reason::Signal || ledger::touched() {
            if let Err(e) = std::panic::catch_unwind(|| report::write(cfg, reason, None))
                .unwrap_or(Err("panicked".into()))
            {
                tracing::debug!("{reason:?} report not written: {e}");
            }
        }
        if reason == Reason::Signal {
            metrics_due = metrics_every.map(|i| Instant::now() + i);
            let _ = std::panic::catch_unwind(|| crate::output::metrics::write(cfg));
        }
    }
}

/// After `fork`, in the child: a signal the parent had not yet acted on is the parent's; the
/// thread is started by the next hook call (threads are not copied by `fork`). No descriptor is
/// closed or created here: the child's descriptors are all its own.
pub fn after_fork_child(cfg: Option<&Config>) {
    STARTED.store(false, Ordering::Relaxed);
    THREAD.store(NONE, Ordering::Relaxed);
    ACTIVE_NOW.store(false, Ordering::Relaxed);
    if !cfg.is_some_and(wanted) {
        return;
    }
    SEEN.store(WAKE.load(Ordering::Relaxed), Ordering::Relaxed);
    RESTART.store(true, Ordering::Relaxed);
}

/// Called by a fork child's first hooked call (`lifecycle::hooks_ready`).
#[inline]
pub fn restart_if_forked(cfg: &'static Config) {
    if RESTART.load(Ordering::Relaxed) && RESTART.swap(false, Ordering::AcqRel) {
        spawn(cfg);
    }
}
