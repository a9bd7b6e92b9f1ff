//! Group ledgers as readers see them (`top --group`, `run --group-budget`'s summary) and
//! `pinguard group list|rm`: a group whose members are all gone is removed with what it holds in
//! the IPC namespace (its System V semaphore set), so that nothing of it outlives it.

use pinguard_common::group::live::{self, Set};
use pinguard_common::group::{self as layout, Header, MAX_MEMBERS};
use pinguard_common::untrusted::{self, Links};
use std::os::unix::fs::MetadataExt;

/// A ledger read once: its header, and the file it was read from.
pub struct Ledger {
    pub header: Box<Header>,
    /// Device and inode: the file removed later must be this one.
    pub id: (u64, u64),
    pub uid: u32,
}

/// The ledger of group `name`: a regular file, never followed through a link or waited on, of a
/// ledger's size, that nobody but its owner may write (as the library requires to join it).
pub fn read(name: &str) -> Result<Ledger, String> {
    let path = layout::path(name);
    let (bytes, meta) = untrusted::read(
        path.as_ref(),
        Links::Refuse,
        layout::SIZE as u64,
        "group ledger",
    )
    .map_err(|r| match r.why.as_str() {
        "no such file or directory" => {
            format!("no group {name:?} on this host ({path} does not exist)")
        }
        _ => format!("{path}: {r}"),
    })?;
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{path}: writable by other users (mode {:04o}); not a ledger pinguard made",
            meta.mode() & 0o7777
        ));
    }
    let header = layout::read(&bytes).map_err(|e| format!("{path}: {e}"))?;
    Ok(Ledger {
        header,
        id: untrusted::identity(&meta),
        uid: meta.uid(),
    })
}

/// Whether member `i` of the ledger is gone, as the members judge each other.
pub fn gone(h: &Header, i: usize, here: live::Here) -> bool {
    let value = |key| Set::open(key).ok()?.value(i).ok();
    live::judge(&layout::seen(&h.members[i]), here, value, layout::proc_of) == live::Verdict::Gone
}

/// How many of the ledger's members still run (or cannot be told gone).
pub fn running(h: &Header) -> usize {
    let here = live::Here::read();
    (0..MAX_MEMBERS)
        .filter(|&i| h.members[i].pid != 0 && !gone(h, i, here))
        .count()
}

fn euid() -> u32 {
    // SAFETY: no arguments; it cannot fail.
    unsafe { libc::geteuid() }
}

/// Removes group `name` when none of its members runs: first its semaphore set (only a set this
/// user made as pinguard makes them, in this IPC namespace, that no process holds), then the
/// ledger, if the name still names the file read. What was removed, in words, or why not.
pub fn remove(name: &str) -> Result<String, String> {
    let l = read(name)?;
    let path = layout::path(name);
    if l.uid != euid() {
        return Err(format!(
            "{path} belongs to user {}, not to this user: not removed",
            l.uid
        ));
    }
    let n = running(&l.header);
    if n > 0 {
        return Err(format!(
            "group {name}: {} still running; not removed",
            crate::out::count(n as u64, "member", "members")
        ));
    }
    close(&path, &l).map_err(|e| format!("group {name}: {e}"))?;
    let set = remove_set(&l.header).map_err(|e| format!("group {name}: {e}"))?;
    if !untrusted::remove_if_same(path.as_ref(), l.id) {
        return Err(format!("{path} changed while it was read; not removed"));
    }
    Ok(match set {
        Some(key) => format!("removed group {name}: {path} and its semaphore set (key {key:#x})"),
        None => format!("removed group {name}: {path}"),
    })
}

/// The longest `close` waits for the ledger's lock, as a member waits (the library's bound).
const LOCK_WAIT_MS: u64 = 50;

/// Marks the ledger closed (`Header::closed`) under its lock, as its last member does when it
/// leaves, if no process joined it since `l` was read: a process that mapped it and joins later
/// sees the mark and makes the group anew instead of joining a file that is about to go.
fn close(path: &str, l: &Ledger) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("{path}: {e}; not removed"))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("{path}: {e}; not removed"))?;
    if untrusted::identity(&meta) != l.id || meta.len() != l.header.total_size {
        return Err(format!("{path} changed while it was read; not removed"));
    }
    if meta.len() != layout::SIZE as u64 {
        return Ok(()); // a version 4 ledger: its members know no mark
    }
    let len = layout::SIZE;
    // SAFETY: a fresh shared mapping of the file just opened, of its size (a version 5 ledger,
    // checked above and by `read`); the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "{path}: cannot be mapped ({}); not removed",
            std::io::Error::last_os_error()
        ));
    }
    let h = p as *mut Header;
    let r = close_mapped(h, &l.header);
    // SAFETY: unmaps the mapping made above; nothing refers to it any more.
    unsafe { libc::munmap(p, len) };
    r
}

/// `close` on the mapped ledger `h`, against its reading `was`.
fn close_mapped(h: *mut Header, was: &Header) -> Result<(), String> {
    // SAFETY: the place of the mutex in the mapping; no reference to the ledger is made yet.
    let m = unsafe { std::ptr::addr_of_mut!((*h).mutex) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(LOCK_WAIT_MS);
    loop {
        // SAFETY: the members initialised the mutex process-shared and robust before they
        // published the ledger; a trylock never waits.
        match unsafe { libc::pthread_mutex_trylock(m) } {
            0 => break,
            libc::EOWNERDEAD => {
                // SAFETY: this thread holds the mutex (EOWNERDEAD hands it over); the ledger is
                // going, so its figures need no repair beyond the mutex's.
                unsafe { libc::pthread_mutex_consistent(m) };
                break;
            }
            libc::EBUSY if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            e => {
                return Err(format!(
                    "its lock cannot be taken ({}); not removed",
                    std::io::Error::from_raw_os_error(e)
                ))
            }
        }
    }
    // SAFETY: under the ledger's lock, which every member takes to change it: this reference
    // is the only one while it is held.
    let hd = unsafe { &mut *h };
    let same = hd.joins == was.joins
        && hd
            .members
            .iter()
            .zip(was.members.iter())
            .all(|(a, b)| a.pid == b.pid && a.serial == b.serial);
    if same {
        hd.closed = 1;
    }
    // SAFETY: this thread holds the mutex (taken above).
    unsafe { libc::pthread_mutex_unlock(m) };
    if same {
        Ok(())
    } else {
        Err("a process joined it while it was read; not removed".into())
    }
}

/// Removes the ledger's semaphore set when it is there and held by nobody; its key, `None` when
/// it has none here.
fn remove_set(h: &Header) -> Result<Option<i32>, String> {
    let here = live::Here::read();
    if h.sem_key == 0 || h.sem_ipc_ns != here.ipc_ns {
        return Ok(None);
    }
    let set = match Set::open(h.sem_key) {
        Ok(s) => s,
        Err(libc::ENOENT) => return Ok(None),
        Err(e) => {
            return Err(format!(
            "its semaphore set (key {:#x}) is not one this user's pinguard made ({}); not removed",
            h.sem_key,
            std::io::Error::from_raw_os_error(e)
        ))
        }
    };
    let mut held = [0u16; MAX_MEMBERS];
    if set.values(&mut held).is_ok() && held.iter().any(|&v| v > 0) {
        return Err(format!(
            "its semaphore set (key {:#x}) is still held by a process; not removed",
            h.sem_key
        ));
    }
    set.remove();
    Ok(Some(h.sem_key))
}

/// The names of the groups on this host (`/dev/shm/pinguard.group.NAME`), sorted.
fn names() -> Vec<String> {
    let dir = layout::path("");
    let (dir, prefix) = dir.rsplit_once('/').unwrap_or(("/dev/shm", ""));
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_str()?.strip_prefix(prefix)?.to_string();
                    layout::valid_name(&n).then_some(n)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// How many group ledgers there are.
pub fn count() -> usize {
    names().len()
}

/// `pinguard group list`: one line per group. Always 0.
pub fn list() -> i32 {
    list_lines("")
}

/// `group list`'s lines, indented (`pinguard top`'s list).
pub fn list_indented() {
    list_lines("  ");
}

fn list_lines(indent: &str) -> i32 {
    for name in names() {
        match read(&name) {
            Ok(l) => {
                let h = &l.header;
                let members = h.members.iter().filter(|m| m.pid != 0).count();
                let n = running(h);
                let budget = if h.budget == u64::MAX {
                    "no budget".to_string()
                } else {
                    pinguard_common::units::format_bytes(h.budget)
                };
                let sem = if h.sem_key == 0 {
                    String::new()
                } else {
                    format!(", semaphore set {:#x}", h.sem_key)
                };
                println!(
                    "{indent}{name}: {} of {budget} pinned, {n} of {} running, user {}{sem}{}",
                    pinguard_common::units::format_bytes(h.used),
                    crate::out::count(members as u64, "member", "members"),
                    l.uid,
                    if n == 0 {
                        " (none running: `pinguard group rm` removes it)"
                    } else {
                        ""
                    }
                );
            }
            Err(e) => eprintln!("pinguard group: {e}"),
        }
    }
    0
}

/// `pinguard group rm NAME...`: 0 when every group was removed, 1 when one still runs or is not
/// this user's, 2 when one is not there or not a ledger.
pub fn rm(names: &[String]) -> i32 {
    let mut code = 0;
    for name in names {
        if !layout::valid_name(name) {
            eprintln!(
                "pinguard group: {name:?} is not a group name (letters, digits, '.', '_', '-')"
            );
            code = 2;
            continue;
        }
        match remove(name) {
            Ok(what) => println!("{what}"),
            Err(e) => {
                eprintln!("pinguard group: {e}");
                let missing = !std::path::Path::new(&layout::path(name)).exists();
                code = code.max(if missing { 2 } else { 1 });
            }
        }
    }
    code
}
