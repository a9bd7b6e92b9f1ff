//! RDMA memory registration (`libibverbs.so.1`, rdma-core): `ibv_reg_mr` (`IBVERBS_1.1`, and the
//! `IBVERBS_1.0` compatibility version), `ibv_reg_mr_iova` (`IBVERBS_1.7`), `ibv_reg_mr_iova2`
//! (`IBVERBS_1.8`, which `verbs.h`'s `ibv_reg_mr` macro calls for most access flags),
//! `ibv_reg_dmabuf_mr` (`IBVERBS_1.12`), `ibv_rereg_mr` and `ibv_dereg_mr` (`IBVERBS_1.1`), as
//! `libibverbs/verbs.h` and `libibverbs.map.in` declare them. A registration pins its pages in the
//! kernel (`ib_umem_get`, counted in `VmPin`) until it is deregistered; the record is keyed by the
//! `struct ibv_mr *` the library hands out, never read through (the `IBVERBS_1.0` layout differs).
//! NCCL takes these through `dlvsym(handle, name, version)`: each version found gets its own slot.

use super::hooks;
use crate::api::Api;
use crate::track::{Hook, Request};
use std::os::raw::{c_int, c_uint, c_void};

/// `IBV_ACCESS_ON_DEMAND`: the card faults pages in as it touches them; nothing is pinned.
const ON_DEMAND: c_uint = 1 << 6;
/// `IBV_ACCESS_LOCAL_WRITE` .. `IBV_ACCESS_FLUSH_PERSISTENT` (bits 0-9) and
/// `IBV_ACCESS_OPTIONAL_RANGE` (bits 20-29, which the library masks off where the kernel lacks them).
const ACCESS_FLAGS: c_uint = 0x3ff | 0x3ff0_0000;
/// `IBV_REREG_MR_CHANGE_TRANSLATION`: the registration moves to `addr`/`length`.
const CHANGE_TRANSLATION: c_int = 1;
/// `IBV_REREG_MR_CHANGE_ACCESS`: `access` replaces the registration's flags.
const CHANGE_ACCESS: c_int = 1 << 2;
/// `IBV_REREG_MR_ERR_DONT_FORK_NEW`: the new range could not be prepared, the old registration
/// still valid: the library's answer when it cannot take the new range, pinguard's over the budget.
const REREG_REFUSED: c_int = -2;
/// `IBV_REREG_MR_ERR_DO_FORK_OLD`: the new range is in place, only the old one's fork state failed.
const REREG_DO_FORK_OLD: c_int = -3;

/// What `ibv_dereg_mr` and `ibv_rereg_mr` take: any registration, whichever name made it.
const REGS: [Api; 5] = [
    Api::IbvRegMr,
    Api::IbvRegMrIova,
    Api::IbvRegMrIova2,
    Api::IbvRegDmabufMr,
    Api::IbvRegMrOnDemand,
];

/// The answer where no library is behind the hook: NULL or `EOPNOTSUPP`, `errno` `EOPNOTSUPP`.
pub trait NoLibrary {
    fn answer() -> Self;
}

impl NoLibrary for *mut c_void {
    fn answer() -> Self {
        // SAFETY: `__errno_location` is this thread's `errno`, always valid.
        unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
        std::ptr::null_mut()
    }
}

impl NoLibrary for c_int {
    fn answer() -> Self {
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
        libc::EOPNOTSUPP
    }
}

/// The host bytes a registration of `length` with `access` pins (none on demand), and whether the
/// library accepts its flags.
fn pins(length: usize, access: c_uint) -> (u64, Request) {
    let bytes = if access & ON_DEMAND != 0 {
        0
    } else {
        length as u64
    };
    (bytes, Request::from_flags(access, ACCESS_FLAGS, 0))
}

fn register(
    h: Hook,
    api: Api,
    addr: *mut c_void,
    length: usize,
    access: c_uint,
    real: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    let (bytes, req) = pins(length, access);
    let req = match req {
        Request::Rejected => Request::Rejected,
        _ => Request::Mapped,
    };
    // Recorded under its own name: an on-demand registration pins nothing.
    let api = match access & ON_DEMAND {
        0 => api,
        _ => Api::IbvRegMrOnDemand,
    };
    h.register_handle(api, addr as usize, bytes, req, real)
}

unsafe fn reg_mr(
    h: Hook,
    real: ibv_reg_mr::Call,
    _pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut c_void {
    register(
        h,
        Api::IbvRegMr,
        addr,
        length,
        access as c_uint,
        move || real.call(),
    )
}

unsafe fn reg_mr_iova(
    h: Hook,
    real: ibv_reg_mr_iova::Call,
    _pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    _iova: u64,
    access: c_int,
) -> *mut c_void {
    register(
        h,
        Api::IbvRegMrIova,
        addr,
        length,
        access as c_uint,
        move || real.call(),
    )
}

unsafe fn reg_mr_iova2(
    h: Hook,
    real: ibv_reg_mr_iova2::Call,
    _pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    _iova: u64,
    access: c_uint,
) -> *mut c_void {
    register(h, Api::IbvRegMrIova2, addr, length, access, move || {
        real.call()
    })
}

/// A dma-buf (device memory another driver exported): recorded, no host bytes.
// The C signature's six arguments, after the hook and the call the row hands every body.
#[allow(clippy::too_many_arguments)]
unsafe fn reg_dmabuf_mr(
    h: Hook,
    real: ibv_reg_dmabuf_mr::Call,
    _pd: *mut c_void,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    access: c_int,
) -> *mut c_void {
    // Never shown as on demand: no host pages either way.
    register(
        h,
        Api::IbvRegDmabufMr,
        std::ptr::null_mut(),
        0,
        access as c_uint & !ON_DEMAND,
        move || real.call(),
    )
}

// The C signature's six arguments, after the hook and the call the row hands every body.
#[allow(clippy::too_many_arguments)]
unsafe fn rereg_mr(
    h: Hook,
    real: ibv_rereg_mr::Call,
    mr: *mut c_void,
    flags: c_int,
    _pd: *mut c_void,
    _addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    if mr.is_null() || flags & CHANGE_TRANSLATION == 0 {
        return h.reregister_handle(
            mr,
            &REGS,
            |_| None,
            REREG_REFUSED,
            |_| false,
            move || real.call(),
        );
    }
    // Without CHANGE_ACCESS the registration keeps its flags: one on demand (recorded with no
    // bytes) stays so.
    let access = access as c_uint;
    let to = move |old: u64| match flags & CHANGE_ACCESS {
        0 if old == 0 => Some(0),
        0 => Some(length as u64),
        _ => Some(pins(length, access).0),
    };
    h.reregister_handle(
        mr,
        &REGS,
        to,
        REREG_REFUSED,
        |rc| rc == 0 || rc == REREG_DO_FORK_OLD,
        move || real.call(),
    )
}

unsafe fn dereg_mr(h: Hook, real: ibv_dereg_mr::Call, mr: *mut c_void) -> c_int {
    h.release(Api::IbvDeregMr, mr, &REGS, 0, move || real.call())
}

hooks! {
    family Ibverbs, missing NoLibrary::answer();
    /// Registers `length` bytes at `addr` with the card (pins them), `access` the `IBV_ACCESS_*` flags.
    fn ibv_reg_mr(pd: *mut c_void, addr: *mut c_void, length: usize, access: c_int) -> *mut c_void => enter reg_mr;
    /// The same at the card's address `iova`.
    fn ibv_reg_mr_iova(pd: *mut c_void, addr: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut c_void => enter reg_mr_iova;
    /// The same, taking the optional access flags (what `verbs.h`'s macros call).
    fn ibv_reg_mr_iova2(pd: *mut c_void, addr: *mut c_void, length: usize, iova: u64, access: c_uint) -> *mut c_void => enter reg_mr_iova2;
    /// Registers a dma-buf (device memory): no host pages.
    fn ibv_reg_dmabuf_mr(pd: *mut c_void, offset: u64, length: usize, iova: u64, fd: c_int, access: c_int) -> *mut c_void => enter reg_dmabuf_mr;
    /// Moves a registration to another range, domain or access.
    fn ibv_rereg_mr(mr: *mut c_void, flags: c_int, pd: *mut c_void, addr: *mut c_void, length: usize, access: c_int) -> c_int => enter rereg_mr;
    /// Ends a registration (unpins its pages).
    fn ibv_dereg_mr(mr: *mut c_void) -> c_int => release dereg_mr;
}
