//! `pinguard check`: CI gates over the summed figures of the given reports.

use crate::merge::Merged;
use crate::out::count;
use pinguard_report::units::format_bytes;

pub struct Limits {
    pub max_live: Option<u64>,
    pub max_denied: Option<u64>,
    pub max_downgraded: Option<u64>,
    pub max_over_budget: Option<u64>,
    pub max_host_reserve: Option<u64>,
    pub max_cgroup_reserve: Option<u64>,
    /// Pass even when a process could not use a setting (by default that fails the check).
    pub allow_config_errors: bool,
}

fn exceed(n: u64) -> &'static str {
    if n == 1 {
        "exceeds"
    } else {
        "exceed"
    }
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
    if let Some(max) = l.max_denied {
        if t.denied_count > max {
            v.push(format!("pinguard check: {} {} --max-denied {max}", count(t.denied_count, "denied call", "denied calls"), exceed(t.denied_count)));
        }
    }
    if let Some(max) = l.max_downgraded {
        if t.downgraded_count > max {
            v.push(format!("pinguard check: {} {} --max-downgraded {max}", count(t.downgraded_count, "downgraded call", "downgraded calls"), exceed(t.downgraded_count)));
        }
    }
    if let Some(max) = l.max_over_budget {
        if t.over_budget_count > max {
            v.push(format!("pinguard check: {} {} --max-over-budget {max}", count(t.over_budget_count, "call over the budget", "calls over the budget"), exceed(t.over_budget_count)));
        }
    }
    if let Some(max) = l.max_host_reserve {
        if t.host_reserve_count > max {
            let n = t.host_reserve_count;
            v.push(format!("pinguard check: {} by the host reserve {} --max-host-reserve {max}", count(n, "call stopped", "calls stopped"), exceed(n)));
        }
    }
    if let Some(max) = l.max_cgroup_reserve {
        let n = t.cgroup_reserve_count;
        if n > max {
            v.push(format!("pinguard check: {} by the cgroup reserve {} --max-cgroup-reserve {max}", count(n, "call stopped", "calls stopped"), exceed(n)));
        }
    }
    let summary = format!(
        "pinguard check: {}, {}: live {}, {} denied, {} downgraded, {} over budget{}",
        count(m.reports as u64, "report", "reports"),
        count(m.processes as u64, "process", "processes"),
        format_bytes(t.live_bytes),
        t.denied_count,
        t.downgraded_count,
        t.over_budget_count,
        crate::merge::host_clause(m)
    );
    (v, summary)
}
