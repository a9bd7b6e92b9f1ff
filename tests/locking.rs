//! The mlock family against the kernel: pinguard's live bytes follow `VmLck` in the same process
//! through overlapping locks, partial unlocks, unmaps and `mlockall`.

mod common;
use common::*;

fn checkpoints(r: &Run) -> Vec<(i64, i64)> {
    r.stdout.lines().filter(|l| l.starts_with("vmlck=")).map(|l| (field(l, "vmlck"), field(l, "live"))).collect()
}

#[test]
fn union_semantics_follow_vmlck() {
    let r = run(
        "scenario",
        &[
            "mlock:0:8", "vmlck",          // 8 pages
            "mlock:4:8", "vmlck",          // overlaps 4: adds 4
            "mlock:2:2", "vmlck",          // inside: adds nothing
            "mlock2:20:3", "vmlck",        // disjoint: adds 3
            "munlock:3:2", "vmlck",        // splits the first range
            "munmap:10:12", "vmlck",       // unmaps the tail of one range and part of another
            "mmap_locked:12288", "vmlck",  // 3 more pages
            "munmap_slot:0", "vmlck",      // and gone
            "munlock:0:256", "vmlck",      // fails at the hole left by munmap, after unlocking 0..10
            "munlock:22:1", "vmlck",       // the last page
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
        assert_eq!(*live, *vmlck, "pinguard vs VmLck at checkpoint {i}: {cps:?}");
    }
    assert_eq!(r.rc("munlock:0:256"), -1, "the kernel refuses a range with a hole");
    let rep = r.report();
    assert_eq!(rep["totals"]["live_bytes"], 0);
    assert_eq!(rep["totals"]["peak_live_bytes"], 15 * page);
    assert_eq!(rep["totals"]["live_count"], 0);
    assert_eq!(rep["kernel"]["vm_lck_bytes"], 0);
}

#[test]
fn mlockall_is_one_entry_measured_from_vmlck() {
    // MCL_CURRENT | MCL_ONFAULT: locks the mappings without faulting them all in.
    let r = run("scenario", &["mlockall:5", "vmlck", "munlockall", "vmlck"], &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    if r.rc("mlockall:5") != 0 {
        // Over RLIMIT_MEMLOCK on this machine: the failure is what must be counted.
        let rep = r.report();
        assert_eq!(rep["apis"]["mlockall"]["failed_count"], 1);
        return;
    }
    let cps = checkpoints(&r);
    assert!(cps[0].0 > 0);
    assert_eq!(cps[0].1, cps[0].0, "the mlockall entry is VmLck's change");
    assert_eq!(cps[1], (0, 0));
    let rep = r.report();
    assert_eq!(rep["apis"]["mlockall"]["alloc_count"], 1);
}
