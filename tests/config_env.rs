//! Every `PINGUARD_*` variable with a bad value: one clear stderr line naming it, the process runs
//! on with the default, and the report lists the problem under `config.errors`.

use crate::common;
use common::*;
use pinguard_common::{EventKind, Limit};

#[test]
fn each_bad_variable_gets_one_line_and_a_fallback() {
    let cases = [
        ("PINGUARD_BUDGET", "12 parsecs", "running WITHOUT a budget"),
        ("PINGUARD_POLICY", "explode", "using error"),
        ("PINGUARD_DEPTH", "-3", "using 32"),
        ("PINGUARD_INTERVAL", "often", "no periodic report"),
        ("PINGUARD_SIGNAL", "SIGNOPE", "no report on a signal"),
        ("PINGUARD_HOOKS", "cuda,opencl", "hooking all of them"),
        ("PINGUARD_LOG", "pinguard=shout", "using warn"),
        // Issue 46 item 15: pinguard writes nothing at trace, so it is refused, not silently void.
        ("PINGUARD_LOG", "trace", "using warn"),
        ("PINGUARD_DISABLE", "perhaps", "stays enabled"),
        ("PINGUARD_BUGDET", "1G", "did you mean PINGUARD_BUDGET"),
    ];
    for (var, value, fallback) in cases {
        let r = run(
            "scenario",
            &["cuda_alloc:4096", "mlock:0:1"],
            &[(var, value)],
        );
        assert!(
            r.success(),
            "{var}={value}: the process must run\n{}",
            r.stderr
        );
        assert_eq!(r.rc("cuda_alloc:4096"), 0, "{var}={value}");
        let lines: Vec<_> = pinguard_lines(&r.stderr)
            .into_iter()
            .filter(|l| l.contains(var))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "{var}={value}: want one line, got:\n{}",
            r.stderr
        );
        assert!(
            lines[0].contains(value) && lines[0].contains(fallback),
            "{var}: {}",
            lines[0]
        );
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
        let rep = r.typed_report();
        let errors = &rep.config.errors;
        assert_eq!(errors.len(), 1, "{var}: {errors:?}");
        assert!(errors[0].contains(var));
        // The fallback is in force: the default policy, depth, hooks and no budget.
        assert_eq!(rep.config.budget_bytes, None, "{var}");
        assert_eq!(rep.config.policy, "error", "{var}");
        assert_eq!(rep.config.depth, 32, "{var}");
        assert_eq!(rep.config.hooks.len(), 7, "{var}"); // every family, ibverbs and ascend-hal too
        assert_eq!(rep.totals.live_bytes, 8192, "{var}");
    }
}

#[test]
fn bad_report_template_falls_back_to_the_default_in_the_working_directory() {
    let r = run(
        "scenario",
        &["mlock:0:1"],
        &[("PINGUARD_REPORT", "%q/x.json")],
    );
    assert!(r.success());
    let lines = pinguard_lines(&r.stderr);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("PINGUARD_REPORT") && l.contains("unknown escape \"%q\"")),
        "{}",
        r.stderr
    );
    let pid = r.out.status.code().map(|_| ()).and(Some(()));
    assert!(pid.is_some());
    let files = reports_in(&r.report_dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("pinguard.scenario.") && name.ends_with(".json"),
        "{name}"
    );
}

#[test]
fn budget_forms() {
    // Kubernetes' binary forms (`8Gi`) too: a manifest's size must never turn the cap off.
    let forms = [
        ("1048576", 1048576u64),
        ("512K", 524288),
        ("1.5MiB", 1572864),
        ("2m", 2097152),
        ("64Ki", 64 << 10),
        ("3Mi", 3 << 20),
        ("8Gi", 8 << 30),
        ("1Ti", 1 << 40),
        ("1.5Gi", 3 << 29),
    ];
    for (value, bytes) in forms {
        let r = run("scenario", &["mlock:0:1"], &[("PINGUARD_BUDGET", value)]);
        assert_eq!(r.typed_report().config.budget_bytes, Some(bytes), "{value}");
        assert!(
            pinguard_lines(&r.stderr)
                .iter()
                .all(|l| !l.contains("PINGUARD_BUDGET")),
            "{}",
            r.stderr
        );
    }
    // The group budget and the host reserve take the same forms (issue 32).
    let group = format!("forms-{}", std::process::id());
    let r = run(
        "scenario",
        &["mlock:0:1"],
        &[
            ("PINGUARD_GROUP", &group),
            ("PINGUARD_GROUP_BUDGET", "8Gi"),
            ("PINGUARD_HOST_RESERVE", "1Mi"),
        ],
    );
    let _ = std::fs::remove_file(format!("/dev/shm/pinguard.group.{group}"));
    assert!(
        pinguard_lines(&r.stderr)
            .iter()
            .all(|l| !l.contains("PINGUARD_")),
        "{}",
        r.stderr
    );
    let rep = r.typed_report();
    assert_eq!(rep.config.host_reserve_bytes, Some(1u64 << 20));
    assert_eq!(
        rep.group.as_ref().and_then(|g| g.budget_bytes),
        Some(8u64 << 30)
    );
    assert_eq!(rep.config.errors.len(), 0);
    // A percentage of the memory limit (cgroup, else MemTotal) is some positive figure.
    let r = run("scenario", &["mlock:0:1"], &[("PINGUARD_BUDGET", "50%")]);
    assert!(r.typed_report().config.budget_bytes.unwrap() > 0);
}

#[test]
fn a_pinning_process_prints_each_bad_setting_once_when_it_first_pins() {
    let ops = [
        "cuda_alloc:4096",
        "acl_malloc:4096",
        "mlock:0:1",
        "cuda_alloc:4096",
    ];
    let r = run(
        "scenario",
        &ops,
        &[("PINGUARD_BUDGET", "-1"), ("PINGUARD_POLICY", "explode")],
    );
    assert!(r.success(), "{}", r.stderr);
    for var in ["PINGUARD_BUDGET", "PINGUARD_POLICY"] {
        let n = pinguard_lines(&r.stderr)
            .into_iter()
            .filter(|l| l.contains(var))
            .count();
        assert_eq!(n, 1, "{var}: want one line:\n{}", r.stderr);
    }
    let rep = r.typed_report();
    let errors = &rep.config.errors;
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors.iter().any(|e| e.contains("PINGUARD_BUDGET"))
            && errors.iter().any(|e| e.contains("PINGUARD_POLICY")),
        "{errors:?}"
    );
}

/// A setting that cannot be used, without `PINGUARD_STRICT`: the line says in capitals what runs
/// without it, and the call goes through uncapped (issue 46 item 4).
#[test]
fn a_bad_budget_says_running_without_one_in_capitals() {
    for value in ["garbage", "-1", "150%", ""] {
        let r = run(
            "scenario",
            &["cuda_alloc:4096"],
            &[("PINGUARD_BUDGET", value)],
        );
        assert_eq!(r.rc("cuda_alloc:4096"), 0, "{value:?}: {}", r.stderr);
        let lines: Vec<_> = pinguard_lines(&r.stderr)
            .into_iter()
            .filter(|l| l.contains("PINGUARD_BUDGET"))
            .collect();
        assert!(
            lines.len() == 1 && lines[0].contains("running WITHOUT a budget"),
            "{value:?}: {}",
            r.stderr
        );
    }
}

/// The event reasons of a report's refusals.
fn refusal_reasons(rep: &Report) -> Vec<Option<Limit>> {
    rep.events
        .iter()
        .filter(|e| e.kind == EventKind::Denied)
        .map(|e| e.reason)
        .collect()
}

/// `PINGUARD_STRICT=1` and a setting that cannot be used (a budget, a reserve): every pinning
/// call is refused in its API's own out-of-memory answer, with reason `config_error`, whatever
/// the policy; with good settings, strict changes nothing (issue 46 item 4).
#[test]
fn strict_mode_fails_closed_on_a_setting_that_cannot_be_used() {
    let ops = ["cuda_alloc:4096", "acl_malloc:4096", "mlock:0:1"];
    let bad = [
        ("PINGUARD_BUDGET", "garbage"),
        ("PINGUARD_BUDGET", "150%"),
        ("PINGUARD_HOST_RESERVE", "lots"),
        ("PINGUARD_CGROUP_RESERVE", "-1"),
    ];
    for (var, value) in bad {
        for policy in ["error", "warn", "downgrade"] {
            let r = run(
                "scenario",
                &ops,
                &[
                    ("PINGUARD_STRICT", "1"),
                    (var, value),
                    ("PINGUARD_POLICY", policy),
                ],
            );
            let what = format!("{var}={value} policy {policy}");
            assert!(r.success(), "{what}: {}", r.stderr);
            assert_eq!(
                [r.rc(ops[0]), r.rc(ops[1]), r.rc(ops[2])],
                [2, 207001, -1],
                "{what}: {}",
                r.stdout
            );
            let lines = pinguard_lines(&r.stderr);
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains(var) && l.contains("REFUSING every pinning call")),
                "{what}: {}",
                r.stderr
            );
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains("PINGUARD_STRICT=1") && l.contains("reason config_error")),
                "{what}: {}",
                r.stderr
            );
            let rep = r.typed_report();
            assert_eq!(rep.totals.denied_count, 3, "{what}");
            assert_eq!(rep.totals.live_bytes, 0, "{what}");
            assert_eq!(
                refusal_reasons(&rep),
                vec![Some(Limit::ConfigError); 3],
                "{what}: {:?}",
                rep.events
            );
        }
    }
    // Good settings: strict is silent and nothing is refused (`pinguard check`'s variable in the
    // same environment is no unknown name to the library).
    let r = run(
        "scenario",
        &ops,
        &[
            ("PINGUARD_STRICT", "1"),
            ("PINGUARD_BUDGET", "1Mi"),
            ("PINGUARD_SUPPRESSIONS", "ci/pinguard.supp"),
        ],
    );
    assert_eq!(
        [r.rc(ops[0]), r.rc(ops[1]), r.rc(ops[2])],
        [0, 0, 0],
        "{}",
        r.stderr
    );
    assert!(
        pinguard_lines(&r.stderr)
            .iter()
            .all(|l| !l.contains("STRICT") && !l.contains("config_error")),
        "{}",
        r.stderr
    );
}

/// `PINGUARD_STRICT=1` in the node configuration file makes a bad value there fail closed too.
#[test]
fn strict_mode_from_the_node_file_fails_closed() {
    let dir = fresh_dir("strict-node").join("etc");
    std::fs::create_dir(&dir).unwrap();
    let file = dir.join("node.conf");
    std::fs::write(&file, "PINGUARD_STRICT=1\nPINGUARD_BUDGET=12 parsecs\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let conf = file.to_str().unwrap();
    let r = run(
        "scenario",
        &["cuda_alloc:4096"],
        &[("PINGUARD_CONFIG", conf)],
    );
    assert_eq!(r.rc("cuda_alloc:4096"), 2, "{}", r.stderr);
    assert_eq!(
        refusal_reasons(&r.typed_report()),
        vec![Some(Limit::ConfigError)]
    );
    // The environment's good budget fixes it: the file's strict switch stays, nothing is refused.
    let r = run(
        "scenario",
        &["cuda_alloc:4096"],
        &[("PINGUARD_CONFIG", conf), ("PINGUARD_BUDGET", "1Mi")],
    );
    assert_eq!(r.rc("cuda_alloc:4096"), 0, "{}", r.stderr);
}

/// Issue 46 item 15: each level `PINGUARD_LOG` accepts says more than the one below it: `debug`
/// adds the settings in force (once, at start-up: nothing per call), and `pinguard=trace`, a
/// level pinguard writes nothing at, is refused with the levels it has.
#[test]
fn debug_says_more_than_info_and_trace_is_refused() {
    let lines = |level: &str| {
        let r = run(
            "scenario",
            &["mlock:0:1"],
            &[("PINGUARD_LOG", level), ("PINGUARD_BUDGET", "1Mi")],
        );
        assert!(r.success(), "{level}: {}", r.stderr);
        pinguard_lines(&r.stderr)
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
    };
    let info = lines("info");
    let debug = lines("debug");
    assert!(!info.iter().any(|l| l.contains(": debug: ")), "{info:?}");
    let settings: Vec<_> = debug
        .iter()
        .filter(|l| l.contains(": debug: settings: budget 1048576 bytes, policy error"))
        .collect();
    assert_eq!(settings.len(), 1, "{debug:?}");
    assert!(debug.len() > info.len(), "{debug:?} vs {info:?}");
    let refused = lines("pinguard=trace");
    assert!(
        refused.iter().any(|l| l.contains("PINGUARD_LOG")
            && l.contains("pinguard=trace")
            && l.contains("error, warn, info, debug")
            && l.contains("using warn")),
        "{refused:?}"
    );
    assert!(
        !refused.iter().any(|l| l.contains(": debug: ")),
        "{refused:?}"
    );
}

/// Issue 46 item 12: `PINGUARD_REPORT` naming an existing directory means a file in it with the
/// default name (not `DIR.PID` beside it, which `pinguard report DIR` skips); a report that cannot
/// be written where asked goes to `$TMPDIR`, and the exit line says where and why.
#[test]
fn a_directory_means_a_file_in_it_and_an_unwritable_report_goes_to_tmpdir() {
    let base = fresh_dir("report-dir");
    let dir = base.join("existdir");
    std::fs::create_dir(&dir).unwrap();
    let r = run(
        "scenario",
        &["mlock:0:1"],
        &[("PINGUARD_REPORT", dir.to_str().unwrap())],
    );
    assert!(r.success(), "{}", r.stderr);
    let inside = reports_in(&dir);
    assert_eq!(inside.len(), 1, "{}", r.stderr);
    let name = inside[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with("pinguard.scenario.") && name.ends_with(".json"),
        "{name}"
    );
    let beside: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("existdir."))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");

    // Under a regular file: no folder can be made there, not even by root.
    std::fs::write(base.join("afile"), "").unwrap();
    let tmp = base.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let asked = base.join("afile/r.%p.json");
    let r = run(
        "scenario",
        &["mlock:0:1"],
        &[
            ("PINGUARD_REPORT", asked.to_str().unwrap()),
            ("TMPDIR", tmp.to_str().unwrap()),
        ],
    );
    assert!(r.success(), "{}", r.stderr);
    let fell = reports_in(&tmp);
    assert_eq!(fell.len(), 1, "{}", r.stderr);
    assert_eq!(read_report(&fell[0]).totals.live_bytes, 4096);
    let line = pinguard_lines(&r.stderr)
        .into_iter()
        .find(|l| l.contains("at exit"))
        .unwrap_or_else(|| panic!("{}", r.stderr));
    assert!(
        line.contains(&format!("report: {}", fell[0].display()))
            && line.contains("not writable where asked")
            && line.contains("afile/r."),
        "{line}"
    );
}
