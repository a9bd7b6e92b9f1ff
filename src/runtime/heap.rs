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
//!
//! No system call failing here may end the program: an allocation that returns null to Rust's
//! infallible collections ends in `handle_alloc_error`, which aborts. So `mremap` refused (a
//! sandbox that denies it, no room to move) falls back to a new mapping and a copy, and `mmap`
//! refused (`RLIMIT_AS`, `ENOMEM`, a sandbox) is served from a small reserve of address space
//! taken with the heap's first pages. The first refusal also makes pinguard *short*: hooked
//! pinning calls then pass through untracked (`untracked_count`) until a probe finds room again,
//! so that little more is asked of the reserve than the call in flight and the report.

use crate::runtime::lock::{self, Mutex};
use crate::runtime::own_maps;
use dlmalloc::{Allocator, Dlmalloc};
use std::alloc::{GlobalAlloc, Layout};
use std::ptr;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// Pages straight from the kernel: `syscall(2)` rather than libc's `mmap`, which pinguard hooks
/// and which may need a first look-up of the real function (the loader, its lock, `malloc`).
pub struct Pages;

// SAFETY: the methods hand out fresh anonymous mappings and give back only what was handed out,
// as dlmalloc's contract asks; no state is shared between calls.
unsafe impl Allocator for Pages {
    fn alloc(&self, size: usize) -> (*mut u8, usize, u32) {
        if let Some(p) = first_segment(size) {
            return (p, size, 0);
        }
        let p = fresh_pages(size);
        if p.is_null() {
            (ptr::null_mut(), 0, 0)
        } else {
            (p, size, 0)
        }
    }

    fn remap(&self, p: *mut u8, oldsize: usize, newsize: usize, can_move: bool) -> *mut u8 {
        if in_first_segment(p) {
            return ptr::null_mut();
        }
        let flags = if can_move { libc::MREMAP_MAYMOVE } else { 0 };
        // SAFETY: `p` and `oldsize` describe a mapping this allocator made (dlmalloc's contract).
        let r = unsafe { libc::syscall(libc::SYS_mremap, p, oldsize, newsize, flags) };
        if r == -1 {
            ptr::null_mut()
        } else {
            own_maps::moved(p as usize, r as usize, newsize);
            r as *mut u8
        }
    }

    fn free_part(&self, p: *mut u8, oldsize: usize, newsize: usize) -> bool {
        if in_first_segment(p) {
            return false;
        }
        // SAFETY: shrinking in place keeps `[p, p + newsize)`, which stays dlmalloc's; only the
        // tail this allocator mapped is given back.
        unsafe {
            let done = libc::syscall(libc::SYS_mremap, p, oldsize, newsize, 0) != -1
                || libc::syscall(libc::SYS_munmap, p.add(newsize), oldsize - newsize) == 0;
            if done {
                own_maps::unmapped(p as usize, newsize);
            }
            done
        }
    }

    fn free(&self, p: *mut u8, size: usize) -> bool {
        if in_first_segment(p) {
            return false;
        }
        own_maps::unmapped(p as usize, 0);
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

/// An anonymous private mapping of `len` bytes with `prot`, away from the program's mappings
/// (`space`); null when refused.
fn map(len: usize, prot: i32) -> *mut u8 {
    let flags = libc::MAP_PRIVATE
        | libc::MAP_ANONYMOUS
        | if prot == libc::PROT_NONE {
            libc::MAP_NORESERVE
        } else {
            0
        };
    // SAFETY: an anonymous private mapping at an address the kernel picks touches nothing else.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            crate::runtime::space::hint(len),
            len,
            prot,
            flags,
            -1,
            0,
        )
    };
    if p == -1 || p == 0 {
        ptr::null_mut()
    } else {
        // Fresh: a mapping nothing has written yet.
        own_maps::mapped(p as usize, len, true);
        p as *mut u8
    }
}

fn unmap(p: *mut u8, len: usize) {
    own_maps::unmapped(p as usize, 0);
    // SAFETY: callers pass a range of a mapping this module made and no longer hands out.
    unsafe { libc::syscall(libc::SYS_munmap, p, len) };
}

/// The heap's first segment: in the library's `.bss`, so that a process's first allocations
/// (settings read at exit by a process that never pinned, the first pinning call's set-up) cost
/// no mapping of memory; only the pages touched are the process's.
#[repr(C, align(65536))]
struct FirstSegment([u8; FIRST_SEGMENT]);
const FIRST_SEGMENT: usize = 64 << 10;
static mut FIRST: FirstSegment = FirstSegment([0; FIRST_SEGMENT]);
static FIRST_TAKEN: AtomicBool = AtomicBool::new(false);

/// The first segment, once, for a request it can hold. The reserve is taken with it, while the
/// kernel still gives address space (a program may lower `RLIMIT_AS` later).
fn first_segment(size: usize) -> Option<*mut u8> {
    if size > FIRST_SEGMENT || FIRST_TAKEN.swap(true, AcqRel) {
        return None;
    }
    if RESERVE.load(Relaxed) == 0 && !RESERVE_TRIED.swap(true, Relaxed) {
        take_reserve(0);
    }
    Some(&raw mut FIRST as *mut u8)
}

/// Whether `p` lies in the first segment (never unmapped or moved: it is the library's).
fn in_first_segment(p: *mut u8) -> bool {
    let start = &raw const FIRST as usize;
    (start..start + FIRST_SEGMENT).contains(&(p as usize))
}

/// Pages for the heap: new ones from the kernel, else from the reserve (then pinguard is short).
fn fresh_pages(size: usize) -> *mut u8 {
    let p = map(size, libc::PROT_READ | libc::PROT_WRITE);
    if !p.is_null() {
        if RESERVE.load(Relaxed) == 0 && !RESERVE_TRIED.swap(true, Relaxed) {
            take_reserve(0);
        }
        return p;
    }
    FAILURES.fetch_add(1, Relaxed);
    if !SHORT.swap(true, AcqRel) {
        let f = ON_SHORT.load(Acquire);
        if f != 0 {
            // SAFETY: `ON_SHORT` only ever holds a `fn()` stored by `on_short`.
            let f: fn() = unsafe { std::mem::transmute::<usize, fn()>(f) };
            f();
        }
    }
    from_reserve(size)
}

/// The reserve's size: a few of dlmalloc's 64 KiB segments, enough for the call in flight and a
/// report without names. Taken as `PROT_NONE` address space (no memory, no commit charge) and
/// made writable piece by piece only when the kernel refuses new pages.
const RESERVE_BYTES: usize = 256 << 10;

/// The reserve: its address (page-aligned) with the pages handed out so far in the low 12 bits;
/// 0 when there is none. One word, so that taking a piece is one compare-and-swap and a fork
/// child finds it consistent.
static RESERVE: AtomicUsize = AtomicUsize::new(0);
static RESERVE_TRIED: AtomicBool = AtomicBool::new(false);
/// Requests for pages the kernel refused (each one left something out or came from the reserve).
static FAILURES: AtomicU64 = AtomicU64::new(0);
/// Set by a refusal, cleared by `recover` once a probe finds room.
static SHORT: AtomicBool = AtomicBool::new(false);
/// Told once when pinguard becomes short (the composition layer stops tracking new pins).
static ON_SHORT: AtomicUsize = AtomicUsize::new(0);
/// When `recover` may probe again (coarse clock, ms).
static NEXT_PROBE: AtomicU64 = AtomicU64::new(0);

fn reserve_pages() -> usize {
    RESERVE_BYTES / crate::runtime::sys::page_size()
}

/// Maps a new reserve in place of `old` (the word `RESERVE` held); false if it could not.
fn take_reserve(old: usize) -> bool {
    let at = map(RESERVE_BYTES, libc::PROT_NONE);
    if at.is_null() {
        return false;
    }
    if RESERVE
        .compare_exchange(old, at as usize, AcqRel, Relaxed)
        .is_err()
    {
        unmap(at, RESERVE_BYTES); // another thread replaced it first
        return true;
    }
    if old != 0 {
        // What the old reserve had not handed out goes back; what it had is the heap's.
        let page = crate::runtime::sys::page_size();
        let (base, used) = (old & !0xfff, (old & 0xfff) * page);
        // SAFETY: the old reserve's tail, handed out to nobody.
        unsafe { libc::syscall(libc::SYS_munmap, base + used, RESERVE_BYTES - used) };
        own_maps::unmapped(base, used);
    }
    true
}

/// `size` bytes (a multiple of the page) of the reserve, made writable; null when it has no room.
fn from_reserve(size: usize) -> *mut u8 {
    let page = crate::runtime::sys::page_size();
    let want = size.div_ceil(page);
    let mut w = RESERVE.load(Acquire);
    loop {
        let (base, used) = (w & !0xfff, w & 0xfff);
        if base == 0 || used + want > reserve_pages() {
            return ptr::null_mut();
        }
        match RESERVE.compare_exchange_weak(w, w + want, AcqRel, Acquire) {
            Ok(_) => {
                let p = (base + used * page) as *mut u8;
                // SAFETY: `[p, p + want pages)` lies in the reserve's mapping and was handed out to
                // nobody before this compare-and-swap took it.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_mprotect,
                        p,
                        want * page,
                        libc::PROT_READ | libc::PROT_WRITE,
                    )
                };
                return if r == 0 { p } else { ptr::null_mut() };
            }
            Err(now) => w = now,
        }
    }
}

/// Requests for pages the kernel refused since pinguard started (the report's
/// `out_of_memory_count`).
pub fn failures() -> u64 {
    FAILURES.load(Relaxed)
}

/// Whether pinguard is short of memory now: a request was refused and no probe found room since.
pub fn short() -> bool {
    SHORT.load(Relaxed)
}

/// `f` is called (once per shortage, from whichever thread meets it, possibly under the heap's
/// lock: it must neither allocate nor lock) when pinguard becomes short.
pub fn on_short(f: fn()) {
    ON_SHORT.store(f as usize, Release);
}

/// While short: at most every 100 ms, probes whether the kernel gives address space again (a
/// reserve's worth, which then replaces a reserve that was drawn on). True when not short (any more).
pub fn recover() -> bool {
    if !SHORT.load(Relaxed) {
        return true;
    }
    let now = crate::runtime::clock::coarse_unix_ms();
    let next = NEXT_PROBE.load(Relaxed);
    if now < next
        || NEXT_PROBE
            .compare_exchange(next, now + 100, Relaxed, Relaxed)
            .is_err()
    {
        return false;
    }
    let old = RESERVE.load(Acquire);
    let room = if old & 0xfff != 0 || old == 0 {
        take_reserve(old)
    } else {
        let probe = map(RESERVE_BYTES, libc::PROT_NONE);
        let ok = !probe.is_null();
        if ok {
            unmap(probe, RESERVE_BYTES);
        }
        ok
    };
    if room {
        SHORT.store(false, Release);
    }
    room
}

/// Whether `bytes` of address space could be mapped now (a `PROT_NONE` probe, given back at
/// once): work that needs that much, and can do without, asks first. Without an address-space
/// limit and before any refusal the answer is yes without a probe: a `PROT_NONE` mapping is
/// charged to nothing else, and a probe per report is not free everywhere (under qemu-user each
/// one costs the emulator memory it keeps).
pub fn room(bytes: usize) -> bool {
    if failures() == 0 && !address_space_limited() {
        return true;
    }
    let p = map(bytes, libc::PROT_NONE);
    if p.is_null() {
        return false;
    }
    unmap(p, bytes);
    true
}

fn address_space_limited() -> bool {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit for getrlimit to fill; a failure reads as limited (probe).
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) };
    rc != 0 || r.rlim_cur != libc::RLIM_INFINITY
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
            return fresh_pages(pages(layout.size()));
        }
        let _i = Inside::new();
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` receives it.
        unsafe { HEAP.lock().malloc(layout.size(), layout.align()) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if own_mapping(&layout) {
            return fresh_pages(pages(layout.size())); // fresh anonymous pages (the reserve's too) are zero
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
            (true, true) => move_pages(p, pages(layout.size()), pages(new_size)),
            (false, false) => {
                let _i = Inside::new();
                // SAFETY: `p` came from dlmalloc with `layout`.
                unsafe {
                    HEAP.lock()
                        .realloc(p, layout.size(), layout.align(), new_size)
                }
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

/// A large block's mapping resized: `mremap` where the kernel allows it, else (a sandbox that
/// denies it, no room to grow in place or move) the tail unmapped, or a new mapping and a copy.
fn move_pages(p: *mut u8, old: usize, new: usize) -> *mut u8 {
    if old == new {
        return p;
    }
    let q = Pages.remap(p, old, new, true);
    if !q.is_null() {
        return q;
    }
    if new < old {
        return if Pages.free_part(p, old, new) {
            p
        } else {
            ptr::null_mut()
        };
    }
    let q = fresh_pages(new);
    if !q.is_null() {
        // SAFETY: both mappings are this module's, `old` bytes of `p` are the block's, and a new
        // mapping never overlaps a live one.
        unsafe { ptr::copy_nonoverlapping(p, q, old) };
        Pages.free(p, old);
    }
    q
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
pub unsafe fn let_go(child: bool) {
    // SAFETY: after `hold`, in the fork handler `child` names (this function's contract).
    unsafe { lock::let_go(&HEAP, child) };
}
