//! Finding the real function behind each hook.
//!
//! `dlsym(RTLD_NEXT)` first; when the runtime was loaded `RTLD_LOCAL` (ctypes, Python extension
//! modules) that finds nothing, so fall back to asking each loaded object in turn. A miss is never
//! cached: the runtime may be loaded later. No `Once`: resolution can re-enter a hook on this
//! thread, and an atomic that tolerates two racing look-ups cannot deadlock.
//!
//! A hit is cached until its object is unloaded: `dlclose` calls `forget_unloaded`, which clears
//! every cached function (and every slot a `dlsym` or `cuGetProcAddress` pointer was bound to)
//! whose address no loaded object holds any more, so the next call looks the function up again
//! wherever the runtime was loaded this time. The steady path stays one load and a jump.

use crate::runtime::objects::{for_each_object, is_own, own_range};
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

pub struct Real {
    name: &'static CStr,
    addr: AtomicUsize,
    /// The next `Real` that has found its function (`FOUND`), and whether this one is on it.
    next: AtomicPtr<Real>,
    listed: AtomicBool,
}

/// Every `Real` that has found its function once: what an unload checks. Pushed once each,
/// never removed: statics only, no allocation, safe to walk while another thread pushes.
static FOUND: AtomicPtr<Real> = AtomicPtr::new(std::ptr::null_mut());
/// Every slot table that has held a function, likewise.
static SLOT_TABLES: AtomicPtr<Slots> = AtomicPtr::new(std::ptr::null_mut());
/// Bumped by each unload check before it looks: a look-up that ran meanwhile checks its answer
/// again (it may have found a function of the object being unloaded, after the check passed it).
static UNLOADS: AtomicU64 = AtomicU64::new(0);
/// The loader's count of unloaded objects at the last check (`objects::unloads`).
static SUBS_SEEN: AtomicU64 = AtomicU64::new(0);

impl Real {
    pub const fn new(name: &'static CStr) -> Real {
        Real {
            name,
            addr: AtomicUsize::new(0),
            next: AtomicPtr::new(std::ptr::null_mut()),
            listed: AtomicBool::new(false),
        }
    }

    #[inline(always)]
    pub fn addr(&'static self) -> Option<usize> {
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
    fn resolve(&'static self) -> Option<usize> {
        // The loader's look-up takes kilobytes of stack: pinguard's own, not the caller's.
        let seen = UNLOADS.load(Ordering::SeqCst);
        let a = crate::runtime::workstack::run(crate::runtime::guard::here(), || lookup(self.name));
        if a == 0 {
            return None;
        }
        self.addr.store(a, Ordering::SeqCst);
        if !self.listed.swap(true, Ordering::SeqCst) {
            // SAFETY: `self` is a static (`Real`s are only made in statics by the tables and
            // `real!`), pushed once (the `listed` swap).
            unsafe { push(&FOUND, self, &self.next) };
        }
        // An unload checked the cache while this looked: the stored answer may be one it missed.
        if UNLOADS.load(Ordering::SeqCst) != seen && !loaded(a) {
            let _ = self
                .addr
                .compare_exchange(a, 0, Ordering::SeqCst, Ordering::Relaxed);
            return None;
        }
        Some(a)
    }

    /// The real function as the hook's own signature.
    ///
    /// # Safety
    /// `F` must be the `extern "C" fn` type of the symbol this `Real` names.
    pub unsafe fn get<F: Copy>(&'static self) -> Option<F> {
        debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: `a` is the symbol's non-zero address and `F` its `extern "C" fn` type (the
        // caller's guarantee), a pointer the size of `usize`.
        self.addr()
            .map(|a| unsafe { std::mem::transmute_copy::<usize, F>(&a) })
    }
}

/// How many functions a slot table binds (`hooks::bind`): pointers to one entry point that
/// `dlsym(handle, ...)` or `cuGetProcAddress` found, which may differ from the one found by name.
pub const SLOTS: usize = 4;

/// One entry point's slots: each the real function one of its slot wrappers calls (0: free).
pub struct Slots {
    fns: [AtomicUsize; SLOTS],
    next: AtomicPtr<Slots>,
    listed: AtomicBool,
}

impl Default for Slots {
    fn default() -> Self {
        Self::new()
    }
}

impl Slots {
    pub const fn new() -> Slots {
        Slots {
            fns: [const { AtomicUsize::new(0) }; SLOTS],
            next: AtomicPtr::new(std::ptr::null_mut()),
            listed: AtomicBool::new(false),
        }
    }

    /// The function slot `i` holds (0 once its object was unloaded, until bound again).
    #[inline(always)]
    pub fn get(&self, i: usize) -> usize {
        self.fns[i].load(Ordering::Relaxed)
    }

    /// The slot that holds `real`, taking a free one if none does; `None` when all hold others.
    pub fn bind(&'static self, real: usize) -> Option<usize> {
        let i = self.fns.iter().position(|r| {
            match r.compare_exchange(0, real, Ordering::SeqCst, Ordering::Acquire) {
                Ok(_) => true,
                Err(cur) => cur == real,
            }
        })?;
        if !self.listed.swap(true, Ordering::SeqCst) {
            // SAFETY: `self` is `'static`, pushed once (the `listed` swap).
            unsafe { push(&SLOT_TABLES, self, &self.next) };
        }
        Some(i)
    }
}

/// Puts `item` at the head of the list `head`, its own link being `next`.
///
/// # Safety
/// `item` is pushed once, and lives for ever.
unsafe fn push<T>(head: &AtomicPtr<T>, item: &'static T, next: &AtomicPtr<T>) {
    let me = item as *const T as *mut T;
    let mut cur = head.load(Ordering::SeqCst);
    loop {
        next.store(cur, Ordering::SeqCst);
        match head.compare_exchange_weak(cur, me, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return,
            Err(c) => cur = c,
        }
    }
}

/// Every item of a list `push` made.
fn walk<T: 'static>(
    head: &AtomicPtr<T>,
    next: impl Fn(&T) -> &AtomicPtr<T>,
    mut f: impl FnMut(&T),
) {
    let mut p = head.load(Ordering::SeqCst);
    while !p.is_null() {
        // SAFETY: only `push` puts pointers on the list: to statics, never removed.
        let item = unsafe { &*p };
        f(item);
        p = next(item).load(Ordering::SeqCst);
    }
}

/// Whether some loaded object holds `addr` (the loader's answer: no allocation, no mapping).
fn loaded(addr: usize) -> bool {
    // SAFETY: an all-zero `Dl_info` is a valid value for dladdr to fill; `addr` is only compared.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a local, valid for the call.
    unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) != 0 }
}

/// After an application's `dlclose`: if the loader unloaded anything since the last check, every
/// cached function and bound slot whose object is gone is cleared (one compare-and-swap each, so
/// a hook that reads it meanwhile gets the old address or 0, never a torn one), and is looked up
/// again at its next call. A thread calling a runtime while another unloads it is calling into
/// unmapped code with or without pinguard; nothing here waits for it. Whether anything was
/// unloaded.
pub fn forget_unloaded() -> bool {
    let subs = crate::runtime::objects::unloads();
    if SUBS_SEEN.swap(subs, Ordering::SeqCst) == subs {
        return false; // only a reference dropped: nothing was unmapped
    }
    UNLOADS.fetch_add(1, Ordering::SeqCst);
    let forget = |w: &AtomicUsize| {
        let a = w.load(Ordering::SeqCst);
        if a != 0 && !loaded(a) {
            let _ = w.compare_exchange(a, 0, Ordering::SeqCst, Ordering::Relaxed);
        }
    };
    walk(&FOUND, |r| &r.next, |r| forget(&r.addr));
    walk(&SLOT_TABLES, |t| &t.next, |t| t.fns.iter().for_each(forget));
    true
}

fn lookup(name: &CStr) -> usize {
    // SAFETY: Names are NUL-terminated CStrs; `h` is checked non-null before use and closed once, and
    // RTLD_NOLOAD only re-references an object already loaded, so nothing new runs or unmaps;
    // an object's tables are read (`is_copy`) while `h` holds it mapped.
    unsafe {
        // Loaded by the first stage: the next definition is the one after the stage, where the
        // loader's order put pinguard (an interposer preloaded after it sees the calls first).
        if let Some(front) = crate::runtime::copies::front_object() {
            let p = crate::runtime::copies::next_after(front, name);
            if p != 0 {
                return p;
            }
        }
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
