//! AddressSanitizer and pinguard in one process, in the order ASan demands (its runtime first in
//! `LD_PRELOAD`, pinguard after it): both start, pinning through the CUDA runtime is tracked and
//! held to the budget, ASan's own findings and exit status stand, and what ASan does to `mlock`
//! (gcc's runtime makes it a no-op that returns 0) is what pinguard and the kernel both report.

#[path = "common/asan.rs"]
mod asan_fixture;
use crate::common;

use asan_fixture::asan;
use common::*;
use std::ffi::OsString;
use std::time::Duration;

fn preload_asan_first(runtime: &std::path::Path) -> OsString {
    let mut v = runtime.as_os_str().to_owned();
    v.push(":");
    v.push(&fixtures().lib);
    v
}

/// `prog ARGS` with ASan's runtime then pinguard preloaded, reports in a fresh folder.
fn run_preloaded(prog: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Option<Run> {
    let a = asan()?;
    let dir = fresh_dir("asan");
    let mut cmd = program(prog, Some(&preload_asan_first(&a.runtime)));
    cmd.current_dir(&dir).args(args);
    clear_pinguard_env(&mut cmd);
    // LeakSanitizer stops with a fatal error under qemu-user (it needs ptrace); the tests that
    // set ASAN_OPTIONS themselves say so too.
    cmd.env("PINGUARD_REPORT", dir.join("report.%p.json"))
        .env("ASAN_OPTIONS", "detect_leaks=0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Some(Run::from_output(
        run_bounded(&mut cmd, Duration::from_secs(60)),
        dir,
    ))
}

/// `asan_pin STEPS`, preloaded as above.
fn run_asan_pin(steps: &[&str], env: &[(&str, &str)]) -> Option<Run> {
    run_preloaded(&asan()?.prog, steps, env)
}

#[test]
fn the_pair_loads_into_a_program_built_without_asan() {
    // Before: pinguard's constructor reached ASan's __tls_get_addr, which started ASan, whose
    // dlsym(RTLD_NEXT) came back into pinguard before ASan could call anything: SIGSEGV.
    let Some(r) = run_preloaded(&fixtures().dir.join("scenario"), &["cuda_alloc:4096"], &[]) else {
        return;
    };
    assert!(
        r.success(),
        "{:?}\n{}\n{}",
        r.out.status,
        r.stdout,
        r.stderr
    );
    let rep = r.typed_report();
    assert_eq!(rep.totals.live_bytes, 4096, "{rep:?}");
    if !aarch64() {
        let r = run_preloaded(std::path::Path::new("/bin/true"), &[], &[]).unwrap();
        assert!(r.success(), "/bin/true: {:?}\n{}", r.out.status, r.stderr);
    }
}

#[test]
fn an_asan_program_is_tracked_and_held_to_its_budget() {
    let Some(r) = run_asan_pin(
        &["cuda:4", "cuda:4", "vmlck"],
        &[("PINGUARD_BUDGET", "6MiB")],
    ) else {
        return;
    };
    assert!(
        r.success(),
        "{:?}\n{}\n{}",
        r.out.status,
        r.stdout,
        r.stderr
    );
    assert!(!r.stderr.contains("AddressSanitizer"), "{}", r.stderr);
    // The second allocation would take the process past 6 MiB: the runtime's own error for it.
    assert!(
        r.stdout.contains("cuda 4 MiB rc=0\ncuda 4 MiB rc=2\n"),
        "{}",
        r.stdout
    );
    let rep = r.typed_report();
    assert_eq!(rep.totals.live_bytes, 4 << 20, "{rep:?}");
    assert_eq!(rep.totals.denied_count, 1, "{rep:?}");
    assert_eq!(api_stats(&rep, "cudaHostAlloc").alloc_count, 1, "{rep:?}");
}

#[test]
fn asan_swallows_mlock_and_pinguard_claims_no_locked_pages() {
    let Some(r) = run_asan_pin(
        &[
            "mlock:2",
            "vmlck",
            "cuda:1",
            "vmlck",
            "mmap_locked:1",
            "vmlck",
        ],
        &[],
    ) else {
        return;
    };
    assert!(
        r.success(),
        "{:?}\n{}\n{}",
        r.out.status,
        r.stdout,
        r.stderr
    );
    // gcc's ASan intercepts the mlock family and returns 0 without locking: the kernel counts
    // nothing locked, even for the emulated runtime's own mlock of the CUDA allocation.
    assert!(
        r.stdout.contains("mlock 2 MiB rc=0\nvmlck=0\n"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("cuda 1 MiB rc=0\nvmlck=0\n"),
        "{}",
        r.stdout
    );
    // mmap(MAP_LOCKED) does lock: ASan's mmap passes it on (to pinguard's, then libc's).
    assert!(
        r.stdout.contains("mmap_locked 1 MiB ok=1\nvmlck=1024\n"),
        "{}",
        r.stdout
    );
    let rep = r.typed_report();
    // The program's mlock went to ASan, never to pinguard: no locked bytes claimed for it; the
    // locked mapping is counted, as the kernel counts it.
    assert!(!rep.apis.contains_key("mlock"), "{rep:?}");
    assert_eq!(api_stats(&rep, "mmap").live_bytes, 1 << 20, "{rep:?}");
    assert_eq!(rep.kernel.vm_lck_bytes, Some(1 << 20), "{rep:?}");
    // The CUDA allocation is pinguard's to count (a real driver pins without mlock).
    assert_eq!(
        api_stats(&rep, "cudaHostAlloc").live_bytes,
        1 << 20,
        "{rep:?}"
    );
    assert_eq!(rep.totals.live_bytes, 2 << 20, "{rep:?}");
}

#[test]
fn a_program_with_asan_linked_in_needs_only_pinguard_preloaded() {
    let Some(a) = asan() else { return };
    let dir = fresh_dir("asan-static");
    let mut cmd = command_in(&a.prog_static, &dir, true);
    cmd.args(["cuda:4", "mlock:1", "vmlck", "uaf"])
        .env("ASAN_OPTIONS", "detect_leaks=0");
    let r = Run::from_output(run_bounded(&mut cmd, Duration::from_secs(60)), dir);
    // ASan starts from the program's .preinit_array and asks pinguard's dlsym at once.
    assert_eq!(r.out.status.code(), Some(1), "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("cuda 4 MiB rc=0\nmlock 1 MiB rc=0\nvmlck=0\n"),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr
            .contains("ERROR: AddressSanitizer: heap-use-after-free"),
        "{}",
        r.stderr
    );
}

#[test]
fn asan_findings_and_exit_status_stand() {
    let Some(r) = run_asan_pin(&["cuda:1", "uaf"], &[]) else {
        return;
    };
    assert_eq!(
        r.out.status.code(),
        Some(1),
        "ASan's exit status\n{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("ERROR: AddressSanitizer: heap-use-after-free"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("asan_pin.c"),
        "ASan names the line\n{}",
        r.stderr
    );
    assert!(!r.stdout.contains("exit"), "{}", r.stdout);
    let code = run_asan_pin(&["uaf"], &[("ASAN_OPTIONS", "detect_leaks=0:exitcode=42")]).unwrap();
    assert_eq!(code.out.status.code(), Some(42), "{}", code.stderr);
}
