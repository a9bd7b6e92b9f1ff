//! Every `PINGUARD_*` variable, declared once: its name, its parser and the parser's bounds, its
//! accepted forms, what an unset one means, and what a rejected value falls back to. The library
//! (`Config::from_vars`, and its early switches) parses each variable with its entry's parser and
//! says what it rejects in the one shape `Var::rejected` writes; `pinguard run` and `pinguard cdi`
//! check the values they pass on with the same parsers; the variable table of docs/settings.md is this table
//! (`table`, checked by a test).

use crate::units::{self, SizeSpec};

/// One variable.
#[derive(Debug)]
pub struct Var {
    pub name: &'static str,
    /// What it does and the values it takes, for people (the table's "meaning" column).
    pub meaning: &'static str,
    /// The value an unset variable stands for, in the variable's own forms, which the parser reads
    /// like any other value; `None`: unset means the feature is off or absent.
    pub default: Option<&'static str>,
    /// What unset means, for people (the table's "default" column).
    pub unset: &'static str,
    /// The accepted forms, as the message for a rejected value names them.
    pub forms: &'static str,
    /// What a rejected value falls back to, as its message says.
    pub fallback: &'static str,
    /// How a value is read, with its bounds.
    pub parse: Parse,
    /// The variable without which this one means nothing: set alone, it is a configuration error.
    pub needs: Option<&'static Var>,
}

/// The report path template an unset `PINGUARD_REPORT` stands for.
pub const DEFAULT_TEMPLATE: &str = "pinguard.%e.%n.%p.json";

/// Frames per stack at most (`PINGUARD_DEPTH`, `PINGUARD_PY_DEPTH`).
pub const MAX_DEPTH: u32 = 128;

pub const BUDGET: Var = Var {
    name: "PINGUARD_BUDGET",
    meaning: "cap on live pinned bytes: `1073741824`, `512Mi`, `8Gi`, `1.5GiB`, `2T` (K/M/G/T/P are powers of 1024, alone or with `B`, `i` or `iB`, any case: unlike Kubernetes, `G` is 1024^3 too, so prefer `Gi`), or `N%` of the cgroup memory limit (else of `MemTotal`); `0` lets nothing be pinned (every pinning call gets the policy)",
    default: None,
    unset: "none: track only",
    forms: "bytes such as 1073741824, 512Mi, 8Gi, 1.5GiB, 2T (K/M/G/T and Ki/Mi/Gi/Ti alike = powers of 1024) or N% of the memory limit",
    fallback: "running WITHOUT a budget: nothing is capped",
    parse: Parse::Size(Of::MemoryLimit),
    needs: None,
};

pub const HOST_RESERVE: Var = Var {
    name: "PINGUARD_HOST_RESERVE",
    meaning: "a floor under the host's `MemAvailable`: a pinning call that would take it below gets the policy, as over the budget. Forms of `PINGUARD_BUDGET`, `N%` being of `MemTotal`; the strictest of the budgets wins; a group's members share it (below)",
    default: None,
    unset: "none",
    forms: "bytes such as 1073741824, 512Mi, 8Gi, 1.5GiB, 2T (K/M/G/T and Ki/Mi/Gi/Ti alike = powers of 1024) or N% of MemTotal",
    fallback: "running WITHOUT a host reserve",
    parse: Parse::Size(Of::MemTotal),
    needs: None,
};

pub const CGROUP_RESERVE: Var = Var {
    name: "PINGUARD_CGROUP_RESERVE",
    meaning: "a floor under the headroom of the process's memory cgroup before its OOM killer (the least, over the limited levels of its path, of limit - usage + reclaimable page cache): a pinning call that would take it below gets the policy, as over the budget. Forms of `PINGUARD_BUDGET`, `N%` being of the tightest limit; pages the cgroup does not charge never move it (`pinguard doctor --probe` says which)",
    default: None,
    unset: "none",
    forms: "bytes such as 1073741824, 512Mi, 8Gi, 1.5GiB, 2T (K/M/G/T and Ki/Mi/Gi/Ti alike = powers of 1024) or N% of the cgroup's memory limit",
    fallback: "running WITHOUT a cgroup reserve",
    parse: Parse::Size(Of::CgroupLimit),
    needs: None,
};

pub const POLICY: Var = Var {
    name: "PINGUARD_POLICY",
    meaning: "what an over-budget call gets: `error`, `downgrade` or `warn` (below)",
    default: Some("error"),
    unset: "`error`",
    forms: "error, downgrade or warn",
    fallback: "using error",
    parse: Parse::OneOf {
        names: &POLICIES,
        why: "unknown policy",
    },
    needs: None,
};

pub const REPORT: Var = Var {
    name: "PINGUARD_REPORT",
    meaning: "report path template: `%p` pid, `%e` executable name, `%h` host name, `%t` start time (unix seconds), `%n` the PID namespace's inode number (with `%p`, unique among a host's live processes, whatever container they run in), `%%` a percent sign; each expansion is one file name's worth (no `/`, no leading `.`), and no `..` may follow one; missing directories the template names literally are created (never one an expansion names, nor any in a setuid process); a relative path is taken from the working directory at start-up. A template without `%p` gets `.<pid>` before its `.json` (or at its end), so children never overwrite their parent's report; a name another process's file holds is never used: the report (and state) then take that name with an unpredictable word before `.json`. An existing directory (no `%`) means a file in it with the default name; a report that cannot be written where asked goes to `$TMPDIR`, not in a setuid process, and the exit line says so",
    // Unset is not the same as the default template given: only the default falls back to the
    // temporary folder when the working directory is not writable.
    default: None,
    unset: "`pinguard.%e.%n.%p.json` in the working directory, or in `$TMPDIR` (else `/tmp`) when that is not writable",
    forms: "a path with %p, %e, %h, %t, %n or %%",
    fallback: "using pinguard.%e.%n.%p.json",
    parse: Parse::Template,
    needs: None,
};

pub const DOWNGRADE_MATCH: Var = Var {
    name: "PINGUARD_DOWNGRADE_MATCH",
    meaning: "under `downgrade`, downgrade only callsites matching one of these comma-separated globs anywhere in the stack (a Python frame's file or qualified name, a native frame's symbol or module file); the rest are refused as under `error`",
    default: None,
    unset: "every call pageable memory can serve",
    forms: "a comma list of glob patterns such as *torch/utils/data/_utils/pin_memory.py",
    fallback: "nothing is downgraded (refused as under error)",
    parse: Parse::Patterns,
    needs: None,
};

pub const DEPTH: Var = Var {
    name: "PINGUARD_DEPTH",
    meaning: "frames kept per stack, 0 to 128 (0: no stacks)",
    default: Some("32"),
    unset: "32",
    forms: "a whole number from 0 to 128",
    fallback: "using 32",
    parse: Parse::Count {
        min: 0,
        max: MAX_DEPTH as u64,
        why: "not a frame count",
    },
    needs: None,
};

pub const PY_DEPTH: Var = Var {
    name: "PINGUARD_PY_DEPTH",
    meaning: "Python frames kept per callsite in a CPython process, 0 to 128 (0: none; see \"Python callsites\")",
    default: Some("32"),
    unset: "32",
    forms: "a whole number from 0 to 128",
    fallback: "using 32",
    parse: Parse::Count { min: 0, max: MAX_DEPTH as u64, why: "not a frame count" },
    needs: None,
};

/// The callsites an unset `PINGUARD_MAX_CALLSITES` stands for.
pub const DEFAULT_MAX_CALLSITES: usize = 1024;
/// The most `PINGUARD_MAX_CALLSITES` takes.
pub const MAX_MAX_CALLSITES: usize = 1 << 20;

pub const MAX_CALLSITES: Var = Var {
    name: "PINGUARD_MAX_CALLSITES",
    meaning: "callsites kept apart and listed in a report, 1 to 1048576: beyond it, callsites with nothing live are folded into one aggregate (`callsites_folded`: how many, their calls and bytes, the highest peak), so that memory, the state file and the report stay bounded however many distinct stacks pin; a callsite with live allocations is always kept",
    default: Some("1024"),
    unset: "1024",
    forms: "a whole number from 1 to 1048576",
    fallback: "using 1024",
    parse: Parse::Count { min: 1, max: MAX_MAX_CALLSITES as u64, why: "not a callsite count" },
    needs: None,
};

pub const INTERVAL: Var = Var {
    name: "PINGUARD_INTERVAL",
    meaning: "also rewrite the report periodically (reason `interval`) from a background thread: `500ms`, `30s`, `5m`, `1h`. A process killed with SIGKILL leaves its last complete snapshot",
    default: None,
    unset: "off",
    forms: crate::units::DURATION_FORMS,
    fallback: "no periodic report",
    parse: Parse::Duration,
    needs: None,
};

pub const SIGNAL: Var = Var {
    name: "PINGUARD_SIGNAL",
    meaning: "also write the report (reason `signal`) when this signal arrives: `SIGUSR2`, `USR2` or a number. The application's own handler still runs, and pinguard follows the application's latest disposition of the signal (`docs/design.md`)",
    default: None,
    unset: "off",
    forms: "a signal such as SIGUSR2, USR2 or 12",
    fallback: "no report on a signal",
    parse: Parse::Signal,
    needs: None,
};

pub const HOOKS: Var = Var {
    name: "PINGUARD_HOOKS",
    meaning: "families to intercept, a comma list of `cuda`, `cuda-driver`, `acl`, `mlock`, `hip`, `ibverbs`, `ascend-hal`, or `all`; the others pass through untouched (and their `dlsym`/`dlvsym`/`cuGetProcAddress`/`hipGetProcAddress` redirection is off)",
    default: Some("all"),
    unset: "all",
    forms: "a comma list of cuda, cuda-driver, acl, mlock, hip, ibverbs, ascend-hal, or all",
    fallback: "hooking all of them",
    parse: Parse::Names { names: &FAMILIES, noun: "family" },
    needs: None,
};

pub const DEVICE_MEMORY: Var = Var {
    name: "PINGUARD_DEVICE_MEMORY",
    meaning: "whether device allocations (`cudaMalloc`, `cudaMallocManaged`, `cuMemAlloc_v2`, `cuMemAllocManaged`, `hipMalloc`, `hipMallocManaged`) count as host bytes, against the budgets and both reserves, with their callsites: `host` always, `device` never, `auto` where the device says it is integrated (its memory is the host's: DGX Spark GB10, Jetson, AMD APUs), asked once per runtime through the API the program uses",
    default: Some("auto"),
    unset: "`auto`",
    forms: "auto, host or device",
    fallback: "using auto",
    parse: Parse::OneOf {
        names: &DEVICE_MEMORY_MODES,
        why: "unknown device memory mode",
    },
    needs: None,
};

pub const LOG: Var = Var {
    name: "PINGUARD_LOG",
    meaning:
        "diagnostics on stderr, in `tracing`'s filter syntax (`warn`, `info`, `pinguard=debug`); `debug` adds the settings in force and the group's ledger, `trace` is refused",
    default: Some("warn"),
    unset: "`warn`",
    forms: "a filter such as warn, info or pinguard=debug (levels error, warn, info, debug)",
    fallback: "using warn",
    parse: Parse::Filter,
    needs: None,
};

pub const DISABLE: Var = Var {
    name: "PINGUARD_DISABLE",
    meaning: "`1`: pass every call through untouched",
    default: Some("0"),
    unset: "off",
    forms: "1 or 0",
    fallback: "pinguard stays enabled",
    parse: Parse::Switch,
    needs: None,
};

pub const GROUP: Var = Var {
    name: "PINGUARD_GROUP",
    meaning: "join the group of this name (letters, digits, `.`, `_`, `-`; up to 64): every process of the group on the host shares one budget (`docs/deploy.md`)",
    default: None,
    unset: "none",
    forms: "up to 64 letters, digits, '.', '_' or '-'",
    fallback: "running WITHOUT a group budget",
    parse: Parse::GroupName,
    needs: None,
};

pub const GROUP_BUDGET: Var = Var {
    name: "PINGUARD_GROUP_BUDGET",
    meaning: "the group's budget, in the forms of `PINGUARD_BUDGET`; set by the group's first member (a later member with another value gets a warning and the first value)",
    default: None,
    unset: "none: the group is only counted",
    forms: BUDGET.forms,
    fallback: "running WITHOUT a group budget",
    parse: Parse::Size(Of::MemoryLimit),
    needs: Some(&GROUP),
};

/// How often a process rewrites its metrics file when `PINGUARD_INTERVAL` is unset or longer: the
/// file's age is how writers in other PID namespaces tell a dead writer's file (`docs/design.md`,
/// "Metrics").
pub const METRICS_INTERVAL_MS: u64 = 15_000;

pub const METRICS: Var = Var {
    name: "PINGUARD_METRICS",
    meaning: "a Prometheus text-format file (mode 0644, for node_exporter's textfile collector) at this path template (as `PINGUARD_REPORT`), from a process's first pinning call on (a refusal or a downgrade counts), rewritten every 15 s (every `PINGUARD_INTERVAL` when shorter), removed when the process exits; a killed process's file is removed by the next writer in the folder (`docs/internals.md`, \"Metrics\"). Without `%p`, the pid goes before `.prom`; for containers sharing one folder, `pinguard.%n.%p.prom` names every process apart",
    default: None,
    unset: "off",
    forms: "a path with %p, %e, %h, %t, %n or %%",
    fallback: "no metrics file",
    parse: Parse::Template,
    needs: None,
};

pub const NAMESPACE: Var = Var {
    name: "PINGUARD_NAMESPACE",
    meaning: "the `namespace` label on every metrics series (Kubernetes: the downward API's `metadata.namespace`)",
    default: None,
    unset: "no label",
    forms: "any text",
    fallback: "no namespace label",
    parse: Parse::Text,
    needs: None,
};

pub const POD: Var = Var {
    name: "PINGUARD_POD",
    meaning:
        "the `pod` label on every metrics series (Kubernetes: the downward API's `metadata.name`)",
    default: None,
    unset: "no label",
    forms: "any text",
    fallback: "no pod label",
    parse: Parse::Text,
    needs: None,
};

pub const CONTAINER: Var = Var {
    name: "PINGUARD_CONTAINER",
    meaning: "the `container` label on every metrics series (Kubernetes: the container's name, written in the manifest)",
    default: None,
    unset: "no label",
    forms: "any text",
    fallback: "no container label",
    parse: Parse::Text,
    needs: None,
};

pub const LABELS: Var = Var {
    name: "PINGUARD_LABELS",
    meaning: "more labels on every metrics series: `key=value,...`; a name is letters, digits and `_`, not starting with a digit or `__`, and not one of pinguard's own labels; a bad entry is a configuration error, the others are used",
    default: None,
    unset: "none",
    forms: "a comma list of name=value, names of letters, digits and _ (not starting with a digit or __, not pid, pidns, exe, api, group, namespace, pod, container or container_id)",
    fallback: "that entry is left out",
    parse: Parse::Labels,
    needs: None,
};

pub const CONFIG: Var = Var {
    name: "PINGUARD_CONFIG",
    meaning: "the node configuration file to read instead of `/etc/pinguard/pinguard.conf` (empty: none): the registry's variables as `NAME=value` lines, `#` comments; it must be owned by root (or the process's own user) and writable by nobody else, as must its folder; the environment's values override it. A secure-mode (setuid, file capabilities) process ignores this and every other variable of the environment and reads only `/etc/pinguard/pinguard.conf` (`docs/deploy.md`, \"Trust model\")",
    default: None,
    unset: "`/etc/pinguard/pinguard.conf`, when present",
    forms: "an absolute path, or nothing for no file",
    fallback: "using /etc/pinguard/pinguard.conf",
    parse: Parse::Path,
    needs: None,
};

pub const STRICT: Var = Var {
    name: "PINGUARD_STRICT",
    meaning: "`1`: fail closed on a setting that cannot be used (a rejected value, an unknown `PINGUARD_` name, a reserve with nothing to take a percentage of, a group that cannot be joined, a node file ignored): every pinning call is then refused, as under `error` whatever the policy, with reason `config_error`, for the process's life. Unset, such a setting falls back (`running WITHOUT a budget`, ...). Also in the node configuration file",
    default: Some("0"),
    unset: "off: a setting that cannot be used falls back",
    forms: "1 or 0",
    fallback: "strict all the same (a bad value of the switch that fails closed fails closed)",
    parse: Parse::Switch,
    needs: None,
};

pub const SUPPRESSIONS: Var = Var {
    name: "PINGUARD_SUPPRESSIONS",
    meaning: "read by `pinguard check` only (the library knows the name and ignores it): the suppressions file it reads when `--suppressions` is not given (`docs/cli.md`, \"Suppressions\")",
    default: None,
    unset: "none",
    forms: "a path",
    fallback: "no suppressions",
    parse: Parse::Text,
    needs: None,
};

/// Every variable pinguard reads, in the table's order; any other `PINGUARD_` name is probably
/// a typo, and is reported as one.
pub const QUIET_BELOW: Var = Var {
    name: "PINGUARD_QUIET_BELOW",
    meaning: "a process that pinned only through the `mlock` family and never held more than this at once writes no report and prints no exit line, unless a report was asked for (`PINGUARD_REPORT` in the environment or the node configuration file, which `pinguard run` sets): under a node-wide preload, `gpg`'s 32 KiB of secure memory leaves nothing in a working tree, while a GPU process still reports. Forms of `PINGUARD_BUDGET`; `0` reports every process that pinned",
    default: Some("1Mi"),
    unset: "1 MiB",
    forms: "bytes such as 1073741824, 512Mi, 8Gi, 1.5GiB, 2T (K/M/G/T and Ki/Mi/Gi/Ti alike = powers of 1024) or N% of the memory limit",
    fallback: "using 1 MiB",
    parse: Parse::Size(Of::MemoryLimit),
    needs: None,
};

pub const ALL: &[&Var] = &[
    &BUDGET,
    &HOST_RESERVE,
    &CGROUP_RESERVE,
    &POLICY,
    &DOWNGRADE_MATCH,
    &REPORT,
    &DEPTH,
    &PY_DEPTH,
    &MAX_CALLSITES,
    &INTERVAL,
    &SIGNAL,
    &HOOKS,
    &DEVICE_MEMORY,
    &LOG,
    &DISABLE,
    &GROUP,
    &GROUP_BUDGET,
    &METRICS,
    &NAMESPACE,
    &POD,
    &CONTAINER,
    &LABELS,
    &CONFIG,
    &STRICT,
    &SUPPRESSIONS,
    &QUIET_BELOW,
];

/// The variable of this name.
pub fn find(name: &str) -> Option<&'static Var> {
    ALL.iter().copied().find(|v| v.name == name)
}

/// The table of variables in `docs/settings.md`, in Markdown.
pub fn table() -> String {
    let mut t = String::from("| variable | meaning | default |\n| --- | --- | --- |\n");
    for v in ALL {
        t.push_str(&format!("| `{}` | {} | {} |\n", v.name, v.meaning, v.unset));
    }
    t
}

/// What a `N%` size is a percentage of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Of {
    /// The cgroup memory limit, else `MemTotal`.
    MemoryLimit,
    /// The host's `MemTotal`.
    MemTotal,
    /// The tightest cgroup memory limit on the process's path.
    CgroupLimit,
}

impl Of {
    /// Why a percentage cannot be taken when there is no such total.
    pub fn missing(self) -> &'static str {
        match self {
            Of::MemoryLimit => "no memory limit or MemTotal to take a percentage of",
            Of::MemTotal => "no MemTotal in /proc/meminfo to take a percentage of",
            Of::CgroupLimit => "no cgroup memory limit to take a percentage of",
        }
    }
}

/// How a variable's value is read: each entry's one parser, with its bounds.
#[derive(Clone, Copy, Debug)]
pub enum Parse {
    /// `1`, `true`, `yes` or `0`, empty, `false`, `no` (`switch`).
    Switch,
    /// A size (`units::parse_size_spec`), or `N%` of what `Of` names.
    Size(Of),
    /// One of these names, in any case: `Value::Index` into them.
    OneOf {
        names: &'static [&'static str],
        why: &'static str,
    },
    /// A whole number from `min` to `max`.
    Count {
        min: u64,
        max: u64,
        why: &'static str,
    },
    /// A comma list of glob patterns.
    Patterns,
    /// A path template (`units::check_template`).
    Template,
    /// A duration (`units::parse_duration_ms`).
    Duration,
    /// A signal that can be caught safely (`units::parse_signal`).
    Signal,
    /// A comma list of these names, or `all`: `Value::Bits`, a bit per name (`names_switch`).
    Names {
        names: &'static [&'static str],
        noun: &'static str,
    },
    /// A `tracing` filter.
    Filter,
    /// A group name (`group::valid_name`), trimmed.
    GroupName,
    /// Any text.
    Text,
    /// An absolute path, or nothing (`Value::Text`).
    Path,
    /// A comma list of `name=value` metrics labels (`label_entry`).
    Labels,
}

/// A value its variable's parser took.
#[derive(Clone, Debug)]
pub enum Value {
    Switch(bool),
    Size(SizeSpec),
    Index(usize),
    Count(u64),
    Patterns(Vec<glob::Pattern>),
    Text(String),
    Ms(u64),
    Signal(i32),
    Bits(u32),
    /// The good entries, and one reason per rejected entry (each a configuration error of its
    /// own, the others being used).
    Labels(Vec<(String, String)>, Vec<String>),
}

impl Parse {
    /// The one reason a parser gives for every value it rejects, where it has one.
    fn one_reason(self) -> Option<&'static str> {
        match self {
            Parse::Switch => Some("not a switch"),
            Parse::OneOf { why, .. } | Parse::Count { why, .. } => Some(why),
            Parse::GroupName => Some("not a group name"),
            _ => None,
        }
    }

    /// Reads `value` (`None`: not UTF-8), or says why not.
    pub fn parse(self, value: Option<&str>) -> Result<Value, String> {
        let Some(v) = value else {
            return Err(self.one_reason().unwrap_or("not UTF-8").into());
        };
        self.parse_str(v)
            .map_err(|e| self.one_reason().map_or(e, str::to_string))
    }

    fn parse_str(self, v: &str) -> Result<Value, String> {
        Ok(match self {
            Parse::Switch => Value::Switch(switch(v.as_bytes()).ok_or("")?),
            Parse::Size(_) => Value::Size(units::parse_size_spec(v)?),
            Parse::OneOf { names, .. } => Value::Index(
                names
                    .iter()
                    .position(|n| n.eq_ignore_ascii_case(v.trim()))
                    .ok_or("")?,
            ),
            Parse::Count { min, max, .. } => Value::Count(
                v.trim()
                    .parse()
                    .ok()
                    .filter(|n| (min..=max).contains(n))
                    .ok_or("")?,
            ),
            Parse::Patterns => Value::Patterns(units::parse_patterns(v)?),
            Parse::Template => Value::Text(units::check_template(v).map(|()| v.to_string())?),
            Parse::Duration => Value::Ms(units::parse_duration_ms(v)?),
            Parse::Signal => Value::Signal(units::parse_signal(v)?),
            Parse::Names { names, noun } => {
                Value::Bits(names_switch(v.as_bytes(), names).map_err(|e| match e {
                    Some(item) => format!("unknown {noun} {:?}", String::from_utf8_lossy(item)),
                    None => format!("names no {noun}"),
                })?)
            }
            Parse::Filter => Value::Text(filter(v)?),
            Parse::GroupName => Value::Text(
                Some(v.trim())
                    .filter(|n| crate::group::valid_name(n))
                    .ok_or("")?
                    .to_string(),
            ),
            Parse::Text => Value::Text(v.to_string()),
            Parse::Path => Value::Text(
                Some(v.trim())
                    .filter(|p| p.is_empty() || p.starts_with('/'))
                    .ok_or("not an absolute path")?
                    .to_string(),
            ),
            Parse::Labels => labels(v),
        })
    }
}

/// A `tracing` filter without `trace`: pinguard writes nothing at that level, since a line per
/// hooked call would cost every call a test of the level even with the line off.
fn filter(v: &str) -> Result<String, String> {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    let t = v.parse::<Targets>().map_err(|e| e.to_string())?;
    if t.default_level() == Some(LevelFilter::TRACE)
        || t.iter().any(|(_, l)| l == LevelFilter::TRACE)
    {
        return Err(
            "pinguard writes nothing at trace (its levels: error, warn, info, debug)".into(),
        );
    }
    Ok(v.to_string())
}

impl Parse {
    /// A value this parser rejects (`None`: it takes any UTF-8 text), for the tests that every
    /// entry rejects in the one shape, here and in the CLI.
    pub fn bad_example(self) -> Option<String> {
        Some(match self {
            Parse::Switch => "maybe".into(),
            Parse::Size(_) => "12Q".into(),
            Parse::OneOf { .. } => "explode".into(),
            Parse::Count { max, .. } => (max + 1).to_string(),
            Parse::Patterns => "a[".into(),
            Parse::Template => "%q.json".into(),
            Parse::Duration => "soon".into(),
            Parse::Signal => "SIGKILL".into(),
            Parse::Names { .. } => "cuda,opencl".into(),
            Parse::Filter => "pinguard=loud".into(),
            Parse::GroupName => "no/slash".into(),
            Parse::Labels => "9x=1".into(),
            Parse::Path => "relative.conf".into(),
            Parse::Text => return None,
        })
    }
}

impl Var {
    /// Reads this variable's value (`None`: not UTF-8), or says why not.
    pub fn parse(&self, value: Option<&str>) -> Result<Value, String> {
        self.parse.parse(value)
    }

    /// Why a value is rejected and what is accepted: what `pinguard run` says of an option that
    /// sets this variable, as the library says it of the variable (`rejected`).
    pub fn expected(&self, why: &str) -> String {
        // One line, whatever the value or a parser's message holds.
        let why: String = why
            .chars()
            .flat_map(|ch| {
                if ch.is_control() {
                    ch.escape_debug().collect::<Vec<_>>()
                } else {
                    vec![ch]
                }
            })
            .collect();
        format!("{why}; expected {}", self.forms)
    }

    /// The one line a rejected value gets (`None`: not UTF-8): the variable, the value, why, the
    /// forms accepted, and what is used instead.
    pub fn rejected(&self, value: Option<&str>, why: &str) -> String {
        let shown = match value {
            Some(v) => format!("{v:?}"),
            None => "(not UTF-8)".to_string(),
        };
        format!(
            "{}={shown}: {}; {}",
            self.name,
            self.expected(why),
            self.fallback
        )
    }

    /// `value` as this variable's parser takes it, or the message an option setting it gets; a
    /// list with a bad entry is refused whole.
    pub fn check(&self, value: &str) -> Result<(), String> {
        match self.parse(Some(value)) {
            Ok(Value::Labels(_, bad)) if !bad.is_empty() => Err(self.expected(&bad[0])),
            Ok(_) => Ok(()),
            Err(why) => Err(self.expected(&why)),
        }
    }
}

/// What an over-budget call gets (`PINGUARD_POLICY`), named as `POLICIES` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Error,
    Downgrade,
    Warn,
}

/// The policies' names, in `Policy::ALL`'s order.
pub const POLICIES: [&str; 3] = ["error", "downgrade", "warn"];

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Error, Policy::Downgrade, Policy::Warn];

    pub fn name(self) -> &'static str {
        POLICIES[self as usize]
    }
}

/// Whether device allocations count as host bytes (`PINGUARD_DEVICE_MEMORY`), named as
/// `DEVICE_MEMORY_MODES` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceMemory {
    /// Where the device says it is integrated.
    Auto,
    Host,
    Device,
}

/// The modes' names, in `DeviceMemory::ALL`'s order.
pub const DEVICE_MEMORY_MODES: [&str; 3] = ["auto", "host", "device"];

impl DeviceMemory {
    pub const ALL: [DeviceMemory; 3] =
        [DeviceMemory::Auto, DeviceMemory::Host, DeviceMemory::Device];

    /// The mode a raw value names, as the configuration reads it (a bad value: `auto`, its
    /// fallback). Without allocating: the hooks ask before pinguard has started.
    pub fn from_raw(v: Option<&[u8]>) -> DeviceMemory {
        let Some(v) = v else {
            return DeviceMemory::Auto;
        };
        DEVICE_MEMORY_MODES
            .iter()
            .position(|n| n.as_bytes().eq_ignore_ascii_case(v.trim_ascii()))
            .map_or(DeviceMemory::Auto, |i| DeviceMemory::ALL[i])
    }
}

/// The families `PINGUARD_HOOKS` names, a bit each in this order (the library's `Family`).
pub const FAMILIES: [&str; 7] = [
    "cuda",
    "cuda-driver",
    "acl",
    "mlock",
    "hip",
    "ibverbs",
    "ascend-hal",
];

/// A switch's value: on, off, or `None` when it is no switch. Without allocating: the hooks ask
/// before pinguard has started, and must answer as the configuration does.
pub fn switch(v: &[u8]) -> Option<bool> {
    match v.trim_ascii() {
        b"1" | b"true" | b"yes" => Some(true),
        b"0" | b"" | b"false" | b"no" => Some(false),
        _ => None,
    }
}

/// A comma list of `names` (any case) or `all`: a bit per name, or the first item that names
/// none (`Err(None)`: nothing named at all). Without allocating, as `switch`.
pub fn names_switch<'a>(v: &'a [u8], names: &[&str]) -> Result<u32, Option<&'a [u8]>> {
    let mut bits = 0u32;
    for item in v.split(|&c| c == b',').map(<[u8]>::trim_ascii) {
        if item.is_empty() {
            continue;
        }
        if item.eq_ignore_ascii_case(b"all") {
            bits |= (1 << names.len()) - 1;
            continue;
        }
        match names
            .iter()
            .position(|n| n.as_bytes().eq_ignore_ascii_case(item))
        {
            Some(i) => bits |= 1 << i,
            None => return Err(Some(item)),
        }
    }
    if bits == 0 {
        return Err(None);
    }
    Ok(bits)
}

/// The labels pinguard writes itself: `PINGUARD_LABELS` may not set them.
pub const OWN_LABELS: &[&str] = &[
    "pid",
    "pidns",
    "exe",
    "api",
    "group",
    "namespace",
    "pod",
    "container",
    "container_id",
];

/// `PINGUARD_LABELS`: its good entries, and why each other one is left out.
fn labels(v: &str) -> Value {
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match label_entry(entry, &good) {
            Ok(kv) => good.push(kv),
            Err(why) => bad.push(format!("entry {entry:?}: {why}")),
        }
    }
    Value::Labels(good, bad)
}

/// One `PINGUARD_LABELS` entry, `name=value`, checked against Prometheus' rules for a label name
/// (`[a-zA-Z_][a-zA-Z0-9_]*`, `__` reserved), pinguard's own labels and the labels already taken.
fn label_entry(entry: &str, taken: &[(String, String)]) -> Result<(String, String), String> {
    let Some((name, value)) = entry.split_once('=') else {
        return Err("no '=' between a name and a value".into());
    };
    let name = name.trim();
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{name:?} is not a label name"));
    }
    if name.starts_with("__") {
        return Err(format!(
            "{name:?} starts with __, which Prometheus reserves"
        ));
    }
    if OWN_LABELS.contains(&name) {
        return Err(format!("{name:?} is one of pinguard's own labels"));
    }
    if taken.iter().any(|(n, _)| n == name) {
        return Err(format!("{name:?} is given twice"));
    }
    Ok((name.to_string(), value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_table_is_this_registry() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/settings.md"))
                .unwrap();
        let want = table();
        assert!(
            doc.contains(&want),
            "docs/settings.md's variable table differs from common/src/vars.rs; it should read:\n\n{want}"
        );
    }

    #[test]
    fn names_are_unique_and_prefixed() {
        for (i, v) in ALL.iter().enumerate() {
            assert!(v.name.starts_with("PINGUARD_"), "{}", v.name);
            assert!(
                ALL[..i].iter().all(|w| w.name != v.name),
                "{} twice",
                v.name
            );
            assert_eq!(find(v.name).map(|f| f.name), Some(v.name));
        }
        assert!(find("PINGUARD_BUGDET").is_none());
    }

    #[test]
    fn sizes_are_named_as_the_size_parser_names_them() {
        assert!(
            BUDGET.forms.starts_with(crate::units::SIZE_FORMS),
            "{}",
            BUDGET.forms
        );
        assert!(
            HOST_RESERVE.forms.starts_with(crate::units::SIZE_FORMS),
            "{}",
            HOST_RESERVE.forms
        );
    }

    #[test]
    fn the_default_template_is_the_one_the_table_names() {
        let node = crate::node::DEFAULT_PATH;
        assert!(CONFIG.unset.contains(node) && CONFIG.meaning.contains(node));
        assert!(CONFIG.fallback.ends_with(node));
        assert!(REPORT.unset.contains(&format!("`{DEFAULT_TEMPLATE}`")));
        assert!(REPORT.fallback.ends_with(DEFAULT_TEMPLATE));
        assert!(
            DEPTH.meaning.contains(&format!("0 to {MAX_DEPTH}"))
                && DEPTH.forms.ends_with(&MAX_DEPTH.to_string())
        );
        assert_eq!(
            MAX_CALLSITES.default,
            Some(DEFAULT_MAX_CALLSITES.to_string().as_str())
        );
        assert!(
            MAX_CALLSITES
                .fallback
                .ends_with(&DEFAULT_MAX_CALLSITES.to_string())
                && MAX_CALLSITES
                    .forms
                    .ends_with(&MAX_MAX_CALLSITES.to_string())
        );
    }

    #[test]
    fn every_parser_rejects_a_bad_value_in_the_one_shape() {
        let mut rejecting = 0;
        for v in ALL {
            if let Some(d) = v.default {
                assert!(
                    v.parse(Some(d)).is_ok(),
                    "{}'s default {d:?} is rejected by its own parser",
                    v.name
                );
            }
            // Not UTF-8: every parser refuses it, with a reason.
            let why = v.parse(None).expect_err(v.name);
            assert_eq!(
                v.rejected(None, &why),
                format!(
                    "{}=(not UTF-8): {why}; expected {}; {}",
                    v.name, v.forms, v.fallback
                )
            );
            let Some(bad) = v.parse.bad_example() else {
                continue;
            };
            rejecting += 1;
            let why = match v.parse(Some(&bad)) {
                Err(why) => why,
                Ok(Value::Labels(_, bad)) if bad.len() == 1 => bad[0].clone(),
                Ok(got) => panic!("{}={bad:?} is taken: {got:?}", v.name),
            };
            assert!(
                !why.is_empty() && !why.contains('\n'),
                "{}: {why:?}",
                v.name
            );
            let line = v.rejected(Some(&bad), &why);
            assert_eq!(
                line,
                format!(
                    "{}={bad:?}: {why}; expected {}; {}",
                    v.name, v.forms, v.fallback
                )
            );
            // An option setting the variable is refused in the same words, less the fallback.
            let said = v.check(&bad).expect_err(v.name);
            assert!(line.contains(&format!(": {said}; ")), "{line}\n{said}");
        }
        assert_eq!(
            rejecting,
            ALL.len() - 4,
            "all but the three labels and the suppressions file taking any text"
        );
    }

    #[test]
    fn bounds_and_names_are_the_ones_the_forms_say() {
        for v in ALL {
            match v.parse {
                Parse::Count { min, max, .. } => {
                    assert_eq!(
                        v.forms,
                        format!("a whole number from {min} to {max}"),
                        "{}",
                        v.name
                    );
                    assert!(v.meaning.contains(&format!("{min} to {max}")), "{}", v.name);
                    assert!(
                        v.parse(Some(&min.to_string())).is_ok()
                            && v.parse(Some(&max.to_string())).is_ok(),
                        "{}",
                        v.name
                    );
                    assert!(
                        min == 0 || v.parse(Some(&(min - 1).to_string())).is_err(),
                        "{}",
                        v.name
                    );
                }
                Parse::OneOf { names, .. } | Parse::Names { names, .. } => {
                    for n in names {
                        assert!(
                            v.forms.contains(n) && v.meaning.contains(&format!("`{n}`")),
                            "{}: {n}",
                            v.name
                        );
                        assert!(v.parse(Some(&n.to_uppercase())).is_ok(), "{}: {n}", v.name);
                    }
                }
                Parse::Size(_) => {
                    assert!(v.forms.starts_with(crate::units::SIZE_FORMS), "{}", v.name)
                }
                _ => {}
            }
        }
        assert!(Policy::ALL
            .iter()
            .enumerate()
            .all(|(i, p)| *p as usize == i && p.name() == POLICIES[i]));
        assert!(matches!(
            POLICY.parse(Some(" Downgrade ")),
            Ok(Value::Index(1))
        ));
    }

    #[test]
    fn a_switch_and_a_name_list_read_as_before() {
        assert_eq!(
            [" 1 ", "yes", "", "no", "2"].map(|v| switch(v.as_bytes())),
            [Some(true), Some(true), Some(false), Some(false), None]
        );
        assert_eq!(names_switch(b"CUDA , mlock", &FAMILIES), Ok(0b1001));
        assert_eq!(names_switch(b"all,acl", &FAMILIES), Ok(0b111_1111));
        assert_eq!(
            names_switch(b"cuda,opencl", &FAMILIES),
            Err(Some(&b"opencl"[..]))
        );
        assert_eq!(names_switch(b" , ", &FAMILIES), Err(None));
    }
}
