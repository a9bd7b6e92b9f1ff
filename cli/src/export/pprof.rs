//! pprof's `profile.proto` (github.com/google/pprof, proto/profile.proto), gzipped: what `go tool
//! pprof`, Pyroscope and Parca read. One sample per callsite and report, so that labels can name
//! the process; its values sum to the merged callsite's figures.

use super::{Data, Proc};
use pinguard_common::Frame;
use std::collections::HashMap;

/// The messages of profile.proto, field numbers as there (package perftools.profiles).
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// The sample types, in the order of `super::Values`' fields.
pub const SAMPLE_TYPES: [(&str, &str); 5] = [
    ("live", "bytes"),
    ("peak", "bytes"),
    ("calls", "count"),
    ("refused", "bytes"),
    ("refused_calls", "count"),
];

/// The profile under construction: its tables, each entry made once.
#[derive(Default)]
struct Builder {
    p: pb::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String, String), u64>,
    locations: HashMap<(u64, u64, u64, i64), u64>,
    /// By module path and build id: one mapping for all the processes that loaded the file.
    mappings: HashMap<(String, String), usize>,
}

impl Builder {
    fn s(&mut self, text: &str) -> i64 {
        if let Some(&i) = self.strings.get(text) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(text.to_string());
        self.strings.insert(text.to_string(), i);
        i
    }

    fn function(&mut self, name: &str, system_name: &str, file: &str) -> u64 {
        let key = (name.to_string(), system_name.to_string(), file.to_string());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        let (name, system_name, filename) = (self.s(name), self.s(system_name), self.s(file));
        self.p.function.push(pb::Function {
            id,
            name,
            system_name,
            filename,
            start_line: 0,
        });
        self.functions.insert(key, id);
        id
    }

    fn location(&mut self, mapping_id: u64, address: u64, function_id: u64, line: i64) -> u64 {
        let key = (mapping_id, address, function_id, line);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(pb::Location {
            id,
            mapping_id,
            address,
            line: vec![pb::Line { function_id, line }],
        });
        self.locations.insert(key, id);
        id
    }

    /// The mapping of a native frame's module (from the report's module list, with its build id);
    /// its range grows to cover every address placed in it.
    fn mapping(&mut self, proc: &Proc, f: &Frame) -> Option<(u64, u64)> {
        let (module, offset) = (f.module.as_deref()?, f.offset?.0);
        let m = proc.report.modules.iter().find(|m| m.path == module);
        let build_id = m.and_then(|m| m.build_id.clone()).unwrap_or_default();
        let key = (module.to_string(), build_id.clone());
        let i = match self.mappings.get(&key) {
            Some(&i) => i,
            None => {
                let start = m.map_or(0, |m| m.base.0);
                let (filename, build_id) = (self.s(module), self.s(&build_id));
                let id = self.p.mapping.len() as u64 + 1;
                self.p.mapping.push(pb::Mapping {
                    id,
                    memory_start: start,
                    memory_limit: start + 1,
                    filename,
                    build_id,
                    has_functions: true,
                    ..Default::default()
                });
                self.mappings.insert(key, self.p.mapping.len() - 1);
                self.p.mapping.len() - 1
            }
        };
        let map = &mut self.p.mapping[i];
        let address = map.memory_start + offset;
        map.memory_limit = map.memory_limit.max(address + 1);
        map.has_filenames |= f.file.is_some();
        map.has_line_numbers |= f.line.is_some();
        Some((map.id, address))
    }

    fn native(&mut self, proc: &Proc, f: &Frame) -> u64 {
        let name = crate::flamegraph::name(f);
        let system = f.symbol.clone().unwrap_or_else(|| name.clone());
        let function = self.function(&name, &system, f.file.as_deref().unwrap_or(""));
        let (mapping, address) = self.mapping(proc, f).unwrap_or((0, f.addr.0));
        self.location(mapping, address, function, f.line.map_or(0, i64::from))
    }

    /// A Python frame: a function of its own, named `qualname [py]` (as the flame graph names
    /// it) with `py:` before its system name, and no mapping (it is no machine code).
    fn python(&mut self, f: &Frame) -> u64 {
        let name = format!("{} [py]", crate::flamegraph::name(f));
        let system = format!("py:{}", f.symbol.as_deref().unwrap_or("?"));
        let function = self.function(&name, &system, f.file.as_deref().unwrap_or(""));
        self.location(0, 0, function, f.line.map_or(0, i64::from))
    }

    fn label(&mut self, key: &str, value: &str) -> pb::Label {
        pb::Label {
            key: self.s(key),
            str: self.s(value),
            ..Default::default()
        }
    }
}

/// The profile, not yet encoded.
fn build(d: &Data) -> pb::Profile {
    let mut b = Builder::default();
    b.s("");
    b.p.sample_type = SAMPLE_TYPES
        .iter()
        .map(|(t, u)| pb::ValueType {
            r#type: b.s(t),
            unit: b.s(u),
        })
        .collect();
    for p in &d.procs {
        let refused = p.refused();
        for (i, &s) in p.sites.iter().enumerate() {
            let site = &d.merged.callsites[s];
            let v = p.values(i, &refused);
            // Leaf first: the native frames the flame graph shows (innermost first), then the
            // Python frames from the innermost.
            let mut ids: Vec<u64> = crate::flamegraph::native_frames(site)
                .iter()
                .map(|f| b.native(p, f))
                .collect();
            ids.extend(site.py_frames.iter().map(|f| b.python(f)));
            let apis: Vec<&str> = p.report.callsites[i]
                .apis
                .iter()
                .map(String::as_str)
                .collect();
            let mut label = vec![
                b.label("process", &p.label()),
                b.label("host", &p.report.process.hostname),
                b.label("api", &apis.join(",")),
                b.label("reason", p.report.reason.name()),
            ];
            label.push(pb::Label {
                key: b.s("pid"),
                num: p.report.process.pid as i64,
                ..Default::default()
            });
            let value = [v.live, v.peak, v.calls, v.refused, v.refused_calls]
                .map(|x| x as i64)
                .to_vec();
            b.p.sample.push(pb::Sample {
                location_id: ids,
                value,
                label,
            });
        }
    }
    if d.folded != super::Values::default() {
        let f = b.function(&super::folded_name(d), "", "");
        let loc = b.location(0, 0, f, 0);
        let v = d.folded;
        b.p.sample.push(pb::Sample {
            location_id: vec![loc],
            value: [v.live, v.peak, v.calls, v.refused, v.refused_calls]
                .map(|x| x as i64)
                .to_vec(),
            label: vec![],
        });
    }
    let start = d
        .procs
        .iter()
        .map(|p| p.report.process.start_unix_ms)
        .min()
        .unwrap_or(0);
    let end = d
        .procs
        .iter()
        .map(|p| p.report.process.write_unix_ms)
        .max()
        .unwrap_or(start);
    b.p.time_nanos = (start as i64).saturating_mul(1_000_000);
    b.p.duration_nanos = (end.saturating_sub(start) as i64).saturating_mul(1_000_000);
    let comment = format!(
        "pinguard export: {} reports, {} processes",
        d.merged.reports, d.merged.processes
    );
    let c = b.s(&comment);
    b.p.comment.push(c);
    if d.events_dropped > 0 {
        let c = b.s(&format!(
            "{} events dropped by the processes: refused bytes are short by theirs",
            d.events_dropped
        ));
        b.p.comment.push(c);
    }
    b.p.default_sample_type = b.p.sample_type[0].r#type;
    b.p
}

pub fn render(d: &Data) -> Result<Vec<u8>, String> {
    use prost::Message;
    use std::io::Write;
    let raw = build(d).encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw)
        .and_then(|_| gz.finish())
        .map_err(|e| format!("gzip: {e}"))
}
