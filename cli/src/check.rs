//! `pinguard check`: CI gates over the summed figures of the given reports.

use crate::merge::Merged;
use pinguard_report::units::format_bytes;

pub struct Limits {
    pub max_live: Option<u64>,
    pub max_denied: Option<u64>,
    pub max_downgraded: Option<u64>,
}

/// One line per violated limit (empty: all within), and a line saying what was checked.
pub fn evaluate(m: &Merged, l: &Limits) -> (Vec<String>, String) {
    let t = &m.totals;
    let mut v = Vec::new();
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
            v.push(format!("pinguard check: {} denied calls exceed --max-denied {max}", t.denied_count));
        }
    }
    if let Some(max) = l.max_downgraded {
        if t.downgraded_count > max {
            v.push(format!("pinguard check: {} downgraded calls exceed --max-downgraded {max}", t.downgraded_count));
        }
    }
    let summary = format!(
        "pinguard check: {} report(s), {} process(es): live {}, {} denied, {} downgraded",
        m.reports,
        m.processes,
        format_bytes(t.live_bytes),
        t.denied_count,
        t.downgraded_count
    );
    (v, summary)
}
