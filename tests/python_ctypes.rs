//! Python's ctypes loads libraries `RTLD_LOCAL`: the runtime a framework library links is then
//! invisible to `dlsym(RTLD_NEXT)`, and pinguard must find it among the loaded objects.

use crate::common;
use common::*;
use pinguard_common::Callsite;

/// The first entry point a callsite called.
fn first_api(c: &Callsite) -> Option<&str> {
    c.apis.first().map(String::as_str)
}

#[test]
fn runtime_loaded_rtld_local_by_ctypes_is_found_and_tracked() {
    let f = fixtures();
    let script = format!(
        r#"
import ctypes, os
fw = ctypes.CDLL({fw:?})  # RTLD_LOCAL: libcudart and libascendcl come in as its private deps
fw.framework_pin.restype = ctypes.c_void_p
fw.framework_pin_npu.restype = ctypes.c_void_p
fw.framework_unpin.argtypes = [ctypes.c_void_p]
me = ctypes.CDLL(None)
me.pinguard_live_bytes.restype = ctypes.c_uint64
p = fw.framework_pin(65536)
q = fw.framework_pin_npu(8192)
print("pinned", bool(p), bool(q), me.pinguard_live_bytes())
print("unpin", fw.framework_unpin(p), me.pinguard_live_bytes())
# ctypes.CDLL(path).fn is dlsym(handle, "fn"): pinguard's dlsym hands out its wrapper.
rt = ctypes.CDLL({rt:?})
buf = ctypes.c_void_p()
print("direct", rt.cudaHostAlloc(ctypes.byref(buf), 4096, 0), me.pinguard_live_bytes())
"#,
        fw = f.dir.join("libframework.so").to_str().unwrap(),
        rt = f.dir.join("libcudart.so").to_str().unwrap()
    );
    let r = run("/usr/bin/env", &["python3", "-c", &script], &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("pinned True True 73728"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    assert!(r.stdout.contains("unpin 0 8192"), "{}", r.stdout);
    assert!(r.stdout.contains("direct 0 12288"), "{}", r.stdout);
    let rep = r.typed_report();
    assert_eq!(rep.totals.live_bytes, 12288);
    let npu = rep
        .callsites
        .iter()
        .find(|c| first_api(c) == Some("aclrtMallocHost"))
        .unwrap_or_else(|| panic!("{:#?}", rep.callsites));
    assert_eq!(
        npu.frames[0].symbol.as_deref(),
        Some("framework_pin_npu"),
        "{npu:?}"
    );
    assert!(
        npu.frames[0]
            .module
            .as_deref()
            .unwrap()
            .ends_with("libframework.so"),
        "{npu:?}"
    );
}

#[test]
fn walks_through_libffi_never_end_in_a_stack_address_and_stay_one_callsite() {
    // Issue 34, item 4: the walk's test walks (`unwind::Local::remember`, with the frame pointer
    // garbled) left libffi's frame-pointer fallback in the rule cache, and every later fresh walk
    // ended after two frames, in an address on the stack: one callsite per stack depth, each
    // with the whole 256 KiB as its peak.
    let f = fixtures();
    let script = ctypes_depths_script(f.dir.join("libcudart.so").to_str().unwrap(), 2);
    let r = run("/usr/bin/env", &["python3", "-c", &script], &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let rep = r.typed_report();
    assert_eq!(rep.totals.alloc_count, 24);
    assert_eq!(rep.totals.peak_live_bytes, 262144);
    let cs = &rep.callsites;
    for c in cs {
        for fr in &c.frames {
            assert!(
                fr.module.is_some(),
                "a frame in no loaded object: {fr:?}\n{cs:#?}"
            );
        }
    }
    let pins: Vec<_> = cs
        .iter()
        .filter(|c| first_api(c) == Some("cudaMallocHost"))
        .collect();
    assert_eq!(pins.len(), 1, "one call path, one callsite: {cs:#?}");
    assert_eq!(pins[0].alloc_count, 24);
    assert_eq!(pins[0].peak_live_bytes, 262144);
    // The walk went on through ctypes and the interpreter, to the process's start.
    let symbols: Vec<&str> = pins[0]
        .frames
        .iter()
        .filter_map(|f| f.symbol.as_deref())
        .collect();
    assert!(
        symbols.contains(&"ffi_call") && symbols.iter().any(|s| s.contains("main")),
        "{symbols:?}"
    );
}
