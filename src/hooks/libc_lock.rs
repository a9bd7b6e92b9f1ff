//! libc's page locking: `mlock`, `mlock2`, `munlock`, `mlockall`, `munlockall`, and `mmap` /
//! `munmap` for what they lock and unlock. When libc's function cannot be found (an old glibc
//! without `mlock2`), the raw syscall stands in.
//!
//! `mmap` and `munmap` are the hottest calls in any process: their untracked path is one flag test
//! and a jump to the real function.

use super::real;
use crate::api::{Api, Family};
use crate::ledger;
use crate::track::Hook;
use libc::{c_int, c_void, off_t, size_t};

type LockFn = unsafe extern "C" fn(*const c_void, size_t) -> c_int;
type Lock2Fn = unsafe extern "C" fn(*const c_void, size_t, c_int) -> c_int;
type AllFn = unsafe extern "C" fn(c_int) -> c_int;
type NoneFn = unsafe extern "C" fn() -> c_int;
type MmapFn = unsafe extern "C" fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;
type MunmapFn = unsafe extern "C" fn(*mut c_void, size_t) -> c_int;

fn sys_ret(r: libc::c_long) -> c_int {
    r as c_int
}

#[no_mangle]
pub unsafe extern "C" fn mlock(addr: *const c_void, len: size_t) -> c_int {
    let real = || match real!("mlock").get::<LockFn>() {
        Some(f) => f(addr, len),
        None => sys_ret(libc::syscall(libc::SYS_mlock, addr, len)),
    };
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.lock_range(Api::Mlock, addr as usize, len, real),
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlock2(addr: *const c_void, len: size_t, flags: c_int) -> c_int {
    let real = || match real!("mlock2").get::<Lock2Fn>() {
        Some(f) => f(addr, len, flags),
        None => sys_ret(libc::syscall(libc::SYS_mlock2, addr, len, flags)),
    };
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.lock_range(Api::Mlock2, addr as usize, len, real),
    }
}

#[no_mangle]
pub unsafe extern "C" fn munlock(addr: *const c_void, len: size_t) -> c_int {
    let real = || match real!("munlock").get::<LockFn>() {
        Some(f) => f(addr, len),
        None => sys_ret(libc::syscall(libc::SYS_munlock, addr, len)),
    };
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.unlock_range(Api::Munlock, addr as usize, len, real, |rc| *rc == 0),
    }
}

#[no_mangle]
pub unsafe extern "C" fn mlockall(flags: c_int) -> c_int {
    let real = || match real!("mlockall").get::<AllFn>() {
        Some(f) => f(flags),
        None => sys_ret(libc::syscall(libc::SYS_mlockall, flags)),
    };
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.mlockall(flags, real),
    }
}

#[no_mangle]
pub unsafe extern "C" fn munlockall() -> c_int {
    let real = || match real!("munlockall").get::<NoneFn>() {
        Some(f) => f(),
        None => sys_ret(libc::syscall(libc::SYS_munlockall)),
    };
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.munlockall(real),
    }
}

unsafe fn real_mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    match real!("mmap").get::<MmapFn>() {
        Some(f) => f(addr, len, prot, flags, fd, off),
        None => {
            // glibc's syscall() returns -1 and sets errno on failure.
            match libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) {
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
        if let Some(f) = real!("mmap").get::<MmapFn>() {
            return f(addr, len, prot, flags, fd, off);
        }
    }
    mmap_tracked(addr, len, prot, flags, fd, off)
}

#[inline(never)]
unsafe fn mmap_tracked(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    let locking = flags & libc::MAP_LOCKED != 0;
    let replacing = flags & libc::MAP_FIXED != 0 && ledger::locked_any();
    if !locking && !replacing {
        return real_mmap(addr, len, prot, flags, fd, off);
    }
    match Hook::enter(Family::Mlock) {
        None => real_mmap(addr, len, prot, flags, fd, off),
        Some(h) if locking => h.mmap_locked(addr as usize, len, flags, |fl| real_mmap(addr, len, prot, fl, fd, off)),
        Some(h) => h.unlock_range(Api::Mmap, addr as usize, len, || real_mmap(addr, len, prot, flags, fd, off), |p| {
            *p != libc::MAP_FAILED
        }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    mmap_hooked(addr, len, prot, flags, fd, off)
}

/// On 64-bit glibc `mmap64` is the same function under a second name; programs built with
/// `_FILE_OFFSET_BITS=64` or calling it by name arrive here.
#[no_mangle]
pub unsafe extern "C" fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    mmap_hooked(addr, len, prot, flags, fd, off)
}

/// Like `mmap`: while nothing is locked, a jump to libc's function.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    if !ledger::locked_any() {
        if let Some(f) = real!("munmap").get::<MunmapFn>() {
            return f(addr, len);
        }
    }
    munmap_tracked(addr, len)
}

#[inline(never)]
unsafe fn munmap_tracked(addr: *mut c_void, len: size_t) -> c_int {
    let real = || match real!("munmap").get::<MunmapFn>() {
        Some(f) => f(addr, len),
        None => sys_ret(libc::syscall(libc::SYS_munmap, addr, len)),
    };
    if !ledger::locked_any() {
        return real();
    }
    match Hook::enter(Family::Mlock) {
        None => real(),
        Some(h) => h.unlock_range(Api::Munmap, addr as usize, len, real, |rc| *rc == 0),
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
        _ => return None,
    };
    Some((by_name == Some(real)).then_some(ours))
}
