//! The virtual-memory APIs' physical host allocations (`cuMemCreate`, `aclrtMallocPhysical` and
//! their release, map, unmap and retain calls): counted from the creation until the last
//! reference is released and the last mapping unmapped (`accounting::physical`). The device maps
//! such memory, so pageable memory cannot stand in for it: under `downgrade` a call over the
//! budget is refused, as under `error`.

use super::{failed, keep, quiet, Codes, Hook, Request};
use crate::accounting::ledger::{self, Backing, Live};
use crate::accounting::physical;
use crate::api::Api;

impl Hook {
    /// A physical allocation of `size` bytes. `req`: `None` for device memory (passed through,
    /// uncounted); for host memory, `Rejected` for arguments the runtime refuses (its own answer,
    /// untouched), else `Mapped`. `handle` is where the runtime writes the new handle on success.
    pub fn create_physical<R: Copy + PartialEq + Into<i64>>(
        self,
        api: Api,
        handle: *mut u64,
        size: usize,
        req: Option<Request>,
        codes: Codes<R>,
        real: impl FnOnce() -> R,
    ) -> R {
        let Some(req) = req.filter(|_| !handle.is_null() && size != 0) else {
            return self.untracked(api, codes.ok, real());
        };
        let bytes = size as u64;
        let Some((site, admission)) = quiet(|| self.decide(api, bytes, req)) else {
            return real();
        };
        let Some(reservation) = self.pinned_only(admission) else {
            return codes.oom;
        };
        self.call(real, |&rc, _| {
            if rc != codes.ok {
                failed(self.t, api, site, bytes, rc.into() as i32);
                return;
            }
            // SAFETY: on success the runtime wrote the new handle to `handle`, which is not null.
            let h = unsafe { handle.read_unaligned() };
            if h != 0 {
                keep(reservation, bytes);
                if let Some(old) =
                    physical::created(h, self.live(api, bytes, site, Backing::Pinned))
                {
                    self.gone(&old);
                }
                ledger::count_alloc(self.t, api, site, bytes);
                ledger::live_delta(self.t, api, site, bytes as i64, 1, self.now());
            }
        })
    }

    /// A reference to `handle` released (`cuMemRelease`, `aclrtFreePhysical`).
    pub fn release_physical<R: Copy + PartialEq>(
        self,
        api: Api,
        handle: u64,
        ok: R,
        real: impl FnOnce() -> R,
    ) -> R {
        self.call(real, |&rc, _| {
            if rc != ok {
                ledger::count_failed(self.t, api);
            } else if let Some(l) = physical::released(handle) {
                self.gone_physical(&l);
            }
        })
    }

    /// `handle` mapped at `[at, at + size)` (`cuMemMap`, `aclrtMapMem`). A host allocation's
    /// mapping the runtime refuses has its event, at the mapping's own callsite.
    pub fn map_physical<R: Copy + PartialEq + Into<i64>>(
        self,
        api: Api,
        at: usize,
        size: usize,
        handle: u64,
        ok: R,
        real: impl FnOnce() -> R,
    ) -> R {
        self.call(real, |&rc, _| {
            if rc == ok {
                physical::mapped(at, size, handle);
            } else if physical::known(handle) {
                failed(self.t, api, self.site(), size as u64, rc.into() as i32);
            } else {
                ledger::count_failed(self.t, api);
            }
        })
    }

    /// `[at, at + size)` unmapped (`cuMemUnmap`, `aclrtUnmapMem`).
    pub fn unmap_physical<R: Copy + PartialEq>(
        self,
        api: Api,
        at: usize,
        size: usize,
        ok: R,
        real: impl FnOnce() -> R,
    ) -> R {
        self.call(real, |&rc, _| {
            if rc == ok {
                for l in physical::unmapped(at, size) {
                    self.gone_physical(&l);
                }
            } else {
                ledger::count_failed(self.t, api);
            }
        })
    }

    /// One more reference to the allocation mapped at an address; the runtime writes its handle
    /// to `handle` (`cuMemRetainAllocationHandle`, `aclrtMemRetainAllocationHandle`).
    pub fn retain_physical<R: Copy + PartialEq>(
        self,
        api: Api,
        handle: *mut u64,
        ok: R,
        real: impl FnOnce() -> R,
    ) -> R {
        self.call(real, |&rc, _| {
            if rc != ok {
                ledger::count_failed(self.t, api);
            } else if !handle.is_null() {
                // SAFETY: on success the runtime wrote the handle to `handle`, which is not null.
                physical::retained(unsafe { handle.read_unaligned() });
            }
        })
    }

    /// A physical allocation's memory is gone: its figures leave, its bytes go back.
    fn gone_physical(&self, l: &Live) {
        self.gone(l);
        ledger::count_release(self.t);
    }
}
