//! Memory the host figures get wrong either way: registrations of I/O memory (a device's
//! registers, a NIC's doorbells, which NVSHMEM and DeepEP map for the GPU) are no host RAM, and
//! pass through whatever the budget, recorded with no bytes; device allocations on a device whose
//! memory is the host's (integrated GPUs, APUs) are host RAM no container limit sees, counted as
//! host bytes when `PINGUARD_DEVICE_MEMORY` says so. Whether a device is integrated is asked once
//! per runtime API, through the API the program itself uses, and kept until a fork or an unload
//! (`runtime::devices`).

use super::{quiet, Hook, PutBack};
use crate::accounting::ledger;
use crate::api::{Api, Family};
use crate::runtime::config::DeviceMemory;
use crate::runtime::devices::{ANSWERS, EVERY, KNOWN, MAX_DEVICES};
use crate::runtime::guard::{self, Reentry};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::Ordering;

impl Hook {
    /// A registration of I/O memory: the runtime's own call and answer whatever the policy and
    /// the budget (nothing of the host's is pinned, and pageable memory cannot stand in for a
    /// device's registers), recorded under `api` with its callsite and no bytes, so that the
    /// report lists it and its unregistration finds it.
    pub fn register_io<R: Copy + PartialEq>(
        self,
        api: Api,
        addr: *mut c_void,
        ok: R,
        real: impl FnOnce() -> R,
    ) -> R {
        if addr.is_null() {
            return self.untracked(api, ok, real());
        }
        let site = quiet(|| self.site());
        self.call(real, |&rc, _| match site {
            _ if rc != ok => ledger::count_failed(self.t, api),
            Some(site) => self.pinned(api, addr as usize, 0, site, None),
            None => {}
        })
    }
}

impl Hook {
    /// `cudaFree` and its twins, once some device allocation may have been counted: the record's
    /// release, or, with none (a discrete device's memory, memory allocated before counting
    /// began, `cudaFree(NULL)`), the runtime's own call, no figure moved.
    pub fn release_device<R: Copy + PartialEq>(
        self,
        api: Api,
        addr: *mut c_void,
        frees: &[Api],
        ok: R,
        real: impl FnOnce() -> R,
    ) -> R {
        let taken = match addr.is_null() {
            true => None,
            false => quiet(|| ledger::take(addr as usize, |a| frees.contains(&a))).flatten(),
        };
        let Some(l) = taken else {
            return real();
        };
        // Should `real` unwind, the record goes back: the runtime still holds the memory.
        let back = PutBack(addr as usize, &l);
        let rc = self.call(real, |&rc, _| {
            if rc == ok {
                self.gone(&l);
                ledger::count_release(self.t);
            } else {
                let _ = ledger::insert(addr as usize, l);
                ledger::count_failed(self.t, api);
            }
        });
        back.disarm();
        rc
    }
}

/// The runtime APIs that are asked about their devices, each for itself: a program that uses the
/// driver is answered by the driver.
#[derive(Clone, Copy)]
pub enum Runtime {
    Cuda = 0,
    Driver = 1,
    Hip = 2,
}

impl Runtime {
    fn family(self) -> Family {
        match self {
            Runtime::Cuda => Family::Cuda,
            Runtime::Driver => Family::CudaDriver,
            Runtime::Hip => Family::Hip,
        }
    }
}

/// How a runtime API answers about its devices (its own calls); `None` where it cannot.
pub struct DeviceQuery {
    /// How many devices there are.
    pub count: fn() -> Option<c_int>,
    /// Whether the device of this ordinal is integrated.
    pub integrated: fn(c_int) -> Option<bool>,
    /// The ordinal of the calling thread's current device.
    pub current: fn() -> Option<c_int>,
}

/// Whether a device allocation through `runtime` counts as host bytes. Once asked, one load for
/// the setting and one for the answer, unless some devices are integrated and others are not
/// (then the current device is asked at each allocation).
#[inline(always)]
pub fn counts(runtime: Runtime, q: &DeviceQuery) -> bool {
    match crate::lifecycle::device_memory() {
        DeviceMemory::Device => false,
        DeviceMemory::Host => true,
        DeviceMemory::Auto => integrated(runtime, q),
    }
}

/// Whether a device allocation through `runtime` may have been counted: a release looks for its
/// record only then (it never asks the runtime itself).
#[inline(always)]
pub fn may_count(runtime: Runtime) -> bool {
    match crate::lifecycle::device_memory() {
        DeviceMemory::Device => false,
        DeviceMemory::Host => true,
        DeviceMemory::Auto => ANSWERS[runtime as usize].load(Ordering::Relaxed) & !KNOWN != 0,
    }
}

#[inline(always)]
fn integrated(runtime: Runtime, q: &DeviceQuery) -> bool {
    let a = ANSWERS[runtime as usize].load(Ordering::Relaxed);
    if a & EVERY != 0 {
        return true;
    }
    if a == KNOWN {
        return false;
    }
    integrated_slow(runtime, q, a)
}

/// Not asked yet, or devices of both kinds.
#[cold]
#[inline(never)]
fn integrated_slow(runtime: Runtime, q: &DeviceQuery, a: u64) -> bool {
    let a = match a {
        0 => match ask(runtime.family(), q) {
            Some(a) => {
                ANSWERS[runtime as usize].store(a, Ordering::Relaxed);
                a
            }
            None => return false,
        },
        a => a,
    };
    if a & EVERY != 0 {
        return true;
    }
    if a == KNOWN {
        return false;
    }
    let e = guard::errno();
    let current = (q.current)();
    guard::set_errno(e);
    current.is_some_and(|d| (0..MAX_DEVICES).contains(&d) && a & (1 << d) != 0)
}

/// The runtime's answer for every device; `None` when it is not to be asked now (this call is
/// nested inside another hooked call, whose own asking comes first) or cannot answer yet (no
/// device, the driver not initialised: the allocation fails too, and the next one asks again). A
/// device that cannot answer is taken for discrete, and so is every device of a family that is
/// not hooked (nothing of it is counted, and it is never asked).
fn ask(family: Family, q: &DeviceQuery) -> Option<u64> {
    if !crate::lifecycle::hooks_enabled(family) {
        return Some(KNOWN);
    }
    let _inside = Reentry::enter()?;
    let e = guard::errno();
    let n = (q.count)();
    guard::set_errno(e);
    let n = n?.clamp(0, MAX_DEVICES);
    let mask = (0..n)
        .filter(|&d| (q.integrated)(d) == Some(true))
        .fold(0u64, |m, d| m | 1 << d);
    guard::set_errno(e);
    let every = if n > 0 && mask == (1u64 << n) - 1 {
        EVERY
    } else {
        0
    };
    Some(KNOWN | every | mask)
}
