//! The size and duration parsers, and the byte formatter on whatever they accept.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinguard_common::units;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(b) = units::parse_size(s) {
        let _ = units::format_bytes(b);
    }
    if let Ok(units::SizeSpec::Percent(p)) = units::parse_size_spec(s) {
        assert!(p > 0.0 && p <= 100.0);
    }
    if let Ok(ms) = units::parse_duration_ms(s) {
        assert!(ms > 0);
    }
});
