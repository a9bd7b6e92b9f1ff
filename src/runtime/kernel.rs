//! What the kernel says about this process: locked and pinned pages, its mappings, limits,
//! identity; and what the kernel would answer to a locking call, asked without side effects.
//!
//! Every `/proc` read goes through `crate::runtime::sys` (raw system calls: no cancellation point), and the
//! reads on the locking path parse through a buffer on the stack: that path may run inside a
//! signal handler that interrupted `malloc`.

use crate::runtime::config::System;
use crate::runtime::sys;
use pinguard_common::group::live::Proc;
use std::ffi::{CStr, CString};
use std::os::raw::c_int;

/// Calls `f` with each line of a `/proc` file (without its newline). A line longer than the buffer
/// is handed over cut to the buffer's size, the rest skipped: what pinguard reads sits at the start
/// of its lines (a mapping's path, which may be long, comes last). The buffer is small because a
/// signal handler's stack may be. False when the file could not be read to its end.
pub fn for_each_line(path: &CStr, mut f: impl FnMut(&[u8])) -> bool {
    let Ok(fd) = sys::open_read(path) else {
        return false;
    };
    let mut buf = [0u8; 1024];
    let mut have = 0;
    let mut skipping = false;
    let ok = loop {
        match sys::read(fd, &mut buf[have..]) {
            Ok(0) => {
                if have > 0 && !skipping {
                    f(&buf[..have]);
                }
                break true;
            }
            Ok(n) => {
                have += n;
                let mut start = 0;
                while let Some(i) = buf[start..have].iter().position(|&b| b == b'\n') {
                    if !skipping {
                        f(&buf[start..start + i]);
                    }
                    skipping = false;
                    start += i + 1;
                }
                buf.copy_within(start..have, 0);
                have -= start;
                if have == buf.len() {
                    if !skipping {
                        f(&buf[..have]);
                    }
                    skipping = true;
                    have = 0;
                }
            }
            Err(_) => break false,
        }
    };
    sys::close(fd);
    ok
}

/// "   1234 kB" as bytes (`None` past `u64::MAX`: a file no kernel wrote).
fn kb(rest: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(rest).ok()?;
    text.trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)
}

#[derive(Default)]
pub struct Status {
    pub vm_lck: Option<u64>,
    pub vm_pin: Option<u64>,
    pub vm_size: Option<u64>,
}

const STATUS: &CStr = c"/proc/self/status";
const SMAPS: &CStr = c"/proc/self/smaps";

/// `VmLck`, `VmPin` and `VmSize` from `/proc/self/status`, in bytes.
pub fn status() -> Status {
    let mut s = Status::default();
    for_each_line(STATUS, |line| {
        let (key, rest) = match line.iter().position(|&b| b == b':') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => return,
        };
        match key {
            b"VmLck" => s.vm_lck = kb(rest),
            b"VmPin" => s.vm_pin = kb(rest),
            b"VmSize" => s.vm_size = kb(rest),
            _ => {}
        }
    });
    s
}

/// The kernel's count of this process's locked bytes (`VmLck`): the cheap check against
/// pinguard's view, one read of a small file.
pub fn vm_lck() -> Option<u64> {
    status().vm_lck
}

static SMAPS_WALKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times this process read `/proc/self/smaps` (the report's `kernel.smaps_walk_count`):
/// each costs a walk of every mapping's page tables, milliseconds in a process with thousands.
pub fn smaps_walks() -> u64 {
    SMAPS_WALKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// One mapping, as `/proc/self/smaps` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: usize,
    pub end: usize,
    /// `lo` in `VmFlags`: the kernel counts these pages in `VmLck`.
    pub locked: bool,
    /// Whether `mlock`/`mlockall` would lock it: not `VM_IO`, `VM_PFNMAP`, `VM_DONTEXPAND`,
    /// `VM_MIXEDMAP` or hugetlb (the kernel skips those, uncounted), nor the vsyscall page.
    pub lockable: bool,
}

/// Reads the header line of a mapping: "start-end perms offset dev inode path".
fn vma_header(line: &[u8]) -> Option<(usize, usize)> {
    let token = line.split(|&b| b == b' ').next()?;
    let dash = token.iter().position(|&b| b == b'-')?;
    let hex = |t: &[u8]| usize::from_str_radix(std::str::from_utf8(t).ok()?, 16).ok();
    Some((hex(&token[..dash])?, hex(&token[dash + 1..])?))
}

/// Applies `VmFlags: rd wr mr mw me lo ...` to the mapping it closes.
fn vma_flags(start: usize, end: usize, flags: &[u8]) -> Vma {
    let mut v = Vma {
        start,
        end,
        locked: false,
        lockable: (start as isize) >= 0,
    };
    for f in flags.split(|&b| b == b' ').filter(|f| !f.is_empty()) {
        match f {
            b"lo" => v.locked = true,
            b"io" | b"pf" | b"de" | b"mm" | b"ht" => v.lockable = false,
            _ => {}
        }
    }
    v
}

/// Every mapping of this process in address order, from `/proc/self/smaps` (the only place the
/// kernel shows which mappings are locked). Costs a walk of the page tables: only when the cheap
/// check (`vm_lck`) found a difference, or for `mlockall`. False when the file could not be read
/// to its end (what was handed to `f` is still true, as of its reading).
pub fn for_each_vma(mut f: impl FnMut(Vma)) -> bool {
    SMAPS_WALKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut cur: Option<(usize, usize)> = None;
    for_each_line(SMAPS, |line| {
        if let Some(flags) = line.strip_prefix(b"VmFlags:") {
            if let Some((s, e)) = cur.take() {
                f(vma_flags(s, e, flags));
            }
        } else if let Some(range) = vma_header(line) {
            cur = Some(range);
        }
    })
}

/// Every mapping's range in address order, from `/proc/self/maps` (no walk of the page tables,
/// unlike `smaps`), but the vsyscall page. False when the file could not be read to its end.
pub fn for_each_mapping(mut f: impl FnMut(usize, usize)) -> bool {
    for_each_line(c"/proc/self/maps", |line| {
        if let Some((s, e)) = vma_header(line).filter(|&(s, _)| (s as isize) >= 0) {
            f(s, e);
        }
    })
}

pub fn rlimit_memlock() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(r.rlim_cur)
}

/// Whether `getrlimit(RLIMIT_MEMLOCK)` answers (`rlimit_memlock`'s `None` is then "unlimited").
pub fn rlimit_memlock_read() -> bool {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) == 0 }
}

/// A raw system call that keeps the caller's `errno`; -1 and the error on failure.
fn raw(f: impl FnOnce() -> libc::c_long) -> Result<libc::c_long, c_int> {
    // SAFETY: errno's location is valid for the calling thread.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: as above.
    let saved = unsafe { *errno };
    let r = f();
    let out = if r == -1 {
        // SAFETY: as above.
        Err(unsafe { *errno })
    } else {
        Ok(r)
    };
    // SAFETY: as above.
    unsafe { *errno = saved };
    out
}

/// Whether the kernel would let this process lock anything: with `RLIMIT_MEMLOCK` 0 and no
/// `CAP_IPC_LOCK` every lock call fails with EPERM first. A zero-length `mlock` asks exactly that
/// and locks nothing.
fn can_lock() -> bool {
    // SAFETY: a zero-length mlock reads no memory and changes nothing.
    raw(|| unsafe { libc::syscall(libc::SYS_mlock, 0usize, 0usize) }) != Err(libc::EPERM)
}

/// `CAP_IPC_LOCK` in the effective set: the kernel's `RLIMIT_MEMLOCK` then does not apply.
pub fn cap_ipc_lock() -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: version 3 takes two data structs; both pointers are valid for writing.
    let r =
        raw(|| unsafe { libc::syscall(libc::SYS_capget, &mut h as *mut Header, d.as_mut_ptr()) });
    r.is_ok() && d[0].effective & (1 << CAP_IPC_LOCK) != 0
}

/// Over `RLIMIT_MEMLOCK` (which `CAP_IPC_LOCK` lifts) after locking `more` bytes beyond `base`.
fn over_rlimit(base: u64, more: u64) -> bool {
    rlimit_memlock().is_some_and(|limit| base.saturating_add(more) > limit) && !cap_ipc_lock()
}

/// Whether every page of `[start, end)` (page-aligned) is mapped: `msync(MS_ASYNC)` answers
/// ENOMEM for a hole, and since Linux 2.6.19 does nothing else.
pub fn mapped(start: usize, end: usize) -> bool {
    // SAFETY: MS_ASYNC only checks the range; no memory is read or written.
    raw(|| unsafe { libc::syscall(libc::SYS_msync, start, end - start, libc::MS_ASYNC) })
        != Err(libc::ENOMEM)
}

/// A full memory barrier on every running thread of this process (`membarrier`, private
/// expedited, Linux 4.14 on): what a rare path does so that the hot path on the other threads
/// needs none. The process registers on first use (and again in a fork child, whose new address
/// space may not be registered: the kernel answers EPERM). `false` where the kernel or a sandbox
/// refuses it, then for good.
pub fn fence_all_threads() -> bool {
    const EXPEDITED: c_int = 1 << 3; // MEMBARRIER_CMD_PRIVATE_EXPEDITED
    const REGISTER: c_int = 1 << 4; // MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED
    static REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if REFUSED.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    // SAFETY: membarrier takes no pointers; these commands only order memory.
    let call = |cmd: c_int| raw(|| unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) });
    let ok = match call(EXPEDITED) {
        Ok(_) => true,
        Err(libc::EPERM) => call(REGISTER).is_ok() && call(EXPEDITED).is_ok(),
        Err(_) => false,
    };
    if !ok {
        REFUSED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    ok
}

/// Whether any mapping in `[start, end)` (page-aligned) is locked: `msync(MS_INVALIDATE)` goes
/// through the range's mappings in order, skipping holes, and answers EBUSY at the first one
/// locked (`VM_LOCKED`, which `mlock2(MLOCK_ONFAULT)` sets too); without `MS_SYNC` it writes
/// nothing back and invalidates nothing (Linux 2.6.19 on). One look-up per mapping of the range,
/// under the kernel's read lock: what a failed `mlock` costs, where reading `/proc` costs
/// microseconds and `/proc/self/smaps` milliseconds.
pub fn any_locked(start: usize, end: usize) -> bool {
    // SAFETY: MS_INVALIDATE without MS_SYNC only checks the range; no memory is read or written.
    raw(|| unsafe { libc::syscall(libc::SYS_msync, start, end - start, libc::MS_INVALIDATE) })
        == Err(libc::EBUSY)
}

/// What the kernel would answer to `mlock`/`mlock2` (valid flags) of the pages `[start, end)`,
/// `new` of them not yet locked, if it would fail: asked only where pinguard is about to refuse
/// or downgrade, never of a call it lets through.
pub fn mlock_rejected(start: usize, end: usize, new: u64) -> Option<c_int> {
    if !can_lock() {
        return Some(libc::EPERM);
    }
    if over_rlimit(vm_lck().unwrap_or(0), new) || !mapped(start, end) {
        return Some(libc::ENOMEM);
    }
    None
}

/// `mlockall`'s flags as the kernel checks them.
pub fn mlockall_flags_valid(flags: c_int) -> bool {
    let known = libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT;
    flags != 0 && flags & !known == 0 && flags != libc::MCL_ONFAULT
}

/// What the kernel would answer to `mlockall(flags)` (valid flags), if it would fail; `ours`:
/// the bytes of pinguard's own mappings, which the call leaves out (`own_maps::mlockall`).
pub fn mlockall_rejected(flags: c_int, ours: u64) -> Option<c_int> {
    if !can_lock() {
        return Some(libc::EPERM);
    }
    // The kernel compares the whole address space with the limit for MCL_CURRENT.
    let size = status().vm_size.unwrap_or(0).saturating_sub(ours);
    if flags & libc::MCL_CURRENT != 0 && over_rlimit(size, 0) {
        return Some(libc::ENOMEM);
    }
    None
}

/// What the kernel (and glibc's wrapper) would answer to `mmap` with `MAP_LOCKED` for reasons
/// other than the lock limit, in the kernel's order: offset, descriptor, length, address, type,
/// access. Asks the descriptor only for its flags and type (`fcntl(F_GETFL)`, `fstat`); maps
/// nothing.
pub fn mmap_rejected(
    addr: usize,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
    page: usize,
) -> Option<c_int> {
    if off as u64 & (page as u64 - 1) != 0 {
        return Some(libc::EINVAL); // glibc's own check
    }
    let anonymous = flags & libc::MAP_ANONYMOUS != 0;
    let mut mode = 0;
    let mut kind = 0;
    if !anonymous {
        // SAFETY: F_GETFL reads the descriptor's flags only.
        match raw(|| unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL) }) {
            Ok(m) if m as c_int & libc::O_PATH == 0 => mode = m as c_int,
            _ => return Some(libc::EBADF),
        }
        // SAFETY: all-zero bytes are a valid `stat` (integers only).
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid out-pointer; fstat reads the descriptor's metadata only.
        if raw(|| unsafe { libc::syscall(libc::SYS_fstat, fd, &mut st as *mut libc::stat) }).is_ok()
        {
            kind = st.st_mode & libc::S_IFMT;
        }
    }
    if len == 0 {
        return Some(libc::EINVAL);
    }
    // Beyond any address space (the kernel's TASK_SIZE is at least 2^47 where pinguard runs).
    if len.checked_add(page - 1).is_none() || len > 1 << 47 {
        return Some(libc::ENOMEM);
    }
    if flags & libc::MAP_FIXED != 0 && addr & (page - 1) != 0 {
        return Some(libc::EINVAL);
    }
    if !can_lock() {
        return Some(libc::EPERM);
    }
    if over_rlimit(
        vm_lck().unwrap_or(0),
        (len + page - 1) as u64 & !(page as u64 - 1),
    ) {
        return Some(libc::EAGAIN);
    }
    const MAP_TYPE: c_int = 0x0f;
    let shared = match flags & MAP_TYPE {
        libc::MAP_PRIVATE => false,
        libc::MAP_SHARED => true,
        libc::MAP_SHARED_VALIDATE if !anonymous => true,
        0 | libc::MAP_SHARED_VALIDATE => return Some(libc::EINVAL),
        // A type newer than pinguard (MAP_DROPPABLE, Linux 6.11): the budget answers.
        _ => return None,
    };
    if !anonymous {
        let access = mode & libc::O_ACCMODE;
        if shared && prot & libc::PROT_WRITE != 0 && access == libc::O_RDONLY {
            return Some(libc::EACCES);
        }
        if access == libc::O_WRONLY {
            return Some(libc::EACCES);
        }
        if matches!(kind, libc::S_IFIFO | libc::S_IFDIR | libc::S_IFSOCK) {
            return Some(libc::ENODEV);
        }
    }
    None
}

/// A set-user-ID or otherwise secure-mode process: the environment must not choose where it writes.
pub fn secure_mode() -> bool {
    // SAFETY: getauxval only reads the auxiliary vector.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

pub struct Host;

impl System for Host {
    fn memory_limit(&self) -> Option<u64> {
        cgroup_memory_limit().or_else(mem_total)
    }

    fn mem_total(&self) -> Option<u64> {
        mem_total()
    }

    fn cgroup_limit(&self) -> Option<u64> {
        cgroup_memory_limit()
    }
}

/// `MemTotal` alone: a percentage budget needs nothing else, so a file whose `MemAvailable` is
/// missing or unusable (an old kernel, an emulated `/proc`) still gives it.
fn mem_total() -> Option<u64> {
    let mut total = None;
    let whole = for_each_line(MEMINFO, |line| {
        if let Some(rest) = line.strip_prefix(b"MemTotal:") {
            total = total.or(Some(kb_strict(rest)));
        }
    });
    total.flatten().filter(|_| whole)
}

const MEMINFO: &CStr = c"/proc/meminfo";

/// The host's memory as `/proc/meminfo` gives it, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// `MemTotal` (`None`: no such line).
    pub total: Option<u64>,
    /// `MemAvailable`: what the kernel estimates can be allocated without swapping.
    pub available: u64,
}

/// Why `/proc/meminfo` gave no usable reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadMeminfo {
    Unreadable,
    /// No `MemAvailable` line, or one that is not a number of kB.
    NoAvailable,
    /// `MemAvailable` above `MemTotal`: not a kernel's file.
    AboveTotal,
}

impl BadMeminfo {
    /// What is wrong, for people: completes "/proc/meminfo ...".
    pub const fn why(self) -> &'static str {
        match self {
            BadMeminfo::Unreadable => "cannot be read",
            BadMeminfo::NoAvailable => "has no MemAvailable line in kB",
            BadMeminfo::AboveTotal => "has a MemAvailable above its MemTotal",
        }
    }
}

/// `MemTotal` and `MemAvailable` from `/proc/meminfo`. Raw system calls into a buffer on the
/// stack: it runs inside pinning calls (the host reserve), where nothing may allocate or be a
/// cancellation point.
pub fn host_memory() -> Result<HostMemory, BadMeminfo> {
    meminfo_at(MEMINFO)
}

fn meminfo_at(path: &CStr) -> Result<HostMemory, BadMeminfo> {
    let (mut total, mut available) = (None, None);
    let whole = for_each_line(path, |line| {
        if let Some(rest) = line.strip_prefix(b"MemTotal:") {
            total = total.or(Some(kb_strict(rest)));
        } else if let Some(rest) = line.strip_prefix(b"MemAvailable:") {
            available = available.or(Some(kb_strict(rest)));
        }
    });
    if !whole {
        return Err(BadMeminfo::Unreadable);
    }
    let available = available.flatten().ok_or(BadMeminfo::NoAvailable)?;
    let total = total.flatten();
    if total.is_some_and(|t| available > t) {
        return Err(BadMeminfo::AboveTotal);
    }
    Ok(HostMemory { total, available })
}

/// "   1234 kB" as bytes, the unit required: a figure that does not say it is in kB is not one
/// the kernel wrote.
fn kb_strict(rest: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(rest).ok()?.trim();
    text.strip_suffix("kB")?
        .trim_end()
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)
}

/// The memory limit of this process's cgroup: the tightest on its path up to the root it can see
/// (v2 `memory.max`, v1 `memory.limit_in_bytes`).
fn cgroup_memory_limit() -> Option<u64> {
    let read = |p: &str| sys::read_text(&CString::new(p).ok()?);
    pinguard_common::cgroup::memory_limit(&read)
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for its length; gethostname NUL-terminates within it or truncates.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return String::new();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

pub fn exe() -> String {
    // readlink is no cancellation point.
    std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The last component of this process's executable, without allocating (under the group's
/// lock): as much of it as `out` holds less one byte, so it stays NUL-terminated.
pub fn exe_name(out: &mut [u8]) {
    let mut buf = [0u8; 4096];
    // SAFETY: the path is NUL-terminated and `buf` is valid for its length.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/exe".as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
        )
    };
    if n <= 0 || out.is_empty() {
        return;
    }
    let path = &buf[..n as usize];
    let name = match path.iter().rposition(|&b| b == b'/') {
        Some(p) => &path[p + 1..],
        None => path,
    };
    let k = name.len().min(out.len() - 1);
    out[..k].copy_from_slice(&name[..k]);
}

pub fn cmdline() -> Vec<String> {
    sys::read_file(c"/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// This process's PID namespace (the inode number of `/proc/self/ns/pid`), when `/proc` is the one
/// of that namespace (`/proc/self` names this process): through a `/proc` mounted for another
/// namespace, every pid would be a stranger's.
pub fn pid_namespace() -> Option<u64> {
    // readlink is no cancellation point.
    let me = std::fs::read_link("/proc/self").ok()?;
    if me.as_os_str().as_encoded_bytes() != raw_pid().to_string().as_bytes() {
        return None;
    }
    pinguard_common::textfile::ns_inode(
        std::fs::read_link("/proc/self/ns/pid")
            .ok()?
            .as_os_str()
            .as_encoded_bytes(),
    )
}

/// The caller's pid from the kernel (glibc's cached one is wrong in a `vfork` child).
pub fn raw_pid() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_getpid) as i32 }
}

/// When this process started, in clock ticks after boot (`/proc/self/stat`'s 22nd field): with
/// the pid, it tells this process from a later one that reuses its pid.
/// Read from the main thread's task entry: qemu-user makes up `/proc/self/stat` (start time 0).
pub fn start_ticks() -> u64 {
    match proc_start(raw_pid() as u32) {
        Proc::Started(t) => t,
        _ => sys::read_file(c"/proc/self/stat")
            .as_deref()
            .and_then(pinguard_common::group::parse_start_ticks)
            .unwrap_or(0),
    }
}

/// What `/proc` says of process `pid` (`pinguard_common::group::proc_of`, which the CLI uses):
/// its start time from its main thread's `stat`, read with raw system calls into a stack buffer,
/// so no cancellation point and no allocation (the group's lock may be held).
pub fn proc_start(pid: u32) -> Proc {
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
    match (
        pinguard_common::group::parse_start_ticks(&buf[..len]),
        failed,
    ) {
        (Some(t), _) => Proc::Started(t),
        (None, Some(e)) => gone(e), // the process exited between the open and the read: ESRCH
        (None, None) => Proc::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_lines() {
        assert_eq!(
            vma_header(b"7f12a0000000-7f12a0021000 rw-p 00000000 00:00 0 "),
            Some((0x7f12a0000000, 0x7f12a0021000))
        );
        assert_eq!(
            vma_header(b"55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234   /usr/bin/x y-z"),
            Some((0x55d0c0a00000, 0x55d0c0a01000))
        );
        assert_eq!(vma_header(b"AnonHugePages:         0 kB"), None);
        assert_eq!(vma_header(b"Size:                132 kB"), None);
        let v = vma_flags(0x1000, 0x3000, b" rd wr mr mw me lo ac sd");
        assert!(v.locked && v.lockable);
        let v = vma_flags(0x1000, 0x3000, b" rd mr pf io de dd sd");
        assert!(!v.locked && !v.lockable);
        assert!(!vma_flags(0xffff_ffff_ff60_0000, 0xffff_ffff_ff60_1000, b" ex").lockable);
    }

    #[test]
    fn long_lines_are_cut_not_lost() {
        let dir = std::env::temp_dir().join(format!("pinguard-lines-{}", std::process::id()));
        let long = "x".repeat(5000);
        std::fs::write(&dir, format!("a: 1\n{long}\nb: 2\n{long}")).unwrap();
        let mut lines = Vec::new();
        assert!(for_each_line(
            &CString::new(dir.to_str().unwrap()).unwrap(),
            |l| lines.push(l.to_vec())
        ));
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], b"a: 1");
        assert_eq!(lines[1].len(), 1024);
        assert_eq!(lines[2], b"b: 2");
        assert_eq!(lines[3].len(), 1024);
    }

    #[test]
    fn meminfo_readings_that_cannot_be_used_say_why() {
        let dir = std::env::temp_dir().join(format!("pinguard-meminfo-{}", std::process::id()));
        let read = |text: &[u8]| {
            std::fs::write(&dir, text).unwrap();
            meminfo_at(&CString::new(dir.to_str().unwrap()).unwrap())
        };
        let good = b"MemTotal:       16384 kB\nMemFree:  100 kB\nMemAvailable:    8192 kB\nBuffers: 1 kB\n";
        assert_eq!(
            read(good),
            Ok(HostMemory {
                total: Some(16384 * 1024),
                available: 8192 * 1024
            })
        );
        assert_eq!(
            read(b"MemAvailable: 8 kB"),
            Ok(HostMemory {
                total: None,
                available: 8192
            }),
            "the last line without its newline"
        );
        assert_eq!(
            read(b"MemTotal: 16 kB\nMemFree: 8 kB\n"),
            Err(BadMeminfo::NoAvailable)
        );
        assert_eq!(
            read(b"MemAvailable: lots kB\n"),
            Err(BadMeminfo::NoAvailable)
        );
        assert_eq!(
            read(b"MemAvailable: 12\n"),
            Err(BadMeminfo::NoAvailable),
            "no unit"
        );
        assert_eq!(
            read(b"MemAvailable: -12 kB\n"),
            Err(BadMeminfo::NoAvailable)
        );
        assert_eq!(
            read(b"MemAvailable: 99999999999999999999 kB\n"),
            Err(BadMeminfo::NoAvailable),
            "past u64"
        );
        assert_eq!(
            read(b"MemAvailable: 18014398509481984 kB\n"),
            Err(BadMeminfo::NoAvailable),
            "bytes past u64"
        );
        assert_eq!(
            read(b"\x01\x02\xff garbage\n\n"),
            Err(BadMeminfo::NoAvailable)
        );
        assert_eq!(read(b""), Err(BadMeminfo::NoAvailable));
        assert_eq!(
            read(b"MemTotal: 4 kB\nMemAvailable: 8 kB\n"),
            Err(BadMeminfo::AboveTotal)
        );
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(read_missing(), Err(BadMeminfo::Unreadable));
        let host = host_memory().expect("this machine's /proc/meminfo");
        assert!(host.available > 0 && host.total.is_some_and(|t| t >= host.available));
    }

    fn read_missing() -> Result<HostMemory, BadMeminfo> {
        meminfo_at(c"/nonexistent/pinguard/meminfo")
    }

    #[test]
    fn pid_namespace_links() {
        let link = std::fs::read_link("/proc/self/ns/pid").unwrap();
        assert_eq!(
            super::pid_namespace().map(|n| format!("pid:[{n}]")),
            Some(link.to_string_lossy().into_owned())
        );
    }

    #[test]
    fn this_process() {
        let s = status();
        assert!(s.vm_size.unwrap() > 0);
        assert!(s.vm_lck.is_some());
        let mut n = 0;
        let mut last = 0;
        assert!(for_each_vma(|v| {
            assert!(v.start >= last && v.end > v.start, "{v:?} after {last:#x}");
            last = v.end;
            n += 1;
        }));
        assert!(n > 5);
        assert!(mem_total().unwrap() > 0);
        assert!(mlockall_flags_valid(libc::MCL_CURRENT | libc::MCL_ONFAULT));
        for bad in [0, libc::MCL_ONFAULT, 0x40, libc::MCL_CURRENT | 0x100] {
            assert!(!mlockall_flags_valid(bad), "{bad:#x}");
        }
    }

    #[test]
    fn msync_invalidate_tells_locked_mappings_and_changes_nothing() {
        let page = crate::runtime::sys::page_size();
        // SAFETY: a fresh private mapping of our own, unmapped again below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        let byte = |i: usize| (p + i * page) as *mut u8;
        for i in 0..4 {
            // SAFETY: a page of our own mapping.
            unsafe { *byte(i) = 7 + i as u8 };
        }
        assert!(!any_locked(p, p + 4 * page));
        // SAFETY: the second page of our own mapping (one page: within any RLIMIT_MEMLOCK).
        let rc = unsafe { libc::mlock(byte(1) as *const libc::c_void, page) };
        assert_eq!(rc, 0);
        assert!(any_locked(p, p + 4 * page));
        assert!(any_locked(p + page, p + 2 * page));
        assert!(!any_locked(p, p + page) && !any_locked(p + 2 * page, p + 4 * page));
        // A hole before the locked page is skipped, as the kernel's msync does.
        // SAFETY: the first page of our own mapping.
        unsafe { libc::munmap(p as *mut libc::c_void, page) };
        assert!(any_locked(p, p + 2 * page));
        assert!(!any_locked(p, p + page), "a hole alone is not locked");
        for i in 1..4 {
            // SAFETY: pages of our own mapping, still mapped.
            let b = unsafe { *byte(i) };
            assert_eq!(b, 7 + i as u8, "the probe left page {i} as it was");
        }
        // SAFETY: what is left of our own mapping.
        unsafe { libc::munmap(byte(1) as *mut libc::c_void, 3 * page) };
    }

    #[test]
    fn msync_tells_holes_and_changes_nothing() {
        let page = crate::runtime::sys::page_size();
        // SAFETY: a fresh private mapping of our own, unmapped again below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        assert!(mapped(p, p + 3 * page));
        // SAFETY: the middle page of our own mapping.
        unsafe { libc::munmap((p + page) as *mut libc::c_void, page) };
        assert!(mapped(p, p + page));
        assert!(!mapped(p, p + 3 * page));
        assert!(!mapped(p + page, p + 2 * page));
        // SAFETY: what is left of our own mapping.
        unsafe {
            libc::munmap(p as *mut libc::c_void, page);
            libc::munmap((p + 2 * page) as *mut libc::c_void, page);
        }
    }
}
