//! `pinguard flamegraph`: merged callsites as a flame graph (inferno), weighted by live bytes,
//! peak bytes or allocation count.

use crate::merge::{demangle, Merged};
use pinguard_report::Frame;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Metric {
    Live,
    Peak,
    Allocs,
}

fn name(f: &Frame) -> String {
    let n = match (&f.symbol, &f.module, &f.offset) {
        (Some(s), _, _) => demangle(s),
        (None, Some(m), Some(o)) => format!("{}+{:#x}", crate::merge::basename(m), o.0),
        _ => format!("{:#x}", f.addr.0),
    };
    n.replace([';', '\n'], ":")
}

/// Folded stacks, root first, one line per callsite with a non-zero weight.
pub fn folded(m: &Merged, metric: Metric) -> Vec<String> {
    m.callsites
        .iter()
        .filter_map(|c| {
            let w = match metric {
                Metric::Live => c.live_bytes,
                Metric::Peak => c.peak_live_bytes,
                Metric::Allocs => c.alloc_count,
            };
            if w == 0 {
                return None;
            }
            let mut parts: Vec<String> = c.frames.iter().rev().map(name).collect();
            parts.push(format!("[{}]", c.apis.iter().cloned().collect::<Vec<_>>().join(",")));
            Some(format!("{} {w}", parts.join(";")))
        })
        .collect()
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
    let file = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let w = std::io::BufWriter::new(file);
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), w).map_err(|e| format!("{}: {e}", out.display()))
}
