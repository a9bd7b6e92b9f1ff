//! Opening files that someone else may have put where a reader looks (a shared report folder, a
//! metrics folder, `/dev/shm`): the one way the CLI and this crate's readers open a file to read.
//! Nothing here waits (`O_NONBLOCK`: a FIFO answers at once, and is then refused), follows a link
//! it was not told to (`O_NOFOLLOW`), or reads anything but a regular file within a bound for
//! its kind, judged with `fstat` on the descriptor opened (no name is looked up twice).
//! `docs/cli.md`, "Reading folders others write to".

use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The most bytes read of a report, a state file or a run record (a state file grows in pieces of
/// at most 64 MiB; a report of hundreds of thousands of callsites stays well under this).
pub const REPORT_MAX: u64 = 1 << 30;
/// The most bytes read of a metrics file (a few kilobytes per process as pinguard writes them).
pub const METRICS_MAX: u64 = 16 << 20;

/// Whether a link at the path's last component is followed: only for names the user typed or
/// the system's own files (a library's `.build-id` debug file is a link by design).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Links {
    Refuse,
    Follow,
}

/// A file that was not read, and why, as one line's tail (`PATH: {this}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub why: String,
    /// The file is there but is not one to read (a link, a FIFO, a device, too large): a folder
    /// scan skips it; an error opening it (missing, permission) is not this.
    pub not_a_file: bool,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

fn refused(why: String) -> Refused {
    Refused {
        why,
        not_a_file: true,
    }
}

/// What kind of file this is, in words, when it is not a regular file.
fn kind(m: &Metadata) -> Option<&'static str> {
    let t = m.file_type();
    Some(if t.is_file() {
        return None;
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    })
}

/// Opens `path` for reading without waiting and, under `Links::Refuse`, without following a link
/// at its last component; a regular file, or the reason it is not read.
pub fn open(path: &Path, links: Links) -> Result<(File, Metadata), Refused> {
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) if links == Links::Refuse => {
                refused("a symbolic link; not followed".into())
            }
            Some(libc::ELOOP) => refused("a loop of symbolic links".into()),
            Some(libc::ENXIO) => refused("a socket or a device with nothing behind it".into()),
            Some(libc::ENOENT) => Refused {
                why: "no such file or directory".into(),
                not_a_file: false,
            },
            Some(libc::EACCES | libc::EPERM) => Refused {
                why: "permission denied".into(),
                not_a_file: false,
            },
            _ => Refused {
                why: e.to_string(),
                not_a_file: false,
            },
        })?;
    let meta = file.metadata().map_err(|e| Refused {
        why: e.to_string(),
        not_a_file: false,
    })?;
    if let Some(k) = kind(&meta) {
        return Err(refused(format!("{k}, not a regular file; not read")));
    }
    Ok((file, meta))
}

/// Checks an opened file's size against `max` (`what`: the kind of file, for the line).
pub fn within(meta: &Metadata, max: u64, what: &str) -> Result<(), Refused> {
    if meta.len() > max {
        return Err(refused(format!(
            "{} bytes, more than a {what} may be ({max} bytes); not read",
            meta.len()
        )));
    }
    Ok(())
}

/// The whole of a regular file of at most `max` bytes (`what` names its kind), with its
/// metadata; a file that grows past `max` while it is read is refused too.
pub fn read(
    path: &Path,
    links: Links,
    max: u64,
    what: &str,
) -> Result<(Vec<u8>, Metadata), Refused> {
    let (file, meta) = open(path, links)?;
    within(&meta, max, what)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Refused {
            why: e.to_string(),
            not_a_file: false,
        })?;
    if bytes.len() as u64 > max {
        return Err(refused(format!(
            "grew past {max} bytes while read (a {what} is at most that); not read"
        )));
    }
    Ok((bytes, meta))
}

/// The file's identity (device, inode): a name removed later must still name this file.
pub fn identity(meta: &Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// Removes `path` only if it still names the file `id` and is not followed through a link: a
/// name may have been given to another file since it was read.
pub fn remove_if_same(path: &Path, id: (u64, u64)) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| identity(&m) == id)
        && std::fs::remove_file(path).is_ok()
}

/// A name no other process can guess: 16 random hex digits (the kernel's random bytes, never
/// waited for; the clock, pid and a counter where there are none).
pub fn unpredictable() -> String {
    let mut b = [0u8; 8];
    // The system call, not glibc's `getrandom` (2.25): the CLI needs at most glibc 2.17.
    // SAFETY: `b` is valid for its 8 bytes; GRND_NONBLOCK: it never waits.
    let got = unsafe {
        libc::syscall(
            libc::SYS_getrandom,
            b.as_mut_ptr(),
            b.len(),
            libc::GRND_NONBLOCK,
        )
    } == b.len() as libc::c_long;
    let mut v = u64::from_ne_bytes(b);
    if !got {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        v = t.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ u64::from(std::process::id()).rotate_left(32)
            ^ N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    format!("{v:016x}")
}

/// Creates a new file `PREFIX<random>SUFFIX` in `dir`, exclusively and never through a link
/// (mode 0600): a name another user made first is never written; returns it and its path.
pub fn create_new(
    dir: &Path,
    prefix: &str,
    suffix: &str,
) -> std::io::Result<(File, std::path::PathBuf)> {
    let mut last = std::io::Error::from_raw_os_error(libc::EEXIST);
    for _ in 0..8 {
        let path = dir.join(format!("{prefix}{}{suffix}", unpredictable()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("pg-untrusted-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn only_a_regular_file_within_its_bound_is_read() {
        let d = dir("read");
        let ok = d.join("ok");
        std::fs::write(&ok, b"hello").unwrap();
        assert_eq!(read(&ok, Links::Refuse, 5, "test").unwrap().0, b"hello");
        let big = read(&ok, Links::Refuse, 4, "test file").unwrap_err();
        assert!(
            big.not_a_file && big.why.contains("more than a test file may be (4 bytes)"),
            "{big}"
        );
        std::os::unix::fs::symlink(&ok, d.join("link")).unwrap();
        let link = read(&d.join("link"), Links::Refuse, 5, "t").unwrap_err();
        assert_eq!(link.why, "a symbolic link; not followed");
        assert_eq!(
            read(&d.join("link"), Links::Follow, 5, "t").unwrap().0,
            b"hello"
        );
        let dev = read(Path::new("/dev/zero"), Links::Follow, 5, "t").unwrap_err();
        assert_eq!(dev.why, "a character device, not a regular file; not read");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening a FIFO nobody writes to would wait for ever without O_NONBLOCK.
        let f = read(&fifo, Links::Refuse, 5, "t").unwrap_err();
        assert_eq!(f.why, "a FIFO, not a regular file; not read");
        let missing = read(&d.join("none"), Links::Refuse, 5, "t").unwrap_err();
        assert!(!missing.not_a_file);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn new_names_are_unguessable_and_never_reused() {
        let d = dir("create");
        let (a, b) = (unpredictable(), unpredictable());
        assert!(a != b && a.len() == 16);
        let (_, p) = create_new(&d, ".x.", ".tmp").unwrap();
        let name = p.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with(".x.") && name.ends_with(".tmp") && name.len() == 3 + 16 + 4);
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&d);
    }
}
