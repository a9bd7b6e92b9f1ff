//! A borrowed, partial view of a report for readers that fold many reports together: strings point
//! into the file's bytes and the sections a merge does not need (`live`, `events`, `modules`) are
//! skipped, not built. The timeline (bounded by the library) is read: peaks of processes alive at
//! the same time are added from it.

use crate::{Addr, Frame, Reason, Totals};
use serde::Deserialize;
use std::borrow::Cow;

#[derive(Deserialize)]
pub struct ReportView<'a> {
    #[serde(borrow)]
    pub schema: Cow<'a, str>,
    pub reason: Reason,
    #[serde(borrow)]
    pub process: ProcessView<'a>,
    pub config: ConfigView,
    pub totals: Totals,
    #[serde(default)]
    pub host: Option<crate::Host>,
    #[serde(default)]
    pub cgroup: Option<crate::Cgroup>,
    #[serde(borrow)]
    pub callsites: Vec<CallsiteView<'a>>,
    #[serde(default)]
    pub callsites_folded: crate::Folded,
    /// `[unix_ms, live_bytes]` points, oldest first.
    #[serde(default)]
    pub timeline: Vec<(u64, u64)>,
}

#[derive(Deserialize)]
pub struct ProcessView<'a> {
    pub pid: u32,
    #[serde(borrow)]
    pub exe: Cow<'a, str>,
    #[serde(borrow)]
    pub hostname: Cow<'a, str>,
    pub start_unix_ms: u64,
    pub write_unix_ms: u64,
}

#[derive(Deserialize)]
pub struct ConfigView {
    pub budget_bytes: Option<u64>,
    /// The settings the process could not use, each with the fallback it ran on.
    #[serde(default)]
    pub errors: Vec<String>,
}

#[derive(Deserialize)]
pub struct CallsiteView<'a> {
    #[serde(borrow)]
    pub frames: Vec<FrameView<'a>>,
    #[serde(default, borrow)]
    pub py_frames: Vec<FrameView<'a>>,
    #[serde(default, borrow)]
    pub apis: Vec<Cow<'a, str>>,
    pub live_bytes: u64,
    pub live_count: u64,
    pub peak_live_bytes: u64,
    pub alloc_count: u64,
    pub alloc_bytes: u64,
    pub denied_count: u64,
    pub downgraded_count: u64,
    #[serde(default)]
    pub over_budget_count: u64,
    #[serde(default)]
    pub denied_bytes: Option<u64>,
    #[serde(default)]
    pub downgraded_bytes: Option<u64>,
}

#[derive(Deserialize)]
pub struct FrameView<'a> {
    pub addr: Addr,
    #[serde(borrow)]
    pub module: Option<Cow<'a, str>>,
    pub offset: Option<Addr>,
    #[serde(borrow)]
    pub symbol: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub file: Option<Cow<'a, str>>,
    pub line: Option<u32>,
}

impl<'a> ReportView<'a> {
    /// One pass over the bytes when the file is a good report; the full diagnosis otherwise.
    pub fn parse(bytes: &'a [u8]) -> Result<ReportView<'a>, crate::ParseError> {
        match serde_json::from_slice::<ReportView>(bytes) {
            Ok(v) if v.schema == crate::SCHEMA => Ok(v),
            _ => crate::parse(bytes),
        }
    }
}

impl FrameView<'_> {
    pub fn to_frame(&self) -> Frame {
        Frame {
            addr: self.addr,
            module: self.module.as_deref().map(str::to_string),
            offset: self.offset,
            symbol: self.symbol.as_deref().map(str::to_string),
            file: self.file.as_deref().map(str::to_string),
            line: self.line,
        }
    }
}
