//! Pages the kernel pins behind pinguard's back (`VmPin`): an `io_uring` ring's fixed buffers,
//! registered through raw system calls (`tests/progs/uring_pin.c`, no liburing). pinguard
//! matches them with `VmPin` where it matches the locked pages with `VmLck`: they show in the
//! report, the metrics and the exit line as kernel-pinned bytes with no callsite, and count
//! against the budget. Without `io_uring` (`/proc/sys/kernel/io_uring_disabled`, a kernel
//! without it, qemu-user) every test says NOT RUN, and fails where `PGTEST_REQUIRE_ALL` is set.

use crate::common;
use common::*;
use std::path::PathBuf;
use std::sync::OnceLock;

const MIB: u64 = 1 << 20;

fn prog() -> String {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| fixture_set("vm_pin").join("uring_pin"))
        .to_string_lossy()
        .into_owned()
}

/// Whether this process can register an `io_uring` buffer (asked of the kernel, without
/// pinguard); says plainly why not when it cannot.
fn uring_ok() -> bool {
    static OK: OnceLock<Result<(), String>> = OnceLock::new();
    let ok = OK.get_or_init(|| {
        let out = program(std::path::Path::new(&prog()), None)
            .args(["uring:64", "unuring"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        match text.lines().find(|l| l.starts_with("uring ")) {
            Some(l) if field(l, "rc") == 0 && field(l, "vmpin") == 64 => Ok(()),
            _ => Err(format!(
                "io_uring_disabled={}; the fixture said: {}",
                std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|e| format!("unreadable ({e})")),
                text.trim()
            )),
        }
    });
    if let Err(why) = ok {
        eprintln!("NOT RUN: io_uring cannot register buffers here ({why})");
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none() || aarch64(),
            "the VmPin tests must run here: {why}"
        );
    }
    ok.is_ok()
}

fn line<'a>(r: &'a Run, prefix: &str, n: usize) -> &'a str {
    r.stdout
        .lines()
        .filter(|l| l.starts_with(prefix))
        .nth(n)
        .unwrap_or_else(|| panic!("no {prefix} line {n} in:\n{}\n{}", r.stdout, r.stderr))
}

/// A raw `io_uring` registration of 1 MiB that pinguard never saw: reconciled with `VmPin` at
/// `pinguard_live_bytes`, it counts against the budget (a 2 MiB `mlock` that fits without it is
/// refused), and shows in the report, the metrics and the exit line with no callsite.
#[test]
fn a_raw_io_uring_registration_is_kernel_pinned_and_counts_against_the_budget() {
    if !uring_ok() {
        return;
    }
    let r = run(
        &prog(),
        &["mlock:64", "uring:1024", "live", "mlock:2048"],
        &[("PINGUARD_BUDGET", "2560K")],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert_eq!(field(line(&r, "uring ", 0), "vmpin"), 1024, "{}", r.stdout);
    assert_eq!(
        field(line(&r, "live=", 0), "live"),
        64 << 10,
        "the kernel's pins are not pinguard's live bytes"
    );
    let refused = line(&r, "mlock ", 1);
    assert_eq!(
        (field(refused, "rc"), field(refused, "errno")),
        (-1, libc::ENOMEM as i64),
        "64 KiB + 1 MiB kernel-pinned + 2 MiB is over 2.5 MiB: {}\n{}",
        r.stdout,
        r.stderr
    );
    let rep = r.typed_report();
    assert_eq!(rep.totals.kernel_pinned_bytes, MIB, "{rep:?}");
    assert_eq!(rep.kernel.vm_pin_bytes, Some(MIB));
    assert_eq!(rep.totals.live_bytes, 64 << 10);
    assert_eq!(rep.totals.denied_count, 1);
    assert!(
        rep.callsites.iter().all(|c| c.live_bytes != MIB),
        "no callsite holds the kernel's pins: {rep:?}"
    );
    let exit = pinguard_lines(&r.stderr).join("\n");
    assert!(
        exit.contains("), 1.00 MiB more kernel-pinned with no callsite (VmPin); 1 denied"),
        "{exit}"
    );
}

/// The same registration let go before a request over the budget: the refusal reads `VmPin`
/// again and the request fits.
#[test]
fn kernel_pins_let_go_make_room_again() {
    if !uring_ok() {
        return;
    }
    let r = run(
        &prog(),
        &["mlock:64", "uring:1024", "live", "unuring", "mlock:2048"],
        &[("PINGUARD_BUDGET", "2560K")],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert_eq!(field(line(&r, "unuring ", 0), "vmpin"), 0, "{}", r.stdout);
    assert_eq!(
        field(line(&r, "mlock ", 1), "rc"),
        0,
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    let rep = r.typed_report();
    assert_eq!(rep.totals.kernel_pinned_bytes, 0, "{rep:?}");
    assert_eq!(rep.totals.denied_count, 0);
    assert!(
        !pinguard_lines(&r.stderr)
            .join("\n")
            .contains("kernel-pinned"),
        "{}",
        r.stderr
    );
}

/// The metrics file, rewritten while the process runs, carries the kernel's pins as a gauge.
#[test]
fn the_metrics_show_kernel_pinned_bytes() {
    if !uring_ok() {
        return;
    }
    let dir = fresh_dir("vm_pin_metrics");
    let template = dir.join("m.%p.prom").to_string_lossy().into_owned();
    let r = run(
        &prog(),
        &[
            "mlock:64",
            "uring:1024",
            "sleep:400",
            &format!("metrics:{}", dir.display()),
        ],
        &[
            ("PINGUARD_METRICS", &template),
            ("PINGUARD_INTERVAL", "50ms"),
        ],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let m = line(&r, "metric ", 0);
    assert_eq!(
        m,
        format!("metric pinguard_process_kernel_pinned_bytes {MIB}"),
        "{}",
        r.stdout
    );
}
