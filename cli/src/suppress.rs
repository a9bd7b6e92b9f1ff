//! `check --suppressions FILE` (or `PINGUARD_SUPPRESSIONS`): figures of callsites a team accepts
//! (a server's weights, pinned until it exits), in LeakSanitizer's spirit. Each line is
//! `KIND:PATTERN [ALLOWANCE]`; `#` starts a comment. What a rule takes is shown apart and counted,
//! never hidden, and a rule that matched nothing is named, as LeakSanitizer's unused suppressions.

use crate::merge::{Merged, ProcSite, Site, SiteKey};
use pinguard_common::units::format_bytes;
use std::collections::HashMap;

/// A figure of a callsite that a rule can take out of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Figure {
    Live,
    Peak,
    Denied,
    Downgraded,
    OverBudget,
}

impl Figure {
    fn bit(self) -> u8 {
        1 << self as u8
    }

    fn name(self) -> &'static str {
        match self {
            Figure::Live => "live",
            Figure::Peak => "peak",
            Figure::Denied => "denied",
            Figure::Downgraded => "downgraded",
            Figure::OverBudget => "over-budget",
        }
    }

    fn is_bytes(self) -> bool {
        matches!(self, Figure::Live | Figure::Peak)
    }

    /// The figure, as `check` prints it: bytes, or calls.
    pub fn show(self, n: u64) -> String {
        if self.is_bytes() {
            format_bytes(n)
        } else {
            crate::out::count(n, "call", "calls")
        }
    }

    pub fn of(self, s: &ProcSite) -> u64 {
        match self {
            Figure::Live => s.live,
            Figure::Peak => s.peak,
            Figure::Denied => s.denied,
            Figure::Downgraded => s.downgraded,
            Figure::OverBudget => s.over_budget,
        }
    }

    fn of_site(self, s: &Site) -> u64 {
        match self {
            Figure::Live => s.live_bytes,
            Figure::Peak => s.peak_live_bytes,
            Figure::Denied => s.denied_count,
            Figure::Downgraded => s.downgraded_count,
            Figure::OverBudget => s.over_budget_count,
        }
    }
}

/// The kinds a line may start with, and the figures each takes.
const KINDS: [(&str, &[Figure]); 7] = [
    ("live", &[Figure::Live]),
    ("leak", &[Figure::Live]),
    ("peak", &[Figure::Peak]),
    ("pinned", &[Figure::Live, Figure::Peak]),
    ("denied", &[Figure::Denied]),
    ("downgraded", &[Figure::Downgraded]),
    ("over_budget", &[Figure::OverBudget]),
];

pub struct Rule {
    /// The line as written (without its comment), and where: `FILE:LINE`.
    pub text: String,
    pub at: String,
    figures: &'static [Figure],
    pattern: glob::Pattern,
    /// The most the matched callsites may hold together (bytes, or calls) and be suppressed.
    allowance: Option<u64>,
}

/// Reads a suppressions file: every rule, or one line saying what is wrong and where.
pub fn load(path: &std::path::Path) -> Result<Vec<Rule>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the suppressions file {}: {}",
            path.display(),
            e
        )
    })?;
    parse(&text, &path.display().to_string())
}

pub fn parse(text: &str, file: &str) -> Result<Vec<Rule>, String> {
    let mut rules = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split_once('#').map_or(raw, |(l, _)| l).trim();
        if line.is_empty() {
            continue;
        }
        let at = format!("{file}:{}", i + 1);
        rules.push(rule(line, at)?);
    }
    Ok(rules)
}

fn rule(line: &str, at: String) -> Result<Rule, String> {
    let kinds = KINDS.map(|k| k.0).join(", ");
    let mut words = line.split_whitespace();
    let spec = words.next().unwrap_or_default();
    let Some((kind, pattern)) = spec.split_once(':') else {
        return Err(format!(
            "{at}: {spec:?} has no kind: write KIND:PATTERN, KIND one of {kinds}"
        ));
    };
    let Some(&(_, figures)) = KINDS.iter().find(|k| k.0 == kind) else {
        return Err(format!(
            "{at}: unknown kind {kind:?}; expected one of {kinds}"
        ));
    };
    let pattern =
        glob::Pattern::new(pattern).map_err(|e| format!("{at}: bad pattern {pattern:?}: {e}"))?;
    let allowance =
        match words.next() {
            None => None,
            Some(a) if figures[0].is_bytes() => Some(
                pinguard_common::units::parse_size(a)
                    .map_err(|e| format!("{at}: bad allowance {a:?}: {e}"))?,
            ),
            Some(a) => Some(a.parse().map_err(|_| {
                format!("{at}: bad allowance {a:?}: expected a whole number of calls")
            })?),
        };
    if let Some(extra) = words.next() {
        return Err(format!("{at}: unexpected {extra:?} after the allowance"));
    }
    Ok(Rule {
        text: line.split_whitespace().collect::<Vec<_>>().join(" "),
        at,
        figures,
        pattern,
        allowance,
    })
}

/// Whether a rule's pattern matches one of the callsite's frames, native or Python, by any of
/// its names: the function, the file (whole or its base name), the module, `file:function`,
/// `file:line`.
fn matches(r: &Rule, s: &Site) -> bool {
    s.frames.iter().chain(&s.py_frames).any(|f| {
        let base = |p: &str| crate::merge::basename(p).to_string();
        let func = f.symbol.as_deref().map(crate::merge::demangle);
        let mut names: Vec<String> = Vec::new();
        names.extend(func.clone());
        if let Some(file) = &f.file {
            names.push(file.clone());
            names.push(base(file));
            for file in [file.clone(), base(file)] {
                if let Some(func) = &func {
                    names.push(format!("{file}:{func}"));
                }
                if let Some(line) = f.line {
                    names.push(format!("{file}:{line}"));
                }
            }
        }
        if let Some(m) = &f.module {
            names.push(m.clone());
            names.push(base(m));
        }
        names.iter().any(|n| r.pattern.matches(n))
    })
}

/// What one rule did to one figure: the matched callsites' total, and whether it stayed within
/// the allowance (then it is suppressed; past it, nothing of it is).
pub struct Use {
    pub rule: usize,
    pub figure: Figure,
    pub total: u64,
    pub sites: Vec<SiteKey>,
    pub suppressed: bool,
}

#[derive(Default)]
pub struct Applied {
    /// Per callsite, the figures suppressed (a bit per `Figure`).
    taken: HashMap<SiteKey, u8>,
    pub uses: Vec<Use>,
    /// The rules, as `text (at)`, and whether each matched a callsite with something to take.
    rules: Vec<(String, bool)>,
}

/// Each figure of each merged callsite goes to the first rule (in the file's order) that takes
/// that figure and matches the callsite.
pub fn apply(rules: &[Rule], m: &Merged) -> Applied {
    let mut uses: HashMap<(usize, u8), Use> = HashMap::new();
    for s in &m.callsites {
        let mut claimed = 0u8;
        for (i, r) in rules.iter().enumerate() {
            let todo: Vec<Figure> = r
                .figures
                .iter()
                .copied()
                .filter(|f| claimed & f.bit() == 0 && f.of_site(s) > 0)
                .collect();
            if todo.is_empty() || !matches(r, s) {
                continue;
            }
            for f in todo {
                claimed |= f.bit();
                let u = uses.entry((i, f.bit())).or_insert(Use {
                    rule: i,
                    figure: f,
                    total: 0,
                    sites: Vec::new(),
                    suppressed: true,
                });
                u.total = u.total.saturating_add(f.of_site(s));
                u.sites.push(s.key);
            }
        }
    }
    let mut a = Applied {
        rules: rules
            .iter()
            .map(|r| (format!("`{}` ({})", r.text, r.at), false))
            .collect(),
        ..Applied::default()
    };
    let mut uses: Vec<Use> = uses.into_values().collect();
    uses.sort_by_key(|u| (u.rule, u.figure as u8));
    for mut u in uses {
        a.rules[u.rule].1 = true;
        u.suppressed = rules[u.rule].allowance.is_none_or(|max| u.total <= max);
        if u.suppressed {
            for k in &u.sites {
                *a.taken.entry(*k).or_default() |= u.figure.bit();
            }
        }
        a.uses.push(u);
    }
    a
}

impl Applied {
    /// Whether `f` of the callsite `key` is suppressed.
    pub fn takes(&self, key: SiteKey, f: Figure) -> bool {
        self.taken.get(&key).is_some_and(|b| b & f.bit() != 0)
    }

    /// What the rules took from all the merged callsites' figure `f`.
    pub fn taken(&self, f: Figure) -> u64 {
        self.uses
            .iter()
            .filter(|u| u.figure == f && u.suppressed)
            .map(|u| u.total)
            .fold(0, u64::saturating_add)
    }

    /// One line per rule and figure it matched (suppressed, or over its allowance and counted),
    /// and one per rule that matched nothing.
    pub fn lines(&self, rules: &[Rule], name: &dyn Fn(SiteKey) -> String) -> Vec<String> {
        let mut v = Vec::new();
        for u in &self.uses {
            let r = &rules[u.rule];
            let n = crate::out::count(u.sites.len() as u64, "callsite", "callsites");
            let first = u.sites.first().map(|k| name(*k)).unwrap_or_default();
            let what = format!(
                "{} {} at {n} ({first}{})",
                u.figure.show(u.total),
                u.figure.name(),
                if u.sites.len() > 1 { ", ..." } else { "" }
            );
            let allowance = r.allowance.map(|a| u.figure.show(a));
            v.push(match (u.suppressed, allowance) {
                (true, None) => format!("pinguard check: suppressed {what} by `{}` ({})", r.text, r.at),
                (true, Some(a)) => format!("pinguard check: suppressed {what} by `{}` ({}), within its allowance of {a}", r.text, r.at),
                (false, a) => format!("pinguard check: NOT suppressed: {what} matches `{}` ({}) but is over its allowance of {}: counted", r.text, r.at, a.unwrap_or_default()),
            });
        }
        for (rule, used) in &self.rules {
            if !used {
                v.push(format!(
                    "pinguard check: unused suppression {rule}: it matched no callsite"
                ));
            }
        }
        v
    }

    /// For the summary line: what was suppressed, by how many rules, and the unused ones.
    pub fn clause(&self) -> String {
        if self.rules.is_empty() {
            return String::new();
        }
        let figures = [
            Figure::Live,
            Figure::Peak,
            Figure::Denied,
            Figure::Downgraded,
            Figure::OverBudget,
        ];
        let parts: Vec<String> = figures
            .iter()
            .filter(|f| self.taken(**f) > 0)
            .map(|f| format!("{} {}", f.show(self.taken(*f)), f.name()))
            .collect();
        let used: std::collections::BTreeSet<usize> = self
            .uses
            .iter()
            .filter(|u| u.suppressed)
            .map(|u| u.rule)
            .collect();
        let unused = self.rules.iter().filter(|r| !r.1).count();
        format!(
            "; suppressed: {} by {}{}",
            if parts.is_empty() {
                "nothing".to_string()
            } else {
                parts.join(", ")
            },
            crate::out::count(used.len() as u64, "rule", "rules"),
            if unused > 0 {
                format!(
                    " ({})",
                    crate::out::count(unused as u64, "unused suppression", "unused suppressions")
                )
            } else {
                String::new()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A callsite with these native frames (function, file, line) and Python frames.
    fn site(native: &[(&str, &str, u32)], py: &[(&str, &str, u32)]) -> Site {
        let frames = |fs: &[(&str, &str, u32)]| -> Vec<pinguard_common::Frame> {
            fs.iter()
                .map(|&(f, file, line)| pinguard_common::Frame {
                    addr: pinguard_common::Addr(0),
                    module: Some("/usr/lib/libcudart.so.12".into()),
                    offset: None,
                    symbol: Some(f.into()),
                    file: Some(file.into()),
                    line: Some(line),
                })
                .collect()
        };
        let mut s = Site::default();
        (s.frames, s.py_frames) = (frames(native), frames(py));
        s
    }

    #[test]
    fn a_pattern_matches_a_frame_by_function_file_python_frame_or_module() {
        let s = site(
            &[("cudaHostAlloc", "/src/host.cc", 40)],
            &[
                ("load_model", "/srv/app/serve.py", 12),
                ("main", "/srv/app/serve.py", 80),
            ],
        );
        let yes = [
            "live:load_model",
            "live:*serve.py:load_model*",
            "live:serve.py:12",
            "live:/srv/app/*",
            "live:cudaHost*",
            "live:libcudart.so.12",
            "live:host.cc",
        ];
        for r in yes {
            assert!(matches(&parse(r, "f").unwrap()[0], &s), "{r}");
        }
        for r in ["live:load", "live:serve.py:13", "live:*train.py*"] {
            assert!(!matches(&parse(r, "f").unwrap()[0], &s), "{r}");
        }
    }

    #[test]
    fn lines_are_read_and_bad_ones_named_with_their_place() {
        let r = parse(
            "# weights stay pinned\npinned:load_weights\nlive:*serve.py:load_model* 8GiB # ok\n\ndenied:warmup 3\n",
            "s.supp",
        )
        .unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[1].at, "s.supp:3");
        assert_eq!(r[1].allowance, Some(8 << 30));
        assert_eq!(r[2].allowance, Some(3));
        for (bad, why) in [
            ("load_weights", "has no kind"),
            ("heap:x", "unknown kind"),
            ("live:x 8parsecs", "bad allowance"),
            ("denied:x 1Gi", "bad allowance"),
            ("live:x 1Gi more", "unexpected"),
            ("live:[x", "bad pattern"),
        ] {
            let e = parse(bad, "f").err().unwrap_or_default();
            assert!(e.starts_with("f:1: ") && e.contains(why), "{bad}: {e}");
        }
    }
}
