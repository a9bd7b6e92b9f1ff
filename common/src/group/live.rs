//! Whether a group member is alive, without its pid where possible.
//!
//! Each member holds its slot's semaphore in the group's System V semaphore set, raised with
//! `SEM_UNDO`: the kernel lowers it again when the member's process ends, however it ends
//! (SIGKILL, OOM kill), and not before: the undo list is shared by the threads of a process
//! (glibc and musl create threads with `CLONE_SYSVSEM`), a thread's exit does not apply it, it
//! survives `execve`, it needs no descriptor, and a fork child does not inherit it. So a member
//! whose semaphore is 0 is gone, whichever PID namespace it runs in. The set lives in one IPC
//! namespace: a member elsewhere holds none, and is told alive by its pid and start time, which
//! only a process in its own PID namespace can read; from anywhere else it is taken for alive
//! (never reclaimed on a guess).
//!
//! Raw semaphore calls only: no allocation, no descriptor, no cancellation point (the library
//! calls these inside pinning calls, some under the group's lock).

use super::MAX_MEMBERS;
use std::ffi::CStr;
use std::os::raw::c_int;

/// What a look says of a member.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    Alive,
    /// Its process ended: its share may go back to the group.
    Gone,
    /// Nothing this process can read says (another PID namespace, and no semaphore it can reach):
    /// taken for alive.
    Unknown,
}

/// What `/proc` says of a pid.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Proc {
    /// A process with this start time has the pid.
    Started(u64),
    /// No process has the pid.
    Gone,
    /// The entry could not be read (out of descriptors, say): no verdict.
    Unknown,
}

/// The asking process's namespaces (0: unknown, which matches nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Here {
    pub ipc_ns: u64,
    pub pid_ns: u64,
}

impl Here {
    /// Reads this process's `/proc/self/ns/{ipc,pid}` (one `stat` each; no descriptor).
    pub fn read() -> Here {
        Here {
            ipc_ns: ns_inode(c"/proc/self/ns/ipc"),
            pid_ns: ns_inode(c"/proc/self/ns/pid"),
        }
    }
}

/// The inode of a namespace file (`/proc/self/ns/ipc`): two processes in one namespace read the
/// same, processes in two namespaces alive at once never do. 0 when it cannot be read. Read with
/// `readlink` (`ipc:[4026531839]`): no descriptor, and a symbol every glibc since 2.17 has.
pub fn ns_inode(path: &CStr) -> u64 {
    let mut buf = [0u8; 64];
    // SAFETY: `path` is NUL-terminated and `buf` is valid for its length.
    let n = unsafe { libc::readlink(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 || n as usize >= buf.len() {
        return 0;
    }
    parse_ns_link(&buf[..n as usize])
}

/// The number in a namespace link's text, `TYPE:[NUMBER]`; 0 for anything else.
fn parse_ns_link(link: &[u8]) -> u64 {
    let Some(open) = link.iter().position(|&b| b == b'[') else {
        return 0;
    };
    let digits = &link[open + 1..];
    let Some(close) = digits.iter().position(|&b| b == b']') else {
        return 0;
    };
    let mut v: u64 = 0;
    for &b in &digits[..close] {
        if !b.is_ascii_digit() {
            return 0;
        }
        v = match v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
        {
            Some(v) => v,
            None => return 0,
        };
    }
    v
}

/// What a member slot says of its process, read from the ledger.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    pub pid: u32,
    pub start_ticks: u64,
    pub sem_key: i32,
    pub ipc_ns: u64,
    pub pid_ns: u64,
}

/// The verdict on the member in slot `i`: its semaphore when it holds one in a set this process
/// can reach (`value(key)`: the semaphore's value, `None` when the set cannot be reached), else
/// its pid and start time when it runs in this process's PID namespace (`proc(pid)`), else
/// `Unknown`. Every read of the slot must come before `value` is asked: a member raises its
/// semaphore before it writes its slot, so a slot read before a 0 was read belongs to a member
/// that had ended by then (or left: the caller checks the slot again before emptying it).
pub fn judge(
    m: &Seen,
    here: Here,
    value: impl FnOnce(i32) -> Option<u32>,
    proc: impl FnOnce(u32) -> Proc,
) -> Verdict {
    if m.sem_key != 0 && here.ipc_ns != 0 && m.ipc_ns == here.ipc_ns {
        match value(m.sem_key) {
            Some(0) => return Verdict::Gone,
            Some(_) => return Verdict::Alive,
            None => {} // the set was removed (`ipcrm`): the pid may still say
        }
    }
    if here.pid_ns == 0 || m.pid_ns != here.pid_ns {
        return Verdict::Unknown;
    }
    match proc(m.pid) {
        Proc::Gone => Verdict::Gone,
        Proc::Started(t) if t != m.start_ticks => Verdict::Gone,
        Proc::Started(_) => Verdict::Alive,
        Proc::Unknown => Verdict::Unknown,
    }
}

pub fn errno() -> c_int {
    // SAFETY: errno's location is valid for the calling thread.
    unsafe { *libc::__errno_location() }
}

/// A group's semaphore set, one semaphore per member slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Set {
    pub id: c_int,
    pub key: i32,
}

impl Set {
    /// The set with `key` in this IPC namespace, if it is one pinguard could have made: this
    /// user's, mode 0600, one semaphore per slot. `Err(errno)`: `ENOENT` when there is none.
    pub fn open(key: i32) -> Result<Set, c_int> {
        // SAFETY: no pointers; a key of 0 (IPC_PRIVATE) is never asked for.
        let id = unsafe { libc::semget(key, 0, 0) };
        if key == 0 || id < 0 {
            return Err(if key == 0 { libc::ENOENT } else { errno() });
        }
        // SAFETY: an all-zero `semid_ds` is a valid value for the kernel to overwrite.
        let mut ds: libc::semid_ds = unsafe { std::mem::zeroed() };
        // SAFETY: IPC_STAT writes one `semid_ds` through the pointer passed as `semun.buf`.
        if unsafe { libc::semctl(id, 0, libc::IPC_STAT, &mut ds as *mut libc::semid_ds) } != 0 {
            return Err(errno());
        }
        // SAFETY: no arguments; it cannot fail.
        let me = unsafe { libc::geteuid() };
        if ds.sem_perm.uid != me
            || ds.sem_perm.mode as u32 & 0o777 != 0o600
            || ds.sem_nsems as usize != MAX_MEMBERS
        {
            return Err(libc::EPERM); // not pinguard's: never touched
        }
        Ok(Set { id, key })
    }

    /// A new set under a random key, created exclusively (mode 0600): never someone else's.
    pub fn create() -> Result<Set, c_int> {
        let mut last = libc::EEXIST;
        for attempt in 0..8u32 {
            let key = random_key(attempt);
            // SAFETY: no pointers.
            let id = unsafe {
                libc::semget(
                    key,
                    MAX_MEMBERS as c_int,
                    libc::IPC_CREAT | libc::IPC_EXCL | 0o600,
                )
            };
            if id >= 0 {
                return Ok(Set { id, key });
            }
            last = errno();
            if last != libc::EEXIST {
                break;
            }
        }
        Err(last)
    }

    /// The value of slot `i`'s semaphore: above 0 while its member lives.
    pub fn value(self, i: usize) -> Result<u32, c_int> {
        // SAFETY: GETVAL takes no argument beyond the semaphore's number.
        let v = unsafe { libc::semctl(self.id, i as c_int, libc::GETVAL) };
        if v < 0 {
            Err(errno())
        } else {
            Ok(v as u32)
        }
    }

    /// Every slot's value at one moment (one system call).
    pub fn values(self, out: &mut [u16; MAX_MEMBERS]) -> Result<(), c_int> {
        // SAFETY: GETALL writes `sem_nsems` (checked to be MAX_MEMBERS by `open`, or set by
        // `create`) unsigned shorts through the pointer passed as `semun.array`.
        if unsafe { libc::semctl(self.id, 0, libc::GETALL, out.as_mut_ptr()) } != 0 {
            return Err(errno());
        }
        Ok(())
    }

    /// Raises slot `i`'s semaphore for as long as this process lives (`SEM_UNDO`), never waiting.
    pub fn hold(self, i: usize) -> Result<(), c_int> {
        self.op(i, 1)
    }

    /// Lowers slot `i`'s semaphore that `hold` raised, and cancels its undo.
    pub fn let_go(self, i: usize) -> Result<(), c_int> {
        self.op(i, -1)
    }

    fn op(self, i: usize, by: i16) -> Result<(), c_int> {
        let mut op = libc::sembuf {
            sem_num: i as u16,
            sem_op: by,
            sem_flg: (libc::SEM_UNDO | libc::IPC_NOWAIT) as i16,
        };
        // SAFETY: one valid `sembuf`; IPC_NOWAIT: the call never blocks.
        if unsafe { libc::semop(self.id, &mut op, 1) } != 0 {
            return Err(errno());
        }
        Ok(())
    }

    /// Removes the set (a creator that lost the race to publish, or a ledger's cleanup).
    pub fn remove(self) {
        // SAFETY: IPC_RMID takes no argument; a set already gone gives EINVAL, ignored.
        unsafe { libc::semctl(self.id, 0, libc::IPC_RMID) };
    }
}

/// A key for a new set: random where the kernel gives random bytes without waiting, else the
/// clock and pid mixed; never 0 (IPC_PRIVATE) or negative.
fn random_key(attempt: u32) -> i32 {
    let mut b = [0u8; 4];
    // The system call, not glibc's `getrandom` (2.25): the library and CLI need at most glibc 2.17.
    // SAFETY: `b` is valid for 4 bytes; GRND_NONBLOCK: it never waits.
    let got = unsafe {
        libc::syscall(
            libc::SYS_getrandom,
            b.as_mut_ptr(),
            4usize,
            libc::GRND_NONBLOCK,
        )
    } == 4;
    let mut v = u32::from_ne_bytes(b);
    if !got {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        // SAFETY: no arguments.
        let pid = unsafe { libc::getpid() } as u32;
        v = (ts.tv_nsec as u32).wrapping_mul(2_654_435_761)
            ^ pid.rotate_left(16)
            ^ attempt.wrapping_mul(0x9e37_79b9);
    }
    ((v & 0x7fff_ffff) | 1) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    const HERE: Here = Here {
        ipc_ns: 10,
        pid_ns: 20,
    };

    fn seen(sem_key: i32, ipc_ns: u64, pid_ns: u64) -> Seen {
        Seen {
            pid: 1,
            start_ticks: 500,
            sem_key,
            ipc_ns,
            pid_ns,
        }
    }

    #[test]
    fn the_semaphore_decides_where_it_can_be_read_the_pid_only_in_its_own_namespace() {
        let no_proc = |_| panic!("the pid is not to be read");
        // A semaphore in this IPC namespace: its value decides, whatever the PID namespace.
        assert_eq!(
            judge(&seen(7, 10, 99), HERE, |_| Some(1), no_proc),
            Verdict::Alive
        );
        assert_eq!(
            judge(&seen(7, 10, 99), HERE, |_| Some(0), no_proc),
            Verdict::Gone
        );
        // The set removed: the pid, from the member's own PID namespace only.
        assert_eq!(
            judge(&seen(7, 10, 20), HERE, |_| None, |_| Proc::Gone),
            Verdict::Gone
        );
        assert_eq!(
            judge(&seen(7, 10, 99), HERE, |_| None, no_proc),
            Verdict::Unknown
        );
        // No semaphore, or one in another IPC namespace: the pid, in the same PID namespace.
        let no_sem = |_| panic!("the semaphore is not to be read");
        assert_eq!(
            judge(&seen(0, 10, 20), HERE, no_sem, |_| Proc::Started(500)),
            Verdict::Alive
        );
        assert_eq!(
            judge(&seen(7, 11, 20), HERE, no_sem, |_| Proc::Started(501)),
            Verdict::Gone
        );
        assert_eq!(
            judge(&seen(0, 10, 20), HERE, no_sem, |_| Proc::Unknown),
            Verdict::Unknown
        );
        assert_eq!(
            judge(&seen(7, 11, 21), HERE, no_sem, no_proc),
            Verdict::Unknown
        );
        // Namespaces this process cannot read match nothing.
        assert_eq!(
            judge(&seen(7, 0, 0), Here::default(), no_sem, no_proc),
            Verdict::Unknown
        );
    }

    #[test]
    fn a_namespace_is_the_number_in_its_link() {
        assert_eq!(parse_ns_link(b"ipc:[4026531839]"), 4026531839);
        assert_eq!(parse_ns_link(b"pid:[]"), 0);
        assert_eq!(parse_ns_link(b"pid:[12x]"), 0);
        assert_eq!(parse_ns_link(b"garbage"), 0);
        assert_eq!(parse_ns_link(b"pid:[99999999999999999999999]"), 0);
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata("/proc/self/ns/pid")
            .map(|m| m.ino())
            .unwrap_or(0);
        assert_eq!(
            ns_inode(c"/proc/self/ns/pid"),
            ino,
            "the link's number is the file's inode"
        );
    }

    #[test]
    fn a_held_semaphore_drops_to_zero_when_its_holder_ends() {
        let set = match Set::create() {
            Ok(s) => s,
            Err(e) => return eprintln!("NOT RUN: no System V semaphores here (errno {e})"),
        };
        let opened = Set::open(set.key).unwrap();
        assert_eq!(opened.id, set.id);
        // SAFETY: the child only makes system calls before `_exit`.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let ok = set.hold(3).is_ok() && set.value(3) == Ok(1);
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(status, 0, "the child held the semaphore");
        assert_eq!(set.value(3), Ok(0), "undone when the child ended");
        set.hold(5).unwrap();
        let mut all = [0u16; MAX_MEMBERS];
        set.values(&mut all).unwrap();
        assert_eq!((all[3], all[5]), (0, 1));
        set.let_go(5).unwrap();
        assert_eq!(set.value(5), Ok(0));
        set.remove();
        assert_eq!(Set::open(set.key), Err(libc::ENOENT));
    }
}
