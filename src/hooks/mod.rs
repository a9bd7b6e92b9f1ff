//! The exported entry points, one file per API family. Each hook translates its API's arguments
//! and codes and hands the call to `track::Hook`; no accounting lives here.
//!
//! Each entry point is declared once, as a row of its family's table (`hooks!` for the runtimes,
//! `hand_hooks!` for libc's, the loader's and the signal functions, whose bodies are written by
//! hand): the row makes the export, the one cache of the real function found by name, and, for
//! the runtimes, the *slot wrappers* that carry a real function pointer handed out by
//! `cuGetProcAddress` or `dlsym(handle, ...)`, which may differ from the one found by name
//! (another copy of the runtime, another ABI version). `dlsym` finds a name's family by the
//! tables (`dlsym::TABLES`); `scripts/exports.py` reads the rows for the export list that
//! `tests/load.rs` and `scripts/release.sh` check. A new family is one table and one line in
//! `dlsym::TABLES`.
//!
//! The runtimes' entry points are `extern "C-unwind"`: a real runtime may reach a cancellation
//! point inside its call (its lazy start opens and reads driver files), and a thread cancelled
//! there must unwind through the hook to the application exactly as it would without pinguard
//! (an `extern "C"` function aborts the process instead). The hook's guards give back the
//! reentrancy flag and any budget reservation on the way.

pub mod acl;
mod cuda_abi;
pub mod cuda_driver;
pub mod cuda_runtime;
pub mod dlclose;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub mod dlsym;
pub mod exit;
pub mod hal;
pub mod hip;
pub mod ibverbs;
pub mod libc_lock;
mod pools;
pub mod signal;

/// A real function that no table declares (one a hook asks, not one it replaces):
/// `real!("name")` gives a `&'static Real`.
macro_rules! real {
    ($name:literal) => {{
        static REAL: $crate::runtime::resolve::Real = $crate::runtime::resolve::Real::new(
            // SAFETY: the literal has no interior NUL and gets one appended.
            unsafe {
                ::std::ffi::CStr::from_bytes_with_nul_unchecked(concat!($name, "\0").as_bytes())
            },
        );
        &REAL
    }};
}
pub(crate) use real;

pub const SLOTS: usize = crate::runtime::resolve::SLOTS;

/// A symbol name as the loader takes it; `name` ends in its NUL (a compile error otherwise).
pub const fn c_name(name: &'static str) -> &'static std::ffi::CStr {
    match std::ffi::CStr::from_bytes_with_nul(name.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a symbol name has no interior NUL and ends in one"),
    }
}

/// A call a C caller made to a runtime entry point, bound to the real function: what a hook's
/// body makes, at most once, or hands to `track` to make. Only the tables' rows build one (in
/// `run`, from the export or a slot wrapper), so calling it is the call the C caller asked for.
#[derive(Clone, Copy)]
pub struct Call<F, A> {
    real: F,
    args: A,
}

impl<F: Invoke<A>, A: Copy> Call<F, A> {
    /// # Safety
    /// `real` is the real function whose C type `F` is, and `args` the C caller's arguments,
    /// under its contract.
    #[inline(always)]
    pub unsafe fn new(real: F, args: A) -> Self {
        Call { real, args }
    }

    /// The call, as the C caller made it.
    #[inline(always)]
    pub fn call(self) -> F::Out {
        // SAFETY: `new`'s caller promised a real function and its C caller's arguments.
        unsafe { self.real.invoke(self.args) }
    }
}

/// A C function type, called with its arguments as a tuple.
pub trait Invoke<A> {
    type Out;
    /// # Safety
    /// The function's own contract.
    unsafe fn invoke(self, args: A) -> Self::Out;
}

macro_rules! invoke {
    ($($a:ident),*) => {
        impl<R, $($a),*> Invoke<($($a,)*)> for unsafe extern "C-unwind" fn($($a),*) -> R {
            type Out = R;
            #[inline(always)]
            // Named after the C symbol it stands for.
            #[allow(non_snake_case)]
            unsafe fn invoke(self, ($($a,)*): ($($a,)*)) -> R {
                // SAFETY: the caller keeps the function's contract.
                unsafe { self($($a),*) }
            }
        }
    };
}
invoke!(A1);
invoke!(A1, A2);
invoke!(A1, A2, A3);
invoke!(A1, A2, A3, A4);
invoke!(A1, A2, A3, A4, A5);
invoke!(A1, A2, A3, A4, A5, A6);

/// One API family's table: each row is one entry point, declared once, as
///
/// ```text
/// /// What it does.
/// fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int => enter host_alloc;
/// ```
///
/// (its name, its C signature, the body that hands it to `track`). The family's first line names
/// its `api::Family` and the code a call gets when no real function can be found. Each row makes
///
/// - a module named after the symbol: `Fn` (the C type), `Call` (a call of it), `REAL` (the real
///   function found by name, the one cache of it that every caller shares), `run` (the body's one
///   caller), `first` (the export's call while `REAL` is unknown: the look-up, out of line) and `bind` (the `SLOTS` wrappers handed out in
///   place of a real function that `cuGetProcAddress` or `dlsym(handle, ...)` found, which may
///   differ from the one found by name: another copy of the runtime, another ABI version);
/// - the exported `extern "C-unwind"` function.
///
/// and the table as a whole `FAMILY`, `NAMES` (its names, in order) and `redirect`, the wrapper
/// for a function of the family that `dlsym(handle, name)` found.
///
/// The word before the body says how the call enters pinguard, which the row's `run` does:
///
/// - `enter`: `Hook::enter(FAMILY)` (a pinning call, or one that changes what is pinned: it walks
///   the stack and may start pinguard up); the body is `unsafe fn(h: Hook, real: Call, args...)
///   -> ret`, called only when the hook is entered; otherwise the real call passes straight
///   through;
/// - `release`: the same with `Hook::enter_release` (a release: no walk, no start-up);
/// - `raw`: no entry; the body is `unsafe fn(real: Call, args...) -> ret` and enters itself, or
///   not (a device allocation that asks first whether the device's memory is the host's, a
///   `GetProcAddress` that only swaps the answer).
///
/// `real` makes the C caller's call of the real function, the arguments are the C caller's,
/// under its contract.
macro_rules! hooks {
    (
        family $family:ident, missing $missing:expr;
        $( $(#[doc = $doc:literal])* fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty => $how:ident $body:path; )*
    ) => {
        $(
            // Named after the C symbol it stands for.
            #[allow(non_snake_case)]
            #[doc = concat!("`", stringify!($name), "`'s C type, real function and slot wrappers.")]
            pub mod $name {
                // A row uses only some of the names its table brings in.
                #[allow(unused_imports)]
                use super::*;
                pub type Fn = unsafe extern "C-unwind" fn($($ty),*) -> $ret;
                /// A call of this entry point, bound to the real function.
                pub type Call = $crate::hooks::Call<Fn, ($($ty,)*)>;
                pub static REAL: $crate::runtime::resolve::Real =
                    $crate::runtime::resolve::Real::new($crate::hooks::c_name(concat!(stringify!($name), "\0")));
                static REALS: $crate::runtime::resolve::Slots = $crate::runtime::resolve::Slots::new();
                /// The body, given the real function: the export and the slot wrappers call it
                /// with the function in a register, and it is the body's one caller, so the
                /// `Call` never leaves registers.
                ///
                /// # Safety
                /// `f` is the real function of this type, given the C caller's arguments under
                /// its contract.
                pub unsafe fn run(f: Fn, $($arg: $ty),*) -> $ret {
                    // SAFETY: this function's own contract is `Call::new`'s.
                    let real = unsafe { Call::new(f, ($($arg,)*)) };
                    $crate::hooks::hooks!(@enter $how $family $body, real, ($($arg),*))
                }
                /// The export's call while `REAL` is not yet found: the look-up, then the body.
                /// Out of line, so that the export's steady path saves no registers (a look-up
                /// inline kept the arguments in callee-saved ones, pushed and popped on every
                /// call: 7 instructions a `cudaHostAlloc`, callgrind).
                ///
                /// # Safety
                /// The C caller's arguments, under this entry point's contract.
                #[cold]
                #[inline(never)]
                pub unsafe fn first($($arg: $ty),*) -> $ret {
                    // SAFETY: `Fn` is the row's C signature, the type of the symbol `REAL` names.
                    match unsafe { REAL.get::<Fn>() } {
                        // SAFETY: `f` is the real function of this name, given the C caller's
                        // arguments under its contract, which are what the body asks for.
                        Some(f) => unsafe { run(f, $($arg),*) },
                        None => $missing,
                    }
                }
                $crate::hooks::hooks!(@slot s0 0, ($($arg: $ty),*) -> $ret);
                $crate::hooks::hooks!(@slot s1 1, ($($arg: $ty),*) -> $ret);
                $crate::hooks::hooks!(@slot s2 2, ($($arg: $ty),*) -> $ret);
                $crate::hooks::hooks!(@slot s3 3, ($($arg: $ty),*) -> $ret);
                /// The wrapper bound to `real`, a function of this type found another way.
                pub fn bind(real: usize) -> Option<usize> {
                    let wrappers = [s0 as *const () as usize, s1 as *const () as usize, s2 as *const () as usize, s3 as *const () as usize];
                    $crate::hooks::bind(&REALS, &wrappers, real)
                }
            }

            $(#[doc = $doc])*
            #[no_mangle]
            pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) -> $ret {
                match $name::REAL.known() {
                    // SAFETY: `a` is the address of the symbol `REAL` names, whose C type is the
                    // row's signature `Fn`; the arguments are the C caller's, under its contract.
                    Some(a) => unsafe { $name::run(std::mem::transmute::<usize, $name::Fn>(a), $($arg),*) },
                    // SAFETY: the C caller's arguments, under this entry point's contract.
                    None => unsafe { $name::first($($arg),*) },
                }
            }
        )*

        pub const FAMILY: $crate::api::Family = $crate::api::Family::$family;

        /// The table's entry points, as exported.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        /// The wrapper for a function `dlsym(handle, name)` found, if the table has `name`:
        /// `Some(None)` when every slot is taken.
        pub fn redirect(name: &std::ffi::CStr, real: usize) -> Option<Option<usize>> {
            let name = name.to_bytes();
            $( if name == stringify!($name).as_bytes() { return Some($name::bind(real)); } )*
            None
        }
    };
    (@enter enter $family:ident $body:path, $real:ident, ($($arg:ident),*)) => {
        match $crate::track::Hook::enter($crate::api::Family::$family) {
            None => $real.call(),
            // SAFETY: the C caller's arguments, under the entry point's contract, which is the
            // body's.
            Some(h) => unsafe { $body(h, $real, $($arg),*) },
        }
    };
    (@enter release $family:ident $body:path, $real:ident, ($($arg:ident),*)) => {
        match $crate::track::Hook::enter_release($crate::api::Family::$family) {
            None => $real.call(),
            // SAFETY: as for `enter`.
            Some(h) => unsafe { $body(h, $real, $($arg),*) },
        }
    };
    (@enter raw $family:ident $body:path, $real:ident, ($($arg:ident),*)) => {
        // SAFETY: as for `enter`.
        unsafe { $body($real, $($arg),*) }
    };
    (@slot $s:ident $i:literal, ($($arg:ident : $ty:ty),*) -> $ret:ty) => {
        unsafe extern "C-unwind" fn $s($($arg: $ty),*) -> $ret {
            // SAFETY: `bind` hands out this wrapper only once its slot holds a real `Fn`, never
            // changed after; the arguments are the C caller's, under that function's contract.
            unsafe { run(std::mem::transmute::<usize, Fn>(REALS.get($i)), $($arg),*) }
        }
    };
}
pub(crate) use hooks;

/// The table of entry points whose bodies are written by hand (libc's, the loader's, the signal
/// functions'): each row `fn name(args) -> ret => body;` makes the module `name` (`Fn`, its C
/// type, or the one `real` gives, `REAL`, the real function found by name, the one cache of it
/// that every caller shares, and `get`) and the exported `extern "C"` function, which hands its
/// arguments to `body` (`unsafe fn(args) -> ret`, under the C function's contract). A row with no
/// body declares a function exported by hand (a naked trampoline); the compiler checks that it
/// has the row's type. The table as a whole makes `NAMES` and `redirect`: pinguard's export for
/// a function `dlsym(handle, name)` found, when it is the one pinguard forwards to.
macro_rules! hand_hooks {
    (
        $( $(#[doc = $doc:literal])* fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty $(, real $fnty:ty)? $(=> $body:path)?; )*
    ) => {
        $(
            // Named after the C symbol; a build without hooks leaves it unused.
            #[allow(non_snake_case, dead_code)]
            #[doc = concat!("`", stringify!($name), "`'s C type and real function.")]
            pub mod $name {
                // A row uses only some of the names its table brings in.
                #[allow(unused_imports)]
                use super::*;
                pub type Fn = $crate::hooks::hand_hooks!(@fnty [$($fnty)?] ($($ty),*) -> $ret);
                pub static REAL: $crate::runtime::resolve::Real =
                    $crate::runtime::resolve::Real::new($crate::hooks::c_name(concat!(stringify!($name), "\0")));
                /// The real function, found by name the first time any caller asks.
                #[inline(always)]
                pub fn get() -> Option<Fn> {
                    // SAFETY: `Fn` is the C type of the symbol `REAL` names.
                    unsafe { REAL.get::<Fn>() }
                }
                /// The export has the row's type (this fails to compile otherwise).
                const _: unsafe extern "C" fn($($ty),*) -> $ret = super::$name;
            }
            $crate::hooks::hand_hooks!(@export [$($body)?] $(#[doc = $doc])* fn $name($($arg: $ty),*) -> $ret);
        )*

        /// The table's entry points, as exported.
        // Builds without the hooks (tests, fuzz targets) leave these unread.
        #[allow(dead_code)]
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        /// pinguard's own export for `name` when `real`, the function `dlsym(handle, name)` found,
        /// is the one found by name (`Some(None)` when it is another).
        // Builds without the hooks (tests, fuzz targets) leave these unread.
        #[allow(dead_code)]
        pub fn redirect(name: &std::ffi::CStr, real: usize) -> Option<Option<usize>> {
            let name = name.to_bytes();
            $( if name == stringify!($name).as_bytes() {
                return Some(($name::REAL.addr() == Some(real)).then_some($name as *const () as usize));
            } )*
            None
        }
    };
    (@fnty [] ($($ty:ty),*) -> $ret:ty) => { unsafe extern "C" fn($($ty),*) -> $ret };
    (@fnty [$fnty:ty] ($($ty:ty),*) -> $ret:ty) => { $fnty };
    (@export [] $(#[doc = $doc:literal])* fn $name:ident($($arg:ident : $ty:ty),*) -> $ret:ty) => {};
    (@export [$body:path] $(#[doc = $doc:literal])* fn $name:ident($($arg:ident : $ty:ty),*) -> $ret:ty) => {
        $(#[doc = $doc])*
        #[no_mangle]
        // A row whose body needs no unsafe code still gets the table's unsafe block.
        #[allow(unused_unsafe)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the C caller's arguments, under the function's contract, which is the body's.
            unsafe { $body($($arg),*) }
        }
    };
}
pub(crate) use hand_hooks;

/// The wrapper bound to `real`, binding a free slot if none is yet. `None` when all slots hold
/// other functions (the caller then gets the real function, untracked, and a warning).
pub fn bind(
    reals: &'static crate::runtime::resolve::Slots,
    wrappers: &[usize; SLOTS],
    real: usize,
) -> Option<usize> {
    if real == 0 || crate::runtime::objects::is_own(real) {
        return Some(real); // already one of pinguard's functions
    }
    if let Some(i) = reals.bind(real) {
        return Some(wrappers[i]);
    }
    tracing::warn!("more than {SLOTS} distinct real functions for one entry point; the next one is not tracked");
    None
}
