//! pinguard's own heap: every allocation its Rust code makes comes from here, never from the
//! application's `malloc`.
//!
//! A hooked call can run inside a signal handler that interrupted the application in the middle
//! of `malloc` (a `SIGALRM` handler calling `mlock` is legal: `mlock` is a plain system call).
//! Calling glibc's `malloc` again there corrupts its heap. This heap is dlmalloc over pages taken
//! with raw system calls, behind pinguard's futex mutex, and it never runs application code; the
//! only code that can hold its lock is pinguard's own, and while it does the thread is marked as
//! inside pinguard, so a handler that interrupts it passes the hooked call through untracked
//! instead of waiting for a lock its own thread holds.

use crate::runtime::lock::{self, Mutex};
use dlmalloc::{Allocator, Dlmalloc};
use std::alloc::{GlobalAlloc, Layout};
use std::ptr;

/// Pages straight from the kernel: `syscall(2)` rather than libc's `mmap`, which pinguard hooks
/// and which may need a first look-up of the real function (the loader, its lock, `malloc`).
pub struct Pages;

// SAFETY: the methods hand out fresh anonymous mappings and give back only what was handed out,
// as dlmalloc's contract asks; no state is shared between calls.
unsafe impl Allocator for Pages {
    fn alloc(&self, size: usize) -> (*mut u8, usize, u32) {
        // SAFETY: an anonymous private mapping at an address the kernel picks touches nothing else.
        let p = unsafe {
            libc::syscall(libc::SYS_mmap, ptr::null_mut::<u8>(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p == -1 || p == 0 {
            (ptr::null_mut(), 0, 0)
        } else {
            (p as *mut u8, size, 0)
        }
    }

    fn remap(&self, p: *mut u8, oldsize: usize, newsize: usize, can_move: bool) -> *mut u8 {
        let flags = if can_move { libc::MREMAP_MAYMOVE } else { 0 };
        // SAFETY: `p` and `oldsize` describe a mapping this allocator made (dlmalloc's contract).
        let r = unsafe { libc::syscall(libc::SYS_mremap, p, oldsize, newsize, flags) };
        if r == -1 {
            ptr::null_mut()
        } else {
            r as *mut u8
        }
    }

    fn free_part(&self, p: *mut u8, oldsize: usize, newsize: usize) -> bool {
        // SAFETY: shrinking in place keeps `[p, p + newsize)`, which stays dlmalloc's; only the
        // tail this allocator mapped is given back.
        unsafe {
            if libc::syscall(libc::SYS_mremap, p, oldsize, newsize, 0) != -1 {
                return true;
            }
            libc::syscall(libc::SYS_munmap, p.add(newsize), oldsize - newsize) == 0
        }
    }

    fn free(&self, p: *mut u8, size: usize) -> bool {
        // SAFETY: the whole mapping this allocator made, no longer used by dlmalloc.
        unsafe { libc::syscall(libc::SYS_munmap, p, size) == 0 }
    }

    fn can_release_part(&self, _flags: u32) -> bool {
        true
    }

    fn allocates_zeros(&self) -> bool {
        true
    }

    fn page_size(&self) -> usize {
        crate::runtime::sys::page_size()
    }
}

static HEAP: Mutex<Dlmalloc<Pages>> = Mutex::new(Dlmalloc::new_with_allocator(Pages));

pub struct Heap;

/// Marks the thread as inside pinguard while the heap's lock is held (see the module comment).
struct Inside(bool);

impl Inside {
    #[inline(always)]
    fn new() -> Inside {
        Inside(crate::runtime::guard::mark_inside())
    }
}

impl Drop for Inside {
    #[inline(always)]
    fn drop(&mut self) {
        crate::runtime::guard::unmark_inside(self.0);
    }
}

/// Allocations from this size up get mappings of their own, given back to the kernel when freed
/// (glibc's `malloc` does the same from 128 KiB): dlmalloc serves every size from its segments,
/// and a report's large, short-lived buffers then leave the segments fragmented and resident.
const OWN_MAPPING: usize = 128 * 1024;

/// Whether a layout gets its own mapping; the same answer on allocation and release.
#[inline(always)]
fn own_mapping(layout: &Layout) -> bool {
    layout.size() >= OWN_MAPPING && layout.align() <= crate::runtime::sys::page_size()
}

fn pages(size: usize) -> usize {
    let page = crate::runtime::sys::page_size();
    (size + page - 1) & !(page - 1)
}

// SAFETY: small layouts go to dlmalloc under one lock, with the layout the caller gave (dlmalloc
// honours size and alignment as `GlobalAlloc` requires); large ones to page-aligned anonymous
// mappings (zeroed, aligned to a page, which `own_mapping` requires of the layout), told apart on
// release by the same layout.
unsafe impl GlobalAlloc for Heap {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if own_mapping(&layout) {
            return Pages.alloc(pages(layout.size())).0;
        }
        let _i = Inside::new();
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` receives it.
        unsafe { HEAP.lock().malloc(layout.size(), layout.align()) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if own_mapping(&layout) {
            return Pages.alloc(pages(layout.size())).0; // fresh anonymous pages are zero
        }
        let _i = Inside::new();
        // SAFETY: as in `alloc`.
        unsafe { HEAP.lock().calloc(layout.size(), layout.align()) }
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if own_mapping(&layout) {
            Pages.free(p, pages(layout.size()));
            return;
        }
        let _i = Inside::new();
        // SAFETY: `p` came from this allocator's dlmalloc with this layout (`own_mapping` false).
        unsafe { HEAP.lock().free(p, layout.size(), layout.align()) }
    }

    #[inline]
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `GlobalAlloc::realloc` guarantees the new size, with the old alignment, is a
        // valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (own_mapping(&layout), own_mapping(&new)) {
            (true, true) => Pages.remap(p, pages(layout.size()), pages(new_size), true),
            (false, false) => {
                let _i = Inside::new();
                // SAFETY: `p` came from dlmalloc with `layout`.
                unsafe { HEAP.lock().realloc(p, layout.size(), layout.align(), new_size) }
            }
            _ => {
                // Across the threshold: a new block of the other kind, the contents copied.
                // SAFETY: `new` is a valid layout; the copy covers what both blocks hold; `p` is
                // released with the layout it was allocated with.
                unsafe {
                    let q = self.alloc(new);
                    if !q.is_null() {
                        std::ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                        self.dealloc(p, layout);
                    }
                    q
                }
            }
        }
    }
}

/// Gives the free memory at the top of the heap and every wholly free segment back to the
/// kernel (dlmalloc does it by itself only past a threshold, and checks for free segments only
/// every few thousand frees).
pub fn trim() {
    let _i = Inside::new();
    // SAFETY: trimming only releases memory dlmalloc holds free; nothing in use moves.
    unsafe { HEAP.lock().trim(0) };
}

/// Fork support: taken last in `prepare` (the other locks' holders may allocate), so the child
/// never inherits it held by a thread it does not have.
pub fn hold() {
    lock::hold(&HEAP);
}

/// # Safety
/// Only after `hold`, in the fork handlers.
pub unsafe fn release(child: bool) {
    // SAFETY: after `hold`, in the fork handler `child` names (this function's contract).
    unsafe { lock::release(&HEAP, child) };
}
