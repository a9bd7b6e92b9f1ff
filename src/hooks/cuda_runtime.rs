//! CUDA runtime (`libcudart`): `cudaHostAlloc`, `cudaMallocHost`, `cudaFreeHost`,
//! `cudaHostRegister`, `cudaHostUnregister`. `cudaError_t` is a C enum, passed as `int`.

use super::real;
use crate::api::{Api, Family};
use crate::track::Hook;
use std::os::raw::{c_int, c_uint, c_void};

const SUCCESS: c_int = 0;
/// `cudaErrorMemoryAllocation`: what PyTorch turns into "CUDA out of memory".
const MEMORY_ALLOCATION: c_int = 2;
/// `cudaErrorInitializationError`, when no runtime can be found behind the hook.
const INITIALIZATION_ERROR: c_int = 3;
/// `cudaHostAllocMapped` and `cudaHostRegisterMapped`: the device needs the page, so pageable
/// memory cannot stand in for it.
const MAPPED: c_uint = 2;

type AllocFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int;
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type RegisterFn = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> c_int;
type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    let Some(f) = real!("cudaHostAlloc").get::<AllocFn>() else { return INITIALIZATION_ERROR };
    match Hook::enter(Family::Cuda) {
        None => f(ptr, size, flags),
        Some(h) => h.alloc(Api::CudaHostAlloc, ptr, size, flags & MAPPED == 0, SUCCESS, MEMORY_ALLOCATION, || {
            f(ptr, size, flags)
        }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int {
    let Some(f) = real!("cudaMallocHost").get::<MallocFn>() else { return INITIALIZATION_ERROR };
    match Hook::enter(Family::Cuda) {
        None => f(ptr, size),
        Some(h) => h.alloc(Api::CudaMallocHost, ptr, size, true, SUCCESS, MEMORY_ALLOCATION, || f(ptr, size)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) -> c_int {
    let Some(f) = real!("cudaHostRegister").get::<RegisterFn>() else { return INITIALIZATION_ERROR };
    match Hook::enter(Family::Cuda) {
        None => f(ptr, size, flags),
        Some(h) => h.register(Api::CudaHostRegister, ptr, size, flags & MAPPED == 0, SUCCESS, MEMORY_ALLOCATION, || {
            f(ptr, size, flags)
        }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: *mut c_void) -> c_int {
    let Some(f) = real!("cudaFreeHost").get::<FreeFn>() else { return INITIALIZATION_ERROR };
    match Hook::enter(Family::Cuda) {
        None => f(ptr),
        Some(h) => h.release(Api::CudaFreeHost, ptr, &[Api::CudaHostAlloc, Api::CudaMallocHost], SUCCESS, || f(ptr)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostUnregister(ptr: *mut c_void) -> c_int {
    let Some(f) = real!("cudaHostUnregister").get::<FreeFn>() else { return INITIALIZATION_ERROR };
    match Hook::enter(Family::Cuda) {
        None => f(ptr),
        Some(h) => h.release(Api::CudaHostUnregister, ptr, &[Api::CudaHostRegister], SUCCESS, || f(ptr)),
    }
}
