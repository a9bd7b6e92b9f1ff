//! The state file (`report.PID.state`): a fork child's is its own, a running process's reads as
//! `running`, a normal exit leaves none, and a folder that cannot hold one changes nothing else.

use crate::common;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::Stdio;

fn build() -> std::path::PathBuf {
    fixture_set("state_file").join("state_fork")
}

fn states_in(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "state"))
        .collect();
    v.sort();
    v
}

/// `pinguard report --json DIR`'s line for each process, by pid (JSON: the CLI's output).
fn per_process(dir: &std::path::Path) -> Vec<Value> {
    let out = pinguard_cli(&["report".as_ref(), "--json".as_ref(), dir.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["per_process"].as_array().unwrap().clone()
}

#[test]
fn a_fork_child_killed_leaves_its_own_state_and_the_parent_its_report() {
    if aarch64() {
        return; // the CLI runs on the host
    }
    let r = run(build().to_str().unwrap(), &["fork"], &[]);
    assert!(r.success(), "{}", r.stderr);
    assert!(r.stdout.contains("signalled=1 sig=9"), "{}", r.stdout);
    let child: u32 = r
        .stdout
        .split("child=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let states = states_in(&r.report_dir);
    assert_eq!(
        states.len(),
        1,
        "only the killed child leaves a state: {states:?}"
    );
    let text = pinguard_cli(&["report".as_ref(), r.report_dir.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("2 reports, 1 of them killed (read from the state left behind)"),
        "{text}"
    );
    assert!(
        text.contains("main (state_fork.c:") || text.contains("pin (state_fork.c:"),
        "named from the module list: {text}"
    );
    assert!(
        states[0]
            .to_string_lossy()
            .ends_with(&format!("report.{child}.state")),
        "{states:?}"
    );
    let procs = per_process(&r.report_dir);
    assert_eq!(procs.len(), 2, "{procs:?}");
    for p in &procs {
        let (reason, live, count) = (
            p["reason"].as_str().unwrap(),
            &p["totals"]["live_bytes"],
            &p["totals"]["live_count"],
        );
        if p["pid"] == child {
            // The child's own three, none of the parent's two.
            assert_eq!(
                (reason, live.as_u64(), count.as_u64()),
                ("killed", Some(3 * 8192), Some(3)),
                "{p}"
            );
            assert_eq!(p["totals"]["alloc_count"], 3, "{p}");
        } else {
            assert_eq!(
                (reason, live.as_u64(), count.as_u64()),
                ("exit", Some(2 * 4096), Some(2)),
                "{p}"
            );
        }
    }
}

/// A state left behind holds the command line, the settings and every callsite: only its owner
/// may read it, as the report.
#[test]
fn a_state_left_behind_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let r = run(build().to_str().unwrap(), &["fork"], &[]);
    assert!(r.success(), "{}", r.stderr);
    let states = states_in(&r.report_dir);
    assert_eq!(states.len(), 1, "{states:?}");
    let mode = std::fs::metadata(&states[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "state file mode {mode:o}");
}

#[test]
fn a_running_process_reads_as_running_and_a_normal_exit_leaves_no_state() {
    if aarch64() {
        return;
    }
    let f = fixtures();
    let dir = fresh_dir("state_hold");
    let mut child = program(&build(), Some(f.lib.as_os_str()))
        .arg("hold")
        .current_dir(&dir)
        .env("PINGUARD_REPORT", dir.join("report.%p.json"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let procs = per_process(&dir);
    assert_eq!(procs.len(), 1, "{procs:?}");
    assert_eq!(procs[0]["reason"], "running", "{}", procs[0]);
    assert_eq!(procs[0]["totals"]["live_bytes"], 8192);
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert!(
        states_in(&dir).is_empty(),
        "the exit report replaces the state"
    );
    let reports = reports_in(&dir);
    assert_eq!(reports.len(), 1);
    let rep = read_report(&reports[0]);
    assert_eq!(rep.reason, pinguard_common::Reason::Exit);
    assert_eq!(rep.totals.live_bytes, 8192);
}

#[test]
fn a_report_folder_that_cannot_be_made_changes_nothing_but_the_report() {
    let f = fixtures();
    let dir = fresh_dir("state_nowhere");
    std::fs::write(dir.join("file"), "a file where a folder should be").unwrap();
    let tmp = fresh_dir("state_nowhere_tmp");
    let out = program(&build(), Some(f.lib.as_os_str()))
        .arg("fork")
        .current_dir(&dir)
        .env("PINGUARD_REPORT", dir.join("file/sub/report.%p.json"))
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("signalled=1 sig=9"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Issue 46 item 12: the report goes to the temporary folder, and the exit line says so.
    assert!(
        stderr.contains(&format!("report: {}/report.", tmp.display()))
            && stderr.contains("not writable where asked"),
        "{stderr}"
    );
    assert_eq!(reports_in(&tmp).len(), 1, "{stderr}");
    assert!(
        stderr.contains("8.00 KiB pinned in 2 allocations"),
        "the figures are kept in memory: {stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("file")],
        "nothing else written"
    );
}

#[test]
fn an_image_replaced_by_exec_leaves_no_state_for_a_death() {
    if aarch64() {
        return; // under qemu-user, /proc/self/exe is qemu
    }
    let r = run(build().to_str().unwrap(), &["exec"], &[]);
    assert!(r.success(), "{}", r.stderr);
    assert!(
        states_in(&r.report_dir).is_empty(),
        "the new image (same pid, same start) removed the old image's state"
    );
    assert!(
        reports_in(&r.report_dir).is_empty(),
        "neither image wrote a report"
    );
}

/// A file size limit below the state's first piece: without a state, the program runs as without
/// pinguard (a file growing past the limit would have earned it SIGXFSZ), and its report, small
/// enough, is written.
#[test]
fn a_file_size_limit_below_the_state_never_costs_the_program_its_life() {
    let dir = fresh_dir("state_fsize");
    let mut cmd = command_in(&build(), &dir, true);
    cmd.arg("fork");
    // SAFETY: setrlimit in the child between fork and exec touches only the child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let lim = libc::rlimit {
                rlim_cur: 64 << 10,
                rlim_max: 64 << 10,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(String::from_utf8_lossy(&out.stdout).contains("signalled=1 sig=9"));
    assert!(
        states_in(&dir).is_empty(),
        "no state file left: {:?}",
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect::<Vec<_>>()
    );
    let reports = reports_in(&dir);
    assert_eq!(reports.len(), 1, "the parent's report: {stderr}");
    assert_eq!(read_report(&reports[0]).totals.live_bytes, 8192);
}

/// A corrupt state (a list that comes back on itself, a module based above its frames) is read
/// in bounded time without a panic.
#[test]
fn a_corrupt_state_is_read_in_bounded_time_without_a_panic() {
    use pinguard_common::state::{header, module};
    if aarch64() {
        return;
    }
    let r = run(build().to_str().unwrap(), &["fork"], &[]);
    let state = states_in(&r.report_dir).pop().expect("the child's state");
    let mut b = std::fs::read(&state).unwrap();
    let word = |b: &[u8], off: usize| u64::from_ne_bytes(b[off..off + 8].try_into().unwrap());
    // The file offset of a process address, from the header's piece list.
    let off_of = |b: &[u8], a: u64| {
        (0..pinguard_common::state::PIECES)
            .map(|i| {
                (
                    word(b, header::PIECES + i * 24),
                    word(b, header::PIECES + i * 24 + 8),
                    word(b, header::PIECES + i * 24 + 16),
                )
            })
            .find(|&(at, len, _)| a >= at && a < at + len)
            .map(|(at, _, off)| (off + a - at) as usize)
            .expect("an address in a piece")
    };
    let site = word(&b, header::CALLSITES);
    let site_off = off_of(&b, site);
    b[site_off..site_off + 8].copy_from_slice(&site.to_ne_bytes()); // next: itself
    let m = word(&b, header::MODULES);
    let m_off = off_of(&b, m);
    b[m_off + module::BASE..m_off + module::BASE + 8].copy_from_slice(&u64::MAX.to_ne_bytes());
    let bad = fresh_dir("state_corrupt");
    std::fs::write(bad.join("report.1.state"), &b).unwrap();
    cli(); // built (or found up to date) before the clock starts: only the reading is timed
    let t = std::time::Instant::now();
    let out = pinguard_cli(&["report".as_ref(), "--json".as_ref(), bad.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["per_process"][0]["reason"], "killed");
}

/// A FIFO planted where a program's state would go never holds up its start.
#[test]
fn a_fifo_at_the_state_path_never_holds_up_a_program() {
    if aarch64() {
        return; // the preload is the aarch64 library: the host's sh cannot load it
    }
    let f = fixtures();
    let dir = fresh_dir("state_fifo");
    let script = format!(
        "mkfifo \"$D/report.$$.state\" && exec {} idle",
        build().display()
    );
    let mut cmd = std::process::Command::new("timeout");
    cmd.args(["20", "sh", "-c", &script])
        .env("D", &dir)
        .env("LD_PRELOAD", &f.lib)
        .env("PINGUARD_REPORT", dir.join("report.%p.json"));
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "timeout's 124 means the program hung: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_fork_child_that_pins_does_not_print_its_parents_bad_settings_again() {
    // The parent pins (and prints the bad setting), forks; the child pins too.
    let r = run(
        build().to_str().unwrap(),
        &["fork"],
        &[("PINGUARD_BUDGET", "-1")],
    );
    assert!(r.success(), "{}", r.stderr);
    assert!(r.stdout.contains("signalled=1 sig=9"), "{}", r.stdout);
    let n = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("PINGUARD_BUDGET"))
        .count();
    assert_eq!(n, 1, "{}", r.stderr);
}

/// A running process's state carries each callsite's refused bytes, past the events' bound (a
/// state has no events at all): `pinguard report --json` shows them as the exit report would.
#[test]
fn a_states_callsites_carry_their_refused_bytes() {
    if aarch64() {
        return;
    }
    let f = fixtures();
    let dir = fresh_dir("state_refusals");
    let n = 10_050u64;
    let mut child = program(&f.dir.join("refusals"), Some(f.lib.as_os_str()))
        .args([n.to_string().as_str(), "hold"])
        .current_dir(&dir)
        .env("PINGUARD_REPORT", dir.join("report.%p.json"))
        .env("PINGUARD_BUDGET", "4K")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.as_mut().unwrap());
    let (mut refused, mut ready) = (String::new(), String::new());
    out.read_line(&mut refused).unwrap();
    out.read_line(&mut ready).unwrap();
    assert_eq!(
        (refused.trim(), ready.trim()),
        (format!("refused={n}").as_str(), "ready")
    );
    let o = pinguard_cli(&["report".as_ref(), "--json".as_ref(), dir.as_os_str()]);
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["per_process"][0]["reason"], "running", "{v}");
    let site = v["callsites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["denied_count"] == n)
        .unwrap_or_else(|| panic!("{v}"))
        .clone();
    assert_eq!(site["denied_bytes"], n * 8192);
    assert_eq!(v["totals"]["denied_bytes"], n * 8192);
}

#[test]
fn a_process_that_pins_nothing_leaves_neither_state_nor_report() {
    // The program asks pinguard's C API for its live bytes and makes a runtime call that pins
    // nothing (0 bytes): the state file made for them holds nothing, and goes at exit.
    let r = run("scenario", &["cuda_alloc:0"], &[]);
    assert!(r.success(), "{}", r.stderr);
    assert!(r.stdout.contains("pinguard_live_bytes\":0"), "{}", r.stdout);
    let left: Vec<_> = std::fs::read_dir(&r.report_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert!(
        left.is_empty(),
        "a process that pinned nothing left {left:?}"
    );
    assert!(pinguard_lines(&r.stderr).is_empty(), "{}", r.stderr);
}
