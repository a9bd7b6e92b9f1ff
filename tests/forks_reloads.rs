//! Programs that do odd but legal things with processes and objects (issue 44 items 2-4), each
//! run with and without the library: the same exit status and output, and figures of its own.
//! A runtime unloaded and loaded again at another address is found again; a `fork` from a signal
//! handler that interrupted pinguard never waits; a child made without the atfork handlers
//! (`_Fork`, a raw `clone`) gets state of its own and leaves its parent's figures alone.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// This file's C programs, next to the shared fixtures (the plugin against their runtime):
/// `tests/fixtures.txt`, set `forks_reloads`.
fn progs() -> &'static Path {
    fixture_set("forks_reloads")
}

/// `prog` with `args` in a fresh folder, with and without the library: both outputs and the
/// folder the preloaded run wrote its reports to.
fn both(prog: &str, args: &[&str], env: &[(&str, &str)], limit: u64) -> (Output, Output, PathBuf) {
    let path = progs().join(prog);
    let go = |preload: bool| {
        let dir = fresh_dir(prog);
        let mut cmd = command_in(&path, &dir, preload);
        cmd.args(args).envs(env.iter().copied());
        (run_bounded(&mut cmd, Duration::from_secs(limit)), dir)
    };
    let (without, _) = go(false);
    let (with, dir) = go(true);
    (with, without, dir)
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The same exit status and output with and without the library.
fn same(with: &Output, without: &Output) {
    assert!(
        without.status.success(),
        "without pinguard: {}",
        show(without)
    );
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        (with.status.code(), text(with)),
        (without.status.code(), text(without)),
        "with pinguard: {}\nwithout: {}",
        show(with),
        show(without)
    );
}

/// The preloaded run's reports: the program's own (its parent is this test), and its children's.
fn reports(dir: &Path) -> (Report, Vec<Report>) {
    let me = std::process::id();
    let (mut parent, mut children) = (None, Vec::new());
    for p in reports_in(dir) {
        let r = read_report(&p);
        if r.process.ppid == me {
            parent = Some(r);
        } else {
            children.push(r);
        }
    }
    (parent.expect("the program's exit report"), children)
}

#[test]
fn a_runtime_reloaded_at_another_address_is_found_again() {
    let plugin = progs().join("libreload_plugin.so");
    let (with, without, dir) = both("reload_runtime", &[plugin.to_str().unwrap(), "6"], &[], 60);
    same(&with, &without);
    let (r, _) = reports(&dir);
    // Six rounds, each a call of the plugin's and one through dlsym's pointers: every one seen,
    // including those past the four slots a family keeps for functions dlsym hands out.
    assert_eq!(r.totals.alloc_count, 12, "{:?}", r.totals);
    assert_eq!(r.totals.release_count, 12, "{:?}", r.totals);
}

#[test]
fn fork_from_a_signal_handler_that_interrupted_pinguard_never_waits() {
    let (with, without, dir) = both("fork_in_handler", &["1500"], &[], 60);
    same(&with, &without);
    let (r, children) = reports(&dir);
    assert_eq!(r.totals.live_bytes, 65536, "{:?}", r.totals);
    let count = |o: &Output, what: &str| {
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .find_map(|l| l.strip_prefix(what)?.parse::<usize>().ok())
            .unwrap()
    };
    assert!(count(&with, "forks ") > 100, "{}", show(&with));
    // The children that went on (forked with or without pinguard's locks held) each report their
    // own lock, and only it.
    assert_eq!(children.len(), count(&with, "returned "), "{}", show(&with));
    for c in &children {
        assert_eq!(c.totals.live_bytes, 65536, "{:?}", c.totals);
    }
}

#[test]
fn children_made_without_atfork_handlers_get_state_of_their_own() {
    let (with, without, dir) = both("fork_no_handlers", &[], &[], 60);
    same(&with, &without);
    let text = String::from_utf8_lossy(&with.stdout);
    assert!(text.contains("VmLck 1024 kB"), "{text}");
    let (parent, children) = reports(&dir);
    assert_eq!(parent.totals.live_bytes, 1 << 20, "{:?}", parent.totals);
    // Each child wrote its own report, with its own lock in it.
    let own: Vec<_> = children.iter().map(|c| c.totals.live_bytes).collect();
    assert_eq!(own, [131072, 131072], "{children:?}");
}

#[test]
fn a_cuda_child_made_without_atfork_handlers_is_not_refused_for_its_parents_memory() {
    let env = [("PINGUARD_BUDGET", "1M")];
    let (with, without, dir) = both("fork_no_handlers", &["cuda"], &env, 60);
    same(&with, &without);
    let (parent, _) = reports(&dir);
    assert_eq!(parent.totals.live_bytes, 768 << 10, "{:?}", parent.totals);
}

#[test]
fn children_made_without_atfork_handlers_while_a_thread_is_inside_pinguard_never_hang() {
    // Each child either finds every lock of its parent's free and starts its own state, or stands
    // aside (a lock held by the thread it does not have): its allocation succeeds either way.
    let env = [("PINGUARD_BUDGET", "1M")];
    let (with, without, dir) = both("fork_no_handlers", &["threads"], &env, 120);
    same(&with, &without);
    let (parent, children) = reports(&dir);
    assert_eq!(parent.totals.live_bytes, 768 << 10, "{:?}", parent.totals);
    // Most children find the thread's locked-page view held (across the kernel's call) and
    // forget it unread: they report their own allocation, and only it.
    assert!(!children.is_empty(), "{}", show(&with));
    for c in &children {
        assert_eq!(c.totals.live_bytes, 512 << 10, "{:?}", c.totals);
    }
}
