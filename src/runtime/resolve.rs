//! Finding the real function behind each hook.
//!
//! `dlsym(RTLD_NEXT)` first; when the runtime was loaded `RTLD_LOCAL` (ctypes, Python extension
//! modules) that finds nothing, so fall back to asking each loaded object in turn. A miss is never
//! cached: the runtime may be loaded later. No `Once`: resolution can re-enter a hook on this
//! thread, and an atomic that tolerates two racing look-ups cannot deadlock.

use std::ffi::{CStr, CString};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Real {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Real {
    pub const fn new(name: &'static CStr) -> Real {
        Real { name, addr: AtomicUsize::new(0) }
    }

    #[inline(always)]
    pub fn addr(&self) -> Option<usize> {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return Some(a);
        }
        self.resolve()
    }

    /// The first call's look-up, out of line so that every later call is a load and a jump.
    #[cold]
    #[inline(never)]
    fn resolve(&self) -> Option<usize> {
        let a = lookup(self.name);
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
        self.addr().map(|a| std::mem::transmute_copy::<usize, F>(&a))
    }
}

/// The address range of pinguard's own loaded object, for telling its frames and symbols apart.
pub fn own_range() -> (usize, usize) {
    static START: AtomicUsize = AtomicUsize::new(0);
    static END: AtomicUsize = AtomicUsize::new(0);
    let s = START.load(Ordering::Relaxed);
    if s != 0 {
        return (s, END.load(Ordering::Relaxed));
    }
    let probe = own_range as *const () as usize;
    let mut range = (0usize, 0usize);
    for_each_object(|obj| {
        if obj.contains(probe) {
            range = (obj.start, obj.end);
        }
    });
    if range.0 != 0 {
        END.store(range.1, Ordering::Relaxed);
        START.store(range.0, Ordering::Relaxed);
    }
    range
}

pub fn is_own(addr: usize) -> bool {
    let (s, e) = own_range();
    addr >= s && addr < e
}

/// One loaded ELF object, as `dl_iterate_phdr` reports it.
pub struct Object {
    pub name: CString,
    pub base: usize,
    /// Lowest and highest address of its `PT_LOAD` segments.
    pub start: usize,
    pub end: usize,
    pub build_id: Option<String>,
    /// The address of its `PT_DYNAMIC` segment (0: none).
    pub dynamic: usize,
}

impl Object {
    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.start && addr < self.end
    }
}

/// Calls `f` for every loaded object. The callback runs outside `dl_iterate_phdr`'s lock: what it
/// does (dlopen, dlsym) may take the loader's locks itself.
pub fn for_each_object(mut f: impl FnMut(&Object)) {
    let mut objects: Vec<Object> = Vec::new();
    unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        let objects = &mut *(data as *mut Vec<Object>);
        let info = &*info;
        let name = if info.dlpi_name.is_null() {
            CString::default()
        } else {
            CStr::from_ptr(info.dlpi_name).to_owned()
        };
        let base = info.dlpi_addr as usize;
        let (mut start, mut end) = (usize::MAX, 0usize);
        let mut build_id = None;
        let mut dynamic = 0;
        for i in 0..info.dlpi_phnum as usize {
            let ph = &*info.dlpi_phdr.add(i);
            if ph.p_type == libc::PT_DYNAMIC {
                dynamic = base + ph.p_vaddr as usize;
            }
            if ph.p_type == libc::PT_LOAD {
                start = start.min(base + ph.p_vaddr as usize);
                end = end.max(base + ph.p_vaddr as usize + ph.p_memsz as usize);
            } else if ph.p_type == libc::PT_NOTE && build_id.is_none() {
                build_id = find_build_id(base + ph.p_vaddr as usize, ph.p_memsz as usize);
            }
        }
        if start < end {
            objects.push(Object { name, base, start, end, build_id, dynamic });
        }
        0
    }
    {
        let _open = crate::runtime::gate::enter();
        // SAFETY: `cb` has the callback signature dl_iterate_phdr expects, and `data` is `&mut objects`,
        // a live Vec<Object> that `cb` casts back to exactly that type, for the whole call.
        unsafe { libc::dl_iterate_phdr(Some(cb), &mut objects as *mut _ as *mut c_void) };
    }
    for o in &objects {
        f(o);
    }
}

/// Reads `NT_GNU_BUILD_ID` out of a mapped note segment.
unsafe fn find_build_id(mut p: usize, len: usize) -> Option<String> {
    let end = p + len;
    while p + 12 <= end {
        let namesz = *(p as *const u32) as usize;
        let descsz = *((p + 4) as *const u32) as usize;
        let ty = *((p + 8) as *const u32);
        let name = p + 12;
        let desc = name + ((namesz + 3) & !3);
        let next = desc + ((descsz + 3) & !3);
        if next > end {
            return None;
        }
        if ty == 3 && namesz == 4 && std::slice::from_raw_parts(name as *const u8, 4) == b"GNU\0" {
            let bytes = std::slice::from_raw_parts(desc as *const u8, descsz);
            return Some(bytes.iter().map(|b| format!("{b:02x}")).collect());
        }
        p = next;
    }
    None
}

fn lookup(name: &CStr) -> usize {
    // SAFETY: Names are NUL-terminated CStrs; `h` is checked non-null before use and closed once, and
    // RTLD_NOLOAD only re-references an object already loaded, so nothing new runs or unmaps.
    unsafe {
        let p = crate::runtime::dl::real_dlsym(libc::RTLD_NEXT, name) as usize;
        if p != 0 && !is_own(p) {
            return p;
        }
        let mut found = 0usize;
        for_each_object(|obj| {
            if found != 0 || obj.name.as_bytes().is_empty() || obj.contains(own_range as *const () as usize) {
                return;
            }
            let h = libc::dlopen(obj.name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if h.is_null() {
                return;
            }
            let p = crate::runtime::dl::real_dlsym(h, name) as usize;
            // dlsym(handle) also searches the object's dependencies: take only a definition that
            // lives in this object, so the search order stays the link map's.
            if p != 0 && obj.contains(p) {
                found = p;
            }
            libc::dlclose(h);
        });
        // Clear the error a failed dlsym left, so the application's next dlerror() is not ours.
        libc::dlerror();
        found
    }
}
