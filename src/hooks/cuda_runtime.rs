//! CUDA runtime (`libcudart`): `cudaHostAlloc`, `cudaMallocHost`, `cudaFreeHost`,
//! `cudaHostRegister`, `cudaHostUnregister`. `cudaError_t` is a C enum, passed as `int`.

use super::{real, slots};
use crate::api::{Api, Family};
use crate::track::{Codes, Hook, PoolApi, Request};
use std::ffi::CStr;
use std::os::raw::{c_int, c_uint, c_void};

const SUCCESS: c_int = 0;
/// `cudaErrorMemoryAllocation`: what PyTorch turns into "CUDA out of memory".
const MEMORY_ALLOCATION: c_int = 2;
/// `cudaErrorInitializationError`, when no runtime can be found behind the hook.
const INITIALIZATION_ERROR: c_int = 3;
/// `cudaErrorHostMemoryAlreadyRegistered`.
const ALREADY_REGISTERED: c_int = 712;
/// The runtime's answers (`cudaError_t`).
const CODES: Codes<c_int> = Codes { ok: SUCCESS, oom: MEMORY_ALLOCATION, already: ALREADY_REGISTERED };
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
type PoolCreateFn = unsafe extern "C-unwind" fn(*mut u64, *const c_void) -> c_int;
type PoolFn = unsafe extern "C-unwind" fn(u64) -> c_int;
type PoolTrimFn = unsafe extern "C-unwind" fn(u64, usize) -> c_int;
type PoolAllocFn = unsafe extern "C-unwind" fn(*mut usize, usize, u64, *mut c_void) -> c_int;
type FreeAsyncFn = unsafe extern "C-unwind" fn(usize, *mut c_void) -> c_int;

fn runtime_pool_attr(pool: u64, attr: i32) -> Option<u64> {
    // SAFETY: `PoolAttrFn` is the C type of `cudaMemPoolGetAttribute`.
    super::cuda_driver::pool_attr(unsafe { real!("cudaMemPoolGetAttribute").get::<super::cuda_driver::PoolAttrFn>() }, pool, attr)
}

/// The runtime's pool calls: its codes, and `cudaMemPoolGetAttribute`.
const POOLS: PoolApi<c_int> = PoolApi { codes: CODES, read: runtime_pool_attr };

unsafe fn pool_of(f: super::cuda_driver::PoolOfFn, api: Api, pool: *mut u64, location: *const c_int, ty: c_int) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pool, location, ty) },
        Some(h) => {
            // SAFETY: `location` is the C caller's, null or a `cudaMemLocation` (`{type, id}`).
            let host = unsafe { super::cuda_driver::location_host(location, ty) };
            // SAFETY: as above: the hook makes that same call, at most once, before it returns.
            h.pool_handed_out(api, pool, host, false, POOLS, || unsafe { f(pool, location, ty) })
        }
    }
}

unsafe fn default_pool(f: super::cuda_driver::PoolOfFn, pool: *mut u64, location: *const c_int, ty: c_int) -> c_int {
    // SAFETY: the C caller's arguments, passed on.
    unsafe { pool_of(f, Api::CudaMemGetDefaultMemPool, pool, location, ty) }
}

unsafe fn current_pool(f: super::cuda_driver::PoolOfFn, pool: *mut u64, location: *const c_int, ty: c_int) -> c_int {
    // SAFETY: the C caller's arguments, passed on.
    unsafe { pool_of(f, Api::CudaMemGetMemPool, pool, location, ty) }
}

unsafe fn pool_create(f: PoolCreateFn, pool: *mut u64, props: *const c_void) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pool, props) },
        Some(h) => {
            // SAFETY: `props` is the C caller's, null or a `cudaMemPoolProps`.
            let host = unsafe { super::cuda_driver::pool_props_host(props) };
            // SAFETY: as above: the hook makes that same call, at most once, before it returns.
            h.pool_handed_out(Api::CudaMemPoolCreate, pool, host, true, POOLS, || unsafe { f(pool, props) })
        }
    }
}

unsafe fn pool_destroy(f: PoolFn, pool: u64) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's argument under its contract.
        None => unsafe { f(pool) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.shrink_pool(Api::CudaMemPoolDestroy, pool, true, POOLS, || unsafe { f(pool) }),
    }
}

unsafe fn pool_trim(f: PoolTrimFn, pool: u64, keep: usize) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pool, keep) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.shrink_pool(Api::CudaMemPoolTrimTo, pool, false, POOLS, || unsafe { f(pool, keep) }),
    }
}

unsafe fn pool_alloc(f: PoolAllocFn, ptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, pool, stream) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc_from_pool(Api::CudaMallocFromPoolAsync, ptr, size, pool, POOLS, || unsafe { f(ptr, size, pool, stream) }),
    }
}

unsafe fn free_async(f: FreeAsyncFn, ptr: usize, stream: *mut c_void) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, stream) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.free_to_pool(Api::CudaFreeAsync, ptr, POOLS, || unsafe { f(ptr, stream) }),
    }
}

unsafe fn host_alloc(f: AllocFn, ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(Api::CudaHostAlloc, ptr, size, Request::from_flags(flags, ALLOC_FLAGS, MAPPED), CODES, || unsafe { f(ptr, size, flags) }),
    }
}

unsafe fn malloc_host(f: MallocFn, ptr: *mut *mut c_void, size: usize) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(Api::CudaMallocHost, ptr, size, Request::Pageable, CODES, || unsafe { f(ptr, size) }),
    }
}

unsafe fn host_register(f: RegisterFn, ptr: *mut c_void, size: usize, flags: c_uint) -> c_int {
    match Hook::enter(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.register(Api::CudaHostRegister, ptr, size, Request::from_flags(flags, REGISTER_FLAGS, MAPPED), CODES, || unsafe { f(ptr, size, flags) }),
    }
}

unsafe fn free_host(f: FreeFn, ptr: *mut c_void) -> c_int {
    match Hook::enter_release(Family::Cuda) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release(Api::CudaFreeHost, ptr, &[Api::CudaHostAlloc, Api::CudaMallocHost], SUCCESS, || unsafe { f(ptr) }),
    }
}

unsafe fn host_unregister(f: FreeFn, ptr: *mut c_void) -> c_int {
    match Hook::enter_release(Family::Cuda) {
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
slots!(pool_create_slots, PoolCreateFn, pool_create, (pool: *mut u64, props: *const c_void) -> c_int);
slots!(pool_destroy_slots, PoolFn, pool_destroy, (pool: u64) -> c_int);
slots!(pool_trim_slots, PoolTrimFn, pool_trim, (pool: u64, keep: usize) -> c_int);
slots!(pool_alloc_slots, PoolAllocFn, pool_alloc, (ptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int);
slots!(free_async_slots, FreeAsyncFn, free_async, (ptr: usize, stream: *mut c_void) -> c_int);
slots!(default_pool_slots, crate::hooks::cuda_driver::PoolOfFn, default_pool, (pool: *mut u64, location: *const c_int, ty: c_int) -> c_int);
slots!(current_pool_slots, crate::hooks::cuda_driver::PoolOfFn, current_pool, (pool: *mut u64, location: *const c_int, ty: c_int) -> c_int);

/// The wrapper for a runtime function `dlsym(handle, name)` returned, if `name` is one.
pub fn redirect(name: &CStr, real: usize) -> Option<Option<usize>> {
    Some(match name.to_bytes() {
        b"cudaHostAlloc" => host_alloc_slots::bind(real),
        b"cudaMallocHost" => malloc_host_slots::bind(real),
        b"cudaHostRegister" => host_register_slots::bind(real),
        b"cudaFreeHost" => free_host_slots::bind(real),
        b"cudaHostUnregister" => host_unregister_slots::bind(real),
        b"cudaMemPoolCreate" => pool_create_slots::bind(real),
        b"cudaMemPoolDestroy" => pool_destroy_slots::bind(real),
        b"cudaMemPoolTrimTo" => pool_trim_slots::bind(real),
        b"cudaMallocFromPoolAsync" | b"cudaMallocFromPoolAsync_ptsz" => pool_alloc_slots::bind(real),
        b"cudaFreeAsync" | b"cudaFreeAsync_ptsz" => free_async_slots::bind(real),
        b"cudaMemGetDefaultMemPool" => default_pool_slots::bind(real),
        b"cudaMemGetMemPool" => current_pool_slots::bind(real),
        _ => return None,
    })
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaMemPoolCreate(pool: *mut u64, props: *const c_void) -> c_int {
    // SAFETY: `PoolCreateFn` is the C type of `cudaMemPoolCreate`.
    match unsafe { real!("cudaMemPoolCreate").get::<PoolCreateFn>() } {
        // SAFETY: `f` is the real `cudaMemPoolCreate`, given the C caller's arguments under its contract.
        Some(f) => unsafe { pool_create(f, pool, props) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaMemPoolDestroy(pool: u64) -> c_int {
    // SAFETY: `PoolFn` is the C type of `cudaMemPoolDestroy`.
    match unsafe { real!("cudaMemPoolDestroy").get::<PoolFn>() } {
        // SAFETY: `f` is the real `cudaMemPoolDestroy`, given the C caller's arguments under its contract.
        Some(f) => unsafe { pool_destroy(f, pool) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaMemPoolTrimTo(pool: u64, keep: usize) -> c_int {
    // SAFETY: `PoolTrimFn` is the C type of `cudaMemPoolTrimTo`.
    match unsafe { real!("cudaMemPoolTrimTo").get::<PoolTrimFn>() } {
        // SAFETY: `f` is the real `cudaMemPoolTrimTo`, given the C caller's arguments under its contract.
        Some(f) => unsafe { pool_trim(f, pool, keep) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaMallocFromPoolAsync(ptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int {
    // SAFETY: `PoolAllocFn` is the C type of `cudaMallocFromPoolAsync`.
    match unsafe { real!("cudaMallocFromPoolAsync").get::<PoolAllocFn>() } {
        // SAFETY: `f` is the real `cudaMallocFromPoolAsync`, given the C caller's arguments under its contract.
        Some(f) => unsafe { pool_alloc(f, ptr, size, pool, stream) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaMallocFromPoolAsync_ptsz(ptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int {
    // SAFETY: `PoolAllocFn` is the C type of `cudaMallocFromPoolAsync_ptsz`.
    match unsafe { real!("cudaMallocFromPoolAsync_ptsz").get::<PoolAllocFn>() } {
        // SAFETY: `f` is the real `cudaMallocFromPoolAsync_ptsz`, given the C caller's arguments under its contract.
        Some(f) => unsafe { pool_alloc(f, ptr, size, pool, stream) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaFreeAsync(ptr: usize, stream: *mut c_void) -> c_int {
    // SAFETY: `FreeAsyncFn` is the C type of `cudaFreeAsync`.
    match unsafe { real!("cudaFreeAsync").get::<FreeAsyncFn>() } {
        // SAFETY: `f` is the real `cudaFreeAsync`, given the C caller's arguments under its contract.
        Some(f) => unsafe { free_async(f, ptr, stream) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaFreeAsync_ptsz(ptr: usize, stream: *mut c_void) -> c_int {
    // SAFETY: `FreeAsyncFn` is the C type of `cudaFreeAsync_ptsz`.
    match unsafe { real!("cudaFreeAsync_ptsz").get::<FreeAsyncFn>() } {
        // SAFETY: `f` is the real `cudaFreeAsync_ptsz`, given the C caller's arguments under its contract.
        Some(f) => unsafe { free_async(f, ptr, stream) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaMemGetDefaultMemPool(pool: *mut u64, location: *const c_int, ty: c_int) -> c_int {
    // SAFETY: `PoolOfFn` is the C type of `cudaMemGetDefaultMemPool`.
    match unsafe { real!("cudaMemGetDefaultMemPool").get::<super::cuda_driver::PoolOfFn>() } {
        // SAFETY: `f` is the real `cudaMemGetDefaultMemPool`, given the C caller's arguments under its contract.
        Some(f) => unsafe { default_pool(f, pool, location, ty) },
        None => INITIALIZATION_ERROR,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cudaMemGetMemPool(pool: *mut u64, location: *const c_int, ty: c_int) -> c_int {
    // SAFETY: `PoolOfFn` is the C type of `cudaMemGetMemPool`.
    match unsafe { real!("cudaMemGetMemPool").get::<super::cuda_driver::PoolOfFn>() } {
        // SAFETY: `f` is the real `cudaMemGetMemPool`, given the C caller's arguments under its contract.
        Some(f) => unsafe { current_pool(f, pool, location, ty) },
        None => INITIALIZATION_ERROR,
    }
}
