//! One byte, one count (issue 45 item 2): LMCache and SGLang's HiCache register with the card
//! (`ibv_reg_mr`) pools `cudaHostAlloc` pinned; DeepSpeed `mlock`s a range and then
//! `cudaHostRegister`s it. A range pinned by two routes counts once in the live bytes, the peak and
//! the budget (a budget just above the range lets the second route through), is listed under both
//! routes with both callsites, and goes when the last route lets go, in either order. Against the
//! emulated CUDA runtime and `libibverbs.so.1` (tests/emul) and real `mlock`.

use crate::common;
use common::*;
use std::path::PathBuf;
use std::sync::OnceLock;

const PAGE: i64 = 4096;
const RANGE: i64 = 16 * PAGE;
/// Just above one range: two ranges' worth is refused.
const BUDGET: &str = "69632";

/// `tests/progs/overlap.c`, linked with the emulated CUDA runtime and libibverbs
/// (`tests/fixtures.txt`, set `overlap`).
fn program() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| fixture_set("overlap").join("overlap/overlap"))
}

fn overlap(ops: &[&str], env: &[(&str, &str)]) -> Run {
    let r = run(&program().to_string_lossy(), ops, env);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    for op in ops {
        assert_eq!(r.rc(op), 0, "{op}: {}\n{}", r.stdout, r.stderr);
    }
    r
}

/// pinguard's live bytes right after each operation.
fn lives(r: &Run, ops: &[&str]) -> Vec<i64> {
    ops.iter()
        .map(|op| {
            let line = r.stdout.lines().find(|l| l.starts_with(&format!("{op} ")));
            field(line.unwrap(), "live")
        })
        .collect()
}

/// The report's live records as (api, size, the callsite's innermost symbol).
fn live_records(rep: &Report) -> Vec<(String, i64, String)> {
    rep.live
        .iter()
        .map(|l| {
            let site = rep.callsites.iter().find(|c| c.id == l.callsite);
            let sym = site
                .and_then(|c| c.frames.first())
                .and_then(|f| f.symbol.as_deref())
                .unwrap_or("")
                .to_string();
            (l.api.to_string(), l.size as i64, sym)
        })
        .collect()
}

/// A pool from `cudaHostAlloc`, registered whole with the card: counted once in the live bytes,
/// the peak and the budget (just above one pool), and listed under both routes with the
/// program's callsites.
#[test]
fn a_pinned_pool_registered_with_the_card_counts_once_under_both_routes() {
    let ops = ["alloc:0:65536", "reg:0:0:65536"];
    let r = overlap(&ops, &[("PINGUARD_BUDGET", BUDGET)]);
    assert_eq!(lives(&r, &ops), vec![RANGE, RANGE], "{}", r.stdout);
    let s = r.stats();
    assert_eq!(s["cuda"]["outstanding_bytes"], RANGE, "{s}");
    assert_eq!(s["ibverbs"]["outstanding_bytes"], RANGE, "{s}");
    let rep = r.typed_report();
    assert_eq!(rep.totals.live_bytes, RANGE as u64);
    assert_eq!(rep.totals.peak_live_bytes, RANGE as u64);
    assert_eq!(rep.totals.denied_count, 0);
    // The card's pages (VmPin, where io_uring stands in for it) are the registration's: not
    // counted again as kernel-pinned with no callsite.
    assert_eq!(rep.totals.kernel_pinned_bytes, 0, "{:?}", rep.kernel);
    let live = live_records(&rep);
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(
        live.contains(&("cudaHostAlloc".into(), RANGE, "run_op".into())),
        "{live:?}"
    );
    assert!(
        live.contains(&("ibv_reg_mr".into(), 0, "run_op".into())),
        "{live:?}"
    );
    assert_eq!(api_stats(&rep, "ibv_reg_mr").alloc_count, 1);
    assert_eq!(api_stats(&rep, "cudaHostAlloc").live_bytes, RANGE as u64);
}

/// The same pool, released in either order: its bytes stay until the last route lets go.
#[test]
fn a_pool_pinned_twice_goes_when_the_last_route_lets_go_in_either_order() {
    for ends in [["dereg:0", "free:0"], ["free:0", "dereg:0"]] {
        let mut ops = vec!["alloc:0:65536", "reg:0:0:65536"];
        ops.extend(ends);
        let r = overlap(&ops, &[("PINGUARD_BUDGET", BUDGET)]);
        assert_eq!(
            lives(&r, &ops),
            vec![RANGE, RANGE, RANGE, 0],
            "{ends:?}: {}",
            r.stdout
        );
        let rep = r.typed_report();
        assert_eq!(rep.totals.live_bytes, 0, "{ends:?}");
        assert_eq!(rep.totals.peak_live_bytes, RANGE as u64, "{ends:?}");
        assert_eq!(rep.totals.release_count, 2, "{ends:?}");
        assert_eq!(rep.totals.unknown_release_count, 0, "{ends:?}");
    }
}

/// DeepSpeed's order: `mlock`, then `cudaHostRegister` of the same range. Counted once (the
/// budget just above the range lets the registration through), listed under both, and gone when
/// the last of the two lets go, in either order.
#[test]
fn a_locked_range_registered_with_cuda_counts_once_until_both_let_go() {
    let ends: [[&str; 2]; 2] = [
        ["munlock:0:0:65536", "unregister:0:0"],
        ["unregister:0:0", "munlock:0:0:65536"],
    ];
    for ends in ends {
        let mut ops = vec!["pages:0:65536", "mlock:0:0:65536", "register:0:0:65536"];
        ops.extend(ends);
        let r = overlap(&ops, &[("PINGUARD_BUDGET", BUDGET)]);
        let want = vec![0, RANGE, RANGE, RANGE, 0];
        assert_eq!(lives(&r, &ops), want, "{ends:?}: {}", r.stdout);
        let rep = r.typed_report();
        assert_eq!(rep.totals.live_bytes, 0, "{ends:?}");
        assert_eq!(rep.totals.peak_live_bytes, RANGE as u64, "{ends:?}");
        assert_eq!(rep.totals.denied_count, 0, "{ends:?}");
    }
    let ops = ["pages:0:65536", "mlock:0:0:65536", "register:0:0:65536"];
    let r = overlap(&ops, &[("PINGUARD_BUDGET", BUDGET)]);
    let live = live_records(&r.typed_report());
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(
        live.contains(&("mlock".into(), RANGE, "run_op".into())),
        "{live:?}"
    );
    assert!(
        live.contains(&("cudaHostRegister".into(), 0, "run_op".into())),
        "{live:?}"
    );
}

/// A second route over half of the first and as much again: the union counts (24 pages), which a
/// budget just above the union lets through, and each release leaves what the other still pins.
#[test]
fn a_partial_overlap_counts_the_union() {
    const UNION: i64 = 24 * PAGE;
    let budget = (UNION + PAGE).to_string();
    // cudaHostRegister of pages 0-16, then the card's registration of pages 8-24.
    for ends in [["dereg:0", "unregister:0:0"], ["unregister:0:0", "dereg:0"]] {
        let mut ops = vec!["pages:0:131072", "register:0:0:65536", "reg:0:32768:65536"];
        ops.extend(ends);
        let r = overlap(&ops, &[("PINGUARD_BUDGET", &budget)]);
        let want = vec![0, RANGE, UNION, RANGE, 0];
        assert_eq!(lives(&r, &ops), want, "{ends:?}: {}", r.stdout);
        let rep = r.typed_report();
        assert_eq!(rep.totals.peak_live_bytes, UNION as u64, "{ends:?}");
    }
    // mlock of pages 0-16, then cudaHostRegister of pages 8-24.
    let ends: [[&str; 2]; 2] = [
        ["munlock:0:0:65536", "unregister:0:32768"],
        ["unregister:0:32768", "munlock:0:0:65536"],
    ];
    for ends in ends {
        let mut ops = vec![
            "pages:0:131072",
            "mlock:0:0:65536",
            "register:0:32768:65536",
        ];
        ops.extend(ends);
        let r = overlap(&ops, &[("PINGUARD_BUDGET", &budget)]);
        let want = vec![0, RANGE, UNION, RANGE, 0];
        assert_eq!(lives(&r, &ops), want, "{ends:?}: {}", r.stdout);
        let rep = r.typed_report();
        assert_eq!(rep.totals.peak_live_bytes, UNION as u64, "{ends:?}");
    }
}

/// Two ranges that do not overlap still count apart: the budget refuses the second.
#[test]
fn ranges_that_do_not_overlap_count_apart() {
    let ops = ["alloc:0:65536", "pages:1:65536", "reg:1:0:65536"];
    let r = run(
        &program().to_string_lossy(),
        &ops,
        &[("PINGUARD_BUDGET", BUDGET)],
    );
    assert!(r.success(), "{}", r.stderr);
    assert_eq!(r.rc("reg:1:0:65536"), -1, "{}", r.stdout);
    assert_eq!(r.typed_report().totals.denied_count, 1);
}
