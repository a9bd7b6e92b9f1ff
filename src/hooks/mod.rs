//! The exported entry points, one file per API family. Each hook translates its API's arguments
//! and codes and hands the call to `track::Hook`; no accounting lives here.

pub mod acl;
pub mod cuda_runtime;
pub mod libc_lock;

/// Declares the real function behind a hook: `real!(F, "name")` gives a `&'static Real`.
macro_rules! real {
    ($name:literal) => {{
        static REAL: $crate::resolve::Real = $crate::resolve::Real::new(
            // SAFETY: the literal has no interior NUL and gets one appended.
            unsafe { ::std::ffi::CStr::from_bytes_with_nul_unchecked(concat!($name, "\0").as_bytes()) },
        );
        &REAL
    }};
}
pub(crate) use real;
