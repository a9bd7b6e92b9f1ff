//! The clock: wall time for the report and the records, and when pinguard started in this
//! process (a fork child starts again; the `%t` of a report path and the report's
//! `start_unix_ms`).

use std::sync::atomic::{AtomicU64, Ordering};

static START_MS: AtomicU64 = AtomicU64::new(0);

/// Marks now as this process's start (at start-up, and in a fork child).
pub fn mark_start() {
    START_MS.store(unix_ms(), Ordering::Relaxed);
}

pub fn start_ms() -> u64 {
    START_MS.load(Ordering::Relaxed)
}

pub fn unix_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec and CLOCK_REALTIME is always supported.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Milliseconds since the epoch from the coarse clock (a few ms of resolution, a fraction of the
/// cost): for the timestamps taken on every tracked call.
pub fn coarse_unix_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec and CLOCK_REALTIME_COARSE exists on every Linux we run on.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Milliseconds of `CLOCK_MONOTONIC_COARSE`: the age of a cached reading, taken on every pinning
/// call that reading guards (a vDSO read, no system call); never set back.
pub fn coarse_monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec and CLOCK_MONOTONIC_COARSE exists on every Linux we run on.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Milliseconds of `CLOCK_MONOTONIC`: the same clock for every process of the host (in one time
/// namespace), and never set back; the group's ledger keeps its deadlines and readings in it.
pub fn monotonic_ms() -> u64 {
    monotonic_ns() / 1_000_000
}

/// Nanoseconds of `CLOCK_MONOTONIC`: a bounded wait's deadline.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec and CLOCK_MONOTONIC is always supported.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
