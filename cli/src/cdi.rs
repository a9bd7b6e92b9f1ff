//! `pinguard cdi`: a Container Device Interface spec for the installed library. A container that
//! asks for the device `pinguard.dev/preload=default` (podman and Docker `--device`, containerd
//! and CRI-O through their CDI support) gets the library mounted read-only and preloaded, without
//! rebuilding its image; the runtimes read the spec from /etc/cdi or /var/run/cdi.

use pinguard_common::vars;
use serde_json::{json, Value};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The device's kind (vendor/class); its one device is `default`.
pub const KIND: &str = "pinguard.dev/preload";
/// The newest spec version the CDI library of Debian 12's podman 4.3 reads (it lists 0.1.0 to
/// 0.5.0), and one every later library reads; mounts with a `type`, used here, need 0.4.0.
pub const CDI_VERSION: &str = "0.5.0";
/// Where the library appears in the containers unless `--container-path` says otherwise.
pub const CONTAINER_PATH: &str = "/opt/pinguard/libpinguard.so";
/// The metrics file in the textfile folder: the container's host name, its PID namespace and the
/// pid, as the library expands them (a pod's containers share the host name and may each be pid 1).
pub const METRICS_FILE: &str = "pinguard.%h.%n.%p.prom";

/// Where the loader of a glibc container reads the libraries to preload into every process.
pub const PRELOAD_LIST: &str = "/etc/ld.so.preload";
/// The host's copy of that list, beside the library unless `--preload-list` names another file.
pub const PRELOAD_LIST_FILE: &str = "ld.so.preload";

/// How the spec brings the library into a container's processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PreloadWith {
    /// A one-line list mounted at /etc/ld.so.preload: an `LD_PRELOAD` the image sets (jemalloc,
    /// tcmalloc) keeps working, and programs that clear their environment are reached too.
    #[value(name = "ld.so.preload")]
    LdSoPreload,
    /// `LD_PRELOAD` in the environment: it replaces one the image sets (CDI edits replace a
    /// variable, they cannot append to it), but leaves an image's own /etc/ld.so.preload visible.
    Env,
}

/// The reports' name in `--report-dir`: the PID namespace and pid keep the containers of a pod
/// (each its pid 1) apart, the host name the pods of a node.
pub const REPORT_FILE: &str = "pinguard.%h.%e.%n.%p.json";

pub struct Options {
    pub lib: Option<PathBuf>,
    pub container_path: String,
    pub metrics_dir: Option<PathBuf>,
    pub report_dir: Option<PathBuf>,
    pub env: Vec<(String, String)>,
    pub preload_with: PreloadWith,
    pub preload_list: Option<PathBuf>,
    /// Preload the first stage (`STAGE` beside the library), mounted beside it.
    pub stage: bool,
}

/// The first stage's file name: beside the library on the host, and in the containers, where it
/// loads `libpinguard.so` from its own folder.
pub const STAGE: &str = "libpinguard-lazy.so";

/// `--env KEY=VALUE`: a name a shell could export, and a value.
pub fn env_pair(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or("expected KEY=VALUE, such as PINGUARD_GROUP=inference")?;
    let name_ok = k
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !name_ok {
        return Err(format!(
            "{k:?} is not a variable name (letters, digits and '_', not starting with a digit)"
        ));
    }
    Ok((k.to_string(), v.to_string()))
}

/// The value of a pinguard variable checked by its own parser, as the library will read it: a
/// spec applied to every container of a node should not carry a value each of them rejects.
fn check_value(key: &str, value: &str) -> Result<(), String> {
    match vars::find(key) {
        Some(var) => var
            .check(value)
            .map_err(|e| format!("--env {key}={value}: {e}")),
        None => Ok(()),
    }
}

/// The extra settings: no variable twice, none the spec sets itself, no unknown `PINGUARD_`
/// name (a typo would otherwise reach every container of the node).
fn check_env(env: &[(String, String)], metrics: bool, reports: bool) -> Result<(), String> {
    for (i, (k, v)) in env.iter().enumerate() {
        if env[..i].iter().any(|(o, _)| o == k) {
            return Err(format!("--env {k} is given twice"));
        }
        if k == "LD_PRELOAD" {
            return Err("--env LD_PRELOAD: the spec preloads the library itself (choose its path with --container-path, the way with --preload-with)".into());
        }
        if metrics && k == vars::METRICS.name {
            return Err(format!(
                "--env {k} and --metrics-dir both set {k}: give one"
            ));
        }
        if reports && k == vars::REPORT.name {
            return Err(format!("--env {k} and --report-dir both set {k}: give one"));
        }
        if k.starts_with("PINGUARD_") && vars::find(k).is_none() {
            return Err(format!(
                "--env {k}: pinguard has no such variable (a typo?)"
            ));
        }
        check_value(k, v)?;
    }
    Ok(())
}

/// `LD_PRELOAD` splits its list at spaces and colons, so such a path would preload pieces of it.
fn check_container_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') || p.ends_with('/') {
        return Err(format!(
            "--container-path {p:?}: expected an absolute path to a file, such as {CONTAINER_PATH}"
        ));
    }
    if p.contains(|c: char| c == ':' || c.is_whitespace()) {
        return Err(format!(
            "--container-path {p:?}: LD_PRELOAD cannot hold a path with a colon or a space"
        ));
    }
    Ok(())
}

/// An absolute path for the host side of a mount (runtimes refuse relative ones); symbolic links
/// are kept, so a link the operator updates goes on pointing the spec at the new file.
fn absolute(p: &Path) -> Result<String, String> {
    let a = std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()))?;
    a.to_str().map(str::to_string).ok_or_else(|| {
        format!(
            "{}: not a UTF-8 path, which a CDI spec cannot hold",
            a.display()
        )
    })
}

fn metrics_dir(d: &Path) -> Result<String, String> {
    host_dir(
        d,
        "--metrics-dir",
        "node_exporter's textfile folder on this host",
    )
}

/// A folder of the host's that the spec mounts at the same path, or one line naming the option.
fn host_dir(d: &Path, option: &str, what: &str) -> Result<String, String> {
    if !d.is_dir() {
        return Err(format!(
            "{option} {}: no such directory ({what})",
            d.display()
        ));
    }
    absolute(d)
}

/// The spec, or one line saying which option is wrong.
pub fn spec(o: &Options) -> Result<Value, String> {
    check_container_path(&o.container_path)?;
    check_env(&o.env, o.metrics_dir.is_some(), o.report_dir.is_some())?;
    let lib_path = crate::run::find_library(o.lib.as_deref())?;
    let lib = absolute(&lib_path)?;
    let mut env = vec![];
    let mut mounts = vec![json!({
        "hostPath": lib,
        "containerPath": o.container_path,
        "type": "bind",
        "options": ["ro", "nosuid", "nodev", "bind"],
    })];
    let preload = match o.stage {
        false => o.container_path.clone(),
        true => {
            let (host, inside) = stage_paths(&lib_path, &o.container_path)?;
            mounts.push(json!({
                "hostPath": absolute(&host)?,
                "containerPath": inside,
                "type": "bind",
                "options": ["ro", "nosuid", "nodev", "bind"],
            }));
            inside
        }
    };
    match o.preload_with {
        PreloadWith::Env => env.push(format!("LD_PRELOAD={preload}")),
        PreloadWith::LdSoPreload => {
            let list = match &o.preload_list {
                Some(p) => p.clone(),
                None => lib_path.with_file_name(PRELOAD_LIST_FILE),
            };
            write_preload_list(&list, &preload)?;
            mounts.push(json!({
                "hostPath": absolute(&list)?,
                "containerPath": PRELOAD_LIST,
                "type": "bind",
                "options": ["ro", "nosuid", "nodev", "noexec", "bind"],
            }));
        }
    }
    if let Some(d) = &o.metrics_dir {
        let dir = metrics_dir(d)?;
        env.push(format!(
            "{}={}/{METRICS_FILE}",
            vars::METRICS.name,
            dir.trim_end_matches('/')
        ));
        mounts.push(json!({
            "hostPath": dir,
            "containerPath": dir,
            "type": "bind",
            "options": ["rw", "nosuid", "nodev", "noexec", "bind"],
        }));
    }
    if let Some(d) = &o.report_dir {
        // Reports in a folder of the node's, never in a container's working directory (issue 44
        // item 9).
        let dir = host_dir(
            d,
            "--report-dir",
            "a folder on this host for the containers' reports",
        )?;
        env.push(format!(
            "{}={}/{REPORT_FILE}",
            vars::REPORT.name,
            dir.trim_end_matches('/')
        ));
        mounts.push(json!({
            "hostPath": dir,
            "containerPath": dir,
            "type": "bind",
            "options": ["rw", "nosuid", "nodev", "noexec", "bind"],
        }));
    }
    env.extend(o.env.iter().map(|(k, v)| format!("{k}={v}")));
    Ok(json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{ "name": "default", "containerEdits": { "env": env, "mounts": mounts } }],
    }))
}

/// `--stage`: the first stage beside the library on the host, and where it goes in the
/// containers, beside the library, whose file it looks for there under its own name.
fn stage_paths(lib: &Path, container_path: &str) -> Result<(PathBuf, String), String> {
    let host = lib.with_file_name(STAGE);
    if !host.is_file() {
        return Err(format!(
            "--stage: no {STAGE} beside {} (a release has it in lib/; a build, in target/release/)",
            lib.display()
        ));
    }
    match container_path.strip_suffix("/libpinguard.so") {
        Some(dir) => Ok((host, format!("{dir}/{STAGE}"))),
        None => Err(format!(
            "--stage: the stage loads libpinguard.so from its own folder, so --container-path must end in /libpinguard.so, not {container_path:?}"
        )),
    }
}

/// The host's list for the containers' /etc/ld.so.preload, one line: the library's path inside
/// them. Rewritten only when it says something else, so that a spec written again leaves the file
/// running containers have mounted as it is.
fn write_preload_list(list: &Path, container_path: &str) -> Result<(), String> {
    let text = format!("{container_path}\n");
    if std::fs::read(list).is_ok_and(|old| old == text.as_bytes()) {
        return Ok(());
    }
    write_file(&text, list).map_err(|e| format!("--preload-list: {e}"))
}

/// Standard output for `-` or no `-o`; else a temporary file in the target's folder renamed over
/// it, so that a runtime reading /etc/cdi while the spec is rewritten sees the old one or the new
/// one, never half of one.
pub fn write(text: &str, output: Option<&Path>) -> Result<(), String> {
    let Some(path) = output.filter(|p| *p != Path::new("-")) else {
        crate::out::print(text);
        return Ok(());
    };
    write_file(text, path)
}

/// `text` as the whole of `path`, replaced in one rename, 0644.
fn write_file(text: &str, path: &Path) -> Result<(), String> {
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let name = path
        .file_name()
        .ok_or_else(|| format!("{}: names a directory, not a file", path.display()))?;
    // The temporary file under a name nobody can have made first, never through a link.
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let prefix = format!(".{}.tmp.", name.to_string_lossy());
    let (mut f, tmp) = pinguard_common::untrusted::create_new(dir, &prefix, "").map_err(err)?;
    let result = (|| {
        use std::os::unix::fs::PermissionsExt as _;
        f.write_all(text.as_bytes())?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}
