//! The layout of a group ledger: the shared-memory file (`/dev/shm/pinguard.group.NAME`) through
//! which every process of a group shares one pinned-memory budget. The library writes it; the
//! CLI's `pinguard top --group` reads it. All members of a group run on one host and one
//! architecture; the version, size and magic guard against anything else.

pub mod live;

pub const MAGIC: [u8; 8] = *b"PGGROUP\0";
/// 3 since the host reserve's shared reading and counts (`host_*`) joined the header and the
/// members; 4 since members are told alive by a semaphore each (`sem_key`, `ipc_ns`, `pid_ns`,
/// `serial`); 5 since the cgroup reserve's shared readings (`cgroups`) and each member's calls in
/// flight and cgroup (`ext`) follow the members, a version 4 ledger being the first `SIZE_V4`
/// bytes of it. The library refuses a ledger of another version (`check`): its members run on
/// their own budgets. Readers (`pinguard top`) read version 4 too (`read`), without the cgroup
/// figures.
pub const VERSION: u32 = 5;
pub const MAX_MEMBERS: usize = 256;
/// The most cgroups whose reserve the group keeps a shared reading of (members in more cgroups
/// than this keep readings of their own).
pub const MAX_CGROUPS: usize = 16;
pub const EXE_BYTES: usize = 32;
/// At most one look for dead members per this many milliseconds when the group is full.
pub const RESCAN_MS: u64 = 100;

/// The group's file name under `/dev/shm`, for a valid group name.
pub fn path(name: &str) -> String {
    format!("/dev/shm/pinguard.group.{name}")
}

/// Group names become file names: letters, digits, `.`, `_`, `-`, at most 64, not starting with a dot.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

#[repr(C)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_size: u32,
    pub total_size: u64,
    /// The budget, set by the member that created the ledger.
    pub budget: u64,
    pub created_unix_ms: u64,
    /// A process-shared, robust `pthread_mutex_t`; guards `used` and every member's `bytes`.
    pub mutex: libc::pthread_mutex_t,
    /// Pinned bytes of the whole group, reserved or live: the sum of the members' `bytes`.
    pub used: u64,
    pub peak: u64,
    /// `CLOCK_MONOTONIC` milliseconds before which a member that needs room does not look for dead
    /// members again (one look per `RESCAN_MS` for the whole group).
    pub rescan_after_ms: u64,
    /// Looks for dead members (each reads every member's `/proc` entry) since the ledger was
    /// created: when a process joins, and when a member needs room.
    pub join_scans: u64,
    pub room_scans: u64,
    /// The host reserve (`PINGUARD_HOST_RESERVE`) as the group applies it, under the lock: the
    /// largest reserve any member applies, in bytes (0: no member has one). Each member decides
    /// with its own.
    pub host_reserve: u64,
    /// `MemAvailable` at the group's latest reading of `/proc/meminfo`, in bytes, shared by every
    /// member with a reserve: a member reserves only while `used` stays at or below
    /// `host_settled + host_available - its reserve`.
    pub host_available: u64,
    /// The group's pinned bytes that the latest reading already reflects (`used` then, less the
    /// reading member's calls in flight).
    pub host_settled: u64,
    /// `CLOCK_MONOTONIC` milliseconds of the latest reading (0: none yet); members take it again
    /// when it is older than the library's refresh interval (100 ms).
    pub host_read_ms: u64,
    /// The lowest `MemAvailable` any member read (`u64::MAX`: none yet).
    pub host_lowest_available: u64,
    /// The group's bytes released since the latest reading: room again only once a reading
    /// shows it (a `munlock` of pages that stay resident gives the host nothing back).
    pub host_released: u64,
    /// The System V semaphore set with one semaphore per member slot (`live`): its key (0: none
    /// yet; the first member to join creates it), changed under the lock.
    pub sem_key: i32,
    /// Not 0: the ledger was removed (its last member left, or every member was found gone),
    /// set under the lock just before its name is unlinked. Nobody joins a closed ledger: a
    /// process that mapped it before the removal opens the group's name again.
    pub closed: u32,
    /// The IPC namespace the set lives in (the inode of its creator's `/proc/self/ns/ipc`): only
    /// members in that namespace can reach it.
    pub sem_ipc_ns: u64,
    /// Joins since the ledger was created: each member's `serial`.
    pub joins: u64,
    pub members: [Member; MAX_MEMBERS],
    /// Version 5 on: each member's figures that version 4 did not have, by slot.
    pub ext: [MemberExt; MAX_MEMBERS],
    /// The cgroup reserve's shared readings, one per limiting cgroup (`Cgroup`).
    pub cgroups: [Cgroup; MAX_CGROUPS],
}

/// A member's figures beyond version 4's `Member` (emptied with its slot).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemberExt {
    /// The member's `cgroups` entry plus one (0: none yet, or the table was full: its own
    /// reading then decides), set under the lock by its readings.
    pub cgroup: u32,
    pub _pad: u32,
    /// Bytes of its share whose calls have not returned yet: booked under the lock, taken off
    /// atomically when the call returns. A reading counts them as not in the figure it reads, so
    /// that members pinning at once each count the others' calls in flight.
    pub in_flight: u64,
    /// Pinning calls the cgroup reserve stopped; updated without the lock, like `host_reserve`.
    pub cgroup_reserve: u64,
}

/// The cgroup reserve (`PINGUARD_CGROUP_RESERVE`) as the group's members in one cgroup apply it:
/// the shared reading of the headroom of the level whose headroom is least (the one a pin would
/// exhaust first), keyed by that level's folder (device and inode), so that members in the same
/// cgroup share one floor and members in others (two containers of a pod) each have their own.
/// The fields as the header's `host_*` for the host reserve, counted over this cgroup's members.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Cgroup {
    /// The limiting level's folder (`st_dev`, `st_ino`); both 0: a free entry.
    pub dev: u64,
    pub ino: u64,
    /// The tightest limit on the path at the latest reading, for `pinguard top`.
    pub limit: u64,
    /// The largest reserve a member in this cgroup applies (0: none yet).
    pub reserve: u64,
    /// The headroom at the latest reading, the members' bytes it reflects, its time
    /// (`CLOCK_MONOTONIC` ms, 0: none yet), the lowest headroom any member read (`u64::MAX`: none),
    /// and the bytes released since (room only once a reading shows it).
    pub available: u64,
    pub settled: u64,
    pub read_ms: u64,
    pub lowest: u64,
    pub released: u64,
}
#[repr(C)]
pub struct Member {
    /// 0: a free slot.
    pub pid: u32,
    pub _pad: u32,
    /// The process's start time (field 22 of `/proc/PID/stat`): with the pid, tells a member that
    /// is gone from a new process that reused its pid.
    pub start_ticks: u64,
    pub bytes: u64,
    pub peak: u64,
    /// Updated without the lock (atomically); for `pinguard top` and the metrics.
    pub denied: u64,
    pub downgraded: u64,
    /// Pinning calls the host reserve stopped (refused, downgraded or, under `warn`, pinned
    /// anyway); updated without the lock, like `denied`.
    pub host_reserve: u64,
    pub exe: [u8; EXE_BYTES],
    /// The header's `joins` when this member joined: a slot emptied and taken again between a
    /// look for dead members and the burial is not mistaken for the one found dead.
    pub serial: u64,
    /// The member's IPC and PID namespaces (inodes of `/proc/PID/ns/ipc` and `.../pid`).
    pub ipc_ns: u64,
    pub pid_ns: u64,
    /// The set (`Header::sem_key` when it joined) in which the member holds its slot's semaphore
    /// (0: none; it is then told alive by its pid, from its own PID namespace only).
    pub sem_key: i32,
    pub _pad2: u32,
}

pub const SIZE: usize = std::mem::size_of::<Header>();
/// A version 4 ledger's size: everything before `ext`.
pub const SIZE_V4: usize = std::mem::offset_of!(Header, ext);

/// Checks a mapped file's header: the reason it cannot be used, if any.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 24 || bytes[..8] != MAGIC {
        return Err("is not a pinguard group ledger (bad magic)".into());
    }
    let version = u32::from_ne_bytes(bytes[8..12].try_into().unwrap());
    if version != VERSION {
        return Err(format!(
            "has version {version}, this pinguard uses {VERSION}"
        ));
    }
    if bytes.len() != SIZE {
        return Err(format!("is {} bytes, expected {SIZE}", bytes.len()));
    }
    let header_size = u32::from_ne_bytes(bytes[12..16].try_into().unwrap());
    let total = u64::from_ne_bytes(bytes[16..24].try_into().unwrap());
    if header_size as usize != SIZE || total as usize != SIZE {
        return Err("was written by a pinguard with another layout".into());
    }
    Ok(())
}

/// A ledger's header as a reader (`pinguard top`) sees it: version 5 as it is, version 4 with
/// no `ext` or `cgroups` (all zero: no cgroup figures), anything else refused with the reason.
pub fn read(bytes: &[u8]) -> Result<Box<Header>, String> {
    let version = (bytes.len() >= 12 && bytes[..8] == MAGIC)
        .then(|| u32::from_ne_bytes(bytes[8..12].try_into().unwrap()));
    let len = match version {
        Some(4) => SIZE_V4,
        _ => {
            check(bytes)?;
            SIZE
        }
    };
    if bytes.len() != len || u64::from_ne_bytes(bytes[16..24].try_into().unwrap()) as usize != len {
        return Err(format!(
            "is {} bytes, expected {len} for a version 4 ledger",
            bytes.len()
        ));
    }
    // SAFETY: an all-zero `Header` is valid (plain integers, bytes and a mutex that is never
    // used from this copy); `len` bytes fit it (`SIZE_V4 < SIZE`), and the copy is bytewise.
    unsafe {
        let mut h = Box::<Header>::new_zeroed();
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), h.as_mut_ptr().cast::<u8>(), len);
        Ok(h.assume_init())
    }
}

/// What `/proc` says of `pid` (its start time, read from its main thread's `stat`), for
/// `live::judge` in the CLI. The task path, not `/proc/PID/stat`: qemu-user answers a process's
/// reads of its own `/proc/PID/stat` with a made-up file (start time 0), so under emulation a
/// member would record a start time that every other member reads differently, and be reclaimed
/// as dead. The library reads the same file with raw system calls (no cancellation point, no
/// allocation) and parses it with `parse_start_ticks`.
pub fn proc_of(pid: u32) -> live::Proc {
    match std::fs::read(format!("/proc/{pid}/task/{pid}/stat")) {
        Ok(b) => parse_start_ticks(&b).map_or(live::Proc::Unknown, live::Proc::Started),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH) =>
        {
            live::Proc::Gone
        }
        Err(_) => live::Proc::Unknown,
    }
}

/// What member `m` says of its process, for `live::judge`.
pub fn seen(m: &Member) -> live::Seen {
    live::Seen {
        pid: m.pid,
        start_ticks: m.start_ticks,
        sem_key: m.sem_key,
        ipc_ns: m.ipc_ns,
        pid_ns: m.pid_ns,
    }
}

/// The start time (field 22) of a `/proc/PID/stat` line, or of its first part: the field ends
/// within the first few hundred bytes.
pub fn parse_start_ticks(stat: &[u8]) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = stat.get(close + 1..)?;
    let field = rest
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
        .nth(19)?;
    // A field cut short by the end of the buffer is a prefix of digits: it must be followed by
    // more text to be whole.
    let end = field.as_ptr() as usize - rest.as_ptr() as usize + field.len();
    if end >= rest.len() {
        return None;
    }
    let mut v: u64 = 0;
    for &b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(r: Result<Box<Header>, String>) -> String {
        r.err().expect("refused")
    }

    /// A ledger of `len` bytes with this version, as a member writes it.
    fn ledger(version: u32, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&version.to_ne_bytes());
        b[12..16].copy_from_slice(&(len as u32).to_ne_bytes());
        b[16..24].copy_from_slice(&(len as u64).to_ne_bytes());
        let used = std::mem::offset_of!(Header, used);
        b[used..used + 8].copy_from_slice(&7u64.to_ne_bytes());
        b
    }

    #[test]
    fn readers_take_versions_4_and_5_and_name_what_they_cannot() {
        const { assert!(SIZE_V4.is_multiple_of(8) && SIZE > SIZE_V4) };
        let h = read(&ledger(5, SIZE)).unwrap();
        assert_eq!((h.version, h.used), (5, 7));
        // Version 4: its figures, and no cgroup ones.
        let mut v4 = ledger(4, SIZE_V4);
        let m = std::mem::offset_of!(Header, members) + std::mem::offset_of!(Member, pid);
        v4[m..m + 4].copy_from_slice(&42u32.to_ne_bytes());
        let h = read(&v4).unwrap();
        assert_eq!((h.version, h.used, h.members[0].pid), (4, 7, 42));
        assert!(
            h.ext.iter().all(|e| e.cgroup == 0 && e.cgroup_reserve == 0)
                && h.cgroups.iter().all(|c| c.reserve == 0)
        );
        assert_eq!(
            check(&v4).unwrap_err(),
            "has version 4, this pinguard uses 5",
            "the library does not join it"
        );
        assert_eq!(
            why(read(&ledger(3, SIZE_V4))),
            "has version 3, this pinguard uses 5"
        );
        assert_eq!(
            why(read(&v4[..100])),
            format!("is 100 bytes, expected {SIZE_V4} for a version 4 ledger")
        );
        assert_eq!(
            why(read(&ledger(5, SIZE_V4))),
            format!("is {SIZE_V4} bytes, expected {SIZE}")
        );
    }

    #[test]
    fn start_ticks_are_field_22_counted_from_the_last_parenthesis() {
        let line = b"4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n";
        assert_eq!(parse_start_ticks(line), Some(987654));
        // Cut inside the field: not a start time.
        let cut = b"1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 98";
        assert_eq!(parse_start_ticks(cut), None);
        assert_eq!(parse_start_ticks(b"1 (x) S 1 1"), None);
        assert_eq!(parse_start_ticks(b"no paren"), None);
        assert_eq!(
            parse_start_ticks(
                b"1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99999999999999999999999 1"
            ),
            None
        );
    }
}
