//! pinguard's own stack, one per thread: a hooked call does its work (the stack walk, the
//! callsite, the budget, the records, the first call's set-up) here, not on the application's
//! stack, which may be a 16 KiB thread's, an 8 KiB alternate signal stack or a coroutine's.
//! The caller's stack then holds only the hook's own small frame and the switch's.
//!
//! The stack is mapped on the thread's first tracked call (`mmap` is a plain system call, so a
//! signal handler may do it), with a guard page below it; only the pages touched take memory. It
//! is unmapped by a pthread key's destructor when the thread ends. A fork child's thread keeps its
//! copy (the mapping is private). Where it cannot be had (the mapping refused), the work runs in
//! place and `short` says so: the callers then skip the stack walk (the call is still counted,
//! under the empty callsite) and the report counts those calls (`stack_short_count`).
//!
//! The switch (`pinguard_on_stack`) is a frame-pointer frame with call-frame information, so an
//! unwinder running on this stack (libgcc's, the walk's fallback) follows it back to the
//! application's stack. A panic never crosses it: `run` catches it on this stack and resumes it
//! after the switch back.

use crate::runtime::guard::Thread;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// Usable bytes of each thread's stack. The deepest work pinguard does inside a hooked call (the
/// first call's set-up, a `warn` line naming its callsite from symbol tables) takes tens of KiB;
/// the rest is room for a signal handler that interrupts that work on this stack.
pub const SIZE: usize = 256 * 1024;

/// Bytes above the stack, in the same mapping, for per-thread caches that would otherwise be
/// static TLS (which every thread's stack pays for, pinning or not): zeroed, freed with the stack.
pub const CACHES: usize = 4096;

/// Calls whose work ran on the caller's stack because no stack of pinguard's could be mapped.
static SHORT: AtomicU64 = AtomicU64::new(0);

pub fn short_count() -> u64 {
    SHORT.load(Ordering::Relaxed)
}

/// A fork child starts its figures afresh.
pub fn forget_short() {
    SHORT.store(0, Ordering::Relaxed);
}

/// `Thread::work` while nothing is mapped yet / after a mapping failed.
const UNMAPPED: usize = 0;
const FAILED: usize = 1;

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl pinguard_on_stack",
    ".hidden pinguard_on_stack",
    ".type pinguard_on_stack,@function",
    // pinguard_on_stack(arg: rdi, f: rsi, top: rdx): calls f(arg) with rsp = top.
    "pinguard_on_stack:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rbp, rsp",
    ".cfi_def_cfa_register rbp",
    "mov rsp, rdx",
    "call rsi",
    "mov rsp, rbp",
    "pop rbp",
    ".cfi_def_cfa rsp, 8",
    "ret",
    ".cfi_endproc",
    ".size pinguard_on_stack, .-pinguard_on_stack",
);

#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl pinguard_on_stack",
    ".hidden pinguard_on_stack",
    ".type pinguard_on_stack,%function",
    // pinguard_on_stack(arg: x0, f: x1, top: x2): calls f(arg) with sp = top.
    "pinguard_on_stack:",
    ".cfi_startproc",
    "stp x29, x30, [sp, #-16]!",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset x29, -16",
    ".cfi_offset x30, -8",
    "mov x29, sp",
    ".cfi_def_cfa_register x29",
    "mov sp, x2",
    "blr x1",
    "mov sp, x29",
    ".cfi_def_cfa_register sp",
    "ldp x29, x30, [sp], #16",
    ".cfi_def_cfa_offset 0",
    ".cfi_restore x29",
    ".cfi_restore x30",
    "ret",
    ".cfi_endproc",
    ".size pinguard_on_stack, .-pinguard_on_stack",
);

extern "C" {
    fn pinguard_on_stack(arg: *mut c_void, f: unsafe extern "C" fn(*mut c_void), top: *mut u8);
}

/// What `run` hands the closure over the switch, and what comes back: its value, or its panic.
struct Call<F, R> {
    f: std::mem::ManuallyDrop<F>,
    out: std::mem::MaybeUninit<R>,
    panic: Option<Box<dyn std::any::Any + Send>>,
}

/// Runs on pinguard's stack: the closure, with any panic caught here (it resumes after the switch
/// back: no unwinding crosses the switch).
unsafe extern "C" fn enter<F: FnOnce() -> R, R>(p: *mut c_void) {
    // SAFETY: `p` is the `&mut Call<F, R>` `switch` passed to `pinguard_on_stack`, live and
    // unaliased until it returns; this is the only function that reads it meanwhile.
    let call = unsafe { &mut *(p as *mut Call<F, R>) };
    // SAFETY: `f` was initialised by `switch` and is taken exactly once, here.
    let f = unsafe { std::mem::ManuallyDrop::take(&mut call.f) };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => {
            call.out.write(r);
        }
        Err(e) => call.panic = Some(e),
    }
}

/// `enter` for a whole hooked call (`run_hook`): no `catch_unwind`, whose moves of the closure
/// cost more than the switch. A panic that reaches here aborts the process, as it would at the
/// hook's own `extern "C"` boundary without the switch.
unsafe extern "C" fn enter_hook<F: FnOnce() -> R, R>(p: *mut c_void) {
    // SAFETY: as in `enter`.
    let call = unsafe { &mut *(p as *mut Call<F, R>) };
    // SAFETY: as in `enter`.
    let f = unsafe { std::mem::ManuallyDrop::take(&mut call.f) };
    call.out.write(f());
}

/// Runs `f` on this thread's own stack: in place when already on it (work nested in work), when a
/// signal handler interrupted work there (its frames are below that work's), and where none could
/// be mapped (then `is_short` holds while `f` runs). A panic in `f` resumes after the switch back.
#[inline(always)]
pub fn run<F: FnOnce() -> R, R>(t: &Thread, f: F) -> R {
    if t.on_work.get() {
        return f();
    }
    switch(t, f, enter::<F, R>)
}

/// `run` for a hooked call's whole tracked path, whose panics are caught inside it (`quiet`):
/// one that escapes aborts, as at the hook's `extern "C"` boundary.
#[inline(always)]
pub fn run_hook<F: FnOnce() -> R, R>(t: &Thread, f: F) -> R {
    if t.on_work.get() {
        return f();
    }
    switch(t, f, enter_hook::<F, R>)
}

#[inline(never)]
fn switch<F: FnOnce() -> R, R>(t: &Thread, f: F, enter: unsafe extern "C" fn(*mut c_void)) -> R {
    let mut top = t.work.get();
    if top <= FAILED {
        top = match top {
            UNMAPPED => map(t),
            _ => FAILED,
        };
        if top == FAILED {
            return run_short(t, f);
        }
    }
    let mut call = Call {
        f: std::mem::ManuallyDrop::new(f),
        out: std::mem::MaybeUninit::uninit(),
        panic: None,
    };
    t.on_work.set(true);
    // SAFETY: `top` is the 16-byte aligned top of this thread's own mapped stack (`map`), which
    // nothing uses now (`on_work` was clear, and only this thread switches to it); `enter` is
    // `enter` or `enter_hook` for these `F` and `R` (`run` and `run_hook` name them), which
    // read `call` as the type passed here, live across the call.
    unsafe {
        pinguard_on_stack(
            &mut call as *mut Call<F, R> as *mut c_void,
            enter,
            top as *mut u8,
        )
    };
    t.on_work.set(false);
    if let Some(e) = call.panic {
        std::panic::resume_unwind(e);
    }
    // SAFETY: `enter` either wrote `out` or caught a panic, which was resumed just above.
    unsafe { call.out.assume_init() }
}

#[cold]
#[inline(never)]
fn run_short<R>(t: &Thread, f: impl FnOnce() -> R) -> R {
    SHORT.fetch_add(1, Ordering::Relaxed);
    let was = t.short.replace(true);
    struct Reset<'a>(&'a Thread, bool);
    impl Drop for Reset<'_> {
        fn drop(&mut self) {
            self.0.short.set(self.1);
        }
    }
    let _reset = Reset(t, was);
    f()
}

/// Whether work of this thread runs on the caller's stack now (no stack of its own).
#[inline]
pub fn is_short(t: &Thread) -> bool {
    t.short.get()
}

/// This thread's caches (`CACHES` zeroed bytes at first, 16-byte aligned, living as long as the
/// thread), mapped with its stack; `None` where that mapping failed.
pub fn caches(t: &Thread) -> Option<*mut u8> {
    let top = match t.work.get() {
        UNMAPPED => map(t),
        top => top,
    };
    (top != FAILED).then_some(top as *mut u8)
}

static KEY: std::sync::OnceLock<Option<libc::pthread_key_t>> = std::sync::OnceLock::new();

/// Unmaps a thread's stack when the thread ends.
unsafe extern "C" fn unmap(p: *mut c_void) {
    let t = crate::runtime::guard::here();
    if t.work.get() == p as usize + guard() + SIZE {
        t.work.set(UNMAPPED);
    }
    crate::runtime::own_maps::unmapped(p as usize, 0);
    // SAFETY: `p` is the base of the mapping `map` made for this thread (guard page and stack),
    // handed to this destructor once; the thread is ending, and runs no work on it now (key
    // destructors run outside any hooked call).
    unsafe { libc::syscall(libc::SYS_munmap, p, guard() + SIZE + CACHES) };
}

fn guard() -> usize {
    crate::runtime::sys::page_size()
}

/// Maps this thread's stack; its top, or `FAILED`.
#[cold]
#[inline(never)]
fn map(t: &Thread) -> usize {
    let len = guard() + SIZE + CACHES;
    // SAFETY: an anonymous private mapping at an address the kernel picks touches nothing else.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            crate::runtime::space::hint(len),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if p == -1 || p == 0 {
        t.work.set(FAILED);
        return FAILED;
    }
    // Not the program's to lock (`mlockall`); under `MCL_FUTURE` unlocked again at once.
    crate::runtime::own_maps::mapped(p as usize, len, true);
    // The guard page: running off the bottom faults here instead of writing over other memory.
    // SAFETY: the first page of the mapping just made, ours alone.
    unsafe { libc::syscall(libc::SYS_mprotect, p, guard(), libc::PROT_NONE) };
    let top = p as usize + guard() + SIZE;
    t.work.set(top);
    let key = KEY.get_or_init(|| {
        let mut key = 0;
        // SAFETY: `key` is a valid out-pointer; the destructor has the signature pthread wants.
        (unsafe { libc::pthread_key_create(&mut key, Some(unmap)) } == 0).then_some(key)
    });
    // glibc `calloc`s a second-level block for keys from 32 up: then the stack stays with the
    // ended thread's mapping rather than risk that inside a signal handler.
    if let Some(key) = key.filter(|&k| (k as usize) < crate::runtime::guard::PTHREAD_KEY_INLINE) {
        // SAFETY: a key of ours; the value is this thread's mapping.
        unsafe { libc::pthread_setspecific(key, p as *const c_void) };
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn sp() -> usize {
        let x = 0u8;
        std::hint::black_box(&x) as *const u8 as usize
    }

    #[test]
    fn work_runs_on_its_own_stack_and_returns_its_value() {
        let t = crate::runtime::guard::here();
        let outside = sp();
        let (inside, nested) = run(t, || (sp(), run(t, sp)));
        let top = t.work.get();
        assert!(top > FAILED);
        assert!(
            inside < top && inside > top - SIZE,
            "{inside:#x} not in the stack below {top:#x}"
        );
        assert!(outside >= top || outside < top - SIZE);
        // Nested work stays on the same stack, below the outer frame.
        assert!(nested < inside && nested > top - SIZE);
        assert!(!t.on_work.get());
    }

    #[test]
    fn without_a_stack_of_its_own_work_runs_in_place_and_is_counted() {
        std::thread::spawn(|| {
            let t = crate::runtime::guard::here();
            t.work.set(FAILED); // as after a refused mapping
            let before = short_count();
            let outside = sp();
            let (short, inside) = run(t, || (is_short(t), sp()));
            assert!(short);
            assert!(inside < outside && outside - inside < 4096, "ran in place");
            assert!(!is_short(t));
            assert!(short_count() > before);
            assert!(caches(t).is_none());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_panic_crosses_back_to_the_caller() {
        let t = crate::runtime::guard::here();
        let r = std::panic::catch_unwind(|| run(t, || -> u32 { panic!("inside") }));
        assert!(r.is_err());
        assert!(!t.on_work.get());
        assert_eq!(run(t, || 7), 7);
    }
}
