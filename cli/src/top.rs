//! `pinguard top`: a live view of a group (from its shared ledger) or of a directory of metrics
//! files: processes by pinned bytes, budget use, refusals.

use crate::out::table;
use pinguard_common::group::{self as layout, live, Header};
use pinguard_common::units::format_bytes;
use std::path::Path;

struct Row {
    pid: u32,
    exe: String,
    pinned: u64,
    peak: u64,
    denied: u64,
    downgraded: u64,
    /// Calls the host reserve stopped; `None` where the source does not say.
    host_reserve: Option<u64>,
    /// Calls the cgroup reserve stopped; `None` where the source does not say (no member of the
    /// group applies one, or a version 4 ledger, which keeps no cgroup figures).
    cgroup_reserve: Option<u64>,
    budget: Option<u64>,
    /// Pins the kernel counts and no call explains (`VmPin`): against the budget; `None` where
    /// the source does not say (the group ledger counts them in `pinned` already).
    kernel_pinned: Option<u64>,
    /// How old the row's figures are, in milliseconds: 0 where read from live shared memory (the
    /// group's ledger, a process's state file), a metrics file's time since its last write.
    age_ms: u64,
    note: String,
}

fn pct(a: u64, b: Option<u64>) -> String {
    match b {
        Some(b) if b > 0 && b != u64::MAX => format!("{:.0}%", a as f64 * 100.0 / b as f64),
        _ => "-".into(),
    }
}

/// The ledger as it is now (read without its lock: figures of one moment, good enough to look at).
fn read_group(name: &str) -> Result<(String, Vec<Row>), String> {
    let ledger = crate::group::read(name)?;
    Ok(group_view(name, &ledger.header))
}

fn group_view(name: &str, h: &Header) -> (String, Vec<Row>) {
    let cgroups = h.cgroups.iter().any(|c| c.reserve > 0);
    let budget = (h.budget != u64::MAX).then_some(h.budget);
    let mut rows = Vec::new();
    let here = live::Here::read();
    for (i, m) in h.members.iter().enumerate().filter(|(_, m)| m.pid != 0) {
        let end = m.exe.iter().position(|&b| b == 0).unwrap_or(m.exe.len());
        // As the members judge each other: a member seen from another PID namespace without a
        // semaphore this process can read is not called gone.
        let alive = !crate::group::gone(h, i, here);
        rows.push(Row {
            pid: m.pid,
            exe: String::from_utf8_lossy(&m.exe[..end]).into_owned(),
            pinned: m.bytes,
            peak: m.peak,
            denied: m.denied,
            downgraded: m.downgraded,
            host_reserve: (h.host_reserve > 0).then_some(m.host_reserve),
            cgroup_reserve: cgroups.then_some(h.ext[i].cgroup_reserve),
            budget,
            kernel_pinned: None,
            age_ms: 0,
            note: if alive {
                String::new()
            } else {
                "gone (reclaimed when room is needed)".into()
            },
        });
    }
    let mut head = format!(
        "group {name}: {} of {} pinned ({}), peak {}, {}",
        format_bytes(h.used),
        budget
            .map(format_bytes)
            .unwrap_or_else(|| "no budget".into()),
        pct(h.used, budget),
        format_bytes(h.peak),
        crate::out::count(rows.len() as u64, "member", "members")
    );
    if h.host_reserve > 0 {
        let lowest = match h.host_lowest_available {
            u64::MAX => "none read yet".to_string(),
            l => format_bytes(l),
        };
        head.push_str(&format!(
            "; host reserve {}, lowest available {lowest}",
            format_bytes(h.host_reserve)
        ));
    }
    head.push_str(&cgroup_figures(h));
    (head, rows)
}

/// The cgroup reserve of each cgroup the group's members share a reading of: its reserve, the
/// tightest limit on the path and the lowest headroom a member there read.
fn cgroup_figures(h: &Header) -> String {
    if h.version == 4 {
        return "; a version 4 ledger: no cgroup reserve figures".into();
    }
    let mut out = String::new();
    for (k, c) in h.cgroups.iter().enumerate().filter(|(_, c)| c.reserve > 0) {
        let n = h
            .members
            .iter()
            .zip(h.ext.iter())
            .filter(|(m, e)| m.pid != 0 && e.cgroup as usize == k + 1)
            .count() as u64;
        if n == 0 {
            continue; // its members have left
        }
        let lowest = if c.lowest == u64::MAX {
            "none read yet".to_string()
        } else {
            format_bytes(c.lowest)
        };
        out.push_str(&format!(
            "; cgroup reserve {} of {} ({}), lowest headroom {lowest}",
            format_bytes(c.reserve),
            format_bytes(c.limit),
            crate::out::count(n, "member", "members")
        ));
    }
    out
}

/// The run's group as `run`'s summary shows it, once its command has ended: the line `top`
/// heads it with, and the group removed (ledger and semaphore set) when no member runs. Only a
/// ledger of this user's is read: the name is unpredictable, but a file there is not trusted.
pub fn run_group_line(name: &str) -> Result<String, String> {
    let ledger = crate::group::read(name)?;
    // SAFETY: no arguments; it cannot fail.
    if ledger.uid != unsafe { libc::geteuid() } {
        return Err(format!(
            "{} belongs to user {}, not to this run's",
            layout::path(name),
            ledger.uid
        ));
    }
    let (head, rows) = group_view(name, &ledger.header);
    if rows.iter().all(|r| !r.note.is_empty()) {
        if let Err(e) = crate::group::remove(name) {
            eprintln!("pinguard run: {e}");
        }
    }
    Ok(head)
}

/// One `*.prom` file per process, as pinguard writes them: a file is shown only when the process
/// its writer's line names runs as the file's owner (`crate::writers`); any other is named on
/// stderr, one line each, and left out.
fn read_metrics(dir: &Path) -> Result<(String, Vec<Row>), String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut rows = Vec::new();
    let mut lows = Lows::default();
    let mut finder = crate::writers::Finder::default();
    let mut names: Vec<_> = rd
        .filter_map(|e| e.ok())
        .filter(|e| pinguard_common::textfile::candidate_name(e.file_name().as_encoded_bytes()))
        .map(|e| e.path())
        .collect();
    names.sort();
    for p in names {
        if let Some((pid, file)) = shown_file(&p, &mut finder) {
            rows.push(metrics_row(pid, &file, &mut lows));
        }
    }
    Ok((metrics_head(dir, &rows, &lows), rows))
}

/// The least host memory available and cgroup headroom over the files (each process reads its
/// own cgroup's).
#[derive(Default)]
struct Lows {
    host: Option<u64>,
    cgroup: Option<u64>,
}

/// A metrics file to show, with its writer's pid: `None` for another exporter's file, or one whose
/// writer is not running as its owner (named on stderr).
fn shown_file(
    p: &Path,
    finder: &mut crate::writers::Finder,
) -> Option<(u32, crate::writers::File)> {
    let skip = |why: &str| eprintln!("pinguard top: {}: {why}; not shown", p.display());
    let file = match crate::writers::read(p) {
        Ok(f) => f?,
        Err(why) => {
            skip(&why);
            return None;
        }
    };
    let Some(writer) = &file.writer else {
        if file.text.contains("pinguard_") {
            skip("no pinguard writer line");
        }
        return None; // another exporter's file
    };
    if let Err(crate::writers::Mismatch::NotRunning(why) | crate::writers::Mismatch::Foreign(why)) =
        finder.check(writer, &file.meta)
    {
        skip(&why);
        return None;
    }
    Some((writer.pid, file))
}

/// One process's row from its metrics file's samples.
fn metrics_row(pid: u32, file: &crate::writers::File, lows: &mut Lows) -> Row {
    let mut row = Row {
        pid,
        exe: String::new(),
        pinned: 0,
        peak: 0,
        denied: 0,
        downgraded: 0,
        host_reserve: None,
        cgroup_reserve: None,
        budget: None,
        kernel_pinned: None,
        age_ms: age_ms(&file.meta),
        note: String::new(),
    };
    let least = |l: Option<u64>, v: u64| Some(l.map_or(v, |l| l.min(v)));
    for line in file.text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        if row.exe.is_empty() {
            row.exe = labels
                .split("exe=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string();
        }
        let v = v as u64;
        match name {
            "pinguard_process_pinned_bytes" => row.pinned = v,
            "pinguard_process_pinned_peak_bytes" => row.peak = v,
            "pinguard_budget_bytes" => row.budget = Some(v),
            "pinguard_process_kernel_pinned_bytes" => row.kernel_pinned = Some(v),
            "pinguard_denied_total" => row.denied += v,
            "pinguard_downgraded_total" => row.downgraded += v,
            "pinguard_host_reserve_stopped_total" => row.host_reserve = Some(v),
            "pinguard_host_lowest_available_bytes" => lows.host = least(lows.host, v),
            "pinguard_cgroup_reserve_stopped_total" => row.cgroup_reserve = Some(v),
            "pinguard_cgroup_lowest_headroom_bytes" => lows.cgroup = least(lows.cgroup, v),
            _ => {}
        }
    }
    row
}

/// The folder's line: what its processes pin, and the lowest readings of their floors.
fn metrics_head(dir: &Path, rows: &[Row], lows: &Lows) -> String {
    let total: u64 = rows.iter().map(|r| r.pinned).sum();
    let mut head = format!(
        "{}: {} pinned in {}",
        dir.display(),
        format_bytes(total),
        crate::out::count(rows.len() as u64, "process", "processes")
    );
    let kernel: u64 = rows.iter().filter_map(|r| r.kernel_pinned).sum();
    if kernel > 0 {
        head.push_str(&format!(
            ", {} more kernel-pinned with no callsite (VmPin)",
            format_bytes(kernel)
        ));
    }
    if let Some(l) = lows.host {
        head.push_str(&format!(
            "; lowest host memory available {}",
            format_bytes(l)
        ));
    }
    if let Some(h) = lows.cgroup {
        head.push_str(&format!("; lowest cgroup headroom {}", format_bytes(h)));
    }
    head
}

/// Milliseconds since a file was last written (0 when the clock cannot tell).
fn age_ms(meta: &std::fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.elapsed().ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// A row's age as the AGE column shows it: `live` for figures read from shared memory now.
fn age(ms: u64, live: bool) -> String {
    if live {
        "live".into()
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

fn render(head: String, mut rows: Vec<Row>, live: bool) -> String {
    rows.sort_by(|a, b| (b.pinned, b.peak, a.pid).cmp(&(a.pinned, a.peak, b.pid)));
    let mut t = vec![[
        "PID",
        "EXE",
        "PINNED",
        "PEAK",
        "BUDGET USE",
        "DENIED",
        "DOWNGRADED",
        "AGE",
        "",
    ]
    .map(String::from)
    .to_vec()];
    let mut right = vec![true, false, true, true, true, true, true, true, false];
    let host = rows.iter().any(|r| r.host_reserve.is_some());
    let cgroup = rows.iter().any(|r| r.cgroup_reserve.is_some());
    if cgroup {
        t[0].insert(7, "CGROUP-RESERVE".into());
        right.insert(7, true);
    }
    if host {
        t[0].insert(7, "HOST-RESERVE".into());
        right.insert(7, true);
    }
    // Last, so that the columns above are placed as without it.
    let kernel = rows.iter().any(|r| r.kernel_pinned.is_some_and(|k| k > 0));
    if kernel {
        t[0].insert(3, "KERNEL-PINNED".into());
        right.insert(3, true);
    }
    for r in &rows {
        let kpin = r.kernel_pinned.unwrap_or(0);
        let mut row = vec![
            r.pid.to_string(),
            r.exe.clone(),
            format_bytes(r.pinned),
            format_bytes(r.peak),
            pct(r.pinned + kpin, r.budget),
            r.denied.to_string(),
            r.downgraded.to_string(),
            age(r.age_ms, live),
            r.note.clone(),
        ];
        let shown = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
        if cgroup {
            row.insert(7, shown(r.cgroup_reserve));
        }
        if host {
            row.insert(7, shown(r.host_reserve));
        }
        if kernel {
            row.insert(3, format_bytes(kpin));
        }
        t.push(row);
    }
    // Issue 46, item 8: figures of different ages side by side say so.
    let ages = if live {
        "AGE: every figure read now, from live shared memory"
    } else {
        "AGE: how long ago each process last wrote its metrics file (rewritten every 15 s, or every PINGUARD_INTERVAL when shorter)"
    };
    format!("{head}\n({ages})\n\n{}", table(&t, &right))
}

pub enum Source<'a> {
    Group(&'a str),
    Metrics(&'a Path),
    Pid(u32),
}

/// A process under pinguard, from its state file (mapped by the process: its figures now).
fn read_pid(pid: u32) -> Result<(String, Vec<Row>), String> {
    let proc = crate::top_list::under_pinguard(pid)
        .ok_or_else(|| format!("pid {pid} is not a process running under pinguard"))?;
    let state = proc.state.ok_or_else(|| {
        format!("pid {pid} runs under pinguard but has no state file yet (one is made at its first pinning call)")
    })?;
    let (bytes, _) = pinguard_common::untrusted::read(
        &state,
        pinguard_common::untrusted::Links::Refuse,
        pinguard_common::untrusted::REPORT_MAX,
        "state",
    )
    .map_err(|r| format!("{}: {}", state.display(), r.why))?;
    if !pinguard_common::state::is_state(&bytes) {
        return Err(format!("{}: not a pinguard state file", state.display()));
    }
    let r = pinguard_common::state::read(&bytes, true, 0)
        .map_err(|e| format!("{}: {}", state.display(), e.0))?;
    let t = &r.totals;
    let head = format!(
        "pid {pid} ({}): {} pinned in {}, peak {}; from its state file {}",
        crate::merge::basename(&r.process.exe),
        format_bytes(t.live_bytes),
        crate::out::count(t.live_count, "allocation", "allocations"),
        format_bytes(t.peak_live_bytes),
        state.display()
    );
    let row = Row {
        pid,
        exe: crate::merge::basename(&r.process.exe).to_string(),
        pinned: t.live_bytes,
        peak: t.peak_live_bytes,
        denied: t.denied_count,
        downgraded: t.downgraded_count,
        host_reserve: None,
        cgroup_reserve: None,
        budget: r.config.budget_bytes,
        kernel_pinned: Some(t.kernel_pinned_bytes),
        age_ms: 0,
        note: String::new(),
    };
    Ok((head, vec![row]))
}

pub fn run(source: Source, once: bool, every: std::time::Duration) -> i32 {
    loop {
        let (view, live) = match &source {
            Source::Group(n) => (read_group(n), true),
            Source::Metrics(d) => (read_metrics(d), false),
            Source::Pid(p) => (read_pid(*p), true),
        };
        match view {
            Ok((head, rows)) => {
                let text = render(head, rows, live);
                if once {
                    crate::out::print(&text);
                    return 0;
                }
                crate::out::print(&format!(
                    "\x1b[H\x1b[2J{text}\n(refreshing every {:?}; Ctrl-C to quit)\n",
                    every
                ));
            }
            Err(e) => {
                eprintln!("pinguard top: {e}");
                return 2;
            }
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32, pinned: u64, kernel_pinned: Option<u64>) -> Row {
        Row {
            pid,
            exe: "x".into(),
            pinned,
            peak: pinned,
            denied: 0,
            downgraded: 0,
            host_reserve: None,
            cgroup_reserve: None,
            budget: Some(4 << 20),
            kernel_pinned,
            age_ms: 0,
            note: String::new(),
        }
    }

    /// The kernel's pins no call explains get a column once a process has some, and count in
    /// the budget's use as they count against the budget.
    #[test]
    fn kernel_pinned_bytes_have_a_column_and_count_in_budget_use() {
        let plain = render("h".into(), vec![row(1, 1 << 20, Some(0))], true);
        assert!(!plain.contains("KERNEL-PINNED"), "{plain}");
        let text = render(
            "h".into(),
            vec![row(1, 1 << 20, Some(1 << 20)), row(2, 0, None)],
            true,
        );
        let lines: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("PID"))
            .collect();
        let head: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(
            &head[..5],
            ["PID", "EXE", "PINNED", "KERNEL-PINNED", "PEAK"],
            "{text}"
        );
        let one: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(one[0], "1", "{text}");
        assert_eq!(
            &one[2..8],
            ["1.00", "MiB", "1.00", "MiB", "1.00", "MiB"],
            "{text}"
        );
        assert_eq!(one[8], "50%", "2 MiB of a 4 MiB budget: {text}");
    }
}
