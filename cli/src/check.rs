//! `pinguard check`: CI gates over the summed figures of the given reports.

use crate::merge::Merged;
use crate::out::count;
use pinguard_report::units::format_bytes;

pub struct Limits {
    pub max_live: Option<u64>,
    pub max_peak: Option<u64>,
    pub max_denied: Option<u64>,
    pub max_downgraded: Option<u64>,
    pub max_over_budget: Option<u64>,
    pub max_host_reserve: Option<u64>,
    pub max_cgroup_reserve: Option<u64>,
    /// Pass even when a process could not use a setting (by default that fails the check).
    pub allow_config_errors: bool,
    /// Pass even a run whose command pinguard could not be loaded into (secure mode, statically
    /// linked): by default that fails the check, since what it pinned was never seen.
    pub allow_unwatched: bool,
}

fn exceed(n: u64) -> &'static str {
    if n == 1 {
        "exceeds"
    } else {
        "exceed"
    }
}

/// At most this many processes over `--max-peak` are named; the rest are counted.
const MAX_NAMED: usize = 5;

fn size(n: u64) -> String {
    format!("{n} ({})", format_bytes(n))
}

/// `--max-peak`: each process's own peak, then (when several were alive at once) what they held
/// together, from their timelines.
fn peak_violations(m: &Merged, max: u64) -> Vec<String> {
    let mut v = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let over: Vec<_> = m
        .per_process
        .iter()
        .filter(|p| {
            p.totals.peak_live_bytes > max && seen.insert((&p.hostname, p.pid, p.start_unix_ms))
        })
        .collect();
    for p in over.iter().take(MAX_NAMED) {
        v.push(format!(
            "pinguard check: pid {} ({}) peaked at {} pinned bytes, over --max-peak {}",
            p.pid,
            crate::merge::basename(&p.exe),
            size(p.totals.peak_live_bytes),
            size(max)
        ));
    }
    if over.len() > MAX_NAMED {
        v.push(format!(
            "pinguard check: ... and {} over --max-peak {}",
            count(
                (over.len() - MAX_NAMED) as u64,
                "more process",
                "more processes"
            ),
            size(max)
        ));
    }
    let single = m
        .per_process
        .iter()
        .map(|p| p.totals.peak_live_bytes)
        .max()
        .unwrap_or(0);
    let together = m.peak_over_time();
    if together.processes > 1 && together.bytes > max && together.bytes > single {
        v.push(format!(
            "pinguard check: processes alive at the same time peaked at {} pinned bytes together ({}), over --max-peak {}",
            size(together.bytes),
            together.basis(),
            size(max)
        ));
    }
    v
}

/// The runs of which nothing was checked, one line each: pinguard switched off, or not loaded into
/// the command. Passing them would be a false green.
fn unwatched_runs(m: &Merged, l: &Limits) -> Vec<String> {
    let mut v = Vec::new();
    for r in &m.runs {
        // A secure-mode command is never watched, whatever else of the run left reports.
        if r.secure_mode.is_some() {
            if !l.allow_unwatched {
                v.push(format!("pinguard check: the command of the {} runs in secure mode (set-user-ID, set-group-ID or file capabilities), where pinguard cannot be loaded: what it pinned was never seen (--allow-unwatched to pass anyway)", r.name()));
            }
            continue;
        }
        if !r.unchecked() {
            continue;
        }
        let line = if r.disabled {
            (!l.allow_config_errors).then(|| format!("pinguard check: PINGUARD_DISABLE was set in the {}: no limit was in force (--allow-config-errors to pass anyway)", r.name()))
        } else {
            (!l.allow_config_errors && !l.allow_unwatched).then(|| format!("pinguard check: pinguard could not be loaded into the command of the {}: no limit was in force (--allow-unwatched or --allow-config-errors to pass anyway)", r.name()))
        };
        v.extend(line);
    }
    v
}

/// One line per violated limit (empty: all within), and a line saying what was checked.
pub fn evaluate(m: &Merged, l: &Limits) -> (Vec<String>, String) {
    let t = &m.totals;
    let mut v = Vec::new();
    if !l.allow_config_errors {
        // First: a budget that was never in force makes every other figure meaningless.
        for e in m.config_error_lines() {
            v.push(format!("pinguard check: a setting could not be used in {e} (--allow-config-errors to pass anyway)"));
        }
    }
    v.extend(unwatched_runs(m, l));
    if let Some(max) = l.max_live {
        if t.live_bytes > max {
            v.push(format!(
                "pinguard check: live pinned bytes {} ({}) exceed --max-live {} ({})",
                t.live_bytes,
                format_bytes(t.live_bytes),
                max,
                format_bytes(max)
            ));
        }
    }
    if let Some(max) = l.max_peak {
        v.extend(peak_violations(m, max));
    }
    if let Some(max) = l.max_denied {
        if t.denied_count > max {
            v.push(format!(
                "pinguard check: {} {} --max-denied {max}",
                count(t.denied_count, "denied call", "denied calls"),
                exceed(t.denied_count)
            ));
        }
    }
    if let Some(max) = l.max_downgraded {
        if t.downgraded_count > max {
            v.push(format!(
                "pinguard check: {} {} --max-downgraded {max}",
                count(t.downgraded_count, "downgraded call", "downgraded calls"),
                exceed(t.downgraded_count)
            ));
        }
    }
    if let Some(max) = l.max_over_budget {
        if t.over_budget_count > max {
            v.push(format!(
                "pinguard check: {} {} --max-over-budget {max}",
                count(
                    t.over_budget_count,
                    "call over the budget",
                    "calls over the budget"
                ),
                exceed(t.over_budget_count)
            ));
        }
    }
    if let Some(max) = l.max_host_reserve {
        if t.host_reserve_count > max {
            let n = t.host_reserve_count;
            v.push(format!(
                "pinguard check: {} by the host reserve {} --max-host-reserve {max}",
                count(n, "call stopped", "calls stopped"),
                exceed(n)
            ));
        }
    }
    if let Some(max) = l.max_cgroup_reserve {
        let n = t.cgroup_reserve_count;
        if n > max {
            v.push(format!(
                "pinguard check: {} by the cgroup reserve {} --max-cgroup-reserve {max}",
                count(n, "call stopped", "calls stopped"),
                exceed(n)
            ));
        }
    }
    let none = [
        l.max_live,
        l.max_peak,
        l.max_denied,
        l.max_downgraded,
        l.max_over_budget,
        l.max_host_reserve,
        l.max_cgroup_reserve,
    ]
    .iter()
    .all(Option::is_none);
    // Without a limit only the settings are checked: a leak passes, and the line says so.
    let scope = if none {
        " (settings only: no --max-* limit was given)"
    } else {
        ""
    };
    let runs = match m.runs.len() {
        0 => String::new(),
        n => format!("{}, ", count(n as u64, "run", "runs")),
    };
    let summary = format!(
        "pinguard check: {runs}{}, {}: live {}, {} denied, {} downgraded, {} over budget{}",
        count(m.reports as u64, "report", "reports"),
        count(m.processes as u64, "process", "processes"),
        format_bytes(t.live_bytes),
        t.denied_count,
        t.downgraded_count,
        t.over_budget_count,
        crate::merge::host_clause(m)
    );
    (v, format!("{summary}{scope}"))
}
