//! What each runtime API said about its devices (whether each is integrated: its memory the
//! host's), one word per API, read by `track::device` on every device allocation. Kept here, below
//! the composition layer, so that a fork child and an unload can forget it.

use std::sync::atomic::{AtomicU64, Ordering};

/// An answer is known (0: not yet asked).
pub const KNOWN: u64 = 1 << 63;
/// Every device is integrated: no device need be told apart.
pub const EVERY: u64 = 1 << 62;
/// Devices asked about, one bit each below `EVERY`; any beyond are taken for discrete.
pub const MAX_DEVICES: i32 = 62;

/// Per runtime API (`track::device::Runtime`): `KNOWN`, `EVERY` and a bit per integrated device.
pub static ANSWERS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// Forgets every answer: a fork child, or a runtime unloaded (another may be loaded in its place).
pub fn forget() {
    for a in &ANSWERS {
        a.store(0, Ordering::Relaxed);
    }
}
