//! Hostile input: garbage in every `PINGUARD_*` variable, and arguments the runtimes reject.

use crate::common;
use common::*;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

const VARS: &[&str] = &[
    "PINGUARD_BUDGET",
    "PINGUARD_POLICY",
    "PINGUARD_REPORT",
    "PINGUARD_DEPTH",
    "PINGUARD_INTERVAL",
    "PINGUARD_SIGNAL",
    "PINGUARD_HOOKS",
    "PINGUARD_LOG",
    "PINGUARD_DISABLE",
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Bytes that make parsers work: digits, units, separators, percent signs, high bytes
    /// (not UTF-8), control characters, sometimes very long.
    fn garbage(&mut self) -> Vec<u8> {
        const PIECES: &[&[u8]] = &[
            b"1",
            b"9999999999999999999999",
            b".",
            b"%",
            b"%p",
            b"%%",
            b"K",
            b"GiB",
            b"-",
            b",",
            b"=",
            b"ms",
            b"SIG",
            b"USR2",
            b"cuda",
            b"error",
            b" ",
            b"\t",
            b"\xff",
            b"\xc3\x28",
            b"\x1b[2J",
            b"/",
            b"..",
            b"\n",
        ];
        let len = match self.next() % 10 {
            0 => 20_000,
            _ => (self.next() % 12) as usize,
        };
        let mut v = Vec::new();
        for _ in 0..len {
            if self.next().is_multiple_of(3) {
                v.push((1 + self.next() % 255) as u8);
            } else {
                v.extend_from_slice(PIECES[(self.next() % PIECES.len() as u64) as usize]);
            }
        }
        v
    }
}

#[test]
fn garbage_in_every_variable_never_crashes_and_says_one_line_each() {
    let f = fixtures();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..20 {
        let dir = fresh_dir("garbage");
        let mut cmd = program(&f.dir.join("scenario"), Some(f.lib.as_os_str()));
        cmd.args(["cuda_alloc:4096", "mlock:0:1"]).current_dir(&dir);
        let mut set = Vec::new();
        for var in VARS {
            if rng.next().is_multiple_of(2) {
                let v = rng.garbage();
                cmd.env(var, OsString::from_vec(v.clone()));
                set.push((var, v));
            }
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "round {round}: {set:?}\n{stderr}"
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
            "round {round}:\n{stderr}"
        );
        for var in VARS {
            let n = stderr
                .lines()
                .filter(|l| l.starts_with(&format!("pinguard: {var}=")))
                .count();
            assert!(n <= 1, "round {round}: {var} reported {n} times:\n{stderr}");
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("cuda_alloc:4096 rc="),
            "round {round}: the program ran: {stdout}"
        );
    }
}

/// The same operations with and without pinguard must give the same return codes.
#[test]
fn rejected_arguments_get_the_runtimes_own_answer_and_counters_stay_exact() {
    let f = fixtures();
    let ops = [
        "cuda_alloc_null:4096",
        "cuda_alloc:0",
        "cuda_alloc:18446744073709551615",
        "cuda_alloc:4096:99",
        "cuda_register:4096:99",
        "cuda_alloc:4096",
        "cuda_free:1",
        "cuda_free:1",
        "cuda_free_raw:0x1000",
        "cuda_malloc:0",
        "acl_malloc_null:4096",
        "acl_malloc:0",
        "acl_malloc:18446744073709551615",
        "acl_register_badtype:4096",
        "acl_register2:4096:4",
        "acl_free:0",
        "acl_unregister:0",
        "mlock:0:0",
        "munlock:5:1",
        "cuda_unregister:2",
    ];
    let rcs = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.contains(" rc="))
            .map(|l| l.split(" errno=").next().unwrap().to_string())
            .collect()
    };
    let bare = program(&f.dir.join("scenario"), None)
        .args(ops)
        .output()
        .unwrap();
    let bare_rcs = rcs(&String::from_utf8_lossy(&bare.stdout));
    assert_eq!(bare_rcs.len(), ops.len());
    for env in [
        &[][..],
        &[("PINGUARD_BUDGET", "1M")][..],
        &[("PINGUARD_BUDGET", "0"), ("PINGUARD_POLICY", "downgrade")][..],
    ] {
        let r = run("scenario", &ops, env);
        assert!(r.success(), "{env:?}: {}", r.stderr);
        let budget_zero = env
            .iter()
            .any(|(k, v)| *k == "PINGUARD_BUDGET" && *v == "0");
        for (i, (a, b)) in bare_rcs.iter().zip(rcs(&r.stdout)).enumerate() {
            // With no budget at all, a valid allocation is downgraded (and succeeds): the only
            // difference allowed.
            if budget_zero && ops[i] == "cuda_alloc:4096" {
                continue;
            }
            assert_eq!(
                a, &b,
                "{env:?}: {} answered differently under pinguard",
                ops[i]
            );
        }
        let s = r.stats();
        let t = r.typed_report().totals;
        let runtime_allocs =
            s["cuda"]["alloc_calls"].as_i64().unwrap() + s["acl"]["alloc_calls"].as_i64().unwrap();
        assert_eq!(t.alloc_count as i64, runtime_allocs, "{env:?}: {t:?}");
        let runtime_live = s["cuda"]["outstanding_bytes"].as_i64().unwrap()
            + s["acl"]["outstanding_bytes"].as_i64().unwrap();
        assert_eq!(t.live_bytes as i64, runtime_live, "{env:?}");
        let runtime_failed = s["cuda"]["failed_calls"].as_i64().unwrap()
            + s["acl"]["failed_calls"].as_i64().unwrap();
        assert_eq!(
            t.failed_count as i64, runtime_failed,
            "{env:?}: every runtime failure counted once: {t:?}"
        );
        assert_eq!(
            t.live_count as i64,
            s["cuda"]["outstanding_count"].as_i64().unwrap()
                + s["acl"]["outstanding_count"].as_i64().unwrap()
        );
    }
}
