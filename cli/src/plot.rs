//! `pinguard plot`: pinned bytes over time from each report's `timeline`, one line per process,
//! each budget drawn as a dashed line. Plain SVG, no dependencies.

use pinguard_report::units::format_bytes;
use pinguard_report::Report;
use std::fmt::Write as _;

pub struct Series {
    pub label: String,
    pub points: Vec<(u64, u64)>,
    pub budget: Option<u64>,
}

pub fn series(r: &Report) -> Series {
    let exe = crate::merge::basename(&r.process.exe).to_string();
    Series { label: format!("{exe} (pid {}, {})", r.process.pid, r.process.hostname), points: r.timeline.clone(), budget: r.config.budget_bytes }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

pub fn render(all: &[Series]) -> Result<String, String> {
    let pts: Vec<(u64, u64)> = all.iter().flat_map(|s| s.points.iter().copied()).collect();
    if pts.is_empty() {
        return Err("nothing to draw: the reports have no timeline points".into());
    }
    let t0 = pts.iter().map(|p| p.0).min().unwrap_or(0);
    let t1 = pts.iter().map(|p| p.0).max().unwrap_or(0).max(t0 + 1);
    let budgets: Vec<u64> = {
        let mut b: Vec<u64> = all.iter().filter_map(|s| s.budget).collect();
        b.sort();
        b.dedup();
        b
    };
    let ymax = pts.iter().map(|p| p.1).chain(budgets.iter().copied()).max().unwrap_or(1).max(1);
    let ymax = ymax + ymax / 10;
    let (w, h, left, right, top, bottom) = (900.0, 480.0, 90.0, 20.0, 40.0, 60.0 + 18.0 * all.len() as f64);
    let total_h = h + 18.0 * all.len() as f64;
    let x = |t: u64| left + (t - t0) as f64 / (t1 - t0) as f64 * (w - left - right);
    let y = |v: u64| top + (1.0 - v as f64 / ymax as f64) * (h - top - 60.0);
    let _ = bottom;
    let mut s = String::new();
    let _ = writeln!(s, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{total_h}" viewBox="0 0 {w} {total_h}" font-family="sans-serif" font-size="12">"#);
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{}" y="22" font-size="16" text-anchor="middle">Pinned memory over time</text>"#, w / 2.0);
    // Axes and ticks.
    let (x0, x1, y0, y1) = (left, w - right, y(0), top);
    let _ = writeln!(s, r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>"#);
    for i in 0..=5u64 {
        let v = ymax * i / 5;
        let yy = y(v);
        let _ = writeln!(s, r##"<line x1="{x0}" y1="{yy:.1}" x2="{x1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##, x0 - 6.0, yy + 4.0, format_bytes(v));
        let t = t0 + (t1 - t0) * i / 5;
        let xx = x(t);
        let _ = writeln!(s, r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{:.1} s</text>"#, y0 + 16.0, (t - t0) as f64 / 1000.0);
    }
    for b in &budgets {
        let yy = y(*b);
        let _ = writeln!(s, r##"<line x1="{x0}" y1="{yy:.1}" x2="{x1}" y2="{yy:.1}" stroke="#000" stroke-dasharray="6,4"/><text x="{:.1}" y="{:.1}" text-anchor="end">budget {}</text>"##, x1 - 4.0, yy - 4.0, format_bytes(*b));
    }
    for (i, ser) in all.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        if !ser.points.is_empty() {
            // A step line: the value holds until the next point.
            let mut d = String::new();
            for (j, &(t, v)) in ser.points.iter().enumerate() {
                if j == 0 {
                    let _ = write!(d, "M{:.1},{:.1}", x(t), y(v));
                } else {
                    let _ = write!(d, " H{:.1} V{:.1}", x(t), y(v));
                }
            }
            let _ = writeln!(s, r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"><title>{}</title></path>"#, esc(&ser.label));
        }
        let ly = h - 20.0 + 18.0 * i as f64;
        let _ = writeln!(s, r#"<rect x="{left}" y="{:.1}" width="14" height="4" fill="{color}"/><text x="{}" y="{:.1}">{}</text>"#, ly - 4.0, left + 20.0, ly, esc(&ser.label));
    }
    let _ = writeln!(s, "</svg>");
    Ok(s)
}
