//! Ascend's driver layer (`libascend_hal.so`, CANN), below ACL: `halHostRegister`,
//! `halHostUnregister`, `halHostUnregisterEx`, and the virtual-memory calls `halMemCreate`,
//! `halMemRelease`, `halMemMap`, `halMemUnmap` at a host location, with the signatures and codes
//! of CANN's `ascend_hal.h` / `ascend_hal_define.h` / `ascend_hal_error.h` (`drvError_t`, an
//! enum passed as `int`). MemFabric and LMCache-Ascend pin host memory here; ACL's own calls reach
//! it from inside a hooked ACL call, where it passes through (counted once, by ACL).

use super::hooks;
use crate::api::Api;
use crate::track::{Codes, Hook, Request};
use std::os::raw::{c_int, c_void};

/// `DRV_ERROR_NONE`.
const SUCCESS: c_int = 0;
/// `DRV_ERROR_INVALID_VALUE`.
const INVALID_VALUE: c_int = 3;
/// `DRV_ERROR_OUT_OF_MEMORY`: a refusal over the budget.
const OUT_OF_MEMORY: c_int = 6;
/// `DRV_ERROR_NOT_SUPPORT`: also the answer when no driver library is behind the hook.
const NOT_SUPPORT: c_int = 0xfffe;
/// The driver's answers. A registration is never downgraded (the device maps it), so `already`
/// is never given; `DRV_ERROR_INVALID_VALUE` is what the driver says of a range it knows.
const CODES: Codes<c_int> = Codes {
    ok: SUCCESS,
    oom: OUT_OF_MEMORY,
    already: INVALID_VALUE,
};

/// `enum drvRegisterTpye` (the low bits of `flag`; `MEM_REGISTER_READ_ONLY` is bit 28 and the
/// process type sits at bit 16 and up).
const MAP_TYPE_MASK: u32 = 0xffff;
/// `HOST_MEM_MAP_DEV`, `HOST_SVM_MAP_DEV`, `HOST_MEM_MAP_DEV_PCIE_TH` (= `HOST_MEM_MAP_DEV_V2`),
/// `HOST_MEM_MAP_DMA`: host memory the driver pins for the device.
const HOST_MAPS: [u32; 4] = [0, 1, 3, 5];
/// `DEV_SVM_MAP_HOST`, `DEV_MEM_MAP_HOST`: device memory mapped for the host, and
/// `HOST_IO_MAP_DEV`: I/O memory (a NIC's doorbells) mapped for the device. No host RAM is pinned.
const UNPINNED_MAPS: [u32; 3] = [2, 4, 6];

/// What a registration with `flag` pins: `None` for no host RAM (passed through uncounted).
fn register_request(flag: u32) -> Option<Request> {
    let kind = flag & MAP_TYPE_MASK;
    if HOST_MAPS.contains(&kind) {
        Some(Request::Mapped)
    } else if UNPINNED_MAPS.contains(&kind) {
        None
    } else {
        Some(Request::Rejected) // DRV_ERROR_NOT_SUPPORT from the driver
    }
}

/// Every registration name's records, for either unregistration.
const REGISTERS: [Api; 1] = [Api::HalHostRegister];

unsafe fn host_register(
    h: Hook,
    real: halHostRegister::Call,
    src: *mut c_void,
    size: u64,
    flag: u32,
    _devid: u32,
    _dst: *mut *mut c_void,
) -> c_int {
    match register_request(flag) {
        None => h.untracked(Api::HalHostRegister, SUCCESS, real.call()),
        Some(req) => h.register(
            Api::HalHostRegister,
            src,
            size as usize,
            req,
            CODES,
            move || real.call(),
        ),
    }
}

unsafe fn host_unregister(
    h: Hook,
    real: halHostUnregister::Call,
    src: *mut c_void,
    _devid: u32,
) -> c_int {
    h.release(
        Api::HalHostUnregister,
        src,
        &REGISTERS,
        SUCCESS,
        move || real.call(),
    )
}

unsafe fn host_unregister_ex(
    h: Hook,
    real: halHostUnregisterEx::Call,
    src: *mut c_void,
    _devid: u32,
    flag: u32,
) -> c_int {
    if register_request(flag).is_none() {
        return h.untracked(Api::HalHostUnregisterEx, SUCCESS, real.call());
    }
    h.release(
        Api::HalHostUnregisterEx,
        src,
        &REGISTERS,
        SUCCESS,
        move || real.call(),
    )
}

/// `enum drv_mem_side`: `MEM_HOST_SIDE` 0, `MEM_DEV_SIDE` 1, `MEM_HOST_NUMA_SIDE` 2.
const HOST_SIDES: [u32; 2] = [0, 2];

/// `halMemCreate`: physical memory, counted when `prop->side` is the host's; device memory (and a
/// null `prop`, which the driver rejects) passes through. The device maps it: never downgraded.
unsafe fn mem_create(
    h: Hook,
    real: halMemCreate::Call,
    handle: *mut *mut c_void,
    size: usize,
    prop: *const u32,
    _flag: u64,
) -> c_int {
    // SAFETY: `prop` is the C caller's, null or a `struct drv_mem_prop`, whose first field
    // is `uint32_t side`.
    let host = !prop.is_null() && HOST_SIDES.contains(&unsafe { prop.read_unaligned() });
    let req = host.then_some(Request::Mapped);
    h.create_physical(
        Api::HalMemCreate,
        handle as *mut u64,
        size,
        req,
        CODES,
        move || real.call(),
    )
}

unsafe fn mem_release(h: Hook, real: halMemRelease::Call, handle: *mut c_void) -> c_int {
    h.release_physical(Api::HalMemRelease, handle as u64, SUCCESS, move || {
        real.call()
    })
}

unsafe fn mem_map(
    h: Hook,
    real: halMemMap::Call,
    ptr: *mut c_void,
    size: usize,
    _offset: usize,
    handle: *mut c_void,
    _flag: u64,
) -> c_int {
    h.map_physical(
        Api::HalMemMap,
        ptr as usize,
        size,
        handle as u64,
        SUCCESS,
        move || real.call(),
    )
}

/// `halMemUnmap` takes the mapping's start alone: the whole mapping there goes.
unsafe fn mem_unmap(h: Hook, real: halMemUnmap::Call, ptr: *mut c_void) -> c_int {
    h.unmap_physical(Api::HalMemUnmap, ptr as usize, 1, SUCCESS, move || {
        real.call()
    })
}

hooks! {
    family AscendHal, missing NOT_SUPPORT;
    /// Maps `size` bytes at `src` for device `devid` (pins host memory for the host map types),
    /// the device's address written to `dst`.
    fn halHostRegister(src: *mut c_void, size: u64, flag: u32, devid: u32, dst: *mut *mut c_void) -> c_int => enter host_register;
    /// Ends a registration.
    fn halHostUnregister(src: *mut c_void, devid: u32) -> c_int => release host_unregister;
    /// Ends a registration of the map type `flag` names.
    fn halHostUnregisterEx(src: *mut c_void, devid: u32, flag: u32) -> c_int => release host_unregister_ex;
    /// Physical memory on the side `prop` names; the handle written to `handle`.
    fn halMemCreate(handle: *mut *mut c_void, size: usize, prop: *const u32, flag: u64) -> c_int => enter mem_create;
    /// A physical allocation's reference released.
    fn halMemRelease(handle: *mut c_void) -> c_int => enter mem_release;
    /// A physical allocation mapped at `ptr`.
    fn halMemMap(ptr: *mut c_void, size: usize, offset: usize, handle: *mut c_void, flag: u64) -> c_int => enter mem_map;
    /// The mapping at `ptr` unmapped.
    fn halMemUnmap(ptr: *mut c_void) -> c_int => enter mem_unmap;
}
