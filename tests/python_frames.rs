//! Python callsites: each callsite carries the calling thread's Python stack, read without the
//! GIL (ctypes releases it), on every CPython 3.11, 3.12 and 3.13 found here (pyenv's, and
//! `python3.1x` on PATH).

use crate::common;
use common::*;
use pinguard_common::Callsite;
use std::path::PathBuf;
use std::process::Command;

/// (version, interpreter) for each of 3.11, 3.12, 3.13 that can be found.
fn pythons() -> Vec<(String, PathBuf)> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(out) = Command::new("pyenv").arg("root").output() {
        let root = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if let Ok(dir) = std::fs::read_dir(root.join("versions")) {
            let mut v: Vec<PathBuf> = dir
                .filter_map(|e| e.ok())
                .map(|e| e.path().join("bin/python3"))
                .collect();
            v.sort();
            candidates.extend(v);
        }
    }
    for minor in 11..=13 {
        candidates.push(PathBuf::from(format!("python3.{minor}")));
    }
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    for c in candidates {
        let Ok(out) = Command::new(&c)
            .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
            .output()
        else {
            continue;
        };
        let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success()
            && ["3.11", "3.12", "3.13"].contains(&v.as_str())
            && !found.iter().any(|(f, _)| *f == v)
        {
            found.push((v, c));
        }
    }
    found.sort();
    found
}

/// The line of the `# at:NAME` marker in the script.
fn marker(name: &str) -> u64 {
    let text = std::fs::read_to_string(root().join("tests/progs/py_frames.py")).unwrap();
    text.lines()
        .position(|l| l.contains(&format!("# at:{name}")))
        .unwrap_or_else(|| panic!("no marker {name}")) as u64
        + 1
}

fn py(c: &Callsite) -> Vec<(String, String, u64)> {
    c.py_frames
        .iter()
        .map(|f| {
            (
                f.symbol.clone().unwrap_or_default(),
                f.file.clone().unwrap_or_default(),
                f.line.map_or(0, u64::from),
            )
        })
        .collect()
}

/// The symbol of a callsite's innermost native frame.
fn native_symbol(c: &Callsite) -> Option<&str> {
    c.frames.first().and_then(|f| f.symbol.as_deref())
}

fn sites_at<'a>(rep: &'a Report, function: &str) -> Vec<&'a Callsite> {
    rep.callsites
        .iter()
        .filter(|c| py(c).first().is_some_and(|f| f.0 == function))
        .collect()
}

fn run_script(python: &std::path::Path, env: &[(&str, &str)]) -> Run {
    let f = fixtures();
    let script = root().join("tests/progs/py_frames.py");
    let r = run(
        python.to_str().unwrap(),
        &[
            script.to_str().unwrap(),
            f.dir.join("libcudart.so").to_str().unwrap(),
            f.dir.join("libframework.so").to_str().unwrap(),
        ],
        env,
    );
    assert!(
        r.success() && r.stdout.contains("done"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    r
}

#[test]
fn callsites_name_the_python_code_on_every_version_found() {
    let found = pythons();
    if found.is_empty() {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "no CPython 3.11, 3.12 or 3.13 found"
        );
        eprintln!("SKIPPED: no CPython 3.11, 3.12 or 3.13 found");
        return;
    }
    eprintln!(
        "CPython versions tested: {:?}",
        found.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    for (version, python) in &found {
        let r = run_script(python, &[]);
        let rep = r.typed_report();
        let ctx = format!("CPython {version}: {:#?}", rep.callsites);
        assert_eq!(rep.config.py_depth, 32, "{ctx}");

        // The runtime through dlsym(handle), and libc's mlock through the global scope.
        for (function, api) in [("load_weights", "cudaHostAlloc"), ("lock_key", "mlock")] {
            let s = sites_at(&rep, function);
            assert_eq!(s.len(), 1, "{function}: {ctx}");
            let frames = py(s[0]);
            assert!(
                frames[0].1.ends_with("py_frames.py") && frames[0].2 == marker(function),
                "{function}: {frames:?} ({ctx})"
            );
            assert_eq!(frames[1].0, "<module>", "{ctx}");
            assert_eq!(s[0].apis.first().map(String::as_str), Some(api), "{ctx}");
        }
        // Two Python threads through a native library: the function, then the thread's target.
        let batches = sites_at(&rep, "pin_batch");
        assert_eq!(
            batches.iter().map(|c| c.alloc_count).sum::<u64>(),
            8,
            "{ctx}"
        );
        for c in &batches {
            let frames = py(c);
            assert_eq!(frames[0].2, marker("pin_batch"), "{ctx}");
            assert_eq!(frames[1].0, "loader_thread", "{ctx}");
            assert!(
                frames
                    .iter()
                    .any(|f| f.0 == "Thread.run" && f.1.ends_with("threading.py")),
                "{frames:?}"
            );
            assert_eq!(native_symbol(c), Some("framework_pin"), "{ctx}");
        }
        // A recursion deeper than the limit is cut at PINGUARD_PY_DEPTH frames.
        let deep = sites_at(&rep, "recurse");
        assert_eq!(deep.len(), 1, "{ctx}");
        let frames = py(deep[0]);
        assert_eq!(frames.len(), 32, "{ctx}");
        assert!(frames.iter().all(|f| f.0 == "recurse"), "{frames:?}");
        assert_eq!(frames[0].2, marker("recurse"), "{ctx}");
        // A native thread in a Python process: no Python frames.
        let native: Vec<&Callsite> = rep
            .callsites
            .iter()
            .filter(|c| c.alloc_bytes == 20480)
            .collect();
        assert_eq!(native.len(), 1, "{ctx}");
        assert!(native[0].py_frames.is_empty(), "{ctx}");
        assert_eq!(native_symbol(native[0]), Some("framework_pin"), "{ctx}");

        // PINGUARD_PY_DEPTH=0: no Python frames anywhere, the same figures.
        let off = run_script(python, &[("PINGUARD_PY_DEPTH", "0")]).typed_report();
        assert!(
            off.callsites.iter().all(|c| c.py_frames.is_empty()),
            "{version}: {:#?}",
            off.callsites
        );
        assert_eq!(off.totals.alloc_count, rep.totals.alloc_count);
    }
}

#[test]
fn a_process_without_python_gets_no_python_frames() {
    let r = run("scenario", &["cuda_alloc:4096", "mlock:0:1"], &[]);
    assert!(r.success(), "{}", r.stderr);
    let rep = r.typed_report();
    assert!(
        rep.callsites.iter().all(|c| c.py_frames.is_empty()),
        "{:#?}",
        rep.callsites
    );
    assert_eq!(
        pinguard_lines(&r.stderr).len(),
        1,
        "only the summary line: {}",
        r.stderr
    );
}

#[test]
fn the_warn_line_names_the_python_function() {
    let Some((version, python)) = pythons().into_iter().next() else {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "no CPython 3.11, 3.12 or 3.13 found"
        );
        eprintln!("SKIPPED: no CPython 3.11, 3.12 or 3.13 found");
        return;
    };
    // The 1 MiB of load_weights goes over 512 KiB, and so does every later call, each callsite
    // named once: through the runtime, and through libc's mlock (whose line waits until the
    // locked-page view is let go).
    let r = run_script(
        &python,
        &[("PINGUARD_BUDGET", "512K"), ("PINGUARD_POLICY", "warn")],
    );
    let warnings: Vec<_> = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("over the budget"))
        .collect();
    for (api, size, function) in [
        ("cudaHostAlloc", "1.00 MiB", "load_weights"),
        ("mlock", "4.00 KiB", "lock_key"),
    ] {
        let want = format!("{api} of {size} goes over the budget of 512 KiB at {function} (py_frames.py:{}) <- <module> (py_frames.py:{});", marker(function), marker(&format!("call:{function}")));
        let n = warnings.iter().filter(|l| l.contains(&want)).count();
        assert_eq!(
            n, 1,
            "CPython {version}: want one line with\n  {want}\nin\n{}",
            r.stderr
        );
    }
}

/// Issue 34, item 3, the library's half: one helper reached from four callers is four callsites,
/// each with its whole Python stack, the refused call's (the program's out-of-memory error) too.
/// The merge and the names are the CLI's (cli/tests/python_paths.rs).
#[test]
fn one_helper_from_four_callers_is_four_callsites_each_with_its_whole_stack() {
    let Some((version, python)) = pythons().into_iter().next() else {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "no CPython 3.11, 3.12 or 3.13 found"
        );
        eprintln!("SKIPPED: no CPython 3.11, 3.12 or 3.13 found");
        return;
    };
    let script = root().join("tests/progs/py_paths.py");
    let line = |name: &str| {
        let text = std::fs::read_to_string(&script).unwrap();
        text.lines()
            .position(|l| l.ends_with(&format!("# at:{name}")))
            .unwrap() as u64
            + 1
    };
    let rt = fixtures().dir.join("libcudart.so");
    let r = run(
        python.to_str().unwrap(),
        &[script.to_str().unwrap(), rt.to_str().unwrap()],
        &[("PINGUARD_BUDGET", "4M")],
    );
    assert!(
        r.success()
            && r.stdout
                .contains("refused: cudaHostAlloc of 67108864 bytes: error 2"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    let rep = r.typed_report();
    let ctx = format!("CPython {version}: {:#?}", rep.callsites);
    let sites = sites_at(&rep, "cuda_pin");
    assert_eq!(sites.len(), 4, "{ctx}");
    for (caller, allocs, denied) in [
        ("load_weights", 1, 0),
        ("fill_cache", 2, 0),
        ("warm_up", 1, 0),
        ("grow_cache", 0, 1),
    ] {
        let s: Vec<_> = sites
            .iter()
            .filter(|c| py(c).get(1).is_some_and(|f| f.0 == caller))
            .collect();
        assert_eq!(s.len(), 1, "{caller}: {ctx}");
        let frames = py(s[0]);
        let want = [
            ("cuda_pin", line("cuda_pin")),
            (caller, line(caller)),
            ("<module>", 0),
        ];
        assert_eq!(frames.len(), 3, "{caller}: {ctx}");
        for (f, (name, at)) in frames.iter().zip(want) {
            assert!(
                f.0 == name && f.1.ends_with("py_paths.py") && (at == 0 || f.2 == at),
                "{caller}: {frames:?}"
            );
        }
        assert_eq!(
            (s[0].alloc_count, s[0].denied_count),
            (allocs, denied),
            "{caller}: {ctx}"
        );
        assert!(
            !s[0].frames.is_empty(),
            "{caller}: the native stack too: {ctx}"
        );
    }
}

/// The `warn` line of a Python callsite names its caller too: the three paths through one helper
/// are three lines that say which path each is (the report names each by as many callers as it
/// takes; the line, written inside the call, by one).
#[test]
fn the_warn_line_names_the_python_caller_of_a_shared_helper() {
    let Some((version, python)) = pythons().into_iter().next() else {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "no CPython 3.11, 3.12 or 3.13 found"
        );
        eprintln!("SKIPPED: no CPython 3.11, 3.12 or 3.13 found");
        return;
    };
    let script = root().join("tests/progs/py_paths.py");
    let at = |name: &str| {
        let text = std::fs::read_to_string(&script).unwrap();
        format!(
            "{name} (py_paths.py:{})",
            text.lines()
                .position(|l| l.ends_with(&format!("# at:{name}")))
                .unwrap()
                + 1
        )
    };
    let rt = fixtures().dir.join("libcudart.so");
    let r = run(
        python.to_str().unwrap(),
        &[script.to_str().unwrap(), rt.to_str().unwrap()],
        &[("PINGUARD_BUDGET", "32K"), ("PINGUARD_POLICY", "warn")],
    );
    assert!(
        r.success() && r.stdout.contains("done"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    let warnings: Vec<_> = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("over the budget"))
        .collect();
    for caller in ["load_weights", "fill_cache", "warm_up", "grow_cache"] {
        let want = format!(" at {} <- {};", at("cuda_pin"), at(caller));
        let n = warnings.iter().filter(|l| l.contains(&want)).count();
        assert_eq!(
            n, 1,
            "CPython {version}: want one line with\n  {want}\nin\n{}",
            r.stderr
        );
    }
}
