//! Reading report files and directories, with one clear line per unreadable input.

use pinguard_common::Report;
use std::path::{Path, PathBuf};

/// An input that could not be used: the path and what is wrong with it.
#[derive(Debug)]
pub struct BadInput {
    pub path: PathBuf,
    pub problem: String,
}

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.problem)
    }
}

/// A file to read, and whether a directory scan found it (rather than the user naming it).
pub struct Input {
    pub path: PathBuf,
    pub scanned: bool,
}

/// Expands directories (recursively, `*.json` and `*.state`, hidden files skipped) into files. A
/// report next to a state of the same process (an interval snapshot of a process that was killed
/// or still runs) is left out: the state is the later word.
pub fn expand(inputs: &[PathBuf]) -> (Vec<Input>, Vec<BadInput>) {
    let mut files = Vec::new();
    let mut bad = Vec::new();
    for p in inputs {
        match std::fs::metadata(p) {
            Err(e) => bad.push(BadInput {
                path: p.clone(),
                problem: io_problem(&e),
            }),
            Ok(m) if m.is_dir() => {
                let mut found = Vec::new();
                walk(p, 0, &mut found, &mut bad);
                if found.is_empty() {
                    bad.push(BadInput {
                        path: p.clone(),
                        problem: "no pinguard reports (*.json, *.state) in this directory".into(),
                    });
                }
                files.extend(found.into_iter().map(|path| Input {
                    path,
                    scanned: true,
                }));
            }
            Ok(_) => files.push(Input {
                path: p.clone(),
                scanned: false,
            }),
        }
    }
    (files, bad)
}

/// What became of a file that is not a usable report: a file a directory scan found that is
/// evidently something else (a `config.json` beside the reports) is skipped with a note; a
/// damaged report, or any file the user named, is an error.
enum Unusable {
    Skipped(BadInput),
    Bad(BadInput),
}

fn unusable(input: &Input, bytes: Option<&[u8]>, problem: String) -> Unusable {
    let bad = BadInput {
        path: input.path.clone(),
        problem,
    };
    match bytes {
        Some(b) if input.scanned && pinguard_common::foreign(b) => Unusable::Skipped(BadInput {
            path: bad.path,
            problem: "not a pinguard report; skipped".into(),
        }),
        _ => Unusable::Bad(bad),
    }
}

/// How deep a scan goes: a directory swapped for a link to one of its ancestors between the look
/// and the opening could make a loop; this ends it.
const MAX_DEPTH: usize = 64;

/// Files under `dir` that may be reports, never through a link: a link that may name one (or a
/// directory) is listed as it is, for the reader to refuse with one line, so that a loop of links
/// or a link to `/dev/zero` costs nothing.
fn walk(dir: &Path, depth: usize, files: &mut Vec<PathBuf>, bad: &mut Vec<BadInput>) {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            bad.push(BadInput {
                path: dir.to_path_buf(),
                problem: io_problem(&e),
            });
            return;
        }
    };
    let mut entries: Vec<(PathBuf, Option<std::fs::FileType>)> = rd
        .filter_map(|e| e.ok())
        .map(|e| (e.path(), e.file_type().ok()))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (p, t) in entries {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with('.') {
            continue; // includes pinguard's own temporary files
        }
        let report_name = name.ends_with(pinguard_common::state::SUFFIX)
            || (name.ends_with(".json") && !pinguard_common::state::path_for(&p).exists());
        let link = t.is_some_and(|t| t.is_symlink());
        if t.is_some_and(|t| t.is_dir()) {
            if depth < MAX_DEPTH {
                walk(&p, depth + 1, files, bad);
            }
        } else if report_name || (link && p.is_dir()) {
            files.push(p);
        }
    }
}

/// The last line when no input was a report: unless every problem was already named as such.
fn nothing_read(no_inputs: bool, say: bool) {
    if no_inputs {
        eprintln!("pinguard: no report files given");
    } else if say {
        eprintln!("pinguard: no readable report among the inputs");
    }
}

fn io_problem(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// One input's report, as `expand` found it: a file a scan found is never read through a link.
pub fn load_found(input: &Input) -> Result<Report, BadInput> {
    let path = &input.path;
    match load_input(input) {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(BadInput {
            path: path.to_path_buf(),
            problem: "a run record, not a report".into(),
        }),
        Err(Unusable::Skipped(b) | Unusable::Bad(b)) => Err(b),
    }
}

/// A report, or `None` for a run record (`crate::record`), which holds no figures.
fn load_input(input: &Input) -> Result<Option<Report>, Unusable> {
    let bytes = read(input)?;
    if crate::record::is_record(&bytes) {
        return crate::record::parse(&bytes)
            .map(|_| None)
            .map_err(|e| unusable(input, None, e));
    }
    Report::from_slice(&bytes)
        .map(Some)
        .map_err(|e| unusable(input, Some(&bytes), e.0))
}

/// A file's bytes as a report: a state file (`pinguard_common::state`) is read as the report of
/// its process, `killed` when that process no longer runs. Read as `pinguard_common::untrusted`
/// reads: a link is followed only where the user named it, and only a regular file of at most
/// `REPORT_MAX` bytes is read.
fn read(input: &Input) -> Result<Vec<u8>, Unusable> {
    use pinguard_common::untrusted::{self, Links};
    let links = if input.scanned {
        Links::Refuse
    } else {
        Links::Follow
    };
    let (bytes, meta) = untrusted::read(&input.path, links, untrusted::REPORT_MAX, "report")
        .map_err(|r| {
            let bad = BadInput {
                path: input.path.clone(),
                problem: r.why,
            };
            if r.not_a_file && input.scanned {
                Unusable::Skipped(bad)
            } else {
                Unusable::Bad(bad)
            }
        })?;
    if !pinguard_common::state::is_state(&bytes) {
        return Ok(named(bytes));
    }
    let running =
        pinguard_common::state::owner(&bytes).is_some_and(|(pid, ticks)| runs(pid, ticks));
    let modified_ms = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64);
    let bad = |problem| {
        Unusable::Bad(BadInput {
            path: input.path.clone(),
            problem,
        })
    };
    let report =
        pinguard_common::state::read(&bytes, running, modified_ms).map_err(|e| bad(e.0))?;
    serde_json::to_vec(&report).map_err(|e| bad(e.to_string()))
}

/// A report's bytes with the file and line of its native frames filled in from its module list
/// where the library left them out (`pinguard_common::symbols::Offline`): as they were when
/// every frame has its file, or nothing on this machine names more.
fn named(bytes: Vec<u8>) -> Vec<u8> {
    thread_local! {
        // Parsed object files, kept across the reports one thread reads (a merge of many reports
        // of one program parses its libraries once per thread).
        static OFFLINE: std::cell::RefCell<pinguard_common::symbols::Offline> = Default::default();
    }
    // Written by serde_json (the library), or by hand with a space.
    if !["\"file\":null", "\"file\": null"]
        .iter()
        .any(|n| memchr::memmem::find(&bytes, n.as_bytes()).is_some())
    {
        return bytes;
    }
    let Ok(mut report) = Report::from_slice(&bytes) else {
        return bytes;
    };
    if !OFFLINE.with(|o| o.borrow_mut().fill(&mut report)) {
        return bytes;
    }
    serde_json::to_vec(&report).unwrap_or(bytes)
}

/// Whether the process `pid` that started `ticks` clock ticks after boot still runs (here: in
/// this pid namespace). A zombie has ended.
fn runs(pid: u32, ticks: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let zombie = stat
        .rfind(')')
        .is_some_and(|i| stat[i + 1..].split_ascii_whitespace().next() == Some("Z"));
    !zombie && pinguard_common::state::stat_start_ticks(&stat) == Some(ticks)
}

/// One reader thread's share: its folded state, how many reports it read, and the inputs it could
/// not use, by their place in the list.
type Share<T> = (T, usize, Vec<(usize, Unusable)>);

/// Reads every input on all cores: each thread folds its share of the files into its own `T`
/// with `each(state, path, bytes)`, which returns the problem when a file is not a usable report.
/// Bad inputs are printed in the order given; without `keep_going` the first stops everything.
pub fn parallel<T: Send>(
    inputs: &[PathBuf],
    keep_going: bool,
    init: impl Fn() -> T + Sync,
    each: impl Fn(&mut T, &Path, &[u8]) -> Result<(), String> + Sync,
) -> Result<Vec<T>, ()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let (files, bad) = expand(inputs);
    if let Some(b) = bad.first() {
        if !keep_going {
            eprintln!("pinguard: {b}");
            return Err(());
        }
        for b in &bad {
            eprintln!("pinguard: {b}");
        }
    }
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(files.len())
        .max(1);
    let results: Vec<Share<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let (mut state, mut good, mut errs) = (init(), 0usize, Vec::new());
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= files.len() || stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let input = &files[i];
                        let r = read(input).and_then(|b| {
                            each(&mut state, &input.path, &b)
                                .map_err(|problem| unusable(input, Some(&b), problem))
                        });
                        match r {
                            Ok(()) => good += 1,
                            Err(u) => {
                                if matches!(u, Unusable::Bad(_)) && !keep_going {
                                    stop.store(true, Ordering::Relaxed);
                                }
                                errs.push((i, u));
                            }
                        }
                    }
                    (state, good, errs)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a reader thread panicked"))
            .collect()
    });
    let mut errs: Vec<(usize, Unusable)> = Vec::new();
    let mut good = 0;
    let mut states = Vec::new();
    for (st, g, e) in results {
        states.push(st);
        good += g;
        errs.extend(e);
    }
    errs.sort_by_key(|e| e.0);
    let mut skipped = 0;
    for (_, u) in &errs {
        match u {
            Unusable::Skipped(b) => {
                skipped += 1;
                eprintln!("pinguard: {b}");
            }
            Unusable::Bad(b) => {
                eprintln!("pinguard: {b}");
                if !keep_going {
                    return Err(());
                }
            }
        }
    }
    if good == 0 {
        nothing_read(
            bad.is_empty() && files.is_empty(),
            keep_going || skipped > 0,
        );
        return Err(());
    }
    Ok(states)
}

/// Loads every input, calling `each` per good report. Bad inputs are printed; without
/// `keep_going` the first one stops everything (exit status 2), with it they are skipped as long
/// as one report was read.
pub fn for_each(
    inputs: &[PathBuf],
    keep_going: bool,
    mut each: impl FnMut(&Path, Report),
) -> Result<usize, ()> {
    let (files, bad) = expand(inputs);
    let mut failed = false;
    for b in &bad {
        eprintln!("pinguard: {b}");
        failed = true;
    }
    if failed && !keep_going {
        return Err(());
    }
    let (mut good, mut skipped) = (0, 0);
    for f in &files {
        match load_input(f) {
            Ok(Some(r)) => {
                good += 1;
                each(&f.path, r);
            }
            // A run in which nothing was pinned is a good input with nothing in it.
            Ok(None) => good += 1,
            Err(Unusable::Skipped(b)) => {
                skipped += 1;
                eprintln!("pinguard: {b}");
            }
            Err(Unusable::Bad(b)) => {
                eprintln!("pinguard: {b}");
                if !keep_going {
                    return Err(());
                }
            }
        }
    }
    if good == 0 {
        nothing_read(!failed && files.is_empty(), keep_going || skipped > 0);
        return Err(());
    }
    Ok(good)
}

/// The one line `run` says when its report folder already holds files of other runs (a shared
/// `--report` folder, as CI's `ci-pinned/%e.%p.json`): `check DIR` would read them all.
pub fn earlier_runs(root: &std::path::Path) -> Option<String> {
    if !root.is_dir() {
        return None;
    }
    let (files, _) = expand(&[root.to_path_buf()]);
    let records = files
        .iter()
        .filter(|f| {
            f.path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(crate::record::PREFIX))
        })
        .count();
    let reports = files.len() - records;
    if files.is_empty() {
        return None;
    }
    // As the user would type it: relative to the working directory when inside it.
    let cwd = std::env::current_dir().unwrap_or_default();
    let d = root.strip_prefix(&cwd).unwrap_or(root).display();
    Some(format!(
        "{d} already holds {} and {} of earlier runs: `pinguard check {d}` reads them all, `pinguard check --latest {d}` this run's alone",
        crate::out::count(reports as u64, "report", "reports"),
        crate::out::count(records as u64, "run record", "run records"),
    ))
}
