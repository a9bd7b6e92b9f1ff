//! The pytest plugin (issue 46, item 3): real pytest on a real test file that pins through ctypes
//! (the emulated CUDA runtime), `--pinguard` running the session under the library, the markers
//! failing the tests over their limits with the callsite named, and passing the others.

use crate::common;
use common::*;
use std::process::Command;

const TESTS: &str = r#"
import ctypes, os, pytest
cudart = ctypes.CDLL(os.environ["PGTEST_CUDART"])

def pin(n):
    p = ctypes.c_void_p()
    assert cudart.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), 0) == 0
    return p

def free(p):
    assert cudart.cudaFreeHost(p) == 0

held = []

def load_weights():
    held.append(pin(256 << 10))

@pytest.mark.limit_pinned("1 MiB")
def test_small_peak():
    free(pin(512 << 10))

@pytest.mark.limit_pinned("1 MiB")
def test_big_peak():
    free(pin(4 << 20))

@pytest.mark.limit_pinned_leaks("0 B")
def test_leaks():
    load_weights()

@pytest.mark.limit_pinned_leaks("0 B")
def test_frees_what_it_pins():
    free(pin(256 << 10))

@pytest.mark.limit_pinned_leaks(512 << 10)
def test_leak_within_its_allowance():
    load_weights()

@pytest.mark.limit_pinned("1 MiB")
def test_under_a_peak_an_earlier_test_set():
    free(pin(2 << 20))
"#;

fn pytest(dir: &std::path::Path, args: &[&str]) -> (i32, String) {
    let f = fixtures();
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.current_dir(dir);
    clear_pinguard_env(&mut cmd);
    cmd.env("PYTHONPATH", root().join("python"))
        .env("PGTEST_CUDART", f.dir.join("libcudart.so"))
        .env("PINGUARD_REPORT", dir.join("reports/%e.%p.json"))
        .env_remove("PYTEST_ADDOPTS")
        .args([
            "-m",
            "pytest",
            "-p",
            "pinguard.pytest_plugin",
            "-p",
            "no:cacheprovider",
        ])
        .args(["-q", "-rf", "test_pins.py"])
        .args(args);
    let out = run_bounded(&mut cmd, std::time::Duration::from_secs(120));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn setup(tag: &str) -> Option<std::path::PathBuf> {
    if aarch64() || !have_pytest() {
        return None;
    }
    let dir = fresh_dir(tag);
    std::fs::create_dir_all(dir.join("reports")).unwrap();
    std::fs::write(dir.join("test_pins.py"), TESTS).unwrap();
    Some(dir)
}

fn have_pytest() -> bool {
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import pytest"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "pytest is required here (Debian's python3-pytest)"
        );
        eprintln!("SKIPPED: no pytest for /usr/bin/python3");
    }
    ok
}

#[test]
fn markers_fail_the_tests_over_their_limits_and_name_the_callsite() {
    let Some(dir) = setup("pytest-plugin") else {
        return;
    };
    let lib = fixtures().lib.to_string_lossy().into_owned();
    let (rc, out) = pytest(&dir, &["--pinguard", "--pinguard-library", &lib]);
    assert_eq!(rc, 1, "pytest fails: some tests failed\n{out}");
    assert!(out.contains("3 failed, 3 passed"), "{out}");
    // Each failure's section: from its header to the next.
    let section = |name: &str| {
        let head = format!("_ {name} _");
        let start = out
            .find(&head)
            .unwrap_or_else(|| panic!("{name} did not fail:\n{out}"));
        let rest = &out[start + head.len()..];
        rest[..rest.find("\n___").unwrap_or(rest.len())].to_owned()
    };
    let big = section("test_big_peak");
    assert!(
        big.contains("pinned a peak of 4.00 MiB, over the limit of 1.00 MiB"),
        "{big}"
    );
    assert!(
        big.contains("4.00 MiB  pin (test_pins.py:7) <- test_big_peak (test_pins.py:"),
        "{big}"
    );
    assert!(big.contains("-> cudaHostAlloc"), "{big}");
    let leak = section("test_leaks");
    assert!(
        leak.contains("left 256.00 KiB pinned at its end, over the limit of 0 B"),
        "{leak}"
    );
    assert!(
        leak.contains("<- load_weights (test_pins.py:16) <- test_leaks"),
        "{leak}"
    );
    // The process's peak (4 MiB) was set by an earlier test, and 512 KiB were live when it
    // started: its own 2 MiB rise and fall, within a millisecond, is still caught.
    let under = section("test_under_a_peak_an_earlier_test_set");
    assert!(under.contains("pinned a peak of 2.00 MiB"), "{under}");
    for passed in [
        "test_small_peak",
        "test_frees_what_it_pins",
        "test_leak_within_its_allowance",
    ] {
        assert!(
            !out.contains(&format!("_ {passed} _")),
            "{passed} failed:\n{out}"
        );
    }
}

#[test]
fn without_pinguard_the_markers_are_ignored_and_a_missing_library_is_one_clear_error() {
    let Some(dir) = setup("pytest-plugin-off") else {
        return;
    };
    let (rc, out) = pytest(&dir, &[]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("6 passed"), "{out}");
    let (rc, out) = pytest(
        &dir,
        &[
            "--pinguard",
            "--pinguard-library",
            "/nonexistent/libpinguard.so",
        ],
    );
    assert_eq!(rc, 4, "a usage error: {out}");
    assert!(
        out.contains("--pinguard: pinguard's library /nonexistent/libpinguard.so is not there"),
        "{out}"
    );
}
