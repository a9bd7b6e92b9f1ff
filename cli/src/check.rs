//! `pinguard check`: CI gates over the summed figures of the given reports.

use crate::merge::{Merged, ProcSite, ProcessLine, SiteKey};
use crate::out::count;
use crate::suppress::{Applied, Figure};
use pinguard_common::units::format_bytes;
use std::collections::HashMap;

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

/// At most this many processes are named per violated limit; the rest are counted.
const MAX_NAMED: usize = 5;

fn size(n: u64) -> String {
    format!("{n} ({})", format_bytes(n))
}

/// Names callsites by key as `report` names them, with at least their caller (`lock_key
/// (locker.c:12) <- main`).
struct Names<'a>(HashMap<SiteKey, &'a crate::merge::Site>);

impl<'a> Names<'a> {
    fn new(m: &'a Merged) -> Names<'a> {
        Names(m.callsites.iter().map(|s| (s.key, s)).collect())
    }

    fn name(&self, key: SiteKey) -> String {
        match self.0.get(&key) {
            Some(s) => crate::merge::name_of(
                s,
                crate::merge::Name {
                    frames: s.name.frames.max(2),
                    shorten: s.name.shorten,
                },
            ),
            None => "(no stack)".into(),
        }
    }
}

/// What a check sees of the reports: their figures less what the suppressions took.
pub struct View<'a> {
    pub m: &'a Merged,
    pub sup: &'a Applied,
    names: Names<'a>,
}

impl<'a> View<'a> {
    pub fn new(m: &'a Merged, sup: &'a Applied) -> View<'a> {
        View {
            m,
            sup,
            names: Names::new(m),
        }
    }

    pub fn name(&self, key: SiteKey) -> String {
        self.names.name(key)
    }

    /// A process's callsites that count for `f` (not suppressed), with their figure.
    fn counted<'p>(
        &'p self,
        p: &'p ProcessLine,
        f: impl Fn(&ProcSite) -> u64 + 'p,
        fig: Option<Figure>,
    ) -> impl Iterator<Item = (SiteKey, u64)> + 'p {
        p.sites
            .iter()
            .filter(move |s| fig.is_none_or(|g| !self.sup.takes(s.key, g)))
            .map(move |s| (s.key, f(s)))
    }

    /// A process's figure `f` less its suppressed callsites' (`total` is the process's own).
    fn process_figure(&self, p: &ProcessLine, total: u64, fig: Figure) -> u64 {
        let taken: u64 = p
            .sites
            .iter()
            .filter(|s| self.sup.takes(s.key, fig))
            .map(|s| fig.of(s))
            .sum();
        if fig == Figure::Peak && taken > 0 {
            // Peaks of callsites need not coincide: what is left is at most the sum of the
            // others' peaks, and never more than the process's own (suppression never hides).
            let rest: u64 = self.counted(p, |s| s.peak, Some(fig)).map(|c| c.1).sum();
            return rest.min(total);
        }
        total.saturating_sub(taken)
    }

    /// The callsite of `p` with the most of `f` (among those that count), as `N NAME`.
    fn top(
        &self,
        p: &ProcessLine,
        f: impl Fn(&ProcSite) -> u64,
        fig: Option<Figure>,
        show: &dyn Fn(u64) -> String,
    ) -> String {
        match self
            .counted(p, f, fig)
            .filter(|c| c.1 > 0)
            .max_by_key(|c| (c.1, std::cmp::Reverse(c.0)))
        {
            Some((k, n)) => format!("top callsite {} {}", show(n), self.name(k)),
            None => "no callsite recorded".into(),
        }
    }
}

/// `FILE (exe, pid N)`: where a figure comes from.
fn whose(p: &ProcessLine) -> String {
    format!(
        "{} ({}, pid {})",
        p.path,
        crate::merge::basename(&p.exe),
        p.pid
    )
}

/// A limit's figure, per process and per callsite.
struct Gate<'f> {
    fig: Option<Figure>,
    of_process: OfProcess<'f>,
    of_site: fn(&ProcSite) -> u64,
    show: &'f dyn Fn(u64) -> String,
}

/// The lines of a violated limit, LeakSanitizer's way: `head` (`6.00 MiB live pinned bytes exceed
/// --max-live 0`), then where: one process alone in the line, several one line each (the largest
/// first, `MAX_NAMED` of them), each with its file, executable, pid and top callsite.
fn named(v: &View, head: String, g: &Gate) -> Vec<String> {
    let mut procs: Vec<(&ProcessLine, u64)> =
        v.m.latest_processes()
            .into_iter()
            .map(|p| {
                let n = (g.of_process)(p);
                (p, g.fig.map_or(n, |f| v.process_figure(p, n, f)))
            })
            .filter(|(_, n)| *n > 0)
            .collect();
    procs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.path.cmp(&b.0.path)));
    let top = |p: &ProcessLine| v.top(p, g.of_site, g.fig, g.show);
    match procs.as_slice() {
        [] => vec![format!("pinguard check: {head}")],
        [(p, _)] => vec![format!(
            "pinguard check: {head} in {}; {}",
            whose(p),
            top(p)
        )],
        many => {
            let mut out: Vec<String> = many
                .iter()
                .take(MAX_NAMED)
                .map(|(p, n)| {
                    format!(
                        "pinguard check: {head}: {} in {}; {}",
                        (g.show)(*n),
                        whose(p),
                        top(p)
                    )
                })
                .collect();
            if many.len() > MAX_NAMED {
                out.push(format!(
                    "pinguard check: {head}: ... and {}",
                    count(
                        (many.len() - MAX_NAMED) as u64,
                        "more process",
                        "more processes"
                    )
                ));
            }
            out
        }
    }
}

/// `--max-peak`: each process's own peak, then (when several were alive at once) what they held
/// together, from their timelines.
fn peak_violations(w: &View, max: u64) -> Vec<String> {
    let m = w.m;
    let mut v = Vec::new();
    let peak = |p: &ProcessLine| w.process_figure(p, p.totals.peak_live_bytes, Figure::Peak);
    let over: Vec<_> = m
        .latest_processes()
        .into_iter()
        .filter(|p| peak(p) > max)
        .collect();
    for p in over.iter().take(MAX_NAMED) {
        let n = peak(p);
        v.push(format!(
            "pinguard check: {} pinned bytes at the peak exceed --max-peak {} in {}; {}",
            size(n),
            size(max),
            whose(p),
            w.top(p, |s| s.peak, Some(Figure::Peak), &format_bytes)
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
        // The largest of them, with its callsite: where to look first.
        let largest = m
            .latest_processes()
            .into_iter()
            .filter(|p| p.hostname == together.host)
            .max_by_key(|p| p.totals.peak_live_bytes)
            .map(|p| {
                format!(
                    "; the largest {} peaked at {}, {}",
                    whose(p),
                    format_bytes(p.totals.peak_live_bytes),
                    w.top(p, |s| s.peak, None, &format_bytes)
                )
            })
            .unwrap_or_default();
        v.push(format!(
            "pinguard check: processes alive at the same time peaked at {} pinned bytes together ({}), over --max-peak {}{largest}",
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

/// A limit for people: `0` as typed, else bytes as `report` shows them.
fn limit_bytes(n: u64) -> String {
    if n == 0 {
        "0".into()
    } else {
        format_bytes(n)
    }
}

/// A process's figure for a limit.
type OfProcess<'f> = &'f dyn Fn(&ProcessLine) -> u64;

/// `N calls`.
fn calls(n: u64) -> String {
    count(n, "call", "calls")
}

/// The lines of a limit on a count of calls: none when `(max, n)` holds.
fn count_lines(
    w: &View,
    (max, n): (Option<u64>, u64),
    (one, many): (&str, &str),
    flag: &str,
    g: &Gate,
) -> Vec<String> {
    match max.filter(|&max| n > max) {
        Some(max) => named(
            w,
            format!("{} {} {flag} {max}", count(n, one, many), exceed(n)),
            g,
        ),
        None => Vec::new(),
    }
}

/// One line per violated limit (empty: all within), and a line saying what was checked.
pub fn evaluate(w: &View, l: &Limits) -> (Vec<String>, String) {
    let m = w.m;
    let mut v = Vec::new();
    if !l.allow_config_errors {
        // First: a budget that was never in force makes every other figure meaningless.
        for e in m.config_error_lines() {
            v.push(format!("pinguard check: a setting could not be used in {e} (--allow-config-errors to pass anyway)"));
        }
    }
    v.extend(unwatched_runs(m, l));
    let live = m
        .totals
        .live_bytes
        .saturating_sub(w.sup.taken(Figure::Live));
    if let Some(max) = l.max_live.filter(|&max| live > max) {
        let head = format!(
            "{} live pinned bytes exceed --max-live {}",
            format_bytes(live),
            limit_bytes(max)
        );
        let g = Gate {
            fig: Some(Figure::Live),
            of_process: &|p| p.totals.live_bytes,
            of_site: |s| s.live,
            show: &format_bytes,
        };
        v.extend(named(w, head, &g));
    }
    if let Some(max) = l.max_peak {
        v.extend(peak_violations(w, max));
    }
    v.extend(policy_violations(w, l));
    v.extend(reserve_violations(w, l));
    (v, checked_line(w, l, live))
}

/// The limits on calls the policies answered: refused, downgraded, pinned over the budget.
fn policy_violations(w: &View, l: &Limits) -> Vec<String> {
    let t = &w.m.totals;
    let left = |n: u64, fig: Figure| n.saturating_sub(w.sup.taken(fig));
    let gate = |fig: Figure, of_process: OfProcess<'static>, of_site| Gate {
        fig: Some(fig),
        of_process,
        of_site,
        show: &calls,
    };
    let mut v = count_lines(
        w,
        (l.max_denied, left(t.denied_count, Figure::Denied)),
        ("denied call", "denied calls"),
        "--max-denied",
        &gate(Figure::Denied, &|p| p.totals.denied_count, |s| s.denied),
    );
    v.extend(count_lines(
        w,
        (
            l.max_downgraded,
            left(t.downgraded_count, Figure::Downgraded),
        ),
        ("downgraded call", "downgraded calls"),
        "--max-downgraded",
        &gate(Figure::Downgraded, &|p| p.totals.downgraded_count, |s| {
            s.downgraded
        }),
    ));
    v.extend(count_lines(
        w,
        (
            l.max_over_budget,
            left(t.over_budget_count, Figure::OverBudget),
        ),
        ("call over the budget", "calls over the budget"),
        "--max-over-budget",
        &gate(Figure::OverBudget, &|p| p.totals.over_budget_count, |s| {
            s.over_budget
        }),
    ));
    v
}

/// The limits on calls the host's and the cgroup's reserves stopped, at any callsite: each
/// process's top callsite by calls over a limit.
fn reserve_violations(w: &View, l: &Limits) -> Vec<String> {
    let t = &w.m.totals;
    let reserve = |of_process: OfProcess<'static>| Gate {
        fig: None,
        of_process,
        of_site: |s| s.denied + s.downgraded + s.over_budget,
        show: &calls,
    };
    let mut v = count_lines(
        w,
        (l.max_host_reserve, t.host_reserve_count),
        (
            "call stopped by the host reserve",
            "calls stopped by the host reserve",
        ),
        "--max-host-reserve",
        &reserve(&|p| p.totals.host_reserve_count),
    );
    v.extend(count_lines(
        w,
        (l.max_cgroup_reserve, t.cgroup_reserve_count),
        (
            "call stopped by the cgroup reserve",
            "calls stopped by the cgroup reserve",
        ),
        "--max-cgroup-reserve",
        &reserve(&|p| p.totals.cgroup_reserve_count),
    ));
    v
}

/// `pinguard check: 1 run, 2 reports, 2 processes: live ...`: what was checked, and that only the
/// settings were when no limit was given (a leak then passes).
fn checked_line(w: &View, l: &Limits, live: u64) -> String {
    let (m, t) = (w.m, &w.m.totals);
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
    let scope = if none {
        " (settings only: no --max-* limit was given)"
    } else {
        ""
    };
    let runs = match m.runs.len() {
        0 => String::new(),
        n => format!("{}, ", count(n as u64, "run", "runs")),
    };
    format!(
        "pinguard check: {runs}{}, {}: live {}, {} denied, {} downgraded, {} over budget{}{}{scope}",
        count(m.reports as u64, "report", "reports"),
        count(m.processes as u64, "process", "processes"),
        format_bytes(live),
        t.denied_count.saturating_sub(w.sup.taken(Figure::Denied)),
        t.downgraded_count
            .saturating_sub(w.sup.taken(Figure::Downgraded)),
        t.over_budget_count
            .saturating_sub(w.sup.taken(Figure::OverBudget)),
        crate::merge::host_clause(m),
        w.sup.clause()
    )
}
