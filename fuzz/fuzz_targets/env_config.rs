//! Every `PINGUARD_*` variable at once: the input is split on NUL bytes into values (which may
//! be invalid UTF-8, as environment values may), one per variable in the registry's order.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Every registered variable, then a misspelt one (it must be named, never taken).
    let names = pinguard_common::vars::ALL
        .iter()
        .map(|v| v.name)
        .chain(["PINGUARD_BUGDET"]);
    let vars: Vec<(String, Option<String>)> = data
        .split(|&b| b == 0)
        .zip(names)
        .map(|(v, name)| (name.to_string(), String::from_utf8(v.to_vec()).ok()))
        .collect();
    pinguard::fuzzing::config(&vars);
});
