//! The first stage, `libpinguard-lazy.so` (front/front.c; issue 44 item 8): a process that never
//! pins loads nothing of the library and runs as without a preload; its first pinning call
//! loads the library, which then decides that very call, exit handlers included.

use crate::common;
use common::*;
use std::path::PathBuf;
use std::process::Output;

/// A folder holding the first stage and the library this run tests side by side, as a release
/// unpacks them: the stage loads `libpinguard.so` from its own folder.
fn stage() -> PathBuf {
    let lib = fixtures().lib.clone();
    let name = "libpinguard-lazy.so";
    if lib.file_name().is_some_and(|n| n == name) {
        return lib; // the whole suite run through a stage (.ci/run): its folder holds both
    }
    let lazy = [
        lib.with_file_name(name),
        lib.parent().unwrap().with_file_name(name),
    ]
    .into_iter()
    .chain(lib.parent().and_then(|d| d.parent()).map(|d| d.join(name)))
    .find(|p| p.exists())
    .unwrap_or_else(|| {
        panic!(
            "{name} is missing beside {}: build.rs builds it",
            lib.display()
        )
    });
    let dir = fresh_dir("front-stage");
    std::os::unix::fs::symlink(&lib, dir.join("libpinguard.so")).unwrap();
    std::os::unix::fs::symlink(&lazy, dir.join(name)).unwrap();
    dir.join(name)
}

/// The test programs, built once per run (tests run at once: a program being written cannot be
/// started), under names of this module's own.
fn prog(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let dir = fixtures().dir.join("front");
        std::fs::create_dir_all(&dir).unwrap();
        for p in ["idle", "lazy_stage", "handler_first", "stage_dlopen"] {
            let out = dir.join(p);
            let src = root().join(format!("tests/progs/{p}.c"));
            cc(&[
                "-O1",
                "-o",
                &out.to_string_lossy(),
                &src.to_string_lossy(),
                "-ldl",
            ]);
        }
        dir
    });
    dir.join(name)
}

/// Runs `path` in a fresh folder with `preload`; the output and the files left there (paths).
fn run_in(
    path: &std::path::Path,
    preload: Option<&PathBuf>,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Output, Vec<PathBuf>) {
    let dir = fresh_dir("front-run");
    let mut cmd = program(path, preload.map(|p| p.as_os_str()));
    cmd.current_dir(&dir).args(args);
    clear_pinguard_env(&mut cmd);
    cmd.envs(env.iter().copied());
    let out = run_bounded(&mut cmd, std::time::Duration::from_secs(60));
    let files = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    (out, files)
}

fn named(files: &[PathBuf], prefix: &str, suffix: &str) -> Option<PathBuf> {
    files
        .iter()
        .find(|f| {
            f.file_name().is_some_and(|n| {
                n.to_string_lossy().starts_with(prefix) && n.to_string_lossy().ends_with(suffix)
            })
        })
        .cloned()
}

#[test]
fn a_process_that_never_pins_runs_as_without_and_loads_nothing_of_the_library() {
    let idle = prog("idle");
    let lazy = stage();
    let (without, _) = run_in(&idle, None, &[], &[]);
    let (with, files) = run_in(&idle, Some(&lazy), &[], &[]);
    assert_eq!(with.status.code(), without.status.code(), "{with:?}");
    assert_eq!(String::from_utf8_lossy(&with.stderr), "", "no line");
    assert!(files.is_empty(), "{files:?}");
    let out = String::from_utf8_lossy(&with.stdout);
    assert!(
        out.contains("libpinguard-lazy.so"),
        "the stage is mapped: {out}"
    );
    assert!(
        !out.contains("/libpinguard.so"),
        "malloc, a signal, a fork and dlopen loaded the library: {out}"
    );
    let facts = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with("Threads:") || l.starts_with("fd "))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        facts(&out),
        facts(&String::from_utf8_lossy(&without.stdout))
    );
}

#[test]
fn the_first_pinning_call_loads_the_library_which_decides_it() {
    let p = prog("lazy_stage");
    let lazy = stage();
    for how in ["lock", "map"] {
        let (out, files) = run_in(
            &p,
            Some(&lazy),
            &["4194304", how],
            &[
                ("PINGUARD_BUDGET", "1MiB"),
                ("PINGUARD_REPORT", "r.%p.json"),
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{how}: {out:?}");
        assert!(
            stdout.contains("before: library 0"),
            "{how}: an unlocked mapping loaded it: {stdout}"
        );
        // The kernel's own answers: ENOMEM for mlock, EAGAIN for a mapping it cannot lock.
        let refused = if how == "map" {
            "lock: -1 errno 11"
        } else {
            "lock: -1 errno 12"
        };
        assert!(
            stdout.contains(refused),
            "{how}: refused over the budget: {stdout}"
        );
        assert!(stdout.contains("after: library 1"), "{how}: {stdout}");
        assert!(stderr.contains("1 denied"), "{how}: {stderr}");
        assert!(named(&files, "r.", ".json").is_some(), "{how}: {files:?}");
    }
}

/// The stage takes the library's place among the exit handlers at the program's start: a handler
/// the program registered before its first pin runs before the report (which then holds nothing
/// live), as when the library itself is preloaded.
#[test]
fn an_exit_handler_registered_before_the_first_pin_runs_before_the_report() {
    let p = prog("lazy_stage");
    let lazy = stage();
    let (out, files) = run_in(
        &p,
        Some(&lazy),
        &["65536", "lock"],
        &[("PINGUARD_REPORT", "r.%p.json")],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("lock: 0 errno 0"),
        "{out:?}"
    );
    let report = named(&files, "r.", ".json").unwrap_or_else(|| panic!("{files:?} {out:?}"));
    let rep = read_report(&report);
    assert_eq!(
        rep.totals.live_bytes, 0,
        "the handler's munlock came first: {rep:?}"
    );
    assert_eq!(rep.totals.peak_live_bytes, 65536, "{rep:?}");
}

/// Without the library beside it, the stage says so once and the program runs untracked.
#[test]
fn a_stage_without_its_library_says_so_and_the_program_runs() {
    let p = prog("lazy_stage");
    let dir = fresh_dir("front-alone");
    let lazy = dir.join("libpinguard-lazy.so");
    std::fs::copy(stage().canonicalize().unwrap(), &lazy).unwrap();
    let (out, _) = run_in(&p, Some(&lazy), &["65536", "lock"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("lock: 0 errno 0"),
        "{out:?}"
    );
    assert_eq!(
        stderr.matches("running WITHOUT pinguard").count(),
        1,
        "{stderr}"
    );
}

fn exports(lib: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("nm (binutils)");
    assert!(out.status.success(), "{out:?}");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(|n| n.split('@').next().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// Every call the library takes must reach it through the stage: the same exports, plus the
/// record the library reads (`pinguard_front`).
#[test]
fn the_stage_exports_every_name_the_library_exports() {
    let lazy = stage();
    let lib = lazy.with_file_name("libpinguard.so");
    let mut want = exports(&lib);
    want.push("pinguard_front".to_string());
    want.sort();
    assert_eq!(exports(&lazy), want);
}

/// The node file's early settings (a report signal, an interval, a group) load the library at
/// start exactly when the library would act on them: the value not blank, the last line naming a
/// setting deciding it, a line judged whole however long, the whole file read up to the
/// library's 64 KiB, and a larger file ignored, as the library ignores it.
#[test]
fn the_node_file_loads_the_library_at_start_exactly_when_the_library_reads_a_setting_there() {
    let idle = prog("idle");
    let lazy = stage();
    let dir = fresh_dir("front-node");
    let comments = |n: usize| "# a comment line of the node file\n".repeat(n / 34 + 1);
    let cases: Vec<(&str, String, bool)> = vec![
        ("plain", "PINGUARD_INTERVAL=60s\n".into(), true),
        (
            "spaced",
            "  PINGUARD_INTERVAL\t= 60s # a minute\n".into(),
            true,
        ),
        ("blank", "PINGUARD_INTERVAL=\n".into(), false),
        ("a comment", "  # PINGUARD_INTERVAL=60s\n".into(), false),
        ("blank but a CR", "PINGUARD_INTERVAL= \t\r\n".into(), false),
        ("CRLF", "PINGUARD_INTERVAL = \t60s\r\n".into(), true),
        (
            "last wins",
            "PINGUARD_GROUP=pods\nPINGUARD_GROUP=\n".into(),
            false,
        ),
        (
            "other names",
            "PINGUARD_INTERVALS=1\nPINGUARD_GROUP_BUDGET=1G\nX=PINGUARD_SIGNAL=USR2\n".into(),
            false,
        ),
        ("no newline", "PINGUARD_SIGNAL=USR2".into(), true),
        (
            "long line",
            format!("{}PINGUARD_SIGNAL=USR2\n", " ".repeat(3000)),
            true,
        ),
        (
            "past 16 KiB",
            format!("{}PINGUARD_INTERVAL=60s\n", comments(20_000)),
            true,
        ),
        (
            "over 64 KiB",
            format!("PINGUARD_INTERVAL=60s\n{}", comments(70_000)),
            false,
        ),
    ];
    for (name, text, loads) in cases {
        let file = dir.join(name.replace(' ', "-"));
        std::fs::write(&file, &text).unwrap();
        let (out, _) = run_in(
            &idle,
            Some(&lazy),
            &[],
            &[("PINGUARD_CONFIG", &file.to_string_lossy())],
        );
        let maps = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            maps.contains("/libpinguard.so"),
            loads,
            "{name}: the library loaded at start: {}\n{}",
            !loads,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A name of the C library first called in a signal handler (`munmap`, `_exit`) reaches the C
/// library: the stage finds it then without the loader's lock or a call.
#[test]
fn the_first_call_of_a_c_library_name_in_a_signal_handler_reaches_it() {
    let p = prog("handler_first");
    let (without, _) = run_in(&p, None, &[], &[]);
    let (with, files) = run_in(&p, Some(&stage()), &[], &[]);
    assert_eq!(without.status.code(), Some(7), "{without:?}");
    assert_eq!(with.status.code(), Some(7), "{with:?}");
    assert_eq!(String::from_utf8_lossy(&with.stdout), "munmap 0\n");
    assert_eq!(String::from_utf8_lossy(&with.stderr), "");
    assert!(files.is_empty(), "{files:?}");
}

/// The stage needs no object but the C library: each NEEDED is loaded into every process, pin or
/// not (a libdl.so.2 cost about 45 us per exec), so dlopen and its kin are looked up at the load.
#[test]
fn the_stage_needs_the_c_library_alone() {
    let out = std::process::Command::new("readelf")
        .args(["-d", &stage().canonicalize().unwrap().to_string_lossy()])
        .output()
        .unwrap();
    let needed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .map(|l| {
            l.rsplit('[')
                .next()
                .unwrap()
                .trim_end_matches(']')
                .to_string()
        })
        .collect();
    assert_eq!(needed, ["libc.so.6"]);
}

/// A stage a program opens itself (not a preload) finds `dlopen` in the program's scope and loads
/// the library at its first pinning call, which the library then counts.
#[test]
fn a_stage_opened_with_dlopen_loads_the_library_at_its_first_pin() {
    let p = prog("stage_dlopen");
    // Not resolved: the folder the stage is opened from is the one it loads the library from.
    let lazy = stage();
    let (out, files) = run_in(
        &p,
        None,
        &[&lazy.to_string_lossy()],
        &[("PINGUARD_REPORT", "r.%p.json")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout, "mlock 0 munlock 0 library 1\n", "{out:?}");
    let report = named(&files, "r.", ".json").unwrap_or_else(|| panic!("{files:?} {out:?}"));
    let rep = read_report(&report);
    assert_eq!(api_stats(&rep, "mlock").alloc_count, 1, "{rep:?}");
}
