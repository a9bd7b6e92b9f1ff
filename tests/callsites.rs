//! Callsites are bounded: a program that pins from many distinct stacks, nothing of them live at
//! the end, keeps pinguard's memory, state file and report bounded (callsites with nothing live
//! are folded into one aggregate), while every live allocation keeps its own callsite and the
//! totals stay exact.

use crate::common;
use common::*;
use pinguard_common::Callsite;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;

fn build() -> std::path::PathBuf {
    fixture_set("callsites").join("many_stacks")
}

fn with_ext(dir: &std::path::Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// The child's peak resident memory in bytes, once it has exited (`wait4`'s `ru_maxrss`).
fn wait_peak(child: std::process::Child) -> (i32, u64) {
    let mut status = 0;
    // SAFETY: all-zero is a valid `rusage`, filled by `wait4`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for the test's own child, writing into the locals above.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    assert_eq!(
        r,
        child.id() as i32,
        "wait4: {}",
        std::io::Error::last_os_error()
    );
    (status, ru.ru_maxrss as u64 * 1024)
}

const MB: u64 = 1 << 20;

#[test]
fn distinct_stacks_with_nothing_live_are_folded_and_everything_stays_bounded() {
    if aarch64() {
        return; // wait4's figures are qemu's
    }
    let (n, keep) = (65_536u64, 3u64);
    let dir = fresh_dir("many_stacks");
    let mut cmd = command_in(&build(), &dir, true);
    cmd.args([n.to_string(), keep.to_string()])
        .env("PINGUARD_HOOKS", "mlock");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("ready") && line.contains("failures=0"),
        "{line:?}"
    );

    // The state file while the process still runs, before its exit report replaces it.
    let states = with_ext(&dir, "state");
    assert_eq!(states.len(), 1, "{states:?}");
    let state_len = std::fs::metadata(&states[0]).unwrap().len();
    let kept = fresh_dir("many_stacks_state");
    std::fs::copy(&states[0], kept.join(states[0].file_name().unwrap())).unwrap();

    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    let stderr = child.stderr.take().unwrap();
    let (status, peak) = wait_peak(child);
    let stderr = std::io::read_to_string(stderr).unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status:#x}\n{stderr}"
    );

    let reports = with_ext(&dir, "json");
    assert_eq!(reports.len(), 1, "{reports:?}\n{stderr}");
    let report_len = std::fs::metadata(&reports[0]).unwrap().len();
    eprintln!("state file {state_len} bytes, report {report_len} bytes, peak memory {peak} bytes");
    assert!(state_len <= 64 * MB, "state file of {state_len} bytes");
    assert!(report_len <= 20 * MB, "report of {report_len} bytes");
    assert!(peak <= 200 * MB, "peak memory of {peak} bytes");

    let r = read_report(&reports[0]);
    let totals = &r.totals;
    assert_eq!(totals.alloc_count, n + keep, "{totals:?}");
    let sites = &r.callsites;
    let folded = &r.callsites_folded;
    let folded_count = folded.count;
    assert!(
        folded_count > 0 && sites.len() as u64 + folded_count == n + keep,
        "{} listed, {folded:?}",
        sites.len()
    );
    // Exact totals: the listed callsites and the aggregate add up to the process's figures.
    let listed: u64 = sites.iter().map(|s| s.alloc_count).sum();
    assert_eq!(listed + folded.alloc_count, n + keep, "{folded:?}");
    let bytes: u64 = sites.iter().map(|s| s.alloc_bytes).sum();
    assert_eq!(bytes + folded.alloc_bytes, totals.alloc_bytes);
    assert_eq!(folded.peak_live_bytes, 4096, "{folded:?}");

    // Every live allocation keeps a callsite of its own, named by its own function.
    let live = &r.live;
    assert_eq!(live.len() as u64, keep, "{live:?}");
    let mut ids: Vec<u32> = live.iter().map(|l| l.callsite).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len() as u64, keep, "{live:?}");
    let mut names = Vec::new();
    for id in ids {
        let site: &Callsite = sites
            .iter()
            .find(|s| s.id == id)
            .unwrap_or_else(|| panic!("live callsite {id} is not listed"));
        assert_eq!((site.live_count, site.live_bytes), (1, 4096), "{site:?}");
        let keeper = site
            .frames
            .iter()
            .find_map(|f| f.symbol.as_deref().filter(|s| s.starts_with("keep")));
        names.push(
            keeper
                .unwrap_or_else(|| panic!("no keepN frame in {site:?}"))
                .to_string(),
        );
    }
    names.sort();
    assert_eq!(names, ["keep0", "keep1", "keep2"]);

    // The CLI shows the aggregate, from the report and from the state the process left.
    for d in [&dir, &kept] {
        let text = pinguard_cli(&["report".as_ref(), d.as_os_str()]);
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            text.contains(&format!("{} callsites folded", folded_count))
                || d == &kept && text.contains("callsites folded"),
            "{}:\n{text}",
            d.display()
        );
    }
}

#[test]
fn the_cap_is_a_variable_and_a_folded_stack_that_comes_back_counts_anew() {
    // 2,000 stacks twice over, at most 64 kept apart: the second pass finds most stacks folded
    // and interns them again (in reused slots); every call is still counted once.
    let (n, keep, max) = (2_000u64, 3u64, 64u64);
    let dir = fresh_dir("many_stacks_cap");
    let mut cmd = command_in(&build(), &dir, true);
    cmd.args([n.to_string(), keep.to_string(), "2".into()])
        .env("PINGUARD_HOOKS", "mlock")
        .env("PINGUARD_MAX_CALLSITES", max.to_string());
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports = with_ext(&dir, "json");
    let r = read_report(&reports[0]);
    let (sites, folded) = (&r.callsites, &r.callsites_folded);
    assert!(sites.len() as u64 <= max + keep, "{} listed", sites.len());
    assert_eq!(
        sites.iter().filter(|s| s.live_count == 1).count() as u64,
        keep
    );
    let listed: u64 = sites.iter().map(|s| s.alloc_count).sum();
    assert_eq!(r.totals.alloc_count, 2 * n + keep);
    assert_eq!(listed + folded.alloc_count, 2 * n + keep, "{folded:?}");
    // More folded than there are stacks: the ones that came back were folded again.
    assert!(folded.count + sites.len() as u64 > n + keep, "{folded:?}");
    assert!(folded.apis.iter().any(|a| a == "mlock"), "{folded:?}");
}
