//! The `pinguard` command end to end: real programs under the real library, then the reports read
//! back through every subcommand, and every kind of bad input.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn pinguard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pinguard")).args(args).output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// `pinguard run` of a fixture program, reports into a fresh directory.
fn run_under(prog: &str, args: &[&str], flags: &[&str]) -> (Output, PathBuf) {
    let f = fixtures();
    let dir = fresh_dir(&format!("cli-{prog}"));
    let template = dir.join("%e.%p.json");
    let exe = f.dir.join(prog);
    let mut a: Vec<&str> = vec!["run", "--lib", f.lib.to_str().unwrap(), "--report", template.to_str().unwrap()];
    a.extend_from_slice(flags);
    a.push("--");
    a.push(exe.to_str().unwrap());
    a.extend_from_slice(args);
    (pinguard(&a), dir)
}

fn no_panic(o: &Output) {
    let (_, err) = text(o);
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{err}");
}

#[test]
fn run_passes_the_exit_status_and_summarises_every_process() {
    let f = fixtures();
    let scenario = f.dir.join("scenario");
    let (o, dir) = run_under("family", &[scenario.to_str().unwrap(), "mlock:0:2"], &["--budget", "1M"]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    assert!(err.contains("3 report(s)"), "{err}");
    assert_eq!(reports_in(&dir).len(), 3);
    for p in reports_in(&dir) {
        let pid = read_json(&p)["process"]["pid"].as_u64().unwrap();
        assert!(err.contains(&pid.to_string()), "pid {pid} missing from the summary:\n{err}");
    }
    assert!(err.contains("1.00 MiB"), "the budget is shown: {err}");
    // The command's own exit status comes back.
    let (o, _) = run_under("scenario", &["bogus_op"], &[]);
    assert_eq!(o.status.code(), Some(2), "scenario exits 2 on an unknown op");
    let o = pinguard(&["run", "--lib", f.lib.to_str().unwrap(), "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7));
    let o = pinguard(&["run", "--lib", f.lib.to_str().unwrap(), "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(o.status.code(), Some(128 + 15));
    // Bad flags: one message, exit 2.
    for bad in [&["run", "--budget", "lots", "--", "true"][..], &["run", "--policy", "panic", "--", "true"], &["run", "--depth", "999", "--", "true"], &["run", "--lib", "/nope.so", "--", "true"]] {
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
    let rows: Vec<&str> = out.lines().filter(|l| l.contains("cudaHostAlloc") && l.contains("load_model_weights")).collect();
    assert!(!rows.is_empty(), "{out}");
    // Merged by frames, not addresses (ASLR moved them): one row, both processes, 4 MiB.
    assert!(rows[0].starts_with("4.00 MiB") && rows[0].split_whitespace().nth(8) == Some("2"), "{}", rows[0]);
    assert!(out.contains("4194304 bytes (4.00 MiB) in 4 allocations from 2 processes, through cudaHostAlloc:"), "{out}");
    assert!(out.contains("#0 0x") && out.contains("in load_model_weights") && out.contains("workload.c:"), "{out}");
    assert!(out.contains("SUMMARY: pinguard: 5898240 bytes (5.62 MiB) pinned in 10 allocations across 2 processes"), "{out}");
    // Aligned columns: every table row has its LIVE column right-aligned to the header's width.
    let header = out.lines().find(|l| l.contains("LIVE") && l.contains("CALLSITE")).unwrap();
    let api_col = header.find("API").unwrap();
    for l in out.lines().skip_while(|l| !l.contains("CALLSITE")).skip(1).take_while(|l| !l.is_empty()) {
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

/// A report built by hand: the fields a test needs, frames given as (symbol, file, line).
fn synthetic(dir: &Path, name: &str, pid: u32, sites: &[(&[(&str, &str, u32)], u64, u64)], live: u64, denied: u64, downgraded: u64) -> PathBuf {
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
    let p = synthetic(&dir, "m.json", 7, &[(frames, 1 << 20, 1 << 20)], 1 << 20, 0, 0);
    let (out, _) = text(&pinguard(&["report", p.to_str().unwrap()]));
    assert!(out.contains("at::native::pin_memory(at::Tensor const&) pin.cpp:10"), "{out}");
    assert!(out.contains("serving::cache::grow cache.rs:20"), "{out}");
    assert!(!out.contains("_ZN"), "{out}");
}

#[test]
fn check_gates_on_each_limit() {
    let dir = fresh_dir("check");
    let p = synthetic(&dir, "c.json", 9, &[], 3 << 20, 2, 5);
    let p = p.to_str().unwrap();
    let o = pinguard(&["check", "--max-live", "4M", "--max-denied", "2", "--max-downgraded", "5", p]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(text(&o).0.contains("within limits"));
    let o = pinguard(&["check", "--max-live", "1M", "--max-denied", "1", "--max-downgraded", "5", p]);
    assert_eq!(o.status.code(), Some(1));
    let (out, _) = text(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "one line per violated limit: {out}");
    assert!(lines[0].contains("--max-live") && lines[0].contains("3.00 MiB"));
    assert!(lines[1].contains("2 denied calls exceed --max-denied 1"));
    let o = pinguard(&["check", "--max-live", "1M", "--max-denied", "0", "--max-downgraded", "0", p]);
    assert_eq!(text(&o).0.lines().count(), 3);
    let o = pinguard(&["check", "--max-live", "a lot", p]);
    assert_eq!(o.status.code(), Some(2));
    no_panic(&o);
}

#[test]
fn diff_matches_callsites_by_frames_across_runs() {
    // Two runs of the same program: ASLR moves every address, the frames stay.
    let old = run("scenario", &["cuda_alloc:4096", "acl_malloc:8192", "mlock:0:1"], &[]);
    let new = run("scenario", &["cuda_alloc:4096", "cuda_alloc:65536", "mlock:0:1"], &[]);
    let o = pinguard(&["diff", old.report_dir.to_str().unwrap(), new.report_dir.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let (out, _) = text(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[1].trim_start().starts_with("+64.0 KiB") && lines[1].contains("4.00 KiB -> 68.0 KiB") && lines[1].contains("grew"), "{out}");
    assert!(out.lines().any(|l| l.trim_start().starts_with("-8.00 KiB") && l.contains("gone")), "{out}");
    assert!(!out.lines().any(|l| l.contains("mlock") || l.contains("new")), "unchanged callsites are left out: {out}");
    assert!(out.contains("SUMMARY: live pinned bytes 16.0 KiB -> 72.0 KiB (+56.0 KiB)"), "{out}");
}

fn parse_svg(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap();
    let opts = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    roxmltree::Document::parse_with_options(&text, opts).unwrap_or_else(|e| panic!("{} is not well-formed XML: {e}", p.display()));
    text
}

#[test]
fn flamegraph_and_plot_draw_well_formed_svg() {
    let (_, a) = run_under("workload", &[], &["--budget", "3M"]);
    let out = a.join("flame.svg");
    for metric in ["live", "peak", "allocs"] {
        let o = pinguard(&["flamegraph", "--metric", metric, "-o", out.to_str().unwrap(), a.to_str().unwrap()]);
        assert!(o.status.success(), "{o:?}");
        let svg = parse_svg(&out);
        assert!(svg.contains("load_model_weights"), "{metric}");
        assert_eq!(svg.contains("pin_batches"), metric != "live", "{metric}: pin_batches holds nothing live");
    }
    let dir = fresh_dir("plot");
    let p1 = synthetic(&dir, "p1.json", 11, &[], 1 << 20, 0, 0);
    let p2 = synthetic(&dir, "p2.json", 12, &[], 2 << 20, 0, 0);
    let mut r: Value = read_json(&p2);
    r["config"]["budget_bytes"] = (3u64 << 20).into();
    std::fs::write(&p2, serde_json::to_vec(&r).unwrap()).unwrap();
    let svg_path = dir.join("plot.svg");
    let o = pinguard(&["plot", "-o", svg_path.to_str().unwrap(), p1.to_str().unwrap(), p2.to_str().unwrap(), a.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let svg = parse_svg(&svg_path);
    assert!(svg.contains("app (pid 11") && svg.contains("app (pid 12") && svg.contains("workload (pid"), "{svg}");
    assert!(svg.contains("budget 3.00 MiB"), "the budget line");
    assert_eq!(svg.matches("<path ").count(), 3);
}

#[test]
fn bad_input_gets_one_line_and_exit_2() {
    let dir = fresh_dir("bad");
    let empty_dir = dir.join("empty");
    std::fs::create_dir(&empty_dir).unwrap();
    let good = synthetic(&dir, "good.json", 5, &[], 4096, 0, 0);
    let mut cases: Vec<(PathBuf, &str)> = vec![(dir.join("missing.json"), "no such file"), (empty_dir.clone(), "no pinguard reports")];
    let mut write = |name: &str, bytes: &[u8], why: &'static str| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        cases.push((p, why));
    };
    write("empty.json", b"", "empty file");
    let full = std::fs::read(&good).unwrap();
    write("truncated.json", &full[..full.len() / 2], "not valid JSON");
    write("other.json", br#"{"schema": "heaptrack.v3", "x": 1}"#, "not supported");
    write("future.json", br#"{"schema": "pinguard.report.v2"}"#, "newer pinguard");
    write("binary.json", &[0x7f, b'E', b'L', b'F', 0, 1, 2, 0xff, 0xfe], "not valid JSON");
    write("shape.json", br#"{"schema": "pinguard.report.v1", "totals": 3}"#, "malformed report");
    for (p, why) in &cases {
        for cmd in [&["report"][..], &["check", "--max-live", "1G"], &["plot", "-o", "/dev/null"], &["flamegraph", "-o", "/dev/null"]] {
            let mut args: Vec<&str> = cmd.to_vec();
            args.push(p.to_str().unwrap());
            let o = pinguard(&args);
            assert_eq!(o.status.code(), Some(2), "{args:?}");
            let (_, err) = text(&o);
            no_panic(&o);
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(err.contains(p.to_str().unwrap()) && err.contains(why), "{args:?}: {err}");
        }
    }
    let o = pinguard(&["diff", cases[2].0.to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    // --keep-going: the bad file is named, the good one is still read.
    let o = pinguard(&["report", "--keep-going", cases[3].0.to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let (out, err) = text(&o);
    assert!(err.contains("truncated.json") && out.contains("4096 bytes"), "{out}\n{err}");
    let o = pinguard(&["report", "--keep-going", cases[3].0.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "nothing readable at all");
    let o = pinguard(&["report"]);
    assert_eq!(o.status.code(), Some(2));
    let o = pinguard(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn top_shows_a_group_and_a_metrics_directory() {
    use std::io::{BufRead, BufReader};
    let f = fixtures();
    let name = format!("clitop-{}", std::process::id());
    let ledger = pinguard_report::group::path(&name);
    let _ = std::fs::remove_file(&ledger);
    let mut holder = Command::new(f.dir.join("churn"))
        .env("LD_PRELOAD", &f.lib)
        .env("PINGUARD_GROUP", &name)
        .env("PINGUARD_GROUP_BUDGET", "1M")
        .env("PINGUARD_REPORT", fresh_dir("top").join("r.%p.json"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let o = pinguard(&["top", "--group", &name, "--once"]);
    assert!(o.status.success(), "{o:?}");
    let (text_out, _) = text(&o);
    assert!(text_out.starts_with(&format!("group {name}: ")) && text_out.contains("of 1.00 MiB"), "{text_out}");
    let row = text_out.lines().find(|l| l.trim_start().starts_with(&holder.id().to_string())).unwrap_or_else(|| panic!("{text_out}"));
    assert!(row.contains("churn") && (row.contains("64.0 KiB") || row.contains("68.0 KiB")), "{row}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let (text_out, _) = text(&pinguard(&["top", "--group", &name, "--once"]));
    assert!(text_out.contains("gone"), "a SIGKILLed member shows as gone: {text_out}");
    let _ = std::fs::remove_file(&ledger);

    let dir = fresh_dir("topm");
    let m = dir.join("m.%p.prom");
    run("scenario", &["cuda_alloc:8192"], &[("PINGUARD_METRICS", m.to_str().unwrap())]);
    run("scenario", &["cuda_alloc:65536"], &[("PINGUARD_METRICS", m.to_str().unwrap()), ("PINGUARD_BUDGET", "128K")]);
    let o = pinguard(&["top", "--metrics", dir.to_str().unwrap(), "--once"]);
    assert!(o.status.success(), "{o:?}");
    let (text_out, _) = text(&o);
    let rows: Vec<&str> = text_out.lines().filter(|l| l.contains("scenario")).collect();
    assert_eq!(rows.len(), 2, "{text_out}");
    assert!(rows[0].contains("64.0 KiB") && rows[0].contains("50%"), "sorted by pinned bytes, with budget use: {text_out}");
    assert!(rows[1].contains("8.00 KiB"), "{text_out}");
    let o = pinguard(&["top", "--group", "no-such-group-xyz", "--once"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(text(&o).1.lines().count(), 1);
    no_panic(&o);
}

/// Gives callsite `i` of a synthetic report these Python frames (function, file, line).
fn with_py_frames(p: &Path, i: usize, frames: &[(&str, &str, u32)]) {
    let mut r: Value = read_json(p);
    r["callsites"][i]["py_frames"] = frames
        .iter()
        .map(|(s, f, l)| serde_json::json!({"addr": "0x0", "module": f, "offset": null, "symbol": s, "file": f, "line": l}))
        .collect::<Vec<_>>()
        .into();
    std::fs::write(p, serde_json::to_vec(&r).unwrap()).unwrap();
}

#[test]
fn python_frames_come_first_match_across_runs_and_reach_the_flame_graph() {
    let dir = fresh_dir("py-frames");
    // Two runs: the same Python line pins through different native paths (another library
    // version, the interpreter's specialisation), and a second Python line only in the new run.
    let native_old: &[(&str, &str, u32)] = &[("at::cuda::CachingHostAllocator::allocate", "CachingHostAllocator.cpp", 200), ("THPVariable_pin_memory", "python_variable_methods.cpp", 80)];
    let native_new: &[(&str, &str, u32)] = &[("at::cuda::HostAllocator::allocate", "HostAllocator.cpp", 90), ("THPVariable_pin_memory", "python_variable_methods.cpp", 81)];
    let old = synthetic(&dir, "old.json", 21, &[(native_old, 1 << 20, 1 << 20)], 1 << 20, 0, 0);
    let new = synthetic(&dir, "new.json", 22, &[(native_new, 3 << 20, 3 << 20), (native_new, 1 << 20, 1 << 20)], 4 << 20, 0, 0);
    let batch = [("pin_batch", "/srv/train.py", 57u32), ("main", "/srv/train.py", 90)];
    with_py_frames(&old, 0, &batch);
    with_py_frames(&new, 0, &batch);
    with_py_frames(&new, 1, &[("load_weights", "/srv/train.py", 12), ("main", "/srv/train.py", 88)]);

    let o = pinguard(&["report", new.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("pin_batch (train.py:57)") && out.contains("load_weights (train.py:12)"), "Python names the callsites: {out}");
    let py = out.find("  Python:\n    #0 pin_batch /srv/train.py:57").expect(&out);
    let native = out.find("in at::cuda::HostAllocator::allocate").expect(&out);
    assert!(py < native, "Python frames first: {out}");

    let o = pinguard(&["diff", old.to_str().unwrap(), new.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(o.status.success(), "{out}");
    let grew = out.lines().find(|l| l.contains("pin_batch (train.py:57)")).expect(&out);
    assert!(grew.contains("1.00 MiB -> 3.00 MiB") && grew.contains("grew"), "one callsite across runs, matched by its Python frames: {out}");
    assert!(out.lines().any(|l| l.contains("load_weights (train.py:12)") && l.contains("new")), "{out}");
    assert!(!out.contains("gone"), "the old native path is not a callsite of its own: {out}");

    let svg = dir.join("flame.svg");
    let o = pinguard(&["flamegraph", "-o", svg.to_str().unwrap(), new.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let text = parse_svg(&svg);
    assert!(text.contains("pin_batch [py]") && text.contains("main [py]") && text.contains("at::cuda::HostAllocator::allocate"), "{text}");
}

/// `pinguard run --downgrade-match` scopes `downgrade` as `PINGUARD_DOWNGRADE_MATCH` does: the
/// framework's call is downgraded, the program's own refused, and the report lists the scope.
#[test]
fn run_scopes_downgrade_to_the_callsites_given() {
    let (o, dir) = run_under(
        "scope",
        &["framework:1048576", "direct:1048576"],
        &["--budget", "4K", "--policy", "downgrade", "--downgrade-match", "framework_pin"],
    );
    assert!(o.status.success(), "{o:?}");
    let (out, _) = text(&o);
    assert!(out.contains("framework:1048576 rc=0") && out.contains("direct:1048576 rc=2"), "{out}");
    let reports = reports_in(&dir);
    assert_eq!(reports.len(), 1);
    let rep = read_json(&reports[0]);
    assert_eq!(rep["config"]["downgrade_match"], serde_json::json!(["framework_pin"]));
    assert_eq!(rep["totals"]["downgraded_count"], 1);
    assert_eq!(rep["totals"]["denied_count"], 1);
}
