//! The library's integration tests, one binary (as ripgrep's): every file of `tests/` is a module,
//! named for the stage or guarantee it checks; `tests/common` builds the fixtures once per run.
//! `cargo test --test suite MODULE::` runs one file's tests.

mod asan;
mod ascend_hal;
mod bystander;
mod callsites;
mod cgroup_reserve;
mod common;
mod config_env;
mod device_memory;
mod dlsym;
mod driver_paths;
mod endings;
mod exit_memory;
mod file_safety;
mod forks_exits;
mod forks_reloads;
mod front;
mod group;
mod hip;
mod hooks;
mod host_reserve;
mod hostile;
mod ibverbs;
mod idle;
mod load;
mod locked_pages;
mod locking;
mod mem_limits;
mod metrics;
mod musl;
mod overlap;
mod pod_group;
mod policies;
mod pools;
mod pytest_plugin;
mod python_ctypes;
mod python_frames;
mod races;
mod register_pinned;
mod report;
mod run_endings;
mod safety_budget;
mod safety_cancel;
mod safety_group;
mod safety_signals;
mod scope;
mod secure_mode;
mod small_stack;
mod snapshots;
mod state_file;
mod stress;
mod third_party;
mod threads;
mod unwind;
mod vm_pin;
mod vmm;

/// With `autotests = false` a file of this folder that no `mod` line names is never compiled nor
/// run: every one must be a module here.
#[test]
fn every_test_file_is_a_module_of_the_suite() {
    common::assert_every_file_is_a_module(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"),
    );
}
