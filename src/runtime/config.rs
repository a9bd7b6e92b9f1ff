//! `PINGUARD_*` variables. A bad value never stops the process: it is reported once on stderr,
//! listed in the report's `config.errors`, and the setting falls back to its default.

use crate::api::Family;
use pinguard_common::units::SizeSpec;

use pinguard_common::vars::{self, Of, Value, Var};
pub use pinguard_common::vars::{DeviceMemory, Policy, DEFAULT_TEMPLATE};

#[derive(Clone, Debug)]
pub struct Config {
    pub budget: Option<u64>,
    /// `PINGUARD_QUIET_BELOW`: at or under this many bytes pinned at once, and only through the
    /// `mlock` family, a process not asked for a report leaves none.
    pub quiet_below: u64,
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
    /// `PINGUARD_DEVICE_MEMORY`: whether device allocations count as host bytes.
    pub device_memory: DeviceMemory,
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
    /// `PINGUARD_STRICT`: a setting that cannot be used fails closed (`fails_closed`).
    pub strict: bool,
    /// One line per rejected variable, as printed on stderr.
    pub errors: Vec<String>,
    /// Lines of `errors` that are notes, not settings that could not be used (secure mode's).
    pub notes: usize,
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

/// A variable as given: name, value (`None`: not UTF-8), and the node file's line it is on
/// (`None`: the environment).
type Given<'a> = (&'a str, Option<&'a str>, Option<usize>);

/// The node configuration file's settings (`pinguard_common::node::entries`) and the lines about
/// the file itself (ignored, or lines that set nothing).
#[derive(Default)]
pub struct NodeFile {
    pub path: String,
    pub entries: Vec<pinguard_common::node::Entry>,
    pub problems: Vec<String>,
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
    /// What a `N%` size is a percentage of.
    fn total(&self, of: Of) -> Option<u64> {
        match of {
            Of::MemoryLimit => self.memory_limit(),
            Of::MemTotal => self.mem_total(),
            Of::CgroupLimit => self.cgroup_limit(),
        }
    }
}

impl Config {
    /// Reads the configuration from `vars` (name, value; a value that is not UTF-8 is `None`).
    /// Every variable is parsed, set or not: an unset one as its registry default
    /// (`pinguard_common::vars`), so that default is written in one place; each with its
    /// registry entry's parser, and a rejected one in the registry's one shape (`Var::rejected`).
    pub fn from_vars(vars: &[(String, Option<String>)], sys: &dyn System) -> Config {
        Config::from_layers(vars, None, sys)
    }

    /// As `from_vars`, with the node configuration file's settings under the environment's: a
    /// variable the environment sets takes its value from there, any other from the file. A
    /// message about a value from the file starts with the file's path and line.
    pub fn from_layers(
        env: &[(String, Option<String>)],
        file: Option<&NodeFile>,
        sys: &dyn System,
    ) -> Config {
        let mut c = Config::blank();
        let mut given: Vec<Given> = env
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_deref(), None))
            .collect();
        if let Some(f) = file {
            c.errors.extend(f.problems.iter().cloned());
            for e in &f.entries {
                if let Some(at) = given.iter().position(|g| g.0 == e.name && g.2.is_some()) {
                    given.remove(at); // an earlier line of the file: the last one counts
                }
                if !given.iter().any(|g| g.0 == e.name) {
                    given.push((&e.name, e.value.as_deref(), Some(e.line)));
                }
            }
        }
        let where_ = |line: Option<usize>| match (file, line) {
            (Some(f), Some(l)) => format!("{}:{l}: ", f.path),
            _ => String::new(),
        };
        let find = |var: &Var| given.iter().find(|g| g.0 == var.name);
        for (var, set) in FIELDS {
            let at = find(var);
            if let Some(value) = at.map(|g| g.1).or(var.default.map(Some)) {
                let before = c.errors.len();
                let taken = c.read(var, set, value, sys);
                // Alone, it means nothing (a rejected value has its own line already).
                if let Some(need) = var.needs.filter(|need| taken && find(need).is_none()) {
                    c.errors.push(format!(
                        "{} is set without {}; ignored",
                        var.name, need.name
                    ));
                }
                let prefix = where_(at.and_then(|g| g.2));
                for e in &mut c.errors[before..] {
                    e.insert_str(0, &prefix);
                }
            }
        }
        for (name, value, line) in &given {
            if name.starts_with("PINGUARD_") && vars::find(name).is_none() {
                let near = vars::ALL
                    .iter()
                    .min_by_key(|k| edit_distance(k.name, name))
                    .map(|k| k.name)
                    .unwrap_or("");
                let shown = value.unwrap_or("(not UTF-8)");
                c.errors.push(format!(
                    "{}{}={shown:?} is not a pinguard variable (did you mean {near}?); ignored",
                    where_(*line),
                    name.escape_debug()
                ));
            }
        }
        c
    }

    /// Parses and stores one variable's value: whether it was taken. A rejected one gets its
    /// line, and the value it falls back to; a list's bad entries get one line each.
    fn read(&mut self, var: &Var, set: Set, value: Option<&str>, sys: &dyn System) -> bool {
        match var.parse(value).and_then(|v| resolve(v, var, sys)) {
            Ok(v) => {
                if let Value::Labels(_, bad) = &v {
                    self.errors
                        .extend(bad.iter().map(|why| var.rejected(value, why)));
                }
                set(self, v);
                true
            }
            Err(why) => {
                let line = var.rejected(value, &why);
                self.errors.push(match line.strip_suffix(var.fallback) {
                    Some(head) if self.strict => format!("{head}{STRICT_FALLBACK}"),
                    _ => line,
                });
                if let Some(left) = REJECTED
                    .iter()
                    .find(|(v, _)| v.name == var.name)
                    .map(|(_, left)| left)
                {
                    left(self);
                } else if let Some(instead) = var.default {
                    let applied = var
                        .parse(Some(instead))
                        .and_then(|v| resolve(v, var, sys))
                        .map(|v| set(self, v));
                    debug_assert!(
                        applied.is_ok(),
                        "{}'s fallback {instead:?} is rejected by its own parser",
                        var.name
                    );
                }
                false
            }
        }
    }

    /// Every setting unset, before the variables (and their defaults) are read.
    fn blank() -> Config {
        Config {
            budget: None,
            host_reserve: None,
            quiet_below: 1 << 20,
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
            device_memory: DeviceMemory::Auto,
            log: String::new(),
            disabled: false,
            group: None,
            group_budget: None,
            metrics: None,
            labels: Vec::new(),
            strict: false,
            errors: Vec::new(),
            notes: 0,
        }
    }

    /// Whether the process fails closed: `PINGUARD_STRICT` and a setting that could not be used
    /// (once every setting has been tried: the reserves and the group add their own lines). Then
    /// the line that says so joins the others.
    pub fn fails_closed(&mut self) -> bool {
        let unusable = self.errors.len().saturating_sub(self.notes);
        if !self.strict || unusable == 0 {
            return false;
        }
        self.errors.push(format!(
            "PINGUARD_STRICT=1 and {unusable} setting(s) above cannot be used: failing closed, every pinning call is REFUSED (reason config_error) for this process's life; fix the setting(s)"
        ));
        true
    }
}

/// What a rejected value's line ends with under `PINGUARD_STRICT`, instead of its fallback.
const STRICT_FALLBACK: &str = "REFUSING every pinning call instead (PINGUARD_STRICT)";

/// A size's percentage taken of the total its variable names, as bytes.
fn resolve(v: Value, var: &Var, sys: &dyn System) -> Result<Value, String> {
    match (v, var.parse) {
        (Value::Size(SizeSpec::Percent(p)), vars::Parse::Size(of)) => match sys.total(of) {
            Some(total) => Ok(Value::Size(SizeSpec::Bytes(
                (total as f64 * p / 100.0) as u64,
            ))),
            None => Err(of.missing().to_string()),
        },
        (v, _) => Ok(v),
    }
}

/// Stores a value its variable's parser took (and `resolve` resolved). The helpers below give
/// an empty value for another kind of value: an entry whose parser does not fit its field, which
/// the tests of every variable's default and values catch.
type Set = fn(&mut Config, Value);

fn bytes(v: Value) -> Option<u64> {
    match v {
        Value::Size(SizeSpec::Bytes(b)) => Some(b),
        _ => None,
    }
}

fn text(v: Value) -> Option<String> {
    match v {
        Value::Text(t) => Some(t),
        _ => None,
    }
}

fn count(v: Value) -> u64 {
    match v {
        Value::Count(n) => n,
        _ => 0,
    }
}

/// Where each variable's value goes, in the order they are read: the switch first, then the
/// registry's order (`GROUP` before `GROUP_BUDGET`, which needs it), so that the errors come in
/// that order. Every variable once (checked by a test).
const FIELDS: [(&Var, Set); 26] = [
    (&vars::DISABLE, |c, v| {
        c.disabled = matches!(v, Value::Switch(true))
    }),
    // Before every setting it makes fail closed, so that their lines say so.
    (&vars::STRICT, |c, v| {
        c.strict = matches!(v, Value::Switch(true))
    }),
    (&vars::BUDGET, |c, v| c.budget = bytes(v)),
    // `u64::MAX` is the reserve's "off": a floor that high is kept, one byte lower.
    (&vars::QUIET_BELOW, |c, v| {
        c.quiet_below = bytes(v).unwrap_or(1 << 20)
    }),
    (&vars::HOST_RESERVE, |c, v| {
        c.host_reserve = bytes(v).map(|r| r.min(u64::MAX - 1))
    }),
    (&vars::CGROUP_RESERVE, |c, v| {
        c.cgroup_reserve = bytes(v).map(|r| r.min(u64::MAX - 1))
    }),
    (&vars::POLICY, |c, v| {
        c.policy = if let Value::Index(i) = v {
            Policy::ALL[i]
        } else {
            Policy::Error
        }
    }),
    (&vars::DOWNGRADE_MATCH, |c, v| {
        c.downgrade_match = if let Value::Patterns(p) = v {
            Some(p)
        } else {
            None
        }
    }),
    (&vars::REPORT, |c, v| c.report = text(v)),
    (&vars::DEPTH, |c, v| c.depth = count(v) as u32),
    (&vars::PY_DEPTH, |c, v| c.py_depth = count(v) as u32),
    (&vars::MAX_CALLSITES, |c, v| {
        c.max_callsites = count(v) as usize
    }),
    (&vars::INTERVAL, |c, v| {
        c.interval_ms = if let Value::Ms(ms) = v {
            Some(ms)
        } else {
            None
        }
    }),
    (&vars::SIGNAL, |c, v| {
        c.signal = if let Value::Signal(s) = v {
            Some(s)
        } else {
            None
        }
    }),
    (&vars::HOOKS, |c, v| {
        c.hooks = if let Value::Bits(b) = v { b as u8 } else { 0 }
    }),
    (&vars::DEVICE_MEMORY, |c, v| {
        c.device_memory = if let Value::Index(i) = v {
            DeviceMemory::ALL[i]
        } else {
            DeviceMemory::Auto
        }
    }),
    // An empty filter is taken, and means the default.
    (&vars::LOG, |c, v| {
        c.log = text(v)
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| vars::LOG.default.unwrap_or_default().to_string())
    }),
    (&vars::GROUP, |c, v| c.group = text(v)),
    (&vars::GROUP_BUDGET, |c, v| c.group_budget = bytes(v)),
    (&vars::METRICS, |c, v| c.metrics = text(v)),
    (&vars::NAMESPACE, |c, v| label(c, "namespace", v)),
    (&vars::POD, |c, v| label(c, "pod", v)),
    (&vars::CONTAINER, |c, v| label(c, "container", v)),
    (&vars::LABELS, labels),
    // Read before start-up, raw (`node::load`): here only checked, so a bad one gets its line.
    (&vars::CONFIG, |_, _| {}),
    // `pinguard check`'s: the name is known, the value none of the library's business.
    (&vars::SUPPRESSIONS, |_, _| {}),
];

type Leave = fn(&mut Config);

/// What a rejected value leaves, where that is neither its registry default nor unset.
const REJECTED: [(&Var, Leave); 2] = [
    (&vars::DOWNGRADE_MATCH, |c| {
        c.downgrade_match = Some(Vec::new())
    }),
    // A switch meant to fail closed that cannot be read fails closed.
    (&vars::STRICT, |c| c.strict = true),
];

/// A downward-API label, when set to something.
fn label(c: &mut Config, name: &str, v: Value) {
    if let Some(t) = text(v).filter(|t| !t.is_empty()) {
        c.labels.push((name.to_string(), t));
    }
}

/// `PINGUARD_LABELS`' good entries (`Config::read` has listed the bad ones).
fn labels(c: &mut Config, v: Value) {
    if let Value::Labels(good, _) = v {
        c.labels.extend(good);
    }
}

/// `PINGUARD_DISABLE`'s value: whether it switches pinguard off; `None` when it is no switch
/// (pinguard then stays enabled). Without allocating: the hooks also ask before pinguard has
/// started (`early_hooks_enabled`), and both must answer alike.
pub fn disable_switch(v: &[u8]) -> Option<bool> {
    vars::switch(v)
}

/// `PINGUARD_HOOKS`' value: the families it names, or the first item that names none
/// (`Err(None)`: no family at all); on either error every family is hooked. Without allocating.
pub fn hooks_switch(v: &[u8]) -> Result<u8, Option<&[u8]>> {
    vars::names_switch(v, &vars::FAMILIES).map(|bits| bits as u8)
}

/// Whether pinguard is switched off, from `PINGUARD_DISABLE`'s raw value, as `Config` decides.
pub fn early_disabled(disable: Option<&[u8]>) -> bool {
    disable.and_then(disable_switch) == Some(true)
}

/// Whether `family` is hooked, from the raw values of `PINGUARD_DISABLE` and `PINGUARD_HOOKS`,
/// exactly as `Config` decides (for the calls that come before pinguard has started).
pub fn early_hooks_enabled(disable: Option<&[u8]>, hooks: Option<&[u8]>, family: Family) -> bool {
    !early_disabled(disable)
        && hooks.is_none_or(|h| hooks_switch(h).map_or(true, |bits| bits & family.bit() != 0))
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push(
                (prev[j] + (ca != *cb) as usize)
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1),
            );
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_early_switches_answer_as_the_configuration_does() {
        let values = [
            "1",
            " 1 ",
            "true",
            "yes",
            "0",
            "",
            "no",
            "maybe",
            "cuda",
            "CUDA ",
            "cuda,opencl",
            " , ",
            "acl,mlock",
            "cuda-driver",
            "all",
            "ALL,cuda",
            "all,opencl",
        ];
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
                    let early =
                        early_hooks_enabled(d.map(|s| s.as_bytes()), h.map(|s| s.as_bytes()), f);
                    let late = !c.disabled && c.hooks & f.bit() != 0;
                    assert_eq!(
                        early,
                        late,
                        "PINGUARD_DISABLE={d:?} PINGUARD_HOOKS={h:?}, {}",
                        f.name()
                    );
                }
                assert_eq!(
                    early_disabled(d.map(|s| s.as_bytes())),
                    c.disabled,
                    "PINGUARD_DISABLE={d:?}"
                );
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
        assert_eq!(
            cfg(&[("PINGUARD_HOST_RESERVE", "1.5G")]).host_reserve,
            Some(3 << 29)
        );
        assert_eq!(
            cfg(&[("PINGUARD_HOST_RESERVE", "18446744073709551615")]).host_reserve,
            Some(u64::MAX - 1),
            "not the word for off"
        );
        let c = Config::from_vars(
            &[("PINGUARD_HOST_RESERVE".into(), Some("10%".into()))],
            &Fixed(None),
        );
        assert_eq!(c.host_reserve, None);
        assert!(
            c.errors[0].contains("no MemTotal")
                && c.errors[0].contains("running WITHOUT a host reserve"),
            "{:?}",
            c.errors
        );
        let c = cfg(&[("PINGUARD_HOST_RESERVE", "lots")]);
        assert_eq!((c.host_reserve, c.errors.len()), (None, 1));
        assert!(
            c.errors[0].starts_with("PINGUARD_HOST_RESERVE=\"lots\""),
            "{:?}",
            c.errors
        );
    }

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let v: Vec<_> = vars
            .iter()
            .map(|(a, b)| (a.to_string(), Some(b.to_string())))
            .collect();
        Config::from_vars(&v, &Fixed(Some(1 << 30)))
    }

    #[test]
    fn every_unset_variable_means_its_registry_default() {
        let c = Config::default();
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        assert_eq!(
            (c.policy, c.depth, c.py_depth, c.log.as_str(), c.disabled),
            (Policy::Error, 32, 32, "warn", false)
        );
        assert_eq!(c.max_callsites, vars::DEFAULT_MAX_CALLSITES);
        assert_eq!(c.hooks, Family::ALL.iter().fold(0, |m, f| m | f.bit()));
        assert_eq!(
            (
                c.budget,
                c.report.as_deref(),
                c.interval_ms,
                c.signal,
                c.group.as_deref(),
                c.metrics.as_deref()
            ),
            (None, None, None, None, None, None)
        );
        // A registry default is a value its variable's parser takes, and gives the same.
        for var in pinguard_common::vars::ALL {
            if let Some(d) = var.default {
                let set = cfg(&[(var.name, d)]);
                assert!(
                    set.errors.is_empty(),
                    "{}={d:?}: {:?}",
                    var.name,
                    set.errors
                );
                assert_eq!(format!("{set:?}"), format!("{c:?}"), "{}={d:?}", var.name);
            }
        }
    }

    #[test]
    fn a_rejected_value_falls_back_to_the_registry_default() {
        let c = cfg(&[
            ("PINGUARD_DEPTH", "129"),
            ("PINGUARD_HOOKS", "opencl"),
            ("PINGUARD_LOG", "pinguard=loud"),
            ("PINGUARD_POLICY", "explode"),
        ]);
        let d = Config::default();
        assert_eq!(
            (c.depth, c.hooks, c.log.as_str(), c.policy),
            (d.depth, d.hooks, d.log.as_str(), d.policy)
        );
        assert_eq!(c.errors.len(), 4, "{:?}", c.errors);
        assert!(
            c.errors
                .iter()
                .any(|e| e.contains("expected a whole number from 0 to 128; using 32")),
            "{:?}",
            c.errors
        );
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
        let got: Vec<(&str, &str)> = c
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("namespace", "team-a"),
                ("pod", "trainer-0"),
                ("zone", "eu-1"),
                ("_x", "a=b"),
                ("Team9", "ml")
            ]
        );
        let bad: Vec<&String> = c
            .errors
            .iter()
            .filter(|e| e.starts_with("PINGUARD_LABELS="))
            .collect();
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
            assert!(
                bad.iter().any(|e| e.contains(&format!("entry {entry:?}: "))
                    && e.contains(why)
                    && e.ends_with("that entry is left out")),
                "{entry}: {bad:#?}"
            );
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
        assert!(c
            .errors
            .iter()
            .any(|e| e.contains("did you mean PINGUARD_BUDGET")));
        assert!(c.errors.iter().all(|e| !e.contains('\n')));
    }

    /// The hooks read `PINGUARD_DEVICE_MEMORY` raw before start-up; they must answer as the
    /// configuration does, a bad value (`auto`, with one line) included.
    #[test]
    fn device_memory_read_early_answers_as_the_configuration() {
        for v in [
            None,
            Some("auto"),
            Some("host"),
            Some(" Device "),
            Some("HOST"),
            Some("sometimes"),
            Some(""),
        ] {
            let vars: Vec<(String, Option<String>)> = v
                .map(|v| vec![("PINGUARD_DEVICE_MEMORY".to_string(), Some(v.to_string()))])
                .unwrap_or_default();
            let c = Config::from_vars(&vars, &Fixed(None));
            assert_eq!(
                DeviceMemory::from_raw(v.map(str::as_bytes)),
                c.device_memory,
                "PINGUARD_DEVICE_MEMORY={v:?}"
            );
            let bad = c
                .errors
                .iter()
                .filter(|e| e.contains("PINGUARD_DEVICE_MEMORY"));
            let want = usize::from(matches!(v, Some("sometimes") | Some("")));
            assert_eq!(bad.count(), want, "{v:?}: {:?}", c.errors);
        }
        assert_eq!(
            DeviceMemory::from_raw(Some(b"host")),
            DeviceMemory::Host,
            "the names' order is the enum's"
        );
    }

    #[test]
    fn every_variable_has_one_place_in_the_configuration() {
        for var in vars::ALL {
            assert_eq!(
                FIELDS.iter().filter(|(v, _)| v.name == var.name).count(),
                1,
                "{}",
                var.name
            );
        }
        assert_eq!(FIELDS.len(), vars::ALL.len());
        // `GROUP_BUDGET` is read after the variable it needs.
        let at = |name: &str| FIELDS.iter().position(|(v, _)| v.name == name);
        for (var, _) in FIELDS {
            if let Some(need) = var.needs {
                assert!(
                    at(need.name) < at(var.name),
                    "{} before {}",
                    need.name,
                    var.name
                );
            }
        }
    }

    #[test]
    fn the_environment_overrides_the_node_file_whose_last_line_counts() {
        let entry = |line, name: &str, value: &str| pinguard_common::node::Entry {
            line,
            name: name.into(),
            value: Some(value.into()),
        };
        let file = NodeFile {
            path: "/n.conf".into(),
            entries: vec![
                entry(1, "PINGUARD_POLICY", "warn"),
                entry(2, "PINGUARD_POLICY", "downgrade"),
                entry(3, "PINGUARD_BUDGET", "1K"),
                entry(4, "PINGUARD_DEPTH", "999"),
                entry(5, "PINGUARD_GROUP_BUDGET", "1M"),
            ],
            problems: vec!["/n.conf:6: \"x\" is not NAME=value; ignored".into()],
        };
        let env = [("PINGUARD_BUDGET".to_string(), Some("2K".to_string()))];
        let c = Config::from_layers(&env, Some(&file), &Fixed(Some(1 << 30)));
        assert_eq!(
            (c.policy, c.budget, c.depth),
            (Policy::Downgrade, Some(2048), 32)
        );
        assert_eq!(c.errors.len(), 3, "{:#?}", c.errors);
        assert!(c.errors[0].starts_with("/n.conf:6: "));
        assert!(c.errors[1].starts_with("/n.conf:4: PINGUARD_DEPTH=\"999\""));
        assert!(c.errors[2].starts_with("/n.conf:5: PINGUARD_GROUP_BUDGET is set without"));
    }

    #[test]
    fn every_family_is_named_by_the_registry() {
        assert_eq!(Family::ALL.len(), vars::FAMILIES.len());
        for (i, f) in Family::ALL.into_iter().enumerate() {
            assert_eq!((f.name(), f.bit()), (vars::FAMILIES[i], 1 << i));
        }
    }
}
