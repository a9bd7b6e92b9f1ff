//! The mlock family against the kernel: pinguard's live bytes follow `VmLck` in the same process
//! through overlapping locks, partial unlocks, unmaps and `mlockall`.

use crate::common;
use common::*;
use pinguard_common::{Event, EventKind};

fn checkpoints(r: &Run) -> Vec<(i64, i64)> {
    r.stdout
        .lines()
        .filter(|l| l.starts_with("vmlck="))
        .map(|l| (field(l, "vmlck"), field(l, "live")))
        .collect()
}

#[test]
fn union_semantics_follow_vmlck() {
    let r = run(
        "scenario",
        &[
            "mlock:0:8",
            "vmlck", // 8 pages
            "mlock:4:8",
            "vmlck", // overlaps 4: adds 4
            "mlock:2:2",
            "vmlck", // inside: adds nothing
            "mlock2:20:3",
            "vmlck", // disjoint: adds 3
            "munlock:3:2",
            "vmlck", // splits the first range
            "munmap:10:12",
            "vmlck", // unmaps the tail of one range and part of another
            "mmap_locked:12288",
            "vmlck", // 3 more pages
            "munmap_slot:0",
            "vmlck", // and gone
            "munlock:0:256",
            "vmlck", // fails at the hole left by munmap, after unlocking 0..10
            "munlock:22:1",
            "vmlck", // the last page
        ],
        &[],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let cps = checkpoints(&r);
    let page = 4096;
    let expected = [8, 12, 12, 15, 13, 9, 12, 9, 1, 0];
    assert_eq!(cps.len(), expected.len());
    for (i, ((vmlck, live), want)) in cps.iter().zip(expected).enumerate() {
        assert_eq!(*vmlck, want * page, "VmLck at checkpoint {i}: {cps:?}");
        assert_eq!(
            *live, *vmlck,
            "pinguard vs VmLck at checkpoint {i}: {cps:?}"
        );
    }
    assert_eq!(
        r.rc("munlock:0:256"),
        -1,
        "the kernel refuses a range with a hole"
    );
    let rep = r.typed_report();
    assert_eq!(rep.totals.live_bytes, 0);
    assert_eq!(rep.totals.peak_live_bytes, 15 * page as u64);
    assert_eq!(rep.totals.live_count, 0);
    assert_eq!(rep.kernel.vm_lck_bytes, Some(0));
}

#[test]
fn mlockall_is_one_entry_measured_from_vmlck() {
    // MCL_CURRENT | MCL_ONFAULT: locks the mappings without faulting them all in.
    let r = run(
        "scenario",
        &["mlockall:5", "vmlck", "munlockall", "vmlck"],
        &[],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    if r.rc("mlockall:5") != 0 {
        // Over RLIMIT_MEMLOCK on this machine: the failure is what must be counted.
        let rep = r.typed_report();
        assert_eq!(api_stats(&rep, "mlockall").failed_count, 1);
        return;
    }
    let cps = checkpoints(&r);
    assert!(cps[0].0 > 0);
    assert_eq!(cps[0].1, cps[0].0, "the mlockall entry is VmLck's change");
    assert_eq!(cps[1], (0, 0));
    let rep = r.typed_report();
    assert_eq!(api_stats(&rep, "mlockall").alloc_count, 1);
}

/// `lock_fail` (`tests/fixtures.txt`, set `locking`).
fn lock_fail() -> String {
    fixture_set("locking")
        .join("lock_fail")
        .to_string_lossy()
        .into_owned()
}

/// issue 31, item 4: an `mlock` or `mlockall` the kernel refuses up front (over `RLIMIT_MEMLOCK`,
/// or starting in a hole) and a `munlock` that unlocks nothing change no page, so pinguard reads nothing of the
/// kernel's mappings for them: in a process with 2,000 mappings, 10 or 100 rounds of such calls
/// read `/proc/self/smaps` the same number of times (it used to read it once per call). The
/// calls answer as without pinguard, and the calls that do lock or unlock pages before failing
/// are still followed exactly (live bytes equal `VmLck` after each).
#[test]
fn failed_locking_calls_that_change_nothing_read_no_mappings() {
    let prog = lock_fail();
    let mut walks = Vec::new();
    for (n, budget) in [("10", ""), ("100", ""), ("10", "1G"), ("100", "1G")] {
        let bare = program(std::path::Path::new(&prog), None)
            .args(["2000", n])
            .output()
            .unwrap();
        assert!(
            bare.status.success(),
            "{}",
            String::from_utf8_lossy(&bare.stderr)
        );
        // Under a budget, `mlockall` needs an estimate of what it would lock (a walk), unless the
        // kernel refuses it up front.
        let env: &[(&str, &str)] = if budget.is_empty() {
            &[]
        } else {
            &[("PINGUARD_BUDGET", budget)]
        };
        let r = run(&prog, &["2000", n], env);
        assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
        let without_live = |s: &str| {
            s.lines()
                .map(|l| l.split(" live=").next().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        let want = without_live(&String::from_utf8_lossy(&bare.stdout));
        assert_eq!(
            without_live(&r.stdout),
            want,
            "the calls answer as without pinguard"
        );
        assert!(
            want.iter()
                .any(|l| l == &format!("over calls={n} rc=-1 errno=12")),
            "{want:?}"
        );
        assert!(
            want.iter().any(|l| l == "partial calls=1 rc=-1 errno=12"),
            "{want:?}"
        );
        let cps = checkpoints(&r);
        assert_eq!(
            cps.iter().map(|c| c.0 / 4096).collect::<Vec<_>>(),
            [1, 1, 3, 1],
            "VmLck in pages: {}",
            r.stdout
        );
        assert!(
            cps.iter().all(|(vmlck, live)| vmlck == live),
            "pinguard's live bytes follow VmLck: {}",
            r.stdout
        );
        walks.push(r.typed_report().kernel.smaps_walk_count);
    }
    assert_eq!((walks[0], walks[2]), (walks[1], walks[3]), "reads of /proc/self/smaps with 10 and with 100 rounds of failing calls, without a budget and with one");
    assert!(
        walks[0] <= 3 && walks[2] <= 3,
        "the two calls that changed pages walk, the others none: {walks:?}"
    );
}

/// issue 46, item 13: an `mlock` over `RLIMIT_MEMLOCK` (`CAP_IPC_LOCK` dropped: lock_fail drops
/// it, so that the limit binds root too) says why in its event and the exit line: `ENOMEM`, the
/// 64 KiB limit, no `CAP_IPC_LOCK`, the page locked, and the cgroup's headroom where a memory
/// limit holds the process (a real cgroup v1 group here, where the machine has the hierarchy).
#[test]
fn an_mlock_over_rlimit_memlock_says_why_in_its_event_and_the_exit_line() {
    let prog = lock_fail();
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory");
    let group = v1.join(format!("pinguard-why-{}", std::process::id()));
    let limited = std::fs::create_dir(&group).is_ok()
        && std::fs::write(
            group.join("memory.limit_in_bytes"),
            (256u64 << 20).to_string(),
        )
        .is_ok();
    if !limited {
        eprintln!("NOT RUN (the cgroup part): no cgroup v1 memory group could be made here");
    }
    let script = if limited {
        format!(
            "echo $$ > {}/cgroup.procs && exec {prog} 20 1",
            group.display()
        )
    } else {
        format!("exec {prog} 20 1")
    };
    let r = run("/bin/sh", &["-c", &script], &[]);
    let _ = std::fs::remove_dir(&group);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let rep = r.typed_report();
    let e = rep
        .events
        .iter()
        .find(|e| e.kind == EventKind::Failed && e.api == "mlock" && e.size == 1 << 20)
        .unwrap_or_else(|| panic!("{:?}", rep.events));
    let why = e.why.as_ref().unwrap_or_else(|| panic!("no why: {e:?}"));
    assert_eq!(why.error, "ENOMEM", "{e:?}");
    assert_eq!(why.rlimit_memlock_bytes, Some(64 << 10), "{e:?}");
    assert!(!why.cap_ipc_lock, "{e:?}");
    assert_eq!(why.vm_lck_bytes, Some(4096), "the one page locked: {e:?}");
    assert!(why.vm_pin_bytes.is_some(), "{e:?}");
    if limited {
        let h = why.cgroup_headroom_bytes.unwrap_or_else(|| panic!("{e:?}"));
        assert!(h > 200 << 20 && h <= 256 << 20, "{e:?}");
    }
    let exit = pinguard_lines(&r.stderr)
        .into_iter()
        .find(|l| l.contains(" at exit "))
        .unwrap_or_else(|| panic!("{}", r.stderr));
    assert!(
        exit.contains(": ENOMEM; budget none, RLIMIT_MEMLOCK 64.0 KiB (no CAP_IPC_LOCK), VmLck "),
        "{exit}"
    );
}

/// Issue 46 item 6: the `mlock` family counts whole pages, so a budget can refuse a call whose
/// asked bytes fit. The refusal says both: 2 MiB and 1 MiB, each starting inside a page, are 513
/// and 257 pages (2,101,248 + 1,052,672 bytes), over a budget of 3 MiB that 3 MiB asked would fit.
#[test]
fn a_refusal_gives_the_bytes_asked_beside_the_pages_counted() {
    let prog = fixture_set("locking").join("lock_bytes");
    let r = run(
        prog.to_str().unwrap(),
        &["100:2097152", "4194404:1048576"],
        &[("PINGUARD_BUDGET", "3Mi"), ("PINGUARD_POLICY", "error")],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("100:2097152 rc=0 "), "{}", r.stdout);
    assert!(
        r.stdout.contains("4194404:1048576 rc=-1 errno=12"),
        "refused by the budget: {}",
        r.stdout
    );
    assert!(
        r.stderr.contains(
            "last refused: mlock of 1.00 MiB (1048576 bytes asked, 1052672 counted in whole pages): "
        ),
        "{}",
        r.stderr
    );
    let rep = r.typed_report();
    let e = rep
        .events
        .iter()
        .find(|e| e.kind == EventKind::Denied && e.api == "mlock")
        .unwrap_or_else(|| panic!("{:?}", rep.events));
    assert_eq!(e.size, 1_052_672, "{e:?}");
    assert_eq!(
        e.why.as_ref().and_then(|w| w.asked_bytes),
        Some(1_048_576),
        "{e:?}"
    );
    assert_eq!(rep.totals.live_bytes, 2_101_248, "{rep:?}");
}

/// `lock_fail 20 1` (one round of each failing call, `CAP_IPC_LOCK` dropped, `RLIMIT_MEMLOCK` 64
/// KiB, one page locked), under `env`: the report's event of the failed `api` call of `size`
/// bytes (0: any size); its `why` has the keys `budget_bytes` and `cgroup_headroom_bytes`, null
/// or not.
fn failed_event(env: &[(&str, &str)], api: &str, size: u64) -> Event {
    let r = run(&lock_fail(), &["20", "1"], env);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let rep = r.typed_report();
    let at = rep
        .events
        .iter()
        .position(|e| e.kind == EventKind::Failed && e.api == api && (size == 0 || e.size == size))
        .unwrap_or_else(|| panic!("no failed {api} event: {:?}", rep.events));
    // JSON: a key written as null, which a typed read cannot tell from an absent one.
    let raw = read_json(&reports_in(&r.report_dir)[0]);
    let why = &raw["events"][at]["why"];
    for key in ["budget_bytes", "cgroup_headroom_bytes"] {
        assert!(why.get(key).is_some(), "{key}: {why}");
    }
    rep.events[at].clone()
}

/// The room every failure's `why` gives in `lock_fail`: the 64 KiB limit that binds (no
/// `CAP_IPC_LOCK`), the one page locked, `VmPin` read.
fn assert_lock_fail_room(e: &Event, error: &str) {
    let why = e.why.as_ref().unwrap_or_else(|| panic!("no why: {e:?}"));
    assert_eq!(why.error, error, "{e:?}");
    assert_eq!(why.rlimit_memlock_bytes, Some(64 << 10), "{e:?}");
    assert!(!why.cap_ipc_lock, "{e:?}");
    assert_eq!(why.vm_lck_bytes, Some(4096), "the one page locked: {e:?}");
    assert!(why.vm_pin_bytes.is_some(), "{e:?}");
}

/// Issue 46 item 13: an `mmap(MAP_LOCKED)` the kernel fails (over `RLIMIT_MEMLOCK`: EAGAIN) has
/// an event that says why, its size the pages asked.
#[test]
fn a_failed_mmap_map_locked_says_why() {
    let e = failed_event(&[], "mmap", 1 << 20);
    assert_lock_fail_room(&e, "EAGAIN");
}

/// Issue 46 item 13: an `mlockall(MCL_CURRENT)` the kernel fails (the address space over
/// `RLIMIT_MEMLOCK`: ENOMEM) has an event that says why, its size the address space the kernel
/// weighed against the limit; so does one pinguard answers for the kernel under a budget (it
/// knows the kernel would fail it, and does not call it).
#[test]
fn a_failed_mlockall_says_why() {
    for env in [&[][..], &[("PINGUARD_BUDGET", "1G")][..]] {
        let e = failed_event(env, "mlockall", 0);
        assert_lock_fail_room(&e, "ENOMEM");
        assert!(
            e.size > 64 << 10,
            "the address space, over the limit: {env:?} {e:?}"
        );
    }
}

/// Issue 46 item 13: an `mlock` that fails at a hole having locked nothing new (the pages before
/// the hole are locked already: ENOMEM) has an event that says why, its size the range's pages.
#[test]
fn an_mlock_failing_at_a_hole_says_why() {
    let e = failed_event(&[], "mlock", 2 * 4096);
    assert_lock_fail_room(&e, "ENOMEM");
}

/// Issue 44 item 7: an `mlock` over a hole called again and again (the kernel locks the pages up
/// to the hole, held already, and fails with ENOMEM every time) is one event that counts its
/// repeats, not one event per call pushing every other out of the list; the counters count every
/// call, the view stays the kernel's, and `pinguard report` says how many calls failed so.
#[test]
fn an_mlock_failing_at_a_hole_again_and_again_is_one_event_that_counts_them() {
    let ops = [
        "mlock:0:8",
        "munmap:8:1",
        "times:1000",
        "mlock:0:16",
        "vmlck",
    ];
    let r = run("scenario", &ops, &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("mlock:0:16 rc=-1 errno=12"),
        "the kernel's ENOMEM: {}",
        r.stdout
    );
    let cps = checkpoints(&r);
    assert_eq!(cps, [(8 * 4096, 8 * 4096)], "pinguard vs VmLck");
    let rep = r.typed_report();
    assert_eq!(api_stats(&rep, "mlock").failed_count, 1000);
    let failed: Vec<&Event> = rep
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Failed)
        .collect();
    let calls: u64 = failed.iter().map(|e| e.calls()).sum();
    assert_eq!(calls, 1000, "the events stand for every call: {failed:?}");
    // 1,000 calls take a millisecond or so: one event, a few where this machine stalls.
    assert!(failed.len() <= 10, "{} events: {failed:?}", failed.len());
    let e = failed[0];
    assert!(
        e.repeats > 0 && e.repeat_unix_ms >= Some(e.unix_ms),
        "{e:?}"
    );
    assert_why_of(e, "ENOMEM");
    let out = pinguard_cli(&["report".as_ref(), r.report_dir.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("and why (1000 of 1000, the latest last):")
            && text.lines().any(
                |l| l.starts_with("  failed mlock of 64.0 KiB") && l.ends_with(" (1000 times)")
            ),
        "{text}"
    );
}

/// Issue 44 item 7: once an `mlock` was seen to fail at a hole, its calls again are answered
/// without asking the kernel first; a mapping that fills the hole where no hook sees it (glibc's
/// own `mmap`, here a raw system call) is still found by the next call: under no budget, or one
/// with room, the pages it locked are counted; under a budget without room, it is refused and
/// locks nothing.
#[test]
fn a_hole_filled_behind_pinguards_back_is_found_by_the_next_mlock() {
    let ops = [
        "mlock:0:8",
        "munmap:8:1",
        "times:50",
        "mlock:0:16",
        "map_raw:8:1",
        "mlock:0:16",
        "vmlck",
    ];
    for (budget, locks) in [("", true), ("64K", true), ("40K", false)] {
        let env: &[(&str, &str)] = if budget.is_empty() {
            &[]
        } else {
            &[("PINGUARD_BUDGET", budget), ("PINGUARD_POLICY", "error")]
        };
        let r = run("scenario", &ops, env);
        assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
        assert_eq!(r.rcs_of(&["map_raw:8:1"]), [0], "{}", r.stdout);
        let rcs: Vec<&str> = r
            .stdout
            .lines()
            .filter(|l| l.starts_with("mlock:0:16 "))
            .collect();
        let second = if locks { "rc=0" } else { "rc=-1 errno=12" };
        assert!(
            rcs.len() == 2 && rcs[0].contains("rc=-1 errno=12") && rcs[1].contains(second),
            "budget {budget:?}: {rcs:?}"
        );
        let pages = if locks { 16 } else { 8 };
        let cps = checkpoints(&r);
        assert_eq!(
            cps,
            [(pages * 4096, pages * 4096)],
            "budget {budget:?}: VmLck, pinguard"
        );
        let rep = r.typed_report();
        assert_eq!(
            api_stats(&rep, "mlock").failed_count,
            50,
            "budget {budget:?}"
        );
        if !locks {
            assert_eq!(rep.totals.denied_count, 1, "budget {budget:?}");
        }
    }
}
