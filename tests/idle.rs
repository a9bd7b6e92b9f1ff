//! A process that never pins cannot tell pinguard is there (issue 44 item 8): the same exit
//! status and output, no thread, no descriptor, no file, no line, and no mapping of pinguard's
//! beyond the library's own segments (its heap and work stacks come with the first pinning call).

use crate::common;
use common::*;
use std::process::Output;

fn idle_program() -> std::path::PathBuf {
    fixture_set("idle").join("idle")
}

fn run_idle(preload: bool) -> (Output, Vec<String>) {
    let dir = fresh_dir(if preload { "idle-with" } else { "idle-without" });
    let lib = fixtures().lib.clone();
    let mut cmd = program(&idle_program(), preload.then_some(lib.as_os_str()));
    cmd.current_dir(&dir);
    clear_pinguard_env(&mut cmd);
    let out = run_bounded(&mut cmd, std::time::Duration::from_secs(60));
    let files = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    (out, files)
}

/// The bytes of anonymous mappings the program listed, without the one that directly follows
/// pinguard's own segments (the library's `.bss`, part of loading it). Bytes, not a count: the
/// kernel merges neighbouring anonymous mappings, so their number moves with the layout.
fn anonymous_bytes(stdout: &str) -> u64 {
    let maps: Vec<&str> = stdout.lines().filter(|l| l.starts_with("map ")).collect();
    let bss = maps
        .iter()
        .rposition(|l| l.contains("libpinguard"))
        .map(|i| i + 1);
    maps.iter()
        .enumerate()
        .filter(|(i, l)| Some(*i) != bss && l.split_whitespace().count() == 6)
        .map(|(_, l)| {
            let range = l.split_whitespace().nth(1).unwrap();
            let (a, b) = range.split_once('-').unwrap();
            u64::from_str_radix(b, 16).unwrap() - u64::from_str_radix(a, 16).unwrap()
        })
        .sum()
}

#[test]
fn a_process_that_never_pins_has_no_thread_descriptor_file_line_or_mapping_of_pinguards() {
    let (without, files_without) = run_idle(false);
    let (with, files_with) = run_idle(true);
    assert_eq!(with.status.code(), Some(3), "{with:?}");
    assert_eq!(with.status.code(), without.status.code());
    assert_eq!(String::from_utf8_lossy(&with.stderr), "", "no line");
    assert_eq!(with.stderr, without.stderr);
    assert!(
        files_with.is_empty() && files_without.is_empty(),
        "{files_with:?}"
    );
    let (a, b) = (
        String::from_utf8_lossy(&without.stdout),
        String::from_utf8_lossy(&with.stdout),
    );
    let facts = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with("Threads:") || l.starts_with("fd "))
            .map(str::to_owned)
            .collect()
    };
    assert!(facts(&a).iter().any(|l| l.starts_with("Threads:")), "{a}");
    assert_eq!(facts(&b), facts(&a), "threads and descriptors");
    if !aarch64() {
        // qemu-user lists its own mappings beside the guest's.
        // pinguard's own mappings (heap, reserve, work stack, state) are 64 KiB and more each.
        let (with, without) = (anonymous_bytes(&b), anonymous_bytes(&a));
        assert!(
            with <= without + (16 << 10),
            "pinguard mapped memory of its own in a process that never pinned ({with} bytes against {without}):\n{b}"
        );
    }
}

fn small_lock(bytes: &str, env: &[(&str, &str)]) -> (Output, Vec<String>) {
    let f = fixtures();
    let prog = fixture_set("idle").join("small_lock");
    let dir = fresh_dir(&format!("small-lock-{bytes}"));
    let mut cmd = program(&prog, Some(f.lib.as_os_str()));
    cmd.current_dir(&dir).arg(bytes);
    clear_pinguard_env(&mut cmd);
    cmd.envs(env.iter().copied());
    let out = run_bounded(&mut cmd, std::time::Duration::from_secs(60));
    let files = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    (out, files)
}

/// Issue 44 item 9: under a node-wide preload, a program that locks a little through the `mlock`
/// family (gpg's 32 KiB of secure memory) leaves nothing in its working directory and prints
/// nothing, unless a report was asked for; past `PINGUARD_QUIET_BELOW` (1 MiB) it reports.
#[test]
fn a_small_mlock_leaves_nothing_unless_a_report_was_asked_for() {
    let (out, files) = small_lock("32768", &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "no line");
    assert!(files.is_empty(), "nothing in the working tree: {files:?}");
    let (out, files) = small_lock("2097152", &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2.00 MiB pinned"),
        "{out:?}"
    );
    assert!(files.iter().any(|f| f.ends_with(".json")), "{files:?}");
    let (out, files) = small_lock("32768", &[("PINGUARD_REPORT", "asked.%p.json")]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        files.iter().any(|f| f.starts_with("asked.")),
        "asked for: {files:?}"
    );
    let (_, files) = small_lock("32768", &[("PINGUARD_QUIET_BELOW", "0")]);
    assert!(
        files.iter().any(|f| f.ends_with(".json")),
        "threshold 0: {files:?}"
    );
}
