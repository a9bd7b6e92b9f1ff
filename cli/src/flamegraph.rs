//! `pinguard flamegraph`: merged callsites as a flame graph (inferno), weighted by live bytes,
//! peak bytes or allocation count.

use crate::merge::{demangle, Merged, Site};
use pinguard_common::Frame;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Metric {
    Live,
    Peak,
    Allocs,
}

/// A frame's name in a stack: its demangled function, else `module+0xoffset`, else its address.
pub fn name(f: &Frame) -> String {
    let n = match (&f.symbol, &f.module, &f.offset) {
        (Some(s), _, _) => demangle(s),
        (None, Some(m), Some(o)) => format!("{}+{:#x}", crate::merge::basename(m), o.0),
        _ => format!("{:#x}", f.addr.0),
    };
    n.replace([';', '\n'], ":")
}

/// A frame of CPython itself (its evaluation loop and C API), where Python code called native code.
fn in_interpreter(f: &Frame) -> bool {
    let module = f
        .module
        .as_deref()
        .map(crate::merge::basename)
        .unwrap_or("");
    let symbol = f.symbol.as_deref().unwrap_or("");
    module.starts_with("libpython")
        || module.starts_with("python")
        || symbol.starts_with("_PyEval_")
        || symbol.starts_with("PyObject_Call")
        || symbol.starts_with("_PyObject_")
        || symbol.starts_with("cfunction_")
}

/// Folded stacks, root first, one line per callsite with a non-zero weight.
pub fn folded(m: &Merged, metric: Metric) -> Vec<String> {
    m.callsites
        .iter()
        .filter_map(|c| {
            let w = match metric {
                Metric::Live => c.live_bytes,
                Metric::Peak => c.peak_sum_bytes,
                Metric::Allocs => c.alloc_count,
            };
            (w != 0).then(|| format!("{} {w}", stack(c).join(";")))
        })
        .collect()
}

/// A callsite's frames as a flame graph names them, root first: Python frames from the outermost
/// (`name [py]`), then the native code the innermost one called (the native frames up to the
/// first one in the interpreter itself), then the entry points (`[cudaHostAlloc]`).
pub fn stack(c: &Site) -> Vec<String> {
    let mut parts: Vec<String> = c
        .py_frames
        .iter()
        .rev()
        .map(|f| format!("{} [py]", name(f)))
        .collect();
    parts.extend(native_frames(c).iter().rev().map(name));
    parts.push(format!(
        "[{}]",
        c.apis.iter().cloned().collect::<Vec<_>>().join(",")
    ));
    parts
}

/// The native frames a flame graph shows, innermost first: all of them outside Python, else the
/// ones the innermost Python frame called (up to the first in the interpreter).
pub fn native_frames(c: &Site) -> &[Frame] {
    let native = if c.py_frames.is_empty() {
        c.frames.len()
    } else {
        c.frames
            .iter()
            .position(in_interpreter)
            .unwrap_or(c.frames.len())
    };
    &c.frames[..native]
}

pub fn render(m: &Merged, metric: Metric, out: &std::path::Path) -> Result<(), String> {
    let lines = folded(m, metric);
    if lines.is_empty() {
        return Err(format!(
            "nothing to draw: no callsite has {} (try --metric peak or --metric allocs)",
            match metric {
                Metric::Live => "live pinned bytes",
                Metric::Peak => "a peak",
                Metric::Allocs => "allocations",
            }
        ));
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = match metric {
        Metric::Live => "Live pinned memory by callsite".into(),
        Metric::Peak => "Peak pinned memory by callsite".into(),
        Metric::Allocs => "Pinned allocations by callsite".into(),
    };
    opts.count_name = match metric {
        Metric::Allocs => "allocations".into(),
        _ => "bytes".into(),
    };
    // `-o -`: standard output, as every tool that takes an output file does.
    if out.as_os_str() == "-" {
        let mut svg = Vec::new();
        inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg)
            .map_err(|e| format!("standard output: {e}"))?;
        crate::out::print(&String::from_utf8_lossy(&svg));
        return Ok(());
    }
    let file = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let w = std::io::BufWriter::new(file);
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), w)
        .map_err(|e| format!("{}: {e}", out.display()))
}
