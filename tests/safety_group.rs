//! The group ledger never harms its members: an exec'd member starts afresh, a member killed while
//! creating the ledger leaves nothing behind, a full group does bounded work per refused call, a
//! thread cancelled inside a group reservation is not aborted, the counters never saturate, and a
//! member stopped while holding the ledger's lock freezes nobody.

use crate::common;
use common::*;
use pinguard_common::group::{self as layout, Header};
use pinguard_common::{EventKind, Limit};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};

fn prog() -> PathBuf {
    fixture_set("safety_group").join("group_safety")
}

/// A group name no other test run uses; its ledger (and anything named after it) removed before
/// and after.
struct Group(String);
impl Group {
    fn new(tag: &str) -> Group {
        let g = Group(format!("test-safety-{tag}-{}", std::process::id()));
        g.remove_all();
        g
    }
    fn path(&self) -> String {
        layout::path(&self.0)
    }
    /// Every file in the ledger's directory whose name starts with the ledger's.
    fn files(&self) -> Vec<String> {
        let path = self.path();
        let (dir, base) = path.rsplit_once('/').unwrap();
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(base))
            .collect();
        v.sort();
        v
    }
    fn remove_all(&self) {
        let path = self.path();
        let dir = path.rsplit_once('/').unwrap().0.to_string();
        for n in self.files() {
            let _ = std::fs::remove_file(format!("{dir}/{n}"));
        }
    }
    /// The ledger is gone: its last member removed it (nothing of the group is left booked).
    fn gone(&self) -> bool {
        !std::path::Path::new(&self.path()).exists()
    }
    fn header(&self) -> Header {
        let b = std::fs::read(self.path()).unwrap();
        assert_eq!(b.len(), layout::SIZE);
        // SAFETY: the buffer holds SIZE bytes of a ledger written on this host; Header is plain
        // data (the mutex is only copied, never used).
        unsafe { std::ptr::read_unaligned(b.as_ptr() as *const Header) }
    }
    fn members(&self) -> Vec<(u32, u64)> {
        self.header()
            .members
            .iter()
            .filter(|m| m.pid != 0)
            .map(|m| (m.pid, m.bytes))
            .collect()
    }
}
impl Drop for Group {
    fn drop(&mut self) {
        remove_semaphores(&self.path());
        self.remove_all();
    }
}

#[test]
fn an_exec_d_member_starts_with_a_share_of_zero() {
    let g = Group::new("exec");
    let f = fixtures();
    let size = (1536 * 1024).to_string();
    let mut cmd = program(&prog(), Some(f.lib.as_os_str()));
    clear_pinguard_env(&mut cmd);
    let mut child = cmd
        .args(["exec", &size])
        .env("PINGUARD_GROUP", &g.0)
        .env("PINGUARD_GROUP_BUDGET", "2M")
        .env("PINGUARD_REPORT", fresh_dir("exec").join("r.%p.json"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..3 {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        lines.push(l.trim().to_string());
    }
    // Read while the new image holds its share.
    let members = g.members();
    let used = g.header().used;
    child.stdin.take().unwrap().write_all(b"done\n").unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(lines[0], "first rc=0");
    assert_eq!(
        lines[1], "second rc=0",
        "the new image is refused: the old image's share is still booked ({lines:?})"
    );
    assert_eq!(lines[2], "ready");
    assert_eq!(
        members,
        vec![(pid, 1536 * 1024)],
        "one member, the new image, with its own share only"
    );
    assert_eq!(used, 1536 * 1024);
    assert!(g.gone(), "and it leaves at exit, the last: the ledger goes");
}

#[test]
fn a_member_killed_while_creating_the_ledger_leaves_no_file() {
    let g = Group::new("fsize");
    let f = fixtures();
    // The program execs itself into the group with a 4 KiB file-size limit: the kernel kills the
    // new image with SIGXFSZ when pinguard sizes the ledger's file (about 20 KiB), that is after
    // the file exists and before it is published, the moment a kill leaves most behind.
    let mut cmd = program(&prog(), Some(f.lib.as_os_str()));
    clear_pinguard_env(&mut cmd);
    let out = cmd
        .args(["fsize", &g.0])
        .env("PINGUARD_REPORT", fresh_dir("fsize").join("r.%p.json"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc_sigxfsz()),
        "killed while sizing the ledger: {out:?}"
    );
    assert_eq!(
        g.files(),
        Vec::<String>::new(),
        "nothing of the ledger is left behind"
    );
    // And the next member creates the ledger as if nothing had happened.
    let r = run(
        "scenario",
        &["cuda_alloc:4096"],
        &[("PINGUARD_GROUP", &g.0), ("PINGUARD_GROUP_BUDGET", "1M")],
    );
    assert_eq!(r.rc("cuda_alloc:4096"), 0, "{}", r.stderr);
    assert_eq!(
        r.typed_report().group.and_then(|g| g.budget_bytes),
        Some(1 << 20),
        "{}",
        r.stderr
    );
    assert_eq!(
        g.files(),
        Vec::<String>::new(),
        "and, the last member, removes it at exit"
    );
}

fn libc_sigxfsz() -> i32 {
    25 // SIGXFSZ on x86-64 and aarch64
}

#[test]
fn stale_temporary_ledgers_of_dead_creators_are_removed() {
    let g = Group::new("stale");
    // A creator that died (an older pinguard named its temporary file after its pid) and one that
    // is alive (this test): only the dead one's file goes.
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let stale = format!("{}.{dead_pid}.tmp", g.path());
    let live = format!("{}.{}.tmp", g.path(), std::process::id());
    for p in [&stale, &live] {
        let file = std::fs::File::create(p).unwrap();
        file.set_modified(old).unwrap();
    }
    let r = run(
        "scenario",
        &["cuda_alloc:4096"],
        &[("PINGUARD_GROUP", &g.0), ("PINGUARD_GROUP_BUDGET", "1M")],
    );
    assert_eq!(r.rc("cuda_alloc:4096"), 0, "{}", r.stderr);
    assert_eq!(
        r.typed_report().group.and_then(|g| g.budget_bytes),
        Some(1 << 20),
        "{}",
        r.stderr
    );
    assert!(g.gone(), "the member, the last, removed the ledger it made");
    assert!(
        !std::path::Path::new(&stale).exists(),
        "the dead creator's file is removed: {:?}",
        g.files()
    );
    assert!(
        std::path::Path::new(&live).exists(),
        "a live creator's file is left alone"
    );
}

#[test]
fn a_full_group_looks_for_dead_members_a_bounded_number_of_times() {
    let g = Group::new("scan");
    let (mut holder, _out) = spawn_churn_holder(&g.0);
    let f = fixtures();
    // 120 members at once, each making 20 calls that the full group refuses. Before, every refusal
    // read every member's /proc entry under the group's lock (2,400 walks of up to 121 entries).
    const PROCS: usize = 120;
    const CALLS: usize = 20;
    let before = g.header();
    let start = std::time::Instant::now();
    let mut members: Vec<Child> = (0..PROCS)
        .map(|_| {
            let mut cmd = program(&prog(), Some(f.lib.as_os_str()));
            clear_pinguard_env(&mut cmd);
            cmd.args(["try", &CALLS.to_string()])
                .env("PINGUARD_GROUP", &g.0)
                .env("PINGUARD_DEPTH", "0")
                .env("PINGUARD_REPORT", fresh_dir("scan").join("r.%p.json"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut refused = 0;
    for m in &mut members {
        let mut line = String::new();
        BufReader::new(m.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        refused += line
            .trim()
            .strip_prefix("refused=")
            .unwrap_or_else(|| panic!("{line:?}"))
            .parse::<usize>()
            .unwrap();
    }
    let elapsed_ms = start.elapsed().as_millis() as u64;
    let during = g.header();
    for m in &mut members {
        drop(m.stdin.take());
    }
    for mut m in members {
        assert!(m.wait().unwrap().success());
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(
        refused,
        PROCS * CALLS,
        "every call was over the group budget"
    );
    assert_eq!(
        during.members.iter().filter(|m| m.pid != 0).count(),
        PROCS + 1,
        "all were members at once"
    );
    let joins = during.join_scans - before.join_scans;
    let rooms = during.room_scans - before.room_scans;
    eprintln!("{PROCS} members, {refused} refused calls in {elapsed_ms} ms: {joins} looks for dead members at join, {rooms} for room");
    assert!(
        joins <= PROCS as u64,
        "{joins} looks at join for {PROCS} processes"
    );
    // Group-wide, at most one look for room per interval, however many members and calls (the
    // bound grows with the time taken, so a slow machine cannot fail it).
    let bound = 2 + elapsed_ms / layout::RESCAN_MS;
    assert!(
        rooms <= bound,
        "{rooms} looks for room in {elapsed_ms} ms (at most {bound}) for {refused} refused calls"
    );
}

#[test]
fn a_thread_cancelled_inside_a_group_reservation_is_cancelled_not_aborted() {
    let g = Group::new("cancel");
    let (mut holder, _out) = spawn_churn_holder(&g.0);
    // The worker's first pinning call joins the group, which reads the holder's /proc entry, and
    // each refused one may look for dead members: with a cancellation pending, a cancellation
    // point there would unwind through pinguard.
    let r = run(
        prog().to_str().unwrap(),
        &["cancel", "50"],
        &[("PINGUARD_GROUP", &g.0), ("PINGUARD_DEPTH", "0")],
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        r.success(),
        "the process died: {:?}\n{}",
        r.out.status,
        r.stderr
    );
    assert!(
        r.stdout.contains("canceled=1 refused=50"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
}

#[test]
fn a_request_whose_sum_overflows_leaves_the_group_counters_exact() {
    let max = u64::MAX.to_string();
    let huge_bad_flags = format!("cuda_alloc:{max}:999"); // the runtime rejects it (invalid flags)
    let huge = format!("cuda_alloc:{max}");
    for policy in ["error", "warn", "downgrade"] {
        let g = Group::new(&format!("overflow-{policy}"));
        let dir = fresh_dir("overflow");
        let report = dir.join("mid.json");
        let report_op = format!("report:{}", report.display());
        let ops = [
            "cuda_alloc:524288",
            &huge_bad_flags,
            &huge,
            "cuda_alloc:524288:1",
            "cuda_alloc:4096",
            &report_op,
        ];
        let r = run(
            "scenario",
            &ops,
            &[
                ("PINGUARD_GROUP", &g.0),
                ("PINGUARD_GROUP_BUDGET", "1M"),
                ("PINGUARD_POLICY", policy),
            ],
        );
        assert!(r.success(), "{policy}: {}", r.stderr);
        assert_eq!(r.rc("cuda_alloc:524288"), 0, "{policy}");
        assert_eq!(
            r.rc(&huge_bad_flags),
            1,
            "{policy}: the runtime's own answer"
        );
        assert_eq!(
            r.rc("cuda_alloc:524288:1"),
            0,
            "{policy}: the rest of the budget is there"
        );
        let used = read_report(&report).group.expect("a group").used_bytes;
        match policy {
            "error" => {
                assert_eq!(
                    r.rc("cuda_alloc:4096"),
                    2,
                    "{policy}: the group is full, and knows it"
                );
                assert_eq!(used, 1 << 20, "{policy}");
            }
            "downgrade" => assert_eq!(used, 1 << 20, "{policy}: the 4 KiB were downgraded"),
            _ => assert_eq!(
                used,
                (1 << 20) + 4096,
                "{policy}: the live bytes, no more, no less"
            ),
        }
        assert!(g.gone(), "{policy}: the member left, the last");
    }
    // The case: nothing else live, the huge request, then the whole budget.
    let g = Group::new("overflow-alone");
    let r = run(
        "scenario",
        &[&huge, "cuda_alloc:1048576"],
        &[("PINGUARD_GROUP", &g.0), ("PINGUARD_GROUP_BUDGET", "1M")],
    );
    assert_ne!(r.rc(&huge), 0);
    assert_eq!(r.rc("cuda_alloc:1048576"), 0, "{}", r.stderr);
}

#[test]
fn a_ledger_other_users_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let g = Group::new("mode");
    let env = [
        ("PINGUARD_GROUP", g.0.as_str()),
        ("PINGUARD_GROUP_BUDGET", "16K"),
        ("PINGUARD_BUDGET", "1M"),
    ];
    // Read while a member keeps the ledger (the last to leave removes it).
    let held = Held::start(&fresh_dir("mode-held"), &["cuda_alloc:4096"], &env);
    assert_eq!(
        std::fs::metadata(g.path()).unwrap().permissions().mode() & 0o777,
        0o600,
        "created private"
    );
    held.kill();
    // Anyone who may write the file may set the budget or the shares: not a ledger to trust.
    std::fs::set_permissions(g.path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let r = run("scenario", &["cuda_alloc:65536"], &env);
    assert_eq!(
        r.rc("cuda_alloc:65536"),
        0,
        "the group budget is not in force"
    );
    let lines: Vec<_> = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("PINGUARD_GROUP="))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(
        lines[0].contains("writable by other users") && lines[0].contains("process budget only"),
        "{}",
        lines[0]
    );
    assert!(r.typed_report().group.is_none());
}

#[test]
fn a_member_that_cannot_read_proc_takes_no_share_and_escapes_no_budget() {
    let g = Group::new("nofile");
    let (mut holder, _out) = spawn_churn_holder(&g.0); // 64 KiB of 100 KiB
                                                       // With no descriptor left, /proc cannot be read: that says nothing of the holder (before, it
                                                       // was taken for dead and its share given away) nor of this process's own start time (before,
                                                       // it joined with start time 0 and would have been taken for dead by the next look).
    let r = run(
        prog().to_str().unwrap(),
        &["nofile"],
        &[("PINGUARD_GROUP", &g.0), ("PINGUARD_DEPTH", "0")],
    );
    let holder_share = g
        .members()
        .into_iter()
        .find(|m| m.0 == holder.id())
        .map(|m| m.1);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(r.success(), "{}", r.stderr);
    assert!(
        r.stdout.contains("starved=2 big=2 small=0"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    assert!(
        holder_share.is_some_and(|b| b >= 65536),
        "the holder keeps its share: {holder_share:?}"
    );
}

fn ledger_lock() -> PathBuf {
    fixture_set("safety_group").join("ledger_lock")
}

/// A child that is continued and killed when the test ends, however it ends (a stopped process
/// must not outlive a failed test).
struct Reaped(Child);
impl Drop for Reaped {
    fn drop(&mut self) {
        // SAFETY: signals this test's own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGCONT) };
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child's stdout, a line at a time, with a deadline: a call that hangs fails the test.
struct Lines(std::sync::mpsc::Receiver<String>);
impl Lines {
    fn of(child: &mut Child) -> Lines {
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                if tx.send(l.unwrap_or_default()).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }
    fn next(&self, what: &str) -> String {
        self.0
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no answer in 10 s to {what}: it hangs"))
    }
}

/// Whether process `pid` is stopped (state `T` in its `stat`).
fn stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
}

/// `rc=RC ms=MS`, as the `steps` mode answers each call.
fn rc_ms(line: &str) -> (i64, i64) {
    (field(line, "rc"), field(line, "ms"))
}

/// The longest a pinning call may wait on the ledger, with room for a slow, shared machine: the
/// library's bound is tens of milliseconds (`budget::group`), a stopped holder's is forever.
const CALL_MS: i64 = 500;

#[test]
fn a_member_stopped_holding_the_ledgers_lock_freezes_nobody() {
    let g = Group::new("stopped");
    let f = fixtures();
    let dir = fresh_dir("stopped");
    let metrics = dir.join("m.%p.prom");
    let env = |cmd: &mut std::process::Command| {
        clear_pinguard_env(cmd);
        cmd.env("PINGUARD_GROUP", &g.0)
            .env("PINGUARD_GROUP_BUDGET", "1M")
            .env("PINGUARD_POLICY", "error")
            .env("PINGUARD_DEPTH", "0")
            .env("PINGUARD_REPORT", dir.join("r.%p.json"))
            .env("PINGUARD_METRICS", &metrics);
    };
    // A member that pins before, during and after the stop.
    let mut cmd = program(&prog(), Some(f.lib.as_os_str()));
    env(&mut cmd);
    // Its metrics are read before it exits (the file goes with it): rewritten often.
    cmd.env("PINGUARD_INTERVAL", "200ms");
    let mut member = Reaped(
        cmd.arg("steps")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdin = member.0.stdin.take().unwrap();
    let out = Lines::of(&mut member.0);
    let mut step = |s: &str| -> (i64, i64) {
        writeln!(stdin, "{s}").unwrap();
        rc_ms(&out.next(s))
    };
    assert_eq!(step("alloc 262144").0, 0);
    // And one that pins, then exits while the ledger is locked.
    let mut cmd = program(&prog(), Some(f.lib.as_os_str()));
    env(&mut cmd);
    let mut leaver = Reaped(
        cmd.arg("steps")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut leaver_in = leaver.0.stdin.take().unwrap();
    let leaver_out = Lines::of(&mut leaver.0);
    writeln!(leaver_in, "alloc 131072").unwrap();
    assert_eq!(rc_ms(&leaver_out.next("the leaver's call")).0, 0);
    assert_eq!(g.header().used, 262144 + 131072);

    // Another process takes the ledger's lock and stops holding it.
    let offset = std::mem::offset_of!(Header, mutex).to_string();
    let mut holder = Reaped(
        std::process::Command::new(ledger_lock())
            .args([&g.path(), &offset])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let held = Lines::of(&mut holder.0);
    assert_eq!(held.next("locking the ledger"), "locked");
    let t = std::time::Instant::now();
    while !stopped(holder.0.id()) {
        assert!(t.elapsed().as_secs() < 10, "the holder did not stop");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }

    // (a) A process that pins nothing starts and ends as without pinguard.
    let mut cmd = program(std::path::Path::new("/bin/true"), Some(f.lib.as_os_str()));
    env(&mut cmd);
    let t = std::time::Instant::now();
    let o = run_bounded(&mut cmd, std::time::Duration::from_secs(10));
    assert!(o.status.success(), "{o:?}");
    assert!(
        t.elapsed().as_millis() < 2000,
        "/bin/true took {:?}",
        t.elapsed()
    );
    eprintln!("/bin/true in the stopped group: {:?}", t.elapsed());

    // (b) The member's calls are answered within the bound, by the policy (error: refused), and
    // its release is not lost; a new process is refused the same way.
    for i in 0..3 {
        let (rc, ms) = step("alloc 65536");
        assert_eq!(
            rc, 2,
            "call {i}: refused, the group's budget cannot be checked"
        );
        assert!(ms <= CALL_MS, "call {i} waited {ms} ms");
        eprintln!("refused call {i} in the stopped group: {ms} ms");
    }
    let (rc, ms) = step("free 0");
    assert_eq!(rc, 0);
    assert!(ms <= CALL_MS, "the release waited {ms} ms");
    let mut cmd = program(&f.dir.join("scenario"), Some(f.lib.as_os_str()));
    env(&mut cmd);
    let newcomer = dir.join("newcomer.json");
    let o = run_bounded(
        cmd.args(["cuda_alloc:4096", &format!("report:{}", newcomer.display())]),
        std::time::Duration::from_secs(10),
    );
    let r = Run::from_output(o, dir.clone());
    assert_eq!(r.rc("cuda_alloc:4096"), 2, "{}", r.stderr);
    assert_eq!(
        read_report(&newcomer).events[0].reason,
        Some(Limit::GroupUnavailable),
        "{}",
        r.stderr
    );
    // Other policies answer the same way, and say why.
    for (policy, rc, kind) in [
        ("downgrade", 0, EventKind::Downgraded),
        ("warn", 0, EventKind::OverBudget),
    ] {
        let mut cmd = program(&f.dir.join("scenario"), Some(f.lib.as_os_str()));
        env(&mut cmd);
        let report = dir.join(format!("{policy}.json"));
        let o = run_bounded(
            cmd.env("PINGUARD_POLICY", policy)
                .args(["cuda_alloc:4096", &format!("report:{}", report.display())]),
            std::time::Duration::from_secs(10),
        );
        let r = Run::from_output(o, dir.clone());
        assert_eq!(r.rc("cuda_alloc:4096"), rc, "{policy}: {}", r.stderr);
        let e = &read_report(&report).events[0];
        assert_eq!(
            (e.kind, e.reason),
            (kind, Some(Limit::GroupUnavailable)),
            "{policy}: {}",
            r.stderr
        );
        if policy == "warn" {
            assert!(
                pinguard_lines(&r.stderr)
                    .iter()
                    .any(|l| l.contains("group_unavailable") && l.contains("allowed")),
                "{}",
                r.stderr
            );
        }
    }
    // A member's exit does not wait past the bound either; its share stays booked until it is
    // found gone.
    let t = std::time::Instant::now();
    writeln!(leaver_in, "exit").unwrap();
    assert!(leaver.0.wait().unwrap().success());
    assert!(
        t.elapsed().as_millis() < 2000,
        "the exit took {:?}",
        t.elapsed()
    );
    eprintln!("a member's exit in the stopped group: {:?}", t.elapsed());
    assert_eq!(
        g.header().used,
        262144 + 131072,
        "nothing was booked past the lock, and the budget held"
    );

    // (c) Continued, the holder lets go: the member's calls go through again, the release it
    // made meanwhile is applied, and the figures are exact.
    // SAFETY: signals this test's own child.
    unsafe { libc::kill(holder.0.id() as i32, libc::SIGCONT) };
    assert_eq!(held.next("unlocking"), "unlocked");
    let (rc, ms) = step("alloc 65536");
    assert_eq!(rc, 0, "the group is back");
    assert!(ms <= CALL_MS, "{ms} ms");
    let h = g.header();
    assert_eq!(
        h.used,
        65536 + 131072,
        "the release made while the ledger was locked is applied"
    );
    let mut members = g.members();
    members.sort();
    let mut want = vec![(member.0.id(), 65536), (leaver.0.id(), 131072)];
    want.sort();
    assert_eq!(members, want);
    assert_eq!(step("free 4").0, 0);
    assert_eq!(
        step("alloc 1048576").0,
        0,
        "the whole budget is there again (the leaver found gone)"
    );
    assert_eq!(g.header().used, 1 << 20);
    assert_eq!(g.members(), vec![(member.0.id(), 1 << 20)]);
    // What the refused calls got is in the metrics while the member runs.
    let prom = dir.join(format!("m.{}.prom", member.0.id()));
    let unavailable = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("pinguard_group_unavailable_total{"))
            .map(str::to_string)
    };
    let t = std::time::Instant::now();
    while !std::fs::read_to_string(&prom)
        .ok()
        .and_then(|p| unavailable(&p))
        .is_some_and(|l| l.ends_with(" 3"))
    {
        assert!(
            t.elapsed().as_secs() < 20,
            "{:?}",
            std::fs::read_to_string(&prom)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    writeln!(stdin, "exit").unwrap();
    drop(stdin);
    let pid = member.0.id();
    let status = member.0.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(member.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        g.gone(),
        "the member left, the last: the ledger went with it"
    );

    // What the refused calls got is in the report and the exit line; the metrics file is gone.
    let report = read_report(&dir.join(format!("r.{pid}.json")));
    let reasons: Vec<_> = report.events.iter().map(|e| (e.kind, e.reason)).collect();
    assert_eq!(
        reasons,
        vec![(EventKind::Denied, Some(Limit::GroupUnavailable)); 3],
        "{:?}",
        report.events
    );
    assert_eq!(report.totals.group_unavailable_count, 3);
    assert_eq!(report.totals.denied_count, 3);
    assert!(!prom.exists(), "the metrics file went with its process");
    let exit = pinguard_lines(&stderr)
        .into_iter()
        .find(|l| l.starts_with(&format!("pinguard[{pid}]:")))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        exit.contains("3 denied") && exit.contains("3 of them group_unavailable"),
        "{exit}"
    );
}
