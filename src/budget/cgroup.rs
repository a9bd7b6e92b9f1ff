//! The cgroup reserve (`PINGUARD_CGROUP_RESERVE`): pinning calls never take this process's memory
//! cgroup below a headroom before its OOM killer (the least, over the limited levels of its path,
//! of limit - usage + inactive file pages; `runtime::cgroup`): a `Floor` (`floor.rs`) over that
//! figure. Inside a container `/proc/meminfo` is the host's, so the host reserve cannot keep a
//! container from its own OOM kill; this can. Pages the cgroup does not charge (many drivers'
//! own allocations) never move the headroom, and so are never stopped by it: `pinguard doctor
//! --probe` tells which paths a node charges.
//!
//! A reading that cannot be used (no memory group, no limit on the path, a limited level that
//! cannot be read) turns the reserve off, with one line on stderr: a bad reading never refuses a
//! call.

use super::floor::{Floor, Reading, Source};
use crate::runtime::cgroup::{self, WHYS};
use pinguard_common::vars;

fn read() -> Result<Reading, usize> {
    match cgroup::headroom() {
        Ok(h) => Ok(Reading {
            available: h.bytes,
            total: Some(h.limit),
        }),
        Err(why) => Err(why as usize),
    }
}

static FLOOR: Floor = Floor::new(Source {
    var: &vars::CGROUP_RESERVE,
    read,
    whys: &WHYS,
    file: "the memory cgroup's files",
});

/// Finds the cgroup and takes a first reading; where either fails the reserve stays off, with the
/// line in `errors`.
pub fn init(reserve: Option<u64>, errors: &mut Vec<String>) {
    if reserve.is_some() {
        cgroup::init();
    }
    FLOOR.init(reserve, errors)
}

/// The floor itself: `on`, `reserve`, `problem`, `snapshot`, `available_now` (the host reserve
/// keeps wrappers of its own because the group's ledger reads it by name).
#[inline(always)]
pub fn floor() -> &'static Floor {
    &FLOOR
}
