//! `PINGUARD_METRICS`: a Prometheus text-format file for node_exporter's textfile collector.
//!
//! A process writes its file from its first counted pinning call on (a refusal or a downgrade
//! counts), every `interval_ms`, atomically, mode 0644 (the collector runs as another user; the
//! file holds figures, names and labels, nothing secret), and removes it when it exits. Its first
//! line names the writer (`Writer`): whoever writes next in the folder removes the file of a
//! writer it can prove dead, so a SIGKILLed or OOM-killed process's series go too
//! (`docs/internals.md`, "Metrics").

use crate::accounting::ledger;
use crate::budget::{self, group};
use crate::runtime::config::Config;
use crate::runtime::lock::Mutex;
use crate::runtime::{kernel, sys};
use pinguard_common::textfile::{candidate_name, live_name, stat_says_ended, Writer, HEAD_BYTES};
use pinguard_common::vars::METRICS_INTERVAL_MS;
use std::ffi::{CStr, CString, OsStr};
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Readable by a collector of another user.
const MODE: u32 = 0o644;
/// Directory entries read per pass, and files opened per pass: a pass is bounded however large
/// the folder; the files opened rotate from one pass to the next (`CURSOR`).
const MAX_NAMES: usize = 4096;
const MAX_EXAMINED: usize = 64;

/// How often metrics are rewritten: every `PINGUARD_INTERVAL` when that is shorter than the
/// default, else every `METRICS_INTERVAL_MS` (so a file's age tells whether its writer lives).
pub fn interval_ms(cfg: &Config) -> u64 {
    cfg.interval_ms
        .map_or(METRICS_INTERVAL_MS, |i| i.min(METRICS_INTERVAL_MS))
        .max(10)
}

/// This process as a writer.
fn me(cfg: &Config) -> Writer {
    Writer {
        pid: kernel::raw_pid() as u32,
        start: kernel::start_ticks(),
        pidns: kernel::pid_namespace(),
        interval_ms: interval_ms(cfg),
        live: None,
    }
}

/// A label value in the text format: backslash, double quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The container this process runs in, from `/proc/self/cgroup` (read once).
fn container_id() -> Option<&'static str> {
    static ID: OnceLock<Option<String>> = OnceLock::new();
    ID.get_or_init(|| {
        sys::read_text(c"/proc/self/cgroup").and_then(|t| super::cgroup::container_id(&t))
    })
    .as_deref()
}

/// The labels every series of this process carries.
fn who(cfg: &Config, group: Option<&str>) -> String {
    let exe = kernel::exe();
    let mut who = format!(
        "pid=\"{}\",exe=\"{}\"",
        kernel::raw_pid(),
        label(exe.rsplit('/').next().unwrap_or(""))
    );
    // A pid is unique only in its namespace: two containers' pid 1 in one folder would make
    // the same series twice, which costs node_exporter the whole family.
    if let Some(ns) = kernel::pid_namespace() {
        let _ = write!(who, ",pidns=\"{ns}\"");
    }
    let mut add = |k: &str, v: &str| {
        let _ = write!(who, ",{k}=\"{}\"", label(v));
    };
    // `namespace`, `pod`, `container`, then `PINGUARD_LABELS`, as the configuration lists them.
    let (env, extra) = cfg.labels.split_at(
        cfg.labels
            .iter()
            .take_while(|(k, _)| ["namespace", "pod", "container"].contains(&k.as_str()))
            .count(),
    );
    for (k, v) in env {
        add(k, v);
    }
    if let Some(id) = container_id() {
        add("container_id", id);
    }
    for (k, v) in extra {
        add(k, v);
    }
    if let Some(g) = group {
        add("group", g);
    }
    who
}

/// Settings that could not be used: those rejected at start-up, and a reserve a bad reading
/// turned off since.
fn config_errors(cfg: &Config) -> u64 {
    cfg.errors.len() as u64
        + u64::from(budget::host::problem().is_some())
        + u64::from(budget::cgroup::floor().problem().is_some())
}

/// The text being written, and the labels every sample of this process carries.
struct Families {
    s: String,
    who: String,
}

impl Families {
    fn family(&mut self, name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>) {
        let _ = writeln!(self.s, "# HELP {name} {help}");
        let _ = writeln!(self.s, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(self.s, "{name}{{{labels}}} {v}");
        }
    }

    /// A family of one sample, this process's.
    fn one(&mut self, name: &str, kind: &str, help: &str, v: u64) {
        let samples = vec![(self.who.clone(), v)];
        self.family(name, kind, help, samples);
    }
}

fn render(cfg: &Config, me: &Writer) -> String {
    let g = group::snapshot();
    let who = who(cfg, g.as_ref().map(|g| g.name.as_str()));
    let mut f = Families { s: me.line(), who };
    process_families(&mut f, cfg);
    host_families(&mut f);
    cgroup_families(&mut f);
    if let Some(g) = g {
        group_families(&mut f, &g);
    }
    f.s
}

fn process_families(f: &mut Families, cfg: &Config) {
    let apis = ledger::apis();
    let t = ledger::totals();
    let by_api =
        |who: &str, get: &dyn Fn(&pinguard_common::ApiStats) -> u64| -> Vec<(String, u64)> {
            apis.iter()
                .map(|(a, st)| (format!("{who},api=\"{}\"", a.name()), get(st)))
                .collect()
        };
    let w = f.who.clone();
    f.family(
        "pinguard_pinned_bytes",
        "gauge",
        "Pinned bytes live now, by entry point.",
        by_api(&w, &|a| a.live_bytes),
    );
    f.family(
        "pinguard_pinned_peak_bytes",
        "gauge",
        "Most pinned bytes live at once, by entry point.",
        by_api(&w, &|a| a.peak_live_bytes),
    );
    f.family(
        "pinguard_denied_total",
        "counter",
        "Calls refused by the budget, by entry point.",
        by_api(&w, &|a| a.denied_count),
    );
    f.family(
        "pinguard_downgraded_total",
        "counter",
        "Calls served with pageable memory instead, by entry point.",
        by_api(&w, &|a| a.downgraded_count),
    );
    f.one(
        "pinguard_process_pinned_bytes",
        "gauge",
        "Pinned bytes live now in the process.",
        t.live_bytes,
    );
    f.one(
        "pinguard_process_pinned_peak_bytes",
        "gauge",
        "Most pinned bytes live at once in the process.",
        t.peak_live_bytes,
    );
    f.one(
        "pinguard_process_kernel_pinned_bytes",
        "gauge",
        "Bytes the kernel counts as pinned (VmPin) that no call pinguard saw explains: no callsite, counted against the budget.",
        ledger::kernel_pinned(),
    );
    f.one(
        "pinguard_config_errors",
        "gauge",
        "Settings that could not be used (the report's config.errors).",
        config_errors(cfg),
    );
    if let Some(b) = budget::limit() {
        f.one(
            "pinguard_budget_bytes",
            "gauge",
            "The process's pinned-memory budget.",
            b,
        );
    }
}

fn host_families(f: &mut Families) {
    let Some(h) = budget::host::snapshot() else {
        return;
    };
    if let Some(r) = budget::host::reserve() {
        f.one(
            "pinguard_host_reserve_bytes",
            "gauge",
            "The host reserve in force: the floor pins keep the host's MemAvailable above.",
            r,
        );
    }
    f.one(
        "pinguard_host_available_bytes",
        "gauge",
        "The host's MemAvailable at the latest reading for the reserve.",
        h.available,
    );
    f.one(
        "pinguard_host_lowest_available_bytes",
        "gauge",
        "The lowest MemAvailable read for the reserve.",
        h.lowest,
    );
    let stopped = ledger::totals().host_reserve_count;
    f.one("pinguard_host_reserve_stopped_total", "counter", "Pinning calls the host reserve stopped (refused, downgraded, or pinned anyway under warn).", stopped);
}

fn cgroup_families(f: &mut Families) {
    let Some(c) = budget::cgroup::floor().snapshot() else {
        return;
    };
    if let Some(r) = budget::cgroup::floor().reserve() {
        f.one(
            "pinguard_cgroup_reserve_bytes",
            "gauge",
            "The cgroup reserve in force: the floor pins keep the memory cgroup's headroom above.",
            r,
        );
    }
    f.one("pinguard_cgroup_limit_bytes", "gauge", "The tightest memory limit on the process's cgroup path, as read when the reserve was set up.", c.total);
    f.one(
        "pinguard_cgroup_headroom_bytes",
        "gauge",
        "The memory cgroup's headroom before its OOM killer at the latest reading for the reserve.",
        c.available,
    );
    f.one(
        "pinguard_cgroup_lowest_headroom_bytes",
        "gauge",
        "The lowest headroom read for the cgroup reserve.",
        c.lowest,
    );
    let stopped = ledger::totals().cgroup_reserve_count;
    f.one("pinguard_cgroup_reserve_stopped_total", "counter", "Pinning calls the cgroup reserve stopped (refused, downgraded, or pinned anyway under warn).", stopped);
}

/// The group's own figures, written alike by every member: `max by (group)` reads them.
fn group_families(f: &mut Families, g: &group::Snapshot) {
    f.one(
        "pinguard_group_pinned_bytes",
        "gauge",
        "Pinned bytes of the whole group, reserved or live (the same in every member's file).",
        g.used,
    );
    f.one(
        "pinguard_group_pinned_peak_bytes",
        "gauge",
        "Most pinned bytes of the group at once (the same in every member's file).",
        g.peak,
    );
    f.one(
        "pinguard_group_members",
        "gauge",
        "Processes in the group (the same in every member's file).",
        g.members as u64,
    );
    f.one(
        "pinguard_group_unavailable_total",
        "counter",
        "This process's pinning calls answered by the policy (refused, downgraded, or pinned anyway under warn) because the group's ledger could not be reached in time.",
        ledger::totals().group_unavailable_count,
    );
    if let Some(b) = g.budget {
        f.one(
            "pinguard_group_budget_bytes",
            "gauge",
            "The group's shared pinned-memory budget (the same in every member's file).",
            b,
        );
    }
    if let Some(r) = g.host_reserve {
        f.one(
            "pinguard_group_host_reserve_bytes",
            "gauge",
            "The largest host reserve a member of the group applies.",
            r,
        );
        if let Some(l) = g.host_lowest_available {
            f.one(
                "pinguard_group_host_lowest_available_bytes",
                "gauge",
                "The lowest MemAvailable a member of the group read for the reserve.",
                l,
            );
        }
        f.one(
            "pinguard_group_host_reserve_stopped_calls",
            "gauge",
            "Pinning calls the host reserve stopped, summed over the members in the group now.",
            g.host_reserve_count,
        );
    }
    if let Some(r) = g.cgroup_reserve {
        f.one("pinguard_group_cgroup_reserve_bytes", "gauge", "The largest cgroup reserve a member in this process's cgroup applies (the group's shared reading of that cgroup).", r);
        if let Some(l) = g.cgroup_lowest_headroom {
            f.one(
                "pinguard_group_cgroup_lowest_headroom_bytes",
                "gauge",
                "The lowest headroom a member in this process's cgroup read for the reserve.",
                l,
            );
        }
        f.one(
            "pinguard_group_cgroup_reserve_stopped_calls",
            "gauge",
            "Pinning calls the cgroup reserve stopped, summed over the members in the group now.",
            g.cgroup_reserve_count,
        );
    }
}

/// This process's liveness file (`textfile::live_name`): a process-shared robust mutex in a
/// shared mapping of one page, locked by the metrics thread for the rest of its life, so that the
/// kernel marks it (`FUTEX_OWNER_DIED`) when that thread ends, however the process ends: a writer
/// in any PID namespace then knows at once. The descriptor is closed once the page is mapped (a
/// mapping survives a program closing every descriptor). Changed under the report lock only.
struct Live {
    pid: i32,
    path: PathBuf,
    map: usize,
    dev: u64,
    ino: u64,
}

static LIVE: Mutex<Option<Live>> = Mutex::new(None);

/// The liveness file's inode for metrics file `path`, made (and locked, on this thread: the
/// metrics thread) the first time; `None` where it cannot be (the metrics then go by the other
/// rules). Under the report lock.
fn live_file(path: &Path) -> Option<u64> {
    let dir = path.parent()?;
    let name = path.file_name()?.to_str()?;
    let target = dir.join(live_name(name));
    let mut live = LIVE.lock();
    let pid = kernel::raw_pid();
    if let Some(l) = live.as_ref().filter(|l| l.pid == pid && l.path == target) {
        return Some(l.ino);
    }
    if let Some(old) = live.take() {
        if old.pid != pid {
            // A fork child's copy of its parent's page: on none of this process's robust lists.
            // SAFETY: the page `make_live` mapped, used by nothing of this process's.
            unsafe { libc::munmap(old.map as *mut libc::c_void, sys::page_size()) };
        } else if let Ok(c) = CString::new(old.path.into_os_string().into_encoded_bytes()) {
            // This process's, for a path that changed (a host name in the template): left locked.
            unlink_if_same(&c, old.dev, old.ino);
        }
    }
    let made = make_live(&target, pid)?;
    let ino = made.ino;
    *live = Some(made);
    Some(ino)
}

/// Whether the liveness name beside metrics file `path` holds a file this process did not make.
fn live_taken(path: &Path) -> bool {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return false;
    };
    let Ok(c) = CString::new(
        dir.join(live_name(name))
            .into_os_string()
            .into_encoded_bytes(),
    ) else {
        return false;
    };
    let Some(there) = sys::path_id(&c) else {
        return false;
    };
    let pid = kernel::raw_pid();
    !LIVE
        .lock()
        .as_ref()
        .is_some_and(|l| l.pid == pid && (l.dev, l.ino) == (there.dev, there.ino))
}

fn make_live(target: &Path, pid: i32) -> Option<Live> {
    let tmp = CString::new(format!("{}.{pid}.tmp", target.display())).ok()?;
    let fd = sys::open(
        &tmp,
        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o600,
    )
    .ok()?;
    let page = sys::page_size();
    // SAFETY: our own new descriptor; a page-sized shared mapping of the file it was grown to.
    let map = unsafe {
        if libc::ftruncate(fd, page as libc::off_t) == 0 {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        }
    };
    let id = sys::file_id(fd);
    sys::close(fd);
    let locked = map != libc::MAP_FAILED && lock_robust(map as *mut libc::pthread_mutex_t);
    let target_c = CString::new(target.as_os_str().as_bytes()).ok();
    // Never over a file at the name: another's (planted), or one this process cannot prove its
    // own; the metrics then go without a liveness file, by the other rules.
    let renamed = locked
        && target_c
            .as_ref()
            .is_some_and(|t| sys::rename_noreplace(&tmp, t).is_ok());
    match (renamed, id) {
        (true, Some(id)) => Some(Live {
            pid,
            path: target.to_path_buf(),
            map: map as usize,
            dev: id.dev,
            ino: id.ino,
        }),
        _ => {
            let _ = sys::unlink(&tmp);
            if map != libc::MAP_FAILED && !locked {
                // SAFETY: the page mapped above, holding no lock of this thread's.
                unsafe { libc::munmap(map, page) };
            }
            None
        }
    }
}

/// Makes `m` a process-shared robust mutex and locks it on this thread, for good.
fn lock_robust(m: *mut libc::pthread_mutex_t) -> bool {
    // SAFETY: `m` is a fresh, zeroed, page-aligned shared page, large enough for a mutex, that
    // nothing else uses; the attribute lives on this stack for the calls that read it.
    unsafe {
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        if libc::pthread_mutexattr_init(&mut attr) != 0 {
            return false;
        }
        let ok = libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED) == 0
            && libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST) == 0
            && libc::pthread_mutex_init(m, &attr) == 0;
        libc::pthread_mutexattr_destroy(&mut attr);
        ok && libc::pthread_mutex_lock(m) == 0
    }
}

/// The file this process wrote last, for its next write (which alone may replace it) and its
/// removal at exit: only that file, if the path still names it. Changed under the report lock
/// only.
struct Own {
    pid: i32,
    /// The template's expansion it was named after (a host name may change it).
    base: PathBuf,
    path: PathBuf,
    dev: u64,
    ino: u64,
}

static OWN: Mutex<Option<Own>> = Mutex::new(None);

fn path_of(template: &str) -> PathBuf {
    crate::output::files::expand(&crate::output::files::with_pid(template))
}

/// Where attempt `n` of this write goes: this process's file while it is its own, else the
/// template's name, then unpredictable ones (a name another's file holds is never used), and
/// the (device, inode) there that this process may replace.
fn target(base: &Path, n: u32) -> (PathBuf, Option<(u64, u64)>) {
    let pid = kernel::raw_pid();
    match OWN.lock().as_ref() {
        Some(o) if n == 0 && o.pid == pid && o.base == base => {
            (o.path.clone(), Some((o.dev, o.ino)))
        }
        _ => (crate::output::files::attempt(base, n), None),
    }
}

/// Rewrites the metrics file if `PINGUARD_METRICS` is set and the process has pinned (never in a
/// setuid process, never once the exit report is decided), then removes dead writers' files
/// from its folder. Only on the metrics thread, which the liveness file's lock stays with.
pub fn write(cfg: &Config) {
    let Some(template) = &cfg.metrics else { return };
    if kernel::secure_mode() || !ledger::touched() {
        return;
    }
    // The kernel's pins that no call explains change without a call pinguard sees: one read of
    // the status per write keeps the gauge (and the budget) current. The locked pages are left
    // to the reports and refusals, which may walk the mappings.
    crate::output::report::kernel_truth(crate::runtime::guard::here(), false);
    let base = path_of(template);
    crate::output::files::make_dirs(&crate::output::files::with_pid(template));
    let mut written = None;
    for n in 0..crate::output::files::ATTEMPTS {
        let (path, own) = target(&base, n);
        if live_taken(&path) {
            continue; // a liveness file of another's beside the name would speak for this one
        }
        let Some(live) = crate::output::report::unless_exiting(|| live_file(&path)) else {
            return;
        };
        let me = Writer { live, ..me(cfg) };
        let text = render(cfg, &me);
        let placed = crate::output::report::unless_exiting(|| {
            let id = crate::output::files::write_placed(&path, MODE, own, |w| {
                w.write_all(text.as_bytes())
            })?;
            *OWN.lock() = Some(Own {
                pid: kernel::raw_pid(),
                base: base.clone(),
                path: path.clone(),
                dev: id.0,
                ino: id.1,
            });
            Ok::<(), std::io::Error>(())
        });
        match placed {
            None => return,
            // Another's file at the name (another user's, planted): another name.
            Some(Err(e)) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Some(Err(e)) => tracing::warn!("metrics not written to {}: {e}", path.display()),
            Some(Ok(())) => written = Some((path, me)),
        }
        break;
    }
    let Some((path, me)) = written else { return };
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        prune(dir, name, &me);
    }
}

/// At exit, once no later write can start (the exit report is decided): this process's file
/// goes, its final figures being in the report. Raw system calls only.
pub fn remove_own() {
    let Some(Own {
        pid,
        path,
        dev,
        ino,
        ..
    }) = OWN.try_lock().and_then(|mut o| o.take())
    else {
        return;
    };
    if pid != kernel::raw_pid() {
        return; // the parent's, inherited over `fork`
    }
    let Ok(c) = CString::new(path.into_os_string().into_encoded_bytes()) else {
        return;
    };
    unlink_if_same(&c, dev, ino);
    if let Some(live) = LIVE
        .try_lock()
        .and_then(|mut l| l.take())
        .filter(|l| l.pid == pid)
    {
        if let Ok(c) = CString::new(live.path.into_os_string().into_encoded_bytes()) {
            unlink_if_same(&c, live.dev, live.ino);
        }
    }
}

/// At start-up: a file at this process's path left by the image it replaced (`exec` keeps the
/// pid and the start time, so no other writer could tell it dead) goes.
pub fn forget_previous_image(cfg: &Config) {
    let Some(template) = &cfg.metrics else { return };
    if kernel::secure_mode() {
        return;
    }
    let path = path_of(template);
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    let Some(found) = look(&c) else { return };
    let me = (kernel::raw_pid() as u32, kernel::start_ticks());
    if (found.writer.pid, found.writer.start) == me && found.writer.pidns == kernel::pid_namespace()
    {
        unlink_if_same(&c, found.dev, found.ino);
        if let Some((_, dev, ino, lc)) = live_word(&path, &found.writer) {
            unlink_if_same(&lc, dev, ino);
        }
    }
}

/// What `look` found: a file of pinguard's, its writer, age and identity.
struct Found {
    writer: Writer,
    age_ms: Option<u64>,
    dev: u64,
    ino: u64,
}

/// A regular file of this user's, not followed through a symbolic link, that starts with a
/// writer's line; `None` for anything else. The descriptor is closed before returning.
fn look(path: &CStr) -> Option<Found> {
    let fd = sys::open(
        path,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    )
    .ok()?;
    let st = sys::stat(fd);
    let mut head = [0u8; HEAD_BYTES];
    // SAFETY: geteuid has no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let ours = st
        .as_ref()
        .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == euid);
    let n = if ours {
        sys::read(fd, &mut head).unwrap_or(0)
    } else {
        0
    };
    sys::close(fd);
    let st = st?;
    let writer = Writer::parse(&head[..n])?;
    let modified = std::time::UNIX_EPOCH
        + std::time::Duration::new(
            st.st_mtime.max(0) as u64,
            st.st_mtime_nsec.clamp(0, 999_999_999) as u32,
        );
    let age_ms = std::time::SystemTime::now()
        .duration_since(modified)
        .ok()
        .map(|d| d.as_millis() as u64);
    Some(Found {
        writer,
        age_ms,
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// Unlinks `path` if it still names the file `(dev, ino)` (a writer may have renamed a new one
/// into its place meanwhile).
fn unlink_if_same(path: &CStr, dev: u64, ino: u64) {
    if sys::path_id(path).is_some_and(|id| (id.dev, id.ino) == (dev, ino)) {
        let _ = sys::unlink(path);
    }
}

/// The lock word of the liveness file beside metrics file `path`, if it is the one `w` names
/// (same inode, a regular file of this user's): read, never locked.
fn live_word(path: &Path, w: &Writer) -> Option<(u32, u64, u64, CString)> {
    let ino = w.live?;
    let name = path.file_name()?.to_str()?;
    let c = CString::new(
        path.parent()?
            .join(live_name(name))
            .into_os_string()
            .into_encoded_bytes(),
    )
    .ok()?;
    let fd = sys::open(&c, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0).ok()?;
    let st = sys::stat(fd);
    // SAFETY: geteuid has no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let ours = st.as_ref().is_some_and(|st| {
        st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == euid && st.st_ino == ino
    });
    let mut word = [0u8; 4];
    let read = ours && sys::read_exact_at(fd, &mut word, 0).is_some();
    sys::close(fd);
    let st = st?;
    read.then(|| (u32::from_ne_bytes(word), st.st_dev, st.st_ino, c))
}

/// Whether the process `pid` of this namespace has ended: `Some(true)` gone (or a zombie, or
/// another process with the pid), `Some(false)` running, `None` when `/proc` does not say.
fn ended(pid: u32, start: u64) -> Option<bool> {
    let path = CString::new(format!("/proc/{pid}/stat")).ok()?;
    let fd = match sys::open_read(&path) {
        Ok(fd) => fd,
        Err(libc::ENOENT | libc::ESRCH) => return Some(true),
        Err(_) => return None,
    };
    let mut buf = [0u8; 1024];
    let n = sys::read(fd, &mut buf);
    sys::close(fd);
    stat_says_ended(std::str::from_utf8(&buf[..n.ok()?]).ok()?, start)
}

/// Where the last pass stopped, among the candidate files, for a folder of more than
/// `MAX_EXAMINED`.
static CURSOR: AtomicUsize = AtomicUsize::new(0);

/// One bounded pass over the folder: the `.prom` files of pinguard's whose writers are proven
/// dead are removed; every other file is left alone.
fn prune(dir: &Path, own: &OsStr, me: &Writer) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let skip = CURSOR.load(Ordering::Relaxed);
    let (mut index, mut examined, mut stopped) = (0, 0, None);
    for entry in entries.take(MAX_NAMES).flatten() {
        let name = entry.file_name();
        let b = name.as_bytes();
        // The regular files only (the directory entry's own type: a link is never followed).
        if name == own || !candidate_name(b) || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        index += 1;
        if index <= skip {
            continue;
        }
        if examined == MAX_EXAMINED {
            stopped = Some(index - 1);
            break;
        }
        examined += 1;
        let Ok(c) = CString::new(dir.join(&name).into_os_string().into_encoded_bytes()) else {
            continue;
        };
        if let Some(found) = look(&c) {
            let path = dir.join(&name);
            let live = live_word(&path, &found.writer);
            if found
                .writer
                .proven_dead(found.age_ms, me.pidns, live.as_ref().map(|l| l.0), ended)
            {
                unlink_if_same(&c, found.dev, found.ino);
                if let Some((_, dev, ino, lc)) = live {
                    unlink_if_same(&lc, dev, ino);
                }
            }
        }
    }
    // The directory's descriptor is closed here (`entries` is dropped): none is kept.
    CURSOR.store(stopped.unwrap_or(0), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_lives_and_a_reused_pid_is_another() {
        let (pid, start) = (kernel::raw_pid() as u32, kernel::start_ticks());
        assert_eq!(ended(pid, start), Some(false));
        assert_eq!(ended(pid, start + 1), Some(true));
        assert_eq!(ended(999_999_999, start), Some(true), "beyond any pid_max");
    }
}
