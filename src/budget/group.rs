//! A budget shared by every process of a group on the host (`PINGUARD_GROUP`), through a ledger
//! in shared memory (layout: `pinguard_report::group`).
//!
//! A process-shared robust mutex guards the group's total and each member's share: a member
//! killed while holding it is detected by the next locker (`EOWNERDEAD`), and a member killed at
//! any other time is found by a later look for dead members and its bytes go back to the group.
//! A member holds its slot's semaphore in the group's System V set (`SEM_UNDO`: the kernel lowers
//! it when the process ends), so a look tells the living from the dead in any PID namespace;
//! without one (another IPC namespace, semaphores denied) by its pid and start time, from its
//! own PID namespace only, and from elsewhere it is never taken for dead (`live::judge`). A look
//! is rationed: once when a process joins, and, while the group is full, once per `RESCAN_MS`
//! for the whole group.
//!
//! The counters are exact: `used` is the sum of the members' shares, a reservation that would
//! pass `u64::MAX` is refused (never saturated), and a release takes back exactly what it names,
//! never more than the member holds.
//!
//! Everything here runs inside hooked calls: no cancellation point (raw system calls for `/proc`,
//! cancellation disabled while the lock is held) and no allocation under the lock.

use super::{cgroup, host, Refused};
use crate::runtime::{kernel, sys};
use pinguard_report::group::live::{self, Here, Proc, Set, Verdict};
use pinguard_report::group::{self as layout, Header, Member, MAX_MEMBERS};
use std::ffi::{CStr, CString};
use std::os::raw::c_int;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

static MAP: AtomicPtr<Header> = AtomicPtr::new(std::ptr::null_mut());
static SLOT: AtomicUsize = AtomicUsize::new(NOT_JOINED);
const NOT_JOINED: usize = usize::MAX;
const NO_SLOT: usize = usize::MAX - 1;
/// The pid this process joined with: a slot whose pid is another is no longer this process's.
static MY_PID: AtomicU32 = AtomicU32::new(0);
static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// The ledger's name, made at start-up: a removal under the lock allocates nothing.
static PATH: std::sync::OnceLock<CString> = std::sync::OnceLock::new();
/// The mapped ledger's file (device, inode): a removal unlinks the name only while it names it.
static LEDGER_DEV: AtomicU64 = AtomicU64::new(0);
static LEDGER_INO: AtomicU64 = AtomicU64::new(0);
/// This image made the ledger in use (it alone may remove it while nobody ever joined it).
static CREATED: AtomicBool = AtomicBool::new(false);
/// This process's own `PINGUARD_GROUP_BUDGET` (`u64::MAX`: none), for a ledger it makes anew.
static OWN_BUDGET: AtomicU64 = AtomicU64::new(u64::MAX);
/// How the ledger was had at start-up, for `PINGUARD_LOG=debug` (`how_opened`).
static HOW: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// Removals of an abandoned ledger one opening makes at most before it gives up.
const REOPENS: u32 = 3;

/// A temporary ledger file of the named-file method older than this, whose creator's pid is gone,
/// was left by a creator that died.
const STALE_TMP_SECS: u64 = 10;

/// Opens or creates the group's ledger. Problems become lines in `errors`; the process then runs
/// with its own budget only.
pub fn init(name: &str, budget: Option<u64>, errors: &mut Vec<String>) {
    // Start-up may run inside the application's first hooked call, on a thread that can be
    // cancelled: the file work below is not to be a cancellation point.
    let _nc = sys::NoCancel::new();
    let path = layout::path(name);
    if let Ok(c) = CString::new(path.as_str()) {
        let _ = PATH.set(c);
    }
    OWN_BUDGET.store(budget.unwrap_or(u64::MAX), Ordering::Relaxed);
    match open_live(&path, budget) {
        Ok((o, removed)) => {
            let Some(h) = std::ptr::NonNull::new(o.h).map(Shared) else { return };
            let stored = h.budget();
            if let (Some(b), false) = (budget, o.created) {
                if b != stored {
                    errors.push(format!(
                        "PINGUARD_GROUP_BUDGET={b}: group {name} already has a budget of {stored} bytes, set by its first member; using that"
                    ));
                }
            }
            let _ = HOW.set(format!(
                "group {name}: {} {path}{}, budget {}",
                if o.created { "created its ledger" } else { "opened its ledger" },
                if removed { " (after removing one whose members were all gone)" } else { "" },
                if stored == u64::MAX { "none".to_string() } else { format!("{stored} bytes") }
            ));
            let _ = NAME.set(name.to_string());
            // Before the ledger is this image's to use: no thread can have joined yet, so every
            // slot with this process's pid and start time is the previous image's.
            forget_previous_image(h);
            LEDGER_DEV.store(o.id.0, Ordering::Relaxed);
            LEDGER_INO.store(o.id.1, Ordering::Relaxed);
            CREATED.store(o.created, Ordering::Relaxed);
            MAP.store(h.0.as_ptr(), Ordering::Release);
        }
        Err(why) => errors.push(format!("PINGUARD_GROUP={name:?}: the ledger {path} {why}; running WITHOUT the group budget (the process budget only)")),
    }
}

/// How the ledger was had at start-up (created, opened, an abandoned one removed first), for
/// `PINGUARD_LOG=debug`.
pub fn how_opened() -> Option<&'static str> {
    HOW.get().map(String::as_str)
}

/// A ledger mapped, not yet published to this process's threads.
struct Opened {
    h: *mut Header,
    /// Its file's device and inode.
    id: (u64, u64),
    /// Made by this process, with its budget.
    created: bool,
}

/// The group's ledger, opened or created. One that nobody lives in (every member gone: the last
/// was killed, or a pinguard before this one left it) is removed first, under its lock, and made
/// anew with this process's budget; whether that happened.
fn open_live(path: &str, budget: Option<u64>) -> Result<(Opened, bool), String> {
    let mut removed = false;
    for _ in 0..REOPENS {
        let o = open_or_create(path, budget)?;
        let Some(h) = std::ptr::NonNull::new(o.h).map(Shared) else {
            return Err("cannot be mapped".into());
        };
        // Not removed (its lock held, a member joined meanwhile): someone is in it, and it is
        // this process's group.
        if o.created || !abandoned(h) || !remove_abandoned(h, o.id) {
            return Ok((o, removed));
        }
        removed = true;
        // SAFETY: unmaps the mapping made just above, which nothing else refers to (never
        // published to this process's threads).
        unsafe { libc::munmap(o.h as *mut _, layout::SIZE) };
    }
    Err("keeps being removed under us".into())
}

/// Whether nobody lives in the ledger: it is closed, or it was joined and every member in it is
/// gone (read without the lock; `remove_abandoned` checks again under it). One nobody joined yet
/// is its creator's, which joins at its first pin: the processes of a group start together, and
/// each replacing the one before would leave some without the group.
fn abandoned(h: Shared) -> bool {
    if h.u32_at(std::mem::offset_of!(Header, closed)) != 0 {
        return true;
    }
    if h.u64_at(std::mem::offset_of!(Header, joins)) == 0 {
        return false;
    }
    let here = here();
    (0..MAX_MEMBERS).all(|i| {
        let (seen, _) = h.member_seen(i);
        seen.pid == 0 || {
            let value = |key: i32| Set::open(key).ok()?.value(i).ok();
            live::judge(&seen, here, value, start_ticks) == Verdict::Gone
        }
    })
}

/// Buries the gone members of an abandoned ledger (found without the lock, as any look) and, when
/// that leaves none, closes it and unlinks its name. Only tries the lock: a ledger whose lock is
/// held has someone in it. Whether it was removed.
fn remove_abandoned(h: Shared, id: (u64, u64)) -> bool {
    let mut dead = Dead::look(h, Scan::Join);
    for _ in 0..MAX_MEMBERS / Dead::MAX + 1 {
        let Ok(mut l) = Locked::any(h, &mut Wait::once()) else {
            return false;
        };
        l.bury(&dead);
        if l.h().closed != 0 || (l.empty() && l.h().joins != 0) {
            l.close(id);
            return true;
        }
        if dead.n < Dead::MAX {
            return false; // someone joined since the look
        }
        drop(l);
        dead = Dead::look(h, Scan::Join); // more gone members than one look holds
    }
    false
}

fn open_or_create(path: &str, budget: Option<u64>) -> Result<Opened, String> {
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

fn errno() -> c_int {
    // SAFETY: errno's location is valid for the calling thread.
    unsafe { *libc::__errno_location() }
}

fn map(fd: c_int) -> Result<*mut Header, String> {
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
fn create(path: &str, budget: Option<u64>) -> Result<Option<Made>, String> {
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
fn build(fd: c_int, budget: Option<u64>) -> Result<*mut Header, String> {
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
struct Shared(std::ptr::NonNull<Header>);

impl Shared {
    /// `budget` is written before the ledger is published (`init`) and never changed after.
    fn budget(self) -> u64 {
        // SAFETY: a published ledger mapping, never unmapped; the field is never written again.
        unsafe { std::ptr::addr_of!((*self.0.as_ptr()).budget).read() }
    }
}

#[inline(always)]
fn header() -> Option<Shared> {
    std::ptr::NonNull::new(MAP.load(Ordering::Acquire)).map(Shared)
}

/// Milliseconds of `CLOCK_MONOTONIC`: the same clock for every process of the host (in one
/// time namespace), and never set back.
fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// The start time of process `pid` (see `layout::proc_of`), read with raw system calls into
/// a stack buffer: no cancellation point, no allocation (it runs under the group lock).
fn start_ticks(pid: u32) -> Proc {
    let mut path = [0u8; 48];
    let mut n = 0;
    let mut put = |s: &[u8]| {
        path[n..n + s.len()].copy_from_slice(s);
        n += s.len();
    };
    let mut digits = [0u8; 10];
    let mut d = digits.len();
    let mut v = pid;
    loop {
        d -= 1;
        digits[d] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    put(b"/proc/");
    put(&digits[d..]);
    put(b"/task/");
    put(&digits[d..]);
    put(b"/stat\0");
    let Ok(path) = CStr::from_bytes_until_nul(&path) else {
        return Proc::Unknown;
    };
    let gone = |e: c_int| {
        if e == libc::ENOENT || e == libc::ESRCH {
            Proc::Gone
        } else {
            Proc::Unknown
        }
    };
    let fd = match sys::open_read(path) {
        Ok(fd) => fd,
        Err(e) => return gone(e),
    };
    // The start time is field 22, within the first few hundred bytes whatever the other fields hold.
    let mut buf = [0u8; 1024];
    let mut len = 0;
    let mut failed = None;
    while len < buf.len() {
        match sys::read(fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(k) => len += k,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    sys::close(fd);
    match (layout::parse_start_ticks(&buf[..len]), failed) {
        (Some(t), _) => Proc::Started(t),
        (None, Some(e)) => gone(e), // the process exited between the open and the read: ESRCH
        (None, None) => Proc::Unknown,
    }
}

/// The longest one call (a reservation, a release, the exit, a report's figures) waits for the
/// ledger's lock, in all, in milliseconds. Nobody holds the lock for more than a few hundred
/// nanoseconds of arithmetic, so a wait this long means a holder that does not run: stopped
/// (`SIGSTOP`, a debugger, `docker pause`) or starved. The call then goes without the group
/// (`unreachable`).
pub const LOCK_WAIT_MS: u64 = 50;
/// After a wait ran out, for this long this process only tries the lock (a short spin, no
/// sleep) while the same thread holds it: a group whose holder is stopped costs each call
/// microseconds, not `LOCK_WAIT_MS`. A lock that is free again is taken at the first try, and a
/// lock held by another thread is waited for again.
pub const UNREACHABLE_MS: u64 = 1000;
/// Tries of the lock spinning before a wait sleeps. While the holder a wait ran out on still
/// holds the lock, a call spins only.
const SPINS: u32 = 64;
/// The longest one sleep on the mutex's futex word, in microseconds: a taker that found the word
/// free takes it without the waiters' bit, so a sleeper it did not wake tries again this soon.
const SLEEP_MAX_US: u64 = 2000;
/// The mutex word's bits besides the owner (the kernel's robust-futex ABI).
const FUTEX_WAITERS: u32 = 0x8000_0000;
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// `monotonic_ms` until which this process only tries the lock while `STUCK_OWNER` holds it (0:
/// it waits, up to the bound).
static UNREACHABLE_UNTIL: AtomicU64 = AtomicU64::new(0);
/// The thread that held the lock when a wait ran out (its id, as the mutex word holds it).
static STUCK_OWNER: AtomicU32 = AtomicU32::new(0);
/// Waits for the lock that ran out (for the report).
static TIMEOUTS: AtomicU64 = AtomicU64::new(0);
/// Bytes this process pinned whatever the limits (`force`) while the ledger could not be reached,
/// and bytes it released meanwhile: folded into its share at its next taking of the lock, so the
/// group's figures heal (`Locked::settle`).
static PENDING_ADD: AtomicU64 = AtomicU64::new(0);
static PENDING_RELEASE: AtomicU64 = AtomicU64::new(0);
/// Whether a previous image's slot (`forget_previous_image`) is still to be emptied: start-up only
/// tries the lock, and the first taking of it does the rest.
static FORGET: AtomicBool = AtomicBool::new(false);
/// This image's pid and start time, for that.
static IMAGE_PID: AtomicU32 = AtomicU32::new(0);
static IMAGE_TICKS: AtomicU64 = AtomicU64::new(0);
/// This image's executable's name, for the slot it takes over from the previous image.
static IMAGE_EXE: std::sync::OnceLock<[u8; layout::EXE_BYTES]> = std::sync::OnceLock::new();

/// This process's IPC and PID namespaces (0: not read yet; read again in a fork child, which a
/// `clone` may have put in new ones).
static IPC_NS: AtomicU64 = AtomicU64::new(0);
static PID_NS: AtomicU64 = AtomicU64::new(0);
/// The set and slot in which this process holds a semaphore (-1: none): what `leave` lowers.
static HELD_ID: AtomicI32 = AtomicI32::new(-1);
static HELD_SLOT: AtomicUsize = AtomicUsize::new(0);
/// Why this process holds no semaphore though it joined (0: it holds one, or has not joined):
/// an errno of `semget`/`semop` (a sandbox denying them, the kernel's limit on sets), or one of
/// `NO_SEM_*`. Its liveness is then told by its pid (`Snapshot::liveness`).
static NO_SEM: AtomicI32 = AtomicI32::new(0);
const NO_SEM_OTHER_NS: i32 = -1;
const NO_SEM_NS_UNKNOWN: i32 = -2;

/// This process's namespaces, read once (a `stat` of each `/proc/self/ns` file, no descriptor).
fn here() -> Here {
    let ipc = IPC_NS.load(Ordering::Relaxed);
    if ipc != 0 {
        return Here {
            ipc_ns: ipc,
            pid_ns: PID_NS.load(Ordering::Relaxed),
        };
    }
    let h = Here::read();
    PID_NS.store(h.pid_ns, Ordering::Relaxed);
    IPC_NS.store(h.ipc_ns, Ordering::Relaxed);
    h
}

/// Raises slot `i`'s semaphore for this process (`SEM_UNDO`), in the group's set, creating the
/// set when there is none in this IPC namespace. Under the lock, before the slot is written: a
/// look that reads the slot then finds the semaphore raised. The set's key, or 0 (none held:
/// `NO_SEM` says why).
fn hold_semaphore(l: &mut Locked, i: usize, here: Here) -> i32 {
    let why = match open_or_create_set(l, here) {
        Ok(set) => match set.hold(i) {
            Ok(()) => {
                HELD_SLOT.store(i, Ordering::Relaxed);
                HELD_ID.store(set.id, Ordering::Relaxed);
                NO_SEM.store(0, Ordering::Relaxed);
                return set.key;
            }
            Err(e) => e,
        },
        Err(e) => e,
    };
    NO_SEM.store(why, Ordering::Relaxed);
    0
}

fn open_or_create_set(l: &mut Locked, here: Here) -> Result<Set, c_int> {
    if here.ipc_ns == 0 {
        return Err(NO_SEM_NS_UNKNOWN);
    }
    let (key, ns) = (l.h().sem_key, l.h().sem_ipc_ns);
    if key != 0 && ns != here.ipc_ns {
        return Err(NO_SEM_OTHER_NS);
    }
    if key != 0 {
        match Set::open(key) {
            Ok(set) => return Ok(set),
            // Removed (`ipcrm`), or its namespace ended and another got its number: a new set.
            // Members that hold a semaphore in the old one keep its key in their slots.
            Err(libc::ENOENT) | Err(libc::EIDRM) | Err(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    let set = Set::create()?;
    let h = l.h_mut();
    h.sem_key = set.key;
    h.sem_ipc_ns = here.ipc_ns;
    Ok(set)
}

/// Lowers the semaphore this process holds (leaving, or joining again in another slot), so that
/// the slot's next member is not taken for alive on its account.
fn let_go_semaphore() {
    let id = HELD_ID.swap(-1, Ordering::Relaxed);
    if id >= 0 {
        let _ = Set { id, key: 0 }.let_go(HELD_SLOT.load(Ordering::Relaxed));
    }
}

/// One call's wait for the lock: every taking of it in the call shares one deadline.
struct Wait {
    /// `monotonic_ns` after which the call goes without the group (0: not waited yet).
    deadline_ns: u64,
    /// Only one try (start-up: a process that pins nothing never waits).
    once: bool,
}

impl Wait {
    fn new() -> Wait {
        Wait {
            deadline_ns: 0,
            once: false,
        }
    }

    fn once() -> Wait {
        Wait {
            deadline_ns: 0,
            once: true,
        }
    }
}

/// Why the lock was not taken.
enum NoLock {
    /// Held past the bound: this call goes without the group.
    Busy,
    /// Unrecoverable or corrupt: this process left the group (its own budget only).
    Gone,
    /// The ledger was removed (`Header::closed`): the group's name is to be opened again.
    Closed,
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The mutex's futex word: owner, waiters' bit, owner-died bit (see `owner`).
fn word(mutex: *mut libc::pthread_mutex_t) -> &'static AtomicU32 {
    // SAFETY: the mutex's first 4 bytes are an aligned int, changed by other threads and
    // processes with atomic instructions only; it lives as long as the ledger mapping (for ever).
    unsafe { AtomicU32::from_ptr(mutex as *mut u32) }
}

/// Sleeps until the holder lets go of the mutex (its unlock wakes a sleeper when the waiters' bit
/// is set, as glibc's own lock sets it), or for `us` microseconds at most: a raw `futex` wait on
/// the shared word (a relative timeout, on `CLOCK_MONOTONIC`), no cancellation point.
fn sleep_on(mutex: *mut libc::pthread_mutex_t, us: u64) {
    let w = word(mutex);
    let v = w.load(Ordering::Relaxed);
    if v & FUTEX_TID_MASK == 0 {
        return; // free (or its owner died): try at once
    }
    if v & FUTEX_WAITERS == 0
        && w.compare_exchange(v, v | FUTEX_WAITERS, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return; // changed hands meanwhile: try at once
    }
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: (us.clamp(1, 999_999) * 1000) as libc::c_long,
    };
    // SAFETY: a shared (not private: other processes map it) futex wait on a valid word, while it
    // still holds the value it was seen with; `ts` is a valid relative timeout. EAGAIN, EINTR and
    // ETIMEDOUT all mean: try again.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAIT,
            v | FUTEX_WAITERS,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        )
    };
}

/// Takes the ledger's mutex within `w`'s bound: `pthread_mutex_trylock` (never a cancellation
/// point, never a wait of its own), spinning, then sleeping on the mutex's futex word until the
/// holder lets go or the deadline passes. No `pthread_mutex_timedlock`: its deadline is
/// `CLOCK_REALTIME`, which a clock set back stretches without bound (`pthread_mutex_clocklock`
/// needs glibc 2.30; pinguard runs on 2.17). The mutex's own answer: 0, `EOWNERDEAD` (a holder
/// that died), another error; or `ETIMEDOUT` for a holder that kept it past the bound.
fn take(mutex: *mut libc::pthread_mutex_t, w: &mut Wait) -> c_int {
    let patient = !w.once
        && (monotonic_ms() >= UNREACHABLE_UNTIL.load(Ordering::Relaxed)
            || owner(mutex) != STUCK_OWNER.load(Ordering::Relaxed));
    let mut tries = 0u32;
    loop {
        // SAFETY: the mutex was initialised process-shared and robust before the ledger was
        // published; a pthread mutex is made to be shared this way, through a raw pointer.
        let rc = unsafe { libc::pthread_mutex_trylock(mutex) };
        if rc != libc::EBUSY {
            if (rc == 0 || rc == libc::EOWNERDEAD) && UNREACHABLE_UNTIL.load(Ordering::Relaxed) != 0
            {
                UNREACHABLE_UNTIL.store(0, Ordering::Relaxed);
            }
            return rc;
        }
        if w.once {
            return libc::ETIMEDOUT;
        }
        if w.deadline_ns == 0 {
            w.deadline_ns = monotonic_ns() + LOCK_WAIT_MS * 1_000_000;
        }
        tries += 1;
        if tries <= SPINS {
            std::hint::spin_loop();
            continue;
        }
        if !patient {
            return libc::ETIMEDOUT; // the same holder as when a wait ran out: no sleep
        }
        let now = monotonic_ns();
        if now >= w.deadline_ns {
            TIMEOUTS.fetch_add(1, Ordering::Relaxed);
            STUCK_OWNER.store(owner(mutex), Ordering::Relaxed);
            UNREACHABLE_UNTIL.store(
                (now / 1_000_000).saturating_add(UNREACHABLE_MS).max(1),
                Ordering::Relaxed,
            );
            w.deadline_ns = 1; // the rest of the call does not wait either
            return libc::ETIMEDOUT;
        }
        sleep_on(mutex, ((w.deadline_ns - now) / 1000 + 1).min(SLEEP_MAX_US));
    }
}

/// The thread holding the mutex now (0: none). A robust mutex's first word is the futex word
/// the kernel's robust-futex ABI defines (the owner's thread id in its low 30 bits, which the
/// kernel reads when the owner dies), in glibc's layout on every architecture.
fn owner(mutex: *mut libc::pthread_mutex_t) -> u32 {
    word(mutex).load(Ordering::Relaxed) & FUTEX_TID_MASK
}

/// The ledger, locked; recovered when its last holder died holding it. Held only for the
/// arithmetic: every file a decision needs (`/proc` entries, `/proc/meminfo`) is read before the
/// lock is taken, or with it let go and taken again. Cancellation stays off while it is held: a
/// thread cancelled with the lock held would leave it to `EOWNERDEAD` repair, and an unwinding
/// through pinguard's frames would abort the process.
struct Locked {
    ledger: Shared,
    _nc: sys::NoCancel,
}

impl Locked {
    /// The ledger, locked within `w`'s bound, with this process's pending figures folded in;
    /// `Closed` for a ledger that was removed (nothing of this process's is booked in it).
    fn new(ledger: Shared, w: &mut Wait) -> Result<Locked, NoLock> {
        let mut l = Locked::any(ledger, w)?;
        if l.h().closed != 0 {
            return Err(NoLock::Closed);
        }
        l.settle();
        Ok(l)
    }

    /// The ledger, locked within `w`'s bound, closed or not, as it is.
    fn any(ledger: Shared, w: &mut Wait) -> Result<Locked, NoLock> {
        let nc = sys::NoCancel::new();
        // SAFETY: the place of the mutex in the published ledger mapping; no reference is made.
        let rc = take(
            unsafe { std::ptr::addr_of_mut!((*ledger.0.as_ptr()).mutex) },
            w,
        );
        let l = match rc {
            0 => Locked { ledger, _nc: nc },
            libc::EOWNERDEAD => {
                let mut l = Locked { ledger, _nc: nc };
                // Whatever the dead holder was doing, the members' shares are the truth; its own
                // share goes at the next look for dead members, due at once.
                l.h_mut().used = l.sum_of_shares();
                l.h_mut().rescan_after_ms = 0;
                // SAFETY: this thread holds the mutex (EOWNERDEAD hands it over).
                unsafe { libc::pthread_mutex_consistent(&mut l.h_mut().mutex) };
                l
            }
            libc::ETIMEDOUT => return Err(NoLock::Busy),
            _ => {
                MAP.store(std::ptr::null_mut(), Ordering::Release);
                tracing::warn!("group: the ledger's lock cannot be taken (error {rc}); this process now uses its own budget only");
                drop(nc);
                return Err(NoLock::Gone);
            }
        };
        Ok(l)
    }

    /// Whether no slot is taken.
    fn empty(&self) -> bool {
        self.h().members.iter().all(|m| m.pid == 0)
    }

    /// Removes the ledger, which no member holds a slot in: closed first (a process that mapped it
    /// and joins later sees the mark and opens the group's name again), then its semaphore set
    /// and its name, while the name is still this file's (`id`). Under the lock, which every
    /// joiner takes: nobody joins between the check that it is empty and the mark.
    fn close(&mut self, id: (u64, u64)) {
        self.remove_set_if_empty();
        self.h_mut().closed = 1;
        let Some(path) = PATH.get() else { return };
        if sys::path_id(path).is_some_and(|f| (f.dev, f.ino) == id) {
            // SAFETY: a NUL-terminated path; the name is the group's ledger, this very file.
            unsafe { libc::unlink(path.as_ptr()) };
        }
    }

    /// Applies what this process could not while the ledger was out of reach: the previous
    /// image's slot to empty, bytes pinned and released meanwhile.
    fn settle(&mut self) {
        if FORGET.load(Ordering::Relaxed) && FORGET.swap(false, Ordering::Relaxed) {
            self.forget_image();
        }
        if PENDING_ADD.load(Ordering::Relaxed) == 0 && PENDING_RELEASE.load(Ordering::Relaxed) == 0
        {
            return;
        }
        let i = SLOT.load(Ordering::Relaxed);
        if !self.owns(i) {
            return; // not joined yet: a join folds them in
        }
        let add = PENDING_ADD.swap(0, Ordering::Relaxed);
        if add > 0 {
            self.book(i, add);
        }
        let released = PENDING_RELEASE.swap(0, Ordering::Relaxed);
        if released > 0 {
            let _ = self.unbook(i, released);
        }
    }

    /// Adds `bytes` to member `i`'s share and the group's total; `false` (nothing changed) for
    /// a sum past `u64::MAX`.
    fn book(&mut self, i: usize, bytes: u64) -> bool {
        let (Some(used), Some(share)) = (
            self.h().used.checked_add(bytes),
            self.h().members[i].bytes.checked_add(bytes),
        ) else {
            return false;
        };
        let h = self.h_mut();
        h.used = used;
        h.peak = h.peak.max(used);
        let m = &mut h.members[i];
        m.bytes = share;
        m.peak = m.peak.max(share);
        true
    }

    /// Takes `bytes` off member `i`'s share; `Err(share)` (nothing changed) for more than it holds.
    fn unbook(&mut self, i: usize, bytes: u64) -> Result<(), u64> {
        let m = &mut self.h_mut().members[i];
        let Some(share) = m.bytes.checked_sub(bytes) else {
            return Err(m.bytes);
        };
        m.bytes = share;
        self.h_mut().used = match self.h().used.checked_sub(bytes) {
            Some(u) => u,
            None => self.sum_of_shares(),
        };
        if self.h().host_reserve > 0 {
            let h = self.h_mut();
            h.host_released = h.host_released.saturating_add(bytes);
        }
        if let Some(k) = self
            .entry_of(i)
            .filter(|&k| self.h().cgroups[k].reserve > 0)
        {
            let c = &mut self.h_mut().cgroups[k];
            c.released = c.released.saturating_add(bytes);
        }
        Ok(())
    }

    /// The previous image's slot (this image's pid and start time): its share goes back to the
    /// group, and this image takes the slot over with a share of 0. The semaphore the previous
    /// image raised is still raised (`SEM_UNDO` adjustments survive `execve`), so it is this
    /// image's: a new slot would leave it raised for as long as the process lives.
    fn forget_image(&mut self) {
        let (pid, ticks) = (
            IMAGE_PID.load(Ordering::Relaxed),
            IMAGE_TICKS.load(Ordering::Relaxed),
        );
        // Pid 1 of two containers can start in the same clock tick: the PID namespace tells them apart.
        let pid_ns = here().pid_ns;
        for i in 0..MAX_MEMBERS {
            let m = &self.h().members[i];
            if m.pid != pid
                || m.start_ticks != ticks
                || m.pid_ns != pid_ns
                || (i == SLOT.load(Ordering::Relaxed) && self.owns(i))
            {
                continue;
            }
            if SLOT.load(Ordering::Relaxed) == NOT_JOINED {
                self.take_over(i, pid);
            } else {
                self.vacate(i);
            }
        }
    }

    /// The last member to leave removes the group's semaphore set (a set outlives its
    /// processes, until its IPC namespace ends): the next to join makes a new one. Only a member
    /// in the set's namespace can; a member that holds a semaphore has a slot.
    fn remove_set_if_empty(&mut self) {
        let (key, ns) = (self.h().sem_key, self.h().sem_ipc_ns);
        if key == 0 || ns != here().ipc_ns || self.h().members.iter().any(|m| m.pid != 0) {
            return;
        }
        match Set::open(key) {
            Ok(set) => set.remove(),
            Err(libc::ENOENT) => {}
            Err(_) => return, // denied to this member (a sandbox): left to the next to leave
        }
        let h = self.h_mut();
        (h.sem_key, h.sem_ipc_ns) = (0, 0);
    }

    /// Makes slot `i`, the previous image's, this image's with a share of 0.
    fn take_over(&mut self, i: usize, pid: u32) {
        let bytes = self.h().members[i].bytes;
        let used = self
            .h()
            .used
            .checked_sub(bytes)
            .unwrap_or_else(|| self.sum_of_shares().saturating_sub(bytes));
        let exe = IMAGE_EXE.get().copied().unwrap_or([0; layout::EXE_BYTES]);
        let here = here();
        self.clear_ext(i);
        let h = self.h_mut();
        h.used = used;
        let m = &mut h.members[i];
        (
            m.bytes,
            m.peak,
            m.denied,
            m.downgraded,
            m.host_reserve,
            m.exe,
        ) = (0, 0, 0, 0, 0, exe);
        if m.sem_key != 0 && m.ipc_ns == here.ipc_ns {
            if let Ok(set) = Set::open(m.sem_key) {
                HELD_SLOT.store(i, Ordering::Relaxed);
                HELD_ID.store(set.id, Ordering::Relaxed);
            }
        }
        MY_PID.store(pid, Ordering::Relaxed);
        SLOT.store(i, Ordering::Relaxed);
    }

    /// The ledger, for as long as the lock is held and this borrow lasts.
    fn h(&self) -> &Header {
        // SAFETY: this guard holds the group lock, under which every member changes the ledger's
        // plain fields; the ones members bump outside it (`denied`, `downgraded`) are only
        // copied out here, into a report.
        unsafe { self.ledger.0.as_ref() }
    }

    fn h_mut(&mut self) -> &mut Header {
        // SAFETY: as `h`; the `&mut self` borrow keeps this the only reference this process
        // makes while it lasts.
        unsafe { self.ledger.0.as_mut() }
    }

    fn sum_of_shares(&self) -> u64 {
        // Saturating only here, for a ledger corrupted past any real sum: nothing else saturates.
        self.h()
            .members
            .iter()
            .filter(|m| m.pid != 0)
            .fold(0u64, |a, m| a.saturating_add(m.bytes))
    }

    /// Empties slot `i`, giving its share back to the group.
    fn vacate(&mut self, i: usize) {
        let bytes = self.h().members[i].bytes;
        // SAFETY: `Member` is plain data; all zeroes is a free slot.
        self.h_mut().members[i] = unsafe { std::mem::zeroed() };
        self.clear_ext(i);
        self.h_mut().used = match self.h().used.checked_sub(bytes) {
            Some(u) => u,
            None => self.sum_of_shares(), // a ledger someone edited: back to the truth
        };
    }

    /// Empties slot `i`'s figures beyond version 4's (`in_flight` atomically: its member may be
    /// taking bytes off it now, and then takes off none that are not its own).
    fn clear_ext(&mut self, i: usize) {
        let e = &mut self.h_mut().ext[i];
        (e.cgroup, e.cgroup_reserve) = (0, 0);
        self.ledger.in_flight(i).store(0, Ordering::Relaxed);
    }

    /// Whether slot `i` is still this process's (a member wrongly taken for dead, or a second
    /// copy of pinguard in the process, may have lost it).
    fn owns(&self, i: usize) -> bool {
        i < MAX_MEMBERS && self.h().members[i].pid == MY_PID.load(Ordering::Relaxed)
    }

    /// Empties the slots `dead` found, those still held by the very process found gone; returns
    /// the bytes freed.
    fn bury(&mut self, dead: &Dead) -> u64 {
        match dead.why {
            None => return 0,
            Some(Scan::Join) => self.h_mut().join_scans = self.h().join_scans.wrapping_add(1),
            Some(Scan::Room) => self.h_mut().room_scans = self.h().room_scans.wrapping_add(1),
        }
        let mut freed = 0u64;
        for &(i, pid, ticks, serial) in &dead.found[..dead.n] {
            let m = &self.h().members[i as usize];
            if m.pid == pid && m.start_ticks == ticks && m.serial == serial {
                freed = freed.saturating_add(m.bytes);
                self.vacate(i as usize);
            }
        }
        freed
    }

    /// Whether a member that needs room may look for dead members now: once per `RESCAN_MS` for
    /// the whole group, so a full group's refusals cost a clock read, not a `/proc` walk.
    fn room_scan_due(&mut self) -> bool {
        let now = monotonic_ms();
        let after = self.h().rescan_after_ms;
        // A deadline further ahead than one interval was set by a clock that is not ours (another
        // time namespace): it must not silence the scan.
        if now >= after || after > now.saturating_add(layout::RESCAN_MS) {
            self.h_mut().rescan_after_ms = now.saturating_add(layout::RESCAN_MS);
            return true;
        }
        false
    }
}

/// Members found gone by a look made without the lock: slot, pid, start time and join serial,
/// so that only a slot still held by that very member is emptied (`Locked::bury`). Bounded: more
/// dead members than this wait for the next look.
struct Dead {
    why: Option<Scan>,
    n: usize,
    found: [(u16, u32, u64, u64); Dead::MAX],
}

impl Dead {
    const MAX: usize = 16;

    fn none() -> Dead {
        Dead {
            why: None,
            n: 0,
            found: [(0, 0, 0, 0); Dead::MAX],
        }
    }

    /// Judges every member (`live::judge`): the ledger's fields read one at a time, without the
    /// lock, each slot before its semaphore (a slot that changes meanwhile is not emptied, as
    /// `bury` checks it again). One reading of every semaphore first spares the living a call
    /// each: a member whose semaphore was raised then is not looked at again.
    fn look(h: Shared, why: Scan) -> Dead {
        let mut d = Dead {
            why: Some(why),
            ..Dead::none()
        };
        let me = SLOT.load(Ordering::Relaxed);
        let here = here();
        let mut raised = [0u16; MAX_MEMBERS];
        let set = h.set_here(here).filter(|s| s.values(&mut raised).is_ok());
        for (i, &raised_i) in raised.iter().enumerate() {
            let (seen, serial) = h.member_seen(i);
            if seen.pid == 0 || (i == me && seen.pid == MY_PID.load(Ordering::Relaxed)) {
                continue;
            }
            if set.is_some_and(|s| s.key == seen.sem_key && raised_i > 0) {
                continue;
            }
            let value = |key: i32| match set.filter(|s| s.key == key) {
                Some(s) => s.value(i).ok(),
                None => Set::open(key).ok()?.value(i).ok(),
            };
            if live::judge(&seen, here, value, start_ticks) == Verdict::Gone {
                d.found[d.n] = (i as u16, seen.pid, seen.start_ticks, serial);
                d.n += 1;
                if d.n == Dead::MAX {
                    break;
                }
            }
        }
        d
    }
}

/// The offset of member `i`'s field at `field` (an `offset_of!(Member, ..)`) in the ledger.
fn member_at(i: usize, field: usize) -> usize {
    std::mem::offset_of!(Header, members)
        + i.min(MAX_MEMBERS - 1) * std::mem::size_of::<Member>()
        + field
}

impl Shared {
    /// The `u64` field at `offset` (an `offset_of!`, or `member_at`), read without the lock.
    fn u64_at(self, offset: usize) -> u64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= layout::SIZE);
        // SAFETY: an aligned u64 inside the published ledger mapping (checked just above: the
        // mapping is page-aligned); other processes write it under the lock, and an atomic read
        // races with nothing.
        unsafe { AtomicU64::from_ptr(self.0.as_ptr().cast::<u8>().add(offset).cast::<u64>()) }
            .load(Ordering::Relaxed)
    }

    /// The `u32` field at `offset`, read without the lock.
    fn u32_at(self, offset: usize) -> u32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= layout::SIZE);
        // SAFETY: an aligned u32 inside the published ledger mapping, as in `u64_at`.
        unsafe { AtomicU32::from_ptr(self.0.as_ptr().cast::<u8>().add(offset).cast::<u32>()) }
            .load(Ordering::Relaxed)
    }

    /// Member `i`'s pid and start time, read without the lock (each atomically; together they
    /// may be of two members, which `Locked::bury` tells apart).
    fn member_id(self, i: usize) -> (u32, u64) {
        use std::mem::offset_of;
        (
            self.u32_at(member_at(i, offset_of!(Member, pid))),
            self.u64_at(member_at(i, offset_of!(Member, start_ticks))),
        )
    }

    /// What member `i`'s slot says of its process, and its join serial, read without the lock.
    fn member_seen(self, i: usize) -> (live::Seen, u64) {
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
    fn set_here(self, here: Here) -> Option<Set> {
        use std::mem::offset_of;
        let key = self.u32_at(offset_of!(Header, sem_key)) as i32;
        let ns = self.u64_at(offset_of!(Header, sem_ipc_ns));
        (key != 0 && here.ipc_ns != 0 && ns == here.ipc_ns)
            .then(|| Set::open(key).ok())
            .flatten()
    }
}

/// A shared reading as a decision needs it: the host's (the header's `host_*`) or a cgroup's
/// (`layout::Cgroup`), with the bytes of the members it counts.
#[derive(Clone, Copy)]
struct Figures {
    available: u64,
    settled: u64,
    read_ms: u64,
    released: u64,
    /// The bytes of the members the reading is for (the group's, or its cgroup's members').
    used: u64,
}

impl Figures {
    /// Whether `bytes` more keep above `reserve`: a reading is asked for (`Room::Read`) when it
    /// is due, and before a refusal, unless one was taken for this call (`fresh`). The refusal
    /// gives the figure as the reading and the calls since count it.
    fn room(&self, bytes: u64, reserve: u64, fresh: bool) -> Room {
        let Some(next) = self.used.checked_add(bytes) else {
            return Room::Short(self.now());
        };
        if !fresh && self.due(reserve) {
            return Room::Read;
        }
        if next <= host::cap_of(self.settled, self.available, reserve).saturating_sub(self.released)
        {
            return Room::Fits;
        }
        if !fresh {
            return Room::Read;
        }
        Room::Short(self.now())
    }

    /// The reading is older than `host::READING_MS` (or from a clock that is not ours), or the
    /// members' bytes moved by more than a `host::MOVE_SHARE`th of the headroom it left.
    fn due(&self, reserve: u64) -> bool {
        let now = monotonic_ms();
        let slack = self.available.saturating_sub(reserve) / host::MOVE_SHARE;
        let moved = self.used.abs_diff(self.settled) > slack || self.released > slack;
        self.read_ms == 0
            || now.saturating_sub(self.read_ms) >= host::READING_MS
            || self.read_ms > now
            || moved
    }

    fn now(&self) -> u64 {
        self.settled
            .saturating_add(self.available)
            .saturating_sub(self.used)
            .saturating_sub(self.released)
    }
}

/// A reading for a shared floor, taken with the lock let go: what the ledger said when it was
/// started, and what the file said.
struct Reading {
    /// The shared reading when this one was started (time, figure, settled bytes): another
    /// member's reading installed since is used instead.
    was: (u64, u64, u64),
    /// The members' bytes the reading reflects (`Locked::settled_now`).
    settled: u64,
    /// The shared `released` when it was started: releases since stay counted.
    released: u64,
    /// The figure, once read.
    available: u64,
}

impl Reading {
    fn start(f: Figures, settled: u64) -> Reading {
        Reading {
            was: (f.read_ms, f.available, f.settled),
            settled,
            released: f.released,
            available: 0,
        }
    }
}

/// A reading of the cgroup's headroom for the group's cgroup reserve: for the member's entry
/// when it was started (`None`: it had none), and what was read.
struct CgReading {
    entry: Option<usize>,
    r: Reading,
    head: Option<crate::runtime::cgroup::Headroom>,
}

/// What a shared floor says of `bytes` more.
enum Room {
    Fits,
    /// No: the figure as counted for the refusal.
    Short(u64),
    /// A reading is due first: the lock is to be let go while the file is read.
    Read,
}

/// Where each member's figures beyond version 4's are (`layout::MemberExt`).
fn ext_at(i: usize, field: usize) -> usize {
    std::mem::offset_of!(Header, ext)
        + i.min(MAX_MEMBERS - 1) * std::mem::size_of::<layout::MemberExt>()
        + field
}

impl Shared {
    /// The `u64` at `offset` (an `offset_of!`, `member_at`, `ext_at`), to change atomically: the
    /// fields members change without the lock.
    fn atomic_u64(self, offset: usize) -> &'static AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= layout::SIZE);
        // SAFETY: an aligned u64 inside the published ledger mapping, which is never unmapped;
        // every process changes it atomically.
        unsafe { AtomicU64::from_ptr(self.0.as_ptr().cast::<u8>().add(offset).cast::<u64>()) }
    }

    /// Member `i`'s calls in flight (`MemberExt::in_flight`).
    fn in_flight(self, i: usize) -> &'static AtomicU64 {
        self.atomic_u64(ext_at(
            i,
            std::mem::offset_of!(layout::MemberExt, in_flight),
        ))
    }
}

impl Locked {
    /// A floor's refusal, unless other members' calls in flight count against it and no room
    /// scan ran in this call or the last interval (`room_scan_due`): then a scan first.
    fn refuse_or_scan(&mut self, i: usize, done: &mut Done, why: Refused) -> Next {
        let others = self
            .in_entry(None)
            .filter(|&j| j != i)
            .any(|j| self.ledger.in_flight(j).load(Ordering::Acquire) > 0);
        if others && !done.room && self.room_scan_due() {
            done.room = true;
            return Next::Scan;
        }
        Next::Refused(why)
    }

    /// The members in cgroup entry `k` (`None`: every member): a scan of the slots under the
    /// lock, arithmetic only (256 slots).
    fn in_entry(&self, k: Option<usize>) -> impl Iterator<Item = usize> + '_ {
        let h = self.h();
        (0..MAX_MEMBERS).filter(move |&i| {
            h.members[i].pid != 0 && k.is_none_or(|k| h.ext[i].cgroup as usize == k + 1)
        })
    }

    /// The bytes of the members in cgroup entry `k`.
    fn cgroup_used(&self, k: usize) -> u64 {
        self.in_entry(Some(k))
            .fold(0u64, |a, i| a.saturating_add(self.h().members[i].bytes))
    }

    /// The members' bytes a reading started now reflects: theirs less their calls in flight
    /// (each member books a call's bytes as in flight and takes them off when the call returns,
    /// its pages charged by then). Counted before the file is read: a call that lands in between
    /// is in the file and not in the settled bytes, which errs on the side of the floor.
    fn settled_now(&self, k: Option<usize>) -> u64 {
        let used = match k {
            Some(k) => self.cgroup_used(k),
            None => self.h().used,
        };
        // Acquire, paired with `landed`: a call seen landed has its pages in the file read next.
        let flying = self.in_entry(k).fold(0u64, |a, i| {
            a.saturating_add(self.ledger.in_flight(i).load(Ordering::Acquire))
        });
        used.saturating_sub(flying)
    }

    fn host_figures(&self) -> Figures {
        let h = self.h();
        Figures {
            available: h.host_available,
            settled: h.host_settled,
            read_ms: h.host_read_ms,
            released: h.host_released,
            used: h.used,
        }
    }

    /// Whether the host reserve `reserve` (this member's) lets the group have `bytes` more: the
    /// group's bytes stay at or below what the shared reading settled plus the headroom it left.
    fn host_room(&self, bytes: u64, reserve: u64, fresh: bool) -> Room {
        self.host_figures().room(bytes, reserve, fresh)
    }

    fn start_reading(&self) -> Reading {
        Reading::start(self.host_figures(), self.settled_now(None))
    }

    /// Installs reading `r` (the lock was let go while it was taken), unless another member
    /// installed one meanwhile.
    fn install(&mut self, r: Reading, reserve: u64) {
        let h = self.h_mut();
        h.host_lowest_available = h.host_lowest_available.min(r.available);
        h.host_reserve = h.host_reserve.max(reserve);
        if (h.host_read_ms, h.host_available, h.host_settled) != r.was {
            return; // newer than when ours started: as fresh as a refusal needs
        }
        h.host_available = r.available;
        h.host_settled = r.settled;
        // Releases until the file was read are in it (or, made after, counted twice: towards the floor).
        h.host_released = h.host_released.saturating_sub(r.released);
        h.host_read_ms = monotonic_ms().max(1);
    }

    /// Member `i`'s cgroup entry.
    fn entry_of(&self, i: usize) -> Option<usize> {
        (self.h().ext[i].cgroup as usize)
            .checked_sub(1)
            .filter(|&k| k < layout::MAX_CGROUPS)
    }

    fn cgroup_figures(&self, k: usize) -> Figures {
        let c = &self.h().cgroups[k];
        Figures {
            available: c.available,
            settled: c.settled,
            read_ms: c.read_ms,
            released: c.released,
            used: self.cgroup_used(k),
        }
    }

    /// Whether the cgroup reserve `reserve` (this member's) lets member `i`'s cgroup have `bytes`
    /// more: as `host_room`, over the members whose readings name the same cgroup. A member
    /// without an entry reads first; after that (`fresh`) its own reading decides (`cgroup_shared`).
    fn cgroup_room(&self, i: usize, bytes: u64, reserve: u64, fresh: bool) -> Room {
        match self.entry_of(i) {
            Some(k) => self.cgroup_figures(k).room(bytes, reserve, fresh),
            None if fresh => Room::Fits,
            None => Room::Read,
        }
    }

    fn start_cgroup_reading(&self, i: usize) -> CgReading {
        let entry = self.entry_of(i);
        let r = match entry {
            Some(k) => Reading::start(self.cgroup_figures(k), self.settled_now(Some(k))),
            None => Reading {
                was: (0, 0, 0),
                settled: 0,
                released: 0,
                available: 0,
            },
        };
        CgReading {
            entry,
            r,
            head: None,
        }
    }

    /// The entry for the cgroup folder `(dev, ino)`: its own, else a free one (never used, or
    /// no member's any more), emptied for it. `None`: the table is full.
    fn entry_for(&mut self, dev: u64, ino: u64) -> Option<usize> {
        let h = self.h();
        if let Some(k) = h.cgroups.iter().position(|c| (c.dev, c.ino) == (dev, ino)) {
            return Some(k);
        }
        let used = |k: usize| {
            h.members
                .iter()
                .zip(h.ext.iter())
                .any(|(m, e)| m.pid != 0 && e.cgroup as usize == k + 1)
        };
        let k = (0..layout::MAX_CGROUPS)
            .find(|&k| (h.cgroups[k].dev, h.cgroups[k].ino) == (0, 0) || !used(k))?;
        let c = &mut self.h_mut().cgroups[k];
        // SAFETY: `Cgroup` is plain data; all zeroes is a free entry.
        *c = unsafe { std::mem::zeroed() };
        (c.dev, c.ino, c.lowest) = (dev, ino, u64::MAX);
        Some(k)
    }

    /// Installs cgroup reading `c` for member `i` (the lock was let go while it was taken):
    /// into the entry of the folder it names, which becomes the member's. Whether the decision
    /// may now be made (`false`: the member's entry changed, so the reading was started for
    /// another; `last` installs it anyway, with the bytes settled now).
    fn install_cgroup(&mut self, i: usize, c: CgReading, reserve: u64, last: bool) -> bool {
        let Some(head) = c.head else { return true };
        let Some(k) = Some((head.dev, head.ino))
            .filter(|&id| id != (0, 0))
            .and_then(|(d, n)| self.entry_for(d, n))
        else {
            self.h_mut().ext[i].cgroup = 0; // no shared reading: its own decides
            return true;
        };
        let mut r = c.r;
        if c.entry != Some(k) {
            self.h_mut().ext[i].cgroup = k as u32 + 1; // its share counts here from now on
            if !last {
                return false;
            }
            let f = self.cgroup_figures(k);
            r = Reading::start(f, self.settled_now(Some(k)));
        }
        let e = &mut self.h_mut().cgroups[k];
        (e.limit, e.reserve, e.lowest) =
            (head.limit, e.reserve.max(reserve), e.lowest.min(head.bytes));
        if (e.read_ms, e.available, e.settled) == r.was {
            e.available = head.bytes;
            e.settled = r.settled;
            e.released = e.released.saturating_sub(r.released);
            e.read_ms = monotonic_ms().max(1);
        }
        true
    }
}

#[derive(Clone, Copy)]
enum Scan {
    Join,
    Room,
}

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: this thread holds the mutex (taken in `new`). `_nc` is dropped after this, so
        // cancellation comes back only once the lock is released.
        unsafe { libc::pthread_mutex_unlock(&mut self.h_mut().mutex) };
    }
}

/// After `execve` the process keeps its pid and start time, and pinguard starts afresh in the new
/// image. A live member with this process's pid and start time is therefore its previous image
/// (a process is never a member twice), whose pinned memory the kernel released at exec: its
/// share goes back to the group, and the new image starts with none. Start-up only tries the
/// lock (a process that pins nothing never waits): held, the work is left to the first taking.
fn forget_previous_image(h: Shared) {
    // SAFETY: no arguments; it cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let Proc::Started(ticks) = start_ticks(pid) else {
        return;
    };
    let mut exe = [0u8; layout::EXE_BYTES];
    exe_name(&mut exe);
    let _ = IMAGE_EXE.set(exe);
    here(); // read now, not under the lock that taking the slot over holds
    IMAGE_PID.store(pid, Ordering::Relaxed);
    IMAGE_TICKS.store(ticks, Ordering::Relaxed);
    FORGET.store(true, Ordering::Relaxed);
    // `settle` empties the slot when the lock is had, now or at the first taking.
    drop(Locked::new(h, &mut Wait::once()));
}

/// The last component of this process's executable, read without allocating.
fn exe_name(out: &mut [u8; layout::EXE_BYTES]) {
    let mut buf = [0u8; 4096];
    // SAFETY: the path is NUL-terminated and `buf` is valid for its length.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/exe".as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
        )
    };
    if n <= 0 {
        return;
    }
    let path = &buf[..n as usize];
    let name = match path.iter().rposition(|&b| b == b'/') {
        Some(p) => &path[p + 1..],
        None => path,
    };
    let k = name.len().min(layout::EXE_BYTES - 1);
    out[..k].copy_from_slice(&name[..k]);
}

/// Where this process sits in the group.
enum Seat {
    /// Its slot.
    In(usize),
    /// Out of the group (every slot was taken when it joined): its own budget only. `true` when
    /// that was found just now.
    Out(bool),
    /// It cannot say when it started (`/proc` unreadable: out of descriptors, say), so it cannot
    /// be recorded: a member without its start time would be taken for dead by the next look.
    Unverified,
    /// It is to join, and has not read what a join needs (its start time, the dead members):
    /// the caller reads them with the lock let go.
    Join,
}

/// What a join needs, read before the lock: this process's start time, executable's name and
/// namespaces.
struct Joining {
    pid: u32,
    ticks: Proc,
    exe: [u8; layout::EXE_BYTES],
    here: Here,
}

impl Joining {
    fn read() -> Joining {
        // SAFETY: no arguments; it cannot fail.
        let pid = unsafe { libc::getpid() } as u32;
        let mut exe = [0u8; layout::EXE_BYTES];
        exe_name(&mut exe);
        Joining {
            pid,
            ticks: start_ticks(pid),
            exe,
            here: here(),
        }
    }
}

/// This process's slot, joining the group on first use (and again in a fork child, or when the
/// slot was lost) with what `joining` read.
fn seat(l: &mut Locked, joining: Option<&Joining>) -> Seat {
    match SLOT.load(Ordering::Relaxed) {
        NO_SLOT => return Seat::Out(false),
        NOT_JOINED => {}
        s if l.owns(s) => return Seat::In(s),
        _ => {} // taken from us: join again, with a share of 0 (what we held is no longer booked)
    }
    let Some(j) = joining else { return Seat::Join };
    let Proc::Started(ticks) = j.ticks else {
        return Seat::Unverified;
    };
    let Some(i) = l.h().members.iter().position(|m| m.pid == 0) else {
        SLOT.store(NO_SLOT, Ordering::Relaxed);
        return Seat::Out(true);
    };
    let_go_semaphore(); // a slot that was taken from us
    let sem_key = hold_semaphore(l, i, j.here);
    let serial = l.h().joins.wrapping_add(1);
    l.h_mut().joins = serial;
    l.clear_ext(i);
    let m: &mut Member = &mut l.h_mut().members[i];
    // SAFETY: `Member` is plain data; all zeroes is a free slot.
    *m = unsafe { std::mem::zeroed() };
    (m.serial, m.sem_key, m.ipc_ns, m.pid_ns) = (serial, sem_key, j.here.ipc_ns, j.here.pid_ns);
    m.start_ticks = ticks;
    m.exe = j.exe;
    // The pid last: a look that finds it finds the rest, and the semaphore raised.
    std::sync::atomic::fence(Ordering::Release);
    m.pid = j.pid;
    MY_PID.store(j.pid, Ordering::Relaxed);
    SLOT.store(i, Ordering::Relaxed);
    l.settle(); // what was pinned while the ledger could not be reached
    Seat::In(i)
}

/// Takes `bytes` from the group's budget if they fit, and if the host reserve (when this process
/// has one) lets the group have them (or whatever the limits, with `force`). `Err`: refused, and
/// nothing was taken; the caller must not release these bytes. A sum past `u64::MAX` is refused
/// even with `force`, and so is a process that cannot join because it cannot read its own start
/// time (the group's budget is not to be escaped that way). `Ok` with no ledger or no slot:
/// nothing to refuse. A ledger whose lock is held past `LOCK_WAIT_MS`: `out_of_reach`.
#[inline]
pub fn reserve(bytes: u64, force: bool) -> Result<(), Refused> {
    match header() {
        None => Ok(()),
        Some(h) => reserve_on_own_stack(h, bytes, force),
    }
}

/// `reserve_in` on this thread's own stack. Out of line, with plain arguments: the hooks' steady
/// path (no group) builds no closure for it, and the switch's frame stays out of theirs.
#[inline(never)]
fn reserve_on_own_stack(h: Shared, bytes: u64, force: bool) -> Result<(), Refused> {
    super::own_stack(|| reserve_in(h, bytes, force))
}

/// What a reservation does while the ledger cannot be reached: with a limit the group decides
/// (its budget, or the host reserve, which a member checks against the group's reading) the
/// call is refused (`GroupUnavailable`: the caller's policy answers it), for the group's budget
/// is never to be exceeded; otherwise, and for bytes taken whatever the limits (`force`), the
/// bytes are booked later (`Locked::settle`).
#[cold]
fn out_of_reach(h: Shared, bytes: u64, force: bool) -> Result<(), Refused> {
    if !force
        && (h.budget() != u64::MAX
            || host::reserve().is_some()
            || cgroup::floor().reserve().is_some())
    {
        return Err(Refused::GroupUnavailable);
    }
    match PENDING_ADD.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
        p.checked_add(bytes)
    }) {
        Ok(_) => Ok(()),
        Err(_) => Err(Refused::Group),
    }
}

/// The lets-go a reservation may make: a join's reads, a room look, a reading of the host's
/// memory, at most once each, and at most two of the cgroup's (the second when the first found
/// the member in another cgroup than its reading was started for), so a reservation takes the
/// lock at most six times, all within one `Wait`. A join reads only once the lock was had: a
/// process that cannot reach the ledger reads nothing.
#[derive(Default)]
struct Done {
    joined: bool,
    room: bool,
    read: bool,
    cgroup_reads: u8,
    /// A cgroup reading taken in this call decides (a refusal needs no other).
    cgroup_fresh: bool,
}

#[inline(never)]
fn reserve_in(h: Shared, bytes: u64, force: bool) -> Result<(), Refused> {
    let mut h = h;
    let mut reopens = 0;
    let mut w = Wait::new();
    let mut done = Done::default();
    let mut joining = None;
    let mut dead = Dead::none();
    let mut pending = Pending::default();
    let mut freed = 0;
    loop {
        let mut l = match Locked::new(h, &mut w) {
            Ok(l) => l,
            Err(NoLock::Gone) => return Ok(()),
            Err(NoLock::Busy) => return out_of_reach(h, bytes, force),
            Err(NoLock::Closed) => {
                reopens += 1;
                match (reopens <= REOPENS).then(|| reopen(h)).flatten() {
                    Some(n) => h = n,
                    None => return Ok(()),
                }
                dead = Dead::none();
                continue;
            }
        };
        freed += l.bury(&dead);
        dead = Dead::none();
        let (mut l, i) = match take_seat(l, h, &mut joining, &mut dead, &mut done) {
            Ok(seat) => seat,
            Err(Round::Again) => continue,
            Err(Round::Answer(a)) => return a,
        };
        let fits = |l: &Locked| {
            l.h()
                .used
                .checked_add(bytes)
                .is_some_and(|n| n <= l.h().budget)
        };
        if !force && !fits(&l) {
            if !done.room && l.room_scan_due() {
                drop(l);
                dead = Dead::look(h, Scan::Room);
                done.room = true;
                continue;
            }
            drop(l);
            log_freed(freed);
            return Err(Refused::Group);
        }
        let mut l = match floors(l, i, bytes, force, &mut done, &mut pending) {
            Next::Book(l) => l,
            Next::Again => continue,
            Next::Scan => {
                dead = Dead::look(h, Scan::Room);
                continue;
            }
            Next::Refused(why) => {
                log_freed(freed);
                return Err(why);
            }
        };
        if !l.book(i, bytes) {
            return Err(Refused::Group);
        }
        // In flight until the call returns (`landed`): other members' readings meanwhile count
        // these bytes as not yet in the figures they read.
        h.in_flight(i).fetch_add(bytes, Ordering::Relaxed);
        drop(l);
        log_freed(freed);
        return Ok(());
    }
}

/// What `reserve_in` does when this process has no slot to decide in.
enum Round {
    /// Joining was prepared (the lock let go): take the lock again.
    Again,
    /// The call's answer, decided without the group.
    Answer(Result<(), Refused>),
}

/// This process's slot in the ledger `l` holds, the lock kept; else what to do instead (the lock
/// let go): prepare joining once (reading this process's identity and looking for dead members
/// without the lock), or go on alone when the group is full, or refuse when this process cannot
/// prove who it is.
fn take_seat(
    l: Locked,
    h: Shared,
    joining: &mut Option<Joining>,
    dead: &mut Dead,
    done: &mut Done,
) -> Result<(Locked, usize), Round> {
    let mut l = l;
    match seat(&mut l, joining.as_ref()) {
        Seat::In(i) => Ok((l, i)),
        Seat::Join if !done.joined => {
            drop(l);
            *joining = Some(Joining::read());
            *dead = Dead::look(h, Scan::Join);
            done.joined = true;
            Err(Round::Again)
        }
        Seat::Out(now) => {
            drop(l);
            if now {
                let _nc = sys::NoCancel::new();
                tracing::warn!("group: all {MAX_MEMBERS} member slots are taken; this process uses its own budget only");
            }
            Err(Round::Answer(Ok(())))
        }
        Seat::Unverified | Seat::Join => {
            drop(l);
            warn_unverified();
            Err(Round::Answer(Err(Refused::Group)))
        }
    }
}

/// Readings taken with the lock let go, installed at the next taking of it.
#[derive(Default)]
struct Pending {
    host: Option<Reading>,
    cgroup: Option<CgReading>,
}

/// What the floors say of a reservation.
enum Next {
    /// It fits them all: book it (the lock still held).
    Book(Locked),
    /// A reading was taken (the lock let go): decide again.
    Again,
    /// Short, while other members have calls in flight: look for dead members first (the lock
    /// let go), since a member killed inside a call leaves its bytes in flight for good.
    Scan,
    Refused(Refused),
}

/// The floors' say on `bytes` more for member `i` (none with `force`): the host reserve over the
/// group's bytes, then the cgroup reserve over the bytes of the members in this member's cgroup,
/// each against its shared reading, read afresh (with the lock let go) when due and before a
/// refusal. A reading that cannot be used turns its reserve off: it refuses nothing.
fn floors(
    mut l: Locked,
    i: usize,
    bytes: u64,
    force: bool,
    done: &mut Done,
    p: &mut Pending,
) -> Next {
    if force {
        return Next::Book(l);
    }
    if let Some(reserve) = host::reserve() {
        if let Some(r) = p.host.take() {
            l.install(r, reserve);
        }
        match l.host_room(bytes, reserve, done.read) {
            Room::Fits => {}
            Room::Read => {
                let mut r = l.start_reading();
                drop(l);
                done.read = true;
                match kernel::host_memory() {
                    Ok(m) => {
                        host::noted(m.available);
                        r.available = m.available;
                        p.host = Some(r);
                    }
                    Err(why) => host::turn_off(why),
                }
                return Next::Again;
            }
            Room::Short(available) => {
                return l.refuse_or_scan(i, done, Refused::Host { available })
            }
        }
    }
    if let Some(reserve) = cgroup::floor().reserve() {
        if let Some(c) = p.cgroup.take() {
            done.cgroup_fresh = l.install_cgroup(i, c, reserve, done.cgroup_reads >= 2);
        }
        match l.cgroup_room(i, bytes, reserve, done.cgroup_fresh) {
            Room::Fits => {}
            Room::Read => {
                let mut c = l.start_cgroup_reading(i);
                drop(l);
                done.cgroup_reads += 1;
                match crate::runtime::cgroup::headroom() {
                    Ok(head) => {
                        cgroup::floor().noted(head.bytes);
                        c.head = Some(head);
                        p.cgroup = Some(c);
                    }
                    Err(why) => cgroup::floor().turn_off(why as usize),
                }
                return Next::Again;
            }
            Room::Short(headroom) => {
                return l.refuse_or_scan(i, done, Refused::Cgroup { headroom })
            }
        }
    }
    Next::Book(l)
}

fn warn_unverified() {
    static ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !ONCE.swap(true, Ordering::Relaxed) {
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::warn!("group: this process cannot read its start time in /proc, so it cannot join the group; its pinning calls are refused until it can");
    }
}

fn log_freed(freed: u64) {
    warn_no_semaphore();
    if freed > 0 {
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::info!("group: reclaimed {freed} bytes of members that are gone");
    }
}

/// Gives back `bytes` that `reserve` took. A release larger than this member's share cannot be
/// one of its reservations (one that `reserve` refused, or a share lost with the slot): it
/// changes nothing, so the group's other bytes stay booked. A ledger out of reach: the release is
/// applied at this process's next taking of the lock (until then the group counts the bytes
/// still, which errs on the side of the budget).
#[inline]
pub fn release(bytes: u64) {
    if let Some(h) = header() {
        release_on_own_stack(h, bytes)
    }
}

/// `release_in` on this thread's own stack (out of line, as `reserve_on_own_stack`).
#[inline(never)]
fn release_on_own_stack(h: Shared, bytes: u64) {
    super::own_stack(|| release_in(h, bytes))
}

/// Bytes pinned while the ledger was out of reach, and released before they were booked.
fn unpend(bytes: u64) -> bool {
    PENDING_ADD
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
            p.checked_sub(bytes)
        })
        .is_ok()
}

#[inline(never)]
fn release_in(h: Shared, bytes: u64) {
    let i = SLOT.load(Ordering::Relaxed);
    if i >= MAX_MEMBERS {
        unpend(bytes);
        return;
    }
    let mut l = match Locked::new(h, &mut Wait::new()) {
        Ok(l) => l,
        Err(NoLock::Gone) | Err(NoLock::Closed) => return,
        Err(NoLock::Busy) => {
            if !unpend(bytes) {
                PENDING_RELEASE.fetch_add(bytes, Ordering::Relaxed);
            }
            return;
        }
    };
    if !l.owns(i) {
        return;
    }
    if let Err(held) = l.unbook(i, bytes) {
        drop(l);
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::debug!(
            "group: a release of {bytes} bytes exceeds this member's share of {held}; ignored"
        );
    }
}

pub fn note_denied() {
    // SAFETY: `m` points to a member slot in the mapping (`note`).
    note(|m| unsafe { std::ptr::addr_of_mut!((*m).denied) });
}

pub fn note_downgraded() {
    // SAFETY: as above.
    note(|m| unsafe { std::ptr::addr_of_mut!((*m).downgraded) });
}

/// A call the host reserve stopped (refused, downgraded or, under `warn`, pinned anyway).
pub fn note_host_reserve() {
    // SAFETY: as above.
    note(|m| unsafe { std::ptr::addr_of_mut!((*m).host_reserve) });
}

/// Whether this process holds a slot in a group: the group's shared reading then decides the host
/// reserve, under the group's lock, and the process's own cap is not needed.
#[inline]
pub fn seated() -> bool {
    SLOT.load(Ordering::Relaxed) < MAX_MEMBERS && !MAP.load(Ordering::Relaxed).is_null()
}

/// Whether this process holds a slot with a shared cgroup reading: the group's reading for its
/// cgroup then decides the cgroup reserve, under the group's lock, and its own cap is not needed.
#[inline]
pub fn cgroup_shared() -> bool {
    let (Some(h), i) = (header(), SLOT.load(Ordering::Relaxed)) else {
        return false;
    };
    i < MAX_MEMBERS && h.u32_at(ext_at(i, std::mem::offset_of!(layout::MemberExt, cgroup))) != 0
}

/// A call whose reservation this member booked returned (pinned, or failed and given back):
/// its bytes are no longer in flight. Saturating: bytes booked while the ledger was out of reach
/// were never in flight.
#[inline]
pub fn landed(bytes: u64) {
    let Some(h) = header() else { return };
    let i = SLOT.load(Ordering::Relaxed);
    if bytes > 0 && i < MAX_MEMBERS && h.member_id(i).0 == MY_PID.load(Ordering::Relaxed) {
        let _ = h
            .in_flight(i)
            .fetch_update(Ordering::Release, Ordering::Relaxed, |f| {
                Some(f.saturating_sub(bytes))
            });
    }
}

/// A call the cgroup reserve stopped (refused, downgraded or, under `warn`, pinned anyway).
pub fn note_cgroup_reserve() {
    let (Some(h), i) = (header(), SLOT.load(Ordering::Relaxed)) else {
        return;
    };
    if i < MAX_MEMBERS && h.member_id(i).0 == MY_PID.load(Ordering::Relaxed) {
        h.atomic_u64(ext_at(
            i,
            std::mem::offset_of!(layout::MemberExt, cgroup_reserve),
        ))
        .fetch_add(1, Ordering::Relaxed);
    }
}

fn note(field: impl Fn(*mut Member) -> *mut u64) {
    let (Some(h), i) = (header(), SLOT.load(Ordering::Relaxed)) else {
        return;
    };
    if i < MAX_MEMBERS {
        // SAFETY: `i` is in bounds; the place is in the published ledger mapping, and no
        // reference to the member is made (other processes write it under the lock).
        let m = unsafe { std::ptr::addr_of_mut!((*h.0.as_ptr()).members[i]) };
        if h.member_id(i).0 == MY_PID.load(Ordering::Relaxed) {
            // SAFETY: an aligned u64 of this member's slot, which other processes only read
            // under the lock or change when the slot is vacated; every writer adds atomically.
            unsafe { AtomicU64::from_ptr(field(m)) }.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// At exit: the process's pinned memory goes with it, and so does its share. A ledger out of
/// reach past the bound: the share stays booked until a look finds this process gone.
pub fn leave() {
    let Some(h) = header() else { return };
    // A vfork child runs in its parent's memory: the slot and its share are the parent's.
    if SLOT.load(Ordering::Relaxed) < MAX_MEMBERS
        // SAFETY: no arguments; it cannot fail.
        && unsafe { libc::getpid() } as u32 != MY_PID.load(Ordering::Relaxed)
    {
        return;
    }
    let i = SLOT.swap(NO_SLOT, Ordering::Relaxed);
    // A process that never joined only tries the lock: one that pins nothing never waits.
    let mut w = if i < MAX_MEMBERS {
        Wait::new()
    } else {
        Wait::once()
    };
    let Ok(mut l) = Locked::new(h, &mut w) else {
        return;
    };
    let member = l.owns(i);
    if member {
        l.vacate(i);
        let_go_semaphore();
    }
    // The last member to leave removes the ledger: a group's budget does not outlive the group.
    // One nobody joined is left to its creator, whose budget it holds.
    let unjoined_own = CREATED.load(Ordering::Relaxed) && l.h().joins == 0;
    if (member || unjoined_own) && l.empty() {
        l.close((
            LEDGER_DEV.load(Ordering::Relaxed),
            LEDGER_INO.load(Ordering::Relaxed),
        ));
    }
}

/// The ledger `old` was removed: the group's name opened again (or made anew, with this
/// process's budget), with the lock let go. The old mapping stays mapped (other threads may be
/// reading it), and is not used again. `None`: this process now runs on its own budget only.
#[cold]
fn reopen(old: Shared) -> Option<Shared> {
    let _nc = sys::NoCancel::new(); // file work and a line: no cancellation point
    let path = PATH.get()?.to_str().ok()?;
    let budget = Some(OWN_BUDGET.load(Ordering::Relaxed)).filter(|&b| b != u64::MAX);
    let (o, _) = match open_live(path, budget) {
        Ok(o) => o,
        Err(why) => {
            MAP.store(std::ptr::null_mut(), Ordering::Release);
            tracing::warn!("group: the ledger {path} was removed and {why}; this process now uses its own budget only");
            return None;
        }
    };
    let new = std::ptr::NonNull::new(o.h).map(Shared)?;
    let slot = SLOT.load(Ordering::Relaxed);
    match MAP.compare_exchange(old.0.as_ptr(), o.h, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            LEDGER_DEV.store(o.id.0, Ordering::Relaxed);
            LEDGER_INO.store(o.id.1, Ordering::Relaxed);
            CREATED.store(o.created, Ordering::Relaxed);
            // No slot in the removed ledger: this process joins the new one (unless another
            // thread already did).
            let _ = SLOT.compare_exchange(slot, NOT_JOINED, Ordering::Relaxed, Ordering::Relaxed);
            tracing::debug!(
                "group: the ledger was removed under this process; joined {path} again"
            );
            Some(new)
        }
        Err(current) => {
            // Another thread opened it again first: its mapping is the one in use.
            // SAFETY: unmaps the mapping made above, which nothing else refers to.
            unsafe { libc::munmap(o.h as *mut _, layout::SIZE) };
            std::ptr::NonNull::new(current).map(Shared)
        }
    }
}

/// In a fork child: a new process, which joins as a member of its own when it first pins.
pub fn after_fork_child() {
    CREATED.store(false, Ordering::Relaxed); // the parent's ledger: it removes it
    if SLOT.load(Ordering::Relaxed) != NO_SLOT || !MAP.load(Ordering::Relaxed).is_null() {
        SLOT.store(NOT_JOINED, Ordering::Relaxed);
    }
    PENDING_ADD.store(0, Ordering::Relaxed);
    PENDING_RELEASE.store(0, Ordering::Relaxed);
    FORGET.store(false, Ordering::Relaxed);
    // A fork child holds none of its parent's semaphores (its undo list is its own).
    HELD_ID.store(-1, Ordering::Relaxed);
    NO_SEM.store(0, Ordering::Relaxed);
    IPC_NS.store(0, Ordering::Relaxed);
}

pub fn limited() -> bool {
    header().is_some_and(|h| h.budget() != u64::MAX)
}

pub struct Snapshot {
    pub name: String,
    pub budget: Option<u64>,
    pub used: u64,
    pub peak: u64,
    pub members: usize,
    /// The largest host reserve a member applies.
    pub host_reserve: Option<u64>,
    /// The lowest `MemAvailable` a member read for it.
    pub host_lowest_available: Option<u64>,
    /// Calls the host reserve stopped, summed over the members in the group now.
    pub host_reserve_count: u64,
    /// The largest cgroup reserve a member in this process's cgroup applies, and the lowest
    /// headroom any of them read (`None`: no shared cgroup reading for this process).
    pub cgroup_reserve: Option<u64>,
    pub cgroup_lowest_headroom: Option<u64>,
    /// Calls the cgroup reserve stopped, summed over the members in the group now.
    pub cgroup_reserve_count: u64,
    /// The ledger's lock was held: the figures were read without it.
    pub unreachable: bool,
    /// This process's waits for the lock that ran out.
    pub lock_timeouts: u64,
    /// How the other members tell this one alive: `semaphore`, or `pid (WHY)` (only from its own
    /// PID namespace); `None` before it joined.
    pub liveness: Option<String>,
}

/// The group's figures: under the lock when it is free, else read without it (figures of one
/// moment, as `pinguard top` reads them).
pub fn snapshot() -> Option<Snapshot> {
    let h = header()?;
    // Figures for a report only try the lock: they never wait (a process that pinned nothing
    // never waits at all, and a member's exit waits once, to leave).
    let locked = match Locked::new(h, &mut Wait::once()) {
        Ok(l) => Some(l),
        Err(NoLock::Gone) | Err(NoLock::Closed) => return None,
        Err(NoLock::Busy) => None,
    };
    use std::mem::offset_of;
    let live = || (0..MAX_MEMBERS).filter(|&i| h.member_id(i).0 != 0);
    let members = live().count();
    let stopped = live()
        .map(|i| h.u64_at(member_at(i, offset_of!(Member, host_reserve))))
        .fold(0u64, u64::saturating_add);
    let (budget, used, peak) = (
        h.budget(),
        h.u64_at(offset_of!(Header, used)),
        h.u64_at(offset_of!(Header, peak)),
    );
    let (reserve, lowest) = (
        h.u64_at(offset_of!(Header, host_reserve)),
        h.u64_at(offset_of!(Header, host_lowest_available)),
    );
    let cg_stopped = live()
        .map(|i| h.u64_at(ext_at(i, offset_of!(layout::MemberExt, cgroup_reserve))))
        .fold(0u64, u64::saturating_add);
    let (cg_reserve, cg_lowest) = cgroup_figures(h);
    let unreachable = locked.is_none();
    drop(locked);
    Some(Snapshot {
        name: NAME.get().cloned().unwrap_or_default(),
        budget: (budget != u64::MAX).then_some(budget),
        used,
        peak,
        members,
        host_reserve: (reserve != 0).then_some(reserve),
        host_lowest_available: (lowest != u64::MAX).then_some(lowest),
        host_reserve_count: stopped,
        cgroup_reserve: cg_reserve,
        cgroup_lowest_headroom: cg_lowest,
        cgroup_reserve_count: cg_stopped,
        unreachable,
        lock_timeouts: TIMEOUTS.load(Ordering::Relaxed),
        liveness: liveness(),
    })
}

/// This process's cgroup's shared reserve and lowest headroom, read without the lock.
fn cgroup_figures(h: Shared) -> (Option<u64>, Option<u64>) {
    use std::mem::offset_of;
    let i = SLOT.load(Ordering::Relaxed);
    let k = if i < MAX_MEMBERS {
        h.u32_at(ext_at(i, offset_of!(layout::MemberExt, cgroup))) as usize
    } else {
        0
    };
    let Some(k) = k.checked_sub(1).filter(|&k| k < layout::MAX_CGROUPS) else {
        return (None, None);
    };
    let at = |f: usize| {
        h.u64_at(offset_of!(Header, cgroups) + k * std::mem::size_of::<layout::Cgroup>() + f)
    };
    let (reserve, lowest) = (
        at(offset_of!(layout::Cgroup, reserve)),
        at(offset_of!(layout::Cgroup, lowest)),
    );
    (
        (reserve != 0).then_some(reserve),
        (reserve != 0 && lowest != u64::MAX).then_some(lowest),
    )
}

/// How this member is told alive (`Snapshot::liveness`).
fn liveness() -> Option<String> {
    if SLOT.load(Ordering::Relaxed) >= MAX_MEMBERS {
        return None;
    }
    if HELD_ID.load(Ordering::Relaxed) >= 0 {
        return Some("semaphore".into());
    }
    Some(format!(
        "pid ({})",
        no_semaphore_reason(NO_SEM.load(Ordering::Relaxed))
    ))
}

fn no_semaphore_reason(why: i32) -> String {
    match why {
        NO_SEM_OTHER_NS => "the group's semaphore set is in another IPC namespace".into(),
        NO_SEM_NS_UNKNOWN => "this process's IPC namespace cannot be read".into(),
        0 => "no semaphore held".into(),
        e => format!(
            "System V semaphores unavailable: {}",
            std::io::Error::from_raw_os_error(e)
        ),
    }
}

/// Once, when the kernel or a sandbox refused this member a semaphore (not merely another IPC
/// namespace): called with the lock let go.
fn warn_no_semaphore() {
    static ONCE: AtomicBool = AtomicBool::new(false);
    let why = NO_SEM.load(Ordering::Relaxed);
    if why > 0 && !ONCE.swap(true, Ordering::Relaxed) {
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::warn!("group: {}; other members tell this one alive by its pid, only from its own PID namespace", no_semaphore_reason(why));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A robust, process-shared mutex as the ledger's, on the heap (never moved while in use).
    struct Mutex(*mut libc::pthread_mutex_t);
    // SAFETY: a pthread mutex is made to be used from several threads through a pointer.
    unsafe impl Send for Mutex {}

    fn robust() -> Mutex {
        let m = Box::into_raw(Box::new(libc::PTHREAD_MUTEX_INITIALIZER));
        // SAFETY: `attr` and `m` are valid for the calls; the attributes are those `build` sets.
        unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            libc::pthread_mutexattr_init(&mut attr);
            libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
            libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
            libc::pthread_mutex_init(m, &attr);
        }
        Mutex(m)
    }

    #[test]
    fn a_lock_held_by_a_thread_that_does_not_run_is_waited_for_within_the_bound_then_only_tried() {
        let m = robust();
        let (held_tx, held) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        let p = Mutex(m.0);
        let holder = std::thread::spawn(move || {
            let p = p;
            // SAFETY: the mutex lives until the test ends, after this thread is joined.
            unsafe { libc::pthread_mutex_lock(p.0) };
            // SAFETY: no arguments.
            held_tx.send(unsafe { libc::gettid() } as u32).unwrap();
            go.recv().unwrap();
            // SAFETY: this thread holds the mutex.
            unsafe { libc::pthread_mutex_unlock(p.0) };
        });
        let tid = held.recv().unwrap();
        assert_eq!(owner(m.0), tid, "the futex word names the holder");
        let t = std::time::Instant::now();
        assert_eq!(take(m.0, &mut Wait::new()), libc::ETIMEDOUT);
        let waited = t.elapsed();
        assert!(
            waited >= std::time::Duration::from_millis(LOCK_WAIT_MS)
                && waited < std::time::Duration::from_millis(LOCK_WAIT_MS * 10),
            "{waited:?}"
        );
        // The same holder still: the next calls only try.
        let t = std::time::Instant::now();
        for _ in 0..10 {
            assert_eq!(take(m.0, &mut Wait::new()), libc::ETIMEDOUT);
        }
        assert!(
            t.elapsed() < std::time::Duration::from_millis(LOCK_WAIT_MS),
            "{:?} for 10 tries",
            t.elapsed()
        );
        assert_eq!(take(m.0, &mut Wait::once()), libc::ETIMEDOUT);
        // Let go: taken at the first try, and waited for again from then on.
        go_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(take(m.0, &mut Wait::new()), 0);
        assert_eq!(UNREACHABLE_UNTIL.load(Ordering::Relaxed), 0);
        // SAFETY: no arguments.
        let me = unsafe { libc::gettid() } as u32;
        assert_eq!(owner(m.0), me);
        // SAFETY: this thread holds the mutex; nothing uses it after.
        unsafe {
            libc::pthread_mutex_unlock(m.0);
            drop(Box::from_raw(m.0));
        }
    }
}
