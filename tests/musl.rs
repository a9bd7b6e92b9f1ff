//! musl processes: the library, built against glibc, loads into a program linked with musl and
//! stands down there, so the program runs exactly as without it (docs/internals.md, "musl
//! processes"). Needs `musl-gcc` (Debian's musl-tools; `.ci/run` installs it).

use crate::common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `tests/progs/musl_prog.c` built with `musl-gcc` into `dir`, dynamic or static.
fn build(dir: &Path, static_link: bool) -> PathBuf {
    let out = dir.join(if static_link { "prog-static" } else { "prog" });
    let mut cmd = Command::new("musl-gcc");
    cmd.args(["-O1", "-Wall", "-o"]).arg(&out);
    cmd.arg(root().join("tests/progs/musl_prog.c"));
    if static_link {
        cmd.arg("-static");
    }
    let o = cmd.output().expect("musl-gcc");
    assert!(o.status.success(), "musl-gcc: {o:?}");
    out
}

/// Every file a run left in `dir`, with its contents.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// Runs `prog` in a fresh directory (with the library preloaded when `preload`), asking for
/// reports and the interval snapshots there: what pinguard would write if it ran.
fn run_in_fresh(prog: &Path, preload: bool) -> (i32, String, String, BTreeMap<String, Vec<u8>>) {
    let dir = fresh_dir(if preload { "musl-with" } else { "musl-without" });
    let mut cmd = command_in(prog, &dir, preload);
    cmd.arg("out.txt")
        .env("PINGUARD_REPORT", dir.join("report.%p.json"))
        .env("PINGUARD_INTERVAL", "100ms")
        .env("PINGUARD_SIGNAL", "SIGUSR1");
    let out = run_bounded(&mut cmd, std::time::Duration::from_secs(30));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        files(&dir),
    )
}

#[test]
fn a_musl_program_runs_identically_with_the_library_preloaded() {
    if aarch64() || !have("musl-gcc", "builds the musl programs") {
        return;
    }
    let dir = fresh_dir("musl-build");
    for static_link in [false, true] {
        let prog = build(&dir, static_link);
        let without = run_in_fresh(&prog, false);
        assert_eq!(without.0, 7, "the program itself: {without:?}");
        assert!(without.1.contains("mlock 0 munlock 0"), "{without:?}");
        assert_eq!(without.2, "a line on stderr\n");
        let with = run_in_fresh(&prog, true);
        assert_eq!(
            with, without,
            "static {static_link}: (rc, stdout, stderr, files) with the library preloaded, then without"
        );
    }
}

/// The musl loader's libc: the interpreter a musl-gcc program names.
fn musl_libc(prog: &Path) -> PathBuf {
    let o = Command::new("readelf")
        .arg("-l")
        .arg(prog)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let interp = text
        .lines()
        .find_map(|l| l.split("interpreter: ").nth(1))
        .expect("a dynamic musl program names its loader");
    PathBuf::from(interp.trim_end_matches(']').trim())
}

/// Why a musl loader would fail every program: a file it cannot find (a `DT_NEEDED` other than
/// libc, which musl takes as itself) or a strong undefined symbol musl's libc does not define
/// (musl ignores symbol versions).
#[test]
fn the_library_asks_a_musl_loader_for_nothing_it_lacks() {
    if aarch64() || !have("musl-gcc", "builds the musl programs") {
        return;
    }
    let f = fixtures();
    let dir = fresh_dir("musl-syms");
    let libc = musl_libc(&build(&dir, false));
    let nm = |args: &[&str], file: &Path| {
        let o = Command::new("nm").args(args).arg(file).output().unwrap();
        assert!(o.status.success(), "nm {args:?} {}: {o:?}", file.display());
        String::from_utf8(o.stdout).unwrap()
    };
    let defined: std::collections::BTreeSet<String> = nm(&["-D", "--defined-only"], &libc)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    let missing: Vec<String> = nm(&["-D", "--undefined-only"], &f.lib)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (kind, name) = (w.next()?, w.next()?);
            let name = name.split('@').next()?;
            (kind == "U" && !defined.contains(name)).then(|| name.to_string())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "strong imports musl's libc ({}) lacks: {missing:?}",
        libc.display()
    );
    let o = Command::new("readelf")
        .arg("-d")
        .arg(&f.lib)
        .output()
        .unwrap();
    let needed: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
        .collect();
    assert!(
        needed.iter().all(|n| n.starts_with("libc.")),
        "files a musl loader must find besides libc: {needed:?}"
    );
}
