//! A budget shared by every process of a group on the host (`PINGUARD_GROUP`), through a ledger
//! in shared memory (layout: `pinguard_report::group`).
//!
//! A process-shared robust mutex guards the group's total and each member's share: a member
//! killed while holding it is detected by the next locker (`EOWNERDEAD`), and a member killed at
//! any other time is found by a later look for dead members (its pid is gone, or belongs to a
//! process that started at another time) and its bytes go back to the group. A look reads every
//! member's `/proc` entry, so it is rationed: once when a process joins, and, while the group is
//! full, once per `RESCAN_MS` for the whole group.
//!
//! The counters are exact: `used` is the sum of the members' shares, a reservation that would
//! pass `u64::MAX` is refused (never saturated), and a release takes back exactly what it names,
//! never more than the member holds.
//!
//! Everything here runs inside hooked calls: no cancellation point (raw system calls for `/proc`,
//! cancellation disabled while the lock is held) and no allocation under the lock.

use super::{host, Refused};
use crate::runtime::{kernel, sys};
use pinguard_report::group::{self as layout, Header, Member, MAX_MEMBERS};
use std::ffi::{CStr, CString};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

static MAP: AtomicPtr<Header> = AtomicPtr::new(std::ptr::null_mut());
static SLOT: AtomicUsize = AtomicUsize::new(NOT_JOINED);
const NOT_JOINED: usize = usize::MAX;
const NO_SLOT: usize = usize::MAX - 1;
/// The pid this process joined with: a slot whose pid is another is no longer this process's.
static MY_PID: AtomicU32 = AtomicU32::new(0);
static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

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
    match open_or_create(&path, budget) {
        Ok(h) => {
            let Some(h) = std::ptr::NonNull::new(h).map(Shared) else { return };
            let stored = h.budget();
            if let Some(b) = budget {
                if b != stored {
                    errors.push(format!(
                        "PINGUARD_GROUP_BUDGET={b}: group {name} already has a budget of {stored} bytes, set by its first member; using that"
                    ));
                }
            }
            let _ = NAME.set(name.to_string());
            // Before the ledger is this image's to use: no thread can have joined yet, so every
            // slot with this process's pid and start time is the previous image's.
            forget_previous_image(h);
            MAP.store(h.0.as_ptr(), Ordering::Release);
        }
        Err(why) => errors.push(format!("PINGUARD_GROUP={name:?}: the ledger {path} {why}; running with the process budget only")),
    }
}

fn open_or_create(path: &str, budget: Option<u64>) -> Result<*mut Header, String> {
    let cpath = CString::new(path).map_err(|_| "has a NUL in its name".to_string())?;
    for _ in 0..3 {
        // SAFETY: `cpath` is NUL-terminated; the descriptor is closed below, in this function.
        let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
        if fd >= 0 {
            let r = map_existing(fd);
            sys::close(fd);
            return r;
        }
        if errno() != libc::ENOENT {
            return Err(format!("cannot be opened ({})", std::io::Error::last_os_error()));
        }
        match create(path, budget) {
            Ok(Some(h)) => return Ok(h),
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
    let p = unsafe { libc::mmap(std::ptr::null_mut(), layout::SIZE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(format!("cannot be mapped ({})", std::io::Error::last_os_error()));
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
        return Err(format!("belongs to user {}, not to this process's user", st.st_uid));
    }
    // pinguard creates the ledger 0600: write access for others means someone else made it (or
    // opened it up), and anyone with that access can change the budget or the members' shares.
    if st.st_mode & 0o022 != 0 {
        return Err(format!("is writable by other users (mode {:04o}; pinguard creates it 0600)", st.st_mode & 0o7777));
    }
    if st.st_size as usize != layout::SIZE {
        return Err(format!("is {} bytes, expected {} (another version of pinguard, or not a ledger)", st.st_size, layout::SIZE));
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
fn create(path: &str, budget: Option<u64>) -> Result<Option<*mut Header>, String> {
    remove_stale_temporaries(path);
    match create_unnamed(path, budget) {
        Unnamed::Done(r) => r,
        Unnamed::Unsupported => create_named(path, budget),
    }
}

enum Unnamed {
    Done(Result<Option<*mut Header>, String>),
    Unsupported,
}

fn create_unnamed(path: &str, budget: Option<u64>) -> Unnamed {
    let dir = match path.rsplit_once('/') {
        Some((d, _)) if !d.is_empty() => d,
        _ => return Unnamed::Unsupported,
    };
    let (Ok(cdir), Ok(cpath)) = (CString::new(dir), CString::new(path)) else { return Unnamed::Unsupported };
    // SAFETY: `cdir` is NUL-terminated; the descriptor is pinguard's until it is closed below.
    let fd = unsafe { libc::open(cdir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o600 as libc::c_uint) };
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
    let Ok(proc_fd) = CString::new(format!("/proc/self/fd/{fd}")) else { return Unnamed::Unsupported };
    // SAFETY: both paths are NUL-terminated.
    let linked = unsafe { libc::linkat(libc::AT_FDCWD, proc_fd.as_ptr(), libc::AT_FDCWD, cpath.as_ptr(), libc::AT_SYMLINK_FOLLOW) } == 0;
    let err = errno();
    sys::close(fd);
    if linked {
        return Unnamed::Done(Ok(Some(h)));
    }
    // SAFETY: unmaps the mapping `build` made, which nothing else refers to.
    unsafe { libc::munmap(h as *mut _, layout::SIZE) };
    match err {
        libc::EEXIST => Unnamed::Done(Ok(None)),
        _ => Unnamed::Unsupported, // no /proc, for one
    }
}

fn create_named(path: &str, budget: Option<u64>) -> Result<Option<*mut Header>, String> {
    // SAFETY: no arguments; it cannot fail.
    let pid = unsafe { libc::getpid() };
    let tmp = CString::new(format!("{path}.{pid}.tmp")).map_err(|_| "has a NUL in its name".to_string())?;
    // SAFETY: `tmp` is NUL-terminated; the descriptor is pinguard's until `cleanup` closes it.
    let fd = unsafe { libc::open(tmp.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(format!("cannot be created ({})", std::io::Error::last_os_error()));
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
    cleanup(fd);
    if linked {
        Ok(Some(h))
    } else {
        // SAFETY: unmaps the mapping `build` made, which nothing else refers to.
        unsafe { libc::munmap(h as *mut _, layout::SIZE) };
        if err == libc::EEXIST {
            Ok(None)
        } else {
            Err(format!("cannot be published ({})", std::io::Error::from_raw_os_error(err)))
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
    let Some((dir, base)) = path.rsplit_once('/') else { return };
    let Ok(entries) = std::fs::read_dir(if dir.is_empty() { "/" } else { dir }) else { return };
    let now = std::time::SystemTime::now();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(base)?.strip_prefix('.')?.strip_suffix(".tmp")) else { continue };
        let Ok(pid) = pid.parse::<libc::pid_t>() else { continue };
        if pid <= 0 {
            continue;
        }
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0 && errno() == libc::ESRCH;
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age.as_secs() >= STALE_TMP_SECS));
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
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// What `/proc` says of a member's pid.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Proc {
    /// A process with this start time has the pid.
    Started(u64),
    /// No process has the pid.
    Gone,
    /// The entry could not be read (this process is out of descriptors, say): no verdict, and a
    /// member is never taken for dead without one.
    Unknown,
}

/// The start time of process `pid` (see `layout::start_ticks`), read with raw system calls into
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
    let Ok(path) = CStr::from_bytes_until_nul(&path) else { return Proc::Unknown };
    let gone = |e: c_int| if e == libc::ENOENT || e == libc::ESRCH { Proc::Gone } else { Proc::Unknown };
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

/// The ledger, locked; recovered when its last holder died holding it. Cancellation stays off
/// while it is held: a thread cancelled with the lock held would leave it to `EOWNERDEAD` repair,
/// and an unwinding through pinguard's frames would abort the process.
struct Locked {
    ledger: Shared,
    _nc: sys::NoCancel,
}

impl Locked {
    /// `None` when the lock cannot be taken (a ledger whose mutex is unrecoverable or corrupt):
    /// the process then leaves the group and runs on its own budget.
    fn new(ledger: Shared) -> Option<Locked> {
        let nc = sys::NoCancel::new();
        // SAFETY: the mutex was initialised process-shared and robust before the ledger was
        // published; a pthread mutex is made to be shared this way, through a raw pointer.
        let rc = unsafe { libc::pthread_mutex_lock(std::ptr::addr_of_mut!((*ledger.0.as_ptr()).mutex)) };
        match rc {
            0 => Some(Locked { ledger, _nc: nc }),
            libc::EOWNERDEAD => {
                let mut l = Locked { ledger, _nc: nc };
                // Whatever the dead holder was doing, the members' shares are the truth.
                l.reclaim_dead(Scan::Join);
                l.h_mut().used = l.sum_of_shares();
                // SAFETY: this thread holds the mutex (EOWNERDEAD hands it over).
                unsafe { libc::pthread_mutex_consistent(&mut l.h_mut().mutex) };
                Some(l)
            }
            _ => {
                MAP.store(std::ptr::null_mut(), Ordering::Release);
                tracing::warn!("group: the ledger's lock cannot be taken (error {rc}); this process now uses its own budget only");
                drop(nc);
                None
            }
        }
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
        self.h().members.iter().filter(|m| m.pid != 0).fold(0u64, |a, m| a.saturating_add(m.bytes))
    }

    /// Empties slot `i`, giving its share back to the group.
    fn vacate(&mut self, i: usize) {
        let bytes = self.h().members[i].bytes;
        // SAFETY: `Member` is plain data; all zeroes is a free slot.
        self.h_mut().members[i] = unsafe { std::mem::zeroed() };
        self.h_mut().used = match self.h().used.checked_sub(bytes) {
            Some(u) => u,
            None => self.sum_of_shares(), // a ledger someone edited: back to the truth
        };
    }

    /// Whether slot `i` is still this process's (a member wrongly taken for dead, or a second
    /// copy of pinguard in the process, may have lost it).
    fn owns(&self, i: usize) -> bool {
        i < MAX_MEMBERS && self.h().members[i].pid == MY_PID.load(Ordering::Relaxed)
    }

    /// Gives the share of every member that is gone back to the group; returns the bytes freed.
    fn reclaim_dead(&mut self, why: Scan) -> u64 {
        match why {
            Scan::Join => self.h_mut().join_scans = self.h().join_scans.wrapping_add(1),
            Scan::Room => self.h_mut().room_scans = self.h().room_scans.wrapping_add(1),
        }
        let me = SLOT.load(Ordering::Relaxed);
        let mut freed = 0u64;
        for i in 0..MAX_MEMBERS {
            let m = &self.h().members[i];
            if m.pid == 0 || (i == me && self.owns(i)) {
                continue;
            }
            let dead = match start_ticks(m.pid) {
                Proc::Gone => true,
                Proc::Started(t) => t != m.start_ticks,
                Proc::Unknown => false,
            };
            if dead {
                freed = freed.saturating_add(m.bytes);
                self.vacate(i);
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

impl Locked {
    /// Whether the host reserve `reserve` (this member's) lets the group have `bytes` more: the
    /// group's bytes stay at or below what the shared reading settled plus the headroom it left.
    /// The reading is taken again, here under the lock, when it is due, and before a refusal;
    /// `Err` carries the host's available memory as counted for the refusal. A reading that
    /// cannot be used turns the reserve off (`host::turn_off`) and refuses nothing.
    fn host_room(&mut self, i: usize, bytes: u64, reserve: u64) -> Result<(), u64> {
        let Some(next) = self.h().used.checked_add(bytes) else { return Err(self.host_available_now()) };
        let cap = |l: &Locked| host::cap_of(l.h().host_settled, l.h().host_available, reserve).saturating_sub(l.h().host_released);
        let fresh = self.host_due(reserve);
        if fresh && !self.host_read(i, reserve) {
            return Ok(());
        }
        if next <= cap(self) {
            return Ok(());
        }
        if !fresh && !self.host_read(i, reserve) {
            return Ok(());
        }
        if next <= cap(self) {
            return Ok(());
        }
        Err(self.host_available_now())
    }

    /// The group's reading is older than `host::READING_MS` (or from a clock that is not ours),
    /// or the group's bytes moved by more than a `host::MOVE_SHARE`th of the headroom it left.
    fn host_due(&self, reserve: u64) -> bool {
        let h = self.h();
        let now = monotonic_ms();
        let age = now.saturating_sub(h.host_read_ms);
        let slack = h.host_available.saturating_sub(reserve) / host::MOVE_SHARE;
        let moved = h.used.abs_diff(h.host_settled) > slack || h.host_released > slack;
        h.host_read_ms == 0 || age >= host::READING_MS || h.host_read_ms > now || moved
    }

    /// Takes the group's reading: `/proc/meminfo`'s `MemAvailable`, and the group's bytes it
    /// reflects (the group's total less this member's calls in flight: other members' calls in
    /// flight cannot be told apart, and count as landed). `false`: the reading could not be used.
    fn host_read(&mut self, i: usize, reserve: u64) -> bool {
        let share = self.h().members[i].bytes;
        let others = self.h().used.saturating_sub(share);
        let settled = others.saturating_add(host::settled(share));
        match kernel::host_memory() {
            Ok(m) => {
                let h = self.h_mut();
                h.host_available = m.available;
                h.host_settled = settled;
                h.host_released = 0; // under the lock: no release since the file was read
                h.host_read_ms = monotonic_ms().max(1);
                h.host_lowest_available = h.host_lowest_available.min(m.available);
                h.host_reserve = h.host_reserve.max(reserve);
                host::noted(m.available);
                true
            }
            Err(why) => {
                host::turn_off(why);
                false
            }
        }
    }

    /// The host's available memory as the group's reading and the group's calls since count it.
    fn host_available_now(&self) -> u64 {
        let h = self.h();
        h.host_settled.saturating_add(h.host_available).saturating_sub(h.used).saturating_sub(h.host_released)
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
/// share goes back to the group, and the new image starts with none.
fn forget_previous_image(h: Shared) {
    // SAFETY: no arguments; it cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let Proc::Started(ticks) = start_ticks(pid) else { return };
    let Some(mut l) = Locked::new(h) else { return };
    let mut freed = 0u64;
    for i in 0..MAX_MEMBERS {
        let m = &l.h().members[i];
        if m.pid == pid && m.start_ticks == ticks {
            freed = freed.saturating_add(m.bytes);
            l.vacate(i);
        }
    }
    drop(l);
    if freed > 0 {
        tracing::info!("group: released {freed} bytes of this process's image before exec");
    }
}

/// The last component of this process's executable, read without allocating.
fn exe_name(out: &mut [u8; layout::EXE_BYTES]) {
    let mut buf = [0u8; 4096];
    // SAFETY: the path is NUL-terminated and `buf` is valid for its length.
    let n = unsafe { libc::readlink(c"/proc/self/exe".as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
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
}

/// This process's slot, joining the group on first use (and again in a fork child, or when the
/// slot was lost).
fn seat(l: &mut Locked) -> Seat {
    match SLOT.load(Ordering::Relaxed) {
        NO_SLOT => return Seat::Out(false),
        NOT_JOINED => {}
        s if l.owns(s) => return Seat::In(s),
        _ => {} // taken from us: join again, with a share of 0 (what we held is no longer booked)
    }
    // SAFETY: no arguments; it cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let Proc::Started(ticks) = start_ticks(pid) else { return Seat::Unverified };
    l.reclaim_dead(Scan::Join);
    let Some(i) = l.h().members.iter().position(|m| m.pid == 0) else {
        SLOT.store(NO_SLOT, Ordering::Relaxed);
        return Seat::Out(true);
    };
    let m: &mut Member = &mut l.h_mut().members[i];
    // SAFETY: `Member` is plain data; all zeroes is a free slot.
    *m = unsafe { std::mem::zeroed() };
    m.pid = pid;
    m.start_ticks = ticks;
    exe_name(&mut m.exe);
    MY_PID.store(pid, Ordering::Relaxed);
    SLOT.store(i, Ordering::Relaxed);
    Seat::In(i)
}

/// Takes `bytes` from the group's budget if they fit, and if the host reserve (when this process
/// has one) lets the group have them (or whatever the limits, with `force`). `Err`: refused, and
/// nothing was taken; the caller must not release these bytes. A sum past `u64::MAX` is refused
/// even with `force`, and so is a process that cannot join because it cannot read its own start
/// time (the group's budget is not to be escaped that way). `Ok` with no ledger or no slot:
/// nothing to refuse.
#[inline]
pub fn reserve(bytes: u64, force: bool) -> Result<(), Refused> {
    match header() {
        None => Ok(()),
        Some(h) => reserve_in(h, bytes, force),
    }
}

#[inline(never)]
fn reserve_in(h: Shared, bytes: u64, force: bool) -> Result<(), Refused> {
    let Some(mut l) = Locked::new(h) else { return Ok(()) };
    let i = match seat(&mut l) {
        Seat::In(i) => i,
        Seat::Out(now) => {
            drop(l);
            if now {
                let _nc = sys::NoCancel::new();
                tracing::warn!("group: all {MAX_MEMBERS} member slots are taken; this process uses its own budget only");
            }
            return Ok(());
        }
        Seat::Unverified => {
            drop(l);
            warn_unverified();
            return Err(Refused::Group);
        }
    };
    let fits = |l: &Locked| l.h().used.checked_add(bytes).is_some_and(|n| n <= l.h().budget);
    let mut freed = 0;
    if !force && !fits(&l) {
        if !l.room_scan_due() {
            return Err(Refused::Group);
        }
        freed = l.reclaim_dead(Scan::Room);
        if freed == 0 || !fits(&l) {
            drop(l);
            log_freed(freed);
            return Err(Refused::Group);
        }
    }
    if let (false, Some(reserve)) = (force, host::reserve()) {
        if let Err(available) = l.host_room(i, bytes, reserve) {
            drop(l);
            log_freed(freed);
            return Err(Refused::Host { available });
        }
    }
    let (Some(used), Some(share)) = (l.h().used.checked_add(bytes), l.h().members[i].bytes.checked_add(bytes)) else {
        return Err(Refused::Group);
    };
    l.h_mut().used = used;
    l.h_mut().peak = l.h().peak.max(used);
    let m = &mut l.h_mut().members[i];
    m.bytes = share;
    m.peak = m.peak.max(share);
    drop(l);
    log_freed(freed);
    Ok(())
}

fn warn_unverified() {
    static ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !ONCE.swap(true, Ordering::Relaxed) {
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::warn!("group: this process cannot read its start time in /proc, so it cannot join the group; its pinning calls are refused until it can");
    }
}

fn log_freed(freed: u64) {
    if freed > 0 {
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::info!("group: reclaimed {freed} bytes of members that are gone");
    }
}

/// Gives back `bytes` that `reserve` took. A release larger than this member's share cannot be
/// one of its reservations (one that `reserve` refused, or a share lost with the slot): it
/// changes nothing, so the group's other bytes stay booked.
#[inline]
pub fn release(bytes: u64) {
    if let Some(h) = header() {
        release_in(h, bytes)
    }
}

#[inline(never)]
fn release_in(h: Shared, bytes: u64) {
    let i = SLOT.load(Ordering::Relaxed);
    if i >= MAX_MEMBERS {
        return;
    }
    let Some(mut l) = Locked::new(h) else { return };
    if !l.owns(i) {
        return;
    }
    let m = &mut l.h_mut().members[i];
    let Some(share) = m.bytes.checked_sub(bytes) else {
        let held = m.bytes;
        drop(l);
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::debug!("group: a release of {bytes} bytes exceeds this member's share of {held}; ignored");
        return;
    };
    m.bytes = share;
    l.h_mut().used = match l.h().used.checked_sub(bytes) {
        Some(u) => u,
        None => l.sum_of_shares(),
    };
    if l.h().host_reserve > 0 {
        let h = l.h_mut();
        h.host_released = h.host_released.saturating_add(bytes);
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

fn note(field: impl Fn(*mut Member) -> *mut u64) {
    let (Some(h), i) = (header(), SLOT.load(Ordering::Relaxed)) else { return };
    if i < MAX_MEMBERS {
        // SAFETY: `i` is in bounds; the place is in the published ledger mapping, and no
        // reference to the member is made (other processes write it under the lock).
        let m = unsafe { std::ptr::addr_of_mut!((*h.0.as_ptr()).members[i]) };
        // SAFETY: an aligned u32 of the shared mapping, written under the lock by others; an
        // atomic read of it races with nothing.
        let pid = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*m).pid)) }.load(Ordering::Relaxed);
        if pid == MY_PID.load(Ordering::Relaxed) {
            // SAFETY: an aligned u64 of this member's slot, which other processes only read
            // under the lock or change when the slot is vacated; every writer adds atomically.
            unsafe { AtomicU64::from_ptr(field(m)) }.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// At exit: the process's pinned memory goes with it, and so does its share.
pub fn leave() {
    let Some(h) = header() else { return };
    // A vfork child runs in its parent's memory: the slot and its share are the parent's.
    // SAFETY: no arguments; it cannot fail.
    if SLOT.load(Ordering::Relaxed) < MAX_MEMBERS && unsafe { libc::getpid() } as u32 != MY_PID.load(Ordering::Relaxed) {
        return;
    }
    let i = SLOT.swap(NO_SLOT, Ordering::Relaxed);
    if i >= MAX_MEMBERS {
        return;
    }
    let Some(mut l) = Locked::new(h) else { return };
    if l.owns(i) {
        l.vacate(i);
    }
}

/// In a fork child: a new process, which joins as a member of its own when it first pins.
pub fn after_fork_child() {
    if SLOT.load(Ordering::Relaxed) != NO_SLOT || !MAP.load(Ordering::Relaxed).is_null() {
        SLOT.store(NOT_JOINED, Ordering::Relaxed);
    }
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
}

pub fn snapshot() -> Option<Snapshot> {
    let h = header()?;
    let (budget, used, peak, members, reserve, lowest, stopped) = {
        let l = Locked::new(h)?;
        let h = l.h();
        let live = || h.members.iter().filter(|m| m.pid != 0);
        (h.budget, h.used, h.peak, live().count(), h.host_reserve, h.host_lowest_available, live().fold(0u64, |a, m| a.saturating_add(m.host_reserve)))
    };
    Some(Snapshot {
        name: NAME.get().cloned().unwrap_or_default(),
        budget: (budget != u64::MAX).then_some(budget),
        used,
        peak,
        members,
        host_reserve: (reserve != 0).then_some(reserve),
        host_lowest_available: (lowest != u64::MAX).then_some(lowest),
        host_reserve_count: stopped,
    })
}
