//! CUDA's struct layouts and helpers that the CUDA runtime, the driver and HIP (whose pool and
//! virtual-memory structs are CUDA's, field for field) read alike: one place for the offsets.

use std::os::raw::{c_int, c_void};

/// `CUDA_SUCCESS`, `cudaSuccess`, `hipSuccess`.
const SUCCESS: c_int = 0;

/// Whether a location and allocation type name pinned host memory.
pub(crate) unsafe fn location_host(location: *const c_int, ty: c_int) -> bool {
    if location.is_null() {
        return false;
    }
    // SAFETY: the caller's `CUmemLocation`, whose first `int` is its type.
    ty == ALLOCATION_PINNED && LOCATION_HOST.contains(&unsafe { location.read_unaligned() })
}

/// `cuMemPoolGetAttribute` and `cudaMemPoolGetAttribute`.
pub(crate) type PoolAttrFn = unsafe extern "C-unwind" fn(u64, c_int, *mut c_void) -> c_int;

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CUmemAllocationProp::type` (at byte 0).
const ALLOCATION_PINNED: i32 = 1;
/// `CUmemLocationType` host kinds (`CUmemAllocationProp::location.type`, at byte 8):
/// `CU_MEM_LOCATION_TYPE_HOST`, `_HOST_NUMA`, `_HOST_NUMA_CURRENT`. Device (1) is not host memory.
const LOCATION_HOST: [i32; 3] = [2, 3, 4];

/// Whether a `CUmemAllocationProp` asks for pinned host memory, and whether the call is one the
/// driver rejects anyway (`flags` is reserved and must be 0).
pub(crate) unsafe fn host_prop(prop: *const c_void, flags: u64) -> (bool, bool) {
    if prop.is_null() {
        return (false, true);
    }
    // SAFETY: the caller's `CUmemAllocationProp` (32 bytes): `type` and `location.type` are the
    // `int`s at bytes 0 and 8; read unaligned, as the C caller may pack it anywhere.
    let (ty, loc) = unsafe {
        (
            (prop as *const i32).read_unaligned(),
            (prop as *const u8).add(8).cast::<i32>().read_unaligned(),
        )
    };
    (
        ty == ALLOCATION_PINNED && LOCATION_HOST.contains(&loc),
        flags != 0,
    )
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
