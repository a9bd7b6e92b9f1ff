//! Snapshots of the ledger as `pinguard.report.v1` JSON, written atomically.

use crate::accounting::{callsite, ledger};
use crate::api::Family;
use crate::budget;
use crate::output::files;
use crate::output::symbolize::Symbolizer;
use crate::runtime::config::Config;
use crate::runtime::guard::Thread;
use crate::runtime::kernel::Status;
use crate::runtime::lock::{Mutex, MutexGuard};
use crate::runtime::{guard, heap, kernel, log};
use pinguard_common::units::format_bytes;
use pinguard_common::{self as schema, Addr, Reason, Report};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// One writer at a time: symbolisation is not thread-safe, and a fork must not split a write.
static WRITING: Mutex<()> = Mutex::new(());
/// Set (under `WRITING`) once the exit report is decided: no later snapshot may replace it.
static EXITING: AtomicBool = AtomicBool::new(false);

pub fn lock() -> MutexGuard<'static, ()> {
    WRITING.lock()
}

/// Set while a fork waits for the report lock: writers step aside, or a thread writing reports
/// in a loop could starve the fork for as long as it likes (the lock is not fair).
static FORK_WAITING: AtomicBool = AtomicBool::new(false);

pub fn hold() {
    FORK_WAITING.store(true, Ordering::SeqCst);
    crate::runtime::lock::hold(&WRITING);
}

/// A fork that could not hold every lock without waiting (`lock::try_holding`) gave up: writers
/// need not step aside for it.
pub fn hold_abandoned() {
    FORK_WAITING.store(false, Ordering::SeqCst);
}

/// # Safety
/// Only in the fork handlers, after `hold`.
pub unsafe fn let_go(child: bool) {
    FORK_WAITING.store(false, Ordering::SeqCst);
    if child {
        // SAFETY: after `hold`, in the child's handler (this function's contract).
        unsafe { crate::runtime::lock::let_go_in_child(&WRITING) }
    } else {
        // SAFETY: after `hold`, in the parent's handler (this function's contract).
        unsafe { crate::runtime::lock::let_go_in_parent(&WRITING) }
    }
}

fn process(now: u64) -> schema::Process {
    schema::Process {
        // Raw system calls: an interposer's wrappers of getpid/getppid see only the program's calls.
        pid: kernel::raw_pid() as u32,
        // SAFETY: getppid has no arguments and cannot fail.
        ppid: unsafe { libc::syscall(libc::SYS_getppid) } as u32,
        exe: kernel::exe(),
        cmdline: kernel::cmdline(),
        hostname: kernel::hostname(),
        start_unix_ms: crate::runtime::clock::start_ms(),
        write_unix_ms: now,
        signal: None,
    }
}

fn config(cfg: &Config) -> schema::Config {
    schema::Config {
        budget_bytes: budget::limit(),
        policy: cfg.policy.name().to_string(),
        depth: cfg.depth,
        py_depth: cfg.py_depth,
        hooks: Family::ALL
            .iter()
            .filter(|f| cfg.hooks & f.bit() != 0)
            .map(|f| f.name().to_string())
            .collect(),
        errors: cfg
            .errors
            .iter()
            .cloned()
            .chain(budget::host::problem().map(str::to_string))
            .chain(budget::cgroup::floor().problem().map(str::to_string))
            .collect(),
        report_template: files::template().0,
        interval_ms: cfg.interval_ms,
        signal: cfg.signal,
        downgrade_match: cfg.downgrade_match.as_ref().map(|_| patterns(cfg)),
        host_reserve_bytes: budget::host::reserve(),
        cgroup_reserve_bytes: budget::cgroup::floor().reserve(),
    }
}

/// `PINGUARD_DOWNGRADE_MATCH`'s patterns as given.
fn patterns(cfg: &Config) -> Vec<String> {
    cfg.downgrade_match
        .iter()
        .flatten()
        .map(|p| p.as_str().to_string())
        .collect()
}

/// What the state file says about the process, written when it is made.
pub fn state_info(cfg: &Config) -> Vec<u8> {
    let info = pinguard_common::state::Info {
        pinguard_version: env!("CARGO_PKG_VERSION").to_string(),
        process: process(crate::runtime::clock::unix_ms()),
        config: config(cfg),
        apis: crate::api::Api::ALL
            .iter()
            .map(|a| a.name().to_string())
            .collect(),
    };
    serde_json::to_vec(&info).unwrap_or_default()
}

/// What a report is made of, read from the process: plain data (frames already named), which
/// `shape` turns into the report without reading anything else, so that the report's rules
/// (which callsites appear, in what order, a record's age) are tested without a preloaded
/// process.
pub struct Figures {
    pub now: u64,
    pub process: schema::Process,
    pub config: schema::Config,
    pub totals: schema::Totals,
    pub apis: Vec<(String, schema::ApiStats)>,
    pub kernel: schema::Kernel,
    pub group: Option<schema::Group>,
    pub host: Option<schema::Host>,
    pub cgroup: Option<schema::Cgroup>,
    pub modules: Vec<schema::Module>,
    /// Every callsite, active or not.
    pub callsites: Vec<schema::Callsite>,
    /// The callsites folded so far, and the most the report lists apart (`PINGUARD_MAX_CALLSITES`).
    pub folded: schema::Folded,
    pub max_callsites: usize,
    /// (address, record, the record's start in unix ms).
    pub live: Vec<(u64, LiveFigures)>,
    pub events: Vec<schema::Event>,
    pub events_dropped: u64,
    pub timeline: Vec<(u64, u64)>,
    /// Each entry point's points (`timeline_apis`).
    pub timeline_apis: BTreeMap<String, Vec<(u64, u64)>>,
    pub timeline_dropped: u64,
}

/// One live record, as `Figures` holds it.
pub struct LiveFigures {
    pub size: u64,
    pub api: String,
    pub callsite: u32,
    pub tid: u32,
    pub unix_ms: u64,
    pub downgraded: bool,
}

/// The report of `f`: callsites that pinned, were refused or were downgraded, largest live
/// first (then highest peak, then oldest id), those with nothing live beyond `max_callsites`
/// folded with the rest (`schema::cap_callsites`); live records by address, with their age.
pub fn shape(reason: Reason, f: Figures) -> Report {
    let callsites: Vec<schema::Callsite> = f
        .callsites
        .into_iter()
        .filter(|c| {
            c.alloc_count > 0
                || c.denied_count > 0
                || c.downgraded_count > 0
                || c.over_budget_count > 0
        })
        .collect();
    let mut callsites_folded = f.folded;
    let callsites = schema::cap_callsites(callsites, f.max_callsites, &mut callsites_folded);
    let mut live: Vec<schema::Live> = f
        .live
        .into_iter()
        .map(|(addr, l)| schema::Live {
            addr: Addr(addr),
            size: l.size,
            api: l.api.into(),
            callsite: l.callsite,
            tid: l.tid,
            age_ms: f.now.saturating_sub(l.unix_ms),
            downgraded: l.downgraded,
        })
        .collect();
    live.sort_by_key(|l| l.addr);
    Report {
        schema: schema::SCHEMA.to_string(),
        reason,
        pinguard_version: env!("CARGO_PKG_VERSION").to_string(),
        process: f.process,
        config: f.config,
        totals: f.totals,
        apis: f.apis.into_iter().collect(),
        kernel: f.kernel,
        group: f.group,
        host: f.host,
        cgroup: f.cgroup,
        modules: f.modules,
        callsites,
        callsites_folded,
        live,
        events: f.events,
        events_dropped: f.events_dropped,
        timeline: f.timeline,
        timeline_apis: f.timeline_apis,
        timeline_dropped: f.timeline_dropped,
    }
}

/// How the figures are matched with the kernel's before they are read: the composition layer's
/// `track::kernel_truth`, handed over at start-up (`on_kernel_truth`), which moves the budget with
/// the view. The output stage never moves the budget itself; before the hand-over the status is
/// only read.
static KERNEL_TRUTH: OnceLock<fn(&Thread, bool) -> Status> = OnceLock::new();

/// Sets how the figures are matched with the kernel's (`KERNEL_TRUTH`), once, at start-up.
pub fn on_kernel_truth(f: fn(&Thread, bool) -> Status) {
    let _ = KERNEL_TRUTH.set(f);
}

/// The kernel's status, the view and the budget matched with it first (`KERNEL_TRUTH`; with
/// `locked`, the locked pages' too).
pub fn kernel_truth(t: &Thread, locked: bool) -> Status {
    match KERNEL_TRUTH.get() {
        Some(f) => f(t, locked),
        None => kernel::status(),
    }
}

pub fn snapshot(reason: Reason, cfg: &Config) -> Report {
    shape(reason, gather(cfg))
}

/// Reads the figures from the ledger, the callsite table, the kernel and the group, and names
/// the callsites' frames.
fn gather(cfg: &Config) -> Figures {
    let now = crate::runtime::clock::unix_ms();
    // The kernel is the truth for locked and pinned pages: the view is matched with VmLck (glibc's
    // own unmaps, a grown locked stack) and the unseen pins with VmPin (an io_uring ring's fixed
    // buffers), from one read of the status, before symbolizing moves it.
    let locked = cfg.hooks & Family::Mlock.bit() != 0;
    let status = kernel_truth(guard::here(), locked);
    ledger::timeline_now();
    let mut totals = ledger::totals();
    let apis: Vec<(String, schema::ApiStats)> = ledger::apis()
        .into_iter()
        .map(|(a, s)| (a.name().to_string(), s))
        .collect();
    let mut sym = Symbolizer::new();
    // Short of memory, a report that could not be finished would end the program: it leaves out
    // what needs room (the lists), or only the frames' names (the costly part), saying so. The
    // lists are bounded by about the callsite cap.
    let partial = heap::short() || !heap::room(room_for(callsite::max()));
    let mut names = !partial && heap::room(NAMING_ROOM);
    let (named, folded) = if partial {
        (Vec::new(), schema::Folded::default())
    } else {
        listed()
    };
    if names {
        // All at once, so that each module's files are read once and then let go.
        sym.name_all(named.iter().flat_map(|c| c.native().iter().copied()));
    }
    let mut closed_modules: Vec<schema::Module> = Vec::new();
    let callsites: Vec<schema::Callsite> = named
        .into_iter()
        .map(|c| {
            names = names && !heap::short();
            let frames = native_frames(c, names, &mut sym, &mut closed_modules);
            schema::Callsite {
                frames,
                py_frames: py_frames(c),
                ..figures(c)
            }
        })
        .collect();
    let live = if partial { Vec::new() } else { live_figures() };
    let (events, events_dropped) = if partial {
        (Vec::new(), 0)
    } else {
        report_events(cfg)
    };
    let (points, timeline_dropped) = if partial {
        (Vec::new(), 0)
    } else {
        ledger::timeline()
    };
    let (timeline, timeline_apis) = timelines(&points, &apis, &totals);
    totals.out_of_memory_count = heap::failures();
    totals.kernel_pinned_bytes = ledger::kernel_pinned();
    let mut config = config(cfg);
    config
        .errors
        .extend(memory_errors(partial, names, totals.out_of_memory_count));
    Figures {
        now,
        process: process(now),
        config,
        totals,
        apis,
        kernel: schema::Kernel {
            vm_lck_bytes: status.vm_lck,
            vm_pin_bytes: status.vm_pin,
            rlimit_memlock_bytes: kernel::rlimit_memlock(),
            smaps_walk_count: kernel::smaps_walks(),
        },
        group: group_figures(),
        host: host(),
        cgroup: cgroup(),
        modules: merged_modules(sym.modules(), closed_modules),
        callsites,
        folded,
        max_callsites: callsite::max(),
        live,
        events,
        events_dropped,
        timeline,
        timeline_apis,
        timeline_dropped,
    }
}

/// A callsite's native frames, named (`names`), or as their closed module left them, or as
/// addresses and modules; the modules of closed objects it went through join `closed_modules`.
fn native_frames(
    c: &callsite::Callsite,
    names: bool,
    sym: &mut Symbolizer,
    closed_modules: &mut Vec<schema::Module>,
) -> Vec<schema::Frame> {
    let mut frames = Vec::new();
    let closed = c.closed.lock();
    for &a in c.native() {
        match closed
            .iter()
            .flat_map(|cl| &cl.frames)
            .find(|(ca, _)| *ca == a)
        {
            Some((_, named)) => frames.extend_from_slice(named),
            None if names => frames.extend_from_slice(sym.frames(a)),
            None => frames.push(unnamed(sym, a, closed_modules)),
        }
    }
    for cl in closed.iter() {
        if !closed_modules
            .iter()
            .any(|m: &schema::Module| m.path == cl.module.path && m.base == cl.module.base)
        {
            closed_modules.push(cl.module.clone());
        }
    }
    frames
}

fn py_frames(c: &callsite::Callsite) -> Vec<schema::Frame> {
    let mut py_frames = Vec::new();
    for &id in c.python() {
        crate::capture::python::frame(id, |f| {
            py_frames.push(schema::Frame {
                addr: schema::Addr(0),
                module: Some(f.file.clone()),
                offset: None,
                symbol: Some(f.function.clone()),
                file: Some(f.file.clone()),
                line: Some(f.line),
            })
        });
    }
    py_frames
}

/// The live records; physical allocations of the virtual-memory APIs are listed under their
/// handles, and so are host memory pools, each at its reserved memory.
fn live_figures() -> Vec<(u64, LiveFigures)> {
    let physical = crate::accounting::physical::records()
        .into_iter()
        .chain(crate::accounting::pools::records())
        .map(|(h, l)| (h as usize, l));
    ledger::live_records()
        .into_iter()
        .chain(physical)
        .map(|(addr, l)| {
            let f = LiveFigures {
                size: l.size,
                api: l.api.name().into(),
                callsite: l.site.id(),
                tid: l.tid,
                unix_ms: l.unix_ms,
                downgraded: l.downgraded(),
            };
            (addr as u64, f)
        })
        .collect()
}

fn report_events(cfg: &Config) -> (Vec<schema::Event>, u64) {
    let (events, dropped) = ledger::events();
    let events = events
        .into_iter()
        .map(|e| schema::Event {
            unix_ms: e.unix_ms,
            kind: e.kind,
            api: e.api.name().to_string(),
            size: e.size,
            callsite: e.callsite,
            live_bytes: e.live_bytes,
            downgrade_match: e.out_of_scope.then(|| patterns(cfg)),
            reason: e.over.map(|o| o.limit()),
            host_available_bytes: e.over.and_then(|o| o.host_available()),
            cgroup_headroom_bytes: e.over.and_then(|o| o.cgroup_headroom()),
            why: crate::output::why::of(&e),
            repeats: e.repeats,
            repeat_unix_ms: (e.repeats > 0).then_some(e.repeat_ms),
        })
        .collect();
    (events, dropped)
}

/// What a report short of memory left out, and the calls that passed through untracked.
fn memory_errors(partial: bool, names: bool, out_of_memory: u64) -> Vec<String> {
    let mut errors = Vec::new();
    if partial {
        errors.push("pinguard was short of memory at this report: it is partial (callsites, live records, events and the timeline left out)".to_string());
    } else if !names {
        errors.push("pinguard was short of memory at this report: frames are not named (addresses and modules only)".to_string());
    }
    if out_of_memory > 0 {
        errors.push(format!(
            "pinguard was refused memory {}: pinning calls made while it was short passed through untracked (untracked_count)",
            count(out_of_memory, "time", "times")
        ));
    }
    errors
}

fn group_figures() -> Option<schema::Group> {
    // A process whose calls were all refused before it joined has no cgroup entry in the ledger:
    // its own floor's reserve and lowest reading stand for it (it shares the members' cgroup).
    let own = budget::cgroup::floor()
        .snapshot()
        .map(|c| (c.reserve, c.lowest));
    crate::budget::group::snapshot().map(|g| schema::Group {
        name: g.name,
        budget_bytes: g.budget,
        used_bytes: g.used,
        peak_bytes: g.peak,
        members: g.members as u64,
        host_reserve_bytes: g.host_reserve,
        host_lowest_available_bytes: g.host_lowest_available,
        host_reserve_count: g.host_reserve_count,
        cgroup_reserve_bytes: g.cgroup_reserve.or(own.map(|o| o.0)),
        cgroup_lowest_headroom_bytes: g.cgroup_lowest_headroom.or(own.map(|o| o.1)),
        cgroup_reserve_count: g.cgroup_reserve_count,
        unreachable: g.unreachable,
        lock_timeouts: g.lock_timeouts,
        liveness: g.liveness,
    })
}

/// The loaded modules, then those of closed objects that callsites went through.
fn merged_modules(mut m: Vec<schema::Module>, closed: Vec<schema::Module>) -> Vec<schema::Module> {
    for c in closed {
        if !m.iter().any(|k| k.path == c.path && k.base == c.base) {
            m.push(c);
        }
    }
    m
}

/// `[unix_ms, live_bytes]` points, oldest first.
type Series = Vec<(u64, u64)>;

/// The timeline as a report writes it: the process's points, each followed by the extremes it
/// kept that neither it nor the next point reaches (at its millisecond: they came before the
/// next point's), and each entry point's (the points its own calls made), each series ending at
/// its figure at the write.
fn timelines(
    points: &[ledger::Point],
    apis: &[(String, schema::ApiStats)],
    totals: &schema::Totals,
) -> (Series, BTreeMap<String, Series>) {
    let mut per_api: BTreeMap<String, Series> = BTreeMap::new();
    for p in points {
        if let Some(a) = p.api {
            per_api
                .entry(a.name().to_string())
                .or_default()
                .push((p.unix_ms, p.api_live));
        }
    }
    if let Some(last) = points.last() {
        for (name, s) in apis {
            let v = per_api.entry(name.clone()).or_default();
            match v.last_mut() {
                Some(b) if b.0 >= last.unix_ms => b.1 = s.live_bytes,
                _ => v.push((last.unix_ms, s.live_bytes)),
            }
        }
    }
    (process_series(points, totals), per_api)
}

/// The process's series: every point and the extremes between points, agreeing with the
/// report's totals: its highest is `peak_live_bytes` and its last `live_bytes` (a call in flight
/// while the points were read can leave them a step apart; the totals are the figures of record).
fn process_series(points: &[ledger::Point], totals: &schema::Totals) -> Series {
    let mut out = Series::with_capacity(points.len() + 2);
    for (i, p) in points.iter().enumerate() {
        out.push((p.unix_ms, p.live));
        let next = points.get(i + 1).map_or(p.live, |n| n.live);
        let high = (p.high > p.live.max(next)).then_some(p.high);
        let low = (p.low < p.live.min(next)).then_some(p.low);
        // The one nearer the next point's figure comes last.
        let high_last = next.abs_diff(p.high) < next.abs_diff(p.low);
        let (a, b) = if high_last { (low, high) } else { (high, low) };
        out.extend([a, b].into_iter().flatten().map(|v| (p.unix_ms, v)));
    }
    let Some(&(last_ms, last)) = out.last() else {
        return out;
    };
    for v in &mut out {
        v.1 = v.1.min(totals.peak_live_bytes);
    }
    if last != totals.live_bytes {
        out.push((last_ms, totals.live_bytes));
    }
    let high = out.iter().map(|v| v.1).max().unwrap_or(0);
    if high < totals.peak_live_bytes {
        // Just before the highest reading: the peak was reached no later than it was read.
        let i = out.iter().position(|v| v.1 == high).unwrap_or(0);
        out.insert(i, (out[i].0, totals.peak_live_bytes));
    }
    out
}

/// Address space a report needs beyond its lists to name frames: the symbol and line tables of
/// the modules it names, mapped and parsed (tens of MiB for a large library). Probed first, so
/// that a process under `RLIMIT_AS` gets a report without names rather than none.
const NAMING_ROOM: usize = 64 << 20;

/// Address space a report of `callsites` callsites needs without names: its figures, a few KiB
/// per callsite at most, with a margin for the rest of the lists.
fn room_for(callsites: usize) -> usize {
    (2 << 20) + callsites.saturating_mul(4 << 10)
}

/// A frame named by its module and offset alone (short of memory: no symbol tables read).
fn unnamed(sym: &Symbolizer, addr: usize, modules: &mut Vec<schema::Module>) -> schema::Frame {
    let module = sym.module_of(addr);
    let offset = module.as_ref().map(|m| Addr(addr as u64 - m.base.0));
    let path = module.as_ref().map(|m| m.path.clone());
    if let Some(m) = module {
        if !modules.iter().any(|k| k.path == m.path && k.base == m.base) {
            modules.push(m);
        }
    }
    schema::Frame {
        addr: Addr(addr as u64),
        module: path,
        offset,
        symbol: None,
        file: None,
        line: None,
    }
}

/// `Name { fields }` with the callsite counters (`with_callsite_counters!`) read from `$from`, a
/// callsite or the folded aggregate of the library: a report names each (all known).
macro_rules! with_counters {
    (
        { $from:expr, $($name:ident)::+ { $($field:ident: $value:expr),* $(,)? } }
        counts { $( $(#[$ca:meta])* $c:ident, )* }
        bytes { $( $(#[$ba:meta])* $b:ident, )* }
    ) => {
        $($name)::+ {
            $($field: $value,)*
            $($c: $from.$c.load(Ordering::Relaxed),)*
            $($b: Some($from.$b.load(Ordering::Relaxed)),)*
        }
    };
}

/// A callsite's figures, without its frames.
fn figures(c: &callsite::Callsite) -> schema::Callsite {
    let bits = callsite::api_bits(&c.apis);
    pinguard_common::with_callsite_counters!(with_counters {
        c,
        schema::Callsite {
            id: c.id(),
            frames: Vec::new(),
            py_frames: Vec::new(),
            apis: api_names(&bits),
            live_bytes: c.level.bytes(),
            live_count: c.level.count(),
            peak_live_bytes: c.level.peak(),
            alloc_count: c.level.alloc_count(),
            alloc_bytes: c.level.alloc_bytes(),
        }
    })
}

fn api_names(bits: &[u64]) -> Vec<String> {
    crate::api::Api::ALL
        .iter()
        .filter(|&&a| callsite::has_api(bits, a))
        .map(|a| a.name().to_string())
        .collect()
}

/// The callsites the report lists (each then named: symbolizing is the costly part): those that
/// did something, at most `PINGUARD_MAX_CALLSITES` of them with nothing live (`cap_callsites`),
/// and the aggregate of the rest with the process's folded ones.
fn listed() -> (Vec<&'static callsite::Callsite>, schema::Folded) {
    let mut folded = callsite::folded().map_or_else(schema::Folded::default, |f| {
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        pinguard_common::with_callsite_counters!(with_counters {
            f,
            schema::Folded {
                count: g(&f.count),
                alloc_count: g(&f.alloc_count),
                alloc_bytes: g(&f.alloc_bytes),
                peak_live_bytes: g(&f.peak_live_bytes),
                apis: api_names(&callsite::api_bits(&f.apis)),
            }
        })
    });
    let sites: Vec<&'static callsite::Callsite> = callsite::all()
        .into_iter()
        .filter(|c| c.level.alloc_count() > 0 || c.answered_any())
        .collect();
    let figs: Vec<schema::Callsite> = sites.iter().map(|c| figures(c)).collect();
    let kept = schema::cap_callsites(figs, callsite::max(), &mut folded);
    let kept: std::collections::HashSet<u32> = kept.iter().map(|c| c.id).collect();
    (
        sites
            .into_iter()
            .filter(|c| kept.contains(&c.id()))
            .collect(),
        folded,
    )
}

/// The host reserve's figures, once one was in force.
fn host() -> Option<schema::Host> {
    budget::host::snapshot().map(|h| schema::Host {
        reserve_bytes: h.reserve,
        total_bytes: h.total,
        available_bytes: h.available,
        lowest_available_bytes: h.lowest,
        readings: h.readings,
    })
}

/// The cgroup reserve's figures, once one was in force.
fn cgroup() -> Option<schema::Cgroup> {
    budget::cgroup::floor().snapshot().map(|c| schema::Cgroup {
        path: crate::runtime::cgroup::path()
            .unwrap_or_default()
            .to_string(),
        reserve_bytes: c.reserve,
        limit_bytes: c.total,
        headroom_bytes: c.available,
        lowest_headroom_bytes: c.lowest,
        readings: c.readings,
    })
}

/// Where this process's report goes: the name it has written under, else the template's.
pub fn path() -> PathBuf {
    while FORK_WAITING.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    let _w = lock(); // the names are changed under it, and a fork holds it
    files::report_path().unwrap_or_else(|| files::expand(&files::template().0))
}

/// Writes a report to `path`, or to the configured template. Returns where it went.
pub fn write(cfg: &Config, reason: Reason, path: Option<&Path>) -> Result<PathBuf, String> {
    let written = write_inner(cfg, reason, path);
    // A report is the one large burst of pinguard's allocations: give what it freed back.
    crate::runtime::heap::trim();
    written
}

fn write_inner(cfg: &Config, reason: Reason, path: Option<&Path>) -> Result<PathBuf, String> {
    // In secure mode a template can only come from the node configuration file (root's); the
    // default would put root's report in the caller's working directory.
    if path.is_none() && cfg.report.is_none() && kernel::secure_mode() {
        return Err("secure-mode (setuid) process: PINGUARD_REPORT is ignored, and the node configuration file sets no report template; no report written".into());
    }
    while FORK_WAITING.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    let _w = lock();
    if EXITING.load(Ordering::Relaxed) && reason != Reason::Exit {
        return Err("the process is exiting; the exit report stands".into());
    }
    if reason == Reason::Exit {
        EXITING.store(true, Ordering::Relaxed);
    }
    let report = {
        let _open = crate::runtime::gate::enter(); // symbolisation walks the loaded objects
        snapshot(reason, cfg)
    };
    let json = |w: &mut dyn std::io::Write| {
        serde_json::to_writer(w, &report).map_err(std::io::Error::from)
    };
    if let Some(p) = path {
        return files::write_atomic_with(p, json)
            .map(|_| p.to_path_buf())
            .map_err(|e| format!("{}: {e}", p.display()));
    }
    // Under its own name only: never over another process's report or beside its state.
    files::write_report(json)
}

/// Runs `f` under the report lock, unless the exit report is decided: a metrics file written
/// after the exit removed it would outlive the process. A fork waits for `f`, as for a report.
pub fn unless_exiting<T>(f: impl FnOnce() -> T) -> Option<T> {
    while FORK_WAITING.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    let _w = lock();
    if EXITING.load(Ordering::Relaxed) {
        return None;
    }
    Some(f())
}

/// Stops later snapshots (a process exiting without anything to report).
pub fn exiting() {
    let _w = lock();
    EXITING.store(true, Ordering::Relaxed);
}

/// The exit report and the one summary line on stderr.
pub fn write_exit(cfg: &Config) {
    let written = write(cfg, Reason::Exit, None);
    if written.is_ok() {
        // The report stands in the state's place; without it, the state is what remains.
        crate::accounting::arena::remove_file();
    }
    let mut t = ledger::totals();
    t.kernel_pinned_bytes = ledger::kernel_pinned();
    let mut budget = match budget::limit() {
        _ if budget::closed() => "FAILED CLOSED: a setting cannot be used (PINGUARD_STRICT)".into(),
        Some(b) => format!("budget {}", format_bytes(b)),
        None => "no budget".to_string(),
    };
    let mut group = None;
    if let Some(g) = crate::budget::group::snapshot() {
        let gb = g
            .budget
            .map(format_bytes)
            .unwrap_or_else(|| "no budget".into());
        budget.push_str(&format!(
            "; group {} {} of {gb} in {}",
            g.name,
            format_bytes(g.used),
            count(g.members as u64, "process", "processes")
        ));
        group = Some(g.name);
    }
    let mut whereto = match (&written, files::fell_back()) {
        (Ok(p), Some(why)) => format!(
            "report: {} (in the temporary folder: not writable where asked, {why})",
            p.display()
        ),
        (Ok(p), None) => format!("report: {}", p.display()),
        (Err(e), _) => format!("report not written: {e}"),
    };
    // The latest call turned away or failed, with the room it had: the line users assemble.
    if let Some(last) = crate::output::why::last(&ledger::events().0) {
        whereto = format!("{last}; {whereto}");
    }
    let warn = cfg.policy == crate::runtime::config::Policy::Warn;
    let floors = Floors {
        host: budget::host::snapshot().map(|h| (h.reserve, h.lowest)),
        cgroup: budget::cgroup::floor()
            .snapshot()
            .map(|c| (c.reserve, c.lowest)),
    };
    let line = exit_line(std::process::id(), &t, &budget, warn, floors, &whereto);
    log::write_stderr(&with_group_unavailable(
        line,
        t.group_unavailable_count,
        group.as_deref(),
    ));
}

/// The summary line at exit. Calls over the budget can only happen under `warn`: there they are
/// always counted (0 included, so that a run that stayed within the budget says so), elsewhere
/// only if some were (a count a reader would not look for). With a host reserve (`host`: the
/// reserve and the lowest available memory read), the calls it stopped, 0 included.
/// The floors in force for the exit line: each one's reserve and the lowest figure read.
#[derive(Default)]
struct Floors {
    host: Option<(u64, u64)>,
    cgroup: Option<(u64, u64)>,
}

fn exit_line(
    pid: u32,
    t: &schema::Totals,
    budget: &str,
    warn: bool,
    floors: Floors,
    whereto: &str,
) -> String {
    let over = if warn || t.over_budget_count > 0 {
        format!(", {} over budget", t.over_budget_count)
    } else {
        String::new()
    };
    let mut host = match floors.host {
        Some((reserve, lowest)) => format!(
            "; {} stopped by the host reserve of {} (lowest available {})",
            t.host_reserve_count,
            format_bytes(reserve),
            format_bytes(lowest)
        ),
        None => String::new(),
    };
    if let Some((reserve, lowest)) = floors.cgroup {
        let n = t.cgroup_reserve_count;
        host.push_str(&format!(
            "; {n} stopped by the cgroup reserve of {} (lowest headroom {})",
            format_bytes(reserve),
            format_bytes(lowest)
        ));
    }
    // Pins the kernel counts and no call explains: against the budget too, so on the line.
    let kernel = match t.kernel_pinned_bytes {
        0 => String::new(),
        b => format!(
            ", {} more kernel-pinned with no callsite (VmPin)",
            format_bytes(b)
        ),
    };
    format!(
        "pinguard[{pid}]: {} pinned in {} at exit (peak {}, {budget}){kernel}; {} denied, {} downgraded{over}{host}; {whereto}\n",
        format_bytes(t.live_bytes),
        count(t.live_count, "allocation", "allocations"),
        format_bytes(t.peak_live_bytes),
        t.denied_count,
        t.downgraded_count,
    )
}

/// The exit line with the calls the policy answered while the group's ledger could not be
/// reached, when there were any (`3 of them group_unavailable`, after the denied and downgraded
/// counts they are part of).
fn with_group_unavailable(line: String, n: u64, group: Option<&str>) -> String {
    if n == 0 {
        return line;
    }
    let Some(at) = line.find(" downgraded").map(|i| i + " downgraded".len()) else {
        return line;
    };
    // After the `warn` count, when there is one: it is one of the three counts they are in.
    let at = line[at..]
        .strip_prefix(", ")
        .and_then(|r| {
            r.find(" over budget")
                .map(|j| at + 2 + j + " over budget".len())
        })
        .unwrap_or(at);
    let group = group
        .map(|g| format!("group {g}'s"))
        .unwrap_or_else(|| "the group's".into());
    format!(
        "{}; {n} of them group_unavailable ({group} ledger locked past {} ms){}",
        &line[..at],
        crate::budget::group::LOCK_WAIT_MS,
        &line[at..]
    )
}

/// `1 allocation`, `2 allocations`.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every counter a callsite keeps (the one list, `with_callsite_counters!`) is in its report,
    /// under its name, with its own figure.
    #[test]
    fn every_callsite_counter_is_reported_under_its_name() {
        let cs = callsite::intern(&[0x5e7e_0001, 0x5e7e_0002, 0x5e7e_0003]);
        // Live, so that no fold (another test's small table) takes its figures meanwhile.
        cs.level.live(0, 4096, 1);
        macro_rules! set_each {
            (
                counts { $( $(#[$ca:meta])* $c:ident, )* }
                bytes { $( $(#[$ba:meta])* $b:ident, )* }
            ) => {
                let mut v = 1000;
                $( v += 1; cs.$c.store(v, Ordering::Relaxed); )*
                $( v += 1; cs.$b.store(v, Ordering::Relaxed); )*
            };
        }
        pinguard_common::with_callsite_counters!(set_each);
        let json = serde_json::to_value(super::figures(cs)).expect("a callsite's figures as JSON");
        cs.level.release(0, 4096);
        assert_eq!(pinguard_common::SITE_COUNTERS.len(), 5);
        for (i, name) in pinguard_common::SITE_COUNTERS.iter().enumerate() {
            assert_eq!(json[name], 1001 + i as u64, "{name} in {json}");
        }
    }

    fn site(
        id: u32,
        live_bytes: u64,
        peak: u64,
        alloc_count: u64,
        denied_count: u64,
    ) -> schema::Callsite {
        schema::Callsite {
            id,
            frames: Vec::new(),
            py_frames: Vec::new(),
            apis: vec!["cudaHostAlloc".into()],
            live_bytes,
            live_count: u64::from(live_bytes > 0),
            peak_live_bytes: peak,
            alloc_count,
            alloc_bytes: peak,
            denied_count,
            downgraded_count: 0,
            over_budget_count: 0,
            denied_bytes: Some(denied_count * 8192),
            downgraded_bytes: Some(0),
        }
    }

    fn live(size: u64, unix_ms: u64) -> LiveFigures {
        LiveFigures {
            size,
            api: "cudaHostAlloc".into(),
            callsite: 1,
            tid: 7,
            unix_ms,
            downgraded: false,
        }
    }

    fn figures() -> Figures {
        Figures {
            now: 10_000,
            process: schema::Process::default(),
            config: schema::Config::default(),
            totals: schema::Totals::default(),
            apis: Vec::new(),
            kernel: schema::Kernel::default(),
            group: None,
            host: None,
            cgroup: None,
            modules: Vec::new(),
            callsites: Vec::new(),
            folded: schema::Folded::default(),
            max_callsites: 1024,
            live: Vec::new(),
            events: Vec::new(),
            events_dropped: 0,
            timeline: Vec::new(),
            timeline_apis: BTreeMap::new(),
            timeline_dropped: 0,
        }
    }

    #[test]
    fn callsites_that_did_something_largest_live_first() {
        let mut f = figures();
        f.callsites = vec![
            site(1, 0, 4096, 1, 0),     // all released: shown, last
            site(2, 8192, 8192, 2, 0),  // largest live
            site(3, 0, 0, 0, 0),        // never pinned, refused or downgraded: left out
            site(4, 0, 0, 0, 3),        // only refused: shown
            site(5, 8192, 16384, 4, 0), // as live as 2, higher peak: before it
            site(6, 0, 4096, 1, 0),     // ties with 1: the older id first
        ];
        let r = shape(Reason::Exit, f);
        let ids: Vec<u32> = r.callsites.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![5, 2, 1, 6, 4]);
    }

    #[test]
    fn beyond_the_most_listed_idle_callsites_are_folded_live_ones_never() {
        let mut f = figures();
        f.max_callsites = 2;
        f.folded = schema::Folded {
            count: 10,
            alloc_count: 10,
            alloc_bytes: 40960,
            peak_live_bytes: 8192,
            denied_bytes: Some(0),
            downgraded_bytes: Some(0),
            ..Default::default()
        };
        f.callsites = vec![
            site(1, 0, 4096, 1, 0),
            site(2, 4096, 4096, 1, 0), // live: kept whatever the cap
            site(3, 0, 16384, 1, 0),
            site(4, 0, 8192, 1, 0),
            site(5, 8192, 8192, 1, 0), // live
            site(6, 0, 0, 0, 2),       // only refused: the lowest, folded
        ];
        let r = shape(Reason::Exit, f);
        let ids: Vec<u32> = r.callsites.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![5, 2, 3, 4]);
        let want = schema::Folded {
            count: 12,
            alloc_count: 11,
            alloc_bytes: 40960 + 4096,
            peak_live_bytes: 8192,
            denied_count: 2,
            apis: vec!["cudaHostAlloc".into()],
            denied_bytes: Some(2 * 8192),
            downgraded_bytes: Some(0),
            ..Default::default()
        };
        assert_eq!(r.callsites_folded, want);
    }

    #[test]
    fn the_exit_line_counts_in_words() {
        let mut t = schema::Totals {
            live_bytes: 4096,
            live_count: 1,
            peak_live_bytes: 8192,
            ..Default::default()
        };
        let line = exit_line(
            7,
            &t,
            "budget 16.0 KiB",
            false,
            Floors::default(),
            "report: r.json",
        );
        assert_eq!(line, "pinguard[7]: 4.00 KiB pinned in 1 allocation at exit (peak 8.00 KiB, budget 16.0 KiB); 0 denied, 0 downgraded; report: r.json\n");
        t.kernel_pinned_bytes = 1 << 20;
        let line = exit_line(7, &t, "no budget", false, Floors::default(), "x");
        assert_eq!(line, "pinguard[7]: 4.00 KiB pinned in 1 allocation at exit (peak 8.00 KiB, no budget), 1.00 MiB more kernel-pinned with no callsite (VmPin); 0 denied, 0 downgraded; x\n");
        t.kernel_pinned_bytes = 0;
        t.live_count = 2;
        t.over_budget_count = 3;
        let line = exit_line(
            7,
            &t,
            "budget 16.0 KiB",
            true,
            Floors::default(),
            "report: r.json",
        );
        assert!(
            line.contains(" in 2 allocations at exit")
                && line.ends_with("; 0 denied, 0 downgraded, 3 over budget; report: r.json\n"),
            "{line}"
        );
        t.over_budget_count = 0;
        assert!(exit_line(7, &t, "no budget", true, Floors::default(), "x")
            .contains("0 downgraded, 0 over budget; x"));
        t.host_reserve_count = 2;
        let line = exit_line(
            7,
            &t,
            "no budget",
            false,
            Floors {
                host: Some((1 << 30, 1288490188)),
                cgroup: None,
            },
            "x",
        );
        assert!(line.ends_with("; 0 denied, 0 downgraded; 2 stopped by the host reserve of 1.00 GiB (lowest available 1.20 GiB); x\n"), "{line}");
        t.host_reserve_count = 0;
        assert!(exit_line(
            7,
            &t,
            "no budget",
            false,
            Floors {
                host: Some((1 << 30, 1 << 31)),
                cgroup: None
            },
            "x"
        )
        .contains("; 0 stopped by the host reserve of 1.00 GiB"));
        assert_eq!(count(0, "process", "processes"), "0 processes");
        t.denied_count = 3;
        let line = exit_line(7, &t, "no budget", false, Floors::default(), "x");
        assert_eq!(with_group_unavailable(line.clone(), 0, Some("g")), line);
        assert_eq!(
            with_group_unavailable(line, 3, Some("g")),
            "pinguard[7]: 4.00 KiB pinned in 2 allocations at exit (peak 8.00 KiB, no budget); 3 denied, 0 downgraded; 3 of them group_unavailable (group g's ledger locked past 50 ms); x\n"
        );
        let line = with_group_unavailable(
            exit_line(7, &t, "no budget", true, Floors::default(), "x"),
            2,
            None,
        );
        assert!(
            line.contains(
                "0 downgraded, 0 over budget; 2 of them group_unavailable (the group's ledger"
            ),
            "{line}"
        );
    }

    #[test]
    fn live_records_by_address_with_their_age() {
        let mut f = figures();
        f.live = vec![
            (0x3000, live(4096, 9_000)),
            (0x1000, live(8192, 10_500)),
            (0x2000, live(16, 0)),
        ];
        let r = shape(Reason::Request, f);
        let got: Vec<(u64, u64, u64)> = r
            .live
            .iter()
            .map(|l| (l.addr.0, l.size, l.age_ms))
            .collect();
        // A record stamped after `now` (the coarse clock runs behind the fine one) is 0 ms old.
        assert_eq!(
            got,
            vec![
                (0x1000, 8192, 0),
                (0x2000, 16, 10_000),
                (0x3000, 4096, 1_000)
            ]
        );
        assert_eq!(
            (r.reason, r.schema.as_str()),
            (Reason::Request, schema::SCHEMA)
        );
    }
}
