//! AMD's HIP runtime (`libamdhip64.so`): `hipHostMalloc` and its older names, `hipExtHostAlloc`,
//! `hipHostFree`/`hipFreeHost`, `hipHostRegister`/`hipHostUnregister`, host-located memory pools,
//! and `hipGetProcAddress` (HIP 6.1+), through which newer programs reach them. `hipError_t` is a
//! C enum, passed as `int`. Its codes and flags are CUDA's where both have them
//! (docs/field-notes.md, "AMD's HIP runtime").

use super::{real, slots};
use crate::api::{Api, Family};
use crate::track::{Hook, Request};
use std::ffi::{c_char, CStr};
use std::os::raw::{c_int, c_uint, c_void};

const SUCCESS: c_int = 0;
/// `hipErrorOutOfMemory` (= `hipErrorMemoryAllocation`).
const OUT_OF_MEMORY: c_int = 2;
/// `hipErrorNotInitialized`, when no runtime (or no such function in it) is behind the hook.
const NOT_INITIALIZED: c_int = 3;
/// `hipErrorHostMemoryAlreadyRegistered`.
const ALREADY_REGISTERED: c_int = 712;
/// `hipHostMallocMapped`: the device needs the page, so pageable memory cannot stand in for it.
const MAPPED: c_uint = 0x2;
/// `hipHostMallocPortable | Mapped | WriteCombined | NumaUser | Coherent | NonCoherent`.
const ALLOC_FLAGS: c_uint = 0x7 | 0x2000_0000 | 0x4000_0000 | 0x8000_0000;
/// `hipHostRegisterPortable | Mapped | IoMemory | hipExtHostRegisterCoarseGrained`.
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
type GetProcFn = unsafe extern "C-unwind" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

/// What `hipHostFree` and `hipFreeHost` release: every host allocation, whichever name made it.
const FREES: [Api; 5] = [Api::HipHostMalloc, Api::HipHostAlloc, Api::HipExtHostAlloc, Api::HipMallocHost, Api::HipMemAllocHost];

/// `hipHostMallocCoherent` and `hipHostMallocNonCoherent`: the runtime refuses both at once.
const COHERENCE: c_uint = 0x4000_0000 | 0x8000_0000;

/// An allocation's flags: device-mapped or not, or a combination the runtime rejects (unknown
/// bits, both coherences), whose answer is the runtime's whatever the budget.
fn alloc_request(flags: c_uint) -> Request {
    match Request::from_flags(flags, ALLOC_FLAGS, MAPPED) {
        _ if flags & COHERENCE == COHERENCE => Request::Rejected,
        r => r,
    }
}

/// A registration is device-mapped whatever its flags (`hipHostRegisterDefault`: "Memory is Mapped
/// and Portable"): never pageable in its place.
fn register_request(flags: c_uint) -> Request {
    match Request::from_flags(flags, REGISTER_FLAGS, MAPPED) {
        Request::Rejected => Request::Rejected,
        _ => Request::Mapped,
    }
}

unsafe fn alloc_as(api: Api, f: AllocFn, ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    match Hook::enter(Family::Hip) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(api, ptr, size, alloc_request(flags), SUCCESS, OUT_OF_MEMORY, || unsafe { f(ptr, size, flags) }),
    }
}

unsafe fn malloc_as(api: Api, f: MallocFn, ptr: *mut *mut c_void, size: usize) -> c_int {
    match Hook::enter(Family::Hip) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc(api, ptr, size, Request::Pageable, SUCCESS, OUT_OF_MEMORY, || unsafe { f(ptr, size) }),
    }
}

unsafe fn free_as(api: Api, f: FreeFn, ptr: *mut c_void) -> c_int {
    match Hook::enter_release(Family::Hip) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release(api, ptr, &FREES, SUCCESS, || unsafe { f(ptr) }),
    }
}

unsafe fn host_malloc(f: AllocFn, ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    // SAFETY: the C caller's arguments, passed on.
    unsafe { alloc_as(Api::HipHostMalloc, f, ptr, size, flags) }
}

unsafe fn host_alloc(f: AllocFn, ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    // SAFETY: the C caller's arguments, passed on.
    unsafe { alloc_as(Api::HipHostAlloc, f, ptr, size, flags) }
}

unsafe fn ext_host_alloc(f: AllocFn, ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    // SAFETY: the C caller's arguments, passed on.
    unsafe { alloc_as(Api::HipExtHostAlloc, f, ptr, size, flags) }
}

unsafe fn malloc_host(f: MallocFn, ptr: *mut *mut c_void, size: usize) -> c_int {
    // SAFETY: the C caller's arguments, passed on.
    unsafe { malloc_as(Api::HipMallocHost, f, ptr, size) }
}

unsafe fn mem_alloc_host(f: MallocFn, ptr: *mut *mut c_void, size: usize) -> c_int {
    // SAFETY: the C caller's arguments, passed on.
    unsafe { malloc_as(Api::HipMemAllocHost, f, ptr, size) }
}

unsafe fn host_free(f: FreeFn, ptr: *mut c_void) -> c_int {
    // SAFETY: the C caller's argument, passed on.
    unsafe { free_as(Api::HipHostFree, f, ptr) }
}

unsafe fn free_host(f: FreeFn, ptr: *mut c_void) -> c_int {
    // SAFETY: the C caller's argument, passed on.
    unsafe { free_as(Api::HipFreeHost, f, ptr) }
}

unsafe fn host_register(f: RegisterFn, ptr: *mut c_void, size: usize, flags: c_uint) -> c_int {
    match Hook::enter(Family::Hip) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, flags) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.register(Api::HipHostRegister, ptr, size, register_request(flags), SUCCESS, OUT_OF_MEMORY, ALREADY_REGISTERED, || unsafe { f(ptr, size, flags) }),
    }
}

unsafe fn host_unregister(f: FreeFn, ptr: *mut c_void) -> c_int {
    match Hook::enter_release(Family::Hip) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.release(Api::HipHostUnregister, ptr, &[Api::HipHostRegister], SUCCESS, || unsafe { f(ptr) }),
    }
}

/// `hipMemPoolGetAttribute` with `hipMemPoolAttrReservedMemCurrent` (5) or `UsedMemCurrent` (7):
/// CUDA's attribute numbers and value type.
fn pool_attr(pool: u64, attr: i32) -> Option<u64> {
    // SAFETY: `PoolAttrFn` is the C type of `hipMemPoolGetAttribute`.
    super::cuda_driver::pool_attr(unsafe { real!("hipMemPoolGetAttribute").get::<super::cuda_driver::PoolAttrFn>() }, pool, attr)
}

unsafe fn pool_create(f: PoolCreateFn, pool: *mut u64, props: *const c_void) -> c_int {
    match Hook::enter(Family::Hip) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pool, props) },
        Some(h) => {
            // SAFETY: `props` is the C caller's, null or a `hipMemPoolProps`, whose first 16 bytes
            // are `CUmemPoolProps`' (`allocType`, `handleTypes`, `location {type, id}`), with the
            // same location types (host 2, host NUMA 3 and 4; 5.2.3 knows only device, 1).
            let host = unsafe { super::cuda_driver::pool_props_host(props) };
            // SAFETY: as above: the hook makes that same call, at most once, before it returns.
            h.pool_handed_out(Api::HipMemPoolCreate, pool, host, true, SUCCESS, pool_attr, || unsafe { f(pool, props) })
        }
    }
}

unsafe fn pool_destroy(f: PoolFn, pool: u64) -> c_int {
    match Hook::enter(Family::Hip) {
        // SAFETY: `f` is the real function, given the C caller's argument under its contract.
        None => unsafe { f(pool) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.shrink_pool(Api::HipMemPoolDestroy, pool, true, SUCCESS, pool_attr, || unsafe { f(pool) }),
    }
}

unsafe fn pool_trim(f: PoolTrimFn, pool: u64, keep: usize) -> c_int {
    match Hook::enter(Family::Hip) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(pool, keep) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.shrink_pool(Api::HipMemPoolTrimTo, pool, false, SUCCESS, pool_attr, || unsafe { f(pool, keep) }),
    }
}

unsafe fn pool_alloc(f: PoolAllocFn, ptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int {
    match Hook::enter(Family::Hip) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, size, pool, stream) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.alloc_from_pool(Api::HipMallocFromPoolAsync, ptr, size, pool, SUCCESS, OUT_OF_MEMORY, pool_attr, || unsafe { f(ptr, size, pool, stream) }),
    }
}

unsafe fn free_async(f: FreeAsyncFn, ptr: usize, stream: *mut c_void) -> c_int {
    match Hook::enter(Family::Hip) {
        // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
        None => unsafe { f(ptr, stream) },
        // SAFETY: as above: the hook makes that same call, at most once, before it returns.
        Some(h) => h.free_to_pool(Api::HipFreeAsync, ptr, SUCCESS, pool_attr, || unsafe { f(ptr, stream) }),
    }
}

/// `hipGetProcAddress`: the runtime's answer, with pinguard's wrapper in place of the real function
/// for the names it tracks. Everything else (status, other symbols, version choice) is the
/// runtime's own.
unsafe fn get_proc(f: GetProcFn, symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> c_int {
    // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
    let rc = unsafe { f(symbol, pfn, version, flags, status) };
    // SAFETY: `pfn` is checked for null before it is read; on success the runtime wrote it.
    if rc != SUCCESS || symbol.is_null() || pfn.is_null() || unsafe { (*pfn).is_null() } || !crate::lifecycle::hooks_enabled(Family::Hip) {
        return rc;
    }
    // SAFETY: `symbol` is not null, so the caller's NUL-terminated name.
    let name = unsafe { CStr::from_ptr(symbol) };
    // SAFETY: `pfn` is not null and the runtime has just written it.
    if let Some(Some(w)) = redirect(name, unsafe { *pfn } as usize) {
        // SAFETY: `pfn` is the caller's out-pointer, not null (checked above).
        unsafe { *pfn = w as *mut c_void };
    }
    rc
}

slots!(host_malloc_slots, AllocFn, host_malloc, (ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int);
slots!(host_alloc_slots, AllocFn, host_alloc, (ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int);
slots!(ext_host_alloc_slots, AllocFn, ext_host_alloc, (ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int);
slots!(malloc_host_slots, MallocFn, malloc_host, (ptr: *mut *mut c_void, size: usize) -> c_int);
slots!(mem_alloc_host_slots, MallocFn, mem_alloc_host, (ptr: *mut *mut c_void, size: usize) -> c_int);
slots!(host_free_slots, FreeFn, host_free, (ptr: *mut c_void) -> c_int);
slots!(free_host_slots, FreeFn, free_host, (ptr: *mut c_void) -> c_int);
slots!(host_register_slots, RegisterFn, host_register, (ptr: *mut c_void, size: usize, flags: c_uint) -> c_int);
slots!(host_unregister_slots, FreeFn, host_unregister, (ptr: *mut c_void) -> c_int);
slots!(pool_create_slots, PoolCreateFn, pool_create, (pool: *mut u64, props: *const c_void) -> c_int);
slots!(pool_destroy_slots, PoolFn, pool_destroy, (pool: u64) -> c_int);
slots!(pool_trim_slots, PoolTrimFn, pool_trim, (pool: u64, keep: usize) -> c_int);
slots!(pool_alloc_slots, PoolAllocFn, pool_alloc, (ptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int);
slots!(free_async_slots, FreeAsyncFn, free_async, (ptr: usize, stream: *mut c_void) -> c_int);
slots!(get_proc_slots, GetProcFn, get_proc, (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> c_int);

/// The wrapper for a HIP function `dlsym(handle, name)` or `hipGetProcAddress` returned, if `name`
/// is one. The `_spt` names (per-thread default stream) have the same types.
pub fn redirect(name: &CStr, real: usize) -> Option<Option<usize>> {
    Some(match name.to_bytes() {
        b"hipHostMalloc" => host_malloc_slots::bind(real),
        b"hipHostAlloc" => host_alloc_slots::bind(real),
        b"hipExtHostAlloc" => ext_host_alloc_slots::bind(real),
        b"hipMallocHost" => malloc_host_slots::bind(real),
        b"hipMemAllocHost" => mem_alloc_host_slots::bind(real),
        b"hipHostFree" => host_free_slots::bind(real),
        b"hipFreeHost" => free_host_slots::bind(real),
        b"hipHostRegister" => host_register_slots::bind(real),
        b"hipHostUnregister" => host_unregister_slots::bind(real),
        b"hipMemPoolCreate" => pool_create_slots::bind(real),
        b"hipMemPoolDestroy" => pool_destroy_slots::bind(real),
        b"hipMemPoolTrimTo" => pool_trim_slots::bind(real),
        b"hipMallocFromPoolAsync" | b"hipMallocFromPoolAsync_spt" => pool_alloc_slots::bind(real),
        b"hipFreeAsync" | b"hipFreeAsync_spt" => free_async_slots::bind(real),
        b"hipGetProcAddress" | b"hipGetProcAddress_spt" => get_proc_slots::bind(real),
        _ => return None,
    })
}

/// The exported entry point `$name`: the real function found by name, handed to `$body`.
macro_rules! export {
    ($name:ident, $fnty:ty, $body:path, ($($arg:ident : $ty:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) -> c_int {
            static REAL: $crate::runtime::resolve::Real = $crate::runtime::resolve::Real::new(
                // SAFETY: a function's name has no interior NUL and gets one appended.
                unsafe { CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes()) },
            );
            // SAFETY: `$fnty` is the C type of the function of this name.
            match unsafe { REAL.get::<$fnty>() } {
                // SAFETY: `f` is the real function, given the C caller's arguments under its contract.
                Some(f) => unsafe { $body(f, $($arg),*) },
                None => NOT_INITIALIZED,
            }
        }
    };
}

export!(hipHostMalloc, AllocFn, host_malloc, (ptr: *mut *mut c_void, size: usize, flags: c_uint));
export!(hipHostAlloc, AllocFn, host_alloc, (ptr: *mut *mut c_void, size: usize, flags: c_uint));
export!(hipExtHostAlloc, AllocFn, ext_host_alloc, (ptr: *mut *mut c_void, size: usize, flags: c_uint));
export!(hipMallocHost, MallocFn, malloc_host, (ptr: *mut *mut c_void, size: usize));
export!(hipMemAllocHost, MallocFn, mem_alloc_host, (ptr: *mut *mut c_void, size: usize));
export!(hipHostFree, FreeFn, host_free, (ptr: *mut c_void));
export!(hipFreeHost, FreeFn, free_host, (ptr: *mut c_void));
export!(hipHostRegister, RegisterFn, host_register, (ptr: *mut c_void, size: usize, flags: c_uint));
export!(hipHostUnregister, FreeFn, host_unregister, (ptr: *mut c_void));
export!(hipMemPoolCreate, PoolCreateFn, pool_create, (pool: *mut u64, props: *const c_void));
export!(hipMemPoolDestroy, PoolFn, pool_destroy, (pool: u64));
export!(hipMemPoolTrimTo, PoolTrimFn, pool_trim, (pool: u64, keep: usize));
export!(hipMallocFromPoolAsync, PoolAllocFn, pool_alloc, (ptr: *mut usize, size: usize, pool: u64, stream: *mut c_void));
export!(hipFreeAsync, FreeAsyncFn, free_async, (ptr: usize, stream: *mut c_void));
export!(hipGetProcAddress, GetProcFn, get_proc, (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int));
