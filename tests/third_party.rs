//! Real third-party programs under pinguard: gpg (libgcrypt's secure memory), stress-ng's mlock
//! and mmap stressors, and a multi-threaded Python program pinning through ctypes.

use crate::common;
use common::*;
use pinguard_common::Reason;

fn gpg(env: &[(&str, &str)]) -> Run {
    let home = fresh_dir("gnupghome");
    std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut e = env.to_vec();
    let h = home.to_str().unwrap().to_string();
    e.push(("GNUPGHOME", &h));
    let r = run(
        "/usr/bin/env",
        &["gpg", "--batch", "--gen-random", "0", "16"],
        &e,
    );
    assert!(r.success(), "gpg failed under pinguard: {}", r.stderr);
    assert_eq!(r.out.stdout.len(), 16, "gpg produced its 16 random bytes");
    r
}

#[test]
fn gpg_secure_memory_is_seen_capped_and_downgraded() {
    if !have("gpg", "gnupg") {
        return;
    }
    let r = gpg(&[]);
    let rep = r.typed_report();
    let api = api_stats(&rep, "mlock");
    assert_eq!(
        api.alloc_count, 1,
        "libgcrypt locks its pool once: {:?}",
        rep.apis
    );
    assert!(api.alloc_bytes >= 32768, "{api:?}");
    let cs = rep.callsites.first().unwrap_or_else(|| panic!("{rep:?}"));
    let frames = &cs.frames;
    assert!(
        frames
            .iter()
            .any(|f| f.module.as_deref().unwrap_or("").contains("libgcrypt")),
        "the stack runs through libgcrypt: {frames:?}"
    );
    assert!(!r.stderr.contains("insecure memory"));
    // A budget below the pool: refused, and gpg says so itself but still works.
    let r = gpg(&[("PINGUARD_BUDGET", "16K")]);
    assert!(
        r.stderr.contains("Warning: using insecure memory!"),
        "{}",
        r.stderr
    );
    assert_eq!(r.typed_report().totals.denied_count, 1);
    // Downgraded: mlock "succeeds", gpg is content.
    let r = gpg(&[("PINGUARD_BUDGET", "16K"), ("PINGUARD_POLICY", "downgrade")]);
    assert!(!r.stderr.contains("insecure memory"), "{}", r.stderr);
    assert_eq!(r.typed_report().totals.downgraded_count, 1);
}

#[test]
fn stress_ng_mlock_and_mmap_stressors_end_with_pinguard_matching_vmlck() {
    if !have("stress-ng", "stress-ng") {
        return;
    }
    let r = run(
        "/usr/bin/env",
        &[
            "stress-ng",
            "--mlock",
            "1",
            "--mmap",
            "1",
            "--mmap-bytes",
            "1M",
            "--timeout",
            "4s",
        ],
        &[("PINGUARD_BUDGET", "4M"), ("PINGUARD_DEPTH", "8")],
    );
    assert!(r.success(), "{}", r.stderr);
    assert!(!r.stderr.contains("panicked"));
    let files = reports_in(&r.report_dir);
    // stress-ng's workers pin nothing themselves: each forks a child that does the work, and
    // sends it SIGKILL when it has not ended soon enough after the timeout (a loaded machine):
    // such a child leaves its state file instead of its report.
    let states: Vec<_> = std::fs::read_dir(&r.report_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "state"))
        .collect();
    assert!(files.len() + states.len() >= 3, "stress-ng and its two workers' children each leave a report or a state: {files:?} {states:?}");
    for s in &states {
        let json = files.iter().any(|f| f.with_extension("state") == *s);
        assert!(
            !json,
            "a process left both its exit report and its state: {}",
            s.display()
        );
    }
    let mut exercised = 0;
    for f in &files {
        let rep = read_report(f);
        assert_eq!(rep.reason, Reason::Exit);
        assert_eq!(
            Some(rep.totals.live_bytes),
            rep.kernel.vm_lck_bytes,
            "{}: pinguard vs VmLck at exit",
            f.display()
        );
        assert!(rep.totals.peak_live_bytes <= 4 << 20, "{:?}", rep.totals);
        exercised += rep.totals.alloc_count;
    }
    assert!(
        exercised > 100,
        "the stressors locked pages ({exercised} calls)"
    );
}

#[test]
fn python_threads_pinning_through_ctypes_are_counted_exactly() {
    let f = fixtures();
    let script = format!(
        r#"
import ctypes, threading
fw = ctypes.CDLL({fw:?})
fw.framework_pin.restype = ctypes.c_void_p
fw.framework_unpin.argtypes = [ctypes.c_void_p]
fw.framework_pin_npu.restype = ctypes.c_void_p
fw.framework_unpin_npu.argtypes = [ctypes.c_void_p]
rt = ctypes.CDLL({rt:?})
counts = [0] * 8
def work(i):
    keep = []
    for n in range(300):
        p = fw.framework_pin(4096 * (1 + n % 4)) if i % 2 else fw.framework_pin_npu(4096)
        if p:
            counts[i] += 1
            if n % 100 == 0:
                keep.append(p)
            elif i % 2:
                fw.framework_unpin(p)
            else:
                fw.framework_unpin_npu(p)
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
me = ctypes.CDLL(None)
me.pinguard_live_bytes.restype = ctypes.c_uint64
print("pinned", sum(counts), me.pinguard_live_bytes())
"#,
        fw = f.dir.join("libframework.so").to_str().unwrap(),
        rt = f.dir.join("libcudart.so").to_str().unwrap()
    );
    let r = run("/usr/bin/env", &["python3", "-c", &script], &[]);
    assert!(r.success(), "{}", r.stderr);
    // Each thread keeps 3 of its 300: 4 CUDA threads keep 4 KiB each time (n % 4 == 0 at n = 0,
    // 100, 200), 4 NPU threads 4 KiB.
    assert!(r.stdout.contains("pinned 2400 98304"), "{}", r.stdout);
    let rep = r.typed_report();
    assert_eq!(rep.totals.alloc_count, 2400);
    assert_eq!(rep.totals.release_count, 2400 - 24);
    assert_eq!(rep.totals.live_bytes, 98304);
    assert_eq!(rep.totals.live_count, 24);
}
