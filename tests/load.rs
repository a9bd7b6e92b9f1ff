//! The library loads anywhere, stays silent in processes that pin nothing, and exports only the
//! hooks and its C API.

use crate::common;
use common::*;
use pinguard_common::Reason;
use std::process::Command;

#[test]
fn processes_that_pin_nothing_are_untouched() {
    let f = fixtures();
    for cmd in [
        &["true"][..],
        &["ls", "/"],
        &["python3", "-c", "pass"],
        &["sh", "-c", "true | cat"],
    ] {
        let dir = fresh_dir("quiet");
        let out = Command::new(cmd[0])
            .args(&cmd[1..])
            .current_dir(&dir)
            .env("LD_PRELOAD", &f.lib)
            .env_remove("PINGUARD_REPORT")
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd:?}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "",
            "{cmd:?} printed on stderr"
        );
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(files.is_empty(), "{cmd:?} left files: {files:?}");
    }
}

/// The names `scripts/exports.py` reads from the entry-point tables and the C header, with the
/// table (file) each comes from.
fn declared_exports() -> Vec<(String, String)> {
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/exports.py"))
        .arg("--families")
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "exports.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (family, name) = l.split_once(' ').unwrap();
            (family.to_string(), name.to_string())
        })
        .collect()
}

#[test]
fn only_hooks_and_the_c_api_are_exported() {
    let f = fixtures();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&f.lib)
        .output()
        .expect("nm (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(|n| n.split('@').next().unwrap())
        .collect();
    // The list comes from the tables, one row per entry point, and the header.
    let declared = declared_exports();
    let allowed: Vec<&str> = declared.iter().map(|(_, n)| n.as_str()).collect();
    for (family, some) in [
        ("cuda_runtime", "cudaHostAlloc"),
        ("cuda_driver", "cuGetProcAddress_v2"),
        ("acl", "aclrtMallocHost"),
        ("hip", "hipHostMalloc"),
        ("libc_lock", "mmap64"),
        ("signal", "sigaction"),
        ("dlsym", "dlsym"),
        ("exit", "_Exit"),
        ("dlclose", "dlclose"),
        ("capi", "pinguard_version"),
    ] {
        assert!(
            declared.iter().any(|(t, n)| t == family && n == some),
            "{some} not read from the {family} table: {declared:?}"
        );
    }
    for n in &names {
        assert!(
            allowed.contains(n),
            "unexpected export {n} (not a row of any table in src/hooks/, nor in pinguard.h)"
        );
    }
    for a in &allowed {
        assert!(names.contains(a), "{a} is declared but not exported");
    }
}

#[test]
fn the_c_api_works_from_c() {
    let f = fixtures();
    let dir = fresh_dir("capi");
    let explicit = dir.join("asked.json");
    let r = run(
        f.dir.join("capi").to_str().unwrap(),
        &[explicit.to_str().unwrap()],
        &[],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains(&format!("version={}", env!("CARGO_PKG_VERSION"))),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("live=8192"), "{}", r.stdout);
    assert!(
        r.stdout.contains("write=0 errno=77"),
        "errno must survive: {}",
        r.stdout
    );
    assert!(r.stdout.contains("write_bad=-1"), "{}", r.stdout);
    assert!(r.stdout.contains("live_after=0"), "{}", r.stdout);
    // The path it gives is the one the exit report went to; a short buffer gets the length.
    let said = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("path="))
        .unwrap();
    assert_eq!(
        std::path::Path::new(said),
        reports_in(&r.report_dir)[0].as_path()
    );
    assert!(
        r.stdout
            .contains(&format!("path_len={} short=\"{}\"", said.len(), &said[..3])),
        "{}",
        r.stdout
    );
    let asked = read_report(&explicit);
    assert_eq!(asked.reason, Reason::Request);
    assert_eq!(asked.totals.live_bytes, 8192);
    let at_exit = r.typed_report();
    assert_eq!(at_exit.reason, Reason::Exit);
    assert_eq!(at_exit.totals.live_bytes, 0);
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
    assert!(
        !stderr.contains("pinguard"),
        "a process that pins nothing printed:\n{stderr}"
    );
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(files.is_empty(), "left files: {files:?}");
}

/// Two copies of the library at two paths (a node's preload and a wheel's): what the scenario
/// gives under `preload`, with a 8 KiB budget and one refused call.
fn under_copies(tag: &str, preload: &std::ffi::OsStr, ops: &[&str], env: &[(&str, &str)]) -> Run {
    let f = fixtures();
    let dir = fresh_dir(tag);
    let mut cmd = program(&f.dir.join("scenario"), Some(preload));
    cmd.current_dir(&dir).args(ops);
    clear_pinguard_env(&mut cmd);
    cmd.env("PINGUARD_REPORT", dir.join("report.%p.json"))
        .env("PINGUARD_BUDGET", "8K");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Run::from_output(cmd.output().unwrap(), dir)
}

/// The library copied to `dir/NAME/libpinguard.so`: another file at another path.
fn library_copy(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("libpinguard.so");
    std::fs::copy(&fixtures().lib, &p).unwrap();
    p
}

/// What must not differ between one copy and several: the counts and each callsite's frames.
fn counted(rep: &Report) -> ([u64; 7], Vec<String>) {
    let t = &rep.totals;
    let totals = [
        t.alloc_count,
        t.release_count,
        t.denied_count,
        t.downgraded_count,
        t.failed_count,
        t.live_bytes,
        t.peak_live_bytes,
    ];
    let mut frames: Vec<String> = rep
        .callsites
        .iter()
        .map(|c| {
            let names: Vec<String> = c
                .frames
                .iter()
                .map(|f| format!("{:?}!{:?}", f.module, f.symbol))
                .collect();
            format!("{} {} {}", c.alloc_count, c.denied_count, names.join(" < "))
        })
        .collect();
    frames.sort();
    (totals, frames)
}

fn assert_no_pinguard_frames(rep: &Report) {
    for c in &rep.callsites {
        for f in &c.frames {
            assert!(
                !f.module.as_deref().unwrap_or("").contains("libpinguard"),
                "pinguard's own frame named as a callsite: {c:?}"
            );
        }
    }
}

#[test]
fn two_copies_preloaded_count_as_one() {
    let dir = fresh_dir("copies");
    let (a, b) = (library_copy(&dir, "node"), library_copy(&dir, "wheel"));
    let ops = [
        "cuda_alloc:4096",
        "cuda_alloc:16384",
        "mlock:0:1",
        "cuda_free:0",
    ];
    let one = under_copies("copies-one", a.as_os_str(), &ops, &[]);
    let mut both = a.clone().into_os_string();
    both.push(":");
    both.push(&b);
    let two = under_copies("copies-two", &both, &ops, &[]);
    for r in [&one, &two] {
        assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
        assert_eq!(r.rc("cuda_alloc:16384"), 2, "refused: {}", r.stdout);
    }
    // `typed_report()` asserts that there is exactly one report.
    let (rep1, rep2) = (one.typed_report(), two.typed_report());
    assert_eq!(rep2.totals.denied_count, 1, "{rep2:?}");
    assert_no_pinguard_frames(&rep2);
    assert_eq!(counted(&rep2), counted(&rep1));
    assert_eq!(
        pinguard_lines(&two.stderr).len(),
        pinguard_lines(&one.stderr).len(),
        "one exit line, as with one copy:\n{}",
        two.stderr
    );
}

#[test]
fn a_copy_dlopened_later_stands_down() {
    let dir = fresh_dir("copies-late");
    let (a, b) = (library_copy(&dir, "node"), library_copy(&dir, "wheel"));
    let late = format!("dlopen:{}", b.display());
    let ops = ["cuda_alloc:4096", &late, "cuda_alloc:16384", "mlock:0:1"];
    // A report thread and a report signal in force: the copy in charge has both already. The
    // runtime pins nothing for real (`EMU_NO_PIN`), so that no copy could learn the live bytes
    // from the kernel's `VmLck`: only the copy in charge knows them.
    let env = [
        ("PINGUARD_INTERVAL", "1h"),
        ("PINGUARD_SIGNAL", "USR2"),
        ("EMU_NO_PIN", "1"),
    ];
    let r = under_copies("copies-late", a.as_os_str(), &ops, &env);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.rc(&late), 0, "{}", r.stdout);
    let line = r.stdout.lines().find(|l| l.starts_with("dlopen ")).unwrap();
    assert_eq!(
        field(line, "threads_after"),
        field(line, "threads_before"),
        "the second copy started a thread: {line}"
    );
    assert_eq!(field(line, "handler_changed"), 0, "{line}");
    // Its C API answers with the copy in charge's figures.
    assert_eq!(field(line, "live"), 4096, "{line}");
    assert_eq!(r.rc("cuda_alloc:16384"), 2, "refused: {}", r.stdout);
    let rep = r.typed_report();
    assert_eq!(rep.totals.denied_count, 1, "{rep:?}");
    assert_eq!(rep.totals.alloc_count, 2, "{rep:?}");
    assert_no_pinguard_frames(&rep);
}

/// Every C API function of a copy that stands down answers with the copy in charge's: each
/// starts by forwarding itself, by its own name (a new function that forgot would answer nothing).
#[test]
fn every_c_api_function_forwards_to_the_copy_in_charge() {
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/capi.rs")).unwrap();
    let mut seen = 0;
    for (i, _) in src.match_indices("#[no_mangle]") {
        let rest = &src[i..];
        let name = rest.split("fn ").nth(1).unwrap().split('(').next().unwrap();
        let body = &rest[rest.find('{').unwrap()..];
        let first = body.split(';').next().unwrap();
        assert!(
            first.contains("forward!("),
            "{name} does not start by forwarding itself"
        );
        assert!(
            first.contains(&format!("c\"{name}\"")),
            "{name} forwards another name: {first}"
        );
        seen += 1;
    }
    assert!(seen >= 7, "C API functions found: {seen}");
}

/// A node's copy in `/etc/ld.so.preload` (only inside a private mount namespace: an overlay on
/// `/etc`) and `pinguard run`'s copy in `LD_PRELOAD`: the loader puts `LD_PRELOAD`'s first, and
/// that copy alone counts, as it would alone.
#[test]
fn a_node_preload_beside_a_run_preload_counts_as_one() {
    // SAFETY: geteuid takes nothing and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let unshare = Command::new("unshare")
        .args(["-m", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if aarch64() || !root || !unshare {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "needs root and unshare -m"
        );
        eprintln!("NOT RUN: needs root and unshare -m");
        return;
    }
    let f = fixtures();
    let dir = fresh_dir("copies-node");
    let (node, wheel) = (library_copy(&dir, "node"), library_copy(&dir, "wheel"));
    std::fs::create_dir(dir.join("ov")).unwrap();
    let ops = [
        "cuda_alloc:4096",
        "cuda_alloc:16384",
        "mlock:0:1",
        "cuda_free:0",
    ];
    let one = under_copies("copies-node-one", wheel.as_os_str(), &ops, &[]);
    let out = dir.join("reports");
    std::fs::create_dir(&out).unwrap();
    let script = "set -e\n\
        mount --make-rprivate /\n\
        mount -t tmpfs pgcopies \"$D/ov\"\n\
        mkdir \"$D/ov/u\" \"$D/ov/w\"\n\
        mount -t overlay overlay -o lowerdir=/etc,upperdir=\"$D/ov/u\",workdir=\"$D/ov/w\" /etc\n\
        echo \"$NODE_LIB\" > /etc/ld.so.preload\n\
        grep -c node/libpinguard.so /proc/self/maps > \"$D/node-loaded\" || true\n\
        exec \"$@\"\n";
    let mut cmd = Command::new("unshare");
    clear_pinguard_env(&mut cmd);
    cmd.args(["-m", "sh", "-c", script, "sh"])
        .arg(f.dir.join("scenario"))
        .args(ops)
        .current_dir(&out)
        .env("D", &dir)
        .env("NODE_LIB", &node)
        .env("LD_PRELOAD", &wheel)
        .env("PINGUARD_REPORT", out.join("report.%p.json"))
        .env("PINGUARD_BUDGET", "8K");
    let two = Run::from_output(
        run_bounded(&mut cmd, std::time::Duration::from_secs(60)),
        out,
    );
    for r in [&one, &two] {
        assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
        assert_eq!(r.rc("cuda_alloc:16384"), 2, "refused: {}", r.stdout);
    }
    let (rep1, rep2) = (one.typed_report(), two.typed_report());
    // A program started there maps the node's copy (`grep` saw it in its own mappings).
    let seen = std::fs::read_to_string(dir.join("node-loaded")).unwrap_or_default();
    assert!(
        seen.trim().parse::<u32>().is_ok_and(|n| n > 0),
        "the node's copy was not loaded: {seen:?}\n{}",
        two.stderr
    );
    assert_eq!(rep2.totals.denied_count, 1, "{rep2:?}");
    assert_no_pinguard_frames(&rep2);
    assert_eq!(counted(&rep2), counted(&rep1));
}
