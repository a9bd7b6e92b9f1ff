//! `pinguard cdi`: the Container Device Interface spec that preloads the library into containers.
//! Checked here against what the CDI specification requires of a spec (the fields, the name
//! rules, the versions, no field a strict reader rejects); `scripts/deploy-check.sh` also checks
//! it with CDI's JSON schema, and the container suite runs podman with it.

use serde_json::Value;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn pinguard_at(exe: &Path, args: &[&str]) -> Output {
    Command::new(exe).args(args).output().unwrap()
}

fn pinguard(args: &[&str]) -> Output {
    pinguard_at(Path::new(env!("CARGO_BIN_EXE_pinguard")), args)
}

/// The library cargo built beside this test (any regular file would do for the spec; the real
/// one keeps the test honest about paths).
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libpinguard.so");
    assert!(
        lib.is_file(),
        "{} missing: cargo builds it before the tests",
        lib.display()
    );
    lib
}

fn fresh(tag: &str) -> PathBuf {
    let d =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cdi-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn spec_of(o: &Output) -> Value {
    assert!(o.status.success(), "{o:?}");
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON: {e}\n{}", String::from_utf8_lossy(&o.stdout)))
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

/// CDI's rules for a kind (`vendor/class`) and a device name, as its qualified-name parser has
/// them: vendor labels of letters and digits joined by '.' or '-', class and name of letters,
/// digits, '_' and '-' (a name may also hold '.' and ':'), each starting and ending with a
/// letter or digit.
fn cdi_name(s: &str, extra: &[char]) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
}

/// Every field CDI requires, each in its type, and no field outside the spec (podman's CDI
/// reader parses strictly: an unknown field fails the whole spec).
fn assert_cdi(spec: &Value) {
    for k in keys(spec) {
        assert!(
            [
                "cdiVersion",
                "kind",
                "devices",
                "containerEdits",
                "annotations"
            ]
            .contains(&k),
            "unknown top-level field {k}"
        );
    }
    let version = spec["cdiVersion"].as_str().expect("cdiVersion, a string");
    // Versions 0.1.0 to 0.5.0 are what Debian 12's podman reads; a mount's `type` needs 0.4.0.
    assert!(
        ["0.4.0", "0.5.0"].contains(&version),
        "cdiVersion {version}"
    );
    let (vendor, class) = spec["kind"]
        .as_str()
        .expect("kind, a string")
        .split_once('/')
        .expect("kind is vendor/class");
    assert!(
        cdi_name(vendor, &['.', '-']) && cdi_name(class, &['_', '-']),
        "kind {}",
        spec["kind"]
    );
    let devices = spec["devices"].as_array().expect("devices, an array");
    assert!(!devices.is_empty());
    for d in devices {
        for k in keys(d) {
            assert!(
                ["name", "containerEdits", "annotations"].contains(&k),
                "unknown device field {k}"
            );
        }
        assert!(
            cdi_name(
                d["name"].as_str().expect("device name"),
                &['_', '-', '.', ':']
            ),
            "{}",
            d["name"]
        );
        let edits = &d["containerEdits"];
        for k in keys(edits) {
            assert!(
                ["env", "deviceNodes", "mounts", "hooks"].contains(&k),
                "unknown edit {k}"
            );
        }
        for e in edits["env"].as_array().expect("env, an array") {
            let (k, _) = e
                .as_str()
                .expect("env entries are strings")
                .split_once('=')
                .expect("env entries are KEY=VALUE");
            assert!(!k.is_empty(), "{e}");
        }
        for m in edits["mounts"].as_array().expect("mounts, an array") {
            for k in keys(m) {
                assert!(
                    ["hostPath", "containerPath", "options", "type"].contains(&k),
                    "unknown mount field {k}"
                );
            }
            assert!(
                m["hostPath"].as_str().expect("hostPath").starts_with('/'),
                "{m}"
            );
            assert!(
                m["containerPath"]
                    .as_str()
                    .expect("containerPath")
                    .starts_with('/'),
                "{m}"
            );
            assert!(
                m["options"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(Value::is_string),
                "{m}"
            );
        }
    }
}

fn env_of(spec: &Value) -> Vec<(String, String)> {
    let env = spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap();
    env.iter()
        .map(|e| {
            e.as_str()
                .unwrap()
                .split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .unwrap()
        })
        .collect()
}

fn mount_at<'a>(spec: &'a Value, container_path: &str) -> &'a Value {
    let mounts = spec["devices"][0]["containerEdits"]["mounts"]
        .as_array()
        .unwrap();
    mounts
        .iter()
        .find(|m| m["containerPath"] == container_path)
        .unwrap_or_else(|| panic!("no mount at {container_path}: {spec}"))
}

#[test]
fn the_spec_preloads_the_library_from_a_read_only_mount() {
    let lib = library();
    let spec = spec_of(&pinguard(&["cdi", "--lib", lib.to_str().unwrap()]));
    assert_cdi(&spec);
    assert_eq!(spec["kind"], "pinguard.dev/preload");
    assert_eq!(spec["devices"].as_array().unwrap().len(), 1);
    assert_eq!(spec["devices"][0]["name"], "default");
    // The library comes through the containers' /etc/ld.so.preload, so that an image's own
    // LD_PRELOAD (jemalloc, tcmalloc) is left as it is (issue 46 item 16).
    assert_eq!(env_of(&spec), vec![]);
    let list = mount_at(&spec, "/etc/ld.so.preload");
    assert_eq!(
        std::fs::read_to_string(list["hostPath"].as_str().unwrap()).unwrap(),
        "/opt/pinguard/libpinguard.so\n"
    );
    assert!(list["options"].as_array().unwrap().contains(&"ro".into()));
    let m = mount_at(&spec, "/opt/pinguard/libpinguard.so");
    assert_eq!(m["hostPath"], lib.to_str().unwrap());
    let opts: Vec<&str> = m["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap())
        .collect();
    assert!(
        opts.contains(&"ro") && opts.contains(&"bind") && !opts.contains(&"noexec"),
        "{opts:?}"
    );

    // Another container path; a relative --lib becomes absolute (runtimes refuse relative host
    // paths), a symbolic link is kept so that updating it updates what containers get.
    let dir = fresh("paths");
    std::os::unix::fs::symlink(&lib, dir.join("libpinguard.so")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_pinguard"))
        .current_dir(&dir)
        .args([
            "cdi",
            "--lib",
            "libpinguard.so",
            "--container-path",
            "/usr/lib/pg.so",
        ])
        .output()
        .unwrap();
    let spec = spec_of(&o);
    assert_cdi(&spec);
    assert_eq!(
        std::fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
        "/usr/lib/pg.so\n",
        "the list beside the library names the container path"
    );
    assert_eq!(
        mount_at(&spec, "/etc/ld.so.preload")["hostPath"],
        dir.join("ld.so.preload").to_str().unwrap()
    );
    assert_eq!(
        mount_at(&spec, "/usr/lib/pg.so")["hostPath"],
        dir.join("libpinguard.so").to_str().unwrap()
    );
}

#[test]
fn metrics_dir_and_settings_reach_every_container() {
    let lib = library();
    let textfile = fresh("textfile");
    let t = textfile.to_str().unwrap();
    let args = [
        "cdi",
        "--lib",
        lib.to_str().unwrap(),
        "--metrics-dir",
        t,
        "--env",
        "PINGUARD_GROUP=inference",
        "--env",
        "PINGUARD_GROUP_BUDGET=8GiB",
        "--env",
        "TZ=UTC",
    ];
    let spec = spec_of(&pinguard(&args));
    assert_cdi(&spec);
    let env = env_of(&spec);
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(
        get("PINGUARD_METRICS"),
        Some(format!("{t}/pinguard.%h.%n.%p.prom").as_str())
    );
    assert_eq!(get("PINGUARD_GROUP"), Some("inference"));
    assert_eq!(get("PINGUARD_GROUP_BUDGET"), Some("8GiB"));
    assert_eq!(get("TZ"), Some("UTC"));
    assert_eq!(
        get("LD_PRELOAD"),
        None,
        "the image's own LD_PRELOAD is left alone"
    );
    // The textfile folder at the same path inside, writable: the collector reads what the
    // container's processes write.
    let m = mount_at(&spec, t);
    assert_eq!(m["hostPath"], t);
    assert!(
        m["options"].as_array().unwrap().iter().any(|o| o == "rw"),
        "{m}"
    );
}

/// Issue 44 item 9: with `--report-dir`, every container's reports go to a folder of the node's,
/// never to a container's working directory; `--env PINGUARD_REPORT` beside it is one error.
#[test]
fn report_dir_sends_every_containers_reports_to_a_host_folder() {
    let lib = library();
    let reports = fresh("reports");
    let r = reports.to_str().unwrap();
    let spec = spec_of(&pinguard(&[
        "cdi",
        "--lib",
        lib.to_str().unwrap(),
        "--report-dir",
        r,
    ]));
    assert_cdi(&spec);
    let env = env_of(&spec);
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(
        get("PINGUARD_REPORT"),
        Some(format!("{r}/pinguard.%h.%e.%n.%p.json").as_str())
    );
    let m = mount_at(&spec, r);
    assert_eq!(m["hostPath"], r);
    assert!(
        m["options"].as_array().unwrap().iter().any(|o| o == "rw"),
        "{m}"
    );
    let both = pinguard(&[
        "cdi",
        "--lib",
        lib.to_str().unwrap(),
        "--report-dir",
        r,
        "--env",
        "PINGUARD_REPORT=/x/%p.json",
    ]);
    assert_eq!(both.status.code(), Some(2), "{both:?}");
    assert!(String::from_utf8_lossy(&both.stderr).contains("--report-dir both set PINGUARD_REPORT"));
    let none = pinguard(&[
        "cdi",
        "--lib",
        lib.to_str().unwrap(),
        "--report-dir",
        "/no/such/dir",
    ]);
    assert_eq!(none.status.code(), Some(2), "{none:?}");
}

#[test]
fn output_file_is_replaced_whole_and_dash_is_stdout() {
    let lib = library();
    let l = lib.to_str().unwrap();
    let dir = fresh("out");
    let file = dir.join("pinguard.json");
    let f = file.to_str().unwrap();
    std::fs::write(&file, "an older spec").unwrap();
    let o = pinguard(&["cdi", "--lib", l, "-o", f]);
    assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    let stdout = pinguard(&["cdi", "--lib", l]).stdout;
    assert_eq!(
        std::fs::read(&file).unwrap(),
        stdout,
        "the file holds what stdout gets"
    );
    assert_eq!(pinguard(&["cdi", "--lib", l, "-o", "-"]).stdout, stdout);
    // Runtimes run as root, but the spec holds nothing secret, and people read it.
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("pinguard.json")],
        "no temporary file left"
    );
    // A folder that does not exist: one line, exit 2, nothing written.
    let o = pinguard(&[
        "cdi",
        "--lib",
        l,
        "-o",
        dir.join("no/such/dir.json").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    one_line(&o);
}

fn one_line(o: &Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("pinguard cdi: ") || err.starts_with("error: "),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(o.stdout.is_empty(), "no spec on a failure");
}

/// An installed layout: the command in `bin/`, the library in `../lib/` or beside it, found
/// without `--lib`; without either, one clear error.
#[test]
fn the_default_library_is_the_installed_one_and_a_missing_one_is_one_error() {
    let lib = library();
    let prefix = fresh("prefix");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::create_dir_all(prefix.join("lib")).unwrap();
    let exe = prefix.join("bin/pinguard");
    // A hard link, not a copy: a copy's descriptor, open for writing while another test thread
    // forks, would make running it fail with ETXTBSY. The running binary's path is the link's.
    std::fs::hard_link(env!("CARGO_BIN_EXE_pinguard"), &exe).unwrap();
    let o = pinguard_at(&exe, &["cdi"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    one_line(&o);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("libpinguard.so"),
        "{o:?}"
    );
    std::fs::copy(&lib, prefix.join("lib/libpinguard.so")).unwrap();
    let spec = spec_of(&pinguard_at(&exe, &["cdi"]));
    assert_eq!(
        mount_at(&spec, "/opt/pinguard/libpinguard.so")["hostPath"],
        prefix
            .join("lib/libpinguard.so")
            .canonicalize()
            .unwrap()
            .to_str()
            .unwrap()
    );
    let o = pinguard(&[
        "cdi",
        "--lib",
        prefix.join("lib/missing.so").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    one_line(&o);
}

#[test]
fn bad_options_get_one_line_and_exit_2() {
    let lib = library();
    let l = lib.to_str().unwrap();
    let dir = fresh("bad");
    let d = dir.to_str().unwrap();
    assert_cdi(&spec_of(&pinguard(&["cdi", "--lib", l])));
    let cases: &[&[&str]] = &[
        &["--env", "PINGUARD_GRUOP=x"],
        &["--env", "PINGUARD_GROUP_BUDGET=lots"],
        &["--env", "PINGUARD_GROUP=no/slash"],
        &["--env", "PINGUARD_POLICY=panic"],
        // Every pinguard variable is checked by its own parser (issue 35, item 4).
        &["--env", "PINGUARD_DEPTH=999"],
        &["--env", "PINGUARD_HOOKS=opencl"],
        &["--env", "LD_PRELOAD=/other.so"],
        &["--env", "NOEQUALS"],
        &["--env", "1X=2"],
        &["--env", "A=1", "--env", "A=2"],
        &["--metrics-dir", d, "--env", "PINGUARD_METRICS=/x/%p.prom"],
        &["--metrics-dir", "/no/such/textfile"],
        &["--container-path", "relative.so"],
        &["--container-path", "/opt/a b.so"],
        &["--container-path", "/opt/a:b.so"],
    ];
    for extra in cases {
        let mut a = vec!["cdi", "--lib", l];
        a.extend_from_slice(extra);
        let o = pinguard(&a);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("panicked") && o.stdout.is_empty(),
            "{extra:?}: {err}"
        );
        // The line names the option at fault (clap's own usage errors add a hint after it).
        assert!(
            err.lines().next().unwrap().contains(extra[extra.len() - 2]),
            "{extra:?}: {err}"
        );
        if !err.starts_with("error: ") {
            one_line(&o);
        }
    }
}

#[test]
fn preload_with_env_sets_ld_preload_and_a_list_is_written_only_when_it_changes() {
    use std::os::unix::fs::MetadataExt as _;
    let lib = library();
    let l = lib.to_str().unwrap();
    let spec = spec_of(&pinguard(&["cdi", "--lib", l, "--preload-with", "env"]));
    assert_cdi(&spec);
    assert_eq!(
        env_of(&spec),
        vec![("LD_PRELOAD".into(), "/opt/pinguard/libpinguard.so".into())]
    );
    let targets: Vec<&str> = spec["devices"][0]["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    assert_eq!(targets, ["/opt/pinguard/libpinguard.so"]);

    // --preload-list names the host's file; the same list again keeps the file (and the inode
    // running containers have mounted), another one replaces it whole.
    let dir = fresh("list");
    let list = dir.join("preload");
    let f = list.to_str().unwrap();
    let spec = spec_of(&pinguard(&["cdi", "--lib", l, "--preload-list", f]));
    assert_eq!(mount_at(&spec, "/etc/ld.so.preload")["hostPath"], f);
    let first = std::fs::metadata(&list).unwrap();
    assert_eq!(first.mode() & 0o777, 0o644);
    assert!(pinguard(&["cdi", "--lib", l, "--preload-list", f])
        .status
        .success());
    assert_eq!(std::fs::metadata(&list).unwrap().ino(), first.ino());
    let o = pinguard(&[
        "cdi",
        "--lib",
        l,
        "--preload-list",
        f,
        "--container-path",
        "/pg.so",
    ]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(std::fs::read_to_string(&list).unwrap(), "/pg.so\n");

    // A list that cannot be written: one line, exit 2, no spec.
    let o = pinguard(&[
        "cdi",
        "--lib",
        l,
        "--preload-list",
        dir.join("no/such").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty());
    one_line(&o);
    let o = pinguard(&["cdi", "--lib", l, "--preload-with", "neither"]);
    assert_eq!(o.status.code(), Some(2));
}

/// `--stage`: the first stage mounted beside the library and preloaded in its place, through the
/// list or `LD_PRELOAD`; without the stage beside the library, or with a container path the stage
/// would not find the library at, one line and exit 2.
#[test]
fn with_stage_the_spec_mounts_the_first_stage_beside_the_library_and_preloads_it() {
    let dir = fresh("stage");
    let deps = std::env::current_exe().unwrap();
    let stage = deps
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("libpinguard-lazy.so");
    assert!(
        stage.is_file(),
        "{} missing: build.rs builds it",
        stage.display()
    );
    std::os::unix::fs::symlink(library(), dir.join("libpinguard.so")).unwrap();
    let lib = dir.join("libpinguard.so");
    let o = pinguard(&["cdi", "--lib", lib.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
        "/opt/pinguard/libpinguard.so\n",
        "without --stage, the library"
    );
    let o = pinguard(&["cdi", "--stage", "--lib", lib.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "no stage beside the library: {o:?}"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--stage: no libpinguard-lazy.so beside"),
        "{o:?}"
    );
    std::os::unix::fs::symlink(&stage, dir.join("libpinguard-lazy.so")).unwrap();
    let spec = spec_of(&pinguard(&[
        "cdi",
        "--stage",
        "--lib",
        lib.to_str().unwrap(),
    ]));
    assert_cdi(&spec);
    assert_eq!(
        std::fs::read_to_string(dir.join("ld.so.preload")).unwrap(),
        "/opt/pinguard/libpinguard-lazy.so\n"
    );
    assert_eq!(
        mount_at(&spec, "/opt/pinguard/libpinguard.so")["hostPath"],
        lib.to_str().unwrap()
    );
    assert_eq!(
        mount_at(&spec, "/opt/pinguard/libpinguard-lazy.so")["hostPath"],
        dir.join("libpinguard-lazy.so").to_str().unwrap()
    );
    let spec = spec_of(&pinguard(&[
        "cdi",
        "--stage",
        "--preload-with",
        "env",
        "--lib",
        lib.to_str().unwrap(),
    ]));
    assert_eq!(
        env_of(&spec),
        vec![(
            "LD_PRELOAD".into(),
            "/opt/pinguard/libpinguard-lazy.so".into()
        )]
    );
    let o = pinguard(&[
        "cdi",
        "--stage",
        "--lib",
        lib.to_str().unwrap(),
        "--container-path",
        "/usr/lib/pg.so",
    ]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("must end in /libpinguard.so"),
        "{o:?}"
    );
}
