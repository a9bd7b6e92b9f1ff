//! Huawei Ascend ACL (`libascendcl`): host allocation and registration. `aclError` is `int`.

use super::hooks;
use crate::api::Api;
use crate::track::{Codes, Hook, Request};
use std::os::raw::{c_int, c_void};

const SUCCESS: c_int = 0;
/// `ACL_ERROR_RT_MEMORY_ALLOCATION`: torch_npu reads it as out of memory.
const MEMORY_ALLOCATION: c_int = 207001;
/// `ACL_ERROR_INVALID_PARAM`: what the runtime answers for memory registered twice.
const INVALID_PARAM: c_int = 100000;
/// ACL's answers (`aclError`): memory registered twice is an invalid parameter to it.
const CODES: Codes<c_int> = Codes {
    ok: SUCCESS,
    oom: MEMORY_ALLOCATION,
    already: INVALID_PARAM,
};
/// `ACL_ERROR_UNINITIALIZE`, when no runtime can be found behind the hook.
const UNINITIALIZE: c_int = 100001;
/// `ACL_HOST_REG_MAPPED` for `aclrtHostRegisterV2`: the device maps the page, so it must be pinned.
const REG_MAPPED: u32 = 0x2;
/// `ACL_HOST_REG_MAPPED | ACL_HOST_REG_PINNED`.
const REG_FLAGS: u32 = 0x1000_0002;
/// `ACL_HOST_REGISTER_MAPPED`, the one `aclrtHostRegisterType`.
const REGISTER_MAPPED: c_int = 0;

/// `ACL_MEM_ALLOCATION_TYPE_PINNED`, `aclrtPhysicalMemProp::allocationType` (at byte 4).
const ALLOCATION_PINNED: u32 = 0;
/// `aclrtMemLocationType` host kinds (`ACL_MEM_LOCATION_TYPE_HOST`, `_HOST_NUMA`). The location
/// is `{id, type}`, id first (the reverse of CUDA's), so the type is at byte 16.
const LOCATION_HOST: [u32; 2] = [0, 4];

/// Whether an `aclrtPhysicalMemProp` asks for pinned host memory (from the location's type,
/// never from `memAttr`), and whether the call is one the runtime rejects anyway (`flags` is
/// reserved and must be 0).
unsafe fn host_prop(prop: *const c_void, flags: u64) -> (bool, bool) {
    if prop.is_null() {
        return (false, true);
    }
    // SAFETY: the caller's `aclrtPhysicalMemProp` (32 bytes): `allocationType` is the `uint32`
    // at byte 4, `location.type` the one at byte 16; read unaligned, wherever C put it.
    let (ty, loc) = unsafe {
        (
            (prop as *const u8).add(4).cast::<u32>().read_unaligned(),
            (prop as *const u8).add(16).cast::<u32>().read_unaligned(),
        )
    };
    (
        ty == ALLOCATION_PINNED && LOCATION_HOST.contains(&loc),
        flags != 0,
    )
}

unsafe fn malloc_physical(
    h: Hook,
    real: aclrtMallocPhysical::Call,
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> c_int {
    // SAFETY: `prop` is the C caller's, null or an `aclrtPhysicalMemProp`.
    let (host, rejected) = unsafe { host_prop(prop, flags) };
    let req = host.then_some(if rejected {
        Request::Rejected
    } else {
        Request::Mapped
    });
    h.create_physical(
        Api::AclrtMallocPhysical,
        handle,
        size,
        req,
        CODES,
        move || real.call(),
    )
}

unsafe fn free_physical(h: Hook, real: aclrtFreePhysical::Call, handle: u64) -> c_int {
    h.release_physical(Api::AclrtFreePhysical, handle, SUCCESS, move || real.call())
}

unsafe fn map_mem(
    h: Hook,
    real: aclrtMapMem::Call,
    ptr: *mut c_void,
    size: usize,
    _offset: usize,
    handle: u64,
    _flags: u64,
) -> c_int {
    h.map_physical(
        Api::AclrtMapMem,
        ptr as usize,
        size,
        handle,
        SUCCESS,
        move || real.call(),
    )
}

/// `aclrtUnmapMem` names the mapping by its start alone.
unsafe fn unmap_mem(h: Hook, real: aclrtUnmapMem::Call, ptr: *mut c_void) -> c_int {
    h.unmap_physical(Api::AclrtUnmapMem, ptr as usize, 1, SUCCESS, move || {
        real.call()
    })
}

unsafe fn retain(
    h: Hook,
    real: aclrtMemRetainAllocationHandle::Call,
    _ptr: *mut c_void,
    handle: *mut u64,
) -> c_int {
    h.retain_physical(
        Api::AclrtMemRetainAllocationHandle,
        handle,
        SUCCESS,
        move || real.call(),
    )
}

unsafe fn malloc_host(
    h: Hook,
    real: aclrtMallocHost::Call,
    ptr: *mut *mut c_void,
    size: usize,
) -> c_int {
    h.alloc(
        Api::AclrtMallocHost,
        ptr,
        size,
        Request::Pageable,
        CODES,
        move || real.call(),
    )
}

unsafe fn malloc_host_with_cfg(
    h: Hook,
    real: aclrtMallocHostWithCfg::Call,
    ptr: *mut *mut c_void,
    size: u64,
    _cfg: *mut c_void,
) -> c_int {
    h.alloc(
        Api::AclrtMallocHostWithCfg,
        ptr,
        size as usize,
        Request::Pageable,
        CODES,
        move || real.call(),
    )
}

/// Always a mapped registration (it returns the device address), so never downgraded.
unsafe fn host_register(
    h: Hook,
    real: aclrtHostRegister::Call,
    ptr: *mut c_void,
    size: u64,
    ty: c_int,
    dev: *mut *mut c_void,
) -> c_int {
    let req = if ty == REGISTER_MAPPED && !dev.is_null() {
        Request::Mapped
    } else {
        Request::Rejected
    };
    h.register(
        Api::AclrtHostRegister,
        ptr,
        size as usize,
        req,
        CODES,
        move || real.call(),
    )
}

unsafe fn host_register_v2(
    h: Hook,
    real: aclrtHostRegisterV2::Call,
    ptr: *mut c_void,
    size: u64,
    flag: u32,
) -> c_int {
    h.register(
        Api::AclrtHostRegisterV2,
        ptr,
        size as usize,
        Request::from_flags(flag, REG_FLAGS, REG_MAPPED),
        CODES,
        move || real.call(),
    )
}

unsafe fn free_host(h: Hook, real: aclrtFreeHost::Call, ptr: *mut c_void) -> c_int {
    h.release(
        Api::AclrtFreeHost,
        ptr,
        &[Api::AclrtMallocHost, Api::AclrtMallocHostWithCfg],
        SUCCESS,
        move || real.call(),
    )
}

unsafe fn host_unregister(h: Hook, real: aclrtHostUnregister::Call, ptr: *mut c_void) -> c_int {
    h.release(
        Api::AclrtHostUnregister,
        ptr,
        &[Api::AclrtHostRegister, Api::AclrtHostRegisterV2],
        SUCCESS,
        move || real.call(),
    )
}

hooks! {
    family Acl, missing UNINITIALIZE;
    /// Pinned host memory.
    fn aclrtMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int => enter malloc_host;
    /// Pinned host memory with a configuration (torch_npu finds it with `dlsym`).
    fn aclrtMallocHostWithCfg(ptr: *mut *mut c_void, size: u64, cfg: *mut c_void) -> c_int => enter malloc_host_with_cfg;
    /// Pins and maps memory the caller owns, giving its device address.
    fn aclrtHostRegister(ptr: *mut c_void, size: u64, ty: c_int, dev: *mut *mut c_void) -> c_int => enter host_register;
    /// Pins memory the caller owns, `flag` saying mapped or pinned.
    fn aclrtHostRegisterV2(ptr: *mut c_void, size: u64, flag: u32) -> c_int => enter host_register_v2;
    /// Frees what `aclrtMallocHost` gave.
    fn aclrtFreeHost(ptr: *mut c_void) -> c_int => release free_host;
    /// Unpins what `aclrtHostRegister` pinned.
    fn aclrtHostUnregister(ptr: *mut c_void) -> c_int => release host_unregister;
    /// Physical memory for virtual mappings (`aclrtDrvMemHandle`, an opaque pointer, passed as
    /// a 64-bit word), perhaps pinned host memory.
    fn aclrtMallocPhysical(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int => enter malloc_physical;
    /// A handle of `aclrtMallocPhysical` goes (its memory once unmapped).
    fn aclrtFreePhysical(handle: u64) -> c_int => enter free_physical;
    /// Maps physical memory at a reserved address.
    fn aclrtMapMem(ptr: *mut c_void, size: usize, offset: usize, handle: u64, flags: u64) -> c_int => enter map_mem;
    /// Unmaps the mapping that starts at `ptr`.
    fn aclrtUnmapMem(ptr: *mut c_void) -> c_int => enter unmap_mem;
    /// One more handle on mapped physical memory.
    fn aclrtMemRetainAllocationHandle(ptr: *mut c_void, handle: *mut u64) -> c_int => enter retain;
}
