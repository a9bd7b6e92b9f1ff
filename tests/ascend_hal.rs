//! Ascend's driver layer (`PINGUARD_HOOKS=ascend-hal`): `halHostRegister`,
//! `halHostUnregister(Ex)` and `halMemCreate`/`Map`/`Unmap`/`Release` at a host location, through
//! the exports and `dlsym(dlopen("libascend_hal.so"), name)`, against the emulated driver
//! (tests/emul/ascend_hal.c, CANN's names, map types and `drvError_t` codes) and its own counters.

use crate::common;
use common::*;
use std::path::PathBuf;
use std::sync::OnceLock;

const ROUTES: [&str; 2] = ["export", "dlsym"];
/// `DRV_ERROR_OUT_OF_MEMORY`.
const OUT_OF_MEMORY: i64 = 6;

/// The test program, linked with the emulated driver (`tests/fixtures.txt`, set `ascend_hal`).
fn program() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| fixture_set("ascend_hal").join("ascend_hal/ascend_hal"))
}

fn hal(route: &str, ops: &[&str], env: &[(&str, &str)]) -> Run {
    let mut env = env.to_vec();
    env.push(("HAL_ROUTE", route));
    let r = run(&program().to_string_lossy(), ops, &env);
    assert!(r.success(), "{route}: {}\n{}", r.stdout, r.stderr);
    r
}

/// Registrations of host memory (HOST_MEM_MAP_DEV, the PCIe-through and DMA kinds) are counted as
/// the driver counts them, with the program's callsite, and either unregistration ends them.
#[test]
fn host_registrations_count_exactly_through_each_route() {
    let ops = ["register:8192:0", "register:4096:3", "register:12288:5"];
    let ends = ["unregister:0", "unregister_ex:1:3", "unregister:2"];
    for route in ROUTES {
        let r = hal(route, &ops, &[]);
        assert_eq!(r.rcs_of(&ops), vec![0; 3], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(
            s["hal"]["outstanding_bytes"],
            8192 + 4096 + 12288,
            "{route}: {s}"
        );
        assert_eq!(
            s["pinguard_live_bytes"], s["hal"]["outstanding_bytes"],
            "{route}"
        );
        let rep = r.typed_report();
        let a = api_stats(&rep, "halHostRegister");
        assert_eq!(a.alloc_count, 3, "{route}: {:?}", rep.apis);
        assert_eq!(a.live_bytes, 8192 + 4096 + 12288, "{route}");
        let sites = &rep.callsites;
        assert!(
            sites.iter().all(|c| {
                let f = c
                    .frames
                    .first()
                    .and_then(|f| f.symbol.as_deref())
                    .unwrap_or("");
                f == "run_op" || f == "main"
            }),
            "{route}: {sites:?}"
        );

        let all: Vec<&str> = ops.iter().chain(ends.iter()).copied().collect();
        let r = hal(route, &all, &[]);
        assert_eq!(r.rcs_of(&ends), vec![0; 3], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(s["hal"]["outstanding_bytes"], 0, "{route}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{route}");
        let t = r.typed_report().totals;
        assert_eq!(t.unknown_release_count, 0, "{route}: {t:?}");
        assert_eq!(t.release_count, 3, "{route}");
    }
}

/// A registration of I/O memory (HOST_IO_MAP_DEV: a NIC's doorbells) passes through uncounted
/// under `error` and `downgrade` with a budget it would not fit; host memory over the budget gets
/// DRV_ERROR_OUT_OF_MEMORY without reaching the driver, under both policies (the device maps it).
#[test]
fn io_memory_passes_uncounted_and_host_memory_over_the_budget_is_refused() {
    for policy in ["error", "downgrade"] {
        for route in ROUTES {
            let ops = [
                "register:65536:6",
                "register:32768:0",
                "register:32768:3",
                "unregister_ex:0:6",
            ];
            let env = [("PINGUARD_BUDGET", "16K"), ("PINGUARD_POLICY", policy)];
            let r = hal(route, &ops, &env);
            assert_eq!(
                r.rcs_of(&ops),
                vec![0, OUT_OF_MEMORY, OUT_OF_MEMORY, 0],
                "{policy} {route}: {}",
                r.stdout
            );
            let s = r.stats();
            assert_eq!(s["hal"]["io_registrations"], 1, "{policy} {route}: {s}");
            assert_eq!(
                s["hal"]["alloc_calls"], 0,
                "{policy} {route}: nothing pinned"
            );
            assert_eq!(s["hal"]["failed_calls"], 0, "{policy} {route}");
            assert_eq!(s["pinguard_live_bytes"], 0, "{policy} {route}");
            let rep = r.typed_report();
            let t = &rep.totals;
            assert_eq!(t.denied_count, 2, "{policy} {route}: {t:?}");
            assert_eq!(t.downgraded_count, 0, "{policy} {route}");
            assert_eq!(t.unknown_release_count, 0, "{policy} {route}");
            assert_eq!(
                api_stats(&rep, "halHostRegister").alloc_count,
                0,
                "{policy} {route}"
            );
        }
    }
}

/// `halMemCreate` at the host side is counted until its last reference and mapping go, device
/// memory passes through, and host memory over the budget gets DRV_ERROR_OUT_OF_MEMORY.
#[test]
fn host_physical_memory_counts_until_released_and_unmapped() {
    for route in ROUTES {
        // Slots: 0 host handle, 1 device handle, 2 reserved addresses.
        let ops = ["create:8192:0", "create:65536:1", "reserve:8192", "map:2:0"];
        let r = hal(route, &ops, &[("PINGUARD_BUDGET", "16K")]);
        assert_eq!(r.rcs_of(&ops), vec![0; 4], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(s["hal"]["outstanding_bytes"], 8192, "{route}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 8192, "{route}");

        let more = [
            "release:0",
            "unmap:2",
            "release:1",
            "create:32768:0",
            "create:32768:2",
        ];
        let all: Vec<&str> = ops.iter().chain(more.iter()).copied().collect();
        let r = hal(route, &all, &[("PINGUARD_BUDGET", "16K")]);
        assert_eq!(
            r.rcs_of(&more),
            vec![0, 0, 0, OUT_OF_MEMORY, OUT_OF_MEMORY],
            "{route}: {}",
            r.stdout
        );
        let s = r.stats();
        assert_eq!(s["hal"]["outstanding_bytes"], 0, "{route}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{route}");
        let rep = r.typed_report();
        assert_eq!(
            api_stats(&rep, "halMemCreate").alloc_count,
            1,
            "{route}: {:?}",
            rep.apis
        );
        assert_eq!(rep.totals.denied_count, 2, "{route}");
    }
}

/// Without `ascend-hal` in `PINGUARD_HOOKS`, every route passes through untouched.
#[test]
fn hooks_without_ascend_hal_pass_through_untouched() {
    for route in ROUTES {
        let ops = ["register:32768:0", "create:32768:0", "unregister:0"];
        let env = [("PINGUARD_BUDGET", "4K"), ("PINGUARD_HOOKS", "cuda,acl")];
        let r = hal(route, &ops, &env);
        assert_eq!(r.rcs_of(&ops), vec![0, 0, 0], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(s["hal"]["outstanding_bytes"], 32768, "{route}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{route}");
        assert!(
            reports_in(&r.report_dir).is_empty(),
            "{route}: {}",
            r.stderr
        );
    }
}

/// Every row of the family's table, looked up through a handle of the library, is pinguard's
/// wrapper; without pinguard each answer is the library's own, so every name was looked up.
#[test]
fn every_ascend_hal_row_is_redirected_through_a_handle() {
    let f = fixtures();
    let dir = program().parent().unwrap();
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
        .filter_map(|l| l.strip_prefix("hal "))
        .collect();
    assert_eq!(names.len(), 7, "{names:?}");
    let library = dir.join("emu/libascend_hal.so");
    let lib_name = wrappers_file_name();
    for (preload, holder) in [
        (Some(f.lib.as_os_str()), lib_name.as_str()),
        (None, "libascend_hal.so"),
    ] {
        let out = common::program(&exe, preload)
            .arg(&library)
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
