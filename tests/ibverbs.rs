//! RDMA memory registration (`PINGUARD_HOOKS=ibverbs`): every registration entry point through the
//! export, `dlsym` and `dlvsym` with each symbol version NCCL asks for (and `IBVERBS_1.0`), under
//! each policy, against the emulated `libibverbs.so.1` (tests/emul/ibverbs.c, rdma-core's names,
//! versions and `struct ibv_mr`) and its own counters.

use crate::common;
use common::*;
use std::path::PathBuf;
use std::sync::OnceLock;

const ROUTES: [&str; 4] = ["export", "dlsym", "dlvsym", "dlvsym10"];
/// `IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND`.
const ON_DEMAND: &str = "65";
const ENOMEM: i64 = 12;

/// The test program linked with the emulated library, built with its version script
/// (`tests/fixtures.txt`, set `ibverbs`).
fn program() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| fixture_set("ibverbs").join("ibverbs/ibverbs"))
}

fn ibv(route: &str, ops: &[&str], env: &[(&str, &str)]) -> Run {
    let mut env = env.to_vec();
    env.push(("IBV_ROUTE", route));
    let r = run(&program().to_string_lossy(), ops, &env);
    assert!(r.success(), "{route}: {}\n{}", r.stdout, r.stderr);
    r
}

fn errno(r: &Run, op: &str) -> i64 {
    let line = r.stdout.lines().find(|l| l.starts_with(&format!("{op} ")));
    field(line.unwrap(), "errno")
}

/// Each registration name pins and is counted exactly as the library counts, with the program's
/// callsite, through each route; `ibv_dereg_mr` finds each, whichever name made it.
#[test]
fn registrations_count_exactly_with_callsites_through_each_route() {
    let ops = ["reg:8192", "iova:4096", "iova2:12288", "touch:0"];
    let deregs = ["dereg:0", "dereg:1", "dereg:2"];
    for route in ROUTES {
        let r = ibv(route, &ops, &[]);
        assert_eq!(r.rcs_of(&ops), vec![0; 4], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(
            s["ibverbs"]["outstanding_bytes"],
            8192 + 4096 + 12288,
            "{route}: {s}"
        );
        assert_eq!(
            s["pinguard_live_bytes"], s["ibverbs"]["outstanding_bytes"],
            "{route}: pinguard counts what the library pinned"
        );
        let rep = r.typed_report();
        for (name, bytes) in [
            ("ibv_reg_mr", 8192),
            ("ibv_reg_mr_iova", 4096),
            ("ibv_reg_mr_iova2", 12288),
        ] {
            assert_eq!(
                api_stats(&rep, name).alloc_count,
                1,
                "{route} {name}: {:?}",
                rep.apis
            );
            assert_eq!(api_stats(&rep, name).live_bytes, bytes, "{route} {name}");
        }
        let sites = &rep.callsites;
        assert_eq!(sites.len(), 3, "{route}: {sites:?}");
        for c in sites {
            let first = c
                .frames
                .first()
                .and_then(|f| f.symbol.as_deref())
                .unwrap_or("");
            assert!(
                first == "run_op" || first == "main",
                "{route}: the callsite starts in the program: {c:?}"
            );
        }

        let all: Vec<&str> = ops.iter().chain(deregs.iter()).copied().collect();
        let r = ibv(route, &all, &[]);
        assert_eq!(r.rcs_of(&deregs), vec![0; 3], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(s["ibverbs"]["outstanding_bytes"], 0, "{route}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{route}");
        let t = r.typed_report().totals;
        assert_eq!(t.unknown_release_count, 0, "{route}: {t:?}");
        assert_eq!(t.release_count, s["ibverbs"]["release_calls"], "{route}");
        // Each route reached the version it asked for, through pinguard: the default one by
        // name (never the hidden IBVERBS_1.0 one), or IBVERBS_1.0's ibv_reg_mr and ibv_dereg_mr.
        let compat = if route == "dlvsym10" { 1 + 3 } else { 0 };
        assert_eq!(s["ibverbs"]["compat_calls"], compat, "{route}: {s}");
    }
}

/// Over the budget, under `error` and under `downgrade` alike (the card reads the pages by DMA:
/// nothing can stand in), every registration name answers NULL with `errno` ENOMEM, as the
/// library does when the kernel cannot pin, and the library is never called.
#[test]
fn over_the_budget_registrations_get_null_and_enomem_under_error_and_downgrade() {
    let ops = ["reg:32768", "iova:32768", "iova2:32768", "reg:8192"];
    for policy in ["error", "downgrade"] {
        for route in ROUTES {
            let env = [("PINGUARD_BUDGET", "16K"), ("PINGUARD_POLICY", policy)];
            let r = ibv(route, &ops, &env);
            assert_eq!(
                r.rcs_of(&ops),
                vec![-1, -1, -1, 0],
                "{policy} {route}: {}",
                r.stdout
            );
            for op in &ops[..3] {
                assert_eq!(errno(&r, op), ENOMEM, "{policy} {route} {op}");
            }
            let s = r.stats();
            assert_eq!(
                s["ibverbs"]["alloc_calls"], 1,
                "{policy} {route}: only the call that fits reached the library: {s}"
            );
            assert_eq!(s["ibverbs"]["failed_calls"], 0, "{policy} {route}");
            let t = r.typed_report().totals;
            assert_eq!(t.denied_count, 3, "{policy} {route}: {t:?}");
            assert_eq!(t.downgraded_count, 0, "{policy} {route}");
            assert_eq!(t.live_bytes, 8192, "{policy} {route}");
        }
    }
}

/// `IBV_ACCESS_ON_DEMAND` pins nothing: recorded under its own name with its callsite, no bytes
/// counted, admitted whatever the budget; its deregistration finds it.
#[test]
fn on_demand_registrations_are_recorded_and_not_counted() {
    let odp = format!("reg:1048576:{ON_DEMAND}");
    let odp2 = format!("iova2:1048576:{ON_DEMAND}");
    for route in ROUTES {
        let ops = [odp.as_str(), odp2.as_str(), "dereg:0"];
        let r = ibv(route, &ops, &[("PINGUARD_BUDGET", "16K")]);
        assert_eq!(r.rcs_of(&ops), vec![0, 0, 0], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(s["ibverbs"]["outstanding_bytes"], 0, "{route}: {s}");
        assert_eq!(s["ibverbs"]["alloc_calls"], 2, "{route}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{route}");
        let rep = r.typed_report();
        let a = api_stats(&rep, "ibv_reg_mr(ON_DEMAND)");
        assert_eq!(a.alloc_count, 2, "{route}: {:?}", rep.apis);
        assert_eq!(a.live_count, 1, "{route}");
        assert_eq!(a.live_bytes, 0, "{route}");
        assert_eq!(rep.totals.denied_count, 0, "{route}");
        assert_eq!(rep.totals.unknown_release_count, 0, "{route}");
    }
}

/// A dma-buf is device memory: recorded with its callsite, never counted as host bytes.
#[test]
fn dmabuf_registrations_count_no_host_bytes() {
    for route in ROUTES {
        let ops = ["dmabuf:1048576", "dmabuf:4096", "dereg:1"];
        let r = ibv(route, &ops, &[("PINGUARD_BUDGET", "16K")]);
        assert_eq!(r.rcs_of(&ops), vec![0, 0, 0], "{route}: {}", r.stdout);
        assert_eq!(r.stats()["pinguard_live_bytes"], 0, "{route}");
        let rep = r.typed_report();
        let a = api_stats(&rep, "ibv_reg_dmabuf_mr");
        assert_eq!(a.alloc_count, 2, "{route}: {:?}", rep.apis);
        assert_eq!(a.alloc_bytes, 0, "{route}");
        assert_eq!(a.live_count, 1, "{route}");
        assert_eq!(rep.totals.denied_count, 0, "{route}");
    }
}

/// `ibv_rereg_mr` to another range moves the count with it; a move that would go over the
/// budget is refused (the old registration kept, `errno` ENOMEM) without calling the library.
#[test]
fn rereg_moves_the_count_and_its_growth_meets_the_budget() {
    for route in ROUTES {
        let ops = ["reg:8192", "rereg:0:12288", "touch:0"];
        let r = ibv(route, &ops, &[]);
        assert_eq!(r.rcs_of(&ops), vec![0, 0, 0], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(s["ibverbs"]["outstanding_bytes"], 12288, "{route}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 12288, "{route}");

        let ops = ["reg:8192", "rereg:0:32768", "rereg:0:4096", "dereg:0"];
        let r = ibv(route, &ops, &[("PINGUARD_BUDGET", "16K")]);
        assert_eq!(r.rcs_of(&ops), vec![0, -2, 0, 0], "{route}: {}", r.stdout);
        assert_eq!(errno(&r, "rereg:0:32768"), ENOMEM, "{route}");
        let s = r.stats();
        assert_eq!(
            s["ibverbs"]["failed_calls"], 0,
            "{route}: the library never saw it: {s}"
        );
        assert_eq!(s["ibverbs"]["outstanding_bytes"], 0, "{route}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{route}");
        let rep = r.typed_report();
        let t = &rep.totals;
        assert_eq!(t.denied_count, 1, "{route}: {t:?}");
        assert_eq!(api_stats(&rep, "ibv_rereg_mr").denied_count, 1, "{route}");
        assert_eq!(t.unknown_release_count, 0, "{route}");
    }
}

/// Without `ibverbs` in `PINGUARD_HOOKS`, every route passes through untouched: nothing counted
/// or refused, `dlsym`/`dlvsym` answers the library's own. (Not `mlock` either: the emulation pins
/// with `mlock`, which that family would count.)
#[test]
fn hooks_without_ibverbs_pass_through_untouched() {
    for route in ROUTES {
        let ops = ["reg:32768", "iova2:32768", "dereg:0"];
        let env = [("PINGUARD_BUDGET", "4K"), ("PINGUARD_HOOKS", "cuda,acl")];
        let r = ibv(route, &ops, &env);
        assert_eq!(r.rcs_of(&ops), vec![0, 0, 0], "{route}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(s["ibverbs"]["outstanding_bytes"], 32768, "{route}: {s}");
        assert_eq!(s["pinguard_live_bytes"], 0, "{route}");
        // pinguard saw no pinning call at all, so it wrote nothing.
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
fn every_ibverbs_row_is_redirected_through_a_handle() {
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
        .filter_map(|l| l.strip_prefix("ibverbs "))
        .collect();
    assert_eq!(names.len(), 6, "{names:?}");
    let library = dir.join("emu/libibverbs.so.1");
    let lib_name = wrappers_file_name();
    for (preload, holder) in [
        (Some(f.lib.as_os_str()), lib_name.as_str()),
        (None, "libibverbs.so.1"),
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

/// The card's registrations move the kernel's `VmPin` (the emulated library pins each as an
/// `io_uring` ring's fixed buffer, as `ib_umem_get` pins): matched with `VmPin`, they stay
/// pinguard's own records, never counted a second time as kernel-pinned bytes with no callsite.
#[test]
fn registrations_in_vmpin_are_not_counted_again_as_kernel_pinned() {
    let r = ibv("export", &["reg:1048576", "iova2:12288"], &[]);
    let rep = r.typed_report();
    let vm_pin = rep.kernel.vm_pin_bytes.unwrap_or(0);
    if vm_pin == 0 {
        eprintln!("NOT RUN: the emulated library pinned with mlock (io_uring not available here)");
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none() || aarch64(),
            "io_uring must be available here"
        );
        return;
    }
    assert_eq!(vm_pin, 1048576 + 12288, "{:?}", rep.kernel);
    assert_eq!(rep.totals.live_bytes, 1048576 + 12288);
    assert_eq!(rep.totals.kernel_pinned_bytes, 0, "{:?}", rep.totals);
    assert!(!pinguard_lines(&r.stderr)
        .join("\n")
        .contains("kernel-pinned"));
}

/// Issue 46 item 13: a registration the library fails (NULL, `errno` ENOMEM: the kernel could not
/// pin), through each registration name, and a move of a registration it fails, have events
/// that say why: the `errno` by name, and the room.
#[test]
fn a_failed_registration_says_why() {
    for (op, name) in [
        ("reg:32768", "ibv_reg_mr"),
        ("iova:32768", "ibv_reg_mr_iova"),
        ("iova2:32768", "ibv_reg_mr_iova2"),
    ] {
        let r = ibv("export", &[op], &[("EMU_FAIL_EVERY", "1")]);
        assert_eq!(r.rcs_of(&[op]), vec![-1], "{op}: {}", r.stdout);
        let rep = r.typed_report();
        let e = failed_event_of(&rep, name);
        assert_eq!(e.size, 32768, "{op}: {e:?}");
        assert_why_of(e, "ENOMEM");
    }
    let ops = ["reg:8192", "rereg:0:12288"];
    let r = ibv("export", &ops, &[("EMU_FAIL_EVERY", "2")]);
    assert_eq!(r.rcs_of(&ops)[0], 0, "{}", r.stdout);
    assert_ne!(r.rcs_of(&ops)[1], 0, "{}", r.stdout);
    let rep = r.typed_report();
    let e = failed_event_of(&rep, "ibv_rereg_mr");
    assert_eq!(e.size, 12288, "{e:?}");
    assert_why_of(e, "ENOMEM");
}
