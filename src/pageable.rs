//! Pageable memory handed out by the `downgrade` policy instead of pinned memory.
//!
//! Raw syscalls, not libc's `mmap`: pinguard exports `mmap` itself, and this memory must never be
//! mistaken for an application mapping by any interposer.

use std::os::raw::c_void;

pub fn alloc(size: usize) -> Option<*mut c_void> {
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
    unsafe { libc::syscall(libc::SYS_munmap, addr, size) };
}
