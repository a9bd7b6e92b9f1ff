//! `pinguard report`: the top callsites of any number of reports, then a LeakSanitizer-style block
//! per callsite still holding pinned memory, one per callsite whose calls were refused or
//! downgraded, then one summary line.

use crate::interp::Shown;
use crate::merge::{frame_label, Merged, ProcessLine, WhyLine};
use crate::out::{count, table};
use pinguard_common::units::format_bytes;

/// What the callsite list is ordered by (the largest first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SortBy {
    /// Live pinned bytes (then peak): what is still held, as a leak report lists it.
    #[default]
    Live,
    /// Peak pinned bytes (then live): what took the node's memory at the worst moment.
    Peak,
    /// Calls refused by a budget (then downgraded, then over budget): where the budgets bit.
    Denied,
}

impl SortBy {
    fn title(self) -> &'static str {
        match self {
            SortBy::Live => "live pinned bytes",
            SortBy::Peak => "peak pinned bytes",
            SortBy::Denied => "denied calls",
        }
    }
}

/// Orders the callsites by `by`, ties by the other figures, then by identity (a stable order).
pub fn order(m: &mut Merged, by: SortBy) {
    let key = |c: &crate::merge::Site| match by {
        SortBy::Live => [c.live_bytes, c.peak_live_bytes, c.alloc_count],
        SortBy::Peak => [c.peak_live_bytes, c.live_bytes, c.alloc_count],
        SortBy::Denied => [c.denied_count, c.downgraded_count, c.over_budget_count],
    };
    m.callsites
        .sort_by(|a, b| (key(b), a.key).cmp(&(key(a), b.key)));
}

/// How much of each stack `render` shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct Show {
    pub top: usize,
    pub by: SortBy,
    /// Every native frame, the CPython interpreter's included (`--all-frames`).
    pub all_frames: bool,
}

/// The callsites as `order` left them, saying what they were ordered by.
pub fn render(m: &Merged, show: Show) -> String {
    let Show { top, by, .. } = show;
    let mut s = String::new();
    let procs = count(m.processes as u64, "process", "processes");
    let reps = reports_phrase(m);
    s.push_str(&config_errors_block(m));
    s.push_str(&runs_block(m));
    if m.reports == 0 {
        s.push_str(&nothing_line(m));
        return s;
    }
    s.push_str(&format!(
        "Top callsites by {} ({reps}, {procs})\n\n",
        by.title()
    ));
    s.push_str(&callsites_table(m, top));
    s.push_str(&legend(m));
    holding_blocks(&mut s, m, top, show.all_frames);
    refused_blocks(&mut s, m, top, show.all_frames);
    if by == SortBy::Peak {
        peak_blocks(&mut s, m, show);
    }
    s.push_str(&why_block(m));
    s.push_str(&summary_line(m, &procs, &reps));
    s
}

/// `3 reports, 1 of them killed (read from the state left behind)`: processes read from the state
/// they left are said to be so, lest a reader take them for exits.
fn reports_phrase(m: &Merged) -> String {
    let mut reps = count(m.reports as u64, "report", "reports");
    let with = |reason: &str| m.per_process.iter().filter(|p| p.reason == reason).count();
    let (killed, running) = (with("killed"), with("running"));
    if killed > 0 {
        reps.push_str(&format!(
            ", {killed} of them killed (read from the state left behind)"
        ));
    }
    if running > 0 {
        reps.push_str(&format!(
            ", {running} still running (read from the live state)"
        ));
    }
    reps
}

/// The table of the first `top` callsites, with what was left out and folded.
fn callsites_table(m: &Merged, top: usize) -> String {
    let mut rows = vec![["LIVE", "COUNT", "PEAK", "ALLOCS"]
        .into_iter()
        .chain(crate::merge::TAIL)
        .map(String::from)
        .collect::<Vec<_>>()];
    for c in m.callsites.iter().take(top) {
        let sizes = [
            format_bytes(c.live_bytes),
            c.live_count.to_string(),
            format_bytes(c.peak_live_bytes),
            c.alloc_count.to_string(),
        ];
        rows.push(
            sizes
                .into_iter()
                .chain(crate::merge::tail_cells(c))
                .collect(),
        );
    }
    let mut s = table(
        &rows,
        &[true, true, true, true, true, true, true, true, false, false],
    );
    if m.callsites.len() > top {
        s.push_str(&format!(
            "... {} (--top)\n",
            count(
                (m.callsites.len() - top) as u64,
                "more callsite",
                "more callsites"
            )
        ));
    }
    if let Some(line) = folded_line(&m.callsites_folded) {
        s.push_str(&line);
    }
    s
}

/// A block with its stack for each callsite holding memory, in order of what it holds (whatever
/// the table's order).
fn holding_blocks(s: &mut String, m: &Merged, top: usize, all_frames: bool) {
    let mut holding: Vec<_> = m
        .callsites
        .iter()
        .filter(|c| c.live_bytes > 0)
        .take(top)
        .collect();
    holding.sort_by_key(|c| std::cmp::Reverse(c.live_bytes));
    for c in holding {
        s.push_str(&format!(
            "\n{} ({}) in {} from {}, through {}:\n",
            count(c.live_bytes, "byte", "bytes"),
            format_bytes(c.live_bytes),
            count(c.live_count, "allocation", "allocations"),
            holders(c),
            c.apis.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
        if let Some(turned) = turned_away(c) {
            s.push_str(&format!("  and {turned}\n"));
        }
        stack_block(s, c, all_frames);
    }
}

/// A call refused (the program's out-of-memory error) or downgraded holds nothing, but where it
/// came from is what its owner looks for: its stack, as a live callsite's.
fn refused_blocks(s: &mut String, m: &Merged, top: usize, all_frames: bool) {
    let mut refused: Vec<_> = m
        .callsites
        .iter()
        .filter(|c| c.live_bytes == 0 && turned_away(c).is_some())
        .take(top)
        .collect();
    refused.sort_by_key(|c| std::cmp::Reverse((c.denied_count, c.downgraded_count)));
    for c in refused {
        s.push_str(&format!(
            "\n{} (nothing live) from {}, through {}:\n",
            turned_away(c).unwrap_or_default(),
            count(c.processes as u64, "process", "processes"),
            c.apis.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
        stack_block(s, c, all_frames);
    }
}

/// The last line, `SUMMARY: pinguard: ...`, which CI logs are searched for.
fn summary_line(m: &Merged, procs: &str, reps: &str) -> String {
    let t = &m.totals;
    format!(
        "\nSUMMARY: pinguard: {} ({}) pinned in {} across {procs}{}; peak {} held at once; {} denied ({}), {} downgraded ({}), {} over budget{}; {reps}\n",
        count(t.live_bytes, "byte", "bytes"),
        format_bytes(t.live_bytes),
        count(t.live_count, "allocation", "allocations"),
        match t.kernel_pinned_bytes {
            0 => String::new(),
            b => format!(
                ", {} more kernel-pinned with no callsite (VmPin)",
                format_bytes(b)
            ),
        },
        format_bytes(t.peak_live_bytes),
        t.denied_count,
        format_bytes(t.denied_bytes),
        t.downgraded_count,
        format_bytes(t.downgraded_bytes),
        t.over_budget_count,
        crate::merge::host_clause(m),
    )
}

/// At most this many refused, downgraded or failed calls are shown with why: the latest of all.
const MAX_WHYS: usize = 10;

/// The latest refused, downgraded and failed calls of every process, each with the line that says
/// why under it (issue 46 item 13): the API's answer and the room that users otherwise gather by
/// hand. A process's snapshots and its exit report hold the same events: its latest report's are
/// shown.
fn why_block(m: &Merged) -> String {
    let mut latest = std::collections::HashMap::new();
    for p in &m.per_process {
        let l = latest
            .entry((&p.hostname, p.pid, p.start_unix_ms))
            .or_insert(p);
        if (p.write_unix_ms, p.why_count) > (l.write_unix_ms, l.why_count) {
            *l = p;
        }
    }
    let mut procs: Vec<&ProcessLine> = latest.into_values().collect();
    procs.sort_by_key(|p| (&p.hostname, p.pid, p.start_unix_ms));
    let total: u64 = procs.iter().map(|p| p.why_count).sum();
    let mut all: Vec<(&ProcessLine, &WhyLine)> = procs
        .iter()
        .flat_map(|&p| p.whys.iter().map(move |w| (p, w)))
        .collect();
    // Stable: a process's own events stay in their order within a millisecond.
    all.sort_by_key(|&(_, w)| w.unix_ms);
    if all.is_empty() {
        return String::new();
    }
    let shown = &all[all.len().saturating_sub(MAX_WHYS)..];
    let labels: std::collections::HashMap<_, _> = m
        .callsites
        .iter()
        .map(|c| (c.key, crate::merge::short_label(c)))
        .collect();
    let shown_calls: u64 = shown.iter().map(|(_, w)| 1 + w.repeats).sum();
    let mut s = format!(
        "\nCalls refused, downgraded or failed, and why ({} of {}, the latest last):\n",
        shown_calls,
        total.max(shown_calls)
    );
    let mut lines: Vec<(String, String, u64)> = Vec::new();
    for &(p, w) in shown {
        let at = w
            .site
            .and_then(|k| labels.get(&k))
            .map(|l| format!(" at {l}"))
            .unwrap_or_default();
        let exe = p.exe.rsplit('/').next().unwrap_or(&p.exe);
        let call = format!(
            "{} {}{at}, pid {} ({exe})",
            w.kind.verb(),
            pinguard_common::call_line(&w.api, w.size, w.why.asked_bytes),
            p.pid
        );
        let why = w.why.line();
        // The same call failing the same way again: one entry, counted (an event counts the
        // failures it stands for).
        let calls = 1 + w.repeats;
        match lines.last_mut() {
            Some((c, y, n)) if *c == call && *y == why => *n += calls,
            _ => lines.push((call, why, calls)),
        }
    }
    for (call, why, n) in lines {
        let times = if n > 1 {
            format!(" ({n} times)")
        } else {
            String::new()
        };
        s.push_str(&format!("  {call}{times}\n    why: {why}\n"));
    }
    s
}

/// What the table's figures mean where they could be read otherwise: summed over processes, or
/// the most of one process (issue 46, item 6). Only when several processes were merged.
fn legend(m: &Merged) -> String {
    if m.processes < 2 {
        return String::new();
    }
    "\n(LIVE and COUNT: what each process still held at its last reading, summed; PEAK: the most the callsite held in one process; the SUMMARY's peak: the most held at once by processes alive together)\n".to_string()
}

/// `from 1 process` (the processes that hold the callsite's live bytes), with how many more
/// processes went through it without holding anything now.
fn holders(c: &crate::merge::Site) -> String {
    let n = count(c.live_processes as u64, "process", "processes");
    match c.processes.saturating_sub(c.live_processes) {
        0 => n,
        k => format!("{n} ({k} more went through it and hold nothing)"),
    }
}

/// `2 calls refused for 8.00 MiB, 1 downgraded for 4.00 MiB`: what the budgets turned away at the
/// callsite, if anything (the bytes where the reports have them).
fn turned_away(c: &crate::merge::Site) -> Option<String> {
    let parts: Vec<String> = [
        (c.denied_count, c.denied_bytes, "refused"),
        (c.downgraded_count, c.downgraded_bytes, "downgraded"),
    ]
    .into_iter()
    .filter(|&(n, _, _)| n > 0)
    .enumerate()
    .map(|(i, (n, bytes, what))| {
        let calls = if i == 0 {
            format!("{} {what}", count(n, "call", "calls"))
        } else {
            format!("{n} {what}")
        };
        bytes.map_or(calls.clone(), |b| {
            format!("{calls} for {}", format_bytes(b))
        })
    })
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Under `--sort peak`, the stacks of the top callsites by peak that the blocks above left out
/// (nothing live, nothing turned away): memory pinned for a while and freed before the end.
fn peak_blocks(s: &mut String, m: &Merged, show: Show) {
    let freed = m
        .callsites
        .iter()
        .take(show.top)
        .filter(|c| c.live_bytes == 0 && c.peak_live_bytes > 0 && turned_away(c).is_none());
    for c in freed {
        s.push_str(&format!(
            "\n{} ({}) at peak, nothing live; {} from {}, through {}:\n",
            count(c.peak_live_bytes, "byte", "bytes"),
            format_bytes(c.peak_live_bytes),
            count(c.alloc_count, "allocation", "allocations"),
            count(c.processes as u64, "process", "processes"),
            c.apis.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
        stack_block(s, c, show.all_frames);
    }
}

/// A callsite's stack: its Python frames first when it has any, then its native frames, where
/// a run of the CPython interpreter's own is one line unless `all_frames`.
fn stack_block(s: &mut String, c: &crate::merge::Site, all_frames: bool) {
    let python = !c.py_frames.is_empty();
    if python {
        s.push_str("  Python:\n");
        for (i, f) in c.py_frames.iter().enumerate() {
            s.push_str(&format!("    #{i} {}\n", frame_label(f)));
        }
        s.push_str("  native:\n");
    }
    if c.frames.is_empty() {
        s.push_str("    (no stack: PINGUARD_DEPTH=0)\n");
    }
    for line in crate::interp::folded(&c.frames, python && !all_frames) {
        match line {
            Shown::Frame(i, f) => {
                s.push_str(&format!("    #{i} {:#x} in {}\n", f.addr.0, frame_label(f)))
            }
            Shown::Folded(n) => s.push_str(&format!(
                "    ... {n} CPython interpreter frames folded (--all-frames shows them)\n"
            )),
        }
    }
}

/// The settings processes could not use, before anything else: a budget that was not in force
/// must not read like one that held.
pub fn config_errors_block(m: &Merged) -> String {
    let lines = m.config_error_lines();
    if lines.is_empty() {
        return String::new();
    }
    let what = count(lines.len() as u64, "setting", "settings");
    let mut s = format!("{what} could not be used; the processes ran on the fallbacks named:\n");
    for l in lines {
        s.push_str(&format!("  {l}\n"));
    }
    s.push('\n');
    s
}

/// At most this many run records are named, one line each.
const MAX_RUNS: usize = 10;

/// A line per run record (`pinguard run`'s) among the inputs: how the command ended, what it left.
pub fn runs_block(m: &Merged) -> String {
    if m.runs.is_empty() {
        return String::new();
    }
    let mut s = String::new();
    for r in m.runs.iter().take(MAX_RUNS) {
        s.push_str(&format!("Run: {}\n", r.line()));
    }
    if m.runs.len() > MAX_RUNS {
        s.push_str(&format!(
            "... {}\n",
            count((m.runs.len() - MAX_RUNS) as u64, "more run", "more runs")
        ));
    }
    s.push('\n');
    s
}

/// The summary when the inputs are run records only: what is known, said as such.
fn nothing_line(m: &Merged) -> String {
    let runs = count(m.runs.len() as u64, "run", "runs");
    if m.runs.iter().any(|r| r.disabled) {
        return format!("SUMMARY: pinguard: no report in {runs}; PINGUARD_DISABLE was set, so nothing was recorded: what was pinned is not known\n");
    }
    if m.runs.iter().any(|r| r.unchecked()) {
        return format!("SUMMARY: pinguard: no report in {runs}; pinguard could not be loaded into a command (see above): what was pinned is not known\n");
    }
    format!("SUMMARY: pinguard: nothing was pinned: no process left a report or state in {runs}\n")
}

/// The callsites folded into one aggregate, when there are any: `N callsites folded: X peak, ...`.
pub fn folded_line(f: &pinguard_common::Folded) -> Option<String> {
    if f.is_empty() {
        return None;
    }
    let mut line = format!(
        "{} folded (nothing live; PINGUARD_MAX_CALLSITES): {} peak at most, {} of {}",
        count(f.count, "callsite", "callsites"),
        format_bytes(f.peak_live_bytes),
        count(f.alloc_count, "allocation", "allocations"),
        format_bytes(f.alloc_bytes),
    );
    for (n, what) in [
        (f.denied_count, "denied"),
        (f.downgraded_count, "downgraded"),
        (f.over_budget_count, "over budget"),
    ] {
        if n > 0 {
            line.push_str(&format!(", {n} {what}"));
        }
    }
    line.push('\n');
    Some(line)
}

/// The callsite with its name set, as `short_label` gives it.
fn named(c: &crate::merge::Site) -> crate::merge::Site {
    let mut c = c.clone();
    c.label = crate::merge::short_label(&c);
    c
}

pub fn json(m: &Merged, top: usize) -> String {
    #[derive(serde::Serialize)]
    struct Out<'a> {
        reports: usize,
        processes: usize,
        totals: &'a pinguard_common::Totals,
        #[serde(skip_serializing_if = "Option::is_none")]
        host: Option<crate::merge::HostLine>,
        callsites: Vec<crate::merge::Site>,
        #[serde(skip_serializing_if = "pinguard_common::Folded::is_empty")]
        callsites_folded: &'a pinguard_common::Folded,
        per_process: &'a [crate::merge::ProcessLine],
        config_errors: &'a [crate::merge::ConfigError],
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        runs: &'a [crate::record::RunRecord],
    }
    let o = Out {
        reports: m.reports,
        processes: m.processes,
        totals: &m.totals,
        host: m.host,
        // Each named, as the table names it (`label`), beside its whole stack.
        callsites: m.callsites.iter().take(top).map(named).collect(),
        callsites_folded: &m.callsites_folded,
        per_process: &m.per_process,
        config_errors: &m.config_errors,
        runs: &m.runs,
    };
    let mut s = serde_json::to_string_pretty(&o).unwrap_or_default();
    s.push('\n');
    s
}
