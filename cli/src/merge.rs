//! Many reports folded into one view: callsites matched by their symbolised frames (addresses move
//! between runs and processes), figures summed, processes counted.

use pinguard_common::view::{FrameView, ReportView};
use pinguard_common::{add_site_counters, site_struct, Frame, Totals};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

pub fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Rust (legacy and v0) and C++ names, made readable; anything else as it is.
pub fn demangle(s: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(s) {
        return format!("{d:#}");
    }
    if s.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(s) {
            if let Ok(d) = sym.demangle() {
                return d;
            }
        }
    }
    s.to_string()
}

/// A frame for people: `function file:line`, or `module+0xoffset`.
pub fn frame_label(f: &Frame) -> String {
    let sym = f.symbol.as_deref().map(demangle);
    match (sym, &f.file, f.line) {
        (Some(s), Some(file), Some(line)) => format!("{s} {}:{line}", file),
        (Some(s), _, _) => match (&f.module, &f.offset) {
            (Some(m), Some(o)) => format!("{s} ({}+{:#x})", basename(m), o.0),
            _ => s,
        },
        (None, _, _) => match (&f.module, &f.offset) {
            (Some(m), Some(o)) => format!("{}+{:#x}", basename(m), o.0),
            _ => format!("{:#x}", f.addr.0),
        },
    }
}

/// The callsite's name: its innermost frame, then the callers the merge found it takes to tell
/// it from the other callsites with that frame (`Site::name`).
pub fn short_label(site: &Site) -> String {
    name_of(site, site.name)
}

/// The callsite named by the frames `name` says.
pub fn name_of(site: &Site, name: Name) -> String {
    let frames = named_frames(site);
    let k = name.frames.clamp(1, frames.len().max(1));
    let mut parts: Vec<String> = Vec::with_capacity(SHOWN_CALLERS + 2);
    parts.push(
        frames
            .first()
            .map_or_else(|| "(no stack)".into(), frame_short),
    );
    let from = if name.shorten && k > SHOWN_CALLERS + 1 {
        parts.push("...".into());
        k - SHOWN_CALLERS
    } else {
        1
    };
    // A callsite without frames (a report written by hand) is named `(no stack)` alone.
    parts.extend(
        frames
            .get(from.min(k)..k)
            .unwrap_or_default()
            .iter()
            .map(frame_short),
    );
    parts.join(" <- ")
}

/// How much of its stack names a callsite: its first `frames` frames (the innermost alone when
/// 0 or 1), the callers between the innermost and the last `SHOWN_CALLERS` of them left out
/// (`... <-`) when `shorten`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Name {
    pub frames: usize,
    pub shorten: bool,
}

/// The frames a callsite is named by: its Python ones when it has any (as `site_key` matches it).
fn named_frames(site: &Site) -> &[Frame] {
    if site.py_frames.is_empty() {
        &site.frames
    } else {
        &site.py_frames
    }
}

/// Callers shown in a name before the ones between are left out (`... <-`).
const SHOWN_CALLERS: usize = 2;

/// How to name each of `sites`, by key: its innermost frame, then its callers up to the first
/// that no other callsite with the same frames so far has (`cuda_pin (serve.py:7) <-
/// load_weights (serve.py:12)`), as PyTorch's memory snapshot and memray tell stacks apart; the
/// callers between the innermost and that one are left out past `SHOWN_CALLERS` when the name
/// stays unique without them. Only callsites that share their innermost frame are in the map (the
/// others are named by it alone), and frames are compared by their hashes: names are written
/// only for the callsites shown. A callsite given twice (the same one in two runs) counts once.
pub fn labels<'a>(sites: impl IntoIterator<Item = &'a Site>) -> HashMap<SiteKey, Name> {
    let mut by_first: HashMap<u64, Vec<&Site>> = HashMap::new();
    let mut keys = std::collections::HashSet::new();
    for s in sites.into_iter().filter(|s| keys.insert(s.key)) {
        by_first
            .entry(named_frames(s).first().map_or(0, frame_hash))
            .or_default()
            .push(s);
    }
    let mut out = HashMap::new();
    for group in by_first.into_values().filter(|g| g.len() > 1) {
        out.extend(distinguish(&group));
    }
    out
}

/// A frame's identity, as `site_key` takes it, in one word: callsites whose innermost frames
/// have the same one cannot be told apart by that frame alone.
fn frame_hash(f: &Frame) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    match (&f.symbol, &f.module, f.offset) {
        (Some(s), _, _) => (1u8, s, &f.file, f.line).hash(&mut h),
        (None, Some(m), Some(o)) => (2u8, basename(m), o.0).hash(&mut h),
        _ => (3u8, f.addr.0).hash(&mut h),
    }
    h.finish()
}

/// Names for callsites that share their innermost frame: each up to the frame after the longest
/// run of frames it shares with another (sorted, a callsite's nearest are its neighbours).
fn distinguish(group: &[&Site]) -> Vec<(SiteKey, Name)> {
    let mut seqs: Vec<(Vec<u64>, SiteKey)> = group
        .iter()
        .map(|s| (named_frames(s).iter().map(frame_hash).collect(), s.key))
        .collect();
    seqs.sort();
    let common = |a: &[u64], b: &[u64]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let mut named: Vec<(SiteKey, Name)> = Vec::with_capacity(seqs.len());
    // What a shortened name shows: the innermost frame and the last `SHOWN_CALLERS` of its `k`.
    let mut shown: HashMap<(u64, &[u64]), usize> = HashMap::new();
    for (i, (seq, key)) in seqs.iter().enumerate() {
        let before = i.checked_sub(1).map_or(0, |j| common(seq, &seqs[j].0));
        let after = seqs.get(i + 1).map_or(0, |n| common(seq, &n.0));
        let k = (before.max(after) + 1).clamp(1, seq.len().max(1));
        let shorten = k > SHOWN_CALLERS + 1;
        if shorten {
            *shown
                .entry((seq[0], &seq[k - SHOWN_CALLERS..k]))
                .or_default() += 1;
        }
        named.push((*key, Name { frames: k, shorten }));
    }
    // A shortened name that another callsite also got is written out whole.
    for ((_, name), (seq, _)) in named.iter_mut().zip(&seqs) {
        let k = name.frames;
        if name.shorten && shown[&(seq[0], &seq[k - SHOWN_CALLERS..k])] > 1 {
            name.shorten = false;
        }
    }
    named
}

/// What the host reserve did, for a summary line: empty when no report had one in force.
pub fn host_clause(m: &Merged) -> String {
    let mut s = match m.host {
        Some(h) => format!(
            ", {} by the host reserve of {} (lowest available {})",
            crate::out::count(m.totals.host_reserve_count, "call stopped", "calls stopped"),
            pinguard_common::units::format_bytes(h.reserve_bytes),
            pinguard_common::units::format_bytes(h.lowest_available_bytes)
        ),
        None => String::new(),
    };
    if let Some(c) = m.cgroup {
        s.push_str(&format!(
            ", {} by the cgroup reserve of {} (lowest headroom {})",
            crate::out::count(
                m.totals.cgroup_reserve_count,
                "call stopped",
                "calls stopped"
            ),
            pinguard_common::units::format_bytes(c.reserve_bytes),
            pinguard_common::units::format_bytes(c.lowest_headroom_bytes)
        ));
    }
    s
}

/// The columns every callsite table ends with, after its size columns, and a row's cells for them:
/// what the budgets did to the callsite's calls, who shares it, through what, and its name.
pub const TAIL: [&str; 6] = [
    "DENIED",
    "DOWNGRADED",
    "OVER-BUDGET",
    "PROCS",
    "API",
    "CALLSITE",
];

pub fn tail_cells(c: &Site) -> Vec<String> {
    vec![
        c.denied_count.to_string(),
        c.downgraded_count.to_string(),
        c.over_budget_count.to_string(),
        c.processes.to_string(),
        c.apis.iter().cloned().collect::<Vec<_>>().join(","),
        short_label(c),
    ]
}

/// `name` (`name_of`), saying when processes share the callsite (a DataLoader's workers and
/// their parent all run `pin (workers.py:4)`), for lists without a PROCS column.
pub fn with_processes(site: &Site, name: String) -> String {
    match site.processes {
        0 | 1 => name,
        n => format!("{name} in {n} processes"),
    }
}

/// A frame in a name: `function (file:line)` with the file's base name, else as `frame_label`.
fn frame_short(f: &Frame) -> String {
    let sym = f.symbol.as_deref().map(demangle);
    match (sym, &f.file, f.line) {
        (Some(s), Some(file), Some(line)) => format!("{s} ({}:{line})", basename(file)),
        (Some(s), _, _) => s,
        _ => frame_label(f),
    }
}

/// A callsite's identity across processes and runs (addresses move, symbols do not): per frame its
/// function, file and line when symbolised, else its module's file name and offset, else the raw
/// address; hashed to 128 bits so that a million callsites never collide in practice. A callsite
/// with Python frames is identified by those alone: the Python code is what people change and
/// compare, and the native path under one Python line can vary (interpreter specialisation,
/// library versions).
pub type SiteKey = (u64, u64);

pub fn site_key(frames: &[FrameView<'_>], py_frames: &[FrameView<'_>]) -> SiteKey {
    let mut a = std::hash::DefaultHasher::new();
    let mut b = std::hash::DefaultHasher::new();
    b.write_u64(0x9e37_79b9_7f4a_7c15);
    let frames = if py_frames.is_empty() {
        frames
    } else {
        a.write_u8(0xfe);
        b.write_u8(0xfe);
        py_frames
    };
    for f in frames {
        for h in [&mut a, &mut b] {
            match (&f.symbol, &f.file, f.line) {
                (Some(s), file, line) => {
                    h.write_u8(1);
                    h.write(s.as_bytes());
                    h.write_u8(0);
                    if let (Some(file), Some(line)) = (file, line) {
                        h.write(file.as_bytes());
                        h.write_u32(line);
                    }
                }
                _ => match (&f.module, &f.offset) {
                    (Some(m), Some(o)) => {
                        h.write_u8(2);
                        h.write(basename(m).as_bytes());
                        h.write_u64(o.0);
                    }
                    _ => {
                        h.write_u8(3);
                        h.write_u64(f.addr.0);
                    }
                },
            }
            h.write_u8(0xff);
        }
    }
    (a.finish(), b.finish())
}

/// Each line's peak in one process's report. Stacks the process counted apart but that show as
/// one line (the same Python frames over several native paths) each have their own peak, and
/// nothing says whether they were held at the same time: their sum, but never more than the
/// process's own peak, nor less than the largest of theirs (issue 34, item 4).
fn site_peaks(
    r: &ReportView<'_>,
    keys: &[SiteKey],
) -> HashMap<SiteKey, std::cell::Cell<Option<u64>>> {
    let mut sums: HashMap<SiteKey, (u64, u64)> = HashMap::new();
    for (c, key) in r.callsites.iter().zip(keys) {
        let e = sums.entry(*key).or_default();
        *e = (
            e.0.saturating_add(c.peak_live_bytes),
            e.1.max(c.peak_live_bytes),
        );
    }
    let process = r.totals.peak_live_bytes;
    sums.into_iter()
        .map(|(k, (sum, most))| (k, std::cell::Cell::new(Some(sum.min(process).max(most)))))
        .collect()
}

pinguard_common::with_callsite_counters!(site_struct {
    #[derive(Clone, Debug, Default, Serialize)]
    pub struct Site {
        #[serde(skip)]
        pub key: SiteKey,
        pub frames: Vec<Frame>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub py_frames: Vec<Frame>,
        /// Its name (`short_label`), in `report --json` only: the innermost frame and the callers
        /// that tell it from the other callsites.
        #[serde(skip_serializing_if = "String::is_empty")]
        pub label: String,
        /// How much of its stack names it among the merged callsites (`labels`), set by `sort`.
        #[serde(skip)]
        pub name: Name,
        pub apis: BTreeSet<String>,
        pub live_bytes: u64,
        pub live_count: u64,
        /// The most this callsite held in one process: the highest of its processes' peaks there
        /// (`site_peaks`). Never above the merged peak, which is at least every process's own; a
        /// sum over processes would be, for processes not alive together (issue 46, item 6).
        pub peak_live_bytes: u64,
        /// The sum of each process's peak at this callsite: what an export's `peak` weight adds
        /// up (a sample per process), never a figure of one moment.
        pub peak_sum_bytes: u64,
        pub alloc_count: u64,
        pub alloc_bytes: u64,
    } {} {
        pub processes: usize,
        /// Of those, the processes that still held live bytes here at their last reading.
        pub live_processes: usize,
        #[serde(skip)]
        seen: BTreeSet<u32>,
        #[serde(skip)]
        holding: BTreeSet<u32>,
        /// Whether any figures were added (the bytes of none are known: none).
        #[serde(skip)]
        figured: bool,
    }
});

/// A `Site` with one report's figures of a callsite, `$c` (a view of it): the callsite counters
/// (`with_callsite_counters!`) by their names, the rest as given, no stack.
macro_rules! site_of {
    (
        { $c:expr, $($field:ident: $value:expr),* $(,)? }
        counts { $( $(#[$ca:meta])* $n:ident, )* }
        bytes { $( $(#[$ba:meta])* $b:ident, )* }
    ) => {
        Site {
            $($field: $value,)*
            $($n: $c.$n,)*
            $($b: $c.$b,)*
            ..Site::default()
        }
    };
}

impl Site {
    /// Adds `f`'s figures (one report's, or another partial merge's line): its peak is the
    /// highest, everything else sums.
    fn add_figures(&mut self, f: &Site) {
        self.live_bytes += f.live_bytes;
        self.live_count += f.live_count;
        self.peak_live_bytes = self.peak_live_bytes.max(f.peak_live_bytes);
        self.peak_sum_bytes += f.peak_sum_bytes;
        self.alloc_count += f.alloc_count;
        self.alloc_bytes += f.alloc_bytes;
        let first = !std::mem::replace(&mut self.figured, true);
        pinguard_common::with_callsite_counters!(add_site_counters { self, f, first, false });
    }
}

/// The host reserve across the merged reports: the largest reserve any process applied, and the
/// lowest available memory any of them read.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct HostLine {
    pub reserve_bytes: u64,
    pub lowest_available_bytes: u64,
}

impl HostLine {
    fn fold(a: Option<HostLine>, b: Option<HostLine>) -> Option<HostLine> {
        match (a, b) {
            (Some(a), Some(b)) => Some(HostLine {
                reserve_bytes: a.reserve_bytes.max(b.reserve_bytes),
                lowest_available_bytes: a.lowest_available_bytes.min(b.lowest_available_bytes),
            }),
            (a, b) => a.or(b),
        }
    }
}

/// The cgroup reserve over the merged reports: the largest reserve, the lowest headroom read.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CgroupLine {
    pub reserve_bytes: u64,
    pub lowest_headroom_bytes: u64,
}

impl CgroupLine {
    fn fold(a: Option<CgroupLine>, b: Option<CgroupLine>) -> Option<CgroupLine> {
        match (a, b) {
            (Some(a), Some(b)) => Some(CgroupLine {
                reserve_bytes: a.reserve_bytes.max(b.reserve_bytes),
                lowest_headroom_bytes: a.lowest_headroom_bytes.min(b.lowest_headroom_bytes),
            }),
            (a, b) => a.or(b),
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub struct ProcessLine {
    pub path: String,
    pub pid: u32,
    pub hostname: String,
    pub exe: String,
    pub reason: String,
    pub budget_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostLine>,
    pub totals: Totals,
    pub start_unix_ms: u64,
    pub write_unix_ms: u64,
    /// `[unix_ms, live_bytes]`, oldest first (empty: the report has none).
    #[serde(skip)]
    pub timeline: Vec<(u64, u64)>,
    /// Its own figures per callsite, kept only for `check` (`Merged::keep_sites`): which file,
    /// process and callsite a failure comes from, and what a suppression takes from it.
    #[serde(skip)]
    pub sites: Vec<ProcSite>,
    /// Its latest refused and failed calls that say why (`view::WHY_TAIL` at most), and how many
    /// it has.
    #[serde(skip)]
    pub whys: Vec<WhyLine>,
    #[serde(skip)]
    pub why_count: u64,
}

/// A refused, downgraded or failed call and why, as `report` shows it.
#[derive(Clone, Debug)]
pub struct WhyLine {
    pub unix_ms: u64,
    pub kind: pinguard_common::EventKind,
    pub api: String,
    pub size: u64,
    pub why: pinguard_common::Why,
    /// Its callsite (`None`: not among the report's).
    pub site: Option<SiteKey>,
    /// The calls after it that failed the same way.
    pub repeats: u64,
}

/// One callsite's figures in one process's report (a line's peak as `site_peaks` takes it).
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcSite {
    pub key: SiteKey,
    pub live: u64,
    pub peak: u64,
    pub denied: u64,
    pub downgraded: u64,
    pub over_budget: u64,
}

/// The highest pinned bytes that processes alive at the same time held together, on one host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeakOverTime {
    pub bytes: u64,
    pub host: String,
    /// How many processes that peak was taken from, and how many of them had no timeline (each
    /// counted at its peak for the whole of its life).
    pub processes: usize,
    pub without_timeline: usize,
}

impl PeakOverTime {
    /// How it was found, for a message: `from the timelines of 3 processes on h`.
    pub fn basis(&self) -> String {
        let n = crate::out::count(self.processes as u64, "process", "processes");
        match self.without_timeline {
            0 => format!("from the timelines of {n} on {}", self.host),
            k if k == self.processes => format!("from the lifetimes and peaks of {n} on {} (no timelines)", self.host),
            k => format!("from the timelines of {n} on {} ({k} without one counted at their peak for their whole life)", self.host),
        }
    }
}

/// Timeline points kept per process for the peak over time: a merge of a thousand processes with
/// full timelines (10,000 points each) keeps 8 MiB of them, not 160.
const MAX_POINTS: usize = 512;

/// At most `MAX_POINTS` steps, each the highest value of the points it stands for, from the first
/// one's time: a step function never below the original, so a peak over time taken from it is
/// never less than the true one (and exact for timelines this short already).
fn reduce(t: &[(u64, u64)]) -> Vec<(u64, u64)> {
    if t.len() <= MAX_POINTS {
        return t.to_vec();
    }
    t.chunks(t.len().div_ceil(MAX_POINTS))
        .map(|c| (c[0].0, c.iter().map(|p| p.1).max().unwrap_or(0)))
        .collect()
}

/// A process's pinned bytes as steps `(unix_ms, change)`: its timeline, or its peak for the
/// whole of its life without one; nothing after its last reading.
fn steps(p: &ProcessLine, out: &mut Vec<(u64, i128)>) {
    let points: Vec<(u64, u64)> = if p.timeline.is_empty() {
        vec![(p.start_unix_ms, p.totals.peak_live_bytes)]
    } else {
        p.timeline.clone()
    };
    let (mut prev, mut last) = (0u64, 0);
    // Points at one millisecond (a tick's extremes, issue 46 item 7) are one step at their
    // highest: changes at one millisecond count as simultaneous across processes, and a step at
    // the highest is never below the truth.
    for (t, v) in at_most_one_per_ms(&points) {
        out.push((t, v as i128 - prev as i128));
        prev = v;
        last = t;
    }
    out.push((p.write_unix_ms.max(last) + 1, -(prev as i128)));
}

/// A timeline with the points of each millisecond folded into one, at their highest.
fn at_most_one_per_ms(points: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(points.len());
    for &(t, v) in points {
        match out.last_mut() {
            Some(b) if b.0 == t => b.1 = b.1.max(v),
            _ => out.push((t, v)),
        }
    }
    out
}

/// A setting one process could not use, with the fallback it ran on (the library's message).
#[derive(Clone, Serialize, PartialEq)]
pub struct ConfigError {
    pub pid: u32,
    pub hostname: String,
    pub exe: String,
    pub message: String,
}

impl ConfigError {
    pub fn line(&self) -> String {
        format!(
            "pid {} ({}): {}",
            self.pid,
            basename(&self.exe),
            self.message
        )
    }
}

#[derive(Default, Serialize)]
pub struct Merged {
    pub reports: usize,
    pub processes: usize,
    pub totals: Totals,
    /// Present when any report had a host reserve in force.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostLine>,
    /// Present when any report had a cgroup reserve in force.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupLine>,
    pub callsites: Vec<Site>,
    /// The callsites the processes folded (`PINGUARD_MAX_CALLSITES`), summed.
    #[serde(skip_serializing_if = "pinguard_common::Folded::is_empty")]
    pub callsites_folded: pinguard_common::Folded,
    pub per_process: Vec<ProcessLine>,
    /// Settings a process could not use: shown first, and `check` fails on them.
    pub config_errors: Vec<ConfigError>,
    /// The records of the runs (`pinguard run`) the inputs hold: a run in which nothing was
    /// pinned has only its record.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<crate::record::RunRecord>,
    /// Keep each process's own callsite figures (`ProcessLine::sites`): `check` only.
    #[serde(skip)]
    pub keep_sites: bool,
    #[serde(skip)]
    index: HashMap<SiteKey, usize>,
    #[serde(skip)]
    process_ids: HashMap<(String, u32, u64), u32>,
}

impl Merged {
    fn process_no(&mut self, host: &str, pid: u32, start: u64) -> u32 {
        let n = self.process_ids.len() as u32;
        let no = *self
            .process_ids
            .entry((host.to_string(), pid, start))
            .or_insert(n);
        self.processes = self.process_ids.len();
        no
    }

    fn site(
        &mut self,
        key: SiteKey,
        frames: impl FnOnce() -> (Vec<Frame>, Vec<Frame>),
    ) -> &mut Site {
        let i = match self.index.get(&key) {
            Some(&i) => i,
            None => {
                let (frames, py_frames) = frames();
                self.callsites.push(Site {
                    key,
                    frames,
                    py_frames,
                    ..Site::default()
                });
                self.index.insert(key, self.callsites.len() - 1);
                self.callsites.len() - 1
            }
        };
        &mut self.callsites[i]
    }

    /// The settings that could not be used, as the lines `report`, `run` and `check` show first.
    pub fn config_error_lines(&self) -> Vec<String> {
        self.config_errors.iter().map(ConfigError::line).collect()
    }

    pub fn add(&mut self, path: &std::path::Path, r: &ReportView<'_>) {
        self.reports += 1;
        let proc_no = self.process_no(&r.process.hostname, r.process.pid, r.process.start_unix_ms);
        self.totals.add(&r.totals);
        self.callsites_folded.add(&r.callsites_folded);
        let host = r.host.as_ref().map(|h| HostLine {
            reserve_bytes: h.reserve_bytes,
            lowest_available_bytes: h.lowest_available_bytes,
        });
        self.host = HostLine::fold(self.host, host);
        let cgroup = r.cgroup.as_ref().map(|c| CgroupLine {
            reserve_bytes: c.reserve_bytes,
            lowest_headroom_bytes: c.lowest_headroom_bytes,
        });
        self.cgroup = CgroupLine::fold(self.cgroup, cgroup);
        for message in &r.config.errors {
            let e = ConfigError {
                pid: r.process.pid,
                hostname: r.process.hostname.to_string(),
                exe: r.process.exe.to_string(),
                message: message.clone(),
            };
            // A process's interval snapshots and its exit report say the same thing once each.
            if !self.config_errors.contains(&e) {
                self.config_errors.push(e);
            }
        }
        self.per_process.push(ProcessLine {
            path: path.display().to_string(),
            pid: r.process.pid,
            hostname: r.process.hostname.to_string(),
            exe: r.process.exe.to_string(),
            reason: r.reason.name().to_string(),
            budget_bytes: r.config.budget_bytes,
            host,
            totals: r.totals.clone(),
            start_unix_ms: r.process.start_unix_ms,
            write_unix_ms: r.process.write_unix_ms,
            timeline: reduce(&r.timeline),
            sites: Vec::new(),
            whys: Vec::new(),
            why_count: r.events.count,
        });
        let keys: Vec<SiteKey> = r
            .callsites
            .iter()
            .map(|c| site_key(&c.frames, &c.py_frames))
            .collect();
        if let Some(p) = self.per_process.last_mut() {
            p.whys = why_lines(r, &keys);
        }
        let peaks = site_peaks(r, &keys);
        if self.keep_sites {
            self.keep_process_sites(r, &keys, &peaks);
        }
        for (c, &key) in r.callsites.iter().zip(&keys) {
            let s = self.site(key, || {
                (
                    c.frames.iter().map(FrameView::to_frame).collect(),
                    c.py_frames.iter().map(FrameView::to_frame).collect(),
                )
            });
            for a in &c.apis {
                if !s.apis.contains(a.as_ref()) {
                    s.apis.insert(a.to_string());
                }
            }
            // The line's peak for this process, counted once (with its first stack).
            let peak = peaks.get(&key).and_then(|p| p.take()).unwrap_or(0);
            s.add_figures(&pinguard_common::with_callsite_counters!(site_of {
                c,
                live_bytes: c.live_bytes,
                live_count: c.live_count,
                peak_live_bytes: peak,
                peak_sum_bytes: peak,
                alloc_count: c.alloc_count,
                alloc_bytes: c.alloc_bytes,
            }));
            s.seen.insert(proc_no);
            s.processes = s.seen.len();
            if c.live_bytes > 0 {
                s.holding.insert(proc_no);
            }
            s.live_processes = s.holding.len();
        }
    }

    /// This process's figures per line (`ProcessLine::sites`), for `check`.
    fn keep_process_sites(
        &mut self,
        r: &ReportView<'_>,
        keys: &[SiteKey],
        peaks: &HashMap<SiteKey, std::cell::Cell<Option<u64>>>,
    ) {
        let mut by_key: HashMap<SiteKey, ProcSite> = HashMap::new();
        for (c, &key) in r.callsites.iter().zip(keys) {
            let e = by_key.entry(key).or_insert(ProcSite {
                key,
                peak: peaks.get(&key).and_then(|p| p.get()).unwrap_or(0),
                ..ProcSite::default()
            });
            e.live += c.live_bytes;
            e.denied += c.denied_count;
            e.downgraded += c.downgraded_count;
            e.over_budget += c.over_budget_count;
        }
        if let Some(p) = self.per_process.last_mut() {
            p.sites = by_key.into_values().collect();
        }
    }

    /// Folds another partial merge (another thread's share of the files) into this one.
    pub fn absorb(&mut self, other: Merged) {
        self.reports += other.reports;
        self.totals.add(&other.totals);
        self.host = HostLine::fold(self.host, other.host);
        self.cgroup = CgroupLine::fold(self.cgroup, other.cgroup);
        let mut remap = vec![0u32; other.process_ids.len()];
        for ((host, pid, start), no) in &other.process_ids {
            remap[*no as usize] = self.process_no(host, *pid, *start);
        }
        self.per_process.extend(other.per_process);
        self.runs.extend(other.runs);
        // Another thread's share has settings and folded callsites of its own processes too.
        self.callsites_folded.add(&other.callsites_folded);
        for e in other.config_errors {
            if !self.config_errors.contains(&e) {
                self.config_errors.push(e);
            }
        }
        for o in other.callsites {
            let s = self.site(o.key, || (o.frames.clone(), o.py_frames.clone()));
            s.add_figures(&o);
            s.apis.extend(o.apis);
            s.seen.extend(o.seen.iter().map(|n| remap[*n as usize]));
            s.processes = s.seen.len();
            s.holding
                .extend(o.holding.iter().map(|n| remap[*n as usize]));
            s.live_processes = s.holding.len();
        }
    }

    /// Each process once (its latest reading), by report path.
    pub fn latest_processes(&self) -> Vec<&ProcessLine> {
        let mut v: Vec<&ProcessLine> = self.latest_by_host().into_values().flatten().collect();
        v.sort_by(|a, b| a.path.cmp(&b.path));
        v
    }

    /// Each process once (its latest reading), by host.
    fn latest_by_host(&self) -> std::collections::BTreeMap<&str, Vec<&ProcessLine>> {
        let mut latest: HashMap<(&str, u32, u64), &ProcessLine> = HashMap::new();
        for p in &self.per_process {
            let e = latest
                .entry((p.hostname.as_str(), p.pid, p.start_unix_ms))
                .or_insert(p);
            if p.write_unix_ms > e.write_unix_ms {
                *e = p;
            }
        }
        let mut by_host: std::collections::BTreeMap<&str, Vec<&ProcessLine>> = Default::default();
        for ((host, _, _), p) in latest {
            by_host.entry(host).or_default().push(p);
        }
        by_host
    }

    /// The peak of processes alive at the same time, per host, the highest: from their timelines
    /// (a process's own peak, which its timeline of one point per millisecond can miss, is never
    /// less than the answer).
    pub fn peak_over_time(&self) -> PeakOverTime {
        let mut best = PeakOverTime::default();
        for (host, procs) in self.latest_by_host() {
            let mut changes = Vec::new();
            for p in &procs {
                steps(p, &mut changes);
            }
            changes.sort_by_key(|c| c.0);
            let (mut live, mut high) = (0i128, 0i128);
            for (i, (t, d)) in changes.iter().enumerate() {
                live += d;
                // Changes at one millisecond are simultaneous, as far as the timelines tell.
                if changes.get(i + 1).is_none_or(|n| n.0 != *t) {
                    high = high.max(live);
                }
            }
            let single = procs
                .iter()
                .map(|p| p.totals.peak_live_bytes)
                .max()
                .unwrap_or(0);
            let bytes = (high.max(0) as u64).max(single);
            if bytes > best.bytes || best.host.is_empty() {
                let without_timeline = procs.iter().filter(|p| p.timeline.is_empty()).count();
                best = PeakOverTime {
                    bytes,
                    host: host.to_string(),
                    processes: procs.len(),
                    without_timeline,
                };
            }
        }
        best
    }

    /// Sorted (`sort`), with the merged peak taken over time: processes that were not alive at
    /// the same time do not add up.
    pub fn finish(&mut self) {
        self.sort();
        if self.processes > 1 {
            self.totals.peak_live_bytes = self.peak_over_time().bytes;
        }
    }

    /// Callsites by live bytes, then peak, then allocations, each named (`labels`); processes by
    /// report path.
    pub fn sort(&mut self) {
        let mut names = labels(&self.callsites);
        for c in &mut self.callsites {
            c.name = names.remove(&c.key).unwrap_or_default();
        }
        self.callsites.sort_by(|a, b| {
            (b.live_bytes, b.peak_live_bytes, b.alloc_count, a.key).cmp(&(
                a.live_bytes,
                a.peak_live_bytes,
                a.alloc_count,
                b.key,
            ))
        });
        self.per_process.sort_by(|a, b| a.path.cmp(&b.path));
        self.runs.sort_by_key(|r| (r.start_unix_ms, r.pid));
        self.index.clear();
    }
}

/// A report's latest events with a `why`, each with its callsite's key.
fn why_lines(r: &ReportView<'_>, keys: &[SiteKey]) -> Vec<WhyLine> {
    r.events
        .latest
        .iter()
        .map(|e| WhyLine {
            unix_ms: e.unix_ms,
            kind: e.kind,
            api: e.api.clone(),
            size: e.size,
            why: e.why.clone(),
            repeats: e.repeats,
            site: r
                .callsites
                .iter()
                .position(|c| c.id == e.callsite)
                .and_then(|i| keys.get(i).copied()),
        })
        .collect()
}

/// Reads all inputs into one merged, sorted view, parsing on every core.
pub fn merge_inputs(inputs: &[std::path::PathBuf], keep_going: bool) -> Result<Merged, ()> {
    merge_inputs_with(inputs, keep_going, |_, _, _| Ok(())).map(|(m, _)| m)
}

/// `merge_inputs`, also handing each report (its path, bytes and parsed view) to `each`, for
/// readers that need more of it than the merge keeps (`export`: events, modules, timelines).
pub fn merge_inputs_with<T: Send>(
    inputs: &[std::path::PathBuf],
    keep_going: bool,
    each: impl Fn(&std::path::Path, &[u8], &ReportView<'_>) -> Result<T, String> + Sync,
) -> Result<(Merged, Vec<T>), ()> {
    merge_parts(inputs, keep_going, false, each)
}

/// `merge_inputs`, keeping each process's own callsite figures (`ProcessLine::sites`).
pub fn merge_for_check(inputs: &[std::path::PathBuf], keep_going: bool) -> Result<Merged, ()> {
    merge_parts(inputs, keep_going, true, |_, _, _| Ok(())).map(|(m, _)| m)
}

fn merge_parts<T: Send>(
    inputs: &[std::path::PathBuf],
    keep_going: bool,
    keep_sites: bool,
    each: impl Fn(&std::path::Path, &[u8], &ReportView<'_>) -> Result<T, String> + Sync,
) -> Result<(Merged, Vec<T>), ()> {
    let parts = crate::input::parallel(
        inputs,
        keep_going,
        || {
            let m = Merged {
                keep_sites,
                ..Merged::default()
            };
            (m, Vec::new())
        },
        |(m, extra), path, bytes| {
            if crate::record::is_record(bytes) {
                m.runs.push(crate::record::parse(bytes)?);
                return Ok(());
            }
            let view = ReportView::parse(bytes).map_err(|e| e.0)?;
            extra.push(each(path, bytes, &view)?);
            m.add(path, &view);
            Ok(())
        },
    )?;
    let mut it = parts.into_iter();
    let (mut m, mut extras) = it.next().unwrap_or_default();
    for (p, e) in it {
        m.absorb(p);
        extras.extend(e);
    }
    m.finish();
    Ok((m, extras))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduced_timelines_never_fall_below_the_original() {
        let t: Vec<(u64, u64)> = (0..10_000u64).map(|i| (i, (i * 7919) % 1000)).collect();
        let r = reduce(&t);
        assert!(r.len() <= MAX_POINTS);
        // At every original point, the reduced step in force is at least its value.
        for &(at, v) in &t {
            let step = r.iter().rev().find(|p| p.0 <= at).unwrap();
            assert!(step.1 >= v, "{at}: {} < {v}", step.1);
        }
        assert_eq!(reduce(&t[..100]), t[..100].to_vec());
    }

    /// A callsite whose Python stack is these (function, line) frames of serve.py, innermost first.
    fn py_site(frames: &[(&str, u32)]) -> Site {
        let py: Vec<FrameView> = frames
            .iter()
            .map(|&(f, l)| FrameView {
                addr: pinguard_common::Addr(0),
                module: None,
                offset: None,
                symbol: Some(f.into()),
                file: Some("/srv/serve.py".into()),
                line: Some(l),
            })
            .collect();
        Site {
            key: site_key(&[], &py),
            py_frames: py.iter().map(FrameView::to_frame).collect(),
            ..Site::default()
        }
    }

    #[test]
    fn callsites_are_named_by_the_frames_that_tell_them_apart() {
        let pin = ("cuda_pin", 7);
        let sites = [
            py_site(&[pin, ("load_weights", 12), ("main", 40)]),
            py_site(&[pin, ("fill_cache", 20), ("main", 41)]),
            // Apart only four callers out: the callers between are left out.
            py_site(&[
                pin,
                ("pin_many", 30),
                ("batch", 33),
                ("epoch", 50),
                ("train", 60),
                ("main", 42),
            ]),
            py_site(&[
                pin,
                ("pin_many", 30),
                ("batch", 33),
                ("epoch", 50),
                ("evaluate", 70),
                ("main", 43),
            ]),
            // Its own innermost frame: that alone.
            py_site(&[("lock_key", 90), ("main", 44)]),
            // The same stack as the first, another run's copy: named once, the same.
            py_site(&[pin, ("load_weights", 12), ("main", 40)]),
        ];
        let names = labels(&sites);
        let name = |i: usize| {
            name_of(
                &sites[i],
                names.get(&sites[i].key).copied().unwrap_or_default(),
            )
        };
        assert_eq!(
            name(0),
            "cuda_pin (serve.py:7) <- load_weights (serve.py:12)"
        );
        assert_eq!(name(1), "cuda_pin (serve.py:7) <- fill_cache (serve.py:20)");
        assert_eq!(
            name(2),
            "cuda_pin (serve.py:7) <- ... <- epoch (serve.py:50) <- train (serve.py:60)"
        );
        assert_eq!(
            name(3),
            "cuda_pin (serve.py:7) <- ... <- epoch (serve.py:50) <- evaluate (serve.py:70)"
        );
        assert_eq!(name(4), "lock_key (serve.py:90)");
        assert_eq!(name(5), name(0));
        // One stack a prefix of another (a recursion cut at PINGUARD_PY_DEPTH): the shorter is
        // named whole, the longer up to the frame the shorter lacks.
        let cut = [
            py_site(&[pin, ("recurse", 3), ("recurse", 3)]),
            py_site(&[pin, ("recurse", 3)]),
        ];
        let names = labels(&cut);
        assert_eq!(
            name_of(&cut[0], names[&cut[0].key]),
            "cuda_pin (serve.py:7) <- recurse (serve.py:3) <- recurse (serve.py:3)"
        );
        assert_eq!(
            name_of(&cut[1], names[&cut[1].key]),
            "cuda_pin (serve.py:7) <- recurse (serve.py:3)"
        );
    }

    #[test]
    fn a_shortened_name_another_callsite_also_gets_is_written_out_whole() {
        let pin = ("cuda_pin", 7);
        // Apart at their second frame from their sibling with the other second frame, and at their
        // fifth from the one with the same: shortened, the names would be the same two twice.
        let sites = [
            py_site(&[pin, ("a", 1), ("q", 2), ("x", 3), ("y", 4)]),
            py_site(&[pin, ("b", 1), ("q", 2), ("x", 3), ("y", 4)]),
            py_site(&[pin, ("a", 1), ("q", 2), ("x", 3), ("z", 4)]),
            py_site(&[pin, ("b", 1), ("q", 2), ("x", 3), ("z", 4)]),
        ];
        let names = labels(&sites);
        let all: BTreeSet<String> = sites.iter().map(|s| name_of(s, names[&s.key])).collect();
        assert_eq!(all.len(), 4, "{all:?}");
        assert_eq!(name_of(&sites[1], names[&sites[1].key]), "cuda_pin (serve.py:7) <- b (serve.py:1) <- q (serve.py:2) <- x (serve.py:3) <- y (serve.py:4)");
    }

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(
            demangle("_ZN2at6native10pin_memoryERKNS_6TensorE"),
            "at::native::pin_memory(at::Tensor const&)"
        );
        assert_eq!(demangle("main"), "main");
    }
}
