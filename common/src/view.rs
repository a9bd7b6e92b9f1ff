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
    /// The latest events that say why (`why`), not the whole list.
    #[serde(default)]
    pub events: WhyTail,
}

/// At most this many of a report's events with a `why` are kept by a view.
pub const WHY_TAIL: usize = 5;

/// A report's latest events with a `why` (at most `WHY_TAIL`, oldest first) and how many it has:
/// the others are read past, never kept, so a report's 10,000 events cost a merge no memory.
#[derive(Debug, Default)]
pub struct WhyTail {
    pub latest: Vec<WhyEvent>,
    /// The calls they stand for, repeats included.
    pub count: u64,
}

/// One event with a `why`, as `pinguard report` shows it.
#[derive(Debug)]
pub struct WhyEvent {
    pub unix_ms: u64,
    pub kind: crate::EventKind,
    pub api: String,
    pub size: u64,
    /// The event's callsite: the `id` of one of the report's `callsites`.
    pub callsite: u32,
    pub why: crate::Why,
    /// The calls after it that failed the same way (`Event::repeats`).
    pub repeats: u64,
}

impl<'de> Deserialize<'de> for WhyTail {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<WhyTail, D::Error> {
        d.deserialize_seq(TailVisitor)
    }
}

/// An event as a view reads it: everything but its `why` borrowed or plain numbers.
#[derive(Deserialize)]
struct EventLite<'a> {
    #[serde(default)]
    unix_ms: u64,
    #[serde(default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    api: Cow<'a, str>,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    callsite: u32,
    #[serde(default)]
    why: Option<crate::Why>,
    #[serde(default)]
    repeats: u64,
}

struct TailVisitor;

impl<'de> serde::de::Visitor<'de> for TailVisitor {
    type Value = WhyTail;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of events")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<WhyTail, A::Error> {
        let mut tail = std::collections::VecDeque::with_capacity(WHY_TAIL);
        let mut count = 0;
        while let Some(e) = seq.next_element::<EventLite<'de>>()? {
            let kind = e.kind.as_deref().and_then(crate::EventKind::from_name);
            let (Some(why), Some(kind)) = (e.why, kind) else {
                continue;
            };
            count += 1 + e.repeats;
            if tail.len() == WHY_TAIL {
                tail.pop_front();
            }
            tail.push_back(WhyEvent {
                unix_ms: e.unix_ms,
                kind,
                api: e.api.into_owned(),
                size: e.size,
                callsite: e.callsite,
                why,
                repeats: e.repeats,
            });
        }
        Ok(WhyTail {
            latest: tail.into(),
            count,
        })
    }
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
    /// What the report's events name it by (not its place in the list).
    #[serde(default)]
    pub id: u32,
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

#[cfg(test)]
mod why_tail_tests {
    use super::*;

    #[test]
    fn a_view_keeps_the_latest_events_that_say_why_and_counts_them_all() {
        let why = r#"{"error":"ENOMEM","rlimit_memlock_bytes":65536,"rlimit_memlock_known":true,"cap_ipc_lock":false,"vm_lck_bytes":4096,"vm_pin_bytes":0,"cgroup_headroom_bytes":null,"budget_bytes":null}"#;
        let mut events: Vec<String> = (0..7)
            .map(|i| {
                format!(r#"{{"unix_ms":{i},"kind":"failed","api":"mlock","size":{i},"callsite":0,"live_bytes":0,"why":{why}}}"#)
            })
            .collect();
        // Without a why (an event over the budget), and of a kind this reader does not know.
        events.push(r#"{"unix_ms":8,"kind":"over_budget","api":"mlock","size":1,"callsite":0,"live_bytes":0}"#.into());
        events.push(format!(r#"{{"unix_ms":9,"kind":"new_kind","api":"mlock","size":1,"callsite":0,"live_bytes":0,"why":{why}}}"#));
        // A failure that stands for 4 more calls failing the same way.
        events.push(format!(r#"{{"unix_ms":10,"kind":"failed","api":"mlock","size":7,"callsite":0,"live_bytes":0,"why":{why},"repeats":4,"repeat_unix_ms":12}}"#));
        let t: WhyTail = serde_json::from_str(&format!("[{}]", events.join(","))).unwrap();
        assert_eq!(t.count, 7 + 5, "every call an event stands for");
        let sizes: Vec<u64> = t.latest.iter().map(|e| e.size).collect();
        assert_eq!(sizes, [3, 4, 5, 6, 7], "the latest, oldest first");
        assert_eq!(t.latest[4].repeats, 4);
        assert_eq!(t.latest[0].why.error, "ENOMEM");
        assert_eq!(t.latest[0].kind, crate::EventKind::Failed);
    }
}
