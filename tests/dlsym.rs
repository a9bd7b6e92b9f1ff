//! pinguard's `dlsym`/`dlvsym` give every caller the answer glibc would give it: with another
//! interposer preloaded before or after pinguard, from libraries loaded `RTLD_LOCAL`, and in
//! `dlerror`.

use crate::common;
use common::*;

#[test]
fn dlsym_answers_as_glibc_in_every_preload_order() {
    let f = fixtures();
    let wrap = f.dir.join("libwrap.so");
    let lib = f.lib.to_str().unwrap().to_string();
    let wrap = wrap.to_str().unwrap().to_string();
    for (label, preload) in [
        ("pinguard alone", lib.clone()),
        ("pinguard first", format!("{lib}:{wrap}")),
        ("pinguard last", format!("{wrap}:{lib}")),
        ("wrapper alone", wrap.clone()),
    ] {
        for _ in 0..3 {
            let out = program(&f.dir.join("dlsym_check"), Some(preload.as_ref()))
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{label}:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!stdout.contains("BAD"), "{label}:\n{stdout}");
            let expected = if preload.contains("libwrap") { 14 } else { 11 };
            assert_eq!(
                stdout.lines().filter(|l| l.ends_with(" ok")).count(),
                expected,
                "{label}:\n{stdout}"
            );
        }
    }
}

/// Every entry point a family's table declares (read by `scripts/exports.py`), looked up through
/// a handle of its runtime, is pinguard's: a runtime's name gets its wrapper, libc's its export.
/// Without pinguard each answer is the runtime's own, so every name was really looked up.
#[test]
fn every_table_row_is_redirected_through_a_handle() {
    let f = fixtures();
    let exe = fixture_set("dlsym_table").join("dlsym_table");
    let out = std::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/exports.py"))
        .arg("--families")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = String::from_utf8(out.stdout).unwrap();
    let lib_name = wrappers_file_name();
    for (family, runtime, file) in [
        (
            "cuda_runtime",
            f.dir.join("libcudart.so").to_str().unwrap().to_string(),
            "libcudart.so",
        ),
        (
            "cuda_driver",
            f.dir.join("libcuda.so.1").to_str().unwrap().to_string(),
            "libcuda.so.1",
        ),
        (
            "acl",
            f.dir.join("libascendcl.so").to_str().unwrap().to_string(),
            "libascendcl.so",
        ),
        ("libc_lock", "libc.so.6".to_string(), "libc.so.6"),
    ] {
        let names: Vec<&str> = rows
            .lines()
            .filter_map(|l| l.strip_prefix(family)?.strip_prefix(' '))
            .collect();
        assert!(names.len() >= 9, "{family}: {names:?}");
        for (preload, holder) in [(Some(f.lib.as_os_str()), lib_name.as_str()), (None, file)] {
            let out = program(&exe, preload)
                .arg(&runtime)
                .args(&names)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{family}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let answers: Vec<(&str, &str)> =
                text.lines().filter_map(|l| l.split_once(' ')).collect();
            assert_eq!(
                answers.iter().map(|a| a.0).collect::<Vec<_>>(),
                names,
                "{family}"
            );
            // Through the first stage, a libc row's answer is the stage's export of that name,
            // which reaches the library as the library's own would.
            let stage = preload.is_some() && f.lib.ends_with("libpinguard-lazy.so");
            for (name, found) in answers {
                assert!(
                    found == holder || stage && found == "libpinguard-lazy.so",
                    "{family}: dlsym(handle, {name}) with pinguard {}: {found}, not {holder}",
                    preload.is_some()
                );
            }
        }
    }
}
