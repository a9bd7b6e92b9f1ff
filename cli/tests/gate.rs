//! `pinguard check` as a CI gate (issue 46 items 1 and 2): a folder that several runs wrote into
//! (`run` says so, `check --latest` checks the newest run only), failure lines that name the
//! report file, the process and the top callsite, and a suppressions file.

use crate::common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn pinguard(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pinguard"));
    c.args(args);
    clear_pinguard_env(&mut c);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `pinguard run --report DIR/%e.%p.json [flags] -- scenario OPS...`.
fn run_into(dir: &Path, flags: &[&str], ops: &[&str]) -> Output {
    let f = fixtures();
    let template = dir.join("%e.%p.json");
    let exe = f.dir.join("scenario");
    let mut a = vec![
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--report",
        template.to_str().unwrap(),
    ];
    a.extend_from_slice(flags);
    a.push("--");
    a.push(exe.to_str().unwrap());
    a.extend_from_slice(ops);
    let o = pinguard(&a, &[]);
    assert!(o.status.success(), "{o:?}");
    o
}

/// The reports (not run records) in `dir`.
fn reports(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.ends_with(".json") && !n.starts_with("pinguard-run.")
        })
        .collect();
    v.sort();
    v
}

fn pid_of(report: &Path) -> u32 {
    read_report(report).process.pid
}

const LEAK: &[&str] = &["cuda_alloc:1048576"];
const FIXED: &[&str] = &["cuda_alloc:1048576", "cuda_free:0"];

#[test]
fn a_stale_folder_is_named_and_latest_checks_the_newest_run_only() {
    let dir = fresh_dir("gate-stale").join("ci-pinned");
    let d = dir.to_str().unwrap();
    let first = run_into(&dir, &[], LEAK);
    assert!(
        !err(&first).contains("earlier runs"),
        "a fresh folder: {}",
        err(&first)
    );
    let old = reports(&dir);
    assert_eq!(old.len(), 1);
    let fixed = run_into(&dir, &[], FIXED);
    let notice: Vec<String> = err(&fixed)
        .lines()
        .filter(|l| l.contains("earlier runs"))
        .map(str::to_string)
        .collect();
    assert!(
        notice.len() == 1
            && notice[0].contains("already holds 1 report and 1 run record")
            && notice[0].contains("--latest"),
        "{}",
        err(&fixed)
    );
    // The whole folder: the old report fails the gate, and the line says which file, which
    // process, and where it pinned.
    let o = pinguard(&["check", "--max-live", "0", d], &[]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let line = out(&o);
    let want = format!(
        "pinguard check: 1.00 MiB live pinned bytes exceed --max-live 0 in {} (scenario, pid {}); top callsite 1.00 MiB ",
        old[0].display(),
        pid_of(&old[0])
    );
    assert!(line.starts_with(&want), "{line}\nwant {want}");
    assert!(line.contains("scenario.c:"), "{line}");
    // The newest run alone passes, and says what it left out.
    let o = pinguard(&["check", "--latest", "--max-live", "0", d], &[]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let text = out(&o);
    let first_line = text.lines().next().unwrap_or("");
    assert!(
        first_line.contains("--latest")
            && first_line.contains(&format!("pid {}", pid_of(&reports(&dir)[1])))
            && first_line.contains("1 earlier run left out"),
        "{text}"
    );
    assert!(text.contains("within limits"), "{text}");
    // Reports without a record: runs told apart by their processes' lifetimes.
    let bare = fresh_dir("gate-bare");
    for r in reports(&dir) {
        std::fs::copy(&r, bare.join(r.file_name().unwrap())).unwrap();
    }
    let b = bare.to_str().unwrap();
    assert_eq!(
        pinguard(&["check", "--max-live", "0", b], &[])
            .status
            .code(),
        Some(1)
    );
    let o = pinguard(&["check", "--latest", "--max-live", "0", b], &[]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(out(&o).contains("lifetimes"), "{}", out(&o));
}

#[test]
fn every_failure_line_names_the_file_the_process_and_the_top_callsite() {
    let dir = fresh_dir("gate-named");
    // One process refused, one over the budget under warn, one downgraded: all left 1 MiB live.
    let ops = &["cuda_alloc:1048576", "cuda_alloc:1048576"];
    run_into(&dir, &["--budget", "1536Ki"], ops);
    run_into(&dir, &["--budget", "1536Ki", "--policy", "warn"], ops);
    run_into(&dir, &["--budget", "1536Ki", "--policy", "downgrade"], ops);
    let files = reports(&dir);
    assert_eq!(files.len(), 3);
    let o = pinguard(
        &[
            "check",
            "--max-live",
            "0",
            "--max-peak",
            "0",
            "--max-denied",
            "0",
            "--max-downgraded",
            "0",
            "--max-over-budget",
            "0",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let text = out(&o);
    let lines: Vec<&str> = text.lines().collect();
    for flag in [
        "--max-live",
        "--max-peak",
        "--max-denied",
        "--max-downgraded",
        "--max-over-budget",
    ] {
        assert!(lines.iter().any(|l| l.contains(flag)), "{flag}: {text}");
    }
    for l in &lines {
        let named = files.iter().any(|f| {
            l.contains(&f.display().to_string())
                && l.contains(&format!("scenario, pid {}", pid_of(f)))
        });
        assert!(
            named && l.contains("top callsite") && l.contains("scenario.c:"),
            "a line without its file, process or callsite: {l}\n{text}"
        );
    }
    // Live pinned in three processes: a line each.
    assert_eq!(
        lines.iter().filter(|l| l.contains("--max-live")).count(),
        3,
        "{text}"
    );
}

#[test]
fn suppressions_are_shown_apart_counted_and_an_unused_rule_is_named() {
    let dir = fresh_dir("gate-supp");
    run_into(&dir, &[], LEAK);
    let d = dir.to_str().unwrap();
    let supp = |name: &str, text: &str| {
        let p = dir.parent().unwrap().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let ok = supp(
        "ok.supp",
        "# the weights stay pinned until exit\nlive:*scenario.c:main 2MiB\npinned:no_such_function_anywhere\n",
    );
    let ok_s = ok.to_str().unwrap();
    let check = |args: &[&str], env: &[(&str, &str)]| {
        let mut a = vec!["check", "--max-live", "0"];
        a.extend_from_slice(args);
        a.push(d);
        pinguard(&a, env)
    };
    for o in [
        check(&["--suppressions", ok_s], &[]),
        check(&[], &[("PINGUARD_SUPPRESSIONS", ok_s)]),
    ] {
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        let text = out(&o);
        assert!(
            text.lines().any(|l| l.starts_with(
                "pinguard check: suppressed 1.00 MiB live at 1 callsite (main (scenario.c:"
            ) && l.ends_with(&format!(
                "by `live:*scenario.c:main 2MiB` ({ok_s}:2), within its allowance of 2.00 MiB"
            ))),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "unused suppression `pinned:no_such_function_anywhere` ({ok_s}:3): it matched no callsite"
            )),
            "{text}"
        );
        let summary = text.lines().last().unwrap_or("");
        assert!(
            summary.contains("live 0 B")
                && summary.contains("suppressed: 1.00 MiB live by 1 rule (1 unused suppression)")
                && summary.ends_with("within limits"),
            "{text}"
        );
    }
    // Past its allowance a rule suppresses nothing, and says so.
    let small = supp("small.supp", "live:main 512Ki\n");
    let o = check(&["--suppressions", small.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let text = out(&o);
    assert!(
        text.contains("NOT suppressed: 1.00 MiB live")
            && text.contains("over its allowance of 512 KiB")
            && text.contains("1.00 MiB live pinned bytes exceed --max-live 0 in"),
        "{text}"
    );
    // A bad line: its place, and exit 2.
    let bad = supp("bad.supp", "\nheap:main\n");
    let o = check(&["--suppressions", bad.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        err(&o).contains(&format!("{}:2: unknown kind \"heap\"", bad.display())),
        "{}",
        err(&o)
    );
}
