//! Every `PINGUARD_*` variable at once: the input is split on NUL bytes into values (which may
//! be invalid UTF-8, as environment values may), one per variable in order.
#![no_main]

use libfuzzer_sys::fuzz_target;

const VARS: &[&str] = &[
    "PINGUARD_BUDGET", "PINGUARD_POLICY", "PINGUARD_REPORT", "PINGUARD_DEPTH", "PINGUARD_INTERVAL",
    "PINGUARD_SIGNAL", "PINGUARD_HOOKS", "PINGUARD_LOG", "PINGUARD_DISABLE", "PINGUARD_BUGDET",
    "PINGUARD_HOST_RESERVE",
];

fuzz_target!(|data: &[u8]| {
    let vars: Vec<(String, Option<String>)> = data
        .split(|&b| b == 0)
        .zip(VARS)
        .map(|(v, name)| (name.to_string(), String::from_utf8(v.to_vec()).ok()))
        .collect();
    pinguard::fuzzing::config(&vars);
});
