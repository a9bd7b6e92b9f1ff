//! `pinguard doctor`'s view of the node configuration file: which file the library would read in
//! this environment, whether it would trust it (the library's rule, `pinguard_common::node`), and
//! its settings, each with the line it is on.

use pinguard_common::node::{self, Entry, Verdict, MAX_BYTES};
use pinguard_common::vars;
use serde::Serialize;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

/// The file as the library would find it.
#[derive(Serialize, Default)]
pub struct NodeConfig {
    /// The file looked for; `None` when `PINGUARD_CONFIG` is empty (no file wanted).
    pub path: Option<String>,
    /// `in force`, `absent`, or why the library ignores it.
    pub state: String,
    pub in_force: bool,
    /// A line of the file that sets nothing (not `NAME=value`, not a pinguard variable).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    #[serde(skip)]
    pub entries: Vec<Entry>,
}

/// The file `PINGUARD_CONFIG` names (outside secure mode, which `doctor` never is), else the
/// default; `None`: named empty.
fn path() -> Option<String> {
    match std::env::var(vars::CONFIG.name) {
        Ok(p) if p.trim().is_empty() => None,
        Ok(p) if p.trim().starts_with('/') => Some(p.trim().to_string()),
        _ => Some(node::DEFAULT_PATH.to_string()),
    }
}

pub fn examine() -> NodeConfig {
    let Some(path) = path() else {
        return NodeConfig {
            state: Verdict::Off.describe(""),
            ..NodeConfig::default()
        };
    };
    let (verdict, text) = judge(&path);
    let (entries, problems) = if verdict.trusted() {
        node::entries(&path, &text)
    } else {
        Default::default()
    };
    NodeConfig {
        state: verdict.describe(&path),
        in_force: verdict.trusted(),
        path: Some(path),
        problems,
        entries,
    }
}

/// Opens and checks the file as the library does: no final link followed, never blocking, a
/// regular file of at most `MAX_BYTES`, root's or this user's and writable by nobody else, in a
/// folder of the same kind.
fn judge(path: &str) -> (Verdict, Vec<u8>) {
    let open = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path);
    let file = match open {
        Ok(f) => f,
        Err(e) => {
            return match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENOTDIR) => (Verdict::Absent, Vec::new()),
                Some(libc::ELOOP) => (Verdict::NotRegular, Vec::new()),
                other => (Verdict::Unreadable(other.unwrap_or(libc::EIO)), Vec::new()),
            }
        }
    };
    // SAFETY: geteuid cannot fail.
    let own = Some(unsafe { libc::geteuid() });
    let checked = file
        .metadata()
        .map_err(|e| Verdict::Unreadable(e.raw_os_error().unwrap_or(libc::EIO)))
        .and_then(|m| {
            if !m.file_type().is_file() {
                return Err(Verdict::NotRegular);
            }
            if m.len() > MAX_BYTES as u64 {
                return Err(Verdict::TooLarge(m.len()));
            }
            Verdict::check(m.uid(), m.mode(), false, own).map_or(Ok(()), Err)
        })
        .and_then(|()| {
            let dir = std::path::Path::new(path)
                .parent()
                .unwrap_or(std::path::Path::new("/"));
            let m = std::fs::metadata(dir)
                .map_err(|e| Verdict::Unreadable(e.raw_os_error().unwrap_or(libc::EIO)))?;
            Verdict::check(m.uid(), m.mode(), true, own).map_or(Ok(()), Err)
        });
    if let Err(v) = checked {
        return (v, Vec::new());
    }
    let mut text = Vec::new();
    match file.take(MAX_BYTES as u64 + 1).read_to_end(&mut text) {
        Ok(n) if n > MAX_BYTES => (Verdict::TooLarge(n as u64), Vec::new()),
        Ok(_) => (Verdict::Trusted, text),
        Err(e) => (
            Verdict::Unreadable(e.raw_os_error().unwrap_or(libc::EIO)),
            Vec::new(),
        ),
    }
}
