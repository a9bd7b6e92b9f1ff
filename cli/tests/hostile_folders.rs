//! Issue 43, items 4, 5 (the readers) and 6: the CLI in folders other users write to. A FIFO, a
//! link to `/dev/zero`, a sparse 3 GB file and loops of links cost each reader one line and no
//! time; names the CLI makes in `/dev/shm` cannot be made first by someone else; a metrics file
//! another user wrote is not shown under a process it does not belong to; and a killed
//! `run --group-budget` leaves no System V semaphore set behind.

use crate::common;

use common::*;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Every reader here must be done well within this, where a FIFO held it for ever before.
const PROMPT: Duration = Duration::from_secs(20);

fn pinguard_bounded(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pinguard"));
    cmd.args(args).env_remove("LD_PRELOAD");
    run_bounded(&mut cmd, PROMPT)
}

fn err_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o666) };
    assert_eq!(rc, 0, "{}", p.display());
}

/// A 3 GB file of holes: nothing on disk, 3 GB to whoever reads it.
fn sparse(p: &Path) {
    std::fs::File::create(p)
        .unwrap()
        .set_len(3_000_000_000)
        .unwrap();
}

/// The traps, each under a name the reader looks for (`ext`): a FIFO, a link to `/dev/zero`, a
/// sparse 3 GB file, a link to itself; and a link to the folder itself (a loop for a walk).
fn traps(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let t: Vec<PathBuf> = ["fifo", "zero", "sparse", "loop"]
        .iter()
        .map(|n| dir.join(format!("{n}.{ext}")))
        .collect();
    mkfifo(&t[0]);
    std::os::unix::fs::symlink("/dev/zero", &t[1]).unwrap();
    sparse(&t[2]);
    std::os::unix::fs::symlink(&t[3], &t[3]).unwrap();
    t
}

/// The lines of `err` that name `p`.
fn lines_naming<'a>(err: &'a str, p: &Path) -> Vec<&'a str> {
    let name = p.display().to_string();
    err.lines()
        .filter(|l| l.contains(&format!("{name}:")))
        .collect()
}

/// A small report of one process, as a reader expects it.
fn report(dir: &Path, name: &str, modules: &[&str]) -> PathBuf {
    let frames: Vec<_> = modules
        .iter()
        .map(|m| {
            serde_json::json!({"addr": "0x401000", "module": m, "offset": "0x1000",
                "symbol": "load_weights", "file": null, "line": null})
        })
        .collect();
    let mods: Vec<_> = modules
        .iter()
        .map(|m| serde_json::json!({"path": m, "base": "0x400000", "build_id": null}))
        .collect();
    let r = serde_json::json!({
        "schema": "pinguard.report.v1", "reason": "exit",
        "process": {"pid": 77, "ppid": 1, "exe": "/bin/app", "cmdline": ["app"], "hostname": "h",
                    "start_unix_ms": 1000, "write_unix_ms": 2000},
        "config": {"budget_bytes": null, "policy": "error", "depth": 32, "hooks": ["cuda"], "errors": []},
        "totals": {"live_bytes": 4096, "live_count": 1, "peak_live_bytes": 4096, "alloc_count": 1,
                   "alloc_bytes": 4096, "release_count": 0, "failed_count": 0, "denied_count": 0,
                   "denied_bytes": 0, "downgraded_count": 0, "downgraded_bytes": 0,
                   "downgraded_live_bytes": 0, "over_budget_count": 0, "unknown_release_count": 0},
        "apis": {}, "kernel": {"vm_lck_bytes": 0, "vm_pin_bytes": 0, "rlimit_memlock_bytes": null},
        "modules": mods,
        "callsites": [{"id": 0, "apis": ["cudaHostAlloc"], "live_bytes": 4096, "live_count": 1,
                       "peak_live_bytes": 4096, "alloc_count": 1, "alloc_bytes": 4096,
                       "denied_count": 0, "downgraded_count": 0, "frames": frames}],
        "live": [], "events": [], "timeline": [[1000, 0], [1500, 4096]]
    });
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec(&r).unwrap()).unwrap();
    p
}

#[test]
fn report_folders_with_fifos_devices_sparse_files_and_loops_are_read_promptly() {
    let dir = fresh_dir("hostile-report");
    report(&dir, "good.json", &[]);
    let t = traps(&dir, "json");
    // A loop for the walk: a link to the folder itself, and a state file that is a FIFO.
    std::os::unix::fs::symlink(&dir, dir.join("again")).unwrap();
    let state = dir.join("p.state");
    mkfifo(&state);
    let d = dir.to_str().unwrap();
    for args in [
        &["report", d][..],
        &["check", "--max-live", "1M", d],
        &["report", "--json", d],
    ] {
        let o = pinguard_bounded(args);
        let err = err_of(&o);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
        for p in t.iter().chain([&dir.join("again"), &state]) {
            assert_eq!(
                lines_naming(&err, p).len(),
                1,
                "{args:?}: {}: {err}",
                p.display()
            );
        }
        assert!(
            lines_naming(&err, &t[0])[0].contains("a FIFO, not a regular file")
                && lines_naming(&err, &t[1])[0].contains("a symbolic link; not followed")
                && lines_naming(&err, &t[2])[0]
                    .contains("3000000000 bytes, more than a report may be"),
            "{err}"
        );
    }
    // Named on the command line, a FIFO is an error of its own, not a wait.
    let o = pinguard_bounded(&["report", t[0].to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert_eq!(err_of(&o).lines().count(), 1, "{o:?}");
    // A report whose module list names a FIFO and a device: its frames are named without them.
    let fifo_mod = dir.join("lib.so");
    mkfifo(&fifo_mod);
    let named = fresh_dir("hostile-modules");
    report(&named, "r.json", &[fifo_mod.to_str().unwrap(), "/dev/zero"]);
    let o = pinguard_bounded(&["report", named.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}

/// `top --metrics` over the traps, and over another user's file that claims a process of root's.
#[test]
fn top_and_prune_skip_traps_and_files_not_their_writers() {
    let dir = fresh_dir("hostile-metrics");
    let t = traps(&dir, "prom");
    let me = std::process::id();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let start = pinguard_common::state::stat_start_ticks(&stat).unwrap();
    let ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let ns = pinguard_common::textfile::ns_inode(ns.as_os_str().as_encoded_bytes()).unwrap();
    let file = |pinned: u64| {
        let w = pinguard_common::textfile::Writer {
            pid: me,
            start,
            pidns: Some(ns),
            interval_ms: 15000,
            live: None,
        };
        format!(
            "{}pinguard_process_pinned_bytes{{pid=\"{me}\",exe=\"app\"}} {pinned}\n",
            w.line()
        )
    };
    // This process's own file, and one another user wrote claiming this process: 100 GiB.
    std::fs::write(dir.join("mine.prom"), file(4096)).unwrap();
    let forged = dir.join("forged.prom");
    std::fs::write(&forged, file(100 << 30)).unwrap();
    let other = throwaway_user();
    let chown = |p: &Path| {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path.
        let rc = unsafe { libc::lchown(c.as_ptr(), other.uid, other.uid) };
        assert_eq!(rc, 0);
    };
    chown(&forged);
    let o = pinguard_bounded(&["top", "--metrics", dir.to_str().unwrap(), "--once"]);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), err_of(&o));
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        out.lines()
            .next()
            .unwrap()
            .ends_with("4.00 KiB pinned in 1 process"),
        "only this process's own file: {out}\n{err}"
    );
    assert!(!out.contains("100 GiB"), "{out}");
    let forged_lines = lines_naming(&err, &forged);
    assert!(
        forged_lines.len() == 1
            && forged_lines[0].contains(&format!("owned by user {}", other.uid)),
        "{err}"
    );
    for p in &t {
        assert_eq!(lines_naming(&err, p).len(), 1, "{}: {err}", p.display());
    }
    // metrics-prune: the forged file is named and left alone (its claimed writer runs), the traps
    // are named, and this process's file stays.
    let o = pinguard_bounded(&["metrics-prune", dir.to_str().unwrap()]);
    let err = err_of(&o);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(forged.exists() && dir.join("mine.prom").exists());
    assert_eq!(lines_naming(&err, &forged).len(), 1, "{err}");
    for p in [&t[0], &t[1], &t[3]] {
        assert_eq!(lines_naming(&err, p).len(), 1, "{}: {err}", p.display());
    }
    assert!(String::from_utf8_lossy(&o.stdout).is_empty(), "{o:?}");
}

/// A user made for the test, removed when it ends.
struct User {
    name: String,
    uid: u32,
}

impl Drop for User {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

fn throwaway_user() -> User {
    let name = format!("pgc{}", std::process::id() % 100_000);
    let _ = Command::new("userdel").arg(&name).output();
    let o = Command::new("useradd")
        .args(["--no-create-home", "--shell", "/usr/sbin/nologin", &name])
        .output()
        .expect("useradd (the test runs as root)");
    assert!(o.status.success(), "{o:?}");
    let o = Command::new("id").args(["-u", &name]).output().unwrap();
    let uid = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    User { name, uid }
}

/// A file in a shared place, removed when the test ends, however it ends.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `top --group` on a ledger name that is a trap: one line, exit 2, at once.
#[test]
fn top_group_on_a_trap_says_so_at_once() {
    for (i, kind) in ["fifo", "zero", "sparse", "loop"].iter().enumerate() {
        let name = format!("hostile-{}-{i}", std::process::id());
        let path = PathBuf::from(pinguard_common::group::path(&name));
        let _ = std::fs::remove_file(&path);
        match *kind {
            "fifo" => mkfifo(&path),
            "zero" => std::os::unix::fs::symlink("/dev/zero", &path).unwrap(),
            "sparse" => sparse(&path),
            _ => std::os::unix::fs::symlink(&path, &path).unwrap(),
        }
        let _gone = Removed(path.clone());
        let o = pinguard_bounded(&["top", "--group", &name, "--once"]);
        let err = err_of(&o);
        assert_eq!(o.status.code(), Some(2), "{kind}: {o:?}");
        assert_eq!(err.lines().count(), 1, "{kind}: {err}");
        assert!(err.contains(&path.display().to_string()), "{kind}: {err}");
    }
}

/// This machine's local time as `run` names its folder (`YYYYMMDD-HHMMSS`), `secs` from now.
fn local_stamp(secs: i64) -> String {
    let t = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        + secs) as libc::time_t;
    // SAFETY: a zeroed `tm` is a valid out-parameter; localtime_r writes only into it.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm
    };
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Another user makes the ledger names `run --group-budget` would use (its start time and pid)
/// before it starts: FIFOs and links to `/dev/zero`. The run still ends, with its own group.
#[test]
fn run_group_budget_names_cannot_be_taken_first() {
    let f = fixtures();
    let dir = fresh_dir("hostile-run");
    // `sh` waits for a line, then becomes `pinguard run` under its own pid.
    let mut sh = Command::new("sh")
        .arg("-c")
        .arg("read x; exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_pinguard"))
        .args(["run", "--lib", f.lib.to_str().unwrap(), "--report"])
        .arg(dir.join("%e.%p.json"))
        .args(["--group-budget", "1M", "--"])
        .arg(f.dir.join("scenario"))
        .arg("cuda_alloc:4096")
        .env_remove("LD_PRELOAD")
        .env_remove("PINGUARD_GROUP")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = sh.id();
    let mut planted = Vec::new();
    for s in -2..=30 {
        let name = format!("run-{}-{pid}", local_stamp(s));
        let path = PathBuf::from(pinguard_common::group::path(&name));
        if s % 2 == 0 {
            mkfifo(&path);
        } else {
            std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        }
        planted.push(Removed(path));
    }
    std::io::Write::write_all(sh.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let started = std::time::Instant::now();
    let done = loop {
        if let Some(s) = sh.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > PROMPT {
            // SAFETY: signals the test's own child process group.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = sh.wait_with_output().unwrap();
    let planted_left = planted.iter().all(|p| p.0.symlink_metadata().is_ok());
    drop(planted);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(done.is_some_and(|s| s.success()), "hung or failed: {out:?}");
    assert!(planted_left, "another user's names are not removed");
    let line = err
        .lines()
        .find(|l| l.starts_with("pinguard run: --group-budget 1M: group run-"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("of 1.00 MiB pinned") && line.contains("peak 4.00 KiB"),
        "{line}"
    );
}

/// The lines of `/proc/sysvipc/sem` after its header: the sets of this thread's IPC namespace.
fn semaphore_sets() -> usize {
    std::fs::read_to_string("/proc/sysvipc/sem")
        .unwrap()
        .lines()
        .skip(1)
        .count()
}

/// `pinguard run --group-budget` whose command holds 4 KiB and is SIGKILLed; `run` itself too
/// when `kill_run`. The run's pid. Each run in a folder of its own: its summary reads only it.
fn killed_run(kill_run: bool) -> u32 {
    let f = fixtures();
    let dir = fresh_dir("hostile-sem");
    let mut run = Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args(["run", "--lib", f.lib.to_str().unwrap(), "--report"])
        .arg(dir.join("%e.%p.json"))
        .args(["--group-budget", "1M", "--", "sh", "-c"])
        .arg("echo $$; exec \"$0\" cuda_alloc:4096 wait_stdin")
        .arg(f.dir.join("scenario"))
        .env_remove("LD_PRELOAD")
        .env_remove("PINGUARD_GROUP")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(run.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let cmd: i32 = line.trim().parse().unwrap();
    while line.trim() != "waiting" {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0);
    }
    if kill_run {
        run.kill().unwrap();
    }
    // SAFETY: signals the command this test started (through `run`), still waiting on its stdin.
    unsafe { libc::kill(cmd, libc::SIGKILL) };
    run.wait().unwrap();
    // With `run` killed first the command is another process's child: it ends (and the kernel
    // undoes its semaphore) on its own time.
    until("the killed command's end", || {
        std::fs::read_to_string(format!("/proc/{cmd}/stat")).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    });
    run.id()
}

/// In an IPC namespace of the test's own (only this thread and its children in it): 50 runs whose
/// command is SIGKILLed leave no semaphore set; a run killed with its command leaves a group that
/// `pinguard group rm` removes with its set.
#[test]
fn killed_runs_leave_no_semaphore_sets() {
    // SAFETY: no pointers; the new IPC namespace is this thread's (and its children's) only.
    if unsafe { libc::unshare(libc::CLONE_NEWIPC) } != 0 {
        panic!(
            "unshare(CLONE_NEWIPC): {} (the test runs as root)",
            std::io::Error::last_os_error()
        );
    }
    let before = semaphore_sets();
    let runs: Vec<_> = (0..5)
        .map(|_| {
            // Threads spawned here are in the namespace too (it is the spawning thread's).
            std::thread::spawn(|| {
                for _ in 0..10 {
                    killed_run(false);
                }
            })
        })
        .collect();
    for r in runs {
        r.join().unwrap();
    }
    assert_eq!(semaphore_sets(), before, "50 killed runs");
    // `run` killed too: its group stays, and `pinguard group` lists and removes it.
    let pid = killed_run(true);
    assert_eq!(
        semaphore_sets(),
        before + 1,
        "the killed run's group holds one set"
    );
    let o = pinguard_bounded(&["group", "list"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = out
        .lines()
        .find(|l| l.starts_with("run-") && l.contains(&format!("-{pid}-")))
        .unwrap_or_else(|| panic!("{o:?}"));
    assert!(line.contains("0 of 1 member running"), "{line}");
    let name = line.split(':').next().unwrap();
    let o = pinguard_bounded(&["group", "rm", name]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(!Path::new(&pinguard_common::group::path(name)).exists());
    assert_eq!(semaphore_sets(), before, "group rm removed the set");
    let o = pinguard_bounded(&["group", "rm", name]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}
