//! Signal dispositions: `sigaction` and every libc entry point that sets one without passing
//! through the exported `sigaction` (`signal`/`bsd_signal`/`ssignal`, `sysv_signal`, `sigset`,
//! `sigignore`, `siginterrupt`: glibc calls its internal `__sigaction` from them).
//!
//! The application's handlers are its own: the kernel runs each directly, on the stack it asked
//! for, with all of that stack's room; pinguard writes nothing there. The one exception is
//! `PINGUARD_SIGNAL`'s signal, whose disposition in the kernel is pinguard's `trampoline`: a few
//! instructions that touch no stack (registers, two system calls, three words of pinguard's
//! own), wake the report thread, and then *jump* to the application's handler for that signal,
//! if its latest choice is one (its `SIG_DFL`/`SIG_IGN` become "report only"), which so starts
//! with the very stack pointer, registers and return address the kernel gave.
//!
//! For that signal the application's choice is kept (in two slots and an index), and what the
//! application asks about it (`oldact`, the previous handler `signal` returns) is its own latest
//! choice, never the trampoline: as if pinguard were absent. Every other signal goes straight to
//! libc's `sigaction`. A process that does not own pinguard's state (a `vfork` child, which
//! shares its parent's memory) changes only the kernel's dispositions, never the records.
//!
//! Whether `_exit` is called from inside a signal handler (`in_handler`) is read from the thread
//! itself when asked, not kept by wrapping handlers: on the alternate stack, or a signal frame on
//! the way up from the caller (libgcc's unwinder marks the frame the kernel's signal return
//! resumes). A handler left by a `longjmp` is off that way up, so no jump needs following.

#![deny(unsafe_op_in_unsafe_fn)]

use super::hand_hooks;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

type Action = libc::sigaction;

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

// ---- The application's choice for the report signal -----------------------------------------

/// The application's latest choice for the report signal, in two slots: the one not current is
/// written, then made current. Only the holder of `Writer` reads or writes them (the trampoline
/// reads `APP`/`ONCE` instead).
struct Choice {
    slots: [UnsafeCell<MaybeUninit<Action>>; 2],
    /// 0: no choice recorded (the kernel's action is the truth); 1 or 2: slot 0 or 1.
    current: AtomicU8,
}

// SAFETY: the slots are read and written only by the holder of `Writer`, one thread at a time.
unsafe impl Sync for Choice {}

static CHOICE: Choice = Choice {
    slots: [const { UnsafeCell::new(MaybeUninit::uninit()) }; 2],
    current: AtomicU8::new(0),
};

/// The handler the trampoline jumps to: the application's latest choice when it is a function
/// and not one-shot; 0 otherwise.
static APP: AtomicUsize = AtomicUsize::new(0);
/// The same for a one-shot choice (`SA_RESETHAND`, which the kernel never sees: pinguard's
/// handler stays): the first delivery takes it (an exchange with 0), so it runs once however
/// many threads the signal reaches at once; `settle` then makes the record say `SIG_DFL`.
static ONCE: AtomicUsize = AtomicUsize::new(0);

/// `PINGUARD_SIGNAL`'s signal once the report thread has taken it over; 0 before.
static REPORT: AtomicI32 = AtomicI32::new(0);
/// The signals `siginterrupt` took `SA_RESTART` from (glibc's own set is internal to it), for
/// the `signal` emulation.
static INTERRUPT: AtomicU64 = AtomicU64::new(0);

fn index(sig: c_int) -> Option<usize> {
    (1..=MAX_SIG as c_int)
        .contains(&sig)
        .then_some(sig as usize)
}

fn is_report(sig: c_int) -> bool {
    sig != 0 && sig == REPORT.load(Ordering::Relaxed)
}

/// The application's latest choice for the report signal. The caller holds `Writer`.
fn choice() -> Option<Action> {
    let c = CHOICE.current.load(Ordering::Acquire);
    if c == 0 {
        return None;
    }
    // SAFETY: a published slot was fully written before its index was stored, by a holder of
    // `Writer`, which the caller now is.
    Some(unsafe { (*CHOICE.slots[c as usize - 1].get()).assume_init_read() })
}

/// Records `a` as the choice and points the trampoline at its handler; returns what to put back
/// if the kernel refuses it. The caller holds `Writer`.
fn publish(a: &Action) -> u8 {
    let cur = CHOICE.current.load(Ordering::Relaxed);
    let next = if cur == 1 { 2 } else { 1 };
    // SAFETY: `next` is not the current slot, and the writer lock makes this the only writer.
    unsafe { (*CHOICE.slots[next as usize - 1].get()).write(*a) };
    CHOICE.current.store(next, Ordering::Release);
    arm(Some(a));
    cur
}

fn unpublish(prev: u8) {
    CHOICE.current.store(prev, Ordering::Release);
    arm(choice().as_ref());
}

/// Points the trampoline at choice `c`'s handler. The new word is set before the other is
/// cleared: a delivery meanwhile runs the old handler or the new one, never none.
fn arm(c: Option<&Action>) {
    let h = c.map_or(libc::SIG_DFL, |a| a.sa_sigaction);
    let h = if is_handler(h) && h != trampoline_addr() {
        h
    } else {
        0
    };
    if c.is_some_and(|a| a.sa_flags & libc::SA_RESETHAND != 0) {
        ONCE.store(h, Ordering::Release);
        APP.store(0, Ordering::Release);
    } else {
        APP.store(h, Ordering::Release);
        ONCE.store(0, Ordering::Release);
    }
}

/// A one-shot handler the trampoline has run: the choice becomes the default, as the kernel
/// would have made it (flags kept), and the kernel's flags those of "report only". The caller
/// holds `Writer`.
fn settle(sig: c_int) {
    let Some(c) = choice() else { return };
    if !is_handler(c.sa_sigaction)
        || c.sa_sigaction == trampoline_addr()
        || c.sa_flags & libc::SA_RESETHAND == 0
        || ONCE.load(Ordering::Acquire) != 0
    {
        return;
    }
    let d = libc::sigaction {
        sa_sigaction: libc::SIG_DFL,
        ..c
    };
    publish(&d);
    kernel(sig, &installed(&d), std::ptr::null_mut());
}

static WRITER: AtomicBool = AtomicBool::new(false);

/// Serialises changes of the report signal's disposition, so that the record and the kernel's
/// action change together. Every signal is blocked on this thread while it is held: no handler
/// can interrupt the holder (and ask for it again on the same thread), so a holder always makes
/// progress and waiting for it by yielding ends. Async-signal-safe (a handler may call
/// `sigaction`). Only a process that owns pinguard's state takes it: a fork child does from its
/// fork handler on (which first frees it, in case a thread the child does not have held it at
/// the fork).
struct Writer(libc::sigset_t);

impl Writer {
    fn lock() -> Writer {
        // SAFETY: plain values and valid out-pointers; the mask only changes for this thread.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            while WRITER
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
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

/// The real `sigaction`: the kernel's dispositions, through libc (which adds its restorer).
fn kernel(sig: c_int, act: *const Action, old: *mut Action) -> c_int {
    match sigaction::get() {
        // SAFETY: `f` is libc's `sigaction`; the pointers are the caller's, as they would be
        // passed to it.
        Some(f) => unsafe { f(sig, act, old) },
        None => {
            crate::runtime::guard::set_errno(libc::ENOSYS);
            -1
        }
    }
}

/// Finds the real function now, at start-up, so that no hook ever looks one up from inside a
/// signal handler (the look-up is not async-signal-safe).
pub fn prepare() {
    sigaction::REAL.prepare();
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

/// What the kernel gets for the application's choice `a` of the report signal: the trampoline,
/// with the application's mask and flags (so its handler runs on the stack, with the signals
/// blocked, that it asked for), less a one-shot reset (the trampoline stays); the default or
/// ignoring becomes "report only", restarting what the signal interrupts.
fn installed(a: &Action) -> Action {
    let mut k = *a;
    k.sa_sigaction = trampoline_addr();
    k.sa_flags = (k.sa_flags & !FROM_KERNEL & !libc::SA_RESETHAND) | libc::SA_SIGINFO;
    if !is_handler(a.sa_sigaction) {
        k.sa_flags |= libc::SA_RESTART;
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
        _ => *k,
    }
}

/// `sigaction` for every entry point: libc's own, except for the report signal.
///
/// # Safety
/// As `sigaction(2)`: `act` and `old` are null or valid.
unsafe fn set(sig: c_int, act: *const Action, old: *mut Action) -> c_int {
    if !is_report(sig) || !may_wrap() {
        // Every other signal, and in a vfork child (or with pinguard disabled) this one too: the
        // kernel only; the records are the parent's.
        return kernel(sig, act, old);
    }
    // Read before any signal is blocked: a bad pointer faults here as it would in libc (read
    // unaligned: a debug build's alignment check would panic where libc faults).
    let new = if act.is_null() {
        None
    } else {
        // SAFETY: the caller passes `act` null or valid, and it is not null here.
        Some(unsafe { act.read_unaligned() })
    };
    // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask).
    let mut k: Action = unsafe { std::mem::zeroed() };
    let (r, prev, err) = {
        let _w = Writer::lock();
        settle(sig);
        let prev = choice();
        let r = match new {
            None => kernel(sig, std::ptr::null(), &mut k),
            // The trampoline itself (read with the raw system call, put back through libc): the
            // application's handler stays what it was.
            Some(a) if a.sa_sigaction == trampoline_addr() => kernel(sig, &a, &mut k),
            Some(a) => {
                let back = publish(&a);
                let r = kernel(sig, &installed(&a), &mut k);
                if r != 0 {
                    unpublish(back);
                }
                r
            }
        };
        (r, prev, crate::runtime::guard::errno())
    };
    if r == 0 && !old.is_null() {
        // SAFETY: the caller passes `old` null or valid, and it is not null here.
        unsafe { old.write_unaligned(seen(&k, prev.as_ref())) };
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

/// The report thread's periodic look (and its look after each report signal): a one-shot
/// handler that ran is recorded as reset, and a disposition set by the raw system call, behind
/// every wrapper, is the application's latest choice too. One the hooks saw is never
/// overwritten (the kernel then holds the trampoline, and this does nothing more).
pub fn recheck() {
    let sig = REPORT.load(Ordering::Relaxed);
    if sig != 0 {
        adopt(sig, false);
    }
}

fn adopt(sig: c_int, always: bool) {
    let _w = Writer::lock();
    settle(sig);
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
        publish(&libc::sigaction {
            sa_flags: k.sa_flags | FROM_KERNEL,
            ..k
        });
    }
    if let Some(c) = choice() {
        kernel(sig, &installed(&c), std::ptr::null_mut());
    }
}

/// In a fork child: a thread that held the writer lock at the fork does not exist there.
pub fn after_fork_child() {
    WRITER.store(false, Ordering::Release);
}

// ---- The report signal's trampoline ----------------------------------------------------------

/// The report signal's handler in the kernel. It writes no memory but `WAKE` and `ONCE` and uses
/// no stack: the arguments wait in scratch registers across the system calls (which keep every
/// register but the ones named below), and the application's handler is reached by a jump, so
/// that it runs exactly as the kernel would have started it (stack pointer, return address to
/// the kernel's signal return, arguments); an unwinder or a `longjmp` in it never meets this
/// code. A `vfork` child (another process in this memory) does not wake the report thread: its
/// signal is its own. Async-signal-safe; `errno` untouched (raw system calls).
///
/// x86-64: `syscall` clobbers rax, rcx, r11; rdi, rsi, rdx are kept in r8, r9, r10 (FUTEX_WAKE
/// reads no argument past the third).
#[cfg(target_arch = "x86_64")]
// SAFETY (naked): the body is the whole function; it keeps the ABI a handler needs (it returns
// with `ret` or leaves by a jump to a handler of the same type), and touches only the registers
// named above, which a call may clobber, and the three words it names.
#[unsafe(naked)]
unsafe extern "C" fn trampoline(_sig: c_int, _info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    std::arch::naked_asm!(
        "endbr64",
        "mov r8, rdi",
        "mov r9, rsi",
        "mov r10, rdx",
        "mov eax, {getpid}",
        "syscall",
        "mov ecx, dword ptr [rip + {owner}]",
        "test ecx, ecx",
        "jz 2f",
        "cmp eax, ecx",
        "jne 3f",
        "2:",
        "lock inc dword ptr [rip + {wake}]",
        "lea rdi, [rip + {wake}]",
        "mov esi, {wake_op}",
        "mov edx, 1",
        "mov eax, {futex}",
        "syscall",
        "3:",
        "xor eax, eax",
        "xchg rax, qword ptr [rip + {once}]",
        "test rax, rax",
        "jnz 4f",
        "mov rax, qword ptr [rip + {app}]",
        "test rax, rax",
        "jz 5f",
        "4:",
        "mov rdi, r8",
        "mov rsi, r9",
        "mov rdx, r10",
        "jmp rax",
        "5:",
        "ret",
        getpid = const libc::SYS_getpid,
        futex = const libc::SYS_futex,
        wake_op = const libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
        owner = sym crate::lifecycle::OWNER,
        wake = sym crate::output::reporter::WAKE,
        once = sym ONCE,
        app = sym APP,
    )
}

/// aarch64: `svc` clobbers x0 only; x0-x2 are kept in x9-x11, the handler's address goes in x16
/// (the register a `bti c` landing pad accepts from `br`); the link register is untouched.
#[cfg(target_arch = "aarch64")]
// SAFETY (naked): as on x86-64; x8-x16 are scratch registers a call may clobber, and the link
// register and stack pointer are untouched.
#[unsafe(naked)]
unsafe extern "C" fn trampoline(_sig: c_int, _info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    std::arch::naked_asm!(
        "hint #34", // bti c
        "mov x9, x0",
        "mov x10, x1",
        "mov x11, x2",
        "mov x8, #{getpid}",
        "svc #0",
        "adrp x12, {owner}",
        "ldr w13, [x12, :lo12:{owner}]",
        "cbz w13, 2f",
        "cmp w0, w13",
        "b.ne 3f",
        "2:",
        "adrp x12, {wake}",
        "add x12, x12, :lo12:{wake}",
        "6:",
        "ldxr w13, [x12]",
        "add w13, w13, #1",
        "stlxr w14, w13, [x12]",
        "cbnz w14, 6b",
        "mov x0, x12",
        "mov x1, #{wake_op}",
        "mov x2, #1",
        "mov x8, #{futex}",
        "svc #0",
        "3:",
        "adrp x12, {once}",
        "add x12, x12, :lo12:{once}",
        "7:",
        "ldaxr x16, [x12]",
        "stlxr w14, xzr, [x12]",
        "cbnz w14, 7b",
        "cbnz x16, 4f",
        "adrp x12, {app}",
        "ldr x16, [x12, :lo12:{app}]",
        "cbz x16, 5f",
        "4:",
        "mov x0, x9",
        "mov x1, x10",
        "mov x2, x11",
        "br x16",
        "5:",
        "ret",
        getpid = const libc::SYS_getpid,
        futex = const libc::SYS_futex,
        wake_op = const libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
        owner = sym crate::lifecycle::OWNER,
        wake = sym crate::output::reporter::WAKE,
        once = sym ONCE,
        app = sym APP,
    )
}

/// Elsewhere, the same in Rust: it calls the handler from a small frame of its own.
///
/// # Safety
/// Called only by the kernel, as an `SA_SIGINFO` handler.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe extern "C-unwind" fn trampoline(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    if crate::lifecycle::owns_state() {
        crate::output::reporter::wake_from_signal();
    }
    let h = match ONCE.swap(0, Ordering::AcqRel) {
        0 => APP.load(Ordering::Acquire),
        h => h,
    };
    if h != 0 {
        // SAFETY: `h` is a handler the application installed (filtered by `arm`); installed with
        // SA_SIGINFO, the kernel passes three arguments, which a one-argument handler ignores.
        let f: unsafe extern "C-unwind" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        // SAFETY: the arguments are the kernel's, as it would pass them to `f` directly.
        unsafe { f(sig, info, ctx) };
    }
}

// ---- Inside a handler? -----------------------------------------------------------------------

/// Whether this thread is running a signal handler now, asked by `_exit` (once per process):
/// on the alternate signal stack (where only a handler runs), or a signal frame on the way up
/// from here. Jumps need no following: a handler left by a `longjmp` is not on the way up any
/// more. Handlers set by any means count, the raw system call's too. What it cannot see: a
/// handler above frames the unwinder cannot cross (code without unwind tables between the
/// handler's entry and the `_exit` call); then `_exit` writes its report as from outside.
/// Whether pinguard may set itself up on this thread now: not inside a signal handler, which may
/// have interrupted the C library's `malloc` or loader (set-up loads the unwinder and registers
/// the fork handlers through them). Before set-up the unwinder may not be there to walk for a
/// signal frame: then a blocked signal that has a handler stands for one (asked of the kernel:
/// the program may have set it with the raw system call). A wrong "inside" only leaves set-up to
/// a later call, the call before it passing through untracked.
pub fn may_set_up() -> bool {
    if crate::runtime::unwinder::ready() {
        return !in_handler();
    }
    // SAFETY: a valid out-pointer; the call only reads this thread's state.
    let on_alt = unsafe {
        let mut ss: libc::stack_t = std::mem::zeroed();
        libc::sigaltstack(std::ptr::null(), &mut ss) == 0 && ss.ss_flags & libc::SS_ONSTACK != 0
    };
    !on_alt && !blocked_signal_with_handler()
}

/// Whether a signal blocked on this thread has a handler: raw system calls, no allocation.
fn blocked_signal_with_handler() -> bool {
    let mut set = 0u64;
    // SAFETY: rt_sigprocmask with a null new set only writes the current mask (8 bytes) to `set`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            std::ptr::null::<u64>(),
            &mut set as *mut u64,
            8usize,
        )
    };
    if rc != 0 {
        return false;
    }
    (1..=64)
        .filter(|s| set & (1u64 << (s - 1)) != 0)
        .any(|sig| {
            // The kernel's `struct sigaction`: handler, flags, restorer, mask.
            let mut act = [0usize; 4];
            // SAFETY: a null new action only reads the disposition into `act`, large enough.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig as libc::c_long,
                    std::ptr::null::<usize>(),
                    act.as_mut_ptr(),
                    8usize,
                )
            };
            rc == 0 && act[0] != libc::SIG_DFL && act[0] != libc::SIG_IGN
        })
}

pub fn in_handler() -> bool {
    // SAFETY: a valid out-pointer; the call only reads this thread's state.
    let on_alt = unsafe {
        let mut ss: libc::stack_t = std::mem::zeroed();
        libc::sigaltstack(std::ptr::null(), &mut ss) == 0 && ss.ss_flags & libc::SS_ONSTACK != 0
    };
    on_alt || signal_frame_above()
}

extern "C" {
    // libgcc's unwinder (libgcc_s, which the Rust standard library links).
    fn _Unwind_Backtrace(
        trace: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIPInfo(ctx: *mut c_void, ip_before_insn: *mut c_int) -> usize;
}

/// Frames looked at, at most: a bound on the time, however deep the recursion.
const MAX_WALK: usize = 100_000;

/// Walks this thread's stack from here up; true at the first frame that a signal interrupted
/// (the unwinder reports its instruction pointer as exact, not a return address).
#[inline(never)]
fn signal_frame_above() -> bool {
    struct Walk {
        frames: usize,
        found: bool,
    }
    unsafe extern "C" fn each(ctx: *mut c_void, arg: *mut c_void) -> c_int {
        // SAFETY: `arg` is the `Walk` below, alive for the whole walk, used by nothing else.
        let w = unsafe { &mut *(arg as *mut Walk) };
        let mut exact: c_int = 0;
        // SAFETY: `ctx` is the unwinder's context for this frame, valid during the callback.
        let ip = unsafe { _Unwind_GetIPInfo(ctx, &mut exact) };
        w.frames += 1;
        if exact != 0 {
            w.found = true;
        }
        // Any value but _URC_NO_REASON (0) ends the walk.
        c_int::from(w.found || ip == 0 || w.frames >= MAX_WALK)
    }
    let mut w = Walk {
        frames: 0,
        found: false,
    };
    // The unwinder takes the loader's lock: a fork meanwhile waits (see `runtime::gate`).
    let _open = crate::runtime::gate::enter();
    // SAFETY: `each` has the callback's type and treats `arg` as the `Walk` passed here.
    unsafe { _Unwind_Backtrace(each, &mut w as *mut Walk as *mut c_void) };
    w.found
}

// ---- The exported entry points ---------------------------------------------------------------

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

/// glibc's `sysv_signal`: one-shot, not deferred, not restarting.
fn sysv(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    install(sig, h, || {
        action(
            h,
            (libc::SA_RESETHAND | libc::SA_NODEFER | SA_INTERRUPT) & !libc::SA_RESTART,
            None,
        )
    })
}

/// glibc's System V `sigset`.
fn hold_or_set(sig: c_int, disp: libc::sighandler_t) -> libc::sighandler_t {
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
        return if unsafe { set(sig, std::ptr::null(), &mut old) } < 0 {
            libc::SIG_ERR
        } else {
            old.sa_sigaction
        };
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

fn ignore(sig: c_int) -> c_int {
    // SAFETY: a temporary action and a null `old`, valid for the call.
    unsafe { set(sig, &action(libc::SIG_IGN, 0, None), std::ptr::null_mut()) }
}

fn set_interrupt(sig: c_int, interrupt: c_int) -> c_int {
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

/// In a musl process (pinguard stands down: `dl::foreign_libc`) the C library's own function
/// of the row's name, whose semantics may differ from glibc's; glibc's, emulated, otherwise.
macro_rules! own_or {
    ($($own:ident: $row:ident($($a:ident: $t:ty),*) -> $r:ty => $emulated:ident;)*) => {$(
        fn $own($($a: $t),*) -> $r {
            if crate::runtime::dl::foreign_libc() {
                if let Some(f) = $row::get() {
                    // SAFETY: `f` is the C library's function of this name and type; the
                    // arguments are the C caller's, under its contract.
                    return unsafe { f($($a),*) };
                }
            }
            $emulated($($a),*)
        }
    )*};
}

own_or! {
    own_signal: signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t => bsd;
    own_bsd_signal: bsd_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t => bsd;
    own_ssignal: ssignal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t => bsd;
    own_sysv_signal: sysv_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t => sysv;
    own_sysv_signal2: __sysv_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t => sysv;
    own_sigset: sigset(sig: c_int, disp: libc::sighandler_t) -> libc::sighandler_t => hold_or_set;
    own_sigignore: sigignore(sig: c_int) -> c_int => ignore;
    own_siginterrupt: siginterrupt(sig: c_int, interrupt: c_int) -> c_int => set_interrupt;
}

hand_hooks! {
    /// Sets or reads a disposition: the report signal's is followed (see `set`), every other is
    /// the kernel's.
    fn sigaction(sig: c_int, act: *const Action, old: *mut Action) -> c_int => set;
    /// glibc's internal name for `sigaction`.
    fn __sigaction(sig: c_int, act: *const Action, old: *mut Action) -> c_int => set;
    /// BSD semantics: the signal blocked in its handler, restarting calls.
    fn signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t => own_signal;
    /// The same as `signal`.
    fn bsd_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t => own_bsd_signal;
    /// The same as `signal`.
    fn ssignal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t => own_ssignal;
    /// System V semantics: one-shot, not deferred, not restarting.
    fn sysv_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t => own_sysv_signal;
    /// glibc's internal name for `sysv_signal`.
    fn __sysv_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t => own_sysv_signal2;
    /// System V: a handler, or `SIG_HOLD` to block the signal.
    fn sigset(sig: c_int, disp: libc::sighandler_t) -> libc::sighandler_t => own_sigset;
    /// Ignores a signal.
    fn sigignore(sig: c_int) -> c_int => own_sigignore;
    /// Whether the signal's handler interrupts system calls rather than restarting them.
    fn siginterrupt(sig: c_int, interrupt: c_int) -> c_int => own_siginterrupt;
}
