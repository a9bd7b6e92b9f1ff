//! libc's page locking: `mlock`, `mlock2`, `munlock`, `mlockall`, `munlockall`, and `mmap` /
//! `munmap` / `mremap` for what they lock, unlock and move. When libc's function cannot be found (an old glibc
//! without `mlock2`), the raw syscall stands in.
//!
//! `mmap` and `munmap` are the hottest calls in any process: their untracked path is one flag test
//! and a jump to the real function (`mremap` too: glibc's `realloc` calls its own).
//!
//! A pinning call (`mlock`, `mlock2`, `mlockall`, `mmap` with `MAP_LOCKED`) that arrives while
//! its thread is already inside pinguard (a signal handler that interrupted a hook) passes straight
//! through and is counted in `untracked_count`; the kernel's `VmLck` still sees its pages, and the
//! next comparison with the kernel takes them into the view.
//!
//! Unlike the runtimes' rows, these bodies enter the hook by hand (`hand_hooks!` has no family):
//! each does something of its own around the entry: a call that passes through is still counted
//! when nested (`nested`), `mlockall` keeps pinguard's mappings out even untracked, and `mmap`,
//! `munmap`, `mremap` test their flags and the locked view before they enter at all.

use super::hand_hooks;
use crate::accounting::ledger;
use crate::api::{Api, Family};
use crate::runtime::guard;
use crate::track::{Hook, MmapArgs};
use libc::{c_int, c_void, off_t, size_t};

fn sys_ret(r: libc::c_long) -> c_int {
    r as c_int
}

/// A closure making the C caller's call: libc's function of that name, or, where libc has none
/// (an old glibc without `mlock2`), the system call it wraps.
macro_rules! real_or_syscall {
    ($name:ident($($a:expr),*), $sys:expr) => {
        || match $name::get() {
            // SAFETY: `f` is libc's function of this name, given the C caller's arguments under
            // its contract.
            Some(f) => unsafe { f($($a),*) },
            // SAFETY: the system call the function wraps, with the same arguments.
            None => sys_ret(unsafe { libc::syscall($sys $(, $a)*) }),
        }
    };
}

#[inline]
fn nested() {
    let t = guard::here();
    if t.is_inside() {
        if t.locking.get() {
            ledger::count_untracked();
        } else {
            ledger::note_runtime_lock();
        }
    }
}

unsafe fn lock(addr: *const c_void, len: size_t) -> c_int {
    let real = real_or_syscall!(mlock(addr, len), libc::SYS_mlock);
    match Hook::enter(Family::Mlock) {
        None => {
            nested();
            real()
        }
        Some(h) => h.lock_call(|h| h.lock_range(Api::Mlock, addr as usize, len, 0, real)),
    }
}

unsafe fn lock2(addr: *const c_void, len: size_t, flags: c_int) -> c_int {
    let real = real_or_syscall!(mlock2(addr, len, flags), libc::SYS_mlock2);
    match Hook::enter(Family::Mlock) {
        None => {
            nested();
            real()
        }
        Some(h) => h.lock_call(|h| h.lock_range(Api::Mlock2, addr as usize, len, flags, real)),
    }
}

unsafe fn unlock(addr: *const c_void, len: size_t) -> c_int {
    let real = real_or_syscall!(munlock(addr, len), libc::SYS_munlock);
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => {
            h.lock_call(|h| h.unlock_range(Api::Munlock, addr as usize, len, real, |rc| *rc == 0))
        }
    }
}

unsafe fn lock_all(flags: c_int) -> c_int {
    let real = real_or_syscall!(mlockall(flags), libc::SYS_mlockall);
    // pinguard's own mappings stay out of it (`own_maps`), tracked or not; but not from a signal
    // handler that interrupted pinguard's own work (leaving them out allocates).
    match Hook::enter(Family::Mlock) {
        None if guard::here().is_inside() => {
            nested();
            real()
        }
        None => crate::runtime::own_maps::mlockall(flags, real),
        Some(h) => h.lock_call_own_stack(|h| {
            h.mlockall(flags, || crate::runtime::own_maps::mlockall(flags, real))
        }),
    }
}

unsafe fn unlock_all() -> c_int {
    let real = real_or_syscall!(munlockall(), libc::SYS_munlockall);
    let real = || {
        let rc = real();
        if rc == 0 {
            crate::runtime::own_maps::unlocked_all();
        }
        rc
    };
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.lock_call_own_stack(|h| h.munlockall(real)),
    }
}

unsafe fn real_mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    match mmap::get() {
        // SAFETY: `f` is libc's `mmap`, given our caller's arguments under its contract.
        Some(f) => unsafe { f(addr, len, prot, flags, fd, off) },
        None => {
            // glibc's syscall() returns -1 and sets errno on failure.
            // SAFETY: the system call `mmap` wraps, with the same arguments.
            match unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) } {
                -1 => libc::MAP_FAILED,
                r => r as *mut c_void,
            }
        }
    }
}

/// The untracked path, the one nearly every call takes: two flag tests and a jump to libc's
/// function, with no stack frame of its own (the rest is out of line in `mmap_tracked`).
#[inline(always)]
unsafe fn mmap_hooked(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    let locking = flags & libc::MAP_LOCKED != 0;
    let replacing = flags & libc::MAP_FIXED != 0 && ledger::locked_any();
    if !locking && !replacing {
        if let Some(f) = mmap::get() {
            // SAFETY: `f` is libc's `mmap`, given our caller's arguments under its contract.
            return unsafe { f(addr, len, prot, flags, fd, off) };
        }
    }
    // SAFETY: our caller's arguments, under `mmap`'s contract, as `mmap_tracked` requires.
    unsafe { mmap_tracked(addr, len, prot, flags, fd, off) }
}

#[inline(never)]
unsafe fn mmap_tracked(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    let locking_flag = flags & libc::MAP_LOCKED != 0;
    let replacing = flags & libc::MAP_FIXED != 0 && ledger::locked_any();
    if !locking_flag && !replacing {
        // SAFETY: our caller's arguments, under `mmap`'s contract.
        return unsafe { real_mmap(addr, len, prot, flags, fd, off) };
    }
    match Hook::enter(Family::Mlock) {
        None => {
            if locking_flag {
                nested();
            }
            // SAFETY: our caller's arguments, under `mmap`'s contract.
            unsafe { real_mmap(addr, len, prot, flags, fd, off) }
        }
        // SAFETY: our caller's arguments, under `mmap`'s contract; the hook passes its flags, at
        // most without MAP_LOCKED, which changes no mapping.
        Some(h) if locking_flag => {
            let m = MmapArgs {
                addr: addr as usize,
                len,
                prot,
                flags,
                fd,
                off,
            };
            h.lock_call_own_stack(|h| {
                // SAFETY: as above.
                h.mmap_locked(m, |fl| unsafe { real_mmap(addr, len, prot, fl, fd, off) })
            })
        }
        Some(h) => h.lock_call(|h| {
            // SAFETY: our caller's arguments, under `mmap`'s contract.
            h.unlock_range(
                Api::Mmap,
                addr as usize,
                len,
                || unsafe { real_mmap(addr, len, prot, flags, fd, off) },
                |p| *p != libc::MAP_FAILED,
            )
        }),
    }
}

/// Like `mmap`'s: while nothing is locked, a jump to libc's function.
#[inline(always)]
unsafe fn munmap_hooked(addr: *mut c_void, len: size_t) -> c_int {
    if !ledger::locked_any() {
        if let Some(f) = munmap::get() {
            // SAFETY: `f` is libc's `munmap`, given the C caller's arguments under its contract.
            return unsafe { f(addr, len) };
        }
    }
    // SAFETY: the C caller's arguments, under `munmap`'s contract.
    unsafe { munmap_tracked(addr, len) }
}

#[inline(never)]
unsafe fn munmap_tracked(addr: *mut c_void, len: size_t) -> c_int {
    let real = real_or_syscall!(munmap(addr, len), libc::SYS_munmap);
    if !ledger::locked_any() {
        return real();
    }
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => {
            h.lock_call(|h| h.unlock_range(Api::Munmap, addr as usize, len, real, |rc| *rc == 0))
        }
    }
}

unsafe fn real_mremap(
    old: *mut c_void,
    old_size: size_t,
    new_size: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    match mremap::get() {
        // SAFETY: `f` is libc's `mremap`, given our caller's arguments under its contract.
        Some(f) => unsafe { f(old, old_size, new_size, flags, new_addr) },
        // SAFETY: the system call `mremap` wraps, with the same arguments.
        None => match unsafe {
            libc::syscall(libc::SYS_mremap, old, old_size, new_size, flags, new_addr)
        } {
            -1 => libc::MAP_FAILED,
            r => r as *mut c_void,
        },
    }
}

/// Like `mmap`'s: while nothing is locked, a jump to libc's function (glibc's `realloc` calls
/// its own `mremap`, so this one is hot too).
#[inline(always)]
unsafe fn mremap_hooked(
    old: *mut c_void,
    old_size: size_t,
    new_size: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    if !ledger::locked_any() {
        if let Some(f) = mremap::get() {
            // SAFETY: `f` is libc's `mremap`, given the C caller's arguments under its contract.
            return unsafe { f(old, old_size, new_size, flags, new_addr) };
        }
    }
    // SAFETY: the C caller's arguments, under `mremap`'s contract.
    unsafe { mremap_tracked(old, old_size, new_size, flags, new_addr) }
}

#[inline(never)]
unsafe fn mremap_tracked(
    old: *mut c_void,
    old_size: size_t,
    new_size: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: our caller's arguments, under `mremap`'s contract.
    let real = || unsafe { real_mremap(old, old_size, new_size, flags, new_addr) };
    if !ledger::locked_any() {
        return real();
    }
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.lock_call_own_stack(|h| {
            h.mremap(
                old as usize,
                old_size,
                new_size,
                flags,
                new_addr as usize,
                real,
            )
        }),
    }
}

hand_hooks! {
    /// Locks the pages of a range.
    fn mlock(addr: *const c_void, len: size_t) -> c_int => lock;
    /// The same, `MLOCK_ONFAULT` in `flags` locking pages as they fault in.
    fn mlock2(addr: *const c_void, len: size_t, flags: c_int) -> c_int => lock2;
    /// Unlocks the pages of a range.
    fn munlock(addr: *const c_void, len: size_t) -> c_int => unlock;
    /// Locks every mapped page, or (`MCL_FUTURE`) every page to come.
    fn mlockall(flags: c_int) -> c_int => lock_all;
    /// Unlocks every page.
    fn munlockall() -> c_int => unlock_all;
    /// A mapping, locked with `MAP_LOCKED`; over locked pages with `MAP_FIXED`.
    fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void => mmap_hooked;
    /// On 64-bit glibc `mmap` under a second name (programs built with `_FILE_OFFSET_BITS=64`
    /// or calling it by name): handled as `mmap`, forwarded to libc's `mmap`.
    fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void => mmap_hooked;
    /// The pages of a range go, locked ones with them.
    fn munmap(addr: *mut c_void, len: size_t) -> c_int => munmap_hooked;
    /// `mremap(old, old_size, new_size, flags, ... /* new_address */)`. C declares it variadic;
    /// on the ABIs pinguard supports (x86-64 System V, AArch64 AAPCS64 on Linux) a variadic
    /// pointer argument travels in the same register as a fixed fifth one, so the fifth
    /// parameter reads `new_address` when the caller passed it and is ignored, as by the kernel,
    /// when MREMAP_FIXED is not set. The real function is called as the variadic function it is.
    fn mremap(old: *mut c_void, old_size: size_t, new_size: size_t, flags: c_int, new_addr: *mut c_void) -> *mut c_void,
        real unsafe extern "C" fn(*mut c_void, size_t, size_t, c_int, ...) -> *mut c_void => mremap_hooked;
}
