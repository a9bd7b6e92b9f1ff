//! `pinguard export`: the merged reports in the formats other viewers read (pprof, Chrome/Perfetto
//! trace events, speedscope, folded stacks). Every figure comes from the same merge `report`
//! shows; the formats only lay it out.

mod folded;
mod perfetto;
mod pprof;
mod speedscope;

use crate::merge::{Merged, SiteKey};
use pinguard_common::{EventKind, Report};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A gzipped profile.proto (`go tool pprof`, Pyroscope, Parca).
    Pprof,
    /// Chrome trace-event JSON (Perfetto UI, chrome://tracing): pinned bytes over time, budgets,
    /// refusals and downgrades.
    Perfetto,
    /// speedscope's file format.
    Speedscope,
    /// Folded stacks, `frame;frame;frame VALUE` (inferno, flamegraph.pl, Pyroscope).
    Folded,
}

/// The figure stacks are weighted by (folded, speedscope; pprof carries all of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Weight {
    /// Live pinned bytes at the reports' end.
    Live,
    /// Each process's peak pinned bytes at the callsite, summed.
    Peak,
    /// Pinning calls that pinned.
    Calls,
    /// Bytes of the calls a budget or reserve refused.
    Refused,
}

/// One callsite's figures, in the order of `pprof`'s sample types.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Values {
    pub live: u64,
    pub peak: u64,
    pub calls: u64,
    pub refused: u64,
    pub refused_calls: u64,
}

impl Values {
    pub fn get(&self, w: Weight) -> u64 {
        match w {
            Weight::Live => self.live,
            Weight::Peak => self.peak,
            Weight::Calls => self.calls,
            Weight::Refused => self.refused,
        }
    }

    fn add(&mut self, o: &Values) {
        self.live += o.live;
        self.peak += o.peak;
        self.calls += o.calls;
        self.refused += o.refused;
        self.refused_calls += o.refused_calls;
    }
}

/// One report as read, and for each of its callsites the merged callsite it went into.
pub struct Proc {
    pub path: String,
    pub report: Report,
    keys: Vec<SiteKey>,
    /// `sites[i]`: the index in `Merged::callsites` of `report.callsites[i]`.
    pub sites: Vec<usize>,
}

impl Proc {
    /// Whether the report has its callsites' refused bytes (`denied_bytes`, since issue 37): a
    /// report written before has only its events' sizes, short by the events it dropped.
    fn has_refused_bytes(&self) -> bool {
        let f = &self.report.callsites_folded;
        self.report
            .callsites
            .iter()
            .all(|c| c.denied_bytes.is_some())
            && (f.is_empty() || f.denied_bytes.is_some())
    }

    /// Bytes and calls refused per callsite id, from the report's events (`Denied`); events of
    /// callsites the report folded are under `None`. Only for a report without `denied_bytes`.
    fn refused(&self) -> HashMap<Option<u32>, (u64, u64)> {
        let ids: std::collections::HashSet<u32> =
            self.report.callsites.iter().map(|c| c.id).collect();
        let mut out: HashMap<Option<u32>, (u64, u64)> = HashMap::new();
        for e in self
            .report
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Denied)
        {
            let r = out
                .entry(ids.contains(&e.callsite).then_some(e.callsite))
                .or_default();
            r.0 += e.size;
            r.1 += 1;
        }
        out
    }

    /// This report's figures at its `i`th callsite.
    pub fn values(&self, i: usize, refused: &HashMap<Option<u32>, (u64, u64)>) -> Values {
        let c = &self.report.callsites[i];
        let refused = c
            .denied_bytes
            .unwrap_or_else(|| refused.get(&Some(c.id)).map_or(0, |r| r.0));
        Values {
            live: c.live_bytes,
            peak: c.peak_live_bytes,
            calls: c.alloc_count,
            refused,
            refused_calls: c.denied_count,
        }
    }

    /// `exe[pid]`, the process as a label names it.
    pub fn label(&self) -> String {
        format!(
            "{}[{}]",
            crate::merge::basename(&self.report.process.exe),
            self.report.process.pid
        )
    }
}

/// Everything an export needs: the merge (`report`'s figures) and the reports behind it.
pub struct Data {
    pub merged: Merged,
    /// Sorted by path, as `report` lists processes.
    pub procs: Vec<Proc>,
    /// Figures per merged callsite (parallel to `merged.callsites`).
    pub values: Vec<Values>,
    /// The callsites the processes folded (`PINGUARD_MAX_CALLSITES`), as one entry.
    pub folded: Values,
    /// Events that processes without per-callsite refused bytes (reports written before them)
    /// could not keep: their refused bytes are missing from `refused`.
    pub events_dropped: u64,
}

impl Data {
    fn new(merged: Merged, mut procs: Vec<Proc>) -> Data {
        let index: HashMap<SiteKey, usize> = merged
            .callsites
            .iter()
            .enumerate()
            .map(|(i, c)| (c.key, i))
            .collect();
        procs.sort_by(|a, b| a.path.cmp(&b.path));
        let mut values = vec![Values::default(); merged.callsites.len()];
        let f = &merged.callsites_folded;
        let mut folded = Values {
            live: 0,
            peak: f.peak_live_bytes,
            calls: f.alloc_count,
            refused: 0,
            refused_calls: f.denied_count,
        };
        let mut events_dropped = 0;
        for p in &mut procs {
            p.sites = p.keys.iter().map(|k| index[k]).collect();
            let refused = p.refused();
            for (i, &s) in p.sites.iter().enumerate() {
                values[s].add(&p.values(i, &refused));
            }
            let from_events = refused.get(&None).map_or(0, |r| r.0);
            folded.refused += if p.has_refused_bytes() {
                p.report.callsites_folded.denied_bytes.unwrap_or(0)
            } else {
                from_events
            };
            if !p.has_refused_bytes() {
                events_dropped += p.report.events_dropped;
            }
        }
        Data {
            merged,
            procs,
            values,
            folded,
            events_dropped,
        }
    }

    /// The latest report of each process (a process's interval snapshots and its exit report
    /// are readings of one timeline), in the order of `procs`.
    pub fn latest(&self) -> Vec<&Proc> {
        let mut latest: HashMap<(&str, u32, u64), &Proc> = HashMap::new();
        for p in &self.procs {
            let pr = &p.report.process;
            let e = latest
                .entry((pr.hostname.as_str(), pr.pid, pr.start_unix_ms))
                .or_insert(p);
            if pr.write_unix_ms > e.report.process.write_unix_ms {
                *e = p;
            }
        }
        let mut out: Vec<&Proc> = latest.into_values().collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }
}

/// Reads the inputs as `report` does, keeping each report whole besides.
pub fn load(inputs: &[PathBuf], keep_going: bool) -> Result<Data, ()> {
    let (merged, procs) =
        crate::merge::merge_inputs_with(inputs, keep_going, |path: &Path, bytes, view| {
            let report = Report::from_slice(bytes).map_err(|e| e.0)?;
            let keys = view
                .callsites
                .iter()
                .map(|c| crate::merge::site_key(&c.frames, &c.py_frames))
                .collect();
            Ok(Proc {
                path: path.display().to_string(),
                report,
                keys,
                sites: Vec::new(),
            })
        })?;
    Ok(Data::new(merged, procs))
}

/// The export as bytes, or what makes it impossible.
pub fn render(d: &Data, format: Format, weight: Weight) -> Result<Vec<u8>, String> {
    match format {
        Format::Pprof => pprof::render(d),
        Format::Perfetto => perfetto::render(d),
        Format::Speedscope => speedscope::render(d, weight),
        Format::Folded => folded::render(d, weight),
    }
}

/// A binary format to a terminal is refused before anything is read, as `flamegraph` refuses
/// its SVG: gzip on a screen is garbage, and can leave the terminal in a bad state.
pub fn check_output(format: Format, out: &Path) -> Result<(), String> {
    use std::io::IsTerminal;
    if format == Format::Pprof && out.as_os_str() == "-" && std::io::stdout().is_terminal() {
        return Err("refusing to write a gzipped pprof profile to the terminal: give -o FILE, or redirect the output (`> profile.pb.gz`)".into());
    }
    Ok(())
}

/// Writes `bytes` to `out` (`-`: standard output).
pub fn write(bytes: &[u8], out: &Path) -> Result<(), String> {
    use std::io::Write;
    if out.as_os_str() == "-" {
        let mut o = std::io::stdout().lock();
        // A closed pipe (`| head`) is not an error of ours.
        let _ = o.write_all(bytes).and_then(|_| o.flush());
        return Ok(());
    }
    std::fs::write(out, bytes).map_err(|e| format!("{}: {e}", out.display()))
}

/// A name for the folded callsites' entry.
pub fn folded_name(d: &Data) -> String {
    format!("[{} folded callsites]", d.merged.callsites_folded.count)
}

/// Why a weighted export is empty.
pub fn nothing(weight: Weight) -> String {
    let what = match weight {
        Weight::Live => "live pinned bytes",
        Weight::Peak => "a peak",
        Weight::Calls => "pinning calls",
        Weight::Refused => "refused bytes",
    };
    format!("nothing to export: no callsite has {what} (try another --weight)")
}
