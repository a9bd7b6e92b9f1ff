//! The CLI's integration tests, one binary: every file of `cli/tests/` is a module.
//! `cargo test -p pinguard-cli --test suite MODULE::` runs one file's tests.

mod asan;
mod cdi;
mod cli;
#[path = "../../tests/common/mod.rs"]
mod common;
mod doctor;
mod export;
mod gate;
mod hostile_folders;
mod python_paths;

/// With `autotests = false` a file of this folder that no `mod` line names is never compiled nor
/// run: every one must be a module here.
#[test]
fn every_test_file_is_a_module_of_the_suite() {
    common::assert_every_file_is_a_module(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"),
    );
}
