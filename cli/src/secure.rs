//! Whether a program will run in secure mode (`AT_SECURE`): it gains privileges at `exec`, through
//! its set-user-ID or set-group-ID bit or its file capabilities, and the loader then ignores
//! `LD_PRELOAD` in it (and removes it for its children), so `pinguard run` cannot watch it. Judged
//! from the file as the kernel would for the user `run` runs as: a bit that gains nothing (the
//! file is the caller's own, the filesystem is mounted `nosuid`) or capabilities the caller holds
//! already (root's) do not make a program secure.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Why the program at `path` runs in secure mode when this process starts it, or `None`. A script
/// (`#!`) is not judged: the kernel ignores both bits and capabilities on one.
pub fn reason(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    // Under no_new_privs (inherited by the command) exec grants neither ids nor capabilities.
    if !meta.is_file() || is_script(path) || field(&status, "NoNewPrivs:") == Some(1) {
        return None;
    }
    let shown = path.display();
    if !nosuid(path) {
        let mode = meta.mode();
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        if mode & libc::S_ISUID != 0 && meta.uid() != uid {
            return Some(secure(format!(
                "{shown} is set-user-ID (it runs as uid {} for uid {uid})",
                meta.uid()
            )));
        }
        // Without group execute permission the bit means mandatory locking, not set-group-ID.
        if mode & libc::S_ISGID != 0 && mode & libc::S_IXGRP != 0 && meta.gid() != gid {
            return Some(secure(format!(
                "{shown} is set-group-ID (it runs as gid {} for gid {gid})",
                meta.gid()
            )));
        }
    }
    let gained = file_capabilities(path)? & bounding_not_held(&status);
    (gained != 0).then(|| {
        secure(format!("{shown} has file capabilities (security.capability) that this user does not hold (mask {gained:#x})"))
    })
}

fn secure(what: String) -> String {
    format!("{what}: the loader ignores LD_PRELOAD in a program that gains privileges at exec (secure mode), so pinguard cannot watch it")
}

fn is_script(path: &Path) -> bool {
    let mut head = [0u8; 2];
    // Opened as every reader opens a file (a FIFO named as the command is not waited on).
    pinguard_common::untrusted::open(path, pinguard_common::untrusted::Links::Follow)
        .is_ok_and(|(mut f, _)| std::io::Read::read_exact(&mut f, &mut head).is_ok())
        && head == *b"#!"
}

/// Whether the filesystem holding `path` ignores set-user-ID and set-group-ID bits.
fn nosuid(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: an all-zero statvfs is a valid value of the plain C struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `s` a statvfs the call may fill.
    unsafe { libc::statvfs(c.as_ptr(), &mut s) == 0 && s.f_flag & libc::ST_NOSUID != 0 }
}

/// The permitted capabilities of the file's `security.capability` attribute (`vfs_cap_data`:
/// a magic word, then one or two pairs of permitted and inheritable words), `None` without one.
fn file_capabilities(path: &Path) -> Option<u64> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut buf = [0u8; 32];
    // SAFETY: `c` and the attribute name are NUL-terminated; `buf` is writable for its length.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    let word = |i: usize| {
        buf.get(i * 4..i * 4 + 4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64)
    };
    match n {
        n if n >= 20 => Some(word(1) | word(3) << 32), // revision 2 or 3
        n if n >= 12 => Some(word(1)),                 // revision 1: 32 capabilities
        _ => None,
    }
}

/// The capabilities exec could give this process's child that it does not hold: the bounding set
/// less the permitted one (`/proc/self/status`). All of them when that cannot be read.
fn bounding_not_held(status: &str) -> u64 {
    match (field(status, "CapBnd:"), field(status, "CapPrm:")) {
        (Some(bnd), Some(prm)) => bnd & !prm,
        _ => u64::MAX,
    }
}

/// A hexadecimal field of `/proc/self/status`.
fn field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}
