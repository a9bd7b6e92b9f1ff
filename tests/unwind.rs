//! The stack walker: every frame through C code built without frame pointers, objects opened
//! and closed after start-up, and a corrupt stack that must end the walk, not the process.

use crate::common;
use common::*;
use pinguard_common::Callsite;
use std::path::PathBuf;

/// The unwind test program and its two plugins, all built with -fomit-frame-pointer at -O2, and
/// the program again with frame pointers (`tests/fixtures.txt`, set `unwind`).
fn build() -> PathBuf {
    fixture_set("unwind").to_path_buf()
}

fn symbols(cs: &Callsite) -> Vec<String> {
    cs.frames
        .iter()
        .map(|f| f.symbol.as_deref().unwrap_or("?").to_string())
        .collect()
}

/// The symbol of a callsite's innermost frame (`None`: no frame, or no symbol).
fn first_symbol(cs: &Callsite) -> Option<&str> {
    cs.frames.first().and_then(|f| f.symbol.as_deref())
}

/// The callsite whose innermost frame is `first`.
fn site<'a>(report: &'a Report, first: &str) -> &'a Callsite {
    report
        .callsites
        .iter()
        .find(|c| first_symbol(c) == Some(first))
        .unwrap_or_else(|| panic!("no callsite starting at {first}: {:#?}", report.callsites))
}

/// `names` appear in this order as consecutive frames from the innermost one.
fn assert_prefix(cs: &Callsite, names: &[&str]) {
    let got = symbols(cs);
    assert!(
        got.len() >= names.len() && got.iter().zip(names).all(|(g, n)| g == n),
        "frames {got:?}, want them to start {names:?}"
    );
}

#[test]
fn every_frame_through_code_without_frame_pointers() {
    let dir = build();
    for prog in ["unwind", "unwind_fp"] {
        let r = run(
            &dir.join(prog).to_string_lossy(),
            &["chain"],
            &[("PINGUARD_DEPTH", "32")],
        );
        assert!(r.success(), "{}", r.stderr);
        let rep = r.typed_report();
        assert_eq!(rep.totals.peak_live_bytes, 4096);
        assert_prefix(
            site(&rep, "level_c"),
            &["level_c", "level_b", "level_a", "main"],
        );
        // Deeper than main: the C runtime's start-up frames, so the walk did not stop early.
        assert!(
            symbols(site(&rep, "level_c")).len() > 4,
            "{prog}: {:?}",
            symbols(site(&rep, "level_c"))
        );
    }
}

#[test]
fn callers_taking_turns_keep_their_own_callsites() {
    // A thread remembers its walks and what they named: a walk from the same registers counts
    // for the callsite it named only while every stack word it read is unchanged, so the leaf's
    // two callers, which differ only in one return address, never share a callsite.
    // A remembered walk checks only the words that mattered to it (`unwind::Local::remember`):
    // with frame pointers, the saved ones too.
    let dir = build();
    for prog in ["unwind", "unwind_fp"] {
        let r = run(
            &dir.join(prog).to_string_lossy(),
            &["turns", "500"],
            &[("PINGUARD_DEPTH", "32")],
        );
        assert!(r.success(), "{}", r.stderr);
        let rep = r.typed_report();
        let sites: Vec<&Callsite> = rep
            .callsites
            .iter()
            .filter(|c| first_symbol(c) == Some("turn_leaf"))
            .collect();
        let mut by_caller: Vec<(String, u64)> = sites
            .iter()
            .map(|c| (symbols(c)[1].clone(), c.alloc_count))
            .collect();
        by_caller.sort();
        assert_eq!(
            by_caller,
            [("turn_x".to_string(), 500), ("turn_y".to_string(), 500)],
            "{prog}"
        );
        assert_prefix(sites[0], &["turn_leaf"]);
        assert!(
            symbols(sites[0]).contains(&"main".to_string()),
            "{prog}: {:?}",
            symbols(sites[0])
        );
    }
}

#[test]
fn threads_on_an_ended_threads_stack_keep_their_own_callsites() {
    // A thread that ends leaves its walker, with its remembered walks, to the next thread to
    // start; glibc gives that thread the same stack, where the same start registers recur with
    // another caller above them. Threads alternating between the leaf's two callers, each on the
    // stack the one before it ended on, must count for their own caller every time.
    let dir = build();
    for prog in ["unwind", "unwind_fp"] {
        let r = run(
            &dir.join(prog).to_string_lossy(),
            &["thread_turns", "20"],
            &[("PINGUARD_DEPTH", "32")],
        );
        assert!(r.success(), "{}", r.stderr);
        let rep = r.typed_report();
        let sites: Vec<&Callsite> = rep
            .callsites
            .iter()
            .filter(|c| first_symbol(c) == Some("turn_leaf"))
            .collect();
        let mut by_caller: Vec<(String, u64)> = sites
            .iter()
            .map(|c| (symbols(c)[1].clone(), c.alloc_count))
            .collect();
        by_caller.sort();
        assert_eq!(
            by_caller,
            [("turn_x".to_string(), 1000), ("turn_y".to_string(), 1000)],
            "{prog}"
        );
        assert!(
            symbols(sites[0]).contains(&"turn_thread".to_string()),
            "{prog}: {:?}",
            symbols(sites[0])
        );
    }
}

#[test]
fn objects_opened_and_closed_after_start_up() {
    let dir = build();
    let snap = fresh_dir("unwind-snapshot").join("snapshot.json");
    let r = run(
        &dir.join("unwind").to_string_lossy(),
        &["plugins", &dir.to_string_lossy(), &snap.to_string_lossy()],
        &[("PINGUARD_DEPTH", "32")],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    // While plugin a is loaded: its frames, then the program's.
    let first = read_report(&snap);
    assert_prefix(
        site(&first, "plug_a_inner"),
        &[
            "plug_a_inner",
            "plug_a_middle",
            "plug_entry",
            "run_plugin",
            "main",
        ],
    );
    // Plugin b, opened after a was closed (and usually mapped where a was): its own frames, so
    // no stale table of a was used for it.
    let last = r.typed_report();
    assert_prefix(
        site(&last, "plug_b_inner"),
        &[
            "plug_b_inner",
            "plug_b_middle",
            "plug_entry",
            "run_plugin",
            "main",
        ],
    );
    // Plugin a's callsite, reported after a was closed, keeps the names it had.
    assert_prefix(
        site(&last, "plug_a_inner"),
        &[
            "plug_a_inner",
            "plug_a_middle",
            "plug_entry",
            "run_plugin",
            "main",
        ],
    );
    assert_eq!(last.totals.alloc_count, 2, "{:#?}", last.totals);
    let modules: Vec<&str> = last.modules.iter().map(|m| m.path.as_str()).collect();
    assert!(
        modules.iter().any(|m| m.ends_with("libplug_a.so"))
            && modules.iter().any(|m| m.ends_with("libplug_b.so")),
        "{modules:?}"
    );
}

#[test]
fn a_corrupt_stack_ends_the_walk_not_the_process() {
    let dir = build();
    for depth in ["32", "128"] {
        let r = run(
            &dir.join("unwind").to_string_lossy(),
            &["corrupt"],
            &[("PINGUARD_DEPTH", depth)],
        );
        assert!(r.success(), "status {:?}\n{}", r.out.status, r.stderr);
        let stats = r.stats();
        assert_eq!(stats["calls"], 4);
        let rep = r.typed_report();
        assert_eq!(rep.totals.peak_live_bytes, 3 * 16384 + 4096);
        // The three corrupt calls: whatever the walk found before it stopped, never main. On
        // x86-64 it finds the caller and the stub; on aarch64 framehop refuses a frame whose
        // caller's frame pointer points backwards, so it may stop before the caller.
        let bad: Vec<&Callsite> = rep
            .callsites
            .iter()
            .filter(|c| first_symbol(c) != Some("level_c"))
            .collect();
        assert_eq!(
            bad.iter().map(|c| c.alloc_count).sum::<u64>(),
            3,
            "{bad:#?}"
        );
        for c in &bad {
            // Issue 34, item 4: the walk stops at the garbage return address, which is in no
            // object's code, rather than reporting it as a frame.
            for f in &c.frames {
                assert!(
                    f.module.is_some(),
                    "a frame in no loaded object's code: {f:?}"
                );
            }
            let got = symbols(c);
            assert!(
                !got.contains(&"main".to_string()),
                "the walk went past a garbage return address: {got:?}"
            );
            assert!(got.is_empty() || got[0] == "corrupt_target", "{got:?}");
            if cfg!(target_arch = "x86_64") && !aarch64() {
                assert_prefix(c, &["corrupt_target", "corrupt_call"]);
            }
        }
        // The healthy walk after the corrupt ones is whole (no poisoned rule cache).
        assert_prefix(
            site(&rep, "level_c"),
            &["level_c", "level_b", "level_a", "main"],
        );
    }
}

#[test]
fn a_stack_address_where_a_return_address_belongs_ends_the_walk() {
    // Issue 34, item 4: a walk never reports an address outside every object's code as a frame.
    // The stub's call-frame information is right, but its return-address slot holds an address
    // on the stack, as libffi's frame read through the frame-pointer fallback did.
    let dir = build();
    for prog in ["unwind", "unwind_fp"] {
        let r = run(
            &dir.join(prog).to_string_lossy(),
            &["stackret"],
            &[("PINGUARD_DEPTH", "32")],
        );
        assert!(r.success(), "{prog}: {}", r.stderr);
        let rep = r.typed_report();
        let cs = site(&rep, "corrupt_target");
        for f in &cs.frames {
            assert!(
                f.module.is_some(),
                "{prog}: a frame in no loaded object's code: {f:?}"
            );
        }
        // On aarch64 framehop may refuse the stub's frame itself (as in the corrupt walks above).
        if cfg!(target_arch = "x86_64") && !aarch64() {
            assert_eq!(symbols(cs), ["corrupt_target", "stack_ra_call"], "{prog}");
        }
        assert_prefix(
            site(&rep, "level_c"),
            &["level_c", "level_b", "level_a", "main"],
        );
    }
}

#[test]
fn code_outside_every_object_is_a_frame_and_its_callers_follow() {
    // A JIT's code (Julia's `ccall`, LuaJIT's FFI) calling a runtime lies in no object: its
    // return address is a frame without a module, and the walk goes on to its callers, so two
    // callers stay two callsites. Only a stack address, or no page at all, ends a walk.
    if aarch64() || !cfg!(target_arch = "x86_64") {
        return; // the stub is x86-64 machine code
    }
    let dir = build();
    for prog in ["unwind", "unwind_fp"] {
        let r = run(
            &dir.join(prog).to_string_lossy(),
            &["jit"],
            &[("PINGUARD_DEPTH", "32")],
        );
        assert!(r.success(), "{prog}: {}", r.stderr);
        let rep = r.typed_report();
        for (caller, size) in [("jit_a", 4096), ("jit_b", 8192)] {
            let cs = rep
                .callsites
                .iter()
                .find(|c| c.frames.iter().any(|f| f.symbol.as_deref() == Some(caller)))
                .unwrap_or_else(|| panic!("{prog}: no callsite through {caller}: {rep:#?}"));
            let frames = &cs.frames;
            assert!(
                frames.first().is_some_and(|f| f.module.is_none()),
                "{prog}: the JIT frame first: {cs:#?}"
            );
            assert_eq!(
                frames.get(1).and_then(|f| f.symbol.as_deref()),
                Some(caller),
                "{prog}: {cs:#?}"
            );
            assert!(
                frames.iter().any(|f| f.symbol.as_deref() == Some("main")),
                "{prog}: the walk goes on to main: {cs:#?}"
            );
            assert_eq!(cs.live_bytes, size, "{prog}: {cs:#?}");
        }
    }
}

#[test]
fn a_walk_through_a_broken_frame_does_not_cut_later_walks_short() {
    // Issue 34, item 4: framehop caches its frame-pointer fallback for an address whose rule it
    // failed to evaluate, here libffi-like code reached with a garbage rbp. The later healthy
    // walk through the same return address found a stack address there and stopped; it is
    // walked again with a fresh rule cache.
    if aarch64() {
        return; // the stubs are x86-64 assembly
    }
    let dir = build();
    for prog in ["unwind", "unwind_fp"] {
        let r = run(
            &dir.join(prog).to_string_lossy(),
            &["poison"],
            &[("PINGUARD_DEPTH", "32")],
        );
        assert!(r.success(), "{prog}: {}", r.stderr);
        let rep = r.typed_report();
        let broken = symbols(site(&rep, "corrupt_target"));
        assert!(
            broken.starts_with(&["corrupt_target".to_string(), "garbage_fp_call".to_string()]),
            "{prog}: {broken:?}"
        );
        assert!(!broken.contains(&"main".to_string()), "{prog}: {broken:?}");
        assert_prefix(
            site(&rep, "poison_target"),
            &["poison_target", "rbp_frame_call", "main"],
        );
    }
}

#[test]
fn an_object_opened_by_a_relative_path_is_named() {
    let dir = build();
    let out_dir = fresh_dir("unwind-relative");
    let snap = out_dir.join("snapshot.json");
    let out = program(&dir.join("unwind"), Some(fixtures().lib.as_os_str()))
        .args(["plugins", ".", snap.to_str().unwrap()])
        .current_dir(&dir)
        .env("PINGUARD_REPORT", out_dir.join("exit.%p.json"))
        .env("PINGUARD_DEPTH", "32")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The loader knows it as "./libplug_a.so"; the report names the file and its functions.
    let cs = site(&read_report(&snap), "plug_a_inner").clone();
    let module = cs.frames[0].module.as_deref().unwrap();
    assert!(
        module.starts_with('/') && module.ends_with("/libplug_a.so"),
        "{module}"
    );
}
