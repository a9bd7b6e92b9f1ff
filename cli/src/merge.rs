//! Many reports folded into one view: callsites matched by their symbolised frames (addresses move
//! between runs and processes), figures summed, processes counted.

use pinguard_report::{Frame, Report, Totals};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// A frame's identity across processes and runs: function, file and line when symbolised, else
/// the module's file name and the offset in it, else the raw address.
pub fn frame_key(f: &Frame) -> String {
    match (&f.symbol, &f.file, f.line) {
        (Some(s), Some(file), Some(line)) => format!("{}@{}:{line}", demangle(s), file),
        (Some(s), _, _) => demangle(s),
        _ => match (&f.module, &f.offset) {
            (Some(m), Some(o)) => format!("{}+{:#x}", basename(m), o.0),
            _ => format!("{:#x}", f.addr.0),
        },
    }
}

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

/// A short name for the callsite: its first frame's function (and file:line).
pub fn short_label(frames: &[Frame]) -> String {
    match frames.first() {
        None => "(no stack)".into(),
        Some(f) => {
            let sym = f.symbol.as_deref().map(demangle);
            match (sym, &f.file, f.line) {
                (Some(s), Some(file), Some(line)) => format!("{s} ({}:{line})", basename(file)),
                (Some(s), _, _) => s,
                _ => frame_label(f),
            }
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Site {
    pub key: String,
    pub frames: Vec<Frame>,
    pub apis: BTreeSet<String>,
    pub live_bytes: u64,
    pub live_count: u64,
    /// The sum of each process's peak at this callsite.
    pub peak_live_bytes: u64,
    pub alloc_count: u64,
    pub alloc_bytes: u64,
    pub denied_count: u64,
    pub downgraded_count: u64,
    pub processes: usize,
    #[serde(skip)]
    seen: BTreeSet<usize>,
}

#[derive(Debug, Default, Serialize)]
pub struct ProcessLine {
    pub path: String,
    pub pid: u32,
    pub hostname: String,
    pub exe: String,
    pub reason: String,
    pub budget_bytes: Option<u64>,
    pub totals: Totals,
}

#[derive(Default, Serialize)]
pub struct Merged {
    pub reports: usize,
    pub processes: usize,
    pub totals: Totals,
    pub callsites: Vec<Site>,
    pub per_process: Vec<ProcessLine>,
    #[serde(skip)]
    index: HashMap<String, usize>,
    #[serde(skip)]
    process_ids: HashMap<(String, u32, u64), usize>,
}

impl Merged {
    pub fn add(&mut self, path: &std::path::Path, r: &Report) {
        self.reports += 1;
        let pkey = (r.process.hostname.clone(), r.process.pid, r.process.start_unix_ms);
        let n = self.process_ids.len();
        let proc_no = *self.process_ids.entry(pkey).or_insert(n);
        self.processes = self.process_ids.len();
        add_totals(&mut self.totals, &r.totals);
        self.per_process.push(ProcessLine {
            path: path.display().to_string(),
            pid: r.process.pid,
            hostname: r.process.hostname.clone(),
            exe: r.process.exe.clone(),
            reason: format!("{:?}", r.reason).to_lowercase(),
            budget_bytes: r.config.budget_bytes,
            totals: r.totals.clone(),
        });
        for c in &r.callsites {
            let key = c.frames.iter().map(frame_key).collect::<Vec<_>>().join("\n");
            let i = match self.index.get(&key) {
                Some(&i) => i,
                None => {
                    self.callsites.push(Site { key: key.clone(), frames: c.frames.clone(), ..Site::default() });
                    self.index.insert(key, self.callsites.len() - 1);
                    self.callsites.len() - 1
                }
            };
            let s = &mut self.callsites[i];
            s.apis.extend(c.apis.iter().cloned());
            s.live_bytes += c.live_bytes;
            s.live_count += c.live_count;
            s.peak_live_bytes += c.peak_live_bytes;
            s.alloc_count += c.alloc_count;
            s.alloc_bytes += c.alloc_bytes;
            s.denied_count += c.denied_count;
            s.downgraded_count += c.downgraded_count;
            s.seen.insert(proc_no);
            s.processes = s.seen.len();
        }
    }

    /// Callsites by live bytes, then peak, then allocations.
    pub fn sort(&mut self) {
        self.callsites.sort_by(|a, b| {
            (b.live_bytes, b.peak_live_bytes, b.alloc_count, &a.key).cmp(&(a.live_bytes, a.peak_live_bytes, a.alloc_count, &b.key))
        });
        self.index.clear();
    }
}

pub fn add_totals(t: &mut Totals, o: &Totals) {
    t.live_bytes += o.live_bytes;
    t.live_count += o.live_count;
    t.peak_live_bytes += o.peak_live_bytes;
    t.alloc_count += o.alloc_count;
    t.alloc_bytes += o.alloc_bytes;
    t.release_count += o.release_count;
    t.failed_count += o.failed_count;
    t.denied_count += o.denied_count;
    t.denied_bytes += o.denied_bytes;
    t.downgraded_count += o.downgraded_count;
    t.downgraded_bytes += o.downgraded_bytes;
    t.downgraded_live_bytes += o.downgraded_live_bytes;
    t.over_budget_count += o.over_budget_count;
    t.unknown_release_count += o.unknown_release_count;
}

/// Reads all inputs into one merged, sorted view.
pub fn merge_inputs(inputs: &[std::path::PathBuf], keep_going: bool) -> Result<Merged, ()> {
    let mut m = Merged::default();
    crate::input::for_each(inputs, keep_going, |p, r| m.add(p, &r))?;
    m.sort();
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"), "core::ptr::drop_in_place");
        assert_eq!(demangle("_ZN2at6native10pin_memoryERKNS_6TensorE"), "at::native::pin_memory(at::Tensor const&)");
        assert_eq!(demangle("main"), "main");
    }
}
