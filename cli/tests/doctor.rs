//! `pinguard doctor` against real cgroup v1 memory groups (root creates them), stand-in cgroup v2
//! files bind-mounted over this process's own `/proc` entries in a mount namespace, and the
//! emulated runtimes, whose pinned pages are charged (mlocked) or, with `EMU_NO_PIN`, not.

use crate::common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const V1: &str = "/sys/fs/cgroup/memory";

fn doctor(pre: &str, args: &[&str], env: &[(&str, &str)]) -> (Output, Value) {
    let f = fixtures();
    let script = format!("{pre} exec \"$0\" doctor \"$@\"");
    let mut c = Command::new("sh");
    c.args(["-c", &script, env!("CARGO_BIN_EXE_pinguard")])
        .args(args)
        .env("LD_LIBRARY_PATH", &f.dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    let v = if args.contains(&"--json") {
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"))
    } else {
        Value::Null
    };
    (o, v)
}

/// A v1 memory group for one test, removed (with its children) when dropped.
struct Group(PathBuf);

impl Group {
    fn new(parent: &Path, name: &str, limit: Option<u64>) -> Option<Group> {
        let dir = parent.join(name);
        std::fs::create_dir(&dir).ok()?;
        if let Some(l) = limit {
            std::fs::write(dir.join("memory.limit_in_bytes"), l.to_string()).unwrap();
        }
        Some(Group(dir))
    }

    fn join(&self) -> String {
        format!("echo $$ > {}/cgroup.procs &&", self.0.display())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The v1 memory hierarchy, where this machine has one and the test may create groups in it.
fn v1_root(test: &str) -> Option<PathBuf> {
    let root = PathBuf::from(V1);
    let probe = root.join(format!("pinguard-probe-{}-{test}", std::process::id()));
    if std::fs::create_dir(&probe).is_err() {
        eprintln!("NOT RUN: {test}: cannot create a cgroup v1 memory group under {V1} (needs root and a v1 memory hierarchy)");
        assert!(
            std::env::var_os("PGTEST_REQUIRE_ALL").is_none(),
            "{test} must run here"
        );
        return None;
    }
    let _ = std::fs::remove_dir(&probe);
    Some(root)
}

fn probe_of<'a>(v: &'a Value, path: &str) -> &'a Value {
    v["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["path"] == path)
        .unwrap_or_else(|| panic!("no {path} probe: {v}"))
}

#[test]
fn a_nested_v1_limit_is_found_and_the_probe_sees_which_paths_it_counts() {
    let Some(root) = v1_root("nested") else {
        return;
    };
    let parent = Group::new(
        &root,
        &format!("pinguard-doctor-{}", std::process::id()),
        Some(512 << 20),
    )
    .unwrap();
    let child = Group::new(&parent.0, "worker", None).unwrap();
    let (o, v) = doctor(
        &child.join(),
        &["--probe", "--probe-size", "16Mi", "--json"],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(v["cgroup"]["version"], "v1");
    assert_eq!(v["cgroup"]["dir"], child.0.to_str().unwrap());
    assert_eq!(
        v["cgroup"]["limit_bytes"],
        512u64 << 20,
        "the parent's limit is the tightest"
    );
    assert_eq!(v["cgroup"]["limit_dir"], parent.0.to_str().unwrap());
    let headroom = v["cgroup"]["headroom_bytes"].as_u64().unwrap();
    assert!(headroom > 400 << 20 && headroom <= 512 << 20, "{headroom}");
    // The emulated runtimes lock their pages with mlock: user pages, charged to the group.
    for path in [
        "mlock",
        "cudaHostAlloc",
        "cudaHostRegister",
        "aclrtMallocHost",
    ] {
        let p = probe_of(&v, path);
        assert_eq!(p["counted"], true, "{path}: {p}");
        let moved = p["usage_delta_bytes"].as_i64().unwrap();
        assert!(
            (12 << 20..=20 << 20).contains(&moved),
            "{path} moved the group by {moved}"
        );
        // Which of the process's counters the path moves: mlock'ed pages are VmLck's, not VmPin's.
        let lck = p["vm_lck_delta_bytes"].as_i64().unwrap();
        assert!((16 << 20..=17 << 20).contains(&lck), "{path}: VmLck {p}");
        assert_eq!(p["vm_pin_delta_bytes"], 0, "{path}: {p}");
        assert_eq!(p["rss_shmem_delta_bytes"], 0, "{path}: {p}");
    }
    assert!(
        v["verdict"].as_str().unwrap().starts_with("contained"),
        "{v}"
    );

    // Pages the runtime hands out without charging them (EMU_NO_PIN: never faulted in, as a
    // driver's own allocation is not charged): the verdict names the path, exit 1.
    let (o, v) = doctor(
        &child.join(),
        &["--probe", "--probe-size", "16Mi", "--json"],
        &[("EMU_NO_PIN", "1")],
    );
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_eq!(probe_of(&v, "cudaHostAlloc")["counted"], false);
    assert_eq!(probe_of(&v, "mlock")["counted"], true);
    let verdict = v["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("not contained") && verdict.contains("cudaHostAlloc"),
        "{verdict}"
    );
    let (o, _) = doctor(
        &child.join(),
        &["--probe", "--probe-size", "16Mi"],
        &[("EMU_NO_PIN", "1")],
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("cudaHostAlloc     NOT counted by the limit"),
        "{text}"
    );
    assert!(
        text.contains("mlock             counted by the limit"),
        "{text}"
    );
    assert!(
        text.contains("; VmLck +16.0 MiB, VmPin +0 B, RssShmem +0 B\n"),
        "{text}"
    );
}

#[test]
fn no_limit_on_the_path_is_not_contained_and_a_close_limit_is_not_probed() {
    let Some(root) = v1_root("nolimit") else {
        return;
    };
    let g = Group::new(
        &root,
        &format!("pinguard-doctor-free-{}", std::process::id()),
        None,
    )
    .unwrap();
    let (o, v) = doctor(&g.join(), &["--json"], &[]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_eq!(v["cgroup"]["limit_bytes"], Value::Null);
    assert!(
        v["verdict"].as_str().unwrap().contains("no memory limit"),
        "{v}"
    );
    // A group with less headroom than four probes: nothing is pinned, and doctor cannot tell.
    let tight = Group::new(
        &root,
        &format!("pinguard-doctor-tight-{}", std::process::id()),
        Some(48 << 20),
    )
    .unwrap();
    let (o, v) = doctor(
        &tight.join(),
        &["--probe", "--probe-size", "16Mi", "--json"],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        probe_of(&v, "mlock")["note"]
            .as_str()
            .unwrap()
            .contains("headroom"),
        "{v}"
    );
}

/// cgroup v2 as a container sees it, from stand-in files: this process's `/proc/<pid>/cgroup`
/// and `mountinfo` are bind-mounted over in a mount namespace of its own, then doctor is exec'd
/// in the same process.
#[test]
fn stand_in_v2_files_give_the_tightest_limit_and_headroom() {
    let dir = fresh_dir("doctor-v2");
    let cg = dir.join("cg");
    std::fs::create_dir_all(cg.join("pod/ctr")).unwrap();
    for (f, text) in [
        ("pod/memory.max", "268435456\n"),
        ("pod/memory.current", "125829120\n"),
        ("pod/memory.stat", "anon 1\ninactive_file 10485760\n"),
        ("pod/ctr/memory.max", "max\n"),
        ("pod/ctr/memory.current", "104857600\n"),
        ("pod/ctr/memory.stat", "anon 1\ninactive_file 10485760\n"),
    ] {
        std::fs::write(cg.join(f), text).unwrap();
    }
    std::fs::write(dir.join("cgroup"), "0::/pod/ctr\n").unwrap();
    std::fs::write(
        dir.join("mountinfo"),
        format!("60 40 0:26 / {} rw - cgroup2 cgroup2 rw\n", cg.display()),
    )
    .unwrap();
    let pre = format!("mount --bind {0}/cgroup /proc/$$/cgroup && mount --bind {0}/mountinfo /proc/$$/mountinfo &&", dir.display());
    let f = fixtures();
    let o = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            &format!("{pre} exec \"$0\" doctor --json"),
            env!("CARGO_BIN_EXE_pinguard"),
        ])
        .env("LD_LIBRARY_PATH", &f.dir)
        .env("PINGUARD_BUDGET", "8 gigs")
        .env("PINGUARD_GROUP_BUDGET", "8Gi")
        .env("PINGUARD_POLICY", " Warn")
        .env("PINGUARD_HOOKS", "cuda,opencl")
        .output()
        .unwrap();
    if !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("unshare") {
        eprintln!(
            "NOT RUN: a mount namespace could not be made: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(std::env::var_os("PGTEST_REQUIRE_ALL").is_none());
        return;
    }
    assert_eq!(
        o.status.code(),
        Some(2),
        "a limit, no probe: could not tell which paths it counts: {o:?}"
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cgroup"]["version"], "v2");
    assert_eq!(v["cgroup"]["limit_bytes"], 256u64 << 20);
    assert_eq!(v["cgroup"]["limit_dir"], cg.join("pod").to_str().unwrap());
    // The pod's 256 MiB less its 120 MiB used plus 10 MiB of cache.
    assert_eq!(v["cgroup"]["headroom_bytes"], 146u64 << 20);
    assert_eq!(v["cgroup"]["kernel_memory_accounted"], true);
    let settings = v["settings"].as_array().unwrap();
    let budget = settings
        .iter()
        .find(|s| s["name"] == "PINGUARD_BUDGET")
        .unwrap();
    assert!(
        budget["error"]
            .as_str()
            .unwrap()
            .contains("running WITHOUT a budget"),
        "{budget}"
    );
    let group = settings
        .iter()
        .find(|s| s["name"] == "PINGUARD_GROUP_BUDGET")
        .unwrap();
    assert!(group.get("error").is_none(), "{group}");
    // Every variable as the library reads it (its registry parser): any case of a policy is one.
    let policy = settings
        .iter()
        .find(|s| s["name"] == "PINGUARD_POLICY")
        .unwrap();
    assert!(policy.get("error").is_none(), "{policy}");
    let hooks = settings
        .iter()
        .find(|s| s["name"] == "PINGUARD_HOOKS")
        .unwrap();
    assert_eq!(hooks["error"], "PINGUARD_HOOKS=\"cuda,opencl\": unknown family \"opencl\"; expected a comma list of cuda, cuda-driver, acl, mlock, hip, ibverbs, ascend-hal, or all; hooking all of them", "{hooks}");
}

#[test]
fn bad_options_get_one_line_and_exit_2() {
    let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .args(["doctor", "--probe-size", "lots"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--probe-size") && !err.contains("panicked"),
        "{err}"
    );
}

/// The node configuration file (issue 43 item 2): which one, whether it is in force, and each
/// value in force with where it came from; the environment's over the file's.
#[test]
fn doctor_shows_the_node_file_and_where_each_value_comes_from() {
    let dir = std::env::temp_dir().join(format!("pinguard-doctor-node-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("node.conf");
    std::fs::write(
        &file,
        "# node\nPINGUARD_BUDGET=16K\nPINGUARD_POLICY=warn\nPINGUARD_DEPTH=999\nnonsense\n",
    )
    .unwrap();
    let mode = |p: &Path, m: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    mode(&dir, 0o755);
    mode(&file, 0o644);
    let named = file.to_str().unwrap();
    let env = [("PINGUARD_CONFIG", named), ("PINGUARD_BUDGET", "1M")];
    let (o, v) = doctor("", &["--json"], &env);
    let node = &v["node_config"];
    assert_eq!(node["path"], named, "{o:?}");
    assert_eq!(
        (&node["state"], &node["in_force"]),
        (&"in force".into(), &true.into()),
        "{node}"
    );
    assert!(
        node["problems"][0]
            .as_str()
            .is_some_and(|p| p.starts_with(&format!("{named}:5: ")) && p.contains("not NAME=value")),
        "{node}"
    );
    let settings = v["settings"].as_array().unwrap();
    let find = |name: &str, source: &str| {
        settings
            .iter()
            .find(|s| s["name"] == name && s["source"] == source)
            .unwrap_or_else(|| panic!("{name} from {source}: {settings:?}"))
    };
    assert_eq!(find("PINGUARD_BUDGET", "environment")["value"], "1M");
    let from_file = find("PINGUARD_BUDGET", &format!("{named}:2"));
    assert_eq!(
        (&from_file["value"], &from_file["overridden"]),
        (&"16K".into(), &true.into())
    );
    let policy = find("PINGUARD_POLICY", &format!("{named}:3"));
    assert!(
        policy.get("overridden").is_none() && policy.get("error").is_none(),
        "{policy}"
    );
    let depth = find("PINGUARD_DEPTH", &format!("{named}:4"));
    assert!(
        depth["error"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{named}:4: PINGUARD_DEPTH=\"999\"")),
        "{depth}"
    );
    // In words too.
    let (o, _) = doctor("", &[], &env);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("node configuration: {named} (in force)")),
        "{text}"
    );
    assert!(
        text.contains(&format!("PINGUARD_POLICY=warn ({named}:3)")),
        "{text}"
    );
    assert!(
        text.contains(&format!("PINGUARD_BUDGET=16K ({named}:2; overridden)")),
        "{text}"
    );
    // Writable by others: ignored, and said why; none named: none.
    mode(&file, 0o666);
    let (_, v) = doctor("", &["--json"], &env);
    assert_eq!(v["node_config"]["in_force"], false);
    assert!(
        v["node_config"]["state"]
            .as_str()
            .unwrap()
            .contains("is writable by others than its owner (mode 666)"),
        "{v}"
    );
    assert!(v["settings"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["source"] == "environment"));
    let (_, v) = doctor("", &["--json"], &[("PINGUARD_CONFIG", "")]);
    assert_eq!(v["node_config"]["path"], Value::Null);
    let (_, v) = doctor("", &["--json"], &[]);
    assert_eq!(v["node_config"]["path"], "/etc/pinguard/pinguard.conf");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The probe's room: `--probe-size` unset, a 64 MiB group (a quarter of its headroom is well
/// under the default 32 MiB) is probed with what fits it, and says so.
#[test]
fn a_64_mib_group_is_probed_with_a_size_that_fits_its_headroom() {
    let Some(root) = v1_root("small") else {
        return;
    };
    let g = Group::new(
        &root,
        &format!("pinguard-doctor-small-{}", std::process::id()),
        Some(64 << 20),
    )
    .unwrap();
    let (o, v) = doctor(&g.join(), &["--probe", "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{o:?}\n{v}");
    let headroom = v["cgroup"]["headroom_bytes"].as_u64().unwrap();
    let size = v["probe_size"]["bytes"].as_u64().unwrap();
    assert!(size >= 1 << 20 && size <= headroom / 4, "{size} {headroom}");
    assert!(
        v["probe_size"]["chosen"]
            .as_str()
            .unwrap()
            .starts_with("a quarter of the cgroup's headroom"),
        "{v}"
    );
    assert_eq!(probe_of(&v, "mlock")["counted"], true, "{v}");
    assert_eq!(probe_of(&v, "mlock")["bytes"], size);
    // Each figure names its file in the JSON too.
    let c = &v["cgroup"];
    assert_eq!(
        c["limit_file"],
        g.0.join("memory.limit_in_bytes").to_str().unwrap()
    );
    assert!(c["place_source"]
        .as_str()
        .unwrap()
        .contains("/proc/self/cgroup"));
    assert!(c["headroom_source"]
        .as_str()
        .unwrap()
        .contains("memory.limit_in_bytes"));
    assert_eq!(v["host"]["source"], "/proc/meminfo");
    assert_eq!(v["rlimit_memlock"]["source"], "getrlimit(RLIMIT_MEMLOCK)");
    let (o, _) = doctor(&g.join(), &["--probe"], &[]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(" (a quarter of the cgroup's headroom of ")
            && text.contains("--probe-size sets it"),
        "{text}"
    );
}

/// Without `CAP_IPC_LOCK` (dropped from root's bounding set) under an 8 MiB `RLIMIT_MEMLOCK`,
/// the probe pins what the limit leaves, and doctor says the limit binds; as root it says the
/// limit does not.
#[test]
fn the_probe_fits_rlimit_memlock_without_cap_ipc_lock_and_root_is_said_unbound() {
    let Some(root) = v1_root("rlimit") else {
        return;
    };
    let g = Group::new(
        &root,
        &format!("pinguard-doctor-rlimit-{}", std::process::id()),
        Some(512 << 20),
    )
    .unwrap();
    let pre = format!(
        "{} ulimit -l 8192 && exec setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \"$0\" doctor \"$@\";",
        g.join()
    );
    let (o, v) = doctor(&pre, &["--probe", "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{o:?}\n{v}");
    assert_eq!(v["rlimit_memlock"]["cap_ipc_lock"], false, "{v}");
    assert_eq!(v["rlimit_memlock"]["binds"], true, "{v}");
    let size = v["probe_size"]["bytes"].as_u64().unwrap();
    assert!((1 << 20..=8 << 20).contains(&size), "{v}");
    assert!(
        v["probe_size"]["chosen"]
            .as_str()
            .unwrap()
            .contains("RLIMIT_MEMLOCK"),
        "{v}"
    );
    for path in ["mlock", "cudaHostAlloc"] {
        assert_eq!(probe_of(&v, path)["counted"], true, "{path}: {v}");
    }
    let (o, _) = doctor(&pre, &["--probe"], &[]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("RLIMIT_MEMLOCK: 8.00 MiB soft, 8.00 MiB hard (getrlimit); binds this process (no CAP_IPC_LOCK)"),
        "{text}"
    );
    let (o, v) = doctor("", &["--json"], &[]);
    assert_eq!(v["rlimit_memlock"]["cap_ipc_lock"], true, "{o:?}");
    let (o, _) = doctor("", &[], &[]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("does not bind this process: it holds CAP_IPC_LOCK (root does by default)"),
        "{text}"
    );
}

/// A runtime's refusal is named (`cudaErrorMemoryAllocation (2)`, and HIP's own names where the
/// real runtime is installed), and a percentage setting is shown in bytes.
#[test]
fn runtime_codes_are_named_and_percentages_shown_in_bytes() {
    let (o, v) = doctor(
        "",
        &["--probe", "--probe-size", "1Mi", "--json"],
        &[("EMU_FAIL_EVERY", "1"), ("PINGUARD_BUDGET", "10%")],
    );
    assert!(o.status.code().is_some(), "{o:?}");
    let note = probe_of(&v, "cudaHostAlloc")["note"].as_str().unwrap();
    assert_eq!(
        note, "could not pin: cudaHostAlloc returned cudaErrorMemoryAllocation (2)",
        "{v}"
    );
    let budget = v["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "PINGUARD_BUDGET")
        .unwrap();
    let base = v["cgroup"]["limit_bytes"]
        .as_u64()
        .or(v["host"]["mem_total_bytes"].as_u64())
        .unwrap();
    assert_eq!(budget["bytes"], (base as f64 * 0.1) as u64, "{budget}");
    let (o, _) = doctor("", &[], &[("PINGUARD_BUDGET", "10%")]);
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("  PINGUARD_BUDGET=10% = "))
        .expect(&text);
    assert!(
        line.contains(&format!("({} bytes) of ", (base as f64 * 0.1) as u64)),
        "{line}"
    );
    let hip = probe_of(&v, "hipHostMalloc")["note"].as_str().unwrap_or("");
    if !std::path::Path::new("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5").exists() {
        eprintln!("NOT RUN: the real HIP runtime's names (libamdhip64.so.5 not installed)");
        return;
    }
    assert!(
        hip.contains("hipErrorInvalidDevice (101)") && hip.contains("hipErrorNoDevice (100)"),
        "{hip}"
    );
}
