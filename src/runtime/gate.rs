//! The fork gate: pinguard's stack walks, its scans of the loaded objects and its report writing
//! take the loader's `dl_iterate_phdr` lock, which glibc does not reset in a fork child. Those
//! sections hold the gate open; `fork` closes it (the `pthread_atfork` prepare handler) and waits
//! until no thread is inside, so the child never inherits that lock held.
//!
//! Readers count themselves in one of several padded counters (picked by thread), so threads in
//! hooks do not bounce one cache line between cores. Re-entrant on a thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const SLOTS: usize = 16;

#[repr(align(64))]
struct Slot(AtomicUsize);

static READERS: [Slot; SLOTS] = [const { Slot(AtomicUsize::new(0)) }; SLOTS];
static CLOSED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

pub struct Open(usize);

pub fn enter() -> Open {
    if DEPTH.with(|d| d.replace(d.get() + 1)) > 0 {
        return Open(usize::MAX); // already inside on this thread: a fork cannot be waiting on us yet
    }
    let slot = crate::runtime::guard::tid() as usize % SLOTS;
    loop {
        READERS[slot].0.fetch_add(1, Ordering::SeqCst);
        if !CLOSED.load(Ordering::SeqCst) {
            return Open(slot);
        }
        READERS[slot].0.fetch_sub(1, Ordering::SeqCst);
        while CLOSED.load(Ordering::Relaxed) {
            std::thread::yield_now();
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
        if self.0 != usize::MAX {
            READERS[self.0].0.fetch_sub(1, Ordering::Release);
        }
    }
}

/// `fork` prepare: no thread may enter, and every thread inside has left.
pub fn close() {
    CLOSED.store(true, Ordering::SeqCst);
    for s in &READERS {
        while s.0.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

/// `close` for a fork that must not wait for its own thread (`lock::try_holding`): this thread
/// may be inside (a signal handler that interrupted a gate section), but never inside the loader's
/// lock (`iterate_phdr`), so it waits only for the others, and for them a bounded time (they may
/// wait for a lock the interrupted code holds): false, and the gate open again, if they stay.
pub fn try_close() -> bool {
    CLOSED.store(true, Ordering::SeqCst);
    let mine = own_slot();
    let mut tries = 0u32;
    let drained = READERS.iter().enumerate().all(|(i, s)| {
        let me = usize::from(mine == Some(i));
        while s.0.load(Ordering::SeqCst) != me {
            tries += 1;
            if tries > TRY_CLOSE_YIELDS {
                return false;
            }
            std::thread::yield_now();
        }
        true
    });
    if !drained {
        CLOSED.store(false, Ordering::SeqCst);
    }
    drained
}

/// How long `try_close` gives the other threads to leave: a stack walk's scan of the loaded
/// objects takes a few hundred microseconds at most.
const TRY_CLOSE_YIELDS: u32 = 2000;

/// The slot this thread counts itself in while it is inside, if it is.
fn own_slot() -> Option<usize> {
    (DEPTH.with(|d| d.get()) > 0).then(|| crate::runtime::guard::tid() as usize % SLOTS)
}

/// `dl_iterate_phdr` with the asynchronous signals blocked on this thread: a signal handler that
/// forks never interrupts pinguard while it holds the loader's lock, which glibc does not reset
/// in a fork child (the child's every later walk of the objects would wait for it for ever).
/// Faults (`SIGSEGV`, `SIGBUS`, ...) stay unblocked, as the kernel delivers them regardless.
///
/// # Safety
/// `dl_iterate_phdr`'s: `cb` casts `data` back to what the caller passed.
pub unsafe fn iterate_phdr(
    cb: unsafe extern "C" fn(*mut libc::dl_phdr_info, usize, *mut libc::c_void) -> libc::c_int,
    data: *mut libc::c_void,
) -> libc::c_int {
    // The kernel's 64-bit mask, built here: libc's `sigfillset` may be a sanitizer's interceptor,
    // which starts its runtime (and calls `dlsym`) from inside this walk.
    let keep = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
        libc::SIGSYS,
    ]
    .iter()
    .fold(0u64, |m, &sig| m | 1u64 << (sig - 1));
    let set: u64 = !keep;
    let mut old: u64 = 0;
    // errno through libc, not pinguard's thread state: a thread-local's first touch goes through
    // `__tls_get_addr`, which a sanitizer intercepts to start its runtime (and call `dlsym`).
    // SAFETY: `__errno_location` returns this thread's errno, valid for the thread's life.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: as above.
    let e = unsafe { *errno };
    // SAFETY: raw system calls (no interposer's wrapper) on this thread's mask, with local sets of
    // the kernel's size; the mask is put back as it was.
    let blocked = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            &set as *const u64,
            &mut old as *mut u64,
            8,
        ) == 0
    };
    // SAFETY: the caller's contract is `dl_iterate_phdr`'s.
    let r = unsafe { libc::dl_iterate_phdr(Some(cb), data) };
    if blocked {
        // SAFETY: as above.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &old as *const u64,
                std::ptr::null_mut::<u64>(),
                8,
            )
        };
    }
    // SAFETY: as above.
    unsafe { *errno = e };
    r
}

/// `fork`'s parent (`false`) or child (`true`) handler.
pub fn reopen(child: bool) {
    if child {
        reopen_in_child()
    } else {
        reopen_in_parent()
    }
}

pub fn reopen_in_parent() {
    CLOSED.store(false, Ordering::SeqCst);
}

/// In the child, a thread of the parent's may have counted itself in just before giving way to
/// the fork; it does not exist here. The forking thread itself may be inside (a fork from a
/// signal handler, `try_close`): the code below its handler leaves as usual, so it stays counted.
pub fn reopen_in_child() {
    let mine = own_slot();
    for (i, s) in READERS.iter().enumerate() {
        s.0.store(usize::from(mine == Some(i)), Ordering::SeqCst);
    }
    CLOSED.store(false, Ordering::SeqCst);
}
