//! CUDA runtime (`libcudart`): `cudaHostAlloc`, `cudaMallocHost`, `cudaFreeHost`,
//! `cudaHostRegister`, `cudaHostUnregister`, the pools; and `cudaMalloc`, `cudaMallocManaged`,
//! `cudaFree`, counted only where the device's memory is the host's (`track::device`).
//! `cudaError_t` is a C enum, passed as `int`.

use super::{hooks, pools, real};
use crate::api::{Api, Family};
use crate::track::device::{self, DeviceQuery, Runtime};
use crate::track::{Codes, Hook, Request};
use std::os::raw::{c_int, c_uint, c_void};

const SUCCESS: c_int = 0;
/// `cudaErrorMemoryAllocation`: what PyTorch turns into "CUDA out of memory".
const MEMORY_ALLOCATION: c_int = 2;
/// `cudaErrorInitializationError`, when no runtime can be found behind the hook.
const INITIALIZATION_ERROR: c_int = 3;
/// `cudaErrorHostMemoryAlreadyRegistered`.
const ALREADY_REGISTERED: c_int = 712;
/// The runtime's answers (`cudaError_t`).
const CODES: Codes<c_int> = Codes {
    ok: SUCCESS,
    oom: MEMORY_ALLOCATION,
    already: ALREADY_REGISTERED,
};
/// `cudaHostAllocMapped` and `cudaHostRegisterMapped`: the device needs the page, so pageable
/// memory cannot stand in for it.
const MAPPED: c_uint = 2;
/// `cudaHostAllocPortable | Mapped | WriteCombined`.
const ALLOC_FLAGS: c_uint = 0x7;
/// `cudaHostRegisterPortable | Mapped | IoMemory | ReadOnly`.
const REGISTER_FLAGS: c_uint = 0xf;
/// `cudaHostRegisterIoMemory`: the range is a device's registers, not RAM.
const IO_MEMORY: c_uint = 0x4;
/// `cudaMemAttachGlobal`, `cudaMemAttachHost`: one of them, the only flags `cudaMallocManaged` takes.
const ATTACH: [c_uint; 2] = [0x1, 0x2];
/// `cudaDevAttrIntegrated`.
const DEV_ATTR_INTEGRATED: c_int = 18;

/// Every registration's records, for `cudaHostUnregister`.
const REGISTERS: [Api; 2] = [Api::CudaHostRegister, Api::CudaHostRegisterIoMemory];
/// Every device allocation's records, for `cudaFree`.
const DEVICE_ALLOCS: [Api; 2] = [Api::CudaMalloc, Api::CudaMallocManaged];

type IntOutFn = unsafe extern "C-unwind" fn(*mut c_int) -> c_int;
type AttrFn = unsafe extern "C-unwind" fn(*mut c_int, c_int, c_int) -> c_int;

/// `f(&out)`, the runtime's `int` answer when it succeeds.
fn int_out(f: Option<IntOutFn>) -> Option<c_int> {
    let mut v: c_int = 0;
    // SAFETY: `f` is the runtime's function of this C type, given a valid out-pointer.
    (unsafe { f?(&mut v) } == SUCCESS).then_some(v)
}

/// The runtime's devices, as the program's own runtime calls see them.
const DEVICES: DeviceQuery = DeviceQuery {
    // SAFETY: `IntOutFn` is `cudaGetDeviceCount`'s C type.
    count: || int_out(unsafe { real!("cudaGetDeviceCount").get::<IntOutFn>() }),
    integrated: |d| {
        // SAFETY: `AttrFn` is `cudaDeviceGetAttribute`'s C type.
        let f = unsafe { real!("cudaDeviceGetAttribute").get::<AttrFn>() }?;
        let mut v: c_int = 0;
        // SAFETY: `f` is the runtime's function, given a valid out-pointer, an attribute and a
        // device ordinal it answered for.
        (unsafe { f(&mut v, DEV_ATTR_INTEGRATED, d) } == SUCCESS).then_some(v != 0)
    },
    // SAFETY: `IntOutFn` is `cudaGetDevice`'s C type.
    current: || int_out(unsafe { real!("cudaGetDevice").get::<IntOutFn>() }),
};

super::pools::pools!(
    CODES,
    "cudaMemPoolGetAttribute",
    CudaMemPoolCreate CudaMemPoolDestroy CudaMemPoolTrimTo CudaMallocFromPoolAsync CudaFreeAsync,
    get CudaMemGetDefaultMemPool CudaMemGetMemPool
);

unsafe fn host_alloc(
    h: Hook,
    real: cudaHostAlloc::Call,
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    h.alloc(
        Api::CudaHostAlloc,
        ptr,
        size,
        Request::from_flags(flags, ALLOC_FLAGS, MAPPED),
        CODES,
        move || real.call(),
    )
}

unsafe fn malloc_host(
    h: Hook,
    real: cudaMallocHost::Call,
    ptr: *mut *mut c_void,
    size: usize,
) -> c_int {
    h.alloc(
        Api::CudaMallocHost,
        ptr,
        size,
        Request::Pageable,
        CODES,
        move || real.call(),
    )
}

unsafe fn host_register(
    h: Hook,
    real: cudaHostRegister::Call,
    ptr: *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    if flags & IO_MEMORY != 0 && flags & !REGISTER_FLAGS == 0 {
        return h.register_io(Api::CudaHostRegisterIoMemory, ptr, SUCCESS, move || {
            real.call()
        });
    }
    h.register(
        Api::CudaHostRegister,
        ptr,
        size,
        Request::from_flags(flags, REGISTER_FLAGS, MAPPED),
        CODES,
        move || real.call(),
    )
}

unsafe fn free_host(h: Hook, real: cudaFreeHost::Call, ptr: *mut c_void) -> c_int {
    h.release(
        Api::CudaFreeHost,
        ptr,
        &[Api::CudaHostAlloc, Api::CudaMallocHost],
        SUCCESS,
        move || real.call(),
    )
}

unsafe fn host_unregister(h: Hook, real: cudaHostUnregister::Call, ptr: *mut c_void) -> c_int {
    h.release(
        Api::CudaHostUnregister,
        ptr,
        &REGISTERS,
        SUCCESS,
        move || real.call(),
    )
}

/// A device allocation, counted where the device's memory is the host's; pinned or nothing. Its
/// rows are `raw`: the question comes before the hook is entered, so that a discrete device's
/// call never enters.
#[inline(always)]
fn device_alloc(
    api: Api,
    ptr: *mut *mut c_void,
    size: usize,
    req: Request,
    real: impl FnOnce() -> c_int,
) -> c_int {
    if !device::counts(Runtime::Cuda, &DEVICES) {
        return real();
    }
    device_alloc_counted(api, ptr, size, req, real)
}

/// Out of line: a discrete device's allocation saves no registers for it.
#[inline(never)]
fn device_alloc_counted(
    api: Api,
    ptr: *mut *mut c_void,
    size: usize,
    req: Request,
    real: impl FnOnce() -> c_int,
) -> c_int {
    match Hook::enter(Family::Cuda) {
        None => real(),
        Some(h) => h.alloc(api, ptr, size, req, CODES, real),
    }
}

unsafe fn malloc(real: cudaMalloc::Call, ptr: *mut *mut c_void, size: usize) -> c_int {
    device_alloc(Api::CudaMalloc, ptr, size, Request::Mapped, move || {
        real.call()
    })
}

unsafe fn malloc_managed(
    real: cudaMallocManaged::Call,
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    let req = match ATTACH.contains(&flags) {
        true => Request::Mapped,
        false => Request::Rejected,
    };
    device_alloc(Api::CudaMallocManaged, ptr, size, req, move || real.call())
}

unsafe fn free(real: cudaFree::Call, ptr: *mut c_void) -> c_int {
    if !device::may_count(Runtime::Cuda) {
        return real.call();
    }
    free_counted(real, ptr)
}

/// Out of line: a discrete device's free saves no registers for it.
#[inline(never)]
fn free_counted(real: cudaFree::Call, ptr: *mut c_void) -> c_int {
    match Hook::enter_release(Family::Cuda) {
        None => real.call(),
        Some(h) => h.release_device(Api::CudaFree, ptr, &DEVICE_ALLOCS, SUCCESS, move || {
            real.call()
        }),
    }
}

hooks! {
    family Cuda, missing INITIALIZATION_ERROR;
    /// Pinned host memory, `flags` saying portable, mapped, write-combined.
    fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int => enter host_alloc;
    /// Pinned host memory, default flags.
    fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int => enter malloc_host;
    /// Pins memory the caller owns.
    fn cudaHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) -> c_int => enter host_register;
    /// Frees what `cudaHostAlloc` or `cudaMallocHost` gave.
    fn cudaFreeHost(ptr: *mut c_void) -> c_int => release free_host;
    /// Unpins what `cudaHostRegister` pinned.
    fn cudaHostUnregister(ptr: *mut c_void) -> c_int => release host_unregister;
    /// A memory pool, perhaps of pinned host memory.
    fn cudaMemPoolCreate(pool: *mut u64, props: *const c_void) -> c_int => enter pools::create::<Pools>;
    /// A pool's end: its memory goes back.
    fn cudaMemPoolDestroy(pool: u64) -> c_int => enter pools::destroy::<Pools>;
    /// A pool gives back what it holds beyond `keep` bytes.
    fn cudaMemPoolTrimTo(pool: u64, keep: usize) -> c_int => enter pools::trim::<Pools>;
    /// An allocation from a pool, which may grow it.
    fn cudaMallocFromPoolAsync(ptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int => enter pools::alloc::<Pools>;
    /// The same, on the per-thread default stream.
    fn cudaMallocFromPoolAsync_ptsz(ptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int => enter pools::alloc::<Pools>;
    /// An allocation back to its pool.
    fn cudaFreeAsync(ptr: usize, stream: *mut c_void) -> c_int => enter pools::free::<Pools>;
    /// The same, on the per-thread default stream.
    fn cudaFreeAsync_ptsz(ptr: usize, stream: *mut c_void) -> c_int => enter pools::free::<Pools>;
    /// A location's default pool, perhaps a host one.
    fn cudaMemGetDefaultMemPool(pool: *mut u64, location: *const c_int, ty: c_int) -> c_int => enter pools::handed_out::<DefaultPool>;
    /// A location's current pool.
    fn cudaMemGetMemPool(pool: *mut u64, location: *const c_int, ty: c_int) -> c_int => enter pools::handed_out::<CurrentPool>;
    /// Device memory: the host's own on an integrated device.
    fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> c_int => raw malloc;
    /// Memory the device and the host share, migrated on demand.
    fn cudaMallocManaged(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int => raw malloc_managed;
    /// Frees what `cudaMalloc` or `cudaMallocManaged` gave.
    fn cudaFree(ptr: *mut c_void) -> c_int => raw free;
}
