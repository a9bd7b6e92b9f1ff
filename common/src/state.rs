//! The state file: a running process's figures, kept where they outlive it.
//!
//! The library keeps its live figures (the per-thread counters, the process's and each entry
//! point's levels, the callsites with their frames, the live allocations, the loaded modules) in
//! an arena that is a file-backed shared mapping next to the report (`report.PID.state`). The
//! process updates them in place, so the kernel holds the latest figures in the file however the
//! process ends, `SIGKILL` and the OOM killer included. On a normal exit the JSON report replaces
//! the state. This module is the layout both sides agree on (the library checks its types
//! against these offsets when it compiles) and the reader that turns a state into a `Report`.
//!
//! Objects in the arena point at each other with the addresses they had in the process; the
//! header lists the pieces the arena is mapped in (address, length, offset in the file), so that
//! an address can be found in the file. A reader trusts nothing: every address is bounds-checked
//! and every list is bounded.

use crate::{
    Addr, ApiStats, Callsite, Config, Frame, Live, Module, ParseError, Process, Reason, Report,
    Totals,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const MAGIC: [u8; 8] = *b"PGSTATE\x01";
/// 4 since `group_unavailable_count` joined the per-thread counters (`with_total_counters!`), 5
/// since `cgroup_reserve_count` did, 6 since a callsite and the folded aggregate keep their
/// refused and downgraded bytes (a version 5 file has other bytes, or padding, there), 7 since a
/// callsite and the folded aggregate keep `API_WORDS` words of entry-point bits, not one (the
/// fields after them moved).
pub const VERSION: u32 = 7;
/// Words of a bit per entry point (`Info::apis`'s order) in a callsite and the folded aggregate:
/// room for `API_WORDS * 64` entry points.
pub const API_WORDS: usize = 2;
/// Written as a `u64`: a reader on a machine of the other byte order sees it reversed.
pub const ENDIAN: u64 = 0x0102_0304_0506_0708;
/// The file name's ending, in place of the report's `.json`.
pub const SUFFIX: &str = ".state";
/// Shards of the live-allocation table (one table each).
pub const TABLES: usize = 64;
/// Most pieces an arena is mapped in.
pub const PIECES: usize = 48;

/// The header, at offset 0.
pub mod header {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const API_COUNT: usize = 12;
    pub const ENDIAN: usize = 16;
    /// The folded callsites' aggregate (`super::folded`): 0 until a callsite is folded (and in
    /// files written before there was one: the word was unused).
    pub const FOLDED: usize = 24;
    pub const PID: usize = 32;
    /// The PID namespace's inode number, a `u32` (0: unknown, and in files written before it:
    /// the word was padding). With the pid and start time, it tells this process's file from
    /// another container's pid 1's, started in the same clock tick.
    pub const PID_NS: usize = 36;
    pub const START_TICKS: usize = 40;
    pub const START_UNIX_MS: usize = 48;
    pub const INFO: usize = 56;
    pub const INFO_LEN: usize = 64;
    pub const LEVELS: usize = 72;
    pub const BLOCKS: usize = 80;
    pub const CALLSITES: usize = 88;
    pub const MODULES: usize = 96;
    pub const COMPLETE: usize = 104;
    pub const USED: usize = 112;
    /// `TABLES` words, one per table (`super::table_entry`).
    pub const TABLES: usize = 120;
    /// `PIECES` triples of (address, length, offset in the file: `u64::MAX` for a piece that is
    /// not in the file), for each piece the arena is mapped in.
    pub const PIECES: usize = TABLES + super::TABLES * 8;
    pub const SIZE: usize = PIECES + super::PIECES * 24;
}

/// A level (`level::Level`): `K` stripes of 128 bytes, then `bound` and `peak`.
pub mod level {
    pub const STRIPE: usize = 128;
    pub const BYTES: usize = 0;
    pub const COUNT: usize = 8;
    pub const HIGH: usize = 16;
    pub const ALLOC_COUNT: usize = 24;
    pub const ALLOC_BYTES: usize = 32;
    /// The process's and each entry point's levels.
    pub const TOP_STRIPES: usize = 16;
    /// A callsite's level.
    pub const SITE_STRIPES: usize = 4;
    pub const fn bound(k: usize) -> usize {
        k * STRIPE
    }
    pub const fn peak(k: usize) -> usize {
        k * STRIPE + 8
    }
    /// The peak before the level's last restart (the C API's peak window; 0 in older files).
    pub const fn earlier(k: usize) -> usize {
        k * STRIPE + 16
    }
    pub const fn size(k: usize) -> usize {
        k * STRIPE + STRIPE
    }
}

/// A thread's counter block (`ledger::Block`).
pub mod block {
    pub const NEXT: usize = 0;
    pub const TOTALS: usize = 16;
    macro_rules! names {
        ($($f:ident),*) => { &[$(stringify!($f)),*] };
    }
    /// The totals' counters, in order, 8 bytes each (`crate::with_total_counters`).
    pub const TOTAL_NAMES: &[&str] = crate::with_total_counters!(names);
    /// The one counter that goes down as well as up: its sum is read as signed.
    pub const SIGNED: &str = "downgraded_live_bytes";
    pub const APIS: usize = TOTALS + TOTAL_NAMES.len() * 8;
    /// Each entry point's counters, in order, 8 bytes each (`crate::with_api_counters`).
    pub const API_NAMES: &[&str] = crate::with_api_counters!(names);
    pub const API_SIZE: usize = API_NAMES.len() * 8;
}

/// A callsite (`callsite::Callsite`).
pub mod site {
    pub const NEXT: usize = 0;
    pub const ID: usize = 8;
    /// `API_WORDS` words, a bit per entry point (`Info::apis`'s order), as `super::api_names` reads them.
    pub const APIS: usize = 64;
    pub const FRAMES: usize = 16;
    pub const NFRAMES: usize = 24;
    /// Text: one line per Python frame, innermost first: file, function and line separated by
    /// `PY_SEP`.
    pub const PY: usize = 32;
    pub const PY_LEN: usize = 40;
    pub const DENIED: usize = 48;
    pub const DOWNGRADED: usize = 56;
    /// Since version 7 after the second word of `APIS` (72 in versions 2 to 6).
    pub const OVER_BUDGET: usize = APIS + super::API_WORDS * 8;
    /// Since version 6 (80 and 88 there).
    pub const DENIED_BYTES: usize = OVER_BUDGET + 8;
    pub const DOWNGRADED_BYTES: usize = DENIED_BYTES + 8;
    pub const LEVEL: usize = 128;
    pub const PY_SEP: char = '\u{1f}';
}

/// The folded callsites' aggregate (`callsite::Folded`): callsites with nothing live, folded
/// once there were more than `PINGUARD_MAX_CALLSITES`; 8-byte counters.
pub mod folded {
    pub const COUNT: usize = 0;
    pub const ALLOC_COUNT: usize = 8;
    pub const ALLOC_BYTES: usize = 16;
    pub const DENIED: usize = 24;
    pub const DOWNGRADED: usize = 32;
    pub const OVER_BUDGET: usize = 40;
    pub const PEAK: usize = 48;
    /// `API_WORDS` words, a bit per entry point, as a callsite's `APIS`.
    pub const APIS: usize = 56;
    /// Since version 6 (64 and 72 there, before `APIS` had its second word).
    pub const DENIED_BYTES: usize = APIS + super::API_WORDS * 8;
    pub const DOWNGRADED_BYTES: usize = DENIED_BYTES + 8;
    pub const SIZE: usize = DOWNGRADED_BYTES + 8;
}

/// A slot of a live-allocation table: the address (0: empty), then the record (`ledger::Live`).
pub mod slot {
    pub const SIZE: usize = 40;
    pub const KEY: usize = 0;
    pub const BYTES: usize = 8;
    pub const SITE: usize = 16;
    pub const UNIX_MS: usize = 24;
    pub const TID: usize = 32;
    pub const API: usize = 36;
    /// How the memory is backed (`ledger::Backing`): 0 pinned; any other value is downgraded
    /// (1 pinguard's own pageable memory, 2 the caller's memory left unpinned).
    pub const BACKING: usize = 37;
}

/// A loaded object, as the process saw it.
pub mod module {
    pub const NEXT: usize = 0;
    pub const BASE: usize = 8;
    pub const START: usize = 16;
    pub const END: usize = 24;
    pub const PATH: usize = 32;
    pub const PATH_LEN: usize = 40;
    pub const BUILD_ID: usize = 48;
    pub const BUILD_ID_LEN: usize = 56;
    pub const SIZE: usize = 64;
}

/// What the process knew when it started to pin, written once as JSON (`header::INFO`).
#[derive(Serialize, Deserialize)]
pub struct Info {
    pub pinguard_version: String,
    pub process: Process,
    pub config: Config,
    /// The entry points' names, in the order of their levels and counters.
    pub apis: Vec<String>,
}

/// Lists in a file are bounded: a corrupt `next` never makes a reader loop.
const MAX_LIST: usize = 1 << 22;

struct Image<'a> {
    b: &'a [u8],
    /// (address, length, file offset) of each piece in the file.
    pieces: Vec<(u64, u64, u64)>,
}

impl Image<'_> {
    fn u64_at(&self, off: usize) -> Option<u64> {
        let s = self.b.get(off..off.checked_add(8)?)?;
        Some(u64::from_ne_bytes(s.try_into().ok()?))
    }

    fn u32_at(&self, off: usize) -> Option<u32> {
        let s = self.b.get(off..off.checked_add(4)?)?;
        Some(u32::from_ne_bytes(s.try_into().ok()?))
    }

    /// The file offset of the process address `a`, with `len` bytes there.
    fn at(&self, a: u64, len: usize) -> Option<usize> {
        let &(start, plen, foff) = self.pieces.iter().find(|&&(s, l, _)| a >= s && a - s < l)?;
        let within = a - start;
        if within.checked_add(len as u64)? > plen {
            return None;
        }
        let off = usize::try_from(foff.checked_add(within)?).ok()?;
        (off.checked_add(len)? <= self.b.len()).then_some(off)
    }

    fn bytes(&self, a: u64, len: u64) -> Option<&[u8]> {
        let len = usize::try_from(len).ok()?;
        let off = self.at(a, len)?;
        Some(&self.b[off..off + len])
    }

    fn text(&self, a: u64, len: u64) -> Option<String> {
        Some(String::from_utf8_lossy(self.bytes(a, len)?).into_owned())
    }

    /// The objects of a list, newest first, each with `size` bytes in the file. A list that comes
    /// back on itself (a corrupt file) ends where it does; no list is longer than the file holds.
    fn list(&self, head: u64, size: usize) -> Vec<usize> {
        let most = (self.b.len() / size.max(1)).min(MAX_LIST);
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        let mut a = head;
        while a != 0 && out.len() < most {
            let Some(off) = self.at(a, size) else { break };
            if !seen.insert(off) {
                break;
            }
            out.push(off);
            a = self.u64_at(off).unwrap_or(0);
        }
        out
    }

    fn level(&self, off: usize, k: usize) -> LevelFigures {
        let mut f = LevelFigures::default();
        for s in 0..k {
            let o = off + s * level::STRIPE;
            f.bytes = f
                .bytes
                .wrapping_add(self.u64_at(o + level::BYTES).unwrap_or(0) as i64);
            f.count = f
                .count
                .wrapping_add(self.u64_at(o + level::COUNT).unwrap_or(0) as i64);
            f.alloc_count = f
                .alloc_count
                .wrapping_add(self.u64_at(o + level::ALLOC_COUNT).unwrap_or(0));
            f.alloc_bytes = f
                .alloc_bytes
                .wrapping_add(self.u64_at(o + level::ALLOC_BYTES).unwrap_or(0));
        }
        f.peak = self
            .u64_at(off + level::peak(k))
            .unwrap_or(0)
            .max(self.u64_at(off + level::earlier(k)).unwrap_or(0));
        f
    }
}

#[derive(Default)]
struct LevelFigures {
    bytes: i64,
    count: i64,
    peak: u64,
    alloc_count: u64,
    alloc_bytes: u64,
}

impl LevelFigures {
    fn live_bytes(&self) -> u64 {
        self.bytes.max(0) as u64
    }
    fn live_count(&self) -> u64 {
        self.count.max(0) as u64
    }
    /// Never below the live figure (the peak is raised lazily, as in the process).
    fn peak(&self) -> u64 {
        self.peak.max(self.live_bytes())
    }
}

/// A table directory entry: the table's address (64-byte aligned) with the base-2 logarithm of
/// its capacity in the low 6 bits, so that one store publishes both.
pub fn table_entry(w: u64) -> (u64, u64) {
    match w {
        0 => (0, 0),
        w => (
            w & !63,
            1u64.checked_shl((w & 63) as u32).unwrap_or(0).min(1 << 32),
        ),
    }
}

/// Whether `bytes` begin like a state file.
pub fn is_state(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// The process a state belongs to: (pid, start time in clock ticks after boot), to tell a
/// running process from one that died and a later process that reuses its pid.
pub fn owner(bytes: &[u8]) -> Option<(u32, u64)> {
    let img = Image {
        b: bytes,
        pieces: Vec::new(),
    };
    Some((img.u32_at(header::PID)?, img.u64_at(header::START_TICKS)?))
}

/// The start time in a `/proc/PID/stat` text, in clock ticks after boot (its 22nd field), as
/// `owner` records it. The command name (field 2) may hold spaces and parentheses: fields are
/// counted after its last `)`.
pub fn stat_start_ticks(stat: &str) -> Option<u64> {
    crate::group::parse_start_ticks(stat.as_bytes())
}

/// Reads a state as a report: `Reason::Running` when `running` (the caller asked the system
/// whether the owner still runs), `Reason::Killed` otherwise. `modified_ms` is the file's
/// modification time, the best reading of when the process last pinned.
pub fn read(bytes: &[u8], running: bool, modified_ms: u64) -> Result<Report, ParseError> {
    let (h, img) = image(bytes)?;
    let info = info_of(&h, &img)?;
    let api_count = (h.u32_at(header::API_COUNT).unwrap_or(0) as usize).min(info.apis.len());
    let mut config = info.config;
    if h.u64_at(header::COMPLETE) != Some(1) {
        config
            .errors
            .push("the state is incomplete: part of it could not be kept in the file".into());
    }
    let (totals, apis) = figures(&h, &img, &info.apis, api_count);
    let modules = modules_of(&h, &img);
    let mut names = Names {
        modules: &modules,
        offline: crate::symbols::Offline::default(),
        used: BTreeMap::new(),
    };
    let (callsites, site_ids) = callsites_of(&h, &img, &info.apis, &mut names);
    let callsites_folded = folded(&img, h.u64_at(header::FOLDED).unwrap_or(0), &info.apis);
    let live = live_of(&h, &img, &info.apis, &site_ids, modified_ms);
    let mut process = info.process;
    process.write_unix_ms = modified_ms;
    Ok(Report {
        schema: crate::SCHEMA.to_string(),
        reason: if running {
            Reason::Running
        } else {
            Reason::Killed
        },
        pinguard_version: info.pinguard_version,
        process,
        config,
        totals,
        apis,
        kernel: Default::default(),
        group: None,
        host: None,
        cgroup: None,
        modules: names.used.into_values().collect(),
        callsites,
        callsites_folded,
        live,
        events: Vec::new(),
        events_dropped: 0,
        timeline: Vec::new(),
        timeline_apis: BTreeMap::new(),
        timeline_dropped: 0,
    })
}

fn bad(what: &str) -> ParseError {
    ParseError(format!("not a usable pinguard state ({what})"))
}

/// The header checked, then the file twice: as it is (`h`, for the header's words) and with its
/// pieces mapped (`img`, for everything the header points at).
fn image(bytes: &[u8]) -> Result<(Image<'_>, Image<'_>), ParseError> {
    if !is_state(bytes) {
        return Err(bad("no state header"));
    }
    let h = Image {
        b: bytes,
        pieces: Vec::new(),
    };
    if h.u32_at(header::VERSION) != Some(VERSION) {
        return Err(ParseError(format!(
            "a pinguard state of another version ({}); read it with the pinguard that wrote it",
            h.u32_at(header::VERSION).unwrap_or(0)
        )));
    }
    if h.u64_at(header::ENDIAN) != Some(ENDIAN) {
        return Err(bad("written on a machine of the other byte order"));
    }
    if bytes.len() < header::SIZE {
        return Err(bad("truncated header"));
    }
    let pieces = (0..PIECES)
        .filter_map(|i| {
            let f = |k: usize| h.u64_at(header::PIECES + i * 24 + k * 8).unwrap_or(0);
            let (at, len, off) = (f(0), f(1), f(2));
            (len > 0 && off != u64::MAX).then_some((at, len, off))
        })
        .collect();
    let img = Image { b: bytes, pieces };
    Ok((h, img))
}

/// The process's description (JSON, written once at set-up).
fn info_of(h: &Image, img: &Image) -> Result<Info, ParseError> {
    let info_at = h.u64_at(header::INFO).unwrap_or(0);
    let info_len = h.u64_at(header::INFO_LEN).unwrap_or(0);
    img.bytes(info_at, info_len)
        .and_then(|b| serde_json::from_slice(b).ok())
        .ok_or_else(|| bad("its process description is missing"))
}

/// The totals and each entry point's figures: levels, and the per-thread counters summed.
fn figures(
    h: &Image,
    img: &Image,
    api_names: &[String],
    api_count: usize,
) -> (Totals, BTreeMap<String, ApiStats>) {
    // The process's and each entry point's levels.
    let top = level::size(level::TOP_STRIPES);
    let levels_at = h
        .u64_at(header::LEVELS)
        .and_then(|a| img.at(a, top * (1 + api_count)));
    let level_of = |i: usize| {
        levels_at
            .map(|o| img.level(o + i * top, level::TOP_STRIPES))
            .unwrap_or_default()
    };

    // The per-thread counters.
    let block_size = block::APIS + api_count * block::API_SIZE;
    let blocks = img.list(h.u64_at(header::BLOCKS).unwrap_or(0), block_size);
    let sum = |off: usize| {
        blocks
            .iter()
            .map(|b| img.u64_at(b + off).unwrap_or(0))
            .fold(0u64, u64::wrapping_add)
    };
    let all = level_of(0);
    let mut totals = Totals {
        live_bytes: all.live_bytes(),
        live_count: all.live_count(),
        peak_live_bytes: all.peak(),
        ..Totals::default()
    };
    for (i, name) in block::TOTAL_NAMES.iter().enumerate() {
        let v = sum(block::TOTALS + i * 8);
        if let Some(c) = totals.counter_mut(name) {
            *c = if *name == block::SIGNED {
                (v as i64).max(0) as u64
            } else {
                v
            };
        }
    }
    let mut apis = BTreeMap::new();
    for (i, name) in api_names.iter().enumerate().take(api_count) {
        let l = level_of(1 + i);
        let mut s = ApiStats {
            alloc_count: l.alloc_count,
            alloc_bytes: l.alloc_bytes,
            live_count: l.live_count(),
            live_bytes: l.live_bytes(),
            peak_live_bytes: l.peak(),
            ..ApiStats::default()
        };
        for (field, name) in block::API_NAMES.iter().enumerate() {
            if let Some(c) = s.counter_mut(name) {
                *c = sum(block::APIS + i * block::API_SIZE + field * 8);
            }
        }
        if s != ApiStats::default() {
            apis.insert(name.clone(), s);
        }
    }

    (totals, apis)
}

/// The loaded objects, to name native frames: (start, end, module).
fn modules_of(h: &Image, img: &Image) -> Vec<(u64, u64, Module)> {
    let mut modules: Vec<(u64, u64, Module)> = Vec::new();
    for m in img.list(h.u64_at(header::MODULES).unwrap_or(0), module::SIZE) {
        let f = |o: usize| img.u64_at(m + o).unwrap_or(0);
        let path = img
            .text(f(module::PATH), f(module::PATH_LEN))
            .unwrap_or_default();
        let build_id = img
            .text(f(module::BUILD_ID), f(module::BUILD_ID_LEN))
            .filter(|s| !s.is_empty());
        modules.push((
            f(module::START),
            f(module::END),
            Module {
                path,
                base: Addr(f(module::BASE)),
                build_id,
            },
        ));
    }
    modules
}

/// The callsites that did something, largest live first, and each one's id by its address.
fn callsites_of(
    h: &Image,
    img: &Image,
    apis: &[String],
    names: &mut Names,
) -> (Vec<Callsite>, BTreeMap<u64, u32>) {
    let site_size = site::LEVEL + level::size(level::SITE_STRIPES);
    let mut site_ids: BTreeMap<u64, u32> = BTreeMap::new();
    let mut callsites = Vec::new();
    for off in img.list(h.u64_at(header::CALLSITES).unwrap_or(0), site_size) {
        let f = |o: usize| img.u64_at(off + o).unwrap_or(0);
        let id = img.u32_at(off + site::ID).unwrap_or(0);
        site_ids.insert(addr_of_site(img, off), id);
        let l = img.level(off + site::LEVEL, level::SITE_STRIPES);
        let (denied_count, downgraded_count, over_budget_count) =
            (f(site::DENIED), f(site::DOWNGRADED), f(site::OVER_BUDGET));
        if l.alloc_count == 0
            && denied_count == 0
            && downgraded_count == 0
            && over_budget_count == 0
        {
            continue;
        }
        let n = f(site::NFRAMES).min(1024);
        let frames: Vec<Frame> = img
            .bytes(f(site::FRAMES), n * 8)
            .map(|b| {
                b.chunks_exact(8)
                    .flat_map(|c| names.frames(u64::from_ne_bytes(c.try_into().expect("8 bytes"))))
                    .collect()
            })
            .unwrap_or_default();
        let py_frames = img
            .text(f(site::PY), f(site::PY_LEN))
            .map(|t| py_frames(&t))
            .unwrap_or_default();
        callsites.push(Callsite {
            id,
            frames,
            py_frames,
            apis: api_names(img, off + site::APIS, apis),
            live_bytes: l.live_bytes(),
            live_count: l.live_count(),
            peak_live_bytes: l.peak(),
            alloc_count: l.alloc_count,
            alloc_bytes: l.alloc_bytes,
            denied_count,
            downgraded_count,
            over_budget_count,
            denied_bytes: Some(f(site::DENIED_BYTES)),
            downgraded_bytes: Some(f(site::DOWNGRADED_BYTES)),
        });
    }
    callsites.sort_by(|a, b| {
        (b.live_bytes, b.peak_live_bytes, a.id).cmp(&(a.live_bytes, a.peak_live_bytes, b.id))
    });
    (callsites, site_ids)
}

/// The live allocations. A slot moved while the process died can appear twice: by address, once.
fn live_of(
    h: &Image,
    img: &Image,
    api_names: &[String],
    site_ids: &BTreeMap<u64, u32>,
    modified_ms: u64,
) -> Vec<Live> {
    let bytes = img.b;
    let mut live = BTreeMap::new();
    for t in 0..TABLES {
        let (at, cap) = table_entry(h.u64_at(header::TABLES + t * 8).unwrap_or(0));
        let Some(off) = img.at(at, (cap as usize).saturating_mul(slot::SIZE)) else {
            continue;
        };
        for i in 0..cap as usize {
            let s = off + i * slot::SIZE;
            let key = img.u64_at(s + slot::KEY).unwrap_or(0);
            if key == 0 {
                continue;
            }
            let api = bytes[s + slot::API] as usize;
            live.insert(
                key,
                Live {
                    addr: Addr(key),
                    size: img.u64_at(s + slot::BYTES).unwrap_or(0),
                    api: api_names
                        .get(api)
                        .cloned()
                        .unwrap_or_else(|| "?".into())
                        .into(),
                    callsite: site_ids
                        .get(&img.u64_at(s + slot::SITE).unwrap_or(0))
                        .copied()
                        .unwrap_or(u32::MAX),
                    tid: img.u32_at(s + slot::TID).unwrap_or(0),
                    age_ms: modified_ms.saturating_sub(img.u64_at(s + slot::UNIX_MS).unwrap_or(0)),
                    downgraded: bytes[s + slot::BACKING] != 0,
                },
            );
        }
    }

    live.into_values().collect()
}

/// The folded callsites' aggregate at `at` (0: none).
fn folded(img: &Image, at: u64, apis: &[String]) -> crate::Folded {
    let Some(off) = (at != 0).then(|| img.at(at, folded::SIZE)).flatten() else {
        return crate::Folded::default();
    };
    let f = |o: usize| img.u64_at(off + o).unwrap_or(0);
    crate::Folded {
        count: f(folded::COUNT),
        alloc_count: f(folded::ALLOC_COUNT),
        alloc_bytes: f(folded::ALLOC_BYTES),
        peak_live_bytes: f(folded::PEAK),
        denied_count: f(folded::DENIED),
        downgraded_count: f(folded::DOWNGRADED),
        over_budget_count: f(folded::OVER_BUDGET),
        denied_bytes: Some(f(folded::DENIED_BYTES)),
        downgraded_bytes: Some(f(folded::DOWNGRADED_BYTES)),
        apis: api_names(img, off + folded::APIS, apis),
    }
}

/// The entry points whose bits are set in the `API_WORDS` words at `off`.
fn api_names(img: &Image, off: usize, apis: &[String]) -> Vec<String> {
    let words: Vec<u64> = (0..API_WORDS)
        .map(|w| img.u64_at(off + w * 8).unwrap_or(0))
        .collect();
    apis.iter()
        .enumerate()
        .filter(|(i, _)| {
            words
                .get(i / 64)
                .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
        })
        .map(|(_, n)| n.clone())
        .collect()
}

/// The process address of the object at file offset `off`.
fn addr_of_site(img: &Image, off: usize) -> u64 {
    let off = off as u64;
    img.pieces
        .iter()
        .find(|&&(_, l, f)| off >= f && off - f < l)
        .map_or(0, |&(a, _, f)| a + (off - f))
}

/// Names native frames from the module list, parsing each object file once (and only when the
/// file on disk is still the module the process loaded).
struct Names<'a> {
    modules: &'a [(u64, u64, Module)],
    offline: crate::symbols::Offline,
    used: BTreeMap<usize, Module>,
}

impl Names<'_> {
    fn frames(&mut self, addr: u64) -> Vec<Frame> {
        let Some(i) = self
            .modules
            .iter()
            .position(|(s, e, _)| (*s..*e).contains(&addr))
        else {
            return vec![Frame {
                addr: Addr(addr),
                module: None,
                offset: None,
                symbol: None,
                file: None,
                line: None,
            }];
        };
        let m = &self.modules[i].2;
        self.used.entry(i).or_insert_with(|| m.clone());
        self.offline.frames(m, addr)
    }
}

/// The Python frames of a callsite's text.
fn py_frames(text: &str) -> Vec<Frame> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split(site::PY_SEP);
            let (file, function, line) = (it.next()?, it.next()?, it.next()?.parse().ok()?);
            Some(Frame {
                addr: Addr(0),
                module: Some(file.into()),
                offset: None,
                symbol: Some(function.into()),
                file: Some(file.into()),
                line: Some(line),
            })
        })
        .collect()
}

/// The state file's path for a report path: `.json` replaced, or `.state` added.
pub fn path_for(report: &std::path::Path) -> std::path::PathBuf {
    let s = report.as_os_str().to_string_lossy();
    match s.strip_suffix(".json") {
        Some(stem) => format!("{stem}{SUFFIX}").into(),
        None => format!("{s}{SUFFIX}").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        assert!(read(b"{}", false, 0)
            .unwrap_err()
            .0
            .contains("no state header"));
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&(VERSION - 1).to_ne_bytes());
        assert!(
            read(&b, false, 0)
                .unwrap_err()
                .0
                .contains("another version (6)"),
            "a version 6 file's callsites have one word of entry points"
        );
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&VERSION.to_ne_bytes());
        assert!(
            read(&b, false, 0).is_err(),
            "a truncated header is an error, not a panic"
        );
    }

    #[test]
    fn the_start_time_is_counted_after_the_command_name() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 777 1000 10";
        assert_eq!(stat_start_ticks(stat), Some(777));
        assert_eq!(stat_start_ticks("garbage"), None);
    }

    #[test]
    fn state_paths_sit_next_to_the_report() {
        assert_eq!(
            path_for("r/report.12.json".as_ref()),
            std::path::PathBuf::from("r/report.12.state")
        );
        assert_eq!(
            path_for("r/out.12".as_ref()),
            std::path::PathBuf::from("r/out.12.state")
        );
    }
}
