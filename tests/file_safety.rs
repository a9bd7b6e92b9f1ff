//! Report files in hostile places: a setuid process ignores `PINGUARD_REPORT`, and processes
//! writing the same path never leave a torn file. (A planted symlink: tests/report.rs.)

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

/// A copy of the library in a system directory, setuid, as glibc requires for preloading into a
/// secure-mode process; removed again on drop.
struct SystemCopy(std::path::PathBuf);
impl Drop for SystemCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_setuid_process_writes_no_report_where_the_environment_says() {
    extern "C" {
        fn geteuid() -> u32;
    }
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { geteuid() } != 0 || Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: needs root and setpriv to make a setuid program (CI has both)");
        return;
    }
    let libdir = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/lib64",
    ]
    .into_iter()
    .find(|d| std::path::Path::new(d).join("libc.so.6").exists())
    .expect("a system library directory");
    let name = format!("libpinguard-securetest-{}.so", std::process::id());
    let copy = SystemCopy(std::path::Path::new(libdir).join(&name));
    std::fs::copy(&fixtures().lib, &copy.0).unwrap();
    // Somewhere `nobody` can reach: the build tree may sit under a private directory.
    let dir = std::env::temp_dir().join(format!("pinguard-setuid-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = SystemCopy(dir.join("capi"));
    let prog = dir.join("capi");
    let out_dir = dir.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let ok = Command::new("cc")
        .args(["-o", prog.to_str().unwrap()])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/capi.c"))
        .status()
        .unwrap();
    assert!(ok.success());
    let chmod = |p: &std::path::Path, mode: &str| {
        assert!(Command::new("chmod")
            .args([mode, p.to_str().unwrap()])
            .status()
            .unwrap()
            .success())
    };
    chmod(&copy.0, "4755");
    chmod(&prog, "4755");
    chmod(&dir, "755");
    chmod(&out_dir, "777");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "env"])
        .arg(format!("LD_PRELOAD={name}"))
        .arg(format!("PINGUARD_REPORT={}/r.%p.json", out_dir.display()))
        .arg(&prog)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("live=8192"),
        "pinguard was loaded into the setuid process: {stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("write=-1"),
        "the C API with the template refuses too: {stdout}"
    );
    assert_eq!(
        std::fs::read_dir(&out_dir).unwrap().count(),
        0,
        "nothing written where the environment said"
    );
    assert!(stderr.contains("secure-mode"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn processes_writing_one_path_never_leave_a_torn_file() {
    let f = fixtures();
    let dir = fresh_dir("same-path");
    let path = dir.join("shared.json");
    let op = format!("report:{}", path.display());
    let args: Vec<&str> = std::iter::once("cuda_alloc:4096")
        .chain(std::iter::repeat_n(op.as_str(), 40))
        .collect();
    let spawn = || {
        Command::new(f.dir.join("scenario"))
            .args(&args)
            .env("LD_PRELOAD", &f.lib)
            .env("PINGUARD_REPORT", dir.join("exit.%p.json"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (spawn(), spawn());
    let mut reads = 0;
    let mut pids = std::collections::BTreeSet::new();
    loop {
        let done = a.try_wait().unwrap().is_some() && b.try_wait().unwrap().is_some();
        if let Ok(text) = std::fs::read(&path) {
            let r: serde_json::Value =
                serde_json::from_slice(&text).unwrap_or_else(|e| panic!("torn read #{reads}: {e}"));
            assert_eq!(r["reason"], "request");
            pids.insert(r["process"]["pid"].as_u64().unwrap());
            reads += 1;
        }
        if done {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        reads > 20,
        "the file was read while being rewritten ({reads} reads)"
    );
    assert_eq!(pids.len(), 2, "both processes wrote it");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Every `%` expansion is one path component: a host name such as `../escaped/x` (any bytes are a
/// valid host name to the kernel) cannot move the report or the state out of their folder.
#[test]
fn a_host_name_with_slashes_stays_one_path_component() {
    if aarch64() {
        return; // the host name is set in a namespace of the test's own, before qemu
    }
    let probe = Command::new("unshare")
        .args([
            "--uts",
            "python3",
            "-c",
            "import socket; socket.sethostname('x')",
        ])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("NOT RUN: needs root, unshare --uts and python3 (CI has them)");
        return;
    }
    let f = fixtures();
    let dir = fresh_dir("hostname");
    let exec = "import os, socket, sys; socket.sethostname('../escaped/x'); os.execve(sys.argv[1], sys.argv[1:], dict(os.environ, LD_PRELOAD=sys.argv[2]))";
    let mut cmd = Command::new("unshare");
    clear_pinguard_env(&mut cmd);
    cmd.args(["--uts", "python3", "-c", exec])
        .arg(f.dir.join("workload"))
        .arg(&f.lib)
        .current_dir(&dir)
        .env("PINGUARD_REPORT", dir.join("sub/%h.%p.json"));
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let top: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        top,
        vec![std::ffi::OsString::from("sub")],
        "nothing outside the report folder"
    );
    let names: Vec<String> = std::fs::read_dir(dir.join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(
        names[0].ends_with(".json") && !names[0].starts_with('.'),
        "{names:?}"
    );
    assert!(
        names[0].contains("escaped"),
        "the host name is kept, made safe: {names:?}"
    );
}
