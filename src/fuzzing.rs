//! Entry points for the fuzz targets (feature `fuzzing`, which also leaves every hook out).

use crate::runtime::config::{Config, System};

struct FixedMemory;

impl System for FixedMemory {
    fn memory_limit(&self) -> Option<u64> {
        Some(64 << 30)
    }

    fn mem_total(&self) -> Option<u64> {
        Some(256 << 30)
    }
}

/// Parses `PINGUARD_*` variables the way the library does at start-up. Panics if a rejected
/// variable's line is not a single line naming it, or if a setting is out of its range.
pub fn config(vars: &[(String, Option<String>)]) {
    let c = Config::from_vars(vars, &FixedMemory);
    for e in &c.errors {
        assert!(!e.contains('\n'), "a config error spans lines: {e:?}");
        assert!(
            e.starts_with("PINGUARD_"),
            "a config error does not name its variable: {e:?}"
        );
    }
    assert!(c.depth <= pinguard_common::vars::MAX_DEPTH);
    assert!(c.hooks != 0);
    if let Some(t) = &c.report {
        let expanded = crate::output::files::expand(&crate::output::files::with_pid(t));
        assert!(!expanded.as_os_str().is_empty());
    }
}
