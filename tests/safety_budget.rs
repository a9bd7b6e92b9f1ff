//! The budget's bookkeeping stays exact whatever the calls: a call the runtime rejects never
//! touches it, a pointer with a live record is never recorded twice, and no counter saturates.

use crate::common;
use common::*;

fn rcs(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| l.contains(" rc="))
        .map(|l| l.split(" errno=").next().unwrap().to_string())
        .collect()
}

fn stat(s: &serde_json::Value, k: &str) -> i64 {
    s["cuda"][k].as_i64().unwrap()
}

/// Under `downgrade`, registering a buffer twice gets the runtime's 712 whether the first
/// registration was real or downgraded, unregistering twice gets 713, and nothing stays live.
#[test]
fn registering_twice_gets_the_runtimes_answer_and_leaves_nothing_live() {
    let f = fixtures();
    let ops = [
        "cuda_register:524288",  // slot 0: fits the budget, pinned for real
        "cuda_register:1048576", // slot 1: over the budget, downgraded
        "cuda_register_slot:0",  // the runtime: already registered
        "cuda_register_slot:1",  // downgraded: answered as the runtime would have
        "cuda_unregister:0",
        "cuda_unregister:0", // the runtime: not registered
        "cuda_unregister:1",
        "cuda_unregister:1",
    ];
    let bare = program(&f.dir.join("scenario"), None)
        .args(ops)
        .output()
        .unwrap();
    let bare_rcs = rcs(&String::from_utf8_lossy(&bare.stdout));
    assert_eq!(
        bare_rcs.len(),
        ops.len(),
        "{}",
        String::from_utf8_lossy(&bare.stdout)
    );
    assert!(
        bare_rcs[2].ends_with("rc=712") && bare_rcs[5].ends_with("rc=713"),
        "the emulated runtime's own answers: {bare_rcs:?}"
    );
    let r = run(
        "scenario",
        &ops,
        &[("PINGUARD_BUDGET", "1M"), ("PINGUARD_POLICY", "downgrade")],
    );
    assert!(r.success(), "{}", r.stderr);
    assert_eq!(rcs(&r.stdout), bare_rcs, "every answer as without pinguard");
    let s = r.stats();
    let t = &r.typed_report().totals;
    assert_eq!(stat(&s, "outstanding_bytes"), 0);
    assert_eq!(t.live_bytes, 0, "{t:?}");
    assert_eq!(t.live_count, 0, "{t:?}");
    assert_eq!(t.downgraded_live_bytes, 0, "{t:?}");
}

/// A call with arguments the runtime rejects (SIZE_MAX, unknown flags) between two real ones must
/// not make the budget forget what is live: the runtime never holds more than the budget.
#[test]
fn a_rejected_call_never_touches_the_budget() {
    for policy in ["error", "warn"] {
        let ops = [
            "cuda_alloc:524288",
            "cuda_alloc:18446744073709551615:99",
            "cuda_alloc:18446744073709551615",
            "cuda_alloc:1048576",
        ];
        let r = run(
            "scenario",
            &ops,
            &[("PINGUARD_BUDGET", "1M"), ("PINGUARD_POLICY", policy)],
        );
        assert!(r.success(), "{policy}: {}", r.stderr);
        let s = r.stats();
        let got = rcs(&r.stdout);
        if policy == "error" {
            assert!(
                got[3].ends_with("rc=2"),
                "{policy}: 512 KiB live + 1 MiB is over a 1 MiB budget: {got:?}"
            );
            assert!(
                stat(&s, "max_outstanding_bytes") <= 1 << 20,
                "{policy}: the runtime held {} bytes",
                stat(&s, "max_outstanding_bytes")
            );
        } else {
            let t = &r.typed_report().totals;
            assert_eq!(
                t.over_budget_count, 1,
                "{policy}: only the 1 MiB call went over: {t:?}"
            );
        }
        let t = &r.typed_report().totals;
        assert_eq!(
            t.live_bytes as i64,
            stat(&s, "outstanding_bytes"),
            "{policy}: {t:?}"
        );
    }
}
