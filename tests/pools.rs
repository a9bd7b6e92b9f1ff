//! CUDA's stream-ordered host memory pools (driver `cuMemPoolCreate` ..., runtime
//! `cudaMemPoolCreate` ...): a host pool's pinned figure is its reserved memory, checked against
//! the emulated runtimes' own counts (a pool reserves 2 MiB chunks and keeps freed memory until it
//! is trimmed or destroyed); device pools are never counted; budgets apply.

use crate::common;
use common::*;
use serde_json::Value;

const MIB: i64 = 1 << 20;
/// `MIB` as the report's byte counts are typed.
const MIB_BYTES: u64 = 1 << 20;

/// The runtime's own figures: the driver's for `cuda`, the runtime's for `cudart`.
fn own<'a>(s: &'a Value, family: &str) -> &'a Value {
    &s[if family == "cudart" {
        "cudart"
    } else {
        "driver"
    }]
}

fn live_after(family: &str, route: &str, ops: &[&str], env: &[(&str, &str)]) -> (Run, Value) {
    let mut args = vec![route, family];
    args.extend_from_slice(ops);
    let r = run("vmm", &args, env);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let s = r.stats();
    (r, s)
}

/// Allocations grow the pool by chunks; frees keep the memory reserved (still pinned); a trim
/// gives it back; after every step pinguard's live figure is the runtime's own.
#[test]
fn a_host_pool_is_pinned_as_far_as_it_reserves_memory() {
    for (family, routes) in [
        ("cuda", &["export", "dlsym", "gpa", "gpa_ptsz", "ptsz"][..]),
        ("cudart", &["export", "dlsym", "ptsz"][..]),
    ] {
        for route in routes {
            let steps: &[(&str, i64)] = &[
                ("pool_create:host", 0),
                ("pool_alloc:p0:1048576", 2 * MIB), // a first chunk
                ("pool_alloc:p0:524288", 2 * MIB),  // fits in it
                ("pool_alloc:p0:3145728", 6 * MIB), // a chunk of its own, 4 MiB
                ("pool_free:a0", 6 * MIB),          // freed memory stays reserved
                ("pool_free:a1", 6 * MIB),
                ("pool_trim:p0:0", 4 * MIB), // the empty chunk goes
                ("pool_free:a2", 4 * MIB),
                ("pool_destroy:p0", 0),
            ];
            for n in 1..=steps.len() {
                let ops: Vec<&str> = steps[..n].iter().map(|(op, _)| *op).collect();
                let (r, s) = live_after(family, route, &ops, &[]);
                assert!(
                    r.rcs().iter().all(|&rc| rc == 0),
                    "{family} {route} {ops:?}: {}",
                    r.stdout
                );
                let want = steps[n - 1].1;
                assert_eq!(
                    own(&s, family)["outstanding_bytes"],
                    want,
                    "{family} {route} {ops:?}: the runtime's own figure: {s}"
                );
                assert_eq!(
                    s["pinguard_live_bytes"], want,
                    "{family} {route} {ops:?}: {s}"
                );
            }
        }
    }
}

/// The report names the pool's figures under its creation call and each allocation under its
/// own entry point; nothing is left live or unknown once the pool is gone.
#[test]
fn the_report_shows_the_pool_and_its_allocations() {
    for family in ["cuda", "cudart"] {
        let (create, alloc) = if family == "cuda" {
            ("cuMemPoolCreate", "cuMemAllocFromPoolAsync")
        } else {
            ("cudaMemPoolCreate", "cudaMallocFromPoolAsync")
        };
        let (r, _) = live_after(
            family,
            "export",
            &[
                "pool_create:numa",
                "pool_alloc:p0:1048576",
                "pool_alloc:p0:4096",
            ],
            &[],
        );
        let rep = r.typed_report();
        assert_eq!(
            api_stats(&rep, alloc).alloc_count,
            2,
            "{family}: {:?}",
            rep.apis
        );
        assert_eq!(api_stats(&rep, alloc).alloc_bytes, MIB_BYTES + 4096);
        assert_eq!(
            api_stats(&rep, create).live_bytes,
            2 * MIB_BYTES,
            "{family}"
        );
        assert_eq!(rep.totals.live_bytes, 2 * MIB_BYTES);
        assert_eq!(rep.totals.live_count, 1, "one pool");
        let pools: Vec<_> = rep.live.iter().filter(|l| l.api == create).collect();
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].size, 2 * MIB_BYTES);

        let (r, _) = live_after(
            family,
            "export",
            &[
                "pool_create:host",
                "pool_alloc:p0:1048576",
                "pool_free:a0",
                "pool_destroy:p0",
            ],
            &[],
        );
        let t = r.typed_report().totals;
        assert_eq!(t.live_bytes, 0, "{family}: {t:?}");
        assert_eq!(t.live_count, 0);
        assert_eq!(t.peak_live_bytes, 2 * MIB_BYTES);
        assert_eq!(t.unknown_release_count, 0);
        assert_eq!(t.release_count, 1);
    }
}

/// Destroying a pool with allocations out is deferred: its memory stays pinned until the last
/// one is freed.
#[test]
fn a_destroyed_pool_stays_pinned_until_its_last_allocation_is_freed() {
    for family in ["cuda", "cudart"] {
        let base = [
            "pool_create:host",
            "pool_alloc:p0:1048576",
            "pool_destroy:p0",
        ];
        let (_, s) = live_after(family, "export", &base, &[]);
        assert_eq!(
            own(&s, family)["outstanding_bytes"],
            2 * MIB,
            "{family}: {s}"
        );
        assert_eq!(s["pinguard_live_bytes"], 2 * MIB, "{family}: {s}");
        let mut ops = base.to_vec();
        ops.push("pool_free:a0");
        let (_, s) = live_after(family, "export", &ops, &[]);
        assert_eq!(own(&s, family)["outstanding_bytes"], 0, "{family}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{family}: {s}");
    }
}

/// A device pool's memory is not pinned host memory.
#[test]
fn device_pools_are_never_counted() {
    for family in ["cuda", "cudart"] {
        let (r, s) = live_after(
            family,
            "export",
            &[
                "pool_create:device",
                "pool_alloc:p0:1048576",
                "pool_free:a0",
                "pool_destroy:p0",
            ],
            &[("PINGUARD_BUDGET", "1M")],
        );
        assert!(r.rcs().iter().all(|&rc| rc == 0), "{family}: {}", r.stdout);
        assert_eq!(s["pinguard_live_bytes"], 0, "{family}");
        assert!(
            reports_in(&r.report_dir).is_empty(),
            "{family}: nothing was tracked"
        );
    }
}

/// An allocation that would grow the pool past the budget is refused with the runtime's code,
/// without calling it, under `error` and `downgrade`; one the pool has room for is not charged
/// again; `warn` lets it through.
#[test]
fn budgets_apply_to_what_an_allocation_may_add() {
    for family in ["cuda", "cudart"] {
        for policy in ["error", "downgrade"] {
            // 3 MiB budget: the first chunk (2 MiB) fits; a 512 KiB allocation fits in it; a 3 MiB
            // allocation would need a chunk of its own and is refused.
            let (r, s) = live_after(
                family,
                "export",
                &[
                    "pool_create:host",
                    "pool_alloc:p0:1048576",
                    "pool_alloc:p0:524288",
                    "pool_alloc:p0:3145728",
                ],
                &[("PINGUARD_BUDGET", "3M"), ("PINGUARD_POLICY", policy)],
            );
            assert_eq!(r.rcs(), vec![0, 0, 0, 2], "{family} {policy}: {}", r.stdout);
            assert_eq!(
                own(&s, family)["alloc_calls"],
                2,
                "{family} {policy}: the refused call never reached the runtime"
            );
            assert_eq!(own(&s, family)["outstanding_bytes"], 2 * MIB);
            assert_eq!(s["pinguard_live_bytes"], 2 * MIB);
            let t = r.typed_report().totals;
            assert_eq!(t.denied_count, 1, "{family} {policy}: {t:?}");
            assert_eq!(t.downgraded_count, 0);
        }
        let (r, s) = live_after(
            family,
            "export",
            &[
                "pool_create:host",
                "pool_alloc:p0:1048576",
                "pool_alloc:p0:3145728",
            ],
            &[("PINGUARD_BUDGET", "3M"), ("PINGUARD_POLICY", "warn")],
        );
        assert_eq!(r.rcs(), vec![0, 0, 0]);
        assert_eq!(s["pinguard_live_bytes"], 6 * MIB);
        assert_eq!(r.typed_report().totals.over_budget_count, 1);
    }
}

/// CUDA 13's per-location pools: a host location's default (or current) pool is counted from the
/// moment the program gets it, through every route; a device location's never.
#[test]
fn a_locations_host_pool_is_counted_from_when_it_is_handed_out() {
    for (family, routes) in [
        ("cuda", &["export", "dlsym", "gpa"][..]),
        ("cudart", &["export", "dlsym"][..]),
    ] {
        for route in routes {
            let (r, s) = live_after(
                family,
                route,
                &[
                    "pool_default:host",
                    "pool_alloc:p0:1048576",
                    "pool_current:numa",
                    "pool_alloc:p1:4096",
                ],
                &[],
            );
            assert!(
                r.rcs().iter().all(|&rc| rc == 0),
                "{family} {route}: {}",
                r.stdout
            );
            assert_eq!(
                own(&s, family)["outstanding_bytes"],
                4 * MIB,
                "{family} {route}: {s}"
            );
            assert_eq!(s["pinguard_live_bytes"], 4 * MIB, "{family} {route}: {s}");

            // A pool made current for a host location and got back: one pool, counted once.
            let (r, s) = live_after(
                family,
                route,
                &[
                    "pool_create:host",
                    "pool_set:host:p0",
                    "pool_current:host",
                    "pool_alloc:p1:1048576",
                ],
                &[],
            );
            assert!(
                r.rcs().iter().all(|&rc| rc == 0),
                "{family} {route}: {}",
                r.stdout
            );
            assert_eq!(s["pinguard_live_bytes"], 2 * MIB, "{family} {route}: {s}");
            assert_eq!(r.typed_report().totals.live_count, 1, "{family} {route}");

            let (r, s) = live_after(
                family,
                route,
                &["pool_default:device", "pool_alloc:p0:1048576"],
                &[],
            );
            assert!(
                r.rcs().iter().all(|&rc| rc == 0),
                "{family} {route}: {}",
                r.stdout
            );
            assert_eq!(s["pinguard_live_bytes"], 0, "{family} {route}");
        }
    }
}

/// Issue 46 item 13: an allocation from a host pool that the runtime fails has an event that says
/// why: the runtime's code by name, and the room.
#[test]
fn a_failed_pool_allocation_says_why() {
    for (family, alloc, error) in [
        (
            "cuda",
            "cuMemAllocFromPoolAsync",
            "CUDA_ERROR_OUT_OF_MEMORY (2)",
        ),
        (
            "cudart",
            "cudaMallocFromPoolAsync",
            "cudaErrorMemoryAllocation (2)",
        ),
    ] {
        let (r, _) = live_after(
            family,
            "export",
            &["pool_create:host", "pool_alloc:p0:1048576"],
            &[("EMU_FAIL_EVERY", "1"), ("PINGUARD_BUDGET", "1G")],
        );
        assert_eq!(r.rcs(), vec![0, 2], "{family}: {}", r.stdout);
        let rep = r.typed_report();
        let e = failed_event_of(&rep, alloc);
        assert_eq!(e.size, MIB_BYTES, "{family}: {e:?}");
        assert_why_of(e, error);
        let budget = e.why.as_ref().and_then(|w| w.budget_bytes);
        assert_eq!(budget, Some(1 << 30), "{family}: {e:?}");
    }
}
