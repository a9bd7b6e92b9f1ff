//! Chrome's trace-event JSON (the "JSON Object Format" of the Trace Event Format), which the
//! Perfetto UI, its trace processor and chrome://tracing open: per process a counter track of
//! pinned bytes over time (its timeline), one per entry point (`timeline_apis`), and its limits
//! as counters, and an instant event per
//! refusal, downgrade and over-budget call with its callsite.

use super::{Data, Proc};
use pinguard_common::units::format_bytes;
use pinguard_common::{EventKind, Limit};
use serde_json::{json, Value};
use std::collections::HashSet;

/// Microseconds from `origin` (the trace's zero) to `unix_ms`.
fn us(unix_ms: u64, origin: u64) -> u64 {
    unix_ms.saturating_sub(origin) * 1000
}

fn kind_name(k: EventKind) -> &'static str {
    match k {
        EventKind::Denied => "denied",
        EventKind::Downgraded => "downgraded",
        EventKind::OverBudget => "over_budget",
        EventKind::Failed => "failed",
    }
}

fn limit_name(l: Limit) -> &'static str {
    match l {
        Limit::Budget => "budget",
        Limit::GroupBudget => "group_budget",
        Limit::HostReserve => "host_reserve",
        Limit::GroupUnavailable => "group_unavailable",
        Limit::CgroupReserve => "cgroup_reserve",
        Limit::ConfigError => "config_error",
    }
}

/// The limits a process had, each as a counter name and bytes.
fn limits(p: &Proc) -> Vec<(&'static str, u64)> {
    let r = &p.report;
    let mut out = Vec::new();
    if let Some(b) = r.config.budget_bytes {
        out.push(("budget", b));
    }
    if let Some(b) = r.group.as_ref().and_then(|g| g.budget_bytes) {
        out.push(("group budget", b));
    }
    if let Some(b) = r
        .config
        .host_reserve_bytes
        .or(r.host.as_ref().map(|h| h.reserve_bytes))
    {
        out.push(("host reserve", b));
    }
    if let Some(b) = r
        .config
        .cgroup_reserve_bytes
        .or(r.cgroup.as_ref().map(|c| c.reserve_bytes))
    {
        out.push(("cgroup reserve", b));
    }
    out
}

/// A counter sample: track `name` of process `pid`, one series named after the unit.
fn counter(name: &str, pid: u32, ts: u64, bytes: u64) -> Value {
    json!({ "name": name, "ph": "C", "pid": pid, "tid": pid, "ts": ts, "args": { "bytes": bytes } })
}

/// The events of one process: its names, counters and instants.
fn process_events(d: &Data, p: &Proc, pid: u32, origin: u64, out: &mut Vec<Value>) {
    let r = &p.report;
    let pr = &r.process;
    let name = format!(
        "{} (pid {}) on {}",
        crate::merge::basename(&pr.exe),
        pr.pid,
        pr.hostname
    );
    out.push(json!({ "name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": { "name": name } }));
    out.push(json!({ "name": "thread_name", "ph": "M", "pid": pid, "tid": pid, "args": { "name": "refused, downgraded and over-budget calls" } }));
    for &(t, v) in &r.timeline {
        out.push(counter("pinned bytes", pid, us(t, origin), v));
    }
    // A track per entry point, where the report has them (`timeline_apis`, since issue 37).
    for (api, points) in &r.timeline_apis {
        let name = format!("pinned bytes {api}");
        for &(t, v) in points {
            out.push(counter(&name, pid, us(t, origin), v));
        }
    }
    // The timeline's coarse clock can read past the write: the limits last as long as it.
    let end = [
        Some(pr.write_unix_ms),
        r.timeline.last().map(|t| t.0),
        r.events.last().map(|e| e.unix_ms),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(0);
    for (what, bytes) in limits(p) {
        for t in [pr.start_unix_ms, end] {
            out.push(counter(what, pid, us(t, origin), bytes));
        }
    }
    for e in &r.events {
        let i = r.callsites.iter().position(|c| c.id == e.callsite);
        let site = i.map(|i| &d.merged.callsites[p.sites[i]]);
        let label = site.map_or_else(
            || "(a folded callsite)".to_string(),
            crate::merge::short_label,
        );
        let frames: Vec<String> = site
            .map(|s| {
                s.py_frames
                    .iter()
                    .chain(&s.frames)
                    .map(crate::merge::frame_label)
                    .collect()
            })
            .unwrap_or_default();
        let mut args = json!({
            "kind": kind_name(e.kind), "api": e.api, "size_bytes": e.size, "live_bytes": e.live_bytes,
            "callsite": label, "frames": frames,
        });
        if let Some(l) = e.reason {
            args["limit"] = json!(limit_name(l));
        }
        if let Some(m) = &e.downgrade_match {
            args["downgrade_match"] = json!(m);
        }
        if let Some(b) = e.host_available_bytes {
            args["host_available_bytes"] = json!(b);
        }
        if let Some(b) = e.cgroup_headroom_bytes {
            args["cgroup_headroom_bytes"] = json!(b);
        }
        if e.repeats > 0 {
            args["repeats"] = json!(e.repeats);
            args["repeat_unix_ms"] = json!(e.repeat_unix_ms);
        }
        let title = format!(
            "{} {} {} at {label}",
            kind_name(e.kind),
            e.api,
            format_bytes(e.size)
        );
        out.push(json!({ "name": title, "cat": kind_name(e.kind), "ph": "i", "s": "t", "pid": pid, "tid": pid, "ts": us(e.unix_ms, origin), "args": args }));
    }
    let end = json!({ "name": format!("report ({})", r.reason.name()), "cat": "report", "ph": "i", "s": "t", "pid": pid, "tid": pid, "ts": us(pr.write_unix_ms, origin), "args": { "live_bytes": r.totals.live_bytes, "peak_bytes": r.totals.peak_live_bytes, "events_dropped": r.events_dropped, "timeline_dropped": r.timeline_dropped } });
    out.push(end);
}

/// The trace's zero: the earliest moment any process recorded (a timeline's coarse clock can read
/// a little before the start).
fn origin(procs: &[&Proc]) -> u64 {
    let firsts = procs.iter().flat_map(|p| {
        let r = &p.report;
        [
            Some(r.process.start_unix_ms),
            r.timeline.first().map(|t| t.0),
            r.events.first().map(|e| e.unix_ms),
        ]
        .into_iter()
        .flatten()
    });
    firsts.min().unwrap_or(0)
}

pub fn render(d: &Data) -> Result<Vec<u8>, String> {
    let procs = d.latest();
    let origin = origin(&procs);
    let mut used = HashSet::new();
    let mut events = Vec::new();
    for (n, p) in procs.iter().enumerate() {
        // Processes of several hosts (or pid namespaces) can share a pid: each its own track.
        let pid = if used.insert(p.report.process.pid) {
            p.report.process.pid
        } else {
            u32::MAX - n as u32
        };
        used.insert(pid);
        process_events(d, p, pid, origin, &mut events);
    }
    let doc = json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": { "exporter": format!("pinguard {}", env!("CARGO_PKG_VERSION")), "origin_unix_ms": origin.to_string() },
    });
    serde_json::to_vec(&doc).map_err(|e| e.to_string())
}
