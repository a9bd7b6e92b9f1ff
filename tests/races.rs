//! Sixteen threads racing over every family for one budget, with and without the runtimes failing
//! calls: the runtimes never hold more than the budget together, and every counter ends exact.
//! `scripts/race.sh` runs the long version (1,000,000 operations).

use crate::common;
use common::*;
use serde_json::Value;

fn sum(v: &Value) -> i64 {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .sum()
}

fn check(threads: usize, ops: usize, budget: i64, fail_rate: Option<&str>) {
    let b = budget.to_string();
    let mut env = vec![("PINGUARD_BUDGET", b.as_str()), ("PINGUARD_DEPTH", "8")];
    if let Some(r) = fail_rate {
        env.push(("EMU_FAIL_RATE", r));
    }
    let r = run("race", &[&threads.to_string(), &ops.to_string()], &env);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let s = r.stats();
    let max = s["combined_max"].as_i64().unwrap();
    assert!(
        max <= budget,
        "the runtimes held {max} bytes at once, over the {budget}-byte budget"
    );
    assert!(
        max > budget / 2,
        "the budget was never approached ({max} of {budget}): the test proves nothing"
    );
    assert_eq!(s["combined"], 0);
    assert_eq!(
        s["probe"], 0,
        "a budget-sized allocation must fit at the end: a reservation leaked"
    );
    let rep = r.typed_report();
    let t = &rep.totals;
    let ok = sum(&s["ok"]);
    let refused = sum(&s["refused"]);
    assert_eq!(ok + refused, (threads * ops) as i64);
    let runtime_failed = sum(&s["runtime_failed"]);
    assert!(refused > 0, "nothing was refused: the test proves nothing");
    // The probe's allocation and release (by the CUDA runtime, after the threads) count too.
    assert_eq!(
        t.alloc_count as i64,
        ok + 1,
        "every successful call counted once"
    );
    assert_eq!(
        t.alloc_count as i64,
        sum(&s["runtime_alloc"]) + s["ok"][3].as_i64().unwrap()
    );
    assert_eq!(t.release_count as i64, sum(&s["released"]) + 1);
    assert_eq!(
        t.release_count as i64,
        sum(&s["runtime_release"]) + s["released"][3].as_i64().unwrap()
    );
    // The probe's own injected failures (if any) are the runtime's, after the threads.
    let probe_failures = s["probe_failures"].as_i64().unwrap();
    assert_eq!(
        t.denied_count as i64 + runtime_failed - probe_failures,
        refused,
        "each refusal is pinguard's or the runtime's"
    );
    assert_eq!(t.failed_count as i64, runtime_failed);
    assert_eq!(
        runtime_failed,
        sum(&s["injected"]),
        "the runtimes failed only where told to"
    );
    match fail_rate {
        Some(_) => assert!(runtime_failed > 0),
        None => assert_eq!(runtime_failed, 0),
    }
    assert_eq!(t.live_bytes, 0);
    assert_eq!(t.live_count, 0);
    assert!(t.peak_live_bytes as i64 <= budget);
    assert_eq!(s["pinguard_live_bytes"], 0);
    for api in [
        "cudaHostAlloc",
        "cuMemHostAlloc",
        "aclrtMallocHost",
        "mlock",
    ] {
        assert!(api_stats(&rep, api).alloc_count > 0, "{api} was exercised");
    }
}

#[test]
fn sixteen_threads_over_every_family_hold_the_budget() {
    check(16, 4000, 1 << 20, None);
}

#[test]
fn runtime_failures_are_counted_and_release_their_reservations() {
    check(16, 2000, 1 << 20, Some("0.2"));
}
