//! The ledger's file: opened, or made where nobody can see it and published with a link; mapped
//! and checked; and the ledger's fields as other processes change them (`Shared`: atomic reads
//! and bumps without the lock).

use crate::runtime::sys::{self, errno};
use pinguard_common::group::live::{self, Here, Set};
use pinguard_common::group::{self as layout, Header, Member, MAX_MEMBERS};
use std::ffi::CString;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

pub(super) static MAP: AtomicPtr<Header> = AtomicPtr::new(std::ptr::null_mut());

/// The ledger's name, made at start-up: a removal under the lock allocates nothing.
pub(super) static PATH: std::sync::OnceLock<CString> = std::sync::OnceLock::new();

/// The mapped ledger's file (device, inode): a removal unlinks the name only while it names it.
pub(super) static LEDGER_DEV: AtomicU64 = AtomicU64::new(0);
pub(super) static LEDGER_INO: AtomicU64 = AtomicU64::new(0);

/// A temporary ledger file of the named-file method older than this, whose creator's pid is gone,
/// was left by a creator that died.
const STALE_TMP_SECS: u64 = 10;

/// A ledger mapped, not yet published to this process's threads.
pub(super) struct Opened {
    pub(super) h: *mut Header,
    /// Its file's device and inode.
    pub(super) id: (u64, u64),
    /// Made by this process, with its budget.
    pub(super) created: bool,
}

pub(super) fn open_or_create(path: &str, budget: Option<u64>) -> Result<Opened, String> {
    let cpath = CString::new(path).map_err(|_| "has a NUL in its name".to_string())?;
    for _ in 0..3 {
        // SAFETY: `cpath` is NUL-terminated; the descriptor is closed below, in this function.
        let fd = unsafe {
            libc::open(
                cpath.as_ptr(),
                libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd >= 0 {
            let r = map_existing(fd);
            let id = sys::file_id(fd).map_or((0, 0), |f| (f.dev, f.ino));
            sys::close(fd);
            return r.map(|h| Opened {
                h,
                id,
                created: false,
            });
        }
        if errno() != libc::ENOENT {
            return Err(format!(
                "cannot be opened ({})",
                std::io::Error::last_os_error()
            ));
        }
        match create(path, budget) {
            Ok(Some((h, id))) => {
                return Ok(Opened {
                    h,
                    id,
                    created: true,
                })
            }
            Ok(None) => continue, // another member created it first: open theirs
            Err(e) => return Err(e),
        }
    }
    Err("keeps changing under us".into())
}

pub(super) fn map(fd: c_int) -> Result<*mut Header, String> {
    // SAFETY: a fresh shared mapping of a descriptor this function's caller owns; the kernel
    // picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            layout::SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "cannot be mapped ({})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(p as *mut Header)
}

fn map_existing(fd: c_int) -> Result<*mut Header, String> {
    // SAFETY: an all-zero `stat` is a valid value for the kernel to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for `fstat` of a descriptor the caller owns.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err("cannot be examined".into());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("is not a regular file".into());
    }
    // SAFETY: no arguments; it cannot fail.
    if st.st_uid != unsafe { libc::geteuid() } {
        return Err(format!(
            "belongs to user {}, not to this process's user",
            st.st_uid
        ));
    }
    // pinguard creates the ledger 0600: write access for others means someone else made it (or
    // opened it up), and anyone with that access can change the budget or the members' shares.
    if st.st_mode & 0o022 != 0 {
        return Err(format!(
            "is writable by other users (mode {:04o}; pinguard creates it 0600)",
            st.st_mode & 0o7777
        ));
    }
    if st.st_size as usize != layout::SIZE {
        return Err(format!(
            "is {} bytes, expected {} (another version of pinguard, or not a ledger)",
            st.st_size,
            layout::SIZE
        ));
    }
    let h = map(fd)?;
    // SAFETY: `h` maps `layout::SIZE` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(h as *const u8, layout::SIZE) };
    if let Err(e) = layout::check(bytes) {
        // SAFETY: unmaps the mapping made just above, which nothing else refers to.
        unsafe { libc::munmap(h as *mut _, layout::SIZE) };
        return Err(e);
    }
    Ok(h)
}

/// Builds the ledger where nobody can see it and publishes it with a link, which fails if another
/// member published one first: nobody ever maps a half-initialised ledger. The file is unnamed
/// (`O_TMPFILE`) until the link, so a creator killed at any moment leaves nothing behind; where
/// the file system or `/proc` does not allow that, a named temporary file is the fallback, and
/// the temporary files of creators that died are removed first.
pub(super) fn create(path: &str, budget: Option<u64>) -> Result<Option<Made>, String> {
    remove_stale_temporaries(path);
    match create_unnamed(path, budget) {
        Unnamed::Done(r) => r,
        Unnamed::Unsupported => create_named(path, budget),
    }
}

/// A ledger made and published: its mapping and its file's (device, inode).
type Made = (*mut Header, (u64, u64));

enum Unnamed {
    Done(Result<Option<Made>, String>),
    Unsupported,
}

fn create_unnamed(path: &str, budget: Option<u64>) -> Unnamed {
    let dir = match path.rsplit_once('/') {
        Some((d, _)) if !d.is_empty() => d,
        _ => return Unnamed::Unsupported,
    };
    let (Ok(cdir), Ok(cpath)) = (CString::new(dir), CString::new(path)) else {
        return Unnamed::Unsupported;
    };
    // SAFETY: `cdir` is NUL-terminated; the descriptor is pinguard's until it is closed below.
    let fd = unsafe {
        libc::open(
            cdir.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Unnamed::Unsupported; // an old kernel or another file system: the named method says why if it fails too
    }
    let h = match build(fd, budget) {
        Ok(h) => h,
        Err(e) => {
            sys::close(fd);
            return Unnamed::Done(Err(e));
        }
    };
    // Linking an unnamed file needs its /proc/self/fd name (`AT_EMPTY_PATH` needs a capability).
    let Ok(proc_fd) = CString::new(format!("/proc/self/fd/{fd}")) else {
        return Unnamed::Unsupported;
    };
    // SAFETY: both paths are NUL-terminated.
    let linked = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_fd.as_ptr(),
            libc::AT_FDCWD,
            cpath.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    } == 0;
    let err = errno();
    let id = sys::file_id(fd).map_or((0, 0), |f| (f.dev, f.ino));
    sys::close(fd);
    if linked {
        return Unnamed::Done(Ok(Some((h, id))));
    }
    // SAFETY: unmaps the mapping `build` made, which nothing else refers to.
    unsafe { libc::munmap(h as *mut _, layout::SIZE) };
    match err {
        libc::EEXIST => Unnamed::Done(Ok(None)),
        _ => Unnamed::Unsupported, // no /proc, for one
    }
}

fn create_named(path: &str, budget: Option<u64>) -> Result<Option<Made>, String> {
    // SAFETY: no arguments; it cannot fail.
    let pid = unsafe { libc::getpid() };
    let tmp = CString::new(format!("{path}.{pid}.tmp"))
        .map_err(|_| "has a NUL in its name".to_string())?;
    // SAFETY: `tmp` is NUL-terminated; the descriptor is pinguard's until `cleanup` closes it.
    let fd = unsafe {
        libc::open(
            tmp.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(format!(
            "cannot be created ({})",
            std::io::Error::last_os_error()
        ));
    }
    let cleanup = |fd| {
        sys::close(fd);
        // SAFETY: `tmp` is NUL-terminated; the name is this process's own temporary file.
        unsafe { libc::unlink(tmp.as_ptr()) };
    };
    let h = match build(fd, budget) {
        Ok(h) => h,
        Err(e) => {
            cleanup(fd);
            return Err(e);
        }
    };
    let cpath = CString::new(path).map_err(|_| "has a NUL in its name".to_string())?;
    // SAFETY: both paths are NUL-terminated.
    let linked = unsafe { libc::link(tmp.as_ptr(), cpath.as_ptr()) } == 0;
    let err = errno();
    let id = sys::file_id(fd).map_or((0, 0), |f| (f.dev, f.ino));
    cleanup(fd);
    if linked {
        Ok(Some((h, id)))
    } else {
        // SAFETY: unmaps the mapping `build` made, which nothing else refers to.
        unsafe { libc::munmap(h as *mut _, layout::SIZE) };
        if err == libc::EEXIST {
            Ok(None)
        } else {
            Err(format!(
                "cannot be published ({})",
                std::io::Error::from_raw_os_error(err)
            ))
        }
    }
}

/// Sizes the new ledger file `fd`, maps it and writes an empty ledger into it.
pub(super) fn build(fd: c_int, budget: Option<u64>) -> Result<*mut Header, String> {
    // SAFETY: `fd` is the caller's new file.
    if unsafe { libc::ftruncate(fd, layout::SIZE as libc::off_t) } != 0 {
        return Err("cannot be sized".into());
    }
    let h = map(fd)?;
    // SAFETY: `h` maps `layout::SIZE` zeroed bytes that no other process can see yet.
    unsafe {
        let hd = &mut *h;
        hd.version = layout::VERSION;
        hd.header_size = layout::SIZE as u32;
        hd.total_size = layout::SIZE as u64;
        hd.budget = budget.unwrap_or(u64::MAX);
        hd.created_unix_ms = crate::runtime::clock::unix_ms();
        hd.host_lowest_available = u64::MAX;
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        libc::pthread_mutexattr_init(&mut attr);
        libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
        libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        libc::pthread_mutex_init(&mut hd.mutex, &attr);
        libc::pthread_mutexattr_destroy(&mut attr);
        // The magic last: a reader that sees it sees the rest.
        std::sync::atomic::fence(Ordering::SeqCst);
        hd.magic = layout::MAGIC;
    }
    Ok(h)
}

/// Removes `PATH.PID.tmp` files (the named method's, from this or an older pinguard) whose
/// creator is gone: its pid does not exist, and the file is older than any creation takes (a pid
/// from another pid namespace sharing this directory may look gone).
fn remove_stale_temporaries(path: &str) {
    let Some((dir, base)) = path.rsplit_once('/') else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(if dir.is_empty() { "/" } else { dir }) else {
        return;
    };
    let now = std::time::SystemTime::now();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| {
            n.strip_prefix(base)?
                .strip_prefix('.')?
                .strip_suffix(".tmp")
        }) else {
            continue;
        };
        let Ok(pid) = pid.parse::<libc::pid_t>() else {
            continue;
        };
        if pid <= 0 {
            continue;
        }
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0 && errno() == libc::ESRCH;
        let old = e.metadata().and_then(|m| m.modified()).is_ok_and(|t| {
            now.duration_since(t)
                .is_ok_and(|age| age.as_secs() >= STALE_TMP_SECS)
        });
        if gone && old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The group's ledger, shared with every other member process: a handle, never a reference.
/// Other processes write the ledger at any time, so Rust's rule for `&mut` (nothing else touches
/// the memory while the reference lives) holds only with the group lock held: `Locked` lends
/// `&mut Header` for as long as it holds the lock, and outside it only single fields are read
/// or bumped, atomically (`budget`, written once before the ledger was published; `pid`, the
/// member's own notes).
#[derive(Clone, Copy)]
pub(super) struct Shared(pub(super) std::ptr::NonNull<Header>);

impl Shared {
    /// `budget` is written before the ledger is published (`init`) and never changed after.
    pub(super) fn budget(self) -> u64 {
        // SAFETY: a published ledger mapping, never unmapped; the field is never written again.
        unsafe { std::ptr::addr_of!((*self.0.as_ptr()).budget).read() }
    }
}

#[inline(always)]
pub(super) fn header() -> Option<Shared> {
    std::ptr::NonNull::new(MAP.load(Ordering::Acquire)).map(Shared)
}

/// The offset of member `i`'s field at `field` (an `offset_of!(Member, ..)`) in the ledger.
pub(super) fn member_at(i: usize, field: usize) -> usize {
    std::mem::offset_of!(Header, members)
        + i.min(MAX_MEMBERS - 1) * std::mem::size_of::<Member>()
        + field
}

impl Shared {
    /// The `u64` field at `offset` (an `offset_of!`, or `member_at`), read without the lock.
    pub(super) fn u64_at(self, offset: usize) -> u64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= layout::SIZE);
        // SAFETY: an aligned u64 inside the published ledger mapping (checked just above: the
        // mapping is page-aligned); other processes write it under the lock, and an atomic read
        // races with nothing.
        unsafe { AtomicU64::from_ptr(self.0.as_ptr().cast::<u8>().add(offset).cast::<u64>()) }
            .load(Ordering::Relaxed)
    }

    /// The `u32` field at `offset`, read without the lock.
    pub(super) fn u32_at(self, offset: usize) -> u32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= layout::SIZE);
        // SAFETY: an aligned u32 inside the published ledger mapping, as in `u64_at`.
        unsafe { AtomicU32::from_ptr(self.0.as_ptr().cast::<u8>().add(offset).cast::<u32>()) }
            .load(Ordering::Relaxed)
    }

    /// Member `i`'s pid and start time, read without the lock (each atomically; together they
    /// may be of two members, which `Locked::bury` tells apart).
    pub(super) fn member_id(self, i: usize) -> (u32, u64) {
        use std::mem::offset_of;
        (
            self.u32_at(member_at(i, offset_of!(Member, pid))),
            self.u64_at(member_at(i, offset_of!(Member, start_ticks))),
        )
    }

    /// What member `i`'s slot says of its process, and its join serial, read without the lock.
    pub(super) fn member_seen(self, i: usize) -> (live::Seen, u64) {
        use std::mem::offset_of;
        let (pid, start_ticks) = self.member_id(i);
        // Pairs with the joiner's fence before it writes the pid: the rest is the same member's.
        std::sync::atomic::fence(Ordering::Acquire);
        let sem_key = self.u32_at(member_at(i, offset_of!(Member, sem_key))) as i32;
        let ipc_ns = self.u64_at(member_at(i, offset_of!(Member, ipc_ns)));
        let pid_ns = self.u64_at(member_at(i, offset_of!(Member, pid_ns)));
        (
            live::Seen {
                pid,
                start_ticks,
                sem_key,
                ipc_ns,
                pid_ns,
            },
            self.u64_at(member_at(i, offset_of!(Member, serial))),
        )
    }

    /// The group's semaphore set, when it lives in this process's IPC namespace.
    pub(super) fn set_here(self, here: Here) -> Option<Set> {
        use std::mem::offset_of;
        let key = self.u32_at(offset_of!(Header, sem_key)) as i32;
        let ns = self.u64_at(offset_of!(Header, sem_ipc_ns));
        (key != 0 && here.ipc_ns != 0 && ns == here.ipc_ns)
            .then(|| Set::open(key).ok())
            .flatten()
    }
}

/// Where each member's figures beyond version 4's are (`layout::MemberExt`).
pub(super) fn ext_at(i: usize, field: usize) -> usize {
    std::mem::offset_of!(Header, ext)
        + i.min(MAX_MEMBERS - 1) * std::mem::size_of::<layout::MemberExt>()
        + field
}

impl Shared {
    /// The `u64` at `offset` (an `offset_of!`, `member_at`, `ext_at`), to change atomically: the
    /// fields members change without the lock.
    pub(super) fn atomic_u64(self, offset: usize) -> &'static AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= layout::SIZE);
        // SAFETY: an aligned u64 inside the published ledger mapping, which is never unmapped;
        // every process changes it atomically.
        unsafe { AtomicU64::from_ptr(self.0.as_ptr().cast::<u8>().add(offset).cast::<u64>()) }
    }

    /// Member `i`'s calls in flight (`MemberExt::in_flight`).
    pub(super) fn in_flight(self, i: usize) -> &'static AtomicU64 {
        self.atomic_u64(ext_at(
            i,
            std::mem::offset_of!(layout::MemberExt, in_flight),
        ))
    }
}
