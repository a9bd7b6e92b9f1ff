//! Huawei Ascend ACL (`libascendcl`): host allocation and registration. `aclError` is `int`.

use super::{real, slots};
use crate::api::{Api, Family};
use crate::track::{Codes, Hook, Request};
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};

const SUCCESS: c_int = 0;
/// `ACL_ERROR_RT_MEMORY_ALLOCATION`: torch_npu reads it as out of memory.
const MEMORY_ALLOCATION: c_int = 207001;
/// `ACL_ERROR_INVALID_PARAM`: what the runtime answers for memory registered twice.
const INVALID_PARAM: c_int = 100000;
/// ACL's answers (`aclError`): memory registered twice is an invalid parameter to it.
const CODES: Codes<c_int> = Codes { ok: SUCCESS, oom: MEMORY_ALLOCATION, already: INVALID_PARAM };
/// `ACL_ERROR_UNINITIALIZE`, when no runtime can be found behind the hook.
const UNINITIALIZE: c_int = 100001;
/// `ACL_HOST_REG_MAPPED` for `aclrtHostRegisterV2`: the device maps the page, so it must be pinned.
const REG_MAPPED: u32 = 0x2;
/// `ACL_HOST_REG_MAPPED | ACL_HOST_REG_PINNED`.
const REG_FLAGS: u32 = 0x1000_0002;
/// `ACL_HOST_REGISTER_MAPPED`, the one `aclrtHostRegisterType`.
const REGISTER_MAPPED: c_int = 0;

type MallocFn = unsafe extern "C-unwind" fn(*mut *mut c_void, usize) -> c_int;
type MallocCfgFn = unsafe extern "C-unwind" fn(*mut *mut c_void, u64, *mut c_void) -> c_int;
type RegisterFn = unsafe extern "C-unwind" fn(*mut c_void, u64, c_int, *mut *mut c_void) -> c_int;
type RegisterV2Fn = unsafe extern "C-unwind" fn(*mut c_void, u64, u32) -> c_int;
type FreeFn = unsafe extern "C-unwind" fn(*mut c_void) -> c_int;
/// `aclrtDrvMemHandle` is an opaque pointer: passed and stored as a 64-bit word.
type MallocPhysicalFn = unsafe extern "C-unwind" fn(*mut u64, usize, *const c_void, u64) -> c_int;
type FreePhysicalFn = unsafe extern "C-unwind" fn(u64) -> c_int;
type MapMemFn = unsafe extern "C-unwind" fn(*mut c_void, usize, usize, u64, u64) -> c_int;
type UnmapMemFn = unsafe extern "C-unwind" fn(*mut c_void) -> c_int;
type RetainFn = unsafe extern "C-unwind" fn(*mut c_void, *mut u64) -> c_int;

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
    let (ty, loc) = unsafe { ((prop as *const u8).add(4).cast::<u32>().read_unaligned(), (prop as *const u8).add(16).cast::<u32>().read_unaligned()) };
    (ty == ALLOCATION_PINNED && LOCATION_HOST.contains(&loc), flags != 0)
}

unsafe fn malloc_physical(f: MallocPhysicalFn, handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int {
    match Hook::enter(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(handle, size, prop, flags) },
        Some(h) => {
            // SAFETY: `prop` is the C caller's, null or an `aclrtPhysicalMemProp`.
            let (host, rejected) = unsafe { host_prop(prop, flags) };
            let req = host.then_some(if rejected { Request::Rejected } else { Request::Mapped });
            // SAFETY: as above: the hook makes that same call, at most once, before it returns.
            h.create_physical(Api::AclrtMallocPhysical, handle, size, req, CODES, || unsafe { f(handle, size, prop, flags) })
        }
    }
}

unsafe fn free_physical(f: FreePhysicalFn, handle: u64) -> c_int {
    match Hook::enter(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's argument under its contract.
        None => unsafe { f(handle) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release_physical(Api::AclrtFreePhysical, handle, SUCCESS, || unsafe { f(handle) }),
    }
}

unsafe fn map_mem(f: MapMemFn, ptr: *mut c_void, size: usize, offset: usize, handle: u64, flags: u64) -> c_int {
    match Hook::enter(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, offset, handle, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.map_physical(Api::AclrtMapMem, ptr as usize, size, handle, SUCCESS, || unsafe { f(ptr, size, offset, handle, flags) }),
    }
}

/// `aclrtUnmapMem` names the mapping by its start alone.
unsafe fn unmap_mem(f: UnmapMemFn, ptr: *mut c_void) -> c_int {
    match Hook::enter(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's argument under its contract.
        None => unsafe { f(ptr) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.unmap_physical(Api::AclrtUnmapMem, ptr as usize, 1, SUCCESS, || unsafe { f(ptr) }),
    }
}

unsafe fn retain(f: RetainFn, ptr: *mut c_void, handle: *mut u64) -> c_int {
    match Hook::enter(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, handle) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.retain_physical(Api::AclrtMemRetainAllocationHandle, handle, SUCCESS, || unsafe { f(ptr, handle) }),
    }
}

unsafe fn malloc_host(f: MallocFn, ptr: *mut *mut c_void, size: usize) -> c_int {
    match Hook::enter(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(Api::AclrtMallocHost, ptr, size, Request::Pageable, CODES, || unsafe { f(ptr, size) }),
    }
}

unsafe fn malloc_host_with_cfg(f: MallocCfgFn, ptr: *mut *mut c_void, size: u64, cfg: *mut c_void) -> c_int {
    match Hook::enter(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, cfg) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(Api::AclrtMallocHostWithCfg, ptr, size as usize, Request::Pageable, CODES, || unsafe { f(ptr, size, cfg) }),
    }
}

/// Always a mapped registration (it returns the device address), so never downgraded.
unsafe fn host_register(f: RegisterFn, ptr: *mut c_void, size: u64, ty: c_int, dev: *mut *mut c_void) -> c_int {
    match Hook::enter(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, ty, dev) },
        Some(h) => {
            let req = if ty == REGISTER_MAPPED && !dev.is_null() { Request::Mapped } else { Request::Rejected };
            // SAFETY: as above: the hook makes that same call, at most once, before it returns.
            h.register(Api::AclrtHostRegister, ptr, size as usize, req, CODES, || unsafe { f(ptr, size, ty, dev) })
        }
    }
}

unsafe fn host_register_v2(f: RegisterV2Fn, ptr: *mut c_void, size: u64, flag: u32) -> c_int {
    match Hook::enter(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, flag) },
        Some(h) => h.register(Api::AclrtHostRegisterV2, ptr, size as usize, Request::from_flags(flag, REG_FLAGS, REG_MAPPED), CODES, || {
            // SAFETY: as above: the hook makes that same call, at most once, before it returns.
            unsafe { f(ptr, size, flag) }
        }),
    }
}

unsafe fn free_host(f: FreeFn, ptr: *mut c_void) -> c_int {
    match Hook::enter_release(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release(Api::AclrtFreeHost, ptr, &[Api::AclrtMallocHost, Api::AclrtMallocHostWithCfg], SUCCESS, || unsafe { f(ptr) }),
    }
}

unsafe fn host_unregister(f: FreeFn, ptr: *mut c_void) -> c_int {
    match Hook::enter_release(Family::Acl) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release(Api::AclrtHostUnregister, ptr, &[Api::AclrtHostRegister, Api::AclrtHostRegisterV2], SUCCESS, || unsafe { f(ptr) }),
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int {
    // SAFETY: `MallocFn` is the C type of `aclrtMallocHost`.
    match unsafe { real!("aclrtMallocHost").get::<MallocFn>() } {
        // SAFETY: `f` is the real `aclrtMallocHost`, given the C caller's arguments under its contract.
        Some(f) => unsafe { malloc_host(f, ptr, size) },
        None => UNINITIALIZE,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtMallocHostWithCfg(ptr: *mut *mut c_void, size: u64, cfg: *mut c_void) -> c_int {
    // SAFETY: `MallocCfgFn` is the C type of `aclrtMallocHostWithCfg`.
    match unsafe { real!("aclrtMallocHostWithCfg").get::<MallocCfgFn>() } {
        // SAFETY: `f` is the real `aclrtMallocHostWithCfg`, given the C caller's arguments under its contract.
        Some(f) => unsafe { malloc_host_with_cfg(f, ptr, size, cfg) },
        None => UNINITIALIZE,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtHostRegister(ptr: *mut c_void, size: u64, ty: c_int, dev: *mut *mut c_void) -> c_int {
    // SAFETY: `RegisterFn` is the C type of `aclrtHostRegister`.
    match unsafe { real!("aclrtHostRegister").get::<RegisterFn>() } {
        // SAFETY: `f` is the real `aclrtHostRegister`, given the C caller's arguments under its contract.
        Some(f) => unsafe { host_register(f, ptr, size, ty, dev) },
        None => UNINITIALIZE,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtHostRegisterV2(ptr: *mut c_void, size: u64, flag: u32) -> c_int {
    // SAFETY: `RegisterV2Fn` is the C type of `aclrtHostRegisterV2`.
    match unsafe { real!("aclrtHostRegisterV2").get::<RegisterV2Fn>() } {
        // SAFETY: `f` is the real `aclrtHostRegisterV2`, given the C caller's arguments under its contract.
        Some(f) => unsafe { host_register_v2(f, ptr, size, flag) },
        None => UNINITIALIZE,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtFreeHost(ptr: *mut c_void) -> c_int {
    // SAFETY: `FreeFn` is the C type of `aclrtFreeHost`.
    match unsafe { real!("aclrtFreeHost").get::<FreeFn>() } {
        // SAFETY: `f` is the real `aclrtFreeHost`, given the C caller's arguments under its contract.
        Some(f) => unsafe { free_host(f, ptr) },
        None => UNINITIALIZE,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtHostUnregister(ptr: *mut c_void) -> c_int {
    // SAFETY: `FreeFn` is the C type of `aclrtHostUnregister`.
    match unsafe { real!("aclrtHostUnregister").get::<FreeFn>() } {
        // SAFETY: `f` is the real `aclrtHostUnregister`, given the C caller's arguments under its contract.
        Some(f) => unsafe { host_unregister(f, ptr) },
        None => UNINITIALIZE,
    }
}

slots!(malloc_host_slots, MallocFn, malloc_host, (ptr: *mut *mut c_void, size: usize) -> c_int);
slots!(malloc_host_with_cfg_slots, MallocCfgFn, malloc_host_with_cfg, (ptr: *mut *mut c_void, size: u64, cfg: *mut c_void) -> c_int);
slots!(host_register_slots, RegisterFn, host_register, (ptr: *mut c_void, size: u64, ty: c_int, dev: *mut *mut c_void) -> c_int);
slots!(host_register_v2_slots, RegisterV2Fn, host_register_v2, (ptr: *mut c_void, size: u64, flag: u32) -> c_int);
slots!(free_host_slots, FreeFn, free_host, (ptr: *mut c_void) -> c_int);
slots!(host_unregister_slots, FreeFn, host_unregister, (ptr: *mut c_void) -> c_int);
slots!(malloc_physical_slots, MallocPhysicalFn, malloc_physical, (handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int);
slots!(free_physical_slots, FreePhysicalFn, free_physical, (handle: u64) -> c_int);
slots!(map_mem_slots, MapMemFn, map_mem, (ptr: *mut c_void, size: usize, offset: usize, handle: u64, flags: u64) -> c_int);
slots!(unmap_mem_slots, UnmapMemFn, unmap_mem, (ptr: *mut c_void) -> c_int);
slots!(retain_slots, RetainFn, retain, (ptr: *mut c_void, handle: *mut u64) -> c_int);

/// The wrapper for an ACL function `dlsym(handle, name)` returned (torch_npu's look-up of the
/// newer entry points), if `name` is one.
pub fn redirect(name: &CStr, real: usize) -> Option<Option<usize>> {
    Some(match name.to_bytes() {
        b"aclrtMallocHost" => malloc_host_slots::bind(real),
        b"aclrtMallocHostWithCfg" => malloc_host_with_cfg_slots::bind(real),
        b"aclrtHostRegister" => host_register_slots::bind(real),
        b"aclrtHostRegisterV2" => host_register_v2_slots::bind(real),
        b"aclrtFreeHost" => free_host_slots::bind(real),
        b"aclrtHostUnregister" => host_unregister_slots::bind(real),
        b"aclrtMallocPhysical" => malloc_physical_slots::bind(real),
        b"aclrtFreePhysical" => free_physical_slots::bind(real),
        b"aclrtMapMem" => map_mem_slots::bind(real),
        b"aclrtUnmapMem" => unmap_mem_slots::bind(real),
        b"aclrtMemRetainAllocationHandle" => retain_slots::bind(real),
        _ => return None,
    })
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtMallocPhysical(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int {
    // SAFETY: `MallocPhysicalFn` is the C type of `aclrtMallocPhysical`.
    match unsafe { real!("aclrtMallocPhysical").get::<MallocPhysicalFn>() } {
        // SAFETY: `f` is the real `aclrtMallocPhysical`, given the C caller's arguments under its contract.
        Some(f) => unsafe { malloc_physical(f, handle, size, prop, flags) },
        None => UNINITIALIZE,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtFreePhysical(handle: u64) -> c_int {
    // SAFETY: `FreePhysicalFn` is the C type of `aclrtFreePhysical`.
    match unsafe { real!("aclrtFreePhysical").get::<FreePhysicalFn>() } {
        // SAFETY: `f` is the real `aclrtFreePhysical`, given the C caller's arguments under its contract.
        Some(f) => unsafe { free_physical(f, handle) },
        None => UNINITIALIZE,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtMapMem(ptr: *mut c_void, size: usize, offset: usize, handle: u64, flags: u64) -> c_int {
    // SAFETY: `MapMemFn` is the C type of `aclrtMapMem`.
    match unsafe { real!("aclrtMapMem").get::<MapMemFn>() } {
        // SAFETY: `f` is the real `aclrtMapMem`, given the C caller's arguments under its contract.
        Some(f) => unsafe { map_mem(f, ptr, size, offset, handle, flags) },
        None => UNINITIALIZE,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtUnmapMem(ptr: *mut c_void) -> c_int {
    // SAFETY: `UnmapMemFn` is the C type of `aclrtUnmapMem`.
    match unsafe { real!("aclrtUnmapMem").get::<UnmapMemFn>() } {
        // SAFETY: `f` is the real `aclrtUnmapMem`, given the C caller's arguments under its contract.
        Some(f) => unsafe { unmap_mem(f, ptr) },
        None => UNINITIALIZE,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn aclrtMemRetainAllocationHandle(ptr: *mut c_void, handle: *mut u64) -> c_int {
    // SAFETY: `RetainFn` is the C type of `aclrtMemRetainAllocationHandle`.
    match unsafe { real!("aclrtMemRetainAllocationHandle").get::<RetainFn>() } {
        // SAFETY: `f` is the real `aclrtMemRetainAllocationHandle`, given the C caller's arguments under its contract.
        Some(f) => unsafe { retain(f, ptr, handle) },
        None => UNINITIALIZE,
    }
}
