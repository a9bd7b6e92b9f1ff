//! Every path to pinned memory besides an exported runtime name: the driver API, libcudart's
//! `cuGetProcAddress` resolution, `dlsym(handle, ...)` look-ups, runtimes loaded late and locally.
//! One outer call is one allocation, and the budget holds on every path.

use crate::common;
use common::*;

fn lines_ok(r: &Run) {
    for l in r.stdout.lines().filter(|l| l.contains(" rc=")) {
        assert_eq!(field(l, "rc"), 0, "{l}\n{}", r.stderr);
    }
}

#[test]
fn layered_runtime_counts_one_allocation_under_the_runtime_name() {
    let r = run("driver_paths", &["runtime"], &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    lines_ok(&r);
    let s = r.stats();
    assert_eq!(s["driver_alloc"], 2, "the driver did pin both");
    let rep = r.typed_report();
    let t = &rep.totals;
    assert_eq!(
        t.alloc_count, 2,
        "cudaHostAlloc on top of cuMemHostAlloc is one allocation: {:?}",
        rep.apis
    );
    assert_eq!(t.live_bytes, 8192);
    assert_eq!(t.live_count, 1);
    assert_eq!(rep.apis["cudaHostAlloc"].live_bytes, 8192);
    assert!(!rep.apis.contains_key("cuMemHostAlloc"), "{:?}", rep.apis);
    assert_eq!(t.live_bytes, s["driver_outstanding"]);
}

#[test]
fn static_cudart_pattern_is_tracked_under_driver_names() {
    let r = run("driver_paths", &["static"], &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    lines_ok(&r);
    let s = r.stats();
    let rep = r.typed_report();
    let apis = &rep.apis;
    assert_eq!(apis["cuMemHostAlloc"].alloc_count, 2, "{apis:?}");
    assert_eq!(apis["cuMemHostAlloc"].live_bytes, 8192);
    assert_eq!(apis["cuMemAllocHost_v2"].live_bytes, 4096);
    assert_eq!(
        apis["cuMemAllocHost"].live_bytes, 8192,
        "dlsym'd legacy export and cuGetProcAddress(3010)"
    );
    assert_eq!(
        apis["cuMemHostRegister_v2"].live_bytes, 8192,
        "through cuGetProcAddress looked up through itself"
    );
    assert_eq!(
        rep.totals.unknown_release_count, 0,
        "cuMemFreeHost found its allocation"
    );
    assert_eq!(rep.totals.release_count, 1);
    assert_eq!(rep.totals.live_bytes, s["driver_outstanding"]);
    assert_eq!(rep.totals.alloc_count, s["driver_alloc"]);
    // Frames start in the program, not in pinguard's wrappers.
    let cs = &rep.callsites;
    assert!(
        cs.iter()
            .all(|c| c.frames.first().and_then(|f| f.symbol.as_deref()) == Some("mode_static")),
        "{}",
        serde_json::to_string_pretty(cs).unwrap()
    );
}

#[test]
fn cu_get_proc_address_answers_are_otherwise_unchanged() {
    for env in [&[][..], &[("PINGUARD_HOOKS", "cuda,acl,mlock")][..]] {
        let r = run("driver_paths", &["answers"], env);
        assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
        let checks: Vec<&str> = r
            .stdout
            .lines()
            .filter(|l| l.ends_with(" ok") || l.ends_with(" BAD"))
            .collect();
        assert_eq!(checks.len(), 7, "{}", r.stdout);
        assert!(checks.iter().all(|l| l.ends_with(" ok")), "{}", r.stdout);
    }
}

#[test]
fn driver_redirection_follows_pinguard_hooks() {
    // (Not "mlock" either: the emulated driver pins with mlock, which a real one does not.)
    let r = run(
        "driver_paths",
        &["static"],
        &[("PINGUARD_HOOKS", "cuda,acl")],
    );
    assert!(r.success());
    lines_ok(&r);
    assert!(
        reports_in(&r.report_dir).is_empty(),
        "no driver call is tracked: {:?}",
        reports_in(&r.report_dir)
    );
    assert!(r.stats()["driver_alloc"].as_i64().unwrap() >= 5);
    let r = run("driver_paths", &["acl"], &[("PINGUARD_HOOKS", "cuda")]);
    lines_ok(&r);
    assert!(reports_in(&r.report_dir).is_empty());
}

#[test]
fn torch_npu_dlsym_pattern_is_tracked() {
    let r = run("driver_paths", &["acl", "16384"], &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    lines_ok(&r);
    let rep = r.typed_report();
    assert_eq!(rep.apis["aclrtMallocHostWithCfg"].live_bytes, 16384);
    assert_eq!(rep.apis["aclrtHostRegister"].live_bytes, 8192);
    assert_eq!(rep.totals.live_bytes, r.stats()["acl_outstanding"]);
}

#[test]
fn runtime_loaded_late_and_locally_from_a_thread_is_tracked_from_its_first_call() {
    let r = run("driver_paths", &["late"], &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    lines_ok(&r);
    let rep = r.typed_report();
    assert_eq!(
        rep.apis.get("aclrtMallocHost").map(|a| a.alloc_count),
        Some(2),
        "{:?}",
        rep.apis
    );
    assert_eq!(rep.totals.live_bytes, 4096 + 8192);
    assert_eq!(rep.totals.live_bytes, r.stats()["acl_outstanding"]);
}

#[test]
fn budgets_and_policies_hold_on_every_path() {
    // error: the driver's out-of-memory code, and the driver is never called.
    for mode in ["runtime", "static"] {
        let r = run(
            "driver_paths",
            &[mode, "1048576"],
            &[("PINGUARD_BUDGET", "64K")],
        );
        let first = r.stdout.lines().next().unwrap();
        assert_eq!(field(first, "rc"), 2, "{mode}: {first}");
        assert_eq!(r.typed_report().totals.denied_count, 1, "{mode}");
        assert!(r.stats()["driver_max"].as_i64().unwrap() <= 65536, "{mode}");
    }
    let r = run(
        "driver_paths",
        &["acl", "1048576"],
        &[("PINGUARD_BUDGET", "64K")],
    );
    assert_eq!(r.rc("acl.aclrtMallocHostWithCfg"), 207001);
    // downgrade: pageable memory, nothing pinned by the driver for it.
    let r = run(
        "driver_paths",
        &["static", "1048576"],
        &[("PINGUARD_BUDGET", "64K"), ("PINGUARD_POLICY", "downgrade")],
    );
    lines_ok(&r);
    let rep = r.typed_report();
    assert_eq!(rep.totals.downgraded_count, 1);
    assert_eq!(rep.apis["cuMemHostAlloc"].downgraded_count, 1);
    assert!(r.stats()["driver_max"].as_i64().unwrap() <= 65536);
    // ... but a device-mapped request (CU_MEMHOSTALLOC_DEVICEMAP) is refused.
    let r = run(
        "driver_paths",
        &["static", "1048576", "2"],
        &[("PINGUARD_BUDGET", "64K"), ("PINGUARD_POLICY", "downgrade")],
    );
    assert_eq!(field(r.stdout.lines().next().unwrap(), "rc"), 2);
    let r = run(
        "driver_paths",
        &["runtime", "1048576"],
        &[("PINGUARD_BUDGET", "64K"), ("PINGUARD_POLICY", "warn")],
    );
    lines_ok(&r);
    // The 1 MiB allocation goes over, and so does the 4 KiB one after it (1 MiB is still live).
    assert_eq!(r.typed_report().totals.over_budget_count, 2);
}
