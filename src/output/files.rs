//! Where output goes: the report path template (made absolute at start-up, a pid put in where
//! it has none, `%p %e %h %t %n` expanded per write, each expansion one safe path component),
//! the names a process writes under (its own alone: a name another process's file holds is never
//! used, replaced or removed, and another is tried), the state file's path beside the report,
//! and atomic writes (a temporary file in the same folder, renamed).

use crate::runtime::config::DEFAULT_TEMPLATE;
use crate::runtime::kernel;
use crate::runtime::lock::{Mutex, MutexGuard};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The template made absolute when pinguard started, so a later `chdir` does not move the report.
static TEMPLATE: OnceLock<(String, bool)> = OnceLock::new();

pub fn init_template(given: Option<&str>) {
    let (t, default) = match given {
        Some(t) => (with_pid(&in_directory(t)), false),
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

/// A template that names an existing directory means a file in it with the default name, not
/// `DIR.PID` beside it (which `pinguard report DIR` would not read).
fn in_directory(t: &str) -> String {
    if !t.contains('%') && Path::new(t).is_dir() {
        return format!("{t}/{DEFAULT_TEMPLATE}");
    }
    t.to_string()
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

/// Names a file tries before pinguard gives it up: the template's, then unpredictable ones.
pub const ATTEMPTS: u32 = 8;

/// Name attempt `n` for a file whose template gives `base`: `base` itself, then `base` with an
/// unpredictable word before its extension (`.json`, `.prom`) or at its end. Where a name is
/// taken (another container's pid 1, a killed process's record, a file another user planted in
/// a shared folder), the next is one nobody could have planted.
pub fn attempt(base: &Path, n: u32) -> PathBuf {
    if n == 0 {
        return base.to_path_buf();
    }
    let word = format!(".{:016x}", unpredictable());
    let s = base.to_string_lossy();
    for ext in [".json", ".prom"] {
        if let Some(stem) = s.strip_suffix(ext) {
            return format!("{stem}{word}{ext}").into();
        }
    }
    format!("{s}{word}").into()
}

fn unpredictable() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is writable for its length; the kernel writes at most that.
    let got = unsafe {
        libc::syscall(
            libc::SYS_getrandom,
            b.as_mut_ptr(),
            b.len(),
            libc::GRND_NONBLOCK,
        )
    };
    if got == b.len() as i64 {
        return u64::from_ne_bytes(b);
    }
    // No entropy yet (early boot): still a name no earlier attempt of this process's had.
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut x = crate::runtime::clock::unix_ms()
        ^ (kernel::raw_pid() as u64) << 32
        ^ SEQ
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 31)
}

/// The names this process writes under, once it has written: its report's path (its state's is
/// `path_for` of it) and the files it put there, which alone it may replace or remove. Taken
/// under the report lock or the arena's lock only, which a fork holds both of.
struct Names {
    pid: i32,
    report: Option<PathBuf>,
    /// (device, inode) of the report this process renamed into place last.
    report_id: Option<(u64, u64)>,
    /// (device, inode) of the state file this process made beside it.
    state_id: Option<(u64, u64)>,
}

static NAMES: Mutex<Names> = Mutex::new(Names {
    pid: 0,
    report: None,
    report_id: None,
    state_id: None,
});

/// This process's names; a fork child's start empty (its files are its own, with its pid).
fn names() -> MutexGuard<'static, Names> {
    let mut n = NAMES.lock();
    let pid = kernel::raw_pid();
    if n.pid != pid {
        *n = Names {
            pid,
            report: None,
            report_id: None,
            state_id: None,
        };
    }
    n
}

/// The template expanded: where attempt 0 of the report goes. The default falls back to the
/// temporary folder where the working directory is not writable.
fn base() -> Option<PathBuf> {
    let (template, default) = TEMPLATE.get().cloned()?;
    let target = expand(&template);
    let dir = parent(&target);
    if default && !writable(dir) && !kernel::secure_mode() {
        return Some(std::env::temp_dir().join(target.file_name()?));
    }
    Some(target)
}

/// Why the last report went to the temporary folder instead of where it was asked (`None`: it
/// went where asked), for the exit line.
static FELL_BACK: Mutex<Option<String>> = Mutex::new(None);

/// Where the last report was asked to go and why it could not, when it went to the temporary
/// folder instead.
pub fn fell_back() -> Option<String> {
    FELL_BACK.lock().clone()
}

fn parent(p: &Path) -> &Path {
    p.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Makes the template's missing folders, only those it names literally: a folder whose name an
/// expansion made (`%e`, an executable's name anyone chooses; `%h`) is never made, nor anything
/// in secure mode, where a template's folder must already exist.
pub fn make_dirs(template: &str) {
    if kernel::secure_mode() {
        return;
    }
    let dir = parent(Path::new(template));
    let literal: PathBuf = dir
        .components()
        .take_while(|c| !c.as_os_str().as_encoded_bytes().contains(&b'%'))
        .collect();
    if !literal.as_os_str().is_empty() {
        let _ = std::fs::create_dir_all(literal);
    }
}

/// Where this process's report goes: where it went last, else the template's name.
pub fn report_path() -> Option<PathBuf> {
    names().report.clone().or_else(base)
}

/// Where this process keeps its state (`arena`), attempt `n`: beside its report (attempt 0: the
/// report's name; later ones unpredictable). `None` where no report may be written. With `make`,
/// the template's literal folders are made; without, nothing is touched.
pub fn state_path(n: u32, make: bool) -> Option<PathBuf> {
    if kernel::secure_mode() {
        return None;
    }
    let report = match (n, names().report.clone()) {
        (0, Some(r)) => r,
        _ => attempt(&base()?, n),
    };
    if make {
        make_dirs(&template().0);
    }
    Some(pinguard_common::state::path_for(&report))
}

/// The report's path for a state's (`path_for` undone).
fn report_for(state: &Path) -> PathBuf {
    let s = state.to_string_lossy();
    let stem = s.strip_suffix(pinguard_common::state::SUFFIX).unwrap_or(&s);
    if template().0.ends_with(".json") {
        format!("{stem}.json").into()
    } else {
        stem.into()
    }
}

/// The arena made its state file `id` at `state`: the report goes beside it from now on, unless
/// a report there is another's (then `false`, and the arena tries another name: a state beside
/// another's report would hide it from `pinguard report`, which reads a folder's state in place
/// of the report beside it).
pub fn state_taken(state: &Path, id: (u64, u64)) -> bool {
    let report = report_for(state);
    let mut names = names();
    let there = lstat_id(&report);
    if there.is_some() && there != names.report_id {
        return false;
    }
    if let Some(old) = names.report.take().filter(|r| *r != report) {
        // This process's snapshot under a name its state could not share: read twice otherwise.
        if let Some(id) = names.report_id.take() {
            unlink_if_same(&old, id);
        }
    }
    names.report = Some(report);
    names.state_id = Some(id);
    true
}

fn lstat_id(p: &Path) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
    crate::runtime::sys::path_id(&c).map(|id| (id.dev, id.ino))
}

fn unlink_if_same(p: &Path, id: (u64, u64)) {
    if lstat_id(p) == Some(id) {
        let _ = std::fs::remove_file(p);
    }
}

fn writable(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; access only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// Writes the report to this process's name: the one it has written under (if the file there
/// is still the one it put there), else the first attempt that is free beside a free (or its
/// own) state name. Never over a file this process did not put there. Returns where it went.
/// Under the report lock.
pub fn write_report(
    fill: impl Fn(&mut dyn Write) -> std::io::Result<()>,
) -> Result<PathBuf, String> {
    let (template, default) = template();
    let Some(mut base) = names().report.clone().or_else(base) else {
        return Err("no report template".into());
    };
    make_dirs(&template);
    let tmp = match write_temp(&base, 0o600, &fill) {
        Ok(t) => t,
        // Where asked cannot take it (a read-only working directory in a container, a folder
        // of another user's): the temporary folder, and the exit line says so. Never in secure
        // mode, where the environment (TMPDIR) decides nothing.
        Err(e)
            if !kernel::secure_mode()
                && (default || e.kind() != std::io::ErrorKind::AlreadyExists) =>
        {
            let fallback = std::env::temp_dir().join(base.file_name().unwrap_or_default());
            match write_temp(&fallback, 0o600, &fill) {
                Ok(t) => {
                    *FELL_BACK.lock() = Some(format!("{}: {e}", base.display()));
                    base = fallback;
                    t
                }
                Err(e2) => {
                    let (b, f) = (base.display(), fallback.display());
                    return Err(format!("{b}: {e}; {f}: {e2}"));
                }
            }
        }
        Err(e) => return Err(format!("{}: {e}", base.display())),
    };
    let placed = place_report(&base, &tmp);
    if placed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    placed.map_err(|e| format!("{}: {e}", base.display()))
}

/// Renames the written report `tmp` to the first name of this process's that takes it.
fn place_report(base: &Path, tmp: &Path) -> std::io::Result<PathBuf> {
    let mut last = std::io::Error::from_raw_os_error(libc::EEXIST);
    for n in 0..ATTEMPTS {
        let mut names = names();
        let (target, own) = match (&names.report, n) {
            (Some(r), 0) => (r.clone(), names.report_id),
            _ => (attempt(base, n), None),
        };
        let state = pinguard_common::state::path_for(&target);
        let state_there = lstat_id(&state);
        if state_there.is_some() && state_there != names.state_id {
            continue; // another process's state: the name is its report's
        }
        match place(tmp, &target, own) {
            Ok(id) => {
                let moved = names
                    .report
                    .replace(target.clone())
                    .is_some_and(|r| r != target);
                names.report_id = Some(id);
                let state_follows = moved && names.state_id.is_some() && state_there.is_none();
                drop(names); // the arena's lock is never taken under this one
                if state_follows {
                    crate::accounting::arena::move_to(&state);
                }
                return Ok(target);
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                if names.report.as_ref() == Some(&target) {
                    names.report_id = None; // replaced or planted: no longer this process's
                }
                last = e;
            }
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// Puts `tmp` at `target`: over the file `own` (this process's, if the path still names it),
/// else only where nothing is (`EEXIST` where something is). Returns the file's (device, inode).
fn place(tmp: &Path, target: &Path, own: Option<(u64, u64)>) -> std::io::Result<(u64, u64)> {
    let id = lstat_id(tmp).ok_or_else(std::io::Error::last_os_error)?;
    if own.is_some() && lstat_id(target) == own {
        std::fs::rename(tmp, target)?;
    } else {
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes());
        let (from, to) = (c(tmp)?, c(target)?);
        crate::runtime::sys::rename_noreplace(&from, &to)
            .map_err(std::io::Error::from_raw_os_error)?;
    }
    Ok(id)
}

/// Writes what `fill` writes to `path` (mode `mode`, whatever the umask) as `write_atomic_with`
/// does, at a name no other process's file holds: `own` (the file this process put there last)
/// may be replaced, nothing else. Returns the new file's (device, inode); `EEXIST` where the
/// name is another's.
pub fn write_placed(
    path: &Path,
    mode: u32,
    own: Option<(u64, u64)>,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<(u64, u64)> {
    let tmp = write_temp(path, mode, fill)?;
    let placed = place(&tmp, path, own);
    if placed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    placed
}

/// Writes what `fill` writes to `path` so that a reader sees the old file or the new one, never a
/// part: a private temporary file (mode 0600) in the same directory, renamed. For a path the
/// program named itself (`pinguard_write_report(path)`): its missing folders are made and a
/// file there is replaced, as asked.
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(parent(path))?;
    let tmp = write_temp(path, 0o600, fill)?;
    let renamed = std::fs::rename(&tmp, path);
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed
}

/// A new file beside `path` (created exclusively, never through a symlink, hidden: readers
/// skip dot files) holding what `fill` writes, mode `mode` whatever the umask. Through a buffer
/// of 64 KiB: a report is serialised straight into its file, never whole in memory (a large one
/// would need as much again).
fn write_temp(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report".into());
    let tmp = parent(path).join(format!(
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
        let mut w = Buffered::new(&mut f);
        fill(&mut w)?;
        w.flush()
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// A 64 KiB write buffer taken fallibly: `BufWriter` aborts the program when its buffer cannot be
/// had (`handle_alloc_error`), and a report is written exactly when memory may be short (an
/// `RLIMIT_AS` the program lowers while the report thread writes). Without the buffer, every
/// write goes to the file as it comes.
struct Buffered<W: Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> Buffered<W> {
    fn new(inner: W) -> Self {
        let mut buf = Vec::new();
        let _ = buf.try_reserve_exact(64 << 10);
        Buffered { inner, buf }
    }

    fn flush_buf(&mut self) -> std::io::Result<()> {
        let r = self.inner.write_all(&self.buf);
        self.buf.clear();
        r
    }
}

impl<W: Write> Write for Buffered<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.buf.capacity() {
            self.flush_buf()?;
        }
        if data.len() >= self.buf.capacity() {
            return self.inner.write(data);
        }
        // Within the capacity reserved: no allocation.
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.flush_buf()?;
        self.inner.flush()
    }
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
    use super::{attempt, component, with_pid};
    use std::path::Path;

    #[test]
    fn a_later_attempt_is_an_unpredictable_name_with_the_same_extension() {
        assert_eq!(
            attempt(Path::new("/r/a.1.json"), 0),
            Path::new("/r/a.1.json")
        );
        let (one, two) = (
            attempt(Path::new("/r/a.1.json"), 1),
            attempt(Path::new("/r/a.1.json"), 1),
        );
        let name = one.to_str().unwrap();
        assert!(
            name.starts_with("/r/a.1.") && name.ends_with(".json") && name.len() == 28,
            "{name}"
        );
        assert_ne!(one, two);
        let prom = attempt(Path::new("/m/p.1.prom"), 2);
        assert!(prom.to_str().unwrap().ends_with(".prom"));
        assert_eq!(
            attempt(Path::new("/r/out.1"), 3).parent(),
            Some(Path::new("/r"))
        );
    }

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
