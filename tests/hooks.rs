//! Every hook passes calls through and counts them exactly, checked against the emulated
//! runtimes' own counters.

use crate::common;
use common::*;

#[test]
fn every_hook_passes_through_and_counts_exactly_without_a_budget() {
    let r = run(
        "scenario",
        &[
            "cuda_alloc:8192",
            "cuda_malloc:4096",
            "cuda_register:16384",
            "acl_malloc:12288",
            "acl_malloc_cfg:4096",
            "acl_register:8192",
            "acl_register2:4096:268435456",
            "cuda_free:0",
            "cuda_unregister:2",
            "acl_free:4",
            "acl_unregister:6",
            "mlock:0:4",
            "mlock2:8:2",
            "munlock:0:1",
            "mmap_locked:8192",
        ],
        &[],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    for line in r.stdout.lines().filter(|l| l.contains(" rc=")) {
        assert_eq!(field(line, "rc"), 0, "{line}");
    }
    let s = r.stats();
    // Left live: cuda_malloc 4096, acl_malloc 12288, acl_register 8192, mlock 3+2 pages, mmap 2 pages.
    let runtime_live = s["cuda"]["outstanding_bytes"].as_i64().unwrap()
        + s["acl"]["outstanding_bytes"].as_i64().unwrap();
    assert_eq!(runtime_live, 4096 + 12288 + 8192);
    assert_eq!(s["cuda"]["alloc_calls"], 3);
    assert_eq!(s["acl"]["alloc_calls"], 4);
    let locked = (3 + 2 + 2) * 4096;
    assert_eq!(
        s["pinguard_live_bytes"].as_i64().unwrap(),
        runtime_live + locked
    );

    let rep = r.typed_report();
    let t = &rep.totals;
    assert_eq!(t.live_bytes as i64, runtime_live + locked);
    // Ten pinning calls (seven runtime, three locking), four releases of what they pinned and one
    // munlock. The runtimes' own internal mlock calls are not counted: one outer call, one count.
    assert_eq!(t.alloc_count, 10);
    assert_eq!(t.release_count, 5);
    assert_eq!(t.failed_count, 0);
    assert_eq!(t.unknown_release_count, 0);
    assert!(rep.apis.contains_key("mlock"));
    assert_eq!(rep.apis["mlock"].alloc_count, 1);
    assert_eq!(rep.apis["cudaHostAlloc"].live_count, 0);
    assert_eq!(rep.apis["cudaMallocHost"].live_bytes, 4096);
    assert_eq!(rep.apis["aclrtHostRegister"].live_bytes, 8192);
    assert_eq!(rep.apis["aclrtHostRegisterV2"].live_bytes, 0);
    assert_eq!(rep.apis["mmap"].live_bytes, 8192);
    assert!(rep.totals.peak_live_bytes >= t.live_bytes);
}

#[test]
fn failed_unknown_and_double_releases_leave_counters_exact() {
    let r = run(
        "scenario",
        &[
            "cuda_alloc:4096",
            "cuda_alloc:4096",
            "cuda_alloc:4096",
            "cuda_free:0",
            "cuda_free:0",
            "cuda_free_raw:0x1000",
            "cuda_alloc:4096:99",
        ],
        &[("EMU_FAIL_EVERY", "2")],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let s = r.stats();
    let rep = r.typed_report();
    let t = &rep.totals;
    // Calls 1 and 3 pin; call 2 is failed by the runtime; the double free and the unknown pointer
    // pass through and fail there; the bad flags fail as invalid.
    assert_eq!(s["cuda"]["alloc_calls"], 2);
    assert_eq!(s["cuda"]["injected_failures"], 1);
    assert_eq!(t.alloc_count, s["cuda"]["alloc_calls"]);
    assert_eq!(t.failed_count, s["cuda"]["failed_calls"]);
    assert_eq!(t.failed_count, 4);
    assert_eq!(t.unknown_release_count, 2);
    assert_eq!(t.live_bytes, s["cuda"]["outstanding_bytes"]);
    assert_eq!(t.live_bytes, 4096);
    assert_eq!(t.live_count, 1);
    assert_eq!(rep.apis["cudaHostAlloc"].failed_count, 2);
    assert_eq!(rep.apis["cudaFreeHost"].failed_count, 2);
}

#[test]
fn errno_survives_a_successful_hooked_call() {
    let r = run("scenario", &["errno_check"], &[]);
    assert!(r.stdout.contains("errno_after=4242"), "{}", r.stdout);
}

#[test]
fn hooks_switched_off_pass_through_untracked() {
    let r = run(
        "scenario",
        &["cuda_alloc:4096", "acl_malloc:4096", "mlock:0:1"],
        &[("PINGUARD_HOOKS", "acl")],
    );
    assert!(r.success());
    let rep = r.typed_report();
    assert_eq!(rep.totals.alloc_count, 1);
    assert_eq!(rep.totals.live_bytes, 4096);
    assert!(rep.apis.contains_key("aclrtMallocHost"));
    assert!(!rep.apis.contains_key("cudaHostAlloc"));
    assert_eq!(rep.config.hooks, ["acl"]);
}

#[test]
fn disabled_means_untouched() {
    let r = run(
        "scenario",
        &["cuda_alloc:4096", "mlock:0:1"],
        &[("PINGUARD_DISABLE", "1"), ("PINGUARD_BUDGET", "0")],
    );
    assert!(r.success());
    assert_eq!(r.rc("cuda_alloc:4096"), 0);
    assert_eq!(r.stats()["pinguard_live_bytes"], 0);
    assert!(reports_in(&r.report_dir).is_empty());
    assert_eq!(r.stderr, "");
}
