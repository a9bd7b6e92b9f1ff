//! The virtual-memory APIs' physical host allocations (CUDA's `cuMemCreate` family, Ascend's
//! `aclrtMallocPhysical` family), checked against the emulated runtimes' own counts: counted once
//! from the creation until the last reference is released and the last mapping unmapped, in every
//! order, through every route; device memory never; budgets under every policy.

use crate::common;
use common::*;
use pinguard_common::Live;
use serde_json::Value;

const MIB: i64 = 1 << 20;
/// `MIB` as the report's byte counts are typed.
const MIB_BYTES: u64 = 1 << 20;

/// The emulated runtime's own figures for a family: the driver's for CUDA, ACL's for ACL.
fn own<'a>(s: &'a Value, family: &str) -> &'a Value {
    &s[if family == "acl" { "acl" } else { "driver" }]
}

fn api(family: &str, cuda: &'static str, acl: &'static str) -> &'static str {
    if family == "acl" {
        acl
    } else {
        cuda
    }
}

fn all_ok(r: &Run) {
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    for (op, rc) in r.named_rcs() {
        assert_eq!(rc, 0, "{op}:\n{}\n{}", r.stdout, r.stderr);
    }
}

/// A life in the usual order (create, reserve, map, touch, unmap, release) leaves nothing, and
/// while it is mapped the one allocation is live at its exact size under its entry point.
#[test]
fn a_mapped_host_allocation_is_live_until_unmapped_and_released() {
    for family in ["cuda", "acl"] {
        for route in ["export", "dlsym", "gpa"] {
            if route == "gpa" && family == "acl" {
                continue;
            }
            // Still mapped at exit: the exit report shows it live.
            let r = run(
                "vmm",
                &[
                    route,
                    family,
                    "create:2097152:host",
                    "reserve:2097152",
                    "map:v0:h0:0",
                    "touch:v0:2097152",
                ],
                &[],
            );
            all_ok(&r);
            let s = r.stats();
            assert_eq!(
                own(&s, family)["outstanding_bytes"],
                2 * MIB,
                "{route} {family}: {s}"
            );
            assert_eq!(s["pinguard_live_bytes"], 2 * MIB, "{route} {family}: {s}");
            let rep = r.typed_report();
            let name = api(family, "cuMemCreate", "aclrtMallocPhysical");
            assert_eq!(
                rep.totals.live_bytes,
                2 * MIB_BYTES,
                "{route} {family}: {rep:?}"
            );
            let a = &rep.apis[name];
            assert_eq!(a.alloc_count, 1, "{route} {family}");
            assert_eq!(a.live_bytes, 2 * MIB_BYTES, "{route} {family}");
            let live: Vec<&Live> = rep.live.iter().filter(|l| l.api == name).collect();
            assert_eq!(live.len(), 1, "{route} {family}: {:?}", rep.live);
            assert_eq!(live[0].size, 2 * MIB_BYTES);

            let r = run(
                "vmm",
                &[
                    route,
                    family,
                    "create:2097152:host",
                    "reserve:2097152",
                    "map:v0:h0:0",
                    "touch:v0:2097152",
                    "unmap:v0:2097152",
                    "release:h0",
                ],
                &[],
            );
            all_ok(&r);
            let s = r.stats();
            assert_eq!(own(&s, family)["alloc_calls"], 1, "{route} {family}: {s}");
            assert_eq!(own(&s, family)["release_calls"], 1, "{route} {family}: {s}");
            assert_eq!(own(&s, family)["max_outstanding_bytes"], 2 * MIB);
            assert_eq!(own(&s, family)["outstanding_bytes"], 0);
            assert_eq!(s["pinguard_live_bytes"], 0, "{route} {family}: {s}");
            let rep = r.typed_report();
            let name = api(family, "cuMemCreate", "aclrtMallocPhysical");
            assert_eq!(rep.apis[name].alloc_count, 1);
            assert_eq!(rep.apis[name].peak_live_bytes, 2 * MIB_BYTES);
            assert_eq!(rep.totals.release_count, 1);
            assert_eq!(rep.totals.live_bytes, 0);
            assert_eq!(rep.totals.unknown_release_count, 0);
        }
    }
}

/// The memory is freed by whichever of "last reference released" and "last mapping unmapped"
/// comes last: pinguard's live figure follows the runtime's own after every step.
#[test]
fn references_and_mappings_in_every_order() {
    let two = 2 * MIB;
    // (ops after create+reserve+map, live after each op, as the runtime counts it)
    let cases: &[(&[&str], &[i64])] = &[
        // released while mapped: live until unmapped
        (&["release:h0", "unmap:v0:2097152"], &[two, 0]),
        // unmapped while held: live until released
        (&["unmap:v0:2097152", "release:h0"], &[two, 0]),
        // a retained reference keeps it after the first release
        (
            &["retain:v0", "release:h0", "unmap:v0:2097152", "release:h1"],
            &[two, two, two, 0],
        ),
        (
            &["retain:v0", "unmap:v0:2097152", "release:h1", "release:h0"],
            &[two, two, two, 0],
        ),
    ];
    for family in ["cuda", "acl"] {
        for (ops, lives) in cases {
            for n in 0..=ops.len() {
                let mut args = vec![
                    "export",
                    family,
                    "create:2097152:numa",
                    "reserve:2097152",
                    "map:v0:h0:0",
                ];
                args.extend_from_slice(&ops[..n]);
                let r = run("vmm", &args, &[]);
                all_ok(&r);
                let s = r.stats();
                let want = if n == 0 { two } else { lives[n - 1] };
                assert_eq!(
                    own(&s, family)["outstanding_bytes"],
                    want,
                    "{family} {:?}: {s}",
                    &ops[..n]
                );
                assert_eq!(
                    s["pinguard_live_bytes"],
                    want,
                    "{family} {:?}: {s}",
                    &ops[..n]
                );
            }
        }
    }
}

/// Device memory is not pinned host memory: never counted, whatever is done with it.
#[test]
fn device_allocations_are_never_counted() {
    for family in ["cuda", "acl"] {
        let r = run(
            "vmm",
            &[
                "export",
                family,
                "create:4194304:device",
                "reserve:4194304",
                "map:v0:h0:0",
                "unmap:v0:4194304",
                "release:h0",
            ],
            &[("PINGUARD_BUDGET", "1M")],
        );
        all_ok(&r);
        let s = r.stats();
        assert_eq!(s["pinguard_live_bytes"], 0, "{family}");
        // Nothing was tracked, so no report was written (pinguard writes one only when it counted
        // something).
        assert!(
            reports_in(&r.report_dir).is_empty(),
            "{family}: {:?}",
            reports_in(&r.report_dir)
        );
    }
}

/// The location's type decides, at its own place in each layout: CUDA's location is
/// `{type, id}` at byte 8, ACL's `{id, type}` at byte 12. A CUDA prop read as ACL's (or the
/// reverse) would take host memory for device memory.
#[test]
fn both_location_orders_are_read_at_their_own_place() {
    // ACL, location type 0 (host) with an id of 1 right before it: host memory, counted.
    let r = run(
        "vmm",
        &[
            "export",
            "acl",
            "create_raw:1048576:0:0",
            "reserve:1048576",
            "map:v0:h0:0",
        ],
        &[],
    );
    all_ok(&r);
    assert_eq!(r.stats()["pinguard_live_bytes"], MIB);
    // ACL, location type 1 (device): not counted.
    let r = run("vmm", &["export", "acl", "create_raw:1048576:0:1"], &[]);
    all_ok(&r);
    assert_eq!(r.stats()["pinguard_live_bytes"], 0);
    // CUDA, location type 3 (host NUMA): counted; type 1 (device): not.
    let r = run("vmm", &["export", "cuda", "create_raw:1048576:1:3"], &[]);
    all_ok(&r);
    assert_eq!(r.stats()["pinguard_live_bytes"], MIB);
    let r = run("vmm", &["export", "cuda", "create_raw:1048576:1:1"], &[]);
    all_ok(&r);
    assert_eq!(r.stats()["pinguard_live_bytes"], 0);
    // Arguments the runtime rejects (an unknown allocation type) get its own answer, uncounted.
    let r = run("vmm", &["export", "cuda", "create_raw:1048576:7:2"], &[]);
    assert_eq!(r.named_rcs()[0].1, 1, "{}", r.stdout);
    assert_eq!(r.stats()["pinguard_live_bytes"], 0);
}

/// Budgets apply under every policy: `error` and `downgrade` refuse with the runtime's
/// out-of-memory code without calling it (device-mapped memory has no pageable stand-in),
/// `warn` lets the call through.
#[test]
fn budgets_refuse_under_error_and_downgrade_and_warn_lets_it_through() {
    for family in ["cuda", "acl"] {
        let oom = if family == "acl" { 207001 } else { 2 };
        for policy in ["error", "downgrade"] {
            let r = run(
                "vmm",
                &[
                    "export",
                    family,
                    "create:2097152:host",
                    "create:2097152:host",
                ],
                &[("PINGUARD_BUDGET", "3M"), ("PINGUARD_POLICY", policy)],
            );
            assert!(r.success(), "{}", r.stderr);
            let rc = r.named_rcs();
            assert_eq!(
                (rc[0].1, rc[1].1),
                (0, oom),
                "{family} {policy}: {}",
                r.stdout
            );
            let s = r.stats();
            assert_eq!(
                own(&s, family)["alloc_calls"],
                1,
                "{family} {policy}: the refused call never reached the runtime"
            );
            assert_eq!(own(&s, family)["failed_calls"], 0, "{family} {policy}");
            assert_eq!(s["pinguard_live_bytes"], 2 * MIB);
            let t = r.typed_report().totals;
            assert_eq!(t.denied_count, 1, "{family} {policy}");
            assert_eq!(t.downgraded_count, 0, "{family} {policy}");
        }
        let r = run(
            "vmm",
            &[
                "export",
                family,
                "create:2097152:host",
                "create:2097152:host",
            ],
            &[("PINGUARD_BUDGET", "3M"), ("PINGUARD_POLICY", "warn")],
        );
        all_ok(&r);
        let s = r.stats();
        assert_eq!(own(&s, family)["alloc_calls"], 2);
        assert_eq!(s["pinguard_live_bytes"], 4 * MIB);
        assert_eq!(r.typed_report().totals.over_budget_count, 1);
    }
}

/// A released allocation gives its budget back: the next one fits again.
#[test]
fn released_allocations_give_their_budget_back() {
    let r = run(
        "vmm",
        &[
            "export",
            "cuda",
            "create:2097152:host",
            "reserve:2097152",
            "map:v0:h0:0",
            "unmap:v0:2097152",
            "release:h0",
            "create:2097152:host",
        ],
        &[("PINGUARD_BUDGET", "3M")],
    );
    all_ok(&r);
    assert_eq!(r.stats()["pinguard_live_bytes"], 2 * MIB);
}

/// Issue 46 item 13: a physical host allocation the runtime fails, and a mapping of one that it
/// refuses (larger than the allocation), have events that say why: the runtime's code by name,
/// and the room.
#[test]
fn a_failed_physical_allocation_or_mapping_says_why() {
    for (family, oom, invalid) in [
        (
            "cuda",
            "CUDA_ERROR_OUT_OF_MEMORY (2)",
            "CUDA_ERROR_INVALID_VALUE (1)",
        ),
        (
            "acl",
            "ACL_ERROR_RT_MEMORY_ALLOCATION (207001)",
            "ACL_ERROR_INVALID_PARAM (100000)",
        ),
    ] {
        let create = api(family, "cuMemCreate", "aclrtMallocPhysical");
        let r = run(
            "vmm",
            &["export", family, "create:2097152:host"],
            &[("EMU_FAIL_EVERY", "1")],
        );
        assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
        assert_ne!(r.named_rcs()[0].1, 0, "{family}: {}", r.stdout);
        let rep = r.typed_report();
        let e = failed_event_of(&rep, create);
        assert_eq!(e.size, 2 * MIB_BYTES, "{family}: {e:?}");
        assert_why_of(e, oom);

        let map = api(family, "cuMemMap", "aclrtMapMem");
        let r = run(
            "vmm",
            &[
                "export",
                family,
                "create:2097152:host",
                "reserve:4194304",
                "map:v0:h0:4194304",
            ],
            &[],
        );
        assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
        assert_ne!(r.named_rcs()[2].1, 0, "{family}: {}", r.stdout);
        let rep = r.typed_report();
        let e = failed_event_of(&rep, map);
        assert_eq!(e.size, 4 * MIB_BYTES, "{family}: {e:?}");
        assert_why_of(e, invalid);
    }
}

/// Issue 46 item 13: a registration over memory the runtime pinned already, which the runtime
/// refuses (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`, as CUDA does), has an event that says
/// why.
#[test]
fn a_refused_registration_over_pinned_memory_says_why() {
    let r = run(
        "vmm",
        &["export", "cuda", "host_alloc:65536", "host_register:a0"],
        &[],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.named_rcs()[1].1, 712, "{}", r.stdout);
    let rep = r.typed_report();
    let e = failed_event_of(&rep, "cuMemHostRegister_v2");
    assert_eq!(e.size, 65536, "{e:?}");
    assert_why_of(e, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712)");
}
