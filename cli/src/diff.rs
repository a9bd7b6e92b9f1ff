//! `pinguard diff OLD NEW`: per-callsite change of live and peak pinned bytes between two runs.

use crate::merge::{site_label, Merged, Site, SiteKey};
use crate::out::table;
use pinguard_report::units::format_bytes;
use std::collections::HashMap;

fn signed(d: i128) -> String {
    match d {
        0 => "0".into(),
        d if d > 0 => format!("+{}", format_bytes(d as u64)),
        d => format!("-{}", format_bytes(d.unsigned_abs() as u64)),
    }
}

pub fn render(old: &Merged, new: &Merged) -> String {
    let olds: HashMap<SiteKey, &Site> = old.callsites.iter().map(|s| (s.key, s)).collect();
    let news: HashMap<SiteKey, &Site> = new.callsites.iter().map(|s| (s.key, s)).collect();
    let empty = Site::default();
    let mut keys: Vec<SiteKey> = olds.keys().chain(news.keys()).copied().collect();
    keys.sort();
    keys.dedup();
    let mut rows: Vec<(i128, i128, Vec<String>)> = Vec::new();
    for k in keys {
        let (o, n) = (olds.get(&k).copied(), news.get(&k).copied());
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
                format!("{} -> {}", format_bytes(os.live_bytes), format_bytes(ns.live_bytes)),
                signed(dp),
                status.to_string(),
                site_label(site),
            ],
        ));
    }
    rows.sort_by_key(|r| std::cmp::Reverse((r.0.abs(), r.1.abs())));
    let mut s = String::new();
    if rows.is_empty() {
        s.push_str("No callsite changed its live or peak pinned bytes.\n");
    } else {
        let mut t = vec![["LIVE CHANGE", "LIVE (OLD -> NEW)", "PEAK CHANGE", "", "CALLSITE"].map(String::from).to_vec()];
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
