//! AMD's HIP runtime (`PINGUARD_HOOKS=hip`): every host-pinned entry point through every route a
//! program takes (the exports, `dlsym(handle, name)`, `hipGetProcAddress`), under each policy,
//! against the emulated `libamdhip64.so.5` (tests/emul/hip.c) and its own counters; and the real
//! Debian library (5.2.3), loaded beside pinguard on a machine without an AMD device, answering
//! exactly as it does without pinguard.

use crate::common;
use common::*;
use pinguard_common::EventKind;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

const ROUTES: [&str; 3] = ["export", "dlsym", "proc"];
/// Where the real library lives on Debian (package libamdhip64-5).
const REAL_LIB: &str = "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5";

/// The test program linked with the emulated runtime (`hip`), and with the real one (`hip_real`,
/// when the system has it): `tests/fixtures.txt`, sets `hip` and `hip_real`.
fn programs() -> &'static (PathBuf, Option<PathBuf>) {
    static P: OnceLock<(PathBuf, Option<PathBuf>)> = OnceLock::new();
    P.get_or_init(|| {
        let dir = fixture_set("hip").join("hip");
        let real = (real_expected() && std::path::Path::new(REAL_LIB).exists())
            .then(|| fixture_set("hip_real").join("hip/hip_real"));
        (dir.join("hip"), real)
    })
}

/// Debian ships the runtime for amd64 only; the aarch64 runs (under qemu) have none to load.
fn real_expected() -> bool {
    cfg!(target_arch = "x86_64") && !aarch64()
}

fn hip(route: &str, ops: &[&str], env: &[(&str, &str)]) -> Run {
    let path = programs().0.to_string_lossy().into_owned();
    let mut env = env.to_vec();
    env.push(("HIP_ROUTE", route));
    let r = run(&path, ops, &env);
    assert!(r.success(), "{route}: {}\n{}", r.stdout, r.stderr);
    r
}

/// Every allocation name, every free name, registration and a host pool: counted exactly as the
/// runtime counts, through each route; memory from any allocation name is freed by either free.
#[test]
fn every_entry_point_counts_exactly_through_each_route() {
    let ops = [
        "malloc:8192",
        "alloc:4096:1",
        "ext:12288:4",
        "mallochost:4096",
        "memallochost:4096",
        "register:8192:2",
        "pool:2",
        "pool_alloc:6:4096",
        "touch:0",
        "flags:0",
    ];
    let frees = [
        "free:0",
        "freehost:1",
        "free:2",
        "freehost:3",
        "free:4",
        "unregister:5",
        "free_async:7",
        "destroy:6",
    ];
    for route in ROUTES {
        let r = hip(route, &ops, &[]);
        assert!(
            r.rcs_of(&ops).iter().all(|&rc| rc == 0),
            "{route}: {}",
            r.stdout
        );
        let s = r.stats();
        assert_eq!(s["hip"]["emulated"], 1);
        assert_eq!(
            s["hip"]["outstanding_bytes"],
            8192 + 4096 + 12288 + 4096 + 4096 + 8192 + 2 * 1048576,
            "{route}: {s}"
        );
        assert_eq!(
            s["pinguard_live_bytes"], s["hip"]["outstanding_bytes"],
            "{route}: pinguard counts what the runtime pinned"
        );
        let rep = r.typed_report();
        for (name, bytes) in [
            ("hipHostMalloc", 8192),
            ("hipHostAlloc", 4096),
            ("hipExtHostAlloc", 12288),
            ("hipMallocHost", 4096),
            ("hipMemAllocHost", 4096),
            ("hipHostRegister", 8192),
        ] {
            assert_eq!(
                api_stats(&rep, name).alloc_count,
                1,
                "{route} {name}: {:?}",
                rep.apis
            );
            assert_eq!(api_stats(&rep, name).live_bytes, bytes, "{route} {name}");
        }
        assert_eq!(
            api_stats(&rep, "hipMemPoolCreate").live_bytes,
            2 * 1048576,
            "{route}: the host pool's reserve"
        );
        assert_eq!(
            rep.config.hooks.iter().filter(|h| *h == "hip").count(),
            1,
            "{:?}",
            rep.config.hooks
        );

        let all: Vec<&str> = ops.iter().chain(frees.iter()).copied().collect();
        let r = hip(route, &all, &[]);
        assert!(
            r.rcs_of(&frees).iter().all(|&rc| rc == 0),
            "{route}: {}",
            r.stdout
        );
        let s = r.stats();
        assert_eq!(s["hip"]["outstanding_bytes"], 0, "{route}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{route}");
        let t = r.typed_report().totals;
        assert_eq!(t.live_bytes, 0, "{route}: {t:?}");
        assert_eq!(
            t.unknown_release_count, 0,
            "{route}: each free found its allocation, whichever name made it"
        );
        assert_eq!(t.release_count, s["hip"]["release_calls"], "{route}");
    }
}

/// Calls the runtime rejects get its own codes, and its counters and pinguard's agree: a second
/// registration (712), a registration of memory hipHostMalloc pinned (712), flags it does not know
/// (hipErrorInvalidValue), a free of a pointer it never gave out (hipErrorInvalidValue).
#[test]
fn rejected_calls_get_the_runtimes_own_codes() {
    for route in ROUTES {
        let ops = [
            "register:8192:0",
            "register_slot:0:0",
            "malloc:4096",
            "register_slot:1:0",
            "malloc:4096:256",
            "malloc:4096:3221225472",
            "register:4096:16",
            "free_raw:0",
        ];
        let r = hip(route, &ops, &[("PINGUARD_BUDGET", "1M")]);
        assert_eq!(
            r.rcs_of(&ops),
            vec![0, 712, 0, 712, 1, 1, 1, 1],
            "{route}: {}",
            r.stdout
        );
        let s = r.stats();
        assert_eq!(
            s["hip"]["failed_calls"], 6,
            "{route}: every rejection came from the runtime: {s}"
        );
        assert_eq!(
            s["pinguard_live_bytes"], s["hip"]["outstanding_bytes"],
            "{route}"
        );
        let rep = r.typed_report();
        assert_eq!(rep.totals.unknown_release_count, 1, "{route}");
        assert_eq!(rep.totals.denied_count, 0, "{route}");
    }
}

/// Arguments the runtime rejects get its answer whatever the budget: unknown flags and both
/// coherences at once reach the runtime (hipErrorInvalidValue), not the budget's refusal.
#[test]
fn calls_the_runtime_rejects_get_its_answer_over_the_budget() {
    for route in ROUTES {
        let ops = [
            "malloc:32768:256",
            "malloc:32768:3221225472",
            "ext:32768:3221225472",
            "register:32768:16",
        ];
        let r = hip(
            route,
            &ops,
            &[("PINGUARD_BUDGET", "16K"), ("PINGUARD_POLICY", "downgrade")],
        );
        assert_eq!(r.rcs_of(&ops), vec![1, 1, 1, 1], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(
            s["hip"]["failed_calls"], 4,
            "{route}: the runtime answered each: {s}"
        );
        let t = r.typed_report().totals;
        assert_eq!(t.denied_count, 0, "{route}: {t:?}");
        assert_eq!(t.downgraded_count, 0, "{route}");
    }
}

/// `error`: over the budget, every entry point gets hipErrorOutOfMemory and the runtime is never
/// called; what fits is admitted.
#[test]
fn error_policy_refuses_with_hip_error_out_of_memory() {
    for route in ROUTES {
        let ops = [
            "malloc:32768",
            "alloc:32768",
            "ext:32768",
            "mallochost:32768",
            "memallochost:32768",
            "register:32768:0",
            "malloc:8192",
        ];
        let r = hip(route, &ops, &[("PINGUARD_BUDGET", "16K")]);
        assert_eq!(
            r.rcs_of(&ops),
            vec![2, 2, 2, 2, 2, 2, 0],
            "{route}: {}",
            r.stdout
        );
        let s = r.stats();
        assert_eq!(
            s["hip"]["alloc_calls"], 1,
            "{route}: only the call that fits reached the runtime"
        );
        assert_eq!(s["hip"]["failed_calls"], 0, "{route}");
        let rep = r.typed_report();
        assert_eq!(rep.totals.denied_count, 6, "{route}");
        assert_eq!(rep.totals.live_bytes, 8192, "{route}");
        let names: Vec<&str> = rep
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Denied)
            .map(|e| e.api.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "hipHostMalloc",
                "hipHostAlloc",
                "hipExtHostAlloc",
                "hipMallocHost",
                "hipMemAllocHost",
                "hipHostRegister"
            ],
            "{route}"
        );
    }
}

/// `downgrade`: allocations pageable memory can serve get it, usable and freed by either free
/// without reaching the runtime; device-mapped ones (`hipHostMallocMapped`, every registration)
/// are refused with the runtime's code.
#[test]
fn downgrade_policy_serves_pageable_memory_that_hip_host_free_takes_back() {
    for route in ROUTES {
        let ops = [
            "malloc:32768",
            "alloc:32768",
            "ext:32768:4",
            "mallochost:32768",
            "memallochost:32768",
            "malloc:32768:2",
            "register:32768:0",
            "touch:0",
            "touch:4",
            "free:0",
            "freehost:1",
            "free:2",
            "free:3",
            "freehost:4",
        ];
        let r = hip(
            route,
            &ops,
            &[("PINGUARD_BUDGET", "16K"), ("PINGUARD_POLICY", "downgrade")],
        );
        assert_eq!(
            r.rcs_of(&ops),
            vec![0, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0, 0, 0],
            "{route}: {}",
            r.stdout
        );
        let s = r.stats();
        assert_eq!(
            s["hip"]["alloc_calls"], 0,
            "{route}: the runtime never saw them: {s}"
        );
        assert_eq!(s["hip"]["release_calls"], 0, "{route}");
        assert_eq!(s["hip"]["failed_calls"], 0, "{route}");
        let t = r.typed_report().totals;
        assert_eq!(t.downgraded_count, 5, "{route}: {t:?}");
        assert_eq!(t.downgraded_bytes, 5 * 32768, "{route}");
        assert_eq!(t.downgraded_live_bytes, 0, "{route}");
        assert_eq!(t.denied_count, 2, "{route}");
        assert_eq!(t.unknown_release_count, 0, "{route}");
    }
}

/// `PINGUARD_DOWNGRADE_MATCH` scopes HIP's downgrades as CUDA's: a callsite outside it is refused.
#[test]
fn downgrade_match_scopes_hip_downgrades() {
    let env = |m| {
        [
            ("PINGUARD_BUDGET", "16K"),
            ("PINGUARD_POLICY", "downgrade"),
            ("PINGUARD_DOWNGRADE_MATCH", m),
        ]
    };
    let r = hip("export", &["malloc:32768"], &env("alloc_op"));
    assert_eq!(r.rc("malloc:32768"), 0, "{}", r.stdout);
    assert_eq!(
        api_stats(&r.typed_report(), "hipHostMalloc").downgraded_count,
        1
    );
    let r = hip("export", &["malloc:32768"], &env("nowhere_in_this_stack"));
    assert_eq!(r.rc("malloc:32768"), 2, "{}", r.stdout);
    assert_eq!(
        api_stats(&r.typed_report(), "hipHostMalloc").denied_count,
        1
    );
    assert_eq!(r.stats()["hip"]["alloc_calls"], 0);
}

/// `warn`: everything goes through, counted over the budget, one warning per callsite.
#[test]
fn warn_policy_lets_hip_calls_through() {
    let ops = ["malloc:32768", "malloc:32768", "register:32768:0"];
    let r = hip(
        "export",
        &ops,
        &[("PINGUARD_BUDGET", "16K"), ("PINGUARD_POLICY", "warn")],
    );
    assert_eq!(r.rcs_of(&ops), vec![0, 0, 0], "{}", r.stdout);
    let s = r.stats();
    assert_eq!(s["hip"]["alloc_calls"], 3);
    assert_eq!(s["pinguard_live_bytes"], 3 * 32768);
    let rep = r.typed_report();
    assert_eq!(rep.totals.over_budget_count, 3);
    assert_eq!(
        api_stats(&rep, "hipHostMalloc").alloc_count,
        2,
        "{:?}",
        rep.apis
    );
    assert_eq!(api_stats(&rep, "hipHostRegister").alloc_count, 1);
    let warnings = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("over the budget"))
        .count();
    assert_eq!(warnings, 2, "two callsites: {}", r.stderr);
}

/// A host pool's reserve goes through the budget: a growth past it is refused with the runtime's
/// code; a device pool is never counted.
#[test]
fn host_pools_are_budgeted_and_device_pools_ignored() {
    for route in ROUTES {
        let ops = [
            "pool:2",
            "pool_alloc:0:1048576",
            "pool_alloc:0:3145728",
            "pool:1",
            "pool_alloc:2:1048576",
        ];
        let r = hip(route, &ops, &[("PINGUARD_BUDGET", "3M")]);
        assert_eq!(r.rcs_of(&ops), vec![0, 0, 2, 0, 0], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(
            s["pinguard_live_bytes"],
            2 * 1048576,
            "{route}: the host pool's one chunk: {s}"
        );
        let rep = r.typed_report();
        assert_eq!(rep.totals.denied_count, 1, "{route}");
        assert_eq!(
            api_stats(&rep, "hipMallocFromPoolAsync").denied_count,
            1,
            "{route}: {:?}",
            rep.apis
        );
    }
}

/// `PINGUARD_HOOKS` without `hip`: every route answers the runtime's own functions, untracked.
#[test]
fn hooks_without_hip_pass_through_untracked() {
    for route in ROUTES {
        let ops = ["malloc:8192", "register:8192:0", "vmm_create:8192:2"];
        let r = hip(
            route,
            &ops,
            &[
                ("PINGUARD_HOOKS", "cuda,cuda-driver,acl"),
                ("PINGUARD_BUDGET", "4K"),
            ],
        );
        assert_eq!(
            r.rcs_of(&ops),
            vec![0, 0, 0],
            "{route}: no budget applies: {}",
            r.stdout
        );
        let s = r.stats();
        assert_eq!(s["hip"]["alloc_calls"], 3, "{route}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{route}");
        let r = hip(
            route,
            &["malloc:8192"],
            &[("PINGUARD_HOOKS", "hip"), ("PINGUARD_BUDGET", "4K")],
        );
        assert_eq!(r.rc("malloc:8192"), 2, "{route}: hip alone is hooked");
    }
}

/// The real libamdhip64.so.5 (Debian's 5.2.3) beside pinguard, with no AMD device: pinguard finds
/// its functions and passes every call through; each answer is the runtime's own, the same as
/// without pinguard, and nothing is counted as pinned.
#[test]
fn the_real_library_answers_unchanged_under_pinguard() {
    let Some(real) = programs().1.clone() else {
        assert!(
            !real_expected() || std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "{REAL_LIB} is required here (.ci/run installs libamdhip64-5)"
        );
        eprintln!("SKIPPED: {REAL_LIB} is not installed (Debian's amd64 package libamdhip64-5); .ci/run installs it");
        return;
    };
    // The functions 5.2.3 has (hipExtHostAlloc and hipGetProcAddress it has not).
    let ops = [
        "malloc:8192",
        "alloc:4096:1",
        "mallochost:4096",
        "memallochost:4096",
        "register:8192:0",
        "free_raw:0",
        "unregister:4",
        "pool:1",
        "malloc:4096:256",
    ];
    for route in ["export", "dlsym"] {
        let dir = fresh_dir("hip-real");
        let bare = run_bounded(
            command_in(&real, &dir, false)
                .args(ops)
                .env("HIP_ROUTE", route),
            std::time::Duration::from_secs(60),
        );
        let under = run_bounded(
            command_in(&real, &dir, true)
                .args(ops)
                .env("HIP_ROUTE", route)
                .env("PINGUARD_BUDGET", "1G"),
            std::time::Duration::from_secs(60),
        );
        let (bare, under) = (
            Run::from_output(bare, dir.clone()),
            Run::from_output(under, dir.clone()),
        );
        assert!(
            bare.success() && under.success(),
            "{route}: {}\n{}\n{}",
            bare.stdout,
            under.stdout,
            under.stderr
        );
        let answers = |r: &Run| r.rcs_of(&ops);
        assert!(
            answers(&bare).iter().all(|&rc| rc > 0),
            "{route}: without a device the runtime refuses: {}",
            bare.stdout
        );
        assert_eq!(
            answers(&under),
            answers(&bare),
            "{route}: pinguard changed the runtime's answers:\n{}\n{}",
            bare.stdout,
            under.stdout
        );
        assert_eq!(under.stats()["pinguard_live_bytes"], 0, "{route}");
        let rep = under.typed_report();
        let failed: u64 = [
            "hipHostMalloc",
            "hipHostAlloc",
            "hipMallocHost",
            "hipMemAllocHost",
            "hipHostRegister",
        ]
        .iter()
        .map(|a| api_stats(&rep, a).failed_count)
        .sum();
        assert_eq!(
            failed, 6,
            "{route}: each allocation reached the real runtime and failed there: {:?}",
            rep.apis
        );
        assert_eq!(
            rep.totals.denied_count, 0,
            "{route}: the budget never answered for the runtime"
        );

        // 5.2.3's hipMemCreate takes device locations only: over a small budget, whatever the
        // prop's bytes, its answers are its own.
        let vmm = [
            "vmm_create_old:65536:2",
            "vmm_create:65536:2",
            "vmm_create:65536:1",
        ];
        let bare = run_bounded(
            command_in(&real, &dir, false)
                .args(vmm)
                .env("HIP_ROUTE", route),
            std::time::Duration::from_secs(60),
        );
        let under = run_bounded(
            command_in(&real, &dir, true)
                .args(vmm)
                .env("HIP_ROUTE", route)
                .env("PINGUARD_BUDGET", "16K"),
            std::time::Duration::from_secs(60),
        );
        let (bare, under) = (
            Run::from_output(bare, dir.clone()),
            Run::from_output(under, dir.clone()),
        );
        assert!(
            bare.success() && under.success(),
            "{route}: {}\n{}\n{}",
            bare.stdout,
            under.stdout,
            under.stderr
        );
        assert_eq!(
            under.rcs_of(&vmm),
            bare.rcs_of(&vmm),
            "{route}: hipMemCreate's answers changed:\n{}\n{}",
            bare.stdout,
            under.stdout
        );
        assert!(
            under.stderr.contains("; 0 denied"),
            "{route}: the budget never answered: {}",
            under.stderr
        );
    }
}

/// `pinguard doctor --probe` pins through `hipHostMalloc` where a HIP runtime loads, and says what
/// the real one answers without a device.
#[test]
fn doctor_probes_hip_host_malloc() {
    let emu = programs().0.parent().unwrap().join("emu");
    let doctor = |lib_path: Option<&std::path::Path>| {
        let mut cmd = std::process::Command::new(cli());
        cmd.args(["doctor", "--probe", "--probe-size", "1Mi", "--json"]);
        clear_pinguard_env(&mut cmd);
        cmd.env_remove("LD_PRELOAD");
        match lib_path {
            Some(p) => cmd.env("LD_LIBRARY_PATH", p),
            None => cmd.env_remove("LD_LIBRARY_PATH"),
        };
        let o = cmd.output().unwrap();
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
        v["probes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["path"] == "hipHostMalloc")
            .cloned()
            .unwrap_or_else(|| panic!("no hipHostMalloc probe: {v}"))
    };
    let p = doctor(Some(&emu));
    assert!(p["note"].is_null(), "the emulated runtime pins: {p}");
    assert_eq!(p["bytes"], 1 << 20);
    // /dev/kfd: an AMD device's compute interface, where the real runtime would pin.
    if programs().1.is_some() && !std::path::Path::new("/dev/kfd").exists() {
        let p = doctor(None);
        let note = p["note"].as_str().unwrap_or_default();
        assert!(
            note.starts_with("could not pin: hipHostMalloc returned hipErrorInvalidDevice (101)")
                && note.contains("hipGetDeviceCount: hipErrorNoDevice (100)"),
            "no device, said by name: {note}"
        );
    }
}

/// The group budget and the host reserve hold HIP's calls as CUDA's: refused with
/// hipErrorOutOfMemory, the runtime never called, counted under the limit that stopped them.
#[test]
fn group_budget_and_host_reserve_refuse_hip_calls() {
    let group = format!("test-hip-{}", std::process::id());
    let ledger = pinguard_common::group::path(&group);
    let _ = std::fs::remove_file(&ledger);
    let ops = ["malloc:8192", "malloc:65536", "register:65536:0"];
    let r = hip(
        "export",
        &ops,
        &[
            ("PINGUARD_GROUP", &group),
            ("PINGUARD_GROUP_BUDGET", "16K"),
            ("PINGUARD_BUDGET", "1M"),
        ],
    );
    remove_semaphores(&ledger);
    let _ = std::fs::remove_file(&ledger);
    assert_eq!(r.rcs_of(&ops), vec![0, 2, 2], "{}", r.stdout);
    assert_eq!(r.stats()["hip"]["alloc_calls"], 1);
    let rep = r.typed_report();
    assert!(rep.group.is_some(), "{rep:?}");
    assert_eq!(api_stats(&rep, "hipHostMalloc").denied_count, 1);
    assert_eq!(api_stats(&rep, "hipHostRegister").denied_count, 1);

    // A reserve of all the host's memory: nothing may be pinned.
    let r = hip(
        "dlsym",
        &["malloc:8192"],
        &[("PINGUARD_HOST_RESERVE", "100%")],
    );
    assert_eq!(r.rc("malloc:8192"), 2, "{}", r.stdout);
    assert_eq!(r.stats()["hip"]["alloc_calls"], 0);
    let t = r.typed_report().totals;
    assert_eq!(t.host_reserve_count, 1, "{t:?}");
}

/// A Python program reaching HIP through ctypes (`dlsym(handle)`): its callsite names the Python
/// function that pinned, as CUDA's do.
#[test]
fn python_callsites_name_the_function_calling_hip() {
    if !have("/usr/bin/python3", "the Python frames of a HIP callsite") {
        return;
    }
    let lib = programs().0.parent().unwrap().join("emu/libamdhip64.so.5");
    let script = r#"import ctypes, sys
hip = ctypes.CDLL(sys.argv[1])
def pin_staging_buffer():
    p = ctypes.c_void_p()
    rc = hip.hipHostMalloc(ctypes.byref(p), ctypes.c_size_t(8192), 0)
    print('rc=%d' % rc)
pin_staging_buffer()
"#;
    let r = run(
        "/usr/bin/python3",
        &["-c", script, lib.to_str().unwrap()],
        &[],
    );
    assert!(
        r.success() && r.stdout.contains("rc=0"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    let rep = r.typed_report();
    let site = rep
        .callsites
        .iter()
        .find(|c| c.apis.iter().any(|a| a == "hipHostMalloc"))
        .unwrap_or_else(|| panic!("no hipHostMalloc callsite: {rep:?}"));
    let first = site.py_frames.first();
    assert_eq!(
        first.and_then(|f| f.symbol.as_deref()),
        Some("pin_staging_buffer"),
        "{site:?}"
    );
}

/// Every row of HIP's table, looked up with `dlsym(handle, name)` in the emulated runtime, lands in
/// pinguard with pinguard preloaded and in the runtime without.
#[test]
fn every_hip_row_is_redirected_through_a_handle() {
    let f = fixtures();
    let exe = fixture_set("dlsym_table").join("dlsym_table");
    let out = std::process::Command::new("python3")
        .arg(root().join("scripts/exports.py"))
        .arg("--families")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = String::from_utf8(out.stdout).unwrap();
    let names: Vec<&str> = rows
        .lines()
        .filter_map(|l| l.strip_prefix("hip "))
        .collect();
    assert_eq!(names.len(), 23, "{names:?}");
    let runtime = programs().0.parent().unwrap().join("emu/libamdhip64.so.5");
    let lib_name = wrappers_file_name();
    for (preload, holder) in [
        (Some(f.lib.as_os_str()), lib_name.as_str()),
        (None, "libamdhip64.so.5"),
    ] {
        let out = program(&exe, preload)
            .arg(&runtime)
            .args(&names)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answers: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once(' ')).collect();
        assert_eq!(answers.iter().map(|a| a.0).collect::<Vec<_>>(), names);
        for (name, found) in answers {
            assert_eq!(
                found,
                holder,
                "dlsym(handle, {name}) with pinguard {}",
                preload.is_some()
            );
        }
    }
}

/// The virtual-memory API at ROCm 7's host locations (host 2, host NUMA 3): physical memory
/// counted from `hipMemCreate` until both `hipMemRelease` and `hipMemUnmap`, as `cuMemCreate`'s;
/// device-located memory (1) and a location the runtime rejects (9) pass through uncounted.
/// Through each route, the callsite names `hipMemCreate` (an entry point past the 64th).
#[test]
fn host_located_virtual_memory_is_counted_until_released_and_unmapped() {
    let ops = [
        "vmm_create:65536:2",
        "vmm_create:65536:1",
        "vmm_create:65536:3",
        "vmm_reserve:65536",
        "vmm_map:3:0",
        "touch:3",
        "vmm_release:0",
        "vmm_release:2",
        "vmm_release:1",
        "vmm_create:65536:9",
    ];
    for route in ROUTES {
        let r = hip(route, &ops, &[]);
        assert_eq!(
            r.rcs_of(&ops),
            vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            "{route}: {}",
            r.stdout
        );
        let s = r.stats();
        assert_eq!(
            s["hip"]["outstanding_bytes"], 65536,
            "{route}: released but still mapped: {s}"
        );
        assert_eq!(
            s["pinguard_live_bytes"], 65536,
            "{route}: counted until unmapped too: {s}"
        );
        let rep = r.typed_report();
        assert_eq!(
            api_stats(&rep, "hipMemCreate").alloc_count,
            2,
            "{route}: the two host ones: {:?}",
            rep.apis
        );
        assert_eq!(api_stats(&rep, "hipMemCreate").live_bytes, 65536, "{route}");
        let sites = &rep.callsites;
        assert!(
            sites
                .iter()
                .any(|c| c.apis.iter().any(|a| a == "hipMemCreate")),
            "{route}: {sites:?}"
        );

        let all: Vec<&str> = ops.iter().copied().chain(["vmm_unmap:3"]).collect();
        let r = hip(route, &all, &[]);
        assert_eq!(r.rc("vmm_unmap:3"), 0, "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(
            (
                s["hip"]["outstanding_bytes"].as_i64(),
                s["pinguard_live_bytes"].as_i64()
            ),
            (Some(0), Some(0)),
            "{route}: {s}"
        );
        let t = r.typed_report().totals;
        assert_eq!(t.live_bytes, 0, "{route}: {t:?}");
        assert_eq!(t.unknown_release_count, 0, "{route}");
    }
}

/// A handle retained from the mapped address holds the memory after the creating handle is
/// released and the range unmapped: counted until that handle is released too.
#[test]
fn a_retained_hip_handle_keeps_the_memory_counted() {
    let ops = [
        "vmm_create:65536:2",
        "vmm_reserve:65536",
        "vmm_map:1:0",
        "vmm_retain:1",
        "vmm_release:0",
        "vmm_unmap:1",
    ];
    for route in ROUTES {
        let r = hip(route, &ops, &[]);
        assert_eq!(r.rcs_of(&ops), vec![0; 6], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(
            (
                s["hip"]["outstanding_bytes"].as_i64(),
                s["pinguard_live_bytes"].as_i64()
            ),
            (Some(65536), Some(65536)),
            "{route}: {s}"
        );
        let all: Vec<&str> = ops.iter().copied().chain(["vmm_release:2"]).collect();
        let r = hip(route, &all, &[]);
        assert_eq!(r.rc("vmm_release:2"), 0, "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(
            (
                s["hip"]["outstanding_bytes"].as_i64(),
                s["pinguard_live_bytes"].as_i64()
            ),
            (Some(0), Some(0)),
            "{route}: {s}"
        );
    }
}

/// Over the budget, a host-located `hipMemCreate` is refused with hipErrorOutOfMemory under
/// `error` and under `downgrade` alike (the device maps physical memory: pageable memory cannot
/// stand in for it), the runtime never called; device-located ones and what fits go through, and
/// a location the runtime rejects gets its answer.
#[test]
fn error_and_downgrade_refuse_host_located_hip_mem_create() {
    let ops = [
        "vmm_create:65536:2",
        "vmm_create:65536:4",
        "vmm_create:65536:1",
        "vmm_create:8192:2",
        "vmm_create:65536:9",
    ];
    for policy in ["error", "downgrade"] {
        for route in ROUTES {
            let r = hip(
                route,
                &ops,
                &[("PINGUARD_BUDGET", "16K"), ("PINGUARD_POLICY", policy)],
            );
            assert_eq!(
                r.rcs_of(&ops),
                vec![2, 2, 0, 0, 1],
                "{policy} {route}: {}",
                r.stdout
            );
            let s = r.stats();
            assert_eq!(
                s["hip"]["failed_calls"], 1,
                "{policy} {route}: only the bad location reached the runtime and failed: {s}"
            );
            assert_eq!(s["pinguard_live_bytes"], 8192, "{policy} {route}: {s}");
            let rep = r.typed_report();
            assert_eq!(
                api_stats(&rep, "hipMemCreate").denied_count,
                2,
                "{policy} {route}: {:?}",
                rep.apis
            );
            assert_eq!(rep.totals.downgraded_count, 0, "{policy} {route}");
            let denied: Vec<&str> = rep
                .events
                .iter()
                .filter(|e| e.kind == EventKind::Denied)
                .map(|e| e.api.as_str())
                .collect();
            assert_eq!(denied, ["hipMemCreate", "hipMemCreate"], "{policy} {route}");
        }
    }
}

/// `warn`: a host-located `hipMemCreate` over the budget goes through, counted over the budget.
#[test]
fn warn_policy_lets_hip_mem_create_through() {
    for route in ROUTES {
        let ops = ["vmm_create:65536:2"];
        let r = hip(
            route,
            &ops,
            &[("PINGUARD_BUDGET", "16K"), ("PINGUARD_POLICY", "warn")],
        );
        assert_eq!(r.rcs_of(&ops), vec![0], "{route}: {}", r.stdout);
        assert_eq!(r.stats()["pinguard_live_bytes"], 65536, "{route}");
        let rep = r.typed_report();
        assert_eq!(rep.totals.over_budget_count, 1, "{route}");
        assert_eq!(api_stats(&rep, "hipMemCreate").alloc_count, 1, "{route}");
    }
}

/// A running process's state file names `hipMemCreate` at its callsite: the entry point's bit is
/// past the 64th, in the second word of the state's per-callsite bits.
#[test]
fn the_state_file_names_hip_mem_create_at_its_callsite() {
    use std::io::BufRead;
    use std::process::Stdio;
    let dir = fresh_dir("hip_vmm_state");
    let mut child = program(&programs().0, Some(fixtures().lib.as_os_str()))
        .args(["vmm_create:65536:2", "hold:0"])
        .current_dir(&dir)
        .env("PINGUARD_REPORT", dir.join("report.%p.json"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.as_mut().unwrap());
    let mut line = String::new();
    while line.trim() != "ready" {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the program ended before holding"
        );
    }
    let o = pinguard_cli(&["report".as_ref(), "--json".as_ref(), dir.as_os_str()]);
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // JSON: `pinguard report --json`'s merged view of the state file, not a report.
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["per_process"][0]["reason"], "running", "{v}");
    let sites = v["callsites"].as_array().unwrap();
    let site = sites
        .iter()
        .find(|c| c["live_bytes"] == 65536)
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(site["apis"], serde_json::json!(["hipMemCreate"]), "{site}");
}

/// Before ROCm 6, `hipMemAllocationProp` had another layout (5.2.3's: `compressionType` first,
/// `location` at byte 4) and only device locations: whatever its bytes 0 and 8 hold, a
/// `hipMemCreate` of a runtime older than 7 passes through uncounted, even over the budget.
#[test]
fn hip_mem_create_of_older_runtimes_passes_through() {
    let ops = [
        "vmm_create_old:65536:2",
        "vmm_create_old:65536:3",
        "vmm_release:0",
        "vmm_release:1",
    ];
    for route in ROUTES {
        let r = hip(
            route,
            &ops,
            &[("PINGUARD_BUDGET", "16K"), ("EMU_HIP_VERSION", "50221153")],
        );
        assert_eq!(r.rcs_of(&ops), vec![0, 0, 0, 0], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(
            (
                s["pinguard_live_bytes"].as_i64(),
                s["hip"]["failed_calls"].as_i64()
            ),
            (Some(0), Some(0)),
            "{route}: {s}"
        );
        assert!(
            reports_in(&r.report_dir).is_empty(),
            "{route}: nothing tracked, nothing to report"
        );
    }
}

/// `RLIMIT_MEMLOCK`'s soft limit of this process (its children inherit it); `None`: unlimited.
fn rlimit_memlock() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-pointer.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) }, 0);
    (r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// issue 46, item 13: a refused call and a failed one say why in their events and in the exit
/// line: the size, the API's answer, the budget, `RLIMIT_MEMLOCK` and whether `CAP_IPC_LOCK`
/// lifts it, `VmLck`, `VmPin` and the cgroup's headroom.
#[test]
fn a_refused_or_failed_call_says_why_in_its_event_and_the_exit_line() {
    let ops = ["malloc:32768", "malloc:8192"];
    let r = hip("export", &ops, &[("PINGUARD_BUDGET", "16K")]);
    assert_eq!(r.rcs_of(&ops), vec![2, 0], "{}", r.stdout);
    let rep = r.typed_report();
    let e = rep.events.first().unwrap_or_else(|| panic!("{rep:?}"));
    assert_eq!(e.kind, EventKind::Denied, "{e:?}");
    let why = e.why.as_ref().unwrap_or_else(|| panic!("no why: {e:?}"));
    assert_eq!(why.error, "hipErrorOutOfMemory (2)", "{e:?}");
    assert_eq!(why.budget_bytes, Some(16384), "{e:?}");
    assert_eq!(why.rlimit_memlock_bytes, rlimit_memlock(), "{e:?}");
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(why.cap_ipc_lock, cap_eff & (1 << 14) != 0, "{e:?}");
    assert!(
        why.vm_lck_bytes.is_some() && why.vm_pin_bytes.is_some(),
        "{e:?}"
    );
    // JSON: the key is written even when null, which a typed read cannot tell from absent.
    let raw = read_json(&reports_in(&r.report_dir)[0]);
    assert!(
        raw["events"][0]["why"]
            .get("cgroup_headroom_bytes")
            .is_some(),
        "{raw}"
    );
    let exit = pinguard_lines(&r.stderr)
        .into_iter()
        .find(|l| l.contains(" at exit "))
        .unwrap_or_else(|| panic!("{}", r.stderr));
    assert!(
        exit.contains("; last refused: hipHostMalloc of 32.0 KiB (32768 bytes): hipErrorOutOfMemory (2); budget 16.0 KiB, RLIMIT_MEMLOCK ")
            && exit.contains(", VmLck ")
            && exit.contains(", VmPin ")
            && exit.contains(", cgroup headroom ")
            && exit.contains("; report: "),
        "{exit}"
    );

    // The runtime fails the call itself: its code, named, and no budget.
    let r = hip("export", &["malloc:8192"], &[("EMU_FAIL_EVERY", "1")]);
    assert_eq!(r.rcs_of(&["malloc:8192"]), vec![2], "{}", r.stdout);
    let rep = r.typed_report();
    assert_eq!(rep.totals.failed_count, 1);
    let e = rep.events.first().unwrap_or_else(|| panic!("{rep:?}"));
    assert_eq!(e.kind, EventKind::Failed, "{e:?}");
    assert_eq!(e.size, 8192, "{e:?}");
    assert!(e.reason.is_none(), "{e:?}");
    let why = e.why.as_ref().unwrap_or_else(|| panic!("no why: {e:?}"));
    assert_eq!(why.error, "hipErrorOutOfMemory (2)", "{e:?}");
    assert_eq!(why.budget_bytes, None, "{e:?}");
    let exit = pinguard_lines(&r.stderr)
        .into_iter()
        .find(|l| l.contains(" at exit "))
        .unwrap_or_else(|| panic!("{}", r.stderr));
    assert!(
        exit.contains("; last failed: hipHostMalloc of 8.00 KiB (8192 bytes): hipErrorOutOfMemory (2); budget none, RLIMIT_MEMLOCK "),
        "{exit}"
    );
}

/// Issue 46 item 13: an allocation from a host pool that the runtime fails, and a physical host
/// allocation it fails, have events that say why: `hipErrorOutOfMemory (2)` and the room.
#[test]
fn a_failed_pool_or_physical_allocation_says_why() {
    let ops = ["pool:2", "pool_alloc:0:1048576"];
    let r = hip("export", &ops, &[("EMU_FAIL_EVERY", "1")]);
    assert_eq!(r.rcs_of(&ops), vec![0, 2], "{}", r.stdout);
    let rep = r.typed_report();
    let e = failed_event_of(&rep, "hipMallocFromPoolAsync");
    assert_eq!(e.size, 1048576, "{e:?}");
    assert_why_of(e, "hipErrorOutOfMemory (2)");
    let ops = ["vmm_create:8192:2"];
    let r = hip("export", &ops, &[("EMU_FAIL_EVERY", "1")]);
    assert_eq!(r.rcs_of(&ops), vec![2], "{}", r.stdout);
    let rep = r.typed_report();
    let e = failed_event_of(&rep, "hipMemCreate");
    assert_eq!(e.size, 8192, "{e:?}");
    assert_why_of(e, "hipErrorOutOfMemory (2)");
}
