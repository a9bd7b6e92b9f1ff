//! Prints a pinguard report for people: totals, then each callsite holding pinned memory with its
//! frames, LeakSanitizer style. `cargo run -p pinguard-report --example show -- REPORT.json`
//! (the `pinguard report` command of the CLI will supersede it).

use pinguard_report::units::format_bytes;
use pinguard_report::Report;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: show REPORT.json");
        return ExitCode::from(2);
    };
    let report = match std::fs::read(&path).map_err(|e| e.to_string()).and_then(|b| Report::from_slice(&b).map_err(|e| e.to_string())) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("show: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let t = &report.totals;
    let budget = report.config.budget_bytes.map(format_bytes).unwrap_or_else(|| "none".into());
    println!("{} (pid {}), policy {}, budget {budget}", report.process.exe, report.process.pid, report.config.policy);
    println!(
        "live {} in {} allocations, peak {}; {} allocations of {} in all; {} denied ({}), {} downgraded",
        format_bytes(t.live_bytes),
        t.live_count,
        format_bytes(t.peak_live_bytes),
        t.alloc_count,
        format_bytes(t.alloc_bytes),
        t.denied_count,
        format_bytes(t.denied_bytes),
        t.downgraded_count
    );
    for cs in &report.callsites {
        let what = if cs.live_bytes > 0 {
            format!("{} pinned in {} allocations", format_bytes(cs.live_bytes), cs.live_count)
        } else if cs.denied_count > 0 {
            format!("{} calls denied", cs.denied_count)
        } else {
            format!("nothing live (peak {}, {} allocations)", format_bytes(cs.peak_live_bytes), cs.alloc_count)
        };
        println!("\n{what} through {} from:", cs.apis.join(", "));
        for (i, f) in cs.frames.iter().enumerate() {
            let sym = f.symbol.as_deref().unwrap_or("??");
            let loc = match (&f.file, f.line) {
                (Some(file), Some(line)) => format!("{file}:{line}"),
                _ => f.module.clone().unwrap_or_default(),
            };
            println!("    #{i} {} in {sym} {loc}", serde_json::to_string(&f.addr).unwrap_or_default().trim_matches('"'));
        }
    }
    ExitCode::SUCCESS
}
