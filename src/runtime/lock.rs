//! pinguard's mutex: a futex word and nothing else, so that a fork child can simply reset it.
//!
//! parking_lot keeps waiting threads in a process-wide table whose own locks a fork can leave
//! held, and hands a contended lock to a waiter that does not exist in the child; std's mutex
//! cannot be reset. This one is Drepper's three-state futex mutex ("Futexes Are Tricky").

use std::sync::atomic::{AtomicU32, Ordering};

pub struct FutexRaw(AtomicU32);

const UNLOCKED: u32 = 0;
const LOCKED: u32 = 1;
const CONTENDED: u32 = 2;

fn futex(word: &AtomicU32, op: libc::c_int, val: u32) {
    // SAFETY: `word` is a live, aligned &AtomicU32 for the whole call; FUTEX_WAIT/WAKE with a null
    // timeout only compare/wait on that word and touch no other memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op | libc::FUTEX_PRIVATE_FLAG,
            val,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

// SAFETY: `lock` and `try_lock` return holding the lock only after this thread moved the word
// away from unlocked itself (compare-and-swap or swap, Acquire), so there is one holder at a
// time; `unlock` sets it back with Release and wakes a waiter.
unsafe impl lock_api::RawMutex for FutexRaw {
    // A constant initialiser copied into each lock, never shared: the lint's worry cannot arise.
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: FutexRaw = FutexRaw(AtomicU32::new(UNLOCKED));
    type GuardMarker = lock_api::GuardNoSend;

    fn lock(&self) {
        if self
            .0
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        while self.0.swap(CONTENDED, Ordering::Acquire) != UNLOCKED {
            futex(&self.0, libc::FUTEX_WAIT, CONTENDED);
        }
    }

    fn try_lock(&self) -> bool {
        self.0
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    unsafe fn unlock(&self) {
        if self.0.swap(UNLOCKED, Ordering::Release) == CONTENDED {
            futex(&self.0, libc::FUTEX_WAKE, 1);
        }
    }
}

impl FutexRaw {
    /// In a fork child, after the parent's prepare handler took the lock: the child has no other
    /// thread, so nobody to wake and nothing to hand over.
    pub fn reset(&self) {
        self.0.store(UNLOCKED, Ordering::Release);
    }
}

pub type Mutex<T> = lock_api::Mutex<FutexRaw, T>;
pub type MutexGuard<'a, T> = lock_api::MutexGuard<'a, FutexRaw, T>;

/// Fork support for a static mutex: held from `prepare` to the parent's or the child's handler,
/// which lets go of it (`let_go`: the fork handlers' word; a "release" is pinned memory's).
pub fn hold<T>(m: &'static Mutex<T>) {
    std::mem::forget(m.lock());
}

/// # Safety
/// Only after `hold` on this mutex, in the fork handlers.
pub unsafe fn let_go_in_parent<T>(m: &Mutex<T>) {
    // SAFETY: the caller's `hold` locked `m` and forgot the guard, so this thread owns the lock.
    unsafe { m.force_unlock() };
}

/// # Safety
/// Only after `hold` on this mutex, in the fork child's handler.
pub unsafe fn let_go_in_child<T>(m: &Mutex<T>) {
    // SAFETY: the caller's `hold` locked `m`, and the child has no other thread that could hold it.
    unsafe { m.raw() }.reset();
}

/// # Safety
/// Only after `hold` on this mutex, in the fork handlers: the parent's or (`child`) the child's.
pub unsafe fn let_go<T>(m: &Mutex<T>, child: bool) {
    if child {
        // SAFETY: after `hold`, in the child's handler (this function's contract).
        unsafe { let_go_in_child(m) }
    } else {
        // SAFETY: after `hold`, in a fork handler (this function's contract).
        unsafe { let_go_in_parent(m) }
    }
}
