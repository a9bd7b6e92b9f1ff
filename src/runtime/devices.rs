//! What each runtime API said about its devices (whether each is integrated: its memory the
//! host's), one word per API, read by `track::device` on every device allocation. Kept here, below
//! the composition layer, so that a fork child and an unload can forget it.

use pinguard_common::vars::DeviceMemory;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// An answer is known (0: not yet asked).
pub const KNOWN: u64 = 1 << 63;
/// Every device is integrated: no device need be told apart.
pub const EVERY: u64 = 1 << 62;
/// Devices asked about, one bit each below `EVERY`; any beyond are taken for discrete.
pub const MAX_DEVICES: i32 = 62;

/// Per runtime API (`track::device::Runtime`): `KNOWN`, `EVERY` and a bit per integrated device.
pub static ANSWERS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// `PINGUARD_DEVICE_MEMORY` as first read (`DeviceMemory::ALL`'s index + 1; 0: not yet): a
/// discrete device's process never sets pinguard up, and reading the setting from the environment
/// at each allocation cost more than the allocation's own call (a walk of the environment).
static MODE: AtomicU8 = AtomicU8::new(0);

/// The setting as kept, if it was read.
#[inline(always)]
pub fn mode() -> Option<DeviceMemory> {
    match MODE.load(Ordering::Relaxed) {
        0 => None,
        m => DeviceMemory::ALL.get(m as usize - 1).copied(),
    }
}

/// Keeps the setting: the process's for its life (a fork child has the same settings).
pub fn keep_mode(m: DeviceMemory) {
    MODE.store(m as u8 + 1, Ordering::Relaxed);
}

/// Forgets every answer: a fork child, or a runtime unloaded (another may be loaded in its place).
pub fn forget() {
    for a in &ANSWERS {
        a.store(0, Ordering::Relaxed);
    }
}
