//! `pinguard run` of a program built with AddressSanitizer: the real `pinguard` binary puts ASan's
//! runtime first in `LD_PRELOAD` (ASan refuses to start otherwise), pinguard after it, and the
//! program's pinning, its budget and ASan's own findings all come through.

#[path = "../../tests/common/asan.rs"]
mod asan_fixture;
use crate::common;

use asan_fixture::asan;
use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    dir: PathBuf,
}

/// `pinguard run [flags] -- PROG ARGS`, reports into a fresh folder, `LD_PRELOAD` as given.
fn pinguard_run(
    flags: &[&str],
    prog: &std::path::Path,
    args: &[&str],
    preload: Option<&std::ffi::OsStr>,
) -> Ran {
    let f = fixtures();
    let dir = fresh_dir("cli-asan");
    let template = dir.join("%e.%p.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pinguard"));
    cmd.args([
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--report",
        template.to_str().unwrap(),
    ])
    .args(flags)
    .arg("--")
    .arg(prog)
    .args(args);
    clear_pinguard_env(&mut cmd);
    cmd.env_remove("LD_PRELOAD")
        .env("ASAN_OPTIONS", "detect_leaks=0");
    if let Some(p) = preload {
        cmd.env("LD_PRELOAD", p);
    }
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ran {
        code: out.status.code(),
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
        dir,
    }
}

fn the_report(dir: &std::path::Path) -> Report {
    let reports: Vec<PathBuf> = reports_in(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    read_report(&reports[0])
}

#[test]
fn run_puts_asans_runtime_first_and_tracks_the_program() {
    let Some(a) = asan() else { return };
    let r = pinguard_run(
        &["--budget", "6MiB"],
        &a.prog,
        &["cuda:4", "cuda:4", "mlock:1", "vmlck"],
        None,
    );
    // Before: "ASan runtime does not come first in initial library list", status 1.
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    assert!(!r.stderr.contains("does not come first"), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("is built with AddressSanitizer (libasan.so."),
        "{}",
        r.stderr
    );
    assert!(
        r.stdout
            .contains("cuda 4 MiB rc=0\ncuda 4 MiB rc=2\nmlock 1 MiB rc=0\nvmlck=0\nexit\n"),
        "{}",
        r.stdout
    );
    let rep = the_report(&r.dir);
    assert_eq!(rep.totals.live_bytes, 4 << 20, "{rep:?}");
    assert_eq!(rep.totals.denied_count, 1, "{rep:?}");
    // ASan took the mlock (a no-op): neither pinguard nor the kernel counts it locked.
    assert!(!rep.apis.contains_key("mlock"), "{rep:?}");
    assert_eq!(rep.kernel.vm_lck_bytes, Some(0), "{rep:?}");
    assert!(
        r.stderr.contains("4.00 MiB pinned in 1 allocation"),
        "{}",
        r.stderr
    );
}

#[test]
fn run_keeps_asans_findings_and_exit_status() {
    let Some(a) = asan() else { return };
    let r = pinguard_run(&[], &a.prog, &["cuda:2", "uaf"], None);
    assert_eq!(r.code, Some(1), "ASan's exit status\n{}", r.stderr);
    assert!(
        r.stderr
            .contains("ERROR: AddressSanitizer: heap-use-after-free"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("exited with status 1"), "{}", r.stderr);
    // ASan ends the program with _exit: pinguard's exit report is not written, its state file
    // (the last state before the end) is what the summary shows.
    assert!(r.stderr.contains("2.00 MiB"), "{}", r.stderr);
}

#[test]
fn a_runtime_the_user_preloads_goes_first_too() {
    let Some(a) = asan() else { return };
    // The user's own LD_PRELOAD names the runtime (a path), here for a program built without ASan.
    let r = pinguard_run(
        &[],
        std::path::Path::new("/bin/echo"),
        &["loaded"],
        Some(a.runtime.as_os_str()),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stdout, "loaded\n");
    // And for the ASan program, with another library after it (glibc also takes spaces between
    // entries): pinguard goes between the two. (Listed after it, the runtime would already stop
    // `pinguard` itself, which starts under the same LD_PRELOAD.)
    let mut list = a.runtime.clone().into_os_string();
    list.push(" ");
    list.push(fixtures().dir.join("libwrap.so"));
    let r = pinguard_run(&[], &a.prog, &["cuda:1"], Some(&list));
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    assert_eq!(the_report(&r.dir).totals.live_bytes, 1 << 20);
}
