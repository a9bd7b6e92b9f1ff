//! An object closed with `dlclose`. Its callsites keep the names their frames had while it was
//! loaded (a report written later could not name them, or would name whatever the loader maps at
//! those addresses next), and they are retired: the same return addresses in an object loaded
//! later make a new callsite rather than adding to the old one's figures.

use crate::accounting::callsite::{self, Callsite, Closed};
use crate::output::symbolize::Symbolizer;
use std::ffi::CStr;
use std::os::raw::{c_char, c_void};

#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
}

pub struct Closing {
    base: usize,
    name: Vec<u8>,
    sites: Vec<(&'static Callsite, Closed)>,
}

/// Before the real `dlclose`: names the frames inside the object, for every callsite that has
/// one. `None` when no callsite does (the usual case) or the handle is not an object's.
pub fn before(handle: *mut c_void) -> Option<Closing> {
    let mut lm: *const LinkMap = std::ptr::null();
    // SAFETY: `handle` is the application's argument to `dlclose`, not yet closed; `lm` is a valid
    // out-pointer of the type RTLD_DI_LINKMAP writes.
    if unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            &mut lm as *mut _ as *mut c_void,
        )
    } != 0
        || lm.is_null()
    {
        // SAFETY: dlerror takes no arguments and only reads and clears this thread's error state.
        unsafe { libc::dlerror() }; // the application's next dlerror() is not about our question
        return None;
    }
    // SAFETY: `dlinfo` succeeded, so `lm` points to the loader's `link_map`, which starts with
    // `l_addr` and `l_name` (`LinkMap`) and stays mapped until the real `dlclose`.
    let (base, name) = unsafe {
        let lm = &*lm;
        let name = if lm.l_name.is_null() {
            Vec::new()
        } else {
            CStr::from_ptr(lm.l_name).to_bytes().to_vec()
        };
        (lm.l_addr, name)
    };
    let mut sym = Symbolizer::new();
    let (start, end) = sym.object_at(base, &name)?;
    let inside = |a: usize| a >= start && a < end;
    let sites: Vec<&'static Callsite> = callsite::all()
        .into_iter()
        .filter(|c| c.native().iter().any(|&a| inside(a)))
        .collect();
    if sites.is_empty() {
        return None;
    }
    let module = sym.module_of(start)?;
    sym.name_all(
        sites
            .iter()
            .flat_map(|c| c.native().iter().copied().filter(|&a| inside(a))),
    );
    let sites = sites
        .into_iter()
        .map(|c| {
            let frames = c
                .native()
                .iter()
                .filter(|&&a| inside(a))
                .map(|&a| (a, sym.frames(a).to_vec()))
                .collect();
            (
                c,
                Closed {
                    frames,
                    module: module.clone(),
                },
            )
        })
        .collect();
    Some(Closing { base, name, sites })
}

/// After the real `dlclose`: retires the callsites if the object is really gone (another handle,
/// or `RTLD_NODELETE`, can keep it loaded).
pub fn after(closing: Closing) {
    let mut still_loaded = false;
    crate::runtime::objects::for_each_object(|o| {
        still_loaded |= o.base == closing.base && o.name.as_bytes() == closing.name.as_slice()
    });
    if !still_loaded {
        callsite::retire(closing.sites);
    }
}
