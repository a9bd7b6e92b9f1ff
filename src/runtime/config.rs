//! `PINGUARD_*` variables. A bad value never stops the process: it is reported once on stderr,
//! listed in the report's `config.errors`, and the setting falls back to its default.

use crate::api::Family;
use pinguard_report::units::{self, SizeSpec};

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

pub const DEFAULT_TEMPLATE: &str = "pinguard.%e.%p.json";
pub const MAX_DEPTH: u32 = 128;

/// Every variable pinguard reads; anything else starting with `PINGUARD_` is probably a typo.
pub const KNOWN: &[&str] = &[
    "PINGUARD_BUDGET",
    "PINGUARD_POLICY",
    "PINGUARD_REPORT",
    "PINGUARD_DEPTH",
    "PINGUARD_PY_DEPTH",
    "PINGUARD_INTERVAL",
    "PINGUARD_SIGNAL",
    "PINGUARD_HOOKS",
    "PINGUARD_LOG",
    "PINGUARD_DISABLE",
    "PINGUARD_GROUP",
    "PINGUARD_GROUP_BUDGET",
    "PINGUARD_METRICS",
];

#[derive(Clone, Debug)]
pub struct Config {
    pub budget: Option<u64>,
    pub policy: Policy,
    /// The template as given; `None` means the default (which may fall back to the temp dir).
    pub report: Option<String>,
    pub depth: u32,
    /// Python frames per callsite (0: none).
    pub py_depth: u32,
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
    /// One line per rejected variable, as printed on stderr.
    pub errors: Vec<String>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            budget: None,
            policy: Policy::Error,
            report: None,
            depth: 32,
            py_depth: 32,
            interval_ms: None,
            signal: None,
            hooks: Family::ALL.iter().fold(0, |m, f| m | f.bit()),
            log: "warn".into(),
            disabled: false,
            group: None,
            group_budget: None,
            metrics: None,
            errors: Vec::new(),
        }
    }
}

/// What the environment needs from the system to resolve relative values.
pub trait System {
    /// Bytes a `N%` budget is a percentage of: the cgroup memory limit, else `MemTotal`.
    fn memory_limit(&self) -> Option<u64>;
}

impl Config {
    /// Reads the configuration from `vars` (name, value; a value that is not UTF-8 is `None`).
    pub fn from_vars(vars: &[(String, Option<String>)], sys: &dyn System) -> Config {
        let mut c = Config::default();
        let get = |name: &str| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_deref());
        let bad = |c: &mut Config, name: &str, value: Option<&str>, why: &str, forms: &str, fallback: &str| {
            let shown = match value {
                Some(v) => format!("{v:?}"),
                None => "(not UTF-8)".to_string(),
            };
            // One line, whatever the value or a parser's message holds.
            let why: String = why.chars().flat_map(|ch| if ch.is_control() { ch.escape_debug().collect::<Vec<_>>() } else { vec![ch] }).collect();
            c.errors.push(format!("{name}={shown}: {why}; expected {forms}; {fallback}"));
        };

        if let Some(v) = get("PINGUARD_DISABLE") {
            match v.map(|v| disable_switch(v.as_bytes())) {
                Some(Some(off)) => c.disabled = off,
                _ => bad(&mut c, "PINGUARD_DISABLE", v, "not a switch", "1 or 0", "pinguard stays enabled"),
            }
        }
        // A size, or a percentage of the memory limit.
        let budget = |c: &mut Config, name: &str, v: Option<&str>, fallback: &str| -> Option<u64> {
            match v.ok_or_else(|| "not UTF-8".to_string()).and_then(units::parse_size_spec) {
                Ok(SizeSpec::Bytes(b)) => Some(b),
                Ok(SizeSpec::Percent(p)) => match sys.memory_limit() {
                    Some(total) => Some((total as f64 * p / 100.0) as u64),
                    None => {
                        bad(c, name, v, "no memory limit or MemTotal to take a percentage of", "bytes", fallback);
                        None
                    }
                },
                Err(e) => {
                    bad(c, name, v, &e, &format!("{} or N% of the memory limit", units::SIZE_FORMS), fallback);
                    None
                }
            }
        };
        if let Some(v) = get("PINGUARD_BUDGET") {
            c.budget = budget(&mut c, "PINGUARD_BUDGET", v, "running without a budget");
        }
        if let Some(v) = get("PINGUARD_POLICY") {
            match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
                Some("error") => c.policy = Policy::Error,
                Some("downgrade") => c.policy = Policy::Downgrade,
                Some("warn") => c.policy = Policy::Warn,
                _ => bad(&mut c, "PINGUARD_POLICY", v, "unknown policy", "error, downgrade or warn", "using error"),
            }
        }
        if let Some(v) = get("PINGUARD_REPORT") {
            match v.map(check_template) {
                Some(Ok(())) => c.report = v.map(str::to_string),
                Some(Err(e)) => bad(&mut c, "PINGUARD_REPORT", v, &e, "a path with %p, %e, %h, %t or %%", &format!("using {DEFAULT_TEMPLATE}")),
                None => bad(&mut c, "PINGUARD_REPORT", v, "not UTF-8", "a path", &format!("using {DEFAULT_TEMPLATE}")),
            }
        }
        if let Some(v) = get("PINGUARD_DEPTH") {
            match v.and_then(|s| s.trim().parse::<u32>().ok()) {
                Some(d) if d <= MAX_DEPTH => c.depth = d,
                _ => bad(&mut c, "PINGUARD_DEPTH", v, "not a frame count", "a whole number from 0 to 128", "using 32"),
            }
        }
        if let Some(v) = get("PINGUARD_PY_DEPTH") {
            match v.and_then(|s| s.trim().parse::<u32>().ok()) {
                Some(d) if d <= MAX_DEPTH => c.py_depth = d,
                _ => bad(&mut c, "PINGUARD_PY_DEPTH", v, "not a frame count", "a whole number from 0 to 128", "using 32"),
            }
        }
        if let Some(v) = get("PINGUARD_INTERVAL") {
            match v.ok_or_else(|| "not UTF-8".to_string()).and_then(units::parse_duration_ms) {
                Ok(ms) => c.interval_ms = Some(ms),
                Err(e) => bad(&mut c, "PINGUARD_INTERVAL", v, &e, units::DURATION_FORMS, "no periodic report"),
            }
        }
        if let Some(v) = get("PINGUARD_SIGNAL") {
            match v.map(parse_signal) {
                Some(Ok(s)) => c.signal = Some(s),
                Some(Err(e)) => bad(&mut c, "PINGUARD_SIGNAL", v, &e, "a signal such as SIGUSR2, USR2 or 12", "no report on a signal"),
                None => bad(&mut c, "PINGUARD_SIGNAL", v, "not UTF-8", "a signal", "no report on a signal"),
            }
        }
        if let Some(v) = get("PINGUARD_HOOKS") {
            match v.map(parse_hooks) {
                Some(Ok(h)) => c.hooks = h,
                Some(Err(e)) => bad(&mut c, "PINGUARD_HOOKS", v, &e, "a comma list of cuda, cuda-driver, acl, mlock", "hooking all of them"),
                None => bad(&mut c, "PINGUARD_HOOKS", v, "not UTF-8", "a comma list", "hooking all of them"),
            }
        }
        if let Some(v) = get("PINGUARD_LOG") {
            match v.map(|s| s.parse::<tracing_subscriber::filter::Targets>()) {
                Some(Ok(_)) => c.log = v.unwrap_or("warn").to_string(),
                Some(Err(e)) => bad(&mut c, "PINGUARD_LOG", v, &e.to_string(), "a filter such as warn, info or pinguard=debug", "using warn"),
                None => bad(&mut c, "PINGUARD_LOG", v, "not UTF-8", "a filter", "using warn"),
            }
        }
        if let Some(v) = get("PINGUARD_GROUP") {
            match v.map(str::trim) {
                Some(n) if pinguard_report::group::valid_name(n) => c.group = Some(n.to_string()),
                _ => bad(&mut c, "PINGUARD_GROUP", v, "not a group name", "up to 64 letters, digits, '.', '_' or '-'", "no group budget"),
            }
        }
        if let Some(v) = get("PINGUARD_GROUP_BUDGET") {
            c.group_budget = budget(&mut c, "PINGUARD_GROUP_BUDGET", v, "no group budget");
            if c.group.is_none() && !c.errors.iter().any(|e| e.starts_with("PINGUARD_GROUP")) {
                c.errors.push("PINGUARD_GROUP_BUDGET is set without PINGUARD_GROUP; ignored".into());
            }
        }
        if let Some(v) = get("PINGUARD_METRICS") {
            match v.map(check_template) {
                Some(Ok(())) => c.metrics = v.map(str::to_string),
                Some(Err(e)) => bad(&mut c, "PINGUARD_METRICS", v, &e, "a path with %p, %e, %h, %t or %%", "no metrics file"),
                None => bad(&mut c, "PINGUARD_METRICS", v, "not UTF-8", "a path", "no metrics file"),
            }
        }
        for (name, value) in vars {
            if name.starts_with("PINGUARD_") && !KNOWN.contains(&name.as_str()) {
                let near = KNOWN.iter().min_by_key(|k| edit_distance(k, name)).copied().unwrap_or("");
                let shown = value.as_deref().unwrap_or("(not UTF-8)");
                c.errors.push(format!("{}={shown:?} is not a pinguard variable (did you mean {near}?); ignored", name.escape_debug()));
            }
        }
        c
    }
}

fn check_template(t: &str) -> Result<(), String> {
    if t.trim().is_empty() {
        return Err("empty".into());
    }
    let mut chars = t.chars();
    while let Some(ch) = chars.next() {
        if ch == '%' {
            match chars.next() {
                Some('p' | 'e' | 'h' | 't' | '%') => {}
                Some(o) => return Err(format!("unknown escape {:?}", format!("%{o}"))),
                None => return Err("ends with a lone %".into()),
            }
        }
    }
    if t.ends_with('/') {
        return Err("names a directory, not a file".into());
    }
    Ok(())
}

pub fn parse_signal(s: &str) -> Result<i32, String> {
    let t = s.trim();
    let sig = if let Ok(n) = t.parse::<i32>() {
        n
    } else {
        let up = t.to_ascii_uppercase();
        let name = up.strip_prefix("SIG").unwrap_or(&up);
        match name {
            "HUP" => libc::SIGHUP,
            "INT" => libc::SIGINT,
            "QUIT" => libc::SIGQUIT,
            "USR1" => libc::SIGUSR1,
            "USR2" => libc::SIGUSR2,
            "ALRM" => libc::SIGALRM,
            "TERM" => libc::SIGTERM,
            "CHLD" => libc::SIGCHLD,
            "CONT" => libc::SIGCONT,
            "URG" => libc::SIGURG,
            "WINCH" => libc::SIGWINCH,
            "PWR" => libc::SIGPWR,
            _ => match name.strip_prefix("RTMIN+").and_then(|n| n.parse::<i32>().ok()) {
                Some(n) => libc::SIGRTMIN() + n,
                None => return Err(format!("unknown signal {t:?}")),
            },
        }
    };
    if sig <= 0 || sig > libc::SIGRTMAX() {
        return Err(format!("{sig} is not a signal number"));
    }
    if matches!(sig, libc::SIGKILL | libc::SIGSTOP | libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE) {
        return Err(format!("signal {sig} cannot be caught safely"));
    }
    Ok(sig)
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
        let values = ["1", " 1 ", "true", "yes", "0", "", "no", "maybe", "cuda", "CUDA ", "cuda,opencl", " , ", "acl,mlock", "cuda-driver"];
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
    }

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let v: Vec<_> = vars.iter().map(|(a, b)| (a.to_string(), Some(b.to_string()))).collect();
        Config::from_vars(&v, &Fixed(Some(1 << 30)))
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
