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
/// Between `try_holding` and `stop_trying` on this thread, it never waits (`try_hold`).
pub fn hold<T>(m: &'static Mutex<T>) {
    if TRYING.with(|t| t.get()) {
        // SAFETY: `raw` is only used to try the lock; a lock taken is recorded and let go of by
        // the fork protocol, as `hold`'s guard would be.
        try_hold(unsafe { m.raw() });
        return;
    }
    std::mem::forget(m.lock());
}

// ---- Holding without waiting ---------------------------------------------------------------
//
// A fork from a signal handler that interrupted pinguard on the forking thread (or the first
// hooked call of a child made without the fork handlers) must not wait for a lock: its holder may
// be the interrupted code below it on the same stack, or a thread the child does not have. There
// the fork protocol tries each lock a bounded number of times; once one is missed it takes no
// more, and `stop_trying` lets go of those it took.

/// Locks one thread may take without waiting in one protocol: more than pinguard has.
const MAX_TAKEN: usize = 256;

thread_local! {
    static TRYING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
/// One thread at a time tries (the record below is shared); another one misses at once.
static TRY_BUSY: AtomicU32 = AtomicU32::new(0);
static SPINS: AtomicU32 = AtomicU32::new(0);
static ABANDONING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static MISSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static TAKEN: [std::sync::atomic::AtomicPtr<FutexRaw>; MAX_TAKEN] =
    [const { std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()) }; MAX_TAKEN];
static N_TAKEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// From here to `stop_trying`, `hold` on this thread tries each lock at most `spins + 1` times.
/// `abandoning`: this is a fork child, where a module may forget unread the data of a lock still
/// held (`hold_or_abandon`). Async-signal-safe: atomics and a destructor-less thread-local.
pub fn try_holding(spins: u32, abandoning: bool) {
    ABANDONING.store(abandoning, Ordering::Relaxed);
    let busy = TRY_BUSY
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err();
    TRYING.with(|t| t.set(true));
    if busy {
        // Another thread is trying: miss at once, and leave its record alone.
        MISSED_HERE.with(|m| m.set(true));
        return;
    }
    SPINS.store(spins, Ordering::Relaxed);
    MISSED.store(false, Ordering::Relaxed);
    N_TAKEN.store(0, Ordering::Relaxed);
}

thread_local! {
    /// This thread found another one trying (`try_holding`): it missed without a record.
    static MISSED_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is between `try_holding` and `stop_trying`.
pub fn trying() -> bool {
    TRYING.with(|t| t.get())
}

/// Whether a lock (or the gate) was missed since `try_holding`: nothing more is tried.
pub fn missed() -> bool {
    MISSED_HERE.with(|m| m.get()) || MISSED.load(Ordering::Relaxed)
}

/// Something other than a lock (the gate) could not be had without waiting.
pub fn mark_missed() {
    if !MISSED_HERE.with(|m| m.get()) {
        MISSED.store(true, Ordering::Relaxed);
    }
}

/// `f` until it says yes, at most `spins + 1` times (`try_holding`'s bound).
pub fn spin_until(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..=SPINS.load(Ordering::Relaxed) {
        if f() {
            return true;
        }
        std::hint::spin_loop();
    }
    false
}

/// `hold`, for a lock whose module can forget its data unread in a fork child: there, in a
/// protocol that does not wait (`try_holding(_, true)`), a lock still held (by a thread the child
/// does not have) is left to the module (`false`) rather than missed.
pub fn hold_or_abandon<T>(m: &'static Mutex<T>) -> bool {
    if trying() && !missed() && ABANDONING.load(Ordering::Relaxed) {
        // SAFETY: `raw` is only tried here; a lock taken is recorded as `hold` records it.
        return try_take(unsafe { m.raw() });
    }
    hold(m);
    true
}

fn try_hold(m: &'static FutexRaw) {
    if !missed() && !try_take(m) {
        mark_missed();
    }
}

/// Takes `m` within the bound and records it, for `stop_trying` to let go of if need be.
fn try_take(m: &'static FutexRaw) -> bool {
    use lock_api::RawMutex;
    let n = N_TAKEN.load(Ordering::Relaxed);
    if n == MAX_TAKEN || !spin_until(|| m.try_lock()) {
        return false;
    }
    TAKEN[n].store(m as *const FutexRaw as *mut FutexRaw, Ordering::Relaxed);
    N_TAKEN.store(n + 1, Ordering::Relaxed);
    true
}

/// Ends `try_holding`: true when every lock `hold` was given was taken (they are held, as after
/// waiting for them); false when one was missed, and then every lock taken is let go of again.
pub fn stop_trying() -> bool {
    TRYING.with(|t| t.set(false));
    if MISSED_HERE.with(|m| m.replace(false)) {
        return false;
    }
    let ok = !MISSED.load(Ordering::Relaxed);
    if !ok {
        for t in &TAKEN[..N_TAKEN.load(Ordering::Relaxed)] {
            // SAFETY: `try_hold` took this static lock on this thread and nothing let go of it.
            unsafe { lock_api::RawMutex::unlock(&*t.load(Ordering::Relaxed)) };
        }
    }
    N_TAKEN.store(0, Ordering::Relaxed);
    TRY_BUSY.store(0, Ordering::Release);
    ok
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
