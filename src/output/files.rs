//! Where output goes: the report path template (made absolute at start-up, a pid put in where
//! it has none, `%p %e %h %t %n` expanded per write), the state file's path beside the report, and
//! atomic writes (a temporary file in the same folder, renamed).

use crate::runtime::config::DEFAULT_TEMPLATE;
use crate::runtime::kernel;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The template made absolute when pinguard started, so a later `chdir` does not move the report.
static TEMPLATE: OnceLock<(String, bool)> = OnceLock::new();

pub fn init_template(given: Option<&str>) {
    let (t, default) = match given {
        Some(t) => (with_pid(t), false),
        None => (DEFAULT_TEMPLATE.to_string(), true),
    };
    let abs = if t.starts_with('/') {
        t
    } else {
        match std::env::current_dir() {
            Ok(cwd) => format!("{}/{}", cwd.display(), t),
            Err(_) => t,
        }
    };
    let _ = TEMPLATE.set((abs, default));
}

/// Every process that inherits the template (fork and exec children) writes its own file: a
/// template without `%p` gets the pid before its `.json` or `.prom` extension (or at its end), as
/// LeakSanitizer does with `log_path`.
pub fn with_pid(t: &str) -> String {
    let mut rest = t;
    let mut has_pid = false;
    while let Some(i) = rest.find('%') {
        if let Some('p') = rest[i + 1..].chars().next() {
            has_pid = true
        }
        rest = &rest[(i + 2).min(rest.len())..];
    }
    if has_pid {
        return t.to_string();
    }
    // Before a report's `.json`, and before a metrics file's `.prom`, the only name node_exporter's
    // textfile collector reads.
    for ext in [".json", ".prom"] {
        if let Some(stem) = t.strip_suffix(ext) {
            return format!("{stem}.%p{ext}");
        }
    }
    format!("{t}.%p")
}

/// `text` as one safe path component: a host name or an executable's name is anyone's to choose
/// (`../x`, `.`, a newline), and must never move a report or a state out of its folder.
fn component(text: &str) -> String {
    let mut clean: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-+".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.starts_with('.') {
        // `.`, `..` and hidden names: a leading dot never reaches the file name.
        clean.replace_range(..1, "_");
    }
    if clean.is_empty() {
        "unknown".into()
    } else {
        clean
    }
}

fn exe_name() -> String {
    component(kernel::exe().rsplit('/').next().unwrap_or(""))
}

pub fn expand(template: &str) -> PathBuf {
    let mut out = String::new();
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('p') => out.push_str(&kernel::raw_pid().to_string()),
            Some('e') => out.push_str(&exe_name()),
            Some('h') => out.push_str(&component(&kernel::hostname())),
            Some('t') => out.push_str(&(crate::runtime::clock::start_ms() / 1000).to_string()),
            Some('n') => out.push_str(&kernel::pid_namespace().unwrap_or(0).to_string()),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    PathBuf::from(out)
}

/// Where this process keeps its state (`arena`): next to where its report goes, with the
/// report's fallback for the default template. `None` where no report may be written.
/// With `make`, the folder is made as for a report; without, nothing is touched.
pub fn state_path(make: bool) -> Option<PathBuf> {
    if kernel::secure_mode() {
        return None;
    }
    let (template, default) = TEMPLATE.get().cloned()?;
    let target = pinguard_report::state::path_for(&expand(&template));
    let dir = target
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if make {
        let _ = std::fs::create_dir_all(dir);
    }
    if default && !writable(dir) {
        return Some(std::env::temp_dir().join(target.file_name()?));
    }
    Some(target)
}

fn writable(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; access only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// Writes `bytes` to `path` as `write_atomic_with` does, for other users to read (`mode`,
/// whatever the umask): the metrics, which a collector running as another user reads, and which
/// hold nothing secret.
pub fn write_atomic_shared(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write_atomic_mode(path, mode, |w| w.write_all(bytes))
}

/// Writes what `fill` writes to `path` so that a reader sees the old file or the new one, never a
/// part: a private temporary file (mode 0600) in the same directory (never followed through a
/// symlink), renamed. Through a buffer of 64 KiB: a report is serialised
/// straight into its file, never whole in memory (a large one would need as much again).
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    write_atomic_mode(path, 0o600, fill)
}

fn write_atomic_mode(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report".into());
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        if mode != 0o600 {
            // The umask may have taken bits the file needs (a container's 077).
            f.set_permissions(
                <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(mode),
            )?;
        }
        let mut w = std::io::BufWriter::with_capacity(64 << 10, &mut f);
        fill(&mut w)?;
        w.flush()?;
        drop(w);
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The template and whether it is the default one (whose folder may be read-only: a fallback
/// to the temporary folder is allowed for it alone).
pub fn template() -> (String, bool) {
    TEMPLATE
        .get()
        .cloned()
        .unwrap_or((DEFAULT_TEMPLATE.to_string(), true))
}

#[cfg(test)]
mod tests {
    use super::{component, with_pid};

    #[test]
    fn every_expansion_is_one_safe_component() {
        assert_eq!(component("../escaped/x"), "_._escaped_x");
        assert_eq!(component(".."), "_.");
        assert_eq!(component("."), "_");
        assert_eq!(component(""), "unknown");
        assert_eq!(component("node-7.rack2"), "node-7.rack2");
        assert_eq!(component("a\nb c"), "a_b_c");
    }

    #[test]
    fn pid_is_added_when_missing() {
        assert_eq!(with_pid("/r/out.json"), "/r/out.%p.json");
        assert_eq!(with_pid("/r/out"), "/r/out.%p");
        assert_eq!(with_pid("/t/pinguard.prom"), "/t/pinguard.%p.prom");
        assert_eq!(with_pid("/r/%e-%p.json"), "/r/%e-%p.json");
        assert_eq!(with_pid("/r/100%%p.json"), "/r/100%%p.%p.json");
    }
}
