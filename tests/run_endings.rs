//! `pinguard run` says how each process it ran ended: a command killed by `SIGKILL` is "killed by
//! SIGKILL", with what it held when that is known, never "nothing was pinned"; a report template
//! that cannot work stops it before the command starts; a signal sent to `run` reaches the
//! command, and `run` exits with the command's status.

use crate::common;
use common::*;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const MIB3: &str = "3145728";
/// How `pinguard report` names run_ending.c's callsite.
const SITE: &str = "pin_buffer (run_ending.c:";

fn prog() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| fixture_set("run_endings").join("run_ending"))
}

/// The `pinguard` binary cargo built beside this test (`cargo build --workspace`, or `cargo test
/// --workspace`, which builds it for the CLI's own tests); refused when older than its sources,
/// or the test would pass or fail on yesterday's code.
fn pinguard_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("pinguard");
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: run `cargo build --workspace` first",
                bin.display()
            )
        });
    for dir in ["cli/src", "common/src"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let e = e.unwrap();
            let changed = e.metadata().unwrap().modified().unwrap();
            assert!(
                changed <= built,
                "{} is older than {}: run `cargo build --workspace` first",
                bin.display(),
                e.path().display()
            );
        }
    }
    bin
}

/// The programs here are host programs: under qemu (PGTEST_TARGET=aarch64) there is nothing to run.
fn skip() -> bool {
    if aarch64() {
        eprintln!("SKIPPED: pinguard run starts host programs");
    }
    aarch64()
}

/// `pinguard [run flags] -- cmd` in `dir`, with `bin` and `lib` (copies an unprivileged user can
/// reach, or the build's own), on a clean `PINGUARD_*` environment.
fn run_with(bin: &Path, lib: &Path, dir: &Path, flags: &[&str], cmd: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.current_dir(dir)
        .arg("run")
        .arg("--lib")
        .arg(lib)
        .args(flags)
        .arg("--")
        .args(cmd);
    for (k, _) in std::env::vars() {
        if k.starts_with("PINGUARD_") || k.starts_with("EMU_") {
            c.env_remove(k);
        }
    }
    c
}

fn run_in(dir: &Path, flags: &[&str], cmd: &[&str]) -> Command {
    run_with(&pinguard_bin(), &fixtures().lib, dir, flags, cmd)
}

fn template(dir: &Path) -> String {
    dir.join("%e.%p.json").to_string_lossy().into_owned()
}

/// The one line of `err` that contains `what`.
fn line_of<'a>(err: &'a str, what: &str) -> &'a str {
    let found: Vec<&str> = err.lines().filter(|l| l.contains(what)).collect();
    assert_eq!(found.len(), 1, "expected one line with {what:?} in:\n{err}");
    found[0]
}

/// Whether the library left the state of a process that died without its report (item 1 of the
/// same issue, landing beside this): the command's line then says what that state held.
fn has_state(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".state"))
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill takes only integers; `pid` is a process this test started.
    unsafe { libc::kill(pid, sig) };
}

/// `pinguard run` started with its output piped, once the program under it has pinned: returns
/// it, its stdout and the program's pid.
// The lint misses that the child is handed to the caller, which waits for it.
#[allow(clippy::zombie_processes)]
fn start(cmd: &mut Command) -> (Child, BufReader<ChildStdout>, i32) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            let o = child.wait_with_output().unwrap();
            panic!(
                "the program never said it pinned ({:?}):\n{}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
        }
        if let Some(p) = line.trim().strip_prefix("pinned pid=") {
            return (child, out, p.parse().unwrap());
        }
    }
}

/// Waits for `run` to end, with a deadline: a hang (a signal never forwarded) fails the test
/// instead of hanging it. Returns its status and stderr.
fn finish(
    mut child: Child,
    _out: BufReader<ChildStdout>,
    prog_pid: i32,
    limit: Duration,
) -> (ExitStatus, String) {
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            kill(prog_pid, libc::SIGKILL);
            kill(child.id() as i32, libc::SIGKILL);
            let o = child.wait_with_output().unwrap();
            panic!(
                "pinguard run had not ended after {limit:?}:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!err.contains("panicked"), "{err}");
    (status, err)
}

/// Until the program's first interval report is in `dir`.
fn wait_for_report(dir: &Path) {
    let t0 = Instant::now();
    while reports_in(dir).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no interval report in {} after a minute",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_command_killed_by_sigkill_is_said_to_be_killed_never_to_have_pinned_nothing() {
    if skip() {
        return;
    }
    let p = prog().to_str().unwrap();

    // Killed with no chance to write anything: no report. The state the library keeps beside it
    // (where it does) says what it held; without one, `run` says that nothing was left, not that
    // nothing was pinned.
    let dir = fresh_dir("run-killed");
    let o = run_in(&dir, &["--report", &template(&dir)], &[p, MIB3, "raise:9"])
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(137), "{err}");
    let pid = out
        .trim()
        .strip_prefix("pinned pid=")
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        !err.contains("nothing was pinned"),
        "the command pinned 3 MiB:\n{err}"
    );
    let line = line_of(
        &err,
        &format!("pid {pid} (run_ending, the command): killed by SIGKILL;"),
    );
    if has_state(&dir) {
        assert!(
            line.contains(&format!("its last state: 3.00 MiB pinned by {SITE}")),
            "{err}"
        );
    } else {
        assert!(line.contains("it left no report or state under"), "{err}");
    }

    // Killed from outside (as the OOM killer does) after an interval report: what it held then.
    let dir = fresh_dir("run-killed-interval");
    let (child, out, pid) = start(&mut run_in(
        &dir,
        &["--interval", "100ms", "--report", &template(&dir)],
        &[p, MIB3, "wait"],
    ));
    wait_for_report(&dir);
    kill(pid, libc::SIGKILL);
    let (status, err) = finish(child, out, pid, Duration::from_secs(60));
    assert_eq!(status.code(), Some(137), "{err}");
    let line = line_of(
        &err,
        &format!("pid {pid} (run_ending, the command): killed by SIGKILL; "),
    );
    assert!(
        line.contains(&format!("its last state: 3.00 MiB pinned by {SITE}")),
        "{err}"
    );

    // A descendant killed the same way while the command goes on to exit 5: each gets its line.
    let dir = fresh_dir("run-killed-child");
    let mut cmd = run_in(
        &dir,
        &["--interval", "100ms", "--report", &template(&dir)],
        &["sh", "-c", "\"$0\" 1048576 wait; exit 5", p],
    );
    let (child, out, pid) = start(&mut cmd);
    wait_for_report(&dir);
    kill(pid, libc::SIGKILL);
    let (status, err) = finish(child, out, pid, Duration::from_secs(60));
    assert_eq!(status.code(), Some(5), "{err}");
    let line = line_of(&err, &format!("pid {pid} (run_ending): "));
    assert!(
        line.contains(&format!("its last state: 1.00 MiB pinned by {SITE}")),
        "{err}"
    );
    line_of(
        &err,
        "(sh, the command): exited with status 5; it left no report",
    );
    assert!(!err.contains("nothing was pinned"), "{err}");
}

#[test]
fn a_report_template_that_cannot_work_stops_run_before_the_command_starts() {
    if skip() {
        return;
    }
    let dir = fresh_dir("run-templates");
    std::fs::write(dir.join("afile"), "").unwrap();
    std::fs::create_dir(dir.join("adir")).unwrap();
    for (t, why) in [
        ("r/%q.json", "unknown escape \"%q\""),
        ("r/100%", "ends with a lone %"),
        ("afile/%e.%p.json", "afile is not a directory"),
        ("afile/sub/%p.json", "afile is not a directory"),
        ("r/", "names a directory"),
        ("", "empty"),
    ] {
        let o = run_in(&dir, &["--report", t], &["sh", "-c", "touch ran"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "--report {t:?}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "--report {t:?}: one line: {err}");
        assert!(
            lines[0].starts_with("pinguard run: ") && lines[0].contains(why),
            "--report {t:?}: {err}"
        );
        assert!(!dir.join("ran").exists(), "--report {t:?}: the command ran");
    }
    // A template the library accepts, in a directory still to be made, runs.
    let o = run_in(
        &dir,
        &["--report", "new/%h/%e.%p.json"],
        &["sh", "-c", "touch ran"],
    )
    .output()
    .unwrap();
    assert!(o.status.success() && dir.join("ran").exists(), "{o:?}");
    // Issue 46 item 12: an existing directory means a file in it.
    let o = run_in(
        &dir,
        &["--report", "adir"],
        &[
            fixtures().dir.join("scenario").to_str().unwrap(),
            "cuda_alloc:4096",
        ],
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "--report adir: {o:?}");
    assert_eq!(
        reports_in(&dir.join("adir")).len(),
        1,
        "--report adir: {o:?}"
    );
}

/// Where `nobody` can reach the binaries, for the checks that need an unwritable directory (root
/// writes anywhere): a temporary directory, removed on drop.
struct Unprivileged {
    base: PathBuf,
    prefix: Vec<String>,
}

impl Unprivileged {
    fn new() -> Option<Unprivileged> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if root
            && !have(
                "setpriv",
                "to check unwritable directories as an unprivileged user",
            )
        {
            return None;
        }
        let base =
            std::env::temp_dir().join(format!("pinguard-run-endings-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let u = Unprivileged {
            prefix: if root {
                [
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                ]
                .map(String::from)
                .to_vec()
            } else {
                Vec::new()
            },
            base,
        };
        let f = fixtures();
        for (from, to) in [
            (pinguard_bin(), "pinguard"),
            (f.lib.clone(), "libpinguard.so"),
            (prog().to_path_buf(), "run_ending"),
            (f.dir.join("libcudart.so"), "libcudart.so"),
        ] {
            std::fs::copy(&from, u.base.join(to)).unwrap();
        }
        for (sub, mode) in [(".", 0o755), ("ro", 0o555), ("tmp", 0o777)] {
            let d = u.base.join(sub);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
        }
        Some(u)
    }

    fn run(&self, cwd: &str, flags: &[&str], cmd: &[&str]) -> Command {
        let (bin, lib) = (self.base.join("pinguard"), self.base.join("libpinguard.so"));
        let inner = run_with(&bin, &lib, &self.base.join(cwd), flags, cmd);
        if self.prefix.is_empty() {
            return inner;
        }
        let mut c = Command::new(&self.prefix[0]);
        c.args(&self.prefix[1..])
            .arg(inner.get_program())
            .args(inner.get_args())
            .current_dir(self.base.join(cwd));
        for (k, v) in inner.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }
}

impl Drop for Unprivileged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

#[test]
fn an_unwritable_report_directory_stops_run_and_the_default_falls_back_as_the_library_does() {
    if skip() {
        return;
    }
    let Some(u) = Unprivileged::new() else { return };
    let b = u.base.display().to_string();
    let marker = format!("touch {b}/tmp/ran");
    let o = u
        .run(
            ".",
            &["--report", &format!("{b}/ro/sub/%e.%p.json")],
            &["sh", "-c", &marker],
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("{b}/ro is not writable (permission denied)")),
        "{err}"
    );
    assert!(!u.base.join("tmp/ran").exists(), "the command ran");

    // The default template, in a working directory it cannot write: the temporary directory, as
    // the library's own default does, and `run` says so and summarises from there.
    let mut cmd = u.run("ro", &[], &[&format!("{b}/run_ending"), MIB3, "exit"]);
    let o = cmd.env("TMPDIR", u.base.join("tmp")).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    line_of(
        &err,
        &format!(
            "{b}/ro is not writable (permission denied); reports go to {b}/tmp/pinguard-reports"
        ),
    );
    line_of(&err, &format!("(run_ending, the command): exited with status 0; 3.00 MiB still pinned at exit by {SITE}"));
    // In the run's own folder there.
    let runs: Vec<_> = std::fs::read_dir(u.base.join("tmp/pinguard-reports"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1, "{err}");
    assert_eq!(reports_in(&runs[0]).len(), 1, "{err}");
}

#[test]
fn a_signal_to_run_itself_reaches_the_command_and_run_exits_with_its_status() {
    if skip() {
        return;
    }
    let p = prog().to_str().unwrap();
    for (sig, name) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let dir = fresh_dir("run-signalled");
        let mut cmd = run_in(&dir, &["--report", &template(&dir)], &[p, MIB3, "wait"]);
        // `run` keeps an ignored signal ignored (`nohup pinguard run`), so a test started under
        // nohup would wait forever for a SIGHUP to end it: give `run` the default dispositions.
        // SAFETY: the closure runs in the child between fork and exec and only calls `signal`,
        // which is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                    libc::signal(s, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let (child, out, pid) = start(&mut cmd);
        kill(child.id() as i32, sig);
        let (status, err) = finish(child, out, pid, Duration::from_secs(60));
        // An exit status, not a death: `run` outlived the signal, and passes on the command's.
        assert_eq!(status.code(), Some(128 + sig), "{name}: {status:?}\n{err}");
        let line = line_of(
            &err,
            &format!("pid {pid} (run_ending, the command): killed by {name};"),
        );
        assert!(
            !err.contains("nothing was pinned"),
            "{name}: the command pinned 3 MiB:\n{err}"
        );
        if reports_in(&dir).is_empty() && !has_state(&dir) {
            assert!(line.contains("it left no report or state under"), "{err}");
        } else {
            assert!(
                line.contains(&format!("its last state: 3.00 MiB pinned by {SITE}")),
                "{err}"
            );
        }
    }
}
