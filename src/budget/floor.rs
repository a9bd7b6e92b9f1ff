//! A floor under some memory figure that pinning calls never push through: the host reserve
//! (`MemAvailable`, `host`) and the cgroup reserve (the cgroup's headroom before its OOM killer,
//! `cgroup`) are two of these, alike but for what they read.
//!
//! A reading becomes a cap on what the process budget hands out (`USED`):
//! `cap = settled + available - reserve`, where `settled` is what the process had pinned when the
//! reading was taken and the reading therefore already reflects (its live pinned bytes: calls in
//! flight are left out, so each counts against the cap when it lands). The cap is checked inside
//! the process budget's compare-and-swap (`budget::reserve_capped`), so threads racing for the last
//! of the room cannot together take more than there is; the strictest of the budget and the caps
//! wins. Pages the figure does not count (a driver's allocation a cgroup does not charge) leave
//! the reading where it was and raise `settled`: they never use up a floor they do not approach.
//!
//! The reading is cached, and taken again when it is older than `READING_MS`, when the process's
//! reserved total has moved by more than a `MOVE_SHARE`th of the room the reading left, and
//! before any refusal. Other processes' memory moves between readings: a floor is a line this
//! process will not push through, not memory set aside (`docs/design.md`).
//!
//! A reading that cannot be used turns the floor off, with one line on stderr: a bad reading never
//! refuses a call. Everything here runs inside pinning calls: raw system calls into buffers on the
//! stack (the readers in `runtime::kernel`), atomics, no lock, no allocation after start-up.

use crate::runtime::{clock, log};
use pinguard_common::units::format_bytes;
use pinguard_common::vars::Var;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::OnceLock;

/// A reading older than this many milliseconds is taken again (the process's and the group's).
pub const READING_MS: u64 = 100;
/// A reading is taken again once the bytes reserved have moved by more than this share of the
/// room it left (a quarter): close to the floor, readings follow the process's own calls.
pub const MOVE_SHARE: u64 = 4;

const OFF: u64 = u64::MAX;

/// One reading: the figure the floor is under, and the whole it is part of (for the report).
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    pub available: u64,
    pub total: Option<u64>,
}

/// What a floor reads, and how its lines name it.
pub struct Source {
    pub var: &'static Var,
    /// Reads the figure, or says why it cannot: an index into `whys`.
    pub read: fn() -> Result<Reading, usize>,
    /// What is wrong with a reading, completing "`file` ...".
    pub whys: &'static [&'static str],
    /// What was read, for people: "/proc/meminfo".
    pub file: &'static str,
}

/// The most ways a reading can be bad, over every source.
const MAX_WHYS: usize = 4;

pub struct Floor {
    source: Source,
    /// The floor in force, in bytes (`OFF`: none, or turned off by a bad reading).
    reserve: AtomicU64,
    /// The floor set at start-up, kept after a bad reading turned it off (for the report).
    configured: AtomicU64,
    /// The cap on the process budget's reserved bytes from the latest reading.
    cap: AtomicU64,
    /// `coarse_monotonic_ms` of the latest reading (0: none yet).
    read_ms: AtomicU64,
    /// The reserved bytes when the latest reading was taken, and how far they may move from
    /// there before the next one.
    used_at: AtomicU64,
    slack: AtomicU64,
    /// The latest reading: the process's settled bytes then, and the figure.
    settled: AtomicU64,
    available: AtomicU64,
    lowest: AtomicU64,
    /// Bytes released since the latest reading. A release lowers the reserved total at once, but
    /// whether the memory came back (`munlock` of pages that stay resident gives none) only a
    /// reading can say: until one does, the cap does not count it as room, so releasing and
    /// pinning again cannot walk the figure below the floor between readings.
    released: AtomicU64,
    readings: AtomicU64,
    total: AtomicU64,
    /// Why the floor went off after start-up: `1 + index` into `lines` (0: it did not).
    broke: AtomicU8,
    /// The line for each way a reading can be bad, made at start-up (nothing allocates later).
    lines: OnceLock<[String; MAX_WHYS]>,
}

/// The floor's figures, once one was in force.
pub struct Snapshot {
    pub reserve: u64,
    pub total: u64,
    pub available: u64,
    pub lowest: u64,
    pub readings: u64,
}

/// What a floor says of a holder's bytes after a call (`next`; `None`: past what any figure
/// holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Fits,
    /// Not with the reading at hand: read afresh, then decide again.
    Read,
    /// Below the floor with a reading taken for this decision.
    Short,
}

/// The one rule of every floor, for a process alone (its own reading, `budget::against`) and for
/// a group member (the group's shared reading, `group::floors`): a reading that is due is
/// taken again first; within the reading's `cap` fits; past it, a refusal needs a reading taken
/// for this decision (`fresh`), so an old one is taken again first.
#[inline]
pub fn decide(next: Option<u64>, cap: u64, due: bool, fresh: bool) -> Verdict {
    let Some(next) = next else {
        return Verdict::Short;
    };
    if !fresh && due {
        return Verdict::Read;
    }
    if next <= cap {
        return Verdict::Fits;
    }
    if !fresh {
        return Verdict::Read;
    }
    Verdict::Short
}

/// What `cap` allows for a reading: the settled bytes plus what is left above the floor; nothing
/// more than is settled when the figure is below it already.
pub fn cap_of(settled: u64, available: u64, reserve: u64) -> u64 {
    settled.saturating_add(available).saturating_sub(reserve)
}

/// What the process has pinned that a reading taken now reflects: its live pinned bytes, never
/// more than `held` (what the budget it is checked against holds for it).
pub fn settled(held: u64) -> u64 {
    crate::accounting::ledger::live_bytes().min(held)
}

impl Floor {
    pub const fn new(source: Source) -> Floor {
        Floor {
            source,
            reserve: AtomicU64::new(OFF),
            configured: AtomicU64::new(OFF),
            cap: AtomicU64::new(u64::MAX),
            read_ms: AtomicU64::new(0),
            used_at: AtomicU64::new(0),
            slack: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            available: AtomicU64::new(0),
            lowest: AtomicU64::new(u64::MAX),
            released: AtomicU64::new(0),
            readings: AtomicU64::new(0),
            total: AtomicU64::new(0),
            broke: AtomicU8::new(0),
            lines: OnceLock::new(),
        }
    }

    fn line(&self, reserve: u64, why: usize) -> String {
        let why = self
            .source
            .whys
            .get(why)
            .copied()
            .unwrap_or("cannot be used");
        format!(
            "{} of {}: {} {why}; {}",
            self.source.var.name,
            format_bytes(reserve),
            self.source.file,
            self.source.var.fallback
        )
    }

    /// Sets the floor up with a first reading; a reading that cannot be used leaves it off, with
    /// the line in `errors` (printed, as every bad setting is, once the process pins).
    pub fn init(&self, reserve: Option<u64>, errors: &mut Vec<String>) {
        let Some(r) = reserve else { return };
        match (self.source.read)() {
            Ok(m) => {
                let _ = self.lines.set(std::array::from_fn(|i| {
                    format!("pinguard: {}\n", self.line(r, i))
                }));
                self.configured.store(r, Relaxed);
                self.total.store(m.total.unwrap_or(0), Relaxed);
                self.reserve.store(r, Relaxed);
                self.record(m.available, 0, 0);
            }
            Err(why) => errors.push(self.line(r, why)),
        }
    }

    /// Whether the floor is in force.
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.reserve.load(Relaxed) != OFF
    }

    /// The floor in force, in bytes.
    pub fn reserve(&self) -> Option<u64> {
        Some(self.reserve.load(Relaxed)).filter(|&r| r != OFF)
    }

    /// The bytes the process budget may have handed out, with `used` handed out now: from the
    /// latest reading, taken again first when it is due (then `true`: the cap is as fresh as a
    /// refusal needs).
    #[inline]
    pub fn cap(&self, used: u64) -> (u64, bool) {
        let stale =
            clock::coarse_monotonic_ms().saturating_sub(self.read_ms.load(Relaxed)) >= READING_MS;
        let slack = self.slack.load(Relaxed);
        let released = self.released.load(Relaxed);
        let due = stale || used.abs_diff(self.used_at.load(Relaxed)) > slack || released > slack;
        if due {
            self.refresh(used);
        }
        (
            self.cap
                .load(Relaxed)
                .saturating_sub(self.released.load(Relaxed)),
            due,
        )
    }

    /// A release of `bytes` the budget counted: room again only once a reading shows it.
    #[inline]
    pub fn released(&self, bytes: u64) {
        self.released.fetch_add(bytes, Relaxed);
    }

    /// Takes a reading now (`used`: the bytes reserved now); a bad one turns the floor off.
    #[cold]
    #[inline(never)]
    pub fn refresh(&self, used: u64) {
        // Settled bytes first, then the file: a call that lands in between is in the file and not
        // in the settled bytes, which errs on the side of the floor.
        let settled = settled(used);
        // Releases until the file is read are in it; later ones stay counted for the next reading.
        let released = self.released.load(Relaxed);
        match (self.source.read)() {
            Ok(m) => {
                self.record(m.available, settled, used);
                // Saturating: two readings at once each take their share off; wrapping would make
                // the room look gone (a refusal still reads afresh first, but needlessly).
                let _ = self
                    .released
                    .fetch_update(Relaxed, Relaxed, |r| Some(r.saturating_sub(released)));
            }
            Err(why) => self.turn_off(why),
        }
    }

    fn record(&self, available: u64, settled: u64, used: u64) {
        let Some(r) = self.reserve() else { return };
        self.settled.store(settled, Relaxed);
        self.noted(available);
        self.used_at.store(used, Relaxed);
        self.slack
            .store(available.saturating_sub(r) / MOVE_SHARE, Relaxed);
        self.cap.store(cap_of(settled, available, r), Relaxed);
        self.read_ms
            .store(clock::coarse_monotonic_ms().max(1), Relaxed);
    }

    /// A reading taken for this process (its own, or its group's): the report's figures.
    pub fn noted(&self, available: u64) {
        self.available.store(available, Relaxed);
        if available < self.lowest.load(Relaxed) {
            self.lowest.fetch_min(available, Relaxed);
        }
        self.readings.fetch_add(1, Relaxed);
    }

    /// The figure as the latest reading and the calls since count it, with `used` reserved now:
    /// what a refusal's event and `warn` line give.
    pub fn available_now(&self, used: u64) -> u64 {
        let s = self
            .settled
            .load(Relaxed)
            .saturating_add(self.available.load(Relaxed));
        s.saturating_sub(used)
            .saturating_sub(self.released.load(Relaxed))
    }

    /// A reading that cannot be used: the floor goes off for good, with one line on stderr (from
    /// inside a pinning call: only a process that pins says it), and the report lists it.
    #[cold]
    pub fn turn_off(&self, why: usize) {
        if self.reserve.swap(OFF, Relaxed) == OFF {
            return;
        }
        self.cap.store(u64::MAX, Relaxed);
        let i = why.min(MAX_WHYS - 1);
        self.broke.store(i as u8 + 1, Relaxed);
        if let Some(lines) = self.lines.get() {
            log::write_stderr(&lines[i]); // one raw write: no allocation, no cancellation point
        }
    }

    /// Why the floor went off after start-up, as printed (without the prefix).
    pub fn problem(&self) -> Option<&str> {
        let i = self.broke.load(Relaxed).checked_sub(1)? as usize;
        let l = self.lines.get()?.get(i)?;
        Some(l.trim_start_matches("pinguard: ").trim_end())
    }

    pub fn snapshot(&self) -> Option<Snapshot> {
        let reserve = Some(self.configured.load(Relaxed)).filter(|&r| r != OFF)?;
        let available = self.available.load(Relaxed);
        Some(Snapshot {
            reserve,
            total: self.total.load(Relaxed),
            available,
            lowest: self.lowest.load(Relaxed).min(available),
            readings: self.readings.load(Relaxed),
        })
    }

    /// In a fork child: its own readings from its first pinning call on.
    pub fn after_fork_child(&self) {
        self.read_ms.store(0, Relaxed);
        self.lowest.store(u64::MAX, Relaxed);
        self.readings.store(0, Relaxed);
        self.released.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_refuses_only_on_a_reading_taken_for_the_decision() {
        assert_eq!(decide(Some(5), 10, false, false), Verdict::Fits);
        assert_eq!(
            decide(Some(5), 10, true, false),
            Verdict::Read,
            "a due reading first"
        );
        assert_eq!(
            decide(Some(5), 10, true, true),
            Verdict::Fits,
            "fresh: not due again"
        );
        assert_eq!(
            decide(Some(11), 10, false, false),
            Verdict::Read,
            "past the cap: read"
        );
        assert_eq!(decide(Some(11), 10, false, true), Verdict::Short);
        assert_eq!(
            decide(None, u64::MAX, false, false),
            Verdict::Short,
            "past any figure"
        );
    }

    #[test]
    fn the_cap_is_what_is_settled_plus_the_room_above_the_floor() {
        assert_eq!(cap_of(0, 10 << 30, 8 << 30), 2 << 30);
        assert_eq!(
            cap_of(1 << 30, 10 << 30, 8 << 30),
            3 << 30,
            "what the process pinned is in the reading already"
        );
        assert_eq!(
            cap_of(1 << 30, 8 << 30, 8 << 30),
            1 << 30,
            "at the floor: nothing more"
        );
        assert_eq!(
            cap_of(3 << 30, 6 << 30, 8 << 30),
            1 << 30,
            "below it: less than is pinned, so nothing new fits"
        );
        assert_eq!(cap_of(0, 1, u64::MAX - 1), 0);
        assert_eq!(
            cap_of(u64::MAX, u64::MAX, 0),
            u64::MAX,
            "no sum saturates into a refusal"
        );
    }
}
