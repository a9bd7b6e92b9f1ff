//! CUDA driver (`libcuda.so.1`): host allocation and registration, and `cuGetProcAddress`, through
//! which `libcudart`, static-cudart programs and JAX/XLA reach every driver function. `CUresult`
//! is a C enum, passed as `int`.
//!
//! Device allocations (`cuMemAlloc_v2`, `cuMemAllocManaged`, `cuMemFree_v2`) are counted only
//! where the device's memory is the host's (`track::device`).
//!
//! Two ABIs hide behind some names: the legacy `cuMemAllocHost` takes an `unsigned int` size (the
//! `_v2` one, which `cuda.h` maps the name to since CUDA 3.2, a `size_t`), and
//! `cuGetProcAddress` gained a fifth argument in `_v2` (CUDA 12.0). Each gets its own wrappers.

use super::cuda_abi::host_prop;
use super::{hooks, pools, real};
use crate::api::{Api, Family};
use crate::track::device::{self, DeviceQuery, Runtime};
use crate::track::{Codes, Hook, Request};
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
/// `CU_MEMHOSTREGISTER_IOMEMORY`: the range is a device's registers, not RAM.
const IO_MEMORY: c_uint = 0x4;
/// `CU_MEM_ATTACH_GLOBAL`, `CU_MEM_ATTACH_HOST`: one of them, the only flags `cuMemAllocManaged`
/// takes.
const ATTACH: [c_uint; 2] = [0x1, 0x2];
/// `CU_DEVICE_ATTRIBUTE_INTEGRATED`.
const ATTRIBUTE_INTEGRATED: c_int = 18;
/// Every registration's records, for `cuMemHostUnregister`.
const REGISTERS: [Api; 3] = [
    Api::CuMemHostRegisterV2,
    Api::CuMemHostRegister,
    Api::CuMemHostRegisterIoMemory,
];
/// Every device allocation's records, for `cuMemFree_v2`.
const DEVICE_ALLOCS: [Api; 2] = [Api::CuMemAllocV2, Api::CuMemAllocManaged];

type IntOutFn = unsafe extern "C-unwind" fn(*mut c_int) -> c_int;
type DeviceGetFn = unsafe extern "C-unwind" fn(*mut c_int, c_int) -> c_int;
type AttrFn = unsafe extern "C-unwind" fn(*mut c_int, c_int, c_int) -> c_int;

/// `f(&out)`, the driver's `int` answer when it succeeds.
fn int_out(f: Option<IntOutFn>) -> Option<c_int> {
    let mut v: c_int = 0;
    // SAFETY: `f` is the driver's function of this C type, given a valid out-pointer.
    (unsafe { f?(&mut v) } == SUCCESS).then_some(v)
}

/// Whether the device of `ordinal` is integrated, asked of its `CUdevice`.
fn integrated(ordinal: c_int) -> Option<bool> {
    // SAFETY: `DeviceGetFn` and `AttrFn` are `cuDeviceGet`'s and `cuDeviceGetAttribute`'s C types.
    let (get, attr) = unsafe {
        (
            real!("cuDeviceGet").get::<DeviceGetFn>()?,
            real!("cuDeviceGetAttribute").get::<AttrFn>()?,
        )
    };
    let (mut dev, mut v): (c_int, c_int) = (0, 0);
    // SAFETY: the driver's functions, given valid out-pointers, an ordinal below its count and
    // the device it answered for it.
    let ok = unsafe {
        get(&mut dev, ordinal) == SUCCESS && attr(&mut v, ATTRIBUTE_INTEGRATED, dev) == SUCCESS
    };
    ok.then_some(v != 0)
}

/// The driver's devices, as the program's own driver calls see them. The current context's
/// `CUdevice` is taken for its ordinal, as NVIDIA's driver numbers them.
const DEVICES: DeviceQuery = DeviceQuery {
    // SAFETY: `IntOutFn` is `cuDeviceGetCount`'s C type.
    count: || int_out(unsafe { real!("cuDeviceGetCount").get::<IntOutFn>() }),
    integrated,
    // SAFETY: `IntOutFn` is `cuCtxGetDevice`'s C type (`CUdevice` is an `int`).
    current: || int_out(unsafe { real!("cuCtxGetDevice").get::<IntOutFn>() }),
};

/// The driver's answers (`CUresult`).
const CODES: Codes<c_int> = Codes {
    ok: SUCCESS,
    oom: OUT_OF_MEMORY,
    already: ALREADY_REGISTERED,
};

unsafe fn host_alloc(
    h: Hook,
    real: cuMemHostAlloc::Call,
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    h.alloc(
        Api::CuMemHostAlloc,
        pp,
        size,
        Request::from_flags(flags, ALLOC_FLAGS, DEVICEMAP),
        CODES,
        move || real.call(),
    )
}

unsafe fn alloc_host_v2(
    h: Hook,
    real: cuMemAllocHost_v2::Call,
    pp: *mut *mut c_void,
    size: usize,
) -> c_int {
    h.alloc(
        Api::CuMemAllocHostV2,
        pp,
        size,
        Request::Pageable,
        CODES,
        move || real.call(),
    )
}

unsafe fn alloc_host_legacy(
    h: Hook,
    real: cuMemAllocHost::Call,
    pp: *mut *mut c_void,
    size: c_uint,
) -> c_int {
    h.alloc(
        Api::CuMemAllocHost,
        pp,
        size as usize,
        Request::Pageable,
        CODES,
        move || real.call(),
    )
}

unsafe fn register_v2(
    h: Hook,
    real: cuMemHostRegister_v2::Call,
    p: *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    if flags & IO_MEMORY != 0 && flags & !REGISTER_FLAGS == 0 {
        return h.register_io(Api::CuMemHostRegisterIoMemory, p, SUCCESS, move || {
            real.call()
        });
    }
    h.register(
        Api::CuMemHostRegisterV2,
        p,
        size,
        Request::from_flags(flags, REGISTER_FLAGS, DEVICEMAP),
        CODES,
        move || real.call(),
    )
}

unsafe fn register_legacy(
    h: Hook,
    real: cuMemHostRegister::Call,
    p: *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    if flags & IO_MEMORY != 0 && flags & !REGISTER_FLAGS == 0 {
        return h.register_io(Api::CuMemHostRegisterIoMemory, p, SUCCESS, move || {
            real.call()
        });
    }
    h.register(
        Api::CuMemHostRegister,
        p,
        size,
        Request::from_flags(flags, REGISTER_FLAGS, DEVICEMAP),
        CODES,
        move || real.call(),
    )
}

unsafe fn free_host(h: Hook, real: cuMemFreeHost::Call, p: *mut c_void) -> c_int {
    h.release(
        Api::CuMemFreeHost,
        p,
        &[
            Api::CuMemHostAlloc,
            Api::CuMemAllocHostV2,
            Api::CuMemAllocHost,
        ],
        SUCCESS,
        move || real.call(),
    )
}

unsafe fn host_unregister(h: Hook, real: cuMemHostUnregister::Call, p: *mut c_void) -> c_int {
    h.release(
        Api::CuMemHostUnregister,
        p,
        &REGISTERS,
        SUCCESS,
        move || real.call(),
    )
}

super::pools::pools!(
    CODES,
    "cuMemPoolGetAttribute",
    CuMemPoolCreate CuMemPoolDestroy CuMemPoolTrimTo CuMemAllocFromPoolAsync CuMemFreeAsync,
    get CuMemGetDefaultMemPool CuMemGetMemPool
);

unsafe fn mem_create(
    h: Hook,
    real: cuMemCreate::Call,
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> c_int {
    // SAFETY: `prop` is the C caller's, null or a `CUmemAllocationProp`.
    let (host, rejected) = unsafe { host_prop(prop, flags) };
    let req = host.then_some(if rejected {
        Request::Rejected
    } else {
        Request::Mapped
    });
    h.create_physical(Api::CuMemCreate, handle, size, req, CODES, move || {
        real.call()
    })
}

unsafe fn mem_release(h: Hook, real: cuMemRelease::Call, handle: u64) -> c_int {
    h.release_physical(Api::CuMemRelease, handle, SUCCESS, move || real.call())
}

unsafe fn mem_map(
    h: Hook,
    real: cuMemMap::Call,
    ptr: u64,
    size: usize,
    _offset: usize,
    handle: u64,
    _flags: u64,
) -> c_int {
    h.map_physical(
        Api::CuMemMap,
        ptr as usize,
        size,
        handle,
        SUCCESS,
        move || real.call(),
    )
}

unsafe fn mem_unmap(h: Hook, real: cuMemUnmap::Call, ptr: u64, size: usize) -> c_int {
    h.unmap_physical(
        Api::CuMemUnmap,
        ptr as usize,
        size.max(1),
        SUCCESS,
        move || real.call(),
    )
}

unsafe fn mem_retain(
    h: Hook,
    real: cuMemRetainAllocationHandle::Call,
    handle: *mut u64,
    _addr: *mut c_void,
) -> c_int {
    h.retain_physical(
        Api::CuMemRetainAllocationHandle,
        handle,
        SUCCESS,
        move || real.call(),
    )
}

/// `cuGetProcAddress`: the driver's answer, with pinguard's wrapper in place of the real function
/// for the names it tracks. Everything else (status, other symbols, version choice) is the
/// driver's own. Its rows are `raw`: nothing is counted, so the hook is never entered.
unsafe fn get_proc(
    real: cuGetProcAddress::Call,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
) -> c_int {
    let rc = real.call();
    if rc == SUCCESS {
        // SAFETY: `symbol` and `pfn` are the C caller's: a C string and an out-pointer the driver
        // has just written (`wrap_proc` checks for null).
        unsafe { wrap_proc(symbol, pfn, version) };
    }
    rc
}

unsafe fn get_proc_v2(
    real: cuGetProcAddress_v2::Call,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
    _status: *mut c_int,
) -> c_int {
    let rc = real.call();
    if rc == SUCCESS {
        // SAFETY: as in `get_proc`.
        unsafe { wrap_proc(symbol, pfn, version) };
    }
    rc
}

unsafe fn wrap_proc(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int) {
    if symbol.is_null()
        || pfn.is_null()
        // SAFETY: `pfn` is not null, so the caller's valid, written out-pointer.
        || unsafe { (*pfn).is_null() }
        || !crate::lifecycle::hooks_enabled(Family::CudaDriver)
    {
        return;
    }
    // SAFETY: `symbol` is not null, so the caller's NUL-terminated name.
    let cname = unsafe { CStr::from_ptr(symbol) };
    // SAFETY: `pfn` is not null, so the caller's valid, written out-pointer.
    let real = unsafe { *pfn } as usize;
    // The driver picks the ABI by the version asked for; so do the wrappers.
    let w = match cname.to_bytes() {
        b"cuMemAllocHost" if version < 3020 => cuMemAllocHost::bind(real),
        b"cuMemAllocHost" => cuMemAllocHost_v2::bind(real),
        b"cuMemHostRegister" if version < 6050 => cuMemHostRegister::bind(real),
        b"cuMemHostRegister" => cuMemHostRegister_v2::bind(real),
        b"cuGetProcAddress" if version < 12000 => cuGetProcAddress::bind(real),
        b"cuGetProcAddress" => cuGetProcAddress_v2::bind(real),
        // Below 3.2, the 32-bit `CUdeviceptr` ABI, not hooked.
        b"cuMemAlloc" if version < 3020 => None,
        b"cuMemAlloc" => cuMemAlloc_v2::bind(real),
        b"cuMemFree" if version < 3020 => None,
        b"cuMemFree" => cuMemFree_v2::bind(real),
        // Every other name by the table. With CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM the
        // driver answers the pool names with their `_ptsz` functions, of the same types.
        _ => redirect(cname, real).flatten(),
    };
    if let Some(w) = w {
        // SAFETY: `pfn` is the caller's out-pointer, not null (checked above).
        unsafe { *pfn = w as *mut c_void };
    }
}

/// A device allocation, counted where the device's memory is the host's; pinned or nothing. Its
/// rows are `raw`: the question comes before the hook is entered, so that a discrete device's
/// call never enters.
#[inline(always)]
fn device_alloc(
    api: Api,
    dptr: *mut u64,
    size: usize,
    req: Request,
    real: impl FnOnce() -> c_int,
) -> c_int {
    if !device::counts(Runtime::Driver, &DEVICES) {
        return real();
    }
    device_alloc_counted(api, dptr, size, req, real)
}

/// Out of line: a discrete device's allocation saves no registers for it.
#[inline(never)]
fn device_alloc_counted(
    api: Api,
    dptr: *mut u64,
    size: usize,
    req: Request,
    real: impl FnOnce() -> c_int,
) -> c_int {
    match Hook::enter(Family::CudaDriver) {
        None => real(),
        // A `CUdeviceptr` is a 64-bit integer, written where a pointer would be.
        Some(h) => h.alloc(api, dptr as *mut *mut c_void, size, req, CODES, real),
    }
}

unsafe fn mem_alloc(real: cuMemAlloc_v2::Call, dptr: *mut u64, size: usize) -> c_int {
    device_alloc(Api::CuMemAllocV2, dptr, size, Request::Mapped, move || {
        real.call()
    })
}

unsafe fn mem_alloc_managed(
    real: cuMemAllocManaged::Call,
    dptr: *mut u64,
    size: usize,
    flags: c_uint,
) -> c_int {
    let req = match ATTACH.contains(&flags) {
        true => Request::Mapped,
        false => Request::Rejected,
    };
    device_alloc(Api::CuMemAllocManaged, dptr, size, req, move || real.call())
}

unsafe fn mem_free(real: cuMemFree_v2::Call, dptr: u64) -> c_int {
    if !device::may_count(Runtime::Driver) {
        return real.call();
    }
    mem_free_counted(real, dptr)
}

/// Out of line: a discrete device's free saves no registers for it.
#[inline(never)]
fn mem_free_counted(real: cuMemFree_v2::Call, dptr: u64) -> c_int {
    match Hook::enter_release(Family::CudaDriver) {
        None => real.call(),
        Some(h) => h.release_device(
            Api::CuMemFreeV2,
            dptr as usize as *mut c_void,
            &DEVICE_ALLOCS,
            SUCCESS,
            move || real.call(),
        ),
    }
}

hooks! {
    family CudaDriver, missing NOT_INITIALIZED;
    /// Pinned host memory, `flags` saying portable, device-mapped, write-combined.
    fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> c_int => enter host_alloc;
    /// Pinned host memory, default flags (`size_t` size).
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> c_int => enter alloc_host_v2;
    /// The legacy ABI of `cuMemAllocHost`: an `unsigned int` size.
    fn cuMemAllocHost(pp: *mut *mut c_void, size: c_uint) -> c_int => enter alloc_host_legacy;
    /// Pins memory the caller owns.
    fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint) -> c_int => enter register_v2;
    /// The legacy ABI of `cuMemHostRegister` (before CUDA 6.5), the same arguments.
    fn cuMemHostRegister(p: *mut c_void, size: usize, flags: c_uint) -> c_int => enter register_legacy;
    /// Frees what `cuMemHostAlloc` or `cuMemAllocHost` gave.
    fn cuMemFreeHost(p: *mut c_void) -> c_int => release free_host;
    /// Unpins what `cuMemHostRegister` pinned.
    fn cuMemHostUnregister(p: *mut c_void) -> c_int => release host_unregister;
    /// Any driver function by name: pinguard's wrapper for the names above.
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> c_int => raw get_proc;
    /// The same with a status out (CUDA 12.0).
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> c_int => raw get_proc_v2;
    /// Physical memory for virtual mappings, perhaps pinned host memory.
    fn cuMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int => enter mem_create;
    /// A handle of `cuMemCreate` goes (its memory once unmapped).
    fn cuMemRelease(handle: u64) -> c_int => enter mem_release;
    /// Maps physical memory at a reserved address.
    fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> c_int => enter mem_map;
    /// Unmaps a range `cuMemMap` mapped.
    fn cuMemUnmap(ptr: u64, size: usize) -> c_int => enter mem_unmap;
    /// One more handle on mapped physical memory.
    fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) -> c_int => enter mem_retain;
    /// A memory pool, perhaps of pinned host memory.
    fn cuMemPoolCreate(pool: *mut u64, props: *const c_void) -> c_int => enter pools::create::<Pools>;
    /// A pool's end: its memory goes back.
    fn cuMemPoolDestroy(pool: u64) -> c_int => enter pools::destroy::<Pools>;
    /// A pool gives back what it holds beyond `keep` bytes.
    fn cuMemPoolTrimTo(pool: u64, keep: usize) -> c_int => enter pools::trim::<Pools>;
    /// An allocation from a pool, which may grow it.
    fn cuMemAllocFromPoolAsync(dptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int => enter pools::alloc::<Pools>;
    /// The same, on the per-thread default stream.
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int => enter pools::alloc::<Pools>;
    /// An allocation back to its pool.
    fn cuMemFreeAsync(dptr: usize, stream: *mut c_void) -> c_int => enter pools::free::<Pools>;
    /// The same, on the per-thread default stream.
    fn cuMemFreeAsync_ptsz(dptr: usize, stream: *mut c_void) -> c_int => enter pools::free::<Pools>;
    /// A location's default pool, perhaps a host one.
    fn cuMemGetDefaultMemPool(pool: *mut u64, location: *const c_int, ty: c_int) -> c_int => enter pools::handed_out::<DefaultPool>;
    /// A location's current pool.
    fn cuMemGetMemPool(pool: *mut u64, location: *const c_int, ty: c_int) -> c_int => enter pools::handed_out::<CurrentPool>;
    /// Device memory (`size_t` size, 64-bit `CUdeviceptr`): the host's own on an integrated device.
    fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> c_int => raw mem_alloc;
    /// Memory the device and the host share, migrated on demand.
    fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: c_uint) -> c_int => raw mem_alloc_managed;
    /// Frees what `cuMemAlloc_v2` or `cuMemAllocManaged` gave.
    fn cuMemFree_v2(dptr: u64) -> c_int => raw mem_free;
}
