//! A pod's containers share one group budget: members in different PID namespaces (one IPC
//! namespace and one `/dev/shm`, as a pod's containers without `shareProcessNamespace`) tell each
//! other alive by the group's semaphores, not by pids. Each member runs under
//! `unshare --pid --fork --mount-proc` (root), so its pid is 1 in its own namespace, and the
//! pod's pinned bytes are counted by the emulated runtimes themselves (`EMU_SHARED_COUNTER`).

use crate::common;
use common::*;
use pinguard_common::group::{self as layout, Header};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};

const BUDGET: u64 = 1 << 20;
const HELD: u64 = 768 * 1024;
const MORE: u64 = 512 * 1024;

/// tests/progs/pod_member.c (`tests/fixtures.txt`, set `pod_group`).
fn prog() -> PathBuf {
    fixture_set("pod_group").join("pod_member")
}

/// Whether this machine can give a process a PID namespace of its own; else the tests say why
/// and pass, unless `PGTEST_REQUIRE_ALL` is set.
fn pid_namespaces() -> bool {
    let ok = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "unshare --pid --fork --mount-proc must work here (root)"
        );
        eprintln!("NOT RUN: unshare --pid --fork --mount-proc does not work here (needs root and util-linux)");
    }
    ok
}

/// A group with its ledger and semaphore set removed before and after, and the pod's counter.
struct Pod {
    name: String,
    counter: PathBuf,
}

impl Pod {
    fn new(tag: &str) -> Pod {
        let name = format!("test-pod-{tag}-{}", std::process::id());
        let counter = fresh_dir("pod").join("counter");
        std::fs::write(&counter, [0u8; 16]).unwrap();
        let p = Pod { name, counter };
        p.remove();
        p
    }
    fn path(&self) -> String {
        layout::path(&self.name)
    }
    /// The ledger is gone: its last member removed it (every share back, the set removed).
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
    /// Each member's slot, share and semaphore key.
    fn members(&self) -> Vec<(usize, u64, i32)> {
        self.header()
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.pid != 0)
            .map(|(i, m)| (i, m.bytes, m.sem_key))
            .collect()
    }
    /// The runtimes' pinned bytes now and the most ever, all members together.
    fn counted(&self) -> (i64, i64) {
        let c = std::fs::read(&self.counter).unwrap();
        (
            i64::from_ne_bytes(c[0..8].try_into().unwrap()),
            i64::from_ne_bytes(c[8..16].try_into().unwrap()),
        )
    }
    /// The values of the group's semaphores, read by key in this (the pod's) IPC namespace.
    fn semaphores(&self) -> Vec<u16> {
        let key = self.header().sem_key;
        assert_ne!(key, 0, "the group has a semaphore set");
        // SAFETY: no pointers.
        let id = unsafe { libc::semget(key, 0, 0) };
        assert!(
            id >= 0,
            "the set exists: {}",
            std::io::Error::last_os_error()
        );
        let mut v = vec![0u16; layout::MAX_MEMBERS];
        // SAFETY: GETALL writes MAX_MEMBERS unsigned shorts (the set's size) into `v`.
        let rc = unsafe { libc::semctl(id, 0, libc::GETALL, v.as_mut_ptr()) };
        assert_eq!(rc, 0);
        v
    }
    fn remove(&self) {
        remove_semaphores(&self.path());
        let _ = std::fs::remove_file(self.path());
    }

    /// `pod_member ARGS` as a member of this group, in a PID namespace of its own.
    fn spawn(&self, args: &[&str]) -> Member {
        self.spawn_in(true, args)
    }

    /// `pod_member ARGS` as a member of this group, in a PID namespace of its own (`own`) or in
    /// the test's, always below an `unshare`.
    fn spawn_in(&self, own: bool, args: &[&str]) -> Member {
        let f = fixtures();
        let inner = program(&prog(), Some(f.lib.as_os_str()));
        let mut cmd = Command::new("unshare");
        // --kill-child: a member outlives no test that failed half-way.
        let ns: &[&str] = if own { &["--pid", "--mount-proc"] } else { &[] };
        cmd.args(ns)
            .args(["--fork", "--kill-child", "--"])
            .arg(inner.get_program())
            .args(inner.get_args())
            .args(args);
        clear_pinguard_env(&mut cmd);
        for (k, v) in inner.get_envs() {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        let reports = fresh_dir("pod");
        let mut child = cmd
            .env("PINGUARD_GROUP", &self.name)
            .env("PINGUARD_GROUP_BUDGET", BUDGET.to_string())
            .env("PINGUARD_DEPTH", "0")
            .env("PINGUARD_REPORT", reports.join("r.%p.json"))
            .env("EMU_SHARED_COUNTER", &self.counter)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Member {
            unshare: child,
            out,
            reports,
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A member process and the `unshare` above it.
struct Member {
    unshare: Child,
    out: BufReader<ChildStdout>,
    /// Where its report goes.
    reports: PathBuf,
}

impl Member {
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l.trim().to_string()
    }
    /// The member's pid as this test sees it (unshare's child).
    fn pid(&self) -> u32 {
        let u = self.unshare.id();
        for _ in 0..500 {
            let kids =
                std::fs::read_to_string(format!("/proc/{u}/task/{u}/children")).unwrap_or_default();
            if let Some(p) = kids.split_whitespace().next() {
                return p.parse().unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        panic!("unshare {u} has no child");
    }
    fn pid_ns(&self) -> String {
        std::fs::read_link(format!("/proc/{}/ns/pid", self.pid()))
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }
    /// SIGKILL to the member itself; returns CLOCK_MONOTONIC milliseconds once it is gone.
    /// The moment of the kill: a share can come back no earlier. (Taken after the wait, a loaded
    /// machine's delay in reaping made a reclaim seem to come before the death.)
    fn kill(mut self) -> f64 {
        let at = monotonic_ms();
        // SAFETY: signals a process of this test's.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, libc::SIGKILL) }, 0);
        self.unshare.wait().unwrap(); // unshare ends once its child did
        at
    }
    fn finish(mut self) -> std::process::ExitStatus {
        let _ = self.unshare.stdin.take().unwrap().write_all(b"done\n");
        self.unshare.wait().unwrap()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // Already waited for, or killed now with its child (`--kill-child`).
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

fn monotonic_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// `got=G tries=N at_ms=T` of `fill`.
fn filled(line: &str) -> (bool, u64, f64) {
    let v: Vec<&str> = line
        .split_whitespace()
        .map(|kv| kv.split_once('=').unwrap_or_else(|| panic!("{line:?}")).1)
        .collect();
    (v[0] == "1", v[1].parse().unwrap(), v[2].parse().unwrap())
}

/// A member holding 768 KiB of the 1 MiB budget (its `hold` mode `how`), a second member in
/// another PID namespace that tries for 512 KiB for `ms` milliseconds: it must get nothing, the
/// holder keeps its share and its semaphore, and the pod never pins past its budget.
fn holder_is_kept(pod: &Pod, how: &str, ms: u64) -> Member {
    let mut holder = pod.spawn(&["hold", &HELD.to_string(), how]);
    assert_eq!(holder.line(), "ready rc=0", "{how}: the holder pins");
    let mut filler = pod.spawn(&["fill", &MORE.to_string(), &ms.to_string()]);
    let (got, tries, _) = filled(&filler.line());
    assert_ne!(holder.pid_ns(), filler.pid_ns(), "two PID namespaces");
    assert!(filler.finish().success());
    let members = pod.members();
    let sems = pod.semaphores();
    assert!(!got, "{how}: the live holder (another PID namespace) was taken for dead and its share given away after {tries} tries");
    assert!(tries > 10, "{how}: the filler kept trying ({tries})");
    let (_, max) = pod.counted();
    assert!(
        max as u64 <= BUDGET,
        "{how}: the pod's runtimes held {max} bytes at once, over the {BUDGET}-byte budget"
    );
    assert_eq!(
        max as u64, HELD,
        "{how}: the holder's bytes, counted by the runtime"
    );
    let (slot, share, key) = members
        .iter()
        .copied()
        .find(|m| m.1 > 0)
        .unwrap_or_else(|| panic!("{how}: no share: {members:?}"));
    assert_eq!(
        share, HELD,
        "{how}: the holder keeps its share: {members:?}"
    );
    assert_eq!(
        key,
        pod.header().sem_key,
        "{how}: the holder holds a semaphore of the group's set"
    );
    assert_eq!(sems[slot], 1, "{how}: its semaphore is raised");
    assert_eq!(
        sems.iter().map(|&v| v as usize).sum::<usize>(),
        1,
        "{how}: and only its, once the filler left: {members:?}"
    );
    holder
}

/// After `holder` is SIGKILLed, a new member in another PID namespace gets its room at its
/// first call (the look made when it joins).
fn reclaimed_at_join(pod: &Pod, holder: Member, how: &str) {
    holder.kill();
    forget_killed(pod, HELD);
    let mut next = pod.spawn(&["fill", &MORE.to_string(), "2000"]);
    let (got, tries, _) = filled(&next.line());
    assert!(next.finish().success());
    assert!(got && tries == 1, "{how}: the killed holder's share comes back when a member joins (got={got}, tries={tries})");
    assert!(pod.gone(), "{how}: the last member removed the ledger");
    assert!(
        pod.counted().1 as u64 <= BUDGET,
        "{how}: {:?}",
        pod.counted()
    );
}

/// Takes a SIGKILLed member's bytes off the runtimes' count: the kernel freed them, and the
/// runtime could not count that.
fn forget_killed(pod: &Pod, bytes: u64) {
    let mut c = std::fs::read(&pod.counter).unwrap();
    let now = i64::from_ne_bytes(c[0..8].try_into().unwrap()) - bytes as i64;
    c[0..8].copy_from_slice(&now.to_ne_bytes());
    std::fs::write(&pod.counter, c).unwrap();
}

#[test]
fn a_live_member_in_another_pid_namespace_keeps_its_share() {
    if !pid_namespaces() {
        return;
    }
    let pod = Pod::new("live");
    // 400 ms of refusals: four looks for room at least (one per 100 ms while the group is full).
    let holder = holder_is_kept(&pod, "", 400);
    let key = pod.header().sem_key;
    assert!(holder.finish().success());
    // The last member to leave removed the ledger and the set: nothing of the group is left.
    assert!(pod.gone(), "the holder left");
    // SAFETY: no pointers.
    let id = unsafe { libc::semget(key, 0, 0) };
    assert_eq!(id, -1, "the set {key:#x} is gone");
}

#[test]
fn a_sigkilled_member_in_another_pid_namespace_is_reclaimed_within_the_rescan_interval() {
    if !pid_namespaces() {
        return;
    }
    let pod = Pod::new("kill");
    let mut holder = pod.spawn(&["hold", &HELD.to_string()]);
    assert_eq!(holder.line(), "ready rc=0");
    // The filler joins while the holder lives, then keeps asking while the group is full.
    let mut filler = pod.spawn(&["fill", &MORE.to_string(), "5000"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (_, before) = pod.counted();
    let killed = holder.kill();
    let (got, tries, at) = filled(&filler.line());
    assert!(filler.finish().success());
    assert!(
        got,
        "the killed holder's share never came back ({tries} tries)"
    );
    let after = at - killed;
    eprintln!("reclaimed {after:.0} ms after the holder was gone ({tries} tries)");
    assert!(
        after >= -1.0,
        "the share came back before the holder died ({after:.0} ms)"
    );
    // Documented: within RESCAN_MS of a member needing room; the rest is a loaded machine's slack.
    assert!(
        after <= (layout::RESCAN_MS * 3) as f64,
        "reclaimed {after:.0} ms after the kill (RESCAN_MS {})",
        layout::RESCAN_MS
    );
    // The runtime's count keeps a SIGKILLed process's bytes (the kernel freed them): the
    // holder's alone until the kill, then the filler's.
    assert_eq!(
        before as u64, HELD,
        "the filler got nothing while the holder lived"
    );
    assert_eq!(
        pod.counted().1 as u64,
        HELD + MORE,
        "the filler's 512 KiB came after the kill"
    );
    assert!(pod.gone());
}

#[test]
fn a_member_that_closes_all_its_descriptors_stays_alive() {
    if !pid_namespaces() {
        return;
    }
    let pod = Pod::new("closeall");
    let holder = holder_is_kept(&pod, "closeall", 250);
    reclaimed_at_join(&pod, holder, "closeall");
}

#[test]
fn a_member_whose_joining_thread_exited_stays_alive() {
    if !pid_namespaces() {
        return;
    }
    let pod = Pod::new("threadexit");
    let holder = holder_is_kept(&pod, "threadexit", 250);
    reclaimed_at_join(&pod, holder, "threadexit");
}

#[test]
fn an_exec_d_member_keeps_one_slot_and_one_semaphore() {
    if !pid_namespaces() {
        return;
    }
    let pod = Pod::new("exec");
    // The old image pins 768 KiB and execs; the new image pins 768 KiB again ("ready rc=0": the
    // old share went back at exec) and holds the old image's slot and semaphore.
    let holder = holder_is_kept(&pod, "exec", 250);
    reclaimed_at_join(&pod, holder, "exec");
}

#[test]
fn a_member_denied_semaphores_is_told_alive_by_its_pid_in_its_own_pid_namespace_only() {
    if !pid_namespaces() {
        return;
    }
    let pod = Pod::new("nosem");
    // A sandbox answers the semaphore calls with EPERM: the member joins without one, says so,
    // and is judged by its pid. In the test's PID namespace: kept while it lives...
    let mut holder = pod.spawn_in(false, &["hold", &HELD.to_string(), "nosem"]);
    assert_eq!(holder.line(), "ready rc=0");
    let mut filler = pod.spawn_in(false, &["fill", &MORE.to_string(), "250"]);
    let (got, _, _) = filled(&filler.line());
    assert!(filler.finish().success());
    assert!(
        !got,
        "the live holder without a semaphore was taken for dead"
    );
    let reports = holder.reports.clone();
    assert!(holder.finish().success());
    let report = reports_in(&reports).pop().expect("the holder's report");
    let liveness = read_report(&report)
        .group
        .and_then(|g| g.liveness)
        .unwrap_or_default();
    assert!(
        liveness.starts_with("pid (System V semaphores unavailable")
            && liveness.contains("not permitted"),
        "{liveness:?}"
    );
    // ...and reclaimed, from its PID namespace, once SIGKILLed.
    let mut holder = pod.spawn_in(false, &["hold", &HELD.to_string(), "nosem"]);
    assert_eq!(holder.line(), "ready rc=0");
    holder.kill();
    forget_killed(&pod, HELD);
    let mut next = pod.spawn_in(false, &["fill", &MORE.to_string(), "2000"]);
    let (got, tries, _) = filled(&next.line());
    assert!(next.finish().success());
    assert!(
        got && tries == 1,
        "reclaimed by its pid at the next join (got={got}, tries={tries})"
    );
    // From another PID namespace nothing proves it dead: never reclaimed (the documented limit).
    // The test keeps the holder's namespace open: a namespace that ended gives its number to the
    // next one, whose members then read the pid in the right place (and find it gone).
    let mut holder = pod.spawn(&["hold", &HELD.to_string(), "nosem"]);
    assert_eq!(holder.line(), "ready rc=0");
    let _ns = std::fs::File::open(format!("/proc/{}/ns/pid", holder.pid())).unwrap();
    holder.kill();
    forget_killed(&pod, HELD);
    let mut other = pod.spawn(&["fill", &MORE.to_string(), "250"]);
    let (got, _, _) = filled(&other.line());
    assert!(other.finish().success());
    assert!(!got, "a member nobody can prove dead keeps its share");
    assert!(pod.counted().1 as u64 <= BUDGET, "{:?}", pod.counted());
}
