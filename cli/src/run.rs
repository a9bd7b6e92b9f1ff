//! `pinguard run`: the command under the preload library, its exit status passed on, then a
//! summary of every report it and its descendants wrote, and what happened to each of them.

use crate::merge::{short_label, Merged};
use crate::out::{count, table};
use pinguard_common::units::format_bytes;
use pinguard_common::{Reason, Report};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

pub struct Options {
    pub env: Vec<(&'static str, String)>,
    pub report: Option<String>,
    /// `--group-budget`: one budget for the command and its descendants (a group of the run's).
    pub group_budget: Option<String>,
    pub lib: Option<PathBuf>,
    pub cmd: Vec<OsString>,
    /// `--quiet`: of the summary, only its last line (the total).
    pub quiet: bool,
}

/// Where runs write by default: a folder per run inside it (`run_folder`), so that one run's
/// summary and `pinguard report` on its folder never mix in an earlier run's reports.
pub const DEFAULT_DIR: &str = "pinguard-reports";

/// This run's folder under `DEFAULT_DIR`: its local start time, then `run`'s pid (two runs
/// started in the same second differ), so that an `ls` lists runs in the order they started.
fn run_folder(start_ms: u64) -> String {
    let secs = (start_ms / 1000) as libc::time_t;
    // SAFETY: a zeroed `tm` is a valid out-parameter; localtime_r writes only into it.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&secs, &mut tm);
        tm
    };
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}-{}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        std::process::id()
    )
}

/// `libpinguard.so` beside the `pinguard` binary (a cargo build, an unpacked release), or in
/// `../lib/` (an installed prefix).
pub fn find_library(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("--lib {}: no such file", p.display()))
        };
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot locate the pinguard binary: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [
        dir.join("libpinguard.so"),
        dir.join("../lib/libpinguard.so"),
        dir.join("../lib/pinguard/libpinguard.so"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or(p.clone()))
        .ok_or_else(|| format!("cannot find libpinguard.so beside {} (build it with `cargo build --release`, or pass --lib)", exe.display()))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

// ---- The report template, checked before the command starts ----------------------------------

fn spawn_why(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOENT) => "no such file or command".into(),
        Some(libc::EACCES) => "permission denied (not an executable file?)".into(),
        Some(libc::ENOEXEC) => "not an executable format".into(),
        _ => e.to_string(),
    }
}

fn io_why(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => "permission denied".into(),
        Some(libc::EROFS) => "read-only file system".into(),
        _ => e.to_string(),
    }
}

/// Why the library could not write reports under `dir`, which need not exist yet: the library
/// creates it, so what counts is its nearest existing ancestor.
fn unwritable(dir: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let mut d = dir;
    loop {
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Some(format!("{} is not a directory", d.display())),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                match d.parent() {
                    Some(p) => d = p,
                    None => return Some(format!("{}: {}", dir.display(), io_why(&e))),
                }
            }
            Err(e) => return Some(format!("{}: {}", d.display(), io_why(&e))),
        }
    }
    let c = std::ffi::CString::new(d.as_os_str().as_bytes()).ok()?;
    // `access` rather than a probe file: nothing is left behind in a directory of the user's, and
    // root's answer (writable unless the file system is read-only) is the library's too.
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Some(format!(
            "{} is not writable ({})",
            d.display(),
            io_why(&std::io::Error::last_os_error())
        ));
    }
    None
}

fn absolute(cwd: &Path, t: &str) -> PathBuf {
    if t.starts_with('/') {
        PathBuf::from(t)
    } else {
        cwd.join(t)
    }
}

/// The template the library gets, made absolute, and a line to print when it is not where the
/// user would look. A run whose reports could not be written does not start: finding that out
/// after a long job is what this saves. The default falls back to the temporary directory as the
/// library's own default does (a read-only working directory in a container); a template given
/// with --report is used as given or not at all.
fn report_template(
    given: Option<&str>,
    cwd: &Path,
    folder: &str,
) -> Result<(PathBuf, Option<String>), String> {
    let Some(t) = given else {
        let template = Path::new(DEFAULT_DIR).join(folder).join("%e.%p.json");
        let here = cwd.join(&template);
        let Some(why) = unwritable(&search_root(&here)) else {
            return Ok((here, None));
        };
        let tmp = std::env::temp_dir().join(&template);
        return match unwritable(&search_root(&tmp)) {
            None => Ok((
                tmp.clone(),
                Some(format!(
                    "{why}; reports go to {}",
                    search_root(&tmp).display()
                )),
            )),
            Some(why2) => Err(format!(
                "nowhere to write reports: {why}; {why2}; give --report"
            )),
        };
    };
    if t.trim().is_empty() {
        return Err("--report is empty; give a path such as reports/%e.%p.json".into());
    }
    pinguard_common::vars::REPORT
        .check(t)
        .map_err(|e| format!("--report {t}: {e}"))?;
    let mut abs = absolute(cwd, t);
    // An existing directory means a file in it, as the library reads `PINGUARD_REPORT`: this
    // run's reports under their default name.
    if !t.contains('%') && abs.is_dir() {
        abs = abs.join("%e.%p.json");
    }
    match unwritable(&search_root(&abs)) {
        Some(why) => Err(format!("--report {t}: {why}")),
        None => Ok((abs, None)),
    }
}

// ---- Signals ------------------------------------------------------------------------------------

/// The command's pid while it runs; 0 before it starts and once it has ended (the pid may be
/// reused by then).
static CHILD: AtomicI32 = AtomicI32::new(0);
/// A signal that came before the command's pid was known: sent as soon as it is.
static PENDING: AtomicI32 = AtomicI32::new(0);

const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Sends the command the signal `run` got, so that stopping `run` (a job scheduler's `SIGTERM`,
/// `kill -INT`) stops the command, and `run` stays to say how it ended.
extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes an SA_SIGINFO handler a valid siginfo_t; `si_pid` is read only
    // for the codes of `kill`-like senders (the union member it reads is theirs).
    let (code, from) = unsafe {
        (
            (*info).si_code,
            if (*info).si_code <= 0 {
                (*info).si_pid()
            } else {
                0
            },
        )
    };
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 && from == pid {
        return; // the command signalling its parent is not asking for the signal back
    }
    // The terminal's ^C, ^\ and hang-up come from the kernel to the whole foreground process
    // group, the command included: sent again, it would get them twice. Unless it has left the
    // group, or did not exist yet.
    // SAFETY: getpgid and getpgrp take and return integers (plain system calls).
    if code > 0 && pid > 0 && unsafe { libc::getpgid(pid) == libc::getpgrp() } {
        return;
    }
    // Whichever of this handler and `run` takes the pending signal back sends it: exactly once.
    PENDING.store(sig, Ordering::SeqCst);
    if pid > 0 && PENDING.swap(0, Ordering::SeqCst) != 0 {
        // SAFETY: kill takes only integers and is async-signal-safe; `pid` is our own child,
        // not yet reaped (see `wait_for`).
        unsafe { libc::kill(pid, sig) };
    }
}

/// Installs `forward` for every signal that was not ignored, and returns the dispositions to put
/// back. An ignored one stays ignored, for the command too (`nohup pinguard run ...`): a handler
/// would be reset to the default by `exec`.
fn install() -> Vec<(libc::c_int, libc::sigaction)> {
    let mut old_all = Vec::new();
    for sig in FORWARDED {
        // SAFETY: zeroed sigaction structures are valid; `forward` has the SA_SIGINFO signature
        // and does only atomic operations and async-signal-safe system calls.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) == 0 {
                old_all.push((sig, old));
            }
        }
    }
    old_all
}

fn restore(old: &[(libc::c_int, libc::sigaction)]) {
    for (sig, sa) in old {
        // SAFETY: `sa` is the disposition sigaction itself returned for `sig`.
        unsafe { libc::sigaction(*sig, sa, std::ptr::null_mut()) };
    }
}

/// Waits until the command has ended without reaping it, so that its pid cannot be reused while
/// `forward` may still signal it.
fn wait_for(pid: u32) -> std::io::Result<()> {
    loop {
        // SAFETY: `info` is a valid out-pointer; WNOWAIT leaves the child for `Child::wait`.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `SIGTERM` for 15: the names reports give signals (`process.signal`).
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

// ---- Running the command -------------------------------------------------------------------------

/// How the command itself ended, from its wait status.
#[derive(Clone, Copy, Debug)]
pub enum Ended {
    Status(i32),
    Signal { sig: i32, core: bool },
}

impl Ended {
    fn describe(self) -> String {
        match self {
            Ended::Status(c) => format!("exited with status {c}"),
            Ended::Signal { sig, core } => format!(
                "killed by {}{}",
                signal_name(sig),
                if core { " (core dumped)" } else { "" }
            ),
        }
    }
}

/// The command `run` started: the one process whose ending it knows first-hand.
pub struct TheCommand {
    pub pid: u32,
    pub name: String,
    pub ended: Ended,
    /// Why pinguard cannot be loaded into it, when its file says so (`unreachable_by_preload`).
    pub unreachable: Option<String>,
    /// Why it runs in secure mode, where the loader ignores `LD_PRELOAD` (`secure::reason`).
    pub secure: Option<String>,
}

/// `PINGUARD_DISABLE` in `run`'s own environment switches the library off in the command, as the
/// library reads it (`1`, `true`, `yes`: the registry's switch).
fn disabled_here() -> bool {
    use std::os::unix::ffi::OsStrExt;
    std::env::var_os(pinguard_common::vars::DISABLE.name)
        .is_some_and(|v| pinguard_common::vars::switch(v.as_bytes()) == Some(true))
}

/// Refuses options that would silently do nothing: the library is off in the command.
fn refuse_when_disabled(o: &Options) -> Result<(), String> {
    if !disabled_here() {
        return Ok(());
    }
    let mut given: Vec<String> = o
        .env
        .iter()
        .filter_map(|(k, _)| crate::flags::option_for(k))
        .collect();
    if o.report.is_some() {
        given.push("--report".into());
    }
    if o.group_budget.is_some() {
        given.push("--group-budget".into());
    }
    if given.is_empty() {
        return Ok(());
    }
    let v = std::env::var_os(pinguard_common::vars::DISABLE.name).unwrap_or_default();
    Err(format!(
        "{} would have no effect: PINGUARD_DISABLE={} is set in the environment, which switches pinguard off (unset it, or leave out {})",
        given.join(", "),
        v.to_string_lossy(),
        if given.len() == 1 { "the option" } else { "the options" }
    ))
}

/// `--group-budget` makes a group of the run's own: a group already named in the environment
/// would be left, silently, so the two are not taken together.
fn refuse_other_group(o: &Options) -> Result<(), String> {
    match std::env::var_os(pinguard_common::vars::GROUP.name) {
        Some(g) if o.group_budget.is_some() && !g.is_empty() => Err(format!(
            "--group-budget makes a group of this run's own, but PINGUARD_GROUP={} is set in the environment (unset it, or leave out --group-budget and set PINGUARD_GROUP_BUDGET)",
            g.to_string_lossy()
        )),
        _ => Ok(()),
    }
}

/// The run's group's name: the run's folder name, then random digits, so that no other user can
/// make the ledger (`/dev/shm/pinguard.group.NAME`) first.
fn group_name(start_ms: u64) -> String {
    format!(
        "run-{}-{}",
        run_folder(start_ms),
        pinguard_common::untrusted::unpredictable()
    )
}

/// The run's group, as its summary shows it: the ledger's figures while a member still runs (the
/// group's peak is exact: its members count under one lock), then the ledger removed once none
/// does; once its last member removed it, the figures its members' reports carry.
fn group_summary(name: &str, budget: &str, root: &Path, start_ms: u64) -> String {
    match crate::top::run_group_line(name) {
        Ok(head) => format!("pinguard run: --group-budget {budget}: {head}\n"),
        Err(e) if std::path::Path::new(&pinguard_common::group::path(name)).exists() => {
            format!("pinguard run: --group-budget {budget}: {e}\n")
        }
        Err(_) => match group_from_reports(name, root, start_ms) {
            Some(head) => format!("pinguard run: --group-budget {budget}: {head}\n"),
            None => format!("pinguard run: --group-budget {budget}: group {name}: no process joined it (none pinned)\n"),
        },
    }
}

/// The group's line from its members' reports (each carries the group's figures when it was
/// written): the highest peak any saw, and how many reported.
fn group_from_reports(name: &str, root: &Path, start_ms: u64) -> Option<String> {
    let mut notes = String::new();
    let groups: Vec<_> = this_runs(root, start_ms, &mut notes)
        .into_iter()
        .filter_map(|(_, r)| r.group.filter(|g| g.name == name))
        .collect();
    let peak = groups.iter().map(|g| g.peak_bytes).max()?;
    let budget = groups.iter().find_map(|g| g.budget_bytes);
    Some(format!(
        "group {name}: 0 B of {} pinned, peak {}, {} (all gone: the last removed the ledger)",
        budget
            .map(format_bytes)
            .unwrap_or_else(|| "no budget".into()),
        format_bytes(peak),
        count(groups.len() as u64, "member reported", "members reported"),
    ))
}

/// The file `exec` would run for `cmd`: as given when it names a path, else the first match on
/// `PATH` that this user may execute (`execvp` goes on past one it may not).
fn resolve(cmd: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if cmd.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH")?;
    let executable = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes()).is_ok_and(|c| {
            // SAFETY: `c` is a NUL-terminated path; access only reads it.
            unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
        })
    };
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| p.is_file() && executable(p))
}

/// Why the preload library cannot be loaded into the program `cmd` runs, when its file says so: a
/// statically linked ELF program has no dynamic loader to read `LD_PRELOAD`.
fn unreachable_by_preload(cmd: &std::ffi::OsStr) -> Option<String> {
    use pinguard_common::elf::{u16_at, u32_at, u64_at};
    let path = resolve(cmd)?;
    let mut head = vec![0u8; 64 * 1024];
    let (mut file, _) =
        pinguard_common::untrusted::open(&path, pinguard_common::untrusted::Links::Follow).ok()?;
    let n = std::io::Read::read(&mut file, &mut head).ok()?;
    let b = &head[..n];
    // 64-bit little-endian ELF only (the architectures pinguard runs on); anything else (a
    // script, whose interpreter is dynamic) is not judged.
    if b.len() < 64 || b[..4] != *b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return None;
    }
    let (phoff, phentsize, phnum) = (
        u64_at(b, 32) as usize,
        u16_at(b, 54) as usize,
        u16_at(b, 56) as usize,
    );
    let headers: Vec<u32> = (0..phnum)
        .map(|i| phoff + i * phentsize)
        .take_while(|&at| at + 4 <= b.len())
        .map(|at| u32_at(b, at))
        .collect();
    const PT_INTERP: u32 = 3;
    if headers.len() < phnum || headers.contains(&PT_INTERP) {
        return None;
    }
    Some(format!("{} is statically linked: there is no dynamic loader in it to load pinguard (LD_PRELOAD); processes it starts that are dynamically linked are still watched", path.display()))
}

/// Whether a preload entry names an AddressSanitizer runtime (gcc's `libasan.so.N`, clang's
/// `libclang_rt.asan-ARCH.so`).
fn is_asan_runtime(entry: &[u8]) -> bool {
    let file = entry.rsplit(|&c| c == b'/').next().unwrap_or(entry);
    file.starts_with(b"libasan.so")
        || (file.starts_with(b"libclang_rt.asan") && file.ends_with(b".so"))
}

/// The AddressSanitizer runtime the program `cmd` runs needs (its `DT_NEEDED` entry, a soname the
/// loader finds as it would for the program itself), when it is built with one.
fn sanitizer_runtime(cmd: &std::ffi::OsStr) -> Option<String> {
    let path = resolve(cmd)?;
    let elf = pinguard_common::elf::Elf::open(path.to_str()?)?;
    elf.needed()
        .into_iter()
        .find(|n| is_asan_runtime(n.as_bytes()))
}

/// The command's `LD_PRELOAD`: pinguard, then what the user preloads. AddressSanitizer refuses to
/// start unless its runtime is the first object after the program ("ASan runtime does not come
/// first"), so an ASan runtime (the program's, or one the user preloads, which wins) goes first,
/// pinguard right after it. glibc separates entries with colons or spaces.
fn preload_list(lib: &Path, sanitizer: Option<&str>, old: Option<&std::ffi::OsStr>) -> OsString {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let old = old.map(|o| o.as_bytes()).unwrap_or_default();
    let entries: Vec<&[u8]> = old
        .split(|&c| c == b':' || c == b' ')
        .filter(|e| !e.is_empty())
        .collect();
    let users_asan = entries.iter().find(|e| is_asan_runtime(e)).copied();
    let asan = users_asan.or(sanitizer.map(str::as_bytes));
    let mut list: Vec<&[u8]> = asan.into_iter().collect();
    list.push(lib.as_os_str().as_bytes());
    list.extend(entries.iter().filter(|e| !is_asan_runtime(e)));
    OsString::from_vec(list.join(&b':'))
}

/// Makes the run's folder, so that a run always leaves one (with its record) and a folder that
/// cannot be made stops the run before the command starts: `access` on an ancestor does not tell
/// (root may write anywhere, but not create a directory under /proc).
fn make_folder(root: &Path) -> Result<(), String> {
    std::fs::create_dir_all(root).map_err(|e| {
        format!(
            "cannot create the report folder {}: {}",
            root.display(),
            io_why(&e)
        )
    })
}

/// What `run` settled before the command starts: where its reports go and what was said about
/// the command's reach.
struct Prepared {
    template_abs: PathBuf,
    /// The folders `run` made for the reports (removed again when nothing was recorded).
    made: Vec<PathBuf>,
    unreachable: Option<String>,
    secure: Option<String>,
    preload: OsString,
    /// The group `--group-budget` makes: its name and budget.
    group: Option<(String, String)>,
}

/// Runs the command; returns the exit status `pinguard run` should end with.
pub fn run(o: Options) -> i32 {
    let start = now_ms();
    let p = match prepare(&o, start) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let (pid, ended) = match start_and_wait(&o, &p) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let code = match ended {
        Ended::Status(c) => c,
        Ended::Signal { sig, .. } => 128 + sig,
    };
    let the_cmd = TheCommand {
        pid,
        name: crate::merge::basename(&o.cmd[0].to_string_lossy()).to_string(),
        ended,
        unreachable: p.unreachable.clone(),
        secure: p.secure.clone(),
    };
    summarise_run(&o, &p, start, &the_cmd);
    code
}

/// The checks and the report folder before the command starts; `Err`: the exit status.
fn prepare(o: &Options, start: u64) -> Result<Prepared, i32> {
    let said = |e: String| {
        eprintln!("pinguard run: {e}");
        2
    };
    refuse_when_disabled(o)
        .and_then(|()| refuse_other_group(o))
        .map_err(said)?;
    let lib = find_library(o.lib.as_deref()).map_err(said)?;
    // A working directory removed under us: a relative template is then refused as unwritable.
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let (template_abs, note) =
        report_template(o.report.as_deref(), &cwd, &run_folder(start)).map_err(said)?;
    if let Some(n) = note {
        eprintln!("pinguard run: {n}");
    }
    let root = search_root(&template_abs);
    if let Some(line) = crate::input::earlier_runs(&root) {
        if !o.quiet {
            eprintln!("pinguard run: {line}");
        }
    }
    let made = missing_folders(&root);
    make_folder(&root).map_err(said)?;
    let unreachable = unreachable_by_preload(&o.cmd[0]);
    if let Some(why) = &unreachable {
        eprintln!("pinguard run: {why}");
    }
    let secure = resolve(&o.cmd[0]).and_then(|p| crate::secure::reason(&p));
    if let Some(why) = &secure {
        eprintln!("pinguard run: {why}: what it pins is not counted, and `pinguard check` fails on this run unless --allow-unwatched");
    }
    let sanitizer = sanitizer_runtime(&o.cmd[0]);
    let preload = preload_list(
        &lib,
        sanitizer.as_deref(),
        std::env::var_os("LD_PRELOAD").as_deref(),
    );
    if let Some(rt) = &sanitizer {
        eprintln!("pinguard run: {} is built with AddressSanitizer ({rt}): its runtime is preloaded first, pinguard after it", o.cmd[0].to_string_lossy());
    }
    let group = o
        .group_budget
        .as_ref()
        .map(|b| (group_name(start), b.clone()));
    Ok(Prepared {
        template_abs,
        made,
        unreachable,
        secure,
        preload,
        group,
    })
}

/// Starts the command under the library and waits for it, signals to `run` passed on; its pid
/// and how it ended, or `Err` with `run`'s exit status.
fn start_and_wait(o: &Options, p: &Prepared) -> Result<(u32, Ended), i32> {
    let mut cmd = Command::new(&o.cmd[0]);
    cmd.args(&o.cmd[1..])
        .env("LD_PRELOAD", &p.preload)
        .env(pinguard_common::vars::REPORT.name, &p.template_abs);
    for (k, v) in &o.env {
        cmd.env(k, v);
    }
    if let Some((name, budget)) = &p.group {
        cmd.env(pinguard_common::vars::GROUP.name, name)
            .env(pinguard_common::vars::GROUP_BUDGET.name, budget);
    }
    // Before the command starts, so that no signal in between ends `run` and orphans it.
    let old = install();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            restore(&old);
            eprintln!(
                "pinguard run: cannot run {}: {}",
                o.cmd[0].to_string_lossy(),
                spawn_why(&e)
            );
            // Nothing ran: the folder made for it goes (`remove_dir` leaves one that holds files).
            let _ = std::fs::remove_dir(search_root(&p.template_abs));
            // The shell's convention: 127 for a command that is not there, 126 for one that is
            // but cannot be executed.
            return Err(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let pid = child.id();
    CHILD.store(pid as i32, Ordering::SeqCst);
    let early = PENDING.swap(0, Ordering::SeqCst);
    if early != 0 {
        // SAFETY: kill takes only integers; `pid` is our child, not yet reaped.
        unsafe { libc::kill(pid as i32, early) };
    }
    let waited = wait_for(pid);
    CHILD.store(0, Ordering::SeqCst);
    // From here a signal is for `run` itself: it ends the summary as it would any program.
    restore(&old);
    let status = waited.and_then(|()| child.wait()).map_err(|e| {
        eprintln!("pinguard run: waiting for the command: {e}");
        2
    })?;
    use std::os::unix::process::ExitStatusExt;
    let ended = match (status.code(), status.signal()) {
        (Some(c), _) => Ended::Status(c),
        (None, Some(sig)) => Ended::Signal {
            sig,
            core: status.core_dumped(),
        },
        _ => Ended::Status(1),
    };
    Ok((pid, ended))
}

/// The run's record and its summary on stderr, once the command has ended.
fn summarise_run(o: &Options, p: &Prepared, start: u64, the_cmd: &TheCommand) {
    let mut rec = new_record(o, &p.template_abs, start, the_cmd);
    let group_line = p.group.as_ref().map(|(name, budget)| {
        rec.group = Some(name.clone());
        rec.group_budget = Some(budget.clone());
        group_summary(name, budget, &search_root(&p.template_abs), start)
    });
    let mut text = summarise(
        &p.template_abs,
        start,
        Some(the_cmd),
        &mut rec,
        group_line.as_deref().unwrap_or(""),
    );
    // The default folder of a run that recorded nothing is not left behind (a `git status` full
    // of empty runs); a folder the user named keeps the run's record, for `check DIR`.
    if o.report.is_none() && nothing_recorded(&rec, the_cmd) && remove_made(&p.made) {
        text = format!(
            "{}pinguard run: no reports: {} {} and pinned nothing that pinguard saw; no folder left\n",
            group_line.as_deref().unwrap_or(""),
            the_cmd.name,
            the_cmd.ended.describe()
        );
    } else {
        write_record(&p.template_abs, &rec);
    }
    if o.quiet {
        text = last_line(&text);
    }
    eprint!("{text}");
}

/// Whether the run recorded nothing worth a folder: no process left a report or state, and the
/// command ended by itself where pinguard could see it (an unwatched or secure-mode command, a
/// kill, or a disabled library is said in the record).
fn nothing_recorded(rec: &crate::record::RunRecord, c: &TheCommand) -> bool {
    rec.reports_found.is_empty()
        && !rec.disabled
        && c.unreachable.is_none()
        && c.secure.is_none()
        && matches!(c.ended, Ended::Status(_))
}

/// The folders `make_folder` is about to make for `root`, deepest first.
fn missing_folders(root: &Path) -> Vec<PathBuf> {
    let mut made = Vec::new();
    let mut d = Some(root);
    while let Some(p) = d.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        made.push(p.to_path_buf());
        d = p.parent();
    }
    made
}

/// Removes the folders this run made, deepest first, each only while empty (another run's files
/// keep it). Whether the run's own folder went.
fn remove_made(made: &[PathBuf]) -> bool {
    let Some(own) = made.first() else {
        return false;
    };
    if std::fs::remove_dir(own).is_err() {
        return false;
    }
    for d in &made[1..] {
        if std::fs::remove_dir(d).is_err() {
            break;
        }
    }
    true
}

/// The summary's last line: `--quiet`'s total.
fn last_line(text: &str) -> String {
    text.lines()
        .rfind(|l| !l.trim().is_empty())
        .map(|l| format!("{l}\n"))
        .unwrap_or_default()
}

/// The run's record as far as `run` knows it before reading the folder.
fn new_record(
    o: &Options,
    template: &Path,
    start_ms: u64,
    cmd: &TheCommand,
) -> crate::record::RunRecord {
    let (exit_status, signal) = match cmd.ended {
        Ended::Status(c) => (Some(c), None),
        Ended::Signal { sig, .. } => (None, Some(signal_name(sig))),
    };
    crate::record::RunRecord {
        schema: crate::record::SCHEMA.into(),
        pinguard_version: env!("CARGO_PKG_VERSION").into(),
        command: o
            .cmd
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pid: cmd.pid,
        hostname: local_host(),
        exit_status,
        signal,
        start_unix_ms: start_ms,
        end_unix_ms: now_ms(),
        report_template: template.display().to_string(),
        disabled: disabled_here(),
        unwatched: cmd.unreachable.clone(),
        secure_mode: cmd.secure.clone(),
        group: None,
        group_budget: None,
        pids_seen: vec![cmd.pid],
        reports_expected: 0,
        reports_found: Vec::new(),
        no_report: Vec::new(),
    }
}

/// Writes the record into the run's folder (a private temporary file, then a rename, as reports
/// are written); a failure is said, and changes nothing else.
fn write_record(template: &Path, rec: &crate::record::RunRecord) {
    let root = search_root(template);
    let path = root.join(format!(
        "{}{}.json",
        crate::record::PREFIX,
        std::process::id()
    ));
    let text = serde_json::to_string_pretty(rec).unwrap_or_default() + "\n";
    // The temporary file under a name nobody can have made first (the folder may be shared).
    let prefix = format!(".{}{}.", crate::record::PREFIX, std::process::id());
    let mut tmp = None;
    let written =
        pinguard_common::untrusted::create_new(&root, &prefix, ".tmp").and_then(|(mut f, t)| {
            tmp = Some(t.clone());
            std::io::Write::write_all(&mut f, text.as_bytes())?;
            std::fs::rename(&t, &path)
        });
    if let Err(e) = written {
        if let Some(t) = tmp {
            let _ = std::fs::remove_file(t);
        }
        eprintln!(
            "pinguard run: cannot write the run record {}: {}",
            path.display(),
            io_why(&e)
        );
    }
}

// ---- The summary ----------------------------------------------------------------------------------

/// The directory to search: the template's longest leading part without `%` escapes.
fn search_root(template: &Path) -> PathBuf {
    let mut root = PathBuf::new();
    for c in template.parent().unwrap_or(Path::new("/")).components() {
        if c.as_os_str().to_string_lossy().contains('%') {
            break;
        }
        root.push(c);
    }
    root
}

/// Which of two readings of one process to believe: the one written as it ended, then the state
/// a dead process left, then the latest snapshot.
fn finality(r: Reason) -> u8 {
    match r {
        Reason::Exit | Reason::FatalSignal => 2,
        Reason::Killed | Reason::Running => 1,
        Reason::Interval | Reason::Signal | Reason::Request => 0,
    }
}

/// This run's processes, one reading each: what `input` reads under `root` (reports, and the
/// state of a process that died without writing one) from processes that started with the run.
fn this_runs(root: &Path, start_ms: u64, notes: &mut String) -> Vec<(PathBuf, Report)> {
    let (files, _) = crate::input::expand(&[root.to_path_buf()]);
    let mut best: HashMap<(String, u32, u64), (PathBuf, Report)> = HashMap::new();
    for input in files {
        let f = input.path.clone();
        // Run records (this run's is written after; an earlier run's may share the folder).
        if f.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(crate::record::PREFIX))
        {
            continue;
        }
        let r = match crate::input::load_found(&input) {
            Ok(r) => r,
            Err(bad) => {
                // Only this run's: an unrelated file in a shared directory is none of its business.
                let recent = std::fs::symlink_metadata(&f)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                if recent.is_some_and(|t| t.as_millis() as u64 + 1000 >= start_ms) {
                    notes.push_str(&format!("pinguard run: skipped {bad}\n"));
                }
                continue;
            }
        };
        // Reports of earlier runs in the same place are not this run's.
        if r.process.start_unix_ms + 1000 < start_ms || r.process.write_unix_ms < start_ms {
            continue;
        }
        let key = (
            r.process.hostname.clone(),
            r.process.pid,
            r.process.start_unix_ms,
        );
        let better = match best.get(&key) {
            Some((_, old)) => {
                (finality(r.reason), r.process.write_unix_ms)
                    > (finality(old.reason), old.process.write_unix_ms)
            }
            None => true,
        };
        if better {
            best.insert(key, (f, r));
        }
    }
    let mut v: Vec<_> = best.into_values().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// One process's reading, and the callsite it held the most at.
struct Reading {
    report: Report,
    /// Its callsite holding the most, as `pinguard report` names it, and how many others hold any.
    top: Option<(String, usize)>,
}

/// What happened to one process, in one line; `is_cmd` when it is the command itself.
fn ending_line(p: &Reading, is_cmd: Option<&TheCommand>) -> String {
    let r = &p.report;
    let how = match (is_cmd, r.reason) {
        (Some(c), _) => c.ended.describe(),
        (None, Reason::Exit) => "exited".into(),
        (None, Reason::FatalSignal) => format!(
            "killed by {}",
            r.process.signal.as_deref().unwrap_or("a signal")
        ),
        (None, Reason::Killed) => "killed".into(),
        (None, Reason::Running) => "still running".into(),
        (None, _) => "wrote no final report".into(),
    };
    let t = &r.totals;
    let held = (t.live_bytes > 0).then(|| {
        let by = match &p.top {
            Some((name, 0)) => name.clone(),
            Some((name, others)) => format!(
                "{name} and {}",
                count(*others as u64, "other callsite", "other callsites")
            ),
            None => "callsites the report does not list".into(),
        };
        (format_bytes(t.live_bytes), by)
    });
    let peak = if t.peak_live_bytes > 0 {
        format!(" (peak {})", format_bytes(t.peak_live_bytes))
    } else {
        String::new()
    };
    let state = match (r.reason, held) {
        (Reason::Exit, Some((n, by))) => format!("{n} still pinned at exit by {by}"),
        (Reason::Exit, None) => format!("nothing pinned at exit{peak}"),
        (Reason::Running, Some((n, by))) => format!("its state now: {n} pinned by {by}"),
        (Reason::Running, None) => format!("its state now: nothing pinned{peak}"),
        (Reason::FatalSignal | Reason::Killed, Some((n, by))) => {
            format!("its last state: {n} pinned by {by}")
        }
        (Reason::FatalSignal | Reason::Killed, None) => {
            format!("its last state: nothing pinned{peak}")
        }
        (other, Some((n, by))) => format!(
            "its last state: {n} pinned by {by} (as of its last {} report)",
            other.name()
        ),
        (other, None) => format!(
            "its last state: nothing pinned{peak} (as of its last {} report)",
            other.name()
        ),
    };
    let tag = if is_cmd.is_some() {
        ", the command"
    } else {
        ""
    };
    let kernel = match t.kernel_pinned_bytes {
        0 => String::new(),
        b => format!(
            ", and {} kernel-pinned with no callsite (VmPin)",
            format_bytes(b)
        ),
    };
    format!(
        "pinguard run: pid {} ({}{tag}): {how}; {state}{kernel}\n",
        r.process.pid,
        crate::merge::basename(&r.process.exe)
    )
}

/// The host name reports carry, to tell the command from a process with the same pid on another
/// host writing to a shared directory.
fn local_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// At most this many lines of endings; the table has every process.
const MAX_ENDINGS: usize = 20;

/// The summary `run` prints; fills in what `rec` says of the processes found.
/// `group`: the line of the run's group (`--group-budget`), shown before the total.
pub fn summarise(
    template: &Path,
    start_ms: u64,
    cmd: Option<&TheCommand>,
    rec: &mut crate::record::RunRecord,
    group: &str,
) -> String {
    let root = search_root(template);
    let (m, mut readings, notes) = gather(&root, start_ms, rec);
    let host = local_host();
    let is_cmd =
        |r: &Report| cmd.is_some_and(|c| c.pid == r.process.pid && r.process.hostname == host);
    rec.reports_expected = readings.len();
    let cmd_line = command_line(cmd, &readings, &is_cmd, &root, rec);
    if readings.is_empty() {
        let l = cmd_line.unwrap_or_default();
        return format!(
            "{notes}{l}{group}pinguard run: no reports; run record in {}\n",
            shown_path(&root)
        );
    }
    let shown = shown_path(&root);
    let mut s = format!("\n{notes}");
    for e in m.config_error_lines() {
        s.push_str(&format!(
            "pinguard run: a setting could not be used in {e}\n"
        ));
    }
    s.push_str(&format!(
        "pinguard run: {} under {shown}\n",
        count(m.reports as u64, "report", "reports")
    ));
    s.push_str(&process_table(&m, &root));
    s.push_str(&top_callsites(&m));
    s.push_str(&ending_lines(cmd, cmd_line, &mut readings, &is_cmd));
    s.push_str(group);
    let t = &m.totals;
    s.push_str(&format!(
        "\nTotal: {} pinned in {} across {}, {} denied, {} downgraded, {} over budget{}. Details: pinguard report {shown}\n",
        format_bytes(t.live_bytes),
        count(t.live_count, "allocation", "allocations"),
        count(m.processes as u64, "process", "processes"),
        t.denied_count,
        t.downgraded_count,
        t.over_budget_count,
        crate::merge::host_clause(&m),
    ));
    s
}

/// This run's reports under `root`: merged, one reading each (with its top holder), recorded in
/// the run record; and the lines about files that could not be read.
fn gather(
    root: &Path,
    start_ms: u64,
    rec: &mut crate::record::RunRecord,
) -> (Merged, Vec<Reading>, String) {
    let mut notes = String::new();
    let mut m = Merged::default();
    let mut readings = Vec::new();
    for (path, report) in this_runs(root, start_ms, &mut notes) {
        let file = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        let p = &report.process;
        rec.reports_found.push(crate::record::Found {
            pid: p.pid,
            exe: p.exe.clone(),
            reason: report.reason.name().into(),
            file,
        });
        if !rec.pids_seen.contains(&p.pid) {
            rec.pids_seen.push(p.pid);
        }
        // `input` gives full reports; the merge folds the borrowed view `pinguard report` reads.
        let Ok(bytes) = serde_json::to_vec(&report) else {
            continue;
        };
        let Ok(view) = pinguard_common::view::ReportView::parse(&bytes) else {
            continue;
        };
        m.add(&path, &view);
        let mut one = Merged::default();
        one.add(&path, &view);
        one.sort();
        let holding: Vec<_> = one.callsites.iter().filter(|c| c.live_bytes > 0).collect();
        let top = holding.first().map(|c| (short_label(c), holding.len() - 1));
        readings.push(Reading { report, top });
    }
    m.finish();
    (m, readings, notes)
}

/// The line for a command that left no report (why, and how it ended), recorded too.
fn command_line(
    cmd: Option<&TheCommand>,
    readings: &[Reading],
    is_cmd: &dyn Fn(&Report) -> bool,
    root: &Path,
    rec: &mut crate::record::RunRecord,
) -> Option<String> {
    match cmd {
        Some(c) if !readings.iter().any(|p| is_cmd(&p.report)) => {
            let why = match c.unreachable.as_ref().or(c.secure.as_ref()) {
                Some(u) => format!("it left no report: {u}"),
                None => no_report_why(c, root, rec.disabled),
            };
            rec.no_report.push(crate::record::NoReport {
                pid: c.pid,
                why: why.clone(),
            });
            Some(format!(
                "pinguard run: pid {} ({}, the command): {}; {why}\n",
                c.pid,
                c.name,
                c.ended.describe()
            ))
        }
        _ => None,
    }
}

/// One row per process: its figures, budget, report (the host reserve's columns when one was in
/// force).
fn process_table(m: &Merged, root: &Path) -> String {
    let mut rows = vec![[
        "PID",
        "EXE",
        "LIVE",
        "COUNT",
        "PEAK",
        "DENIED",
        "DOWNGRADED",
        "OVER-BUDGET",
        "BUDGET",
        "REPORT",
    ]
    .map(String::from)
    .to_vec()];
    let mut right = vec![true, false, true, true, true, true, true, true, true, false];
    // The host reserve's columns only when one was in force: most runs have none.
    if m.host.is_some() {
        rows[0].splice(8..8, ["HOST-RESERVE", "LOWEST-AVAIL"].map(String::from));
        right.splice(8..8, [true, true]);
    }
    for p in &m.per_process {
        let mut row = vec![
            p.pid.to_string(),
            crate::merge::basename(&p.exe).to_string(),
            format_bytes(p.totals.live_bytes),
            p.totals.live_count.to_string(),
            format_bytes(p.totals.peak_live_bytes),
            p.totals.denied_count.to_string(),
            p.totals.downgraded_count.to_string(),
            p.totals.over_budget_count.to_string(),
            p.budget_bytes
                .map(format_bytes)
                .unwrap_or_else(|| "-".into()),
            p.path
                .strip_prefix(&format!("{}/", root.display()))
                .unwrap_or(&p.path)
                .to_string(),
        ];
        if m.host.is_some() {
            let lowest = p
                .host
                .map(|h| format_bytes(h.lowest_available_bytes))
                .unwrap_or_else(|| "-".into());
            let stopped = if p.host.is_some() {
                p.totals.host_reserve_count.to_string()
            } else {
                "-".into()
            };
            row.splice(8..8, [stopped, lowest]);
        }
        rows.push(row);
    }
    table(&rows, &right)
}

/// The five callsites that hold the most or were refused, downgraded or let over a budget.
fn top_callsites(m: &Merged) -> String {
    let mut s = String::new();
    let top: Vec<_> = m
        .callsites
        .iter()
        .filter(|c| {
            c.live_bytes > 0
                || c.denied_count > 0
                || c.downgraded_count > 0
                || c.over_budget_count > 0
        })
        .take(5)
        .collect();
    if !top.is_empty() {
        s.push_str("\nTop callsites:\n");
        let mut rows = vec![std::iter::once("LIVE")
            .chain(crate::merge::TAIL)
            .map(String::from)
            .collect::<Vec<_>>()];
        for c in top {
            rows.push(
                std::iter::once(format_bytes(c.live_bytes))
                    .chain(crate::merge::tail_cells(c))
                    .collect(),
            );
        }
        s.push_str(&table(&rows, &[true, true, true, true, true, false, false]));
    }
    s
}

/// How each process ended: the command first, then every process that did not simply exit, then
/// the rest, at most `MAX_ENDINGS` lines.
fn ending_lines(
    cmd: Option<&TheCommand>,
    cmd_line: Option<String>,
    readings: &mut [Reading],
    is_cmd: &dyn Fn(&Report) -> bool,
) -> String {
    let mut s = String::new();
    // The command first, then every process that did not simply exit, then the rest.
    readings.sort_by_key(|p| {
        (
            !is_cmd(&p.report),
            p.report.reason == Reason::Exit,
            p.report.process.pid,
        )
    });
    s.push('\n');
    let mut lines: Vec<String> = cmd_line.into_iter().collect();
    lines.extend(
        readings
            .iter()
            .map(|p| ending_line(p, cmd.filter(|_| is_cmd(&p.report)))),
    );
    for l in lines.iter().take(MAX_ENDINGS) {
        s.push_str(l);
    }
    if lines.len() > MAX_ENDINGS {
        let rest = &readings[readings.len() - (lines.len() - MAX_ENDINGS)..];
        let exited = rest
            .iter()
            .filter(|p| p.report.reason == Reason::Exit)
            .count();
        s.push_str(&format!(
            "pinguard run: ... and {}: {exited} exited, {} did not (see the table)\n",
            count(rest.len() as u64, "more process", "more processes"),
            rest.len() - exited
        ));
    }
    s
}

/// What is known of why the command left no report, without claiming more: a process that pins
/// leaves a report or a state file, unless the library is off, not loaded, or cannot write.
fn no_report_why(c: &TheCommand, root: &Path, disabled: bool) -> String {
    if disabled {
        return "it left no report: PINGUARD_DISABLE is set in the environment, so pinguard passed every call through and recorded nothing".into();
    }
    match c.ended {
        Ended::Signal { .. } => format!(
            "it left no report or state under {} (a process leaves none before it pins anything, or where the library is not loaded or cannot write)",
            root.display()
        ),
        Ended::Status(_) => format!(
            "it left no report or state under {} (it pinned nothing that pinguard saw: a process that pins leaves one where the library is loaded and can write)",
            root.display()
        ),
    }
}

/// The folder as the user would type it: relative to the working directory when inside it.
fn shown_path(dir: &Path) -> String {
    let rel = std::env::current_dir()
        .ok()
        .and_then(|cwd| dir.strip_prefix(cwd).ok().map(Path::to_path_buf));
    match rel {
        Some(r) if !r.as_os_str().is_empty() => format!("{}/", r.display()),
        _ => format!("{}/", dir.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_checked_as_the_library_reads_them() {
        let cwd = Path::new("/");
        assert!(report_template(Some(""), cwd, "f")
            .unwrap_err()
            .contains("empty"));
        assert!(report_template(Some("/nonexistent-dir/"), cwd, "f")
            .unwrap_err()
            .contains("names a directory"));
    }

    #[test]
    fn signals_have_their_names() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(77), "signal 77");
    }

    #[test]
    fn an_asan_runtime_goes_first_in_the_preload_list() {
        let lib = Path::new("/opt/pg/libpinguard.so");
        let list = |asan: Option<&str>, old: Option<&str>| {
            preload_list(lib, asan, old.map(std::ffi::OsStr::new))
                .into_string()
                .unwrap()
        };
        assert_eq!(list(None, None), "/opt/pg/libpinguard.so");
        assert_eq!(list(None, Some("")), "/opt/pg/libpinguard.so");
        assert_eq!(
            list(None, Some("libx.so libz.so")),
            "/opt/pg/libpinguard.so:libx.so:libz.so"
        );
        assert_eq!(
            list(Some("libasan.so.8"), None),
            "libasan.so.8:/opt/pg/libpinguard.so"
        );
        assert_eq!(
            list(Some("libasan.so.8"), Some("libx.so")),
            "libasan.so.8:/opt/pg/libpinguard.so:libx.so"
        );
        // The user's own runtime, wherever it was in the list, is the one that goes first.
        assert_eq!(
            list(Some("libasan.so.8"), Some("libx.so:/usr/lib/libasan.so.6")),
            "/usr/lib/libasan.so.6:/opt/pg/libpinguard.so:libx.so"
        );
        assert_eq!(
            list(None, Some("libx.so /c/libclang_rt.asan-x86_64.so")),
            "/c/libclang_rt.asan-x86_64.so:/opt/pg/libpinguard.so:libx.so"
        );
        assert!(
            !is_asan_runtime(b"/lib/libasan_helper.txt") && !is_asan_runtime(b"libhwasan.so.0")
        );
    }
}
