//! Huawei Ascend ACL (`libascendcl`): host allocation and registration. `aclError` is `int`.

use super::real;
use crate::api::{Api, Family};
use crate::track::Hook;
use std::os::raw::{c_int, c_void};

const SUCCESS: c_int = 0;
/// `ACL_ERROR_RT_MEMORY_ALLOCATION`: torch_npu reads it as out of memory.
const MEMORY_ALLOCATION: c_int = 207001;
/// `ACL_ERROR_UNINITIALIZE`, when no runtime can be found behind the hook.
const UNINITIALIZE: c_int = 100001;
/// `ACL_HOST_REG_MAPPED` for `aclrtHostRegisterV2`: the device maps the page, so it must be pinned.
const REG_MAPPED: u32 = 0x2;

type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type MallocCfgFn = unsafe extern "C" fn(*mut *mut c_void, u64, *mut c_void) -> c_int;
type RegisterFn = unsafe extern "C" fn(*mut c_void, u64, c_int, *mut *mut c_void) -> c_int;
type RegisterV2Fn = unsafe extern "C" fn(*mut c_void, u64, u32) -> c_int;
type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn aclrtMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int {
    let Some(f) = real!("aclrtMallocHost").get::<MallocFn>() else { return UNINITIALIZE };
    match Hook::enter(Family::Acl) {
        None => f(ptr, size),
        Some(h) => h.alloc(Api::AclrtMallocHost, ptr, size, true, SUCCESS, MEMORY_ALLOCATION, || f(ptr, size)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn aclrtMallocHostWithCfg(ptr: *mut *mut c_void, size: u64, cfg: *mut c_void) -> c_int {
    let Some(f) = real!("aclrtMallocHostWithCfg").get::<MallocCfgFn>() else { return UNINITIALIZE };
    match Hook::enter(Family::Acl) {
        None => f(ptr, size, cfg),
        Some(h) => h.alloc(Api::AclrtMallocHostWithCfg, ptr, size as usize, true, SUCCESS, MEMORY_ALLOCATION, || {
            f(ptr, size, cfg)
        }),
    }
}

/// Always a mapped registration (it returns the device address), so never downgraded.
#[no_mangle]
pub unsafe extern "C" fn aclrtHostRegister(ptr: *mut c_void, size: u64, ty: c_int, dev: *mut *mut c_void) -> c_int {
    let Some(f) = real!("aclrtHostRegister").get::<RegisterFn>() else { return UNINITIALIZE };
    match Hook::enter(Family::Acl) {
        None => f(ptr, size, ty, dev),
        Some(h) => h.register(Api::AclrtHostRegister, ptr, size as usize, false, SUCCESS, MEMORY_ALLOCATION, || {
            f(ptr, size, ty, dev)
        }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn aclrtHostRegisterV2(ptr: *mut c_void, size: u64, flag: u32) -> c_int {
    let Some(f) = real!("aclrtHostRegisterV2").get::<RegisterV2Fn>() else { return UNINITIALIZE };
    match Hook::enter(Family::Acl) {
        None => f(ptr, size, flag),
        Some(h) => h.register(Api::AclrtHostRegisterV2, ptr, size as usize, flag & REG_MAPPED == 0, SUCCESS, MEMORY_ALLOCATION, || {
            f(ptr, size, flag)
        }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn aclrtFreeHost(ptr: *mut c_void) -> c_int {
    let Some(f) = real!("aclrtFreeHost").get::<FreeFn>() else { return UNINITIALIZE };
    match Hook::enter(Family::Acl) {
        None => f(ptr),
        Some(h) => h.release(Api::AclrtFreeHost, ptr, &[Api::AclrtMallocHost, Api::AclrtMallocHostWithCfg], SUCCESS, || f(ptr)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn aclrtHostUnregister(ptr: *mut c_void) -> c_int {
    let Some(f) = real!("aclrtHostUnregister").get::<FreeFn>() else { return UNINITIALIZE };
    match Hook::enter(Family::Acl) {
        None => f(ptr),
        Some(h) => h.release(Api::AclrtHostUnregister, ptr, &[Api::AclrtHostRegister, Api::AclrtHostRegisterV2], SUCCESS, || {
            f(ptr)
        }),
    }
}
