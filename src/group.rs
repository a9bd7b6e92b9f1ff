//! A budget shared by every process of a group on the host (`PINGUARD_GROUP`), through a ledger
//! in shared memory (layout: `pinguard_report::group`).
//!
//! A process-shared robust mutex guards the group's total and each member's share: a member
//! killed while holding it is detected by the next locker (`EOWNERDEAD`), and a member killed at
//! any other time is found by the next member that needs room (its pid is gone, or belongs to a
//! process that started at another time) and its bytes go back to the group.

use crate::guard;
use pinguard_report::group::{self as layout, Header, Member, MAX_MEMBERS};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

static MAP: AtomicPtr<Header> = AtomicPtr::new(std::ptr::null_mut());
static SLOT: AtomicUsize = AtomicUsize::new(NOT_JOINED);
const NOT_JOINED: usize = usize::MAX;
const NO_SLOT: usize = usize::MAX - 1;
static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Opens or creates the group's ledger. Problems become lines in `errors`; the process then runs
/// with its own budget only.
pub fn init(name: &str, budget: Option<u64>, errors: &mut Vec<String>) {
    let path = layout::path(name);
    match open_or_create(&path, budget) {
        Ok(h) => {
            let stored = unsafe { (*h).budget };
            if let Some(b) = budget {
                if b != stored {
                    errors.push(format!(
                        "PINGUARD_GROUP_BUDGET={b}: group {name} already has a budget of {stored} bytes, set by its first member; using that"
                    ));
                }
            }
            let _ = NAME.set(name.to_string());
            MAP.store(h, Ordering::Release);
        }
        Err(why) => errors.push(format!("PINGUARD_GROUP={name:?}: the ledger {path} {why}; running with the process budget only")),
    }
}

fn open_or_create(path: &str, budget: Option<u64>) -> Result<*mut Header, String> {
    let cpath = std::ffi::CString::new(path).map_err(|_| "has a NUL in its name".to_string())?;
    for _ in 0..3 {
        let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
        if fd >= 0 {
            let r = map_existing(fd);
            unsafe { libc::close(fd) };
            return r;
        }
        if guard::errno() != libc::ENOENT {
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

fn map(fd: c_int) -> Result<*mut Header, String> {
    let p = unsafe { libc::mmap(std::ptr::null_mut(), layout::SIZE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(format!("cannot be mapped ({})", std::io::Error::last_os_error()));
    }
    Ok(p as *mut Header)
}

fn map_existing(fd: c_int) -> Result<*mut Header, String> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err("cannot be examined".into());
    }
    if st.st_uid != unsafe { libc::geteuid() } {
        return Err(format!("belongs to user {}, not to this process's user", st.st_uid));
    }
    if st.st_size as usize != layout::SIZE {
        return Err(format!("is {} bytes, expected {} (another version of pinguard, or not a ledger)", st.st_size, layout::SIZE));
    }
    let h = map(fd)?;
    let bytes = unsafe { std::slice::from_raw_parts(h as *const u8, layout::SIZE) };
    if let Err(e) = layout::check(bytes) {
        unsafe { libc::munmap(h as *mut _, layout::SIZE) };
        return Err(e);
    }
    Ok(h)
}

/// Builds the ledger in a private file and publishes it with `link`, which fails if another
/// member published one first: nobody ever maps a half-initialised ledger.
fn create(path: &str, budget: Option<u64>) -> Result<Option<*mut Header>, String> {
    let tmp = std::ffi::CString::new(format!("{path}.{}.tmp", std::process::id())).unwrap();
    let fd = unsafe { libc::open(tmp.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(format!("cannot be created ({})", std::io::Error::last_os_error()));
    }
    let cleanup = |fd| unsafe {
        libc::close(fd);
        libc::unlink(tmp.as_ptr());
    };
    if unsafe { libc::ftruncate(fd, layout::SIZE as libc::off_t) } != 0 {
        cleanup(fd);
        return Err("cannot be sized".into());
    }
    let h = match map(fd) {
        Ok(h) => h,
        Err(e) => {
            cleanup(fd);
            return Err(e);
        }
    };
    unsafe {
        let hd = &mut *h;
        hd.version = layout::VERSION;
        hd.header_size = layout::SIZE as u32;
        hd.total_size = layout::SIZE as u64;
        hd.budget = budget.unwrap_or(u64::MAX);
        hd.created_unix_ms = guard::unix_ms();
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
    let cpath = std::ffi::CString::new(path).unwrap();
    let linked = unsafe { libc::link(tmp.as_ptr(), cpath.as_ptr()) } == 0;
    let err = guard::errno();
    cleanup(fd);
    if linked {
        Ok(Some(h))
    } else {
        unsafe { libc::munmap(h as *mut _, layout::SIZE) };
        if err == libc::EEXIST {
            Ok(None)
        } else {
            Err(format!("cannot be published ({})", std::io::Error::from_raw_os_error(err)))
        }
    }
}

#[inline(always)]
fn header() -> Option<&'static mut Header> {
    let h = MAP.load(Ordering::Acquire);
    (!h.is_null()).then(|| unsafe { &mut *h })
}

fn atomic(v: &mut u64) -> &AtomicU64 {
    unsafe { AtomicU64::from_ptr(v) }
}

/// Holds the group lock; recovers the ledger when its last holder died holding it.
struct Locked(&'static mut Header);

impl Locked {
    fn new(h: &'static mut Header) -> Locked {
        let rc = unsafe { libc::pthread_mutex_lock(&mut h.mutex) };
        let mut l = Locked(h);
        if rc == libc::EOWNERDEAD {
            // Whatever the dead holder was doing, the members' shares are the truth.
            l.reclaim_dead();
            l.0.used = l.0.members.iter().filter(|m| m.pid != 0).map(|m| m.bytes).sum();
            unsafe { libc::pthread_mutex_consistent(&mut l.0.mutex) };
        }
        l
    }

    /// Gives the share of every member that is gone back to the group.
    fn reclaim_dead(&mut self) -> u64 {
        self.0.room_scans += 1;
        let me = SLOT.load(Ordering::Relaxed);
        let mut freed = 0;
        for (i, m) in self.0.members.iter_mut().enumerate() {
            if m.pid == 0 || i == me {
                continue;
            }
            if layout::start_ticks(m.pid) != Some(m.start_ticks) {
                freed += m.bytes;
                self.0.used = self.0.used.saturating_sub(m.bytes);
                *m = unsafe { std::mem::zeroed() };
            }
        }
        if freed > 0 {
            tracing::info!("group: reclaimed {freed} bytes of members that are gone");
        }
        freed
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        unsafe { libc::pthread_mutex_unlock(&mut self.0.mutex) };
    }
}

/// This process's slot, joining the group on first use (and again in a fork child).
fn slot(l: &mut Locked) -> Option<usize> {
    match SLOT.load(Ordering::Relaxed) {
        NO_SLOT => return None,
        NOT_JOINED => {}
        s => return Some(s),
    }
    l.reclaim_dead();
    let pid = std::process::id();
    let Some(i) = l.0.members.iter().position(|m| m.pid == 0) else {
        SLOT.store(NO_SLOT, Ordering::Relaxed);
        tracing::warn!("group: all {MAX_MEMBERS} member slots are taken; this process uses its own budget only");
        return None;
    };
    let m: &mut Member = &mut l.0.members[i];
    *m = unsafe { std::mem::zeroed() };
    m.pid = pid;
    m.start_ticks = layout::start_ticks(pid).unwrap_or(0);
    let exe = crate::kernel::exe();
    let name = exe.rsplit('/').next().unwrap_or("").as_bytes();
    let n = name.len().min(layout::EXE_BYTES - 1);
    m.exe[..n].copy_from_slice(&name[..n]);
    SLOT.store(i, Ordering::Relaxed);
    Some(i)
}

/// Takes `bytes` from the group's budget if they fit (or whatever the budget, with `force`).
#[inline]
pub fn reserve(bytes: u64, force: bool) -> bool {
    match header() {
        None => true,
        Some(h) => reserve_in(h, bytes, force),
    }
}

#[inline(never)]
fn reserve_in(h: &'static mut Header, bytes: u64, force: bool) -> bool {
    let mut l = Locked::new(h);
    let Some(i) = slot(&mut l) else { return true };
    let fits = |l: &Locked| l.0.used.checked_add(bytes).is_some_and(|n| n <= l.0.budget);
    if !force && !fits(&l) && (l.reclaim_dead() == 0 || !fits(&l)) {
        return false;
    }
    l.0.used = l.0.used.saturating_add(bytes);
    l.0.peak = l.0.peak.max(l.0.used);
    let m = &mut l.0.members[i];
    m.bytes = m.bytes.saturating_add(bytes);
    m.peak = m.peak.max(m.bytes);
    true
}

#[inline]
pub fn release(bytes: u64) {
    if let Some(h) = header() {
        release_in(h, bytes)
    }
}

#[inline(never)]
fn release_in(h: &'static mut Header, bytes: u64) {
    let i = SLOT.load(Ordering::Relaxed);
    if i >= MAX_MEMBERS {
        return;
    }
    let l = Locked::new(h);
    let m = &mut l.0.members[i];
    let b = bytes.min(m.bytes);
    m.bytes -= b;
    l.0.used = l.0.used.saturating_sub(b);
}

pub fn note_denied() {
    note(|m| &mut m.denied);
}

pub fn note_downgraded() {
    note(|m| &mut m.downgraded);
}

fn note(field: impl Fn(&mut Member) -> &mut u64) {
    let (Some(h), i) = (header(), SLOT.load(Ordering::Relaxed)) else { return };
    if i < MAX_MEMBERS {
        atomic(field(&mut h.members[i])).fetch_add(1, Ordering::Relaxed);
    }
}

/// At exit: the process's pinned memory goes with it, and so does its share.
pub fn leave() {
    let Some(h) = header() else { return };
    let i = SLOT.swap(NO_SLOT, Ordering::Relaxed);
    if i >= MAX_MEMBERS {
        return;
    }
    let l = Locked::new(h);
    let m = &mut l.0.members[i];
    l.0.used = l.0.used.saturating_sub(m.bytes);
    *m = unsafe { std::mem::zeroed() };
}

/// In a fork child: a new process, which joins as a member of its own when it first pins.
pub fn after_fork_child() {
    if SLOT.load(Ordering::Relaxed) != NO_SLOT || !MAP.load(Ordering::Relaxed).is_null() {
        SLOT.store(NOT_JOINED, Ordering::Relaxed);
    }
}

pub fn limited() -> bool {
    header().is_some_and(|h| h.budget != u64::MAX)
}

pub struct Snapshot {
    pub name: String,
    pub budget: Option<u64>,
    pub used: u64,
    pub peak: u64,
    pub members: usize,
}

pub fn snapshot() -> Option<Snapshot> {
    let h = header()?;
    let l = Locked::new(h);
    Some(Snapshot {
        name: NAME.get().cloned().unwrap_or_default(),
        budget: (l.0.budget != u64::MAX).then_some(l.0.budget),
        used: l.0.used,
        peak: l.0.peak,
        members: l.0.members.iter().filter(|m| m.pid != 0).count(),
    })
}
