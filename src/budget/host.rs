//! The host reserve (`PINGUARD_HOST_RESERVE`): pinning calls never take the host's available
//! memory (`MemAvailable` in `/proc/meminfo`) below a floor.
//!
//! A reading of `/proc/meminfo` becomes a cap on what the process budget hands out (`USED`):
//! `cap = settled + available - reserve`, where `settled` is what the process had pinned when the
//! reading was taken and the reading therefore already reflects (its live pinned bytes: calls in
//! flight are left out, so each counts against the cap when it lands). The cap is checked inside
//! the process budget's compare-and-swap (`budget::reserve_capped`), so threads racing for the last
//! of the headroom cannot together take more than there is; the strictest of the budget and the
//! cap wins. In a group, the group's shared reading decides instead, under the group's lock
//! (`group`), so that members cannot each take the same headroom.
//!
//! The reading is cached, and taken again when it is older than `READING_MS`, when the process's
//! reserved total has moved by more than a `MOVE_SHARE`th of the headroom the reading left, and
//! before any refusal. Other processes' memory moves between readings: the reserve is a floor
//! this process will not push the host through, not memory set aside (`docs/design.md`).
//!
//! A reading that cannot be used (no `/proc/meminfo`, no `MemAvailable` in it) turns the reserve
//! off, with one line on stderr: a bad reading never refuses a call.
//!
//! Everything here runs inside pinning calls: raw system calls into a buffer on the stack
//! (`kernel::host_memory`), atomics, no lock, no allocation after start-up.

use crate::runtime::kernel::{self, BadMeminfo};
use crate::runtime::{clock, log};
use pinguard_report::units::format_bytes;
use pinguard_report::vars;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::OnceLock;

/// A reading older than this many milliseconds is taken again (the process's and the group's).
pub const READING_MS: u64 = 100;
/// A reading is taken again once the bytes reserved have moved by more than this share of the
/// headroom it left (a quarter): close to the floor, readings follow the process's own calls.
pub const MOVE_SHARE: u64 = 4;

const OFF: u64 = u64::MAX;

/// The floor in force, in bytes (`OFF`: none, or turned off by a bad reading).
static RESERVE: AtomicU64 = AtomicU64::new(OFF);
/// The floor set at start-up, kept after a bad reading turned it off (for the report).
static CONFIGURED: AtomicU64 = AtomicU64::new(OFF);
/// The cap on the process budget's reserved bytes from the latest reading.
static CAP: AtomicU64 = AtomicU64::new(u64::MAX);
/// `coarse_monotonic_ms` of the latest reading (0: none yet).
static READ_MS: AtomicU64 = AtomicU64::new(0);
/// The reserved bytes when the latest reading was taken, and how far they may move from there
/// before the next one.
static USED_AT: AtomicU64 = AtomicU64::new(0);
static SLACK: AtomicU64 = AtomicU64::new(0);
/// The latest reading: the process's settled bytes then, and `MemAvailable`.
static SETTLED: AtomicU64 = AtomicU64::new(0);
static AVAILABLE: AtomicU64 = AtomicU64::new(0);
static LOWEST: AtomicU64 = AtomicU64::new(u64::MAX);
/// Bytes released since the latest reading. A release lowers the reserved total at once, but
/// whether the memory came back to the host (`munlock` of pages that stay resident does not give
/// any) only a reading can say: until one does, the cap does not count it as room, so releasing
/// and pinning again cannot walk the host below the floor between readings.
static RELEASED: AtomicU64 = AtomicU64::new(0);
static READINGS: AtomicU64 = AtomicU64::new(0);
static TOTAL: AtomicU64 = AtomicU64::new(0);
/// Why the reserve went off after start-up: `BadMeminfo` as `1 + index` into `LINES` (0: it did not).
static BROKE: AtomicU8 = AtomicU8::new(0);
/// The line for each way a reading can be bad, made at start-up (nothing allocates later).
static LINES: OnceLock<[String; 3]> = OnceLock::new();

const BAD: [BadMeminfo; 3] = [BadMeminfo::Unreadable, BadMeminfo::NoAvailable, BadMeminfo::AboveTotal];

fn line(reserve: u64, why: BadMeminfo) -> String {
    format!("{} of {}: /proc/meminfo {}; {}", vars::HOST_RESERVE.name, format_bytes(reserve), why.why(), vars::HOST_RESERVE.fallback)
}

/// Sets the reserve up with a first reading; a reading that cannot be used leaves it off, with
/// the line in `errors` (printed, as every bad setting is, once the process pins).
pub fn init(reserve: Option<u64>, errors: &mut Vec<String>) {
    let Some(r) = reserve else { return };
    match kernel::host_memory() {
        Ok(m) => {
            let _ = LINES.set(BAD.map(|why| format!("pinguard: {}\n", line(r, why))));
            CONFIGURED.store(r, Relaxed);
            TOTAL.store(m.total.unwrap_or(0), Relaxed);
            RESERVE.store(r, Relaxed);
            record(m.available, 0, 0);
        }
        Err(why) => errors.push(line(r, why)),
    }
}

/// Whether a reserve is in force.
#[inline(always)]
pub fn on() -> bool {
    RESERVE.load(Relaxed) != OFF
}

/// The reserve in force, in bytes.
pub fn reserve() -> Option<u64> {
    Some(RESERVE.load(Relaxed)).filter(|&r| r != OFF)
}

/// The bytes the process budget may have handed out, with `used` handed out now: from the
/// latest reading, taken again first when it is due (then `true`: the cap is as fresh as a
/// refusal needs).
#[inline]
pub fn cap(used: u64) -> (u64, bool) {
    let stale = clock::coarse_monotonic_ms().saturating_sub(READ_MS.load(Relaxed)) >= READING_MS;
    let slack = SLACK.load(Relaxed);
    let due = stale || used.abs_diff(USED_AT.load(Relaxed)) > slack || RELEASED.load(Relaxed) > slack;
    if due {
        refresh(used);
    }
    (CAP.load(Relaxed).saturating_sub(RELEASED.load(Relaxed)), due)
}

/// A release of `bytes` the budget counted: room again only once a reading shows it.
#[inline]
pub fn released(bytes: u64) {
    RELEASED.fetch_add(bytes, Relaxed);
}

/// What `cap` allows for a reading: the settled bytes plus what the host can still give above
/// the floor; nothing more than is settled when the host is below it already.
pub fn cap_of(settled: u64, available: u64, reserve: u64) -> u64 {
    settled.saturating_add(available).saturating_sub(reserve)
}

/// What the process has pinned that a reading taken now reflects: its live pinned bytes, never
/// more than `held` (what the budget it is checked against holds for it).
pub fn settled(held: u64) -> u64 {
    crate::accounting::ledger::live_bytes().min(held)
}

/// Takes a reading now (`used`: the bytes reserved now); a bad one turns the reserve off.
#[cold]
#[inline(never)]
pub fn refresh(used: u64) {
    // Settled bytes first, then the file: a call that lands in between is in the file and not in
    // the settled bytes, which errs on the side of the floor.
    let settled = settled(used);
    // Releases until the file is read are in it; later ones stay counted for the next reading.
    let released = RELEASED.load(Relaxed);
    match kernel::host_memory() {
        Ok(m) => {
            record(m.available, settled, used);
            // Saturating: two readings at once each take their share off; wrapping would make
            // the room look gone (a refusal still reads afresh first, but needlessly).
            let _ = RELEASED.fetch_update(Relaxed, Relaxed, |r| Some(r.saturating_sub(released)));
        }
        Err(why) => turn_off(why),
    }
}

fn record(available: u64, settled: u64, used: u64) {
    let Some(r) = reserve() else { return };
    SETTLED.store(settled, Relaxed);
    noted(available);
    USED_AT.store(used, Relaxed);
    SLACK.store(available.saturating_sub(r) / MOVE_SHARE, Relaxed);
    CAP.store(cap_of(settled, available, r), Relaxed);
    READ_MS.store(clock::coarse_monotonic_ms().max(1), Relaxed);
}

/// A reading taken for this process (its own, or its group's): the report's figures.
pub fn noted(available: u64) {
    AVAILABLE.store(available, Relaxed);
    if available < LOWEST.load(Relaxed) {
        LOWEST.fetch_min(available, Relaxed);
    }
    READINGS.fetch_add(1, Relaxed);
}

/// The host's available memory as the latest reading and the calls since count it, with `used`
/// reserved now: what a refusal's event and `warn` line give.
pub fn available_now(used: u64) -> u64 {
    SETTLED.load(Relaxed).saturating_add(AVAILABLE.load(Relaxed)).saturating_sub(used).saturating_sub(RELEASED.load(Relaxed))
}

/// A reading that cannot be used: the reserve goes off for good, with one line on stderr (from
/// inside a pinning call: only a process that pins says it), and the report lists it.
#[cold]
pub fn turn_off(why: BadMeminfo) {
    if RESERVE.swap(OFF, Relaxed) == OFF {
        return;
    }
    CAP.store(u64::MAX, Relaxed);
    let i = BAD.iter().position(|&b| b == why).unwrap_or(0);
    BROKE.store(i as u8 + 1, Relaxed);
    if let Some(lines) = LINES.get() {
        log::write_stderr(&lines[i]); // one raw write: no allocation, no cancellation point
    }
}

/// Why the reserve went off after start-up, as printed (without the prefix).
pub fn problem() -> Option<&'static str> {
    let i = BROKE.load(Relaxed).checked_sub(1)? as usize;
    let l = LINES.get()?.get(i)?;
    Some(l.trim_start_matches("pinguard: ").trim_end())
}

/// The reserve's figures, once one was in force.
pub struct Snapshot {
    pub reserve: u64,
    pub total: u64,
    pub available: u64,
    pub lowest: u64,
    pub readings: u64,
}

pub fn snapshot() -> Option<Snapshot> {
    let reserve = Some(CONFIGURED.load(Relaxed)).filter(|&r| r != OFF)?;
    let available = AVAILABLE.load(Relaxed);
    let readings = READINGS.load(Relaxed);
    Some(Snapshot {
        reserve,
        total: TOTAL.load(Relaxed),
        available,
        lowest: LOWEST.load(Relaxed).min(available),
        readings,
    })
}

/// In a fork child: its own readings from its first pinning call on.
pub fn after_fork_child() {
    READ_MS.store(0, Relaxed);
    LOWEST.store(u64::MAX, Relaxed);
    READINGS.store(0, Relaxed);
    RELEASED.store(0, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_what_is_settled_plus_the_headroom_above_the_floor() {
        assert_eq!(cap_of(0, 10 << 30, 8 << 30), 2 << 30);
        assert_eq!(cap_of(1 << 30, 10 << 30, 8 << 30), 3 << 30, "what the process pinned is in the reading already");
        assert_eq!(cap_of(1 << 30, 8 << 30, 8 << 30), 1 << 30, "at the floor: nothing more");
        assert_eq!(cap_of(3 << 30, 6 << 30, 8 << 30), 1 << 30, "below it: less than is pinned, so nothing new fits");
        assert_eq!(cap_of(0, 1, u64::MAX - 1), 0);
        assert_eq!(cap_of(u64::MAX, u64::MAX, 0), u64::MAX, "no sum saturates into a refusal");
    }

    #[test]
    fn every_bad_reading_has_its_line() {
        for why in BAD {
            let l = line(1 << 30, why);
            assert!(l.starts_with("PINGUARD_HOST_RESERVE of 1.00 GiB: /proc/meminfo ") && l.ends_with("; running without a host reserve"), "{l}");
            assert!(l.contains(why.why()) && !l.contains('\n'));
        }
    }
}
