//! `_dl_find_object` for the unwinder linked into the library (`build.rs`): gcc 12's static
//! `libgcc_eh.a` finds each frame's unwind tables with glibc 2.35's `_dl_find_object`, an import
//! that would tie the library to glibc 2.35 and stop a musl loader from loading it at all. This
//! hidden definition takes the import's place: glibc's own function where the loader has one
//! (lock-free), else the object is found with `dl_iterate_phdr`, as libgcc did before 2.35.

use std::ffi::{c_int, c_void};

/// glibc's `struct dl_find_object` on x86-64 and aarch64 (no `dlfo_eh_dbase`, no `dlfo_eh_count`).
#[repr(C)]
pub struct DlFindObject {
    flags: u64,
    map_start: *mut c_void,
    map_end: *mut c_void,
    link_map: *mut c_void,
    eh_frame: *mut c_void,
    reserved: [u64; 7],
}

type FindFn = unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> c_int;

// Hidden, so that it is only the linked unwinder's: exported, it would take glibc's place for the
// whole process. Only the gcc-linked build references it (zig's unwinder walks `dl_iterate_phdr`).
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".globl _dl_find_object",
    ".hidden _dl_find_object",
    ".type _dl_find_object, @function",
    "_dl_find_object:",
    "jmp {imp}",
    imp = sym find_object,
);
#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".globl _dl_find_object",
    ".hidden _dl_find_object",
    ".type _dl_find_object, %function",
    "_dl_find_object:",
    "b {imp}",
    imp = sym find_object,
);

/// The object that holds `pc` and its unwind tables: 0, or -1 when no object holds it.
///
/// # Safety
/// `out` is valid to write, as `_dl_find_object`'s caller guarantees.
unsafe extern "C" fn find_object(pc: *mut c_void, out: *mut DlFindObject) -> c_int {
    if let Some(f) = crate::runtime::dl::find_object_fn() {
        // SAFETY: `f` is glibc's `_dl_find_object`, of this type; the arguments are our caller's.
        return unsafe { std::mem::transmute::<usize, FindFn>(f)(pc, out) };
    }
    let mut found = Found {
        pc: pc as usize,
        start: 0,
        end: 0,
        eh_frame: 0,
    };
    // SAFETY: `cb` has the callback signature dl_iterate_phdr expects, and `data` is `&mut found`,
    // a `Found` that `cb` casts back to exactly that type, for the whole call.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut found as *mut Found as *mut c_void) };
    if found.eh_frame == 0 {
        return -1;
    }
    // SAFETY: an all-zero `DlFindObject` is valid (null pointers, no flags).
    let mut r: DlFindObject = unsafe { std::mem::zeroed() };
    r.map_start = found.start as *mut c_void;
    r.map_end = found.end as *mut c_void;
    r.eh_frame = found.eh_frame as *mut c_void;
    // SAFETY: the caller passes `out` valid to write.
    unsafe { out.write(r) };
    0
}

struct Found {
    pc: usize,
    start: usize,
    end: usize,
    eh_frame: usize,
}

unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `&mut Found` passed above, live for the whole walk.
    let found = unsafe { &mut *(data as *mut Found) };
    // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info` for the callback's duration.
    let info = unsafe { &*info };
    let base = info.dlpi_addr as usize;
    let (mut start, mut end, mut eh, mut holds) = (usize::MAX, 0usize, 0usize, false);
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: `i < dlpi_phnum`, the length of the loader's program header array.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        // Wrapping: a panic here, inside the loader's callback, would abort the process.
        let at = base.wrapping_add(ph.p_vaddr as usize);
        match ph.p_type {
            libc::PT_LOAD => {
                let to = at.wrapping_add(ph.p_memsz as usize);
                holds |= at <= found.pc && found.pc < to;
                start = start.min(at);
                end = end.max(to);
            }
            libc::PT_GNU_EH_FRAME => eh = at,
            _ => {}
        }
    }
    if !holds {
        return 0;
    }
    (found.start, found.end, found.eh_frame) = (start, end, eh);
    1
}
