//! The library loads anywhere, stays silent in processes that pin nothing, and exports only the
//! hooks and its C API.

mod common;
use common::*;
use std::process::Command;

#[test]
fn processes_that_pin_nothing_are_untouched() {
    let f = fixtures();
    for cmd in [&["true"][..], &["ls", "/"], &["python3", "-c", "pass"], &["sh", "-c", "true | cat"]] {
        let dir = fresh_dir("quiet");
        let out = Command::new(cmd[0])
            .args(&cmd[1..])
            .current_dir(&dir)
            .env("LD_PRELOAD", &f.lib)
            .env_remove("PINGUARD_REPORT")
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{cmd:?} printed on stderr");
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(files.is_empty(), "{cmd:?} left files: {files:?}");
    }
}

#[test]
fn only_hooks_and_the_c_api_are_exported() {
    let f = fixtures();
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(&f.lib).output().expect("nm (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().nth(2)).map(|n| n.split('@').next().unwrap()).collect();
    let allowed = [
        "cudaHostAlloc", "cudaMallocHost", "cudaHostRegister", "cudaFreeHost", "cudaHostUnregister",
        "aclrtMallocHost", "aclrtMallocHostWithCfg", "aclrtHostRegister", "aclrtHostRegisterV2",
        "aclrtFreeHost", "aclrtHostUnregister", "mlock", "mlock2", "munlock", "mlockall", "munlockall",
        "mmap", "mmap64", "munmap", "pinguard_write_report", "pinguard_report_path", "pinguard_live_bytes", "pinguard_peak_bytes", "pinguard_version",
        "cuMemHostAlloc", "cuMemAllocHost_v2", "cuMemAllocHost", "cuMemHostRegister_v2", "cuMemHostRegister",
        "cuMemFreeHost", "cuMemHostUnregister", "cuGetProcAddress", "cuGetProcAddress_v2",
        "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemRetainAllocationHandle",
        "aclrtMallocPhysical", "aclrtFreePhysical", "aclrtMapMem", "aclrtUnmapMem", "aclrtMemRetainAllocationHandle",
        "cuMemPoolCreate", "cuMemPoolDestroy", "cuMemPoolTrimTo", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
        "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cudaMemPoolCreate", "cudaMemPoolDestroy", "cudaMemPoolTrimTo",
        "cudaMallocFromPoolAsync", "cudaMallocFromPoolAsync_ptsz", "cudaFreeAsync", "cudaFreeAsync_ptsz",
        "cuMemGetDefaultMemPool", "cuMemGetMemPool", "cudaMemGetDefaultMemPool", "cudaMemGetMemPool", "dlsym", "dlvsym", "dlclose", "_exit", "_Exit", "mremap",
        "hipHostMalloc", "hipHostAlloc", "hipExtHostAlloc", "hipMallocHost", "hipMemAllocHost", "hipHostFree", "hipFreeHost",
        "hipHostRegister", "hipHostUnregister", "hipMemPoolCreate", "hipMemPoolDestroy", "hipMemPoolTrimTo",
        "hipMallocFromPoolAsync", "hipFreeAsync", "hipGetProcAddress",
        // Signal dispositions (hooks/signal.rs): the report signal's is followed.
        "sigaction", "__sigaction", "signal", "bsd_signal", "ssignal", "sysv_signal", "__sysv_signal", "sigset",
        "sigignore", "siginterrupt",
    ];
    for n in &names {
        assert!(allowed.contains(n), "unexpected export {n}");
    }
    for a in allowed {
        assert!(names.contains(&a), "{a} is not exported");
    }
    // The C header declares exactly the C API.
    let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/pinguard.h")).unwrap();
    for api in ["pinguard_write_report", "pinguard_report_path", "pinguard_live_bytes", "pinguard_peak_bytes", "pinguard_version"] {
        assert!(header.contains(&format!("{api}(")), "{api} missing from pinguard.h");
    }
}

#[test]
fn the_c_api_works_from_c() {
    let f = fixtures();
    let dir = fresh_dir("capi");
    let explicit = dir.join("asked.json");
    let r = run(f.dir.join("capi").to_str().unwrap(), &[explicit.to_str().unwrap()], &[]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains(&format!("version={}", env!("CARGO_PKG_VERSION"))), "{}", r.stdout);
    assert!(r.stdout.contains("live=8192"), "{}", r.stdout);
    assert!(r.stdout.contains("write=0 errno=77"), "errno must survive: {}", r.stdout);
    assert!(r.stdout.contains("write_bad=-1"), "{}", r.stdout);
    assert!(r.stdout.contains("live_after=0"), "{}", r.stdout);
    // The path it gives is the one the exit report went to; a short buffer gets the length.
    let said = r.stdout.lines().find_map(|l| l.strip_prefix("path=")).unwrap();
    assert_eq!(std::path::Path::new(said), reports_in(&r.report_dir)[0].as_path());
    assert!(r.stdout.contains(&format!("path_len={} short=\"{}\"", said.len(), &said[..3])), "{}", r.stdout);
    let asked = read_json(&explicit);
    assert_eq!(asked["reason"], "request");
    assert_eq!(asked["totals"]["live_bytes"], 8192);
    let at_exit = r.report();
    assert_eq!(at_exit["reason"], "exit");
    assert_eq!(at_exit["totals"]["live_bytes"], 0);
    // Without pinguard the weak symbols are NULL and the program says so.
    let out = Command::new(f.dir.join("capi")).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "no pinguard\n");
}

#[test]
fn bad_settings_are_not_printed_by_processes_that_pin_nothing() {
    // A shell pipeline of real programs, each of which loads pinguard and pins nothing.
    let f = fixtures();
    let dir = fresh_dir("quiet-bad");
    let mut cmd = Command::new("sh");
    clear_pinguard_env(&mut cmd);
    let out = cmd
        .args(["-c", "ls / | sed s/a/b/ >/dev/null; true"])
        .current_dir(&dir)
        .env("LD_PRELOAD", &f.lib)
        .env("PINGUARD_BUDGET", "-1")
        .env("PINGUARD_BUGDET", "1G")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("pinguard"), "a process that pins nothing printed:\n{stderr}");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(files.is_empty(), "left files: {files:?}");
}
