//! `check --latest`: of a folder that several runs wrote into, only the newest run's files.
//!
//! A run is what `pinguard run` recorded (`crate::record`): its record and the files it lists.
//! Reports no record lists ("bare" reports: written without `pinguard run`, or by a run killed
//! before its record) form runs by their processes' lifetimes: processes whose lifetimes (start
//! to the report's write) overlap, directly or through others, are one run, as a command and
//! the children it waits for are. The newest run is the one that started last.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// One run found in a folder: when it started, what it is, and its files.
struct Run {
    start_ms: u64,
    what: String,
    files: Vec<PathBuf>,
}

/// The inputs, each folder replaced by its newest run's files (files named are kept as given),
/// and one line per folder saying which run that is and what was left out.
pub fn select(inputs: &[PathBuf]) -> (Vec<PathBuf>, Vec<String>) {
    let mut out = Vec::new();
    let mut lines = Vec::new();
    for input in inputs {
        if !input.is_dir() {
            out.push(input.clone());
            continue;
        }
        let (runs, unread) = runs_in(input);
        let n = runs.len();
        match runs.into_iter().max_by_key(|r| r.start_ms) {
            Some(newest) => {
                let left = n - 1;
                lines.push(format!(
                    "pinguard check: --latest: {}: the newest run, {}, {}{}",
                    input.display(),
                    newest.what,
                    crate::out::count(newest.files.len() as u64, "file", "files"),
                    match left {
                        0 => String::new(),
                        k => format!(
                            "; {} left out",
                            crate::out::count(k as u64, "earlier run", "earlier runs")
                        ),
                    }
                ));
                out.extend(newest.files);
            }
            // Nothing to date: the merge says what is wrong with the folder.
            None => out.push(input.clone()),
        }
        lines.extend(
            unread
                .iter()
                .map(|p| format!("pinguard check: --latest: {p}: not a readable report; left out")),
        );
    }
    (out, lines)
}

/// The runs of a folder, and the files that could not be dated.
fn runs_in(dir: &Path) -> (Vec<Run>, Vec<String>) {
    let (files, _) = crate::input::expand(&[dir.to_path_buf()]);
    let mut runs = Vec::new();
    let mut claimed: HashSet<PathBuf> = HashSet::new();
    let mut bare = Vec::new();
    let mut unread = Vec::new();
    for f in files.into_iter().map(|i| i.path) {
        let is_record = f
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(crate::record::PREFIX));
        if is_record {
            let Ok(rec) = std::fs::read(&f)
                .map_err(|e| e.to_string())
                .and_then(|b| crate::record::parse(&b))
            else {
                unread.push(f.display().to_string());
                continue;
            };
            let base = f.parent().unwrap_or(Path::new("."));
            let mut listed: Vec<PathBuf> = Vec::new();
            for found in &rec.reports_found {
                let p = base.join(&found.file);
                // The report, or the state the process left instead (or beside it).
                claimed.insert(pinguard_common::state::path_for(&p));
                claimed.insert(p.clone());
                listed.push(p);
            }
            listed.push(f.clone());
            claimed.insert(f);
            runs.push(Run {
                start_ms: rec.start_unix_ms,
                what: format!("by its record: the {}", rec.name()),
                files: listed,
            });
        } else {
            bare.push(f);
        }
    }
    let mut dated = Vec::new();
    for f in bare.into_iter().filter(|f| !claimed.contains(f)) {
        match crate::input::load_found(&crate::input::Input {
            path: f.clone(),
            scanned: true,
        }) {
            Ok(r) => dated.push((r.process.start_unix_ms, r.process.write_unix_ms, f)),
            Err(_) => unread.push(f.display().to_string()),
        }
    }
    // As a folder scan reads them: a state beside a report is the later word.
    for r in &mut runs {
        let files = std::mem::take(&mut r.files);
        r.files = files
            .into_iter()
            .map(|p| match pinguard_common::state::path_for(&p) {
                s if s.exists() && s != p => s,
                _ => p,
            })
            .filter(|p| p.exists())
            .collect();
        r.files.dedup();
    }
    runs.extend(lifetimes(dated));
    (runs, unread)
}

/// Bare reports as runs: sorted by start, a report whose process started after every earlier one
/// had written its report begins a new run.
fn lifetimes(mut dated: Vec<(u64, u64, PathBuf)>) -> Vec<Run> {
    dated.sort();
    let mut runs: Vec<Run> = Vec::new();
    let mut end = 0u64;
    for (start, write, f) in dated {
        match runs.last_mut() {
            Some(r) if start <= end => r.files.push(f),
            _ => runs.push(Run {
                start_ms: start,
                what: "by its processes' lifetimes (reports without a run record)".into(),
                files: vec![f],
            }),
        }
        end = end.max(write);
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_lifetimes_are_one_run_and_a_gap_starts_another() {
        let p = |s: &str| PathBuf::from(s);
        let runs = lifetimes(vec![
            (100, 200, p("a")),
            (150, 300, p("child")),
            (250, 260, p("grandchild")),
            (400, 500, p("b")),
        ]);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].files.len(), 3);
        assert_eq!(
            (runs[1].start_ms, runs[1].files.clone()),
            (400, vec![p("b")])
        );
    }
}
