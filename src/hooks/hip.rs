//! AMD's HIP runtime (`libamdhip64.so`): `hipHostMalloc` and its older names, `hipExtHostAlloc`,
//! `hipHostFree`/`hipFreeHost`, `hipHostRegister`/`hipHostUnregister`, host-located memory pools,
//! and `hipGetProcAddress` (HIP 6.1+), through which newer programs reach them. `hipError_t` is a
//! C enum, passed as `int`. Its codes and flags are CUDA's where both have them
//! (docs/field-notes.md, "AMD's HIP runtime"). `hipMalloc`, `hipMallocManaged` and `hipFree` are
//! counted only where the device's memory is the host's (an APU: `track::device`).

use super::{hooks, pools, real};
use crate::api::{Api, Family};
use crate::track::device::{self, DeviceQuery, Runtime};
use crate::track::{Codes, Hook, Request};
use std::ffi::{c_char, CStr};
use std::os::raw::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

const SUCCESS: c_int = 0;
/// `hipErrorOutOfMemory` (= `hipErrorMemoryAllocation`).
const OUT_OF_MEMORY: c_int = 2;
/// `hipErrorNotInitialized`, when no runtime (or no such function in it) is behind the hook.
const NOT_INITIALIZED: c_int = 3;
/// `hipErrorHostMemoryAlreadyRegistered`.
const ALREADY_REGISTERED: c_int = 712;
/// The runtime's answers (`hipError_t`): CUDA's numbers.
const CODES: Codes<c_int> = Codes {
    ok: SUCCESS,
    oom: OUT_OF_MEMORY,
    already: ALREADY_REGISTERED,
};
/// `hipHostMallocMapped`: the device needs the page, so pageable memory cannot stand in for it.
const MAPPED: c_uint = 0x2;
/// `hipHostMallocPortable | Mapped | WriteCombined | NumaUser | Coherent | NonCoherent`.
const ALLOC_FLAGS: c_uint = 0x7 | 0x2000_0000 | 0x4000_0000 | 0x8000_0000;
/// `hipHostRegisterPortable | Mapped | IoMemory | hipExtHostRegisterCoarseGrained`.
const REGISTER_FLAGS: c_uint = 0xf;

/// `hipHostRegisterIoMemory`: the range is a device's registers, not RAM.
const IO_MEMORY: c_uint = 0x4;
/// `hipMemAttachGlobal`, `hipMemAttachHost`: one of them, the only flags `hipMallocManaged` takes.
const ATTACH: [c_uint; 2] = [0x1, 0x2];
/// `hipDeviceAttributeIntegrated` (`hip_runtime_api.h`: the 17th of `hipDeviceAttribute_t`).
const ATTRIBUTE_INTEGRATED: c_int = 16;
/// Every registration's records, for `hipHostUnregister`.
const REGISTERS: [Api; 2] = [Api::HipHostRegister, Api::HipHostRegisterIoMemory];
/// Every device allocation's records, for `hipFree`.
const DEVICE_ALLOCS: [Api; 2] = [Api::HipMalloc, Api::HipMallocManaged];

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
    // SAFETY: `IntOutFn` is `hipGetDeviceCount`'s C type.
    count: || int_out(unsafe { real!("hipGetDeviceCount").get::<IntOutFn>() }),
    integrated: |d| {
        // SAFETY: `AttrFn` is `hipDeviceGetAttribute`'s C type.
        let f = unsafe { real!("hipDeviceGetAttribute").get::<AttrFn>() }?;
        let mut v: c_int = 0;
        // SAFETY: `f` is the runtime's function, given a valid out-pointer, an attribute and a
        // device ordinal it answered for.
        (unsafe { f(&mut v, ATTRIBUTE_INTEGRATED, d) } == SUCCESS).then_some(v != 0)
    },
    // SAFETY: `IntOutFn` is `hipGetDevice`'s C type.
    current: || int_out(unsafe { real!("hipGetDevice").get::<IntOutFn>() }),
};

/// What `hipHostFree` and `hipFreeHost` release: every host allocation, whichever name made it.
const FREES: [Api; 5] = [
    Api::HipHostMalloc,
    Api::HipHostAlloc,
    Api::HipExtHostAlloc,
    Api::HipMallocHost,
    Api::HipMemAllocHost,
];

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

fn alloc_as(
    h: Hook,
    api: Api,
    real: hipHostMalloc::Call,
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    h.alloc(api, ptr, size, alloc_request(flags), CODES, move || {
        real.call()
    })
}

fn malloc_as(
    h: Hook,
    api: Api,
    real: hipMallocHost::Call,
    ptr: *mut *mut c_void,
    size: usize,
) -> c_int {
    h.alloc(api, ptr, size, Request::Pageable, CODES, move || {
        real.call()
    })
}

fn free_as(h: Hook, api: Api, real: hipHostFree::Call, ptr: *mut c_void) -> c_int {
    h.release(api, ptr, &FREES, SUCCESS, move || real.call())
}

unsafe fn host_malloc(
    h: Hook,
    real: hipHostMalloc::Call,
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    alloc_as(h, Api::HipHostMalloc, real, ptr, size, flags)
}

unsafe fn host_alloc(
    h: Hook,
    real: hipHostAlloc::Call,
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    alloc_as(h, Api::HipHostAlloc, real, ptr, size, flags)
}

unsafe fn ext_host_alloc(
    h: Hook,
    real: hipExtHostAlloc::Call,
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    alloc_as(h, Api::HipExtHostAlloc, real, ptr, size, flags)
}

unsafe fn malloc_host(
    h: Hook,
    real: hipMallocHost::Call,
    ptr: *mut *mut c_void,
    size: usize,
) -> c_int {
    malloc_as(h, Api::HipMallocHost, real, ptr, size)
}

unsafe fn mem_alloc_host(
    h: Hook,
    real: hipMemAllocHost::Call,
    ptr: *mut *mut c_void,
    size: usize,
) -> c_int {
    malloc_as(h, Api::HipMemAllocHost, real, ptr, size)
}

unsafe fn host_free(h: Hook, real: hipHostFree::Call, ptr: *mut c_void) -> c_int {
    free_as(h, Api::HipHostFree, real, ptr)
}

unsafe fn free_host(h: Hook, real: hipFreeHost::Call, ptr: *mut c_void) -> c_int {
    free_as(h, Api::HipFreeHost, real, ptr)
}

unsafe fn host_register(
    h: Hook,
    real: hipHostRegister::Call,
    ptr: *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    if flags & IO_MEMORY != 0 && flags & !REGISTER_FLAGS == 0 {
        return h.register_io(Api::HipHostRegisterIoMemory, ptr, SUCCESS, move || {
            real.call()
        });
    }
    h.register(
        Api::HipHostRegister,
        ptr,
        size,
        register_request(flags),
        CODES,
        move || real.call(),
    )
}

unsafe fn host_unregister(h: Hook, real: hipHostUnregister::Call, ptr: *mut c_void) -> c_int {
    h.release(
        Api::HipHostUnregister,
        ptr,
        &REGISTERS,
        SUCCESS,
        move || real.call(),
    )
}

// `hipMemPoolGetAttribute` takes CUDA's attribute numbers (`hipMemPoolAttrReservedMemCurrent` 5,
// `UsedMemCurrent` 7) and value type. HIP has no `hipMemGetDefaultMemPool` row.
super::pools::pools!(
    CODES,
    "hipMemPoolGetAttribute",
    HipMemPoolCreate HipMemPoolDestroy HipMemPoolTrimTo HipMallocFromPoolAsync HipFreeAsync
);

/// ROCm 7.0 in `hipRuntimeGetVersion`'s encoding (HIP_VERSION: major * 10^7 + minor * 10^5 +
/// patch): the first runtime whose `hipMemCreate` takes host locations.
const HOST_LOCATIONS_SINCE: c_int = 70_000_000;
/// The runtime's version, asked once: 0 not yet, -1 no answer.
static RUNTIME_VERSION: AtomicI32 = AtomicI32::new(0);

type VersionFn = unsafe extern "C-unwind" fn(*mut c_int) -> c_int;

/// Whether the runtime's `hipMemCreate` knows host locations. An older one (5.2.3's
/// `hipMemAllocationProp` has another layout: docs/field-notes.md) has device memory only, which
/// passes through whatever its bytes are; so does a runtime that does not say its version.
fn host_locations() -> bool {
    let mut v = RUNTIME_VERSION.load(Ordering::Relaxed);
    if v == 0 {
        // SAFETY: `VersionFn` is the C type of `hipRuntimeGetVersion(int*)`.
        let get = unsafe { real!("hipRuntimeGetVersion").get::<VersionFn>() };
        let mut answer: c_int = 0;
        // SAFETY: the real function, with a live out-pointer to an `int`.
        let ok = get.is_some_and(|f| unsafe { f(&mut answer) } == SUCCESS && answer > 0);
        v = if ok { answer } else { -1 };
        RUNTIME_VERSION.store(v, Ordering::Relaxed);
    }
    v >= HOST_LOCATIONS_SINCE
}

/// `hipMemCreate`: physical memory, counted when its location is the host's (ROCm 7's
/// `hipMemLocationTypeHost`, `HostNuma`, `HostNumaCurrent`); device memory passes through. A
/// physical allocation is mapped for the device, so `downgrade` refuses it as `error` does.
unsafe fn mem_create(
    h: Hook,
    real: hipMemCreate::Call,
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> c_int {
    if !host_locations() {
        return h.create_physical(Api::HipMemCreate, handle, size, None, CODES, move || {
            real.call()
        });
    }
    // SAFETY: `prop` is the C caller's, null or a `hipMemAllocationProp`, whose layout since
    // ROCm 6 is `CUmemAllocationProp`'s (`type` at byte 0, `location.type` at 8, the same
    // numbers: docs/field-notes.md), and `flags` must be 0 as CUDA's.
    let (host, rejected) = unsafe { super::cuda_abi::host_prop(prop, flags) };
    let req = host.then_some(if rejected {
        Request::Rejected
    } else {
        Request::Mapped
    });
    h.create_physical(Api::HipMemCreate, handle, size, req, CODES, move || {
        real.call()
    })
}

unsafe fn mem_release(h: Hook, real: hipMemRelease::Call, handle: u64) -> c_int {
    h.release_physical(Api::HipMemRelease, handle, SUCCESS, move || real.call())
}

unsafe fn mem_map(
    h: Hook,
    real: hipMemMap::Call,
    ptr: *mut c_void,
    size: usize,
    _offset: usize,
    handle: u64,
    _flags: u64,
) -> c_int {
    h.map_physical(
        Api::HipMemMap,
        ptr as usize,
        size,
        handle,
        SUCCESS,
        move || real.call(),
    )
}

unsafe fn mem_unmap(h: Hook, real: hipMemUnmap::Call, ptr: *mut c_void, size: usize) -> c_int {
    h.unmap_physical(
        Api::HipMemUnmap,
        ptr as usize,
        size.max(1),
        SUCCESS,
        move || real.call(),
    )
}

unsafe fn mem_retain(
    h: Hook,
    real: hipMemRetainAllocationHandle::Call,
    handle: *mut u64,
    _addr: *mut c_void,
) -> c_int {
    h.retain_physical(
        Api::HipMemRetainAllocationHandle,
        handle,
        SUCCESS,
        move || real.call(),
    )
}

/// `hipGetProcAddress`: the runtime's answer, with pinguard's wrapper in place of the real function
/// for the names it tracks. Everything else (status, other symbols, version choice) is the
/// runtime's own. Its row is `raw`: nothing is counted, so the hook is never entered.
unsafe fn get_proc(
    real: hipGetProcAddress::Call,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _version: c_int,
    _flags: u64,
    _status: *mut c_int,
) -> c_int {
    let rc = real.call();
    if rc != SUCCESS
        || symbol.is_null()
        || pfn.is_null()
        // SAFETY: `pfn` is checked for null before it is read; on success the runtime wrote it.
        || unsafe { (*pfn).is_null() }
        || !crate::lifecycle::hooks_enabled(Family::Hip)
    {
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

/// A device allocation, counted where the device's memory is the host's; pinned or nothing. Its
/// rows are `raw`: the question comes before the hook is entered, so that an APU's call alone
/// enters.
#[inline(always)]
fn device_alloc(
    api: Api,
    ptr: *mut *mut c_void,
    size: usize,
    req: Request,
    real: impl FnOnce() -> c_int,
) -> c_int {
    if !device::counts(Runtime::Hip, &DEVICES) {
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
    match Hook::enter(Family::Hip) {
        None => real(),
        Some(h) => h.alloc(api, ptr, size, req, CODES, real),
    }
}

unsafe fn malloc(real: hipMalloc::Call, ptr: *mut *mut c_void, size: usize) -> c_int {
    device_alloc(Api::HipMalloc, ptr, size, Request::Mapped, move || {
        real.call()
    })
}

unsafe fn malloc_managed(
    real: hipMallocManaged::Call,
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    let req = match ATTACH.contains(&flags) {
        true => Request::Mapped,
        false => Request::Rejected,
    };
    device_alloc(Api::HipMallocManaged, ptr, size, req, move || real.call())
}

unsafe fn free(real: hipFree::Call, ptr: *mut c_void) -> c_int {
    if !device::may_count(Runtime::Hip) {
        return real.call();
    }
    free_counted(real, ptr)
}

/// Out of line: a discrete device's free saves no registers for it.
#[inline(never)]
fn free_counted(real: hipFree::Call, ptr: *mut c_void) -> c_int {
    match Hook::enter_release(Family::Hip) {
        None => real.call(),
        Some(h) => h.release_device(Api::HipFree, ptr, &DEVICE_ALLOCS, SUCCESS, move || {
            real.call()
        }),
    }
}

hooks! {
    family Hip, missing NOT_INITIALIZED;
    /// Pinned host memory, `flags` saying portable, mapped, write-combined, NUMA, coherence.
    fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int => enter host_malloc;
    /// The same, under its deprecated name.
    fn hipHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int => enter host_alloc;
    /// The same, the name ROCm 6.3 moved to.
    fn hipExtHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int => enter ext_host_alloc;
    /// Pinned host memory, default flags (deprecated).
    fn hipMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int => enter malloc_host;
    /// The same, the driver-style name (deprecated).
    fn hipMemAllocHost(ptr: *mut *mut c_void, size: usize) -> c_int => enter mem_alloc_host;
    /// Frees what any of the five allocation names gave.
    fn hipHostFree(ptr: *mut c_void) -> c_int => release host_free;
    /// The same, under its deprecated name.
    fn hipFreeHost(ptr: *mut c_void) -> c_int => release free_host;
    /// Pins (and maps for the device) memory the caller owns.
    fn hipHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) -> c_int => enter host_register;
    /// Unpins what `hipHostRegister` pinned.
    fn hipHostUnregister(ptr: *mut c_void) -> c_int => release host_unregister;
    /// A memory pool, perhaps of pinned host memory (6.x).
    fn hipMemPoolCreate(pool: *mut u64, props: *const c_void) -> c_int => enter pools::create::<Pools>;
    /// A pool's end: its memory goes back.
    fn hipMemPoolDestroy(pool: u64) -> c_int => enter pools::destroy::<Pools>;
    /// A pool gives back what it holds beyond `keep` bytes.
    fn hipMemPoolTrimTo(pool: u64, keep: usize) -> c_int => enter pools::trim::<Pools>;
    /// An allocation from a pool, which may grow it.
    fn hipMallocFromPoolAsync(ptr: *mut usize, size: usize, pool: u64, stream: *mut c_void) -> c_int => enter pools::alloc::<Pools>;
    /// An allocation back to its pool.
    fn hipFreeAsync(ptr: usize, stream: *mut c_void) -> c_int => enter pools::free::<Pools>;
    /// Physical memory for the virtual-memory API, at a host location in ROCm 7 (counted).
    fn hipMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int => enter mem_create;
    /// A handle of `hipMemCreate` goes (its memory once unmapped).
    fn hipMemRelease(handle: u64) -> c_int => enter mem_release;
    /// Maps physical memory at a reserved address.
    fn hipMemMap(ptr: *mut c_void, size: usize, offset: usize, handle: u64, flags: u64) -> c_int => enter mem_map;
    /// Unmaps a range `hipMemMap` mapped.
    fn hipMemUnmap(ptr: *mut c_void, size: usize) -> c_int => enter mem_unmap;
    /// One more handle on mapped physical memory.
    fn hipMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) -> c_int => enter mem_retain;
    /// Any HIP function by name (6.1+): tracked names answer with pinguard's wrappers.
    fn hipGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> c_int => raw get_proc;
    /// Device memory: the host's own on an APU.
    fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> c_int => raw malloc;
    /// Memory the device and the host share.
    fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int => raw malloc_managed;
    /// Frees what `hipMalloc` or `hipMallocManaged` gave.
    fn hipFree(ptr: *mut c_void) -> c_int => raw free;
}
