//! `dlsym` and `dlvsym`, narrowly: a look-up through an explicit handle of one of the names pinguard
//! hooks (torch_npu's `dlsym(libascendcl, "aclrtMallocHostWithCfg")`, libcudart's
//! `dlsym(libcuda, "cuGetProcAddress_v2")`) gets pinguard's wrapper around what the loader found.
//! Every other look-up, and every `RTLD_NEXT` or `RTLD_DEFAULT` one (whose answer the global scope
//! already routes to pinguard's exports), is the loader's own answer.
//!
//! glibc answers `RTLD_NEXT` (and picks the namespace for `RTLD_DEFAULT`) by its caller's return
//! address, so the exported symbols are trampolines: they save the argument registers, ask
//! `answer`, and when it has nothing to say restore the registers and *jump* to the real function,
//! which then sees the original caller. docs/field-notes.md, "Interposing `dlsym`".

use super::hand_hooks;
use crate::api::Family;
use crate::hooks::{acl, cuda_driver, cuda_runtime, hal, hip, ibverbs, libc_lock};
use crate::runtime::dl;
use std::ffi::{c_char, c_void, CStr};

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        ".cfi_startproc",
        "endbr64",
        "push rdi",
        ".cfi_adjust_cfa_offset 8",
        "push rsi",
        ".cfi_adjust_cfa_offset 8",
        // Keeps the stack 16-byte aligned across the call.
        "sub rsp, 8",
        ".cfi_adjust_cfa_offset 8",
        "mov rdx, [rsp + 24]",
        "call {answer}",
        "add rsp, 8",
        ".cfi_adjust_cfa_offset -8",
        "pop rsi",
        ".cfi_adjust_cfa_offset -8",
        "pop rdi",
        ".cfi_adjust_cfa_offset -8",
        "test rax, rax",
        "jnz 2f",
        "jmp qword ptr [rip + {real}]",
        "2:",
        "ret",
        ".cfi_endproc",
        answer = sym dlsym_answer,
        real = sym dl::REAL_DLSYM,
    )
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    core::arch::naked_asm!(
        ".cfi_startproc",
        "endbr64",
        "push rdi",
        ".cfi_adjust_cfa_offset 8",
        "push rsi",
        ".cfi_adjust_cfa_offset 8",
        "push rdx",
        ".cfi_adjust_cfa_offset 8",
        "mov rcx, [rsp + 24]",
        "call {answer}",
        "pop rdx",
        ".cfi_adjust_cfa_offset -8",
        "pop rsi",
        ".cfi_adjust_cfa_offset -8",
        "pop rdi",
        ".cfi_adjust_cfa_offset -8",
        "test rax, rax",
        "jnz 2f",
        "jmp qword ptr [rip + {real}]",
        "2:",
        "ret",
        ".cfi_endproc",
        answer = sym dlvsym_answer,
        real = sym dl::REAL_DLVSYM,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        ".cfi_startproc",
        "hint #34", // bti c
        "stp x29, x30, [sp, #-32]!",
        ".cfi_def_cfa_offset 32",
        ".cfi_offset x29, -32",
        ".cfi_offset x30, -24",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "mov x2, x30",
        "bl {answer}",
        "cbnz x0, 2f",
        ".cfi_remember_state",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        ".cfi_def_cfa_offset 0",
        ".cfi_restore x29",
        ".cfi_restore x30",
        // x16/x17 are the registers BTI lets an indirect branch land through.
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "br x16",
        "2:",
        ".cfi_restore_state",
        "ldp x29, x30, [sp], #32",
        ".cfi_def_cfa_offset 0",
        ".cfi_restore x29",
        ".cfi_restore x30",
        "ret",
        ".cfi_endproc",
        answer = sym dlsym_answer,
        real = sym dl::REAL_DLSYM,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    core::arch::naked_asm!(
        ".cfi_startproc",
        "hint #34",
        "stp x29, x30, [sp, #-48]!",
        ".cfi_def_cfa_offset 48",
        ".cfi_offset x29, -48",
        ".cfi_offset x30, -40",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "str x2, [sp, #32]",
        "mov x3, x30",
        "bl {answer}",
        "cbnz x0, 2f",
        ".cfi_remember_state",
        "ldp x0, x1, [sp, #16]",
        "ldr x2, [sp, #32]",
        "ldp x29, x30, [sp], #48",
        ".cfi_def_cfa_offset 0",
        ".cfi_restore x29",
        ".cfi_restore x30",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "br x16",
        "2:",
        ".cfi_restore_state",
        "ldp x29, x30, [sp], #48",
        ".cfi_def_cfa_offset 0",
        ".cfi_restore x29",
        ".cfi_restore x30",
        "ret",
        ".cfi_endproc",
        answer = sym dlvsym_answer,
        real = sym dl::REAL_DLVSYM,
    )
}

hand_hooks! {
    /// A symbol by name (the trampolines above).
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
    /// A symbol by name and version (the trampolines above).
    fn dlvsym(handle: *mut c_void, name: *const c_char, version: *const c_char) -> *mut c_void;
}

/// Non-null: the trampoline returns it. Null: the trampoline hands the call to the real function.
/// Also where the real functions get found, on the very first `dlsym` of the process.
extern "C" fn dlsym_answer(
    handle: *mut c_void,
    name: *const c_char,
    _caller: *const c_void,
) -> *mut c_void {
    std::panic::catch_unwind(|| {
        dl::init();
        answer(handle, name, None)
    })
    .unwrap_or(std::ptr::null_mut())
}

extern "C" fn dlvsym_answer(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
    _caller: *const c_void,
) -> *mut c_void {
    std::panic::catch_unwind(|| {
        dl::init();
        answer(handle, name, Some(version))
    })
    .unwrap_or(std::ptr::null_mut())
}

type Redirect = fn(&CStr, usize) -> Option<Option<usize>>;

/// Every family's table (its names and its redirection), and whose hooks it is: a new family is
/// one line here.
const TABLES: [(Family, &[&str], Redirect); 7] = [
    (
        cuda_runtime::FAMILY,
        cuda_runtime::NAMES,
        cuda_runtime::redirect,
    ),
    (
        cuda_driver::FAMILY,
        cuda_driver::NAMES,
        cuda_driver::redirect,
    ),
    (acl::FAMILY, acl::NAMES, acl::redirect),
    (hip::FAMILY, hip::NAMES, hip::redirect),
    (ibverbs::FAMILY, ibverbs::NAMES, ibverbs::redirect),
    (hal::FAMILY, hal::NAMES, hal::redirect),
    (Family::Mlock, libc_lock::NAMES, libc_lock::redirect),
];

/// The table that has `name`, and its family.
fn table_of(name: &[u8]) -> Option<(Family, Redirect)> {
    TABLES
        .iter()
        .find(|t| t.1.iter().any(|n| n.as_bytes() == name))
        .map(|t| (t.0, t.2))
}

fn answer(handle: *mut c_void, name: *const c_char, version: Option<*const c_char>) -> *mut c_void {
    let none = std::ptr::null_mut();
    if name.is_null() || handle == libc::RTLD_NEXT || handle == libc::RTLD_DEFAULT {
        return none;
    }
    // SAFETY: `name` is non-null (checked above) and dlsym's contract makes it a NUL-terminated string.
    let cname = unsafe { CStr::from_ptr(name) };
    let Some((family, redirect)) = table_of(cname.to_bytes()) else {
        return none;
    };
    if !crate::lifecycle::hooks_enabled(family) {
        return none;
    }
    let real = match version {
        None => dl::real_dlsym(handle, cname),
        Some(v) => dl::real_dlvsym(handle, cname, v),
    } as usize;
    if real == 0 {
        return none; // the real function repeats the search and sets dlerror()
    }
    match redirect(cname, real) {
        Some(Some(w)) if w != real => {
            // SAFETY: dlerror has no preconditions; it only clears this thread's pending loader error.
            unsafe { libc::dlerror() }; // no stale error from earlier calls survives a success
            w as *mut c_void
        }
        _ => none,
    }
}
