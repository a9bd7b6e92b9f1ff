//! pinguard's own allocations failing: under a small `RLIMIT_AS` (`ulimit -v`), in a sandbox that
//! denies `mremap`, and when the program lowers its limit itself while pinning. Each program runs
//! with and without pinguard: its exit status and output must be the same, and the report must
//! say what pinguard left out.

use crate::common;
use common::*;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

fn progs() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| fixture_set("mem_limits").to_path_buf())
}

/// `path args` with and without pinguard (each in a fresh report folder), with `RLIMIT_AS` set to
/// `limit_kb` in the child before exec when given.
fn both(path: &std::path::Path, args: &[&str], limit_kb: Option<u64>) -> (Run, Run) {
    both_with(path, args, limit_kb, &[])
}

fn both_with(
    path: &std::path::Path,
    args: &[&str],
    limit_kb: Option<u64>,
    env: &[(&str, &str)],
) -> (Run, Run) {
    let run = |preload: bool| {
        let dir = fresh_dir("mem_limits");
        let mut cmd = command_in(path, &dir, preload);
        cmd.args(args).envs(env.iter().copied());
        if let Some(kb) = limit_kb {
            let bytes = kb * 1024;
            // SAFETY: only setrlimit, which is async-signal-safe, runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let r = libc::rlimit {
                        rlim_cur: bytes,
                        rlim_max: bytes,
                    };
                    if libc::setrlimit(libc::RLIMIT_AS, &r) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        Run::from_output(run_bounded(&mut cmd, Duration::from_secs(60)), dir)
    };
    (run(false), run(true))
}

fn same(without: &Run, with: &Run, what: &str) {
    assert_eq!(
        with.out.status, without.out.status,
        "{what}: exit status\nwith pinguard, stderr:\n{}",
        with.stderr
    );
    assert_eq!(
        with.stdout, without.stdout,
        "{what}: stdout\nwith pinguard, stderr:\n{}",
        with.stderr
    );
}

fn errors(report: &Report) -> String {
    report.config.errors.join("\n")
}

#[test]
fn a_program_under_a_small_ulimit_v_runs_as_without_pinguard_and_gets_a_report() {
    let prog = progs().join("mem_limits");
    // The program's size with pinguard loaded, before its exit report: the limits start there.
    let probe = both(&prog, &["plain"], None).1;
    let vm_kb: u64 = probe
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("VmSize "))
        .expect("VmSize line")
        .trim()
        .parse()
        .unwrap();
    // Up to 48 MiB of room: naming frames at exit once needed more (the library's own line
    // tables), and every allocation failing in it aborted the program.
    for extra_mib in [1, 4, 8, 16, 24, 32, 48] {
        let limit = vm_kb + extra_mib * 1024;
        let (without, with) = both(&prog, &["plain"], Some(limit));
        let what = format!("ulimit -v {limit} ({extra_mib} MiB over its size with pinguard)");
        assert!(
            without.out.status.success(),
            "{what}: fails even without pinguard: {}",
            without.stderr
        );
        same(&without, &with, &what);
        let r = with.typed_report();
        let t = &r.totals;
        let (tracked, untracked) = (t.alloc_count, t.untracked_count);
        assert!(
            tracked <= 1 && tracked + untracked >= 1,
            "{what}: the mlock was counted, tracked or passed through: {t:?}"
        );
        if t.out_of_memory_count > 0 {
            assert!(
                errors(&r).contains("refused memory"),
                "{what}: the report says what was left out:\n{}",
                errors(&r)
            );
        }
    }
}

#[test]
fn a_sandbox_that_denies_mremap_changes_nothing() {
    let dir = progs();
    let prog = dir.join("deny_syscall");
    let target = dir.join("mem_limits");
    let (without, with) = both(&prog, &["mremap", &target.to_string_lossy(), "plain"], None);
    assert!(
        without.out.status.success(),
        "fails even without pinguard: {}",
        without.stderr
    );
    same(&without, &with, "mremap denied");
    let r = with.typed_report();
    assert_eq!(r.totals.alloc_count, 1, "{:?}", r.totals);
    assert_eq!(
        r.totals.out_of_memory_count, 0,
        "a denied mremap is worked around, nothing is left out"
    );
}

#[test]
fn pinning_calls_made_while_pinguard_is_out_of_memory_pass_through_counted() {
    let prog = progs().join("mem_limits");
    let (without, with) = both(&prog, &["squeeze", "512"], None);
    assert!(
        without.stdout.contains("locked 4096 of 4096"),
        "{}{}",
        without.stdout,
        without.stderr
    );
    same(&without, &with, "RLIMIT_AS lowered by the program");
    let r = with.typed_report();
    let t = &r.totals;
    assert!(
        t.out_of_memory_count > 0,
        "pinguard ran short (4,096 new callsites in 512 KiB): {t:?}"
    );
    assert!(
        t.untracked_count > 0,
        "calls made while short passed through, counted: {t:?}"
    );
    // Every mlock and munlock is either tracked or counted as passed through.
    assert_eq!(
        t.alloc_count + t.release_count + t.untracked_count,
        2 * 4096,
        "{t:?}"
    );
    let e = errors(&r);
    assert!(
        e.contains("refused memory") && e.contains("untracked"),
        "the report says what was left out:\n{e}"
    );
    assert!(
        e.contains("short of memory at this report"),
        "and that it is itself cut short:\n{e}"
    );
}

#[test]
fn snapshots_written_while_pinguard_is_out_of_memory_change_nothing() {
    let prog = progs().join("mem_limits");
    // A report every 2 ms from the report thread while the program squeezes its own limit.
    let (without, with) = both_with(
        &prog,
        &["squeeze", "512"],
        None,
        &[("PINGUARD_INTERVAL", "2ms")],
    );
    same(
        &without,
        &with,
        "RLIMIT_AS lowered by the program, with interval reports",
    );
    let r = with.typed_report();
    assert_eq!(r.reason, pinguard_common::Reason::Exit);
    assert!(r.totals.out_of_memory_count > 0, "{:?}", r.totals);
    assert!(
        errors(&r).contains("short of memory at this report"),
        "{}",
        errors(&r)
    );
}

#[test]
fn tracking_resumes_once_memory_is_back() {
    let prog = progs().join("mem_limits");
    let (without, with) = both(&prog, &["squeeze", "512", "relax"], None);
    assert!(
        without.stdout.contains("locked 4160 of 4160"),
        "{}{}",
        without.stdout,
        without.stderr
    );
    same(&without, &with, "RLIMIT_AS lowered, then put back");
    let r = with.typed_report();
    let t = &r.totals;
    assert!(t.out_of_memory_count > 0 && t.untracked_count > 0, "{t:?}");
    assert_eq!(
        t.alloc_count + t.release_count + t.untracked_count,
        2 * 4160,
        "{t:?}"
    );
    // The 64 calls made after the limit was put back are all tracked, from their one callsite,
    // and the exit report, with room again, is whole.
    let sites = &r.callsites;
    assert!(
        sites.iter().any(|c| c.alloc_count == 64),
        "a callsite with the 64 calls: {sites:?}"
    );
    let e = errors(&r);
    assert!(
        e.contains("refused memory") && !e.contains("at this report"),
        "{e}"
    );
}

/// The report thread is set up before the program runs: the C library registers a new thread's
/// destructors with `calloc` and ends the whole process when that fails, so a thread that first
/// ran once the program had lowered its address-space limit and used its memory up took the
/// program down ("Fatal glibc error: failed to register TLS destructor", 6 of 6 on one CPU).
#[test]
fn a_program_that_starves_itself_first_thing_runs_as_without_the_report_thread() {
    let prog = progs().join("mem_limits");
    let run = |preload: bool| {
        let dir = fresh_dir("mem_limits-starved");
        let mut cmd = command_in(&prog, &dir, preload);
        cmd.arg("starved").env("PINGUARD_INTERVAL", "1s");
        // SAFETY: only sched_getaffinity and sched_setaffinity, system calls, run between fork and
        // exec. One CPU: the thread created before `main` runs only when `main` gives way.
        unsafe {
            cmd.pre_exec(|| {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                let size = std::mem::size_of::<libc::cpu_set_t>();
                if libc::sched_getaffinity(0, size, &mut set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let first = (0..libc::CPU_SETSIZE as usize)
                    .find(|&c| libc::CPU_ISSET(c, &set))
                    .unwrap_or(0);
                let mut one: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(first, &mut one);
                if libc::sched_setaffinity(0, size, &one) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Run::from_output(run_bounded(&mut cmd, Duration::from_secs(60)), dir)
    };
    let (without, with) = (run(false), run(true));
    assert!(without.success(), "{}", without.stderr);
    same(
        &without,
        &with,
        "RLIMIT_AS lowered and memory used up first thing",
    );
}
