//! Signal dispositions: `sigaction` and every libc entry point that sets one without passing
//! through the exported `sigaction` (`signal`/`bsd_signal`/`ssignal`, `sysv_signal`, `sigset`,
//! `sigignore`, `siginterrupt`: glibc calls its internal `__sigaction` from them), and the
//! `longjmp` family.
//!
//! Every handler the application installs runs through one trampoline, which
//! - keeps, per thread, the handlers running now (an exact answer to "is `_exit` being called
//!   from a signal handler?", which decides whether the exit report is safe to write), and
//! - for `PINGUARD_SIGNAL`'s signal, wakes the report thread first, then calls the application's
//!   handler, if its latest choice is one (its `SIG_DFL`/`SIG_IGN` become "report only").
//!
//! The application's choice for each signal is kept in two slots and an index, so the trampoline
//! never reads a half-written one (unless two more changes of that signal complete during its
//! read of two words: changes take a lock and system calls each, the read a few loads). What the application asks about a disposition (`oldact`, the
//! previous handler `signal` returns) is its own latest choice, never the trampoline: as if
//! pinguard were absent. A process that does not own pinguard's state (a `vfork` child, which
//! shares its parent's memory) changes only the kernel's dispositions, never the records.

#![deny(unsafe_op_in_unsafe_fn)]

use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};

type Action = libc::sigaction;
type SigactionFn = unsafe extern "C" fn(c_int, *const Action, *mut Action) -> c_int;
type JumpFn = unsafe extern "C" fn(*mut c_void, c_int) -> !;

/// glibc's historical no-op flag, which its `sysv_signal` sets (the kernel drops it).
const SA_INTERRUPT: c_int = 0x2000_0000;
const SIG_HOLD: libc::sighandler_t = 2;
const MAX_SIG: usize = 64;
/// The flags pinguard may set in the kernel differently from the application's choice; what the
/// application asks about shows its own.
const OURS: c_int = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_RESETHAND;
/// Marks a choice taken from the kernel as it stood (`adopt`) rather than made through a call:
/// the application sees exactly that action, flags included (libc adds `SA_RESTORER` to what it
/// installs; an action nobody set has none). A bit no kernel flag uses; never given to the kernel.
const FROM_KERNEL: c_int = 0x0080_0000;

// ---- The application's choices --------------------------------------------------------------

struct Choices {
    slots: [[UnsafeCell<MaybeUninit<Action>>; 2]; MAX_SIG + 1],
    /// 0: no choice recorded (the kernel's action is the truth); 1 or 2: slot 0 or 1.
    current: [AtomicU8; MAX_SIG + 1],
}

// SAFETY: a slot is written only by the holder of `Writer` and only while it is not the current
// one; readers read the current one (published with Release, read with Acquire).
unsafe impl Sync for Choices {}

static CHOICES: Choices = Choices {
    slots: [const { [const { UnsafeCell::new(MaybeUninit::uninit()) }; 2] }; MAX_SIG + 1],
    current: [const { AtomicU8::new(0) }; MAX_SIG + 1],
};

/// A sequence count per signal, odd while the writer changes its record: the trampoline on
/// another thread reads again rather than mix the handler of one choice with the flags of another
/// when two changes overtake its read (the writer's own thread has every signal blocked, so a
/// reader never waits for its own thread).
static SEQ: [AtomicU32; MAX_SIG + 1] = [const { AtomicU32::new(0) }; MAX_SIG + 1];

fn write_begin(sig: usize) {
    SEQ[sig].fetch_add(1, Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Release);
}

fn write_end(sig: usize) {
    SEQ[sig].fetch_add(1, Ordering::Release);
}

/// `PINGUARD_SIGNAL`'s signal once the report thread has taken it over; 0 before.
static REPORT: AtomicI32 = AtomicI32::new(0);
/// The signals `siginterrupt` took `SA_RESTART` from (glibc's own set is internal to it), for
/// the `signal` emulation.
static INTERRUPT: AtomicU64 = AtomicU64::new(0);

fn index(sig: c_int) -> Option<usize> {
    (1..=MAX_SIG as c_int).contains(&sig).then_some(sig as usize)
}

/// The application's latest choice for `sig`.
fn choice(sig: usize) -> Option<Action> {
    let c = CHOICES.current[sig].load(Ordering::Acquire);
    if c == 0 {
        return None;
    }
    // SAFETY: a published slot was fully written before its index was stored (Release/Acquire).
    Some(unsafe { (*CHOICES.slots[sig][c as usize - 1].get()).assume_init_read() })
}

/// Records `a` as the choice for `sig`; returns what to put back if the kernel refuses it.
/// The caller holds `Writer`.
fn publish(sig: usize, a: &Action) -> u8 {
    let cur = CHOICES.current[sig].load(Ordering::Relaxed);
    let next = if cur == 1 { 2 } else { 1 };
    write_begin(sig);
    // SAFETY: `next` is not the current slot, and the writer lock makes this the only writer.
    unsafe { (*CHOICES.slots[sig][next as usize - 1].get()).write(*a) };
    CHOICES.current[sig].store(next, Ordering::Release);
    write_end(sig);
    cur
}

/// The handler and flags of the latest choice: what the trampoline needs, without copying the
/// whole action onto a stack that may be a small alternate one.
fn handler_of(sig: usize) -> Option<(libc::sighandler_t, c_int)> {
    loop {
        let seq = SEQ[sig].load(Ordering::Acquire);
        if seq & 1 == 0 {
            let c = CHOICES.current[sig].load(Ordering::Acquire);
            if c == 0 {
                return None;
            }
            // SAFETY: as in `choice`; only two fields are read, volatile because a writer may
            // rewrite the slot meanwhile, in which case the sequence check below discards them.
            let got = unsafe {
                let a = (*CHOICES.slots[sig][c as usize - 1].get()).as_ptr();
                (std::ptr::addr_of!((*a).sa_sigaction).read_volatile(), std::ptr::addr_of!((*a).sa_flags).read_volatile())
            };
            std::sync::atomic::fence(Ordering::Acquire);
            if SEQ[sig].load(Ordering::Relaxed) == seq {
                return Some(got);
            }
        }
        std::hint::spin_loop();
    }
}

fn unpublish(sig: usize, prev: u8) {
    write_begin(sig);
    CHOICES.current[sig].store(prev, Ordering::Release);
    write_end(sig);
}

static WRITER: AtomicBool = AtomicBool::new(false);

/// Serialises changes of a disposition, so that the record and the kernel's action change
/// together. Every signal is blocked on this thread while it is held: no handler can interrupt
/// the holder (and ask for it again on the same thread), so a holder always makes progress and
/// waiting for it by yielding ends. Async-signal-safe (a handler may call `sigaction`). Only a
/// process that owns pinguard's state takes it: a fork child does from its fork handler on
/// (which first frees it, in case a thread the child does not have held it at the fork).
struct Writer(libc::sigset_t);

impl Writer {
    fn lock() -> Writer {
        // SAFETY: plain values and valid out-pointers; the mask only changes for this thread.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            while WRITER.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
                libc::sched_yield();
            }
            Writer(old)
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        WRITER.store(false, Ordering::Release);
        // SAFETY: restores the mask saved by `lock` on the same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

// ---- The real functions ----------------------------------------------------------------------

fn real_sigaction() -> &'static crate::runtime::resolve::Real {
    super::real!("sigaction")
}

/// The real `sigaction`: the kernel's dispositions, through libc (which adds its restorer).
fn kernel(sig: c_int, act: *const Action, old: *mut Action) -> c_int {
    // SAFETY: the symbol is libc's `sigaction`, whose type this is.
    match unsafe { real_sigaction().get::<SigactionFn>() } {
        // SAFETY: `f` is libc's `sigaction`; the pointers are the caller's, as they would be
        // passed to it.
        Some(f) => unsafe { f(sig, act, old) },
        None => {
            crate::runtime::guard::set_errno(libc::ENOSYS);
            -1
        }
    }
}

/// Finds the real functions now, at start-up, so that no hook ever looks one up from inside a
/// signal handler (the look-up is not async-signal-safe).
pub fn prepare() {
    let _ = real_sigaction().addr();
    for r in jump_reals() {
        let _ = r.addr();
    }
}

// ---- Installing ------------------------------------------------------------------------------

fn trampoline_addr() -> libc::sighandler_t {
    trampoline as *const () as libc::sighandler_t
}

fn is_handler(h: libc::sighandler_t) -> bool {
    h != libc::SIG_DFL && h != libc::SIG_IGN
}

/// Whether this process may change pinguard's records: it owns pinguard's state (not a `vfork`
/// child) and pinguard is not disabled.
fn may_wrap() -> bool {
    crate::lifecycle::wraps_signals() && crate::lifecycle::owns_state()
}

/// What the kernel gets for the application's choice `a`.
fn installed(sig: c_int, a: &Action) -> Action {
    let mut k = *a;
    k.sa_sigaction = trampoline_addr();
    k.sa_flags = (k.sa_flags & !FROM_KERNEL) | libc::SA_SIGINFO;
    if sig == REPORT.load(Ordering::Relaxed) {
        // pinguard's handler stays: a one-shot choice is followed by the trampoline, and the
        // default or ignoring becomes "report only", restarting what the signal interrupts.
        k.sa_flags &= !libc::SA_RESETHAND;
        if !is_handler(a.sa_sigaction) {
            k.sa_flags |= libc::SA_RESTART;
        }
    }
    k
}

/// The disposition as the application sees it, from the kernel's action `k` and the choice
/// recorded when `k` was current.
fn seen(k: &Action, choice: Option<&Action>) -> Action {
    match choice {
        Some(c) if k.sa_sigaction == trampoline_addr() && c.sa_flags & FROM_KERNEL != 0 => {
            let mut a = *c;
            a.sa_flags &= !FROM_KERNEL;
            a
        }
        Some(c) if k.sa_sigaction == trampoline_addr() => {
            let mut a = *k;
            a.sa_sigaction = c.sa_sigaction;
            a.sa_flags = (k.sa_flags & !OURS) | (c.sa_flags & OURS);
            a
        }
        // A one-shot handler the kernel has reset to the default: the kernel keeps the flags the
        // trampoline was installed with (`SA_SIGINFO`); the application asked for its own.
        Some(c) if k.sa_sigaction == libc::SIG_DFL && is_handler(c.sa_sigaction) && c.sa_flags & libc::SA_RESETHAND != 0 => {
            let mut a = *k;
            a.sa_flags = (k.sa_flags & !OURS) | (c.sa_flags & OURS);
            a
        }
        _ => *k,
    }
}

/// `sigaction` for every entry point.
///
/// # Safety
/// As `sigaction(2)`: `act` and `old` are null or valid.
unsafe fn set(sig: c_int, act: *const Action, old: *mut Action) -> c_int {
    let Some(i) = index(sig) else { return kernel(sig, act, old) };
    // Read before any signal is blocked: a bad pointer faults here as it would in libc.
    // SAFETY: the caller passes `act` null or valid, and it is not null here.
    let new = if act.is_null() { None } else { Some(unsafe { *act }) };
    // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask).
    let mut k: Action = unsafe { std::mem::zeroed() };
    let (r, prev, err) = if !may_wrap() {
        // A vfork child (or pinguard disabled): the kernel only; the records are the parent's.
        let r = kernel(sig, new.as_ref().map_or(std::ptr::null(), |a| a as *const Action), &mut k);
        (r, choice(i), crate::runtime::guard::errno())
    } else {
        let _w = Writer::lock();
        let prev = choice(i);
        let r = match new {
            None => kernel(sig, std::ptr::null(), &mut k),
            Some(a) if !is_handler(a.sa_sigaction) && sig != REPORT.load(Ordering::Relaxed) => kernel(sig, &a, &mut k),
            // The trampoline itself (read with the raw system call, put back through libc): the
            // application's handler stays what it was.
            Some(a) if a.sa_sigaction == trampoline_addr() => kernel(sig, &a, &mut k),
            Some(a) => {
                let back = publish(i, &a);
                let ours = installed(sig, &a);
                let r = kernel(sig, &ours, &mut k);
                if r != 0 {
                    unpublish(i, back);
                }
                r
            }
        };
        (r, prev, crate::runtime::guard::errno())
    };
    if r == 0 && !old.is_null() {
        // SAFETY: the caller passes `old` null or valid, and it is not null here.
        unsafe { *old = seen(&k, prev.as_ref()) };
    }
    crate::runtime::guard::set_errno(err);
    r
}

/// At start-up: `sig` is `PINGUARD_SIGNAL`'s. The disposition there now is the application's
/// choice (whatever set it); the trampoline goes in front.
pub fn take_over(sig: c_int) {
    if index(sig).is_none() {
        return;
    }
    REPORT.store(sig, Ordering::Relaxed);
    adopt(sig, true);
}

/// The report thread's periodic look: a disposition set by the raw system call, behind every
/// wrapper, is the application's latest choice too. One the hooks saw is never overwritten (the
/// kernel then holds the trampoline, and this does nothing).
pub fn recheck() {
    let sig = REPORT.load(Ordering::Relaxed);
    if sig != 0 {
        adopt(sig, false);
    }
}

fn adopt(sig: c_int, always: bool) {
    let Some(i) = index(sig) else { return };
    let _w = Writer::lock();
    // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask).
    let mut k: Action = unsafe { std::mem::zeroed() };
    if kernel(sig, std::ptr::null(), &mut k) != 0 {
        return;
    }
    let ours = k.sa_sigaction == trampoline_addr();
    if ours && !always {
        return;
    }
    if !ours {
        publish(i, &libc::sigaction { sa_flags: k.sa_flags | FROM_KERNEL, ..k });
    }
    if let Some(c) = choice(i) {
        kernel(sig, &installed(sig, &c), std::ptr::null_mut());
    }
}

/// In a fork child: a thread that held the writer lock at the fork does not exist there.
pub fn after_fork_child() {
    WRITER.store(false, Ordering::Release);
    // A writer of the parent's may have been between `write_begin` and `write_end`: its slot is
    // either not yet current or whole, so the record stands; an odd count would stall every
    // trampoline of the child.
    for s in &SEQ {
        if s.load(Ordering::Relaxed) & 1 != 0 {
            s.fetch_add(1, Ordering::Release);
        }
    }
}

// ---- The trampoline and the handlers running now ---------------------------------------------

const MAX_FRAMES: usize = 16;

/// One handler invocation on this thread.
#[derive(Clone, Copy)]
struct Entry {
    /// The trampoline's stack pointer (about): the handler's frames are below it while it runs.
    sp: usize,
    /// The alternate signal stack the entry runs on, or (0, 0) on the thread's ordinary stack.
    alt: (usize, usize),
    sig: c_int,
    nodefer: bool,
    /// A `longjmp` was called while this entry was recorded: it may have left the handler.
    jumped: bool,
}

impl Entry {
    const NONE: Entry = Entry { sp: 0, alt: (0, 0), sig: 0, nodefer: false, jumped: false };
}

struct Frames {
    /// Entries recorded; beyond `MAX_FRAMES`, nesting is counted but not recorded.
    depth: Cell<usize>,
    at: [Cell<Entry>; MAX_FRAMES],
}

thread_local! {
    // const and without a destructor: usable from a signal handler, and during `_dl_fini`.
    static FRAMES: Frames = const { Frames { depth: Cell::new(0), at: [const { Cell::new(Entry::NONE) }; MAX_FRAMES] } };
}

#[inline(always)]
fn stack_pointer() -> usize {
    let here = 0u8;
    std::hint::black_box(&here) as *const u8 as usize
}

fn within(sp: usize, range: (usize, usize)) -> bool {
    sp >= range.0 && sp < range.1
}

/// Whether the entry's handler can still be running, seen from stack pointer `sp` with the
/// thread's alternate stack `alt`: its frames are on the stack `sp` is on, above `sp` (stacks
/// grow down). Run from `sp` deeper than the entry on the same stack, a handler that was left
/// by a jump and one that still runs look alike: `jumped` tells them apart (below).
fn below(e: &Entry, sp: usize, alt: (usize, usize)) -> bool {
    if e.alt.1 != 0 {
        // On the alternate stack: once off it, its handler is gone.
        within(sp, e.alt) && sp < e.sp
    } else if alt.1 != 0 && within(sp, alt) {
        // A handler on the alternate stack runs on top of this one.
        true
    } else {
        sp < e.sp
    }
}

/// The alternate stack in force when the kernel delivered the signal (saved in the context).
///
/// # Safety
/// `ctx` is null or the `ucontext_t` the kernel passed to a handler.
unsafe fn alt_of(ctx: *mut c_void) -> (usize, usize) {
    if ctx.is_null() {
        return (0, 0);
    }
    // SAFETY: not null, so by the caller's guarantee the kernel's `ucontext_t`, readable.
    let ss = unsafe { (*(ctx as *const libc::ucontext_t)).uc_stack };
    if ss.ss_flags & libc::SS_DISABLE != 0 || ss.ss_size == 0 {
        (0, 0)
    } else {
        (ss.ss_sp as usize, ss.ss_sp as usize + ss.ss_size)
    }
}

/// Records a handler invocation; returns what `leave` puts back. No guard with a destructor: a
/// handler that jumps out leaves the trampoline's frame without running anything in it (which
/// a frame with a destructor would not allow), and its entry is then dropped by the next entry
/// or ignored by `in_handler`.
fn enter(sig: c_int, nodefer: bool, ctx: *mut c_void) -> usize {
    let sp = stack_pointer();
    // SAFETY: `ctx` is the kernel's (the trampoline is installed with SA_SIGINFO).
    let alt = unsafe { alt_of(ctx) };
    FRAMES.with(|f| {
        let mut d = f.depth.get();
        // Entries of handlers left by a jump that this stack pointer is above go now.
        while d > 0 && d <= MAX_FRAMES && !below(&f.at[d - 1].get(), sp, alt) {
            d -= 1;
        }
        if d < MAX_FRAMES {
            let on = if within(sp, alt) { alt } else { (0, 0) };
            f.at[d].set(Entry { sp, alt: on, sig, nodefer, jumped: false });
        }
        f.depth.set(d + 1);
        d
    })
}

fn leave(depth: usize) {
    FRAMES.with(|f| f.depth.set(depth));
}

/// The one handler pinguard installs for every handled signal.
///
/// `C-unwind`: an application's handler may throw (C++ with -fnon-call-exceptions) to code it
/// interrupted, as it can without pinguard.
///
/// # Safety
/// Called only by the kernel, as an `SA_SIGINFO` handler.
unsafe extern "C-unwind" fn trampoline(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let Some(i) = index(sig) else { return };
    let errno = crate::runtime::guard::errno();
    let app = handler_of(i);
    let nodefer = app.is_some_and(|(_, flags)| flags & libc::SA_NODEFER != 0);
    let depth = enter(sig, nodefer, ctx);
    let report = sig == REPORT.load(Ordering::Relaxed);
    // A vfork child shares the report thread's memory, not its process: its signal is its own.
    if report && crate::lifecycle::owns_state() {
        crate::output::reporter::wake_from_signal();
    }
    // The default or ignoring, for the report signal: the report only.
    let call = app
        .filter(|&(h, _)| is_handler(h) && h != trampoline_addr())
        .filter(|&(h, flags)| !(report && flags & libc::SA_RESETHAND != 0) || reset_once(i, h));
    crate::runtime::guard::set_errno(errno);
    if let Some((h, flags)) = call {
        if flags & libc::SA_SIGINFO != 0 {
            // SAFETY: `h` is a handler the application installed with SA_SIGINFO: a function of
            // this type (not SIG_DFL/SIG_IGN, filtered above).
            let f: unsafe extern "C-unwind" fn(c_int, *mut libc::siginfo_t, *mut c_void) = unsafe { std::mem::transmute(h) };
            // SAFETY: the arguments are the kernel's, as it would pass them to `f` directly.
            unsafe { f(sig, info, ctx) };
        } else {
            // SAFETY: `h` is a handler the application installed without SA_SIGINFO: a function
            // of this type (not SIG_DFL/SIG_IGN, filtered above).
            let f: unsafe extern "C-unwind" fn(c_int) = unsafe { std::mem::transmute(h) };
            // SAFETY: called as the kernel would call it, from a signal handler for `sig`.
            unsafe { f(sig) };
        }
    }
    leave(depth);
}

/// The report signal's one-shot choice (`SA_RESETHAND`, which pinguard keeps out of the kernel
/// so that its own handler stays): the first delivery turns the choice into the default and calls
/// the handler; a delivery racing with it on another thread does not call it again.
/// Out of line: its lock and copies stay off the trampoline's frame, which may sit on a small
/// alternate stack.
#[cold]
#[inline(never)]
fn reset_once(sig: usize, h: libc::sighandler_t) -> bool {
    if !crate::lifecycle::owns_state() {
        // A vfork child: the records are its parent's; its own one-shot handler runs, untouched.
        return true;
    }
    let _w = Writer::lock();
    let Some(c) = choice(sig) else { return false };
    if c.sa_sigaction != h || c.sa_flags & libc::SA_RESETHAND == 0 {
        return false;
    }
    let mut d = c;
    d.sa_sigaction = libc::SIG_DFL;
    publish(sig, &d);
    kernel(sig as c_int, &installed(sig as c_int, &d), std::ptr::null_mut());
    true
}

/// Whether this thread is running a signal handler now. Only async-signal-safe calls.
///
/// Exact for the handlers the trampoline runs while nothing jumps: an entry is recorded on
/// entry and removed on return. A `longjmp`/`siglongjmp` (hooked below) marks the entries then
/// recorded; such an entry counts only while the stack pointer is below it on its stack and its
/// signal is still blocked (as the kernel leaves it for the handler's duration, and as
/// `siglongjmp` to outside the handler undoes), or it was installed with `SA_NODEFER`. For
/// handlers pinguard did not install (set by the raw system call), the old conservative test
/// stands: such a handler's signal blocked on this thread counts as "inside".
pub fn in_handler() -> bool {
    let sp = stack_pointer();
    // SAFETY: valid out-pointers; both calls only read this thread's state.
    let (alt, mask) = unsafe {
        let mut ss: libc::stack_t = std::mem::zeroed();
        let alt = if libc::sigaltstack(std::ptr::null(), &mut ss) == 0 && ss.ss_flags & libc::SS_DISABLE == 0 && ss.ss_size > 0 {
            (ss.ss_sp as usize, ss.ss_sp as usize + ss.ss_size)
        } else {
            (0, 0)
        };
        let mut mask: libc::sigset_t = std::mem::zeroed();
        if libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask) != 0 {
            return true;
        }
        (alt, mask)
    };
    // SAFETY: `mask` is initialised.
    let blocked = |sig: c_int| unsafe { libc::sigismember(&mask, sig) == 1 };
    let inside = FRAMES.with(|f| {
        let d = f.depth.get();
        d > MAX_FRAMES
            || (0..d).any(|i| {
                let e = f.at[i].get();
                below(&e, sp, alt) && (!e.jumped || e.nodefer || blocked(e.sig))
            })
    });
    inside
        || (1..=MAX_SIG as c_int).any(|sig| {
            if !blocked(sig) {
                return false;
            }
            // SAFETY: an all-zero `sigaction` is a valid out-value.
            let mut k: Action = unsafe { std::mem::zeroed() };
            kernel(sig, std::ptr::null(), &mut k) == 0 && is_handler(k.sa_sigaction) && k.sa_sigaction != trampoline_addr()
        })
}

// ---- The exported entry points ---------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: c_int, act: *const Action, old: *mut Action) -> c_int {
    // SAFETY: the C caller keeps `sigaction(2)`'s contract, which is `set`'s.
    unsafe { set(sig, act, old) }
}

#[no_mangle]
pub unsafe extern "C" fn __sigaction(sig: c_int, act: *const Action, old: *mut Action) -> c_int {
    // SAFETY: the C caller keeps `sigaction(2)`'s contract, which is `set`'s.
    unsafe { set(sig, act, old) }
}

/// An action with `h`, `flags` and a mask of `also` (or none).
fn action(h: libc::sighandler_t, flags: c_int, also: Option<c_int>) -> Action {
    // SAFETY: an all-zero `sigaction` is valid; the set functions take valid pointers.
    unsafe {
        let mut a: Action = std::mem::zeroed();
        a.sa_sigaction = h;
        a.sa_flags = flags;
        libc::sigemptyset(&mut a.sa_mask);
        if let Some(s) = also {
            libc::sigaddset(&mut a.sa_mask, s);
        }
        a
    }
}

fn einval<T>(v: T) -> T {
    crate::runtime::guard::set_errno(libc::EINVAL);
    v
}

/// glibc's `signal` (BSD semantics): the signal itself blocked in its handler, restarting unless
/// `siginterrupt` said otherwise.
fn bsd(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    install(sig, h, || {
        let interrupt = INTERRUPT.load(Ordering::Relaxed) & (1 << (sig - 1)) != 0;
        action(h, if interrupt { 0 } else { libc::SA_RESTART }, Some(sig))
    })
}

/// The `signal` shape every BSD and System V entry point shares: `h` installed as `make` says,
/// the previous handler back, `SIG_ERR` and `EINVAL` for a bad signal or handler.
fn install(sig: c_int, h: libc::sighandler_t, make: impl FnOnce() -> Action) -> libc::sighandler_t {
    if h == libc::SIG_ERR || index(sig).is_none() {
        return einval(libc::SIG_ERR);
    }
    let a = make();
    // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask).
    let mut old: Action = unsafe { std::mem::zeroed() };
    // SAFETY: `a` and `old` are locals, valid for the call.
    if unsafe { set(sig, &a, &mut old) } < 0 {
        libc::SIG_ERR
    } else {
        old.sa_sigaction
    }
}

#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    bsd(sig, h)
}

#[no_mangle]
pub unsafe extern "C" fn bsd_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    bsd(sig, h)
}

#[no_mangle]
pub unsafe extern "C" fn ssignal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    bsd(sig, h)
}

/// glibc's `sysv_signal`: one-shot, not deferred, not restarting.
fn sysv(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    install(sig, h, || action(h, (libc::SA_RESETHAND | libc::SA_NODEFER | SA_INTERRUPT) & !libc::SA_RESTART, None))
}

#[no_mangle]
pub unsafe extern "C" fn sysv_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    sysv(sig, h)
}

#[no_mangle]
pub unsafe extern "C" fn __sysv_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    sysv(sig, h)
}

/// glibc's System V `sigset`.
#[no_mangle]
pub unsafe extern "C" fn sigset(sig: c_int, disp: libc::sighandler_t) -> libc::sighandler_t {
    if disp == libc::SIG_ERR || index(sig).is_none() {
        return einval(libc::SIG_ERR);
    }
    // SAFETY: an all-zero `sigset_t` is a valid (empty) set.
    let mut one: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: an all-zero `sigset_t` is a valid (empty) set.
    let mut before: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `one` is a local, valid to write; `sig` is in range (checked above).
    unsafe {
        libc::sigemptyset(&mut one);
        libc::sigaddset(&mut one, sig);
    }
    // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask).
    let mut old: Action = unsafe { std::mem::zeroed() };
    if disp == SIG_HOLD {
        // SAFETY: `one` and `before` are locals, valid for the call.
        if unsafe { libc::sigprocmask(libc::SIG_BLOCK, &one, &mut before) } < 0 {
            return libc::SIG_ERR;
        }
        // SAFETY: `before` is initialised (zeroed, then filled by `sigprocmask`).
        if unsafe { libc::sigismember(&before, sig) } == 1 {
            return SIG_HOLD;
        }
        // SAFETY: a null `act` and a local `old`, valid for the call.
        return if unsafe { set(sig, std::ptr::null(), &mut old) } < 0 { libc::SIG_ERR } else { old.sa_sigaction };
    }
    // SAFETY: a temporary action and a local `old`, valid for the call.
    if unsafe { set(sig, &action(disp, 0, None), &mut old) } < 0
        // SAFETY: `one` and `before` are locals, valid for the call.
        || unsafe { libc::sigprocmask(libc::SIG_UNBLOCK, &one, &mut before) } < 0
    {
        return libc::SIG_ERR;
    }
    // SAFETY: `before` is initialised (zeroed, then filled by `sigprocmask`).
    if unsafe { libc::sigismember(&before, sig) } == 1 {
        SIG_HOLD
    } else {
        old.sa_sigaction
    }
}

#[no_mangle]
pub unsafe extern "C" fn sigignore(sig: c_int) -> c_int {
    // SAFETY: a temporary action and a null `old`, valid for the call.
    unsafe { set(sig, &action(libc::SIG_IGN, 0, None), std::ptr::null_mut()) }
}

#[no_mangle]
pub unsafe extern "C" fn siginterrupt(sig: c_int, interrupt: c_int) -> c_int {
    if index(sig).is_none() {
        return einval(-1);
    }
    // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask).
    let mut a: Action = unsafe { std::mem::zeroed() };
    // SAFETY: a null `act` and a local `old`, valid for the call.
    if unsafe { set(sig, std::ptr::null(), &mut a) } < 0 {
        return -1;
    }
    let bit = 1u64 << (sig - 1);
    if interrupt != 0 {
        INTERRUPT.fetch_or(bit, Ordering::Relaxed);
        a.sa_flags &= !libc::SA_RESTART;
    } else {
        INTERRUPT.fetch_and(!bit, Ordering::Relaxed);
        a.sa_flags |= libc::SA_RESTART;
    }
    // SAFETY: a local `act` and a null `old`, valid for the call.
    if unsafe { set(sig, &a, std::ptr::null_mut()) } < 0 {
        -1
    } else {
        0
    }
}

// ---- Jumps out of handlers -------------------------------------------------------------------

fn jump_reals() -> [&'static crate::runtime::resolve::Real; 4] {
    [super::real!("longjmp"), super::real!("_longjmp"), super::real!("siglongjmp"), super::real!("__longjmp_chk")]
}

/// Marks this thread's recorded handlers: the jump may leave them. Then jumps.
///
/// # Safety
/// `real` names a function of `JumpFn`'s type; `env` and `val` are as that function requires.
unsafe fn jump(real: &'static crate::runtime::resolve::Real, env: *mut c_void, val: c_int) -> ! {
    FRAMES.with(|f| {
        for e in &f.at[..f.depth.get().min(MAX_FRAMES)] {
            let mut v = e.get();
            v.jumped = true;
            e.set(v);
        }
    });
    // SAFETY: the caller guarantees `real` names a function of `JumpFn`'s type.
    match unsafe { real.get::<JumpFn>() } {
        // SAFETY: `env` and `val` are as the real function requires (the caller's guarantee).
        Some(f) => unsafe { f(env, val) },
        // SAFETY: `abort` has no precondition.
        None => unsafe { libc::abort() }, // libc without longjmp: nothing sensible is left to do
    }
}

#[no_mangle]
pub unsafe extern "C" fn longjmp(env: *mut c_void, val: c_int) -> ! {
    // SAFETY: `jump_reals()[0]` names `longjmp`, a `JumpFn`; `env`, `val` are the C caller's.
    unsafe { jump(jump_reals()[0], env, val) }
}

#[no_mangle]
pub unsafe extern "C" fn _longjmp(env: *mut c_void, val: c_int) -> ! {
    // SAFETY: `jump_reals()[1]` names `_longjmp`, a `JumpFn`; `env`, `val` are the C caller's.
    unsafe { jump(jump_reals()[1], env, val) }
}

#[no_mangle]
pub unsafe extern "C" fn siglongjmp(env: *mut c_void, val: c_int) -> ! {
    // SAFETY: `jump_reals()[2]` names `siglongjmp`, a `JumpFn`; `env`, `val` are the C caller's.
    unsafe { jump(jump_reals()[2], env, val) }
}

#[no_mangle]
pub unsafe extern "C" fn __longjmp_chk(env: *mut c_void, val: c_int) -> ! {
    // SAFETY: `jump_reals()[3]` names `__longjmp_chk`, a `JumpFn`; `env`, `val` are the C caller's.
    unsafe { jump(jump_reals()[3], env, val) }
}
