//! The report reader the CLI uses on files it is given: any bytes are either a report or a
//! one-line reason why not, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinguard_common::{view::ReportView, Report};

fuzz_target!(|data: &[u8]| {
    match Report::from_slice(data) {
        Ok(r) => {
            let text = serde_json::to_vec(&r).expect("a parsed report serialises");
            Report::from_slice(&text).expect("a written report reads back");
        }
        Err(e) => assert!(!e.0.is_empty() && !e.0.contains('\n')),
    }
    if let Err(e) = ReportView::parse(data) {
        assert!(!e.0.is_empty());
    }
});
