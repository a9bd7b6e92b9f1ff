//! `pinguard run`: the command under the preload library, its exit status passed on, then a
//! summary of every report it and its descendants wrote.

use crate::merge::{short_label, Merged};
use crate::out::table;
use pinguard_report::units::format_bytes;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

pub struct Options {
    pub env: Vec<(&'static str, String)>,
    pub report: Option<String>,
    pub lib: Option<PathBuf>,
    pub cmd: Vec<OsString>,
}

pub const DEFAULT_TEMPLATE: &str = "pinguard-reports/%e.%p.json";

/// `libpinguard.so` beside the `pinguard` binary (a cargo build, an unpacked release), or in
/// `../lib/` (an installed prefix).
pub fn find_library(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return if p.is_file() { Ok(p.to_path_buf()) } else { Err(format!("--lib {}: no such file", p.display())) };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate the pinguard binary: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join("libpinguard.so"), dir.join("../lib/libpinguard.so"), dir.join("../lib/pinguard/libpinguard.so")];
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or(p.clone()))
        .ok_or_else(|| format!("cannot find libpinguard.so beside {} (build it with `cargo build --release`, or pass --lib)", exe.display()))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill takes only integers and is async-signal-safe; `pid` is our own child.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Runs the command; returns the exit status `pinguard run` should end with.
pub fn run(o: Options) -> i32 {
    let lib = match find_library(o.lib.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("pinguard run: {e}");
            return 2;
        }
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let template = o.report.clone().unwrap_or_else(|| DEFAULT_TEMPLATE.to_string());
    let template_abs = if template.starts_with('/') { PathBuf::from(&template) } else { cwd.join(&template) };
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut v = lib.clone().into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => lib.clone().into_os_string(),
    };
    let mut cmd = Command::new(&o.cmd[0]);
    cmd.args(&o.cmd[1..]).env("LD_PRELOAD", preload).env("PINGUARD_REPORT", &template_abs);
    for (k, v) in &o.env {
        cmd.env(k, v);
    }
    let start = now_ms();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pinguard run: cannot run {}: {e}", o.cmd[0].to_string_lossy());
            return 127;
        }
    };
    CHILD.store(child.id() as i32, Ordering::Relaxed);
    // Like a shell: the terminal's ^C reaches the command itself; pinguard stays to summarise.
    // SAFETY: the dispositions are SIG_IGN or `forward`, an `extern "C" fn(c_int)` that only does
    // an atomic load and the async-signal-safe `kill`.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, forward as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward as *const () as libc::sighandler_t);
    }
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("pinguard run: waiting for the command: {e}");
                return 2;
            }
        }
    };
    let code = match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
        (Some(c), _) => c,
        (None, Some(sig)) => {
            eprintln!("pinguard run: the command was killed by signal {sig}");
            128 + sig
        }
        _ => 1,
    };
    eprint!("{}", summarise(&template_abs, start));
    code
}

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

pub fn summarise(template: &Path, start_ms: u64) -> String {
    let root = search_root(template);
    let (files, _) = crate::input::expand(&[root.clone()]);
    let mut m = Merged::default();
    for f in files {
        let Ok(bytes) = std::fs::read(&f) else { continue };
        // Reports of earlier runs in the same place are not this run's.
        if let Ok(r) = pinguard_report::view::ReportView::parse(&bytes) {
            if r.process.start_unix_ms + 1000 >= start_ms && r.process.write_unix_ms >= start_ms {
                m.add(&f, &r);
            }
        }
    }
    m.sort();
    if m.reports == 0 {
        return format!("pinguard run: no reports under {} (nothing was pinned)\n", root.display());
    }
    let mut s = format!("\npinguard run: {} report(s) under {}\n", m.reports, root.display());
    let mut rows = vec![["PID", "EXE", "LIVE", "COUNT", "PEAK", "DENIED", "DOWNGRADED", "BUDGET", "REPORT"].map(String::from).to_vec()];
    for p in &m.per_process {
        rows.push(vec![
            p.pid.to_string(),
            crate::merge::basename(&p.exe).to_string(),
            format_bytes(p.totals.live_bytes),
            p.totals.live_count.to_string(),
            format_bytes(p.totals.peak_live_bytes),
            p.totals.denied_count.to_string(),
            p.totals.downgraded_count.to_string(),
            p.budget_bytes.map(format_bytes).unwrap_or_else(|| "-".into()),
            p.path.clone(),
        ]);
    }
    s.push_str(&table(&rows, &[true, false, true, true, true, true, true, true, false]));
    let top: Vec<_> = m.callsites.iter().filter(|c| c.live_bytes > 0 || c.denied_count > 0).take(5).collect();
    if !top.is_empty() {
        s.push_str("\nTop callsites:\n");
        let mut rows = vec![["LIVE", "DENIED", "API", "CALLSITE"].map(String::from).to_vec()];
        for c in top {
            rows.push(vec![format_bytes(c.live_bytes), c.denied_count.to_string(), c.apis.iter().cloned().collect::<Vec<_>>().join(","), short_label(c)]);
        }
        s.push_str(&table(&rows, &[true, true, false, false]));
    }
    let t = &m.totals;
    s.push_str(&format!(
        "\nTotal: {} pinned in {} allocations across {} process(es), {} denied, {} downgraded. Details: pinguard report {}\n",
        format_bytes(t.live_bytes),
        t.live_count,
        m.processes,
        t.denied_count,
        t.downgraded_count,
        root.display()
    ));
    s
}
