//! The `pinguard` command end to end: real programs under the real library, then the reports read
//! back through every subcommand, and every kind of bad input.

use crate::common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
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

/// `pinguard run` of a fixture program, reports into a fresh directory.
fn run_under(prog: &str, args: &[&str], flags: &[&str]) -> (Output, PathBuf) {
    let f = fixtures();
    let dir = fresh_dir(&format!("cli-{prog}"));
    let template = dir.join("%e.%p.json");
    let exe = f.dir.join(prog);
    let mut a: Vec<&str> = vec![
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--report",
        template.to_str().unwrap(),
    ];
    a.extend_from_slice(flags);
    a.push("--");
    a.push(exe.to_str().unwrap());
    a.extend_from_slice(args);
    (pinguard(&a), dir)
}

/// The cell of a right-aligned column in a table row: what ends where the header's name ends
/// (sizes such as "6.81 MiB" hold a space, so whitespace does not split columns).
fn cell<'a>(header: &str, row: &'a str, name: &str) -> &'a str {
    let end = header
        .find(&format!(" {name}"))
        .map(|i| i + 1 + name.len())
        .or_else(|| header.starts_with(name).then_some(name.len()));
    let end = end.unwrap_or_else(|| panic!("no column {name} in {header:?}"));
    row[..end.min(row.len())].rsplit(' ').next().unwrap()
}

fn no_panic(o: &Output) {
    let (_, err) = text(o);
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
}

#[test]
fn run_passes_the_exit_status_and_summarises_every_process() {
    let f = fixtures();
    let scenario = f.dir.join("scenario");
    let (o, dir) = run_under(
        "family",
        &[scenario.to_str().unwrap(), "mlock:0:2"],
        &["--budget", "1M"],
    );
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    assert!(err.contains("3 reports under"), "{err}");
    assert_eq!(reports_in(&dir).len(), 3);
    for p in reports_in(&dir) {
        let pid = read_report(&p).process.pid;
        assert!(
            err.contains(&pid.to_string()),
            "pid {pid} missing from the summary:\n{err}"
        );
    }
    assert!(err.contains("1.00 MiB"), "the budget is shown: {err}");
    // The command's own exit status comes back.
    let (o, _) = run_under("scenario", &["bogus_op"], &[]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "scenario exits 2 on an unknown op"
    );
    // In a folder of their own: each run leaves its folder (pinguard-reports/...) where it runs.
    let cwd = fresh_dir("run-status");
    let in_cwd = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_pinguard"))
            .args(args)
            .current_dir(&cwd)
            .output()
            .unwrap()
    };
    let o = in_cwd(&[
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "exit 7",
    ]);
    assert_eq!(o.status.code(), Some(7));
    let o = in_cwd(&[
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "kill -TERM $$",
    ]);
    assert_eq!(o.status.code(), Some(128 + 15));
    // Bad flags: one message, exit 2.
    for bad in [
        &["run", "--budget", "lots", "--", "true"][..],
        &["run", "--policy", "panic", "--", "true"],
        &["run", "--depth", "999", "--", "true"],
        &["run", "--lib", "/nope.so", "--", "true"],
    ] {
        let o = pinguard(bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
        no_panic(&o);
    }
}

#[test]
fn report_merges_processes_and_shows_callsites_lsan_style() {
    let (_, a) = run_under("workload", &[], &["--budget", "3M"]);
    let (_, b) = run_under("workload", &[], &["--budget", "3M"]);
    let o = pinguard(&["report", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let (out, _) = text(&o);
    assert!(out.contains("(2 reports, 2 processes)"), "{out}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("cudaHostAlloc") && l.contains("load_model_weights"))
        .collect();
    assert!(!rows.is_empty(), "{out}");
    // Merged by frames, not addresses (ASLR moved them): one row, both processes, 4 MiB.
    let header = out.lines().find(|l| l.contains("CALLSITE")).unwrap();
    assert!(
        rows[0].starts_with("4.00 MiB") && cell(header, rows[0], "PROCS") == "2",
        "{}",
        rows[0]
    );
    assert!(
        out.contains(
            "4194304 bytes (4.00 MiB) in 4 allocations from 2 processes, through cudaHostAlloc:"
        ),
        "{out}"
    );
    assert!(
        out.contains("#0 0x")
            && out.contains("in load_model_weights")
            && out.contains("workload.c:"),
        "{out}"
    );
    assert!(out.contains("SUMMARY: pinguard: 5898240 bytes (5.62 MiB) pinned in 10 allocations across 2 processes"), "{out}");
    // Aligned columns: every table row has its LIVE column right-aligned to the header's width.
    let header = out
        .lines()
        .find(|l| l.contains("LIVE") && l.contains("CALLSITE"))
        .unwrap();
    let api_col = header.find("API").unwrap();
    for l in out
        .lines()
        .skip_while(|l| !l.contains("CALLSITE"))
        .skip(1)
        .take_while(|l| !l.is_empty())
    {
        assert_eq!(&l[api_col - 2..api_col], "  ", "misaligned row: {l:?}");
    }
    let o = pinguard(&["report", "--top", "1", a.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(out.contains("... 5 more callsites"), "{out}");
    let o = pinguard(&["report", "--json", a.to_str().unwrap(), b.to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["processes"], 2);
    assert_eq!(v["totals"]["live_bytes"], 2 * 2949120);
    assert_eq!(v["callsites"][0]["processes"], 2);
    assert_eq!(v["callsites"][0]["live_bytes"], 4194304);
}

/// A callsite of a synthetic report: its frames as (symbol, file, line), live and peak bytes.
type SynthSite<'a> = (&'a [(&'a str, &'a str, u32)], u64, u64);

/// A report built by hand: the fields a test needs.
fn synthetic(
    dir: &Path,
    name: &str,
    pid: u32,
    sites: &[SynthSite],
    live: u64,
    denied: u64,
    downgraded: u64,
) -> PathBuf {
    let callsites: Vec<Value> = sites
        .iter()
        .enumerate()
        .map(|(i, (frames, live, peak))| {
            serde_json::json!({
                "id": i, "apis": ["cudaHostAlloc"], "live_bytes": live, "live_count": 1, "peak_live_bytes": peak,
                "alloc_count": 1, "alloc_bytes": peak, "denied_count": 0, "downgraded_count": 0,
                "frames": frames.iter().enumerate().map(|(j, (s, f, l))| serde_json::json!({
                    "addr": format!("{:#x}", 0x400000 + pid as u64 * 0x1000 + j as u64), "module": "/bin/app",
                    "offset": "0x10", "symbol": s, "file": f, "line": l})).collect::<Vec<_>>()
            })
        })
        .collect();
    let r = serde_json::json!({
        "schema": "pinguard.report.v1", "reason": "exit",
        "process": {"pid": pid, "ppid": 1, "exe": "/bin/app", "cmdline": ["app"], "hostname": "h", "start_unix_ms": 1000, "write_unix_ms": 2000},
        "config": {"budget_bytes": null, "policy": "error", "depth": 32, "hooks": ["cuda"], "errors": []},
        "totals": {"live_bytes": live, "live_count": 1, "peak_live_bytes": live, "alloc_count": 1, "alloc_bytes": live,
                   "release_count": 0, "failed_count": 0, "denied_count": denied, "denied_bytes": 0, "downgraded_count": downgraded,
                   "downgraded_bytes": 0, "downgraded_live_bytes": 0, "over_budget_count": 0, "unknown_release_count": 0},
        "apis": {}, "kernel": {"vm_lck_bytes": 0, "vm_pin_bytes": 0, "rlimit_memlock_bytes": null},
        "modules": [], "callsites": callsites, "live": [], "events": [], "timeline": [[1000, 0], [1500, live]]
    });
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec(&r).unwrap()).unwrap();
    p
}

#[test]
fn report_demangles_rust_and_cpp_frames() {
    let dir = fresh_dir("mangled");
    let frames: &[(&str, &str, u32)] = &[
        ("_ZN2at6native10pin_memoryERKNS_6TensorE", "pin.cpp", 10),
        ("_ZN7serving5cache4grow17h0123456789abcdefE", "cache.rs", 20),
    ];
    let p = synthetic(
        &dir,
        "m.json",
        7,
        &[(frames, 1 << 20, 1 << 20)],
        1 << 20,
        0,
        0,
    );
    let (out, _) = text(&pinguard(&["report", p.to_str().unwrap()]));
    assert!(
        out.contains("at::native::pin_memory(at::Tensor const&) pin.cpp:10"),
        "{out}"
    );
    assert!(out.contains("serving::cache::grow cache.rs:20"), "{out}");
    assert!(!out.contains("_ZN"), "{out}");
}

#[test]
fn check_gates_on_each_limit() {
    let dir = fresh_dir("check");
    let p = synthetic(&dir, "c.json", 9, &[], 3 << 20, 2, 5);
    let p = p.to_str().unwrap();
    let o = pinguard(&[
        "check",
        "--max-live",
        "4M",
        "--max-denied",
        "2",
        "--max-downgraded",
        "5",
        p,
    ]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(text(&o).0.contains("within limits"));
    let o = pinguard(&[
        "check",
        "--max-live",
        "1M",
        "--max-denied",
        "1",
        "--max-downgraded",
        "5",
        p,
    ]);
    assert_eq!(o.status.code(), Some(1));
    let (out, _) = text(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "one line per violated limit: {out}");
    assert!(lines[0].contains("--max-live") && lines[0].contains("3.00 MiB"));
    assert!(lines[1].contains("2 denied calls exceed --max-denied 1"));
    let o = pinguard(&[
        "check",
        "--max-live",
        "1M",
        "--max-denied",
        "0",
        "--max-downgraded",
        "0",
        p,
    ]);
    assert_eq!(text(&o).0.lines().count(), 3);
    let o = pinguard(&["check", "--max-live", "a lot", p]);
    assert_eq!(o.status.code(), Some(2));
    no_panic(&o);
}

#[test]
fn diff_matches_callsites_by_frames_across_runs() {
    // Two runs of the same program: ASLR moves every address, the frames stay.
    let old = run(
        "scenario",
        &["cuda_alloc:4096", "acl_malloc:8192", "mlock:0:1"],
        &[],
    );
    let new = run(
        "scenario",
        &["cuda_alloc:4096", "cuda_alloc:65536", "mlock:0:1"],
        &[],
    );
    let o = pinguard(&[
        "diff",
        old.report_dir.to_str().unwrap(),
        new.report_dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let (out, _) = text(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[1].trim_start().starts_with("+64.0 KiB")
            && lines[1].contains("4.00 KiB -> 68.0 KiB")
            && lines[1].contains("grew"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("-8.00 KiB") && l.contains("gone")),
        "{out}"
    );
    assert!(
        !out.lines()
            .any(|l| l.contains("mlock") || l.contains("new")),
        "unchanged callsites are left out: {out}"
    );
    assert!(
        out.contains("SUMMARY: live pinned bytes 16.0 KiB -> 72.0 KiB (+56.0 KiB)"),
        "{out}"
    );
}

fn parse_svg(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap();
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(&text, opts)
        .unwrap_or_else(|e| panic!("{} is not well-formed XML: {e}", p.display()));
    text
}

#[test]
fn flamegraph_and_plot_draw_well_formed_svg() {
    let (_, a) = run_under("workload", &[], &["--budget", "3M"]);
    let out = a.join("flame.svg");
    for metric in ["live", "peak", "allocs"] {
        let o = pinguard(&[
            "flamegraph",
            "--metric",
            metric,
            "-o",
            out.to_str().unwrap(),
            a.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{o:?}");
        let svg = parse_svg(&out);
        assert!(svg.contains("load_model_weights"), "{metric}");
        assert_eq!(
            svg.contains("pin_batches"),
            metric != "live",
            "{metric}: pin_batches holds nothing live"
        );
    }
    let dir = fresh_dir("plot");
    let p1 = synthetic(&dir, "p1.json", 11, &[], 1 << 20, 0, 0);
    let p2 = synthetic(&dir, "p2.json", 12, &[], 2 << 20, 0, 0);
    // Edits the file as written (JSON), keeping every key the types would not.
    let mut r: Value = read_json(&p2);
    r["config"]["budget_bytes"] = (3u64 << 20).into();
    std::fs::write(&p2, serde_json::to_vec(&r).unwrap()).unwrap();
    let svg_path = dir.join("plot.svg");
    let o = pinguard(&[
        "plot",
        "-o",
        svg_path.to_str().unwrap(),
        p1.to_str().unwrap(),
        p2.to_str().unwrap(),
        a.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let svg = parse_svg(&svg_path);
    assert!(
        svg.contains("app (pid 11") && svg.contains("app (pid 12") && svg.contains("workload (pid"),
        "{svg}"
    );
    assert!(svg.contains("budget 3.00 MiB"), "the budget line");
    assert_eq!(svg.matches("<path ").count(), 3);
    // Point 9: round ticks in the unit shown, and time since each process's start unless the
    // wall clock is asked for.
    assert!(svg.contains("time since process start"), "{svg}");
    for tick in [">1 MiB<", ">2 MiB<", ">3 MiB<"] {
        assert!(svg.contains(tick), "{tick} missing: {svg}");
    }
    assert!(
        !svg.contains(".76 MiB<") && !svg.contains(".52 MiB<"),
        "{svg}"
    );
    let o = pinguard(&[
        "plot",
        "--wall-clock",
        "-o",
        svg_path.to_str().unwrap(),
        p1.to_str().unwrap(),
        a.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let svg = parse_svg(&svg_path);
    assert!(
        svg.contains("wall-clock time") && !svg.contains("time since process start"),
        "{svg}"
    );
}

#[test]
fn bad_input_gets_one_line_and_exit_2() {
    let dir = fresh_dir("bad");
    let empty_dir = dir.join("empty");
    std::fs::create_dir(&empty_dir).unwrap();
    let good = synthetic(&dir, "good.json", 5, &[], 4096, 0, 0);
    let mut cases: Vec<(PathBuf, &str)> = vec![
        (dir.join("missing.json"), "no such file"),
        (empty_dir.clone(), "no pinguard reports"),
    ];
    let mut write = |name: &str, bytes: &[u8], why: &'static str| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        cases.push((p, why));
    };
    write("empty.json", b"", "empty file");
    let full = std::fs::read(&good).unwrap();
    write("truncated.json", &full[..full.len() / 2], "not valid JSON");
    write(
        "other.json",
        br#"{"schema": "heaptrack.v3", "x": 1}"#,
        "not supported",
    );
    write(
        "future.json",
        br#"{"schema": "pinguard.report.v2"}"#,
        "newer pinguard",
    );
    write(
        "binary.json",
        &[0x7f, b'E', b'L', b'F', 0, 1, 2, 0xff, 0xfe],
        "not valid JSON",
    );
    write(
        "shape.json",
        br#"{"schema": "pinguard.report.v1", "totals": 3}"#,
        "malformed report",
    );
    for (p, why) in &cases {
        for cmd in [
            &["report"][..],
            &["check", "--max-live", "1G"],
            &["plot", "-o", "/dev/null"],
            &["flamegraph", "-o", "/dev/null"],
        ] {
            let mut args: Vec<&str> = cmd.to_vec();
            args.push(p.to_str().unwrap());
            let o = pinguard(&args);
            assert_eq!(o.status.code(), Some(2), "{args:?}");
            let (_, err) = text(&o);
            no_panic(&o);
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.contains(p.to_str().unwrap()) && err.contains(why),
                "{args:?}: {err}"
            );
        }
    }
    let o = pinguard(&["diff", cases[2].0.to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    // --keep-going: the bad file is named, the good one is still read.
    let o = pinguard(&[
        "report",
        "--keep-going",
        cases[3].0.to_str().unwrap(),
        good.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let (out, err) = text(&o);
    assert!(
        err.contains("truncated.json") && out.contains("4096 bytes"),
        "{out}\n{err}"
    );
    let o = pinguard(&["report", "--keep-going", cases[3].0.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "nothing readable at all");
    let o = pinguard(&["report"]);
    assert_eq!(o.status.code(), Some(2));
    let o = pinguard(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

/// A `churn` process in group `name` with one more setting, once it has pinned (its first line).
fn group_member(name: &str, setting: (&str, &str)) -> std::process::Child {
    use std::io::{BufRead, BufReader};
    let f = fixtures();
    let mut holder = Command::new(f.dir.join("churn"))
        .env("LD_PRELOAD", &f.lib)
        .env("PINGUARD_GROUP", name)
        .env(setting.0, setting.1)
        .env("PINGUARD_REPORT", fresh_dir("top").join("r.%p.json"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // The pipe stays open while the member runs: dropping the reader would close it under churn.
    std::mem::forget(out);
    holder
}

#[test]
fn top_shows_a_group_and_a_metrics_directory() {
    let name = format!("clitop-{}", std::process::id());
    let ledger = pinguard_common::group::path(&name);
    let _ = std::fs::remove_file(&ledger);
    let mut holder = group_member(&name, ("PINGUARD_GROUP_BUDGET", "1M"));
    let o = pinguard(&["top", "--group", &name, "--once"]);
    assert!(o.status.success(), "{o:?}");
    let (text_out, _) = text(&o);
    assert!(
        text_out.starts_with(&format!("group {name}: ")) && text_out.contains("of 1.00 MiB"),
        "{text_out}"
    );
    assert!(
        text_out.lines().next().unwrap().ends_with(", 1 member"),
        "{text_out}"
    );
    let row = text_out
        .lines()
        .find(|l| l.trim_start().starts_with(&holder.id().to_string()))
        .unwrap_or_else(|| panic!("{text_out}"));
    assert!(
        row.contains("churn") && (row.contains("64.0 KiB") || row.contains("68.0 KiB")),
        "{row}"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    let (text_out, _) = text(&pinguard(&["top", "--group", &name, "--once"]));
    assert!(
        text_out.contains("gone"),
        "a SIGKILLed member shows as gone: {text_out}"
    );
    remove_semaphores(&ledger);
    let _ = std::fs::remove_file(&ledger);

    let dir = fresh_dir("topm");
    let m = dir.join("m.%p.prom");
    // Metrics files live as long as their processes: two that pinned and wait.
    let a = Held::start(
        &fresh_dir("topm-a"),
        &["cuda_alloc:8192"],
        &[("PINGUARD_METRICS", m.to_str().unwrap())],
    );
    let b = Held::start(
        &fresh_dir("topm-b"),
        &["cuda_alloc:65536"],
        &[
            ("PINGUARD_METRICS", m.to_str().unwrap()),
            ("PINGUARD_BUDGET", "128K"),
        ],
    );
    until("both metrics files", || {
        [a.pid(), b.pid()]
            .iter()
            .all(|p| dir.join(format!("m.{p}.prom")).exists())
    });
    let o = pinguard(&["top", "--metrics", dir.to_str().unwrap(), "--once"]);
    a.finish();
    b.finish();
    assert!(o.status.success(), "{o:?}");
    let (text_out, _) = text(&o);
    let rows: Vec<&str> = text_out
        .lines()
        .filter(|l| l.contains("scenario"))
        .collect();
    assert_eq!(rows.len(), 2, "{text_out}");
    assert!(
        text_out
            .lines()
            .next()
            .unwrap()
            .ends_with("pinned in 2 processes"),
        "{text_out}"
    );
    assert!(
        rows[0].contains("64.0 KiB") && rows[0].contains("50%"),
        "sorted by pinned bytes, with budget use: {text_out}"
    );
    assert!(rows[1].contains("8.00 KiB"), "{text_out}");
    let o = pinguard(&["top", "--group", "no-such-group-xyz", "--once"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(text(&o).1.lines().count(), 1);
    no_panic(&o);
}

/// Gives callsite `i` of a synthetic report these Python frames (function, file, line).
fn with_py_frames(p: &Path, i: usize, frames: &[(&str, &str, u32)]) {
    // Edits the file as written (JSON), keeping every key the types would not.
    let mut r: Value = read_json(p);
    r["callsites"][i]["py_frames"] = frames
        .iter()
        .map(|(s, f, l)| serde_json::json!({"addr": "0x0", "module": f, "offset": null, "symbol": s, "file": f, "line": l}))
        .collect::<Vec<_>>()
        .into();
    std::fs::write(p, serde_json::to_vec(&r).unwrap()).unwrap();
}

#[test]
fn sort_peak_shows_the_stacks_of_callsites_freed_before_exit() {
    let dir = fresh_dir("peak-stacks");
    let loader: &[(&str, &str, u32)] = &[("load_batch", "loader.c", 40), ("main", "main.c", 9)];
    let warm: &[(&str, &str, u32)] = &[("warm_up", "warm.c", 12), ("main", "main.c", 7)];
    let p = synthetic(
        &dir,
        "freed.json",
        41,
        &[(loader, 0, 6 << 20), (warm, 0, 1 << 20)],
        0,
        0,
        0,
    );
    let o = pinguard(&["report", "--sort", "peak", p.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(o.status.success(), "{out}");
    let head = "6291456 bytes (6.00 MiB) at peak, nothing live; 1 allocation from 1 process, through cudaHostAlloc:\n    #0 ";
    let at = out.find(head).expect(&out);
    assert!(out[at + head.len()..].starts_with("0x"), "{out}");
    assert!(
        out[at..]
            .lines()
            .nth(1)
            .unwrap()
            .contains("in load_batch loader.c:40"),
        "{out}"
    );
    let warm_at = out
        .find("1048576 bytes (1.00 MiB) at peak, nothing live")
        .expect(&out);
    assert!(warm_at > at, "by peak, the largest first: {out}");
    // Sorted by live bytes, nothing is held and nothing was refused: no stack, as before.
    let o = pinguard(&["report", p.to_str().unwrap()]);
    assert!(
        !text(&o).0.contains("at peak, nothing live"),
        "{}",
        text(&o).0
    );
}

#[test]
fn python_frames_come_first_match_across_runs_and_reach_the_flame_graph() {
    let dir = fresh_dir("py-frames");
    // Two runs: the same Python line pins through different native paths (another library
    // version, the interpreter's specialisation), and a second Python line only in the new run.
    let native_old: &[(&str, &str, u32)] = &[
        (
            "at::cuda::CachingHostAllocator::allocate",
            "CachingHostAllocator.cpp",
            200,
        ),
        ("THPVariable_pin_memory", "python_variable_methods.cpp", 80),
    ];
    let native_new: &[(&str, &str, u32)] = &[
        ("at::cuda::HostAllocator::allocate", "HostAllocator.cpp", 90),
        ("THPVariable_pin_memory", "python_variable_methods.cpp", 81),
    ];
    let old = synthetic(
        &dir,
        "old.json",
        21,
        &[(native_old, 1 << 20, 1 << 20)],
        1 << 20,
        0,
        0,
    );
    let new = synthetic(
        &dir,
        "new.json",
        22,
        &[
            (native_new, 3 << 20, 3 << 20),
            (native_new, 1 << 20, 1 << 20),
        ],
        4 << 20,
        0,
        0,
    );
    let batch = [
        ("pin_batch", "/srv/train.py", 57u32),
        ("main", "/srv/train.py", 90),
    ];
    with_py_frames(&old, 0, &batch);
    with_py_frames(&new, 0, &batch);
    with_py_frames(
        &new,
        1,
        &[
            ("load_weights", "/srv/train.py", 12),
            ("main", "/srv/train.py", 88),
        ],
    );

    let o = pinguard(&["report", new.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("pin_batch (train.py:57)") && out.contains("load_weights (train.py:12)"),
        "Python names the callsites: {out}"
    );
    let py = out
        .find("  Python:\n    #0 pin_batch /srv/train.py:57")
        .expect(&out);
    let native = out
        .find("in at::cuda::HostAllocator::allocate")
        .expect(&out);
    assert!(py < native, "Python frames first: {out}");

    let o = pinguard(&["diff", old.to_str().unwrap(), new.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(o.status.success(), "{out}");
    let grew = out
        .lines()
        .find(|l| l.contains("pin_batch (train.py:57)"))
        .expect(&out);
    assert!(
        grew.contains("1.00 MiB -> 3.00 MiB") && grew.contains("grew"),
        "one callsite across runs, matched by its Python frames: {out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("load_weights (train.py:12)") && l.contains("new")),
        "{out}"
    );
    assert!(
        !out.contains("gone"),
        "the old native path is not a callsite of its own: {out}"
    );

    let svg = dir.join("flame.svg");
    let o = pinguard(&[
        "flamegraph",
        "-o",
        svg.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let text = parse_svg(&svg);
    assert!(
        text.contains("pin_batch [py]")
            && text.contains("main [py]")
            && text.contains("at::cuda::HostAllocator::allocate"),
        "{text}"
    );
}

/// `pinguard run --downgrade-match` scopes `downgrade` as `PINGUARD_DOWNGRADE_MATCH` does: the
/// framework's call is downgraded, the program's own refused, and the report lists the scope.
#[test]
fn run_scopes_downgrade_to_the_callsites_given() {
    let (o, dir) = run_under(
        "scope",
        &["framework:1048576", "direct:1048576"],
        &[
            "--budget",
            "4K",
            "--policy",
            "downgrade",
            "--downgrade-match",
            "framework_pin",
        ],
    );
    assert!(o.status.success(), "{o:?}");
    let (out, _) = text(&o);
    assert!(
        out.contains("framework:1048576 rc=0") && out.contains("direct:1048576 rc=2"),
        "{out}"
    );
    let reports = reports_in(&dir);
    assert_eq!(reports.len(), 1);
    let rep = read_report(&reports[0]);
    assert_eq!(
        rep.config.downgrade_match,
        Some(vec!["framework_pin".to_string()])
    );
    assert_eq!(rep.totals.downgraded_count, 1);
    assert_eq!(rep.totals.denied_count, 1);
}

/// Issue 17, point 1: under `warn`, going over the budget shows wherever denied and downgraded
/// calls do: `run`'s table and total, `report`'s table and summary, and `check` gates on it.
#[test]
fn over_budget_calls_show_everywhere_and_check_gates_on_them() {
    let (o, dir) = run_under("workload", &[], &["--budget", "3M", "--policy", "warn"]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    let header = err
        .lines()
        .find(|l| l.trim_start().starts_with("PID  EXE"))
        .unwrap_or_else(|| panic!("{err}"));
    let row = err.lines().find(|l| l.contains(" workload ")).unwrap();
    assert_eq!(cell(header, row, "OVER-BUDGET"), "1", "{header}\n{row}");
    let header = err
        .lines()
        .find(|l| l.contains("CALLSITE"))
        .unwrap_or_else(|| panic!("{err}"));
    let row = err
        .lines()
        .skip_while(|l| !l.contains("CALLSITE"))
        .find(|l| l.contains("grow_kv_cache"))
        .unwrap();
    assert_eq!(cell(header, row, "OVER-BUDGET"), "1", "{header}\n{row}");
    assert!(
        err.contains("0 denied, 0 downgraded, 1 over budget."),
        "{err}"
    );
    let (out, _) = text(&pinguard(&["report", dir.to_str().unwrap()]));
    let header = out.lines().find(|l| l.contains("CALLSITE")).unwrap();
    let row = out.lines().find(|l| l.contains("grow_kv_cache")).unwrap();
    assert_eq!(cell(header, row, "OVER-BUDGET"), "1", "{row}");
    let row = out
        .lines()
        .find(|l| l.contains("load_model_weights") && !l.contains('#'))
        .unwrap();
    assert_eq!(cell(header, row, "OVER-BUDGET"), "0", "{row}");
    assert!(out.contains("0 downgraded (0 B), 1 over budget;"), "{out}");
    let d = dir.to_str().unwrap();
    let o = pinguard(&["check", "--max-over-budget", "0", d]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    // Where, too: the file, the process and the top callsite (issue 46 item 1).
    let line = text(&o).0;
    assert!(
        line.trim()
            .starts_with("pinguard check: 1 call over the budget exceeds --max-over-budget 0 in ")
            && line.contains(", pid ")
            && line.contains("); top callsite "),
        "{line}"
    );
    let o = pinguard(&["check", "--max-over-budget", "1", d]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(text(&o).0.contains("1 report, 1 process: live 6.81 MiB, 0 denied, 0 downgraded, 1 over budget: within limits"), "{o:?}");
    let o = pinguard(&["check", "--max-over-budget", "-1", d]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).1.contains("negative counts are not allowed"),
        "{o:?}"
    );
}

/// Point 4: a folder scan skips what is not a pinguard report, naming it; a file named on the
/// command line that is not a report is still an error, and so is a damaged report in a folder.
#[test]
fn a_folder_scan_skips_other_files_and_reads_the_reports() {
    let dir = fresh_dir("mixed");
    synthetic(&dir, "app.1.json", 1, &[], 4096, 0, 0);
    std::fs::write(
        dir.join("config.json"),
        br#"{"model": "llama", "batch": 8}"#,
    )
    .unwrap();
    std::fs::write(dir.join("notes.json"), b"not json at all").unwrap();
    let d = dir.to_str().unwrap();
    for cmd in [
        &["report"][..],
        &["check", "--max-live", "1G"],
        &["plot", "-o", "/dev/null"],
    ] {
        let mut args = cmd.to_vec();
        args.push(d);
        let o = pinguard(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
        let (_, err) = text(&o);
        assert_eq!(err.lines().count(), 2, "{args:?}: {err}");
        assert!(
            err.contains("config.json: not a pinguard report; skipped"),
            "{err}"
        );
        assert!(
            err.contains("notes.json: not a pinguard report; skipped"),
            "{err}"
        );
    }
    let (out, _) = text(&pinguard(&["report", d]));
    assert!(
        out.contains(
            "SUMMARY: pinguard: 4096 bytes (4.00 KiB) pinned in 1 allocation across 1 process"
        ),
        "{out}"
    );
    let o = pinguard(&["report", dir.join("config.json").to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a file named explicitly stays an error"
    );
    assert!(text(&o).1.contains("not a pinguard report"), "{o:?}");
    std::fs::write(
        dir.join("cut.json"),
        br#"{"schema": "pinguard.report.v1", "reason": "ex"#,
    )
    .unwrap();
    let o = pinguard(&["report", d]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a damaged report is not skipped: {o:?}"
    );
    assert!(text(&o).1.contains("cut.json: not valid JSON"), "{o:?}");
    // A folder of other files only: nothing to read.
    let other = fresh_dir("other-only");
    std::fs::write(other.join("config.json"), b"{}").unwrap();
    let o = pinguard(&["report", other.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(text(&o).1.contains("no readable report"), "{o:?}");
}

/// Point 5: each `run` writes into a folder of its own, and its hint names that folder.
#[test]
fn each_run_gets_its_own_folder_and_its_hint_names_it() {
    let f = fixtures();
    let cwd = fresh_dir("runs");
    let mut folders = Vec::new();
    for _ in 0..2 {
        let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
            .args([
                "run",
                "--lib",
                f.lib.to_str().unwrap(),
                "--",
                f.dir.join("workload").to_str().unwrap(),
            ])
            .current_dir(&cwd)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        let (_, err) = text(&o);
        let hint = err
            .lines()
            .find(|l| l.contains("Details: pinguard report "))
            .unwrap_or_else(|| panic!("{err}"));
        let folder = hint.rsplit("pinguard report ").next().unwrap().to_string();
        assert!(
            folder.starts_with("pinguard-reports/")
                && folder.ends_with('/')
                && folder.len() > "pinguard-reports/".len() + 1,
            "{hint}"
        );
        assert!(err.contains(&format!("1 report under {folder}")), "{err}");
        let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
            .args(["report", &folder])
            .current_dir(&cwd)
            .output()
            .unwrap();
        assert!(text(&o).0.contains("(1 report, 1 process)"), "{o:?}");
        folders.push(folder);
    }
    assert_ne!(folders[0], folders[1]);
    let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args(["report", "pinguard-reports"])
        .current_dir(&cwd)
        .output()
        .unwrap();
    assert!(text(&o).0.contains("(2 reports, 2 processes)"), "{o:?}");
}

/// Issue 46 item 10: `pinguard run -- ls` in a working tree leaves no `pinguard-reports/` when
/// nothing was recorded (nothing for `git status` to show), and `--quiet` keeps only the summary's
/// total line; a run that pinned keeps its folder as before.
#[test]
fn a_run_that_recorded_nothing_leaves_no_folder_and_quiet_keeps_the_total() {
    let f = fixtures();
    let cwd = fresh_dir("no-folder");
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
            .args(["run", "--lib", f.lib.to_str().unwrap()])
            .args(args)
            .current_dir(&cwd)
            .output()
            .unwrap();
        no_panic(&o);
        o
    };
    let o = run(&["--", "ls"]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    assert!(
        !cwd.join("pinguard-reports").exists(),
        "a folder for a run that recorded nothing: {err}"
    );
    assert!(
        err.contains("pinguard run: no reports: ls exited with status 0")
            && err.contains("no folder left"),
        "{err}"
    );
    // An existing reports folder stays, without an empty run folder in it.
    std::fs::create_dir(cwd.join("pinguard-reports")).unwrap();
    let o = run(&["--quiet", "--", "true"]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    assert_eq!(
        std::fs::read_dir(cwd.join("pinguard-reports"))
            .unwrap()
            .count(),
        0,
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "--quiet: one line: {err}");
    // A run that pinned: its folder stays, and --quiet prints the total line alone of the summary.
    let o = run(&[
        "--quiet",
        "--",
        f.dir.join("scenario").to_str().unwrap(),
        "cuda_alloc:4096",
    ]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    let own: Vec<_> = err
        .lines()
        .filter(|l| !l.starts_with("pinguard[") && !l.trim().is_empty())
        .collect();
    assert_eq!(own.len(), 1, "{err}");
    assert!(
        own[0].starts_with("Total: 4.00 KiB pinned in 1 allocation across 1 process"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(cwd.join("pinguard-reports"))
            .unwrap()
            .count(),
        1,
        "{err}"
    );
}

/// Point 6: sizes say what is wrong with them; a command that is not executable is 126, one that
/// does not exist 127, as in the shell.
#[test]
fn bad_sizes_and_commands_get_their_own_answers() {
    let f = fixtures();
    let lib = f.lib.to_str().unwrap();
    for (args, why) in [
        (
            &["run", "--budget", "-1", "--", "true"][..],
            "negative sizes are not allowed",
        ),
        (
            &["run", "--budget", "1e9", "--", "true"],
            "write the bytes (1000000000) or use a unit",
        ),
        (&["run", "--budget", "12Q", "--", "true"], "unknown unit"),
        (
            &["run", "--signal", "KILL", "--", "true"],
            "cannot be caught safely",
        ),
        (&["run", "--signal", "NOPE", "--", "true"], "unknown signal"),
        (
            &["run", "--downgrade-match", "a[", "--", "true"],
            "bad pattern",
        ),
        (
            &["run", "--lib", lib, "--report", "r/%q.json", "--", "true"],
            "unknown escape \"%q\"; expected a path with %p",
        ),
        (
            &["check", "--max-live", "-5G", "/dev/null"],
            "negative sizes are not allowed",
        ),
    ] {
        let o = pinguard(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let (_, err) = text(&o);
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
        no_panic(&o);
    }
    let o = pinguard(&["run", "--lib", lib, "--", "/etc/passwd"]);
    assert_eq!(o.status.code(), Some(126), "{o:?}");
    assert!(text(&o).1.contains("permission denied"), "{o:?}");
    let o = pinguard(&["run", "--lib", lib, "--", "/nonexistent/prog"]);
    assert_eq!(o.status.code(), Some(127), "{o:?}");
    assert!(text(&o).1.contains("no such file or command"), "{o:?}");
    // The library gives an environment value the same reasons.
    let o = Command::new(f.dir.join("workload"))
        .env("LD_PRELOAD", &f.lib)
        .env("PINGUARD_BUDGET", "1e9")
        .env("PINGUARD_REPORT", fresh_dir("env1e9").join("r.json"))
        .output()
        .unwrap();
    assert!(
        text(&o).1.contains(
            "PINGUARD_BUDGET=\"1e9\": 1e9 is a float's notation; write the bytes (1000000000)"
        ),
        "{o:?}"
    );
}

/// Point 7: every option of every command has a description, and every help states the exit
/// codes.
#[test]
fn every_option_is_described_and_every_help_states_exit_codes() {
    let o = pinguard(&["--help"]);
    let (out, _) = text(&o);
    assert!(
        out.contains("Exit status:") && out.contains("1  `check`: a limit was exceeded"),
        "{out}"
    );
    for cmd in [
        "run",
        "report",
        "check",
        "diff",
        "flamegraph",
        "top",
        "plot",
        "cdi",
        "doctor",
        "metrics-prune",
    ] {
        let (out, _) = text(&pinguard(&[cmd, "--help"]));
        assert!(out.contains("Exit status:"), "{cmd}: {out}");
        let mut in_options = false;
        let lines: Vec<&str> = out.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.ends_with(':') && !l.starts_with(' ') {
                in_options = *l == "Options:" || *l == "Arguments:";
                continue;
            }
            // An entry: "  -o, --output <OUT.svg>  Where ..." or "  <FILES|DIRS>...  Report ..."
            let entry = l.trim_start();
            if !in_options
                || !(entry.starts_with('-') || entry.starts_with('<'))
                || l.starts_with("      ") && !l.trim_start().starts_with("--")
            {
                continue;
            }
            let described = entry.contains("  ")
                || lines
                    .get(i + 1)
                    .is_some_and(|n| n.starts_with("          ") && !n.trim().is_empty());
            assert!(described, "{cmd}: no description for {entry:?}\n{out}");
        }
    }
    let (out, _) = text(&pinguard(&["run", "--help"]));
    assert!(
        out.contains("126") && out.contains("127") && out.contains("0 lets nothing be pinned"),
        "{out}"
    );
}

/// Points 8 and 10: `run`'s callsite table has the PROCS column `report` has, lists without
/// one say when a callsite comes from several processes, and counts take their plural.
#[test]
fn shared_callsites_say_so_and_counts_read_as_written() {
    let f = fixtures();
    let dir = fresh_dir("shared");
    let s = f.dir.join("scenario");
    let twice = format!("{0} cuda_alloc:4096 && {0} cuda_alloc:4096", s.display());
    let t = dir.join("%e.%p.json");
    let o = pinguard(&[
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--report",
        t.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &twice,
    ]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    let header = err
        .lines()
        .find(|l| l.contains("CALLSITE"))
        .unwrap_or_else(|| panic!("{err}"));
    let shared = err
        .lines()
        .skip_while(|l| !l.contains("CALLSITE"))
        .nth(1)
        .unwrap_or_else(|| panic!("{err}"));
    assert_eq!(cell(header, shared, "PROCS"), "2", "{err}");
    assert!(err.contains("2 reports under"), "{err}");
    for o in [
        o.clone(),
        pinguard(&["report", dir.to_str().unwrap()]),
        pinguard(&["check", dir.to_str().unwrap()]),
    ] {
        let (out, err) = text(&o);
        for text in [out, err] {
            assert!(!text.contains("(s)") && !text.contains("(es)"), "{text}");
            assert!(
                !text.contains(" 1 allocations")
                    && !text.contains(" 1 processes")
                    && !text.contains(" 1 reports"),
                "{text}"
            );
        }
    }
    let old = fresh_dir("diff-old");
    let new = fresh_dir("diff-new");
    let frames: &[(&str, &str, u32)] = &[("pin", "workers.py", 4)];
    for (d, live) in [(&old, 1u64 << 20), (&new, 2 << 20)] {
        synthetic(d, "a.json", 10, &[(frames, live, live)], live, 0, 0);
        synthetic(d, "b.json", 11, &[(frames, live, live)], live, 0, 0);
    }
    let (out, _) = text(&pinguard(&[
        "diff",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ]));
    assert!(out.contains("pin (workers.py:4) in 2 processes"), "{out}");
}

/// Issue 21: what the host reserve did shows in `report`, `check` gates on it, and `run` passes
/// `--host-reserve` on (a reserve far below the host's available memory stops nothing).
#[test]
fn the_host_reserve_shows_in_report_check_and_run() {
    let dir = fresh_dir("host");
    let a = synthetic(&dir, "a.json", 21, &[], 4096, 1, 0);
    let b = synthetic(&dir, "b.json", 22, &[], 4096, 2, 0);
    for (p, lowest, stopped) in [(&a, 3u64 << 30, 1u64), (&b, 5 << 30, 2)] {
        // Edits the file as written (JSON), keeping every key the types would not.
        let mut r: Value = read_json(p);
        r["totals"]["host_reserve_count"] = stopped.into();
        r["host"] = serde_json::json!({"reserve_bytes": 4u64 << 30, "total_bytes": 64u64 << 30, "available_bytes": 6u64 << 30,
                                       "lowest_available_bytes": lowest, "readings": 7});
        std::fs::write(p, serde_json::to_vec(&r).unwrap()).unwrap();
    }
    let d = dir.to_str().unwrap();
    let (out, _) = text(&pinguard(&["report", d]));
    assert!(out.contains("0 over budget, 3 calls stopped by the host reserve of 4.00 GiB (lowest available 3.00 GiB);"), "{out}");
    let o = pinguard(&["report", "--json", d]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["host"]["lowest_available_bytes"], 3u64 << 30);
    assert_eq!(v["totals"]["host_reserve_count"], 3);
    let o = pinguard(&["check", "--max-host-reserve", "2", d]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    // Where, too: the file and the process, one line each (issue 46 item 1).
    let line = text(&o).0;
    assert!(
        line.lines().count() == 2
            && line.lines().all(|l| l.starts_with(
                "pinguard check: 3 calls stopped by the host reserve exceed --max-host-reserve 2: "
            ) && l.contains(".json (app, pid ")),
        "{line}"
    );
    assert_eq!(
        pinguard(&["check", "--max-host-reserve", "3", d])
            .status
            .code(),
        Some(0)
    );
    // Without a reserve in any report, nothing is said about one.
    let plain = fresh_dir("host-none");
    let p = synthetic(&plain, "c.json", 23, &[], 4096, 0, 0);
    assert!(!text(&pinguard(&["report", p.to_str().unwrap()]))
        .0
        .contains("host reserve"));

    let (o, dir) = run_under("workload", &[], &["--host-reserve", "1M"]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    assert!(
        err.contains("0 calls stopped by the host reserve of 1.00 MiB (lowest available"),
        "{err}"
    );
    let header = err
        .lines()
        .find(|l| l.trim_start().starts_with("PID  EXE"))
        .unwrap_or_else(|| panic!("{err}"));
    let row = err.lines().find(|l| l.contains(" workload ")).unwrap();
    assert_eq!(cell(header, row, "HOST-RESERVE"), "0", "{header}\n{row}");
    let rep = read_report(&reports_in(&dir)[0]);
    assert_eq!(rep.config.host_reserve_bytes, Some(1 << 20));
    let o = pinguard(&["run", "--host-reserve", "-1G", "--", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).1.contains("negative sizes are not allowed"),
        "{o:?}"
    );
}

/// Issue 21: `pinguard top` shows the host reserve of a group and of metrics files (a reserve far
/// below the host's available memory: nothing stopped).
#[test]
fn top_shows_the_host_reserve() {
    let name = format!("clitophost-{}", std::process::id());
    let ledger = pinguard_common::group::path(&name);
    let _ = std::fs::remove_file(&ledger);
    let mut holder = group_member(&name, ("PINGUARD_HOST_RESERVE", "1M"));
    let (text_out, _) = text(&pinguard(&["top", "--group", &name, "--once"]));
    holder.kill().unwrap();
    holder.wait().unwrap();
    remove_semaphores(&ledger);
    let _ = std::fs::remove_file(&ledger);
    assert!(
        text_out
            .lines()
            .next()
            .unwrap()
            .contains("; host reserve 1.00 MiB, lowest available "),
        "{text_out}"
    );
    let header = text_out
        .lines()
        .find(|l| l.trim_start().starts_with("PID"))
        .unwrap();
    let row = text_out
        .lines()
        .find(|l| l.trim_start().starts_with(&holder.id().to_string()))
        .unwrap_or_else(|| panic!("{text_out}"));
    assert_eq!(cell(header, row, "HOST-RESERVE"), "0", "{text_out}");

    let dir = fresh_dir("topmhost");
    let m = dir.join("m.%p.prom");
    let held = Held::start(
        &fresh_dir("topmhost-a"),
        &["cuda_alloc:8192"],
        &[
            ("PINGUARD_METRICS", m.to_str().unwrap()),
            ("PINGUARD_HOST_RESERVE", "1M"),
        ],
    );
    until("the metrics file", || {
        dir.join(format!("m.{}.prom", held.pid())).exists()
    });
    let (text_out, _) = text(&pinguard(&[
        "top",
        "--metrics",
        dir.to_str().unwrap(),
        "--once",
    ]));
    held.finish();
    assert!(
        text_out
            .lines()
            .next()
            .unwrap()
            .contains("pinned in 1 process; lowest host memory available "),
        "{text_out}"
    );
    let header = text_out
        .lines()
        .find(|l| l.trim_start().starts_with("PID"))
        .unwrap();
    let row = text_out
        .lines()
        .find(|l| l.contains("scenario"))
        .unwrap_or_else(|| panic!("{text_out}"));
    assert_eq!(cell(header, row, "HOST-RESERVE"), "0", "{text_out}");
}

/// Issue 32: a setting the process could not use is impossible to miss. `run` and `report` show
/// it before anything else, `check` fails on it unless told it may pass, the JSON carries it.
#[test]
fn a_setting_that_could_not_be_used_is_shown_first_and_fails_check() {
    let f = fixtures();
    let dir = fresh_dir("cli-config-errors");
    let template = dir.join("%e.%p.json");
    let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args([
            "run",
            "--lib",
            f.lib.to_str().unwrap(),
            "--report",
            template.to_str().unwrap(),
            "--",
        ])
        .arg(f.dir.join("workload"))
        .env("PINGUARD_BUDGET", "8 gigs")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    let summary: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.starts_with("pinguard run:"))
        .collect();
    assert!(
        summary
            .first()
            .is_some_and(|l| l.contains("could not be used") && l.contains("PINGUARD_BUDGET")),
        "{err}"
    );
    let d = dir.to_str().unwrap();
    let (out, _) = text(&pinguard(&["report", d]));
    let first = out.lines().next().unwrap_or("");
    assert!(first.contains("could not be used"), "{out}");
    assert!(
        out.lines()
            .nth(1)
            .is_some_and(|l| l.contains("PINGUARD_BUDGET") && l.contains("8 gigs")),
        "{out}"
    );
    let v: Value = serde_json::from_slice(&pinguard(&["report", "--json", d]).stdout).unwrap();
    let errors = v["config_errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{v}");
    assert!(errors[0]["message"]
        .as_str()
        .unwrap()
        .contains("PINGUARD_BUDGET"));
    let o = pinguard(&["check", d]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let (out, _) = text(&o);
    assert!(
        out.lines()
            .next()
            .is_some_and(|l| l.starts_with("pinguard check: ") && l.contains("PINGUARD_BUDGET")),
        "{out}"
    );
    let o = pinguard(&["check", "--allow-config-errors", d]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(text(&o).0.contains("within limits"));
    // A clean run says nothing of the kind and passes.
    let (o, clean) = run_under("workload", &[], &["--budget", "8Gi"]);
    assert!(
        o.status.success() && !text(&o).1.contains("could not be used"),
        "{o:?}"
    );
    assert_eq!(
        pinguard(&["check", clean.to_str().unwrap()]).status.code(),
        Some(0)
    );
}

/// The run record `run` leaves in its folder (`pinguard-run.<pid>.json`).
fn run_record(dir: &Path) -> Value {
    let recs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("pinguard-run.")
        })
        .collect();
    assert_eq!(
        recs.len(),
        1,
        "one run record in {}: {recs:?}",
        dir.display()
    );
    read_json(&recs[0])
}

/// Issue 34, item 1: a program that pins nothing passes the CI gate `run ... && check DIR`: `run`
/// always leaves its folder, with a record of the run, and `report`, `check` and `diff` read a
/// folder holding only that record; a program that leaks fails the same gate with a limit.
#[test]
fn a_clean_run_leaves_its_folder_with_a_record_and_passes_the_ci_gate() {
    let f = fixtures();
    let dir = fresh_dir("gate-clean").join("out");
    let template = dir.join("%e.%p.json");
    let o = pinguard(&[
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--report",
        template.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "exit 0",
    ]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    assert!(!err.contains("nothing was pinned"), "{err}");
    assert!(dir.is_dir(), "the run's folder is there: {err}");
    let rec = run_record(&dir);
    assert_eq!(rec["schema"], "pinguard.run.v1");
    assert_eq!(rec["command"], serde_json::json!(["sh", "-c", "exit 0"]));
    assert_eq!(rec["exit_status"], 0);
    assert!(rec["signal"].is_null());
    let pid = rec["pid"].as_u64().unwrap();
    assert!(
        pid > 0 && rec["pids_seen"] == serde_json::json!([pid]),
        "{rec}"
    );
    assert!(
        rec["end_unix_ms"].as_u64().unwrap() >= rec["start_unix_ms"].as_u64().unwrap(),
        "{rec}"
    );
    assert_eq!(rec["reports_found"], serde_json::json!([]));
    assert_eq!(rec["no_report"][0]["pid"], pid);
    assert!(
        err.contains(&format!(
            "pid {pid} (sh, the command): exited with status 0;"
        )),
        "{err}"
    );
    let d = dir.to_str().unwrap();
    for gate in [
        &["check", d][..],
        &["check", "--max-live", "0", "--max-denied", "0", d],
    ] {
        let o = pinguard(gate);
        assert_eq!(o.status.code(), Some(0), "{gate:?}: {o:?}");
        assert!(
            text(&o)
                .0
                .contains("pinguard check: 1 run, 0 reports, 0 processes: live 0 B")
                && text(&o).0.contains("within limits"),
            "{o:?}"
        );
        // Without a limit a leak would pass too: the line says what was checked.
        assert_eq!(
            text(&o)
                .0
                .contains("(settings only: no --max-* limit was given)"),
            gate.len() == 2,
            "{o:?}"
        );
    }
    let o = pinguard(&["report", d]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let (out, _) = text(&o);
    assert!(
        out.contains("Run: run of `sh -c exit 0`") && out.contains("exited with status 0"),
        "{out}"
    );
    assert!(
        out.contains(
            "SUMMARY: pinguard: nothing was pinned: no process left a report or state in 1 run"
        ),
        "{out}"
    );
    let o = pinguard(&["diff", d, d]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(text(&o).0.contains("No callsite changed"), "{o:?}");
    let v: Value = serde_json::from_slice(&pinguard(&["report", "--json", d]).stdout).unwrap();
    assert_eq!(v["runs"][0]["pid"], pid, "{v}");

    // The same gate on a program that leaves 4 KiB pinned: the record and the report side by side.
    let (o, leaky) = run_under("scenario", &["cuda_alloc:4096"], &[]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        run_record(&leaky)["reports_found"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let o = pinguard(&[
        "check",
        "--max-live",
        "0",
        "--max-denied",
        "0",
        leaky.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(text(&o).0.contains("exceed --max-live 0"), "{o:?}");
    let (out, _) = text(&pinguard(&["report", leaky.to_str().unwrap()]));
    assert!(
        out.contains("(1 report, 1 process)") && out.contains("1 process left a report"),
        "{out}"
    );
}

/// Issue 34, item 2: `run` never says that nothing was pinned when it does not know. A report
/// folder that cannot be made stops it before the command starts; options that
/// `PINGUARD_DISABLE` would silently void are refused; the rest is said as known.
#[test]
fn run_says_what_it_knows_and_refuses_what_would_not_work() {
    let f = fixtures();
    let lib = f.lib.to_str().unwrap();
    let cwd = fresh_dir("honest");
    let marker = cwd.join("ran");
    let touch = format!("touch {}", marker.display());
    let o = pinguard(&[
        "run",
        "--lib",
        lib,
        "--report",
        "/proc/nonexistent/r.%p.json",
        "--",
        "sh",
        "-c",
        &touch,
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("pinguard run: cannot create the report folder /proc/nonexistent"),
        "{err}"
    );
    assert!(!marker.exists(), "the command ran");

    // PINGUARD_DISABLE=1 in the environment: an option that sets a variable would do nothing.
    for opts in [
        &["--budget", "1M"][..],
        &["--policy", "warn", "--depth", "4"],
    ] {
        let mut args = vec!["run", "--lib", lib];
        args.extend_from_slice(opts);
        args.extend(["--", "sh", "-c", &touch]);
        let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
            .args(&args)
            .env("PINGUARD_DISABLE", "1")
            .current_dir(&cwd)
            .output()
            .unwrap();
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{opts:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(opts[0]) && err.contains("PINGUARD_DISABLE=1 is set"),
            "{opts:?}: {err}"
        );
        assert!(!marker.exists(), "the command ran");
    }
    // Without options it runs, and says that nothing was recorded rather than nothing pinned.
    let scenario = f.dir.join("scenario");
    let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args([
            "run",
            "--lib",
            lib,
            "--",
            scenario.to_str().unwrap(),
            "cuda_alloc:4096",
        ])
        .env("PINGUARD_DISABLE", "1")
        .current_dir(&cwd)
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        !err.contains("nothing was pinned") && err.contains("PINGUARD_DISABLE is set"),
        "{err}"
    );
    let folder = std::fs::read_dir(cwd.join("pinguard-reports"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let o = pinguard(&["check", folder.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "a disabled run checked nothing: {o:?}"
    );
    assert!(text(&o).0.contains("PINGUARD_DISABLE was set"), "{o:?}");
    let (out, _) = text(&pinguard(&["report", folder.to_str().unwrap()]));
    assert!(
        !out.contains("nothing was pinned") && out.contains("nothing was recorded"),
        "{out}"
    );

    // A command that died at start-up: how it ended, and that it left nothing, never "nothing pinned".
    let dir = fresh_dir("honest-died");
    let t = dir.join("%e.%p.json");
    let o = pinguard(&[
        "run",
        "--lib",
        lib,
        "--report",
        t.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "kill -SEGV $$",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(128 + 11), "{err}");
    assert!(
        err.contains("(sh, the command): killed by SIGSEGV; it left no report or state under"),
        "{err}"
    );
    assert!(!err.contains("nothing was pinned"), "{err}");
    assert_eq!(run_record(&dir)["signal"], "SIGSEGV");
    assert!(!err.contains("statically linked"), "{err}");
    // A statically linked program: no loader reads LD_PRELOAD, and `run` says so, before and after.
    if !aarch64() {
        let src = dir.join("st.c");
        std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
        let st = dir.join("st");
        cc(&["-static", "-o", st.to_str().unwrap(), src.to_str().unwrap()]);
        let sdir = fresh_dir("honest-static");
        let t = sdir.join("%e.%p.json");
        let o = pinguard(&[
            "run",
            "--lib",
            lib,
            "--report",
            t.to_str().unwrap(),
            "--",
            st.to_str().unwrap(),
        ]);
        let (_, err) = text(&o);
        assert!(o.status.success(), "{err}");
        assert!(
            err.lines().next().is_some_and(|l| l.contains(
                "st is statically linked: there is no dynamic loader in it to load pinguard"
            )),
            "{err}"
        );
        assert!(
            err.contains("(st, the command): exited with status 0; it left no report: "),
            "{err}"
        );
        assert!(
            !err.contains("nothing was pinned") && !err.contains("it pinned nothing"),
            "{err}"
        );
        assert!(run_record(&sdir)["no_report"][0]["why"]
            .as_str()
            .unwrap()
            .contains("statically linked"));
        let d = sdir.to_str().unwrap();
        let o = pinguard(&["check", d]);
        assert_eq!(o.status.code(), Some(1), "nothing was watched: {o:?}");
        assert!(
            text(&o)
                .0
                .contains("pinguard could not be loaded into the command of the run of `st`"),
            "{o:?}"
        );
        assert_eq!(
            pinguard(&["check", "--allow-config-errors", d])
                .status
                .code(),
            Some(0)
        );
        let (out, _) = text(&pinguard(&["report", d]));
        assert!(
            !out.contains("nothing was pinned") && out.contains("statically linked"),
            "{out}"
        );
    }
    // A command that could not start at all: its exit status and line, and no folder left behind.
    let empty = fresh_dir("honest-none");
    let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args(["run", "--lib", lib, "--", "/nonexistent/prog"])
        .current_dir(&empty)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127), "{o:?}");
    let left: Vec<_> = std::fs::read_dir(empty.join("pinguard-reports"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

/// Sets fields of a synthetic report: `(pointer, value)` pairs, as `/totals/peak_live_bytes`.
fn patch(p: &Path, fields: &[(&str, Value)]) {
    // Edits the file as written (JSON), keeping every key the types would not.
    let mut r: Value = read_json(p);
    for (ptr, v) in fields {
        *r.pointer_mut(ptr).unwrap_or_else(|| panic!("no {ptr}")) = v.clone();
    }
    std::fs::write(p, serde_json::to_vec(&r).unwrap()).unwrap();
}

/// Issue 34, item 5: `check --max-peak` per process (a real run) and for processes alive at the
/// same time (from their timelines, saying so); processes that did not overlap do not add up in
/// a merge.
#[test]
fn check_max_peak_gates_each_process_and_processes_alive_together() {
    let (o, dir) = run_under("scenario", &["cuda_alloc:1048576", "cuda_free:0"], &[]);
    assert!(o.status.success(), "{o:?}");
    let d = dir.to_str().unwrap();
    let o = pinguard(&["check", "--max-peak", "512Ki", d]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let (out, _) = text(&o);
    assert!(
        out.contains(
            "1048576 (1.00 MiB) pinned bytes at the peak exceed --max-peak 524288 (512 KiB) in "
        ),
        "{out}"
    );
    assert!(
        out.contains(".json (scenario, pid ") && out.contains("; top callsite 1.00 MiB "),
        "{out}"
    );
    assert_eq!(
        pinguard(&["check", "--max-peak", "1Mi", d]).status.code(),
        Some(0)
    );

    let mib = 1u64 << 20;
    let tl = |pts: &[(u64, u64)]| {
        Value::from(
            pts.iter()
                .map(|&(t, v)| serde_json::json!([t, v]))
                .collect::<Vec<_>>(),
        )
    };
    let syn = fresh_dir("peak-together");
    let a = synthetic(&syn, "a.json", 31, &[], 0, 0, 0);
    let b = synthetic(&syn, "b.json", 32, &[], 0, 0, 0);
    let c = synthetic(&syn, "c.json", 33, &[], 0, 0, 0);
    patch(
        &a,
        &[
            ("/totals/peak_live_bytes", mib.into()),
            ("/timeline", tl(&[(1000, 0), (1100, mib), (1900, 0)])),
        ],
    );
    patch(
        &b,
        &[
            ("/totals/peak_live_bytes", mib.into()),
            ("/timeline", tl(&[(1500, mib), (1950, 0)])),
        ],
    );
    // c lived later: 5 s to 6 s.
    patch(
        &c,
        &[
            ("/totals/peak_live_bytes", mib.into()),
            ("/process/start_unix_ms", 5000.into()),
            ("/process/write_unix_ms", 6000.into()),
            ("/timeline", tl(&[(5100, mib), (5200, 0)])),
        ],
    );
    let (a, b, c) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        c.to_str().unwrap(),
    );
    let o = pinguard(&["check", "--max-peak", "1.5Mi", a, b]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let (out, _) = text(&o);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("processes alive at the same time peaked at 2097152 (2.00 MiB) pinned bytes together (from the timelines of 2 processes on h), over --max-peak"), "{out}");
    let o = pinguard(&["check", "--max-peak", "1.5Mi", a, c]);
    assert_eq!(o.status.code(), Some(0), "a and c never overlapped: {o:?}");
    // The merged peak is taken over time too.
    let v: Value = serde_json::from_slice(&pinguard(&["report", "--json", a, c]).stdout).unwrap();
    assert_eq!(v["totals"]["peak_live_bytes"], mib, "{v}");
    let v: Value =
        serde_json::from_slice(&pinguard(&["report", "--json", a, b, c]).stdout).unwrap();
    assert_eq!(v["totals"]["peak_live_bytes"], 2 * mib, "{v}");
    // Without timelines, each process counts at its peak for its whole life: a and b overlap.
    patch(Path::new(b), &[("/timeline", tl(&[]))]);
    let o = pinguard(&["check", "--max-peak", "1.5Mi", a, b]);
    assert!(
        text(&o)
            .0
            .contains("(1 without one counted at their peak for their whole life)"),
        "{o:?}"
    );
}

/// Issue 34, item 5: `report --sort live|peak|denied` orders the callsites by that figure.
#[test]
fn report_sorts_by_live_peak_or_denied() {
    let dir = fresh_dir("sort");
    let s =
        |name: &'static str| -> Vec<(&'static str, &'static str, u32)> { vec![(name, "app.c", 1)] };
    let (held, spiky, refused) = (s("held_buffer"), s("spiky_staging"), s("refused_cache"));
    let p = synthetic(
        &dir,
        "s.json",
        40,
        &[
            (&held, 2 << 20, 2 << 20),
            (&spiky, 0, 5 << 20),
            (&refused, 0, 0),
        ],
        2 << 20,
        3,
        0,
    );
    patch(&p, &[("/callsites/2/denied_count", 3.into())]);
    let first_row = |sort: &str| {
        let (out, _) = text(&pinguard(&["report", "--sort", sort, p.to_str().unwrap()]));
        let title = out
            .lines()
            .find(|l| l.starts_with("Top callsites by"))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string();
        let row = out
            .lines()
            .skip_while(|l| !l.contains("CALLSITE"))
            .nth(1)
            .unwrap_or_else(|| panic!("{out}"))
            .to_string();
        (title, row)
    };
    let (t, r) = first_row("live");
    assert!(
        t.starts_with("Top callsites by live pinned bytes") && r.contains("held_buffer"),
        "{t}\n{r}"
    );
    let (t, r) = first_row("peak");
    assert!(
        t.starts_with("Top callsites by peak pinned bytes") && r.contains("spiky_staging"),
        "{t}\n{r}"
    );
    let (t, r) = first_row("denied");
    assert!(
        t.starts_with("Top callsites by denied calls") && r.contains("refused_cache"),
        "{t}\n{r}"
    );
    let v: Value = serde_json::from_slice(
        &pinguard(&["report", "--json", "--sort", "peak", p.to_str().unwrap()]).stdout,
    )
    .unwrap();
    assert_eq!(v["callsites"][0]["peak_live_bytes"], 5 << 20);
    let o = pinguard(&["report", "--sort", "size", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    no_panic(&o);
}

/// Issue 34, item 5: `diff --fail-on-growth SIZE|N%` exits 1 when a callsite's live or peak
/// grew by more, with a line naming it.
#[test]
fn diff_fails_on_growth_beyond_a_size_or_a_percentage() {
    let old = fresh_dir("growth-old");
    let new = fresh_dir("growth-new");
    let frames: &[(&str, &str, u32)] = &[("stage", "loader.py", 9)];
    synthetic(
        &old,
        "a.json",
        50,
        &[(frames, 1 << 20, 1 << 20)],
        1 << 20,
        0,
        0,
    );
    synthetic(
        &new,
        "a.json",
        51,
        &[(frames, 3 << 19, 2 << 20)],
        3 << 19,
        0,
        0,
    );
    let (o, n) = (old.to_str().unwrap(), new.to_str().unwrap());
    for (limit, code) in [("1Mi", 0), ("512Ki", 1), ("101%", 0), ("40%", 1)] {
        let r = pinguard(&["diff", "--fail-on-growth", limit, o, n]);
        assert_eq!(r.status.code(), Some(code), "{limit}: {r:?}");
        let (out, _) = text(&r);
        assert!(out.contains("SUMMARY:"), "the diff is still shown: {out}");
        if code == 1 {
            assert!(out.contains("pinguard diff: stage (loader.py:9): peak pinned bytes grew by +1.00 MiB (1.00 MiB -> 2.00 MiB), more than --fail-on-growth"), "{out}");
        }
    }
    let r = pinguard(&["diff", "--fail-on-growth", "40%", o, n]);
    assert!(
        text(&r)
            .0
            .contains("live pinned bytes grew by +512 KiB (1.00 MiB -> 1.50 MiB)"),
        "{r:?}"
    );
    assert_eq!(
        pinguard(&["diff", o, n]).status.code(),
        Some(0),
        "without the option a diff never fails"
    );
    let r = pinguard(&["diff", "--fail-on-growth", "lots", o, n]);
    assert_eq!(r.status.code(), Some(2));
    no_panic(&r);
}

/// Issue 34, item 5: the plot's maximum is the report's peak, also when the timeline (one point
/// per millisecond at most) missed it.
#[test]
fn the_plot_reaches_the_reports_peak() {
    let dir = fresh_dir("plot-peak");
    let p = synthetic(&dir, "p.json", 60, &[], 4 << 20, 0, 0);
    patch(
        &p,
        &[(
            "/totals/peak_live_bytes",
            ((4u64 << 20) + (256 << 10)).into(),
        )],
    );
    let svg_path = dir.join("p.svg");
    let o = pinguard(&[
        "plot",
        "-o",
        svg_path.to_str().unwrap(),
        p.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let svg = parse_svg(&svg_path);
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let peak = doc
        .descendants()
        .find(|n| n.attribute("class") == Some("peak"))
        .unwrap_or_else(|| panic!("no peak mark: {svg}"));
    let tick_y = |label: &str| -> f64 {
        let t = doc
            .descendants()
            .find(|n| n.attribute("class") == Some("ytick") && n.text() == Some(label))
            .unwrap_or_else(|| panic!("no tick {label}: {svg}"));
        t.attribute("y").unwrap().parse::<f64>().unwrap() - 4.0
    };
    // 4.25 MiB is a quarter of the way from the 4 MiB tick to the 5 MiB one.
    let (y4, y5) = (tick_y("4 MiB"), tick_y("5 MiB"));
    let y: f64 = peak.attribute("y1").unwrap().parse().unwrap();
    assert!(
        (y - (y4 + (y5 - y4) * 0.25)).abs() < 0.2,
        "peak at {y}, ticks {y4} {y5}"
    );
    assert!(svg.contains("peak 4.25 MiB"), "{svg}");

    // The issue's case, run for real: 4 MiB then 256 KiB pinned and freed within a millisecond;
    // the timeline's one point per millisecond has 4 MiB, the report's peak is 4.25 MiB.
    let (o, real) = run_under(
        "scenario",
        &["cuda_alloc:4194304", "cuda_alloc:262144", "cuda_free:1"],
        &[],
    );
    assert!(o.status.success(), "{o:?}");
    let rep = read_report(&reports_in(&real)[0]);
    assert_eq!(rep.totals.peak_live_bytes, (4u64 << 20) + (256 << 10));
    let o = pinguard(&[
        "plot",
        "-o",
        svg_path.to_str().unwrap(),
        real.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let svg = parse_svg(&svg_path);
    assert!(svg.contains(", peak 4.25 MiB"), "{svg}");
    let high = rep.timeline.iter().map(|p| p.1).max().unwrap();
    assert_eq!(
        svg.contains("class=\"peak\""),
        high < (4 << 20) + (256 << 10),
        "the mark where the timeline misses the peak: {svg}"
    );

    // The workload: the legend gives the report's peak.
    let (_, a) = run_under("workload", &[], &["--budget", "3M"]);
    let peak = read_report(&reports_in(&a)[0]).totals.peak_live_bytes;
    let o = pinguard(&[
        "plot",
        "-o",
        svg_path.to_str().unwrap(),
        a.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let svg = parse_svg(&svg_path);
    assert!(
        svg.contains(&format!(
            ", peak {}",
            pinguard_common::units::format_bytes(peak)
        )),
        "{svg}"
    );
}

/// Issue 34, item 6: `run --group-budget` gives the command and every process it starts one
/// budget (a group named after the run), and the summary shows the group.
#[test]
fn run_group_budget_caps_the_command_and_its_children_together() {
    let f = fixtures();
    let scenario = f.dir.join("scenario");
    let s = scenario.to_str().unwrap();
    // family pins 8 KiB and keeps it, its forked child 4 KiB; then it starts scenario, which asks
    // for 8 KiB more: within a budget of 12 KiB per process, over one of 12 KiB for all.
    let (o, _) = run_under("family", &[s, "cuda_alloc:8192"], &["--budget", "12Ki"]);
    assert!(
        o.status.success() && text(&o).0.contains("cuda_alloc:8192 rc=0"),
        "per process: {o:?}"
    );
    let (o, dir) = run_under(
        "family",
        &[s, "cuda_alloc:8192"],
        &["--group-budget", "12Ki"],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{o:?}");
    assert!(
        out.contains("cuda_alloc:8192 rc=2"),
        "refused by the run's group budget: {out}\n{err}"
    );
    let line = err
        .lines()
        .find(|l| l.starts_with("pinguard run: --group-budget 12Ki: group run-"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("of 12.0 KiB pinned"), "{line}");
    let name = line
        .split("group ")
        .nth(1)
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .to_string();
    let rec = run_record(&dir);
    assert_eq!(rec["group"], name.as_str());
    assert_eq!(rec["group_budget"], "12Ki");
    let reports = reports_in(&dir);
    assert_eq!(reports.len(), 3, "{err}");
    for p in &reports {
        assert_eq!(
            read_report(p).group.map(|g| g.name),
            Some(name.clone()),
            "{}",
            p.display()
        );
    }
    assert!(
        !Path::new(&pinguard_common::group::path(&name)).exists(),
        "the run's ledger is removed once its members are gone"
    );
    // A group already named in the environment is not silently left.
    let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args([
            "run",
            "--lib",
            f.lib.to_str().unwrap(),
            "--group-budget",
            "1Mi",
            "--",
            "true",
        ])
        .env("PINGUARD_GROUP", "mine")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(text(&o).1.contains("PINGUARD_GROUP=mine is set"), "{o:?}");
}

/// Issue 34, item 8: the Python API has the peak (`pinguard.peak_bytes()`, through the C API's
/// `pinguard_peak_bytes`), in a real CPython under `pinguard run`.
#[test]
fn python_api_gives_the_peak() {
    if !have("python3", "the Python API") {
        return;
    }
    let f = fixtures();
    let dir = fresh_dir("py-peak");
    let script = format!(
        "import ctypes, pinguard\n\
         rt = ctypes.CDLL({:?})\n\
         p = ctypes.c_void_p()\n\
         print('alloc', rt.cudaHostAlloc(ctypes.byref(p), 1048576, 0))\n\
         print('free', rt.cudaFreeHost(p))\n\
         print('peak', pinguard.peak_bytes(), 'live', pinguard.live_bytes())\n",
        f.dir.join("libcudart.so").to_str().unwrap()
    );
    let t = dir.join("%e.%p.json");
    let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args([
            "run",
            "--lib",
            f.lib.to_str().unwrap(),
            "--report",
            t.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &script,
        ])
        .env("PYTHONPATH", root().join("python"))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.contains("alloc 0") && out.contains("peak 1048576 live 0"),
        "{out}\n{err}"
    );
    // Outside pinguard: None, as live_bytes().
    let o = Command::new("python3")
        .args(["-c", "import pinguard; print(pinguard.peak_bytes())"])
        .env("PYTHONPATH", root().join("python"))
        .output()
        .unwrap();
    assert_eq!(text(&o).0.trim(), "None", "{o:?}");
}

/// Issue 34, item 8: `flamegraph -o -` writes the SVG to standard output, not to a file named `-`.
#[test]
fn flamegraph_to_standard_output() {
    let (_, a) = run_under("workload", &[], &[]);
    let cwd = fresh_dir("flame-stdout");
    let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args(["flamegraph", "-o", "-", a.to_str().unwrap()])
        .current_dir(&cwd)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let (out, _) = text(&o);
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(&out, opts)
        .unwrap_or_else(|e| panic!("not an SVG on stdout: {e}\n{out}"));
    assert!(out.contains("load_model_weights"), "{out}");
    assert!(!cwd.join("-").exists(), "a file named '-' was written");
}

/// Issue 34, item 4: one Python line pinning 256 KiB at a time through ctypes, from twelve stack
/// depths (`ctypes_depths_script`), under `pinguard run`: `report` shows one callsite whose
/// peak is 256 KiB. The walk used to end in a stack address after libffi's frame, one callsite
/// per depth, and `report` (which matches callsites by their Python frames) summed their peaks.
#[test]
fn a_ctypes_call_path_reports_its_true_peak() {
    if !have("python3", "ctypes") {
        return;
    }
    let f = fixtures();
    let dir = fresh_dir("ctypes-peak");
    let script = ctypes_depths_script(f.dir.join("libcudart.so").to_str().unwrap(), 2);
    let t = dir.join("%e.%p.json");
    let o = pinguard(&[
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--report",
        t.to_str().unwrap(),
        "--",
        "python3",
        "-c",
        &script,
    ]);
    assert!(o.status.success(), "{o:?}");
    let d = dir.to_str().unwrap();
    let v: Value = serde_json::from_slice(&pinguard(&["report", "--json", d]).stdout).unwrap();
    let pins: Vec<&Value> = v["callsites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["apis"][0] == "cudaMallocHost")
        .collect();
    assert_eq!(pins.len(), 1, "{v:#}");
    assert_eq!(pins[0]["alloc_count"], 24, "{v:#}");
    assert_eq!(pins[0]["peak_live_bytes"], 262144, "{v:#}");
    let (out, _) = text(&pinguard(&["report", "--sort", "peak", d]));
    let mut table = out.lines().skip_while(|l| !l.contains("CALLSITE"));
    let (header, row) = (table.next().expect(&out), table.next().expect(&out));
    let peak_end = header.find(" PEAK").expect(header) + " PEAK".len();
    assert!(
        row.contains("cudaMallocHost") && row[..peak_end].ends_with(" 256 KiB"),
        "{out}"
    );
}

/// Issue 34, item 4: stacks of one process that `report` shows as one line (the same Python
/// frames over two native paths) were pinned one after the other, as the process's own peak
/// shows: the line's peak is at most that, not the sum of theirs. Across processes it is the
/// largest of the processes' (issue 46, item 6).
#[test]
fn stacks_shown_as_one_line_do_not_sum_a_processes_peaks() {
    let dir = fresh_dir("one-line-peak");
    let kib = 1u64 << 10;
    type Frames = [(&'static str, &'static str, u32)];
    let (a, b): (&Frames, &Frames) = (
        &[("ffi_call_unix64", "unix64.S", 100)],
        &[
            ("ffi_call_unix64", "unix64.S", 100),
            ("ffi_call", "ffi64.c", 700),
        ],
    );
    let one = synthetic(
        &dir,
        "one.json",
        51,
        &[(a, 0, 256 * kib), (b, 0, 256 * kib)],
        0,
        0,
        0,
    );
    let line = [
        ("pin", "/srv/load.py", 7u32),
        ("<module>", "/srv/load.py", 12),
    ];
    with_py_frames(&one, 0, &line);
    with_py_frames(&one, 1, &line);
    patch(&one, &[("/totals/peak_live_bytes", (256 * kib).into())]);
    let peak = |files: &[&Path]| {
        let mut args = vec!["report", "--json"];
        args.extend(files.iter().map(|p| p.to_str().unwrap()));
        let v: Value = serde_json::from_slice(&pinguard(&args).stdout).unwrap();
        assert_eq!(v["callsites"].as_array().unwrap().len(), 1, "{v:#}");
        v["callsites"][0]["peak_live_bytes"].as_u64().unwrap()
    };
    assert_eq!(peak(&[&one]), 256 * kib);
    let (out, _) = text(&pinguard(&[
        "report",
        "--sort",
        "peak",
        one.to_str().unwrap(),
    ]));
    let row = out
        .lines()
        .find(|l| l.contains("pin (load.py:7)"))
        .expect(&out);
    assert!(
        row.contains(" 256 KiB ") && !row.contains("512 KiB"),
        "{out}"
    );
    // Held at the same time, as a process peak of 512 KiB says: the sum.
    let both = dir.join("both.json");
    std::fs::copy(&one, &both).unwrap();
    patch(
        &both,
        &[
            ("/process/pid", 52.into()),
            ("/totals/peak_live_bytes", (512 * kib).into()),
        ],
    );
    assert_eq!(peak(&[&both]), 512 * kib);
    // Two processes: the larger of their peaks there, the most the line held in one process (issue
    // 46, item 6: a sum stands above the run's peak for processes not alive together).
    assert_eq!(peak(&[&one, &both]), 512 * kib);
}

/// Issue 33: `pinguard top --group` shows the cgroup reserve each cgroup's members share (from
/// the ledger's version 5 readings), and reads a version 4 ledger (the previous pinguard's),
/// saying that it holds no cgroup figures. The ledger is this test's own, with itself as member.
#[test]
fn top_shows_a_groups_cgroup_reserve_and_reads_a_version_4_ledger() {
    use pinguard_common::group::{self as layout, live, Header};
    const MIB: u64 = 1 << 20;
    let name = format!("clitopcg-{}", std::process::id());
    let ledger = layout::path(&name);
    let live::Proc::Started(ticks) = layout::proc_of(std::process::id()) else {
        panic!("no start time")
    };
    // SAFETY: an all-zero `Header` is valid (plain integers and bytes; the mutex is never used).
    let mut h = unsafe { Box::<Header>::new_zeroed().assume_init() };
    let here = live::Here::read();
    (h.magic, h.version, h.header_size, h.total_size) = (
        layout::MAGIC,
        layout::VERSION,
        layout::SIZE as u32,
        layout::SIZE as u64,
    );
    (h.budget, h.used, h.peak) = (u64::MAX, 3 * MIB, 3 * MIB);
    let m = &mut h.members[0];
    (m.pid, m.start_ticks, m.bytes, m.peak, m.ipc_ns, m.pid_ns) = (
        std::process::id(),
        ticks,
        3 * MIB,
        3 * MIB,
        here.ipc_ns,
        here.pid_ns,
    );
    m.exe[..8].copy_from_slice(b"cli-test");
    (h.ext[0].cgroup, h.ext[0].cgroup_reserve) = (1, 3);
    let c = &mut h.cgroups[0];
    (c.dev, c.ino, c.limit, c.reserve, c.lowest) = (1, 2, 256 * MIB, 192 * MIB, 64 * MIB + MIB / 2);
    // SAFETY: the header's bytes, for as long as `h` lives.
    let bytes =
        unsafe { std::slice::from_raw_parts((&*h as *const Header).cast::<u8>(), layout::SIZE) }
            .to_vec();
    let top = |b: &[u8]| {
        std::fs::write(&ledger, b).unwrap();
        let o = pinguard(&["top", "--group", &name, "--once"]);
        let _ = std::fs::remove_file(&ledger);
        assert!(o.status.success(), "{o:?}");
        text(&o).0
    };
    let out = top(&bytes);
    let head = out.lines().next().unwrap();
    assert!(
        head.ends_with(
            ", 1 member; cgroup reserve 192 MiB of 256 MiB (1 member), lowest headroom 64.5 MiB"
        ),
        "{out}"
    );
    let header = out
        .lines()
        .find(|l| l.trim_start().starts_with("PID"))
        .unwrap();
    let row = out
        .lines()
        .find(|l| l.contains("cli-test"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(cell(header, row, "CGROUP-RESERVE"), "3", "{out}");

    // The same ledger as version 4 wrote it: the first `SIZE_V4` bytes.
    let mut v4 = bytes[..layout::SIZE_V4].to_vec();
    v4[8..12].copy_from_slice(&4u32.to_ne_bytes());
    v4[12..16].copy_from_slice(&(layout::SIZE_V4 as u32).to_ne_bytes());
    v4[16..24].copy_from_slice(&(layout::SIZE_V4 as u64).to_ne_bytes());
    let out = top(&v4);
    assert!(
        out.lines()
            .next()
            .unwrap()
            .ends_with(", 1 member; a version 4 ledger: no cgroup reserve figures"),
        "{out}"
    );
    assert!(
        !out.contains("CGROUP-RESERVE")
            && out
                .lines()
                .any(|l| l.contains("cli-test") && l.contains("3.00 MiB")),
        "{out}"
    );
    // Another version: one line naming it, exit status 2.
    let mut v3 = v4.clone();
    v3[8..12].copy_from_slice(&3u32.to_ne_bytes());
    std::fs::write(&ledger, &v3).unwrap();
    let o = pinguard(&["top", "--group", &name, "--once"]);
    let _ = std::fs::remove_file(&ledger);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        text(&o).1.trim_end(),
        format!("pinguard top: {ledger}: has version 3, this pinguard uses 5")
    );
}

/// A throw-away user and a folder of its own in the temporary directory (the build tree may sit
/// under a private one), both removed at the end.
struct SecureBench {
    user: String,
    dir: PathBuf,
}

impl Drop for SecureBench {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = Command::new("userdel").arg(&self.user).output();
    }
}

/// Issue 43, item 8: a program that gains privileges at exec (set-user-ID, file capabilities)
/// runs in secure mode, where the loader ignores `LD_PRELOAD`: under `run --budget 64K` it pins
/// 1 MiB unseen. `run` says so plainly before and after, its record notes it, and `check` on the
/// run fails unless `--allow-unwatched`.
#[test]
fn run_says_it_cannot_watch_a_secure_mode_program_and_check_fails() {
    // SAFETY: geteuid takes nothing and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if aarch64()
        || !root
        || !have("setcap", "file capabilities (libcap2-bin)")
        || !have("setpriv", "running as another user")
    {
        eprintln!("NOT RUN: needs root, setcap and setpriv on x86-64 (CI has them)");
        return;
    }
    let user = format!("pgsec{}", std::process::id());
    let o = Command::new("useradd")
        .args(["-M", "-r", "-s", "/bin/false", &user])
        .output()
        .unwrap();
    assert!(o.status.success(), "useradd: {o:?}");
    let bench = SecureBench {
        user: user.clone(),
        dir: std::env::temp_dir().join(format!("pinguard-secure-{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&bench.dir);
    std::fs::create_dir_all(&bench.dir).unwrap();
    let at = |name: &str| bench.dir.join(name).to_str().unwrap().to_string();
    std::fs::write(
        at("lock.c"),
        "#include <stdio.h>\n#include <sys/mman.h>\nint main(void) {\n  size_t n = 1 << 20;\n  char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);\n  int rc = mlock(p, n);\n  printf(\"mlock rc=%d\\n\", rc);\n  return rc != 0;\n}\n",
    )
    .unwrap();
    cc(&["-o", &at("lock"), &at("lock.c")]);
    std::fs::copy(env!("CARGO_BIN_EXE_pinguard"), at("pinguard")).unwrap();
    std::fs::copy(&fixtures().lib, at("libpinguard.so")).unwrap();
    let chmod = |p: &str, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    chmod(bench.dir.to_str().unwrap(), 0o755);
    // A set-user-ID copy owned by the throw-away user, run by root: it runs as that user.
    std::fs::copy(at("lock"), at("lock_suid")).unwrap();
    let o = Command::new("chown")
        .args([&user, &at("lock_suid")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    chmod(&at("lock_suid"), 0o4755);
    // A copy with cap_ipc_lock, run by the throw-away user, who does not hold it.
    std::fs::copy(at("lock"), at("lock_cap")).unwrap();
    let o = Command::new("setcap")
        .args(["cap_ipc_lock+ep", &at("lock_cap")])
        .output()
        .unwrap();
    assert!(o.status.success(), "setcap: {o:?}");
    let uid = String::from_utf8(
        Command::new("id")
            .args(["-u", &user])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let as_user = [
        format!("--reuid={}", uid.trim()),
        format!("--regid={}", uid.trim()),
    ];
    for (prog, what, run_as) in [
        ("lock_suid", "is set-user-ID", None),
        ("lock_cap", "has file capabilities", Some(&as_user)),
    ] {
        let out = bench.dir.join(format!("{prog}-reports"));
        std::fs::create_dir(&out).unwrap();
        chmod(out.to_str().unwrap(), 0o777);
        let template = out.join("%e.%p.json");
        let mut cmd = match run_as {
            None => Command::new(at("pinguard")),
            Some(ids) => {
                let mut c = Command::new("setpriv");
                c.args(ids)
                    .args(["--clear-groups", "--inh-caps=-all", &at("pinguard")]);
                c
            }
        };
        let o = cmd
            .args([
                "run",
                "--lib",
                &at("libpinguard.so"),
                "--budget",
                "64K",
                "--report",
            ])
            .arg(&template)
            .args(["--", &at(prog)])
            .output()
            .unwrap();
        let (stdout, err) = text(&o);
        // It pinned its 1 MiB, over the budget, unseen.
        assert!(
            o.status.success() && stdout.contains("mlock rc=0"),
            "{prog}: {stdout}\n{err}"
        );
        let first = err.lines().next().unwrap_or("");
        assert!(
            first.contains(what)
                && first.contains("secure mode")
                && first.contains("pinguard cannot watch it"),
            "{prog}: {err}"
        );
        assert!(
            !err.contains("pinned nothing that pinguard saw"),
            "{prog}: {err}"
        );
        let rec = run_record(&out);
        assert!(
            rec["secure_mode"]
                .as_str()
                .is_some_and(|s| s.contains(what)),
            "{prog}: {rec}"
        );
        let d = out.to_str().unwrap();
        let o = pinguard(&["check", "--max-denied", "0", d]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{prog}: nothing was watched: {o:?}"
        );
        assert!(text(&o).0.contains("runs in secure mode"), "{prog}: {o:?}");
        let o = pinguard(&["check", "--allow-unwatched", "--max-denied", "0", d]);
        assert_eq!(o.status.code(), Some(0), "{prog}: {o:?}");
    }
    // Root holds cap_ipc_lock already: exec gains nothing, the loader reads LD_PRELOAD, and the
    // same file is watched as any other program (its 1 MiB refused over the 64K budget).
    let out = bench.dir.join("root-reports");
    let o = Command::new(at("pinguard"))
        .args([
            "run",
            "--lib",
            &at("libpinguard.so"),
            "--budget",
            "64K",
            "--report",
        ])
        .arg(out.join("%e.%p.json"))
        .args(["--", &at("lock_cap")])
        .output()
        .unwrap();
    let (stdout, err) = text(&o);
    assert!(
        stdout.contains("mlock rc=-1") && !err.contains("secure mode"),
        "{stdout}\n{err}"
    );
    assert!(run_record(&out).get("secure_mode").is_none());
}

/// The `io_uring` fixture (tests/progs/uring_pin.c, without debug information: `tests/fixtures.txt`);
/// `None`, saying so, where `io_uring` cannot register a buffer here.
fn uring_pin() -> Option<PathBuf> {
    let exe = fixture_set("cli").join("cli/uring_pin");
    let out = program(&exe, None).args(["uring:64"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    if said.starts_with("uring rc=0 ") {
        return Some(exe);
    }
    eprintln!(
        "NOT RUN: io_uring cannot register buffers here: {}",
        said.trim()
    );
    assert!(
        std::env::var_os("PGTEST_REQUIRE_ALL").is_none() || aarch64(),
        "io_uring must be available here"
    );
    None
}

/// Issue 45 item 3: pins the kernel counts in `VmPin` that no call explains (a raw `io_uring`
/// registration) show in `run`'s line, `report`'s summary and `top`'s `KERNEL-PINNED` column.
#[test]
fn kernel_pinned_bytes_show_in_run_report_and_top() {
    let Some(exe) = uring_pin() else {
        return;
    };
    let dir = fresh_dir("cli-vmpin");
    let template = dir.join("%e.%p.json");
    let o = pinguard(&[
        "run",
        "--lib",
        fixtures().lib.to_str().unwrap(),
        "--report",
        template.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
        "mlock:64",
        "uring:1024",
        "live",
    ]);
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(
            "still pinned at exit by main, and 1.00 MiB kernel-pinned with no callsite (VmPin)\n"
        ),
        "{err}"
    );
    let (out, _) = text(&pinguard(&["report", dir.to_str().unwrap()]));
    assert!(
        out.contains(" pinned in 1 allocation across 1 process, 1.00 MiB more kernel-pinned with no callsite (VmPin); peak "),
        "{out}"
    );

    let mdir = fresh_dir("cli-vmpin-top");
    let mut held = command_in(&exe, &mdir, true)
        .args(["mlock:64", "uring:1024", "sleep:20000"])
        .env("PINGUARD_METRICS", mdir.join("m.%p.prom"))
        .env("PINGUARD_INTERVAL", "50ms")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let prom = mdir.join(format!("m.{}.prom", held.id()));
    until("the kernel-pinned gauge", || {
        std::fs::read_to_string(&prom).is_ok_and(|t| {
            t.contains("pinguard_process_kernel_pinned_bytes{") && t.contains("} 1048576\n")
        })
    });
    let (top, _) = text(&pinguard(&[
        "top",
        "--metrics",
        mdir.to_str().unwrap(),
        "--once",
    ]));
    held.kill().unwrap();
    held.wait().unwrap();
    assert!(
        top.lines()
            .next()
            .unwrap()
            .contains(", 1.00 MiB more kernel-pinned with no callsite (VmPin)"),
        "{top}"
    );
    let header = top
        .lines()
        .find(|l| l.trim_start().starts_with("PID"))
        .unwrap();
    let row = top
        .lines()
        .find(|l| l.trim_start().starts_with(&held.id().to_string()))
        .unwrap_or_else(|| panic!("{top}"));
    assert_eq!(cell(header, row, "KERNEL-PINNED"), "MiB", "{top}");
    assert!(row.contains("1.00 MiB"), "{top}");
}

/// Issue 46, item 6: the figures `report` prints agree with one another. Three processes, one
/// after another, pin 1 MiB at one callsite and only the first keeps it: the run never held more
/// than 1 MiB at once, so no callsite's peak may stand above that, the callsites' live figures
/// sum to the total, and the leak is "from 1 process", not from the three that went through it.
#[test]
fn report_figures_agree_with_one_another() {
    let mib = 1u64 << 20;
    let held = run_under("scenario", &["cuda_alloc:1048576"], &[]).1;
    let freed: Vec<PathBuf> = (0..2)
        .map(|_| run_under("scenario", &["cuda_alloc:1048576", "cuda_free:0"], &[]).1)
        .collect();
    let dirs = [&held, &freed[0], &freed[1]].map(|d| d.to_str().unwrap().to_string());
    let mut args = vec!["report", "--json"];
    args.extend(dirs.iter().map(String::as_str));
    let o = pinguard(&args);
    assert!(o.status.success(), "{o:?}");
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    let t = &j["totals"];
    let sites = j["callsites"].as_array().unwrap();
    let sum = |k: &str| sites.iter().map(|c| c[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(j["processes"], 3, "{j}");
    assert_eq!(t["peak_live_bytes"].as_u64(), Some(mib), "{j}");
    assert_eq!(sum("live_bytes"), t["live_bytes"].as_u64().unwrap(), "{j}");
    assert_eq!(sum("live_count"), t["live_count"].as_u64().unwrap(), "{j}");
    assert_eq!(
        sum("denied_count"),
        t["denied_count"].as_u64().unwrap(),
        "{j}"
    );
    for c in sites {
        let peak = c["peak_live_bytes"].as_u64().unwrap();
        assert!(peak <= mib, "a callsite's peak above the run's: {c}");
        assert!(
            c["live_processes"].as_u64() <= c["processes"].as_u64(),
            "{c}"
        );
    }
    let site = sites
        .iter()
        .find(|c| c["processes"] == 3)
        .unwrap_or_else(|| panic!("one callsite of the three processes: {j}"));
    assert_eq!(
        (
            site["live_processes"].as_u64(),
            site["peak_live_bytes"].as_u64()
        ),
        (Some(1), Some(mib))
    );
    // The text says the same, in words that say what each figure is.
    let mut args = vec!["report"];
    args.extend(dirs.iter().map(String::as_str));
    let (out, _) = text(&pinguard(&args));
    assert!(
        out.contains("1048576 bytes (1.00 MiB) in 1 allocation from 1 process (2 more went through it and hold nothing), through cudaHostAlloc:"),
        "{out}"
    );
    assert!(
        out.contains("PEAK: the most the callsite held in one process"),
        "{out}"
    );
    assert!(out.contains("; peak 1.00 MiB held at once;"), "{out}");
    let header = out.lines().find(|l| l.contains("CALLSITE")).unwrap();
    let peak_end = header.find(" PEAK").unwrap() + " PEAK".len();
    let rows = out.lines().skip_while(|l| !l.contains("CALLSITE")).skip(1);
    for row in rows.take_while(|l| !l.is_empty() && !l.starts_with('(')) {
        let peak: Vec<&str> = row[..peak_end].split_whitespace().rev().take(2).collect();
        let value: f64 = peak[1].parse().unwrap();
        assert!(
            peak[0] != "GiB" && (peak[0] != "MiB" || value <= 1.0),
            "{row}\n{out}"
        );
    }
}

/// Issue 46, item 8: `top` with no argument lists what it can show (here a process under
/// pinguard, its state file and its metrics folder), `top --pid` shows that process from its
/// state file, and every view says how old its figures are (AGE: `live` from shared memory, the
/// seconds since its last write for a metrics file).
#[test]
fn top_lists_what_it_can_show_and_says_how_old_each_figure_is() {
    let dir = fresh_dir("topage");
    let m = dir.join("m.%p.prom");
    let held = Held::start(
        &fresh_dir("topage-a"),
        &["cuda_alloc:65536"],
        &[
            ("PINGUARD_METRICS", m.to_str().unwrap()),
            ("PINGUARD_BUDGET", "128K"),
        ],
    );
    let pid = held.pid();
    until("the metrics file", || {
        dir.join(format!("m.{pid}.prom")).exists()
    });
    let listed = pinguard(&["top", "--once"]);
    let pid_view = pinguard(&["top", "--pid", &pid.to_string(), "--once"]);
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let metrics_view = pinguard(&["top", "--metrics", dir.to_str().unwrap(), "--once"]);
    held.finish();
    let not_under = pinguard(&["top", "--pid", &std::process::id().to_string(), "--once"]);

    assert!(listed.status.success(), "{listed:?}");
    let (out, _) = text(&listed);
    assert!(out.contains("groups (pinguard top --group NAME):"), "{out}");
    let line = out
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with(&format!("{pid} scenario: state "))
        })
        .unwrap_or_else(|| panic!("the held process is listed: {out}"));
    assert!(line.ends_with(".state"), "{line}");
    assert!(
        out.contains("metrics folders (pinguard top --metrics DIR):\n")
            && out.contains(&format!("  {} (", dir.display())),
        "{out}"
    );

    assert!(pid_view.status.success(), "{pid_view:?}");
    let (out, _) = text(&pid_view);
    assert!(
        out.starts_with(&format!(
            "pid {pid} (scenario): 64.0 KiB pinned in 1 allocation"
        )),
        "{out}"
    );
    assert!(out.contains("AGE: every figure read now"), "{out}");
    let header = out.lines().find(|l| l.contains("PINNED")).unwrap();
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with(&pid.to_string()))
        .unwrap();
    assert_eq!(cell(header, row, "AGE"), "live", "{out}");
    assert!(row.contains("50%"), "{row}");

    assert!(metrics_view.status.success(), "{metrics_view:?}");
    let (out, _) = text(&metrics_view);
    assert!(
        out.contains("AGE: how long ago each process last wrote its metrics file"),
        "{out}"
    );
    let header = out.lines().find(|l| l.contains("PINNED")).unwrap();
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with(&pid.to_string()))
        .unwrap();
    let age: f64 = cell(header, row, "AGE")
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(
        age >= 1.0,
        "at least the second slept since the file's write: {out}"
    );

    assert_eq!(not_under.status.code(), Some(2), "{not_under:?}");
    assert!(text(&not_under)
        .1
        .contains("is not a process running under pinguard"));
}

/// Issue 46, item 7: `plot` marks each refused call (a cross) and downgraded call (a ring) on its
/// process's line, and `--wall-clock` draws each process's own budget across its own time only.
#[test]
fn plot_marks_refusals_and_downgrades_and_each_processs_own_budget() {
    let (o, refused) = run_under("workload", &[], &["--budget", "3M"]);
    assert!(o.status.success(), "{o:?}");
    let (o, downgraded) = run_under(
        "workload",
        &[],
        &["--budget", "2M", "--policy", "downgrade"],
    );
    assert!(o.status.success(), "{o:?}");
    let svg_path = refused.join("marks.svg");
    let o = pinguard(&[
        "plot",
        "--wall-clock",
        "-o",
        svg_path.to_str().unwrap(),
        refused.to_str().unwrap(),
        downgraded.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let text = parse_svg(&svg_path);
    let doc = roxmltree::Document::parse_with_options(
        &text,
        roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        },
    )
    .unwrap();
    let of = |class: &str| -> Vec<roxmltree::Node> {
        doc.descendants()
            .filter(|n| n.attribute("class") == Some(class))
            .collect()
    };
    let title = |n: &roxmltree::Node| {
        n.children()
            .find(|c| c.has_tag_name("title"))
            .and_then(|t| t.text())
            .unwrap_or("")
            .to_string()
    };
    let refusals = of("refusal");
    assert_eq!(refusals.len(), 1, "the 3M run's one refusal: {text}");
    assert!(
        title(&refusals[0]).contains("refused cudaHostAlloc of 4.00 MiB"),
        "{}",
        title(&refusals[0])
    );
    let downgrades = of("downgrade");
    assert!(!downgrades.is_empty(), "the 2M run's downgrades: {text}");
    assert!(downgrades.iter().all(|d| title(d).contains("downgraded")));
    assert!(
        text.contains("1 call refused (x)") && text.contains("downgraded (o)"),
        "{text}"
    );
    // One budget line per process, each its own, the second run's after the first's.
    let budgets = of("budget");
    assert_eq!(budgets.len(), 2, "{text}");
    let x = |n: &roxmltree::Node, a: &str| n.attribute(a).unwrap().parse::<f64>().unwrap();
    let mut spans: Vec<(f64, f64, String)> = budgets
        .iter()
        .map(|b| (x(b, "x1"), x(b, "x2"), title(b)))
        .collect();
    spans.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    assert!(
        spans[0].2.starts_with("budget 3.00 MiB of workload"),
        "{spans:?}"
    );
    assert!(
        spans[1].2.starts_with("budget 2.00 MiB of workload"),
        "{spans:?}"
    );
    assert!(
        spans[0].1 <= spans[1].0,
        "each across its own time: {spans:?}"
    );
    assert!(
        !text.contains("stroke=\"#000\" stroke-dasharray"),
        "no budget across all: {text}"
    );
}

/// Issue 46 item 13: `report` shows the latest refused and failed calls, each with one line under
/// it that says why: the API's answer, the budget, `RLIMIT_MEMLOCK` and `CAP_IPC_LOCK`, `VmLck`,
/// `VmPin`, the cgroup's headroom.
#[test]
fn report_says_why_under_each_refused_call() {
    let (o, dir) = run_under("refusals", &["3"], &["--budget", "4K", "--policy", "error"]);
    assert!(o.status.success(), "{o:?}");
    let o = pinguard(&["report", dir.to_str().unwrap()]);
    no_panic(&o);
    let (out, err) = text(&o);
    assert!(
        out.contains("\nCalls refused, downgraded or failed, and why (3 of 3, the latest last):\n"),
        "{out}\n{err}"
    );
    let lines: Vec<&str> = out.lines().collect();
    // The three refusals are the same call refused the same way: one entry, counted.
    let i = lines
        .iter()
        .position(|l| {
            l.starts_with("  refused cudaHostAlloc of 8.00 KiB (8192 bytes) at ask (refusals.c:")
                && l.contains(", pid ")
                && l.ends_with(" (refusals) (3 times)")
        })
        .unwrap_or_else(|| panic!("{out}\n{err}"));
    let why = lines[i + 1];
    assert!(
        why.starts_with("    why: cudaErrorMemoryAllocation (2); budget 4.00 KiB, RLIMIT_MEMLOCK ")
            && why.contains(" VmLck ")
            && why.contains(" VmPin ")
            && why.contains(" cgroup headroom "),
        "{out}"
    );
}
