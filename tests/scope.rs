//! `PINGUARD_DOWNGRADE_MATCH`: under `downgrade`, only callsites matching one of the patterns are
//! served with pageable memory; every other over-budget call is refused with the API's own code,
//! as under `error`. Matching by native symbol and module, in a deep frame, by Python file and
//! function; the scope under a group budget; Python frames off falls back to native frames.

use crate::common;
use common::*;
use pinguard_common::{Event, EventKind};

fn rc_of(r: &Run, op: &str) -> i64 {
    r.named_rcs()
        .into_iter()
        .find(|(o, _)| o.starts_with(op))
        .map(|(_, rc)| rc)
        .unwrap_or_else(|| panic!("no {op} in {}\n{}", r.stdout, r.stderr))
}

fn downgrade(patterns: &str) -> Vec<(&'static str, String)> {
    vec![
        ("PINGUARD_BUDGET", "4K".into()),
        ("PINGUARD_POLICY", "downgrade".into()),
        ("PINGUARD_DOWNGRADE_MATCH", patterns.into()),
    ]
}

fn scoped(ops: &[&str], env: &[(&'static str, String)]) -> Run {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = run("scope", ops, &env);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    r
}

const OPS: [&str; 3] = ["framework:1048576", "direct:1048576", "deep:1048576"];

/// By a native frame's symbol and by its module's file name: the framework's calls are
/// downgraded, the program's own refused with the runtime's code (2).
#[test]
fn a_native_symbol_or_module_puts_a_callsite_in_scope() {
    for pattern in [
        "framework_pin",
        "libframework.so",
        "*/libframework.so",
        "framework_p?n",
    ] {
        let r = scoped(&OPS[..2], &downgrade(pattern));
        assert_eq!(
            rc_of(&r, "framework"),
            0,
            "{pattern}: downgraded: {}",
            r.stdout
        );
        assert_eq!(rc_of(&r, "direct"), 2, "{pattern}: refused");
        let t = &r.typed_report().totals;
        assert_eq!(
            (t.downgraded_count, t.denied_count),
            (1, 1),
            "{pattern}: {t:?}"
        );
        assert_eq!(
            t.live_bytes, 0,
            "nothing pinned: one downgraded, one refused"
        );
    }
}

/// A match anywhere in the stack counts, in a deep frame too.
#[test]
fn a_match_in_a_deep_frame_counts() {
    let r = scoped(&OPS, &downgrade("deep_b"));
    assert_eq!(rc_of(&r, "framework"), 2, "{}", r.stdout);
    assert_eq!(rc_of(&r, "direct"), 2);
    assert_eq!(
        rc_of(&r, "deep"),
        0,
        "deep_a -> deep_b -> deep_c -> direct_pin: in scope"
    );
}

/// Without a match every over-budget call is refused with the API's code, and each refusal's
/// event names the patterns it did not match; the report lists the scope.
#[test]
fn no_match_refuses_and_the_report_says_which_scope_applied() {
    let r = scoped(&OPS, &downgrade("nothing_like_this, *torch/utils/data/*"));
    for (op, rc) in r.named_rcs() {
        assert_eq!(rc, 2, "{op}: {}", r.stdout);
    }
    let rep = r.typed_report();
    let scope = Some(vec![
        "nothing_like_this".to_string(),
        "*torch/utils/data/*".to_string(),
    ]);
    assert_eq!(rep.config.downgrade_match, scope);
    assert_eq!(rep.totals.denied_count, 3);
    assert_eq!(rep.totals.downgraded_count, 0);
    let denied: Vec<&Event> = rep
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Denied)
        .collect();
    assert_eq!(denied.len(), 3);
    for e in denied {
        assert_eq!(e.downgrade_match, scope, "{e:?}");
    }
    // Without the variable, `downgrade` serves every one, as before.
    let plain = vec![
        ("PINGUARD_BUDGET", "4K".to_string()),
        ("PINGUARD_POLICY", "downgrade".to_string()),
    ];
    let r = scoped(&OPS, &plain);
    assert!(r.named_rcs().iter().all(|(_, rc)| *rc == 0), "{}", r.stdout);
    assert_eq!(r.typed_report().config.downgrade_match, None);
}

/// A bad pattern gets one line and the safe fallback: nothing is downgraded.
#[test]
fn a_bad_pattern_downgrades_nothing() {
    let r = scoped(&OPS[..1], &downgrade("[framework"));
    assert_eq!(rc_of(&r, "framework"), 2, "{}", r.stdout);
    let lines = pinguard_lines(&r.stderr);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("PINGUARD_DOWNGRADE_MATCH=\"[framework\"")
                && l.contains("nothing is downgraded")),
        "{lines:?}"
    );
}

/// The scope applies to the group budget's refusals as well.
#[test]
fn the_scope_applies_under_a_group_budget() {
    let group = format!("scope-{}", std::process::id());
    let env = vec![
        ("PINGUARD_GROUP", group.clone()),
        ("PINGUARD_GROUP_BUDGET", "4K".to_string()),
        ("PINGUARD_POLICY", "downgrade".to_string()),
        ("PINGUARD_DOWNGRADE_MATCH", "framework_pin".to_string()),
    ];
    let r = scoped(&OPS[..2], &env);
    assert_eq!(rc_of(&r, "framework"), 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(rc_of(&r, "direct"), 2);
    remove_semaphores(&pinguard_common::group::path(&group));
    let _ = std::fs::remove_file(pinguard_common::group::path(&group));
}

fn python_tree() -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = fresh_dir("scope-py");
    let pkg = dir.join("torch/utils/data/_utils");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(
        pkg.join("pin_memory.py"),
        "import ctypes\n\ndef pin(rt, n):\n    p = ctypes.c_void_p()\n    return rt.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), ctypes.c_uint(0))\n",
    )
    .unwrap();
    let main = dir.join("train.py");
    std::fs::write(
        &main,
        "import ctypes, sys, threading\nsys.path.insert(0, sys.argv[2])\nfrom torch.utils.data._utils import pin_memory\nrt = ctypes.CDLL(sys.argv[1])\n\n\
         def load_weights(n):\n    p = ctypes.c_void_p()\n    return rt.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), ctypes.c_uint(0))\n\n\
         out = {}\nt = threading.Thread(target=lambda: out.update(rc=pin_memory.pin(rt, 1 << 20)))\nt.start()\nt.join()\n\
         print('pin_memory rc=%d' % out['rc'])\nprint('load_weights rc=%d' % load_weights(1 << 20))\n",
    )
    .unwrap();
    (dir, main)
}

/// PyTorch's DataLoader pin-memory thread, by its file (the README's ready scope) and by a
/// Python function's name; with Python frames off, only native frames are matched.
#[test]
fn python_frames_put_the_pin_memory_thread_in_scope() {
    if !have("python3", "the Python callsite tests") {
        return;
    }
    let f = fixtures();
    let (dir, main) = python_tree();
    let rt = f.dir.join("libcudart.so");
    let args = [
        main.to_str().unwrap(),
        rt.to_str().unwrap(),
        dir.to_str().unwrap(),
    ];
    let python = |env: &[(&'static str, String)]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = run(
            "/usr/bin/env",
            &[&["python3"][..], &args[..]].concat(),
            &env,
        );
        assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
        r
    };
    for pattern in ["*torch/utils/data/_utils/pin_memory.py", "pin"] {
        let r = python(&downgrade(pattern));
        assert_eq!(
            rc_of(&r, "pin_memory"),
            0,
            "{pattern}: downgraded: {}",
            r.stdout
        );
        assert_eq!(rc_of(&r, "load_weights"), 2, "{pattern}: refused");
    }
    let mut env = downgrade("*torch/utils/data/_utils/pin_memory.py");
    env.push(("PINGUARD_PY_DEPTH", "0".into()));
    let r = python(&env);
    assert_eq!(
        rc_of(&r, "pin_memory"),
        2,
        "Python frames off: no Python file to match: {}",
        r.stdout
    );
}

/// The locking family is scoped too: an `mlock` from a matching callsite succeeds without
/// locking, one from elsewhere gets the kernel's ENOMEM, as under `error`.
#[test]
fn locking_calls_are_scoped_too() {
    for (pattern, want) in [("main", 0), ("nothing_like_this", -1)] {
        let env = downgrade(pattern);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = run("scenario", &["mlock:0:4"], &env);
        assert!(r.success(), "{}", r.stderr);
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with("mlock:0:4 "))
            .unwrap();
        assert_eq!(field(line, "rc"), want, "{pattern}: {line}");
        let t = &r.typed_report().totals;
        let (downgraded, denied) = if want == 0 { (1, 0) } else { (0, 1) };
        assert_eq!(
            (t.downgraded_count, t.denied_count),
            (downgraded, denied),
            "{pattern}: {t:?}"
        );
        assert_eq!(t.live_bytes, 0, "{pattern}: nothing locked");
    }
}
