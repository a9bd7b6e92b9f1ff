//! The loaded ELF objects (`dl_iterate_phdr`): their ranges, build ids and dynamic sections, and
//! pinguard's own range among them. Read by the real-function look-ups (`dl`, `resolve`), the
//! stack walk, and the callsite table's module list.

use std::ffi::{CStr, CString};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The address range of pinguard's own loaded object, for telling its frames and symbols apart.
pub fn own_range() -> (usize, usize) {
    static START: AtomicUsize = AtomicUsize::new(0);
    static END: AtomicUsize = AtomicUsize::new(0);
    let s = START.load(Ordering::Relaxed);
    if s != 0 {
        return (s, END.load(Ordering::Relaxed));
    }
    // Without allocating: the constructor asks, and a process that never pins keeps no heap.
    unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `&mut range` passed below, live and unaliased for the whole walk.
        let range = unsafe { &mut *(data as *mut (usize, usize)) };
        // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info` for the callback's duration.
        let info = unsafe { &*info };
        let (start, end) = load_span(info);
        let probe = own_range as *const () as usize;
        if probe >= start && probe < end {
            *range = (start, end);
            return 1;
        }
        0
    }
    let mut range = (0usize, 0usize);
    {
        let _open = crate::runtime::gate::enter();
        // SAFETY: `cb` has the callback signature dl_iterate_phdr expects, and `data` is
        // `&mut range`, which `cb` casts back to exactly that type, for the whole call.
        unsafe { crate::runtime::gate::iterate_phdr(cb, &mut range as *mut _ as *mut c_void) };
    }
    if range.0 != 0 {
        END.store(range.1, Ordering::Relaxed);
        START.store(range.0, Ordering::Relaxed);
    }
    range
}

/// Lowest and highest address of an object's `PT_LOAD` segments.
fn load_span(info: &libc::dl_phdr_info) -> (usize, usize) {
    let base = info.dlpi_addr as usize;
    let (mut start, mut end) = (usize::MAX, 0usize);
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: `i < dlpi_phnum`, the length of the loader's program header array.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_LOAD {
            start = start.min(base + ph.p_vaddr as usize);
            end = end.max(base + ph.p_vaddr as usize + ph.p_memsz as usize);
        }
    }
    (start, end)
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
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut objects` passed below, live and unaliased for the whole walk.
        let objects = unsafe { &mut *(data as *mut Vec<Object>) };
        // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info` for the callback's duration.
        let info = unsafe { &*info };
        let name = if info.dlpi_name.is_null() {
            CString::default()
        } else {
            // SAFETY: not null, so the loader's NUL-terminated name of the object.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_owned()
        };
        let base = info.dlpi_addr as usize;
        let (mut start, mut end) = (usize::MAX, 0usize);
        let mut build_id = None;
        let mut dynamic = 0;
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: `i < dlpi_phnum`, the length of the loader's program header array.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_DYNAMIC {
                dynamic = base + ph.p_vaddr as usize;
            }
            if ph.p_type == libc::PT_LOAD {
                start = start.min(base + ph.p_vaddr as usize);
                end = end.max(base + ph.p_vaddr as usize + ph.p_memsz as usize);
            } else if ph.p_type == libc::PT_NOTE && build_id.is_none() {
                // SAFETY: the note segment of an object loaded now, mapped where the loader put it.
                build_id =
                    unsafe { find_build_id(base + ph.p_vaddr as usize, ph.p_memsz as usize) };
            }
        }
        if start < end {
            objects.push(Object {
                name,
                base,
                start,
                end,
                build_id,
                dynamic,
            });
        }
        0
    }
    {
        let _open = crate::runtime::gate::enter();
        // SAFETY: `cb` has the callback signature dl_iterate_phdr expects, and `data` is `&mut objects`,
        // a live Vec<Object> that `cb` casts back to exactly that type, for the whole call.
        unsafe { crate::runtime::gate::iterate_phdr(cb, &mut objects as *mut _ as *mut c_void) };
    }
    for o in &objects {
        f(o);
    }
}

/// How many objects the loader has unloaded so far (`dlpi_subs`): one look at the first object.
pub fn unloads() -> u64 {
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        if size >= std::mem::size_of::<libc::dl_phdr_info>() {
            // SAFETY: the loader's `dl_phdr_info`, as large as the type (checked), for the
            // callback's duration; `data` is the `&mut u64` passed below.
            unsafe { *(data as *mut u64) = (*info).dlpi_subs };
        }
        1
    }
    let mut subs = 0u64;
    let _open = crate::runtime::gate::enter();
    // SAFETY: `cb` has the callback signature dl_iterate_phdr expects, and `data` is `&mut subs`,
    // which `cb` casts back to exactly that type, for the whole call.
    unsafe { crate::runtime::gate::iterate_phdr(cb, &mut subs as *mut u64 as *mut c_void) };
    subs
}

/// Reads `NT_GNU_BUILD_ID` out of a mapped note segment.
unsafe fn find_build_id(mut p: usize, len: usize) -> Option<String> {
    let end = p + len;
    while p + 12 <= end {
        // SAFETY: `p + 12 <= end`: the note header lies in the caller's mapped, 4-aligned segment.
        let namesz = unsafe { *(p as *const u32) } as usize;
        // SAFETY: as above.
        let descsz = unsafe { *((p + 4) as *const u32) } as usize;
        // SAFETY: as above.
        let ty = unsafe { *((p + 8) as *const u32) };
        let name = p + 12;
        let desc = name + ((namesz + 3) & !3);
        let next = desc + ((descsz + 3) & !3);
        if next > end {
            return None;
        }
        if ty == 3
            && namesz == 4
            // SAFETY: `namesz == 4` and `next <= end`: the name lies within the caller's segment.
            && unsafe { std::slice::from_raw_parts(name as *const u8, 4) } == b"GNU\0"
        {
            // SAFETY: `desc + descsz <= next <= end`: within the caller's segment.
            let bytes = unsafe { std::slice::from_raw_parts(desc as *const u8, descsz) };
            return Some(bytes.iter().map(|b| format!("{b:02x}")).collect());
        }
        p = next;
    }
    None
}

/// The names an object lists in `DT_NEEDED` (its dynamic section mapped at `dynamic`).
fn needed(base: usize, dynamic: usize, mut f: impl FnMut(&[u8])) {
    if dynamic == 0 {
        return;
    }
    const DT_NULL: i64 = 0;
    const DT_NEEDED: i64 = 1;
    const DT_STRTAB: i64 = 5;
    let (mut strtab, mut names) = (0usize, [0usize; 16]);
    let mut n = 0;
    let mut d = dynamic as *const [i64; 2];
    loop {
        // SAFETY: `d` walks the dynamic array of a loaded object up to its DT_NULL entry.
        let [tag, val] = unsafe { *d };
        match tag {
            DT_NULL => break,
            // The loader relocates it in place on most targets; not on all (as in `dl`).
            DT_STRTAB if (val as usize) < base => strtab = base + val as usize,
            DT_STRTAB => strtab = val as usize,
            DT_NEEDED if n < names.len() => {
                names[n] = val as usize;
                n += 1;
            }
            _ => {}
        }
        // SAFETY: `d` was not the DT_NULL entry, so the array goes on.
        d = unsafe { d.add(1) };
    }
    if strtab == 0 {
        return;
    }
    for &off in &names[..n] {
        // SAFETY: a DT_NEEDED value is a NUL-terminated string's offset in the object's DT_STRTAB.
        f(unsafe { CStr::from_ptr((strtab + off) as *const libc::c_char) }.to_bytes());
    }
}

fn file_name(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// The ranges of the objects loaded for pinguard alone: those its image lists in `DT_NEEDED` and
/// no other loaded object does (libgcc's unwinder in a C program).
pub fn only_for_own(mut f: impl FnMut(usize, usize)) {
    let own = own_range();
    let mut objects = Vec::new();
    for_each_object(|o| objects.push((o.name.clone(), o.base, o.start, o.end, o.dynamic)));
    let mut ours: Vec<Vec<u8>> = Vec::new();
    if let Some(o) = objects.iter().find(|o| o.2 == own.0) {
        needed(o.1, o.4, |n| ours.push(n.to_vec()));
    }
    for o in objects.iter().filter(|o| o.2 != own.0) {
        needed(o.1, o.4, |n| ours.retain(|m| m != n));
    }
    for o in &objects {
        if ours.iter().any(|n| n == file_name(o.0.to_bytes())) {
            f(o.2, o.3);
        }
    }
}
