//! `PINGUARD_METRICS`: a Prometheus text-format file for node_exporter's textfile collector,
//! rewritten atomically with every interval snapshot and at exit.

use crate::runtime::config::Config;
use crate::accounting::ledger;
use crate::budget::{self, group};
use std::fmt::Write as _;

/// A label value in the text format: backslash, double quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

pub fn render() -> String {
    let exe = crate::runtime::kernel::exe();
    let exe = label(exe.rsplit('/').next().unwrap_or(""));
    let pid = std::process::id();
    let who = format!("pid=\"{pid}\",exe=\"{exe}\"");
    let apis = ledger::apis();
    let t = ledger::totals();
    let mut s = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(s, "{name}{{{labels}}} {v}");
        }
    };
    let by_api = |f: &dyn Fn(&pinguard_report::ApiStats) -> u64| -> Vec<(String, u64)> {
        apis.iter().map(|(a, st)| (format!("{who},api=\"{}\"", a.name()), f(st))).collect()
    };
    family("pinguard_pinned_bytes", "gauge", "Pinned bytes live now, by entry point.", by_api(&|a| a.live_bytes));
    family("pinguard_pinned_peak_bytes", "gauge", "Most pinned bytes live at once, by entry point.", by_api(&|a| a.peak_live_bytes));
    family("pinguard_denied_total", "counter", "Calls refused by the budget, by entry point.", by_api(&|a| a.denied_count));
    family("pinguard_downgraded_total", "counter", "Calls served with pageable memory instead, by entry point.", by_api(&|a| a.downgraded_count));
    family("pinguard_process_pinned_bytes", "gauge", "Pinned bytes live now in the process.", vec![(who.clone(), t.live_bytes)]);
    family("pinguard_process_pinned_peak_bytes", "gauge", "Most pinned bytes live at once in the process.", vec![(who.clone(), t.peak_live_bytes)]);
    if let Some(b) = budget::limit() {
        family("pinguard_budget_bytes", "gauge", "The process's pinned-memory budget.", vec![(who.clone(), b)]);
    }
    if let Some(h) = budget::host::snapshot() {
        if let Some(r) = budget::host::reserve() {
            family("pinguard_host_reserve_bytes", "gauge", "The host reserve in force: the floor pins keep the host's MemAvailable above.", vec![(who.clone(), r)]);
        }
        family("pinguard_host_available_bytes", "gauge", "The host's MemAvailable at the latest reading for the reserve.", vec![(who.clone(), h.available)]);
        family("pinguard_host_lowest_available_bytes", "gauge", "The lowest MemAvailable read for the reserve.", vec![(who.clone(), h.lowest)]);
        family("pinguard_host_reserve_stopped_total", "counter", "Pinning calls the host reserve stopped (refused, downgraded, or pinned anyway under warn).", vec![(who.clone(), t.host_reserve_count)]);
    }
    if let Some(g) = group::snapshot() {
        let gl = format!("{who},group=\"{}\"", label(&g.name));
        family("pinguard_group_pinned_bytes", "gauge", "Pinned bytes of the whole group, reserved or live.", vec![(gl.clone(), g.used)]);
        family("pinguard_group_pinned_peak_bytes", "gauge", "Most pinned bytes of the group at once.", vec![(gl.clone(), g.peak)]);
        family("pinguard_group_members", "gauge", "Processes in the group.", vec![(gl.clone(), g.members as u64)]);
        family(
            "pinguard_group_unavailable_total",
            "counter",
            "Pinning calls answered by the policy (refused, downgraded, or pinned anyway under warn) because the group's ledger could not be reached in time.",
            vec![(gl.clone(), t.group_unavailable_count)],
        );
        if let Some(b) = g.budget {
            family("pinguard_group_budget_bytes", "gauge", "The group's shared pinned-memory budget.", vec![(gl.clone(), b)]);
        }
        if let Some(r) = g.host_reserve {
            family("pinguard_group_host_reserve_bytes", "gauge", "The largest host reserve a member of the group applies.", vec![(gl.clone(), r)]);
            if let Some(l) = g.host_lowest_available {
                family("pinguard_group_host_lowest_available_bytes", "gauge", "The lowest MemAvailable a member of the group read for the reserve.", vec![(gl.clone(), l)]);
            }
            family("pinguard_group_host_reserve_stopped_calls", "gauge", "Pinning calls the host reserve stopped, summed over the members in the group now.", vec![(gl, g.host_reserve_count)]);
        }
    }
    s
}

/// Writes the metrics file if `PINGUARD_METRICS` is set (and, in a setuid process, never).
pub fn write(cfg: &Config) {
    let Some(template) = &cfg.metrics else { return };
    if crate::runtime::kernel::secure_mode() {
        return;
    }
    let path = crate::output::files::expand(&crate::output::files::with_pid(template));
    if let Err(e) = crate::output::files::write_atomic(&path, render().as_bytes()) {
        tracing::warn!("metrics not written to {}: {e}", path.display());
    }
}
