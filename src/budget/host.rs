//! The host reserve (`PINGUARD_HOST_RESERVE`): pinning calls never take the host's available
//! memory (`MemAvailable` in `/proc/meminfo`) below a floor: a `Floor` (`floor.rs`) over that
//! figure. In a group, the group's shared reading decides instead, under the group's lock
//! (`group`), so that members cannot each take the same headroom.
//!
//! A reading that cannot be used (no `/proc/meminfo`, no `MemAvailable` in it) turns the reserve
//! off, with one line on stderr: a bad reading never refuses a call.

use super::floor::{Floor, Reading, Snapshot, Source};
use crate::runtime::kernel::{self, BadMeminfo};
use pinguard_common::vars;

const BAD: [BadMeminfo; 3] = [
    BadMeminfo::Unreadable,
    BadMeminfo::NoAvailable,
    BadMeminfo::AboveTotal,
];
const WHYS: [&str; 3] = [BAD[0].why(), BAD[1].why(), BAD[2].why()];

fn read() -> Result<Reading, usize> {
    match kernel::host_memory() {
        Ok(m) => Ok(Reading {
            available: m.available,
            total: m.total,
        }),
        Err(why) => Err(BAD.iter().position(|&b| b == why).unwrap_or(0)),
    }
}

static FLOOR: Floor = Floor::new(Source {
    var: &vars::HOST_RESERVE,
    read,
    whys: &WHYS,
    file: "/proc/meminfo",
});

/// Sets the reserve up with a first reading; a reading that cannot be used leaves it off, with
/// the line in `errors` (printed, as every bad setting is, once the process pins).
pub fn init(reserve: Option<u64>, errors: &mut Vec<String>) {
    FLOOR.init(reserve, errors)
}

/// Whether a reserve is in force.
#[inline(always)]
pub fn on() -> bool {
    FLOOR.on()
}

/// The reserve in force, in bytes.
pub fn reserve() -> Option<u64> {
    FLOOR.reserve()
}

pub fn floor() -> &'static Floor {
    &FLOOR
}

/// A reading taken for this process by its group: the report's figures.
pub fn noted(available: u64) {
    FLOOR.noted(available)
}

/// A reading that cannot be used: the reserve goes off for good, with one line on stderr.
#[cold]
pub fn turn_off(why: BadMeminfo) {
    FLOOR.turn_off(BAD.iter().position(|&b| b == why).unwrap_or(0))
}

/// Why the reserve went off after start-up, as printed (without the prefix).
pub fn problem() -> Option<&'static str> {
    FLOOR.problem()
}

pub fn snapshot() -> Option<Snapshot> {
    FLOOR.snapshot()
}

/// The host's available memory as the latest reading and the calls since count it.
pub fn available_now(used: u64) -> u64 {
    FLOOR.available_now(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_reading_has_its_line() {
        let mut errors = Vec::new();
        for (i, why) in BAD.iter().enumerate() {
            let f = Floor::new(Source {
                var: &vars::HOST_RESERVE,
                read: || Err(0),
                whys: &WHYS,
                file: "/proc/meminfo",
            });
            f.init(Some(1 << 30), &mut errors);
            let l = &errors[i];
            assert!(
                l.starts_with("PINGUARD_HOST_RESERVE of 1.00 GiB: /proc/meminfo ")
                    && l.ends_with("; running WITHOUT a host reserve"),
                "{l}"
            );
            assert!(l.contains(BAD[0].why()) && !l.contains('\n'), "{l} {why:?}");
        }
    }
}
