//! Threads racing for a budget: the runtime never holds more than the budget, and every counter
//! ends exact. (`scripts/` will hold the long version; this one runs in `cargo test`.)

use crate::common;
use common::*;

#[test]
fn eight_threads_never_exceed_the_budget_and_counters_end_exact() {
    let budget: i64 = 512 * 1024;
    let r = run(
        "stress",
        &["8", "10000"],
        &[("PINGUARD_BUDGET", "512K"), ("PINGUARD_DEPTH", "8")],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let s = r.stats();
    let max = s["cuda_max"].as_i64().unwrap();
    assert!(
        max <= budget,
        "the runtime held {max} bytes at once, over the {budget}-byte budget"
    );
    assert!(
        max > budget / 2,
        "the budget was never approached ({max}): the test proves nothing"
    );
    let refused = s["refused"].as_i64().unwrap();
    assert!(refused > 0, "nothing was refused: the test proves nothing");
    let rep = r.typed_report();
    let t = &rep.totals;
    assert_eq!(t.alloc_count, s["cuda_alloc"]);
    assert_eq!(t.release_count, s["cuda_release"]);
    assert_eq!((t.alloc_count as i64) + refused, 80_000);
    assert_eq!(t.denied_count as i64, refused);
    assert_eq!(t.denied_bytes, s["refused_bytes"]);
    assert_eq!(t.live_bytes, 0);
    assert_eq!(t.live_count, 0);
    assert_eq!(t.failed_count, 0);
    assert!((t.peak_live_bytes as i64) <= budget);
    assert_eq!(s["outstanding"], 0);
    assert_eq!(rep.live.len(), 0);
    // Events are bounded: the drop is counted, nothing is lost silently.
    let kept = rep.events.len() as i64;
    assert_eq!(kept + rep.events_dropped as i64, refused);
}

#[test]
fn mixed_runtimes_race_under_downgrade() {
    let r = run(
        "stress",
        &["8", "3000", "mixed"],
        &[
            ("PINGUARD_BUDGET", "256K"),
            ("PINGUARD_POLICY", "downgrade"),
        ],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let s = r.stats();
    assert_eq!(
        s["refused"], 0,
        "downgrade refuses nothing that is not device-mapped"
    );
    let rep = r.typed_report();
    let t = &rep.totals;
    assert!(s["cuda_max"].as_i64().unwrap() + s["acl_max"].as_i64().unwrap() <= 2 * 256 * 1024);
    assert!((t.peak_live_bytes as i64) <= 256 * 1024);
    assert!((t.downgraded_count as i64) > 0);
    assert_eq!((t.alloc_count as i64) + (t.downgraded_count as i64), 24_000);
    assert_eq!(
        t.alloc_count as i64,
        s["cuda_alloc"].as_i64().unwrap() + s["acl_alloc"].as_i64().unwrap()
    );
    assert_eq!(t.live_bytes, 0);
    assert_eq!(t.downgraded_live_bytes, 0);
    assert_eq!(s["outstanding"], 0);
}
