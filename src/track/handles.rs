//! Registrations the runtime answers with a handle rather than a code: RDMA's `ibv_reg_mr` and its
//! siblings give a `struct ibv_mr *` (NULL with `errno` on failure), which `ibv_rereg_mr` may move
//! to another range and `ibv_dereg_mr` ends. The record is keyed by the handle: the card may hold
//! several registrations of one range (one per protection domain), each pinning it again in the
//! kernel (`VmPin` counts each). The card reads the pages by DMA, so pageable memory can never
//! stand in: under `downgrade` a call over the budget is refused as under `error`.

use super::{failed, keep, quiet, Admission, Hook, Request};
use crate::accounting::ledger;
use crate::api::Api;
use std::os::raw::{c_int, c_void};

impl Hook {
    /// A registration of `bytes` whose answer is a handle, NULL (with `errno`) on failure.
    /// `bytes` 0: the call pins nothing of the host's (on-demand paging, a dma-buf of device
    /// memory), recorded with its callsite and no bytes. Over the budget: NULL with `ENOMEM`, the
    /// library's own answer when the kernel cannot pin, and the real function is not called.
    pub fn register_handle(
        self,
        api: Api,
        addr: usize,
        bytes: u64,
        req: Request,
        real: impl FnOnce() -> *mut c_void,
    ) -> *mut c_void {
        let req = if bytes == 0 { Request::Rejected } else { req };
        if bytes != 0 && req != Request::Rejected {
            if let Some(pinned) = quiet(|| self.pinned_by_others(addr, bytes)).flatten() {
                return self.register_handle_shared(api, addr, bytes, pinned, req, real);
            }
        }
        let Some((site, admission)) = quiet(|| self.decide(api, bytes, req)) else {
            return real();
        };
        let reservation = match admission {
            Admission::Refuse | Admission::Downgrade(_) => {
                return self.fail(std::ptr::null_mut(), libc::ENOMEM)
            }
            Admission::Pin(r) => Some(r),
            Admission::Pass => None,
        };
        self.call(real, |&mr, err| match mr as usize {
            0 => failed(self.t, api, site, bytes, err),
            h => self.pinned(api, h, bytes, site, reservation),
        })
    }

    /// `register_handle` over memory another route pins already (`pinned` of its `bytes`): only
    /// the rest goes through the budget, and the registration joins the routes it shares pages
    /// with under its handle (`track::shared`).
    #[cold]
    fn register_handle_shared(
        self,
        api: Api,
        addr: usize,
        bytes: u64,
        pinned: u64,
        req: Request,
        real: impl FnOnce() -> *mut c_void,
    ) -> *mut c_void {
        let growth = bytes.saturating_sub(pinned);
        let Some((site, admitted)) = quiet(|| {
            let site = self.site();
            let admission = if growth == 0 {
                Admission::Pass
            } else {
                self.admit(api, growth, site, req)
            };
            (site, admission)
        }) else {
            return real();
        };
        let reservation = match admitted {
            Admission::Refuse | Admission::Downgrade(_) => {
                return self.fail(std::ptr::null_mut(), libc::ENOMEM)
            }
            Admission::Pin(r) => Some(r),
            Admission::Pass => None,
        };
        self.call(real, |&mr, err| match mr as usize {
            0 => failed(self.t, api, site, bytes, err),
            h => self.pinned_shared(api, h, addr, bytes, site, reservation),
        })
    }

    /// `ibv_rereg_mr`: `to` gives the registration's new size from its old one when the call
    /// moves it to another range (`None`: the same pages). Growth goes through the budget
    /// (refused: `refused`, with `ENOMEM`, the old registration still valid); `moved` tells which
    /// answers put the new range in place. The record keeps its callsite and entry point; a refusal
    /// is `ibv_rereg_mr`'s, at the registration's callsite (no second walk).
    pub fn reregister_handle(
        self,
        handle: *mut c_void,
        regs: &[Api],
        to: impl FnOnce(u64) -> Option<u64>,
        refused: c_int,
        moved: impl Fn(c_int) -> bool,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let taken = quiet(|| ledger::take(handle as usize, |a| regs.contains(&a))).flatten();
        let Some(l) = taken else {
            return real();
        };
        let Some(to) = to(l.size) else {
            quiet(|| ledger::insert(handle as usize, l));
            return real();
        };
        let extra = to.saturating_sub(l.size);
        let admission = if extra == 0 {
            Some(Admission::Pass)
        } else {
            quiet(|| self.admit(Api::IbvReregMr, extra, l.site, Request::Mapped))
        };
        let reservation = match admission {
            Some(Admission::Pin(r)) => Some(r),
            Some(Admission::Pass) | None => None,
            Some(Admission::Refuse | Admission::Downgrade(_)) => {
                quiet(|| ledger::insert(handle as usize, l));
                return self.fail(refused, libc::ENOMEM);
            }
        };
        self.call(real, |&rc, err| {
            let mut now = l;
            if moved(rc) {
                now.size = to;
                if to > l.size {
                    keep(reservation, extra);
                } else {
                    crate::budget::release(l.size - to);
                }
                let delta = to as i64 - l.size as i64;
                ledger::live_delta(self.t, l.api, l.site, delta, 0, self.now());
            }
            if rc != 0 {
                // Its `errno` says why (rdma-core's answer is only which step failed).
                failed(self.t, Api::IbvReregMr, l.site, to, err);
            }
            let _ = ledger::insert(handle as usize, now);
        })
    }
}
