//! pinguard's own mappings, kept out of what the program's `mlockall` locks (issue 44, item 6).
//!
//! `mlockall(MCL_CURRENT)` locks every mapping of the process and charges it to
//! `RLIMIT_MEMLOCK`; `MCL_FUTURE` locks every later one as it is made. pinguard's image, its heap,
//! its threads' work stacks and the state file's arena would take megabytes of the program's
//! limit. So the mappings pinguard makes are recorded here (a fixed table: no allocation, no
//! lock), and after the program's `mlockall` they are unlocked again, as is every one made while
//! `MCL_FUTURE` is in force. Where the kernel would refuse `mlockall(MCL_CURRENT)` only because
//! pinguard's mappings take the process's size over the limit (it compares the whole size with
//! it), the call is made the kernel's way without them: `MCL_FUTURE` alone, then `mlock` of every
//! mapping but pinguard's.

use crate::runtime::kernel;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

/// Past this many mappings of pinguard's at once (a heap segment each, a work stack per thread),
/// the others stay locked with the program's.
const SLOTS: usize = 1024;

/// (start, length) of each recorded mapping; a start of 0 is a free slot, a length of 0 one being
/// filled.
static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static LENS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// An `mlockall(MCL_FUTURE)` of the program's is in force (as far as the hook saw).
static FUTURE: AtomicBool = AtomicBool::new(false);

/// Records a mapping pinguard made, `[start, start + len)`, replacing one recorded at the same
/// address; if the kernel locked it (`MCL_FUTURE`), unlocks it, and where `fresh` (private
/// anonymous memory nothing has written yet) gives back the pages the lock faulted in.
pub fn mapped(start: usize, len: usize, fresh: bool) {
    if start == 0 || len == 0 {
        return;
    }
    record(start, len);
    if kernel::any_locked(start, start + len) {
        unlock(start, len);
        if fresh {
            // SAFETY: the caller's fresh private mapping: nothing in it is in use yet, and its
            // pages read as zero again after MADV_DONTNEED.
            unsafe { libc::syscall(libc::SYS_madvise, start, len, libc::MADV_DONTNEED) };
        }
    }
}

fn record(start: usize, len: usize) {
    if let Some(i) = (0..SLOTS).find(|&i| STARTS[i].load(Relaxed) == start) {
        LENS[i].store(len, Relaxed);
        return;
    }
    for i in 0..SLOTS {
        if STARTS[i]
            .compare_exchange(0, start, Relaxed, Relaxed)
            .is_ok()
        {
            LENS[i].store(len, Relaxed);
            return;
        }
    }
}

/// The mapping recorded at `start` is gone (or `len` is its new length: the tail unmapped).
pub fn unmapped(start: usize, len: usize) {
    if let Some(i) = (0..SLOTS).find(|&i| STARTS[i].load(Relaxed) == start) {
        LENS[i].store(len, Relaxed);
        if len == 0 {
            STARTS[i].store(0, Relaxed);
        }
    }
}

/// The mapping at `old` moved to `new` with `len` bytes (`mremap`).
pub fn moved(old: usize, new: usize, len: usize) {
    unmapped(old, 0);
    mapped(new, len, false);
}

/// Records pinguard's image and the objects loaded for it alone (`objects::only_for_own`), once:
/// a walk of the loaded objects, made at the first `mlockall` (nothing at start-up), from a thread
/// that is not inside pinguard's own work (the walk allocates).
pub fn prepare() {
    if PREPARED.swap(true, Relaxed) {
        return;
    }
    let (s, e) = crate::runtime::objects::own_range();
    if s != 0 && e > s {
        record(s, e - s);
    }
    crate::runtime::objects::only_for_own(|s, e| record(s, e - s));
    let name = LOADED.load(Relaxed);
    if !name.is_null() {
        // SAFETY: `LOADED` only holds a `&'static [u8; N]` literal's address and its length.
        let name = unsafe { std::slice::from_raw_parts(name, LOADED_LEN.load(Relaxed)) };
        crate::runtime::objects::for_each_object(|o| {
            if o.name.to_bytes().rsplit(|&b| b == b'/').next() == Some(name) {
                record(o.start, o.end - o.start);
            }
        });
    }
}

static PREPARED: AtomicBool = AtomicBool::new(false);
/// The file name of an object pinguard loaded at run time for itself alone (`unwinder::load`).
static LOADED: std::sync::atomic::AtomicPtr<u8> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
static LOADED_LEN: AtomicUsize = AtomicUsize::new(0);

/// pinguard loaded the object of this file name for itself (the process had not): its mappings
/// are pinguard's (found at `prepare`).
pub fn loaded_for_own(name: &'static [u8]) {
    LOADED_LEN.store(name.len(), Relaxed);
    LOADED.store(name.as_ptr() as *mut u8, Relaxed);
}

/// Every recorded range of pinguard's, `[start, end)` (they do not overlap: each is a mapping, or
/// a loaded object, of its own).
fn for_each(mut f: impl FnMut(usize, usize)) {
    for i in 0..SLOTS {
        let (s, len) = (STARTS[i].load(Relaxed), LENS[i].load(Relaxed));
        if s != 0 && len != 0 {
            f(s, s + len);
        }
    }
}

/// The bytes of `[start, end)` that are pinguard's.
pub fn overlap(start: usize, end: usize) -> usize {
    prepare();
    let mut n = 0;
    for_each(|s, e| n += e.min(end).saturating_sub(s.max(start)));
    n
}

/// The first of pinguard's ranges in `[at, end)`, cut to it.
fn next_own(at: usize, end: usize) -> Option<(usize, usize)> {
    let mut next: Option<(usize, usize)> = None;
    for_each(|s, e| {
        let (s, e) = (s.max(at), e.min(end));
        if e > s && next.is_none_or(|n| s < n.0) {
            next = Some((s, e));
        }
    });
    next
}

fn unlock(start: usize, len: usize) {
    // SAFETY: munlock only changes the lock of pages pinguard mapped itself.
    unsafe { libc::syscall(libc::SYS_munlock, start, len) };
}

/// The program's `mlockall(flags)`, made by `real`, with pinguard's mappings left out of it.
/// Allocates (`prepare`): not from a thread inside pinguard's own work (a signal handler that
/// interrupted it), which calls `real` alone.
pub fn mlockall(flags: c_int, real: impl FnOnce() -> c_int) -> c_int {
    prepare();
    let current = flags & libc::MCL_CURRENT != 0;
    let future = flags & libc::MCL_FUTURE != 0;
    let rc = if current && (future || !FUTURE.load(Relaxed)) && refused_for_ours() {
        lock_all_but_ours(flags)
    } else {
        real()
    };
    if rc == 0 {
        if current {
            for_each(|s, e| unlock(s, e - s));
        }
        FUTURE.store(future, Relaxed);
    }
    rc
}

/// The program's `munlockall` succeeded: nothing is locked as it is made any more.
pub fn unlocked_all() {
    FUTURE.store(false, Relaxed);
}

/// Whether the kernel would refuse `mlockall(MCL_CURRENT)` for the process's size while it would
/// not without pinguard's mappings.
fn refused_for_ours() -> bool {
    let Some(limit) = kernel::rlimit_memlock() else {
        return false;
    };
    let Some(size) = kernel::status().vm_size else {
        return false;
    };
    size > limit
        && size.saturating_sub(overlap(0, usize::MAX) as u64) <= limit
        && !kernel::cap_ipc_lock()
}

/// `mlockall(flags)` the kernel's way, pinguard's mappings left out: `MCL_FUTURE` (which the
/// kernel does not compare with the process's size) where asked, then every mapping's pages but
/// pinguard's locked with `mlock2` (whose limit is on what is locked, as `mlockall`'s effect is).
/// The kernel's errors for a mapping it does not lock, or one gone meanwhile, are mlockall's
/// silence too.
fn lock_all_but_ours(flags: c_int) -> c_int {
    let onfault = flags & libc::MCL_ONFAULT != 0;
    if flags & libc::MCL_FUTURE != 0 {
        let f = libc::MCL_FUTURE | (flags & libc::MCL_ONFAULT);
        // SAFETY: mlockall takes no pointers.
        let r = unsafe { libc::syscall(libc::SYS_mlockall, f) };
        if r != 0 {
            return -1;
        }
    }
    let lock = |s: usize, e: usize| {
        if e > s {
            // SAFETY: mlock2 only changes the lock of the process's own mapped pages.
            unsafe { libc::syscall(libc::SYS_mlock2, s, e - s, onfault as c_int) };
        }
    };
    let e = crate::runtime::guard::errno();
    kernel::for_each_mapping(|start, end| {
        let mut at = start;
        while let Some((s, e)) = next_own(at, end) {
            lock(at, s);
            at = e;
        }
        lock(at, end);
    });
    crate::runtime::guard::set_errno(e);
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Address space no test maps: the table only does arithmetic on it.
    const BASE: usize = 0x6e00_0000_0000;

    #[test]
    fn recorded_ranges_are_counted_found_in_order_and_forgotten() {
        let page = 4096;
        record(BASE + 8 * page, 2 * page);
        record(BASE, 4 * page);
        assert_eq!(overlap(BASE, BASE + 16 * page), 6 * page);
        assert_eq!(overlap(BASE + 3 * page, BASE + 9 * page), 2 * page);
        // The pieces between are the program's: what an `mlock2` of the mapping covers.
        assert_eq!(
            next_own(BASE, BASE + 16 * page),
            Some((BASE, BASE + 4 * page))
        );
        assert_eq!(
            next_own(BASE + 4 * page, BASE + 16 * page),
            Some((BASE + 8 * page, BASE + 10 * page))
        );
        assert_eq!(next_own(BASE + 10 * page, BASE + 16 * page), None);
        unmapped(BASE, page); // the tail unmapped
        assert_eq!(overlap(BASE, BASE + 16 * page), 3 * page);
        moved(BASE + 8 * page, BASE + 12 * page, 2 * page);
        assert_eq!(overlap(BASE + 8 * page, BASE + 10 * page), 0);
        assert_eq!(overlap(BASE + 12 * page, BASE + 14 * page), 2 * page);
        unmapped(BASE, 0);
        unmapped(BASE + 12 * page, 0);
        assert_eq!(overlap(BASE, BASE + 16 * page), 0);
    }

    #[test]
    fn a_mapping_the_kernel_locked_is_unlocked_as_it_is_recorded() {
        let len = 2 * crate::runtime::sys::page_size();
        // SAFETY: a fresh anonymous mapping, this test's alone.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let p = p as usize;
        // As `MCL_FUTURE` would have it; without the privilege or the limit, nothing to test.
        // SAFETY: the mapping made above.
        if unsafe { libc::mlock(p as *const libc::c_void, len) } != 0 {
            return;
        }
        assert!(kernel::any_locked(p, p + len));
        mapped(p, len, true);
        assert!(!kernel::any_locked(p, p + len));
        unmapped(p, 0);
        // SAFETY: the mapping made above, unused now.
        unsafe { libc::munmap(p as *mut libc::c_void, len) };
    }
}
