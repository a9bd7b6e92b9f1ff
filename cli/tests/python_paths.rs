//! Python callsites through one helper (issue 34, item 3): `cuda_pin`, called from a loader, a
//! cache and a warm-up, is three callsites in `run`, `report` and `diff`, each named by the frames
//! that tell it from the others; a call the budget refuses or downgrades shows its stack in
//! `report` as a live one does. The real `pinguard` runs a real CPython under the real library,
//! pinning through the emulated runtime (tests/progs/py_paths.py).

use crate::common;

use common::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn pinguard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn script() -> PathBuf {
    root().join("tests/progs/py_paths.py")
}

/// `function (py_paths.py:N)`, N the line of the `# at:function` marker.
fn at(function: &str) -> String {
    let text = std::fs::read_to_string(script()).unwrap();
    let line = text
        .lines()
        .position(|l| l.ends_with(&format!("# at:{function}")))
        .unwrap_or_else(|| panic!("no marker {function}"))
        + 1;
    format!("{function} (py_paths.py:{line})")
}

/// The name `run`, `report` and `diff` give the callsite `caller` reaches `cuda_pin` from.
fn through(caller: &str) -> String {
    format!("{} <- {}", at("cuda_pin"), at(caller))
}

/// `pinguard run` of the script with `cache` cache entries, reports into a fresh directory.
fn run_script(tag: &str, cache: u32, flags: &[&str]) -> (String, String, PathBuf) {
    let f = fixtures();
    let dir = fresh_dir(tag);
    let template = dir.join("%e.%p.json");
    let (cache, script, rt) = (cache.to_string(), script(), f.dir.join("libcudart.so"));
    let mut a = vec![
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--report",
        template.to_str().unwrap(),
    ];
    a.extend_from_slice(flags);
    a.extend_from_slice(&[
        "--",
        "python3",
        script.to_str().unwrap(),
        rt.to_str().unwrap(),
        &cache,
    ]);
    let o = pinguard(&a);
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("done"), "{out}\n{err}");
    (out, err, dir)
}

/// The table rows after the line holding `header`, up to the first empty line.
fn rows_after<'a>(text: &'a str, header: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| !l.contains(header))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect()
}

#[test]
fn one_helper_called_from_three_places_is_three_named_callsites_in_run_report_and_diff() {
    if !have("python3", "a CPython program pinning through ctypes") {
        return;
    }
    let (out, err, dir) = run_script("py-paths-old", 2, &["--budget", "4M"]);
    assert!(
        out.contains("refused: cudaHostAlloc of 67108864 bytes: error 2"),
        "{out}"
    );
    let callers = ["load_weights", "fill_cache", "warm_up", "grow_cache"];

    // `run`'s summary: a row per path, each named by the caller that tells it apart.
    let rows = rows_after(&err, "Top callsites:");
    for caller in callers {
        let n = rows
            .iter()
            .filter(|r| r.ends_with(&through(caller)))
            .count();
        assert_eq!(
            n, 1,
            "one row for the path through {caller} in run's summary:\n{err}"
        );
    }

    // `report`: the same rows, and a block with the whole stack for each, the refused one too.
    let o = pinguard(&["report", dir.to_str().unwrap()]);
    let (rep, _) = text(&o);
    assert!(o.status.success(), "{rep}");
    let header = rep.lines().find(|l| l.contains("CALLSITE")).expect(&rep);
    let rows = rows_after(&rep, "CALLSITE");
    for caller in callers {
        let row = rows
            .iter()
            .find(|r| r.ends_with(&through(caller)))
            .unwrap_or_else(|| panic!("no row for {caller}:\n{rep}"));
        let denied = &row[..header.find("DENIED").unwrap() + "DENIED".len()];
        assert_eq!(
            denied.split_whitespace().last(),
            Some(if caller == "grow_cache" { "1" } else { "0" }),
            "{row}"
        );
    }
    let refused = rep
        .find("1 call refused for 64.0 MiB (nothing live) from 1 process, through cudaHostAlloc:")
        .expect(&rep);
    let block = &rep[refused..];
    let block = &block[..block[1..].find("\n\n").map_or(block.len(), |i| i + 1)];
    let py_paths = script().display().to_string();
    let line = |f: &str| {
        at(f)
            .rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches(')')
            .to_string()
    };
    for (i, f) in ["cuda_pin", "grow_cache"].iter().enumerate() {
        let want = format!("    #{i} {f} {py_paths}:{}\n", line(f));
        assert!(
            block.contains(&want),
            "the refused call's Python stack ({want:?}):\n{block}"
        );
    }
    assert!(
        block.contains("  native:\n    #0 0x"),
        "and its native stack:\n{block}"
    );

    // `report --json`: the name, and every frame of each path.
    let o = pinguard(&["report", "--json", dir.to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let sites = v["callsites"].as_array().unwrap();
    for caller in callers {
        let s = sites
            .iter()
            .find(|s| s["label"] == through(caller).as_str())
            .unwrap_or_else(|| panic!("no {caller}: {v:#}"));
        let py: Vec<&str> = s["py_frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["symbol"].as_str().unwrap())
            .collect();
        assert_eq!(py, ["cuda_pin", caller, "<module>"], "{s:#}");
    }

    // `diff`: the cache grew by two entries, and only the cache's path is said to have grown.
    let (_, _, new) = run_script("py-paths-new", 4, &["--budget", "4M"]);
    let o = pinguard(&["diff", dir.to_str().unwrap(), new.to_str().unwrap()]);
    let (d, _) = text(&o);
    assert!(o.status.success(), "{d}");
    let changed = rows_after(&d, "CALLSITE");
    assert_eq!(changed.len(), 1, "one callsite changed:\n{d}");
    assert!(
        changed[0].ends_with(&through("fill_cache"))
            && changed[0].contains("512 KiB -> 1.00 MiB")
            && changed[0].contains("grew"),
        "{d}"
    );
    let o = pinguard(&[
        "diff",
        "--fail-on-growth",
        "0",
        dir.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    let (e, _) = text(&o);
    assert!(
        o.status.code() == Some(1)
            && e.contains(&format!(
                "pinguard diff: {}: live pinned bytes grew by +512 KiB",
                through("fill_cache")
            )),
        "{e}"
    );
}

#[test]
fn a_downgraded_call_shows_its_python_stack_in_report() {
    if !have("python3", "a CPython program pinning through ctypes") {
        return;
    }
    let (out, _, dir) = run_script(
        "py-paths-downgrade",
        2,
        &["--budget", "4M", "--policy", "downgrade"],
    );
    assert!(!out.contains("refused"), "downgraded, not refused: {out}");
    let o = pinguard(&["report", dir.to_str().unwrap()]);
    let (rep, _) = text(&o);
    assert!(o.status.success(), "{rep}");
    let at_block = rep.find("1 call downgraded").expect(&rep);
    let block = &rep[at_block..];
    let end = block.find("\n\n").unwrap_or(block.len());
    assert!(
        block[..end].contains("    #1 grow_cache ") && block[..end].contains("  native:\n"),
        "{rep}"
    );
}

#[test]
fn a_callsite_that_holds_memory_and_was_refused_says_both() {
    if !have("python3", "a CPython program pinning through ctypes") {
        return;
    }
    // 1 MiB of weights and 12 cache entries of 256 KiB fill the 4 MiB: the 13th is refused, and
    // so are the warm-up's and the growth's calls after it.
    let (out, _, dir) = run_script("py-paths-full", 16, &["--budget", "4M"]);
    assert!(out.contains("cache full"), "{out}");
    let o = pinguard(&["report", dir.to_str().unwrap()]);
    let (rep, _) = text(&o);
    assert!(o.status.success(), "{rep}");
    let head = "3145728 bytes (3.00 MiB) in 12 allocations from 1 process, through cudaHostAlloc:\n  and 1 call refused for 256 KiB\n  Python:\n    #0 cuda_pin ";
    let at_block = rep.find(head).expect(&rep);
    assert!(
        rep[at_block..]
            .lines()
            .nth(4)
            .is_some_and(|l| l.starts_with("    #1 fill_cache ")),
        "{rep}"
    );
    let refused: Vec<&str> = rep.split("\n\n").filter(|b| b.starts_with("1 call refused for ") && b.contains(" (nothing live) from 1 process, through cudaHostAlloc:\n  Python:\n    #0 cuda_pin ")).collect();
    for caller in ["warm_up", "grow_cache"] {
        let n = refused
            .iter()
            .filter(|b| {
                b.lines()
                    .nth(3)
                    .is_some_and(|l| l.starts_with(&format!("    #1 {caller} ")))
            })
            .count();
        assert_eq!(n, 1, "{caller}: {rep}");
    }
    let rows = rows_after(&rep, "CALLSITE");
    assert_eq!(rows.len(), 4, "{rep}");
}

#[test]
fn interpreter_frames_fold_into_one_line_and_all_frames_shows_them() {
    if !have("python3", "a CPython program pinning through ctypes") {
        return;
    }
    let (_, _, dir) = run_script("py-paths-interp", 2, &[]);
    let o = pinguard(&["report", dir.to_str().unwrap()]);
    let (rep, _) = text(&o);
    assert!(o.status.success(), "{rep}");
    // The binding's frames stay (they say how Python reached the runtime); CPython's own go.
    assert!(rep.contains(" in ffi_call "), "{rep}");
    assert!(!rep.contains("_PyEval_EvalFrameDefault"), "{rep}");
    let folded: Vec<&str> = rep
        .lines()
        .filter(|l| l.contains("CPython interpreter frames folded (--all-frames shows them)"))
        .collect();
    assert_eq!(folded.len(), 4, "one line per Python block: {rep}");
    let n: u32 = folded[0]
        .trim_start()
        .trim_start_matches("... ")
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect(folded[0]);
    assert!(n >= 5, "{rep}");
    let o = pinguard(&["report", "--all-frames", dir.to_str().unwrap()]);
    let (all, _) = text(&o);
    assert!(o.status.success(), "{all}");
    assert!(
        all.contains("_PyEval_EvalFrameDefault") && !all.contains("frames folded"),
        "{all}"
    );
}
