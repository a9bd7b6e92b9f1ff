//! The report written at exit: every key of the contract, callsites that start at the caller,
//! atomic and private files, the path template, and the one summary line.

use crate::common;
use common::*;
use pinguard_common::{Callsite, EventKind, Reason};
use std::os::unix::fs::PermissionsExt;

fn top_symbol(cs: &Callsite) -> String {
    cs.frames
        .first()
        .and_then(|f| f.symbol.clone())
        .unwrap_or_default()
}

#[test]
fn workload_report_has_every_key_and_names_the_callers() {
    let r = run("workload", &[], &[("PINGUARD_BUDGET", "3M")]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    // The key set is the contract: checked in the file's own JSON, where an absent key shows
    // (the types would fill a defaulted field in).
    let raw = r.report_json();
    for key in [
        "schema",
        "reason",
        "process",
        "config",
        "totals",
        "apis",
        "kernel",
        "modules",
        "callsites",
        "live",
        "events",
        "timeline",
    ] {
        assert!(raw.get(key).is_some(), "missing {key}");
    }
    for key in [
        "pid",
        "ppid",
        "exe",
        "cmdline",
        "hostname",
        "start_unix_ms",
        "write_unix_ms",
    ] {
        assert!(raw["process"].get(key).is_some(), "missing process.{key}");
    }
    for key in ["budget_bytes", "policy", "depth", "hooks", "errors"] {
        assert!(raw["config"].get(key).is_some(), "missing config.{key}");
    }
    for key in [
        "live_bytes",
        "live_count",
        "peak_live_bytes",
        "alloc_count",
        "alloc_bytes",
        "release_count",
        "failed_count",
        "denied_count",
        "denied_bytes",
        "downgraded_count",
        "downgraded_bytes",
        "downgraded_live_bytes",
        "over_budget_count",
        "unknown_release_count",
        "kernel_pinned_bytes",
    ] {
        assert!(
            raw["totals"][key].is_u64(),
            "totals.{key} is not an integer"
        );
    }
    for key in [
        "vm_lck_bytes",
        "vm_pin_bytes",
        "rlimit_memlock_bytes",
        "smaps_walk_count",
    ] {
        assert!(raw["kernel"].get(key).is_some(), "missing kernel.{key}");
    }
    // Addresses are hex strings in the file.
    for c in raw["callsites"].as_array().unwrap() {
        for fr in c["frames"].as_array().unwrap() {
            assert!(fr["addr"].as_str().unwrap().starts_with("0x"), "{c}");
        }
    }
    let rep = r.typed_report();
    assert_eq!(rep.schema, "pinguard.report.v1");
    assert_eq!(rep.reason, Reason::Exit);
    assert!(rep.process.exe.ends_with("/workload"), "{:?}", rep.process);

    // The workload keeps 2 MiB of weights, 512 KiB + 256 KiB on the NPU side and 64 KiB locked;
    // its 4 MiB request is refused.
    let t = &rep.totals;
    let kib = 1024;
    assert_eq!(t.live_bytes, 2048 * kib + 512 * kib + 256 * kib + 64 * kib);
    assert_eq!(t.live_count, 5);
    assert_eq!(t.alloc_count, 2 + 100 + 2 + 1);
    assert_eq!(t.release_count, 100);
    assert_eq!(t.denied_count, 1);
    assert_eq!(t.denied_bytes, 4096 * kib);
    assert_eq!(api_stats(&rep, "cudaMallocHost").alloc_count, 100);
    assert_eq!(api_stats(&rep, "cudaMallocHost").live_bytes, 0);

    // Callsites: sorted by live bytes, first frame in the caller, no pinguard frame anywhere.
    let cs = &rep.callsites;
    let live: Vec<u64> = cs.iter().map(|c| c.live_bytes).collect();
    assert!(live.windows(2).all(|w| w[0] >= w[1]), "{live:?}");
    assert_eq!(top_symbol(&cs[0]), "load_model_weights");
    assert_eq!(cs[0].live_bytes, 2048 * kib);
    assert_eq!(cs[0].live_count, 2);
    assert_eq!(cs[0].apis, ["cudaHostAlloc"]);
    assert!(cs[0].frames[0]
        .file
        .as_deref()
        .unwrap()
        .ends_with("workload.c"));
    assert!(cs[0].frames[0].line.unwrap() > 0);
    let names: Vec<String> = cs.iter().map(top_symbol).collect();
    for f in [
        "pin_batches",
        "npu_staging",
        "lock_key_material",
        "grow_kv_cache",
    ] {
        assert!(
            names.iter().any(|n| n == f),
            "no callsite in {f}: {names:?}"
        );
    }
    let batches = cs.iter().find(|c| top_symbol(c) == "pin_batches").unwrap();
    assert_eq!(batches.peak_live_bytes, 256 * kib);
    assert_eq!(batches.alloc_count, 100);
    for c in cs {
        for fr in &c.frames {
            assert!(
                !fr.module.as_deref().unwrap_or("").contains("libpinguard"),
                "pinguard frame in {c:?}"
            );
        }
    }
    assert!(rep
        .modules
        .iter()
        .any(|m| m.path.ends_with("/workload") && m.build_id.is_some()));

    // The refusal is an event pointing at grow_kv_cache's callsite.
    let ev = &rep.events[0];
    assert_eq!(ev.kind, EventKind::Denied);
    assert_eq!(ev.api, "cudaHostAlloc");
    let site = cs.iter().find(|c| c.id == ev.callsite).unwrap();
    assert_eq!(top_symbol(site), "grow_kv_cache");
    assert_eq!(site.denied_count, 1);

    // Live allocations name their callsite, thread and API.
    let live = &rep.live;
    assert_eq!(live.len(), 5);
    assert!(live
        .iter()
        .all(|l| l.tid > 0 && cs.iter().any(|c| c.id == l.callsite)));
    assert!(!rep.timeline.is_empty());
    assert_eq!(rep.timeline.last().unwrap().1, t.live_bytes);

    // One summary line at exit.
    let summary: Vec<_> = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("at exit"))
        .collect();
    assert_eq!(summary.len(), 1, "{}", r.stderr);
    assert!(
        summary[0].contains("2.81 MiB pinned in 5 allocations"),
        "{}",
        summary[0]
    );
    assert!(
        summary[0].contains("budget 3.00 MiB") && summary[0].contains("1 denied"),
        "{}",
        summary[0]
    );
    assert!(summary[0].contains("report: "), "{}", summary[0]);
}

#[test]
fn report_files_are_private_atomic_and_never_written_through_a_symlink() {
    let dir = fresh_dir("tmpl");
    let template = dir.join("deep/er/%e-%p-%%.json");
    let decoy = dir.join("decoy.txt");
    std::fs::write(&decoy, "keep me").unwrap();
    let r0 = run(
        "scenario",
        &["mlock:0:1"],
        &[("PINGUARD_REPORT", template.to_str().unwrap())],
    );
    let out_dir = dir.join("deep/er");
    let files: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        files.len(),
        1,
        "exactly the report, no temporary left: {files:?}"
    );
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("scenario-") && name.ends_with("-%.json"),
        "{name}"
    );
    let pid: u32 = name["scenario-".len()..name.len() - "-%.json".len()]
        .parse()
        .unwrap();
    assert_eq!(read_report(&files[0]).process.pid, pid);
    let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(r0.stderr.contains(&files[0].display().to_string()));

    // A symlink where the report goes is replaced, not followed (an exact path through the C API).
    let fixed = dir.join("fixed.json");
    std::os::unix::fs::symlink(&decoy, &fixed).unwrap();
    let capi = fixtures().dir.join("capi");
    let r = run(capi.to_str().unwrap(), &[fixed.to_str().unwrap()], &[]);
    assert!(r.success() && r.stdout.contains("write=0"), "{}", r.stdout);
    assert_eq!(std::fs::read_to_string(&decoy).unwrap(), "keep me");
    assert!(!std::fs::symlink_metadata(&fixed)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(read_report(&fixed).schema, "pinguard.report.v1");
}

#[test]
fn default_report_falls_back_to_the_temp_dir_when_the_working_directory_is_read_only() {
    let f = fixtures();
    let ro = fresh_dir("ro");
    let tmp = fresh_dir("tmp");
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    // Root ignores directory permissions: use a directory that cannot be written even by root.
    // SAFETY: geteuid takes nothing and cannot fail.
    let cwd = if unsafe { libc_geteuid() } == 0 {
        std::path::PathBuf::from("/proc/self")
    } else {
        ro.clone()
    };
    let out = program(&f.dir.join("scenario"), Some(f.lib.as_os_str()))
        .arg("mlock:0:1")
        .current_dir(&cwd)
        .env_remove("PINGUARD_REPORT")
        // One page locked: reported only below the quiet threshold's default.
        .env("PINGUARD_QUIET_BELOW", "0")
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert!(out.status.success());
    let files = reports_in(&tmp);
    assert_eq!(files.len(), 1, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(files[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("pinguard.scenario."));
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

#[test]
fn the_exit_line_counts_over_budget_calls_and_allocations_in_the_right_number() {
    let summary = |r: &Run| -> String {
        let lines: Vec<_> = pinguard_lines(&r.stderr)
            .into_iter()
            .filter(|l| l.contains("at exit"))
            .collect();
        assert_eq!(lines.len(), 1, "{}", r.stderr);
        lines[0].to_string()
    };
    // Under `warn`, three calls over a 16 KiB budget: all pinned, each counted over budget.
    let r = run(
        "scenario",
        &["cuda_alloc:32768", "cuda_alloc:32768", "acl_malloc:32768"],
        &[("PINGUARD_BUDGET", "16K"), ("PINGUARD_POLICY", "warn")],
    );
    assert!(r.success(), "{}", r.stderr);
    let s = summary(&r);
    assert!(s.contains("96.0 KiB pinned in 3 allocations at exit (peak 96.0 KiB, budget 16.0 KiB); 0 denied, 0 downgraded, 3 over budget; report: "), "{s}");
    assert_eq!(r.typed_report().totals.over_budget_count, 3);
    // One allocation is one allocation; no over-budget count where the policy cannot have any.
    let r = run(
        "scenario",
        &["cuda_alloc:4096"],
        &[("PINGUARD_BUDGET", "16K")],
    );
    let s = summary(&r);
    assert!(s.contains("4.00 KiB pinned in 1 allocation at exit (peak 4.00 KiB, budget 16.0 KiB); 0 denied, 0 downgraded; report: "), "{s}");
}

/// Refused calls past the events' bound (10,000): each callsite still has the bytes it was
/// refused, and so has the folded aggregate's line, whatever the events kept.
#[test]
fn refused_bytes_per_callsite_outlast_the_dropped_events() {
    let n = 10_050u64;
    let r = run("refusals", &[&n.to_string()], &[("PINGUARD_BUDGET", "4K")]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains(&format!("refused={n}")), "{}", r.stdout);
    let rep = r.typed_report();
    assert_eq!(rep.events_dropped, n - 10_000);
    let site = rep
        .callsites
        .iter()
        .find(|c| top_symbol(c) == "ask")
        .unwrap();
    assert_eq!(site.denied_count, n);
    assert_eq!(site.denied_bytes, Some(n * 8192));
    assert_eq!(site.downgraded_bytes, Some(0));
    assert_eq!(rep.totals.denied_bytes, n * 8192);
    let kept: u64 = rep
        .events
        .iter()
        .filter(|e| e.callsite == site.id)
        .map(|e| e.size)
        .sum();
    assert_eq!(
        kept,
        10_000 * 8192,
        "the events are bounded; the callsite's bytes are not"
    );
}

/// Under `downgrade` the bytes served unpinned are the callsite's too.
#[test]
fn downgraded_bytes_per_callsite_are_in_the_report() {
    let r = run(
        "refusals",
        &["3"],
        &[("PINGUARD_BUDGET", "4K"), ("PINGUARD_POLICY", "downgrade")],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("refused=0"), "{}", r.stdout);
    let rep = r.typed_report();
    let site = rep
        .callsites
        .iter()
        .find(|c| top_symbol(c) == "ask")
        .unwrap();
    assert_eq!(site.downgraded_count, 3);
    assert_eq!(site.downgraded_bytes, Some(3 * 8192));
    assert_eq!(site.denied_bytes, Some(0));
}

/// Each entry point has a timeline of its own (`timeline_apis`): a point at every timeline point
/// its call made, with its live bytes then, and one at the last point with its figure at exit.
#[test]
fn each_entry_point_has_its_own_timeline() {
    let r = run("api_steps", &[], &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("rc=0,0,0,0,0"), "{}", r.stdout);
    let rep = r.typed_report();
    let k = 1024u64;
    let series = |api: &str| -> Vec<(u64, u64)> {
        rep.timeline_apis
            .get(api)
            .unwrap_or_else(|| panic!("no timeline for {api}: {rep:?}"))
            .clone()
    };
    let (host_alloc, malloc_host) = (series("cudaHostAlloc"), series("cudaMallocHost"));
    let values = |s: &[(u64, u64)]| s.iter().map(|p| p.1).collect::<Vec<_>>();
    // cudaHostAlloc's calls and the release of its first record, then its figure at exit.
    assert_eq!(
        values(&host_alloc),
        [8 * k, 16 * k, 8 * k, 8 * k],
        "{rep:?}"
    );
    assert_eq!(values(&malloc_host), [16 * k, 0, 0], "{rep:?}");
    assert_eq!(rep.timeline_apis.len(), 2, "{rep:?}");
    // Every point is at a point of the process's timeline, whose figure is the entry points' sum.
    let timeline = &rep.timeline;
    assert_eq!(
        timeline.iter().map(|p| p.1).collect::<Vec<_>>(),
        [8 * k, 24 * k, 32 * k, 24 * k, 8 * k, 8 * k],
        "{rep:?}"
    );
    for s in [&host_alloc, &malloc_host] {
        assert!(
            s.iter().all(|p| timeline.iter().any(|t| t.0 == p.0)),
            "{s:?} {timeline:?}"
        );
        assert_eq!(s.last().unwrap().0, timeline.last().unwrap().0);
    }
    assert_eq!(
        host_alloc.last().unwrap().1,
        api_stats(&rep, "cudaHostAlloc").live_bytes
    );
    assert_eq!(
        malloc_host.last().unwrap().1,
        api_stats(&rep, "cudaMallocHost").live_bytes
    );
}

/// Issue 46, item 7: the timeline keeps each tick's highest and lowest, so a rise and fall
/// between two of its points (here microseconds long, within one tick of the coarse clock) is in
/// it: its highest is the report's peak, its lowest the dip to nothing, its last the live bytes.
#[test]
fn the_timeline_keeps_each_ticks_highest_and_lowest() {
    let k = 1024u64;
    let r = run(
        "scenario",
        &[
            "cuda_alloc:8192",
            "cuda_alloc:65536",
            "cuda_free:1",
            "cuda_free:0",
            "cuda_alloc:16384",
        ],
        &[],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let rep = r.typed_report();
    let values: Vec<u64> = rep.timeline.iter().map(|p| p.1).collect();
    assert_eq!(rep.totals.peak_live_bytes, 72 * k, "{rep:?}");
    assert_eq!(values.iter().max(), Some(&(72 * k)), "{values:?}");
    assert_eq!(values.last(), Some(&(16 * k)), "{values:?}");
    // The dip between the frees and the last allocation.
    let top = values.iter().position(|&v| v == 72 * k).unwrap();
    assert!(values[top..].contains(&0), "{values:?}");
    // In the order they happened: never back up to the peak after the dip.
    let dip = top + values[top..].iter().position(|&v| v == 0).unwrap();
    assert!(values[dip..].iter().all(|&v| v <= 16 * k), "{values:?}");
}
