//! What `pinguard top` can show, found on this machine: the groups' ledgers, the processes that
//! run under pinguard (the library in their mappings) with their state files, and the metrics
//! folders they write to (`pinguard top` with no argument, issue 46 item 8).

use std::collections::BTreeMap;
use std::path::PathBuf;

/// A process with the library loaded.
pub struct Proc {
    pub pid: u32,
    pub exe: String,
    /// Its state file, as it maps it (none before its first pinning call).
    pub state: Option<PathBuf>,
    /// The folder of its `PINGUARD_METRICS` files, where its environment can be read.
    pub metrics: Option<PathBuf>,
}

/// `pid`, if the library is in its mappings (readable only for processes this user may trace).
pub fn under_pinguard(pid: u32) -> Option<Proc> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let paths: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .collect();
    let loaded = paths.iter().any(|p| {
        let name = crate::merge::basename(p);
        name.starts_with("libpinguard") && name.contains(".so")
    });
    if !loaded {
        return None;
    }
    let state = paths
        .iter()
        .find(|p| p.ends_with(pinguard_common::state::SUFFIX))
        .map(PathBuf::from);
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    Some(Proc {
        pid,
        exe,
        state,
        metrics: metrics_dir(pid),
    })
}

/// The folder its `PINGUARD_METRICS` template writes to.
fn metrics_dir(pid: u32) -> Option<PathBuf> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let v = env
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"PINGUARD_METRICS="))?;
    let t = PathBuf::from(String::from_utf8_lossy(v).into_owned());
    Some(match t.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    })
}

/// Every process under pinguard this user can see, by pid.
fn all() -> Vec<Proc> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut v: Vec<Proc> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != std::process::id())
        .filter_map(under_pinguard)
        .collect();
    v.sort_by_key(|p| p.pid);
    v
}

/// `pinguard top` with no argument: what it can show, each with the command that shows it.
/// Always 0.
pub fn list() -> i32 {
    println!("groups (pinguard top --group NAME):");
    if crate::group::count() == 0 {
        println!("  none");
    }
    crate::group::list_indented();
    let procs = all();
    println!("processes under pinguard (pinguard top --pid PID):");
    if procs.is_empty() {
        println!("  none this user can see");
    }
    let mut folders: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for p in &procs {
        let state = p.state.as_ref().map_or_else(
            || "no state file yet".to_string(),
            |s| format!("state {}", s.display()),
        );
        println!("  {} {}: {state}", p.pid, crate::merge::basename(&p.exe));
        if let Some(m) = &p.metrics {
            *folders.entry(m.clone()).or_default() += 1;
        }
    }
    println!("metrics folders (pinguard top --metrics DIR):");
    if folders.is_empty() {
        println!("  none named by the processes above");
    }
    for (dir, n) in folders {
        println!(
            "  {} ({})",
            dir.display(),
            crate::out::count(n as u64, "process", "processes")
        );
    }
    0
}
