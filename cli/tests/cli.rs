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

/// The cell of a right-aligned column in a table row: what ends where the header's name ends
/// (sizes such as "6.81 MiB" hold a space, so whitespace does not split columns).
fn cell<'a>(header: &str, row: &'a str, name: &str) -> &'a str {
    let end = header.find(&format!(" {name}")).map(|i| i + 1 + name.len()).or_else(|| header.starts_with(name).then_some(name.len()));
    let end = end.unwrap_or_else(|| panic!("no column {name} in {header:?}"));
    row[..end.min(row.len())].rsplit(' ').next().unwrap()
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
    assert!(err.contains("3 reports under"), "{err}");
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
    let header = out.lines().find(|l| l.contains("CALLSITE")).unwrap();
    assert!(rows[0].starts_with("4.00 MiB") && cell(header, rows[0], "PROCS") == "2", "{}", rows[0]);
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

/// A callsite of a synthetic report: its frames as (symbol, file, line), live and peak bytes.
type SynthSite<'a> = (&'a [(&'a str, &'a str, u32)], u64, u64);

/// A report built by hand: the fields a test needs.
fn synthetic(dir: &Path, name: &str, pid: u32, sites: &[SynthSite], live: u64, denied: u64, downgraded: u64) -> PathBuf {
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
    // Point 9: round ticks in the unit shown, and time since each process's start unless the
    // wall clock is asked for.
    assert!(svg.contains("time since process start"), "{svg}");
    for tick in [">1 MiB<", ">2 MiB<", ">3 MiB<"] {
        assert!(svg.contains(tick), "{tick} missing: {svg}");
    }
    assert!(!svg.contains(".76 MiB<") && !svg.contains(".52 MiB<"), "{svg}");
    let o = pinguard(&["plot", "--wall-clock", "-o", svg_path.to_str().unwrap(), p1.to_str().unwrap(), a.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let svg = parse_svg(&svg_path);
    assert!(svg.contains("wall-clock time") && !svg.contains("time since process start"), "{svg}");
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
    let ledger = pinguard_report::group::path(&name);
    let _ = std::fs::remove_file(&ledger);
    let mut holder = group_member(&name, ("PINGUARD_GROUP_BUDGET", "1M"));
    let o = pinguard(&["top", "--group", &name, "--once"]);
    assert!(o.status.success(), "{o:?}");
    let (text_out, _) = text(&o);
    assert!(text_out.starts_with(&format!("group {name}: ")) && text_out.contains("of 1.00 MiB"), "{text_out}");
    assert!(text_out.lines().next().unwrap().ends_with(", 1 member"), "{text_out}");
    let row = text_out.lines().find(|l| l.trim_start().starts_with(&holder.id().to_string())).unwrap_or_else(|| panic!("{text_out}"));
    assert!(row.contains("churn") && (row.contains("64.0 KiB") || row.contains("68.0 KiB")), "{row}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let (text_out, _) = text(&pinguard(&["top", "--group", &name, "--once"]));
    assert!(text_out.contains("gone"), "a SIGKILLed member shows as gone: {text_out}");
    remove_semaphores(&ledger);
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
    assert!(text_out.lines().next().unwrap().ends_with("pinned in 2 processes"), "{text_out}");
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

/// Issue 17, point 1: under `warn`, going over the budget shows wherever denied and downgraded
/// calls do: `run`'s table and total, `report`'s table and summary, and `check` gates on it.
#[test]
fn over_budget_calls_show_everywhere_and_check_gates_on_them() {
    let (o, dir) = run_under("workload", &[], &["--budget", "3M", "--policy", "warn"]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    let header = err.lines().find(|l| l.trim_start().starts_with("PID  EXE")).unwrap_or_else(|| panic!("{err}"));
    let row = err.lines().find(|l| l.contains(" workload ")).unwrap();
    assert_eq!(cell(header, row, "OVER-BUDGET"), "1", "{header}\n{row}");
    let header = err.lines().find(|l| l.contains("CALLSITE")).unwrap_or_else(|| panic!("{err}"));
    let row = err.lines().skip_while(|l| !l.contains("CALLSITE")).find(|l| l.contains("grow_kv_cache")).unwrap();
    assert_eq!(cell(header, row, "OVER-BUDGET"), "1", "{header}\n{row}");
    assert!(err.contains("0 denied, 0 downgraded, 1 over budget."), "{err}");
    let (out, _) = text(&pinguard(&["report", dir.to_str().unwrap()]));
    let header = out.lines().find(|l| l.contains("CALLSITE")).unwrap();
    let row = out.lines().find(|l| l.contains("grow_kv_cache")).unwrap();
    assert_eq!(cell(header, row, "OVER-BUDGET"), "1", "{row}");
    let row = out.lines().find(|l| l.contains("load_model_weights") && !l.contains('#')).unwrap();
    assert_eq!(cell(header, row, "OVER-BUDGET"), "0", "{row}");
    assert!(out.contains("0 downgraded (0 B), 1 over budget;"), "{out}");
    let d = dir.to_str().unwrap();
    let o = pinguard(&["check", "--max-over-budget", "0", d]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_eq!(text(&o).0.trim(), "pinguard check: 1 call over the budget exceeds --max-over-budget 0");
    let o = pinguard(&["check", "--max-over-budget", "1", d]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(text(&o).0.contains("1 report, 1 process: live 6.81 MiB, 0 denied, 0 downgraded, 1 over budget: within limits"), "{o:?}");
    let o = pinguard(&["check", "--max-over-budget", "-1", d]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("negative counts are not allowed"), "{o:?}");
}

/// Point 4: a folder scan skips what is not a pinguard report, naming it; a file named on the
/// command line that is not a report is still an error, and so is a damaged report in a folder.
#[test]
fn a_folder_scan_skips_other_files_and_reads_the_reports() {
    let dir = fresh_dir("mixed");
    synthetic(&dir, "app.1.json", 1, &[], 4096, 0, 0);
    std::fs::write(dir.join("config.json"), br#"{"model": "llama", "batch": 8}"#).unwrap();
    std::fs::write(dir.join("notes.json"), b"not json at all").unwrap();
    let d = dir.to_str().unwrap();
    for cmd in [&["report"][..], &["check", "--max-live", "1G"], &["plot", "-o", "/dev/null"]] {
        let mut args = cmd.to_vec();
        args.push(d);
        let o = pinguard(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
        let (_, err) = text(&o);
        assert_eq!(err.lines().count(), 2, "{args:?}: {err}");
        assert!(err.contains("config.json: not a pinguard report; skipped"), "{err}");
        assert!(err.contains("notes.json: not a pinguard report; skipped"), "{err}");
    }
    let (out, _) = text(&pinguard(&["report", d]));
    assert!(out.contains("SUMMARY: pinguard: 4096 bytes (4.00 KiB) pinned in 1 allocation across 1 process"), "{out}");
    let o = pinguard(&["report", dir.join("config.json").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "a file named explicitly stays an error");
    assert!(text(&o).1.contains("not a pinguard report"), "{o:?}");
    std::fs::write(dir.join("cut.json"), br#"{"schema": "pinguard.report.v1", "reason": "ex"#).unwrap();
    let o = pinguard(&["report", d]);
    assert_eq!(o.status.code(), Some(2), "a damaged report is not skipped: {o:?}");
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
            .args(["run", "--lib", f.lib.to_str().unwrap(), "--", f.dir.join("workload").to_str().unwrap()])
            .current_dir(&cwd)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        let (_, err) = text(&o);
        let hint = err.lines().find(|l| l.contains("Details: pinguard report ")).unwrap_or_else(|| panic!("{err}"));
        let folder = hint.rsplit("pinguard report ").next().unwrap().to_string();
        assert!(folder.starts_with("pinguard-reports/") && folder.ends_with('/') && folder.len() > "pinguard-reports/".len() + 1, "{hint}");
        assert!(err.contains(&format!("1 report under {folder}")), "{err}");
        let o = Command::new(env!("CARGO_BIN_EXE_pinguard")).args(["report", &folder]).current_dir(&cwd).output().unwrap();
        assert!(text(&o).0.contains("(1 report, 1 process)"), "{o:?}");
        folders.push(folder);
    }
    assert_ne!(folders[0], folders[1]);
    let o = Command::new(env!("CARGO_BIN_EXE_pinguard")).args(["report", "pinguard-reports"]).current_dir(&cwd).output().unwrap();
    assert!(text(&o).0.contains("(2 reports, 2 processes)"), "{o:?}");
}

/// Point 6: sizes say what is wrong with them; a command that is not executable is 126, one that
/// does not exist 127, as in the shell.
#[test]
fn bad_sizes_and_commands_get_their_own_answers() {
    let f = fixtures();
    let lib = f.lib.to_str().unwrap();
    for (args, why) in [
        (&["run", "--budget", "-1", "--", "true"][..], "negative sizes are not allowed"),
        (&["run", "--budget", "1e9", "--", "true"], "write the bytes (1000000000) or use a unit"),
        (&["run", "--budget", "12Q", "--", "true"], "unknown unit"),
        (&["run", "--signal", "KILL", "--", "true"], "cannot be caught safely"),
        (&["run", "--signal", "NOPE", "--", "true"], "unknown signal"),
        (&["run", "--downgrade-match", "a[", "--", "true"], "bad pattern"),
        (&["run", "--lib", lib, "--report", "r/%q.json", "--", "true"], "unknown escape \"%q\"; expected a path with %p"),
        (&["check", "--max-live", "-5G", "/dev/null"], "negative sizes are not allowed"),
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
    let o = Command::new(f.dir.join("workload")).env("LD_PRELOAD", &f.lib).env("PINGUARD_BUDGET", "1e9").env("PINGUARD_REPORT", fresh_dir("env1e9").join("r.json")).output().unwrap();
    assert!(text(&o).1.contains("PINGUARD_BUDGET=\"1e9\": 1e9 is a float's notation; write the bytes (1000000000)"), "{o:?}");
}

/// Point 7: every option of every command has a description, and every help states the exit
/// codes.
#[test]
fn every_option_is_described_and_every_help_states_exit_codes() {
    let o = pinguard(&["--help"]);
    let (out, _) = text(&o);
    assert!(out.contains("Exit status:") && out.contains("1  `check`: a limit was exceeded"), "{out}");
    for cmd in ["run", "report", "check", "diff", "flamegraph", "top", "plot"] {
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
            if !in_options || !(entry.starts_with('-') || entry.starts_with('<')) || l.starts_with("      ") && !l.trim_start().starts_with("--") {
                continue;
            }
            let described = entry.contains("  ") || lines.get(i + 1).is_some_and(|n| n.starts_with("          ") && !n.trim().is_empty());
            assert!(described, "{cmd}: no description for {entry:?}\n{out}");
        }
    }
    let (out, _) = text(&pinguard(&["run", "--help"]));
    assert!(out.contains("126") && out.contains("127") && out.contains("0 lets nothing be pinned"), "{out}");
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
    let o = pinguard(&["run", "--lib", f.lib.to_str().unwrap(), "--report", t.to_str().unwrap(), "--", "sh", "-c", &twice]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    let header = err.lines().find(|l| l.contains("CALLSITE")).unwrap_or_else(|| panic!("{err}"));
    let shared = err.lines().skip_while(|l| !l.contains("CALLSITE")).nth(1).unwrap_or_else(|| panic!("{err}"));
    assert_eq!(cell(header, shared, "PROCS"), "2", "{err}");
    assert!(err.contains("2 reports under"), "{err}");
    for o in [o.clone(), pinguard(&["report", dir.to_str().unwrap()]), pinguard(&["check", dir.to_str().unwrap()])] {
        let (out, err) = text(&o);
        for text in [out, err] {
            assert!(!text.contains("(s)") && !text.contains("(es)"), "{text}");
            assert!(!text.contains(" 1 allocations") && !text.contains(" 1 processes") && !text.contains(" 1 reports"), "{text}");
        }
    }
    let old = fresh_dir("diff-old");
    let new = fresh_dir("diff-new");
    let frames: &[(&str, &str, u32)] = &[("pin", "workers.py", 4)];
    for (d, live) in [(&old, 1u64 << 20), (&new, 2 << 20)] {
        synthetic(d, "a.json", 10, &[(frames, live, live)], live, 0, 0);
        synthetic(d, "b.json", 11, &[(frames, live, live)], live, 0, 0);
    }
    let (out, _) = text(&pinguard(&["diff", old.to_str().unwrap(), new.to_str().unwrap()]));
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
    assert_eq!(text(&o).0.trim(), "pinguard check: 3 calls stopped by the host reserve exceed --max-host-reserve 2");
    assert_eq!(pinguard(&["check", "--max-host-reserve", "3", d]).status.code(), Some(0));
    // Without a reserve in any report, nothing is said about one.
    let plain = fresh_dir("host-none");
    let p = synthetic(&plain, "c.json", 23, &[], 4096, 0, 0);
    assert!(!text(&pinguard(&["report", p.to_str().unwrap()])).0.contains("host reserve"));

    let (o, dir) = run_under("workload", &[], &["--host-reserve", "1M"]);
    assert!(o.status.success(), "{o:?}");
    let (_, err) = text(&o);
    assert!(err.contains("0 calls stopped by the host reserve of 1.00 MiB (lowest available"), "{err}");
    let header = err.lines().find(|l| l.trim_start().starts_with("PID  EXE")).unwrap_or_else(|| panic!("{err}"));
    let row = err.lines().find(|l| l.contains(" workload ")).unwrap();
    assert_eq!(cell(header, row, "HOST-RESERVE"), "0", "{header}\n{row}");
    let rep = read_json(&reports_in(&dir)[0]);
    assert_eq!(rep["config"]["host_reserve_bytes"], 1u64 << 20);
    let o = pinguard(&["run", "--host-reserve", "-1G", "--", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("negative sizes are not allowed"), "{o:?}");
}

/// Issue 21: `pinguard top` shows the host reserve of a group and of metrics files (a reserve far
/// below the host's available memory: nothing stopped).
#[test]
fn top_shows_the_host_reserve() {
    let name = format!("clitophost-{}", std::process::id());
    let ledger = pinguard_report::group::path(&name);
    let _ = std::fs::remove_file(&ledger);
    let mut holder = group_member(&name, ("PINGUARD_HOST_RESERVE", "1M"));
    let (text_out, _) = text(&pinguard(&["top", "--group", &name, "--once"]));
    holder.kill().unwrap();
    holder.wait().unwrap();
    remove_semaphores(&ledger);
    let _ = std::fs::remove_file(&ledger);
    assert!(text_out.lines().next().unwrap().contains("; host reserve 1.00 MiB, lowest available "), "{text_out}");
    let header = text_out.lines().find(|l| l.trim_start().starts_with("PID")).unwrap();
    let row = text_out.lines().find(|l| l.trim_start().starts_with(&holder.id().to_string())).unwrap_or_else(|| panic!("{text_out}"));
    assert_eq!(cell(header, row, "HOST-RESERVE"), "0", "{text_out}");

    let dir = fresh_dir("topmhost");
    let m = dir.join("m.%p.prom");
    run("scenario", &["cuda_alloc:8192"], &[("PINGUARD_METRICS", m.to_str().unwrap()), ("PINGUARD_HOST_RESERVE", "1M")]);
    let (text_out, _) = text(&pinguard(&["top", "--metrics", dir.to_str().unwrap(), "--once"]));
    assert!(text_out.lines().next().unwrap().contains("pinned in 1 process; lowest host memory available "), "{text_out}");
    let header = text_out.lines().find(|l| l.trim_start().starts_with("PID")).unwrap();
    let row = text_out.lines().find(|l| l.contains("scenario")).unwrap_or_else(|| panic!("{text_out}"));
    assert_eq!(cell(header, row, "HOST-RESERVE"), "0", "{text_out}");
}
