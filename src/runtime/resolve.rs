//! Finding the real function behind each hook.
//!
//! `dlsym(RTLD_NEXT)` first; when the runtime was loaded `RTLD_LOCAL` (ctypes, Python extension
//! modules) that finds nothing, so fall back to asking each loaded object in turn. A miss is never
//! cached: the runtime may be loaded later. No `Once`: resolution can re-enter a hook on this
//! thread, and an atomic that tolerates two racing look-ups cannot deadlock.

use crate::runtime::objects::{for_each_object, is_own, own_range};
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Real {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Real {
    pub const fn new(name: &'static CStr) -> Real {
        Real {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    #[inline(always)]
    pub fn addr(&self) -> Option<usize> {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return Some(a);
        }
        self.resolve()
    }

    /// The real function if a call found it already (no look-up): for an export whose first
    /// call goes to a cold function of its own, so that the steady path keeps the caller's
    /// arguments in their registers and tail-calls the body.
    #[inline(always)]
    pub fn known(&self) -> Option<usize> {
        match self.addr.load(Ordering::Relaxed) {
            0 => None,
            a => Some(a),
        }
    }

    /// The look-up done ahead of any call, from the constructor: on the program's main stack at
    /// start, which has room for the loader's kilobytes, so that a process that never pins maps
    /// no stack of pinguard's.
    pub fn prepare(&self) {
        if self.addr.load(Ordering::Relaxed) == 0 {
            let a = lookup(self.name);
            if a != 0 {
                self.addr.store(a, Ordering::Relaxed);
            }
        }
    }

    /// The first call's look-up, out of line so that every later call is a load and a jump.
    #[cold]
    #[inline(never)]
    fn resolve(&self) -> Option<usize> {
        // The loader's look-up takes kilobytes of stack: pinguard's own, not the caller's.
        let a = crate::runtime::workstack::run(crate::runtime::guard::here(), || lookup(self.name));
        if a != 0 {
            self.addr.store(a, Ordering::Relaxed);
            Some(a)
        } else {
            None
        }
    }

    /// The real function as the hook's own signature.
    ///
    /// # Safety
    /// `F` must be the `extern "C" fn` type of the symbol this `Real` names.
    pub unsafe fn get<F: Copy>(&self) -> Option<F> {
        debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: `a` is the symbol's non-zero address and `F` its `extern "C" fn` type (the
        // caller's guarantee), a pointer the size of `usize`.
        self.addr()
            .map(|a| unsafe { std::mem::transmute_copy::<usize, F>(&a) })
    }
}

fn lookup(name: &CStr) -> usize {
    // SAFETY: Names are NUL-terminated CStrs; `h` is checked non-null before use and closed once, and
    // RTLD_NOLOAD only re-references an object already loaded, so nothing new runs or unmaps;
    // an object's tables are read (`is_copy`) while `h` holds it mapped.
    unsafe {
        let p = crate::runtime::dl::real_dlsym(libc::RTLD_NEXT, name) as usize;
        if p != 0 && !is_own(p) {
            // Another copy of pinguard (one that stands down, `copies`) is passed over: the
            // search goes on after it, as `RTLD_NEXT` would have without it.
            let p = match crate::runtime::copies::other_copy_at(p) {
                None => p,
                Some(copy) => crate::runtime::copies::next_after(&copy, name),
            };
            if p != 0 {
                return p;
            }
        }
        let mut found = 0usize;
        for_each_object(|obj| {
            if found != 0
                || obj.name.as_bytes().is_empty()
                || obj.contains(own_range as *const () as usize)
            {
                return;
            }
            let h = libc::dlopen(obj.name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if h.is_null() {
                return;
            }
            let p = crate::runtime::dl::real_dlsym(h, name) as usize;
            // dlsym(handle) also searches the object's dependencies: take only a definition that
            // lives in this object, so the search order stays the link map's; never one of
            // another copy of pinguard's (the object is held open while it is read).
            let copy = crate::runtime::copies::Obj {
                base: obj.base,
                dynamic: obj.dynamic,
                start: obj.start,
                end: obj.end,
            };
            if p != 0 && obj.contains(p) && !copy.is_copy() {
                found = p;
            }
            libc::dlclose(h);
        });
        // Clear the error a failed dlsym left, so the application's next dlerror() is not ours.
        libc::dlerror();
        found
    }
}
