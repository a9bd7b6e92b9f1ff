//! Memory that is not pinned RAM, and RAM that is device memory (issue 45 items 5 and 6), through
//! the CUDA runtime, the CUDA driver and HIP, against the emulated runtimes' own counts:
//!
//! - a registration of I/O memory (`cudaHostRegisterIoMemory`, `CU_MEMHOSTREGISTER_IOMEMORY`,
//!   `hipHostRegisterIoMemory`: a NIC's doorbells) passes through whatever the policy and budget,
//!   counts no bytes, and is listed in the report under its own name;
//! - on a device that says it is integrated (`EMU_INTEGRATED`), device allocations count as host
//!   bytes against the budget and the host reserve (`PINGUARD_DEVICE_MEMORY=auto`, the default);
//!   on a discrete one nothing changes; `host` and `device` force either answer.

use crate::common;
use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

const APIS: [&str; 3] = ["cuda", "driver", "hip"];
/// `cudaErrorMemoryAllocation`, `CUDA_ERROR_OUT_OF_MEMORY`, `hipErrorOutOfMemory`: all 2.
const OOM: i64 = 2;
/// `cudaErrorInvalidValue`, `CUDA_ERROR_INVALID_VALUE`, `hipErrorInvalidValue`: all 1.
const INVALID: i64 = 1;
/// `cudaHostRegisterIoMemory` = `CU_MEMHOSTREGISTER_IOMEMORY` = `hipHostRegisterIoMemory`.
const IO_MEMORY: u32 = 0x4;
/// The `Mapped`/`DEVICEMAP` flag: a registration pageable memory cannot stand in for.
const MAPPED: u32 = 0x2;

/// The test program, linked with the three emulated runtimes (`tests/fixtures.txt`, set
/// `device_memory`, with a library of no use but to be loaded and unloaded).
fn program() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| fixture_set("device_memory").join("device_memory/device_memory"))
}

fn dm(api: &str, ops: &[&str], env: &[(&str, &str)]) -> Run {
    let mut env = env.to_vec();
    env.push(("DM_API", api));
    let r = run(&program().to_string_lossy(), ops, &env);
    assert!(r.success(), "{api}: {}\n{}", r.stdout, r.stderr);
    r
}

/// The names each API's entry points are reported under.
fn names(api: &str) -> (&'static str, &'static str, &'static str) {
    match api {
        "cuda" => (
            "cudaHostRegister(IoMemory)",
            "cudaMalloc",
            "cudaMallocManaged",
        ),
        "driver" => (
            "cuMemHostRegister(IOMEMORY)",
            "cuMemAlloc_v2",
            "cuMemAllocManaged",
        ),
        _ => ("hipHostRegister(IoMemory)", "hipMalloc", "hipMallocManaged"),
    }
}

/// The routes each API offers: the exports, and the runtime's own look-up where it has one.
fn routes(api: &str) -> &'static [&'static str] {
    match api {
        "cuda" => &["export"],
        _ => &["export", "proc"],
    }
}

fn site_apis(rep: &Report) -> Vec<String> {
    rep.callsites
        .iter()
        .flat_map(|c| c.apis.iter().cloned())
        .collect()
}

/// An I/O-memory registration (a NIC's doorbells) is the runtime's own call under `error` and
/// `downgrade` with a zero budget: it passes, counts 0 bytes, is listed in the report under its
/// own name with its callsite, and its unregistration finds it; a registration of RAM beside it
/// is refused as before.
#[test]
fn io_memory_registrations_pass_through_and_count_nothing() {
    let io = format!("register:65536:{IO_MEMORY}");
    let io_mapped = format!("register:8192:{}", IO_MEMORY | MAPPED);
    let ram = format!("register:8192:{MAPPED}");
    for api in APIS {
        let (io_name, _, _) = names(api);
        for route in routes(api) {
            for policy in ["error", "downgrade"] {
                let ops = [
                    io.as_str(),
                    io_mapped.as_str(),
                    ram.as_str(),
                    "unregister:0",
                ];
                let env = [
                    ("PINGUARD_BUDGET", "0"),
                    ("PINGUARD_POLICY", policy),
                    ("DM_ROUTE", route),
                ];
                let r = dm(api, &ops, &env);
                let what = format!("{api} {route} {policy}");
                assert_eq!(r.rcs(), vec![0, 0, OOM, 0], "{what}: {}", r.stdout);
                let s = r.stats();
                assert_eq!(s["device"]["io_registrations"], 1, "{what}: {s}");
                assert_eq!(s["emu"]["alloc_calls"], 0, "{what}: nothing pinned: {s}");
                assert_eq!(s["emu"]["failed_calls"], 0, "{what}: {s}");
                assert_eq!(s["pinguard_live_bytes"], 0, "{what}: {s}");
                let rep = r.typed_report();
                let a = rep
                    .apis
                    .get(io_name)
                    .unwrap_or_else(|| panic!("{what}: no {io_name}: {:?}", rep.apis));
                assert_eq!(a.alloc_count, 2, "{what}: {:?}", rep.apis);
                assert_eq!(a.live_count, 1, "{what}: {a:?}");
                assert_eq!(a.live_bytes, 0, "{what}: {a:?}");
                let t = &rep.totals;
                assert_eq!(t.denied_count, 1, "{what}: {t:?}");
                assert_eq!(t.downgraded_count, 0, "{what}: {t:?}");
                assert_eq!(t.unknown_release_count, 0, "{what}: {t:?}");
                assert!(
                    site_apis(&rep).iter().any(|n| n == io_name),
                    "{what}: no callsite lists {io_name}: {:?}",
                    rep.callsites
                );
            }
        }
    }
}

/// On an integrated device, device allocations are host bytes: counted with their callsites,
/// refused over the budget with the runtime's own out-of-memory code (the runtime not called),
/// released by their free; arguments the runtime rejects get its answer. The device is asked
/// once, through the program's own API, however many allocations follow.
#[test]
fn an_integrated_devices_allocations_count_against_the_budget() {
    for api in APIS {
        let (_, malloc, managed) = names(api);
        for route in routes(api) {
            let ops = [
                "malloc:524288",
                "managed:262144:1",
                "malloc:524288",
                "managed:4096:4",
                "malloc:65536",
                "free:0",
                "free:4",
                "free_null:0",
            ];
            let env = [
                ("PINGUARD_BUDGET", "1M"),
                ("EMU_INTEGRATED", "1"),
                ("DM_ROUTE", route),
            ];
            let r = dm(api, &ops, &env);
            let what = format!("{api} {route}");
            // `cudaFree(NULL)` and `hipFree(NULL)` do nothing; the driver rejects a null pointer.
            let null = if api == "driver" { INVALID } else { 0 };
            assert_eq!(
                r.rcs(),
                vec![0, 0, OOM, INVALID, 0, 0, 0, null],
                "{what}: {}",
                r.stdout
            );
            let s = r.stats();
            assert_eq!(s["device"]["outstanding_bytes"], 262144, "{what}: {s}");
            assert_eq!(
                s["device"]["allocs"], 3,
                "{what}: refused, never reached: {s}"
            );
            assert_eq!(s["pinguard_live_bytes"], 262144, "{what}: {s}");
            assert_eq!(s["device"]["integrated_queries"], 1, "{what}: {s}");
            let rep = r.typed_report();
            let api = |name: &str| {
                rep.apis
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| panic!("{what}: no {name}: {:?}", rep.apis))
            };
            assert_eq!(api(malloc).alloc_count, 2, "{what}: {:?}", rep.apis);
            assert_eq!(api(malloc).live_bytes, 0, "{what}");
            assert_eq!(api(managed).live_bytes, 262144, "{what}");
            let t = &rep.totals;
            assert_eq!(t.denied_count, 1, "{what}: {t:?}");
            assert_eq!(t.release_count, 2, "{what}: {t:?}");
            assert_eq!(t.unknown_release_count, 0, "{what}: {t:?}");
            assert!(
                site_apis(&rep).iter().any(|n| n == malloc),
                "{what}: {:?}",
                rep.callsites
            );
        }
    }
}

/// On a discrete device nothing changes: every allocation is the runtime's, nothing is counted,
/// no report is written (nothing was tracked), and the device is asked once.
#[test]
fn a_discrete_devices_allocations_are_untouched() {
    for api in APIS {
        for route in routes(api) {
            let ops = [
                "malloc:4194304",
                "managed:4194304:1",
                "malloc:4096",
                "free:0",
                "free:1",
                "free:2",
            ];
            let env = [("PINGUARD_BUDGET", "1M"), ("DM_ROUTE", route)];
            let r = dm(api, &ops, &env);
            let what = format!("{api} {route}");
            assert_eq!(r.rcs(), vec![0; 6], "{what}: {}", r.stdout);
            let s = r.stats();
            assert_eq!(s["device"]["allocs"], 3, "{what}: {s}");
            assert_eq!(s["device"]["frees"], 3, "{what}: {s}");
            assert_eq!(s["pinguard_live_bytes"], 0, "{what}: {s}");
            assert_eq!(s["device"]["integrated_queries"], 1, "{what}: {s}");
            assert!(
                reports_in(&r.report_dir).is_empty(),
                "{what}: {:?}\n{}",
                reports_in(&r.report_dir),
                r.stderr
            );
        }
    }
}

/// `PINGUARD_DEVICE_MEMORY`: `host` counts a discrete device's allocations, `device` never counts
/// (and never asks), `auto` asks; a bad value says so in one line and falls back to `auto`.
#[test]
fn the_device_memory_setting_decides_and_a_bad_value_falls_back_to_auto() {
    let ops = ["malloc:524288", "malloc:786432", "free:0"];
    for api in APIS {
        // (setting, integrated, the second allocation's answer, live bytes, questions asked)
        let cases = [
            ("host", false, OOM, 0, 0),
            ("device", true, 0, 786432, 0),
            ("auto", true, OOM, 0, 1),
            ("AUTO", false, 0, 786432, 1),
            ("sometimes", true, OOM, 0, 1),
        ];
        for (mode, integrated, second, live, asked) in cases {
            let mut env = vec![("PINGUARD_BUDGET", "1M"), ("PINGUARD_DEVICE_MEMORY", mode)];
            if integrated {
                env.push(("EMU_INTEGRATED", "1"));
            }
            let r = dm(api, &ops, &env);
            let what = format!("{api} {mode}");
            assert_eq!(r.rcs(), vec![0, second, 0], "{what}: {}", r.stdout);
            let s = r.stats();
            assert_eq!(s["device"]["outstanding_bytes"], live, "{what}: {s}");
            assert_eq!(s["device"]["integrated_queries"], asked, "{what}: {s}");
            let lines = pinguard_lines(&r.stderr);
            let bad: Vec<_> = lines
                .iter()
                .filter(|l| l.contains("PINGUARD_DEVICE_MEMORY"))
                .collect();
            if mode == "sometimes" {
                assert_eq!(bad.len(), 1, "{what}: {}", r.stderr);
                assert!(
                    bad[0].contains("sometimes") && bad[0].contains("using auto"),
                    "{what}: {}",
                    bad[0]
                );
                let rep = r.typed_report();
                let errors = rep.config.errors.join("\n");
                assert!(
                    errors.contains("PINGUARD_DEVICE_MEMORY"),
                    "{what}: {errors}"
                );
            } else {
                assert!(bad.is_empty(), "{what}: {}", r.stderr);
            }
        }
    }
}

/// Some devices integrated, others not: the current device decides, each allocation.
#[test]
fn with_devices_of_both_kinds_the_current_one_decides() {
    for api in ["cuda", "hip"] {
        let ops = [
            "malloc:786432",
            "set_device:1",
            "malloc:524288",
            "malloc:786432",
            "set_device:0",
            "free:0",
            "malloc:786432",
        ];
        // Device 1 of 2 integrated.
        let env = [
            ("PINGUARD_BUDGET", "1M"),
            ("EMU_DEVICES", "2"),
            ("EMU_INTEGRATED", "2"),
        ];
        let r = dm(api, &ops, &env);
        assert_eq!(r.rcs(), vec![0, 0, 0, OOM, 0, 0, 0], "{api}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(s["pinguard_live_bytes"], 524288, "{api}: {s}");
        assert_eq!(
            s["device"]["integrated_queries"], 2,
            "{api}: one per device: {s}"
        );
    }
}

/// A fork child asks its device again (the answer is forgotten with the parent's other state).
#[test]
fn a_fork_child_asks_again() {
    let ops = ["malloc:4096", "fork:0", "malloc:4096"];
    let r = dm("cuda", &ops, &[("EMU_INTEGRATED", "1")]);
    let child = r.stats();
    assert_eq!(
        child["device"]["integrated_queries"], 2,
        "{child}\n{}",
        r.stdout
    );
    assert_eq!(child["pinguard_live_bytes"], 4096, "{child}");
}

/// An object unloaded (`dlclose`) makes every runtime API's answer forgotten: another runtime may
/// be loaded in the place of one that went; the next allocation asks again.
#[test]
fn an_unload_makes_the_device_be_asked_again() {
    let plugin = program().parent().unwrap().join("emu/plugin.so");
    let plugin = plugin.to_string_lossy();
    let ops = ["malloc:4096", "malloc:4096", "unload:0", "malloc:4096"];
    let env = [("EMU_INTEGRATED", "1"), ("DM_PLUGIN", &*plugin)];
    let r = dm("cuda", &ops, &env);
    assert_eq!(r.rcs(), vec![0; 4], "{}", r.stdout);
    let s = r.stats();
    assert_eq!(s["device"]["integrated_queries"], 2, "{s}");
    assert_eq!(s["pinguard_live_bytes"], 3 * 4096, "{s}");
}

/// Whether this machine lets a test bind a file over `/proc/meminfo` in a private mount
/// namespace (root, `unshare -m`); says NOT RUN when it does not.
fn can_fake_meminfo() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    let ok = unsafe { libc::geteuid() } == 0
        && Command::new("unshare")
            .args(["-m", "--", "true"])
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("NOT RUN: needs root and unshare -m");
    }
    ok
}

/// An integrated device's allocation that would take the host's available memory below
/// `PINGUARD_HOST_RESERVE` is refused with the runtime's own code: the emulated device takes its
/// memory from a stand-in `/proc/meminfo` (1 GiB, `EMU_MEMINFO`), as an integrated GPU takes the
/// host's; a discrete device's allocation of the same size passes.
#[test]
fn an_integrated_devices_allocation_is_refused_at_the_host_floor() {
    if !can_fake_meminfo() {
        return;
    }
    const BASE_KB: u64 = 1 << 20;
    let base = BASE_KB << 10;
    // 4 MiB of headroom above the floor.
    let reserve = (base - (4 << 20)).to_string();
    let ops = [
        "malloc:3145728",
        "malloc:2097152",
        "free:0",
        "malloc:2097152",
    ];
    for api in APIS {
        for integrated in [true, false] {
            let dir = fresh_dir("device-floor");
            let meminfo = dir.join("meminfo");
            std::fs::write(
                &meminfo,
                format!("MemTotal:       {BASE_KB:>12} kB\nMemFree:        {BASE_KB:>12} kB\nMemAvailable:   {BASE_KB:>12} kB\n"),
            )
            .unwrap();
            let f = fixtures();
            // Only the program gets the library: not unshare, sh or mount.
            let inner = if aarch64() {
                common::program(program(), Some(f.lib.as_os_str()))
            } else {
                let mut c = Command::new("env");
                let mut preload = std::ffi::OsString::from("LD_PRELOAD=");
                preload.push(&f.lib);
                c.arg(preload).arg(program());
                c
            };
            let mut cmd = Command::new("unshare");
            cmd.args([
                "-m",
                "--",
                "sh",
                "-c",
                r#"mount --bind "$0" /proc/meminfo && exec "$@""#,
            ])
            .arg(&meminfo)
            .arg(inner.get_program())
            .args(inner.get_args())
            .args(ops)
            .current_dir(&dir);
            clear_pinguard_env(&mut cmd);
            cmd.env_remove("LD_PRELOAD")
                .env("PINGUARD_REPORT", dir.join("report.%p.json"))
                .env("PINGUARD_HOST_RESERVE", &reserve)
                .env("EMU_MEMINFO", &meminfo)
                .env("EMU_MEMINFO_BASE_KB", BASE_KB.to_string())
                .env("DM_API", api);
            if integrated {
                cmd.env("EMU_INTEGRATED", "1");
            }
            let out = run_bounded(&mut cmd, std::time::Duration::from_secs(60));
            let r = Run::from_output(out, dir.clone());
            let what = format!("{api} integrated={integrated}");
            assert!(r.success(), "{what}: {}\n{}", r.stdout, r.stderr);
            if integrated {
                assert_eq!(r.rcs(), vec![0, OOM, 0, 0], "{what}: {}", r.stdout);
                let t = r.typed_report().totals;
                assert_eq!(t.host_reserve_count, 1, "{what}: {t:?}");
                assert_eq!(t.denied_count, 1, "{what}: {t:?}");
            } else {
                assert_eq!(r.rcs(), vec![0, 0, 0, 0], "{what}: {}", r.stdout);
                assert!(reports_in(&dir).is_empty(), "{what}: {}", r.stderr);
            }
        }
    }
}

/// A family left out of `PINGUARD_HOOKS` is never asked about its devices, and its allocations
/// pass through uncounted even on an integrated device.
#[test]
fn a_family_not_hooked_is_never_asked() {
    for (api, family) in [("cuda", "cuda"), ("driver", "cuda-driver"), ("hip", "hip")] {
        let ops = ["malloc:786432", "malloc:786432", "free:0", "free:1"];
        let env = [
            ("PINGUARD_BUDGET", "1M"),
            ("PINGUARD_HOOKS", "mlock"),
            ("EMU_INTEGRATED", "1"),
        ];
        let r = dm(api, &ops, &env);
        assert_eq!(r.rcs(), vec![0; 4], "{family}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(s["device"]["integrated_queries"], 0, "{family}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{family}: {s}");
        assert!(reports_in(&r.report_dir).is_empty(), "{family}");
    }
}
