//! More than one copy of pinguard in one process: a node's or a CDI preload beside `pinguard run`'s
//! from a wheel at another path, or a second copy `dlopen`ed later (`ctypes.CDLL`). Each copy has
//! statics of its own, so two acting at once each count what reaches them and each write a report
//! under the same name, the last one standing.
//!
//! The first copy in the loader's order of objects is in charge: among preloads it is the one the
//! global scope finds first, so every call the loader routes by name reaches it, and the order of
//! the objects already loaded never changes (a later `dlopen` comes after them), so every copy
//! comes to the same answer, whenever it asks. Every other copy stands down entirely: its
//! constructor does nothing (no handlers, threads or files), its hooks pass calls through to the
//! real function as when disabled, its C API answers with the copy in charge's, and the copy in
//! charge never takes one of its exports for a real function (`resolve`, `dl`).
//!
//! A copy is an object that defines `dl::COPY_MARK`. The search reads symbol tables in memory
//! inside `dl_iterate_phdr` (no allocation, no `dlsym`, no thread-local), so it may run from the
//! first hooked call of a process or a constructor; it runs once per copy.

use crate::runtime::dl::{elf_lookup, COPY_MARK};
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicU8, Ordering};

const UNKNOWN: u8 = 0;
const IN_CHARGE: u8 = 1;
const STANDS_DOWN: u8 = 2;

static ROLE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// One loaded object, as the search sees it.
#[derive(Clone, Copy, Default)]
pub struct Obj {
    pub base: usize,
    pub dynamic: usize,
    pub start: usize,
    pub end: usize,
}

impl Obj {
    pub fn contains(&self, a: usize) -> bool {
        self.start <= a && a < self.end
    }

    /// Whether this object is a copy of pinguard (this one or another).
    ///
    /// # Safety
    /// `base` and `dynamic` came from the loader for an object mapped now.
    pub unsafe fn is_copy(&self) -> bool {
        // SAFETY: the caller's promise.
        unsafe { elf_lookup(self.base, self.dynamic, COPY_MARK) }.is_some()
    }

    /// The first stage's `pinguard_front` if this object is `libpinguard-lazy.so` (`front`):
    /// a copy by its exports, never the one in charge (it sends every call to this library).
    ///
    /// # Safety
    /// As `is_copy`.
    pub unsafe fn front(&self) -> Option<usize> {
        // SAFETY: the caller's promise.
        unsafe { elf_lookup(self.base, self.dynamic, crate::runtime::front::MARK) }
    }
}

/// Whether this copy is the one in charge of the process. One load after the first answer.
#[inline]
pub fn in_charge() -> bool {
    match ROLE.load(Ordering::Acquire) {
        IN_CHARGE => true,
        STANDS_DOWN => false,
        _ => decide(),
    }
}

#[cold]
#[inline(never)]
fn decide() -> bool {
    // No copy found at all (a symbol table it cannot read): this one acts, as it always did.
    let on = leader().is_none();
    ROLE.store(if on { IN_CHARGE } else { STANDS_DOWN }, Ordering::Release);
    on
}

/// The copy in charge's export `name` when this copy stands down (and the other has it): what
/// this copy's C API forwards to.
pub fn in_charge_export(name: &CStr) -> Option<usize> {
    if in_charge() {
        return None;
    }
    // Found again each time (the C API is no hot path): a `dlopen`ed copy in charge may have been
    // closed since.
    let o = leader()?;
    // SAFETY: `o` came from the loader for an object mapped now.
    unsafe { elf_lookup(o.base, o.dynamic, name.to_bytes()) }
}

/// The first copy of pinguard in the loader's order when it is another one than this; a first
/// stage before it (`front`) is passed over and, when this copy leads, kept for `front::attach`.
fn leader() -> Option<Obj> {
    let probe = leader as *const () as usize;
    let mut front = None;
    // SAFETY: `first` passes objects the loader reports mapped, inside its walk.
    let lead = first(|o| match unsafe { o.front() } {
        Some(f) => {
            front = front.or(Some((*o, f)));
            false
        }
        // SAFETY: as above.
        None => unsafe { o.is_copy() },
    });
    match lead {
        Some(o) if o.contains(probe) => {
            if let Some((obj, record)) = front {
                let _ = FRONT.set(obj);
                crate::runtime::front::found(record);
            }
            None
        }
        other => other,
    }
}

/// The first stage that loaded this copy (`front`), when one did: the real functions are the
/// definitions after it, as `dlsym(RTLD_NEXT)` finds them from the stage (from this copy, loaded
/// last, it would pass over every interposer preloaded after the stage).
static FRONT: std::sync::OnceLock<Obj> = std::sync::OnceLock::new();

/// That stage's object.
pub fn front_object() -> Option<&'static Obj> {
    FRONT.get()
}

/// The other copy of pinguard that holds address `a`, if any.
pub fn other_copy_at(a: usize) -> Option<Obj> {
    let probe = other_copy_at as *const () as usize;
    // SAFETY: `first` passes objects the loader reports mapped, inside its walk.
    first(|o| o.contains(a) && !o.contains(probe) && unsafe { o.is_copy() })
}

/// The first definition of `name` in the objects loaded after `copy`, in the loader's order, other
/// copies of pinguard passed over: what `dlsym(RTLD_NEXT)` would have found if `copy` were not
/// there. Read from symbol tables in memory: no `dlopen`, `dlclose` or `dlsym`, which pinguard
/// hooks and may be resolving just now. 0 when none.
pub fn next_after(copy: &Obj, name: &CStr) -> usize {
    let (mut past, mut found) = (false, 0usize);
    first(|o| {
        if !past {
            past = o.start == copy.start;
            return false;
        }
        // SAFETY: `first` passes objects the loader reports mapped, inside its walk.
        if unsafe { o.is_copy() } {
            return false;
        }
        // SAFETY: as above.
        found = unsafe { elf_lookup(o.base, o.dynamic, name.to_bytes()) }.unwrap_or(0);
        found != 0
    });
    found
}

/// The first loaded object, in the loader's order, for which `pick` says yes.
fn first(mut pick: impl FnMut(&Obj) -> bool) -> Option<Obj> {
    struct Walk<'a> {
        pick: &'a mut dyn FnMut(&Obj) -> bool,
        found: Option<Obj>,
    }
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut Walk` passed below, live and unaliased for the whole walk.
        let walk = unsafe { &mut *(data as *mut Walk) };
        // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info` for the callback's duration.
        let info = unsafe { &*info };
        let base = info.dlpi_addr as usize;
        let mut o = Obj {
            base,
            start: usize::MAX,
            ..Obj::default()
        };
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: `i < dlpi_phnum`, the length of the loader's program header array.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            // Wrapping: a panic here, inside the loader's callback, would abort the process.
            let at = base.wrapping_add(ph.p_vaddr as usize);
            match ph.p_type {
                libc::PT_DYNAMIC => o.dynamic = at,
                libc::PT_LOAD => {
                    o.start = o.start.min(at);
                    o.end = o.end.max(at.wrapping_add(ph.p_memsz as usize));
                }
                _ => {}
            }
        }
        if o.start < o.end && (walk.pick)(&o) {
            walk.found = Some(o);
            return 1; // stops the walk
        }
        0
    }
    let mut walk = Walk {
        pick: &mut pick,
        found: None,
    };
    // SAFETY: `cb` has the callback signature dl_iterate_phdr expects, and `data` is `&mut walk`,
    // a `Walk` that `cb` casts back to exactly that type, for the whole call.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut walk as *mut Walk as *mut c_void) };
    walk.found
}
