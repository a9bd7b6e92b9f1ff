//! Shared by the integration tests: builds the emulated runtimes and the C test programs with the
//! system C compiler, runs programs with pinguard preloaded, and reads what they print.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

mod fixtures;

use fixtures::{build_set, fixture_dir};
pub use pinguard_common::Report;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub struct Fixtures {
    pub dir: PathBuf,
    pub lib: PathBuf,
}

/// The repository root (this file is also compiled into the CLI crate's tests).
pub fn root() -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while !p.join("tests/emul").is_dir() {
        assert!(
            p.pop(),
            "tests/emul not found above {}",
            env!("CARGO_MANIFEST_DIR")
        );
    }
    p
}

/// The library cargo built for this test run. `cargo test` rebuilds `deps/libpinguard.so` (the
/// crate's rlib makes it a dependency of the tests) but does not always copy it up to
/// `target/<profile>/`, so take whichever of the two is newer.
fn library() -> PathBuf {
    if let Some(lib) = std::env::var_os("PGTEST_LIB") {
        return PathBuf::from(lib); // another architecture's build (scripts/aarch64-tests.sh)
    }
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let candidates = [
        deps.join("libpinguard.so"),
        deps.parent().unwrap().join("libpinguard.so"),
    ];
    candidates
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .expect("libpinguard.so is missing: cargo builds it before the tests")
}

/// The file name of the object whose wrappers a `dlsym` through a handle returns: the library's,
/// also when the run preloads the first stage (`PGTEST_LIB=.../libpinguard-lazy.so`), which
/// sends such a look-up to the library it loads.
pub fn wrappers_file_name() -> String {
    let name = fixtures()
        .lib
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    if name == "libpinguard-lazy.so" {
        "libpinguard.so".to_string()
    } else {
        name
    }
}

/// `PGTEST_TARGET=aarch64`: the C fixtures are cross-built and every program runs under
/// `qemu-aarch64` (scripts/aarch64-tests.sh sets it, with `PGTEST_LIB` naming the aarch64 library).
pub fn aarch64() -> bool {
    std::env::var("PGTEST_TARGET").is_ok_and(|t| t == "aarch64")
}

/// A command that runs the test program `path`, with `preload` as its `LD_PRELOAD`: directly, or
/// under qemu-aarch64, which takes the guest's `LD_PRELOAD` as an option (in its own environment
/// it would preload the aarch64 library into qemu itself).
pub fn program(path: &Path, preload: Option<&std::ffi::OsStr>) -> Command {
    if aarch64() {
        let mut cmd = Command::new("qemu-aarch64");
        cmd.args(["-L", "/usr/aarch64-linux-gnu"]);
        if let Some(p) = preload {
            let mut e = std::ffi::OsString::from("LD_PRELOAD=");
            e.push(p);
            cmd.arg("-E").arg(e);
        }
        cmd.arg(path);
        cmd
    } else {
        let mut cmd = Command::new(path);
        if let Some(p) = preload {
            cmd.env("LD_PRELOAD", p);
        }
        cmd
    }
}

/// The C compiler the fixtures are built with (a cross compiler for `PGTEST_TARGET=aarch64`).
pub fn compiler() -> &'static str {
    if aarch64() {
        "aarch64-linux-gnu-gcc"
    } else {
        "cc"
    }
}

pub fn cc(args: &[&str]) {
    cc_in(Path::new("."), args)
}

/// `cc` with `args`, run in `dir` (relative paths in `args` are relative to it).
pub fn cc_in(dir: &Path, args: &[&str]) {
    let out = Command::new(compiler())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("a C compiler (cc) is needed for the tests");
    assert!(
        out.status.success(),
        "cc {:?} failed:\n{}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let tag = if aarch64() { "aarch64-" } else { "" };
        let dir = fixture_dir(compiler(), tag).to_path_buf();
        build_set(&dir, "base");
        Fixtures {
            dir,
            lib: library(),
        }
    })
}

/// The fixture folder, with the set `set` of `tests/fixtures.txt` built in it (once).
pub fn fixture_set(set: &str) -> &'static Path {
    let dir = &fixtures().dir;
    build_set(dir, set);
    dir
}

pub struct Run {
    pub out: Output,
    pub stdout: String,
    pub stderr: String,
    pub report_dir: PathBuf,
}

impl Run {
    pub fn from_output(out: Output, report_dir: PathBuf) -> Run {
        Run {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            out,
            report_dir,
        }
    }

    /// The `STATS {...}` line a test program prints last.
    pub fn stats(&self) -> Value {
        let line = self
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("STATS "))
            .unwrap_or_else(|| {
                panic!(
                    "no STATS line in:\n{}\nstderr:\n{}",
                    self.stdout, self.stderr
                )
            });
        serde_json::from_str(line).unwrap()
    }

    /// The one report the program wrote as JSON, for the tests of the written format itself (key
    /// spelling, absent against null); every other test reads `typed_report`.
    pub fn report_json(&self) -> Value {
        read_json(&self.report_file())
    }

    /// The one report the program wrote, read through the report's own types (the schema the
    /// library writes and the CLI reads): a key the tests read is a field of `Report`.
    pub fn typed_report(&self) -> Report {
        read_report(&self.report_file())
    }

    fn report_file(&self) -> PathBuf {
        let files = reports_in(&self.report_dir);
        assert_eq!(
            files.len(),
            1,
            "expected one report in {}, found {:?}\nstderr:\n{}",
            self.report_dir.display(),
            files,
            self.stderr
        );
        files[0].clone()
    }

    /// `op rc=N` for the n-th operation line starting with `op`.
    pub fn rc(&self, op: &str) -> i64 {
        let line = self
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{op} ")))
            .unwrap_or_else(|| panic!("no line for {op} in:\n{}", self.stdout));
        field(line, "rc")
    }

    /// Each operation's `rc=`, in the order the program printed them.
    pub fn rcs(&self) -> Vec<i64> {
        self.named_rcs().into_iter().map(|(_, rc)| rc).collect()
    }

    /// Each operation's name (its line's first word) and `rc=`, in the order printed.
    pub fn named_rcs(&self) -> Vec<(String, i64)> {
        self.stdout
            .lines()
            .filter(|l| l.contains(" rc="))
            .map(|l| (l.split(' ').next().unwrap().to_string(), field(l, "rc")))
            .collect()
    }

    /// The `rc=` of each of `ops`, in their order.
    pub fn rcs_of(&self, ops: &[&str]) -> Vec<i64> {
        ops.iter().map(|op| self.rc(op)).collect()
    }

    pub fn slot(&self, op: &str) -> i64 {
        let line = self
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{op} ")))
            .unwrap();
        field(line, "slot")
    }

    pub fn success(&self) -> bool {
        self.out.status.success()
    }
}

pub fn field(line: &str, key: &str) -> i64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .parse()
        .unwrap()
}

/// The reports in `dir`: its `*.json` files but `pinguard run`'s record of the run
/// (`pinguard-run.<pid>.json`), which is not a report.
pub fn reports_in(dir: &Path) -> Vec<PathBuf> {
    let report = |p: &PathBuf| {
        p.extension().is_some_and(|e| e == "json")
            && !p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("pinguard-run."))
    };
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(report)
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The report at `p`, parsed into the report's types (`pinguard_common::Report`, as the CLI
/// reads it), or a panic naming the file and what did not parse.
pub fn read_report(p: &Path) -> Report {
    let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    Report::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", p.display(), String::from_utf8_lossy(&bytes)))
}

/// A JSON file that is not a report (`pinguard run`'s record, an export), or a report read as
/// written, to edit it or to check its format: reports are read with `read_report`.
pub fn read_json(p: &Path) -> Value {
    let text = std::fs::read_to_string(p).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", p.display()))
}

pub fn fresh_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = fixtures()
        .dir
        .join(format!("run-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `prog` (a fixture name or a path) with pinguard preloaded, reports going to a fresh
/// directory, and `env` on top of a clean `PINGUARD_*` environment.
/// `path` run in `dir` (with the library when `preload`), its reports going to `dir`
/// (`report.%p.json`), on a clean `PINGUARD_*`/`EMU_*` environment.
pub fn command_in(path: &Path, dir: &Path, preload: bool) -> Command {
    let f = fixtures();
    let mut cmd = program(path, preload.then_some(f.lib.as_os_str()));
    cmd.current_dir(dir);
    clear_pinguard_env(&mut cmd);
    cmd.env("PINGUARD_REPORT", dir.join("report.%p.json"));
    cmd
}

/// Removes every `PINGUARD_*` and `EMU_*` variable the test harness itself was started with.
pub fn clear_pinguard_env(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("PINGUARD_") || k.starts_with("EMU_") {
            cmd.env_remove(k);
        }
    }
}

/// Runs with a deadline: a hang fails the test instead of hanging it. The program runs in its own
/// process group, so that a hung grandchild (holding the output pipes) is killed with it.
pub fn run_bounded(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            // SAFETY: signals the test's own child process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let out = child.wait_with_output().unwrap();
            panic!(
                "hung for {limit:?}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Removes the System V semaphore set a group ledger at `ledger` names (a test's group ends with
/// its ledger; the set would otherwise outlive it in the host's IPC namespace).
pub fn remove_semaphores(ledger: &str) {
    use pinguard_common::group::{Header, SIZE};
    let Ok(b) = std::fs::read(ledger) else { return };
    if b.len() != SIZE {
        return;
    }
    let at = std::mem::offset_of!(Header, sem_key);
    let key = i32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
    if key == 0 {
        return;
    }
    // SAFETY: no pointers; the set is the test's group's (found by the key its ledger holds).
    unsafe {
        let id = libc::semget(key, 0, 0);
        if id >= 0 {
            libc::semctl(id, 0, libc::IPC_RMID);
        }
    }
}

/// The `churn` program in the group `group`: keeps 64 KiB pinned (of a 100 KiB group budget)
/// until killed; returns once it said it is ready.
pub fn spawn_churn_holder(
    group: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    use std::io::BufRead;
    let f = fixtures();
    let mut cmd = program(&f.dir.join("churn"), Some(f.lib.as_os_str()));
    clear_pinguard_env(&mut cmd);
    let mut child = cmd
        .env("PINGUARD_GROUP", group)
        .env("PINGUARD_GROUP_BUDGET", "100K")
        .env("PINGUARD_REPORT", fresh_dir("holder").join("r.%p.json"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    (child, out)
}

pub fn run(prog: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let f = fixtures();
    let report_dir = fresh_dir(prog.rsplit('/').next().unwrap());
    let path = if prog.contains('/') {
        PathBuf::from(prog)
    } else {
        f.dir.join(prog)
    };
    let mut cmd = command_in(&path, &report_dir, true);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Run::from_output(cmd.output().unwrap(), report_dir)
}

/// The stderr lines pinguard printed (its own prefix).
pub fn pinguard_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("pinguard"))
        .collect()
}

/// Whether `program` can be run. Tests of third-party programs skip (loudly) without them, except
/// under `.ci/run`, which installs them and sets PGTEST_REQUIRE_ALL=1 so nothing is skipped.
pub fn have(program: &str, why: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "{program} is required here ({why})"
        );
        eprintln!("SKIPPED: {program} is not installed ({why}); .ci/run installs it");
    }
    found
}

/// The `pinguard` command, for the tests outside its crate (whose own tests have
/// `CARGO_BIN_EXE_pinguard`): `PGTEST_CLI`, or built once per test binary by the cargo running the
/// tests, into the same target directory and profile (a no-op when it is up to date).
pub fn cli() -> PathBuf {
    static CLI: OnceLock<PathBuf> = OnceLock::new();
    CLI.get_or_init(|| {
        if let Some(p) = std::env::var_os("PGTEST_CLI") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf(); // target/<profile>
        let target_dir = profile_dir.parent().unwrap();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        // `--workspace`, as `cargo test --workspace` resolves features: with `-p pinguard-cli`
        // alone the dependencies' features differ, and the CLI and pinguard-common were built
        // again in the middle of the run (16 s on an idle machine, on the suite's critical path).
        cmd.args([
            "build",
            "-q",
            "--workspace",
            "--bin",
            "pinguard",
            "--target-dir",
        ])
        .arg(target_dir)
        .current_dir(root());
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some("release") => {
                cmd.arg("--release");
            }
            Some(other) => {
                cmd.args(["--profile", other]);
            }
        }
        let out = cmd.output().expect("cargo, to build the pinguard command");
        assert!(
            out.status.success(),
            "building the pinguard command failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        profile_dir.join("pinguard")
    })
    .clone()
}

/// Runs the `pinguard` command with `args`, in a clean `PINGUARD_*` environment.
pub fn pinguard_cli(args: &[&std::ffi::OsStr]) -> Output {
    let mut cmd = Command::new(cli());
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("PINGUARD_") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("LD_PRELOAD");
    cmd.output().unwrap()
}

/// An emulated runtime's own counters as it left them in `EMU_STATS_FILE` (`base`, with the
/// runtime's name appended: `cuda`, `driver` or `acl`), under the names of `struct emu_stats`;
/// `None` while the runtime has not made the file.
pub fn emu_stats_file(base: &Path, runtime: &str) -> Option<Value> {
    let mut name = base.as_os_str().to_owned();
    name.push(format!(".{runtime}"));
    let bytes = std::fs::read(PathBuf::from(name)).ok()?;
    const FIELDS: [&str; 7] = [
        "outstanding_bytes",
        "max_outstanding_bytes",
        "outstanding_count",
        "alloc_calls",
        "release_calls",
        "failed_calls",
        "injected_failures",
    ];
    if bytes.len() < FIELDS.len() * 8 {
        return None;
    }
    let mut m = serde_json::Map::new();
    for (i, f) in FIELDS.iter().enumerate() {
        let v = i64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
        m.insert(f.to_string(), v.into());
    }
    Some(Value::Object(m))
}

/// A `scenario` process that ran its pinning operations and now waits on its stdin.
pub struct Held {
    pub child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Held {
    /// `ops`, then `wait_stdin`; `dir` holds its report; `env` on a clean pinguard environment.
    pub fn start(dir: &Path, ops: &[&str], env: &[(&str, &str)]) -> Held {
        Held::start_with(dir, ops, env, |c| c)
    }

    pub fn start_with(
        dir: &Path,
        ops: &[&str],
        env: &[(&str, &str)],
        wrap: impl FnOnce(Command) -> Command,
    ) -> Held {
        let f = fixtures();
        let mut cmd = command_in(&f.dir.join("scenario"), dir, true);
        cmd.args(ops).arg("wait_stdin:0");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = wrap(cmd)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
                "scenario ended before waiting"
            );
            if line.trim() == "waiting" {
                break;
            }
        }
        Held { child, out }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets the program past its `wait_stdin`, up to its next one.
    pub fn step(&mut self) {
        std::io::Write::write_all(self.child.stdin.as_mut().unwrap(), b"\n").unwrap();
        let mut line = String::new();
        while line.trim() != "waiting" {
            line.clear();
            assert!(
                std::io::BufRead::read_line(&mut self.out, &mut line).unwrap() > 0,
                "the program ended before waiting again"
            );
        }
    }

    /// Lets it exit normally; its stderr.
    pub fn finish(mut self) -> String {
        std::io::Write::write_all(&mut self.child.stdin.take().unwrap(), b"\n").unwrap();
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.out, &mut rest);
        let mut stderr = String::new();
        let _ = std::io::Read::read_to_string(self.child.stderr.as_mut().unwrap(), &mut stderr);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status:?}: {rest}\n{stderr}");
        stderr
    }

    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (up to 20 s: a loaded machine) until `ok` holds.
pub fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !ok() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The same function through prototypes with more and more ignored arguments: the System V ABI
/// passes those on the stack, so libffi calls the hook from a new stack depth each time, through
/// the same return addresses. Each depth is a fresh walk through libffi's `ffi_call_unix64`,
/// whose return address is unwound from its frame pointer (CFA = rbp + 32). `rounds` passes
/// over the twelve prototypes, each pin freed before the next (issue 34, item 4).
pub fn ctypes_depths_script(cudart: &str, rounds: usize) -> String {
    format!(
        r#"
import ctypes
rt = ctypes.CDLL({cudart:?})
rt.cudaFreeHost.argtypes = [ctypes.c_void_p]
def proto(extra):
    p = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, *[ctypes.c_long] * extra)
    return p(("cudaMallocHost", rt))
fns = [(proto(4 + 2 * k), [0] * (4 + 2 * k)) for k in range(12)]
for _ in range({rounds}):
    for fn, extra in fns:
        buf = ctypes.c_void_p()
        assert fn(ctypes.byref(buf), 262144, *extra) == 0
        assert rt.cudaFreeHost(buf) == 0
"#
    )
}

/// The typed report's first event of a call of `api` the runtime or the kernel failed (issue 46
/// item 13), or a panic naming the events there are.
pub fn failed_event_of<'a>(rep: &'a Report, api: &str) -> &'a pinguard_common::Event {
    rep.events
        .iter()
        .find(|e| e.kind == pinguard_common::EventKind::Failed && e.api == api)
        .unwrap_or_else(|| panic!("no failed {api} event: {:?}", rep.events))
}

/// A typed event's `why` says the API's answer `error` and the room, every figure read (`None`
/// only where the process has no such limit).
pub fn assert_why_of(e: &pinguard_common::Event, error: &str) {
    let why = e.why.as_ref().unwrap_or_else(|| panic!("no why: {e:?}"));
    assert_eq!(why.error, error, "{e:?}");
    assert!(why.rlimit_memlock_known, "{e:?}");
    assert!(why.vm_lck_bytes.is_some(), "{e:?}");
    assert!(why.vm_pin_bytes.is_some(), "{e:?}");
}

/// The typed report's figures for one entry point, or a panic naming those it has.
pub fn api_stats<'a>(rep: &'a Report, name: &str) -> &'a pinguard_common::ApiStats {
    rep.apis.get(name).unwrap_or_else(|| {
        panic!(
            "no {name} in the report's apis: {:?}",
            rep.apis.keys().collect::<Vec<_>>()
        )
    })
}

/// Every `.rs` file of the test folder `dir` is named by a `mod` line of its `suite.rs` (with
/// `autotests = false`, a file no `mod` line names is never compiled nor run).
pub fn assert_every_file_is_a_module(dir: &Path) {
    let suite = std::fs::read_to_string(dir.join("suite.rs")).unwrap();
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(m) = name.strip_suffix(".rs").filter(|m| *m != "suite") {
            assert!(
                suite.lines().any(|l| l == format!("mod {m};")),
                "{name} is not a module of {}: add `mod {m};`",
                dir.join("suite.rs").display()
            );
        }
    }
}
