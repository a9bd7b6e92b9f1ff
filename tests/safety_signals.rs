//! The host process's descriptors, signal dispositions and children are its own: pinguard's
//! report signal holds no descriptor, the application's latest signal disposition is followed,
//! its handlers run straight from the kernel on the stack they asked for (alternate stacks
//! included), `_exit` tells a real signal handler from a blocked signal, and a `vfork` child
//! (which shares its parent's memory) runs nothing of pinguard's exit path.

use crate::common;
use common::*;
use pinguard_common::Reason;
use serde_json::Value;
use std::path::Path;

/// This file's C programs (`tests/fixtures.txt`, set `safety_signals`).
fn progs() -> &'static Path {
    fixture_set("safety_signals")
}

/// Runs one of this file's programs in `dir`, with pinguard preloaded or not, reports going to
/// `dir` (`report.%p.json`), `env` on top of a clean `PINGUARD_*` environment.
fn launch(prog: &str, args: &[&str], env: &[(&str, &str)], dir: &Path, preload: bool) -> Run {
    let mut cmd = command_in(&progs().join(prog), dir, preload);
    cmd.args(args);
    cmd.env("REPORT_DIR", dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Run::from_output(cmd.output().unwrap(), dir.to_path_buf())
}

fn lines_of(r: &Run) -> Vec<&str> {
    r.stdout.lines().collect()
}

// ---- Item 1: no long-lived descriptor --------------------------------------------------------

#[test]
fn descriptors_the_application_reopens_after_closing_everything_stay_its_own() {
    let plain_dir = fresh_dir("fds-plain");
    let plain = launch(
        "sig_descriptors",
        &[
            plain_dir.to_str().unwrap(),
            plain_dir.to_str().unwrap(),
            "nowait",
        ],
        &[],
        &plain_dir,
        false,
    );
    assert!(plain.success(), "{}\n{}", plain.stdout, plain.stderr);

    let files = fresh_dir("fds-files");
    let reports = fresh_dir("fds-reports");
    let env = [("PINGUARD_SIGNAL", "USR2"), ("PINGUARD_INTERVAL", "30s")];
    let r = launch(
        "sig_descriptors",
        &[files.to_str().unwrap(), reports.to_str().unwrap(), "wait"],
        &env,
        &reports,
        true,
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let s = r.stats();
    let p = plain.stats();
    assert_eq!(
        (p["a_fd"].as_i64(), p["b_fd"].as_i64()),
        (Some(3), Some(4)),
        "{p}"
    );
    assert_eq!(
        (s["a_fd"].as_i64(), s["b_fd"].as_i64()),
        (Some(3), Some(4)),
        "the application got the lowest descriptors: {s}"
    );
    assert_eq!(s["a_offset"], 0, "nothing read the application's file: {s}");
    assert_eq!(s["a_same"], 1, "{s}");
    assert_eq!(
        s["child_ok"], 1,
        "the fork child's descriptors 3 and 4 are still its files: {s}"
    );
    assert_eq!(
        s["usr2"], 3,
        "the application's handler saw every signal: {s}"
    );
    assert_eq!(s["overflow"], 0, "a flood of reports: {s}");
    assert_eq!(s["waited_all"], 1, "every signal gave a report: {s}");
    // Three signal reports, and an interval report only if the run took longer than 30 s.
    let bound = 3 + s["elapsed_ms"].as_i64().unwrap() / 30_000 + 1;
    let n = s["reports"].as_i64().unwrap();
    assert!(
        (3..=bound).contains(&n),
        "{n} reports for 3 signals (a busy loop?): {s}"
    );
    for name in ["a.dat", "b.dat"] {
        let with = std::fs::read(files.join(name)).unwrap();
        let without = std::fs::read(plain_dir.join(name)).unwrap();
        assert_eq!(
            with, without,
            "{name} differs from the run without pinguard"
        );
    }
    let b = std::fs::read_to_string(files.join("b.dat")).unwrap();
    assert_eq!(
        b,
        "after signal 1\nafter signal 2\nafter signal 3\nchild\nparent after the child\n"
    );
}

// ---- Item 9: the application's latest disposition --------------------------------------------

#[test]
fn a_restored_disposition_is_followed_and_the_removed_handler_never_runs() {
    let dir = fresh_dir("restore");
    let r = launch(
        "sig_handlers",
        &["restore"],
        &[("PINGUARD_SIGNAL", "USR2")],
        &dir,
        true,
    );
    assert!(
        r.success(),
        "the report signal under the default disposition is pinguard's: {}\n{}",
        r.stdout,
        r.stderr
    );
    let l = lines_of(&r);
    assert_eq!(
        l,
        [
            "old handler=DFL", // as without pinguard: never pinguard's own handler
            "replaced handler=a",
            "now handler=DFL flags=0 mask=0",
            "a=1", // the handler the application removed did not run again
            "signal_report=1",
        ],
        "{}",
        r.stderr
    );
}

#[test]
fn every_answer_about_dispositions_is_the_one_given_without_pinguard() {
    for mode in ["chain", "flags"] {
        let plain_dir = fresh_dir("disp-plain");
        let plain = launch("sig_handlers", &[mode], &[], &plain_dir, false);
        assert!(
            plain.success(),
            "{mode}: {}\n{}",
            plain.stdout,
            plain.stderr
        );
        let dir = fresh_dir("disp");
        let r = launch(
            "sig_handlers",
            &[mode],
            &[("PINGUARD_SIGNAL", "USR2")],
            &dir,
            true,
        );
        assert!(r.success(), "{mode}: {}\n{}", r.stdout, r.stderr);
        assert_eq!(
            r.stdout, plain.stdout,
            "{mode}: what the application saw with pinguard (left) and without\n{}",
            r.stderr
        );
    }
    // And what they are, so that both runs cannot agree on something wrong.
    let dir = fresh_dir("disp");
    let r = launch(
        "sig_handlers",
        &["chain"],
        &[("PINGUARD_SIGNAL", "USR2")],
        &dir,
        true,
    );
    let l = lines_of(&r);
    for want in [
        "old handler=a flags=0x10000000 mask=0x800",
        "a=0 b=1",
        "replaced handler=b",
        "a=1 b=1",
        "usr1 old handler=DFL",
        "c=1",
        "usr1 signal returned c",
    ] {
        assert!(l.contains(&want), "no {want:?} in\n{}", r.stdout);
    }
    let r = launch(
        "sig_handlers",
        &["flags"],
        &[("PINGUARD_SIGNAL", "USR2")],
        &dir,
        true,
    );
    let l = lines_of(&r);
    for want in [
        "plain: self_blocked=1 hup_blocked=1 on_alt=0 signo=10 code=-6 ctx=1",
        "nodefer: self_blocked=0 hup_blocked=0 on_alt=0",
        "onstack: self_blocked=1 on_alt=1 sp_in_alt=1",
        "resethand after one handler=DFL flags=0x80000004 mask=0",
        "probes=4",
    ] {
        assert!(l.contains(&want), "no {want:?} in\n{}", r.stdout);
    }
}

#[test]
fn a_one_shot_handler_of_the_report_signal_runs_once() {
    let dir = fresh_dir("oneshot");
    let r = launch(
        "sig_handlers",
        &["oneshot"],
        &[("PINGUARD_SIGNAL", "USR2")],
        &dir,
        true,
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert_eq!(
        lines_of(&r),
        [
            "sysv_signal returned DFL",
            "after one handler=DFL flags=0xc0000000 mask=0",
            "a=1",
            "signal_report=1"
        ],
        "{}",
        r.stderr
    );
}

#[test]
fn a_handler_installed_by_the_raw_system_call_is_found_and_chained_to() {
    let dir = fresh_dir("raw");
    let r = launch(
        "sig_handlers",
        &["raw"],
        &[("PINGUARD_SIGNAL", "USR2")],
        &dir,
        true,
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let l = lines_of(&r);
    assert_eq!(
        l[0], "retaken=1",
        "pinguard's periodic check puts its handler back: {}",
        r.stdout
    );
    assert!(l[1].starts_with("seen handler=a "), "{}", r.stdout);
    assert_eq!(&l[2..], ["a=1", "signal_report=1"]);
}

#[test]
fn dispositions_changed_by_threads_and_fork_children_at_once_never_hang_or_lose_a_signal() {
    let f = fixtures();
    let dir = fresh_dir("sig-storm");
    let mut cmd = program(&progs().join("sig_fork_storm"), Some(f.lib.as_os_str()));
    cmd.arg("200")
        .current_dir(&dir)
        .env("PINGUARD_SIGNAL", "USR2")
        .env("PINGUARD_REPORT", dir.join("r.%p.json"));
    cmd.env_remove("PINGUARD_INTERVAL");
    let out = run_bounded(&mut cmd, std::time::Duration::from_secs(240));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Value = serde_json::from_str(
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("STATS "))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        s["bad"], 0,
        "a fork child hung, failed or missed its handler: {s}"
    );
    assert_eq!(
        s["handled"], s["raised"],
        "every raise ran exactly one of the application's handlers: {s}"
    );
}

// ---- Item 8: _exit inside a handler, exactly --------------------------------------------------

const FALSE_LINE: &str = "_exit called from a signal handler";

#[test]
fn exit_with_a_blocked_signal_that_has_a_handler_writes_one_complete_report() {
    for mode in [
        "blocked",
        "blocked-signal",
        "longjmp",
        "alt-longjmp",
        "deep-after-jump",
    ] {
        let dir = fresh_dir("sigexit");
        let r = launch("sig_exit", &[mode], &[], &dir, true);
        assert_eq!(r.out.status.code(), Some(0), "{mode}: {}", r.stderr);
        assert!(!r.stderr.contains(FALSE_LINE), "{mode}: {}", r.stderr);
        let files = reports_in(&dir);
        assert_eq!(files.len(), 1, "{mode}: {files:?}\n{}", r.stderr);
        let rep = read_report(&files[0]);
        assert_eq!(rep.reason, Reason::Exit, "{mode}");
        assert_eq!(rep.totals.live_bytes, 8192, "{mode}");
        let summaries = pinguard_lines(&r.stderr)
            .into_iter()
            .filter(|l| l.contains("at exit"))
            .count();
        assert_eq!(summaries, 1, "{mode}: {}", r.stderr);
    }
}

#[test]
fn exit_from_inside_a_handler_still_writes_nothing() {
    for mode in ["in-handler", "alt-in-handler", "nested", "raw-in-handler"] {
        let dir = fresh_dir("sigexit-in");
        let r = launch("sig_exit", &[mode], &[], &dir, true);
        assert_eq!(r.out.status.code(), Some(0), "{mode}: {}", r.stderr);
        assert!(reports_in(&dir).is_empty(), "{mode}: {}", r.stderr);
        assert!(r.stderr.contains(FALSE_LINE), "{mode}: {}", r.stderr);
    }
}

/// The glibc functions `prog` calls by name (its undefined dynamic symbols, versions dropped).
fn imports(prog: &str) -> Vec<String> {
    let nm = if aarch64() {
        "aarch64-linux-gnu-nm"
    } else {
        "nm"
    };
    let out = std::process::Command::new(nm)
        .args(["-D", "--undefined-only"])
        .arg(progs().join(prog))
        .output()
        .expect("nm (binutils)");
    assert!(
        out.status.success(),
        "{nm} {prog}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|n| n.split('@').next().unwrap().to_string())
        .collect()
}

/// Programs reach glibc's signal setters and jumps under whichever name their headers picked:
/// `__sysv_signal` is `signal` in strict ISO C, `__longjmp_chk` every jump when fortified,
/// `_longjmp` the BSD jump, `__sigaction` an exported alias some libraries call. `_exit` must tell
/// a handler set under each name from a jump out of one under each name: pinguard wraps no
/// handler and hooks no jump, it reads the thread when `_exit` is called (a report from inside
/// a handler would not be safe; none after a jump out would lose it).
#[test]
fn handlers_and_jumps_under_every_glibc_name_are_followed() {
    for (prog, names) in [
        (
            "sig_exit",
            &["signal", "__sigaction", "_longjmp", "siglongjmp"][..],
        ),
        (
            "sig_exit_strict",
            &["__sysv_signal", "__sigaction", "__longjmp_chk"][..],
        ),
    ] {
        let got = imports(prog);
        for n in names {
            assert!(
                got.iter().any(|g| g == n),
                "{prog} does not call {n}, so this test would not test it: {got:?}"
            );
        }
        for mode in [
            "deep-after-jump",
            "bsd-deep-after-jump",
            "longjmp",
            "blocked-signal",
        ] {
            let dir = fresh_dir("signames");
            let r = launch(prog, &[mode], &[], &dir, true);
            assert_eq!(r.out.status.code(), Some(0), "{prog} {mode}: {}", r.stderr);
            assert!(
                !r.stderr.contains(FALSE_LINE),
                "{prog} {mode}: {}",
                r.stderr
            );
            let files = reports_in(&dir);
            assert_eq!(
                files.len(),
                1,
                "{prog} {mode}: a jump out of the handler was missed: {files:?}\n{}",
                r.stderr
            );
            assert_eq!(
                read_report(&files[0]).totals.live_bytes,
                8192,
                "{prog} {mode}"
            );
        }
        for mode in [
            "signal-in-handler",
            "sigaction-alias-in-handler",
            "in-handler",
        ] {
            let dir = fresh_dir("signames-in");
            let r = launch(prog, &[mode], &[], &dir, true);
            assert_eq!(r.out.status.code(), Some(0), "{prog} {mode}: {}", r.stderr);
            assert!(
                reports_in(&dir).is_empty(),
                "{prog} {mode}: a report written from inside a handler pinguard did not see\n{}",
                r.stderr
            );
            assert!(r.stderr.contains(FALSE_LINE), "{prog} {mode}: {}", r.stderr);
        }
    }
}

// ---- Item 2: vfork ---------------------------------------------------------------------------

/// A group name no other test run uses, its ledger removed before and after.
struct Group(String);
impl Group {
    fn new(tag: &str) -> Group {
        let g = Group(format!("test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(pinguard_common::group::path(&g.0));
        g
    }
}
impl Drop for Group {
    fn drop(&mut self) {
        remove_semaphores(&pinguard_common::group::path(&self.0));
        let _ = std::fs::remove_file(pinguard_common::group::path(&self.0));
    }
}

fn only_report_is_the_parents(r: &Run, what: &str) -> Report {
    let s = r.stats();
    let files = reports_in(&r.report_dir);
    assert_eq!(
        files,
        [r.report_dir.join(format!("report.{}.json", s["pid"]))],
        "{what}: only the parent's report\n{}",
        r.stderr
    );
    let rep = read_report(&files[0]);
    assert_eq!(
        Some(u64::from(rep.process.pid)),
        s["pid"].as_u64(),
        "{what}"
    );
    assert_eq!(rep.reason, Reason::Exit, "{what}");
    rep
}

const MODES: [(&str, i64); 4] = [
    ("vfork-exit", 7),
    ("vfork-exec-missing", 7),
    ("vfork-exec", 0),
    ("posix-spawn", 0),
];

#[test]
fn a_vfork_child_leaves_the_parents_report_alone() {
    for (mode, status) in MODES {
        let dir = fresh_dir("vfork");
        let r = launch("vfork_exit", &[mode], &[], &dir, true);
        assert!(r.success(), "{mode}: {}\n{}", r.stdout, r.stderr);
        let s = r.stats();
        assert_eq!(s["child_status"], status, "{mode}: {s}");
        assert_eq!(
            (
                s["alloc1"].as_i64(),
                s["alloc2"].as_i64(),
                s["alloc3"].as_i64()
            ),
            (Some(0), Some(0), Some(0)),
            "{mode}: {s}"
        );
        let rep = only_report_is_the_parents(&r, mode);
        assert_eq!(rep.totals.live_bytes, 3 << 20, "{mode}");
        let summaries = pinguard_lines(&r.stderr)
            .into_iter()
            .filter(|l| l.contains("at exit"))
            .count();
        assert_eq!(summaries, 1, "{mode}: {}", r.stderr);
    }
}

#[test]
fn a_vfork_child_leaves_the_parents_group_share_alone() {
    for (mode, _) in MODES {
        let g = Group::new(&format!("vfork-{mode}"));
        let dir = fresh_dir("vfork-group");
        let r = launch(
            "vfork_exit",
            &[mode],
            &[("PINGUARD_GROUP", &g.0), ("PINGUARD_GROUP_BUDGET", "2M")],
            &dir,
            true,
        );
        assert!(r.success(), "{mode}: {}\n{}", r.stdout, r.stderr);
        let s = r.stats();
        // 1 MiB before the child, 1 MiB after it fits the 2 MiB group budget, the third does not.
        assert_eq!(
            (
                s["alloc1"].as_i64(),
                s["alloc2"].as_i64(),
                s["alloc3"].as_i64()
            ),
            (Some(0), Some(0), Some(2)),
            "{mode}: {s}\n{}",
            r.stderr
        );
        let rep = only_report_is_the_parents(&r, mode);
        assert_eq!(rep.totals.live_bytes, 2 << 20, "{mode}");
    }
}

#[test]
fn python_subprocess_of_a_missing_command_leaves_the_report_to_python() {
    if !have("python3", "CPython's subprocess starts children with vfork") {
        return;
    }
    let f = fixtures();
    let script = format!(
        "import ctypes, os, subprocess\n\
         rt = ctypes.CDLL({:?})\n\
         p = ctypes.c_void_p()\n\
         assert rt.cudaHostAlloc(ctypes.byref(p), 8192, 0) == 0\n\
         for _ in range(3):\n    \
             try:\n        subprocess.run(['no-such-command'])\n    except FileNotFoundError:\n        pass\n\
         print('PID', os.getpid())\n",
        f.dir.join("libcudart.so").to_str().unwrap()
    );
    let r = run("/usr/bin/env", &["python3", "-c", &script], &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let pid: u32 = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("PID "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let files = reports_in(&r.report_dir);
    assert_eq!(
        files,
        [r.report_dir.join(format!("report.{pid}.json"))],
        "only Python's own report\n{}",
        r.stderr
    );
    let rep = read_report(&files[0]);
    assert_eq!(rep.process.pid, pid);
    assert_eq!(rep.totals.live_bytes, 8192);
    let summary = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("at exit"))
        .collect::<Vec<_>>();
    assert_eq!(summary.len(), 1, "{}", r.stderr);
    assert!(
        summary[0].contains(&format!("pinguard[{pid}]")),
        "{}",
        r.stderr
    );
}

/// pinguard's report thread never takes a signal meant for the application: a program that blocks
/// SIGTERM and waits for it with `sigwait` gets it, with an interval and a report signal set.
#[test]
fn a_signal_the_application_waits_for_never_reaches_pinguards_thread() {
    let env = [("PINGUARD_INTERVAL", "20ms"), ("PINGUARD_SIGNAL", "USR2")];
    for round in 0..5 {
        let dir = fresh_dir("sigwait");
        let bare = launch("sig_wait", &["sigwait"], &env, &dir, false);
        assert_eq!(
            (bare.out.status.code(), bare.stdout.trim()),
            (Some(0), "got 15"),
            "without pinguard"
        );
        let r = launch("sig_wait", &["sigwait"], &env, &dir, true);
        assert_eq!(
            (r.out.status.code(), r.stdout.trim()),
            (Some(0), "got 15"),
            "round {round}: {:?} {}",
            r.out.status,
            r.stderr
        );
    }
}

/// After a one-shot handler ran, the application reads back its own flags, not the ones pinguard
/// installed its trampoline with.
#[test]
fn after_a_one_shot_handler_the_application_reads_back_its_own_flags() {
    let dir = fresh_dir("oneshot");
    let bare = launch("sig_wait", &["oneshot"], &[], &dir, false);
    assert_eq!(
        bare.stdout.trim(),
        "hits=1 dfl=1 siginfo=0 resethand=1",
        "without pinguard"
    );
    for env in [
        &[][..],
        &[("PINGUARD_SIGNAL", "USR2")][..],
        &[("PINGUARD_SIGNAL", "USR1")][..],
    ] {
        let r = launch("sig_wait", &["oneshot"], env, &dir, true);
        assert_eq!(r.stdout, bare.stdout, "{env:?}: {}", r.stderr);
    }
}

// ---- Alternate signal stacks: the application's handler alone on them ---------------------------

/// The signals the alternate-stack tests use: an ordinary one, and pinguard's report signal
/// (where pinguard has a handler of its own in front of the application's).
const ALT_CASES: [(&str, &[(&str, &str)]); 2] =
    [("1", &[]), ("12", &[("PINGUARD_SIGNAL", "USR2")])];

/// LTP's `signal06`, written anew: an empty `SA_ONSTACK` handler on an alternate stack that
/// another thread keeps write-protecting. The empty handler never writes to the stack, and the
/// kernel writes its frame only while it is writable; anything else that writes there while the
/// handler runs (a trampoline's frame) faults on the read-only stack.
#[test]
fn an_empty_handler_on_an_alternate_stack_another_thread_write_protects_runs_as_without_pinguard() {
    if aarch64() {
        return; // qemu-user writes the signal frame itself and faults on the read-only stack, pinguard or not
    }
    for (sig, env) in ALT_CASES {
        let dir = fresh_dir("altflip");
        let bare = launch("sig_altstack", &["flip", sig, "10000"], env, &dir, false);
        assert!(
            bare.success(),
            "SIG {sig} without pinguard: {:?}\n{}",
            bare.out.status,
            bare.stdout
        );
        assert_eq!(
            bare.stdout
                .lines()
                .filter(|l| l.ends_with(": all sent, value kept"))
                .count(),
            5,
            "{}",
            bare.stdout
        );
        let r = launch("sig_altstack", &["flip", sig, "10000"], env, &dir, true);
        assert_eq!(
            (r.out.status.code(), r.out.status.to_string(), &r.stdout),
            (
                bare.out.status.code(),
                bare.out.status.to_string(),
                &bare.stdout
            ),
            "SIG {sig} with pinguard (left) and without\n{}",
            r.stderr
        );
    }
}

/// An alternate stack just big enough for the kernel's frame and the application's handler
/// without pinguard (the smallest that works, found by trying) is big enough with it.
#[test]
fn an_alternate_stack_just_big_enough_without_pinguard_is_big_enough_with_it() {
    for (sig, env) in ALT_CASES {
        let dir = fresh_dir("alttight");
        let probe = launch("sig_altstack", &["probe", sig], &[], &dir, false);
        assert!(probe.success(), "{}\n{}", probe.stdout, probe.stderr);
        let size: usize = probe.stdout.trim().parse().unwrap();
        let size = size.to_string();
        let bare = launch("sig_altstack", &["tight", sig, &size], env, &dir, false);
        assert_eq!(
            (bare.out.status.code(), bare.stdout.as_str()),
            (Some(0), "handled=100\n"),
            "SIG {sig}, {size} bytes, without pinguard"
        );
        let r = launch("sig_altstack", &["tight", sig, &size], env, &dir, true);
        assert_eq!(
            (r.out.status.code(), r.out.status.to_string(), &r.stdout),
            (
                bare.out.status.code(),
                bare.out.status.to_string(),
                &bare.stdout
            ),
            "SIG {sig}, {size} bytes, with pinguard (left) and without\n{}",
            r.stderr
        );
    }
}

/// The kernel runs the application's handlers itself: for every signal but the report signal,
/// the disposition in the kernel is the application's own function, whichever setter put it
/// there (the report signal is checked apart, by the tests above and `sig_handlers.c`).
#[test]
fn the_kernel_holds_the_applications_own_handler_for_every_signal_but_the_report_signal() {
    let dir = fresh_dir("altdirect");
    let bare = launch("sig_altstack", &["direct"], &[], &dir, false);
    assert_eq!(
        bare.stdout, "handlers not the application's: 0\n",
        "without pinguard: {}",
        bare.stderr
    );
    let r = launch("sig_altstack", &["direct"], &[], &dir, true);
    assert_eq!(
        (r.out.status.code(), &r.stdout),
        (Some(0), &bare.stdout),
        "{}",
        r.stderr
    );
}
