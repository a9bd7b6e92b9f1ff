//! Secure mode and the node configuration file (issue 43 items 1, 2 and 8), with real parts: a
//! set-user-ID root copy of `progs/secure_prog.c` run by a throw-away user (`useradd`, `setpriv`),
//! the library in `/etc/ld.so.preload` and a node file in `/etc/pinguard/`, both only inside a
//! mount namespace whose `/etc` is an overlay over the machine's (never changed: the user, the
//! preload list and the node file all land in a tmpfs that goes with the namespace).

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The node file's default path, as the library and `docs/deploy.md` name it.
const NODE_FILE: &str = "/etc/pinguard/pinguard.conf";

/// A work folder every user can reach: the setuid program, a copy of the library, a folder the
/// caller may write (`caller`) and one only root may (`node`); removed on drop.
struct Node {
    dir: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The node file as a test wants it: its text, owner (`None`: root; `Some`: the throw-away user)
/// and mode, and its folder's mode.
struct NodeFile<'a> {
    text: &'a str,
    user_owned: bool,
    mode: &'a str,
    folder_mode: &'a str,
}

impl<'a> NodeFile<'a> {
    fn root(text: &'a str) -> NodeFile<'a> {
        NodeFile {
            text,
            user_owned: false,
            mode: "644",
            folder_mode: "755",
        }
    }
}

fn chmod(p: &Path, mode: &str) {
    assert!(Command::new("chmod")
        .arg(mode)
        .arg(p)
        .status()
        .unwrap()
        .success());
}

/// Whether this machine can run the secure-mode tests: root, `setpriv`, `useradd`, `unshare` and
/// an overlay mount in a mount namespace. CI has all of them (`PGTEST_REQUIRE_ALL`).
fn can_run(test: &str) -> bool {
    extern "C" {
        fn geteuid() -> u32;
    }
    // SAFETY: geteuid takes nothing and cannot fail.
    let root = unsafe { geteuid() } == 0;
    let tools = ["setpriv", "useradd", "unshare", "mount"]
        .iter()
        .all(|t| have(t, "secure-mode tests"));
    let ok = root
        && tools
        && !aarch64()
        && Command::new("unshare")
            .args(["-m", "sh", "-c", "mount -t tmpfs pgprobe /mnt"])
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("NOT RUN: {test}: needs root, setpriv, useradd and mounts in a mount namespace");
        assert!(
            aarch64() || std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "{test} must run here"
        );
    }
    ok
}

impl Node {
    fn new(tag: &str) -> Node {
        let dir =
            std::env::temp_dir().join(format!("pinguard-secure-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["", "caller", "node", "ov"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let node = Node { dir };
        let prog = node.prog();
        // Built once (`tests/fixtures.txt`), copied here: a set-user-ID file of this node's own.
        std::fs::copy(fixture_set("secure_mode").join("secure_prog"), &prog).unwrap();
        std::fs::copy(&fixtures().lib, node.lib()).unwrap();
        chmod(&node.dir, "755");
        chmod(&node.dir.join("node"), "755");
        chmod(&node.dir.join("caller"), "777");
        chmod(&prog, "4755");
        node
    }

    fn prog(&self) -> PathBuf {
        self.dir.join("secure_prog")
    }

    fn lib(&self) -> PathBuf {
        self.dir.join("libpinguard.so")
    }

    fn caller(&self) -> PathBuf {
        self.dir.join("caller")
    }

    fn node_out(&self) -> PathBuf {
        self.dir.join("node")
    }

    /// Runs the setuid program as a throw-away user with `env` (and nothing else of pinguard's)
    /// in a mount namespace where `/etc/ld.so.preload` lists the library and `file`, when given,
    /// is the node configuration file.
    fn run(&self, file: Option<NodeFile>, env: &[(&str, &str)], args: &[&str]) -> Output {
        let d = self.dir.display();
        let mut s = format!(
            "set -e\n\
             mount --make-rprivate /\n\
             mount -t tmpfs pgsecure {d}/ov\n\
             mkdir {d}/ov/u {d}/ov/w {d}/ov/log\n\
             mount -t overlay overlay -o lowerdir=/etc,upperdir={d}/ov/u,workdir={d}/ov/w /etc\n\
             mount --bind {d}/ov/log /var/log\n\
             useradd -M -N -l -s /bin/sh pgsecure\n"
        );
        if let Some(f) = &file {
            s += &format!(
                "mkdir -p /etc/pinguard\n\
                 printf '%s' \"$NODE_TEXT\" > {NODE_FILE}\n\
                 chmod {} {NODE_FILE}\n\
                 chmod {} /etc/pinguard\n",
                f.mode, f.folder_mode
            );
            if f.user_owned {
                s += &format!("chown pgsecure {NODE_FILE}\n");
            }
        }
        s += &format!("echo {} > /etc/ld.so.preload\n", self.lib().display());
        s += "cd \"$WORK\"\nexec setpriv --reuid=pgsecure --regid=65534 --clear-groups env -i PATH=/usr/bin:/bin \"$@\"\n";
        let mut cmd = Command::new("unshare");
        clear_pinguard_env(&mut cmd);
        cmd.args(["-m", "sh", "-c", &s, "sh"])
            .env("WORK", &self.dir)
            .env("NODE_TEXT", file.as_ref().map_or("", |f| f.text));
        for (k, v) in env {
            cmd.arg(format!("{k}={v}"));
        }
        cmd.arg(self.prog()).args(args);
        let out = run_bounded(&mut cmd, Duration::from_secs(60));
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The `lock` line's rc and VmLck (KiB), the n-th one printed.
fn lock_line(stdout: &str, n: usize) -> (i64, i64) {
    let line = stdout
        .lines()
        .filter(|l| l.starts_with("lock "))
        .nth(n)
        .unwrap_or_else(|| panic!("no lock line #{n} in:\n{stdout}"));
    (field(line, "rc"), field(line, "vmlck_kb"))
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn the_callers_budget_and_downgrade_do_not_unlock_roots_secret() {
    if !can_run("downgrade") {
        return;
    }
    let node = Node::new("downgrade");
    let o = node.run(
        None,
        &[("PINGUARD_BUDGET", "0"), ("PINGUARD_POLICY", "downgrade")],
        &["lock:64"],
    );
    let (out, err) = text(&o);
    assert_eq!(
        lock_line(&out, 0),
        (0, 64),
        "root's 64 KiB secret is locked (VmLck), whatever the caller set:\n{out}\n{err}"
    );
}

#[test]
fn the_callers_zero_budget_does_not_make_roots_mlock_fail() {
    if !can_run("budget") {
        return;
    }
    let node = Node::new("budget");
    let o = node.run(None, &[("PINGUARD_BUDGET", "0")], &["lock:64"]);
    let (out, err) = text(&o);
    assert_eq!(lock_line(&out, 0), (0, 64), "{out}\n{err}");
}

#[test]
fn the_callers_group_makes_root_create_no_ledger() {
    if !can_run("group") {
        return;
    }
    let node = Node::new("group");
    let group = format!("pgsecure-{}", std::process::id());
    let ledger = pinguard_common::group::path(&group);
    let _ = std::fs::remove_file(&ledger);
    let o = node.run(
        None,
        &[("PINGUARD_GROUP", &group), ("PINGUARD_GROUP_BUDGET", "0")],
        &["env"],
    );
    let made = Path::new(&ledger).exists();
    remove_semaphores(&ledger);
    let _ = std::fs::remove_file(&ledger);
    assert!(
        !made,
        "root created the caller's group ledger {ledger}: {:?}",
        text(&o)
    );
}

#[test]
fn a_root_child_sees_no_pinguard_variable_and_writes_nothing_where_the_caller_said() {
    if !can_run("child") {
        return;
    }
    let node = Node::new("child");
    let template = format!("{}/child.%p.json", node.caller().display());
    let o = node.run(
        None,
        &[("PINGUARD_REPORT", &template), ("PINGUARD_BUDGET", "0")],
        &["env", "root_child:env,lock:64"],
    );
    let (out, err) = text(&o);
    let counts: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("env_count="))
        .collect();
    assert_eq!(
        counts,
        ["env_count=0", "env_count=0"],
        "neither the setuid program after pinguard's start nor its root child keeps PINGUARD_*:\n{out}\n{err}"
    );
    assert_eq!(lock_line(&out, 0), (0, 64), "{out}\n{err}");
    assert_eq!(
        files_in(&node.caller()),
        Vec::<PathBuf>::new(),
        "nothing written where the caller's template said"
    );
}

#[test]
fn the_node_file_applies_in_secure_mode_and_says_where_the_report_goes() {
    if !can_run("node") {
        return;
    }
    let node = Node::new("node");
    let conf = format!(
        "# node-wide settings\nPINGUARD_BUDGET=16K\nPINGUARD_REPORT={}/r.%e.%p.json\n",
        node.node_out().display()
    );
    let caller = format!("{}/c.%p.json", node.caller().display());
    let o = node.run(
        Some(NodeFile::root(&conf)),
        &[
            ("PINGUARD_BUDGET", "1G"),
            ("PINGUARD_REPORT", &caller),
            // Nor do the switches read before start-up.
            ("PINGUARD_DISABLE", "1"),
            ("PINGUARD_HOOKS", "cuda"),
        ],
        &["lock:64"],
    );
    let (out, err) = text(&o);
    let (rc, kb) = lock_line(&out, 0);
    assert!(
        rc != 0 && kb == 0,
        "the node's 16K budget refuses 64 KiB:\n{out}\n{err}"
    );
    assert_eq!(files_in(&node.caller()), Vec::<PathBuf>::new());
    let reports = files_in(&node.node_out());
    assert_eq!(
        reports.len(),
        1,
        "the report where the node file says: {reports:?}\n{err}"
    );
    let r = read_report(&reports[0]);
    assert_eq!(r.config.budget_bytes, Some(16384), "{r:?}");
    assert_eq!(r.totals.denied_count, 1, "{r:?}");
    let errors = r.config.errors.join("\n");
    assert!(
        errors.contains("secure-mode") && errors.contains("4 PINGUARD_* variable(s)"),
        "{errors}"
    );
}

#[test]
fn an_untrusted_node_file_is_ignored_with_one_line() {
    if !can_run("untrusted") {
        return;
    }
    let node = Node::new("untrusted");
    let conf = "PINGUARD_BUDGET=0\n";
    let cases = [
        (
            NodeFile {
                user_owned: true,
                ..NodeFile::root(conf)
            },
            "is owned by uid",
        ),
        (
            NodeFile {
                mode: "666",
                ..NodeFile::root(conf)
            },
            "is writable by others than its owner (mode 666)",
        ),
        (
            NodeFile {
                folder_mode: "777",
                ..NodeFile::root(conf)
            },
            "is in a folder writable by others than its owner (mode 777)",
        ),
    ];
    for (file, why) in cases {
        let o = node.run(Some(file), &[], &["lock:64"]);
        let (out, err) = text(&o);
        assert_eq!(
            lock_line(&out, 0),
            (0, 64),
            "{why}: the file is not obeyed:\n{out}\n{err}"
        );
        let lines: Vec<&str> = pinguard_lines(&err)
            .into_iter()
            .filter(|l| l.contains(NODE_FILE))
            .collect();
        assert_eq!(lines.len(), 1, "{why}:\n{err}");
        assert!(
            lines[0].contains(why) && lines[0].ends_with("ignored, its settings are not used"),
            "{}",
            lines[0]
        );
    }
}

/// A node file reached through `PINGUARD_CONFIG`, in a fresh root-owned folder.
fn config_file(tag: &str, text: &str) -> (PathBuf, PathBuf) {
    let dir = fresh_dir(tag).join("etc");
    std::fs::create_dir(&dir).unwrap();
    chmod(&dir, "755");
    let file = dir.join("node.conf");
    std::fs::write(&file, text).unwrap();
    chmod(&file, "644");
    (dir, file)
}

#[test]
fn outside_secure_mode_the_environment_overrides_the_file() {
    let (_dir, file) = config_file(
        "override",
        "PINGUARD_BUDGET=16K\nPINGUARD_POLICY=warn\nPINGUARD_DEPTH=999\nPINGUARD_BUGDET=1\nnonsense\n",
    );
    let r = run(
        "scenario",
        &["mlock:0:16"],
        &[
            ("PINGUARD_CONFIG", file.to_str().unwrap()),
            ("PINGUARD_BUDGET", "1M"),
        ],
    );
    assert!(r.success(), "{}", r.stderr);
    let rep = r.typed_report();
    let c = &rep.config;
    assert_eq!(c.budget_bytes, Some(1 << 20), "the environment's: {c:?}");
    assert_eq!(c.policy, "warn", "the file's: {c:?}");
    assert_eq!(c.depth, 32, "a bad value from the file falls back: {c:?}");
    let errors: Vec<&str> = c.errors.iter().map(String::as_str).collect();
    let at = |line: usize| format!("{}:{line}: ", file.display());
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(
        errors.iter().any(|e| e.starts_with(&at(3))
            && e.contains("PINGUARD_DEPTH=\"999\"")
            && e.ends_with("using 32")),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with(&at(4)) && e.contains("did you mean PINGUARD_BUDGET")),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with(&at(5)) && e.contains("is not NAME=value")),
        "{errors:#?}"
    );
    // The same lines on stderr, one each.
    for e in &errors {
        assert_eq!(
            pinguard_lines(&r.stderr)
                .iter()
                .filter(|l| l.ends_with(e))
                .count(),
            1,
            "{e}\n{}",
            r.stderr
        );
    }
}

#[test]
fn outside_secure_mode_another_users_file_is_ignored_and_an_empty_name_means_none() {
    let (dir, file) = config_file("other-user", "PINGUARD_POLICY=warn\n");
    let owned = Command::new("chown")
        .args(["65534"])
        .arg(&file)
        .status()
        .is_ok_and(|s| s.success());
    if !owned {
        eprintln!("NOT RUN: needs root to give the file to another user");
        return;
    }
    let r = run(
        "scenario",
        &["mlock:0:1"],
        &[("PINGUARD_CONFIG", file.to_str().unwrap())],
    );
    let rep = r.typed_report();
    assert_eq!(rep.config.policy, "error");
    let errors = rep.config.errors.join("\n");
    assert!(
        errors.contains(&format!(
            "node configuration {} is owned by uid 65534, not root",
            file.display()
        )),
        "{errors}"
    );
    // Given back to root: it is read; named empty: no file at all, and nothing said.
    assert!(Command::new("chown")
        .arg("0")
        .arg(&file)
        .status()
        .unwrap()
        .success());
    let r = run(
        "scenario",
        &["mlock:0:1"],
        &[("PINGUARD_CONFIG", file.to_str().unwrap())],
    );
    assert_eq!(r.typed_report().config.policy, "warn");
    let r = run("scenario", &["mlock:0:1"], &[("PINGUARD_CONFIG", "")]);
    let rep = r.typed_report();
    assert_eq!(rep.config.policy, "error");
    assert_eq!(rep.config.errors, Vec::<String>::new(), "{}", r.stderr);
    drop(dir);
}

#[test]
fn a_link_a_fifo_and_a_large_file_are_ignored_without_blocking() {
    let (dir, good) = config_file("kinds", "PINGUARD_POLICY=warn\n");
    let link = dir.join("link.conf");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    let fifo = dir.join("fifo.conf");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    chmod(&fifo, "644");
    let large = dir.join("large.conf");
    std::fs::write(&large, "# padding\n".repeat(7000)).unwrap();
    chmod(&large, "644");
    for (path, why) in [
        (&link, "is not a regular file (a link is never followed)"),
        (&fifo, "is not a regular file (a link is never followed)"),
        (&large, "is 70000 bytes, more than the 65536 read"),
    ] {
        let f = fixtures();
        let out_dir = fresh_dir("kinds-run");
        let mut cmd = command_in(&f.dir.join("scenario"), &out_dir, true);
        cmd.args(["mlock:0:1"]).env("PINGUARD_CONFIG", path);
        let out = run_bounded(&mut cmd, Duration::from_secs(30));
        let r = Run::from_output(out, out_dir);
        let rep = r.typed_report();
        assert_eq!(rep.config.policy, "error", "{why}");
        let errors = rep.config.errors.join("\n");
        assert!(
            errors.contains(&format!("node configuration {} {why}", path.display())),
            "{errors}"
        );
    }
}
