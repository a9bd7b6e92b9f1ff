//! Pageable memory handed out by the `downgrade` policy instead of pinned memory.
//!
//! Raw syscalls, not libc's `mmap`: pinguard exports `mmap` itself, and this memory must never be
//! mistaken for an application mapping by any interposer.

use std::os::raw::c_void;

pub fn alloc(size: usize) -> Option<*mut c_void> {
    // SAFETY: a fresh anonymous private mapping at a kernel-chosen address (no MAP_FIXED) cannot
    // alias or replace any memory the process already uses.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            std::ptr::null_mut::<c_void>(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p < 0 {
        None
    } else {
        Some(p as *mut c_void)
    }
}

pub fn free(addr: usize, size: usize) {
    // SAFETY: the only caller passes a mapping `alloc` made for a downgraded record that
    // `ledger::take` has just removed, so nothing refers to it any more.
    unsafe { libc::syscall(libc::SYS_munmap, addr, size) };
}
