//! CUDA's stream-ordered host memory pools (`cuMemPoolCreate`, `cudaMemPoolCreate` and their
//! allocations, frees, trims and destruction): a host pool's pinned figure is its reserved memory,
//! read from the runtime after every call that can change it (`accounting::pools`). An
//! allocation goes through the budget for what it may add: nothing when the pool has room for it,
//! else its size (the pool's rounding up to its own granule is counted as it comes). The device
//! maps pool memory, so `downgrade` refuses as `error` does. Device pools pass through.

use super::{quiet, Codes, Hook, Request};
use crate::accounting::ledger::{self, Backing};
use crate::accounting::pools;
use crate::api::Api;
use crate::budget;

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` and `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` (the runtime's
/// `cudaMemPoolAttr` has the same numbers).
pub const RESERVED_MEM_CURRENT: i32 = 5;
pub const USED_MEM_CURRENT: i32 = 7;

/// A runtime's pool calls (the driver's or the runtime's): its answers, and how it reads a pool's
/// attribute (`read(pool, attribute)`).
#[derive(Clone, Copy)]
pub struct PoolApi<R> {
    pub codes: Codes<R>,
    pub read: fn(u64, i32) -> Option<u64>,
}

impl Hook {
    /// A pool handed to the program: made by it (`made`: `cuMemPoolCreate`, `cudaMemPoolCreate`)
    /// or a location's default or current pool (CUDA 13's `cuMemGetDefaultMemPool`,
    /// `cuMemGetMemPool` and the runtime's). A host pool is counted from here on, under this call,
    /// at whatever it reserves already; one known already stays as it is, unless it was just made
    /// (a record under a reused handle is one whose end pinguard missed). The runtime writes the
    /// pool's handle to `pool`.
    pub fn pool_handed_out<R: Copy + PartialEq>(
        self,
        api: Api,
        pool: *mut u64,
        host: bool,
        made: bool,
        rt: PoolApi<R>,
        real: impl FnOnce() -> R,
    ) -> R {
        if pool.is_null() || !host {
            return self.untracked(api, rt.codes.ok, real());
        }
        let site = quiet(|| self.site());
        self.call(real, |&rc, _| {
            if rc != rt.codes.ok {
                ledger::count_failed(self.t, api);
                return;
            }
            // SAFETY: on success the runtime wrote the pool's handle to `pool`, not null.
            let h = unsafe { pool.read_unaligned() };
            let Some(site) = site.filter(|_| h != 0) else {
                return;
            };
            let known = pools::get(h);
            if known.is_none() || made {
                if let Some(old) = pools::created(h, self.live(api, 0, site, Backing::Pinned)) {
                    self.pool_gone(old.size, &old);
                }
            }
            self.pool_moved(h, &rt.read, 0);
        })
    }

    /// An allocation of `size` bytes from `pool`; the runtime writes its address to `out`.
    pub fn alloc_from_pool<R: Copy + PartialEq + Into<i64>>(
        self,
        api: Api,
        out: *mut usize,
        size: usize,
        pool: u64,
        rt: PoolApi<R>,
        real: impl FnOnce() -> R,
    ) -> R {
        let tracked = !out.is_null() && size > 0 && quiet(|| pools::get(pool)).flatten().is_some();
        if !tracked {
            return self.untracked(api, rt.codes.ok, real());
        }
        // What the call may add to the pool's reserved memory: nothing if it has room.
        let room = match (
            (rt.read)(pool, RESERVED_MEM_CURRENT),
            (rt.read)(pool, USED_MEM_CURRENT),
        ) {
            (Some(r), Some(u)) => r.saturating_sub(u),
            _ => 0,
        };
        let bytes = size as u64;
        let expect = if bytes <= room { 0 } else { bytes };
        let Some((site, admission)) = quiet(|| self.decide(api, expect, Request::Mapped)) else {
            return real();
        };
        let Some(reservation) = self.pinned_only(admission) else {
            return rt.codes.oom;
        };
        let paid = reservation.as_ref().map_or(0, |r| r.bytes());
        self.call(real, |&rc, _| {
            if rc != rt.codes.ok {
                super::failed(self.t, api, site, bytes, rc.into() as i32);
                return;
            }
            if let Some(r) = reservation {
                r.commit();
            }
            // SAFETY: on success the runtime wrote the allocation's address to `out`, not null.
            let addr = unsafe { out.read_unaligned() };
            pools::allocated(pool, addr);
            ledger::count_alloc(self.t, api, site, bytes);
            self.pool_moved(pool, &rt.read, paid);
        })
    }

    /// The allocation at `addr` freed back to its pool.
    pub fn free_to_pool<R: Copy + PartialEq>(
        self,
        api: Api,
        addr: usize,
        rt: PoolApi<R>,
        real: impl FnOnce() -> R,
    ) -> R {
        let Some(pool) = quiet(|| pools::freed(addr)).flatten() else {
            return self.untracked(api, rt.codes.ok, real()); // a device pool's, or one pinguard never saw
        };
        self.call(real, |&rc, _| {
            if rc == rt.codes.ok {
                ledger::count_release(self.t);
                self.pool_moved(pool, &rt.read, 0);
            } else {
                pools::allocated(pool, addr);
                ledger::count_failed(self.t, api);
            }
        })
    }

    /// A trim or a destruction of `pool` (`destroy`): its reserved memory read again after it.
    pub fn shrink_pool<R: Copy + PartialEq>(
        self,
        api: Api,
        pool: u64,
        destroy: bool,
        rt: PoolApi<R>,
        real: impl FnOnce() -> R,
    ) -> R {
        self.call(real, |&rc, _| {
            if rc != rt.codes.ok {
                ledger::count_failed(self.t, api);
                return;
            }
            if pools::get(pool).is_none() {
                return;
            }
            if destroy {
                pools::destroyed(pool);
            }
            self.pool_moved(pool, &rt.read, 0);
        })
    }

    /// Reads the pool's reserved memory and moves its figures and the budget by the change;
    /// `paid` is what this call already took from the budget for it.
    fn pool_moved(&self, pool: u64, read: &dyn Fn(u64, i32) -> Option<u64>, paid: u64) {
        // A destroyed pool with nothing left cannot be asked: the runtime freed its memory.
        let now = match read(pool, RESERVED_MEM_CURRENT) {
            Some(r) => Some(r),
            None => pools::destroyed_and_empty(pool).then_some(0),
        };
        let Some(now) = now else {
            budget::release(paid); // nothing known to have grown
            return;
        };
        let Some(before) = pools::reserved(pool, now) else {
            budget::release(paid);
            return;
        };
        let delta = now as i64 - before.size as i64;
        let count = match (before.size > 0, now > 0) {
            (false, true) => 1,
            (true, false) => -1,
            _ => 0,
        };
        if delta != 0 || count != 0 {
            ledger::live_delta(self.t, before.api, before.site, delta, count, self.now());
        }
        // Live figures first, budget second (as for any release).
        let grown = delta.max(0) as u64;
        if grown > paid {
            budget::force(grown - paid);
        } else {
            budget::release(paid - grown);
        }
        if delta < 0 {
            budget::release(delta.unsigned_abs());
        }
    }

    /// A pool record replaced under its handle: its reserved figure goes.
    #[cold]
    fn pool_gone(&self, reserved: u64, old: &crate::accounting::ledger::Live) {
        if reserved > 0 {
            ledger::live_delta(
                self.t,
                old.api,
                old.site,
                -(reserved as i64),
                -1,
                self.now(),
            );
            budget::release(reserved);
        }
    }
}
