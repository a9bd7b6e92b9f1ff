//! `pinguard plot`: pinned bytes over time from each report's `timeline`, one line per process,
//! each budget drawn as a dashed line. Plain SVG, no dependencies.

use pinguard_common::units::format_bytes;
use pinguard_common::Report;
use std::fmt::Write as _;

pub struct Series {
    pub label: String,
    /// `(unix_ms, live_bytes)`, oldest first.
    pub points: Vec<(u64, u64)>,
    pub budget: Option<u64>,
    /// The process's start in unix milliseconds; 0 when the report does not know it.
    pub start_ms: u64,
    /// The report's peak: a report written before the timeline kept each tick's extremes (issue
    /// 46, item 7) can miss a short one in its points; it is drawn as well.
    pub peak: u64,
    /// The refused and downgraded calls: `(unix_ms, refused?, asked bytes, live bytes then, API)`.
    pub marks: Vec<Mark>,
}

/// A refused or downgraded call, marked on its process's line.
pub struct Mark {
    pub unix_ms: u64,
    pub refused: bool,
    pub size: u64,
    pub live: u64,
    pub api: String,
}

pub fn series(r: &Report) -> Series {
    let exe = crate::merge::basename(&r.process.exe).to_string();
    Series {
        label: format!("{exe} (pid {}, {})", r.process.pid, r.process.hostname),
        points: r.timeline.clone(),
        budget: r.config.budget_bytes,
        start_ms: r.process.start_unix_ms,
        peak: r.totals.peak_live_bytes,
        marks: r
            .events
            .iter()
            .filter(|e| e.kind != pinguard_common::EventKind::OverBudget)
            .map(|e| Mark {
                unix_ms: e.unix_ms,
                refused: e.kind == pinguard_common::EventKind::Denied,
                size: e.size,
                live: e.live_bytes,
                api: e.api.clone(),
            })
            .collect(),
    }
}

/// What x measures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TimeAxis {
    /// Each process's own start is 0, so processes and runs started at different moments overlay.
    #[default]
    SinceStart,
    /// One clock for all, to see which process pinned what while the others ran.
    WallClock,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `n × 10^p` written out from integers, so a label reads "0.3" and never "0.30000000000000004",
/// with no trailing zeros.
fn decimal(n: u64, p: i32) -> String {
    if n == 0 {
        return "0".into();
    }
    if p >= 0 {
        return (n * 10u64.pow(p as u32)).to_string();
    }
    let frac = p.unsigned_abs() as usize;
    let padded = format!("{n:0>width$}", width = frac + 1);
    let (whole, fraction) = padded.split_at(padded.len() - frac);
    match fraction.trim_end_matches('0') {
        "" => whole.to_string(),
        f => format!("{whole}.{f}"),
    }
}

/// A tick step of `m × 10^p` units; 2.5 is `25 × 10^(p-1)` so that `m` stays whole.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Step {
    m: u64,
    p: i32,
}

impl Step {
    fn value(self) -> f64 {
        self.m as f64 * 10f64.powi(self.p)
    }
}

/// Most steps on an axis. The step choices are at most 2× apart, so the smallest step that fits
/// in 6 leaves more than 3: an axis has 5 to 7 ticks counting 0 (fewer only where whole bytes or
/// milliseconds allow no more).
const MAX_STEPS: u64 = 6;

/// An axis from 0 to `count` steps, in a unit of `unit_base` base units (bytes or milliseconds).
#[derive(Debug)]
struct Ticks {
    unit: &'static str,
    unit_base: f64,
    step: Step,
    count: u64,
}

impl Ticks {
    /// The smallest step of 1, 2, 2.5 or 5 × 10^k units (and at least `min_step`) that reaches
    /// `max` (> 0) base units in at most `MAX_STEPS` steps.
    fn nice(max: f64, unit: &'static str, unit_base: f64, min_step: f64) -> Ticks {
        let max_u = max / unit_base;
        // One decade below any step that could fit, so the search only goes up.
        let mut p = (max_u / MAX_STEPS as f64).log10().floor() as i32 - 1;
        loop {
            for (m, dp) in [(1, 0), (2, 0), (25, -1), (5, 0)] {
                let step = Step { m, p: p + dp };
                let v = step.value();
                if v < min_step {
                    continue;
                }
                let count = (max_u / v).ceil() as u64;
                if count <= MAX_STEPS {
                    return Ticks {
                        unit,
                        unit_base,
                        step,
                        count,
                    };
                }
            }
            p += 1;
        }
    }

    /// Bytes in the binary unit of the axis top, so that steps are round in what the labels say.
    fn bytes(max: u64) -> Ticks {
        const UNITS: [(&str, u32); 6] = [
            ("B", 0),
            ("KiB", 10),
            ("MiB", 20),
            ("GiB", 30),
            ("TiB", 40),
            ("PiB", 50),
        ];
        let max = max.max(1);
        let &(unit, shift) = UNITS
            .iter()
            .rev()
            .find(|&&(_, s)| max >> s > 0)
            .unwrap_or(&UNITS[0]);
        // No fractions of a byte.
        Ticks::nice(
            max as f64,
            unit,
            (1u64 << shift) as f64,
            if shift == 0 { 1.0 } else { 0.0 },
        )
    }

    fn millis(span: u64) -> Ticks {
        let span = span.max(1);
        let (unit, base) = match span {
            0..=999 => ("ms", 1),
            1000..=600_000 => ("s", 1000),
            600_001..=36_000_000 => ("min", 60_000),
            _ => ("h", 3_600_000),
        };
        Ticks::nice(
            span as f64,
            unit,
            base as f64,
            if base == 1 { 1.0 } else { 0.0 },
        )
    }

    /// Base units at the `i`-th tick.
    fn at(&self, i: u64) -> f64 {
        i as f64 * self.step.value() * self.unit_base
    }

    fn top(&self) -> f64 {
        self.at(self.count)
    }

    fn label(&self, i: u64) -> String {
        match i {
            0 => "0".into(),
            _ => format!("{} {}", decimal(i * self.step.m, self.step.p), self.unit),
        }
    }
}

/// `2024-05-01 12:03:04 UTC` (Howard Hinnant's days-to-civil), so the wall-clock axis says
/// where it starts without a date library.
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

const WIDTH: f64 = 900.0;
const LEFT: f64 = 90.0;
// Room for half of the last x label, which is centred on the axis end.
const RIGHT: f64 = 30.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 420.0;
const LEGEND: f64 = 480.0;
const LINE: f64 = 18.0;

pub fn render(all: &[Series], axis: TimeAxis) -> Result<String, String> {
    let drawn: Vec<&Series> = all.iter().filter(|s| !s.points.is_empty()).collect();
    if drawn.is_empty() {
        return Err("nothing to draw: the reports have no timeline points".into());
    }
    let first = |s: &Series| s.points.iter().map(|p| p.0).min().unwrap_or(0);
    // On a whole second, so that the time the axis title names is exactly where 0 is.
    let wall_origin = drawn.iter().map(|s| first(s)).min().unwrap_or(0) / 1000 * 1000;
    // The timeline's coarse clock can read a few ms before the start taken with the precise one.
    let origin = |s: &Series| match axis {
        TimeAxis::SinceStart if s.start_ms > 0 => s.start_ms.min(first(s)),
        TimeAxis::SinceStart => first(s),
        TimeAxis::WallClock => wall_origin,
    };
    let span = drawn
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0.saturating_sub(origin(s))))
        .max()
        .unwrap_or(0);
    let budgets: Vec<u64> = {
        let mut b: Vec<u64> = all.iter().filter_map(|s| s.budget).collect();
        b.sort();
        b.dedup();
        b
    };
    let ymax = drawn
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1).chain([s.peak]))
        .chain(budgets.iter().copied())
        .max()
        .unwrap_or(0);
    let (xt, yt) = (Ticks::millis(span), Ticks::bytes(ymax));
    let x = |ms: f64| LEFT + ms / xt.top() * (WIDTH - RIGHT - LEFT);
    let y = |v: f64| TOP + (1.0 - v / yt.top()) * (BOTTOM - TOP);
    let x_title = match axis {
        TimeAxis::SinceStart => format!("time since process start ({})", xt.unit),
        TimeAxis::WallClock => format!("wall-clock time ({} since {})", xt.unit, utc(wall_origin)),
    };

    let total_h = LEGEND + LINE * all.len() as f64 - LINE + 12.0;
    let mut s = frame(total_h, &xt, &yt, &x, &y, &x_title);
    // By the clock, processes come and go: each one's budget is drawn across its own time, in its
    // colour (`own_budget`), never across another's.
    if axis != TimeAxis::WallClock {
        s.push_str(&shared_budgets(&budgets, &y));
    }
    for (i, ser) in all.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        if !ser.points.is_empty() {
            s.push_str(&series_line(ser, color, origin(ser), axis, &x, &y));
        }
        s.push_str(&legend_entry(ser, color, LEGEND + LINE * i as f64));
    }
    let _ = writeln!(s, "</svg>");
    Ok(s)
}

/// The picture's frame: title, grid with its tick labels, axes and their titles.
fn frame(
    total_h: f64,
    xt: &Ticks,
    yt: &Ticks,
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(f64) -> f64,
    x_title: &str,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{total_h}" viewBox="0 0 {WIDTH} {total_h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="16" text-anchor="middle">Pinned memory over time</text>"#,
        WIDTH / 2.0
    );
    let (x0, x1) = (LEFT, WIDTH - RIGHT);
    for i in 0..=yt.count {
        let yy = y(yt.at(i));
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{yy:.1}" x2="{x1}" y2="{yy:.1}" stroke="#ddd"/><text class="ytick" x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            x0 - 6.0,
            yy + 4.0,
            yt.label(i)
        );
    }
    for i in 0..=xt.count {
        let xx = x(xt.at(i));
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{BOTTOM}" stroke="#eee"/><text class="xtick" x="{xx:.1}" y="{}" text-anchor="middle">{}</text>"##,
            BOTTOM + 16.0,
            xt.label(i)
        );
    }
    let _ = writeln!(
        s,
        r#"<line x1="{x0}" y1="{BOTTOM}" x2="{x1}" y2="{BOTTOM}" stroke="black"/><line x1="{x0}" y1="{BOTTOM}" x2="{x0}" y2="{TOP}" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text class="xtitle" x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        BOTTOM + 36.0,
        esc(x_title)
    );
    let _ = writeln!(
        s,
        r#"<text class="ytitle" transform="translate(16,{}) rotate(-90)" text-anchor="middle">pinned bytes</text>"#,
        (TOP + BOTTOM) / 2.0
    );
    s
}

/// The budgets the series share (by time since each start), dashed across the plot.
fn shared_budgets(budgets: &[u64], y: &dyn Fn(f64) -> f64) -> String {
    let (x0, x1) = (LEFT, WIDTH - RIGHT);
    let mut s = String::new();
    for b in budgets {
        let yy = y(*b as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{yy:.1}" x2="{x1}" y2="{yy:.1}" stroke="#000" stroke-dasharray="6,4"/><text x="{:.1}" y="{:.1}" text-anchor="end">budget {}</text>"##,
            x1 - 4.0,
            yy - 4.0,
            format_bytes(*b)
        );
    }
    s
}

/// One process's step line, its peak, its own budget by the clock, and its refused and
/// downgraded calls.
fn series_line(
    ser: &Series,
    color: &str,
    o: u64,
    axis: TimeAxis,
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(f64) -> f64,
) -> String {
    // A step line: the value holds until the next point.
    let mut d = String::new();
    for (j, &(t, v)) in ser.points.iter().enumerate() {
        let (px, py) = (x(t.saturating_sub(o) as f64), y(v as f64));
        if j == 0 {
            let _ = write!(d, "M{px:.1},{py:.1}");
        } else {
            let _ = write!(d, " H{px:.1} V{py:.1}");
        }
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"><title>{}</title></path>"#,
        esc(&ser.label)
    );
    s.push_str(&peak_mark(ser, color, o, x, y));
    if axis == TimeAxis::WallClock {
        s.push_str(&own_budget(ser, color, o, x, y));
    }
    s.push_str(&call_marks(ser, color, o, x, y));
    s
}

/// One process's line of the legend: its label, peak, and refused and downgraded calls.
fn legend_entry(ser: &Series, color: &str, ly: f64) -> String {
    let mut label = match ser.peak {
        0 => ser.label.clone(),
        p => format!("{}, peak {}", ser.label, format_bytes(p)),
    };
    let refused = ser.marks.iter().filter(|m| m.refused).count() as u64;
    let downgraded = ser.marks.len() as u64 - refused;
    if refused > 0 {
        label.push_str(&format!(
            ", {} (x)",
            crate::out::count(refused, "call refused", "calls refused")
        ));
    }
    if downgraded > 0 {
        label.push_str(&format!(", {downgraded} downgraded (o)"));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{:.1}" width="14" height="4" fill="{color}"/><text x="{}" y="{ly:.1}">{}</text>"#,
        ly - 4.0,
        LEFT + 20.0,
        esc(&label)
    );
    s
}

/// A process's budget across its own time only (`--wall-clock`), in its colour.
fn own_budget(
    ser: &Series,
    color: &str,
    origin: u64,
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(f64) -> f64,
) -> String {
    let Some(b) = ser.budget else {
        return String::new();
    };
    let first = ser.points.first().map_or(0, |p| p.0.saturating_sub(origin));
    let last = ser.points.last().map_or(0, |p| p.0.saturating_sub(origin));
    let (x0, x1, yy) = (
        x(first as f64),
        x(last as f64).max(x(first as f64) + 4.0),
        y(b as f64),
    );
    format!(
        "<line class=\"budget\" x1=\"{x0:.1}\" y1=\"{yy:.1}\" x2=\"{x1:.1}\" y2=\"{yy:.1}\" stroke=\"{color}\" stroke-dasharray=\"6,4\"><title>budget {} of {}</title></line>\n",
        format_bytes(b),
        esc(&ser.label)
    )
}

/// Each refused call (a cross) and downgraded call (a ring) where it happened, at the process's
/// live bytes then, with what it asked for in its title.
fn call_marks(
    ser: &Series,
    color: &str,
    origin: u64,
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(f64) -> f64,
) -> String {
    let mut out = String::new();
    for m in &ser.marks {
        let (px, py) = (x(m.unix_ms.saturating_sub(origin) as f64), y(m.live as f64));
        let what = if m.refused { "refused" } else { "downgraded" };
        let title = format!(
            "{}: {} {} of {} (live {})",
            esc(&ser.label),
            what,
            esc(&m.api),
            format_bytes(m.size),
            format_bytes(m.live)
        );
        let _ = if m.refused {
            writeln!(
                out,
                "<polyline class=\"refusal\" points=\"{:.1},{:.1} {:.1},{:.1} {px:.1},{py:.1} {:.1},{:.1} {:.1},{:.1}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"><title>{title}</title></polyline>",
                px - 4.0,
                py - 4.0,
                px + 4.0,
                py + 4.0,
                px - 4.0,
                py + 4.0,
                px + 4.0,
                py - 4.0
            )
        } else {
            writeln!(
                out,
                "<circle class=\"downgrade\" cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"4\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"><title>{title}</title></circle>"
            )
        };
    }
    out
}

/// A peak the timeline's points do not reach: a dotted line at its height across the process's
/// time (when within it is not known), so that the plot's maximum is the report's peak.
fn peak_mark(
    ser: &Series,
    color: &str,
    origin: u64,
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(f64) -> f64,
) -> String {
    let high = ser.points.iter().map(|p| p.1).max().unwrap_or(0);
    if ser.peak <= high {
        return String::new();
    }
    let first = ser.points.first().map_or(0, |p| p.0.saturating_sub(origin));
    let last = ser.points.last().map_or(0, |p| p.0.saturating_sub(origin));
    let (x0, x1, yy) = (
        x(first as f64),
        x(last as f64).max(x(first as f64) + 4.0),
        y(ser.peak as f64),
    );
    format!(
        "<line class=\"peak\" x1=\"{x0:.1}\" y1=\"{yy:.1}\" x2=\"{x1:.1}\" y2=\"{yy:.1}\" stroke=\"{color}\" stroke-width=\"1.5\" stroke-dasharray=\"1,3\"><title>{}: peak {} (between two timeline points, less than a millisecond long)</title></line>\n",
        esc(&ser.label),
        format_bytes(ser.peak)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn labels(t: &Ticks) -> Vec<String> {
        (0..=t.count).map(|i| t.label(i)).collect()
    }

    #[test]
    fn decimals_come_from_integers() {
        assert_eq!(decimal(3, -1), "0.3");
        assert_eq!(decimal(25, -2), "0.25");
        assert_eq!(decimal(50, -1), "5");
        assert_eq!(decimal(75, -1), "7.5");
        assert_eq!(decimal(120, 0), "120");
        assert_eq!(decimal(5, 2), "500");
        assert_eq!(decimal(0, -3), "0");
    }

    #[test]
    fn bytes_ticks_are_round_in_the_unit_shown() {
        // The issue's axis: 5.28 MiB gave 1.76/3.52/5.28 MiB.
        let t = Ticks::bytes(5_536_481);
        assert_eq!(
            labels(&t),
            ["0", "1 MiB", "2 MiB", "3 MiB", "4 MiB", "5 MiB", "6 MiB"]
        );
        assert_eq!(t.top(), (6 * MIB) as f64);
        let t = Ticks::bytes(14 * GIB);
        assert_eq!(
            labels(&t),
            ["0", "2.5 GiB", "5 GiB", "7.5 GiB", "10 GiB", "12.5 GiB", "15 GiB"]
        );
        let t = Ticks::bytes(900 << 10);
        assert_eq!(
            labels(&t),
            ["0", "200 KiB", "400 KiB", "600 KiB", "800 KiB", "1000 KiB"]
        );
        // No fractional bytes even for a tiny axis.
        assert_eq!(labels(&Ticks::bytes(3)), ["0", "1 B", "2 B", "3 B"]);
        assert_eq!(labels(&Ticks::bytes(0)), ["0", "1 B"]);
        // A top exactly on a tick stays there rather than gaining a step.
        assert_eq!(Ticks::bytes(6 * MIB).count, 6);
    }

    #[test]
    fn time_ticks_are_round_in_the_unit_shown() {
        // The issue's axis: 1.5 s had a tick at "0.3 s".
        let t = Ticks::millis(1500);
        let l = labels(&t);
        assert_eq!(
            l,
            ["0", "0.25 s", "0.5 s", "0.75 s", "1 s", "1.25 s", "1.5 s"]
        );
        assert!(!l.iter().any(|s| s == "0.3 s"));
        assert_eq!(
            labels(&Ticks::millis(400)),
            ["0", "100 ms", "200 ms", "300 ms", "400 ms"]
        );
        assert_eq!(
            labels(&Ticks::millis(30 * 60_000)),
            ["0", "5 min", "10 min", "15 min", "20 min", "25 min", "30 min"]
        );
        assert_eq!(
            labels(&Ticks::millis(20 * 3_600_000)),
            ["0", "5 h", "10 h", "15 h", "20 h"]
        );
        assert_eq!(labels(&Ticks::millis(0)), ["0", "1 ms"]);
    }

    /// Over many maxima: 5 to 7 ticks (fewer only where whole bytes or ms allow no more), a top
    /// that covers the max with no spare step, a step of 1, 2, 2.5 or 5 × 10^k, and labels that
    /// say the value drawn with at most 3 decimals.
    #[test]
    fn every_axis_has_round_labels_and_few_ticks() {
        let mut maxima = Vec::new();
        let mut v = 1.0f64;
        while v < 1e15 {
            maxima.push(v as u64);
            v *= 1.0 + std::f64::consts::PI / 10.0;
        }
        maxima.extend([
            1023, 1024, 1025, 999, 1000, 1001, 600_000, 600_001, 36_000_000, 36_000_001,
        ]);
        for &max in &maxima {
            for (t, what) in [(Ticks::bytes(max), "bytes"), (Ticks::millis(max), "ms")] {
                let ctx = format!("{what} max {max}: {t:?}");
                assert!([1, 2, 25, 5].contains(&t.step.m), "{ctx}");
                assert!(
                    t.count <= MAX_STEPS && (t.count >= 4 || max <= MAX_STEPS),
                    "{ctx}"
                );
                assert!(
                    t.top() >= max as f64 * (1.0 - 1e-9) && t.at(t.count - 1) < max as f64,
                    "{ctx}"
                );
                for i in 1..=t.count {
                    let l = t.label(i);
                    let num = l
                        .strip_suffix(&format!(" {}", t.unit))
                        .unwrap_or_else(|| panic!("{ctx}: {l}"));
                    let decimals = num.split_once('.').map_or(0, |(_, f)| f.len());
                    assert!(decimals <= 3, "{ctx}: {l}");
                    let shown: f64 = num.parse().unwrap();
                    let drawn = t.at(i) / t.unit_base;
                    assert!(
                        (shown - drawn).abs() <= drawn * 1e-9,
                        "{ctx}: {l} drawn at {drawn}"
                    );
                }
            }
        }
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000_999), "2023-11-14 22:13:20 UTC");
    }

    fn two_processes_10s_apart() -> Vec<Series> {
        let start = 1_700_000_000_500;
        let mk = |pid: u32, start: u64, budget: Option<u64>| Series {
            label: format!("app (pid {pid}, h)"),
            points: vec![(start, 0), (start + 700, MIB), (start + 1500, 2 * MIB)],
            budget,
            start_ms: start,
            peak: 2 * MIB,
            marks: Vec::new(),
        };
        vec![mk(1, start, None), mk(2, start + 10_000, Some(5_536_481))]
    }

    /// Each path's first point, and the texts of `class`.
    fn parse(svg: &str, class: &str) -> (Vec<(f64, f64)>, Vec<String>) {
        let doc = roxmltree::Document::parse(svg).unwrap();
        let starts = doc
            .descendants()
            .filter(|n| n.has_tag_name("path"))
            .map(|n| {
                let d = n.attribute("d").unwrap();
                let (px, py) = d[1..].split(' ').next().unwrap().split_once(',').unwrap();
                (px.parse().unwrap(), py.parse().unwrap())
            })
            .collect();
        let texts = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some(class))
            .map(|n| n.text().unwrap_or("").to_string())
            .collect();
        (starts, texts)
    }

    #[test]
    fn since_start_overlays_processes_started_apart() {
        let svg = render(&two_processes_10s_apart(), TimeAxis::SinceStart).unwrap();
        let (starts, xticks) = parse(&svg, "xtick");
        assert_eq!(starts.len(), 2);
        assert!(starts.iter().all(|&(px, _)| px == LEFT), "{starts:?}");
        // Each spans 1.5 s of its own.
        assert_eq!(
            xticks.last().map(String::as_str),
            Some("1.5 s"),
            "{xticks:?}"
        );
        assert_eq!(parse(&svg, "xtitle").1, ["time since process start (s)"]);
    }

    #[test]
    fn wall_clock_keeps_processes_apart() {
        let svg = render(&two_processes_10s_apart(), TimeAxis::WallClock).unwrap();
        let (starts, xticks) = parse(&svg, "xtick");
        // The origin is the earliest point's whole second, 0.5 s before it.
        let per_ms = (WIDTH - RIGHT - LEFT) / 12_000.0;
        assert!(
            (starts[0].0 - (LEFT + 500.0 * per_ms)).abs() < 0.1,
            "{starts:?}"
        );
        assert!(
            (starts[1].0 - (LEFT + 10_500.0 * per_ms)).abs() < 0.1,
            "{starts:?}"
        );
        assert_eq!(xticks, ["0", "2 s", "4 s", "6 s", "8 s", "10 s", "12 s"]);
        assert_eq!(
            parse(&svg, "xtitle").1,
            ["wall-clock time (s since 2023-11-14 22:13:20 UTC)"]
        );
    }

    #[test]
    fn y_axis_reaches_the_budget() {
        let svg = render(&two_processes_10s_apart(), TimeAxis::SinceStart).unwrap();
        let (_, yticks) = parse(&svg, "ytick");
        // Data peaks at 2 MiB; the 5.28 MiB budget sets the top.
        assert_eq!(
            yticks,
            ["0", "1 MiB", "2 MiB", "3 MiB", "4 MiB", "5 MiB", "6 MiB"]
        );
        assert!(svg.contains("budget 5.28 MiB"));
        assert!(svg.contains(r#"stroke-dasharray="6,4""#));
    }

    #[test]
    fn nothing_to_draw_is_an_error() {
        let mut s = two_processes_10s_apart();
        for x in &mut s {
            x.points.clear();
        }
        assert!(render(&s, TimeAxis::SinceStart).is_err());
        assert!(render(&[], TimeAxis::WallClock).is_err());
    }
}
