//! Snapshots while the process runs: a background thread rewrites the report every
//! `PINGUARD_INTERVAL`, and on `PINGUARD_SIGNAL`.
//!
//! The signal handler only writes one byte to a pipe (async-signal-safe) and chains to the
//! handler that was there before; the thread, blocked in `poll` on that pipe, does the writing.
//! Applications usually install their own handlers in `main`, after pinguard's start-up: the
//! thread checks every second and puts pinguard's handler back in front, chaining to theirs.

use crate::config::Config;
use crate::guard::Reentry;
use crate::{ledger, log, report};
use pinguard_report::Reason;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static WAKE_READ: AtomicI32 = AtomicI32::new(-1);
static WAKE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// Set in a fork child, whose copy of the process has no reporter thread.
static RESTART: AtomicBool = AtomicBool::new(false);
/// The handler to chain to: two slots and an index, so the handler never reads a half-written one.
static mut PREVIOUS: [Option<libc::sigaction>; 2] = [None, None];
static PREVIOUS_SLOT: AtomicUsize = AtomicUsize::new(0);
static SIGNAL: AtomicI32 = AtomicI32::new(0);
const RECHECK_MS: u64 = 1000;

fn wanted(cfg: &Config) -> bool {
    cfg.interval_ms.is_some() || cfg.signal.is_some()
}

/// At start-up: the pipe, the signal handler, the thread.
pub fn start(cfg: &'static Config) {
    if !wanted(cfg) {
        return;
    }
    if let Some(sig) = cfg.signal {
        if !make_pipe() {
            log::write_stderr("pinguard: cannot create a pipe; no report on a signal\n");
        } else {
            SIGNAL.store(sig, Ordering::Relaxed);
            ensure_installed();
        }
    }
    spawn(cfg);
}

fn make_pipe() -> bool {
    let mut fds = [-1 as c_int; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return false;
    }
    WAKE_READ.store(fds[0], Ordering::Relaxed);
    WAKE_WRITE.store(fds[1], Ordering::Relaxed);
    true
}

/// Puts pinguard's handler in front if it is not there, remembering the one it replaces.
fn ensure_installed() {
    let sig = SIGNAL.load(Ordering::Relaxed);
    if sig == 0 {
        return;
    }
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut cur) != 0 || cur.sa_sigaction == on_signal as *const () as usize {
            return;
        }
        let next = 1 - PREVIOUS_SLOT.load(Ordering::Relaxed);
        (*std::ptr::addr_of_mut!(PREVIOUS))[next] = Some(cur);
        PREVIOUS_SLOT.store(next, Ordering::Release);
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_signal as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(sig, &act, std::ptr::null_mut());
    }
}

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    unsafe {
        let saved = *libc::__errno_location();
        let fd = WAKE_WRITE.load(Ordering::Relaxed);
        if fd >= 0 {
            let b = 1u8;
            libc::write(fd, &b as *const u8 as *const c_void, 1);
        }
        *libc::__errno_location() = saved;
        // The application's own handler still runs; SIG_DFL and SIG_IGN are left out (a report
        // signal that killed the process would defeat its purpose).
        let slot = PREVIOUS_SLOT.load(Ordering::Acquire);
        if let Some(prev) = (*std::ptr::addr_of!(PREVIOUS))[slot] {
            let h = prev.sa_sigaction;
            if h != libc::SIG_DFL && h != libc::SIG_IGN {
                if prev.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = std::mem::transmute(h);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(c_int) = std::mem::transmute(h);
                    f(sig);
                }
            }
        }
    }
}

fn spawn(cfg: &'static Config) {
    let r = std::thread::Builder::new().name("pinguard-report".into()).spawn(move || run(cfg));
    if r.is_err() {
        log::write_stderr("pinguard: cannot start the report thread; no periodic or signal reports\n");
    }
}

fn run(cfg: &'static Config) {
    // This thread never runs application code: everything it does passes through the hooks.
    let Some(_r) = Reentry::enter() else { return };
    let interval = cfg.interval_ms.map(Duration::from_millis);
    let mut due = interval.map(|i| Instant::now() + i);
    loop {
        ensure_installed();
        let fd = WAKE_READ.load(Ordering::Relaxed);
        let mut wait = if fd >= 0 { Some(Duration::from_millis(RECHECK_MS)) } else { None };
        if let Some(d) = due {
            let left = d.saturating_duration_since(Instant::now());
            wait = Some(wait.map_or(left, |w| w.min(left)));
        }
        let timeout = wait.map_or(-1, |w| w.as_millis().min(i32::MAX as u128) as c_int);
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let n = unsafe { libc::poll(&mut p, (fd >= 0) as libc::nfds_t, timeout) };
        let reason = if n > 0 && p.revents & libc::POLLIN != 0 {
            let mut buf = [0u8; 64];
            while unsafe { libc::read(fd, buf.as_mut_ptr() as *mut c_void, buf.len()) } > 0 {}
            Reason::Signal
        } else if n >= 0 && due.is_some_and(|d| Instant::now() >= d) {
            due = interval.map(|i| Instant::now() + i);
            Reason::Interval
        } else {
            continue; // a re-check of the handler, or EINTR
        };
        if reason == Reason::Signal || ledger::touched() {
            if let Err(e) = std::panic::catch_unwind(|| report::write(reason, None)).unwrap_or(Err("panicked".into())) {
                tracing::debug!("{reason:?} report not written: {e}");
            }
            let _ = std::panic::catch_unwind(|| crate::metrics::write(cfg));
        }
    }
}

/// After `fork`, in the child: a pipe of its own (the parent's would also wake the parent), and a
/// thread started by the next hook call (threads are not copied by `fork`).
pub fn after_fork_child(cfg: Option<&Config>) {
    if !cfg.is_some_and(wanted) {
        return;
    }
    let (r, w) = (WAKE_READ.load(Ordering::Relaxed), WAKE_WRITE.load(Ordering::Relaxed));
    if r >= 0 {
        unsafe {
            libc::close(r);
            libc::close(w);
        }
        if !make_pipe() {
            WAKE_READ.store(-1, Ordering::Relaxed);
            WAKE_WRITE.store(-1, Ordering::Relaxed);
        }
    }
    RESTART.store(true, Ordering::Relaxed);
}

/// Called on every tracked hook: one relaxed load unless this is a fork child's first call.
#[inline]
pub fn restart_if_forked(cfg: &'static Config) {
    if RESTART.load(Ordering::Relaxed) && RESTART.swap(false, Ordering::AcqRel) {
        spawn(cfg);
    }
}
