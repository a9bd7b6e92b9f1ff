//! The figures read out for a report: live bytes, the process's totals, each entry point's.

use super::blocks::blocks;
use super::count::UNTRACKED;
use super::levels::levels;
use crate::api::Api;
use pinguard_common::{ApiStats, Totals};
use std::sync::atomic::Ordering::Relaxed;

pub fn live_bytes() -> u64 {
    levels().total.bytes()
}

/// The process's peak since `restart_window` (or the start): a test's own peak.
pub fn window_peak() -> u64 {
    levels().total.window_peak()
}

/// Starts the process's peak window again from what is live now (the whole life's peak stays
/// the report's `totals.peak_live_bytes`).
pub fn restart_window() {
    levels().total.restart_peak();
}

pub fn totals() -> Totals {
    let mut t = Totals {
        live_bytes: levels().total.bytes(),
        live_count: levels().total.count(),
        peak_live_bytes: levels().total.peak(),
        untracked_count: UNTRACKED.load(Relaxed),
        stack_short_count: crate::runtime::workstack::short_count(),
        ..Totals::default()
    };
    for b in blocks() {
        b.totals.add_to(&mut t);
    }
    t.downgraded_live_bytes = (t.downgraded_live_bytes as i64).max(0) as u64;
    t
}

/// Per-API figures for every entry point that saw any activity.
pub fn apis() -> Vec<(Api, ApiStats)> {
    Api::ALL
        .iter()
        .map(|&api| {
            let i = api as usize;
            let mut s = ApiStats {
                alloc_count: levels().apis[i].alloc_count(),
                alloc_bytes: levels().apis[i].alloc_bytes(),
                live_count: levels().apis[i].count(),
                live_bytes: levels().apis[i].bytes(),
                peak_live_bytes: levels().apis[i].peak(),
                ..ApiStats::default()
            };
            for b in blocks() {
                b.apis[i].add_to(&mut s);
            }
            (api, s)
        })
        .filter(|(_, s)| *s != ApiStats::default())
        .collect()
}
