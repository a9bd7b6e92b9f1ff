//! Where the live figures live: an arena that is a file-backed shared mapping next to the report
//! (`pinguard_common::state`), so that the kernel keeps the latest figures in the file however
//! the process ends. The per-thread counter blocks, the process's and each entry point's levels,
//! the callsites with their frames, the live-allocation tables and the module list are placed
//! here and updated in place: keeping the state costs no write beyond the ones pinguard makes
//! anyway, and needs no periodic copy.
//!
//! The arena is one range of address space reserved at the first allocation (so objects never
//! move and point at each other with plain addresses); it is backed by the file as it grows. The
//! file is reopened by its path for each growth and checked to be the same file (pinguard keeps
//! no descriptor open: the application may close or reuse any). Blocks are given to the file
//! with `fallocate` before they are mapped, so that a full disk makes pinguard fall back to
//! anonymous memory (and mark the state incomplete) instead of raising `SIGBUS` in the program.
//! Where there is no file (secure mode, an unwritable folder), the arena is anonymous memory and
//! everything works as before, without the state.

use crate::runtime::lock::Mutex;
use pinguard_common::state::{self, header};
use std::ffi::CString;
use std::ptr;
use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// The first piece of the arena; each later one doubles, up to `MAX_STEP`. Pieces are separate
/// mappings where the kernel puts them: a reservation of address space ahead of use would count
/// in the process's size, which `mlockall(MCL_CURRENT)` checks against `RLIMIT_MEMLOCK`.
const FIRST_STEP: usize = 256 << 10;
const MAX_STEP: usize = 64 << 20;

struct Arena {
    /// The pieces mapped so far: (address, length, offset in the file or `NOT_IN_FILE`).
    pieces: [(usize, usize, u64); state::PIECES],
    n: usize,
    /// Bytes handed out of the last piece.
    used: usize,
    /// The file's length: where the next piece goes in it.
    file_len: u64,
    file: Option<File>,
    /// Whether new pieces still come from the file (false for good after one could not).
    grows: bool,
    /// Set when the first piece could not be mapped: the arena is never made, and everything
    /// stays where it was counted from the start (pinguard's heap, `ledger`'s own levels).
    never: bool,
    /// Whether everything is in the file: cleared for good when anything had to go elsewhere.
    complete: bool,
    /// Address space for the first piece, taken when pinguard starts (`prepare`): a mapping made
    /// at the first pinning call would land where the application had just unmapped something,
    /// and the application could see it there.
    spare: Option<usize>,
}

const NOT_IN_FILE: u64 = u64::MAX;

struct File {
    path: CString,
    dev: u64,
    ino: u64,
}

static ARENA: Mutex<Arena> = Mutex::new(Arena {
    pieces: [(0, 0, 0); state::PIECES],
    n: 0,
    used: 0,
    file_len: 0,
    file: None,
    grows: false,
    never: false,
    complete: true,
    spare: None,
});

/// Where the state file goes and what its header says of the process. The output stage knows
/// both (the report's path template and the names this process writes under, the
/// configuration); the composition layer hands them over at start-up, and they are asked when
/// the first piece is made (a fork child's has its pid).
pub struct Place {
    /// The state file's path for naming attempt `n` (0: beside the report; later ones
    /// unpredictable), its folder made first with `true`; `None` where no file may be.
    pub path: Box<dyn Fn(u32, bool) -> Option<std::path::PathBuf> + Send + Sync>,
    /// Told the path and (device, inode) the state took; `false` when the name is not to be
    /// used after all (the report's name beside it is another process's).
    pub taken: fn(&std::path::Path, (u64, u64)) -> bool,
    /// The process and configuration as JSON (`pinguard_common::state::Info`).
    pub info: Box<dyn Fn() -> Vec<u8> + Send + Sync>,
    /// Told where the levels are placed, once the header exists (`ledger::use_levels`).
    pub levels: fn(*mut u8),
}

static PLACE: std::sync::OnceLock<Place> = std::sync::OnceLock::new();

/// Takes the address space of the first piece (no memory: nothing is written until the first
/// pinning call), away from the program's mappings (`runtime::space`): set-up comes with the
/// first hooked call, after the program has mapped and unmapped memory of its own.
pub fn prepare(place: Place) {
    let _ = PLACE.set(place);
    let mut a = ARENA.lock();
    if a.n == 0 && a.spare.is_none() {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        a.spare = sys_mmap(
            crate::runtime::space::hint(FIRST_STEP),
            FIRST_STEP,
            libc::PROT_NONE,
            flags,
            -1,
            0,
        );
    }
}

/// The header, once the arena exists.
static HEADER: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());

fn sys_mmap(addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: u64) -> Option<usize> {
    // SAFETY: the callers let the kernel choose the address, or replace (MAP_FIXED) a piece of
    // the arena itself; nothing else of the process is touched.
    let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
    if r == -1 {
        return None;
    }
    // pinguard's own, not the program's to lock (`mlockall`): unlocked where `MCL_FUTURE` locked it.
    crate::runtime::own_maps::mapped(r as usize, len, false);
    Some(r as usize)
}

/// Places `size` zeroed bytes aligned to `align` (at most a page) in the arena: `None` when the
/// arena cannot grow, and the caller uses pinguard's heap instead.
pub fn alloc(size: usize, align: usize) -> Option<*mut u8> {
    let mut a = ARENA.lock();
    if a.never {
        return None;
    }
    loop {
        if a.n > 0 {
            let (at, len, _) = a.pieces[a.n - 1];
            let start = (at + a.used).next_multiple_of(align) - at;
            if start + size <= len {
                a.used = start + size;
                return Some((at + start) as *mut u8);
            }
        }
        // Growing makes system calls that may fail (a name already taken): errno stays the caller's.
        let e = crate::runtime::guard::errno();
        let grown = grow(&mut a, size + align);
        crate::runtime::guard::set_errno(e);
        if !grown {
            a.never = a.n == 0;
            a.complete = false;
            publish_complete(&a);
            return None;
        }
    }
}
/// Places `v` in the arena, or on pinguard's heap when the arena cannot take it (then the state
/// is marked incomplete). Never freed: for objects that live as long as the process.
pub fn leak<T>(v: T) -> &'static mut T {
    assert!(std::mem::align_of::<T>() <= 4096);
    match alloc(std::mem::size_of::<T>(), std::mem::align_of::<T>()) {
        Some(p) => {
            let p = p as *mut T;
            // SAFETY: `alloc` gave `size_of::<T>()` fresh bytes aligned for `T`, never handed out again.
            unsafe {
                p.write(v);
                &mut *p
            }
        }
        None => Box::leak(Box::new(v)),
    }
}

/// Copies `items` into the arena (or the heap, as `leak`).
pub fn leak_slice<T: Copy>(items: &[T]) -> &'static [T] {
    if items.is_empty() {
        return &[];
    }
    match alloc(std::mem::size_of_val(items), std::mem::align_of::<T>()) {
        Some(p) => {
            // SAFETY: fresh bytes, room for `items.len()` values of `T`, aligned for it.
            unsafe {
                ptr::copy_nonoverlapping(items.as_ptr(), p as *mut T, items.len());
                std::slice::from_raw_parts(p as *const T, items.len())
            }
        }
        None => Box::leak(items.to_vec().into_boxed_slice()),
    }
}

/// Gives back a table `alloc` made: its whole pages go back to the system (a hole in the file,
/// or nothing behind an anonymous piece). The range is not handed out again: reusing a hole would
/// need its blocks allocated again first, or a full disk would fault the program.
pub fn give_back(p: *mut u8, size: usize) {
    let a = ARENA.lock();
    let Some(i) = piece_of(&a, p as usize) else {
        return;
    };
    let (start, end) = (
        (p as usize).next_multiple_of(4096),
        (p as usize + size) & !4095,
    );
    if end > start {
        let advice = if a.pieces[i].2 == NOT_IN_FILE {
            libc::MADV_DONTNEED
        } else {
            libc::MADV_REMOVE
        };
        let e = crate::runtime::guard::errno();
        // SAFETY: whole pages inside a piece of the arena that nothing uses any more (the table
        // was replaced); the file's hole or the fresh zero pages are never read as a table again.
        unsafe { libc::syscall(libc::SYS_madvise, start, end - start, advice) };
        crate::runtime::guard::set_errno(e);
    }
}

/// Whether `p` lies in the arena (else it came from the heap).
pub fn holds(p: *const u8) -> bool {
    piece_of(&ARENA.lock(), p as usize).is_some()
}

fn piece_of(a: &Arena, p: usize) -> Option<usize> {
    a.pieces[..a.n]
        .iter()
        .position(|&(at, len, _)| p >= at && p < at + len)
}

fn header_ptr() -> Option<*mut u8> {
    let h = HEADER.load(Acquire);
    (!h.is_null()).then_some(h)
}

/// A header field the process updates (list heads, table directory).
pub fn header_word(off: usize) -> Option<&'static AtomicU64> {
    let h = header_ptr()?;
    // SAFETY: `off` is a header offset from `state::header`, 8-aligned inside the header, which
    // stays mapped for the arena's life.
    Some(unsafe { &*(h.add(off) as *const AtomicU64) })
}

/// Names the live-allocation table `dir` in the header: `cap` slots at `at` (64-byte aligned),
/// already filled. One store: a death at any moment leaves the old table or the new one named.
pub fn publish_table(dir: usize, at: usize, cap: usize) {
    debug_assert!(at.is_multiple_of(64) && cap.is_power_of_two());
    if !holds(at as *const u8) {
        return;
    }
    if let Some(w) = header_word(header::TABLES + dir * 8) {
        w.store(at as u64 | cap.trailing_zeros() as u64, Release);
    }
}

/// Puts `obj` (in the arena) at the head of the list whose head is the header field `head`,
/// with its `next` field at offset 0. Objects outside the arena are left out (the state is then
/// incomplete, which `alloc` already recorded).
pub fn push(head: usize, obj: *const u8) {
    if !holds(obj) {
        return;
    }
    let Some(h) = header_word(head) else { return };
    // SAFETY: `obj` is an arena object whose first field is its `next` (an AtomicU64-sized word),
    // not yet on any list.
    let next = unsafe { &*(obj as *const AtomicU64) };
    let mut cur = h.load(Relaxed);
    loop {
        next.store(cur, Relaxed);
        match h.compare_exchange_weak(cur, obj as u64, Release, Relaxed) {
            Ok(_) => return,
            Err(c) => cur = c,
        }
    }
}

/// Maps one more piece, of at least `min` bytes, from the file while it can.
fn grow(a: &mut Arena, min: usize) -> bool {
    if a.n == state::PIECES {
        return false;
    }
    let len = (FIRST_STEP << a.n.min(16))
        .min(MAX_STEP)
        .max(min.next_multiple_of(4096));
    let first = a.n == 0;
    if first {
        a.file = create_file();
        a.grows = a.file.is_some();
        a.complete = a.grows;
    }
    let off = a.file_len;
    // The first piece goes where `prepare` kept room for it (MAP_FIXED over that room only).
    let (hint, fixed) = match a.spare.take() {
        Some(at) if first && len == FIRST_STEP => (at, libc::MAP_FIXED),
        spare => {
            a.spare = spare;
            (0, 0)
        }
    };
    let mut at = a
        .file
        .as_ref()
        .filter(|_| a.grows)
        .and_then(|f| map_file(f, hint, fixed, off, len))
        .map(|at| (at, off));
    if at.is_none() {
        if a.grows {
            // The file keeps what it has (marked incomplete) and is still removed at exit; one
            // that could not take even the first piece holds nothing a reader could use.
            a.grows = false;
            a.complete = false;
            if first {
                remove(&a.file.take().expect("a file while it grows"));
            }
        }
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed;
        at = sys_mmap(hint, len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)
            .map(|at| (at, NOT_IN_FILE));
    }
    let Some((at, off)) = at else { return false };
    if off != NOT_IN_FILE {
        a.file_len += len as u64;
    }
    a.pieces[a.n] = (at, len, off);
    a.n += 1;
    a.used = 0;
    if first {
        init_header(a, at);
    }
    publish_piece(a, a.n - 1);
    publish_complete(a);
    true
}

/// Names piece `i` in the header, for readers to find the objects' addresses in the file.
fn publish_piece(a: &Arena, i: usize) {
    let (at, len, off) = a.pieces[i];
    let f = |k: usize| header_word(header::PIECES + i * 24 + k * 8);
    if let (Some(wa), Some(wl), Some(wo)) = (f(0), f(1), f(2)) {
        wa.store(at as u64, Relaxed);
        wo.store(off, Relaxed);
        wl.store(len as u64, Release);
    }
}

fn publish_complete(a: &Arena) {
    if let Some(w) = header_word(header::COMPLETE) {
        w.store(a.complete as u64, Relaxed);
    }
}

/// A system call with no wrapper in `sys` (`prlimit64`, `fallocate`).
fn sys(n: libc::c_long, a: [usize; 4]) -> isize {
    // SAFETY: callers pass valid pointers (an `rlimit64` buffer) for the call they name; none
    // touches memory pinguard does not own.
    unsafe { libc::syscall(n, a[0], a[1], a[2], a[3]) as isize }
}

/// Opens the state file again by its path, if the path still names it. Non-blocking: whatever
/// now sits at the path (a FIFO, say) is checked before it is used.
fn reopen(f: &File, flags: i32) -> Option<i32> {
    let fd =
        crate::runtime::sys::open(&f.path, flags | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0).ok()?;
    if crate::runtime::sys::file_id(fd).map(|id| (id.dev, id.ino)) == Some((f.dev, f.ino)) {
        return Some(fd);
    }
    crate::runtime::sys::close(fd);
    None
}

/// Names the state file tries: beside the report, then unpredictable ones.
const ATTEMPTS: u32 = 8;

/// Creates the state file exclusively, at the first name that is free. A file at a name is
/// another process's (another container's pid 1, a killed process's record, another user's) and
/// is never replaced or removed; only a state of the image this one replaced by `exec` goes.
fn create_file() -> Option<File> {
    let place = PLACE.get()?;
    let mut n = 0;
    let mut forgot = false;
    while n < ATTEMPTS {
        let path = (place.path)(n, true)?;
        let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        match crate::runtime::sys::open(&c, flags, 0o600) {
            Ok(fd) => {
                let id = crate::runtime::sys::file_id(fd);
                crate::runtime::sys::close(fd);
                let id = id?;
                let f = File {
                    path: c,
                    dev: id.dev,
                    ino: id.ino,
                };
                if (place.taken)(&path, (f.dev, f.ino)) {
                    return Some(f);
                }
                remove(&f);
            }
            Err(libc::EEXIST) if !forgot && forget(&c) => {
                forgot = true;
                continue; // the same name again, now free
            }
            Err(libc::EEXIST) => {}
            Err(_) => return None,
        }
        n += 1;
    }
    None
}

/// Moves the state file to `to`, where nothing is: the report had to take another name, and
/// the state goes beside it (a reader pairs them by name). `false` leaves it where it was.
pub fn move_to(to: &std::path::Path) -> bool {
    let Ok(to) = CString::new(to.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut a = ARENA.lock();
    let Some(f) = a.file.as_mut() else {
        return false;
    };
    let same = crate::runtime::sys::path_id(&f.path).map(|id| (id.dev, id.ino));
    if same != Some((f.dev, f.ino)) || crate::runtime::sys::rename_noreplace(&f.path, &to).is_err()
    {
        return false;
    }
    f.path = to;
    true
}

/// Maps `[off, off + len)` of the file, its blocks allocated first; `None` if the file is gone,
/// replaced, or cannot grow.
fn map_file(f: &File, hint: usize, fixed: i32, off: u64, len: usize) -> Option<usize> {
    let fd = reopen(f, libc::O_RDWR)?;
    let at = (|| {
        // A file growing past RLIMIT_FSIZE earns the process SIGXFSZ, which by default ends it.
        let mut lim = libc::rlimit64 {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let got = sys(
            libc::SYS_prlimit64,
            [
                0,
                libc::RLIMIT_FSIZE as usize,
                0,
                &mut lim as *mut libc::rlimit64 as usize,
            ],
        );
        if got != 0 || (lim.rlim_cur != libc::RLIM64_INFINITY && off + len as u64 > lim.rlim_cur) {
            return None;
        }
        if sys(libc::SYS_fallocate, [fd as usize, 0, off as usize, len]) != 0 {
            return None;
        }
        sys_mmap(
            hint,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | fixed,
            fd,
            off,
        )
    })();
    crate::runtime::sys::close(fd);
    at
}

/// The header and the levels, written before anything else is placed.
fn init_header(a: &mut Arena, base: usize) {
    let h = base as *mut u8;
    let mapped = a.pieces[0].1;
    let top = state::level::size(state::level::TOP_STRIPES);
    let levels_len = top * (1 + crate::api::Api::COUNT);
    let levels_at = header::SIZE.next_multiple_of(128);
    let info = PLACE.get().map(|p| (p.info)()).unwrap_or_default();
    let info_at = levels_at + levels_len;
    let total = info_at + info.len();
    if total > mapped {
        return; // a header this size is far below the first step
    }
    a.used = total;
    // SAFETY: `[base, base + mapped)` is mapped read-write and nothing else uses it yet; the
    // offsets are the header's (`state::header`), inside `total`.
    unsafe {
        ptr::copy_nonoverlapping(info.as_ptr(), h.add(info_at), info.len());
        let w = |off: usize, v: u64| (h.add(off) as *mut u64).write(v);
        (h.add(header::VERSION) as *mut u32).write(state::VERSION);
        (h.add(header::API_COUNT) as *mut u32).write(crate::api::Api::COUNT as u32);
        w(header::ENDIAN, state::ENDIAN);
        (h.add(header::PID) as *mut u32).write(crate::runtime::kernel::raw_pid() as u32);
        (h.add(header::PID_NS) as *mut u32).write(pid_ns());
        w(header::START_TICKS, crate::runtime::kernel::start_ticks());
        w(header::START_UNIX_MS, crate::runtime::clock::start_ms());
        w(header::INFO, (base + info_at) as u64);
        w(header::INFO_LEN, info.len() as u64);
        w(header::LEVELS, (base + levels_at) as u64);
        w(header::USED, total as u64);
        ptr::copy_nonoverlapping(state::MAGIC.as_ptr(), h, 8);
    }
    if let Some(p) = PLACE.get() {
        (p.levels)((base + levels_at) as *mut u8);
    }
    HEADER.store(h, Release);
}

/// At start-up: a state at this process's path left by the image this one replaced (`exec`
/// keeps the pid and the start time) is not a death to report; the pinned memory went with the
/// image. Another process's state (a reused pid, another container's pid 1) is left for its
/// readers.
pub fn forget_previous_image() {
    let Some(path) = PLACE.get().and_then(|p| (p.path)(0, false)) else {
        return;
    };
    if let Ok(path) = CString::new(path.into_os_string().into_encoded_bytes()) {
        forget(&path);
    }
}

/// `forget_previous_image` for a process that never set pinguard up (at its exit): the path given.
pub fn forget_previous_image_at(path: std::path::PathBuf) {
    if let Ok(path) = CString::new(path.into_os_string().into_encoded_bytes()) {
        forget(&path);
    }
}

/// Removes the state at `path` if it is this process's own: a regular file of this user's whose
/// header names this pid and start time (the image `exec` replaced). Whether it did.
fn forget(path: &CString) -> bool {
    // Non-blocking, and only a regular file is read: a FIFO planted at the path must not hold
    // up the start of every program.
    let Ok(fd) = crate::runtime::sys::open(
        path,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    ) else {
        return false;
    };
    let mut head = [0u8; header::START_TICKS + 8];
    let ns = header::PID_NS;
    let st = crate::runtime::sys::stat(fd);
    // SAFETY: geteuid has no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let mine = st
        .as_ref()
        .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == euid);
    let n = if mine {
        crate::runtime::sys::read(fd, &mut head).unwrap_or(0)
    } else {
        0
    };
    crate::runtime::sys::close(fd);
    let own = n == head.len()
        && state::is_state(&head)
        && head[ns..ns + 4] == pid_ns().to_ne_bytes()
        && state::owner(&head)
            == Some((
                crate::runtime::kernel::raw_pid() as u32,
                crate::runtime::kernel::start_ticks(),
            ));
    let Some(st) = st.filter(|_| own) else {
        return false;
    };
    remove(&File {
        path: path.clone(),
        dev: st.st_dev,
        ino: st.st_ino,
    });
    true
}

/// This process's PID namespace as the header keeps it (a proc inode number fits 32 bits).
fn pid_ns() -> u32 {
    crate::runtime::kernel::pid_namespace().unwrap_or(0) as u32
}

/// Removes the state once the exit report stands in its place.
pub fn remove_file() {
    if let Some(f) = &ARENA.lock().file {
        remove(f);
    }
}

/// Unlinks the state file if the path still names it.
fn remove(f: &File) {
    if crate::runtime::sys::path_id(&f.path).map(|id| (id.dev, id.ino)) == Some((f.dev, f.ino)) {
        let _ = crate::runtime::sys::unlink(&f.path);
    }
}

/// Fork support: the arena's lock is held across `fork`.
pub fn hold() {
    crate::runtime::lock::hold(&ARENA);
}

/// # Safety
/// Only in the fork handlers, after `hold`. In the child, the arena is the parent's file: the
/// child lets go of it (its range becomes unmapped reserve again, so a stale pointer faults
/// instead of writing into the parent's state) and starts its own at its first allocation. Every
/// holder of an arena pointer resets it in its own fork handler.
pub unsafe fn let_go(child: bool) {
    if child {
        // SAFETY: `hold` locked ARENA and forgot its guard, and the child has no other thread: this
        // is the only reference to the data.
        let a = unsafe { &mut *ARENA.data_ptr() };
        detach(a);
        HEADER.store(ptr::null_mut(), Relaxed);
        a.n = 0;
        a.used = 0;
        a.file_len = 0;
        a.file = None;
        a.grows = false;
        a.complete = true;
        // SAFETY: after `hold`, in the child's handler (this function's contract).
        unsafe { crate::runtime::lock::let_go_in_child(&ARENA) };
    } else {
        // SAFETY: after `hold`, in the parent's handler (this function's contract).
        unsafe { crate::runtime::lock::let_go_in_parent(&ARENA) };
    }
}

/// A fork child that could not take the arena's lock (its holder is gone, or is the code a signal
/// handler interrupted on this thread) still lets go of its parent's file at once, so that nothing
/// it writes reaches the parent's figures; the arena itself is forgotten later, under its lock
/// (`let_go`), or never, if the child has no state of its own.
///
/// # Safety
/// Only in a fork child, before anything of pinguard's runs in it but the code the fork
/// interrupted on this thread (a piece being added now, by that code, may be left shared).
pub unsafe fn leave_parent_unlocked() {
    // SAFETY: the child has one thread, and the code the fork interrupted on it does not run
    // until this returns: nothing changes the arena while it is read (this function's contract).
    let a = unsafe { &mut *ARENA.data_ptr() };
    detach(a);
    // No new piece from the parent's file either (the interrupted code may still grow it).
    a.grows = false;
    a.complete = false;
}

/// A fork child lets go of its parent's state: each piece of the file becomes a private
/// copy-on-write view of what it held (so a pointer the child still has, from a call the fork interrupted, reads
/// what it read before, and whatever it writes stays in the child), or, where the file cannot be
/// opened again, unmapped address space that faults.
fn detach(a: &Arena) {
    let fd = a
        .file
        .as_ref()
        .and_then(|f| reopen(f, libc::O_RDONLY))
        .unwrap_or(-1);
    // Anonymous pieces (no file) are private already: the child has its own copy.
    for &(at, len, off) in a.pieces[..a.n].iter().filter(|p| p.2 != NOT_IN_FILE) {
        let private = libc::MAP_PRIVATE | libc::MAP_FIXED;
        let copied = fd >= 0
            && sys_mmap(
                at,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                private,
                fd,
                off,
            )
            .is_some();
        if !copied {
            let _ = sys_mmap(
                at,
                len,
                libc::PROT_NONE,
                private | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
        }
    }
    if fd >= 0 {
        crate::runtime::sys::close(fd);
    }
}
