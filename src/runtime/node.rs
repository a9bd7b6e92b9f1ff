//! The node configuration file (`pinguard_common::node`), read once per process with raw system
//! calls into a static buffer: the switches asked before start-up (`lifecycle::hooks_enabled`,
//! maybe inside another library's constructor) read it without allocating, and start-up parses
//! the same bytes. With no file, the cost is one `open` failing with `ENOENT`.
//!
//! Which file: `/etc/pinguard/pinguard.conf`, or outside secure mode the one `PINGUARD_CONFIG`
//! names (empty: none). It is used only when it is a regular file reached without following a
//! final link, owned by root (outside secure mode, also by the process's own user), writable by
//! nobody else, in a folder of the same kind, and at most `MAX_BYTES` long.

use crate::runtime::{kernel, sys};
use pinguard_common::node::{Verdict, DEFAULT_PATH, MAX_BYTES};
use pinguard_common::vars;
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU8, Ordering};

/// The longest path taken from `PINGUARD_CONFIG`, its NUL included.
const PATH_MAX: usize = 4096;

/// What `load` found: the path looked at, the verdict, and the file's bytes when trusted. In this
/// order, and all zeros until read (`.bss`): without a file, reading touches one page of it.
#[repr(C)]
pub struct Loaded {
    pub verdict: Verdict,
    path_len: usize,
    len: usize,
    path: [u8; PATH_MAX],
    text: [u8; MAX_BYTES],
}

impl Loaded {
    /// The path looked at (empty when none was wanted).
    pub fn path(&self) -> &str {
        std::str::from_utf8(&self.path[..self.path_len]).unwrap_or("(not UTF-8)")
    }

    /// The file's bytes: empty unless it is trusted.
    pub fn text(&self) -> &[u8] {
        &self.text[..self.len]
    }
}

struct Slot(UnsafeCell<Loaded>);
// SAFETY: written only by the one thread that moves `STATE` from `UNREAD` to `READING`, read only
// after `STATE` is `READ` (Release/Acquire), and never written again.
unsafe impl Sync for Slot {}

static SLOT: Slot = Slot(UnsafeCell::new(Loaded {
    verdict: Verdict::Absent,
    path_len: 0,
    len: 0,
    path: [0; PATH_MAX],
    text: [0; MAX_BYTES],
}));

const UNREAD: u8 = 0;
const READING: u8 = 1;
const READ: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNREAD);

/// The file as read at start; `None` only while another thread is reading it and has not
/// finished within a bounded wait (or a signal handler interrupted this thread's own read):
/// then the caller goes on as if there were no file.
pub fn load() -> Option<&'static Loaded> {
    for _ in 0..10_000 {
        match STATE.compare_exchange(UNREAD, READING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                // SAFETY: this thread alone moved `STATE` to `READING`: nobody else reads or
                // writes the slot until it is `READ`.
                let l = unsafe { &mut *SLOT.0.get() };
                read_into(l);
                STATE.store(READ, Ordering::Release);
                return Some(l);
            }
            // SAFETY: `READ`: the slot was written before the Release store and never again.
            Err(READ) => return Some(unsafe { &*SLOT.0.get() }),
            Err(_) => std::thread::yield_now(),
        }
    }
    None
}

/// The value the file in force gives `name`, without allocating.
pub fn raw(name: &str) -> Option<&'static [u8]> {
    let l = load()?;
    pinguard_common::node::raw(l.text(), name)
}

/// Picks the path, then reads and judges the file.
fn read_into(l: &mut Loaded) {
    let secure = kernel::secure_mode();
    let named = if secure {
        None
    } else {
        env_raw(vars::CONFIG.name)
    };
    let path: &[u8] = match named {
        Some(p) if p.trim_ascii().is_empty() => {
            l.verdict = Verdict::Off;
            return;
        }
        // A relative path is the configuration's error (`vars::CONFIG`); the default stands.
        Some(p) if p.trim_ascii().starts_with(b"/") && p.trim_ascii().len() < PATH_MAX => {
            p.trim_ascii()
        }
        _ => DEFAULT_PATH.as_bytes(),
    };
    l.path[..path.len()].copy_from_slice(path);
    l.path_len = path.len();
    // SAFETY: geteuid cannot fail.
    let own = (!secure).then(|| unsafe { libc::geteuid() });
    let (verdict, len) = judge(l, own);
    l.verdict = verdict;
    l.len = if verdict.trusted() { len } else { 0 };
}

/// Opens the file without following a final link or blocking, checks it and its folder, reads
/// it into `l.text`.
fn judge(l: &mut Loaded, own: Option<u32>) -> (Verdict, usize) {
    // NUL-terminated for the kernel: the buffer is zeroed past the path.
    let Ok(c) = CStr::from_bytes_until_nul(&l.path[..=l.path_len]) else {
        return (Verdict::Unreadable(libc::EINVAL), 0);
    };
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = match sys::open(c, flags, 0) {
        Ok(fd) => fd,
        Err(libc::ENOENT) | Err(libc::ENOTDIR) => return (Verdict::Absent, 0),
        Err(libc::ELOOP) => return (Verdict::NotRegular, 0),
        Err(e) => return (Verdict::Unreadable(e), 0),
    };
    let verdict = check_file(fd, own).or_else(|| check_folder(&mut l.path, l.path_len, own));
    let out = match verdict {
        Some(v) => (v, 0),
        None => read_all(fd, &mut l.text),
    };
    sys::close(fd);
    out
}

fn check_file(fd: i32, own: Option<u32>) -> Option<Verdict> {
    let Some(st) = sys::stat(fd) else {
        return Some(Verdict::Unreadable(libc::EIO));
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Some(Verdict::NotRegular);
    }
    if st.st_size as u64 > MAX_BYTES as u64 {
        return Some(Verdict::TooLarge(st.st_size as u64));
    }
    Verdict::check(st.st_uid, st.st_mode, false, own)
}

/// The folder holding the file: whoever may write there may replace the file. `path` holds the
/// file's path and a NUL after it; the folder's name is made in place (a NUL over the last `/`,
/// put back after), not in a copy on a stack that may be small (an early switch runs on the
/// caller's).
fn check_folder(path: &mut [u8], len: usize, own: Option<u32>) -> Option<Verdict> {
    let cut = path[..len]
        .iter()
        .rposition(|&b| b == b'/')
        .unwrap_or(0)
        .max(1);
    let kept = path[cut];
    path[cut] = 0;
    let opened = CStr::from_bytes_until_nul(&path[..=cut])
        .map_err(|_| libc::EINVAL)
        .and_then(|c| sys::open(c, libc::O_PATH | libc::O_DIRECTORY, 0));
    path[cut] = kept;
    let fd = match opened {
        Ok(fd) => fd,
        Err(e) => return Some(Verdict::Unreadable(e)),
    };
    let st = sys::stat(fd);
    sys::close(fd);
    match st {
        Some(st) => Verdict::check(st.st_uid, st.st_mode, true, own),
        None => Some(Verdict::Unreadable(libc::EIO)),
    }
}

/// Reads the whole file: a file that grew past `MAX_BYTES` since `fstat` is refused too.
fn read_all(fd: i32, buf: &mut [u8]) -> (Verdict, usize) {
    let mut have = 0;
    loop {
        if have == buf.len() {
            let mut one = [0u8; 1];
            return match sys::read(fd, &mut one) {
                Ok(0) => (Verdict::Trusted, have),
                _ => (Verdict::TooLarge(have as u64 + 1), 0),
            };
        }
        match sys::read(fd, &mut buf[have..]) {
            Ok(0) => return (Verdict::Trusted, have),
            Ok(n) => have += n,
            Err(e) => return (Verdict::Unreadable(e), 0),
        }
    }
}

/// A variable's raw value from the environment, without allocating; never in secure mode, where
/// the environment decides nothing. The name is made NUL-terminated on the stack.
pub fn env_raw(name: &str) -> Option<&'static [u8]> {
    if kernel::secure_mode() {
        return None;
    }
    let mut c = [0u8; 64];
    if name.len() >= c.len() {
        return None;
    }
    c[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `c` is NUL-terminated; getenv returns null or a NUL-terminated string that the
    // environment keeps until the program changes that variable, which these callers read at once.
    unsafe {
        let v = libc::getenv(c.as_ptr() as *const libc::c_char);
        (!v.is_null()).then(|| std::ffi::CStr::from_ptr(v).to_bytes())
    }
}

/// The environment's `PINGUARD_*` variables, copied; none in secure mode. Only these are copied:
/// a walk of `environ` as `getenv` makes, where `std::env::vars_os` would copy every variable of
/// the process first (half of a never-pinning process's exit-time cost, issue 44 item 8).
pub fn pinguard_vars() -> Vec<(String, Option<String>)> {
    if kernel::secure_mode() {
        return Vec::new();
    }
    extern "C" {
        static environ: *const *const libc::c_char;
    }
    let mut out = Vec::new();
    // SAFETY: `environ` is the C library's NULL-terminated array of NUL-terminated strings, read
    // here as `getenv` reads it; each entry is copied at once.
    unsafe {
        let env = std::ptr::addr_of!(environ).read();
        let mut i = 0;
        while !env.is_null() && !(*env.add(i)).is_null() {
            let entry = CStr::from_ptr(*env.add(i)).to_bytes();
            i += 1;
            if !entry.starts_with(b"PINGUARD_") {
                continue;
            }
            // As `getenv` and std do: an entry without `=` is no variable.
            let Some(at) = entry.iter().position(|&c| c == b'=') else {
                continue;
            };
            let Ok(k) = std::str::from_utf8(&entry[..at]) else {
                continue;
            };
            let v = std::str::from_utf8(&entry[at + 1..])
                .ok()
                .map(str::to_string);
            out.push((k.to_string(), v));
        }
    }
    out
}

/// A setting before start-up, without allocating: the environment's value, else the file's; in
/// secure mode only the file's.
pub fn early(name: &str) -> Option<&'static [u8]> {
    env_raw(name).or_else(|| raw(name))
}

static SCRUB_DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How many `PINGUARD_*` variables `scrub_environment` removed.
static SCRUBBED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// In secure mode, at the constructor: pinguard's variables leave the environment, so that no
/// child the program starts (often as root, after `setuid(0)`) obeys the caller's settings,
/// as glibc's loader removes `LD_PRELOAD`, `MALLOC_*` and `TMPDIR` there. In place, without
/// allocating: the pointers after each removed one move down, as glibc's `unsetenv` does.
pub fn scrub_environment() {
    // Once: the constructor and a start-up that came first (from a hooked call) both ask.
    if !kernel::secure_mode() || SCRUB_DONE.swap(true, Ordering::Relaxed) {
        return;
    }
    extern "C" {
        static mut environ: *mut *mut libc::c_char;
    }
    // SAFETY: `environ` is the C library's NULL-terminated array of NUL-terminated strings; the
    // constructor runs before `main`, when nothing else edits it, and only pointers already in
    // the array are moved down within it, then a NULL written at or before the old end.
    unsafe {
        let env = std::ptr::addr_of!(environ).read();
        if env.is_null() {
            return;
        }
        let (mut read, mut kept) = (0, 0);
        loop {
            let p = *env.add(read);
            if p.is_null() {
                break;
            }
            if CStr::from_ptr(p).to_bytes().starts_with(b"PINGUARD_") {
                SCRUBBED.fetch_add(1, Ordering::Relaxed);
            } else {
                *env.add(kept) = p;
                kept += 1;
            }
            read += 1;
        }
        *env.add(kept) = std::ptr::null_mut();
    }
}

/// How many of pinguard's variables the environment of this secure-mode process held.
pub fn scrubbed() -> usize {
    SCRUBBED.load(Ordering::Relaxed)
}

/// The file's settings and the lines about it, for start-up (`Config::from_layers`); `None` when
/// none was wanted or it could not be had in time (`load`).
pub fn settings() -> Option<crate::runtime::config::NodeFile> {
    let l = load()?;
    if l.verdict == Verdict::Off {
        return None;
    }
    let path = l.path().to_string();
    let (entries, mut problems) = pinguard_common::node::entries(&path, l.text());
    problems.splice(0..0, l.verdict.problem(&path));
    Some(crate::runtime::config::NodeFile {
        path,
        entries,
        problems,
    })
}
