//! Forks while other threads are inside hooks and writing reports, and every way a process ends:
//! no child hangs, a child's ledger starts empty, and each exit writes exactly one complete report.

use crate::common;
use common::*;
use pinguard_common::Reason;
use std::time::Duration;

#[test]
fn two_hundred_forks_while_threads_pin_and_write_reports() {
    let f = fixtures();
    let dir = fresh_dir("forks");
    let explicit = dir.join("asked.json");
    let out = run_bounded(
        program(&f.dir.join("fork_storm"), Some(f.lib.as_os_str()))
            .args(["200", explicit.to_str().unwrap()])
            .env("PINGUARD_REPORT", dir.join("r.%p.json"))
            .env("PINGUARD_DEPTH", "8"),
        Duration::from_secs(240),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("STATS "))
        .unwrap();
    // The program's own STATS line, not a report.
    let s: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(s["hung"], 0, "{s}");
    assert_eq!(
        s["bad"], 0,
        "a child saw a non-empty ledger or broken hooks: {s}"
    );
    // The parent's counters hold its own work only: its allocations, none of its children's.
    let files = reports_in(&dir);
    let parent_pid = out.status.code().map(|_| ());
    assert!(parent_pid.is_some());
    let mut parent = None;
    let (mut by_exit, mut by_underscore_exit) = (0, 0);
    for p in &files {
        if p.ends_with("asked.json") {
            continue;
        }
        let r = read_report(p);
        let t = &r.totals;
        if t.alloc_count == s["parent_allocs"] {
            parent = Some(r);
        } else if t.alloc_count == 2 && t.live_bytes == 8192 {
            by_exit += 1; // allocated, released, allocated again, exit()
        } else {
            // allocated and released, _exit(): only what the child itself did
            assert_eq!(
                (t.alloc_count, t.release_count, t.live_bytes),
                (1, 1, 0),
                "{}",
                p.display()
            );
            by_underscore_exit += 1;
        }
    }
    let parent = parent.expect("the parent's exit report");
    assert_eq!(parent.totals.live_bytes, 65536);
    assert_eq!(s["parent_live"], 65536);
    assert_eq!(
        (by_exit, by_underscore_exit),
        (20, 180),
        "every child writes its own report"
    );
    assert_eq!(
        read_report(&explicit).reason,
        Reason::Request,
        "the report thread's last file is complete"
    );
}

fn exits(mode: &str) -> Run {
    let r = run("exit_paths", &[mode], &[]);
    assert_eq!(r.out.status.code(), Some(0), "{mode}: {}", r.stderr);
    r
}

#[test]
fn every_way_out_writes_exactly_one_complete_report() {
    for mode in ["return", "exit-thread", "_exit", "_Exit"] {
        let r = exits(mode);
        let files = reports_in(&r.report_dir);
        assert_eq!(files.len(), 1, "{mode}: {files:?}");
        let rep = r.typed_report();
        assert_eq!(rep.reason, Reason::Exit, "{mode}");
        assert!(rep.totals.live_bytes >= 8192, "{mode}");
        let summaries = pinguard_lines(&r.stderr)
            .into_iter()
            .filter(|l| l.contains("at exit"))
            .count();
        assert_eq!(summaries, 1, "{mode}: {}", r.stderr);
    }
}

#[test]
fn exit_from_a_signal_handler_skips_the_report_instead_of_risking_a_hang() {
    let r = exits("signal-exit");
    assert!(reports_in(&r.report_dir).is_empty());
    assert!(
        r.stderr.contains("_exit called from a signal handler"),
        "{}",
        r.stderr
    );
}

#[test]
fn python_normal_exit_and_os_exit_each_write_one_report() {
    let f = fixtures();
    for ending in ["pass", "os._exit(0)", "sys.exit(0)"] {
        let script = format!(
            "import ctypes, os, sys\nrt = ctypes.CDLL({:?})\np = ctypes.c_void_p()\nassert rt.cudaHostAlloc(ctypes.byref(p), 8192, 0) == 0\n{ending}\n",
            f.dir.join("libcudart.so").to_str().unwrap()
        );
        let r = run("/usr/bin/env", &["python3", "-c", &script], &[]);
        assert!(r.success(), "{ending}: {}", r.stderr);
        let files = reports_in(&r.report_dir);
        assert_eq!(files.len(), 1, "{ending}: {files:?}\n{}", r.stderr);
        assert_eq!(r.typed_report().totals.live_bytes, 8192, "{ending}");
    }
}
