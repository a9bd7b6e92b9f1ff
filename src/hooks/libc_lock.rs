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

use super::real;
use crate::api::{Api, Family};
use crate::runtime::guard;
use crate::accounting::ledger;
use crate::track::{Hook, MmapArgs};
use libc::{c_int, c_void, off_t, size_t};

type LockFn = unsafe extern "C" fn(*const c_void, size_t) -> c_int;
type Lock2Fn = unsafe extern "C" fn(*const c_void, size_t, c_int) -> c_int;
type AllFn = unsafe extern "C" fn(c_int) -> c_int;
type NoneFn = unsafe extern "C" fn() -> c_int;
type MmapFn = unsafe extern "C" fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;
type MunmapFn = unsafe extern "C" fn(*mut c_void, size_t) -> c_int;
type MremapFn = unsafe extern "C" fn(*mut c_void, size_t, size_t, c_int, ...) -> *mut c_void;

fn sys_ret(r: libc::c_long) -> c_int {
    r as c_int
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

#[no_mangle]
pub unsafe extern "C" fn mlock(addr: *const c_void, len: size_t) -> c_int {
    // SAFETY: `LockFn` is the C type of `mlock`.
    let real = || match unsafe { real!("mlock").get::<LockFn>() } {
        // SAFETY: `f` is libc's `mlock`, given the C caller's arguments under its contract.
        Some(f) => unsafe { f(addr, len) },
        // SAFETY: the system call `mlock` wraps, with the same arguments.
        None => sys_ret(unsafe { libc::syscall(libc::SYS_mlock, addr, len) }),
    };
    match Hook::enter(Family::Mlock) {
        None => {
            nested();
            real()
        }
        Some(h) => h.lock_call(|h| h.lock_range(Api::Mlock, addr as usize, len, 0, real)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlock2(addr: *const c_void, len: size_t, flags: c_int) -> c_int {
    // SAFETY: `Lock2Fn` is the C type of `mlock2`.
    let real = || match unsafe { real!("mlock2").get::<Lock2Fn>() } {
        // SAFETY: `f` is libc's `mlock2`, given the C caller's arguments under its contract.
        Some(f) => unsafe { f(addr, len, flags) },
        // SAFETY: the system call `mlock2` wraps, with the same arguments.
        None => sys_ret(unsafe { libc::syscall(libc::SYS_mlock2, addr, len, flags) }),
    };
    match Hook::enter(Family::Mlock) {
        None => {
            nested();
            real()
        }
        Some(h) => h.lock_call(|h| h.lock_range(Api::Mlock2, addr as usize, len, flags, real)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn munlock(addr: *const c_void, len: size_t) -> c_int {
    // SAFETY: `LockFn` is the C type of `munlock`.
    let real = || match unsafe { real!("munlock").get::<LockFn>() } {
        // SAFETY: `f` is libc's `munlock`, given the C caller's arguments under its contract.
        Some(f) => unsafe { f(addr, len) },
        // SAFETY: the system call `munlock` wraps, with the same arguments.
        None => sys_ret(unsafe { libc::syscall(libc::SYS_munlock, addr, len) }),
    };
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.lock_call(|h| h.unlock_range(Api::Munlock, addr as usize, len, real, |rc| *rc == 0)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlockall(flags: c_int) -> c_int {
    // SAFETY: `AllFn` is the C type of `mlockall`.
    let real = || match unsafe { real!("mlockall").get::<AllFn>() } {
        // SAFETY: `f` is libc's `mlockall`, given the C caller's arguments under its contract.
        Some(f) => unsafe { f(flags) },
        // SAFETY: the system call `mlockall` wraps, with the same arguments.
        None => sys_ret(unsafe { libc::syscall(libc::SYS_mlockall, flags) }),
    };
    match Hook::enter(Family::Mlock) {
        None => {
            nested();
            real()
        }
        Some(h) => h.lock_call_own_stack(|h| h.mlockall(flags, real)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn munlockall() -> c_int {
    // SAFETY: `NoneFn` is the C type of `munlockall`.
    let real = || match unsafe { real!("munlockall").get::<NoneFn>() } {
        // SAFETY: `f` is libc's `munlockall`, given the C caller's arguments under its contract.
        Some(f) => unsafe { f() },
        // SAFETY: the system call `munlockall` wraps, with the same arguments.
        None => sys_ret(unsafe { libc::syscall(libc::SYS_munlockall) }),
    };
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.lock_call_own_stack(|h| h.munlockall(real)),
    }
}

unsafe fn real_mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    // SAFETY: `MmapFn` is the C type of `mmap`.
    match unsafe { real!("mmap").get::<MmapFn>() } {
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
unsafe fn mmap_hooked(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    let locking = flags & libc::MAP_LOCKED != 0;
    let replacing = flags & libc::MAP_FIXED != 0 && ledger::locked_any();
    if !locking && !replacing {
        // SAFETY: `MmapFn` is the C type of `mmap`.
        if let Some(f) = unsafe { real!("mmap").get::<MmapFn>() } {
            // SAFETY: `f` is libc's `mmap`, given our caller's arguments under its contract.
            return unsafe { f(addr, len, prot, flags, fd, off) };
        }
    }
    // SAFETY: our caller's arguments, under `mmap`'s contract, as `mmap_tracked` requires.
    unsafe { mmap_tracked(addr, len, prot, flags, fd, off) }
}

#[inline(never)]
unsafe fn mmap_tracked(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
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
            let m = MmapArgs { addr: addr as usize, len, prot, flags, fd, off };
            // SAFETY: as above.
            h.lock_call_own_stack(|h| h.mmap_locked(m, |fl| unsafe { real_mmap(addr, len, prot, fl, fd, off) }))
        }
        Some(h) => h.lock_call(|h| {
            // SAFETY: our caller's arguments, under `mmap`'s contract.
            h.unlock_range(Api::Mmap, addr as usize, len, || unsafe { real_mmap(addr, len, prot, flags, fd, off) }, |p| *p != libc::MAP_FAILED)
        }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    // SAFETY: the C caller's arguments, under `mmap`'s contract.
    unsafe { mmap_hooked(addr, len, prot, flags, fd, off) }
}

/// On 64-bit glibc `mmap64` is the same function under a second name; programs built with
/// `_FILE_OFFSET_BITS=64` or calling it by name arrive here.
#[no_mangle]
pub unsafe extern "C" fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    // SAFETY: the C caller's arguments, under `mmap`'s contract.
    unsafe { mmap_hooked(addr, len, prot, flags, fd, off) }
}

/// Like `mmap`: while nothing is locked, a jump to libc's function.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    if !ledger::locked_any() {
        // SAFETY: `MunmapFn` is the C type of `munmap`.
        if let Some(f) = unsafe { real!("munmap").get::<MunmapFn>() } {
            // SAFETY: `f` is libc's `munmap`, given the C caller's arguments under its contract.
            return unsafe { f(addr, len) };
        }
    }
    // SAFETY: the C caller's arguments, under `munmap`'s contract.
    unsafe { munmap_tracked(addr, len) }
}

#[inline(never)]
unsafe fn munmap_tracked(addr: *mut c_void, len: size_t) -> c_int {
    // SAFETY: `MunmapFn` is the C type of `munmap`.
    let real = || match unsafe { real!("munmap").get::<MunmapFn>() } {
        // SAFETY: `f` is libc's `munmap`, given the C caller's arguments under its contract.
        Some(f) => unsafe { f(addr, len) },
        // SAFETY: the system call `munmap` wraps, with the same arguments.
        None => sys_ret(unsafe { libc::syscall(libc::SYS_munmap, addr, len) }),
    };
    if !ledger::locked_any() {
        return real();
    }
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.lock_call(|h| h.unlock_range(Api::Munmap, addr as usize, len, real, |rc| *rc == 0)),
    }
}

unsafe fn real_mremap(old: *mut c_void, old_size: size_t, new_size: size_t, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
    // SAFETY: `MremapFn` is the C type of `mremap`.
    match unsafe { real!("mremap").get::<MremapFn>() } {
        // SAFETY: `f` is libc's `mremap`, given our caller's arguments under its contract.
        Some(f) => unsafe { f(old, old_size, new_size, flags, new_addr) },
        // SAFETY: the system call `mremap` wraps, with the same arguments.
        None => match unsafe { libc::syscall(libc::SYS_mremap, old, old_size, new_size, flags, new_addr) } {
            -1 => libc::MAP_FAILED,
            r => r as *mut c_void,
        },
    }
}

/// `mremap(old, old_size, new_size, flags, ... /* new_address */)`. C declares it variadic; on
/// the ABIs pinguard supports (x86-64 System V, AArch64 AAPCS64 on Linux) a variadic pointer
/// argument travels in the same register as a fixed fifth one, so the fifth parameter reads
/// `new_address` when the caller passed it and is ignored, as by the kernel, when MREMAP_FIXED is
/// not set. The real function is called as the variadic function it is.
#[no_mangle]
pub unsafe extern "C" fn mremap(old: *mut c_void, old_size: size_t, new_size: size_t, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
    if !ledger::locked_any() {
        // SAFETY: `MremapFn` is the C type of `mremap`.
        if let Some(f) = unsafe { real!("mremap").get::<MremapFn>() } {
            // SAFETY: `f` is libc's `mremap`, given the C caller's arguments under its contract.
            return unsafe { f(old, old_size, new_size, flags, new_addr) };
        }
    }
    // SAFETY: the C caller's arguments, under `mremap`'s contract.
    unsafe { mremap_tracked(old, old_size, new_size, flags, new_addr) }
}

#[inline(never)]
unsafe fn mremap_tracked(old: *mut c_void, old_size: size_t, new_size: size_t, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
    // SAFETY: our caller's arguments, under `mremap`'s contract.
    let real = || unsafe { real_mremap(old, old_size, new_size, flags, new_addr) };
    if !ledger::locked_any() {
        return real();
    }
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.lock_call_own_stack(|h| h.mremap(old as usize, old_size, new_size, flags, new_addr as usize, real)),
    }
}

/// `dlsym(libc_handle, "mlock")` and friends: pinguard's own export when the loader found the same
/// function pinguard forwards to.
pub fn redirect(name: &std::ffi::CStr, real: usize) -> Option<Option<usize>> {
    let (ours, by_name): (usize, Option<usize>) = match name.to_bytes() {
        b"mlock" => (mlock as *const () as usize, real!("mlock").addr()),
        b"mlock2" => (mlock2 as *const () as usize, real!("mlock2").addr()),
        b"munlock" => (munlock as *const () as usize, real!("munlock").addr()),
        b"mlockall" => (mlockall as *const () as usize, real!("mlockall").addr()),
        b"munlockall" => (munlockall as *const () as usize, real!("munlockall").addr()),
        b"mmap" | b"mmap64" => (mmap as *const () as usize, real!("mmap").addr()),
        b"munmap" => (munmap as *const () as usize, real!("munmap").addr()),
        b"mremap" => (mremap as *const () as usize, real!("mremap").addr()),
        _ => return None,
    };
    Some((by_name == Some(real)).then_some(ours))
}
