//! The exported entry points, one file per API family. Each hook translates its API's arguments
//! and codes and hands the call to `track::Hook`; no accounting lives here.
//!
//! Every entry point has a body taking the real function as its first argument. The exported
//! symbol resolves the real function by name; the *slot wrappers* carry a real function pointer
//! handed out by `cuGetProcAddress` or `dlsym(handle, ...)`, which may differ from the one found
//! by name (another copy of the runtime, another ABI version).
//!
//! The runtimes' entry points are `extern "C-unwind"`: a real runtime may reach a cancellation
//! point inside its call (its lazy start opens and reads driver files), and a thread cancelled
//! there must unwind through the hook to the application exactly as it would without pinguard
//! (an `extern "C"` function aborts the process instead). The hook's guards give back the
//! reentrancy flag and any budget reservation on the way.

pub mod acl;
pub mod cuda_driver;
pub mod cuda_runtime;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub mod dlsym;
pub mod dlclose;
pub mod exit;
pub mod hip;
pub mod libc_lock;
pub mod signal;

use std::sync::atomic::{AtomicUsize, Ordering};

/// Declares the real function behind a hook: `real!("name")` gives a `&'static Real`.
macro_rules! real {
    ($name:literal) => {{
        static REAL: $crate::runtime::resolve::Real = $crate::runtime::resolve::Real::new(
            // SAFETY: the literal has no interior NUL and gets one appended.
            unsafe { ::std::ffi::CStr::from_bytes_with_nul_unchecked(concat!($name, "\0").as_bytes()) },
        );
        &REAL
    }};
}
pub(crate) use real;

pub const SLOTS: usize = 4;

/// Defines `SLOTS` wrappers around `$body`, each bound to its own real function pointer, and
/// `bind(real) -> Option<wrapper address>`.
macro_rules! slots {
    ($name:ident, $fnty:ty, $body:path, ($($arg:ident : $ty:ty),*) -> $ret:ty) => {
        pub mod $name {
            #[allow(unused_imports)]
            use super::*;
            use std::sync::atomic::{AtomicUsize, Ordering};
            static REALS: [AtomicUsize; $crate::hooks::SLOTS] = [const { AtomicUsize::new(0) }; $crate::hooks::SLOTS];
            unsafe extern "C-unwind" fn s0($($arg: $ty),*) -> $ret {
                // SAFETY: `bind` hands out this wrapper only once its slot holds a real `$fnty`,
                // never changed after; the arguments are the C caller's, under that function's contract.
                unsafe { $body(std::mem::transmute::<usize, $fnty>(REALS[0].load(Ordering::Relaxed)), $($arg),*) }
            }
            unsafe extern "C-unwind" fn s1($($arg: $ty),*) -> $ret {
                // SAFETY: `bind` hands out this wrapper only once its slot holds a real `$fnty`,
                // never changed after; the arguments are the C caller's, under that function's contract.
                unsafe { $body(std::mem::transmute::<usize, $fnty>(REALS[1].load(Ordering::Relaxed)), $($arg),*) }
            }
            unsafe extern "C-unwind" fn s2($($arg: $ty),*) -> $ret {
                // SAFETY: `bind` hands out this wrapper only once its slot holds a real `$fnty`,
                // never changed after; the arguments are the C caller's, under that function's contract.
                unsafe { $body(std::mem::transmute::<usize, $fnty>(REALS[2].load(Ordering::Relaxed)), $($arg),*) }
            }
            unsafe extern "C-unwind" fn s3($($arg: $ty),*) -> $ret {
                // SAFETY: `bind` hands out this wrapper only once its slot holds a real `$fnty`,
                // never changed after; the arguments are the C caller's, under that function's contract.
                unsafe { $body(std::mem::transmute::<usize, $fnty>(REALS[3].load(Ordering::Relaxed)), $($arg),*) }
            }
            pub fn bind(real: usize) -> Option<usize> {
                let wrappers = [s0 as *const () as usize, s1 as *const () as usize, s2 as *const () as usize, s3 as *const () as usize];
                $crate::hooks::bind(&REALS, &wrappers, real)
            }
        }
    };
}
pub(crate) use slots;

/// The wrapper bound to `real`, binding a free slot if none is yet. `None` when all slots hold
/// other functions (the caller then gets the real function, untracked, and a warning).
pub fn bind(reals: &[AtomicUsize; SLOTS], wrappers: &[usize; SLOTS], real: usize) -> Option<usize> {
    if real == 0 || crate::runtime::objects::is_own(real) {
        return Some(real); // already one of pinguard's functions
    }
    for (r, w) in reals.iter().zip(wrappers) {
        match r.compare_exchange(0, real, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(*w),
            Err(cur) if cur == real => return Some(*w),
            Err(_) => {}
        }
    }
    tracing::warn!("more than {SLOTS} distinct real functions for one entry point; the next one is not tracked");
    None
}
