//! `pinguard export`: the example workload run under the real library, its reports exported in
//! every format and read back by that format's own reader (`go tool pprof`, inferno, speedscope's
//! schema), whose figures must be the ones `pinguard report` shows, merged runs included.

use crate::common;

use common::*;
use pinguard_common::EventKind;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn pinguard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args(args)
        .output()
        .unwrap()
}

/// A reader this test needs: present, or (where `PGTEST_REQUIRE_EXPORT_TOOLS` is unset) a
/// skip said on stderr. CI sets the variable, so a missing reader fails there.
fn reader(found: bool, what: &str) -> bool {
    if !found {
        let required = ["PGTEST_REQUIRE_EXPORT_TOOLS", "PGTEST_REQUIRE_ALL"]
            .iter()
            .any(|v| std::env::var_os(v).is_some());
        assert!(
            !required,
            "{what} is required (PGTEST_REQUIRE_EXPORT_TOOLS or PGTEST_REQUIRE_ALL is set)"
        );
        eprintln!("SKIPPED: {what} is not installed; .ci/run installs it");
    }
    found
}

/// The bundled example workload under `pinguard run --budget 3M` (one refusal, four callsites
/// still holding memory, one that pinned and released 100 times), its reports in a fresh folder.
fn workload_run(tag: &str) -> PathBuf {
    let f = fixtures();
    let dir = fresh_dir(tag);
    let template = dir.join("%e.%p.json");
    let exe = f.dir.join("workload");
    let o = pinguard(&[
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--budget",
        "3M",
        "--interval",
        "5ms",
        "--report",
        template.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    dir
}

/// Two runs of the workload: every export is of both, merged.
fn two_runs() -> [PathBuf; 2] {
    [workload_run("export-a"), workload_run("export-b")]
}

fn export(format: &str, extra: &[&str], inputs: &[PathBuf]) -> PathBuf {
    let out = inputs[0].join(format!("export.{format}.{}", extra.join("")));
    let mut a = vec!["export", "--format", format, "-o", out.to_str().unwrap()];
    a.extend_from_slice(extra);
    a.extend(inputs.iter().map(|p| p.to_str().unwrap()));
    let o = pinguard(&a);
    assert!(o.status.success(), "{a:?}: {o:?}");
    out
}

/// `pinguard report --json` of the inputs: the figures every export must carry.
fn merged(inputs: &[PathBuf]) -> Value {
    let mut a = vec!["report", "--json", "--top", "1000"];
    a.extend(inputs.iter().map(|p| p.to_str().unwrap()));
    let o = pinguard(&a);
    assert!(o.status.success(), "{o:?}");
    serde_json::from_slice(&o.stdout).unwrap()
}

fn sum(v: &Value, key: &str) -> u64 {
    v["callsites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c[key].as_u64().unwrap())
        .sum()
}

/// The bytes the budget refused, from the reports' own events (and checked against their totals).
fn refused_bytes(inputs: &[PathBuf]) -> u64 {
    let mut total = 0;
    for dir in inputs {
        for r in reports_in(dir).iter().map(|p| read_report(p)) {
            let denied: u64 = r
                .events
                .iter()
                .filter(|e| e.kind == EventKind::Denied)
                .map(|e| e.size)
                .sum();
            assert_eq!(denied, r.totals.denied_bytes, "events and totals agree");
            total += denied;
        }
    }
    total
}

/// A callsite's innermost frame as `pprof -lines` names it: `function file:line`.
fn leaf(c: &Value) -> String {
    let f = &c["frames"][0];
    format!(
        "{} {}:{}",
        f["symbol"].as_str().unwrap(),
        f["file"].as_str().unwrap(),
        f["line"]
    )
}

/// `go tool pprof`, or a `pprof` of its own on PATH.
fn pprof_command() -> Option<Vec<String>> {
    let on_path = |p: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if on_path("pprof") {
        return Some(vec!["pprof".into()]);
    }
    let go_pprof = on_path("go")
        && Command::new("go")
            .args(["tool", "pprof", "-h"])
            .output()
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stderr).contains("usage")
                    || String::from_utf8_lossy(&o.stdout).contains("usage")
            });
    go_pprof.then(|| vec!["go".into(), "tool".into(), "pprof".into()])
}

fn run_pprof(cmd: &[String], args: &[&str], file: &Path) -> String {
    let o = Command::new(&cmd[0])
        .args(&cmd[1..])
        .args(args)
        .arg(file)
        .env("HOME", file.parent().unwrap())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "pprof {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// A figure as pprof prints it with `-unit=B` (or a count): `2097152B`, `105`.
fn figure(s: &str) -> u64 {
    s.trim_end_matches('B')
        .parse()
        .unwrap_or_else(|_| panic!("not a figure: {s:?}"))
}

/// `pprof -top`: the total, and each row's flat figure by its name.
fn top(text: &str) -> (u64, Vec<(u64, String)>) {
    let total = text
        .lines()
        .find_map(|l| l.split(" of ").nth(1)?.strip_suffix(" total").map(figure))
        .expect("a total line");
    let rows = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1);
    let rows = rows.map(|l| {
        let cells: Vec<&str> = l.split_whitespace().collect();
        (figure(cells[0]), cells[5..].join(" "))
    });
    (total, rows.collect())
}

/// `pprof -traces`: each sample's value, labels, and frames (innermost first).
fn traces(text: &str) -> Vec<(u64, BTreeMap<String, String>, Vec<String>)> {
    let mut out = Vec::new();
    for block in text
        .split("-----------+-------------------------------------------------------")
        .skip(1)
    {
        if block.trim().is_empty() {
            continue;
        }
        let (mut labels, mut frames, mut value) = (BTreeMap::new(), Vec::new(), None);
        for l in block.lines().filter(|l| !l.trim().is_empty()) {
            let (head, rest) = l.split_at(10.min(l.len()));
            if let Some(v) = rest.strip_prefix(":  ") {
                labels.insert(head.trim().to_string(), v.to_string());
            } else if value.is_none() {
                value = Some(figure(head.trim()));
                frames.push(rest.trim().to_string());
            } else {
                frames.push(rest.trim().to_string());
            }
        }
        out.push((value.expect("a sample value"), labels, frames));
    }
    out
}

#[test]
fn pprof_reads_back_the_reports_figures_in_go_tool_pprof() {
    let Some(cmd) = pprof_command() else {
        reader(false, "go tool pprof (golang-go)");
        return;
    };
    let runs = two_runs();
    let m = merged(&runs);
    let file = export("pprof", &[], &runs);
    // Each sample type's total is the merged figure.
    let expect = [
        ("live", sum(&m, "live_bytes")),
        // Each process's peak at each callsite (a sample per process): `report`'s sum of them.
        ("peak", sum(&m, "peak_sum_bytes")),
        ("calls", sum(&m, "alloc_count")),
        ("refused", refused_bytes(&runs)),
        ("refused_calls", sum(&m, "denied_count")),
    ];
    assert_eq!(expect[0].1, m["totals"]["live_bytes"].as_u64().unwrap());
    assert_eq!(
        expect[0].1,
        2 * (2048 + 512 + 256 + 64) * 1024,
        "the workload's live bytes, twice"
    );
    assert_eq!(expect[3].1, 2 * 4 * 1024 * 1024, "a 4 MiB refusal per run");
    for (index, want) in expect {
        let unit: &[&str] = if index.contains("calls") {
            &[]
        } else {
            &["-unit=B"]
        };
        let args: Vec<String> = ["-top", "-lines", &format!("-sample_index={index}")]
            .iter()
            .map(|s| s.to_string())
            .chain(unit.iter().map(|s| s.to_string()))
            .collect();
        let (total, rows) = top(&run_pprof(
            &cmd,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            &file,
        ));
        assert_eq!(total, want, "{index}");
        // The top row is the report's top callsite by that figure.
        let key = match index {
            "live" => "live_bytes",
            "peak" => "peak_sum_bytes",
            "calls" => "alloc_count",
            _ => "denied_count",
        };
        let best = m["callsites"]
            .as_array()
            .unwrap()
            .iter()
            .max_by_key(|c| c[key].as_u64().unwrap())
            .unwrap();
        if index != "refused" && index != "refused_calls" {
            assert_eq!(
                rows[0],
                (best[key].as_u64().unwrap(), leaf(best)),
                "{index}: {rows:?}"
            );
        } else {
            assert_eq!(rows[0].1, leaf(best), "{index}: {rows:?}");
        }
    }
    // Every sample: its process, API and reason, and its callsite's figure from that report.
    let samples = traces(&run_pprof(
        &cmd,
        &["-traces", "-lines", "-unit=B", "-sample_index=live"],
        &file,
    ));
    let per_report: usize = runs
        .iter()
        .flat_map(|d| reports_in(d))
        .map(|p| read_report(&p).callsites.len())
        .sum();
    assert_eq!(
        samples.len(),
        per_report,
        "one sample per callsite of each report"
    );
    for c in m["callsites"].as_array().unwrap() {
        let mine: Vec<_> = samples.iter().filter(|s| s.2[0] == leaf(c)).collect();
        assert_eq!(mine.len(), 2, "{}: in each run", leaf(c));
        assert_eq!(
            mine.iter().map(|s| s.0).sum::<u64>(),
            c["live_bytes"].as_u64().unwrap(),
            "{}",
            leaf(c)
        );
        for (_, labels, frames) in mine {
            assert!(labels["process"].starts_with("workload["), "{labels:?}");
            assert_eq!(labels["api"], c["apis"][0].as_str().unwrap());
            assert_eq!(labels["reason"], "exit");
            assert_eq!(
                frames.len(),
                c["frames"].as_array().unwrap().len(),
                "a location per frame: {frames:?}"
            );
        }
    }
    // Mappings from the module list, with their build ids.
    let raw = run_pprof(&cmd, &["-raw"], &file);
    let report = read_report(&reports_in(&runs[0])[0]);
    let exe = report
        .modules
        .iter()
        .find(|m| m.path.ends_with("/workload"))
        .unwrap();
    assert!(raw.contains(exe.build_id.as_deref().unwrap()), "{raw}");
}

/// Inferno's flame graph of `folded`: each frame's width by its name, and the total.
fn inferno_widths(folded: &Path, unit: &str) -> (u64, BTreeMap<String, u64>) {
    let text = std::fs::read_to_string(folded).unwrap();
    let mut opts = inferno::flamegraph::Options::default();
    opts.count_name = unit.to_string();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, text.lines(), &mut svg).unwrap();
    let svg = String::from_utf8(svg).unwrap();
    let doc = roxmltree::Document::parse_with_options(
        &svg,
        roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        },
    )
    .unwrap();
    let (mut total, mut widths) = (0, BTreeMap::new());
    for t in doc.descendants().filter(|n| n.has_tag_name("title")) {
        let t = t.text().unwrap_or("");
        let Some((name, rest)) = t.rsplit_once(" (") else {
            continue;
        };
        let n: u64 = rest
            .split(' ')
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap();
        if name == "all" {
            total = n;
        } else {
            *widths.entry(name.to_string()).or_default() += n;
        }
    }
    (total, widths)
}

#[test]
fn folded_stacks_draw_the_reports_figures_in_inferno() {
    let runs = two_runs();
    let m = merged(&runs);
    for (weight, key) in [
        ("live", "live_bytes"),
        ("peak", "peak_sum_bytes"),
        ("calls", "alloc_count"),
    ] {
        let file = export("folded", &["--weight", weight], &runs);
        let (total, widths) = inferno_widths(&file, "bytes");
        assert_eq!(total, sum(&m, key), "{weight}");
        // Each callsite's innermost function is as wide as the report's figure for it (the
        // workload's functions each hold one callsite, but npu_staging, which holds two).
        for c in m["callsites"].as_array().unwrap() {
            let name = c["frames"][0]["symbol"].as_str().unwrap();
            let same: u64 = m["callsites"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|o| o["frames"][0]["symbol"] == name)
                .map(|o| o[key].as_u64().unwrap())
                .sum();
            assert_eq!(
                widths.get(name).copied().unwrap_or(0),
                same,
                "{weight} {name}: {widths:?}"
            );
        }
    }
    let file = export("folded", &["--weight", "refused"], &runs);
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.ends_with(&format!(
            "grow_kv_cache;[cudaHostAlloc] {}\n",
            refused_bytes(&runs)
        )),
        "{text}"
    );
}

#[test]
fn speedscope_files_follow_its_schema_and_carry_the_reports_figures() {
    let runs = two_runs();
    let m = merged(&runs);
    let file = export("speedscope", &["--weight", "peak"], &runs);
    let have_jsonschema = Command::new("/usr/bin/python3")
        .args(["-c", "import jsonschema"])
        .output()
        .is_ok_and(|o| o.status.success());
    if reader(have_jsonschema, "python3-jsonschema") {
        let schema = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/speedscope-file-format-schema.json");
        let check = "import json, sys, jsonschema; jsonschema.validate(json.load(open(sys.argv[2])), json.load(open(sys.argv[1]))); print('valid')";
        let o = Command::new("/usr/bin/python3")
            .args(["-c", check])
            .arg(&schema)
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            o.status.success() && o.stdout.starts_with(b"valid"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Replayed as speedscope does: each sample's weight to every frame of its stack.
    let doc: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let frames = doc["shared"]["frames"].as_array().unwrap();
    let p = &doc["profiles"][0];
    assert_eq!(p["unit"], "bytes");
    let weights: Vec<u64> = p["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_u64().unwrap())
        .collect();
    assert_eq!(weights.iter().sum::<u64>(), sum(&m, "peak_sum_bytes"));
    assert_eq!(p["endValue"].as_u64().unwrap(), sum(&m, "peak_sum_bytes"));
    let mut at: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for (s, w) in p["samples"].as_array().unwrap().iter().zip(&weights) {
        for i in s.as_array().unwrap() {
            let f = &frames[i.as_u64().unwrap() as usize];
            *at.entry((
                f["name"].as_str().unwrap().to_string(),
                f["line"].as_u64().unwrap_or(0),
            ))
            .or_default() += w;
        }
    }
    for c in m["callsites"].as_array().unwrap() {
        let f = &c["frames"][0];
        let key = (
            f["symbol"].as_str().unwrap().to_string(),
            f["line"].as_u64().unwrap(),
        );
        assert_eq!(
            at.get(&key).copied().unwrap_or(0),
            c["peak_sum_bytes"].as_u64().unwrap(),
            "{key:?}"
        );
    }
}

#[test]
fn perfetto_trace_follows_the_trace_event_format_with_a_track_per_process() {
    let runs = two_runs();
    let file = export("perfetto", &[], &runs);
    let doc: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let events = doc["traceEvents"]
        .as_array()
        .expect("the JSON Object Format: a traceEvents array");
    // The format's rules for the phases used: metadata names a process; counters and instants
    // have a time in microseconds, a pid and a tid; a counter's args are numbers; an instant has
    // a scope.
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        assert!(
            e["name"].is_string() && e["pid"].is_u64() && e["tid"].is_u64(),
            "{e}"
        );
        match ph {
            "M" => assert!(
                ["process_name", "thread_name"].contains(&e["name"].as_str().unwrap())
                    && e["args"]["name"].is_string(),
                "{e}"
            ),
            "C" => assert!(
                e["ts"].is_u64()
                    && e["args"]
                        .as_object()
                        .unwrap()
                        .values()
                        .all(Value::is_number),
                "{e}"
            ),
            "i" => assert!(
                e["ts"].is_u64() && ["g", "p", "t"].contains(&e["s"].as_str().unwrap()),
                "{e}"
            ),
            _ => panic!("unexpected phase {ph}: {e}"),
        }
    }
    let origin: u64 = doc["otherData"]["origin_unix_ms"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let reports: Vec<Report> = runs
        .iter()
        .flat_map(|d| reports_in(d))
        .map(|p| read_report(&p))
        .collect();
    assert_eq!(reports.len(), 2);
    let pids: std::collections::BTreeSet<u64> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "a track per process");
    for r in &reports {
        let pid = r.process.pid;
        let mine = |name: &'static str| {
            events
                .iter()
                .filter(move |e| e["pid"] == pid && e["name"] == name)
        };
        // The timeline, point for point.
        let points: Vec<(u64, u64)> = mine("pinned bytes")
            .map(|e| {
                (
                    e["ts"].as_u64().unwrap(),
                    e["args"]["bytes"].as_u64().unwrap(),
                )
            })
            .collect();
        let want: Vec<(u64, u64)> = r
            .timeline
            .iter()
            .map(|&(ms, bytes)| ((ms - origin) * 1000, bytes))
            .collect();
        assert!(want.len() >= 2, "the workload's timeline has points");
        assert_eq!(points, want);
        assert!(mine("budget").all(|e| e["args"]["bytes"] == 3 * 1024 * 1024));
        // The refusal, with its callsite named as `pinguard report` names it.
        let refusals: Vec<&Value> = events
            .iter()
            .filter(|e| e["pid"] == pid && e["cat"] == "denied")
            .collect();
        assert_eq!(refusals.len(), 1);
        let a = &refusals[0]["args"];
        assert_eq!(a["callsite"], "grow_kv_cache (workload.c:56)", "{a}");
        assert_eq!(a["size_bytes"], 4 * 1024 * 1024);
        assert_eq!(a["api"], "cudaHostAlloc");
        assert_eq!(a["limit"], "budget");
        let ev = &r.events[0];
        assert_eq!(
            refusals[0]["ts"].as_u64().unwrap(),
            (ev.unix_ms - origin) * 1000
        );
    }
}

#[test]
fn bad_inputs_and_empty_weights_get_one_line_and_exit_2() {
    let dir = fresh_dir("export-bad");
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "{\"schema\": \"pinguard.report.v1\"").unwrap();
    for args in [
        vec!["export", "--format", "pprof", junk.to_str().unwrap()],
        vec!["export", "--format", "svg", junk.to_str().unwrap()],
        vec!["export", "--format", "folded", "/nonexistent"],
    ] {
        let o = pinguard(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{err}");
    }
    // A run that refused nothing: folded by refused bytes has nothing to say, and says so.
    let f = fixtures();
    let dir = fresh_dir("export-unrefused");
    let o = pinguard(&[
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--report",
        dir.join("%e.%p.json").to_str().unwrap(),
        "--",
        f.dir.join("workload").to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let o = pinguard(&[
        "export",
        "--format",
        "folded",
        "--weight",
        "refused",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no callsite has refused bytes"),
        "{o:?}"
    );
}

#[test]
fn a_killed_processs_state_is_exported_with_the_reports_figures() {
    let Some(cmd) = pprof_command() else {
        reader(false, "go tool pprof (golang-go)");
        return;
    };
    let dir = fresh_dir("export-killed");
    let held = Held::start(&dir, &["cuda_alloc:65536", "cuda_alloc:8192"], &[]);
    let pid = held.pid();
    held.kill();
    assert!(
        std::fs::read_dir(&dir).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".state")),
        "SIGKILL leaves the state"
    );
    let runs = [dir.clone(), workload_run("export-with-killed")];
    let m = merged(&runs);
    assert!(
        m["per_process"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["reason"] == "killed" && p["pid"] == pid),
        "{m}"
    );
    let file = export("pprof", &[], &runs);
    let (total, _) = top(&run_pprof(
        &cmd,
        &["-top", "-unit=B", "-sample_index=live"],
        &file,
    ));
    assert_eq!(total, m["totals"]["live_bytes"].as_u64().unwrap());
    assert!(
        total >= (64 + 8) * 1024 + (2048 + 512 + 256 + 64) * 1024,
        "{total}"
    );
    let killed: u64 = traces(&run_pprof(
        &cmd,
        &["-traces", "-unit=B", "-sample_index=live"],
        &file,
    ))
    .iter()
    .filter(|s| s.1["reason"] == "killed")
    .map(|s| s.0)
    .sum();
    assert_eq!(
        killed,
        (64 + 8) * 1024,
        "the killed process's samples say so"
    );
    let folded = std::fs::read_to_string(export("folded", &[], &runs)).unwrap();
    let sum_folded: u64 = folded
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum_folded, total);
}

/// Gives callsite `i` of a report these Python frames (function, file, line), innermost first,
/// as the library writes them for a Python caller.
fn with_py_frames(p: &Path, i: usize, frames: &[(&str, &str, u32)]) {
    // Edits the file as written (JSON), keeping every key the types would not.
    let mut r: Value = read_json(p);
    r["callsites"][i]["py_frames"] = frames.iter().map(|(s, f, l)| serde_json::json!({"addr": "0x0", "module": f, "offset": null, "symbol": s, "file": f, "line": l})).collect::<Vec<_>>().into();
    std::fs::write(p, serde_json::to_vec(&r).unwrap()).unwrap();
}

#[test]
fn python_frames_are_functions_of_their_own_marked_py() {
    let dir = workload_run("export-py");
    let report = reports_in(&dir)[0].clone();
    with_py_frames(
        &report,
        0,
        &[
            ("load_weights", "/srv/train.py", 12),
            ("main", "/srv/train.py", 88),
        ],
    );
    let live = read_report(&report).callsites[0].live_bytes;
    let folded =
        std::fs::read_to_string(export("folded", &[], std::slice::from_ref(&dir))).unwrap();
    assert!(
        folded
            .lines()
            .any(|l| l.starts_with("main [py];load_weights [py];")
                && l.ends_with(&format!(" {live}"))),
        "{folded}"
    );
    let speedscope: Value = serde_json::from_slice(
        &std::fs::read(export("speedscope", &[], std::slice::from_ref(&dir))).unwrap(),
    )
    .unwrap();
    assert!(
        speedscope["shared"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == "load_weights [py]"
                && f["file"] == "/srv/train.py"
                && f["line"] == 12),
        "{speedscope}"
    );
    let Some(cmd) = pprof_command() else {
        reader(false, "go tool pprof (golang-go)");
        return;
    };
    let file = export("pprof", &[], std::slice::from_ref(&dir));
    let (_, rows) = top(&run_pprof(
        &cmd,
        &["-top", "-cum", "-lines", "-unit=B", "-sample_index=live"],
        &file,
    ));
    let cum = run_pprof(
        &cmd,
        &["-top", "-cum", "-lines", "-unit=B", "-sample_index=live"],
        &file,
    );
    assert!(
        cum.lines().any(|l| l.contains(&format!(" {live}B"))
            && l.ends_with("load_weights [py] /srv/train.py:12")),
        "{cum}"
    );
    assert!(
        rows.iter().all(|r| !r.1.contains("[py]") || r.0 == 0),
        "Python frames hold nothing themselves: {rows:?}"
    );
    // Told apart by their system name too (`-symbolize=none -raw` lists the functions).
    let raw = run_pprof(&cmd, &["-raw"], &file);
    assert!(raw.contains("py:load_weights"), "{raw}");
}

/// More refusals than a process keeps events for (10,000): pprof's refused bytes are the
/// callsites' own `denied_bytes`, not the short sum of the events kept, and so are `folded`'s and
/// `pinguard report`'s.
#[test]
fn refused_bytes_are_the_callsites_own_when_events_were_dropped() {
    let f = fixtures();
    let dir = fresh_dir("export-refusals");
    let n = 10_050u64;
    let exe = f.dir.join("refusals");
    let o = pinguard(&[
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--budget",
        "4K",
        "--report",
        dir.join("%e.%p.json").to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
        &n.to_string(),
    ]);
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("refused={n}")),
        "{o:?}"
    );
    let r = read_report(&reports_in(&dir)[0]);
    assert_eq!(r.events_dropped, n - 10_000);
    let want: u64 = r.callsites.iter().map(|c| c.denied_bytes.unwrap()).sum();
    assert_eq!(want, n * 8192);
    let runs = [dir.clone()];
    let folded =
        std::fs::read_to_string(export("folded", &["--weight", "refused"], &runs)).unwrap();
    let sum_folded: u64 = folded
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum_folded, want, "{folded}");
    let text =
        String::from_utf8_lossy(&pinguard(&["report", dir.to_str().unwrap()]).stdout).into_owned();
    assert!(
        text.contains(&format!("{n} calls refused for 78.5 MiB (nothing live)")),
        "{text}"
    );
    let Some(cmd) = pprof_command() else {
        reader(false, "go tool pprof (golang-go)");
        return;
    };
    let file = export("pprof", &[], &runs);
    let (total, _) = top(&run_pprof(
        &cmd,
        &["-top", "-unit=B", "-sample_index=refused"],
        &file,
    ));
    assert_eq!(total, want);
    let raw = run_pprof(&cmd, &["-raw"], &file);
    assert!(!raw.contains("refused bytes are short"), "{raw}");
}

/// A counter track per process and entry point (`pinned bytes cudaHostAlloc`), point for point
/// the report's `timeline_apis`; a report written before them has the process's track only.
#[test]
fn perfetto_draws_a_counter_track_per_process_and_entry_point() {
    let f = fixtures();
    let dir = fresh_dir("export-api-tracks");
    let exe = f.dir.join("api_steps");
    let o = pinguard(&[
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--report",
        dir.join("%e.%p.json").to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let path = reports_in(&dir)[0].clone();
    let r = read_report(&path);
    let pid = r.process.pid;
    let apis = &r.timeline_apis;
    assert_eq!(
        apis.len(),
        2,
        "the report's per-entry-point timelines: {r:?}"
    );
    let trace = |dir: &Path| -> (u64, Vec<Value>) {
        let doc: Value = serde_json::from_slice(
            &std::fs::read(export("perfetto", &[], &[dir.to_path_buf()])).unwrap(),
        )
        .unwrap();
        (
            doc["otherData"]["origin_unix_ms"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap(),
            doc["traceEvents"].as_array().unwrap().clone(),
        )
    };
    let (origin, events) = trace(&dir);
    let track = |events: &[Value], name: &str| -> Vec<(u64, u64)> {
        events
            .iter()
            .filter(|e| e["ph"] == "C" && e["pid"] == pid && e["name"] == name)
            .map(|e| {
                (
                    e["ts"].as_u64().unwrap(),
                    e["args"]["bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    for (api, points) in apis {
        let want: Vec<(u64, u64)> = points
            .iter()
            .map(|&(ms, bytes)| ((ms - origin) * 1000, bytes))
            .collect();
        assert_eq!(
            track(&events, &format!("pinned bytes {api}")),
            want,
            "{api}"
        );
    }
    let per_api = |events: &[Value]| {
        events
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"].as_str().unwrap().starts_with("pinned bytes "))
            .count()
    };
    assert_eq!(per_api(&events), apis.values().map(Vec::len).sum::<usize>());
    // The same report as an older pinguard wrote it: the process's track, and no other.
    let old = fresh_dir("export-api-tracks-old");
    // JSON: the file as an older pinguard wrote it, without the key.
    let mut r_old = read_json(&path);
    r_old.as_object_mut().unwrap().remove("timeline_apis");
    std::fs::write(
        old.join(path.file_name().unwrap()),
        serde_json::to_vec(&r_old).unwrap(),
    )
    .unwrap();
    let (_, events) = trace(&old);
    assert_eq!(per_api(&events), 0);
    assert_eq!(track(&events, "pinned bytes").len(), r.timeline.len());
}

/// Issue 46 item 9: a gzipped profile is never written to a terminal (as `flamegraph` refuses
/// its SVG); to a pipe or a file it is. The terminal is a real pseudo-terminal (`script`).
#[test]
fn a_binary_export_to_a_terminal_is_refused_and_to_a_pipe_is_written() {
    let [run, _] = two_runs();
    let cmd = format!(
        "{} export --format pprof {}; echo rc=$?",
        env!("CARGO_BIN_EXE_pinguard"),
        run.display()
    );
    let Ok(out) = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
    else {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "script (util-linux) is needed"
        );
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("refusing to write a gzipped pprof profile to the terminal")
            && text.contains("rc=2"),
        "{text}"
    );
    let piped = pinguard(&["export", "--format", "pprof", &run.to_string_lossy()]);
    assert!(piped.status.success(), "{piped:?}");
    assert_eq!(&piped.stdout[..2], &[0x1f, 0x8b], "gzip to a pipe");
}

/// Issue 46, item 7: the `pinned bytes` counter reaches the report's peak and ends at its live
/// bytes, also for a rise and fall shorter than a tick of the timeline's clock (microseconds
/// here, between two points of the old timeline).
#[test]
fn perfetto_pinned_bytes_reach_the_peak_and_end_at_the_live_bytes() {
    let f = fixtures();
    let dir = fresh_dir("export-spike");
    let template = dir.join("%e.%p.json");
    let exe = f.dir.join("scenario");
    let o = pinguard(&[
        "run",
        "--lib",
        f.lib.to_str().unwrap(),
        "--report",
        template.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
        "cuda_alloc:8192",
        "cuda_alloc:65536",
        "cuda_free:1",
    ]);
    assert!(o.status.success(), "{o:?}");
    let mut runs = vec![dir];
    runs.extend(two_runs());
    let file = export("perfetto", &[], &runs);
    let doc: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let reports: Vec<Report> = runs
        .iter()
        .flat_map(|d| reports_in(d))
        .map(|p| read_report(&p))
        .collect();
    assert_eq!(reports.len(), 3);
    assert_eq!(reports[0].totals.peak_live_bytes, 72 * 1024);
    for r in &reports {
        let pid = r.process.pid;
        let counter: Vec<u64> = events
            .iter()
            .filter(|e| e["pid"] == pid && e["name"] == "pinned bytes")
            .map(|e| e["args"]["bytes"].as_u64().unwrap())
            .collect();
        let t = &r.totals;
        assert_eq!(
            counter.iter().max().copied(),
            Some(t.peak_live_bytes),
            "{counter:?}"
        );
        assert_eq!(counter.last().copied(), Some(t.live_bytes), "{counter:?}");
    }
}
