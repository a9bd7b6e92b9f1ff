//! pinguard's own system I/O, safe to run inside any hooked call.
//!
//! A hooked call runs on the application's thread, which may be cancelled (`pthread_cancel`):
//! glibc's `open`, `read`, `write` and `close` are cancellation points, and a cancellation acted
//! on inside pinguard's Rust frames aborts the process ("exception not rethrown"). The functions
//! here go through `syscall(2)`, which is no cancellation point, so a pending cancellation waits
//! for the application's own next cancellation point, exactly as without pinguard. `NoCancel`
//! covers the rest (std I/O, libraries) for the sections that cannot avoid it.

use std::ffi::CStr;
use std::os::raw::{c_int, c_long, c_void};

// Not in the `libc` crate; glibc's values (the same on every architecture).
const PTHREAD_CANCEL_DISABLE: c_int = 1;
extern "C" {
    fn pthread_setcancelstate(state: c_int, old: *mut c_int) -> c_int;
}

/// Cancellation disabled on this thread while it lives; the previous state comes back on drop.
/// A cancellation requested meanwhile stays pending (glibc acts on it at the next cancellation
/// point, not when the state is restored, for the deferred type).
pub struct NoCancel(c_int);

impl NoCancel {
    pub fn new() -> NoCancel {
        let mut old = 0;
        // SAFETY: `old` is a valid out-pointer; the call only changes this thread's state.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        NoCancel(old)
    }
}

impl Default for NoCancel {
    fn default() -> Self {
        NoCancel::new()
    }
}

impl Drop for NoCancel {
    fn drop(&mut self) {
        let mut ignored = 0;
        // SAFETY: restores the state saved by `new` on the same thread (the guard is not `Send`
        // in practice: it lives on the stack of the section it covers).
        unsafe { pthread_setcancelstate(self.0, &mut ignored) };
    }
}

/// The calling thread's `errno` as libc left it (not the value a hook keeps for the application:
/// `guard::errno`).
pub fn errno() -> c_int {
    // SAFETY: errno's location is valid for the calling thread.
    unsafe { *libc::__errno_location() }
}

fn ret(r: c_long) -> Result<usize, c_int> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// `open(path, O_RDONLY | O_CLOEXEC)` without a cancellation point.
pub fn open_read(path: &CStr) -> Result<c_int, c_int> {
    open(path, libc::O_RDONLY, 0)
}

/// `open(path, flags | O_CLOEXEC, mode)` without a cancellation point.
pub fn open(path: &CStr, flags: c_int, mode: libc::mode_t) -> Result<c_int, c_int> {
    // SAFETY: `path` is NUL-terminated; the kernel only reads it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode,
        )
    };
    ret(r).map(|fd| fd as c_int)
}

/// `unlink(path)`; a failure is the caller's to ignore.
pub fn unlink(path: &CStr) -> Result<usize, c_int> {
    // SAFETY: `path` is NUL-terminated; the kernel only reads it.
    ret(unsafe { libc::syscall(libc::SYS_unlinkat, libc::AT_FDCWD, path.as_ptr(), 0) })
}

/// Moves `from` to `to` only where `to` does not exist (`EEXIST` otherwise): a name another
/// process holds is never replaced. `renameat2(RENAME_NOREPLACE)` (no glibc 2.17 wrapper), or,
/// on a file system without it, `link` then `unlink`, which fails the same way.
pub fn rename_noreplace(from: &CStr, to: &CStr) -> Result<(), c_int> {
    const RENAME_NOREPLACE: c_long = 1;
    // SAFETY: both paths are NUL-terminated; the kernel only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            RENAME_NOREPLACE,
        )
    };
    match ret(r) {
        Err(libc::EINVAL | libc::ENOSYS) => {}
        r => return r.map(|_| ()),
    }
    // SAFETY: as above; no flags, so a final symbolic link at `from` is linked, not followed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_linkat,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            0,
        )
    };
    ret(r)?;
    let _ = unlink(from);
    Ok(())
}

/// Which file a descriptor or path names: device, inode, and whether it is a regular file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub regular: bool,
}

fn file_id_of(st: &libc::stat) -> FileId {
    FileId {
        dev: st.st_dev,
        ino: st.st_ino,
        regular: st.st_mode & libc::S_IFMT == libc::S_IFREG,
    }
}

/// The file an open descriptor names.
pub fn file_id(fd: c_int) -> Option<FileId> {
    // SAFETY: an all-zero `stat` is a valid value for the kernel to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for the call.
    ret(unsafe { libc::syscall(libc::SYS_fstat, fd, &mut st as *mut libc::stat) }).ok()?;
    Some(file_id_of(&st))
}

/// Everything `fstat` says about an open descriptor (owner, mode, modification time).
pub fn stat(fd: c_int) -> Option<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value for the kernel to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for the call.
    ret(unsafe { libc::syscall(libc::SYS_fstat, fd, &mut st as *mut libc::stat) }).ok()?;
    Some(st)
}

/// The file a path names, a final symbolic link not followed.
pub fn path_id(path: &CStr) -> Option<FileId> {
    // SAFETY: an all-zero `stat` is a valid value for the kernel to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a valid out-pointer for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_newfstatat,
            libc::AT_FDCWD,
            path.as_ptr(),
            &mut st as *mut libc::stat,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    ret(r).ok()?;
    Some(file_id_of(&st))
}

/// `read` without a cancellation point, retried on `EINTR`.
pub fn read(fd: c_int, buf: &mut [u8]) -> Result<usize, c_int> {
    loop {
        // SAFETY: `buf` is valid for `buf.len()` bytes of writing.
        let r = unsafe {
            libc::syscall(
                libc::SYS_read,
                fd,
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
            )
        };
        match ret(r) {
            Err(libc::EINTR) => continue,
            other => return other,
        }
    }
}

/// `pread`: fills `buf` from `off` on, without a cancellation point, retried on `EINTR` and short
/// reads; `None` at the end of the file or on an error.
pub fn read_exact_at(fd: c_int, buf: &mut [u8], off: u64) -> Option<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is valid for `rest.len()` bytes of writing.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pread64,
                fd,
                rest.as_mut_ptr() as *mut c_void,
                rest.len(),
                off.checked_add(done as u64)?,
            )
        };
        match ret(r) {
            Ok(0) => return None,
            Ok(n) => done += n,
            Err(libc::EINTR) => {}
            Err(_) => return None,
        }
    }
    Some(())
}

/// `write` of the whole buffer without a cancellation point; stops at the first error.
pub fn write_all(fd: c_int, mut buf: &[u8]) -> Result<(), c_int> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for `buf.len()` bytes of reading.
        let r = unsafe {
            libc::syscall(
                libc::SYS_write,
                fd,
                buf.as_ptr() as *const c_void,
                buf.len(),
            )
        };
        match ret(r) {
            Ok(0) => return Err(libc::EIO),
            Ok(n) => buf = &buf[n..],
            Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `close` of a descriptor pinguard opened itself, without a cancellation point.
pub fn close(fd: c_int) {
    // SAFETY: the caller owns `fd` (it came from `open_read` in the same function).
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// A whole file (a `/proc` file: its size is unknown in advance), read without a cancellation
/// point. The descriptor is pinguard's from `open` to `close`, inside this call.
pub fn read_file(path: &CStr) -> Option<Vec<u8>> {
    let fd = open_read(path).ok()?;
    let mut out = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let r = loop {
        match read(fd, &mut chunk) {
            Ok(0) => break Some(()),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(_) => break None,
        }
    };
    close(fd);
    r.map(|_| out)
}

/// `read_file` as text (lossy: `/proc` text is ASCII apart from file names).
pub fn read_text(path: &CStr) -> Option<String> {
    read_file(path).map(|b| {
        String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    })
}

/// The page size the kernel reports, asked once; 4 KiB where it cannot say.
const PAGE: usize = 4096;

pub fn page_size() -> usize {
    static SIZE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let s = SIZE.load(std::sync::atomic::Ordering::Relaxed);
    if s != 0 {
        return s;
    }
    // SAFETY: sysconf takes no pointers and has no preconditions.
    let s = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        v if v > 0 => v as usize,
        _ => PAGE,
    };
    SIZE.store(s, std::sync::atomic::Ordering::Relaxed);
    s
}
