//! `pthread_cancel` acts exactly as without pinguard: pinguard's own work is never a cancellation
//! point, and a cancellation inside the real function unwinds through the hook to the application.

use crate::common;
use common::*;

fn build() -> std::path::PathBuf {
    fixture_set("safety_cancel").join("cancel")
}

fn outcome(
    path: &std::path::Path,
    args: &[&str],
    preload: bool,
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let f = fixtures();
    let dir = fresh_dir("cancel");
    let mut cmd = program(path, preload.then_some(f.lib.as_os_str()));
    cmd.args(args)
        .current_dir(&dir)
        .env("PINGUARD_REPORT", dir.join("r.%p.json"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// mlockall, munlockall and a partly failing mlock (which make pinguard read /proc) are no
/// cancellation points: the thread returns from all three and is cancelled at pthread_testcancel.
#[test]
fn cancellation_never_acts_inside_pinguards_own_work() {
    let prog = build();
    let bare = outcome(&prog, &["locking"], false, &[]);
    assert_eq!(bare.0, Some(0), "{bare:?}");
    assert_eq!(
        bare.1.trim(),
        "cancelled=1 steps=15",
        "without pinguard: {bare:?}"
    );
    for budget in ["", "1G"] {
        let env: &[(&str, &str)] = if budget.is_empty() {
            &[]
        } else {
            &[("PINGUARD_BUDGET", budget)]
        };
        let r = outcome(&prog, &["locking"], true, env);
        assert_eq!(
            (r.0, r.1.as_str()),
            (bare.0, bare.1.as_str()),
            "budget {budget:?}: {}",
            r.2
        );
    }
}

/// A runtime that reaches a cancellation point inside its call: the thread is cancelled there, as
/// without pinguard, and the budget it reserved comes back (the whole budget fits afterwards).
#[test]
fn cancellation_inside_the_runtime_unwinds_through_the_hook() {
    let prog = build();
    let env = [("EMU_DRIVER_IO", "1")];
    let bare = outcome(&prog, &["runtime"], false, &env);
    assert_eq!(bare.0, Some(0), "{bare:?}");
    assert!(
        bare.1.contains("cancelled=1 steps=1") && bare.1.contains("after rc=0"),
        "without pinguard: {bare:?}"
    );
    let r = outcome(
        &prog,
        &["runtime"],
        true,
        &[("EMU_DRIVER_IO", "1"), ("PINGUARD_BUDGET", "1M")],
    );
    assert_eq!((r.0, r.1.as_str()), (bare.0, bare.1.as_str()), "{}", r.2);
}

/// A thread cancelled inside the runtime's free (before the runtime freed anything): pinguard
/// still counts the memory, so the application's next free releases it and the budget fits again.
#[test]
fn a_release_cancelled_inside_the_runtime_keeps_its_record() {
    let prog = build();
    let env = [("EMU_DRIVER_IO", "1")];
    let bare = outcome(&prog, &["free"], false, &env);
    assert_eq!(
        bare.1.trim(),
        "alloc rc=0 cancelled=1 steps=1 free rc=0 again rc=0",
        "without pinguard: {bare:?}"
    );
    let r = outcome(
        &prog,
        &["free"],
        true,
        &[("EMU_DRIVER_IO", "1"), ("PINGUARD_BUDGET", "1M")],
    );
    assert_eq!((r.0, r.1.as_str()), (bare.0, bare.1.as_str()), "{}", r.2);
}
