//! Every `PINGUARD_*` variable, declared once: its name, its accepted forms, what an unset one
//! means, and what a rejected value falls back to. The library's parser (`Config::from_vars`) and
//! its early switches read their names, forms and defaults from here, `pinguard run` sets
//! variables by these names, and the README's variable table is this table (`table`, checked by
//! a test).

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
}

/// The report path template an unset `PINGUARD_REPORT` stands for.
pub const DEFAULT_TEMPLATE: &str = "pinguard.%e.%p.json";

/// Frames per stack at most (`PINGUARD_DEPTH`, `PINGUARD_PY_DEPTH`).
pub const MAX_DEPTH: u32 = 128;

pub const BUDGET: Var = Var {
    name: "PINGUARD_BUDGET",
    meaning: "cap on live pinned bytes: `1073741824`, `512Mi`, `8Gi`, `1.5GiB`, `2T` (K/M/G/T/P are powers of 1024, alone or with `B`, `i` or `iB`, any case: unlike Kubernetes, `G` is 1024^3 too, so prefer `Gi`), or `N%` of the cgroup memory limit (else of `MemTotal`); `0` lets nothing be pinned (every pinning call gets the policy)",
    default: None,
    unset: "none: track only",
    forms: "bytes such as 1073741824, 512Mi, 8Gi, 1.5GiB, 2T (K/M/G/T and Ki/Mi/Gi/Ti alike = powers of 1024) or N% of the memory limit",
    fallback: "running without a budget",
};

pub const HOST_RESERVE: Var = Var {
    name: "PINGUARD_HOST_RESERVE",
    meaning: "a floor under the host's `MemAvailable`: a pinning call that would take it below gets the policy, as over the budget. Forms of `PINGUARD_BUDGET`, `N%` being of `MemTotal`; the strictest of the budgets wins; a group's members share it (below)",
    default: None,
    unset: "none",
    forms: "bytes such as 1073741824, 512Mi, 8Gi, 1.5GiB, 2T (K/M/G/T and Ki/Mi/Gi/Ti alike = powers of 1024) or N% of MemTotal",
    fallback: "running without a host reserve",
};

pub const CGROUP_RESERVE: Var = Var {
    name: "PINGUARD_CGROUP_RESERVE",
    meaning: "a floor under the headroom of the process's memory cgroup before its OOM killer (the least, over the limited levels of its path, of limit - usage + reclaimable page cache): a pinning call that would take it below gets the policy, as over the budget. Forms of `PINGUARD_BUDGET`, `N%` being of the tightest limit; pages the cgroup does not charge never move it (`pinguard doctor --probe` says which)",
    default: None,
    unset: "none",
    forms: "bytes such as 1073741824, 512Mi, 8Gi, 1.5GiB, 2T (K/M/G/T and Ki/Mi/Gi/Ti alike = powers of 1024) or N% of the cgroup's memory limit",
    fallback: "running without a cgroup reserve",
};

pub const POLICY: Var = Var {
    name: "PINGUARD_POLICY",
    meaning: "what an over-budget call gets: `error`, `downgrade` or `warn` (below)",
    default: Some("error"),
    unset: "`error`",
    forms: "error, downgrade or warn",
    fallback: "using error",
};

pub const REPORT: Var = Var {
    name: "PINGUARD_REPORT",
    meaning: "report path template: `%p` pid, `%e` executable name, `%h` host name, `%t` start time (unix seconds), `%n` the PID namespace's inode number (with `%p`, unique among a host's live processes, whatever container they run in), `%%` a percent sign; missing directories are created; a relative path is taken from the working directory at start-up. A template without `%p` gets `.<pid>` before its `.json` (or at its end), so children never overwrite their parent's report",
    // Unset is not the same as the default template given: only the default falls back to the
    // temporary folder when the working directory is not writable.
    default: None,
    unset: "`pinguard.%e.%p.json` in the working directory, or in `$TMPDIR` (else `/tmp`) when that is not writable",
    forms: "a path with %p, %e, %h, %t, %n or %%",
    fallback: "using pinguard.%e.%p.json",
};

pub const DOWNGRADE_MATCH: Var = Var {
    name: "PINGUARD_DOWNGRADE_MATCH",
    meaning: "under `downgrade`, downgrade only callsites matching one of these comma-separated globs anywhere in the stack (a Python frame's file or qualified name, a native frame's symbol or module file); the rest are refused as under `error`",
    default: None,
    unset: "every call pageable memory can serve",
    forms: "a comma list of glob patterns such as *torch/utils/data/_utils/pin_memory.py",
    fallback: "nothing is downgraded (refused as under error)",
};

pub const DEPTH: Var = Var {
    name: "PINGUARD_DEPTH",
    meaning: "frames kept per stack, 0 to 128 (0: no stacks)",
    default: Some("32"),
    unset: "32",
    forms: "a whole number from 0 to 128",
    fallback: "using 32",
};

pub const PY_DEPTH: Var = Var {
    name: "PINGUARD_PY_DEPTH",
    meaning: "Python frames kept per callsite in a CPython process, 0 to 128 (0: none; see \"Python callsites\")",
    default: Some("32"),
    unset: "32",
    forms: "a whole number from 0 to 128",
    fallback: "using 32",
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
};

pub const INTERVAL: Var = Var {
    name: "PINGUARD_INTERVAL",
    meaning: "also rewrite the report periodically (reason `interval`) from a background thread: `500ms`, `30s`, `5m`, `1h`. A process killed with SIGKILL leaves its last complete snapshot",
    default: None,
    unset: "off",
    forms: crate::units::DURATION_FORMS,
    fallback: "no periodic report",
};

pub const SIGNAL: Var = Var {
    name: "PINGUARD_SIGNAL",
    meaning: "also write the report (reason `signal`) when this signal arrives: `SIGUSR2`, `USR2` or a number. The application's own handler still runs, and pinguard follows the application's latest disposition of the signal (`docs/design.md`)",
    default: None,
    unset: "off",
    forms: "a signal such as SIGUSR2, USR2 or 12",
    fallback: "no report on a signal",
};

pub const HOOKS: Var = Var {
    name: "PINGUARD_HOOKS",
    meaning: "families to intercept, a comma list of `cuda`, `cuda-driver`, `acl`, `mlock`, `hip`, or `all`; the others pass through untouched (and their `dlsym`/`cuGetProcAddress`/`hipGetProcAddress` redirection is off)",
    default: Some("all"),
    unset: "all",
    forms: "a comma list of cuda, cuda-driver, acl, mlock, hip, or all",
    fallback: "hooking all of them",
};

pub const LOG: Var = Var {
    name: "PINGUARD_LOG",
    meaning: "diagnostics on stderr, in `tracing`'s filter syntax (`warn`, `info`, `pinguard=debug`)",
    default: Some("warn"),
    unset: "`warn`",
    forms: "a filter such as warn, info or pinguard=debug",
    fallback: "using warn",
};

pub const DISABLE: Var = Var {
    name: "PINGUARD_DISABLE",
    meaning: "`1`: pass every call through untouched",
    default: Some("0"),
    unset: "off",
    forms: "1 or 0",
    fallback: "pinguard stays enabled",
};

pub const GROUP: Var = Var {
    name: "PINGUARD_GROUP",
    meaning: "join the group of this name (letters, digits, `.`, `_`, `-`; up to 64): every process of the group on the host shares one budget (`docs/deploy.md`)",
    default: None,
    unset: "none",
    forms: "up to 64 letters, digits, '.', '_' or '-'",
    fallback: "no group budget",
};

pub const GROUP_BUDGET: Var = Var {
    name: "PINGUARD_GROUP_BUDGET",
    meaning: "the group's budget, in the forms of `PINGUARD_BUDGET`; set by the group's first member (a later member with another value gets a warning and the first value)",
    default: None,
    unset: "none: the group is only counted",
    forms: BUDGET.forms,
    fallback: "no group budget",
};

/// How often a process rewrites its metrics file when `PINGUARD_INTERVAL` is unset or longer: the
/// file's age is how writers in other PID namespaces tell a dead writer's file (`docs/design.md`,
/// "Metrics").
pub const METRICS_INTERVAL_MS: u64 = 15_000;

pub const METRICS: Var = Var {
    name: "PINGUARD_METRICS",
    meaning: "a Prometheus text-format file (mode 0644, for node_exporter's textfile collector) at this path template (as `PINGUARD_REPORT`), from a process's first pinning call on (a refusal or a downgrade counts), rewritten every 15 s (every `PINGUARD_INTERVAL` when shorter), removed when the process exits; a killed process's file is removed by the next writer in the folder (`docs/design.md`, \"Metrics\"). Without `%p`, the pid goes before `.prom`; for containers sharing one folder, `pinguard.%n.%p.prom` names every process apart",
    default: None,
    unset: "off",
    forms: "a path with %p, %e, %h, %t, %n or %%",
    fallback: "no metrics file",
};

pub const NAMESPACE: Var = Var {
    name: "PINGUARD_NAMESPACE",
    meaning: "the `namespace` label on every metrics series (Kubernetes: the downward API's `metadata.namespace`)",
    default: None,
    unset: "no label",
    forms: "any text",
    fallback: "no namespace label",
};

pub const POD: Var = Var {
    name: "PINGUARD_POD",
    meaning: "the `pod` label on every metrics series (Kubernetes: the downward API's `metadata.name`)",
    default: None,
    unset: "no label",
    forms: "any text",
    fallback: "no pod label",
};

pub const CONTAINER: Var = Var {
    name: "PINGUARD_CONTAINER",
    meaning: "the `container` label on every metrics series (Kubernetes: the container's name, written in the manifest)",
    default: None,
    unset: "no label",
    forms: "any text",
    fallback: "no container label",
};

pub const LABELS: Var = Var {
    name: "PINGUARD_LABELS",
    meaning: "more labels on every metrics series: `key=value,...`; a name is letters, digits and `_`, not starting with a digit or `__`, and not one of pinguard's own labels; a bad entry is a configuration error, the others are used",
    default: None,
    unset: "none",
    forms: "a comma list of name=value, names of letters, digits and _ (not starting with a digit or __, not pid, pidns, exe, api, group, namespace, pod, container or container_id)",
    fallback: "that entry is left out",
};

/// Every variable pinguard reads, in the table's order; any other `PINGUARD_` name is probably
/// a typo, and is reported as one.
pub const ALL: &[&Var] = &[&BUDGET, &HOST_RESERVE, &CGROUP_RESERVE, &POLICY, &DOWNGRADE_MATCH, &REPORT, &DEPTH, &PY_DEPTH, &MAX_CALLSITES, &INTERVAL, &SIGNAL, &HOOKS, &LOG, &DISABLE, &GROUP, &GROUP_BUDGET, &METRICS, &NAMESPACE, &POD, &CONTAINER, &LABELS];

/// The variable of this name.
pub fn find(name: &str) -> Option<&'static Var> {
    ALL.iter().copied().find(|v| v.name == name)
}

/// The README's table of variables, in Markdown.
pub fn table() -> String {
    let mut t = String::from("| variable | meaning | default |\n| --- | --- | --- |\n");
    for v in ALL {
        t.push_str(&format!("| `{}` | {} | {} |\n", v.name, v.meaning, v.unset));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_table_is_this_registry() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let want = table();
        assert!(readme.contains(&want), "README.md's variable table differs from report/src/vars.rs; it should read:\n\n{want}");
    }

    #[test]
    fn names_are_unique_and_prefixed() {
        for (i, v) in ALL.iter().enumerate() {
            assert!(v.name.starts_with("PINGUARD_"), "{}", v.name);
            assert!(ALL[..i].iter().all(|w| w.name != v.name), "{} twice", v.name);
            assert_eq!(find(v.name).map(|f| f.name), Some(v.name));
        }
        assert!(find("PINGUARD_BUGDET").is_none());
    }

    #[test]
    fn sizes_are_named_as_the_size_parser_names_them() {
        assert!(BUDGET.forms.starts_with(crate::units::SIZE_FORMS), "{}", BUDGET.forms);
        assert!(HOST_RESERVE.forms.starts_with(crate::units::SIZE_FORMS), "{}", HOST_RESERVE.forms);
    }

    #[test]
    fn the_default_template_is_the_one_the_table_names() {
        assert!(REPORT.unset.contains(&format!("`{DEFAULT_TEMPLATE}`")));
        assert!(REPORT.fallback.ends_with(DEFAULT_TEMPLATE));
        assert!(DEPTH.meaning.contains(&format!("0 to {MAX_DEPTH}")) && DEPTH.forms.ends_with(&MAX_DEPTH.to_string()));
        assert_eq!(MAX_CALLSITES.default, Some(DEFAULT_MAX_CALLSITES.to_string().as_str()));
        assert!(MAX_CALLSITES.fallback.ends_with(&DEFAULT_MAX_CALLSITES.to_string()) && MAX_CALLSITES.forms.ends_with(&MAX_MAX_CALLSITES.to_string()));
    }
}
