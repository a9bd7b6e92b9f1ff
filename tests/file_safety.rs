//! Report files in hostile places: a setuid process ignores `PINGUARD_REPORT`, processes
//! writing the same path never leave a torn file, names taken by other containers' pid 1s and by
//! other users are never used, and expansions make no folder and no way out. (A planted
//! symlink: tests/report.rs.)

use crate::common;
use common::*;
use pinguard_common::Reason;
use std::process::Command;
use std::time::Duration;

/// A copy of the library in a system directory, setuid, as glibc requires for preloading into a
/// secure-mode process; removed again on drop.
struct SystemCopy(std::path::PathBuf);
impl Drop for SystemCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_setuid_process_writes_no_report_where_the_environment_says() {
    extern "C" {
        fn geteuid() -> u32;
    }
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { geteuid() } != 0 || Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: needs root and setpriv to make a setuid program (CI has both)");
        return;
    }
    let libdir = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/lib64",
    ]
    .into_iter()
    .find(|d| std::path::Path::new(d).join("libc.so.6").exists())
    .expect("a system library directory");
    let name = format!("libpinguard-securetest-{}.so", std::process::id());
    let copy = SystemCopy(std::path::Path::new(libdir).join(&name));
    std::fs::copy(&fixtures().lib, &copy.0).unwrap();
    // Somewhere `nobody` can reach: the build tree may sit under a private directory.
    let dir = std::env::temp_dir().join(format!("pinguard-setuid-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = SystemCopy(dir.join("capi"));
    let prog = dir.join("capi");
    let out_dir = dir.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let ok = Command::new("cc")
        .args(["-o", prog.to_str().unwrap()])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/capi.c"))
        .status()
        .unwrap();
    assert!(ok.success());
    let chmod = |p: &std::path::Path, mode: &str| {
        assert!(Command::new("chmod")
            .args([mode, p.to_str().unwrap()])
            .status()
            .unwrap()
            .success())
    };
    chmod(&copy.0, "4755");
    chmod(&prog, "4755");
    chmod(&dir, "755");
    chmod(&out_dir, "777");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "env"])
        .arg(format!("LD_PRELOAD={name}"))
        .arg(format!("PINGUARD_REPORT={}/r.%p.json", out_dir.display()))
        .arg(&prog)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("live=8192"),
        "pinguard was loaded into the setuid process: {stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("write=-1"),
        "the C API with the template refuses too: {stdout}"
    );
    assert_eq!(
        std::fs::read_dir(&out_dir).unwrap().count(),
        0,
        "nothing written where the environment said"
    );
    assert!(stderr.contains("secure-mode"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn processes_writing_one_path_never_leave_a_torn_file() {
    let f = fixtures();
    let dir = fresh_dir("same-path");
    let path = dir.join("shared.json");
    let op = format!("report:{}", path.display());
    let args: Vec<&str> = std::iter::once("cuda_alloc:4096")
        .chain(std::iter::repeat_n(op.as_str(), 40))
        .collect();
    let spawn = || {
        Command::new(f.dir.join("scenario"))
            .args(&args)
            .env("LD_PRELOAD", &f.lib)
            .env("PINGUARD_REPORT", dir.join("exit.%p.json"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (spawn(), spawn());
    let mut reads = 0;
    let mut pids = std::collections::BTreeSet::new();
    loop {
        let done = a.try_wait().unwrap().is_some() && b.try_wait().unwrap().is_some();
        if let Ok(text) = std::fs::read(&path) {
            let r = Report::from_slice(&text).unwrap_or_else(|e| panic!("torn read #{reads}: {e}"));
            assert_eq!(r.reason, Reason::Request);
            pids.insert(r.process.pid);
            reads += 1;
        }
        if done {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        reads > 20,
        "the file was read while being rewritten ({reads} reads)"
    );
    assert_eq!(pids.len(), 2, "both processes wrote it");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Every `%` expansion is one path component: a host name such as `../escaped/x` (any bytes are a
/// valid host name to the kernel) cannot move the report or the state out of their folder.
#[test]
fn a_host_name_with_slashes_stays_one_path_component() {
    if aarch64() {
        return; // the host name is set in a namespace of the test's own, before qemu
    }
    let probe = Command::new("unshare")
        .args([
            "--uts",
            "python3",
            "-c",
            "import socket; socket.sethostname('x')",
        ])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("NOT RUN: needs root, unshare --uts and python3 (CI has them)");
        return;
    }
    let f = fixtures();
    let dir = fresh_dir("hostname");
    let exec = "import os, socket, sys; socket.sethostname('../escaped/x'); os.execve(sys.argv[1], sys.argv[1:], dict(os.environ, LD_PRELOAD=sys.argv[2]))";
    let mut cmd = Command::new("unshare");
    clear_pinguard_env(&mut cmd);
    cmd.args(["--uts", "python3", "-c", exec])
        .arg(f.dir.join("workload"))
        .arg(&f.lib)
        .current_dir(&dir)
        .env("PINGUARD_REPORT", dir.join("sub/%h.%p.json"));
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let top: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        top,
        vec![std::ffi::OsString::from("sub")],
        "nothing outside the report folder"
    );
    let names: Vec<String> = std::fs::read_dir(dir.join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(
        names[0].ends_with(".json") && !names[0].starts_with('.'),
        "{names:?}"
    );
    assert!(
        names[0].contains("escaped"),
        "the host name is kept, made safe: {names:?}"
    );
}

// Names across PID namespaces, restarts and other users (issue 43 items 3 and 5): a process
// never replaces or removes a report, state or metrics file it did not make; where its name is
// taken it writes under another.

/// Whether `unshare -p -f --mount-proc` works here (root): each run's first process is pid 1.
fn pid_namespaces() -> bool {
    let ok = Command::new("unshare")
        .args(["-p", "-f", "--mount-proc", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("NOT RUN: needs root and unshare -p --mount-proc (CI has them)");
    }
    ok && !aarch64()
}

/// `scenario OPS wait_stdin:0` as pid 1 of a new PID namespace, in `dir`, with `env` (a `None`
/// value unsets it), held at its wait.
fn pid1(dir: &std::path::Path, ops: &[&str], env: &[(&str, Option<&str>)]) -> Held {
    pid1_as(None, dir, ops, env)
}

/// `pid1`, run as user `uid` where given.
fn pid1_as(
    uid: Option<u32>,
    dir: &std::path::Path,
    ops: &[&str],
    env: &[(&str, Option<&str>)],
) -> Held {
    Held::start_with(dir, ops, &[], |cmd| {
        let mut u = Command::new("unshare");
        u.args(["-p", "-f", "--mount-proc"]);
        if let Some(uid) = uid {
            u.arg("setpriv")
                .arg(format!("--reuid={uid}"))
                .args(["--regid=65534", "--clear-groups"]);
        }
        u.arg(cmd.get_program())
            .args(cmd.get_args())
            .current_dir(dir);
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => u.env(k, v),
                None => u.env_remove(k),
            };
        }
        for (k, v) in env {
            match v {
                Some(v) => u.env(k, v),
                None => u.env_remove(k),
            };
        }
        u
    })
}

/// The host pid of a held `unshare -f`'s child (pid 1 inside).
fn inner_pid(h: &Held) -> i32 {
    let p = h.pid();
    let children = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap();
    children.split_whitespace().next().unwrap().parse().unwrap()
}

fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

fn with_suffix(dir: &std::path::Path, suffix: &str) -> Vec<String> {
    names_in(dir)
        .into_iter()
        .filter(|n| n.ends_with(suffix))
        .collect()
}

/// Two containers' first processes (pid 1 each) writing into one folder: with the default names
/// and with a template that names them alike (`r.%p.json`), both keep their snapshot and their
/// state while they run, both reports stay after they exit, and `pinguard report` reads both.
#[test]
fn two_pid_1s_of_other_namespaces_keep_both_reports_and_states() {
    if !pid_namespaces() {
        return;
    }
    for template in [None, Some("r.%p.json")] {
        let dir = fresh_dir("pid1-pair");
        let ops = ["cuda_alloc:4096", "report:"];
        let a = pid1(&dir, &ops, &[("PINGUARD_REPORT", template)]);
        std::thread::sleep(Duration::from_millis(5)); // two start times
        let b = pid1(&dir, &ops, &[("PINGUARD_REPORT", template)]);
        assert_eq!(
            (
                with_suffix(&dir, ".json").len(),
                with_suffix(&dir, ".state").len()
            ),
            (2, 2),
            "{template:?}: {:?}",
            names_in(&dir)
        );
        a.finish();
        b.finish();
        let reports = with_suffix(&dir, ".json");
        assert_eq!(reports.len(), 2, "{template:?}: {:?}", names_in(&dir));
        assert!(
            with_suffix(&dir, ".state").is_empty(),
            "{:?}",
            names_in(&dir)
        );
        for r in &reports {
            let j = read_report(&dir.join(r));
            assert_eq!((j.process.pid, j.reason), (1, Reason::Exit));
        }
        let o = pinguard_cli(&["report".as_ref(), dir.as_os_str()]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && text.contains("(2 reports, 2 processes)"),
            "{text}"
        );
    }
}

/// A pid 1 SIGKILLed (the OOM killer's way) leaves its state; the container's next pid 1, under
/// the same name, runs and exits without removing it, and `pinguard report` reads both.
#[test]
fn a_killed_pid_1s_state_survives_the_next_pid_1() {
    if !pid_namespaces() {
        return;
    }
    for template in [None, Some("r.%p.json")] {
        let dir = fresh_dir("pid1-restart");
        let killed = pid1(&dir, &["cuda_alloc:8192"], &[("PINGUARD_REPORT", template)]);
        let states = with_suffix(&dir, ".state");
        assert_eq!(states.len(), 1, "{:?}", names_in(&dir));
        // SAFETY: kill has no memory preconditions; the pid is the held namespace's pid 1.
        assert_eq!(unsafe { libc::kill(inner_pid(&killed), libc::SIGKILL) }, 0);
        killed.kill();
        let next = pid1(&dir, &["cuda_alloc:4096"], &[("PINGUARD_REPORT", template)]);
        next.finish();
        assert!(
            dir.join(&states[0]).exists(),
            "{template:?}: the killed process's state is gone: {:?}",
            names_in(&dir)
        );
        assert_eq!(with_suffix(&dir, ".json").len(), 1, "{:?}", names_in(&dir));
        let o = pinguard_cli(&["report".as_ref(), dir.as_os_str()]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("2 reports, 1 of them killed"),
            "{template:?}: {text}"
        );
    }
}

/// A throw-away user (`useradd`), removed on drop.
struct User {
    name: String,
    uid: u32,
}

impl User {
    fn new(tag: &str) -> Option<User> {
        let name = format!("pg{tag}{}", std::process::id() % 100_000);
        let made = Command::new("useradd")
            .args(["-M", "-N", "-s", "/bin/false", &name])
            .status()
            .is_ok_and(|s| s.success());
        if !made {
            eprintln!("NOT RUN: needs root and useradd (CI has them)");
            return None;
        }
        let out = Command::new("id").args(["-u", &name]).output().unwrap();
        let uid = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        Some(User { name, uid })
    }

    /// Runs `sh -c script` as this user.
    fn sh(&self, script: &str) {
        let ok = Command::new("setpriv")
            .arg(format!("--reuid={}", self.uid))
            .args(["--regid=65534", "--clear-groups", "sh", "-c", script])
            .status()
            .unwrap();
        assert!(ok.success(), "{script}");
    }
}

impl Drop for User {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

/// In a shared folder (mode 1777, as `/tmp`), another user pre-created the names a process will
/// use (its report, its state, its metrics: pid 1's are known in advance) and planted a link at
/// another: the process (root, and another user, as a daemon falling back to `/tmp`) leaves every
/// one of them as it was and writes under other names.
#[test]
fn names_another_user_took_are_never_used_and_never_block() {
    if !pid_namespaces() {
        return;
    }
    let (Some(planter), Some(writer)) = (User::new("plant"), User::new("write")) else {
        return;
    };
    // The second writer runs the fixture as another user: only where the checkout is reachable.
    let reachable = fixtures().dir.ancestors().all(|a| {
        std::fs::metadata(a)
            .is_ok_and(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o001 != 0)
    });
    if !reachable {
        eprintln!("NOT RUN: the writer as another user (the checkout's folders are closed to other users)");
    }
    let writers = if reachable {
        vec![None, Some(writer.uid)]
    } else {
        vec![None]
    };
    for uid in writers {
        // In /tmp, not under the checkout: the throw-away users must reach the folder, and a
        // clone may sit below a folder only its owner can enter (`mktemp -d`).
        let dir = std::path::Path::new("/tmp").join(format!(
            "pgtest-planted-{}-{}",
            std::process::id(),
            uid.is_some()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            .unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, "the victim's\n").unwrap();
        planter.sh(&format!(
            "cd {} && for f in r.1.json r.1.state m.1.prom; do echo planted > $f; done",
            dir.display()
        ));
        std::os::unix::fs::symlink(&victim, dir.join(".m.1.prom.live")).unwrap();
        let env = [
            ("PINGUARD_REPORT", Some("r.%p.json")),
            ("PINGUARD_METRICS", Some("m.%p.prom")),
        ];
        let held = pid1_as(uid, &dir, &["cuda_alloc:4096", "report:"], &env);
        until("the metrics", || with_suffix(&dir, ".prom").len() == 2);
        let (reports, states) = (with_suffix(&dir, ".json"), with_suffix(&dir, ".state"));
        assert_eq!(
            (reports.len(), states.len()),
            (2, 2),
            "{uid:?}: {:?}",
            names_in(&dir)
        );
        let stderr = held.finish();
        assert!(!stderr.contains("not written"), "{uid:?}: {stderr}");
        for f in ["r.1.json", "r.1.state", "m.1.prom"] {
            let p = dir.join(f);
            assert_eq!(
                std::fs::read_to_string(&p).unwrap(),
                "planted\n",
                "{f} was replaced"
            );
            let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&p).unwrap());
            assert_eq!(owner, planter.uid, "{f}");
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the victim's\n");
        assert!(std::fs::symlink_metadata(dir.join(".m.1.prom.live"))
            .unwrap()
            .is_symlink());
        let mine: Vec<String> = with_suffix(&dir, ".json")
            .into_iter()
            .filter(|n| n != "r.1.json")
            .collect();
        assert_eq!(mine.len(), 1, "{uid:?}: {:?}", names_in(&dir));
        let meta = std::fs::metadata(dir.join(&mine[0])).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), uid.unwrap_or(0));
        let j = read_report(&dir.join(&mine[0]));
        assert_eq!(j.reason, Reason::Exit);
        assert_eq!(j.totals.peak_live_bytes, 4096);
    }
}

/// A report name taken after the process made its state (a file planted beside it): the report
/// goes under another name and the state follows it, so that a reader still pairs them and the
/// planted file stays as it was.
#[test]
fn a_state_follows_its_report_to_another_name() {
    if !pid_namespaces() {
        return;
    }
    let dir = fresh_dir("follow");
    let env = [("PINGUARD_REPORT", Some("r.%p.json"))];
    let mut held = pid1(&dir, &["cuda_alloc:4096", "wait_stdin:0", "report:"], &env);
    assert_eq!(names_in(&dir), ["r.1.state"]);
    std::fs::write(dir.join("r.1.json"), "planted\n").unwrap();
    held.step();
    let names = names_in(&dir);
    let mine: Vec<&String> = names.iter().filter(|n| *n != "r.1.json").collect();
    assert_eq!(mine.len(), 2, "{names:?}");
    let stem = mine[0].strip_suffix(".json").unwrap();
    assert_eq!(*mine[1], format!("{stem}.state"), "{names:?}");
    assert_eq!(read_report(&dir.join(mine[0])).reason, Reason::Request);
    held.finish();
    assert_eq!(
        std::fs::read_to_string(dir.join("r.1.json")).unwrap(),
        "planted\n"
    );
    assert_eq!(names_in(&dir).len(), 2, "{:?}", names_in(&dir));
}

/// `scenario cuda_alloc:4096`, copied as `name` (beside the emulated runtimes it loads from its
/// own folder), run in `dir` with `PINGUARD_REPORT=template`.
fn run_named(name: &str, dir: &std::path::Path, template: String) -> std::process::Output {
    let f = fixtures();
    let exe = f.dir.join(name);
    if !exe.exists() {
        std::fs::copy(f.dir.join("scenario"), &exe).unwrap();
    }
    let mut cmd = command_in(&exe, dir, true);
    cmd.arg("cuda_alloc:4096").env("PINGUARD_REPORT", template);
    run_bounded(&mut cmd, Duration::from_secs(60))
}

/// No new folder comes out of a template's expansions: an executable named `...` (its name is
/// anyone's to choose) gets no folder made for it by `%e/`.
#[test]
fn an_expansion_makes_no_folder() {
    let dir = fresh_dir("expansion-folder");
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    let o = run_named("...", &dir, format!("{}/%e/%p.json", out.display()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        names_in(&out).is_empty(),
        "a folder named by an expansion was made: {:?}",
        names_in(&out)
    );
}

/// No `..` or jump out of the folder comes out of a template's expansions: a template whose
/// `..` follows an expansion (`%p/../../..`, which lands outside once `%p` exists, as
/// `/etc/%p/../profile` did) is refused, the default used instead, and nothing is made.
#[test]
fn no_dotdot_after_an_expansion() {
    let dir = fresh_dir("expansion-dotdot");
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, "the victim's\n").unwrap();
    let o = run_named(
        "scenario",
        &dir,
        format!("{}/a/%p/../../../victim", out.display()),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let kept = std::fs::read_to_string(&victim).unwrap();
    assert_eq!(kept, "the victim's\n", "{err}");
    assert!(names_in(&out).is_empty(), "{:?}", names_in(&out));
    assert!(err.contains("after an expansion"), "{err}");
}
