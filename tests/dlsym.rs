//! pinguard's `dlsym`/`dlvsym` give every caller the answer glibc would give it: with another
//! interposer preloaded before or after pinguard, from libraries loaded `RTLD_LOCAL`, and in
//! `dlerror`.

mod common;
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
            let out = program(&f.dir.join("dlsym_check"), Some(preload.as_ref())).output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{label}:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
            assert!(!stdout.contains("BAD"), "{label}:\n{stdout}");
            let expected = if preload.contains("libwrap") { 14 } else { 11 };
            assert_eq!(stdout.lines().filter(|l| l.ends_with(" ok")).count(), expected, "{label}:\n{stdout}");
        }
    }
}
