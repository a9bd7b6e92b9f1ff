//! The ledger's process-shared robust mutex, taken within a bound (`LOCK_WAIT_MS`): a holder
//! that does not run (stopped, starved) costs a call a bounded wait, then only tries, and one
//! that died is recovered from (`EOWNERDEAD`).

use super::file::{Shared, MAP};
use crate::runtime::clock::{monotonic_ms, monotonic_ns};
use crate::runtime::sys;
use pinguard_common::group::Header;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The longest one call (a reservation, a release, the exit, a report's figures) waits for the
/// ledger's lock, in all, in milliseconds. Nobody holds the lock for more than a few hundred
/// nanoseconds of arithmetic, so a wait this long means a holder that does not run: stopped
/// (`SIGSTOP`, a debugger, `docker pause`) or starved. The call then goes without the group
/// (`unreachable`).
pub const LOCK_WAIT_MS: u64 = 50;

/// After a wait ran out, for this long this process only tries the lock (a short spin, no
/// sleep) while the same thread holds it: a group whose holder is stopped costs each call
/// microseconds, not `LOCK_WAIT_MS`. A lock that is free again is taken at the first try, and a
/// lock held by another thread is waited for again.
pub const UNREACHABLE_MS: u64 = 1000;

/// Tries of the lock spinning before a wait sleeps. While the holder a wait ran out on still
/// holds the lock, a call spins only.
const SPINS: u32 = 64;

/// The longest one sleep on the mutex's futex word, in microseconds: a taker that found the word
/// free takes it without the waiters' bit, so a sleeper it did not wake tries again this soon.
const SLEEP_MAX_US: u64 = 2000;

/// The mutex word's bits besides the owner (the kernel's robust-futex ABI).
const FUTEX_WAITERS: u32 = 0x8000_0000;
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// `monotonic_ms` until which this process only tries the lock while `STUCK_OWNER` holds it (0:
/// it waits, up to the bound).
static UNREACHABLE_UNTIL: AtomicU64 = AtomicU64::new(0);

/// The thread that held the lock when a wait ran out (its id, as the mutex word holds it).
static STUCK_OWNER: AtomicU32 = AtomicU32::new(0);

/// Waits for the lock that ran out (for the report).
pub(super) static TIMEOUTS: AtomicU64 = AtomicU64::new(0);

/// One call's wait for the lock: every taking of it in the call shares one deadline.
pub(super) struct Wait {
    /// `monotonic_ns` after which the call goes without the group (0: not waited yet).
    deadline_ns: u64,
    /// Only one try (start-up: a process that pins nothing never waits).
    pub(super) once: bool,
}

impl Wait {
    pub(super) fn new() -> Wait {
        Wait {
            deadline_ns: 0,
            once: false,
        }
    }

    pub(super) fn once() -> Wait {
        Wait {
            deadline_ns: 0,
            once: true,
        }
    }
}

/// Why the lock was not taken.
pub(super) enum NoLock {
    /// Held past the bound: this call goes without the group.
    Busy,
    /// Unrecoverable or corrupt: this process left the group (its own budget only).
    Gone,
    /// The ledger was removed (`Header::closed`): the group's name is to be opened again.
    Closed,
}

/// The mutex's futex word: owner, waiters' bit, owner-died bit (see `owner`).
fn word(mutex: *mut libc::pthread_mutex_t) -> &'static AtomicU32 {
    // SAFETY: the mutex's first 4 bytes are an aligned int, changed by other threads and
    // processes with atomic instructions only; it lives as long as the ledger mapping (for ever).
    unsafe { AtomicU32::from_ptr(mutex as *mut u32) }
}

/// Sleeps until the holder lets go of the mutex (its unlock wakes a sleeper when the waiters' bit
/// is set, as glibc's own lock sets it), or for `us` microseconds at most: a raw `futex` wait on
/// the shared word (a relative timeout, on `CLOCK_MONOTONIC`), no cancellation point.
fn sleep_on(mutex: *mut libc::pthread_mutex_t, us: u64) {
    let w = word(mutex);
    let v = w.load(Ordering::Relaxed);
    if v & FUTEX_TID_MASK == 0 {
        return; // free (or its owner died): try at once
    }
    if v & FUTEX_WAITERS == 0
        && w.compare_exchange(v, v | FUTEX_WAITERS, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return; // changed hands meanwhile: try at once
    }
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: (us.clamp(1, 999_999) * 1000) as libc::c_long,
    };
    // SAFETY: a shared (not private: other processes map it) futex wait on a valid word, while it
    // still holds the value it was seen with; `ts` is a valid relative timeout. EAGAIN, EINTR and
    // ETIMEDOUT all mean: try again.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAIT,
            v | FUTEX_WAITERS,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        )
    };
}

/// Takes the ledger's mutex within `w`'s bound: `pthread_mutex_trylock` (never a cancellation
/// point, never a wait of its own), spinning, then sleeping on the mutex's futex word until the
/// holder lets go or the deadline passes. No `pthread_mutex_timedlock`: its deadline is
/// `CLOCK_REALTIME`, which a clock set back stretches without bound (`pthread_mutex_clocklock`
/// needs glibc 2.30; pinguard runs on 2.17). The mutex's own answer: 0, `EOWNERDEAD` (a holder
/// that died), another error; or `ETIMEDOUT` for a holder that kept it past the bound.
pub(super) fn take(mutex: *mut libc::pthread_mutex_t, w: &mut Wait) -> c_int {
    let patient = !w.once
        && (monotonic_ms() >= UNREACHABLE_UNTIL.load(Ordering::Relaxed)
            || owner(mutex) != STUCK_OWNER.load(Ordering::Relaxed));
    let mut tries = 0u32;
    loop {
        // SAFETY: the mutex was initialised process-shared and robust before the ledger was
        // published; a pthread mutex is made to be shared this way, through a raw pointer.
        let rc = unsafe { libc::pthread_mutex_trylock(mutex) };
        if rc != libc::EBUSY {
            if (rc == 0 || rc == libc::EOWNERDEAD) && UNREACHABLE_UNTIL.load(Ordering::Relaxed) != 0
            {
                UNREACHABLE_UNTIL.store(0, Ordering::Relaxed);
            }
            return rc;
        }
        if w.once {
            return libc::ETIMEDOUT;
        }
        if w.deadline_ns == 0 {
            w.deadline_ns = monotonic_ns() + LOCK_WAIT_MS * 1_000_000;
        }
        tries += 1;
        if tries <= SPINS {
            std::hint::spin_loop();
            continue;
        }
        if !patient {
            return libc::ETIMEDOUT; // the same holder as when a wait ran out: no sleep
        }
        let now = monotonic_ns();
        if now >= w.deadline_ns {
            TIMEOUTS.fetch_add(1, Ordering::Relaxed);
            STUCK_OWNER.store(owner(mutex), Ordering::Relaxed);
            UNREACHABLE_UNTIL.store(
                (now / 1_000_000).saturating_add(UNREACHABLE_MS).max(1),
                Ordering::Relaxed,
            );
            w.deadline_ns = 1; // the rest of the call does not wait either
            return libc::ETIMEDOUT;
        }
        sleep_on(mutex, ((w.deadline_ns - now) / 1000 + 1).min(SLEEP_MAX_US));
    }
}

/// The thread holding the mutex now (0: none). A robust mutex's first word is the futex word
/// the kernel's robust-futex ABI defines (the owner's thread id in its low 30 bits, which the
/// kernel reads when the owner dies), in glibc's layout on every architecture.
fn owner(mutex: *mut libc::pthread_mutex_t) -> u32 {
    word(mutex).load(Ordering::Relaxed) & FUTEX_TID_MASK
}

/// The ledger, locked; recovered when its last holder died holding it. Held only for the
/// arithmetic: every file a decision needs (`/proc` entries, `/proc/meminfo`) is read before the
/// lock is taken, or with it let go and taken again. Cancellation stays off while it is held: a
/// thread cancelled with the lock held would leave it to `EOWNERDEAD` repair, and an unwinding
/// through pinguard's frames would abort the process.
pub(super) struct Locked {
    pub(super) ledger: Shared,
    pub(super) _nc: sys::NoCancel,
}

impl Locked {
    /// The ledger, locked within `w`'s bound, closed or not, as it is.
    pub(super) fn any(ledger: Shared, w: &mut Wait) -> Result<Locked, NoLock> {
        let nc = sys::NoCancel::new();
        // SAFETY: the place of the mutex in the published ledger mapping; no reference is made.
        let rc = take(
            unsafe { std::ptr::addr_of_mut!((*ledger.0.as_ptr()).mutex) },
            w,
        );
        let l = match rc {
            0 => Locked { ledger, _nc: nc },
            libc::EOWNERDEAD => {
                let mut l = Locked { ledger, _nc: nc };
                // Whatever the dead holder was doing, the members' shares are the truth; its own
                // share goes at the next look for dead members, due at once.
                l.h_mut().used = l.sum_of_shares();
                l.h_mut().rescan_after_ms = 0;
                // SAFETY: this thread holds the mutex (EOWNERDEAD hands it over).
                unsafe { libc::pthread_mutex_consistent(&mut l.h_mut().mutex) };
                l
            }
            libc::ETIMEDOUT => return Err(NoLock::Busy),
            _ => {
                MAP.store(std::ptr::null_mut(), Ordering::Release);
                tracing::warn!("group: the ledger's lock cannot be taken (error {rc}); this process now uses its own budget only");
                drop(nc);
                return Err(NoLock::Gone);
            }
        };
        Ok(l)
    }

    /// The ledger, for as long as the lock is held and this borrow lasts.
    pub(super) fn h(&self) -> &Header {
        // SAFETY: this guard holds the group lock, under which every member changes the ledger's
        // plain fields; the ones members bump outside it (`denied`, `downgraded`) are only
        // copied out here, into a report.
        unsafe { self.ledger.0.as_ref() }
    }

    pub(super) fn h_mut(&mut self) -> &mut Header {
        // SAFETY: as `h`; the `&mut self` borrow keeps this the only reference this process
        // makes while it lasts.
        unsafe { self.ledger.0.as_mut() }
    }

    pub(super) fn sum_of_shares(&self) -> u64 {
        // Saturating only here, for a ledger corrupted past any real sum: nothing else saturates.
        self.h()
            .members
            .iter()
            .filter(|m| m.pid != 0)
            .fold(0u64, |a, m| a.saturating_add(m.bytes))
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: this thread holds the mutex (taken in `new`). `_nc` is dropped after this, so
        // cancellation comes back only once the lock is released.
        unsafe { libc::pthread_mutex_unlock(&mut self.h_mut().mutex) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A robust, process-shared mutex as the ledger's, on the heap (never moved while in use).
    struct Mutex(*mut libc::pthread_mutex_t);
    // SAFETY: a pthread mutex is made to be used from several threads through a pointer.
    unsafe impl Send for Mutex {}

    fn robust() -> Mutex {
        let m = Box::into_raw(Box::new(libc::PTHREAD_MUTEX_INITIALIZER));
        // SAFETY: `attr` and `m` are valid for the calls; the attributes are those `build` sets.
        unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            libc::pthread_mutexattr_init(&mut attr);
            libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
            libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
            libc::pthread_mutex_init(m, &attr);
        }
        Mutex(m)
    }

    #[test]
    fn a_lock_held_by_a_thread_that_does_not_run_is_waited_for_within_the_bound_then_only_tried() {
        let m = robust();
        let (held_tx, held) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        let p = Mutex(m.0);
        let holder = std::thread::spawn(move || {
            let p = p;
            // SAFETY: the mutex lives until the test ends, after this thread is joined.
            unsafe { libc::pthread_mutex_lock(p.0) };
            // SAFETY: no arguments.
            held_tx.send(unsafe { libc::gettid() } as u32).unwrap();
            go.recv().unwrap();
            // SAFETY: this thread holds the mutex.
            unsafe { libc::pthread_mutex_unlock(p.0) };
        });
        let tid = held.recv().unwrap();
        assert_eq!(owner(m.0), tid, "the futex word names the holder");
        let t = std::time::Instant::now();
        assert_eq!(take(m.0, &mut Wait::new()), libc::ETIMEDOUT);
        let waited = t.elapsed();
        assert!(
            waited >= std::time::Duration::from_millis(LOCK_WAIT_MS)
                && waited < std::time::Duration::from_millis(LOCK_WAIT_MS * 10),
            "{waited:?}"
        );
        // The same holder still: the next calls only try.
        let t = std::time::Instant::now();
        for _ in 0..10 {
            assert_eq!(take(m.0, &mut Wait::new()), libc::ETIMEDOUT);
        }
        assert!(
            t.elapsed() < std::time::Duration::from_millis(LOCK_WAIT_MS),
            "{:?} for 10 tries",
            t.elapsed()
        );
        assert_eq!(take(m.0, &mut Wait::once()), libc::ETIMEDOUT);
        // Let go: taken at the first try, and waited for again from then on.
        go_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(take(m.0, &mut Wait::new()), 0);
        assert_eq!(UNREACHABLE_UNTIL.load(Ordering::Relaxed), 0);
        // SAFETY: no arguments.
        let me = unsafe { libc::gettid() } as u32;
        assert_eq!(owner(m.0), me);
        // SAFETY: this thread holds the mutex; nothing uses it after.
        unsafe {
            libc::pthread_mutex_unlock(m.0);
            drop(Box::from_raw(m.0));
        }
    }
}
