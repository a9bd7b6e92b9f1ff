//! The dynamic loader's look-up functions as pinguard itself must call them.
//!
//! pinguard exports `dlsym` and `dlvsym` (see `hooks/dlsym.rs`), so a plain call to `dlsym` from
//! pinguard's own code would come back to its own trampoline. The real functions are found
//! without calling `dlsym`: libc's own `dlsym` is read from libc's dynamic symbol table, then asked
//! for `RTLD_NEXT` from inside pinguard, which yields the next `dlsym` after pinguard (libc's, or
//! another interposer's listed later). docs/field-notes.md, "Interposing `dlsym`".

use crate::runtime::objects::for_each_object;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// Read by the trampolines' assembly: keep them private statics.
pub(crate) static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
pub(crate) static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);
static STATE: AtomicU8 = AtomicU8::new(0);
/// Set by `init` when the process's C library is one (it has `dlsym`) and not glibc (it lacks
/// `gnu_get_libc_version`): musl's. pinguard then stands down (`foreign_libc`).
static FOREIGN: AtomicBool = AtomicBool::new(false);

/// Finds the real functions once. Safe to call from the very first `dlsym` of the process,
/// before pinguard's constructor, and from inside AddressSanitizer's start-up: its runtime asks
/// `dlsym(RTLD_NEXT, ...)` for each function it intercepts, through pinguard's trampoline, while
/// its own `__tls_get_addr` (which it intercepts) has nothing to call yet. So this touches no
/// thread-local variable, allocates nothing and calls nothing such a runtime intercepts: one
/// `dl_iterate_phdr` pass reading symbol tables in memory, then libc's `dlsym`.
pub fn init() {
    if STATE.load(Ordering::Acquire) == 2 {
        return;
    }
    if STATE
        .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        while STATE.load(Ordering::Acquire) == 1 {
            std::hint::spin_loop();
        }
        return;
    }
    let found = scan_at_start();
    if found.dlsym != 0 {
        // Another copy's `dlsym` (one that stands down) is passed over like this one's own.
        let own = |a: usize| found.in_a_copy(a);
        // SAFETY: `found.dlsym` is libc's non-zero default-version `dlsym`, whose C signature is `DlsymFn`.
        let f: DlsymFn = unsafe { std::mem::transmute(found.dlsym) };
        // Called from here, RTLD_NEXT means "after pinguard".
        // SAFETY: `f` is libc's dlsym; RTLD_NEXT is a valid handle and the name a NUL-terminated literal.
        let next = unsafe { f(libc::RTLD_NEXT, c"dlsym".as_ptr()) } as usize;
        REAL_DLSYM.store(
            if next != 0 && !own(next) {
                next
            } else {
                found.dlsym
            },
            Ordering::Release,
        );
        // SAFETY: `f` is libc's dlsym; RTLD_NEXT is a valid handle and the name a NUL-terminated literal.
        let next = unsafe { f(libc::RTLD_NEXT, c"dlvsym".as_ptr()) } as usize;
        REAL_DLVSYM.store(
            if next != 0 && !own(next) {
                next
            } else {
                found.dlvsym
            },
            Ordering::Release,
        );
        FOREIGN.store(!found.glibc, Ordering::Relaxed);
    }
    STATE.store(2, Ordering::Release);
}

/// The symbol that every copy of pinguard defines and nothing else does: how a copy knows
/// another one (`runtime::copies`). Every release's C API has it.
pub(crate) const COPY_MARK: &[u8] = b"pinguard_version";

/// Whether the process's C library is not glibc (musl's): pinguard is built against glibc and
/// stands down there, every export passing its call to the C library's own function
/// (docs/internals.md, "musl processes"). Found once, by `init`; a load after that.
pub fn foreign_libc() -> bool {
    init();
    FOREIGN.load(Ordering::Relaxed)
}

/// What `init` needs from the loaded objects.
#[derive(Default)]
struct AtStart {
    dlsym: usize,
    dlvsym: usize,
    /// The C library that has `dlsym` also has `gnu_get_libc_version`.
    glibc: bool,
    /// pinguard's own object's lowest and highest address.
    own: (usize, usize),
    /// The first other copies of pinguard (`COPY_MARK`): a `dlsym` found in one of them is one
    /// that stands down, passed over for the real one.
    copies: [(usize, usize); 4],
}

impl AtStart {
    /// Whether `a` lies in this copy or another copy of pinguard.
    fn in_a_copy(&self, a: usize) -> bool {
        std::iter::once(&self.own)
            .chain(&self.copies)
            .any(|&(s, e)| s <= a && a < e)
    }
}

/// libc's `dlsym` and `dlvsym` and pinguard's own range, read inside `dl_iterate_phdr`'s
/// callback: unlike `for_each_object`, no fork gate (a thread-local counter) and no list. The
/// callback only reads mapped tables, so holding the loader's lock meanwhile is brief; it runs
/// once per process, at its first `dlsym`, before a fork could be waiting on the gate.
fn scan_at_start() -> AtStart {
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut AtStart` passed below, live for the whole walk.
        let at = unsafe { &mut *(data as *mut AtStart) };
        // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info` for the callback's duration.
        let info = unsafe { &*info };
        let base = info.dlpi_addr as usize;
        let (mut start, mut end, mut dynamic) = (usize::MAX, 0usize, 0usize);
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: `i < dlpi_phnum`, the length of the loader's program header array.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            match ph.p_type {
                // Wrapping: a panic here, inside the loader's callback, would abort the process.
                libc::PT_DYNAMIC => dynamic = base.wrapping_add(ph.p_vaddr as usize),
                libc::PT_LOAD => {
                    let at = base.wrapping_add(ph.p_vaddr as usize);
                    start = start.min(at);
                    end = end.max(at.wrapping_add(ph.p_memsz as usize));
                }
                _ => {}
            }
        }
        let probe = scan_at_start as *const () as usize;
        // SAFETY: `base` and `dynamic` come from the loader for an object mapped now.
        let copy = unsafe { elf_lookup(base, dynamic, COPY_MARK) }.is_some();
        if start <= probe && probe < end {
            at.own = (start, end);
        } else if copy {
            if let Some(free) = at.copies.iter_mut().find(|c| c.1 == 0) {
                *free = (start, end);
            }
        }
        let name: &[u8] = if info.dlpi_name.is_null() {
            b""
        } else {
            // SAFETY: a non-null `dlpi_name` is the loader's NUL-terminated name of the object.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
        };
        if is_libc(name) {
            // SAFETY: `base` and `dynamic` come from the loader for an object mapped now.
            let glibc = unsafe { elf_lookup(base, dynamic, b"gnu_get_libc_version") }.is_some();
            at.glibc |= glibc;
            if at.dlsym == 0 {
                // SAFETY: as above.
                at.dlsym = unsafe { elf_lookup(base, dynamic, b"dlsym") }.unwrap_or(0);
                // SAFETY: as above.
                at.dlvsym = unsafe { elf_lookup(base, dynamic, b"dlvsym") }.unwrap_or(0);
            }
        }
        0
    }
    let mut at = AtStart::default();
    // SAFETY: `cb` has the callback signature dl_iterate_phdr expects, and `data` is `&mut at`, an
    // `AtStart` that `cb` casts back to exactly that type, for the whole call.
    unsafe { crate::runtime::gate::iterate_phdr(cb, &mut at as *mut AtStart as *mut c_void) };
    at
}

fn file_name(path: &[u8]) -> &[u8] {
    path.rsplit(|&c| c == b'/').next().unwrap_or(path)
}

/// libc (or, before glibc 2.34, libdl, where `dlsym` lived; musl's libc is its loader).
fn is_libc(path: &[u8]) -> bool {
    let file = file_name(path);
    file.starts_with(b"libc.so") || file.starts_with(b"libdl.so") || file.starts_with(b"ld-musl-")
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
#[cfg(test)]
fn find_in_libc(name: &[u8]) -> usize {
    let mut found = 0usize;
    for_each_object(|o| {
        if found == 0 && is_libc(o.name.to_bytes()) {
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

/// The GNU hash of a symbol name (DJB's: `h * 33 + c` over the bytes, from 5381).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter()
        .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32))
}

/// The first answer `check` gives for the symbols a GNU hash table's chain offers for hash `h`,
/// asked in chain order. `word(w)` is the table's `w`-th 32-bit word: the header (`nbuckets`,
/// `symoffset`, `bloom_size`, `bloom_shift`), the bloom filter (`bloom_size` 64-bit words, not
/// consulted), the buckets, the chains. Reads only the header, the bucket of `h` and that
/// bucket's chain up to its last entry (bit 0 set).
fn gnu_walk(
    word: impl Fn(usize) -> u32,
    h: u32,
    mut check: impl FnMut(usize) -> Option<usize>,
) -> Option<usize> {
    let (nbuckets, symoffset, bloom_size) = (word(0) as usize, word(1) as usize, word(2) as usize);
    if nbuckets == 0 {
        return None; // a malformed table: nothing to walk (and no division by zero)
    }
    let buckets = 4 + bloom_size * 2;
    let chain = buckets + nbuckets;
    let mut i = word(buckets + h as usize % nbuckets) as usize;
    if i < symoffset.max(1) {
        return None; // empty bucket, or a malformed one below the hashed symbols
    }
    loop {
        let h2 = word(chain + (i - symoffset));
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
///
/// # Safety
/// `base` and `dynamic` are the load address and `PT_DYNAMIC` address of an object mapped now.
pub(crate) unsafe fn elf_lookup(base: usize, dynamic: usize, name: &[u8]) -> Option<usize> {
    if dynamic == 0 {
        return None;
    }
    let (mut symtab, mut strtab, mut gnu_table, mut hash, mut versym) =
        (0usize, 0usize, 0usize, 0usize, 0usize);
    let mut d = dynamic as *const [i64; 2];
    loop {
        // SAFETY: `d` walks the dynamic array of an object the caller guarantees mapped, up to its
        // DT_NULL entry.
        let [tag, val] = unsafe { *d };
        // The loader relocates these in place on most targets; not on all.
        let ptr = if (val as usize) < base {
            base + val as usize
        } else {
            val as usize
        };
        match tag {
            DT_NULL => break,
            DT_SYMTAB => symtab = ptr,
            DT_STRTAB => strtab = ptr,
            DT_GNU_HASH => gnu_table = ptr,
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
        if unsafe { CStr::from_ptr((strtab + s.name as usize) as *const c_char) }.to_bytes() != name
        {
            return None;
        }
        // SAFETY: the version table has one entry per symbol, and `i` is a symbol's index.
        if versym != 0 && unsafe { *(versym as *const u16).add(i) } & 0x8000 != 0 {
            return None; // a hidden, non-default version
        }
        Some(base + s.value as usize)
    };
    if gnu_table != 0 {
        let table = gnu_table as *const u32;
        let word = |w: usize| {
            // SAFETY: `gnu_walk` reads only the header, one bucket and that bucket's chain up to its
            // last entry, all words of the object's mapped GNU hash table.
            unsafe { *table.add(w) }
        };
        return gnu_walk(word, gnu_hash(name), &check);
    }
    if hash != 0 {
        // SAFETY: the mapped SysV hash table starts with `nbucket`, `nchain`.
        let nchain = unsafe { *(hash as *const u32).add(1) } as usize;
        return (0..nchain).find_map(check);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn gnu_hash_values() {
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"a"), 0x0002_b606);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
        assert_eq!(gnu_hash(b"getpid"), 0xff87_8ec2);
        assert_eq!(gnu_hash(b"dlsym"), 0x0f4d_c4ae);
    }

    /// A GNU hash table as a linker lays it out: symbols `symoffset..` are `names` grouped by
    /// bucket (the returned order), with a real bloom filter that the walk must step over.
    fn gnu_table(
        names: &[&'static [u8]],
        nbuckets: u32,
        symoffset: u32,
    ) -> (Vec<u32>, Vec<&'static [u8]>) {
        let mut order = names.to_vec();
        order.sort_by_key(|n| gnu_hash(n) % nbuckets);
        let (bloom_size, shift) = (2u32, 6u32);
        let mut bloom = vec![0u64; bloom_size as usize];
        for n in &order {
            let h = gnu_hash(n);
            bloom[(h / 64 % bloom_size) as usize] |= 1 << (h % 64) | 1 << ((h >> shift) % 64);
        }
        let mut words = vec![nbuckets, symoffset, bloom_size, shift];
        words.extend(bloom.iter().flat_map(|&w| [w as u32, (w >> 32) as u32]));
        for b in 0..nbuckets {
            words.push(
                order
                    .iter()
                    .position(|n| gnu_hash(n) % nbuckets == b)
                    .map_or(0, |k| symoffset + k as u32),
            );
        }
        for (k, n) in order.iter().enumerate() {
            let last = order
                .get(k + 1)
                .is_none_or(|m| gnu_hash(m) % nbuckets != gnu_hash(n) % nbuckets);
            words.push(gnu_hash(n) & !1 | last as u32);
        }
        (words, order)
    }

    const NAMES: [&[u8]; 6] = [b"gamma", b"beta", b"iota", b"nu", b"zeta", b"kappa"];

    /// Walks `words` for `name`, accepting a symbol of that name unless `refuse` says otherwise;
    /// returns the answer and the words read.
    fn walk(
        words: &[u32],
        order: &[&[u8]],
        symoffset: usize,
        name: &[u8],
        refuse: &[usize],
    ) -> (Option<usize>, Vec<usize>) {
        let read = RefCell::new(Vec::new());
        let word = |w: usize| {
            read.borrow_mut().push(w);
            words[w]
        };
        let found = gnu_walk(word, gnu_hash(name), |i| {
            (order[i - symoffset] == name && !refuse.contains(&i)).then_some(i)
        });
        (found, read.into_inner())
    }

    #[test]
    fn gnu_walk_finds_every_name() {
        let (words, order) = gnu_table(&NAMES, 4, 3);
        // Every bucket but 3 holds two names, and the last of bucket 0 has an even hash (its stop
        // bit is not part of the hash).
        let bucket = |n: &[u8]| gnu_hash(n) % 4;
        assert_eq!(
            order.iter().map(|n| bucket(n)).collect::<Vec<_>>(),
            [0, 0, 1, 1, 2, 2]
        );
        assert_eq!(gnu_hash(order[1]) & 1, 0);
        for (k, name) in order.iter().enumerate() {
            assert_eq!(
                walk(&words, &order, 3, name, &[]).0,
                Some(3 + k),
                "{}",
                String::from_utf8_lossy(name)
            );
        }
    }

    #[test]
    fn a_malformed_table_finds_nothing_and_does_not_panic() {
        // No buckets at all.
        assert_eq!(
            gnu_walk(|w| [0u32, 1, 1, 6, 0, 0][w], gnu_hash(b"getpid"), Some),
            None
        );
        // One bucket naming symbol 1, below `symoffset` 5.
        assert_eq!(
            gnu_walk(
                |w| [1u32, 5, 1, 6, 0, 0, 1, 0][w],
                gnu_hash(b"getpid"),
                Some
            ),
            None
        );
    }

    #[test]
    fn gnu_walk_misses() {
        let (words, order) = gnu_table(&NAMES, 4, 3);
        let chain = 4 + 4 + 4; // header, bloom (two 64-bit words), buckets
                               // Bucket 3 is empty: nothing past the bucket is read.
        assert_eq!(gnu_hash(b"alpha") % 4, 3);
        assert_eq!(
            walk(&words, &order, 3, b"alpha", &[]),
            (None, vec![0, 1, 2, 8 + 3])
        );
        // Bucket 2 holds iota and kappa: both chain entries are read, then the walk stops.
        assert_eq!(gnu_hash(b"sigma") % 4, 2);
        assert_eq!(
            walk(&words, &order, 3, b"sigma", &[]),
            (None, vec![0, 1, 2, 8 + 2, chain + 4, chain + 5])
        );
    }

    #[test]
    fn gnu_walk_goes_on_past_a_refused_symbol() {
        // Two versions of `dup` share a bucket; the first is refused (as a hidden version is).
        let (words, order) = gnu_table(&[b"beta", b"dup", b"iota", b"dup"], 2, 1);
        let dups: Vec<usize> = (0..order.len())
            .filter(|&k| order[k] == b"dup")
            .map(|k| 1 + k)
            .collect();
        assert_eq!(dups.len(), 2);
        assert_eq!(walk(&words, &order, 1, b"dup", &[]).0, Some(dups[0]));
        assert_eq!(walk(&words, &order, 1, b"dup", &dups[..1]).0, Some(dups[1]));
        assert_eq!(walk(&words, &order, 1, b"dup", &dups).0, None);
    }

    /// A loaded object's dynamic symbol table in memory, for `elf_lookup`.
    struct Image {
        syms: Vec<Sym>,
        strtab: Vec<u8>,
        gnu: Vec<u32>,
        hash: Vec<u32>,
        versym: Vec<u16>,
    }

    /// Symbol 0 is the null symbol; then `(name, shndx, value, versym)`, in GNU hash order.
    fn image(syms: &[(&'static [u8], u16, u64, u16)]) -> Image {
        let (gnu, order) = gnu_table(&syms.iter().map(|s| s.0).collect::<Vec<_>>(), 2, 1);
        let mut image = Image {
            syms: vec![Sym {
                name: 0,
                info: 0,
                other: 0,
                shndx: 0,
                value: 0,
                size: 0,
            }],
            strtab: vec![0],
            gnu,
            hash: vec![1, 1 + syms.len() as u32], // `elf_lookup` reads only `nchain` of it
            versym: vec![0],
        };
        let mut used = vec![false; syms.len()];
        for name in order {
            let k = (0..syms.len())
                .find(|&k| !used[k] && syms[k].0 == name)
                .unwrap();
            used[k] = true;
            let (_, shndx, value, versym) = syms[k];
            image.syms.push(Sym {
                name: image.strtab.len() as u32,
                info: 0x12,
                other: 0,
                shndx,
                value,
                size: 8,
            });
            image.strtab.extend_from_slice(name);
            image.strtab.push(0);
            image.versym.push(versym);
        }
        image
    }

    impl Image {
        /// The dynamic array with the given tags, as addresses less `relative_to`.
        fn dynamic(&self, tags: &[i64], relative_to: usize) -> Vec<[i64; 2]> {
            let mut d: Vec<[i64; 2]> = tags
                .iter()
                .map(|&t| {
                    let at = match t {
                        DT_SYMTAB => self.syms.as_ptr() as usize,
                        DT_STRTAB => self.strtab.as_ptr() as usize,
                        DT_GNU_HASH => self.gnu.as_ptr() as usize,
                        DT_HASH => self.hash.as_ptr() as usize,
                        DT_VERSYM => self.versym.as_ptr() as usize,
                        _ => unreachable!(),
                    };
                    [t, (at - relative_to) as i64]
                })
                .collect();
            d.push([0x1d, 77]); // a tag the look-up ignores (DT_RUNPATH)
            d.push([DT_NULL, 0]);
            d
        }

        fn lowest(&self) -> usize {
            [
                self.syms.as_ptr() as usize,
                self.strtab.as_ptr() as usize,
                self.gnu.as_ptr() as usize,
            ]
            .into_iter()
            .chain([self.hash.as_ptr() as usize, self.versym.as_ptr() as usize])
            .min()
            .unwrap()
        }
    }

    const ALL: [i64; 5] = [DT_SYMTAB, DT_STRTAB, DT_GNU_HASH, DT_HASH, DT_VERSYM];

    fn sample() -> Image {
        image(&[
            (b"alpha", 1, 0x10, 2),
            (b"undef", 0, 0x20, 1),
            (b"zero", 1, 0, 1),
            (b"hidden", 1, 0x28, 0x8002),
            (b"dup", 1, 0x30, 0x8002),
            (b"dup", 1, 0x40, 3),
        ])
    }

    fn lookup(base: usize, dynamic: &[[i64; 2]], name: &[u8]) -> Option<usize> {
        // SAFETY: `dynamic` ends with DT_NULL, and every table it names is a live buffer of the
        // image, laid out as an object's are (its hash tables over its symbols, names and versions).
        unsafe { elf_lookup(base, dynamic.as_ptr() as usize, name) }
    }

    #[test]
    fn elf_lookup_through_the_gnu_hash() {
        let im = sample();
        let base = 0x1000; // below every buffer: the entries are taken as addresses
        let d = im.dynamic(&ALL, 0);
        assert_eq!(lookup(base, &d, b"alpha"), Some(base + 0x10));
        assert_eq!(lookup(base, &d, b"dup"), Some(base + 0x40));
        assert_eq!(lookup(base, &d, b"undef"), None);
        assert_eq!(lookup(base, &d, b"zero"), None);
        assert_eq!(lookup(base, &d, b"hidden"), None);
        assert_eq!(lookup(base, &d, b"missing"), None);
        assert_eq!(lookup(base, &d, b"alph"), None);
        // Without a version table, no version is hidden.
        let d = im.dynamic(&[DT_SYMTAB, DT_STRTAB, DT_GNU_HASH], 0);
        assert_eq!(lookup(base, &d, b"hidden"), Some(base + 0x28));
        assert_eq!(lookup(base, &d, b"dup"), Some(base + 0x30));
    }

    #[test]
    fn elf_lookup_through_the_sysv_hash() {
        let im = sample();
        let base = 0x1000;
        let d = im.dynamic(&[DT_SYMTAB, DT_STRTAB, DT_HASH, DT_VERSYM], 0);
        assert_eq!(lookup(base, &d, b"alpha"), Some(base + 0x10));
        assert_eq!(lookup(base, &d, b"dup"), Some(base + 0x40));
        assert_eq!(lookup(base, &d, b"undef"), None);
        assert_eq!(lookup(base, &d, b"hidden"), None);
        assert_eq!(lookup(base, &d, b"missing"), None);
    }

    #[test]
    fn elf_lookup_with_offsets_from_the_base() {
        // Entries below the base are offsets from it, as where the loader does not relocate them.
        let im = sample();
        let base = im.lowest() - 8;
        let d = im.dynamic(&ALL, base);
        assert!(d.iter().take(ALL.len()).all(|e| (e[1] as usize) < base));
        assert_eq!(lookup(base, &d, b"alpha"), Some(base + 0x10));
        assert_eq!(lookup(base, &d, b"hidden"), None);
    }

    #[test]
    fn elf_lookup_without_tables() {
        let im = sample();
        assert_eq!(
            lookup(
                0x1000,
                &im.dynamic(&[DT_STRTAB, DT_GNU_HASH, DT_HASH], 0),
                b"alpha"
            ),
            None
        );
        assert_eq!(
            lookup(
                0x1000,
                &im.dynamic(&[DT_SYMTAB, DT_GNU_HASH, DT_HASH], 0),
                b"alpha"
            ),
            None
        );
        assert_eq!(
            lookup(0x1000, &im.dynamic(&[DT_SYMTAB, DT_STRTAB], 0), b"alpha"),
            None
        );
        // SAFETY: a null dynamic section is refused before anything is read.
        assert_eq!(unsafe { elf_lookup(0x1000, 0, b"alpha") }, None);
    }

    #[test]
    fn elf_lookup_finds_getpid_in_libc() {
        let mut found = Vec::new();
        for_each_object(|o| {
            let n = o.name.to_bytes();
            let file = n.rsplit(|&c| c == b'/').next().unwrap_or(n);
            if file.starts_with(b"libc.so") {
                // SAFETY: `base` and `dynamic` come from the loader for an object mapped now (libc
                // stays loaded for the whole test process).
                found.push(unsafe { elf_lookup(o.base, o.dynamic, b"getpid") });
            }
        });
        assert_eq!(found, [Some(libc::getpid as *const () as usize)]);
        assert_eq!(find_in_libc(b"getpid"), libc::getpid as *const () as usize);
        assert_eq!(find_in_libc(b"no_such_function_in_libc"), 0);
    }

    #[test]
    fn the_start_up_scan_finds_libc_and_pinguard() {
        let at = scan_at_start();
        assert_ne!(at.dlsym, 0);
        assert_eq!(at.dlsym, find_in_libc(b"dlsym"));
        assert_eq!(at.dlvsym, find_in_libc(b"dlvsym"));
        let probe = scan_at_start as *const () as usize;
        assert!(
            at.own.0 <= probe && probe < at.own.1,
            "{:x?} holds {probe:x}",
            at.own
        );
        assert_eq!(at.own, crate::runtime::objects::own_range());
    }
}
