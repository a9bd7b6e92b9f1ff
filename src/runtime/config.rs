//! `PINGUARD_*` variables. A bad value never stops the process: it is reported once on stderr,
//! listed in the report's `config.errors`, and the setting falls back to its default.

use crate::api::Family;
use pinguard_report::units::{self, check_template, parse_patterns, parse_signal, SizeSpec};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Error,
    Downgrade,
    Warn,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Error => "error",
            Policy::Downgrade => "downgrade",
            Policy::Warn => "warn",
        }
    }
}

pub use pinguard_report::vars::{DEFAULT_TEMPLATE, MAX_DEPTH};
use pinguard_report::vars::{self, Var};

#[derive(Clone, Debug)]
pub struct Config {
    pub budget: Option<u64>,
    /// `PINGUARD_HOST_RESERVE`: the floor under the host's available memory, in bytes.
    pub host_reserve: Option<u64>,
    /// `PINGUARD_CGROUP_RESERVE`: the floor under the cgroup's headroom, in bytes.
    pub cgroup_reserve: Option<u64>,
    pub policy: Policy,
    /// `PINGUARD_DOWNGRADE_MATCH`: the callsites `downgrade` may serve with pageable memory
    /// (`None`: every one; an empty list after a bad value: none).
    pub downgrade_match: Option<Vec<glob::Pattern>>,
    /// The template as given; `None` means the default (which may fall back to the temp dir).
    pub report: Option<String>,
    pub depth: u32,
    /// Python frames per callsite (0: none).
    pub py_depth: u32,
    /// `PINGUARD_MAX_CALLSITES`: callsites kept apart; beyond, those with nothing live are folded.
    pub max_callsites: usize,
    pub interval_ms: Option<u64>,
    pub signal: Option<i32>,
    pub hooks: u8,
    pub log: String,
    pub disabled: bool,
    /// `PINGUARD_GROUP`, and its budget (`PINGUARD_GROUP_BUDGET`).
    pub group: Option<String>,
    pub group_budget: Option<u64>,
    /// `PINGUARD_METRICS`: where the Prometheus text file goes.
    pub metrics: Option<String>,
    /// The labels every metrics series carries from the environment, in order: `namespace`,
    /// `pod`, `container` (those set), then `PINGUARD_LABELS`' good entries.
    pub labels: Vec<(String, String)>,
    /// One line per rejected variable, as printed on stderr.
    pub errors: Vec<String>,
}

impl Default for Config {
    /// What every variable left unset means: the registry's defaults, read by the parser.
    fn default() -> Config {
        struct NoLimit;
        impl System for NoLimit {
            fn memory_limit(&self) -> Option<u64> {
                None
            }
            fn mem_total(&self) -> Option<u64> {
                None
            }
        }
        Config::from_vars(&[], &NoLimit)
    }
}

/// What the environment needs from the system to resolve relative values.
pub trait System {
    /// Bytes a `N%` budget is a percentage of: the cgroup memory limit, else `MemTotal`.
    fn memory_limit(&self) -> Option<u64>;
    /// The host's `MemTotal`, which a `N%` host reserve is a percentage of: the reserve protects
    /// the host, whatever this process's cgroup allows.
    fn mem_total(&self) -> Option<u64>;
    /// The tightest cgroup memory limit on the process's path, which a `N%` cgroup reserve is a
    /// percentage of.
    fn cgroup_limit(&self) -> Option<u64> {
        None
    }
}

impl Config {
    /// Reads the configuration from `vars` (name, value; a value that is not UTF-8 is `None`).
    /// Every variable is parsed, set or not: an unset one as its registry default
    /// (`pinguard_report::vars`), so that default is written in one place.
    pub fn from_vars(vars: &[(String, Option<String>)], sys: &dyn System) -> Config {
        let mut c = Config {
            budget: None,
            host_reserve: None,
            cgroup_reserve: None,
            policy: Policy::Error,
            downgrade_match: None,
            report: None,
            depth: 0,
            py_depth: 0,
            max_callsites: 0,
            interval_ms: None,
            signal: None,
            hooks: 0,
            log: String::new(),
            disabled: false,
            group: None,
            group_budget: None,
            metrics: None,
            labels: Vec::new(),
            errors: Vec::new(),
        };
        let get = |var: &Var| match vars.iter().find(|(n, _)| n == var.name) {
            Some((_, v)) => Some(v.as_deref()),
            None => var.default.map(Some),
        };
        let bad = |c: &mut Config, var: &Var, value: Option<&str>, why: &str| {
            let shown = match value {
                Some(v) => format!("{v:?}"),
                None => "(not UTF-8)".to_string(),
            };
            // One line, whatever the value or a parser's message holds.
            let why: String = why.chars().flat_map(|ch| if ch.is_control() { ch.escape_debug().collect::<Vec<_>>() } else { vec![ch] }).collect();
            c.errors.push(format!("{}={shown}: {why}; expected {}; {}", var.name, var.forms, var.fallback));
        };

        if let Some(v) = get(&vars::DISABLE) {
            match v.map(|v| disable_switch(v.as_bytes())) {
                Some(Some(off)) => c.disabled = off,
                _ => bad(&mut c, &vars::DISABLE, v, "not a switch"),
            }
        }
        // A size, or a percentage of the memory limit.
        // The value's fallback when it is rejected: the registry's default, where there is one.
        let fallback = |c: &mut Config, var: &Var, apply: &dyn Fn(&mut Config, &str) -> bool| {
            if let Some(d) = var.default {
                let applied = apply(c, d);
                debug_assert!(applied, "{}'s default {d:?} is rejected by its own parser", var.name);
            }
        };
        // A size, or a percentage of what `of` gives (`None`: there is nothing, for the reason `none`).
        let size = |c: &mut Config, var: &Var, v: Option<&str>, of: Option<u64>, none: &str| -> Option<u64> {
            match v.ok_or_else(|| "not UTF-8".to_string()).and_then(units::parse_size_spec) {
                Ok(SizeSpec::Bytes(b)) => Some(b),
                Ok(SizeSpec::Percent(p)) => match of {
                    Some(total) => Some((total as f64 * p / 100.0) as u64),
                    None => {
                        bad(c, var, v, none);
                        None
                    }
                },
                Err(e) => {
                    bad(c, var, v, &e);
                    None
                }
            }
        };
        // A size, or a percentage of the memory limit.
        let budget = |c: &mut Config, var: &Var, v: Option<&str>| -> Option<u64> {
            size(c, var, v, sys.memory_limit(), "no memory limit or MemTotal to take a percentage of")
        };
        if let Some(v) = get(&vars::BUDGET) {
            c.budget = budget(&mut c, &vars::BUDGET, v);
        }
        if let Some(v) = get(&vars::HOST_RESERVE) {
            c.host_reserve = size(&mut c, &vars::HOST_RESERVE, v, sys.mem_total(), "no MemTotal in /proc/meminfo to take a percentage of");
            // `u64::MAX` is the reserve's "off": a floor that high is kept, one byte lower.
            c.host_reserve = c.host_reserve.map(|r| r.min(u64::MAX - 1));
        }
        if let Some(v) = get(&vars::CGROUP_RESERVE) {
            c.cgroup_reserve = size(&mut c, &vars::CGROUP_RESERVE, v, sys.cgroup_limit(), "no cgroup memory limit to take a percentage of");
            c.cgroup_reserve = c.cgroup_reserve.map(|r| r.min(u64::MAX - 1));
        }
        let policy = |c: &mut Config, v: &str| {
            c.policy = match v.trim().to_ascii_lowercase().as_str() {
                "error" => Policy::Error,
                "downgrade" => Policy::Downgrade,
                "warn" => Policy::Warn,
                _ => return false,
            };
            true
        };
        if let Some(v) = get(&vars::POLICY) {
            if !v.is_some_and(|v| policy(&mut c, v)) {
                bad(&mut c, &vars::POLICY, v, "unknown policy");
                fallback(&mut c, &vars::POLICY, &policy);
            }
        }
        if let Some(v) = get(&vars::DOWNGRADE_MATCH) {
            match v.map(parse_patterns) {
                Some(Ok(p)) => c.downgrade_match = Some(p),
                Some(Err(e)) => {
                    bad(&mut c, &vars::DOWNGRADE_MATCH, v, &e);
                    c.downgrade_match = Some(Vec::new());
                }
                None => {
                    bad(&mut c, &vars::DOWNGRADE_MATCH, v, "not UTF-8");
                    c.downgrade_match = Some(Vec::new());
                }
            }
        }
        if let Some(v) = get(&vars::REPORT) {
            match v.map(check_template) {
                Some(Ok(())) => c.report = v.map(str::to_string),
                Some(Err(e)) => bad(&mut c, &vars::REPORT, v, &e),
                None => bad(&mut c, &vars::REPORT, v, "not UTF-8"),
            }
        }
        let frames = |v: &str| v.trim().parse::<u32>().ok().filter(|&d| d <= MAX_DEPTH);
        let depth = |c: &mut Config, v: &str| frames(v).map(|d| c.depth = d).is_some();
        if let Some(v) = get(&vars::DEPTH) {
            if !v.is_some_and(|v| depth(&mut c, v)) {
                bad(&mut c, &vars::DEPTH, v, "not a frame count");
                fallback(&mut c, &vars::DEPTH, &depth);
            }
        }
        let py_depth = |c: &mut Config, v: &str| frames(v).map(|d| c.py_depth = d).is_some();
        if let Some(v) = get(&vars::PY_DEPTH) {
            if !v.is_some_and(|v| py_depth(&mut c, v)) {
                bad(&mut c, &vars::PY_DEPTH, v, "not a frame count");
                fallback(&mut c, &vars::PY_DEPTH, &py_depth);
            }
        }
        let max_callsites = |c: &mut Config, v: &str| {
            v.trim().parse::<usize>().ok().filter(|n| (1..=vars::MAX_MAX_CALLSITES).contains(n)).map(|n| c.max_callsites = n).is_some()
        };
        if let Some(v) = get(&vars::MAX_CALLSITES) {
            if !v.is_some_and(|v| max_callsites(&mut c, v)) {
                bad(&mut c, &vars::MAX_CALLSITES, v, "not a callsite count");
                fallback(&mut c, &vars::MAX_CALLSITES, &max_callsites);
            }
        }
        if let Some(v) = get(&vars::INTERVAL) {
            match v.ok_or_else(|| "not UTF-8".to_string()).and_then(units::parse_duration_ms) {
                Ok(ms) => c.interval_ms = Some(ms),
                Err(e) => bad(&mut c, &vars::INTERVAL, v, &e),
            }
        }
        if let Some(v) = get(&vars::SIGNAL) {
            match v.map(parse_signal) {
                Some(Ok(s)) => c.signal = Some(s),
                Some(Err(e)) => bad(&mut c, &vars::SIGNAL, v, &e),
                None => bad(&mut c, &vars::SIGNAL, v, "not UTF-8"),
            }
        }
        let hooks = |c: &mut Config, v: &str| parse_hooks(v).map(|h| c.hooks = h).is_ok();
        if let Some(v) = get(&vars::HOOKS) {
            match v.map(parse_hooks) {
                Some(Ok(h)) => c.hooks = h,
                Some(Err(e)) => bad(&mut c, &vars::HOOKS, v, &e),
                None => bad(&mut c, &vars::HOOKS, v, "not UTF-8"),
            }
            if c.hooks == 0 {
                fallback(&mut c, &vars::HOOKS, &hooks);
            }
        }
        let log = |c: &mut Config, v: &str| v.parse::<tracing_subscriber::filter::Targets>().map(|_| c.log = v.to_string()).is_ok();
        if let Some(v) = get(&vars::LOG) {
            match v.map(|s| s.parse::<tracing_subscriber::filter::Targets>()) {
                Some(Ok(_)) => c.log = v.unwrap_or_default().to_string(),
                Some(Err(e)) => bad(&mut c, &vars::LOG, v, &e.to_string()),
                None => bad(&mut c, &vars::LOG, v, "not UTF-8"),
            }
            if c.log.is_empty() {
                fallback(&mut c, &vars::LOG, &log);
            }
        }
        if let Some(v) = get(&vars::GROUP) {
            match v.map(str::trim) {
                Some(n) if pinguard_report::group::valid_name(n) => c.group = Some(n.to_string()),
                _ => bad(&mut c, &vars::GROUP, v, "not a group name"),
            }
        }
        if let Some(v) = get(&vars::GROUP_BUDGET) {
            c.group_budget = budget(&mut c, &vars::GROUP_BUDGET, v);
            if c.group.is_none() && !c.errors.iter().any(|e| e.starts_with(vars::GROUP.name)) {
                c.errors.push(format!("{} is set without {}; ignored", vars::GROUP_BUDGET.name, vars::GROUP.name));
            }
        }
        if let Some(v) = get(&vars::METRICS) {
            match v.map(check_template) {
                Some(Ok(())) => c.metrics = v.map(str::to_string),
                Some(Err(e)) => bad(&mut c, &vars::METRICS, v, &e),
                None => bad(&mut c, &vars::METRICS, v, "not UTF-8"),
            }
        }
        for (var, label) in [(&vars::NAMESPACE, "namespace"), (&vars::POD, "pod"), (&vars::CONTAINER, "container")] {
            match get(var) {
                Some(Some(v)) if !v.is_empty() => c.labels.push((label.to_string(), v.to_string())),
                Some(None) => bad(&mut c, var, None, "not UTF-8"),
                _ => {}
            }
        }
        match get(&vars::LABELS) {
            Some(Some(v)) => {
                for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                    match label_entry(entry, &c.labels) {
                        Ok(kv) => c.labels.push(kv),
                        Err(why) => bad(&mut c, &vars::LABELS, Some(v), &format!("entry {entry:?}: {why}")),
                    }
                }
            }
            Some(None) => bad(&mut c, &vars::LABELS, None, "not UTF-8"),
            None => {}
        }
        for (name, value) in vars {
            if name.starts_with("PINGUARD_") && vars::find(name).is_none() {
                let near = vars::ALL.iter().min_by_key(|k| edit_distance(k.name, name)).map(|k| k.name).unwrap_or("");
                let shown = value.as_deref().unwrap_or("(not UTF-8)");
                c.errors.push(format!("{}={shown:?} is not a pinguard variable (did you mean {near}?); ignored", name.escape_debug()));
            }
        }
        c
    }
}

/// The labels pinguard writes itself: `PINGUARD_LABELS` may not set them.
pub const OWN_LABELS: &[&str] = &["pid", "pidns", "exe", "api", "group", "namespace", "pod", "container", "container_id"];

/// One `PINGUARD_LABELS` entry, `name=value`, checked against Prometheus' rules for a label name
/// (`[a-zA-Z_][a-zA-Z0-9_]*`, `__` reserved) and against the labels already taken.
fn label_entry(entry: &str, taken: &[(String, String)]) -> Result<(String, String), String> {
    let Some((name, value)) = entry.split_once('=') else { return Err("no '=' between a name and a value".into()) };
    let name = name.trim();
    let first_ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{name:?} is not a label name"));
    }
    if name.starts_with("__") {
        return Err(format!("{name:?} starts with __, which Prometheus reserves"));
    }
    if OWN_LABELS.contains(&name) {
        return Err(format!("{name:?} is one of pinguard's own labels"));
    }
    if taken.iter().any(|(n, _)| n == name) {
        return Err(format!("{name:?} is given twice"));
    }
    Ok((name.to_string(), value.to_string()))
}

fn parse_hooks(s: &str) -> Result<u8, String> {
    hooks_switch(s.as_bytes()).map_err(|e| match e {
        Some(item) => format!("unknown family {:?}", String::from_utf8_lossy(item)),
        None => "names no family".into(),
    })
}

/// `PINGUARD_DISABLE`'s value: whether it switches pinguard off; `None` when it is no switch
/// (pinguard then stays enabled). Without allocating: the hooks also ask before pinguard has
/// started (`early_hooks_enabled`), and both must answer alike.
pub fn disable_switch(v: &[u8]) -> Option<bool> {
    match v.trim_ascii() {
        b"1" | b"true" | b"yes" => Some(true),
        b"0" | b"" | b"false" | b"no" => Some(false),
        _ => None,
    }
}

/// `PINGUARD_HOOKS`' value: the families it names, or the first item that names none
/// (`Err(None)`: no family at all); on either error every family is hooked. Without allocating.
pub fn hooks_switch(v: &[u8]) -> Result<u8, Option<&[u8]>> {
    let mut bits = 0u8;
    for item in v.split(|&c| c == b',').map(<[u8]>::trim_ascii) {
        if item.is_empty() {
            continue;
        }
        if item.eq_ignore_ascii_case(b"all") {
            bits |= Family::ALL.iter().fold(0, |m, f| m | f.bit());
            continue;
        }
        match Family::ALL.iter().find(|f| f.name().as_bytes().eq_ignore_ascii_case(item)) {
            Some(f) => bits |= f.bit(),
            None => return Err(Some(item)),
        }
    }
    if bits == 0 {
        return Err(None);
    }
    Ok(bits)
}

/// Whether pinguard is switched off, from `PINGUARD_DISABLE`'s raw value, as `Config` decides.
pub fn early_disabled(disable: Option<&[u8]>) -> bool {
    disable.and_then(disable_switch) == Some(true)
}

/// Whether `family` is hooked, from the raw values of `PINGUARD_DISABLE` and `PINGUARD_HOOKS`,
/// exactly as `Config` decides (for the calls that come before pinguard has started).
pub fn early_hooks_enabled(disable: Option<&[u8]>, hooks: Option<&[u8]>, family: Family) -> bool {
    !early_disabled(disable) && hooks.map_or(true, |h| hooks_switch(h).map_or(true, |bits| bits & family.bit() != 0))
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + (ca != *cb) as usize).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_early_switches_answer_as_the_configuration_does() {
        let values = ["1", " 1 ", "true", "yes", "0", "", "no", "maybe", "cuda", "CUDA ", "cuda,opencl", " , ", "acl,mlock", "cuda-driver", "all", "ALL,cuda", "all,opencl"];
        for d in values.iter().map(Some).chain([None]) {
            for h in values.iter().map(Some).chain([None]) {
                let mut vars = Vec::new();
                if let Some(d) = d {
                    vars.push(("PINGUARD_DISABLE".to_string(), Some(d.to_string())));
                }
                if let Some(h) = h {
                    vars.push(("PINGUARD_HOOKS".to_string(), Some(h.to_string())));
                }
                let c = Config::from_vars(&vars, &Fixed(None));
                for f in Family::ALL {
                    let early = early_hooks_enabled(d.map(|s| s.as_bytes()), h.map(|s| s.as_bytes()), f);
                    let late = !c.disabled && c.hooks & f.bit() != 0;
                    assert_eq!(early, late, "PINGUARD_DISABLE={d:?} PINGUARD_HOOKS={h:?}, {}", f.name());
                }
                assert_eq!(early_disabled(d.map(|s| s.as_bytes())), c.disabled, "PINGUARD_DISABLE={d:?}");
            }
        }
    }
    use super::*;

    struct Fixed(Option<u64>);
    impl System for Fixed {
        fn memory_limit(&self) -> Option<u64> {
            self.0
        }
        /// Four times the memory limit: a host larger than the cgroup it runs.
        fn mem_total(&self) -> Option<u64> {
            self.0.map(|l| 4 * l)
        }
        fn cgroup_limit(&self) -> Option<u64> {
            self.0
        }
    }

    #[test]
    fn a_host_reserve_percentage_is_of_memtotal_not_of_the_memory_limit() {
        let c = cfg(&[("PINGUARD_HOST_RESERVE", "25%"), ("PINGUARD_BUDGET", "25%")]);
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        assert_eq!((c.host_reserve, c.budget), (Some(1 << 30), Some(1 << 28)));
        assert_eq!(cfg(&[("PINGUARD_HOST_RESERVE", "1.5G")]).host_reserve, Some(3 << 29));
        assert_eq!(cfg(&[("PINGUARD_HOST_RESERVE", "18446744073709551615")]).host_reserve, Some(u64::MAX - 1), "not the word for off");
        let c = Config::from_vars(&[("PINGUARD_HOST_RESERVE".into(), Some("10%".into()))], &Fixed(None));
        assert_eq!(c.host_reserve, None);
        assert!(c.errors[0].contains("no MemTotal") && c.errors[0].contains("running without a host reserve"), "{:?}", c.errors);
        let c = cfg(&[("PINGUARD_HOST_RESERVE", "lots")]);
        assert_eq!((c.host_reserve, c.errors.len()), (None, 1));
        assert!(c.errors[0].starts_with("PINGUARD_HOST_RESERVE=\"lots\""), "{:?}", c.errors);
    }

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let v: Vec<_> = vars.iter().map(|(a, b)| (a.to_string(), Some(b.to_string()))).collect();
        Config::from_vars(&v, &Fixed(Some(1 << 30)))
    }

    #[test]
    fn every_unset_variable_means_its_registry_default() {
        let c = Config::default();
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        assert_eq!((c.policy, c.depth, c.py_depth, c.log.as_str(), c.disabled), (Policy::Error, 32, 32, "warn", false));
        assert_eq!(c.max_callsites, vars::DEFAULT_MAX_CALLSITES);
        assert_eq!(c.hooks, Family::ALL.iter().fold(0, |m, f| m | f.bit()));
        assert_eq!((c.budget, c.report.as_deref(), c.interval_ms, c.signal, c.group.as_deref(), c.metrics.as_deref()), (None, None, None, None, None, None));
        // A registry default is a value its variable's parser takes, and gives the same.
        for var in pinguard_report::vars::ALL {
            if let Some(d) = var.default {
                let set = cfg(&[(var.name, d)]);
                assert!(set.errors.is_empty(), "{}={d:?}: {:?}", var.name, set.errors);
                assert_eq!(format!("{set:?}"), format!("{c:?}"), "{}={d:?}", var.name);
            }
        }
    }

    #[test]
    fn a_rejected_value_falls_back_to_the_registry_default() {
        let c = cfg(&[("PINGUARD_DEPTH", "129"), ("PINGUARD_HOOKS", "opencl"), ("PINGUARD_LOG", "pinguard=loud"), ("PINGUARD_POLICY", "explode")]);
        let d = Config::default();
        assert_eq!((c.depth, c.hooks, c.log.as_str(), c.policy), (d.depth, d.hooks, d.log.as_str(), d.policy));
        assert_eq!(c.errors.len(), 4, "{:?}", c.errors);
        assert!(c.errors.iter().any(|e| e.contains("expected a whole number from 0 to 128; using 32")), "{:?}", c.errors);
    }

    #[test]
    fn good_values() {
        let c = cfg(&[
            ("PINGUARD_BUDGET", "25%"),
            ("PINGUARD_POLICY", "Downgrade"),
            ("PINGUARD_DEPTH", "0"),
            ("PINGUARD_HOOKS", "cuda, mlock"),
            ("PINGUARD_SIGNAL", "usr2"),
            ("PINGUARD_INTERVAL", "250ms"),
            ("PINGUARD_REPORT", "/x/%e-%p-%%.json"),
            ("PINGUARD_LOG", "pinguard=debug"),
        ]);
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        assert_eq!(c.budget, Some(1 << 28));
        assert_eq!(c.policy, Policy::Downgrade);
        assert_eq!(c.depth, 0);
        assert_eq!(c.hooks, Family::Cuda.bit() | Family::Mlock.bit());
        assert_eq!(c.signal, Some(libc::SIGUSR2));
        assert_eq!(c.interval_ms, Some(250));
    }

    #[test]
    fn metrics_labels_from_the_downward_api_and_pinguard_labels() {
        let c = cfg(&[
            ("PINGUARD_NAMESPACE", "team-a"),
            ("PINGUARD_POD", "trainer-0"),
            ("PINGUARD_CONTAINER", ""),
            ("PINGUARD_LABELS", " zone=eu-1 ,_x=a=b,,Team9=ml,9x=1,__y=2,pid=3,container_id=4,noeq,a-b=5,zone=again,=6"),
        ]);
        let got: Vec<(&str, &str)> = c.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, vec![("namespace", "team-a"), ("pod", "trainer-0"), ("zone", "eu-1"), ("_x", "a=b"), ("Team9", "ml")]);
        let bad: Vec<&String> = c.errors.iter().filter(|e| e.starts_with("PINGUARD_LABELS=")).collect();
        assert_eq!(bad.len(), 8, "{:#?}", c.errors);
        assert_eq!(c.errors.len(), 8, "{:#?}", c.errors);
        for (entry, why) in [
            ("9x=1", "is not a label name"),
            ("__y=2", "starts with __"),
            ("pid=3", "one of pinguard's own labels"),
            ("container_id=4", "one of pinguard's own labels"),
            ("noeq", "no '='"),
            ("a-b=5", "is not a label name"),
            ("zone=again", "given twice"),
            ("=6", "is not a label name"),
        ] {
            assert!(bad.iter().any(|e| e.contains(&format!("entry {entry:?}: ")) && e.contains(why) && e.ends_with("that entry is left out")), "{entry}: {bad:#?}");
        }
        assert!(Config::default().labels.is_empty());
    }

    #[test]
    fn bad_values_fall_back_with_one_line_each() {
        let c = cfg(&[
            ("PINGUARD_BUDGET", "12Q"),
            ("PINGUARD_POLICY", "explode"),
            ("PINGUARD_DEPTH", "129"),
            ("PINGUARD_HOOKS", "cuda,opencl"),
            ("PINGUARD_SIGNAL", "SIGKILL"),
            ("PINGUARD_INTERVAL", "soon"),
            ("PINGUARD_REPORT", "%q.json"),
            ("PINGUARD_LOG", "pinguard=loud"),
            ("PINGUARD_DISABLE", "maybe"),
            ("PINGUARD_BUGDET", "1G"),
        ]);
        assert_eq!(c.errors.len(), 10, "{:#?}", c.errors);
        assert_eq!(c.budget, None);
        assert_eq!(c.policy, Policy::Error);
        assert_eq!(c.depth, 32);
        assert_eq!(c.hooks, Config::default().hooks);
        assert!(c.errors.iter().any(|e| e.contains("did you mean PINGUARD_BUDGET")));
        assert!(c.errors.iter().all(|e| !e.contains('\n')));
    }
}
