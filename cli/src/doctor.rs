//! `pinguard doctor`: will pinned memory be contained here, and how far can this process pin?
//! Every figure names the file it was read from; `--probe` pins a bounded amount through each
//! path this process can reach and says whether the cgroup's count moved by it.

use crate::doctor_facts::{meminfo_kb, read, usage, CgroupFacts, Rlimit};
use pinguard_common::cgroup::{self, Place, Version};
use pinguard_common::units::{self, format_bytes};
use pinguard_common::vars;
use serde::Serialize;

/// What `doctor` found; `--json` prints it as it is.
#[derive(Serialize, Default)]
pub struct Findings {
    pub cgroup: Option<CgroupFacts>,
    /// Why the cgroup could not be read, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_error: Option<String>,
    pub rlimit_memlock: Rlimit,
    pub host: Host,
    /// The node configuration file the library would read here.
    pub node_config: crate::doctor_node::NodeConfig,
    /// The `PINGUARD_*` values in force, from the environment or the node file, and the file's
    /// values the environment overrides.
    pub settings: Vec<Setting>,
    /// With `--probe`: how much each probe pins, and why that much.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_size: Option<crate::doctor_probe::ProbeSize>,
    /// Present with `--probe`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probes: Option<Vec<crate::doctor_probe::Probe>>,
    pub verdict: String,
    pub exit_status: u8,
}

#[derive(Serialize, Default)]
pub struct Host {
    pub mem_total_bytes: Option<u64>,
    pub mem_available_bytes: Option<u64>,
    pub mlocked_bytes: Option<u64>,
    pub unevictable_bytes: Option<u64>,
    pub source: &'static str,
}

#[derive(Serialize)]
pub struct Setting {
    pub name: String,
    pub value: String,
    /// `environment`, or the node file and line (`PATH:LINE`).
    pub source: String,
    /// A node file's value the environment's replaces.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub overridden: bool,
    /// Why the library would not use it, as one line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A percentage's bytes here, as the library would take it (`N%` of `percent_of`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent_of: Option<String>,
}

fn cgroup_facts(place: Place) -> CgroupFacts {
    let levels = cgroup::levels(&place, &read);
    let tight = cgroup::tightest(&levels).map(|(b, d)| (b, d.to_string()));
    let usage_bytes = usage(&place);
    let reclaimable_bytes = cgroup::reclaimable_at(&place.dir, place.version, &read);
    let headroom_bytes = cgroup::headroom(place.version, &levels, &read);
    let (kernel_memory_accounted, kernel_memory_source) = kmem(&place);
    CgroupFacts {
        place_source: "/proc/self/cgroup, /proc/self/mountinfo",
        limit_file: tight
            .as_ref()
            .map(|t| format!("{}/{}", t.1, place.version.limit_file())),
        headroom_source: format!(
            "{} (limit - usage + reclaimable on each limited level)",
            place.version.limit_file()
        ),
        usage_file: format!("{}/{}", place.dir, place.version.usage_file()),
        reclaimable_file: format!(
            "{}/memory.stat {}",
            place.dir,
            place.version.reclaimable_key()
        ),
        limit_bytes: tight.as_ref().map(|t| t.0),
        limit_dir: tight.map(|t| t.1),
        levels,
        usage_bytes,
        reclaimable_bytes,
        headroom_bytes,
        kernel_memory_accounted,
        kernel_memory_source,
        place,
    }
}

/// v2 always charges kernel memory; v1 only when the kernel keeps `memory.kmem.*` (no
/// `cgroup.memory=nokmem`, a kernel built with kmem accounting) and has charged something to it.
fn kmem(place: &Place) -> (Option<bool>, String) {
    match place.version {
        Version::V2 => (Some(true), "cgroup v2 (always)".into()),
        Version::V1 => {
            let file = format!("{}/memory.kmem.usage_in_bytes", place.dir);
            let v = read(&file).and_then(|t| t.trim().parse::<u64>().ok());
            (v.map(|u| u > 0), file)
        }
    }
}

fn rlimit_memlock() -> Rlimit {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Rlimit::default();
    }
    let b = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    let (status, cap) = (read("/proc/self/status"), cap_ipc_lock());
    Rlimit {
        soft_bytes: b(r.rlim_cur),
        hard_bytes: b(r.rlim_max),
        source: "getrlimit(RLIMIT_MEMLOCK)",
        cap_ipc_lock: cap,
        cap_ipc_lock_source: "/proc/self/status CapEff",
        binds: cap.map(|c| !c && b(r.rlim_cur).is_some()),
        vm_lck_bytes: status.as_deref().and_then(|t| status_kb(t, "VmLck")),
    }
}

/// A `kB` figure of `/proc/self/status`, in bytes.
fn status_kb(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix(':')?.trim();
        Some(v.strip_suffix("kB")?.trim().parse::<u64>().ok()? * 1024)
    })
}

/// `CAP_IPC_LOCK` (bit 14) in this process's effective capabilities.
fn cap_ipc_lock() -> Option<bool> {
    let text = read("/proc/self/status")?;
    let hex = text.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    let caps = u64::from_str_radix(hex, 16).ok()?;
    Some(caps & (1 << 14) != 0)
}

/// The library's own message for a value it would reject, from the variable's registry parser
/// (a list's first bad entry; a percentage is not resolved here); names that are not pinguard's
/// get a line of their own.
fn setting_error(name: &str, value: &str) -> Option<String> {
    let Some(var) = vars::find(name) else {
        return Some(format!("{name} is not a pinguard variable; ignored"));
    };
    let why = match var.parse(Some(value)) {
        Ok(vars::Value::Labels(_, bad)) => bad.into_iter().next()?,
        Ok(_) => return None,
        Err(why) => why,
    };
    Some(var.rejected(Some(value), &why))
}

/// A percentage's bytes as the library takes them here (`N%` of the total its variable names),
/// and what they are a percentage of; `None` for any other value.
fn percent_bytes(name: &str, value: &str, f: &Findings) -> Option<(u64, String)> {
    let vars::Parse::Size(of) = vars::find(name)?.parse else {
        return None;
    };
    let Ok(units::SizeSpec::Percent(p)) = units::parse_size_spec(value) else {
        return None;
    };
    let limit = f.cgroup.as_ref().and_then(|c| c.limit_bytes);
    let total = f.host.mem_total_bytes;
    let (base, what) = match (of, limit) {
        (vars::Of::MemoryLimit, Some(l)) | (vars::Of::CgroupLimit, Some(l)) => {
            (l, "the cgroup's memory limit")
        }
        (vars::Of::CgroupLimit, None) => return None,
        _ => (total?, "MemTotal"),
    };
    let bytes = (base as f64 * p / 100.0) as u64;
    Some((bytes, format!("{what} {}", format_bytes(base))))
}

/// Each percentage setting's bytes, once the totals are known.
fn resolve_percentages(f: &mut Findings) {
    let found: Vec<_> = f
        .settings
        .iter()
        .map(|s| percent_bytes(&s.name, &s.value, f))
        .collect();
    for (s, p) in f.settings.iter_mut().zip(found) {
        if let Some((b, of)) = p {
            (s.bytes, s.percent_of) = (Some(b), Some(of));
        }
    }
}

fn settings(node: &crate::doctor_node::NodeConfig) -> Vec<Setting> {
    let mut out: Vec<Setting> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| k.starts_with("PINGUARD_"))
        .map(|(name, value)| Setting {
            error: setting_error(&name, &value),
            name,
            value,
            source: "environment".into(),
            overridden: false,
            bytes: None,
            percent_of: None,
        })
        .collect();
    let path = node.path.as_deref().unwrap_or_default();
    for (i, e) in node.entries.iter().enumerate() {
        let value = e.value.clone().unwrap_or_else(|| "(not UTF-8)".into());
        // The environment's value, or a later line of the file, is the one in force.
        let overridden = out
            .iter()
            .any(|s| s.name == e.name && s.source == "environment")
            || node.entries[i + 1..].iter().any(|l| l.name == e.name);
        let at = format!("{path}:{}", e.line);
        out.push(Setting {
            error: setting_error(&e.name, &value).map(|m| format!("{at}: {m}")),
            name: e.name.clone(),
            value,
            source: at,
            overridden,
            bytes: None,
            percent_of: None,
        });
    }
    out.sort_by(|a, b| (&a.name, a.overridden).cmp(&(&b.name, b.overridden)));
    out
}

/// Gathers every figure; `probe` set: the accounting probe too, of the size asked (`Some`) or
/// of one that fits this process's room (`None`).
pub fn examine(probe: Option<Option<u64>>) -> Findings {
    let mut f = Findings {
        rlimit_memlock: rlimit_memlock(),
        host: Host {
            mem_total_bytes: meminfo_kb("MemTotal"),
            mem_available_bytes: meminfo_kb("MemAvailable"),
            mlocked_bytes: meminfo_kb("Mlocked"),
            unevictable_bytes: meminfo_kb("Unevictable"),
            source: "/proc/meminfo",
        },
        ..Findings::default()
    };
    f.node_config = crate::doctor_node::examine();
    f.settings = settings(&f.node_config);
    match cgroup::locate(&read) {
        Ok(place) => f.cgroup = Some(cgroup_facts(place)),
        Err(e) => f.cgroup_error = Some(e),
    }
    resolve_percentages(&mut f);
    if let Some(asked) = probe {
        let size = crate::doctor_probe::size(asked, f.cgroup.as_ref(), &f.rlimit_memlock);
        f.probes = Some(crate::doctor_probe::run_all(f.cgroup.as_ref(), size.bytes));
        f.probe_size = Some(size);
    }
    (f.verdict, f.exit_status) = verdict(&f);
    f
}

/// 0: contained (a limit, and every path probed is counted by it); 1: a path escapes the limit,
/// or there is no limit; 2: could not tell.
fn verdict(f: &Findings) -> (String, u8) {
    let Some(c) = &f.cgroup else {
        return (
            format!(
                "could not tell: {}",
                f.cgroup_error.as_deref().unwrap_or("no cgroup")
            ),
            2,
        );
    };
    let Some(limit) = c.limit_bytes else {
        return ("not contained: no memory limit on this cgroup's path; pinned memory is bounded only by the host".into(), 1);
    };
    let Some(probes) = &f.probes else {
        return (format!("a limit of {} holds this cgroup; which pinning paths it counts is measured with --probe", format_bytes(limit)), 2);
    };
    let escaping: Vec<&str> = probes
        .iter()
        .filter(|p| p.counted == Some(false))
        .map(|p| p.path)
        .collect();
    let counted: Vec<&str> = probes
        .iter()
        .filter(|p| p.counted == Some(true))
        .map(|p| p.path)
        .collect();
    if !escaping.is_empty() {
        let what = escaping.join(", ");
        return (
            format!(
                "not contained: {what} pinned memory outside the limit of {}",
                format_bytes(limit)
            ),
            1,
        );
    }
    if counted.is_empty() {
        return ("could not tell: no pinning path could be probed".into(), 2);
    }
    (
        format!(
            "contained: the limit of {} counts {}",
            format_bytes(limit),
            counted.join(", ")
        ),
        0,
    )
}

fn opt_bytes(v: Option<u64>) -> String {
    v.map(format_bytes).unwrap_or_else(|| "unknown".into())
}

fn cgroup_lines(s: &mut String, c: &CgroupFacts) {
    let v = match c.place.version {
        Version::V1 => "v1",
        Version::V2 => "v2",
    };
    s.push_str(&format!(
        "cgroup:      {v}, memory group {} at {} (/proc/self/cgroup, /proc/self/mountinfo)\n",
        c.place.path, c.place.dir
    ));
    match (&c.limit_bytes, &c.limit_dir) {
        (Some(b), Some(d)) => s.push_str(&format!(
            "limit:       {} ({d}/{}, the tightest of {} levels up to {})\n",
            format_bytes(*b),
            c.place.version.limit_file(),
            c.levels.len(),
            c.place.mount
        )),
        _ => s.push_str(&format!(
            "limit:       none ({} on {} levels up to {})\n",
            c.place.version.limit_file(),
            c.levels.len(),
            c.place.mount
        )),
    }
    s.push_str(&format!(
        "usage:       {} ({})\n",
        opt_bytes(c.usage_bytes),
        c.usage_file
    ));
    s.push_str(&format!(
        "reclaimable: {} ({})\n",
        opt_bytes(c.reclaimable_bytes),
        c.reclaimable_file
    ));
    if let Some(h) = c.headroom_bytes {
        s.push_str(&format!("headroom:    {} (limit - usage + reclaimable, the least over the limited levels: what this cgroup can still take before its OOM killer)\n", format_bytes(h)));
    }
    let k = match c.kernel_memory_accounted {
        Some(true) => "yes",
        Some(false) => "no",
        None => "no (not kept by this kernel)",
    };
    s.push_str(&format!(
        "kernel memory accounted: {k} ({})\n",
        c.kernel_memory_source
    ));
}

pub fn render(f: &Findings) -> String {
    let mut s = String::from("pinguard doctor: will pinned memory be contained here?\n\n");
    match &f.cgroup {
        Some(c) => cgroup_lines(&mut s, c),
        None => s.push_str(&format!(
            "cgroup:      unknown: {}\n",
            f.cgroup_error.as_deref().unwrap_or("")
        )),
    }
    rlimit_line(&mut s, &f.rlimit_memlock);
    let h = &f.host;
    s.push_str(&format!(
        "host:        MemTotal {}, MemAvailable {}, Mlocked {}, Unevictable {} (/proc/meminfo; inside a container these are the host's)\n",
        opt_bytes(h.mem_total_bytes),
        opt_bytes(h.mem_available_bytes),
        opt_bytes(h.mlocked_bytes),
        opt_bytes(h.unevictable_bytes)
    ));
    node_lines(&mut s, &f.node_config);
    settings_lines(&mut s, &f.settings);
    if let (Some(p), Some(size)) = (&f.probes, &f.probe_size) {
        crate::doctor_probe::render(&mut s, p, size);
    }
    s.push_str(&format!("\nverdict: {}\n", f.verdict));
    s
}

fn rlimit_line(s: &mut String, r: &Rlimit) {
    let lim = |v: Option<u64>| v.map(format_bytes).unwrap_or_else(|| "unlimited".into());
    let binds = match (r.cap_ipc_lock, r.soft_bytes) {
        (Some(true), _) => "does not bind this process: it holds CAP_IPC_LOCK (root does by default), which lets it lock past the limit",
        (Some(false), Some(_)) => "binds this process (no CAP_IPC_LOCK): mlock and the runtimes' pinning fail past it",
        (Some(false), None) => "no limit (and no CAP_IPC_LOCK)",
        (None, _) => "whether CAP_IPC_LOCK is held is unknown",
    };
    s.push_str(&format!(
        "RLIMIT_MEMLOCK: {} soft, {} hard (getrlimit); {binds} (/proc/self/status CapEff)\n",
        lim(r.soft_bytes),
        lim(r.hard_bytes)
    ));
}

fn node_lines(s: &mut String, n: &crate::doctor_node::NodeConfig) {
    // An ignored file's state names the file already.
    let shown = match &n.path {
        Some(p) if n.in_force || n.state == "absent" => format!("{p} ({})", n.state),
        _ => n.state.clone(),
    };
    s.push_str(&format!("node configuration: {shown}\n"));
    for p in &n.problems {
        s.push_str(&format!("  ERROR {p}\n"));
    }
}

fn settings_lines(s: &mut String, settings: &[Setting]) {
    if settings.is_empty() {
        s.push_str("settings:    no PINGUARD_* variable in the environment or the node file\n");
        return;
    }
    s.push_str("settings:\n");
    for st in settings {
        let note = if st.overridden { "; overridden" } else { "" };
        let bytes = match (&st.bytes, &st.percent_of) {
            (Some(b), Some(of)) => format!(" = {} ({b} bytes) of {of}", format_bytes(*b)),
            _ => String::new(),
        };
        match &st.error {
            Some(e) => s.push_str(&format!("  ERROR {e}\n")),
            None => s.push_str(&format!(
                "  {}={}{bytes} ({}{note})\n",
                st.name, st.value, st.source
            )),
        }
    }
}
