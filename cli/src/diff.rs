//! `pinguard diff OLD NEW`: per-callsite change of live and peak pinned bytes between two runs.

use crate::merge::{labels, name_of, with_processes, Merged, Name, Site, SiteKey};
use crate::out::table;
use pinguard_common::units::format_bytes;
use std::collections::HashMap;

fn signed(d: i128) -> String {
    match d {
        0 => "0".into(),
        d if d > 0 => format!("+{}", format_bytes(d as u64)),
        d => format!("-{}", format_bytes(d.unsigned_abs() as u64)),
    }
}

/// How much a callsite may grow before `--fail-on-growth` fails the diff.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Growth {
    Bytes(u64),
    /// Of the old figure; a callsite the old run did not have grows by more than any percentage.
    Percent(f64),
}

/// `512Ki`, `1Gi`, `10%`.
pub fn parse_growth(s: &str) -> Result<Growth, String> {
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        return match p.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(Growth::Percent(v)),
            _ => Err(format!(
                "{s:?} is not a percentage; expected N% such as 10%, or a size"
            )),
        };
    }
    pinguard_common::units::parse_size(t)
        .map(Growth::Bytes)
        .map_err(|e| format!("{e}; expected {} or N%", pinguard_common::units::SIZE_FORMS))
}

impl Growth {
    fn exceeded(self, old: u64, grew: u64) -> bool {
        match self {
            Growth::Bytes(b) => grew > b,
            Growth::Percent(_) if old == 0 => grew > 0,
            Growth::Percent(p) => grew as f64 * 100.0 > p * old as f64,
        }
    }

    fn shown(self) -> String {
        match self {
            Growth::Bytes(b) => format_bytes(b),
            Growth::Percent(p) => format!("{p}%"),
        }
    }
}

/// Every callsite of either run, with its figures in each (`None`: not in that run), and its name
/// among the callsites of both runs (one run alone may not have the sibling it is told from).
fn pairs<'a>(old: &'a Merged, new: &'a Merged) -> Vec<(Option<&'a Site>, Option<&'a Site>, Name)> {
    let olds: HashMap<SiteKey, &Site> = old.callsites.iter().map(|s| (s.key, s)).collect();
    let news: HashMap<SiteKey, &Site> = new.callsites.iter().map(|s| (s.key, s)).collect();
    let mut names = labels(new.callsites.iter().chain(&old.callsites));
    let mut keys: Vec<SiteKey> = olds.keys().chain(news.keys()).copied().collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|k| {
            (
                olds.get(&k).copied(),
                news.get(&k).copied(),
                names.remove(&k).unwrap_or_default(),
            )
        })
        .collect()
}

/// The callsite named as `pairs` says, with how many processes share it.
fn named(site: &Site, name: Name) -> String {
    with_processes(site, name_of(site, name))
}

/// A line per callsite whose live or peak pinned bytes grew by more than `limit`.
pub fn growth_violations(old: &Merged, new: &Merged, limit: Growth) -> Vec<String> {
    let empty = Site::default();
    let mut v = Vec::new();
    for (o, n, name) in pairs(old, new) {
        let (os, ns) = (o.unwrap_or(&empty), n.unwrap_or(&empty));
        for (what, a, b) in [
            ("live", os.live_bytes, ns.live_bytes),
            ("peak", os.peak_live_bytes, ns.peak_live_bytes),
        ] {
            if b > a && limit.exceeded(a, b - a) {
                let site = if n.is_some() { ns } else { os };
                v.push(format!(
                    "pinguard diff: {}: {what} pinned bytes grew by {} ({} -> {}), more than --fail-on-growth {}",
                    named(site, name),
                    signed((b - a) as i128),
                    format_bytes(a),
                    format_bytes(b),
                    limit.shown()
                ));
            }
        }
    }
    v
}

pub fn render(old: &Merged, new: &Merged) -> String {
    let empty = Site::default();
    let mut rows: Vec<(i128, i128, Vec<String>)> = Vec::new();
    for (o, n, name) in pairs(old, new) {
        let (os, ns) = (o.unwrap_or(&empty), n.unwrap_or(&empty));
        let dl = ns.live_bytes as i128 - os.live_bytes as i128;
        let dp = ns.peak_live_bytes as i128 - os.peak_live_bytes as i128;
        if dl == 0 && dp == 0 && o.is_some() && n.is_some() {
            continue;
        }
        let status = match (o, n) {
            (None, _) => "new",
            (_, None) => "gone",
            _ if dl > 0 => "grew",
            _ if dl < 0 => "shrank",
            _ => "peak",
        };
        let site = if n.is_some() { &ns } else { &os };
        rows.push((
            dl,
            dp,
            vec![
                signed(dl),
                format!(
                    "{} -> {}",
                    format_bytes(os.live_bytes),
                    format_bytes(ns.live_bytes)
                ),
                signed(dp),
                status.to_string(),
                named(site, name),
            ],
        ));
    }
    rows.sort_by_key(|r| std::cmp::Reverse((r.0.abs(), r.1.abs())));
    let mut s = String::new();
    if rows.is_empty() {
        s.push_str("No callsite changed its live or peak pinned bytes.\n");
    } else {
        let mut t = vec![[
            "LIVE CHANGE",
            "LIVE (OLD -> NEW)",
            "PEAK CHANGE",
            "",
            "CALLSITE",
        ]
        .map(String::from)
        .to_vec()];
        t.extend(rows.into_iter().map(|r| r.2));
        s.push_str(&table(&t, &[true, true, true, false, false]));
    }
    let dl = new.totals.live_bytes as i128 - old.totals.live_bytes as i128;
    s.push_str(&format!(
        "\nSUMMARY: live pinned bytes {} -> {} ({}); peak {} -> {}\n",
        format_bytes(old.totals.live_bytes),
        format_bytes(new.totals.live_bytes),
        signed(dl),
        format_bytes(old.totals.peak_live_bytes),
        format_bytes(new.totals.peak_live_bytes)
    ));
    s
}
