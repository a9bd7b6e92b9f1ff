//! Reports while the process runs and from every process: the interval writer (which survives a
//! SIGKILL), the report signal (chained to the application's own handler), forked and exec'd
//! children with their own files.

use crate::common;
use common::*;
use pinguard_common::Reason;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn spawn_churn(
    env: &[(&str, &str)],
    dir: &std::path::Path,
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let f = fixtures();
    let mut cmd = program(&f.dir.join("churn"), Some(f.lib.as_os_str()));
    cmd.current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    (child, out)
}

fn wait_for(mut f: impl FnMut() -> bool, what: &str) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigkill_leaves_the_last_complete_interval_snapshot() {
    let dir = fresh_dir("kill");
    let interval = 300u64;
    let template = dir.join("r.%p.json");
    let (mut child, _out) = spawn_churn(
        &[
            ("PINGUARD_INTERVAL", "300ms"),
            ("PINGUARD_REPORT", template.to_str().unwrap()),
        ],
        &dir,
    );
    let path = dir.join(format!("r.{}.json", child.id()));
    wait_for(|| path.exists(), "the first snapshot");
    std::thread::sleep(Duration::from_millis(1200));
    let killed_at = now_ms();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let rep = read_report(&path);
    assert_eq!(rep.reason, Reason::Interval);
    let written = rep.process.write_unix_ms;
    // No older than one interval, plus the time the write in progress at the kill took (a debug
    // build on a loaded machine: allow 300 ms).
    assert!(
        killed_at.saturating_sub(written) <= interval + 300,
        "snapshot is {} ms old",
        killed_at - written
    );
    assert_eq!(rep.totals.live_bytes % 4096, 0);
    assert!(rep.totals.live_bytes >= 65536);
    assert!(rep.totals.alloc_count > 10, "the churn was running");
    // Only finished files carry the report's name.
    assert_eq!(reports_in(&dir).len(), 1);
}

#[test]
fn report_signal_writes_a_snapshot_and_the_applications_handler_still_runs() {
    let dir = fresh_dir("sig");
    let template = dir.join("r.json"); // no %p: the pid is added
    let (mut child, mut out) = spawn_churn(
        &[
            ("PINGUARD_SIGNAL", "SIGUSR2"),
            ("PINGUARD_REPORT", template.to_str().unwrap()),
        ],
        &dir,
    );
    let path = dir.join(format!("r.{}.json", child.id()));
    // The application installed its handler in main, through the hooked `sigaction`: pinguard's
    // handler stays in front and chains to it.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!path.exists(), "nothing asked for a report yet");
    // SAFETY: kill takes only integers; the pid is this test's own child.
    unsafe { libc_kill(child.id() as i32, 12) };
    wait_for(|| path.exists(), "the signal report");
    let rep = read_report(&path);
    assert_eq!(rep.reason, Reason::Signal);
    assert!(rep.totals.live_bytes >= 65536);
    // SAFETY: kill takes only integers; the pid is this test's own child.
    unsafe { libc_kill(child.id() as i32, 15) };
    let status = child.wait().unwrap();
    assert!(status.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(
        rest.contains("usr2=1"),
        "the application's handler must see the signal: {rest:?}"
    );
    assert_eq!(
        read_report(&path).reason,
        Reason::Exit,
        "the exit report replaces the snapshot"
    );
}

#[test]
fn forked_and_execd_children_write_their_own_reports() {
    let f = fixtures();
    let dir = fresh_dir("family");
    let template = dir.join("out.json");
    let scenario = f.dir.join("scenario");
    let r = run(
        "family",
        &[scenario.to_str().unwrap(), "mlock:0:3"],
        &[("PINGUARD_REPORT", template.to_str().unwrap())],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let pid_of = |tag: &str| -> u32 {
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with(tag))
            .unwrap_or_else(|| panic!("{tag}: {}", r.stdout));
        field(line, "pid") as u32
    };
    let (parent, forked, execd) = (pid_of("parent"), pid_of("forked"), pid_of("exec"));
    let files = reports_in(&dir);
    assert_eq!(files.len(), 3, "{files:?}");
    for (pid, live, exe) in [
        (parent, 8192, "family"),
        (forked, 4096, "family"),
        (execd, 3 * 4096, "scenario"),
    ] {
        let rep = read_report(&dir.join(format!("out.{pid}.json")));
        assert_eq!(rep.process.pid, pid);
        assert_eq!(
            rep.totals.live_bytes, live,
            "pid {pid}: a child's ledger starts empty"
        );
        assert!(rep.process.exe.ends_with(exe), "{:?}", rep.process);
    }
    let child = read_report(&dir.join(format!("out.{forked}.json")));
    assert_eq!(child.process.ppid, parent);
    assert_eq!(child.totals.alloc_count, 1);
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
