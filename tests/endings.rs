//! Every way a process ends leaves its report (issue 16): a process that dies without writing
//! its report (SIGKILL, the OOM killer, a fatal signal left at its default) leaves its state,
//! which `pinguard report` reads as that process (`"killed"`), or writes its report on the way
//! out (`"fatal_signal"`); and none of it changes what the program sees: its exit status, its
//! core dump, the dispositions it finds at start, its own handlers.

use crate::common;
use common::*;
use pinguard_common::Reason;
use serde_json::Value;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Generous: a loaded machine may take seconds to start a process; a hang still fails.
const LIMIT: Duration = Duration::from_secs(60);

/// This file's C programs (`tests/fixtures.txt`, set `endings`).
fn progs() -> &'static Path {
    fixture_set("endings")
}

fn libcudart() -> String {
    fixtures()
        .dir
        .join("libcudart.so")
        .to_string_lossy()
        .into_owned()
}

/// The signals whose default action ends the process, by name as reports name them.
const FATAL: [(i32, &str); 10] = [
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGINT, "SIGINT"),
    (libc::SIGHUP, "SIGHUP"),
    (libc::SIGQUIT, "SIGQUIT"),
    (libc::SIGABRT, "SIGABRT"),
    (libc::SIGSEGV, "SIGSEGV"),
    (libc::SIGBUS, "SIGBUS"),
    (libc::SIGFPE, "SIGFPE"),
    (libc::SIGILL, "SIGILL"),
    (libc::SIGPIPE, "SIGPIPE"),
];

fn signame(sig: i32) -> &'static str {
    FATAL
        .iter()
        .find(|(s, _)| *s == sig)
        .map_or("?", |(_, n)| n)
}

/// `prog` (a program of this file, or a path) in `dir`, pinguard preloaded or not, reports going
/// to `dir` (`report.%p.json`), on a clean `PINGUARD_*`/`EMU_*` environment.
fn command(prog: &str, args: &[&str], dir: &Path, preload: bool) -> Command {
    let path = if prog.contains('/') {
        PathBuf::from(prog)
    } else {
        progs().join(prog)
    };
    let mut cmd = command_in(&path, dir, preload);
    cmd.args(args);
    cmd
}

fn python(script: &str, dir: &Path, preload: bool) -> Command {
    let mut cmd = command("/usr/bin/env", &["python3", "-c", script], dir, preload);
    cmd.env("PYTHONUNBUFFERED", "1");
    cmd
}

/// Whether a core dump lands in the process's working directory as `core*`, where the tests can
/// remove it: then core dumps are turned on, else (a crash reporter's pipe, a system directory)
/// the machine's own limit stands.
fn cores_here() -> bool {
    static HERE: OnceLock<bool> = OnceLock::new();
    *HERE.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/core_pattern")
            .is_ok_and(|p| p.starts_with("core") && !p.contains('/'))
    })
}

/// The child starts from a known signal state whatever the test harness inherited: every
/// disposition at the default but `ignored`, nothing blocked but `blocked`, and core dumps on (as
/// far as the hard limit allows, where they land in its directory), so that "the same core-dump
/// behaviour" compares something.
fn signal_state(cmd: &mut Command, ignored: &'static [i32], blocked: &'static [i32]) {
    let cores = cores_here();
    // SAFETY: between fork and exec only async-signal-safe calls (signal, sigprocmask,
    // getrlimit/setrlimit) on the child's own state.
    unsafe {
        cmd.pre_exec(move || {
            for s in 1..32 {
                if s != libc::SIGKILL && s != libc::SIGSTOP {
                    libc::signal(
                        s,
                        if ignored.contains(&s) {
                            libc::SIG_IGN
                        } else {
                            libc::SIG_DFL
                        },
                    );
                }
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &s in blocked {
                libc::sigaddset(&mut set, s);
            }
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            let mut lim: libc::rlimit = std::mem::zeroed();
            if cores && libc::getrlimit(libc::RLIMIT_CORE, &mut lim) == 0 {
                lim.rlim_cur = lim.rlim_max.min(1 << 30);
                libc::setrlimit(libc::RLIMIT_CORE, &lim);
            }
            Ok(())
        });
    }
}

/// A running child whose stdout lines arrive on a channel, so that a test waits for a line with
/// a deadline instead of sleeping.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    stderr: mpsc::Receiver<String>,
}

struct Ended {
    status: ExitStatus,
    pid: u32,
    stdout: String,
    stderr: String,
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Proc {
        // Its own process group: a hung child and anything it started are killed together.
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let (tx, stderr) = mpsc::channel();
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = err.read_to_end(&mut s);
            let _ = tx.send(String::from_utf8_lossy(&s).into_owned());
        });
        Proc {
            child,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a line that starts with `prefix` and returns it.
    fn wait_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(e) => {
                    let pid = self.pid() as i32;
                    // SAFETY: signals the test's own child's process group.
                    unsafe { libc::kill(-pid, libc::SIGKILL) };
                    let end = self.end();
                    panic!(
                        "no {prefix:?} line ({e:?}): status {:?}\nstdout:\n{}\nstderr:\n{}",
                        end.status, end.stdout, end.stderr
                    );
                }
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signals the test's own child, which has not been waited for yet.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, sig) }, 0);
    }

    /// Waits for the end (killing the group past the deadline) and collects the output.
    fn finish(mut self) -> Ended {
        self.end()
    }

    fn end(&mut self) -> Ended {
        let pid = self.pid();
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                // SAFETY: as in `wait_line`.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
                let s = self.child.wait().unwrap();
                let err = self
                    .stderr
                    .recv_timeout(Duration::from_secs(5))
                    .unwrap_or_default();
                panic!("pid {pid} still running after {LIMIT:?} (now {s:?}); stdout so far:\n{}\nstderr:\n{err}", self.seen.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // The readers end at EOF, which a grandchild that still holds the pipes puts off: it gets
        // a while to finish, then it is killed.
        let stderr = self
            .stderr
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| {
                // SAFETY: the group the test's own child led; only its leftovers are in it.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
                self.stderr
                    .recv_timeout(Duration::from_secs(10))
                    .unwrap_or_default()
            });
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        Ended {
            status,
            pid,
            stdout: self.seen.join("\n"),
            stderr,
        }
    }
}

/// `pinguard report --json DIR`, parsed, or what went wrong (JSON: the CLI's merged view, not a
/// report).
fn report_json(dir: &Path) -> Result<Value, String> {
    let o = pinguard_cli(&[OsStr::new("report"), OsStr::new("--json"), dir.as_os_str()]);
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        return Err(format!(
            "`pinguard report --json` exited {:?}: {err}\nin the directory: {}",
            o.status,
            listing(dir)
        ));
    }
    serde_json::from_slice(&o.stdout)
        .map_err(|e| format!("`pinguard report --json` printed no JSON ({e}): {err}"))
}

fn listing(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.join(" ")
}

/// The one `per_process` line of `pid`.
fn process_line(rep: &Value, pid: u32) -> Result<&Value, String> {
    let lines: Vec<&Value> = rep["per_process"]
        .as_array()
        .map(|a| a.iter().filter(|p| p["pid"] == pid).collect())
        .unwrap_or_default();
    match lines.as_slice() {
        [one] => Ok(one),
        [] => Err(format!(
            "pid {pid} is not in per_process: {}",
            rep["per_process"]
        )),
        many => Err(format!(
            "pid {pid} is in per_process {} times (counted twice): {many:?}",
            many.len()
        )),
    }
}

/// The signal a `fatal_signal` line names: its own `signal`, else its report's `process.signal`.
fn named_signal(line: &Value) -> Option<String> {
    if let Some(s) = line["signal"].as_str() {
        return Some(s.to_string());
    }
    let path = line["path"].as_str()?;
    Report::from_slice(&std::fs::read(path).ok()?)
        .ok()?
        .process
        .signal
}

/// What `pinguard report` makes of a process that `sig` ended: it is there, `"killed"` (its
/// state) or `"fatal_signal"` (its report, naming `sig`), with exactly these live figures.
fn check_death(
    dir: &Path,
    pid: u32,
    sig: i32,
    live_bytes: u64,
    live_count: u64,
) -> Result<(), String> {
    let rep = report_json(dir)?;
    let line = process_line(&rep, pid)?;
    match line["reason"].as_str() {
        Some("killed") => {}
        Some("fatal_signal") => {
            let named = named_signal(line);
            if named.as_deref() != Some(signame(sig)) {
                return Err(format!(
                    "a fatal_signal report naming {named:?}, not {}: {line}",
                    signame(sig)
                ));
            }
        }
        other => {
            return Err(format!(
                "reason {other:?}, not killed or fatal_signal: {line}"
            ))
        }
    }
    let t = &line["totals"];
    if t["live_bytes"] != live_bytes || t["live_count"] != live_count {
        return Err(format!(
            "live {} bytes in {} allocations, not {live_bytes} in {live_count}: {line}",
            t["live_bytes"], t["live_count"]
        ));
    }
    Ok(())
}

fn state_files(dir: &Path) -> Vec<String> {
    listing(dir)
        .split(' ')
        .filter(|n| n.ends_with(".state"))
        .map(str::to_string)
        .collect()
}

/// Core files are large and say nothing the exit status did not.
fn remove_cores(dir: &Path) {
    for n in listing(dir).split(' ').filter(|n| n.starts_with("core")) {
        let _ = std::fs::remove_file(dir.join(n));
    }
}

/// The lines that differ, under pinguard and without.
fn differing(with: &str, without: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (with.lines().collect(), without.lines().collect());
    let mut d: Vec<String> = (0..a.len().max(b.len()))
        .filter(|&i| a.get(i) != b.get(i))
        .map(|i| {
            format!(
                "  under pinguard: {:?}\n  without:        {:?}",
                a.get(i),
                b.get(i)
            )
        })
        .collect();
    d.truncate(20);
    d.join("\n")
}

/// Panics with every failure at once: which signals fail says more than the first.
fn all_passed(what: &str, failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{what}: {} failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A small generator for the random moments; the seed is printed so that a failure can be rerun
/// (PGTEST_SEED).
struct Rng(u64);
impl Rng {
    fn new(what: &str) -> Rng {
        let seed = std::env::var("PGTEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("{what}: PGTEST_SEED={seed}");
        Rng(seed)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

// ---- SIGKILL at any moment: the state is exact -----------------------------------------------

/// The largest size end_pinners pins, and its threads: the calls that may be in flight.
const PINNERS_MAX_SIZE: i64 = 98304;
const PINNERS_THREADS: i64 = 4;

#[test]
fn kill_9_at_random_moments_under_four_pinning_threads_leaves_a_state_exact_to_the_runtimes_count()
{
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;
    // The rounds' seeds and delays drawn in order, as one after the other drew them (PGTEST_SEED
    // replays them); the rounds themselves run four at a time: each is a process of its own in a
    // folder of its own, and most of a round is waiting on it or on `pinguard report`.
    let mut rng = Rng::new("kill -9");
    let rounds: Vec<(u64, String, u64)> = (0..100)
        .map(|round| {
            let seed = rng.below(1 << 32).to_string();
            (round, seed, 5 + rng.below(76))
        })
        .collect();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let text_seen = AtomicBool::new(false);
    let one = |round: u64, seed: &str, delay: u64| -> Option<String> {
        let dir = fresh_dir("kill9");
        let counts = dir.join("emu");
        let mut cmd = command("end_pinners", &[seed], &dir, true);
        cmd.env("EMU_STATS_FILE", &counts);
        let mut p = Proc::spawn(&mut cmd);
        p.wait_line("pinning");
        std::thread::sleep(Duration::from_millis(delay));
        p.signal(libc::SIGKILL);
        let end = p.finish();
        assert_eq!(
            end.status.signal(),
            Some(libc::SIGKILL),
            "round {round}: {}",
            end.stderr
        );
        let emu = emu_stats_file(&counts, "cuda").expect("the runtime's counts (EMU_STATS_FILE)");
        let (emu_bytes, emu_count) = (
            emu["outstanding_bytes"].as_i64().unwrap(),
            emu["outstanding_count"].as_i64().unwrap(),
        );
        assert!(
            emu_count >= PINNERS_THREADS && emu["alloc_calls"].as_i64().unwrap() >= PINNERS_THREADS,
            "round {round}: {emu}"
        );
        let what = format!("round {round} (end_pinners {seed}, killed {delay} ms after it started pinning; the runtime held {emu_bytes} bytes in {emu_count})");
        let checked = (|| -> Result<(), String> {
            let rep = report_json(&dir)?;
            let line = process_line(&rep, end.pid)?;
            if line["reason"] != "killed" {
                return Err(format!("reason {}, not killed: {line}", line["reason"]));
            }
            let (bytes, count) = (
                line["totals"]["live_bytes"].as_i64().unwrap_or(-1),
                line["totals"]["live_count"].as_i64().unwrap_or(-1),
            );
            // Each thread may be inside one call, which the runtime may have counted and pinguard
            // not yet (or the reverse).
            if (bytes - emu_bytes).abs() > PINNERS_THREADS * PINNERS_MAX_SIZE
                || (count - emu_count).abs() > PINNERS_THREADS
            {
                return Err(format!(
                    "pinguard's state says {bytes} bytes in {count} allocations: {line}"
                ));
            }
            let top = &rep["callsites"][0];
            let frames = top["frames"].as_array().cloned().unwrap_or_default();
            let named = frames.iter().any(|f| {
                f["symbol"].as_str().is_some_and(|s| s.contains("pin_loop"))
                    && f["file"]
                        .as_str()
                        .is_some_and(|s| s.ends_with("end_pinners.c"))
                    && f["line"].as_u64().is_some_and(|l| l > 0)
            });
            if !named {
                return Err(format!(
                    "the top callsite is not symbolised to pin_loop in end_pinners.c:LINE: {top}"
                ));
            }
            if round.is_multiple_of(10) {
                let o = pinguard_cli(&[OsStr::new("report"), dir.as_os_str()]);
                let text = String::from_utf8_lossy(&o.stdout);
                if !o.status.success()
                    || !text.contains("pin_loop")
                    || !text.contains("end_pinners.c:")
                {
                    return Err(format!("`pinguard report` (text) exited {:?} without pin_loop end_pinners.c:LINE:\n{text}{}", o.status, String::from_utf8_lossy(&o.stderr)));
                }
                text_seen.store(true, Ordering::Relaxed);
            }
            Ok(())
        })();
        match checked {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(&dir);
                None
            }
            Err(e) => Some(format!("{what}: {e}\npinguard said:\n{}", end.stderr)),
        }
    };
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| loop {
                // Enough failures to see the pattern: the rest would take the same time to say
                // the same.
                if failures.lock().unwrap().len() >= 5 {
                    break;
                }
                let Some((round, seed, delay)) = rounds.get(next.fetch_add(1, Ordering::Relaxed))
                else {
                    break;
                };
                if let Some(failure) = one(*round, seed, *delay) {
                    failures.lock().unwrap().push(failure);
                }
            });
        }
    });
    all_passed(
        "kill -9 under pinning threads",
        failures.into_inner().unwrap(),
    );
    assert!(text_seen.load(Ordering::Relaxed));
}

// ---- Fatal signals: sent, raised, and the real faults ------------------------------------------

/// end_signals leaves these pinned: 8192 + 65536 + 12288.
const SIGNALS_LIVE: (u64, u64) = (86016, 3);

/// Runs end_signals SIG MODE with and without pinguard: the same exit status (the signal, and a
/// core dump or not, as without pinguard), and what `pinguard report` reads for the process.
fn ends_by(sig: i32, mode: &str) -> Result<(), String> {
    let name = signame(sig);
    let run = |preload: bool| -> (Ended, PathBuf) {
        let dir = fresh_dir(&format!("end-{mode}-{}", name.to_lowercase()));
        let mut cmd = command("end_signals", &[&sig.to_string(), mode], &dir, preload);
        cmd.env("EMU_STATS_FILE", dir.join("emu"));
        signal_state(&mut cmd, &[], &[]);
        let mut p = Proc::spawn(&mut cmd);
        if mode == "wait" {
            p.wait_line("ready");
            p.signal(sig);
        }
        let end = p.finish();
        // The figures expected of pinguard are the runtime's own.
        let emu = emu_stats_file(&dir.join("emu"), "cuda")
            .expect("the runtime's counts (EMU_STATS_FILE)");
        assert_eq!(
            (
                emu["outstanding_bytes"].as_u64(),
                emu["outstanding_count"].as_u64()
            ),
            (Some(SIGNALS_LIVE.0), Some(SIGNALS_LIVE.1)),
            "{name} {mode}"
        );
        (end, dir)
    };
    let (bare, bare_dir) = run(false);
    if bare.status.signal() != Some(sig) {
        return Err(format!(
            "{name} {mode}: without pinguard the program ended {:?}, not by {name}:\n{}",
            bare.status, bare.stderr
        ));
    }
    let (end, dir) = run(true);
    let result = (|| {
        if end.status.signal() != Some(sig) {
            return Err(format!(
                "ended {:?}, not by {name} (as without pinguard: {:?})",
                end.status, bare.status
            ));
        }
        if end.status.core_dumped() != bare.status.core_dumped() {
            return Err(format!(
                "core dumped: {} under pinguard, {} without",
                end.status.core_dumped(),
                bare.status.core_dumped()
            ));
        }
        check_death(&dir, end.pid, sig, SIGNALS_LIVE.0, SIGNALS_LIVE.1)
    })()
    .map_err(|e| format!("{name} {mode}: {e}\npinguard said:\n{}", end.stderr));
    remove_cores(&bare_dir);
    remove_cores(&dir);
    result
}

#[test]
fn every_fatal_signal_sent_from_outside_ends_the_process_as_before_and_leaves_its_figures() {
    let failures: Vec<String> = FATAL
        .iter()
        .filter_map(|&(sig, _)| ends_by(sig, "wait").err())
        .collect();
    all_passed("signals sent from outside", failures);
}

#[test]
fn every_fatal_signal_raised_from_inside_ends_the_process_as_before_and_leaves_its_figures() {
    let failures: Vec<String> = FATAL
        .iter()
        .filter_map(|&(sig, _)| ends_by(sig, "raise").err())
        .collect();
    all_passed("signals raised from inside", failures);
}

#[test]
fn real_faults_end_the_process_as_before_and_leave_its_figures() {
    let mut faults = vec![
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGPIPE,
        libc::SIGABRT,
    ];
    if !aarch64() {
        faults.push(libc::SIGFPE); // aarch64 divides by zero without a trap
    }
    let failures: Vec<String> = faults
        .into_iter()
        .filter_map(|sig| ends_by(sig, "fault").err())
        .collect();
    all_passed("real faults", failures);
}

// ---- What the program sees at start ----------------------------------------------------------

#[test]
fn the_dispositions_a_program_finds_at_start_are_the_ones_it_inherited() {
    // Everything at the default; then what nohup and a shell's background job leave (ignored),
    // with two signals blocked.
    const IGNORED: [i32; 5] = [
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGPIPE,
        libc::SIGUSR1,
    ];
    const BLOCKED: [i32; 2] = [libc::SIGTERM, libc::SIGUSR2];
    let inherited: [(&str, &'static [i32], &'static [i32]); 2] =
        [("default", &[], &[]), ("ignored", &IGNORED, &BLOCKED)];
    let envs: [&[(&str, &str)]; 2] = [
        &[],
        &[("PINGUARD_SIGNAL", "USR2"), ("PINGUARD_INTERVAL", "1s")],
    ];
    let mut failures = Vec::new();
    for (what, ignored, blocked) in inherited {
        let dir = fresh_dir("dispositions");
        let go = |preload: bool, env: &[(&str, &str)]| {
            let mut cmd = command("end_dispositions", &[], &dir, preload);
            signal_state(&mut cmd, ignored, blocked);
            cmd.envs(env.iter().copied());
            let end = Proc::spawn(&mut cmd).finish();
            assert_eq!(
                end.status.code(),
                Some(0),
                "{what} {env:?} preload={preload}: {}\n{}",
                end.stdout,
                end.stderr
            );
            end
        };
        let bare = go(false, &[]);
        // So that both runs cannot agree on something wrong.
        let lines: Vec<&str> = bare.stdout.lines().collect();
        let want: &[&str] = if what == "default" {
            &[
                "start blocked=0",
                "start 2: DFL flags=0 mask=0",
                "start 12: DFL flags=0 mask=0",
                "start 15: DFL flags=0 mask=0",
            ]
        } else {
            &[
                "start blocked=0x4800",
                "start 2: IGN flags=0 mask=0",
                "start 12: DFL flags=0 mask=0",
                "start 15: DFL flags=0 mask=0",
                "raised 2",
                "raised 1",
            ]
        };
        for w in want {
            assert!(
                lines.contains(w),
                "{what}: no {w:?} without pinguard:\n{}",
                bare.stdout
            );
        }
        assert_eq!(lines.last(), Some(&"survived"));
        let start: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("start "))
            .collect();
        let pinned: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("pinned "))
            .collect();
        assert_eq!(
            start, pinned,
            "{what}: pinning changed the dispositions without pinguard"
        );
        for env in envs {
            let r = go(true, env);
            if r.stdout != bare.stdout {
                failures.push(format!(
                    "{what} {env:?}: what the program found under pinguard differs:\n{}\n{}",
                    differing(&r.stdout, &bare.stdout),
                    r.stderr
                ));
            }
            let reps = reports_in(&dir);
            assert_eq!(reps.len(), 1, "{what} {env:?}: one exit report: {reps:?}");
            assert_eq!(read_report(&reps[0]).reason, Reason::Exit, "{what} {env:?}");
            std::fs::remove_file(&reps[0]).unwrap();
        }
    }
    all_passed("dispositions at start", failures);
}

#[test]
fn cpython_finds_sigint_and_sigterm_as_without_pinguard() {
    if !have("python3", "CPython's own signal set-up") || aarch64() {
        return;
    }
    let script = format!(
        "import ctypes, signal\n\
         def show():\n    \
             for s in sorted(signal.valid_signals()):\n        \
                 if s < 32 and s not in (signal.SIGKILL, signal.SIGSTOP):\n            \
                     print(int(s), repr(signal.getsignal(s)))\n    \
             print('int_default', signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n    \
             print('term_dfl', signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)\n\
         show()\n\
         rt = ctypes.CDLL({:?})\n\
         p = ctypes.c_void_p()\n\
         assert rt.cudaHostAlloc(ctypes.byref(p), 8192, 0) == 0\n\
         show()\n",
        libcudart()
    );
    let dir = fresh_dir("py-dispositions");
    let go = |preload: bool| {
        let mut cmd = python(&script, &dir, preload);
        signal_state(&mut cmd, &[], &[]);
        let end = Proc::spawn(&mut cmd).finish();
        assert_eq!(
            end.status.code(),
            Some(0),
            "preload={preload}: {}\n{}",
            end.stdout,
            end.stderr
        );
        end
    };
    let bare = go(false);
    let r = go(true);
    assert!(
        r.stdout == bare.stdout,
        "what CPython found under pinguard differs:\n{}\n{}",
        differing(&r.stdout, &bare.stdout),
        r.stderr
    );
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines.iter().filter(|l| **l == "int_default True").count(),
        2,
        "{}",
        r.stdout
    );
    assert_eq!(
        lines.iter().filter(|l| **l == "term_dfl True").count(),
        2,
        "{}",
        r.stdout
    );
}

// ---- Python's endings ----------------------------------------------------------------------

#[test]
fn python_keyboard_interrupt_abort_and_segfault_leave_the_figures() {
    if !have(
        "python3",
        "CPython's KeyboardInterrupt exit, os.abort and ctypes",
    ) || aarch64()
    {
        return;
    }
    let cases = [
        (
            "uncaught KeyboardInterrupt from SIGINT",
            "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(60)",
            libc::SIGINT,
        ),
        (
            "raise KeyboardInterrupt",
            "raise KeyboardInterrupt",
            libc::SIGINT,
        ),
        ("os.abort()", "os.abort()", libc::SIGABRT),
        (
            "a segfault through ctypes",
            "ctypes.string_at(0)",
            libc::SIGSEGV,
        ),
    ];
    let mut failures = Vec::new();
    for (what, ending, sig) in cases {
        let script = format!(
            "import ctypes, os, signal, time\n\
             rt = ctypes.CDLL({:?})\n\
             keep = []\n\
             for size in (8192, 4096):\n    \
                 p = ctypes.c_void_p()\n    \
                 assert rt.cudaHostAlloc(ctypes.byref(p), size, 0) == 0\n    \
                 keep.append(p)\n\
             {ending}\n",
            libcudart()
        );
        let go = |preload: bool| {
            let dir = fresh_dir("py-ending");
            let mut cmd = python(&script, &dir, preload);
            signal_state(&mut cmd, &[], &[]);
            (Proc::spawn(&mut cmd).finish(), dir)
        };
        let (bare, bare_dir) = go(false);
        remove_cores(&bare_dir);
        assert_eq!(
            bare.status.signal(),
            Some(sig),
            "{what}: CPython without pinguard ended {:?}\n{}",
            bare.status,
            bare.stderr
        );
        let (end, dir) = go(true);
        let r = (|| {
            if end.status.signal() != Some(sig)
                || end.status.core_dumped() != bare.status.core_dumped()
            {
                return Err(format!(
                    "ended {:?}, without pinguard {:?}",
                    end.status, bare.status
                ));
            }
            check_death(&dir, end.pid, sig, 12288, 2)
        })();
        if let Err(e) = r {
            failures.push(format!("{what}: {e}\nstderr:\n{}", end.stderr));
        }
        remove_cores(&dir);
    }
    all_passed("Python's endings", failures);
}

#[test]
fn multiprocessing_pool_terminate_leaves_each_workers_figures() {
    if !have("python3", "multiprocessing.Pool") || aarch64() {
        return;
    }
    // Each worker pins in its initializer and says so; then the pool is terminated (SIGTERM to
    // each worker). A script file: spawn's workers import the main module by path.
    let script = format!(
        "import ctypes, multiprocessing as mp, os, sys\n\
         LIB = {:?}\n\
         keep = []\n\
         def init(q):\n    \
             rt = ctypes.CDLL(LIB)\n    \
             for size in (8192, 4096):\n        \
                 p = ctypes.c_void_p()\n        \
                 assert rt.cudaHostAlloc(ctypes.byref(p), size, 0) == 0\n        \
                 keep.append(p)\n    \
             q.put(os.getpid())\n\
         def work(x):\n    \
             return x\n\
         if __name__ == '__main__':\n    \
             ctx = mp.get_context(sys.argv[1])\n    \
             q = ctx.Queue()\n    \
             pool = ctx.Pool(2, initializer=init, initargs=(q,))\n    \
             pids = [q.get(timeout=50) for _ in range(2)]\n    \
             print('WORKERS', *pids, flush=True)\n    \
             pool.terminate()\n    \
             pool.join()\n    \
             print('DONE', flush=True)\n",
        libcudart()
    );
    let mut failures = Vec::new();
    for method in ["fork", "spawn"] {
        let dir = fresh_dir(&format!("pool-{method}"));
        let file = dir.join("pool_script.py");
        std::fs::write(&file, &script).unwrap();
        let mut cmd = command(
            "/usr/bin/env",
            &["python3", file.to_str().unwrap(), method],
            &dir,
            true,
        );
        signal_state(&mut cmd, &[], &[]);
        let end = Proc::spawn(&mut cmd).finish();
        assert_eq!(
            end.status.code(),
            Some(0),
            "{method}: {}\n{}",
            end.stdout,
            end.stderr
        );
        let workers: Vec<u32> = end
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("WORKERS "))
            .unwrap_or_else(|| panic!("{method}: {}", end.stdout))
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(workers.len(), 2);
        for pid in workers {
            if let Err(e) = check_death(&dir, pid, libc::SIGTERM, 12288, 2) {
                failures.push(format!(
                    "{method}: worker {pid}: {e}\nstderr:\n{}",
                    end.stderr
                ));
            }
        }
    }
    all_passed("Pool.terminate()", failures);
}

// ---- The program's own handler wins ----------------------------------------------------------

/// The program (or script) prints "ready", is sent SIGTERM, and its own handler ends it
/// normally: its handler ran, one report with reason "exit", nothing left behind.
fn own_handler_ends_normally(
    what: &str,
    mut cmd: Command,
    dir: &Path,
    live_bytes: u64,
) -> Result<(), String> {
    signal_state(&mut cmd, &[], &[]);
    let mut p = Proc::spawn(&mut cmd);
    p.wait_line("ready");
    p.signal(libc::SIGTERM);
    let end = p.finish();
    let r = (|| {
        if end.status.code() != Some(0) {
            return Err(format!("ended {:?}, not exit 0", end.status));
        }
        if !end.stdout.lines().any(|l| l == "handler ran") {
            return Err(format!("its handler did not run: {}", end.stdout));
        }
        let files = reports_in(dir);
        if files.len() != 1 {
            return Err(format!(
                "{} reports, not one: {}",
                files.len(),
                listing(dir)
            ));
        }
        let rep = read_report(&files[0]);
        if rep.reason != Reason::Exit
            || rep.totals.live_bytes != live_bytes
            || rep.process.pid != end.pid
        {
            return Err(format!(
                "reason {:?} pid {} live_bytes {}, not exit/{}/{live_bytes}",
                rep.reason, rep.process.pid, rep.totals.live_bytes, end.pid
            ));
        }
        let states = state_files(dir);
        if !states.is_empty() {
            return Err(format!("left behind after a normal exit: {states:?}"));
        }
        let line = process_line(&report_json(dir)?, end.pid)?.clone();
        if line["reason"] != "exit" {
            return Err(format!("`pinguard report` reads it as {line}"));
        }
        Ok(())
    })();
    r.map_err(|e| {
        format!(
            "{what}: {e}\nstdout:\n{}\nstderr:\n{}",
            end.stdout, end.stderr
        )
    })
}

#[test]
fn a_programs_own_sigterm_handler_runs_and_the_exit_report_is_normal() {
    let mut failures = Vec::new();
    for mode in ["flag", "exit"] {
        let dir = fresh_dir("own-handler");
        let cmd = command("end_handler", &[mode], &dir, true);
        failures.extend(
            own_handler_ends_normally(&format!("end_handler {mode}"), cmd, &dir, 73728).err(),
        );
    }
    if have("python3", "a Python SIGTERM handler") && !aarch64() {
        let script = format!(
            "import ctypes, signal, sys, time\n\
             def on_term(sig, frame):\n    \
                 print('handler ran', flush=True)\n    \
                 sys.exit(0)\n\
             signal.signal(signal.SIGTERM, on_term)\n\
             rt = ctypes.CDLL({:?})\n\
             p = ctypes.c_void_p()\n\
             assert rt.cudaHostAlloc(ctypes.byref(p), 8192, 0) == 0\n\
             print('ready', flush=True)\n\
             time.sleep(120)\n",
            libcudart()
        );
        let dir = fresh_dir("own-handler-py");
        failures.extend(
            own_handler_ends_normally(
                "Python's handler calling sys.exit",
                python(&script, &dir, true),
                &dir,
                8192,
            )
            .err(),
        );
    }
    all_passed("own SIGTERM handlers", failures);
}

// ---- Dying while a report is being written ------------------------------------------------------

#[test]
fn a_process_killed_while_writing_a_report_is_read_whole() {
    // 30000 live allocations make each report a few megabytes, and the interval keeps the report
    // thread writing one after the other: a signal at a random moment lands mid-write. Even rounds
    // signal soon after the last pin (most likely inside the first report after it), odd rounds
    // once a report is on disk (inside a later one).
    const N: u64 = 30000;
    let mut rng = Rng::new("mid-write");
    let mut failures = Vec::new();
    for (round, sig) in [
        libc::SIGKILL,
        libc::SIGKILL,
        libc::SIGTERM,
        libc::SIGTERM,
        libc::SIGKILL,
        libc::SIGKILL,
    ]
    .into_iter()
    .enumerate()
    {
        let dir = fresh_dir("midwrite");
        let mut cmd = command("end_midwrite", &[&N.to_string()], &dir, true);
        cmd.env("EMU_NO_PIN", "1").env("PINGUARD_INTERVAL", "1ms");
        signal_state(&mut cmd, &[], &[]);
        let mut p = Proc::spawn(&mut cmd);
        p.wait_line("ready");
        let mut after = "the last pin";
        if round % 2 == 1 {
            let deadline = Instant::now() + LIMIT;
            while reports_in(&dir).is_empty() {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: no interval report in {LIMIT:?}"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            after = "the first report";
        }
        let delay = rng.below(300);
        std::thread::sleep(Duration::from_millis(delay));
        p.signal(sig);
        let end = p.finish();
        let what = format!(
            "round {round}: {} {delay} ms after {after}",
            if sig == libc::SIGKILL {
                "SIGKILL"
            } else {
                "SIGTERM"
            }
        );
        let r = (|| {
            if end.status.signal() != Some(sig) {
                return Err(format!("ended {:?}", end.status));
            }
            for name in listing(&dir)
                .split(' ')
                .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
            {
                let bytes = std::fs::read(dir.join(name)).unwrap();
                // Whole JSON is the point here, whatever the file (a report or the run's record).
                if let Err(e) = serde_json::from_slice::<Value>(&bytes) {
                    return Err(format!("{name} is not whole ({} bytes): {e}", bytes.len()));
                }
            }
            let text = pinguard_cli(&[OsStr::new("report"), dir.as_os_str()]);
            if !text.status.success() {
                return Err(format!(
                    "`pinguard report` exited {:?}: {}\nin the directory: {}",
                    text.status,
                    String::from_utf8_lossy(&text.stderr),
                    listing(&dir)
                ));
            }
            let rep = report_json(&dir)?;
            if rep["processes"] != 1 {
                return Err(format!(
                    "{} processes, not one: {}",
                    rep["processes"], rep["per_process"]
                ));
            }
            let line = process_line(&rep, end.pid)?;
            // Its state as it died, its report on the way out, or a snapshot written whole after
            // the last pin: any of them, as long as the figures are the ones at the death.
            if !matches!(
                line["reason"].as_str(),
                Some("killed" | "fatal_signal" | "interval")
            ) {
                return Err(format!("reason {}: {line}", line["reason"]));
            }
            if line["totals"]["live_bytes"] != N * 64 || line["totals"]["live_count"] != N {
                return Err(format!(
                    "live {} bytes in {} allocations, not {} in {N}: {line}",
                    line["totals"]["live_bytes"],
                    line["totals"]["live_count"],
                    N * 64
                ));
            }
            Ok(())
        })();
        if let Err(e) = r {
            failures.push(format!("{what}: {e}\npinguard said:\n{}", end.stderr));
        }
    }
    all_passed("killed mid-write", failures);
}
