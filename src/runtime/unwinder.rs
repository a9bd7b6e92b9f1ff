//! The unwinder, found at run time: the library imports no `_Unwind_*` symbol and names no
//! `libgcc_s.so.1`, which a musl process cannot provide (a musl loader fails the whole program
//! over either; docs/internals.md, "musl processes"). Hidden definitions of the `_Unwind_*`
//! functions std and pinguard call jump through a table that `load` fills with glibc's
//! `libgcc_s.so.1`, the copy glibc itself loads to unwind a cancelled thread: a cancellation
//! that unwinds through a hook then runs pinguard's personality routine with a context of the
//! same unwinder (a second, static copy aborted there). Until then, and where no `libgcc_s` can
//! be loaded, each entry is a stand-in that fails: a panic aborts, a walk finds no frame.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

/// The functions, in the table's order (the assembly below indexes it).
const NAMES: [&CStr; 12] = [
    c"_Unwind_RaiseException",
    c"_Unwind_Resume",
    c"_Unwind_DeleteException",
    c"_Unwind_Backtrace",
    c"_Unwind_GetIP",
    c"_Unwind_GetIPInfo",
    c"_Unwind_GetLanguageSpecificData",
    c"_Unwind_GetRegionStart",
    c"_Unwind_GetTextRelBase",
    c"_Unwind_GetDataRelBase",
    c"_Unwind_SetGR",
    c"_Unwind_SetIP",
];

/// `_URC_END_OF_STACK`: what an unwinder answers when it found no handler or no frame.
const END_OF_STACK: c_int = 5;

extern "C" fn fail_raise(_exception: *mut c_void) -> c_int {
    END_OF_STACK
}
extern "C" fn fail_resume(_exception: *mut c_void) {
    std::process::abort()
}
extern "C" fn nothing(_exception: *mut c_void) {}
extern "C" fn fail_backtrace(_f: *mut c_void, _arg: *mut c_void) -> c_int {
    END_OF_STACK
}
extern "C" fn zero(_context: *mut c_void) -> usize {
    0
}
extern "C" fn zero_info(_context: *mut c_void, _before: *mut c_int) -> usize {
    0
}
extern "C" fn set_nothing(_context: *mut c_void, _i: c_int, _v: usize) {}
extern "C" fn set_ip_nothing(_context: *mut c_void, _v: usize) {}

/// Read by the assembly below: the function each entry jumps to.
static TABLE: [AtomicPtr<()>; 12] = [
    AtomicPtr::new(fail_raise as *mut ()),
    AtomicPtr::new(fail_resume as *mut ()),
    AtomicPtr::new(nothing as *mut ()),
    AtomicPtr::new(fail_backtrace as *mut ()),
    AtomicPtr::new(zero as *mut ()),
    AtomicPtr::new(zero_info as *mut ()),
    AtomicPtr::new(zero as *mut ()),
    AtomicPtr::new(zero as *mut ()),
    AtomicPtr::new(zero as *mut ()),
    AtomicPtr::new(zero as *mut ()),
    AtomicPtr::new(set_nothing as *mut ()),
    AtomicPtr::new(set_ip_nothing as *mut ()),
];

/// One hidden entry: `name` jumps to `TABLE[index]`, all registers as its caller left them.
#[cfg(all(target_arch = "x86_64", not(pinguard_static_unwinder)))]
macro_rules! entries {
    ($($name:literal $i:literal),*) => {
        core::arch::global_asm!(
            $(
                concat!(".globl ", $name),
                concat!(".hidden ", $name),
                concat!(".type ", $name, ", @function"),
                concat!($name, ":"),
                concat!("jmp qword ptr [rip + {table} + ", $i, " * 8]"),
            )*
            table = sym TABLE,
        );
    };
}
#[cfg(all(target_arch = "aarch64", not(pinguard_static_unwinder)))]
macro_rules! entries {
    ($($name:literal $i:literal),*) => {
        core::arch::global_asm!(
            $(
                concat!(".globl ", $name),
                concat!(".hidden ", $name),
                concat!(".type ", $name, ", %function"),
                concat!($name, ":"),
                concat!("adrp x16, {table} + ", $i, " * 8"),
                concat!("ldr x16, [x16, :lo12:{table} + ", $i, " * 8]"),
                "br x16",
            )*
            table = sym TABLE,
        );
    };
}
// A build linked with its own unwinder (zig's, `build.rs`) has the real functions: no entries.
#[cfg(pinguard_static_unwinder)]
macro_rules! entries {
    ($($name:literal $i:literal),*) => {};
}
entries!(
    "_Unwind_RaiseException" 0,
    "_Unwind_Resume" 1,
    "_Unwind_DeleteException" 2,
    "_Unwind_Backtrace" 3,
    "_Unwind_GetIP" 4,
    "_Unwind_GetIPInfo" 5,
    "_Unwind_GetLanguageSpecificData" 6,
    "_Unwind_GetRegionStart" 7,
    "_Unwind_GetTextRelBase" 8,
    "_Unwind_GetDataRelBase" 9,
    "_Unwind_SetGR" 10,
    "_Unwind_SetIP" 11
);

/// Whether `load` has pointed the table at an unwinder.
pub fn ready() -> bool {
    cfg!(pinguard_static_unwinder) || TABLE[3].load(Ordering::Acquire) != fail_backtrace as *mut ()
}

/// Loads glibc's `libgcc_s.so.1` (or takes it where it is loaded already) and points the table at
/// it: once, at start-up, before pinguard does anything that could unwind. Whether the process
/// has an unwinder now; without one pinguard must not run (a panic could not be caught).
pub fn load() -> bool {
    if cfg!(pinguard_static_unwinder) {
        return true;
    }
    // Loaded for pinguard alone unless the process had it already: then it stays out of the
    // program's `mlockall` (`own_maps`).
    // SAFETY: a NUL-terminated literal name; RTLD_NOLOAD loads nothing.
    let had = unsafe {
        libc::dlopen(
            c"libgcc_s.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NOLOAD,
        )
    };
    if had.is_null() {
        // SAFETY: dlerror has no preconditions; it clears this thread's pending loader error.
        unsafe { libc::dlerror() };
    } else {
        // SAFETY: the handle RTLD_NOLOAD just took, given back (the object stays loaded).
        unsafe { libc::dlclose(had) };
    }
    // SAFETY: a NUL-terminated literal name; the handle is kept for the process's life.
    let h = unsafe { libc::dlopen(c"libgcc_s.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror has no preconditions; it clears this thread's pending loader error.
        unsafe { libc::dlerror() };
        return false;
    }
    let found: Vec<usize> = NAMES
        .iter()
        .map(|n| crate::runtime::dl::real_dlsym(h, n) as usize)
        .collect();
    if found.contains(&0) {
        return false;
    }
    for (slot, f) in TABLE.iter().zip(found) {
        slot.store(f as *mut (), Ordering::Release);
    }
    if had.is_null() {
        crate::runtime::own_maps::loaded_for_own(b"libgcc_s.so.1");
        give_back_loader_heap();
    }
    true
}

/// The loader's allocations for the object just loaded may have been this process's first
/// `malloc`: glibc then grew the heap by its 128 KiB top pad, which an `mlockall` of the
/// program's would lock and charge to its limit (issue 44, item 6). `malloc_trim` gives the
/// unused top back; found at run time, as glibc's alone.
fn give_back_loader_heap() {
    let f = crate::runtime::dl::real_dlsym(libc::RTLD_DEFAULT, c"malloc_trim");
    if !f.is_null() {
        // SAFETY: glibc's `int malloc_trim(size_t pad)`, called with its argument.
        let trim: extern "C" fn(usize) -> c_int = unsafe { std::mem::transmute(f) };
        trim(0);
    }
}
