//! The layout of a group ledger: the shared-memory file (`/dev/shm/pinguard.group.NAME`) through
//! which every process of a group shares one pinned-memory budget. The library writes it; the
//! CLI's `pinguard top --group` reads it. All members of a group run on one host and one
//! architecture; the version, size and magic guard against anything else.

pub const MAGIC: [u8; 8] = *b"PGGROUP\0";
pub const VERSION: u32 = 2;
pub const MAX_MEMBERS: usize = 256;
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
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
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
    pub members: [Member; MAX_MEMBERS],
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
    pub exe: [u8; EXE_BYTES],
}

pub const SIZE: usize = std::mem::size_of::<Header>();

/// Checks a mapped file's header: the reason it cannot be used, if any.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() != SIZE {
        return Err(format!("is {} bytes, expected {SIZE}", bytes.len()));
    }
    if bytes[..8] != MAGIC {
        return Err("is not a pinguard group ledger (bad magic)".into());
    }
    let version = u32::from_ne_bytes(bytes[8..12].try_into().unwrap());
    if version != VERSION {
        return Err(format!("has version {version}, this pinguard uses {VERSION}"));
    }
    let header_size = u32::from_ne_bytes(bytes[12..16].try_into().unwrap());
    let total = u64::from_ne_bytes(bytes[16..24].try_into().unwrap());
    if header_size as usize != SIZE || total as usize != SIZE {
        return Err("was written by a pinguard with another layout".into());
    }
    Ok(())
}

/// Reads the process's start time from its main thread's `stat`; `None` when it is gone. The
/// task path, not `/proc/PID/stat`: qemu-user answers a process's reads of its own
/// `/proc/PID/stat` with a made-up file (start time 0), so under emulation a member would record
/// a start time that every other member reads differently, and be reclaimed as dead.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}
