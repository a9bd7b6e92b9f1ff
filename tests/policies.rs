//! The budget under each policy, for every family, with each API's own error code.

use crate::common;
use common::*;
use pinguard_common::EventKind;

const BUDGET: &str = "16384";

fn no_runtime_calls(s: &serde_json::Value) {
    for rt in ["cuda", "acl"] {
        assert_eq!(
            s[rt]["alloc_calls"], 0,
            "{rt}: the real function must not run: {s}"
        );
        assert_eq!(s[rt]["failed_calls"], 0, "{rt}: {s}");
    }
}

#[test]
fn error_policy_refuses_with_each_apis_code_and_never_calls_the_runtime() {
    let ops = [
        "cuda_alloc:32768",
        "cuda_malloc:32768",
        "cuda_register:32768",
        "acl_malloc:32768",
        "acl_malloc_cfg:32768",
        "acl_register:32768",
        "acl_register2:32768:268435456",
        "mlock:0:8",
        "mlock2:0:8",
        "mmap_locked:32768",
        "mlockall:1",
    ];
    let r = run("scenario", &ops, &[("PINGUARD_BUDGET", BUDGET)]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let want = [2, 2, 2, 207001, 207001, 207001, 207001, -1, -1, -1, -1];
    for (op, rc) in ops.iter().zip(want) {
        assert_eq!(r.rc(op), rc, "{op}");
    }
    for (op, errno) in [
        ("mlock:0:8", 12),
        ("mlock2:0:8", 12),
        ("mmap_locked:32768", 11),
        ("mlockall:1", 12),
    ] {
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{op} ")))
            .unwrap();
        assert_eq!(field(line, "errno"), errno, "{line}");
    }
    let s = r.stats();
    no_runtime_calls(&s);
    assert_eq!(s["vmlck"], 0);
    let rep = r.typed_report();
    assert_eq!(rep.totals.denied_count, 11);
    assert_eq!(rep.totals.live_bytes, 0);
    assert_eq!(rep.totals.alloc_count, 0);
    assert_eq!(rep.config.budget_bytes, Some(16384));
    let events = &rep.events;
    assert_eq!(events.len(), 11);
    assert!(events.iter().all(|e| e.kind == EventKind::Denied));
    assert_eq!(events[0].api, "cudaHostAlloc");
    assert_eq!(events[0].size, 32768);
    // Each event names a callsite the report lists.
    let ids: Vec<u32> = rep.callsites.iter().map(|c| c.id).collect();
    assert!(events.iter().all(|e| ids.contains(&e.callsite)));
}

#[test]
fn error_policy_admits_up_to_the_budget_exactly() {
    let r = run(
        "scenario",
        &[
            "cuda_alloc:8192",
            "acl_malloc:4096",
            "mlock:0:1",
            "cuda_alloc:4096",
            "cuda_free:0",
            "cuda_alloc:8192",
        ],
        &[("PINGUARD_BUDGET", BUDGET)],
    );
    assert_eq!(r.rc("cuda_alloc:8192"), 0);
    assert_eq!(r.rc("acl_malloc:4096"), 0);
    assert_eq!(r.rc("mlock:0:1"), 0);
    assert_eq!(
        r.rc("cuda_alloc:4096"),
        2,
        "16 KiB are in use: the next page does not fit"
    );
    // After a free the same request fits again (the last line for cuda_alloc:8192).
    let last = r
        .stdout
        .lines()
        .rfind(|l| l.starts_with("cuda_alloc:8192 "))
        .unwrap();
    assert_eq!(field(last, "rc"), 0);
    let rep = r.typed_report();
    assert_eq!(rep.totals.live_bytes, 16384);
    assert_eq!(rep.totals.denied_count, 1);
    assert_eq!(rep.totals.denied_bytes, 4096);
}

#[test]
fn downgrade_policy_hands_out_pageable_memory_and_frees_it() {
    let ops = [
        "cuda_alloc:32768",
        "cuda_malloc:32768",
        "cuda_register:32768",
        "acl_malloc:32768",
        "acl_malloc_cfg:32768",
        "acl_register2:32768:268435456",
        "mlock:0:8",
        "mlock2:16:8",
        "mmap_locked:32768",
        "vmlck",
        // Device-mapped requests cannot be served by pageable memory.
        "cuda_alloc:32768:2",
        "cuda_register:32768:2",
        "acl_register:32768",
        "acl_register2:32768:2",
        // Releases of downgraded memory go to pinguard, not the runtime.
        "cuda_free:0",
        "cuda_free:1",
        "cuda_unregister:2",
        "acl_free:3",
        "acl_free:4",
        "acl_unregister:5",
    ];
    let r = run(
        "scenario",
        &ops,
        &[
            ("PINGUARD_BUDGET", BUDGET),
            ("PINGUARD_POLICY", "downgrade"),
        ],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    for op in &ops[..9] {
        assert_eq!(r.rc(op), 0, "{op} is downgraded and succeeds");
    }
    for (op, rc) in [
        ("cuda_alloc:32768:2", 2),
        ("cuda_register:32768:2", 2),
        ("acl_register:32768", 207001),
        ("acl_register2:32768:2", 207001),
    ] {
        assert_eq!(r.rc(op), rc, "{op} is refused");
    }
    for op in &ops[14..] {
        assert_eq!(r.rc(op), 0, "{op}");
    }
    let vm = r.stdout.lines().find(|l| l.starts_with("vmlck=")).unwrap();
    assert_eq!(field(vm, "vmlck"), 0, "nothing was locked");
    let s = r.stats();
    no_runtime_calls(&s);
    assert_eq!(s["cuda"]["release_calls"], 0);
    let rep = r.typed_report();
    let t = &rep.totals;
    assert_eq!(t.downgraded_count, 9);
    assert_eq!(t.downgraded_bytes, 9 * 32768);
    assert_eq!(t.downgraded_live_bytes, 0);
    assert_eq!(t.denied_count, 4);
    assert_eq!(t.live_bytes, 0);
    assert_eq!(t.unknown_release_count, 0);
    assert_eq!(rep.apis["cudaHostAlloc"].downgraded_count, 1);
    assert_eq!(rep.apis["cudaHostAlloc"].denied_count, 1);
    let kinds: Vec<EventKind> = rep.events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == EventKind::Downgraded)
            .count(),
        9
    );
}

#[test]
fn downgraded_allocations_left_live_are_listed_as_such() {
    let r = run(
        "scenario",
        &["cuda_alloc:8192", "cuda_alloc:32768"],
        &[
            ("PINGUARD_BUDGET", BUDGET),
            ("PINGUARD_POLICY", "downgrade"),
        ],
    );
    let rep = r.typed_report();
    assert_eq!(rep.totals.live_bytes, 8192);
    assert_eq!(rep.totals.downgraded_live_bytes, 32768);
    let live = &rep.live;
    assert_eq!(live.len(), 2);
    assert_eq!(live.iter().filter(|l| l.downgraded).count(), 1);
    assert_eq!(r.stats()["cuda"]["outstanding_bytes"], 8192);
}

#[test]
fn warn_policy_lets_everything_through_and_logs_once_per_callsite() {
    let ops = [
        "cuda_alloc:32768",
        "acl_malloc:32768",
        "mlock:0:8",
        "cuda_alloc:32768",
    ];
    let r = run(
        "scenario",
        &ops,
        &[("PINGUARD_BUDGET", BUDGET), ("PINGUARD_POLICY", "warn")],
    );
    for op in ops {
        assert_eq!(r.rc(op), 0, "{op}");
    }
    let s = r.stats();
    assert_eq!(s["cuda"]["alloc_calls"], 2);
    let rep = r.typed_report();
    let t = &rep.totals;
    assert_eq!(t.over_budget_count, 4);
    assert_eq!(t.live_bytes, 4 * 32768);
    assert_eq!(t.denied_count, 0);
    let warnings: Vec<_> = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("over the budget"))
        .collect();
    // Four calls from three callsites (both cudaHostAlloc calls come from one line of scenario.c).
    assert_eq!(warnings.len(), 3, "{}", r.stderr);
    // ... and a loop from one callsite warns once.
    let ops: Vec<&str> = std::iter::repeat_n("cuda_alloc:32768", 5).collect();
    let r = run(
        "scenario",
        &ops,
        &[("PINGUARD_BUDGET", "4096"), ("PINGUARD_POLICY", "warn")],
    );
    let warnings = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("over the budget"))
        .count();
    assert_eq!(warnings, 1, "{}", r.stderr);
    assert_eq!(r.typed_report().totals.over_budget_count, 5);
}

#[test]
fn the_warn_line_gives_sizes_and_names_the_callsite() {
    // The workload asks for 4 MiB in grow_kv_cache with 2.81 MiB pinned: over a 3 MiB budget.
    let r = run(
        "workload",
        &[],
        &[("PINGUARD_BUDGET", "3M"), ("PINGUARD_POLICY", "warn")],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let warnings: Vec<_> = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("over the budget"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", r.stderr);
    // Named from the program's symbol table (grow_kv_cache is static: the loader does not know
    // it); no file and line, which would take the debug information inside the program's call.
    let want = "cudaHostAlloc of 4.00 MiB goes over the budget of 3.00 MiB at grow_kv_cache; allowed (policy warn; logged once per callsite)";
    assert!(
        warnings[0].contains(&format!("{want}; budget 3.00 MiB, RLIMIT_MEMLOCK ")),
        "want the line to hold\n  {want}\nand the room after it (issue 46 item 13), got\n  {}",
        warnings[0]
    );
    assert!(
        warnings[0].starts_with(&format!(
            "pinguard[{}]: warning: ",
            r.typed_report().process.pid
        )),
        "{}",
        warnings[0]
    );
    assert_eq!(r.typed_report().totals.over_budget_count, 1);
}
