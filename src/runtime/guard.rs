//! Per-thread state for the hooks: the reentrancy flag, errno, the thread id, the thread's event
//! counters.
//!
//! All of it sits in one `const` thread-local with no destructor: one TLS look-up per hooked call
//! (in a shared library each look-up is a call to `__tls_get_addr`), and it stays usable during
//! `_dl_fini`, after Rust's destructible thread-locals are gone (docs/field-notes.md).

use std::cell::Cell;
use std::os::raw::c_int;

pub struct Thread {
    active: Cell<bool>,
    tid: Cell<u32>,
    errno: Cell<*mut c_int>,
    /// The counter block this thread writes, null until its first count. Opaque here: the
    /// accounting stage owns the type (`ledger::blocks::Block`) and is the only one to cast it back.
    pub(crate) counters: Cell<*const ()>,
    /// Calls since the last look for a Python interpreter (`python::known`).
    pub(crate) python_calls: Cell<u32>,
    /// The top of this thread's own stack (`workstack`): 0 until mapped, 1 if that failed.
    pub(crate) work: Cell<usize>,
    /// Set while this thread's work runs on that stack.
    pub(crate) on_work: Cell<bool>,
    /// Set while this thread's work runs on the caller's stack, for want of its own.
    pub(crate) short: Cell<bool>,
    /// Set while this thread runs one of the locking family's hooks (in this block rather than a
    /// thread-local of its own: each is a `__tls_get_addr` call on the hot path).
    pub(crate) locking: Cell<bool>,
}

// Every field is whole after any panic (single-word cells); hooks run their bookkeeping under
// `catch_unwind` with the thread at hand.
impl std::panic::RefUnwindSafe for Thread {}

thread_local! {
    static THREAD: Thread = const {
        Thread {
            active: Cell::new(false),
            tid: Cell::new(0),
            errno: Cell::new(std::ptr::null_mut()),
            counters: Cell::new(std::ptr::null()),
            python_calls: Cell::new(0),
            work: Cell::new(0),
            on_work: Cell::new(false),
            short: Cell::new(false),
            locking: Cell::new(false),
        }
    };
}

/// The calling thread's state. `Thread` is not `Sync`, so the reference cannot leave the thread,
/// and a destructor-less thread-local lives as long as its thread.
#[inline(always)]
pub fn here() -> &'static Thread {
    // SAFETY: A destructor-less thread-local lives as long as its thread, and `Thread` is !Sync,
    // so the 'static reference never leaves the thread that owns it.
    THREAD.with(|t| unsafe { &*(t as *const Thread) })
}

impl Thread {
    pub fn errno(&self) -> c_int {
        // SAFETY: `errno_ptr` is libc's `__errno_location` for this thread (Thread is thread-local and !Sync),
        // valid for the thread's whole life.
        unsafe { *self.errno_ptr() }
    }

    pub fn set_errno(&self, v: c_int) {
        // SAFETY: `errno_ptr` is libc's `__errno_location` for this thread (Thread is thread-local and !Sync),
        // valid for the thread's whole life.
        unsafe { *self.errno_ptr() = v }
    }

    /// errno's address is fixed for a thread's life (and kept by a fork child, whose thread is a
    /// copy of the forking one): asked of libc once.
    #[inline]
    pub fn errno_location(&self) -> *mut c_int {
        self.errno_ptr()
    }

    #[inline]
    fn errno_ptr(&self) -> *mut c_int {
        let p = self.errno.get();
        if !p.is_null() {
            return p;
        }
        // SAFETY: `__errno_location` has no preconditions and always returns a valid pointer.
        let p = unsafe { libc::__errno_location() };
        self.errno.set(p);
        p
    }

    /// Whether this thread is inside pinguard now.
    #[inline(always)]
    pub fn is_inside(&self) -> bool {
        self.active.get()
    }

    /// The kernel thread id, cached: `gettid` is a syscall and the report wants it per allocation.
    #[inline]
    pub fn tid(&self) -> u32 {
        let v = self.tid.get();
        if v != 0 {
            return v;
        }
        // SAFETY: gettid takes no arguments, touches no memory and cannot fail.
        let v = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        self.tid.set(v);
        v
    }
}

/// Marks the thread as inside pinguard. While it lives, every hook the thread reaches (the
/// runtime calling itself, std calling `mmap` for pinguard's own work) passes straight through, so
/// only the outermost intercepted call is counted.
pub struct Reentry(&'static Thread);

impl Reentry {
    #[inline(always)]
    pub fn enter() -> Option<Reentry> {
        Reentry::enter_on(here())
    }

    #[inline(always)]
    pub fn enter_on(t: &'static Thread) -> Option<Reentry> {
        if t.active.get() {
            return None;
        }
        t.active.set(true);
        Some(Reentry(t))
    }

    pub fn thread(&self) -> &'static Thread {
        self.0
    }
}

impl Drop for Reentry {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.active.set(false);
    }
}

/// Keys below this index keep their values inside glibc's thread descriptor; from it up,
/// `pthread_setspecific` `calloc`s a block (glibc's `PTHREAD_KEY_2NDLEVEL_SIZE`).
pub const PTHREAD_KEY_INLINE: usize = 32;

/// Marks the thread as inside pinguard for a section that has no `Reentry` of its own (the heap);
/// returns whether it already was, for `unmark_inside`.
#[inline(always)]
pub fn mark_inside() -> bool {
    here().active.replace(true)
}

#[inline(always)]
pub fn unmark_inside(was: bool) {
    here().active.set(was);
}

/// Whether this thread is inside pinguard now.
pub fn inside() -> bool {
    here().active.get()
}

pub fn errno() -> c_int {
    here().errno()
}

pub fn set_errno(v: c_int) {
    here().set_errno(v)
}

pub fn tid() -> u32 {
    here().tid()
}

/// Forgets the cached thread id; a fork child's only thread has a new one.
pub fn forget_tid() {
    here().tid.set(0);
}
