//! The node configuration file: the registry's variables as `NAME=value` lines, for the processes
//! the environment cannot or must not configure (`/etc/ld.so.preload` gives none, and a
//! secure-mode process ignores it). Shared by the library, which reads the file once at start
//! (`runtime::node`), and `pinguard doctor`, which shows it: one syntax, one trust rule, one set
//! of messages.

/// Where the file is looked for, unless `PINGUARD_CONFIG` names another outside secure mode.
pub const DEFAULT_PATH: &str = "/etc/pinguard/pinguard.conf";

/// The largest file read: a few dozen settings fit many times over, and a larger one is a mistake
/// (or a trap), not a configuration.
pub const MAX_BYTES: usize = 64 * 1024;

/// What became of the file at start: read and trusted, or why not. `Copy` and without heap: the
/// library decides it before it may allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No file. First: the library's static holding a verdict is all zeros until read (`.bss`).
    Absent,
    /// Read; its settings are in force.
    Trusted,
    /// `PINGUARD_CONFIG` is empty.
    Off,
    /// The last component is a symbolic link, a FIFO, a directory, ...
    NotRegular,
    /// Larger than `MAX_BYTES`.
    TooLarge(u64),
    /// The file's owner, who is neither root nor (outside secure mode) the process's user.
    FileOwner(u32),
    /// The file is writable by its group or by others: its mode.
    FileWritable(u32),
    /// The folder's owner, as for the file.
    FolderOwner(u32),
    /// The folder is writable by its group or by others: its mode.
    FolderWritable(u32),
    /// Opening or reading failed with this errno.
    Unreadable(i32),
}

impl Verdict {
    /// Whether the file's settings are in force.
    pub fn trusted(self) -> bool {
        self == Verdict::Trusted
    }

    /// The file's or its folder's owner and mode checked: root's (or, outside secure mode, the
    /// process's own user's, `own`), and writable by nobody else.
    pub fn check(owner: u32, mode: u32, folder: bool, own: Option<u32>) -> Option<Verdict> {
        if owner != 0 && Some(owner) != own {
            return Some(if folder {
                Verdict::FolderOwner(owner)
            } else {
                Verdict::FileOwner(owner)
            });
        }
        let mode = mode & 0o7777;
        (mode & 0o022 != 0).then_some(if folder {
            Verdict::FolderWritable(mode)
        } else {
            Verdict::FileWritable(mode)
        })
    }

    /// Why the file at `path` is not in force, as one line (`None`: it is, or there is none).
    pub fn problem(self, path: &str) -> Option<String> {
        let why = match self {
            Verdict::Trusted | Verdict::Absent | Verdict::Off => return None,
            Verdict::NotRegular => "is not a regular file (a link is never followed)".to_string(),
            Verdict::TooLarge(n) => format!("is {n} bytes, more than the {MAX_BYTES} read"),
            Verdict::FileOwner(uid) => format!("is owned by uid {uid}, not root"),
            Verdict::FileWritable(m) => {
                format!("is writable by others than its owner (mode {m:o})")
            }
            Verdict::FolderOwner(uid) => format!("is in a folder owned by uid {uid}, not root"),
            Verdict::FolderWritable(m) => {
                format!("is in a folder writable by others than its owner (mode {m:o})")
            }
            Verdict::Unreadable(e) => {
                format!("cannot be read: {}", std::io::Error::from_raw_os_error(e))
            }
        };
        Some(format!(
            "node configuration {path} {why}; ignored, its settings are not used"
        ))
    }

    /// The file's state for people: `in force`, `absent`, or why it is ignored.
    pub fn describe(self, path: &str) -> String {
        match self {
            Verdict::Trusted => "in force".into(),
            Verdict::Absent => "absent".into(),
            Verdict::Off => "none (PINGUARD_CONFIG is empty)".into(),
            other => other.problem(path).unwrap_or_default(),
        }
    }
}

/// The lines that say something, numbered from 1: blank lines and `#` comments left out.
fn lines(text: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    text.split(|&c| c == b'\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l.strip_suffix(b"\r").unwrap_or(l).trim_ascii()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with(b"#"))
}

/// A line's name and value, both trimmed; `None`: no `=`.
fn split(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = line.iter().position(|&c| c == b'=')?;
    Some((line[..at].trim_ascii(), line[at + 1..].trim_ascii()))
}

/// The value the file gives `name` (the last line setting it), without allocating: the library's
/// switches are read before it may allocate (`lifecycle::hooks_enabled`).
pub fn raw<'a>(text: &'a [u8], name: &str) -> Option<&'a [u8]> {
    lines(text)
        .filter_map(|(_, l)| split(l))
        .filter(|(n, _)| *n == name.as_bytes())
        .map(|(_, v)| v)
        .last()
}

/// One setting of the file: its line, name and value (`None`: not UTF-8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub line: usize,
    pub name: String,
    pub value: Option<String>,
}

/// The file's settings in order, and one line per line that sets nothing it may (each prefixed
/// with the path and line, as every message about the file is). A name that is not pinguard's
/// but looks like it is the configuration's to name (`did you mean`), as in the environment.
pub fn entries(path: &str, text: &[u8]) -> (Vec<Entry>, Vec<String>) {
    let (mut set, mut bad) = (Vec::new(), Vec::new());
    for (line, l) in lines(text) {
        let shown = String::from_utf8_lossy(l);
        let Some((name, value)) = split(l) else {
            bad.push(format!(
                "{path}:{line}: {shown:?} is not NAME=value; ignored"
            ));
            continue;
        };
        let name = String::from_utf8_lossy(name).into_owned();
        if !name.starts_with("PINGUARD_") {
            bad.push(format!(
                "{path}:{line}: {:?} is not a pinguard variable; ignored",
                name
            ));
        } else if name == crate::vars::CONFIG.name {
            bad.push(format!(
                "{path}:{line}: {name} is read from the environment only (it names this file); ignored"
            ));
        } else {
            set.push(Entry {
                line,
                name,
                value: std::str::from_utf8(value).ok().map(str::to_string),
            });
        }
    }
    (set, bad)
}

/// Where a value in force came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Environment,
    /// The node configuration file, at this line.
    File(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_comments_and_the_last_value() {
        let text = b"# node\n\n PINGUARD_BUDGET = 1Gi \r\nPINGUARD_HOOKS=cuda\nnonsense\nPATH=/x\nPINGUARD_CONFIG=/y\nPINGUARD_HOOKS=mlock # not a comment\n";
        assert_eq!(raw(text, "PINGUARD_BUDGET"), Some(&b"1Gi"[..]));
        assert_eq!(
            raw(text, "PINGUARD_HOOKS"),
            Some(&b"mlock # not a comment"[..])
        );
        assert_eq!(raw(text, "PINGUARD_POLICY"), None);
        let (set, bad) = entries("/n.conf", text);
        assert_eq!(
            set.iter()
                .map(|e| (e.line, e.name.as_str()))
                .collect::<Vec<_>>(),
            vec![
                (3, "PINGUARD_BUDGET"),
                (4, "PINGUARD_HOOKS"),
                (8, "PINGUARD_HOOKS")
            ]
        );
        assert_eq!(set[0].value.as_deref(), Some("1Gi"));
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(bad[0].starts_with("/n.conf:5: \"nonsense\" is not NAME=value"));
        assert!(bad[1].starts_with("/n.conf:6: \"PATH\" is not a pinguard variable"));
        assert!(bad[2].starts_with("/n.conf:7: PINGUARD_CONFIG is read from the environment"));
        assert!(bad.iter().all(|l| !l.contains('\n')));
    }

    #[test]
    fn only_root_or_the_own_user_and_nobody_else_writing() {
        assert_eq!(Verdict::check(0, 0o100644, false, None), None);
        assert_eq!(Verdict::check(1000, 0o100600, false, Some(1000)), None);
        assert_eq!(
            Verdict::check(1000, 0o100644, false, None),
            Some(Verdict::FileOwner(1000))
        );
        assert_eq!(
            Verdict::check(0, 0o100666, false, None),
            Some(Verdict::FileWritable(0o666))
        );
        assert_eq!(
            Verdict::check(0, 0o41777, true, None),
            Some(Verdict::FolderWritable(0o1777))
        );
        let line = Verdict::FileOwner(7).problem(DEFAULT_PATH).unwrap();
        assert_eq!(line, "node configuration /etc/pinguard/pinguard.conf is owned by uid 7, not root; ignored, its settings are not used");
        assert_eq!(Verdict::Absent.problem(DEFAULT_PATH), None);
    }
}
