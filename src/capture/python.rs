//! The calling thread's Python stack, read from CPython's own structures at allocation time.
//!
//! Only this thread's frame chain is read, and only while this thread is inside the hook: the
//! chain cannot change under us even with the GIL released (ctypes and PyTorch release it), so no
//! lock is taken, nothing in the interpreter is called (but `PyGILState_GetThisThreadState`, a
//! thread-local read), no Python object is created. Layouts: CPython 3.11 and 3.12 by offsets
//! measured against their headers, 3.13 by the `_Py_DebugOffsets` that CPython publishes at the
//! start of `_PyRuntime` for debuggers. Any other version, a free-threaded or unknown build, or a
//! process without Python gets no Python frames and no error.
//!
//! A frame is resolved (file, qualified name, line) once per distinct (code object, instruction)
//! and interned; callsites hold the ids. The code object may be freed after the call and its
//! address reused, so an interned entry also keeps the file and name objects and the first line
//! it was resolved from, and is used only while the code object at that address still has them.

use crate::runtime::guard::Thread;
use crate::runtime::lock::Mutex;
use rustc_hash::FxHashMap;
use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Where CPython keeps what a walk reads, for one minor version.
struct Layout {
    /// 3.11/3.12: `tstate->cframe`, then `cframe->current_frame`; 3.13: `tstate->current_frame`.
    tstate_cframe: Option<usize>,
    current_frame: usize,
    f_code: usize,
    f_previous: usize,
    f_instr: usize,
    f_owner: usize,
    /// The owner value of the C-stack shim frames (3.12+), which carry no Python code.
    owner_cstack: Option<u8>,
    co_filename: usize,
    co_qualname: usize,
    co_linetable: usize,
    co_firstlineno: usize,
    co_code_adaptive: usize,
    /// Frames whose instruction is before this index have not started (3.11/3.12 only).
    co_firsttraceable: Option<usize>,
    bytes_size: usize,
    bytes_sval: usize,
    str_length: usize,
    str_state: usize,
    ascii_size: usize,
    compact_size: usize,
    str_data: usize,
}

const OWNED_BY_GENERATOR: u8 = 1;

/// x86-64 and aarch64 (LP64), default (not free-threaded, not trace-refs) builds.
const PY311: Layout = Layout {
    tstate_cframe: Some(56),
    current_frame: 8,
    f_code: 32,
    f_previous: 48,
    f_instr: 56,
    f_owner: 69,
    owner_cstack: None,
    co_filename: 112,
    co_qualname: 128,
    co_linetable: 136,
    co_firstlineno: 72,
    co_code_adaptive: 184,
    co_firsttraceable: Some(168),
    bytes_size: 16,
    bytes_sval: 32,
    str_length: 16,
    str_state: 32,
    ascii_size: 48,
    compact_size: 72,
    str_data: 72,
};
const PY312: Layout = Layout {
    tstate_cframe: Some(56),
    current_frame: 0,
    f_code: 0,
    f_previous: 8,
    f_instr: 56,
    f_owner: 70,
    owner_cstack: Some(3),
    co_filename: 112,
    co_qualname: 128,
    co_linetable: 136,
    co_firstlineno: 68,
    co_code_adaptive: 192,
    co_firsttraceable: Some(176),
    bytes_size: 16,
    bytes_sval: 32,
    str_length: 16,
    str_state: 32,
    ascii_size: 40,
    compact_size: 56,
    str_data: 56,
};

/// What a walk needs, found once.
struct Python {
    layout: Layout,
    this_thread_state: unsafe extern "C" fn() -> usize,
    code_type: usize,
}

static PYTHON: AtomicPtr<Python> = AtomicPtr::new(std::ptr::null_mut());
/// When the last probe found no (known) Python, and the loader's count of objects added
/// (`dlpi_adds`) then, plus one (0: no probe yet). A probe is a function of the loaded objects'
/// symbols and static data, so it is retried only once that count has moved (an embedder may
/// load libpython later, with `dlopen`), and that count is asked at most once a second: a
/// process without Python pays one look at the symbol tables, not one a second (which also made
/// callgrind's counts per pair depend on how fast the run went).
static LAST_MISS_MS: AtomicU64 = AtomicU64::new(0);
static MISSED_AT_ADDS: AtomicU64 = AtomicU64::new(0);

#[inline(never)]
fn python() -> Option<&'static Python> {
    let p = PYTHON.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: A non-null PYTHON is a leaked Box, published once and never freed or replaced.
        return Some(unsafe { &*p });
    }
    let now = crate::runtime::clock::coarse_unix_ms();
    let last = LAST_MISS_MS.load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < 1000 {
        return None;
    }
    // Read before the probe: an object added meanwhile moves the count past this one.
    let adds = crate::capture::unwind::loader_counts().0.wrapping_add(1);
    if MISSED_AT_ADDS.load(Ordering::Relaxed) == adds {
        LAST_MISS_MS.store(now.max(1), Ordering::Relaxed);
        return None;
    }
    match probe() {
        Some(found) => {
            let leaked = Box::into_raw(Box::new(found));
            match PYTHON.compare_exchange(
                std::ptr::null_mut(),
                leaked,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                // SAFETY: `leaked` is now the published Box, leaked and never freed, so it lives for 'static.
                Ok(_) => Some(unsafe { &*leaked }),
                Err(other) => {
                    // SAFETY: `leaked` came from Box::into_raw above and lost the race, so nothing else holds it.
                    drop(unsafe { Box::from_raw(leaked) });
                    // SAFETY: The winner's pointer is a leaked Box that is never freed.
                    Some(unsafe { &*other })
                }
            }
        }
        None => {
            MISSED_AT_ADDS.store(adds, Ordering::Relaxed);
            LAST_MISS_MS.store(now.max(1), Ordering::Relaxed);
            None
        }
    }
}

fn probe() -> Option<Python> {
    // Symbol tables read in place (`dl::lookup_loaded`), not `dlsym`: a probe can run inside a
    // signal handler, and a missed `dlsym` allocates its error message with `malloc`.
    let lookup_anywhere = crate::runtime::dl::lookup_loaded;
    let version = lookup_anywhere(c"Py_Version");
    if version == 0 {
        return None; // no Python, or one older than 3.11 (which does not export it)
    }
    // SAFETY: `Py_Version` is libpython's exported `const unsigned long` (8 bytes on LP64),
    // found non-zero above, so the address is mapped and aligned.
    let version = unsafe { *(version as *const u64) };
    let layout = match (version >> 24, (version >> 16) & 0xff) {
        (3, 11) => PY311,
        (3, 12) => PY312,
        (3, 13) => debug_offsets(lookup_anywhere(c"_PyRuntime"), version)?,
        _ => return None,
    };
    let tstate = lookup_anywhere(c"PyGILState_GetThisThreadState");
    let code_type = lookup_anywhere(c"PyCode_Type");
    if tstate == 0 || code_type == 0 {
        return None;
    }
    Some(Python {
        layout,
        // SAFETY: The symbol is CPython's exported `PyThreadState *PyGILState_GetThisThreadState(void)`,
        // a C function whose ABI matches this signature (a pointer returned as usize).
        this_thread_state: unsafe {
            std::mem::transmute::<usize, unsafe extern "C" fn() -> usize>(tstate)
        },
        code_type,
    })
}

/// 3.13's `_Py_DebugOffsets` (Include/internal/pycore_runtime.h): `cookie[8]`, then `u64`s. The
/// indexes below are that struct's 3.13 layout (it changes between minor versions, hence the
/// version check). It has no `_co_firsttraceable`; the unicode data offsets follow from
/// `asciiobject_size`.
fn debug_offsets(runtime: usize, version: u64) -> Option<Layout> {
    if runtime == 0 {
        return None;
    }
    // SAFETY: Only called after the cookie check, at offsets inside 3.13's 8-aligned `_Py_DebugOffsets`,
    // which start the mapped `_PyRuntime`.
    let at = |i: usize| unsafe { *((runtime + i) as *const u64) } as usize;
    // SAFETY: `_PyRuntime` is an exported, mapped object much larger than 8 bytes, and u8 needs no alignment.
    let cookie = unsafe { std::slice::from_raw_parts(runtime as *const u8, 8) };
    if cookie != b"xdebugpy" || at(8) as u64 >> 16 != version >> 16 || at(16) != 0 {
        return None; // not the 3.13 layout, or a free-threaded build
    }
    let ascii = at(560);
    Some(Layout {
        tstate_cframe: None,
        current_frame: at(184),
        f_code: at(240),
        f_previous: at(232),
        f_instr: at(248),
        f_owner: at(264),
        owner_cstack: Some(3),
        co_filename: at(280),
        co_qualname: at(296),
        co_linetable: at(304),
        co_firstlineno: at(312),
        co_code_adaptive: at(344),
        co_firsttraceable: None,
        bytes_size: at(520),
        bytes_sval: at(528),
        str_length: at(552),
        str_state: at(544),
        ascii_size: ascii,
        compact_size: ascii + 16, // PyCompactUnicodeObject adds utf8_length and utf8
        str_data: ascii + 16,
    })
}

unsafe fn word(addr: usize) -> usize {
    // SAFETY: the caller guarantees `addr` a readable, aligned `usize`.
    unsafe { *(addr as *const usize) }
}

/// Whether this process runs a Python whose frames can be read (probing again only after a load, at most once a second).
#[inline]
pub fn known(t: &Thread) -> bool {
    found(t).is_some()
}

/// `python()`, except that without a Python found yet a thread looks again (reads the clock)
/// only on every 256th call: a process that never loads Python pays one load and a counter.
#[inline(always)]
fn found(t: &Thread) -> Option<&'static Python> {
    let p = PYTHON.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: A non-null PYTHON is a leaked Box, published once and never freed or replaced.
        return Some(unsafe { &*p });
    }
    let n = t.python_calls.get();
    t.python_calls.set(n.wrapping_add(1));
    if !n.is_multiple_of(256) {
        return None;
    }
    probe_here(t)
}

/// `python()` on pinguard's stack, not the caller's: the probe reads `/proc` and looks symbols up.
#[cold]
#[inline(never)]
fn probe_here(t: &Thread) -> Option<&'static Python> {
    crate::runtime::workstack::run(t, python)
}

/// Fills `out` with interned ids of the calling thread's Python frames, innermost first.
pub fn capture(t: &Thread, depth: usize, out: &mut [usize]) -> usize {
    let depth = depth.min(out.len());
    if depth == 0 {
        return 0;
    }
    let Some(py) = found(t) else { return 0 };
    let l = &py.layout;
    // The thread's cache lives beside its own stack, not in static TLS (`workstack::CACHES`).
    let Some(cache) = crate::runtime::workstack::caches(t) else {
        return 0;
    };
    // SAFETY: `caches` gives this thread's zeroed, aligned block of `CACHES` bytes, which lives as
    // long as the thread and holds nothing else; all-zero words are valid `Recent`s, and `Cell`
    // is !Sync, so the slice stays on this thread for this call.
    let recent: &[Cell<Recent>] =
        unsafe { std::slice::from_raw_parts(cache as *const Cell<Recent>, RECENT) };
    // SAFETY: Only this thread's own frame chain is read, while it is inside the hook, so it cannot
    // change under us; offsets match the probed version and code objects are type-checked first.
    unsafe {
        let ts = (py.this_thread_state)();
        if ts == 0 {
            return 0; // a thread Python does not know (a native thread), or no interpreter yet
        }
        let mut frame = match l.tstate_cframe {
            Some(cf) => match word(ts + cf) {
                0 => return 0,
                cframe => word(cframe + l.current_frame),
            },
            None => word(ts + l.current_frame),
        };
        let mut n = 0;
        let mut seen = 0;
        while frame != 0 && n < depth && seen < 100_000 {
            seen += 1;
            let owner = *((frame + l.f_owner) as *const u8);
            let code = word(frame + l.f_code);
            if Some(owner) != l.owner_cstack
                && code != 0
                && code.is_multiple_of(8)
                && word(code + 8) == py.code_type
            {
                let start = code + l.co_code_adaptive;
                let instr = word(frame + l.f_instr);
                let index = (instr as isize - start as isize) / 2;
                let started = match l.co_firsttraceable {
                    Some(off) => {
                        owner == OWNED_BY_GENERATOR
                            || index >= *((code + off) as *const i32) as isize
                    }
                    None => true,
                };
                if started {
                    out[n] = intern(l, recent, code, index);
                    n += 1;
                }
            }
            let previous = word(frame + l.f_previous);
            if previous == frame {
                break;
            }
            frame = previous;
        }
        n
    }
}

/// A resolved Python frame.
pub struct PyFrame {
    pub file: String,
    pub function: String,
    pub line: u32,
}

/// (code object, instruction index) -> (file object, name object, first line, id).
type Interned = FxHashMap<(usize, isize), (usize, usize, i32, usize)>;

struct Table {
    index: Interned,
    frames: Vec<PyFrame>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);
/// Beyond this many distinct frames, new ones are resolved but not kept (a process generating
/// code without end must not grow pinguard without end).
const MAX_INTERNED: usize = 1 << 20;
const RECENT: usize = 64;

/// (code object, instruction index, id, check): `check` mixes the code object's file, name and
/// first line, so a code object freed and another allocated at its address is not mistaken for it.
type Recent = (usize, isize, usize, usize);

/// This thread's last look-ups, so a loop pinning from one place takes no lock: `RECENT` of them
/// in the thread's cache block.
const _: () = assert!(RECENT * std::mem::size_of::<Recent>() <= crate::runtime::workstack::CACHES);

unsafe fn intern(l: &Layout, recent: &[Cell<Recent>], code: usize, index: isize) -> usize {
    // SAFETY: `code` is a live code object laid out as `l` says (the caller's guarantee).
    let file = unsafe { word(code + l.co_filename) };
    // SAFETY: as above.
    let name = unsafe { word(code + l.co_qualname) };
    // SAFETY: as above.
    let first = unsafe { *((code + l.co_firstlineno) as *const i32) };
    let check = file ^ name.rotate_left(17) ^ first as usize;
    let slot = &recent[(code >> 4 ^ index as usize) % RECENT];
    let e = slot.get();
    if e.0 == code && e.1 == index && e.3 == check {
        return e.2;
    }
    let id = {
        let mut t = TABLE.lock();
        let t = t.get_or_insert_with(|| Table {
            index: FxHashMap::default(),
            frames: Vec::new(),
        });
        match t.index.get(&(code, index)) {
            Some(&(f, nm, fl, id)) if f == file && nm == name && fl == first => id,
            _ => {
                let frame = PyFrame {
                    // SAFETY: the live code object's file name, a `str` of the probed layout.
                    file: unsafe { read_str(l, file) }.unwrap_or_else(|| "?".into()),
                    // SAFETY: its qualified name, likewise.
                    function: unsafe { read_str(l, name) }.unwrap_or_else(|| "?".into()),
                    // SAFETY: `code` is a live code object (the caller's guarantee).
                    line: unsafe { line_of(l, code, index, first) },
                };
                if t.frames.len() >= MAX_INTERNED {
                    t.frames.truncate(MAX_INTERNED - 1); // the last slot serves every overflow
                }
                t.frames.push(frame);
                let id = t.frames.len() - 1;
                if id < MAX_INTERNED - 1 {
                    t.index.insert((code, index), (file, name, first, id));
                }
                id
            }
        }
    };
    slot.set((code, index, id, check));
    id
}

/// The resolved frame for an id `capture` returned.
pub fn frame(id: usize, f: impl FnOnce(&PyFrame)) {
    if let Some(t) = TABLE.lock().as_ref() {
        if let Some(fr) = t.frames.get(id) {
            f(fr);
        }
    }
}

/// A `str` object's text (compact ASCII, compact 1/2/4-byte, or legacy non-compact).
unsafe fn read_str(l: &Layout, s: usize) -> Option<String> {
    if s == 0 || !s.is_multiple_of(8) {
        return None;
    }
    // SAFETY: `s` is not null, so a live `str` object of the probed layout (the caller's guarantee).
    let len = (unsafe { word(s + l.str_length) } as isize).clamp(0, 4096) as usize;
    // SAFETY: as above.
    let state = unsafe { *((s + l.str_state) as *const u32) };
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    let data = match (compact, ascii) {
        (true, true) => s + l.ascii_size,
        (true, false) => s + l.compact_size,
        // SAFETY: as above; a legacy string keeps its data pointer there.
        (false, _) => unsafe { word(s + l.str_data) },
    };
    if data == 0 {
        return None;
    }
    Some(match kind {
        // SAFETY: `data` holds the string's characters, `kind` bytes each, at least `len` of them
        // (the clamp only shortens).
        1 => unsafe { std::slice::from_raw_parts(data as *const u8, len) }
            .iter()
            .map(|&b| b as char)
            .collect(),
        // SAFETY: as above.
        2 => unsafe { std::slice::from_raw_parts(data as *const u16, len) }
            .iter()
            .map(|&c| char::from_u32(c as u32).unwrap_or('?'))
            .collect(),
        // SAFETY: as above.
        4 => unsafe { std::slice::from_raw_parts(data as *const u32, len) }
            .iter()
            .map(|&c| char::from_u32(c).unwrap_or('?'))
            .collect(),
        _ => return None,
    })
}

/// The line of instruction `index`, from the code object's location table (the format of 3.11 to
/// 3.13, Objects/locations.md); the first line where there is none.
unsafe fn line_of(l: &Layout, code: usize, index: isize, first: i32) -> u32 {
    if index < 0 {
        return first.max(0) as u32;
    }
    // SAFETY: `code` is a live code object of the probed layout (the caller's guarantee).
    let table = unsafe { word(code + l.co_linetable) };
    if table == 0 {
        return first.max(0) as u32;
    }
    // SAFETY: not null, so the code object's location table, a `bytes` object.
    let size = (unsafe { word(table + l.bytes_size) } as isize).clamp(0, 1 << 24) as usize;
    // SAFETY: a `bytes` object holds at least `size` bytes at `bytes_sval` (the clamp only shortens).
    let bytes = unsafe { std::slice::from_raw_parts((table + l.bytes_sval) as *const u8, size) };
    line_in_table(bytes, first, index)
}

/// The line of code unit `index` in a location table (Objects/locations.md) whose code starts at
/// line `first`; `first` (0 if negative) where the table gives `index` no line or ends before it.
/// An entry cut short by the table's end still counts, with what of it is there.
fn line_in_table(bytes: &[u8], first: i32, index: isize) -> u32 {
    let fallback = first.max(0) as u32;
    if index < 0 {
        return fallback;
    }
    let mut i = 0;
    let mut addr = 0isize; // in code units
    let mut line = first as i64;
    let varint = |i: &mut usize| -> u64 {
        let mut v = 0u64;
        let mut shift = 0;
        while *i < bytes.len() {
            let b = bytes[*i];
            *i += 1;
            v |= ((b & 63) as u64) << shift;
            shift += 6;
            if b & 64 == 0 || shift > 60 {
                break;
            }
        }
        v
    };
    let svarint = |i: &mut usize| -> i64 {
        let u = varint(i);
        if u & 1 == 1 {
            -((u >> 1) as i64)
        } else {
            (u >> 1) as i64
        }
    };
    while i < bytes.len() {
        let head = bytes[i];
        i += 1;
        let code = (head >> 3) & 15;
        let length = (head & 7) as isize + 1;
        let delta = match code {
            15 => 0,
            13 => svarint(&mut i),
            14 => {
                let d = svarint(&mut i);
                varint(&mut i);
                varint(&mut i);
                varint(&mut i);
                d
            }
            10..=12 => code as i64 - 10,
            _ => 0,
        };
        // The rest of the entry (columns) up to the next entry's first byte.
        while i < bytes.len() && bytes[i] & 128 == 0 {
            i += 1;
        }
        line += delta;
        if index < addr + length {
            return if code == 15 || line < 0 {
                fallback
            } else {
                line as u32
            };
        }
        addr += length;
    }
    fallback
}

/// Fork child: the table's lock may have been held by a thread that is gone.
pub fn hold() {
    crate::runtime::lock::hold(&TABLE);
}

/// # Safety
/// Only after `hold`, in the fork handlers.
pub unsafe fn let_go(child: bool) {
    // SAFETY: after `hold`, in the fork handler `child` names (this function's contract).
    unsafe { crate::runtime::lock::let_go(&TABLE, child) }
}

#[cfg(test)]
mod tests {
    use super::line_in_table;

    /// An entry's first byte and the rest, written from Objects/locations.md.
    fn entry(code: u8, units: u8, rest: &[u8]) -> Vec<u8> {
        assert!(code < 16 && (1..=8).contains(&units));
        let mut e = vec![0x80 | code << 3 | (units - 1)];
        e.extend_from_slice(rest);
        e
    }

    fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while v >= 64 {
            out.push(0x40 | (v & 63) as u8);
            v >>= 6;
        }
        out.push(v as u8);
        out
    }

    fn svarint(v: i64) -> Vec<u8> {
        varint(if v < 0 {
            (v.unsigned_abs() << 1) | 1
        } else {
            (v as u64) << 1
        })
    }

    fn long(delta: i64, end_delta: u64, col: u64, end_col: u64) -> Vec<u8> {
        [
            svarint(delta),
            varint(end_delta),
            varint(col),
            varint(end_col),
        ]
        .concat()
    }

    #[test]
    fn encoders_match_the_format() {
        assert_eq!(varint(5), [5]);
        assert_eq!(varint(200), [0x48, 0x03]);
        assert_eq!(svarint(-1), [3]);
        assert_eq!(svarint(100), [0x48, 0x03]);
        assert_eq!(svarint(-100), [0x49, 0x03]);
        assert_eq!(entry(14, 8, &[]), [0xf7]);
    }

    #[test]
    fn every_entry_kind() {
        let table = [
            entry(3, 2, &[0x12]),                 // units 0-1: short form, line 10
            entry(12, 1, &[4, 9]),                // unit 2: one-line form, +2
            entry(13, 3, &svarint(-1)),           // units 3-5: no column, -1
            entry(14, 1, &long(100, 2, 70, 5)),   // unit 6: long form, +100, two-byte varints
            entry(15, 2, &[]),                    // units 7-8: no location
            entry(10, 1, &[1, 2]),                // unit 9: one-line form, +0
            entry(14, 8, &long(-100, 0, 200, 3)), // units 10-17: long form, -100
            entry(11, 1, &[0, 0]),                // unit 18: one-line form, +1
        ]
        .concat();
        let lines: Vec<u32> = (0..20).map(|i| line_in_table(&table, 10, i)).collect();
        assert_eq!(
            lines,
            [10, 10, 12, 11, 11, 11, 111, 10, 10, 111, 11, 11, 11, 11, 11, 11, 11, 11, 12, 10]
        );
    }

    #[test]
    fn multi_byte_varints() {
        // A three-byte line delta (+5000) and column past the second byte.
        let table = [
            entry(14, 1, &long(5000, 70_000, 300_000, 1)),
            entry(13, 1, &svarint(-4999)),
        ]
        .concat();
        assert_eq!(svarint(5000).len(), 3);
        assert_eq!(line_in_table(&table, 1, 0), 5001);
        assert_eq!(line_in_table(&table, 1, 1), 2);
    }

    #[test]
    fn a_negative_line_falls_back() {
        let table = [entry(13, 1, &svarint(-5)), entry(13, 1, &svarint(6))].concat();
        assert_eq!(line_in_table(&table, 2, 0), 2);
        assert_eq!(line_in_table(&table, 2, 1), 3);
        assert_eq!(line_in_table(&table, -1, 0), 0);
    }

    #[test]
    fn outside_the_table() {
        let table = [entry(12, 4, &[0, 0])].concat();
        assert_eq!(line_in_table(&table, 7, 3), 9);
        assert_eq!(line_in_table(&table, 7, 4), 7);
        assert_eq!(line_in_table(&table, 7, 1000), 7);
        assert_eq!(line_in_table(&table, 7, -1), 7);
        assert_eq!(line_in_table(&table, 7, isize::MIN), 7);
        assert_eq!(line_in_table(&[], 7, 0), 7);
        assert_eq!(line_in_table(&[], -3, 0), 0);
    }

    #[test]
    fn a_truncated_table() {
        // The long form's line delta (+4, then a continuation) is cut after its first byte.
        let table = [entry(3, 2, &[0x12]), entry(14, 1, &[0x48])].concat();
        assert_eq!(line_in_table(&table, 10, 1), 10);
        assert_eq!(line_in_table(&table, 10, 2), 14);
        assert_eq!(line_in_table(&table, 10, 3), 10);
        // A one-line form without its column bytes, then a no-column form without its delta.
        assert_eq!(line_in_table(&entry(11, 1, &[]), 10, 0), 11);
        assert_eq!(line_in_table(&entry(13, 1, &[]), 10, 0), 10);
    }
}
