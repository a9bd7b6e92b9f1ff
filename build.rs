//! Link settings that let a musl process load the library (docs/internals.md, "musl processes").
//!
//! A musl loader fails the whole program when a preloaded library names a file it cannot find
//! or a strong symbol no loaded object defines; glibc's loader would only skip the preload. With
//! the system's gcc as the linker, two of the library's dependencies exist on glibc systems
//! alone: `libgcc_s.so.1` (the unwinder std's `-lgcc_s` asks for; the library finds it at run
//! time instead, `src/runtime/unwinder.rs`) and `ld-linux-*.so` (named only for `__tls_get_addr`,
//! which musl's libc defines too). Two linker scripts, found before the system's on the cdylib's
//! search path, take their place: `-lgcc_s` links nothing, and `-lc` is libc without the loader,
//! leaving `__tls_get_addr` to whichever object defines it at run time. cargo-zigbuild (the
//! release build) brings its own libc and maps `-lgcc_s` to its own unwinder, from which nothing
//! is then taken; `scripts/release.sh` drops a `DT_NEEDED` of the loader there.

use std::path::PathBuf;

#[path = "front/build.rs"]
mod front;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    front::build();
    // Cargo sets RUSTC_LINKER for this script but does not watch it (a rerun-if-env-changed on it
    // compares cargo's own environment, where it never is). The variable that chose the linker
    // is what cargo watches: without it, a build with the system's linker and a later
    // cargo-zigbuild into the same target folder reuse the first answer (aarch64 release did).
    let triple = std::env::var("TARGET").unwrap_or_default();
    let linker_var = format!(
        "CARGO_TARGET_{}_LINKER",
        triple.to_uppercase().replace(['-', '.'], "_")
    );
    println!("cargo:rerun-if-env-changed={linker_var}");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    println!("cargo::rustc-check-cfg=cfg(pinguard_static_unwinder)");
    let zig = var("RUSTC_LINKER").contains("zig");
    if zig {
        // zig links its own unwinder (libunwind) whole in place of `-lgcc_s`: the library's
        // entries that forward to a run-time `libgcc_s` would define the same names twice.
        println!("cargo:rustc-cfg=pinguard_static_unwinder");
    }
    if var("CARGO_CFG_TARGET_OS") != "linux" || var("CARGO_CFG_TARGET_ENV") != "gnu" || zig {
        return;
    }
    let dir = PathBuf::from(var("OUT_DIR")).join("portable-link");
    std::fs::create_dir_all(&dir).expect("OUT_DIR is writable");
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).expect("OUT_DIR is writable");
    };
    write(
        "libgcc_s.so",
        "/* The unwinder is found at run time: src/runtime/unwinder.rs. */\n",
    );
    write("libc.so", "GROUP ( libc.so.6 libc_nonshared.a )\n");
    // The cdylib only: the test programs and the rlib link as usual.
    println!("cargo:rustc-link-arg-cdylib=-L{}", dir.display());
}
