//! CUDA driver (`libcuda.so.1`): host allocation and registration, and `cuGetProcAddress`, through
//! which `libcudart`, static-cudart programs and JAX/XLA reach every driver function. `CUresult`
//! is a C enum, passed as `int`.
//!
//! Two ABIs hide behind some names: the legacy `cuMemAllocHost` takes an `unsigned int` size (the
//! `_v2` one, which `cuda.h` maps the name to since CUDA 3.2, a `size_t`), and
//! `cuGetProcAddress` gained a fifth argument in `_v2` (CUDA 12.0). Each gets its own wrappers.

use super::{real, slots};
use crate::api::{Api, Family};
use crate::track::{Codes, Hook, PoolApi, Request};
use std::ffi::{c_char, CStr};
use std::os::raw::{c_int, c_uint, c_void};

const SUCCESS: c_int = 0;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
const OUT_OF_MEMORY: c_int = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`, when no driver can be found behind the hook.
const NOT_INITIALIZED: c_int = 3;
/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
const ALREADY_REGISTERED: c_int = 712;
/// `CU_MEMHOSTALLOC_DEVICEMAP` and `CU_MEMHOSTREGISTER_DEVICEMAP`.
const DEVICEMAP: c_uint = 2;
/// `CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED`.
const ALLOC_FLAGS: c_uint = 0x7;
/// `CU_MEMHOSTREGISTER_PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY`.
const REGISTER_FLAGS: c_uint = 0xf;
/// The driver's answers (`CUresult`).
const CODES: Codes<c_int> = Codes { ok: SUCCESS, oom: OUT_OF_MEMORY, already: ALREADY_REGISTERED };

type HostAllocFn = unsafe extern "C-unwind" fn(*mut *mut c_void, usize, c_uint) -> c_int;
type AllocHostFn = unsafe extern "C-unwind" fn(*mut *mut c_void, usize) -> c_int;
type AllocHostLegacyFn = unsafe extern "C-unwind" fn(*mut *mut c_void, c_uint) -> c_int;
type RegisterFn = unsafe extern "C-unwind" fn(*mut c_void, usize, c_uint) -> c_int;
type FreeFn = unsafe extern "C-unwind" fn(*mut c_void) -> c_int;
type GetProcFn = unsafe extern "C-unwind" fn(*const c_char, *mut *mut c_void, c_int, u64) -> c_int;
type MemCreateFn = unsafe extern "C-unwind" fn(*mut u64, usize, *const c_void, u64) -> c_int;
type MemReleaseFn = unsafe extern "C-unwind" fn(u64) -> c_int;
type MemMapFn = unsafe extern "C-unwind" fn(u64, usize, usize, u64, u64) -> c_int;
type MemUnmapFn = unsafe extern "C-unwind" fn(u64, usize) -> c_int;
type MemRetainFn = unsafe extern "C-unwind" fn(*mut u64, *mut c_void) -> c_int;
type PoolCreateFn = unsafe extern "C-unwind" fn(*mut u64, *const c_void) -> c_int;
type PoolFn = unsafe extern "C-unwind" fn(u64) -> c_int;
type PoolTrimFn = unsafe extern "C-unwind" fn(u64, usize) -> c_int;
type PoolAllocFn = unsafe extern "C-unwind" fn(*mut usize, usize, u64, *mut c_void) -> c_int;
type FreeAsyncFn = unsafe extern "C-unwind" fn(usize, *mut c_void) -> c_int;
/// `cuMemGetDefaultMemPool`, `cuMemGetMemPool` (and the runtime's): a pool out, a `CUmemLocation`
/// (`{int type; int id}`), a `CUmemAllocationType`.
pub(crate) type PoolOfFn = unsafe extern "C-unwind" fn(*mut u64, *const c_int, c_int) -> c_int;

/// Whether a location and allocation type name pinned host memory.
pub(crate) unsafe fn location_host(location: *const c_int, ty: c_int) -> bool {
    if location.is_null() {
        return false;
    }
    // SAFETY: the caller's `CUmemLocation`, whose first `int` is its type.
    ty == ALLOCATION_PINNED && LOCATION_HOST.contains(&unsafe { location.read_unaligned() })
}

unsafe fn pool_of(f: PoolOfFn, api: Api, pool: *mut u64, location: *const c_int, ty: c_int) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pool, location, ty) },
        Some(h) => {
            // SAFETY: `location` is the C caller's, null or a `CUmemLocation`.
            let host = unsafe { location_host(location, ty) };
            // SAFETY: as above: the hook makes that same call, at most once, before it returns.
            h.pool_handed_out(api, pool, host, false, POOLS, || unsafe { f(pool, location, ty) })
        }
    }
}

unsafe fn default_pool(f: PoolOfFn, pool: *mut u64, location: *const c_int, ty: c_int) -> c_int {
    // SAFETY: the C caller's arguments, passed on.
    unsafe { pool_of(f, Api::CuMemGetDefaultMemPool, pool, location, ty) }
}

unsafe fn current_pool(f: PoolOfFn, pool: *mut u64, location: *const c_int, ty: c_int) -> c_int {
    // SAFETY: the C caller's arguments, passed on.
    unsafe { pool_of(f, Api::CuMemGetMemPool, pool, location, ty) }
}
/// `cuMemPoolGetAttribute` and `cudaMemPoolGetAttribute`.
pub(crate) type PoolAttrFn = unsafe extern "C-unwind" fn(u64, c_int, *mut c_void) -> c_int;
type GetProcV2Fn = unsafe extern "C-unwind" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

unsafe fn host_alloc(f: HostAllocFn, pp: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pp, size, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(Api::CuMemHostAlloc, pp, size, Request::from_flags(flags, ALLOC_FLAGS, DEVICEMAP), CODES, || unsafe { f(pp, size, flags) }),
    }
}

unsafe fn alloc_host_v2(f: AllocHostFn, pp: *mut *mut c_void, size: usize) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pp, size) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(Api::CuMemAllocHostV2, pp, size, Request::Pageable, CODES, || unsafe { f(pp, size) }),
    }
}

unsafe fn alloc_host_legacy(f: AllocHostLegacyFn, pp: *mut *mut c_void, size: c_uint) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pp, size) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(Api::CuMemAllocHost, pp, size as usize, Request::Pageable, CODES, || unsafe { f(pp, size) }),
    }
}

unsafe fn register_v2(f: RegisterFn, p: *mut c_void, size: usize, flags: c_uint) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(p, size, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.register(Api::CuMemHostRegisterV2, p, size, Request::from_flags(flags, REGISTER_FLAGS, DEVICEMAP), CODES, || unsafe { f(p, size, flags) }),
    }
}

unsafe fn register_legacy(f: RegisterFn, p: *mut c_void, size: usize, flags: c_uint) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(p, size, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.register(Api::CuMemHostRegister, p, size, Request::from_flags(flags, REGISTER_FLAGS, DEVICEMAP), CODES, || unsafe { f(p, size, flags) }),
    }
}

unsafe fn free_host(f: FreeFn, p: *mut c_void) -> c_int {
    match Hook::enter_release(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(p) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release(Api::CuMemFreeHost, p, &[Api::CuMemHostAlloc, Api::CuMemAllocHostV2, Api::CuMemAllocHost], SUCCESS, || unsafe { f(p) }),
    }
}

unsafe fn host_unregister(f: FreeFn, p: *mut c_void) -> c_int {
    match Hook::enter_release(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(p) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release(Api::CuMemHostUnregister, p, &[Api::CuMemHostRegisterV2, Api::CuMemHostRegister], SUCCESS, || unsafe { f(p) }),
    }
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CUmemAllocationProp::type` (at byte 0).
const ALLOCATION_PINNED: i32 = 1;
/// `CUmemLocationType` host kinds (`CUmemAllocationProp::location.type`, at byte 8):
/// `CU_MEM_LOCATION_TYPE_HOST`, `_HOST_NUMA`, `_HOST_NUMA_CURRENT`. Device (1) is not host memory.
const LOCATION_HOST: [i32; 3] = [2, 3, 4];

/// Whether a `CUmemAllocationProp` asks for pinned host memory, and whether the call is one the
/// driver rejects anyway (`flags` is reserved and must be 0).
unsafe fn host_prop(prop: *const c_void, flags: u64) -> (bool, bool) {
    if prop.is_null() {
        return (false, true);
    }
    // SAFETY: the caller's `CUmemAllocationProp` (32 bytes): `type` and `location.type` are the
    // `int`s at bytes 0 and 8; read unaligned, as the C caller may pack it anywhere.
    let (ty, loc) = unsafe { ((prop as *const i32).read_unaligned(), (prop as *const u8).add(8).cast::<i32>().read_unaligned()) };
    (ty == ALLOCATION_PINNED && LOCATION_HOST.contains(&loc), flags != 0)
}

/// Whether a `CUmemPoolProps` (or the runtime's `cudaMemPoolProps`, the same layout: `allocType`
/// at 0, `location {type, id}` at 8) asks for a host pool.
pub(crate) unsafe fn pool_props_host(props: *const c_void) -> bool {
    // SAFETY: the caller's props, null or a `CUmemPoolProps` whose first 16 bytes are read here.
    unsafe { host_prop(props, 0) }.0
}

/// A pool attribute (`RESERVED_MEM_CURRENT`, `USED_MEM_CURRENT`), asked of the real runtime.
pub(crate) fn pool_attr(get: Option<PoolAttrFn>, pool: u64, attr: i32) -> Option<u64> {
    let get = get?;
    let mut v = 0u64;
    // SAFETY: the real attribute getter, with an attribute whose value is a 64-bit integer and a
    // live out-pointer to one.
    (unsafe { get(pool, attr, &mut v as *mut u64 as *mut c_void) } == SUCCESS).then_some(v)
}

/// The driver's pool calls: its codes, and `cuMemPoolGetAttribute`.
const POOLS: PoolApi<c_int> = PoolApi { codes: CODES, read: driver_pool_attr };

fn driver_pool_attr(pool: u64, attr: i32) -> Option<u64> {
    // SAFETY: `PoolAttrFn` is the C type of `cuMemPoolGetAttribute`.
    pool_attr(unsafe { real!("cuMemPoolGetAttribute").get::<PoolAttrFn>() }, pool, attr)
}

unsafe fn pool_create(f: PoolCreateFn, pool: *mut u64, props: *const c_void) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pool, props) },
        Some(h) => {
            // SAFETY: `props` is the C caller's, null or a `CUmemPoolProps`.
            let host = unsafe { pool_props_host(props) };
            // SAFETY: as above: the hook makes that same call, at most once, before it returns.
            h.pool_handed_out(Api::CuMemPoolCreate, pool, host, true, POOLS, || unsafe { f(pool, props) })
        }
    }
}

unsafe fn pool_destroy(f: PoolFn, pool: u64) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's argument under its contract.
        None => unsafe { f(pool) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.shrink_pool(Api::CuMemPoolDestroy, pool, true, POOLS, || unsafe { f(pool) }),
    }
}

unsafe fn pool_trim(f: PoolTrimFn, pool: u64, keep: usize) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pool, keep) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.shrink_pool(Api::CuMemPoolTrimTo, pool, false, POOLS, || unsafe { f(pool, keep) }),
    }
}

unsafe fn pool_alloc(f: PoolAllocFn, dptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(dptr, size, pool, stream) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc_from_pool(Api::CuMemAllocFromPoolAsync, dptr, size, pool, POOLS, || unsafe { f(dptr, size, pool, stream) }),
    }
}

unsafe fn free_async(f: FreeAsyncFn, dptr: usize, stream: *mut c_void) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(dptr, stream) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.free_to_pool(Api::CuMemFreeAsync, dptr, POOLS, || unsafe { f(dptr, stream) }),
    }
}

unsafe fn mem_create(f: MemCreateFn, handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(handle, size, prop, flags) },
        Some(h) => {
            // SAFETY: `prop` is the C caller's, null or a `CUmemAllocationProp`.
            let (host, rejected) = unsafe { host_prop(prop, flags) };
            let req = host.then_some(if rejected { Request::Rejected } else { Request::Mapped });
            // SAFETY: as above: the hook makes that same call, at most once, before it returns.
            h.create_physical(Api::CuMemCreate, handle, size, req, CODES, || unsafe { f(handle, size, prop, flags) })
        }
    }
}

unsafe fn mem_release(f: MemReleaseFn, handle: u64) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(handle) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release_physical(Api::CuMemRelease, handle, SUCCESS, || unsafe { f(handle) }),
    }
}

unsafe fn mem_map(f: MemMapFn, ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, offset, handle, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.map_physical(Api::CuMemMap, ptr as usize, size, handle, SUCCESS, || unsafe { f(ptr, size, offset, handle, flags) }),
    }
}

unsafe fn mem_unmap(f: MemUnmapFn, ptr: u64, size: usize) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.unmap_physical(Api::CuMemUnmap, ptr as usize, size.max(1), SUCCESS, || unsafe { f(ptr, size) }),
    }
}

unsafe fn mem_retain(f: MemRetainFn, handle: *mut u64, addr: *mut c_void) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(handle, addr) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.retain_physical(Api::CuMemRetainAllocationHandle, handle, SUCCESS, || unsafe { f(handle, addr) }),
    }
}

/// `cuGetProcAddress`: the driver's answer, with pinguard's wrapper in place of the real function
/// for the names it tracks. Everything else (status, other symbols, version choice) is the
/// driver's own.
unsafe fn get_proc(f: GetProcFn, symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> c_int {
    // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
    let rc = unsafe { f(symbol, pfn, version, flags) };
    if rc == SUCCESS {
        // SAFETY: `symbol` and `pfn` are the C caller's: a C string and an out-pointer the driver
        // has just written (`wrap_proc` checks for null).
        unsafe { wrap_proc(symbol, pfn, version) };
    }
    rc
}

unsafe fn get_proc_v2(f: GetProcV2Fn, symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> c_int {
    // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
    let rc = unsafe { f(symbol, pfn, version, flags, status) };
    if rc == SUCCESS {
        // SAFETY: as in `get_proc`.
        unsafe { wrap_proc(symbol, pfn, version) };
    }
    rc
}

unsafe fn wrap_proc(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int) {
    // SAFETY: `pfn` is not null, so the caller's valid, written out-pointer.
    if symbol.is_null() || pfn.is_null() || unsafe { (*pfn).is_null() } || !crate::lifecycle::hooks_enabled(Family::CudaDriver) {
        return;
    }
    // SAFETY: `symbol` is not null, so the caller's NUL-terminated name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    // SAFETY: `pfn` is not null, so the caller's valid, written out-pointer.
    let real = unsafe { *pfn } as usize;
    // The driver picks the ABI by the version asked for; so do the wrappers.
    let w = match name {
        b"cuMemHostAlloc" => host_alloc_slots::bind(real),
        b"cuMemAllocHost" if version < 3020 => alloc_host_legacy_slots::bind(real),
        b"cuMemAllocHost" | b"cuMemAllocHost_v2" => alloc_host_v2_slots::bind(real),
        b"cuMemHostRegister" if version < 6050 => register_legacy_slots::bind(real),
        b"cuMemHostRegister" | b"cuMemHostRegister_v2" => register_v2_slots::bind(real),
        b"cuMemFreeHost" => free_host_slots::bind(real),
        b"cuMemHostUnregister" => host_unregister_slots::bind(real),
        b"cuMemCreate" => mem_create_slots::bind(real),
        b"cuMemRelease" => mem_release_slots::bind(real),
        b"cuMemMap" => mem_map_slots::bind(real),
        b"cuMemUnmap" => mem_unmap_slots::bind(real),
        b"cuMemRetainAllocationHandle" => mem_retain_slots::bind(real),
        // With CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM the driver answers these names with
        // their `_ptsz` functions, of the same types.
        b"cuMemPoolCreate" => pool_create_slots::bind(real),
        b"cuMemPoolDestroy" => pool_destroy_slots::bind(real),
        b"cuMemPoolTrimTo" => pool_trim_slots::bind(real),
        b"cuMemAllocFromPoolAsync" => pool_alloc_slots::bind(real),
        b"cuMemFreeAsync" => free_async_slots::bind(real),
        b"cuMemGetDefaultMemPool" => default_pool_slots::bind(real),
        b"cuMemGetMemPool" => current_pool_slots::bind(real),
        b"cuGetProcAddress" if version < 12000 => get_proc_slots::bind(real),
        b"cuGetProcAddress" | b"cuGetProcAddress_v2" => get_proc_v2_slots::bind(real),
        _ => None,
    };
    if let Some(w) = w {
        // SAFETY: `pfn` is the caller's out-pointer, not null (checked above).
        unsafe { *pfn = w as *mut c_void };
    }
}

/// The wrapper for a driver function `dlsym(handle, name)` returned, if `name` is one: by exported
/// name, so the unsuffixed names are the legacy ABIs.
pub fn redirect(name: &CStr, real: usize) -> Option<Option<usize>> {
    Some(match name.to_bytes() {
        b"cuMemHostAlloc" => host_alloc_slots::bind(real),
        b"cuMemAllocHost" => alloc_host_legacy_slots::bind(real),
        b"cuMemAllocHost_v2" => alloc_host_v2_slots::bind(real),
        b"cuMemHostRegister" => register_legacy_slots::bind(real),
        b"cuMemHostRegister_v2" => register_v2_slots::bind(real),
        b"cuMemFreeHost" => free_host_slots::bind(real),
        b"cuMemHostUnregister" => host_unregister_slots::bind(real),
        b"cuMemCreate" => mem_create_slots::bind(real),
        b"cuMemRelease" => mem_release_slots::bind(real),
        b"cuMemMap" => mem_map_slots::bind(real),
        b"cuMemUnmap" => mem_unmap_slots::bind(real),
        b"cuMemRetainAllocationHandle" => mem_retain_slots::bind(real),
        b"cuMemPoolCreate" => pool_create_slots::bind(real),
        b"cuMemPoolDestroy" => pool_destroy_slots::bind(real),
        b"cuMemPoolTrimTo" => pool_trim_slots::bind(real),
        b"cuMemAllocFromPoolAsync" | b"cuMemAllocFromPoolAsync_ptsz" => pool_alloc_slots::bind(real),
        b"cuMemFreeAsync" | b"cuMemFreeAsync_ptsz" => free_async_slots::bind(real),
        b"cuMemGetDefaultMemPool" => default_pool_slots::bind(real),
        b"cuMemGetMemPool" => current_pool_slots::bind(real),
        b"cuGetProcAddress" => get_proc_slots::bind(real),
        b"cuGetProcAddress_v2" => get_proc_v2_slots::bind(real),
        _ => return None,
    })
}

slots!(host_alloc_slots, HostAllocFn, host_alloc, (pp: *mut *mut c_void, size: usize, flags: c_uint) -> c_int);
slots!(alloc_host_v2_slots, AllocHostFn, alloc_host_v2, (pp: *mut *mut c_void, size: usize) -> c_int);
slots!(alloc_host_legacy_slots, AllocHostLegacyFn, alloc_host_legacy, (pp: *mut *mut c_void, size: c_uint) -> c_int);
slots!(register_v2_slots, RegisterFn, register_v2, (p: *mut c_void, size: usize, flags: c_uint) -> c_int);
slots!(register_legacy_slots, RegisterFn, register_legacy, (p: *mut c_void, size: usize, flags: c_uint) -> c_int);
slots!(free_host_slots, FreeFn, free_host, (p: *mut c_void) -> c_int);
slots!(host_unregister_slots, FreeFn, host_unregister, (p: *mut c_void) -> c_int);
slots!(mem_create_slots, MemCreateFn, mem_create, (handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int);
slots!(mem_release_slots, MemReleaseFn, mem_release, (handle: u64) -> c_int);
slots!(mem_map_slots, MemMapFn, mem_map, (ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> c_int);
slots!(mem_unmap_slots, MemUnmapFn, mem_unmap, (ptr: u64, size: usize) -> c_int);
slots!(mem_retain_slots, MemRetainFn, mem_retain, (handle: *mut u64, addr: *mut c_void) -> c_int);
slots!(pool_create_slots, PoolCreateFn, pool_create, (pool: *mut u64, props: *const c_void) -> c_int);
slots!(pool_destroy_slots, PoolFn, pool_destroy, (pool: u64) -> c_int);
slots!(pool_trim_slots, PoolTrimFn, pool_trim, (pool: u64, keep: usize) -> c_int);
slots!(pool_alloc_slots, PoolAllocFn, pool_alloc, (dptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int);
slots!(free_async_slots, FreeAsyncFn, free_async, (dptr: usize, stream: *mut c_void) -> c_int);
slots!(default_pool_slots, PoolOfFn, default_pool, (pool: *mut u64, location: *const c_int, ty: c_int) -> c_int);
slots!(current_pool_slots, PoolOfFn, current_pool, (pool: *mut u64, location: *const c_int, ty: c_int) -> c_int);
slots!(get_proc_slots, GetProcFn, get_proc, (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> c_int);
slots!(get_proc_v2_slots, GetProcV2Fn, get_proc_v2, (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> c_int);

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    // SAFETY: `HostAllocFn` is the C type of `cuMemHostAlloc`.
    match unsafe { real!("cuMemHostAlloc").get::<HostAllocFn>() } {
        // SAFETY: `f` is the real `cuMemHostAlloc`, given the C caller's arguments under its contract.
        Some(f) => unsafe { host_alloc(f, pp, size, flags) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> c_int {
    // SAFETY: `AllocHostFn` is the C type of `cuMemAllocHost_v2`.
    match unsafe { real!("cuMemAllocHost_v2").get::<AllocHostFn>() } {
        // SAFETY: `f` is the real `cuMemAllocHost_v2`, given the C caller's arguments under its contract.
        Some(f) => unsafe { alloc_host_v2(f, pp, size) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemAllocHost(pp: *mut *mut c_void, size: c_uint) -> c_int {
    // SAFETY: `AllocHostLegacyFn` is the C type of `cuMemAllocHost`.
    match unsafe { real!("cuMemAllocHost").get::<AllocHostLegacyFn>() } {
        // SAFETY: `f` is the real `cuMemAllocHost`, given the C caller's arguments under its contract.
        Some(f) => unsafe { alloc_host_legacy(f, pp, size) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint) -> c_int {
    // SAFETY: `RegisterFn` is the C type of `cuMemHostRegister_v2`.
    match unsafe { real!("cuMemHostRegister_v2").get::<RegisterFn>() } {
        // SAFETY: `f` is the real `cuMemHostRegister_v2`, given the C caller's arguments under its contract.
        Some(f) => unsafe { register_v2(f, p, size, flags) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemHostRegister(p: *mut c_void, size: usize, flags: c_uint) -> c_int {
    // SAFETY: `RegisterFn` is the C type of `cuMemHostRegister`.
    match unsafe { real!("cuMemHostRegister").get::<RegisterFn>() } {
        // SAFETY: `f` is the real `cuMemHostRegister`, given the C caller's arguments under its contract.
        Some(f) => unsafe { register_legacy(f, p, size, flags) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemFreeHost(p: *mut c_void) -> c_int {
    // SAFETY: `FreeFn` is the C type of `cuMemFreeHost`.
    match unsafe { real!("cuMemFreeHost").get::<FreeFn>() } {
        // SAFETY: `f` is the real `cuMemFreeHost`, given the C caller's arguments under its contract.
        Some(f) => unsafe { free_host(f, p) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemHostUnregister(p: *mut c_void) -> c_int {
    // SAFETY: `FreeFn` is the C type of `cuMemHostUnregister`.
    match unsafe { real!("cuMemHostUnregister").get::<FreeFn>() } {
        // SAFETY: `f` is the real `cuMemHostUnregister`, given the C caller's arguments under its contract.
        Some(f) => unsafe { host_unregister(f, p) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> c_int {
    // SAFETY: `GetProcFn` is the C type of `cuGetProcAddress`.
    match unsafe { real!("cuGetProcAddress").get::<GetProcFn>() } {
        // SAFETY: `f` is the real `cuGetProcAddress`, given the C caller's arguments under its contract.
        Some(f) => unsafe { get_proc(f, symbol, pfn, version, flags) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> c_int {
    // SAFETY: `GetProcV2Fn` is the C type of `cuGetProcAddress_v2`.
    match unsafe { real!("cuGetProcAddress_v2").get::<GetProcV2Fn>() } {
        // SAFETY: `f` is the real `cuGetProcAddress_v2`, given the C caller's arguments under its contract.
        Some(f) => unsafe { get_proc_v2(f, symbol, pfn, version, flags, status) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int {
    // SAFETY: `MemCreateFn` is the C type of `cuMemCreate`.
    match unsafe { real!("cuMemCreate").get::<MemCreateFn>() } {
        // SAFETY: `f` is the real `cuMemCreate`, given the C caller's arguments under its contract.
        Some(f) => unsafe { mem_create(f, handle, size, prop, flags) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemRelease(handle: u64) -> c_int {
    // SAFETY: `MemReleaseFn` is the C type of `cuMemRelease`.
    match unsafe { real!("cuMemRelease").get::<MemReleaseFn>() } {
        // SAFETY: `f` is the real `cuMemRelease`, given the C caller's argument under its contract.
        Some(f) => unsafe { mem_release(f, handle) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> c_int {
    // SAFETY: `MemMapFn` is the C type of `cuMemMap`.
    match unsafe { real!("cuMemMap").get::<MemMapFn>() } {
        // SAFETY: `f` is the real `cuMemMap`, given the C caller's arguments under its contract.
        Some(f) => unsafe { mem_map(f, ptr, size, offset, handle, flags) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemUnmap(ptr: u64, size: usize) -> c_int {
    // SAFETY: `MemUnmapFn` is the C type of `cuMemUnmap`.
    match unsafe { real!("cuMemUnmap").get::<MemUnmapFn>() } {
        // SAFETY: `f` is the real `cuMemUnmap`, given the C caller's arguments under its contract.
        Some(f) => unsafe { mem_unmap(f, ptr, size) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) -> c_int {
    // SAFETY: `MemRetainFn` is the C type of `cuMemRetainAllocationHandle`.
    match unsafe { real!("cuMemRetainAllocationHandle").get::<MemRetainFn>() } {
        // SAFETY: `f` is the real `cuMemRetainAllocationHandle`, given the C caller's arguments under its contract.
        Some(f) => unsafe { mem_retain(f, handle, addr) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemPoolCreate(pool: *mut u64, props: *const c_void) -> c_int {
    // SAFETY: `PoolCreateFn` is the C type of `cuMemPoolCreate`.
    match unsafe { real!("cuMemPoolCreate").get::<PoolCreateFn>() } {
        // SAFETY: `f` is the real `cuMemPoolCreate`, given the C caller's arguments under its contract.
        Some(f) => unsafe { pool_create(f, pool, props) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemPoolDestroy(pool: u64) -> c_int {
    // SAFETY: `PoolFn` is the C type of `cuMemPoolDestroy`.
    match unsafe { real!("cuMemPoolDestroy").get::<PoolFn>() } {
        // SAFETY: `f` is the real `cuMemPoolDestroy`, given the C caller's arguments under its contract.
        Some(f) => unsafe { pool_destroy(f, pool) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemPoolTrimTo(pool: u64, keep: usize) -> c_int {
    // SAFETY: `PoolTrimFn` is the C type of `cuMemPoolTrimTo`.
    match unsafe { real!("cuMemPoolTrimTo").get::<PoolTrimFn>() } {
        // SAFETY: `f` is the real `cuMemPoolTrimTo`, given the C caller's arguments under its contract.
        Some(f) => unsafe { pool_trim(f, pool, keep) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemAllocFromPoolAsync(dptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int {
    // SAFETY: `PoolAllocFn` is the C type of `cuMemAllocFromPoolAsync`.
    match unsafe { real!("cuMemAllocFromPoolAsync").get::<PoolAllocFn>() } {
        // SAFETY: `f` is the real `cuMemAllocFromPoolAsync`, given the C caller's arguments under its contract.
        Some(f) => unsafe { pool_alloc(f, dptr, size, pool, stream) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int {
    // SAFETY: `PoolAllocFn` is the C type of `cuMemAllocFromPoolAsync_ptsz`.
    match unsafe { real!("cuMemAllocFromPoolAsync_ptsz").get::<PoolAllocFn>() } {
        // SAFETY: `f` is the real `cuMemAllocFromPoolAsync_ptsz`, given the C caller's arguments under its contract.
        Some(f) => unsafe { pool_alloc(f, dptr, size, pool, stream) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemFreeAsync(dptr: usize, stream: *mut c_void) -> c_int {
    // SAFETY: `FreeAsyncFn` is the C type of `cuMemFreeAsync`.
    match unsafe { real!("cuMemFreeAsync").get::<FreeAsyncFn>() } {
        // SAFETY: `f` is the real `cuMemFreeAsync`, given the C caller's arguments under its contract.
        Some(f) => unsafe { free_async(f, dptr, stream) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemFreeAsync_ptsz(dptr: usize, stream: *mut c_void) -> c_int {
    // SAFETY: `FreeAsyncFn` is the C type of `cuMemFreeAsync_ptsz`.
    match unsafe { real!("cuMemFreeAsync_ptsz").get::<FreeAsyncFn>() } {
        // SAFETY: `f` is the real `cuMemFreeAsync_ptsz`, given the C caller's arguments under its contract.
        Some(f) => unsafe { free_async(f, dptr, stream) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemGetDefaultMemPool(pool: *mut u64, location: *const c_int, ty: c_int) -> c_int {
    // SAFETY: `PoolOfFn` is the C type of `cuMemGetDefaultMemPool`.
    match unsafe { real!("cuMemGetDefaultMemPool").get::<PoolOfFn>() } {
        // SAFETY: `f` is the real `cuMemGetDefaultMemPool`, given the C caller's arguments under its contract.
        Some(f) => unsafe { default_pool(f, pool, location, ty) },
        None => NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C-unwind" fn cuMemGetMemPool(pool: *mut u64, location: *const c_int, ty: c_int) -> c_int {
    // SAFETY: `PoolOfFn` is the C type of `cuMemGetMemPool`.
    match unsafe { real!("cuMemGetMemPool").get::<PoolOfFn>() } {
        // SAFETY: `f` is the real `cuMemGetMemPool`, given the C caller's arguments under its contract.
        Some(f) => unsafe { current_pool(f, pool, location, ty) },
        None => NOT_INITIALIZED,
    }
}
