//! A pinned budget shared by the processes of a group through a ledger in shared memory, and the
//! Prometheus metrics file.

use crate::common;
use common::*;
use pinguard_common::group::{self as layout, Header};
use std::process::{Command, Stdio};

/// A group name no other test run uses, and its ledger removed before and after.
struct Group(String);
impl Group {
    fn new(tag: &str) -> Group {
        let g = Group(format!("test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(g.path());
        g
    }
    fn path(&self) -> String {
        layout::path(&self.0)
    }
    fn read_u64(&self, offset: usize) -> u64 {
        let b = std::fs::read(self.path()).unwrap();
        u64::from_ne_bytes(b[offset..offset + 8].try_into().unwrap())
    }
    fn used(&self) -> u64 {
        self.read_u64(std::mem::offset_of!(Header, used))
    }
    fn budget(&self) -> u64 {
        self.read_u64(std::mem::offset_of!(Header, budget))
    }
    /// The ledger is gone: its last member removed it (nothing of the group is left booked).
    fn gone(&self) -> bool {
        !std::path::Path::new(&self.path()).exists()
    }
}
impl Drop for Group {
    fn drop(&mut self) {
        remove_semaphores(&self.path());
        let _ = std::fs::remove_file(self.path());
    }
}

#[test]
fn eight_processes_of_four_threads_share_one_budget_exactly() {
    let f = fixtures();
    let g = Group::new("race");
    let budget: i64 = 512 * 1024;
    let dir = fresh_dir("group-race");
    let counter = dir.join("counter");
    std::fs::write(&counter, [0u8; 16]).unwrap();
    let children: Vec<_> = (0..8)
        .map(|_| {
            program(&f.dir.join("group_worker"), Some(f.lib.as_os_str()))
                .args(["4", "1500"])
                .env("PINGUARD_GROUP", &g.0)
                .env("PINGUARD_GROUP_BUDGET", budget.to_string())
                .env("PINGUARD_DEPTH", "4")
                .env("PINGUARD_REPORT", dir.join("r.%p.json"))
                .env("EMU_SHARED_COUNTER", &counter)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut refused = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        let line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("STATS ").map(str::to_string))
            .unwrap();
        refused += serde_json::from_str::<serde_json::Value>(&line).unwrap()["refused"]
            .as_i64()
            .unwrap();
    }
    let c = std::fs::read(&counter).unwrap();
    let (now, max) = (
        i64::from_ne_bytes(c[0..8].try_into().unwrap()),
        i64::from_ne_bytes(c[8..16].try_into().unwrap()),
    );
    assert!(
        max <= budget,
        "the group's runtimes held {max} bytes at once, over the {budget}-byte budget"
    );
    assert!(max > budget / 2, "the budget was never approached ({max})");
    assert!(refused > 0, "nothing refused: the test proves nothing");
    assert_eq!(now, 0);
    assert!(
        g.gone(),
        "the last member to leave removed the shared ledger"
    );
    let mut denied = 0;
    for p in reports_in(&dir) {
        let r = read_report(&p);
        let group = r.group.as_ref().expect("a group");
        assert_eq!(group.name, g.0);
        assert_eq!(group.budget_bytes, Some(budget as u64));
        assert!(group.peak_bytes <= budget as u64);
        denied += r.totals.denied_count as i64;
    }
    assert_eq!(denied, refused, "every refusal was the group budget's");
}

#[test]
fn a_member_killed_with_sigkill_has_its_bytes_reclaimed() {
    let g = Group::new("kill");
    let env = [
        ("PINGUARD_GROUP", g.0.as_str()),
        ("PINGUARD_GROUP_BUDGET", "100K"),
    ];
    let (mut holder, _out) = spawn_churn_holder(&g.0); // keeps 64 KiB pinned
    let r = run("scenario", &["cuda_alloc:65536"], &env);
    assert_eq!(
        r.rc("cuda_alloc:65536"),
        2,
        "the live holder's 64 KiB leave no room"
    );
    holder.kill().unwrap(); // SIGKILL: no exit handler runs
    holder.wait().unwrap();
    assert!(
        g.used() >= 65536,
        "the dead member's bytes are still booked"
    );
    let r = run("scenario", &["cuda_alloc:65536"], &env);
    assert_eq!(
        r.rc("cuda_alloc:65536"),
        0,
        "the next member reclaims them: {}",
        r.stderr
    );
    assert!(g.gone(), "and, the last member, removes the ledger at exit");
}

#[test]
fn a_reused_pid_is_not_mistaken_for_the_member() {
    let g = Group::new("reuse");
    let env = [
        ("PINGUARD_GROUP", g.0.as_str()),
        ("PINGUARD_GROUP_BUDGET", "100K"),
    ];
    // A live member keeps the ledger (slot 0) while it is edited.
    let held = Held::start(&fresh_dir("reuse-held"), &["cuda_alloc:4096"], &env);
    // A member entry whose pid is alive (this test's) but whose start time is not its own: the
    // process it described is gone and its pid was reused.
    let mut b = std::fs::read(g.path()).unwrap();
    let members = std::mem::offset_of!(Header, members) + std::mem::size_of::<layout::Member>();
    let used = std::mem::offset_of!(Header, used);
    b[members..members + 4].copy_from_slice(&std::process::id().to_ne_bytes());
    b[members + 8..members + 16].copy_from_slice(&1u64.to_ne_bytes()); // start_ticks
    b[members + 16..members + 24].copy_from_slice(&(90u64 * 1024).to_ne_bytes()); // bytes
    b[used..used + 8].copy_from_slice(&(90u64 * 1024 + 4096).to_ne_bytes());
    // Recorded in this PID namespace (where the pid can be checked), holding no semaphore.
    use std::os::unix::fs::MetadataExt;
    let pid_ns = std::fs::metadata("/proc/self/ns/pid").unwrap().ino();
    let at = members + std::mem::offset_of!(layout::Member, pid_ns);
    b[at..at + 8].copy_from_slice(&pid_ns.to_ne_bytes());
    std::fs::write(g.path(), &b).unwrap();
    let r = run("scenario", &["cuda_alloc:65536"], &env);
    assert_eq!(
        r.rc("cuda_alloc:65536"),
        0,
        "the stale entry is reclaimed: {}",
        r.stderr
    );
    assert_eq!(g.used(), 4096, "the live member's share alone");
    held.finish();
    assert!(g.gone());
}

/// Issue 46 item 5: a group's budget ends with the group. Every member exits: the last removes the
/// ledger, and the next job's group has the budget that job asks for, not the old one.
#[test]
fn the_last_member_to_leave_removes_the_ledger_and_the_next_job_sets_its_budget() {
    let g = Group::new("ends");
    let env = |b: &'static str| {
        [
            ("PINGUARD_GROUP", g.0.clone()),
            ("PINGUARD_GROUP_BUDGET", b.to_string()),
        ]
    };
    let e = env("12Ki");
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = run("scenario", &["cuda_alloc:4096", "cuda_alloc:65536"], &e);
    assert_eq!(
        r.rc("cuda_alloc:65536"),
        2,
        "12 KiB are in force: {}",
        r.stderr
    );
    assert!(g.gone(), "the last member removed the ledger");
    let e = env("100Ki");
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = run("scenario", &["cuda_alloc:65536"], &e);
    assert_eq!(r.rc("cuda_alloc:65536"), 0, "{}", r.stderr);
    assert!(!r.stderr.contains("already has a budget"), "{}", r.stderr);
    assert_eq!(
        r.typed_report().group.and_then(|g| g.budget_bytes),
        Some(102400)
    );
    assert!(g.gone());
}

/// Processes of a group start together and join at their first pin: a ledger nobody joined yet
/// is its creator's, not abandoned. A process that pins nothing neither replaces it when it
/// starts nor removes it when it ends (eight workers starting at once under qemu replaced each
/// other's until one ran without the group budget and the group held 1.7x its budget).
#[test]
fn a_process_that_pins_nothing_leaves_a_fresh_ledger_to_its_creator() {
    use std::os::unix::fs::MetadataExt;
    let f = fixtures();
    let g = Group::new("fresh");
    let mut creator = program(&f.dir.join("scenario"), Some(f.lib.as_os_str()));
    clear_pinguard_env(&mut creator);
    let mut creator = creator
        .arg("wait_stdin:0")
        .env("PINGUARD_GROUP", &g.0)
        .env("PINGUARD_GROUP_BUDGET", "1Mi")
        .env(
            "PINGUARD_REPORT",
            fresh_dir("fresh-creator").join("r.%p.json"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::path::Path::new(&g.path()).exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ino = std::fs::metadata(g.path())
        .expect("the creator made the ledger")
        .ino();
    let e = [
        ("PINGUARD_GROUP", g.0.as_str()),
        ("PINGUARD_GROUP_BUDGET", "2Mi"),
    ];
    let r = run("scenario", &["sleep_ms:1"], &e);
    let after = std::fs::metadata(g.path()).map(|m| m.ino());
    let budget = after.is_ok().then(|| g.budget());
    drop(creator.stdin.take());
    creator.wait().unwrap();
    assert_eq!(
        after.ok(),
        Some(ino),
        "the creator's ledger is still at the group's name: {}",
        r.stderr
    );
    assert_eq!(budget, Some(1024 * 1024), "with the creator's budget");
    assert!(g.gone(), "its creator, pinning nothing, removed it at exit");
}

/// A process of the group that never joined (its calls refused before, or none made yet) still
/// reports its group after the last member removed the ledger: the closed ledger's figures are
/// final (under qemu such a member's report had no `group` at all).
#[test]
fn a_report_after_the_last_member_left_still_names_the_group() {
    use std::io::{BufRead, Write};
    let f = fixtures();
    let g = Group::new("after-last");
    let dir = fresh_dir("after-last");
    let mut cmd = program(&f.dir.join("scenario"), Some(f.lib.as_os_str()));
    clear_pinguard_env(&mut cmd);
    let mut waiting = cmd
        .args([
            "wait_stdin:0",
            &format!("report:{}", dir.join("w.json").display()),
        ])
        .env("PINGUARD_GROUP", &g.0)
        .env("PINGUARD_GROUP_BUDGET", "1Mi")
        .env("PINGUARD_REPORT", dir.join("r.%p.json"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(waiting.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("waiting"), "{line}");
    let e = [("PINGUARD_GROUP", g.0.as_str())];
    let r = run("scenario", &["cuda_alloc:4096", "cuda_free:0"], &e);
    assert!(r.success(), "{}", r.stderr);
    assert!(g.gone(), "the only member removed the ledger: {}", r.stderr);
    waiting.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(waiting.wait().unwrap().success());
    let rep = read_report(&dir.join("w.json"));
    let group = rep.group.as_ref().expect("a group");
    assert_eq!(group.name, g.0, "{group:?}");
    assert_eq!(group.budget_bytes, Some(1024 * 1024), "{group:?}");
}

/// Issue 46 item 5: a last member killed with SIGKILL leaves its ledger; the next joiner proves
/// that nobody lives in it, removes it and starts the group afresh with its own budget.
#[test]
fn a_killed_last_members_ledger_is_replaced_by_the_next_joiner() {
    let g = Group::new("killed-last");
    let (mut holder, _out) = spawn_churn_holder(&g.0); // 100K budget, 64 KiB held
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(g.budget(), 100 * 1024, "the dead member's ledger is left");
    let env = [
        ("PINGUARD_GROUP", g.0.as_str()),
        ("PINGUARD_GROUP_BUDGET", "200Ki"),
        ("PINGUARD_LOG", "debug"),
    ];
    let r = run("scenario", &["cuda_alloc:131072"], &env);
    assert_eq!(r.rc("cuda_alloc:131072"), 0, "{}", r.stderr);
    assert!(!r.stderr.contains("already has a budget"), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("after removing one whose members were all gone"),
        "{}",
        r.stderr
    );
    assert_eq!(
        r.typed_report().group.and_then(|g| g.budget_bytes),
        Some(200 * 1024)
    );
    assert!(g.gone());
}

/// Issue 46 item 5: a process that opened the ledger before its last member left (mapped, not
/// joined) does not join the removed file: it sees the mark, opens the group's name again and
/// makes the ledger anew with its own budget; the group's next members find it there.
#[test]
fn a_process_that_opened_a_removed_ledger_joins_the_one_at_the_name() {
    let g = Group::new("reopen");
    let env = |b: &'static str| {
        vec![
            ("PINGUARD_GROUP", g.0.clone()),
            ("PINGUARD_GROUP_BUDGET", b.to_string()),
        ]
    };
    let a_env = env("12Ki");
    let a_env: Vec<(&str, &str)> = a_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = Held::start(&fresh_dir("reopen-a"), &["cuda_alloc:4096"], &a_env);
    let b_env = env("100Ki");
    let b_env: Vec<(&str, &str)> = b_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // B starts pinguard (the C API) and so maps A's ledger, but pins nothing yet.
    let mut b = Held::start(
        &fresh_dir("reopen-b"),
        &["vmlck:0", "wait_stdin:0", "cuda_alloc:65536"],
        &b_env,
    );
    assert_eq!(g.budget(), 12 * 1024);
    a.finish();
    assert!(g.gone(), "A, the last member, removed the ledger");
    b.step(); // 64 KiB: over the removed ledger's 12 KiB, within B's own 100 KiB
    assert_eq!(g.budget(), 100 * 1024, "B made the ledger anew");
    assert_eq!(g.used(), 65536, "and B's bytes are booked in it");
    b.finish();
    assert!(g.gone());
}

#[test]
fn a_bad_ledger_is_refused_and_the_process_runs_on_its_own_budget() {
    let g = Group::new("bad");
    let good_size = layout::SIZE;
    let mut versioned = vec![0u8; good_size];
    versioned[..8].copy_from_slice(&layout::MAGIC);
    versioned[8..12].copy_from_slice(&7u32.to_ne_bytes());
    let garbage: Vec<u8> = (0..good_size).map(|i| (i * 7919 % 251) as u8).collect();
    for (what, bytes, why) in [
        ("short", vec![1u8; 100], "is 100 bytes"),
        ("version", versioned, "version 7"),
        ("garbage", garbage, "bad magic"),
    ] {
        std::fs::write(g.path(), &bytes).unwrap();
        let r = run(
            "scenario",
            &["cuda_alloc:65536"],
            &[
                ("PINGUARD_GROUP", &g.0),
                ("PINGUARD_GROUP_BUDGET", "16K"),
                ("PINGUARD_BUDGET", "1M"),
            ],
        );
        assert_eq!(
            r.rc("cuda_alloc:65536"),
            0,
            "{what}: the group budget is not in force"
        );
        let lines: Vec<_> = pinguard_lines(&r.stderr)
            .into_iter()
            .filter(|l| l.contains("PINGUARD_GROUP="))
            .collect();
        assert_eq!(lines.len(), 1, "{what}: {}", r.stderr);
        assert!(
            lines[0].contains(why) && lines[0].contains("process budget only"),
            "{what}: {}",
            lines[0]
        );
        let rep = r.typed_report();
        assert!(rep.group.is_none());
        assert_eq!(rep.config.budget_bytes, Some(1 << 20));
        assert_eq!(
            std::fs::read(g.path()).unwrap(),
            bytes,
            "{what}: the file is left alone"
        );
    }
}

#[test]
fn metrics_file_parses_with_a_real_prometheus_parser() {
    let python = ["/usr/bin/python3", "python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import prometheus_client"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(python) = python else {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "prometheus_client is required here"
        );
        eprintln!("SKIPPED: no Python with prometheus_client (.ci/run installs python3-prometheus-client)");
        return;
    };
    let g = Group::new("metrics");
    let dir = fresh_dir("metrics");
    let metrics = dir.join("m.prom");
    // The file lives as long as its process: read while it waits, once it shows every call.
    let held = Held::start(
        &fresh_dir("metrics-report"),
        &[
            "cuda_alloc:8192",
            "acl_malloc:4096",
            "cuda_alloc:65536",
            "mlock:0:1",
        ],
        &[
            ("PINGUARD_GROUP", &g.0),
            ("PINGUARD_GROUP_BUDGET", "1M"),
            ("PINGUARD_BUDGET", "32K"),
            ("PINGUARD_METRICS", metrics.to_str().unwrap()),
            ("PINGUARD_INTERVAL", "100ms"),
        ],
    );
    let file = dir.join(format!("m.{}.prom", held.pid()));
    until("the metrics after every call", || {
        std::fs::read_to_string(&file).is_ok_and(|t| t.contains("api=\"mlock\"} 4096"))
    });
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "prom"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let script = r#"
import sys, json
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in fam.samples:
        out.setdefault(fam.name + ":" + fam.type, []).append([s.name, s.labels, s.value])
print(json.dumps(out))
"#;
    let out = Command::new(python)
        .args(["-c", script])
        .arg(&files[0])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the parser rejected the file: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&files[0]).unwrap()
    );
    let fams: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let value = |fam: &str, api: Option<&str>| -> f64 {
        fams[fam]
            .as_array()
            .unwrap_or_else(|| panic!("no {fam}: {fams}"))
            .iter()
            .find(|s| api.is_none_or(|a| s[1]["api"] == a))
            .map(|s| {
                assert!(s[1]["pid"].is_string() && s[1]["exe"] == "scenario");
                s[2].as_f64().unwrap()
            })
            .unwrap_or_else(|| panic!("no {fam} for {api:?}"))
    };
    assert_eq!(
        value("pinguard_pinned_bytes:gauge", Some("cudaHostAlloc")),
        8192.0
    );
    assert_eq!(value("pinguard_pinned_bytes:gauge", Some("mlock")), 4096.0);
    assert_eq!(value("pinguard_denied:counter", Some("cudaHostAlloc")), 1.0);
    assert_eq!(
        value("pinguard_downgraded:counter", Some("aclrtMallocHost")),
        0.0
    );
    assert_eq!(value("pinguard_budget_bytes:gauge", None), 32768.0);
    assert_eq!(value("pinguard_process_pinned_bytes:gauge", None), 16384.0);
    assert_eq!(value("pinguard_group_budget_bytes:gauge", None), 1048576.0);
    assert_eq!(value("pinguard_group_members:gauge", None), 1.0);
    assert_eq!(value("pinguard_group_pinned_bytes:gauge", None), 16384.0);
    held.finish();
    assert!(!file.exists(), "gone with its process");
}

/// Issue 46 item 5: `pinguard group rm` removes a group whose members are all gone as its last
/// member would: marked closed under the ledger's lock first, so a process that had mapped it
/// (started, not yet pinned) makes the group anew with its own budget instead of pinning into
/// the removed file.
#[test]
fn group_rm_closes_the_ledger_for_a_process_that_mapped_it() {
    let g = Group::new("rm-closed");
    let (mut holder, _out) = spawn_churn_holder(&g.0); // 100K budget, 64 KiB held
    let mut b = Held::start(
        &fresh_dir("rm-closed-b"),
        &["vmlck:0", "wait_stdin:0", "cuda_alloc:65536"],
        &[
            ("PINGUARD_GROUP", g.0.as_str()),
            ("PINGUARD_GROUP_BUDGET", "200Ki"),
        ],
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    let o = pinguard_cli(&["group".as_ref(), "rm".as_ref(), g.0.as_ref()]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(g.gone());
    b.step();
    assert_eq!(g.budget(), 200 * 1024, "B made the group anew");
    assert_eq!(g.used(), 65536, "with its bytes booked there");
    b.finish();
    assert!(g.gone());
}
