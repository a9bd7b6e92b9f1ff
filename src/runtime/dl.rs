//! The dynamic loader's look-up functions as pinguard itself must call them.
//!
//! pinguard exports `dlsym` and `dlvsym` (see `hooks/dlsym.rs`), so a plain call to `dlsym` from
//! pinguard's own code would come back to its own trampoline. The real functions are found
//! without calling `dlsym`: libc's own `dlsym` is read from libc's dynamic symbol table, then asked
//! for `RTLD_NEXT` from inside pinguard, which yields the next `dlsym` after pinguard (libc's, or
//! another interposer's listed later). docs/field-notes.md, "Interposing `dlsym`".

use crate::runtime::objects::for_each_object;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// Read by the trampolines' assembly: keep them private statics.
pub(crate) static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
pub(crate) static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);
static STATE: AtomicU8 = AtomicU8::new(0);

/// Finds the real functions once. Safe to call from the very first `dlsym` of the process,
/// before pinguard's constructor: it only walks the loaded objects' symbol tables.
pub fn init() {
    if STATE.load(Ordering::Acquire) == 2 {
        return;
    }
    if STATE.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
        while STATE.load(Ordering::Acquire) == 1 {
            std::hint::spin_loop();
        }
        return;
    }
    let libc_dlsym = find_in_libc(b"dlsym");
    let libc_dlvsym = find_in_libc(b"dlvsym");
    if libc_dlsym != 0 {
        // SAFETY: `libc_dlsym` is libc's non-zero default-version `dlsym`, whose C signature is `DlsymFn`.
        let f: DlsymFn = unsafe { std::mem::transmute(libc_dlsym) };
        // Called from here, RTLD_NEXT means "after pinguard".
        // SAFETY: `f` is libc's dlsym; RTLD_NEXT is a valid handle and the name a NUL-terminated literal.
        let next = unsafe { f(libc::RTLD_NEXT, c"dlsym".as_ptr()) } as usize;
        REAL_DLSYM.store(if next != 0 && !crate::runtime::objects::is_own(next) { next } else { libc_dlsym }, Ordering::Release);
        // SAFETY: `f` is libc's dlsym; RTLD_NEXT is a valid handle and the name a NUL-terminated literal.
        let next = unsafe { f(libc::RTLD_NEXT, c"dlvsym".as_ptr()) } as usize;
        let v = if next != 0 && !crate::runtime::objects::is_own(next) { next } else { libc_dlvsym };
        REAL_DLVSYM.store(v, Ordering::Release);
    }
    STATE.store(2, Ordering::Release);
}

/// `dlsym` as if pinguard did not export one; the caller seen by the loader is pinguard.
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    init();
    match REAL_DLSYM.load(Ordering::Acquire) {
        0 => std::ptr::null_mut(),
        // SAFETY: REAL_DLSYM is only ever set to a real `dlsym` (libc's or the next interposer's), and
        // `name` is a NUL-terminated CStr; the handle is the caller's, as dlsym's contract requires.
        f => unsafe { std::mem::transmute::<usize, DlsymFn>(f)(handle, name.as_ptr()) },
    }
}

pub fn real_dlvsym(handle: *mut c_void, name: &CStr, version: *const c_char) -> *mut c_void {
    init();
    match REAL_DLVSYM.load(Ordering::Acquire) {
        0 => std::ptr::null_mut(),
        // SAFETY: REAL_DLVSYM is only ever set to a real `dlvsym`; `name` is a NUL-terminated CStr and
        // handle/version are the caller's, passed on under dlvsym's own contract.
        f => unsafe { std::mem::transmute::<usize, DlvsymFn>(f)(handle, name.as_ptr(), version) },
    }
}

/// The first definition of `name` (a function or data) in the loaded objects, in load order,
/// pinguard's own excepted; 0 when none. Read from the objects' symbol tables in memory: unlike
/// `dlsym`, a miss allocates nothing (glibc formats an error string with `malloc`) and no loader
/// lock beyond `dl_iterate_phdr`'s is taken, so hooks may ask from inside a signal handler.
pub fn lookup_loaded(name: &CStr) -> usize {
    let own = crate::runtime::objects::own_range();
    let mut found = 0usize;
    for_each_object(|o| {
        if found == 0 && !(o.start <= own.0 && own.0 < o.end) {
            // SAFETY: `base` and `dynamic` come from the loader for an object mapped now.
            found = unsafe { elf_lookup(o.base, o.dynamic, name.to_bytes()) }.unwrap_or(0);
        }
    });
    found
}

/// The default-version definition of `name` in libc (or, before glibc 2.34, libdl).
fn find_in_libc(name: &[u8]) -> usize {
    let mut found = 0usize;
    for_each_object(|o| {
        let n = o.name.to_bytes();
        let file = n.rsplit(|&c| c == b'/').next().unwrap_or(n);
        if found == 0 && (file.starts_with(b"libc.so") || file.starts_with(b"libdl.so")) {
            // SAFETY: `base` and `dynamic` come from the loader for an object mapped now.
            found = unsafe { elf_lookup(o.base, o.dynamic, name) }.unwrap_or(0);
        }
    });
    found
}

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// Looks `name` up in a loaded object's dynamic symbol table (GNU hash, else SysV hash), taking
/// only a defined, default-version symbol.
unsafe fn elf_lookup(base: usize, dynamic: usize, name: &[u8]) -> Option<usize> {
    if dynamic == 0 {
        return None;
    }
    let (mut symtab, mut strtab, mut gnu_hash, mut hash, mut versym) = (0usize, 0usize, 0usize, 0usize, 0usize);
    let mut d = dynamic as *const [i64; 2];
    loop {
        // SAFETY: `d` walks the dynamic array of an object the caller guarantees mapped, up to its
        // DT_NULL entry.
        let [tag, val] = unsafe { *d };
        // The loader relocates these in place on most targets; not on all.
        let ptr = if (val as usize) < base { base + val as usize } else { val as usize };
        match tag {
            DT_NULL => break,
            DT_SYMTAB => symtab = ptr,
            DT_STRTAB => strtab = ptr,
            DT_GNU_HASH => gnu_hash = ptr,
            DT_HASH => hash = ptr,
            DT_VERSYM => versym = ptr,
            _ => {}
        }
        // SAFETY: `d` was not the DT_NULL entry, so the array goes on.
        d = unsafe { d.add(1) };
    }
    if symtab == 0 || strtab == 0 {
        return None;
    }
    let check = |i: usize| -> Option<usize> {
        // SAFETY: `i` comes from the object's own hash table, so indexes its symbol table.
        let s = unsafe { &*(symtab as *const Sym).add(i) };
        if s.shndx == 0 || s.value == 0 {
            return None;
        }
        // SAFETY: a symbol's name is a NUL-terminated string in the object's string table.
        if unsafe { CStr::from_ptr((strtab + s.name as usize) as *const c_char) }.to_bytes() != name {
            return None;
        }
        // SAFETY: the version table has one entry per symbol, and `i` is a symbol's index.
        if versym != 0 && unsafe { *(versym as *const u16).add(i) } & 0x8000 != 0 {
            return None; // a hidden, non-default version
        }
        Some(base + s.value as usize)
    };
    if gnu_hash != 0 {
        let h = name.iter().fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32));
        let hdr = gnu_hash as *const u32;
        // SAFETY: the mapped GNU hash table starts with its four-word header.
        let (nbuckets, symoffset, bloom_size) = unsafe { (*hdr as usize, *hdr.add(1) as usize, *hdr.add(2) as usize) };
        let buckets = (gnu_hash + 16 + bloom_size * 8) as *const u32;
        // SAFETY: the chain array follows the `nbuckets` buckets, in the same table.
        let chain = unsafe { buckets.add(nbuckets) };
        // SAFETY: the index is below `nbuckets`.
        let mut i = unsafe { *buckets.add(h as usize % nbuckets) } as usize;
        if i == 0 {
            return None;
        }
        loop {
            // SAFETY: a bucket's chain runs from `symoffset` up to an entry with bit 0 set, where
            // the loop stops.
            let h2 = unsafe { *chain.add(i - symoffset) };
            if h | 1 == h2 | 1 {
                if let Some(a) = check(i) {
                    return Some(a);
                }
            }
            if h2 & 1 != 0 {
                return None;
            }
            i += 1;
        }
    }
    if hash != 0 {
        // SAFETY: the mapped SysV hash table starts with `nbucket`, `nchain`.
        let nchain = unsafe { *(hash as *const u32).add(1) } as usize;
        return (0..nchain).find_map(|i| check(i));
    }
    None
}
