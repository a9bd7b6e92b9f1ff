//! Threads that come and go, hold memory at the same time and take turns. pinguard counts each
//! thread on its own (no cache line shared between threads on the hot path) and adds up when it
//! reports: the sums must be exact, blocks of ended threads reused, and the peaks exact whenever
//! the threads' calls do not overlap.

use crate::common;
use common::*;

#[test]
fn threads_that_come_and_go_leave_every_counter_exact() {
    // 400 threads, 8 at a time; each also pins from a thread-exit destructor, which may run
    // after pinguard's own has handed the thread's counters back.
    let r = run("threads", &["churn", "50", "8"], &[("PINGUARD_DEPTH", "1")]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let s = r.stats();
    let allocs = s["allocs"].as_i64().unwrap();
    assert_eq!(allocs, 1600);
    let rep = r.typed_report();
    let t = &rep.totals;
    assert_eq!(t.alloc_count as i64, allocs);
    assert_eq!(t.release_count as i64, allocs);
    assert_eq!(t.alloc_bytes, 400 * (4096 + 8192 + 1024 + 512));
    assert_eq!(t.live_bytes, 0);
    assert_eq!(t.live_count, 0);
    let api = api_stats(&rep, "cudaHostAlloc");
    assert_eq!(api.alloc_count as i64, allocs);
    assert_eq!(api.live_count, 0);
    assert_eq!(api.live_bytes, 0);
    let sites = &rep.callsites;
    let site_allocs: i64 = sites.iter().map(|c| c.alloc_count as i64).sum();
    assert_eq!(site_allocs, allocs);
    assert!(sites.iter().all(|c| c.live_bytes == 0 && c.live_count == 0));
    // 8 threads at a time hold at most 8 * (4096 + 8192 + 1024) (+ 512 each in the destructor),
    // and main holds up to 400 KiB handed over at the end: the peak lies between what main held
    // alone and everything at once.
    let peak = t.peak_live_bytes as i64;
    assert!(
        peak >= 400 * 1024,
        "peak {peak} below what main held at once"
    );
    assert!(
        peak <= 400 * 1024 + 8 * (4096 + 8192 + 1024 + 512),
        "peak {peak} above everything ever held at once"
    );
}

fn peaks(phases: &str, expected: i64, allocs: i64) {
    let r = run("threads", &["turns", phases], &[("PINGUARD_DEPTH", "1")]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let s = r.stats();
    let most = ["turns", "pair", "crowd"]
        .iter()
        .map(|k| s[k].as_i64().unwrap())
        .max()
        .unwrap();
    assert_eq!(most, expected);
    let rep = r.typed_report();
    assert_eq!(
        rep.totals.peak_live_bytes as i64, expected,
        "process peak ({phases})"
    );
    assert_eq!(
        api_stats(&rep, "cudaHostAlloc").peak_live_bytes as i64,
        expected,
        "entry point peak ({phases})"
    );
    let sites = &rep.callsites;
    assert_eq!(sites.len(), 1, "one callsite at depth 1: {sites:?}");
    assert_eq!(
        sites[0].peak_live_bytes as i64, expected,
        "callsite peak ({phases})"
    );
    assert_eq!(sites[0].alloc_count as i64, allocs);
    assert_eq!(rep.totals.live_bytes, 0);
}

#[test]
fn threads_taking_turns_peak_at_the_largest_turn() {
    peaks("t", 4 * 16384, 4);
}

#[test]
fn two_threads_holding_at_once_peak_at_their_sum() {
    peaks("tp", 40960 + 49152, 6);
}

#[test]
fn more_threads_than_stripes_holding_at_once_peak_at_their_sum() {
    peaks("tpc", 24 * 8192, 30);
}

#[test]
fn under_a_budget_the_peak_never_exceeds_it() {
    // Exactly the crowd's need: nothing refused, and the peak is the budget.
    let r = run(
        "threads",
        &["turns", "tpc"],
        &[
            ("PINGUARD_DEPTH", "1"),
            ("PINGUARD_BUDGET", "196608"),
            ("PINGUARD_POLICY", "error"),
        ],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let rep = r.typed_report();
    assert_eq!(rep.totals.denied_count, 0);
    assert_eq!(rep.totals.peak_live_bytes, 196608);
}
