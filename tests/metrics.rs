//! `PINGUARD_METRICS` as a fleet reads it: files node_exporter's textfile collector (another user)
//! can read, only from processes that pin, gone when their process ends however it ends, and
//! labelled with the pod and container a dashboard groups by.

use crate::common;
use common::*;
use serde_json::Value;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A Python with `prometheus_client`, or `None` (and a loud skip; `.ci/run` installs it).
fn python() -> Option<&'static str> {
    let found = ["/usr/bin/python3", "python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import prometheus_client"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "prometheus_client is required here"
        );
        eprintln!("SKIPPED: no Python with prometheus_client (.ci/run installs python3-prometheus-client)");
    }
    found
}

/// One sample as the real parser reads it: family name and type, sample name, labels, value.
#[derive(Debug)]
struct Sample {
    family: String,
    kind: String,
    name: String,
    labels: serde_json::Map<String, Value>,
    value: f64,
}

/// `text` through `prometheus_client`'s parser; a panic if it rejects it.
fn parse(python: &str, text: &str) -> Vec<Sample> {
    let script = r#"
import sys, json
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append([fam.name, fam.type, s.name, s.labels, s.value])
print(json.dumps(out))
"#;
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the parser rejected the file: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    rows.into_iter()
        .map(|r| Sample {
            family: r[0].as_str().unwrap().into(),
            kind: r[1].as_str().unwrap().into(),
            name: r[2].as_str().unwrap().into(),
            labels: r[3].as_object().unwrap().clone(),
            value: r[4].as_f64().unwrap(),
        })
        .collect()
}

/// Removes what a test made outside its folder (a group's ledger, a cgroup), however it ends.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
            // A cgroup (the container's, then its parent) goes once its processes have.
            if let Ok(inner) = std::fs::read_dir(p) {
                for d in inner
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                {
                    let _ = std::fs::remove_dir(d.path());
                }
            }
            let _ = std::fs::remove_dir(p);
        }
    }
}

fn proms(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "prom"))
        .collect();
    v.sort();
    v
}

fn metrics_of(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("m.{pid}.prom"))
}

fn template(dir: &Path) -> String {
    dir.join("m.%p.prom").to_string_lossy().into_owned()
}

#[test]
fn a_process_that_pins_nothing_writes_no_metrics() {
    let dir = fresh_dir("metrics-idle");
    let t = template(&dir);
    // With a fast interval, so that a write would have come many times over.
    let r = run(
        "scenario",
        &["sleep_ms:600", "vmlck"],
        &[("PINGUARD_METRICS", &t), ("PINGUARD_INTERVAL", "50ms")],
    );
    assert!(r.success());
    let r = run("scenario", &["sleep_ms:300"], &[("PINGUARD_METRICS", &t)]);
    assert!(r.success());
    let mut cmd = command_in(Path::new("/bin/true"), &dir, true);
    assert!(cmd.env("PINGUARD_METRICS", &t).status().unwrap().success());
    assert_eq!(
        proms(&dir),
        Vec::<PathBuf>::new(),
        "no file from a process that pins nothing"
    );
}

#[test]
fn the_file_is_readable_by_others_while_the_process_pins_and_goes_when_it_exits() {
    let Some(py) = python() else { return };
    let dir = fresh_dir("metrics-life");
    let t = template(&dir);
    // A container's umask of 077 must not keep the collector out; no PINGUARD_INTERVAL: the file
    // comes with the first pinning call all the same, here a refusal, which is activity too.
    let held = Held::start_with(
        &dir,
        &["cuda_alloc:65536"],
        &[("PINGUARD_METRICS", &t), ("PINGUARD_BUDGET", "32K")],
        |cmd| {
            use std::os::unix::process::CommandExt;
            let mut cmd = cmd;
            // SAFETY: umask is async-signal-safe and touches only the child's own mask.
            unsafe {
                cmd.pre_exec(|| {
                    libc::umask(0o077);
                    Ok(())
                })
            };
            cmd
        },
    );
    let path = metrics_of(&dir, held.pid());
    until("the metrics file", || path.exists());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "readable by a collector of another user");
    let text = std::fs::read_to_string(&path).unwrap();
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with(&format!("# pinguard-writer pid={} start=", held.pid())),
        "{first}"
    );
    let samples = parse(py, &text);
    assert!(
        samples
            .iter()
            .all(|s| s.labels["pid"] == held.pid().to_string().as_str()
                && s.labels["exe"] == "scenario"),
        "{samples:?}"
    );
    let one = |name: &str| {
        samples
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name}: {samples:?}"))
            .value
    };
    assert_eq!(one("pinguard_process_pinned_bytes"), 0.0);
    assert_eq!(one("pinguard_config_errors"), 0.0);
    let denied = samples
        .iter()
        .find(|s| s.family == "pinguard_denied" && s.labels["api"] == "cudaHostAlloc")
        .unwrap();
    assert_eq!(
        (denied.kind.as_str(), denied.name.as_str(), denied.value),
        ("counter", "pinguard_denied_total", 1.0)
    );
    // The state beside the report stays the owner's alone.
    for p in std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()) {
        if p != path {
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o077,
                0,
                "{} is private",
                p.display()
            );
        }
    }
    let live = dir.join(format!(".m.{}.prom.live", held.pid()));
    assert!(
        live.exists() && text.lines().next().unwrap().contains(" live="),
        "the liveness file beside it: {first}"
    );
    let pid = held.pid();
    held.finish();
    assert!(!path.exists(), "the file goes at exit");
    assert!(!live.exists(), "its liveness file too");
    let report = read_report(&dir.join(format!("report.{pid}.json")));
    assert_eq!(
        report.totals.denied_count, 1,
        "the report keeps the final figures"
    );
    assert_eq!(
        std::fs::metadata(dir.join(format!("report.{pid}.json")))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
}

#[test]
fn an_execd_image_that_pins_nothing_leaves_no_file_of_the_old_ones() {
    let dir = fresh_dir("metrics-exec");
    let t = template(&dir);
    // The old image pins and waits; then it execs the program again (same pid, same start time:
    // no other writer could tell its file dead), and the new image pins nothing.
    let mut held = Held::start(
        &dir,
        &["cuda_alloc:4096", "wait_stdin:0", "reexec:0"],
        &[("PINGUARD_METRICS", &t), ("PINGUARD_INTERVAL", "50ms")],
    );
    let path = metrics_of(&dir, held.pid());
    until("the old image's file", || path.exists());
    held.step();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!path.exists(), "the old image's figures outlive it");
    held.finish();
    assert_eq!(proms(&dir), Vec::<PathBuf>::new());
}

/// A file with a dead writer's line, as a writer killed in that folder leaves it.
fn dead_writers_file(path: &Path, pidns: &str) {
    std::fs::write(path, format!("# pinguard-writer pid=999999999 start=1 pidns={pidns} interval_ms=15000\npinguard_process_pinned_bytes{{pid=\"999999999\",exe=\"x\"}} 1\n")).unwrap();
}

#[test]
fn a_killed_writers_file_goes_with_the_next_writer_and_nothing_else_does() {
    let dir = fresh_dir("metrics-killed");
    let t = template(&dir);
    let env = [("PINGUARD_METRICS", t.as_str())];
    let a = Held::start(&dir, &["cuda_alloc:4096"], &env);
    let a_file = metrics_of(&dir, a.pid());
    let a_pid = a.pid();
    until("the first writer's file", || a_file.exists());
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("pid:[")
        .trim_end_matches(']')
        .to_string();
    a.kill();
    assert!(a_file.exists(), "SIGKILL leaves it");
    // Left alone whatever happens: a file of another program's, one that is not pinguard's
    // though named alike, a symbolic link to a dead writer's file, a dead writer's file that
    // is not a regular file's name ending in .prom, and one owned by another user.
    let foreign = dir.join("node_custom.prom");
    std::fs::write(
        &foreign,
        "# HELP node_custom x\n# TYPE node_custom gauge\nnode_custom 1\n",
    )
    .unwrap();
    let outside = fresh_dir("metrics-killed-outside");
    dead_writers_file(&outside.join("target.prom"), &ns);
    std::os::unix::fs::symlink(outside.join("target.prom"), dir.join("link.prom")).unwrap();
    dead_writers_file(&dir.join("dead.prom.bak"), &ns);
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let others = dir.join("others.prom");
    if root {
        dead_writers_file(&others, &ns);
        std::os::unix::fs::chown(&others, Some(65534), Some(65534)).unwrap();
    }
    // And one of a dead writer's, which goes with the other.
    let dead = dir.join("dead.prom");
    dead_writers_file(&dead, &ns);

    let b = Held::start(&dir, &["cuda_alloc:4096"], &env);
    let b_file = metrics_of(&dir, b.pid());
    until("the killed writer's file to go", || {
        !a_file.exists() && !dead.exists()
    });
    assert!(
        !dir.join(format!(".m.{a_pid}.prom.live")).exists(),
        "and its liveness file"
    );
    assert!(b_file.exists());
    assert!(
        foreign.exists()
            && dir.join("link.prom").symlink_metadata().is_ok()
            && outside.join("target.prom").exists()
            && dir.join("dead.prom.bak").exists()
    );
    assert!(!root || others.exists(), "another user's file stays");
    b.finish();
    assert!(!b_file.exists());
}

/// A writer's file as `pinguard-writer` names it, `age_s` seconds old.
fn writers_file(path: &Path, pid: u64, start: u64, pidns: &str, interval_ms: u64, age_s: u64) {
    std::fs::write(path, format!("# pinguard-writer pid={pid} start={start} pidns={pidns} interval_ms={interval_ms}\nx{{pid=\"{pid}\"}} 1\n")).unwrap();
    let when = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - age_s;
    assert!(Command::new("touch")
        .args(["-m", "-d", &format!("@{when}")])
        .arg(path)
        .status()
        .unwrap()
        .success());
}

/// This process's start time in clock ticks (`/proc/self/stat`).
fn own_start() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn metrics_prune_on_the_node_removes_what_no_next_writer_would() {
    let dir = fresh_dir("metrics-prune");
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("pid:[")
        .trim_end_matches(']')
        .to_string();
    // A process killed with no other writer in its folder: its file would stay.
    let t = template(&dir);
    let killed = Held::start(&dir, &["cuda_alloc:4096"], &[("PINGUARD_METRICS", &t)]);
    let killed_file = metrics_of(&dir, killed.pid());
    let killed_live = dir.join(format!(".m.{}.prom.live", killed.pid()));
    until("the killed writer's file", || killed_file.exists());
    killed.kill();
    let me = std::process::id() as u64;
    let cases = [
        ("dead-here.prom", 999_999_999, 1, ns.clone(), 15000, 0, true),
        (
            "reused-pid.prom",
            me,
            own_start() + 1,
            ns.clone(),
            15000,
            0,
            true,
        ),
        (
            "alive-here-old.prom",
            me,
            own_start(),
            ns.clone(),
            1000,
            3600,
            false,
        ),
        // Fresh ones well inside two intervals and 5 s, whatever the machine's load.
        ("other-ns-fresh.prom", 1, 5, "1".into(), 60000, 2, false),
        ("other-ns-stale.prom", 1, 5, "1".into(), 1000, 8, true),
        ("unknown-ns-stale.prom", 7, 5, "-".into(), 15000, 40, true),
        ("unknown-ns-fresh.prom", 7, 5, "-".into(), 60000, 30, false),
    ];
    // The command built (a no-op when it is up to date) before the files' ages start to count.
    assert!(pinguard_cli(&[std::ffi::OsStr::new("--version")])
        .status
        .success());
    for (name, pid, start, pidns, interval, age, _) in &cases {
        writers_file(&dir.join(name), *pid, *start, pidns, *interval, *age);
    }
    let foreign = dir.join("node_custom.prom");
    std::fs::write(&foreign, "node_custom 1\n").unwrap();
    let outside = fresh_dir("metrics-prune-outside");
    writers_file(&outside.join("t.prom"), 999_999_999, 1, &ns, 15000, 0);
    std::os::unix::fs::symlink(outside.join("t.prom"), dir.join("link.prom")).unwrap();
    let o = pinguard_cli(&[std::ffi::OsStr::new("metrics-prune"), dir.as_os_str()]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(!killed_file.exists() && !killed_live.exists(), "{stdout}");
    for (name, _, _, _, _, _, removed) in &cases {
        assert_eq!(!dir.join(name).exists(), *removed, "{name}: {stdout}");
        assert_eq!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("removed {}: ", dir.join(name).display()))),
            *removed,
            "{name}: {stdout}"
        );
    }
    assert_eq!(
        stdout.lines().count(),
        1 + cases.iter().filter(|c| c.6).count(),
        "{stdout}"
    );
    assert!(
        foreign.exists()
            && dir.join("link.prom").symlink_metadata().is_ok()
            && outside.join("t.prom").exists()
    );
    let o = pinguard_cli(&[
        std::ffi::OsStr::new("metrics-prune"),
        dir.join("missing").as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).lines().count(),
        1,
        "{o:?}"
    );
}

/// `unshare --pid --fork --mount-proc`, where this machine allows it (root).
fn can_unshare() -> bool {
    let ok = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "unshare --pid --mount-proc is required here (root)"
        );
        eprintln!("NOT RUN: a writer in another PID namespace: `unshare --pid --fork --mount-proc` is not allowed here (needs root)");
    }
    ok
}

/// The process `unshare --fork` started (its only child).
fn child_of(pid: u32) -> u32 {
    let mut found = 0;
    until("unshare's child", || {
        found = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        found != 0
    });
    found
}

/// `Held::start` as pid 1 of a new PID namespace (with its own `/proc`): the `unshare` process,
/// the program's pid as seen here, and the namespace's inode number.
fn in_new_pid_namespace(dir: &Path, ops: &[&str], env: &[(&str, &str)]) -> (Held, u32, String) {
    let held = Held::start_with(dir, ops, env, |cmd| {
        let mut u = Command::new("unshare");
        u.args(["--pid", "--fork", "--mount-proc"])
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .current_dir(dir);
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => u.env(k, v),
                None => u.env_remove(k),
            };
        }
        u
    });
    let inner = child_of(held.pid());
    let ns = std::fs::read_link(format!("/proc/{inner}/ns/pid"))
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("pid:[")
        .trim_end_matches(']')
        .to_string();
    (held, inner, ns)
}

#[test]
fn a_writer_in_another_pid_namespace_goes_when_it_dies_and_never_while_it_lives() {
    if aarch64() || !can_unshare() {
        return;
    }
    let dir = fresh_dir("metrics-ns");
    // `%n`: two containers' processes of one pid share the folder without sharing a name.
    let t = dir.join("m.%n.%p.prom").to_string_lossy().into_owned();
    let namespaced = || {
        // Pid 1 of its namespace: here, pid 1 is another process (another start time), so only
        // the namespace tells that this pid is not ours to look up.
        let (held, inner, ns) = in_new_pid_namespace(
            &dir,
            &["cuda_alloc:4096"],
            &[("PINGUARD_METRICS", &t), ("PINGUARD_INTERVAL", "200ms")],
        );
        let file = dir.join(format!("m.{ns}.1.prom"));
        until("a namespaced writer's file", || file.exists());
        let head = std::fs::read_to_string(&file).unwrap();
        assert!(
            head.starts_with(&"# pinguard-writer pid=1 ".to_string())
                && head
                    .lines()
                    .next()
                    .unwrap()
                    .contains(&format!(" pidns={ns} ")),
            "{head}"
        );
        (held, inner, file)
    };
    let (a, inner, a_file) = namespaced();
    let (other, _, other_file) = namespaced();
    assert_ne!(a_file, other_file);

    // Two files of writers in another namespace without a liveness file (as where the kernel
    // keeps no robust list): by their age alone.
    writers_file(&dir.join("stale-elsewhere.prom"), 1, 5, "1", 1000, 8);
    writers_file(&dir.join("fresh-elsewhere.prom"), 1, 5, "1", 60000, 0);
    // A writer here, passing over the folder every 100 ms, while the others live: never removed.
    let b = Held::start(
        &dir,
        &["cuda_alloc:4096"],
        &[("PINGUARD_METRICS", &t), ("PINGUARD_INTERVAL", "100ms")],
    );
    let own_ns = std::fs::read_link("/proc/self/ns/pid")
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("pid:[")
        .trim_end_matches(']')
        .to_string();
    until("this namespace's writer's file", || {
        dir.join(format!("m.{own_ns}.{}.prom", b.pid())).exists()
    });
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        assert!(
            a_file.exists() && other_file.exists(),
            "a live writer's file was removed"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(
        !dir.join("stale-elsewhere.prom").exists() && dir.join("fresh-elsewhere.prom").exists(),
        "by age"
    );
    // Killed: the kernel marks its liveness file's lock, and the next pass here removes the file,
    // long before it could be stale (two of its intervals and 5 s: 5.4 s).
    // SAFETY: signals the test's own grandchild.
    unsafe { libc::kill(inner as i32, libc::SIGKILL) };
    let killed = Instant::now();
    a.kill();
    until("the namespaced writer's file to go", || !a_file.exists());
    let after = killed.elapsed();
    eprintln!("the killed writer's file went {after:?} after the kill");
    assert!(
        after < Duration::from_millis(4000),
        "removed {after:?} after the kill: by its age, not the kernel's mark"
    );
    let a_live = a_file.with_file_name(format!(
        ".{}.live",
        a_file.file_name().unwrap().to_string_lossy()
    ));
    // The pruner unlinks the metrics file, then the liveness file: a moment apart.
    until("its liveness file to go with it", || !a_live.exists());
    assert!(other_file.exists(), "the live one stays");
    other.finish();
    assert!(!other_file.exists(), "removed by its own writer at exit");
    b.finish();
    std::fs::remove_file(dir.join("fresh-elsewhere.prom")).unwrap();
    assert_eq!(proms(&dir), Vec::<PathBuf>::new());
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".live"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Runs `cmd` inside a new cgroup v1 `pids` cgroup named as Docker's systemd driver names a
/// container's (`docker-<id>.scope`), where this machine allows it; `None` otherwise.
fn in_container_cgroup(id: &str) -> Option<(PathBuf, impl FnOnce(Command) -> Command)> {
    let parent = Path::new("/sys/fs/cgroup/pids");
    let dir = parent
        .join(format!("pinguard-test-{}", std::process::id()))
        .join(format!("docker-{id}.scope"));
    if !parent.join("cgroup.procs").exists() || std::fs::create_dir_all(&dir).is_err() {
        return None;
    }
    let procs = dir.join("cgroup.procs");
    Some((dir, move |cmd: Command| {
        use std::os::unix::process::CommandExt;
        let mut cmd = cmd;
        let procs = procs.clone();
        // SAFETY: only a write of this child's pid to a cgroup file before exec.
        unsafe {
            cmd.pre_exec(move || std::fs::write(&procs, std::process::id().to_string()));
        }
        cmd
    }))
}

#[test]
fn every_series_carries_the_pod_the_container_and_the_group() {
    let Some(py) = python() else { return };
    let dir = fresh_dir("metrics-labels");
    let t = template(&dir);
    let group = format!("metrics-labels-{}", std::process::id());
    let _cleanup = Cleanup(vec![
        PathBuf::from(format!("/dev/shm/pinguard.group.{group}")),
        Path::new("/sys/fs/cgroup/pids").join(format!("pinguard-test-{}", std::process::id())),
    ]);
    let id = "5e0c1d2f3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5";
    let env = [
        ("PINGUARD_METRICS", t.as_str()),
        ("PINGUARD_NAMESPACE", "team-a"),
        ("PINGUARD_POD", "trainer-0"),
        ("PINGUARD_CONTAINER", "worker"),
        (
            "PINGUARD_LABELS",
            "team=ml, 9lives=x,__meta=y,pod=z,zone=eu-1,noequals,team=again",
        ),
        ("PINGUARD_GROUP", group.as_str()),
        ("PINGUARD_GROUP_BUDGET", "1M"),
        ("PINGUARD_BUDGET", "64K"),
        ("PINGUARD_INTERVAL", "100ms"),
    ];
    let cgroup = if aarch64() {
        None
    } else {
        in_container_cgroup(id)
    };
    let in_cgroup = cgroup.is_some();
    let held = match cgroup {
        Some((_, wrap)) => {
            Held::start_with(&dir, &["cuda_alloc:8192", "cuda_alloc:131072"], &env, wrap)
        }
        None => {
            eprintln!("NOT RUN: container_id from a real cgroup (no writable cgroup v1 `pids` hierarchy here); the parser's unit tests cover the engines' formats");
            Held::start(&dir, &["cuda_alloc:8192", "cuda_alloc:131072"], &env)
        }
    };
    let expected = cgroup_present(&held).then(|| id.to_string());
    assert_eq!(
        expected.is_some(),
        in_cgroup,
        "the process runs in the container-named cgroup"
    );
    let path = metrics_of(&dir, held.pid());
    // Written at the first call, then every 100 ms: until it shows the refusal of the second.
    until("the metrics file after both calls", || {
        std::fs::read_to_string(&path).is_ok_and(|t| {
            t.lines()
                .any(|l| l.starts_with("pinguard_denied_total{") && l.ends_with(" 1"))
        })
    });
    let samples = parse(py, &std::fs::read_to_string(&path).unwrap());
    for s in &samples {
        let l = &s.labels;
        assert_eq!(
            (
                l["namespace"].as_str(),
                l["pod"].as_str(),
                l["container"].as_str()
            ),
            (Some("team-a"), Some("trainer-0"), Some("worker")),
            "{s:?}"
        );
        assert_eq!(
            (l["team"].as_str(), l["zone"].as_str(), l["group"].as_str()),
            (Some("ml"), Some("eu-1"), Some(group.as_str())),
            "{s:?}"
        );
        assert!(l.contains_key("pid") && l.contains_key("exe"), "{s:?}");
        match &expected {
            Some(want) => assert_eq!(l["container_id"].as_str(), Some(want.as_str()), "{s:?}"),
            None => assert!(!l.contains_key("container_id"), "not in a container: {s:?}"),
        }
        for bad in ["9lives", "__meta", "noequals"] {
            assert!(!l.contains_key(bad), "{s:?}");
        }
    }
    let value = |name: &str| {
        samples
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .value
    };
    assert_eq!(
        value("pinguard_config_errors"),
        5.0,
        "four bad entries and a repeated name"
    );
    assert_eq!(value("pinguard_group_pinned_bytes"), 8192.0);
    let pid = held.pid();
    let stderr = held.finish();
    let lines: Vec<&str> = pinguard_lines(&stderr)
        .into_iter()
        .filter(|l| l.contains("PINGUARD_LABELS="))
        .collect();
    assert_eq!(lines.len(), 5, "one line per bad entry: {stderr}");
    for (entry, why) in [
        ("9lives=x", "not a label name"),
        ("__meta=y", "Prometheus reserves"),
        ("pod=z", "pinguard's own labels"),
        ("noequals", "no '='"),
        ("team=again", "given twice"),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("entry {entry:?}")) && l.contains(why)),
            "{entry}: {lines:#?}"
        );
    }
    let report = read_report(&dir.join(format!("report.{pid}.json")));
    assert_eq!(report.config.errors.len(), 5, "{:?}", report.config.errors);
}

/// Whether `held` runs in the test's container-named cgroup (its own `/proc/PID/cgroup`).
fn cgroup_present(held: &Held) -> bool {
    std::fs::read_to_string(format!("/proc/{}/cgroup", held.pid()))
        .unwrap_or_default()
        .contains("docker-5e0c1d2f")
}

/// A free TCP port on the loopback interface.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /metrics` over plain HTTP/1.0.
fn scrape(port: u16) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    std::io::Read::read_to_string(&mut s, &mut body).ok()?;
    Some(body)
}

#[test]
fn node_exporters_textfile_collector_running_as_nobody_exports_every_writer() {
    let exporter = ["prometheus-node-exporter", "node_exporter"]
        .into_iter()
        .find(|p| {
            Command::new("sh")
                .args(["-c", &format!("command -v {p}")])
                .output()
                .is_ok_and(|o| o.status.success())
        });
    let Some(exporter) = exporter else {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "prometheus-node-exporter is required here"
        );
        eprintln!("NOT RUN: node_exporter's textfile collector reading the files: prometheus-node-exporter is not installed (.ci/run installs it)");
        return;
    };
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 || !have("setpriv", "runs node_exporter as nobody") {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "root is required here, to run node_exporter as nobody"
        );
        eprintln!("NOT RUN: node_exporter as nobody: not root");
        return;
    }
    // A folder that `nobody` can reach (the tests' own folders may sit under private ones).
    let dir = std::env::temp_dir().join(format!("pinguard-textfile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let t = template(&dir);
    let group = format!("metrics-ne-{}", std::process::id());
    let _cleanup = Cleanup(vec![
        PathBuf::from(format!("/dev/shm/pinguard.group.{group}")),
        dir.clone(),
    ]);
    let env = |pod: &'static str| -> Vec<(&'static str, String)> {
        vec![
            ("PINGUARD_METRICS", t.clone()),
            ("PINGUARD_POD", pod.into()),
            ("PINGUARD_NAMESPACE", "ns".into()),
            ("PINGUARD_GROUP", group.clone()),
            ("PINGUARD_BUDGET", "16K".into()),
            ("PINGUARD_INTERVAL", "100ms".into()),
        ]
    };
    let start = |pod: &'static str, ops: &[&str]| {
        let e = env(pod);
        let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Held::start(&dir, ops, &e)
    };
    // Two pods of one group: the group's series are in both files, told apart by pid.
    let a = start("pod-a", &["cuda_alloc:8192", "cuda_alloc:65536"]);
    let b = start("pod-b", &["cuda_alloc:4096"]);
    // And two containers of one pod whose processes are both pid 1, the same program, with no
    // container name set: told apart by their PID namespaces (file name and `pidns` label).
    let twins: Vec<(Held, u32, String)> = (0..if can_unshare() { 2 } else { 0 })
        .map(|_| {
            in_new_pid_namespace(
                &dir,
                &["cuda_alloc:12288"],
                &[
                    (
                        "PINGUARD_METRICS",
                        &dir.join("m.%n.%p.prom").to_string_lossy(),
                    ),
                    ("PINGUARD_POD", "pod-c"),
                    ("PINGUARD_INTERVAL", "100ms"),
                ],
            )
        })
        .collect();
    until("the twins' files", || {
        twins
            .iter()
            .all(|(_, _, ns)| dir.join(format!("m.{ns}.1.prom")).exists())
    });
    let shows = |pid: u32, name: &str, v: &str| {
        std::fs::read_to_string(metrics_of(&dir, pid))
            .is_ok_and(|t| t.lines().any(|l| l.starts_with(name) && l.ends_with(v)))
    };
    until("both files, after every call", || {
        shows(a.pid(), "pinguard_denied_total{", " 1")
            && shows(b.pid(), "pinguard_group_members{", " 2")
    });
    let port = free_port();
    let mut ne = Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            exporter,
        ])
        .args(["--collector.disable-defaults", "--collector.textfile"])
        .arg(format!("--collector.textfile.directory={}", dir.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut body = None;
    let t0 = Instant::now();
    while body.is_none() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
        body = scrape(port).filter(|b| b.contains("node_textfile_scrape_error"));
    }
    let _ = ne.kill();
    let out = ne.wait_with_output().unwrap();
    let body = body.unwrap_or_else(|| {
        panic!(
            "node_exporter did not answer: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        body.lines().any(|l| l == "node_textfile_scrape_error 0"),
        "{body}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let series = |pod: &str, name: &str| -> Vec<String> {
        body.lines()
            .filter(|l| {
                l.starts_with(&format!("{name}{{")) && l.contains(&format!("pod=\"{pod}\""))
            })
            .map(String::from)
            .collect()
    };
    let a_pinned = series("pod-a", "pinguard_process_pinned_bytes");
    assert_eq!(a_pinned.len(), 1, "{body}");
    assert!(
        a_pinned[0].ends_with(" 8192")
            && a_pinned[0].contains("namespace=\"ns\"")
            && a_pinned[0].contains(&format!("group=\"{group}\"")),
        "{a_pinned:?}"
    );
    assert!(
        series("pod-a", "pinguard_denied_total")
            .iter()
            .any(|l| l.contains("api=\"cudaHostAlloc\"") && l.ends_with(" 1")),
        "{body}"
    );
    assert!(
        series("pod-b", "pinguard_process_pinned_bytes")
            .iter()
            .any(|l| l.ends_with(" 4096")),
        "{body}"
    );
    assert_eq!(
        series("pod-a", "pinguard_group_pinned_bytes").len()
            + series("pod-b", "pinguard_group_pinned_bytes").len(),
        2,
        "{body}"
    );
    let c = series("pod-c", "pinguard_process_pinned_bytes");
    assert!(
        c.len() == twins.len()
            && c.iter()
                .all(|l| l.contains("pid=\"1\"") && l.ends_with(" 12288")),
        "{body}"
    );
    for (held, _, ns) in twins {
        assert!(
            c.iter().any(|l| l.contains(&format!("pidns=\"{ns}\""))),
            "{c:?}"
        );
        held.finish();
    }
    a.finish();
    b.finish();
    assert_eq!(proms(&dir), Vec::<PathBuf>::new());
    let _ = std::fs::remove_dir_all(&dir);
}
