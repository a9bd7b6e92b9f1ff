//! The virtual-memory APIs' physical host allocations (`cuMemCreate`, `aclrtMallocPhysical` and
//! their release, map, unmap and retain calls): counted from the creation until the last
//! reference is released and the last mapping unmapped (`accounting::physical`). The device maps
//! such memory, so pageable memory cannot stand in for it: under `downgrade` a call over the
//! budget is refused, as under `error`.

use super::{keep, quiet, Hook, Request};
use crate::accounting::ledger::{self, Backing, Live};
use crate::accounting::physical;
use crate::api::Api;

impl Hook {
    /// A physical allocation of `size` bytes; `host` says the caller asked for host memory (a
    /// device allocation passes through, uncounted). `handle` is where the runtime writes the new
    /// handle on success. `rejected`: arguments the runtime refuses (its own answer, untouched).
    #[allow(clippy::too_many_arguments)]
    pub fn create_physical<R: Copy + PartialEq>(
        self,
        api: Api,
        handle: *mut u64,
        size: usize,
        host: bool,
        rejected: bool,
        ok: R,
        oom: R,
        real: impl FnOnce() -> R,
    ) -> R {
        if handle.is_null() || size == 0 || !host {
            return self.untracked(api, ok, real());
        }
        let bytes = size as u64;
        let req = if rejected { Request::Rejected } else { Request::Mapped };
        let Some((site, admission)) = quiet(|| self.decide(api, bytes, req)) else {
            return real();
        };
        let Some(reservation) = self.pinned_only(admission) else { return oom };
        let rc = real();
        let err = self.errno();
        // SAFETY: on success the runtime wrote the new handle to `handle`, which is not null.
        let h = if rc == ok { unsafe { handle.read_unaligned() } } else { 0 };
        quiet(|| match (rc == ok, h) {
            (false, _) => ledger::count_failed(self.t, api),
            (true, 0) => {}
            (true, h) => {
                keep(reservation, bytes);
                if let Some(old) = physical::created(h, self.live(api, bytes, site, Backing::Pinned)) {
                    self.gone(&old);
                }
                ledger::count_alloc(self.t, api, site, bytes);
                ledger::live_delta(self.t, api, site, bytes as i64, 1, self.now());
            }
        });
        self.set_errno(err);
        rc
    }

    /// A reference to `handle` released (`cuMemRelease`, `aclrtFreePhysical`).
    pub fn release_physical<R: Copy + PartialEq>(self, api: Api, handle: u64, ok: R, real: impl FnOnce() -> R) -> R {
        let rc = real();
        let err = self.errno();
        quiet(|| {
            if rc != ok {
                ledger::count_failed(self.t, api);
            } else if let Some(l) = physical::released(handle) {
                self.gone_physical(&l);
            }
        });
        self.set_errno(err);
        rc
    }

    /// `handle` mapped at `[at, at + size)` (`cuMemMap`, `aclrtMapMem`).
    pub fn map_physical<R: Copy + PartialEq>(self, api: Api, at: usize, size: usize, handle: u64, ok: R, real: impl FnOnce() -> R) -> R {
        let rc = real();
        let err = self.errno();
        quiet(|| {
            if rc == ok {
                physical::mapped(at, size, handle);
            } else {
                ledger::count_failed(self.t, api);
            }
        });
        self.set_errno(err);
        rc
    }

    /// `[at, at + size)` unmapped (`cuMemUnmap`, `aclrtUnmapMem`).
    pub fn unmap_physical<R: Copy + PartialEq>(self, api: Api, at: usize, size: usize, ok: R, real: impl FnOnce() -> R) -> R {
        let rc = real();
        let err = self.errno();
        quiet(|| {
            if rc == ok {
                for l in physical::unmapped(at, size) {
                    self.gone_physical(&l);
                }
            } else {
                ledger::count_failed(self.t, api);
            }
        });
        self.set_errno(err);
        rc
    }

    /// One more reference to the allocation mapped at an address; the runtime writes its handle
    /// to `handle` (`cuMemRetainAllocationHandle`, `aclrtMemRetainAllocationHandle`).
    pub fn retain_physical<R: Copy + PartialEq>(self, api: Api, handle: *mut u64, ok: R, real: impl FnOnce() -> R) -> R {
        let rc = real();
        let err = self.errno();
        if rc == ok && !handle.is_null() {
            // SAFETY: on success the runtime wrote the handle to `handle`, which is not null.
            let h = unsafe { handle.read_unaligned() };
            quiet(|| physical::retained(h));
        } else if rc != ok {
            quiet(|| ledger::count_failed(self.t, api));
        }
        self.set_errno(err);
        rc
    }

    /// A physical allocation's memory is gone: its figures leave, its bytes go back.
    fn gone_physical(&self, l: &Live) {
        self.gone(l);
        ledger::count_release(self.t);
    }
}
