//! speedscope's file format (https://www.speedscope.app/file-format-schema.json): one sampled
//! profile, a sample per callsite weighted by the chosen figure, frames shared.

use super::{Data, Weight};
use crate::merge::Site;
use serde_json::{json, Value};
use std::collections::HashMap;

/// Frames in speedscope's `shared.frames`, each once.
#[derive(Default)]
struct Frames {
    list: Vec<Value>,
    index: HashMap<(String, String, u32), usize>,
}

impl Frames {
    fn add(&mut self, name: String, file: Option<&str>, line: Option<u32>) -> usize {
        let key = (name, file.unwrap_or("").to_string(), line.unwrap_or(0));
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let mut f = json!({ "name": key.0 });
        if let Some(file) = file {
            f["file"] = json!(file);
        }
        if let Some(line) = line {
            f["line"] = json!(line);
        }
        self.list.push(f);
        self.index.insert(key, self.list.len() - 1);
        self.list.len() - 1
    }

    /// The callsite's stack, root first, named as the flame graph names it (with file and line
    /// where the report has them).
    fn stack(&mut self, c: &Site) -> Vec<usize> {
        let names = crate::flamegraph::stack(c);
        let native = crate::flamegraph::native_frames(c);
        let frames = c.py_frames.iter().rev().chain(native.iter().rev());
        let mut out: Vec<usize> = names
            .iter()
            .zip(frames)
            .map(|(n, f)| self.add(n.clone(), f.file.as_deref(), f.line))
            .collect();
        out.push(self.add(names.last().cloned().unwrap_or_default(), None, None));
        out
    }
}

pub fn render(d: &Data, weight: Weight) -> Result<Vec<u8>, String> {
    let mut frames = Frames::default();
    let (mut samples, mut weights) = (Vec::new(), Vec::new());
    for (c, v) in d.merged.callsites.iter().zip(&d.values) {
        if v.get(weight) != 0 {
            samples.push(frames.stack(c));
            weights.push(v.get(weight));
        }
    }
    if d.folded.get(weight) != 0 {
        samples.push(vec![frames.add(super::folded_name(d), None, None)]);
        weights.push(d.folded.get(weight));
    }
    if samples.is_empty() {
        return Err(super::nothing(weight));
    }
    let (what, unit) = match weight {
        Weight::Live => ("live pinned bytes", "bytes"),
        Weight::Peak => ("peak pinned bytes", "bytes"),
        Weight::Calls => ("pinning calls", "none"),
        Weight::Refused => ("refused bytes", "bytes"),
    };
    let total: u64 = weights.iter().sum();
    let name = format!(
        "pinguard: {what} ({} reports, {} processes)",
        d.merged.reports, d.merged.processes
    );
    let doc = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": { "frames": frames.list },
        "profiles": [{
            "type": "sampled",
            "name": name,
            "unit": unit,
            "startValue": 0,
            "endValue": total,
            "samples": samples,
            "weights": weights,
        }],
        "name": name,
        "activeProfileIndex": 0,
        "exporter": format!("pinguard {}", env!("CARGO_PKG_VERSION")),
    });
    serde_json::to_vec(&doc).map_err(|e| e.to_string())
}
