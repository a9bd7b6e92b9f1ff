//! The stream-ordered pool entry points, written once for the families that share CUDA's pool API
//! (the CUDA runtime, the driver, HIP: the same arguments, codes and structs, field for field):
//! a pool's creation, end and trim, an allocation from it and back, and a location's pools. A
//! family's rows name these bodies with its `Pools` type (`pools::create::<Pools>`), which
//! `pools!` makes from what differs: its codes, its attribute getter, its names.

use super::cuda_abi::{location_host, pool_props_host};
use super::{Call, Invoke};
use crate::api::Api;
use crate::track::{Hook, PoolApi};
use std::os::raw::{c_int, c_void};

/// A row's `Call` of an entry point that answers with a code: the bodies here serve rows of
/// several C types.
pub(crate) trait CodeCall {
    fn call(self) -> c_int;
}

impl<F: Invoke<A, Out = c_int>, A: Copy> CodeCall for Call<F, A> {
    #[inline(always)]
    fn call(self) -> c_int {
        Call::call(self)
    }
}

/// The names a family's pool calls are recorded under.
pub(crate) struct Names {
    pub create: Api,
    pub destroy: Api,
    pub trim: Api,
    pub alloc: Api,
    pub free: Api,
}

/// What one family's pool entry points differ by.
pub(crate) trait Pools {
    /// Its codes and its `*MemPoolGetAttribute`.
    const API: PoolApi<c_int>;
    const NAMES: Names;
}

/// One of the calls that hand out a location's pool (`*MemGetDefaultMemPool`, `*MemGetMemPool`),
/// of a family that has them.
pub(crate) trait Getter {
    type Family: Pools;
    const NAME: Api;
}

/// A family's `Pools` (and, with `get`, its `DefaultPool` and `CurrentPool` getters), from its
/// codes, the name of its attribute getter and its `Api`s:
/// `pools!(CODES, "cudaMemPoolGetAttribute", CudaMemPoolCreate ...);`.
macro_rules! pools {
    ($codes:expr, $attr:literal, $create:ident $destroy:ident $trim:ident $alloc:ident $free:ident
        $(, get $default:ident $current:ident)?) => {
        /// This family's pool entry points (`hooks::pools`).
        pub(crate) struct Pools;
        impl $crate::hooks::pools::Pools for Pools {
            const API: $crate::track::PoolApi<std::os::raw::c_int> = $crate::track::PoolApi {
                codes: $codes,
                read: |pool, attr| {
                    let get = $crate::hooks::real!($attr);
                    // SAFETY: `PoolAttrFn` is the C type of every family's attribute getter.
                    let get = unsafe { get.get::<$crate::hooks::cuda_abi::PoolAttrFn>() };
                    $crate::hooks::cuda_abi::pool_attr(get, pool, attr)
                },
            };
            const NAMES: $crate::hooks::pools::Names = $crate::hooks::pools::Names {
                create: $crate::api::Api::$create,
                destroy: $crate::api::Api::$destroy,
                trim: $crate::api::Api::$trim,
                alloc: $crate::api::Api::$alloc,
                free: $crate::api::Api::$free,
            };
        }
        $(
            /// This family's `*MemGetDefaultMemPool`.
            pub(crate) struct DefaultPool;
            impl $crate::hooks::pools::Getter for DefaultPool {
                type Family = Pools;
                const NAME: $crate::api::Api = $crate::api::Api::$default;
            }
            /// This family's `*MemGetMemPool`.
            pub(crate) struct CurrentPool;
            impl $crate::hooks::pools::Getter for CurrentPool {
                type Family = Pools;
                const NAME: $crate::api::Api = $crate::api::Api::$current;
            }
        )?
    };
}
pub(crate) use pools;

/// `*MemPoolCreate`: a pool, counted as it grows when it is a host one.
///
/// # Safety
/// `props` is the C caller's, under the entry point's contract.
pub(crate) unsafe fn create<P: Pools>(
    h: Hook,
    real: impl CodeCall,
    pool: *mut u64,
    props: *const c_void,
) -> c_int {
    // SAFETY: `props` is the C caller's, null or the family's pool properties (`cudaMemPoolProps`,
    // `CUmemPoolProps`, `hipMemPoolProps`), whose first 16 bytes are `CUmemPoolProps`'
    // (`allocType`, `handleTypes`, `location {type, id}`), with the same location types (host 2,
    // host NUMA 3 and 4; HIP 5.2.3 knows only device, 1).
    let host = unsafe { pool_props_host(props) };
    h.pool_handed_out(P::NAMES.create, pool, host, true, P::API, move || {
        real.call()
    })
}

/// `*MemPoolDestroy`: a pool's end, its memory back.
pub(crate) unsafe fn destroy<P: Pools>(h: Hook, real: impl CodeCall, pool: u64) -> c_int {
    h.shrink_pool(P::NAMES.destroy, pool, true, P::API, move || real.call())
}

/// `*MemPoolTrimTo`: the pool gives back what it holds beyond `keep` bytes (read back after).
pub(crate) unsafe fn trim<P: Pools>(
    h: Hook,
    real: impl CodeCall,
    pool: u64,
    _keep: usize,
) -> c_int {
    h.shrink_pool(P::NAMES.trim, pool, false, P::API, move || real.call())
}

/// `*MallocFromPoolAsync`: an allocation from a pool, which may grow it.
pub(crate) unsafe fn alloc<P: Pools>(
    h: Hook,
    real: impl CodeCall,
    ptr: *mut usize,
    size: usize,
    pool: u64,
    _stream: *mut c_void,
) -> c_int {
    h.alloc_from_pool(P::NAMES.alloc, ptr, size, pool, P::API, move || real.call())
}

/// `*FreeAsync`: an allocation back to its pool.
pub(crate) unsafe fn free<P: Pools>(
    h: Hook,
    real: impl CodeCall,
    ptr: usize,
    _stream: *mut c_void,
) -> c_int {
    h.free_to_pool(P::NAMES.free, ptr, P::API, move || real.call())
}

/// `*MemGetDefaultMemPool`, `*MemGetMemPool`: a location's default or current pool, perhaps a
/// host one.
///
/// # Safety
/// `location` is the C caller's, under the entry point's contract.
pub(crate) unsafe fn handed_out<G: Getter>(
    h: Hook,
    real: impl CodeCall,
    pool: *mut u64,
    location: *const c_int,
    ty: c_int,
) -> c_int {
    // SAFETY: `location` is the C caller's, null or a `CUmemLocation` (`cudaMemLocation`: the
    // same `{type, id}`).
    let host = unsafe { location_host(location, ty) };
    h.pool_handed_out(G::NAME, pool, host, false, G::Family::API, move || {
        real.call()
    })
}
