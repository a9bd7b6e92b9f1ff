//! The AddressSanitizer fixture, shared by tests/asan.rs and the CLI's tests: gcc's ASan runtime
//! and `tests/progs/asan_pin.c` built with it, linked with the emulated CUDA runtime.

use crate::common::{aarch64, compiler, fixture_set};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

pub struct Asan {
    /// The runtime as `LD_PRELOAD` names it: its file (`libasan.so`, a link to `libasan.so.N`),
    /// or under qemu-aarch64 its soname.
    pub runtime: PathBuf,
    /// `asan_pin`, built with `-fsanitize=address`.
    pub prog: PathBuf,
    /// The same with the runtime linked into the program (`-static-libasan`): nothing to preload
    /// but pinguard, and ASan starts inside the program, before any constructor.
    // Read by tests/asan.rs; the CLI's tests share this module and use the rest of it.
    #[allow(dead_code)]
    pub prog_static: PathBuf,
}

/// The fixture, or `None` after a printed SKIPPED line where this machine has no ASan runtime and
/// neither `PGTEST_REQUIRE_ASAN` nor `PGTEST_REQUIRE_ALL` (set by `.ci/run`, which installs
/// it) asks for one.
pub fn asan() -> Option<&'static Asan> {
    static A: OnceLock<Option<Asan>> = OnceLock::new();
    A.get_or_init(build).as_ref()
}

fn skip(why: &str) -> Option<Asan> {
    let required = std::env::var_os("PGTEST_REQUIRE_ASAN").is_some()
        || std::env::var_os("PGTEST_REQUIRE_ALL").is_some();
    assert!(!required, "AddressSanitizer is required here: {why}");
    eprintln!("SKIPPED: {why}; .ci/run installs it");
    None
}

fn build() -> Option<Asan> {
    let compiler = compiler();
    let out = Command::new(compiler)
        .arg("-print-file-name=libasan.so")
        .output()
        .ok()?;
    let runtime = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    // gcc prints the bare name back when it has no such file.
    if !runtime.is_absolute() || !runtime.exists() {
        return skip(&format!(
            "no AddressSanitizer runtime (libasan.so) for {compiler}"
        ));
    }
    // qemu-aarch64 finds the guest's libraries under /usr/aarch64-linux-gnu, not where the
    // cross compiler keeps its runtime: the guest's loader takes a name it can search for.
    let runtime = if aarch64() {
        PathBuf::from(std::fs::read_link(&runtime).ok()?.file_name()?)
    } else {
        runtime
    };
    let dir = fixture_set("asan");
    let (prog, prog_static) = (dir.join("asan_pin"), dir.join("asan_pin_static"));
    Some(Asan {
        runtime,
        prog,
        prog_static,
    })
}
