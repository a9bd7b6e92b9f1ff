//! CUDA runtime (`libcudart`): `cudaHostAlloc`, `cudaMallocHost`, `cudaFreeHost`,
//! `cudaHostRegister`, `cudaHostUnregister`. `cudaError_t` is a C enum, passed as `int`.

use super::{real, slots};
use crate::api::{Api, Family};
use crate::track::{Hook, Request};
use std::ffi::CStr;
use std::os::raw::{c_int, c_uint, c_void};

const SUCCESS: c_int = 0;
/// `cudaErrorMemoryAllocation`: what PyTorch turns into "CUDA out of memory".
const MEMORY_ALLOCATION: c_int = 2;
/// `cudaErrorInitializationError`, when no runtime can be found behind the hook.
const INITIALIZATION_ERROR: c_int = 3;
/// `cudaErrorHostMemoryAlreadyRegistered`.
const ALREADY_REGISTERED: c_int = 712;
/// `cudaHostAllocMapped` and `cudaHostRegisterMapped`: the device needs the page, so pageable
/// memory cannot stand in for it.
const MAPPED: c_uint = 2;
/// `cudaHostAllocPortable | Mapped | WriteCombined`.
const ALLOC_FLAGS: c_uint = 0x7;
/// `cudaHostRegisterPortable | Mapped | IoMemory | ReadOnly`.
const REGISTER_FLAGS: c_uint = 0xf;

type AllocFn = unsafe extern "C-unwind" fn(*mut *mut c_void, usize, c_uint) -> c_int;
type MallocFn = unsafe extern "C-unwind" fn(*mut *mut c_void, usize) -> c_int;
type RegisterFn = unsafe extern "C-unwind" fn(*mut c_void, usize, c_uint) -> c_int;
type FreeFn = unsafe extern "C-unwind" fn(*mut c_void) -> c_int;

unsafe fn host_alloc(f: AllocFn, ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(Api::CudaHostAlloc, ptr, size, Request::from_flags(flags, ALLOC_FLAGS, MAPPED), SUCCESS, MEMORY_ALLOCATION, || unsafe { f(ptr, size, flags) }),
    }
}

unsafe fn malloc_host(f: MallocFn, ptr: *mut *mut c_void, size: usize) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(Api::CudaMallocHost, ptr, size, Request::Pageable, SUCCESS, MEMORY_ALLOCATION, || unsafe { f(ptr, size) }),
    }
}

unsafe fn host_register(f: RegisterFn, ptr: *mut c_void, size: usize, flags: c_uint) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.register(Api::CudaHostRegister, ptr, size, Request::from_flags(flags, REGISTER_FLAGS, MAPPED), SUCCESS, MEMORY_ALLOCATION, ALREADY_REGISTERED, || unsafe { f(ptr, size, flags) }),
    }
}

unsafe fn free_host(f: FreeFn, ptr: *mut c_void) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release(Api::CudaFreeHost, ptr, &[Api::CudaHostAlloc, Api::CudaMallocHost], SUCCESS, || unsafe { f(ptr) }),
    }
}

unsafe fn host_unregister(f: FreeFn, ptr: *mut c_void) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release(Api::CudaHostUnregister, ptr, &[Api::CudaHostRegister], SUCCESS, || unsafe { f(ptr) }),
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    // SAFETY: `AllocFn` is the C type of `cudaHostAlloc`.
    match unsafe { real!("cudaHostAlloc").get::<AllocFn>() } {
        // SAFETY: `f` is the real `cudaHostAlloc`, given the C caller's arguments under its contract.
        Some(f) => unsafe { host_alloc(f, ptr, size, flags) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int {
    // SAFETY: `MallocFn` is the C type of `cudaMallocHost`.
    match unsafe { real!("cudaMallocHost").get::<MallocFn>() } {
        // SAFETY: `f` is the real `cudaMallocHost`, given the C caller's arguments under its contract.
        Some(f) => unsafe { malloc_host(f, ptr, size) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) -> c_int {
    // SAFETY: `RegisterFn` is the C type of `cudaHostRegister`.
    match unsafe { real!("cudaHostRegister").get::<RegisterFn>() } {
        // SAFETY: `f` is the real `cudaHostRegister`, given the C caller's arguments under its contract.
        Some(f) => unsafe { host_register(f, ptr, size, flags) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaFreeHost(ptr: *mut c_void) -> c_int {
    // SAFETY: `FreeFn` is the C type of `cudaFreeHost`.
    match unsafe { real!("cudaFreeHost").get::<FreeFn>() } {
        // SAFETY: `f` is the real `cudaFreeHost`, given the C caller's arguments under its contract.
        Some(f) => unsafe { free_host(f, ptr) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaHostUnregister(ptr: *mut c_void) -> c_int {
    // SAFETY: `FreeFn` is the C type of `cudaHostUnregister`.
    match unsafe { real!("cudaHostUnregister").get::<FreeFn>() } {
        // SAFETY: `f` is the real `cudaHostUnregister`, given the C caller's arguments under its contract.
        Some(f) => unsafe { host_unregister(f, ptr) },
        None => INITIALIZATION_ERROR,
    }
}

slots!(host_alloc_slots, AllocFn, host_alloc, (ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int);
slots!(malloc_host_slots, MallocFn, malloc_host, (ptr: *mut *mut c_void, size: usize) -> c_int);
slots!(host_register_slots, RegisterFn, host_register, (ptr: *mut c_void, size: usize, flags: c_uint) -> c_int);
slots!(free_host_slots, FreeFn, free_host, (ptr: *mut c_void) -> c_int);
slots!(host_unregister_slots, FreeFn, host_unregister, (ptr: *mut c_void) -> c_int);

/// The wrapper for a runtime function `dlsym(handle, name)` returned, if `name` is one.
pub fn redirect(name: &CStr, real: usize) -> Option<Option<usize>> {
    Some(match name.to_bytes() {
        b"cudaHostAlloc" => host_alloc_slots::bind(real),
        b"cudaMallocHost" => malloc_host_slots::bind(real),
        b"cudaHostRegister" => host_register_slots::bind(real),
        b"cudaFreeHost" => free_host_slots::bind(real),
        b"cudaHostUnregister" => host_unregister_slots::bind(real),
        _ => return None,
    })
}
